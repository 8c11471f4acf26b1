#!/usr/bin/env bash
# The layers of libfsdpx are separate CMake targets, each seeing only the include roots of the
# layers it depends on. For every ordered pair of layers, tests/CMakeLists.txt generates a probe:
# one file of the first layer that includes a public header of the second. A probe must compile
# exactly when the second layer lies below the first and the first depends on it (fsdpx_layer's
# DEPENDS, followed through); every other probe must fail because the header is not found.
#   check_layering.sh BUILD_DIR USER:USED:ok|fail ...
set -uo pipefail
build=$1
shift
status=0 checked=0
for pair in "$@"; do
  IFS=: read -r user used expect <<<"$pair"
  target=layering_probe_${user}_${used}
  out=$(cmake --build "$build" --target "$target" 2>&1)
  built=$?
  checked=$((checked + 1))
  if [[ $expect == ok && $built -ne 0 ]]; then
    echo "FAIL: the $user layer cannot include the $used layer's header, though it depends on it:"
    echo "$out" | tail -20
    status=1
  elif [[ $expect == fail && $built -eq 0 ]]; then
    echo "FAIL: the $user layer compiled an include of the $used layer's header (an arrow up the stack, or a"
    echo "      dependency fsdpx_layer does not declare)"
    status=1
  # GCC: "...h: No such file or directory"; clang: "'...h' file not found".
  elif [[ $expect == fail ]] && ! grep -Eq "fsdpx/framework/$used/[a-z_]+\.h(: No such file|' file not found)" \
         <<<"$out"; then
    echo "FAIL: the probe of $user including $used failed for another reason:"
    echo "$out" | tail -20
    status=1
  fi
done
[[ $checked -eq 0 ]] && { echo "FAIL: no pair of layers was given"; exit 1; }
[[ $status == 0 ]] &&
  echo "layering holds for all $checked ordered pairs of layers: each sees exactly the lower layers it depends on"
exit $status
