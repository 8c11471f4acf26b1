"""Checkpoints between fsdpx and PyTorch's distributed checkpointing (DCP), both ways, against the
venv's torch on Gloo (CTest's DcpInterop):
  1. fsdpx-train saves gpt tiny sharded at 2 ranks (AdamW, 2 steps); DCP's HuggingFaceStorageReader
     loads it into DTensors sharded over 3 ranks: every parameter and every optimizer tensor equals
     fsdpx-ckpt consolidate's;
  2. PyTorch saves DTensors sharded over 2 ranks with HuggingFaceStorageWriter(save_distributed=True),
     with it and enable_consolidation, and with FileSystemWriter(serialization_format=SAFETENSORS);
     fsdpx-train --init-from each at 3 ranks and --save-init: the weights are PyTorch's, exactly;
  3. what fsdpx cannot read is one line naming the tensor or file: a chunk cut along dimension 1
     (tensor parallel), rows no file holds, and DCP's pickled .distcp, which
     scripts/dcp_to_safetensors.py (as that line says) converts into a folder fsdpx reads;
  4. training goes on across trainers (gpt tiny on tokens, AdamW, fp32): fsdpx trains 3 steps at 2
     ranks; PyTorch FSDP2 (the mirror, benchmarks/vs_fsdp2/gpt_fsdp2.py) dcp.loads that checkpoint
     at 3 ranks and trains 3 more, with the losses of fsdpx's own --resume at 3 ranks within
     kSameLoss; and back: FSDP2 trains 3 steps at 2 ranks and saves with each writer, fsdpx
     --resume at 3 ranks goes on as FSDP2's own resume at 3 ranks does, within kSameLoss;
  5. torchtitan's Llama names (0.3: attention.qkv_linear.wq.weight, lm_head.weight; before:
     attention.wq.weight, output.weight) and its optimizer's (optimizer.state.<p>.<key>): the same
     state under them resumes to the same losses, bit for bit.
usage: dcp_interop_test.py BUILD_DIR formats|trainers|all [WORK_DIR (kept; default: a temporary one)]
(formats: 1-3, trainers: 4-5; two CTest tests, so that they run side by side)"""
import os
import subprocess
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint import FileSystemWriter, HuggingFaceStorageReader, HuggingFaceStorageWriter
from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

# Losses of the same state and batches at 3 ranks, one trainer against the other: the orders of
# addition over 3 ranks differ (measured up to 1.6e-7 over 3 steps); an lr or data order off by
# a step moves them by 1e-2.
kSameLoss = 1e-6

build = sys.argv[1]
part = sys.argv[2] if len(sys.argv) > 2 else "all"
if part not in ("formats", "trainers", "all"):
    sys.exit(f"dcp_interop_test.py: part '{part}' is not formats, trainers or all")
work = sys.argv[3] if len(sys.argv) > 3 else None
bin_dir = os.path.join(build, "bin")
failures = []


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout + p.stderr


def must(cmd):
    rc, out = run(cmd)
    if rc != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {rc}:\n{out[-3000:]}")
    return out


def worker(rank, world, port, job, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        job(init_device_mesh("cpu", (world,)), *args)
    finally:
        dist.destroy_process_group()


def spawn(world, job, *args):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(world, port, job, args), nprocs=world, join=True)


def load_sharded_by_dcp(mesh, step_dir, reference, out):
    """Every tensor of `reference` (names and shapes) as DTensors sharded by rows, loaded by DCP."""
    sd = {k: distribute_tensor(torch.zeros_like(v), mesh, [Shard(0)]) if v.dim() else torch.zeros_like(v)
          for k, v in reference.items()}
    dcp.load(sd, storage_reader=HuggingFaceStorageReader(step_dir))
    full = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v) for k, v in sd.items()}
    if dist.get_rank() == 0:
        torch.save(full, out)


def save_by_dcp(mesh, weights, out, way):
    # Scalars (an optimizer's step) are plain tensors, the same on every rank, as FSDP2 holds them.
    sd = {k: distribute_tensor(v.clone(), mesh, [Shard(0)]) if v.dim() else v.clone() for k, v in weights.items()}
    if way == "hf":
        writer = HuggingFaceStorageWriter(out, save_distributed=True)
    elif way == "hf-consolidated":
        writer = HuggingFaceStorageWriter(out, save_distributed=True, enable_consolidation=True)
    elif way == "filesystem-safetensors":
        from torch.distributed.checkpoint.filesystem import SerializationFormat
        writer = FileSystemWriter(out, serialization_format=SerializationFormat.SAFETENSORS)
    else:
        writer = FileSystemWriter(out)
    dcp.save(sd, storage_writer=writer)


