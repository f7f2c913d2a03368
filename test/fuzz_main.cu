// fuzz_main.cu — the libFuzzer driver of the fuzz targets in fuzz_targets.h (make fuzz-lib).
//
// One binary, test/fuzz_lib, built with -fsanitize=fuzzer,address,undefined (clang++-14 as nvcc's
// host compiler); the target is the name it is run by: test/fuzz-gguf, fuzz-vocab, fuzz-text,
// fuzz-kld and fuzz-args are links to it. Any libFuzzer flag works, e.g.
//   test/fuzz-gguf -max_total_time=60 CORPUS_DIR test/data/fuzz/seeds/gguf   (fuzz)
//   test/fuzz-text test/data/fuzz/text/crash-...                          (run one input)
// test/fuzz_lib.sh runs every target for its share of the time on all cores.
//
// qwen.cu is included without TESTING (so that parse_args, which the args target needs, exists;
// its main is renamed) and with two renames of its own calls:
//   exit -> fuzz_exit: die() (and --help) end in exit(); inside a target it jumps back into the
//                      target instead, so that a named error ends one input, not the fuzzer
//   cudaGetDeviceCount -> no device: the targets run the CPU code (the budget's arithmetic
//                      without a card), the same on every machine
// Every header qwen.cu and tokenizer.c include is included first, so that the renames reach only
// their code.

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cuda_fp16.h>
#include <mma.h>
#include <cuda_runtime.h>

static jmp_buf *g_fuzz_jmp; // set while a target runs (FUZZ_TRY in fuzz_targets.h)

__attribute__((noreturn)) static void fuzz_exit(int status) {
    if (g_fuzz_jmp) longjmp(*g_fuzz_jmp, 1);
    exit(status);
}

static cudaError_t fuzz_no_device(int *n) {
    *n = 0;
    return cudaErrorNoDevice;
}

#define exit fuzz_exit
#define cudaGetDeviceCount fuzz_no_device
#define main qwen_main
#include "../qwen.cu"
#undef main
#undef cudaGetDeviceCount
#undef exit

#define FUZZ_CATCH_EXIT
#include "fuzz_targets.h"

static int (*g_target)(const uint8_t *, size_t);

// The target from the name the binary was run by (its last path component, "fuzz-NAME").
extern "C" int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    const char *name = strrchr((*argv)[0], '/');
    name = name ? name + 1 : (*argv)[0];
    if (!strcmp(name, "fuzz-gguf")) g_target = fuzz_gguf;
    else if (!strcmp(name, "fuzz-vocab")) g_target = fuzz_vocab;
    else if (!strcmp(name, "fuzz-kld")) g_target = fuzz_kld;
    else if (!strcmp(name, "fuzz-args")) g_target = fuzz_args;
    else if (!strcmp(name, "fuzz-text")) {
        // the real vocabularies, from QWEN_TEST_DATA/tokenizer (default test/data/tokenizer)
        const char *dir = getenv("QWEN_TEST_DATA") ? getenv("QWEN_TEST_DATA") : "test/data";
        if (fuzz_text_init(dir) != 0) exit(2);
        g_target = fuzz_text;
    } else {
        fprintf(stderr, "fuzz: run me as fuzz-gguf, fuzz-vocab, fuzz-text, fuzz-kld or fuzz-args "
                        "(links to this binary), not as '%s'\n", name);
        exit(2);
    }
    g_verbose = 0;
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return g_target(data, size);
}
