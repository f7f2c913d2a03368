#!/usr/bin/env bash
# test/train/gpu_train.sh PACK OUT [QWEN3_OPTIONS [QWEN35_OPTIONS]] — train both tiny models on a
# GPU machine (torch, transformers and tokenizers installed) and pack the checkpoints and their
# references into OUT. The options are train_tiny.py's, after the defaults below (the last one
# given wins), e.g. "--width 512 --ffn 1024 --layers 3 --max-seconds 380". Several option sets for
# one model, separated by ';', are candidates: all of them train side by side (a tiny model leaves
# most of the GPU idle), each for the whole run, and the one with the lowest held-out perplexity
# is packed (test/train/gpu_sweep.sh compares shorter runs without references). The committed
# models' options are in their train.json.
#   PACK: corpus.tar.xz (corpus/train.txt, corpus/heldout.txt from test/train/corpus.sh) and
#         tokenizer.json (test/train/make_tokenizer.py)
#   OUT:  trained.tar.xz.* (split in 15 MB parts: qwen3/ and qwen35/ as train_tiny.py writes them),
#         candidates.tsv (every candidate: options, parameters, steps, kept step, losses, held-out
#         perplexity; the packed ones marked), each candidate's train.json and the logs. Put the
#         parts together with `cat OUT/trained.tar.xz.* | tar xJf -`.
# First a smoke test of the whole pipeline on 2 MB of text (each model's first option set), so
# that a broken step costs seconds.
set -euo pipefail
pack=$1; out=$2; opts3=${3:-}; opts35=${4:-}
work=$(mktemp -d)
tar xJf "$pack/corpus.tar.xz" -C "$work"
python3 -c 'import torch, transformers, tokenizers; print("torch", torch.__version__,
    "transformers", transformers.__version__, "tokenizers", tokenizers.__version__,
    torch.cuda.get_device_name(0))'
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} # side by side on the CPU too
train() { # arch out_dir log [train_tiny.py options]
    local arch=$1 dir=$2 log=$3; shift 3
    python3 "$(dirname "$0")/train_tiny.py" --arch "$arch" --corpus "$work/corpus" \
        --tokenizer "$pack/tokenizer.json" --out "$dir" "$@" > "$log" 2>&1 ||
        { grep -v Warning "$log" | tail -40; return 1; }
    grep -E "parameters" "$log" | tail -1
}
pids=()
wait_all() { local rc=0 p; for p in "${pids[@]}"; do wait "$p" || rc=1; done; pids=(); return $rc; }
IFS=';' read -ra sets3 <<< "$opts3"
IFS=';' read -ra sets35 <<< "$opts35"
[ ${#sets3[@]} -gt 0 ] || sets3=("")
[ ${#sets35[@]} -gt 0 ] || sets35=("")
for arch in qwen3 qwen35; do # with the shape options too (the smoke's own flags come last)
    o=${sets3[0]}; [ $arch = qwen35 ] && o=${sets35[0]}
    # shellcheck disable=SC2086
    train $arch "$work/smoke/$arch" "$out/smoke-$arch.log" $o --steps 20 --eval-every 10 \
        --max-seconds 600 --ref-positions 8 --max-train-bytes 2000000 &
    pids+=($!)
done
wait_all || exit 1
# the training ids, once, before the runs read them
python3 "$(dirname "$0")/train_tiny.py" --arch qwen3 --corpus "$work/corpus" --steps 1 \
    --tokenizer "$pack/tokenizer.json" --out "$work/ids-run" --no-refs --ids-cache "$work/ids.pt" \
    > "$out/ids.log" 2>&1 || { tail -20 "$out/ids.log"; exit 1; }
names=()
for arch in qwen3 qwen35; do
    if [ $arch = qwen3 ]; then sets=("${sets3[@]}"); else sets=("${sets35[@]}"); fi
    for i in "${!sets[@]}"; do
        n=$arch-$i
        names+=("$n")
        echo "${sets[$i]}" > "$work/opts-$n"
        # shellcheck disable=SC2086  # the options are words
        train $arch "$work/out/$n" "$out/train-$n.log" --steps 1200 --max-seconds 120 \
            --ids-cache "$work/ids.pt" ${sets[$i]} &
        pids+=($!)
    done
done
wait_all || echo "a candidate failed (its log says why); the others are compared"
python3 - "$work" "$out" "${names[@]}" <<'PY'
import json, os, shutil, sys
work, out, names = sys.argv[1], sys.argv[2], sys.argv[3:]
rows, best = [], {}
for n in names:
    p = os.path.join(work, "out", n, "train.json")
    if not os.path.exists(os.path.join(work, "out", n, "ref.json")):
        rows.append([n, open(os.path.join(work, "opts-" + n)).read().strip(), "failed"])
        continue
    r = json.load(open(p))
    shutil.copy(p, os.path.join(out, "train-%s.json" % n))
    k = next(c for c in r["curve"] if c["step"] == r["best_step"])
    ppl = r["heldout_ppl_c256_fp32_gpu"]
    rows.append([n, open(os.path.join(work, "opts-" + n)).read().strip(), r["params"],
                 r["steps_run"], r["train_seconds"], r["epochs"], r["best_step"],
                 k["train_loss"], k["val_loss"], k["heldout_loss"], "%.3f" % ppl])
    arch = r["arch"]
    if arch not in best or ppl < best[arch][1]:
        best[arch] = (n, ppl)
with open(os.path.join(out, "candidates.tsv"), "w") as f:
    f.write("name\toptions\tparams\tsteps\tseconds\tepochs\tkept_step\ttrain_loss\tval_loss\t"
            "heldout_loss\theldout_ppl\tpacked\n")
    for r in rows:
        f.write("\t".join(map(str, r)) + ("\tyes" if best.get(r[0].split("-")[0], ("",))[0] == r[0]
                                          else "") + "\n")
os.makedirs(os.path.join(work, "pack"))
for arch in ("qwen3", "qwen35"):
    if arch not in best:
        sys.exit("no %s candidate finished" % arch)
    shutil.move(os.path.join(work, "out", best[arch][0]), os.path.join(work, "pack", arch))
print(open(os.path.join(out, "candidates.tsv")).read())
PY
tar cf - -C "$work/pack" qwen3 qwen35 | xz -T0 -3 | split -b 15M - "$out/trained.tar.xz."
ls -la "$out"
