"""Builds small random T5ForConditionalGenerations offline, saves each as a Hugging Face model
directory (config.json + safetensors, or shards with model.safetensors.index.json), and writes
reference fp32 logits of each model on fixed ids to DIR.logits.safetensors beside it: `ids`
int64 [2, 3, 20] (the encoder's input ids, padded with 0 to different lengths and masked, then the
decoder's input ids, starting from 0) and `logits` float32 [3, 20, vocab]. Several models in one
run share the cost of importing transformers; the same variant gives the same weights.

  v1.0   ReLU feed-forward, lm_head tied to the shared embedding, logits scaled by d_model^-0.5
  v1.1   gated-GELU feed-forward, an lm_head of its own, no scaling (flan-t5)
  a -sharded suffix (v1.1-sharded) saves in several small shards with an index

  python tests/hf/make_t5.py [--layers N ...] VARIANT=DIR [VARIANT=DIR ...]
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
from transformers import T5Config, T5ForConditionalGeneration  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

SEQ = 20
BATCH = 3
SOURCE_LENGTHS = (20, 13, 6)  # real tokens per row; the rest is padding (0)


def reference_ids(vocab, seed):
    g = torch.Generator().manual_seed(seed + 1)
    source = torch.randint(3, vocab, (BATCH, SEQ), generator=g)
    for row, n in enumerate(SOURCE_LENGTHS):
        source[row, n - 1] = 1  # eos
        source[row, n:] = 0
    decoder = torch.randint(2, vocab, (BATCH, SEQ), generator=g)
    decoder[:, 0] = 0  # the decoder starts from pad
    return torch.stack([source, decoder])


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="+", metavar="VARIANT=DIR",
                   help="v1.0, v1.1, v1.0-sharded or v1.1-sharded, and the model directory to write")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--decoder-layers", type=int, default=3)
    p.add_argument("--vocab", type=int, default=384)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--d-kv", type=int, default=16)
    p.add_argument("--d-ff", type=int, default=96)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--buckets", type=int, default=8)
    p.add_argument("--max-distance", type=int, default=12)
    p.add_argument("--shard-size", default="60KB", help="max_shard_size with --sharded")
    a = p.parse_args(argv)
    for spec in a.models:
        variant, _, out = spec.partition("=")
        if variant not in ("v1.0", "v1.1", "v1.0-sharded", "v1.1-sharded") or not out:
            p.error(f"'{spec}' is not VARIANT=DIR with VARIANT v1.0, v1.1, v1.0-sharded or v1.1-sharded")
    return a


def make_model(a, variant):
    v11 = variant == "v1.1"
    cfg = T5Config(vocab_size=a.vocab, d_model=a.d_model, d_kv=a.d_kv, d_ff=a.d_ff, num_layers=a.layers,
                   num_decoder_layers=a.decoder_layers, num_heads=a.heads, relative_attention_num_buckets=a.buckets,
                   relative_attention_max_distance=a.max_distance, dropout_rate=0.0,
                   feed_forward_proj="gated-gelu" if v11 else "relu", tie_word_embeddings=not v11,
                   decoder_start_token_id=0)
    cfg._attn_implementation = "eager"  # reference accuracy: no fused kernels
    torch.manual_seed(a.seed)
    model = T5ForConditionalGeneration(cfg).to(torch.float32)
    with torch.no_grad():
        # Random norm weights (around 1) so that a wrong mapping of the layer norms shows.
        for name, p in model.named_parameters():
            if name.endswith("layer_norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
        # transformers 5 ties lm_head whatever tie_word_embeddings says: give v1.1 its own.
        if v11 and model.lm_head.weight is model.shared.weight:
            model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.shared.weight))
    tied = model.lm_head.weight.data_ptr() == model.shared.weight.data_ptr()
    if tied == v11:
        raise SystemExit(f"make_t5: lm_head is {'tied' if tied else 'untied'} for {variant}")
    model.eval()
    return model


def save(a, variant, out):
    """Writes one model directory and its reference logits beside it; 0 on success."""
    variant, _, sharded = variant.partition("-")
    out = os.path.abspath(out)
    model = make_model(a, variant)
    os.makedirs(out, exist_ok=True)
    save_kw = {}
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
        save_kw["safe_serialization"] = True  # transformers 4; 5 always writes safetensors
    if sharded:
        save_kw["max_shard_size"] = a.shard_size
    model.save_pretrained(out, **save_kw)
    files = sorted(os.listdir(out))
    print(f"wrote {out}: {', '.join(files)}")
    if sharded and "model.safetensors.index.json" not in files:
        print("make_t5: a sharded save did not give several shards and an index; lower --shard-size", file=sys.stderr)
        return 1
    with open(os.path.join(out, "config.json")) as f:
        print("config.json:", json.dumps(json.load(f), sort_keys=True))
    ids = reference_ids(a.vocab, a.seed)
    with torch.no_grad():
        logits = model(input_ids=ids[0], attention_mask=(ids[0] != 0).long(),
                       decoder_input_ids=ids[1]).logits.to(torch.float32).contiguous()
    logits_out = out + ".logits.safetensors"
    save_file({"ids": ids.contiguous(), "logits": logits}, logits_out)
    print(f"wrote reference logits {tuple(logits.shape)} (max |logit| {logits.abs().max().item():.6g}) to {logits_out}")
    return 0


def main(argv):
    a = parse(argv[1:])
    hf_logging.disable_progress_bar()
    for spec in a.models:
        variant, _, out = spec.partition("=")
        if save(a, variant, out):
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
