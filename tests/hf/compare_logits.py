"""Compares the `logits` tensors of two safetensors files: prints the largest absolute difference
and exits 0 when it is within --tol, 1 otherwise (2 for unusable inputs). NumPy only: no torch
import, so that a comparison costs a fraction of a second beside the runs it checks.

  python tests/hf/compare_logits.py A.safetensors B.safetensors [--tol 1e-4]
"""
import argparse
import sys

import numpy as np
from safetensors.numpy import load_file


def load(path):
    try:
        t = load_file(path).get("logits")
    except Exception as e:  # missing file, not safetensors, a dtype NumPy lacks (bf16)
        raise SystemExit(f"compare_logits: cannot read {path}: {e}") from None
    if t is None:
        raise SystemExit(f"compare_logits: {path} holds no tensor named logits")
    return t


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--tol", type=float, default=1e-4)
    args = p.parse_args(argv[1:])
    try:
        a, b = load(args.a), load(args.b)
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 2
    if a.shape != b.shape:
        print(f"compare_logits: shapes differ: {args.a} {tuple(a.shape)} vs {args.b} {tuple(b.shape)}", file=sys.stderr)
        return 2
    if a.size == 0:
        print("compare_logits: the logits are empty", file=sys.stderr)
        return 2
    d = np.abs(a.astype(np.float64) - b.astype(np.float64))
    if np.isnan(d).any():
        print(f"compare_logits: NaN difference over {d.size} values (a NaN or infinite logit)", file=sys.stderr)
        return 1
    x = float(d.max())
    print(f"max abs diff {x:.6g} over {d.size} values")
    if x <= args.tol:
        return 0
    where = tuple(int(i) for i in np.unravel_index(int(d.argmax()), d.shape))
    print(f"compare_logits: max abs diff {x:.6g} at {where} exceeds --tol {args.tol:g} "
          f"({float(a[where]):.6g} vs {float(b[where]):.6g})", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
