#!/usr/bin/env python3
"""The table of `make gpu-check`: fsdpx on one GPU, every figure measured in this call.

  1. gpt 1b (2048 wide, 16 layers), bf16_mixed, full_shard, adamw, one rank on one GPU: tokens/s,
     MFU (FLOPs per token counted as torchtitan does, 6*N_non_embedding + 12*L*H*Q*T, x tokens/s
     over the GPU's dense bf16 peak) and peak allocated; where the step goes (CUDA events on the
     compute stream) and the kernels of its last step that took most time (Kineto, --profile-step);
  2. PyTorch FSDP2 (benchmarks/vs_fsdp2/gpt_fsdp2.py, one rank under torchrun, NCCL) on the same
     initial weights (fsdpx-train --save-init) and the same batches: the step-time ratio and the
     peak-allocated ratio fsdpx/FSDP2, and the largest loss difference;
  3. the largest gpt at 1b width (by layers) that trains one step, full_shard and cpu_offload
     (base full_shard), and their ratio: doubling from 16 layers until a run fails, then bisecting;
  4. the 1b step time with --overlap 1 and --overlap 0;
  5. the memory options (docs/memory.md): gpt 1b's peak allocated with --optimizer-in-backward, the
     embedding and output projection as units, activation checkpointing and offload, alone and
     together, against FSDP2's plain peak and FSDP2 with the same units and checkpointing, each a
     short run on the same weights and batches (--options picks them, --no-options leaves them out).
  6. DeepViT (vit with re-attention in the FSDP blog's 8B shape, --deepvit-layers of its 952 blocks,
     on random 256x256 images), full_shard, adamw: samples/s in bf16_mixed and in fp32 and their
     ratio, the blog's "bf16 against fp32" row (its 8B DeepViT: 77% faster); --no-deepvit leaves it out.
  7. float8 (--precision float8: the Blocks' linears in float8, torchao's tensorwise recipe) on gpt 1b:
     tokens/s, MFU (counted against the bf16 peak, so that it compares with part 1's) and peak
     allocated against bf16_mixed's (part 1), and against FSDP2 with torchao's float8 on the same
     weights and batches; --no-float8 leaves it out.
Step times and rates are medians over the steps after the first (it includes warm-up). A run that
fails ends the script with its log's last lines: the table shows only what was measured.

Needs fsdpx built with CUDA (scripts/gpu-check.sh builds it), a Python with torch 2.11.0+cu130
and safetensors, and a GPU with the memory of an H100 (80 GB) for the defaults. fsdpx-train flags
it relies on: --nproc-per-node 1 --device cuda --backend nccl|gloo, the gpt, tokens, layer_type,
bf16_mixed, adamw, full_shard and cpu_offload components, --model.layers, --save-init, --init-from,
--overlap, --peak-tflops, --out (metrics.jsonl: tokens_per_s, mfu, step_time_s,
step_peak_allocated_bytes, which on --device cuda must be the device allocator's).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(HERE, "vs_fsdp2"))
sys.dont_write_bytecode = True  # no __pycache__ left in the checkout
import compare  # noqa: E402  (run, read_steps, make_tokens, find_train, RunFailed: the same runner)
sys.path.insert(0, HERE)
import blog_table  # noqa: E402  (write_random_images: part 6's images)

# Dense (not sparse) bf16 tensor-core peak of one GPU, TFLOPS, from NVIDIA's datasheets (which
# print the sparse figure, twice this). Matched in order against the device's name.
PEAK_TFLOPS = [("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H200 NVL", 835.0), ("H100", 989.0), ("H200", 989.0)]
FIRST_LAYERS = 16  # gpt 1b's own depth: where the search for the largest model starts


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build-dir", default=os.path.join(REPO, "build-gpu"), help="fsdpx's CUDA build")
    p.add_argument("--python", default=sys.executable, help="a Python with torch 2.11.0+cu130 and safetensors")
    p.add_argument("--peak-tflops", type=float, default=0.0,
                   help="the GPU's dense bf16 peak (default: by device name, " +
                        ", ".join(f"{n} {v:g}" for n, v in PEAK_TFLOPS) + ")")
    p.add_argument("--backend", choices=["nccl", "gloo"], default="nccl",
                   help="fsdpx-train --backend: the device group's collectives (gloo: host-staged)")
    p.add_argument("--steps", type=int, default=10, help="steps of each timed run (step 1 left out)")
    p.add_argument("--batch-size", type=int, default=4, help="samples per micro-batch")
    p.add_argument("--seq", type=int, default=2048, help="tokens per sample (gpt 1b's context)")
    p.add_argument("--max-layers", type=int, default=1024, help="the search for the largest model stops here")
    p.add_argument("--no-largest", action="store_true", help="leave out the search for the largest model")
    p.add_argument("--options", type=option_keys, default=option_keys(DEFAULT_OPTIONS),
                   help=f"the memory options measured in part 5, comma-separated (default {DEFAULT_OPTIONS}; "
                        f"all: {','.join(OPTIONS)}): fsdpx-train's --optimizer-in-backward, --wrap.layer_types "
                        f"{UNITS}, --activation-checkpointing Block, --activation-offload Block; --no-options "
                        "leaves them out")
    p.add_argument("--no-options", dest="options", action="store_const", const=[],
                   help="leave out the memory options' peaks (part 5)")
    p.add_argument("--options-steps", type=int, default=3, help="steps of each memory option's run")
    p.add_argument("--deepvit-layers", type=int, default=320,
                   help="blocks of the DeepViT of part 6 (the 8B one's 952 do not fit one GPU with AdamW)")
    p.add_argument("--deepvit-batch", type=int, default=32, help="images per step of part 6")
    p.add_argument("--no-deepvit", action="store_true", help="leave out DeepViT's bf16_mixed against fp32 (part 6)")
    p.add_argument("--no-float8", action="store_true", help="leave out float8 against bf16_mixed and torchao (part 7)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds allowed to each timed run")
    p.add_argument("--probe-timeout", type=float, default=900,
                   help="seconds allowed to each 1-step run of the search (one that takes longer counts as failed)")
    p.add_argument("--work", default="", help="keep every run's files here (default: a temporary directory)")
    p.add_argument("--json", default="", help="also write every figure to this file")
    a = p.parse_args()
    for name, low in (("steps", 2), ("options_steps", 2), ("batch_size", 1), ("seq", 1), ("max_layers", FIRST_LAYERS),
                      ("deepvit_layers", 1), ("deepvit_batch", 1)):
        if getattr(a, name) < low:
            p.error(f"--{name.replace('_', '-')} must be at least {low}, got {getattr(a, name)}")
    if a.peak_tflops < 0 or a.timeout <= 0 or a.probe_timeout <= 0:
        p.error("--peak-tflops must not be negative, and --timeout and --probe-timeout must be positive")
    return a


def gpu(python):
    """(count, name of GPU 0) as torch sees them."""
    code = ("import json, torch; n = torch.cuda.device_count(); "
            "print(json.dumps([n, torch.cuda.get_device_name(0) if n else '']))")
    try:
        r = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"gpu_table: {python} took over 300 s to ask torch for the GPUs")
    if r.returncode != 0:
        raise SystemExit(f"gpu_table: {python} could not ask torch for the GPUs: {r.stderr.strip().splitlines()[-1:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def peak_for(name, given):
    if given > 0:
        return given, "--peak-tflops"
    for key, tflops in PEAK_TFLOPS:
        if key in name:
            return tflops, f"the device-name table ({key})"
    raise SystemExit(f"gpu_table: no dense bf16 peak known for '{name}': give --peak-tflops N (the GPU's datasheet "
                     "figure without sparsity)")


def timed(steps):
    return steps[1:]


def median(steps, key):
    return statistics.median(s[key] for s in timed(steps))


def last_lines(log, n=3):
    try:
        with open(log, errors="replace") as fh:
            lines = [line.strip() for line in fh if line.strip()]
    except OSError:
        return "(no log)"
    return " | ".join(lines[-n:])[-300:]


class Table:
    def __init__(self, a, train, peak):
        self.a, self.train, self.peak = a, train, peak
        self.env = dict(os.environ)

    def fsdpx_cmd(self, out, sharding="full_shard", layers=0, steps=None, extra=(), layer_types="Block",
                  precision="bf16_mixed"):
        a = self.a
        cmd = [self.train, "--nproc-per-node", "1", "--device", "cuda", "--backend", a.backend,
               "--model.name", "gpt", "--model.size", "1b",
               "--data.name", "tokens", "--data.path", a.data, "--data.dtype", "uint16", "--data.seq", str(a.seq),
               "--sharding.name", sharding, "--wrap.name", "layer_type", "--wrap.layer_types", layer_types,
               "--precision.name", precision, "--optimizer.name", "adamw",
               "--steps", str(steps or a.steps), "--batch-size", str(a.batch_size), "--seed", "0",
               "--log-every", "1", "--peak-tflops", repr(self.peak), "--out", out]
        if layers:
            cmd += ["--model.layers", str(layers)]
        return cmd + list(extra)

    def fsdpx(self, name, extra=(), steps=None, layer_types="Block", precision="bf16_mixed"):
        out = os.path.join(self.a.work, name)
        shutil.rmtree(out, ignore_errors=True)
        t = compare.run(self.fsdpx_cmd(out, steps=steps, extra=extra, layer_types=layer_types, precision=precision),
                        out + ".log", self.a.timeout, self.env)
        print(f"  fsdpx {name}: {t:.0f} s", flush=True)
        return compare.read_steps(os.path.join(out, "metrics.jsonl"), steps or self.a.steps)

    def deepvit(self, precision):
        """DeepViT's steps (part 6) in `precision`, on the images file a.images."""
        a = self.a
        out = os.path.join(a.work, "deepvit-" + precision)
        shutil.rmtree(out, ignore_errors=True)
        cmd = [self.train, "--nproc-per-node", "1", "--device", "cuda", "--backend", a.backend,
               "--model.name", "vit", "--model.size", "deepvit-8b", "--model.layers", str(a.deepvit_layers),
               "--data.name", "images", "--data.path", a.images, "--sharding.name", "full_shard",
               "--wrap.name", "layer_type", "--wrap.layer_types", "Block", "--precision.name", precision,
               "--optimizer.name", "adamw", "--steps", str(a.steps), "--batch-size", str(a.deepvit_batch),
               "--seed", "0", "--log-every", "1", "--eval-every", "0", "--checkpoint.name", "none",
               "--peak-tflops", repr(self.peak), "--out", out]
        t = compare.run(cmd, out + ".log", a.timeout, self.env)
        print(f"  fsdpx deepvit {precision}: {t:.0f} s", flush=True)
        return compare.read_steps(os.path.join(out, "metrics.jsonl"), a.steps)

    def init_weights(self):
        """gpt 1b's initial weights, whole, written by fsdpx-train --save-init (one step)."""
        d = os.path.join(self.a.work, "init-1b")
        out = d + "-run"  # beside DIR: --save-init replaces DIR whole
        shutil.rmtree(out, ignore_errors=True)
        t = compare.run(self.fsdpx_cmd(out, steps=1, extra=["--save-init", d]), out + ".log", self.a.timeout, self.env)
        path = os.path.join(d, "model.safetensors")
        if not os.path.isfile(path):
            raise compare.RunFailed(f"fsdpx-train --save-init {d} left no {path} (log: {out}.log)")
        print(f"  initial weights {path}: {t:.0f} s", flush=True)
        return path

    def fsdp2(self, init, name="fsdp2", steps=None, extra=(), precision="bf16_mixed"):
        a = self.a
        steps = steps or a.steps
        out = os.path.join(a.work, name + ".jsonl")
        cmd = [a.python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
               os.path.join(HERE, "vs_fsdp2", "gpt_fsdp2.py"), "--size", "1b", "--data", a.data, "--seq", str(a.seq),
               "--batch-size", str(a.batch_size), "--steps", str(steps), "--seed", "0", "--sharding", "full_shard",
               "--precision", precision, "--optimizer", "adamw", "--init-from", init, "--device", "cuda",
               "--out", out, "--quiet", *extra]
        t = compare.run(cmd, os.path.join(a.work, name + ".log"), a.timeout, self.env)
        print(f"  {name}: {t:.0f} s", flush=True)
        return compare.read_steps(out, steps)

    def probe(self, layers, sharding):
        """Whether gpt at 1b width with this many layers trains one step: (ok, why not)."""
        out = os.path.join(self.a.work, f"largest-{sharding}-{layers}")
        shutil.rmtree(out, ignore_errors=True)
        t0 = time.perf_counter()
        try:
            compare.run(self.fsdpx_cmd(out, sharding=sharding, layers=layers, steps=1), out + ".log",
                        self.a.probe_timeout, self.env)
            ok, why = True, ""
        except compare.RunFailed as e:
            ok, why = False, ("timed out" if "timed out" in str(e) else last_lines(out + ".log", 1))
        secs = time.perf_counter() - t0
        print(f"  {sharding} {layers} layers: {'trained one step' if ok else 'failed: ' + why} ({secs:.0f} s)",
              flush=True)
        shutil.rmtree(out, ignore_errors=True)
        return ok, why

    def largest(self, sharding):
        """The most layers that train one step: doubling from FIRST_LAYERS, then bisecting between
        the last that trained and the first that failed. Returns (layers, first failing, its reason)."""
        cap = self.a.max_layers
        lo, hi, why, n = 0, None, "", FIRST_LAYERS
        while True:
            ok, reason = self.probe(n, sharding)
            if not ok:
                hi, why = n, reason
                break
            lo = n
            if n == cap:
                break
            n = min(2 * n, cap)
        while hi is not None and hi - lo > 1:
            mid = (lo + hi) // 2
            ok, reason = self.probe(mid, sharding)
            if ok:
                lo = mid
            else:
                hi, why = mid, reason
        return {"layers": lo, "first_failing": hi, "failure": why}


