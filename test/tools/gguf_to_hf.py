#!/usr/bin/env python3
"""gguf_to_hf.py -- recreate a Hugging Face checkpoint from an F16/F32 qwen3 or qwen35 GGUF.

    python3 test/tools/gguf_to_hf.py [--check] GGUF CONFIG_JSON OUT_DIR

    GGUF         an F16 or F32 GGUF (tensor types F16 and F32 only) of architecture qwen3 or
                 qwen35, laid out as test/train/hf_to_gguf (and llama.cpp's converter) lay it out
    CONFIG_JSON  the transformers config: a training record (test/data/trained/qwen3-train.json,
                 qwen35-train.json: its "config" object) or a plain config.json; model_type
                 "qwen3" (Qwen3ForCausalLM) or "qwen3_5_text" (Qwen3_5ForCausalLM)
    OUT_DIR      gets config.json and model.safetensors (created if missing; each file written
                 under a temporary name and renamed when complete)
    --check      after writing, read OUT_DIR back (own readers), apply the converter's forward
                 transforms to every tensor and compare with the GGUF, bit for bit

The inverse of test/train/hf_to_gguf.cu's transforms (its header comment lists them):
  qwen3   names only.
  qwen35  every *norm.weight but linear_attn.norm gets -1 (the GGUF holds 1 + w of the
          zero-centred norm); A_log = log(-ssm_a); ssm_dt.bias -> linear_attn.dt_bias; ssm_conv1d
          {K, C} -> conv1d.weight [C, 1, K]; the value heads go back from llama.cpp's tiled order
          (j*Hk + g) to HF's grouped order (g*r + j) in the V rows of in_proj_qkv, the rows of
          in_proj_z, in_proj_a, in_proj_b, A_log, dt_bias, the V channels of conv1d and the
          columns of out_proj.
  A GGUF without output.weight is a tied model: config.json then says tie_word_embeddings true
  (false otherwise), whatever CONFIG_JSON said (a note is printed when they differ).
Tensor dtypes in model.safetensors: an F16 GGUF tensor stays F16 (its bits), an F32 one stays F32,
A_log is F64 (log(-ssm_a) in double: -exp of it gives ssm_a back to double precision).

Needs only the Python 3 standard library; uses numpy + safetensors to write the file when both are
importable. Every error is one line on stderr and exit status 1.
"""
import json
import math
import os
import struct
import sys
import tempfile
from array import array

GGML_F32, GGML_F16 = 0, 1
GGML_TYPE_NAMES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0",
                   10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 20: "IQ4_NL",
                   23: "IQ4_XS", 30: "BF16"}

# GGUF metadata value types
(T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR, T_U64, T_I64,
 T_F64) = range(13)
SCALAR_FMT = {T_U8: "<B", T_I8: "<b", T_U16: "<H", T_I16: "<h", T_U32: "<I", T_I32: "<i",
              T_F32: "<f", T_BOOL: "<B", T_U64: "<Q", T_I64: "<q", T_F64: "<d"}

# safetensors dtype name -> (array typecode, bytes per element, struct letter)
ST_TYPES = {"F16": ("H", 2, "e"), "F32": ("f", 4, "f"), "F64": ("d", 8, "d")}


class Fail(Exception):
    """An error for the user: printed as one line, exit status 1."""


# ------------------------------------------------------------------------------------------------
# GGUF reader: every read bounded by the bytes left
# ------------------------------------------------------------------------------------------------

