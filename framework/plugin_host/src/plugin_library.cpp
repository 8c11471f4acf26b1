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

#if defined(__x86_64__)
constexpr uint16_t kThisMachine = EM_X86_64;
#elif defined(__aarch64__)
constexpr uint16_t kThisMachine = EM_AARCH64;
#elif defined(__powerpc64__)
constexpr uint16_t kThisMachine = EM_PPC64;
#elif defined(__s390x__)
constexpr uint16_t kThisMachine = EM_S390;
#elif defined(__riscv)
constexpr uint16_t kThisMachine = EM_RISCV;
#else
constexpr uint16_t kThisMachine = EM_NONE;  // not named; the loader's own message stands
#endif

std::string machine_name(uint16_t machine) {
  switch (machine) {
    case EM_X86_64: return "x86-64";
    case EM_AARCH64: return "AArch64";
    case EM_386: return "32-bit x86";
    case EM_ARM: return "32-bit ARM";
    case EM_PPC64: return "64-bit POWER";
    case EM_S390: return "s390x";
    case EM_RISCV: return "RISC-V";
    default: return "ELF machine " + std::to_string(machine);
  }
}

// Refuses a library built for another processor (an AArch64 plugin on x86-64, a 32-bit one in
// this 64-bit process), naming both: the loader's own words for it can be "No such file or
// directory" or "wrong ELF class".
void check_elf_machine(const std::filesystem::path& file, const unsigned char* ident, std::ifstream& in) {
  if (kThisMachine == EM_NONE) return;
  unsigned char bytes[2] = {};
  if (!in.seekg(18).read(reinterpret_cast<char*>(bytes), 2)) return;  // too short: check_elf_headers says so
  const bool little = ident[EI_DATA] == ELFDATA2LSB;
  const auto machine = static_cast<uint16_t>(little ? bytes[0] | bytes[1] << 8 : bytes[1] | bytes[0] << 8);
  const bool wide = ident[EI_CLASS] == ELFCLASS64;
  const bool this_wide = sizeof(void*) == 8;
  if (machine == kThisMachine && wide == this_wide) return;
  const std::string built = machine == kThisMachine ? std::string(wide ? "64" : "32") + "-bit " + machine_name(machine)
                                                    : machine_name(machine);
  throw Error("cannot load plugin " + file.string() + ": it is built for " + built + ", and this machine runs " +
              machine_name(kThisMachine) + (this_wide ? " (64-bit)" : " (32-bit)") +
              "; build the plugin for this machine (fsdpx_add_plugin in its CMake project)");
}

// Refuses an ELF file whose headers or loadable segments reach past its end (a copy cut short):
// the loader would map them, and touching a page beyond the end of a file ends the process with
// SIGBUS, before any message. A file that is not ELF is left to the loader, whose own message
// says what it is; one for another processor is named as such.
void check_elf_fits(const std::filesystem::path& file) {
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(file, ec);
  std::ifstream in(file, std::ios::binary);
  unsigned char ident[EI_NIDENT] = {};
  if (ec || !in.read(reinterpret_cast<char*>(ident), EI_NIDENT) || std::memcmp(ident, ELFMAG, SELFMAG) != 0) return;
  check_elf_machine(file, ident, in);
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
