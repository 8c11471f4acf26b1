# fsdpx_add_plugin(<target> SOURCES <src>... [LINK_LIBRARIES <lib>...] [OUTPUT_DIRECTORY <dir>]
#                  [NO_INSTALL])
#
# Builds an fsdpx plugin: a MODULE library named <target>.so that links libfsdpx and LibTorch,
# is compiled with hidden visibility, exports only fsdpx_plugin_entry, and refuses undefined
# symbols at link time (-z defs). The same function serves fsdpx's own tree and third parties
# (through find_package(fsdpx)).
include_guard(GLOBAL)
set(_FSDPX_PLUGIN_MAP "${CMAKE_CURRENT_LIST_DIR}/fsdpx_plugin.map")

function(fsdpx_add_plugin target)
  cmake_parse_arguments(ARG "NO_INSTALL" "OUTPUT_DIRECTORY" "SOURCES;LINK_LIBRARIES" ${ARGN})
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "fsdpx_add_plugin(${target}): SOURCES is required")
  endif()
  add_library(${target} MODULE ${ARG_SOURCES})
  if(TARGET fsdpx::fsdpx)
    target_link_libraries(${target} PRIVATE fsdpx::fsdpx ${ARG_LINK_LIBRARIES})
  else()
    target_link_libraries(${target} PRIVATE fsdpx ${ARG_LINK_LIBRARIES})
  endif()
  set_target_properties(${target} PROPERTIES
    PREFIX ""
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    DEFINE_SYMBOL ""
    LINK_DEPENDS "${_FSDPX_PLUGIN_MAP}")
  target_link_options(${target} PRIVATE "LINKER:--version-script=${_FSDPX_PLUGIN_MAP}")
  if(NOT FSDPX_SANITIZE AND NOT FSDPX_FUZZ)  # a sanitized plugin leaves the sanitizer's symbols to the executable
    target_link_options(${target} PRIVATE "LINKER:-z,defs")
  endif()
  if(TARGET fsdpx_pch)  # in-tree: share the precompiled LibTorch headers
    target_precompile_headers(${target} REUSE_FROM fsdpx_pch)
  endif()
  if(ARG_OUTPUT_DIRECTORY)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY "${ARG_OUTPUT_DIRECTORY}")
  elseif(DEFINED FSDPX_PLUGIN_OUTPUT_DIRECTORY)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY "${FSDPX_PLUGIN_OUTPUT_DIRECTORY}")
  endif()
  if(DEFINED FSDPX_INSTALL_PLUGIN_DIR)  # in-tree: lib/fsdpx/plugins -> lib
    set_target_properties(${target} PROPERTIES INSTALL_RPATH "$ORIGIN/../..;${FSDPX_TORCH_LIBDIR}")
    if(NOT ARG_NO_INSTALL)
      install(TARGETS ${target} LIBRARY DESTINATION ${FSDPX_INSTALL_PLUGIN_DIR})
    endif()
  endif()
endfunction()
