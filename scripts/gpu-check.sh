#!/usr/bin/env bash
# `make gpu-check`: the one command that proves fsdpx's CUDA path on a machine with a GPU. It
# builds fsdpx (Release, TORCH_CUDA_ARCH_LIST=9.0), runs cuda_probe expecting a GPU, the tests
# labelled gpu and device, then benchmarks/gpu_table.py (gpt 1b on one GPU against PyTorch FSDP2,
# the largest gpt with and without cpu_offload, overlap on and off). --help says what it needs.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GC_DIR=$REPO/.gpu-check
# The Debian packages the build needs beyond a compiler, CMake, Ninja, nvcc and torch: the build
# dependencies of scripts/setup.sh's DEB_PACKAGES (Boost 1.81 with program_options, GoogleTest,
# nlohmann-json, xxHash) and the libraries they need at run time. Debian 12 (bookworm) names.
DEBS=(libboost1.81-dev libboost-program-options1.81-dev libboost-program-options1.81.0
      libgtest-dev nlohmann-json3-dev libxxhash-dev libxxhash0)
TORCH_VERSION=2.11.0

usage() {
  cat <<EOF
usage: scripts/gpu-check.sh [options]      (make gpu-check GPU_CHECK_ARGS="...")

Proves fsdpx's CUDA path on the first machine with a GPU: builds fsdpx in Release for sm_90
(TORCH_CUDA_ARCH_LIST=9.0), runs cuda_probe expecting a GPU, then 'ctest -L gpu' and the
device tests whose expectation depends on a visible GPU, with it and once more with
CUDA_VISIBLE_DEVICES= set empty (every device test with --sim-tests), then prints one table of measured figures
(benchmarks/gpu_table.py): gpt 1b, bf16_mixed, full_shard on one GPU (tokens/s, MFU as torchtitan
counts it, 6*N_non_embedding + 12*L*H*Q*T FLOPs per token, against the GPU's dense bf16 peak, peak
allocated), PyTorch FSDP2 on the same weights and batches (step-time and peak-memory ratios),
the largest gpt at 1b width that trains one step with and without cpu_offload, and the step time
with overlap on and off, where a step's time goes (CUDA events), and the memory options' peaks
(recomputed Blocks, --optimizer-in-backward, activation offload) against FSDP2 recomputing the
same, and float8 against bf16_mixed and against FSDP2 with torchao's float8 (where --python has
torchao; two more gpt 1b runs, not yet timed on a GPU). Then the several-rank part (benchmarks/gpu_multi.py) at 2 and 4 ranks over NCCL, a GPU
per rank where there are enough and ranks sharing them otherwise (--share-gpus: each rank a node
of its own to NCCL, over loopback sockets; on a one-GPU machine every rank shares it): losses of
each strategy and memory option against the CPU and one rank, an asynchronous save resumed at
the other world size, bytes per step against the plan, a rank killed and one stopped named by
every other, the library example under torchrun, a row each (docs/devices.md). A failed step does not stop the
ones after it (the table runs after failed tests); the last line names each step that failed, and
the exit status is then 1.

Needs: an x86-64 Linux machine with an NVIDIA GPU and its driver (nvidia-smi), the CUDA 13.0
toolkit (nvcc), a C++17 compiler, CMake >= 3.25, Ninja, and a Python with torch ${TORCH_VERSION}+cu130
(a venv); no network. Boost 1.81, GoogleTest, nlohmann-json and xxHash come as Debian packages:
on a machine with network and apt, 'scripts/gpu-check.sh --fetch-deps' downloads them (about
12 MB) into .gpu-check/debs; copy that folder to the GPU machine, where they are unpacked with
dpkg-deb -x (or ar and tar) into .gpu-check/prefix (no root needed) and CMake is pointed at it.
How long: on H100 and H200 machines with 16 cores, the build 113 to 147 s; the probe and the
gpu tests under a minute; the table 2.1 to 2.4 min without the search for the largest model, which
takes about 10 min more (each try is a 1-step run of 12 to 80 s); the several-rank part's 31 runs
and the example's build are budgeted at 2.5 min (not yet timed on a GPU: on sim's twin, 2 cores,
the runs take 48 s at 2 rows at once), so that '--no-largest' fits in 9 minutes.

