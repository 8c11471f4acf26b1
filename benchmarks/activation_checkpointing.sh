#!/usr/bin/env bash
# Activation checkpointing, measured side by side on 2 CPU ranks (gpt small, seq 128):
#   1. step time and the step's allocated peak (the counting allocator's, max over ranks), and the
#      peak RSS beside it, at batch 8 per rank, without and with recompute;
#   2. the largest batch per rank whose steps stay under a fixed budget of allocated bytes
#      (--max-memory-mib), without and with recompute: the freed memory reinvested in batch size.
# Usage: benchmarks/activation_checkpointing.sh [BUILD] [BUDGET_MIB]
set -euo pipefail
BUILD=${1:-build}
BUDGET=${2:-300}
train=$BUILD/bin/fsdpx-train
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--nproc-per-node 2 --model.size small --data.seq 128 --log-every 1 --eval-every 0 --peak-tflops 1)

field() { python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print(s$2)" "$1"; }

echo "== step time and step memory, batch 8 x 128 tokens per rank, 6 steps"
for ac in off on; do
  flags=(); [[ $ac == on ]] && flags=(--activation-checkpointing Block)
  "$train" "${common[@]}" --steps 6 --batch-size 8 "${flags[@]}" --out "$work/$ac" >/dev/null
  # the last step's figures: steady state (step 1 also pays for first-touch allocations)
  python3 - "$work/$ac" "$ac" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl") if '"step_peak_allocated_bytes"' in l]
last = lines[-1]
t = sum(l["step_time_s"] for l in lines[1:]) / (len(lines) - 1)
print(f"recompute {sys.argv[2]:3}: {t:.3f} s/step (steps 2-6), step peak {last['step_peak_allocated_bytes']/2**20:.1f} MiB "
      f"allocated, peak RSS {max(last['peak_rss_bytes'])/2**20:.0f} MiB")
open(sys.argv[1] + "/fig", "w").write(f"{t} {last['step_peak_allocated_bytes']}\n")
PY
done
read -r t_off m_off <"$work/off/fig"; read -r t_on m_on <"$work/on/fig"
python3 -c "print(f'with/without: step time x{$t_on/$t_off:.2f}, step peak x{$m_on/$m_off:.2f} ({$m_off/$m_on:.2f}x less)')"

echo "== the largest batch per rank under --max-memory-mib $BUDGET (allocated; 2 steps each)"
fits() {  # ac batch
  local flags=(); [[ $1 == on ]] && flags=(--activation-checkpointing Block)
  "$train" "${common[@]}" --steps 2 --batch-size "$2" --max-memory-mib "$BUDGET" "${flags[@]}" >/dev/null 2>&1
}
for ac in off on; do
  lo=0 hi=8
  while fits $ac $hi; do lo=$hi; hi=$((hi * 2)); ((hi <= 1024)) || break; done
  while ((hi - lo > 4)); do mid=$(((lo + hi) / 2)); if fits $ac $mid; then lo=$mid; else hi=$mid; fi; done
  echo "recompute $ac: largest batch that fits: $lo (to within 4; $hi does not)"
  echo "$lo" >"$work/largest-$ac"
done
python3 -c "print(f'batch with/without recompute: x{$(cat "$work/largest-on")/max(1,$(cat "$work/largest-off")):.2f}')"
