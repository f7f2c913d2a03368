#!/usr/bin/env python3
"""make_tokenizer.py VOCAB.gguf N OUT.json -- the tiny models' tokenizer for Hugging Face `tokenizers`.

Qwen's own byte-level BPE cut to its lowest N ids (N = 8192: the 256 byte tokens and the first
merges) plus <|endoftext|> as id N, with only the merges whose two parts and result stay inside.
The ids of ordinary text are then real Qwen ids. The same cut is what test/train/hf_to_gguf writes
into the models' GGUF files, so qwen.cu and `tokenizers` read one vocabulary.

The pre-tokenizer is Qwen2's (the regex below, then the byte-level map), the normalizer NFC: the
tokenizer.json of Qwen2/2.5/3, with fewer tokens. Python's standard library only.
"""
import json
import struct
import sys

# Qwen2's pre-tokenizer regex (qwen-spec.md section 2.3)
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def gguf_metadata(path):
    """The key/value pairs of a GGUF file (the tensor infos are not read)."""
    data = open(path, "rb").read()
    pos = 0

    def take(fmt):
        nonlocal pos
        vals = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return vals[0]

    def string():
        nonlocal pos
        n = take("Q")
        s = data[pos:pos + n].decode("utf-8")
        pos += n
        return s

    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
              12: "d"}

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("i"), take("Q")
            return [value(et) for _ in range(n)]
        return take(scalar[t])

    assert data[:4] == b"GGUF", f"{path}: not a GGUF file"
    pos = 4
    take("I")  # version
    take("q")  # tensors
    n_kv = take("q")
    kv = {}
    for _ in range(n_kv):
        key = string()
        kv[key] = value(take("i"))
    return kv


def main():
    vocab_path, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    kv = gguf_metadata(vocab_path)
    tokens = kv["tokenizer.ggml.tokens"][:n]
    keep = set(tokens)
    merges = []
    for m in kv["tokenizer.ggml.merges"]:
        left, right = m.split(" ", 1)
        if left in keep and right in keep and left + right in keep:
            merges.append([left, right])
    eot = "<|endoftext|>"
    assert eot not in keep
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": n, "content": eot, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
             "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                    "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": False,
                  "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)}, "merges": merges},
    }
    with open(out, "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)
    print(f"{out}: {n} tokens + {eot} (id {n}), {len(merges)} merges "
          f"(of {len(kv['tokenizer.ggml.merges'])})")


if __name__ == "__main__":
    main()