class Reader:
    def __init__(self, data, path):
        self.d, self.p, self.path = data, 0, path

    def need(self, n, what):
        if n < 0 or n > len(self.d) - self.p:
            raise Fail("%s: truncated: %s needs %d bytes at offset %d, the file has %d left"
                       % (self.path, what, n, self.p, len(self.d) - self.p))

    def take(self, fmt, what):
        n = struct.calcsize(fmt)
        self.need(n, what)
        v = struct.unpack_from(fmt, self.d, self.p)[0]
        self.p += n
        return v

    def string(self, what):
        n = self.take("<Q", what + " length")
        self.need(n, what)
        s = bytes(self.d[self.p:self.p + n])
        self.p += n
        return s

    def value(self, t, what, depth=0):
        if t == T_STR:
            return self.string(what)
        if t == T_ARR:
            if depth > 2:
                raise Fail("%s: %s: arrays nested too deep" % (self.path, what))
            et = self.take("<I", what + " element type")
            n = self.take("<Q", what + " element count")
            # every element takes at least one byte: the count is bounded by the bytes left
            self.need(min(n, len(self.d)), what + " elements")
            if et in SCALAR_FMT:
                size = struct.calcsize(SCALAR_FMT[et])
                self.need(n * size, what + " elements")
                vals = list(struct.unpack_from("<%d%s" % (n, SCALAR_FMT[et][1]), self.d, self.p))
                self.p += n * size
                return vals
            if et not in (T_STR, T_ARR):
                raise Fail("%s: %s: unknown array element type %d" % (self.path, what, et))
            return [self.value(et, what, depth + 1) for _ in range(n)]
        if t not in SCALAR_FMT:
            raise Fail("%s: %s: unknown value type %d" % (self.path, what, t))
        return self.take(SCALAR_FMT[t], what)


