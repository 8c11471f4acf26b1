#!/usr/bin/env bash
# scripts/gpu-check.sh on a machine without a GPU, up to the point that needs one (tests, label
# cuda-build). Usage: gpu_check_test.sh MODE SOURCE_DIR BUILD_DIR, MODE one of:
#   build-only  --build-only on this (already built) build directory: a no-op ninja run, no
#               configure step, exit 0;
#   no-gpu      the full command, and --expect-gpu: each stops with one line naming "no GPU
#               visible", exit 3, --expect-gpu before building anything;
#   bad-input   bad options: one line each, exit 2.
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
  *) fail "unknown mode '$mode' (build-only, no-gpu, bad-input)" ;;
esac
echo "ok: $mode"
