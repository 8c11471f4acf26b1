#!/usr/bin/env python3
"""The FSDP blog's optimisation table, measured on fsdpx (a benchmark: it prints figures and
asserts nothing).

The blog fine-tunes T5 with FSDP and reports what each optimisation gives in throughput over an
untuned run, the memory each one frees reinvested in batch size. Here, on CPU ranks under a fixed
memory budget per rank (--budget-gib, 4 by default), for t5, gpt and
DeepViT (the blog's third model: vit with re-attention, on random images; its tokens are images):

  baseline                  fp32, full_shard, the model as one unit (--wrap.name root), no recompute
  mixed precision           the baseline with bf16_mixed
  activation checkpointing  the baseline with layer-type units (T5Block, Block) that recompute
  transformer wrapping      the baseline with layer-type units (T5Block, Block: gpt's, vit's)
  full_shard over zero2     layer-type units: full_shard against shard_grad_op

The blog's untuned run wraps the whole model as one FSDP unit: here the root wrap policy, every
parameter in the root's unit, gathered whole for forward and backward.

For each configuration the largest batch per rank that trains --steps steps within the budget is
found (doubling, then bisection), and the tokens/s of that run measured over its steps after the
first; then every configuration runs again at its batch in --rounds interleaved rounds and the
median of its runs is its tokens/s (the machine's other load falls on all alike); the factor is
its tokens/s over the baseline's (the last row: full_shard's over
shard_grad_op's). Every configuration runs in this one invocation, one
after the other, on the same machine.

The budget is enforced by a memory cgroup this script creates when it can (root and a writable
cgroup v1 or v2 memory controller; the limit is ranks x budget for the whole run, launcher
included, and counts everything a process touches: LibTorch's code, Gloo's buffers), else by
fsdpx's --max-memory-mib (the bytes LibTorch allocates on each rank, checked after every step).
The output says which; --no-cgroup chooses the second.

  python3 benchmarks/blog_table.py [--fsdpx-bin build] [--quick] [--models t5,gpt,deepvit] [--budget-gib 4]

--quick: smaller models, a 1 GiB budget, 3-step runs, a coarse search and 2 rounds (about 20
minutes on 2 busy cores).
"""
import argparse
import json
import os
import random
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "vs_fsdp2"))
import compare  # noqa: E402  (find_train, stop, REPO)
from memory import Budget  # noqa: E402  (a memory cgroup, created and removed)

GiB = 1 << 30
# The blog's factors for T5 3B on A100s (pytorch.org, "Maximizing training efficiency with FSDP").
BLOG = {"mixed precision": "5x", "activation checkpointing": "10x", "transformer wrapping": "2x",
        "full_shard over zero2": "1.5x"}

