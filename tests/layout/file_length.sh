#!/usr/bin/env bash
# No C++ file of the framework over 450 lines, and the trainer's loop (trainer.cpp) at most 350:
# a file a reader can take in at one sitting, with one job. A file that grows past its bound is
# split by job (as run_plan's checks, rendering and memory fit are), not granted an exception.
set -uo pipefail
src=$1
cd "$src"
limit=450
trainer_limit=350
found=$(find framework -type f \( -name '*.cpp' -o -name '*.h' \) | sort | xargs wc -l |
        awk -v limit=$limit -v tl=$trainer_limit '
          $2 == "total" { next }
          $2 ~ /\/trainer\.cpp$/ && $1 > tl { printf "%s: %d lines (at most %d: the trainer delegates)\n", $2, $1, tl; next }
          $1 > limit { printf "%s: %d lines (at most %d)\n", $2, $1, limit }')
if [[ -n $found ]]; then
  echo "FAIL: framework files over their bound (split them by job):"
  echo "$found"
  exit 1
fi
echo "every framework file is at most $limit lines, trainer.cpp at most $trainer_limit"
