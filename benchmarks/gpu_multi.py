#!/usr/bin/env python3
"""The several-rank part of `make gpu-check`: fsdpx over NCCL at 2 and 4 ranks.

Where the machine has a GPU per rank each rank gets its own; where it has fewer (the one GPU this
project's machines have), the ranks share them (fsdpx-train --share-gpus, FSDPX_SHARE_GPUS=1 for
the library): each rank is a node of its own to NCCL, which then moves the bytes through its socket
transport on loopback. That is NCCL itself (ProcessGroupNCCL, its streams, communicators, error
handling and watchdog, on device memory); only the wire differs from a cluster's. Each row of the
table is one claim, at one world size: passed, failed (with its first line) or not run (why).

  losses   each composition's losses (gpt tiny, synthetic data, AdamW, fp32, one global batch of 8
           samples at every world size) against the CPU's at one rank (--tolerance) and the same run
           at one rank on the device: full_shard, shard_grad_op, hybrid_shard (shard groups of 2 at 4
           ranks, of 1 at 2), cpu_offload over full_shard and over hybrid_shard at shard size 1,
           --optimizer-in-backward, recomputed Blocks with their inputs offloaded; the int
           reshard_after_forward (k = 2, through the library: tests/workers/library_worker) at 4
           ranks, against the CPU and the device with reshard after forward;
  resume   an asynchronous sharded save (staged from device memory) after 2 steps, resumed at the
           other world size: its losses against the one-rank CPU run's;
  bytes    the bytes each step moved, counted on NCCL by fsdpx's counting communicator, equal to the
           plan's (plan.json) in every fsdpx-train run of the losses rows;
  kill     a rank SIGKILLed after step 2, and one SIGSTOPped: every other rank ends non-zero within
           --collective-timeout, naming it, and none names another rank;
  example  examples/train_loop (the library in a user's own loop) at 2 ranks under torchrun on the
           device: the plain loop's losses (--example, the built example; not run without it);
  overlap  the step time with --overlap 1 and 0 and where a step goes (gpt at 1b width, 4 layers,
           bf16_mixed on CUDA; gpt small on sim), only with a device per rank on CUDA: ranks that
           share a GPU time its sharing, not fsdpx.

The exit status is 0 when no row failed, 1 when one did. --device sim runs every row on sim's NCCL
twin (FSDPX_SIM_DEVICES=1 makes it a one-device machine), which is how the script is tested
without a GPU (tests/CMakeLists.txt: GpuMulti.*).
"""
import argparse
import concurrent.futures
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "vs_fsdp2"))
import compare  # noqa: E402  (run, read_steps, find_train, RunFailed: the same runner)

GLOBAL_BATCH = 8  # samples per step at every world size: 1, 2 and 4 ranks give the same losses
PHASES = ("forward", "backward", "all_gather_wait", "reduce_scatter_wait", "optimizer", "other")
BYTES = ("allgather_bytes", "reduce_scatter_bytes", "all_reduce_bytes", "all_to_all_bytes")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n", 2)[2])
    p.add_argument("--build-dir", required=True, help="the fsdpx build directory (bin/fsdpx-train, tests/library_worker)")
    p.add_argument("--ranks", default="2,4", help="world sizes, comma-separated (default 2,4)")
    p.add_argument("--device", choices=("cuda", "sim"), default="cuda")
    p.add_argument("--devices", type=int, default=0,
                   help="devices visible (default: nvidia-smi's GPUs, CUDA_VISIBLE_DEVICES respected; sim: "
                        "FSDPX_SIM_DEVICES, else 8); more ranks than devices share them")
    p.add_argument("--example", default="", help="the built examples/train_loop (the example row needs it)")
    p.add_argument("--python", default=sys.executable, help="the Python whose torch runs torchrun")
    p.add_argument("--tolerance", type=float, default=1e-5, help="the largest loss difference allowed")
    p.add_argument("--steps", type=int, default=4, help="steps of each run (the resume row saves after 2)")
    p.add_argument("--collective-timeout", type=float, default=60.0)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per run before it is stopped")
    p.add_argument("--jobs", type=int, default=1, help="rows run at once (each a few processes)")
    p.add_argument("--work", default="", help="keep the runs here (default: a temporary directory, removed)")
    p.add_argument("--json", default="", help="also write the rows here")
    a = p.parse_args(argv)
    try:
        a.world_sizes = sorted({int(x) for x in a.ranks.split(",") if x.strip()})
    except ValueError:
        p.error(f"--ranks takes world sizes separated by commas, e.g. 2,4; got '{a.ranks}'")
    if not a.world_sizes or min(a.world_sizes) < 2 or any(GLOBAL_BATCH % n for n in a.world_sizes):
        p.error(f"--ranks: each world size must be 2 or more and divide {GLOBAL_BATCH} (the global batch), "
                f"got '{a.ranks}'")
    if a.steps < 3:
        p.error(f"--steps must be 3 or more (the resume row saves after 2), got {a.steps}")
    if a.jobs < 1:
        p.error(f"--jobs must be 1 or more, got {a.jobs}")
    a.devices = a.devices or visible_devices(a.device)
    if a.devices < 1:
        p.error(f"no {a.device} device visible (--devices N says how many there are)")
    return a


