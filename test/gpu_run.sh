#!/usr/bin/env bash
# test/gpu_run.sh OUT [sanitize-model] — the GPU tests of qwen.cu on a GPU machine: build for this
# GPU (sm_90), run the tests with this build and with the prebuilt sm_70 binaries (qwen-sm70 and
# test/test_qwen-sm70, through PTX JIT), then compute-sanitizer on a short generation. The fixtures
# are QWEN_TEST_DATA's (a subset when they do not all travel: QWEN_TEST_SUBSET=1). The trained
# models' CPU-only checks, the slowest, are left out (QWEN_TEST_GPU_ONLY): CPU runs make them.
# Their quantized files are not committed: make trained builds them here from the F16 files
# (when those travelled).
set -uo pipefail
out=$1; san=${2:-}
trained=$(ls test/data/trained/*-f16.gguf >/dev/null 2>&1 && echo trained)
make -j4 ARCH=sm_90 qwen test/test_qwen $trained 2>&1 | grep -E "error"
export QWEN_REQUIRE_GPU=1 QWEN_TEST_GPU_ONLY=1
# both builds at once: the GPU has room for both, and the CPU-side checks take most of the time
# (on an H100: 100 s and 155 s side by side, the fixtures of one subset run)
QWEN_BIN=./qwen timeout 400 ./test/test_qwen > "$out/test-sm90.log" 2>&1 &
QWEN_BIN=./qwen-sm70 timeout 400 ./test/test_qwen-sm70 > "$out/test-sm70.log" 2>&1 &
wait
for b in sm90 sm70; do echo "== $b"; grep -E "^FAIL|passed" "$out/test-$b.log" | tail -6; done
if [ -n "$san" ]; then
    compute-sanitizer --tool memcheck ./qwen -m "$san" -p "Hello world, this is a test" -n 8 \
        --temp 0 2>&1 | tail -1
    compute-sanitizer --tool racecheck ./qwen -m "$san" -p "Hello" -n 3 --temp 0 2>&1 | tail -1
fi
