#!/usr/bin/env bash
# test/train/gpu_train.sh PACK OUT [QWEN3_OPTIONS [QWEN35_OPTIONS]] — train both tiny models on a
# GPU machine (torch, transformers and tokenizers installed), side by side, and pack the
# checkpoints and their references into OUT. The options are train_tiny.py's, after the defaults
# below (the last one given wins), e.g. "--width 512 --ffn 1536 --layers 3 --max-seconds 500"
# (test/train/gpu_sweep.sh compares shapes first). The committed models' are in their train.json.
#   PACK: corpus.tar.xz (corpus/train.txt, corpus/heldout.txt from test/train/corpus.sh) and
#         tokenizer.json (test/train/make_tokenizer.py)
#   OUT:  trained.tar.xz.* (split in 15 MB parts: qwen3/ and qwen35/ as train_tiny.py writes them)
#         and the logs. Put the parts together with `cat OUT/trained.tar.xz.* | tar xJf -`.
# First a smoke test of the whole pipeline on 2 MB of text, so that a broken step costs seconds.
set -euo pipefail
pack=$1; out=$2; opts3=${3:-}; opts35=${4:-}
work=$(mktemp -d)
tar xJf "$pack/corpus.tar.xz" -C "$work"
python3 -c 'import torch, transformers, tokenizers; print("torch", torch.__version__,
    "transformers", transformers.__version__, "tokenizers", tokenizers.__version__,
    torch.cuda.get_device_name(0))'
export PYTHONUNBUFFERED=1
train() { # arch out_dir log [train_tiny.py options]
    local arch=$1 dir=$2 log=$3; shift 3
    python3 "$(dirname "$0")/train_tiny.py" --arch "$arch" --corpus "$work/corpus" \
        --tokenizer "$pack/tokenizer.json" --out "$dir" "$@" > "$log" 2>&1 ||
        { grep -v Warning "$log" | tail -40; return 1; }
    grep -E "^\{|parameters" "$log" | tail -3
}
# the smoke tests, then the two trainings, side by side (a tiny model leaves most of the GPU idle)
pids=()
wait_all() { local rc=0 p; for p in "${pids[@]}"; do wait "$p" || rc=1; done; pids=(); return $rc; }
for arch in qwen3 qwen35; do # with the shape options too (the smoke's own flags come last)
    o=$opts3; [ $arch = qwen35 ] && o=$opts35
    # shellcheck disable=SC2086
    train $arch "$work/smoke/$arch" "$out/smoke-$arch.log" $o --steps 20 --eval-every 10 \
        --max-seconds 600 --ref-positions 8 --max-train-bytes 2000000 &
    pids+=($!)
done
wait_all || exit 1
# the training ids, once, before the two runs read them
python3 "$(dirname "$0")/train_tiny.py" --arch qwen3 --corpus "$work/corpus" --steps 1 \
    --tokenizer "$pack/tokenizer.json" --out "$work/ids-run" --no-refs --ids-cache "$work/ids.pt" \
    > "$out/ids.log" 2>&1 || { tail -20 "$out/ids.log"; exit 1; }
# shellcheck disable=SC2086  # the options are words
train qwen3 "$work/out/qwen3" "$out/train-qwen3.log" --steps 1200 --max-seconds 120 \
    --ids-cache "$work/ids.pt" $opts3 &
pids+=($!)
# shellcheck disable=SC2086
train qwen35 "$work/out/qwen35" "$out/train-qwen35.log" --steps 1200 --max-seconds 200 \
    --ids-cache "$work/ids.pt" $opts35 &
pids+=($!)
wait_all || exit 1
tar cf - -C "$work/out" qwen3 qwen35 | xz -T0 -3 | split -b 15M - "$out/trained.tar.xz."
ls -la "$out"
