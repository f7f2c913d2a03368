#!/usr/bin/env bash
# fuzz_lib.sh — the coverage-guided fuzz targets of test/fuzz_targets.h under libFuzzer (make
# fuzz-lib builds test/fuzz_lib and its links test/fuzz-TARGET, then runs this).
#
# Each target in turn gets its share of FUZZ_S seconds on every core: libFuzzer's fork mode runs
# FUZZ_JOBS child processes on the shared corpus, and goes on past a crash (-ignore_crashes), so
# that one run collects every finding. Per input: at most -max_len bytes, 10 s, 2 GiB.
#   corpus:  FUZZ_CORPUS/TARGET (grows from run to run; not in git), seeded from
#            test/data/fuzz/seeds/TARGET; dictionaries from test/data/fuzz/dict
#   findings: every crashing input (sanitizer report, failed check of the target, signal,
#            timeout, out of memory) is replayed once to get its report; the smallest input of
#            each distinct report is copied to test/data/fuzz/TARGET/, which make test replays
#            (test_fuzz_replays in fuzz_targets.h). Commit it with the fix of its bug.
# Prints per target: executions, coverage (cov: edges of the code reached; ft: libFuzzer's finer
# features), corpus size, findings; then the total executions.
#
# Environment:
#   FUZZ_S        seconds in all (default 60), shared evenly by the targets
#   FUZZ_JOBS     parallel jobs per target (default: the number of CPUs)
#   FUZZ_TARGETS  the targets to run (default "gguf vocab text kld args")
#   FUZZ_CORPUS   where the corpora grow (default test/fuzz-corpus)
#   FUZZ_OUT      where findings go (default test/data/fuzz)
#   QWEN_TEST_DATA  the fixtures (default test/data): the text target's real vocabularies are
#                 copied from its tokenizer/ when the run starts
# Exit status: 0 when there was no finding, 1 when there was, 2 when it could not run.
set -u
cd "$(dirname "$0")/.." || exit 2

FUZZ_S=${FUZZ_S:-60}
FUZZ_JOBS=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 2)}
FUZZ_TARGETS=${FUZZ_TARGETS:-gguf vocab text kld args}
FUZZ_CORPUS=${FUZZ_CORPUS:-test/fuzz-corpus}
FUZZ_OUT=${FUZZ_OUT:-test/data/fuzz}
DATA=${QWEN_TEST_DATA:-test/data}
SEEDS=test/data/fuzz/seeds
DICTS=test/data/fuzz/dict

for v in FUZZ_S FUZZ_JOBS; do
    [[ ${!v} =~ ^[0-9]+$ ]] || { echo "fuzz_lib.sh: $v=${!v} is not a number" >&2; exit 2; }
done
read -r -a TARGETS <<< "$FUZZ_TARGETS"
for t in "${TARGETS[@]}"; do
    [ -x "test/fuzz-$t" ] || { echo "fuzz_lib.sh: test/fuzz-$t is missing (make fuzz-lib)" >&2
                               exit 2; }
done
SHARE=$((FUZZ_S / ${#TARGETS[@]}))
[ "$SHARE" -ge 1 ] || SHARE=1

TMP=$(mktemp -d) || exit 2
trap 'rm -rf "$TMP"' EXIT
trap 'exit 130' INT TERM

# the text target's vocabularies, copied: the run does not depend on the fixtures staying put
mkdir -p "$TMP/data/tokenizer"
if [[ " ${TARGETS[*]} " == *" text "* ]]; then
    for v in vocab-qwen2.gguf vocab-qwen2-pre35.gguf; do
        cp "$DATA/tokenizer/$v" "$TMP/data/tokenizer/" ||
            { echo "fuzz_lib.sh: the text target needs $DATA/tokenizer/$v" >&2; exit 2; }
    done
fi
export QWEN_TEST_DATA=$TMP/data

# Leaks are not checked (die() paths exit without freeing). UBSan reports abort, as ASan's do.
export ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# symbolized reports: libFuzzer's runtime looks for llvm-symbolizer on PATH
[ -d /usr/lib/llvm-14/bin ] && export PATH=$PATH:/usr/lib/llvm-14/bin

# the largest input of each target: a few times its largest seed
max_len() {
    case $1 in
    gguf) echo 16384 ;;
    vocab) echo 65536 ;;
    text) echo 1024 ;; # with FZ_REPEAT, texts of up to 8 KB
    kld) echo 4096 ;;
    args) echo 1024 ;;
    esac
}
dict_of() {
    case $1 in
    gguf | vocab) echo "$DICTS/gguf.dict" ;;
    *) echo "$DICTS/$1.dict" ;;
    esac
}

