"""Greedy decoding by transformers (generate: one token at a time with its KV cache) on the held-out
pairs of fsdpx's seq2seq data source, and the exact-match accuracy: the share of pairs whose
generated target equals the real one, eos included. The held-out pairs are the ones fsdpx holds
out: the same byte tokens (UTF-8 byte + 3, eos 1) and the same split (std::mt19937_64 seeded
with --split-seed, a Fisher-Yates swap from the last pair down, the last `holdout` share held
out). Prints "exact match N/M"; a JSON lines file of text fields only.

  python tests/hf/t5_exact_match.py --model DIR --pairs FILE.jsonl --source-len S --target-len T \
      --holdout 0.2 [--split-seed 0]
"""
import argparse
import json
import math
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from transformers import T5ForConditionalGeneration  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

MASK64 = (1 << 64) - 1


class MT19937_64:
    """The C++ standard's mt19937_64 (the same numbers as libstdc++'s std::mt19937_64)."""

    def __init__(self, seed):
        self.mt = [seed & MASK64]
        for i in range(1, 312):
            self.mt.append((6364136223846793005 * (self.mt[-1] ^ (self.mt[-1] >> 62)) + i) & MASK64)
        self.index = 312

    def __call__(self):
        if self.index >= 312:
            for i in range(312):
                x = (self.mt[i] & 0xFFFFFFFF80000000) | (self.mt[(i + 1) % 312] & 0x7FFFFFFF)
                y = x >> 1
                if x & 1:
                    y ^= 0xB5026F5AA96619E9
                self.mt[i] = self.mt[(i + 156) % 312] ^ y
            self.index = 0
        y = self.mt[self.index]
        self.index += 1
        y ^= (y >> 29) & 0x5555555555555555
        y ^= (y << 17) & 0x71D67FFFEDA60000
        y ^= (y << 37) & 0xFFF7EEE000000000
        y ^= y >> 43
        return y & MASK64


def byte_ids(text, length):
    ids = [b + 3 for b in text.encode("utf-8")] + [1]
    if len(ids) > length:
        raise SystemExit(f"t5_exact_match: '{text}' has {len(ids)} ids, more than {length}")
    return ids


def heldout(pairs, holdout, split_seed):
    order = list(range(len(pairs)))
    rng = MT19937_64(split_seed)
    for i in range(len(order) - 1, 0, -1):
        j = rng() % (i + 1)
        order[i], order[j] = order[j], order[i]
    n_held = math.floor(len(pairs) * holdout)
    return [pairs[i] for i in order[len(pairs) - n_held:]]


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--pairs", required=True)
    p.add_argument("--source-len", type=int, required=True)
    p.add_argument("--target-len", type=int, required=True)
    p.add_argument("--holdout", type=float, required=True)
    p.add_argument("--split-seed", type=int, default=0)
    a = p.parse_args(argv[1:])
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    with open(a.pairs) as f:
        pairs = [json.loads(line) for line in f if line.strip()]
    held = heldout(pairs, a.holdout, a.split_seed)
    model = T5ForConditionalGeneration.from_pretrained(a.model, local_files_only=True, attn_implementation="eager")
    model.eval()
    source = torch.zeros(len(held), a.source_len, dtype=torch.int64)
    for i, pair in enumerate(held):
        ids = byte_ids(pair["source"], a.source_len)
        source[i, :len(ids)] = torch.tensor(ids)
    with torch.no_grad():
        out = model.generate(input_ids=source, attention_mask=(source != 0).long(), do_sample=False, num_beams=1,
                             max_new_tokens=a.target_len, decoder_start_token_id=0, eos_token_id=1, pad_token_id=0)
    correct = 0
    for i, pair in enumerate(held):
        want = byte_ids(pair["target"], a.target_len)
        got = out[i, 1:1 + len(want)].tolist()  # after the decoder's start token
        correct += int(got == want)
    print(f"exact match {correct}/{len(held)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
