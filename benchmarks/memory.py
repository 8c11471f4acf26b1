#!/usr/bin/env python3
"""Memory per rank, fsdpx against PyTorch FSDP2, side by side in one run (a benchmark: it prints
figures and asserts nothing).

gpt at 1b width (2048 wide, vocabulary 32000), fp32 (--precision bf16_mixed), SGD (--optimizer adamw), 2 CPU ranks,
one sample of 32 tokens per rank: fsdpx-train and the FSDP2 mirror (benchmarks/vs_fsdp2/gpt_fsdp2.py) with the same model,
units (every Block, the rest in the root), seeded weights and batches.

  1. Peak per rank at 2 and 8 layers, the growth per added layer, and the ratio fsdpx/FSDP2. Both
     sides count allocated bytes with fsdpx's counting CPU allocator (the mirror loads it from
     libfsdpx.so through ctypes), and RSS beside it. Then at the deeper depth, fsdpx with each
     memory option of --options (default --optimizer-in-backward), one at a time, and FSDP2 once
     more without fsdpx's block cache in its process (FSDPX_CPU_BLOCK_CACHE=0: every block back to
     the system at once, as PyTorch's own CPU allocator does), the RSS its users see.
  2. The largest gpt at 1b width, by layers, that trains one step on 2 ranks within a budget per
     node (--budget-gib, 16 by default), enforced by a memory cgroup that this script creates
     (root and a writable cgroup v1 or v2 memory controller), else by RLIMIT_DATA per process
     (the budget split over the ranks; said so in the output): by default fsdpx, fsdpx with activation
     checkpointing of every Block, and FSDP2; --largest-sides names others (memory options, FSDP2
     recomputing Blocks). Each try is a fresh run; a try fails when a rank is killed or cannot allocate.
     With --device sim (and --skip-peaks) the budget is sim's device memory (FSDPX_SIM_MEMORY per rank),
     fsdpx alone, and 'offload' adds activation offload.
  3. With --before BUILD (an older fsdpx build directory): step time of this build and that one,
     interleaved, on gpt small and at 1b width with 2 layers, and their ratio.
  4. With --option-cost: the step time of gpt small with each memory option of --options against
     without, interleaved rounds, and their ratio.

Every run has a time limit (--timeout). Needs the torch venv (scripts/setup.sh) and a built fsdpx.
"""
import argparse
import contextlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "vs_fsdp2"))
import compare  # noqa: E402  (make_tokens, find_train, run, RunFailed, DEFAULT_PYTHON)

