// The real Gloo inside LibTorch, without gloo's headers.
//
// The PyPI wheel ships ProcessGroupGloo.hpp but not the gloo headers it includes, and LibTorch
// 2.11 exports no free factory for it. It does export, from libtorch_cpu.so:
//   c10d::ProcessGroupGloo::Options::create_default(std::chrono::milliseconds)
//   c10d::ProcessGroupGloo::ProcessGroupGloo(const intrusive_ptr<Store>&, int, int,
//                                            intrusive_ptr<Options>)   (complete-object ctor)
// So: get default options (which pick the transport device), allocate room for the object,
// run the exported constructor on it, and hold the result as a c10d::Backend, the interface
// every collective goes through. Both symbols are looked up by name at run time; the test
// GlooBackend.SymbolsExistAndWork fails loudly if a LibTorch upgrade removes or renames them.
//
// Calling through function pointers declared with c10d::Backend::Options in place of
// ProcessGroupGloo::Options is sound: intrusive_ptr<T> has one layout for every T, is passed and
// returned the same way, and Options derives from Backend::Options as its first and only base.
// The object size (sizeof(ProcessGroupGloo)) is not visible without gloo's headers: 488 bytes
// in LibTorch 2.11.0, read from the operator new call in ProcessGroupGloo::split. The object is
// released by its own virtual destructor, which calls the sized operator delete with that size,
// so the allocation must be exactly that size (a sized-delete allocator such as tcmalloc trusts
// it). GlooBackend.ObjectSizeMatchesLibTorch intercepts that operator delete and fails if
// LibTorch's size ever differs from kGlooObjectBytes; at run time, a LibTorch of another version
// than the one the size was read from is refused before anything is built (the library found at
// run time may not be the one fsdpx was compiled against).
#include <dlfcn.h>

#include <new>

#include <ATen/Version.h>

#include "fsdpx/error.h"
#include "fsdpx/framework/runtime/c10d_backends.h"

namespace fsdpx {
namespace {

constexpr const char* kCreateDefaultSymbol =
    "_ZN4c10d16ProcessGroupGloo7Options14create_defaultENSt6chrono8durationIlSt5ratioILl1ELl1000EEEE";
constexpr const char* kConstructorSymbol =
    "_ZN4c10d16ProcessGroupGlooC1ERKN3c1013intrusive_ptrINS_5StoreENS1_6detail34intrusive_target_"
    "default_null_typeIS3_EEEEiiNS2_INS0_7OptionsENS5_ISA_EEEE";
constexpr size_t kObjectBytes = kGlooObjectBytes;

using OptionsPtr = c10::intrusive_ptr<c10d::Backend::Options>;
using CreateDefaultFn = OptionsPtr (*)(std::chrono::milliseconds);
using ConstructorFn = void (*)(void* self, const c10::intrusive_ptr<c10d::Store>&, int, int, OptionsPtr);

void* symbol(const char* name, const char* what) {
  void* p = dlsym(RTLD_DEFAULT, name);
  if (!p)
    throw Error(std::string("LibTorch does not export ") + what + " (" + name +
                "), which fsdpx uses to create the Gloo backend; this LibTorch is not the 2.11 "
                "wheel fsdpx was written for");
  return p;
}

}  // namespace

void check_gloo_object_size_applies(const std::string& build_config) {
  const std::string key = "TORCH_VERSION=";
  const size_t at = build_config.find(key);
  std::string version;
  if (at != std::string::npos) {
    const size_t from = at + key.size();
    version = build_config.substr(from, build_config.find_first_of(", \n", from) - from);
  }
  if (version == kGlooObjectBytesTorch) return;
  throw Error("the LibTorch loaded at run time is " + (version.empty() ? std::string("of unknown version (its build "
              "configuration names no TORCH_VERSION)") : version) + "; fsdpx builds the Gloo backend in " +
              std::to_string(kGlooObjectBytes) + " bytes, the size of c10d::ProcessGroupGloo in LibTorch " +
              kGlooObjectBytesTorch + " only: run with LibTorch " + kGlooObjectBytesTorch +
              " (the one fsdpx was built against; scripts/setup.sh installs it)");
}

c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int size,
                                                    std::chrono::milliseconds timeout) {
  static const auto create_default = reinterpret_cast<CreateDefaultFn>(
      symbol(kCreateDefaultSymbol, "c10d::ProcessGroupGloo::Options::create_default"));
  static const auto construct = reinterpret_cast<ConstructorFn>(
      symbol(kConstructorSymbol, "c10d::ProcessGroupGloo::ProcessGroupGloo"));
  static const bool version_checked = (check_gloo_object_size_applies(at::show_config()), true);
  (void)version_checked;
  OptionsPtr options = create_default(timeout);
  void* memory = ::operator new(kObjectBytes);
  try {
    construct(memory, store, rank, size, options);
  } catch (...) {
    ::operator delete(memory);
    throw;
  }
  auto backend = c10::intrusive_ptr<c10d::Backend>::unsafe_steal_from_new(static_cast<c10d::Backend*>(memory));
  if (backend->getBackendName() != "gloo")
    throw Error("the object built from " + std::string(kConstructorSymbol) + " reports backend '" +
                backend->getBackendName() + "', not 'gloo'");
  return backend;
}

}  // namespace fsdpx
