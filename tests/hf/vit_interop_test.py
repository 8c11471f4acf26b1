"""fsdpx's vit against the implementations it follows (CTest's VitInterop), at 2 ranks, fp32:
  1. vit-pytorch's ViT and DeepViT (the venv's vit-pytorch 1.26.14) with random weights, mapped to
     fsdpx's names (`from_vit_pytorch`): fsdpx's logits on the same images (hf_worker --init-from)
     within kLogits of vit-pytorch's; one SGD step of lr 1 over the same batch (fsdpx-train, the
     images data source) gives the same loss within kLoss and the same gradient, read as the
     weights' change, within kGrad; export-hf of the DeepViT is refused in one line;
  2. Hugging Face's ViTForImageClassification (a small random one, save_pretrained): fsdpx's logits
     from --model.from_hf within kLogits of transformers'; fsdpx trains it 2 steps and
     fsdpx-ckpt export-hf writes it back, and transformers' logits of the export equal fsdpx's
     of the same checkpoint within kLogits.
usage: vit_interop_test.py BUILD_DIR [WORK_DIR (kept; default: a temporary one)]"""
import json
import os
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file

# fp32 logits of the same weights and images: the two sides add in other orders (the patch
# projection's columns are permuted, attention is LibTorch's fused kernel against two matmuls);
# measured differences are about 1e-6.
kLogits = 1e-5
kLoss = 1e-6
# A gradient read as w0 - w1 (lr 1) carries the rounding of w0 and w1: about 1.2e-7 |w|; the
# weights here are within about 4 in size. A wrong mapping or a missing term is off by 1e-3 or more.
kGrad = 2e-6

build = sys.argv[1]
work = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="fsdpx-vit-")
os.makedirs(work, exist_ok=True)
bin_dir = os.path.join(build, "bin")
train = os.path.join(bin_dir, "fsdpx-train")
failures = []

# A small shape both vit-pytorch models and fsdpx take: 8x8 grey images in 2x2 patches.
SHAPE = dict(image_size=8, patch_size=2, num_classes=10, dim=32, depth=2, heads=4, mlp_dim=64, channels=1, dim_head=8)
OPTIONS = ["image=8", "patch=2", "classes=10", "dim=32", "layers=2", "heads=4", "mlp=64", "channels=1",
           "head_dim=8", "patch_norms=true", "qkv_bias=false", "norm_eps=1e-5"]


