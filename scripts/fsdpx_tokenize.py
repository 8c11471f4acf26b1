"""Encodes UTF-8 text files with a Hugging Face tokenizer.json and writes the concatenated token
ids as one flat little-endian uint16 or uint32 array: the input of fsdpx's `tokens` data source
(--data.name tokens --data.path FILE --data.dtype uint16|uint32). Run it with scripts/tokenize,
which uses the project's virtual environment (tokenizers is installed there by scripts/setup.sh)."""
import argparse
import array
import os
import sys

PROG = "tokenize"
EOS_CANDIDATES = ("</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>")
LIMITS = {"uint16": 1 << 16, "uint32": 1 << 32}  # ids a dtype can hold
WIDTH = {"uint16": 2, "uint32": 4}


class UsageError(Exception):
    pass


def typecode(width):
    """The array typecode of an unsigned integer `width` bytes wide (C type sizes vary)."""
    for code in ("H", "I", "L"):
        if array.array(code).itemsize == width:
            return code
    raise UsageError(f"this Python has no {width}-byte unsigned array type")


def parse(argv):
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Encode text files into a flat token-id file for fsdpx's `tokens` data source.")
    p.add_argument("--tokenizer", required=True, help="path of a Hugging Face tokenizer.json")
    p.add_argument("--out", required=True, help="output file (flat little-endian ids)")
    p.add_argument("--dtype", choices=("auto", "uint16", "uint32"), default="auto",
                   help="id width; auto: uint16 when the vocabulary fits in 65536 ids, else uint32")
    p.add_argument("--append-eos", action="store_true",
                   help="append the tokenizer's end-of-text id after each file")
    p.add_argument("texts", nargs="+", metavar="TEXT_FILE", help="UTF-8 text files, encoded whole")
    return p.parse_args(argv)


def find_eos(tok):
    vocab = tok.get_vocab(with_added_tokens=True)
    for name in EOS_CANDIDATES:
        if name in vocab:
            return vocab[name]
    raise UsageError("--append-eos: the tokenizer has none of the end-of-text tokens "
                     + ", ".join(EOS_CANDIDATES))


def run(args):
    if not os.path.isfile(args.tokenizer):
        raise UsageError(f"tokenizer file {args.tokenizer} does not exist")
    from tokenizers import Tokenizer
    try:
        tok = Tokenizer.from_file(args.tokenizer)
    except Exception as e:  # tokenizers raises its own Exception type
        raise UsageError(f"cannot load tokenizer {args.tokenizer}: {e}")
    vocab = tok.get_vocab_size(with_added_tokens=True)
    dtype = args.dtype
    if dtype == "auto":
        dtype = "uint16" if vocab <= LIMITS["uint16"] else "uint32"
    if vocab > LIMITS[dtype]:
        raise UsageError(f"--dtype {dtype} cannot hold the ids of a vocabulary of {vocab} tokens; use uint32")
    eos = find_eos(tok) if args.append_eos else None

    ids = array.array(typecode(WIDTH[dtype]))
    for path in args.texts:
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError as e:
            raise UsageError(f"cannot read text file {path}: {e.strerror}")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise UsageError(f"text file {path} is not UTF-8 (byte {e.start}: {e.reason})")
        enc = tok.encode(text, add_special_tokens=False)
        ids.extend(enc.ids)
        if eos is not None:
            ids.append(eos)
    if len(ids) == 0:
        raise UsageError("the text files produced no tokens; nothing written")
    if sys.byteorder != "little":
        ids.byteswap()
    tmp = args.out + ".tmp"
    try:
        with open(tmp, "wb") as f:
            ids.tofile(f)
        os.replace(tmp, args.out)
    except OSError as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise UsageError(f"cannot write {args.out}: {e.strerror}")
    print(f"wrote {len(ids)} tokens ({dtype}, vocab {vocab}) to {args.out}; "
          f"train with --data.name tokens --data.path {args.out} --data.dtype {dtype}")


def main(argv):
    args = parse(argv[1:])
    try:
        run(args)
    except UsageError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
