#!/usr/bin/env python3
"""hf_dump_hidden.py -- the intermediate tensors of one prompt through a transformers Qwen3 or
Qwen3.5 checkpoint, under the names and shapes that qwen.cu --dump-hidden writes (llama.cpp's
graph node names), for qwen.cu --diff-hidden.

    python3 test/tools/hf_dump_hidden.py MODEL_DIR OUT_DIR --tokens 1,2,3 \\
        [--tokens-file F] [--n-tokens N] [--dtype float64|float32] [--device cpu|cuda] \\
        [--filter REGEX] [--ref-logits FILE.f32]
    python3 test/tools/hf_dump_hidden.py --selftest [--device cpu|cuda]

MODEL_DIR is a checkpoint directory (config.json + model.safetensors, model_type qwen3 or
qwen3_5_text; test/tools/gguf_to_hf.py makes one from an F16 GGUF). The ids come from --tokens
(comma-separated) or --tokens-file (ids separated by commas or white space); --n-tokens N keeps
the first N. The model is loaded with AutoModelForCausalLM in --dtype (default float64), eager
attention, eval mode, and runs ONE forward over the ids (use_cache=False,
output_hidden_states=True); forward hooks on named modules catch the tensors. Writes
OUT_DIR/NAME.npy (float32 '<f4', C order; T = number of ids) for every name that --filter
selects (re.search, as qwen.cu's --hidden-filter; default
'^(inp_embd|l_out-\\d+|result_norm|result_output)$', '.' for all), and OUT_DIR/manifest.tsv
(file, layer, name, shape, transformers, written_by), in this order:

  inp_embd (T,E); per layer N: attn_norm-N (T,E), then
    full attention: Qcur-N (T,H,hd) [q_norm output + RoPE], Kcur-N (T,Hkv,hd), Vcur-N (T,Hkv,hd),
      kqv_out-N (T,H*hd) [attention before gate and o_proj], attn_gated-N (T,H*hd) [qwen35: the
      o_proj input], attn_out-N (T,E)
    linear attention (qwen35): linear_attn_qkv_mixed-N (T,conv_dim), z-N (T,Hv,S),
      beta_sigmoid-N (T,Hv), gate-N (T,Hv), conv_output_silu-N (T,conv_dim),
      q_conv_predelta-N (T,Hk,S), k_conv_predelta-N (T,Hk,S), v_conv-N (T,Hv,S),
      attn_output-N (T,Hv,S), final_output-N (T,Hv*S), linear_attn_out-N (T,E)
    ffn_inp-N (T,E), ffn_norm-N (T,E), ffn_out-N (T,E), l_out-N (T,E)
  result_norm (T,E), result_output (T,V)

Every linear-attention tensor indexed by value head is in llama.cpp's tiled order (the GGUF's):
our head j*Hk + g is HF's head g*r + j (g < Hk key heads, r = Hv/Hk, j < r).

Self-checks printed to stdout (OK/FAIL lines; exit status 1 on any FAIL, the files are written
anyway): the residual sums (l_out-(N-1) + attn_out-N == ffn_inp-N, ffn_inp-N + ffn_out-N ==
l_out-N), which of hidden_states the layer outputs are, the attention recomputed from
Qcur/Kcur/Vcur, the delta rule recomputed token by token from the dumped q/k/v/gate/beta (this
also checks the head order), the gated norm, and with --ref-logits (raw float32 [P][V], such as
test/data/trained/qwen3-ref.f32) the logits against a reference.

Precision: with --dtype float64 the matrix products and sums are float64, but transformers keeps
some parts in float32 even then: every RMSNorm (the gated one too), the attention's softmax, the
RoPE angles (cos and sin), exp(A_log) and the whole delta rule. Tensors past those steps carry
float32 rounding (about 1e-7 relative).

The trained models, from their F16 GGUFs (the reference logits are transformers' float64 ones):

    python3 test/tools/gguf_to_hf.py --check test/data/trained/qwen35-f16.gguf \
        test/data/trained/qwen35-train.json /tmp/qwen35-hf
    python3 test/tools/hf_dump_hidden.py /tmp/qwen35-hf /tmp/qwen35-dump --filter '.*' \
        --tokens-file test/data/trained/sample-ids.txt --n-tokens 64 \
        --ref-logits test/data/trained/qwen35-ref.f32

--selftest needs no checkpoint: it builds tiny random Qwen3 and Qwen3.5 models (2 layers; Qwen3.5
linear then full attention), saves them with save_pretrained, dumps every name and checks the
files, the manifest and the checks above.
"""
import argparse
import ast
import math
import os
import re
import struct
import sys
import tempfile
from array import array

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_to_hf import write_atomic  # noqa: E402 (the same directory)

DEFAULT_FILTER = r"^(inp_embd|l_out-\d+|result_norm|result_output)$"


class Fail(Exception):
    """An error for the user: printed as one line, exit status 1."""


# ------------------------------------------------------------------------------------------------
# .npy files and the manifest
# ------------------------------------------------------------------------------------------------

