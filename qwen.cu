// qwen.cu — a single-file CUDA C inference engine for Qwen models stored as GGUF.
//
// Runs Qwen2/2.5 (`qwen2`), Qwen3 (`qwen3`) and Qwen3.5/3.6 (`qwen35`: Gated DeltaNet + gated
// attention) straight from a GGUF file on one NVIDIA GPU, built first for the V100 (sm_70: no bf16,
// dp4a, 900 GB/s) and running on every newer card. The whole model is on the GPU or it does not
// run: a VRAM budget proves it fits before anything large is allocated. Every kernel of the forward
// pass has a plain-C twin in this file: the C twin is the readable specification, `--cpu` runs the
// whole model on it, and the tests compare the two.
//
// Minimal in three ways only: no dependencies beyond the CUDA toolkit, one file (with the tokenizer
// it includes), no abstraction layers (plain structs, functions and kernels; no classes, no
// framework). It is not small. A quarter of it can be skipped on a first reading: code that exists
// only for speed (the streaming mat-vec, the step order, the fast code of six more types, the
// DeltaNet token kernel, the batched prompt pass), each block marked by a first comment line that
// starts "Speed:" and names its measurements in test/PERF_NOTES.md. Other choices made for speed
// (the 16-bit activations, the planes, the CUDA graph, the attention's split) lie on the path a
// first reading follows, and are explained where they are.
//
// Read it top to bottom; the sections follow one token from the file on disk to the next token:
//
//    1. utilities ............ errors, fp16/bf16 conversions, timers
//    2. GGUF reader .......... the file format, every read bounded by the bytes left
//    3. tensor types ......... block layouts, and dequant_unit: the definition of every format
//    4. config & weights ..... hyper-parameters from metadata, weights looked up by name and shape
//    5. CPU forward .......... the plain-C twin of the whole model: the math, in fp32
//    6. GPU mat-vec .......... y = W x: the simple kernel, 16-bit activations, the per-block fast
//                              kernel; then, for speed, the streaming kernel and its step order
//    7. GPU layer kernels .... RMSNorm, attention (RoPE, KV store folded in), DeltaNet, SwiGLU
//    8. prefill kernels ...... a prompt batch through a layer at once: tensor-core products, the
//                              batch's attention and DeltaNet, the perplexity's loss per row
//    9. GPU forward .......... VRAM budget, weight upload, the token's layer loop as a CUDA graph,
//                              the batched prompt pass
//   10. tokenizer & sampler .. tokenizer.c (byte-level BPE); greedy, temperature, top-k/p, min-p
//   11. running the model .... the engine, generate and chat, --bench, --info, perplexity and
//                              KL-divergence files, the command line and its modes
//
// A first reading skips every block whose first comment line starts "Speed:" (a whole section or
// subsection when that line follows its title) and still has a complete, correct engine to read
// for the float types and the four quantized types of 6.4; 6.4b gives six more types the same
// machinery, one sub_load and sub_dot each.
//
// The path of one generated token: main -> mode_generate -> gen_feed (the prompt) -> engine_eval
// -> gpu_prompt_batches -> forward_gpu_batch, which runs the prompt's tokens through each layer
// together, and batch_logits_gpu, whose last row gives the first sampled token's logits; then
// gen_answer -> sample, and per new token engine_forward -> forward_gpu, which replays the graph of
// forward_gpu_enqueue: rope_angles_kernel once, then per layer rmsnorm_quant, attention_block_gpu
// (matvec_qkv, attention, matvec) or deltanet_block_gpu (matvec_batch, gdn_token, matvec),
// rmsnorm_quant, ffn_gate_up, matvec; then the output norm and matvec into the logits. On the CPU,
// forward_cpu runs the same steps in C, one token at a time. A first reading follows the same path
// with -b 1 (the prompt token by token through forward_gpu), the per-block mat-vec for every matrix
// and DeltaNet's three kernels (7.3) for gdn_token. The marked blocks change how fast, and the
// rounding (the order of sums; the batched prompt's fp16 operands), not the math.
//
// Conventions used everywhere:
//   * A weight with GGUF shape {n_in, n_out} is n_out rows of n_in elements; y[r] = dot(W[r,:], x).
//     Quantization blocks run along a row.
//   * The residual stream and every accumulation are fp32. The V100 has no bf16 and real Qwen
//     activations have outliers that fp16 sums cannot hold. The KV cache is fp16; the inputs of the
//     fast mat-vecs are 16-bit integers with an fp32 scale per 32 values (6.2); the inputs of
//     the prefill's tensor-core products are fp16 rows with a power-of-two scale per row (8).
//   * Shapes in comments are written (outer, ..., inner), the innermost index contiguous.

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <regex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cuda_fp16.h>
#include <mma.h>
#include <cuda_runtime.h>

// ------------------------------------------------------------------------------------------------
// 1. Utilities
// ------------------------------------------------------------------------------------------------

// 1 while the text printed on stdout does not end with a newline (generation is mid-line): an
// error then starts on a line of its own.
static int g_stdout_midline = 0;
// An output file is written under a temporary name in its own directory and renamed over its
// name only once it is complete (output_open, output_close): these are the temporary files while
// they are being written, one slot each (NULL: free). Two can be open at once: a --diff-out table
// while --dump-hidden writes its files. die() and the signals that end a run delete them, so that
// a failed or interrupted write leaves neither a file that looks valid nor a loss of the file that
// was there (--dump-hidden deletes an older dump's files of its names first: dump_hidden).
// (volatile: the signal handlers read them.)
#define N_OUTPUTS 2
static const char *volatile g_partial_file[N_OUTPUTS];
// 1 during a chat answer, 2 once Ctrl-C has asked it to stop (the answer ends at the next token,
// and the chat goes on); 0 elsewhere, where Ctrl-C ends the run.
static volatile sig_atomic_t g_answer_sigint = 0;

// The partial files deleted (by a signal handler too: unlink may be called there).
static void unlink_partial(void) {
    for (int i = 0; i < N_OUTPUTS; i++) {
        const char *partial = g_partial_file[i];
        if (partial) unlink(partial);
    }
}

// The exit of every failed run, once its message is printed: the partial files deleted, status 1.
static void exit_failed(void) {
    unlink_partial();
    exit(1);
}

// Every fatal error goes through here: one line naming what went wrong, optionally a "hint:" line
// saying what the user can do about it, and a non-zero exit. No error path crashes.
static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fflush(stdout);
    fprintf(stderr, "%serror: ", g_stdout_midline ? "\n" : "");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit_failed();
}

// Standard output is checked like a file: a write that fails (a full disk, /dev/full, a pipe
// whose reader failed) is an error, never a run that looks successful. fflush sends what stdio
// holds, and its errno says why it failed; ferror also reports a write that failed earlier.
// `closed` is set by main when the run started with stdout closed (`>&-`).
static int g_stdout_closed = 0;
static void check_stdout(void) {
    if (g_stdout_closed) die("writing standard output: it is closed (the run started with >&-)");
    errno = 0;
    int bad = fflush(stdout) != 0;
    if (bad || ferror(stdout))
        die("writing standard output: %s", bad && errno ? strerror(errno) : "a write failed");
}

// Ctrl-C, a kill, a closed terminal or pipe, the file-size limit: the run ends as die() ends it,
// the partial file deleted, then with the signal's own status through its default action. The one
// exception is a Ctrl-C during a chat answer: it only asks the answer to stop (g_answer_sigint),
// as llama.cpp's chat does; a second Ctrl-C before it stops ends the run.
// (unlink, signal and raise may be called in a signal handler; stdio may not.)
static void on_fatal_signal(int sig) {
    if (sig == SIGINT && g_answer_sigint == 1) {
        g_answer_sigint = 2;
        return;
    }
    unlink_partial();
    signal(sig, SIG_DFL);
    raise(sig);
}

// The files this run has mapped into memory (the model, a --diff-logits file). A read of a page
// that the file no longer has, because it was truncated or rewritten in place while the run uses
// it, raises SIGBUS at an address inside its mapping: the handler names the file and ends the run
// with exit 1. A SIGBUS anywhere else is a real fault and keeps its default action.
#define N_MAPPED 4
static struct {
    const char *volatile base; // NULL: a free slot
    size_t len;
    char path[512];
} g_mapped[N_MAPPED];
static void mapped_add(const void *base, size_t len, const char *path) {
    for (int i = 0; i < N_MAPPED; i++)
        if (!g_mapped[i].base) {
            g_mapped[i].len = len;
            snprintf(g_mapped[i].path, sizeof g_mapped[i].path, "%s", path);
            g_mapped[i].base = (const char *)base; // last: the slot is whole once it is seen
            return;
        }
}
static void mapped_remove(const void *base) {
    for (int i = 0; i < N_MAPPED; i++)
        if (g_mapped[i].base == (const char *)base) g_mapped[i].base = NULL;
}
// (write and _exit may be called in a signal handler; the message is put together by hand.)
static void on_bus_error(int sig, siginfo_t *si, void *uctx) {
    (void)uctx;
    const char *at = (const char *)si->si_addr;
    for (int i = 0; i < N_MAPPED; i++) {
        const char *b = g_mapped[i].base;
        if (!b || at < b || at >= b + g_mapped[i].len) continue;
        const char *part[3] = {g_stdout_midline ? "\nerror: '" : "error: '", g_mapped[i].path,
                               "' was truncated or rewritten while this run read it (SIGBUS)\n"};
        for (int k = 0; k < 3; k++)
            if (write(2, part[k], strlen(part[k])) < 0) break;
        unlink_partial();
        _exit(1);
    }
    signal(sig, SIG_DFL); // not a mapped file: the fault repeats with the default action
}

// The signals that end a run through on_fatal_signal.
static const int FATAL_SIGNALS[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGXFSZ};
#define N_FATAL_SIGNALS (sizeof FATAL_SIGNALS / sizeof FATAL_SIGNALS[0])
// A signal the caller ignores (nohup, a script's background job) stays ignored.
static void catch_fatal_signals(void) {
    for (size_t i = 0; i < N_FATAL_SIGNALS; i++)
        if (signal(FATAL_SIGNALS[i], SIG_IGN) != SIG_IGN) signal(FATAL_SIGNALS[i], on_fatal_signal);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_bus_error;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGBUS, &sa, NULL);
}

// --- output files: written whole or not at all ---------------------------------------------------
// An output file (a logits dump, a KL-divergence base, a --diff-out table, a quantized model) is
// written to a temporary file beside it, ".NAME.tmp-PID" (NAME cut to 200 bytes: a file name has
// at most 255), and renamed over NAME when it is
// complete and every write has succeeded. rename within a directory is atomic: every reader sees
// the old file or the new one whole, never a part (two runs writing the same name at once: the
// file is one run's). A device or a FIFO (a pipe), and the file this run's standard output goes
// to (/dev/stdout redirected to a file), are written directly. A run killed by SIGKILL (the
// kernel's out-of-memory killer) cannot delete its temporary file: it stays, hidden, beside NAME.
static FILE *g_out_file[N_OUTPUTS];                 // the open file of each slot
static char g_partial_buf[N_OUTPUTS][PATH_MAX + 64]; // its temporary file's name (g_partial_file)
static char g_target_buf[N_OUTPUTS][PATH_MAX];       // the file it will replace, links resolved

// Where output `path` (given as option `opt`) will be written: 1 with the file it replaces, links
// resolved, in target and its directory in dir; 0 for a device, a FIFO or standard output's own
// file, written in place (renaming over the latter would cut off what the run prints after it).
// Exits naming the option when the path cannot be a file: a directory, a missing directory, a
// name longer than a path can be.
static int output_target(const char *opt, const char *path, char *target, char *dir, size_t cap) {
    struct stat st, out;
    int exists = stat(path, &st) == 0;
    if (exists && S_ISDIR(st.st_mode)) die("%s '%s' is a directory: give a file name", opt, path);
    if (exists && !S_ISREG(st.st_mode)) return 0;
    if (exists && fstat(STDOUT_FILENO, &out) == 0 && out.st_dev == st.st_dev &&
        out.st_ino == st.st_ino)
        return 0;
    size_t n = strlen(path);
    if (n == 0 || path[n - 1] == '/')
        die("%s '%s': no such directory (and a file name does not end with '/')", opt, path);
    if (n >= cap) die("%s: a name of %zu bytes, longer than a path can be", opt, n);
    if (!(exists && realpath(path, target))) snprintf(target, cap, "%s", path);
    const char *slash = strrchr(target, '/');
    if (!slash) snprintf(dir, cap, ".");
    else if (slash == target) snprintf(dir, cap, "/");
    else snprintf(dir, cap, "%.*s", (int)(slash - target), target);
    struct stat sd;
    if (stat(dir, &sd) != 0 || !S_ISDIR(sd.st_mode))
        die("%s '%s': no such directory '%s'", opt, path, dir);
    return 1;
}

// Open output `path` for writing (its temporary file, or the device or FIFO itself).
static FILE *output_open(const char *opt, const char *path) {
    char dir[PATH_MAX];
    int s = 0;
    while (s < N_OUTPUTS && g_out_file[s]) s++;
    if (s == N_OUTPUTS) die("%s '%s': more than %d output files at once", opt, path, N_OUTPUTS);
    char *target = g_target_buf[s], *partial = g_partial_buf[s];
    if (!output_target(opt, path, target, dir, PATH_MAX)) {
        FILE *f = fopen(path, "wb");
        if (!f) die("cannot write %s '%s': %s", opt, path, strerror(errno));
        return f;
    }
    const char *slash = strrchr(target, '/'), *name = slash ? slash + 1 : target;
    int fd = -1;
    // The fatal signals wait while a name is tried: the handlers delete g_partial_file, which must
    // name the file this run created, from the moment it exists (not another run's leftover).
    sigset_t fatal, saved;
    sigemptyset(&fatal);
    for (size_t i = 0; i < N_FATAL_SIGNALS; i++) sigaddset(&fatal, FATAL_SIGNALS[i]);
    for (int k = 0; fd < 0 && k < 100; k++) { // a name left by a killed run is not reused
        if (k == 0) snprintf(partial, PATH_MAX + 64, "%s/.%.200s.tmp-%d", dir, name,
                             (int)getpid());
        else snprintf(partial, PATH_MAX + 64, "%s/.%.200s.tmp-%d-%d", dir, name, (int)getpid(),
                      k);
        sigprocmask(SIG_BLOCK, &fatal, &saved);
        fd = open(partial, O_WRONLY | O_CREAT | O_EXCL, 0666);
        int err = errno;
        if (fd >= 0) g_partial_file[s] = partial;
        sigprocmask(SIG_SETMASK, &saved, NULL);
        errno = err;
        if (fd < 0 && errno != EEXIST)
            die("cannot write %s '%s' (a temporary file in '%s'): %s", opt, path, dir,
                strerror(errno));
    }
    if (fd < 0) die("cannot write %s '%s': no free temporary name in '%s'", opt, path, dir);
    struct stat st; // a file that is replaced keeps its permissions
    if (stat(target, &st) == 0) fchmod(fd, st.st_mode & 07777);
    FILE *f = fdopen(fd, "wb");
    if (!f) die("cannot write %s '%s': %s", opt, path, strerror(errno));
    g_out_file[s] = f;
    return f;
}

// The end of an output file: every write checked (ferror, then fclose's own flush), then the
// rename that puts it in place. A failure deletes the temporary file; the old file stays as it was.
static void output_close(FILE *f, const char *opt, const char *path) {
    int s = 0;
    while (s < N_OUTPUTS && g_out_file[s] != f) s++;
    if (s < N_OUTPUTS) g_out_file[s] = NULL; // the slot's name stays set until the rename
    errno = 0;
    int bad = ferror(f);
    if ((fclose(f) != 0) | bad)
        die("writing %s '%s' failed: %s", opt, path, errno ? strerror(errno) : "a write failed");
    if (s == N_OUTPUTS) return; // written in place (a device or a FIFO)
    if (rename(g_partial_buf[s], g_target_buf[s]) != 0)
        die("writing %s '%s' failed: %s", opt, path, strerror(errno));
    g_partial_file[s] = NULL;
}

// "s" after a count other than 1: "1 chunk", "2 chunks".
static const char *plural_s(long long n) { return n == 1 ? "" : "s"; }

#define CUDA_CHECK(call)                                                                           \
    do {                                                                                           \
        cudaError_t err_ = (call);                                                                 \
        if (err_ != cudaSuccess)                                                                   \
            die("CUDA: %s (%s:%d: %s)", cudaGetErrorString(err_), __FILE__, __LINE__, #call);      \
    } while (0)

// After every kernel launch: catches bad launch configurations at the line that made them.
// (A function, so that it can follow a launch inside an expression.)
static void kernel_check(const char *file, int line) {
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess)
        die("CUDA kernel launch: %s (%s:%d)", cudaGetErrorString(err), file, line);
}
#define KERNEL_CHECK() kernel_check(__FILE__, __LINE__)

// malloc, calloc and realloc that never return NULL: running out of host memory is a fatal error
// that says what the memory was for (`what`, e.g. "the -f file", with the flag that sizes it).
static void die_out_of_memory(double bytes, const char *what) {
    die("out of host memory: %s needs %.1f MB", what, bytes / 1e6);
}
static void *xmalloc(size_t n, const char *what) {
    void *p = malloc(n ? n : 1);
    if (!p) die_out_of_memory((double)n, what);
    return p;
}
static void *xcalloc(size_t n, size_t size, const char *what) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) die_out_of_memory((double)n * size, what);
    return p;
}
static void *xrealloc(void *old, size_t n, const char *what) {
    void *p = realloc(old, n ? n : 1);
    if (!p) die_out_of_memory((double)n, what);
    return p;
}

// Settings from the command line that reach deep into the engine.
static double g_vram_limit = 0.0; // --vram-limit in bytes; 0: the card as it is
static int g_verbose = 1;         // print the VRAM budget and the load progress (tests: 0)

static double now_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// IEEE half -> float. On the host with integer operations, so that the CPU path needs nothing from
// CUDA; on the GPU, one instruction.   half: 1 sign bit, 5 exponent bits (bias 15), 10 mantissa
// bits
__host__ __device__ __forceinline__ static float fp16_to_f32(uint16_t h) {
#ifdef __CUDA_ARCH__
    return __half2float(__ushort_as_half(h));
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0x1f) {                       // inf / nan
        bits = sign | 0x7f800000 | (man << 13);
    } else if (exp != 0) {                   // normal: rebias 15 -> 127
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {                   // signed zero
        bits = sign;
    } else {                                 // subnormal: value = man * 2^-24, normalise it
        int e = -1;
        do { man <<= 1; e++; } while (!(man & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
#endif
}

// bf16 is the top half of an fp32: widening is a shift.
__host__ __device__ static float bf16_to_f32(uint16_t b) {
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

// v rounded to the nearest fp16 (the prefill's weight tiles hold fp16).
__host__ __device__ static float f16r(float v) { return __half2float(__float2half(v)); }

// ------------------------------------------------------------------------------------------------
// 2. GGUF reader
// ------------------------------------------------------------------------------------------------
// A GGUF file, all little-endian:
//
//   "GGUF" | u32 version | i64 n_tensors | i64 n_kv
//   n_kv      x { string key | i32 type | value }     value: scalar, string, or
//                                                      array = { i32 elem_type | u64 n | n values }
//   n_tensors x { string name | u32 n_dims | i64 ne[n_dims] | i32 ggml_type | u64 offset }
//   padding to `general.alignment` (default 32)
//   data blob: each tensor at data_start + offset, each padded to the alignment
//
//   string = { u64 len | len bytes, no NUL }
//
// The file is mapped read-only and parsed in place. It is an attack surface, so every read goes
// through a cursor that knows how many bytes are left, every count is checked before it is used to
// allocate or to index, and every failure names the field it was reading. The checks follow
// ggml's reference reader (gguf.cpp in the ggml repository), plus: zero-sized dimensions are
// rejected.

enum {
    GGUF_TYPE_U8 = 0, GGUF_TYPE_I8 = 1, GGUF_TYPE_U16 = 2, GGUF_TYPE_I16 = 3, GGUF_TYPE_U32 = 4,
    GGUF_TYPE_I32 = 5, GGUF_TYPE_F32 = 6, GGUF_TYPE_BOOL = 7, GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9, GGUF_TYPE_U64 = 10, GGUF_TYPE_I64 = 11, GGUF_TYPE_F64 = 12,
    GGUF_TYPE_COUNT = 13,
};
static const char *GGUF_TYPE_NAME[GGUF_TYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "str", "arr", "u64", "i64", "f64"};
static const size_t GGUF_TYPE_SIZE[GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

#define GGUF_MAX_STRING_LENGTH (1ull << 30)
#define GGUF_MAX_ARRAY_ELEMENTS (1ull << 30)
#define GGUF_MAX_NAME 64 // tensor names are at most 63 bytes (ggml's GGML_MAX_NAME)
#define GGUF_MAX_DIMS 4

typedef struct {
    char *key;               // NUL-terminated copy of the key
    int type;                // GGUF_TYPE_*
    int arr_type;            // element type when type == ARRAY
    uint64_t n;              // array length; string length when type == STRING
    const uint8_t *data;     // points into the mapped file: the scalar, the string bytes, or the
                             // first array element (string arrays: the first {u64 len, bytes})
} GGUFKV;

typedef struct {
    char name[GGUF_MAX_NAME];
    int n_dims;
    int64_t ne[GGUF_MAX_DIMS]; // ne[0] is the contiguous dimension; missing dims are 1
    int type;                  // ggml type id (section 3)
    uint64_t offset;           // from the start of the data blob
    size_t nbytes;
    const uint8_t *data;       // points into the mapped file
} GGUFTensor;

typedef struct {
    const uint8_t *base;  // whole file (mapped), size bytes
    size_t size;
    int fd;               // -1 when parsing a memory buffer
    uint32_t version;
    int64_t n_kv, n_tensors;
    GGUFKV *kv;           // (n_kv)
    GGUFTensor *tensors;  // (n_tensors)
    uint32_t alignment;
    size_t data_offset;   // start of the data blob in the file
    char err[512];        // why parsing failed
    jmp_buf fail;         // parse errors jump back to gguf_parse
} GGUF;

// Bounded cursor over the mapped bytes.
typedef struct {
    const uint8_t *p, *end;
    GGUF *g;
} Cursor;

static int cmp_cstr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}
// Copy into dup the first name that two of the n entries share and return 1, or return 0 when all
// differ; frees names. Sorting keeps it O(n log n): a file's key and tensor counts are bounded only
// by its size, and a pairwise scan of a few MB of crafted header would stall.
static int find_duplicate(const char **names, int64_t n, char *dup, size_t cap) {
    int found = 0;
    qsort(names, (size_t)n, sizeof *names, cmp_cstr);
    for (int64_t i = 1; i < n && !found; i++)
        if (strcmp(names[i - 1], names[i]) == 0) found = 1, snprintf(dup, cap, "%s", names[i]);
    free(names);
    return found;
}

static void gguf_fail(GGUF *g, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->err, sizeof g->err, fmt, ap);
    va_end(ap);
    longjmp(g->fail, 1);
}

// Take n bytes from the cursor, or fail naming what we were reading.
static const uint8_t *take(Cursor *c, uint64_t n, const char *what) {
    uint64_t left = (uint64_t)(c->end - c->p);
    if (n > left)
        gguf_fail(c->g, "%s: needs %llu bytes at offset %zu, only %llu left in the file", what,
                  (unsigned long long)n, (size_t)(c->p - c->g->base), (unsigned long long)left);
    const uint8_t *p = c->p;
    c->p += n;
    return p;
}
static void rd(Cursor *c, void *v, uint64_t n, const char *what) { memcpy(v, take(c, n, what), n); }
static uint32_t rd_u32(Cursor *c, const char *what) { uint32_t v; rd(c, &v, 4, what); return v; }
static int32_t rd_i32(Cursor *c, const char *what) { int32_t v; rd(c, &v, 4, what); return v; }
static uint64_t rd_u64(Cursor *c, const char *what) { uint64_t v; rd(c, &v, 8, what); return v; }
static int64_t rd_i64(Cursor *c, const char *what) { int64_t v; rd(c, &v, 8, what); return v; }

// A GGUF string: returns a pointer to its bytes (not NUL-terminated) and its length.
static const uint8_t *rd_str(Cursor *c, uint64_t *len, const char *what) {
    uint64_t n = rd_u64(c, what);
    if (n > GGUF_MAX_STRING_LENGTH)
        gguf_fail(c->g, "%s: string length %llu is over the 1 GiB limit", what,
                  (unsigned long long)n);
    *len = n;
    return take(c, n, what);
}

// ggml tensor types: elements per block and bytes per block, indexed by type id. Ids that were
// removed from ggml (4, 5, 31-33, 36-38) have block size 0 and are rejected, as ggml does; ids past
// MXFP4 (39) are newer formats this reader does not know the layout of, and are rejected by name.
typedef struct {
    const char *name;
    int blck;       // elements per block
    int type_size;  // bytes per block
} TypeTraits;
#define GGML_TYPE_COUNT 43
static const TypeTraits TYPE_TRAITS[GGML_TYPE_COUNT] = {
    /* 0*/ {"F32", 1, 4},       {"F16", 1, 2},       {"Q4_0", 32, 18},    {"Q4_1", 32, 20},
    /* 4*/ {"Q4_2 (removed)", 0, 0}, {"Q4_3 (removed)", 0, 0}, {"Q5_0", 32, 22}, {"Q5_1", 32, 24},
    /* 8*/ {"Q8_0", 32, 34},    {"Q8_1", 32, 36},    {"Q2_K", 256, 84},   {"Q3_K", 256, 110},
    /*12*/ {"Q4_K", 256, 144},  {"Q5_K", 256, 176},  {"Q6_K", 256, 210},  {"Q8_K", 256, 292},
    /*16*/ {"IQ2_XXS", 256, 66}, {"IQ2_XS", 256, 74}, {"IQ3_XXS", 256, 98}, {"IQ1_S", 256, 50},
    /*20*/ {"IQ4_NL", 32, 18},  {"IQ3_S", 256, 110}, {"IQ2_S", 256, 82},  {"IQ4_XS", 256, 136},
    /*24*/ {"I8", 1, 1},        {"I16", 1, 2},       {"I32", 1, 4},       {"I64", 1, 8},
    /*28*/ {"F64", 1, 8},       {"IQ1_M", 256, 56},  {"BF16", 1, 2},
    /*31*/ {"Q4_0_4_4 (removed)", 0, 0}, {"Q4_0_4_8 (removed)", 0, 0},
    /*33*/ {"Q4_0_8_8 (removed)", 0, 0}, {"TQ1_0", 256, 54},  {"TQ2_0", 256, 66},
    /*36*/ {"IQ4_NL_4_4 (removed)", 0, 0}, {"IQ4_NL_4_8 (removed)", 0, 0},
    /*38*/ {"IQ4_NL_8_8 (removed)", 0, 0}, {"MXFP4", 32, 17},
    /*40*/ {"NVFP4 (layout unknown to this reader)", 0, 0}, {"type 41 (unknown)", 0, 0},
    /*42*/ {"type 42 (unknown)", 0, 0},
};

static const char *type_name(int type) {
    return (type >= 0 && type < GGML_TYPE_COUNT) ? TYPE_TRAITS[type].name : "invalid";
}

// The metadata: n_kv x {key, type, value}. The keys are copied (NUL-terminated); the values stay in
// the map, each bounded here so that the typed getters below can read them without checks.
static void parse_kvs(GGUF *g, Cursor *c, int64_t n_kv) {
    g->kv = (GGUFKV *)xcalloc((size_t)n_kv, sizeof(GGUFKV), "the GGUF metadata table");
    g->alignment = 32;
    for (int64_t i = 0; i < n_kv; i++) {
        GGUFKV *kv = &g->kv[i];
        uint64_t klen;
        const uint8_t *k = rd_str(c, &klen, "metadata key");
        if (klen == 0) gguf_fail(g, "metadata key #%lld is empty", (long long)i);
        kv->key = (char *)xmalloc(klen + 1, "a GGUF metadata key");
        memcpy(kv->key, k, klen);
        kv->key[klen] = 0;
        g->n_kv = i + 1; // from here on gguf_close frees this key
        if (strlen(kv->key) != klen)
            gguf_fail(g, "metadata key #%lld contains a NUL byte", (long long)i);

        kv->type = rd_i32(c, kv->key);
        if (kv->type < 0 || kv->type >= GGUF_TYPE_COUNT)
            gguf_fail(g, "key '%s': unknown value type %d", kv->key, kv->type);
        if (kv->type == GGUF_TYPE_STRING) {
            kv->data = rd_str(c, &kv->n, kv->key);
        } else if (kv->type == GGUF_TYPE_ARRAY) {
            kv->arr_type = rd_i32(c, kv->key);
            if (kv->arr_type == GGUF_TYPE_ARRAY)
                gguf_fail(g, "key '%s': nested arrays are not supported", kv->key);
            if (kv->arr_type < 0 || kv->arr_type >= GGUF_TYPE_COUNT)
                gguf_fail(g, "key '%s': unknown array element type %d", kv->key, kv->arr_type);
            kv->n = rd_u64(c, kv->key);
            if (kv->n > GGUF_MAX_ARRAY_ELEMENTS)
                gguf_fail(g, "key '%s': array of %llu elements is over the 2^30 limit", kv->key,
                          (unsigned long long)kv->n);
            uint64_t left = (uint64_t)(c->end - c->p);
            kv->data = c->p;
            if (kv->arr_type == GGUF_TYPE_STRING) {
                if (kv->n * 8 > left)
                    gguf_fail(g, "key '%s': %llu strings cannot fit in the %llu bytes left",
                              kv->key, (unsigned long long)kv->n, (unsigned long long)left);
                for (uint64_t j = 0; j < kv->n; j++) {
                    uint64_t len;
                    rd_str(c, &len, kv->key); // bounds each element; the bytes stay in the map
                }
            } else {
                uint64_t esz = GGUF_TYPE_SIZE[kv->arr_type];
                if (kv->n * esz > left)
                    gguf_fail(g, "key '%s': array of %llu x %s needs %llu bytes, %llu left",
                              kv->key, (unsigned long long)kv->n, GGUF_TYPE_NAME[kv->arr_type],
                              (unsigned long long)(kv->n * esz), (unsigned long long)left);
                take(c, kv->n * esz, kv->key);
            }
        } else {
            kv->n = 1;
            kv->data = take(c, GGUF_TYPE_SIZE[kv->type], kv->key);
        }

        if (strcmp(kv->key, "general.alignment") == 0) {
            if (kv->type != GGUF_TYPE_U32)
                gguf_fail(g, "general.alignment must be u32, found %s", GGUF_TYPE_NAME[kv->type]);
            memcpy(&g->alignment, kv->data, 4);
            if (g->alignment == 0 || (g->alignment & (g->alignment - 1)))
                gguf_fail(g, "general.alignment = %u is not a non-zero power of two", g->alignment);
        }
    }

    char dup[128];
    const char **names = (const char **)xmalloc((size_t)n_kv * sizeof *names, "the GGUF key check");
    for (int64_t i = 0; i < n_kv; i++) names[i] = g->kv[i].key;
    if (find_duplicate(names, n_kv, dup, sizeof dup))
        gguf_fail(g, "duplicate metadata key '%s'", dup);
}

// The tensor infos: n_tensors x {name, dims, type, offset}. Each shape is checked here (positive,
// int32 dims, a whole number of blocks per row, no overflow) and its byte size computed.
static void parse_tensor_infos(GGUF *g, Cursor *c, int64_t n_tensors) {
    g->tensors = (GGUFTensor *)xcalloc((size_t)n_tensors, sizeof(GGUFTensor),
                                       "the GGUF tensor table");
    g->n_tensors = n_tensors;
    for (int64_t i = 0; i < n_tensors; i++) {
        GGUFTensor *t = &g->tensors[i];
        uint64_t nlen;
        const uint8_t *name = rd_str(c, &nlen, "tensor name");
        if (nlen >= GGUF_MAX_NAME)
            gguf_fail(g, "tensor #%lld: name of %llu bytes is longer than 63", (long long)i,
                      (unsigned long long)nlen);
        memcpy(t->name, name, nlen);
        t->name[nlen] = 0;
        if (strlen(t->name) != nlen)
            gguf_fail(g, "tensor #%lld: name contains a NUL byte", (long long)i);

        uint32_t n_dims = rd_u32(c, t->name);
        if (n_dims > GGUF_MAX_DIMS)
            gguf_fail(g, "tensor '%s': n_dims = %u, at most 4", t->name, n_dims);
        t->n_dims = (int)n_dims;
        for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < n_dims; d++) {
            t->ne[d] = rd_i64(c, t->name);
            if (t->ne[d] <= 0)
                gguf_fail(g, "tensor '%s': dimension %u is %lld (must be at least 1)", t->name, d,
                          (long long)t->ne[d]);
            if (t->ne[d] > INT32_MAX) // the engine keeps row counts and row lengths in ints
                gguf_fail(g, "tensor '%s': dimension %u is %lld (at most %d)", t->name, d,
                          (long long)t->ne[d], INT32_MAX);
        }
        // element count must fit in int64
        if (INT64_MAX / t->ne[1] <= t->ne[0] || INT64_MAX / t->ne[2] <= t->ne[0] * t->ne[1] ||
            INT64_MAX / t->ne[3] <= t->ne[0] * t->ne[1] * t->ne[2])
            gguf_fail(g, "tensor '%s': element count overflows", t->name);

        t->type = rd_i32(c, t->name);
        if (t->type < 0 || t->type >= GGML_TYPE_COUNT)
            gguf_fail(g, "tensor '%s': invalid ggml type id %d", t->name, t->type);
        const TypeTraits *tt = &TYPE_TRAITS[t->type];
        if (tt->blck == 0)
            gguf_fail(g, "tensor '%s': type %d (%s) is not supported", t->name, t->type, tt->name);
        if (t->ne[0] % tt->blck != 0)
            gguf_fail(g, "tensor '%s': row length %lld is not a multiple of the %s block size %d",
                      t->name, (long long)t->ne[0], tt->name, tt->blck);
        uint64_t nblocks = (uint64_t)(t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]) / tt->blck;
        if (nblocks > SIZE_MAX / tt->type_size)
            gguf_fail(g, "tensor '%s': byte size overflows", t->name);
        t->nbytes = (size_t)(nblocks * tt->type_size);
        t->offset = rd_u64(c, t->name);
    }
    char dup[128];
    const char **names = (const char **)xmalloc((size_t)n_tensors * sizeof *names,
                                                "the GGUF tensor-name check");
    for (int64_t i = 0; i < n_tensors; i++) names[i] = g->tensors[i].name;
    if (find_duplicate(names, n_tensors, dup, sizeof dup))
        gguf_fail(g, "duplicate tensor name '%s'", dup);
}

// The data blob starts at the first multiple of the alignment after the header (which ends at
// byte pos); every tensor's bytes must lie inside the file, in order and padded to the alignment.
static void place_tensors(GGUF *g, size_t pos) {
    const uint8_t *base = g->base;
    size_t size = g->size;
    int64_t n_tensors = g->n_tensors;
    size_t data_offset = (pos + g->alignment - 1) / g->alignment * g->alignment;
    if (data_offset > size && n_tensors > 0)
        gguf_fail(g, "the data section would start at %zu, past the end of the %zu-byte file",
                  data_offset, size);
    g->data_offset = data_offset;
    uint64_t expect = 0; // where the next tensor must start: offsets are exactly contiguous
    for (int64_t i = 0; i < n_tensors; i++) {
        GGUFTensor *t = &g->tensors[i];
        if (t->offset != expect)
            gguf_fail(g, "tensor '%s': offset %llu, expected %llu (tensors must be contiguous)",
                      t->name, (unsigned long long)t->offset, (unsigned long long)expect);
        uint64_t padded = ((uint64_t)t->nbytes + g->alignment - 1) / g->alignment * g->alignment;
        if (padded < t->nbytes || expect + padded < expect)
            gguf_fail(g, "tensor '%s': size overflows", t->name);
        if (t->offset > size || data_offset > size - t->offset ||
            t->nbytes > size - data_offset - t->offset)
            gguf_fail(g, "tensor '%s': %zu bytes at offset %llu run past the end of the file "
                      "(%zu bytes): truncated download?", t->name, t->nbytes,
                      (unsigned long long)(data_offset + t->offset), size);
        // the file is mapped at a page boundary and its blocks are read in place (fp16 scales, fp32
        // norms): a tensor must start on 4 bytes, as it does with any alignment of 4 or more
        if ((data_offset + t->offset) % 4 != 0)
            gguf_fail(g, "tensor '%s': its data at file offset %llu is not 4-byte aligned "
                      "(general.alignment = %u)", t->name,
                      (unsigned long long)(data_offset + t->offset), g->alignment);
        t->data = base + data_offset + t->offset;
        expect += padded;
    }
}

// Parse a GGUF image of `size` bytes at `base`: the header here, then the three parts above in file
// order. Returns 0, or -1 with g->err saying why (every gguf_fail jumps back to the setjmp below).
// On failure the caller must still call gguf_close() to free what was allocated.
static int gguf_parse(GGUF *g, const uint8_t *base, size_t size) {
    g->base = base;
    g->size = size;
    g->kv = NULL;
    g->tensors = NULL;
    g->n_kv = g->n_tensors = 0;
    g->err[0] = 0;
    if (setjmp(g->fail)) return -1;

    Cursor c = {base, base + size, g};
    const uint8_t *magic = take(&c, 4, "magic");
    if (memcmp(magic, "GGUF", 4) != 0)
        gguf_fail(g, "not a GGUF file (magic bytes are not \"GGUF\")");

    g->version = rd_u32(&c, "version");
    if (g->version == 0) gguf_fail(g, "version 0 is invalid");
    if ((g->version & 0xffff) == 0)
        gguf_fail(g, "version %u looks byte-swapped: big-endian GGUF files are not supported",
                  g->version);
    if (g->version == 1) gguf_fail(g, "GGUF version 1 is not supported (only 2 and 3)");
    if (g->version > 3)
        gguf_fail(g, "GGUF version %u is newer than this reader (2 and 3)", g->version);

    int64_t n_tensors = rd_i64(&c, "n_tensors");
    int64_t n_kv = rd_i64(&c, "n_kv");
    // Each KV pair takes at least 8+4+1 bytes (an empty key, a one-byte value) and each tensor info
    // at least 8+4+4+8 (an empty name, no dims): bounding the counts by the file size keeps the
    // allocations of parse_kvs and parse_tensor_infos honest.
    if (n_tensors < 0 || (uint64_t)n_tensors > size / 24)
        gguf_fail(g, "n_tensors = %lld is impossible for a file of %zu bytes", (long long)n_tensors,
                  size);
    if (n_kv < 0 || (uint64_t)n_kv > size / 13)
        gguf_fail(g, "n_kv = %lld is impossible for a file of %zu bytes", (long long)n_kv, size);

    parse_kvs(g, &c, n_kv);
    parse_tensor_infos(g, &c, n_tensors);
    place_tensors(g, (size_t)(c.p - base));
    return 0;
}

// Free what gguf_parse allocated and unmap the file; safe on a half-parsed GGUF.
static void gguf_close(GGUF *g) {
    if (g->kv)
        for (int64_t i = 0; i < g->n_kv; i++) free(g->kv[i].key);
    free(g->kv);
    free(g->tensors);
    g->kv = NULL;
    g->tensors = NULL;
    if (g->fd >= 0 && g->base) {
        mapped_remove(g->base);
        munmap((void *)g->base, g->size);
    }
    if (g->fd >= 0) close(g->fd);
    g->fd = -1;
    g->base = NULL;
}

// Map a file read-only and parse it. On error: message in g->err, returns -1 (nothing left open).
static int gguf_open(GGUF *g, const char *path) {
    memset(g, 0, sizeof *g);
    // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, for ever; the
    // check that follows refuses it (and a directory or a device) at once.
    g->fd = open(path, O_RDONLY | O_NONBLOCK);
    if (g->fd < 0) {
        snprintf(g->err, sizeof g->err, "cannot open '%s': %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    memset(&st, 0, sizeof st);
    if (fstat(g->fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(g->err, sizeof g->err, "'%s' %s", path,
                 S_ISDIR(st.st_mode) ? "is a directory" : "is not a regular file");
        close(g->fd);
        g->fd = -1;
        return -1;
    }
    size_t size = (size_t)st.st_size;
    if (size == 0) {
        snprintf(g->err, sizeof g->err, "'%s' is empty", path);
        close(g->fd);
        g->fd = -1;
        return -1;
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, g->fd, 0);
    if (map == MAP_FAILED) {
        snprintf(g->err, sizeof g->err, "cannot map '%s': %s", path, strerror(errno));
        close(g->fd);
        g->fd = -1;
        return -1;
    }
    g->base = (const uint8_t *)map;
    g->size = size;
    mapped_add(map, size, path); // a SIGBUS in it names the file (section 1)
    if (gguf_parse(g, (const uint8_t *)map, size) != 0) {
        char err[sizeof g->err];
        memcpy(err, g->err, sizeof err);
        gguf_close(g);
        snprintf(g->err, sizeof g->err, "%.200s: %.300s", path, err);
        return -1;
    }
    return 0;
}

// --- typed metadata access. Types are checked strictly, as llama.cpp does: a u32 key stored as
// i32 is an error that names the key and both types. ---

// The entry of a metadata key, or NULL.
static const GGUFKV *gguf_find(const GGUF *g, const char *key) {
    for (int64_t i = 0; i < g->n_kv; i++)
        if (strcmp(g->kv[i].key, key) == 0) return &g->kv[i];
    return NULL;
}

// The entry of a key that must have the given type when present (NULL when absent).
static const GGUFKV *gguf_need(const GGUF *g, const char *key, int type) {
    const GGUFKV *kv = gguf_find(g, key);
    if (!kv) return NULL;
    if (kv->type != type)
        die("metadata key '%s' has the wrong type: expected %s, found %s", key,
            GGUF_TYPE_NAME[type], GGUF_TYPE_NAME[kv->type]);
    return kv;
}

// Scalar values: def when the key is absent and not required; a missing required key is fatal.
static uint32_t gguf_u32(const GGUF *g, const char *key, int required, uint32_t def) {
    const GGUFKV *kv = gguf_need(g, key, GGUF_TYPE_U32);
    if (!kv) {
        if (required) die("required metadata key '%s' is missing", key);
        return def;
    }
    uint32_t v;
    memcpy(&v, kv->data, 4);
    return v;
}

static float gguf_f32(const GGUF *g, const char *key, int required, float def) {
    const GGUFKV *kv = gguf_need(g, key, GGUF_TYPE_F32);
    if (!kv) {
        if (required) die("required metadata key '%s' is missing", key);
        return def;
    }
    float v;
    memcpy(&v, kv->data, 4);
    return v;
}

static int gguf_bool(const GGUF *g, const char *key, int def) {
    const GGUFKV *kv = gguf_need(g, key, GGUF_TYPE_BOOL);
    return kv ? kv->data[0] != 0 : def;
}

// A string value copied into buf (truncated to fit); returns NULL when the key is absent.
static const char *gguf_str(const GGUF *g, const char *key, char *buf, size_t cap) {
    const GGUFKV *kv = gguf_need(g, key, GGUF_TYPE_STRING);
    if (!kv) return NULL;
    size_t n = kv->n < cap - 1 ? (size_t)kv->n : cap - 1;
    memcpy(buf, kv->data, n);
    buf[n] = 0;
    return buf;
}

// Read an integer-valued key that may be stored as a u32/i32 scalar or as an array of them (one
// value per layer, e.g. feed_forward_length). Fills out[0..n); a scalar is repeated. An array holds
// n entries, or n_all when it also covers blocks that are not run (qwen35's multi-token-prediction
// blocks after the trunk; the first n are used). Returns 0 when the key is absent.
static int gguf_int_or_arr(const GGUF *g, const char *key, int32_t *out, int n, int n_all) {
    const GGUFKV *kv = gguf_find(g, key);
    if (!kv) return 0;
    if (kv->type == GGUF_TYPE_U32 || kv->type == GGUF_TYPE_I32) {
        int32_t v;
        memcpy(&v, kv->data, 4);
        for (int i = 0; i < n; i++) out[i] = v;
        return 1;
    }
    if (kv->type == GGUF_TYPE_ARRAY &&
        (kv->arr_type == GGUF_TYPE_U32 || kv->arr_type == GGUF_TYPE_I32)) {
        if (kv->n != (uint64_t)n && kv->n != (uint64_t)n_all)
            die("metadata key '%s' has %llu entries, expected %d (or %d)", key,
                (unsigned long long)kv->n, n, n_all);
        memcpy(out, kv->data, (size_t)n * 4); // the first n: the layers that run
        return 1;
    }
    die("metadata key '%s' has the wrong type: expected u32/i32 or an array of them, found %s%s%s",
        key, GGUF_TYPE_NAME[kv->type], kv->type == GGUF_TYPE_ARRAY ? " of " : "",
        kv->type == GGUF_TYPE_ARRAY ? GGUF_TYPE_NAME[kv->arr_type] : "");
    return 0;
}

// Walk a string array: call it with *p = kv->data first; each call returns one element.
static const char *gguf_next_str(const uint8_t **p, uint64_t *len) {
    uint64_t n;
    memcpy(&n, *p, 8); // bounds were checked when the file was parsed
    const char *s = (const char *)(*p + 8);
    *p += 8 + n;
    *len = n;
    return s;
}

// A tensor's info by its GGUF name, or NULL.
static const GGUFTensor *gguf_tensor(const GGUF *g, const char *name) {
    for (int64_t i = 0; i < g->n_tensors; i++)
        if (strcmp(g->tensors[i].name, name) == 0) return &g->tensors[i];
    return NULL;
}

// ------------------------------------------------------------------------------------------------
// 3. Tensor types: block layouts and their dequantizer
// ------------------------------------------------------------------------------------------------
// A quantized row is a sequence of blocks; each block stores `blck` weights in `type_size` bytes.
// dequant_unit below is the readable definition of each format: every GPU mat-vec and product
// computes exactly its values, and the tests check that they do. Scales (d, dmin, m) are IEEE
// fp16, stored as raw bits.

enum {
    GGML_TYPE_F32 = 0, GGML_TYPE_F16 = 1, GGML_TYPE_Q4_0 = 2, GGML_TYPE_Q4_1 = 3,
    GGML_TYPE_Q5_0 = 6, GGML_TYPE_Q5_1 = 7, GGML_TYPE_Q8_0 = 8, GGML_TYPE_Q4_K = 12,
    GGML_TYPE_Q5_K = 13, GGML_TYPE_Q6_K = 14, GGML_TYPE_IQ4_NL = 20, GGML_TYPE_IQ4_XS = 23,
    GGML_TYPE_BF16 = 30,
};

// The types this engine computes with. Any other type is named with its tensor and refused.
static int type_supported(int t) {
    switch (t) {
    case GGML_TYPE_F32: case GGML_TYPE_F16: case GGML_TYPE_BF16: case GGML_TYPE_Q4_0:
    case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_0: case GGML_TYPE_Q5_1: case GGML_TYPE_Q8_0:
    case GGML_TYPE_IQ4_NL: case GGML_TYPE_IQ4_XS: case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K:
    case GGML_TYPE_Q6_K: return 1;
    default: return 0;
    }
}

// F32, F16 and BF16: the float types, whose mat-vecs keep fp32 inputs (6.1, 6.4c); in the
// prompt's batched products F32 does too (section 8's header: its weights have more precision than
// fp16's, and may lie past its range).
static int is_float_weight(int type) {
    return type == GGML_TYPE_F32 || type == GGML_TYPE_F16 || type == GGML_TYPE_BF16;
}

// Bytes of one row of n elements.
static size_t row_bytes(int type, int64_t n) {
    return (size_t)(n / TYPE_TRAITS[type].blck) * TYPE_TRAITS[type].type_size;
}

// Q4_0: 32 weights, one scale.   | d (f16) | qs[16]: low nibbles = w[0..15], high = w[16..31] |
//   w[j] = d * (q[j] - 8)
typedef struct { uint16_t d; uint8_t qs[16]; } block_q4_0;
// Q4_1: as Q4_0 with a minimum instead of the fixed -8.   | d | m | qs[16] |     w[j] = d*q[j] + m
typedef struct { uint16_t d, m; uint8_t qs[16]; } block_q4_1;
// Q5_0: 4 low bits in qs as Q4_0, the 5th bit of w[j] is bit j of the 32-bit qh.
//   | d | qh[4] | qs[16] |      w[j] = d * (q5[j] - 16)
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; } block_q5_0;
// Q5_1: | d | m | qh[4] | qs[16] |      w[j] = d * q5[j] + m
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; } block_q5_1;
// Q8_0: | d | qs[32] int8 |             w[j] = d * qs[j]
typedef struct { uint16_t d; int8_t qs[32]; } block_q8_0;
// IQ4_NL: as Q4_0, but the nibble indexes a fixed non-linear table.   w[j] = d * kvalues[q[j]]
typedef struct { uint16_t d; uint8_t qs[16]; } block_iq4_nl;
// IQ4_XS: 256 weights = 8 sub-blocks of 32, each with a 6-bit scale split into 4 low bits
// (scales_l, two per byte) and 2 high bits (scales_h, two per sub-block).
//   | d | scales_h (u16) | scales_l[4] | qs[128]: sub-block ib uses qs[16ib..] as in IQ4_NL |
//   w[32ib + j] = d * (ls(ib) - 32) * kvalues[q]
typedef struct {
    uint16_t d, scales_h;
    uint8_t scales_l[4], qs[128];
} block_iq4_xs;
// ls(ib), the 6-bit scale of sub-block ib (0..7)
__host__ __device__ static inline int iq4_xs_ls(const block_iq4_xs *b, int ib) {
    return ((b->scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf) | (((b->scales_h >> (2 * ib)) & 3) << 4);
}
// Q4_K: 256 weights = 8 sub-blocks of 32, each with a 6-bit scale and a 6-bit min packed in
// scales[12] (see k_scale_min), super-block scales d and dmin.
//   | d | dmin | scales[12] | qs[128]: bytes 32c..32c+31 hold sub-block 2c (low) and 2c+1 (high) |
//   w = d*sc*q - dmin*m
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; } block_q4_K;
// Q5_K: Q4_K plus a 5th bit: bit `sub` of qh[l] belongs to element l of sub-block `sub`.
//   | d | dmin | scales[12] | qh[32] | qs[128] |
typedef struct {
    uint16_t d, dmin;
    uint8_t scales[12], qh[32], qs[128];
} block_q5_K;
// Q6_K: 256 weights = 16 groups of 16 with int8 scales; 4 low bits in ql, 2 high bits in qh.
//   | ql[128] | qh[64] | scales[16] int8 | d |        (d is last)       w = d * sc * (q6 - 32)
typedef struct { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; } block_q6_K;

static_assert(sizeof(block_q4_0) == 18, "block_q4_0");
static_assert(sizeof(block_q4_1) == 20, "block_q4_1");
static_assert(sizeof(block_q5_0) == 22, "block_q5_0");
static_assert(sizeof(block_q5_1) == 24, "block_q5_1");
static_assert(sizeof(block_q8_0) == 34, "block_q8_0");
static_assert(sizeof(block_iq4_nl) == 18, "block_iq4_nl");
static_assert(sizeof(block_iq4_xs) == 136, "block_iq4_xs");
static_assert(sizeof(block_q4_K) == 144, "block_q4_K");
static_assert(sizeof(block_q5_K) == 176, "block_q5_K");
static_assert(sizeof(block_q6_K) == 210, "block_q6_K");

// The 16 values a 4-bit IQ4 index stands for (non-linear: denser near zero).
static const int8_t KVALUES_IQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                         1,    13,   25,  38,  53,  69,  89,  113};
__device__ const int8_t D_KVALUES_IQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                               1,    13,   25,  38,  53,  69,  89,  113};
__host__ __device__ static inline int iq4nl_value(int i) {
#ifdef __CUDA_ARCH__
    return D_KVALUES_IQ4NL[i];
#else
    return KVALUES_IQ4NL[i];
#endif
}

// K-quants pack eight 6-bit (scale, min) pairs into 12 bytes:
//   sub-blocks 0..3: scale = s[j] & 63,                     min = s[j+4] & 63
//   sub-blocks 4..7: scale = low 4 of s[j+4] | top 2 of s[j-4] << 4,
//                    min   = high 4 of s[j+4] | top 2 of s[j] << 4
__host__ __device__ static void k_scale_min(int j, const uint8_t *s, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// w[0..31] = elements 32u .. 32u+31 of a row: unit u. Every format splits into such units (a
// 32-weight block is one, a 256-weight super-block eight), and this function is the definition of
// each: the CPU forward pass (dequant_row) and the prefill's twin of its weights (mm_weight_row)
// run it, and so can the simple GPU mat-vec (matvec_generic_kernel, which the engine sends float
// types only); the fast kernels of section 6 are tested against it. Float types give 0 past n_in.
// f16_scales: IQ4_XS and Q6_K round the unit's scale to fp16 first, as the prefill's tensor-core
// decode does (see mm_weight_row).
__host__ __device__ __forceinline__ void dequant_unit(int type, const uint8_t *row, int u, float *w,
                                                      int n_in, int f16_scales) {
    switch (type) {
    case GGML_TYPE_F32:
        for (int j = 0; j < 32; j++)
            w[j] = 32 * u + j < n_in ? ((const float *)row)[32 * u + j] : 0;
        break;
    case GGML_TYPE_F16: case GGML_TYPE_BF16:
        for (int j = 0; j < 32; j++) {
            uint16_t v = 32 * u + j < n_in ? ((const uint16_t *)row)[32 * u + j] : 0;
            w[j] = type == GGML_TYPE_F16 ? fp16_to_f32(v) : bf16_to_f32(v);
        }
        break;
    case GGML_TYPE_Q4_0: { // w = d * (q - 8)
        const block_q4_0 *b = (const block_q4_0 *)row + u;
        float d = fp16_to_f32(b->d);
        for (int j = 0; j < 16; j++) {
            w[j] = d * ((b->qs[j] & 0xf) - 8);
            w[j + 16] = d * ((b->qs[j] >> 4) - 8);
        }
        break;
    }
    case GGML_TYPE_Q4_1: { // w = d * q + m
        const block_q4_1 *b = (const block_q4_1 *)row + u;
        float d = fp16_to_f32(b->d), m = fp16_to_f32(b->m);
        for (int j = 0; j < 16; j++) {
            w[j] = d * (b->qs[j] & 0xf) + m;
            w[j + 16] = d * (b->qs[j] >> 4) + m;
        }
        break;
    }
    case GGML_TYPE_Q5_0: case GGML_TYPE_Q5_1: { // w = d * (q5 - 16), or d * q5 + m
        int has_m = type == GGML_TYPE_Q5_1;
        const block_q5_0 *b0 = (const block_q5_0 *)row + u;
        const block_q5_1 *b1 = (const block_q5_1 *)row + u;
        const uint8_t *qh = has_m ? b1->qh : b0->qh, *qs = has_m ? b1->qs : b0->qs;
        uint32_t h = qh[0] | qh[1] << 8 | qh[2] << 16 | (uint32_t)qh[3] << 24; // bit j: element j
        float d = fp16_to_f32(has_m ? b1->d : b0->d), m = has_m ? fp16_to_f32(b1->m) : 0.0f;
        for (int j = 0; j < 32; j++) {
            int q5 = ((qs[j % 16] >> 4 * (j / 16)) & 0xf) | ((h >> j) & 1) << 4;
            w[j] = has_m ? d * q5 + m : d * (q5 - 16);
        }
        break;
    }
    case GGML_TYPE_Q8_0: { // w = d * q
        const block_q8_0 *b = (const block_q8_0 *)row + u;
        float d = fp16_to_f32(b->d);
        for (int j = 0; j < 32; j++) w[j] = d * b->qs[j];
        break;
    }
    case GGML_TYPE_IQ4_NL: { // w = d * kvalues[q]
        const block_iq4_nl *b = (const block_iq4_nl *)row + u;
        float d = fp16_to_f32(b->d);
        for (int j = 0; j < 16; j++) {
            w[j] = d * iq4nl_value(b->qs[j] & 0xf);
            w[j + 16] = d * iq4nl_value(b->qs[j] >> 4);
        }
        break;
    }
    case GGML_TYPE_IQ4_XS: { // sub-block ib = u % 8: w = d * (ls - 32) * kvalues[q]
        const block_iq4_xs *b = (const block_iq4_xs *)row + u / 8;
        int ib = u % 8;
        float dl = fp16_to_f32(b->d) * (iq4_xs_ls(b, ib) - 32);
        if (f16_scales) dl = f16r(dl);
        const uint8_t *q = b->qs + 16 * ib;
        for (int j = 0; j < 16; j++) {
            w[j] = dl * iq4nl_value(q[j] & 0xf);
            w[j + 16] = dl * iq4nl_value(q[j] >> 4);
        }
        break;
    }
    case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: { // w = d * sc * q - dmin * m  (q: 4 or 5 bits)
        // sub-block sub: low nibbles of qs[32 (sub/2) ..] when even, high when odd; Q5_K's 5th
        // bit of element l is bit sub of qh[l]
        int five = type == GGML_TYPE_Q5_K, sub = u % 8, shift = 4 * (sub % 2);
        const block_q4_K *b4 = (const block_q4_K *)row + u / 8;
        const block_q5_K *b5 = (const block_q5_K *)row + u / 8;
        const uint8_t *q = (five ? b5->qs : b4->qs) + 32 * (sub / 2);
        int sc, m;
        k_scale_min(sub, five ? b5->scales : b4->scales, &sc, &m);
        float d = fp16_to_f32(five ? b5->d : b4->d) * sc,
              dm = fp16_to_f32(five ? b5->dmin : b4->dmin) * m;
        for (int l = 0; l < 32; l++)
            w[l] = d * (((q[l] >> shift) & 0xf) + (five ? 16 * ((b5->qh[l] >> sub) & 1) : 0)) - dm;
        break;
    }
    case GGML_TYPE_Q6_K: { // w = d * sc * (q6 - 32), an int8 scale per 16 weights
        // unit `sub` of a super-block: half n = sub / 4 (128 weights), quarter j = sub % 4 picks
        // the low or high nibbles of ql or ql + 32, and bits 2j, 2j+1 of qh
        const block_q6_K *b = (const block_q6_K *)row + u / 8;
        int sub = u % 8, n = sub / 4, j = sub % 4;
        const uint8_t *ql = b->ql + 64 * n + 32 * (j % 2), *qh = b->qh + 32 * n;
        const int8_t *sc = b->scales + 8 * n + 2 * j;
        float d = fp16_to_f32(b->d);
        for (int l = 0; l < 32; l++) {
            float s = f16_scales ? f16r(d * sc[l / 16]) : d * sc[l / 16];
            w[l] = s * ((((ql[l] >> 4 * (j / 2)) & 0xf) | (((qh[l] >> 2 * j) & 3) << 4)) - 32);
        }
        break;
    }
    }
}

// Dequantize n consecutive elements of any supported type (n a multiple of its block size).
static void dequant_row(int type, const void *src, float *y, int64_t n) {
    const uint8_t *p = (const uint8_t *)src;
    if (!type_supported(type)) die("dequant_row: unsupported type %s", type_name(type));
    if (TYPE_TRAITS[type].blck == 1) { // float rows: any length
        for (int64_t i = 0; i < n; i++)
            y[i] = type == GGML_TYPE_F32   ? ((const float *)src)[i]
                   : type == GGML_TYPE_F16 ? fp16_to_f32(((const uint16_t *)src)[i])
                                           : bf16_to_f32(((const uint16_t *)src)[i]);
        return;
    }
    for (int64_t u = 0; u < n / 32; u++) dequant_unit(type, p, (int)u, y + 32 * u, (int)n, 0);
}

// ------------------------------------------------------------------------------------------------
// 4. Config and weights
// ------------------------------------------------------------------------------------------------
// Everything about the model's shape comes from the GGUF metadata; nothing is compiled in. Weights
// are looked up by their GGUF name (kept verbatim in the strings below, so a reader can grep a
// tensor from file to code) and checked against the shape the config implies.

typedef enum { ARCH_QWEN2, ARCH_QWEN3, ARCH_QWEN35 } Arch;

// The layer loop dispatches on the kind of each layer: qwen2/qwen3 have only attention layers;
// qwen35 interleaves Gated DeltaNet (linear attention with a recurrent state) and attention.
typedef enum { LAYER_ATTENTION, LAYER_DELTANET } LayerKind;

#define MAX_LAYERS 256
#define MAX_VOCAB (1 << 24) // tokens (and merges) at most: ids, ranks, logit sizes are 32-bit ints

typedef struct {
    Arch arch;
    char arch_name[64];    // "qwen2" | "qwen3" | "qwen35": the prefix of the metadata keys
    int n_embd;            // width of the residual stream
    int n_ff;              // FFN hidden width
    int n_layer;           // layers run in the main pass
    int n_head, n_head_kv; // query heads, key/value heads (GQA: n_head % n_head_kv == 0)
    int head_dim;          // width of a q or k head (key_length); n_head*head_dim may be != n_embd
    int n_rot;             // RoPE is applied to the first n_rot dims of each head (NEOX pairing)
    int n_vocab;
    int n_ctx_train;
    float eps;             // every RMSNorm (and the L2 norm of qwen35)
    float rope_base;       // theta_i = pos * freq_scale * rope_base^(-2i/n_rot)
    float rope_freq_scale;
    LayerKind kind[MAX_LAYERS];
    int kv_slot[MAX_LAYERS];  // attention layer -> its index in the KV cache (-1 for others)
    int n_kv_layers;          // layers that hold a KV cache
    // qwen35 Gated DeltaNet (linear attention) layers
    int gdn_slot[MAX_LAYERS]; // DeltaNet layer -> its index in the recurrent state (-1 for others)
    int n_gdn_layers;
    int ssm_conv;             // causal conv taps (4)
    int ssm_state;            // S: head dim of the DeltaNet q/k/v heads (128); state per head S x S
    int ssm_k_heads;          // Hk: q/k heads
    int ssm_v_heads;          // Hv: v heads (a multiple of Hk)
    int ssm_inner;            // Hv * S
} Config;

// Where the fast mat-vecs' units of a tensor lie in its device copy (the planes' step order, 6.7):
// upw = 0 row by row; else the units in the order of the streaming launch that reads them, whose
// runs are upw units long and in whose stream the tensor's units are [first, first + units).
typedef struct {
    int upw, first, units;
} StepOrder;

// A tensor as the engine sees it: a 2-D weight of n_out rows by n_in elements (1-D vectors have
// n_out = 1), its bytes in the mapped file and, once uploaded, on the device.
typedef struct {
    const char *name;      // GGUF name, NULL when the (optional) tensor is absent
    int type;              // ggml type id
    int64_t n_in, n_out;   // ne[0], ne[1]
    const uint8_t *host;   // (n_out, row_bytes(type, n_in)) in the mapped file
    size_t nbytes;
    void *dev;             // device copy: the file's rows, or the planes (6.3); NULL: not uploaded
    int planes;            // 1: the device copy is in the plane layout of the fast mat-vecs (6.3)
    StepOrder so;          // planes only: the order of their units (6.7; so.upw = 0: row by row)
} Tensor;

typedef struct {
    Tensor attn_norm;          // (n_embd) f32
    // attention layers
    Tensor wq;                 // (n_head*head_dim, n_embd); qwen35: per head [q | gate], 2*head_dim
    Tensor wk, wv;             // (n_head_kv*head_dim, n_embd)
    Tensor bq, bk, bv;         // (n_head*head_dim), (n_head_kv*head_dim) f32, qwen2 only (optional)
    Tensor q_norm, k_norm;     // (head_dim) f32, qwen3/qwen35: RMSNorm of each q/k head before RoPE
    Tensor wo;                 // (n_embd, n_head*head_dim)
    // Gated DeltaNet layers (qwen35), S = ssm_state, conv_dim = 2*Hk*S + Hv*S
    Tensor wqkv;               // (conv_dim, n_embd) "attn_qkv": rows [q Hk*S | k Hk*S | v Hv*S]
    Tensor wz;                 // (Hv*S, n_embd) "attn_gate": z, the output gate
    Tensor conv1d;             // (conv_dim, 4) f32: w[c*4 + i], i = 0 oldest tap
    Tensor dt_bias;            // (Hv) f32 "ssm_dt.bias"
    Tensor ssm_a;              // (Hv) f32, -exp(A_log)
    Tensor w_beta, w_alpha;    // (Hv, n_embd)
    Tensor ssm_norm;           // (S) f32, shared by all heads, used as is
    Tensor ssm_out;            // (n_embd, Hv*S)
    // FFN
    Tensor ffn_norm;           // (n_embd) f32; qwen35 "post_attention_norm"
    Tensor w_gate, w_up;       // (n_ff, n_embd)
    Tensor w_down;             // (n_embd, n_ff)
} LayerWeights;

typedef struct {
    Tensor token_embd;         // (n_vocab, n_embd); rows are gathered on the host (section 9)
    Tensor output_norm;        // (n_embd) f32
    Tensor output;             // (n_vocab, n_embd); token_embd again when the output is tied
    Tensor output_bias;        // (n_vocab) f32, optional (qwen2)
    LayerWeights layers[MAX_LAYERS];
} Weights;

typedef struct {
    GGUF gguf;
    Config c;
    Weights w;
} Model;

// An integer key that may be stored per layer (gguf_int_or_arr) but that this engine needs to be
// the same for every layer it runs. def when the key is absent and not required.
static int uniform_per_layer(const GGUF *g, const char *key, int n_layer, int n_all, int required,
                             int def) {
    int32_t v[MAX_LAYERS];
    if (!gguf_int_or_arr(g, key, v, n_layer, n_all)) {
        if (required) die("required metadata key '%s' is missing", key);
        return def;
    }
    for (int i = 1; i < n_layer; i++)
        if (v[i] != v[0]) die("%s varies across layers: not supported", key);
    return v[0];
}

// The metadata keys of an architecture are prefixed by its name: KEY("context_length") is
// "qwen3.context_length" for a qwen3 file (written into the caller's key[]).
#define KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, c->arch_name), key)

// qwen35 only: the layers are Gated DeltaNet except every full_attention_interval-th (3, 7, 11, ...
// with the default 4), unless attention.recurrent_layers lists them (recurrent[i] = 1: layer i is
// DeltaNet); and the DeltaNet's shapes.
static void config_qwen35(Config *c, const GGUF *g, int n_layer_all, int32_t *recurrent) {
    char key[160];
    const char *arch = c->arch_name;
    int n_layer = c->n_layer;
    // MRoPE sections: required by the format; for text every section rotates with the same
    // position, which is plain NEOX RoPE on the first n_rot dims
    const GGUFKV *sec = gguf_find(g, KEY("rope.dimension_sections"));
    if (!sec) die("required metadata key '%s' is missing", key);
    if (sec->type == GGUF_TYPE_ARRAY && sec->n != 4)
        die("%s has %llu entries, expected 4", key, (unsigned long long)sec->n);
    int interval = (int)gguf_u32(g, KEY("full_attention_interval"), 0, 4);
    if (interval < 1) die("%s = %d: must be at least 1", key, interval);
    int32_t all[MAX_LAYERS];
    if (gguf_int_or_arr(g, KEY("attention.recurrent_layers"), all, n_layer_all, n_layer_all)) {
        for (int i = 0; i < n_layer; i++) recurrent[i] = all[i] != 0;
    } else {
        for (int i = 0; i < n_layer; i++) recurrent[i] = (i + 1) % interval != 0;
    }
    c->ssm_conv = (int)gguf_u32(g, KEY("ssm.conv_kernel"), 1, 0);
    c->ssm_inner = (int)gguf_u32(g, KEY("ssm.inner_size"), 1, 0);
    c->ssm_state = (int)gguf_u32(g, KEY("ssm.state_size"), 1, 0);
    c->ssm_v_heads = (int)gguf_u32(g, KEY("ssm.time_step_rank"), 1, 0);
    c->ssm_k_heads = (int)gguf_u32(g, KEY("ssm.group_count"), 1, 0);
    if (c->ssm_conv != 4)
        die("%s.ssm.conv_kernel = %d: only 4 is supported", arch, c->ssm_conv);
    if (c->ssm_state <= 0 || c->ssm_state > 256 || c->ssm_state % 32)
        die("%s.ssm.state_size = %d: must be a multiple of 32, at most 256", arch,
            c->ssm_state);
    if (c->ssm_k_heads <= 0 || c->ssm_v_heads <= 0 || c->ssm_v_heads > 4096 ||
        c->ssm_v_heads % c->ssm_k_heads)
        die("%s.ssm: %d value heads must be a multiple of %d key heads, at most 4096", arch,
            c->ssm_v_heads, c->ssm_k_heads);
    if ((int64_t)c->ssm_inner != (int64_t)c->ssm_state * c->ssm_v_heads)
        die("%s.ssm.inner_size = %d, expected state_size x time_step_rank = %lld", arch,
            c->ssm_inner, (long long)c->ssm_state * c->ssm_v_heads);
}

// Every hyper-parameter from the metadata, each checked against the bounds the engine relies on;
// the keys are prefixed by the architecture's name (qwen2., qwen3., qwen35.).
static void config_from_gguf(Config *c, const GGUF *g) {
    char arch[64], key[160], buf[64];
    if (!gguf_str(g, "general.architecture", arch, sizeof arch))
        die("required metadata key 'general.architecture' is missing");
    if (strcmp(arch, "qwen2") == 0) c->arch = ARCH_QWEN2;
    else if (strcmp(arch, "qwen3") == 0) c->arch = ARCH_QWEN3;
    else if (strcmp(arch, "qwen35") == 0) c->arch = ARCH_QWEN35;
    else die("architecture '%s' is not supported (qwen.cu runs qwen2, qwen3 and qwen35)", arch);
    snprintf(c->arch_name, sizeof c->arch_name, "%s", arch);

    c->n_ctx_train = (int)gguf_u32(g, KEY("context_length"), 1, 0);
    c->n_embd = (int)gguf_u32(g, KEY("embedding_length"), 1, 0);
    int n_layer_all = (int)gguf_u32(g, KEY("block_count"), 1, 0);
    if (n_layer_all < 1 || n_layer_all > MAX_LAYERS)
        die("%s = %d: must be 1..%d", key, n_layer_all, MAX_LAYERS);
    // a tensor of a layer past block_count would be left unused: the file is not what its
    // metadata says (a cut-down or mislabelled model), and running it would look like success
    for (int64_t i = 0; i < g->n_tensors; i++) {
        const char *nm = g->tensors[i].name;
        char *end;
        if (strncmp(nm, "blk.", 4) || !isdigit((unsigned char)nm[4])) continue;
        long b = strtol(nm + 4, &end, 10); // "blk.N.": N digits only, then a '.'
        if (*end == '.' && b >= n_layer_all)
            die("tensor '%s' is of layer %ld, but %s = %d: the file's tensors and its metadata "
                "disagree", nm, b, key, n_layer_all);
    }
    // qwen35 may append multi-token-prediction blocks after the trunk; they are not run
    uint32_t n_nextn = c->arch == ARCH_QWEN35 ? gguf_u32(g, KEY("nextn_predict_layers"), 0, 0) : 0;
    if (n_nextn >= (uint32_t)n_layer_all)
        die("%s.nextn_predict_layers = %u leaves no layers out of %d", arch, n_nextn, n_layer_all);
    int n_layer = n_layer_all - (int)n_nextn;
    c->n_layer = n_layer;

    c->n_ff = uniform_per_layer(g, KEY("feed_forward_length"), n_layer, n_layer_all, 1, 0);
    c->n_head = uniform_per_layer(g, KEY("attention.head_count"), n_layer, n_layer_all, 1, 0);
    c->n_head_kv =
        uniform_per_layer(g, KEY("attention.head_count_kv"), n_layer, n_layer_all, 0, c->n_head);
    if (c->n_embd <= 0 || c->n_ff <= 0 || c->n_head <= 0 || c->n_head_kv <= 0 ||
        c->n_ctx_train <= 0)
        die("model dimensions must be positive (embedding %d, ffn %d, heads %d/%d, context %d)",
            c->n_embd, c->n_ff, c->n_head, c->n_head_kv, c->n_ctx_train);
    if (c->n_head % c->n_head_kv != 0)
        die("attention.head_count %d is not a multiple of head_count_kv %d", c->n_head,
            c->n_head_kv);
    // Bounds far above any Qwen model (the largest: embedding 8192, ffn 29568, 64 heads of 128)
    // that keep every size computed from them inside 32-bit ints, whether or not a tensor's shape
    // checks them later (a qwen35 file without attention layers has no tensor sized by the heads).
    if (c->n_embd > (1 << 20) || c->n_ff > (1 << 20) || c->n_head > 4096)
        die("model dimensions out of range (embedding %d, ffn %d, heads %d): at most 2^20, 2^20 "
            "and 4096", c->n_embd, c->n_ff, c->n_head);

    c->head_dim =
        (int)gguf_u32(g, KEY("attention.key_length"), 0, (uint32_t)(c->n_embd / c->n_head));
    int head_dim_v =
        (int)gguf_u32(g, KEY("attention.value_length"), 0, (uint32_t)(c->n_embd / c->n_head));
    if (head_dim_v != c->head_dim)
        die("key_length %d != value_length %d: not supported", c->head_dim, head_dim_v);
    if (c->head_dim <= 0 || c->head_dim > 512 || c->head_dim % 2)
        die("attention.key_length = %d: must be even and at most 512", c->head_dim);
    if (c->n_head * c->head_dim > (1 << 20))
        die("%d heads of %d: more than 2^20 query values", c->n_head, c->head_dim);
    c->n_rot = (int)gguf_u32(g, KEY("rope.dimension_count"), 0, (uint32_t)c->head_dim);
    if (c->arch != ARCH_QWEN35 && c->n_rot != c->head_dim)
        die("%s.rope.dimension_count = %d, but %s rotates the whole head (%d)", arch, c->n_rot,
            arch, c->head_dim);
    if (c->n_rot <= 0 || c->n_rot > c->head_dim || c->n_rot % 2)
        die("%s.rope.dimension_count = %d: must be even and at most the head dim %d", arch,
            c->n_rot, c->head_dim);
    // every float hyper-parameter finite and in range (a base of 0 or infinity would turn every
    // angle into NaN, and the weights would be blamed for the logits)
    c->rope_base = gguf_f32(g, KEY("rope.freq_base"), 0, 10000.0f);
    if (!(c->rope_base > 0.0f && isfinite(c->rope_base)))
        die("metadata key '%s' = %g: must be a positive finite number", key, c->rope_base);
    c->rope_freq_scale = 1.0f;
    if (gguf_str(g, KEY("rope.scaling.type"), buf, sizeof buf) && strcmp(buf, "none") != 0 &&
        strcmp(buf, "linear") != 0)
        die("RoPE scaling type '%s' is not supported (only none and linear)", buf);
    float factor = gguf_f32(g, KEY("rope.scaling.factor"), 0, 0.0f);
    if (factor == 0.0f) factor = gguf_f32(g, KEY("rope.scale_linear"), 0, 0.0f);
    if (!(factor >= 0.0f && factor <= 1e6f)) // 0: no scaling
        die("metadata key '%s' = %g: a RoPE scaling factor must be in [0, 1e6]", key, factor);
    if (factor > 0.0f) c->rope_freq_scale = 1.0f / factor;
    c->eps = gguf_f32(g, KEY("attention.layer_norm_rms_epsilon"), 1, 0.0f);
    if (!(c->eps > 0.0f && c->eps < 1.0f))
        die("metadata key '%s' = %g: must be in (0, 1)", key, c->eps);

    // Layer kinds. qwen2/qwen3: all attention; qwen35: see config_qwen35.
    int32_t recurrent[MAX_LAYERS];
    memset(recurrent, 0, sizeof recurrent);
    if (c->arch == ARCH_QWEN35) config_qwen35(c, g, n_layer_all, recurrent);
    c->n_kv_layers = c->n_gdn_layers = 0;
    for (int i = 0; i < n_layer; i++) {
        c->kind[i] = recurrent[i] ? LAYER_DELTANET : LAYER_ATTENTION;
        c->kv_slot[i] = recurrent[i] ? -1 : c->n_kv_layers++;
        c->gdn_slot[i] = recurrent[i] ? c->n_gdn_layers++ : -1;
    }
#undef KEY
}

// Look a tensor up by name and check it against the expected {n_in, n_out} (n_out = 1: a vector).
// A missing required tensor, a wrong shape or an unsupported type is an error naming the tensor.
static Tensor find_tensor(const GGUF *g, const char *name, int64_t n_in, int64_t n_out,
                          int required) {
    Tensor t;
    memset(&t, 0, sizeof t);
    const GGUFTensor *gt = gguf_tensor(g, name);
    if (!gt) {
        if (required) die("required tensor '%s' is missing from the file", name);
        return t;
    }
    if (gt->ne[0] != n_in || gt->ne[1] != n_out || gt->ne[2] != 1 || gt->ne[3] != 1)
        die("tensor '%s' has the wrong shape: expected {%lld, %lld}, "
            "found {%lld, %lld, %lld, %lld}", name, (long long)n_in, (long long)n_out,
            (long long)gt->ne[0], (long long)gt->ne[1], (long long)gt->ne[2], (long long)gt->ne[3]);
    if (!type_supported(gt->type))
        die("tensor '%s' has type %s, which qwen.cu does not support (supported: F32 F16 BF16 "
            "Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 IQ4_NL IQ4_XS Q4_K Q5_K Q6_K)", name, type_name(gt->type));
    t.name = gt->name;
    t.type = gt->type;
    t.n_in = n_in;
    t.n_out = n_out;
    t.host = gt->data;
    t.nbytes = gt->nbytes;
    return t;
}

// Norm weights and biases are added to fp32 activations as they are: they must be F32 (llama.cpp's
// converter always writes them so).
static Tensor find_vector(const GGUF *g, const char *name, int64_t n, int required) {
    Tensor t = find_tensor(g, name, n, 1, required);
    if (t.name && t.type != GGML_TYPE_F32)
        die("tensor '%s' has type %s; norm weights and biases must be F32", name,
            type_name(t.type));
    return t;
}

// Every weight of the model by its GGUF name, each with the shape the config implies.
//
// The weights are as llama.cpp's converter (convert_hf_to_gguf.py) writes them, and the engine
// relies on its conventions; a reader who knows transformers' modeling code meets three of them
// in qwen35 (test/train/hf_to_gguf.cu does the same conversion, step by step):
//   * norms: transformers' Qwen3.5 RMSNorm is zero-centred, x * (1 + w); the file stores 1 + w,
//     so every norm here multiplies by the stored weight as it is (rmsnorm_c). The DeltaNet's
//     gated norm (linear_attn.norm, "ssm_norm") is not zero-centred and is stored unchanged.
//   * decay: transformers keeps A_log; the file stores ssm_a = -exp(A_log), the factor of the
//     gate g = softplus(alpha + dt_bias) * ssm_a (gdn_gates).
//   * value heads: transformers groups the value heads by key head (v head g*r + j, r = Hv/Hk, of
//     key head g); the file tiles them (v head j*Hk + g), so v head hv reads key head hv % Hk.
static void weights_from_gguf(Weights *w, const Config *c, const GGUF *g) {
    char name[GGUF_MAX_NAME + 32];
    int64_t E = c->n_embd, F = c->n_ff, V = 0;
    int64_t qdim = (int64_t)c->n_head * c->head_dim, kvdim = (int64_t)c->n_head_kv * c->head_dim;

    const GGUFTensor *emb = gguf_tensor(g, "token_embd.weight");
    if (!emb) die("required tensor 'token_embd.weight' is missing from the file");
    V = emb->ne[1];
    if (V > MAX_VOCAB)
        die("token_embd.weight: a vocabulary of %lld tokens, more than the %d this engine takes",
            (long long)V, MAX_VOCAB);
    w->token_embd = find_tensor(g, "token_embd.weight", E, V, 1);
    w->output_norm = find_vector(g, "output_norm.weight", E, 1);
    w->output = find_tensor(g, "output.weight", E, V, 0);
    if (!w->output.name) w->output = w->token_embd; // tied embeddings
    if (c->arch == ARCH_QWEN2) w->output_bias = find_vector(g, "output.bias", V, 0);

#define BLK(suffix) (snprintf(name, sizeof name, "blk.%d." suffix, l), name)
#define T(field, suffix, n_in, n_out, req)                                                         \
    (L->field = find_tensor(g, BLK(suffix), n_in, n_out, req))
#define VEC(field, suffix, n, req) (L->field = find_vector(g, BLK(suffix), n, req))
    int S = c->ssm_state, Hk = c->ssm_k_heads, Hv = c->ssm_v_heads;
    int64_t conv_dim = 2LL * Hk * S + (int64_t)Hv * S;
    for (int l = 0; l < c->n_layer; l++) {
        LayerWeights *L = &w->layers[l];
        VEC(attn_norm, "attn_norm.weight", E, 1);
        if (c->kind[l] == LAYER_DELTANET) {
            T(wqkv, "attn_qkv.weight", E, conv_dim, 1);
            T(wz, "attn_gate.weight", E, (int64_t)Hv * S, 1);
            T(conv1d, "ssm_conv1d.weight", c->ssm_conv, conv_dim, 1); // leaves its name in name
            if (L->conv1d.type != GGML_TYPE_F32)
                die("tensor '%s' has type %s; expected F32", name, type_name(L->conv1d.type));
            VEC(dt_bias, "ssm_dt.bias", Hv, 1);
            VEC(ssm_a, "ssm_a", Hv, 1);
            T(w_beta, "ssm_beta.weight", E, Hv, 1);
            T(w_alpha, "ssm_alpha.weight", E, Hv, 1);
            VEC(ssm_norm, "ssm_norm.weight", S, 1);
            T(ssm_out, "ssm_out.weight", (int64_t)Hv * S, E, 1);
        } else {
            T(wq, "attn_q.weight", E, c->arch == ARCH_QWEN35 ? 2 * qdim : qdim, 1);
            T(wk, "attn_k.weight", E, kvdim, 1);
            T(wv, "attn_v.weight", E, kvdim, 1);
            T(wo, "attn_output.weight", qdim, E, 1);
            if (c->arch == ARCH_QWEN2) {
                VEC(bq, "attn_q.bias", qdim, 0); // present in real qwen2 files
                VEC(bk, "attn_k.bias", kvdim, 0);
                VEC(bv, "attn_v.bias", kvdim, 0);
            } else {
                VEC(q_norm, "attn_q_norm.weight", c->head_dim, 1);
                VEC(k_norm, "attn_k_norm.weight", c->head_dim, 1);
            }
        }
        if (c->arch == ARCH_QWEN35) VEC(ffn_norm, "post_attention_norm.weight", E, 1);
        else VEC(ffn_norm, "ffn_norm.weight", E, 1);
        T(w_gate, "ffn_gate.weight", E, F, 1);
        T(w_up, "ffn_up.weight", E, F, 1);
        T(w_down, "ffn_down.weight", F, E, 1);
    }
#undef T
#undef VEC
#undef BLK
}

// Read the config and find every weight of an opened file. Exits with a message on any error.
static void model_load(Model *m) {
    config_from_gguf(&m->c, &m->gguf);
    weights_from_gguf(&m->w, &m->c, &m->gguf);
    m->c.n_vocab = (int)m->w.token_embd.n_out;
}

// One token's embedding, dequantized from the mapped file: x = token_embd[token, :].
static void embed_token(const Model *m, int token, float *x /* (n_embd) */) {
    const Tensor *t = &m->w.token_embd;
    dequant_row(t->type, t->host + (size_t)token * row_bytes(t->type, t->n_in), x, t->n_in);
}

// ------------------------------------------------------------------------------------------------
// 4b. Taps: the tensors inside the forward pass, for --dump-hidden and --diff-hidden
// ------------------------------------------------------------------------------------------------
// A port that disagrees with qwen.cu's logits is found by comparing the tensors in between. A
// run with a Tap attached hands each tensor of every prompt token to it (tap_put), under the name
// llama.cpp's graph gives it where it has one, so that its tools' names match ours. A run without
// one (every other run) passes the taps by: the GPU's graph and kernels are the same either way.

// Every tensor a tap can take, in the order a layer computes them: the block input's norm, then
// attention's (Qcur, Kcur: after the head norm and RoPE) or DeltaNet's, then the FFN's; last the
// three tensors outside the layers. A layer has attention's or DeltaNet's kinds, never both.
enum {
    TAP_ATTN_NORM, // (E) norm(x): the block's input
    TAP_QCUR,      // (H, hd) q after the head norm and RoPE
    TAP_KCUR,      // (Hkv, hd) k after the head norm and RoPE: what the KV cache holds
    TAP_VCUR,      // (Hkv, hd)
    TAP_KQV_OUT,   // (H*hd) attention's output, heads concatenated (before qwen35's gate)
    TAP_ATTN_GATED, // (H*hd) qwen35: times sigmoid(gate), the input of Wo
    TAP_ATTN_OUT,  // (E) Wo's output, added to the residual stream
    TAP_QKV_MIXED, // (conv_dim) DeltaNet: the in-projection [q | k | v], before the conv
    TAP_Z,         // (Hv, S) the output gate's projection
    TAP_BETA,      // (Hv) beta = sigmoid(b): the write strength
    TAP_GATE,      // (Hv) g = softplus(a + dt_bias) * ssm_a: the log of the decay
    TAP_CONV,      // (conv_dim) silu(conv(qkv_mixed))
    TAP_Q_CONV,    // (Hk, S) the conv output's q, L2-normed: what the delta rule reads
    TAP_K_CONV,    // (Hk, S) the same for k
    TAP_V_CONV,    // (Hv, S) the conv output's v
    TAP_DELTA_OUT, // (Hv, S) the delta rule's output o = M q / sqrt(S)
    TAP_FINAL_OUT, // (Hv*S) the gated norm of o: the input of W_out
    TAP_LINEAR_OUT, // (E) W_out's output, added to the residual stream
    TAP_FFN_INP,   // (E) the residual stream between the two blocks
    TAP_FFN_NORM,  // (E)
    TAP_FFN_OUT,   // (E) W_down's output, added to the residual stream
    TAP_L_OUT,     // (E) the residual stream after the layer
    N_LAYER_TAPS,
    TAP_INP_EMBD = N_LAYER_TAPS, // (E) the token's embedding row
    TAP_RESULT_NORM,             // (E) the final norm
    TAP_RESULT_OUTPUT,           // (n_vocab) the logits
    N_TAPS
};
static const char *const TAP_NAMES[N_TAPS] = {
    "attn_norm", "Qcur", "Kcur", "Vcur", "kqv_out", "attn_gated", "attn_out",
    "linear_attn_qkv_mixed", "z", "beta_sigmoid", "gate", "conv_output_silu", "q_conv_predelta",
    "k_conv_predelta", "v_conv", "attn_output", "final_output", "linear_attn_out", "ffn_inp",
    "ffn_norm", "ffn_out", "l_out", "inp_embd", "result_norm", "result_output"};

// The shape of one token's row of tensor `kind` (dims[0..n), n returned), or 0 when layer l has no
// such tensor (l is ignored for the three outside the layers).
static int tap_shape(const Config *c, int kind, int l, int dims[2]) {
    int E = c->n_embd, hd = c->head_dim, S = c->ssm_state, Hv = c->ssm_v_heads;
    int conv_dim = 2 * c->ssm_k_heads * S + c->ssm_inner;
    int att = kind >= TAP_QCUR && kind <= TAP_ATTN_OUT, gdn = kind >= TAP_QKV_MIXED &&
                                                              kind <= TAP_LINEAR_OUT;
    if (kind < N_LAYER_TAPS && ((att && c->kind[l] != LAYER_ATTENTION) ||
                                (gdn && c->kind[l] != LAYER_DELTANET) ||
                                (kind == TAP_ATTN_GATED && c->arch != ARCH_QWEN35)))
        return 0;
    switch (kind) {
    case TAP_QCUR: dims[0] = c->n_head; dims[1] = hd; return 2;
    case TAP_KCUR: case TAP_VCUR: dims[0] = c->n_head_kv; dims[1] = hd; return 2;
    case TAP_KQV_OUT: case TAP_ATTN_GATED: dims[0] = c->n_head * hd; return 1;
    case TAP_QKV_MIXED: case TAP_CONV: dims[0] = conv_dim; return 1;
    case TAP_Z: case TAP_V_CONV: case TAP_DELTA_OUT: dims[0] = Hv; dims[1] = S; return 2;
    case TAP_BETA: case TAP_GATE: dims[0] = Hv; return 1;
    case TAP_Q_CONV: case TAP_K_CONV: dims[0] = c->ssm_k_heads; dims[1] = S; return 2;
    case TAP_FINAL_OUT: dims[0] = c->ssm_inner; return 1;
    case TAP_RESULT_OUTPUT: dims[0] = c->n_vocab; return 1;
    default: dims[0] = E; return 1;
    }
}

// Floats in one token's row of tensor `kind` in layer l (0: the layer has none).
static size_t tap_width(const Config *c, int kind, int l) {
    int dims[2], n = tap_shape(c, kind, l, dims);
    return n == 0 ? 0 : n == 1 ? (size_t)dims[0] : (size_t)dims[0] * dims[1];
}

// What a run hands its taps to: the selected tensors of every prompt token, and what to feed each
// layer instead of our own residual stream (--diff-inject).
typedef struct {
    const Config *c;
    int n_tok;            // rows of every tensor: the prompt's tokens, at positions 0..n_tok-1
    float **data;         // ((n_layer + 1) * N_TAPS) slots, (n_tok, width) each; NULL: not kept.
                          // Slot l * N_TAPS + kind; the three outside the layers: layer n_layer
    const char **by;      // per slot, which path wrote it (the manifest says)
    const float **inject; // (n_layer) or NULL: layer l's input rows (n_tok, n_embd): their inp_embd
                          // for layer 0, their l_out-(l-1) after it
} Tap;

static size_t tap_slot(const Config *c, int kind, int l) {
    return (size_t)(kind >= N_LAYER_TAPS ? c->n_layer : l) * N_TAPS + kind;
}

// Rows t .. t+nt-1 of tensor `kind` in layer l, written by path `by`: kept when selected.
static void tap_put(Tap *tp, int kind, int l, int t, int nt, const float *rows, const char *by) {
    size_t slot = tap_slot(tp->c, kind, l), w = tap_width(tp->c, kind, l);
    if (!tp->data[slot] || t < 0 || t + nt > tp->n_tok) return;
    memcpy(tp->data[slot] + (size_t)t * w, rows, (size_t)nt * w * sizeof(float));
    tp->by[slot] = by;
}

// Tensor `kind` of layer l is kept: the caller may skip work that only a tap would use.
static int tap_wants(const Tap *tp, int kind, int l) {
    return tp && tp->data[tap_slot(tp->c, kind, l)] != NULL;
}

// ------------------------------------------------------------------------------------------------
// 5. CPU forward: the plain-C twin of the whole model
// ------------------------------------------------------------------------------------------------
// fp32 math on dequantized weights, an fp32 KV cache, dot products summed in double. This is the
// "exact" math of the reference logits (only summation order differs); `--cpu` runs it, and the
// tests hold it to the reference. Every GPU kernel below has its twin here, or, where the kernel
// computes something the model's math does not name (the 16-bit activations, the planes, the
// prefill's fp16 operands), next to the kernel.

typedef struct {
    int n_ctx;
    float *x;            // (n_embd) residual stream
    float *xb;           // (n_embd) normalized input of the next mat-vec
    float *q;            // (n_head*head_dim)
    float *qg;           // (n_head*2*head_dim) qwen35: per head [q | gate]
    float *k, *v;        // (n_head_kv*head_dim)
    float *att_out;      // (n_head*head_dim) attention output, heads concatenated
    float *att;          // (n_ctx) attention weights of one head
    float *hb, *hb2;     // (n_ff) FFN hidden: gate, up
    float *logits;       // (n_vocab)
    float *row;          // (max n_in) one dequantized weight row
    float *key_cache;    // (n_kv_layers, n_ctx, n_head_kv*head_dim) fp32
    float *value_cache;  // (n_kv_layers, n_ctx, n_head_kv*head_dim) fp32
    // Gated DeltaNet (qwen35)
    float *mixed;        // (conv_dim) attn_qkv output; then the conv output [q | k | v]
    float *z;            // (Hv*S) output gate
    float *beta, *alpha; // (Hv)
    float *gdn_out;      // (Hv*S)
    float *conv_state;   // (n_gdn_layers, 3, conv_dim) the last 3 inputs of the conv, oldest first
    float *ssm_state;    // (n_gdn_layers, Hv, S, S) state[hv][j][i], j = value index, i = key index
    float *blk;          // (n_embd) a block's output, before it is added to x
    Tap *tap;            // NULL, or where every tensor goes (--dump-hidden, --diff-hidden)
} CpuState;

static size_t gdn_conv_dim(const Config *c) {
    return 2 * (size_t)c->ssm_k_heads * c->ssm_state + (size_t)c->ssm_inner;
}

// The CPU path's buffers, all zeroed: the KV cache for n_ctx positions and the DeltaNet states.
static void cpu_state_init(CpuState *s, const Config *c, int n_ctx) {
    size_t qdim = (size_t)c->n_head * c->head_dim, kvdim = (size_t)c->n_head_kv * c->head_dim;
    size_t conv_dim = gdn_conv_dim(c), vdim = (size_t)c->ssm_inner, S = (size_t)c->ssm_state;
    size_t max_in = (size_t)(c->n_ff > c->n_embd ? c->n_ff : c->n_embd);
    if (qdim > max_in) max_in = qdim;
    if (vdim > max_in) max_in = vdim;
    s->n_ctx = n_ctx;
    const char *what = "the --cpu path's buffers";
    s->x = (float *)xcalloc(c->n_embd, 4, what);
    s->xb = (float *)xcalloc(c->n_embd, 4, what);
    s->q = (float *)xcalloc(qdim, 4, what);
    s->qg = (float *)xcalloc(2 * qdim, 4, what);
    s->k = (float *)xcalloc(kvdim, 4, what);
    s->v = (float *)xcalloc(kvdim, 4, what);
    s->att_out = (float *)xcalloc(qdim, 4, what);
    s->att = (float *)xcalloc(n_ctx, 4, what);
    s->hb = (float *)xcalloc(c->n_ff, 4, what);
    s->hb2 = (float *)xcalloc(c->n_ff, 4, what);
    s->logits = (float *)xcalloc(c->n_vocab, 4, what);
    s->row = (float *)xcalloc(max_in, 4, what);
    char kv[80]; // the one buffer that -c sizes: its message says so
    snprintf(kv, sizeof kv, "the --cpu path's fp32 KV cache for -c %d (lower -c)", n_ctx);
    s->key_cache = (float *)xcalloc((size_t)c->n_kv_layers * n_ctx * kvdim, 4, kv);
    s->value_cache = (float *)xcalloc((size_t)c->n_kv_layers * n_ctx * kvdim, 4, kv);
    s->mixed = (float *)xcalloc(conv_dim, 4, what);
    s->z = (float *)xcalloc(vdim, 4, what);
    s->beta = (float *)xcalloc(c->ssm_v_heads, 4, what);
    s->alpha = (float *)xcalloc(c->ssm_v_heads, 4, what);
    s->gdn_out = (float *)xcalloc(vdim, 4, what);
    s->conv_state = (float *)xcalloc((size_t)c->n_gdn_layers * 3 * conv_dim, 4, what);
    s->ssm_state = (float *)xcalloc((size_t)c->n_gdn_layers * c->ssm_v_heads * S * S, 4, what);
    s->blk = (float *)xcalloc(c->n_embd, 4, what);
}

static void cpu_state_free(CpuState *s) {
    float *all[] = {s->x, s->xb, s->q, s->qg, s->k, s->v, s->att_out, s->att, s->hb, s->hb2,
                    s->logits, s->row, s->mixed, s->z, s->key_cache, s->value_cache, s->beta,
                    s->alpha, s->gdn_out, s->conv_state, s->ssm_state, s->blk};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

// y = W x (+ bias) (+ y when accumulate): one dequantized row at a time.
static void matvec_c(const Tensor *W, const float *x /* (n_in) */, float *y /* (n_out) */,
                     const Tensor *bias, int accumulate, float *row /* (n_in) scratch */) {
    size_t rb = row_bytes(W->type, W->n_in);
    for (int64_t r = 0; r < W->n_out; r++) {
        dequant_row(W->type, W->host + r * rb, row, W->n_in);
        double sum = 0.0;
        for (int64_t i = 0; i < W->n_in; i++) sum += (double)row[i] * x[i];
        if (bias && bias->name) sum += ((const float *)bias->host)[r];
        y[r] = accumulate ? y[r] + (float)sum : (float)sum;
    }
}

// RMSNorm: out = x / sqrt(mean(x^2) + eps) * w
static void rmsnorm_c(float *out, const float *x, const float *w, int n, float eps) {
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float scale = 1.0f / sqrtf((float)(ss / n) + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * scale * w[i];
}

// (cos, sin) of the RoPE angle theta_i = pos * freq_scale * base^(-2i/n_rot), in double; the one
// formula of the C path, the prompt's RoPE kernel and the per-token angles of the decode.
__host__ __device__ static inline float2 rope_angle(int pos, int i, int n_rot, float base,
                                                    float freq_scale) {
    double theta = (double)pos * freq_scale * pow((double)base, -2.0 * i / n_rot);
    return make_float2((float)cos(theta), (float)sin(theta));
}

// NEOX-style RoPE on each of n_heads heads: for i < n_rot/2 the pair (x[i], x[i + n_rot/2]) is
// rotated by theta_i (rope_angle); dims >= n_rot are left alone.
static void rope_neox_c(float *v /* (n_heads, head_dim) */, int n_heads, int head_dim, int n_rot,
                        int pos, float base, float freq_scale) {
    int half = n_rot / 2;
    for (int i = 0; i < half; i++) {
        float2 a = rope_angle(pos, i, n_rot, base, freq_scale);
        float cs = a.x, sn = a.y;
        for (int h = 0; h < n_heads; h++) {
            float *p = v + (size_t)h * head_dim;
            float x0 = p[i], x1 = p[i + half];
            p[i] = x0 * cs - x1 * sn;
            p[i + half] = x0 * sn + x1 * cs;
        }
    }
}

static float silu_c(float x) { return x / (1.0f + expf(-x)); }

// Causal GQA attention of one token at `pos` over the cached positions 0..pos of one layer:
//   out[h] = sum_t softmax_t(q[h] . K[t][h/g] / sqrt(head_dim)) V[t][h/g],   g = n_head / n_head_kv
// fp16 = 1 is the twin of attention_prefill_kernel: the same math with the kernel's two fp16
// roundings, q / sqrt(hd) and the probabilities p = fp16(exp(s - max)) (l = sum p). Sums in double.
// mag (n_head, hd), if not NULL, gets sum_t p_t |v_t| / l: the size of the terms, the scale to
// compare outputs against.
static void attention_any_c(float *out /* (n_head, hd) */, float *mag,
                            const float *q /* (n_head, hd) */,
                            const float *kc /* (n_ctx, n_kv, hd) */,
                            const float *vc /* (n_ctx, n_kv, hd) */, float *att /* (pos+1) */,
                            int n_head, int n_kv, int hd, int pos, int fp16) {
    int g = n_head / n_kv;
    float scale = 1.0f / sqrtf((float)hd);
    for (int h = 0; h < n_head; h++) {
        const float *qh = q + (size_t)h * hd;
        int kvh = h / g;
        float mx = -INFINITY;
        for (int t = 0; t <= pos; t++) {
            const float *kt = kc + ((size_t)t * n_kv + kvh) * hd;
            double s = 0.0;
            if (fp16) {
                for (int i = 0; i < hd; i++)
                    s += (double)f16r(qh[i] * scale) * kt[i];
                att[t] = (float)s;
            } else {
                for (int i = 0; i < hd; i++) s += (double)qh[i] * kt[i];
                att[t] = (float)s * scale;
            }
            if (att[t] > mx) mx = att[t];
        }
        double sum = 0.0;
        for (int t = 0; t <= pos; t++) {
            att[t] = expf(att[t] - mx);
            if (fp16) att[t] = f16r(att[t]);
            sum += att[t];
        }
        for (int i = 0; i < hd; i++) {
            double o = 0.0, a = 0.0;
            for (int t = 0; t <= pos; t++) {
                float v = vc[((size_t)t * n_kv + kvh) * hd + i];
                o += (double)att[t] * v;
                a += (double)att[t] * fabsf(v);
            }
            out[(size_t)h * hd + i] = (float)(o / sum);
            if (mag) mag[(size_t)h * hd + i] = (float)(a / sum);
        }
    }
}
// The exact attention (fp32 q, sums in double): the twin of the decode's attention_split_kernel.
static void attention_c(float *out, const float *q, const float *kc, const float *vc, float *att,
                        int n_head, int n_kv, int hd, int pos) {
    attention_any_c(out, NULL, q, kc, vc, att, n_head, n_kv, hd, pos, 0);
}
static void attention_prefill_c(float *out, float *mag, const float *q, const float *kc,
                                const float *vc, float *att, int n_head, int n_kv, int hd,
                                int pos) {
    attention_any_c(out, mag, q, kc, vc, att, n_head, n_kv, hd, pos, 1);
}

static float sigmoid_c(float x) { return 1.0f / (1.0f + expf(-x)); }

// The gates of v head hv: g = softplus(alpha + dt_bias) * a, the log of the decay (a = -exp(A_log)
// < 0, so g <= 0), and beta = sigmoid(beta_raw), the write strength. The same code on the CPU and
// the GPU. beta_raw, alpha_raw, dt_bias, ssm_a: (Hv) each.
__host__ __device__ static inline void gdn_gates(int hv, const float *beta_raw,
                                                 const float *alpha_raw, const float *dt_bias,
                                                 const float *ssm_a, float *g, float *beta) {
    float x = alpha_raw[hv] + dt_bias[hv];
    *g = (x > 20.0f ? x : logf(1.0f + expf(x))) * ssm_a[hv];
    *beta = 1.0f / (1.0f + expf(-beta_raw[hv]));
}

// --- Gated DeltaNet pieces (qwen35), each the C twin of a GPU kernel ---

// Causal depthwise conv over the last 4 inputs of each channel, then SiLU. cs (3, conv_dim) holds
// the previous 3 inputs, oldest first, and is shifted by one.
//   y[c] = silu(cs[0][c] w[c][0] + cs[1][c] w[c][1] + cs[2][c] w[c][2] + mixed[c] w[c][3])
static void gdn_conv_c(float *y /* (conv_dim) */, const float *mixed /* (conv_dim) */,
                       const float *w /* (conv_dim, 4) */, float *cs /* (3, conv_dim) */,
                       int conv_dim) {
    for (int c = 0; c < conv_dim; c++) {
        float win[4] = {cs[c], cs[conv_dim + c], cs[2 * conv_dim + c], mixed[c]};
        double sum = 0.0;
        for (int i = 0; i < 4; i++) sum += (double)win[i] * w[4 * c + i];
        y[c] = silu_c((float)sum);
        cs[c] = win[1];
        cs[conv_dim + c] = win[2];
        cs[2 * conv_dim + c] = win[3];
    }
}

// L2 norm: v = v / max(||v||, eps)
static void l2norm_c(float *v, int n, float eps) {
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)v[i] * v[i];
    float inv = 1.0f / fmaxf(sqrtf((float)ss), eps);
    for (int i = 0; i < n; i++) v[i] *= inv;
}

// One step of the gated delta rule for one value head (S x S state M, row j = value index):
//   M = M * exp(g);  delta = beta * (v - M k);  M = M + delta k^T;  o = M q / sqrt(S)
static void gdn_step_c(float *M /* (S, S) */, const float *q /* (S) */, const float *k /* (S) */,
                       const float *v /* (S) */, float g, float beta, float *o /* (S) */, int S) {
    float decay = expf(g);
    for (int j = 0; j < S; j++) {
        float *m = M + (size_t)j * S;
        double kv = 0.0;
        for (int i = 0; i < S; i++) {
            m[i] *= decay;
            kv += (double)m[i] * k[i];
        }
        float delta = beta * (v[j] - (float)kv);
        double oq = 0.0;
        for (int i = 0; i < S; i++) {
            m[i] += delta * k[i];
            oq += (double)m[i] * q[i];
        }
        o[j] = (float)oq / sqrtf((float)S);
    }
}

// Gated RMSNorm of one head's output: o = rmsnorm(o) * w * silu(z)
static void gated_rmsnorm_c(float *o, const float *z, const float *w, int S, float eps) {
    rmsnorm_c(o, o, w, S, eps);
    for (int j = 0; j < S; j++) o[j] *= silu_c(z[j]);
}

// --- the three kinds of block ---

// This token's row of tensor `kind` in layer l, to the run's tap if it has one (section 4b).
static void tap_cpu(const CpuState *s, int kind, int l, int pos, const float *row) {
    if (s->tap) tap_put(s->tap, kind, l, pos, 1, row, "cpu");
}

// x += y: a block's output joins the residual stream (the same float sum the GPU's accumulating
// mat-vecs make)
static void add_c(float *x, const float *y, int n) {
    for (int i = 0; i < n; i++) x[i] += y[i];
}

// attention: x = x + Wo attn(rope(norm(x) Wq), rope(norm(x) Wk), norm(x) Wv)
//   qwen2: q/k/v biases; qwen3: RMSNorm of each q/k head before RoPE; qwen35: Wq also yields a
//   gate per head, RoPE covers the first n_rot dims, and the output is multiplied by sigmoid(gate)
static void attention_block_cpu(const Model *m, CpuState *s, int l, int pos) {
    const Config *c = &m->c;
    const LayerWeights *L = &m->w.layers[l];
    int hd = c->head_dim;
    size_t kvdim = (size_t)c->n_head_kv * hd;
    float *q = s->q;
    if (c->arch == ARCH_QWEN35) { // Wq rows per head: [q (hd) | gate (hd)]
        matvec_c(&L->wq, s->xb, s->qg, NULL, 0, s->row);
        for (int h = 0; h < c->n_head; h++)
            memcpy(q + (size_t)h * hd, s->qg + (size_t)h * 2 * hd, hd * 4);
    } else {
        matvec_c(&L->wq, s->xb, q, &L->bq, 0, s->row);
    }
    matvec_c(&L->wk, s->xb, s->k, &L->bk, 0, s->row);
    matvec_c(&L->wv, s->xb, s->v, &L->bv, 0, s->row);
    if (L->q_norm.name) { // RMSNorm over each head of q and k, before RoPE
        for (int h = 0; h < c->n_head; h++)
            rmsnorm_c(q + h * hd, q + h * hd, (const float *)L->q_norm.host, hd, c->eps);
        for (int h = 0; h < c->n_head_kv; h++)
            rmsnorm_c(s->k + h * hd, s->k + h * hd, (const float *)L->k_norm.host, hd, c->eps);
    }
    rope_neox_c(q, c->n_head, hd, c->n_rot, pos, c->rope_base, c->rope_freq_scale);
    rope_neox_c(s->k, c->n_head_kv, hd, c->n_rot, pos, c->rope_base, c->rope_freq_scale);
    tap_cpu(s, TAP_QCUR, l, pos, q);
    tap_cpu(s, TAP_KCUR, l, pos, s->k);
    tap_cpu(s, TAP_VCUR, l, pos, s->v);
    float *kc = s->key_cache + (size_t)c->kv_slot[l] * s->n_ctx * kvdim;
    float *vc = s->value_cache + (size_t)c->kv_slot[l] * s->n_ctx * kvdim;
    memcpy(kc + pos * kvdim, s->k, kvdim * 4);
    memcpy(vc + pos * kvdim, s->v, kvdim * 4);
    attention_c(s->att_out, q, kc, vc, s->att, c->n_head, c->n_head_kv, hd, pos);
    tap_cpu(s, TAP_KQV_OUT, l, pos, s->att_out);
    if (c->arch == ARCH_QWEN35) {
        for (int h = 0; h < c->n_head; h++)
            for (int d = 0; d < hd; d++)
                s->att_out[(size_t)h * hd + d] *= sigmoid_c(s->qg[(size_t)h * 2 * hd + hd + d]);
        tap_cpu(s, TAP_ATTN_GATED, l, pos, s->att_out);
    }
    matvec_c(&L->wo, s->att_out, s->blk, NULL, 0, s->row);
    tap_cpu(s, TAP_ATTN_OUT, l, pos, s->blk);
    add_c(s->x, s->blk, c->n_embd);
}

// Gated DeltaNet (qwen35 linear attention): x = x + W_out gdn(norm(x)); the math is in
// gdn_conv_c and gdn_step_c above
static void deltanet_block_cpu(const Model *m, CpuState *s, int l, int pos) {
    const Config *c = &m->c;
    const LayerWeights *L = &m->w.layers[l];
    int S = c->ssm_state, Hk = c->ssm_k_heads, Hv = c->ssm_v_heads, conv_dim = (int)gdn_conv_dim(c);
    matvec_c(&L->wqkv, s->xb, s->mixed, NULL, 0, s->row);
    matvec_c(&L->wz, s->xb, s->z, NULL, 0, s->row);
    matvec_c(&L->w_beta, s->xb, s->beta, NULL, 0, s->row);
    matvec_c(&L->w_alpha, s->xb, s->alpha, NULL, 0, s->row);
    tap_cpu(s, TAP_QKV_MIXED, l, pos, s->mixed);
    tap_cpu(s, TAP_Z, l, pos, s->z);
    // the gates of every v head, in place: alpha becomes g (the log of the decay), beta sigmoid(b)
    const float *dt_bias = (const float *)L->dt_bias.host, *a = (const float *)L->ssm_a.host;
    for (int hv = 0; hv < Hv; hv++)
        gdn_gates(hv, s->beta, s->alpha, dt_bias, a, &s->alpha[hv], &s->beta[hv]);
    tap_cpu(s, TAP_BETA, l, pos, s->beta);
    tap_cpu(s, TAP_GATE, l, pos, s->alpha);
    float *cs = s->conv_state + (size_t)c->gdn_slot[l] * 3 * conv_dim;
    // in place: y[c] needs only mixed[c]
    gdn_conv_c(s->mixed, s->mixed, (const float *)L->conv1d.host, cs, conv_dim);
    tap_cpu(s, TAP_CONV, l, pos, s->mixed);
    float *q = s->mixed, *k = s->mixed + (size_t)Hk * S, *v = s->mixed + 2 * (size_t)Hk * S;
    // q heads, then k heads
    for (int h = 0; h < 2 * Hk; h++) l2norm_c(q + (size_t)h * S, S, c->eps);
    tap_cpu(s, TAP_Q_CONV, l, pos, q);
    tap_cpu(s, TAP_K_CONV, l, pos, k);
    tap_cpu(s, TAP_V_CONV, l, pos, v);
    float *state = s->ssm_state + (size_t)c->gdn_slot[l] * Hv * S * S;
    for (int hv = 0; hv < Hv; hv++) {
        int hk = hv % Hk; // V heads are tiled over the K heads (converter's order)
        gdn_step_c(state + (size_t)hv * S * S, q + (size_t)hk * S, k + (size_t)hk * S,
                   v + (size_t)hv * S, s->alpha[hv], s->beta[hv], s->gdn_out + (size_t)hv * S, S);
    }
    tap_cpu(s, TAP_DELTA_OUT, l, pos, s->gdn_out);
    for (int hv = 0; hv < Hv; hv++)
        gated_rmsnorm_c(s->gdn_out + (size_t)hv * S, s->z + (size_t)hv * S,
                        (const float *)L->ssm_norm.host, S, c->eps);
    tap_cpu(s, TAP_FINAL_OUT, l, pos, s->gdn_out);
    matvec_c(&L->ssm_out, s->gdn_out, s->blk, NULL, 0, s->row);
    tap_cpu(s, TAP_LINEAR_OUT, l, pos, s->blk);
    add_c(s->x, s->blk, c->n_embd);
}

// FFN: x = x + W_down (silu(W_gate h) * (W_up h)),  h = norm(x)
static void ffn_block_cpu(const Model *m, CpuState *s, int l, int pos) {
    const Config *c = &m->c;
    const LayerWeights *L = &m->w.layers[l];
    rmsnorm_c(s->xb, s->x, (const float *)L->ffn_norm.host, c->n_embd, c->eps);
    tap_cpu(s, TAP_FFN_NORM, l, pos, s->xb);
    matvec_c(&L->w_gate, s->xb, s->hb, NULL, 0, s->row);
    matvec_c(&L->w_up, s->xb, s->hb2, NULL, 0, s->row);
    for (int i = 0; i < c->n_ff; i++) s->hb[i] = silu_c(s->hb[i]) * s->hb2[i];
    matvec_c(&L->w_down, s->hb, s->blk, NULL, 0, s->row);
    tap_cpu(s, TAP_FFN_OUT, l, pos, s->blk);
    add_c(s->x, s->blk, c->n_embd);
}

// One token through the model on the CPU; leaves the logits in s->logits. Position 0 starts a new
// sequence: the DeltaNet states are cleared (the KV cache is simply overwritten).
//   HF: hidden = embed(tok); for layer: hidden = layer(hidden); logits = lm_head(norm(hidden))
// With a tap that injects (--diff-inject), each layer starts from their residual stream instead
// of ours, so that its output's error is the layer's own. (The logits reach a tap through
// engine_eval, on every path alike.)
static void forward_cpu(const Model *m, CpuState *s, int token, int pos) {
    const Config *c = &m->c;
    if (pos == 0 && c->n_gdn_layers) {
        size_t S = (size_t)c->ssm_state;
        memset(s->conv_state, 0, (size_t)c->n_gdn_layers * 3 * gdn_conv_dim(c) * 4);
        memset(s->ssm_state, 0, (size_t)c->n_gdn_layers * c->ssm_v_heads * S * S * 4);
    }
    embed_token(m, token, s->x);
    tap_cpu(s, TAP_INP_EMBD, 0, pos, s->x);
    for (int l = 0; l < c->n_layer; l++) {
        if (s->tap && s->tap->inject)
            memcpy(s->x, s->tap->inject[l] + (size_t)pos * c->n_embd, c->n_embd * 4);
        rmsnorm_c(s->xb, s->x, (const float *)m->w.layers[l].attn_norm.host, c->n_embd, c->eps);
        tap_cpu(s, TAP_ATTN_NORM, l, pos, s->xb);
        if (c->kind[l] == LAYER_DELTANET) deltanet_block_cpu(m, s, l, pos);
        else attention_block_cpu(m, s, l, pos);
        tap_cpu(s, TAP_FFN_INP, l, pos, s->x);
        ffn_block_cpu(m, s, l, pos);
        tap_cpu(s, TAP_L_OUT, l, pos, s->x);
    }
    rmsnorm_c(s->xb, s->x, (const float *)m->w.output_norm.host, c->n_embd, c->eps);
    tap_cpu(s, TAP_RESULT_NORM, 0, pos, s->xb);
    matvec_c(&m->w.output, s->xb, s->logits, &m->w.output_bias, 0, s->row);
}

// ------------------------------------------------------------------------------------------------
// 6. GPU mat-vec: y = W x
// ------------------------------------------------------------------------------------------------
// Decode multiplies every weight matrix by one vector per token, so a token takes as long as it
// takes to read the weights: the mat-vec must stream them at close to the card's bandwidth. This
// section builds it up in steps, the first five a complete fast mat-vec read in one stretch:
//   6.1 the simple mat-vec: any type, one warp per row, fp32 (twin: matvec_c);
//   6.2 16-bit activations: the input vector as integers, for dp4a (twin: quantize_block_c);
//   6.3 the planes: the fast types' weights rewritten at upload for 16-byte loads;
//   6.4 one 32-weight sub-block times one activation block, per fast type (sub_load, sub_dot);
//       6.4b the same for Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL and Q4_K (marked "Speed:");
//       6.4c float weights in 16-byte loads (marked "Speed:");
//   6.5 the per-block mat-vec: a block of threads per few rows (twin of 6.5, 6.6: matvec_xq_c);
//   6.6 the streaming mat-vec, for long launches (marked "Speed:");
//   6.7 step order and block shapes (marked "Speed:");
//   6.8 matvec(): which kernel a launch takes.
// Two fast kernels, because neither is the faster one for every launch: the streaming kernel wins
// when each warp gets long runs of rows (gate/up, the output matrix), the per-block one when not.
// Only sm_70 features are used (no bf16 arithmetic, no cp.async, no ldmatrix or mma.m16n8k*), so
// one source builds for a V100 and runs on every later card.

#define WARP 32

// Sum (max) over the 32 lanes of a warp, by butterfly shuffles: every lane gets the result.
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = WARP / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = WARP / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// Sum (MAX: maximum) over the whole block (blockDim.x a multiple of 32, at most 1024); every
// thread gets it.
template <bool MAX> __device__ float block_reduce(float v) {
    __shared__ float part[32];
    __shared__ float total;
    int lane = threadIdx.x % WARP, wid = threadIdx.x / WARP;
    v = MAX ? warp_max(v) : warp_sum(v);
    if (lane == 0) part[wid] = v;
    __syncthreads();
    if (wid == 0) {
        v = lane < (int)(blockDim.x / WARP) ? part[lane] : MAX ? -INFINITY : 0.0f;
        v = MAX ? warp_max(v) : warp_sum(v);
        if (lane == 0) total = v;
    }
    __syncthreads();
    float r = total;
    __syncthreads(); // part and total may be reused by the next call
    return r;
}
__device__ float block_sum(float v) { return block_reduce<false>(v); }
__device__ float block_max(float v) { return block_reduce<true>(v); }

// SiLU(x) = x * sigmoid(x) = x / (1 + e^-x), with the fast exponential (C twin: silu_c, expf).
__device__ __forceinline__ float silu(float x) { return x / (1.0f + __expf(-x)); }

// --- 6.1 the simple mat-vec ----------------------------------------------------------------------
// y[r] = W[r,:] . x (+ bias[r]) (+ y[r] when accumulate). One warp per row; the lanes take the
// row's 32-weight units in turn (dequant_unit, the format's definition) and their partial sums
// meet in a shuffle reduction. It works for every type, the simplest correct GPU mat-vec; the
// engine runs the float types (F32, F16, BF16) here, whose inputs stay fp32 (6.4c reads their
// rows faster, in 16-byte loads, when the rows are whole 16-byte vectors). Every quantized type
// has planes and takes the kernels of 6.5 and 6.6. C twin: matvec_c.
template <int TYPE>
__global__ void matvec_generic_kernel(const uint8_t *W,    // (n_out, row_stride bytes)
                                      size_t row_stride,
                                      const float *x,      // (n_in)
                                      const float *bias,   // (n_out) or NULL
                                      float *y,            // (n_out)
                                      int n_in, int n_out, int accumulate) {
    int row = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (row >= n_out) return;
    const uint8_t *w = W + (size_t)row * row_stride;
    int n_units = (n_in + 31) / 32;
    float sum = 0.0f;
    for (int u = lane; u < n_units; u += WARP) {
        float wu[32];
        dequant_unit(TYPE, w, u, wu, n_in, 0);
        const float *xu = x + 32 * u;
        for (int j = 0; j < 32 && 32 * u + j < n_in; j++) sum += wu[j] * xu[j];
    }
    sum = warp_sum(sum);
    if (lane == 0) {
        if (bias) sum += bias[row];
        y[row] = accumulate ? y[row] + sum : sum;
    }
}

// --- 6.2 16-bit activations for the fast mat-vecs ------------------------------------------------
// The quantized types (the fast types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, IQ4_XS, Q4_K, Q5_K,
// Q6_K) are multiplied with integer dot products (dp4a: 4 int8 products summed into an int32
// in one instruction, sm_61+). Their input vector is carried as 16-bit integers with one fp32 scale
// per 32 values:
//
//   x[i] ~= s * X[i],   s = amax / 32512,   X[i] = round(x[i] / s) in [-32512, 32512]
//   X = 256*H + L with H = floor((X + 128) / 256) and L = X - 256*H, both int8
//
// so sum_i w[i]*X[i] = 256 * dp4a(w, H) + dp4a(w, L), exact in int32. The rounding error of a value
// is at most amax/65024 of its block: for a Gaussian block that is ~13x smaller than fp16's
// relative 2^-11, and unlike fp16 it cannot overflow on Qwen's large activations. Everything after
// the 32-value integer dot (scales, sums across blocks) is fp32. (llama.cpp uses 8 bits here, 256x
// coarser: the README compares the two engines' KL.)
//
// Layout of a quantized vector of n values (nb = n/32 blocks), "chunk-major" so that 32 lanes
// reading 32 consecutive blocks read 512 contiguous bytes:
//   q   (4, nb) x 16 bytes: chunk 0 = H[0..15], 1 = H[16..31], 2 = L[0..15], 3 = L[16..31]
//   s   (nb) fp32 scale,  sum (nb) int32 = sum of X over the block (for offsets and minimums)

#define XQ_MAX 32512 // 127 * 256: keeps H inside int8

typedef struct {
    int4 *q;    // (4, nb) chunks of 16 int8
    float *s;   // (nb)
    int *sum;   // (nb)
} XQ;

// An activation vector as the mat-vecs consume it: fp32 for the generic kernels, 16-bit for the
// fast.
typedef struct {
    float *f;   // (n)
    XQ q;       // n/32 blocks; q.q == NULL when n is not a multiple of 32
} Act;

// C twin of the quantizer, one block of 32 values.
static void quantize_block_c(const float *x /* (32) */, int8_t *H /* (32) */, int8_t *L /* (32) */,
                             float *s /* (1) */, int *sum /* (1) */) {
    float amax = 0.0f;
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
    float inv = amax > 0.0f ? XQ_MAX / amax : 0.0f;
    int total = 0;
    for (int i = 0; i < 32; i++) {
        int X = (int)rintf(x[i] * inv);
        X = X > XQ_MAX ? XQ_MAX : X < -XQ_MAX ? -XQ_MAX : X;
        int h = (X + 128) >> 8; // arithmetic shift: floor((X + 128) / 256)
        H[i] = (int8_t)h;
        L[i] = (int8_t)(X - 256 * h);
        total += X;
    }
    *s = amax / XQ_MAX;
    *sum = total;
}

// C twin of the fast mat-vecs (6.5, 6.6): y = W x^ (+ bias) (+ y), the dequantized weights against
// the dequantized 16-bit activations x^ = s * (256 H + L), summed in double.
static void matvec_xq_c(const Tensor *W, const int8_t *H /* (n_in) */, const int8_t *L /* (n_in) */,
                        const float *s /* (n_in/32) */, const float *bias /* (n_out) or NULL */,
                        float *y /* (n_out) */, int accumulate, float *row /* (n_in) scratch */) {
    size_t rb = row_bytes(W->type, W->n_in);
    for (int64_t r = 0; r < W->n_out; r++) {
        dequant_row(W->type, W->host + r * rb, row, W->n_in);
        double sum = 0.0;
        for (int64_t i = 0; i < W->n_in; i++)
            sum += (double)row[i] * s[i / 32] * (256 * H[i] + L[i]);
        if (bias) sum += bias[r];
        y[r] = accumulate ? y[r] + (float)sum : (float)sum;
    }
}

// The quantizer on the GPU: the 32 lanes of a warp hold the 32 values of block b, one each.
__device__ void quantize_block_warp(float v, XQ xq, int b, int nb) {
    int lane = threadIdx.x % WARP;
    float amax = warp_max(fabsf(v));
    float inv = amax > 0.0f ? XQ_MAX / amax : 0.0f;
    int X = __float2int_rn(v * inv);
    X = max(-XQ_MAX, min(XQ_MAX, X));
    int h = (X + 128) >> 8;
    ((int8_t *)(xq.q + (size_t)(lane / 16) * nb + b))[lane % 16] = (int8_t)h;
    ((int8_t *)(xq.q + (size_t)(2 + lane / 16) * nb + b))[lane % 16] = (int8_t)(X - 256 * h);
    int total = X;
    for (int o = WARP / 2; o > 0; o /= 2) total += __shfl_xor_sync(0xffffffffu, total, o);
    if (lane == 0) {
        xq.s[b] = amax / XQ_MAX;
        xq.sum[b] = total;
    }
}

// --- 6.3 the planes: the fast types' weights laid out for 16-byte loads --------------------------
// The file's blocks are 18 to 34, 136 to 210 bytes long, which breaks 16-byte loads. At
// upload they are rewritten (the same bytes per weight, nothing lost) as planes indexed by g, the
// number of a 32-weight sub-block in the tensor (g = row * n_in/32 + k row by row), NB sub-blocks
// in all:
//
//   every type  qs plane (NB x 16 B; Q8_0's, in 6.4b, is NB x 32 B): byte j = element j (low
//               nibble) | element j+16 (high)
//   Q4_0        d plane  (NB x fp16)
//   IQ4_XS      qs plane instead: word k holds the 4-bit codes (iq4_code), lowest bits first, of
//               elements 4k..4k+3 then 16+4k..16+4k+3 (the order iq4_lookup8 decodes them in);
//               hdr plane (NB/8 x 8 B): d (fp16) in bits 0-15, then the 6-bit scale ls of sub-block
//               i in bits 16+6i .. 21+6i (the file splits it into scales_l and scales_h)
//   Q5_K        qh plane (NB x 4 B): bit e = 5th bit of element e
//               hdr plane (NB/8 x 16 B): d, dmin, scales[12]
//   Q6_K        qh plane (NB x 8 B): word w (0: elements 0..15, 1: 16..31), byte b, bits 2m..2m+1
//               = high 2 bits of element 16w + 4m + b;  sc plane (NB/8 x 16 int8);
//               d plane (NB/8 x fp16)
//   Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q4_K: planes of the same kinds, in 6.4b with the rest of
//               their fast code.
//
// C twin: repack_c (the tests check repack_kernel, the IQ4_XS lookup and the step order with it).
//
// The streaming mat-vec (6.6) reads some matrices in its own order of units of MV_ROWS rows x 32
// sub-blocks, the step order (6.7): plane_g gives the place of a sub-block in either order.
#define MV_ROWS 4 // rows per unit of the streaming mat-vec: each activation load serves 4 rows
typedef struct {
    int w0, nw, k0, k1; // the warps and steps of a tensor's units in step order (so_warps, 6.7)
} StepWarps;
__host__ __device__ static inline StepWarps so_warps(StepOrder so);
__host__ __device__ static inline unsigned so_slot_kw(StepWarps sw, int k, int w);
__host__ __device__ static inline unsigned so_slot(StepOrder so, int c);
// The plane index g of sub-block u of row `row` (n_sub sub-blocks per row).
__host__ __device__ static inline unsigned plane_g(StepOrder so, int row, int u, int n_sub) {
    if (!so.upw) return (unsigned)row * n_sub + u;
    int c = row / MV_ROWS * (n_sub / 32) + u / 32;
    return (so_slot(so, c) * MV_ROWS + row % MV_ROWS) * 32 + u % 32;
}

// IQ4_XS's 16 values, split into two tables of 8 so that a code's 3 low bits index a table and its
// 4th bit picks one: A = kvalues[0..3, 8..11], B = kvalues[4..7, 12..15]. A[j] and B[j] have the
// same sign and B[j] > A[j], so D[j] = B[j] - A[j] is positive and fits in 7 bits (what
// iq4_lookup8 needs). Bytes, low first:
#define IQ4_A0 0xbfad9881 // A[0..3] = -127 -104 -83 -65
#define IQ4_A1 0x26190d01 // A[4..7] =    1   13  25  38
#define IQ4_D0 0x373d454e // B[0..3] - A[0..3] = 78 69 61 55,  B = -49 -35 -22 -10
#define IQ4_D1 0x4b403834 // B[4..7] - A[4..7] = 52 56 64 75,  B =  53  69  89 113
// code of kvalues index idx (0..15): j = position in its table, bit 3 set for table A
__host__ __device__ static inline int iq4_code(int idx) {
    int j = (idx & 3) | ((idx >> 3) << 2), in_b = (idx >> 2) & 1;
    return j | ((1 - in_b) << 3);
}

// Word k (0..3) of an IQ4_XS sub-block's qs plane, from the file's 16 bytes of the sub-block (byte
// i: kvalues index of element i in its low nibble, of element 16 + i in its high nibble). The
// file's bytes 4k..4k+3, read as one little-endian word x, hold elements 4k + p (low nibble) and
// 16 + 4k + p (high nibble) in byte p; all 8 nibbles are turned into codes at once, then packed:
//   code bits 1..0 = index bits 1..0, code bit 2 = index bit 3, code bit 3 = NOT index bit 2
//   low nibbles of bytes 0..3 -> bits 0..15, high nibbles -> bits 16..31 (4 bits per element).
// C twin: iq4_plane_word_c, the same word element by element with iq4_code.
__host__ __device__ static inline uint32_t iq4_plane_word(const uint8_t *qs /* (16) */, int k) {
    uint32_t x = (uint32_t)qs[4 * k] | (uint32_t)qs[4 * k + 1] << 8 |
                 (uint32_t)qs[4 * k + 2] << 16 | (uint32_t)qs[4 * k + 3] << 24;
    uint32_t c = (x & 0x33333333u) | ((x >> 1) & 0x44444444u) | ((~x << 1) & 0x88888888u);
    uint32_t lo = c & 0x0f0f0f0fu, hi = (c >> 4) & 0x0f0f0f0fu; // one element per byte
    lo = (lo | lo >> 4) & 0x00ff00ffu;                          // two per byte, bytes 0 and 2
    hi = (hi | hi >> 4) & 0x00ff00ffu;
    return ((lo | lo >> 8) & 0xffffu) | ((hi | hi >> 8) & 0xffffu) << 16;
}
static uint32_t iq4_plane_word_c(const uint8_t *qs /* (16) */, int k) {
    uint32_t w = 0;
    for (int p = 0; p < 4; p++) {
        w |= (uint32_t)iq4_code(qs[4 * k + p] & 0xf) << (4 * p);       // element 4k + p
        w |= (uint32_t)iq4_code(qs[4 * k + p] >> 4) << (16 + 4 * p);   // element 16 + 4k + p
    }
    return w;
}

// The 6-bit scale of sub-block `sub` from the two words (lo, hi) of its IQ4_XS header plane entry:
// one 64-bit shift and a mask (the shift is the same for every unit a lane sees).
__host__ __device__ static inline int iq4_plane_ls(uint32_t lo, uint32_t hi, int sub) {
    return (int)(((uint64_t)hi << 32 | lo) >> (16 + 6 * sub)) & 63;
}

// The types that get planes and the fast mat-vecs: every quantized type this engine reads. The
// float types (F32, F16, BF16) run on the simple mat-vec (6.1) with fp32 inputs.
static int is_fast_type(int t) {
    switch (t) {
    case GGML_TYPE_Q4_0: case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_0: case GGML_TYPE_Q5_1:
    case GGML_TYPE_Q8_0: case GGML_TYPE_IQ4_NL: case GGML_TYPE_IQ4_XS: case GGML_TYPE_Q4_K:
    case GGML_TYPE_Q5_K: case GGML_TYPE_Q6_K: return 1;
    default: return 0;
    }
}
// The two fast types whose weights are decoded through the IQ4 table (iq4_lookup8).
static int is_iq4_type(int t) { return t == GGML_TYPE_IQ4_NL || t == GGML_TYPE_IQ4_XS; }
// LAUNCH(T) with T the fast type `type` as a compile-time constant (kernels are templated on it)
#define FAST_TYPE_SWITCH(type, LAUNCH)                          \
    switch (type) {                                             \
    case GGML_TYPE_Q4_0: LAUNCH(GGML_TYPE_Q4_0); break;         \
    case GGML_TYPE_Q4_1: LAUNCH(GGML_TYPE_Q4_1); break;         \
    case GGML_TYPE_Q5_0: LAUNCH(GGML_TYPE_Q5_0); break;         \
    case GGML_TYPE_Q5_1: LAUNCH(GGML_TYPE_Q5_1); break;         \
    case GGML_TYPE_Q8_0: LAUNCH(GGML_TYPE_Q8_0); break;         \
    case GGML_TYPE_IQ4_NL: LAUNCH(GGML_TYPE_IQ4_NL); break;     \
    case GGML_TYPE_IQ4_XS: LAUNCH(GGML_TYPE_IQ4_XS); break;     \
    case GGML_TYPE_Q4_K: LAUNCH(GGML_TYPE_Q4_K); break;         \
    case GGML_TYPE_Q5_K: LAUNCH(GGML_TYPE_Q5_K); break;         \
    case GGML_TYPE_Q6_K: LAUNCH(GGML_TYPE_Q6_K); break;         \
    }

// The qs plane entry (16 bytes) of sub-block `sub` of a Q4_K or Q5_K super-block: the file keeps
// sub-blocks 2c and 2c+1 in the low and high nibbles of qs[32c .. 32c+31].
__host__ __device__ static void k_nibble_plane(const uint8_t *qs /* (128) */, int sub,
                                               uint8_t *dst /* (16) */) {
    int c = sub / 2, shift = 4 * (sub % 2);
    for (int j = 0; j < 16; j++) {
        int lo = (qs[32 * c + j] >> shift) & 0xf, hi = (qs[32 * c + 16 + j] >> shift) & 0xf;
        dst[j] = (uint8_t)(lo | (hi << 4));
    }
}

// The planes of Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL and Q4_K (6.4b): file block src into planes at
// place blk.
__host__ __device__ static void repack_more(int type, const uint8_t *src, uint8_t *dst, size_t blk,
                                            size_t NB);

// Repack file block `file_blk` of a tensor with NB sub-blocks, n_sub per row, into the planes at
// dst, in the order so. A "block" is the file's block: 32 weights (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
// IQ4_NL) or 256 (the K-quants and IQ4_XS: 8 sub-blocks, which stay side by side in every order:
// rows are whole 32-sub-block chunks in step order).
__host__ __device__ static void repack_block(int type, const uint8_t *src /* one file block */,
                                             uint8_t *dst /* the tensor's planes, NB sub-blocks */,
                                             size_t file_blk, size_t NB, StepOrder so, int n_sub) {
    int small = type != GGML_TYPE_IQ4_XS && type != GGML_TYPE_Q4_K && type != GGML_TYPE_Q5_K &&
                type != GGML_TYPE_Q6_K;
    size_t g0 = small ? file_blk : 8 * file_blk; // its first sub-block, row by row
    size_t blk = plane_g(so, (int)(g0 / n_sub), (int)(g0 % n_sub), n_sub);
    if (!small) blk /= 8;                        // its place in the planes
    if (type == GGML_TYPE_Q4_0) {
        const block_q4_0 *b = (const block_q4_0 *)src;
        memcpy(dst + 16 * blk, b->qs, 16);
        memcpy(dst + 16 * NB + 2 * blk, &b->d, 2);
    } else if (type == GGML_TYPE_IQ4_XS) {
        const block_iq4_xs *b = (const block_iq4_xs *)src;
        for (int sub = 0; sub < 8; sub++)
            for (int k = 0; k < 4; k++) {
                uint32_t w = iq4_plane_word(b->qs + 16 * sub, k);
                memcpy(dst + 16 * (8 * blk + sub) + 4 * k, &w, 4); // little-endian, host and GPU
            }
        uint64_t hdr = b->d;
        for (int i = 0; i < 8; i++) hdr |= (uint64_t)iq4_xs_ls(b, i) << (16 + 6 * i);
        memcpy(dst + 16 * NB + 8 * blk, &hdr, 8); // little-endian, host and GPU alike
    } else if (type == GGML_TYPE_Q5_K) {
        const block_q5_K *b = (const block_q5_K *)src;
        for (int sub = 0; sub < 8; sub++) {
            size_t g = 8 * blk + sub;
            uint32_t qh = 0;
            k_nibble_plane(b->qs, sub, dst + 16 * g);
            for (int e = 0; e < 32; e++) qh |= (uint32_t)((b->qh[e] >> sub) & 1) << e;
            memcpy(dst + 16 * NB + 4 * g, &qh, 4);
        }
        memcpy(dst + 20 * NB + 16 * blk, b, 16); // d, dmin, scales[12]
    } else if (type == GGML_TYPE_Q6_K) {
        const block_q6_K *b = (const block_q6_K *)src;
        for (int sub = 0; sub < 8; sub++) {
            size_t g = 8 * blk + sub;
            int n = sub / 4, j = sub % 4;
            const uint8_t *ql = b->ql + 64 * n + 32 * (j % 2), *qh = b->qh + 32 * n;
            uint8_t lo4[32], hi2[32];
            for (int e = 0; e < 32; e++) {
                lo4[e] = (ql[e] >> (4 * (j / 2))) & 0xf;
                hi2[e] = (qh[e] >> (2 * j)) & 3;
            }
            for (int i = 0; i < 16; i++) dst[16 * g + i] = (uint8_t)(lo4[i] | (lo4[i + 16] << 4));
            uint8_t w[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            for (int half = 0; half < 2; half++)
                for (int m = 0; m < 4; m++)
                    for (int bb = 0; bb < 4; bb++)
                        w[4 * half + bb] |= (uint8_t)(hi2[16 * half + 4 * m + bb] << (2 * m));
            memcpy(dst + 16 * NB + 8 * g, w, 8);
        }
        memcpy(dst + 24 * NB + 16 * blk, b->scales, 16);
        memcpy(dst + 26 * NB + 2 * blk, &b->d, 2);
    } else {
        repack_more(type, src, dst, blk, NB);
    }
}

// C twin of repack_kernel: n_blocks file blocks into the planes, one after the other.
static void repack_c(int type, const uint8_t *src /* (n_blocks) file blocks */,
                     uint8_t *dst /* planes, NB sub-blocks */, size_t n_blocks, size_t NB,
                     StepOrder so, int n_sub) {
    for (size_t i = 0; i < n_blocks; i++)
        repack_block(type, src + i * TYPE_TRAITS[type].type_size, dst, i, NB, so, n_sub);
}

// The repack at upload, one thread per file block. C twin: repack_c.
__global__ void repack_kernel(int type, int type_size,
                              const uint8_t *src /* (n_blocks) file blocks */,
                              uint8_t *dst /* planes, NB sub-blocks */, size_t b0, size_t n_blocks,
                              size_t NB, StepOrder so, int n_sub) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n_blocks) repack_block(type, src + i * type_size, dst, b0 + i, NB, so, n_sub);
}

// --- 6.4 one sub-block times one activation block, per fast type ---------------------------------
// sum_{e<32} w[e] * x^[e] for sub-block g of the weights, where x^ = s * X is the quantized
// activation block. The weights' 32 values are rebuilt as int8 lanes of eight 32-bit words (lo[k]:
// elements 4k..4k+3, hi[k]: 16+4k..16+4k+3), which pair with the activation chunks as stored.

typedef struct {
    int4 h0, h1, l0, l1; // the four 16-byte chunks of X = 256*H + L
    float s;
    int sum;
} XBlock;

__device__ __forceinline__ int dp4a(int a, int b, int c) { return __dp4a(a, b, c); }

// GPU-scope release/acquire fence (PTX fence.acq_rel.gpu, sm_70+). The mat-vecs' counters need no
// more: a writer's stores, this fence, then its atomicAdd; a reader's atomicAdd that sees the
// count, this fence, then its loads. __threadfence() is the sequentially consistent fence.sc.gpu.
__device__ __forceinline__ void fence_acq_rel(void) {
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
}

// ah += sum over 16 elements of q[e] * H[e], al += the same with L
// (q: 4 words of int8; X = 256*H + L)
__device__ __forceinline__ void dot16_acc(const int q[4], const int4 &H, const int4 &L, int &ah,
                                          int &al) {
    const int *h = (const int *)&H, *l = (const int *)&L;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        ah = dp4a(q[k], h[k], ah);
        al = dp4a(q[k], l[k], al);
    }
}
// sum over 16 elements of q[e] * X[e]
__device__ __forceinline__ int dot16(const int q[4], const int4 &H, const int4 &L) {
    int ah = 0, al = 0;
    dot16_acc(q, H, L, ah, al);
    return 256 * ah + al;
}
// the whole block: elements 0..15 in lo, 16..31 in hi; one chain for H and one for L over all 32
// (|sum q*H| <= 32 * 128 * 127: no overflow in 256 * ah)
__device__ __forceinline__ int dot_q_x(const int lo[4], const int hi[4], const XBlock &x) {
    int ah = 0, al = 0;
    dot16_acc(lo, x.h0, x.l0, ah, al);
    dot16_acc(hi, x.h1, x.l1, ah, al);
    return 256 * ah + al;
}

// 8 nibbles of a 32-bit word: low nibbles and high nibbles as 4 bytes each
__device__ __forceinline__ void nibbles(int w, int *lo, int *hi) {
    *lo = w & 0x0f0f0f0f;
    *hi = (w >> 4) & 0x0f0f0f0f;
}

// The dot runs in two steps, so that a thread can put the loads of all its rows in flight before it
// waits for any of them:
//   sub_load<TYPE>(W, g, NB) -> WSub   the sub-block's bytes: its quants, then scales, high bits
//   sub_dot<TYPE>(w, sub, x, lut)      sum_{e<32} w[e] * x^[e], from registers (sub = g % 8, the
//                                      sub-block's place in its 256-weight super-block)
typedef struct {
    int4 q;  // the 16-byte quants of the qs plane
    int4 h;  // per type: the super-block header, high bits, scales
    int e;   // per type: one more word
} WSub;

// Weight loads of the mat-vecs: ld.global.cs, "cache streaming": the lines are allocated
// evict-first in L1 and L2. A token streams ~15 GB of weights through a 50 MB L2 (6 MB on a V100);
// with normal loads they would push everything else out of it on the way (the kernels'
// instructions, the input vectors, the KV cache, the norms' weights), so that every launch would
// start on DRAM misses. Not the read-only path (__ldg, ld.global.nc): there ptxas may drop a loaded
// register and load it again next to its use, undoing the loads in flight the kernels arrange.
__device__ __forceinline__ int4 ldw(const int4 *p) {
    int4 v;
    asm volatile("ld.global.cs.v4.s32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}
__device__ __forceinline__ int2 ldw(const int2 *p) {
    int2 v;
    asm volatile("ld.global.cs.v2.s32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}
__device__ __forceinline__ int ldw(const int *p) {
    int v;
    asm volatile("ld.global.cs.s32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}
__device__ __forceinline__ unsigned short ldw(const unsigned short *p) {
    unsigned short v;
    asm volatile("ld.global.cs.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}

// The mat-vecs' copy of the tables' first words. prmt's first source must be a register (the
// second may be an immediate). Given as constants, the sm_90 compilers (CUDA 13's ptxas, and the
// driver's JIT of the sm_70 PTX) rebuild the constant in a fresh register before nearly every prmt
// that uses it; read from memory once per run, they stay in two registers.
typedef struct { int a0, d0; } Iq4Lut;
__device__ Iq4Lut d_iq4_lut = {(int)IQ4_A0, (int)IQ4_D0}; // never written: not const, so not folded

template <int TYPE>
__device__ WSub sub_load(const uint8_t *W /* planes, NB sub-blocks */, unsigned g, size_t NB);
template <int TYPE>
__device__ float sub_dot(const WSub &w, int sub, const XBlock &x, const Iq4Lut &lut);

// Q4_0: w = d * (q - 8)   ->   d * s * (sum q*X - 8 * sum X)
template <>
__device__ __forceinline__ WSub sub_load<GGML_TYPE_Q4_0>(const uint8_t *W, unsigned g, size_t NB) {
    WSub w;
    w.q = ldw((const int4 *)W + g);
    w.e = ldw((const unsigned short *)(W + 16 * NB) + g); // d
    return w;
}
template <>
__device__ __forceinline__ float sub_dot<GGML_TYPE_Q4_0>(const WSub &w, int, const XBlock &x,
                                                         const Iq4Lut &) {
    float d = fp16_to_f32((uint16_t)w.e);
    const int *qw = (const int *)&w.q;
    int lo[4], hi[4];
#pragma unroll
    for (int k = 0; k < 4; k++) nibbles(qw[k], &lo[k], &hi[k]);
    return d * x.s * (float)(dot_q_x(lo, hi, x) - 8 * x.sum);
}

// IQ4 values of the 8 codes of a plane word, as int8: *lo gets elements 4k..4k+3 (the codes in the
// low 16 bits), *hi elements 16+4k..16+4k+3 (the high 16 bits). prmt.b32 picks 4 bytes out of two
// registers, byte n by selector nibble n: its 3 low bits index the 8 bytes, and its 4th bit, when
// set, returns the sign of the picked byte spread over all 8 bits instead of the byte itself. With
// the codes of iq4_code (bits 0-2: j, bit 3: from table A):
//   a = prmt(A, code & 7) = A[j]
//   e = prmt(D, code)     = D[j] = B[j] - A[j]  when bit 3 is clear,  0 (D[j] >= 0) when set
//   a + e                 = B[j] or A[j]: the value, in 9 instructions per 8 weights.
// The sum is one 32-bit add for all four bytes: A[j] + D[j] = B[j] has A[j]'s sign, so no byte
// carries into the next (a negative byte 0x80..0xff stays below 0x100, a positive one below 0x80).
// An add rather than an xor leaves ptxas free to issue some of them on the FMA pipe (IMAD) instead
// of the ALU pipe that the masks, shifts and prmt keep busy.
// prmt() and this function run on the host too (the CI tests check the tables against kvalues).
__host__ __device__ __forceinline__ int prmt(int a, int b, int sel) {
#ifdef __CUDA_ARCH__
    int d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
#else
    uint64_t src = (uint32_t)a | (uint64_t)(uint32_t)b << 32;
    uint32_t d = 0;
    for (int n = 0; n < 4; n++) {
        int s = (sel >> (4 * n)) & 0xf;
        uint32_t byte = (uint32_t)(src >> (8 * (s & 7))) & 0xff;
        if (s & 8) byte = byte & 0x80 ? 0xff : 0x00;
        d |= byte << (8 * n);
    }
    return (int)d;
#endif
}
// One plane word worked through. Elements 4k..4k+3 have kvalues indices 0, 5, 9, 14 (values
// -127, -35, 13, 89); elements 16+4k..16+4k+3 have 7, 8, 3, 15 (values -10, 1, -65, 113).
//   codes (iq4_code), lowest nibble first:  8 1 d 6  3 c b 7  ->  w = 0x7bc36d18
//   low half:  prmt(A, w & 0x7777 = 0x6510) = A[0] A[1] A[5] A[6] = -127 -104  13  25
//              prmt(D, w          = 0x6d18) =  0   D[1]  0   D[6] =    0   69   0  64
//              *lo = the byte sums                                 = -127  -35  13  89
//   high half: prmt(A, 0x7343) = A[3] A[4] A[3] A[7] = -65   1 -65  38
//              prmt(D, 0x7bc3) = D[3]  0    0   D[7] =  55   0   0  75
//              *hi                                   = -10   1 -65 113
// (test_iq4_planes checks this word.)
// a0, d0: the tables' first words (IQ4_A0, IQ4_D0; Iq4Lut above says why they are arguments).
__host__ __device__ __forceinline__ void iq4_lookup8(int w, int a0, int d0, int *lo, int *hi) {
    int m = w & 0x77777777;
    *lo = (int)((uint32_t)prmt(a0, IQ4_A1, m) + (uint32_t)prmt(d0, IQ4_D1, w));
    *hi = (int)((uint32_t)prmt(a0, IQ4_A1, m >> 16) + (uint32_t)prmt(d0, IQ4_D1, w >> 16));
}
__host__ __device__ __forceinline__ void iq4_lookup8(int w, int *lo, int *hi) {
    iq4_lookup8(w, (int)IQ4_A0, (int)IQ4_D0, lo, hi);
}

// IQ4_XS: w = d * (ls - 32) * kvalues[q];  h.x, h.y = the super-block's header entry (d, 8 scales)
template <>
__device__ __forceinline__ WSub sub_load<GGML_TYPE_IQ4_XS>(const uint8_t *W, unsigned g,
                                                           size_t NB) {
    WSub w;
    w.q = ldw((const int4 *)W + g);
    int2 hdr = ldw((const int2 *)(W + 16 * NB) + g / 8);
    w.h.x = hdr.x;
    w.h.y = hdr.y;
    return w;
}
template <>
__device__ __forceinline__ float sub_dot<GGML_TYPE_IQ4_XS>(const WSub &w, int ib, const XBlock &x,
                                                           const Iq4Lut &lut) {
    int ls = iq4_plane_ls((uint32_t)w.h.x, (uint32_t)w.h.y, ib);
    float d = fp16_to_f32((uint16_t)(w.h.x & 0xffff));
    const int *qw = (const int *)&w.q;
    int lo[4], hi[4];
#pragma unroll
    for (int k = 0; k < 4; k++) iq4_lookup8(qw[k], lut.a0, lut.d0, &lo[k], &hi[k]);
    return d * (float)(ls - 32) * x.s * (float)dot_q_x(lo, hi, x);
}

// Spread 4 bits t (bit i = 5th bit of element i) to bit 4 of bytes 0..3:
// t * (1 + 2^7 + 2^14 + 2^21) << 4 puts bit i at 8i + 4 with no carries between the copies.
__device__ __forceinline__ int spread4_bit4(int t) { return (t * 0x02040810) & 0x10101010; }
// The 5-bit values of a sub-block (Q5_K, Q5_0, Q5_1) as int8 lanes: the nibbles of q (as nibbles)
// and the 32 5th bits e (bit i: element i) at bit 4
__device__ __forceinline__ void q5_values(const int4 &q, int e, int *lo, int *hi) {
    const int *qw = (const int *)&q;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        nibbles(qw[k], &lo[k], &hi[k]);
        lo[k] |= spread4_bit4((e >> (4 * k)) & 0xf);
        hi[k] |= spread4_bit4((e >> (16 + 4 * k)) & 0xf);
    }
}

// Q5_K: w = d * sc * q5 - dmin * m   ->   s * (d * sc * sum q5*X - dmin * m * sum X)
// h = the super-block header (d | dmin << 16, scales[0..3], [4..7], [8..11]), e = the 32 5th bits
// k_scale_min on the header's words (registers, no byte array): s0, s1, s2 = scales[0..3], [4..7],
// [8..11]; sub-block `sub` uses byte sub%4 of each.
__device__ __forceinline__ void k_scale_min_words(int sub, uint32_t s0, uint32_t s1, uint32_t s2,
                                                  int *sc, int *m) {
    int shift = 8 * (sub % 4);
    int b0 = (s0 >> shift) & 0xff, b1 = (s1 >> shift) & 0xff, b2 = (s2 >> shift) & 0xff;
    *sc = sub < 4 ? b0 & 63 : (b2 & 0xf) | ((b0 >> 6) << 4);
    *m = sub < 4 ? b1 & 63 : (b2 >> 4) | ((b1 >> 6) << 4);
}
template <>
__device__ __forceinline__ WSub sub_load<GGML_TYPE_Q5_K>(const uint8_t *W, unsigned g, size_t NB) {
    WSub w;
    w.q = ldw((const int4 *)W + g);
    w.e = ldw((const int *)(W + 16 * NB) + g);
    w.h = ldw((const int4 *)(W + 20 * NB) + g / 8);
    return w;
}
template <>
__device__ __forceinline__ float sub_dot<GGML_TYPE_Q5_K>(const WSub &w, int sub, const XBlock &x,
                                                         const Iq4Lut &) {
    int scale, mn;
    k_scale_min_words(sub, w.h.y, w.h.z, w.h.w, &scale, &mn);
    // q5_values written out, so that the Q5_K decode kernels stay the compiled code that
    // test/PERF_NOTES.md measured (called as a function, the same operations compile otherwise)
    const int *qw = (const int *)&w.q;
    int lo[4], hi[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        nibbles(qw[k], &lo[k], &hi[k]);
        lo[k] |= spread4_bit4((w.e >> (4 * k)) & 0xf);
        hi[k] |= spread4_bit4((w.e >> (16 + 4 * k)) & 0xf);
    }
    float2 f = __half22float2(*(const __half2 *)&w.h.x);
    return x.s * (f.x * scale * (float)dot_q_x(lo, hi, x) - f.y * mn * (float)x.sum);
}

// Q6_K: w = d * sc * (q6 - 32), one int8 scale per 16 weights
// h.x, h.y = the high 2 bits (qh plane), h.z = the two int8 scales of this sub-block, h.w = d
template <>
__device__ __forceinline__ WSub sub_load<GGML_TYPE_Q6_K>(const uint8_t *W, unsigned g, size_t NB) {
    WSub w;
    w.q = ldw((const int4 *)W + g);
    int2 qh = ldw((const int2 *)(W + 16 * NB) + g);
    w.h.x = qh.x;
    w.h.y = qh.y;
    w.h.z = ldw((const unsigned short *)(W + 24 * NB + 16 * (g / 8)) + g % 8);
    w.h.w = ldw((const unsigned short *)(W + 26 * NB) + g / 8);
    return w;
}
template <>
__device__ __forceinline__ float sub_dot<GGML_TYPE_Q6_K>(const WSub &w, int, const XBlock &x,
                                                         const Iq4Lut &) {
    int sc0 = (int8_t)(w.h.z & 0xff), sc1 = (int8_t)((w.h.z >> 8) & 0xff);
    float d = fp16_to_f32((uint16_t)w.h.w);
    const int *qw = (const int *)&w.q;
    int lo[4], hi[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        nibbles(qw[k], &lo[k], &hi[k]);
        // high 2 bits of elements 4k..4k+3 sit at bits 2k..2k+1 of each byte of h.x (16+4k..: h.y)
        int hl = ((w.h.x >> (2 * k)) & 0x03030303) << 4;
        int hh = ((w.h.y >> (2 * k)) & 0x03030303) << 4;
        lo[k] = __vsub4(lo[k] | hl, 0x20202020); // q6 - 32 as signed bytes
        hi[k] = __vsub4(hi[k] | hh, 0x20202020);
    }
    // the two 16-weight halves have their own scales
    return d * x.s * (float)(sc0 * dot16(lo, x.h0, x.l0) + sc1 * dot16(hi, x.h1, x.l1));
}

// Activation block u of a quantized vector (nb blocks): its four chunks, scale and sum.
__device__ __forceinline__ XBlock load_xblock(const XQ &xq, int u, int nb) {
    XBlock b;
    b.h0 = xq.q[u];
    b.h1 = xq.q[nb + u];
    b.l0 = xq.q[2 * nb + u];
    b.l1 = xq.q[3 * nb + u];
    b.s = xq.s[u];
    b.sum = xq.sum[u];
    return b;
}

// --- 6.4b the other fast types: Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q4_K ----------------------------
// Speed: the six other quantized types get what the four above have: planes, sub_load and sub_dot,
// so that every fast kernel and the prefill's product run them. The simple mat-vec (6.1) computes
// the same values from the file's layout (dequant_unit is their definition) at a seventh of the
// bandwidth (test/PERF_NOTES.md, "Fast types for the files people download"), but the engine
// keeps no such path for them: without this subsection these six types do not run on the GPU. A
// first reading takes the four types of 6.4 as the model of these.
// Planes (6.3's notation), the qs plane as the file's qs unless said:
//   Q4_1        dm plane (NB x 4 B): d | m << 16 (fp16 each)
//   Q5_0        qh plane (NB x 4 B): the file's qh, bit e = 5th bit of element e;
//               d plane (NB x fp16)
//   Q5_1        qh plane as Q5_0's; dm plane as Q4_1's, at 20 NB
//   Q8_0        qs plane of NB x 32 B: the 32 int8 values as in the file; d plane (NB x fp16)
//   IQ4_NL      qs plane as IQ4_XS's (iq4_plane_word); d plane (NB x fp16)
//   Q4_K        qs plane as Q5_K's (k_nibble_plane); hdr plane (NB/8 x 16 B): d, dmin, scales[12]
// C twin: repack_c (through repack_block), matvec_xq_c.
__host__ __device__ static void repack_more(int type, const uint8_t *src, uint8_t *dst, size_t blk,
                                            size_t NB) {
    if (type == GGML_TYPE_Q4_1) {
        const block_q4_1 *b = (const block_q4_1 *)src;
        memcpy(dst + 16 * blk, b->qs, 16);
        memcpy(dst + 16 * NB + 4 * blk, &b->d, 4); // d, m
    } else if (type == GGML_TYPE_Q5_0) {
        const block_q5_0 *b = (const block_q5_0 *)src;
        memcpy(dst + 16 * blk, b->qs, 16);
        memcpy(dst + 16 * NB + 4 * blk, b->qh, 4);
        memcpy(dst + 20 * NB + 2 * blk, &b->d, 2);
    } else if (type == GGML_TYPE_Q5_1) {
        const block_q5_1 *b = (const block_q5_1 *)src;
        memcpy(dst + 16 * blk, b->qs, 16);
        memcpy(dst + 16 * NB + 4 * blk, b->qh, 4);
        memcpy(dst + 20 * NB + 4 * blk, &b->d, 4); // d, m
    } else if (type == GGML_TYPE_Q8_0) {
        const block_q8_0 *b = (const block_q8_0 *)src;
        memcpy(dst + 32 * blk, b->qs, 32);
        memcpy(dst + 32 * NB + 2 * blk, &b->d, 2);
    } else if (type == GGML_TYPE_IQ4_NL) {
        const block_iq4_nl *b = (const block_iq4_nl *)src;
        for (int k = 0; k < 4; k++) {
            uint32_t w = iq4_plane_word(b->qs, k);
            memcpy(dst + 16 * blk + 4 * k, &w, 4); // little-endian, host and GPU
        }
        memcpy(dst + 16 * NB + 2 * blk, &b->d, 2);
    } else if (type == GGML_TYPE_Q4_K) {
        const block_q4_K *b = (const block_q4_K *)src;
        for (int sub = 0; sub < 8; sub++) k_nibble_plane(b->qs, sub, dst + 16 * (8 * blk + sub));
        memcpy(dst + 16 * NB + 16 * blk, b, 16); // d, dmin, scales[12]
    }
}

// Q4_1: w = d * q + m   ->   s * (d * sum q*X + m * sum X);  e = d | m << 16
template <>
__device__ __forceinline__ WSub sub_load<GGML_TYPE_Q4_1>(const uint8_t *W, unsigned g, size_t NB) {
    WSub w;
    w.q = ldw((const int4 *)W + g);
    w.e = ldw((const int *)(W + 16 * NB) + g);
    return w;
}
template <>
__device__ __forceinline__ float sub_dot<GGML_TYPE_Q4_1>(const WSub &w, int, const XBlock &x,
                                                         const Iq4Lut &) {
    const int *qw = (const int *)&w.q;
    int lo[4], hi[4];
#pragma unroll
    for (int k = 0; k < 4; k++) nibbles(qw[k], &lo[k], &hi[k]);
    float2 dm = __half22float2(*(const __half2 *)&w.e);
    return x.s * (dm.x * (float)dot_q_x(lo, hi, x) + dm.y * (float)x.sum);
}
// Q5_0: w = d * (q5 - 16)   ->   d * s * (sum q5*X - 16 * sum X);  e = the 5th bits, h.x = d
template <>
__device__ __forceinline__ WSub sub_load<GGML_TYPE_Q5_0>(const uint8_t *W, unsigned g, size_t NB) {
    WSub w;
    w.q = ldw((const int4 *)W + g);
    w.e = ldw((const int *)(W + 16 * NB) + g);
    w.h.x = ldw((const unsigned short *)(W + 20 * NB) + g);
    return w;
}
template <>
__device__ __forceinline__ float sub_dot<GGML_TYPE_Q5_0>(const WSub &w, int, const XBlock &x,
                                                         const Iq4Lut &) {
    int lo[4], hi[4];
    q5_values(w.q, w.e, lo, hi);
    float d = fp16_to_f32((uint16_t)w.h.x);
    return d * x.s * (float)(dot_q_x(lo, hi, x) - 16 * x.sum);
}
// Q5_1: w = d * q5 + m   ->   s * (d * sum q5*X + m * sum X);  e = the 5th bits, h.x = d | m << 16
template <>
__device__ __forceinline__ WSub sub_load<GGML_TYPE_Q5_1>(const uint8_t *W, unsigned g, size_t NB) {
    WSub w;
    w.q = ldw((const int4 *)W + g);
    w.e = ldw((const int *)(W + 16 * NB) + g);
    w.h.x = ldw((const int *)(W + 20 * NB) + g);
    return w;
}
template <>
__device__ __forceinline__ float sub_dot<GGML_TYPE_Q5_1>(const WSub &w, int, const XBlock &x,
                                                         const Iq4Lut &) {
    int lo[4], hi[4];
    q5_values(w.q, w.e, lo, hi);
    float2 dm = __half22float2(*(const __half2 *)&w.h.x);
    return x.s * (dm.x * (float)dot_q_x(lo, hi, x) + dm.y * (float)x.sum);
}
// Q8_0: w = d * q   ->   d * s * sum q*X: the plane's bytes are already the int8 lanes.
// q = elements 0..15, h = 16..31, e = d
template <>
__device__ __forceinline__ WSub sub_load<GGML_TYPE_Q8_0>(const uint8_t *W, unsigned g, size_t NB) {
    WSub w;
    w.q = ldw((const int4 *)W + 2 * (size_t)g);
    w.h = ldw((const int4 *)W + 2 * (size_t)g + 1);
    w.e = ldw((const unsigned short *)(W + 32 * NB) + g); // d
    return w;
}
template <>
__device__ __forceinline__ float sub_dot<GGML_TYPE_Q8_0>(const WSub &w, int, const XBlock &x,
                                                         const Iq4Lut &) {
    float d = fp16_to_f32((uint16_t)w.e);
    return d * x.s * (float)dot_q_x((const int *)&w.q, (const int *)&w.h, x);
}
// IQ4_NL: w = d * kvalues[q]   ->   d * s * sum kvalues[q]*X, the values by iq4_lookup8; e = d
template <>
__device__ __forceinline__ WSub sub_load<GGML_TYPE_IQ4_NL>(const uint8_t *W, unsigned g,
                                                           size_t NB) {
    WSub w;
    w.q = ldw((const int4 *)W + g);
    w.e = ldw((const unsigned short *)(W + 16 * NB) + g); // d
    return w;
}
template <>
__device__ __forceinline__ float sub_dot<GGML_TYPE_IQ4_NL>(const WSub &w, int, const XBlock &x,
                                                           const Iq4Lut &lut) {
    float d = fp16_to_f32((uint16_t)w.e);
    const int *qw = (const int *)&w.q;
    int lo[4], hi[4];
#pragma unroll
    for (int k = 0; k < 4; k++) iq4_lookup8(qw[k], lut.a0, lut.d0, &lo[k], &hi[k]);
    return d * x.s * (float)dot_q_x(lo, hi, x);
}
// Q4_K: Q5_K without the 5th bit.   w = d * sc * q - dmin * m
//   ->   s * (d * sc * sum q*X - dmin * m * sum X);   h = the super-block header, as Q5_K's
template <>
__device__ __forceinline__ WSub sub_load<GGML_TYPE_Q4_K>(const uint8_t *W, unsigned g, size_t NB) {
    WSub w;
    w.q = ldw((const int4 *)W + g);
    w.h = ldw((const int4 *)(W + 16 * NB) + g / 8);
    return w;
}
template <>
__device__ __forceinline__ float sub_dot<GGML_TYPE_Q4_K>(const WSub &w, int sub, const XBlock &x,
                                                         const Iq4Lut &) {
    int scale, mn;
    k_scale_min_words(sub, w.h.y, w.h.z, w.h.w, &scale, &mn);
    const int *qw = (const int *)&w.q;
    int lo[4], hi[4];
#pragma unroll
    for (int k = 0; k < 4; k++) nibbles(qw[k], &lo[k], &hi[k]);
    float2 f = __half22float2(*(const __half2 *)&w.h.x);
    return x.s * (f.x * scale * (float)dot_q_x(lo, hi, x) - f.y * mn * (float)x.sum);
}

// FAST_TYPE_SWITCH for the four types of 6.4 only. The kernels that take a mix of types switch on
// each matrix's type inside; they are built for these four (MIX_FOUR) and for all the fast types
// (MIX_ALL), and a launch whose types are among the four takes the first: a switch's code grows
// with its cases, and its registers are those of its most demanding case.
#define FOUR_TYPE_SWITCH(type, LAUNCH)                          \
    switch (type) {                                             \
    case GGML_TYPE_Q4_0: LAUNCH(GGML_TYPE_Q4_0); break;         \
    case GGML_TYPE_IQ4_XS: LAUNCH(GGML_TYPE_IQ4_XS); break;     \
    case GGML_TYPE_Q5_K: LAUNCH(GGML_TYPE_Q5_K); break;         \
    case GGML_TYPE_Q6_K: LAUNCH(GGML_TYPE_Q6_K); break;         \
    }
enum { MIX_FOUR = -1, MIX_ALL = -2 };
// MIX_FOUR when every type of types[0..n) is one of the four, else MIX_ALL
static int mix_kind(const int *types, int n) {
    for (int i = 0; i < n; i++)
        if (types[i] != GGML_TYPE_Q4_0 && types[i] != GGML_TYPE_IQ4_XS &&
            types[i] != GGML_TYPE_Q5_K && types[i] != GGML_TYPE_Q6_K)
            return MIX_ALL;
    return MIX_FOUR;
}

// --- 6.4c float weights in 16-byte loads --------------------------------------------------------
// Speed: F32, F16 and BF16 weights (the exact reference files) keep fp32 inputs and the file's
// layout; on the simple mat-vec (6.1) each lane reads its own 32-weight unit, 64 or 128 bytes from
// its neighbour's, element by element. Here one warp takes one row: its 32 lanes read 16-byte
// vectors side by side (512 contiguous bytes a load), and each lane loads FLOAT_AHEAD vectors
// before it multiplies any, so that a warp has FLOAT_AHEAD x 512 bytes in flight (2 KB as set):
// what keeps a stream of reads near the memory's bandwidth is the bytes in flight. One row a warp
// and 4 vectors ahead measured fastest (test/PERF_NOTES.md, "Float weights").
// Up to FLOAT_BATCH matrices of one type that read the same x run in one launch, their rows one
// after another (q, k and v; gate and up; DeltaNet's four in-projections): one launch instead of
// one a matrix, and k's and v's few rows do not run alone on a GPU they cannot fill.
// Rows whose length is not a multiple of a vector stay on 6.1. C twin: matvec_c.
#define FLOAT_AHEAD 4 // 16-byte vectors of its row a lane loads before it multiplies
#define FLOAT_BATCH 4 // matrices a launch may take

// The matrices of one launch. Row g of the launch is row g - first[i] of W_i, where
// first[i] <= g < first[i + 1]; first[n] is the launch's rows in all.
struct FloatMv {
    const uint8_t *W[FLOAT_BATCH];  // (n_out_i, n_in) of one float type
    const float *bias[FLOAT_BATCH]; // (n_out_i) or NULL
    float *y[FLOAT_BATCH];          // (n_out_i)
    int first[FLOAT_BATCH + 1];
    int n, accumulate; // n matrices; y_i = W_i x (+ bias_i), added into y_i when accumulate
};

// The 16-byte vector v of a float row as fp32: 4 (F32) or 8 (F16, BF16) values into w.
template <int TYPE> __device__ __forceinline__ void float_vec(const int4 &v, float *w) {
    const uint32_t *u = (const uint32_t *)&v;
    if (TYPE == GGML_TYPE_F32) {
#pragma unroll
        for (int i = 0; i < 4; i++) w[i] = __uint_as_float(u[i]);
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            w[2 * i] = TYPE == GGML_TYPE_F16 ? fp16_to_f32((uint16_t)u[i]) : bf16_to_f32(u[i]);
            w[2 * i + 1] = TYPE == GGML_TYPE_F16 ? fp16_to_f32((uint16_t)(u[i] >> 16))
                                                 : bf16_to_f32((uint16_t)(u[i] >> 16));
        }
    }
}

// y_i[r] = W_i[r,:] . x (+ bias_i[r]) (+ y_i[r]), one row per warp. p is read in place from the
// launch's parameters (__grid_constant__): indexed by a run-time m, a copy would go to each
// thread's local memory. C twin: matvec_c.
template <int TYPE>
__global__ void matvec_float_kernel(const __grid_constant__ FloatMv p, const float *x /* (n_in) */,
                                    int n_in) {
    const int V = TYPE == GGML_TYPE_F32 ? 4 : 8;               // values per 16-byte vector
    const size_t esize = TYPE == GGML_TYPE_F32 ? 4 : 2;        // bytes per value
    int g = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) / WARP); // the launch's row
    int lane = threadIdx.x % WARP;
    if (g >= p.first[p.n]) return;
    int m = 0; // the matrix of row g
    while (g >= p.first[m + 1]) m++;
    int row = g - p.first[m];
    const uint8_t *w = p.W[m] + (size_t)row * n_in * esize;
    float acc = 0.0f;
    for (int i0 = V * lane; i0 < n_in; i0 += V * WARP * FLOAT_AHEAD) {
        // all the loads first: vector a at i0 + a * V * WARP (vectors past the row's end none)
        int4 v[FLOAT_AHEAD];
#pragma unroll
        for (int a = 0; a < FLOAT_AHEAD; a++) {
            int i = i0 + a * V * WARP;
            v[a] = i < n_in ? ldw((const int4 *)(w + i * esize)) : make_int4(0, 0, 0, 0);
        }
#pragma unroll
        for (int a = 0; a < FLOAT_AHEAD; a++) {
            int i = i0 + a * V * WARP;
            if (i >= n_in) break;
            float xv[V], wv[V];
#pragma unroll
            for (int k = 0; k < V; k += 4) *(float4 *)(xv + k) = *(const float4 *)(x + i + k);
            float_vec<TYPE>(v[a], wv);
#pragma unroll
            for (int k = 0; k < V; k++) acc = fmaf(wv[k], xv[k], acc);
        }
    }
    float t = warp_sum(acc);
    if (lane == 0) {
        if (p.bias[m]) t += p.bias[m][row];
        p.y[m][row] = p.accumulate ? p.y[m][row] + t : t;
    }
}

// y_i = W_i x (+ bias_i) (+ y_i when accumulate) for i < n, on matvec_float_kernel in one launch
// when the W_i are of one float type and have rows of the same length, a whole number of 16-byte
// vectors; returns 0, launching nothing, when not.
static int matvec_float(int n, const Tensor *const *W, const float *const *bias,
                        float *const *y, const float *x /* (n_in) */, int accumulate,
                        cudaStream_t st) {
    if (n < 1 || n > FLOAT_BATCH) return 0;
    int type = W[0]->type, n_in = (int)W[0]->n_in;
    if (!is_float_weight(type) || n_in % (type == GGML_TYPE_F32 ? 4 : 8)) return 0;
    FloatMv p;
    memset(&p, 0, sizeof p);
    for (int i = 0; i < n; i++) {
        if (W[i]->type != type || W[i]->n_in != n_in) return 0;
        p.W[i] = (const uint8_t *)W[i]->dev;
        p.bias[i] = bias[i];
        p.y[i] = y[i];
        p.first[i + 1] = p.first[i] + (int)W[i]->n_out;
    }
    p.n = n;
    p.accumulate = accumulate;
    if (!p.first[n]) return 1; // no rows
    unsigned blocks = (unsigned)((p.first[n] + 7) / 8); // 8 warps each
    if (type == GGML_TYPE_F32)
        matvec_float_kernel<GGML_TYPE_F32><<<blocks, 256, 0, st>>>(p, x, n_in);
    else if (type == GGML_TYPE_F16)
        matvec_float_kernel<GGML_TYPE_F16><<<blocks, 256, 0, st>>>(p, x, n_in);
    else matvec_float_kernel<GGML_TYPE_BF16><<<blocks, 256, 0, st>>>(p, x, n_in);
    KERNEL_CHECK();
    return 1;
}

// --- 6.5 the per-block mat-vec -------------------------------------------------------------------
// y[r] = W[r,:] . x (+ bias[r]) (+ y[r]) for the fast types. A block owns R consecutive rows and
// all its threads walk the rows' sub-blocks together (thread t takes sub-blocks t, t + T, ...), so
// every activation block a thread loads serves R rows, and even a short row keeps a whole block of
// loads in flight. Partial sums meet in a warp shuffle, then across warps in shared memory.
// C twin: matvec_xq_c.
#define FAST_ROWS 8          // rows per block: more rows share each activation load and put more
                             // bytes in flight; half of it for long rows and for every type's
                             // one-pass rows but Q5_K's and IQ4_XS's (matvec_blocks)
#define FAST_MAX_THREADS 256 // threads per block at most (fast_threads)
// LOADS_FIRST: a __syncwarp() between a pass's loads and its arithmetic. Left alone, ptxas issues
// the loads of row r+1 only once row r's arithmetic is under way (it saves registers that way):
// one or two loads in flight per thread. A warp barrier is a point no memory access may cross, so
// every load is issued before it, at the cost of registers for all of them. It pays for rows of
// several passes, for the batch kernel and for one-pass rows at 4 rows per block, and not for the
// one-pass rows of Q5_K and IQ4_XS at 8 (the extra registers cost resident blocks).
template <int TYPE, int R, bool LOADS_FIRST>
__device__ __forceinline__ void
fast_rows(const uint8_t *W,   // planes, NB = n_out * n_sub sub-blocks
          const XQ &xq,       // (n_sub) blocks of the input
          const float *bias,  // (n_out) or NULL
          float *y,           // (n_out)
          int n_sub, int n_out, int row0, int accumulate) {
    __shared__ float part[FAST_MAX_THREADS / WARP][R];
    int lane = threadIdx.x % WARP, wid = threadIdx.x / WARP, nw = blockDim.x / WARP;
    size_t NB = (size_t)n_out * n_sub;
    Iq4Lut lut = d_iq4_lut;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    // With the barrier the loop bound is the same for a whole warp (its first lane's sub-block):
    // __syncwarp() needs every lane, so lanes past the row's end redo its last sub-block and drop
    // the result. Without it, each thread stops at the end of the row.
    for (int u0 = threadIdx.x - (LOADS_FIRST ? lane : 0); u0 < n_sub; u0 += blockDim.x) {
        int u = LOADS_FIRST ? min(u0 + lane, n_sub - 1) : u0;
        // all R rows' loads first (rows past the end read the last row and are not written)
        WSub w[R];
#pragma unroll
        for (int r = 0; r < R; r++)
            w[r] = sub_load<TYPE>(W, (unsigned)min(row0 + r, n_out - 1) * n_sub + u, NB);
        XBlock xb = load_xblock(xq, u, n_sub);
        if (LOADS_FIRST) __syncwarp();
        if (!LOADS_FIRST || u0 + lane < n_sub) {
#pragma unroll
            for (int r = 0; r < R; r++) acc[r] += sub_dot<TYPE>(w[r], u % 8, xb, lut);
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        float v = warp_sum(acc[r]);
        if (lane == 0) part[wid][r] = v;
    }
    __syncthreads();
    if (threadIdx.x < R && row0 + (int)threadIdx.x < n_out) {
        int r = threadIdx.x;
        float v = 0.0f;
        for (int w = 0; w < nw; w++) v += part[w][r];
        if (bias) v += bias[row0 + r];
        y[row0 + r] = accumulate ? y[row0 + r] + v : v;
    }
}

// One matrix, R rows per block. C twin: matvec_xq_c.
template <int TYPE, int R, bool LOADS_FIRST>
__global__ void __launch_bounds__(FAST_MAX_THREADS)
matvec_fast_kernel(const uint8_t *W /* planes, NB = n_out * n_sub sub-blocks */,
                   XQ xq /* (n_sub) blocks */, const float *bias /* (n_out) or NULL */,
                   float *y /* (n_out) */, int n_sub, int n_out, int accumulate) {
    fast_rows<TYPE, R, LOADS_FIRST>(W, xq, bias, y, n_sub, n_out, blockIdx.x * R, accumulate);
}

#define BATCH_MAX 4 // matrices of one launch at most

// Up to four mat-vecs on the same input in one launch (q, k, v; or DeltaNet's qkv, z, beta, alpha):
// each block finds its matrix by its index; the matrices may have different fast types.
// C twin: matvec_xq_c per matrix.
typedef struct {
    const uint8_t *w[BATCH_MAX];    // planes of matrix i, NB = n_out[i] * n_sub sub-blocks
    const float *bias[BATCH_MAX];   // (n_out[i]) or NULL
    float *y[BATCH_MAX];            // (n_out[i]) out
    int type[BATCH_MAX], n_out[BATCH_MAX];
    int first_block[BATCH_MAX + 1]; // blocks before matrix i; first_block[n] = all blocks
    int n;
} MatVecBatch;

// MIX: MIX_FOUR or MIX_ALL, the types it switches over (FOUR_TYPE_SWITCH says why two). MIX_ALL
// asks for two blocks of 256 threads per SM (128 registers a thread): without that bound ptxas
// (CUDA 11.8, sm_70) gives its switch 165 registers, and one block an SM. (0: no such bound.)
// C twin: matvec_xq_c per matrix.
template <int MIX>
__global__ void __launch_bounds__(FAST_MAX_THREADS, MIX == MIX_ALL ? 2 : 0)
matvec_fast_batch_kernel(MatVecBatch b, XQ xq, int n_sub) {
    int m = 0;
    while (m + 1 < b.n && (int)blockIdx.x >= b.first_block[m + 1]) m++;
    int row0 = ((int)blockIdx.x - b.first_block[m]) * FAST_ROWS;
#define ROWS(T)                                                                                    \
    fast_rows<T, FAST_ROWS, true>(b.w[m], xq, b.bias[m], b.y[m], n_sub, b.n_out[m], row0, 0)
    if (MIX == MIX_FOUR) FOUR_TYPE_SWITCH(b.type[m], ROWS)
    else FAST_TYPE_SWITCH(b.type[m], ROWS)
#undef ROWS
}

// Threads per block for rows of n_sub sub-blocks: as few passes as 256 threads allow, the passes
// evenly filled, whole warps.
static int fast_threads(int n_sub) {
    int passes = (n_sub + FAST_MAX_THREADS - 1) / FAST_MAX_THREADS;
    int t = (n_sub + passes - 1) / passes;
    return (t + WARP - 1) / WARP * WARP;
}

// One matrix in planes on the per-block kernel: y = W x^ (+ bias) (+ y when accumulate).
static void matvec_blocks(const Tensor *W, const XQ &xq /* (n_in / 32) blocks */,
                          float *y /* (n_out) */, const float *bias /* (n_out) or NULL */,
                          int accumulate, cudaStream_t st) {
    const uint8_t *w = (const uint8_t *)W->dev;
    if (W->so.upw)
        die("mat-vec '%s': planes in step order, but the launch does not stream", W->name);
    // Rows longer than one pass of the block (the FFN down projections) take half the rows per
    // block, all loads first: twice the blocks, since each one walks its rows pass after pass.
    // So do the one-pass rows of every type but Q5_K and IQ4_XS: the loads are what a block waits
    // on. Those two take FAST_ROWS, no barrier, as measured on the 27B/32B files; Q4_0's shape
    // measured faster there and, for Q4_K and IQ4_NL, at 8B (test/PERF_NOTES.md, "Fast types,
    // round 2"); the other types take it by analogy.
    int n_in = (int)W->n_in, n_out = (int)W->n_out;
    int n_sub = n_in / 32, threads = fast_threads(n_sub), long_rows = n_sub > FAST_MAX_THREADS;
    int half = long_rows || (W->type != GGML_TYPE_Q5_K && W->type != GGML_TYPE_IQ4_XS);
    int R = half ? FAST_ROWS / 2 : FAST_ROWS, blocks = (n_out + R - 1) / R;
#define FAST(T)                                                                                    \
    if (half)                                                                                      \
        matvec_fast_kernel<T, FAST_ROWS / 2, true><<<blocks, threads, 0, st>>>(                    \
            w, xq, bias, y, n_sub, n_out, accumulate);                                             \
    else                                                                                           \
        matvec_fast_kernel<T, FAST_ROWS, false><<<blocks, threads, 0, st>>>(                       \
            w, xq, bias, y, n_sub, n_out, accumulate)
    FAST_TYPE_SWITCH(W->type, FAST)
#undef FAST
    KERNEL_CHECK();
}

// n matrices in planes on the per-block kernel, in one launch: y_i = W_i x^ (+ b_i).
static void matvec_blocks_batch(int n, const Tensor *const *W, const float *const *bias,
                                float *const *y, const XQ &xq, cudaStream_t st) {
    MatVecBatch b;
    memset(&b, 0, sizeof b);
    b.n = n;
    for (int i = 0; i < n; i++) {
        if (W[i]->so.upw)
            die("mat-vec '%s': planes in step order, but the launch does not stream", W[i]->name);
        b.w[i] = (const uint8_t *)W[i]->dev;
        b.bias[i] = bias[i];
        b.y[i] = y[i];
        b.type[i] = W[i]->type;
        b.n_out[i] = (int)W[i]->n_out;
        b.first_block[i + 1] = b.first_block[i] + (b.n_out[i] + FAST_ROWS - 1) / FAST_ROWS;
    }
    int n_sub = (int)W[0]->n_in / 32, blocks = b.first_block[n], threads = fast_threads(n_sub);
    if (mix_kind(b.type, n) == MIX_FOUR)
        matvec_fast_batch_kernel<MIX_FOUR><<<blocks, threads, 0, st>>>(b, xq, n_sub);
    else
        matvec_fast_batch_kernel<MIX_ALL><<<blocks, threads, 0, st>>>(b, xq, n_sub);
    KERNEL_CHECK();
}

// --- 6.6 the streaming mat-vec -------------------------------------------------------------------
// Speed: the launches whose warps get long runs of rows (gate/up, the DeltaNet in-projections, the
// output matrix) of the 27B/32B files stream at 91-96 % of copy bandwidth here, 73 % on 6.5
// (test/PERF_NOTES.md, "Mat-vec (section 6)"); rows of at most 4096 inputs never stream (6.8). A
// first reading can skip to 6.8: 6.5 computes the same y (up to the order of its sums).
//
// One launch computes up to BATCH_MAX matrices that read the same input (q, k, v; DeltaNet's qkv,
// z, beta, alpha; gate and up). Rows are taken MV_ROWS at a time (a row group) and cut into chunks
// of 32 sub-blocks (1024 weights): lane l of a warp takes sub-block 32*kk + l of chunk kk of every
// row of the group, so each activation block it loads serves MV_ROWS rows. The (group, chunk)
// units of all the matrices are laid end to end as one stream, and every warp of the grid takes an
// equal run of it:
//
//     | matrix 0: group 0 (kk = 0 1 2 ..) group 1 ... | matrix 1: ...         |
//     [ warp 0 run   ][ warp 1 run   ][ warp 2 run   ][ ...
//
// The grid is as many warps as the GPU holds at once (16 or 20 per SM, below): one wave, so no
// block waits for a free slot, and no block-wide barrier. Inside a run a warp keeps the next unit's
// weight loads in flight while it multiplies the current one: the moment row r of unit c has been
// multiplied, the loads of row r of unit c + 1 go out into the registers it freed. A group's 32
// lane sums per row meet in warp shuffles after its last chunk.
//
// Runs are cut wherever the equal split falls, so a group (its rows' dot products) may be shared by
// neighbouring warps, whose parts of the row sums meet in mv_rows_part. So every warp gets the same
// work however the shapes divide, and even a small matrix spreads over the whole GPU. Weights are
// loaded evict-first (ldw): they are read once, and L1 and L2 keep the input vector.
//
// C twin: matvec_xq_c per matrix.
#define MV_SM_THREADS 512  // threads per SM of the two-block and mixed shapes: 128 registers each
#define MV_MAX_WARPS 16384 // warps of one grid at most (an H200 holds 132 x 20 at 640 threads)

typedef struct {
    const uint8_t *w[BATCH_MAX];    // planes of matrix m, NB = n_out * n_sub sub-blocks
    const float *bias[BATCH_MAX];   // (n_out) or NULL
    float *y[BATCH_MAX];            // (n_out) out
    int type[BATCH_MAX], n_out[BATCH_MAX];
    int first_unit[BATCH_MAX + 1];  // units of the stream before matrix m; first_unit[n]: all
    int n, accumulate;              // accumulate: y += W x (the residual adds)
    int upw;                        // units per warp run
    StepOrder so[BATCH_MAX];        // the order of matrix m's planes (so.upw = 0: row by row; else
                                    // this launch's: upw and first_unit[m], checked at the launch)
} MvPlan;

// Where the parts of shared row groups meet (mv_rows_part); every entry is back at zero between
// launches:
__device__ int d_mv_flag[MV_MAX_WARPS + 1];           // per shared group (by its first inner
                                                      // boundary): the parts counted in so far
__device__ float d_mv_part[MV_MAX_WARPS][2][MV_ROWS]; // per warp: its part of its first [0] and
                                                      // last [1] group
__device__ unsigned long long d_mv_cell[MV_MAX_WARPS][MV_ROWS]; // per warp w: the rows of a group
                                                                // of two parts that begins in w's
                                                                // run (0: empty)
#define MV_CELL_FULL (1ull << 32) // a cell holding a part: this bit and the float's bits

// Row `row` of matrix m is done, its dot product t: bias, residual, store (one thread).
__device__ __forceinline__ void mv_row_store(const MvPlan &p, int m, int row, float t) {
    if (p.bias[m]) t += p.bias[m][row];
    float *y = p.y[m] + row;
    *y = p.accumulate ? *y + t : t;
}

// Rows row0 .. row0+R-1 of matrix m are done, their dot products v[] in every lane.
template <int R>
__device__ __forceinline__ void mv_rows_done(const MvPlan &p, int m, int row0, const float *v) {
    int nr = min(R, p.n_out[m] - row0);
    if (threadIdx.x % WARP == 0) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (r >= nr) break;
            mv_row_store(p, m, row0 + r, v[r]);
        }
    }
}

// This warp's part v[] of group grp of matrix m, whose units other warps share. The group's units
// are [U0, U0 + cpr) of the stream, so warps w1 = U0/upw .. w2 = (U0 + cpr - 1)/upw hold its parts.
//
// Two parts (w2 = w1 + 1, every group when cpr <= upw + 1: the launches of the large models): the
// parts meet in one 64-bit atomic exchange per row. Each warp swaps its part into the row's cell;
// the one that finds the other's part there adds the two and finishes the row. Float addition is
// commutative, so the sum is the same whichever warp comes second, and no fence is needed: the part
// travels inside the atomic. w2's part is ready early (its run begins with it), w1's at the end of
// its run, so the launch's last warps wait on one round trip to L2, not on a chain of them.
//
// More parts (short runs: small models, long rows): each stores its part (slot 0 of a warp whose
// run begins inside the group, else slot 1), fences and counts itself in; the last to arrive adds
// the parts in warp order and finishes the rows.
template <int R>
__device__ __forceinline__ void mv_rows_part(const MvPlan &p, int m, int grp, int cpr, int warp,
                                             const float *v) {
    int U0 = p.first_unit[m] + grp * cpr, w1 = U0 / p.upw, w2 = (U0 + cpr - 1) / p.upw;
    if (w2 == w1 + 1) {
        if (threadIdx.x % WARP == 0) {
            int nr = min(R, p.n_out[m] - grp * R);
            unsigned long long prev[R];
#pragma unroll
            for (int r = 0; r < R; r++) // all the exchanges in flight together
                if (r < nr)
                    prev[r] = atomicExch(&d_mv_cell[w1][r], MV_CELL_FULL | __float_as_uint(v[r]));
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (r >= nr || !prev[r]) continue;
                d_mv_cell[w1][r] = 0; // empty for the next launch (after this kernel ends)
                mv_row_store(p, m, grp * R + r, v[r] + __uint_as_float((unsigned)prev[r]));
            }
        }
        return;
    }
    int last = 0;
    if (threadIdx.x % WARP == 0) {
        int slot = U0 < warp * p.upw ? 0 : 1;
#pragma unroll
        for (int r = 0; r < R; r++) d_mv_part[warp][slot][r] = v[r];
        fence_acq_rel();
        last = atomicAdd(&d_mv_flag[w1 + 1], 1) == w2 - w1;
    }
    last = __shfl_sync(0xffffffffu, last, 0);
    if (!last) return;
    fence_acq_rel();
    float t[R];
#pragma unroll
    for (int r = 0; r < R; r++) t[r] = 0.0f;
    for (int w = w1; w <= w2; w++) {
        int slot = U0 < w * p.upw ? 0 : 1;
#pragma unroll
        for (int r = 0; r < R; r++) t[r] += __ldcg(&d_mv_part[w][slot][r]);
    }
    if (threadIdx.x % WARP == 0) d_mv_flag[w1 + 1] = 0; // ready for the next launch
    mv_rows_done<R>(p, m, grp * R, t);
}

// Units [c0, c1) of matrix m (unit c: group c / cpr, chunk c % cpr), this warp's piece of it.
// STEP: the matrix's planes are in this launch's step order (6.7).
template <int TYPE, bool STEP>
__device__ void mv_run(const MvPlan &p, int m, const XQ &xq, int n_sub, int c0, int c1, int warp) {
    const int R = MV_ROWS;
    const uint8_t *W = p.w[m];
    int lane = threadIdx.x % WARP, cpr = (n_sub + WARP - 1) / WARP, last_row = p.n_out[m] - 1;
    size_t NB = (size_t)p.n_out[m] * n_sub;
    int grp = c0 / cpr, kk = c0 % cpr, cut = kk != 0; // cut: the group began in an earlier run
    // The plane index of row r of a unit: row by row, (grp * R + r) * n_sub + 32 kk + lane; in step
    // order, (slot * R + r) * 32 + lane, where unit c is this warp's step k = c + first - warp *
    // upw and the slot moves on by nw a step, less one where the matrix's first or last warp has no
    // unit (so_slot_kw's terms).
    StepWarps sw = {0, 0, 0, 0};
    int k = 0;
    unsigned slot = 0;
    if (STEP) {
        sw = so_warps(p.so[m]);
        k = c0 + p.first_unit[m] - warp * p.upw;
        slot = so_slot_kw(sw, k, warp);
    }
#define MV_G(grp, kk, sl, r)                                                                       \
    (STEP ? ((sl) * R + (r)) * WARP + lane                                                         \
          : (unsigned)min((grp) * R + (r), last_row) * n_sub + WARP * (kk) + lane)
    Iq4Lut lut = d_iq4_lut;
    WSub w[R];
    float acc[R];
    {
        int u = WARP * kk + lane;
#pragma unroll
        for (int r = 0; r < R; r++) {
            acc[r] = 0.0f;
            if (u < n_sub) w[r] = sub_load<TYPE>(W, MV_G(grp, kk, slot, r), NB);
        }
    }
    for (int c = c0; c < c1; c++) {
        int u = WARP * kk + lane, ng = grp, nk = kk + 1; // (ng, nk): the next unit
        if (nk == cpr) { nk = 0; ng++; }
        int un = WARP * nk + lane, more = c + 1 < c1 && un < n_sub;
        // the next unit's slot
        unsigned sn = STEP ? slot + sw.nw - (k >= sw.k1) - (k + 1 < sw.k0) : 0;
        if (u < n_sub) {
            XBlock x = load_xblock(xq, u, n_sub);
// multiply row r, then refill its registers with the next unit
#pragma unroll
            for (int r = 0; r < R; r++) {
                acc[r] += sub_dot<TYPE>(w[r], u % 8, x, lut);
                if (more) w[r] = sub_load<TYPE>(W, MV_G(ng, nk, sn, r), NB);
            }
        } else if (more) {
#pragma unroll
            for (int r = 0; r < R; r++) w[r] = sub_load<TYPE>(W, MV_G(ng, nk, sn, r), NB);
        }
        if (nk == 0) { // the group's last chunk
#pragma unroll
            for (int r = 0; r < R; r++) acc[r] = warp_sum(acc[r]);
            if (cut) mv_rows_part<R>(p, m, grp, cpr, warp, acc);
            else mv_rows_done<R>(p, m, grp * R, acc);
#pragma unroll
            for (int r = 0; r < R; r++) acc[r] = 0.0f;
            cut = 0;
        }
        grp = ng;
        kk = nk;
        slot = sn;
        k++;
    }
    if (kk != 0) { // a later run ends this group
#pragma unroll
        for (int r = 0; r < R; r++) acc[r] = warp_sum(acc[r]);
        mv_rows_part<R>(p, m, grp, cpr, warp, acc);
    }
#undef MV_G
}

// One kernel per type when all the matrices of a launch have one type (TYPE >= 0; gate/up, the
// output matrix): each gets a register allocation of its own. TYPE = MIX_FOUR or MIX_ALL: a mix
// (FOUR_TYPE_SWITCH). C twin: matvec_xq_c per matrix.
template <int TYPE, bool STEP, int THREADS>
__global__ void __launch_bounds__(THREADS, THREADS >= MV_SM_THREADS ? 1 : MV_SM_THREADS / THREADS)
matvec_stream_kernel(const __grid_constant__ MvPlan p, XQ xq, int n_sub) {
    int warp = (blockIdx.x * THREADS + threadIdx.x) / WARP;
    int a = warp * p.upw, b = min(a + p.upw, p.first_unit[p.n]);
    for (int m = 0; m < p.n; m++) { // the run's piece of each matrix
        int s = max(a, p.first_unit[m]), e = min(b, p.first_unit[m + 1]);
        if (s >= e) continue;
#define RUN(T) mv_run<T, STEP>(p, m, xq, n_sub, s - p.first_unit[m], e - p.first_unit[m], warp)
        if (TYPE >= 0) RUN(TYPE >= 0 ? TYPE : 0);
        else if (TYPE == MIX_FOUR) FOUR_TYPE_SWITCH(p.type[m], RUN)
        else FAST_TYPE_SWITCH(p.type[m], RUN)
#undef RUN
    }
}

// Add matrix W (in planes) to the plan: y = W x (+ bias).
static void mv_plan_add(MvPlan *p, const Tensor *W, const float *bias, float *y) {
    int m = p->n++, cpr = (int)(W->n_in / 32 + WARP - 1) / WARP,
        groups = (int)(W->n_out + MV_ROWS - 1) / MV_ROWS;
    p->w[m] = (const uint8_t *)W->dev;
    p->bias[m] = bias;
    p->y[m] = y;
    p->type[m] = W->type;
    p->n_out[m] = (int)W->n_out;
    p->so[m] = W->so;
    p->first_unit[m + 1] = p->first_unit[m] + groups * cpr;
}

// --- 6.7 step order and block shapes -------------------------------------------------------------
// Speed: two choices that 6.6 computes the same y under, each measured faster on the 27B/32B
// files (test/PERF_NOTES.md, "Mat-vec (section 6)"): the order of the streamed matrices' planes,
// and the streaming kernel's block shape.
//
// Step order. The streaming mat-vec cuts a matrix into units of MV_ROWS rows x 32 sub-blocks (unit
// c = row group c / cpr, chunk c % cpr, cpr = n_sub / 32) and gives every warp of its grid a run of
// upw consecutive units; at step k of the launch, warp w reads the k-th unit of its run. Row by
// row, the units read at one step lie upw units apart, one place per warp, spread over the whole
// matrix; DRAM streams them faster when they lie side by side. So the matrices of the streaming
// launches without an IQ4 type (step_order_group says why not) are stored with their units in the
// order (step k, warp w), each unit's MV_ROWS rows of 32 sub-blocks together: g = (slot * MV_ROWS +
// r) * 32 + l for row r of the unit, sub-block l of its chunk. Only matrices whose rows are whole
// chunks and whose row count is a multiple of MV_ROWS are stored so. The rest of the layout is
// unchanged, per sub-block (g) and per super-block (g / 8).
//
// The slot of unit c of a tensor in step order. Its units are [F, G) of the launch's stream (F =
// so.first, G = F + so.units); warps w0 = F / upw .. w1 = (G - 1) / upw read them, nw in all. Every
// warp has steps 0 .. upw-1 of them but the first, which starts at k0 = F - w0 * upw, and the last,
// which ends before k1 = G - w1 * upw. Slots go by step, then warp: the units of the steps before k
// (nw each, less one for each step before k0 and one for each from k1 on), then the warps of step k
// before w (the first warp has no step k < k0).
__host__ __device__ static inline StepWarps so_warps(StepOrder so) {
    int w0 = so.first / so.upw, w1 = (so.first + so.units - 1) / so.upw;
    StepWarps sw = {w0, w1 - w0 + 1, so.first - w0 * so.upw, so.first + so.units - w1 * so.upw};
    return sw;
}
// the slot of the unit that warp w reads at step k
__host__ __device__ static inline unsigned so_slot_kw(StepWarps sw, int k, int w) {
    return (unsigned)(k * sw.nw - (k < sw.k0 ? k : sw.k0) - (k > sw.k1 ? k - sw.k1 : 0) + w -
                      sw.w0 - (k < sw.k0));
}
__host__ __device__ static inline unsigned so_slot(StepOrder so, int c) {
    int s = so.first + c;
    return so_slot_kw(so_warps(so), s % so.upw, s / so.upw);
}

// The block shape (mv_threads): one block per SM of 640 threads (20 warps, 96 registers each) for
// the launches of one type, IQ4_XS or IQ4_NL, or any other but Q5_K in step order (gate/up,
// the output matrix, the Q4_0 files' other streamed launches); one of 512 (16 warps, 128 registers)
// for row-by-row launches that mix an IQ4 type with another, whose kernel spills registers at 640;
// two blocks of 256 for the rest (Q5_K alone, mixed launches in step order). One block, because an
// SM's warp schedulers favour the older of two resident blocks: the second block of each SM ends
// its equal run late, and every launch would end with one block per SM working alone. 640 threads,
// because the loop is held by memory latency and by the IQ4_XS lookup's arithmetic in turn, and
// four more warps per SM hide more of both (768 threads spill).

// Warps of matvec_stream_kernel the GPU holds at once at 16 per SM (asked once; the shapes of 512
// and 2 x 256 threads); mv_plan_runs scales it for the 640-thread shape.
static int mv_grid_warps(void) {
    static int warps = 0;
    if (!warps) {
        int dev, n_sm, per_sm;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev));
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &per_sm, matvec_stream_kernel<MIX_FOUR, false, 512>, 512, 0));
        warps = n_sm * (per_sm > 0 ? per_sm : 1) * (512 / WARP);
        if (warps > MV_MAX_WARPS) warps = MV_MAX_WARPS;
    }
    return warps;
}

// The launch's block shape (the block-shape paragraph above mv_grid_warps): one block of
// MV_ONE_BLOCK threads per SM for launches of one type, any but Q5_K in step order or an IQ4
// type; one of 512 for launches that mix an IQ4 type with another row by row (at 640 threads
// their kernel spills registers, as does Q5_K's in step order on sm_70); two blocks of 256 for the
// rest (Q5_K alone, row-by-row launches without an IQ4 type, every mixed launch in step order:
// small shapes, other files). matvec_stream launches only the kernel whose block shape this says: a
// plan of one shape run with the other's block would cover a different set of units.
#define MV_ONE_BLOCK 640 // 20 warps at 96 registers (ptxas, sm_70 and sm_90: no spills for these)
// The type of all the plan's matrices, or MIX_FOUR / MIX_ALL when they mix types (mix_kind).
static int mv_plan_type(const MvPlan *p) {
    for (int m = 1; m < p->n; m++)
        if (p->type[m] != p->type[0]) return mix_kind(p->type, p->n);
    return p->type[0];
}
static int mv_threads(const MvPlan *p, int step) {
    int t = mv_plan_type(p);
    if (t < 0) { // mixed types: a 512-thread kernel row by row, 256 in step order
        for (int m = 0; m < p->n && !step; m++)
            if (is_iq4_type(p->type[m])) return 512;
        return 256;
    }
    if (is_iq4_type(t)) return MV_ONE_BLOCK;
    return step && t != GGML_TYPE_Q5_K ? MV_ONE_BLOCK : 256;
}
// The plan's run length for blocks of t threads: the stream of units cut into equal runs over the
// grid's warps.
static void mv_plan_runs_at(MvPlan *p, int t) {
    int total = p->first_unit[p->n];
    int per_sm = (t > MV_SM_THREADS ? t : MV_SM_THREADS) / WARP;     // 20, or 16 (512, 2 x 256)
    int warps = mv_grid_warps() / (MV_SM_THREADS / WARP) * per_sm;         // SMs x warps per SM
    p->upw = (total + warps - 1) / warps;
}
// The same for the launch's own block shape (step: its matrices are, or are to be, in step order).
static void mv_plan_runs(MvPlan *p, int step) { mv_plan_runs_at(p, mv_threads(p, step)); }

// The kernel of the plan's types, block shape (threads) and order (step), over its runs (p->upw);
// a block shape not built for those types is an error.
static void mv_launch(const MvPlan *p, const XQ &xq, int n_sub, int threads, int step,
                      cudaStream_t st) {
    int total = p->first_unit[p->n], used = (total + p->upw - 1) / p->upw, type = mv_plan_type(p);
    int blocks = (used + threads / WARP - 1) / (threads / WARP);
#define STREAM(T, STEP, THREADS)                                                                   \
    do {                                                                                           \
        if (THREADS != threads)                                                                    \
            die("streaming mat-vec: a %d-thread kernel for a %d-thread plan", THREADS, threads);   \
        matvec_stream_kernel<T, STEP, THREADS><<<blocks, THREADS, 0, st>>>(*p, xq, n_sub);         \
    } while (0)
#define ONE_TYPE(T)                                          \
    if (threads == MV_ONE_BLOCK && step) STREAM(T, true, MV_ONE_BLOCK); \
    else if (threads == MV_ONE_BLOCK) STREAM(T, false, MV_ONE_BLOCK);   \
    else if (step) STREAM(T, true, 256);                                \
    else STREAM(T, false, 256)
#define MIXED(MIX)                                                          \
    if (step) STREAM(MIX, true, 256);                                    \
    else if (threads == 512) STREAM(MIX, false, 512);                    \
    else STREAM(MIX, false, 256)
    if (type >= 0) FAST_TYPE_SWITCH(type, ONE_TYPE)
    else if (type == MIX_FOUR) { MIXED(MIX_FOUR); }
    else { MIXED(MIX_ALL); }
#undef MIXED
#undef ONE_TYPE
#undef STREAM
    KERNEL_CHECK();
}

// Launch the plan: runs of equal length over the grid's warps.
static void matvec_stream(MvPlan *p, const XQ &xq, int n_in, cudaStream_t st) {
    int step = p->so[0].upw != 0;
    mv_plan_runs(p, step);
    for (int m = 0; m < p->n; m++) // planes in step order must be this launch's (step_order_plan)
        if (p->so[m].upw && (p->so[m].upw != p->upw || p->so[m].first != p->first_unit[m] ||
                             p->so[m].units != p->first_unit[m + 1] - p->first_unit[m]))
            die("streaming mat-vec: matrix %d's planes are in the step order of another launch", m);
    // all of the plan's matrices in step order, or none (step_order_group)
    for (int m = 1; m < p->n; m++)
        if ((p->so[m].upw != 0) != step)
            die("streaming mat-vec: matrices in step order and row by row in one launch");
    mv_launch(p, xq, n_in / 32, mv_threads(p, step), step, st);
}

// --- 6.8 matvec(): which kernel a launch takes ---------------------------------------------------
// The entry points of every mat-vec, matvec() and matvec_batch(): for float weights (the file's
// layout) the simple kernel (6.1) or its 16-byte form (6.4c); for weights in planes the per-block
// kernel (6.5), or the streaming one (6.6) where mv_use_stream says so.

// Speed: the choice between the two fast kernels, per launch (test/PERF_NOTES.md,
// "Mat-vec (section 6)"). Both fast kernels exist because each is the faster one for part of a
// token's launches: the streaming kernel for long runs (a warp's run holds about two whole row
// groups or more: gate/up, the DeltaNet in-projections, the output matrix), the per-block kernel
// for short ones, where the streaming kernel's runs become chains of memory latencies whose row
// groups warps share (ffn_down, the attention projections, ssm_out). The runs are counted for a
// grid of 16 warps per SM (mv_grid_warps), whatever block shape the launch then takes. Rows of at
// most 4096 inputs (the 8B and smaller models) never stream: there a row is one pass of a
// per-block kernel, every load of a block in flight at once, and gate/up and the output matrix
// measured 6-9 % faster per-block (test/PERF_NOTES.md, "Fast types, round 2").
enum { MV_AUTO, MV_STREAM, MV_BLOCKS };
static int g_mv_mode = MV_AUTO; // MV_STREAM / MV_BLOCKS force one kernel: the tests run both
static int mv_use_stream(const MvPlan *p, int n_in) {
    if (g_mv_mode != MV_AUTO) return g_mv_mode == MV_STREAM;
    if (n_in <= 4096) return 0; // one pass of the per-block kernel (above)
    long cpr = (n_in / 32 + WARP - 1) / WARP, warps = mv_grid_warps();
    // 1.9 row groups a run or more: the measured break-even (test/PERF_NOTES.md, Design record)
    return 10L * p->first_unit[p->n] >= 19 * cpr * warps;
}

// y = W x (+ bias) (+ y when accumulate): a fast kernel (16-bit x) for weights in planes, the
// simple one (fp32 x) or its 16-byte form (6.4c) for the float types.
static void matvec(const Tensor *W, const Act *in, float *y /* (n_out) */,
                   const float *bias /* (n_out) or NULL */, int accumulate, cudaStream_t st) {
    const uint8_t *w = (const uint8_t *)W->dev;
    int n_in = (int)W->n_in, n_out = (int)W->n_out;
    if (W->planes) {
        if (!in->q.q) die("mat-vec '%s': its input has no 16-bit copy", W->name);
        MvPlan p;
        memset(&p, 0, sizeof p);
        p.accumulate = accumulate;
        mv_plan_add(&p, W, bias, y);
        if (mv_use_stream(&p, n_in)) {
            matvec_stream(&p, in->q, n_in, st);
            return;
        }
        matvec_blocks(W, in->q, y, bias, accumulate, st);
        return;
    }
    const float *x = in->f;
    if (matvec_float(1, &W, &bias, &y, x, accumulate, st)) return; // 6.4c's float rows
    const int rows_per_block = 4;
    dim3 grid((unsigned)((n_out + rows_per_block - 1) / rows_per_block));
    dim3 block(rows_per_block * WARP);
    size_t stride = row_bytes(W->type, W->n_in);
    switch (W->type) {
#define CASE(T)                                                                                    \
    case T:                                                                                        \
        matvec_generic_kernel<T><<<grid, block, 0, st>>>(w, stride, x, bias, y, n_in, n_out,      \
                                                         accumulate);                              \
        break
    CASE(GGML_TYPE_F32); CASE(GGML_TYPE_F16); CASE(GGML_TYPE_BF16);
#undef CASE
    default: die("no GPU mat-vec for type %s (tensor '%s')", type_name(W->type), W->name);
    }
    KERNEL_CHECK();
}

// n mat-vecs y_i = W_i x (+ b_i) from the same input: one launch when all are in planes, or all
// are float rows that 6.4c takes together; else n.
static void matvec_batch(int n, const Tensor *const *W, const float *const *bias, float *const *y,
                         const Act *in, cudaStream_t st) {
    int all_planes = in->q.q != NULL;
    for (int i = 0; i < n; i++) all_planes &= W[i]->planes;
    if (!all_planes) {
        if (matvec_float(n, W, bias, y, in->f, 0, st)) return;
        for (int i = 0; i < n; i++) matvec(W[i], in, y[i], bias[i], 0, st);
        return;
    }
    MvPlan p;
    memset(&p, 0, sizeof p);
    for (int i = 0; i < n; i++) mv_plan_add(&p, W[i], bias[i], y[i]);
    if (mv_use_stream(&p, (int)W[0]->n_in)) {
        matvec_stream(&p, in->q, (int)W[0]->n_in, st);
        return;
    }
    matvec_blocks_batch(n, W, bias, y, in->q, st);
}

// q, k and v from the same normalized input.
static void matvec_qkv(const Tensor *Wq, const Tensor *Wk, const Tensor *Wv, const float *bq,
                       const float *bk, const float *bv, const Act *in, float *q, float *k,
                       float *v, cudaStream_t st) {
    const Tensor *W[3] = {Wq, Wk, Wv};
    const float *bias[3] = {bq, bk, bv};
    float *y[3] = {q, k, v};
    matvec_batch(3, W, bias, y, in, st);
}

// ------------------------------------------------------------------------------------------------
// 7. GPU kernels of a layer: RMSNorm, attention, Gated DeltaNet, SwiGLU
// ------------------------------------------------------------------------------------------------
// The steps of a token between its mat-vecs. Each one that feeds a mat-vec writes its output in
// fp32 and as the 16-bit copy of 6.2 (quantize_block_warp): no launch is spent on quantizing. They
// move few bytes and are bound by latency, so they are fused where a launch can be saved.

// --- 7.1 RMSNorm ---------------------------------------------------------------------------------
// out = x / sqrt(mean(x^2) + eps) * w in fp32, and (n a multiple of 32) its quantized copy.
// Every block sums the squares of all of x (20 KB from L2, cheaper than a second launch) and then
// handles its own 32-value blocks, one per warp. The kernel is all latency (~130 launches a
// token), so every load is issued before the first add: x as up to 8 float4 per thread, and the
// block's own x and w values before the reduction. C twin: rmsnorm_c, then quantize_block_c.
#define NORM_THREADS 256
__global__ void __launch_bounds__(NORM_THREADS)
rmsnorm_quant_kernel(Act out /* (n) */, const float *x /* (n) */, const float *w /* (n) */,
                     int n, float eps) {
    int lane = threadIdx.x % WARP, nw = blockDim.x / WARP;
    int quant = out.q.q && n % 32 == 0, b = blockIdx.x * nw + threadIdx.x / WARP, i = 32 * b + lane;
    float xi = 0.0f, wi = 0.0f;
    if (quant && b < n / 32) { xi = x[i]; wi = w[i]; }
    float ss = 0.0f;
    if (n % 4 == 0) {
        const float4 *x4 = (const float4 *)x;
        int n4 = n / 4;
        float4 v[8];
#pragma unroll
        for (int k = 0; k < 8; k++) {
            int j = threadIdx.x + k * blockDim.x;
            v[k] = j < n4 ? x4[j] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int k = 0; k < 8; k++)
            ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
        for (int j = threadIdx.x + 8 * blockDim.x; j < n4; j += blockDim.x) {
            float4 u = x4[j];
            ss += u.x * u.x + u.y * u.y + u.z * u.z + u.w * u.w;
        }
    } else {
        for (int j = threadIdx.x; j < n; j += blockDim.x) ss += x[j] * x[j];
    }
    ss = block_sum(ss);
    float scale = rsqrtf(ss / n + eps);
    if (quant) {
        if (b < n / 32) {
            float v = xi * scale * wi;
            out.f[i] = v;
            quantize_block_warp(v, out.q, b, n / 32);
        }
    } else {
        for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < n; j += gridDim.x * blockDim.x)
            out.f[j] = x[j] * scale * w[j];
    }
}
static void rmsnorm_quant(Act *out /* (n) */, const float *x /* (n) */, const float *w /* (n) */,
                          int n, float eps, cudaStream_t st) {
    int blocks = (n / 32 + NORM_THREADS / WARP - 1) / (NORM_THREADS / WARP);
    rmsnorm_quant_kernel<<<blocks > 0 ? blocks : 1, NORM_THREADS, 0, st>>>(*out, x, w, n, eps);
    KERNEL_CHECK();
}

// --- 7.2 attention of one token over the KV cache ------------------------------------------------
// out[h] = sum_t softmax_t(q[h] . K[t][h/g] / sqrt(hd)) V[t][h/g],   g = n_head / n_kv (GQA)
//
// Split along the keys ("flash decoding"), so that a long context spreads over many blocks. The
// keys 0..pos are cut into chunks of ck keys (att_cut), and the chunks into at most n_split
// splits of cps consecutive chunks each (so the number of splits, and the cost of merging them,
// stays bounded as the context grows). Block (kv head j, split s) takes its chunks one after the
// other for the g query heads that share kv head j, so each K/V row is read once for all of them:
//   1. att_load_q_kv, att_qk_norm_rope, att_store_k: this token's q (every block), k and v (the
//      block of the last split, which holds key pos): per-head RMSNorm, RoPE, the KV store;
//   2. per chunk: att_stage_chunk (K and V rows into shared memory), att_chunk_scores (s = q . k /
//      sqrt(hd)), att_softmax_update and att_accumulate_pv: the split's running state (online
//      softmax), with m the running maximum, l the sum, o the weighted sum of V:
//        m' = max(m, max s),  c = e^(m - m'),  l' = c l + sum e^(s - m'),
//        o' = c o + sum e^(s - m') V
//   3. the split's m, l and o into part_ml, part_o; the last split of kv head j to finish then
//   4. att_merge: out = sum_s o_s e^(m_s - m) / sum_s l_s e^(m_s - m), m = max m_s, and
//   5. att_output_gate: qwen35's out *= sigmoid(gate), the output and its 16-bit copy.
// A chunk's K and V rows are loaded into registers one chunk ahead (the first chunk's before q is
// rotated, the next one's while this one is scored), with 16-byte loads all in flight at once.
// C twin: attention_c (after rmsnorm_c and rope_neox_c for step 1).
#define ATT_THREADS 256
// keys per chunk: 64 for head_dim <= 128, fewer for wider heads (shared memory: chunk * hd <= 8192
// halves of K, as many of V), a multiple of 8 (the score rows are read as float4s; 256: 32)
static int att_chunk(int hd) { return hd <= 128 ? 64 : 8192 / hd / 8 * 8; }
// Most splits per kv head for a cache of n_ctx keys: one chunk each up to 32 chunks, then longer
// splits, so that the merge reads at most 32 partial states per head, one per lane of a warp.
static int att_splits(int n_ctx, int hd) {
    int chunks = (int)(((int64_t)n_ctx + att_chunk(hd) - 1) / att_chunk(hd)); // 64-bit: -c 2^31-1
    return chunks < WARP ? chunks : WARP;
}
#define ATT_MAX_OUT 8      // outputs per thread: g * head_dim <= 2048
#define ATT_STAGE 4        // 16-byte K (and V) loads per thread and chunk: chunk * hd / 8 <= 1024
#define ATT_MERGE_DEPTH 16 // splits per round of the merge: its loads in flight at once
#define ATT_KPAD 8         // K rows padded by 8 halves: 16-byte aligned rows, 4 banks apart
// dynamic shared memory: K rows, V rows (fp16), q of the g heads, their scores (fp32), then this
// token's k (fp32), its RoPE angles (cos, sin per rotated pair) and its k and v rows in fp16
static size_t att_smem(int g, int hd, int chunk) {
    return (size_t)chunk * (hd + ATT_KPAD) * 2 + (size_t)chunk * hd * 2 + (size_t)g * hd * 4 +
           (size_t)g * chunk * 4 + (size_t)hd * 4 + (size_t)hd / 2 * 8 + (size_t)hd * 2 * 2;
}
// The block's shared memory as att_smem lays it out.
typedef struct {
    __half *K;       // (chunk, hd + ATT_KPAD) the staged chunk's keys
    __half *V;       // (chunk, hd) its values
    float *q;        // (g, hd) the g query heads of this kv head
    float *p;        // (g, chunk) their scores, then e^(s - m)
    float *k;        // (hd) this token's key (the block that holds key pos)
    float2 *cs;      // (n_rot / 2) cos, sin of this token's RoPE angles
    __half *kh, *vh; // (hd) this token's key and value rows in fp16
} AttShared;
// This token's q, k and v as the projections left them, for RoPE and the KV store folded into the
// attention (one launch per layer fewer). With q_src == NULL the attention reads q roped already
// and a cache that holds position pos (the attention alone: the tests, test/bench).
typedef struct {
    const float *q_src;           // (n_head, q_stride) raw q; qwen35 interleaves it with its gate
    int q_stride;
    const float *k, *v;           // (n_kv, hd) this token's key and value
    const float *q_norm, *k_norm; // (hd) qwen3 / qwen35's RMSNorm per head, or NULL (qwen2)
    int n_rot;                    // NEOX RoPE on the first n_rot dims of each head
    const float2 *rope_cs;        // (n_rot / 2) cos, sin of this token's angles
    float eps;
} AttNew;

// This token's RoPE angles, once per token for all attention layers (they share the position and
// the frequencies): cs[i] = rope_angle(pos, i), i < n_rot / 2. One block of at least n_rot / 2
// threads. C twin: rope_angle in rope_neox_c.
__global__ void rope_angles_kernel(float2 *cs /* (n_rot/2) cos, sin */, const int *pos_p /* (1) */,
                                   int n_rot, float base, float freq_scale) {
    int i = threadIdx.x;
    if (i < n_rot / 2) cs[i] = rope_angle(*pos_p, i, n_rot, base, freq_scale);
}
// Shortest chunk: short contexts are cut into shorter chunks, so that their keys spread over all
// n_split splits (more blocks, each with less work: at 128 keys 8 splits of 16 instead of 2 of 64).
#define ATT_MIN_CHUNK 16
// How the keys 0..pos of a token are cut, the same in every block of the launch: chunks of ck <=
// chunk keys, ceil((pos + 1) / n_split) rounded up to 8 and at least ATT_MIN_CHUNK (ck is chunk,
// the shared memory's size, once (pos + 1) / n_split passes chunk - 8: from 1793 keys at 32 splits
// of 64); chunk c holds keys c * ck .. min(c * ck + ck, pos + 1) - 1. Split s takes chunks s * cps
// .. min(s * cps + cps, n_chunks) - 1; ns <= n_split splits have chunks (the grid's others return
// at once), and the last, ns - 1, holds key pos. Past n_split * chunk keys each split takes cps >=
// 2 chunks one after the other. Host and device: the tests check these promises on the CPU for
// every position up to 4200 keys.
typedef struct {
    int ck, n_chunks, cps, ns;
} AttCut;
__host__ __device__ __forceinline__ AttCut att_cut(int pos, int n_split, int chunk) {
    AttCut a;
    a.ck = min(chunk, max(ATT_MIN_CHUNK, ((pos + n_split) / n_split + 7) / 8 * 8));
    a.n_chunks = pos / a.ck + 1;
    a.cps = (a.n_chunks + n_split - 1) / n_split;
    a.ns = (a.n_chunks + a.cps - 1) / a.cps;
    return a;
}
// Split s walks chunks s * cps up to (not including) att_split_end; chunk c holds att_chunk_len
// keys.
__host__ __device__ __forceinline__ int att_split_end(AttCut a, int s) {
    return min((s + 1) * a.cps, a.n_chunks);
}
__host__ __device__ __forceinline__ int att_chunk_len(AttCut a, int pos, int c) {
    return min(a.ck, pos + 1 - c * a.ck);
}
// Rows t0 .. t0+nl-1 of kv head j's K and V cache into registers, thread by thread: row t's hd/8
// 16-byte pieces are i = t * hd/8 + cc, and thread x holds i = x, x + ATT_THREADS, ... (chunk * hd
// <= 8192, so at most ATT_STAGE of each). Evict-first (__ldcs), like the weights: the cache is
// read once per token.
__device__ __forceinline__ void att_rows_load(uint4 *kr /* (ATT_STAGE) */,
                                              uint4 *vr /* (ATT_STAGE) */,
                                              const __half *kc /* (n_ctx, n_kv, hd) */,
                                              const __half *vc /* (n_ctx, n_kv, hd) */, int t0,
                                              int nl, int n_kv, int j, int hd) {
    int v8 = hd / 8;
#pragma unroll
    for (int k = 0; k < ATT_STAGE; k++) {
        int i = threadIdx.x + k * ATT_THREADS, t = i / v8, cc = i % v8;
        size_t src = ((size_t)(t0 + t) * n_kv + j) * hd + 8 * cc;
        if (i < nl * v8) {
            kr[k] = __ldcs((const uint4 *)(kc + src));
            vr[k] = __ldcs((const uint4 *)(vc + src));
        }
    }
}

// Step 1a: q of the g heads of kv head j into sh.q, and in the block that holds key pos (own) this
// token's k into sh.k and its v, in fp16, into sh.vh and the cache (v needs no rotation): 16-byte
// loads, all issued before the first store.
__device__ __forceinline__ void att_load_q_kv(const AttShared &sh, const AttNew &cur,
                                              const float *q /* (n_head, hd) roped, or NULL */,
                                              __half *vc /* (n_ctx, n_kv, hd) */, int j, int g,
                                              int hd, int n_kv, int pos, int own) {
    const int NQ = ATT_MAX_OUT / 4;
    float4 qv[NQ], k4, v4;
    float2 cs = make_float2(0.0f, 0.0f);
#pragma unroll
    for (int k = 0; k < NQ; k++) {
        int e = 4 * (threadIdx.x + k * ATT_THREADS); // element of the g heads' q
        if (e < g * hd)
            qv[k] = cur.q_src
                        ? *(const float4 *)(cur.q_src + (size_t)(j * g + e / hd) * cur.q_stride +
                                            e % hd)
                        : *(const float4 *)(q + (size_t)j * g * hd + e);
    }
    if (own && threadIdx.x < hd / 4) {
        k4 = *(const float4 *)(cur.k + (size_t)j * hd + 4 * threadIdx.x);
        v4 = *(const float4 *)(cur.v + (size_t)j * hd + 4 * threadIdx.x);
    }
    if (cur.q_src && threadIdx.x < cur.n_rot / 2) cs = cur.rope_cs[threadIdx.x];
#pragma unroll
    for (int k = 0; k < NQ; k++)
        if (threadIdx.x + k * ATT_THREADS < g * hd / 4)
            ((float4 *)sh.q)[threadIdx.x + k * ATT_THREADS] = qv[k];
    if (cur.q_src && threadIdx.x < cur.n_rot / 2) sh.cs[threadIdx.x] = cs;
    if (own && threadIdx.x < hd / 4) {
        ((float4 *)sh.k)[threadIdx.x] = k4;
        __half2 a = __floats2half2_rn(v4.x, v4.y), b = __floats2half2_rn(v4.z, v4.w);
        ((__half2 *)sh.vh)[2 * threadIdx.x] = a;
        ((__half2 *)sh.vh)[2 * threadIdx.x + 1] = b;
        __half2 *dst = (__half2 *)(vc + ((size_t)pos * n_kv + j) * hd) + 2 * threadIdx.x;
        dst[0] = a;
        dst[1] = b;
    }
}

// Step 1b: qwen3 / qwen35's RMSNorm of each head, x = x / sqrt(mean(x^2) + eps) * w, then NEOX
// RoPE: each pair (x[i], x[i + n_rot/2]), i < n_rot/2, rotated by this token's angle theta_i. Heads
// 0..g-1 are q in sh.q, head g (own block only) is k in sh.k.
__device__ __forceinline__ void att_qk_norm_rope(const AttShared &sh, const AttNew &cur, int g,
                                                 int hd, int own) {
    __shared__ float inv_rms[33]; // (g + 1): the q heads' 1/rms, then the own block's k head
    int lane = threadIdx.x % WARP, wid = threadIdx.x / WARP, nw = ATT_THREADS / WARP;
    int nh = g + own;
    __syncthreads();
    if (cur.q_norm || cur.k_norm) {
        for (int hh = wid; hh < nh; hh += nw) {
            const float *x = hh < g ? sh.q + hh * hd : sh.k;
            if (!(hh < g ? cur.q_norm : cur.k_norm)) continue;
            float ss = 0.0f;
            for (int d = lane; d < hd; d += WARP) ss += x[d] * x[d];
            ss = warp_sum(ss);
            if (lane == 0) inv_rms[hh] = rsqrtf(ss / hd + cur.eps);
        }
        __syncthreads();
        for (int e = threadIdx.x; e < nh * hd; e += ATT_THREADS) {
            int hh = e / hd, d = e % hd;
            const float *wn = hh < g ? cur.q_norm : cur.k_norm;
            float *x = hh < g ? sh.q + e : sh.k + d;
            if (wn) *x = *x * inv_rms[hh] * wn[d];
        }
        __syncthreads();
    }
    int half_rot = cur.n_rot / 2;
    for (int pr = threadIdx.x; pr < nh * half_rot; pr += ATT_THREADS) {
        int hh = pr / half_rot, i = pr % half_rot;
        float *x = hh < g ? sh.q + hh * hd : sh.k;
        float2 cs = sh.cs[i];
        float x0 = x[i], x1 = x[i + half_rot];
        x[i] = x0 * cs.x - x1 * cs.y;
        x[i + half_rot] = x0 * cs.y + x1 * cs.x;
    }
    __syncthreads();
}

// Step 1c: The KV store of k: this token's key row, fp16, into the cache at pos and into sh.kh.
__device__ __forceinline__ void att_store_k(const AttShared &sh, __half *kc /* (n_ctx, n_kv, hd) */,
                                            int j, int hd, int n_kv, int pos) {
    if (threadIdx.x < hd / 2) {
        __half2 kk = __floats2half2_rn(sh.k[2 * threadIdx.x], sh.k[2 * threadIdx.x + 1]);
        ((__half2 *)sh.kh)[threadIdx.x] = kk;
        ((__half2 *)(kc + ((size_t)pos * n_kv + j) * hd))[threadIdx.x] = kk;
    }
}

// Step 2a: A chunk's K and V rows, loaded into registers one chunk ago, into shared memory: nl rows
// from the cache, then (nl < nt: the own block's last chunk) this token's own row from sh.kh,
// sh.vh.
__device__ __forceinline__ void att_stage_chunk(const AttShared &sh, const uint4 *kr,
                                                const uint4 *vr, int nl, int nt, int hd) {
    int v8 = hd / 8, ks = hd + ATT_KPAD;
#pragma unroll
    for (int k = 0; k < ATT_STAGE; k++) {
        int i = threadIdx.x + k * ATT_THREADS, t = i / v8, cc = i % v8;
        if (i < nl * v8) {
            *(uint4 *)(sh.K + (size_t)t * ks + 8 * cc) = kr[k];
            *(uint4 *)(sh.V + (size_t)t * hd + 8 * cc) = vr[k];
        }
    }
    if (nl < nt && threadIdx.x < v8) {
        *(uint4 *)(sh.K + (size_t)nl * ks + 8 * threadIdx.x) = ((const uint4 *)sh.kh)[threadIdx.x];
        *(uint4 *)(sh.V + (size_t)nl * hd + 8 * threadIdx.x) = ((const uint4 *)sh.vh)[threadIdx.x];
    }
}

// Step 2b: s[h][t] = q[h] . K[t] / sqrt(hd) for the chunk's nt keys: one thread per (head, key)
// pair, 8 dims per step (one 16-byte K load, two of q), four partial sums so the FMAs do not wait
// on each other.
__device__ __forceinline__ void att_chunk_scores(const AttShared &sh, int g, int nt, int hd,
                                                 int chunk, float scale) {
    int v8 = hd / 8, ks = hd + ATT_KPAD;
    for (int i = threadIdx.x; i < g * nt; i += ATT_THREADS) {
        int hh = i / nt, t = i % nt;
        const uint4 *kr = (const uint4 *)(sh.K + (size_t)t * ks);
        const float4 *qh = (const float4 *)(sh.q + hh * hd);
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
        for (int c8 = 0; c8 < v8; c8++) {
            uint4 kw = kr[c8];
            float4 qa = qh[2 * c8], qb = qh[2 * c8 + 1];
            float2 k0 = __half22float2(*(const __half2 *)&kw.x);
            float2 k1 = __half22float2(*(const __half2 *)&kw.y);
            float2 k2 = __half22float2(*(const __half2 *)&kw.z);
            float2 k3 = __half22float2(*(const __half2 *)&kw.w);
            s0 += qa.x * k0.x + qa.y * k0.y;
            s1 += qa.z * k1.x + qa.w * k1.y;
            s2 += qb.x * k2.x + qb.y * k2.y;
            s3 += qb.z * k3.x + qb.w * k3.y;
        }
        sh.p[hh * chunk + t] = ((s0 + s1) + (s2 + s3)) * scale;
    }
}

// Step 2c: The running softmax state per head, one warp per head: m' = max(m, max s), p = e^(s -
// m') in place of s, l' = c l + sum p with c = e^(m - m') (0 for the first chunk: m was -inf).
__device__ __forceinline__ void att_softmax_update(float *p /* (g, chunk) */, float *mh /* (g) */,
                                                   float *lh /* (g) */, float *ch /* (g) */, int g,
                                                   int nt, int chunk) {
    int lane = threadIdx.x % WARP, wid = threadIdx.x / WARP, nw = ATT_THREADS / WARP;
    for (int hh = wid; hh < g; hh += nw) {
        float m = mh[hh];
        for (int t = lane; t < nt; t += WARP) m = fmaxf(m, p[hh * chunk + t]);
        m = warp_max(m);
        float l = 0.0f;
        for (int t = lane; t < nt; t += WARP) {
            float e = __expf(p[hh * chunk + t] - m);
            p[hh * chunk + t] = e;
            l += e;
        }
        l = warp_sum(l);
        if (lane == 0) {
            float cr = __expf(mh[hh] - m);
            ch[hh] = cr;
            lh[hh] = cr * lh[hh] + l;
            mh[hh] = m;
        }
    }
}

// Step 2d: o = c o + sum_t p[t] V[t], per output pair (dims d, d+1 of head p_head[k]) of this
// thread: the keys 4 at a time (one 16-byte load of p, a broadcast within the warp where its pairs
// are of one head, as with every Qwen's head_dim, a multiple of 64), two independent sums.
__device__ __forceinline__ void att_accumulate_pv(float2 (&o)[ATT_MAX_OUT / 2],
                                                  const int (&p_head)[ATT_MAX_OUT / 2],
                                                  const int (&p_dim)[ATT_MAX_OUT / 2],
                                                  const AttShared &sh, const float *ch, int nt,
                                                  int hd, int chunk) {
#pragma unroll
    for (int k = 0; k < ATT_MAX_OUT / 2; k++) {
        if (p_head[k] < 0) continue; // whole warps but for the last slot of g*hd/2 pairs
        const float *pk = sh.p + p_head[k] * chunk;
        const __half2 *vk = (const __half2 *)(sh.V + p_dim[k]); // key t at vk[t * hd / 2]
        float2 a = make_float2(0.0f, 0.0f), b = make_float2(0.0f, 0.0f);
        int t = 0;
        for (; t + 4 <= nt; t += 4, vk += 2 * hd) {
            float4 p4 = *(const float4 *)(pk + t);
            float2 v0 = __half22float2(vk[0]), v1 = __half22float2(vk[hd / 2]);
            float2 v2 = __half22float2(vk[hd]), v3 = __half22float2(vk[3 * hd / 2]);
            a.x += p4.x * v0.x; a.y += p4.x * v0.y;
            b.x += p4.y * v1.x; b.y += p4.y * v1.y;
            a.x += p4.z * v2.x; a.y += p4.z * v2.y;
            b.x += p4.w * v3.x; b.y += p4.w * v3.y;
        }
        for (; t < nt; t++, vk += hd / 2) {
            float2 v0 = __half22float2(vk[0]);
            a.x += pk[t] * v0.x; a.y += pk[t] * v0.y;
        }
        float cr = ch[p_head[k]];
        o[k] = make_float2(cr * o[k].x + (a.x + b.x), cr * o[k].y + (a.y + b.y));
    }
}

// Step 4: The merge, in the last block of kv head j to finish (ns <= 32 splits, one per lane): the
// weights e^(m_s - m) / l with m = max m_s and l = sum_s l_s e^(m_s - m), per head and split, then
// out = sum_s w_s o_s into shared memory (returned: (g, hd)). Per thread slot, 4 consecutive dims
// (16-byte loads of the partial outputs) and ATT_MERGE_DEPTH splits per round, every load of the
// round issued before the first multiply: one L2 latency per round, not one per split.
__device__ __forceinline__ float *att_merge(float *smem,
                                            const float *part_o /* (n_head, n_split, hd) */,
                                            const float *part_ml /* (n_head, n_split, 2) */, int j,
                                            int g, int hd, int n_split, int ns) {
    int lane = threadIdx.x % WARP, wid = threadIdx.x / WARP, nw = ATT_THREADS / WARP;
    float *wts = smem; // (g, ns) the weights, in the K/V staging area
    for (int hh = wid; hh < g; hh += nw) {
        const float *ml = part_ml + (size_t)(j * g + hh) * n_split * 2;
        float ms = lane < ns ? __ldcg(&ml[2 * lane]) : -INFINITY;
        float ls = lane < ns ? __ldcg(&ml[2 * lane + 1]) : 0.0f;
        float m = warp_max(ms), e = __expf(ms - m); // e = 0 past ns
        float l = warp_sum(ls * e);
        if (lane < ns) wts[hh * ns + lane] = e / l;
    }
    __syncthreads();
    const int NQ = ATT_MAX_OUT / 4;
    int q_head[NQ], q_dim[NQ];
    float4 om[NQ];
#pragma unroll
    for (int k = 0; k < NQ; k++) {
        int e = 4 * (threadIdx.x + k * ATT_THREADS);
        q_head[k] = e < g * hd ? e / hd : -1; // -1: no quad in this slot
        q_dim[k] = e % hd;
        om[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int k = 0; k < NQ; k++) {
        if (q_head[k] < 0) continue;
        const float4 *po =
            (const float4 *)(part_o + ((size_t)(j * g + q_head[k]) * n_split) * hd + q_dim[k]);
        const float *wt = wts + q_head[k] * ns;
        for (int sp0 = 0; sp0 < ns; sp0 += ATT_MERGE_DEPTH) {
            float4 v[ATT_MERGE_DEPTH];
#pragma unroll
            for (int q = 0; q < ATT_MERGE_DEPTH; q++)
                if (sp0 + q < ns) v[q] = __ldcg(po + (size_t)(sp0 + q) * hd / 4);
#pragma unroll
            for (int q = 0; q < ATT_MERGE_DEPTH; q++) {
                if (sp0 + q >= ns) break;
                float w = wt[sp0 + q];
                om[k].x += v[q].x * w; om[k].y += v[q].y * w;
                om[k].z += v[q].z * w; om[k].w += v[q].w * w;
            }
        }
    }
    float *mo = wts + (g * ns + 3) / 4 * 4; // after the weights
#pragma unroll
    for (int k = 0; k < NQ; k++)
        if (q_head[k] >= 0) *(float4 *)(mo + q_head[k] * hd + q_dim[k]) = om[k];
    __syncthreads();
    return mo;
}

// Step 5: qwen35's output gate, out = merged * sigmoid(gate), then the fp32 output and its 16-bit
// copy: one value per lane (a warp quantizes 32 consecutive values).
__device__ __forceinline__ void att_output_gate(const float *mo /* (g, hd) */, Act out,
                                                const float *gate, int gate_stride, int j, int g,
                                                int hd, int n_head) {
    int lane = threadIdx.x % WARP, nb = n_head * hd / 32;
#pragma unroll
    for (int k = 0; k < ATT_MAX_OUT; k++) {
        int i = threadIdx.x + k * ATT_THREADS; // whole warps: g*hd is a multiple of 32
        if (i >= g * hd) break;
        float v = mo[i];
        if (gate) v /= 1.0f + __expf(-gate[(size_t)(j * g + i / hd) * gate_stride + i % hd]);
        out.f[(size_t)j * g * hd + i] = v;
        if (out.q.q) quantize_block_warp(v, out.q, (j * g * hd + i - lane) / 32, nb);
    }
}

// The kernel: steps 1-5 above. C twin: attention_c (after rmsnorm_c and rope_neox_c).
// HD > 0: the head dim as a compile-time constant (unrolled loops, immediate offsets); 0: hd_arg.
template <int HD>
__global__ void __launch_bounds__(ATT_THREADS, 2) // 2 blocks per SM: at most 128 registers
attention_split_kernel(const float *q,    // (n_head, hd) roped (unused when cur.q_src is set)
                       __half *kc,        // (n_ctx, n_kv, hd) written at *pos when cur.q_src is set
                       __half *vc,        // (n_ctx, n_kv, hd)
                       AttNew cur,
                       float *part_o,     // (n_head, n_split, hd)
                       float *part_ml,    // (n_head, n_split, 2)
                       int *kv_done,      // (n_kv) counters, zero between tokens
                       Act out,           // (n_head, hd) the merged output
                       const float *gate, // (n_head, gate_stride) qwen35's gate, or NULL
                       int gate_stride,
                       const int *pos_p,  // (1) this token's position, on the GPU
                       int n_head, int n_kv, int hd_arg, int n_split, int chunk) {
    extern __shared__ uint4 smem[];
    const int hd = HD > 0 ? HD : hd_arg;
    int j = blockIdx.x, split = blockIdx.y, pos = *pos_p;
    AttCut cut = att_cut(pos, n_split, chunk); // this token's chunks and splits
    int ck = cut.ck, n_chunks = cut.n_chunks, cps = cut.cps, ns = cut.ns;
    if (split >= ns) return;
    int g = n_head / n_kv;
    AttShared sh;
    sh.K = (__half *)smem;
    sh.V = sh.K + (size_t)chunk * (hd + ATT_KPAD);
    sh.q = (float *)(sh.V + (size_t)chunk * hd);
    sh.p = sh.q + g * hd;
    sh.k = sh.p + g * chunk;
    sh.cs = (float2 *)(sh.k + hd);
    sh.kh = (__half *)(sh.cs + hd / 2);
    sh.vh = sh.kh + hd;
    __shared__ float mh[32], lh[32], ch[32]; // per query head (g <= 32): running m, l, rescale c
    // own: this block holds key pos (the last split) and writes this token's k and v into the cache
    int own = cur.q_src != NULL && split == ns - 1;
    // Chunk c's rows from the cache: att_chunk_len of them, less this token's own in the own
    // block's last chunk (they come from sh.kh, sh.vh: the cache row is written by this block).
#define ATT_CACHE_ROWS(c) (att_chunk_len(cut, pos, c) - (own && (c) == n_chunks - 1))
    int c_first = split * cps, c_end = att_split_end(cut, split);
    uint4 kr[ATT_STAGE], vr[ATT_STAGE]; // the first chunk's rows go out now: they do not need q
    att_rows_load(kr, vr, kc, vc, c_first * ck, ATT_CACHE_ROWS(c_first), n_kv, j, hd);
    att_load_q_kv(sh, cur, q, vc, j, g, hd, n_kv, pos, own);
    if (cur.q_src) {
        att_qk_norm_rope(sh, cur, g, hd, own);
        if (own) att_store_k(sh, kc, j, hd, n_kv, pos);
    }
    if (threadIdx.x < g) {
        mh[threadIdx.x] = -INFINITY;
        lh[threadIdx.x] = 0.0f;
    }
    // Output pairs: slot k of a thread holds dims (d, d+1) of head hh for pair p = threadIdx.x + k
    // * ATT_THREADS (element 2p of the g heads' outputs); its offsets are fixed for the block.
    const int NP = ATT_MAX_OUT / 2;
    float2 o[NP];
    int p_head[NP], p_dim[NP];
#pragma unroll
    for (int k = 0; k < NP; k++) {
        int e = 2 * (threadIdx.x + k * ATT_THREADS);
        p_head[k] = e < g * hd ? e / hd : -1; // -1: no pair in this slot
        p_dim[k] = e % hd;
        o[k] = make_float2(0.0f, 0.0f);
    }
    float scale = rsqrtf((float)hd);
    for (int c = c_first; c < c_end; c++) {
        int nt = att_chunk_len(cut, pos, c), nl = ATT_CACHE_ROWS(c);
        __syncthreads(); // the previous chunk is consumed
        att_stage_chunk(sh, kr, vr, nl, nt, hd);
        __syncthreads();
        if (c + 1 < c_end)
            att_rows_load(kr, vr, kc, vc, (c + 1) * ck, ATT_CACHE_ROWS(c + 1), n_kv, j, hd);
        att_chunk_scores(sh, g, nt, hd, chunk, scale);
        __syncthreads();
        att_softmax_update(sh.p, mh, lh, ch, g, nt, chunk);
        __syncthreads();
        att_accumulate_pv(o, p_head, p_dim, sh, ch, nt, hd, chunk);
    }
#undef ATT_CACHE_ROWS
    // step 3: this split's m, l and o
    if (threadIdx.x < g) {
        size_t idx = ((size_t)(j * g + threadIdx.x) * n_split + split) * 2;
        part_ml[idx] = mh[threadIdx.x];
        part_ml[idx + 1] = lh[threadIdx.x];
    }
#pragma unroll
    for (int k = 0; k < NP; k++)
        if (p_head[k] >= 0)
            *(float2 *)&part_o[((size_t)(j * g + p_head[k]) * n_split + split) * hd + p_dim[k]] =
                o[k];
    // the last split of this kv head to finish merges all of them
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&kv_done[j], 1) == ns - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    float *mo = att_merge((float *)smem, part_o, part_ml, j, g, hd, n_split, ns);
    att_output_gate(mo, out, gate, gate_stride, j, g, hd, n_head);
    if (threadIdx.x == 0) kv_done[j] = 0;
}

// The attention kernel for a head dim: those of the Qwen models compiled as constants, any other
// (the tiny test models) at run time.
typedef void (*AttKernel)(const float *, __half *, __half *, AttNew, float *, float *, int *, Act,
                          const float *, int, const int *, int, int, int, int, int);
static AttKernel att_kernel(int hd) {
    return hd == 128   ? attention_split_kernel<128>
           : hd == 256 ? attention_split_kernel<256>
                       : attention_split_kernel<0>;
}

// Attention of the token at *pos over one layer's cache: partial softmax states per split, merged
// into out (fp32 and quantized). n_split = att_splits(n_ctx, hd): the grid's splits per kv head
// (those past *pos return at once) and the slots of part_o / part_ml. cur: this token's raw q, k,
// v (RoPE and the KV store done here), or NULL: q roped already, the cache holding *pos. Needs
// head_dim * g a multiple of 32 (attention_setup checks it).
static void attention(const float *q /* (n_head, hd) or NULL */,
                      __half *kc /* (n_ctx, n_kv, hd) */, __half *vc /* (n_ctx, n_kv, hd) */,
                      const AttNew *cur, float *part_o /* (n_head, n_split, hd) */,
                      float *part_ml /* (n_head, n_split, 2) running max and sum */,
                      int *kv_done /* (n_kv) zeroed counters */, Act *out /* (n_head * hd) */,
                      const float *gate /* (n_head, gate_stride) or NULL */, int gate_stride,
                      const int *pos, int n_head, int n_kv, int hd, int n_split, cudaStream_t st) {
    int chunk = att_chunk(hd), g = n_head / n_kv;
    size_t smem = att_smem(g, hd, chunk);
    if (n_split < 1 || n_split > WARP)
        die("attention: %d splits per kv head (1..%d)", n_split, WARP);
    AttNew none;
    memset(&none, 0, sizeof none);
    att_kernel(hd)<<<dim3(n_kv, n_split), ATT_THREADS, smem, st>>>(
        q, kc, vc, cur ? *cur : none, part_o, part_ml, kv_done, *out, gate, gate_stride, pos,
        n_head, n_kv, hd, n_split, chunk);
    KERNEL_CHECK();
}

// Check once that the attention kernel gets the shared memory it needs (over 48 KB needs opting
// in).
static void attention_setup(int n_head, int n_kv, int hd) {
    int g = n_head / n_kv;
    size_t smem = att_smem(g, hd, att_chunk(hd));
    if (g > 32 || hd % 32 != 0 || hd > 2 * ATT_THREADS || g * hd > ATT_THREADS * ATT_MAX_OUT)
        die("attention: %d query heads per kv head of dim %d are not supported (head dim a "
            "multiple of 32 up to %d, query heads per kv head x head dim at most %d)",
            g, hd, 2 * ATT_THREADS, ATT_THREADS * ATT_MAX_OUT);
    int dev, optin;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (smem > (size_t)optin)
        die("attention needs %zu bytes of shared memory per block (%d query heads per kv head of "
            "dim %d); this GPU allows %d", smem, g, hd, optin);
    if (smem > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(att_kernel(hd), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)smem));
}

// --- 7.3 Gated DeltaNet (qwen35) -----------------------------------------------------------------
// Linear attention with a recurrent state per v head, an S x S matrix M. Per token:
//   conv   [q | k | v] = silu(causal 4-tap conv of the qkv projection)        gdn_conv_c
//   norms  q = q / ||q||,  k = k / ||k||                                        l2norm_c
//   gates  g = softplus(alpha + dt_bias) * a,  beta = sigmoid(beta_raw)        gdn_gates
//   rule   M = M e^g;  M = M + beta (v - M k) k^T;  o = M q / sqrt(S)          gdn_step_c
//   output rmsnorm(o) * w * silu(z)                                             gated_rmsnorm_c
// Three kernels run a token here (conv and norms, the rule, the gated norm); 7.4 runs all of it in
// one launch (gdn_token_kernel) for state sizes up to 128.

// The steps that both DeltaNet paths run the same way, as functions they share:

// Causal conv + SiLU of channel ch: y = silu(w[ch] . win) over its 4-tap window win = (the three
// previous inputs, from the conv state cs, oldest first; this token's input mixed[ch]).
__device__ __forceinline__ float gdn_conv_channel(const float *cs /* (3, conv_dim) */,
                                                  const float *mixed /* (conv_dim) */,
                                                  const float *w /* (conv_dim, 4) */, size_t ch,
                                                  size_t conv_dim, float win[4]) {
    win[0] = cs[ch];
    win[1] = cs[conv_dim + ch];
    win[2] = cs[2 * conv_dim + ch];
    win[3] = mixed[ch];
    float4 tap = ((const float4 *)w)[ch];
    return silu(win[0] * tap.x + win[1] * tap.y + win[2] * tap.z + win[3] * tap.w);
}
// The conv state of channel ch moves on by one input: the window's last three.
__device__ __forceinline__ void gdn_conv_shift(float *cs /* (3, conv_dim) */, size_t ch,
                                               size_t conv_dim, const float win[4]) {
    cs[ch] = win[1];
    cs[conv_dim + ch] = win[2];
    cs[2 * conv_dim + ch] = win[3];
}

// A lane's R rows j0 .. j0+R-1 of v head hv's state, C columns each (lg + L t), loaded and stored
// evict-first (__ldcs, __stcs): the states of all layers (~150 MB for the 27B) pass through L2 once
// per token.
template <int R, int C, int L>
__device__ __forceinline__ void gdn_state_load(float (&m)[R][C],
                                               const float *state /* (Hv, S, S) */, int hv, int j0,
                                               int lg, int S) {
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < C; t++)
            m[r][t] = __ldcs(&state[((size_t)hv * S + j0 + r) * S + lg + L * t]);
}
template <int R, int C, int L>
__device__ __forceinline__ void gdn_state_store(const float (&m)[R][C],
                                                float *state /* (Hv, S, S) */, int hv, int j0,
                                                int lg, int S) {
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < C; t++)
            __stcs(&state[((size_t)hv * S + j0 + r) * S + lg + L * t], m[r][t]);
}

// The gated RMSNorm of one value v of a head whose squares sum to ss: v / rms * w * silu(z).
__device__ __forceinline__ float gdn_gated_norm(float v, float ss, int S, float eps, float w,
                                                float z) {
    return v * rsqrtf(ss / S + eps) * w * silu(z);
}

// Finish channel *y of head block b of [q heads | k heads | v heads] after the conv: q and k heads
// are L2-normalised, y / max(||y||, eps); thread 0 of a v head's block computes the head's gates
//   g = softplus(alpha + dt_bias) * a  (the log decay),   beta = sigmoid(beta_raw).
// All threads of the block call it (the norm is a block reduction).
__device__ void gdn_head_finish(float *y, int b, int Hk, int Hv, const float *beta_raw,
                                const float *alpha_raw, const float *dt_bias, const float *ssm_a,
                                float *gb /* (2, Hv) */, float eps) {
    if (b < 2 * Hk) {
        float v = *y;
        float ss = block_sum(v * v);
        *y = v / fmaxf(sqrtf(ss), eps);
    } else if (threadIdx.x == 0) {
        int hv = b - 2 * Hk;
        gdn_gates(hv, beta_raw, alpha_raw, dt_bias, ssm_a, &gb[hv], &gb[Hv + hv]);
    }
}

// Causal conv + SiLU of the q/k/v projections, L2 norm of each q and k head, and the gates of each
// v head. Grid: 2*Hk + Hv blocks of S threads; block b holds channels [b*S, (b+1)*S) of
// [q heads | k heads | v heads]. In place on mixed. C twins: gdn_conv_c, l2norm_c; the gates are
// gdn_gates, which the CPU path runs too.
__global__ void
gdn_conv_norm_kernel(float *mixed,           // (conv_dim) in: projections, out: conv output
                     const float *w,         // (conv_dim, 4) conv taps
                     float *cs,              // (3, conv_dim) conv state, oldest first
                     const float *beta_raw,  // (Hv)
                     const float *alpha_raw, // (Hv)
                     const float *dt_bias,   // (Hv)
                     const float *ssm_a,     // (Hv)
                     float *gb,              // (2, Hv) out: g (log decay), beta
                     int Hk, int Hv, float eps) {
    int S = blockDim.x, conv_dim = (2 * Hk + Hv) * S, c = blockIdx.x * S + threadIdx.x;
    float win[4];
    float y = gdn_conv_channel(cs, mixed, w, c, conv_dim, win);
    gdn_conv_shift(cs, c, conv_dim, win);
    mixed[c] = y;
    gdn_head_finish(&mixed[c], blockIdx.x, Hk, Hv, beta_raw, alpha_raw, dt_bias, ssm_a, gb, eps);
}

// One token of the gated delta rule on R state rows of which this lane holds C columns (the row's
// other columns in the L - 1 lanes beside it, lg = lane % L), from this lane's columns qq, kk of
// q and k and the rows' values vv:
//   M = M * exp(g);  delta_j = beta * (v_j - M_j . k);  M_j += delta_j k;  oq_j = M_j . q
// (oq before the 1/sqrt(S) scale), with oq_j through M'_j . q before the update, so that one
// reduction over the L lanes sums M'_j . k, M'_j . q and k . q together (M' = M exp(g); oq_j =
// M'_j . q + delta_j k . q). Used by gdn_step_kernel and gdn_token_kernel.
template <int R, int C, int L>
__device__ __forceinline__ void gdn_rule(float (&m)[R][C] /* this lane's R rows x C columns of M */,
                                         const float *qq /* (C) this lane's columns of q */,
                                         const float *kk /* (C) */,
                                         const float *vv /* (R) this lane's rows of v */,
                                         float decay, float beta, float *oq /* (R) */) {
    float red[2 * R + 1]; // M'_j . k (r), M'_j . q (R + r), k . q (2R): this lane's part
    red[2 * R] = 0.0f;
#pragma unroll
    for (int t = 0; t < C; t++) red[2 * R] += kk[t] * qq[t];
#pragma unroll
    for (int r = 0; r < R; r++) {
        red[r] = red[R + r] = 0.0f;
#pragma unroll
        for (int t = 0; t < C; t++) {
            m[r][t] *= decay;
            red[r] += m[r][t] * kk[t];
            red[R + r] += m[r][t] * qq[t];
        }
    }
// the 2R + 1 butterflies over the row's L lanes, side by side
#pragma unroll
    for (int off = L / 2; off > 0; off /= 2)
#pragma unroll
        for (int i = 0; i < 2 * R + 1; i++) red[i] += __shfl_xor_sync(0xffffffffu, red[i], off);
#pragma unroll
    for (int r = 0; r < R; r++) {
        float delta = beta * (vv[r] - red[r]);
        oq[r] = red[R + r] + delta * red[2 * R];
#pragma unroll
        for (int t = 0; t < C; t++) m[r][t] += delta * kk[t];
    }
}

// The gated delta rule for T consecutive tokens. A state row (value index j, S floats) is held by L
// lanes, S/L floats each, in registers from the first token to the last; a warp holds 32/L groups
// of R rows, and a group's rows share the loads of q and k. Per token, gdn_rule, and o_j = oq_j /
// sqrt(S). A single token uses L = 32, R = 1 (the most blocks); a prompt L = 8 (16 when S > 128),
// R = 2: the reductions, log2(L) shuffle levels per value, are what a prompt's recurrence waits on.
// Grid (Hv, S / (GDN_ROWS * 32/L * R)). C twin: gdn_step_c.
#define GDN_ROWS 4 // warps per block (each holds 32/L groups of R state rows)
template <int NT, int R, int L>
__global__ void __launch_bounds__(GDN_ROWS * WARP)
gdn_step_kernel(float *state,      // (Hv, S, S) this layer's state
                const float *qkv,  // (T, conv_dim) [q (Hk,S) | k (Hk,S) | v (Hv,S)], conv + norms
                const float *gb,   // (T, 2, Hv) g, beta
                float *o,          // (T, Hv, S) out
                int S, int Hk, int Hv, int T) {
    constexpr int C = NT * WARP / L; // columns per lane: lg + L * t, t < C
    int hv = blockIdx.x, hk = hv % Hk, lane = threadIdx.x % WARP, lg = lane % L;
    // rows j0 .. j0+R-1
    int j0 = ((blockIdx.y * GDN_ROWS + threadIdx.x / WARP) * (WARP / L) + lane / L) * R;
    size_t conv_dim = (size_t)(2 * Hk + Hv) * S; // (the grid covers S rows exactly: no lane idles)
    float m[R][C]; // this thread's part of the state
    gdn_state_load<R, C, L>(m, state, hv, j0, lg, S);
    // the next token's q, k, v, g, beta are loaded while the current one is worked on
    float qn[C], kn[C], vn[R], gn = 0.0f, bn = 0.0f;
    auto fetch = [&](int tok) {
        const float *x = qkv + tok * conv_dim;
        const float *q = x + (size_t)hk * S, *k = x + (size_t)(Hk + hk) * S;
#pragma unroll
        for (int t = 0; t < C; t++) {
            qn[t] = q[lg + L * t];
            kn[t] = k[lg + L * t];
        }
#pragma unroll
        for (int r = 0; r < R; r++) vn[r] = x[(size_t)(2 * Hk + hv) * S + j0 + r];
        gn = gb[(size_t)tok * 2 * Hv + hv];
        bn = gb[(size_t)tok * 2 * Hv + Hv + hv];
    };
    fetch(0);
    for (int tok = 0; tok < T; tok++) {
        float qq[C], kk[C], vv[R];
#pragma unroll
        for (int t = 0; t < C; t++) { qq[t] = qn[t]; kk[t] = kn[t]; }
#pragma unroll
        for (int r = 0; r < R; r++) vv[r] = vn[r];
        float decay = __expf(gn), beta = bn;
        if (tok + 1 < T) fetch(tok + 1);
        float oq[R];
        gdn_rule<R, C, L>(m, qq, kk, vv, decay, beta, oq);
        // lane lg = r of the group writes row r (a register array indexed by a constant in each
        // branch)
        if (lg < R) {
#pragma unroll
            for (int r = 0; r < R; r++)
                if (lg == r) o[((size_t)tok * Hv + hv) * S + j0 + r] = oq[r] * rsqrtf((float)S);
        }
    }
    gdn_state_store<R, C, L>(m, state, hv, j0, lg, S);
}

// Launch gdn_step_kernel with NT = S/32 (S a multiple of 32 up to 256, checked when the model is
// read): a prompt with 8 lanes per row (16 when S > 128) and 2 rows per group, a single token with
// 32 and 1.
static void gdn_step(float *state /* (Hv, S, S) */, const float *qkv /* (T, conv_dim) */,
                     const float *gb /* (T, 2, Hv) */, float *o /* (T, Hv, S) */, int S, int Hk,
                     int Hv, int T, cudaStream_t st) {
    int L = T == 1 ? 32 : S > 128 ? 16 : 8, R = T == 1 ? 1 : 2;
    dim3 grid(Hv, S / (GDN_ROWS * (WARP / L) * R));
    int threads = GDN_ROWS * WARP;
#define ARGS state, qkv, gb, o, S, Hk, Hv, T
#define STEP(NT)                                                                                   \
    (L == 32   ? gdn_step_kernel<NT, 1, 32><<<grid, threads, 0, st>>>(ARGS)                        \
     : L == 16 ? gdn_step_kernel<NT, 2, 16><<<grid, threads, 0, st>>>(ARGS)                        \
               : gdn_step_kernel<NT, 2, 8><<<grid, threads, 0, st>>>(ARGS))
    switch (S / 32) {
    case 1: STEP(1); break;
    case 2: STEP(2); break;
    case 3: STEP(3); break;
    case 4: STEP(4); break;
    case 5: STEP(5); break;
    case 6: STEP(6); break;
    case 7: STEP(7); break;
    default: STEP(8); break;
    }
#undef STEP
#undef ARGS
    KERNEL_CHECK();
}

// Gated RMSNorm per v head, fp32 and quantized for the out-projection: out = rmsnorm(o) * w *
// silu(z). Grid Hv blocks of S threads. C twin: gated_rmsnorm_c.
__global__ void gdn_gated_norm_kernel(Act out, const float *o /* (Hv, S) */,
                                     const float *z /* (Hv, S) */, const float *w /* (S) */,
                                     float eps) {
    int S = blockDim.x, i = blockIdx.x * S + threadIdx.x;
    float v = o[i];
    float ss = block_sum(v * v);
    float zz = z[i];
    v = gdn_gated_norm(v, ss, S, eps, w[threadIdx.x], zz);
    out.f[i] = v;
    if (out.q.q) quantize_block_warp(v, out.q, i / 32, gridDim.x * S / 32);
}

// --- 7.4 a DeltaNet token in one launch ----------------------------------------------------------
// Speed: the five steps of 7.3 in one kernel, o and the gates kept on the SM: one launch a layer
// instead of three (test/PERF_NOTES.md, "Decode run 14"). A first reading can skip to 7.5: the
// three kernels of 7.3 compute the same, and are the path for state sizes above 128.
#define GDN_TOKEN_THREADS 1024

// Step 2 of gdn_token_kernel for thread t: channel i = t % S of part p = t / S (0: q of k head
// hk, 1: k of hk, 2: v of v head hv; threads from 3S on have none), its place ch in the conv's
// [q heads | k heads | v heads], its conv + SiLU into qs, ks or vs, and its window in win. A v
// channel's new conv state is stored at once: it is this block's alone (q and k's: step 5).
__device__ __forceinline__ size_t gdn_token_conv(float *qs, float *ks, float *vs /* (S) each */,
                                                 float *cs, const float *mixed, const float *w,
                                                 int p, int i, int hk, int hv, int Hk, int S,
                                                 size_t conv_dim, float win[4]) {
    size_t head = p == 0 ? hk : p == 1 ? Hk + hk : 2 * Hk + hv; // its head in [q | k | v]
    size_t ch = head * S + i;
    if (p < 3) {
        float y = gdn_conv_channel(cs, mixed, w, ch, conv_dim, win);
        (p == 0 ? qs : p == 1 ? ks : vs)[i] = y;
        if (p == 2) gdn_conv_shift(cs, ch, conv_dim, win);
    }
    return ch;
}

// Step 2's norms: ||q||^2 and ||k||^2 of the head into sq[0], sq[1] (warp 0 sums q's squares,
// warp 1 k's).
template <int S>
__device__ __forceinline__ void gdn_token_qk_squares(const float *qs, const float *ks /* (S) */,
                                                     float *sq /* (2) */, int lane, int wid) {
    if (wid < 2) {
        const float *v = wid ? ks : qs;
        float ss = 0.0f;
        for (int k = lane; k < S; k += WARP) ss += v[k] * v[k];
        ss = warp_sum(ss);
        if (lane == 0) sq[wid] = ss;
    }
}

// Step 3: the delta rule on this warp's rows j0 .. j0+R-1 (gdn_rule, 32 lanes per row) with q and k
// L2-normalised, q / max(||q||, eps); the state stored back, o = oq / sqrt(S) into os.
template <int R, int C>
__device__ __forceinline__ void gdn_token_rule(float (&m)[R][C], float *state, const float *qs,
                                               const float *ks, const float *vs, float *os,
                                               const float *sq /* (2) */,
                                               const float *gate /* (2) g, beta */, int hv,
                                               int j0, int lane, int S, float eps) {
    float qinv = 1.0f / fmaxf(sqrtf(sq[0]), eps), kinv = 1.0f / fmaxf(sqrtf(sq[1]), eps);
    float qq[C], kk[C], decay = __expf(gate[0]), beta = gate[1];
#pragma unroll
    for (int c = 0; c < C; c++) {
        qq[c] = qs[lane + 32 * c] * qinv;
        kk[c] = ks[lane + 32 * c] * kinv;
    }
    float oq[R];
    gdn_rule<R, C, WARP>(m, qq, kk, vs + j0, decay, beta, oq);
    gdn_state_store<R, C, WARP>(m, state, hv, j0, lane, S);
    if (lane < R) {
#pragma unroll
        for (int r = 0; r < R; r++)
            if (lane == r) os[j0 + r] = oq[r] * rsqrtf((float)S);
    }
}

// One token of a DeltaNet layer between its in-projections and its out-projection, in one launch
// (the three kernels of 7.3 do the same in three launches; they remain the path for S > 128, and
// a prompt runs gdn_step_kernel between its row kernels). Block hv takes v head hv and its k head
// hk = hv % Hk, in named steps:
//   1. its state (S x S, the kernel's bytes) requested first, S/32 rows per warp, lane l holding
//      columns l, l + 32, ... (gdn_state_load, gdn_step_kernel's L = 32 layout);
//   2. the conv + SiLU of its 3S channels (q and k of hk, v of hv: gdn_token_conv), the gates g,
//      beta (gdn_gates) and the squares of q and k for their L2 norms (gdn_token_qk_squares);
//   3. the delta rule (gdn_token_rule: gdn_rule, as gdn_step_kernel); o stays in shared memory;
//   4. the gated RMSNorm of o and its 16-bit copy (gdn_gated_norm, as gdn_gated_norm_kernel);
//   5. the new conv window of the q and k channels (gdn_conv_shift).
// The conv state of the v channels belongs to one block; that of the q and k channels is read by
// the Hv/Hk blocks that share hk, so none may overwrite it before all have read it: each block
// counts itself in after its reads (count[hk]), and the last to arrive writes the new window at its
// end and resets the count. No block waits for another, so any number of blocks may be resident.
// Grid Hv, 1024 threads (S = 32 * NT, NT <= 4). C twins: gdn_conv_c, l2norm_c, gdn_step_c,
// gated_rmsnorm_c, quantize_block_c; the gates are gdn_gates, which the CPU path runs too.
template <int NT>
__global__ void __launch_bounds__(GDN_TOKEN_THREADS)
gdn_token_kernel(float *state,           // (Hv, S, S) this layer's state
                 float *cs,              // (3, conv_dim) conv state, oldest first
                 const float *mixed,     // (conv_dim) the qkv projection, before the conv
                 const float *w,         // (conv_dim, 4) conv taps
                 const float *z,         // (Hv, S) the gate projection
                 const float *beta_raw,  // (Hv)
                 const float *alpha_raw, // (Hv)
                 const float *dt_bias,   // (Hv)
                 const float *ssm_a,     // (Hv)
                 const float *nw,        // (S) the gated norm's weight
                 Act out,                // (Hv, S) out: the out-projection's input
                 int *count,             // (Hk) blocks done reading head hk's conv state (0
                                         // between launches)
                 int Hk, int Hv, float eps) {
    constexpr int S = 32 * NT, R = NT, C = NT; // R rows per warp, C columns per lane
    __shared__ float qs[S], ks[S], vs[S], os[S]; // (S) this head's q, k, v and output
    __shared__ float part[2][32]; // part[0][0..1]: |q|^2, |k|^2; part[1][w]: warp w's sum of o^2
    __shared__ float gate[2];
    __shared__ int last;
    int hv = blockIdx.x, hk = hv % Hk, t = threadIdx.x, lane = t % WARP, wid = t / WARP,
        j0 = wid * R;
    size_t conv_dim = (size_t)(2 * Hk + Hv) * S;
    // 1. the state
    float m[R][C];
    gdn_state_load<R, C, WARP>(m, state, hv, j0, lane, S);
    float zz = t < S ? z[(size_t)hv * S + t] : 0.0f, wn = t < S ? nw[t] : 0.0f;
    // 2. the conv, the gates, the norms' squares
    int p = t / S;
    float win[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    size_t ch = gdn_token_conv(qs, ks, vs, cs, mixed, w, p, t % S, hk, hv, Hk, S, conv_dim, win);
    if (t == 0) gdn_gates(hv, beta_raw, alpha_raw, dt_bias, ssm_a, &gate[0], &gate[1]);
    __syncthreads(); // every read of the conv state is done: count this block in (its answer is
    int arrived = 0; // waited for only at the end, so the round trip overlaps the delta rule)
    if (t == 0) {
        fence_acq_rel();
        arrived = atomicAdd(&count[hk], 1);
    }
    gdn_token_qk_squares<S>(qs, ks, part[0], lane, wid);
    __syncthreads();
    // 3. the delta rule
    gdn_token_rule<R, C>(m, state, qs, ks, vs, os, part[0], gate, hv, j0, lane, S, eps);
    __syncthreads();
    // 4. gated RMSNorm of o (warps 0 .. NT-1 hold its S values) and the 16-bit copy; thread 0
    // learns whether this block was the last of k head hk to count in
    float v = 0.0f;
    if (wid < NT) {
        v = os[t];
        float ss = warp_sum(v * v);
        if (lane == 0) part[1][wid] = ss;
    }
    if (t == 0) {
        last = arrived == Hv / Hk - 1;
        if (last) {
            count[hk] = 0; // all have arrived: ready for the next launch
            fence_acq_rel();
        }
    }
    __syncthreads();
    if (wid < NT) {
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < NT; k++) ss += part[1][k];
        v = gdn_gated_norm(v, ss, S, eps, wn, zz);
        out.f[(size_t)hv * S + t] = v;
        if (out.q.q) quantize_block_warp(v, out.q, (hv * S + t) / 32, Hv * S / 32);
    }
    // 5. the last block of k head hk writes its q and k channels' new window
    if (last && p < 2) gdn_conv_shift(cs, ch, conv_dim, win);
}

// The DeltaNet token kernel for S = 32, 64, 96 or 128 (larger S: the three kernels).
static int gdn_token_ok(int S) { return S % 32 == 0 && S <= 128; }
// The launcher of gdn_token_kernel for state size S (its pointers' shapes are written there).
static void gdn_token(float *state /* (Hv, S, S) */, float *cs /* (3, conv_dim) */,
                      const float *mixed /* (conv_dim) */, const float *w /* (conv_dim, 4) */,
                      const float *z /* (Hv, S) */, const float *beta_raw /* (Hv) */,
                      const float *alpha_raw /* (Hv) */, const float *dt_bias /* (Hv) */,
                      const float *ssm_a /* (Hv) */, const float *nw /* (S) */,
                      const Act *out /* (Hv, S) */, int *count /* (Hk) */, int S, int Hk, int Hv,
                      float eps, cudaStream_t st) {
#define TOKEN(NT)                                                                                  \
    gdn_token_kernel<NT><<<Hv, GDN_TOKEN_THREADS, 0, st>>>(state, cs, mixed, w, z, beta_raw,       \
                                                           alpha_raw, dt_bias, ssm_a, nw, *out,    \
                                                           count, Hk, Hv, eps)
    switch (S / 32) {
    case 1: TOKEN(1); break;
    case 2: TOKEN(2); break;
    case 3: TOKEN(3); break;
    default: TOKEN(4); break;
    }
#undef TOKEN
    KERNEL_CHECK();
}

// --- 7.5 SwiGLU ----------------------------------------------------------------------------------
// h = silu(h) * u, fp32 and quantized (n a multiple of 32 for the quantized copy): the FFN's
// activation after its gate and up mat-vecs. C twin: the silu_c(hb) * hb2 loop in ffn_block_cpu.
__global__ void silu_mul_quant_kernel(Act h /* (n) in and out */, const float *u /* (n) */, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = 0.0f;
    if (i < n) {
        float gv = h.f[i];
        v = silu(gv) * u[i];
        h.f[i] = v;
    }
    if (h.q.q && n % 32 == 0 && i - threadIdx.x % WARP < n)
        quantize_block_warp(v, h.q, i / 32, n / 32);
}

// h = silu(G x) * (U x) for the FFN, fp32 and quantized: gate and up as one batch of mat-vecs
// (gate into h, up into u), then silu_mul_quant_kernel.
static void ffn_gate_up(const Tensor *G, const Tensor *U, const Act *in, Act *h /* (n_ff) */,
                        float *u /* (n_ff) scratch */, cudaStream_t st) {
    const Tensor *W[2] = {G, U};
    const float *nob[2] = {NULL, NULL};
    float *y[2] = {h->f, u};
    int n_ff = (int)G->n_out;
    matvec_batch(2, W, nob, y, in, st);
    silu_mul_quant_kernel<<<(n_ff + 255) / 256, 256, 0, st>>>(*h, u, n_ff);
    KERNEL_CHECK();
}

// ------------------------------------------------------------------------------------------------
// 8. Prefill kernels: a batch of prompt tokens through a layer at once
// ------------------------------------------------------------------------------------------------
// Speed: the whole section. Without it (-b 1) a prompt goes token by token through the decode path
// of sections 6, 7 and 9, the exact reference; batched, pp512 runs at ~2,900 tokens/s on an H100
// for the 27B (test/PERF_NOTES.md, "Prefill (section 8)", "Prefill run 6").
//
// Decode reads every weight once per token and is bound by memory bandwidth. The T tokens of a
// prompt batch can share those reads: each mat-vec becomes a matrix product
//
//   Y (T, n_out) = X (T, n_in) . W^T,     2*T flops per weight read,
//
// which is compute-bound for T in the hundreds. The products run on the tensor cores through WMMA
// (16x16x16 fp16 tiles, fp32 accumulation: the sm_70 instruction set, and the same PTX runs on
// every later GPU). The weights are dequantized to fp16 inside the product, tile by tile, straight
// from the repacked planes (every quantized type has them), or from the rows of an F16 or BF16
// file (below).
// Everything around the products (norms, RoPE, attention, the DeltaNet recurrence) works on all T
// rows in one launch.
//
// Activations enter a product as fp16 rows with one power-of-two scale per row:
//   x[t, i] = s[t] * X[t, i],   s[t] = 2^(e - 12) where max_i |x[t, i]| < 2^e
// so the largest value of a row is below 4096 whatever the model's activation range (fp16 overflows
// at 65504), and the scaling itself is exact. The product's epilogue multiplies row t by s[t].
//
// Float weights. F16 weights enter the tiles as they are. A BF16 weight (8 bits of precision) is
// exact in fp16 (11 bits) for 2^-17 <= |w| <= 65280 (fp16's subnormals, multiples of 2^-24, still
// hold 8 bits down to 2^-17); below, fp16 rounds it to a multiple of 2^-24, an absolute error of
// at most 2^-25, and from 2^16 up it would overflow: a BF16 file with such a weight (the upload
// looks; no released model has one) sends its prompts token by token. F32 weights (the exact fp32
// reference files) are the exception: 24 bits of precision, and a range past fp16's, so their
// products run in fp32 on the CUDA cores from an fp32 copy of the rows (ActH.f).
// The fp16 activations cost some exactness against the token-by-token path (whose inputs stay
// fp32 for the float types), which is why --dump-logits goes token by token unless -b is given.

typedef struct {
    __half *h; // (T, ld) X = x / s
    float *s;  // (T) row scales
    int ld;    // row stride in elements (a multiple of 8)
    float *f;  // (T, ld) the rows x in fp32 for F32 weights (above), or NULL: none needs them
} ActH;

// The tensor cores' tiles through WMMA (sm_70+): 16x16x16, fp16 operands, fp32 sums.
namespace wmma = nvcuda::wmma;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> FragAcc;                // C (16, 16)
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> FragA;   // A (16, 16)
template <class LAYOUT> using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, LAYOUT>;

// The power-of-two scale of a row whose largest magnitude is amax: s = 2^(e - 12), amax < 2^e.
__host__ __device__ static float row_scale(float amax) {
    if (!(amax > 0.0f) || amax > 1e30f) return 1.0f; // zero, inf or nan rows: nothing to scale
    int e;
    frexpf(amax, &e); // amax = f * 2^e, f in [0.5, 1)
    return ldexpf(1.0f, e - 12);
}

// --- weight tiles: one 32-weight unit as fp16 ----------------------------------------------------
// The 32 weights of unit u of a weight row as fp16 (the C twin: mm_weight_row), in two steps so
// that the product can have the loads of the next tile in flight while it multiplies the current
// one:
//   w_load<TYPE>(W, g, NB) -> WRaw   the unit's bytes: its quants (16 bytes; Q8_0: 32) and its
//                                     scales; F16, BF16: the 64 bytes of its 32 values
//   w_decode<TYPE>(raw, out)          32 fp16 weights
// from the planes (layout in 6.3) at sub-block g, the plane index of (row, u): row * n_sub + u, or
// its step-order slot (plane_g); F16 and BF16 from the file's rows, where unit g = row * n_sub + u
// is the 64 bytes at 64 g.
//
// The decode works on pairs of fp16 (half2), with no int -> float conversion: a small integer c
// (0..255) becomes an fp16 by writing it under the exponent of 1024, whose ulp is 1,
//   bits 0x6400 | c  =  1024 + c   (exact),    so   (0x6400 | c) - (1024 + o) = c - o   (exact)
// and one byte permute builds two of them from two bytes of quants. The weight is then one fp16
// multiply by the sub-block scale rounded to fp16: one rounding, as in the twin.
//   Q4_0:   c = q,          w = (c - 8) * d          (d is fp16 already: the exact value)
//   Q5_0:   c = q (5 bits), w = (c - 16) * d
//   Q8_0:   c = q + 128,    w = (c - 128) * d
//   IQ4_NL: c = kvalue + 128, w = (c - 128) * d
//   IQ4_XS: c = kvalue + 128, w = (c - 128) * fp16(d * (ls - 32))
//   Q6_K:   c = q (6 bits), w = (c - 32) * fp16(d * sc)
// Q4_1, Q5_1, Q4_K and Q5_K stay in fp32 (the same trick under the exponent of 2^23, then w = q * d
// + m, or q * d*sc - dmin*m, in one fma and one rounding to fp16): their min term is shared by the
// sub-block's 32 weights, and rounding it to fp16 first multiplies the error (test/PERF_NOTES.md,
// "Design record").

// q: quants (Q8_0: and f), e: scales; F16 and BF16: values 0..7 in q, 8..15 in e, 16..23 in f,
// 24..31 in h
typedef struct { uint4 q, e, f, h; } WRaw;

template <int TYPE>
__device__ WRaw w_load(const uint8_t *W /* planes (NB sub-blocks) */, size_t g, size_t NB);
template <int TYPE> __device__ void w_decode(const WRaw &r, __half *out);

// Bytes 0, 1 (sel 0x5140) or 2, 3 (sel 0x5342) of c as the fp16 pair 1024 + c, minus 1024 + o.
__device__ __forceinline__ __half2 small_ints_h2(uint32_t c, int sel, __half2 off) {
    uint32_t h = (uint32_t)prmt((int)c, 0x64646464, sel);
    return __hsub2(*(__half2 *)&h, off);
}
// The 4 + 4 integers of lo (elements 4k..4k+3) and hi (16+4k..16+4k+3), each minus o, times scale
// sc_lo / sc_hi, to the 32 fp16 weights out of the unit.
__device__ __forceinline__ void put8(__half *out, int k, uint32_t lo, uint32_t hi, __half2 off,
                                     __half2 sc_lo, __half2 sc_hi) {
    __half2 *o = (__half2 *)out;
    o[2 * k] = __hmul2(small_ints_h2(lo, 0x5140, off), sc_lo);
    o[2 * k + 1] = __hmul2(small_ints_h2(lo, 0x5342, off), sc_lo);
    o[8 + 2 * k] = __hmul2(small_ints_h2(hi, 0x5140, off), sc_hi);
    o[8 + 2 * k + 1] = __hmul2(small_ints_h2(hi, 0x5342, off), sc_hi);
}

// Q4_0: e.x = d. Word k of q: low nibbles = elements 4k..4k+3, high nibbles = 16+4k..
template <>
__device__ __forceinline__ WRaw w_load<GGML_TYPE_Q4_0>(const uint8_t *W, size_t g, size_t NB) {
    WRaw r;
    r.q = __ldg((const uint4 *)W + g);
    r.e.x = __ldg((const uint16_t *)(W + 16 * NB) + g);
    return r;
}
template <> __device__ __forceinline__ void w_decode<GGML_TYPE_Q4_0>(const WRaw &r, __half *out) {
    __half2 d = __half2half2(__ushort_as_half((unsigned short)r.e.x)),
            off = __float2half2_rn(1024.0f + 8.0f);
    const int *qw = (const int *)&r.q;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        int lo, hi;
        nibbles(qw[k], &lo, &hi);
        put8(out, k, (uint32_t)lo, (uint32_t)hi, off, d, d);
    }
}

// Q8_0: q = elements 0..15, f = 16..31 (int8), e.x = d
template <>
__device__ __forceinline__ WRaw w_load<GGML_TYPE_Q8_0>(const uint8_t *W, size_t g, size_t NB) {
    WRaw r;
    r.q = __ldg((const uint4 *)W + 2 * g);
    r.f = __ldg((const uint4 *)W + 2 * g + 1);
    r.e.x = __ldg((const uint16_t *)(W + 32 * NB) + g);
    return r;
}
template <> __device__ __forceinline__ void w_decode<GGML_TYPE_Q8_0>(const WRaw &r, __half *out) {
    __half2 d = __half2half2(__ushort_as_half((unsigned short)r.e.x)),
            off = __float2half2_rn(1024.0f + 128.0f);
    const uint32_t *lo = (const uint32_t *)&r.q, *hi = (const uint32_t *)&r.f;
#pragma unroll
    for (int k = 0; k < 4; k++) put8(out, k, lo[k] ^ 0x80808080u, hi[k] ^ 0x80808080u, off, d, d);
}

// IQ4_NL: e.x = d; q as IQ4_XS's
template <>
__device__ __forceinline__ WRaw w_load<GGML_TYPE_IQ4_NL>(const uint8_t *W, size_t g, size_t NB) {
    WRaw r;
    r.q = __ldg((const uint4 *)W + g);
    r.e.x = __ldg((const uint16_t *)(W + 16 * NB) + g);
    return r;
}
template <> __device__ __forceinline__ void w_decode<GGML_TYPE_IQ4_NL>(const WRaw &r, __half *out) {
    __half2 d = __half2half2(__ushort_as_half((unsigned short)r.e.x)),
            off = __float2half2_rn(1024.0f + 128.0f);
    const int *qw = (const int *)&r.q;
#pragma unroll
    for (int k = 0; k < 4; k++) { // the table lookup in registers (iq4_lookup8, 6.4), then + 128
        int lo, hi;
        iq4_lookup8(qw[k], &lo, &hi);
        put8(out, k, (uint32_t)lo ^ 0x80808080u, (uint32_t)hi ^ 0x80808080u, off, d, d);
    }
}

// IQ4_XS: e.x, e.y = the super-block's header entry (d, 8 scales), e.z = the sub-block (0..7)
template <>
__device__ __forceinline__ WRaw w_load<GGML_TYPE_IQ4_XS>(const uint8_t *W, size_t g, size_t NB) {
    // the super-block's 8 header bytes at once
    uint2 hdr = __ldg((const uint2 *)(W + 16 * NB) + g / 8);
    WRaw r;
    r.q = __ldg((const uint4 *)W + g);
    r.e = make_uint4(hdr.x, hdr.y, (uint32_t)(g % 8), 0);
    return r;
}
template <> __device__ __forceinline__ void w_decode<GGML_TYPE_IQ4_XS>(const WRaw &r, __half *out) {
    int sub = (int)r.e.z;
    int ls = iq4_plane_ls(r.e.x, r.e.y, sub);
    __half2 dl = __float2half2_rn(fp16_to_f32((uint16_t)r.e.x) * (float)(ls - 32)),
            off = __float2half2_rn(1024.0f + 128.0f);
    const int *qw = (const int *)&r.q;
#pragma unroll
    for (int k = 0; k < 4; k++) { // the table lookup in registers (iq4_lookup8, 6.4): 4 + 4 int8
        int lo, hi;
        iq4_lookup8(qw[k], &lo, &hi);
        // int8 + 128
        put8(out, k, (uint32_t)lo ^ 0x80808080u, (uint32_t)hi ^ 0x80808080u, off, dl, dl);
    }
}

// A K-quant sub-block's 32 weights from its values q (lo: elements 4k..4k+3 in word k, hi:
// 16+4k..16+4k+3), dsc = d * sc and dmm = dmin * m: fp32, byte b under the exponent of 2^23 (ulp
// 1), then one fma and one rounding to fp16.
__device__ __forceinline__ void k_weights_f16(const int *lo, const int *hi, float dsc, float dmm,
                                              __half *out) {
    __half2 *o = (__half2 *)out;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float w[8];
#pragma unroll
        for (int b = 0; b < 4; b++) {
            float ql = __uint_as_float((uint32_t)prmt(lo[k], 0x4b000000, 0x7540 + b)) - 8388608.0f;
            float qh = __uint_as_float((uint32_t)prmt(hi[k], 0x4b000000, 0x7540 + b)) - 8388608.0f;
            w[b] = fmaf(ql, dsc, -dmm);
            w[4 + b] = fmaf(qh, dsc, -dmm);
        }
        o[2 * k] = __floats2half2_rn(w[0], w[1]);
        o[2 * k + 1] = __floats2half2_rn(w[2], w[3]);
        o[8 + 2 * k] = __floats2half2_rn(w[4], w[5]);
        o[8 + 2 * k + 1] = __floats2half2_rn(w[6], w[7]);
    }
}

// Q4_K: e.y = d * sc, e.z = dmin * m (fp32 bits, exact)
template <>
__device__ __forceinline__ WRaw w_load<GGML_TYPE_Q4_K>(const uint8_t *W, size_t g, size_t NB) {
    uint4 h = __ldg((const uint4 *)(W + 16 * NB + 16 * (g / 8))); // d, dmin, scales[12]
    int sc, m;
    k_scale_min_words((int)(g % 8), h.y, h.z, h.w, &sc, &m);
    WRaw r;
    r.q = __ldg((const uint4 *)W + g);
    r.e = make_uint4(0, __float_as_uint(fp16_to_f32((uint16_t)h.x) * sc),
                     __float_as_uint(fp16_to_f32((uint16_t)(h.x >> 16)) * m), 0);
    return r;
}
// Q4_K and Q4_1: the nibbles of q are the values; e.y, e.z as k_weights_f16 takes them
__device__ __forceinline__ void nibble_weights_f16(const WRaw &r, __half *out) {
    const int *qw = (const int *)&r.q;
    int lo[4], hi[4];
#pragma unroll
    for (int k = 0; k < 4; k++) nibbles(qw[k], &lo[k], &hi[k]);
    k_weights_f16(lo, hi, __uint_as_float(r.e.y), __uint_as_float(r.e.z), out);
}
template <> __device__ __forceinline__ void w_decode<GGML_TYPE_Q4_K>(const WRaw &r, __half *out) {
    nibble_weights_f16(r, out);
}

// Q4_1: e.y = d, e.z = -m (fp32 bits, exact)
template <>
__device__ __forceinline__ WRaw w_load<GGML_TYPE_Q4_1>(const uint8_t *W, size_t g, size_t NB) {
    uint32_t dm = __ldg((const uint32_t *)(W + 16 * NB) + g);
    WRaw r;
    r.q = __ldg((const uint4 *)W + g);
    r.e = make_uint4(0, __float_as_uint(fp16_to_f32((uint16_t)dm)),
                     __float_as_uint(-fp16_to_f32((uint16_t)(dm >> 16))), 0);
    return r;
}
template <> __device__ __forceinline__ void w_decode<GGML_TYPE_Q4_1>(const WRaw &r, __half *out) {
    nibble_weights_f16(r, out);
}

// Q5_0: e.x = the 32 high bits, e.y = d (fp16 bits)
template <>
__device__ __forceinline__ WRaw w_load<GGML_TYPE_Q5_0>(const uint8_t *W, size_t g, size_t NB) {
    WRaw r;
    r.q = __ldg((const uint4 *)W + g);
    r.e.x = __ldg((const uint32_t *)(W + 16 * NB) + g);
    r.e.y = __ldg((const uint16_t *)(W + 20 * NB) + g);
    return r;
}
template <> __device__ __forceinline__ void w_decode<GGML_TYPE_Q5_0>(const WRaw &r, __half *out) {
    __half2 d = __half2half2(__ushort_as_half((unsigned short)r.e.y)),
            off = __float2half2_rn(1024.0f + 16.0f);
    int lo[4], hi[4];
    q5_values(*(const int4 *)&r.q, (int)r.e.x, lo, hi);
#pragma unroll
    for (int k = 0; k < 4; k++) put8(out, k, (uint32_t)lo[k], (uint32_t)hi[k], off, d, d);
}

// Q5_1: e.x = the 32 high bits, e.y = d, e.z = -m (fp32 bits, exact)
template <>
__device__ __forceinline__ WRaw w_load<GGML_TYPE_Q5_1>(const uint8_t *W, size_t g, size_t NB) {
    uint32_t dm = __ldg((const uint32_t *)(W + 20 * NB) + g);
    WRaw r;
    r.q = __ldg((const uint4 *)W + g);
    r.e = make_uint4(__ldg((const uint32_t *)(W + 16 * NB) + g),
                     __float_as_uint(fp16_to_f32((uint16_t)dm)),
                     __float_as_uint(-fp16_to_f32((uint16_t)(dm >> 16))), 0);
    return r;
}
template <> __device__ __forceinline__ void w_decode<GGML_TYPE_Q5_1>(const WRaw &r, __half *out) {
    int lo[4], hi[4];
    q5_values(*(const int4 *)&r.q, (int)r.e.x, lo, hi);
    k_weights_f16(lo, hi, __uint_as_float(r.e.y), __uint_as_float(r.e.z), out);
}

// Q5_K: e.x = the 32 high bits (bit j: element j), e.y = d * sc, e.z = dmin * m (fp32 bits, exact)
template <>
__device__ __forceinline__ WRaw w_load<GGML_TYPE_Q5_K>(const uint8_t *W, size_t g, size_t NB) {
    uint4 h = __ldg((const uint4 *)(W + 20 * NB + 16 * (g / 8))); // d, dmin, scales[12]
    int sc, m;
    k_scale_min_words((int)(g % 8), h.y, h.z, h.w, &sc, &m);
    WRaw r;
    r.q = __ldg((const uint4 *)W + g);
    r.e = make_uint4(__ldg((const uint32_t *)(W + 16 * NB) + g),
                     __float_as_uint(fp16_to_f32((uint16_t)h.x) * sc),
                     __float_as_uint(fp16_to_f32((uint16_t)(h.x >> 16)) * m), 0);
    return r;
}
template <> __device__ __forceinline__ void w_decode<GGML_TYPE_Q5_K>(const WRaw &r, __half *out) {
    int lo[4], hi[4];
    q5_values(*(const int4 *)&r.q, (int)r.e.x, lo, hi);
    k_weights_f16(lo, hi, __uint_as_float(r.e.y), __uint_as_float(r.e.z), out);
}

// Q6_K: e.x / e.y = the 2-bit highs of elements 0..15 / 16..31 (byte j%4, bits 2*((j%16)/4)),
// e.z / e.w = d * sc of each half (fp32 bits, exact)
template <>
__device__ __forceinline__ WRaw w_load<GGML_TYPE_Q6_K>(const uint8_t *W, size_t g, size_t NB) {
    int sub = (int)(g % 8);
    uint2 hi = __ldg((const uint2 *)(W + 16 * NB) + g);
    const int8_t *sc = (const int8_t *)(W + 24 * NB + 16 * (g / 8) + 2 * sub);
    float d = fp16_to_f32(__ldg((const uint16_t *)(W + 26 * NB) + g / 8));
    WRaw r;
    r.q = __ldg((const uint4 *)W + g);
    r.e = make_uint4(hi.x, hi.y, __float_as_uint(d * __ldg(sc)),
                     __float_as_uint(d * __ldg(sc + 1)));
    return r;
}
template <> __device__ __forceinline__ void w_decode<GGML_TYPE_Q6_K>(const WRaw &r, __half *out) {
    __half2 s_lo = __float2half2_rn(__uint_as_float(r.e.z)),
            s_hi = __float2half2_rn(__uint_as_float(r.e.w));
    __half2 off = __float2half2_rn(1024.0f + 32.0f);
    const int *qw = (const int *)&r.q;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        int lo, hi;
        nibbles(qw[k], &lo, &hi);
        put8(out, k, (uint32_t)lo | (((r.e.x >> (2 * k)) & 0x03030303) << 4),
             (uint32_t)hi | (((r.e.y >> (2 * k)) & 0x03030303) << 4), off, s_lo, s_hi);
    }
}

// F16 and BF16: the unit's 64 bytes, row-major (no planes)
template <>
__device__ __forceinline__ WRaw w_load<GGML_TYPE_F16>(const uint8_t *W, size_t g, size_t NB) {
    const uint4 *p = (const uint4 *)W + 4 * g;
    WRaw r = {__ldg(p), __ldg(p + 1), __ldg(p + 2), __ldg(p + 3)};
    return r;
}
template <>
__device__ __forceinline__ WRaw w_load<GGML_TYPE_BF16>(const uint8_t *W, size_t g, size_t NB) {
    return w_load<GGML_TYPE_F16>(W, g, NB);
}
template <> __device__ __forceinline__ void w_decode<GGML_TYPE_F16>(const WRaw &r, __half *out) {
    uint4 *o = (uint4 *)out;
    o[0] = r.q, o[1] = r.e, o[2] = r.f, o[3] = r.h;
}
// BF16: the 16 bits b of a value are the fp32 value b << 16 (exact), rounded once to fp16 (exact
// for 2^-17 <= |w| <= 65280: section 8's header)
template <> __device__ __forceinline__ void w_decode<GGML_TYPE_BF16>(const WRaw &r, __half *out) {
    const uint32_t *u = (const uint32_t *)&r; // 16 words of 2 values, the lower half first
    __half2 *o = (__half2 *)out;
#pragma unroll
    for (int i = 0; i < 16; i++)
        o[i] = __floats2half2_rn(__uint_as_float(u[i] << 16), __uint_as_float(u[i] & 0xffff0000u));
}

// --- the product ---------------------------------------------------------------------------------
// y[t, n] = s[t] * sum_k X[t, k] W[n, k] (+ bias[n]) (+ y[t, n] when accumulate),
// for t < T, n < n_out.
//
// Tiles. The output is cut into tiles of MM_TT tokens x MM_TN weight rows, and k into steps of 64
// (two 32-weight units). A step stages the tile's X (fp16 rows) and W (decoded here, one unit per
// thread, so the two threads of a row read one contiguous piece of the planes, 32 bytes (Q8_0: 64,
// F16 and BF16: 128 bytes of the row); X in 16-byte chunks, four whole rows per warp load) in
// shared memory, and the 8 warps multiply them with WMMA, each warp owning 64 tokens x 32 rows
// (4 x 2 fragments of 16x16 fp32 accumulators). The next step's bytes are loaded into registers
// before the tensor cores work on the current step and are decoded and stored to the other half of
// a double buffer after: one barrier per step.
//
// Work split ("stream-K"). A grid of whole tiles rarely fills the GPU evenly: a 512-token prompt
// through a 17408-row weight is 544 tiles, 2.06 waves of the H200's 264 resident blocks, so the
// third wave runs with 16 blocks and most SMs idle (and a 5120-row weight is 0.6 of a wave). So the
// grid is exactly the blocks that fit on the GPU at once (G), and the work is counted in steps:
// the tiles in order (token tile fastest, so the blocks that read the same weight tile run side by
// side and the weights come from DRAM about once), each n_steps long, make one sequence of
// n_tiles * n_steps steps, and block b takes steps [b * total / G, (b + 1) * total / G). Every
// block does the same work to within one step. A tile whose steps all fall in one block is written
// with its scale, bias and accumulation here; a tile cut between blocks leaves a partial sum per
// piece in part, where block b has two slots: 0 for a piece that starts inside a tile (only the
// first piece of a block can), 1 for a piece that starts at k = 0 and stops inside it (only the
// last can). matmul_fixup_kernel then adds each cut tile's pieces in k order (deterministic).
// C twin: matmul_c.
#define MM_TT 128      // tokens per tile
#define MM_TN 128      // weight rows per tile
#define MM_LD 72       // shared-memory row stride in halves: 64 + 8 keeps rows 16-byte aligned and
                       // spreads the fragment loads over the banks
#define MM_THREADS 256
#define MM_SMEM (2 * (MM_TT + MM_TN) * MM_LD * 2) // bytes: both tiles, double-buffered (72 KB)
#define MM_SLOT (MM_TT * MM_TN)                    // floats in one partial-sum slot

// The block that owns step s of total when G blocks share them (inverse of b -> b * total / G).
__host__ __device__ static inline int mm_owner(long long s, long long total, int G) {
    return (int)(((s + 1) * G - 1) / total);
}

// One step of a tile: acc += X W^T over its 64 k, from the staged tiles xc (MM_TT, MM_LD) and
// wc (MM_TN, MM_LD) fp16. Warp (wt, wn) owns tokens 64 wt .. (4 fragments) x rows 32 wn .. (2).
__device__ __forceinline__ void mm_multiply_step(FragAcc (&acc)[4][2], const __half *xc,
                                                 const __half *wc, int wt, int wn) {
#pragma unroll
    for (int kk = 0; kk < 64; kk += 16) {
        FragB<wmma::col_major> b[2];
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::load_matrix_sync(b[j], wc + (32 * wn + 16 * j) * MM_LD + kk, MM_LD);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            FragA a;
            wmma::load_matrix_sync(a, xc + (64 * wt + 16 * i) * MM_LD + kk, MM_LD);
#pragma unroll
            for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], a, b[j], acc[i][j]);
        }
    }
}

// The epilogue of a piece of tile (t0, n0): each fragment goes through the warp's 16x16 fp32 patch
// of shared memory, then every lane writes 8 of its values times the row scale s[t]: a whole tile
// to y with the bias and accumulation, a piece cut between blocks to its slot (MM_TT, MM_TN) of
// part, for matmul_fixup_kernel.
__device__ __forceinline__ void mm_store_piece(const FragAcc (&acc)[4][2], float *patch,
                                               int whole, float *slot, float *y /* (T, ldy) */,
                                               int ldy,
                                               const float *s /* (T) */,
                                               const float *bias /* (n_out) or NULL */, int t0,
                                               int n0, int wt, int wn, int T, int n_out,
                                               int accumulate) {
    int lane = threadIdx.x % WARP;
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
            wmma::store_matrix_sync(patch, acc[i][j], 16, wmma::mem_row_major);
            __syncwarp();
            for (int e = lane; e < 256; e += WARP) {
                // in the tile
                int lt = 64 * wt + 16 * i + e / 16, ln = 32 * wn + 16 * j + e % 16;
                int tt = t0 + lt, nn = n0 + ln;
                if (tt < T && nn < n_out) {
                    float v = patch[e] * s[tt];
                    if (!whole) {
                        slot[lt * MM_TN + ln] = v;
                    } else {
                        float *dst = y + (size_t)tt * ldy + nn;
                        *dst = (accumulate ? *dst : 0.0f) + v + (bias ? bias[nn] : 0.0f);
                    }
                }
            }
            __syncwarp();
        }
}

// The types of matmul_kernel: the fast types, and F16 and BF16, whose rows it reads as they are.
// MM_TYPE_SWITCH: FAST_TYPE_SWITCH (6.3) with these two.
static int is_mm_type(int t) {
    return is_fast_type(t) || t == GGML_TYPE_F16 || t == GGML_TYPE_BF16;
}
#define MM_TYPE_SWITCH(type, LAUNCH)                            \
    switch (type) {                                             \
    case GGML_TYPE_F16: LAUNCH(GGML_TYPE_F16); break;           \
    case GGML_TYPE_BF16: LAUNCH(GGML_TYPE_BF16); break;         \
    default: FAST_TYPE_SWITCH(type, LAUNCH)                     \
    }

// Two blocks per SM: at most 128 registers per thread. (A V100 holds one 72 KB block per SM anyway;
// there the bound costs its native sm_70 code some spills.) C twin: matmul_c.
template <int TYPE>
__global__ void __launch_bounds__(MM_THREADS, 2)
matmul_kernel(const uint8_t *W, // weights in planes (6.3), or the rows of F16 and BF16
              size_t NB,        // 32-weight sub-blocks (units) in W
              StepOrder so,     // the planes' order (6.7); row by row (upw 0) for F16, BF16
              ActH x,           // (T, x.ld) input rows
              float *y,         // (T, ldy) output
              float *part,      // (gridDim.x, 2, MM_TT, MM_TN) partial sums of cut tiles
              int ldy, const float *bias /* (n_out) or NULL */, int T, int n_in, int n_out,
              int accumulate) {
    extern __shared__ __align__(32) uint8_t mm_smem[];
    // [2][MM_TT * MM_LD] and [2][MM_TN * MM_LD]: both tiles, double-buffered
    __half *xs = (__half *)mm_smem, *ws = xs + 2 * MM_TT * MM_LD;
    int warp = threadIdx.x / WARP;
    int wt = warp / 4, wn = warp % 4;                   // warp tile: tokens 64*wt.., rows 32*wn..
    int lr = threadIdx.x / 2, lu = threadIdx.x % 2;     // loader: tile row lr, unit lu of the step
    int n_units = n_in / 32, n_steps = (n_units + 1) / 2;
    int n_tt = (T + MM_TT - 1) / MM_TT, n_tiles = n_tt * ((n_out + MM_TN - 1) / MM_TN);
    long long total = (long long)n_tiles * n_steps; // < 2^31 (matmul_tc)
    int s = (int)(blockIdx.x * total / gridDim.x),
        s_end = (int)((blockIdx.x + 1) * total / gridDim.x);
    // loaders. X: chunk c = threadIdx.x + 256 i (i < 4) of the step's 128 rows x 128 bytes is row c
    // / 8, bytes 16 (c % 8): a warp reads 4 whole rows per load. W: one 32-weight unit per thread,
    // unit lu of row lr. Rows past T or n_out read the last row instead (their results are never
    // written); units past n_in (odd n_in / 32) are zeros.
    int xc = threadIdx.x % 8, xrow = threadIdx.x / 8;
    uint4 xr[4];
    WRaw wr;
    int t0, n0, n;
    // this thread's X chunks of the next step to fetch (rows + 32 i), moved on by fetch
    const uint4 *xp[4];
    // the plane index of unit u of row n (plane_g; F16, BF16: row * n_sub + u): the 32 units of a
    // chunk lie side by side in either order, so only a new chunk's place is computed (in step
    // order: divisions)
    int g_chunk = -1;
    size_t g_base = 0;
    auto plane_index = [&](int u) -> size_t {
        if (u / 32 != g_chunk) {
            g_chunk = u / 32;
            g_base = plane_g(so, n, 32 * g_chunk, n_units);
        }
        return g_base + u % 32;
    };
    // fetch: the bytes of step `step` into registers (called for consecutive steps)
    auto fetch = [&](int step) {
        if (2 * step + xc / 4 < n_units) {
#pragma unroll
            for (int i = 0; i < 4; i++) xr[i] = __ldg(xp[i]);
        } else {
#pragma unroll
            for (int i = 0; i < 4; i++) xr[i] = make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int i = 0; i < 4; i++) xp[i] += 8; // 64 halves
        if (2 * step + lu < n_units)
            wr = w_load<TYPE>(W, plane_index(2 * step + lu), NB);
    };
    // stash: decode the weights and store both to shared-memory buffer buf
    auto stash = [&](int step, int buf) {
#pragma unroll
        for (int i = 0; i < 4; i++)
            *((uint4 *)(xs + (buf * MM_TT + xrow + 32 * i) * MM_LD) + xc) = xr[i];
        uint4 *wd = (uint4 *)(ws + (buf * MM_TN + lr) * MM_LD + 32 * lu);
        __align__(16) __half w32[32];
        if (2 * step + lu < n_units) {
            w_decode<TYPE>(wr, w32);
#pragma unroll
            for (int i = 0; i < 4; i++) wd[i] = ((uint4 *)w32)[i];
        } else {
#pragma unroll
            for (int i = 0; i < 4; i++) wd[i] = make_uint4(0, 0, 0, 0);
        }
    };
    while (s < s_end) { // one piece of a tile per pass: steps [k0, k1) of tile
        int tile = s / n_steps, k0 = s % n_steps;
        int k1 = min(n_steps, k0 + (s_end - s));
        s += k1 - k0;
        t0 = tile % n_tt * MM_TT, n0 = tile / n_tt * MM_TN;
        n = min(n0 + lr, n_out - 1);
        g_chunk = -1;
#pragma unroll
        for (int i = 0; i < 4; i++)
            xp[i] = (const uint4 *)(x.h + (size_t)min(t0 + xrow + 32 * i, T - 1) * x.ld) +
                    8 * k0 + xc;
        FragAcc acc[4][2];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.0f);
        fetch(k0);
        stash(k0, 0);
        __syncthreads();
        for (int step = k0; step < k1; step++) {
            int cur = (step - k0) % 2;
            if (step + 1 < k1) fetch(step + 1);
            mm_multiply_step(acc, xs + cur * MM_TT * MM_LD, ws + cur * MM_TN * MM_LD, wt, wn);
            if (step + 1 < k1) stash(step + 1, 1 - cur);
            __syncthreads();
        }
        // the X tiles are free now: each warp's fp32 patch for the epilogue
        float *slot = part + ((size_t)blockIdx.x * 2 + (k0 > 0 ? 0 : 1)) * MM_SLOT;
        mm_store_piece(acc, (float *)xs + warp * 256, k0 == 0 && k1 == n_steps, slot, y, ldy, x.s,
                       bias, t0, n0, wt, wn, T, n_out, accumulate);
        __syncthreads(); // the patches and the next piece's first stash share buffer 0
    }
}

// The tiles that matmul_kernel cut between blocks: y[t, n] (+)= (sum of the pieces in k order)
// (+ bias[n]). One block per tile; tiles that one block finished return at once. C twin: the
// sums of matmul_c (this kernel is the second half of the product).
__global__ void matmul_fixup_kernel(float *y /* (T, ldy) */, int ldy,
                                    const float *part /* (G, 2, MM_TT, MM_TN) */, int G,
                                    const float *bias /* (n_out) or NULL */, int T, int n_in,
                                    int n_out, int accumulate) {
    int n_steps = (n_in / 32 + 1) / 2, n_tt = (T + MM_TT - 1) / MM_TT, tile = blockIdx.x;
    long long total = (long long)n_tt * ((n_out + MM_TN - 1) / MM_TN) * n_steps;
    int b_first = mm_owner((long long)tile * n_steps, total, G),
        b_last = mm_owner((long long)(tile + 1) * n_steps - 1, total, G);
    if (b_first == b_last) return;
    int t0 = tile % n_tt * MM_TT, n0 = tile / n_tt * MM_TN;
    for (int e = threadIdx.x; e < MM_SLOT; e += blockDim.x) {
        int tt = t0 + e / MM_TN, nn = n0 + e % MM_TN;
        if (tt >= T || nn >= n_out) continue;
        float v = part[((size_t)b_first * 2 + 1) * MM_SLOT + e]; // the piece from k = 0
        for (int b = b_first + 1; b <= b_last; b++) v += part[(size_t)b * 2 * MM_SLOT + e];
        float *dst = y + (size_t)tt * ldy + nn;
        *dst = (accumulate ? *dst : 0.0f) + v + (bias ? bias[nn] : 0.0f);
    }
}

// The weights of one row as matmul_kernel's tiles hold them (fp16 values, as floats): the
// dequantized value rounded to fp16, where IQ4_XS and Q6_K first round their sub-block scales to
// fp16 (the pairwise decode of w_decode; the integer times the scale is exact in fp32, so each
// weight is rounded once more, to fp16, as on the GPU):
//   IQ4_XS: fp16(fp16(d * (ls - 32)) * kvalue)   Q6_K: fp16(fp16(d * sc) * (q - 32))
static void mm_weight_row(int type, const uint8_t *src /* one row, row_bytes(type, n_in) */,
                          float *w /* (n_in) */, int n_in) {
    for (int u = 0; u < n_in / 32; u++) dequant_unit(type, src, u, w + 32 * u, n_in, 1);
    for (int i = 0; i < n_in; i++) w[i] = f16r(w[i]);
}

// C twin of matmul_kernel and matmul_f32_kernel: the same products in fp32 (double sums) from the
// same operands: the fp16 weights of mm_weight_row times the fp16 rows X (then * s), or for F32
// weights the weight times the fp32 rows xf. Only the summation order differs.
static void matmul_c(const Tensor *W, const uint16_t *X /* (T, ld) fp16 bits */,
                     const float *xs /* (T) */, const float *xf /* (T, ld) */, int ld, int T,
                     float *y /* (T, ldy) */, int ldy, const float *bias /* (n_out) or NULL */,
                     int accumulate, float *row /* (n_in) */) {
    int n_in = (int)W->n_in, exact = W->type == GGML_TYPE_F32;
    size_t rb = row_bytes(W->type, W->n_in);
    for (int64_t n = 0; n < W->n_out; n++) {
        if (exact) dequant_row(W->type, W->host + n * rb, row, n_in);
        else mm_weight_row(W->type, W->host + n * rb, row, n_in);
        for (int t = 0; t < T; t++) {
            double acc = 0;
            if (exact) {
                for (int i = 0; i < n_in; i++) acc += (double)row[i] * xf[(size_t)t * ld + i];
            } else {
                for (int i = 0; i < n_in; i++)
                    acc += (double)row[i] * fp16_to_f32(X[(size_t)t * ld + i]);
                acc *= xs[t];
            }
            float v = (float)acc + (bias ? bias[n] : 0.0f);
            float *dst = y + (size_t)t * ldy + n;
            *dst = accumulate ? *dst + v : v;
        }
    }
}

// The fp32 product for F32 weights: y[t, n] (+)= sum_k xf[t, k] W[n, k] (+ bias[n]). A block
// computes 64 tokens x 64 rows, each thread a 4 x 4 patch of them, k in steps of 16 through shared
// memory. C twin: matmul_c.
#define SG_T 64
#define SG_N 64
#define SG_K 16
// The kernel reads k in steps of SG_K with no bound check: every input width of a prefill product
// is a multiple of 32 (prefill_plan turns the batched path off otherwise). C twin: matmul_c.
__global__ void __launch_bounds__(256)
matmul_f32_kernel(const float *W /* (n_out, n_in) */, ActH x, float *y /* (T, ldy) */,
                  int ldy, const float *bias /* (n_out) or NULL */, int T, int n_in, int n_out,
                  int accumulate) {
    __shared__ float xs[SG_K][SG_T + 1], ws[SG_K][SG_N + 1];
    int t0 = blockIdx.x * SG_T, n0 = blockIdx.y * SG_N;
    // this thread: tokens t0 + 4ty.., rows n0 + 4tx..
    int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    for (int k0 = 0; k0 < n_in; k0 += SG_K) {
        for (int i = threadIdx.x; i < SG_T * SG_K; i += blockDim.x) {
            int r = i / SG_K, k = i % SG_K, t = t0 + r, n = n0 + r;
            xs[k][r] = t < T ? x.f[(size_t)t * x.ld + k0 + k] : 0.0f;
            ws[k][r] = n < n_out ? W[(size_t)n * n_in + k0 + k] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < SG_K; k++) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; i++) { a[i] = xs[k][4 * ty + i]; b[i] = ws[k][4 * tx + i]; }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int t = t0 + 4 * ty + i, n = n0 + 4 * tx + j;
            if (t < T && n < n_out) {
                float v = acc[i][j] + (bias ? bias[n] : 0.0f);
                float *dst = y + (size_t)t * ldy + n;
                *dst = accumulate ? *dst + v : v;
            }
        }
}

// --- row-wise kernels (one block per token row) --------------------------------------------------

// Writers of ActH rows take the row's max |value| (block_max), then store X = v / s.
#define ROW_THREADS 256

// out[t] = rmsnorm(x[t]) * w as an fp16 row with its scale. C twin: rmsnorm_c per row.
__global__ void __launch_bounds__(ROW_THREADS)
rmsnorm_rows_kernel(ActH out, const float *x /* (T, n) */, const float *w /* (n) */, int n,
                    float eps) {
    const float *xr = x + (size_t)blockIdx.x * n;
    float ss = 0.0f, amax = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    float scale = rsqrtf(block_sum(ss) / n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        amax = fmaxf(amax, fabsf(xr[i] * scale * w[i]));
    float s = row_scale(block_max(amax));
    __half *o = out.h + (size_t)blockIdx.x * out.ld;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = xr[i] * scale * w[i];
        o[i] = __float2half(v / s);
        if (out.f) out.f[(size_t)blockIdx.x * out.ld + i] = v;
    }
    if (threadIdx.x == 0) out.s[blockIdx.x] = s;
}

// out[t] = silu(g[t]) * u[t] as an fp16 row with its scale (the FFN's hidden row). C twin:
// silu_c(g) * u in ffn_block_cpu.
__global__ void __launch_bounds__(ROW_THREADS)
silu_mul_rows_kernel(ActH out, const float *g /* (T, n) */, const float *u /* (T, n) */,
                     int n) {
    size_t r = (size_t)blockIdx.x * n;
    float amax = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float gv = g[r + i];
        amax = fmaxf(amax, fabsf(silu(gv) * u[r + i]));
    }
    float s = row_scale(block_max(amax));
    __half *o = out.h + (size_t)blockIdx.x * out.ld;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float gv = g[r + i], v = silu(gv) * u[r + i];
        o[i] = __float2half(v / s);
        if (out.f) out.f[(size_t)blockIdx.x * out.ld + i] = v;
    }
    if (threadIdx.x == 0) out.s[blockIdx.x] = s;
}

// --- RoPE and the KV store over the batch --------------------------------------------------------
// Per head: optional RMSNorm (qwen3/qwen35's q/k norm), NEOX RoPE on the first n_rot dims, then k
// and v appended to the fp16 cache at *pos: the prompt's path (decode folds the same steps into
// attention_split_kernel). Grid (n_head + n_kv, T): q heads first, a row per batch row t
// (position *pos + t, every pointer advanced by t rows; the tests run it with T = 1). Query head h
// is read from q_src + h*q_stride (qwen35 interleaves q with its gate) and written to q (may be the
// same memory). C twin: rmsnorm_c per head, rope_neox_c, and the copy into the cache in
// attention_block_cpu.
__global__ void
rope_and_kv_store_kernel(float *q,            // (T, n_head, hd) out
                         const float *q_src,  // (T, n_head, q_stride) in
                         int q_stride,
                         const float *k,      // (T, n_kv, hd)
                         const float *v,      // (T, n_kv, hd)
                         const float *q_norm, // (hd) or NULL
                         const float *k_norm, // (hd) or NULL
                         __half *kc,          // (n_ctx, n_kv, hd) this layer's caches
                         __half *vc,          // (n_ctx, n_kv, hd)
                         const int *pos_p,    // (1) row 0's position, on the GPU
                         int n_head, int n_kv, int hd, int n_rot,
                         float base, float freq_scale, float eps) {
    extern __shared__ float buf[]; // (hd)
    int h = blockIdx.x, t = blockIdx.y, pos = *pos_p + t; // row t of the batch
    q += (size_t)t * n_head * hd;
    q_src += (size_t)t * n_head * q_stride;
    k += (size_t)t * n_kv * hd;
    v += (size_t)t * n_kv * hd;
    int is_q = h < n_head;
    const float *src = is_q ? q_src + (size_t)h * q_stride : k + (size_t)(h - n_head) * hd;
    const float *nw = is_q ? q_norm : k_norm;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        buf[i] = src[i];
        ss += buf[i] * buf[i];
    }
    if (nw) { // block_sum synchronizes; without a norm, the barrier below does
        float scale = rsqrtf(block_sum(ss) / hd + eps);
        for (int i = threadIdx.x; i < hd; i += blockDim.x) buf[i] = buf[i] * scale * nw[i];
    }
    __syncthreads();
    int half_rot = n_rot / 2;
    size_t row = ((size_t)pos * n_kv + (is_q ? 0 : h - n_head)) * hd; // cache row of this kv head
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float y;
        if (i < n_rot) {
            float2 a = rope_angle(pos, i < half_rot ? i : i - half_rot, n_rot, base, freq_scale);
            float cs = a.x, sn = a.y;
            y = i < half_rot ? buf[i] * cs - buf[i + half_rot] * sn
                             : buf[i - half_rot] * sn + buf[i] * cs;
        } else {
            y = buf[i];
        }
        if (is_q) {
            q[(size_t)h * hd + i] = y;
        } else {
            kc[row + i] = __float2half(y);
            vc[row + i] = __float2half(v[(size_t)(h - n_head) * hd + i]);
        }
    }
}

// --- causal attention over the batch -------------------------------------------------------------
// Query t of the batch (position pos0 + t) attends to cache positions 0 .. pos0 + t; the batch's
// own keys and values are already in the cache (rope_and_kv_store_kernel over all rows). Block: a
// tile of PA_TQ = 64 queries of one head, 8 warps; the products run on the tensor cores (WMMA, fp16
// operands, fp32 sums) over chunks of keys staged in shared memory (64 keys, 32 when hd > 128):
//   S = Q K^T          (Q = q / sqrt(hd) rounded to fp16; 4 groups of 16 queries x key tiles of 16)
//   P = fp16(exp(S - m)),  l = sum_k P,  O = P V   (warp w: queries 16 (w % 4).., half w / 4 of hd)
//   out = O / l (times the sigmoid gate for qwen35)
// The softmax takes two passes over the keys: the first finds each row's maximum m, the second
// computes P and O with that final m, so O stays in the tensor cores' accumulators and never needs
// rescaling (WMMA's fragment layout is opaque); the second pass recomputes S, which is cheap on the
// tensor cores. Keys past the last visible one are zeros in shared memory (the cache beyond holds
// stale rows of an earlier prompt, or anything: 0 * nan would poison O). The output is the fp16
// input row of Wo; it needs no scaling: a convex combination of fp16 cache values (times a gate) is
// inside fp16's range. C twin: attention_prefill_c per query (the same fp16 roundings; attention_c
// is the exact math).
#define PA_TQ 64
#define PA_THREADS 256
__host__ __device__ static inline int pa_tk(int hd) { return hd > 128 ? 32 : 64; } // keys per chunk
// shared memory: Q (PA_TQ, hd+8) and K, V (tk, hd+8) halves, S (PA_TQ, tk+4) floats, P (PA_TQ,
// tk+8) halves, m and l (PA_TQ) floats
static size_t pa_smem(int hd) {
    int tk = pa_tk(hd);
    return (size_t)(PA_TQ + 2 * tk) * (hd + 8) * 2 + (size_t)PA_TQ * (tk + 4) * 4 +
           (size_t)PA_TQ * (tk + 8) * 2 + 2 * PA_TQ * 4;
}
// The steps of one chunk of keys k0 .. k0 + tk - 1 (keys past last_key are zeros), on the shared
// memory of pa_smem with the row strides ld = hd + 8 (Q, K, V), lds = tk + 4 (S), ldp = tk + 8 (P).

// Stage the chunk's keys of kv head j in Ks, and in pass 1 its values in Vs, 16 bytes a thread.
__device__ __forceinline__ void pa_load_chunk(__half *Ks, __half *Vs, const __half *kc,
                                              const __half *vc, int pass, int k0, int last_key,
                                              int j, int n_kv, int tk, int hd, int ld) {
    for (int i = threadIdx.x; i < tk * hd / 8; i += PA_THREADS) {
        int r = i / (hd / 8), c = i % (hd / 8), key = k0 + r;
        uint4 kv = make_uint4(0, 0, 0, 0), vv = kv;
        if (key <= last_key) {
            size_t src = ((size_t)key * n_kv + j) * hd + 8 * c;
            kv = *(const uint4 *)(kc + src);
            if (pass) vv = *(const uint4 *)(vc + src);
        }
        *(uint4 *)(Ks + r * ld + 8 * c) = kv;
        if (pass) *(uint4 *)(Vs + r * ld + 8 * c) = vv;
    }
}

// S = Q K^T: 4 groups of 16 queries x tk/16 tiles of 16 keys, one 16x16 tile per warp at a time.
__device__ __forceinline__ void pa_scores(float *Ss, const __half *Qs, const __half *Ks, int tk,
                                          int hd, int ld, int lds) {
    for (int tile = threadIdx.x / WARP; tile < 4 * (tk / 16); tile += PA_THREADS / WARP) {
        int g = tile / (tk / 16), kt = tile % (tk / 16);
        FragAcc s;
        wmma::fill_fragment(s, 0.0f);
        for (int d = 0; d < hd; d += 16) {
            FragA a;
            FragB<wmma::col_major> b;
            wmma::load_matrix_sync(a, Qs + 16 * g * ld + d, ld);
            wmma::load_matrix_sync(b, Ks + 16 * kt * ld + d, ld);
            wmma::mma_sync(s, a, b, s);
        }
        wmma::store_matrix_sync(Ss + 16 * g * lds + 16 * kt, s, lds, wmma::mem_row_major);
    }
}

// The softmax over the chunk, 4 threads per query row sr (sp = which of the 4: keys sp, sp + 4,
// ...); query st = tq0 + sr sees keys up to pos0 + st. Pass 0: the row's running maximum into
// ms[sr]. Pass 1: P = fp16(exp(S - m)) into Ps (0 where the key is not visible) and l += sum P into
// ls[sr]. (In pass 0 only the row's first thread needs m, and it writes ms[sr]: the row's other
// threads leave it alone.)
__device__ __forceinline__ void pa_softmax_chunk(__half *Ps, float *ms, float *ls,
                                                 const float *Ss, int pass, int sr, int sp, int st,
                                                 int k0, int pos0, int T, int tk, int lds,
                                                 int ldp) {
    float mx = -INFINITY, sum = 0.0f, m = pass || sp == 0 ? ms[sr] : 0.0f;
    for (int c = sp; c < tk; c += 4) {
        int key = k0 + c;
        int visible = st < T && key <= pos0 + st;
        float s = Ss[sr * lds + c];
        if (pass == 0) {
            if (visible) mx = fmaxf(mx, s);
        } else {
            __half p = __float2half(visible ? __expf(s - m) : 0.0f);
            Ps[sr * ldp + c] = p;
            sum += __half2float(p);
        }
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    if (sp == 0) {
        if (pass == 0) ms[sr] = fmaxf(m, mx);
        else ls[sr] += sum;
    }
}

// O += P V: this warp's queries 16 qg .. and dims dh * hd/2 .., nf fragments of 16 dims.
__device__ __forceinline__ void pa_accumulate_pv(FragAcc (&o)[8], const __half *Ps,
                                                 const __half *Vs, int qg, int dh, int nf, int tk,
                                                 int hd, int ld, int ldp) {
    for (int ks = 0; ks < tk; ks += 16) {
        FragA a;
        wmma::load_matrix_sync(a, Ps + 16 * qg * ldp + ks, ldp);
#pragma unroll
        for (int f = 0; f < 8; f++) {
            if (f >= nf) break;
            FragB<wmma::row_major> b;
            wmma::load_matrix_sync(b, Vs + ks * ld + dh * hd / 2 + 16 * f, ld);
            wmma::mma_sync(o[f], a, b, o[f]);
        }
    }
}

// out = O / l, times sigmoid(gate) for qwen35: each fragment through the warp's 16x16 fp32 patch of
// shared memory, then to the fp16 row (and the fp32 row when out.f is set).
__device__ __forceinline__ void pa_store_output(ActH out, float *patch, const FragAcc (&o)[8],
                                                const float *ls, const float *gate, int gate_row,
                                                int h, int tq0, int qg, int dh, int nf, int T,
                                                int hd) {
    int lane = threadIdx.x % WARP;
#pragma unroll
    for (int f = 0; f < 8; f++) {
        if (f >= nf) break;
        wmma::store_matrix_sync(patch, o[f], 16, wmma::mem_row_major);
        __syncwarp();
        for (int e = lane; e < 256; e += WARP) {
            int r = 16 * qg + e / 16, t = tq0 + r, dim = dh * hd / 2 + 16 * f + e % 16;
            if (t >= T) continue;
            float v = patch[e] / ls[r];
            if (gate) v /= 1.0f + __expf(-gate[(size_t)t * gate_row + (size_t)h * 2 * hd + dim]);
            out.h[(size_t)t * out.ld + (size_t)h * hd + dim] = __float2half(v);
            if (out.f) out.f[(size_t)t * out.ld + (size_t)h * hd + dim] = v;
        }
        __syncwarp();
    }
}

// The kernel (above): the Q tile, then for each pass and chunk the steps above, then the output.
// Block (query tile, head h). C twin: attention_prefill_c per query.
__global__ void __launch_bounds__(PA_THREADS)
attention_prefill_kernel(const float *q,    // (T, n_head, hd) roped
                         const __half *kc,  // (n_ctx, n_kv, hd) this layer's caches
                         const __half *vc,
                         ActH out,          // (T, n_head*hd)
                         const float *gate, // qwen35: row t, head h at t*gate_row + h*2*hd; or NULL
                         int gate_row, int pos0, int T, int n_head, int n_kv, int hd) {
    extern __shared__ __align__(32) uint8_t pa_sm[];
    int tk = pa_tk(hd), ld = hd + 8, lds = tk + 4, ldp = tk + 8;
    __half *Qs = (__half *)pa_sm, *Ks = Qs + PA_TQ * ld, *Vs = Ks + tk * ld; // (PA_TQ|tk|tk, ld)
    float *Ss = (float *)(Vs + tk * ld);                                     // (PA_TQ, lds)
    __half *Ps = (__half *)(Ss + PA_TQ * lds);                               // (PA_TQ, ldp)
    float *ms = (float *)(Ps + PA_TQ * ldp), *ls = ms + PA_TQ;               // (PA_TQ) each
    int h = blockIdx.y, j = h / (n_head / n_kv), tq0 = blockIdx.x * PA_TQ;
    int warp = threadIdx.x / WARP;
    float scale = rsqrtf((float)hd);
    for (int i = threadIdx.x; i < PA_TQ * hd; i += PA_THREADS) { // Q tile; rows past T are zeros
        int r = i / hd, d = i % hd, t = tq0 + r;
        Qs[r * ld + d] = __float2half(t < T ? q[((size_t)t * n_head + h) * hd + d] * scale : 0.0f);
    }
    if (threadIdx.x < PA_TQ) { ms[threadIdx.x] = -INFINITY; ls[threadIdx.x] = 0.0f; }
    int last_key = pos0 + min(tq0 + PA_TQ, T) - 1; // the block's last visible key
    // the softmax rows: 4 threads per query row, tk/4 keys each
    int sr = threadIdx.x / 4, sp = threadIdx.x % 4, st = tq0 + sr;
    // PV: queries 16 qg.., dims dh*hd/2.. in nf tiles
    int qg = warp % 4, dh = warp / 4, nf = hd / 32;
    FragAcc o[8];
#pragma unroll
    for (int f = 0; f < 8; f++) wmma::fill_fragment(o[f], 0.0f);
    for (int pass = 0; pass < 2; pass++) {
        for (int k0 = 0; k0 <= last_key; k0 += tk) {
            __syncthreads(); // the previous chunk is consumed (the first time: Q, m, l are written)
            pa_load_chunk(Ks, Vs, kc, vc, pass, k0, last_key, j, n_kv, tk, hd, ld);
            __syncthreads();
            pa_scores(Ss, Qs, Ks, tk, hd, ld, lds);
            __syncthreads();
            pa_softmax_chunk(Ps, ms, ls, Ss, pass, sr, sp, st, k0, pos0, T, tk, lds, ldp);
            if (pass == 0) continue;
            __syncthreads();
            pa_accumulate_pv(o, Ps, Vs, qg, dh, nf, tk, hd, ld, ldp);
        }
    }
    __syncthreads(); // S is free: each warp's 16x16 patch for the epilogue
    pa_store_output(out, Ss + warp * 256, o, ls, gate, gate_row, h, tq0, qg, dh, nf, T, hd);
    if (h == 0 && threadIdx.x < PA_TQ && tq0 + threadIdx.x < T) out.s[tq0 + threadIdx.x] = 1.0f;
}

// --- Gated DeltaNet over the batch ---------------------------------------------------------------

// Causal conv + SiLU over the batch, out of place, one thread per (row, channel):
//   y[t, c] = silu(sum_{i<4} w[c, i] * x[t - 3 + i, c]),  the rows before the batch from the
//   conv state. gdn_conv_state_kernel then keeps the last 3 inputs as the new state.
// C twin: gdn_conv_c per token.
__global__ void gdn_conv_rows_kernel(float *y,        // (T, conv_dim) out
                                     const float *x,  // (T, conv_dim) projections
                                     const float *w,  // (conv_dim, 4)
                                     const float *cs, // (3, conv_dim) oldest first
                                     int conv_dim, int T) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * conv_dim) return;
    int t = (int)(i / conv_dim), c = (int)(i % conv_dim);
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        int tt = t - 3 + k;
        sum += w[4 * c + k] *
               (tt >= 0 ? x[(size_t)tt * conv_dim + c] : cs[(size_t)(3 + tt) * conv_dim + c]);
    }
    y[i] = silu(sum);
}
// The conv state after the batch: the last 3 of [state | x] rows. C twin: the window shift in
// gdn_conv_c.
__global__ void gdn_conv_state_kernel(float *cs /* (3, conv_dim) */,
                                      const float *x /* (T, conv_dim) */, int conv_dim, int T) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= conv_dim) return;
    float v[3];
    for (int k = 0; k < 3; k++) { // row T - 3 + k of [state | x]
        int tt = T - 3 + k;
        v[k] = tt >= 0 ? x[(size_t)tt * conv_dim + c] : cs[(size_t)(3 + tt) * conv_dim + c];
    }
    for (int k = 0; k < 3; k++) cs[(size_t)k * conv_dim + c] = v[k];
}

// After the conv: L2 norm of every q and k head and the gates of every v head, for all rows
// (gdn_head_finish, shared with the one-token kernel). Grid (2*Hk + Hv, T), S threads. C twin:
// l2norm_c; the gates are gdn_gates, which the CPU path runs too.
__global__ void gdn_l2norm_gates_rows_kernel(float *mixed,           // (T, conv_dim)
                                           const float *beta_raw,  // (T, Hv)
                                           const float *alpha_raw, // (T, Hv)
                                           const float *dt_bias, const float *ssm_a, // (Hv)
                                           float *gb,              // (T, 2, Hv) out
                                           int Hk, int Hv, float eps) {
    int S = blockDim.x, t = blockIdx.y, conv_dim = (2 * Hk + Hv) * S;
    float *y = mixed + (size_t)t * conv_dim + blockIdx.x * S + threadIdx.x;
    gdn_head_finish(y, blockIdx.x, Hk, Hv, beta_raw + (size_t)t * Hv, alpha_raw + (size_t)t * Hv,
                    dt_bias, ssm_a, gb + (size_t)t * 2 * Hv, eps);
}

// Gated RMSNorm of every v head of row t, as the fp16 input row of ssm_out: one block per row
// (S threads), o overwritten with the fp32 result on the way. C twin: gated_rmsnorm_c.
__global__ void gdn_gated_norm_rows_kernel(ActH out, float *o /* (T, Hv*S) */,
                                          const float *z /* (T, Hv*S) */, const float *w /* (S) */,
                                          int Hv, float eps) {
    int S = blockDim.x;
    size_t r = (size_t)blockIdx.x * Hv * S;
    float amax = 0.0f;
    for (int hv = 0; hv < Hv; hv++) {
        size_t i = r + (size_t)hv * S + threadIdx.x;
        float v = o[i];
        float ss = block_sum(v * v);
        float zz = z[i];
        v = v * rsqrtf(ss / S + eps) * w[threadIdx.x] * silu(zz);
        o[i] = v;
        amax = fmaxf(amax, fabsf(v));
    }
    float s = row_scale(block_max(amax));
    __half *oh = out.h + (size_t)blockIdx.x * out.ld;
    for (int i = threadIdx.x; i < Hv * S; i += S) {
        oh[i] = __float2half(o[r + i] / s);
        if (out.f) out.f[(size_t)blockIdx.x * out.ld + i] = o[r + i];
    }
    if (threadIdx.x == 0) out.s[blockIdx.x] = s;
}

// --- the perplexity's loss per row ---------------------------------------------------------------
// nll[r] = -log softmax(logits[r])[target[r]] = log sum_i exp(l_i - max) + max - l_target, one
// block per row: perplexity needs only these, not the rows themselves. C twin: log_softmax in
// ppl_score.
__global__ void row_nll_kernel(const float *logits /* (nr, V) */, const int *target /* (nr) */,
                               float *nll /* (nr) */, int V) {
    const float *l = logits + (size_t)blockIdx.x * V;
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, l[i]);
    mx = block_max(mx);
    float sum = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) sum += __expf(l[i] - mx);
    sum = block_sum(sum);
    if (threadIdx.x == 0) nll[blockIdx.x] = logf(sum) + mx - l[target[blockIdx.x]];
}

// ------------------------------------------------------------------------------------------------
// 9. GPU forward: the run state, the VRAM budget, the weight upload, the token's layer loop
// ------------------------------------------------------------------------------------------------
// All device memory is allocated once, before the first token: the weights in one allocation
// walked by a pointer, the run state in another. Nothing is allocated in the token loop. The work
// of a token (about 8 launches per layer) is captured once as a CUDA graph and replayed for every
// token; the position lives in device memory, so the same graph serves every position. A prompt
// goes through forward_gpu_batch instead (end of this section): the same layers on up to -b rows
// at once, with the kernels of section 8, into the same KV cache and DeltaNet states.

typedef struct {
    int n_ctx, n_split;    // attention splits per kv head: att_splits(n_ctx, head_dim)
    cudaStream_t stream;
    void *weights;         // one allocation holding every uploaded weight
    size_t weight_bytes;
    void *arena;           // one allocation holding everything below
    float *x;              // (n_embd) residual stream
    Act xb;                // (n_embd) normalized input of the next mat-vec
    float *q;              // (n_head*head_dim)
    float *k, *v;          // (n_head_kv*head_dim)
    Act att_out;           // (n_head*head_dim)
    float *part_o;         // (n_head, n_split, head_dim) attention partial outputs
    float *part_ml;        // (n_head, n_split, 2) their softmax max and sum
    Act hb;                // (n_ff) FFN hidden: silu(gate) * up
    float *hb2;            // (n_ff) up, until silu_mul_quant_kernel makes hb from it
    int *kv_done;          // (n_head_kv) counters of the attention kernel
    float *qg;             // (n_head*2*head_dim) qwen35: per head [q | gate]
    // Gated DeltaNet (qwen35); S = ssm_state, conv_dim = (2*Hk + Hv)*S
    float *gdn_mixed;      // (conv_dim) projections, then conv output [q | k | v]
    float *gdn_z;          // (Hv*S) output gate
    float *gdn_beta, *gdn_alpha; // (Hv) raw projections
    float *gdn_gb;         // (2, Hv) g and beta
    int *gdn_count;        // (Hk) counters of gdn_token_kernel
    float *gdn_raw;        // (Hv*S) delta-rule output before the gated norm
    Act gdn_out;           // (Hv*S) input of ssm_out
    float *conv_state;     // (n_gdn_layers, 3, conv_dim), followed directly by
    float *ssm_state;      // (n_gdn_layers, Hv, S, S): state_bytes in all, cleared at position 0
    size_t state_bytes;
    size_t kv_bytes;       // both caches
    size_t peak_used;      // device memory in use on the card, measured at its two peaks: the end
                           // of the load and the captured graph (gpu_capture)
    float *logits;         // (n_vocab)
    __half *key_cache;     // (n_kv_layers, n_ctx, n_head_kv, head_dim)
    __half *value_cache;   // (n_kv_layers, n_ctx, n_head_kv, head_dim)
    int *pos;              // (1) position of the token being processed
    float2 *rope_cs;       // (head_dim / 2; n_rot / 2 used) cos, sin of its RoPE angles
    float *h_x;            // pinned host (n_embd): the embedding row on its way up
    int *h_pos;            // pinned host (1)
    float *h_logits;       // pinned host (n_vocab): logits on their way down
    cudaGraphExec_t graph; // the captured forward pass, or NULL before capture
    // prefill (section 8): a batch of up to n_batch prompt rows through each layer at once
    int n_batch;           // -b; 0 when the model's shapes (prefill_plan) or a BF16 weight past
                           // fp16's range (upload_weights) rule the batched path out
    int n_logit_rows;      // rows of logits one batched pass returns at most
    size_t batch_bytes;    // the buffers below
    int f32_rows;          // some product has F32 weights: bxh carries fp32 rows too
    float *bx;             // (n_batch, n_embd) residual stream rows
    ActH bxh;              // (n_batch, ld) fp16 input rows of the next product, ld = widest input
    float *bq;             // (n_batch, n_head*hd) q, roped (in place, or out of bqg for qwen35)
    float *bqg;            // (n_batch, n_head*2*hd) qwen35: per head [q | gate]
    float *bk, *bv;        // (n_batch, n_head_kv*hd)
    float *bgate, *bup;    // (n_batch, n_ff)
    float *bmixed;         // (n_batch, conv_dim) DeltaNet projections
    float *bconv;          // (n_batch, conv_dim) their conv output, then L2-normed q, k
    float *bz, *braw;      // (n_batch, Hv*S) output gate, delta-rule output
    float *bbeta, *balpha; // (n_batch, Hv)
    float *bgb;            // (n_batch, 2, Hv) g and beta
    float *blogits;        // (n_logit_rows, n_vocab)
    float *bpart;          // (part_elems) partial sums of the tiles a product cut between blocks
    size_t part_elems;
    int mm_blocks;         // the most product blocks resident at once over all types (sizes bpart)
    float *h_bx;           // pinned host (n_batch, n_embd): embedding rows on their way up
    float *h_blogits;      // pinned host (n_logit_rows, n_vocab)
    Tap *tap;              // NULL, or where the tensors go (section 4b): then the passes go step
                           // by step outside the graph, copying out what the kernels wrote
} GpuState;

// -b: prompt tokens per batched pass (the prefill buffers are sized for it; 1 turns prefill off).
static int g_n_batch = 512;
#define LOGIT_ROWS 64 // rows of logits per batched output product (perplexity scores many rows)
// floats of partial sums at least (16 MB): more when the GPU holds more than 128 product blocks
// at once (two 64 KB slots each)
#define MM_PART_ELEMS ((size_t)4 << 20)
#define MM_BLOCKS_NO_GPU 80 // product blocks assumed for the budget without a GPU (a V100)

// The weights that multiply activations in the layers (12 slots; those a model lacks have no name),
// in one list for the prefill plan and the FLOP count of --bench.
#define N_LAYER_PRODUCTS 12
static void layer_products(const LayerWeights *L, const Tensor *out[N_LAYER_PRODUCTS]) {
    const Tensor *lt[N_LAYER_PRODUCTS] = {&L->wq,      &L->wk,     &L->wv,     &L->wo,
                                          &L->wqkv,    &L->wz,     &L->w_beta, &L->w_alpha,
                                          &L->ssm_out, &L->w_gate, &L->w_up,   &L->w_down};
    memcpy(out, lt, sizeof lt);
}

static int gpu_available(void);
static int mm_resident(int type);
// Plan the prefill for the model and -b (gpu_state_carve then sizes its buffers): off (n_batch 0)
// for -b 1, when an input width is not a multiple of 32 (the product's tiles walk whole 32-weight
// units), or for heads wider than 256 (the batched attention's warps hold half a head each, 8
// fragments of 16: prompts then go token by token); fp32 rows when a product has F32 weights.
// (upload_weights may still turn it off: a BF16 weight past fp16's range, section 8's header.)
static void prefill_plan(GpuState *s, Model *m) {
    const Config *c = &m->c;
    s->n_batch = g_n_batch > 1 ? g_n_batch : 0;
    s->n_logit_rows = g_n_batch < LOGIT_ROWS ? g_n_batch : LOGIT_ROWS;
    if (c->n_embd % 32 || c->n_head * c->head_dim % 32 || c->n_ff % 32 || c->ssm_inner % 32 ||
        c->head_dim > 256)
        s->n_batch = 0;
    s->f32_rows = 0;
    s->mm_blocks = gpu_available() ? mm_resident(-1) : MM_BLOCKS_NO_GPU;
    for (int l = 0; l <= c->n_layer; l++) { // the layers' products, then the output matrix
        const Tensor *list[N_LAYER_PRODUCTS] = {&m->w.output};
        int n = 1;
        if (l < c->n_layer) {
            layer_products(&m->w.layers[l], list);
            n = N_LAYER_PRODUCTS;
        }
        for (int i = 0; i < n; i++)
            if (list[i]->name && list[i]->type == GGML_TYPE_F32) s->f32_rows = 1;
    }
}


// Is there a usable CUDA device? (CI machines have none: GPU paths are then skipped or refused.)
static int gpu_available(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); // clear the sticky "no driver" error
        return 0;
    }
    return n > 0;
}

#define ALIGN256(n) (((n) + 255) & ~(size_t)255)

// Every tensor the GPU reads, in file order (so the upload streams through the file once).
// token_embd stays in host memory unless the output is tied to it: each token needs one row.
static int gpu_weight_list(Model *m, Tensor **list) {
    int n = 0;
    Weights *w = &m->w;
    Tensor *all[16 + MAX_LAYERS * 24];
    int na = 0;
    all[na++] = &w->output_norm;
    all[na++] = &w->output;
    all[na++] = &w->output_bias;
    for (int l = 0; l < m->c.n_layer; l++) {
        LayerWeights *L = &w->layers[l];
        Tensor *lt[] = {&L->attn_norm, &L->wq,      &L->wk,       &L->wv,      &L->bq,
                        &L->bk,        &L->bv,      &L->q_norm,   &L->k_norm,  &L->wo,
                        &L->wqkv,      &L->wz,      &L->conv1d,   &L->dt_bias, &L->ssm_a,
                        &L->w_beta,    &L->w_alpha, &L->ssm_norm, &L->ssm_out, &L->ffn_norm,
                        &L->w_gate,    &L->w_up,    &L->w_down};
        for (size_t i = 0; i < sizeof lt / sizeof lt[0]; i++) all[na++] = lt[i];
    }
    for (int i = 0; i < na; i++)
        if (all[i]->name) list[n++] = all[i];
    // sort by file position: a simple insertion sort, a few hundred entries
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && list[j - 1]->host > list[j]->host; j--) {
            Tensor *t = list[j]; list[j] = list[j - 1]; list[j - 1] = t;
        }
    return n;
}

// --- VRAM budget: prove the model fits before allocating anything large --------------------------
// qwen.cu never offloads layers to the CPU: either everything fits on the card, or it refuses with
// the numbers that would make it fit. The budget is computed from the same layout code that later
// carves the memory, and compared with what the card really has free once the CUDA context exists
// (the context's own share is measured, not guessed). --vram-limit SIZE makes the engine behave as
// if the card had SIZE bytes in total, e.g. 15.5G to rehearse a 16 GB V100 on a bigger GPU.

#define UPLOAD_CHUNK ((size_t)32 << 20) // staging of the upload: 2 chunks pinned, 2 on the GPU

typedef struct {
    size_t weights_by_type[GGML_TYPE_COUNT];
    size_t weights;      // every tensor the GPU reads
    size_t kv;           // K and V caches for n_ctx tokens (fp16)
    size_t state;        // DeltaNet conv + recurrent state (fp32)
    size_t logits;       // (n_vocab) fp32
    size_t scratch;      // activations and attention scratch
    size_t batch;        // prefill buffers for -b rows
    size_t staging;      // device side of the upload staging (freed after the load)
    size_t context;      // measured: CUDA context + whatever else already uses the card
    size_t card_total;   // the card as the engine sees it (--vram-limit)
    size_t card_free;    // free after the context was created
    double weight_elems; // number of weights, for bits per weight
    int measured;        // card_* and context are real measurements
} Budget;

static size_t budget_need(const Budget *b) { // what must be free on top of the context
    return b->weights + b->kv + b->state + b->logits + b->scratch + b->batch + b->staging;
}

static size_t gpu_state_carve(GpuState *s, const Config *c, int n_ctx, uint8_t *base);

// The arithmetic part: what the model needs at context n_ctx (no GPU needed). Sets every field but
// the card's (context, card_total, card_free, measured).
static void budget_compute(Budget *b, Model *m, int n_ctx) {
    static Tensor *list[16 + MAX_LAYERS * 24];
    memset(b->weights_by_type, 0, sizeof b->weights_by_type); // the card's fields stay as measured
    b->weights = 0;
    b->weight_elems = 0;
    int n = gpu_weight_list(m, list);
    for (int i = 0; i < n; i++) {
        b->weights_by_type[list[i]->type] += ALIGN256(list[i]->nbytes);
        b->weights += ALIGN256(list[i]->nbytes);
        b->weight_elems += (double)list[i]->n_in * list[i]->n_out;
    }
    GpuState dry;
    memset(&dry, 0, sizeof dry);
    prefill_plan(&dry, m);
    size_t arena = gpu_state_carve(&dry, &m->c, n_ctx, NULL);
    b->batch = dry.batch_bytes;
    b->kv = dry.kv_bytes;
    b->state = ALIGN256(dry.state_bytes);
    b->logits = ALIGN256(m->c.n_vocab * 4u);
    b->scratch = arena - b->kv - b->state - b->logits - b->batch;
    b->staging = 2 * UPLOAD_CHUNK;
}

// Measure the card once the CUDA context exists; vram_limit > 0 caps its total.
static void budget_measure(Budget *b, double vram_limit) {
    size_t fr, total;
    CUDA_CHECK(cudaMemGetInfo(&fr, &total));
    b->context = total - fr;
    b->card_total = total;
    b->card_free = fr;
    if (vram_limit > 0) {
        if (vram_limit > (double)total)
            fprintf(stderr, "note: --vram-limit %.2f GiB is more than the card's %.2f GiB; using "
                    "the card's\n", vram_limit / 1073741824.0, total / 1073741824.0);
        else {
            b->card_total = (size_t)vram_limit;
            b->card_free = b->card_total > b->context ? b->card_total - b->context : 0;
        }
    }
    b->measured = 1;
}

// It fits when everything the engine allocates is free on the card after the context.
static int budget_fits(const Budget *b) { return budget_need(b) <= b->card_free; }

// The budget table of every GPU run and of --info: each part in GiB, then the total.
static void budget_print(const Budget *b, const Model *m, int n_ctx, double vram_limit, FILE *f) {
    const double G = 1073741824.0;
    const Config *c = &m->c;
    char label[96];
    fprintf(f, "VRAM budget for -c %d (GiB):\n", n_ctx);
#define LINE(value, ...)                                                                           \
    (snprintf(label, sizeof label, __VA_ARGS__), fprintf(f, "  %-52s %8.3f\n", label, (value) / G))
    for (int t = 0; t < GGML_TYPE_COUNT; t++)
        if (b->weights_by_type[t]) LINE(b->weights_by_type[t], "weights %s", type_name(t));
    LINE(b->kv, "KV cache: %d attention layers x %d tokens, fp16", c->n_kv_layers, n_ctx);
    if (c->n_gdn_layers) LINE(b->state, "DeltaNet state: %d layers, fp32", c->n_gdn_layers);
    LINE(b->scratch, "activations and attention scratch");
    LINE(b->logits, "logits");
    if (b->batch) LINE(b->batch, "prefill buffers for -b %d", g_n_batch);
    LINE(b->staging, "upload staging (freed after the load)");
    if (b->measured) {
        LINE(b->context, "CUDA context + others on the card (measured)");
        fprintf(f, "  %-52s %8.3f of %.3f%s: %s\n", "total", (budget_need(b) + b->context) / G,
                b->card_total / G, vram_limit > 0 ? " (--vram-limit)" : "",
                budget_fits(b) ? "fits" : "DOES NOT FIT");
    } else {
        fprintf(f, "  %-52s %8.3f (without the CUDA context: no GPU here to compare with)\n",
                "total", budget_need(b) / G);
    }
#undef LINE
}

// The numbers a user needs when it does not fit: the largest context that fits with this file, and
// the bits per weight the weights would have to average to fit at the asked context.
typedef struct {
    int max_ctx;    // 0: not even -c 1 fits
    double bpw;     // this file's weights, bits per weight
    double bpw_fit; // the most they may average to fit at n_ctx
} FitHint;

static FitHint budget_hint(const Budget *b, Model *m, int n_ctx) {
    FitHint h;
    int lo = 0, hi = n_ctx;
    Budget t = *b;
    while (lo < hi) { // the budget grows with the context: bisect
        int mid = (int)(((int64_t)lo + hi + 1) / 2); // 64-bit: -c 2^31 - 1
        budget_compute(&t, m, mid);
        if (budget_fits(&t)) lo = mid; else hi = mid - 1;
    }
    h.max_ctx = lo;
    h.bpw = 8.0 * b->weights / b->weight_elems;
    // left for the weights
    double room = (double)b->card_free - (double)(budget_need(b) - b->weights);
    h.bpw_fit = room > 0 ? 8.0 * room / b->weight_elems : 0.0;
    return h;
}

// The hints that would make the model fit, each one possible: the largest context, where the run
// can take a context that small (min_ctx: 1 for a generation; the bench's 2049; a KL-divergence
// base's chunk, which a run cannot change), or the bits per weight a smaller quantization must
// reach; when even the weights' share cannot be reached (the rest of the budget alone is over
// what is free), no quantization fits, and the hint says so rather than asking for an impossible
// bits/weight.
static void budget_hints(const Budget *b, Model *m, int n_ctx, int min_ctx, FILE *f) {
    const double G = 1073741824.0;
    FitHint h = budget_hint(b, m, n_ctx);
    if (h.max_ctx >= min_ctx && min_ctx < n_ctx)
        fprintf(f, "hint: with this file, the largest context that fits is -c %d\n", h.max_ctx);
    else if (h.max_ctx >= 1)
        fprintf(f, "hint: with this file, the largest context that fits is %d tokens; this run "
                "needs %d\n", h.max_ctx, min_ctx);
    else
        fprintf(f, "hint: with this file not even -c 1 fits: the weights alone are %.2f GiB\n",
                b->weights / G);
    // 1.56 bits/weight is IQ1_S, the smallest GGUF type of any engine: below it no file fits
    if (h.bpw_fit >= 1.56)
        fprintf(f, "hint: this file's weights average %.2f bits/weight; to fit with -c %d they "
                "must average at most %.2f (IQ4_XS is 4.25, Q4_0 4.5; below 4.25 needs a smaller "
                "quantization than qwen.cu supports)\n", h.bpw, n_ctx, h.bpw_fit);
    else
        fprintf(f, "hint: no quantization of this model fits with -c %d: without its weights the "
                "budget alone is %.3f GiB of the %.3f free\n", n_ctx,
                (budget_need(b) - b->weights) / G, b->card_free / G);
}

// The refusal: the budget, then one error line and the hints that would make the model fit; a run
// that cannot use a context below min_ctx gets no hint of one.
static void budget_refusal_min(const Budget *b, Model *m, int n_ctx, int min_ctx,
                               double vram_limit, FILE *f) {
    const double G = 1073741824.0;
    budget_print(b, m, n_ctx, vram_limit, f);
    fprintf(f, "error: the model needs %.2f GiB on top of the CUDA context but only %.2f GiB are "
            "free%s; qwen.cu keeps every layer on the GPU, so it stops here (no weight was "
            "loaded)\n", budget_need(b) / G, b->card_free / G,
            vram_limit > 0 ? " under --vram-limit" : "");
    budget_hints(b, m, n_ctx, min_ctx, f);
}
static void budget_refusal(const Budget *b, Model *m, int n_ctx, double vram_limit, FILE *f) {
    budget_refusal_min(b, m, n_ctx, 1, vram_limit, f);
}

// --- the weight upload: the step order, then the copy -------------------------------------------

// Speed: the step order of the planes (6.7; test/PERF_NOTES.md, "Mat-vec (section 6)"): for every
// streaming launch of a token, as matvec and matvec_batch will plan it, the order of its matrices'
// units, set before they are uploaded. A launch's matrices are the ones forward_gpu_enqueue gives
// it (a change there must be made here too: matvec_stream checks every launch's matrices against
// the order they were stored in). step_order_set stores one launch's matrices in step order;
// step_order_group decides which launches are: none with an IQ4 matrix. IQ4_XS's streaming loop is
// held by its arithmetic (the lookup), not by where its reads fall, and the order's slot
// arithmetic costs it as much as the order saves (test/PERF_NOTES.md, "Design record"); IQ4_NL
// runs the same lookup.
// Whether a matrix can be stored in step order: rows of whole chunks, whole units.
static int step_order_fits(const Tensor *W) {
    return W->n_in % (32 * WARP) == 0 && W->n_out % MV_ROWS == 0;
}
static void step_order_set(int n, Tensor *const *W) {
    MvPlan p;
    memset(&p, 0, sizeof p);
    for (int i = 0; i < n; i++) mv_plan_add(&p, W[i], NULL, NULL);
    if (!mv_use_stream(&p, (int)W[0]->n_in)) return;
    mv_plan_runs(&p, 1);
    // all of the launch's matrices, or none
    for (int i = 0; i < n; i++)
        if (!step_order_fits(W[i])) return;
    for (int i = 0; i < n; i++)
        W[i]->so = StepOrder{p.upw, p.first_unit[i], p.first_unit[i + 1] - p.first_unit[i]};
}
static void step_order_group(int n, Tensor *const *W) {
    int all_fast = 1, any_iq4 = 0;
    for (int i = 0; i < n; i++) {
        all_fast &= is_fast_type(W[i]->type);
        any_iq4 |= is_iq4_type(W[i]->type);
    }
    if (!all_fast) { // matvec_batch runs the fast ones one by one
        for (int i = 0; i < n; i++)
            if (is_fast_type(W[i]->type)) step_order_group(1, &W[i]);
        return;
    }
    if (!any_iq4) step_order_set(n, W);
}
static void step_order_plan(Model *m) {
    Weights *w = &m->w;
    for (int l = 0; l < m->c.n_layer; l++) {
        LayerWeights *L = &w->layers[l];
        if (m->c.kind[l] == LAYER_DELTANET) {
            Tensor *proj[4] = {&L->wqkv, &L->wz, &L->w_beta, &L->w_alpha}, *out = &L->ssm_out;
            step_order_group(4, proj);
            step_order_group(1, &out);
        } else {
            Tensor *qkv[3] = {&L->wq, &L->wk, &L->wv}, *out = &L->wo;
            step_order_group(3, qkv);
            step_order_group(1, &out);
        }
        Tensor *gate_up[2] = {&L->w_gate, &L->w_up}, *down = &L->w_down;
        step_order_group(2, gate_up);
        step_order_group(1, &down);
    }
    Tensor *out = &w->output;
    step_order_group(1, &out);
}

// flag[0] = 1 when one of the n BF16 values w is 2^16 or more in magnitude (or inf, nan): bits
// 0x4780 = 2^16 and up, which the prefill product's fp16 tiles cannot hold (section 8's header).
// (No C twin: a check of the file's bits, not model math; test_gpu_bf16_range runs it on a file.)
__global__ void bf16_past_f16_kernel(const uint16_t *w /* (n) */, size_t n, int *flag) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        if ((w[i] & 0x7fff) >= 0x4780) *flag = 1;
}

// Does a BF16 weight of the n uploaded tensors list lie past fp16's range? (Only the products'
// matter; the norms and biases, F32 in every released file, are looked at too, for simplicity.)
static int bf16_past_f16(Tensor *const *list, int n, cudaStream_t st) {
    int any = 0, *flag, past = 0;
    for (int i = 0; i < n; i++) any |= list[i]->type == GGML_TYPE_BF16;
    if (!any) return 0;
    CUDA_CHECK(cudaMalloc(&flag, sizeof(int)));
    CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int), st));
    for (int i = 0; i < n; i++)
        if (list[i]->type == GGML_TYPE_BF16) {
            bf16_past_f16_kernel<<<1024, 256, 0, st>>>((const uint16_t *)list[i]->dev,
                                                       list[i]->nbytes / 2, flag);
            KERNEL_CHECK();
        }
    CUDA_CHECK(cudaMemcpyAsync(&past, flag, sizeof(int), cudaMemcpyDeviceToHost, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
    CUDA_CHECK(cudaFree(flag));
    return past;
}

// Copy every weight the GPU needs into one device allocation, through a pinned staging buffer
// (two halves, so reading the file overlaps the copy to the card). The fast types are copied
// into a device staging buffer first, from which repack_kernel writes their plane layout into
// the weights allocation.
// Host memory stays bounded by the staging buffer: the mapped file is never copied whole.
static void upload_weights(Model *m, GpuState *s) {
    static Tensor *list[16 + MAX_LAYERS * 24];
    int n = gpu_weight_list(m, list);
    step_order_plan(m);
    size_t total = 0;
    for (int i = 0; i < n; i++) total += ALIGN256(list[i]->nbytes);
    CUDA_CHECK(cudaMalloc(&s->weights, total));
    s->weight_bytes = total;

    const size_t chunk = UPLOAD_CHUNK;
    uint8_t *stage, *dev_stage[2];
    CUDA_CHECK(cudaMallocHost((void **)&stage, 2 * chunk));
    CUDA_CHECK(cudaMalloc((void **)&dev_stage[0], 2 * chunk));
    dev_stage[1] = dev_stage[0] + chunk;
    cudaEvent_t done[2];
    CUDA_CHECK(cudaEventCreateWithFlags(&done[0], cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&done[1], cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(done[0], s->stream));
    CUDA_CHECK(cudaEventRecord(done[1], s->stream));

    double t0 = now_sec(), last_print = 0;
    int show = total > (256u << 20); // a progress bar only when loading takes a moment
    size_t copied = 0, off = 0;
    int half = 0;
    for (int i = 0; i < n; i++) {
        Tensor *t = list[i];
        t->dev = (uint8_t *)s->weights + off;
        int repack = is_fast_type(t->type);
        size_t tsz = TYPE_TRAITS[t->type].type_size;
        // whole file blocks per chunk when repacking
        size_t step = repack ? chunk / tsz * tsz : chunk;
        size_t NB = (size_t)(t->n_in / 32) * t->n_out;    // 32-weight sub-blocks in the tensor
        if (repack && NB > UINT32_MAX) // the fast mat-vecs index sub-blocks in 32 bits
            die("tensor %s: %zu sub-blocks of 32 weights, more than the fast mat-vecs address "
                "(2^32)", t->name, NB);
        for (size_t done_b = 0; done_b < t->nbytes; done_b += step) {
            size_t nb = t->nbytes - done_b < step ? t->nbytes - done_b : step;
            CUDA_CHECK(cudaEventSynchronize(done[half])); // this half's previous copy has finished
            memcpy(stage + half * chunk, t->host + done_b, nb);
            if (repack) {
                CUDA_CHECK(cudaMemcpyAsync(dev_stage[half], stage + half * chunk, nb,
                                           cudaMemcpyHostToDevice, s->stream));
                size_t nblk = nb / tsz;
                repack_kernel<<<(unsigned)((nblk + 255) / 256), 256, 0, s->stream>>>(
                    t->type, (int)tsz, dev_stage[half], (uint8_t *)t->dev, done_b / tsz, nblk, NB,
                    t->so, (int)(t->n_in / 32));
                KERNEL_CHECK();
            } else {
                CUDA_CHECK(cudaMemcpyAsync((uint8_t *)t->dev + done_b, stage + half * chunk, nb,
                                           cudaMemcpyHostToDevice, s->stream));
            }
            CUDA_CHECK(cudaEventRecord(done[half], s->stream));
            half ^= 1;
            copied += nb;
            double now = now_sec();
            if (show && now - last_print > 0.25) {
                last_print = now;
                fprintf(stderr, "\rloading weights: %6.2f / %.2f GB  (%.2f GB/s)", copied / 1e9,
                        total / 1e9, copied / 1e9 / (now - t0 + 1e-9));
            }
        }
        t->planes = repack;
        off += ALIGN256(t->nbytes);
        // the tied output shares its bytes with token_embd
        if (t == &m->w.output && m->w.output.host == m->w.token_embd.host)
            m->w.token_embd.dev = t->dev;
    }
    CUDA_CHECK(cudaStreamSynchronize(s->stream));
    if (s->n_batch && bf16_past_f16(list, n, s->stream)) {
        s->n_batch = 0;
        fprintf(stderr, "note: a BF16 weight is past fp16's range (2^16 or more): prompts go token "
                        "by token\n");
    }
    size_t fr, tot;
    CUDA_CHECK(cudaMemGetInfo(&fr, &tot)); // the peak: weights, run state and staging all allocated
    s->peak_used = tot - fr;
    double dt = now_sec() - t0;
    if (show) fprintf(stderr, "\r");
    if (g_verbose)
        fprintf(stderr, "loaded %.2f GB of weights to the GPU in %.2f s (%.2f GB/s)\n",
                copied / 1e9, dt, copied / 1e9 / (dt + 1e-9));
    cudaEventDestroy(done[0]);
    cudaEventDestroy(done[1]);
    CUDA_CHECK(cudaFreeHost(stage));
    CUDA_CHECK(cudaFree(dev_stage[0]));
}

// --- device memory: the run state, carved out of one allocation ---------------------------------

// Carve an Act of n values (plus its 16-bit copy when n is a multiple of 32) out of the arena.
// p is an address as an integer: measuring carves from address 0, and adding offsets to a NULL
// pointer would be undefined behaviour.
static Act act_carve(uintptr_t *p, int n) {
    Act a;
    memset(&a, 0, sizeof a);
    a.f = (float *)*p;
    *p += ALIGN256(n * 4u);
    if (n % 32 == 0) {
        a.q.q = (int4 *)*p;
        *p += ALIGN256(n / 32 * 64u);
        a.q.s = (float *)*p;
        *p += ALIGN256(n / 32 * 4u);
        a.q.sum = (int *)*p;
        *p += ALIGN256(n / 32 * 4u);
    }
    return a;
}


// Widest input of any product: the row stride of the prefill's fp16 input rows.
static size_t prefill_ld(const Config *c) {
    size_t ld = (size_t)c->n_embd;
    if ((size_t)c->n_head * c->head_dim > ld) ld = (size_t)c->n_head * c->head_dim;
    if ((size_t)c->n_ff > ld) ld = (size_t)c->n_ff;
    if ((size_t)c->ssm_inner > ld) ld = (size_t)c->ssm_inner;
    return (ld + 7) / 8 * 8;
}

// Lay the run state out from base: every buffer 256-byte aligned. Returns the bytes used; with
// base == NULL it only measures (the VRAM budget uses that, before anything is allocated). Also
// fills s->kv_bytes, s->state_bytes, and for the prefill s->batch_bytes and s->part_elems.
static size_t gpu_state_carve(GpuState *s, const Config *c, int n_ctx, uint8_t *base) {
    size_t qdim = (size_t)c->n_head * c->head_dim, kvdim = (size_t)c->n_head_kv * c->head_dim;
    size_t cache = (size_t)c->n_kv_layers * n_ctx * kvdim; // elements per cache
    size_t conv_dim = gdn_conv_dim(c), vdim = (size_t)c->ssm_inner, Hv = (size_t)c->ssm_v_heads,
           S = (size_t)c->ssm_state;
    size_t conv_bytes = (size_t)c->n_gdn_layers * 3 * conv_dim * 4,
           ssm_bytes = (size_t)c->n_gdn_layers * Hv * S * S * 4;
    int n_split = att_splits(n_ctx, c->head_dim);
    uintptr_t p = (uintptr_t)base; // an integer: measuring (base NULL) adds offsets to 0
#define CARVE(ptr, type, bytes) (ptr = (type)p, p += ALIGN256(bytes))
    CARVE(s->x, float *, c->n_embd * 4u);
    s->xb = act_carve(&p, c->n_embd);
    CARVE(s->q, float *, qdim * 4);
    CARVE(s->k, float *, kvdim * 4);
    CARVE(s->v, float *, kvdim * 4);
    s->att_out = act_carve(&p, (int)qdim);
    CARVE(s->part_o, float *, qdim * n_split * 4);
    CARVE(s->part_ml, float *, (size_t)c->n_head * n_split * 8);
    s->hb = act_carve(&p, c->n_ff);
    CARVE(s->hb2, float *, c->n_ff * 4u);
    CARVE(s->kv_done, int *, c->n_head_kv * 4u);
    CARVE(s->pos, int *, 4);
    CARVE(s->rope_cs, float2 *, c->head_dim / 2 * 8u);
    if (c->arch == ARCH_QWEN35) CARVE(s->qg, float *, 2 * qdim * 4);
    if (c->n_gdn_layers) {
        CARVE(s->gdn_mixed, float *, conv_dim * 4);
        CARVE(s->gdn_z, float *, vdim * 4);
        CARVE(s->gdn_raw, float *, vdim * 4);
        CARVE(s->gdn_beta, float *, Hv * 4);
        CARVE(s->gdn_alpha, float *, Hv * 4);
        CARVE(s->gdn_gb, float *, 2 * Hv * 4);
        CARVE(s->gdn_count, int *, c->ssm_k_heads * 4u);
        s->gdn_out = act_carve(&p, (int)vdim);
        s->conv_state = (float *)p; // the two states back to back, so one memset clears both
        s->ssm_state = (float *)(p + conv_bytes);
        p += ALIGN256(conv_bytes + ssm_bytes);
    }
    CARVE(s->logits, float *, c->n_vocab * 4u);
    CARVE(s->key_cache, __half *, cache * 2);
    CARVE(s->value_cache, __half *, cache * 2);
    uintptr_t batch_start = p;
    if (s->n_batch > 0) {
        size_t B = (size_t)s->n_batch, ld = prefill_ld(c),
               gdim = c->arch == ARCH_QWEN35 ? 2 * qdim : 0;
        CARVE(s->bx, float *, B * c->n_embd * 4);
        CARVE(s->bxh.h, __half *, B * ld * 2);
        CARVE(s->bxh.s, float *, B * 4);
        s->bxh.ld = (int)ld;
        if (s->f32_rows) CARVE(s->bxh.f, float *, B * ld * 4);
        CARVE(s->bq, float *, B * qdim * 4);
        if (gdim) CARVE(s->bqg, float *, B * gdim * 4);
        CARVE(s->bk, float *, B * kvdim * 4);
        CARVE(s->bv, float *, B * kvdim * 4);
        CARVE(s->bgate, float *, B * c->n_ff * 4);
        CARVE(s->bup, float *, B * c->n_ff * 4);
        if (c->n_gdn_layers) {
            CARVE(s->bmixed, float *, B * conv_dim * 4);
            CARVE(s->bconv, float *, B * conv_dim * 4);
            CARVE(s->bz, float *, B * vdim * 4);
            CARVE(s->braw, float *, B * vdim * 4);
            CARVE(s->bbeta, float *, B * Hv * 4);
            CARVE(s->balpha, float *, B * Hv * 4);
            CARVE(s->bgb, float *, B * 2 * Hv * 4);
        }
        CARVE(s->blogits, float *, (size_t)s->n_logit_rows * c->n_vocab * 4);
        s->part_elems = 2 * MM_SLOT * (size_t)s->mm_blocks; // two slots per block of the product
        if (s->part_elems < MM_PART_ELEMS) s->part_elems = MM_PART_ELEMS;
        CARVE(s->bpart, float *, s->part_elems * 4);
    }
    s->batch_bytes = (size_t)(p - batch_start);
#undef CARVE
    s->kv_bytes = 2 * ALIGN256(cache * 2);
    s->state_bytes = conv_bytes + ssm_bytes;
    return (size_t)(p - (uintptr_t)base);
}

static void gpu_state_init(GpuState *s, Model *m, int n_ctx) {
    const Config *c = &m->c;
    memset(s, 0, sizeof *s);
    prefill_plan(s, m);
    s->n_ctx = n_ctx;
    s->n_split = att_splits(n_ctx, c->head_dim);
    attention_setup(c->n_head, c->n_head_kv, c->head_dim);
    size_t total = gpu_state_carve(s, c, n_ctx, NULL);
    CUDA_CHECK(cudaMalloc(&s->arena, total));
    CUDA_CHECK(cudaMemset(s->arena, 0, total));
    gpu_state_carve(s, c, n_ctx, (uint8_t *)s->arena);
    CUDA_CHECK(cudaMallocHost((void **)&s->h_x, c->n_embd * 4u));
    CUDA_CHECK(cudaMallocHost((void **)&s->h_pos, 4));
    CUDA_CHECK(cudaMallocHost((void **)&s->h_logits, c->n_vocab * 4u));
    if (s->n_batch) {
        CUDA_CHECK(cudaMallocHost((void **)&s->h_bx, (size_t)s->n_batch * c->n_embd * 4));
        CUDA_CHECK(
            cudaMallocHost((void **)&s->h_blogits, (size_t)s->n_logit_rows * c->n_vocab * 4));
        if (pa_smem(c->head_dim) > 48 * 1024)
            CUDA_CHECK(cudaFuncSetAttribute(attention_prefill_kernel,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)pa_smem(c->head_dim)));
    }
    CUDA_CHECK(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
}

static void gpu_state_free(GpuState *s) {
    if (s->graph) cudaGraphExecDestroy(s->graph);
    cudaFree(s->weights);
    cudaFree(s->arena);
    cudaFreeHost(s->h_x);
    cudaFreeHost(s->h_pos);
    cudaFreeHost(s->h_logits);
    if (s->h_bx) cudaFreeHost(s->h_bx);
    if (s->h_blogits) cudaFreeHost(s->h_blogits);
    cudaStreamDestroy(s->stream);
}

#define DEV(t) ((const float *)(t).dev) // an uploaded f32 vector (norm weight or bias), or NULL

// --- taps (section 4b): what the kernels leave in device memory, copied out ----------------------
// Only the tensors a kernel writes whole are tapped: the fused kernels' insides (the decode's
// q after RoPE, every output a mat-vec adds into x) exist on the CPU path alone, and the manifest
// says which path wrote each file. Each copy waits for the stream.

// Rows t0 .. t0+nt-1 of tensor `kind` in layer l: nt device rows of ld values, fp32 or (half) fp16,
// of which the tensor's `width` columns from col0 on are taken.
static void tap_dev(const GpuState *s, int kind, int l, int t0, int nt, const void *dev, int half,
                    size_t ld, size_t col0, const char *by) {
    if (!tap_wants(s->tap, kind, l)) return;
    size_t w = tap_width(s->tap->c, kind, l), n = (size_t)nt * ld, es = half ? 2 : 4;
    uint8_t *h = (uint8_t *)xmalloc(n * es, "a tapped tensor");
    float *rows = (float *)xmalloc((size_t)nt * w * 4, "a tapped tensor");
    CUDA_CHECK(cudaMemcpyAsync(h, dev, n * es, cudaMemcpyDeviceToHost, s->stream));
    CUDA_CHECK(cudaStreamSynchronize(s->stream));
    for (size_t r = 0; r < (size_t)nt; r++)
        for (size_t i = 0; i < w; i++)
            rows[r * w + i] = half ? fp16_to_f32(((const uint16_t *)h)[r * ld + col0 + i])
                                   : ((const float *)h)[r * ld + col0 + i];
    tap_put(s->tap, kind, l, t0, nt, rows, by);
    free(h);
    free(rows);
}

// The start of layer l for rows t0 .. t0+nt-1 held in x (nt, n_embd): their residual stream
// replaces ours when the tap injects (--diff-inject).
static void tap_layer_in(const GpuState *s, int l, int t0, int nt, float *x) {
    if (!s->tap || !s->tap->inject) return;
    size_t E = (size_t)s->tap->c->n_embd;
    CUDA_CHECK(cudaMemcpyAsync(x, s->tap->inject[l] + (size_t)t0 * E, nt * E * 4,
                               cudaMemcpyHostToDevice, s->stream));
}

// result_norm of rows x (nt, n_embd) on the device: the final norm is fused into the output
// mat-vec's 8-bit input, so the C rmsnorm computes it from the rows the kernels left.
static void tap_result_norm(const Model *m, const GpuState *s, int t0, int nt, const float *x,
                            const char *by) {
    if (!tap_wants(s->tap, TAP_RESULT_NORM, 0)) return;
    int E = m->c.n_embd;
    float *h = (float *)xmalloc((size_t)nt * E * 4, "a tapped tensor");
    CUDA_CHECK(cudaMemcpyAsync(h, x, (size_t)nt * E * 4, cudaMemcpyDeviceToHost, s->stream));
    CUDA_CHECK(cudaStreamSynchronize(s->stream));
    for (int r = 0; r < nt; r++)
        rmsnorm_c(h + (size_t)r * E, h + (size_t)r * E, (const float *)m->w.output_norm.host, E,
                  m->c.eps);
    tap_put(s->tap, TAP_RESULT_NORM, 0, t0, nt, h, by);
    free(h);
}

#define BY_DECODE "gpu decode"
#define BY_BATCH "gpu batched"

// --- one token: the layer loop -------------------------------------------------------------------

// Attention layer l: x = x + Wo attn(q, k, v): the q/k/v mat-vecs in one launch, then the
// attention with this token's per-head norm, RoPE and KV store folded in, then Wo added into s->x.
// Twin: attention_block_cpu.
static void attention_block_gpu(const Model *m, GpuState *s, int l) {
    const Config *c = &m->c;
    const LayerWeights *L = &m->w.layers[l];
    cudaStream_t st = s->stream;
    int hd = c->head_dim, gated = c->arch == ARCH_QWEN35;
    size_t kvdim = (size_t)c->n_head_kv * hd;
    float *qsrc = gated ? s->qg : s->q; // qwen35's Wq yields [q | gate] per head into qg
    matvec_qkv(&L->wq, &L->wk, &L->wv, DEV(L->bq), DEV(L->bk), DEV(L->bv), &s->xb, qsrc, s->k,
               s->v, st);
    size_t layer_off = (size_t)c->kv_slot[l] * s->n_ctx * kvdim;
    __half *kc = s->key_cache + layer_off, *vc = s->value_cache + layer_off;
    AttNew cur = {qsrc, gated ? 2 * hd : hd, s->k, s->v, DEV(L->q_norm), DEV(L->k_norm), c->n_rot,
                  s->rope_cs, c->eps};
    attention(NULL, kc, vc, &cur, s->part_o, s->part_ml, s->kv_done, &s->att_out,
              gated ? s->qg + hd : NULL, 2 * hd, s->pos, c->n_head, c->n_head_kv, hd, s->n_split,
              st);
    if (s->tap) { // this token's k as the cache holds it (fp16, after the head norm and RoPE)
        int pos = *s->h_pos;
        tap_dev(s, TAP_KCUR, l, pos, 1, kc + (size_t)pos * kvdim, 1, kvdim, 0, BY_DECODE);
        tap_dev(s, TAP_VCUR, l, pos, 1, s->v, 0, kvdim, 0, BY_DECODE);
    }
    matvec(&L->wo, &s->att_out, s->x, NULL, 1, st);
}

// DeltaNet layer l's conv state (3, conv_dim) and recurrent state (Hv, S, S) on the GPU.
static float *gdn_conv_state(const Config *c, const GpuState *s, int l) {
    return s->conv_state + (size_t)c->gdn_slot[l] * 3 * gdn_conv_dim(c);
}
static float *gdn_ssm_state(const Config *c, const GpuState *s, int l) {
    return s->ssm_state + (size_t)c->gdn_slot[l] * c->ssm_v_heads * c->ssm_state * c->ssm_state;
}

// Gated DeltaNet layer l: x = x + W_out gdn(norm(x)): the four in-projections in one launch, then
// conv, norms, gates, delta rule and gated norm in one (gdn_token_kernel; three launches for state
// sizes above 128), then W_out added into s->x. Twin: deltanet_block_cpu.
static void deltanet_block_gpu(const Model *m, GpuState *s, int l) {
    const Config *c = &m->c;
    const LayerWeights *L = &m->w.layers[l];
    cudaStream_t st = s->stream;
    int S = c->ssm_state, Hk = c->ssm_k_heads, Hv = c->ssm_v_heads;
    const Tensor *W[4] = {&L->wqkv, &L->wz, &L->w_beta, &L->w_alpha};
    const float *nob[4] = {NULL, NULL, NULL, NULL};
    float *y[4] = {s->gdn_mixed, s->gdn_z, s->gdn_beta, s->gdn_alpha};
    matvec_batch(4, W, nob, y, &s->xb, st);
    if (s->tap) {
        int pos = *s->h_pos;
        tap_dev(s, TAP_QKV_MIXED, l, pos, 1, s->gdn_mixed, 0, gdn_conv_dim(c), 0, BY_DECODE);
        tap_dev(s, TAP_Z, l, pos, 1, s->gdn_z, 0, c->ssm_inner, 0, BY_DECODE);
    }
    float *cs = gdn_conv_state(c, s, l), *state = gdn_ssm_state(c, s, l);
    if (gdn_token_ok(S)) {
        gdn_token(state, cs, s->gdn_mixed, DEV(L->conv1d), s->gdn_z, s->gdn_beta, s->gdn_alpha,
                  DEV(L->dt_bias), DEV(L->ssm_a), DEV(L->ssm_norm), &s->gdn_out, s->gdn_count, S,
                  Hk, Hv, c->eps, st);
    } else {
        gdn_conv_norm_kernel<<<2 * Hk + Hv, S, 0, st>>>(s->gdn_mixed, DEV(L->conv1d), cs,
                                                        s->gdn_beta, s->gdn_alpha, DEV(L->dt_bias),
                                                        DEV(L->ssm_a), s->gdn_gb, Hk, Hv, c->eps);
        KERNEL_CHECK();
        gdn_step(state, s->gdn_mixed, s->gdn_gb, s->gdn_raw, S, Hk, Hv, 1, st);
        gdn_gated_norm_kernel<<<Hv, S, 0, st>>>(s->gdn_out, s->gdn_raw, s->gdn_z,
                                               DEV(L->ssm_norm), c->eps);
        KERNEL_CHECK();
    }
    matvec(&L->ssm_out, &s->gdn_out, s->x, NULL, 1, st);
}

// The device work of one token, enqueued on the stream (and captured into the graph). Inputs:
// s->x holds the embedding row, *s->pos the position. Output: s->logits. Twin: forward_cpu.
static void forward_gpu_enqueue(const Model *m, GpuState *s) {
    const Config *c = &m->c;
    const Weights *w = &m->w;
    cudaStream_t st = s->stream;
    int E = c->n_embd;
    if (c->n_kv_layers) {
        int threads = (c->n_rot / 2 + WARP - 1) / WARP * WARP;
        rope_angles_kernel<<<1, threads, 0, st>>>(s->rope_cs, s->pos, c->n_rot, c->rope_base,
                                                  c->rope_freq_scale);
        KERNEL_CHECK();
    }
    int pos = s->tap ? *s->h_pos : 0; // a tap's row (a tapped pass is not captured)
    for (int l = 0; l < c->n_layer; l++) {
        const LayerWeights *L = &w->layers[l];
        tap_layer_in(s, l, pos, 1, s->x);
        rmsnorm_quant(&s->xb, s->x, DEV(L->attn_norm), E, c->eps, st);
        if (c->kind[l] == LAYER_DELTANET) deltanet_block_gpu(m, s, l);
        else attention_block_gpu(m, s, l);
        tap_dev(s, TAP_FFN_INP, l, pos, 1, s->x, 0, E, 0, BY_DECODE);
        // FFN: x = x + W_down (silu(W_gate h) * (W_up h)),  h = norm(x)
        rmsnorm_quant(&s->xb, s->x, DEV(L->ffn_norm), E, c->eps, st);
        ffn_gate_up(&L->w_gate, &L->w_up, &s->xb, &s->hb, s->hb2, st);
        matvec(&L->w_down, &s->hb, s->x, NULL, 1, st);
        tap_dev(s, TAP_L_OUT, l, pos, 1, s->x, 0, E, 0, BY_DECODE);
    }
    tap_result_norm(m, s, pos, 1, s->x, BY_DECODE);
    rmsnorm_quant(&s->xb, s->x, DEV(w->output_norm), E, c->eps, st);
    matvec(&w->output, &s->xb, s->logits, DEV(w->output_bias), 0, st);
}

// A token's work on the stream: its embedding row and position up, the forward pass, the logits
// down (pinned h_x, h_pos and h_logits).
static void forward_gpu_token_enqueue(const Model *m, GpuState *s) {
    cudaStream_t st = s->stream;
    CUDA_CHECK(cudaMemcpyAsync(s->x, s->h_x, m->c.n_embd * 4u, cudaMemcpyHostToDevice, st));
    CUDA_CHECK(cudaMemcpyAsync(s->pos, s->h_pos, 4, cudaMemcpyHostToDevice, st));
    forward_gpu_enqueue(m, s);
    CUDA_CHECK(
        cudaMemcpyAsync(s->h_logits, s->logits, m->c.n_vocab * 4u, cudaMemcpyDeviceToHost, st));
}

// Capture the forward pass as a graph, with its input and output copies, once.
static void gpu_capture(const Model *m, GpuState *s) {
    cudaStream_t st = s->stream;
    cudaGraph_t graph;
    CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    forward_gpu_token_enqueue(m, s);
    CUDA_CHECK(cudaStreamEndCapture(st, &graph));
    CUDA_CHECK(cudaGraphInstantiateWithFlags(&s->graph, graph, 0));
    CUDA_CHECK(cudaGraphDestroy(graph));
    // the instantiated graph holds device memory of its own, outside the VRAM budget's table
    size_t fr, tot;
    CUDA_CHECK(cudaMemGetInfo(&fr, &tot));
    if (tot - fr > s->peak_used) s->peak_used = tot - fr;
}

// One token through the model on the GPU; leaves the logits in s->h_logits. Twin of forward_cpu.
static void forward_gpu(const Model *m, GpuState *s, int token, int pos) {
    if (pos >= s->n_ctx) die("position %d is past the context of %d tokens", pos, s->n_ctx);
    embed_token(m, token, s->h_x);
    *s->h_pos = pos;
    if (pos == 0 && s->state_bytes) // a new sequence: clear the DeltaNet conv and recurrent states
        CUDA_CHECK(cudaMemsetAsync(s->conv_state, 0, s->state_bytes, s->stream));
    if (s->tap) { // the graph's work, enqueued step by step so that the taps can copy in between
        tap_put(s->tap, TAP_INP_EMBD, 0, pos, 1, s->h_x, BY_DECODE);
        forward_gpu_token_enqueue(m, s);
        CUDA_CHECK(cudaStreamSynchronize(s->stream));
        return;
    }
    if (!s->graph) gpu_capture(m, s);
    CUDA_CHECK(cudaGraphLaunch(s->graph, s->stream));
    CUDA_CHECK(cudaStreamSynchronize(s->stream));
}

// --- prefill: the batched pass (kernels in section 8) --------------------------------------------
// Speed: as section 8 (test/PERF_NOTES.md, "Prefill (section 8)"): engine_eval runs a prompt
// through forward_gpu token by token without it.

// Blocks of matmul_kernel<TYPE> resident on the whole GPU at once (the stream-K grid). The first
// call also opts the kernels in to their 72 KB of shared memory (over 48 KB must be asked for).
static int mm_resident(int type) {
    static int n_sm = 0, per_sm[GGML_TYPE_COUNT];
    if (!n_sm) {
        int dev;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev));
#define OPT_IN(TY)                                                                                 \
    CUDA_CHECK(cudaFuncSetAttribute(matmul_kernel<TY>,                                             \
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, MM_SMEM));        \
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm[TY], matmul_kernel<TY>,       \
                                                             MM_THREADS, MM_SMEM))
        for (int t = 0; t < GGML_TYPE_COUNT; t++) MM_TYPE_SWITCH(t, OPT_IN)
#undef OPT_IN
    }
    if (type < 0) { // the most over all types: what s->bpart is sized for
        int most = 0;
        for (int i = 0; i < GGML_TYPE_COUNT; i++) most = per_sm[i] > most ? per_sm[i] : most;
        return n_sm * most;
    }
    return n_sm * (per_sm[type] > 0 ? per_sm[type] : 1);
}

// The tensor-core product of weights w (planes of a fast type, or F16 or BF16 rows): matmul_kernel
// on a grid of the blocks that fit on the GPU (no more than there are steps, nor than s->bpart has
// slots for), then matmul_fixup_kernel for the tiles cut between blocks.
static void matmul_tc(int type, const uint8_t *w /* planes or rows (NB sub-blocks) */,
                      size_t NB, StepOrder so, const ActH *x, int T, float *y /* (T, ldy) */,
                      int ldy, const float *bias /* (n_out) or NULL */, int n_in, int n_out,
                      int accumulate, GpuState *s) {
    cudaStream_t st = s->stream;
    int n_tiles = ((T + MM_TT - 1) / MM_TT) * ((n_out + MM_TN - 1) / MM_TN),
        n_steps = (n_in / 32 + 1) / 2;
    long long total = (long long)n_tiles * n_steps;
    if ((long long)T * x->ld >= (1ll << 31) || total >= (1ll << 31))
        die("prefill: a product of %d rows x %d by %d x %d is too large for one pass (use a "
            "smaller -b)", T, n_in, n_out, n_in);
    long long G = mm_resident(type);
    if (G > total) G = total;
    if (G > (long long)(s->part_elems / (2 * MM_SLOT)))
        G = (long long)(s->part_elems / (2 * MM_SLOT));
    if (G < 1) G = 1; // one block cuts no tile: part is never written
    if (!is_mm_type(type)) die("matmul_tc: type %s", type_name(type));
#define MM(TY)                                                                                     \
    matmul_kernel<TY><<<(unsigned)G, MM_THREADS, MM_SMEM, st>>>(w, NB, so, *x, y, s->bpart, ldy,   \
                                                                bias, T, n_in, n_out, accumulate)
    MM_TYPE_SWITCH(type, MM)
#undef MM
    KERNEL_CHECK();
    if (G > 1) {
        matmul_fixup_kernel<<<(unsigned)n_tiles, 256, 0, st>>>(y, ldy, s->bpart, (int)G, bias, T,
                                                               n_in, n_out, accumulate);
        KERNEL_CHECK();
    }
}

// y (T, ldy) (+)= x W^T (+ bias) for T rows. F32 weights: the fp32 product; the rest (planes of
// the quantized types, rows of F16 and BF16): the tensor-core product.
static void matmul(const Tensor *W, const ActH *x, int T, float *y /* (T, ldy) */, int ldy,
                   const float *bias /* (n_out) or NULL */, int accumulate, GpuState *s) {
    cudaStream_t st = s->stream;
    int n_in = (int)W->n_in, n_out = (int)W->n_out;
    const uint8_t *w = (const uint8_t *)W->dev;
    if (W->type == GGML_TYPE_F32) {
        if (!x->f) die("prefill: F32 weight '%s' but no fp32 rows", W->name);
        dim3 grid((unsigned)((T + SG_T - 1) / SG_T), (unsigned)((n_out + SG_N - 1) / SG_N));
        matmul_f32_kernel<<<grid, 256, 0, st>>>((const float *)w, *x, y, ldy, bias, T, n_in,
                                                n_out, accumulate);
        KERNEL_CHECK();
        return;
    }
    // quantized weights in planes; F16, BF16 row by row (their upload never reorders them)
    if (is_fast_type(W->type) ? !W->planes : W->so.upw != 0)
        die("prefill: weight '%s' (%s) is not in the product's layout", W->name,
            type_name(W->type));
    size_t NB = (size_t)n_out * (n_in / 32);
    matmul_tc(W->type, w, NB, W->so, x, T, y, ldy, bias, n_in, n_out, accumulate, s);
}

static void rmsnorm_rows(ActH *out /* (T, n) fp16 rows */, const float *x /* (T, n) */,
                         const float *w /* (n) */, int T, int n, float eps, cudaStream_t st) {
    rmsnorm_rows_kernel<<<T, ROW_THREADS, 0, st>>>(*out, x, w, n, eps);
    KERNEL_CHECK();
}

// Attention layer l over T prompt rows at positions pos0..: the q, k, v products, RoPE and the KV
// store of every row, causal attention over the cache, then Wo added into the rows of s->bx.
// Twin: attention_block_cpu, row by row.
static void attention_batch_gpu(const Model *m, GpuState *s, int l, int T, int pos0) {
    const Config *c = &m->c;
    const LayerWeights *L = &m->w.layers[l];
    cudaStream_t st = s->stream;
    int hd = c->head_dim, gated = c->arch == ARCH_QWEN35;
    int qdim = c->n_head * hd, kvdim = c->n_head_kv * hd;
    float *qsrc = gated ? s->bqg : s->bq; // qwen35: per head [q | gate]
    matmul(&L->wq, &s->bxh, T, qsrc, gated ? 2 * qdim : qdim, DEV(L->bq), 0, s);
    matmul(&L->wk, &s->bxh, T, s->bk, kvdim, DEV(L->bk), 0, s);
    matmul(&L->wv, &s->bxh, T, s->bv, kvdim, DEV(L->bv), 0, s);
    size_t layer_off = (size_t)c->kv_slot[l] * s->n_ctx * kvdim;
    __half *kc = s->key_cache + layer_off, *vc = s->value_cache + layer_off;
    rope_and_kv_store_kernel<<<dim3(c->n_head + c->n_head_kv, T), 128, hd * 4, st>>>(
        s->bq, qsrc, gated ? 2 * hd : hd, s->bk, s->bv, DEV(L->q_norm), DEV(L->k_norm), kc, vc,
        s->pos, c->n_head, c->n_head_kv, hd, c->n_rot, c->rope_base, c->rope_freq_scale, c->eps);
    KERNEL_CHECK();
    tap_dev(s, TAP_QCUR, l, pos0, T, s->bq, 0, qdim, 0, BY_BATCH);
    tap_dev(s, TAP_KCUR, l, pos0, T, kc + (size_t)pos0 * kvdim, 1, kvdim, 0, BY_BATCH);
    tap_dev(s, TAP_VCUR, l, pos0, T, s->bv, 0, kvdim, 0, BY_BATCH);
    dim3 grid((T + PA_TQ - 1) / PA_TQ, c->n_head);
    attention_prefill_kernel<<<grid, PA_THREADS, pa_smem(hd), st>>>(
        s->bq, kc, vc, s->bxh, gated ? s->bqg + hd : NULL, 2 * qdim, pos0, T, c->n_head,
        c->n_head_kv, hd);
    KERNEL_CHECK();
    matmul(&L->wo, &s->bxh, T, s->bx, c->n_embd, NULL, 1, s);
}

// DeltaNet layer l over T prompt rows: the four products, the causal conv over the rows (the conv
// state supplies the rows before them, and keeps their last 3), the norms and gates of every row,
// the delta rule through the rows in order, the gated norm, then W_out added into s->bx.
// Twin: deltanet_block_cpu, row by row.
static void deltanet_batch_gpu(const Model *m, GpuState *s, int l, int T, int pos0) {
    const Config *c = &m->c;
    const LayerWeights *L = &m->w.layers[l];
    cudaStream_t st = s->stream;
    int S = c->ssm_state, Hk = c->ssm_k_heads, Hv = c->ssm_v_heads, vdim = c->ssm_inner;
    int conv_dim = (int)gdn_conv_dim(c);
    matmul(&L->wqkv, &s->bxh, T, s->bmixed, conv_dim, NULL, 0, s);
    matmul(&L->wz, &s->bxh, T, s->bz, vdim, NULL, 0, s);
    matmul(&L->w_beta, &s->bxh, T, s->bbeta, Hv, NULL, 0, s);
    matmul(&L->w_alpha, &s->bxh, T, s->balpha, Hv, NULL, 0, s);
    tap_dev(s, TAP_QKV_MIXED, l, pos0, T, s->bmixed, 0, conv_dim, 0, BY_BATCH);
    tap_dev(s, TAP_Z, l, pos0, T, s->bz, 0, vdim, 0, BY_BATCH);
    float *cs = gdn_conv_state(c, s, l), *state = gdn_ssm_state(c, s, l);
    size_t n_conv = (size_t)T * conv_dim;
    gdn_conv_rows_kernel<<<(unsigned)((n_conv + 255) / 256), 256, 0, st>>>(
        s->bconv, s->bmixed, DEV(L->conv1d), cs, conv_dim, T);
    KERNEL_CHECK();
    gdn_conv_state_kernel<<<(conv_dim + 255) / 256, 256, 0, st>>>(cs, s->bmixed, conv_dim, T);
    KERNEL_CHECK();
    tap_dev(s, TAP_CONV, l, pos0, T, s->bconv, 0, conv_dim, 0, BY_BATCH);
    gdn_l2norm_gates_rows_kernel<<<dim3(2 * Hk + Hv, T), S, 0, st>>>(
        s->bconv, s->bbeta, s->balpha, DEV(L->dt_bias), DEV(L->ssm_a), s->bgb, Hk, Hv, c->eps);
    KERNEL_CHECK();
    if (s->tap) { // bgb rows: [g (Hv) | beta (Hv)]; bconv rows: [q | k | v]
        size_t kS = (size_t)Hk * S;
        tap_dev(s, TAP_GATE, l, pos0, T, s->bgb, 0, 2 * Hv, 0, BY_BATCH);
        tap_dev(s, TAP_BETA, l, pos0, T, s->bgb, 0, 2 * Hv, Hv, BY_BATCH);
        tap_dev(s, TAP_Q_CONV, l, pos0, T, s->bconv, 0, conv_dim, 0, BY_BATCH);
        tap_dev(s, TAP_K_CONV, l, pos0, T, s->bconv, 0, conv_dim, kS, BY_BATCH);
        tap_dev(s, TAP_V_CONV, l, pos0, T, s->bconv, 0, conv_dim, 2 * kS, BY_BATCH);
    }
    gdn_step(state, s->bconv, s->bgb, s->braw, S, Hk, Hv, T, st);
    tap_dev(s, TAP_DELTA_OUT, l, pos0, T, s->braw, 0, vdim, 0, BY_BATCH);
    gdn_gated_norm_rows_kernel<<<T, S, 0, st>>>(s->bxh, s->braw, s->bz, DEV(L->ssm_norm), Hv,
                                               c->eps);
    KERNEL_CHECK();
    tap_dev(s, TAP_FINAL_OUT, l, pos0, T, s->braw, 0, vdim, 0, BY_BATCH); // gated in place
    matmul(&L->ssm_out, &s->bxh, T, s->bx, c->n_embd, NULL, 1, s);
}

// The device work of a batched pass: T rows at positions pos0.. through every layer, from the
// embedding rows in s->bx to the residual stream rows in s->bx.
static void forward_gpu_batch_enqueue(const Model *m, GpuState *s, int T, int pos0) {
    const Config *c = &m->c;
    cudaStream_t st = s->stream;
    int E = c->n_embd;
    for (int l = 0; l < c->n_layer; l++) {
        const LayerWeights *L = &m->w.layers[l];
        tap_layer_in(s, l, pos0, T, s->bx);
        rmsnorm_rows(&s->bxh, s->bx, DEV(L->attn_norm), T, E, c->eps, st);
        if (c->kind[l] == LAYER_DELTANET) deltanet_batch_gpu(m, s, l, T, pos0);
        else attention_batch_gpu(m, s, l, T, pos0);
        tap_dev(s, TAP_FFN_INP, l, pos0, T, s->bx, 0, E, 0, BY_BATCH);
        rmsnorm_rows(&s->bxh, s->bx, DEV(L->ffn_norm), T, E, c->eps, st);
        matmul(&L->w_gate, &s->bxh, T, s->bgate, c->n_ff, NULL, 0, s);
        matmul(&L->w_up, &s->bxh, T, s->bup, c->n_ff, NULL, 0, s);
        silu_mul_rows_kernel<<<T, ROW_THREADS, 0, st>>>(s->bxh, s->bgate, s->bup, c->n_ff);
        KERNEL_CHECK();
        matmul(&L->w_down, &s->bxh, T, s->bx, E, NULL, 1, s);
        tap_dev(s, TAP_L_OUT, l, pos0, T, s->bx, 0, E, 0, BY_BATCH);
    }
    tap_result_norm(m, s, pos0, T, s->bx, BY_BATCH);
}

// Rows tokens[0..T) at positions pos0.. through every layer at once (T <= n_batch); the residual
// stream of every row is left in s->bx. The caches and DeltaNet states end as if the T tokens had
// been fed one by one. Twin: T calls of forward_gpu (and of forward_cpu).
static void forward_gpu_batch(const Model *m, GpuState *s, const int *tokens /* (T) */, int T,
                              int pos0) {
    cudaStream_t st = s->stream;
    int E = m->c.n_embd;
    if (T < 1 || T > s->n_batch) die("prefill: %d rows for a batch of %d", T, s->n_batch);
    if (pos0 + T > s->n_ctx)
        die("position %d is past the context of %d tokens", pos0 + T - 1, s->n_ctx);
    CUDA_CHECK(cudaStreamSynchronize(st)); // h_bx and h_pos may still feed the last pass's copies
    for (int t = 0; t < T; t++) embed_token(m, tokens[t], s->h_bx + (size_t)t * E);
    if (s->tap) tap_put(s->tap, TAP_INP_EMBD, 0, pos0, T, s->h_bx, BY_BATCH);
    *s->h_pos = pos0;
    CUDA_CHECK(cudaMemcpyAsync(s->bx, s->h_bx, (size_t)T * E * 4, cudaMemcpyHostToDevice, st));
    CUDA_CHECK(cudaMemcpyAsync(s->pos, s->h_pos, 4, cudaMemcpyHostToDevice, st));
    if (pos0 == 0 && s->state_bytes)
        CUDA_CHECK(cudaMemsetAsync(s->conv_state, 0, s->state_bytes, st));
    forward_gpu_batch_enqueue(m, s, T, pos0);
}

// Logits of batch rows [r0, r0 + nr) of the last forward_gpu_batch, on the device in s->blogits.
static void batch_output_gpu(const Model *m, GpuState *s, int r0, int nr) {
    const Config *c = &m->c;
    if (nr < 1 || nr > s->n_logit_rows)
        die("prefill: %d logit rows for room of %d", nr, s->n_logit_rows);
    rmsnorm_rows(&s->bxh, s->bx + (size_t)r0 * c->n_embd, DEV(m->w.output_norm), nr, c->n_embd,
                 c->eps, s->stream);
    matmul(&m->w.output, &s->bxh, nr, s->blogits, c->n_vocab, DEV(m->w.output_bias), 0, s);
}

// ... and copied to s->h_blogits (nr, n_vocab).
static void batch_logits_gpu(const Model *m, GpuState *s, int r0, int nr) {
    batch_output_gpu(m, s, r0, nr);
    CUDA_CHECK(cudaMemcpyAsync(s->h_blogits, s->blogits, (size_t)nr * m->c.n_vocab * 4,
                               cudaMemcpyDeviceToHost, s->stream));
    CUDA_CHECK(cudaStreamSynchronize(s->stream));
}

// Negative log-likelihoods of batch rows [r0, r0 + nr) for the given next tokens into nll (host).
static void batch_nll_gpu(const Model *m, GpuState *s, int r0, int nr,
                          const int *targets /* (nr) */, float *nll /* (nr) host */) {
    batch_output_gpu(m, s, r0, nr);
    int *dt = (int *)s->bpart; // the split-product scratch is free between products
    float *dn = s->bpart + nr;
    CUDA_CHECK(cudaMemcpyAsync(dt, targets, nr * 4u, cudaMemcpyHostToDevice, s->stream));
    row_nll_kernel<<<nr, 1024, 0, s->stream>>>(s->blogits, dt, dn, m->c.n_vocab);
    KERNEL_CHECK();
    CUDA_CHECK(cudaMemcpyAsync(nll, dn, nr * 4u, cudaMemcpyDeviceToHost, s->stream));
    CUDA_CHECK(cudaStreamSynchronize(s->stream));
}

// ------------------------------------------------------------------------------------------------
// 10. Tokenizer (tokenizer.c) and sampler
// ------------------------------------------------------------------------------------------------

#include "tokenizer.c"

// Sampling follows llama.cpp's default chain, so that the same flags mean the same thing in both:
//   top-k  ->  top-p  ->  min-p  ->  temperature  ->  draw.
// top-p's nucleus is the smallest set of the most likely tokens whose probabilities (the softmax
// of the raw logits of the top-k candidates) sum to at least top_p; min-p then keeps the tokens
// with p >= min_p * p_max, i.e. logit >= max logit + ln(min_p). Both keep a prefix of the same
// order (logit, then id), so their order decides nothing, but the nucleus is taken on the top-k
// softmax, before min-p, as llama.cpp takes it. The temperature applies to what is left. temp <= 0
// is greedy (argmax, lowest id on ties). The random stream is xorshift64* seeded by --seed: the
// same seed, model and prompt give the same tokens.

typedef struct {
    float logit, p;
    int id;
} Candidate;

typedef struct {
    int n_vocab;
    float temp, top_p, min_p;
    int top_k;
    uint64_t rng;
    Candidate *cand; // (n_vocab) scratch
} Sampler;

static void sampler_init(Sampler *s, int n_vocab, float temp, int top_k, float top_p, float min_p,
                         uint64_t seed) {
    s->n_vocab = n_vocab;
    s->temp = temp;
    s->top_k = top_k;
    s->top_p = top_p;
    s->min_p = min_p;
    s->rng = seed * 0x9E3779B97F4A7C15ull + 1;
    if (!s->rng) s->rng = 1; // xorshift stays at zero forever (one seed in 2^64 lands there)
    s->cand = (Candidate *)xmalloc((size_t)n_vocab * sizeof(Candidate), "the sampler");
}

static uint32_t rng_u32(uint64_t *state) { // xorshift64*
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return (uint32_t)((*state * 0x2545F4914F6CDD1Dull) >> 32);
}
static float rng_f32(uint64_t *state) { return (rng_u32(state) >> 8) / 16777216.0f; } // [0, 1)

// The index of the largest value; -1 if any is NaN (a broken model: see sample).
static int argmax(const float *v, int n) {
    int best = 0;
    for (int i = 0; i < n; i++) {
        if (v[i] != v[i]) return -1;
        if (v[i] > v[best]) best = i;
    }
    return best;
}

// a ranks before b: larger logit first, then smaller id
static int cand_before(const Candidate *a, const Candidate *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}
static int cand_cmp(const void *a, const void *b) {
    return cand_before((const Candidate *)a, (const Candidate *)b)
               ? -1
               : cand_before((const Candidate *)b, (const Candidate *)a);
}

// Keep the k best candidates of c[0..n) in c[0..k): a min-heap of the best k seen so far.
static void keep_top_k(Candidate *c, int n, int k) {
    for (int i = 1; i < k; i++) // heapify c[0..k): root = worst
        for (int j = i; j > 0 && cand_before(&c[(j - 1) / 2], &c[j]); j = (j - 1) / 2) {
            Candidate t = c[j]; c[j] = c[(j - 1) / 2]; c[(j - 1) / 2] = t;
        }
    for (int i = k; i < n; i++) {
        if (!cand_before(&c[i], &c[0])) continue;
        c[0] = c[i]; // replace the worst, sift it down
        for (int j = 0;;) {
            int l = 2 * j + 1, r = l + 1, w = j;
            if (l < k && cand_before(&c[w], &c[l])) w = l;
            if (r < k && cand_before(&c[w], &c[r])) w = r;
            if (w == j) break;
            Candidate t = c[j]; c[j] = c[w]; c[w] = t;
            j = w;
        }
    }
}

// The candidates a draw chooses from: top-k, then top-p, then min-p (the chain above) leave them in
// s->cand[0..n), and the return value is n, at least 1. *mx gets the largest logit. -1 when the
// logits are not finite (a NaN, or an infinity that makes the softmax NaN): the model's weights
// hold such values or its activations overflowed, and no token can be drawn.
static int sampler_keep(Sampler *s, const float *logits, float *mx) {
    Candidate *c = s->cand;
    int n = s->n_vocab, nan = 0;
    for (int i = 0; i < n; i++) {
        c[i].logit = logits[i];
        c[i].id = i;
        nan |= logits[i] != logits[i];
    }
    if (nan) return -1;
    if (s->top_k > 0 && s->top_k < n) {
        keep_top_k(c, n, s->top_k);
        n = s->top_k;
    }
    *mx = -INFINITY;
    for (int i = 0; i < n; i++) *mx = fmaxf(*mx, c[i].logit);
    if (!isfinite(*mx)) return -1; // an infinity (no NaN is left: the copy above looked)
    if (s->top_p < 1.0f) {
        // p = softmax of the candidates' raw logits; S = their sum as the nucleus adds them
        double sum = 0.0, S = 0.0;
        for (int i = 0; i < n; i++) { c[i].p = expf(c[i].logit - *mx); sum += c[i].p; }
        for (int i = 0; i < n; i++) { c[i].p = (float)(c[i].p / sum); S += c[i].p; }
        // The cut before the sort (the sort is what costs, over a whole vocabulary): a token at
        // place j >= 1 of the sorted order is in the nucleus only if the places before it sum to
        // less than top_p. Then the n - j places from j on hold more than S - top_p, each at most
        // p_t (the order is by logit, and p grows with the logit), so (n - 1) p_t > S - top_p. A
        // token under that bound cannot be in the nucleus. The bound is loosened by 1e-9 for the
        // rounding of the double sums (under 1e-10 for any vocabulary) and by a factor 1 + 1e-6
        // for expf's (a float ulp, 1.2e-7), so the cut never drops a token the nucleus holds. The
        // top token stays whatever the bound.
        if (n > 1) {
            double bound = (S - s->top_p - 1e-9) / ((n - 1) * (1.0 + 1e-6));
            int m = 0;
            for (int i = 0; i < n; i++)
                if (c[i].p >= bound || c[i].logit == *mx) c[m++] = c[i];
            n = m;
        }
        qsort(c, n, sizeof *c, cand_cmp);
        double cum = 0.0;
        int m = 0;
        while (m < n) { cum += c[m++].p; if (cum >= s->top_p) break; }
        n = m;
    }
    // min-p as llama.cpp has it, on the logits: p >= min_p * p_max <=> logit >= mx + ln(min_p).
    // The top token always stays (llama.cpp keeps the first of its sorted candidates).
    if (s->min_p > 0.0f) {
        float min_logit = *mx + logf(s->min_p);
        int m = 0;
        for (int i = 0; i < n; i++)
            if (c[i].logit >= min_logit || c[i].logit == *mx) c[m++] = c[i];
        n = m;
    }
    return n;
}

// The next token: greedy, or a draw from sampler_keep's candidates with p ~ exp(logit / temp).
// -1 when the logits hold a NaN or their largest is infinite (a broken model), as sampler_keep.
static int sample(Sampler *s, const float *logits) {
    if (s->temp <= 0.0f) {
        int t = argmax(logits, s->n_vocab);
        return t < 0 || !isfinite(logits[t]) ? -1 : t;
    }
    float mx;
    int n = sampler_keep(s, logits, &mx);
    if (n < 0) return -1;
    Candidate *c = s->cand;
    double total = 0.0;
    for (int i = 0; i < n; i++) { c[i].p = expf((c[i].logit - mx) / s->temp); total += c[i].p; }
    double r = rng_f32(&s->rng) * total, acc = 0.0;
    for (int i = 0; i < n; i++) {
        acc += c[i].p;
        if (r < acc) return c[i].id;
    }
    return c[n - 1].id;
}

// ------------------------------------------------------------------------------------------------
// 11. Running the model: the engine, generate and chat, --bench, --info, perplexity, the CLI
// ------------------------------------------------------------------------------------------------

// The forward pass on either device, behind one call.
typedef struct {
    Model *m;
    int use_gpu;
    CpuState cpu;
    GpuState gpu;
} Engine;

// The VRAM budget of every GPU run (generation, chat, perplexity, --diff-logits, --bench) at n_ctx,
// before anything large is allocated: printed when it fits, else the refusal with its hints and
// exit 1 (min_ctx: the smallest context the run can take, budget_hints). --vram-limit caps the
// card (budget_measure).
static void budget_or_refuse(Model *m, int n_ctx, int min_ctx) {
    Budget b;
    memset(&b, 0, sizeof b);
    budget_measure(&b, g_vram_limit); // creates the CUDA context first
    budget_compute(&b, m, n_ctx);
    if (!budget_fits(&b)) {
        budget_refusal_min(&b, m, n_ctx, min_ctx, g_vram_limit, stderr);
        exit_failed();
    }
    if (g_verbose) budget_print(&b, m, n_ctx, g_vram_limit, stderr);
}

// Without a GPU, --vram-limit stands for the whole card: "will this file fit a 16 GB V100?" gets
// an answer on any machine (--info, and --bench before it says it needs a GPU). The CUDA context
// cannot be measured here, so the verdict says how much of the limit is left for it; when the
// model does not fit, the hints are computed with the whole limit free (upper bounds: the context
// takes its share too). Returns 1 when it fits before the context.
static int budget_limit_verdict(Model *m, int n_ctx, int min_ctx, FILE *f) {
    const double G = 1073741824.0;
    Budget b;
    memset(&b, 0, sizeof b);
    budget_compute(&b, m, n_ctx);
    budget_print(&b, m, n_ctx, g_vram_limit, f);
    b.card_total = b.card_free = (size_t)g_vram_limit;
    double need = (double)budget_need(&b);
    if (budget_fits(&b)) {
        fprintf(f, "  against --vram-limit %.3f GiB: fits if the CUDA context and whatever else "
                "uses the card take at most %.3f GiB (the context alone measured 0.52 GiB on an "
                "H200)\n", g_vram_limit / G, (g_vram_limit - need) / G);
        return 1;
    }
    fprintf(f, "  against --vram-limit %.3f GiB: DOES NOT FIT, even before the CUDA context "
            "(%.3f GiB over)\n", g_vram_limit / G, (need - g_vram_limit) / G);
    budget_hints(&b, m, n_ctx, min_ctx, f);
    return 0;
}

// The engine of a run with room for n_ctx positions; a run that cannot use a context below min_ctx
// (a prompt's length, a base file's chunk) gets no refusal hint of one.
static void engine_init_run(Engine *e, Model *m, int use_gpu, int n_ctx, int min_ctx) {
    memset(e, 0, sizeof *e);
    e->m = m;
    e->use_gpu = use_gpu;
    if (use_gpu) {
        if (!gpu_available())
            die("no CUDA GPU found (run with --cpu for the plain-C reference path)");
        budget_or_refuse(m, n_ctx, min_ctx);
        gpu_state_init(&e->gpu, m, n_ctx);
        upload_weights(m, &e->gpu);
        gpu_capture(m, &e->gpu); // the graph's memory too is taken before the first token
    } else {
        cpu_state_init(&e->cpu, &m->c, n_ctx);
    }
}

static void engine_init(Engine *e, Model *m, int use_gpu, int n_ctx) {
    engine_init_run(e, m, use_gpu, n_ctx, 1);
}

static void engine_free(Engine *e) {
    if (e->use_gpu) gpu_state_free(&e->gpu);
    else cpu_state_free(&e->cpu);
}

// Feed `token` at position `pos`; returns the logits (n_vocab), valid until the next call.
static float *engine_forward(Engine *e, int token, int pos) {
    if (token < 0 || token >= e->m->c.n_vocab)
        die("token id %d is outside the vocabulary (0..%d)", token, e->m->c.n_vocab - 1);
    if (e->use_gpu) {
        forward_gpu(e->m, &e->gpu, token, pos);
        return e->gpu.h_logits;
    }
    forward_cpu(e->m, &e->cpu, token, pos);
    return e->cpu.logits;
}

// Every id of tokens[0..n) inside a vocabulary of n_vocab, or exit naming the first one outside it.
static void check_tokens(int n_vocab, const int *tokens, int n, const char *what) {
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= n_vocab)
            die("%s %d (id %d) is outside the vocabulary (0..%d)", what, i, tokens[i],
                n_vocab - 1);
}

// The batched pass over a prompt on the GPU: tokens[0..n) from position pos in batches of up to -b
// rows; after each batch, rows(e, ctx, i0, r, nr) for its rows r .. r+nr-1 (groups of at most
// n_logit_rows) that hold prompt indices i0 .. i0+nr-1 >= first.
typedef void (*RowsFn)(Engine *e, void *ctx, int i0, int r, int nr);
static void gpu_prompt_batches(Engine *e, const int *tokens /* (n) */, int n, int pos, int first,
                               RowsFn rows, void *ctx) {
    GpuState *s = &e->gpu;
    for (int b0 = 0; b0 < n; b0 += s->n_batch) {
        int T = n - b0 < s->n_batch ? n - b0 : s->n_batch;
        forward_gpu_batch(e->m, s, tokens + b0, T, pos + b0);
        for (int r = first > b0 ? first - b0 : 0; r < T; r += s->n_logit_rows) {
            int nr = T - r < s->n_logit_rows ? T - r : s->n_logit_rows;
            rows(e, ctx, b0 + r, r, nr);
        }
    }
}

// Feed tokens[0..n) at positions pos, pos+1, ...: a prompt. The logits after each token i >= first
// (first <= n - 1) are handed to each(ctx, i, logits) in order when `each` is given; the logits
// after the last token are returned, valid until the next call. On the GPU the tokens go through
// the model in batches of up to -b rows (section 8), else one at a time.
typedef void (*LogitsFn)(void *ctx, int i, const float *logits);
typedef struct { LogitsFn each; void *ctx; float *last; /* (n_vocab) */ } EvalRows;
static void eval_rows(Engine *e, void *p, int i0, int r, int nr) {
    EvalRows *v = (EvalRows *)p;
    int V = e->m->c.n_vocab;
    batch_logits_gpu(e->m, &e->gpu, r, nr);
    for (int k = 0; k < nr; k++)
        if (v->each) v->each(v->ctx, i0 + k, e->gpu.h_blogits + (size_t)k * V);
    v->last = e->gpu.h_blogits + (size_t)(nr - 1) * V;
}
static float *engine_eval(Engine *e, const int *tokens, int n, int pos, int first, LogitsFn each,
                          void *ctx) {
    check_tokens(e->m->c.n_vocab, tokens, n, "token");
    if (n < 1 || first > n - 1) die("engine_eval: %d tokens, logits from %d", n, first);
    if (!e->use_gpu || !e->gpu.n_batch || n == 1) {
        float *logits = NULL;
        for (int i = 0; i < n; i++) {
            logits = engine_forward(e, tokens[i], pos + i);
            if (each && i >= first) each(ctx, i, logits);
        }
        return logits;
    }
    EvalRows v = {each, ctx, NULL};
    gpu_prompt_batches(e, tokens, n, pos, first, eval_rows, &v);
    return v.last;
}

// Bytes the GPU moves to produce one token at context length n_past: every uploaded weight once,
// the K and V cache rows of every attention layer, the DeltaNet states read and written.
static double bytes_per_token(const Config *c, const GpuState *s, double n_past) {
    return (double)s->weight_bytes +
           2.0 * c->n_kv_layers * n_past * c->n_head_kv * c->head_dim * sizeof(__half) +
           2.0 * s->state_bytes;
}

// The ids of option opt, "1,2,3" (blanks around an id allowed), as a malloc'd array; returns the
// count. An empty field, a field that is not a number, or an id past 2^31 - 1 is an error that
// names the option and its whole argument.
static int parse_ids(const char *opt, const char *s, int **out) {
    int cap = 16, n = 0;
    int *ids = (int *)xmalloc(cap * sizeof(int), opt);
    for (const char *p = s;; p++) { // p: the start of a field
        while (isspace((unsigned char)*p)) p++;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || !isdigit((unsigned char)*p) || v > INT32_MAX || errno)
            die("%s '%s': not a list of token ids such as 9707,11,1879", opt, s);
        if (n == cap) ids = (int *)xrealloc(ids, (size_t)(cap *= 2) * sizeof(int), opt);
        ids[n++] = (int)v;
        for (p = end; isspace((unsigned char)*p); p++) {}
        if (!*p) break;
        if (*p != ',') die("%s '%s': not a list of token ids such as 9707,11,1879", opt, s);
    }
    *out = ids;
    return n;
}

// Logits that hold a NaN or an infinity give no probabilities: every mode stops there, naming the
// position (and the chunk: 0 outside perplexity).
static void die_not_finite(int pos, int chunk) {
    char where[48] = "";
    if (chunk > 0) snprintf(where, sizeof where, " of chunk %d", chunk);
    die("the logits at position %d%s are not finite (NaN or infinity): the model's weights hold "
        "such values, or its activations overflowed", pos, where);
}
static void check_finite(const float *logits, int n, int pos, int chunk) {
    for (int i = 0; i < n; i++)
        if (!isfinite(logits[i])) die_not_finite(pos, chunk);
}

// --- a run: its mode and options -----------------------------------------------------------------
// main reads the flags (parse_args, at the end of the file), opens the model, and hands over to
// one mode: generate or chat (next), tokenize, detokenize, info, bench, perplexity (writing a
// KL-divergence base file, or scoring against one), or diff (another engine's logits against
// ours). A run has one mode, and every option names the modes it applies to: an option given to a
// mode it does not apply to is an error, never silently ignored.

enum {
    MODE_GENERATE = 1,    // from -p, -f or --tokens (the default)
    MODE_CHAT = 2,        // --chat
    MODE_PERPLEXITY = 4,  // --perplexity, and --kl-divergence-base FILE to write a base file
    MODE_KLD = 8,         // --kl-divergence: score against a base file, on its own tokens
    MODE_TOKENIZE = 16,   // --tokenize
    MODE_DETOKENIZE = 32, // --detokenize
    MODE_INFO = 64,       // --info
    MODE_BENCH = 128,     // --bench
    MODE_DIFF = 256,      // --diff-logits FILE: another engine's logits against ours
    MODE_HIDDEN = 512,    // --dump-hidden DIR, --diff-hidden THEIRS: the tensors inside the model
    N_MODES = 10,
};
// one name per MODE_* bit, in the bits' order
static const char *const MODE_NAMES[N_MODES] = {"generation (-p, -f or --tokens)", "--chat",
                                                "--perplexity", "--kl-divergence", "--tokenize",
                                                "--detokenize", "--info", "--bench",
                                                "--diff-logits",
                                                "--dump-hidden / --diff-hidden"};
static const char *mode_name(int mode) {
    for (int i = 0; i < N_MODES; i++)
        if (mode == 1 << i) return MODE_NAMES[i];
    return "?";
}

typedef struct {
    const char *model_path, *prompt, *prompt_file, *tokens_arg, *detok_arg;
    const char *system_prompt, *dump_path, *kld_base_path;
    const char *diff_path, *diff_out; // --diff-logits THEIRS, --diff-out FILE.tsv
    double diff_max_kl;               // --diff-max-kl: the exit status's threshold
    const char *hidden_dump, *hidden_diff; // --dump-hidden DIR, --diff-hidden THEIRS (or cpu)
    const char *hidden_filter;        // --hidden-filter REGEX
    double diff_max_rel;              // --diff-max-rel (-1: the default of the comparison)
    int diff_inject;                  // --diff-inject: each layer starts from their input
    size_t prompt_len;       // bytes of prompt (-f files may hold NUL bytes)
    char *prompt_buf;        // the -f file's bytes, or NULL
    int mode;                // one MODE_*
    const char *mode_flag;   // the option that chose it ("" for generation)
    int no_think, special, parse_special;
    int ppl, kld, max_chunks, use_cpu;
    int n_predict, n_ctx, ctx_given, n_batch, batch_given, vram_given, threads_given, ngl_given;
    int n_given;             // -n was given (a --dump-logits run generates only then)
    float temp, top_p, min_p;
    int top_k;
    long long seed;          // 0 .. 2^32 - 1, as llama.cpp's; 2^32 - 1 (-1): a fresh one
    struct { const char *opt; int modes; } used[64]; // each option given, and where it applies
    int n_used;
} Args;

// --- generate and chat ---------------------------------------------------------------------------
// A prompt (or a chat turn) goes through the model at once; then tokens are sampled, printed and
// fed back one at a time until an end-of-generation token, -n tokens or a full context.
typedef struct {
    Engine e;
    Sampler smp;
    const Tokenizer *tok; // NULL when the file has no vocabulary: tokens are printed as ids
    Stream out;           // the UTF-8 printer (tokenizer.c)
    int special, n_predict, n_ctx, pos;
    int chat;             // an answer cut by -n says so (a generation's end at -n is the plan)
    int n_prompt, n_eval;
    double t_prompt, t_gen, bytes;
} Gen;

// --dump-logits: every prompt position's logits, as raw float32 rows
typedef struct {
    FILE *f;
    const char *path;
    int n_vocab;
} DumpCtx;
static void dump_logits(void *ctx, int i, const float *logits) {
    DumpCtx *d = (DumpCtx *)ctx;
    check_finite(logits, d->n_vocab, i, 0);
    if (fwrite(logits, sizeof(float), d->n_vocab, d->f) != (size_t)d->n_vocab)
        die("writing --dump-logits '%s' failed: %s", d->path, strerror(errno));
}

// Feed ids[0..n) at g->pos; with dump, every position's logits go to it. The logits after the last.
static float *gen_feed(Gen *g, const int *ids, int n, DumpCtx *dump) {
    double t0 = now_sec();
    float *logits = engine_eval(&g->e, ids, n, g->pos, dump ? 0 : n - 1,
                                dump ? dump_logits : NULL, dump);
    g->pos += n;
    g->t_prompt += now_sec() - t0;
    g->n_prompt += n;
    return logits;
}

// One token to stdout: its text (a UTF-8 sequence split across tokens is held back until it is
// whole), or its id when the file has no vocabulary.
static void gen_print(Gen *g, int id) {
    if (!g->tok) {
        printf("%d ", id);
        g_stdout_midline = 1;
        return;
    }
    int len;
    const char *p = tokenizer_piece(g->tok, id, g->special, &len);
    stream_bytes(&g->out, p, len);
    if (len > 0) g_stdout_midline = p[len - 1] != '\n';
}

// A notice on stderr where the answer stops: the bytes of a UTF-8 sequence that the printer still
// holds go out first (as U+FFFD when the sequence is incomplete), so that the notice follows the
// answer's last character instead of cutting into it.
static void gen_notice(Gen *g, const char *text) {
    stream_flush(&g->out);
    check_stdout();
    fputs(text, stderr);
}

// The answer to what was fed: sample from logits, print, feed back.
static void gen_answer(Gen *g, float *logits) {
    const Config *c = &g->e.m->c;
    for (int n_gen = 0; n_gen < g->n_predict;) {
        if (g_answer_sigint == 2) { // Ctrl-C during a chat answer (section 1): it stops here
            gen_notice(g, "\n[stopped: Ctrl-C]");
            break;
        }
        int next = sample(&g->smp, logits);
        if (next < 0) die_not_finite(g->pos - 1, 0);
        n_gen++;
        int eog = g->tok && tokenizer_is_eog(g->tok, next);
        if (!eog || g->special) gen_print(g, next);
        check_stdout(); // each token reaches stdout at once; a failed write ends the run
        if (eog) break;
        if (n_gen == g->n_predict) {
            char s[64];
            snprintf(s, sizeof s, "\n[the answer reached -n %d token%s: raise -n]", n_gen,
                     plural_s(n_gen));
            if (g->chat) gen_notice(g, s);
            break;
        }
        if (g->pos >= g->n_ctx) {
            char s[64];
            snprintf(s, sizeof s, "\n[context full: %d token%s]\n", g->pos, plural_s(g->pos));
            gen_notice(g, s);
            break;
        }
        double t1 = now_sec();
        logits = engine_forward(&g->e, next, g->pos);
        g->t_gen += now_sec() - t1;
        if (g->e.use_gpu) g->bytes += bytes_per_token(c, &g->e.gpu, g->pos + 1);
        g->pos++;
        g->n_eval++;
    }
    stream_flush(&g->out);
    printf("\n");
    g_stdout_midline = 0;
    check_stdout(); // the answer's end before whatever stderr says next
}

// A prompt of n tokens against the context n_ctx: longer is an error, whose remedy is a larger -c
// only while the model's own context n_ctx_train has room for the prompt.
static void check_prompt_fits(int n, int n_ctx, int n_ctx_train) {
    if (n <= n_ctx) return;
    if (n > n_ctx_train)
        die("the prompt has %d tokens, more than the model's context of %d: shorten it", n,
            n_ctx_train);
    die("the prompt has %d tokens but the context is %d: raise -c to %d or more", n, n_ctx, n);
}

// The engine, sampler and printer of a run whose first prompt has n_prompt tokens, which must fit
// the context.
static void gen_init(Gen *g, const Args *a, Model *m, const Tokenizer *tok, int n_prompt) {
    check_prompt_fits(n_prompt, a->n_ctx, m->c.n_ctx_train);
    memset(g, 0, sizeof *g);
    engine_init_run(&g->e, m, !a->use_cpu, a->n_ctx, n_prompt > 0 ? n_prompt : 1);
    sampler_init(&g->smp, m->c.n_vocab, a->temp, a->top_k, a->top_p, a->min_p,
                 (uint64_t)a->seed);
    fprintf(stderr, "sampling: temp %.2f, top-k %d, top-p %.2f, min-p %.2f, seed %lld\n", a->temp,
            a->top_k, a->top_p, a->min_p, a->seed);
    g->tok = tok;
    g->out.f = stdout;
    g->special = a->special;
    g->n_predict = a->n_predict;
    g->n_ctx = a->n_ctx;
}

// The timing lines of every run: prompt and decode speed, the decode's bytes per second, and
// what the card holds.
static void gen_finish(Gen *g) {
    if (g->n_prompt > 0) // a chat whose every turn was refused has none
        fprintf(stderr, "\nprompt eval time = %10.2f ms / %5d tokens (%8.2f ms per token, %8.2f "
                "tokens per second)\n", g->t_prompt * 1e3, g->n_prompt,
                g->t_prompt * 1e3 / g->n_prompt, g->n_prompt / g->t_prompt);
    if (g->n_eval > 0) {
        fprintf(stderr, "       eval time = %10.2f ms / %5d runs   (%8.2f ms per token, %8.2f "
                "tokens per second)\n", g->t_gen * 1e3, g->n_eval, g->t_gen * 1e3 / g->n_eval,
                g->n_eval / g->t_gen);
        if (g->e.use_gpu)
            fprintf(stderr, "decode bandwidth = %.1f GB/s (%.1f MB read per token)\n",
                    g->bytes / g->t_gen / 1e9, g->bytes / g->n_eval / 1e6);
    }
    if (g->e.use_gpu) {
        size_t fr, tot;
        CUDA_CHECK(cudaMemGetInfo(&fr, &tot));
        double peak = (double)g->e.gpu.peak_used;
        fprintf(stderr, "device memory in use on the card (cudaMemGetInfo): %.3f GiB at the peak "
                "(the load's staging, or the captured graph), %.3f GiB now%s\n",
                peak / 1073741824.0, (tot - fr) / 1073741824.0, g_vram_limit <= 0 ? ""
                : peak <= g_vram_limit ? ", within --vram-limit" : ", OVER --vram-limit");
    }
    engine_free(&g->e);
    free(g->smp.cand);
}

// Generation from a prompt: the prompt is echoed, then the answer; --dump-logits writes every
// prompt position's logits first.
static int mode_generate(const Args *a, Model *m, const Tokenizer *tok) {
    int *ids = NULL, n = 0;
    if (a->tokens_arg) n = parse_ids("--tokens", a->tokens_arg, &ids);
    else if (a->prompt) n = tokenizer_encode(tok, a->prompt, a->prompt_len, a->parse_special, &ids);
    if (n == 0) die("empty prompt: give -p TEXT, -f FILE, --tokens IDS or --chat");
    check_tokens(m->c.n_vocab, ids, n, "prompt token");
    Gen g;
    gen_init(&g, a, m, tok, n);
    DumpCtx dump = {a->dump_path ? output_open("--dump-logits", a->dump_path) : NULL, a->dump_path,
                    m->c.n_vocab};
    float *logits = gen_feed(&g, ids, n, a->dump_path ? &dump : NULL);
    if (dump.f) output_close(dump.f, "--dump-logits", a->dump_path);
    for (int i = 0; i < n; i++) gen_print(&g, ids[i]);
    check_stdout();
    gen_answer(&g, logits);
    gen_finish(&g);
    free(ids);
    return 0;
}

// One line from stdin (without its newline), or NULL at end of input. Shows `prompt` first when
// stdin is a terminal. Blank lines are skipped: an empty user turn is not a question. A read that
// fails (stdin a directory, an I/O error) is an error, not the end of the chat.
static char *read_line_stdin(const char *prompt) {
    for (;;) {
        if (prompt) {
            fputs(prompt, stderr);
            fflush(stderr);
        }
        size_t cap = 256, n = 0, k = 0;
        char *s = (char *)xmalloc(cap, "a line of stdin");
        int ch;
        while ((ch = getchar()) != EOF && ch != '\n') {
            if (n + 1 == cap) s = (char *)xrealloc(s, cap *= 2, "a line of stdin");
            s[n++] = (char)ch;
        }
        if (ch == EOF && ferror(stdin)) die("reading standard input failed: %s", strerror(errno));
        s[n] = 0;
        while (k < n && isspace((unsigned char)s[k])) k++;
        if (k < n) return s;
        free(s);
        if (ch == EOF) return NULL;
    }
}

// A chat turn of n tokens that does not fit what is left of the context is not read, and the
// chat goes on: the message says how long the turn is, how much is left, and what can help (a
// shorter turn; a larger -c only where the model's context allows one).
static void chat_refuse_turn(int n, int pos, int n_ctx, int n_ctx_train, int min_turn,
                             int with_system) {
    int left = n_ctx - pos;
    const char *more = n_ctx < n_ctx_train ? "; restart with a larger -c for more" : "";
    fprintf(stderr, "%serror: this turn has %d tokens, and the context has %d of its %d left: it "
            "was not read", g_stdout_midline ? "\n" : "", n, left, n_ctx);
    if (min_turn > n_ctx)
        fprintf(stderr, " (the context cannot hold the shortest turn, %d tokens%s%s)\n",
                min_turn, with_system ? ", the --system prompt's included" : "",
                n_ctx < n_ctx_train ? ": restart with a larger -c" : "");
    else if (min_turn > left)
        fprintf(stderr, " (the context is full: %s ends the chat%s)\n",
                isatty(0) ? "Ctrl-D" : "the end of the input", more);
    else fprintf(stderr, " (a shorter turn fits%s)\n", more);
}

// Chat: the prompt (if any), then each line of stdin, is a user turn of Qwen's ChatML; the KV
// cache is kept across turns. A turn too long for what is left of the context is refused and the
// chat goes on (the exit status is then 1); Ctrl-C during an answer stops that answer.
static int mode_chat(const Args *a, Model *m, const Tokenizer *tok) {
    if (tok->im_start_id < 0 || tok->im_end_id < 0)
        die("'%s' has no ChatML tokens (<|im_start|>, <|im_end|>): it is not a chat model; "
            "give it a prompt without --chat", a->model_path);
    if (a->no_think && m->c.arch == ARCH_QWEN2)
        die("--no-think does not apply to a qwen2 model: Qwen2/2.5 have no thinking phase");
    const char *ask = isatty(0) ? "\n> " : NULL;
    if (ask)
        fprintf(stderr, "chat: one line is one turn; Ctrl-C stops an answer, Ctrl-D ends the chat. "
                "A terminal cuts a line at 4095 bytes: a long first turn goes in -f FILE.\n");
    char *line = a->prompt ? NULL : read_line_stdin(ask);
    if (!a->prompt && !line) return 0;
    Gen g;
    gen_init(&g, a, m, tok, 0);
    g.chat = 1;
    int rc = 0, first = 1; // first: no turn read yet (the next one carries the system turn)
    for (const char *text = a->prompt ? a->prompt : line; text;
         text = line = read_line_stdin(ask)) {
        int *ids, n = chat_turn_ids(tok, a->system_prompt, text, first, a->no_think,
                                    a->parse_special, &ids);
        free(line);
        line = NULL;
        if (g.pos + n > a->n_ctx) {
            int *e, min_turn = chat_turn_ids(tok, a->system_prompt, "x", first, a->no_think, 1, &e);
            free(e);
            chat_refuse_turn(n, g.pos, a->n_ctx, m->c.n_ctx_train, min_turn,
                             first && a->system_prompt);
            rc = 1;
        } else {
            first = 0;
            g_answer_sigint = 1; // from here, Ctrl-C stops the answer (section 1)
            gen_answer(&g, gen_feed(&g, ids, n, NULL));
            g_answer_sigint = 0;
        }
        free(ids);
    }
    gen_finish(&g);
    return rc;
}

// --- --bench: decode and prefill speed against the card's own copy bandwidth ---------------------
// A decode token reads every weight once, so its speed is judged against what the card can move:
// a device-to-device copy of 1 GiB (bytes read + written per second). test/bench.cu (make bench)
// adds the tables behind the choices in this file: per kernel, per mat-vec kind, size sweeps.

// Uniform values in [-1, 1) for the KV cache, so that the timed attention works on real numbers.
// (No C twin: benchmark input, not model math.)
__global__ void fill_random_half_kernel(__half *p /* (n) */, size_t n, uint32_t seed) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
        p[i] = __float2half(((h & 0xffff) / 32768.0f - 1.0f));
    }
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

// Device-to-device copy of 1 GiB: bytes read + written per second, the median of 10 copies.
static double measure_copy_bandwidth(void) {
    size_t n = 1ull << 30;
    void *a, *b;
    CUDA_CHECK(cudaMalloc(&a, n));
    CUDA_CHECK(cudaMalloc(&b, n));
    CUDA_CHECK(cudaMemset(a, 1, n));
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    float ms[10];
    CUDA_CHECK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice)); // warm-up
    for (int i = 0; i < 10; i++) {
        CUDA_CHECK(cudaEventRecord(e0));
        CUDA_CHECK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice));
        CUDA_CHECK(cudaEventRecord(e1));
        CUDA_CHECK(cudaEventSynchronize(e1));
        CUDA_CHECK(cudaEventElapsedTime(&ms[i], e0, e1));
    }
    qsort(ms, 10, sizeof ms[0], cmp_float);
    cudaFree(a);
    cudaFree(b);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return 2.0 * n / (ms[5] * 1e-3);
}

// The GPU line, the copy bandwidth (returned), and the state the benchmark runs on: the model
// uploaded with room for n_ctx keys (2049 at least: run_bench), the KV caches filled with random
// values.
static double bench_setup(Model *m, int n_ctx, GpuState *s) {
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    double copy_bw = measure_copy_bandwidth();
    printf("GPU: %s (sm_%d%d, %d SMs, %.1f GiB)\n", prop.name, prop.major, prop.minor,
           prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0);
    printf("measured copy bandwidth (device-to-device, 1 GiB, read + write): %.0f GB/s\n",
           copy_bw / 1e9);
    gpu_state_init(s, m, n_ctx);
    upload_weights(m, s);
    size_t cache = (size_t)m->c.n_kv_layers * s->n_ctx * m->c.n_head_kv * m->c.head_dim;
    fill_random_half_kernel<<<1024, 256, 0, s->stream>>>(s->key_cache, cache, 1);
    fill_random_half_kernel<<<1024, 256, 0, s->stream>>>(s->value_cache, cache, 2);
    KERNEL_CHECK();
    embed_token(m, 0, s->h_x);
    return copy_bw;
}

// Decode: ms per token at contexts 128 and 2048 (the token's graph replayed 50 times after 5
// warm-ups), and the bytes it moves (bytes_per_token) per second, against the copy bandwidth.
static void bench_decode(const Model *m, GpuState *s, double copy_bw) {
    const int ctxs[2] = {128, 2048}, reps = 50;
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    printf("weights read per token: %.3f GB (%s, %d layers)\n\n", s->weight_bytes / 1e9,
           m->c.arch_name, m->c.n_layer);
    printf("  context  bytes/token   ms/token    tok/s     GB/s   %% of copy bandwidth\n");
    for (int ci = 0; ci < 2; ci++) {
        *s->h_pos = ctxs[ci];
        if (!s->graph) gpu_capture(m, s);
        for (int i = 0; i < 5; i++) CUDA_CHECK(cudaGraphLaunch(s->graph, s->stream));
        CUDA_CHECK(cudaEventRecord(e0, s->stream));
        for (int i = 0; i < reps; i++) CUDA_CHECK(cudaGraphLaunch(s->graph, s->stream));
        CUDA_CHECK(cudaEventRecord(e1, s->stream));
        CUDA_CHECK(cudaEventSynchronize(e1));
        float ms;
        CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        ms /= reps;
        double bytes = bytes_per_token(&m->c, s, ctxs[ci] + 1), bw = bytes / (ms * 1e-3);
        printf("  %7d  %8.3f GB  %9.3f  %7.1f  %7.0f   %5.1f %%\n", ctxs[ci], bytes / 1e9, ms,
               1e3 / ms, bw / 1e9, 100.0 * bw / copy_bw);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
}

// The 512 random prompt ids of pp512 (a fixed seed: every run feeds the same prompt).
static void bench_prompt(const Model *m, int *toks /* (512) */) {
    uint64_t r = 42;
    for (int i = 0; i < 512; i++) toks[i] = (int)(rng_u32(&r) % (uint32_t)m->c.n_vocab);
}

// Prefill, pp512: a 512-token prompt from position 0 and the logits of its last token, best of 3
// after a warm-up. TFLOP/s counts 2 flops per layer weight and prompt token.
static void bench_prefill(const Model *m, GpuState *s) {
    const int P = 512;
    if (s->n_batch < P) {
        if (s->n_batch == 0 && g_n_batch >= P) // prefill_plan or upload_weights turned it off
            printf("\nprefill: no batched pass for this model (its prompts go token by token)\n");
        else
            printf("\nprefill: pp512 needs -b 512 or more (-b %d)\n", g_n_batch);
        return;
    }
    int toks[512];
    bench_prompt(m, toks);
    double layer_weights = 0; // weights every prompt row multiplies (the output matrix: one row)
    for (int l = 0; l < m->c.n_layer; l++) {
        const Tensor *lt[N_LAYER_PRODUCTS];
        layer_products(&m->w.layers[l], lt);
        for (int i = 0; i < N_LAYER_PRODUCTS; i++)
            if (lt[i]->name) layer_weights += (double)lt[i]->n_in * lt[i]->n_out;
    }
    double best = 1e30;
    for (int rep = 0; rep < 4; rep++) { // the first run is a warm-up
        double t0 = now_sec();
        forward_gpu_batch(m, s, toks, P, 0);
        batch_logits_gpu(m, s, P - 1, 1);
        double dt = now_sec() - t0;
        if (rep > 0 && dt < best) best = dt;
    }
    printf("\nprefill (-b %d, best of 3):\n", s->n_batch);
    printf("  pp%d: %.1f ms, %.1f tok/s, %.1f TFLOP/s (2 x %.3g layer weights x %d tokens)\n", P,
           best * 1e3, P / best, 2.0 * layer_weights * P / best / 1e12, layer_weights, P);
}

// --bench, after the VRAM budget that every GPU run passes first, at the context it runs at.
static void run_bench(Model *m, int n_ctx) {
    int bench_ctx = n_ctx < 2049 ? 2049 : n_ctx; // bench_setup's: decode at 2048 needs 2049
    if (!gpu_available()) {
        if (g_vram_limit > 0 && !budget_limit_verdict(m, bench_ctx, 2049, stderr))
            die("--bench: the model does not fit in --vram-limit %.2f GiB at -c %d",
                g_vram_limit / 1073741824.0, bench_ctx);
        die("--bench needs a CUDA GPU (it measures the GPU's speed)");
    }
    budget_or_refuse(m, bench_ctx, 2049);
    GpuState s;
    double copy_bw = bench_setup(m, bench_ctx, &s);
    bench_decode(m, &s, copy_bw);
    bench_prefill(m, &s);
    gpu_state_free(&s);
}

// "15.5G" -> bytes (K, M, G, T: powers of 1024; "GiB" and "GB" spellings accepted as the same).
// The unit is required: a bare "16" is more likely 16 GB than 16 bytes. -1: not a size, or one
// of 2^60 bytes (1048576T) or more, past what a size_t of the budget's sums can safely hold.
static double parse_size(const char *arg) {
    char *end;
    double v = strtod(arg, &end);
    if (end == arg || !isfinite(v) || v <= 0) return -1;
    double mul;
    switch (toupper((unsigned char)*end)) {
    case 'K': mul = 1024.0; break;
    case 'M': mul = 1048576.0; break;
    case 'G': mul = 1073741824.0; break;
    case 'T': mul = 1099511627776.0; break;
    default: return -1;
    }
    end++;
    if (*end == 'i' || *end == 'I') end++;
    if (*end == 'B' || *end == 'b') end++;
    return *end || !(v * mul < 1152921504606846976.0) ? -1 : v * mul;
}

// A numeric option's value, all of it a number (atoi would read "abc" as 0 and "5x" as 5).
static long long arg_i64(const char *opt, const char *v) {
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end) die("%s '%s': expected an integer", opt, v);
    if (errno) die("%s '%s': out of range", opt, v);
    return x;
}
static int arg_int(const char *opt, const char *v) {
    long long x = arg_i64(opt, v);
    if (x < INT_MIN || x > INT_MAX) die("%s '%s': out of range", opt, v);
    return (int)x;
}
static float arg_float(const char *opt, const char *v) {
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end || isnan(x)) die("%s '%s': expected a number", opt, v);
    if (!isfinite((float)x)) die("%s '%s': out of range", opt, v); // inf, or past a float's range
    return (float)x;
}
// --seed S as llama.cpp reads it: its seed is 32 bits, and its parser turns a negative S into
// 2^32 + S; 2^32 - 1 (so -1) asks for a fresh seed each run. -2 is the fixed seed 4294967294, and
// two runs with it draw the same tokens. Values outside [-2^31, 2^32) are refused, not wrapped.
#define LLAMA_RANDOM_SEED 0xFFFFFFFFll
static long long arg_seed(const char *opt, const char *v) {
    long long x = arg_i64(opt, v);
    if (x < INT32_MIN || x > LLAMA_RANDOM_SEED)
        die("%s '%s': out of range (a fixed seed is 0 .. 4294967294; -1 or 4294967295: a "
            "fresh one)", opt, v);
    return x < 0 ? x + LLAMA_RANDOM_SEED + 1 : x;
}

// --- --info --------------------------------------------------------------------------------------

// --info, the file: its metadata and its tensors (any GGUF file, vocabulary-only ones too).
static void print_gguf(const GGUF *g) {
    printf("GGUF v%u, %lld metadata keys, %lld tensors, alignment %u, data at byte %zu\n\n",
           g->version, (long long)g->n_kv, (long long)g->n_tensors, g->alignment, g->data_offset);
    for (int64_t i = 0; i < g->n_kv; i++) {
        const GGUFKV *kv = &g->kv[i];
        printf("  %-44s %-4s ", kv->key, GGUF_TYPE_NAME[kv->type]);
        if (kv->type == GGUF_TYPE_STRING) {
            printf("\"%.*s\"%s\n", (int)(kv->n < 80 ? kv->n : 80), (const char *)kv->data,
                   kv->n > 80 ? "..." : "");
        } else if (kv->type == GGUF_TYPE_ARRAY) {
            printf("[%llu x %s]", (unsigned long long)kv->n, GGUF_TYPE_NAME[kv->arr_type]);
            if (kv->arr_type == GGUF_TYPE_STRING) {
                const uint8_t *p = kv->data;
                for (uint64_t j = 0; j < kv->n && j < 4; j++) {
                    uint64_t len;
                    const char *str = gguf_next_str(&p, &len);
                    printf(" \"%.*s\"", (int)(len < 20 ? len : 20), str);
                }
            } else if (kv->arr_type == GGUF_TYPE_I32 || kv->arr_type == GGUF_TYPE_U32) {
                for (uint64_t j = 0; j < kv->n && j < 8; j++) {
                    int32_t v;
                    memcpy(&v, kv->data + 4 * j, 4);
                    printf(" %d", v);
                }
            }
            printf("%s\n", kv->n > 8 ? " ..." : "");
        } else {
            uint64_t u = 0;
            memcpy(&u, kv->data, GGUF_TYPE_SIZE[kv->type]);
            switch (kv->type) {
            case GGUF_TYPE_F32: { float f; memcpy(&f, kv->data, 4); printf("%g\n", f); break; }
            case GGUF_TYPE_F64: { double d; memcpy(&d, kv->data, 8); printf("%g\n", d); break; }
            case GGUF_TYPE_I8: printf("%d\n", (int8_t)u); break;
            case GGUF_TYPE_I16: printf("%d\n", (int16_t)u); break;
            case GGUF_TYPE_I32: printf("%d\n", (int32_t)u); break;
            case GGUF_TYPE_I64: printf("%lld\n", (long long)u); break;
            case GGUF_TYPE_BOOL: printf("%s\n", u ? "true" : "false"); break;
            default: printf("%llu\n", (unsigned long long)u); break;
            }
        }
    }
    printf("\n  %-40s %-8s %-26s %12s\n", "tensor", "type", "shape", "MiB");
    double total = 0;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        const GGUFTensor *t = &g->tensors[i];
        char shape[64];
        int n = snprintf(shape, sizeof shape, "{%lld", (long long)t->ne[0]);
        for (int d = 1; d < t->n_dims; d++)
            n += snprintf(shape + n, sizeof shape - n, ", %lld", (long long)t->ne[d]);
        snprintf(shape + n, sizeof shape - n, "}");
        printf("  %-40s %-8s %-26s %12.3f\n", t->name, type_name(t->type), shape,
               t->nbytes / 1048576.0);
        total += t->nbytes;
    }
    printf("  %-40s %-8s %-26s %12.3f\n\n", "total", "", "", total / 1048576.0);
}

// --info, the model: its shape and the VRAM budget for -c (measured on the card when there is one).
static void print_model(Model *m, int n_ctx) {
    const Config *c = &m->c;
    printf("%s: %d layers (%d attention, %d Gated DeltaNet), n_embd %d, n_ff %d, %d/%d heads x %d, "
           "RoPE %d dims base %g, vocab %d, trained context %d\n\n", c->arch_name, c->n_layer,
           c->n_kv_layers, c->n_gdn_layers, c->n_embd, c->n_ff, c->n_head,
           c->n_head_kv, c->head_dim, c->n_rot, c->rope_base, c->n_vocab, c->n_ctx_train);
    if (!gpu_available() && g_vram_limit > 0) { // the verdict against the limit alone
        budget_limit_verdict(m, n_ctx, 1, stdout);
        return;
    }
    Budget b;
    memset(&b, 0, sizeof b);
    if (gpu_available()) budget_measure(&b, g_vram_limit);
    budget_compute(&b, m, n_ctx);
    budget_print(&b, m, n_ctx, g_vram_limit, stdout);
    if (b.measured && !budget_fits(&b)) budget_hints(&b, m, n_ctx, 1, stdout);
}

// --- perplexity and KL divergence, in llama.cpp's file format -----------------------------------
// The standard chunked perplexity (llama-perplexity's): the tokens are cut into chunks of n_ctx,
// each chunk is evaluated from an empty cache, and only its second half is scored: positions
// n_ctx/2 .. n_ctx-2 predict the next token. PPL = exp(mean negative log-likelihood).
//
// A "KL-divergence base" file keeps, for every scored position, the log-probabilities of a
// reference run, so another engine or another quantization can be scored against it:
//   "_logits_" | u32 n_ctx | i32 n_vocab | i32 n_chunk | i32 tokens[n_chunk * n_ctx]
//   then per chunk, per scored position, nv = 2*ceil(n_vocab/2) + 4 u16 words:
//     words 0-3: f32 scale, f32 min_log_prob;  words 4..: round((logit - min_logit) / scale)
//   with max = max(logits), min_logit = max(min(logits), max - 16),
//   scale = (max - min_logit) / 65535, min_log_prob = min_logit - max - log(sum exp(logit - max)):
//   log p = min_log_prob + scale * word.
// llama.cpp writes and reads the same layout (--kl-divergence-base), so either can score the other.

static size_t kld_record_words(int n_vocab) { return 2 * (((size_t)n_vocab + 1) / 2) + 4; }

// one position's logits -> a base-file record
static void kld_encode(const float *logits /* (n_vocab) */, int n_vocab,
                       uint16_t *rec /* (kld_record_words) */) {
    float mx = logits[0], mn = logits[0];
    for (int i = 1; i < n_vocab; i++) { mx = fmaxf(mx, logits[i]); mn = fminf(mn, logits[i]); }
    mn = fmaxf(mn, mx - 16.0f);
    double sum = 0.0;
    for (int i = 0; i < n_vocab; i++) sum += exp((double)logits[i] - mx);
    float scale = (mx - mn) / 65535.0f, min_log_prob = mn - mx - (float)log(sum);
    memcpy(rec, &scale, 4);
    memcpy(rec + 2, &min_log_prob, 4);
    // to the nearest step (ties to even, as llama.cpp rounds), every logit at or below mn to 0
    float inv_scale = scale > 0 ? 1.0f / scale : 0.0f;
    for (int i = 0; i < n_vocab; i++) {
        float v = logits[i] > mn ? rintf(inv_scale * (logits[i] - mn)) : 0.0f;
        rec[4 + i] = (uint16_t)(v > 65535.0f ? 65535.0f : v);
    }
    for (size_t i = 4 + (size_t)n_vocab; i < kld_record_words(n_vocab); i++) rec[i] = 0;
}

// log-probabilities of one position: from logits, and from a base record
static void log_softmax(const float *logits, int n_vocab, double *lp) {
    double mx = logits[0], sum = 0.0;
    for (int i = 1; i < n_vocab; i++) mx = fmax(mx, logits[i]);
    for (int i = 0; i < n_vocab; i++) sum += exp(logits[i] - mx);
    double lse = mx + log(sum);
    for (int i = 0; i < n_vocab; i++) lp[i] = logits[i] - lse;
}
static void kld_decode(const uint16_t *rec /* (kld_record_words) */, int n_vocab,
                       double *lp /* (n_vocab) */) {
    float scale, min_log_prob;
    memcpy(&scale, rec, 4);
    memcpy(&min_log_prob, rec + 2, 4);
    for (int i = 0; i < n_vocab; i++) lp[i] = min_log_prob + (double)scale * rec[4 + i];
}

typedef struct {
    uint8_t *data;         // the whole file
    size_t size;
    uint32_t n_ctx;
    int32_t n_vocab, n_chunk;
    const int32_t *tokens;    // (n_chunk, n_ctx)
    const uint16_t *records;  // (n_chunk, n_ctx - 1 - n_ctx/2, nv)
} KldBase;

// Read and check a base file: magic, header, size, a vocabulary that matches the model's.
static int kld_base_read(KldBase *b, const char *path, int n_vocab_model, char *err,
                         size_t errlen) {
    memset(b, 0, sizeof *b);
    struct stat st;
    if (stat(path, &st) != 0) {
        snprintf(err, errlen, "cannot open '%s': %s", path, strerror(errno));
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "'%s' %s, not a KL-divergence base file", path,
                 S_ISDIR(st.st_mode) ? "is a directory" : "is not a regular file");
        return -1;
    }
    FILE *f = fopen(path, "rb");
    if (!f) { snprintf(err, errlen, "cannot open '%s': %s", path, strerror(errno)); return -1; }
    long sz = (long)st.st_size;
    if (sz < 20) {
        fclose(f);
        snprintf(err, errlen, "'%s' is too short for a KL-divergence base file (%ld bytes)", path,
                 sz);
        return -1;
    }
    b->data = (uint8_t *)xmalloc((size_t)sz, "the KL-divergence base file");
    b->size = (size_t)sz;
    size_t got = fread(b->data, 1, b->size, f);
    fclose(f);
    if (got != b->size) { snprintf(err, errlen, "reading '%s' failed", path); return -1; }
    if (memcmp(b->data, "_logits_", 8) != 0) {
        snprintf(err, errlen,
                 "'%s' is not a KL-divergence base file (it does not start with \"_logits_\")",
                 path);
        return -1;
    }
    memcpy(&b->n_ctx, b->data + 8, 4);
    memcpy(&b->n_vocab, b->data + 12, 4);
    memcpy(&b->n_chunk, b->data + 16, 4);
    if (b->n_ctx < 4 || b->n_ctx > (1u << 24) || b->n_vocab <= 0 || b->n_chunk <= 0 ||
        b->n_chunk > (1 << 24)) {
        snprintf(err, errlen, "'%s': implausible header (n_ctx %u, n_vocab %d, n_chunk %d)", path,
                 b->n_ctx, b->n_vocab, b->n_chunk);
        return -1;
    }
    if (b->n_vocab != n_vocab_model) {
        snprintf(err, errlen,
                 "'%s' was made with a vocabulary of %d tokens; this model has %d: not comparable",
                 path, b->n_vocab, n_vocab_model);
        return -1;
    }
    // A chunk's bytes fit in 64 bits (at most 2^26 + 2^23 * 2^25); n_chunk times them may not, and
    // a product that wraps around could match a small file: the size is checked by division.
    size_t first = b->n_ctx / 2, per_chunk = b->n_ctx - 1 - first;
    size_t chunk_bytes = (size_t)b->n_ctx * 4 + per_chunk * kld_record_words(b->n_vocab) * 2;
    if ((b->size - 20) / chunk_bytes != (size_t)b->n_chunk || (b->size - 20) % chunk_bytes) {
        double need = 20 + (double)b->n_chunk * chunk_bytes;
        snprintf(err, errlen,
                 "'%s' is %s: %d chunk%s of %u tokens need %.0f bytes, the file has %zu", path,
                 (double)b->size < need ? "truncated" : "longer than its header says",
                 b->n_chunk, plural_s(b->n_chunk), b->n_ctx, need, b->size);
        return -1;
    }
    b->tokens = (const int32_t *)(b->data + 20);
    b->records = (const uint16_t *)(b->data + 20 + (size_t)b->n_chunk * b->n_ctx * 4);
    for (size_t i = 0; i < (size_t)b->n_chunk * b->n_ctx; i++)
        if (b->tokens[i] < 0 || b->tokens[i] >= b->n_vocab) {
            snprintf(err, errlen, "'%s': token %zu (id %d) is outside the vocabulary", path, i,
                     b->tokens[i]);
            return -1;
        }
    size_t nv = kld_record_words(b->n_vocab), n_rec = (size_t)b->n_chunk * per_chunk;
    for (size_t r = 0; r < n_rec; r++) { // scale >= 0 and min_log_prob <= 0, both finite
        float scale, min_log_prob;
        memcpy(&scale, b->records + r * nv, 4);
        memcpy(&min_log_prob, b->records + r * nv + 2, 4);
        if (!(scale >= 0.0f && isfinite(scale) && min_log_prob <= 0.0f && isfinite(min_log_prob))) {
            snprintf(err, errlen, "'%s': the record of chunk %zu, position %zu has scale %g and "
                     "min_log_prob %g: not a log-probability record", path, r / per_chunk + 1,
                     first + r % per_chunk, scale, min_log_prob);
            return -1;
        }
    }
    return 0;
}

static void kld_base_write_header(FILE *f, uint32_t n_ctx, int32_t n_vocab, int32_t n_chunk,
                                  const int *tokens) {
    if (fwrite("_logits_", 1, 8, f) != 8 || fwrite(&n_ctx, 4, 1, f) != 1 ||
        fwrite(&n_vocab, 4, 1, f) != 1 || fwrite(&n_chunk, 4, 1, f) != 1)
        die("writing the KL-divergence base file failed: %s", strerror(errno));
    for (size_t i = 0; i < (size_t)n_chunk * n_ctx; i++) {
        int32_t t = tokens[i];
        if (fwrite(&t, 4, 1, f) != 1)
            die("writing the KL-divergence base file failed: %s", strerror(errno));
    }
}

// The statistics of a KL-divergence run, as llama-perplexity defines and prints them.
typedef struct {
    double ppl, ppl_unc;             // ours
    double ppl_base, ppl_base_unc;   // the base file's, from its stored log-probabilities
    double cor;                      // correlation of the two per-token NLLs
    double ln_ratio, ln_ratio_unc;   // mean ln(PPL(ours)/PPL(base)), with the covariance
    double ppl_diff, ppl_diff_unc;   // PPL(ours) - PPL(base)
    double kld_mean, kld_unc;
    double kld_pct[11];              // max, 99.9, 99, 95, 90 %, median, 10, 5, 1, 0.1 %, min
    double dp_mean, dp_unc;          // dp = p(next token, ours) - p(next token, base)
    double dp_pct[13];               // max, 99.9 ... 75 %, median, 25 ... 0.1 %, min
    double dp_rms, dp_rms_unc;
    double same_top, same_top_unc;   // how often the two most likely tokens are the same
    int n_scored;
    double tok_per_s;
} PplResult;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// The mean of n values and its standard error, from their sum and sum of squares (no error from
// 10 values or fewer, as llama-perplexity has it).
static void mean_err(double sum, double sum2, int n, double *mean, double *err) {
    *mean = n > 0 ? sum / n : 0.0;
    double var = n > 0 ? sum2 / n - *mean * *mean : 0.0;
    *err = var > 0 && n > 10 ? sqrt(var / (n - 1)) : 0.0;
}

// A percentile of sorted values: linear interpolation at rank q (n - 1); the median of an even
// count is the mean of the middle two (llama-perplexity's definitions).
static double percentile(const double *v, int n, double q) {
    if (q <= 0) return v[0];
    if (q >= 1) return v[n - 1];
    double r = q * (n - 1);
    int i = (int)r;
    return (1 - (r - i)) * v[i] + (r - i) * v[i + 1 < n ? i + 1 : n - 1];
}
static double median(const double *v, int n) {
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2] + v[n / 2 - 1]);
}

// Feed tokens[0..n) from position 0 like engine_eval and return in nll[i - first], for every i >=
// first, -log p(targets[i] | tokens[0..i]). On the GPU with batches only these numbers leave the
// device.
typedef struct {
    const int *targets; // (n)
    double *nll;        // (n - first)
    int first, V;
    double *lp;         // (V) scratch
} NllCtx;
static void nll_row(void *ctx, int i, const float *logits) {
    NllCtx *c = (NllCtx *)ctx;
    log_softmax(logits, c->V, c->lp);
    c->nll[i - c->first] = -c->lp[c->targets[i]];
}
static void nll_rows(Engine *e, void *ctx, int i0, int r, int nr) {
    NllCtx *c = (NllCtx *)ctx;
    float part[LOGIT_ROWS];
    batch_nll_gpu(e->m, &e->gpu, r, nr, c->targets + i0, part);
    for (int k = 0; k < nr; k++) c->nll[i0 + k - c->first] = part[k];
}
static void engine_nll(Engine *e, const int *tokens, const int *targets, int n, int first,
                       double *nll) {
    const Config *c = &e->m->c;
    check_tokens(c->n_vocab, targets, n, "target token");
    NllCtx ctx = {targets, nll, first, c->n_vocab, NULL};
    if (!e->use_gpu || !e->gpu.n_batch || n == 1) {
        ctx.lp = (double *)xmalloc((size_t)c->n_vocab * sizeof(double), "a row of log-probs");
        engine_eval(e, tokens, n, 0, first, nll_row, &ctx);
        free(ctx.lp);
        return;
    }
    check_tokens(c->n_vocab, tokens, n, "token");
    gpu_prompt_batches(e, tokens, n, 0, first, nll_rows, &ctx);
}

// Running sums of a perplexity / KL-divergence pass; ppl_score adds one scored position.
typedef struct {
    int V, c, first, per_chunk;
    const int *tk;                // (n_ctx) the chunk's tokens
    size_t nv;                    // words per base-file record
    uint16_t *rec;                // (nv)
    double *lp, *lpb;             // (V) log-probabilities: ours, the base file's
    double *klds, *dps;           // (n_chunk * per_chunk) every position's KL divergence and dp
    FILE *out_base;
    const KldBase *in_base;
    double nll, nll2, nllb, nllb2, nll_nllb, dp, dp2, dp4, kl, kl2;
    int n, same;
} PplAcc;

// The KL divergence of one position, over the entries the base file resolves. A record keeps
// each log-probability in a 16-bit step of at most 16/65535 nats, and clamps every logit more
// than 16 below the top to its minimum, which decodes to log p <= -16: such an entry carries no
// information, and is left out (as llama-perplexity leaves it out). On the kept entries K both
// distributions are renormalized, and
//   KLD = sum_{i in K} pb~[i] (log pb~[i] - log p~[i]),  pb~ = pb / Zb,  p~ = p / Z,
//   Zb = sum_{i in K} pb[i],  Z = sum_{i in K} p[i];  so  KLD = S / Zb - log Zb + log Z
// with S = sum_{i in K} pb[i] (log pb[i] - log p[i]). It is a true KL divergence, never negative;
// a file scored against its own base gives ~1e-9, the rounding's square. S alone
// (llama-perplexity's sum) also holds the rounding's first power, sum_i pb[i] d[i] with d the
// step rounding, which cancels only on average: +-5e-5 at one position, and as often negative.
#define KLD_MIN_LOG_PROB (-16.0)
static double kld_position(const double *lpb /* (V) */, const double *lp /* (V) */, int V) {
    double sum = 0, zb = 0, z = 0;
    for (int i = 0; i < V; i++) {
        if (lpb[i] <= KLD_MIN_LOG_PROB) continue;
        double pb = exp(lpb[i]);
        sum += pb * (lpb[i] - lp[i]);
        zb += pb;
        z += exp(lp[i]);
    }
    return sum / zb - log(zb) + log(z); // the top entry is always kept (its log p >= -log V)
}

// logits after token j predict token j+1
static void ppl_score(void *ctx, int j, const float *logits) {
    PplAcc *a = (PplAcc *)ctx;
    int V = a->V;
    check_finite(logits, V, j, a->c + 1);
    log_softmax(logits, V, a->lp);
    double l = -a->lp[a->tk[j + 1]];
    a->nll += l;
    a->nll2 += l * l;
    if (a->out_base) {
        kld_encode(logits, V, a->rec);
        if (fwrite(a->rec, 2, a->nv, a->out_base) != a->nv)
            die("writing the KL-divergence base file failed: %s", strerror(errno));
    }
    if (a->in_base) {
        const double *lp = a->lp, *lpb = a->lpb;
        kld_decode(a->in_base->records + ((size_t)a->c * a->per_chunk + (j - a->first)) * a->nv, V,
                   a->lpb);
        double k = kld_position(lpb, lp, V);
        int top = 0, topb = 0; // the first of equal maxima, on each side (every entry counts)
        for (int i = 1; i < V; i++) {
            if (lp[i] > lp[top]) top = i;
            if (lpb[i] > lpb[topb]) topb = i;
        }
        a->klds[a->n] = k;
        a->kl += k;
        a->kl2 += k * k;
        a->same += top == topb;
        double lb = -lpb[a->tk[j + 1]]; // the target's NLL as the base stored it
        a->nllb += lb;
        a->nllb2 += lb * lb;
        a->nll_nllb += l * lb;
        double d = exp(-l) - exp(-lb);
        a->dps[a->n] = d;
        a->dp += d;
        a->dp2 += d * d;
        a->dp4 += d * d * d * d;
    }
    a->n++;
}

// The report's numbers from the running sums (llama-perplexity's definitions).
static void ppl_stats(PplAcc *a, PplResult *r) {
    int n = a->n;
    double m, err, mb, errb;
    mean_err(a->nll, a->nll2, n, &m, &err);
    r->ppl = exp(m);
    r->ppl_unc = r->ppl * err; // the standard error of the mean NLL, carried through exp
    if (!a->in_base) return;
    mean_err(a->nllb, a->nllb2, n, &mb, &errb);
    r->ppl_base = exp(mb);
    r->ppl_base_unc = r->ppl_base * errb;
    // the two NLLs of a token are correlated: the covariance of their means enters the ratio
    double cov = n >= 10 ? (a->nll_nllb / n - m * mb) / (n - 1) : 0.0;
    r->cor = err > 0 && errb > 0 ? cov / (err * errb) : 0.0;
    r->ln_ratio = m - mb;
    r->ln_ratio_unc = sqrt(fmax(err * err + errb * errb - 2 * cov, 0.0));
    r->ppl_diff = r->ppl - r->ppl_base;
    r->ppl_diff_unc = sqrt(fmax(r->ppl_unc * r->ppl_unc + r->ppl_base_unc * r->ppl_base_unc -
                                2 * r->ppl * r->ppl_base * cov, 0.0));
    mean_err(a->kl, a->kl2, n, &r->kld_mean, &r->kld_unc);
    mean_err(a->dp, a->dp2, n, &r->dp_mean, &r->dp_unc);
    double ms, ms_err; // RMS dp: the root of the mean square, whose error comes from sum dp^4
    mean_err(a->dp2, a->dp4, n, &ms, &ms_err);
    r->dp_rms = sqrt(ms);
    r->dp_rms_unc = r->dp_rms > 0 ? 0.5 / r->dp_rms * ms_err : 0.0;
    r->same_top = (double)a->same / n;
    r->same_top_unc = n > 1 ? sqrt(r->same_top * (1 - r->same_top) / (n - 1)) : 0.0;
    qsort(a->klds, n, sizeof(double), cmp_double);
    qsort(a->dps, n, sizeof(double), cmp_double);
    const double kq[11] = {1, 0.999, 0.99, 0.95, 0.90, -1, 0.10, 0.05, 0.01, 0.001, 0};
    const double dq[13] = {1, 0.999, 0.99, 0.95, 0.90, 0.75, -1, 0.25, 0.10, 0.05, 0.01, 0.001, 0};
    for (int i = 0; i < 11; i++)
        r->kld_pct[i] = kq[i] < 0 ? median(a->klds, n) : percentile(a->klds, n, kq[i]);
    for (int i = 0; i < 13; i++)
        r->dp_pct[i] = dq[i] < 0 ? median(a->dps, n) : percentile(a->dps, n, dq[i]);
}

// Evaluate tokens[0 .. n_chunk*n_ctx) chunk by chunk; with out_base also write the records of a
// base file (its header first: kld_base_write_header), with in_base score against it. `e` must have
// room for n_ctx positions.
static PplResult perplexity(Engine *e, const int *tokens, int n_chunk, int n_ctx, FILE *out_base,
                            const KldBase *in_base, int verbose) {
    PplAcc a;
    memset(&a, 0, sizeof a);
    a.V = e->m->c.n_vocab;
    a.first = n_ctx / 2;
    a.per_chunk = n_ctx - 1 - a.first;
    a.nv = kld_record_words(a.V);
    a.rec = (uint16_t *)xmalloc(a.nv * 2, "a base-file record");
    a.lp = (double *)xmalloc((size_t)a.V * sizeof(double), "a row of log-probs");
    a.lpb = (double *)xmalloc((size_t)a.V * sizeof(double), "a row of log-probs");
    size_t n_pos = in_base ? (size_t)n_chunk * a.per_chunk : 0; // kept to sort: percentiles
    a.klds = (double *)xmalloc(n_pos * sizeof(double), "every position's KLD (lower --chunks)");
    a.dps = (double *)xmalloc(n_pos * sizeof(double), "every position's dp (lower --chunks)");
    a.out_base = out_base;
    a.in_base = in_base;
    double *nll_chunk = (double *)xmalloc((size_t)a.per_chunk * sizeof(double), "a chunk's scores");
    double t0 = now_sec();
    for (int c = 0; c < n_chunk; c++) {
        a.c = c;
        a.tk = tokens + (size_t)c * n_ctx;
        if (out_base || in_base) {
            // position 0 starts from an empty state
            engine_eval(e, a.tk, n_ctx - 1, 0, a.first, ppl_score, &a);
        } else { // plain perplexity: only the scored tokens' log-probabilities leave the GPU
            engine_nll(e, a.tk, a.tk + 1, n_ctx - 1, a.first, nll_chunk);
            for (int j = 0; j < a.per_chunk; j++) {
                if (!isfinite(nll_chunk[j])) die_not_finite(a.first + j, c + 1);
                a.nll += nll_chunk[j];
                a.nll2 += nll_chunk[j] * nll_chunk[j];
                a.n++;
            }
        }
        if (verbose) {
            fprintf(stderr, "[%d]%.4f%s", c + 1, exp(a.nll / a.n), c + 1 < n_chunk ? "," : "\n");
            fflush(stderr);
        }
    }
    PplResult r;
    memset(&r, 0, sizeof r);
    r.n_scored = a.n;
    r.tok_per_s = (double)n_chunk * (n_ctx - 1) / (now_sec() - t0);
    ppl_stats(&a, &r);
    free(a.rec); free(a.lp); free(a.lpb); free(a.klds); free(a.dps); free(nll_chunk);
    return r;
}

// An uncertainty as the report prints it: "n/a" where there is none (10 scored tokens or fewer:
// mean_err gives no standard error from so few), else the value in the report's format.
typedef struct { char s[32]; } UncText;
static UncText unc_text(const char *fmt, double v, int n_scored) {
    UncText u;
    if (n_scored <= 10) snprintf(u.s, sizeof u.s, "n/a");
    else snprintf(u.s, sizeof u.s, fmt, v);
    return u;
}

// The report, in llama-perplexity's words and order, so that the two can be read side by side.
static void print_perplexity(const PplResult *r, int kld) {
    int n = r->n_scored;
    printf("Final estimate: PPL = %.4f +/- %s   (%d scored token%s, %.1f tokens/s evaluated)\n",
           r->ppl, unc_text("%.5f", r->ppl_unc, n).s, n, plural_s(n), r->tok_per_s);
    if (!kld) return;
    printf("\n====== Perplexity statistics ======\n");
    printf("Mean PPL(Q)                   : %10.6f +/- %s\n", r->ppl,
           unc_text("%10.6f", r->ppl_unc, n).s);
    printf("Mean PPL(base)                : %10.6f +/- %s\n", r->ppl_base,
           unc_text("%10.6f", r->ppl_base_unc, n).s);
    printf("Cor(ln(PPL(Q)), ln(PPL(base))): %6.2f%%\n", 100 * r->cor);
    printf("Mean ln(PPL(Q)/PPL(base))     : %10.6f +/- %s\n", r->ln_ratio,
           unc_text("%10.6f", r->ln_ratio_unc, n).s);
    printf("Mean PPL(Q)/PPL(base)         : %10.6f +/- %s\n", exp(r->ln_ratio),
           unc_text("%10.6f", exp(r->ln_ratio) * r->ln_ratio_unc, n).s);
    printf("Mean PPL(Q)-PPL(base)         : %10.6f +/- %s\n", r->ppl_diff,
           unc_text("%10.6f", r->ppl_diff_unc, n).s);
    printf("\n====== KL divergence statistics ======\n");
    // %g: a KLD near zero (a file against its own base: ~1e-9) keeps its digits
    printf("Mean    KLD: %10.6g +/- %s\n", r->kld_mean, unc_text("%10.6g", r->kld_unc, n).s);
    const char *kn[11] = {"Maximum", "99.9%  ", "99.0%  ", "95.0%  ", "90.0%  ", "Median ",
                          "10.0%  ", " 5.0%  ", " 1.0%  ", " 0.1%  ", "Minimum"};
    for (int i = 0; i < 11; i++) printf("%s KLD: %10.6g\n", kn[i], r->kld_pct[i]);
    printf("\n====== Token probability statistics ======\n");
    printf("Mean    dp: %6.3f +/- %s %%\n", 100 * r->dp_mean,
           unc_text("%5.3f", 100 * r->dp_unc, n).s);
    const char *dn[13] = {"Maximum", "99.9%  ", "99.0%  ", "95.0%  ", "90.0%  ", "75.0%  ",
                          "Median ", "25.0%  ", "10.0%  ", " 5.0%  ", " 1.0%  ", " 0.1%  ",
                          "Minimum"};
    for (int i = 0; i < 13; i++) printf("%s dp: %6.3f%%\n", dn[i], 100 * r->dp_pct[i]);
    printf("RMS dp    : %6.3f +/- %s %%\n", 100 * r->dp_rms,
           unc_text("%5.3f", 100 * r->dp_rms_unc, n).s);
    printf("Same top p: %6.3f +/- %5.3f %%\n", 100 * r->same_top, 100 * r->same_top_unc);
}

#ifndef TESTING

// --- the command line ----------------------------------------------------------------------------
// The build's commit, which the Makefile passes in (`git describe`); a build without it has none.
#ifndef QWEN_VERSION
#define QWEN_VERSION "unknown (built without the Makefile)"
#endif
// llama.cpp's flag names where it has one; parse_args fills Args (defined after the engine).

// The help text, longer than stdio's buffer: a write that fails mid-way returns < 0 at once, with
// its errno (check_stdout, later, would know only that some write had failed).
static int usage(FILE *f) {
    return fprintf(
        f,
        "usage: qwen -m MODEL.gguf [options]\n"
        "  -m FILE           model file (GGUF: qwen2, qwen3, qwen35)\n"
        "  -p TEXT           prompt text\n"
        "  -f FILE           prompt text read from FILE ('-': standard input)\n"
        "  --tokens 1,2,3    prompt as raw token ids\n"
        "  --chat, -cnv      chat: the prompt (if any), then each line of stdin, becomes a user\n"
        "                    turn of Qwen's ChatML; the KV cache is kept across turns. Ctrl-C\n"
        "                    stops an answer, Ctrl-D ends the chat. A terminal cuts a line at\n"
        "                    4095 bytes: a long first turn goes in -f FILE\n"
        "  --system TEXT     the system turn of the chat\n"
        "  --no-think        Qwen3/3.5 chat without the thinking phase (an empty <think></think>)\n"
        "  --special         print control tokens such as <|im_end|> (--detokenize always does)\n"
        "  --no-parse-special  treat special-token text in the prompt (or a chat turn) as text\n"
        "  --perplexity      chunked perplexity of -f FILE (or -p TEXT, --tokens) with chunks of\n"
        "                    -c tokens (default 512)\n"
        "  --kl-divergence-base FILE  write llama.cpp's KL-divergence base file (implies\n"
        "                    --perplexity)\n"
        "  --kl-divergence   with --kl-divergence-base FILE: score against that file (its tokens)\n"
        "  --chunks N        at most N chunks (0 or below: all)\n"
        "  --tokenize        print the prompt's token ids (comma-separated) and exit (no GPU)\n"
        "  --detokenize IDS  print the text of ids such as 9707,1879 and exit\n"
        "  -n N              tokens to generate (default 256; with --dump-logits 0)\n"
        "  -c N              context length: the KV cache is allocated for N tokens (default\n"
        "                    4096, at most the model's training context)\n"
        "  -b N              prompt tokens per batched pass on the GPU (default 512; 1: one at a\n"
        "                    time; with --dump-logits, --diff-logits and the hidden-state\n"
        "                    options the default is 1)\n"
        "  --temp T          temperature, 0 or below = greedy (default 0.8)\n"
        "  --top-k K         keep the K most likely tokens, 0 or below = off (default 40)\n"
        "  --top-p P         nucleus sampling, 1 = off (default 0.95)\n"
        "  --min-p P         drop tokens below P x the top probability, 0 = off (default 0.05)\n"
        "  --seed S          random seed, 0..4294967294 (default -1, or 4294967295: a fresh\n"
        "                    one, printed); a negative S is 2^32 + S as in llama.cpp,\n"
        "                    so only -1 is random\n"
        "  --dump-logits F   write the logits of every prompt position to F: raw little-endian\n"
        "                    float32, [n_prompt_tokens][n_vocab], no header; nothing is\n"
        "                    generated unless -n is given\n"
        "  --diff-logits F   another engine's logits of the prompt (.npy float32/16/64 of shape\n"
        "                    (n_tokens, n_vocab) or (1, n_tokens, n_vocab), or raw float32)\n"
        "                    against ours, position by position; exit 1 when the largest\n"
        "                    KL(ours || theirs) is over --diff-max-kl (default 1e-3)\n"
        "  --diff-max-kl X   --diff-logits' threshold for the exit status (default 1e-3)\n"
        "  --diff-out F.tsv  --diff-logits' table of every position (--diff-hidden: of every\n"
        "                    tensor)\n"
        "  --dump-hidden DIR write the prompt's tensors inside the model to DIR: NAME.npy\n"
        "                    (float32, (n_tokens, width) or (n_tokens, heads, head_dim)) under\n"
        "                    llama.cpp's graph names (l_out-3, Qcur-0, ...) and manifest.tsv\n"
        "                    (shapes, transformers' equivalents, the path that wrote each)\n"
        "  --diff-hidden DIR another engine's dump of the prompt (NAME.npy with our names)\n"
        "                    against ours, tensor by tensor: relative error, cosine, max |d|;\n"
        "                    names the first tensor and token over --diff-max-rel (exit 1)\n"
        "  --diff-hidden cpu the GPU's decode and batched pass against --cpu on this file\n"
        "  --hidden-filter RE  the tensors, by a regular expression on their names (default:\n"
        "                    the residual stream, inp_embd|l_out-N|result_norm|result_output;\n"
        "                    '.' for every tensor)\n"
        "  --diff-max-rel X  --diff-hidden's threshold (default 1e-4; with cpu, 0.05)\n"
        "  --diff-inject     --diff-hidden: each layer starts from their residual stream, so\n"
        "                    that its row shows its own error\n"
        "  --cpu             run the plain-C reference forward pass instead of the GPU\n"
        "  --bench           decode speed at context 128 and 2048 against the GPU's copy\n"
        "                    bandwidth, and prefill (pp512); its KV cache holds -c tokens, at\n"
        "                    least 2049\n"
        "  --info            print the file's metadata, tensors and the VRAM budget for -c\n"
        "  --vram-limit SIZE behave as if the GPU had SIZE of memory, with its unit (e.g. 15.5G:\n"
        "                    a 16 GB V100)\n"
        "  -ngl N, -t N      accepted for llama.cpp compatibility, and ignored: the model is\n"
        "                    always wholly on the GPU, and --cpu runs on one thread\n"
        "  -h, --help        this text\n"
        "  --version         the build's commit\n"
        "Each option may be given once. An output file is written under a temporary name and\n"
        "renamed into place once complete: a failed run leaves the old file as it was (a\n"
        "--dump-hidden directory: its older manifest and files of the names it writes are\n"
        "deleted first).\n");
}

// The value of option argv[*i]. A value that looks like an option ("-n", "--seed": a '-' and a
// letter, or "--" and more, without a space) means that the option's own value was left out and
// the next option taken in its place: an error naming both. A value with a space in it ("-Be
// brief") is text, never an option.
static const char *option_value(int argc, char **argv, int *i) {
    const char *o = argv[*i];
    if (*i + 1 >= argc) die("option %s needs a value", o);
    const char *v = argv[++*i];
    if (v[0] == '-' && !strchr(v, ' ') && (isalpha((unsigned char)v[1]) || (v[1] == '-' && v[2])))
        die("option %s needs a value, but the next argument '%s' is an option%s", o, v,
            !strcmp(o, "-p") || !strcmp(o, "--prompt")
                ? " (a prompt that starts with '-' can go in a file: -f FILE)" : "");
    return v;
}

// The mode an option chooses; two different modes in one run are an error naming both options.
static void set_mode(Args *a, const char *opt, int mode) {
    if (a->mode && a->mode != mode)
        die("%s and %s are two different modes: give one of them", a->mode_flag, opt);
    a->mode = mode;
    a->mode_flag = opt;
}

// A seed that differs from run to run, also between two runs started in the same second: the
// time in nanoseconds and the process id, mixed. Below 2^32 - 1 (which asks for a fresh seed),
// so that --seed takes the printed value back.
static long long fresh_seed(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    x ^= (uint64_t)getpid() << 40;
    x ^= x >> 31; x *= 0x9E3779B97F4A7C15ull; x ^= x >> 29; // spread the bits (a splitmix step)
    return (long long)(x % LLAMA_RANDOM_SEED);
}

// Every output file against every input file, before any is opened: writing one over the other
// destroys it. Compared by device and inode, so that a symbolic or hard link to the model is caught
// as well as its own name. A path that cannot be a file (a directory, a missing directory) is an
// error here too, before any work; and a KL-divergence base is never written over one that exists:
// the same option also names the file to score against, and one forgotten --kl-divergence would
// replace a reference that may have taken hours to compute.
static void check_output_paths(const Args *a) {
    const char *out_flag[3] = {"--dump-logits", "--kl-divergence-base", "--diff-out"};
    const char *out[3] = {a->dump_path, a->mode == MODE_PERPLEXITY ? a->kld_base_path : NULL,
                          a->diff_out};
    const char *pf = a->prompt_file && strcmp(a->prompt_file, "-") ? a->prompt_file : NULL;
    const char *in[4] = {a->model_path, pf, a->mode == MODE_KLD ? a->kld_base_path : NULL,
                         a->diff_path};
    const char *what[4] = {"model file (-m)", "prompt file (-f)", "KL-divergence base file",
                           "--diff-logits file"};
    struct stat so, si;
    for (int o = 0; o < 3; o++) {
        if (!out[o]) continue;
        char target[PATH_MAX], dir[PATH_MAX];
        output_target(out_flag[o], out[o], target, dir, sizeof dir);
        if (stat(out[o], &so) != 0) continue; // a new file
        for (int k = 0; k < 4; k++)
            if (in[k] && stat(in[k], &si) == 0 && si.st_dev == so.st_dev && si.st_ino == so.st_ino)
                die("%s '%s' is the %s '%s': it would be overwritten; give another file name",
                    out_flag[o], out[o], what[k], in[k]);
        if (o == 1 && S_ISREG(so.st_mode))
            die("--kl-divergence-base '%s' exists: add --kl-divergence to score against it, or "
                "remove it (or give another name) to write a new base", out[o]);
    }
}

// -f FILE's bytes, up to 1 GiB (a FIFO works too; /dev/zero is stopped); "-f -": standard input.
static char *read_prompt_file(const char *path, size_t *len) {
    int from_stdin = !strcmp(path, "-");
    FILE *pf = from_stdin ? stdin : fopen(path, "rb");
    if (!pf) die("cannot open prompt file '%s': %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0, max = (size_t)1 << 30;
    char *buf = (char *)xmalloc(cap, "the -f file");
    for (size_t got; (got = fread(buf + n, 1, cap - n - 1, pf)) > 0;) {
        n += got;
        if (n + 1 < cap) continue;
        if (cap >= max) die("-f '%s' holds 1 GiB or more: too long for a prompt", path);
        buf = (char *)xrealloc(buf, cap *= 2, "the -f file");
    }
    if (ferror(pf)) die("reading '%s' failed: %s", path, strerror(errno));
    if (!from_stdin) fclose(pf);
    buf[n] = 0;
    *len = n;
    return buf;
}

// Every option, with its other spellings (llama.cpp's). Each may be given once: a second -m, -p
// or output path is far more often a mistake (an edited command line, a script's default and the
// user's) than an intent, and taking the last one silently would hide it.
static const char *const OPTIONS[][3] = {
    {"-m", "--model"}, {"-p", "--prompt"}, {"-f", "--file"}, {"--tokens"}, {"--tokenize"},
    {"--detokenize"}, {"--chat", "-cnv", "--conversation"}, {"--system", "-sys"}, {"--no-think"},
    {"--special"}, {"--no-parse-special"}, {"-n", "--n-predict"}, {"-c", "--ctx-size"},
    {"--perplexity"}, {"--kl-divergence"}, {"--kl-divergence-base"}, {"--chunks"},
    {"-b", "--batch-size"}, {"--temp"}, {"--top-k"}, {"--top-p"}, {"--min-p"}, {"--seed", "-s"},
    {"--dump-logits"}, {"--diff-logits"}, {"--diff-out"}, {"--diff-max-kl"}, {"--cpu"}, {"--bench"},
    {"--info"}, {"--vram-limit"}, {"-ngl", "--n-gpu-layers"}, {"-t", "--threads"},
    {"--dump-hidden"}, {"--diff-hidden"}, {"--hidden-filter"}, {"--diff-max-rel"},
    {"--diff-inject"},
};
#define N_OPTIONS (int)(sizeof OPTIONS / sizeof OPTIONS[0])
// Option o given a second time (under any of its spellings) is an error naming it.
static void option_once(const char *given_as[N_OPTIONS], const char *o) {
    for (int k = 0; k < N_OPTIONS; k++)
        for (int s = 0; s < 3 && OPTIONS[k][s]; s++) {
            if (strcmp(o, OPTIONS[k][s])) continue;
            if (!given_as[k]) { given_as[k] = o; return; }
            if (!strcmp(given_as[k], o)) die("%s given twice", o);
            die("%s given twice (as %s and %s)", OPTIONS[k][0], given_as[k], o);
        }
}

static void parse_args(Args *a, int argc, char **argv) {
    memset(a, 0, sizeof *a);
    a->parse_special = 1;
    a->n_predict = 256;
    a->n_ctx = 4096;
    a->n_batch = 512;
    a->temp = 0.8f;
    a->top_p = 0.95f;
    a->min_p = 0.05f;
    a->top_k = 40;
    a->seed = LLAMA_RANDOM_SEED;
    a->diff_max_kl = 1e-3;
    a->diff_max_rel = -1;
    const int RUN =
        MODE_GENERATE | MODE_CHAT | MODE_PERPLEXITY | MODE_KLD | MODE_DIFF | MODE_HIDDEN;
    const int PROMPT = MODE_DIFF | MODE_HIDDEN; // the modes that run a prompt and compare
    const int SAMPLE = MODE_GENERATE | MODE_CHAT;
    const char *given_as[N_OPTIONS] = {NULL}; // each option's spelling, once it was given
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        option_once(given_as, o);
#define IS(s) (!strcmp(o, s))
#define NEXT() option_value(argc, argv, &i)
// the option o applies to these modes (checked once the mode is known)
#define FOR(mask) (a->n_used < 64 ? (void)(a->used[a->n_used].opt = o, \
                                           a->used[a->n_used++].modes = (mask)) \
                                    : die("more than 64 options"))
        if (IS("-m") || IS("--model")) a->model_path = NEXT();
        else if (IS("-p") || IS("--prompt"))
            a->prompt = NEXT(), FOR(SAMPLE | MODE_PERPLEXITY | MODE_TOKENIZE | PROMPT);
        else if (IS("-f") || IS("--file"))
            a->prompt_file = NEXT(), FOR(SAMPLE | MODE_PERPLEXITY | MODE_TOKENIZE | PROMPT);
        else if (IS("--tokens"))
            a->tokens_arg = NEXT(), FOR(MODE_GENERATE | MODE_PERPLEXITY | PROMPT);
        else if (IS("--tokenize")) set_mode(a, o, MODE_TOKENIZE);
        else if (IS("--detokenize")) a->detok_arg = NEXT(), set_mode(a, o, MODE_DETOKENIZE);
        else if (IS("--chat") || IS("-cnv") || IS("--conversation")) set_mode(a, o, MODE_CHAT);
        else if (IS("--system") || IS("-sys")) a->system_prompt = NEXT(), FOR(MODE_CHAT);
        else if (IS("--no-think")) a->no_think = 1, FOR(MODE_CHAT);
        else if (IS("--special")) a->special = 1, FOR(SAMPLE); // --detokenize prints them anyway
        else if (IS("--no-parse-special")) // perplexity reads its text as text anyway
            a->parse_special = 0, FOR(SAMPLE | MODE_TOKENIZE | PROMPT);
        else if (IS("-n") || IS("--n-predict"))
            a->n_predict = arg_int(o, NEXT()), a->n_given = 1, FOR(SAMPLE);
        else if (IS("-c") || IS("--ctx-size"))
            a->n_ctx = arg_int(o, NEXT()), a->ctx_given = 1, // the hidden states: the prompt's
                FOR((RUN & ~MODE_HIDDEN) | MODE_INFO | MODE_BENCH);
        else if (IS("--perplexity")) a->ppl = 1;
        else if (IS("--kl-divergence")) a->kld = 1;
        else if (IS("--kl-divergence-base")) a->kld_base_path = NEXT();
        else if (IS("--chunks"))
            a->max_chunks = arg_int(o, NEXT()), FOR(MODE_PERPLEXITY | MODE_KLD);
        else if (IS("-b") || IS("--batch-size"))
            a->n_batch = arg_int(o, NEXT()), a->batch_given = 1, FOR(RUN);
        else if (IS("--temp")) a->temp = arg_float(o, NEXT()), FOR(SAMPLE);
        else if (IS("--top-k")) a->top_k = arg_int(o, NEXT()), FOR(SAMPLE);
        else if (IS("--top-p")) {
            const char *v = NEXT();
            a->top_p = arg_float(o, v);
            if (a->top_p <= 0.0f || a->top_p > 1.0f) die("--top-p '%s': must be in (0, 1]", v);
            FOR(SAMPLE);
        } else if (IS("--min-p")) { // above 1 it would mean what 1 means: the top token alone
            const char *v = NEXT();
            a->min_p = arg_float(o, v);
            if (a->min_p < 0.0f || a->min_p > 1.0f) die("--min-p '%s': must be in [0, 1]", v);
            FOR(SAMPLE);
        }
        else if (IS("--seed") || IS("-s")) a->seed = arg_seed(o, NEXT()), FOR(SAMPLE);
        else if (IS("--dump-logits")) a->dump_path = NEXT(), FOR(MODE_GENERATE);
        else if (IS("--diff-logits")) a->diff_path = NEXT(), set_mode(a, o, MODE_DIFF);
        else if (IS("--diff-out")) a->diff_out = NEXT(), FOR(PROMPT);
        else if (IS("--dump-hidden")) a->hidden_dump = NEXT(), set_mode(a, o, MODE_HIDDEN);
        else if (IS("--diff-hidden")) a->hidden_diff = NEXT(), set_mode(a, o, MODE_HIDDEN);
        else if (IS("--hidden-filter")) a->hidden_filter = NEXT(), FOR(MODE_HIDDEN);
        else if (IS("--diff-inject")) a->diff_inject = 1, FOR(MODE_HIDDEN);
        else if (IS("--diff-max-rel")) {
            const char *v = NEXT();
            a->diff_max_rel = arg_float(o, v);
            if (!(a->diff_max_rel >= 0)) die("--diff-max-rel '%s': a relative error is >= 0", v);
            FOR(MODE_HIDDEN);
        }
        else if (IS("--diff-max-kl")) {
            const char *v = NEXT();
            a->diff_max_kl = arg_float(o, v);
            if (a->diff_max_kl < 0) die("--diff-max-kl '%s': a KL divergence is >= 0", v);
            FOR(MODE_DIFF);
        }
        else if (IS("--cpu")) a->use_cpu = 1, FOR(RUN);
        else if (IS("--bench")) set_mode(a, o, MODE_BENCH);
        else if (IS("--info")) set_mode(a, o, MODE_INFO);
        else if (IS("--vram-limit")) {
            const char *v = NEXT();
            if ((g_vram_limit = parse_size(v)) <= 0)
                die("--vram-limit '%s': expected a size with its unit, such as 15.5G or 900M "
                    "(below 1048576T)", v);
            a->vram_given = 1;
            FOR(RUN | MODE_INFO | MODE_BENCH);
        } else if (IS("-ngl") || IS("--n-gpu-layers")) (void)NEXT(), a->ngl_given = 1;
        else if (IS("-t") || IS("--threads")) (void)NEXT(), a->threads_given = 1;
        else if (IS("-h") || IS("--help")) {
            if (usage(stdout) < 0) die("writing standard output: %s", strerror(errno));
            check_stdout();
            exit(0);
        } else if (IS("--version")) {
            printf("qwen.cu %s (built with CUDA %d.%d)\n", QWEN_VERSION, __CUDACC_VER_MAJOR__,
                   __CUDACC_VER_MINOR__);
            check_stdout();
            exit(0);
        } else if (o[0] != '-' || !o[1]) {
            die("unexpected argument '%s' (a prompt goes after -p)", o);
        } else {
            die("unknown option '%s' (qwen --help lists the options)", o);
        }
#undef FOR
#undef NEXT
#undef IS
    }
    if (!a->model_path) die("no model given: -m FILE (qwen --help lists the options)");
    // the perplexity modes: scoring (--kl-divergence) or not; --kl-divergence-base alone writes
    if (a->kld) {
        if (!a->kld_base_path) die("--kl-divergence needs --kl-divergence-base FILE");
        set_mode(a, "--kl-divergence", MODE_KLD);
    } else if (a->ppl || a->kld_base_path) {
        set_mode(a, a->ppl ? "--perplexity" : "--kl-divergence-base", MODE_PERPLEXITY);
    }
    if (!a->mode) a->mode = MODE_GENERATE, a->mode_flag = "";
    for (int k = 0; k < a->n_used; k++) {
        if (a->used[k].modes & a->mode) continue;
        char where[200] = "";
        for (int b = 0, n = 0; b < N_MODES; b++)
            if (a->used[k].modes & (1 << b))
                n += snprintf(where + n, sizeof where - n, "%s%s", n ? ", " : "", MODE_NAMES[b]);
        die("%s does not apply to %s (it applies to: %s)", a->used[k].opt, mode_name(a->mode),
            where);
    }
    if (a->use_cpu && a->batch_given)
        die("-b does not apply to --cpu: the CPU path runs a prompt token by token");
    if (a->use_cpu && a->vram_given)
        die("--vram-limit does not apply to --cpu: it stands for a GPU's memory");
    if (a->threads_given)
        fprintf(stderr, "note: -t is accepted for llama.cpp compatibility and ignored: %s\n",
                a->use_cpu ? "the --cpu path runs on one thread"
                           : "the model runs on the GPU");
    if (a->ngl_given)
        fprintf(stderr, "note: -ngl is accepted for llama.cpp compatibility and ignored: %s\n",
                a->use_cpu ? "--cpu runs no layer on the GPU"
                           : "qwen.cu always runs the whole model on the GPU");
    if ((a->prompt != NULL) + (a->prompt_file != NULL) + (a->tokens_arg != NULL) > 1)
        die("give the prompt one way: -p TEXT, -f FILE or --tokens IDS");
    if (a->n_ctx <= 0) die("-c %d: the context length must be positive", a->n_ctx);
    if (a->n_batch <= 0) die("-b %d: the batch size must be positive", a->n_batch);
    if (a->n_predict < 0) die("-n %d: must be >= 0", a->n_predict);
    // as in llama.cpp: --temp <= 0 is greedy, --top-k <= 0 is off, --chunks <= 0 (e.g. -1) is all
    if (a->seed == LLAMA_RANDOM_SEED) a->seed = fresh_seed();
    // a logits dump is a measurement, not a generation: tokens follow it only when -n asks, and
    // without -n an option of the sampler would have nothing to act on (--special also shapes
    // the prompt's echo, so it stays)
    if (a->dump_path && !a->n_given) {
        a->n_predict = 0;
        for (int k = 0; k < a->n_used; k++)
            if (a->used[k].modes == SAMPLE && strcmp(a->used[k].opt, "--special"))
                die("%s does not apply to --dump-logits without -n: nothing is sampled (-n N "
                    "samples N tokens after the dump)", a->used[k].opt);
    }
    // --dump-logits is what other engines are diffed against: by default it takes the most exact
    // path, token by token through the decode graph (the batched prompt's products are fp16)
    if ((a->dump_path || a->diff_path || a->mode == MODE_HIDDEN) && !a->batch_given) a->n_batch = 1;
    if (a->diff_inject && !a->hidden_diff)
        die("--diff-inject feeds each layer their residual stream: it needs --diff-hidden THEIRS");
    if (a->mode == MODE_HIDDEN && !a->hidden_diff && (a->diff_out || a->diff_max_rel >= 0))
        die("%s applies to a comparison: it needs --diff-hidden THEIRS (or cpu)",
            a->diff_out ? "--diff-out" : "--diff-max-rel");
    if (a->hidden_dump && a->diff_inject)
        die("--dump-hidden with --diff-inject would write tensors of their residual stream's "
            "making: dump without it");
    if (a->hidden_dump && a->hidden_diff && !strcmp(a->hidden_diff, "cpu"))
        die("--diff-hidden cpu compares the GPU's paths with --cpu; dump one path alone with "
            "--dump-hidden (and --cpu or -b)");
    g_n_batch = a->n_batch;
    check_output_paths(a);
    if (a->diff_out && a->hidden_diff && strcmp(a->hidden_diff, "cpu")) { // not into their dump
        char target[PATH_MAX], dir[PATH_MAX];
        struct stat sd, st;
        output_target("--diff-out", a->diff_out, target, dir, sizeof dir);
        if (stat(dir, &sd) == 0 && stat(a->hidden_diff, &st) == 0 && sd.st_dev == st.st_dev &&
            sd.st_ino == st.st_ino)
            die("--diff-out '%s' is in the --diff-hidden directory: give another place",
                a->diff_out);
    }
    a->prompt_len = a->prompt ? strlen(a->prompt) : 0;
    if (a->prompt_file)
        a->prompt = a->prompt_buf = read_prompt_file(a->prompt_file, &a->prompt_len);
}

// --- the modes -----------------------------------------------------------------------------------

// --tokenize / --detokenize: the vocabulary alone (vocabulary-only files and no GPU are fine).
static int mode_tokenize(const Args *a, const Tokenizer *tok, double t_load) {
    if (a->detok_arg) {
        int *ids, n = parse_ids("--detokenize", a->detok_arg, &ids);
        check_tokens(tok->n_vocab, ids, n, "--detokenize: token");
        size_t len;
        char *text = tokenizer_decode(tok, ids, n, 1, &len);
        fwrite(text, 1, len, stdout);
        printf("\n");
        free(text);
        free(ids);
        return 0;
    }
    if (!a->prompt) die("--tokenize needs the text: -p TEXT or -f FILE");
    int *ids;
    double t0 = now_sec();
    int n = tokenizer_encode(tok, a->prompt, a->prompt_len, a->parse_special, &ids);
    double dt = now_sec() - t0;
    for (int i = 0; i < n; i++) printf(i ? ",%d" : "%d", ids[i]);
    printf("\n");
    fprintf(stderr, "vocabulary: %d tokens loaded (file parsed, tokenizer built) in %.1f ms; "
            "tokenized %zu byte%s into %d token%s in %.1f ms (%.2f MB/s)\n", tok->n_vocab,
            t_load * 1e3, a->prompt_len, plural_s((long long)a->prompt_len), n, plural_s(n),
            dt * 1e3, a->prompt_len / 1e6 / (dt + 1e-12));
    free(ids);
    return 0;
}

// --perplexity, --kl-divergence-base FILE (write a base file), --kl-divergence (score against one).
static int mode_perplexity(const Args *a, Model *m, const Tokenizer *tok, const char *tok_err) {
    const Config *c = &m->c;
    int n_ctx = a->ctx_given ? a->n_ctx : 512, *ptoks = NULL, n_tok = 0, n_chunk;
    if (n_ctx < 4) die("-c %d: perplexity chunks need at least 4 tokens", n_ctx);
    KldBase base;
    memset(&base, 0, sizeof base);
    if (a->kld) {
        char err[600];
        if (kld_base_read(&base, a->kld_base_path, c->n_vocab, err, sizeof err) != 0)
            die("%s", err);
        if (a->ctx_given && (uint32_t)n_ctx != base.n_ctx)
            die("-c %d differs from the %u tokens per chunk of '%s': leave -c out to use the "
                "file's", n_ctx, base.n_ctx, a->kld_base_path);
        n_ctx = (int)base.n_ctx;
        n_chunk = base.n_chunk;
        ptoks = (int *)xmalloc((size_t)n_chunk * n_ctx * sizeof(int), "the base file's tokens");
        for (size_t i = 0; i < (size_t)n_chunk * n_ctx; i++) ptoks[i] = base.tokens[i];
    } else {
        if (a->tokens_arg) {
            n_tok = parse_ids("--tokens", a->tokens_arg, &ptoks);
        } else if (a->prompt) {
            if (!tok) die("%s: %s (pass the text as ids with --tokens)", a->model_path, tok_err);
            n_tok = tokenizer_encode(tok, a->prompt, a->prompt_len, 0, &ptoks);
        } else {
            die("--perplexity needs text: -f FILE (or -p TEXT, or --tokens IDS)");
        }
        n_chunk = n_tok / n_ctx;
        if (n_chunk == 0)
            die("--perplexity: the text has %d token%s, fewer than one chunk of -c %d", n_tok,
                plural_s(n_tok), n_ctx);
        check_tokens(c->n_vocab, ptoks, n_chunk * n_ctx, "token");
    }
    if (a->max_chunks > 0 && n_chunk > a->max_chunks) n_chunk = a->max_chunks;
    if (n_ctx > c->n_ctx_train && a->kld)
        die("the base file's chunks of %d tokens are longer than the model's context of %d: it "
            "cannot be scored against this model", n_ctx, c->n_ctx_train);
    if (n_ctx > c->n_ctx_train)
        die("-c %d is above the model's training context %d: give -c %d or less", n_ctx,
            c->n_ctx_train, c->n_ctx_train);
    fprintf(stderr, "perplexity: %d chunk%s of %d tokens%s\n", n_chunk, plural_s(n_chunk), n_ctx,
            a->kld ? ", scored against the base file" : "");
    FILE *out = NULL;
    if (a->kld_base_path && !a->kld) {
        out = output_open("--kl-divergence-base", a->kld_base_path);
        kld_base_write_header(out, (uint32_t)n_ctx, c->n_vocab, n_chunk, ptoks);
    }
    Engine e;
    engine_init_run(&e, m, !a->use_cpu, n_ctx, a->kld ? n_ctx : 4); // 4: the shortest chunk
    PplResult r = perplexity(&e, ptoks, n_chunk, n_ctx, out, a->kld ? &base : NULL, 1);
    if (out) output_close(out, "--kl-divergence-base", a->kld_base_path);
    print_perplexity(&r, a->kld);
    engine_free(&e);
    free(ptoks);
    free(base.data);
    return 0;
}

// --- --diff-logits: another engine's logits of the same tokens against ours ---------------------
// An engine's developer dumps their logits of a prompt: numpy .npy, as PyTorch and JAX users save
// them, or raw float32 as --dump-logits writes them. qwen.cu computes its own on the exact path and
// says where the two part: at each position KL(ours || theirs), whether the top tokens agree, the
// largest logit difference and the rank of our top token in theirs; then a summary whose trend
// (the first quarter of the sequence against the last) separates an error that grows with the
// position (a KV cache or RoPE bug) from a flat one (quantization, arithmetic), and an exit status.

// Their logits: the file mapped, one row of n_cols values per prompt position.
typedef struct {
    const char *path;
    void *map;
    size_t map_len;
    const uint8_t *data;   // the first row
    int n_rows, n_cols;
    int elem;              // bytes per value: 2 (float16), 4 (float32), 8 (float64)
    char what[96];         // how the file was read, for the report
} TheirLogits;

// A .npy header: "\x93NUMPY", version (1 byte major, 1 minor), the length of what follows (u16 in
// version 1, u32 in 2 and 3), then a Python dict such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (128, 8193), }
// Returns 0 with elem, the shape (1 to 4 dims) and the data offset, or -1 with err saying what is
// wrong.
static int npy_header(const uint8_t *f, size_t len, int *elem, long long *shape, int *n_dims,
                      size_t *data_off, char *err, size_t errlen) {
    size_t start = f[6] == 1 ? 10 : 12; // magic, version, then the length: u16 (1.0), u32 (2, 3)
    if (len < start) { snprintf(err, errlen, "too short for a .npy header"); return -1; }
    size_t hl = f[6] == 1 ? (size_t)(f[8] | f[9] << 8)
                          : (size_t)f[8] | (size_t)f[9] << 8 | (size_t)f[10] << 16 |
                                (size_t)f[11] << 24;
    if (f[6] < 1 || f[6] > 3 || hl > len - start) {
        snprintf(err, errlen, "a .npy header of version %d.%d and length %zu in %zu bytes", f[6],
                 f[7], hl, len);
        return -1;
    }
    char h[4096];
    size_t n = hl < sizeof h - 1 ? hl : sizeof h - 1;
    memcpy(h, f + start, n);
    h[n] = 0;
    *data_off = start + hl;
    const char *d = strstr(h, "'descr':"), *o = strstr(h, "'fortran_order':");
    const char *sh = strstr(h, "'shape':");
    if (!d || !o || !sh) {
        snprintf(err, errlen, "the .npy header has no descr, fortran_order or shape");
        return -1;
    }
    for (d += 8; *d == ' '; d++) {}
    if (*d == '[') { // a structured dtype: a list of fields, named in the message whole
        const char *q = strchr(d, ']');
        int len = q ? (int)(q - d + 1) : (int)strlen(d);
        snprintf(err, errlen, "dtype %.*s%s: a structured dtype; save a plain array of "
                 "little-endian float16, float32 or float64 ('<f2', '<f4', '<f8')",
                 len < 160 ? len : 160, d, len < 160 ? "" : "...");
        return -1;
    }
    if (*d != '\'') { snprintf(err, errlen, "the .npy header's descr is not a string"); return -1; }
    *elem = !strncmp(d, "'<f2'", 5) ? 2 : !strncmp(d, "'<f4'", 5) ? 4
          : !strncmp(d, "'<f8'", 5) ? 8 : 0;
    if (!*elem) {
        const char *q = strchr(d + 1, '\'');
        snprintf(err, errlen, "dtype %.*s: only little-endian float16, float32 and float64 ('<f2', "
                 "'<f4', '<f8') are read", q && q - d < 40 ? (int)(q - d + 1) : 40, d);
        return -1;
    }
    for (o += 16; *o == ' '; o++) {}
    if (strncmp(o, "False", 5)) {
        snprintf(err, errlen, "Fortran order: save the array in C order");
        return -1;
    }
    const char *p = strchr(sh, '(');
    *n_dims = 0;
    for (p = p ? p + 1 : sh; *p && *p != ')';) {
        while (*p == ' ' || *p == ',') p++;
        if (*p == ')') break;
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p || v <= 0 || v > INT32_MAX || *n_dims == 4) {
            snprintf(err, errlen, "the .npy shape is not 1 to 4 positive sizes");
            return -1;
        }
        shape[(*n_dims)++] = v;
        p = end;
    }
    if (*n_dims == 0) { snprintf(err, errlen, "a .npy of 0 dimensions (a scalar)"); return -1; }
    return 0;
}

// One little-endian value of a .npy array of elem bytes (float16, float32 or float64).
static double npy_value(const uint8_t *v, int elem) {
    if (elem == 2) { uint16_t h; memcpy(&h, v, 2); return fp16_to_f32(h); }
    if (elem == 4) { float g; memcpy(&g, v, 4); return g; }
    double x;
    memcpy(&x, v, 8);
    return x;
}

// n float32 values read with their bytes swapped: 1 when every one is finite and below 1e4 in
// magnitude, as logits are. The swapped value's exponent comes from a mantissa byte of the
// original, which puts it at 1e4 or above (or makes it NaN or infinite) 45 % of the time, so other
// data fails within a few values. A file that holds a NaN or an infinity read little-endian and
// only plausible logits read big-endian is most likely big-endian.
static int swapped_plausible(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++, p += 4) {
        uint8_t b[4] = {p[3], p[2], p[1], p[0]};
        float x;
        memcpy(&x, b, 4);
        if (!(fabsf(x) < 1e4f)) return 0; // a NaN fails too
    }
    return 1;
}

// Open their file and check it against the prompt (n_rows) and the model's vocabulary before any
// work: a .npy by its header, anything else as raw float32 rows. Every value must be finite.
static void their_open(TheirLogits *t, const char *path, int n_rows, int n_vocab,
                       const Tokenizer *tok) {
    memset(t, 0, sizeof *t);
    t->path = path;
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    struct stat st;
    if (fd < 0) die("cannot open --diff-logits '%s': %s", path, strerror(errno));
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0)
        die("--diff-logits '%s' is not a regular, non-empty file", path);
    t->map_len = (size_t)st.st_size;
    t->map = mmap(NULL, t->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (t->map == MAP_FAILED) die("cannot map --diff-logits '%s': %s", path, strerror(errno));
    mapped_add(t->map, t->map_len, path);
    const uint8_t *f = (const uint8_t *)t->map;
    size_t off = 0;
    if (t->map_len >= 6 && !memcmp(f, "\x93NUMPY", 6)) {
        long long shape[4];
        int nd;
        char err[400];
        if (npy_header(f, t->map_len, &t->elem, shape, &nd, &off, err, sizeof err))
            die("--diff-logits '%s': %s", path, err);
        if (nd == 3 && shape[0] == 1) { shape[0] = shape[1]; shape[1] = shape[2]; nd = 2; }
        if (nd != 2)
            die("--diff-logits '%s': a .npy of %d dimension%s: the shape must be (n_tokens, "
                "n_vocab) or (1, n_tokens, n_vocab)", path, nd, plural_s(nd));
        t->n_rows = (int)shape[0];
        t->n_cols = (int)shape[1];
        snprintf(t->what, sizeof t->what, ".npy, float%d, (%d, %d)", 8 * t->elem, t->n_rows,
                 t->n_cols);
    } else { // raw float32, as --dump-logits writes: rows of the model's n_vocab, or of the prompt
        t->elem = 4;
        size_t row = (size_t)4 * n_vocab, rows = t->map_len / row;
        t->n_rows = t->map_len % row == 0 && rows != (size_t)n_rows && rows < (size_t)INT32_MAX
                        ? (int)rows : n_rows;
        if (t->map_len % ((size_t)4 * t->n_rows) != 0)
            die("--diff-logits '%s' (raw float32): %zu bytes are not %d row%s of float32", path,
                t->map_len, t->n_rows, plural_s(t->n_rows));
        size_t cols = t->map_len / 4 / t->n_rows;
        t->n_cols = cols > (size_t)INT32_MAX ? INT32_MAX : (int)cols;
        snprintf(t->what, sizeof t->what, "raw float32, %d x %d", t->n_rows, t->n_cols);
    }
    t->data = f + off;
    // the shape against the prompt and the model first, so that the size below cannot overflow
    if (t->n_rows != n_rows && t->n_cols == n_rows && t->n_rows > t->n_cols)
        die("--diff-logits '%s' has the shape (%d, %d): transposed? The prompt has %d tokens; save "
            "the logits as (n_tokens, n_vocab)", path, t->n_rows, t->n_cols, n_rows);
    if (t->n_rows != n_rows)
        die("--diff-logits '%s' holds %d row%s of logits; the prompt has %d token%s: dump them for "
            "the same tokens", path, t->n_rows, plural_s(t->n_rows), n_rows, plural_s(n_rows));
    // their vocabulary: the model's, or shorter where the model's last ids are padding
    int pad_ok = t->n_cols < n_vocab && tok && t->n_cols > 0;
    for (int i = t->n_cols; pad_ok && i < n_vocab; i++)
        pad_ok = i >= tok->n_vocab || tok->type[i] == TOK_UNUSED;
    if (t->n_cols != n_vocab && !pad_ok)
        die("--diff-logits '%s' has %d logits per position; this model has %d%s", path, t->n_cols,
            n_vocab, t->n_cols < n_vocab ? " (and ids past theirs are not padding)" : "");
    size_t need = (size_t)t->n_rows * t->n_cols * t->elem;
    if (need != t->map_len - off)
        die("--diff-logits '%s': (%d, %d) float%d is %zu bytes, and %zu follow the header", path,
            t->n_rows, t->n_cols, 8 * t->elem, need, t->map_len - off);
    for (int r = 0; r < t->n_rows; r++)
        for (int i = 0; i < t->n_cols; i++) {
            double x = npy_value(t->data + ((size_t)r * t->n_cols + i) * t->elem, t->elem);
            if (!isfinite(x) || fabs(x) > FLT_MAX) // read as float32: float64's range is not
                die("--diff-logits '%s': the logit of id %d at position %d is %s%s", path, i, r,
                    isfinite(x) ? "past float32's range" : "not finite",
                    t->elem == 4 && swapped_plausible(t->data, (size_t)t->n_rows * t->n_cols)
                        ? " (big-endian? read with the bytes swapped, every value is an ordinary "
                          "logit: save it little-endian)" : "");
        }
}

// Row r of their logits as float.
static void their_row(const TheirLogits *t, int r, float *out /* (n_cols) */) {
    const uint8_t *v = t->data + (size_t)r * t->n_cols * t->elem;
    for (int i = 0; i < t->n_cols; i++, v += t->elem) out[i] = (float)npy_value(v, t->elem);
}

// One position's comparison.
typedef struct {
    double kl;        // KL(ours || theirs), over their ids
    int top, top_t;   // the most likely token: ours, theirs
    double max_d;     // max |our logit - their logit|
    int rank;         // the rank of our top token among theirs (1: also their top)
    int pos;          // the position (kept when the positions are sorted by KL)
} DiffPos;

typedef struct {
    const TheirLogits *t;
    DiffPos *pos;      // (n_rows)
    float *theirs;     // (n_cols) scratch
    double *lp, *lq;   // (n_cols) scratch: log-probabilities, ours and theirs
} DiffCtx;

static void diff_row(void *ctx, int i, const float *logits) {
    DiffCtx *d = (DiffCtx *)ctx;
    int C = d->t->n_cols;
    check_finite(logits, C, i, 0);
    their_row(d->t, i, d->theirs);
    log_softmax(logits, C, d->lp); // over their ids: our padding, if any, left out
    log_softmax(d->theirs, C, d->lq);
    DiffPos *p = &d->pos[i];
    p->pos = i;
    p->kl = 0;
    p->max_d = 0;
    p->top = argmax(logits, C);
    p->top_t = argmax(d->theirs, C);
    p->rank = 1;
    for (int k = 0; k < C; k++) {
        p->kl += exp(d->lp[k]) * (d->lp[k] - d->lq[k]);
        p->max_d = fmax(p->max_d, fabs((double)logits[k] - d->theirs[k]));
        p->rank += d->theirs[k] > d->theirs[p->top];
    }
}

// A token as text for a table: its bytes between quotes, control characters escaped.
static const char *token_text(const Tokenizer *tok, int id, char *buf, size_t cap) {
    int len = 0;
    const char *p = tok ? tokenizer_piece(tok, id, 1, &len) : NULL;
    size_t n = 0;
    buf[n++] = '\'';
    for (int i = 0; p && i < len && n + 6 < cap; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == '\n') n += snprintf(buf + n, cap - n, "\\n");
        else if (c == '\t') n += snprintf(buf + n, cap - n, "\\t");
        else if (c < 0x20 || c == 0x7f) n += snprintf(buf + n, cap - n, "\\x%02x", c);
        else buf[n++] = (char)c;
    }
    if (!p) n += snprintf(buf + n, cap - n, "%d", id);
    snprintf(buf + n, cap - n, "'");
    return buf;
}

static int cmp_pos_kl_desc(const void *a, const void *b) {
    double x = ((const DiffPos *)a)->kl, y = ((const DiffPos *)b)->kl;
    return (x < y) - (x > y);
}

// The summary: mean and max, top-1 agreement, the first position over the threshold, the trend
// (each quarter of the sequence's mean KL; a ratio of the last to the first above 3 is growth),
// and the five worst positions with their tokens as text.
static void diff_report(const Args *a, const Tokenizer *tok, const int *ids, int n,
                        const TheirLogits *t, const DiffPos *pos) {
    double sum = 0, quarter[4] = {0, 0, 0, 0};
    int worst = 0, agree = 0, first_over = -1, count[4] = {0, 0, 0, 0};
    for (int i = 0; i < n; i++) {
        sum += pos[i].kl;
        if (pos[i].kl > pos[worst].kl) worst = i;
        agree += pos[i].top == pos[i].top_t;
        if (first_over < 0 && pos[i].kl > a->diff_max_kl) first_over = i;
        quarter[4 * i / n] += pos[i].kl;
        count[4 * i / n]++;
    }
    char b1[64], b2[64], b3[64];
    printf("diff-logits: %d position%s of %d logits; theirs: %s (%s)\n", n, plural_s(n), t->n_cols,
           t->path, t->what);
    printf("KL(ours || theirs): mean %.4g, max %.4g at position %d\n", sum / n, pos[worst].kl,
           worst);
    printf("top-1 agreement: %d of %d (%.1f %%)\n", agree, n, 100.0 * agree / n);
    if (first_over < 0) printf("first position with KL over %g: none\n", a->diff_max_kl);
    else printf("first position with KL over %g: %d (KL %.4g), token %s\n", a->diff_max_kl,
                first_over, pos[first_over].kl, token_text(tok, ids[first_over], b1, sizeof b1));
    if (n >= 4) {
        for (int k = 0; k < 4; k++) quarter[k] /= count[k];
        char ratio[48] = "n/a (the first quarter's KL is 0)";
        if (quarter[0] > 0) snprintf(ratio, sizeof ratio, "%.3g", quarter[3] / quarter[0]);
        printf("KL by quarter of the sequence: %.3g %.3g %.3g %.3g; last / first %s", quarter[0],
               quarter[1], quarter[2], quarter[3], ratio);
        // A diagnosis only for a comparison that failed: within the threshold the trend is noise.
        // A ratio above 3 (or a first quarter of 0 and a last one above it) is growth; a flat
        // error is benign only while it is in the range that arithmetic and quantization give:
        // their mean KL stays below 0.2 in every measurement of the README's correctness table
        // (llama.cpp on quantized qwen35: up to 0.19), so a mean above DIFF_FAR_KL is another
        // model, other weights or other tokens rather than rounding.
        const double DIFF_FAR_KL = 0.5;
        double mean = sum / n, r = quarter[0] > 0 ? quarter[3] / quarter[0] : 0;
        if (pos[worst].kl <= a->diff_max_kl) printf("\n");
        else if (r > 3 || (quarter[0] == 0 && quarter[3] > 0))
            printf(": it grows with the position (the way a KV cache or RoPE bug shows)\n");
        else if (quarter[0] > 0 && r < 1 / 3.0) printf(": it falls with the position\n");
        else if (mean > DIFF_FAR_KL)
            printf(": flat, but far larger than arithmetic or quantization differences (mean KL "
                   "%.3g > %g): another model, other weights or other tokens?\n", mean,
                   DIFF_FAR_KL);
        else printf(": flat (the way quantization or arithmetic differences show)\n");
    }
    DiffPos *sorted = (DiffPos *)xmalloc((size_t)n * sizeof(DiffPos), "the comparison");
    memcpy(sorted, pos, (size_t)n * sizeof(DiffPos));
    qsort(sorted, n, sizeof(DiffPos), cmp_pos_kl_desc);
    printf("worst positions:\n  %6s  %-16s %10s  %-30s %10s %6s\n", "pos", "token", "KL",
           "top: ours / theirs", "max|dlogit|", "rank");
    for (int k = 0; k < n && k < 5; k++) {
        const DiffPos *p = &sorted[k];
        char tops[80];
        snprintf(tops, sizeof tops, "%s%s%s", token_text(tok, p->top, b2, sizeof b2),
                 p->top == p->top_t ? " (same)" : " / ",
                 p->top == p->top_t ? "" : token_text(tok, p->top_t, b3, sizeof b3));
        printf("  %6d  %-16s %10.4g  %-30s %10.4g %6d\n", p->pos,
               token_text(tok, ids[p->pos], b1, sizeof b1), p->kl, tops, p->max_d, p->rank);
    }
    free(sorted);
}

// --diff-logits THEIRS: the report on stdout, the table in --diff-out, exit 0 when the largest KL
// is within --diff-max-kl.
static int mode_diff(const Args *a, Model *m, const Tokenizer *tok) {
    int *ids = NULL, n = 0, V = m->c.n_vocab;
    if (a->tokens_arg) n = parse_ids("--tokens", a->tokens_arg, &ids);
    else if (a->prompt) n = tokenizer_encode(tok, a->prompt, a->prompt_len, a->parse_special, &ids);
    if (n == 0) die("--diff-logits needs the prompt their logits are of: --tokens, -p or -f");
    check_tokens(V, ids, n, "prompt token");
    check_prompt_fits(n, m->c.n_ctx_train, m->c.n_ctx_train); // the engine is sized to the prompt
    TheirLogits t;
    their_open(&t, a->diff_path, n, V, tok);
    // opened before the work, as the other outputs are
    FILE *tsv = a->diff_out ? output_open("--diff-out", a->diff_out) : NULL;
    int C = t.n_cols;
    DiffCtx d = {&t, (DiffPos *)xcalloc(n, sizeof(DiffPos), "the comparison"),
                 (float *)xmalloc((size_t)C * 4, "a row of their logits"),
                 (double *)xmalloc((size_t)C * 8, "a row of log-probs"),
                 (double *)xmalloc((size_t)C * 8, "a row of log-probs")};
    Engine e;
    engine_init_run(&e, m, !a->use_cpu, n, n); // the prompt's length, whatever -c says
    engine_eval(&e, ids, n, 0, 0, diff_row, &d);
    engine_free(&e);
    diff_report(a, tok, ids, n, &t, d.pos);
    if (tsv) { // every position as a table
        char b1[64];
        fprintf(tsv, "pos\ttoken\ttext\tkl\ttop_ours\ttop_theirs\tsame_top\tmax_abs_dlogit\t"
                "rank_of_ours_in_theirs\n");
        for (int i = 0; i < n; i++) {
            const DiffPos *p = &d.pos[i];
            fprintf(tsv, "%d\t%d\t%s\t%.6g\t%d\t%d\t%d\t%.6g\t%d\n", i, ids[i],
                    token_text(tok, ids[i], b1, sizeof b1), p->kl, p->top, p->top_t,
                    p->top == p->top_t, p->max_d, p->rank);
        }
        output_close(tsv, "--diff-out", a->diff_out);
    }
    double max_kl = 0;
    for (int i = 0; i < n; i++) max_kl = fmax(max_kl, d.pos[i].kl);
    int pass = max_kl <= a->diff_max_kl;
    printf("result: %s (max KL %.4g %s --diff-max-kl %g)\n", pass ? "PASS" : "FAIL", max_kl,
           pass ? "<=" : ">", a->diff_max_kl);
    free(d.pos); free(d.theirs); free(d.lp); free(d.lq); free(ids);
    mapped_remove(t.map);
    munmap(t.map, t.map_len);
    return pass ? 0 : 1;
}

// --- --dump-hidden and --diff-hidden: the tensors inside the model, against another engine's ---
// --dump-hidden DIR writes each selected tensor of the prompt as DIR/NAME.npy, float32 of shape
// (n_tokens, width) or (n_tokens, heads, head_dim), and DIR/manifest.tsv: one row per file in the
// model's order, with the tensor's transformers equivalent and the path that wrote it.
// --diff-hidden THEIRS compares ours with their files of the same names and says where the two
// part: the first tensor, in the model's order, whose relative error ||ours - theirs|| / ||theirs||
// is over --diff-max-rel, and its first token. --diff-inject feeds each layer their residual
// stream, so that a layer's row shows its own error, not what the layers before it passed on.
// --diff-hidden cpu compares the GPU's two paths (decode, batched) with the exact C path.

// The default selection: the residual stream (inp_embd, every l_out, the final norm, the logits).
#define HIDDEN_RESIDUAL "^(inp_embd|l_out-[0-9]+|result_norm|result_output)$"

// A tensor's name, "NAME-l" inside a layer, as llama.cpp's graph prints it.
static const char *tap_name(const Config *c, int kind, int l, char *buf, size_t cap) {
    if (kind >= N_LAYER_TAPS) snprintf(buf, cap, "%s", TAP_NAMES[kind]);
    else snprintf(buf, cap, "%s-%d", TAP_NAMES[kind], l);
    (void)c;
    return buf;
}

// Where transformers computes the same tensor (the manifest's column): a module's output or input,
// a hidden_states index, or "none:" and how to compute it from what it has. Value heads of qwen35's
// DeltaNet are in the GGUF's (llama.cpp's) tiled order, not transformers' grouped one.
static const char *tap_hf(const Config *c, int kind, int l, char *buf, size_t cap) {
    char p[48];
    snprintf(p, sizeof p, "model.layers.%d", l);
    const char *tiled = " (value heads in the GGUF's order)";
    int qwen35 = c->arch == ARCH_QWEN35;
    switch (kind) {
    case TAP_INP_EMBD: snprintf(buf, cap, "model.embed_tokens output (hidden_states[0])"); break;
    case TAP_ATTN_NORM: snprintf(buf, cap, "%s.input_layernorm output", p); break;
    case TAP_QCUR: snprintf(buf, cap, "none: %s.self_attn.%s output after RoPE", p,
                            c->arch == ARCH_QWEN2 ? "q_proj" : "q_norm"); break;
    case TAP_KCUR: snprintf(buf, cap, "none: %s.self_attn.%s output after RoPE", p,
                            c->arch == ARCH_QWEN2 ? "k_proj" : "k_norm"); break;
    case TAP_VCUR: snprintf(buf, cap, "%s.self_attn.v_proj output", p); break;
    case TAP_KQV_OUT:
        if (qwen35) snprintf(buf, cap, "none: %s.self_attn.o_proj input before the gate", p);
        else snprintf(buf, cap, "%s.self_attn.o_proj input", p);
        break;
    case TAP_ATTN_GATED: snprintf(buf, cap, "%s.self_attn.o_proj input", p); break;
    case TAP_ATTN_OUT: snprintf(buf, cap, "%s.self_attn.o_proj output", p); break;
    case TAP_QKV_MIXED: snprintf(buf, cap, "%s.linear_attn.in_proj_qkv output%s", p, tiled); break;
    case TAP_Z: snprintf(buf, cap, "%s.linear_attn.in_proj_z output%s", p, tiled); break;
    case TAP_BETA: snprintf(buf, cap, "none: sigmoid(%s.linear_attn.in_proj_b output)%s", p, tiled);
        break;
    case TAP_GATE: snprintf(buf, cap, "none: softplus(%s.linear_attn.in_proj_a output + dt_bias) * "
                            "-exp(A_log)%s", p, tiled); break;
    case TAP_CONV: snprintf(buf, cap, "none: silu(%s.linear_attn.conv1d output[..., :T])%s", p,
                            tiled); break;
    case TAP_Q_CONV: snprintf(buf, cap, "none: l2norm of %s.linear_attn's conv output's q (Hk "
                              "heads, before any repeat to Hv)", p); break;
    case TAP_K_CONV: snprintf(buf, cap, "none: l2norm of %s.linear_attn's conv output's k (Hk "
                              "heads, before any repeat to Hv)", p); break;
    case TAP_V_CONV: snprintf(buf, cap, "none: %s.linear_attn's conv output's v%s", p, tiled);
        break;
    case TAP_DELTA_OUT: snprintf(buf, cap, "%s.linear_attn.norm input%s", p, tiled); break;
    case TAP_FINAL_OUT: snprintf(buf, cap, "%s.linear_attn.norm output%s", p, tiled); break;
    case TAP_LINEAR_OUT: snprintf(buf, cap, "%s.linear_attn.out_proj output", p); break;
    case TAP_FFN_INP: snprintf(buf, cap, "%s.post_attention_layernorm input", p); break;
    case TAP_FFN_NORM: snprintf(buf, cap, "%s.post_attention_layernorm output", p); break;
    case TAP_FFN_OUT: snprintf(buf, cap, "%s.mlp output", p); break;
    case TAP_L_OUT: // transformers' last hidden state is after the final norm, not this
        if (l < c->n_layer - 1) snprintf(buf, cap, "%s output (hidden_states[%d])", p, l + 1);
        else snprintf(buf, cap, "%s output (not hidden_states[%d]: that is after model.norm)", p,
                      l + 1);
        break;
    case TAP_RESULT_NORM: snprintf(buf, cap, "model.norm output (hidden_states[%d])", c->n_layer);
        break;
    default: snprintf(buf, cap, "lm_head output (the logits)"); break;
    }
    return buf;
}

// Every tensor of the model in its order: slot by slot, (kind, layer) pairs the model has. Returns
// the count; kinds/layers get them.
static int tap_list(const Config *c, int *kinds, int *layers) {
    int n = 0, dims[2];
    kinds[n] = TAP_INP_EMBD, layers[n++] = 0;
    for (int l = 0; l < c->n_layer; l++)
        for (int k = 0; k < N_LAYER_TAPS; k++)
            if (tap_shape(c, k, l, dims)) kinds[n] = k, layers[n++] = l;
    kinds[n] = TAP_RESULT_NORM, layers[n++] = 0;
    kinds[n] = TAP_RESULT_OUTPUT, layers[n++] = 0;
    return n;
}
#define MAX_TAPS ((MAX_LAYERS + 1) * N_TAPS)

// A regular expression for --hidden-filter that regcomp can take quickly: names are short, so a
// counted repeat above 64, or more than 4 of them, is refused (glibc's regcomp expands each one,
// and nested large counts exhaust its stack or take minutes).
static void filter_check(const char *filter) {
    int n_counts = 0;
    for (const char *p = filter; *p; p++) {
        if (*p == '\\' && p[1]) { p++; continue; }
        if (*p != '{') continue;
        n_counts++;
        for (const char *q = p + 1; *q && *q != '}'; q++)
            if (isdigit((unsigned char)*q) && strtol(q, NULL, 10) > 64)
                die("--hidden-filter '%s': a count above 64 in {}; tensor names are short", filter);
    }
    if (n_counts > 4) die("--hidden-filter '%s': more than 4 counted repeats {}", filter);
    if (strlen(filter) > 400) die("--hidden-filter: a regular expression of %zu bytes",
                                  strlen(filter));
}

// A tap keeping every tensor whose name the regular expression (POSIX extended, as grep -E)
// matches somewhere: "l_out" selects every l_out-N, "^l_out-1$" only layer 1's. The user's part
// of it has passed filter_check.
static void tap_init(Tap *tp, const Config *c, int n_tok, const char *filter) {
    regex_t re;
    char name[64], err[200];
    int rc = regcomp(&re, filter, REG_EXTENDED | REG_NOSUB);
    if (rc) {
        regerror(rc, &re, err, sizeof err);
        die("--hidden-filter '%s': %s", filter, err);
    }
    memset(tp, 0, sizeof *tp);
    tp->c = c;
    tp->n_tok = n_tok;
    size_t n_slots = (size_t)(c->n_layer + 1) * N_TAPS;
    tp->data = (float **)xcalloc(n_slots, sizeof(float *), "the tapped tensors");
    tp->by = (const char **)xcalloc(n_slots, sizeof(char *), "the tapped tensors");
    int kinds[MAX_TAPS], layers[MAX_TAPS], n = tap_list(c, kinds, layers), kept = 0;
    for (int i = 0; i < n; i++) {
        if (regexec(&re, tap_name(c, kinds[i], layers[i], name, sizeof name), 0, NULL, 0)) continue;
        tp->data[tap_slot(c, kinds[i], layers[i])] = (float *)xcalloc(
            (size_t)n_tok * tap_width(c, kinds[i], layers[i]), 4, "the tapped tensors");
        kept++;
    }
    regfree(&re);
    if (!kept) die("--hidden-filter '%s' matches no tensor of this model (names such as l_out-0, "
                   "Qcur-0, ffn_out-0, result_norm)", filter);
}

static void tap_free(Tap *tp) {
    for (size_t i = 0; i < (size_t)(tp->c->n_layer + 1) * N_TAPS; i++) free(tp->data[i]);
    free(tp->data);
    free(tp->by);
    free(tp->inject);
}

// The logits of each prompt token, from engine_eval (every path hands them out the same way). Not
// checked for NaN here: the comparison says where a NaN first appears.
static void tap_logits(void *ctx, int i, const float *logits) {
    tap_put((Tap *)ctx, TAP_RESULT_OUTPUT, 0, i, 1, logits, NULL);
}

// The prompt through the model on one path with the tap attached: the CPU (use_gpu 0), the GPU's
// decode (n_batch 1) or its batched pass. Returns the path that ran (a batched pass needs more
// than one token and a model whose shapes allow it).
static const char *tap_run(Tap *tp, Model *m, const int *ids, int n, int use_gpu, int n_batch) {
    Engine e;
    g_n_batch = n_batch;
    engine_init_run(&e, m, use_gpu, n, n);
    if (use_gpu) e.gpu.tap = tp;
    else e.cpu.tap = tp;
    engine_eval(&e, ids, n, 0, 0, tap_logits, tp);
    const char *path = !use_gpu ? "cpu" : e.gpu.n_batch && n > 1 ? BY_BATCH : BY_DECODE;
    size_t slot = tap_slot(&m->c, TAP_RESULT_OUTPUT, 0);
    if (tp->data[slot]) tp->by[slot] = path; // the logits: written by the path that ran
    engine_free(&e);
    return path;
}

// The file of tap (kind, l) in a dump's directory: its name into name (64 bytes) and
// DIR/NAME.npy into path (PATH_MAX bytes).
static void tap_file(const char *dir, const Config *c, int kind, int l, char *name, char *path) {
    snprintf(path, PATH_MAX, "%s/%s.npy", dir, tap_name(c, kind, l, name, 64));
}

// One tensor of a tap as DIR/NAME.npy: float32, C order, shape (n_tok, dims...).
static void npy_write(const char *dir, const Tap *tp, int kind, int l) {
    char name[64], path[PATH_MAX], shape[64], hdr[160];
    int dims[2], nd = tap_shape(tp->c, kind, l, dims);
    tap_file(dir, tp->c, kind, l, name, path);
    if (nd == 1) snprintf(shape, sizeof shape, "(%d, %d)", tp->n_tok, dims[0]);
    else snprintf(shape, sizeof shape, "(%d, %d, %d)", tp->n_tok, dims[0], dims[1]);
    // the header: magic, version 1.0, its length (u16), then the dict padded with spaces and a
    // newline so that the data starts at a multiple of 64 bytes
    int len = snprintf(hdr, sizeof hdr, "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }",
                       shape);
    int total = (10 + len + 1 + 63) / 64 * 64;
    while (10 + len + 1 < total) hdr[len++] = ' ';
    hdr[len++] = '\n';
    uint8_t pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (uint8_t)(len & 255),
                       (uint8_t)(len >> 8)};
    FILE *f = output_open("--dump-hidden", path);
    fwrite(pre, 1, 10, f);
    fwrite(hdr, 1, len, f);
    fwrite(tp->data[tap_slot(tp->c, kind, l)], 4, (size_t)tp->n_tok * tap_width(tp->c, kind, l), f);
    output_close(f, "--dump-hidden", path);
}

// A file the dump will write at path: none yet, or a regular file that is not the model (whose
// stat is *model, or NULL when the model could not be looked at).
static void dump_check_old(const char *path, const struct stat *model) {
    struct stat st;
    if (stat(path, &st) != 0) return;
    if (!S_ISREG(st.st_mode)) die("--dump-hidden: '%s' exists and is not a file", path);
    if (model && st.st_dev == model->st_dev && st.st_ino == model->st_ino)
        die("--dump-hidden: '%s' is the model file (-m): it would be overwritten", path);
}

// --dump-hidden DIR, before any work: DIR made (one level) or an existing directory, not the
// directory of their dump nor that of the --diff-out table (diff_out: NULL without one), and no
// file the run will write one of the run's inputs (a link to the model, say).
static void dump_prepare(const char *dir, const Tap *tp, const char *model, const char *theirs,
                         const char *diff_out) {
    struct stat st, sm, si;
    if (stat(dir, &st) != 0 && mkdir(dir, 0777) != 0)
        die("--dump-hidden '%s': cannot create the directory: %s", dir, strerror(errno));
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        die("--dump-hidden '%s' exists and is not a directory", dir);
    if (strlen(dir) + 80 > PATH_MAX) die("--dump-hidden '%s': the path is too long", dir);
    if (theirs && stat(theirs, &si) == 0 && si.st_dev == st.st_dev && si.st_ino == st.st_ino)
        die("--dump-hidden '%s' is the --diff-hidden directory: their files would be overwritten",
            dir);
    char target[PATH_MAX], od[PATH_MAX]; // the table's directory, links resolved, as it is written
    if (diff_out && output_target("--diff-out", diff_out, target, od, sizeof od)) {
        if (stat(od, &si) == 0 && si.st_dev == st.st_dev && si.st_ino == st.st_ino)
            die("--diff-out '%s' is in the --dump-hidden directory '%s': give it a place outside "
                "the dump", diff_out, dir);
    }
    const struct stat *msp = stat(model, &sm) == 0 ? &sm : NULL;
    int kinds[MAX_TAPS], layers[MAX_TAPS], n = tap_list(tp->c, kinds, layers);
    char path[PATH_MAX], name[64];
    for (int i = 0; i < n; i++)
        if (tp->data[tap_slot(tp->c, kinds[i], layers[i])]) {
            tap_file(dir, tp->c, kinds[i], layers[i], name, path);
            dump_check_old(path, msp);
        }
    snprintf(path, sizeof path, "%s/manifest.tsv", dir);
    dump_check_old(path, msp);
}

// An older dump's file at path deleted (none there is fine).
static void dump_remove_old(const char *path) {
    if (unlink(path) != 0 && errno != ENOENT)
        die("--dump-hidden: cannot delete the old '%s': %s", path, strerror(errno));
}

// --dump-hidden DIR: every tensor the run wrote, then the manifest (written last: a reader that
// finds it finds every file it lists). An older dump's manifest and its files of the names this
// run writes are deleted first, so that a dump that fails on the way leaves no manifest and no
// mix of two runs' files under those names.
static void dump_hidden(const char *dir, const Tap *tp) {
    char mpath[PATH_MAX], name[64], hf[200], path[PATH_MAX];
    snprintf(mpath, sizeof mpath, "%s/manifest.tsv", dir);
    int kinds[MAX_TAPS], layers[MAX_TAPS], n = tap_list(tp->c, kinds, layers), files = 0;
    dump_remove_old(mpath);
    for (int i = 0; i < n; i++)
        if (tp->by[tap_slot(tp->c, kinds[i], layers[i])]) {
            tap_file(dir, tp->c, kinds[i], layers[i], name, path);
            dump_remove_old(path);
        }
    for (int i = 0; i < n; i++)
        if (tp->by[tap_slot(tp->c, kinds[i], layers[i])]) npy_write(dir, tp, kinds[i], layers[i]);
    FILE *f = output_open("--dump-hidden", mpath);
    fprintf(f, "file\tlayer\tname\tshape\ttransformers\twritten_by\n");
    for (int i = 0; i < n; i++) {
        int k = kinds[i], l = layers[i], dims[2], nd = tap_shape(tp->c, k, l, dims);
        const char *by = tp->by[tap_slot(tp->c, k, l)];
        if (!by) continue;
        tap_name(tp->c, k, l, name, sizeof name);
        fprintf(f, "%s.npy\t%d\t%s\t%d,%d", name, k < N_LAYER_TAPS ? l : -1, name, tp->n_tok,
                dims[0]);
        if (nd == 2) fprintf(f, ",%d", dims[1]);
        fprintf(f, "\t%s\t%s%s\n", tap_hf(tp->c, k, l, hf, sizeof hf), by,
                k == TAP_RESULT_NORM && strcmp(by, "cpu") ? " (C rmsnorm of its l_out rows)" : "");
        files++;
    }
    output_close(f, "--dump-hidden", mpath);
    fprintf(stderr, "dump-hidden: %d tensor%s of %d token%s in %s/ (manifest.tsv lists them)\n",
            files, plural_s(files), tp->n_tok, plural_s(tp->n_tok), dir);
}

// The tensor named `name` ("l_out-3", "result_norm"): its kind and layer, or -1.
static int tap_parse(const char *name, int *layer) {
    for (int k = 0; k < N_TAPS; k++) {
        size_t n = strlen(TAP_NAMES[k]);
        if (strncmp(name, TAP_NAMES[k], n)) continue;
        if (k >= N_LAYER_TAPS && !name[n]) { *layer = 0; return k; }
        char *end;
        if (k < N_LAYER_TAPS && name[n] == '-' && isdigit((unsigned char)name[n + 1])) {
            long l = strtol(name + n + 1, &end, 10);
            if (!*end && l < INT32_MAX) { *layer = (int)l; return k; }
        }
    }
    return -1;
}

// A file of their dump, opened for reading: a regular file (a FIFO would block, a directory cannot
// be read), or NULL when there is none.
static FILE *their_file(const char *path, size_t *len) {
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) return NULL;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        die("--diff-hidden: '%s' is not a regular file", path);
    *len = (size_t)st.st_size;
    FILE *f = fdopen(fd, "rb");
    if (!f) die("--diff-hidden: cannot read '%s': %s", path, strerror(errno));
    return f;
}

// Their manifest.tsv, when they wrote one: every row that names one of our tensors must fit this
// model (its layer exists and has the tensor, of our width), and only the files it lists are read
// (listed[slot] = 1; a file it does not list is left from another run). Returns 0 without one.
static int their_manifest(const char *dir, const Config *c, uint8_t *listed) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/manifest.tsv", dir);
    size_t flen;
    FILE *f = their_file(path, &flen);
    if (!f) return 0;
    char *line = NULL;
    size_t cap = 0;
    for (int ln = 1; getline(&line, &cap, f) > 0; ln++) {
        char *col[4] = {line, NULL, NULL, NULL};
        for (int k = 1; k < 4 && col[k - 1]; k++) {
            char *tab = strchr(col[k - 1], '\t');
            if (tab) *tab = 0, col[k] = tab + 1;
        }
        if (ln == 1 || !col[3]) continue; // the header; a row without a shape
        char *nl = strpbrk(col[3], "\t\r\n");
        if (nl) *nl = 0;
        int l, kind = tap_parse(col[2], &l), dims[2];
        if (kind < 0) continue;
        if (kind < N_LAYER_TAPS && l >= c->n_layer)
            die("--diff-hidden '%s': manifest.tsv line %d names %s, but this model has %d layers",
                dir, ln, col[2], c->n_layer);
        if (!tap_shape(c, kind, l, dims))
            die("--diff-hidden '%s': manifest.tsv line %d names %s, which %s", dir, ln, col[2],
                kind == TAP_ATTN_GATED ? "only qwen35's gated attention has"
                : c->kind[l] == LAYER_DELTANET ? "this model's layer, a Gated DeltaNet, has not"
                                               : "this model's layer, an attention, has not");
        // the shape: positive sizes separated by commas, the tokens first
        long long w = 1;
        char *p = col[3], *end;
        for (int d = 0;; d++) {
            errno = 0;
            long long v = strtoll(p, &end, 10);
            if (end == p || v <= 0 || errno || v > INT32_MAX || (*end && *end != ','))
                die("--diff-hidden '%s': manifest.tsv line %d: the shape '%s' of %s is not sizes "
                    "such as 64,256", dir, ln, col[3], col[2]);
            if (d > 0 && (w *= v) > INT32_MAX) w = INT32_MAX;
            if (!*end) break;
            p = end + 1;
        }
        if (w != (long long)tap_width(c, kind, l))
            die("--diff-hidden '%s': manifest.tsv line %d: %s has %lld values per token; this "
                "model's has %zu", dir, ln, col[2], w, tap_width(c, kind, l));
        listed[tap_slot(c, kind, l)] = 1;
    }
    free(line);
    fclose(f);
    return 1;
}

// Their tensors: DIR/NAME.npy for each tensor `ours` keeps, read into `theirs` (a tap of the same
// selection; a file they lack, or that their manifest does not list, leaves the slot empty and is
// listed in `missing`). float16, 32 or 64, of shape (n_tok, our dims) or (n_tok, width), with a
// leading 1 or not; any other shape, fewer or more tokens, a value that is not finite: one line
// naming the file, and exit 1. *half: some file is float16.
static int their_hidden(Tap *theirs, const Tap *ours, const char *dir, char *missing, size_t cap,
                        int *half) {
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        die("--diff-hidden '%s': no such directory", dir);
    const Config *c = ours->c;
    size_t n_slots = (size_t)(c->n_layer + 1) * N_TAPS;
    uint8_t *listed = (uint8_t *)xcalloc(n_slots, 1, "their manifest");
    int manifest = their_manifest(dir, c, listed);
    memset(theirs, 0, sizeof *theirs);
    theirs->c = c;
    theirs->n_tok = ours->n_tok;
    theirs->data = (float **)xcalloc(n_slots, sizeof(float *), "their tensors");
    theirs->by = (const char **)xcalloc(n_slots, sizeof(char *), "their tensors");
    int kinds[MAX_TAPS], layers[MAX_TAPS], n = tap_list(c, kinds, layers), found = 0, n_miss = 0;
    size_t mlen = 0;
    missing[0] = 0;
    *half = 0;
    for (int i = 0; i < n; i++) {
        int k = kinds[i], l = layers[i], dims[2], nd = tap_shape(c, k, l, dims);
        size_t slot = tap_slot(c, k, l), w = tap_width(c, k, l), T = (size_t)ours->n_tok, len = 0;
        if (!ours->data[slot]) continue;
        char name[64], path[PATH_MAX], err[400];
        tap_file(dir, c, k, l, name, path);
        FILE *f = manifest && !listed[slot] ? NULL : their_file(path, &len);
        if (!f) {
            if (mlen + 64 < cap)
                mlen += snprintf(missing + mlen, cap - mlen, "%s%s", n_miss ? ", " : "", name);
            else if (mlen + 5 < cap && !strstr(missing, ", ..."))
                mlen += snprintf(missing + mlen, cap - mlen, ", ...");
            n_miss++;
            continue;
        }
        uint8_t *buf = (uint8_t *)xmalloc(len + 1, "their tensor");
        if (fread(buf, 1, len, f) != len) die("--diff-hidden: cannot read '%s'", path);
        fclose(f);
        long long shape[4];
        int snd, elem;
        size_t off;
        if (len < 10 || memcmp(buf, "\x93NUMPY", 6))
            die("--diff-hidden: '%s' is not a .npy file", path);
        if (npy_header(buf, len, &elem, shape, &snd, &off, err, sizeof err))
            die("--diff-hidden: '%s': %s", path, err);
        if (snd >= 3 && shape[0] == 1) { // a batch of one, as transformers returns it
            for (int d = 1; d < snd; d++) shape[d - 1] = shape[d];
            snd--;
        }
        if (shape[0] != (long long)T)
            die("--diff-hidden: '%s' holds %lld token%s; the prompt has %zu: dump them for the "
                "same tokens", path, shape[0], plural_s(shape[0]), T);
        int fits = (snd == 2 && shape[1] == (long long)w) ||
                   (snd == nd + 1 && shape[1] == dims[0] && (nd == 1 || shape[2] == dims[1]));
        if (!fits) {
            char sh[80], ok[48];
            int p = snprintf(sh, sizeof sh, "(%lld", shape[0]);
            for (int d = 1; d < snd; d++) p += snprintf(sh + p, sizeof sh - p, ", %lld", shape[d]);
            if (nd == 1) snprintf(ok, sizeof ok, "(%zu, %d)", T, dims[0]);
            else snprintf(ok, sizeof ok, "(%zu, %d, %d)", T, dims[0], dims[1]);
            die("--diff-hidden: '%s' has the shape %s); this model's %s is %s", path, sh, name,
                ok);
        }
        if (len - off != T * w * elem)
            die("--diff-hidden: '%s': %zu values of float%d are %zu bytes, and %zu follow the "
                "header", path, T * w, 8 * elem, T * w * elem, len - off);
        *half |= elem == 2;
        float *d = theirs->data[slot] = (float *)xmalloc(T * w * 4, "their tensor");
        for (size_t i2 = 0; i2 < T * w; i2++) {
            double x = npy_value(buf + off + i2 * elem, elem);
            if (!isfinite(x) || fabs(x) > FLT_MAX)
                die("--diff-hidden: '%s': value %zu (token %zu) is %s", path, i2 % w, i2 / w,
                    isfinite(x) ? "past float32's range" : "not finite");
            d[i2] = (float)x;
        }
        theirs->by[slot] = "theirs";
        free(buf);
        found++;
    }
    free(listed);
    if (!found) die("--diff-hidden '%s': none of the %d selected tensors is there (NAME.npy%s)",
                    dir, n_miss, manifest ? " listed in its manifest.tsv" : ", e.g. l_out-0.npy");
    return n_miss;
}

// One tensor's comparison, ours against theirs over every token. A NaN or an infinity of ours
// counts as an infinite error (every test below is written so that a NaN fails it).
typedef struct {
    int kind, layer;
    double rel;           // ||ours - theirs|| / ||theirs||
    double cosine;        // ours . theirs / (||ours|| ||theirs||)
    double max_d;         // max |ours - theirs|, at (token, channel)
    int max_t, max_ch;
    int first_t;          // the first token whose own relative error is over the threshold, or -1
    double first_rel;     // that token's relative error
    double row_rel;       // the largest relative error of one token's row, at token row_t
    int row_t;
} HiddenDiff;

static HiddenDiff hidden_diff_one(const Tap *ours, const Tap *theirs, int kind, int l,
                                  double max_rel) {
    size_t slot = tap_slot(ours->c, kind, l), w = tap_width(ours->c, kind, l);
    const float *a = ours->data[slot], *b = theirs->data[slot];
    HiddenDiff r = {kind, l, 0, 0, 0, 0, 0, -1, 0, 0, 0};
    double d2 = 0, a2 = 0, b2 = 0, ab = 0;
    for (int t = 0; t < ours->n_tok; t++) {
        double td2 = 0, tb2 = 0;
        for (size_t i = 0; i < w; i++) {
            double x = a[t * w + i], y = b[t * w + i], d = fabs(x - y);
            if (!isfinite(d)) d = INFINITY;
            td2 += d * d;
            tb2 += y * y;
            a2 += x * x;
            ab += x * y;
            if (d > r.max_d) r.max_d = d, r.max_t = t, r.max_ch = (int)i;
        }
        d2 += td2;
        b2 += tb2;
        double trel = td2 == 0 ? 0 : tb2 == 0 ? INFINITY : sqrt(td2 / tb2);
        if (isnan(trel)) trel = INFINITY; // their NaN: compared, never passed
        if (r.first_t < 0 && !(trel <= max_rel)) r.first_t = t, r.first_rel = trel;
        if (!(trel <= r.row_rel)) r.row_rel = trel, r.row_t = t;
    }
    r.rel = d2 == 0 ? 0 : b2 == 0 ? INFINITY : sqrt(d2 / b2);
    if (isnan(r.rel)) r.rel = INFINITY;
    r.cosine = a2 == 0 && b2 == 0 ? 1 : a2 == 0 || b2 == 0 ? 0 : ab / sqrt(a2 * b2);
    return r;
}

// The table of one path against theirs, in the model's order, and its verdict: 1 when some
// token's row of some tensor is over max_rel (a late token's error is not averaged away by the
// early ones), the first such tensor and token named. tsv, if given, gets every row.
static int hidden_report(const Tap *ours, const Tap *theirs, const char *what, double max_rel,
                         const char *missing, int n_miss, FILE *tsv) {
    const Config *c = ours->c;
    int kinds[MAX_TAPS], layers[MAX_TAPS], n = tap_list(c, kinds, layers), n_cmp = 0, n_off = 0;
    HiddenDiff first = {0, 0, 0, 0, 0, 0, 0, -1, 0, 0, 0}, worst = first, worst_row = first;
    double prev = -1;
    char name[64], g[32], at[32];
    printf("diff-hidden: %s, %d token%s (growth: the error over the row above's)\n", what,
           ours->n_tok, plural_s(ours->n_tok));
    printf("  %-26s %10s %10s %10s  %-13s %8s  %s\n", "tensor", "rel.err", "cosine", "max|d|",
           "at tok,ch", "growth", "ours from");
    for (int i = 0; i < n; i++) {
        size_t slot = tap_slot(c, kinds[i], layers[i]);
        if (!ours->data[slot] || !theirs->data[slot]) continue;
        if (!ours->by[slot]) { n_off++; continue; } // a tensor this path does not materialize
        HiddenDiff r = hidden_diff_one(ours, theirs, kinds[i], layers[i], max_rel);
        tap_name(c, kinds[i], layers[i], name, sizeof name);
        if (prev > 0) snprintf(g, sizeof g, "%.3g", r.rel / prev);
        else snprintf(g, sizeof g, "-");
        snprintf(at, sizeof at, "%d,%d", r.max_t, r.max_ch);
        printf("  %-26s %10.3g %10.7f %10.3g  %-13s %8s  %s\n", name, r.rel, r.cosine, r.max_d,
               r.max_d > 0 ? at : "-", g, ours->by[slot]);
        if (tsv)
            fprintf(tsv, "%s\t%s\t%d\t%.6g\t%.9f\t%.6g\t%d\t%d\t%s\t%d\t%.6g\t%d\n", what,
                    name, kinds[i] < N_LAYER_TAPS ? layers[i] : -1, r.rel, r.cosine, r.max_d,
                    r.max_t, r.max_ch, g, r.first_t, r.row_rel, r.row_t);
        if (first.first_t < 0 && r.first_t >= 0) first = r;
        if (!(r.rel <= worst.rel) || !n_cmp) worst = r;
        if (!(r.row_rel <= worst_row.row_rel) || !n_cmp) worst_row = r;
        prev = r.rel;
        n_cmp++;
    }
    if (n_miss) printf("not in theirs (skipped): %s\n", missing);
    if (n_off) printf("not written by this path (the kernels fuse them; --cpu writes every one): "
                      "%d tensor%s\n", n_off, plural_s(n_off));
    if (!n_cmp) {
        printf("nothing compared: no selected tensor is in both dumps\n");
        return 1;
    }
    tap_name(c, worst.kind, worst.layer, name, sizeof name);
    printf("largest relative error: %.3g (%s)\n", worst.rel, name);
    tap_name(c, worst_row.kind, worst_row.layer, name, sizeof name);
    printf("largest of a token's row: %.3g (%s, token %d)\n", worst_row.row_rel, name,
           worst_row.row_t);
    if (first.first_t < 0) {
        printf("first tensor over --diff-max-rel %g: none\n", max_rel);
        return 0;
    }
    tap_name(c, first.kind, first.layer, name, sizeof name);
    printf("first tensor over --diff-max-rel %g: %s (relative error %.3g), first at token %d "
           "(%.3g there)\n", max_rel, name, first.rel, first.first_t, first.first_rel);
    return 1;
}

// Self-diff's threshold (--diff-hidden cpu without --diff-max-rel): the GPU's 16-bit activations
// (decode) and fp16 products (batched) leave each tensor within 9e-4 (decode) and 6e-3 (batched)
// of the exact path, and each token's row within 0.05 (a row of tiny-qwen35 Q8_0 is over 0.02),
// on the fixtures and trained models of the runs in test/PERF_NOTES.md (an H100, both builds).
#define HIDDEN_GPU_REL 0.05
// Against another dump: the exact path against transformers' float64 (test/gpu_hidden.sh) is
// within 1e-5 per tensor and 3e-5 per token's row (transformers' L2 norm adds eps under the
// root, the GGUF one takes max(|x|, eps): they differ most where |x| is small, at token 0).
#define HIDDEN_MAX_REL 1e-4

// --dump-hidden DIR and/or --diff-hidden THEIRS|cpu.
static int mode_hidden(const Args *a, Model *m, const Tokenizer *tok) {
    const Config *c = &m->c;
    int *ids = NULL, n = 0, self = a->hidden_diff && !strcmp(a->hidden_diff, "cpu");
    if (a->tokens_arg) n = parse_ids("--tokens", a->tokens_arg, &ids);
    else if (a->prompt) n = tokenizer_encode(tok, a->prompt, a->prompt_len, a->parse_special, &ids);
    const char *opt = a->hidden_dump ? "--dump-hidden" : "--diff-hidden";
    if (n == 0) die("%s needs a prompt: --tokens, -p or -f", opt);
    check_tokens(c->n_vocab, ids, n, "prompt token");
    check_prompt_fits(n, c->n_ctx_train, c->n_ctx_train); // the engine is sized to the prompt
    if (self && a->use_cpu) die("--diff-hidden cpu compares the GPU with --cpu: leave --cpu out");
    if (self && !gpu_available())
        die("--diff-hidden cpu compares the GPU with --cpu, and no CUDA GPU was found");
    if (self) budget_or_refuse(m, n, n); // before the CPU pass, which may take long
    // --diff-inject needs their whole residual stream, whatever the filter keeps
    char filter[600];
    const char *f = a->hidden_filter ? a->hidden_filter : HIDDEN_RESIDUAL;
    filter_check(f);
    if (a->diff_inject) snprintf(filter, sizeof filter, "(%s)|%s", f, HIDDEN_RESIDUAL);
    else snprintf(filter, sizeof filter, "%s", f);
    double max_rel = a->diff_max_rel >= 0 ? a->diff_max_rel : self ? HIDDEN_GPU_REL
                                                                     : HIDDEN_MAX_REL;
    Tap ours, theirs;
    tap_init(&ours, c, n, filter);
    if (a->hidden_dump)
        dump_prepare(a->hidden_dump, &ours, a->model_path, a->hidden_diff, a->diff_out);
    char missing[2000] = "";
    int n_miss = 0, rc = 0, half = 0;
    FILE *tsv = NULL;
    if (a->hidden_diff) {
        if (self) { // theirs: the exact C path
            tap_init(&theirs, c, n, filter);
            fprintf(stderr, "diff-hidden: the reference, --cpu\n");
            tap_run(&theirs, m, ids, n, 0, 1);
        } else {
            n_miss = their_hidden(&theirs, &ours, a->hidden_diff, missing, sizeof missing, &half);
        }
        if (a->diff_inject) { // layer l starts from their inp_embd (l = 0) or l_out-(l-1)
            ours.inject = (const float **)xcalloc(c->n_layer, sizeof(float *), "--diff-inject");
            for (int l = 0; l < c->n_layer; l++) {
                size_t slot = tap_slot(c, l ? TAP_L_OUT : TAP_INP_EMBD, l - 1);
                if (!theirs.data[slot] || !theirs.by[slot]) {
                    char nm[64];
                    die("--diff-inject needs their residual stream: %s.npy is missing",
                        l ? tap_name(c, TAP_L_OUT, l - 1, nm, sizeof nm) : "inp_embd");
                }
                ours.inject[l] = theirs.data[slot];
            }
        }
        if (a->diff_out) {
            tsv = output_open("--diff-out", a->diff_out);
            fprintf(tsv, "path\ttensor\tlayer\trel_err\tcosine\tmax_abs_d\tmax_token\tmax_channel"
                    "\tgrowth\tfirst_token_over\trow_rel_err\trow_token\n");
        }
    }
    const char *inj =
        a->diff_inject ? ", each layer fed their residual stream (--diff-inject)" : "";
    char what[PATH_MAX + 200];
    if (half && max_rel < 1e-3)
        printf("note: their files are float16, whose rounding alone is a relative error of up to "
               "5e-4: --diff-max-rel %g measures it\n", max_rel);
    if (self) { // the GPU's two paths against the C path
        int nb = a->batch_given ? a->n_batch : 512;
        for (int p = 0; p < 2; p++) {
            if (p) { // a fresh tap for the batched pass
                Tap t2;
                tap_init(&t2, c, n, filter);
                t2.inject = ours.inject;
                ours.inject = NULL;
                tap_free(&ours);
                ours = t2;
            }
            const char *path = tap_run(&ours, m, ids, n, 1, p ? nb : 1);
            snprintf(what, sizeof what, "the GPU's %s against --cpu%s",
                     !strcmp(path, BY_BATCH) ? "batched pass" : "decode (-b 1)", inj);
            rc |= hidden_report(&ours, &theirs, what, max_rel, "", 0, tsv);
            if (p == 0) printf("\n");
        }
    } else {
        const char *path = tap_run(&ours, m, ids, n, !a->use_cpu, a->n_batch);
        if (a->hidden_dump) dump_hidden(a->hidden_dump, &ours);
        if (a->hidden_diff) {
            snprintf(what, sizeof what, "ours (%s) against %s%s", !strcmp(path, "cpu") ? "--cpu"
                     : !strcmp(path, BY_BATCH) ? "the GPU's batched pass" : "the GPU's decode",
                     a->hidden_diff, inj);
            rc = hidden_report(&ours, &theirs, what, max_rel, missing, n_miss, tsv);
        }
    }
    if (tsv) output_close(tsv, "--diff-out", a->diff_out);
    if (a->hidden_diff) {
        printf("result: %s\n", rc ? "FAIL" : "PASS");
        tap_free(&theirs);
    }
    tap_free(&ours);
    free(ids);
    return rc;
}

// The model's config and weights (exits naming the problem when the file holds no runnable model),
// -c capped at the context it was trained for, and the model's line on stderr.
static void load_model(Args *a, Model *m) {
    model_load(m);
    const Config *c = &m->c;
    if (a->n_ctx > c->n_ctx_train) { // the default -c 4096 is capped without a word
        if (a->ctx_given)
            fprintf(stderr, "note: -c %d is above the model's training context %d; using %d\n",
                    a->n_ctx, c->n_ctx_train, c->n_ctx_train);
        a->n_ctx = c->n_ctx_train;
    }
    fprintf(stderr, "model: %s, %d layers, n_embd %d, %d/%d heads x %d, n_ff %d, vocab %d\n",
            c->arch_name, c->n_layer, c->n_embd, c->n_head, c->n_head_kv, c->head_dim, c->n_ff,
            c->n_vocab);
}

int main(int argc, char **argv) {
    // Load every kernel when the CUDA context is created, so that the context's memory, which the
    // VRAM budget measures, already includes them (the default loads them lazily, later).
    setenv("CUDA_MODULE_LOADING", "EAGER", 0);
    // A closed stdin, stdout or stderr (`<&-`) would lend its number to the next file opened: the
    // model file would become the chat's input. Each one that is closed becomes /dev/null. Every
    // mode prints its result on stdout, so a closed stdout is an error at once (check_stdout).
    for (int fd = 0; fd < 3; fd++)
        if (fcntl(fd, F_GETFD) == -1 && errno == EBADF) {
            if (open("/dev/null", fd ? O_WRONLY : O_RDONLY) != fd) return 1;
            if (fd == 1) g_stdout_closed = 1;
        }
    catch_fatal_signals();
    check_stdout();
    Args a;
    parse_args(&a, argc, argv);
    Model m;
    memset(&m, 0, sizeof m);
    double t_tok = now_sec(); // vocabulary load time: parsing the file + building the tokenizer
    if (gguf_open(&m.gguf, a.model_path) != 0) die("%s", m.gguf.err);
    Tokenizer tok;
    char tok_err[300];
    int have_tok = tokenizer_init(&tok, &m.gguf, 0, tok_err, sizeof tok_err) == 0;
    t_tok = now_sec() - t_tok;
    int rc = 0;
    if (a.mode == MODE_TOKENIZE || a.mode == MODE_DETOKENIZE) {
        if (!have_tok) die("%s: %s", a.model_path, tok_err);
        rc = mode_tokenize(&a, &tok, t_tok);
    } else if (m.gguf.n_tensors == 0) { // a vocabulary-only file: its metadata, nothing to run
        if (a.mode != MODE_INFO)
            die("'%s' is a vocabulary-only file (no tensors): only --tokenize, --detokenize and "
                "--info apply to it", a.model_path);
        print_gguf(&m.gguf);
        printf("no tensors: a vocabulary-only file (%s), no model to run\n",
               have_tok ? "its tokenizer loads" : tok_err);
    } else {
        load_model(&a, &m);
        if (a.mode == MODE_INFO) {
            print_gguf(&m.gguf);
            print_model(&m, a.n_ctx);
        } else if (a.mode == MODE_BENCH) {
            run_bench(&m, a.n_ctx);
        } else if (a.mode == MODE_PERPLEXITY || a.mode == MODE_KLD) {
            rc = mode_perplexity(&a, &m, have_tok ? &tok : NULL, tok_err);
        } else if (a.mode == MODE_DIFF || a.mode == MODE_HIDDEN) {
            if (!have_tok && a.prompt)
                die("%s: %s (pass the prompt as ids with --tokens)", a.model_path, tok_err);
            rc = a.mode == MODE_DIFF ? mode_diff(&a, &m, have_tok ? &tok : NULL)
                                     : mode_hidden(&a, &m, have_tok ? &tok : NULL);
        } else {
            if (!have_tok && a.mode == MODE_CHAT) // --tokens is no chat turn
                die("%s: %s; --chat needs the file's tokenizer", a.model_path, tok_err);
            if (!have_tok && a.prompt)
                die("%s: %s (pass the prompt as ids with --tokens)", a.model_path, tok_err);
            if (!have_tok)
                fprintf(stderr, "note: %s; the output is printed as token ids\n", tok_err);
            rc = a.mode == MODE_CHAT ? mode_chat(&a, &m, &tok)
                                     : mode_generate(&a, &m, have_tok ? &tok : NULL);
        }
    }
    if (have_tok) tokenizer_free(&tok);
    free(a.prompt_buf);
    gguf_close(&m.gguf);
    // the last of stdout: what stdio still holds, then the close, which can fail too
    check_stdout();
    if (fclose(stdout) != 0) {
        fprintf(stderr, "error: writing standard output: %s\n", strerror(errno));
        exit_failed();
    }
    return rc;
}
#endif // TESTING
