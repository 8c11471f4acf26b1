#!/usr/bin/env python3
"""The several-GPU part of `make gpu-check`: fsdpx with one rank per GPU over NCCL.

  1. losses against the CPU: gpt tiny, 5 steps of AdamW at fp32, with full_shard, shard_grad_op,
     hybrid_shard (shard groups of half the ranks, or of 1 at 2 ranks) and cpu_offload, on the
     device (--device cuda: NCCL) and on the CPU (Gloo) from the same seed: the largest loss
     difference, which must be within --tolerance (fp32 kernels differ between devices);
  2. the step time with --overlap 1 and --overlap 0 (gpt at 1b width, 4 layers, bf16_mixed; on sim
     gpt small), medians over the steps after the first, with where each step goes
     (step_breakdown_s: CUDA events on the compute stream, the waits being its stalls);
  3. a rank killed mid-step: N ranks started as torchrun starts them, the last killed (SIGKILL)
     once rank 0 has logged step 2; rank 0 must end naming it, within --collective-timeout.
Each part prints its verdict; the exit status is 0 when every check passed, 1 when one failed, 2
when a run failed to produce figures. --device sim runs the same on sim's NCCL twin, which is how
the script itself is tested without a GPU (tests/CMakeLists.txt: GpuMulti.*).
"""
import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "vs_fsdp2"))
import compare  # noqa: E402  (run, read_steps, find_train, RunFailed: the same runner)

STRATEGIES = ("full_shard", "shard_grad_op", "hybrid_shard", "cpu_offload")
PHASES = ("forward", "backward", "all_gather_wait", "reduce_scatter_wait", "optimizer", "other")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n", 2)[2])
    p.add_argument("--build-dir", required=True, help="the fsdpx build directory (holding bin/fsdpx-train)")
    p.add_argument("--ranks", type=int, required=True, help="ranks, one per device (the GPUs visible)")
    p.add_argument("--device", choices=("cuda", "sim"), default="cuda")
    p.add_argument("--tolerance", type=float, default=1e-5, help="the largest loss difference from the CPU allowed")
    p.add_argument("--steps", type=int, default=5, help="steps of each run")
    p.add_argument("--collective-timeout", type=float, default=60.0)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per run before it is stopped")
    p.add_argument("--work", default="", help="keep the runs here (default: a temporary directory, removed)")
    p.add_argument("--json", default="", help="also write the figures here")
    a = p.parse_args(argv)
    if a.ranks < 2:
        p.error(f"--ranks must be 2 or more (one per GPU), got {a.ranks}")
    return a


