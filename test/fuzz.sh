#!/usr/bin/env bash
# fuzz.sh — mutated copies of the fixture models through qwen.cu built with AddressSanitizer and
# UBSan (make fuzz builds ./qwen-san and test/fuzz_mutate, then runs this).
#
# Each case: pick a fixture (test/data/tiny-*/*.gguf, test/data/tokenizer/*.gguf) and a prompt,
# write a mutated copy with test/fuzz_mutate (header bytes, metadata values and types, tensor dims
# and types, strings, truncations, appended bytes: see its first comment), then run on it, each
# under `timeout`:
#   model files:      -m F --info;  -m F --tokenize -p TEXT;  -m F --cpu -p TEXT -n 2 -c 64 ...
#   vocabulary files: -m F --tokenize -p TEXT;  -m F --detokenize IDS
# Every run is one exec, classified by how it ended:
#   exit 0, exit 1 with an "error:" line: clean;
#   exit 1 without one, another exit code, a signal, a timeout, a sanitizer report: a finding.
# Exits 1 that say "out of host memory" are counted apart: an allocation over 4 GiB fails
# (max_allocation_size_mb), which the program must report as that error.
# For each finding the input is kept under FUZZ_OUT (up to 3 per distinct report) with a .txt
# beside it holding the mutations, the command and its stderr; the command is printed at the end.
#
# Environment:
#   FUZZ_S        seconds to run (default 60)
#   FUZZ_SEED     first seed (default: the time); the same seed gives the same cases in order
#   FUZZ_JOBS     parallel runs (default: the number of CPUs)
#   FUZZ_TIMEOUT  seconds one run may take (default 20)
#   FUZZ_OUT      where findings go (default test/fuzz-findings)
#   QWEN_SAN      the sanitized binary (default ./qwen-san)
#   FUZZ_MUTATE   the mutator (default test/fuzz_mutate)
# Exit status: 0 when there was no finding, 1 when there was, 2 when it could not run.
set -u
cd "$(dirname "$0")/.." || exit 2

FUZZ_S=${FUZZ_S:-60}
FUZZ_SEED=${FUZZ_SEED:-$(date +%s)}
FUZZ_JOBS=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 2)}
FUZZ_TIMEOUT=${FUZZ_TIMEOUT:-20}
FUZZ_OUT=${FUZZ_OUT:-test/fuzz-findings}
QWEN_SAN=${QWEN_SAN:-./qwen-san}
FUZZ_MUTATE=${FUZZ_MUTATE:-test/fuzz_mutate}
KEEP=3 # inputs kept per distinct finding

for v in FUZZ_S FUZZ_SEED FUZZ_JOBS FUZZ_TIMEOUT; do
    [[ ${!v} =~ ^[0-9]+$ ]] || { echo "fuzz.sh: $v=${!v} is not a number" >&2; exit 2; }
done
for x in "$QWEN_SAN" "$FUZZ_MUTATE"; do
    [ -x "$x" ] || { echo "fuzz.sh: $x is missing (make fuzz builds it)" >&2; exit 2; }