options:
  --fetch-deps        download the Debian packages into --debs (needs network and apt-get), then stop
  --debs DIR          where the .debs are (default .gpu-check/debs)
  --prefix DIR        where they are unpacked (default .gpu-check/prefix)
  --system-deps       use the Boost, GoogleTest, nlohmann-json and xxHash installed on this machine
  --python PATH       the Python whose torch ${TORCH_VERSION} to build against (default: a configured build
                      directory's, FSDPX_PYTHON, scripts/setup.sh's venv if it exists, else python3)
  --build-dir DIR     the build directory (default build-gpu); an already configured one is only
                      built again (ninja does what changed), never configured afresh
  --jobs N            parallel compile jobs (default: the CPUs here)
  --build-only        stop after the build (no GPU needed)
  --expect-gpu        check that a GPU is visible (nvidia-smi) before anything else, not after the build
  --peak-tflops N     the GPU's dense bf16 peak for MFU (default: by device name: H100, H200)
  --no-largest        leave out the search for the largest model (the longest part of the table)
  --no-tests          leave out the ctest runs; --no-table leaves out the table, --no-multi the
                      several-rank part (to split the work over several sittings; the last line then
                      says what was left out)
  --multi-only        the build and the several-rank part alone (--no-tests --no-table)
  --sim-tests         also every test labelled device (sim's, run in every CI run; about 5 min)
  -h, --help          this text

Exit status: 0 when everything ran and passed; 2 bad usage; 3 no GPU visible; 1 any other failure.
EOF
}

say() { printf 'gpu-check: %s\n' "$*"; }
die() { printf 'gpu-check: %s\n' "$*" >&2; exit 1; }
usage_error() { printf 'gpu-check: %s\n' "$*" >&2; exit 2; }
no_gpu() { printf 'gpu-check: no GPU visible: %s\n' "$*" >&2; exit 3; }
stage() { printf '\n== gpu-check: %s (%s)\n' "$*" "$(date -u +%H:%M:%S)"; }

fetch=0 system_deps=0 build_only=0 expect_gpu=0 largest=1 tests=1 table=1 multi=1 sim_tests=0
debs=$GC_DIR/debs prefix=$GC_DIR/prefix build_dir=build-gpu python= peak=
jobs=$(nproc 2>/dev/null || echo 2)
need_value() { [[ $# -ge 2 && -n $2 ]] || usage_error "$1 needs a value (see --help)"; }
while (($#)); do
  case $1 in
    --fetch-deps) fetch=1 ;;
    --system-deps) system_deps=1 ;;
    --build-only) build_only=1 ;;
    --expect-gpu) expect_gpu=1 ;;
    --no-largest) largest=0 ;;
    --no-tests) tests=0 ;;
    --no-table) table=0 ;;
    --no-multi) multi=0 ;;
    --multi-only) tests=0 table=0 ;;
    --sim-tests) sim_tests=1 ;;
    --debs) need_value "$@"; debs=$2; shift ;;
    --prefix) need_value "$@"; prefix=$2; shift ;;
    --build-dir) need_value "$@"; build_dir=$2; shift ;;
    --python) need_value "$@"; python=$2; shift ;;
    --jobs)
      need_value "$@"; [[ $2 =~ ^[1-9][0-9]*$ ]] || usage_error "--jobs must be a positive whole number, got '$2'"
      jobs=$2; shift ;;
    --peak-tflops)
      need_value "$@"
      [[ $2 =~ ^[0-9]+([.][0-9]+)?$ && ! $2 =~ ^0+([.]0+)?$ ]] ||
        usage_error "--peak-tflops must be a positive number of TFLOPS (e.g. 989), got '$2'"
      peak=$2; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage_error "unknown option '$1' (see --help)" ;;
  esac
  shift
