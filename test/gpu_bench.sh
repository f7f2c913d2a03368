#!/usr/bin/env bash
# test/gpu_bench.sh — on a GPU machine: make full-size synthetic models one at a time, run
# test/bench (the tables behind the engine's choices, make bench) on each, delete them. Usage:
#   test/gpu_bench.sh OUTDIR "qwen2.5-32b:iq4_xs qwen3-32b:q4_0" [./test/bench]
set -uo pipefail
out=$1; models=$2; bench=${3:-./test/bench}
mkdir -p models "$out"
for mf in $models; do
    m=${mf%%:*}; f=${mf##*:}
    file=models/$m-$f.gguf
    ./test/gen_model --threads "$(nproc)" --model "$m" --ftype "$f" -o "$file" >> "$out/gen.log" 2>&1
    echo "== $bench -m $file" | tee -a "$out/bench.log"
    "$bench" -m "$file" 2>&1 | grep -v "^.loading" | tee -a "$out/bench.log"
    rm -f "$file"
done
