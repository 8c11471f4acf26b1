#!/usr/bin/env python3
"""Write an image-classification data set as the safetensors file the images data source reads:
"images" uint8 [N, C, H, W] and "labels" int64 [N].

  images_to_safetensors.py --digits OUT.safetensors
      scikit-learn's digits (sklearn/datasets/data/digits.csv.gz, in the venv): 1,797 8x8
      grey images of the digits 0-9, their 17 grey levels (0-16) scaled to 0-255.
  images_to_safetensors.py --folder DIR [--size 32] [--mode RGB|L] OUT.safetensors
      DIR/<class>/<image files>, the usual class-per-folder layout: classes in sorted order are
      labels 0, 1, ...; each image resized to SIZE x SIZE (Pillow) in mode RGB (3 channels) or L (1).

Run it with the venv's python (scripts/setup.sh --print-python), which has numpy, Pillow
(through matplotlib), scikit-learn and safetensors.
"""
import argparse
import gzip
import os
import sys

import numpy as np
from safetensors.numpy import save_file


def fail(message):
    sys.exit(f"images_to_safetensors: {message}")


def digits():
    import sklearn

    path = os.path.join(os.path.dirname(sklearn.__file__), "datasets", "data", "digits.csv.gz")
    if not os.path.exists(path):
        fail(f"{path} is missing: scikit-learn's digits come with scikit-learn (make setup installs it)")
    with gzip.open(path, "rt") as f:
        rows = np.loadtxt(f, delimiter=",", dtype=np.int64)
    if rows.ndim != 2 or rows.shape[1] != 65:
        fail(f"{path} has rows of {rows.shape[-1]} values, not 64 pixels and a label")
    pixels = rows[:, :64]
    if pixels.min() < 0 or pixels.max() > 16:
        fail(f"{path} has grey levels outside 0..16")
    images = np.rint(pixels * (255.0 / 16.0)).astype(np.uint8).reshape(-1, 1, 8, 8)
    return images, rows[:, 64].astype(np.int64), [str(d) for d in range(10)]


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")


def folder(root, size, mode):
    from PIL import Image

    if not os.path.isdir(root):
        fail(f"--folder {root} is not a directory; give DIR with one folder of images per class")
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    if not classes:
        fail(f"--folder {root} has no class folders; give DIR/<class>/<images>")
    images, labels = [], []
    for label, name in enumerate(classes):
        files = sorted(f for f in os.listdir(os.path.join(root, name)) if f.lower().endswith(IMAGE_SUFFIXES))
        if not files:
            fail(f"class folder {os.path.join(root, name)} holds no images ({', '.join(IMAGE_SUFFIXES)})")
        for f in files:
            path = os.path.join(root, name, f)
            try:
                with Image.open(path) as im:
                    im = im.convert(mode).resize((size, size), Image.BILINEAR)
                    a = np.asarray(im, dtype=np.uint8)
            except OSError as e:
                fail(f"{path} cannot be read as an image: {e}")
            images.append(a.reshape(size, size, -1).transpose(2, 0, 1))
            labels.append(label)
    return np.stack(images), np.asarray(labels, dtype=np.int64), classes


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = ap.add_mutually_exclusive_group(required=True)
    source.add_argument("--digits", action="store_true", help="scikit-learn's digits")
    source.add_argument("--folder", help="a folder of class folders of images")
    ap.add_argument("--size", type=int, default=32, help="--folder: images resized to SIZE x SIZE")
    ap.add_argument("--mode", choices=["RGB", "L"], default="RGB", help="--folder: RGB (3 channels) or L (grey)")
    ap.add_argument("out", help="the safetensors file to write")
    a = ap.parse_args()
    if a.size < 1:
        fail(f"--size {a.size} is not a positive number of pixels")
    images, labels, classes = digits() if a.digits else folder(a.folder, a.size, a.mode)
    save_file({"images": np.ascontiguousarray(images), "labels": labels}, a.out,
              metadata={"classes": ",".join(classes)})
    n, c, h, w = images.shape
    print(f"{a.out}: {n} images [{c}, {h}, {w}], {len(classes)} classes")


if __name__ == "__main__":
    main()