def sharding_args(strategy, ranks):
    if strategy == "hybrid_shard":
        return ["--sharding.name", "hybrid_shard", "--sharding.shard_size", str(ranks // 2 if ranks >= 4 else 1)]
    if strategy == "cpu_offload":
        return ["--sharding.name", "cpu_offload", "--sharding.base", "full_shard"]
    return ["--sharding.name", strategy]


def train_cmd(a, train, device, ranks, out, extra):
    return [train, "--nproc-per-node", str(ranks), "--device", device, "--model.size", "tiny",
            "--data.name", "synthetic", "--optimizer.name", "adamw", "--steps", str(a.steps), "--log-every", "1",
            "--seed", "0", "--peak-tflops", "1", "--out", out] + extra


def losses(a, train):
    """Part 1: each strategy on the device and on the CPU; returns {strategy: max |loss diff|}."""
    out = {}
    for s in STRATEGIES:
        steps = {}
        for device in (a.device, "cpu"):
            d = os.path.join(a.work, f"{s}-{device}")
            compare.run(train_cmd(a, train, device, a.ranks, d, sharding_args(s, a.ranks)), d + ".log", a.timeout,
                        dict(os.environ))
            steps[device] = compare.read_steps(os.path.join(d, "metrics.jsonl"), a.steps)
        out[s] = max(abs(x["loss"] - y["loss"]) for x, y in zip(steps[a.device], steps["cpu"]))
        print(f"  {s}: max |loss diff| {out[s]:.1e}", flush=True)
    return out


def timing(a, train):
    """Part 2: overlap on and off; returns {overlap: (median step time, per-rank median breakdown)}."""
    model = (["--model.size", "1b", "--model.layers", "4", "--precision.name", "bf16_mixed", "--batch-size", "2"]
             if a.device == "cuda" else ["--model.size", "small"])
    out = {}
    for overlap in ("1", "0"):
        d = os.path.join(a.work, f"overlap{overlap}")
        cmd = train_cmd(a, train, a.device, a.ranks, d, ["--overlap", overlap, "--wrap.name", "layer_type",
                                                         "--wrap.layer_types", "Block"])
        cmd[cmd.index("--model.size"):cmd.index("--model.size") + 2] = model
        compare.run(cmd, d + ".log", a.timeout, dict(os.environ))
        steps = compare.read_steps(os.path.join(d, "metrics.jsonl"), a.steps)[1:]
        lines = [s["step_breakdown_s"] for s in steps if s.get("step_breakdown_s")]
        per_rank = [{p: statistics.median(line[r][p] for line in lines) for p in PHASES}
                    for r in range(len(lines[0]))] if lines else []
        out[overlap] = (statistics.median(s["step_time_s"] for s in steps), per_rank)
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def killed_rank(a, train):
    """Part 3: returns (seconds from the kill to rank 0's end, whether rank 0 named the killed rank, its last line)."""
    d = os.path.join(a.work, "kill")
    os.makedirs(d, exist_ok=True)
    port, victim = str(free_port()), a.ranks - 1
    procs = []
    for r in range(a.ranks):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(a.ranks), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(a.ranks),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        cmd = [train, "--device", a.device, "--model.size", "tiny", "--model.layers", "8", "--data.name", "synthetic",
               "--steps", "100000", "--log-every", "1", "--watch-peers", "--collective-timeout",
               str(int(a.collective_timeout)), "--peak-tflops", "1"]
        procs.append(subprocess.Popen(cmd, env=env, stdout=open(os.path.join(d, f"r{r}.out"), "w"),
                                      stderr=open(os.path.join(d, f"r{r}.err"), "w"), start_new_session=True))
    try:
        deadline = time.time() + a.timeout
        while time.time() < deadline:
            with open(os.path.join(d, "r0.out"), errors="replace") as fh:
                if "step 2/" in fh.read():
                    break
            if procs[0].poll() is not None:
                raise compare.RunFailed(f"rank 0 ended before step 2 (see {d}/r0.err)")
            time.sleep(0.1)
        killed = time.time()
        procs[victim].send_signal(signal.SIGKILL)
        try:
            procs[0].wait(timeout=a.collective_timeout + 30)
        except subprocess.TimeoutExpired:
            raise compare.RunFailed(f"rank 0 still ran {a.collective_timeout + 30:.0f} s after rank {victim} was killed")
        after = time.time() - killed
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    with open(os.path.join(d, "r0.err"), errors="replace") as fh:
        err = fh.read()
    named = f"rank {victim}" in err
    last = err.strip().splitlines()[-1] if err.strip() else "(nothing on stderr)"
    return after, named, last


def main(argv=None):
    a = parse_args(argv)
    train = compare.find_train(a.build_dir)
    keep = bool(a.work)
    a.work = os.path.abspath(a.work) if a.work else tempfile.mkdtemp(prefix="fsdpx-gpu-multi-")
    os.makedirs(a.work, exist_ok=True)
    what = "GPUs over NCCL" if a.device == "cuda" else "sim devices over sim's NCCL twin"
    print(f"gpu_multi: fsdpx on {a.ranks} {what}, one rank each; work {a.work}", flush=True)
    failed, figures = [], {"ranks": a.ranks, "device": a.device}
    try:
        print("losses against the CPU (gpt tiny, adamw, fp32):", flush=True)
        figures["loss_diff"] = diffs = losses(a, train)
        bad = [s for s, d in diffs.items() if not d <= a.tolerance]
        print(f"losses: {'ok' if not bad else 'FAILED for ' + ', '.join(bad)} (tolerance {a.tolerance:g})")
        failed += [f"losses of {s}" for s in bad]
        figures["timing"] = t = timing(a, train)
        on, off = t["1"][0], t["0"][0]
        print(f"step time: overlap on {on * 1e3:.1f} ms, off {off * 1e3:.1f} ms: off/on {off / on:.2f}")
        for r, b in enumerate(t["1"][1]):
            print(f"  rank {r}, overlap on: " + ", ".join(f"{p.replace('_', ' ')} {b[p] * 1e3:.1f} ms" for p in PHASES))
        after, named, last = killed_rank(a, train)
        figures["kill"] = {"seconds": after, "named": named}
        ok = named and after <= a.collective_timeout
        print(f"a rank killed mid-step: rank 0 ended {after:.1f} s after, {'naming' if named else 'NOT naming'} it "
              f"(collective timeout {a.collective_timeout:g} s): {'ok' if ok else 'FAILED'}; its last line: {last}")
        if not ok:
            failed.append("the killed rank")
    except compare.RunFailed as e:
        print(f"gpu_multi: a run failed, so the figures stop here: {e}\nruns kept in {a.work}", flush=True)
        return 2
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(figures, fh, indent=1)
    if not keep and not failed:
        import shutil
        shutil.rmtree(a.work, ignore_errors=True)
    print(f"gpu_multi: {'FAILED: ' + ', '.join(failed) if failed else 'passed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
