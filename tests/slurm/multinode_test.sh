#!/usr/bin/env bash
# fsdpx-train across two Slurm nodes on this machine: each slurmd in a network namespace of its
# own (tests/slurm/slurm_cluster.sh with FSDPX_SLURM_NODES=2), jobs submitted with the shipped
# hosts/slurm/fsdpx.sbatch, 2 nodes x 2 tasks:
#   1. the topology on every rank comes from Slurm's multi-node variables;
#   2. hybrid_shard (shard groups = the two ranks of a node) and full_shard train with the losses
#      of one process (within 1e-5), and the bytes that cross between the namespaces (node 1's
#      eth0 counters, 12 steps minus 2) are the replicate group's all-reduce, whose per-step bytes
#      are the plan's formula; full_shard sends several times more across;
#   3. a node dies mid-run (every process of its namespace SIGKILLed): the job ends within the
#      collective timeout, naming the lost ranks and their node; `--resume auto` on the two
#      nodes again continues with the bits of an uninterrupted run (--deterministic);
#   4. --requeue: the batch host's node dies; Slurm requeues the job, which resumes from its last
#      checkpoint by itself once the node is back, and ends with the same bits.
# If the namespaces or Slurm cannot start, this fails with the reason; it never passes silently.
# Usage: multinode_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1 build=$2
work=$build/tests/slurm-multinode
train=$build/bin/fsdpx-train
cluster=$src/tests/slurm/slurm_cluster.sh
fail() { echo "multinode_test: FAILED: $*" >&2; exit 1; }
say() { echo "multinode_test: $*"; }

while IFS= read -r v; do unset "$v"; done < <(compgen -e | grep '^SLURM_' || true)
rm -rf "$work"
mkdir -p "$work"
cleanup() { "$cluster" stop "$work/cluster" >/dev/null 2>&1 || true; }
trap cleanup EXIT
env_line=$(FSDPX_SLURM_NODES=2 timeout 300 "$cluster" start "$work/cluster") ||
  fail "the two-node Slurm cluster did not start (see above)"
eval "$env_line"
client() { local secs=$1; shift; timeout "$secs" "$cluster" exec "$work/cluster" "$@"; }
counter() { "$cluster" counters "$work/cluster" 1 | awk '{ print $1 + $2 }'; }  # node 1's eth0, both ways
cd "$work"

# sbatch of the shipped template on 2 nodes x 2 tasks; prints the job id. Output: fsdpx-ID.out.
submit() { FSDPX_TRAIN=$train client 30 sbatch --parsable --nodes 2 --ntasks-per-node 2 "$@"; }
job_state() { client 10 scontrol show job "$1" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2 || true; }
# Waits up to $2 s for job $1 to reach one of the states $3 (a regex); prints the state.
wait_state() {
  local deadline=$((SECONDS + $2)) s=""
  while ((SECONDS < deadline)); do
    s=$(job_state "$1")
    if [[ $s =~ ^($3)$ ]]; then echo "$s"; return 0; fi
    sleep 0.5
  done
  echo "${s:-unknown}"
  return 1
}
run_job() {  # a job to its end: COMPLETED, or fail with its output
  local job
  job=$(submit "$@") || fail "sbatch $*"
  wait_state "$job" 300 'COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL' >/dev/null || fail "job $job did not end in 300 s"
  [[ $(job_state "$job") == COMPLETED ]] || { cat "fsdpx-$job.out" >&2; fail "job $job ended $(job_state "$job"): sbatch $*"; }
  echo "$job"
}
losses() {  # step -> loss of a run directory, the last record of each step
  python3 - "$1" <<'PY'
import json, sys
steps = {}
for line in open(sys.argv[1] + "/metrics.jsonl"):
    m = json.loads(line)
    if "loss" in m: steps[m["step"]] = m["loss"]
print(" ".join(repr(steps[s]) for s in sorted(steps)))
PY
}

# 1. Topology from Slurm's variables, on both nodes.
job=$(run_job "$src/hosts/slurm/fsdpx.sbatch" --print-topology)
cat "fsdpx-$job.out"
grep -q "4 ranks on nodes fsdpx-n\[0-1\]" "fsdpx-$job.out" || fail "the job did not run on the two nodes"
for r in 0 1 2 3; do
  grep -q "topology rank=$r world_size=4 local_rank=$((r % 2)) local_world_size=2 node_rank=$((r / 2)) num_nodes=2 master=fsdpx-n0:[0-9]* source=slurm" \
    "fsdpx-$job.out" || fail "rank $r's topology is not rank $r of node $((r / 2)): $(cat "fsdpx-$job.out")"
done