done
if ((system_deps && fetch)); then usage_error "--fetch-deps and --system-deps cannot go together"; fi
# Paths as given from where the command ran; then everything runs from the checkout.
debs=$(realpath -m "$debs") prefix=$(realpath -m "$prefix") build_dir=$(realpath -m "$build_dir")
# A Python is made absolute but kept as given: a venv's bin/python3 is a symlink to the system's,
# and only called by its venv path does it find the venv's torch.
[[ $python != */* ]] || python=$(realpath -ms "$python")
cd "$REPO"
start=$(date +%s)

# --- --fetch-deps: on a machine with network and apt ------------------------------------------
if ((fetch)); then
  command -v apt-get >/dev/null || die "--fetch-deps needs apt-get (a Debian or Ubuntu machine with network)"
  mkdir -p "$debs"
  (cd "$debs" && apt-get download "${DEBS[@]}") ||
    die "apt-get download ${DEBS[*]} failed (see above): run 'apt-get update' first, or check the network"
  say "$(ls "$debs"/*.deb | wc -l) packages in $debs ($(du -sh "$debs" | cut -f1)); copy that folder into the" \
      "checkout on the GPU machine (as .gpu-check/debs, or give --debs there) and run scripts/gpu-check.sh there"
  exit 0
fi

# --- the GPU, early when asked ----------------------------------------------------------------
nvidia_smi_gpus() {  # the GPUs nvidia-smi lists, one per line; nothing when it is absent or fails
  command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep '^GPU ' || true
}
smi_says() {  # what nvidia-smi says about the GPUs, in a few words
  command -v nvidia-smi >/dev/null || { echo "no nvidia-smi on PATH"; return; }
  local first
  first=$(nvidia_smi_gpus | head -1)
  [[ -n $first ]] && echo "nvidia-smi lists $first" && return
  echo "nvidia-smi lists none ($(nvidia-smi -L 2>&1 | head -1))"
}
if ((expect_gpu)) && [[ -z $(nvidia_smi_gpus) ]]; then
  no_gpu "$(smi_says); run this on the machine with the GPU"
fi

# --- tools and torch --------------------------------------------------------------------------
cache=$build_dir/CMakeCache.txt
if [[ -z $python ]]; then
  if [[ -f $cache ]]; then
    python=$(sed -n 's/^FSDPX_PYTHON:FILEPATH=//p' "$cache")
  elif [[ -n ${FSDPX_PYTHON:-} ]]; then
    python=$FSDPX_PYTHON
  elif [[ -x $(bash scripts/setup.sh --print-python) ]]; then
    python=$(bash scripts/setup.sh --print-python)
  else
    python=$(command -v python3 || true)
  fi
fi
[[ -z $python || $python == */* ]] || python=$(command -v "$python" || echo "$python")
[[ -n $python && -x $python ]] ||
  die "no Python at '${python:-python3}': give --python, the venv's python with torch $TORCH_VERSION"
# The venv's own tools (pip's cmake and ninja) count as installed.
export PATH=$PATH:$(dirname "$python")
torch_line=$("$python" -c 'import torch; print(torch.__version__, torch.version.cuda or "none")' 2>&1 | tail -1) ||
  die "$python cannot import torch: $torch_line"
read -r torch_version torch_cuda <<<"$torch_line"
[[ ${torch_version%%+*} == "$TORCH_VERSION" ]] ||
  die "$python has torch $torch_version; fsdpx is built against torch $TORCH_VERSION (+cu130): give --python"
[[ $torch_cuda != none ]] || die "$python has torch $torch_version without CUDA; the CUDA path needs the +cu130 wheel"
for tool in cmake ninja; do
  command -v "$tool" >/dev/null || die "no $tool on PATH (nor beside $python): install it (pip install $tool)"
done
nvcc=$(command -v nvcc || true)
[[ -n $nvcc || ! -x /usr/local/cuda/bin/nvcc ]] || nvcc=/usr/local/cuda/bin/nvcc
[[ -n $nvcc ]] || die "no nvcc on PATH nor in /usr/local/cuda/bin: the CUDA $torch_cuda toolkit is needed to build"
say "torch $torch_version (CUDA $torch_cuda) from $python; $(cmake --version | head -1); ninja $(ninja --version);" \
    "nvcc $("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"