def gib(b):
    return f"{b / 2**30:.2f} GiB"


def measure(a, table):
    r = {}
    init = table.init_weights()
    # The last step profiled (Kineto): one of the median's, the kernels that took most time.
    fx = table.fsdpx("fsdpx-overlap1", ["--init-from", init, "--profile-step", str(a.steps)])
    r["kernels"] = read_profile(os.path.join(a.work, "fsdpx-overlap1", "profile.json"))
    f2 = table.fsdp2(init)
    fx_off = table.fsdpx("fsdpx-overlap0", ["--init-from", init, "--overlap", "0"])
    missing = [k for k in ("mfu", "step_peak_allocated_bytes", "tokens_per_s") if k not in fx[-1]]
    if missing:
        raise compare.RunFailed(f"fsdpx-train's metrics.jsonl has no {', '.join(missing)}")
    if "cuda_peak_allocated_bytes" not in f2[-1]:
        raise compare.RunFailed("gpt_fsdp2.py's lines have no cuda_peak_allocated_bytes (did it run on CUDA?)")
    r["fsdpx"] = {"tokens_per_s": median(fx, "tokens_per_s"), "mfu": median(fx, "mfu"),
                  "step_time_s": median(fx, "step_time_s"),
                  "peak_allocated_bytes": max(s["step_peak_allocated_bytes"] for s in fx),
                  "memory_kind": fx[-1].get("memory_kind", ""), "breakdown": breakdown(fx)}
    r["fsdp2"] = {"step_time_s": median(f2, "step_time_s"),
                  "peak_allocated_bytes": max(s["cuda_peak_allocated_bytes"] for s in f2)}
    r["time_ratio"] = r["fsdpx"]["step_time_s"] / r["fsdp2"]["step_time_s"]
    r["memory_ratio"] = r["fsdpx"]["peak_allocated_bytes"] / r["fsdp2"]["peak_allocated_bytes"]
    r["max_abs_loss_diff"] = loss_diff(fx, f2)
    r["overlap_off_step_time_s"] = median(fx_off, "step_time_s")
    if a.options:
        r["options"] = measure_options(a, table, init, fx, r["fsdp2"]["peak_allocated_bytes"])
    if not a.no_largest:
        r["largest"] = {s: table.largest(s) for s in ("full_shard", "cpu_offload")}
    if not a.no_deepvit:
        runs = {p: table.deepvit(p) for p in ("bf16_mixed", "fp32")}
        r["deepvit"] = {p: {"samples_per_s": median(v, "samples_per_s"), "step_time_s": median(v, "step_time_s"),
                            "mfu": median(v, "mfu"),
                            "peak_allocated_bytes": max(s["step_peak_allocated_bytes"] for s in v)}
                        for p, v in runs.items()}
    if not a.no_float8:
        f8 = table.fsdpx("fsdpx-float8", ["--init-from", init], precision="float8")
        r["float8"] = {"tokens_per_s": median(f8, "tokens_per_s"), "mfu": median(f8, "mfu"),
                       "step_time_s": median(f8, "step_time_s"),
                       "peak_allocated_bytes": max(s["step_peak_allocated_bytes"] for s in f8)}
        # The GPU machine's Python may lack torchao (scripts/setup.sh's venv has it): then no FSDP2 row.
        has_torchao = subprocess.run([a.python, "-c", "import torchao.float8"], capture_output=True).returncode == 0
        if has_torchao:
            t8 = table.fsdp2(init, name="fsdp2-float8", precision="float8")
            r["float8"].update({"fsdp2_step_time_s": median(t8, "step_time_s"),
                                "fsdp2_peak_allocated_bytes": max(s["cuda_peak_allocated_bytes"] for s in t8),
                                "max_abs_loss_diff": loss_diff(f8, t8)})
    return r