def must(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {p.returncode}:\n{(p.stdout + p.stderr)[-3000:]}")
    return p.stdout + p.stderr


def check(what, worst, bound):
    ok = worst <= bound
    print(f"{what}: worst difference {worst:.2e} (bound {bound:.0e}){'' if ok else '  <-- FAILS'}")
    if not ok:
        failures.append(f"{what}: {worst:.2e} > {bound:.0e}")


def patch_vector(t, p, c):
    """A vector over a flattened patch in vit-pytorch's (row, column, channel) order, in fsdpx's
    (channel, row, column) order; the last dimension of t."""
    lead = t.shape[:-1]
    return t.reshape(*lead, p, p, c).movedim(-1, -3).reshape(*lead, c * p * p)


def from_vit_pytorch(sd, deep):
    """vit-pytorch's ViT or DeepViT state dict (or its gradients) under fsdpx's names and layouts."""
    p, c, d = SHAPE["patch_size"], SHAPE["channels"], SHAPE["dim"]
    out = {
        "embeddings.norm_in.weight": patch_vector(sd["to_patch_embedding.1.weight"], p, c),
        "embeddings.norm_in.bias": patch_vector(sd["to_patch_embedding.1.bias"], p, c),
        "embeddings.proj.weight": patch_vector(sd["to_patch_embedding.2.weight"], p, c).reshape(d, c, p, p),
        "embeddings.proj.bias": sd["to_patch_embedding.2.bias"],
        "embeddings.norm_out.weight": sd["to_patch_embedding.3.weight"],
        "embeddings.norm_out.bias": sd["to_patch_embedding.3.bias"],
        "embeddings.cls_token": sd["cls_token"].reshape(1, 1, d),
        "embeddings.pos_embedding": sd["pos_embedding"].reshape(1, -1, d),
    }
    for i in range(SHAPE["depth"]):
        a, f, b = f"transformer.layers.{i}.0.", f"transformer.layers.{i}.1.", f"blocks.{i}."
        wq, wk, wv = sd[a + "to_qkv.weight"].chunk(3, dim=0)
        out.update({b + "attention_norm.weight": sd[a + "norm.weight"], b + "attention_norm.bias": sd[a + "norm.bias"],
                    b + "attention.wq": wq, b + "attention.wk": wk, b + "attention.wv": wv,
                    b + "attention.wo": sd[a + "to_out.0.weight"], b + "attention.bo": sd[a + "to_out.0.bias"],
                    b + "mlp_norm.weight": sd[f + "net.0.weight"], b + "mlp_norm.bias": sd[f + "net.0.bias"],
                    b + "mlp.w1": sd[f + "net.1.weight"], b + "mlp.b1": sd[f + "net.1.bias"],
                    b + "mlp.w2": sd[f + "net.4.weight"], b + "mlp.b2": sd[f + "net.4.bias"]})
        if deep:
            out.update({b + "attention.reattn_weights": sd[a + "reattn_weights"],
                        b + "attention.reattn_norm.weight": sd[a + "reattn_norm.1.weight"],
                        b + "attention.reattn_norm.bias": sd[a + "reattn_norm.1.bias"]})
    final = "mlp_head.0." if deep else "transformer.norm."
    head = "mlp_head.1." if deep else "mlp_head."
    out.update({"norm.weight": sd[final + "weight"], "norm.bias": sd[final + "bias"],
                "head.weight": sd[head + "weight"], "head.bias": sd[head + "bias"]})
    if len(out) != len(sd) + 2 * SHAPE["depth"]:  # each to_qkv is three of fsdpx's
        sys.exit(f"FAIL: the mapping gives {len(out)} tensors for vit-pytorch's {len(sd)}")
    return {k: v.detach().contiguous().float() for k, v in out.items()}


def images_and_labels(n, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 256, (n, 1, 8, 8), generator=g, dtype=torch.uint8),
            torch.randint(0, 10, (n,), generator=g, dtype=torch.int64))


def normalised(images):
    return (images.float() * (1.0 / 255.0) - 0.5) / 0.5  # the images source's defaults, in its order


def logits_of(init, ids, *extra):
    out = os.path.join(work, "logits.safetensors")
    must([os.path.join(build, "tests", "hf_worker"), "--nproc-per-node", "2", "--model", "vit", "--init-from", init,
          "--ids", ids, "--out", out, *extra])
    return load_file(out)["logits"]


def vit_pytorch_part(deep):
    from vit_pytorch import ViT
    from vit_pytorch.deepvit import DeepViT
    name = "DeepViT" if deep else "ViT"
    torch.manual_seed(7)
    model = (DeepViT if deep else ViT)(**SHAPE).eval()
    images, labels = images_and_labels(8, 3)
    x = normalised(images)
    folder = os.path.join(work, name + "-init")
    os.makedirs(folder, exist_ok=True)
    w0 = from_vit_pytorch(model.state_dict(), deep)
    save_file(w0, os.path.join(folder, "model.safetensors"))
    ids = os.path.join(work, name + "-ids.safetensors")
    save_file({"ids": x.contiguous()}, ids)
    given = OPTIONS + (["reattention=true"] if deep else [])
    options = [a for o in given for a in ("--option", o)]
    got = logits_of(folder, ids, *options)
    want = model(x)
    check(f"{name}: fsdpx's logits against vit-pytorch's", (got - want).abs().max().item(), kLogits)

    loss = torch.nn.functional.cross_entropy(want, labels)
    loss.backward()
    grads = from_vit_pytorch({k: p.grad for k, p in model.named_parameters()}, deep)
    data = os.path.join(work, name + "-data.safetensors")
    save_file({"images": images, "labels": labels}, data)
    run = os.path.join(work, name + "-run")
    model_opts = ["--model." + o for o in given]
    must([train, "--nproc-per-node", "2", "--model.name", "vit", *model_opts, "--data.name", "images",
          "--data.path", data, "--data.holdout", "0", "--batch-size", "4", "--steps", "1",
          "--optimizer.name", "sgd", "--optimizer.lr", "1", "--precision.name", "fp32",
          "--init-from", folder, "--checkpoint.name", "consolidated", "--out", run])
    with open(os.path.join(run, "metrics.jsonl")) as f:
        first = [j["loss"] for j in map(json.loads, f) if "loss" in j][0]
    check(f"{name}: fsdpx's step-1 loss against vit-pytorch's", abs(first - loss.item()), kLoss)
    w1 = load_file(os.path.join(run, "checkpoints", "step-00000001", "model.safetensors"))
    worst = max((w0[k] - w1[k] - grads[k]).abs().max().item() for k in w0)
    check(f"{name}: fsdpx's gradients (w0 - w1) against vit-pytorch's, {len(w0)} tensors", worst, kGrad)
    if deep:  # Hugging Face's ViT has no re-attention: export-hf says so, in one line
        p = subprocess.run([os.path.join(bin_dir, "fsdpx-ckpt"), "export-hf", os.path.join(run, "checkpoints",
                            "step-00000001"), os.path.join(work, "deepvit-hf")], capture_output=True, text=True)
        print(f"DeepViT: export-hf exits {p.returncode}: {p.stderr.strip()[:160]}")
        if p.returncode == 0 or "no Hugging Face counterpart" not in p.stderr:
            failures.append(f"export-hf of a DeepViT: exit {p.returncode}, {p.stderr.strip()}")


