#!/usr/bin/env bash
# `make demo`: what fsdpx can do today, on the build in $1 (default build/).
# The training run on 2 CPU ranks joins this script when the engine and trainer land.
set -euo pipefail
BUILD=${1:-build}
bin=$BUILD/bin
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "fsdpx-plugins info: what this build is"
"$bin/fsdpx-plugins" info

step "fsdpx-plugins list: the installed plugins"
"$bin/fsdpx-plugins" list

step "fsdpx-plugins show size_based: a component's options"
"$bin/fsdpx-plugins" show size_based

step "fsdpx-plugins plan: the units layer_type makes of gpt tiny"
"$bin/fsdpx-plugins" plan --model.name gpt --wrap.name layer_type

step "fsdpx-plugins config: configs/demo.ini plus a command-line override, resolved"
"$bin/fsdpx-plugins" config --config configs/demo.ini --wrap.min_num_params 4096

step "a bad option gets one clear line and a non-zero exit"
if "$bin/fsdpx-plugins" config --config configs/demo.ini --wrap.min_params 4096; then
  echo "demo: expected an error" >&2; exit 1
fi

step "fsdpx-train --nproc-per-node 2 --check-comm: two ranks, rendezvous, the real Gloo"
"$bin/fsdpx-train" --nproc-per-node 2 --print-topology
"$bin/fsdpx-train" --nproc-per-node 2 --check-comm

cat <<MSG

Training itself (fsdpx-train on 2 CPU ranks) is not built yet: the sharding engine, the
strategies, the precision policies and the optimizers are in (see make test and make bench);
the trainer, the checkpoints and the data sources are the next pieces of work. Next to try now:
  - write a plugin of your own: sdk/README.md
  - $bin/fsdpx-train --nproc-per-node 4 --check-comm   (or under torchrun / srun: README)
  - $bin/fsdpx-engine-bench --nproc-per-node 2          (gpt small, overlap on vs off)
  - $bin/fsdpx-plugins help
MSG
