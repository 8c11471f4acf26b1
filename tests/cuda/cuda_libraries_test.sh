#!/usr/bin/env bash
# LibTorch's CUDA libraries are loaded only by the runs that ask for them: libfsdpx_cuda.so needs
# libtorch_cuda and libc10_cuda, and what every other run loads (libfsdpx, libfsdpx_sim, the
# plugins, fsdpx-train and the test workers) needs none of them, nor what they bring (NCCL,
# cuBLAS), nor libtorch.so (which needs libtorch_cuda). libtorch_cpu's own (cudart and CUPTI, for
# its profiler) stay. Usage: cuda_libraries_test.sh BUILD_DIR
set -euo pipefail
build=$1
fail() { echo "FAIL: $*" >&2; exit 1; }
cuda=$build/lib/libfsdpx_cuda.so
[[ -f $cuda ]] || fail "$cuda was not built"
for lib in libtorch_cuda.so libc10_cuda.so; do
  readelf -d "$cuda" | grep -q "NEEDED.*\[$lib\]" || fail "libfsdpx_cuda.so does not need $lib"
done
checked=0
for f in "$build"/lib/libfsdpx.so "$build"/lib/libfsdpx_sim.so "$build"/lib/fsdpx/plugins/*.so \
         "$build"/bin/fsdpx-train "$build"/bin/fsdpx-plugins "$build"/tests/engine_worker "$build"/tests/fsdpx_tests; do
  [[ -e $f ]] || fail "$f was not built"
  loaded=$(ldd "$f" | grep -oE 'lib(torch_cuda|c10_cuda|torch|nccl|cublas)\.so[^ ]*' | sort -u | tr '\n' ' ') || true
  [[ -z $loaded ]] || fail "$(basename "$f") loads ${loaded}(only libfsdpx_cuda.so may)"
  checked=$((checked + 1))
done
echo "libfsdpx_cuda.so needs libtorch_cuda and libc10_cuda; none of the other $checked libraries and programs loads them"

# A libfsdpx_cuda.so that does not load is one line before any worker starts, naming the path.
err=$(FSDPX_CUDA_LIBRARY=/nonexistent/libfsdpx_cuda.so timeout 60 "$build"/bin/fsdpx-train --nproc-per-node 2 \
        --device cuda --model.size tiny --data.name synthetic --steps 1 2>&1 >/dev/null) && fail "it trained"
[[ $err == *"libfsdpx_cuda.so, which did not load from /nonexistent/libfsdpx_cuda.so"* ]] ||
  fail "no libfsdpx_cuda.so: $err"
(($(wc -l <<<"$err") == 1)) || fail "more than one line: $err"
echo "a missing libfsdpx_cuda.so: $err"

# LibTorch asked about CUDA before libfsdpx_cuda.so loaded: --device cuda is refused, saying so.
out=$(timeout 60 "$build"/tests/cuda_probe --ask-libtorch-first) || fail "cuda_probe --ask-libtorch-first: $out"
echo "$out"
