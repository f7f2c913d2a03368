#!/usr/bin/env bash
# test/gpu_bench.sh — on a GPU machine: make full-size synthetic models one at a time, benchmark
# them with every qwen binary given, delete them. Usage:
#   test/gpu_bench.sh OUTDIR "qwen2.5-32b:iq4_xs qwen3-32b:q4_0" ./qwen ./qwen-sm70
set -uo pipefail
out=$1; models=$2; shift 2
mkdir -p models
for mf in $models; do
    m=${mf%%:*}; f=${mf##*:}
    file=models/$m-$f.gguf
    ./test/gen_model --model "$m" --ftype "$f" -o "$file" 2>&1 | tee -a "$out/gen.log"
    for bin in "$@"; do
        echo "== $bin --bench -m $file" | tee -a "$out/bench.log"
        "$bin" --bench -m "$file" 2>&1 | grep -v "^.loading" | tee -a "$out/bench.log"
    done
    rm -f "$file"
done
