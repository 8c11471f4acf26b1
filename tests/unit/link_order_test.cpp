// The wheel's libtorch.so exports its own std::filesystem, which crashes when our code calls it
// (see cmake/FsdpxTorch.cmake). fsdpx links libstdc++ ahead of LibTorch so that the dynamic
// linker binds std::filesystem to libstdc++; this test fails loudly if that ever changes.
#include <dlfcn.h>

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "test_paths.h"

namespace {

std::string defining_object(void* address) {
  Dl_info info{};
  if (!dladdr(address, &info) || !info.dli_fname) return "(unknown)";
  return info.dli_fname;
}

TEST(LinkOrder, StdFilesystemBindsToLibstdcxxNotLibtorch) {
  using RemoveAll = std::uintmax_t (*)(const std::filesystem::path&, std::error_code&);
  RemoveAll f = &std::filesystem::remove_all;
  const std::string where = defining_object(reinterpret_cast<void*>(f));
  EXPECT_NE(where.find("libstdc++"), std::string::npos)
      << "std::filesystem::remove_all binds to " << where
      << "; libstdc++ must come before libtorch in the link order";
  // And it works.
  fsdpx::test::TempDir dir;
  std::filesystem::create_directories(dir.path() / "a" / "b");
  std::error_code ec;
  EXPECT_EQ(std::filesystem::remove_all(dir.path() / "a", ec), 2u);
}

}  // namespace
