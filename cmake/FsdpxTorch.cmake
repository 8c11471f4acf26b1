# Finds LibTorch from the torch wheel of a Python environment (torch.utils.cmake_prefix_path)
# and the CUDA toolkit it was built against. Used in-tree and by fsdpxConfig.cmake.
#
# Inputs:  FSDPX_PYTHON (cache): the python whose torch to use; found on PATH when unset.
# Outputs: targets torch, fsdpx_torch and fsdpx_torch_cpu (imported; link one of the latter two),
#          FSDPX_TORCH_VERSION, FSDPX_WITH_CUDA (ON for a CUDA build).
#          With CUDA: FSDPX_TORCH_NCCL_INCLUDE_DIR (the wheel's nccl.h), FSDPX_TORCH_RPATH_LINK.
include_guard(GLOBAL)

set(FSDPX_PYTHON "" CACHE FILEPATH "Python interpreter whose torch package provides LibTorch")
if(NOT FSDPX_PYTHON)
  find_program(FSDPX_PYTHON_FOUND NAMES python3 python REQUIRED)
  set(FSDPX_PYTHON "${FSDPX_PYTHON_FOUND}" CACHE FILEPATH "" FORCE)
endif()

execute_process(
  COMMAND "${FSDPX_PYTHON}" -c
    "import torch.utils, torch; print(torch.utils.cmake_prefix_path); print(torch.__version__.split('+')[0]); print(torch.version.cuda or '')"
  OUTPUT_VARIABLE _fsdpx_torch_out ERROR_VARIABLE _fsdpx_torch_err
  RESULT_VARIABLE _fsdpx_torch_rc OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _fsdpx_torch_rc EQUAL 0)
  message(FATAL_ERROR "fsdpx: cannot import torch from ${FSDPX_PYTHON}: ${_fsdpx_torch_err}\n"
                      "Run scripts/setup.sh (or `make setup`) to install torch into the cached environment.")
endif()
string(REPLACE "\n" ";" _fsdpx_torch_out "${_fsdpx_torch_out}")
list(GET _fsdpx_torch_out 0 _fsdpx_torch_prefix)
list(GET _fsdpx_torch_out 1 FSDPX_TORCH_VERSION)
list(LENGTH _fsdpx_torch_out _n)
set(_fsdpx_torch_cuda "")
if(_n GREATER 2)
  list(GET _fsdpx_torch_out 2 _fsdpx_torch_cuda)
endif()
list(APPEND CMAKE_PREFIX_PATH "${_fsdpx_torch_prefix}")

if(_fsdpx_torch_cuda)
  set(FSDPX_WITH_CUDA ON)
  if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
    set(ENV{TORCH_CUDA_ARCH_LIST} "9.0")
  endif()
  if(NOT CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  # The wheel's CUDA libraries (cuBLAS, cuDNN, NCCL, ...) live in site-packages/nvidia/*; the
  # linker needs them to resolve libtorch_cuda's dependencies.
  get_filename_component(_fsdpx_site "${_fsdpx_torch_prefix}/../../.." ABSOLUTE)
  file(GLOB _fsdpx_nv_libdirs LIST_DIRECTORIES true "${_fsdpx_site}/nvidia/*/lib" "${_fsdpx_site}/nvidia/cu13/lib")
  set(FSDPX_TORCH_RPATH_LINK "${_fsdpx_nv_libdirs}")
  set(FSDPX_TORCH_NCCL_INCLUDE_DIR "${_fsdpx_site}/nvidia/nccl/include")  # the wheel's nccl.h
else()
  set(FSDPX_WITH_CUDA OFF)
endif()

find_package(Torch REQUIRED)
get_filename_component(FSDPX_TORCH_LIBDIR "${TORCH_LIBRARY}" DIRECTORY)
if(FSDPX_TORCH_RPATH_LINK)
  string(REPLACE ";" ":" _fsdpx_rpl "${FSDPX_TORCH_RPATH_LINK}")
  set_property(TARGET torch APPEND PROPERTY INTERFACE_LINK_OPTIONS "LINKER:-rpath-link,${_fsdpx_rpl}")
endif()
# The wheel's libtorch.so and libtorch_cpu.so export their own, statically linked copies of
# std::filesystem, and some of them crash when called from outside (std::filesystem::remove_all
# jumps to address 0). The dynamic linker binds a symbol to the first library in load order that
# defines it, so every fsdpx target links libstdc++ ahead of LibTorch (tests/unit/
# link_order_test.cpp fails loudly if that ever stops being true). Link fsdpx::torch, not torch.
if(NOT TARGET fsdpx_torch)
  add_library(fsdpx_torch INTERFACE IMPORTED GLOBAL)
  set_property(TARGET fsdpx_torch PROPERTY INTERFACE_LINK_LIBRARIES
    "-Wl,--push-state,--no-as-needed;stdc++;-Wl,--pop-state;torch")
endif()
# fsdpx_torch_cpu: what fsdpx's own tree links (libfsdpx, its plugins and hosts, the tests). The
# same headers and definitions as torch, so every object compiles alike, but only LibTorch's CPU
# libraries: loading libtorch_cuda and the CUDA libraries costs each process 0.2 s of CPU, and the
# test suite starts over two thousand of them. A run that asks for CUDA loads libfsdpx_cuda.so
# (devices/cuda), which links torch and with it libtorch_cuda. Programs that use CUDA themselves
# before fsdpx opens the device (a training loop written against the library, such as
# tests/workers/library_worker) link fsdpx_torch, as the installed package's users do.
if(NOT TARGET fsdpx_torch_cpu)
  add_library(fsdpx_torch_cpu INTERFACE IMPORTED GLOBAL)
  set_property(TARGET fsdpx_torch_cpu PROPERTY INTERFACE_LINK_LIBRARIES
    "-Wl,--push-state,--no-as-needed;stdc++;-Wl,--pop-state;torch_cpu_library;c10")
  set(_fsdpx_torch_includes ${TORCH_INCLUDE_DIRS})
  if(FSDPX_WITH_CUDA)
    list(APPEND _fsdpx_torch_includes "$<TARGET_PROPERTY:torch::cudart,INTERFACE_INCLUDE_DIRECTORIES>")
    set_property(TARGET fsdpx_torch_cpu PROPERTY INTERFACE_COMPILE_DEFINITIONS
      "$<TARGET_PROPERTY:torch_cuda,INTERFACE_COMPILE_DEFINITIONS>")
  endif()
  set_property(TARGET fsdpx_torch_cpu PROPERTY INTERFACE_INCLUDE_DIRECTORIES "${_fsdpx_torch_includes}")
  set_property(TARGET fsdpx_torch_cpu PROPERTY INTERFACE_COMPILE_OPTIONS
    "$<TARGET_PROPERTY:torch,INTERFACE_COMPILE_OPTIONS>")
endif()
message(STATUS "fsdpx: LibTorch ${FSDPX_TORCH_VERSION} from ${_fsdpx_torch_prefix} (CUDA: ${FSDPX_WITH_CUDA} ${_fsdpx_torch_cuda})")
