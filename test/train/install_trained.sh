#!/usr/bin/env bash
# test/train/install_trained.sh RUNS [DEST] — put the models of test/train/gpu_train.sh into
# test/data/trained (or DEST). RUNS holds qwen3/ and qwen35/ as train_tiny.py writes them, or
# the trained.tar.xz.* parts gpu_train.sh packs them in. No GPU and no Python packages needed.
# For each model, in DEST:
#   ARCH-f16.gguf    test/train/hf_to_gguf of the checkpoint (Qwen's vocabulary cut to 8,192
#                    ids; general.name tiny-ARCH)
#   ARCH-ref.f32     ref-logits.f32 (transformers' float64 logits of the sample, as float32)
#   ARCH-ref.txt     "key value" lines: the greedy prompt and continuation and the sample's
#                    perplexity (ref.json), the held-out perplexity (train.json)
#   ARCH-train.json  train.json (the configuration, data hashes, loss curves)
# and once: sample.txt and sample-ids.txt (the two runs' must agree), the quantized files
# (test/quantize: make trained) and quantized.sha256, their sums. The hidden-state dumps
# (DEST/hidden-ARCH) are transformers' and come from test/gpu_hidden.sh on a GPU machine after.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
runs=$1; dest=${2:-$ROOT/test/data/trained}
die() { echo "install_trained.sh: error: $*" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ ! -d "$runs/qwen3" ] && compgen -G "$runs/trained.tar.xz.*" >/dev/null; then
    cat "$runs"/trained.tar.xz.* | tar xJf - -C "$tmp"
    runs=$tmp
fi
[ -d "$dest" ] || die "no directory $dest"
make -s -C "$ROOT" test/quantize test/train/hf_to_gguf >&2
for arch in qwen3 qwen35; do
    d=$runs/$arch
    for f in config.json model.safetensors train.json ref.json ref-logits.f32 sample.txt \
             sample-ids.txt; do
        [ -s "$d/$f" ] || die "$d/$f is missing (a run without --no-refs writes it)"
    done
    "$ROOT/test/train/hf_to_gguf" --name "tiny-$arch" "$d" \
        "$ROOT/test/data/tokenizer/vocab-qwen2.gguf" 8192 "$dest/$arch-f16.gguf"
    cp "$d/ref-logits.f32" "$dest/$arch-ref.f32"
    cp "$d/train.json" "$dest/$arch-train.json"
    python3 - "$d" "$arch" > "$tmp/ref.txt" <<'PY'
import json, sys
d, arch = sys.argv[1], sys.argv[2]
ref, run = json.load(open(d + "/ref.json")), json.load(open(d + "/train.json"))
print(f"# transformers {run['transformers']} (torch {run['torch']}), float64 on the CPU, on the "
      f"weights of {arch}-f16.gguf")
for k in ("greedy_prompt", "greedy_ids", "greedy_min_margin", "sample_ppl_c256",
          "sample_scored_tokens", "ref_positions"):
    v = ref[k]
    print(k, ",".join(map(str, v)) if isinstance(v, list) else v)
for k in ("heldout_ppl_c256_fp32_gpu", "heldout_scored_tokens"):
    print(k, run[k])
PY
    mv "$tmp/ref.txt" "$dest/$arch-ref.txt"
done
for f in sample.txt sample-ids.txt; do
    cmp -s "$runs/qwen3/$f" "$runs/qwen35/$f" || die "the two runs' $f differ"
    cp "$runs/qwen3/$f" "$dest/$f"
done
sums=$tmp/quantized.sha256
: > "$sums"
for arch in qwen3 qwen35; do
    for t in q4_0 iq4_xs; do
        "$ROOT/test/quantize" "$dest/$arch-f16.gguf" "$dest/$arch-$t.gguf" $t > /dev/null
        (cd "$dest" && sha256sum "$arch-$t.gguf") >> "$sums"
    done
done
mv "$sums" "$dest/quantized.sha256"
cat "$dest/quantized.sha256"
echo "installed in $dest; next, on a GPU machine: test/gpu_hidden.sh (the hidden-state dumps)" >&2