def hugging_face_part():
    from transformers import ViTConfig, ViTForImageClassification
    torch.manual_seed(11)
    config = ViTConfig(image_size=8, patch_size=2, num_channels=1, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=4, intermediate_size=64, num_labels=10)
    model = ViTForImageClassification(config).eval()
    hf = os.path.join(work, "hf-vit")
    model.save_pretrained(hf)
    images, labels = images_and_labels(8, 5)
    x = normalised(images)
    ids = os.path.join(work, "hf-ids.safetensors")
    save_file({"ids": x.contiguous()}, ids)
    out = os.path.join(work, "hf-logits.safetensors")
    must([os.path.join(build, "tests", "hf_worker"), "--nproc-per-node", "2", "--model", "vit", "--from-hf", hf,
          "--ids", ids, "--out", out])
    with torch.no_grad():
        want = model(pixel_values=x).logits
    check("Hugging Face ViT: fsdpx's logits from --model.from_hf against transformers'",
          (load_file(out)["logits"] - want).abs().max().item(), kLogits)

    data = os.path.join(work, "hf-data.safetensors")
    save_file({"images": images, "labels": labels}, data)
    run = os.path.join(work, "hf-run")
    must([train, "--nproc-per-node", "2", "--model.name", "vit", "--model.from_hf", hf, "--data.name", "images",
          "--data.path", data, "--data.holdout", "0", "--batch-size", "4", "--steps", "2",
          "--optimizer.name", "adamw", "--optimizer.lr", "1e-2", "--checkpoint.name", "consolidated", "--out", run])
    step = os.path.join(run, "checkpoints", "step-00000002")
    exported = os.path.join(work, "hf-exported")
    must([os.path.join(bin_dir, "fsdpx-ckpt"), "export-hf", step, exported])
    back = ViTForImageClassification.from_pretrained(exported).eval()
    with torch.no_grad():
        theirs = back(pixel_values=x).logits
    mine = logits_of(step, ids, "--from-hf", hf)
    moved = (theirs - want).abs().max().item()
    print(f"Hugging Face ViT: 2 steps of training moved the logits by {moved:.2e}")
    if moved < 1e-3:
        failures.append("the export's logits equal the untrained model's: the trained weights were not exported")
    check("Hugging Face ViT: transformers' logits of fsdpx-ckpt export-hf against fsdpx's",
          (theirs - mine).abs().max().item(), kLogits)


def main():
    torch.set_num_threads(1)
    vit_pytorch_part(deep=False)
    vit_pytorch_part(deep=True)
    hugging_face_part()
    if failures:
        sys.exit("FAIL:\n  " + "\n  ".join(failures))
    print("PASS")


main()
