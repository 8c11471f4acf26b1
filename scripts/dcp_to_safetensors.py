#!/usr/bin/env python3
"""Converts a checkpoint that PyTorch's distributed checkpointing (DCP) wrote in its default format
(FileSystemWriter: pickled .distcp files and .metadata) into the safetensors folder fsdpx reads
(fsdpx-train --init-from, ShardedModule::load): every tensor whole, by its DCP name (nested state
dicts joined with dots), in OUT_DIR/model-00001-of-00001.safetensors. It loads the whole checkpoint
into this one process's memory; saving with FileSystemWriter(serialization_format=
SerializationFormat.SAFETENSORS) or HuggingFaceStorageWriter(save_distributed=True) instead needs no
conversion.

usage: python scripts/dcp_to_safetensors.py DCP_DIR OUT_DIR   (with the venv's python, which has torch)
"""
import os
import sys

import torch
from safetensors.torch import save_file
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict


def flatten(d, prefix=""):
    for k, v in d.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            yield from flatten(v, name + ".")
        elif torch.is_tensor(v):
            yield name, v


def main(argv):
    if len(argv) != 3:
        sys.exit(__doc__.strip().splitlines()[-1])
    src, out = argv[1], argv[2]
    if not os.path.isfile(os.path.join(src, ".metadata")):
        sys.exit(f"{src}: no .metadata, so not a checkpoint of DCP's FileSystemWriter")
    if os.path.exists(out) and os.listdir(out):
        sys.exit(f"{out} exists and is not empty; give a new folder")
    state = {}
    _load_state_dict(state, storage_reader=FileSystemReader(src), planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    tensors = {name: t.contiguous() for name, t in flatten(state)}
    os.makedirs(out, exist_ok=True)
    save_file(tensors, os.path.join(out, "model-00001-of-00001.safetensors"), metadata={"format": "pt"})
    print(f"{len(tensors)} tensors from {src} written whole to {out}/model-00001-of-00001.safetensors")


if __name__ == "__main__":
    main(sys.argv)
