#!/usr/bin/env python3
"""fuzz_seeds.py - the seed corpora of the libFuzzer targets (test/fuzz_targets.h), made from the
fixtures and kept small: the committed copies live in test/data/fuzz/seeds/<target>/, so that
`make fuzz-lib` needs no fixture at fuzzing time. Rerun it when the fixtures change (after `make
trained`, which builds the trained models' quantized files):

    python3 test/fuzz_seeds.py [DATA_DIR]        (default test/data)

  gguf   every fixture model's header: metadata and tensor infos, the tensor data cut off (the
         target supplies unreadable pages in its place), the vocabulary cut to a few tokens
  vocab  vocabulary-only files: vocab-tiny.gguf, and the real Qwen2 vocabulary cut to its 256
         byte tokens, a few hundred merges and its special tokens (qwen2 and qwen35 pre-tokenizer)
  text   one flag byte (see fuzz_text) and a text: the tokenizer test strings and chat turns
  kld    small KL-divergence base files: valid ones of a few shapes, and some that are refused
  args   command lines, one argument per NUL-separated field
and the dictionaries in test/data/fuzz/dict/ (libFuzzer's -dict): the metadata keys, tensor names,
type ids and values that qwen.cu and tokenizer.c look for (read from their source), the special
tokens of the real vocabulary, the command line's options.
"""
import glob
import hashlib
import json
import math
import os
import re
import struct
import sys

DATA = sys.argv[1] if len(sys.argv) > 1 else "test/data"
OUT = os.path.join("test", "data", "fuzz", "seeds")

# ---- a GGUF reader and writer (the layout of qwen.cu's section 2) ----
SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B", 10: "<Q",
          11: "<q", 12: "<d"}
STR, ARR = 8, 9


def read_gguf(path):
    """(version, [(key, type, value)], [(name, dims, ggml_type, offset)]): the header only."""
    with open(path, "rb") as f:
        d = f.read(64 << 20)  # the largest header (the full Qwen2 vocabulary) is 6 MB
    p = 4
    assert d[:4] == b"GGUF", path

    def take(fmt):
        nonlocal p
        v = struct.unpack_from(fmt, d, p)[0]
        p += struct.calcsize(fmt)
        return v

    def string():
        nonlocal p
        n = take("<Q")
        s = d[p:p + n]
        p += n
        return s

    def value(t):
        if t == STR:
            return string()
        return take(SCALAR[t])

    version, n_tensors, n_kv = take("<I"), take("<Q"), take("<Q")
    kvs = []
    for _ in range(n_kv):
        key, t = string(), take("<I")
        if t == ARR:
            at, n = take("<I"), take("<Q")
            kvs.append((key, t, (at, [value(at) for _ in range(n)])))
        else:
            kvs.append((key, t, value(t)))
    tensors = []
    for _ in range(n_tensors):
        name, nd = string(), take("<I")
        dims = [take("<q") for _ in range(nd)]
        tensors.append((name, dims, take("<i"), take("<Q")))
    return version, kvs, tensors


def write_gguf(version, kvs, tensors):
    """The header bytes (no padding, no data): what the gguf and vocab targets are given."""
    out = bytearray(b"GGUF")
    out += struct.pack("<IQQ", version, len(tensors), len(kvs))

    def string(s):
        out.extend(struct.pack("<Q", len(s)) + s)

    def value(t, v):
        if t == STR:
            string(v)
        else:
            out.extend(struct.pack(SCALAR[t], v))

    for key, t, v in kvs:
        string(key)
        out.extend(struct.pack("<I", t))
        if t == ARR:
            at, items = v
            out.extend(struct.pack("<IQ", at, len(items)))
            for it in items:
                value(at, it)
        else:
            value(t, v)
    for name, dims, gt, off in tensors:
        string(name)
        out.extend(struct.pack("<I", len(dims)))
        for x in dims:
            out.extend(struct.pack("<q", x))
        out.extend(struct.pack("<iQ", gt, off))
    return bytes(out)


