"""fsdpx as a library (examples/train_loop, built against the installed package by sdk_consumer_build):
its losses, sharded over 1, 2 and 4 CPU ranks and 2 sim ranks, equal the same loop
without fsdpx in one process within 1e-6 (fp32), for full_shard, shard_grad_op, hybrid_shard and
cpu_offload, and with prefetch depth 2; each rank holds 1/S of the parameter bytes (S: its shard
group's size, plus padding); a write inside a writable summon_full_params reaches the shards (the
next loss and the weights' sum as the plain loop's after the same write); a checkpoint saved at 2
ranks loads at 3 and the losses go on as the plain loop's; a bad plugin name is one line naming
the right one. The ranks of two runs (2 CPU ranks, full_shard; the save at 2 ranks) are started by
torchrun, and those of the others directly, with the variables torchrun sets (and one thread each):
that skips torchrun's 3 s of Python per run.
usage: train_loop_test.py EXAMPLE PYTHON"""
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

example, python = sys.argv[1], sys.argv[2]
failures = []


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(ranks, cmd, torchrun):
    """The ranks' stdout, joined; the ranks under torchrun, or started with the variables it sets."""
    port = str(free_port())
    if torchrun:
        cmd = [python, "-m", "torch.distributed.run", "--no-python", "--nproc-per-node", str(ranks),
               "--master-port", port] + cmd
    if torchrun or not ranks:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout}\n{p.stderr[-3000:]}")
        return p.stdout
    env = dict(os.environ, WORLD_SIZE=str(ranks), LOCAL_WORLD_SIZE=str(ranks), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=port, OMP_NUM_THREADS="1")
    files = [(tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) for _ in range(ranks)]
    procs = [subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)))
             for r, (out, err) in enumerate(files)]
    try:  # the first rank to fail ends the run (the others would wait for it in a collective)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            codes = [p.poll() for p in procs]
            if any(codes) or None not in codes:
                break
            time.sleep(0.05)
        codes = [p.poll() for p in procs]
        bad = [r for r, c in enumerate(codes) if c not in (0, None)] or [r for r, c in enumerate(codes) if c is None]
        if bad:
            r = bad[0]
            files[r][1].seek(0)
            files[r][0].seek(0)
            raise RuntimeError(f"rank {r} of {ranks}: {' '.join(cmd)} "
                               f"{'ran past 180 s' if codes[r] is None else f'exited {codes[r]}'}:\n"
                               f"{files[r][0].read()}\n{files[r][1].read()[-3000:]}")
    finally:
        for p in procs:
            p.kill()
            p.wait()
    text = ""
    for out, err in files:
        out.seek(0)
        text += out.read()
        out.close()
        err.close()
    return text


def run(ranks, args, torchrun=False):
    stdout = start(ranks, [example] + args, torchrun)
    losses, held, after = {}, {}, []
    for line in stdout.splitlines():
        m = re.match(r"rank (\d+) weights sum (\S+) next loss (\S+)", line)
        if m:
            after.append((float(m.group(2)), float(m.group(3))))
        m = re.match(r"rank (\d+) step (\d+) loss (\S+)", line)
        if m:
            losses.setdefault(int(m.group(2)), []).append(float(m.group(3)))
        m = re.match(r"rank (\d+) holds (\d+) parameter bytes of the model's (\d+)", line)
        if m:
            held[int(m.group(1))] = (int(m.group(2)), int(m.group(3)))
    # Each rank's loss is the mean over its equal part of the batch: their mean is the batch's.
    mean = {step: sum(v) / len(v) for step, v in losses.items()}
    if after:  # every rank's weights sum (the same), and the next batch's loss, averaged
        mean["after"] = (after[0][0], sum(a[1] for a in after) / len(after))
    return mean, held


