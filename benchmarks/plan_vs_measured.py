#!/usr/bin/env python3
"""The time model against the clock: predicted and measured step time, per phase, side by side.

Runs a spread of compositions on this machine's CPU (1, 2 and 4 ranks; gpt tiny, small and 1b
width with two layers; t5; each sharding strategy, hybrid, recompute, accumulation, bf16, the
optimizer inside backward, the root-only wrap, no overlap), each a few steps with --out, and reads
the prediction from the run's plan.json (time.phases_s: the plan every rank makes before its first
step) and the measurement from metrics.jsonl (step_breakdown_s: StepClock's phases per rank). A
step's measured time is the slowest rank's sum of its phases, the median over the steps after the
first two (first-touch allocations, the probes' caches); each phase's, the mean over ranks.

Usage: benchmarks/plan_vs_measured.py [--build build] [--only NAME,...] [--json FILE]
The summary's last lines: the median and largest |predicted/measured - 1| of the step, and how
many compositions fall within 10% and 25%.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

PHASES = ("forward", "backward", "all_gather_wait", "reduce_scatter_wait", "optimizer", "other")

SMALL = ["--model.name", "gpt", "--model.size", "small"]
TINY = ["--model.name", "gpt", "--model.size", "tiny"]
WIDE = ["--model.name", "gpt", "--model.size", "1b", "--model.layers", "2", "--model.seq", "128",
        "--data.name", "synthetic", "--data.seq", "128", "--batch-size", "2"]

T5 = ["--model.name", "t5", "--wrap.layer_types", "T5Block", "--data.name", "synthetic", "--data.seq", "64"]

# name, ranks, steps, arguments
COMPOSITIONS = [
    ("tiny 1 rank", 1, 30, TINY),
    ("tiny 2 ranks full_shard", 2, 30, TINY),
    ("tiny 4 ranks full_shard", 4, 30, TINY),
    ("small 1 rank", 1, 10, SMALL),
    ("small 2 ranks full_shard", 2, 10, SMALL),
    ("small 2 ranks shard_grad_op", 2, 10, SMALL + ["--sharding.name", "shard_grad_op"]),
    ("small 2 ranks no_shard", 2, 10, SMALL + ["--sharding.name", "no_shard"]),
    ("small 2 ranks root wrap", 2, 10, SMALL + ["--wrap.name", "root"]),
    ("small 2 ranks overlap 0", 2, 10, SMALL + ["--overlap", "0"]),
    ("small 2 ranks recompute", 2, 10, SMALL + ["--activation-checkpointing", "Block"]),
    ("small 2 ranks grad_accum 4", 2, 6, SMALL + ["--grad-accum", "4"]),
    ("small 2 ranks batch 16 seq 128", 2, 8, SMALL + ["--batch-size", "16", "--data.seq", "128"]),
    ("small 2 ranks bf16_mixed", 2, 10, SMALL + ["--precision.name", "bf16_mixed"]),
    ("small 2 ranks sgd", 2, 10, SMALL + ["--optimizer.name", "sgd"]),
    ("small 2 ranks optimizer in backward", 2, 10, SMALL + ["--optimizer-in-backward"]),
    ("small 2 ranks clip 1.0", 2, 10, SMALL + ["--clip-grad-norm", "1.0"]),
    ("small 4 ranks full_shard", 4, 8, SMALL),
    ("small 4 ranks hybrid 2x2", 4, 8, SMALL + ["--sharding.name", "hybrid_shard", "--sharding.shard_size", "2"]),
    ("small 4 ranks recompute", 4, 8, SMALL + ["--activation-checkpointing", "Block"]),
    ("1b width 2 layers 1 rank", 1, 4, WIDE),
    ("1b width 2 layers 2 ranks", 2, 4, WIDE),
    ("t5 tiny 2 ranks", 2, 20, T5 + ["--model.size", "tiny", "--data.vocab", "384"]),
    ("t5 small 2 ranks", 2, 6, T5 + ["--model.size", "small", "--data.vocab", "32000", "--batch-size", "2"]),
]


def run(build, name, ranks, steps, args, work):
    out = os.path.join(work, name.replace(" ", "_"))
    cmd = [os.path.join(build, "bin", "fsdpx-train"), "--nproc-per-node", str(ranks), "--steps", str(steps),
           "--log-every", "1", "--eval-every", "0", "--out", out] + args
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"{name}: fsdpx-train exited {r.returncode}:\n{r.stdout[-2000:]}")
    plan = json.load(open(os.path.join(out, "plan.json")))
    lines = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    steps_seen = [l["step_breakdown_s"] for l in lines if "step_breakdown_s" in l and l.get("step", 0) > 2]
    if not steps_seen:
        raise RuntimeError(f"{name}: metrics.jsonl has no step_breakdown_s after step 2")
    measured = {p: statistics.median(statistics.mean(r[p] for r in s) for s in steps_seen) for p in PHASES}
    measured_step = statistics.median(max(sum(r[p] for p in PHASES) for r in s) for s in steps_seen)
    return plan["time"], measured, measured_step


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--only", default="", help="comma-separated names (substrings) of compositions to run")
    ap.add_argument("--json", default="", help="write every composition's figures here")
    a = ap.parse_args()
    chosen = [c for c in COMPOSITIONS if not a.only or any(o in c[0] for o in a.only.split(","))]
    rows, errors = [], []
    with tempfile.TemporaryDirectory() as work:
        print(f"{'composition':36} {'predicted':>10} {'measured':>10} {'ratio':>6}  per phase predicted/measured ms "
              "(fwd, bwd, ag wait, rs wait, opt, other)  bound")
        for name, ranks, steps, args in chosen:
            try:
                time, measured, measured_step = run(a.build, name, ranks, steps, args, work)
            except (RuntimeError, subprocess.TimeoutExpired, OSError, KeyError, ValueError) as e:
                errors.append(str(e))
                print(f"{name:36} failed: {str(e).splitlines()[0]}")
                continue
            if not time.get("predicted"):
                print(f"{name:36} not predicted: {time.get('why')}")
                continue
            predicted = time["phases_s"]
            ratio = time["step_s"] / measured_step
            phases = ", ".join(f"{1e3 * predicted[p]:.1f}/{1e3 * measured[p]:.1f}" for p in PHASES)
            print(f"{name:36} {1e3 * time['step_s']:8.1f}ms {1e3 * measured_step:8.1f}ms {ratio:6.2f}  {phases}  "
                  f"{time['bound']}", flush=True)
            rows.append({"name": name, "ranks": ranks, "args": args, "predicted_step_s": time["step_s"],
                         "measured_step_s": measured_step, "ratio": ratio, "predicted": predicted,
                         "measured": measured, "bound": time["bound"]})
    if rows:
        errs = sorted(abs(r["ratio"] - 1) for r in rows)
        print(f"\n{len(rows)} compositions: median |predicted/measured - 1| {100 * statistics.median(errs):.1f}%, "
              f"largest {100 * errs[-1]:.1f}%; within 10%: {sum(e <= 0.10 for e in errs)}, "
              f"within 25%: {sum(e <= 0.25 for e in errs)}")
        for p in ("forward", "backward"):
            pe = [abs(r["predicted"][p] / r["measured"][p] - 1) for r in rows if r["measured"][p] > 0]
            print(f"  {p}: median |predicted/measured - 1| {100 * statistics.median(pe):.1f}%")
        exposed = [(r["predicted"]["all_gather_wait"] + r["predicted"]["reduce_scatter_wait"],
                    r["measured"]["all_gather_wait"] + r["measured"]["reduce_scatter_wait"]) for r in rows]
        print("  exposed communication (waits), predicted/measured ms: " +
              ", ".join(f"{1e3 * p:.1f}/{1e3 * m:.1f}" for p, m in exposed))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    for e in errors:
        print(e, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
