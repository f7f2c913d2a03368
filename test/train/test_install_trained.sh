#!/usr/bin/env bash
# End-to-end test of test/train/install_trained.sh, CPU only (about a minute):
#   bash test/train/test_install_trained.sh
# The runs of train_tiny.py are rebuilt from what test/data/trained holds: the checkpoints by
# test/tools/gguf_to_hf.py --check from the F16 files (A_log stored as float32, as train_tiny.py
# stores it), train.json, ref-logits.f32 and the samples copied, ref.json read back from
# ARCH-ref.txt. install_trained.sh into an empty directory must then give every committed file
# (and the made quantized ones) byte for byte.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
src=test/data/trained
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mkdir "$T/runs" "$T/dest"
for a in qwen3 qwen35; do
    d=$T/runs/$a
    python3 test/tools/gguf_to_hf.py --check $src/$a-f16.gguf $src/$a-train.json "$d" | tail -1
    cp $src/$a-train.json "$d/train.json"
    cp $src/$a-ref.f32 "$d/ref-logits.f32"
    cp $src/sample.txt $src/sample-ids.txt "$d/"
    python3 - "$d" $src/$a-ref.txt <<'PY'
import json, struct, sys
d, reftxt = sys.argv[1], sys.argv[2]
ref = {}
for line in open(reftxt, encoding="utf-8"):
    if line.startswith("#"):
        continue
    k, v = line.rstrip("\n").split(" ", 1)
    ref[k] = ([int(x) for x in v.split(",")] if k == "greedy_ids" else
              float(v) if k in ("greedy_min_margin", "sample_ppl_c256") else
              int(v) if k in ("sample_scored_tokens", "ref_positions") else v)
json.dump(ref, open(d + "/ref.json", "w"))
# gguf_to_hf.py writes A_log as float64; train_tiny.py's checkpoints hold float32
p = d + "/model.safetensors"
b = open(p, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
hdr, data = json.loads(b[8:8 + n]), b[8 + n:]
meta = hdr.pop("__metadata__", None)
out, new = b"", {}
for k, v in sorted(hdr.items(), key=lambda kv: kv[1]["data_offsets"][0]):
    s, e = v["data_offsets"]
    raw, dt = data[s:e], v["dtype"]
    if dt == "F64":
        vals = struct.unpack("<%dd" % (len(raw) // 8), raw)
        raw, dt = struct.pack("<%df" % len(vals), *vals), "F32"
    new[k] = {"dtype": dt, "shape": v["shape"], "data_offsets": [len(out), len(out) + len(raw)]}
    out += raw
if meta:
    new["__metadata__"] = meta
h = json.dumps(new).encode()
h += b" " * (-len(h) % 8)
open(p, "wb").write(struct.pack("<Q", len(h)) + h + out)
PY
done
bash test/train/install_trained.sh "$T/runs" "$T/dest" > /dev/null 2>&1 ||
    { bash test/train/install_trained.sh "$T/runs" "$T/dest" 2>&1 | tail -5; exit 1; }
bad=0
for f in $(cd "$T/dest" && ls); do
    if [ -f "$src/$f" ] && cmp -s "$T/dest/$f" "$src/$f"; then echo "same  $f"
    else echo "DIFF  $f"; bad=1; fi
done
for f in $(git ls-files $src | grep -v /hidden-); do
    [ -f "$T/dest/${f#$src/}" ] || { echo "MISSING ${f#$src/}"; bad=1; }
done
[ $bad = 0 ] && echo "all passed" || { echo "FAILED"; exit 1; }
