#!/usr/bin/env bash
# The layers of libfsdpx are separate CMake targets, each seeing only the include roots of the
# layers below it. Builds one file that includes a trainer header from the engine layer (must
# fail: the header is not on its path) and from the trainer layer (must succeed).
set -uo pipefail
build=$1
out=$(cmake --build "$build" --target layering_probe_engine 2>&1)
if [[ $? -eq 0 ]]; then
  echo "FAIL: the engine layer compiled an include of the trainer's header"; exit 1
fi
# GCC: "...trainer.h: No such file or directory"; clang: "'...trainer.h' file not found".
if ! grep -Eq "fsdpx/framework/trainer/trainer.h(: No such file|' file not found)" <<<"$out"; then
  echo "FAIL: the engine layer's probe failed for another reason:"; echo "$out" | tail -20; exit 1
fi
if ! out=$(cmake --build "$build" --target layering_probe_trainer 2>&1); then
  echo "FAIL: the same file does not compile in the trainer layer:"; echo "$out" | tail -20; exit 1
fi
echo "layering holds: engine -/-> trainer; trainer -> engine"