def npy_header(shape):
    """A version 1.0 .npy header for float32 little-endian C-order data of this shape."""
    dims = "(%s)" % (", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else ""))
    text = "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }" % dims
    pad = -(10 + len(text) + 1) % 64
    text = text + " " * pad + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode("latin1")


def read_npy(path):
    """(shape, array('f')) of a float32 C-order .npy file; raises Fail on anything else."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:6] != b"\x93NUMPY" or len(data) < 10:
        raise Fail("%s: not a .npy file" % path)
    major = data[6]
    if major == 1:
        hlen, start = struct.unpack_from("<H", data, 8)[0], 10
    else:
        hlen, start = struct.unpack_from("<I", data, 8)[0], 12
    header = ast.literal_eval(data[start:start + hlen].decode("latin1"))
    if header.get("descr") != "<f4" or header.get("fortran_order"):
        raise Fail("%s: not float32 '<f4' C order: %r" % (path, header))
    shape = tuple(header["shape"])
    a = array("f")
    a.frombytes(data[start + hlen:])
    if sys.byteorder == "big":
        a.byteswap()
    n = 1
    for d in shape:
        n *= d
    if len(a) != n:
        raise Fail("%s: %d values for shape %s" % (path, len(a), shape))
    return shape, a


def write_file_atomic(path, chunks):
    """Write the byte strings into a temporary file next to path, then rename it over path
    (gguf_to_hf.py's write_atomic)."""
    write_atomic(path, lambda f: [f.write(c) for c in chunks])


def write_npy(path, t):
    """A torch tensor as float32 C-order .npy (numpy's np.save when numpy is there)."""
    import torch
    t = t.detach().to("cpu", torch.float32).contiguous()
    try:
        import numpy as np
    except ImportError:
        np = None
    if np is not None:
        import io
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(t.numpy(), dtype="<f4"))
        write_file_atomic(path, [buf.getvalue()])
        return
    a = array("f", t.flatten().tolist())
    if sys.byteorder == "big":
        a.byteswap()
    write_file_atomic(path, [npy_header(tuple(t.shape)), a.tobytes()])


# ------------------------------------------------------------------------------------------------
# Capturing: hooks on named modules
# ------------------------------------------------------------------------------------------------

def first_tensor(x):
    """A module's output: the tensor itself, or the first element of a tuple."""
    import torch
    while isinstance(x, (tuple, list)):
        x = x[0]
    if not isinstance(x, torch.Tensor):
        raise Fail("a hooked module returned %s, not a tensor" % type(x).__name__)
    return x


def arg_of(args, kwargs, index, names):
    """A module's input: positional argument `index`, else the first keyword in names."""
    if len(args) > index:
        return args[index]
    for n in names:
        if n in kwargs:
            return kwargs[n]
    raise Fail("a hooked module was called without its argument %s" % names[0])


class Capture:
    """Forward hooks that store detached copies of module inputs and outputs under keys."""

    def __init__(self):
        self.t = {}
        self.handles = []

    def output(self, module, key):
        def hook(mod, args, out):
            self.t[key] = first_tensor(out).detach().clone()
        self.handles.append(module.register_forward_hook(hook))

    def input(self, module, key, index=0, names=("hidden_states",)):
        def hook(mod, args, kwargs):
            self.t[key] = arg_of(args, kwargs, index, names).detach().clone()
        self.handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))

    def position_embeddings(self, module, key):
        def hook(mod, args, kwargs):
            cos, sin = arg_of(args, kwargs, 1, ("position_embeddings",))
            self.t[key] = (cos.detach().clone(), sin.detach().clone())
        self.handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles = []


def need(obj, attr, what):
    if not hasattr(obj, attr):
        raise Fail("the model has no %s.%s: not the module layout this recipe knows" % (what, attr))
    return getattr(obj, attr)


# ------------------------------------------------------------------------------------------------
# The dump
# ------------------------------------------------------------------------------------------------

