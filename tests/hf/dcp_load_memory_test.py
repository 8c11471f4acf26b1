"""Loading a checkpoint PyTorch wrote holds no more than one tensor's rows beyond the rank's shards
(CTest's DcpInterop.LoadingPyTorchsCheckpointAddsAtMostOneTensorsRows): PyTorch's DCP saves gpt at
1b width (dim 2048, 2 layers, vocabulary 32000: 235M parameters, 940 MB in fp32) as DTensors over
2 ranks with HuggingFaceStorageWriter(save_distributed=True); fsdpx-ckpt-bench --load reads it at 2
ranks and reports the peak RSS the load adds on the worst rank (VmHWM over the RSS before it),
which must be at most the largest tensor's rows on a rank (half the embedding: 131 MB). Measured:
0.9 MB.
usage: dcp_load_memory_test.py BUILD_DIR [WORK_DIR (kept; default: a temporary one)]"""
import os
import re
import socket
import subprocess
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.checkpoint import HuggingFaceStorageWriter
from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks", "vs_fsdp2"))
import gpt_fsdp2  # noqa: E402  the gpt mirror: fsdpx's names and shapes

SIZE = ["--dim", "2048", "--layers", "2", "--vocab", "32000"]


def save(rank, world, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        cfg = gpt_fsdp2.model_config(gpt_fsdp2.parse_args(["--size", "1b", "--heads", "16", "--data", "-", *SIZE]))
        with torch.device("meta"):
            model = gpt_fsdp2.Transformer(cfg)
        sd = {}
        for i, (name, p) in enumerate(model.state_dict().items()):
            g = torch.Generator().manual_seed(i)  # the same whole tensor on every rank, each keeps its rows
            sd[name] = distribute_tensor(torch.randn(p.shape, generator=g), mesh, [Shard(0)])
        dcp.save(sd, storage_writer=HuggingFaceStorageWriter(out, save_distributed=True))
    finally:
        dist.destroy_process_group()


def main(build, work):
    out = os.path.join(work, "dcp-1b")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(save, args=(2, port, out), nprocs=2, join=True)
    cmd = [os.path.join(build, "bin", "fsdpx-ckpt-bench"), "--nproc-per-node", "2", *SIZE, "--load", out]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    text = p.stdout + p.stderr
    line = next((l for l in text.splitlines() if "the load adds at most" in l), None)
    if p.returncode != 0 or line is None:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {p.returncode}:\n{text[-3000:]}")
    print(line)
    added = float(re.search(r"adds at most ([0-9.]+) MB", line).group(1))
    largest = float(re.search(r"largest tensor's rows on a rank: ([0-9.]+) MB", line).group(1))
    if "PyTorch's DCP" not in line or added > largest:
        sys.exit(f"FAIL: the load added {added} MB of RSS on a rank, more than the largest tensor's rows ({largest} MB)")
    print(f"the load added {added} MB on the worst rank; the bound, one tensor's rows: {largest} MB")


if __name__ == "__main__":
    if len(sys.argv) > 2:
        main(sys.argv[1], sys.argv[2])
    else:
        with tempfile.TemporaryDirectory() as w:
            main(sys.argv[1], w)
