"""compare_tensors.py A_DIR B_DIR: every tensor of two Hugging Face directories (model.safetensors,
or the shards of model.safetensors.index.json) is present in both with the same dtype, shape and
bytes. Prints what differs and exits 1; exits 0 and prints the count when all are bit-identical."""
import glob
import os
import sys

import torch
from safetensors import safe_open


def tensors(d):
    out = {}
    for f in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        with safe_open(f, framework="pt") as h:
            for k in h.keys():
                out[k] = h.get_tensor(k)
    if not out:
        sys.exit(f"compare_tensors: no safetensors files in {d}")
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: compare_tensors.py A_DIR B_DIR")
    a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
    problems = [f"only in {sys.argv[1]}: {k}" for k in sorted(a.keys() - b.keys())]
    problems += [f"only in {sys.argv[2]}: {k}" for k in sorted(b.keys() - a.keys())]
    for k in sorted(a.keys() & b.keys()):
        x, y = a[k], b[k]
        if x.dtype != y.dtype or x.shape != y.shape:
            problems.append(f"{k}: {x.dtype} {tuple(x.shape)} vs {y.dtype} {tuple(y.shape)}")
        elif not x.contiguous().view(-1).view(torch.uint8).equal(y.contiguous().view(-1).view(torch.uint8)):
            problems.append(f"{k}: values differ (max abs diff {(x.double() - y.double()).abs().max().item():.3g})")
    for p in problems:
        print(p)
    if problems:
        sys.exit(1)
    print(f"{len(a)} tensors bit-identical")


if __name__ == "__main__":
    main()
