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
     scripts/dcp_to_safetensors.py (as that line says) converts into a folder fsdpx reads.
usage: dcp_interop_test.py BUILD_DIR [WORK_DIR (kept; default: a temporary one)]"""
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

build = sys.argv[1]
work = sys.argv[2] if len(sys.argv) > 2 else None
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
    sd = {k: distribute_tensor(v.clone(), mesh, [Shard(0)]) for k, v in weights.items()}
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

    # 3. What fsdpx cannot read.
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

    if failures:
        print("FAILED:\n" + "\n".join(failures))
        sys.exit(1)
    print("every check passed")


if __name__ == "__main__":
    if work:
        main()
    else:
        with tempfile.TemporaryDirectory() as work:
            main()
