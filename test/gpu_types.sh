#!/usr/bin/env bash
# test/gpu_types.sh OUTDIR LLAMA_BIN "shape:TYPE ..." QWEN_BIN [QWEN_BIN ...] — on a GPU machine:
# qwen.cu and llama.cpp side by side on one machine start, decode and pp512, for every file type
# that test/gen_model and llama-quantize can make.
#
#   shape   a test/gen_model preset (qwen3-8b, qwen3.6-27b, qwen3-32b, qwen2.5-32b, ...)
#   TYPE    a type test/gen_model writes (its --ftype list, llama-quantize's type mixes: Q4_0,
#           Q4_K_M, Q8_0, F16, ...), or else any other llama-quantize type name: quantized by
#           LLAMA_BIN/llama-quantize --allow-requantize from the shape's Q4_0 file, with its type
#           mix (random weights: the speed is all that is measured). A file already in models/
#           (models/SHAPE-TYPE.gguf, models/SHAPE-q4_0.gguf for Q4_0) is used as it is
#   LLAMA_BIN   a folder with llama-bench, and llama-quantize for the types test/gen_model does
#               not write (../shared/tools/README.md)
#
# Per file: llama-bench -p 512 -n 128 -fa 1 -r 3 -ngl 99, then each qwen binary's --bench (decode
# ms/token at context 128, its share of the copy bandwidth; pp512). One row per (file, binary) on
# stdout and in OUTDIR/types.tsv; the full outputs in OUTDIR/types.log. Every file is deleted after
# its rows (the base Q4_0 after its shape), so the disk holds two files at most. The exit status
# is 1 when a file could not be made or a binary gave no decode row.
#   test/gpu_types.sh $OUT /tmp/ll/build/bin "qwen3-8b:Q4_K_M qwen3-8b:Q8_0" ./qwen-main ./qwen
set -uo pipefail
out=$1; llama=$2; files=$3; shift 3
[ $# -ge 1 ] ||
    { echo "usage: $0 OUTDIR LLAMA_BIN \"shape:TYPE ...\" QWEN_BIN [QWEN_BIN ...]" >&2; exit 2; }
mkdir -p models "$out"
log=$out/types.log
tsv=$out/types.tsv
tsv_row() { (IFS=$'\t'; echo "$*"); } # the arguments, tab-separated, as one line
[ -f "$tsv" ] || tsv_row file binary GB/token ms@128 tok/s %copy pp512 llama_tg128 llama_pp512 \
    decode_ratio pp_ratio > "$tsv"
threads=$(nproc)
status=0

# the Q4_0 file of a shape, made once (test/gen_model)
base_of() { echo "models/$1-q4_0.gguf"; }
make_base() {
    local shape=$1 f
    f=$(base_of "$shape")
    [ -f "$f" ] && return 0
    ./test/gen_model --threads "$threads" --model "$shape" --ftype q4_0 -o "$f" >> "$log" 2>&1
}
fail() { echo "$1"; status=1; }

prev_shape=""
for sf in $files; do
    shape=${sf%%:*}; type=${sf##*:}
    [ -n "$prev_shape" ] && [ "$prev_shape" != "$shape" ] && rm -f "$(base_of "$prev_shape")"
    prev_shape=$shape
    file=models/$shape-$type.gguf
    [ "$type" = Q4_0 ] && file=$(base_of "$shape")
    if [ ! -f "$file" ]; then
        # test/gen_model for the types it writes (it refuses the others), else llama-quantize
        if [ "$type" = Q4_0 ]; then
            make_base "$shape"
        elif ./test/gen_model --threads "$threads" --model "$shape" --ftype "${type,,}" \
                -o "$file" >> "$log" 2>&1; then
            :
        else
            make_base "$shape" && "$llama/llama-quantize" --allow-requantize \
                "$(base_of "$shape")" "$file" "$type" "$threads" >> "$log" 2>&1
        fi || { fail "$sf: the file could not be made (see $log)"; rm -f "$file"; continue; }
    fi
    # llama.cpp: tg128 and pp512, "mean ± sd" tokens per second
    lb=$("$llama/llama-bench" -m "$file" -p 512 -n 128 -fa 1 -r 3 -ngl 99 2>&1)
    printf "== llama-bench %s\n%s\n" "$sf" "$lb" >> "$log"
    mean_ts() { # the t/s cell of llama-bench's row for test $1: "mean ± sd", the mean
        echo "$lb" | awk -F'|' -v t=" $1 " 'index($0, t) {
            gsub(/ /, "", $(NF-1)); split($(NF-1), a, "±"); print a[1] }'
    }
    ltg=$(mean_ts tg128)
    lpp=$(mean_ts pp512)
    for bin in "$@"; do
        res=$("$bin" --bench -m "$file" 2>&1)
        printf "== %s %s\n%s\n" "$bin" "$sf" "$res" >> "$log"
        # the decode table's row at context 128: context, GB, "GB", ms, tok/s, GB/s, % of copy
        row=$(echo "$res" | awk '$1 == "128" && $3 == "GB" {print $2, $4, $5, $7}')
        pp=$(echo "$res" | awk '$1 == "pp512:" {print $4}')
        [ -n "$row" ] || fail "$sf: $bin gave no decode row (see $log)"
        read -r gb ms tps pc <<< "${row:-- - - -}"
        ratio() { awk -v a="$1" -v b="$2" 'BEGIN {
            if (a + 0 > 0 && b + 0 > 0) printf "%.2f", a / b; else print "-" }'; }
        dr=$(ratio "$tps" "$ltg")
        pr=$(ratio "$pp" "$lpp")
        tsv_row "$sf" "$bin" "$gb" "$ms" "$tps" "$pc" "${pp:--}" "${ltg:--}" "${lpp:--}" "$dr" \
            "$pr" >> "$tsv"
        printf "%-22s %-16s %7s GB %8s ms %7s tok/s %5s %% copy  pp512 %7s" \
            "$sf" "$bin" "$gb" "$ms" "$tps" "$pc" "${pp:--}"
        printf " | llama %7s %8s | %sx %sx\n" "${ltg:--}" "${lpp:--}" "$dr" "$pr"
    done
    [ "$file" != "$(base_of "$shape")" ] && rm -f "$file"
done
[ -n "$prev_shape" ] && rm -f "$(base_of "$prev_shape")"
exit $status
