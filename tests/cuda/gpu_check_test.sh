#!/usr/bin/env bash
# scripts/gpu-check.sh on a machine without a GPU, up to the point that needs one (tests, label
# cuda-build). Usage: gpu_check_test.sh MODE SOURCE_DIR BUILD_DIR, MODE one of:
#   build-only  --build-only on this (already built) build directory: a no-op ninja run, no
#               configure step, exit 0;
#   no-gpu      the full command, and --expect-gpu: each stops with one line naming "no GPU
#               visible", exit 3, --expect-gpu before building anything;
#   bad-input   bad options: one line each, exit 2;
#   flow        the steps after the build, against stand-ins for the GPU machine's tools (cmake,
#               ninja, nvcc, ctest, cuda_probe, a venv's python that finds torch only when called by
#               its venv path): a venv's python is kept as given; every step runs after a failed one,
#               the table after failed tests, and the last line names each failure (exit 1); the
#               device tests that depend on a visible GPU run again with CUDA_VISIBLE_DEVICES empty,
#               and the names gpu-check gives them are tests of this build.
# Exits 77 (skipped) in no-gpu mode on a machine that has a GPU: there the command would go on.
set -uo pipefail
mode=$1 src=$2 build=$3
script=$src/scripts/gpu-check.sh
fail() { printf 'FAIL: %s\n' "$*"; exit 1; }

# Runs the script with a time limit; sets rc, out (stdout and stderr) and err (stderr alone).
run() {
  local e
  e=$(mktemp)
  out=$(timeout 600 bash "$script" "$@" 2>"$e")
  rc=$?
  err=$(cat "$e")
  out+=$'\n'$err
  rm -f "$e"
  printf -- '--- gpu-check.sh %s: exit %d\n%s\n' "$*" "$rc" "$out"
}

one_line() {  # what, expected exit status, text the line must hold
  ((rc == $2)) || fail "$1: exit status $rc, expected $2"
  [[ $(grep -c . <<<"$err") == 1 ]] || fail "$1: expected one line on stderr, got: $err"
  [[ $err == *"$3"* ]] || fail "$1: the line does not say '$3': $err"
  [[ ! $err =~ \ [0-9]+$ ]] || fail "$1: the line ends with a stray number: $err"
}

