#!/bin/sh
# test/tools/test_gguf_to_hf.sh -- recreate both trained checkpoints from their F16 GGUFs with
# test/tools/gguf_to_hf.py and check them against the GGUFs bit for bit (Python 3 stdlib only).
# Prints one ok/FAIL line per model; exit status 1 on any failure.
cd "$(dirname "$0")/../.." || exit 1
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
fail=0
for m in qwen3 qwen35; do
    if python3 test/tools/gguf_to_hf.py --check test/data/trained/$m-f16.gguf \
        test/data/trained/$m-train.json "$tmp/$m" >"$tmp/$m.log" 2>&1; then
        echo "ok   gguf_to_hf $m: $(tail -n 1 "$tmp/$m.log")"
    else
        echo "FAIL gguf_to_hf $m:"
        cat "$tmp/$m.log"
        fail=1
    fi
done
exit $fail