# 2. Training across the nodes: the losses of one process; the bytes between the namespaces.
# Here and in 3, --data.holdout 0: no held-out evaluation after the last step (the --eval-every 0
# these runs had is the default, which still evaluates at the end; 3's deterministic runs spent
# most of their time on it).
common=(--data.seq 32 --log-every 1 --data.holdout 0 --peak-tflops 1 --rendezvous-timeout 60)
"$train" "${common[@]}" --batch-size 16 --steps 12 --out "$work/one" >/dev/null || fail "the one-process reference run"
declare -A crossed
for strategy in hybrid_shard full_shard; do
  for steps in 2 12; do
    before=$(counter)
    run_job "$src/hosts/slurm/fsdpx.sbatch" "${common[@]}" --batch-size 4 --sharding.name "$strategy" --steps "$steps" \
      --out "$work/$strategy-$steps" >/dev/null
    crossed[$strategy-$steps]=$(($(counter) - before))
  done
  python3 - "$work/one" "$work/$strategy-12" "$strategy" <<'PY' || fail "$strategy across 2 nodes: losses differ from one process"
import json, sys
def losses(d): return [json.loads(l)["loss"] for l in open(d + "/metrics.jsonl") if '"loss"' in l]
one, got = losses(sys.argv[1]), losses(sys.argv[2])
worst = max(abs(a - b) for a, b in zip(one, got))
print(f"{sys.argv[3]} on 2 nodes x 2: 12 losses, largest difference to one process {worst:.2e}")
sys.exit(0 if len(one) == len(got) == 12 and all(abs(a - b) <= 1e-6 + 1e-5 * abs(a) for a, b in zip(one, got)) else 1)
PY
done
python3 - "$work/hybrid_shard-12" "${crossed[hybrid_shard-12]}" "${crossed[hybrid_shard-2]}" \
  "${crossed[full_shard-12]}" "${crossed[full_shard-2]}" <<'PY' || fail "hybrid_shard's traffic between the nodes is not its all-reduce"
import json, sys
run, h12, h2, f12, f2 = sys.argv[1], *map(int, sys.argv[2:])
plan = json.load(open(run + "/plan.json"))
metrics = [json.loads(l) for l in open(run + "/metrics.jsonl") if '"loss"' in l]
# The replicate group's all-reduce per step and rank: every unit's gradient shard, in fp32.
formula = sum(u["shard_numel"] * 4 for u in plan["units"])
assert plan["replicate_group_size"] == 2 and plan["shard_group_size"] == 2, plan
assert plan["all_reduce_bytes"] == formula, (plan["all_reduce_bytes"], formula)
assert all(m["all_reduce_bytes"] == formula for m in metrics), [m["all_reduce_bytes"] for m in metrics]
# Each of node 1's two ranks sends 2(R-1)/R = 1 x its payload and receives as much: 10 steps.
expect = 10 * 2 * 2 * formula
hybrid, full = h12 - h2, f12 - f2
print(f"all-reduce per step and rank {formula} B (the formula); node 1's eth0 over 10 steps: hybrid_shard "
      f"{hybrid} B = {hybrid / expect:.3f} x the all-reduce's {expect} B; full_shard {full} B ({full / hybrid:.1f}x hybrid)")
sys.exit(0 if expect <= hybrid <= 1.15 * expect and full > 2 * hybrid else 1)
PY

# 3. A node dies mid-run; then --resume auto on both nodes again.
det=(--data.seq 32 --log-every 1 --data.holdout 0 --peak-tflops 1 --deterministic --steps 30
     --checkpoint.name sharded --save-every 4 --collective-timeout 10 --rendezvous-timeout 60)
"$train" "${det[@]}" --batch-size 12 --out "$work/uninterrupted" >/dev/null || fail "the uninterrupted reference run"
wait_checkpoint() {  # dir step: waits up to 180 s for that checkpoint to be complete
  local deadline=$((SECONDS + 180))
  until [[ -f $1/checkpoints/$(printf 'step-%08d' "$2")/index.json ]]; do
    ((SECONDS < deadline)) || fail "no checkpoint of step $2 in $1 after 180 s"
    sleep 0.2
  done
}
job=$(submit "$src/hosts/slurm/fsdpx.sbatch" "${det[@]}" --batch-size 3 --resume auto --out "$work/killed") || fail "sbatch (node death)"
wait_checkpoint "$work/killed" 8
t0=$(date +%s.%N)
"$cluster" node-down "$work/cluster" 1 || fail "node-down 1"
# fsdpx's part: the ranks of node 0 end, naming what was lost, within the collective timeout.
deadline=$((SECONDS + 60))
while [[ $("$cluster" procs "$work/cluster" 0) == *" fsdpx-train"* ]]; do  # (no grep -q: pipefail)
  ((SECONDS < deadline)) || fail "the ranks of node 0 still run 60 s after node 1's death"
  sleep 0.1
done
ranks_end=$(python3 -c "import sys, time; print(f'{time.time() - float(sys.argv[1]):.1f}')" "$t0")
# Slurm's part: the job ends when slurmctld declares the node lost (SlurmdTimeout=10 here):
# srun waits for the dead node's tasks until then.
state=$(wait_state "$job" 90 'FAILED|CANCELLED|NODE_FAIL|COMPLETED') || fail "the job did not end within 90 s of node 1's death (state $state)"
job_end=$(python3 -c "import sys, time; print(f'{time.time() - float(sys.argv[1]):.1f}')" "$t0")
cat "fsdpx-$job.out"
say "node 1 killed: the ranks of node 0 ended after $ranks_end s (collective timeout 10 s); Slurm ended the job ($state) after $job_end s"
python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) <= 10 else 1)" "$ranks_end" ||
  fail "the ranks of node 0 took $ranks_end s to end; the collective timeout is 10 s"