def float8_rows(fx, f):
    row("gpt 1b tokens/s, float8", f"{f['tokens_per_s']:.0f}",
        f"MFU {100 * f['mfu']:.1f}% (of the bf16 peak), peak {gib(f['peak_allocated_bytes'])}")
    row("float8 / bf16_mixed tokens/s", f"{f['tokens_per_s'] / fx['tokens_per_s']:.2f}",
        f"peak allocated {f['peak_allocated_bytes'] / fx['peak_allocated_bytes']:.2f}x bf16_mixed's; "
        "torchtitan's Llama 3.1 8B: 1.28")
    if "fsdp2_step_time_s" not in f:
        row("fsdpx / FSDP2+torchao float8 step", "-", "torchao is not installed in --python: not measured")
        return
    row("fsdpx / FSDP2+torchao float8 step", f"{f['step_time_s'] / f['fsdp2_step_time_s']:.2f}",
        f"fsdpx {f['step_time_s'] * 1e3:.1f} ms, FSDP2 {f['fsdp2_step_time_s'] * 1e3:.1f} ms; peak "
        f"{f['peak_allocated_bytes'] / f['fsdp2_peak_allocated_bytes']:.2f}x; max |loss diff| "
        f"{f['max_abs_loss_diff']:.1e}")


def deepvit_rows(a, d):
    b, f = d["bf16_mixed"], d["fp32"]
    detail = f"{a.deepvit_layers} of the 8B DeepViT's 952 blocks, batch {a.deepvit_batch}, full_shard, adamw"
    row("DeepViT samples/s, bf16_mixed", f"{b['samples_per_s']:.1f}",
        f"{detail}; MFU {100 * b['mfu']:.1f}%, peak {gib(b['peak_allocated_bytes'])}")
    row("DeepViT samples/s, fp32", f"{f['samples_per_s']:.1f}", f"peak {gib(f['peak_allocated_bytes'])}")
    row("DeepViT bf16_mixed / fp32", f"{b['samples_per_s'] / f['samples_per_s']:.2f}",
        "the FSDP blog's 8B DeepViT: 1.77 (77% faster)")


