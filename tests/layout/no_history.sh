#!/usr/bin/env bash
# Code says why, not when: no issue numbers, review labels or dates in fsdpx's sources (C++,
# Python, shell and CMake), so that a comment stays true for the next reader. Measured figures and
# their dates live in docs/benchmarks.md; a figure a test depends on is a named constant.
set -uo pipefail
src=$1
cd "$src"
pattern='(\(|\b)issues? [0-9]+|review findings|\b20[0-9]{2}-[01][0-9]-[0-3][0-9]\b'
found=$(find framework sdk plugins devices hosts tests benchmarks examples scripts cmake -type f \
          \( -name '*.cpp' -o -name '*.h' -o -name '*.hpp' -o -name '*.cu' -o -name '*.py' -o -name '*.sh' \
             -o -name '*.cmake' -o -name 'CMakeLists.txt' \) ! -path tests/layout/no_history.sh 2>/dev/null |
        sort | xargs grep -nE "$pattern")
if [[ -n $found ]]; then
  echo "FAIL: history in the code (say why instead; dated figures go to docs/benchmarks.md):"
  echo "$found"
  exit 1
fi
echo "no issue numbers or dates in the code"
