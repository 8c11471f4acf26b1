#!/usr/bin/env bash
# fsdpx-train under a real Slurm (a one-node cluster on loopback, tests/slurm/slurm_cluster.sh):
#   1. `srun -n 2 fsdpx-train --print-topology` gives the same topology as the local launcher;
#   2. `srun -n 2 fsdpx-train --check-comm` passes (rendezvous from Slurm's variables alone);
#   3. `sbatch --wait` of the shipped template hosts/slurm/fsdpx.sbatch passes the same check;
#   4. `srun -n 2 fsdpx-train` trains (the demo's configuration, 20 steps) and the loss falls.
# If Slurm cannot start here, this fails with the reason; it never passes silently.
# Usage: slurm_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1 build=$2
work=$build/tests/slurm-work
train=$build/bin/fsdpx-train
fail() { echo "slurm_test: FAILED: $*" >&2; exit 1; }

# An outer allocation's variables would make srun join that job instead.
while IFS= read -r v; do unset "$v"; done < <(compgen -e | grep '^SLURM_' || true)

rm -rf "$work"
mkdir -p "$work"
cleanup() { "$src/tests/slurm/slurm_cluster.sh" stop "$work" >/dev/null 2>&1 || true; }
trap cleanup EXIT
env_line=$(timeout 300 "$src/tests/slurm/slurm_cluster.sh" start "$work") || fail "the Slurm cluster did not start (see above)"
eval "$env_line"

topo() { grep -o 'rank=[0-9]* world_size=[0-9]* local_rank=[0-9]* local_world_size=[0-9]* node_rank=[0-9]* num_nodes=[0-9]*' | sort; }

# 1. Topology: srun vs the local launcher.
srun_topo=$(timeout 60 srun -n 2 "$train" --print-topology) || fail "srun -n 2 fsdpx-train --print-topology"
launcher_topo=$(timeout 60 "$train" --nproc-per-node 2 --print-topology) || fail "fsdpx-train --nproc-per-node 2 --print-topology"
echo "$srun_topo"
grep -q 'source=slurm' <<<"$srun_topo" || fail "fsdpx-train did not take its topology from Slurm: $srun_topo"
[[ "$(topo <<<"$srun_topo")" == "$(topo <<<"$launcher_topo")" ]] ||
  fail "topology differs: srun gave [$(topo <<<"$srun_topo")], the launcher [$(topo <<<"$launcher_topo")]"

# 2. A communication check under srun.
out=$(timeout 120 srun -n 2 "$train" --check-comm --rendezvous-timeout 60 2>&1) || fail "srun -n 2 fsdpx-train --check-comm: $out"
echo "$out"
grep -q 'communication check passed on 2 ranks (gloo)' <<<"$out" || fail "no passing check in: $out"

# 3. The shipped batch template, as a user submits it (CPU variant).
cd "$work"
job=$(FSDPX_TRAIN=$train timeout 30 sbatch --parsable --ntasks=2 --wait "$src/hosts/slurm/fsdpx.sbatch" \
        --device cpu --check-comm --rendezvous-timeout 60) || {
  cat "$work"/fsdpx-*.out 2>/dev/null || true
  fail "sbatch --wait hosts/slurm/fsdpx.sbatch --device cpu --check-comm did not succeed"
}
cat "$work/fsdpx-$job.out"
grep -q 'communication check passed on 2 ranks (gloo)' "$work/fsdpx-$job.out" ||
  fail "the batch job's output has no passing check"
# 4. Training under srun: the demo's configuration, shortened.
out=$(timeout 240 srun -n 2 "$train" --config "$src/configs/demo.ini" --steps 20 --warmup-steps 2 --log-every 10 \
        --eval-every 0 --out "$work/run" --rendezvous-timeout 60 2>&1) || fail "srun -n 2 fsdpx-train (training): $out"
echo "$out"
grep -q 'done: 20 steps' <<<"$out" || fail "the training run under srun did not finish: $out"
[[ -s $work/run/metrics.jsonl && -f $work/run/checkpoints/step-00000020/index.json ]] ||
  fail "the run under srun left no metrics or checkpoint in $work/run"
echo "slurm_test: srun and sbatch runs passed"