UNITS = compare.EMBEDDING_UNITS
AC = ["--activation-checkpointing", "Block"]
OIB = ["--optimizer-in-backward"]
# The memory options (docs/memory.md), each: key -> (fsdpx-train's extra flags, its wrap's layer types, the
# FSDP2 run that holds the same units and recomputes the same: a key of FSDP2_RUNS).
OPTIONS = {"oib": (OIB, "Block", "plain"),
           "units": ([], UNITS, "units"),
           "units+oib": (OIB, UNITS, "units"),
           "ac": (AC, "Block", "ac"),
           "ac+oib": (AC + OIB, "Block", "ac"),
           "ac+units+oib": (AC + OIB, UNITS, "ac+units"),
           "ac+offload+units+oib": (AC + ["--activation-offload", "Block"] + OIB, UNITS, "ac+units")}
DEFAULT_OPTIONS = "ac,ac+oib,ac+offload+units+oib"  # about 90 s on an H200 (the others: --options)
FSDP2_RUNS = {"units": ["--embedding-units"], "ac": ["--activation-checkpointing"],
              "ac+units": ["--activation-checkpointing", "--embedding-units"]}


def option_keys(text):
    keys = [k for k in text.split(",") if k]
    bad = [k for k in keys if k not in OPTIONS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown memory option(s) {', '.join(bad)}: the keys are "
                                         f"{', '.join(OPTIONS)}")
    return keys


