"""Draws a run's metrics.jsonl (fsdpx-train --out DIR) to DIR/plot.png: loss (and held-out loss)
against step, and throughput against step. Run it with scripts/fsdpx-plot DIR, which uses the
project's virtual environment (matplotlib is installed there by scripts/setup.sh)."""
import json
import os
import sys


def main(argv):
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        print("usage: fsdpx-plot RUN_DIR   (reads RUN_DIR/metrics.jsonl, writes RUN_DIR/plot.png)", file=sys.stderr)
        return 2
    run = argv[1]
    path = os.path.join(run, "metrics.jsonl")
    if not os.path.exists(path):
        print(f"fsdpx-plot: {path} does not exist; was the run started with --out {run}?", file=sys.stderr)
        return 1
    train, evals = [], []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                print(f"fsdpx-plot: {path}:{n} is not JSON ({e})", file=sys.stderr)
                return 1
            if "checkpoint_stall_s" in rec:  # a checkpoint's record, not a step's
                continue
            (evals if "eval_loss" in rec else train).append(rec)
    if not train:
        print(f"fsdpx-plot: {path} holds no training steps", file=sys.stderr)
        return 1
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in train]
    tokens = any(r["tokens_per_s"] != r["samples_per_s"] for r in train)
    rate = [r["tokens_per_s"] if tokens else r["samples_per_s"] for r in train]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.plot(steps, [r["loss"] for r in train], label="training loss (global batch)")
    if evals:
        a.plot([r["step"] for r in evals], [r["eval_loss"] for r in evals], "o", label="held-out loss")
    a.set_xlabel("step")
    a.set_ylabel("loss")
    a.legend()
    a.grid(alpha=0.3)
    b.plot(steps, rate, color="tab:green")
    b.set_xlabel("step")
    b.set_ylabel("tokens/s" if tokens else "samples/s")
    b.grid(alpha=0.3)
    fig.suptitle(os.path.abspath(run))
    fig.tight_layout()
    out = os.path.join(run, "plot.png")
    fig.savefig(out, dpi=100)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
