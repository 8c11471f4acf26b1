#!/usr/bin/env bash
# --deterministic against the normal mode, side by side on 2 CPU ranks: step time (steps 2-N),
# all-gather, reduce-scatter and all-to-all bytes, and bytes sent per step, for gpt tiny and gpt
# small at seq 64 and 8 samples per rank. Usage: benchmarks/deterministic.sh [BUILD] [STEPS]
set -euo pipefail
BUILD=${1:-build}
STEPS=${2:-6}
train=$BUILD/bin/fsdpx-train
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--nproc-per-node 2 --data.seq 64 --batch-size 8 --log-every 1 --eval-every 0 --peak-tflops 1 --steps "$STEPS")

for size in tiny small; do
  for mode in normal deterministic; do
    flags=(); [[ $mode == deterministic ]] && flags=(--deterministic)
    "$train" "${common[@]}" --model.size "$size" "${flags[@]}" --out "$work/$size-$mode" >/dev/null
  done
  python3 - "$work/$size-normal" "$work/$size-deterministic" "$size" <<'PY'
import json, sys
def figures(d):
    lines = [json.loads(l) for l in open(d + "/metrics.jsonl") if '"step_time_s"' in l]
    t = sum(l["step_time_s"] for l in lines[1:]) / (len(lines) - 1)
    last = lines[-1]
    moved = (last["allgather_bytes"], last["reduce_scatter_bytes"], last.get("all_to_all_bytes", 0))
    return t, moved, last["sent_bytes"], last["loss"]
n, d = figures(sys.argv[1]), figures(sys.argv[2])
for name, f in (("normal", n), ("deterministic", d)):
    ag, rs, a2a = (b / 2**20 for b in f[1])
    print(f"gpt {sys.argv[3]:5} {name:13}: {f[0]:.3f} s/step; MiB/step: all-gather {ag:.2f}, reduce-scatter {rs:.2f}, "
          f"all-to-all {a2a:.2f}; sends {f[2]/2**20:.2f} MiB/step; last loss {f[3]:.6f}")
print(f"gpt {sys.argv[3]:5} deterministic/normal: step time x{d[0]/n[0]:.2f}, bytes sent x{d[2]/n[2]:.2f}")
PY
done