def measure_options(a, table, init, fx, fsdp2_peak):
    """Peak allocated of each memory option against FSDP2's plain peak (the runs above) and FSDP2 with the
    same units and recomputation; each option's step time and largest loss difference against a plain run
    of the same length made here. On CUDA the same run differs from itself by its kernels' order of
    additions (cuDNN's attention backward, atomics): the plain run's loss difference to the first steps of
    the timed run above is that noise, the scale the options' differences compare with."""
    n = min(a.options_steps, a.steps)
    plain = table.fsdpx("fsdpx-options-plain", ["--init-from", init], steps=n)
    refs = {"plain": fsdp2_peak}
    for key in dict.fromkeys(OPTIONS[k][2] for k in a.options):
        if key not in refs:
            run = table.fsdp2(init, "fsdp2-" + key.replace("+", "-"), steps=n, extra=FSDP2_RUNS[key])
            refs[key] = max(s["cuda_peak_allocated_bytes"] for s in run)
    rows = []
    for key in a.options:
        extra, types, ref = OPTIONS[key]
        run = table.fsdpx("fsdpx-" + key.replace("+", "-"), ["--init-from", init, *extra], steps=n,
                          layer_types=types)
        peak = max(s["step_peak_allocated_bytes"] for s in run)
        rows.append({"option": key, "flags": " ".join(extra + ["--wrap.layer_types", types]),
                     "peak_allocated_bytes": peak, "vs_fsdp2": peak / fsdp2_peak, "fsdp2_same": ref,
                     "vs_fsdp2_same": peak / refs[ref], "max_abs_loss_diff_to_plain": loss_diff(run, plain),
                     "step_time_ratio_to_plain": median(run, "step_time_s") / median(plain, "step_time_s")})
    return {"steps": n, "plain_peak_allocated_bytes": max(s["step_peak_allocated_bytes"] for s in plain),
            "plain_step_time_s": median(plain, "step_time_s"), "run_to_run_loss_diff": loss_diff(plain, fx),
            "fsdp2_peak_allocated_bytes": refs, "rows": rows}