def read_all(path):
    """The bytes of a file, or Fail naming it."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise Fail("%s: %s" % (path, e.strerror))


def read_gguf(path):
    """Returns (metadata dict, tensors dict name -> (ne list, type, bytes view))."""
    data = read_all(path)
    r = Reader(memoryview(data), path)
    if len(data) < 4 or data[:4] != b"GGUF":
        raise Fail("%s: not a GGUF file (no GGUF magic)" % path)
    r.p = 4
    version = r.take("<I", "version")
    if version not in (2, 3):
        raise Fail("%s: GGUF version %d is not supported (2 or 3)" % (path, version))
    n_tensors = r.take("<Q", "tensor count")
    n_kv = r.take("<Q", "key count")
    # a key takes at least 12 bytes, a tensor info at least 28: bounded by the file size
    if n_kv * 12 > len(data) or n_tensors * 28 > len(data):
        raise Fail("%s: %d keys and %d tensors cannot fit in %d bytes"
                   % (path, n_kv, n_tensors, len(data)))
    meta = {}
    for i in range(n_kv):
        key = r.string("key %d" % i).decode("utf-8", "replace")
        t = r.take("<I", "type of key " + key)
        if key in meta:
            raise Fail("%s: key '%s' appears twice" % (path, key))
        meta[key] = r.value(t, "key " + key)
    infos = []
    for i in range(n_tensors):
        name = r.string("tensor %d name" % i).decode("utf-8", "replace")
        nd = r.take("<I", "dimensions of " + name)
        if not 1 <= nd <= 4:
            raise Fail("%s: tensor '%s' has %d dimensions (1 to 4)" % (path, name, nd))
        ne = [r.take("<Q", "shape of " + name) for _ in range(nd)]
        ttype = r.take("<I", "type of " + name)
        offset = r.take("<Q", "offset of " + name)
        infos.append((name, ne, ttype, offset))
    align = meta.get("general.alignment", 32)
    if not isinstance(align, int) or align < 1 or align & (align - 1):
        raise Fail("%s: general.alignment %r is not a power of two" % (path, align))
    start = (r.p + align - 1) // align * align
    tensors, spans = {}, []
    for name, ne, ttype, offset in infos:
        if name in tensors:
            raise Fail("%s: tensor '%s' appears twice" % (path, name))
        if ttype not in (GGML_F32, GGML_F16):
            raise Fail("%s: tensor '%s' has type %s (%d): only F32 and F16 GGUFs can be turned "
                       "back into a checkpoint" % (path, name,
                                                   GGML_TYPE_NAMES.get(ttype, "?"), ttype))
        n = 1
        for d in ne:
            if d < 1 or d > 1 << 40:
                raise Fail("%s: tensor '%s' has a bad shape %s" % (path, name, ne))
            n *= d
        nbytes = n * (4 if ttype == GGML_F32 else 2)
        if offset % align:
            raise Fail("%s: tensor '%s' offset %d is not a multiple of %d"
                       % (path, name, offset, align))
        if start + offset + nbytes > len(data):
            raise Fail("%s: tensor '%s' (%d bytes at data offset %d) ends past the end of the "
                       "file (%d bytes)" % (path, name, nbytes, offset, len(data)))
        tensors[name] = (ne, ttype, r.d[start + offset:start + offset + nbytes])
        spans.append((offset, offset + nbytes, name))
    spans.sort()
    for a, b in zip(spans, spans[1:]):
        if b[0] < a[1]:
            raise Fail("%s: tensors '%s' and '%s' overlap" % (path, a[2], b[2]))
    return meta, tensors


# ------------------------------------------------------------------------------------------------
# The config and the tensor plan (test/train/hf_to_gguf.cu's make_plan, seen from the GGUF side)
# ------------------------------------------------------------------------------------------------

def load_config(path):
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as e:
        raise Fail("%s: %s" % (path, e.strerror))
    except ValueError as e:
        raise Fail("%s: bad JSON: %s" % (path, e))
    if isinstance(doc, dict) and isinstance(doc.get("config"), dict):
        doc = doc["config"]  # a training record
    if not isinstance(doc, dict) or "model_type" not in doc:
        raise Fail("%s: neither a config.json nor a training record with a \"config\" object"
                   % path)
    return dict(doc)


def cfg_int(cfg, key, path, default=None):
    v = cfg.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise Fail("%s: %s must be a positive whole number (got %r)" % (path, key, v))
    return v


class Shape:
    """The model's sizes, from the config, checked against the GGUF's metadata."""

    def __init__(self, cfg, cfg_path, meta, gguf_path):
        mt = cfg["model_type"]
        if mt not in ("qwen3", "qwen3_5_text"):
            raise Fail("%s: model_type '%s' is not supported (qwen3 or qwen3_5_text)"
                       % (cfg_path, mt))
        self.q35 = mt == "qwen3_5_text"
        arch = meta.get("general.architecture", b"")
        arch = arch.decode("utf-8", "replace") if isinstance(arch, bytes) else repr(arch)
        want = "qwen35" if self.q35 else "qwen3"
        if arch != want:
            raise Fail("%s: general.architecture is '%s', but %s says model_type '%s' (%s)"
                       % (gguf_path, arch, cfg_path, mt, want))
        self.L = cfg_int(cfg, "num_hidden_layers", cfg_path)
        self.E = cfg_int(cfg, "hidden_size", cfg_path)
        self.F = cfg_int(cfg, "intermediate_size", cfg_path)
        self.V = cfg_int(cfg, "vocab_size", cfg_path)
        self.H = cfg_int(cfg, "num_attention_heads", cfg_path)
        self.Hkv = cfg_int(cfg, "num_key_value_heads", cfg_path)
        hd = cfg.get("head_dim") or self.E // self.H
        self.hd = cfg_int({"head_dim": hd}, "head_dim", cfg_path)
        checks = [("block_count", self.L), ("embedding_length", self.E),
                  ("feed_forward_length", self.F), ("attention.head_count", self.H),
                  ("attention.head_count_kv", self.Hkv), ("attention.key_length", self.hd)]
        self.full = [True] * self.L
        if self.q35:
            lt = cfg.get("layer_types")
            if not isinstance(lt, list) or len(lt) != self.L or any(
                    x not in ("full_attention", "linear_attention") for x in lt):
                raise Fail("%s: layer_types must list \"full_attention\" or \"linear_attention\" "
                           "for each of the %d layers" % (cfg_path, self.L))
            self.full = [x == "full_attention" for x in lt]
            self.Hk = cfg_int(cfg, "linear_num_key_heads", cfg_path)
            self.Hv = cfg_int(cfg, "linear_num_value_heads", cfg_path)
            self.dk = cfg_int(cfg, "linear_key_head_dim", cfg_path)
            self.dv = cfg_int(cfg, "linear_value_head_dim", cfg_path)
            self.conv_k = cfg_int(cfg, "linear_conv_kernel_dim", cfg_path)
            if self.Hv % self.Hk:
                raise Fail("%s: linear_num_value_heads %d is not a multiple of "
                           "linear_num_key_heads %d" % (cfg_path, self.Hv, self.Hk))
            checks += [("ssm.conv_kernel", self.conv_k), ("ssm.state_size", self.dk),
                       ("ssm.group_count", self.Hk), ("ssm.time_step_rank", self.Hv),
                       ("ssm.inner_size", self.Hv * self.dv)]
            rope = cfg.get("rope_parameters") or {}
            prf = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
            checks.append(("rope.dimension_count", int(self.hd * prf)))
        for key, v in checks:
            g = meta.get(want + "." + key)
            if g is not None and g != v:
                raise Fail("%s: %s.%s is %r, but %s implies %d"
                           % (gguf_path, want, key, g, cfg_path, v))
        eps = cfg.get("rms_norm_eps")
        g = meta.get(want + ".attention.layer_norm_rms_epsilon")
        if isinstance(eps, (int, float)) and isinstance(g, float) and not close32(g, eps):
            raise Fail("%s: rms epsilon %g, but %s says rms_norm_eps %g"
                       % (gguf_path, g, cfg_path, eps))
        rope = cfg.get("rope_parameters") or {}
        theta = rope.get("rope_theta", cfg.get("rope_theta"))
        g = meta.get(want + ".rope.freq_base")
        if isinstance(theta, (int, float)) and isinstance(g, float) and not close32(g, theta):
            raise Fail("%s: rope.freq_base %g, but %s says rope_theta %g"
                       % (gguf_path, g, cfg_path, theta))


def close32(a, b):
    """a (a float32 from the GGUF) is b rounded to float32."""
    return struct.unpack("<f", struct.pack("<f", b))[0] == a


class Item:
    """One tensor: HF name, GGUF name, HF shape, GGUF ne, and the converter's transforms."""

    def __init__(self, hf, gguf, shape):
        self.hf, self.gguf, self.shape = hf, gguf, list(shape)
        self.rows = shape[0]
        self.cols = 1
        for d in shape[1:]:
            self.cols *= d
        # GGUF ne: {cols, rows}; a vector {n}; conv1d [C, 1, K] squeezed to {K, C}
        self.ne = [self.rows] if len(shape) == 1 else [self.cols, self.rows]
        self.add1 = False       # GGUF = 1 + w (zero-centred norms of qwen35)
        self.negexp = False     # GGUF = -exp(w) (A_log -> ssm_a)
        self.ro_axis = -1       # V-head reorder: -1 none, 0 rows, 1 columns
        self.ro_start = 0
        self.ro_hd = 1