# Model flags: a size each that a 2-core machine trains a step of in seconds at small batches.
MODELS = {
    "t5": {"layer": "T5Block",
           "full": ["--model.name", "t5", "--model.size", "small"],
           "quick": ["--model.name", "t5", "--model.dim", "256", "--model.head_dim", "32", "--model.heads", "8",
                     "--model.ffn_hidden", "1024", "--model.layers", "4", "--model.vocab", "32128"]},
    "gpt": {"layer": "Block",
            "full": ["--model.name", "gpt", "--model.size", "small"],
            "quick": ["--model.name", "gpt", "--model.dim", "256", "--model.layers", "4", "--model.heads", "4",
                      "--model.vocab", "32000", "--model.seq", "128"]},
    # The blog's third model: DeepViT (vit with re-attention, vit-pytorch's layout) on random
    # 64x64 RGB images in 8x8 patches (65 tokens); its "tokens" are images.
    "deepvit": {"layer": "Block", "images": 64,
                "full": ["--model.name", "vit", "--model.reattention", "true", "--model.patch_norms", "true",
                         "--model.qkv_bias", "false", "--model.norm_eps", "1e-5", "--model.image", "64",
                         "--model.patch", "8", "--model.channels", "3", "--model.classes", "1000",
                         "--model.dim", "256", "--model.heads", "8", "--model.head_dim", "32", "--model.mlp", "512",
                         "--model.layers", "8"],
                "quick": ["--model.name", "vit", "--model.reattention", "true", "--model.image", "64",
                          "--model.patch", "8", "--model.channels", "3", "--model.classes", "1000",
                          "--model.dim", "128", "--model.heads", "4", "--model.layers", "4"]},
}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n", 2)[2])
    p.add_argument("--fsdpx-bin", default=os.path.join(compare.REPO, "build"), help="the fsdpx build directory")
    p.add_argument("--models", default="t5,gpt,deepvit")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--budget-gib", type=float, default=None, help="memory per rank (default 4; 1 with --quick)")
    p.add_argument("--seq", type=int, default=None, help="tokens per sequence (default 128; 64 with --quick)")
    p.add_argument("--steps", type=int, default=None, help="steps of each run (default 5; 3 with --quick)")
    p.add_argument("--max-batch", type=int, default=None, help="the search's ceiling (default 1024; 256 with --quick)")
    p.add_argument("--rounds", type=int, default=None,
                   help="interleaved runs of every configuration at its batch after the search (default 3; 2 quick)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--no-cgroup", action="store_true", help="the budget by --max-memory-mib, no cgroup")
    p.add_argument("--timeout", type=float, default=900, help="seconds allowed to each run")
    p.add_argument("--work", default="", help="keep every run's files here (default: a temporary directory)")
    p.add_argument("--json", default="", help="also write the figures as JSON to this file")
    a = p.parse_args()
    for name, full, quick in (("budget_gib", 4.0, 1.0), ("seq", 128, 64), ("steps", 5, 3), ("max_batch", 1024, 256),
                             ("rounds", 3, 2)):
        if getattr(a, name) is None:
            setattr(a, name, quick if a.quick else full)
    return a


def configurations(model):
    """(row, label, flags) in the order they run."""
    layer = MODELS[model]["layer"]
    units = ["--wrap.name", "layer_type", "--wrap.layer_types", layer]
    one_unit = ["--wrap.name", "root"]
    return [
        ("baseline", "fp32, full_shard, one unit", one_unit),
        ("mixed precision", "bf16_mixed, one unit", one_unit + ["--precision.name", "bf16_mixed"]),
        ("activation checkpointing", f"{layer} units, recomputed", units + ["--activation-checkpointing", layer]),
        ("transformer wrapping", f"{layer} units", units),
        ("zero2", f"{layer} units, shard_grad_op", units + ["--sharding.name", "shard_grad_op"]),
    ]