def loss_diff(xs, ys):
    return max(abs(x["loss"] - y["loss"]) for x, y in zip(xs, ys))


PHASES = ("forward", "backward", "all_gather_wait", "reduce_scatter_wait", "optimizer", "other")


def breakdown(steps):
    """Per rank, the median over the timed steps of each phase's seconds (metrics.jsonl's step_breakdown_s:
    CUDA events on the compute stream, fsdpx/framework/runtime/step_clock.h); [] when the lines have none."""
    lines = [s["step_breakdown_s"] for s in timed(steps) if "step_breakdown_s" in s]
    if not lines:
        return []
    return [{p: statistics.median(line[r][p] for line in lines) for p in PHASES} for r in range(len(lines[0]))]


def read_profile(path):
    """fsdpx-train --profile-step's profile.json (Kineto: the kernels of one step by device time), or None."""
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def kernel_rows(profile, n=10):
    if not profile:
        row("largest kernels of a step", "-", "no profile.json (fsdpx-train --profile-step)")
        return
    row(f"largest kernels of step {profile['step']}", f"{profile['total_s'] * 1e3:.1f} ms", profile["what"])
    for k in profile["top"][:n]:
        row(f"  {k['name'][:38]}", f"{k['seconds'] * 1e3:.1f} ms", f"{100 * k['share']:.0f}%, {k['calls']} calls")