# Stand-ins for the GPU machine in $1: tools on PATH, a configured build directory, and a venv whose
# python3 is a symlink to a "system" python that has no torch. FAKE_* variables steer them; each
# call is logged to $1/calls.
make_machine() {
  local m=$1
  mkdir -p "$m/bin" "$m/build/tests" "$m/system" "$m/venv/bin"
  touch "$m/build/CMakeCache.txt"
  stub() { printf '#!/usr/bin/env bash\n%s\n' "$2" >"$m/bin/$1"; chmod +x "$m/bin/$1"; }
  stub cmake 'if [[ $1 == --version ]]; then echo "cmake version 3.28.0"; else echo "ninja: no work to do."; fi'
  stub ninja 'echo 1.11.1'
  stub nvcc 'echo "Cuda compilation tools, release 13.0, V13.0.48"'
  stub nvidia-smi 'echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)"'
  stub ctest "echo \"ctest \$* CUDA_VISIBLE_DEVICES=\${CUDA_VISIBLE_DEVICES-unset}\" >>$m/calls
label=\$(sed -n 's/.*-L \([a-z-]*\).*/\1/p' <<<\"\$*\")
echo \"100% tests passed (stand-in for ctest -L \$label)\"
[[ \$label != \"\${FAKE_CTEST_FAIL:-}\" ]] && exit 0
printf 'The following tests FAILED:\n\t 12 - Sim.Fake%s (Failed)    %s\n' \"\$label\" \"\$label\"; exit 8"
  printf '#!/usr/bin/env bash\necho "gpus visible: ${FAKE_GPUS:-1} (stand-in)"; exit ${FAKE_PROBE_RC:-0}\n' \
    >"$m/build/tests/cuda_probe"
  chmod +x "$m/build/tests/cuda_probe"
  # A venv's python finds the venv's packages from the path it was called by.
  printf '%s\n' '#!/usr/bin/env bash' \
    "[[ \$0 == $m/venv/bin/python3 ]] || { echo \"ModuleNotFoundError: No module named 'torch'\" >&2; exit 1; }" \
    "[[ \$1 == -c ]] && { echo '2.11.0+cu130 13.0'; exit 0; }" \
    "echo \"python \$*\" >>$m/calls; echo 'the table ran (stand-in)'; exit \${FAKE_TABLE_RC:-0}" >"$m/system/python3"
  chmod +x "$m/system/python3"
  ln -s "$m/system/python3" "$m/venv/bin/python3"
}

# Runs gpu-check on the stand-in machine $m from the folder it holds, with `FAKE_*` settings first.
on_machine() {  # VAR=value... -- gpu-check's arguments
  local envs=()
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  : >"$m/calls"
  local e
  e=$(mktemp)
  out=$(cd "$m" && env -u CUDA_VISIBLE_DEVICES PATH="$m/bin:$PATH" "${envs[@]}" \
        timeout 120 bash "$script" --build-dir build --python venv/bin/python3 "$@" 2>"$e")
  rc=$?
  err=$(cat "$e")
  rm -f "$e"
  last=$(printf '%s\n%s\n' "$out" "$err" | grep . | tail -1)
  calls=$(cat "$m/calls")
  printf -- '--- gpu-check.sh %s %s: exit %d\n%s\n%s\n--- calls:\n%s\n' "${envs[*]}" "$*" "$rc" "$out" "$err" "$calls"
}

flow() {
  m=$(mktemp -d)
  trap 'rm -rf "$m"' EXIT
  make_machine "$m"
  on_machine -- --no-largest
  ((rc == 0)) || fail "all passing: exit $rc"
  grep -q "from $m/venv/bin/python3;" <<<"$out" || fail "the venv's python was not kept as given (made absolute)"
  [[ $last == "gpu-check: passed in "*"the search for the largest model was left out"* ]] ||
    fail "all passing: the last line is '$last'"
  grep -q -- '-L gpu .*CUDA_VISIBLE_DEVICES=unset' <<<"$calls" || fail "ctest -L gpu did not run with the GPUs visible"
  local dependent
  dependent=$(sed -n "s/^GPU_DEPENDENT+\{0,1\}='\(.*\)'\$/\1/p" "$script" | tr -d '\n')
  grep -qF -- "-L device -R $dependent --no-tests=error" <<<"$calls" &&
    grep -q -- '-R .*CUDA_VISIBLE_DEVICES=unset' <<<"$calls" &&
    grep -q -- '-R .*CUDA_VISIBLE_DEVICES=$' <<<"$calls" ||
    fail "the GPU-dependent device tests did not run with the GPU visible and again with CUDA_VISIBLE_DEVICES empty"
  ! grep -q -- '-L device --no-tests' <<<"$calls" || fail "every device test ran without --sim-tests"
  [[ $last == *"the sim device tests were left out (CI runs them; --sim-tests adds them)"* ]] ||
    fail "the last line does not say the sim device tests were left out: $last"
  grep -q 'python benchmarks/gpu_table.py .*--no-largest' <<<"$calls" || fail "the table did not run"
  # One GPU, and two: the several-rank part runs at 2 and 4 ranks (gpu_multi shares what it must).
  grep -q 'python benchmarks/gpu_multi.py --build-dir .* --ranks 2,4 ' <<<"$calls" ||
    fail "one GPU: the several-rank part did not run at 2 and 4 ranks: $calls"
  on_machine FAKE_GPUS=2 -- --no-largest --sim-tests
  ((rc == 0)) && grep -q 'python benchmarks/gpu_multi.py --build-dir .* --ranks 2,4 ' <<<"$calls" ||
    fail "two GPUs: the several-rank part did not run at 2 and 4 ranks (exit $rc)"
  grep -q -- '-L device --no-tests=error' <<<"$calls" || fail "--sim-tests: every device test did not run"
  on_machine FAKE_GPUS=2 FAKE_TABLE_RC=5 --
  ((rc == 1)) && [[ $last == *"gpu_multi.py exited 5 on 2 GPU(s)"* ]] ||
    fail "two GPUs, the several-rank part failing: exit $rc, last line '$last'"
  on_machine FAKE_GPUS=2 -- --no-multi
  ((rc == 0)) && [[ $calls != *gpu_multi* && $last == *"the several-rank part was left out (--no-multi)"* ]] ||
    fail "--no-multi: exit $rc, last line '$last'"
  on_machine -- --multi-only
  ((rc == 0)) && [[ $calls != *ctest* && $calls != *gpu_table* && $calls == *gpu_multi* ]] ||
    fail "--multi-only: exit $rc, calls '$calls', last line '$last'"

  # A failed test: the table runs all the same, and the last line names the tests that failed.
  on_machine FAKE_CTEST_FAIL=device --
  ((rc == 1)) || fail "a failed device test: exit $rc, expected 1"
  grep -q 'python benchmarks/gpu_table.py' <<<"$calls" || fail "the table did not run after a failed test"
  [[ $last == "gpu-check: failed in "*"ctest -L device -R "*" (Sim.Fakedevice; log: "* ]] ||
    fail "a failed device test: the last line is '$last'"
  # Every failure named: the probe's, a test's and the table's.
  on_machine FAKE_PROBE_RC=1 FAKE_CTEST_FAIL=gpu FAKE_TABLE_RC=4 --
  ((rc == 1)) || fail "three failures: exit $rc, expected 1"
  for what in "cuda_probe exited 1 with 1 GPU(s)" "ctest -L gpu (Sim.Fakegpu;" "gpu_table.py exited 4"; do
    [[ $last == *"$what"* ]] || fail "three failures: the last line does not name '$what': $last"
  done
  grep -q -- '-L device' <<<"$calls" || fail "the device tests did not run after the probe and a test failed"
  # Each part alone.
  on_machine -- --no-tests
  ((rc == 0)) && [[ $calls != *ctest* && $last == *"the tests were left out (--no-tests)"* ]] ||
    fail "--no-tests: exit $rc, calls '$calls', last line '$last'"
  on_machine -- --no-table
  ((rc == 0)) && [[ $calls != *gpu_table* && $last == *"the table was left out (--no-table)"* ]] ||
    fail "--no-table: exit $rc, calls '$calls', last line '$last'"
  # The names given to the GPU-dependent tests are tests of this build (one, now).
  local listed
  listed=$(ctest --test-dir "$build" -N -R "$dependent" | sed -n 's/^Total Tests: //p')
  [[ $listed == 1 ]] || fail "GPU_DEPENDENT in gpu-check.sh matches $listed tests of $build, expected 1"
}

case $mode in
  build-only)
    run --build-only --build-dir "$build" --jobs 1
    ((rc == 0)) || fail "--build-only exited $rc"
    grep -q 'ninja: no work to do' <<<"$out" || fail "the build step was not a no-op ninja run on a built tree"
    ! grep -q -- '-- Configuring' <<<"$out" || fail "the build step configured an already configured build"
    grep -q 'stopping before the steps that need a GPU' <<<"$out" || fail "--build-only did not stop after the build"
    ;;
  no-gpu)
    gpus=$(LD_BIND_NOW=1 "$build/tests/cuda_probe" 2>/dev/null | sed -n 's/^gpus visible: \([0-9]*\).*/\1/p')
    smi_gpu=0
    command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU ' && smi_gpu=1
    if [[ ${gpus:-0} != 0 || $smi_gpu == 1 ]]; then
      echo "this machine has a GPU: gpu-check would go on to the GPU steps, so this test does not apply here"
      exit 77
    fi
    run --expect-gpu --build-dir "$build" --jobs 1
    one_line "--expect-gpu" 3 "no GPU visible"
    ! grep -q 'ninja' <<<"$out" || fail "--expect-gpu built before checking for a GPU"
    run --build-dir "$build" --jobs 1
    one_line "without --build-only" 3 "no GPU visible"
    grep -q 'ninja: no work to do' <<<"$out" || fail "the build step was not a no-op ninja run on a built tree"
    ;;
  bad-input)
    run --peak-tflops abc
    one_line "--peak-tflops abc" 2 "--peak-tflops must be a positive number"
    run --peak-tflops 0
    one_line "--peak-tflops 0" 2 "--peak-tflops must be a positive number"
    run --jobs 0
    one_line "--jobs 0" 2 "--jobs must be a positive whole number"
    run --build-dir
    one_line "--build-dir without a value" 2 "--build-dir needs a value"
    run --no-such-option
    one_line "an unknown option" 2 "unknown option '--no-such-option'"
    run --fetch-deps --system-deps
    one_line "--fetch-deps --system-deps" 2 "cannot go together"
    run --help
    ((rc == 0)) && grep -q 'Needs:' <<<"$out" && grep -q 'How long:' <<<"$out" ||
      fail "--help does not say what it needs and how long it takes"
    ;;
  flow) flow ;;
  *) fail "unknown mode '$mode' (build-only, no-gpu, bad-input, flow)" ;;
esac
echo "ok: $mode"
