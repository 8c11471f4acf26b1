#!/usr/bin/env bash
# Runs every fuzz target of a FSDPX_FUZZ build for SECONDS each on top of its seed corpus
# (tests/fuzz/corpus/<target>, read only; what the fuzzer finds new goes to a scratch corpus).
# A crash, a sanitizer report or an exception other than fsdpx::Error fails the run and leaves
# the input in the scratch directory; add it to the target's corpus with its fix.
#   tests/fuzz/run.sh BUILD_DIR [SECONDS]
set -euo pipefail
build=${1:?usage: run.sh BUILD_DIR [SECONDS]}
seconds=${2:-25}
here=$(cd "$(dirname "$0")" && pwd)
scratch=$(mktemp -d /tmp/fsdpx-fuzz.XXXXXX)
source "$here/../sanitize/env.sh"
status=0
for target in safetensors checkpoint_index dcp_folder hostlist config data_readers train_command; do
  bin="$build/tests/fuzz_$target"
  [[ -x $bin ]] || { echo "fuzz: $bin is missing (configure with -DFSDPX_FUZZ=ON; make fuzz does)" >&2; exit 2; }
  mkdir -p "$scratch/$target"
  log="$scratch/$target.log"
  if timeout $((seconds + 120)) "$bin" -max_total_time="$seconds" -print_final_stats=1 -timeout=20 -rss_limit_mb=4096 \
      -artifact_prefix="$scratch/$target-" "$scratch/$target" "$here/corpus/$target" >"$log" 2>&1; then
    execs=$(grep -m1 'stat::number_of_executed_units' "$log" | awk '{print $2}')
    cov=$(grep -Eo 'cov: [0-9]+' "$log" | tail -1)
    echo "fuzz_$target: ${execs:-?} executions in ${seconds} s, ${cov:-cov: ?}, $(ls "$scratch/$target" | wc -l) new inputs, no finding"
  else
    status=1
    echo "fuzz_$target: FINDING (log and input kept in $scratch):" >&2
    grep -E 'ERROR|SUMMARY|not an fsdpx::Error|runtime error|Test unit written' "$log" | head -8 >&2
  fi
done
[[ $status == 0 ]] && rm -rf "$scratch"
exit $status
