# Installs the SDK from the build tree into a fresh prefix, then configures and builds each of
# sdk/examples/ (top_level_wrap, counting_data) and examples/train_loop as a separate CMake project
# each against that prefix, as a third party would. Run by CTest (sdk_consumer_build) with cmake -P.
foreach(v FSDPX_BUILD_DIR FSDPX_SOURCE_DIR WORK_DIR FSDPX_PYTHON)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "build_example.cmake needs -D${v}=...")
  endif()
endforeach()

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "failed (${rc}): ${cmd}")
  endif()
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
run(${CMAKE_COMMAND} --install "${FSDPX_BUILD_DIR}" --prefix "${prefix}")
# The package's headers are the SDK's alone (the plugins' interfaces and the library's fsdpx.h):
# no header of fsdpx's internal layers is installed, so the examples build against the public ones.
file(GLOB_RECURSE internal_headers "${prefix}/include/fsdpx/framework/*")
if(internal_headers)
  message(FATAL_ERROR "the package installs fsdpx's internal headers: ${internal_headers}")
endif()
if(NOT EXISTS "${prefix}/include/fsdpx/fsdpx.h")
  message(FATAL_ERROR "the package does not install the library's header fsdpx/fsdpx.h")
endif()
# Only the package config is given: no include paths, no link flags, no hints at the source tree.
# (The installed config finds LibTorch through the python fsdpx was built with.)
set(launcher)
find_program(CCACHE ccache)
if(CCACHE)
  set(launcher -DCMAKE_CXX_COMPILER_LAUNCHER=${CCACHE})
endif()
# -DONLY_TRAIN_LOOP=ON: examples/train_loop alone (gpu-check's several-rank part runs it).
set(sdk_examples top_level_wrap:top_level counting_data:counting)
if(ONLY_TRAIN_LOOP)
  set(sdk_examples)
endif()
foreach(example ${sdk_examples})
  string(REPLACE ":" ";" parts ${example})
  list(GET parts 0 dir)
  list(GET parts 1 component)
  run(${CMAKE_COMMAND} -S "${FSDPX_SOURCE_DIR}/sdk/examples/${dir}" -B "${WORK_DIR}/${dir}"
      -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${prefix} ${launcher})
  run(${CMAKE_COMMAND} --build "${WORK_DIR}/${dir}")
  # The installed host loads it.
  run("${prefix}/bin/fsdpx-plugins" --no-default-plugins --plugin "${WORK_DIR}/${dir}/${dir}.so" show ${component})
endforeach()
# The library in a user's own training loop (examples/train_loop), against the same prefix; the
# LibraryExample tests run it.
# It is an executable: built with fsdpx's own compiler (a sanitized libfsdpx needs its runtime).
set(compiler)
if(CXX)
  set(compiler -DCMAKE_CXX_COMPILER=${CXX})
endif()
run(${CMAKE_COMMAND} -S "${FSDPX_SOURCE_DIR}/examples/train_loop" -B "${WORK_DIR}/train_loop"
    -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${prefix} ${launcher} ${compiler})
run(${CMAKE_COMMAND} --build "${WORK_DIR}/train_loop")