def cut_vocab(kvs, n_keep, n_merges):
    """The vocabulary cut to its first n_keep tokens, every special (control, user-defined) token
    after them, renumbered, and the first n_merges merges whose parts and result are all kept."""
    kv = {k: (t, v) for k, t, v in kvs}
    tokens = kv[b"tokenizer.ggml.tokens"][1][1]
    types = kv.get(b"tokenizer.ggml.token_type", (None, (5, [1] * len(tokens))))[1][1]
    keep = [i for i in range(len(tokens)) if i < n_keep or types[i] in (2, 3, 4)]
    new_id = {old: new for new, old in enumerate(keep)}
    kept = {tokens[i] for i in keep}
    merges = []
    for m in kv.get(b"tokenizer.ggml.merges", (None, (8, [])))[1][1]:
        a, _, b = m.partition(b" ")
        if a in kept and b in kept and a + b in kept:
            merges.append(m)
            if len(merges) == n_merges:
                break
    out = []
    for key, t, v in kvs:
        if key == b"tokenizer.ggml.tokens":
            v = (STR, [tokens[i] for i in keep])
        elif key == b"tokenizer.ggml.token_type":
            v = (5, [types[i] for i in keep])
        elif key == b"tokenizer.ggml.merges":
            v = (STR, merges)
        elif key.endswith(b"_token_id") and t == 4:
            v = new_id.get(v, 0)
        out.append((key, t, v))
    return out