class Dims:
    """The model's sizes from its config."""

    def __init__(self, cfg):
        self.q35 = cfg.model_type == "qwen3_5_text"
        if cfg.model_type not in ("qwen3", "qwen3_5_text"):
            raise Fail("model_type '%s' is not supported (qwen3 or qwen3_5_text)"
                       % cfg.model_type)
        self.L = cfg.num_hidden_layers
        self.E = cfg.hidden_size
        self.V = cfg.vocab_size
        self.H = cfg.num_attention_heads
        self.Hkv = cfg.num_key_value_heads
        self.hd = getattr(cfg, "head_dim", None) or self.E // self.H
        types = getattr(cfg, "layer_types", None) or ["full_attention"] * self.L
        self.full = [x == "full_attention" for x in types]
        if self.q35:
            self.Hk = cfg.linear_num_key_heads
            self.Hv = cfg.linear_num_value_heads
            self.S = cfg.linear_key_head_dim
            if cfg.linear_value_head_dim != self.S:
                raise Fail("linear_key_head_dim %d != linear_value_head_dim %d: not supported"
                           % (self.S, cfg.linear_value_head_dim))
            self.r = self.Hv // self.Hk
            self.conv_dim = 2 * self.Hk * self.S + self.Hv * self.S
            # our (tiled) value head h = j*Hk + g is HF's (grouped) head g*r + j
            self.perm = [(h % self.Hk) * self.r + h // self.Hk for h in range(self.Hv)]

    def shapes(self, T):
        """name -> shape of every tensor, in the dump's order (independent of the capture)."""
        out = [("inp_embd", (T, self.E))]
        for n in range(self.L):
            out.append(("attn_norm-%d" % n, (T, self.E)))
            if self.full[n]:
                out += [("Qcur-%d" % n, (T, self.H, self.hd)),
                        ("Kcur-%d" % n, (T, self.Hkv, self.hd)),
                        ("Vcur-%d" % n, (T, self.Hkv, self.hd)),
                        ("kqv_out-%d" % n, (T, self.H * self.hd))]
                if self.q35:
                    out.append(("attn_gated-%d" % n, (T, self.H * self.hd)))
                out.append(("attn_out-%d" % n, (T, self.E)))
            else:
                Hk, Hv, S = self.Hk, self.Hv, self.S
                out += [("linear_attn_qkv_mixed-%d" % n, (T, self.conv_dim)),
                        ("z-%d" % n, (T, Hv, S)), ("beta_sigmoid-%d" % n, (T, Hv)),
                        ("gate-%d" % n, (T, Hv)), ("conv_output_silu-%d" % n, (T, self.conv_dim)),
                        ("q_conv_predelta-%d" % n, (T, Hk, S)),
                        ("k_conv_predelta-%d" % n, (T, Hk, S)), ("v_conv-%d" % n, (T, Hv, S)),
                        ("attn_output-%d" % n, (T, Hv, S)), ("final_output-%d" % n, (T, Hv * S)),
                        ("linear_attn_out-%d" % n, (T, self.E))]
            out += [("ffn_inp-%d" % n, (T, self.E)), ("ffn_norm-%d" % n, (T, self.E)),
                    ("ffn_out-%d" % n, (T, self.E)), ("l_out-%d" % n, (T, self.E))]
        out += [("result_norm", (T, self.E)), ("result_output", (T, self.V))]
        return out


def load_model(model_dir, dtype, device):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise Fail("%s: no config.json (a checkpoint directory is expected)" % model_dir)
    kw = dict(attn_implementation="eager", output_loading_info=True)
    try:
        model, info = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, **kw)
    except TypeError:  # transformers without the dtype argument
        model, info = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=dtype, **kw)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    missing = [k for k in info.get("missing_keys", []) if not (tied and k == "lm_head.weight")]
    bad = {"missing": missing, "unexpected": list(info.get("unexpected_keys", [])),
           "mismatched": list(info.get("mismatched_keys", []))}
    for what, keys in bad.items():
        if keys:
            raise Fail("%s: %d %s tensor(s) when loading, e.g. %s"
                       % (model_dir, len(keys), what, sorted(map(str, keys))[:3]))
    model.to(device)
    wrong = sorted({str(p.dtype) for p in model.parameters() if p.dtype != dtype})
    if wrong:
        print("note: parameters loaded as %s: converting the model to %s" % (wrong, dtype))
        model.to(dtype)
    model.eval()
    impl = getattr(model.config, "_attn_implementation", None)
    if impl != "eager":
        raise Fail("attention implementation is %r, not 'eager'" % impl)
    print("loaded %s: %s, transformers %s, torch %s, %s on %s"
          % (model_dir, type(model).__name__, transformers.__version__, torch.__version__,
             dtype, device))
    return model


def rel_err(a, b):
    """max |a - b| / max |b| (in float64)."""
    a, b = a.double(), b.double()
    scale = b.abs().max().item()
    d = (a - b).abs().max().item()
    return d / scale if scale > 0 else d


class Checks:
    """The printed self-checks."""

    def __init__(self):
        self.failed = 0

    def report(self, what, err, tol):
        ok = err <= tol and not math.isnan(err)
        self.failed += 0 if ok else 1
        print("%s %-58s max rel err %.3g (tolerance %.0e)" % ("OK  " if ok else "FAIL", what, err,
                                                                tol))
        return ok