MiB, GiB = 1 << 20, 1 << 30


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n", 2)[2])
    p.add_argument("--fsdpx-bin", default=os.path.join(compare.REPO, "build"), help="the fsdpx build directory")
    p.add_argument("--python", default=compare.DEFAULT_PYTHON, help="a Python with torch 2.11")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--steps", type=int, default=3, help="steps of the 2- and 8-layer runs (the peak is their largest)")
    p.add_argument("--layers", default="2,8", help="the two depths of part 1")
    p.add_argument("--optimizer", default="sgd", choices=("sgd", "adamw"), help="both sides' optimizer")
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16_mixed"), help="both sides' precision")
    p.add_argument("--options", default="--optimizer-in-backward,units,units+--optimizer-in-backward",
                   help="fsdpx-train memory options measured one at a time at part 1's deeper depth "
                        "(comma-separated; '+' joins options into one run; 'units' makes the embedding and the "
                        "output projection units of their own, --wrap.layer_types Block,Embedding,Output, "
                        "and adds FSDP2 with the same units, as torchtitan shards them; '' for none)")
    p.add_argument("--budget-gib", type=float, default=16.0, help="memory per node for part 2")
    p.add_argument("--max-layers", type=int, default=96, help="part 2 searches 1..this")
    p.add_argument("--largest-sides", default=None,
                   help="part 2's runs, comma-separated: fsdp2 or fsdpx, then '+'-joined options ('ac' recomputes "
                        "every Block on either side, 'units' as in --options; fsdpx also takes 'offload', "
                        "--activation-offload Block, and its flags, e.g. fsdpx+units+--optimizer-in-backward; default "
                        "fsdp2,fsdpx,fsdpx+ac, on sim fsdpx,fsdpx+ac,fsdpx+ac+offload)")
    p.add_argument("--skip-peaks", action="store_true", help="leave out part 1 (about 10 minutes at AdamW)")
    p.add_argument("--device", choices=("cpu", "sim"), default="cpu",
                   help="fsdpx's device. sim: part 2's budget is sim's device memory (FSDPX_SIM_MEMORY, the budget "
                        "split over the ranks), fsdpx sides only (FSDP2 has no sim); needs --skip-peaks")
    p.add_argument("--skip-largest", action="store_true", help="leave out part 2 (it takes tens of minutes)")
    p.add_argument("--before", default="", help="an older fsdpx build directory to time against (part 3)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds of parts 3 and 4")
    p.add_argument("--option-cost", action="store_true", help="part 4: the step time each option costs")
    p.add_argument("--timeout", type=float, default=1800, help="seconds allowed to each run")
    p.add_argument("--work", default="", help="keep every run's files here (default: a temporary directory)")
    p.add_argument("--json", default="", help="also write the figures as JSON to this file")
    a = p.parse_args()
    if a.largest_sides is None:
        a.largest_sides = "fsdpx,fsdpx+ac,fsdpx+ac+offload" if a.device == "sim" else "fsdp2,fsdpx,fsdpx+ac"
    for side in a.largest_sides.split(","):
        who, *opts = side.split("+")
        allowed = ("ac", "units") if who == "fsdp2" else ("ac", "offload", "units")
        bad = [o for o in opts if o not in allowed and not (who == "fsdpx" and o.startswith("--"))]
        if who not in ("fsdp2", "fsdpx") or bad:
            p.error(f"--largest-sides: '{side}' is not fsdp2 or fsdpx followed by '+'-joined options "
                    f"({', '.join(allowed)}{', or fsdpx-train flags' if who == 'fsdpx' else ''})")
    if a.device == "sim":
        if not a.skip_peaks or a.before or a.option_cost:
            p.error("--device sim measures part 2 alone: add --skip-peaks and leave out --before and --option-cost "
                    "(they hold fsdpx against FSDP2 or an older build on the CPU)")
        if any(side.split("+")[0] != "fsdpx" for side in a.largest_sides.split(",")):
            p.error(f"--device sim: every --largest-sides entry must be fsdpx's (FSDP2 has no sim), got "
                    f"'{a.largest_sides}'")
    return a


def option_args(option):
    """fsdpx-train's arguments for one entry of --options: flags joined by '+'; 'units' is the
    embedding and the output projection as units of their own."""
    out = []
    for o in filter(None, option.split("+")):
        out += ["--wrap.layer_types", compare.EMBEDDING_UNITS] if o == "units" else [o]
    return out


class Budget:
    """A memory budget for a whole run (the node): a fresh cgroup with memory.max (v2) or
    memory.limit_in_bytes (v1), else RLIMIT_DATA per process."""

    def __init__(self, limit, nproc):
        self.limit, self.nproc, self.path, self.kind = limit, nproc, None, "rlimit"
        name = f"fsdpx-memory-bench-{os.getpid()}"
        candidates = [("v2", "/sys/fs/cgroup", "memory.max"), ("v2", "/sys/fs/cgroup/unified", "memory.max"),
                      ("v1", "/sys/fs/cgroup/memory", "memory.limit_in_bytes")]
        for kind, root, limit_file in candidates:
            if kind == "v2":
                try:
                    with open(os.path.join(root, "cgroup.controllers")) as f:
                        if "memory" not in f.read().split():
                            continue
                except OSError:
                    continue
            path = os.path.join(root, name)
            try:
                os.makedirs(path, exist_ok=True)
                with open(os.path.join(path, limit_file), "w") as f:
                    f.write(str(int(limit)))
                for swap in ("memory.memsw.limit_in_bytes", "memory.swap.max"):  # no escape into swap
                    with contextlib.suppress(OSError):
                        with open(os.path.join(path, swap), "w") as f:
                            f.write(str(int(limit)) if swap.endswith("bytes") else "0")
                self.path, self.kind = path, f"cgroup {kind} ({path})"
                return
            except OSError:
                with contextlib.suppress(OSError):
                    os.rmdir(path)

    def env(self, env):
        return env

    def describe(self):
        if self.path:
            return f"{self.limit / GiB:.1f} GiB for the whole run, by a memory {self.kind}"
        return (f"{self.limit / GiB:.1f} GiB as RLIMIT_DATA of {self.limit / self.nproc / GiB:.2f} GiB per process "
                f"(no writable memory cgroup here: each rank is bounded alone, the launcher too)")

    def preexec(self):
        if self.path:
            with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        else:
            per = int(self.limit / self.nproc)
            resource.setrlimit(resource.RLIMIT_DATA, (per, per))
        os.setsid()

    def close(self):
        """Ends whatever is left in the cgroup (an interrupted try), then removes it."""
        if not self.path:
            return
        for _ in range(50):
            with contextlib.suppress(OSError):
                with open(os.path.join(self.path, "cgroup.procs")) as f:
                    pids = [int(x) for x in f.read().split()]
                for pid in pids:
                    with contextlib.suppress(OSError):
                        os.kill(pid, 9)
                os.rmdir(self.path)
                return
            time.sleep(0.1)