class Bench:
    def __init__(self, a):
        self.a = a
        self.train = compare.find_train(a.fsdpx_bin)
        self.env = dict(os.environ)
        # A memory cgroup of ranks x budget when one can be made here; else None (--max-memory-mib).
        self.cgroup = None if a.no_cgroup else Budget(a.budget_gib * GiB * a.nproc, a.nproc)
        if self.cgroup is not None and not self.cgroup.path:
            self.cgroup = None
        self.runs = 0

    def describe(self):
        if self.cgroup:
            return (f"{self.a.budget_gib:g} GiB per rank: a memory {self.cgroup.kind} of "
                    f"{self.a.nproc} x {self.a.budget_gib:g} GiB for the whole run (launcher included, RSS)")
        why = "--no-cgroup" if self.a.no_cgroup else "no writable memory cgroup here"
        return (f"{self.a.budget_gib:g} GiB per rank: fsdpx's --max-memory-mib (LibTorch's allocated bytes per rank; "
                f"{why})")

    def data(self, model):
        """The data flags: synthetic tokens, or for an image model a file of random images, enough
        for the search's largest global batch (written once)."""
        size = MODELS[model].get("images")
        if not size:
            return ["--data.name", "synthetic", "--data.seq", str(self.a.seq), "--data.vocab", "32000"]
        path = os.path.join(self.a.work, f"images-{size}.safetensors")
        if not os.path.exists(path):
            write_random_images(path, self.a.max_batch * self.a.nproc, size)
        return ["--data.name", "images", "--data.path", path]

    def command(self, model, flags, batch, steps, out):
        cmd = [self.train, "--nproc-per-node", str(self.a.nproc), *MODELS[model]["quick" if self.a.quick else "full"],
               *self.data(model), "--batch-size", str(batch), "--steps", str(steps), "--log-every", "1", "--eval-every", "0",
               "--optimizer.name", "adamw", "--out", out, *flags]
        if self.cgroup:
            cmd.append("--skip-memory-check")  # the cgroup decides what fits, not the plan
        else:
            cmd += ["--max-memory-mib", str(int(self.a.budget_gib * 1024))]
        return cmd

    def run(self, model, flags, batch, steps):
        """The run's metric lines, or None when it did not fit (killed, out of memory, over budget)."""
        self.runs += 1
        out = os.path.join(self.a.work, f"run{self.runs:04d}")
        log = out + ".log"
        with open(log, "w") as f:
            proc = subprocess.Popen(self.command(model, flags, batch, steps, out), stdout=f, stderr=subprocess.STDOUT,
                                    env=self.env, cwd=compare.REPO,
                                    preexec_fn=self.cgroup.preexec if self.cgroup else os.setsid)
            try:
                rc = proc.wait(timeout=self.a.timeout)
            except subprocess.TimeoutExpired:
                compare.stop(proc)
                rc = -1
                print(f"    batch {batch}: over the {self.a.timeout:g} s limit, counted as not fitting", flush=True)
        if rc != 0:
            return None
        with open(os.path.join(out, "metrics.jsonl")) as f:
            lines = [json.loads(x) for x in f if '"tokens_per_s"' in x]
        shutil.rmtree(out, ignore_errors=True)
        return lines

    def largest_batch(self, model, flags):
        """The largest batch per rank whose --steps steps fit, to within an eighth of it (a half
        with --quick: one bisection after the doubling), and that run's metric lines; (0, None)
        when batch 1 does not fit. The throughput is the fitting run's own: no second run that
        could land on the other side of the budget's edge."""
        best, lo, hi = None, 0, 1
        while hi <= self.a.max_batch:
            lines = self.run(model, flags, hi, self.a.steps)
            if lines is None:
                break
            best, lo, hi = lines, hi, hi * 2
        if hi > self.a.max_batch:
            return lo, best
        tolerance = max(1, lo // (2 if self.a.quick else 8))
        while hi - lo > tolerance:
            mid = (lo + hi) // 2
            lines = self.run(model, flags, mid, self.a.steps)
            if lines is not None:
                best, lo = lines, mid
            else:
                hi = mid
        return lo, best

    def measure(self, model, flags):
        t0 = time.time()
        batch, lines = self.largest_batch(model, flags)
        if batch == 0:
            return {"batch": 0, "tokens_per_s": 0.0, "seconds": time.time() - t0}
        rate = steady_rate(lines)
        peak = max(max(x["peak_memory_bytes"]) for x in lines)
        return {"batch": batch, "tokens_per_s": rate, "peak_allocated_bytes": peak, "seconds": time.time() - t0}


def write_random_images(path, n, size):
    """n random uint8 images [3, size, size] and labels of 1000 classes as a safetensors file (its
    header is JSON; written here so that any python3 runs this script)."""
    g = random.Random(0)
    pixels = g.randbytes(n * 3 * size * size)
    labels = struct.pack(f"<{n}q", *(g.randrange(1000) for _ in range(n)))
    header = json.dumps({"images": {"dtype": "U8", "shape": [n, 3, size, size], "data_offsets": [0, len(pixels)]},
                         "labels": {"dtype": "I64", "shape": [n],
                                    "data_offsets": [len(pixels), len(pixels) + len(labels)]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + pixels + labels)


def steady_rate(lines):
    """Mean tokens/s over a run's steps after the first (which pays for first-touch allocations)."""
    steady = lines[1:] or lines
    return sum(x["tokens_per_s"] for x in steady) / len(steady)


def interleave(bench, model, configs, rows):
    """--rounds more runs of every configuration at its largest batch, one configuration after the
    other in each round, so that a neighbour's load falls on all of them alike; each row's tokens/s
    becomes the median of its search run and these."""
    rates = {row: [r["tokens_per_s"]] for row, r in rows.items() if r["batch"] > 0}
    for i in range(bench.a.rounds):
        print(f"{model}: round {i + 1} of {bench.a.rounds} ...", flush=True)
        for row, _, flags in configs:
            if row in rates:
                lines = bench.run(model, flags, rows[row]["batch"], bench.a.steps)
                if lines is not None:  # at the budget's edge a run may not fit twice
                    rates[row].append(steady_rate(lines))
    for row, xs in rates.items():
        rows[row]["tokens_per_s"] = statistics.median(xs)
        rows[row]["samples"] = xs


def factor(x, base):
    return f"{x / base:.2f}x" if base > 0 and x > 0 else "-"


def report(model, rows):
    base = rows["baseline"]["tokens_per_s"]
    print(f"\n{model}: the blog's table on fsdpx")
    print(f"  {'optimisation':26} {'configuration':30} {'batch':>5} {'tokens/s':>8} {'runs (tokens/s)':>19} "
          f"{'peak MiB':>8} {'factor':>6} {'blog (T5 3B)':>12}")
    for row, r in rows.items():
        if row == "zero2":
            continue
        ref = rows["zero2"]["tokens_per_s"] if row == "full_shard over zero2" else base
        runs = "/".join(f"{x:.0f}" for x in r.get("samples", []))
        print(f"  {row:26} {r['label']:30} {r['batch']:5d} {r['tokens_per_s']:8.1f} {runs:>19} "
              f"{r.get('peak_allocated_bytes', 0) / 2**20:8.0f} {factor(r['tokens_per_s'], ref):>6} "
              f"{BLOG.get(row, ''):>12}")
    z = rows["zero2"]
    print(f"  (zero2 = {z['label']}: batch {z['batch']}, {z['tokens_per_s']:.1f} tokens/s; the last row's factor "
          f"is full_shard's tokens/s over it; tokens/s is the median of the runs beside it)")


def main():
    a = parse_args()
    tmp = None
    if not a.work:
        tmp = a.work = tempfile.mkdtemp(prefix="fsdpx-blog-table-")
    os.makedirs(a.work, exist_ok=True)
    bench = Bench(a)
    results = {}
    try:
        print(f"budget: {bench.describe()}; {a.nproc} ranks, seq {a.seq}, AdamW, synthetic tokens (deepvit: "
              f"random images){', --quick' if a.quick else ''}", flush=True)
        for model in a.models.split(","):
            rows, configs = {}, configurations(model)
            for row, label, flags in configs:
                print(f"{model}: {row} ({label}) ...", flush=True)
                rows[row] = dict(bench.measure(model, flags), label=label)
                r = rows[row]
                print(f"    largest batch {r['batch']}, {r['tokens_per_s']:.1f} tokens/s ({r['seconds']:.0f} s)",
                      flush=True)
            interleave(bench, model, configs, rows)
            # full_shard over zero2: the transformer-wrapped run, which is full_shard, against shard_grad_op.
            rows["full_shard over zero2"] = dict(rows["transformer wrapping"])
            results[model] = rows
            report(model, rows)
    finally:
        if bench.cgroup:
            bench.cgroup.close()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"budget": bench.describe(), "args": vars(a), "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
