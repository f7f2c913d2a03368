#!/usr/bin/env bash
# run.sh — build if needed, then run a model with the daily settings of the V100 write-up:
#   -c 2048 --temp 0.7 --top-p 0.8
#
#   ./run.sh                              the tiny test model in test/data (random weights!)
#   ./run.sh MODEL.gguf ["prompt"] [more qwen flags, e.g. --seed 42 -n 128]
set -euo pipefail
cd "$(dirname "$0")"

if [ ! -x ./qwen ] || [ qwen.cu -nt ./qwen ] || [ tokenizer.c -nt ./qwen ]; then
    echo "== building ./qwen" >&2
    make >&2
fi

model=${1:-}
prompt=${2:-"The three laws of memory-bound inference are"}
shift $(( $# > 2 ? 2 : $# )) || true

if [ -z "$model" ]; then
    model=test/data/tiny-qwen3/tiny-qwen3-q4_0.gguf
    cat >&2 <<'X'
No model given: running the tiny model shipped in test/data. Its weights are RANDOM, so the text
it writes is gibberish; it only shows that everything runs.

For a real model, download a Qwen GGUF and pass its path, for example (Hugging Face):
    huggingface-cli download Qwen/Qwen3-8B-GGUF Qwen3-8B-Q4_K_M.gguf --local-dir models
    ./run.sh models/Qwen3-8B-Q4_K_M.gguf "Why is the sky blue?"
Any qwen2 (Qwen2/2.5) or qwen3 GGUF works; on a 16 GB V100 pick a quantization that fits whole.
X
fi

extra=()
if ! nvidia-smi >/dev/null 2>&1; then
    echo "note: no NVIDIA GPU here; using the plain-C reference path (--cpu), which is slow on big models" >&2
    extra+=(--cpu)
fi
exec ./qwen -m "$model" -p "$prompt" -c 2048 --temp 0.7 --top-p 0.8 "${extra[@]}" "$@"