grep -Eq "ranks 2, 3 are gone .*node 1, host fsdpx-n1: ranks 2 pid [0-9]+, 3 pid [0-9]+" "fsdpx-$job.out" ||
  fail "the job's output does not name ranks 2 and 3 on node 1 (fsdpx-n1) as lost"
"$cluster" node-up "$work/cluster" 1 || fail "node-up 1"
run_job "$src/hosts/slurm/fsdpx.sbatch" "${det[@]}" --batch-size 3 --resume auto --out "$work/killed" >/dev/null
[[ $(losses "$work/killed") == "$(losses "$work/uninterrupted")" ]] ||
  fail "the resumed run's losses differ from the uninterrupted run's: $(losses "$work/killed") vs $(losses "$work/uninterrupted")"
say "resumed on 2 nodes: 30 losses bit-identical to an uninterrupted run"

# 4. Requeue: the node of the batch script dies; Slurm requeues the job, which resumes by itself.
# Slurm's log lines about job $1 (slurmctld and both slurmds) and any OOM kill, for a failure.
slurm_story() {
  local f
  for f in "$work"/cluster/log/slurmctld.log "$work"/cluster/log/slurmd-fsdpx-n*.log; do
    echo "--- $(basename "$f") (job $1)"
    grep -E "JobId=$1[^0-9]|job $1[^0-9]|StepId=$1\.|job0*$1/|\[$1\.|responding|returned to service|started on|abort|kill" "$f" | tail -40 || true
  done
  echo "--- slurmctld's queue of messages to resend (DebugFlags=Agent), when its content changed"
  grep "retry_list" "$work/cluster/log/slurmctld.log" | awk '{ m = $NF } m != last { print; last = m }' | tail -30 || true
  echo "--- kernel OOM kills"
  dmesg 2>/dev/null | grep -iE "out of memory|killed process" | tail -5 || true
}
requeue_run() {  # sets job and state: a --requeue job whose batch node (0) was killed, at its end
  rm -rf "$work/requeued"
  job=$(submit --requeue --open-mode=append "$src/hosts/slurm/fsdpx.sbatch" "${det[@]}" --batch-size 3 --resume auto \
          --out "$work/requeued") || fail "sbatch --requeue"
  wait_checkpoint "$work/requeued" 8
  "$cluster" node-down "$work/cluster" 0 || fail "node-down 0"
  state=$(wait_state "$job" 90 'PENDING|REQUEUED|REQUEUE_HOLD') || {
    slurm_story "$job" >&2; fail "Slurm did not requeue the job within 90 s of node 0's death (state $state)"; }
  say "node 0 killed: Slurm requeued job $job ($state)"
  "$cluster" node-up "$work/cluster" 0 || fail "node-up 0"
  state=$(wait_state "$job" 300 'COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL') || state="still $state after 300 s"
  cat "fsdpx-$job.out"
}
last_attempt() { sed -n '/^fsdpx.sbatch: job/h; /^fsdpx.sbatch: job/!H; ${x;p}' "fsdpx-$1.out"; }
requeue_run
# Once seen in CI: slurmd SIGKILLed the restarted step ("STEP N.0 ON fsdpx-n0 CANCELLED AT",
# tasks "Killed") while fsdpx printed no error. Most likely a kill of the first attempt that
# slurmctld could not deliver to the dead node and resent 60 s later with only the job and step
# ids; slurm_cluster.sh now delays a requeued job's start past that (cred_expire=75) and logs the
# retries (DebugFlags=Agent). Should it happen again, the run is shown with Slurm's log lines and
# tried once more; any other failure, or a second one, fails the test.
attempt=$(last_attempt "$job")
if [[ $state != COMPLETED && $attempt != *$'\n'"fsdpx: "* && $attempt == *"STEP $job.0 ON fsdpx-n"?" CANCELLED AT"* ]]; then
  slurm_story "$job"
  say "Slurm killed the restarted step of job $job (state $state) with no error from fsdpx; once more"
  requeue_run
fi
if [[ $state != COMPLETED ]]; then slurm_story "$job" >&2; fail "the requeued job ended $state"; fi
grep -q "resumed from .*requeued/checkpoints/step-000000" "fsdpx-$job.out" || fail "the requeued job did not resume from a checkpoint"
[[ $(client 10 scontrol show job "$job") == *"Restarts=1 "* ]] || fail "Slurm does not count the restart"
[[ $(losses "$work/requeued") == "$(losses "$work/uninterrupted")" ]] ||
  fail "the requeued run's losses differ from the uninterrupted run's"
say "requeued after node 0's death, resumed by itself: 30 losses bit-identical to an uninterrupted run"
say "passed"