done
shopt -s nullglob
MODELS=(test/data/tiny-*/*.gguf)
VOCABS=(test/data/tokenizer/*.gguf)
FIXTURES=("${MODELS[@]}" "${VOCABS[@]}")
[ ${#MODELS[@]} -gt 0 ] || { echo "fuzz.sh: no fixture models in test/data" >&2; exit 2; }

# Reports go to stderr; a report also ends the run with status 99. Leaks are not checked (the
# error paths exit without freeing). A failed allocation returns NULL as it would without the
# sanitizer, and the program reports it.
ASAN_OPTIONS=detect_leaks=0:exitcode=99:allocator_may_return_null=1:max_allocation_size_mb=4096
export ASAN_OPTIONS
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:exitcode=99
SAN_RE='^==[0-9]+==ERROR: |: runtime error: |^SUMMARY: [A-Za-z]+Sanitizer'
SAN_ANY='==[0-9]+==ERROR: |: runtime error: |SUMMARY: [A-Za-z]+Sanitizer' # anywhere in a string

PROMPTS=(
    "Hello"
    "Hello world, how are you?"
    $'<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n'
    "你好，世界。日本語のテキスト"
    $'caf\xc3\xa9 cafe\xcc\x81 na\xc3\xafve \xe2\x80\x94 \xef\xac\x81'
    $'bad \xff\xfe utf-8 \xc3 \xed\xa0\x80 \xf4\x90\x80\x80 \xc0\x80 end'
    $'  spaces   and\ttabs\n\n\n  '
    "12345678901234567890 3.14159 0x1F"
    $'\xf0\x9f\x98\x80\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd \xe2\x80\x8b zero width'
    "Привет мир ខ្មែរ العربية"
    "<|endoftext|><0x41> <|im_end|><think></think>"
    "don't I'll we've THEY'RE"
)
DETOK=("0" "1,2,3" "0,998,1000,1023" "151643,151644,151645" "255,256,257,258")

TMP=$(mktemp -d /dev/shm/qwen-fuzz.XXXXXX 2>/dev/null || mktemp -d) || exit 2
trap 'rm -rf "$TMP"' EXIT
trap 'exit 130' INT TERM
mkdir -p "$FUZZ_OUT" "$TMP/sig" || exit 2

START=$(date +%s)
DEADLINE=$((START + FUZZ_S))

# keep_finding WORKER CASE KIND MODE STDERR CMD... : save the input (KEEP per signature) and log it
keep_finding() {
    local w=$1 k=$2 kind=$3 mode=$4 err=$5
    shift 5
    # the signature: the sanitizer's SUMMARY line (or its first report line) without addresses,
    # or the kind and mode
    local sig
    sig=$({ grep -a -m1 '^SUMMARY: ' "$err" || grep -a -m1 -E "$SAN_RE" "$err"; } |
        sed -E 's/==[0-9]+==//; s/0x[0-9a-f]+/ADDR/g')
    [ -n "$sig" ] || sig="$kind in $mode"
    local h n name=""
    h=$(printf '%s' "$sig" | cksum | cut -d' ' -f1)
    for n in $(seq 1 $KEEP); do
        if mkdir "$TMP/sig/$h.$n" 2>/dev/null; then name="$kind-$FUZZ_SEED-$w-$k-$mode"; break; fi
    done
    if [ -n "$name" ]; then
        cp "$TMP/w$w.gguf" "$FUZZ_OUT/$name.gguf"
        local cmd=""
        local a
        for a in "$@"; do
            [ "$a" = "$TMP/w$w.gguf" ] && a="$FUZZ_OUT/$name.gguf"
            cmd+=" $(printf '%q' "$a")"
        done
        cmd="ASAN_OPTIONS=$ASAN_OPTIONS UBSAN_OPTIONS=$UBSAN_OPTIONS${cmd}"
        {
            echo "finding: $sig"
            echo "made by: $FUZZ_MUTATE $CASE_FIXTURE OUT $CASE_SEED"
            echo "mutations: $(cat "$TMP/w$w.desc")"
            echo "reproduce: $cmd"
            echo "--- stderr (first 100 lines)"
            head -n 100 "$err"
        } > "$FUZZ_OUT/$name.txt"
        printf '%s\t%s\t%s\n' "$sig" "$FUZZ_OUT/$name.gguf" "$cmd" >> "$TMP/findings.w$w"
    fi
    printf '%s\n' "$sig" >> "$TMP/sigs.w$w"
}

# run_one WORKER CASE MODE CMD... : run, classify, log "MODE KIND" to the worker's log
# (the common outcomes are classified without starting another process: this machine's time
# goes to the runs themselves)
run_one() {
    local w=$1 k=$2 mode=$3
    shift 3
    local err="$TMP/w$w.err" rc kind text=""
    { timeout -k 5 "$FUZZ_TIMEOUT" "$@" > /dev/null 2> "$err" < /dev/null; } 2> /dev/null
    rc=$?
    [ $rc -ne 0 ] && IFS= read -r -d '' text < "$err"
    if [ $rc -eq 99 ] || [[ $text =~ $SAN_ANY ]]; then kind=sanitizer
    elif [ $rc -eq 0 ]; then kind=exit0
    elif [ $rc -eq 124 ]; then kind=timeout
    elif [ $rc -gt 128 ]; then
        kind="signal-$(kill -l $((rc - 128)) 2>/dev/null || echo $((rc - 128)))"
    elif [ $rc -eq 1 ] && [[ $'\n'$text == *$'\n'"error: out of host memory"* ]]; then
        kind=exit1-oom
    elif [ $rc -eq 1 ] && [[ $'\n'$text == *$'\n'"error: "* ]]; then kind=exit1
    elif [ $rc -eq 1 ]; then kind=exit1-no-message
    else kind="exit$rc"
    fi
    # a report after a NUL byte in stderr is not in $text: grep the file for anything unusual
    case $kind in
    exit0 | exit1 | exit1-oom | sanitizer) ;;
    *) grep -a -q -E "$SAN_RE" "$err" && kind=sanitizer ;;
    esac
    echo "$mode $kind" >> "$TMP/log.w$w"
    case $kind in
    exit0 | exit1 | exit1-oom) ;;
    *) keep_finding "$w" "$k" "$kind" "$mode" "$err" "$@" ;;
    esac
}

worker() {
    local w=$1 k=0 seed f p nf=${#FIXTURES[@]} np=${#PROMPTS[@]}
    local now
    while printf -v now '%(%s)T' -1 && [ "$now" -lt "$DEADLINE" ]; do
        # the case's seed from FUZZ_SEED, the worker and the case number
        seed=$(((FUZZ_SEED * 1000003 + w * 7919 + k * 104729) & 0x7fffffffffff))
        f=${FIXTURES[seed % nf]}
        p=${PROMPTS[(seed / 7) % np]}
        CASE_FIXTURE=$f CASE_SEED=$seed
        if ! "$FUZZ_MUTATE" "$f" "$TMP/w$w.gguf" "$seed" > "$TMP/w$w.desc" 2> "$TMP/w$w.merr"; then
            echo "fuzz.sh: $FUZZ_MUTATE $f OUT $seed failed: $(cat "$TMP/w$w.merr")" >&2
            echo "mutator error" >> "$TMP/log.w$w"
            return
        fi
        local F="$TMP/w$w.gguf"
        if [[ $f == test/data/tokenizer/* ]]; then
            run_one "$w" "$k" tokenize "$QWEN_SAN" -m "$F" --tokenize -p "$p"
            run_one "$w" "$k" detokenize "$QWEN_SAN" -m "$F" --detokenize "${DETOK[seed % 5]}"
        else
            run_one "$w" "$k" info "$QWEN_SAN" -m "$F" --info
            run_one "$w" "$k" tokenize "$QWEN_SAN" -m "$F" --tokenize -p "$p"
            if ((seed % 3)); then
                run_one "$w" "$k" cpu "$QWEN_SAN" -m "$F" --cpu -p "$p" -n 2 --temp 0 -c 64
            else # the sampler too
                run_one "$w" "$k" cpu "$QWEN_SAN" -m "$F" --cpu -p "$p" -n 2 -c 64 --seed "$k"
            fi
        fi
        k=$((k + 1))
    done
}

count() { cat "$TMP"/log.w* 2>/dev/null | wc -l; }
nfind() { cat "$TMP"/sigs.w* 2>/dev/null | wc -l; }

echo "fuzz: ${#FIXTURES[@]} fixtures, $FUZZ_JOBS jobs, ${FUZZ_S} s, seed $FUZZ_SEED," \
     "timeout ${FUZZ_TIMEOUT} s per run, $QWEN_SAN"
pids=()
for ((w = 0; w < FUZZ_JOBS; w++)); do
    worker "$w" &
    pids+=($!)
done
# progress once a minute
while :; do
    now=$(date +%s)
    [ "$now" -ge "$DEADLINE" ] && break
    left=$((DEADLINE - now))
    sleep $((left < 60 ? left : 60))
    now=$(date +%s)
    [ "$now" -lt "$DEADLINE" ] && echo "  $((now - START)) s: $(count) execs, $(nfind) findings"
done
wait "${pids[@]}"
END=$(date +%s)

EXECS=$(count)
ELAPSED=$((END - START))
echo "fuzz: $EXECS execs in $ELAPSED s ($((EXECS * 60 / (ELAPSED ? ELAPSED : 1))) per minute)," \
     "seed $FUZZ_SEED"
echo "exits by kind (all modes, then per mode):"
cat "$TMP"/log.w* | awk '{ all[$2]++; by[$1 " " $2]++ }
    END {
        for (k in all) printf "  %-22s %8d\n", k, all[k] | "sort"
        close("sort")
        for (k in by) {
            split(k, a, " ")
            printf "    %-10s %-22s %8d\n", a[1], a[2], by[k] | "sort"
        }
    }'
if grep -q "mutator error" "$TMP"/log.w* 2>/dev/null; then
    echo "fuzz: the mutator failed"
    exit 2
fi
NF=$(nfind)
if [ "$NF" -eq 0 ]; then
    echo "fuzz: no findings (no sanitizer report, no signal, no timeout, no other exit)"
    exit 0
fi
echo "fuzz: $NF findings; distinct:"
cat "$TMP"/sigs.w* | sort | uniq -c | sort -rn | sed 's/^/  /'
echo "inputs kept in $FUZZ_OUT (up to $KEEP per distinct finding), each with a .txt; reproduce:"
cat "$TMP"/findings.w* 2>/dev/null | while IFS=$'\t' read -r sig _ cmd; do
    echo "  [$sig]"
    echo "    $cmd"
done
exit 1