def main():
    train = os.path.join(bin_dir, "fsdpx-train")
    if part != "trainers":
        formats(train)
    if part != "formats":
        across_trainers(train, common_tokens(work))
    if failures:
        print("FAILED:\n" + "\n".join(failures))
        sys.exit(1)
    print("every check passed")


def formats(train):
    common = ["--model.name", "gpt", "--model.size", "tiny", "--model.seq", "32", "--data.name", "synthetic",
              "--data.seq", "32", "--wrap.layer_types", "Block", "--batch-size", "2"]
    # 1. fsdpx's sharded checkpoint, read by DCP at another world size.
    run_dir = os.path.join(work, "fsdpx-run")
    must([train, "--nproc-per-node", "2", *common, "--optimizer.name", "adamw", "--steps", "2",
          "--checkpoint.name", "sharded", "--out", run_dir])
    step_dir = os.path.join(run_dir, "checkpoints", "step-00000002")
    whole = os.path.join(work, "fsdpx-whole.safetensors")
    must([os.path.join(bin_dir, "fsdpx-ckpt"), "consolidate", step_dir, whole])
    reference = load_file(whole)
    loaded_path = os.path.join(work, "dcp-loaded.pt")
    spawn(3, load_sharded_by_dcp, step_dir, reference, loaded_path)
    loaded = torch.load(loaded_path)
    optim = [k for k in reference if k.startswith("optim/")]
    bad = [k for k, v in reference.items() if not torch.equal(loaded[k], v)]
    print(f"fsdpx -> DCP at 3 ranks: {len(reference) - len(optim)} parameters and {len(optim)} optimizer tensors, "
          f"{len(bad)} differ")
    if not optim or bad:
        failures.append(f"fsdpx -> DCP: tensors differ: {bad[:5]} (optimizer tensors: {len(optim)})")

    # 2. PyTorch's checkpoints, read by fsdpx at another world size.
    weights = {k: v * 2 + 0.5 for k, v in reference.items() if not k.startswith("optim/")}
    for way in ["hf", "hf-consolidated", "filesystem-safetensors"]:
        out = os.path.join(work, "dcp-" + way)
        spawn(2, save_by_dcp, weights, out, way)
        init = os.path.join(work, "init-" + way)
        must([train, "--nproc-per-node", "3", *common, "--optimizer.name", "adamw", "--steps", "1",
              "--checkpoint.name", "none", "--init-from", out, "--save-init", init,
              "--out", os.path.join(work, "run-" + way)])
        got = load_file(os.path.join(init, "model.safetensors"))
        bad = [k for k, v in weights.items() if k not in got or not torch.equal(got[k], v)]
        print(f"DCP ({way}) at 2 ranks -> fsdpx --init-from at 3 ranks: {len(weights)} parameters, {len(bad)} differ")
        if bad or len(got) != len(weights):
            failures.append(f"DCP ({way}) -> fsdpx: tensors differ: {bad[:5]}")

    refusals(train, common, weights)


