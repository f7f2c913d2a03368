#!/usr/bin/env bash
# test/gpu_ab.sh OUTDIR "model:ftype ..." BIN_A BIN_B [BIN ...] — on a GPU machine: decode and
# prefill speed of two or more qwen binaries on the same machine start, so that the start-to-start
# spread (about +-1 %) does not decide a comparison. Each model is made once (test/gen_model, which
# must be built), then every binary runs `--bench` on it in turn, the whole round twice (A B A B),
# and the model is deleted. Prints, per model, binary and round, ms per token at contexts 128 and
# 2048 and pp512 in tokens per second; the full outputs go to OUTDIR/ab.log.
#   test/gpu_ab.sh $OUT "qwen3.6-27b:iq4_xs qwen3-32b:q4_0" ./qwen-main ./qwen
set -uo pipefail
out=$1; models=$2; shift 2
[ $# -ge 2 ] || { echo "usage: $0 OUTDIR \"model:ftype ...\" BIN_A BIN_B [BIN ...]" >&2; exit 2; }
mkdir -p models "$out"
for mf in $models; do
    m=${mf%%:*}; f=${mf##*:}
    file=models/$m-$f.gguf
    ./test/gen_model --threads "$(nproc)" --model "$m" --ftype "$f" -o "$file" >> "$out/gen.log" 2>&1 ||
        { echo "$mf: test/gen_model failed (see $out/gen.log)"; continue; }
    for round in 1 2; do
        for bin in "$@"; do
            res=$("$bin" --bench -m "$file" 2>&1)
            printf "== %s %s round %d\n%s\n" "$bin" "$mf" "$round" "$res" >> "$out/ab.log"
            # the decode table's rows: context, bytes, "GB", ms/token, ...; then "pp512: ..., N tok/s"
            ms=$(echo "$res" | awk '$1 ~ /^(128|2048)$/ && $3 == "GB" {printf "%s: %s ms  ", $1, $4}')
            pp=$(echo "$res" | awk '$1 == "pp512:" {print $4}')
            printf "%-22s %-22s round %d: %s pp512: %s tok/s\n" "$mf" "$bin" "$round" "$ms" "$pp"
        done
    done
    rm -f "$file"
done