def make_plan(s):
    """Every tensor of the model, in the converter's order (output.weight last, maybe absent)."""
    items = []

    def add(hf, gguf, *shape):
        it = Item(hf, gguf, shape)
        items.append(it)
        return it

    E, F, V, hd = s.E, s.F, s.V, s.hd
    add("model.embed_tokens.weight", "token_embd.weight", V, E)
    for l in range(s.L):
        p, b = "model.layers.%d." % l, "blk.%d." % l
        add(p + "input_layernorm.weight", b + "attn_norm.weight", E).add1 = s.q35
        if s.q35 and not s.full[l]:
            key_dim, value_dim = s.Hk * s.dk, s.Hv * s.dv
            conv_dim = 2 * key_dim + value_dim
            la = p + "linear_attn."
            it = add(la + "in_proj_qkv.weight", b + "attn_qkv.weight", conv_dim, E)
            it.ro_axis, it.ro_start, it.ro_hd = 0, 2 * key_dim, s.dv
            it = add(la + "in_proj_z.weight", b + "attn_gate.weight", value_dim, E)
            it.ro_axis, it.ro_hd = 0, s.dv
            it = add(la + "conv1d.weight", b + "ssm_conv1d.weight", conv_dim, 1, s.conv_k)
            it.ro_axis, it.ro_start, it.ro_hd = 0, 2 * key_dim, s.dv
            add(la + "dt_bias", b + "ssm_dt.bias", s.Hv).ro_axis = 0
            it = add(la + "A_log", b + "ssm_a", s.Hv)
            it.ro_axis, it.negexp = 0, True
            add(la + "in_proj_b.weight", b + "ssm_beta.weight", s.Hv, E).ro_axis = 0
            add(la + "in_proj_a.weight", b + "ssm_alpha.weight", s.Hv, E).ro_axis = 0
            add(la + "norm.weight", b + "ssm_norm.weight", s.dv)  # as it is: no +1
            it = add(la + "out_proj.weight", b + "ssm_out.weight", E, value_dim)
            it.ro_axis, it.ro_hd = 1, s.dv
        else:
            sa = p + "self_attn."
            add(sa + "q_proj.weight", b + "attn_q.weight", s.H * hd * (2 if s.q35 else 1), E)
            add(sa + "k_proj.weight", b + "attn_k.weight", s.Hkv * hd, E)
            add(sa + "v_proj.weight", b + "attn_v.weight", s.Hkv * hd, E)
            add(sa + "o_proj.weight", b + "attn_output.weight", E, s.H * hd)
            add(sa + "q_norm.weight", b + "attn_q_norm.weight", hd).add1 = s.q35
            add(sa + "k_norm.weight", b + "attn_k_norm.weight", hd).add1 = s.q35
        post = "post_attention_norm.weight" if s.q35 else "ffn_norm.weight"
        add(p + "post_attention_layernorm.weight", b + post, E).add1 = s.q35
        add(p + "mlp.gate_proj.weight", b + "ffn_gate.weight", F, E)
        add(p + "mlp.up_proj.weight", b + "ffn_up.weight", F, E)
        add(p + "mlp.down_proj.weight", b + "ffn_down.weight", E, F)
    add("model.norm.weight", "output_norm.weight", E).add1 = s.q35
    add("lm_head.weight", "output.weight", V, E)
    return items