def breakdown_rows(ranks, step_time):
    if not ranks:
        row("where the step goes", "-", "metrics.jsonl has no step_breakdown_s")
        return
    for p in PHASES:
        values = [r[p] for r in ranks]
        per_rank = ", ".join(f"{v * 1e3:.1f}" for v in values) if len(values) > 1 else ""
        row(f"  {p.replace('_', ' ')}", f"{max(values) * 1e3:.1f} ms",
            f"{100 * max(values) / step_time:.0f}% of the step" + (f"; per rank {per_rank} ms" if per_rank else ""))


def options_rows(o):
    refs = o["fsdp2_peak_allocated_bytes"]
    row(f"memory options ({o['steps']} steps each)", "", f"fsdpx plain {gib(o['plain_peak_allocated_bytes'])}, "
        f"{o['plain_step_time_s'] * 1e3:.1f} ms, |loss diff| to its own first run {o['run_to_run_loss_diff']:.1e}; "
        "FSDP2 " + ", ".join(f"{k} {gib(v)}" for k, v in refs.items()))
    for x in o["rows"]:
        same = "" if x["fsdp2_same"] == "plain" else f", {x['vs_fsdp2_same']:.2f}x FSDP2 {x['fsdp2_same']}"
        row(f"  {x['option']}", gib(x["peak_allocated_bytes"]),
            f"{x['vs_fsdp2']:.2f}x FSDP2{same}; step {x['step_time_ratio_to_plain']:.2f}x plain; "
            f"max |loss diff| to plain {x['max_abs_loss_diff_to_plain']:.1e}")


def row(figure, value, detail=""):
    print(f"{figure:<40} {value:>14}   {detail}".rstrip())


def largest_rows(r):
    for s, g in r["largest"].items():
        if g["first_failing"] is None:
            detail = f"every size tried trained, up to --max-layers {g['layers']}"
        else:
            detail = f"{g['first_failing']} failed: {g['failure']}"[:110]
        row(f"largest gpt at 1b width, {s}", f"{g['layers']} layers", detail)
    fs, off = r["largest"]["full_shard"]["layers"], r["largest"]["cpu_offload"]["layers"]
    row("cpu_offload / full_shard (layers)", f"{off / fs:.2f}" if fs else "-",
        "" if fs else "full_shard trained no size")


