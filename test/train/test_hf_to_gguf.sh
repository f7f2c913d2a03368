#!/usr/bin/env bash
# End-to-end test of test/train/hf_to_gguf, CPU only (about a minute):
#   bash test/train/test_hf_to_gguf.sh
# 1. random checkpoints (test/train/fake_ckpt.py: qwen3 and qwen35; tied and untied; F16, F32 and
#    BF16 weights; the model.language_model. prefix; 256 and 512 wide) converted, each GGUF
#    checked against its inputs by test/train/check_hf_to_gguf.py (every key, type and tensor
#    byte), loaded by ./qwen --info and run by ./qwen --cpu;
# 2. the truncated vocabulary tokenizes like the full one: the tokenizer test strings whose ids
#    are all below N give the same ids; with N = 151643 (every ordinary Qwen2 token) all of them do;
# 3. malformed inputs: each is one "error:" line on stderr, exit status 1, and no output file.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
make -s qwen test/train/hf_to_gguf
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
V=test/data/tokenizer/vocab-qwen2.gguf
N=8192
CONV=test/train/hf_to_gguf
fail() { echo "FAIL: $*"; exit 1; }

echo "== 1. conversions"
i=0
for spec in "qwen3" "qwen3 --tied 0 --dtype F32 --layers 2" "qwen35" \
        "qwen35 --tied 0 --dtype BF16 --prefix model.language_model." \
        "qwen35 --dtype F32 --layers 8 --seed 9" \
        "qwen3 --hidden 512 --heads 8 --ffn 1024 --layers 2" \
        "qwen35 --hidden 512 --heads 8 --ffn 512 --tied 0"; do
    i=$((i + 1))
    read -r -a args <<<"$spec"
    d=$T/ck$i
    echo "-- $spec"
    python3 test/train/fake_ckpt.py --arch "${args[@]}" "$d"
    $CONV "$d" $V $N "$d.gguf" 2>"$T/err" || fail "conversion: $(cat "$T/err")"
    python3 test/train/check_hf_to_gguf.py "$d" $V $N "$d.gguf"
    ./qwen -m "$d.gguf" --info >/dev/null 2>&1 || fail "./qwen --info $d.gguf"
    ./qwen -m "$d.gguf" --cpu -p "Hello" -n 8 --seed 1 >/dev/null 2>&1 || fail "./qwen --cpu $d.gguf"
done

echo "== 2. tokenizer"
python3 test/train/fake_ckpt.py --arch qwen3 --hidden 32 --ffn 32 --layers 1 --vocab 151644 "$T/big"
$CONV "$T/big" $V 151643 "$T/big.gguf" 2>/dev/null || fail "conversion with N = 151643"
python3 - "$T" $V $N <<'EOF'
import subprocess, sys
tmp, vocab, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
text = open("test/data/tokenizer/ggml-vocab-qwen2.gguf.inp", encoding="utf-8").read()
tests = text.split("\n__ggml_vocab_test__\n")[:-1]
tests += ["the cat sat on the mat, and then it went home.", " in the world of the people",
          "It was a good day; we said: \"yes\" (and more)!"]
