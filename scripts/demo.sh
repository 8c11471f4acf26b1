#!/usr/bin/env bash
# `make demo`: the plan, then a real training run of gpt tiny on Debian's fortunes corpus on 2 CPU
# ranks (full_shard, layer_type wrapping, bf16_mixed (fp32 on a CPU without native bf16),
# anyprecision_adamw, a sharded checkpoint at the end), its plot, and a check of its checkpoint.
# Uses the build in $1 (default build/).
set -euo pipefail
BUILD=${1:-build}
bin=$BUILD/bin
RUN=runs/demo
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

# bf16_mixed computes in bf16, which is fast only on CPUs with a native bf16 dot product; elsewhere
# its matmuls run about 100x slower than fp32, so the demo computes in fp32 there.
precision=()
if ! grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo 2>/dev/null; then
  precision=(--precision.name fp32)
fi

step "the plugins this build has"
"$bin/fsdpx-plugins" list

step "fsdpx-train --dry-run: what the run will hold and move, before anything is allocated"
if (( ${#precision[@]} )); then
  echo "this CPU has no native bf16 (no avx512_bf16 or amx_bf16 in /proc/cpuinfo): the demo computes in fp32 (${precision[*]})"
fi
"$bin/fsdpx-train" --config configs/demo.ini --nproc-per-node 2 --dry-run "${precision[@]}"

step "fsdpx-train: gpt tiny on 2 CPU ranks (configs/demo.ini)"
rm -rf "$RUN"
"$bin/fsdpx-train" --config configs/demo.ini --nproc-per-node 2 --out "$RUN" "${precision[@]}"

step "the plot and the checkpoint"
scripts/fsdpx-plot "$RUN"
"$bin/fsdpx-ckpt" verify "$RUN/checkpoints/step-00000300"

cat <<MSG

The run is in $RUN: metrics.jsonl (one JSON line per logged step and per checkpoint), config.ini (reproduces it),
summary.json (measured bytes next to the plan), plot.png, checkpoints/step-00000300.
Three things to try next:
  - resume and train further:  $bin/fsdpx-train --config $RUN/config.ini --nproc-per-node 2 --steps 600 --resume auto
  - a bigger model:            $bin/fsdpx-train --config configs/demo.ini --nproc-per-node 2 --model.size small --data.seq 128 --dry-run
  - Slurm, across nodes:       sbatch --nodes 2 --ntasks-per-node 2 hosts/slurm/fsdpx.sbatch --config configs/demo.ini  (docs/slurm-and-multinode.md)
MSG
