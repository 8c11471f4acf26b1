#!/usr/bin/env bash
# make test-sanitize: the tests of the instrumented build, under the sanitizer settings of env.sh,
# less those SKIP_LIST names (tests/sanitize/skip.txt; empty for none) and the EXTRA_SKIP regex;
# ONLY (a regex) picks a subset. A line of the list that names no test is refused, so the list
# cannot outlive a renamed test. FSDPX_SANITIZE_LIST_ONLY=1 lists the tests it would run instead.
# usage: run.sh BUILD_DIR JOBS SKIP_LIST [ONLY] [EXTRA_SKIP]
set -euo pipefail
usage="usage: run.sh BUILD_DIR JOBS SKIP_LIST [ONLY] [EXTRA_SKIP]"
build=${1:?$usage}
jobs=${2:?$usage}
list=${3-}
only=${4:-}
extra_skip=${5:-}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/env.sh"
if [[ -n $list && ! -f $list ]]; then
  echo "tests/sanitize/run.sh: the skip list '$list' is not a file (tests/sanitize/skip.txt, or empty for none)" >&2
  exit 1
fi

names=$(ctest --test-dir "$build" -N | sed -n 's/^ *Test *#[0-9]*: //p')
if [[ -z $names ]]; then
  echo "tests/sanitize/run.sh: ctest in $build lists no tests: build it first (make sanitize-build)" >&2
  exit 1
fi
patterns=()
line_number=0
[[ -n $list ]] && while IFS= read -r line; do
  line_number=$((line_number + 1))
  pattern=${line%%#*}
  pattern=${pattern#"${pattern%%[![:space:]]*}"}
  pattern=${pattern%"${pattern##*[![:space:]]}"}
  [[ -z $pattern ]] && continue
  if [[ $pattern == *[\(\)]* ]]; then
    echo "$list:$line_number: '$pattern' holds a parenthesis; ctest's regular expressions take at most 9 groups" \
         "and the lines are joined into one: write one line per case instead" >&2
    exit 1
  fi
  if ! grep -qE "^(${pattern})\$" <<<"$names"; then
    echo "$list:$line_number: '$pattern' names no test of $build; remove or correct it" >&2
    exit 1
  fi
  patterns+=("$pattern")
done <"$list"
skip=
if ((${#patterns[@]})); then
  skip=$(IFS='|'; echo "${patterns[*]}")
  skip="^(${skip})\$"
fi
[[ -n $extra_skip ]] && skip="${skip:+$skip|}${extra_skip}"

cd "$build"
args=(--output-on-failure -j "$jobs" --timeout 900)
[[ -n $skip ]] && args+=(-E "$skip")
[[ -n $only ]] && args+=(-R "$only")
ctest "${args[@]}" ${FSDPX_SANITIZE_LIST_ONLY:+-N}
