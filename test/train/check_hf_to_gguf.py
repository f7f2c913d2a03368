#!/usr/bin/env python3
"""Check a GGUF written by test/train/hf_to_gguf against its inputs, from the other side: this reads
the checkpoint, the vocabulary and the GGUF with its own code (Python 3 standard library only) and
compares every metadata key (name, type, value), the tokenizer arrays, and every tensor (name,
shape, type, bytes) with what llama.cpp's converter writes for that checkpoint:

    python3 test/train/check_hf_to_gguf.py CKPT_DIR VOCAB.gguf N_VOCAB_TOKENS OUT.gguf [NAME]

Tensors must match bit for bit, except ssm_a (-exp(A_log)), where 1 ulp is allowed between C's
expf and Python's exp. Prints one line per check group; exits 1 on the first mismatch.
"""
import json
import math
import os
import struct
import sys

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
          BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}
GGML_F32, GGML_F16 = 0, 1


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


class Reader:
    def __init__(self, data):
        self.d, self.p = data, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.d, self.p)[0]
        self.p += struct.calcsize(fmt)
        return v

    def str(self):
        n = self.take("<Q")
        s = self.d[self.p:self.p + n]
        self.p += n
        return s

    def value(self, t):
        if t == STR:
            return self.str()
        if t == ARR:
            et, n = self.take("<i"), self.take("<Q")
            return (et, [self.value(et) for _ in range(n)])
        return self.take(SCALAR[t])


def read_gguf(path):
    data = open(path, "rb").read()
    r = Reader(data)
    check(data[:4] == b"GGUF", "magic")
    r.p = 4
    version, n_t, n_kv = r.take("<I"), r.take("<q"), r.take("<q")
    kv = {}
    for _ in range(n_kv):
        k = r.str().decode()
        t = r.take("<i")
        check(k not in kv, "duplicate key " + k)
        kv[k] = (t, r.value(t))
    infos = []
    for _ in range(n_t):
        name = r.str().decode()
        nd = r.take("<I")
        ne = [r.take("<q") for _ in range(nd)]
        infos.append((name, ne, r.take("<i"), r.take("<Q")))
    start = (r.p + 31) // 32 * 32
    return version, kv, infos, start, data


