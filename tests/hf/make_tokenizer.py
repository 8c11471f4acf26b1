"""Trains a small byte-level BPE tokenizer on a text file with the tokenizers library and saves it
as DIR/tokenizer.json; then checks that encoding and decoding the corpus gives it back.

  python tests/hf/make_tokenizer.py --corpus FILE --out DIR [--vocab 300]
"""
import argparse
import os
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", required=True, help="UTF-8 text to train on")
    p.add_argument("--out", required=True, help="directory to write tokenizer.json to")
    p.add_argument("--vocab", type=int, default=300)
    a = p.parse_args(argv[1:])
    try:
        with open(a.corpus, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        print(f"make_tokenizer: cannot read corpus {a.corpus}: {e}", file=sys.stderr)
        return 2

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=a.vocab,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable
        show_progress=False,
    )
    tok.train([a.corpus], trainer)
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "tokenizer.json")
    tok.save(path)
    print(f"wrote {path}; vocab {tok.get_vocab_size(with_added_tokens=True)}")

    back = Tokenizer.from_file(path)
    ids = back.encode(text, add_special_tokens=False).ids
    decoded = back.decode(ids, skip_special_tokens=False)
    assert decoded == text, "the tokenizer does not give the corpus back after encoding and decoding"
    print(f"round trip ok: {len(text)} characters -> {len(ids)} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