def refusals(train, common, weights):
    """3. What fsdpx cannot read."""
    def refused(folder, expect):
        rc, out = run([train, "--nproc-per-node", "1", *common, "--steps", "1", "--checkpoint.name", "none",
                       "--init-from", folder, "--out", folder + "-run"])
        line = next((l for l in out.splitlines() if expect in l), None)
        print(f"refused: {line}" if rc != 0 and line else f"NOT REFUSED as expected ({expect}): rc {rc}\n{out[-2000:]}")
        if rc == 0 or not line:
            failures.append(f"{folder}: expected a refusal containing {expect!r}")

    name = "layers.0.attention.wq"
    tp = os.path.join(work, "tensor-parallel")
    os.makedirs(tp)
    w = weights[name]
    for r, (cols, offset) in enumerate([(slice(0, 32), 0), (slice(32, 64), 32)]):
        save_file({name: w[:, cols].contiguous()}, os.path.join(tp, f"shard-{r + 1:05}-model-00001-of-00001.safetensors"),
                  metadata={"DCP_SHARDING_INFO": f'{{"{name}": {{"saved_offsets": [0, {offset}]}}}}',
                            "DCP_VERSION": "1.0", "format": "pt"})
    refused(tp, f"tensor '{name}' in ")
    gap = os.path.join(work, "gap")
    os.makedirs(gap)
    save_file({name: w[40:].contiguous()}, os.path.join(gap, "shard-00001-model-00001-of-00001.safetensors"),
              metadata={"DCP_SHARDING_INFO": f'{{"{name}": {{"saved_offsets": [40, 0]}}}}', "format": "pt"})
    refused(gap, f"tensor '{name}': rows [0, 40) are in no file")
    pickled = os.path.join(work, "dcp-pickled")
    spawn(2, save_by_dcp, weights, pickled, "pickled")
    refused(pickled, "DCP's default FileSystemWriter pickles its files")
    # ... and what the message says to run converts it.
    converted = os.path.join(work, "dcp-converted")
    must([sys.executable, os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "dcp_to_safetensors.py"),
          pickled, converted])
    init = os.path.join(work, "init-converted")
    must([train, "--nproc-per-node", "2", *common, "--steps", "1", "--checkpoint.name", "none", "--init-from",
          converted, "--save-init", init, "--out", os.path.join(work, "run-converted")])
    got = load_file(os.path.join(init, "model.safetensors"))
    bad = [k for k, v in weights.items() if not torch.equal(got[k], v)]
    print(f"pickled DCP converted by scripts/dcp_to_safetensors.py -> fsdpx: {len(bad)} of {len(weights)} differ")
    if bad:
        failures.append(f"converted: tensors differ: {bad[:5]}")
    # A folder of weights alone cannot resume AdamW: the line names the state and DCP's names for it.
    rc, out = run([train, "--nproc-per-node", "1", *common, "--optimizer.name", "adamw", "--steps", "2",
                   "--checkpoint.name", "sharded", "--resume", os.path.join(work, "dcp-hf"),
                   "--out", os.path.join(work, "weights-alone-run")])
    line = next((l for l in out.splitlines() if "/exp_avg'" in l and "state.<p>.exp_avg" in l), None)
    print(f"refused: {line}" if rc != 0 and line else f"NOT REFUSED (weights alone, --resume): rc {rc}\n{out[-2000:]}")
    if rc == 0 or not line:
        failures.append("--resume of a DCP folder without optimizer state: no line naming the missing state")


def common_tokens(work):
    sys.path.insert(0, MIRROR_DIR)
    import compare  # the FSDP2 comparison's tokens: Debian's fortunes as uint16
    data = compare.make_tokens(os.path.join(work, "tokens.bin"))
    return data


MIRROR_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks", "vs_fsdp2")


def losses_of(path):
    import json
    with open(path) as f:
        return [j["loss"] for j in map(json.loads, f) if "loss" in j]


def same_losses(what, got, want, exact=False):
    worst = max((abs(g - w) for g, w in zip(got, want)), default=float("inf"))
    ok = len(got) == len(want) == 3 and (worst == 0 if exact else worst <= kSameLoss)
    print(f"{what}: losses {got} against {want}: worst difference {worst:.2e}{'' if ok else '  <-- FAILS'}")
    if not ok:
        failures.append(f"{what}: losses differ by {worst:.2e} (or not 3 steps: {len(got)}, {len(want)})")


def torchtitan_name(name, old):
    """torchtitan's Llama name of gpt's parameter (its state_dict_adapter's names)."""
    import re
    if name == "output.weight" and not old:
        return "lm_head.weight"
    m = re.fullmatch(r"layers\.(\d+)\.(attention\.w[qkvo]|feed_forward\.w[123])", name)
    if not m:
        return name
    if not old and m.group(2) in ("attention.wq", "attention.wk", "attention.wv"):
        return f"layers.{m.group(1)}.attention.qkv_linear.{m.group(2)[-2:]}.weight"
    return name + ".weight"


