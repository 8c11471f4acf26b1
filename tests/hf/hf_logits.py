"""Loads a Hugging Face Llama or T5 model directory with transformers (offline, fp32, eager
attention), runs it on the `ids` tensor of a safetensors file and writes the `logits` (float32) to
another. For T5, `ids` is [2, B, L] (the encoder's input ids, 0 masked as padding, then the
decoder's input ids) or [B, L] (the encoder's input, and the decoder's as labels: shifted right).

  python tests/hf/hf_logits.py --model DIR --ids FILE --out FILE [--model DIR --ids FILE --out FILE ...]

Several triples run in one process (importing transformers is most of its time).
"""
import argparse
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
import transformers  # noqa: E402
from transformers import LlamaForCausalLM, T5ForConditionalGeneration  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402


def logits_of(model_dir, ids_file, out_file):
    """Runs one model on one ids file and writes its logits; 0 on success."""
    ids = load_file(ids_file).get("ids")
    if ids is None:
        print(f"hf_logits: {ids_file} holds no tensor named ids", file=sys.stderr)
        return 2
    kw = dict(local_files_only=True, attn_implementation="eager")
    # transformers 5 (and late 4.x) names the argument dtype; earlier versions torch_dtype.
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    kw["dtype" if (major, minor) >= (4, 56) else "torch_dtype"] = torch.float32
    with open(os.path.join(model_dir, "config.json")) as f:
        t5 = json.load(f).get("model_type") == "t5"
    model = (T5ForConditionalGeneration if t5 else LlamaForCausalLM).from_pretrained(model_dir, **kw)
    model.eval()
    ids = ids.to(torch.int64)
    with torch.no_grad():
        if t5:
            source, decoder = (ids[0], ids[1]) if ids.dim() == 3 else (ids, model._shift_right(ids))
            out = model(input_ids=source, attention_mask=(source != 0).long(), decoder_input_ids=decoder)
        else:
            out = model(input_ids=ids)
        logits = out.logits.to(torch.float32).contiguous()
    save_file({"logits": logits}, out_file)
    print(f"wrote logits {tuple(logits.shape)} to {out_file}; max |logit| {logits.abs().max().item():.6g}")
    return 0


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, action="append", help="model directory (config.json + safetensors)")
    p.add_argument("--ids", required=True, action="append", help="safetensors file holding `ids` (int64)")
    p.add_argument("--out", required=True, action="append", help="safetensors file to write `logits` to")
    a = p.parse_args(argv[1:])
    if not len(a.model) == len(a.ids) == len(a.out):
        p.error("give --model, --ids and --out as many times each (one triple per model)")
    hf_logging.disable_progress_bar()
    for model_dir, ids_file, out_file in zip(a.model, a.ids, a.out):
        status = logits_of(model_dir, ids_file, out_file)
        if status:
            return status
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