plain_by_step, _ = run(0, ["--plain", "--halve-head"])
plain = [plain_by_step[s] for s in range(5)]
print(f"plain loop: {len(plain)} steps, losses {', '.join(f'{x:.9g}' for x in plain)}")
cases = [(1, "cpu", "full_shard", [], 1), (2, "cpu", "full_shard", [], 2), (2, "cpu", "shard_grad_op", [], 2),
         (2, "cpu", "hybrid_shard", ["shard_size=1"], 1), (2, "cpu", "cpu_offload", [], 2),
         (4, "cpu", "full_shard", [], 4), (4, "cpu", "hybrid_shard", ["shard_size=2"], 2),
         (4, "cpu", "cpu_offload", ["base=hybrid_shard", "shard_size=2"], 2),
         (2, "sim", "full_shard", [], 2), (2, "sim", "cpu_offload", [], 2), (2, "cpu", "full_shard", ["2"], 2)]
for ranks, device, sharding, options, shard_size in cases:
    args = ["--device", device, "--sharding", sharding]
    if options == ["2"]:
        args, options = args + ["--prefetch", "2"], ["(prefetch 2)"]
    for o in options:
        args += ["--option", o] if "=" in o else []
    name = ' '.join([sharding] + options) + f" at {ranks} {device} rank(s)"
    by_step, held = run(ranks, args, torchrun=(ranks, device, sharding, options) == (2, "cpu", "full_shard", []))
    losses = [by_step[s] for s in sorted(k for k in by_step if k != "after")]
    diff = max(abs(a - b) for a, b in zip(losses, plain)) if len(losses) == len(plain) else float("inf")
    worst = max(abs(h / (m / shard_size) - 1) for h, m in held.values()) if len(held) == ranks else float("inf")
    print(f"{name}: max |loss - plain| {diff:.2e}; parameter bytes per rank / (model's / {shard_size}) - 1 "
          f"at most {worst:.4f}")
    if not diff <= 1e-6:
        failures.append(f"{name}: losses {losses} differ from the plain loop's {plain} by {diff:.2e} (> 1e-6)")
    if not worst <= 0.01:  # padding to equal shards: 0.2% here
        failures.append(f"{name}: a rank holds {held}, not 1/{shard_size} of the model's parameter bytes")

# A write inside a writable summon_full_params (the head's weight halved) reaches the shards.
by_step, _ = run(2, ["--halve-head"])
(sum_f, loss_f), (sum_p, loss_p) = by_step["after"], plain_by_step["after"]
print(f"summon_full_params at 2 ranks, head halved: weights sum {sum_f:.9g} (plain {sum_p:.9g}), "
      f"next loss {loss_f:.9g} (plain {loss_p:.9g})")
if abs(sum_f - sum_p) > 1e-6 * abs(sum_p) or abs(loss_f - loss_p) > 1e-6:
    failures.append(f"summon_full_params: weights sum {sum_f} and next loss {loss_f} after the write, "
                    f"the plain loop's {sum_p} and {loss_p}")

# A checkpoint saved from the library at 2 ranks after 2 steps, loaded at 3 ranks for steps 2 to 4.
with tempfile.TemporaryDirectory() as tmp:
    run(2, ["--steps", "2", "--save", f"{tmp}/step-2"], torchrun=True)
    by_step, _ = run(3, ["--steps", "5", "--load", f"{tmp}/step-2"])
resumed = [by_step.get(s, float("nan")) for s in range(2, 5)]
diff = max(abs(a - b) for a, b in zip(resumed, plain[2:]))
print(f"saved at 2 ranks after step 2, loaded at 3: steps 2-4 max |loss - plain| {diff:.2e}")
if not diff <= 1e-6:
    failures.append(f"resumed at 3 ranks: losses {resumed}, the plain loop's {plain[2:]}")

bad = subprocess.run([example, "--sharding", "full_shrd"], capture_output=True, text=True, timeout=60)
print(f"--sharding full_shrd: exit {bad.returncode}, {bad.stderr.strip()}")
if bad.returncode != 1 or "full_shard" not in bad.stderr or len(bad.stderr.strip().splitlines()) != 1:
    failures.append(f"a misspelt sharding plugin: exit {bad.returncode}, stderr {bad.stderr!r}")

for f in failures:
    print("FAILED:", f)
sys.exit(1 if failures else 0)