# --- build dependencies: unpacked Debian packages ---------------------------------------------
unpack_deb() {  # dpkg-deb -x, or where there is none (not Debian or Ubuntu) the same with ar and tar
  if command -v dpkg-deb >/dev/null; then
    dpkg-deb -x "$1" "$prefix"
    return
  fi
  local tmp
  tmp=$(mktemp -d)
  (cd "$tmp" && ar x "$1" && tar -xf data.tar.* -C "$prefix")
  local rc=$?
  rm -rf "$tmp"
  return $rc
}
unpack_deps() {  # prints the CMake arguments that point the build at the prefix
  local d n=0 libdir
  for d in "${DEBS[@]}"; do
    compgen -G "$debs/${d}_*.deb" >/dev/null ||
      die "no $d .deb in $debs: run 'scripts/gpu-check.sh --fetch-deps' on a machine with network and copy" \
          "$debs here, or give --system-deps to use this machine's packages"
  done
  mkdir -p "$prefix"
  for d in "$debs"/*.deb; do
    # Unpacked once per package file: the stamp names the .deb it came from.
    local stamp=$prefix/.unpacked-$(basename "$d")
    [[ -f $stamp ]] && continue
    unpack_deb "$d" || die "could not unpack $d into $prefix (see above)"
    touch "$stamp"; n=$((n + 1))
  done
  libdir=$(dirname "$(compgen -G "$prefix/usr/lib/*/libboost_program_options.so.*" | head -1)")
  say "build dependencies from $prefix ($n package(s) unpacked now; libraries in $libdir)" >&2
  # The prefix first on CMake's search path; its libraries in every binary's RUNPATH, so the tests
  # and fsdpx-train find Boost's without LD_LIBRARY_PATH.
  local rpath="-Wl,-rpath,$libdir"
  printf '%s\n' "-DCMAKE_PREFIX_PATH=$prefix/usr" "-DCMAKE_EXE_LINKER_FLAGS=$rpath" \
    "-DCMAKE_SHARED_LINKER_FLAGS=$rpath" "-DCMAKE_MODULE_LINKER_FLAGS=$rpath"
}

stage "build in $build_dir"
export TORCH_CUDA_ARCH_LIST=9.0
if [[ -f $cache ]]; then
  # Configured already: build what changed, with the cache as it is (a new -D would rebuild it all).
  say "configured already ($cache): building what changed; remove $build_dir to configure afresh"
