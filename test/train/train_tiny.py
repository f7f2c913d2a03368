#!/usr/bin/env python3
"""train_tiny.py -- train one of the tiny Qwen models on the GPU machine, and write its references.

    python3 test/train/train_tiny.py --arch qwen3 --corpus .train/corpus \
        --tokenizer .train/tokenizer.json --out .train/out/qwen3

The model is transformers' own class (Qwen3ForCausalLM, Qwen3_5ForCausalLM): the reference
definition of the math. --layers, --width and --ffn choose its shape; --weight-decay, --warmup
and --min-lr the optimizer and its schedule; --dropout and --attn-dropout the regularization.
The committed models' options are in their train.json ("args").
--no-refs (tuning runs, test/train/gpu_sweep.sh) stops after train.json and the checkpoint.
Training: AdamW, bf16 autocast, 512-token windows drawn at random from the training text. The
loss is measured every --eval-every steps on a validation set cut from the training text (every
50th window) and on 96 windows of the held-out text; --select names the one that picks the kept
checkpoint (default: the held-out loss). Seeded.

Writes into --out:
  config.json, model.safetensors  the checkpoint. Every 2-D weight is rounded to f16, as the F16 GGUF
                                  stores it (test/train/hf_to_gguf converts this directory), so the
                                  references below are computed on exactly the file's weights
  train.json                      the configuration, data hashes and sizes, the loss curves, timings
  sample.txt, sample-ids.txt      the start of the held-out text and its ids from `tokenizers`
  heldout-ids.u16                 every held-out id (little-endian u16): qwen.cu --tokenize must agree
  ref-logits.f32                  float64 logits (stored as float32) of the sample's first
                                  --ref-positions tokens, [positions][n_vocab], on the CPU
                                  (transformers keeps its RMSNorms and the DeltaNet recurrence in
                                  float32 even then)
  ref.json                        the greedy continuation of a fixed prompt and the perplexity of the
                                  sample (chunks of 256, the second half scored), both in float64
"""
import argparse
import hashlib
import json
import math
import os
import time

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tokenizers import Tokenizer

GREEDY_PROMPT = "It was a fine morning in the country, and"


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def make_model(arch, n_vocab, n_ctx, layers=0, width=256, ffn=768, attn_dropout=0.0):
    """The tiny shapes: every row length a multiple of 256 (IQ4_XS and K-quants need it), heads of
    64 (width / 64 query heads, half as many key/value heads; qwen35's DeltaNet: width / 128 key
    and width / 64 value heads). The defaults are the committed models' shapes; layers 0: 6 for
    qwen3, 4 for qwen35 (whose layers go 3 DeltaNet, 1 attention, repeated)."""
    assert width % 256 == 0 and ffn % 256 == 0, "rows must be multiples of 256"
    common = dict(vocab_size=n_vocab, hidden_size=width, intermediate_size=ffn,
                  num_attention_heads=width // 64, num_key_value_heads=width // 128, head_dim=64,
                  max_position_embeddings=n_ctx, rms_norm_eps=1e-6, bos_token_id=n_vocab - 1,
                  eos_token_id=n_vocab - 1, pad_token_id=n_vocab - 1,
                  attention_dropout=attn_dropout)
    if arch == "qwen3":
        from transformers import Qwen3Config, Qwen3ForCausalLM
        cfg = Qwen3Config(num_hidden_layers=layers or 6, tie_word_embeddings=True,
                          rope_parameters={"rope_type": "default", "rope_theta": 1e6}, **common)
        assert cfg.rope_parameters["rope_theta"] == 1e6, cfg.rope_parameters
        return Qwen3ForCausalLM(cfg)
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
    # the 27B's pattern: 3 DeltaNet layers, then 1 gated-attention layer; more value heads than
    # key heads; a quarter of each attention head rotated; an untied output
    layers = layers or 4
    assert layers % 4 == 0, "qwen35: a multiple of 4 layers (3 DeltaNet, 1 attention)"
    cfg = Qwen3_5TextConfig(
        num_hidden_layers=layers, tie_word_embeddings=False,
        layer_types=(["linear_attention"] * 3 + ["full_attention"]) * (layers // 4),
        linear_num_key_heads=width // 128, linear_num_value_heads=width // 64,
        linear_key_head_dim=64,
        linear_value_head_dim=64, linear_conv_kernel_dim=4, partial_rotary_factor=0.25,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7,
                         "partial_rotary_factor": 0.25}, **common)
    return Qwen3_5ForCausalLM(cfg)