# signature FILE TARGET: what went wrong and where, without addresses or numbers: the kind of
# report (its summary, the target's failed check, or libFuzzer's deadly signal, timeout, out of
# memory), then the first stack frame in the code under test
signature() {
    local out kind frame
    out=$("test/fuzz-$2" -runs=1 -timeout=20 "$1" 2>&1 < /dev/null)
    kind=$({ grep -a -m1 -o -E 'fuzz check failed: .*' <<< "$out" ||
        grep -a -m1 -o -E '(AddressSanitizer|UndefinedBehaviorSanitizer): [a-z-]+( [^ ]+:[0-9]+)?' \
            <<< "$out" ||
        grep -a -m1 -o -E 'ERROR: libFuzzer: [a-z-]+' <<< "$out" || echo "${1##*/}"; } |
        sed -E 's/-[0-9a-f]{40}$//')
    frame=$(grep -a -E '^ +#[0-9]+ 0x[0-9a-f]+ in ' <<< "$out" |
        sed -E 's/^ +#[0-9]+ 0x[0-9a-f]+ in ([^ (]+).*/\1/' |
        grep -v -E '^(__asan|__interceptor|__sanitizer|__ubsan|__libc|fuzzer::|abort|raise)' |
        grep -v -m1 -x fz_fail)
    echo "$kind${frame:+ in $frame}" | sed -E 's/0x[0-9a-f]+/ADDR/g; s/[0-9]+/N/g'
}

echo "fuzz-lib: targets ${TARGETS[*]}, ${SHARE} s each on $FUZZ_JOBS jobs (fork mode)," \
     "corpus in $FUZZ_CORPUS, findings to $FUZZ_OUT"
TOTAL=0
NEW=0
FOUND=0
ROWS=()
for t in "${TARGETS[@]}"; do
    mkdir -p "$FUZZ_CORPUS/$t" "$TMP/art-$t" "$FUZZ_OUT/$t"
    dict=$(dict_of "$t")
    dict_opt=()
    [ -f "$dict" ] && dict_opt=(-dict="$dict")
    start=$(date +%s)
    "test/fuzz-$t" -fork="$FUZZ_JOBS" -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 \
        -max_total_time="$SHARE" -max_len="$(max_len "$t")" -timeout=10 -rss_limit_mb=2048 \
        -close_fd_mask=3 -print_final_stats=1 "${dict_opt[@]}" -artifact_prefix="$TMP/art-$t/" \
        "$FUZZ_CORPUS/$t" "$SEEDS/$t" > "$TMP/log-$t" 2>&1 < /dev/null
    rc=$?
    secs=$(($(date +%s) - start))
    # the last status line of fork mode: "#EXECS: cov: C ft: F corp: N exec/s: E ..."
    last=$(grep -a -E '^#[0-9]+: cov: ' "$TMP/log-$t" | tail -n 1)
    if [ -z "$last" ]; then
        echo "fuzz-lib: $t did not run (exit $rc); its log:"
        tail -n 30 "$TMP/log-$t"
        ROWS+=("$(printf '%-6s %6s %12s %9s %6s %7s %7s %9s' "$t" "$secs" "-" "-" "-" "-" "-" \
                  "no run")")
        FOUND=$((FOUND + 1))
        continue
    fi
    execs=$(sed -E 's/^#([0-9]+):.*/\1/' <<< "$last")
    cov=$(sed -E 's/.* cov: ([0-9]+).*/\1/' <<< "$last")
    ft=$(sed -E 's/.* ft: ([0-9]+).*/\1/' <<< "$last")
    corp=$(sed -E 's/.* corp: ([0-9]+).*/\1/' <<< "$last")
    TOTAL=$((TOTAL + execs))
    # findings: one input per distinct report, the smallest, into FUZZ_OUT/TARGET
    declare -A best=()
    n_art=0
    for a in "$TMP/art-$t"/*; do
        [ -f "$a" ] || continue
        n_art=$((n_art + 1))
        sig=$(signature "$a" "$t")
        if [ -z "${best[$sig]+x}" ] || [ "$(stat -c%s "$a")" -lt "$(stat -c%s "${best[$sig]}")" ]
        then best[$sig]=$a
        fi
    done
    for sig in "${!best[@]}"; do
        a=${best[$sig]}
        FOUND=$((FOUND + 1))
        if [ ! -e "$FUZZ_OUT/$t/${a##*/}" ]; then
            cp "$a" "$FUZZ_OUT/$t/" && NEW=$((NEW + 1))
        fi
        echo "  $t: $sig"
        echo "      -> $FUZZ_OUT/$t/${a##*/}   (reproduce: test/fuzz-$t $FUZZ_OUT/$t/${a##*/})"
    done
    ROWS+=("$(printf '%-6s %6s %12s %9s %6s %7s %7s %9s' "$t" "$secs" "$execs" \
              "$((execs / (secs ? secs : 1)))" "$cov" "$ft" "$corp" \
              "${#best[@]} ($n_art)")")
    unset best
done

echo
printf '%-6s %6s %12s %9s %6s %7s %7s %9s\n' target s execs exec/s cov ft corpus findings
for r in "${ROWS[@]}"; do echo "$r"; done
echo "fuzz-lib: $TOTAL executions in all; findings: $FOUND distinct ($NEW new file(s) in" \
     "$FUZZ_OUT)"
[ "$FOUND" -eq 0 ] || exit 1
exit 0
