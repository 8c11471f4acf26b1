/* fsdpx/abi.h: the C-layout block through which the host meets a plugin.
 *
 * Every plugin exports exactly one symbol with C linkage, FSDPX_PLUGIN_ENTRY_SYMBOL, a function
 * that returns a pointer to a static fsdpx_plugin_info. Plugins do not write it by hand:
 * FSDPX_PLUGIN in fsdpx/plugin.h fills it in from the headers the plugin was compiled with.
 *
 * Stability rules (the host relies on them for every ABI major version, past and future):
 *   - struct_size, abi_major and abi_minor are the first three fields, forever;
 *   - within one ABI major, fields are only ever appended at the end, and abi_minor grows;
 *     the host reads only the fields that struct_size says the plugin knew about;
 *   - anything else changes abi_major, and the host refuses the plugin with both numbers.
 */
#ifndef FSDPX_ABI_H
#define FSDPX_ABI_H

#include <stdint.h>

#define FSDPX_ABI_MAJOR 1
#define FSDPX_ABI_MINOR 2
#define FSDPX_PLUGIN_ENTRY_SYMBOL "fsdpx_plugin_entry"

#ifdef __cplusplus
extern "C" {
#endif

/* Opaque to C; it is an fsdpx::Registrar (fsdpx/registrar.h). */
typedef struct fsdpx_registrar fsdpx_registrar;

typedef struct fsdpx_plugin_info {
  uint32_t struct_size;      /* sizeof(fsdpx_plugin_info) as the plugin was compiled */
  uint32_t abi_major;        /* FSDPX_ABI_MAJOR the plugin was compiled with */
  uint32_t abi_minor;        /* FSDPX_ABI_MINOR the plugin was compiled with */
  const char* plugin_name;   /* unique among loaded plugins, e.g. "wrap_size_based" */
  const char* plugin_version;/* the plugin's own version, free text, e.g. "1.2.0" */
  const char* fsdpx_version; /* FSDPX_VERSION of the SDK headers used */
  const char* torch_version; /* TORCH_VERSION of the LibTorch headers used, e.g. "2.11.0" */
  int32_t cxx11_abi;         /* _GLIBCXX_USE_CXX11_ABI the plugin was compiled with (0 or 1) */
  /* Registers the plugin's components with the host. Called once, after every check above
   * has passed. May throw a C++ exception: the host then rolls back what it registered. */
  void (*register_components)(fsdpx_registrar* registrar);
} fsdpx_plugin_info;

typedef const fsdpx_plugin_info* (*fsdpx_plugin_entry_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* FSDPX_ABI_H */
