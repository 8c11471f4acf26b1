"""The library's step against fsdpx-train's: the gpt model plugin trained through fsdpx::fully_shard
in a plain loop (fsdpx-library-bench) and by fsdpx-train, on the same model, synthetic data, seed,
plugins and ranks, in alternating rounds (machine noise hits both alike). Prints, per
configuration, each side's median step time (the first steps of each run left out), their ratio,
and the largest difference of their losses (the mean over the ranks; 0 when both ran the same
computation). A configuration whose optimizer is torch-adamw runs the library's loop twice per
round, with torch::optim::AdamW over the module's parameters (this rank's shards) and
loss.backward(), and with the adamw plugin, beside fsdpx-train with the adamw plugin, and prints
torch::optim's step time against the plugin's.

usage: library_vs_train.py [--build build] [--configs tiny:full_shard:adamw,small:full_shard:adamw,...]
                           [--nproc 2] [--rounds 3] [--steps 12] [--batch-size 8]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

SEQ = {"tiny": 64, "small": 128}  # the presets' contexts


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default="build", help="the build directory (bin/fsdpx-train, bin/fsdpx-library-bench)")
    p.add_argument("--configs", default="tiny:full_shard:adamw,small:full_shard:adamw,small:shard_grad_op:adamw,"
                                        "small:full_shard:torch-adamw",
                   help="comma-separated SIZE:SHARDING:OPTIMIZER")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--skip", type=int, default=2, help="first steps of each run left out of the times")
    p.add_argument("--batch-size", type=int, default=8)
    a = p.parse_args()
    if a.steps <= a.skip:
        p.error(f"--steps {a.steps} leaves no step after the {a.skip} left out")
    return a


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        sys.exit(f"exit status {p.returncode}: {' '.join(cmd)}\n{p.stderr[-3000:]}")


def library_side(a, size, sharding, optimizer, out):
    run([os.path.join(a.build, "bin", "fsdpx-library-bench"), "--nproc-per-node", str(a.nproc), "--size", size,
         "--seq", str(SEQ[size]), "--batch-size", str(a.batch_size), "--steps", str(a.steps),
         "--sharding", sharding, "--optimizer", optimizer, "--out", out])
    ranks = [[json.loads(l) for l in open(f"{out}.rank{r}")] for r in range(a.nproc)]
    times = [max(r[s]["step_time_s"] for r in ranks) for s in range(a.steps)]  # the slowest rank's
    losses = [statistics.fmean(r[s]["loss"] for r in ranks) for s in range(a.steps)]
    return times, losses


def train_side(a, size, sharding, optimizer, out):
    run([os.path.join(a.build, "bin", "fsdpx-train"), "--nproc-per-node", str(a.nproc), "--model.name", "gpt",
         "--model.size", size, "--model.seq", str(SEQ[size]), "--data.name", "synthetic", "--data.seq", str(SEQ[size]),
         "--sharding.name", sharding, "--wrap.layer_types", "Block", "--optimizer.name", optimizer,
         "--steps", str(a.steps), "--batch-size", str(a.batch_size), "--log-every", "1",
         "--checkpoint.name", "none", "--out", out])
    rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    rows = {r["step"]: r for r in rows if "step" in r and "loss" in r}
    return [rows[s]["step_time_s"] for s in range(1, a.steps + 1)], [rows[s]["loss"] for s in range(1, a.steps + 1)]


def main():
    a = parse_args()
    print(f"{'configuration':<36} {'library ms':>11} {'fsdpx-train ms':>15} {'ratio':>6} {'max |loss diff|':>16}")
    worst = 0.0
    with tempfile.TemporaryDirectory() as work:
        for cfg in a.configs.split(","):
            size, sharding, optimizer = cfg.split(":")
            lib, train, plugin, diff = [], [], [], 0.0
            torch_optim = optimizer == "torch-adamw"
            plugin_optimizer = "adamw" if torch_optim else optimizer
            for r in range(a.rounds):
                base = os.path.join(work, f"{cfg.replace(':', '-')}-r{r}")
                lt, ll = library_side(a, size, sharding, optimizer, base + "-library")
                if torch_optim:
                    pt, _ = library_side(a, size, sharding, plugin_optimizer, base + "-plugin")
                    plugin.append(statistics.median(pt[a.skip:]))
                tt, tl = train_side(a, size, sharding, plugin_optimizer, base + "-train")
                lib.append(statistics.median(lt[a.skip:]))
                train.append(statistics.median(tt[a.skip:]))
                diff = max(diff, max(abs(x - y) for x, y in zip(ll, tl)))
            ratio = statistics.median(lib) / statistics.median(train)
            if not torch_optim:
                worst = max(worst, ratio)
            print(f"{cfg + f' ({a.nproc} ranks)':<36} {statistics.median(lib) * 1e3:>11.2f} "
                  f"{statistics.median(train) * 1e3:>15.2f} {ratio:>6.3f} {diff:>16.2e}")
            if torch_optim:
                print(f"  torch::optim::AdamW over the shards / the adamw plugin, both through the library: "
                      f"{statistics.median(lib) / statistics.median(plugin):.3f} "
                      f"({statistics.median(lib) * 1e3:.2f} / {statistics.median(plugin) * 1e3:.2f} ms)")
    print(f"library / fsdpx-train step time, worst configuration: {worst:.3f}x "
          f"(medians of {a.rounds} alternating rounds of {a.steps} steps, the first {a.skip} left out)")


if __name__ == "__main__":
    main()
