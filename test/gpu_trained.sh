#!/usr/bin/env bash
# test/gpu_trained.sh HELDOUT.txt OUT [BIN ...] — on a GPU machine: the trained tiny models
# (test/data/trained) on the whole held-out text (test/train/corpus.sh's heldout.txt), with each
# qwen binary given (default ./qwen): perplexity as `--perplexity -c 256` scores it, then the
# KL divergence of Q8_0 (made here by test/quantize, which must be built), Q4_0 and IQ4_XS
# against the F16 file's base. The table goes to stdout; every run's output to OUT/trained-*.log.
# ARCHS="qwen35" limits it to some models; a quantized file that is not there is left out.
set -uo pipefail
held=$1; out=$2; shift 2
bins=("$@")
[ ${#bins[@]} -gt 0 ] || bins=(./qwen)
dir=test/data/trained
tmp=$(mktemp -d)
printf "%-8s %-8s %-18s %10s %12s %10s %8s\n" binary model file ppl "KLD vs F16" "+/-" "same top"
for arch in ${ARCHS:-qwen3 qwen35}; do
    ./test/quantize $dir/$arch-f16.gguf "$tmp/$arch-q8_0.gguf" q8_0 > /dev/null
    for bin in "${bins[@]}"; do
        tag=$(basename "$bin")
        base=$tmp/$arch-$tag.kld
        "$bin" -m $dir/$arch-f16.gguf --perplexity -c 256 -f "$held" --kl-divergence-base "$base" \
            > "$out/trained-$tag-$arch-f16.log" 2>&1
        ppl=$(awk '/^Final estimate/ {print $5}' "$out/trained-$tag-$arch-f16.log")
        printf "%-8s %-8s %-18s %10s\n" "$tag" "$arch" f16 "$ppl"
        for f in "$tmp/$arch-q8_0.gguf" $dir/$arch-q4_0.gguf $dir/$arch-iq4_xs.gguf; do
            [ -f "$f" ] || continue
            name=$(basename "$f" .gguf)
            log=$out/trained-$tag-$name.log
            "$bin" -m "$f" --kl-divergence --kl-divergence-base "$base" > "$log" 2>&1
            awk -v b="$tag" -v a="$arch" -v n="${name#$arch-}" '
                /^Mean PPL\(Q\) +:/ {ppl = $4} /^Mean    KLD:/ {k = $3; e = $5}
                /^Same top p:/ {t = $4}
                END {printf "%-8s %-8s %-18s %10s %12s %10s %7s%%\n", b, a, n, ppl, k, e, t}' "$log"
        done
    done
done
rm -rf "$tmp"
