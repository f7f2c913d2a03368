#!/usr/bin/env bash
# run.sh — build if needed, then run a model with the daily settings of the V100 write-up:
#   -c 2048 --temp 0.7 --top-p 0.8
#
#   ./run.sh                              the tiny trained model in test/data/trained (English)
#   ./run.sh --seed 2 -n 64               flags alone: the tiny trained model with those flags
#   ./run.sh MODEL.gguf ["prompt"] [more qwen flags, e.g. --seed 42 -n 128]
#   ./run.sh MODEL.gguf --seed 42         flags right after the model: the default prompt
# Paths are the caller's: the script does not change directory, it finds qwen.cu beside itself.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

# a clean make: not the settings of a make that may have started this script (make test)
build() { env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -C "$here" SUFFIX= "$@" >&2; }
if [ ! -x "$here/qwen" ] || [ "$here/qwen.cu" -nt "$here/qwen" ] ||
   [ "$here/tokenizer.c" -nt "$here/qwen" ]; then
    echo "== building $here/qwen" >&2
    build qwen
fi

model=
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then # a first argument that is not a flag: the model
    model=$1
    shift
fi
prompt="The three laws of memory-bound inference are"
ctx=(-c 2048)
if [ -z "$model" ]; then
    model=$here/test/data/trained/qwen3-q4_0.gguf
    # made from the committed F16 file by test/quantize, not committed (make trained)
    if [ ! -f "$model" ] || [ "$here/test/data/trained/qwen3-f16.gguf" -nt "$model" ]; then
        echo "== making $model" >&2
        build test/data/trained/qwen3-q4_0.gguf
    fi
    prompt="Once upon a time"
    ctx=() # its own context: the 512 tokens it was trained on
    cat >&2 <<'X'
No model given: running the tiny Qwen3 in test/data/trained, 6.8M parameters trained for 43 s on
16 MB of public-domain English (Austen, Chesterton, Melville, the World English Bible, the Brown
corpus). It writes English of a sort, quickly, on any machine: it exists for learning and testing.

For a real model, download a Qwen GGUF and pass its path, for example (Hugging Face):
    huggingface-cli download Qwen/Qwen3-8B-GGUF Qwen3-8B-Q4_K_M.gguf --local-dir models
    ./run.sh models/Qwen3-8B-Q4_K_M.gguf "Why is the sky blue?"
Any qwen2 (Qwen2/2.5), qwen3 or qwen35 (Qwen3.5/3.6) GGUF works; on a 16 GB V100 pick a
quantization that fits whole.
X
fi
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then # a second argument that is not a flag: the prompt
    prompt=$1
    shift
fi

# The defaults go in only where the caller's flags leave them out: qwen takes each option once.
args=("$@")
given() { # given FLAG...: one of these flags is among the caller's
    local a f
    for a in "${args[@]}"; do for f in "$@"; do [ "$a" = "$f" ] && return 0; done; done
    return 1
}
# The daily settings are generation's and chat's (the prompt: generation's alone); a mode that
# samples nothing (--bench, --info, --perplexity, ...) takes the caller's flags as they are, but
# the dumps and diffs of a prompt's logits or hidden states get the default prompt if none is given.
chat=0; other=0; of_prompt=0
given --chat -cnv --conversation && chat=1
given --bench --info --perplexity --kl-divergence --kl-divergence-base --tokenize --detokenize \
    --diff-logits --dump-logits --dump-hidden --diff-hidden && other=1
given --diff-logits --dump-logits --dump-hidden --diff-hidden && of_prompt=1
has_prompt() { given -p --prompt -f --file --tokens; }
extra=()
if [ $other = 0 ]; then
    [ $chat = 1 ] || has_prompt || extra+=(-p "$prompt")
    given -c --ctx-size || extra+=("${ctx[@]}")
    given --temp || extra+=(--temp 0.7)
    given --top-p || extra+=(--top-p 0.8)
elif [ $of_prompt = 1 ]; then
    has_prompt || extra+=(-p "$prompt")
fi
# without a GPU, --cpu for the modes that run the model (--bench needs a GPU and says so; --info,
# --tokenize and --detokenize run nothing)
if ! nvidia-smi >/dev/null 2>&1 && ! given --cpu --bench --info --tokenize --detokenize; then
    echo "note: no NVIDIA GPU here: using the plain-C reference path (--cpu), one thread, fp32." \
         "It runs a Qwen3-0.6B Q4_0 at about 0.85 s per token on 2 cores:" \
         "pick a model that small." >&2
    extra+=(--cpu)
fi
exec "$here/qwen" -m "$model" "${extra[@]}" "$@"
