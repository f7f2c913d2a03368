#!/usr/bin/env bash
# test/gpu_trained.sh HELDOUT.txt OUT [BIN ...] — on a GPU machine: the trained tiny models
# (test/data/trained) on the whole held-out text (test/train/corpus.sh's heldout.txt), with each
# qwen binary given (default ./qwen): perplexity as `--perplexity -c 256` scores it, then the
# KL divergence of Q8_0, Q4_0 and IQ4_XS against the F16 file's base. Q8_0 is made here by
# test/quantize (which must be built), and so are Q4_0 and IQ4_XS where make has not built them
# in test/data/trained (the same bytes: make trained). The table goes to stdout; every run's
# output to OUT/trained-*.log. ARCHS="qwen35" limits it to some models.
set -uo pipefail
held=$1; out=$2; shift 2
bins=("$@")
[ ${#bins[@]} -gt 0 ] || bins=(./qwen)
dir=test/data/trained
tmp=$(mktemp -d)
printf "%-8s %-8s %-18s %10s %12s %10s %8s\n" binary model file ppl "KLD vs F16" "+/-" "same top"
for arch in ${ARCHS:-qwen3 qwen35}; do
    files=()
    for t in q8_0 q4_0 iq4_xs; do
        f=$dir/$arch-$t.gguf
        if [ $t = q8_0 ] || [ ! -f "$f" ]; then
            f=$tmp/$arch-$t.gguf
            ./test/quantize $dir/$arch-f16.gguf "$f" $t > /dev/null 2>&1 ||
                { echo "test/quantize $arch $t failed" >&2; rm -rf "$tmp"; exit 1; }
        fi
        files+=("$f")
    done
    for bin in "${bins[@]}"; do
        tag=$(basename "$bin")
        base=$tmp/$arch-$tag.kld
        "$bin" -m $dir/$arch-f16.gguf --perplexity -c 256 -f "$held" --kl-divergence-base "$base" \
            > "$out/trained-$tag-$arch-f16.log" 2>&1
        ppl=$(awk '/^Final estimate/ {print $5}' "$out/trained-$tag-$arch-f16.log")
        printf "%-8s %-8s %-18s %10s\n" "$tag" "$arch" f16 "$ppl"
        for f in "${files[@]}"; do
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
