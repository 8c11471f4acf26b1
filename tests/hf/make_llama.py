"""Builds small random LlamaForCausalLMs offline, saves each as a Hugging Face model directory
(config.json + safetensors, optionally sharded with model.safetensors.index.json), and writes
reference fp32 logits of each model on fixed token ids to a separate safetensors file beside it,
DIR.logits.safetensors (tensors `ids` int64 [2,24] and `logits` float32 [2,24,vocab]); the logits
file is kept out of the model directory so that a loader reading every *.safetensors there sees
weights only. Every model starts from the same seed, as if made alone; one process makes them all,
since importing transformers is most of its time.

  python tests/hf/make_llama.py [--seed N --layers N ...] DIR[,tied][,sharded] ...
"""
import argparse
import inspect
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

SEQ = 24
BATCH = 2


def reference_ids(vocab):
    return (torch.arange(BATCH * SEQ, dtype=torch.int64).reshape(BATCH, SEQ) * 37) % vocab


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="+", metavar="DIR[,tied][,sharded]",
                   help="model directory to write; tied: lm_head tied to embed_tokens; sharded: several small "
                        "shards with an index")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=160)
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--max-pos", type=int, default=128)
    p.add_argument("--norm-eps", type=float, default=1e-5)
    p.add_argument("--shard-size", default="100KB", help="max_shard_size with --sharded")
    return p.parse_args(argv)


def make_config(a):
    kw = dict(
        vocab_size=a.vocab,
        hidden_size=a.hidden,
        intermediate_size=a.intermediate,
        num_hidden_layers=a.layers,
        num_attention_heads=a.heads,
        num_key_value_heads=a.kv_heads,
        max_position_embeddings=a.max_pos,
        rms_norm_eps=a.norm_eps,
        initializer_range=0.02,
        tie_word_embeddings=bool(a.tied),
        attention_bias=False,
        mlp_bias=False,
        hidden_act="silu",
    )
    params = inspect.signature(LlamaConfig.__init__).parameters
    if "rope_parameters" in params:  # transformers >= 5: rope settings live in one dict
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": a.rope_theta}
    else:
        kw["rope_theta"] = a.rope_theta
    if "dtype" in params:
        kw["dtype"] = "float32"
    else:
        kw["torch_dtype"] = "float32"
    cfg = LlamaConfig(**kw)
    cfg._attn_implementation = "eager"  # reference accuracy: no fused kernels
    return cfg


def main(argv):
    a = parse(argv[1:])
    hf_logging.disable_progress_bar()
    if a.hidden % a.heads or a.heads % a.kv_heads:
        print(f"make_llama: --hidden {a.hidden} must divide by --heads {a.heads}, "
              f"and --heads by --kv-heads {a.kv_heads}", file=sys.stderr)
        return 2
    for spec in a.models:
        out, *flags = spec.split(",")
        if not out or any(f not in ("tied", "sharded") for f in flags):
            print(f"make_llama: {spec!r} is not DIR[,tied][,sharded]", file=sys.stderr)
            return 2
        a.out, a.tied, a.sharded = os.path.abspath(out), "tied" in flags, "sharded" in flags
        rc = make_model(a)
        if rc:
            return rc
    return 0


def make_model(a):
    out = a.out
    logits_out = out + ".logits.safetensors"
    torch.manual_seed(a.seed)
    cfg = make_config(a)
    model = LlamaForCausalLM(cfg).to(torch.float32)
    # Random norm weights (around 1) so that a wrong mapping of the RMSNorm weights shows.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    model.eval()
    if a.tied:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(), "lm_head is not tied"

    os.makedirs(out, exist_ok=True)
    save_kw = {}
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
        save_kw["safe_serialization"] = True  # transformers 4; 5 always writes safetensors
    if a.sharded:
        save_kw["max_shard_size"] = a.shard_size
    model.save_pretrained(out, **save_kw)

    files = sorted(os.listdir(out))
    print(f"wrote {out}:")
    for f in files:
        print(f"  {f} ({os.path.getsize(os.path.join(out, f))} bytes)")
    weights = [f for f in files if f.endswith(".safetensors")]
    if not weights:
        print("make_llama: save_pretrained wrote no safetensors files", file=sys.stderr)
        return 1
    if a.sharded and ("model.safetensors.index.json" not in files or len(weights) < 2):
        print("make_llama: --sharded did not give several shards and an index; lower --shard-size", file=sys.stderr)
        return 1
    with open(os.path.join(out, "config.json")) as f:
        print("config.json:", json.dumps(json.load(f), indent=1, sort_keys=True))

    ids = reference_ids(a.vocab)
    with torch.no_grad():
        logits = model(input_ids=ids).logits.to(torch.float32).contiguous()
    save_file({"ids": ids.contiguous(), "logits": logits}, logits_out)
    print(f"wrote reference logits {tuple(logits.shape)} (max |logit| {logits.abs().max().item():.6g}) to {logits_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