def reorder_src(it, s, i):
    """The converter's map along the reordered axis: GGUF (tiled) index i holds HF (grouped)
    index reorder_src(i): tiled head j*Hk + g is grouped head g*r + j."""
    if i < it.ro_start:
        return i
    k = i - it.ro_start
    hd = it.ro_hd
    head, d = divmod(k, hd)
    r = s.Hv // s.Hk
    j, g = divmod(head, s.Hk)
    return it.ro_start + (g * r + j) * hd + d


def ro_len(it):
    return it.rows if it.ro_axis == 0 else it.cols


# ------------------------------------------------------------------------------------------------
# GGUF -> checkpoint: the inverse transforms
# ------------------------------------------------------------------------------------------------

def as_array(ttype, raw):
    """A GGUF tensor's data: array('f') of F32 values, or array('H') of F16 bit patterns."""
    a = array("f" if ttype == GGML_F32 else "H")
    a.frombytes(bytes(raw))
    if sys.byteorder == "big":
        a.byteswap()
    return a


def head_blocks(it, s):
    """The reordered axis in blocks of ro_hd: a list of (GGUF block, HF block) pairs, covering
    the reordered part (indices from ro_start)."""
    n = (ro_len(it) - it.ro_start) // it.ro_hd
    out = []
    for blk in range(n):
        src = reorder_src(it, s, it.ro_start + blk * it.ro_hd)
        out.append((blk, (src - it.ro_start) // it.ro_hd))
    return out


def invert_reorder(it, s, a):
    """GGUF element order -> HF element order (a row-major [rows][cols] array)."""
    if it.ro_axis < 0:
        return a
    hd, rows, cols = it.ro_hd, it.rows, it.cols
    blocks = sorted(head_blocks(it, s), key=lambda x: x[1])  # in HF order
    out = array(a.typecode)
    if it.ro_axis == 0:
        out.extend(a[:it.ro_start * cols])
        for g_blk, _ in blocks:
            r0 = it.ro_start + g_blk * hd
            out.extend(a[r0 * cols:(r0 + hd) * cols])
    else:
        for r in range(rows):
            base = r * cols
            out.extend(a[base:base + it.ro_start])
            for g_blk, _ in blocks:
                c0 = base + it.ro_start + g_blk * hd
                out.extend(a[c0:c0 + hd])
    assert len(out) == len(a)
    return out


def to_hf(it, s, ne, ttype, raw, gguf_path):
    """One tensor's HF (dtype name, array of values in HF order)."""
    if ne != it.ne:
        raise Fail("%s: tensor '%s' has shape %s; the config implies %s (as %s %s)"
                   % (gguf_path, it.gguf, ne, it.ne, it.hf, it.shape))
    a = invert_reorder(it, s, as_array(ttype, raw))
    if not (it.add1 or it.negexp):
        return ("F32" if ttype == GGML_F32 else "F16"), a
    if ttype != GGML_F32:
        a = array("f", struct.unpack("<%de" % len(a), a.tobytes()))
    for x in a:
        if not math.isfinite(x):
            raise Fail("%s: tensor '%s' holds a non-finite value" % (gguf_path, it.gguf))
    if it.add1:
        # 1 + w in float32 was exact for the converter's w, so g - 1 (exact in double) is w
        return "F32", array("f", [x - 1.0 for x in a])
    if any(x >= 0 for x in a):
        raise Fail("%s: tensor '%s' (-exp(A_log)) holds a value >= 0" % (gguf_path, it.gguf))
    return "F64", array("d", [math.log(-x) for x in a])


def build(gguf_path, cfg_path):
    """Returns (config dict to write, [(hf name, dtype, shape, array)])."""
    meta, tensors = read_gguf(gguf_path)
    cfg = load_config(cfg_path)
    s = Shape(cfg, cfg_path, meta, gguf_path)
    tied = "output.weight" not in tensors
    if bool(cfg.get("tie_word_embeddings", False)) != tied:
        print("note: %s has %s output.weight: tie_word_embeddings is written as %s (%s said %s)"
              % (gguf_path, "no" if tied else "an", str(tied).lower(), cfg_path,
                 cfg.get("tie_word_embeddings")), file=sys.stderr)
    cfg["tie_word_embeddings"] = tied
    cfg["architectures"] = ["Qwen3_5ForCausalLM" if s.q35 else "Qwen3ForCausalLM"]
    out, used = [], set()
    for it in make_plan(s):
        if it.gguf == "output.weight" and tied:
            continue
        if it.gguf not in tensors:
            raise Fail("%s: tensor '%s' (%s) is missing" % (gguf_path, it.gguf, it.hf))
        ne, ttype, raw = tensors[it.gguf]
        dtype, a = to_hf(it, s, ne, ttype, raw, gguf_path)
        out.append((it.hf, dtype, it.shape, a))
        used.add(it.gguf)
    extra = sorted(set(tensors) - used)
    if extra:
        raise Fail("%s: %d tensor(s) are not part of the %s model the config describes: %s"
                   % (gguf_path, len(extra), "qwen35" if s.q35 else "qwen3",
                      ", ".join(extra[:5])))
    return cfg, out


# ------------------------------------------------------------------------------------------------
# Writing: safetensors (numpy + safetensors when importable, else our own writer), config.json
# ------------------------------------------------------------------------------------------------

def le_bytes(a):
    if sys.byteorder == "big":
        a = array(a.typecode, a)
        a.byteswap()
    return a.tobytes()


def write_atomic(path, write):
    """write(f) into a temporary file next to path, renamed over path when complete."""
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".tmp-", dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def safetensors_bytes(tensors):
    """Our own writer: u64 header length, JSON header (padded with spaces to 8 bytes), data."""
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, dtype, shape, a in tensors:
        n = len(a) * ST_TYPES[dtype][1]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h


def write_safetensors(path, tensors):
    try:
        import numpy as np
        from safetensors.numpy import save_file
    except ImportError:
        np = None
    if np is not None:
        npt = {"F16": "<f2", "F32": "<f4", "F64": "<f8"}
        arrays = {name: np.frombuffer(le_bytes(a), dtype=npt[dtype]).reshape(shape)
                  for name, dtype, shape, a in tensors}
        tmp_dir = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(prefix="model.safetensors.tmp-", dir=tmp_dir)
        os.close(fd)
        try:
            save_file(arrays, tmp, metadata={"format": "pt"})
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return "safetensors " + __import__("safetensors").__version__

    def write(f):
        f.write(safetensors_bytes(tensors))
        for _, _, _, a in tensors:
            f.write(le_bytes(a))
    write_atomic(path, write)
    return "own writer"


# ------------------------------------------------------------------------------------------------
# --check: read the checkpoint back, apply the converter's forward transforms, compare bit for bit
# ------------------------------------------------------------------------------------------------

def read_safetensors(path):
    """name -> (dtype, shape, raw bytes); bounds-checked."""
    data = read_all(path)
    if len(data) < 8:
        raise Fail("%s: truncated" % path)
    n = struct.unpack_from("<Q", data, 0)[0]
    if n > len(data) - 8:
        raise Fail("%s: header length %d runs past the end of the file" % (path, n))
    try:
        header = json.loads(data[8:8 + n])
    except ValueError as e:
        raise Fail("%s: bad header JSON: %s" % (path, e))
    body = memoryview(data)[8 + n:]
    out, spans = {}, []
    for name, e in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, (b, en) = e["dtype"], e["shape"], e["data_offsets"]
        if dtype not in ST_TYPES:
            raise Fail("%s: tensor '%s' has dtype %s" % (path, name, dtype))
        count = 1
        for d in shape:
            count *= d
        if not 0 <= b <= en <= len(body) or en - b != count * ST_TYPES[dtype][1]:
            raise Fail("%s: tensor '%s' has bad data offsets" % (path, name))
        out[name] = (dtype, shape, body[b:en])
        spans.append((b, en))
    spans.sort()
    if any(x[1] > y[0] for x, y in zip(spans, spans[1:])):
        raise Fail("%s: tensors overlap" % path)
    return out


def values(dtype, raw):
    """Python floats of a little-endian tensor."""
    letter = ST_TYPES[dtype][2]
    return list(struct.unpack("<%d%s" % (len(raw) // ST_TYPES[dtype][1], letter), raw))


def forward(it, s, dtype, raw, gguf_type):
    """The converter's transforms on an HF tensor: the GGUF bytes it would write."""
    if dtype == "F16" and gguf_type == GGML_F16 and not (it.add1 or it.negexp):
        src = array("H")
        src.frombytes(bytes(raw))  # F16 sources are copied bit for bit
        enc = None
    else:
        src = values(dtype, raw)
        enc = "<%d%s" % (len(src), "f" if gguf_type == GGML_F32 else "e")
    if it.ro_axis == 0:  # GGUF row r is HF row reorder_src(r)
        cols = it.cols
        perm = [reorder_src(it, s, r) for r in range(it.rows)]
        src = [src[p * cols + c] for p in perm for c in range(cols)]
    elif it.ro_axis == 1:  # GGUF column c is HF column reorder_src(c)
        cols = it.cols
        perm = [reorder_src(it, s, c) for c in range(cols)]
        src = [src[r * cols + p] for r in range(it.rows) for p in perm]
    if enc is None:
        a = array("H", src)
        return le_bytes(a)
    if it.add1:
        src = [f32(1.0 + f32(x)) for x in src]  # float32 arithmetic: 1 + w rounded once
    if it.negexp:
        src = [f32(-math.exp(x)) for x in src]
    return struct.pack(enc, *src)  # struct rounds to float32 / float16 to nearest even


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def check(gguf_path, out_dir):
    meta, tensors = read_gguf(gguf_path)
    cfg_path = os.path.join(out_dir, "config.json")
    cfg = load_config(cfg_path)
    s = Shape(cfg, cfg_path, meta, gguf_path)
    st = read_safetensors(os.path.join(out_dir, "model.safetensors"))
    want_arch = "Qwen3_5ForCausalLM" if s.q35 else "Qwen3ForCausalLM"
    if cfg.get("architectures") != [want_arch]:
        raise Fail("check: config.json architectures is %r, not [%r]"
                   % (cfg.get("architectures"), want_arch))
    tied = cfg.get("tie_word_embeddings")
    if tied != ("output.weight" not in tensors):
        raise Fail("check: tie_word_embeddings is %r, but the GGUF %s output.weight"
                   % (tied, "has no" if "output.weight" not in tensors else "has"))
    used, n_bytes = set(), 0
    for it in make_plan(s):
        if it.gguf == "output.weight" and tied:
            if it.hf in st:
                raise Fail("check: tied, but lm_head.weight is in the checkpoint")
            continue
        if it.hf not in st:
            raise Fail("check: '%s' is missing from the checkpoint" % it.hf)
        dtype, shape, raw = st[it.hf]
        if shape != it.shape:
            raise Fail("check: '%s' has shape %s, not %s" % (it.hf, shape, it.shape))
        ne, ttype, graw = tensors[it.gguf]
        if ne != it.ne:
            raise Fail("check: GGUF '%s' has shape %s, not %s" % (it.gguf, ne, it.ne))
        got = forward(it, s, dtype, raw, ttype)
        if got != bytes(graw):
            width = 4 if ttype == GGML_F32 else 2
            bad = sum(1 for i in range(0, len(got), width)
                      if got[i:i + width] != bytes(graw[i:i + width]))
            raise Fail("check: '%s' -> '%s': %d of %d elements differ from the GGUF"
                       % (it.hf, it.gguf, bad, len(got) // width))
        used.add(it.hf)
        n_bytes += len(got)
    extra = sorted(set(st) - used)
    if extra:
        raise Fail("check: the checkpoint has tensors the plan does not use: %s"
                   % ", ".join(extra[:5]))
    if len(used) != len(tensors):
        raise Fail("check: %d checkpoint tensors for %d GGUF tensors" % (len(used), len(tensors)))
    print("check: OK: %d tensors (%.1f MiB) of %s, forward-transformed from %s, equal to the "
          "GGUF bit for bit; tie_word_embeddings %s" % (len(used), n_bytes / 2 ** 20, gguf_path,
                                                       out_dir, str(tied).lower()))


# ------------------------------------------------------------------------------------------------
# main
# ------------------------------------------------------------------------------------------------

def main(argv):
    args = [a for a in argv if a != "--check"]
    do_check = len(args) != len(argv)
    if any(a.startswith("-") for a in args) or len(args) != 3:
        raise Fail("usage: gguf_to_hf.py [--check] GGUF CONFIG_JSON OUT_DIR")
    gguf_path, cfg_path, out_dir = args
    cfg, tensors = build(gguf_path, cfg_path)
    os.makedirs(out_dir, exist_ok=True)
    st_path = os.path.join(out_dir, "model.safetensors")
    for p in (gguf_path, cfg_path):  # the outputs must not replace an input
        for q in (st_path, os.path.join(out_dir, "config.json")):
            if os.path.exists(q) and os.path.samefile(p, q):
                raise Fail("output '%s' is the input '%s'" % (q, p))
    how = write_safetensors(st_path, tensors)
    text = (json.dumps(cfg, indent=2, sort_keys=True) + "\n").encode()
    write_atomic(os.path.join(out_dir, "config.json"), lambda f: f.write(text))
    n = sum(len(a) for _, _, _, a in tensors)
    print("wrote %s: %s, %d tensors, %d parameters (%s), tie_word_embeddings %s"
          % (out_dir, cfg["architectures"][0], len(tensors), n, how,
             str(cfg["tie_word_embeddings"]).lower()))
    if do_check:
        check(gguf_path, out_dir)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except Fail as e:
        print("gguf_to_hf: %s" % e, file=sys.stderr)
        sys.exit(1)