def add_dropout(model, p):
    """Residual dropout, in training only: the embedding's output and every block's output (the
    attention or DeltaNet mixer, the FFN) are dropped with probability p before they join the
    residual stream. Forward hooks, so the model stays transformers' class and its math;
    model.eval() turns them off, and nothing of it reaches the checkpoint."""
    def drop(mod, inp, out):
        if isinstance(out, tuple):  # the mixers return (output, attention weights or None)
            return (F.dropout(out[0], p, mod.training),) + tuple(out[1:])
        return F.dropout(out, p, mod.training)
    model.model.embed_tokens.register_forward_hook(drop)
    for layer in model.model.layers:
        mixers = [m for m in ("self_attn", "linear_attn") if hasattr(layer, m)]
        assert len(mixers) == 1 and hasattr(layer, "mlp"), "unknown decoder layer layout"
        getattr(layer, mixers[0]).register_forward_hook(drop)
        layer.mlp.register_forward_hook(drop)


def tokenize(tok, text):
    """Ids of a long text, paragraph by paragraph (a paragraph break ends every pre-token)."""
    parts = text.split("\n\n")
    parts = [p + "\n\n" for p in parts[:-1]] + [parts[-1]]
    ids = []
    for enc in tok.encode_batch(parts, add_special_tokens=False):
        ids.extend(enc.ids)
    return torch.tensor(ids, dtype=torch.int32)