def report(a, r, name, count, peak, peak_from):
    fx, f2 = r["fsdpx"], r["fsdp2"]
    print(f"\n== fsdpx on {name} ({count} GPU(s) visible, one used; dense bf16 peak {peak:g} TFLOPS from {peak_from})")
    print(f"   gpt 1b, bf16_mixed, full_shard, adamw, 1 rank ({a.backend}); batch {a.batch_size} x seq {a.seq}; "
          f"{a.steps} steps, medians over steps 2 on")
    row("figure", "value", "detail")
    row("gpt 1b tokens/s", f"{fx['tokens_per_s']:.0f}", f"step time {fx['step_time_s'] * 1e3:.1f} ms")
    row("gpt 1b MFU", f"{100 * fx['mfu']:.1f}%",
        f"FLOPs per token as torchtitan counts (6*N_non_embedding + 12*L*H*Q*T) x tokens/s / {peak:g} TFLOPS")
    row("gpt 1b peak allocated", gib(fx["peak_allocated_bytes"]),
        f"max over steps of step_peak_allocated_bytes ({fx['memory_kind'] or 'kind not given'})")
    row("where the step goes (CUDA events)", "", "compute stream, median over steps; waits = its stalls")
    breakdown_rows(fx["breakdown"], fx["step_time_s"])
    kernel_rows(r.get("kernels"))
    row("fsdpx / FSDP2 step time", f"{r['time_ratio']:.2f}",
        f"fsdpx {fx['step_time_s'] * 1e3:.1f} ms, FSDP2 {f2['step_time_s'] * 1e3:.1f} ms; same weights and batches")
    row("fsdpx / FSDP2 peak allocated", f"{r['memory_ratio']:.2f}",
        f"fsdpx {gib(fx['peak_allocated_bytes'])}, FSDP2 {gib(f2['peak_allocated_bytes'])} "
        f"(torch.cuda.max_memory_allocated); max |loss diff| {r['max_abs_loss_diff']:.1e}")
    if "options" in r:
        options_rows(r["options"])
    if "largest" in r:
        largest_rows(r)
    if "deepvit" in r:
        deepvit_rows(a, r["deepvit"])
    if "float8" in r:
        float8_rows(fx, r["float8"])
    row("step time, overlap on", f"{fx['step_time_s'] * 1e3:.1f} ms", "--overlap 1 (the runs above)")
    row("step time, overlap off", f"{r['overlap_off_step_time_s'] * 1e3:.1f} ms",
        f"--overlap 0; off/on {r['overlap_off_step_time_s'] / fx['step_time_s']:.2f}")


def main():
    a = parse_args()
    try:
        train = compare.find_train(a.build_dir)
    except SystemExit:
        raise SystemExit(f"gpu_table: no fsdpx-train under {a.build_dir}/bin: build it (scripts/gpu-check.sh "
                         "--build-only) or give --build-dir")
    count, name = gpu(a.python)
    if count == 0:
        raise SystemExit("gpu_table: no GPU visible to torch (torch.cuda.device_count() is 0); run it on the GPU "
                         "machine")
    peak, peak_from = peak_for(name, a.peak_tflops)
    keep = bool(a.work)
    a.work = os.path.abspath(a.work) if a.work else tempfile.mkdtemp(prefix="fsdpx-gpu-table-")
    os.makedirs(a.work, exist_ok=True)
    a.data = compare.make_tokens(os.path.join(a.work, "tokens.bin"))
    if not a.no_deepvit:
        a.images = os.path.join(a.work, "images.safetensors")
        blog_table.write_random_images(a.images, 4 * a.deepvit_batch, 256)
    print(f"gpu_table: {train} on {name}; FSDP2 from {a.python}; work {a.work}", flush=True)
    t0 = time.perf_counter()
    try:
        r = measure(a, Table(a, train, peak))
    except compare.RunFailed as e:
        print(f"gpu_table: a run failed, so there is no table: {e}\nruns kept in {a.work}", flush=True)
        return 2
    report(a, r, name, count, peak, peak_from)
    print(f"(measured in {(time.perf_counter() - t0) / 60:.1f} min)")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"device": name, "peak_tflops": peak, "peak_from": peak_from, "batch_size": a.batch_size,
                       "seq": a.seq, "steps": a.steps, **r}, fh, indent=1)
    if keep:
        print(f"runs kept in {a.work}")
    else:
        shutil.rmtree(a.work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
