#!/usr/bin/env bash
# No line of fsdpx's C++ over 120 columns (.clang-format's ColumnLimit): every .cpp, .h, .hpp,
# .cu and .in file of the source tree, build directories aside.
set -uo pipefail
src=$1
cd "$src"
found=$(find framework sdk plugins devices hosts tests benchmarks examples -type f \
          \( -name '*.cpp' -o -name '*.h' -o -name '*.hpp' -o -name '*.cu' -o -name '*.h.in' \) 2>/dev/null |
        sort | xargs awk 'length > 120 { printf "%s:%d: %d columns\n", FILENAME, FNR, length }')
if [[ -n $found ]]; then
  echo "FAIL: lines over 120 columns (clang-format --lines=N:N FILE formats one with .clang-format):"
  echo "$found"
  exit 1
fi
echo "no line over 120 columns"
