#!/usr/bin/env python3
"""fsdpx against PyTorch FSDP2, side by side: the same gpt, weights, data order and optimizer.

For each configuration SIZE:SHARDING:PRECISION:OPTIMIZER (e.g. tiny:full_shard:fp32:sgd):
  1. a tokens file (given with --data, or made from Debian's fortunes as bytes in uint16);
  2. fsdpx-train once per model size with --save-init: the initial weights, whole tensors under
     fsdpx's names, that both sides then start from (fsdpx with --init-from);
  3. --rounds rounds, each running fsdpx, then FSDP2 (gpt_fsdp2.py under torchrun), then fsdpx at
     one rank with the same per-rank batch (the compute floor: the same work without
     communication), interleaved so that a slow spell of the machine hits all of them;
  4. per step: both losses and their difference, step times and peak RSS; then the ratios
     fsdpx/FSDP2 of the step time (median over rounds of each run's median step time, step 1
     left out) and of peak memory, the bytes each side moved per step, and fsdpx's distance
     from the floor.

Exits 1 when --parity TOL is given and some step's |loss difference| exceeds it, 2 when a run
fails. Every run has a time limit (--timeout).
"""
import argparse
import array
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DEFAULT_PYTHON = os.path.join(os.environ.get("FSDPX_VENV") or os.path.join(
    os.environ.get("FSDPX_CACHE_DIR", os.path.expanduser("~/.cache/fsdpx")), "venv-torch-2.11.0"), "bin", "python")
SIZES = ["tiny", "small"]
SHARDINGS = ["full_shard", "shard_grad_op", "no_shard"]
PRECISIONS = ["fp32", "bf16_mixed"]
# float8: fsdpx's against FSDP2 with torchao's float8 linears (the venv's torchao); float8_all_gather:
# the same with the Blocks' linear weights all-gathered in float8 on both sides; by --configs only
EXTRA_PRECISIONS = ["float8", "float8_all_gather"]
OPTIMIZERS = ["sgd", "adamw"]
FULL = [f"{s}:{sh}:{p}:{o}" for s in SIZES for sh in SHARDINGS for p in PRECISIONS for o in OPTIMIZERS]
QUICK = ["tiny:full_shard:fp32:sgd", "tiny:shard_grad_op:fp32:adamw", "tiny:no_shard:fp32:sgd",
         "tiny:full_shard:bf16_mixed:adamw"]
CONTEXT = {"tiny": 64, "small": 128}  # the presets' context length (plugins/model/gpt/gpt.cpp)
# fsdpx's layer types with gpt's embedding and output projection as units of their own (torchtitan's wrapping)
EMBEDDING_UNITS = "Block,Embedding,Output"


