#!/usr/bin/env bash
# sanitize.sh — the test suite built with AddressSanitizer and UBSan (make sanitize builds
# ./qwen-san and test/test_qwen-san, then runs this).
#
# test/test_qwen-san runs with QWEN_BIN=./qwen-san, so the command-line checks run the sanitized
# CLI too. Sanitizer reports are written to files (log_path) in a temporary folder rather than to
# stderr: the tests read or discard the stderr of the CLI runs they make, and a report there would
# go unseen. UBSan reports and goes on, so one run lists every report. Leaks are not checked (the
# error paths exit without freeing).
# Passes when the suite exits 0, no line is FAIL, the summary says 0 failed and there is no report.
set -u
cd "$(dirname "$0")/.." || exit 2
TEST=${1:-./test/test_qwen-san}
export QWEN_BIN=${QWEN_BIN:-./qwen-san}
for x in "$TEST" "$QWEN_BIN"; do
    [ -x "$x" ] || { echo "sanitize.sh: $x is missing (make sanitize builds it)" >&2; exit 2; }
done

D=$(mktemp -d) || exit 2
trap 'rm -rf "$D"' EXIT
# a failed allocation returns NULL (the engine's own message then names it), as without ASan;
# above 16 GiB is a failed allocation (the tests ask for 200 GB once, on purpose)
export ASAN_OPTIONS=detect_leaks=0:log_path=$D/report:allocator_may_return_null=1:max_allocation_size_mb=16384
export UBSAN_OPTIONS=print_stacktrace=1:log_path=$D/report

start=$(date +%s)
"$TEST" 2>&1 | tee "$D/out"
rc=${PIPESTATUS[0]}
secs=$(($(date +%s) - start))

# A report that only says an allocation failed is the 200 GB request above, which returned NULL and
# which the engine reports itself: shown, not counted. Anything else in a report counts.
reports=()
for r in "$D"/report*; do
    [ -e "$r" ] || continue
    if ! grep -a -v -q -E '^==[0-9]+==WARNING: AddressSanitizer failed to allocate 0x[0-9a-f]+ bytes$' "$r"; then
        echo "--- an allocation failure, on purpose (not counted): $(cat "$r")"
        continue
    fi
    reports+=("$r")
    echo "--- sanitizer report ${r##*/}"
    cat "$r"
done
if [ "$rc" -ne 0 ] || [ ${#reports[@]} -gt 0 ] || grep -a -q '^FAIL' "$D/out" ||
    ! grep -a -q '^[0-9]* passed, 0 failed' "$D/out"; then
    echo "sanitize: FAILED (exit status $rc, ${#reports[@]} sanitizer reports) in $secs s"
    exit 1
fi
echo "sanitize: passed with no sanitizer report in $secs s"
