"""compare_tensors.py A_DIR B_DIR: every tensor of two Hugging Face directories (model.safetensors,
or the shards of model.safetensors.index.json) is present in both with the same dtype, shape and
bytes. Prints what differs and exits 1; exits 0 and prints the count when all are bit-identical.
Reads the files' own layout (an 8-byte header length, a JSON header, the bytes) with NumPy only."""
import glob
import json
import os
import struct
import sys

import numpy as np

# Safetensors dtypes as NumPy reads them (BF16: the upper half of a float32's bits).
NUMPY = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I64": np.int64,
         "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def tensors(d):
    """name -> (dtype, shape, bytes) over every safetensors file of d."""
    out = {}
    for f in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        with open(f, "rb") as h:
            data = h.read()
        n = struct.unpack("<Q", data[:8])[0]
        header = json.loads(data[8:8 + n])
        for k, v in header.items():
            if k != "__metadata__":
                start, end = v["data_offsets"]
                out[k] = (v["dtype"], tuple(v["shape"]), data[8 + n + start:8 + n + end])
    if not out:
        sys.exit(f"compare_tensors: no safetensors files in {d}")
    return out


def values(dtype, raw):
    x = np.frombuffer(raw, dtype=NUMPY.get(dtype, np.uint8))
    if dtype == "BF16":
        return (x.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return x.astype(np.float64)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: compare_tensors.py A_DIR B_DIR")
    a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
    problems = [f"only in {sys.argv[1]}: {k}" for k in sorted(a.keys() - b.keys())]
    problems += [f"only in {sys.argv[2]}: {k}" for k in sorted(b.keys() - a.keys())]
    for k in sorted(a.keys() & b.keys()):
        (xt, xs, xb), (yt, ys, yb) = a[k], b[k]
        if xt != yt or xs != ys:
            problems.append(f"{k}: {xt} {xs} vs {yt} {ys}")
        elif xb != yb:
            diff = np.abs(values(xt, xb) - values(yt, yb)).max()
            problems.append(f"{k}: values differ (max abs diff {diff:.3g})")
    for p in problems:
        print(p)
    if problems:
        sys.exit(1)
    print(f"{len(a)} tensors bit-identical")


if __name__ == "__main__":
    main()