def chunk_nll(model, ids, n_ctx, device, dtype):
    """Perplexity as qwen.cu --perplexity -c n_ctx computes it: chunks of n_ctx tokens from an
    empty state, the NLL of tokens first+1 .. n_ctx-1 given the ones before (first = n_ctx/2)."""
    first, n_chunk = n_ctx // 2, len(ids) // n_ctx
    total, count = 0.0, 0
    with torch.no_grad():
        for c0 in range(0, n_chunk, 32):
            x = ids[c0 * n_ctx:min(n_chunk, c0 + 32) * n_ctx].view(-1, n_ctx).long().to(device)
            logits = model(input_ids=x, use_cache=False).logits.to(dtype)
            lp = torch.log_softmax(logits[:, first:n_ctx - 1], dim=-1)
            nll = -lp.gather(-1, x[:, first + 1:, None])[..., 0]
            total += nll.double().sum().item()
            count += nll.numel()
    return total / count, count


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", choices=["qwen3", "qwen35"], required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--max-seconds", type=float, default=240)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--ref-positions", type=int, default=128)
    ap.add_argument("--max-train-bytes", type=int, default=0, help="0: all (a smoke test: less)")
    ap.add_argument("--ids-cache", default="", help="a file for the training ids, reused if there")
    ap.add_argument("--seed", type=int, default=1234)
    # the shape and the optimizer; the defaults are what the committed models were trained with
    ap.add_argument("--layers", type=int, default=0, help="0: 6 (qwen3), 4 (qwen35)")
    ap.add_argument("--width", type=int, default=256, help="hidden size, a multiple of 256")
    ap.add_argument("--ffn", type=int, default=768, help="FFN size, a multiple of 256")
    ap.add_argument("--attn-dropout", type=float, default=0.0)
    ap.add_argument("--dropout", type=float, default=0.0, help="residual dropout (training only)")
    ap.add_argument("--select", choices=["heldout", "val"], default="heldout",
                    help="the loss whose best evaluation picks the kept checkpoint")
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=-1, help="-1: min(100, steps / 10)")
    ap.add_argument("--min-lr", type=float, default=0.1, help="the cosine's end, x --lr")
    ap.add_argument("--no-refs", action="store_true",
                    help="a tuning run: train.json and the checkpoint only, no references")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(a.seed)
    dev = "cuda"
    t_start = time.time()

    tok = Tokenizer.from_file(a.tokenizer)
    n_vocab = tok.get_vocab_size()
    train_path, held_path = (os.path.join(a.corpus, n) for n in ("train.txt", "heldout.txt"))
    train_text = open(train_path, encoding="utf-8").read()
    if a.max_train_bytes:
        train_text = train_text[:a.max_train_bytes]
    held_text = open(held_path, encoding="utf-8").read()
    if a.ids_cache and os.path.exists(a.ids_cache):
        train_ids = torch.load(a.ids_cache)
    else:
        train_ids = tokenize(tok, train_text)
        if a.ids_cache:
            torch.save(train_ids, a.ids_cache)
    held_ids = torch.tensor(tok.encode(held_text, add_special_tokens=False).ids, dtype=torch.int32)
    held_ids.numpy().astype("<u2").tofile(os.path.join(a.out, "heldout-ids.u16"))

    # windows of ctx + 1 tokens; every 50th is the validation set
    T = a.ctx
    n_win = (len(train_ids) - 1) // T
    val_win = torch.arange(0, n_win, 50)
    is_val = torch.zeros(n_win, dtype=torch.bool)
    is_val[val_win] = True
    train_win = torch.arange(n_win)[~is_val]
    data = train_ids.to(dev)
    held = held_ids.to(dev)

    def windows(src, starts):
        idx = starts[:, None].to(dev) + torch.arange(T + 1, device=dev)[None]
        return src[idx].long()

    val_x = windows(data, val_win[:96] * T)
    n_held_win = (len(held_ids) - 1) // T
    held_x = windows(held, torch.arange(0, n_held_win, max(1, n_held_win // 96))[:96] * T)

    model = make_model(a.arch, n_vocab, T, a.layers, a.width, a.ffn, a.attn_dropout).to(dev)
    if a.dropout > 0:
        add_dropout(model, a.dropout)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    warm = min(100, a.steps // 10) if a.warmup < 0 else max(1, a.warmup)

    def progress(step):  # 0 .. 1: by steps, or by time if --max-seconds comes first
        return max(step / a.steps, (time.time() - t0) / a.max_seconds)

    def lr_at(step):  # linear warm-up, then a cosine down to --min-lr (a tenth)
        if step < warm:
            return a.lr * (step + 1) / warm
        cos = 0.5 * (1 + math.cos(math.pi * min(1.0, progress(step))))
        return a.lr * (a.min_lr + (1 - a.min_lr) * cos)

    def loss_of(x):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=x[:, :-1], use_cache=False).logits
        return F.cross_entropy(logits.float().reshape(-1, n_vocab), x[:, 1:].reshape(-1))

    def evaluate(x):
        model.eval()
        with torch.no_grad():
            loss = sum(loss_of(x[i:i + 32]).item() * len(x[i:i + 32])
                       for i in range(0, len(x), 32)) / len(x)
        model.train()
        return loss

    gen = torch.Generator(device="cpu").manual_seed(a.seed)
    curve, best, best_state, best_step, ema = [], float("inf"), None, 0, None
    t0 = time.time()
    step = 0
    for step in range(a.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        pick = train_win[torch.randint(len(train_win), (a.batch,), generator=gen)]
        loss = loss_of(windows(data, pick * T))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        last = progress(step + 1) >= 1
        if (step + 1) % a.eval_every == 0 or last:
            v, h = evaluate(val_x), evaluate(held_x)
            curve.append({"step": step + 1, "seconds": round(time.time() - t0, 1),
                          "train_loss": round(ema, 4), "val_loss": round(v, 4),
                          "heldout_loss": round(h, 4)})
            print(json.dumps(curve[-1]), flush=True)
            score = h if a.select == "heldout" else v
            if score < best:
                best, best_step = score, step + 1
                best_state = {k: t.detach().clone() for k, t in model.state_dict().items()}
        if last:
            break
    train_s = time.time() - t0
    model.load_state_dict(best_state)

    # the F16 file's weights: every 2-D tensor rounded to f16 (the rest stays f32, as in the GGUF)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(p.half().float())
    tied = model.config.tie_word_embeddings
    sd = {k: (t.half() if t.dim() == 2 else t.float()).contiguous().cpu()
          for k, t in model.state_dict().items() if not (tied and k == "lm_head.weight")}
    save_file(sd, os.path.join(a.out, "model.safetensors"), metadata={"format": "pt"})
    model.config.save_pretrained(a.out)

    # held-out perplexity in fp32 on the GPU (no TF32), -c 256 as qwen.cu --perplexity -c 256
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model.eval()
    nll_held, n_held = chunk_nll(model, held_ids, 256, dev, torch.float32)

    def write_report():
        report = {
            "arch": a.arch, "params": n_params,
            "config": json.loads(model.config.to_json_string()), "args": vars(a),
            "torch": torch.__version__, "transformers": __import__("transformers").__version__,
            "data": {"train_sha256": sha256(train_path), "heldout_sha256": sha256(held_path),
                     "tokenizer_sha256": sha256(a.tokenizer),
                     "train_bytes": len(train_text.encode()),
                     "heldout_bytes": len(held_text.encode()), "train_tokens": len(train_ids),
                     "heldout_tokens": len(held_ids), "train_windows": len(train_win),
                     "val_windows": len(val_win)},
            "train_seconds": round(train_s, 1), "steps_run": step + 1, "best_step": best_step,
            "tokens_seen": (step + 1) * a.batch * T,
            "epochs": round((step + 1) * a.batch * T / len(train_ids), 2), "curve": curve,
            "heldout_ppl_c256_fp32_gpu": math.exp(nll_held), "heldout_scored_tokens": n_held,
            "total_seconds": round(time.time() - t_start, 1),
        }
        with open(os.path.join(a.out, "train.json"), "w") as f:
            json.dump(report, f, indent=1)

    if a.no_refs:
        write_report()
        print(f"{a.arch}: {n_params} parameters, {step + 1} steps in {train_s:.0f} s, best step "
              f"{best_step}, held-out ppl (-c 256) {math.exp(nll_held):.2f}", flush=True)
        return

    # references in float64 on the CPU
    ref = model.cpu().double()
    sample_text = held_text[:held_text.index("\n\n", 8000) + 2]
    sample_ids = tok.encode(sample_text, add_special_tokens=False).ids
    with open(os.path.join(a.out, "sample.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(sample_text)
    with open(os.path.join(a.out, "sample-ids.txt"), "w") as f:
        f.write(",".join(map(str, sample_ids)) + "\n")
    P = min(a.ref_positions, len(sample_ids))
    with torch.no_grad():
        lg = ref(input_ids=torch.tensor([sample_ids[:P]]), use_cache=False).logits[0]
    lg.float().numpy().astype("<f4").tofile(os.path.join(a.out, "ref-logits.f32"))
    nll_sample, n_sample = chunk_nll(ref, torch.tensor(sample_ids), 256, "cpu", torch.float64)
    prompt_ids = tok.encode(GREEDY_PROMPT, add_special_tokens=False).ids
    ids, margins = list(prompt_ids), []
    with torch.no_grad():
        for _ in range(32):  # greedy by hand, the whole sequence each step: no cache involved
            row = ref(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1]
            top2 = torch.topk(row, 2)
            margins.append((top2.values[0] - top2.values[1]).item())
            ids.append(int(top2.indices[0]))
    greedy = ids[len(prompt_ids):]

    write_report()
    with open(os.path.join(a.out, "ref.json"), "w") as f:
        json.dump({"greedy_prompt": GREEDY_PROMPT, "greedy_prompt_ids": prompt_ids,
                   "greedy_ids": greedy, "greedy_text": tok.decode(greedy),
                   "greedy_min_margin": min(margins), "ref_positions": P,
                   "sample_tokens": len(sample_ids), "sample_ppl_c256": math.exp(nll_sample),
                   "sample_scored_tokens": n_sample}, f, indent=1)
    print(f"{a.arch}: {n_params} parameters, {step + 1} steps in {train_s:.0f} s, best step "
          f"{best_step}, held-out ppl (-c 256) {math.exp(nll_held):.2f}, sample ppl "
          f"{math.exp(nll_sample):.2f}; greedy: {tok.decode(greedy)!r}", flush=True)


if __name__ == "__main__":
    main()
