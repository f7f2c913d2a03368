#!/usr/bin/env bash
# test/gpu_run.sh OUT "model:ftype ..." [sanitize-model] — what a GPU run of qwen.cu does: build for this
# GPU, run the tests with this build and with the prebuilt sm_70 binaries (qwen-sm70, through PTX
# JIT), compute-sanitizer on a short generation, the floor of the decode chain (test/step_floor), then
# benchmark full-size synthetic models.
set -uo pipefail
out=$1; models=$2; san=${3:-}
make ARCH=sm_90 qwen test/test_qwen test/gen_model test/step_floor 2>&1 | grep -E "error"
export QWEN_TEST_SUBSET=1 QWEN_REQUIRE_GPU=1
QWEN_BIN=./qwen timeout 300 ./test/test_qwen > $out/test-sm90.log 2>&1; grep -E "^FAIL|passed" $out/test-sm90.log | tail -6
QWEN_BIN=./qwen-sm70 timeout 300 ./test/test_qwen-sm70 > $out/test-sm70.log 2>&1; grep -E "^FAIL|passed" $out/test-sm70.log | tail -6
if [ -n "$san" ]; then
    compute-sanitizer --tool memcheck ./qwen -m "$san" -p "Hello world, this is a test" -n 8 --temp 0 2>&1 | tail -1
    compute-sanitizer --tool racecheck ./qwen -m "$san" -p "Hello" -n 3 --temp 0 2>&1 | tail -1
fi
test/step_floor 27b-iq4_xs > $out/step_floor.log 2>&1; grep -E "graph \(|stream \(" $out/step_floor.log
test/gpu_bench.sh $out "$models" ./qwen ./qwen-sm70 2>&1 | grep -E "^==|^ +[0-9]+ +[0-9.]+ GB|copy band|pp512"