class SimBudget:
    """The budget on sim: each rank's simulated device holds at most limit / nproc bytes
    (FSDPX_SIM_MEMORY; past it an allocation fails as CUDA's does). Host memory is not bounded."""

    def __init__(self, limit, nproc):
        self.limit, self.nproc = limit, nproc

    def describe(self):
        return (f"{self.limit / GiB:.1f} GiB of sim device memory per node, FSDPX_SIM_MEMORY of "
                f"{self.limit / self.nproc / GiB:.2f} GiB per rank (host memory not bounded)")

    def env(self, env):
        return dict(env, FSDPX_SIM_MEMORY=str(int(self.limit / self.nproc)))

    def preexec(self):
        os.setsid()

    def close(self):
        pass


def run_in(cmd, log, timeout, env, preexec=None):
    """Runs cmd in its own session, output to `log`; returns its exit status (killed at the time limit)."""
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=compare.REPO,
                                preexec_fn=preexec or os.setsid)
        try:
            return proc.wait(timeout=timeout)
        except BaseException:
            compare.stop(proc)
            raise


class Bench:
    def __init__(self, a):
        self.a = a
        self.train = compare.find_train(a.fsdpx_bin)
        self.lib = os.path.join(os.path.dirname(os.path.dirname(self.train)), "lib", "libfsdpx.so")
        self.env = dict(os.environ, OMP_NUM_THREADS="1")
        self.data = compare.make_tokens(os.path.join(a.work, "tokens.bin"))

    def fsdpx_cmd(self, train, layers, out, steps, extra=(), size="1b"):
        extra = [x for o in extra for x in option_args(o)]
        types = "Block"
        if "--wrap.layer_types" in extra:  # an option's layer types replace Block
            i = extra.index("--wrap.layer_types")
            types = extra[i + 1]
            extra = extra[:i] + extra[i + 2:]
        return [train, "--nproc-per-node", str(self.a.nproc), "--device", self.a.device,
                "--model.size", size, "--model.layers", str(layers),
                "--data.name", "tokens", "--data.path", self.data, "--data.dtype", "uint16", "--data.seq",
                str(self.a.seq), "--batch-size", "1", "--optimizer.name", self.a.optimizer, "--wrap.layer_types", types,
                "--precision.name", self.a.precision,
                "--steps", str(steps), "--log-every", "1", "--peak-tflops", "1", "--skip-memory-check",
                "--out", out, *extra]

    def fsdp2_cmd(self, layers, out, steps, units=False):
        return [self.a.python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(self.a.nproc),
                os.path.join(HERE, "vs_fsdp2", "gpt_fsdp2.py"), "--size", "1b", "--layers", str(layers),
                "--data", self.data, "--seq", str(self.a.seq), "--batch-size", "1", "--steps", str(steps),
                "--sharding", "full_shard", "--precision", self.a.precision, "--optimizer", self.a.optimizer, "--out", out,
                "--quiet",
                "--fsdpx-lib", self.lib] + (["--embedding-units"] if units else [])

    def peaks(self, side, layers, option=""):
        """The largest allocated step peak and the peak RSS over the run's steps (max over ranks)."""
        d = os.path.join(self.a.work, f"{side}-{layers}{option}")
        shutil.rmtree(d, ignore_errors=True)
        if side == "fsdpx":
            extra = [option] if option else []
            compare.run(self.fsdpx_cmd(self.train, layers, d, self.a.steps, extra), d + ".log", self.a.timeout, self.env)
            steps = compare.read_steps(os.path.join(d, "metrics.jsonl"), self.a.steps)
            rss = max(max(s["peak_rss_bytes"]) for s in steps)
        else:
            cmd = self.fsdp2_cmd(layers, d + ".jsonl", self.a.steps, units=option == "units")
            # "own": every block back to the system at once, as PyTorch's own CPU allocator does
            # (the counting allocator still counts it, without its block cache).
            env = dict(self.env, FSDPX_CPU_BLOCK_CACHE="0") if option == "own" else self.env
            compare.run(cmd, d + ".log", self.a.timeout, env)
            steps = compare.read_steps(d + ".jsonl", self.a.steps)
            rss = max(s["peak_rss_bytes"] for s in steps)
        return max(s["step_peak_allocated_bytes"] for s in steps), rss

    def part1(self):
        lo, hi = (int(x) for x in self.a.layers.split(","))
        fig = {side: {L: self.peaks(side, L) for L in (lo, hi)} for side in ("fsdpx", "fsdp2")}
        shard = self.layer_shard_bytes()
        options = [o for o in self.a.options.split(",") if o]
        with_option = {o: self.peaks("fsdpx", hi, o) for o in options}
        units = any("units" in o.split("+") for o in options)
        fsdp2_units = self.peaks("fsdp2", hi, "units") if units else None
        fsdp2_own = self.peaks("fsdp2", hi, "own")
        name = {"sgd": "SGD", "adamw": "AdamW"}[self.a.optimizer]
        print(f"\n1. Peak per rank, gpt 1b width, {self.a.precision}, {name}, {self.a.nproc} ranks, 1 x {self.a.seq} "
              f"tokens per rank "
              f"(allocated: fsdpx's counting allocator on both sides; RSS beside it)")
        print(f"   {'':22} {'fsdpx alloc':>12} {'FSDP2 alloc':>12} {'ratio':>6}   {'fsdpx RSS':>10} {'FSDP2 RSS':>10} {'ratio':>6}")
        for L in (lo, hi):
            (fa, fr), (ta, tr) = fig["fsdpx"][L], fig["fsdp2"][L]
            print(f"   {f'{L} layers':22} {fa / GiB:9.2f} GiB {ta / GiB:8.2f} GiB {fa / ta:6.2f}   "
                  f"{fr / GiB:7.2f} GiB {tr / GiB:6.2f} GiB {fr / tr:6.2f}")
        for o, (fa, fr) in with_option.items():
            against = [("FSDP2, Blocks", fig["fsdp2"][hi])]
            if fsdp2_units and "units" in o.split("+"):
                against.append(("FSDP2, same units", fsdp2_units))
            print(f"   {hi} layers, fsdpx with {o}:")
            for label, (ta, tr) in against:
                print(f"   {'  vs ' + label:22} {fa / GiB:9.2f} GiB {ta / GiB:8.2f} GiB {fa / ta:6.2f}   "
                      f"{fr / GiB:7.2f} GiB {tr / GiB:6.2f} GiB {fr / tr:6.2f}")
        (fa, fr), (ta, tr) = fig["fsdpx"][hi], fsdp2_own
        print(f"   {hi} layers, FSDP2 with PyTorch's own CPU allocation (no block cache in its process):")
        print(f"   {'  vs fsdpx, no option':22} {fa / GiB:9.2f} GiB {ta / GiB:8.2f} GiB {fa / ta:6.2f}   "
              f"{fr / GiB:7.2f} GiB {tr / GiB:6.2f} GiB {fr / tr:6.2f}")
        growth = {s: [(fig[s][hi][k] - fig[s][lo][k]) / (hi - lo) for k in (0, 1)] for s in fig}
        print(f"   {'growth per layer':22} {growth['fsdpx'][0] / MiB:8.0f} MiB {growth['fsdp2'][0] / MiB:7.0f} MiB "
              f"{growth['fsdpx'][0] / growth['fsdp2'][0]:6.2f}   {growth['fsdpx'][1] / MiB:6.0f} MiB "
              f"{growth['fsdp2'][1] / MiB:5.0f} MiB {growth['fsdpx'][1] / growth['fsdp2'][1]:6.2f}")
        print(f"   one layer's shards per rank (parameters and gradients): {shard / MiB:.0f} MiB; fsdpx's growth is "
              f"{growth['fsdpx'][0] / shard:.3f}x that")
        return {"depths": [lo, hi], "layer_shard_bytes": shard, "optimizer": self.a.optimizer,
                "options": {o: {"allocated": v[0], "rss": v[1]} for o, v in with_option.items()},
                "fsdp2_units": {"allocated": fsdp2_units[0], "rss": fsdp2_units[1]} if fsdp2_units else None,
                "fsdp2_own_allocator": {"allocated": fsdp2_own[0], "rss": fsdp2_own[1]},
                "peaks": {s: {str(L): {"allocated": v[0], "rss": v[1]} for L, v in fig[s].items()} for s in fig},
                "growth_per_layer": {s: {"allocated": g[0], "rss": g[1]} for s, g in growth.items()}}

    def layer_shard_bytes(self):
        """A Block's parameter and gradient shard bytes per rank, from fsdpx's plan (--dry-run)."""
        d = os.path.join(self.a.work, "plan")
        cmd = self.fsdpx_cmd(self.train, 2, d, 1) + ["--dry-run"]
        subprocess.run(cmd, check=True, capture_output=True, env=self.env)
        plan = json.load(open(os.path.join(d, "plan.json")))
        block = next(u for u in plan["units"] if u["unit"] == "layers.0")
        return 2 * block["shard_numel"] * 4

    def side_cmd(self, side, layers, d):
        """One try of a --largest-sides entry: 'fsdp2' or 'fsdpx', then '+'-joined options ('ac' recomputes
        every Block, 'units' makes the embedding and output units; fsdpx also takes 'offload', which offloads
        the recomputed Blocks' inputs, and its own flags)."""
        who, *opts = side.split("+")
        if who == "fsdp2":
            cmd = self.fsdp2_cmd(layers, d + ".jsonl", 1, units="units" in opts)
            return cmd + (["--activation-checkpointing"] if "ac" in opts else [])
        flags = {"ac": ["--activation-checkpointing", "Block"], "offload": ["--activation-offload", "Block"]}
        named = [x for o in opts if o in flags for x in flags[o]]
        return self.fsdpx_cmd(self.train, layers, d, 1, named + [o for o in opts if o not in flags])

    def fits(self, side, layers, budget):
        d = os.path.join(self.a.work, f"fit-{side.replace('+', '-')}-{layers}")
        shutil.rmtree(d, ignore_errors=True)
        cmd = self.side_cmd(side, layers, d)
        t0 = time.perf_counter()
        rc = run_in(cmd, d + ".log", self.a.timeout, budget.env(self.env), budget.preexec)
        print(f"   {side:9} {layers:3d} layers: {'trains' if rc == 0 else f'fails (exit {rc})'} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
        return rc == 0

    def largest(self, side, budget):
        """The most layers that train one step: doubling from 4, then bisection."""
        lo, hi = 0, None
        n = 4
        while hi is None:
            if n > self.a.max_layers:
                return lo
            if self.fits(side, n, budget):
                lo, n = n, n * 2
            else:
                hi = n
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.fits(side, mid, budget):
                lo = mid
            else:
                hi = mid
        return lo

    def part2(self):
        budget = (SimBudget if self.a.device == "sim" else Budget)(self.a.budget_gib * GiB, self.a.nproc)
        print(f"\n2. The largest gpt at 1b width (layers) that trains one step on {self.a.nproc} ranks within "
              f"{budget.describe()}")
        try:
            most = {side: self.largest(side, budget) for side in self.a.largest_sides.split(",")}
        finally:
            budget.close()
        base = "fsdp2" if "fsdp2" in most else next(iter(most))  # FSDP2, else the first side (sim)
        for side, n in most.items():
            who, *opts = side.split("+")
            # FSDP2 wrapped the same way, however its entry orders its options
            same = next((k for k in most if k.split("+")[0] == "fsdp2" and
                         sorted(k.split("+")[1:]) == sorted(o for o in opts if o in ("ac", "units"))), None)
            against = f", {n / max(most[same], 1):.2f}x {same}'s" if who == "fsdpx" and same not in (None, base) else ""
            print(f"   {side:9} {n:3d} layers ({n / max(most[base], 1):.2f}x {base}'s{against})", flush=True)
        return {"budget": budget.describe(), "layers": most}

    def step_time(self, train, size, layers, d, option=""):
        shutil.rmtree(d, ignore_errors=True)
        extra = ["--skip-memory-check"] if train == self.train else []
        cmd = [x for x in self.fsdpx_cmd(train, layers, d, 6, [option] if option else [], size=size)
               if x != "--skip-memory-check"] + extra
        if size == "small":
            cmd[cmd.index("--batch-size") + 1] = "8"
            cmd[cmd.index("--data.seq") + 1] = "128"
            cmd[cmd.index("--model.layers") + 1] = "4"
        compare.run(cmd, d + ".log", self.a.timeout, self.env)
        steps = compare.read_steps(os.path.join(d, "metrics.jsonl"), 6)
        return statistics.median(s["step_time_s"] for s in steps[1:])

    def part3(self):
        before = compare.find_train(self.a.before)
        print(f"\n3. Step time, this build against {before} (median of steps 2-6; median of {self.a.rounds} "
              f"interleaved rounds)")
        out = {}
        for size, layers in (("small", 4), ("1b", 2)):
            times = {"now": [], "before": []}
            for r in range(self.a.rounds):
                for side, train in (("now", self.train), ("before", before)):
                    times[side].append(self.step_time(train, size, layers,
                                                      os.path.join(self.a.work, f"time-{side}-{size}-{r}")))
            now, old = statistics.median(times["now"]), statistics.median(times["before"])
            name = "gpt small (8 x 128 tokens per rank)" if size == "small" else "1b width, 2 layers (1 x 32)"
            print(f"   {name:36} now {now:.3f} s/step, before {old:.3f} s/step: now/before = {now / old:.2f}")
            out[size] = {"now_s": now, "before_s": old, "ratio": now / old}
        return out


    def part4(self):
        options = [o for o in self.a.options.split(",") if o]
        print(f"\n4. Step time of each memory option, gpt small (8 x 128 tokens per rank), {self.a.nproc} ranks "
              f"(median of steps 2-6; median of {self.a.rounds} interleaved rounds)")
        times = {o: [] for o in [""] + options}
        for r in range(self.a.rounds):
            for o in times:
                times[o].append(self.step_time(self.train, "small", 4, os.path.join(self.a.work, f"cost-{r}{o}"), o))
        base = statistics.median(times[""])
        out = {"without_s": base}
        for o in options:
            t = statistics.median(times[o])
            print(f"   {o:36} {t:.3f} s/step against {base:.3f} s/step without: {t / base:.2f}x")
            out[o] = {"s": t, "ratio": t / base}
        return out


def main():
    a = parse_args()
    tmp = None
    if not a.work:
        tmp = tempfile.mkdtemp(prefix="fsdpx-memory-bench-")
        a.work = tmp
    os.makedirs(a.work, exist_ok=True)
    try:
        b = Bench(a)
        results = {} if a.skip_peaks else {"part1": b.part1()}
        if not a.skip_largest:
            results["part2"] = b.part2()
        if a.before:
            results["part3"] = b.part3()
        if a.option_cost:
            results["part4"] = b.part4()
        if a.json:
            with open(a.json, "w") as f:
                json.dump(results, f, indent=2)
    except compare.RunFailed as e:
        print(f"memory benchmark: {e}", file=sys.stderr)
        return 2
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
