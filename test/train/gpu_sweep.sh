#!/usr/bin/env bash
# test/train/gpu_sweep.sh PACK OUT SECONDS "NAME ARCH [OPTIONS]; ..." — tuning runs of
# train_tiny.py side by side on one GPU machine (a tiny model leaves most of an H100 idle), each
# for SECONDS of training and without references (--no-refs). The runs of one sweep share the
# GPU, so they compare with each other, not with a run that had it alone.
#   PACK: as test/train/gpu_train.sh's (corpus.tar.xz and tokenizer.json)
#   OUT:  sweep.tsv (name, arch, parameters, steps, seconds, the kept step (--select's best), its
#         validation and held-out losses, held-out perplexity at -c 256) and each run's log,
#         sweep-NAME.log
#   test/train/gpu_sweep.sh .train/pack $OUT 240 "w512 qwen3 --width 512 --ffn 1536 --layers 3;
#       d12 qwen3 --layers 12; lr2 qwen3 --lr 2e-3"
set -euo pipefail
pack=$1; out=$2; secs=$3; runs=$4
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
mkdir -p "$out"
tar xJf "$pack/corpus.tar.xz" -C "$work"
export PYTHONUNBUFFERED=1
common=(--corpus "$work/corpus" --tokenizer "$pack/tokenizer.json" --ids-cache "$work/ids.pt"
        --no-refs)
# the training text's ids, once: every run then reads the cache
python3 "$here/train_tiny.py" --arch qwen3 --out "$work/ids-run" --steps 1 "${common[@]}" \
    > "$out/sweep-ids.log" 2>&1 || { tail -20 "$out/sweep-ids.log"; exit 1; }
runs=${runs//$'\n'/ } # one line: read stops at a newline
IFS=';' read -ra specs <<< "$runs"
names=()
pids=()
for spec in "${specs[@]}"; do
    read -r name arch opts <<< "$spec"
    [ -n "$name" ] || continue
    # shellcheck disable=SC2086  # the options are words
    python3 "$here/train_tiny.py" --arch "$arch" --out "$work/$name" --steps 1000000 \
        --max-seconds "$secs" "${common[@]}" $opts > "$out/sweep-$name.log" 2>&1 &
    names+=("$name")
    pids+=($!)
done
for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || echo "${names[$i]}: failed (see $out/sweep-${names[$i]}.log)"
done
python3 - "$work" "$out/sweep.tsv" "${names[@]}" <<'PY'
import json, os, sys
work, tsv, names = sys.argv[1], sys.argv[2], sys.argv[3:]
rows = ["name\tarch\tparams\tsteps\tseconds\tbest_step\tval_loss\theldout_loss\theldout_ppl"]
for n in names:
    p = os.path.join(work, n, "train.json")
    if not os.path.exists(p):
        rows.append(f"{n}\t-\t-\t-\t-\t-\t-\t-\t-")
        continue
    r = json.load(open(p))
    best = next(c for c in r["curve"] if c["step"] == r["best_step"])
    rows.append(f"{n}\t{r['arch']}\t{r['params']}\t{r['steps_run']}\t{r['train_seconds']}\t"
                f"{best['step']}\t{best['val_loss']}\t{best['heldout_loss']}\t"
                f"{r['heldout_ppl_c256_fp32_gpu']:.2f}")
open(tsv, "w").write("\n".join(rows) + "\n")
print("\n".join(rows))
PY
rm -rf "$work"
