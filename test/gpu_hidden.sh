#!/usr/bin/env bash
# test/gpu_hidden.sh OUT [BIN] — on a GPU machine with torch and transformers: the hidden-state
# tools on the trained models (test/data/trained), with BIN (default ./qwen). For qwen3 and qwen35:
#   1. the transformers recipe's self-test (test/tools/hf_dump_hidden.py --selftest);
#   2. a checkpoint recreated from the F16 GGUF (test/tools/gguf_to_hf.py --check), and its
#      float64 dump of every tensor for the held-out sample's first 32 tokens;
#   3. the exact path against it (--cpu --diff-hidden, and with --diff-inject): every tensor within
#      1e-5, every token's row too for qwen3; qwen35's rows within 4e-5 (transformers' L2 norm
#      is x * rsqrt(sum x^2 + eps), the GGUF one x / max(|x|, eps): test_hidden.h says more);
#   4. the GPU's decode and batched pass against --cpu (--diff-hidden cpu).
# Every report goes to OUT/; the dumps to OUT/hidden-ARCH.tar.xz: test_hidden's reference files
# (test/data/trained/hidden-ARCH, without result_output.npy and its manifest row).
set -uo pipefail
out=$1; bin=${2:-./qwen}
dir=test/data/trained
tmp=$(mktemp -d)
python3 test/tools/hf_dump_hidden.py --selftest > "$out/selftest.log" 2>&1
echo "recipe self-test: exit $?"; grep -c FAIL "$out/selftest.log"
ids=$(cut -d, -f1-32 $dir/sample-ids.txt)
for arch in qwen3 qwen35; do
    python3 test/tools/gguf_to_hf.py --check $dir/$arch-f16.gguf $dir/$arch-train.json \
        "$tmp/$arch-hf" > "$out/ckpt-$arch.log" 2>&1
    echo "$arch: checkpoint exit $?"
    python3 test/tools/hf_dump_hidden.py "$tmp/$arch-hf" "$tmp/hidden-$arch" --filter '.*' \
        --tokens-file $dir/sample-ids.txt --n-tokens 32 --ref-logits $dir/$arch-ref.f32 \
        > "$out/recipe-$arch.log" 2>&1
    echo "$arch: recipe exit $?"; grep -E "FAIL" "$out/recipe-$arch.log" | head -5
    rows=1e-5; [ $arch = qwen35 ] && rows=4e-5
    for inj in "" --diff-inject; do
        "$bin" -m $dir/$arch-f16.gguf --cpu --tokens "$ids" --diff-hidden "$tmp/hidden-$arch" \
            --hidden-filter . --diff-max-rel "$rows" $inj > "$out/cpu-vs-hf-$arch$inj.txt" 2>&1
        echo "$arch: --cpu against transformers $inj: exit $?"
        grep -E "^largest|^first tensor" "$out/cpu-vs-hf-$arch$inj.txt"
    done
    "$bin" -m $dir/$arch-f16.gguf --tokens "$ids" --diff-hidden cpu --hidden-filter . \
        > "$out/self-$arch.txt" 2>&1
    echo "$arch: the GPU against --cpu: exit $?"
    grep -E "^diff-hidden|^largest" "$out/self-$arch.txt"
    tar cJf "$out/hidden-$arch.tar.xz" -C "$tmp" "hidden-$arch"
done
rm -rf "$tmp"