def dump(model_dir, out_dir, ids, dtype_name="float64", device="cpu", filt=DEFAULT_FILTER,
         ref_logits=None, quiet=False):
    """Runs the forward, writes the files; returns (Checks, {name: tensor}, [manifest rows])."""
    import torch
    import transformers
    dtype = {"float64": torch.float64, "float32": torch.float32}[dtype_name]
    try:
        pattern = re.compile(filt)
    except re.error as e:
        raise Fail("--filter %r: %s" % (filt, e))
    model = load_model(model_dir, dtype, device)
    cfg = model.config
    d = Dims(cfg)
    T = len(ids)
    if T < 1:
        raise Fail("no token ids")
    bad = [i for i in ids if not 0 <= i < d.V]
    if bad:
        raise Fail("token id %d is outside the vocabulary (0 .. %d)" % (bad[0], d.V - 1))
    mod = sys.modules[type(model).__module__]  # the model's modeling file
    rope_fn = need(mod, "apply_rotary_pos_emb", mod.__name__)
    base = need(model, "model", type(model).__name__)
    layers = need(base, "layers", "model")
    if len(layers) != d.L:
        raise Fail("the model has %d layers, its config says %d" % (len(layers), d.L))

    cap = Capture()
    cap.output(need(base, "embed_tokens", "model"), "embd")
    cap.output(need(base, "norm", "model"), "norm")
    for n, layer in enumerate(layers):
        p = "model.layers.%d" % n
        cap.output(layer, (n, "out"))
        cap.output(need(layer, "input_layernorm", p), (n, "attn_norm"))
        post = need(layer, "post_attention_layernorm", p)
        cap.input(post, (n, "ffn_inp"))
        cap.output(post, (n, "ffn_norm"))
        cap.output(need(layer, "mlp", p), (n, "ffn_out"))
        if d.full[n]:
            sa = need(layer, "self_attn", p)
            cap.position_embeddings(sa, (n, "pos"))
            for m in ("q_proj", "q_norm", "k_norm", "v_proj"):
                cap.output(need(sa, m, p + ".self_attn"), (n, m))
            o = need(sa, "o_proj", p + ".self_attn")
            cap.input(o, (n, "o_in"))
            cap.output(o, (n, "o_out"))
        else:
            la = need(layer, "linear_attn", p)
            for m in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"):
                cap.output(need(la, m, p + ".linear_attn"), (n, m))
            nm = need(la, "norm", p + ".linear_attn")
            cap.input(nm, (n, "core"), 0, ("hidden_states", "x"))
            cap.input(nm, (n, "zgate"), 1, ("gate", "z"))
            cap.output(nm, (n, "gated"))

    # the attention function's output (before the gate and o_proj): wrap the modeling file's
    # eager_attention_forward, which the eager attention looks up when it runs
    orig_eager = getattr(mod, "eager_attention_forward", None)
    if orig_eager is not None:
        def eager_wrapper(module, *args, **kwargs):
            res = orig_eager(module, *args, **kwargs)
            cap.t[(getattr(module, "layer_idx", -1), "core_attn")] = res[0].detach().clone()
            return res
        mod.eager_attention_forward = eager_wrapper
    try:
        with torch.no_grad():
            x = torch.tensor([ids], dtype=torch.long, device=device)
            out = model(input_ids=x, use_cache=False, output_hidden_states=True)
    finally:
        cap.remove()
        if orig_eager is not None:
            mod.eager_attention_forward = orig_eager
    c = cap.t
    hs = out.hidden_states
    if hs is None or len(hs) != d.L + 1:  # only for the manifest's notes and a printed line
        print("note: output_hidden_states gave %s entries, not %d: not compared"
              % (None if hs is None else len(hs), d.L + 1))
        hs = None

    # --- the named tensors, in order: (name, layer, tensor, where transformers has it) ---
    tensors = []

    def put(name, layer, t, src):
        tensors.append((name, layer, t, src))

    checks = Checks()
    same_h0 = hs is not None and torch.equal(c["embd"], hs[0])
    put("inp_embd", -1, c["embd"][0],
        "model.embed_tokens output" + (" (= hidden_states[0])" if same_h0 else ""))
    with torch.no_grad():
        for n in range(d.L):
            p = "model.layers.%d" % n
            put("attn_norm-%d" % n, n, c[(n, "attn_norm")][0], p + ".input_layernorm output")
            if d.full[n]:
                sa = layers[n].self_attn
                hd = d.hd
                cos, sin = c[(n, "pos")]
                q = c[(n, "q_norm")].transpose(1, 2)  # [1, H, T, hd] as the attention has it
                k = c[(n, "k_norm")].transpose(1, 2)
                q, k = rope_fn(q, k, cos, sin)
                how = ("none: %s.self_attn.%%s output + %s.apply_rotary_pos_emb with the "
                       "position_embeddings %s.self_attn receives" % (p, mod.__name__, p))
                put("Qcur-%d" % n, n, q.transpose(1, 2)[0], how % "q_norm")
                put("Kcur-%d" % n, n, k.transpose(1, 2)[0], how % "k_norm")
                put("Vcur-%d" % n, n, c[(n, "v_proj")][0].view(T, d.Hkv, hd),
                    p + ".self_attn.v_proj output")
                o_in = c[(n, "o_in")][0]
                core = c.get((n, "core_attn"))
                if not d.q35:
                    put("kqv_out-%d" % n, n, o_in, p + ".self_attn.o_proj input")
                    if core is not None:
                        checks.report("kqv_out-%d = the eager attention's output" % n,
                                      rel_err(o_in, core[0].reshape(T, -1)), 0)
                else:
                    gate = c[(n, "q_proj")][0].view(T, d.H, 2 * hd)[..., hd:].reshape(T, -1)
                    if core is not None:
                        kqv = core[0].reshape(T, d.H * hd)
                        src = (p + ".self_attn eager_attention_forward output (reshaped), "
                               "before the gate")
                    else:
                        kqv = o_in / torch.sigmoid(gate)
                        src = ("none: %s.self_attn.o_proj input / sigmoid(gate), the gate the "
                               "second half of each head of q_proj output" % p)
                    put("kqv_out-%d" % n, n, kqv, src)
                    put("attn_gated-%d" % n, n, o_in, p + ".self_attn.o_proj input")
                    checks.report("attn_gated-%d = kqv_out * sigmoid(q_proj gate)" % n,
                                  rel_err(kqv * torch.sigmoid(gate), o_in), exact_tol(dtype))
                put("attn_out-%d" % n, n, c[(n, "o_out")][0], p + ".self_attn.o_proj output")
                scaling = getattr(sa, "scaling", hd ** -0.5)
                check_attention(checks, n, tensors[-6 if d.q35 else -5:], d, scaling)
            else:
                linear_tensors(put, checks, c, n, T, d, layers[n].linear_attn, mod, p)
            put("ffn_inp-%d" % n, n, c[(n, "ffn_inp")][0],
                p + ".post_attention_layernorm input")
            put("ffn_norm-%d" % n, n, c[(n, "ffn_norm")][0],
                p + ".post_attention_layernorm output")
            put("ffn_out-%d" % n, n, c[(n, "ffn_out")][0], p + ".mlp output")
            l_out = c[(n, "out")][0]
            if hs is None:
                where = ""
            elif torch.equal(l_out, hs[n + 1][0]):
                where = " (= hidden_states[%d])" % (n + 1)
            elif torch.equal(c["norm"][0], hs[n + 1][0]):
                where = " (hidden_states[%d] is model.norm output instead)" % (n + 1)
            else:
                where = " (hidden_states[%d] differs)" % (n + 1)
            put("l_out-%d" % n, n, l_out, p + " output" + where)
        norm_is_last = hs is not None and torch.equal(c["norm"], hs[d.L])
        put("result_norm", -1, c["norm"][0],
            "model.norm output" + (" (= hidden_states[%d])" % d.L if norm_is_last else ""))
        put("result_output", -1, out.logits[0], "logits")

    # --- checks ---
    by = {name: t for name, _, t, _ in tensors}
    if hs is not None:
        if norm_is_last:
            last = "result_norm (model.norm output)"
        elif torch.equal(hs[d.L], c[(d.L - 1, "out")]):
            last = "l_out-%d (model.layers.%d output, before model.norm)" % (d.L - 1, d.L - 1)
        else:
            last = "neither l_out-%d nor result_norm" % (d.L - 1)
        print("hidden_states: %d entries; hidden_states[0] %s inp_embd; the last, "
              "hidden_states[%d], is %s" % (len(hs), "==" if same_h0 else "!=", d.L, last))
        err = max([rel_err(by["l_out-%d" % n], hs[n + 1][0]) for n in range(d.L - 1)] + [0.0])
        checks.report("l_out-N == hidden_states[N+1] for N < %d" % (d.L - 1), err, 0)
    tol = exact_tol(dtype)
    prev = by["inp_embd"]
    worst = [0.0, 0.0]
    for n in range(d.L):
        mix = by["attn_out-%d" % n] if d.full[n] else by["linear_attn_out-%d" % n]
        e1 = rel_err(prev + mix, by["ffn_inp-%d" % n])
        e2 = rel_err(by["ffn_inp-%d" % n] + by["ffn_out-%d" % n], by["l_out-%d" % n])
        worst = [max(worst[0], e1), max(worst[1], e2)]
        prev = by["l_out-%d" % n]
    checks.report("residual: l_out-(N-1) + attn_out-N == ffn_inp-N, all N", worst[0], tol)
    checks.report("residual: ffn_inp-N + ffn_out-N == l_out-N, all N", worst[1], tol)
    head = model.get_output_embeddings().weight
    checks.report("result_output = result_norm @ output weight",
                  rel_err(by["result_norm"] @ head.T, by["result_output"]), recompute_tol(dtype))
    if ref_logits is not None:
        compare_ref(checks, by["result_output"], ref_logits)

    # --- the files ---
    os.makedirs(out_dir, exist_ok=True)
    written_by = "transformers %s %s %s" % (transformers.__version__, dtype_name, device)
    expect = dict(d.shapes(T))
    if [n for n, _ in d.shapes(T)] != [n for n, _, _, _ in tensors]:
        raise Fail("internal: the dump's names are not in the expected order")
    rows = []
    for name, layer, t, src in tensors:
        shape = tuple(t.shape)
        if shape != expect[name]:
            raise Fail("internal: %s has shape %s, expected %s" % (name, shape, expect[name]))
        sel = pattern.search(name) is not None
        if not quiet:
            print("%-28s %-16s %s" % (name, ",".join(map(str, shape)),
                                      "written" if sel else "-"))
        if sel:
            write_npy(os.path.join(out_dir, name + ".npy"), t)
            rows.append("\t".join([name + ".npy", str(layer), name, ",".join(map(str, shape)),
                                   src, written_by]))
    text = "file\tlayer\tname\tshape\ttransformers\twritten_by\n" + "".join(r + "\n" for r in rows)
    write_file_atomic(os.path.join(out_dir, "manifest.tsv"), [text.encode()])
    names = {r.split("\t")[0] for r in rows}
    stale = sorted(f for f in os.listdir(out_dir) if f.endswith(".npy") and f not in names)
    if stale:
        print("note: %s holds %d .npy file(s) this run did not write (e.g. %s): not in the "
              "manifest" % (out_dir, len(stale), stale[0]))
    print("wrote %d of %d tensors and manifest.tsv to %s (%s)"
          % (len(rows), len(tensors), out_dir, written_by))
    return checks, by, rows


