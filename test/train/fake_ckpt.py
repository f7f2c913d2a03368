#!/usr/bin/env python3
"""Write a random Hugging Face checkpoint directory in the format our training script saves, to
test test/train/hf_to_gguf without a trained model (Python 3 standard library only):

    python3 test/train/fake_ckpt.py --arch qwen3|qwen35 OUT_DIR [options]

OUT_DIR/config.json is a flat transformers-5.x config (Qwen3ForCausalLM "qwen3", or
Qwen3_5ForCausalLM "qwen3_5_text"); OUT_DIR/model.safetensors holds the weights: 2-D weights in
--dtype (F16 by default, as our checkpoints store them), everything else (1-D tensors, the 3-D
conv1d) F32. Small shapes by default: hidden 256, vocab 8193, 4 query heads of 64 and 2 kv heads
(--heads; train_tiny.py's rule); qwen35: partial_rotary_factor 0.25, 2 linear key heads, 4 value
heads of 64, conv kernel 4, every 4th layer full attention. Values: weights ~ N(0, 0.02); qwen3
norms near 1; qwen35 norms near 0 (zero-centred, x*(1+w)) except linear_attn.norm (plain, near
1); A_log in [0, 1); dt_bias ~ N(0, 0.5); conv weights ~ N(0, 0.1). The same seed gives the
same bytes.
"""
import argparse
import json
import os
import random
import struct


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--arch", choices=["qwen3", "qwen35"], required=True)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--ffn", type=int, default=512)
    ap.add_argument("--heads", type=int, default=4,
                    help="query heads of 64 (train_tiny.py: width / 64); half as many kv heads; "
                         "qwen35: half as many linear key heads, as many value heads")
    ap.add_argument("--vocab", type=int, default=8193, help="vocab_size (N_VOCAB_TOKENS + 1)")
    ap.add_argument("--tied", type=int, default=1, help="tie_word_embeddings (1: no lm_head)")
    ap.add_argument("--dtype", choices=["F16", "F32", "BF16"], default="F16",
                    help="dtype of the 2-D weights")
    ap.add_argument("--prefix", default="model.", help="e.g. model.language_model.")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    q35 = a.arch == "qwen35"
    E, F, V, L = a.hidden, a.ffn, a.vocab, a.layers
    H, Hkv, hd = a.heads, a.heads // 2, 64
    assert H >= 2 and H % 2 == 0, "--heads: an even count"
    if q35:
        Hk, Hv, dk, dv, K = H // 2, H, 64, 64, 4
        layer_types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                       for i in range(L)]
    cfg = {
        "architectures": ["Qwen3_5ForCausalLM" if q35 else "Qwen3ForCausalLM"],
        "model_type": "qwen3_5_text" if q35 else "qwen3",
        "vocab_size": V, "hidden_size": E, "intermediate_size": F, "num_hidden_layers": L,
        "num_attention_heads": H, "num_key_value_heads": Hkv, "head_dim": hd,
        "hidden_act": "silu", "rms_norm_eps": 1e-06, "max_position_embeddings": 4096,
        "tie_word_embeddings": bool(a.tied), "attention_bias": False, "dtype": "float32",
        "bos_token_id": V - 1, "eos_token_id": V - 1, "pad_token_id": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "transformers_version": "5.0.0",
    }
    if q35:
        cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000000.0,
                                  "partial_rotary_factor": 0.25,
                                  "mrope_interleaved": True, "mrope_section": [11, 11, 10]}
        cfg.update({"partial_rotary_factor": 0.25, "layer_types": layer_types,
                    "full_attention_interval": 4, "attn_output_gate": True,
                    "linear_conv_kernel_dim": K, "linear_key_head_dim": dk,
                    "linear_value_head_dim": dv, "linear_num_key_heads": Hk,
                    "linear_num_value_heads": Hv})
    else:
        cfg.update({"layer_types": ["full_attention"] * L, "use_sliding_window": False,
                    "sliding_window": None})

    tensors = []  # (name, dtype, shape, values)

    def gauss(n, std, mean=0.0):
        return [mean + std * rng.gauss(0.0, 1.0) for _ in range(n)]

    def weight(name, rows, cols, std=0.02):
        tensors.append((a.prefix + name, a.dtype, [rows, cols], gauss(rows * cols, std)))

    def vec(name, values, shape=None):
        tensors.append((a.prefix + name, "F32", shape or [len(values)], values))

    norm_mean = 0.0 if q35 else 1.0
    weight("embed_tokens.weight", V, E)
    for i in range(L):
        p = "layers.%d." % i
        vec(p + "input_layernorm.weight", gauss(E, 0.1, norm_mean))
        vec(p + "post_attention_layernorm.weight", gauss(E, 0.1, norm_mean))
        if q35 and layer_types[i] == "linear_attention":
            key_dim, value_dim = Hk * dk, Hv * dv
            conv_dim = 2 * key_dim + value_dim
            weight(p + "linear_attn.in_proj_qkv.weight", conv_dim, E)
            weight(p + "linear_attn.in_proj_z.weight", value_dim, E)
            weight(p + "linear_attn.in_proj_b.weight", Hv, E)
            weight(p + "linear_attn.in_proj_a.weight", Hv, E)
            vec(p + "linear_attn.conv1d.weight", gauss(conv_dim * K, 0.1), [conv_dim, 1, K])
            vec(p + "linear_attn.dt_bias", gauss(Hv, 0.5))
            vec(p + "linear_attn.A_log", [rng.random() for _ in range(Hv)])
            vec(p + "linear_attn.norm.weight", gauss(dv, 0.1, 1.0))
            weight(p + "linear_attn.out_proj.weight", E, value_dim)
        else:
            weight(p + "self_attn.q_proj.weight", H * hd * (2 if q35 else 1), E)
            weight(p + "self_attn.k_proj.weight", Hkv * hd, E)
            weight(p + "self_attn.v_proj.weight", Hkv * hd, E)
            weight(p + "self_attn.o_proj.weight", E, H * hd)
            vec(p + "self_attn.q_norm.weight", gauss(hd, 0.1, norm_mean))
            vec(p + "self_attn.k_norm.weight", gauss(hd, 0.1, norm_mean))
        weight(p + "mlp.gate_proj.weight", F, E)
        weight(p + "mlp.up_proj.weight", F, E)
        weight(p + "mlp.down_proj.weight", E, F)
    vec("norm.weight", gauss(E, 0.1, norm_mean))
    if not a.tied:
        tensors.append(("lm_head.weight", a.dtype, [V, E], gauss(V * E, 0.02)))

    # safetensors: u64 header length, JSON header (padded with spaces to 8 bytes), data
    header, blobs, off = {}, [], 0
    for name, dtype, shape, values in tensors:
        n = len(values)
        if dtype == "F16":
            blob = struct.pack("<%de" % n, *values)
        elif dtype == "F32":
            blob = struct.pack("<%df" % n, *values)
        else:  # BF16: the top half of the F32 bits (truncated)
            raw = struct.unpack("<%dI" % n, struct.pack("<%df" % n, *values))
            blob = struct.pack("<%dH" % n, *[x >> 16 for x in raw])
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    header["__metadata__"] = {"format": "pt"}
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * (-len(hj) % 8)
    os.makedirs(a.out_dir, exist_ok=True)
    with open(os.path.join(a.out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    with open(os.path.join(a.out_dir, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)


if __name__ == "__main__":
    main()