def across_trainers(train, data):
    mirror = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
    mirror_args = [os.path.join(MIRROR_DIR, "gpt_fsdp2.py"), "--size", "tiny", "--data", data, "--seq", "64",
                   "--batch-size", "2", "--optimizer", "adamw", "--quiet"]
    common = ["--model.name", "gpt", "--model.size", "tiny", "--data.name", "tokens", "--data.path", data,
              "--data.dtype", "uint16", "--data.seq", "64", "--wrap.layer_types", "Block", "--batch-size", "2",
              "--optimizer.name", "adamw", "--checkpoint.name", "sharded", "--log-every", "1"]

    def fsdpx_resume(folder, out):
        must([train, "--nproc-per-node", "3", *common, "--steps", "6", "--resume", folder, "--out", out])
        return losses_of(os.path.join(out, "metrics.jsonl"))

    def fsdp2(nproc, *args):
        p = subprocess.run(mirror + [str(nproc)] + mirror_args + list(args), capture_output=True, text=True,
                           timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
        if p.returncode != 0:
            sys.exit(f"FAIL: the FSDP2 mirror {' '.join(args)} exited {p.returncode}:\n{(p.stdout + p.stderr)[-3000:]}")

    # fsdpx -> FSDP2.
    run_dir = os.path.join(work, "fsdpx-tokens")
    must([train, "--nproc-per-node", "2", *common, "--steps", "3", "--out", run_dir])
    step3 = os.path.join(run_dir, "checkpoints", "step-00000003")
    own = fsdpx_resume(step3, os.path.join(work, "fsdpx-resumed"))
    fsdp2(3, "--resume-dcp", step3, "--steps", "6", "--out", os.path.join(work, "fsdp2-resumed.jsonl"))
    same_losses("fsdpx at 2 ranks -> FSDP2 dcp.load at 3 ranks, steps 4-6 against fsdpx --resume",
                losses_of(os.path.join(work, "fsdp2-resumed.jsonl")), own)

    # FSDP2 -> fsdpx, with each writer.
    saved = os.path.join(work, "fsdp2-saved")
    fsdp2(2, "--steps", "3", "--save-dcp", saved, "--save-dcp-way", "hf,hf-consolidated,filesystem-safetensors",
          "--out", os.path.join(work, "fsdp2-3.jsonl"))
    fsdp2(3, "--resume-dcp", os.path.join(saved, "hf"), "--steps", "6", "--out", os.path.join(work, "fsdp2-6.jsonl"))
    theirs = losses_of(os.path.join(work, "fsdp2-6.jsonl"))
    for way in ["hf", "filesystem-safetensors", os.path.join("hf-consolidated", "sharded")]:
        got = fsdpx_resume(os.path.join(saved, way), os.path.join(work, "fsdpx-from-" + way.replace("/", "-")))
        same_losses(f"FSDP2 at 2 ranks ({way}) -> fsdpx --resume at 3 ranks, steps 4-6 against FSDP2's resume",
                    got, theirs)
    # PyTorch's consolidation writes 0-dimensional tensors (the optimizer's step) as zeros.
    rc, out = run([train, "--nproc-per-node", "1", *common, "--steps", "6", "--resume",
                   os.path.join(saved, "hf-consolidated"), "--out", os.path.join(work, "consolidated-run")])
    line = next((l for l in out.splitlines() if "0-dimensional tensors as zeros" in l), None)
    print(f"refused: {line}" if rc != 0 and line else f"NOT REFUSED: the consolidated folder's step 0: {out[-1500:]}")
    if rc == 0 or not line:
        failures.append("--resume of a consolidated DCP folder (its steps zeroed) was not refused")

    # torchtitan's names, for the state FSDP2 saved: the same losses as under fsdpx's names.
    whole = os.path.join(work, "fsdp2-whole.safetensors")
    must([os.path.join(bin_dir, "fsdpx-ckpt"), "consolidate", os.path.join(saved, "hf"), whole])
    state = load_file(whole)
    for old in (False, True):
        named = {}
        for k, v in state.items():
            if k.startswith("state."):
                param, _, key = k[len("state."):].rpartition(".")
                named[f"optimizer.state.{torchtitan_name(param, old)}.{key}"] = v
            else:
                named[torchtitan_name(k, old)] = v
        version = "before 0.3" if old else "0.3"
        folder = os.path.join(work, "torchtitan-" + ("old" if old else "0.3"))
        spawn(2, save_by_dcp, named, folder, "hf")
        got = fsdpx_resume(folder, folder + "-run")
        ours = losses_of(os.path.join(work, "fsdpx-from-hf", "metrics.jsonl"))
        same_losses(f"torchtitan {version}'s names ({next(n for n in named if 'wq' in n)}) -> fsdpx --resume",
                    got, ours, exact=True)


if __name__ == "__main__":
    if work:
        main()
    else:
        with tempfile.TemporaryDirectory() as work:
            main()