class RunFailed(Exception):
    pass


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n", 2)[2])
    p.add_argument("--fsdpx-bin", default=os.path.join(REPO, "build"),
                   help="the fsdpx build directory (holding bin/fsdpx-train) or the directory of fsdpx-train")
    p.add_argument("--python", default=DEFAULT_PYTHON, help="a Python with torch 2.11 and safetensors")
    p.add_argument("--configs", default="", help="comma-separated SIZE:SHARDING:PRECISION:OPTIMIZER "
                   f"(default: the full matrix of {len(FULL)}: {','.join(SIZES)} x {','.join(SHARDINGS)} x "
                   f"{','.join(PRECISIONS)} x {','.join(OPTIMIZERS)})")
    p.add_argument("--quick", action="store_true", help="only " + ",".join(QUICK))
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--nproc", type=int, default=2, help="ranks of the compared runs")
    p.add_argument("--batch-size", type=int, default=8, help="samples per rank")
    p.add_argument("--seq", type=int, default=0, help="tokens per sample (0: the model's context, 64 tiny, 128 small)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=None, help="default: the optimizer's fsdpx default (sgd 1e-2, adamw 1e-3)")
    p.add_argument("--data", default="", help="a uint16 tokens file (default: made from /usr/share/games/fortunes)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of every rank")
    p.add_argument("--parity", type=float, default=None, metavar="TOL",
                   help="exit 1 when any step's |fsdpx loss - FSDP2 loss| exceeds TOL")
    p.add_argument("--embedding-units", action="store_true",
                   help="the embedding and the output projection are units of their own on both sides, as torchtitan "
                        "shards them (fsdpx --wrap.layer_types Block,Embedding,Output; the mirror's --embedding-units)")
    p.add_argument("--activation-checkpointing", action="store_true",
                   help="every Block recomputes its forward in backward on both sides (fsdpx "
                        "--activation-checkpointing Block; the mirror's --activation-checkpointing)")
    p.add_argument("--root-only", action="store_true",
                   help="no unit but the root on both sides, FSDP's default (fsdpx --wrap.name root; the mirror's "
                        "fully_shard on the model alone)")
    p.add_argument("--no-floor", action="store_true", help="skip the 1-rank fsdpx runs")
    p.add_argument("--timeout", type=float, default=600, help="seconds allowed to each run")
    p.add_argument("--work", default="", help="keep every run's files here (default: a temporary directory, removed)")
    p.add_argument("--json", default="", help="also write the results as JSON to this file")
    a = p.parse_args()
    a.configs = [c for c in a.configs.split(",") if c] if a.configs else (QUICK if a.quick else FULL)
    for c in a.configs:
        parts = c.split(":")
        if (len(parts) != 4 or parts[0] not in SIZES or parts[1] not in SHARDINGS
                or parts[2] not in PRECISIONS + EXTRA_PRECISIONS or parts[3] not in OPTIMIZERS):
            p.error(f"configuration '{c}' is not SIZE:SHARDING:PRECISION:OPTIMIZER with SIZE in {SIZES}, SHARDING in "
                    f"{SHARDINGS}, PRECISION in {PRECISIONS + EXTRA_PRECISIONS}, OPTIMIZER in {OPTIMIZERS}")
    if a.root_only and (a.embedding_units or a.activation_checkpointing):
        p.error("--root-only makes no unit but the root: drop --embedding-units and --activation-checkpointing")
    if a.steps < 2:
        p.error("--steps must be at least 2 (step 1 is left out of the timings)")
    if a.rounds < 1:
        p.error("--rounds must be at least 1")
    return a


def find_train(bin_dir):
    for c in (os.path.join(bin_dir, "bin", "fsdpx-train"), os.path.join(bin_dir, "fsdpx-train")):
        if os.access(c, os.X_OK):
            return c
    raise SystemExit(f"no fsdpx-train under {bin_dir} (looked in bin/ and the directory itself); build it or give --fsdpx-bin")


def make_tokens(path):
    """Debian's fortunes (the text files, as fsdpx's text source reads them) as uint16 bytes; a
    seeded random byte stream when they are not installed."""
    src = "/usr/share/games/fortunes"
    data = bytearray()
    if os.path.isdir(src):
        for name in sorted(os.listdir(src)):
            f = os.path.join(src, name)
            if os.path.isfile(f) and not os.path.islink(f) and not name.endswith(".dat"):
                with open(f, "rb") as fh:
                    data += fh.read()
    what = f"the bytes of {src}"
    if len(data) < 1 << 20:
        rng = random.Random(0)
        data = bytearray(rng.randrange(256) for _ in range(1 << 20))
        what = "1 MiB of seeded random bytes (no fortunes installed)"
    tokens = array.array("H")
    tokens.extend(data)
    with open(path, "wb") as fh:
        fh.write(tokens.tobytes())
    print(f"tokens: {path}: {len(tokens)} uint16 ids, {what}")
    return path


def stop(proc):
    """SIGTERM to the run's process group (fsdpx's launcher and torchrun pass it to their
    workers), SIGKILL after 10 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def run(cmd, log, timeout, env):
    """Runs cmd in its own process group (killed whole at the time limit), output to `log`."""
    t0 = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop(proc)
            raise RunFailed(f"timed out after {timeout:.0f} s: {' '.join(cmd)} (log: {log})")
        except BaseException:  # Ctrl-C: the run's own process group does not get it from the terminal
            stop(proc)
            raise
    if rc != 0:
        with open(log) as fh:
            tail = "".join(fh.readlines()[-15:])
        raise RunFailed(f"exit status {rc}: {' '.join(cmd)}\n--- last lines of {log}:\n{tail}")
    return time.perf_counter() - t0


def read_steps(path, steps):
    rows = {}
    with open(path) as fh:
        for line in fh:
            m = json.loads(line)
            if "step" in m and "loss" in m:
                rows[m["step"]] = m
    missing = [s for s in range(1, steps + 1) if s not in rows]
    if missing:
        raise RunFailed(f"{path} has no line for step(s) {missing}")
    return [rows[s] for s in range(1, steps + 1)]


class Bench:
    def __init__(self, a, train):
        self.a = a
        self.train = train
        self.torchrun = [a.python, "-m", "torch.distributed.run"]
        self.env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
        self.inits = {}

    def seq(self, size):
        return self.a.seq or CONTEXT[size]

    def fsdpx_cmd(self, cfg, nproc, out, extra):
        size, sharding, precision, optimizer = cfg.split(":")
        a = self.a
        wrap = (["--wrap.name", "root"] if a.root_only else
                ["--wrap.name", "layer_type", "--wrap.layer_types", EMBEDDING_UNITS if a.embedding_units else "Block"])
        cmd = [self.train, "--nproc-per-node", str(nproc), "--device", a.device,
               "--model.name", "gpt", "--model.size", size,
               "--data.name", "tokens", "--data.path", a.data, "--data.dtype", "uint16", "--data.seq", str(self.seq(size)),
               "--sharding.name", sharding] + wrap + [
               "--precision.name", precision.replace("_all_gather", ""), "--optimizer.name", optimizer,
               "--steps", str(a.steps), "--batch-size", str(a.batch_size), "--seed", str(a.seed),
               "--log-every", "1", "--peak-tflops", "1", "--out", out] + extra
        if a.activation_checkpointing:
            cmd += ["--activation-checkpointing", "Block"]
        if precision == "float8_all_gather":
            cmd += ["--precision.float8_all_gather", "true"]
        if a.lr is not None:
            cmd += ["--optimizer.lr", repr(a.lr)]
        return cmd

    def fsdp2_cmd(self, cfg, init, out):
        size, sharding, precision, optimizer = cfg.split(":")
        a = self.a
        cmd = self.torchrun + ["--standalone", "--nproc-per-node", str(a.nproc), os.path.join(HERE, "gpt_fsdp2.py"),
                               "--size", size, "--data", a.data, "--seq", str(self.seq(size)),
                               "--batch-size", str(a.batch_size), "--steps", str(a.steps), "--seed", str(a.seed),
                               "--sharding", sharding, "--precision", precision.replace("_all_gather", ""),
                               "--optimizer", optimizer,
                               "--init-from", init, "--device", a.device, "--out", out, "--quiet"]
        if precision == "float8_all_gather":
            cmd.append("--float8-all-gather")
        if a.embedding_units:
            cmd.append("--embedding-units")
        if a.root_only:
            cmd.append("--root-only")
        if a.activation_checkpointing:
            cmd.append("--activation-checkpointing")
        if a.lr is not None:
            cmd += ["--lr", repr(a.lr)]
        return cmd

    def init_for(self, size):
        """fsdpx's initial weights for this size, written once by a 1-step run with --save-init."""
        if size not in self.inits:
            d = os.path.join(self.a.work, f"init-{size}")
            cfg = f"{size}:full_shard:fp32:sgd"
            # The run directory beside DIR, not inside it: fsdpx-train writes DIR whole (into a
            # temporary directory renamed to DIR), which would take away a run directory in it.
            cmd = self.fsdpx_cmd(cfg, self.a.nproc, d + "-run", ["--save-init", d])
            cmd[cmd.index("--steps") + 1] = "1"
            run(cmd, os.path.join(self.a.work, f"init-{size}.log"), self.a.timeout, self.env)
            path = os.path.join(d, "model.safetensors")
            if not os.path.isfile(path):
                raise RunFailed(f"fsdpx-train --save-init {d} left no {path}")
            self.inits[size] = path
        return self.inits[size]

    def config(self, cfg):
        a = self.a
        name = cfg.replace(":", "-")
        init = self.init_for(cfg.split(":")[0])
        rounds = []
        for r in range(a.rounds):
            base = os.path.join(a.work, f"{name}-r{r + 1}")
            fx_dir, fl_dir, f2 = base + "-fsdpx", base + "-floor", base + "-fsdp2.jsonl"
            for d in (fx_dir, fl_dir):
                shutil.rmtree(d, ignore_errors=True)
            one = {}
            run(self.fsdpx_cmd(cfg, a.nproc, fx_dir, ["--init-from", init]), fx_dir + ".log", a.timeout, self.env)
            one["fsdpx"] = read_steps(os.path.join(fx_dir, "metrics.jsonl"), a.steps)
            run(self.fsdp2_cmd(cfg, init, f2), base + "-fsdp2.log", a.timeout, self.env)
            one["fsdp2"] = read_steps(f2, a.steps)
            if not a.no_floor:
                run(self.fsdpx_cmd(cfg, 1, fl_dir, ["--init-from", init]), fl_dir + ".log", a.timeout, self.env)
                one["floor"] = read_steps(os.path.join(fl_dir, "metrics.jsonl"), a.steps)
            rounds.append(one)
        return summarise(cfg, rounds, a)


def median_step_time(steps):
    return statistics.median(s["step_time_s"] for s in steps[1:])


PHASES = ("forward", "backward", "all_gather_wait", "reduce_scatter_wait", "optimizer", "other")


def breakdown(steps):
    """Each phase's seconds per step (step_breakdown_s, the same definition on both sides: fsdpx's
    framework/runtime/src/step_clock.cpp and the mirror's StepClock), the mean over ranks, the median
    over the steps after the first; None when the lines have none."""
    lines = [s["step_breakdown_s"] for s in steps[1:] if s.get("step_breakdown_s")]
    if not lines:
        return None
    return {p: statistics.median(sum(r[p] for r in line) / len(line) for line in lines) for p in PHASES}


def rss_per_rank(step):
    """Each rank's peak RSS in a metrics line: fsdpx's peak_rss_bytes (its peak_memory_bytes are
    allocated bytes), the mirror's peak_memory_bytes (RSS)."""
    return step["peak_rss_bytes"] if isinstance(step.get("peak_rss_bytes"), list) else step["peak_memory_bytes"]


def peak_rss(steps):
    return max(max(rss_per_rank(s)) for s in steps)


def step_rise(steps):
    return max(s.get("step_rss_rise_bytes", -1) for s in steps)


def summarise(cfg, rounds, a):
    sides = ["fsdpx", "fsdp2"] + ([] if a.no_floor else ["floor"])
    # Losses: the runs are deterministic, so every round should give the same; the difference is
    # taken over every round.
    per_step = []
    for i in range(a.steps):
        fx = [r["fsdpx"][i]["loss"] for r in rounds]
        f2 = [r["fsdp2"][i]["loss"] for r in rounds]
        per_step.append({
            "step": i + 1, "fsdpx_loss": fx[0], "fsdp2_loss": f2[0],
            "abs_diff": max(abs(x - y) for x in fx for y in f2),
            "fsdpx_round_spread": max(fx) - min(fx), "fsdp2_round_spread": max(f2) - min(f2),
            "fsdpx_step_time_s": statistics.median(r["fsdpx"][i]["step_time_s"] for r in rounds),
            "fsdp2_step_time_s": statistics.median(r["fsdp2"][i]["step_time_s"] for r in rounds),
            "fsdpx_peak_rss_bytes": max(rss_per_rank(r["fsdpx"][i])[0] for r in rounds),
            "fsdp2_peak_rss_bytes": max(rss_per_rank(r["fsdp2"][i])[0] for r in rounds),
        })
    s = {"config": cfg, "ranks": a.nproc, "steps": a.steps, "rounds": a.rounds, "per_step": per_step,
         "max_abs_loss_diff": max(p["abs_diff"] for p in per_step)}
    for side in sides:
        s[side] = {
            "step_time_s": statistics.median(median_step_time(r[side]) for r in rounds),
            "step_time_s_rounds": [median_step_time(r[side]) for r in rounds],
            "peak_rss_bytes": statistics.median(peak_rss(r[side]) for r in rounds),
            "step_rss_rise_bytes": statistics.median(step_rise(r[side]) for r in rounds),
        }
        per_round = [b for b in (breakdown(r[side]) for r in rounds) if b]
        if per_round:
            s[side]["breakdown"] = {p: statistics.median(b[p] for b in per_round) for p in PHASES}
        last = rounds[0][side][-1]
        for k in ("allgather_bytes", "reduce_scatter_bytes", "all_reduce_bytes"):
            if k in last:
                s[side][k] = last[k]
    if "startup_rss_bytes" in rounds[0]["fsdp2"][0]:
        s["fsdp2"]["startup_rss_bytes"] = rounds[0]["fsdp2"][0]["startup_rss_bytes"]
    s["time_ratio"] = s["fsdpx"]["step_time_s"] / s["fsdp2"]["step_time_s"]
    s["memory_ratio"] = s["fsdpx"]["peak_rss_bytes"] / s["fsdp2"]["peak_rss_bytes"]
    if "floor" in s:
        s["fsdpx_over_floor"] = s["fsdpx"]["step_time_s"] / s["floor"]["step_time_s"]
        s["fsdp2_over_floor"] = s["fsdp2"]["step_time_s"] / s["floor"]["step_time_s"]
    return s


def mib(b):
    return b / 2**20


def kib(b):
    return "-" if b is None else f"{b / 1024:.1f}"


def report(s, a):
    seq = a.seq or CONTEXT[s["config"].split(":")[0]]
    print(f"\n== {s['config']}: {s['ranks']} ranks, {a.batch_size} samples/rank, seq {seq}, {s['steps']} steps, "
          f"{s['rounds']} round(s); losses of round 1, times medians over rounds, memory = rank 0's peak RSS")
    print(f"{'step':>4}  {'fsdpx loss':>12}  {'FSDP2 loss':>12}  {'|diff|':>8}  {'fsdpx s':>8}  {'FSDP2 s':>8}  "
          f"{'fsdpx MiB':>9}  {'FSDP2 MiB':>9}")
    for p in s["per_step"]:
        print(f"{p['step']:>4}  {p['fsdpx_loss']:>12.8f}  {p['fsdp2_loss']:>12.8f}  {p['abs_diff']:>8.1e}  "
              f"{p['fsdpx_step_time_s']:>8.4f}  {p['fsdp2_step_time_s']:>8.4f}  "
              f"{mib(p['fsdpx_peak_rss_bytes']):>9.1f}  {mib(p['fsdp2_peak_rss_bytes']):>9.1f}")
    spread = max(max(p["fsdpx_round_spread"], p["fsdp2_round_spread"]) for p in s["per_step"])
    if spread > 0:
        print(f"note: a side's loss differed between rounds by up to {spread:.1e} (not deterministic)")
    fx, f2 = s["fsdpx"], s["fsdp2"]
    print(f"max |loss diff| {s['max_abs_loss_diff']:.2e}")
    print(f"step time (median, step 1 left out)  fsdpx {fx['step_time_s'] * 1e3:.2f} ms, FSDP2 {f2['step_time_s'] * 1e3:.2f} ms: "
          f"fsdpx/FSDP2 = {s['time_ratio']:.2f}  (per round: fsdpx "
          f"{', '.join(f'{t * 1e3:.2f}' for t in fx['step_time_s_rounds'])}; FSDP2 "
          f"{', '.join(f'{t * 1e3:.2f}' for t in f2['step_time_s_rounds'])} ms)")
    print(f"peak RSS (max over ranks)            fsdpx {mib(fx['peak_rss_bytes']):.1f} MiB, FSDP2 "
          f"{mib(f2['peak_rss_bytes']):.1f} MiB: fsdpx/FSDP2 = {s['memory_ratio']:.2f}; a step's rise over the RSS before "
          f"it (max): fsdpx {mib(fx['step_rss_rise_bytes']):.2f} MiB, FSDP2 {mib(f2['step_rss_rise_bytes']):.2f} MiB")
    if "startup_rss_bytes" in f2:
        print(f"                                     (FSDP2's ranks held {mib(f2['startup_rss_bytes']):.1f} MiB before any "
              f"process group or model: the interpreter and torch's Python modules)")
    print(f"bytes per step (KiB)                 all-gather fsdpx {kib(fx.get('allgather_bytes'))} / FSDP2 "
          f"{kib(f2.get('allgather_bytes'))}; reduce-scatter {kib(fx.get('reduce_scatter_bytes'))} / "
          f"{kib(f2.get('reduce_scatter_bytes'))}; all-reduce {kib(fx.get('all_reduce_bytes'))} / {kib(f2.get('all_reduce_bytes'))}")
    if "breakdown" in fx and "breakdown" in f2:
        parts = [f"{p.replace('_', ' ')} {fx['breakdown'][p] * 1e3:.1f} / {f2['breakdown'][p] * 1e3:.1f}" for p in PHASES]
        print("where the step goes (ms, fsdpx / FSDP2, mean over ranks): " + "; ".join(parts))
    if "floor" in s:
        fl = s["floor"]["step_time_s"]
        print(f"compute floor (fsdpx, 1 rank, same batch per rank) {fl * 1e3:.2f} ms: fsdpx at {s['ranks']} ranks is "
              f"{s['fsdpx_over_floor']:.2f}x it (+{(fx['step_time_s'] - fl) * 1e3:.2f} ms), FSDP2 {s['fsdp2_over_floor']:.2f}x "
              f"(+{(f2['step_time_s'] - fl) * 1e3:.2f} ms)")
    sys.stdout.flush()


def main():
    a = parse_args()
    train = find_train(a.fsdpx_bin)
    if not os.access(a.python, os.X_OK):
        raise SystemExit(f"no Python at {a.python}; run scripts/setup.sh or give --python")
    if a.data and not os.path.isfile(a.data):
        raise SystemExit(f"--data {a.data}: no such file")
    keep = bool(a.work)
    a.work = os.path.abspath(a.work) if a.work else tempfile.mkdtemp(prefix="fsdpx-vs-fsdp2-")
    os.makedirs(a.work, exist_ok=True)
    a.data = os.path.abspath(a.data) if a.data else make_tokens(os.path.join(a.work, "tokens.bin"))
    bench = Bench(a, train)
    print(f"fsdpx: {bench.train}; FSDP2: {a.python} {os.path.join(HERE, 'gpt_fsdp2.py')}; work: {a.work}; "
          f"{len(a.configs)} configuration(s), {a.rounds} round(s) of {a.steps} steps, OMP_NUM_THREADS={a.threads}; "
          f"{os.cpu_count()} CPU(s), load average {os.getloadavg()[0]:.2f} (timings mean little when it is near or "
          f"above the CPUs the ranks use)")
    results, failures = [], []
    for cfg in a.configs:
        try:
            s = bench.config(cfg)
        except RunFailed as e:
            print(f"\n== {cfg}: FAILED: {e}", flush=True)
            failures.append({"config": cfg, "error": str(e)})
            continue
        report(s, a)
        results.append(s)

    if results:
        print("\n== summary (fsdpx / FSDP2: below 1 means fsdpx is faster or smaller)")
        print(f"{'configuration':<34} {'max|diff|':>9} {'time':>6} {'memory':>7} {'fsdpx ms':>9} {'FSDP2 ms':>9} "
              f"{'floor ms':>9}")
        for s in results:
            fl = f"{s['floor']['step_time_s'] * 1e3:9.2f}" if "floor" in s else f"{'-':>9}"
            print(f"{s['config']:<34} {s['max_abs_loss_diff']:>9.1e} {s['time_ratio']:>6.2f} {s['memory_ratio']:>7.2f} "
                  f"{s['fsdpx']['step_time_s'] * 1e3:>9.2f} {s['fsdp2']['step_time_s'] * 1e3:>9.2f} {fl}")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    worst = max((s["max_abs_loss_diff"] for s in results), default=0.0)
    parity_failed = a.parity is not None and any(s["max_abs_loss_diff"] > a.parity for s in results)
    if a.parity is not None and results:
        bad = [s["config"] for s in results if s["max_abs_loss_diff"] > a.parity]
        print(f"parity: max |loss diff| {worst:.2e} against tolerance {a.parity:g}: "
              + ("FAILED for " + ", ".join(bad) if bad else "ok"))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"results": results, "failures": failures, "parity_tolerance": a.parity}, fh, indent=1)
    if keep or failures or parity_failed:  # the logs of what went wrong stay
        print(f"runs kept in {a.work}")
    else:
        shutil.rmtree(a.work, ignore_errors=True)
    if failures:
        print(f"{len(failures)} configuration(s) failed: {', '.join(f['config'] for f in failures)}")
        return 2
    return 1 if parity_failed else 0


if __name__ == "__main__":
    sys.exit(main())