def save(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- gguf: the header of every fixture model, the vocabulary cut to a few tokens ----
def gguf_seeds():
    paths = sorted(glob.glob(os.path.join(DATA, "tiny-*", "*.gguf")) +
                   glob.glob(os.path.join(DATA, "trained", "*.gguf")))
    if not paths:
        sys.exit(f"fuzz_seeds.py: no fixture models under {DATA}")
    # the trained models' quantized files are made from their F16 files, not committed
    for arch in ("qwen3", "qwen35"):
        for t in ("q4_0", "iq4_xs"):
            made = os.path.join(DATA, "trained", f"{arch}-{t}.gguf")
            if os.path.exists(made.replace(t, "f16")) and not os.path.exists(made):
                sys.exit(f"fuzz_seeds.py: {made} is missing: make trained builds it")
    seen = set()
    for path in paths:
        version, kvs, tensors = read_gguf(path)
        data = write_gguf(version, cut_vocab(kvs, 24, 8), tensors)
        h = hashlib.sha1(data).hexdigest()[:8]
        if h not in seen:  # files that differ only in their tensor data give the same header
            seen.add(h)
            save("gguf", os.path.basename(path)[:-5] + ".hdr", data)
    return paths


# ---- vocab: vocabulary-only files ----
def vocab_seeds(models):
    tiny = os.path.join(DATA, "tokenizer", "vocab-tiny.gguf")
    with open(tiny, "rb") as f:
        save("vocab", "vocab-tiny.gguf", f.read())
    for name in ("vocab-qwen2.gguf", "vocab-qwen2-pre35.gguf"):
        version, kvs, _ = read_gguf(os.path.join(DATA, "tokenizer", name))
        save("vocab", name[:-5] + "-cut.gguf", write_gguf(version, cut_vocab(kvs, 256, 300), []))
    # a model file's vocabulary with its tensor infos (the target reads both), cut further
    version, kvs, tensors = read_gguf(models[0])
    save("vocab", "model-vocab-cut.gguf", write_gguf(version, cut_vocab(kvs, 300, 200), []))


# ---- text: a flag byte, then the text (fuzz_text reads the flags) ----
F_PRE35, F_SPECIAL, F_CHAT, F_FIRST, F_NO_THINK, F_SYSTEM, F_REPEAT = 1, 2, 4, 8, 16, 32, 64


def text_seeds():
    texts = []
    for name in ("ggml-vocab-qwen2.gguf.inp", "ggml-vocab-qwen35.gguf.inp"):
        with open(os.path.join(DATA, "tokenizer", name), "rb") as f:
            texts += f.read().split(b"\n__ggml_vocab_test__\n")
    with open(os.path.join(DATA, "tokenizer", "tok-ref-public.json"), encoding="utf-8") as f:
        texts += [e["text"].encode() for e in json.load(f)]
    texts += [  # fuzz.sh's prompts: special tokens, invalid UTF-8, NFC, scripts
        b"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
        "café cafe\u0301 naïve — ﬁ".encode(),
        b"bad \xff\xfe utf-8 \xc3 \xed\xa0\x80 \xf4\x90\x80\x80 \xc0\x80 end",
        "\u0f73\u0f73 \u0958 \u1f82 \uac00\u11a8 \U0001d15e".encode(),
        b"<|endoftext|><0x41> <|im_end|><think></think>",
        "don't I'll we've THEY'RE ſt".encode(),
    ]
    seen = set()
    for i, t in enumerate(texts):
        t = t[:1000]
        if t in seen:
            continue
        seen.add(t)
        flags = (F_PRE35 if i % 2 else 0) | (F_SPECIAL if i % 3 else 0)
        save("text", f"t{i:03d}", bytes([flags]) + t)
    chat = F_CHAT | F_SPECIAL | F_FIRST
    save("text", "chat-first", bytes([chat]) + b"Hello, who are you?")
    save("text", "chat-system", bytes([chat | F_SYSTEM]) + b"Hi\0You are terse.")
    save("text", "chat-later-nothink", bytes([F_CHAT | F_NO_THINK | F_PRE35]) + b"and <think>?")
    save("text", "repeat", bytes([F_REPEAT | F_SPECIAL]) + "ab 12 \u00e9\n".encode())


# ---- kld: base files in llama.cpp's layout (qwen.cu's section 11) ----
def kld_file(n_ctx, n_vocab, n_chunk, seed=1, scale=None, min_lp=None, token=None, extra=b""):
    out = bytearray(b"_logits_" + struct.pack("<Iii", n_ctx, n_vocab, n_chunk))
    for i in range(n_chunk * n_ctx):
        out += struct.pack("<i", token if token is not None else (i * 7 + seed) % n_vocab)
    per_chunk = n_ctx - 1 - n_ctx // 2
    nv = 2 * ((n_vocab + 1) // 2) + 4
    for r in range(n_chunk * per_chunk):
        logits = [math.sin(seed + r * 13 + v * 0.7) * 5 for v in range(n_vocab)]
        mx = max(logits)
        mn = max(min(logits), mx - 16)
        lse = math.log(sum(math.exp(x - mx) for x in logits))
        sc = (mx - mn) / 65535 if scale is None else scale
        ml = mn - mx - lse if min_lp is None else min_lp
        words = [min(65535, round((x - mn) / sc)) if x > mn and sc > 0 else 0 for x in logits]
        out += struct.pack("<ff", sc, ml) + struct.pack(f"<{nv - 4}H", *(words + [0] * (nv - 4 -
                                                                               n_vocab)))
    return bytes(out) + extra


def kld_seeds():
    save("kld", "v5-c4", kld_file(4, 5, 1))
    save("kld", "v7-c8-x2", kld_file(8, 7, 2, seed=3))
    save("kld", "v1-c6", kld_file(6, 1, 1))
    save("kld", "v16-c5-x3", kld_file(5, 16, 3, seed=9))
    save("kld", "nan-scale", kld_file(4, 5, 1, scale=float("nan")))
    save("kld", "inf-minlp", kld_file(4, 5, 1, min_lp=float("-inf")))
    save("kld", "token-out", kld_file(4, 5, 1, token=5))
    save("kld", "trailing", kld_file(4, 5, 1, extra=b"\0\0"))
    save("kld", "truncated", kld_file(8, 7, 2)[:-3])


# ---- args: argv[1:] joined by NUL bytes (argv[0] is added by the target) ----
def args_seeds():
    lines = [
        ["-m", "M.gguf", "-p", "Hello", "-n", "8", "--temp", "0"],
        ["-m", "M.gguf", "--tokenize", "-p", "x", "--no-parse-special"],
        ["-m", "M.gguf", "--detokenize", "9707, 11,1879"],
        ["-m", "M.gguf", "--tokens", "1,2,3", "--dump-logits", "out.f32", "-b", "4"],
        ["-m", "M.gguf", "--chat", "--system", "be brief", "--no-think", "--seed", "42"],
        ["-m", "M.gguf", "--perplexity", "-f", "t.txt", "-c", "128", "--chunks", "2"],
        ["-m", "M.gguf", "--kl-divergence-base", "b.kld", "--kl-divergence", "--cpu"],
        ["-m", "M.gguf", "--info", "-c", "4096", "--vram-limit", "15.5GiB"],
        ["-m", "M.gguf", "--bench", "-ngl", "99", "-t", "8"],
        ["-m", "M.gguf", "--top-k", "40", "--top-p", "0.9", "--min-p", "0.05", "-s", "-1"],
        ["-m", "M.gguf", "-p", "-n"],
        ["--help"],
        ["-m"],
    ]
    for i, argv in enumerate(lines):
        save("args", f"a{i:02d}", b"\0".join(a.encode() for a in argv))


# ---- dictionaries: strings the readers compare against, from the sources ----
def dict_entry(b):
    return '"' + "".join(chr(c) if 32 <= c < 127 and c not in (34, 92) else f"\\x{c:02x}"
                         for c in b) + '"'


def save_dict(name, entries):
    os.makedirs(os.path.join(OUT, "..", "dict"), exist_ok=True)
    uniq = sorted(set(entries))
    with open(os.path.join(OUT, "..", "dict", name), "w") as f:
        f.write(f"# {name}: made by test/fuzz_seeds.py from qwen.cu and tokenizer.c\n")
        for e in uniq:
            f.write(dict_entry(e) + "\n")


def dicts():
    src = open("qwen.cu", encoding="utf-8").read() + open("tokenizer.c", encoding="utf-8").read()
    keys = set(re.findall(r'"((?:general|tokenizer)\.[a-z_.]+)"', src))
    suffixes = set(re.findall(r'KEY\("([a-z_.]+)"\)', src))
    for arch in ("qwen2", "qwen3", "qwen35"):
        keys |= {f"{arch}.{x}" for x in suffixes}
    names = set(re.findall(r'"((?:token_embd|output_norm|output)\.[a-z]+)"', src))
    names |= {"blk.0." + x for x in re.findall(r'(?:BLK|T|VEC)\([a-z_]+, "([a-z0-9_.]+)"', src)}
    names |= {"blk.0." + x for x in re.findall(r'BLK\("([a-z0-9_.]+)"\)', src)}
    values = ["gpt2", "qwen2", "qwen3", "qwen35", "deepseek-r1-qwen", "none", "linear", "GGUF",
              "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<0x41>"]
    entries = [x.encode() for x in keys | names] + [x.encode() for x in values]
    entries += [struct.pack("<I", i) for i in range(13)]          # GGUF value types, version
    entries += [struct.pack("<i", i) for i in (14, 20, 23, 30, 39, 40, 42)]  # ggml types
    entries += [struct.pack("<Q", n) for n in (0, 1, 4, 32, 1 << 30, (1 << 64) - 1)]
    entries += [struct.pack("<I", n) for n in (256, 4096, 1 << 20, 1 << 24, 0x7fffffff,
                                               0x80000000, 0xffffffff)]  # sizes at the bounds
    save_dict("gguf.dict", entries)
    # text: the real vocabulary's special tokens, and what NFC and the pre-tokenizer look at
    _, kvs, _ = read_gguf(os.path.join(DATA, "tokenizer", "vocab-qwen2.gguf"))
    kv = {k: v for k, t, v in kvs}
    toks, types = kv[b"tokenizer.ggml.tokens"][1], kv[b"tokenizer.ggml.token_type"][1]
    special = [tk for tk, ty in zip(toks, types) if ty in (3, 4)]
    marks = ["\u0301", "\u0f73", "\u0958", "\u1f82", "\u1100\u1161", "\u11a8", "\uac00",
             "\ufb01", "\u017f", "\ufffd", "\u2028", "\u00a0", "\U0001d15e", "'s", "'re",
             "'ll", "\r\n", " \n", "<think>", "</think>"]
    save_dict("text.dict", special + [m.encode() for m in marks] +
              [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\x80"])
    qsrc = open("qwen.cu", encoding="utf-8").read()
    opts = set(re.findall(r'IS\("(-[-a-z]*)"\)', qsrc))
    vals = ["1,2,3", " 9707 , 11", "15.5G", "900MiB", "1e40", "nan", "inf", "-1", "0",
            "2147483647", "2147483648", "0x10", "/dev/null", "M.gguf"]
    save_dict("args.dict", [o.encode() for o in opts] + [v.encode() for v in vals] + [b"\0"])
    save_dict("kld.dict", [b"_logits_", struct.pack("<f", float("nan")),
                           struct.pack("<f", float("-inf")), struct.pack("<I", 1 << 24),
                           struct.pack("<f", 0.0), struct.pack("<f", -16.0)])


if __name__ == "__main__":
    dicts()
    models = gguf_seeds()
    vocab_seeds(models)
    text_seeds()
    kld_seeds()
    args_seeds()
    for t in ("gguf", "vocab", "text", "kld", "args"):
        files = glob.glob(os.path.join(OUT, t, "*"))
        print(f"{t:6s} {len(files):3d} seeds, {sum(os.path.getsize(f) for f in files):8d} bytes")