def exact_tol(dtype):
    """Tolerance of a sum that transformers computes with the same operation: its rounding."""
    import torch
    return 1e-12 if dtype == torch.float64 else 1e-6


def recompute_tol(dtype):
    """Tolerance of a recomputation through parts that transformers keeps in float32 (softmax,
    the delta rule, the norms) or sums in another order."""
    return 1e-4


def check_attention(checks, n, group, d, scaling):
    """kqv_out recomputed from Qcur, Kcur, Vcur: causal softmax(q k / sqrt(hd)) v, GQA."""
    import torch
    by = {name.split("-")[0]: t for name, _, t, _ in group}
    q, k, v = by["Qcur"].double(), by["Kcur"].double(), by["Vcur"].double()
    T = q.shape[0]
    kv = [h // (d.H // d.Hkv) for h in range(d.H)]
    k, v = k[:, kv], v[:, kv]
    s = torch.einsum("thd,shd->hts", q, k) * scaling
    mask = torch.ones(T, T, dtype=torch.bool, device=s.device).triu(1)
    s = s.masked_fill(mask, float("-inf")).softmax(-1)
    o = torch.einsum("hts,shd->thd", s, v).reshape(T, -1)
    checks.report("kqv_out-%d = attention(Qcur, Kcur, Vcur)" % n, rel_err(o, by["kqv_out"]),
                  1e-4)


def linear_tensors(put, checks, c, n, T, d, la, mod, p):
    """The Gated DeltaNet's tensors of layer n, value heads in the tiled order."""
    import torch
    import torch.nn.functional as F
    Hk, Hv, S, perm = d.Hk, d.Hv, d.S, d.perm
    kd = Hk * S
    tile = " (value heads in llama.cpp's tiled order)"

    def tile_heads(x):  # [T, Hv, ...] in HF order -> tiled order
        return x[:, perm]

    def tile_v(x):  # [T, conv_dim]: the v part's heads reordered
        v = tile_heads(x[:, 2 * kd:].reshape(T, Hv, S)).reshape(T, Hv * S)
        return torch.cat([x[:, :2 * kd], v], dim=1)

    qkv = c[(n, "in_proj_qkv")][0]
    put("linear_attn_qkv_mixed-%d" % n, n, tile_v(qkv),
        p + ".linear_attn.in_proj_qkv output" + tile)
    z = tile_heads(c[(n, "in_proj_z")][0].reshape(T, Hv, S))
    put("z-%d" % n, n, z, p + ".linear_attn.in_proj_z output" + tile)
    beta = tile_heads(torch.sigmoid(c[(n, "in_proj_b")][0]))
    put("beta_sigmoid-%d" % n, n, beta, "none: sigmoid(%s.linear_attn.in_proj_b output)%s"
        % (p, tile))
    a = c[(n, "in_proj_a")][0]
    g = tile_heads(-torch.exp(la.A_log) * F.softplus(a + la.dt_bias))
    put("gate-%d" % n, n, g, "none: softplus(%s.linear_attn.in_proj_a output + dt_bias) * "
        "-exp(A_log), in the run's dtype (transformers' forward takes exp(A_log) in float32)%s"
        % (p, tile))
    # the causal depthwise conv as the torch fallback runs it: conv1d (padding K-1) over the
    # sequence, cut to the first T positions, then SiLU
    conv = F.silu(la.conv1d(qkv.t().unsqueeze(0))[0, :, :T]).t()
    put("conv_output_silu-%d" % n, n, tile_v(conv),
        "none: silu(%s.linear_attn.conv1d(in_proj_qkv output)[:T])%s" % (p, tile))
    l2norm = getattr(mod, "l2norm", None)
    l2name = mod.__name__ + ".l2norm"
    if l2norm is None:
        l2norm, l2name = own_l2norm, "x * rsqrt(sum(x^2) + eps) (the modeling file has no l2norm)"
    q = l2norm(conv[:, :kd].reshape(T, Hk, S), dim=-1, eps=1e-6)
    k = l2norm(conv[:, kd:2 * kd].reshape(T, Hk, S), dim=-1, eps=1e-6)
    v = tile_heads(conv[:, 2 * kd:].reshape(T, Hv, S))
    how = ("none: %s on the %%s part of conv_output_silu, eps=1e-6, in the run's dtype "
           "(transformers does it in float32 inside the delta rule)" % l2name)
    put("q_conv_predelta-%d" % n, n, q, how % "q")
    put("k_conv_predelta-%d" % n, n, k, how % "k")
    put("v_conv-%d" % n, n, v, "none: v part of conv_output_silu" + tile)
    core = tile_heads(c[(n, "core")].reshape(T, Hv, S))
    put("attn_output-%d" % n, n, core, p + ".linear_attn.norm input 0 (the delta rule's "
        "output)" + tile)
    gated = tile_heads(c[(n, "gated")].reshape(T, Hv, S))
    put("final_output-%d" % n, n, gated.reshape(T, Hv * S),
        p + ".linear_attn.norm output (the gated RMSNorm)" + tile)
    put("linear_attn_out-%d" % n, n, c[(n, "out_proj")][0], p + ".linear_attn.out_proj output")

    # checks: the norm's gate input is z; the delta rule from the dumped q, k, v, gate, beta (in
    # the tiled order: value head h reads key head h % Hk); the gated norm
    zg = tile_heads(c[(n, "zgate")].reshape(T, Hv, S))
    checks.report("linear_attn.norm's gate input = z-%d" % n, rel_err(zg, z), 0)
    o = delta_rule(q, k, v, g, beta, Hk)
    checks.report("attn_output-%d = delta rule(q, k, v_conv, gate, beta)" % n,
                  rel_err(o, core), 1e-4)
    eps = getattr(la.norm, "variance_epsilon", getattr(la.norm, "eps", 1e-6))
    x = core.double()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * la.norm.weight.double()
    y = y * F.silu(z.double())
    checks.report("final_output-%d = rmsnorm(attn_output) * w * silu(z)" % n, rel_err(y, gated),
                  1e-5)


def own_l2norm(x, dim=-1, eps=1e-6):
    """x / sqrt(sum x^2 + eps), as transformers' l2norm."""
    import torch
    return x * torch.rsqrt((x * x).sum(dim=dim, keepdim=True) + eps)


def delta_rule(q, k, v, g, beta, Hk):
    """The gated delta rule token by token, in float64: q, k [T, Hk, S] (L2-normed), v [T, Hv,
    S], g (log decay), beta [T, Hv]; value head h uses key head h % Hk. Returns [T, Hv, S]."""
    import torch
    q, k, v, g, beta = (t.double() for t in (q, k, v, g, beta))
    T, Hv, S = v.shape
    idx = [h % Hk for h in range(Hv)]
    q, k = q[:, idx] * S ** -0.5, k[:, idx]
    state = torch.zeros(Hv, S, S, dtype=torch.float64, device=v.device)  # [head, k, v]
    out = torch.empty_like(v)
    for t in range(T):
        state = state * g[t].exp()[:, None, None]
        mem = torch.einsum("hkv,hk->hv", state, k[t])
        delta = (v[t] - mem) * beta[t][:, None]
        state = state + k[t][:, :, None] * delta[:, None, :]
        out[t] = torch.einsum("hkv,hk->hv", state, q[t])
    return out


def compare_ref(checks, logits, path):
    """The logits against a raw float32 [P][V] reference (its first T rows)."""
    import torch
    T, V = logits.shape
    size = os.path.getsize(path)
    if size % (4 * V):
        raise Fail("%s: %d bytes is not a whole number of rows of %d float32" % (path, size, V))
    P = size // (4 * V)
    if P < T:
        raise Fail("%s: %d positions, the prompt has %d" % (path, P, T))
    a = array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read(4 * V * T))
    if sys.byteorder == "big":
        a.byteswap()
    ref = torch.frombuffer(a, dtype=torch.float32).double().view(T, V).to(logits.device)
    diff = (logits.double() - ref).abs().max().item()
    std = ref.std().item()
    same_top = (logits.argmax(-1) == ref.argmax(-1)).double().mean().item()
    print("ref logits %s: max |diff| %.3g = %.3g of their std; top-1 agrees at %.1f %% of %d "
          "positions" % (path, diff, diff / std, 100 * same_top, T))
    checks.report("result_output against --ref-logits (max |diff| / std)", diff / std, 1e-4)