def visible_devices(device):
    if device == "sim":
        return int(os.environ.get("FSDPX_SIM_DEVICES", "8"))
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    gpus = sum(1 for line in listed.splitlines() if line.startswith("GPU "))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return gpus if visible is None else min(gpus, len([v for v in visible.split(",") if v.strip()]))


class Row:
    def __init__(self, name, ranks, verdict, detail, seconds=0.0):
        self.name, self.ranks, self.verdict, self.detail, self.seconds = name, ranks, verdict, detail, seconds


class Part:
    """The runs of one invocation: the binaries, the work folder, and how a run at N ranks shares."""

    def __init__(self, a):
        self.a = a
        self.train = compare.find_train(a.build_dir)
        self.worker = os.path.join(a.build_dir, "tests", "library_worker")
        self.bytes_checked = []  # (ranks, run directory) of every fsdpx-train run of the losses rows

    def shares(self, n):
        return n > self.a.devices

    def env(self, n):
        env = dict(os.environ, OMP_NUM_THREADS="1")
        if self.shares(n):
            env["FSDPX_SHARE_GPUS"] = "1"
        return env

    def train_cmd(self, device, n, out, extra=()):
        cmd = [self.train, "--device", device, "--model.size", "tiny", "--data.name", "synthetic",
               "--optimizer.name", "adamw", "--steps", str(self.a.steps), "--log-every", "1", "--seed", "0",
               "--peak-tflops", "1", "--batch-size", str(GLOBAL_BATCH // n), "--out", out]
        if n > 1:
            cmd[1:1] = ["--nproc-per-node", str(n)]
        if device != "cpu" and self.shares(n):
            cmd.append("--share-gpus")
        return cmd + list(extra)

    def run(self, cmd, name, n, device="cpu"):
        log = os.path.join(self.a.work, name + ".log")
        compare.run(cmd, log, self.a.timeout, self.env(n) if device != "cpu" else dict(os.environ, OMP_NUM_THREADS="1"))
        return log

    def losses(self, name, device, n, extra=()):
        out = os.path.join(self.a.work, name)
        self.run(self.train_cmd(device, n, out, extra), name, n, device)
        return [s["loss"] for s in compare.read_steps(os.path.join(out, "metrics.jsonl"), self.a.steps)], out

    def library_losses(self, name, device, n, extra=()):
        log = self.run([self.worker, "--nproc-per-node", str(n), "--device", device, *extra], name, n, device)
        with open(log, errors="replace") as fh:
            found = re.findall(r"^(?:\[rank0\]: )?step (\d+) loss (\S+)$", fh.read(), re.M)
        if len(found) != 3:
            raise compare.RunFailed(f"library_worker printed {len(found)} of its 3 losses (log: {log})")
        return [float(x) for _, x in found]


def worst(xs, ys):
    return max(abs(x - y) for x, y in zip(xs, ys)) if len(xs) == len(ys) and xs else float("inf")


def verdict_of(diffs, tolerance):
    """diffs: {what: max |difference|}; passed when each is within tolerance."""
    text = ", ".join(f"max |loss - {w}| {d:.1e}" for w, d in diffs.items())
    bad = [w for w, d in diffs.items() if not d <= tolerance]
    return ("passed", text) if not bad else ("failed", f"{text}: beyond {tolerance:g} against {', '.join(bad)}")


# The fsdpx-train compositions of the losses rows: (name, flags at n ranks, world sizes or None for all).
def compositions(n):
    hybrid = ["--sharding.name", "hybrid_shard", "--sharding.shard_size", str(2 if n >= 4 else 1)]
    return [
        ("full_shard", ["--sharding.name", "full_shard"]),
        ("shard_grad_op", ["--sharding.name", "shard_grad_op"]),
        (f"hybrid_shard {2 if n >= 4 else 1}x{n // (2 if n >= 4 else 1)}", hybrid),
        ("cpu_offload over full_shard", ["--sharding.name", "cpu_offload", "--sharding.base", "full_shard"]),
        ("cpu_offload over hybrid_shard 1", ["--sharding.name", "cpu_offload", "--sharding.base", "hybrid_shard",
                                             "--sharding.shard_size", "1"]),
        ("--optimizer-in-backward", ["--sharding.name", "full_shard", "--optimizer-in-backward"]),
        ("recompute + activation offload", ["--activation-checkpointing", "Block", "--activation-offload", "Block"]),
    ]


def slug(text):
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")


def losses_row(part, refs, name, flags, n):
    got, out = part.losses(f"{slug(name)}-{n}", part.a.device, n, flags)
    part.bytes_checked.append((n, out))
    return verdict_of({"cpu": worst(got, refs["cpu"]), f"1 rank on {part.a.device}": worst(got, refs["device"])},
                      part.a.tolerance)


def int_reshard_row(part, n):
    pairs = ["--reshard", "block0=2", "--reshard", "block1=2", "--reshard", "block2=2"]
    got = part.library_losses(f"int-reshard-{n}", part.a.device, n, pairs)
    cpu = part.library_losses(f"int-reshard-cpu-{n}", "cpu", n, pairs)
    plain = part.library_losses(f"int-reshard-true-{n}", part.a.device, n)
    # library_worker prints rank 0's loss on its own part of the batch: compared at the same world size.
    return verdict_of({f"cpu at {n}": worst(got, cpu), f"reshard true at {n}": worst(got, plain)}, part.a.tolerance)


def resume_row(part, refs, n, other):
    save = os.path.join(part.a.work, f"async-save-{n}")
    ckpt = ["--checkpoint.name", "sharded", "--checkpoint.async", "true"]
    cmd = part.train_cmd(part.a.device, n, save, ckpt)
    cmd[cmd.index("--steps") + 1] = "2"
    part.run(cmd, f"async-save-{n}", n, part.a.device)
    first = [s["loss"] for s in compare.read_steps(os.path.join(save, "metrics.jsonl"), 2)]
    step_dir = os.path.join(save, "checkpoints", "step-00000002")
    if not os.path.isdir(step_dir):
        raise compare.RunFailed(f"the asynchronous save left no {step_dir}")
    out = os.path.join(part.a.work, f"resumed-{n}-at-{other}")
    part.run(part.train_cmd(part.a.device, other, out, ckpt + ["--resume", step_dir]), os.path.basename(out), other,
             part.a.device)
    rows = {}
    with open(os.path.join(out, "metrics.jsonl")) as fh:
        for line in fh:
            m = json.loads(line)
            if "loss" in m:
                rows[m["step"]] = m["loss"]
    rest = [rows.get(s, float("nan")) for s in range(3, part.a.steps + 1)]
    status, text = verdict_of({"cpu": worst(first + rest, refs["cpu"])}, part.a.tolerance)
    return status, f"saved at {n} ranks after step 2, resumed at {other}: {text}"


def bytes_row(part, n):
    runs = [out for m, out in part.bytes_checked if m == n]
    if not runs:
        return "not run", "no losses row ran at this world size"
    off = []
    for out in runs:
        with open(os.path.join(out, "plan.json")) as fh:
            plan = json.load(fh)
        for step in compare.read_steps(os.path.join(out, "metrics.jsonl"), part.a.steps):
            for k in BYTES:
                if step.get(k) != plan.get(k):
                    off.append(f"{os.path.basename(out)} step {step['step']} {k} {step.get(k)} against {plan.get(k)}")
    if off:
        return "failed", f"{len(off)} figure(s) differ from the plan: {off[0]}"
    return "passed", f"{len(runs)} runs x {part.a.steps} steps: all-gather, reduce-scatter, all-reduce and all-to-all " \
                     f"bytes equal the plan's"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill_row(part, n, sig):
    """Ranks started as torchrun starts them; the last gets `sig` once rank 0 has logged step 2."""
    d = os.path.join(part.a.work, f"kill-{sig.name}-{n}")
    os.makedirs(d, exist_ok=True)
    port, victim, timeout = str(free_port()), n - 1, part.a.collective_timeout
    procs = []
    for r in range(n):
        env = dict(part.env(n), RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(n),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        cmd = [part.train, "--device", part.a.device, "--model.size", "tiny", "--model.layers", "8", "--data.name",
               "synthetic", "--steps", "100000", "--log-every", "1", "--collective-timeout", str(int(timeout)),
               "--peak-tflops", "1"] + (["--share-gpus"] if part.shares(n) else [])
        procs.append(subprocess.Popen(cmd, env=env, stdout=open(os.path.join(d, f"r{r}.out"), "w"),
                                      stderr=open(os.path.join(d, f"r{r}.err"), "w"), start_new_session=True))
    try:
        deadline = time.time() + part.a.timeout
        while time.time() < deadline:
            with open(os.path.join(d, "r0.out"), errors="replace") as fh:
                if "step 2/" in fh.read():
                    break
            if any(p.poll() is not None for p in procs):
                raise compare.RunFailed(f"a rank ended before step 2 (see {d})")
            time.sleep(0.1)
        else:
            raise compare.RunFailed(f"rank 0 logged no step 2 within {part.a.timeout:.0f} s (see {d})")
        signalled = time.time()
        procs[victim].send_signal(sig)
        ends = {}
        for r, p in enumerate(procs):
            if r == victim:
                continue
            try:
                p.wait(timeout=max(1.0, signalled + timeout + 30 - time.time()))
            except subprocess.TimeoutExpired:
                return "failed", f"rank {r} still ran {timeout + 30:.0f} s after rank {victim} got {sig.name}"
            ends[r] = (time.time() - signalled, p.returncode)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGCONT)
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    problems, slowest = [], max(t for t, _ in ends.values())
    for r, (t, rc) in ends.items():
        with open(os.path.join(d, f"r{r}.err"), errors="replace") as fh:
            err = fh.read()
        # The ranks it says are lost: "rank 3 is gone (no heartbeat ...)", "rank 3 hung", "rank(s) 3 gone".
        named = {int(x) for x in re.findall(r"\brank(?:\(s\))? (\d+)(?:,? \w+)* (?:is )?(?:gone|hung)\b", err)}
        if rc == 0:
            problems.append(f"rank {r} exited 0")
        if f"rank {victim}" not in err:
            last = err.strip().splitlines()[-1] if err.strip() else "(nothing on stderr)"
            problems.append(f"rank {r} did not name rank {victim}: {last}")
        if named - {victim}:
            problems.append(f"rank {r} named rank(s) {sorted(named - {victim})} too")
        if t > timeout:
            problems.append(f"rank {r} ended {t:.1f} s after, beyond the {timeout:g} s collective timeout")
    if problems:
        return "failed", "; ".join(problems)
    return "passed", f"{len(ends)} other rank(s) ended non-zero naming rank {victim}, the last {slowest:.1f} s after"


def example_row(part, n):
    if not part.a.example:
        return "not run", "no --example (the built examples/train_loop)"
    plain = subprocess.run([part.a.example, "--plain"], capture_output=True, text=True, timeout=part.a.timeout)
    cmd = [part.a.python, "-m", "torch.distributed.run", "--no-python", "--nproc-per-node", str(n),
           "--master-port", str(free_port()), part.a.example, "--device", part.a.device]
    log = part.run(cmd, f"example-{n}", n, part.a.device)
    with open(log, errors="replace") as fh:
        text = fh.read()

    def means(out):
        by_step = {}
        for r, s, x in re.findall(r"rank (\d+) step (\d+) loss (\S+)", out):
            by_step.setdefault(int(s), []).append(float(x))
        return [sum(v) / len(v) for _, v in sorted(by_step.items())]

    got, want = means(text), means(plain.stdout)
    status, detail = verdict_of({"the plain loop": worst(got, want)}, 1e-6)
    return status, f"under torchrun: {detail}"


def overlap_row(part, n):
    if part.a.device == "cuda" and part.shares(n):
        return "not run", f"{n} ranks share {part.a.devices} GPU(s): a time would measure the sharing, not fsdpx"
    model = (["--model.size", "1b", "--model.layers", "4", "--precision.name", "bf16_mixed"]
             if part.a.device == "cuda" else ["--model.size", "small"])
    median = {}
    for overlap in ("1", "0"):
        out = os.path.join(part.a.work, f"overlap{overlap}-{n}")
        cmd = part.train_cmd(part.a.device, n, out, ["--overlap", overlap, "--wrap.name", "layer_type",
                                                     "--wrap.layer_types", "Block"])
        at = cmd.index("--model.size")
        cmd[at:at + 2] = model
        cmd[cmd.index("--batch-size") + 1] = "2"
        part.run(cmd, os.path.basename(out), n, part.a.device)
        steps = compare.read_steps(os.path.join(out, "metrics.jsonl"), part.a.steps)[1:]
        times = sorted(s["step_time_s"] for s in steps)
        median[overlap] = (times[len(times) // 2], steps[-1].get("step_breakdown_s") or [])
    on, off = median["1"][0], median["0"][0]
    where = "; ".join(f"rank {r}: " + ", ".join(f"{p.replace('_', ' ')} {b[p] * 1e3:.0f} ms" for p in PHASES)
                      for r, b in enumerate(median["1"][1][:2]))
    return "passed", f"overlap on {on * 1e3:.1f} ms, off {off * 1e3:.1f} ms a step (off/on {off / on:.2f}); {where}"


def timed(name, n, fn, *args):
    t0 = time.time()
    try:
        status, detail = fn(*args)
    except compare.RunFailed as e:
        status, detail = "failed", str(e).strip().splitlines()[0]
    except Exception as e:  # a row's own error (a missing file, a malformed line): that row fails
        status, detail = "failed", f"{type(e).__name__}: {e}"
    return Row(name, n, status, detail, time.time() - t0)


def main(argv=None):
    a = parse_args(argv)
    keep = bool(a.work)
    a.work = os.path.abspath(a.work) if a.work else tempfile.mkdtemp(prefix="fsdpx-gpu-multi-")
    os.makedirs(a.work, exist_ok=True)
    part = Part(a)
    how = ", ".join(f"{n} ranks " + (f"sharing them (--share-gpus)" if part.shares(n) else "with a device each")
                    for n in a.world_sizes)
    twin = "GPU(s) over NCCL" if a.device == "cuda" else "sim device(s) over sim's NCCL twin"
    print(f"gpu_multi: {a.devices} {twin}: {how}; work {a.work}", flush=True)
    start = time.time()
    refs = {}
    try:
        refs["cpu"], _ = part.losses("reference-cpu-1", "cpu", 1)
        refs["device"], _ = part.losses(f"reference-{a.device}-1", a.device, 1)
    except compare.RunFailed as e:
        print(f"gpu_multi: the one-rank reference runs failed, so no row can be judged: {e}\nruns kept in {a.work}")
        return 1
    jobs = []
    for n in a.world_sizes:
        for name, flags in compositions(n):
            jobs.append((f"losses: {name}", n, losses_row, part, refs, name, flags, n))
        if n >= 4:
            jobs.append(("losses: int reshard_after_forward 2 (library)", n, int_reshard_row, part, n))
        others = [m for m in a.world_sizes if m != n] or [1]
        jobs.append(("resume: async save, other world size", n, resume_row, part, refs, n, others[0]))
        jobs.append(("kill: SIGKILL mid-step", n, kill_row, part, n, signal.SIGKILL))
        jobs.append(("kill: SIGSTOP mid-step", n, kill_row, part, n, signal.SIGSTOP))
    jobs.append(("example: train_loop under torchrun", 2, example_row, part, 2))
    shared = [n for n in a.world_sizes if not (a.device == "cuda" and part.shares(n))]
    jobs.append(("overlap: step time on and off", (shared or a.world_sizes)[-1], overlap_row, part,
                 (shared or a.world_sizes)[-1]))
    with concurrent.futures.ThreadPoolExecutor(max_workers=a.jobs) as pool:
        rows = list(pool.map(lambda j: timed(*j), jobs))
    rows += [timed("bytes: counted on NCCL = the plan's", n, bytes_row, part, n) for n in a.world_sizes]
    rows.sort(key=lambda r: (r.name.split(":")[0], r.ranks, r.name))
    width = max(len(r.name) for r in rows)
    print(f"{'row':<{width}}  ranks  {'verdict':<8} {'s':>5}  detail")
    for r in rows:
        print(f"{r.name:<{width}}  {r.ranks:>5}  {r.verdict:<8} {r.seconds:5.1f}  {r.detail}", flush=True)
    failed = [f"{r.name} at {r.ranks}" for r in rows if r.verdict == "failed"]
    skipped = sum(r.verdict == "not run" for r in rows)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"device": a.device, "devices": a.devices, "world_sizes": a.world_sizes,
                       "seconds": time.time() - start,
                       "rows": [vars(r) for r in rows]}, fh, indent=1)
    if not keep and not failed:
        import shutil
        shutil.rmtree(a.work, ignore_errors=True)
    summary = f"{len(rows) - len(failed) - skipped} passed, {len(failed)} failed, {skipped} not run in " \
              f"{time.time() - start:.0f} s"
    print(f"gpu_multi: {'FAILED: ' + ', '.join(failed) if failed else 'passed'} ({summary})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