def ids(model, s):
    open(tmp + "/in.txt", "w", encoding="utf-8").write(s)
    out = subprocess.run(["./qwen", "-m", model, "--tokenize", "-f", tmp + "/in.txt"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("FAIL: ./qwen --tokenize: " + out.stderr.strip())
    return out.stdout.strip()
small = same = 0
for s in tests:
    full = ids(vocab, s)
    if ids(tmp + "/big.gguf", s) != full:
        sys.exit("FAIL: N = 151643 gives other ids for %r" % s)
    if full and max(int(x) for x in full.split(",")) >= n:
        continue
    small += 1
    got = ids(tmp + "/ck1.gguf", s)
    if got != full:
        sys.exit("FAIL: %r: %s, full vocabulary %s" % (s, got, full))
print("ok: %d strings with every id < %d give the same ids; N = 151643: all %d the same" %
      (small, n, len(tests)))
EOF

echo "== 3. malformed inputs"
# bad NAME [ARGS...]: the converter must fail with one error line and leave no output behind
bad() {
    local name=$1; shift
    rm -f "$T/out.gguf"
    if $CONV "$@" "$T/out.gguf" >"$T/so" 2>"$T/se"; then fail "$name: succeeded"; fi
    grep -v '^vocabulary:' "$T/se" >"$T/se2" || true
    [ "$(wc -l <"$T/se2")" = 1 ] && grep -q '^error: ' "$T/se2" || fail "$name: $(cat "$T/se")"
    [ ! -e "$T/out.gguf" ] && [ -z "$(ls "$T" | grep 'out.gguf.tmp' || true)" ] ||
        fail "$name: left an output file"
    printf '  %-12s %s\n' "$name" "$(cat "$T/se2")"
}
# mk NAME: a copy of the qwen35 checkpoint to break
mk() { rm -rf "$T/$1"; cp -r "$T/ck3" "$T/$1"; echo "$T/$1"; }
# edit_header DIR PYTHON: run PYTHON on h (the safetensors header as a dict), rewrite the file
edit_header() {
    python3 - "$1/model.safetensors" "$2" <<'EOF'
import json, struct, sys
p = sys.argv[1]; d = open(p, "rb").read(); n = struct.unpack("<Q", d[:8])[0]
h = json.loads(d[8:8 + n]); exec(sys.argv[2])
hj = json.dumps(h).encode(); hj += b" " * (-len(hj) % 8)
open(p, "wb").write(struct.pack("<Q", len(hj)) + hj + d[8 + n:])
EOF
}
d=$(mk trunc); truncate -s 5000000 "$d/model.safetensors"; bad truncated "$d" $V $N
d=$(mk trunchdr); truncate -s 3000 "$d/model.safetensors"; bad "cut header" "$d" $V $N
d=$(mk badhdr); printf 'x' | dd of="$d/model.safetensors" bs=1 seek=8 conv=notrunc 2>/dev/null
bad "bad header" "$d" $V $N
d=$(mk missing); edit_header "$d" 'del h["model.layers.2.linear_attn.A_log"]'
bad missing "$d" $V $N
d=$(mk extra); edit_header "$d" 'h["model.layers.0.mlp.x.weight"] = h["model.norm.weight"]'
bad extra "$d" $V $N
d=$(mk shape); edit_header "$d" 'h["model.layers.0.mlp.up_proj.weight"]["shape"] = [256, 512]'
bad shape "$d" $V $N
d=$(mk dtype); edit_header "$d" 'h["model.norm.weight"]["dtype"] = "I64"'
bad dtype "$d" $V $N
d=$(mk vocab); sed -i 's/"vocab_size": 8193/"vocab_size": 8000/' "$d/config.json"
bad vocab_size "$d" $V $N
d=$(mk json1); printf '{"model_type": "qwen3_5_text",,}' >"$d/config.json"; bad "bad JSON" "$d" $V $N
d=$(mk json2); head -c 300 "$T/ck3/config.json" >"$d/config.json"; bad "cut JSON" "$d" $V $N
d=$(mk json3); python3 -c "print('[' * 100000)" >"$d/config.json"; bad "deep JSON" "$d" $V $N
d=$(mk json4); sed -i 's/"hidden_size": 256/"hidden_size": "256"/' "$d/config.json"
bad "JSON type" "$d" $V $N
d=$(mk layers); sed -i '0,/"linear_attention"/s//"full_attention"/' "$d/config.json"
bad "layer_types" "$d" $V $N
d=$(mk untied); sed -i 's/"tie_word_embeddings": true/"tie_word_embeddings": false/' "$d/config.json"
bad "no lm_head" "$d" $V $N
d=$T/big2; cp -r "$T/big" "$d"; sed -i 's/"vocab_size": 151644/"vocab_size": 151645/' "$d/config.json"
bad "N too big" "$d" $V 151644
bad "N not a number" "$T/ck3" $V 81x2
bad "not a vocab" "$T/ck3" "$T/ck3/config.json" $N
echo "all passed"