# ------------------------------------------------------------------------------------------------
# --selftest: tiny random models, saved and loaded back, every name dumped and checked
# ------------------------------------------------------------------------------------------------

def selftest(device):
    import torch
    import transformers
    print("selftest: transformers %s, torch %s, device %s"
          % (transformers.__version__, torch.__version__, device))
    common = dict(vocab_size=8193, hidden_size=256, intermediate_size=768,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                  max_position_embeddings=512, rms_norm_eps=1e-6, bos_token_id=8192,
                  eos_token_id=8192, pad_token_id=8192, attention_dropout=0.0,
                  num_hidden_layers=2)
    failed = 0
    for arch in ("qwen3", "qwen35"):
        try:
            if arch == "qwen3":
                from transformers import Qwen3Config, Qwen3ForCausalLM
                cfg = Qwen3Config(tie_word_embeddings=True, rope_parameters={
                    "rope_type": "default", "rope_theta": 1e6}, **common)
                cls = Qwen3ForCausalLM
            else:
                from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
                cfg = Qwen3_5TextConfig(
                    tie_word_embeddings=False, layer_types=["linear_attention", "full_attention"],
                    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64,
                    linear_value_head_dim=64, linear_conv_kernel_dim=4,
                    partial_rotary_factor=0.25, rope_parameters={
                        "rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
                    **common)
                cls = Qwen3_5ForCausalLM
        except ImportError as e:
            print("FAIL %s: this transformers has no such model (%s)" % (arch, e))
            failed += 1
            continue
        failed += selftest_one(arch, cls, cfg, device)
    print("selftest: %s" % ("OK" if failed == 0 else "FAIL (%d)" % failed))
    return failed == 0


def selftest_one(arch, cls, cfg, device):
    import torch
    torch.manual_seed(1234)
    model = cls(cfg)
    with torch.no_grad():  # every parameter distinct per channel and head (norms included)
        for name, prm in model.named_parameters():
            if prm.dim() == 1:  # norms, A_log, dt_bias
                prm.add_(torch.randn_like(prm) * 0.3)
            elif prm.dim() == 3:  # conv1d [C, 1, K]
                prm.copy_(torch.randn_like(prm) * 0.3)
            else:
                prm.copy_(torch.randn_like(prm) * 0.05)
    ids = torch.randint(0, cfg.vocab_size, (70,), generator=torch.Generator().manual_seed(7))
    ids = ids.tolist()  # 70 tokens: more than one 64-token chunk of the delta rule
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = os.path.join(tmp, "ckpt")
        model.save_pretrained(ckpt)
        for dtype_name, filt in (("float64", ".*"), ("float32", DEFAULT_FILTER)):
            out_dir = os.path.join(tmp, "dump-" + dtype_name)
            print("--- %s, %s, --filter '%s'" % (arch, dtype_name, filt))
            try:
                checks, by, rows = dump(ckpt, out_dir, ids, dtype_name, device, filt, quiet=True)
            except Fail as e:
                print("FAIL %s %s: %s" % (arch, dtype_name, e))
                failed += 1
                continue
            failed += checks.failed
            failed += check_files(arch, out_dir, by, rows, cfg, len(ids), filt, dtype_name)
            # the logits against a plain forward of the saved model (no hooks)
            dtype = by["result_output"].dtype
            ref = load_model(ckpt, dtype, device)
            with torch.no_grad():
                lg = ref(input_ids=torch.tensor([ids], device=device), use_cache=False).logits[0]
            err = rel_err(by["result_output"], lg)
            ok = err <= exact_tol(dtype)
            print("%s %s %s: logits = a plain forward without hooks (max rel err %.3g)"
                  % ("OK  " if ok else "FAIL", arch, dtype_name, err))
            failed += 0 if ok else 1
    return failed


def check_files(arch, out_dir, by, rows, cfg, T, filt, dtype_name):
    """Every selected name written with its shape, the manifest right, the values float32."""
    import torch
    d = Dims(cfg)
    want = [(n, s) for n, s in d.shapes(T) if re.search(filt, n)]
    failed = 0
    with open(os.path.join(out_dir, "manifest.tsv")) as f:
        lines = f.read().splitlines()
    problems = []
    if lines[0] != "file\tlayer\tname\tshape\ttransformers\twritten_by":
        problems.append("manifest header %r" % lines[0])
    if len(lines) - 1 != len(want):
        problems.append("manifest has %d rows, %d names selected" % (len(lines) - 1, len(want)))
    for line, (name, shape) in zip(lines[1:], want):
        cols = line.split("\t")
        layer = re.search(r"-(\d+)$", name)
        exp = [name + ".npy", layer.group(1) if layer else "-1", name, ",".join(map(str, shape))]
        if cols[:4] != exp or len(cols) != 6 or not cols[5].startswith("transformers "):
            problems.append("manifest row %r, expected %r" % (cols, exp))
            continue
        got_shape, vals = read_npy(os.path.join(out_dir, name + ".npy"))
        if got_shape != shape:
            problems.append("%s.npy has shape %s, expected %s" % (name, got_shape, shape))
            continue
        t = torch.frombuffer(vals, dtype=torch.float32).view(shape)
        if not torch.equal(t, by[name].detach().to("cpu", torch.float32)):
            problems.append("%s.npy holds other values than the dump's tensor" % name)
    extra = sorted(set(f[:-4] for f in os.listdir(out_dir) if f.endswith(".npy")) -
                   set(n for n, _ in want))
    if extra:
        problems.append("unselected files written: %s" % extra[:3])
    for pr in problems[:10]:
        print("FAIL %s %s: %s" % (arch, dtype_name, pr))
    failed += 1 if problems else 0
    if not problems:
        print("OK   %s %s: %d files and manifest rows, names, shapes and values as expected"
              % (arch, dtype_name, len(want)))
    return failed


# ------------------------------------------------------------------------------------------------
# main
# ------------------------------------------------------------------------------------------------

def parse_ids(text, what):
    ids = []
    for tok in re.split(r"[,\s]+", text.strip()):
        if tok == "":
            continue
        if not re.fullmatch(r"\d+", tok):
            raise Fail("%s: '%s' is not a token id" % (what, tok[:20]))
        ids.append(int(tok))
    return ids


def main(argv):
    ap = argparse.ArgumentParser(description="Dump a transformers Qwen's intermediate tensors "
                                 "under qwen.cu --dump-hidden's names (see the top docstring).")
    ap.add_argument("model_dir", nargs="?")
    ap.add_argument("out_dir", nargs="?")
    ap.add_argument("--tokens", help="comma-separated token ids")
    ap.add_argument("--tokens-file", help="a file of token ids (commas or white space)")
    ap.add_argument("--n-tokens", type=int, help="use only the first N ids")
    ap.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--filter", default=DEFAULT_FILTER,
                    help="re.search on the names to write (default: %(default)s)")
    ap.add_argument("--ref-logits", help="raw float32 [P][V] logits to compare with")
    ap.add_argument("--selftest", action="store_true",
                    help="tiny random models, no checkpoint needed")
    a = ap.parse_args(argv)
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        raise Fail("torch and transformers are needed (%s)" % e)
    if a.selftest:
        if a.model_dir or a.tokens or a.tokens_file:
            raise Fail("--selftest takes no checkpoint and no tokens")
        return 0 if selftest(a.device) else 1
    if not a.model_dir or not a.out_dir:
        raise Fail("MODEL_DIR and OUT_DIR are needed (or --selftest)")
    if (a.tokens is None) == (a.tokens_file is None):
        raise Fail("give the ids with exactly one of --tokens and --tokens-file")
    if a.tokens is not None:
        ids = parse_ids(a.tokens, "--tokens")
    else:
        try:
            with open(a.tokens_file) as f:
                ids = parse_ids(f.read(), a.tokens_file)
        except OSError as e:
            raise Fail("%s: %s" % (a.tokens_file, e.strerror))
    if a.n_tokens is not None:
        if a.n_tokens < 1:
            raise Fail("--n-tokens must be at least 1")
        ids = ids[:a.n_tokens]
    if a.ref_logits and not os.path.isfile(a.ref_logits):
        raise Fail("%s: no such file" % a.ref_logits)
    print("%d token ids: %s%s" % (len(ids), ",".join(map(str, ids[:16])),
                                   ",..." if len(ids) > 16 else ""))
    checks, _, _ = dump(a.model_dir, a.out_dir, ids, a.dtype, a.device, a.filter, a.ref_logits)
    print("%s: %d check(s) failed" % ("FAIL" if checks.failed else "OK", checks.failed))
    return 1 if checks.failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Fail as e:
        print("hf_dump_hidden: %s" % e, file=sys.stderr)
        sys.exit(1)