else
  cmake_args=()
  if ((system_deps == 0)); then
    command -v dpkg-deb >/dev/null || command -v ar >/dev/null ||
      die "neither dpkg-deb nor ar here to unpack the .debs: give --system-deps"
    mapfile -t cmake_args < <(unpack_deps)
    ((${#cmake_args[@]})) || exit 1
  fi
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDPX_PYTHON="$python" \
    -DCMAKE_CUDA_COMPILER="$nvcc" -DCUDAToolkit_ROOT="$(dirname "$(dirname "$(readlink -f "$nvcc")")")" \
    "${cmake_args[@]}" || die "cmake could not configure $build_dir (see above)"
fi
cmake --build "$build_dir" -j "$jobs" || die "the build failed (see above)"
say "built in $(( $(date +%s) - start )) s"
if ((build_only)); then
  say "--build-only: stopping before the steps that need a GPU"
  exit 0
fi

# --- from here on a failed step does not stop the ones after it: one run on a GPU machine brings
# back every figure it can, and its last line names each step that failed (exit 1).
failed=()
failed_step() {  # what failed, and where to look
  printf 'gpu-check: FAILED: %s\n' "$*"
  failed+=("$*")
}

# --- the GPU: the probe binds every CUDA and NCCL entry point and must find a device -----------
stage "cuda_probe --expect-gpu"
[[ -x $build_dir/tests/cuda_probe ]] ||
  die "no $build_dir/tests/cuda_probe: the build has no tests (FSDPX_BUILD_TESTS=OFF?)"
probe_out=$(LD_BIND_NOW=1 "$build_dir/tests/cuda_probe" --expect-gpu 2>&1) && probe_rc=0 || probe_rc=$?
gpus=$(sed -n 's/^gpus visible: \([0-9]*\).*/\1/p' <<<"$probe_out")
if [[ ${gpus:-0} == 0 ]]; then
  no_gpu "cuda_probe says '$(grep -m1 '^gpus visible' <<<"$probe_out" || echo "${probe_out##*$'\n'}")'," \
         "$(smi_says); run this on the machine with the GPU"
fi
printf '%s\n' "$probe_out"
((probe_rc == 0)) || failed_step "cuda_probe exited $probe_rc with $gpus GPU(s) visible (its lines above name the step)"

# --- the tests: on a GPU, a skipped test proves nothing, so skips are listed by name -----------
# The device tests whose expectation depends on whether a GPU is visible run with it and once more
# with none visible (CUDA_VISIBLE_DEVICES=), so that both of their branches run on the GPU machine.
GPU_DEPENDENT='^(SimTrainBadInput\.DevicesThatCannotRunAreOneLineBeforeAnyWorker)$'
run_ctest() {  # name (of the log), then ctest's selection; a failure is recorded with the tests' names
  local name=$1 log=$build_dir/gpu-check-ctest-$1.log
  shift
  stage "ctest $* ($name)"
  set +e
  ctest --test-dir "$build_dir" "$@" --no-tests=error --output-on-failure --timeout 900 -j 1 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  set -e
  local skipped names
  skipped=$(grep -E '\*\*\*Skipped|Not Run' "$log" |
            sed -E 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: //; s/ \.{3,}.*//' || true)
  if [[ -n $skipped ]]; then
    say "$name: skipped on this machine, so not proven here: $(tr '\n' ' ' <<<"$skipped")"
    not_proven=$((not_proven + $(grep -c . <<<"$skipped")))
  fi
  ((rc != 0)) || return 0
  names=$(sed -n '/The following tests FAILED:/,$p' "$log" |
          sed -n -E 's/^[[:space:]]+[0-9]+ - ([^ ]+) .*/\1/p' | tr '\n' ' ')
  failed_step "ctest $* (${names:+${names% }; }log: $log)"
}
not_proven=0 left_out=
if ((tests)); then
  run_ctest gpu -L gpu
  # The other device tests run on sim, the same on any machine, and in every CI run: here only with
  # --sim-tests (about 5 minutes at one test at a time), to keep gpu-check within 9 minutes.
  if ((sim_tests)); then
    run_ctest device -L device
  else
    run_ctest device-gpu-visible -L device -R "$GPU_DEPENDENT"
    left_out+="; the sim device tests were left out (CI runs them; --sim-tests adds them)"
  fi
  CUDA_VISIBLE_DEVICES='' run_ctest device-gpu-hidden -L device -R "$GPU_DEPENDENT"
else
  left_out+="; the tests were left out (--no-tests)"
fi

# --- the table: after failed tests too ---------------------------------------------------------
if ((table)); then
  stage "the table (benchmarks/gpu_table.py)"
  table_args=(--build-dir "$build_dir" --python "$python" --json "$build_dir/gpu-check.json")
  [[ -z $peak ]] || table_args+=(--peak-tflops "$peak")
  ((largest)) || { table_args+=(--no-largest); left_out+="; the search for the largest model was left out"; }
  if PYTHONUNBUFFERED=1 "$python" benchmarks/gpu_table.py "${table_args[@]}"; then
    left_out+="; figures also in $build_dir/gpu-check.json"
  else
    failed_step "benchmarks/gpu_table.py exited $? (see above; the figures it measured are printed there)"
  fi
else
  left_out+="; the table was left out (--no-table)"
fi
# --- several ranks over NCCL: 2 and 4, sharing the GPUs where there are fewer (--share-gpus) ------
if ((multi)); then
  stage "2 and 4 ranks over NCCL on $gpus GPU(s) (benchmarks/gpu_multi.py)"
  example=$build_dir/tests/sdk_consumer/train_loop/train_loop
  example_args=(--example "$example")
  if ! cmake -DFSDPX_BUILD_DIR="$build_dir" -DFSDPX_SOURCE_DIR="$REPO" -DWORK_DIR="$build_dir/tests/sdk_consumer"        -DFSDPX_PYTHON="$python" -DONLY_TRAIN_LOOP=ON -P tests/sdk/build_example.cmake; then
    failed_step "examples/train_loop did not build against the installed package (see above); its row does not run"
    example_args=()
  fi
  if PYTHONUNBUFFERED=1 "$python" benchmarks/gpu_multi.py --build-dir "$build_dir" --ranks 2,4 --jobs 4 \
       --python "$python" "${example_args[@]}" --json "$build_dir/gpu-check-multi.json"; then
    left_out+="; the several-rank rows also in $build_dir/gpu-check-multi.json"
  else
    failed_step "benchmarks/gpu_multi.py exited $? on $gpus GPU(s) (see its table above)"
  fi
else
  left_out+="; the several-rank part was left out (--no-multi)"
fi
((not_proven == 0)) || left_out+="; $not_proven skipped test(s), listed above, are not proven here"
took="$(( ($(date +%s) - start) / 60 )) min"
if ((${#failed[@]})); then
  what=${failed[0]}
  for f in "${failed[@]:1}"; do what+=" AND $f"; done
  printf 'gpu-check: failed in %s: %s%s\n' "$took" "$what" "$left_out" >&2
  exit 1
fi
say "passed in $took$left_out"