def read_safetensors(path):
    data = open(path, "rb").read()
    n = struct.unpack_from("<Q", data, 0)[0]
    h = json.loads(data[8:8 + n])
    h.pop("__metadata__", None)
    out = {}
    for name, e in h.items():
        b, en = e["data_offsets"]
        raw = data[8 + n + b:8 + n + en]
        cnt = len(raw) // (4 if e["dtype"] == "F32" else 2)
        if e["dtype"] == "F32":
            vals = list(struct.unpack("<%df" % cnt, raw))
        elif e["dtype"] == "F16":
            vals = list(struct.unpack("<%de" % cnt, raw))
        else:
            vals = [struct.unpack("<f", struct.pack("<I", x << 16))[0]
                    for x in struct.unpack("<%dH" % cnt, raw)]
        out[name] = (e["dtype"], e["shape"], vals, raw)
    return out


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def main():
    ckpt, vocab_path, n_keep, gguf_path = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    gname = sys.argv[5] if len(sys.argv) > 5 else os.path.basename(os.path.normpath(ckpt))
    cfg = json.load(open(os.path.join(ckpt, "config.json")))
    st = read_safetensors(os.path.join(ckpt, "model.safetensors"))
    version, kv, infos, start, data = read_gguf(gguf_path)
    _, vkv, _, _, _ = read_gguf(vocab_path)
    check(version == 3, "version %d" % version)

    # ---- metadata ----
    q35 = cfg["model_type"] == "qwen3_5_text"
    arch = "qwen35" if q35 else "qwen3"
    rope = cfg.get("rope_parameters") or {}
    theta = rope.get("rope_theta", cfg.get("rope_theta"))
    want = {
        "general.architecture": (STR, arch.encode()),
        "general.type": (STR, b"model"),
        "general.name": (STR, gname.encode()),
        "general.file_type": (U32, 1),
        "general.quantization_version": (U32, 2),
        arch + ".block_count": (U32, cfg["num_hidden_layers"]),
        arch + ".context_length": (U32, cfg["max_position_embeddings"]),
        arch + ".embedding_length": (U32, cfg["hidden_size"]),
        arch + ".feed_forward_length": (U32, cfg["intermediate_size"]),
        arch + ".attention.head_count": (U32, cfg["num_attention_heads"]),
        arch + ".attention.head_count_kv": (U32, cfg["num_key_value_heads"]),
        arch + ".attention.key_length": (U32, cfg["head_dim"]),
        arch + ".attention.value_length": (U32, cfg["head_dim"]),
        arch + ".rope.freq_base": (F32, f32(theta)),
        arch + ".attention.layer_norm_rms_epsilon": (F32, f32(cfg["rms_norm_eps"])),
    }
    if q35:
        prf = cfg.get("partial_rotary_factor", rope.get("partial_rotary_factor"))
        lt = cfg["layer_types"]
        interval = lt.index("full_attention") + 1
        sec = (rope.get("mrope_section") or [11, 11, 10]) + [0]
        want.update({
            arch + ".ssm.conv_kernel": (U32, cfg["linear_conv_kernel_dim"]),
            arch + ".ssm.state_size": (U32, cfg["linear_key_head_dim"]),
            arch + ".ssm.group_count": (U32, cfg["linear_num_key_heads"]),
            arch + ".ssm.time_step_rank": (U32, cfg["linear_num_value_heads"]),
            arch + ".ssm.inner_size": (U32, cfg["linear_value_head_dim"] *
                                       cfg["linear_num_value_heads"]),
            arch + ".full_attention_interval": (U32, interval),
            arch + ".rope.dimension_count": (U32, int(cfg["head_dim"] * prf)),
            arch + ".rope.dimension_sections": (ARR, (I32, sec[:4])),
        })
    # tokenizer: the first N tokens, <|endoftext|> appended; merges of kept parts and results
    toks = vkv["tokenizer.ggml.tokens"][1][1][:n_keep] + [b"<|endoftext|>"]
    types = vkv["tokenizer.ggml.token_type"][1][1][:n_keep] + [3]
    kept = set(toks[:n_keep])
    merges = []
    for m in vkv["tokenizer.ggml.merges"][1][1]:
        i = m.index(b" ", 1)
        a, b = m[:i], m[i + 1:]
        if a in kept and b in kept and a + b in kept:
            merges.append(m)
    want.update({
        "tokenizer.ggml.model": (STR, b"gpt2"),
        "tokenizer.ggml.pre": vkv["tokenizer.ggml.pre"],
        "tokenizer.ggml.tokens": (ARR, (STR, toks)),
        "tokenizer.ggml.token_type": (ARR, (I32, types)),
        "tokenizer.ggml.merges": (ARR, (STR, merges)),
        "tokenizer.ggml.bos_token_id": (U32, n_keep),
        "tokenizer.ggml.eos_token_id": (U32, n_keep),
        "tokenizer.ggml.padding_token_id": (U32, n_keep),
        "tokenizer.ggml.add_bos_token": (BOOL, False),
    })
    check(set(kv) == set(want), "keys differ: extra %s, missing %s" %
          (sorted(set(kv) - set(want)), sorted(set(want) - set(kv))))
    for k, v in want.items():
        check(kv[k] == v, "key %s: %r, expected %r" % (k, str(kv[k])[:200], str(v)[:200]))
    print("ok: %d metadata keys (types and values); %d tokens, %d merges" %
          (len(kv), len(toks), len(merges)))

    # ---- tensors: the expected list, computed here ----
    E, L = cfg["hidden_size"], cfg["num_hidden_layers"]
    pre = "model.language_model." if "model.language_model.embed_tokens.weight" in st else "model."
    exp = []  # (gguf name, hf name, transform)
    exp.append(("token_embd.weight", pre + "embed_tokens.weight", None))
    for i in range(L):
        b, h = "blk.%d." % i, pre + "layers.%d." % i
        exp.append((b + "attn_norm.weight", h + "input_layernorm.weight", "add1" if q35 else None))
        if q35 and cfg["layer_types"][i] == "linear_attention":
            la = h + "linear_attn."
            exp += [(b + "attn_qkv.weight", la + "in_proj_qkv.weight", "vrows_qkv"),
                    (b + "attn_gate.weight", la + "in_proj_z.weight", "vrows"),
                    (b + "ssm_conv1d.weight", la + "conv1d.weight", "vconv"),
                    (b + "ssm_dt.bias", la + "dt_bias", "vheads"),
                    (b + "ssm_a", la + "A_log", "vheads_negexp"),
                    (b + "ssm_beta.weight", la + "in_proj_b.weight", "vheads"),
                    (b + "ssm_alpha.weight", la + "in_proj_a.weight", "vheads"),
                    (b + "ssm_norm.weight", la + "norm.weight", None),
                    (b + "ssm_out.weight", la + "out_proj.weight", "vcols")]
        else:
            sa = h + "self_attn."
            exp += [(b + "attn_q.weight", sa + "q_proj.weight", None),
                    (b + "attn_k.weight", sa + "k_proj.weight", None),
                    (b + "attn_v.weight", sa + "v_proj.weight", None),
                    (b + "attn_output.weight", sa + "o_proj.weight", None),
                    (b + "attn_q_norm.weight", sa + "q_norm.weight", "add1" if q35 else None),
                    (b + "attn_k_norm.weight", sa + "k_norm.weight", "add1" if q35 else None)]
        exp.append((b + ("post_attention_norm.weight" if q35 else "ffn_norm.weight"),
                    h + "post_attention_layernorm.weight", "add1" if q35 else None))
        exp += [(b + "ffn_gate.weight", h + "mlp.gate_proj.weight", None),
                (b + "ffn_up.weight", h + "mlp.up_proj.weight", None),
                (b + "ffn_down.weight", h + "mlp.down_proj.weight", None)]
    exp.append(("output_norm.weight", pre + "norm.weight", "add1" if q35 else None))
    if not cfg["tie_word_embeddings"]:
        exp.append(("output.weight", "lm_head.weight", None))
    check([x[0] for x in infos] == [x[0] for x in exp],
          "tensor names/order: %s" % [x[0] for x in infos])

    if q35:
        Hk, Hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
        dv, r = cfg["linear_value_head_dim"], cfg["linear_num_value_heads"] // Hk
        key_dim = Hk * cfg["linear_key_head_dim"]

    def vperm(n, hd):
        """perm[new] = old: V heads grouped by key head (g*r + j) -> tiled (j*Hk + g)."""
        perm = [0] * n
        for g in range(Hk):
            for j in range(r):
                for d in range(hd):
                    perm[(j * Hk + g) * hd + d] = (g * r + j) * hd + d
        return perm

    off = 0
    n_ulp = 0
    for (name, ne, typ, offset), (_, hf, tr) in zip(infos, exp):
        dtype, shape, vals, raw = st[hf]
        rows = shape[0]
        cols = len(vals) // rows
        want_ne = [rows] if len(shape) == 1 else [cols, rows]
        check(ne == want_ne, "%s: ne %s, expected %s" % (name, ne, want_ne))
        f32_type = (len(want_ne) == 1 or name.endswith("_norm.weight") or "ssm_conv1d" in name
                    or not name.endswith(".weight"))
        check(typ == (GGML_F32 if f32_type else GGML_F16), "%s: type %d" % (name, typ))
        check(offset == off, "%s: offset %d, expected %d" % (name, offset, off))
        nbytes = len(vals) * (4 if f32_type else 2)
        off += (nbytes + 31) // 32 * 32
        # the expected values, row-major [rows][cols]
        rp, cp = list(range(rows)), list(range(cols))
        if tr == "vrows_qkv" or tr == "vconv":
            rp = list(range(2 * key_dim)) + [2 * key_dim + x for x in vperm(rows - 2 * key_dim, dv)]
        elif tr == "vrows":
            rp = vperm(rows, dv)
        elif tr in ("vheads", "vheads_negexp"):
            rp = vperm(rows, 1)
        elif tr == "vcols":
            cp = vperm(cols, dv)
        got = data[start + offset:start + offset + nbytes]
        if f32_type:
            src = [vals[rp[i] * cols + cp[c]] for i in range(rows) for c in range(cols)]
            if tr == "add1":
                src = [f32(1.0 + v) for v in src]
            gv = struct.unpack("<%dI" % len(src), got)
            if tr == "vheads_negexp":
                ev = struct.unpack("<%dI" % len(src), struct.pack("<%df" % len(src),
                                                                   *[-math.exp(v) for v in src]))
                for a, b in zip(gv, ev):
                    check(abs(a - b) <= 1, "%s: %08x vs %08x" % (name, a, b))
                    n_ulp += a != b
            else:
                check(gv == struct.unpack("<%dI" % len(src), struct.pack("<%df" % len(src), *src)),
                      "%s: F32 values differ" % name)
        else:
            if dtype == "F16":  # bit for bit, permuted
                src16 = struct.unpack("<%dH" % len(vals), raw)
                ev = [src16[rp[i] * cols + cp[c]] for i in range(rows) for c in range(cols)]
            else:  # rounded to nearest even by Python's own float16 packing
                ev = struct.unpack("<%dH" % len(vals), struct.pack(
                    "<%de" % len(vals), *[vals[rp[i] * cols + cp[c]] for i in range(rows)
                                          for c in range(cols)]))
            check(list(struct.unpack("<%dH" % len(ev), got)) == list(ev),
                  "%s: F16 values differ" % name)
        check(all(x == 0 for x in data[start + offset + nbytes:start + off]),
              "%s: padding not zero" % name)
    check(len(data) == start + off, "file size %d, expected %d" % (len(data), start + off))
    print("ok: %d tensors (names, shapes, types, offsets, bytes; %d ssm_a values 1 ulp off)" %
          (len(infos), n_ulp))


if __name__ == "__main__":
    main()
