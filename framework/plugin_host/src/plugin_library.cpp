#include "fsdpx/framework/plugin_host/plugin_library.h"

#include <dlfcn.h>
#include <elf.h>

#include <cstdint>
#include <cstring>
#include <fstream>

#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>

#include "fsdpx/error.h"

namespace fsdpx {

struct PluginLibrary::Impl {
  boost::dll::shared_library library;
};

namespace {

// Boost.DLL appends "(dlerror system message: <text>)"; the loader's text is what the user
// needs ("file too short", "cannot open shared object file: No such file or directory").
std::string loader_message(const std::string& what) {
  const std::string marker = "dlerror system message: ";
  auto at = what.find(marker);
  if (at == std::string::npos) return what;
  std::string text = what.substr(at + marker.size());
  auto end = text.rfind(')');
  return end == std::string::npos ? text : text.substr(0, end);
}

[[noreturn]] void cut_short(const std::filesystem::path& file, uint64_t size, const char* what, uint64_t end) {
  throw Error("cannot load plugin " + file.string() + ": the file is cut short (" + std::to_string(size) +
              " bytes, but its ELF " + what + " reach byte " + std::to_string(end) +
              "); a truncated copy? copy or build it again");
}

// The ELF header, program headers (and the bytes of each segment) and section headers of `file`
// (of `size` bytes) against its end, for one ELF class.
template <class Ehdr, class Phdr>
void check_elf_headers(std::ifstream& in, const std::filesystem::path& file, uint64_t size) {
  Ehdr eh{};
  if (size < sizeof eh || !in.seekg(0).read(reinterpret_cast<char*>(&eh), sizeof eh))
    cut_short(file, size, "header", sizeof eh);
  auto reach = [](uint64_t offset, uint64_t bytes) { return offset + bytes < offset ? UINT64_MAX : offset + bytes; };
  const uint64_t ph_end = reach(eh.e_phoff, uint64_t{eh.e_phnum} * eh.e_phentsize);
  if (eh.e_phnum > 0 && ph_end > size) cut_short(file, size, "program headers", ph_end);
  const uint64_t sh_end = reach(eh.e_shoff, uint64_t{eh.e_shnum} * eh.e_shentsize);
  if (eh.e_shoff > 0 && sh_end > size) cut_short(file, size, "section headers", sh_end);
  if (eh.e_phentsize < sizeof(Phdr)) return;  // not one the loader takes; it says so itself
  for (uint64_t i = 0; i < eh.e_phnum; ++i) {
    Phdr ph{};
    const auto at = static_cast<std::streamoff>(eh.e_phoff + i * eh.e_phentsize);
    if (!in.seekg(at).read(reinterpret_cast<char*>(&ph), sizeof ph)) cut_short(file, size, "program headers", ph_end);
    const uint64_t seg_end = reach(ph.p_offset, ph.p_filesz);
    if (ph.p_type == PT_LOAD && ph.p_filesz > 0 && seg_end > size) cut_short(file, size, "segments", seg_end);
  }
}

// Refuses an ELF file whose headers or loadable segments reach past its end (a copy cut short):
// the loader would map them, and touching a page beyond the end of a file ends the process with
// SIGBUS, before any message. A file that is not ELF, or not of this machine's byte order, is
// left to the loader, whose own message says what it is.
void check_elf_fits(const std::filesystem::path& file) {
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(file, ec);
  std::ifstream in(file, std::ios::binary);
  unsigned char ident[EI_NIDENT] = {};
  if (ec || !in.read(reinterpret_cast<char*>(ident), EI_NIDENT) || std::memcmp(ident, ELFMAG, SELFMAG) != 0) return;
  const bool native = ident[EI_DATA] == (__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ ? ELFDATA2LSB : ELFDATA2MSB);
  if (!native) return;
  if (ident[EI_CLASS] == ELFCLASS64) check_elf_headers<Elf64_Ehdr, Elf64_Phdr>(in, file, size);
  if (ident[EI_CLASS] == ELFCLASS32) check_elf_headers<Elf32_Ehdr, Elf32_Phdr>(in, file, size);
}

}  // namespace

std::shared_ptr<PluginLibrary> PluginLibrary::open(const std::filesystem::path& file) {
  check_elf_fits(file);
  auto impl = std::make_unique<Impl>();
  try {
    impl->library.load(file, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  } catch (const std::exception& e) {
    const std::string msg = loader_message(e.what());
    const bool undefined = msg.find("undefined symbol") != std::string::npos;
    throw Error("cannot load plugin " + file.string() + ": " +
                (undefined ? "it needs a symbol this process lacks (" + msg +
                                 "); it was probably built against another fsdpx or LibTorch"
                           : "not a loadable library: " + msg));
  }
  // Pin the library for the life of the process: the loader then never unmaps it, whatever
  // happens to the handles (this call only adds the flag; the library is already loaded).
  if (!dlopen(impl->library.location().c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD | RTLD_NODELETE))
    throw Error("cannot pin plugin " + file.string() + " in memory: " + loader_message(dlerror()));
  return std::shared_ptr<PluginLibrary>(new PluginLibrary(file, std::move(impl)));
}

PluginLibrary::PluginLibrary(std::filesystem::path path, std::unique_ptr<Impl> impl)
    : path_(std::move(path)), impl_(std::move(impl)) {}

// Boost.DLL closes its handle here; the RTLD_NODELETE pin taken in open() keeps the code mapped.
PluginLibrary::~PluginLibrary() = default;

fsdpx_plugin_entry_fn PluginLibrary::entry() const {
  if (!impl_->library.has(FSDPX_PLUGIN_ENTRY_SYMBOL)) return nullptr;
  return impl_->library.get<const fsdpx_plugin_info*()>(FSDPX_PLUGIN_ENTRY_SYMBOL);
}

std::filesystem::path libfsdpx_directory() {
  return boost::dll::this_line_location().lexically_normal().parent_path();
}

}  // namespace fsdpx
