// test_qwen.cu — the tests of qwen.cu. Includes the engine with TESTING defined (no main of its own).
//
// Three kinds of check, one output line each:
//   ok   <name>  err=<measured> tol=<tolerance>
//   FAIL <name>  err=<measured> tol=<tolerance>
//   skip <name>  (why)
// and a last line "N passed, M failed, K skipped". The exit code is non-zero when anything failed.
//
// Host checks run everywhere (CI has no GPU): the GGUF reader on valid and malformed files, every
// C dequantizer, the plain-C forward pass of every fixture model against the exact reference logits,
// the sampler, the command line's error paths. GPU checks (each kernel against its C twin, the GPU
// forward pass against the reference) run when a GPU is present and are counted as skipped when not.
//
// Data: test/data (override with QWEN_TEST_DATA). Run from the repository root (make test).

#include <cuda_runtime.h>
// Every device and pinned host allocation the engine makes, counted (the token-loop check of
// test_models): the engine's calls are renamed to these before it is included.
static long g_n_alloc = 0;
template <class T> static cudaError_t counted_cudaMalloc(T **p, size_t n) { g_n_alloc++; return cudaMalloc((void **)p, n); }
static cudaError_t counted_cudaMallocHost(void **p, size_t n) { g_n_alloc++; return cudaMallocHost(p, n); }
#define cudaMalloc counted_cudaMalloc
#define cudaMallocHost counted_cudaMallocHost

#define TESTING
#include "../qwen.cu"

// Open a model file: parse, read the config, find every weight.
static void model_open(Model *m, const char *path) {
    memset(m, 0, sizeof *m);
    if (gguf_open(&m->gguf, path) != 0) die("%s", m->gguf.err);
    model_load(m);
}

#include <dirent.h>
#include <sys/wait.h>

#include "gguf_write.h"

// One temporary folder, TMP, holds every file the tests write. It is made at the start and
// removed at the exit and on a signal that ends the run (Ctrl-C during make test, a kill), so
// that no test file is left in /tmp. Only the process that made it removes it: a forked child
// that exits (a fuzz replay) leaves it alone.
static char TMP[64] = "";
static pid_t tmp_owner = 0;
// rm -rf TMP through fork and exec, which a signal handler may call (opendir and free may not)
static void tmp_remove(void) {
    if (!TMP[0] || getpid() != tmp_owner) return;
    pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/rm", "rm", "-rf", TMP, (char *)NULL);
        _exit(127);
    }
    if (pid > 0) waitpid(pid, NULL, 0);
}
static void tmp_on_signal(int sig) {
    tmp_remove();
    signal(sig, SIG_DFL);
    raise(sig);
}
static void tmp_make(void) {
    snprintf(TMP, sizeof TMP, "/tmp/qwen_test_XXXXXX");
    if (!mkdtemp(TMP)) die("test: cannot make a temporary folder in /tmp: %s", strerror(errno));
    tmp_owner = getpid();
    atexit(tmp_remove);
    const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        if (signal(sigs[i], SIG_IGN) != SIG_IGN) signal(sigs[i], tmp_on_signal);
}

static int n_pass = 0, n_fail = 0, n_skip = 0;
static const char *DATA = "test/data";  // QWEN_TEST_DATA overrides
static const char *QWEN = "./qwen";     // the CLI under test; QWEN_BIN overrides
static const char *QUANTIZE = "./test/quantize"; // the quantizer (test/quantize.cu); QUANTIZE_BIN
static int HAVE_GPU = 0;
static void report(int ok, const char *name, double err, double tol) {
    printf("%-4s %-64s err=%-11.4g tol=%.4g\n", ok ? "ok" : "FAIL", name, err, tol);
    fflush(stdout);
    ok ? n_pass++ : n_fail++;
}
// a check with no numeric error: err is 0 on success, 1 on failure
static void check(int ok, const char *name) { report(ok, name, ok ? 0.0 : 1.0, 0.0); }
static void skip(const char *name, const char *why) {
    printf("skip %-64s (%s)\n", name, why);
    fflush(stdout);
    n_skip++;
}
// The larger of a running worst error e and a new error d, where a NaN is the worst error of all
// (fmax would drop it: fmax(e, NaN) is e, so a kernel writing NaNs would pass its check).
static double worse(double e, double d) { return d <= e ? e : isnan(d) ? INFINITY : d; }

// a test's n named checks without a GPU: all reported as skipped; returns 1 then
#define SKIP_ALL_WITHOUT_GPU(names) skip_all_without_gpu(names, sizeof names / sizeof names[0])
static int skip_all_without_gpu(const char *const *names, size_t n) {
    if (HAVE_GPU) return 0;
    for (size_t i = 0; i < n; i++) skip(names[i], "no GPU");
    return 1;
}

// QWEN_TEST_SUBSET=1: some fixture directories were left out on purpose (the GPU machine takes at most
// 64 MiB per run); checks that need a missing fixture are skipped instead of failing.
static int SUBSET = 0;

// Does a fixture exist? Missing is a failure, except in a subset run, where it is a skip.
static int need_fixture(const char *path, const char *check_name) {
    if (access(path, R_OK) == 0) return 1;
    if (SUBSET) skip(check_name, "fixture not in this subset run");
    else { printf("FAIL %-64s (missing fixture %s)\n", check_name, path); n_fail++; }
    return 0;
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = (char *)xmalloc((size_t)n + 1, "a test");
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) { fclose(f); free(buf); return NULL; }
    fclose(f);
    buf[n] = 0;
    if (len) *len = (size_t)n;
    return buf;
}

static void write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) die("test: cannot write %s", path);
}

static float *read_f32(const char *path, size_t *n) {
    size_t len;
    char *b = read_file(path, &len);
    if (!b) return NULL;
    *n = len / 4;
    return (float *)b;
}

// deterministic test randomness
static uint64_t trng = 0x1234567887654321ull;
static float urand(void) { return rng_f32(&trng); }                 // [0, 1)
static float nrand(void) {                                          // ~N(0, 1)
    float u1 = urand() + 1e-7f, u2 = urand();
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}
// host-side half conversions from cuda_fp16.h (through __half_raw, which CUDA 11.8 also allows)
static uint16_t f32_to_fp16_bits(float f) { __half_raw r = __float2half(f); return r.x; }
static float cuda_half_to_f32(uint16_t bits) { __half_raw r; r.x = bits; return __half2float(__half(r)); }

// =================================================================================================
// fp16 / bf16 conversions
// =================================================================================================
static void test_conversions(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float a = fp16_to_f32((uint16_t)h), b = cuda_half_to_f32((uint16_t)h);
        if (!(a == b || (isnan(a) && isnan(b)))) bad++;
    }
    report(bad == 0, "fp16_to_f32 matches cuda_fp16 on all 65536 values", bad, 0);
    check(bf16_to_f32(0x3f80) == 1.0f && bf16_to_f32(0xc000) == -2.0f, "bf16_to_f32 on 1.0 and -2.0");
    int bad16 = 0;
    for (uint32_t h = 0; h < 65536; h++) { // bf16 is the top half of an fp32: the bits must come back so
        float f = bf16_to_f32((uint16_t)h);
        uint32_t u;
        memcpy(&u, &f, 4);
        bad16 += u != h << 16;
    }
    report(bad16 == 0, "bf16_to_f32: all 65536 values are the fp32 with those top 16 bits", bad16, 0);
}

// =================================================================================================
// GGUF reader: a small writer for synthetic files, then valid and malformed inputs
// =================================================================================================
// A valid little GGUF: 3 KV pairs (u32, string, string array) and two F32 tensors {4,2} and {3}.
// Knobs let each malformed variant change one thing.
typedef struct {
    uint32_t version;
    int64_t n_tensors_override, n_kv_override;   // -2: use the real count
    int dup_key, empty_key, bad_kv_type, nested_array, long_string, huge_array;
    int bad_alignment, alignment_type_i32, misaligned;
    int long_name, five_dims, zero_dim, neg_dim, big_dim, bad_type, removed_type, ragged_row, bad_offset, dup_tensor;
    int nul_key, nul_name, overflow_dims;
    int truncate_data;
} Variant;

static Buf make_gguf(const Variant *v) {
    Buf b = {0};
    put(&b, "GGUF", 4);
    put_u32(&b, v->version ? v->version : 3);
    int n_kv = 4;
    put_u64(&b, (uint64_t)(v->n_tensors_override != -2 ? v->n_tensors_override : 2));
    put_u64(&b, (uint64_t)(v->n_kv_override != -2 ? v->n_kv_override : n_kv));
    // kv 1: u32
    if (v->nul_key) put_strn(&b, "test\0count", 10); else put_str(&b, v->empty_key ? "" : "test.count");
    put_i32(&b, v->bad_kv_type ? 99 : GGUF_TYPE_U32);
    put_u32(&b, 7);
    // kv 2: string
    put_str(&b, v->dup_key ? "test.count" : "general.architecture");
    put_i32(&b, GGUF_TYPE_STRING);
    if (v->long_string) put_u64(&b, 1ull << 40); else put_str(&b, "qwen2");
    // kv 3: array of strings
    put_str(&b, "test.words");
    put_i32(&b, GGUF_TYPE_ARRAY);
    put_i32(&b, v->nested_array ? GGUF_TYPE_ARRAY : GGUF_TYPE_STRING);
    put_u64(&b, v->huge_array ? (1ull << 29) : 2);
    put_str(&b, "hello");
    put_str(&b, "world");
    // kv 4: alignment
    put_str(&b, "general.alignment");
    put_i32(&b, v->alignment_type_i32 ? GGUF_TYPE_I32 : GGUF_TYPE_U32);
    put_u32(&b, v->bad_alignment ? 24 : v->misaligned ? 2 : 32);
    // tensor infos
    // long_name: 1 = 64 bytes (one too many), 2 = 63 (the longest allowed)
    char name0[80] = "w";
    if (v->long_name) { memset(name0, 'n', 80); name0[v->long_name == 1 ? 64 : 63] = 0; }
    if (v->nul_name) put_strn(&b, "w\0x", 3); else put_str(&b, name0);
    if (v->overflow_dims) { // 1: three dimensions of 2^31 - 1 (2^93 elements); 2: {2^31 - 1, 2^31 - 1, 2,
                            // 2^31 - 1}, whose first three stay below 2^63 and the fourth overflows
        put_u32(&b, v->overflow_dims == 1 ? 3 : 4);
        for (int d = 0; d < (v->overflow_dims == 1 ? 3 : 4); d++) put_u64(&b, v->overflow_dims == 2 && d == 2 ? 2 : INT32_MAX);
    } else {
        put_u32(&b, v->five_dims ? 5 : 2);
        put_u64(&b, 4);
        put_u64(&b, (uint64_t)(v->zero_dim ? 0 : v->neg_dim ? -2 : v->big_dim ? 1ll << 31 : 2));
        if (v->five_dims) { put_u64(&b, 1); put_u64(&b, 1); put_u64(&b, 1); }
    }
    put_i32(&b, v->bad_type ? 77 : v->removed_type ? 4 : v->ragged_row ? GGML_TYPE_Q4_0 : GGML_TYPE_F32);
    put_u64(&b, 0);
    if (v->misaligned) { // alignment 2, and a name for b that puts the data 2 bytes past a multiple of 4
        char nb[8] = "b";
        for (int l = 1; (b.n + 8 + l + 24) % 4 != 2; l++) nb[l] = 'b';
        put_str(&b, nb);
    } else put_str(&b, v->dup_tensor ? name0 : "b");
    put_u32(&b, 1);
    put_u64(&b, 3);
    put_i32(&b, GGML_TYPE_F32);
    put_u64(&b, v->bad_offset ? 16 : 32); // w is 32 bytes; aligned to 32
    put_pad(&b, v->misaligned ? 2 : 32);
    float data[8 + 8] = {1, 2, 3, 4, 5, 6, 7, 8, 0.5f, -1, 2};
    put(&b, data, v->truncate_data ? 40 : 32 + 12);
    return b;
}

// A copy of n bytes that ends where an unreadable page begins: a read past the end of the buffer
// crashes the test run instead of going unnoticed (gguf_parse must never read past what it is given).
typedef struct { uint8_t *map, *p; size_t map_len; } Guarded;
static Guarded guarded_copy(const void *src, size_t n) {
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), body = (n + pg - 1) / pg * pg;
    Guarded g;
    g.map_len = body + pg;
    g.map = (uint8_t *)mmap(NULL, g.map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (g.map == MAP_FAILED || mprotect(g.map + body, pg, PROT_NONE) != 0) die("test: cannot map a guarded buffer");
    g.p = g.map + body - n;
    memcpy(g.p, src, n);
    return g;
}
static void guarded_free(Guarded *g) { munmap(g->map, g->map_len); }

// Parse a GGUF image held in memory into g; the caller calls gguf_close(g) whatever it returns.
static int parse_image(GGUF *g, const uint8_t *f, size_t len) {
    memset(g, 0, sizeof *g);
    g->fd = -1;
    return gguf_parse(g, f, len);
}

static int parse_variant(const Variant *v, char *err, size_t cap) {
    Buf b = make_gguf(v);
    Guarded c = guarded_copy(b.p, b.n);
    GGUF g;
    int rc = parse_image(&g, c.p, b.n);
    snprintf(err, cap, "%s", g.err);
    gguf_close(&g);
    guarded_free(&c);
    free(b.p);
    return rc;
}

static void test_gguf_reader(void) {
    char err[600], name[128];
    Variant ok0;
    memset(&ok0, 0, sizeof ok0);
    ok0.n_tensors_override = ok0.n_kv_override = -2;

    // the valid file parses and reads back
    {
        Buf b = make_gguf(&ok0);
        GGUF g;
        int rc = parse_image(&g, b.p, b.n);
        int good = rc == 0 && g.n_kv == 4 && g.n_tensors == 2 && gguf_u32(&g, "test.count", 1, 0) == 7;
        char s[32];
        good = good && gguf_str(&g, "general.architecture", s, sizeof s) && strcmp(s, "qwen2") == 0;
        const GGUFKV *kv = gguf_find(&g, "test.words");
        if (good && kv) {
            const uint8_t *p = kv->data;
            uint64_t l1, l2;
            const char *w1 = gguf_next_str(&p, &l1), *w2 = gguf_next_str(&p, &l2);
            good = l1 == 5 && !memcmp(w1, "hello", 5) && l2 == 5 && !memcmp(w2, "world", 5);
        } else good = 0;
        const GGUFTensor *t = good ? gguf_tensor(&g, "b") : NULL;
        good = good && t && t->ne[0] == 3 && t->nbytes == 12 && ((const float *)t->data)[0] == 0.5f;
        check(good, "gguf: synthetic v3 file parses, KV and tensors read back");
        gguf_close(&g);
        free(b.p);
        Variant v2 = ok0;
        v2.version = 2;
        check(parse_variant(&v2, err, sizeof err) == 0, "gguf: version 2 accepted");
        Variant v3 = ok0;
        v3.long_name = 2;
        check(parse_variant(&v3, err, sizeof err) == 0, "gguf: a tensor name of 63 bytes (the longest) accepted");
    }

    // each malformed variant must fail with a message naming the problem
    struct { const char *what, *expect; Variant v; } cases[40];
    int nc = 0;
#define CASE(label, msg, field, val) do { if (nc == (int)(sizeof cases / sizeof cases[0])) die("test: too many GGUF cases"); cases[nc].what = label; cases[nc].expect = msg; cases[nc].v = ok0; cases[nc].v.field = val; nc++; } while (0)
    CASE("version 0", "version 0", version, 0xFFFFFFFFu); // patched below to 0
    CASE("version 1", "version 1", version, 1);
    CASE("version 4", "version 4", version, 4);
    CASE("byte-swapped version", "byte-swapped", version, 0x03000000u);
    CASE("n_tensors absurd", "n_tensors", n_tensors_override, (int64_t)1 << 40);
    CASE("n_tensors negative", "n_tensors", n_tensors_override, -1);
    CASE("n_kv absurd", "n_kv", n_kv_override, (int64_t)1 << 40);
    CASE("duplicate key", "duplicate metadata key", dup_key, 1);
    CASE("empty key", "empty", empty_key, 1);
    CASE("unknown value type", "unknown value type", bad_kv_type, 1);
    CASE("nested array", "nested", nested_array, 1);
    CASE("string longer than the file", "string length", long_string, 1);
    CASE("array longer than the file", "cannot fit", huge_array, 1);
    CASE("alignment not a power of two", "power of two", bad_alignment, 1);
    CASE("alignment stored as i32", "general.alignment must be u32", alignment_type_i32, 1);
    CASE("tensor data not on 4 bytes (alignment 2)", "not 4-byte aligned", misaligned, 1);
    CASE("tensor name of 64 bytes", "longer than 63", long_name, 1);
    CASE("metadata key with a NUL byte", "contains a NUL byte", nul_key, 1);
    CASE("tensor name with a NUL byte", "contains a NUL byte", nul_name, 1);
    CASE("element count past 2^63", "element count overflows", overflow_dims, 1);
    CASE("element count past 2^63 at the fourth dimension", "element count overflows", overflow_dims, 2);
    CASE("five dimensions", "n_dims", five_dims, 1);
    CASE("zero-sized dimension", "must be at least 1", zero_dim, 1);
    CASE("negative dimension", "must be at least 1", neg_dim, 1);
    CASE("dimension of 2^31 (past the engine's ints)", "at most 2147483647", big_dim, 1);
    CASE("invalid type id", "invalid ggml type", bad_type, 1);
    CASE("removed type id", "not supported", removed_type, 1);
    CASE("row not a multiple of the block", "not a multiple", ragged_row, 1);
    CASE("non-contiguous offset", "contiguous", bad_offset, 1);
    CASE("duplicate tensor name", "duplicate tensor", dup_tensor, 1);
    CASE("tensor data past end of file", "past the end", truncate_data, 1);
#undef CASE
    for (int i = 0; i < nc; i++) {
        Variant v = cases[i].v;
        if (v.version == 0xFFFFFFFFu) v.version = 0;
        int rc;
        if (i == 0) { // version 0 cannot go through make_gguf's default: patch the bytes
            Buf b = make_gguf(&ok0);
            memset(b.p + 4, 0, 4);
            GGUF g;
            rc = parse_image(&g, b.p, b.n);
            snprintf(err, sizeof err, "%s", g.err);
            gguf_close(&g);
            free(b.p);
        } else {
            rc = parse_variant(&v, err, sizeof err);
        }
        snprintf(name, sizeof name, "gguf rejects: %s", cases[i].what);
        int good = rc != 0 && strstr(err, cases[i].expect) != NULL;
        check(good, name);
        if (!good) printf("     message was: '%s' (expected to contain '%s')\n", err, cases[i].expect);
    }

    // Per-layer keys: a scalar repeated; an array of the layers that run, or of every block (qwen35's
    // MTP blocks after the trunk included: the first n are the trunk's)
    {
        Buf b = {0};
        put(&b, "GGUF", 4);
        put_u32(&b, 3);
        put_u64(&b, 0);
        put_u64(&b, 2);
        const int32_t five[5] = {11, 12, 13, 14, 15};
        kv_arr_i32(&b, "x.per_layer", five, 5);
        kv_u32(&b, "x.scalar", 7);
        GGUF g;
        int32_t o4[5] = {0}, o5[5] = {0}, os[5] = {0};
        int ok = parse_image(&g, b.p, b.n) == 0 && gguf_int_or_arr(&g, "x.per_layer", o4, 4, 5) &&
                 gguf_int_or_arr(&g, "x.per_layer", o5, 5, 5) && gguf_int_or_arr(&g, "x.scalar", os, 3, 5) &&
                 !gguf_int_or_arr(&g, "x.absent", os + 3, 1, 1);
        ok = ok && !memcmp(o4, five, 16) && o4[4] == 0 && !memcmp(o5, five, 20) && os[0] == 7 && os[2] == 7 && os[3] == 0;
        check(ok, "gguf: per-layer keys as a scalar, an array of the layers run, or of every block (the first n)");
        gguf_close(&g);
        free(b.p);
    }

    // Counts only the file's size bounds: 200k keys and 100k tensors, each with one duplicate at the
    // end, must be rejected by name, and fast: the reader sorts (0.1 s each here), pairwise checks took
    // 62 s and 21 s. Not a speed measurement: the 10 s bound only tells the two orders apart.
    for (int kind = 0; kind < 2; kind++) {
        const int n = kind ? 100000 : 200000;
        Buf b = {0};
        char key[32];
        put(&b, "GGUF", 4);
        put_u32(&b, 3);
        put_u64(&b, kind ? (uint64_t)n + 1 : 0); // tensors
        put_u64(&b, kind ? 0 : (uint64_t)n + 1); // keys
        for (int i = 0; i <= n; i++) {
            snprintf(key, sizeof key, kind ? "blk.%d.w" : "key.%06d", i < n ? i : n / 2);
            put_str(&b, key);
            if (kind) { // F32 {8} at offset 32 i: one 32-byte slot each
                put_u32(&b, 1);
                put_u64(&b, 8);
                put_i32(&b, GGML_TYPE_F32);
                put_u64(&b, (uint64_t)i * 32);
            } else {
                put_i32(&b, GGUF_TYPE_U32);
                put_u32(&b, (uint32_t)i);
            }
        }
        if (kind) {
            static const uint8_t zeros[32] = {0};
            put(&b, zeros, (32 - b.n % 32) % 32);
            for (int i = 0; i <= n; i++) put(&b, zeros, 32);
        }
        GGUF gb;
        double t0 = now_sec();
        int rc = parse_image(&gb, b.p, b.n);
        double dt = now_sec() - t0;
        snprintf(name, sizeof name, "gguf rejects: %s with one duplicate, in under 10 s: s", kind ? "100k tensors" : "200k keys");
        report(rc != 0 && strstr(gb.err, kind ? "duplicate tensor name" : "duplicate metadata key") && dt < 10.0, name, dt, 10.0);
        if (rc == 0 || !strstr(gb.err, "duplicate")) printf("     message was: '%s'\n", gb.err);
        gguf_close(&gb);
        free(b.p);
    }

    // truncation at every length of a real fixture's header, and random byte flips: every outcome
    // must be a clean accept or a clean error (a crash would end the test run here; each copy ends at
    // an unreadable page, so a read one byte past it is such a crash)
    char path[512];
    snprintf(path, sizeof path, "%s/tiny-qwen3/tiny-qwen3-q4_0.gguf", DATA);
    if (!need_fixture(path, "gguf: truncations and corruptions of tiny-qwen3-q4_0.gguf")) return;
    size_t len;
    uint8_t *file = (uint8_t *)read_file(path, &len);
    if (!file) { check(0, "gguf: read tiny-qwen3-q4_0.gguf"); return; }
    GGUF g;
    int rc = parse_image(&g, file, len);
    size_t header = g.data_offset;
    check(rc == 0 && g.n_tensors > 0, "gguf: fixture tiny-qwen3-q4_0.gguf parses");
    gguf_close(&g);
    int errors = 0, accepted = 0;
    for (size_t cut = 0; cut < header + 64 && cut < len; cut++) {
        Guarded copy = guarded_copy(file, cut);
        if (parse_image(&g, copy.p, cut) == 0) accepted++; else errors++;
        gguf_close(&g);
        guarded_free(&copy);
    }
    report(accepted == 0, "gguf: every truncation of the header is rejected", accepted, 0);
    int flips_ok = 1;
    Guarded gcopy = guarded_copy(file, len);
    uint8_t *copy = gcopy.p;
    for (int it = 0; it < 3000; it++) {
        memcpy(copy, file, len);
        int nflip = 1 + (int)(urand() * 4);
        for (int k = 0; k < nflip; k++) copy[(size_t)(urand() * header)] ^= (uint8_t)(1 + urand() * 255);
        if (parse_image(&g, copy, len) != 0) {
            if (g.err[0] == 0) flips_ok = 0; // errors must say why
        } else {
            // an accepted file: every tensor's bytes inside the data section, its size its shape's
            for (int64_t i = 0; i < g.n_tensors; i++) {
                const GGUFTensor *t = &g.tensors[i];
                size_t at = (size_t)(t->data - copy);
                if (t->data < copy + g.data_offset || at > len || t->nbytes > len - at) flips_ok = 0;
                int64_t n = 1;
                for (int d = 0; d < GGUF_MAX_DIMS; d++) n *= t->ne[d];
                if (t->nbytes != (size_t)n / TYPE_TRAITS[t->type].blck * TYPE_TRAITS[t->type].type_size) flips_ok = 0;
            }
        }
        gguf_close(&g);
    }
    guarded_free(&gcopy);
    check(flips_ok, "gguf: 3000 random header corruptions end in a named error or an accepted file whose tensors lie inside it");
    free(file);

    // gguf_open on a missing file / a directory / an empty file
    memset(&g, 0, sizeof g);
    check(gguf_open(&g, "/nonexistent/model.gguf") != 0 && strstr(g.err, "cannot open"), "gguf: missing file is an error");
    check(gguf_open(&g, "/") != 0 && strstr(g.err, "is a directory"), "gguf: a directory is an error");
    char ep[128];
    snprintf(ep, sizeof ep, "%s/empty.gguf", TMP);
    write_file(ep, "", 0);
    memset(&g, 0, sizeof g);
    int erc = gguf_open(&g, ep);
    check(erc != 0 && strstr(g.err, "empty"), "gguf: an empty file is an error naming it");
    if (erc == 0) gguf_close(&g);
    unlink(ep);
}

// =================================================================================================
// The IQ4_XS planes: codes and the register table lookup (host run of the GPU's iq4_lookup8)
// =================================================================================================
static void test_iq4_planes(void) {
    // every value in every position of a word
    int bad = 0;
    for (int idx = 0; idx < 16; idx++)
        for (int pos = 0; pos < 8; pos++) {
            uint32_t w = 0;
            for (int p = 0; p < 8; p++) w |= (uint32_t)iq4_code(p == pos ? idx : (idx + 5 * p + 3) % 16) << (4 * p);
            int lo, hi;
            iq4_lookup8((int)w, &lo, &hi);
            for (int p = 0; p < 8; p++) {
                int want = KVALUES_IQ4NL[p == pos ? idx : (idx + 5 * p + 3) % 16];
                int got = (int8_t)((p < 4 ? lo : hi) >> (8 * (p % 4)));
                bad += got != want;
            }
        }
    check(bad == 0, "iq4_lookup8 (host run): all 16 values in all 8 positions of a word");
    // the repack's shuffle (iq4_plane_word) against its plain loop: every byte value in every
    // place of a word, then random sub-blocks
    bad = 0;
    for (int k = 0; k < 4; k++)
        for (int p = 0; p < 4; p++)
            for (int v = 0; v < 256; v++) {
                uint8_t qs[16];
                for (int i = 0; i < 16; i++) qs[i] = (uint8_t)(i * 37 + 5);
                qs[4 * k + p] = (uint8_t)v;
                bad += iq4_plane_word(qs, k) != iq4_plane_word_c(qs, k);
            }
    uint64_t rs = 0x9e3779b97f4a7c15ull;
    for (int n = 0; n < 20000; n++) {
        uint8_t qs[16];
        for (int i = 0; i < 16; i++) {
            rs = rs * 6364136223846793005ull + 1442695040888963407ull;
            qs[i] = (uint8_t)(rs >> 56);
        }
        for (int k = 0; k < 4; k++) bad += iq4_plane_word(qs, k) != iq4_plane_word_c(qs, k);
    }
    check(bad == 0, "iq4_plane_word (the repack's shuffle) = iq4_plane_word_c, 4096 + 80000 words");
    // the word worked through above iq4_lookup8 in qwen.cu
    {
        const uint8_t qs[16] = {0x70, 0x85, 0x39, 0xfe}; // elements 0..3: 0 5 9 14; 16..19: 7 8 3 15
        uint32_t w = iq4_plane_word(qs, 0);
        int lo, hi, ok = w == 0x7bc36d18u;
        ok &= (uint32_t)prmt((int)IQ4_A0, (int)IQ4_A1, (int)(w & 0x7777)) == 0x190d9881u; // -127 -104 13 25
        ok &= (uint32_t)prmt((int)IQ4_D0, (int)IQ4_D1, (int)w) == 0x40004500u;            // 0 69 0 64
        ok &= (uint32_t)prmt((int)IQ4_A0, (int)IQ4_A1, 0x7343) == 0x26bf01bfu;             // -65 1 -65 38
        ok &= (uint32_t)prmt((int)IQ4_D0, (int)IQ4_D1, 0x7bc3) == 0x4b000037u;             // 55 0 0 75
        iq4_lookup8((int)w, &lo, &hi);
        const int want[8] = {-127, -35, 13, 89, -10, 1, -65, 113};
        for (int p = 0; p < 8; p++) ok &= (int8_t)((p < 4 ? lo : hi) >> (8 * (p % 4))) == want[p];
        check(ok, "the IQ4_XS word worked through in qwen.cu: 0x7bc36d18, its picks and 8 values");
    }
    // a repacked block decodes to the file's values, element by element
    block_iq4_xs b;
    memset(&b, 0, sizeof b);
    b.d = 0x3c00;
    b.scales_h = 0x1234;
    for (int i = 0; i < 4; i++) b.scales_l[i] = (uint8_t)(0x5a + 37 * i);
    for (int i = 0; i < 128; i++) b.qs[i] = (uint8_t)(i * 73 + 11);
    float want[256];
    dequant_row(GGML_TYPE_IQ4_XS, (const uint8_t *)&b, want, 256);
    uint8_t planes[8 * 16 + 8];
    repack_c(GGML_TYPE_IQ4_XS, (const uint8_t *)&b, planes, 1, 8, StepOrder{0, 0, 0}, 8);
    uint32_t hdr[2];
    memcpy(hdr, planes + 8 * 16, 8); // the header plane entry: d, then the 8 scales
    bad = (hdr[0] & 0xffff) != b.d;
    for (int sub = 0; sub < 8; sub++) {
        int ls = iq4_plane_ls(hdr[0], hdr[1], sub);
        for (int k = 0; k < 4; k++) {
            int w, lo, hi;
            memcpy(&w, planes + 16 * sub + 4 * k, 4);
            iq4_lookup8(w, &lo, &hi);
            for (int p = 0; p < 8; p++) {
                int e = p < 4 ? 4 * k + p : 16 + 4 * k + p - 4;
                float v = (float)(ls - 32) * (int8_t)((p < 4 ? lo : hi) >> (8 * (p % 4))); // d = 1
                bad += v != want[32 * sub + e];
            }
        }
    }
    check(bad == 0, "IQ4_XS planes (repack_c) + iq4_lookup8 give the file's 256 values");
    // IQ4_NL: 3 blocks of 32, the same qs plane words, d in a plane of its own
    block_iq4_nl nl[3];
    for (int i = 0; i < 3; i++) {
        nl[i].d = (uint16_t)(0x3c00 + 0x0400 * i); // 1, 2, 4: exact products
        for (int j = 0; j < 16; j++) nl[i].qs[j] = (uint8_t)(j * 37 + 91 * i + 5);
    }
    float want_nl[96];
    dequant_row(GGML_TYPE_IQ4_NL, (const uint8_t *)nl, want_nl, 96);
    uint8_t pnl[3 * 18];
    repack_c(GGML_TYPE_IQ4_NL, (const uint8_t *)nl, pnl, 3, 3, StepOrder{0, 0, 0}, 3);
    bad = 0;
    for (int g = 0; g < 3; g++) {
        uint16_t d;
        memcpy(&d, pnl + 48 + 2 * g, 2);
        bad += d != nl[g].d;
        for (int k = 0; k < 4; k++) {
            int w, lo, hi;
            memcpy(&w, pnl + 16 * g + 4 * k, 4);
            iq4_lookup8(w, &lo, &hi);
            for (int p = 0; p < 8; p++) {
                int e = p < 4 ? 4 * k + p : 16 + 4 * k + p - 4;
                float v = fp16_to_f32(d) * (int8_t)((p < 4 ? lo : hi) >> (8 * (p % 4)));
                bad += v != want_nl[32 * g + e];
            }
        }
    }
    check(bad == 0, "IQ4_NL planes (repack_c) + iq4_lookup8 give the file's 96 values");
}

// The planes' step order (qwen.cu section 6) on the host: so_slot puts every unit of a tensor in
// a slot of its own, in the order (step, warp) of the launch, for runs and tensor bounds of every
// kind; and repack_c in step order holds each sub-block's bytes (quants and every per-type plane)
// at plane_g(row, u), the same bytes as row by row at row * n_sub + u.
// The bytes of sub-block g in every plane of a tensor with NB sub-blocks, concatenated.
static int plane_record(int type, const uint8_t *p, size_t NB, size_t g, uint8_t *rec) {
    int n = 0;
    if (type == GGML_TYPE_Q8_0) memcpy(rec + n, p + 32 * g, 32), n += 32; // 32 bytes of quants
    else memcpy(rec + n, p + 16 * g, 16), n += 16;
    switch (type) {
    case GGML_TYPE_Q4_0: case GGML_TYPE_IQ4_NL: memcpy(rec + n, p + 16 * NB + 2 * g, 2), n += 2; break;
    case GGML_TYPE_Q4_1: memcpy(rec + n, p + 16 * NB + 4 * g, 4), n += 4; break;
    case GGML_TYPE_Q5_0:
        memcpy(rec + n, p + 16 * NB + 4 * g, 4), n += 4;
        memcpy(rec + n, p + 20 * NB + 2 * g, 2), n += 2;
        break;
    case GGML_TYPE_Q5_1:
        memcpy(rec + n, p + 16 * NB + 4 * g, 4), n += 4;
        memcpy(rec + n, p + 20 * NB + 4 * g, 4), n += 4;
        break;
    case GGML_TYPE_Q8_0: memcpy(rec + n, p + 32 * NB + 2 * g, 2), n += 2; break;
    case GGML_TYPE_IQ4_XS: memcpy(rec + n, p + 16 * NB + 8 * (g / 8), 8), n += 8; break;
    case GGML_TYPE_Q4_K: memcpy(rec + n, p + 16 * NB + 16 * (g / 8), 16), n += 16; break;
    case GGML_TYPE_Q5_K:
        memcpy(rec + n, p + 16 * NB + 4 * g, 4), n += 4;
        memcpy(rec + n, p + 20 * NB + 16 * (g / 8), 16), n += 16;
        break;
    case GGML_TYPE_Q6_K:
        memcpy(rec + n, p + 16 * NB + 8 * g, 8), n += 8;
        memcpy(rec + n, p + 24 * NB + 16 * (g / 8), 16), n += 16;
        memcpy(rec + n, p + 26 * NB + 2 * (g / 8), 2), n += 2;
        break;
    }
    rec[n++] = (uint8_t)(g % 8); // the place in its super-block (the sub-block's scale index)
    return n;
}
static void random_row(int type, uint8_t *dst, int64_t n_in); // random blocks of a type (below)
static void test_step_order(void) {
    int bad = 0;
    for (int upw = 1; upw <= 9; upw++)
        for (int F = 0; F < 30; F++)
            for (int U = 1; U < 50; U++) {
                StepOrder so = {upw, F, U};
                char *seen = (char *)calloc(U, 1);
                unsigned prev = 0;
                for (int k = 0, first = 1; k < upw; k++) // by step, then warp: slots 0, 1, 2, ...
                    for (int w = F / upw; w <= (F + U - 1) / upw; w++) {
                        int c = w * upw + k - F;
                        if (c < 0 || c >= U) continue;
                        unsigned q = so_slot(so, c);
                        bad += q >= (unsigned)U || seen[q] || (!first && q != prev + 1) || (first && q != 0);
                        if (q < (unsigned)U) seen[q] = 1;
                        prev = q, first = 0;
                    }
                free(seen);
            }
    report(bad == 0, "step order: so_slot is a bijection in (step, warp) order (13230 run layouts)", bad, 0);
    const int types[] = {GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0,
                         GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K};
    bad = 0;
    for (int ti = 0; ti < 10; ti++) {
        int type = types[ti], n_in = 2048, n_out = 24, n_sub = n_in / 32;
        size_t rb = row_bytes(type, n_in), NB = (size_t)n_sub * n_out, nblk = rb * n_out / TYPE_TRAITS[type].type_size;
        uint8_t *w = (uint8_t *)xmalloc(rb * n_out, "a test"), *rows = (uint8_t *)xmalloc(rb * n_out, "a test"), *steps = (uint8_t *)xmalloc(rb * n_out, "a test");
        for (int r = 0; r < n_out; r++) random_row(type, w + r * rb, n_in);
        StepOrder so = {5, 3, n_out / MV_ROWS * (n_sub / 32)}; // 12 units from unit 3 of runs of 5
        repack_c(type, w, rows, nblk, NB, StepOrder{0, 0, 0}, n_sub);
        repack_c(type, w, steps, nblk, NB, so, n_sub);
        for (int r = 0; r < n_out; r++)
            for (int u = 0; u < n_sub; u++) {
                uint8_t a[64], b[64];
                int na = plane_record(type, rows, NB, (size_t)r * n_sub + u, a);
                int nb = plane_record(type, steps, NB, plane_g(so, r, u, n_sub), b);
                bad += na != nb || memcmp(a, b, na);
            }
        bad += plane_g(so, 0, 0, n_sub) == 0; // unit 0 is warp 0's step 3: not slot 0 (the order is not the identity)
        free(w); free(rows); free(steps);
    }
    report(bad == 0, "step order: repack_c's planes hold every sub-block at plane_g (10 fast types)", bad, 0);
}

// The decode attention's cut of the keys (att_cut, att_chunk): the promises its kernel relies on, for
// every position up to 4200 keys, every split count and the chunk sizes of head dims 32..512.
static void test_att_cut(void) {
    int bad = 0;
    for (int hd = 32; hd <= 512; hd += 32) {
        int c = att_chunk(hd);
        // a multiple of 8 (float4 score rows), at least the shortest chunk, K and V fit the staging
        bad += c % 8 != 0 || c < ATT_MIN_CHUNK || c * hd > 8192 || c * hd / 8 > ATT_STAGE * ATT_THREADS;
    }
    report(bad == 0, "attention: att_chunk(hd) for head dims 32..512 (multiple of 8, fits the staging)", bad, 0);
    bad = 0;
    const int chunks[] = {64, 40, 32, 16}; // head dims <= 128, 192, 256, 512
    static char seen[4201];
    for (int ci = 0; ci < 4; ci++)
        for (int n_split = 1; n_split <= WARP; n_split++)
            for (int pos = 0; pos < 4200; pos++) {
                AttCut a = att_cut(pos, n_split, chunks[ci]);
                bad += a.ck % 8 != 0 || a.ck < ATT_MIN_CHUNK || a.ck > chunks[ci] || a.ns < 1 || a.ns > n_split;
                memset(seen, 0, pos + 1);
                int last = -1;
                for (int s = 0; s < a.ns; s++) { // each split's chunks, as the kernel walks them
                    int c0 = s * a.cps, c1 = att_split_end(a, s);
                    bad += c0 >= c1; // every split up to ns has a chunk
                    for (int c = c0; c < c1; c++) {
                        int t0 = c * a.ck, nt = att_chunk_len(a, pos, c);
                        bad += nt < 1;
                        for (int t = t0; t < t0 + nt; t++) bad += t > pos || seen[t]++;
                        if (t0 + nt - 1 == pos) last = s;
                    }
                }
                for (int t = 0; t <= pos; t++) bad += !seen[t];
                bad += last != a.ns - 1; // the own block (the last split) holds key pos
            }
    report(bad == 0, "attention: att_cut covers keys 0..pos once, splits <= n_split, the last holds pos (4 chunk sizes, "
                     "1..32 splits, pos < 4200)", bad, 0);
}

// =================================================================================================
// C dequantizers on hand-built blocks (values worked out from the format descriptions)
// =================================================================================================
static void test_dequantizers(void) {
    float y[256];
    uint16_t half_one = 0x3c00, half_half = 0x3800, half_two = 0x4000; // 1.0, 0.5, 2.0
    {
        block_q4_0 b;
        b.d = half_half;
        for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)(j | ((15 - j) << 4));
        dequant_row(GGML_TYPE_Q4_0, &b, y, 32);
        check(y[0] == -4.0f && y[15] == 3.5f && y[16] == 3.5f && y[31] == -4.0f, "dequant Q4_0");
    }
    {
        block_q4_1 b;
        b.d = half_two; b.m = half_one;
        for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)(j | (j << 4));
        dequant_row(GGML_TYPE_Q4_1, &b, y, 32);
        check(y[0] == 1.0f && y[5] == 11.0f && y[21] == 11.0f, "dequant Q4_1");
    }
    {
        block_q5_0 b;
        b.d = half_one;
        uint32_t qh = 0x80000001u; // element 0 and element 31 get the fifth bit
        memcpy(b.qh, &qh, 4);
        memset(b.qs, 0, 16);
        b.qs[15] = 0xf0;
        dequant_row(GGML_TYPE_Q5_0, &b, y, 32);
        check(y[0] == 0.0f && y[1] == -16.0f && y[31] == 15.0f, "dequant Q5_0");
    }
    {
        block_q5_1 b;
        b.d = half_one; b.m = half_half;
        uint32_t qh = 1u << 16; // element 16
        memcpy(b.qh, &qh, 4);
        memset(b.qs, 0x11, 16);
        dequant_row(GGML_TYPE_Q5_1, &b, y, 32);
        check(y[0] == 1.5f && y[16] == 17.5f && y[17] == 1.5f, "dequant Q5_1");
    }
    {
        block_q8_0 b;
        b.d = half_half;
        for (int j = 0; j < 32; j++) b.qs[j] = (int8_t)(j - 16);
        dequant_row(GGML_TYPE_Q8_0, &b, y, 32);
        check(y[0] == -8.0f && y[31] == 7.5f, "dequant Q8_0");
    }
    {
        block_iq4_nl b;
        b.d = half_one;
        for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)(j | ((15 - j) << 4));
        dequant_row(GGML_TYPE_IQ4_NL, &b, y, 32);
        check(y[0] == -127.0f && y[8] == 1.0f && y[16] == 113.0f, "dequant IQ4_NL");
    }
    {
        block_iq4_xs b;
        b.d = half_one;
        // sub-block 0: ls = 33 (scale +1); sub-block 1: ls = 31 (-1); sub-block 7: ls = 63 (+31)
        b.scales_l[0] = (uint8_t)(1 | (15 << 4)); // ib0 low = 1, ib1 low = 15
        b.scales_l[1] = b.scales_l[2] = 0;
        b.scales_l[3] = (uint8_t)(15 << 4);       // ib7 low = 15
        b.scales_h = (uint16_t)(2 | (1 << 2) | (3 << 14)); // ib0 high 2, ib1 high 1, ib7 high 3
        for (int j = 0; j < 128; j++) b.qs[j] = 0x8f; // low nibble 15 -> 113, high 8 -> 1
        dequant_row(GGML_TYPE_IQ4_XS, &b, y, 256);
        check(y[0] == 113.0f && y[16] == 1.0f && y[32] == -113.0f && y[255] == 31.0f, "dequant IQ4_XS");
    }
    {
        block_q4_K b;
        b.d = half_one; b.dmin = half_half;
        memset(b.scales, 0, 12);
        b.scales[0] = 2;                   // sub 0: scale 2
        b.scales[4] = 3;                   // sub 0: min 3
        b.scales[1] = 5;                   // sub 1: scale 5, min 0
        b.scales[11] = (uint8_t)(7 | (1 << 4)); // sub 7: scale low 7, min low 1
        b.scales[3] |= (uint8_t)(1 << 6);  // sub 7: scale high bits 1 -> 7 | 16 = 23
        for (int j = 0; j < 128; j++) b.qs[j] = (uint8_t)(1 | (2 << 4));
        dequant_row(GGML_TYPE_Q4_K, &b, y, 256);
        // sub0: 1*2*1 - 0.5*3 = 0.5; sub1: 1*5*2 - 0 = 10; sub7 (chunk 3 high): 1*23*2 - 0.5*1 = 45.5
        check(y[0] == 0.5f && y[32] == 10.0f && y[255] == 45.5f, "dequant Q4_K");
    }
    {
        block_q5_K b;
        b.d = half_one; b.dmin = 0;
        memset(b.scales, 0, 12);
        b.scales[0] = 1; b.scales[1] = 1;
        memset(b.qh, 0, 32);
        b.qh[3] = 2;                       // bit 1: element 3 of sub-block 1 gets +16
        memset(b.qs, 0x21, 128);
        dequant_row(GGML_TYPE_Q5_K, &b, y, 256);
        check(y[3] == 1.0f && y[35] == 18.0f && y[36] == 2.0f, "dequant Q5_K");
    }
    {
        block_q6_K b;
        b.d = half_half;
        for (int i = 0; i < 16; i++) b.scales[i] = (int8_t)(i + 1);
        memset(b.ql, 0, 128);
        memset(b.qh, 0, 64);
        b.ql[0] = 0x0f;  // element 0: low 15
        b.qh[0] = 0x03;  // element 0: high 3 -> q = 63 - 32 = 31
        b.ql[32] = 0xf0; // element 96 (q4 of l=0): low 15
        dequant_row(GGML_TYPE_Q6_K, &b, y, 256);
        // y[0] = 0.5*1*31; y[1] = 0.5*1*(-32); y[96] = 0.5*sc[6]*(15-32) = 0.5*7*(-17)
        check(y[0] == 15.5f && y[1] == -16.0f && y[96] == -59.5f && y[128] == 0.5f * 9 * -32, "dequant Q6_K");
    }
    {
        uint16_t hv[3] = {half_one, half_half, 0xc000};
        dequant_row(GGML_TYPE_F16, hv, y, 3);
        uint16_t bv[2] = {0x3f80, 0x4040};
        float z[2];
        dequant_row(GGML_TYPE_BF16, bv, z, 2);
        check(y[0] == 1.0f && y[1] == 0.5f && y[2] == -2.0f && z[0] == 1.0f && z[1] == 3.0f, "dequant F16 / BF16");
    }
}

// Every dequantizer on random blocks against a decoder written here, element by element, straight
// from the block layouts (qwen.cu section 3): element e's quant bits, its sub-block's scale and
// min, found by index arithmetic rather than by the loops of the engine's dequantizers.
static int bits_at(const uint8_t *p, int bit, int n) { // n <= 8 bits starting at bit `bit` of byte array p
    int v = 0;
    for (int i = 0; i < n; i++) v |= ((p[(bit + i) / 8] >> ((bit + i) % 8)) & 1) << i;
    return v;
}
static float h16(const uint8_t *p) { uint16_t h; memcpy(&h, p, 2); return fp16_to_f32(h); } // an fp16 field
static const int8_t IQ4NL_VALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
// the bit where element e (< 32) of a 16-byte nibble array starts: elements 0..15 in the low
// nibbles of bytes 0..15, 16..31 in their high nibbles
static int nibble_bit(int e) { return 8 * (e % 16) + 4 * (e / 16); }
static float spec_value(int type, const uint8_t *blk, int e) {
    float d = 0, m = 0;
    switch (type) {
    case GGML_TYPE_Q4_0: { // d, 16 bytes: element j < 16 in the low nibble of byte j, j + 16 in its high one
        d = h16(blk);
        return d * (bits_at(blk + 2, nibble_bit(e), 4) - 8);
    }
    case GGML_TYPE_Q4_1:
        d = h16(blk), m = h16(blk + 2);
        return d * bits_at(blk + 4, nibble_bit(e), 4) + m;
    case GGML_TYPE_Q5_0: // d, qh (bit e: element e's fifth bit), qs as Q4_0
        d = h16(blk);
        return d * ((bits_at(blk + 6, nibble_bit(e), 4) | bits_at(blk + 2, e, 1) << 4) - 16);
    case GGML_TYPE_Q5_1:
        d = h16(blk), m = h16(blk + 2);
        return d * (bits_at(blk + 8, nibble_bit(e), 4) | bits_at(blk + 4, e, 1) << 4) + m;
    case GGML_TYPE_Q8_0:
        return h16(blk) * (int8_t)blk[2 + e];
    case GGML_TYPE_IQ4_NL:
        return h16(blk) * IQ4NL_VALUES[bits_at(blk + 2, nibble_bit(e), 4)];
    case GGML_TYPE_IQ4_XS: { // d, scales_h (2 bits per sub-block), scales_l (4 bits per sub-block), qs
        int ib = e / 32, ls = bits_at(blk + 4, 4 * ib, 4) | bits_at(blk + 2, 2 * ib, 2) << 4;
        int q = bits_at(blk + 8 + 16 * ib, nibble_bit(e % 32), 4);
        return h16(blk) * (ls - 32) * IQ4NL_VALUES[q];
    }
    case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: {
        // 8 sub-blocks of 32; scales: 12 bytes, sub-block j < 4: scale = bits 0-5 of byte j, min = bits
        // 0-5 of byte j+4; j >= 4: scale = low 4 bits of byte j+4, then the top 2 bits of byte j-4;
        // min = high 4 bits of byte j+4, then the top 2 bits of byte j. qs: 64 elements per 32 bytes,
        // the first 32 in the low nibbles. Q5_K: qh bit j of byte l is element l of sub-block j's 5th bit.
        const uint8_t *sc = blk + 4, *qs = blk + (type == GGML_TYPE_Q5_K ? 48 : 16), *qh = blk + 16;
        int j = e / 32, l = e % 32, scale, mn;
        if (j < 4) scale = bits_at(sc, 8 * j, 6), mn = bits_at(sc, 8 * (j + 4), 6);
        else scale = bits_at(sc, 8 * (j + 4), 4) | bits_at(sc, 8 * (j - 4) + 6, 2) << 4,
             mn = bits_at(sc, 8 * (j + 4) + 4, 4) | bits_at(sc, 8 * j + 6, 2) << 4;
        int q = bits_at(qs, 8 * (32 * (j / 2) + l) + 4 * (j % 2), 4);
        if (type == GGML_TYPE_Q5_K) q |= bits_at(qh, 8 * l + j, 1) << 4;
        d = h16(blk), m = h16(blk + 2);
        return d * scale * q - m * mn;
    }
    case GGML_TYPE_Q6_K: { // ql 128, qh 64, scales 16 (int8), d. Two halves of 128; in a half, quarter k
                           // of 32: low 4 bits from ql[l + 32 (k % 2)] (low nibble for k < 2), high 2
                           // bits from qh[l] bits 2k; scale 16 elements: scales[8 h + l / 16 + 2 k]
        int h = e / 128, k = e % 128 / 32, l = e % 32;
        int lo = bits_at(blk + 64 * h + 32 * (k % 2) + l, 4 * (k / 2), 4), hi = bits_at(blk + 128 + 32 * h + l, 2 * k, 2);
        return h16(blk + 208) * (int8_t)blk[192 + 8 * h + l / 16 + 2 * k] * ((lo | hi << 4) - 32);
    }
    }
    return NAN;
}
static void test_dequant_spec(void) {
    const int types[] = {GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0,
                         GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K};
    uint64_t r = 0xb10c5eedull;                     // its own random stream
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        int type = types[ti], qk = TYPE_TRAITS[type].blck, ts = TYPE_TRAITS[type].type_size;
        uint8_t blk[256];
        float y[256];
        double e = 0;
        for (int it = 0; it < 200; it++) {
            for (int i = 0; i < ts; i++) blk[i] = (uint8_t)(rng_u32(&r) >> 24);
            // the fp16 scales: finite, between 2^-8 and 2^3 in size, either sign
            int at[2] = {type == GGML_TYPE_Q6_K ? 208 : 0, 2};
            int n_scales = type == GGML_TYPE_Q4_1 || type == GGML_TYPE_Q5_1 || type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q5_K ? 2 : 1;
            for (int k = 0; k < n_scales; k++) {
                uint16_t h = f32_to_fp16_bits((rng_f32(&r) < 0.5f ? -1.0f : 1.0f) * ldexpf(1.0f + rng_f32(&r), -8 + (int)(rng_f32(&r) * 11)));
                memcpy(blk + at[k], &h, 2);
            }
            for (int i = 0; i < qk; i++) y[i] = NAN; // an element the dequantizer skips fails
            dequant_row(type, blk, y, qk);
            double amax = 0;
            for (int i = 0; i < qk; i++) amax = fmax(amax, fabs(spec_value(type, blk, i)));
            for (int i = 0; i < qk; i++) e = worse(e, fabs(y[i] - spec_value(type, blk, i)) / (amax + 1e-30));
        }
        char name[160];
        snprintf(name, sizeof name, "dequant %s: 200 random blocks vs the layout decoded element by element: max|d|/amax", type_name(type));
        report(e <= 1e-6, name, e, 1e-6);
    }
}

// =================================================================================================
// Fixture models: logits against the exact reference
// =================================================================================================
typedef struct {
    char name[32];  // "text", "chat", "random", "long"
    int *ids;
    int n;
} Seq;
static Seq SEQS[4];
static int n_seqs = 0;

static void load_seqs(void) {
    const char *names[] = {"text", "chat", "random", "long"};
    for (int i = 0; i < 4; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/seqs/seq-%s.ids", DATA, names[i]);
        char check_name[64];
        snprintf(check_name, sizeof check_name, "fixture sequence seq-%s", names[i]);
        if (!need_fixture(path, check_name)) continue;
        char *s = read_file(path, NULL);
        if (!s) { check(0, check_name); continue; }
        snprintf(SEQS[n_seqs].name, sizeof SEQS[0].name, "%s", names[i]);
        SEQS[n_seqs].n = parse_ids("seq", s, &SEQS[n_seqs].ids);
        n_seqs++;
        free(s);
    }
}

// Models under test/data/tiny-*/: returns a malloc'd list of "dir/model-type" stems.
typedef struct {
    char dir[256];
    char model[64]; // tiny-qwen3
    char type[32];  // q4_0
} ModelFile;

static int list_models(ModelFile *out, int cap, int report_missing) {
    int n = 0;
    const char *dirs[] = {"tiny-qwen2", "tiny-qwen3", "tiny-qwen3-tied", "tiny-qwen35"};
    for (int d = 0; d < 4; d++) {
        char dpath[300];
        snprintf(dpath, sizeof dpath, "%s/%s", DATA, dirs[d]);
        char check_name[64];
        snprintf(check_name, sizeof check_name, "fixture models %s", dirs[d]);
        if (report_missing ? !need_fixture(dpath, check_name) : access(dpath, R_OK) != 0) continue;
        DIR *dir = opendir(dpath);
        if (!dir) { if (report_missing) check(0, check_name); continue; }
        int n_before = n;
        struct dirent *e;
        while ((e = readdir(dir)) && n < cap) {
            size_t l = strlen(e->d_name);
            if (l < 6 || strcmp(e->d_name + l - 5, ".gguf") != 0) continue;
            // name = <model>-<type>.gguf, model = the directory name
            size_t ml = strlen(dirs[d]);
            if (strncmp(e->d_name, dirs[d], ml) != 0 || e->d_name[ml] != '-') continue;
            ModelFile *m = &out[n++];
            snprintf(m->dir, sizeof m->dir, "%s", dpath);
            snprintf(m->model, sizeof m->model, "%s", dirs[d]);
            snprintf(m->type, sizeof m->type, "%.*s", (int)(l - 5 - ml - 1), e->d_name + ml + 1);
        }
        closedir(dir);
        if (n == n_before && report_missing) { // a directory without models: as missing as no directory
            if (SUBSET) skip(check_name, "no model of it in this subset run");
            else { printf("FAIL %-64s (no .gguf in %s)\n", check_name, dpath); n_fail++; }
        }
    }
    // stable order: by model then type
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0; j--) {
            int c = strcmp(out[j - 1].model, out[j].model);
            if (c < 0 || (c == 0 && strcmp(out[j - 1].type, out[j].type) <= 0)) break;
            ModelFile t = out[j]; out[j] = out[j - 1]; out[j - 1] = t;
        }
    return n;
}

static int is_float_type(const char *type) { return !strcmp(type, "f32") || !strcmp(type, "f16") || !strcmp(type, "bf16"); }

static double stddev(const float *v, size_t n) {
    double s = 0, s2 = 0;
    for (size_t i = 0; i < n; i++) { s += v[i]; s2 += (double)v[i] * v[i]; }
    double m = s / n;
    return sqrt(s2 / n - m * m);
}

// KL(softmax(p_logits) || softmax(q_logits)) in double
static double kl_div(const float *p, const float *q, int n) {
    double mp = -INFINITY, mq = -INFINITY;
    for (int i = 0; i < n; i++) { mp = fmax(mp, p[i]); mq = fmax(mq, q[i]); }
    double sp = 0, sq = 0;
    for (int i = 0; i < n; i++) { sp += exp(p[i] - mp); sq += exp(q[i] - mq); }
    double lsp = log(sp), lsq = log(sq), kl = 0;
    for (int i = 0; i < n; i++) {
        double lp = p[i] - mp - lsp, lq = q[i] - mq - lsq;
        kl += exp(lp) * (lp - lq);
    }
    return kl;
}

// llama.cpp's distance from the exact reference for (model, type, seq), from the yardstick file
static double yardstick_kl(const char *model, const char *type, const char *seq) {
    static char *text = NULL;
    if (!text) {
        char path[512];
        snprintf(path, sizeof path, "%s/llamacpp-yardstick.jsonl", DATA);
        text = read_file(path, NULL);
        if (!text) return NAN;
    }
    char key[256];
    snprintf(key, sizeof key, "\"model\": \"%s\", \"type\": \"%s\", \"seq\": \"%s\"", model, type, seq);
    const char *p = strstr(text, key);
    if (!p) return NAN;
    const char *k = strstr(p, "\"kl_mean\": ");
    return k ? atof(k + 11) : NAN;
}

// greedy.jsonl: the exact model's greedy 32-token continuation after seq-text
static int greedy_ref(const char *model, const char *type, int *out) {
    static char *text = NULL;
    if (!text) {
        char path[512];
        snprintf(path, sizeof path, "%s/greedy.jsonl", DATA);
        text = read_file(path, NULL);
        if (!text) return 0;
    }
    char key[256];
    snprintf(key, sizeof key, "{\"model\":\"%s\",\"type\":\"%s\",\"greedy32_after_text\":[", model, type);
    const char *p = strstr(text, key);
    if (!p) return 0;
    p += strlen(key);
    int n = 0;
    while (*p && *p != ']' && n < 64) {
        out[n++] = (int)strtol(p, (char **)&p, 10);
        if (*p == ',') p++;
    }
    return n;
}

// Run one sequence through an engine from position 0 and compare with the reference file.
typedef struct { double max_over_std, kl_mean; double top1; int ok; } SeqResult;

// tok: (n, V) where the logits are kept, or NULL
static SeqResult run_seq(Engine *e, const Seq *s, const float *ref, size_t ref_n, float *tok) {
    SeqResult r = {0, 0, 0, 0};
    int V = e->m->c.n_vocab;
    if (ref_n != (size_t)s->n * V) return r;
    double sd = stddev(ref, ref_n), maxd = 0, kl = 0;
    int top = 0;
    for (int i = 0; i < s->n; i++) {
        float *lg = engine_forward(e, s->ids[i], i);
        if (tok) memcpy(tok + (size_t)i * V, lg, (size_t)V * 4);
        const float *rf = ref + (size_t)i * V;
        for (int j = 0; j < V; j++) maxd = worse(maxd, fabs((double)lg[j] - rf[j]));
        kl += kl_div(rf, lg, V);
        top += argmax(lg, V) == argmax(rf, V);
    }
    r.max_over_std = maxd / sd;
    r.kl_mean = kl / s->n;
    r.top1 = (double)top / s->n;
    r.ok = 1;
    return r;
}

// The sequence as one prompt through engine_eval (batched on the GPU, -b rows at a time): mean KL
// against the reference and against the token-by-token logits tok (n, V), and top-1 agreement with tok.
typedef struct { float *buf; int V; } Collect;
static void collect_logits(void *ctx, int i, const float *lg) {
    Collect *c = (Collect *)ctx;
    memcpy(c->buf + (size_t)i * c->V, lg, (size_t)c->V * 4);
}
static void run_seq_prompt(Engine *e, const Seq *s, const float *ref, const float *tok, double *kl_ref, double *kl_tok,
                           double *top1) {
    int V = e->m->c.n_vocab;
    Collect c = {(float *)xmalloc((size_t)s->n * V * 4, "a test"), V};
    engine_eval(e, s->ids, s->n, 0, 0, collect_logits, &c);
    double a = 0, b = 0;
    int same = 0;
    for (int i = 0; i < s->n; i++) {
        const float *lg = c.buf + (size_t)i * V;
        a += kl_div(ref + (size_t)i * V, lg, V);
        b += kl_div(tok + (size_t)i * V, lg, V);
        same += argmax(lg, V) == argmax(tok + (size_t)i * V, V);
    }
    *kl_ref = a / s->n;
    *kl_tok = b / s->n;
    *top1 = (double)same / s->n;
    free(c.buf);
}

static void greedy_continuation(Engine *e, const Seq *text, int *out, int n) {
    float *lg = NULL;
    for (int i = 0; i < text->n; i++) lg = engine_forward(e, text->ids[i], i);
    for (int i = 0; i < n; i++) {
        out[i] = argmax(lg, e->m->c.n_vocab);
        if (i + 1 < n) lg = engine_forward(e, out[i], text->n + i);
    }
}

static void test_models(int use_gpu) {
    static ModelFile mf[128];
    int nm = list_models(mf, 128, !use_gpu); // a missing directory is reported once, by the CPU pass
    if (nm == 0) {
        if (SUBSET) skip("fixture models under test/data", "none in this subset run");
        else check(0, "fixture models found under test/data");
        return;
    }
    char gpath[512];
    snprintf(gpath, sizeof gpath, "%s/greedy.jsonl", DATA);
    int have_greedy = use_gpu || need_fixture(gpath, "fixture greedy.jsonl (the greedy references)");
    // the fixture set is 31 files (4 directories); one gone would only drop its checks
    if (!use_gpu && !SUBSET) report(nm == 31, "fixture models: the 31 .gguf files of test/data (missing)", 31 - nm, 0);
    const char *dev = use_gpu ? "gpu" : "cpu";
    for (int i = 0; i < nm; i++) {
        char path[600], name[200];
        if (use_gpu && !HAVE_GPU) {
            snprintf(name, sizeof name, "gpu KL %s-%s, every sequence, and greedy", mf[i].model, mf[i].type);
            skip(name, "no GPU");
            continue;
        }
        snprintf(path, sizeof path, "%s/%s-%s.gguf", mf[i].dir, mf[i].model, mf[i].type);
        Model m;
        model_open(&m, path);
        Engine e, eb;
        engine_init(&e, &m, use_gpu, 512); // prompts in one batch of up to 512 rows
        if (use_gpu) {                     // and in batches of 5: rows carried across batches
            g_n_batch = 5;
            engine_init(&eb, &m, use_gpu, 512);
            g_n_batch = 512;
        }
        for (int s = 0; s < n_seqs; s++) {
            snprintf(path, sizeof path, "%s/%s-%s-%s.f32", mf[i].dir, mf[i].model, mf[i].type, SEQS[s].name);
            size_t rn;
            // every file has references for text, chat and random; "long" only some (fixtures README)
            if (strcmp(SEQS[s].name, "long") != 0) {
                snprintf(name, sizeof name, "%s reference %s-%s %s", dev, mf[i].model, mf[i].type, SEQS[s].name);
                if (!need_fixture(path, name)) continue;
            }
            float *ref = read_f32(path, &rn);
            if (!ref) continue; // a "long" reference this file does not have
            int V = m.c.n_vocab;
            float *tok = use_gpu ? (float *)xmalloc((size_t)SEQS[s].n * V * 4, "a test") : NULL;
            SeqResult r = run_seq(&e, &SEQS[s], ref, rn, tok);
            if (use_gpu && r.ok) { // fp16 operands in the products but for F32's (qwen.cu section 8)
                double tol = !strcmp(mf[i].type, "f32") ? 5e-5 : is_float_type(mf[i].type) ? 2e-4 : 1e-3;
                for (int b = 0; b < 2; b++) {
                    double kr, kt, t1;
                    run_seq_prompt(b ? &eb : &e, &SEQS[s], ref, tok, &kr, &kt, &t1);
                    snprintf(name, sizeof name, "gpu prefill -b %d KL %s-%s %s vs token by token (top1 %.0f%%)",
                             b ? 5 : 512, mf[i].model, mf[i].type, SEQS[s].name, 100 * t1);
                    report(kt <= tol, name, kt, tol);
                    snprintf(name, sizeof name, "gpu prefill -b %d KL %s-%s %s vs reference", b ? 5 : 512, mf[i].model,
                             mf[i].type, SEQS[s].name);
                    report(kr <= tol, name, kr, tol);
                }
            }
            free(tok);
            free(ref);
            if (!use_gpu) {
                snprintf(name, sizeof name, "cpu logits %s-%s %s: max|d|/std", mf[i].model, mf[i].type, SEQS[s].name);
                report(r.ok && r.max_over_std <= 2e-4, name, r.ok ? r.max_over_std : NAN, 2e-4); // measured <= 4.1e-5
            } else {
                double tol = is_float_type(mf[i].type) ? 5e-5 : 1e-3;
                double yard = yardstick_kl(mf[i].model, mf[i].type, SEQS[s].name);
                snprintf(name, sizeof name, "gpu KL %s-%s %s (llama.cpp %.2g, top1 %.0f%%)", mf[i].model,
                         mf[i].type, SEQS[s].name, yard, 100 * r.top1);
                report(r.ok && r.kl_mean <= tol, name, r.ok ? r.kl_mean : NAN, tol);
            }
        }
        // nothing is allocated in the token loop: free device memory before and after 40 tokens, and
        // no cudaMalloc / cudaMallocHost call among them (one freed again would not show in the first)
        if (use_gpu && i == 0) {
            size_t f0, f1, tot;
            long a0 = g_n_alloc;
            CUDA_CHECK(cudaMemGetInfo(&f0, &tot));
            for (int t = 0; t < 40; t++) engine_forward(&e, 1 + t, t);
            CUDA_CHECK(cudaMemGetInfo(&f1, &tot));
            report(f0 == f1, "gpu: no device memory allocated in the token loop (40 tokens): bytes", (double)f0 - (double)f1, 0);
            report(g_n_alloc == a0, "gpu: no cudaMalloc / cudaMallocHost in the token loop (40 tokens): calls", (double)(g_n_alloc - a0), 0);
        }
        // greedy continuation after seq-text: required on the CPU (the reference's arithmetic, so only a
        // bug changes a token) and for f32 files on the GPU; reported for the GPU's quantized files,
        // whose 16-bit activations may flip a near tie
        int ref32[64], got[64];
        int nref = greedy_ref(mf[i].model, mf[i].type, ref32);
        if (have_greedy && !strcmp(mf[i].type, "f32") && nref != 32) { // required: the reference must be there
            snprintf(name, sizeof name, "%s greedy 32 %s-%s: reference in greedy.jsonl", dev, mf[i].model, mf[i].type);
            check(0, name);
        }
        if (nref > 0 && n_seqs > 0 && !strcmp(SEQS[0].name, "text")) {
            greedy_continuation(&e, &SEQS[0], got, nref);
            int same = 0;
            while (same < nref && got[same] == ref32[same]) same++;
            snprintf(name, sizeof name, "%s greedy 32 %s-%s: tokens before first difference", dev, mf[i].model, mf[i].type);
            if (!use_gpu || !strcmp(mf[i].type, "f32") || same == nref) report(same == nref, name, nref - same, 0);
            else printf("info %-64s %d of %d equal (not required for quantized files)\n", name, same, nref);
        }
        engine_free(&e);
        if (use_gpu) engine_free(&eb);
        gguf_close(&m.gguf);
    }
}

// =================================================================================================
// The form of the sources: what the reader of qwen.cu and the README is promised
// =================================================================================================
// Lines of qwen.cu at most 100 columns (UTF-8 characters), no environment reads or measurement
// hooks in the engine, at least 15 % comment-only lines, every __global__ kernel's comment naming its
// C twin (or why it has none), the README at most 300 lines, and every function its reading map
// names defined in qwen.cu or tokenizer.c.
// Is name defined in src: "name(" as a whole word on a line that starts in column 0 with a
// letter or '_' (the sources write every definition so; calls are indented, comments start '//').
static int defined_in(const char *src, const char *name) {
    size_t n = strlen(name);
    for (const char *p = strstr(src, name); p; p = strstr(p + 1, name)) {
        if ((p > src && (isalnum((unsigned char)p[-1]) || p[-1] == '_')) || p[n] != '(') continue;
        const char *line = p;
        while (line > src && line[-1] != '\n') line--;
        if (isalpha((unsigned char)*line) || *line == '_') return 1;
    }
    return 0;
}
// The "Speed:" marks of qwen.cu (its header says what they promise): a "// Speed:" line right
// after a section's banner marks the section, right after a subsection's "// --- " title the
// subsection, and as the first line of a top-level comment block (after a blank line) that block
// up to the next such block. Each mark's comment must name test/PERF_NOTES.md and, in quotes, the
// headings there ("## ..." or a bold line) that hold its measurements. Returns the lines marked;
// *n_lines: all lines; *n_marks, *n_stray (marks in no such place), *n_badref (a name not there).
static int line_is_rule(const char *l, size_t n) { // "// ----...": a section's banner rule
    if (n < 20 || strncmp(l, "// ----", 7)) return 0;
    for (size_t i = 3; i < n; i++)
        if (l[i] != '-') return 0;
    return 1;
}
static int speed_marks(const char *src, const char *notes, int *n_lines, int *n_marks,
                       int *n_stray, int *n_badref) {
    int cap = 1 << 14, n = 0;
    const char **ln = (const char **)xmalloc(cap * sizeof *ln, "lines");
    size_t *len = (size_t *)xmalloc(cap * sizeof *len, "lines");
    for (const char *p = src; *p && n < cap;) {
        const char *e = strchr(p, '\n');
        ln[n] = p;
        len[n] = e ? (size_t)(e - p) : strlen(p);
        n++;
        p += len[n - 1] + (e ? 1 : 0);
    }
#define IS_SUB(i) (len[i] > 8 && !strncmp(ln[i], "// --- ", 7) && ln[i][len[i] - 1] == '-')
#define IS_SECTION(i) ((i) + 2 < n && line_is_rule(ln[i], len[i]) && line_is_rule(ln[(i) + 2], len[(i) + 2]))
    char *marked = (char *)xcalloc(n, 1, "marks");
    *n_marks = *n_stray = *n_badref = 0;
    for (int i = 0; i < n; i++) {
        const char *t = ln[i];
        while (t < ln[i] + len[i] && *t == ' ') t++;
        if (strncmp(t, "// Speed:", 9)) continue;
        (*n_marks)++;
        int a = -1, b = i + 1;
        if (t != ln[i]) { // indented: marks nothing
        } else if (i >= 3 && IS_SECTION(i - 3)) {
            a = i - 3;
            while (b < n && !IS_SECTION(b)) b++;
        } else if (i >= 1 && IS_SUB(i - 1)) {
            a = i - 1;
            while (b < n && !IS_SUB(b) && !IS_SECTION(b)) b++;
        } else if (i >= 1 && len[i - 1] == 0) {
            a = i;
            while (b < n && !IS_SUB(b) && !IS_SECTION(b) &&
                   !(len[b - 1] == 0 && !strncmp(ln[b], "//", 2)))
                b++;
        }
        if (a < 0) {
            (*n_stray)++;
            printf("     a Speed: mark in no place it can mark: line %d\n", i + 1);
            continue;
        }
        for (int k = a; k < b; k++) marked[k] = 1;
        // the mark's comment: its quoted names, each a heading or bold line of the notes
        int refs = 0, bad = 0, notes_named = 0;
        for (int k = i; k < n && !strncmp(ln[k], "//", 2); k++) {
            char line[256];
            snprintf(line, sizeof line, "%.*s", (int)len[k], ln[k]);
            if (strstr(line, "test/PERF_NOTES.md")) notes_named = 1;
            for (char *q = strchr(line, '"'); q; q = strchr(q + 1, '"')) {
                char *q2 = strchr(q + 1, '"');
                if (!q2) break;
                *q2 = 0;
                int found = 0;
                for (const char *h = strstr(notes, q + 1); h && !found; h = strstr(h + 1, q + 1)) {
                    const char *bol = h;
                    while (bol > notes && bol[-1] != '\n') bol--;
                    const char *s = bol;
                    while (*s == '#' || *s == '*' || *s == ' ') s++;
                    found = s == h && (*bol == '#' || !strncmp(bol, "**", 2));
                }
                refs++;
                bad += !found;
                if (!found) printf("     Speed: mark at line %d names \"%s\", no heading of "
                                   "test/PERF_NOTES.md\n", i + 1, q + 1);
                q = q2;
            }
        }
        if (!notes_named || refs == 0 || bad) {
            (*n_badref)++;
            if (!notes_named || refs == 0)
                printf("     Speed: mark at line %d names no heading of test/PERF_NOTES.md\n", i + 1);
        }
    }
#undef IS_SUB
#undef IS_SECTION
    int m = 0;
    for (int i = 0; i < n; i++) m += marked[i];
    *n_lines = n;
    free(marked); free(ln); free(len);
    return m;
}
// Every `identifier` between p and end (README text) that is not a function defined in src (or in
// tok, when given) is printed and counted in *n_missing; *n_named counts them all.
static void check_named_functions(const char *p, const char *end, const char *src, const char *tok,
                                  const char *where, int *n_named, int *n_missing) {
    char name[128];
    for (; p < end; p++) {
        if (*p != '`') continue;
        const char *q = (const char *)memchr(p + 1, '`', end - p - 1);
        if (!q) break;
        size_t n = (size_t)(q - p - 1);
        int ident = n > 0 && n < sizeof name;
        for (size_t i = 0; ident && i < n; i++)
            ident = isalnum((unsigned char)p[1 + i]) || p[1 + i] == '_';
        if (ident) {
            memcpy(name, p + 1, n);
            name[n] = 0;
            (*n_named)++;
            if (!defined_in(src, name) && !(tok && defined_in(tok, name))) {
                (*n_missing)++;
                printf("     the README's %s names '%s', which is not a function here\n", where, name);
            }
        }
        p = q;
    }
}
static void test_source_form(void) {
    char *src = read_file("qwen.cu", NULL), *tok = read_file("tokenizer.c", NULL);
    char *readme = read_file("README.md", NULL);
    if (!src || !tok || !readme) {
        check(0, "source form: qwen.cu, tokenizer.c and README.md readable from the working dir");
        free(src); free(tok); free(readme);
        return;
    }
    // per line: columns, comment-only, and the kernels' comment blocks
    int n_lines = 0, n_wide = 0, n_comment = 0, n_kernels = 0, n_untwinned = 0;
    int block_twin = 0; // the comment block (with templates and #defines) above this line says twin
    for (char *line = src; *line;) {
        char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        int cols = 0;
        for (size_t i = 0; i < len; i++) cols += ((unsigned char)line[i] & 0xc0) != 0x80;
        n_lines++;
        if (cols > 100) n_wide++;
        const char *t = line;
        while (t < line + len && (*t == ' ' || *t == '\t')) t++;
        int comment = t + 1 < line + len && t[0] == '/' && t[1] == '/';
        n_comment += comment;
        if (!strncmp(line, "__global__", 10)) {
            n_kernels++;
            if (!block_twin) {
                n_untwinned++;
                printf("     kernel without its C twin named above it: %.*s\n", (int)len, line);
            }
        }
        if (comment) {
            char save = line[len];
            line[len] = 0;
            if (strstr(line, "twin")) block_twin = 1;
            line[len] = save;
        } else if (!len || (strncmp(line, "template", 8) && strncmp(line, "#define", 7))) {
            block_twin = 0; // a blank line or code ends the comment block
        }
        line += len + (end ? 1 : 0);
    }
    report(n_wide == 0, "source form: qwen.cu lines over 100 columns", n_wide, 0);
    int tok_wide = 0; // tokenizer.c, which qwen.cu includes, is read the same way
    for (char *line = tok; *line;) {
        char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        int cols = 0;
        for (size_t i = 0; i < len; i++) cols += ((unsigned char)line[i] & 0xc0) != 0x80;
        tok_wide += cols > 100;
        line += len + (end ? 1 : 0);
    }
    report(tok_wide == 0, "source form: tokenizer.c lines over 100 columns", tok_wide, 0);
    char name[128];
    snprintf(name, sizeof name, "source form: qwen.cu comment-only lines (%d of %d), share >= 0.15",
             n_comment, n_lines);
    report(n_comment >= 0.15 * n_lines, name, (double)n_comment / n_lines, 0.15);
    const char *banned[] = {"getenv", "PROF(", "KERNEL_MARK", "KERNEL_TRACE"};
    int n_banned = 0;
    for (size_t i = 0; i < sizeof banned / sizeof *banned; i++)
        n_banned += strstr(src, banned[i]) != NULL;
    report(n_banned == 0, "source form: no getenv, PROF(, KERNEL_MARK, KERNEL_TRACE in qwen.cu",
           n_banned, 0);
    snprintf(name, sizeof name, "source form: all %d __global__ kernels name their C twin", n_kernels);
    report(n_kernels > 20 && n_untwinned == 0, name, n_untwinned, 0);
    int readme_lines = 0;
    for (const char *p = readme; *p; p++) readme_lines += *p == '\n';
    report(readme_lines <= 300, "source form: README.md at most 300 lines", readme_lines, 300);
    // the reading map: the table rows after "## Reading qwen.cu", every `identifier` in their C twin
    // and GPU columns (the third and fourth cells) defined in the sources
    const char *map = strstr(readme, "## Reading qwen.cu");
    int n_named = 0, n_missing = 0;
    for (const char *row = map; row && *row; row = strchr(row, '\n') ? strchr(row, '\n') + 1 : NULL) {
        if (row[0] == '#' && row != map) break; // the next section
        if (row[0] != '|' || !strncmp(row, "|---", 4) || !strncmp(row, "| piece", 7)) continue;
        const char *eol = strchr(row, '\n');
        if (!eol) eol = row + strlen(row);
        const char *cells = row; // the row's first '|'; the C twin cell begins after its third
        for (int k = 0; k < 2 && cells; k++)
            cells = (const char *)memchr(cells + 1, '|', eol - cells - 1);
        if (cells) check_named_functions(cells, eol, src, tok, "reading map", &n_named, &n_missing);
    }
    snprintf(name, sizeof name, "source form: the README's reading map, %d names, each a function",
             n_named);
    report(map && n_named > 40 && n_missing == 0, name, n_missing, 0);
    // the README's first reading: every `name` in its paragraph a function, and its line counts
    // those of the marks (within 2 %)
    const char *fr = strstr(readme, "**First reading**");
    const char *fr_end = fr ? strstr(fr, "\n\n") : NULL;
    int fr_named = 0, fr_missing = 0;
    if (fr && fr_end)
        check_named_functions(fr, fr_end, src, NULL, "first reading", &fr_named, &fr_missing);
    snprintf(name, sizeof name, "source form: the README's first reading, %d names, each a function",
             fr_named);
    report(fr && fr_named >= 15 && fr_missing == 0, name, fr_missing, 0);
    char *notes = read_file("test/PERF_NOTES.md", NULL);
    int n_all = 0, n_marks = 0, n_stray = 0, n_badref = 0;
    int n_marked = notes ? speed_marks(src, notes, &n_all, &n_marks, &n_stray, &n_badref) : 0;
    printf("     qwen.cu: %d lines, %d marked \"Speed:\" by %d marks, %d for a first reading\n",
           n_all, n_marked, n_marks, n_all - n_marked);
    snprintf(name, sizeof name, "source form: %d Speed: marks, each where it marks a block and "
             "naming its measurements", n_marks);
    report(notes && n_marks >= 5 && n_stray == 0 && n_badref == 0, name, n_stray + n_badref, 0);
    // "about N of the M lines" in the README's first reading, against the count
    double said_n = 0, said_m = 0;
    const char *ab = fr ? strstr(fr, "(about ") : NULL;
    if (ab && ab < fr_end) {
        char num[2][16] = {"", ""};
        if (sscanf(ab, "(about %15[0-9,] of the %15[0-9,] lines", num[0], num[1]) == 2)
            for (int k = 0; k < 2; k++) {
                double v = 0;
                for (const char *c = num[k]; *c; c++)
                    if (*c != ',') v = 10 * v + (*c - '0');
                (k ? said_m : said_n) = v;
            }
    }
    snprintf(name, sizeof name, "source form: the README's first reading says about %.0f of %.0f "
             "lines (counted: %d of %d)", said_n, said_m, n_all - n_marked, n_all);
    report(said_n > 0 && fabs(said_n - (n_all - n_marked)) <= 0.02 * n_all &&
               fabs(said_m - n_all) <= 0.02 * n_all, name, fabs(said_n - (n_all - n_marked)),
           0.02 * n_all);
    free(notes);
    free(src); free(tok); free(readme);
}

// =================================================================================================
// Sampler
// =================================================================================================
// The sampler's kept set the slow way, as llama.cpp's chain defines it: every candidate sorted
// (logit, then id; ref_sort, once per vector), the first top_k, their softmax, the shortest prefix
// whose mass reaches top_p, then logit >= max + ln(min_p) (the top always). ref_keep writes the
// kept ids and returns their number, -1 for non-finite logits. No cut before the sort: the
// reference of sampler_keep's.
static int ref_sort(const float *logits, int n, Candidate *c /* (n) out */) {
    for (int i = 0; i < n; i++) {
        if (logits[i] != logits[i]) return -1;
        c[i].logit = logits[i];
        c[i].id = i;
    }
    qsort(c, n, sizeof *c, cand_cmp);
    return isfinite(c[0].logit) ? n : -1;
}
static int ref_keep(Candidate *c /* ref_sort's order */, int n, int top_k, float top_p, float min_p,
                    int *ids) {
    if (n < 0) return -1;
    if (top_k > 0 && top_k < n) n = top_k;
    float mx = c[0].logit;
    if (top_p < 1.0f) {
        double sum = 0.0;
        for (int i = 0; i < n; i++) { c[i].p = expf(c[i].logit - mx); sum += c[i].p; }
        for (int i = 0; i < n; i++) c[i].p = (float)(c[i].p / sum);
        double cum = 0.0;
        int m = 0;
        while (m < n) { cum += c[m++].p; if (cum >= top_p) break; }
        n = m;
    }
    if (min_p > 0.0f) {
        float min_logit = mx + logf(min_p);
        int m = 1;
        while (m < n && c[m].logit >= min_logit) m++;
        n = m;
    }
    for (int i = 0; i < n; i++) ids[i] = c[i].id;
    return n;
}

// sampler_keep's set against ref_keep's for one logit vector (sorted by ref_sort into c, n_sorted
// of them or -1) and one setting: 1 when they are the same set. mark (n) is scratch: the
// sampler's ids are marked with a stamp of this call, then every reference id must carry it.
static int keep_matches(const float *logits, int n, Candidate *c, int n_sorted, int top_k,
                        float top_p, float min_p, unsigned *mark, int *ids) {
    static unsigned stamp = 0;
    stamp++;
    Sampler s;
    sampler_init(&s, n, 1.0f, top_k, top_p, min_p, 1);
    float mx;
    int na = sampler_keep(&s, logits, &mx), nb = ref_keep(c, n_sorted, top_k, top_p, min_p, ids);
    for (int i = 0; i < na; i++) mark[s.cand[i].id] = stamp;
    free(s.cand);
    int same = na == nb;
    for (int i = 0; same && i < nb; i++) same = mark[ids[i]] == stamp;
    return same;
}

// The settings the kept-set checks try: every combination of these, the defaults among them.
static const int KEEP_K[] = {0, 5, 40, 1000};
static const float KEEP_P[] = {1.0f, 0.99f, 0.95f, 0.78f, 0.5f};
static const float KEEP_MINP[] = {0.0f, 0.01f, 0.05f, 0.2f};
#define N_KEEP_K (int)(sizeof KEEP_K / sizeof KEEP_K[0])
#define N_KEEP_P (int)(sizeof KEEP_P / sizeof KEEP_P[0])
#define N_KEEP_MINP (int)(sizeof KEEP_MINP / sizeof KEEP_MINP[0])

// The kept set against the reference: 10,000 random logit vectors of five kinds (Gaussian of three
// widths, nearly flat, one peak over a Gaussian, integers with many ties, and any of them with -inf
// entries), each with the defaults (top-k 40, top-p 0.95, min-p 0.05) and four random settings of
// the grid; then every position of the trained models' reference logits (8,193 tokens) with the
// whole grid.
static void test_sampler_keep(void) {
    const int NMAX = 5000;
    float *lg = (float *)xmalloc(NMAX * sizeof(float), "a test");
    unsigned *ia = (unsigned *)calloc(8193, sizeof(unsigned));
    int *ib = (int *)xmalloc(8193 * sizeof(int), "a test");
    Candidate *scr = (Candidate *)xmalloc(8193 * sizeof(Candidate), "a test");
    int tried = 0, bad = 0, first_bad = -1;
    for (int v = 0; v < 10000; v++) {
        int n = v % 10 == 0 ? 1 + (int)(urand() * NMAX) : 1 + (int)(urand() * 600);
        int kind = v % 6;
        float width = kind == 0 ? 0.5f : kind == 1 ? 2.0f : 5.0f;
        for (int i = 0; i < n; i++) {
            float g = nrand();
            lg[i] = kind <= 2 ? width * g
                    : kind == 3 ? 1e-3f * g                         // nearly flat
                    : kind == 4 ? (i == n / 3 ? 12.0f : 2.0f * g)  // one peak
                                : rintf(3.0f * g);                  // integers: ties
        }
        if (v % 7 == 0) // -inf entries (never all of them)
            for (int i = 0; i < n; i++)
                if (i != n / 2 && urand() < 0.3f) lg[i] = -INFINITY;
        int ns = ref_sort(lg, n, scr);
        for (int t = 0; t < 5; t++) {
            int k = t == 0 ? 40 : KEEP_K[(int)(urand() * N_KEEP_K)];
            float tp = t == 0 ? 0.95f : KEEP_P[(int)(urand() * N_KEEP_P)];
            float mp = t == 0 ? 0.05f : KEEP_MINP[(int)(urand() * N_KEEP_MINP)];
            tried++;
            if (!keep_matches(lg, n, scr, ns, k, tp, mp, ia, ib)) {
                if (first_bad < 0) first_bad = v;
                bad++;
            }
        }
    }
    char name[160];
    snprintf(name, sizeof name, "sampler: kept set = full-sort reference, %d random vectors x settings (bad; first %d)",
             tried, first_bad);
    report(bad == 0, name, bad, 0);
    // the trained models' logits: every position, every setting of the grid
    int positions = 0;
    tried = bad = 0;
    for (int a = 0; a < 2; a++) {
        char path[512];
        snprintf(path, sizeof path, "%s/trained/%s-ref.f32", DATA, a ? "qwen35" : "qwen3");
        if (!need_fixture(path, "sampler: kept set = reference on the trained models' logits")) {
            free(lg); free(ia); free(ib); free(scr);
            return;
        }
        size_t rn = 0;
        float *ref = read_f32(path, &rn);
        const int V = 8193;
        for (size_t p = 0; ref && p + V <= rn; p += V, positions++) {
            int ns = ref_sort(ref + p, V, scr);
            for (int i = 0; i < N_KEEP_K; i++)
                for (int j = 0; j < N_KEEP_P; j++)
                    for (int l = 0; l < N_KEEP_MINP; l++) {
                        tried++;
                        bad += !keep_matches(ref + p, V, scr, ns, KEEP_K[i], KEEP_P[j], KEEP_MINP[l], ia, ib);
                    }
        }
        free(ref);
    }
    snprintf(name, sizeof name, "sampler: kept set = reference at %d trained-model positions x %d settings (bad)",
             positions, N_KEEP_K * N_KEEP_P * N_KEEP_MINP);
    report(bad == 0 && positions == 256, name, bad, 0);
    free(lg); free(ia); free(ib); free(scr);
}

// Draws with the default chain: with a fixed seed, every kept token's share of 400,000 draws within
// 5 standard deviations of its probability (softmax of logit / temp over the kept set), and no token
// outside the set ever drawn. The logits: a position of the trained qwen3 where the defaults keep
// several tokens, or a synthetic vector without the fixture.
static void test_sampler_draws(void) {
    const int V = 8193;
    float *lg = (float *)xmalloc(V * sizeof(float), "a test");
    char path[512];
    snprintf(path, sizeof path, "%s/trained/qwen3-ref.f32", DATA);
    size_t rn = 0;
    float *ref = read_f32(path, &rn);
    Sampler s;
    sampler_init(&s, V, 0.8f, 40, 0.95f, 0.05f, 2);
    int best = -1, best_n = 0;
    float mx;
    for (size_t p = 0; ref && p + V <= rn; p += V) { // the position with the most kept tokens
        int n = sampler_keep(&s, ref + p, &mx);
        if (n > best_n) { best_n = n; best = (int)(p / V); }
    }
    if (best >= 0) memcpy(lg, ref + (size_t)best * V, V * sizeof(float));
    else for (int i = 0; i < V; i++) lg[i] = 1.5f * nrand();
    free(ref);
    int *ids = (int *)xmalloc(V * sizeof(int), "a test");
    Candidate *scr = (Candidate *)xmalloc(V * sizeof(Candidate), "a test");
    int n = ref_keep(scr, ref_sort(lg, V, scr), 40, 0.95f, 0.05f, ids);
    double *prob = (double *)calloc(V, sizeof(double)), z = 0.0, top = -INFINITY;
    int *count = (int *)calloc(V, sizeof(int));
    for (int i = 0; i < n; i++) top = fmax(top, lg[ids[i]]);
    for (int i = 0; i < n; i++) z += exp((lg[ids[i]] - top) / 0.8);
    for (int i = 0; i < n; i++) prob[ids[i]] = exp((lg[ids[i]] - top) / 0.8) / z;
    const int N = 400000;
    for (int i = 0; i < N; i++) {
        int t = sample(&s, lg);
        if (t >= 0 && t < V) count[t]++;
    }
    double worst = 0.0;
    int outside = 0;
    for (int i = 0; i < V; i++) {
        if (prob[i] == 0.0) { outside += count[i]; continue; }
        double sigma = sqrt(prob[i] * (1 - prob[i]) / N) + 1e-12;
        worst = worse(worst, fabs(count[i] / (double)N - prob[i]) / sigma);
    }
    char name[160];
    snprintf(name, sizeof name, "sampler: default chain, %d kept tokens (position %d): draws match p (worst |z|)",
             n, best);
    report(worst < 5.0 && outside == 0 && n > 1, name, worst, 5.0);
    free(s.cand); free(lg); free(ids); free(scr); free(prob); free(count);
}

static void test_sampler(void) {
    const int V = 50;
    float logits[V];
    for (int i = 0; i < V; i++) logits[i] = nrand() * 2.0f;
    logits[17] = 9.0f;
    Sampler a, b;
    sampler_init(&a, V, 0.0f, 40, 0.95f, 0.05f, 1);
    check(sample(&a, logits) == 17, "sampler: temp 0 is argmax");
    // a NaN or an infinite largest logit (a broken model) is -1 for greedy as for a draw (the
    // caller stops); a -inf elsewhere is a token of probability 0
    int nonfinite = 1;
    const float nonfin[3] = {INFINITY, NAN, -INFINITY};
    for (int k = 0; k < 3; k++) {
        Sampler d;
        sampler_init(&d, V, 0.8f, 40, 0.95f, 0.05f, 1);
        float keep = logits[3];
        logits[3] = nonfin[k];
        int want = k < 2 ? -1 : 17;
        nonfinite &= sample(&a, logits) == want && (k < 2 ? sample(&d, logits) == -1
                                                           : sample(&d, logits) != 3);
        logits[3] = keep;
        free(d.cand);
    }
    check(nonfinite, "sampler: +inf or NaN in the logits -> -1, greedy and drawn; -inf: a token "
          "never chosen");
    free(a.cand);
    // same seed -> same stream; different seed -> (almost surely) a different one
    sampler_init(&a, V, 1.5f, 0, 1.0f, 0.0f, 42);
    sampler_init(&b, V, 1.5f, 0, 1.0f, 0.0f, 42);
    for (int i = 0; i < V; i++) logits[i] = nrand();
    int same = 1, diff = 0;
    Sampler c;
    sampler_init(&c, V, 1.5f, 0, 1.0f, 0.0f, 43);
    for (int i = 0; i < 200; i++) {
        int x = sample(&a, logits), y = sample(&b, logits), z = sample(&c, logits);
        same &= x == y;
        diff |= x != z;
    }
    check(same && diff, "sampler: same seed gives the same tokens, another seed does not");
    free(a.cand); free(b.cand); free(c.cand);
    // top-k 1 is greedy whatever the temperature
    sampler_init(&a, V, 5.0f, 1, 1.0f, 0.0f, 7);
    int all = 1;
    for (int i = 0; i < 100; i++) all &= sample(&a, logits) == argmax(logits, V);
    check(all, "sampler: top-k 1 always gives the argmax");
    free(a.cand);
    // top-k 3: only the three best ever come out
    sampler_init(&a, V, 3.0f, 3, 1.0f, 0.0f, 9);
    int best[3] = {0, 0, 0};
    {
        Candidate tmp[V];
        for (int i = 0; i < V; i++) { tmp[i].logit = logits[i]; tmp[i].id = i; }
        qsort(tmp, V, sizeof tmp[0], cand_cmp);
        for (int i = 0; i < 3; i++) best[i] = tmp[i].id;
    }
    int inside = 1;
    for (int i = 0; i < 500; i++) {
        int t = sample(&a, logits);
        inside &= t == best[0] || t == best[1] || t == best[2];
    }
    check(inside, "sampler: top-k 3 draws only the three most likely tokens");
    free(a.cand);
    // the empirical distribution at temperature T matches softmax(logits / T)
    sampler_init(&a, V, 0.7f, 0, 1.0f, 0.0f, 11);
    static int count[V];
    memset(count, 0, sizeof count);
    const int N = 200000;
    for (int i = 0; i < N; i++) count[sample(&a, logits)]++;
    double mx = -1e30, z = 0, worst = 0;
    for (int i = 0; i < V; i++) mx = fmax(mx, logits[i]);
    for (int i = 0; i < V; i++) z += exp((logits[i] - mx) / 0.7);
    for (int i = 0; i < V; i++) {
        double p = exp((logits[i] - mx) / 0.7) / z;
        double sigma = sqrt(p * (1 - p) / N) + 1e-9;
        worst = worse(worst, fabs(count[i] / (double)N - p) / sigma);
    }
    report(worst < 5.0, "sampler: frequencies at temp 0.7 match softmax (worst |z|)", worst, 5.0);
    free(a.cand);
    // top-p: the nucleus is the smallest set whose mass reaches p
    float lg2[4] = {2.0f, 1.0f, 0.0f, -1.0f}; // p ~ 0.644 0.237 0.087 0.032
    sampler_init(&a, 4, 1.0f, 0, 0.85f, 0.0f, 5);
    int seen[4] = {0, 0, 0, 0};
    for (int i = 0; i < 2000; i++) seen[sample(&a, lg2)]++;
    check(seen[0] > 0 && seen[1] > 0 && seen[2] == 0 && seen[3] == 0, "sampler: top-p 0.85 keeps exactly the two-token nucleus");
    free(a.cand);
    sampler_init(&a, 4, 1.0f, 0, 1.0f, 0.2f, 5); // min-p 0.2: p >= 0.129 -> tokens 0 and 1
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < 2000; i++) seen[sample(&a, lg2)]++;
    check(seen[0] > 0 && seen[1] > 0 && seen[2] == 0 && seen[3] == 0, "sampler: min-p 0.2 drops tokens under 0.2 x the top");
    free(a.cand);
    sampler_init(&a, 4, 1.0f, 0, 1.0f, 0.3f, 5); // min-p 0.3: p >= 0.193 (relative to the top, not 0.3)
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < 2000; i++) seen[sample(&a, lg2)]++;
    check(seen[0] > 0 && seen[1] > 0 && seen[2] == 0 && seen[3] == 0, "sampler: min-p 0.3 keeps p >= 0.3 x the top (0.237 of a 0.644 top)");
    free(a.cand);
    // top-p 0.9 over p = 0.5 0.3 0.08 0.07 0.05: the nucleus holds four tokens, two of them below
    // 1 - top_p (the pre-sort cut must not drop those)
    float lg5[5] = {logf(0.5f), logf(0.3f), logf(0.08f), logf(0.07f), logf(0.05f)};
    sampler_init(&a, 5, 1.0f, 0, 0.9f, 0.0f, 5);
    int seen5[5] = {0, 0, 0, 0, 0};
    for (int i = 0; i < 4000; i++) seen5[sample(&a, lg5)]++;
    check(seen5[0] > 0 && seen5[1] > 0 && seen5[2] > 0 && seen5[3] > 0 && seen5[4] == 0,
          "sampler: top-p 0.9 keeps the four-token nucleus, tokens of p 0.08 and 0.07 included");
    free(a.cand);
    // a long tail inside the nucleus: p = 0.5 and ten of 0.05, top-p 0.78 -> the top and six of the
    // tail (ties by id), so a pre-sort cut above 0.05 would show
    float lg11[11];
    lg11[0] = logf(0.5f);
    for (int i = 1; i < 11; i++) lg11[i] = logf(0.05f);
    sampler_init(&a, 11, 1.0f, 0, 0.78f, 0.0f, 11);
    int seen11[11] = {0};
    for (int i = 0; i < 4000; i++) seen11[sample(&a, lg11)]++;
    int in = 1, out = 0;
    for (int i = 0; i < 7; i++) in &= seen11[i] > 0;
    for (int i = 7; i < 11; i++) out += seen11[i];
    check(in && out == 0, "sampler: top-p 0.78 over 0.5 and ten of 0.05 keeps exactly seven tokens");
    free(a.cand);
    // greedy ties: the smaller id, as the candidates' order has it
    float tie[6] = {0.0f, 1.0f, 3.0f, -2.0f, 3.0f, 3.0f};
    sampler_init(&a, 6, 0.0f, 0, 1.0f, 0.0f, 1);
    check(sample(&a, tie) == 2 && argmax(tie, 6) == 2, "sampler: temp 0 on tied logits picks the smallest id");
    free(a.cand);
    // min-p 1 (the most parse_args allows) keeps the top token alone: never an empty set
    for (int i = 0; i < V; i++) logits[i] = nrand();
    sampler_init(&a, V, 1.0f, 0, 1.0f, 1.0f, 9);
    all = 1;
    for (int i = 0; i < 100; i++) all &= sample(&a, logits) == argmax(logits, V);
    check(all, "sampler: min-p 1 keeps only the top token");
    free(a.cand);
    // non-finite logits: no token (-1; the CLI names the position and stops), whatever the settings;
    // a NaN that top-k would drop is seen too
    float bad[6];
    int none = 1;
    const float cut[4][4] = {{0.0f, 0, 1.0f, 0.0f}, {1.0f, 0, 1.0f, 0.05f}, {0.8f, 2, 0.95f, 0.05f}, {1.0f, 0, 0.5f, 0.0f}};
    for (int v = 0; v < 3; v++) {
        memcpy(bad, tie, sizeof bad);
        if (v == 0) bad[3] = NAN;          // a NaN below the top-2
        if (v == 1) bad[2] = INFINITY;     // softmax of an infinity
        if (v == 2) for (int i = 0; i < 6; i++) bad[i] = NAN;
        for (int k = 0; k < 4; k++) {
            if (v == 1 && k == 0) continue; // greedy takes an infinity as the largest value
            sampler_init(&a, 6, cut[k][0], (int)cut[k][1], cut[k][2], cut[k][3], 3);
            none &= sample(&a, bad) == -1;
            free(a.cand);
        }
    }
    check(none, "sampler: NaN or infinite logits give no token (greedy and sampled, with top-k/top-p/min-p)");
}

// =================================================================================================
// Command line: error paths exit non-zero with a message; outputs are well-formed
// =================================================================================================
// Replace the first `pat` in s (a buffer of cap bytes) by val: the CLI tests' placeholders.
static void subst(char *s, size_t cap, const char *pat, const char *val) {
    char *at = strstr(s, pat), rest[1024];
    if (!at) return;
    snprintf(rest, sizeof rest, "%s", at + strlen(pat));
    snprintf(at, cap - (size_t)(at - s), "%s%s", val, rest);
}

static int run_cmd(const char *cmd, char *out, size_t cap) {
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_cli(void) {
    if (access(QWEN, X_OK) != 0) { check(0, "cli: the qwen binary is built"); return; }
    static char m[512], m35[512], mref[512]; // the fixtures, under DATA (QWEN_TEST_DATA)
    snprintf(m, sizeof m, "%s/tiny-qwen3/tiny-qwen3-q4_0.gguf", DATA);
    snprintf(m35, sizeof m35, "%s/tiny-qwen35/tiny-qwen35-q4_0.gguf", DATA);
    snprintf(mref, sizeof mref, "%s/tiny-qwen3/tiny-qwen3-q4_0-text.f32", DATA);
    if (!need_fixture(m, "cli tests (on tiny-qwen3-q4_0)")) return;
    static char out[1 << 16];
    char cmd[1024], tmp[256];
    snprintf(tmp, sizeof tmp, "%s/cli", TMP);
#define M "-m MODEL " // replaced by the fixture's path below
    struct { const char *what, *args, *expect; } cases[] = {
        {"missing model file", "-m /nonexistent.gguf --cpu --tokens 1", "cannot open"},
        {"no model", "--cpu --tokens 1", "no model"},
        {"unknown option", M "--bogus", "unknown option"},
        {"token outside vocabulary", M "--cpu --tokens 1,99999", "outside the vocabulary"},
        {"--detokenize id outside vocabulary", M "--detokenize 1,99999", "--detokenize: token 1 (id 99999) is outside"},
        {"prompt one token longer than the context", M "--cpu -c 4 --tokens 1,2,3,4,5", "raise -c"},
        {"not a GGUF file", "-m TEXTFILE --cpu --tokens 1", "not a GGUF file"},
        {"top-p 0", M "--cpu --tokens 1 --top-p 0", "must be in (0, 1]"},
        {"top-p above 1", M "--cpu --tokens 1 --top-p 1.5", "must be in (0, 1]"},
        {"min-p above 1 (would drop every token)", M "--cpu --tokens 1 --min-p 2", "must be in [0, 1]"},
        {"a seed past 64 bits", M "--cpu --tokens 1 --seed 99999999999999999999", "out of range"},
        {"a count that is not a number", M "--cpu --tokens 1 -n 12x", "expected an integer"},
        {"a temperature that is not a number", M "--cpu --tokens 1 --temp warm", "expected a number"},
        {"option without its value", M "--cpu --tokens", "needs a value"},
        {"bad --vram-limit", M "--vram-limit 15.5X --tokens 1", "expected a size"},
        {"--kl-divergence without a base file", M "--cpu --kl-divergence --tokens 1,2,3,4", "needs --kl-divergence-base"},
        {"--perplexity on fewer tokens than a chunk", M "--cpu --perplexity -c 64 --tokens 1,2,3,4", "fewer than one chunk"},
        {"--kl-divergence with a foreign base file", M "--cpu --kl-divergence --kl-divergence-base TEXTFILE", "not a KL-divergence base"},
        {"--detokenize of a non-number names --detokenize", M "--detokenize abc", "--detokenize 'abc'"},
        {"--detokenize -5", M "--detokenize -5", "--detokenize '-5'"},
        {"--detokenize with an empty field", M "--detokenize 1,,2", "--detokenize '1,,2'"},
        {"--detokenize of nothing", M "--detokenize ''", "--detokenize ''"},
        {"--tokens with an empty field", M "--cpu --tokens 1,,2", "--tokens '1,,2'"},
        {"--tokens with a trailing comma", M "--cpu --tokens 1,2,", "--tokens '1,2,'"},
        {"--tokens with a leading comma", M "--cpu --tokens ,1", "--tokens ',1'"},
        {"--tokens 1a names the whole argument", M "--cpu --tokens 1a", "--tokens '1a'"},
        {"--temp past a float's range", M "--cpu --tokens 1 --temp 1e40", "out of range"},
        {"-f of a directory says why", M "--cpu -f / -n 1", "Is a directory"},
        {"--system without --chat", M "--cpu -p hi --system x", "--system does not apply to generation (-p, -f or --tokens) (it applies to: --chat)"},
    };
#undef M
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        // MODEL: the fixture model; TEXTFILE: a file that is neither GGUF nor a KL base (greedy.jsonl)
        char args[512], textfile[512];
        snprintf(args, sizeof args, "%s", cases[i].args);
        snprintf(textfile, sizeof textfile, "%s/greedy.jsonl", DATA);
        subst(args, sizeof args, "MODEL", m);
        subst(args, sizeof args, "TEXTFILE", textfile);
        snprintf(cmd, sizeof cmd, "%s %s 2>&1", QWEN, args);
        int rc = run_cmd(cmd, out, sizeof out);
        char name[160];
        snprintf(name, sizeof name, "cli: %s -> exit 1 with a message", cases[i].what);
        int good = rc == 1 && strstr(out, cases[i].expect) && !strstr(out, "Segmentation");
        check(good, name);
        if (!good) printf("     rc=%d output: %.300s\n", rc, out);
    }
    // a prompt that fills the context exactly is accepted
    snprintf(cmd, sizeof cmd, "%s -m %s --cpu -c 4 --tokens 1,2,3,4 -n 0 2>&1", QWEN, m);
    check(run_cmd(cmd, out, sizeof out) == 0, "cli: a prompt of exactly -c tokens runs");
    // llama.cpp's meanings of negative values: --temp -1 is greedy, --top-k -1 off
    {
        static char g0[4096], g1[4096];
        snprintf(cmd, sizeof cmd, "%s -m %s --cpu --tokens 1,2,3 -n 8 --temp 0 2>/dev/null", QWEN, m);
        int r0 = run_cmd(cmd, g0, sizeof g0);
        snprintf(cmd, sizeof cmd, "%s -m %s --cpu --tokens 1,2,3 -n 8 --temp -1 --top-k -1 --seed 9 2>/dev/null", QWEN, m);
        int r1 = run_cmd(cmd, g1, sizeof g1);
        check(r0 == 0 && r1 == 0 && !strcmp(g0, g1), "cli: --temp -1 --top-k -1 is greedy, as in llama.cpp");
    }
    // --info needs no GPU: metadata, tensor table, budget
    if (need_fixture(m35, "cli: --info")) {
        snprintf(cmd, sizeof cmd, "%s -m %s --info -c 2048 2>&1", QWEN, m35);
        int rc = run_cmd(cmd, out, sizeof out);
        check(rc == 0 && strstr(out, "qwen35.ssm.state_size") && strstr(out, "blk.0.ssm_conv1d.weight") &&
              strstr(out, "VRAM budget for -c 2048") && strstr(out, "DeltaNet state: 3 layers"), "cli: --info prints metadata, tensors and the budget");
    }
    // a truncated model file
    {
        size_t len;
        char *f = read_file(m, &len);
        snprintf(cmd, sizeof cmd, "%s_trunc.gguf", tmp);
        write_file(cmd, f, len / 2);
        free(f);
        char c2[1024];
        snprintf(c2, sizeof c2, "%s -m %s --cpu --tokens 1 2>&1", QWEN, cmd);
        int rc = run_cmd(c2, out, sizeof out);
        check(rc == 1 && strstr(out, "tensor '") && strstr(out, "past the end"), "cli: truncated model -> exit 1, names the tensor");
        unlink(cmd);
    }
    // a model whose weights hold NaN (the final norm's): the logits are NaN, and generation stops
    // with a message instead of drawing from them, greedy and sampled
    {
        size_t len;
        uint8_t *f = (uint8_t *)read_file(m, &len);
        GGUF g;
        int found = 0;
        const GGUFTensor *t = parse_image(&g, f, len) == 0 ? gguf_tensor(&g, "output_norm.weight") : NULL;
        if (t && t->type == GGML_TYPE_F32) {
            float nan = NAN;
            for (size_t b = 0; b + 4 <= t->nbytes; b += 4) memcpy(f + g.data_offset + t->offset + b, &nan, 4);
            found = 1;
        }
        gguf_close(&g);
        snprintf(cmd, sizeof cmd, "%s_nan.gguf", tmp);
        write_file(cmd, f, len);
        free(f);
        int good = found;
        for (int k = 0; k < 2 && found; k++) {
            char c2[1024];
            snprintf(c2, sizeof c2, "%s -m %s --cpu --tokens 1,2,3 -n 4 %s 2>&1", QWEN, cmd, k ? "--temp 0.8 --seed 1" : "--temp 0");
            int rc = run_cmd(c2, out, sizeof out);
            good &= rc == 1 && strstr(out, "logits at position 2 are not finite") != NULL;
            if (rc != 1) printf("     rc=%d output: %.300s\n", rc, out);
        }
        check(good, "cli: NaN weights -> exit 1 naming the position whose logits are not finite (greedy and sampled)");
        // every other mode refuses them too, and leaves no file that looks valid
        char c2[1024], kld[300], dump[300], txt[300];
        snprintf(kld, sizeof kld, "%s_nan.kld", tmp);
        snprintf(dump, sizeof dump, "%s_nan.f32", tmp);
        snprintf(txt, sizeof txt, "%s/greedy.jsonl", DATA);
        const char *modes[3] = {"--perplexity -c 64 --chunks 2 -f TXT", "--perplexity -c 64 --chunks 2 -f TXT --kl-divergence-base KLD",
                                "--tokens 1,2,3 -n 0 --dump-logits DUMP"};
        for (int k = 0; k < 3 && found; k++) {
            char args[600];
            snprintf(args, sizeof args, "%s", modes[k]);
            subst(args, sizeof args, "TXT", txt);
            subst(args, sizeof args, "KLD", kld);
            subst(args, sizeof args, "DUMP", dump);
            snprintf(c2, sizeof c2, "%s -m %s --cpu %s 2>&1", QWEN, cmd, args);
            int rc = run_cmd(c2, out, sizeof out);
            int ok = rc == 1 && strstr(out, "are not finite") && access(kld, F_OK) != 0 && access(dump, F_OK) != 0;
            if (!ok) printf("     rc=%d output: %.300s\n", rc, out);
            const char *what[3] = {"--perplexity", "--kl-divergence-base (no file left)", "--dump-logits (no file left)"};
            char name[160];
            snprintf(name, sizeof name, "cli: NaN weights, %s -> exit 1 naming the position", what[k]);
            check(ok, name);
            unlink(kld);
            unlink(dump);
        }
        // an error starts on a line of its own when generation is mid-line
        snprintf(c2, sizeof c2, "%s -m %s --cpu -p hi -n 4 --temp 0 2>&1", QWEN, cmd);
        int rc = run_cmd(c2, out, sizeof out);
        check(found && rc == 1 && strstr(out, "\nerror: the logits") && !strstr(out, "hierror"),
              "cli: an error after output mid-line starts on a new line");
        unlink(cmd);
    }
    // a KL-divergence base file whose record holds a NaN scale or an infinite min_log_prob, or
    // that has trailing bytes, is refused; and scoring NaN logits against a good one fails
    {
        char base[300], bad[300], c2[1024], txt[300];
        snprintf(base, sizeof base, "%s_good.kld", tmp);
        snprintf(bad, sizeof bad, "%s_bad.kld", tmp);
        snprintf(txt, sizeof txt, "%s/greedy.jsonl", DATA);
        snprintf(c2, sizeof c2, "%s -m %s --cpu --perplexity -c 64 --chunks 1 -f %s --kl-divergence-base %s 2>&1", QWEN, m, txt, base);
        int rc0 = run_cmd(c2, out, sizeof out);
        size_t len = 0;
        uint8_t *f = rc0 == 0 ? (uint8_t *)read_file(base, &len) : NULL;
        const char *what[3] = {"a NaN scale", "an infinite min_log_prob", "trailing bytes"};
        for (int k = 0; k < 3; k++) {
            int ok = 0;
            if (f && len > 20) {
                uint32_t n_ctx;
                int32_t n_chunk;
                memcpy(&n_ctx, f + 8, 4);
                memcpy(&n_chunk, f + 16, 4);
                size_t rec = 20 + (size_t)n_chunk * n_ctx * 4;
                uint8_t *g = (uint8_t *)malloc(len + 4);
                memcpy(g, f, len);
                float v = k == 0 ? NAN : -INFINITY;
                if (k < 2) memcpy(g + rec + 4 * k, &v, 4);
                write_file(bad, g, k == 2 ? len + 4 : len);
                free(g);
                snprintf(c2, sizeof c2, "%s -m %s --cpu --kl-divergence --kl-divergence-base %s 2>&1", QWEN, m, bad);
                int rc = run_cmd(c2, out, sizeof out);
                ok = rc == 1 && strstr(out, k == 2 ? "longer than its header" : "not a log-probability record");
                if (!ok) printf("     rc=%d output: %.300s\n", rc, out);
                unlink(bad);
            }
            char name[160];
            snprintf(name, sizeof name, "cli: a KL-divergence base file with %s -> exit 1", what[k]);
            check(ok, name);
        }
        free(f);
        unlink(base);
    }
    // chat: a turn that does not fit the context ends the run with exit 1; blank lines are no turns
    {
        char c2[1024];
        snprintf(c2, sizeof c2, "printf 'aaaa bbbb cccc dddd eeee\\nffff gggg hhhh iiii jjjj kkkk\\nmore\\n' | "
                 "%s --cpu -m %s --chat -c 40 -n 10 2>&1", QWEN, m);
        int rc = run_cmd(c2, out, sizeof out);
        check(rc == 1 && strstr(out, "the context is full"), "cli: chat with a full context: the turns refused, exit 1");
        static char a1[8192], a2[8192];
        snprintf(c2, sizeof c2, "printf 'hello\\n' | %s --cpu -m %s --chat -n 3 --temp 0 2>&1 | grep 'prompt eval'", QWEN, m);
        int r1 = run_cmd(c2, a1, sizeof a1);
        snprintf(c2, sizeof c2, "printf '\\n  \\nhello\\n\\n' | %s --cpu -m %s --chat -n 3 --temp 0 2>&1 | grep 'prompt eval'", QWEN, m);
        int r2 = run_cmd(c2, a2, sizeof a2);
        const char *s1 = strstr(a1, "/"), *s2 = strstr(a2, "/");
        check(r1 == 0 && r2 == 0 && s1 && s2 && atoi(s1 + 1) > 0 && atoi(s1 + 1) == atoi(s2 + 1),
              "cli: blank stdin lines in --chat are not turns (the same prompt tokens)");
    }
    // --help goes to stdout with exit 0; --info prints what a vocabulary-only file has
    {
        char c2[1024];
        snprintf(c2, sizeof c2, "%s --help 2>/dev/null", QWEN);
        int rc = run_cmd(c2, out, sizeof out);
        check(rc == 0 && strstr(out, "usage: qwen") && strstr(out, "--dump-logits"), "cli: --help on stdout, exit 0");
        char voc[512];
        snprintf(voc, sizeof voc, "%s/tokenizer/vocab-tiny.gguf", DATA);
        if (need_fixture(voc, "cli: --info of a vocabulary-only file")) {
            snprintf(c2, sizeof c2, "%s -m %s --info 2>&1", QWEN, voc);
            rc = run_cmd(c2, out, sizeof out);
            check(rc == 0 && strstr(out, "tokenizer.ggml.tokens") && strstr(out, "vocabulary-only"),
                  "cli: --info of a vocabulary-only file prints its metadata, exit 0");
        }
    }
    // every float hyper-parameter is checked: rope.freq_base 0, -1 or infinity is refused by name
    {
        size_t len;
        uint8_t *f = (uint8_t *)read_file(m, &len);
        GGUF g;
        const GGUFKV *kv = parse_image(&g, f, len) == 0 ? gguf_find(&g, "qwen3.rope.freq_base") : NULL;
        size_t off = kv && kv->type == GGUF_TYPE_F32 ? (size_t)(kv->data - f) : 0;
        gguf_close(&g);
        const float vals[3] = {0.0f, -1.0f, INFINITY};
        int good = off > 0;
        for (int k = 0; k < 3 && off; k++) {
            memcpy(f + off, &vals[k], 4);
            snprintf(cmd, sizeof cmd, "%s_base.gguf", tmp);
            write_file(cmd, f, len);
            char c2[1024];
            snprintf(c2, sizeof c2, "%s -m %s --cpu --tokens 1 -n 1 2>&1", QWEN, cmd);
            int rc = run_cmd(c2, out, sizeof out);
            good &= rc == 1 && strstr(out, "rope.freq_base") != NULL;
            if (rc != 1) printf("     rc=%d output: %.300s\n", rc, out);
            unlink(cmd);
        }
        free(f);
        check(good, "cli: rope.freq_base of 0, -1 or infinity -> exit 1 naming the key");
    }
    // a tensor of an unknown type id
    {
        Variant v;
        memset(&v, 0, sizeof v);
        v.n_tensors_override = v.n_kv_override = -2;
        v.bad_type = 1;
        Buf b = make_gguf(&v);
        snprintf(cmd, sizeof cmd, "%s_type.gguf", tmp);
        write_file(cmd, b.p, b.n);
        free(b.p);
        char c2[1024];
        snprintf(c2, sizeof c2, "%s -m %s --cpu --tokens 1 2>&1", QWEN, cmd);
        int rc = run_cmd(c2, out, sizeof out);
        check(rc == 1 && strstr(out, "invalid ggml type"), "cli: tensor of an unknown type -> exit 1 with a message");
        unlink(cmd);
    }
    // --dump-logits writes [n_prompt][n_vocab] floats: seq-text's, against the exact reference
    const Seq *text = n_seqs > 0 && !strcmp(SEQS[0].name, "text") ? &SEQS[0] : NULL;
    if (text && need_fixture(mref, "cli: --dump-logits of seq-text")) {
        static char ids[8192];
        size_t k = 0;
        for (int i = 0; i < text->n && k + 16 < sizeof ids; i++) k += snprintf(ids + k, sizeof ids - k, i ? ",%d" : "%d", text->ids[i]);
        char c2[10000];
        snprintf(c2, sizeof c2, "%s -m %s --cpu --tokens %s -n 0 --dump-logits %s.f32 2>&1", QWEN, m, ids, tmp);
        int rc = run_cmd(c2, out, sizeof out);
        snprintf(cmd, sizeof cmd, "%s.f32", tmp);
        size_t n_got = 0, n_ref = 0;
        float *got = rc == 0 ? read_f32(cmd, &n_got) : NULL;
        float *ref = read_f32(mref, &n_ref);
        double e = INFINITY;
        if (got && ref && n_got == n_ref && n_ref == (size_t)text->n * 1024) {
            e = 0;
            for (size_t i = 0; i < n_ref; i++) e = worse(e, fabs((double)got[i] - ref[i]));
            e /= stddev(ref, n_ref);
        }
        report(e <= 1e-3, "cli: --dump-logits of seq-text vs the exact reference: max|d|/std", e, 1e-3);
        free(got);
        free(ref);
        unlink(cmd);
        // on the GPU, --dump-logits goes token by token unless -b is given: the same bytes as -b 1
        const char *name = "cli (GPU): --dump-logits without -b gives the bytes of -b 1 (seq-text)";
        if (!HAVE_GPU) {
            skip(name, "no GPU");
        } else {
            char *f[2] = {NULL, NULL};
            size_t len[2] = {0, 0};
            int rcs[2];
            for (int k = 0; k < 2; k++) {
                snprintf(c2, sizeof c2, "%s -m %s --tokens %s -n 0 %s --dump-logits %s.%d.f32 2>&1",
                         QWEN, m, ids, k ? "-b 1" : "", tmp, k);
                rcs[k] = run_cmd(c2, out, sizeof out);
                snprintf(cmd, sizeof cmd, "%s.%d.f32", tmp, k);
                f[k] = rcs[k] == 0 ? read_file(cmd, &len[k]) : NULL;
                unlink(cmd);
            }
            check(f[0] && f[1] && len[0] == (size_t)text->n * 1024 * 4 && len[0] == len[1] &&
                  !memcmp(f[0], f[1], len[0]), name);
            free(f[0]);
            free(f[1]);
        }
    }
    // same seed -> same text; another seed -> another text
    {
        char a[4096], b[4096], c[4096];
        snprintf(cmd, sizeof cmd, "%s -m %s --cpu --tokens 1,2,3 -n 24 --temp 0.9 --seed 5 2>/dev/null", QWEN, m);
        int r1 = run_cmd(cmd, a, sizeof a), r2 = run_cmd(cmd, b, sizeof b);
        snprintf(cmd, sizeof cmd, "%s -m %s --cpu --tokens 1,2,3 -n 24 --temp 0.9 --seed 6 2>/dev/null", QWEN, m);
        int r3 = run_cmd(cmd, c, sizeof c);
        check(r1 == 0 && r2 == 0 && r3 == 0 && strcmp(a, b) == 0 && strcmp(a, c) != 0, "cli: same seed, same output; another seed, another");
    }
}

// The prompt tokens of a run, from its "prompt eval time = ... / N tokens" line; -1 without one.
static int prompt_tokens(const char *out) {
    const char *p = strstr(out, "prompt eval time");
    p = p ? strchr(p, '/') : NULL;
    return p ? atoi(p + 1) : -1;
}

// What a new user tried (issue "Tried again as a new user would"): each row of that table, and
// the family it belongs to: outputs against inputs, signals, flags that do not apply, allocations
// that name their purpose.
static void test_cli_user(void) {
    if (access(QWEN, X_OK) != 0) { check(0, "cli-user: the qwen binary is built"); return; }
    static char m[512], m2[512], voc[512], txt[512], out[1 << 16];
    snprintf(m, sizeof m, "%s/tiny-qwen3/tiny-qwen3-q4_0.gguf", DATA);
    snprintf(m2, sizeof m2, "%s/tiny-qwen2/tiny-qwen2-q8_0.gguf", DATA);
    snprintf(voc, sizeof voc, "%s/tokenizer/vocab-qwen2.gguf", DATA);
    snprintf(txt, sizeof txt, "%s/greedy.jsonl", DATA);
    if (!need_fixture(m, "cli-user tests (on tiny-qwen3-q4_0)")) return;
    char dir[256], cmd[4096], mc[512], link[512], f[512];
    snprintf(dir, sizeof dir, "%s/user", TMP);
    mkdir(dir, 0700);
    size_t len;
    char *model = read_file(m, &len);
    snprintf(mc, sizeof mc, "%s/m.gguf", dir);
    write_file(mc, model, len);
    snprintf(link, sizeof link, "%s/link.gguf", dir);
    check(symlink(mc, link) == 0, "cli-user: a symbolic link to the model copy");

    // 1. an output path that is an input: refused before anything is opened, the model intact
    {
        const char *outs[4][2] = {{"--dump-logits", mc}, {"--dump-logits", link},
                                  {"-f TXT --kl-divergence-base", mc}, {"--dump-logits", txt}};
        for (int k = 0; k < 4; k++) {
            const char *inflag = k == 3 ? "-f" : "-p hi -n 1";
            if (k == 2) inflag = "";
            char args[1024];
            snprintf(args, sizeof args, "%s %s %s", k == 3 ? "-f TXT" : inflag, outs[k][0], outs[k][1]);
            subst(args, sizeof args, "TXT", txt);
            snprintf(cmd, sizeof cmd, "%s -m %s --cpu %s 2>&1", QWEN, k == 1 ? mc : link, args);
            int rc = run_cmd(cmd, out, sizeof out);
            size_t l2 = 0, l3 = 0;
            char *after = read_file(mc, &l2), *t = read_file(txt, &l3);
            int intact = after && l2 == len && !memcmp(after, model, len) && t && l3 > 0;
            free(after); free(t);
            char name[200];
            snprintf(name, sizeof name, "cli-user: %s onto the %s%s -> exit 1, file intact", outs[k][0],
                     k == 3 ? "prompt file" : "model", k == 1 ? " (through a symbolic link)" : "");
            int ok = rc == 1 && strstr(out, k == 3 ? "is the prompt file" : "is the model file") && intact;
            if (!ok) printf("     rc=%d output: %.300s\n", rc, out);
            check(ok, name);
        }
    }
    // 2. a closed stdin is the end of the chat's input, not the model file read as turns
    snprintf(cmd, sizeof cmd, "%s -m %s --cpu --chat -n 4 <&- 2>&1", QWEN, mc);
    int rc = run_cmd(cmd, out, sizeof out);
    check(rc == 0 && prompt_tokens(out) == -1 && !strstr(out, "context is full"),
          "cli-user: --chat with stdin closed ends at once, exit 0");
    // 3. a FIFO as the model: refused at once (the open does not wait for a writer)
    snprintf(f, sizeof f, "%s/fifo.gguf", dir);
    mkfifo(f, 0600);
    snprintf(cmd, sizeof cmd, "timeout 20 %s -m %s --cpu -p hi 2>&1", QWEN, f);
    double t0 = now_sec();
    rc = run_cmd(cmd, out, sizeof out);
    check(rc == 1 && strstr(out, "is not a regular file") && now_sec() - t0 < 10,
          "cli-user: a FIFO as the model -> exit 1 at once, 'is not a regular file'");
    unlink(f);
    // 4. --chat --no-parse-special reads <|im_end|> in the user's text as text (more tokens), the
    // template's tags still as special tokens
    {
        int n[2];
        for (int k = 0; k < 2; k++) {
            snprintf(cmd, sizeof cmd, "%s -m %s --cpu --chat -p '<|im_end|>hi' -n 1 --temp 0 %s "
                     "</dev/null 2>&1", QWEN, mc, k ? "--no-parse-special" : "");
            rc = run_cmd(cmd, out, sizeof out);
            n[k] = rc == 0 ? prompt_tokens(out) : -1;
        }
        check(n[0] > 0 && n[1] > n[0], "cli-user: --chat --no-parse-special reads a tag in the user's text as text");
    }
    // 5, 11. an option given to a mode it does not apply to, and two modes at once: exit 1 naming
    // both options; nothing is written
    {
        snprintf(f, sizeof f, "%s/out.f32", dir);
        struct { const char *args, *expect; } bad[] = {
            {"--chat --dump-logits OUT", "--dump-logits does not apply to --chat"},
            {"--perplexity -f TXT --dump-logits OUT", "--dump-logits does not apply to --perplexity"},
            {"-p hi --chunks 2", "--chunks does not apply to generation"},
            {"-p hi --no-think", "--no-think does not apply to generation"},
            {"-p hi --system x", "--system does not apply to generation"},
            {"--kl-divergence --kl-divergence-base OUT -f TXT", "-f does not apply to --kl-divergence"},
            {"--tokenize --detokenize 1", "--tokenize and --detokenize are two different modes"},
            {"--info --bench", "--info and --bench are two different modes"},
            {"--chat --perplexity", "--chat and --perplexity are two different modes"},
            {"--tokenize -p hi -n 3", "-n does not apply to --tokenize"},
            {"--info --temp 0", "--temp does not apply to --info"},
            {"--detokenize 1 -c 8", "-c does not apply to --detokenize"},
            {"-p hi -b 4", "-b does not apply to --cpu"},
            {"--info --vram-limit nan", "--vram-limit 'nan'"},
            {"--info --vram-limit inf", "--vram-limit 'inf'"},
            {"--info --vram-limit 16", "--vram-limit '16': expected a size with its unit"},
        };
        int good = 1;
        for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
            char args[512];
            snprintf(args, sizeof args, "%s", bad[k].args);
            subst(args, sizeof args, "OUT", f);
            subst(args, sizeof args, "TXT", txt);
            snprintf(cmd, sizeof cmd, "%s -m %s %s %s 2>&1", QWEN, mc, k == 12 ? "--cpu" : "", args);
            rc = run_cmd(cmd, out, sizeof out);
            int ok = rc == 1 && strstr(out, bad[k].expect) && access(f, F_OK) != 0;
            if (!ok) printf("     %s: rc=%d output: %.300s\n", bad[k].args, rc, out);
            good &= ok;
        }
        check(good, "cli-user: 16 options given to a mode they do not apply to, or two modes -> exit 1 naming both");
        // --no-think on a model without a thinking phase (qwen2)
        if (need_fixture(m2, "cli-user: --no-think on qwen2")) {
            snprintf(cmd, sizeof cmd, "%s -m %s --cpu --chat --no-think -p hi 2>&1", QWEN, m2);
            rc = run_cmd(cmd, out, sizeof out);
            check(rc == 1 && strstr(out, "--no-think does not apply to a qwen2 model"), "cli-user: --no-think on qwen2 -> exit 1");
        }
    }
    // 6. a signal during --dump-logits deletes the partial file, as an error does: SIGXFSZ at a
    // 4 KiB file-size limit (deterministic), and SIGTERM once the first rows are written
    {
        snprintf(f, sizeof f, "%s/dump.f32", dir);
        snprintf(cmd, sizeof cmd, "ulimit -f 4; %s -m %s --cpu -f %s -n 0 --dump-logits %s >/dev/null 2>&1; echo status=$?",
                 QWEN, mc, txt, f);
        run_cmd(cmd, out, sizeof out);
        check(strstr(out, "status=153") && access(f, F_OK) != 0, "cli-user: SIGXFSZ during --dump-logits: no partial file left, status 128+25");
        if (strstr(out, "status=153") == NULL) printf("     output: %.200s\n", out);
        // (the rows go to the output's temporary file, .dump.f32.tmp-PID, until it is complete)
        snprintf(cmd, sizeof cmd, "exec 2>/dev/null; %s -m %s --cpu -f %s -n 0 --dump-logits %s >/dev/null & p=$!; "
                 "while [ -z \"$(find %s -name '.*.tmp-*' -size +0c)\" ] && kill -0 $p 2>/dev/null; do sleep 0.01; done; "
                 "kill -TERM $p; wait $p; echo status=$?", QWEN, mc, txt, f, dir);
        run_cmd(cmd, out, sizeof out);
        check(strstr(out, "status=143") && access(f, F_OK) != 0, "cli-user: SIGTERM during --dump-logits: no partial file left, status 128+15");
        if (strstr(out, "status=143") == NULL) printf("     output: %.200s\n", out);
        // a signal the caller ignores (nohup, trap '' HUP) stays ignored: the run goes on to the end
        snprintf(cmd, sizeof cmd, "exec 2>/dev/null; (trap '' HUP; exec %s -m %s --cpu -f %s -n 0 --dump-logits %s >/dev/null) & p=$!; "
                 "while [ -z \"$(find %s -name '.*.tmp-*' -size +0c)\" ] && kill -0 $p 2>/dev/null; do sleep 0.01; done; "
                 "kill -HUP $p; wait $p; echo status=$?", QWEN, mc, txt, f, dir);
        run_cmd(cmd, out, sizeof out);
        check(strstr(out, "status=0") && access(f, F_OK) == 0, "cli-user: SIGHUP ignored by the caller (nohup): the run finishes, exit 0");
        if (strstr(out, "status=0") == NULL) printf("     output: %.200s\n", out);
        unlink(f);
    }
    // 7. run.sh from another directory takes the caller's paths; a flag right after the model
    // keeps the default prompt
    {
        char cwd[1024];
        if (getcwd(cwd, sizeof cwd)) {
            snprintf(cmd, sizeof cmd, "cd %s && %s/run.sh m.gguf 'Hi' -n 2 --temp 0 --seed 1 2>&1", dir, cwd);
            rc = run_cmd(cmd, out, sizeof out);
            check(rc == 0, "cli-user: run.sh MODEL from the model's directory (a relative path) runs");
            if (rc) printf("     rc=%d output: %.300s\n", rc, out);
            snprintf(cmd, sizeof cmd, "cd %s && %s/run.sh m.gguf --seed 42 -n 2 2>&1", dir, cwd);
            rc = run_cmd(cmd, out, sizeof out);
            check(rc == 0 && strstr(out, "seed 42"), "cli-user: run.sh MODEL --seed 42: the flag after the model, the default prompt");
            if (rc) printf("     rc=%d output: %.300s\n", rc, out);
        }
    }
    // 8. a directory as the KL-divergence base
    snprintf(cmd, sizeof cmd, "%s -m %s --cpu --kl-divergence --kl-divergence-base %s/ 2>&1", QWEN, mc, dir);
    rc = run_cmd(cmd, out, sizeof out);
    check(rc == 1 && strstr(out, "is a directory"), "cli-user: a directory as the KL-divergence base -> 'is a directory'");
    // 9. a flag that took the next flag as its value names both; an unknown option prints no usage
    {
        const char *args[3] = {"-p -n 3", "-m -p hi", "--bogus"};
        const char *want[3] = {"option -p needs a value, but the next argument '-n' is an option",
                               "option -m needs a value, but the next argument '-p' is an option",
                               "unknown option '--bogus' (qwen --help lists the options)"};
        int good = 1;
        for (int k = 0; k < 3; k++) {
            snprintf(cmd, sizeof cmd, "%s %s %s --cpu %s 2>&1", QWEN, k == 1 ? "" : "-m", k == 1 ? "" : mc, args[k]);
            rc = run_cmd(cmd, out, sizeof out);
            int ok = rc == 1 && strstr(out, want[k]) && !strstr(out, "usage:");
            if (!ok) printf("     %s: rc=%d output: %.300s\n", args[k], rc, out);
            good &= ok;
        }
        check(good, "cli-user: -p -n 3, -m -p hi, --bogus name the option at fault, no usage text");
    }
    // 10. a vocabulary-only file in a mode that runs a model
    if (need_fixture(voc, "cli-user: vocabulary-only file")) {
        const char *modes[3] = {"-p hi", "--chat", "--perplexity -f TXT"};
        int good = 1;
        for (int k = 0; k < 3; k++) {
            char args[512];
            snprintf(args, sizeof args, "%s", modes[k]);
            subst(args, sizeof args, "TXT", txt);
            snprintf(cmd, sizeof cmd, "%s -m %s --cpu %s </dev/null 2>&1", QWEN, voc, args);
            rc = run_cmd(cmd, out, sizeof out);
            good &= rc == 1 && strstr(out, "is a vocabulary-only file") && strstr(out, "vocab-qwen2.gguf");
            if (rc != 1) printf("     rc=%d output: %.300s\n", rc, out);
        }
        check(good, "cli-user: a vocabulary-only file with -p, --chat, --perplexity -> names the file and what applies");
    }
    // 12. two runs without --seed, started back to back, draw different seeds
    {
        char s1[64] = "", s2[64] = "";
        for (int k = 0; k < 2; k++) {
            snprintf(cmd, sizeof cmd, "%s -m %s --cpu -p hi -n 1 2>&1", QWEN, mc);
            run_cmd(cmd, out, sizeof out);
            const char *p = strstr(out, "seed ");
            snprintf(k ? s2 : s1, 64, "%.20s", p ? p + 5 : "");
        }
        check(s1[0] && s2[0] && strcmp(s1, s2) != 0, "cli-user: two runs without --seed in the same second draw different seeds");
    }
    // 13. an allocation that fails names what it was for: -c past memory on a file that claims a
    // 2^31 context (the --cpu KV cache), -f /dev/zero (the prompt file, stopped at 1 GiB)
    {
        GGUF g;
        uint8_t *copy = (uint8_t *)read_file(m, &len);
        const GGUFKV *kv = parse_image(&g, copy, len) == 0 ? gguf_find(&g, "qwen3.context_length") : NULL;
        size_t off = kv && kv->type == GGUF_TYPE_U32 ? (size_t)(kv->data - copy) : 0;
        gguf_close(&g);
        uint32_t big = 0x7fffffffu;
        if (off) memcpy(copy + off, &big, 4);
        snprintf(f, sizeof f, "%s/bigctx.gguf", dir);
        write_file(f, copy, len);
        free(copy);
        // a memory limit makes the allocation fail; under ASan (whose shadow memory needs more
        // address space) its own limit does, max_allocation_size_mb in test/sanitize.sh
        snprintf(cmd, sizeof cmd, "%s %s -m %s --cpu -c 100000000 -p hi -n 1 2>&1",
                 getenv("ASAN_OPTIONS") ? "" : "ulimit -v 4000000;", QWEN, f);
        rc = run_cmd(cmd, out, sizeof out);
        check(off && rc == 1 && strstr(out, "out of host memory: the --cpu path's fp32 KV cache for -c 100000000 (lower -c)"),
              "cli-user: -c 100000000 past host memory -> names the --cpu KV cache and -c");
        if (rc != 1) printf("     rc=%d output: %.300s\n", rc, out);
        unlink(f);
        snprintf(cmd, sizeof cmd, "%s -m %s --cpu -f /dev/zero -n 1 2>&1", QWEN, mc);
        rc = run_cmd(cmd, out, sizeof out);
        check(rc == 1 && strstr(out, "-f '/dev/zero' holds 1 GiB or more"), "cli-user: -f /dev/zero -> stopped at 1 GiB, names -f");
    }
    // 14. -t with --cpu: the note fits the CPU path
    snprintf(cmd, sizeof cmd, "%s -m %s --cpu -t 4 -p hi -n 1 2>&1", QWEN, mc);
    rc = run_cmd(cmd, out, sizeof out);
    check(rc == 0 && strstr(out, "the --cpu path runs on one thread") && !strstr(out, "whole model on the GPU"),
          "cli-user: --cpu -t 4: the note says the CPU path runs on one thread");
    // 15. --chat's help says how to leave and where a long prompt goes
    snprintf(cmd, sizeof cmd, "%s --help", QWEN);
    rc = run_cmd(cmd, out, sizeof out);
    check(rc == 0 && strstr(out, "Ctrl-D") && strstr(out, "4095 bytes"), "cli-user: --help: Ctrl-D ends the chat, long prompts in -f");
    // a chat answer cut by -n says so
    snprintf(cmd, sizeof cmd, "printf 'hello\\n' | %s -m %s --cpu --chat -n 1 --temp 0 2>&1", QWEN, mc);
    rc = run_cmd(cmd, out, sizeof out);
    check(rc == 0 && strstr(out, "reached -n 1 token:"), "cli-user: a chat answer cut by -n says so");
    // a vocabulary without the ChatML tokens cannot chat
    {   // the model copy with its <|im_start|> renamed, in place (the same length)
        char *copy = (char *)memcpy(xmalloc(len, "a test"), model, len), *at = NULL;
        for (size_t i = 0; i + 12 <= len && !at; i++)
            if (!memcmp(copy + i, "<|im_start|>", 12)) at = copy + i;
        if (at) at[5] = 'X';
        snprintf(f, sizeof f, "%s/nochatml.gguf", dir);
        write_file(f, copy, len);
        free(copy);
        snprintf(cmd, sizeof cmd, "%s -m %s --cpu --chat -p hi 2>&1", QWEN, f);
        rc = run_cmd(cmd, out, sizeof out);
        check(rc == 1 && strstr(out, "no ChatML tokens"), "cli-user: --chat on a vocabulary without ChatML tokens -> exit 1");
        if (rc != 1) printf("     rc=%d output: %.300s\n", rc, out);
        unlink(f);
    }
    unlink(link);
    unlink(mc);
    rmdir(dir);
    free(model);
}

// What a new user tried (3), issue 51's rows 1-25 but the sampler's: each output written whole or
// not at all and checked, stdout checked, each option once and in its mode, and every message
// that suggests a fix suggesting a possible one. The row numbers are the issue's.
static int file_is(const char *path, const char *want) { // the file holds exactly `want`
    size_t n = 0;
    char *s = read_file(path, &n);
    int same = s && n == strlen(want) && !memcmp(s, want, n);
    free(s);
    return same;
}
static int no_tmp_left(const char *dir) { // no ".NAME.tmp-PID" file of an output in dir
    DIR *d = opendir(dir);
    if (!d) return 0;
    int clean = 1;
    for (struct dirent *e = readdir(d); e; e = readdir(d)) clean &= !(e->d_name[0] == '.' && strstr(e->d_name, ".tmp-"));
    closedir(d);
    return clean;
}
static int same_files(const char *a, const char *b) {
    size_t na = 0, nb = 0;
    char *x = read_file(a, &na), *y = read_file(b, &nb);
    int same = x && y && na == nb && na > 0 && !memcmp(x, y, na);
    free(x);
    free(y);
    return same;
}

// A job started with & by a non-interactive shell (popen's) has SIGINT ignored, and a signal
// ignored on entry stays ignored (catch_fatal_signals): the checks that send SIGINT start their
// job through `env --default-signal=INT`, as a terminal would run it.
static void test_cli_user3(void) {
    if (access(QWEN, X_OK) != 0) { check(0, "cli-user3: the qwen binary is built"); return; }
    static char m[512], tm[512], sample[512], txt[512], out[1 << 16], cmd[8192];
    snprintf(m, sizeof m, "%s/tiny-qwen3/tiny-qwen3-q4_0.gguf", DATA);
    snprintf(tm, sizeof tm, "%s/trained/qwen3-q4_0.gguf", DATA);
    snprintf(sample, sizeof sample, "%s/trained/sample.txt", DATA);
    snprintf(txt, sizeof txt, "%s/greedy.jsonl", DATA);
    if (!need_fixture(m, "cli-user3 tests (on tiny-qwen3-q4_0)")) return;
    char dir[128], f[256], g[256], h[256], shorttxt[256];
    snprintf(dir, sizeof dir, "%s/user3", TMP);
    mkdir(dir, 0700);
    snprintf(f, sizeof f, "%s/out.f32", dir);
    snprintf(g, sizeof g, "%s/ref.f32", dir);
    snprintf(h, sizeof h, "%s/other.f32", dir);
    snprintf(shorttxt, sizeof shorttxt, "%s/short.txt", dir); // ~355 tokens: about 1 s on the CPU
    {
        size_t n = 0;
        char *t = read_file(txt, &n);
        write_file(shorttxt, t, n < 400 ? n : 400);
        free(t);
    }
    int rc;

    // --- 2. Outputs: a failed or interrupted write is never success and never costs the old file
    // row 1: --kl-divergence-base FILE without --kl-divergence, FILE there: refused, both ways out
    snprintf(g, sizeof g, "%s/base.kld", dir);
    write_file(g, "old", 3);
    snprintf(cmd, sizeof cmd, "%s -m %s --cpu --perplexity -c 64 --chunks 1 -f %s --kl-divergence-base %s 2>&1", QWEN, m,
             txt, g);
    rc = run_cmd(cmd, out, sizeof out);
    check(rc == 1 && strstr(out, "--kl-divergence-base '") && strstr(out, "base.kld' exists: add --kl-divergence") &&
          strstr(out, "remove it") && file_is(g, "old"),
          "cli-user3 1: --kl-divergence-base over an existing file without --kl-divergence -> refused, both ways out named");
    if (rc != 1) printf("     rc=%d output: %.300s\n", rc, out);
    unlink(g);
    snprintf(g, sizeof g, "%s/ref.f32", dir);
    // row 2: a signal while --dump-logits rewrites a file: the old file stays, no temporary file
    {
        int good = 1;
        const char *sigs[2] = {"INT", "TERM"};
        for (int k = 0; k < 2; k++) {
            write_file(f, "old", 3);
            snprintf(cmd, sizeof cmd,
                     "exec 2>/dev/null; env --default-signal=INT %s -m %s --cpu -f %s --dump-logits %s >/dev/null & p=$!; "
                     "while [ \"$(cat %s)\" = old ] && ! ls -a %s | grep -q tmp- && kill -0 $p; do sleep 0.01; done; "
                     "kill -%s $p; wait $p; echo status=$?", QWEN, m, txt, f, f, dir, sigs[k]);
            run_cmd(cmd, out, sizeof out);
            int ok = strstr(out, k ? "status=143" : "status=130") && file_is(f, "old") && no_tmp_left(dir);
            if (!ok) printf("     SIG%s: %.200s\n", sigs[k], out);
            good &= ok;
        }
        check(good, "cli-user3 2: SIGINT, SIGTERM while --dump-logits rewrites a file -> the old file intact, no temporary file");
    }
    // row 2: a write that fails (the file-size limit with SIGXFSZ ignored: EFBIG, as a full disk
    // gives ENOSPC): exit 1 naming the file, the old --dump-logits and --diff-out files intact, no
    // new --kl-divergence-base file, no temporary file
    {
        snprintf(cmd, sizeof cmd, "%s -m %s --cpu --tokens 9,8,7,6,5,4,3,2 --dump-logits %s 2>&1", QWEN, m, g);
        int r0 = run_cmd(cmd, out, sizeof out);
        char tsv[300], kld[300];
        snprintf(tsv, sizeof tsv, "%s/t.tsv", dir);
        snprintf(kld, sizeof kld, "%s/new.kld", dir);
        const char *args[3] = {"-f SHORT --dump-logits OUT", "--tokens 9,8,7,6,5,4,3,2 --diff-logits REF --diff-out TSV",
                               "--perplexity -c 64 --chunks 2 -f TXT --kl-divergence-base KLD"};
        const char *file[3] = {f, tsv, kld};
        int good = r0 == 0;
        for (int k = 0; k < 3; k++) {
            if (k < 2) write_file(file[k], "old", 3);
            char a[1024];
            snprintf(a, sizeof a, "%s", args[k]);
            subst(a, sizeof a, "SHORT", shorttxt);
            subst(a, sizeof a, "OUT", f);
            subst(a, sizeof a, "REF", g);
            subst(a, sizeof a, "TSV", tsv);
            subst(a, sizeof a, "TXT", txt);
            subst(a, sizeof a, "KLD", kld);
            snprintf(cmd, sizeof cmd, "trap '' XFSZ; ulimit -f 0; %s -m %s --cpu %s >/dev/null 2>&1; echo status=$?",
                     QWEN, m, a);
            run_cmd(cmd, out, sizeof out);
            int ok = strstr(out, "status=1") && (k < 2 ? file_is(file[k], "old") : access(kld, F_OK) != 0) && no_tmp_left(dir);
            snprintf(cmd, sizeof cmd, "trap '' XFSZ; ulimit -f 0; %s -m %s --cpu %s 2>&1 >/dev/null", QWEN, m, a);
            run_cmd(cmd, out, sizeof out);
            ok &= strstr(out, "failed: File too large") != NULL;
            if (!ok) printf("     %s: %.300s\n", args[k], out);
            good &= ok;
            unlink(file[k]);
        }
        check(good, "cli-user3 2: a failed write (EFBIG) of --dump-logits, --diff-out, --kl-divergence-base -> exit 1, "
                    "the old file intact, no temporary file");
    }
    // row 3: stdout on a full device (/dev/full) or closed, in every mode -> one error line, exit 1
    if (access("/dev/full", W_OK) == 0) {
        const char *modes[] = {"--tokenize -p hi", "--detokenize 1,2", "--cpu -p hi -n 3", "--info", "--cpu --perplexity -c 64 --chunks 1 -f TXT",
                               "--cpu --tokens 9,8,7,6,5,4,3,2 --diff-logits REF", "--cpu --chat -p hi -n 2", "--help", "--version"};
        int good = 1;
        for (size_t k = 0; k < sizeof modes / sizeof modes[0]; k++)
            for (int closed = 0; closed < 2; closed++) {
                char a[1024];
                snprintf(a, sizeof a, "%s", modes[k]);
                subst(a, sizeof a, "TXT", txt);
                subst(a, sizeof a, "REF", g);
                snprintf(cmd, sizeof cmd, "%s -m %s %s </dev/null 2>&1 %s", QWEN, m, a, closed ? ">&-" : ">/dev/full");
                rc = run_cmd(cmd, out, sizeof out);
                // >&- closes the pipe too here: the shell's 2>&1 made stderr the pipe first
                int ok = rc == 1 && strstr(out, closed ? "error: writing standard output: it is closed"
                                                       : "error: writing standard output: No space left on device");
                if (!ok) printf("     %s %s: rc=%d output: %.300s\n", modes[k], closed ? ">&-" : ">/dev/full", rc, out);
                good &= ok;
            }
        check(good, "cli-user3 3: stdout on /dev/full or closed, in 9 modes -> 'error: writing standard output: ...', exit 1");
    } else {
        skip("cli-user3 3: stdout on /dev/full", "no writable /dev/full");
    }
    // row 4: two runs writing the same --dump-logits file at once: the file is one run's, whole
    {
        snprintf(cmd, sizeof cmd, "%s -m %s --cpu -f %s --dump-logits %s >/dev/null 2>&1", QWEN, m, shorttxt, h);
        int r0 = run_cmd(cmd, out, sizeof out);
        snprintf(cmd, sizeof cmd, "%s -m %s --cpu --tokens 9,8,7 --dump-logits %s >/dev/null 2>&1", QWEN, m, g);
        r0 |= run_cmd(cmd, out, sizeof out);
        unlink(f);
        snprintf(cmd, sizeof cmd,
                 "exec 2>/dev/null; %s -m %s --cpu -f %s --dump-logits %s >/dev/null & a=$!; "
                 "while [ ! -s %s ] && ! ls -a %s | grep -q tmp- && kill -0 $a; do sleep 0.01; done; sleep 0.1; "
                 "%s -m %s --cpu --tokens 9,8,7 --dump-logits %s >/dev/null; echo b=$?; wait $a; echo a=$?",
                 QWEN, m, shorttxt, f, f, dir, QWEN, m, f);
        run_cmd(cmd, out, sizeof out);
        int ok = r0 == 0 && strstr(out, "a=0") && strstr(out, "b=0") && (same_files(f, h) || same_files(f, g)) && no_tmp_left(dir);
        if (!ok) printf("     %.200s\n", out);
        check(ok, "cli-user3 4: two runs write one --dump-logits file at once -> the file is one run's whole file");
        unlink(f);
        unlink(h);
    }
    // row 5: the model truncated while a run reads it: a one-line error naming it, exit 1
    if (need_fixture(sample, "cli-user3 5: the model truncated while mapped -> exit 1 naming the file, no SIGBUS")) {
        size_t n = 0;
        char *model = read_file(m, &n), bus[300];
        snprintf(bus, sizeof bus, "%s/bus.gguf", dir);
        write_file(bus, model, n);
        free(model);
        snprintf(cmd, sizeof cmd,
                 "%s -m %s --cpu --perplexity -c 64 -f %s >/dev/null 2>%s/bus.err & p=$!; "
                 "while ! grep -q 'perplexity:' %s/bus.err 2>/dev/null && kill -0 $p 2>/dev/null; do sleep 0.01; done; sleep 0.1; "
                 "truncate -s 4096 %s; wait $p; echo status=$?; cat %s/bus.err",
                 QWEN, bus, sample, dir, dir, bus, dir);
        run_cmd(cmd, out, sizeof out);
        char want[400];
        snprintf(want, sizeof want, "error: '%s' was truncated or rewritten while this run read it", bus);
        check(strstr(out, "status=1\n") && strstr(out, want), "cli-user3 5: the model truncated while mapped -> exit 1 naming the file, no SIGBUS");
        if (!strstr(out, want)) printf("     %.300s\n", out);
        unlink(bus);
    }
    // row 24: an output in a directory that does not exist
    {
        snprintf(cmd, sizeof cmd, "%s -m %s --cpu -p hi --dump-logits %s/newdir/ 2>&1", QWEN, m, dir);
        rc = run_cmd(cmd, out, sizeof out);
        int ok = rc == 1 && strstr(out, "newdir/': no such directory");
        snprintf(cmd, sizeof cmd, "%s -m %s --cpu -p hi --dump-logits %s/newdir/f 2>&1", QWEN, m, dir);
        int rc2 = run_cmd(cmd, out + strlen(out), sizeof out - strlen(out));
        ok &= rc2 == 1 && strstr(out, "no such directory '") != NULL;
        if (!ok) printf("     %.300s\n", out);
        check(ok, "cli-user3 24: --dump-logits DIR/newdir/ and DIR/newdir/f -> 'no such directory'");
    }

    // --- 3. Options
    // row 6: run.sh with flags alone: the default model with those flags (made from the F16 file)
    char tf16[512];
    snprintf(tf16, sizeof tf16, "%s/trained/qwen3-f16.gguf", DATA);
    if (need_fixture(tf16, "cli-user3 6: run.sh --seed 2 -n 2 -> the tiny trained model with those flags")) {
        char cwd[1024];
        if (getcwd(cwd, sizeof cwd)) {
            snprintf(cmd, sizeof cmd, "cd %s && %s/run.sh --seed 2 -n 2 2>&1", dir, cwd);
            rc = run_cmd(cmd, out, sizeof out);
            check(rc == 0 && strstr(out, "seed 2\n") && strstr(out, "No model given"),
                  "cli-user3 6: run.sh --seed 2 -n 2 -> the tiny trained model with those flags");
            if (rc) printf("     rc=%d output: %.300s\n", rc, out);
        }
    }
    // row 7: every option given twice is an error naming it; nothing is written
    {
        struct { const char *args, *want; } twice[] = {
            {"-m MODEL -p a", "-m given twice"}, {"-p a -p b", "-p given twice"}, {"--cpu --cpu -p a", "--cpu given twice"},
            {"-p a --dump-logits OUT --dump-logits OUT", "--dump-logits given twice"},
            {"-f TXT --kl-divergence-base OUT --kl-divergence-base OUT", "--kl-divergence-base given twice"},
            {"--tokens 1 --diff-logits REF --diff-out OUT --diff-out OUT", "--diff-out given twice"},
            {"-p a --seed 1 -s 2", "--seed given twice (as --seed and -s)"}, {"-p a -n 1 --n-predict 2", "-n given twice (as -n and --n-predict)"},
        };
        int good = 1;
        for (size_t k = 0; k < sizeof twice / sizeof twice[0]; k++) {
            char a[1024];
            snprintf(a, sizeof a, "%s", twice[k].args);
            subst(a, sizeof a, "MODEL", m);
            subst(a, sizeof a, "TXT", txt);
            subst(a, sizeof a, "REF", g);
            subst(a, sizeof a, "OUT", f);
            subst(a, sizeof a, "OUT", f);
            snprintf(cmd, sizeof cmd, "%s -m %s %s 2>&1", QWEN, m, a);
            rc = run_cmd(cmd, out, sizeof out);
            int ok = rc == 1 && strstr(out, twice[k].want) && access(f, F_OK) != 0;
            if (!ok) printf("     %s: rc=%d output: %.300s\n", twice[k].args, rc, out);
            good &= ok;
            unlink(f);
        }
        check(good, "cli-user3 7: 8 options given twice -> exit 1 naming the option, nothing written");
    }
    // row 8: --seed -2 is llama.cpp's fixed seed 4294967294 (-1 alone is random); the help says so
    {
        static char a1[4096], a2[4096];
        snprintf(cmd, sizeof cmd, "%s -m %s --cpu --tokens 1,2,3 -n 16 --temp 1.5 --seed -2 2>/dev/null", QWEN, m);
        int r1 = run_cmd(cmd, a1, sizeof a1), r2 = run_cmd(cmd, a2, sizeof a2);
        snprintf(cmd, sizeof cmd, "%s -m %s --cpu --tokens 1,2,3 -n 1 --seed -2 2>&1 >/dev/null", QWEN, m);
        int r3 = run_cmd(cmd, out, sizeof out);
        int seed_line = strstr(out, "seed 4294967294\n") != NULL;
        snprintf(cmd, sizeof cmd, "%s --help", QWEN);
        run_cmd(cmd, out, sizeof out);
        check(r1 == 0 && r2 == 0 && r3 == 0 && seed_line && a1[0] && !strcmp(a1, a2) && strstr(out, "only -1 is random"),
              "cli-user3 8: --seed -2 is the fixed seed 4294967294 (two runs, one text), as in llama.cpp; --help says so");
    }
    // row 9: a --dump-logits run generates nothing unless -n asks
    {
        snprintf(cmd, sizeof cmd, "%s -m %s --cpu -p hello --dump-logits %s 2>/dev/null", QWEN, m, f);
        rc = run_cmd(cmd, out, sizeof out);
        int ok = rc == 0 && !strcmp(out, "hello\n") && access(f, F_OK) == 0;
        snprintf(cmd, sizeof cmd, "%s -m %s --cpu -p hello -n 3 --temp 0 --dump-logits %s 2>&1", QWEN, m, f);
        rc = run_cmd(cmd, out, sizeof out);
        ok &= rc == 0 && strstr(out, "eval time") && strstr(out, "/     2 runs");
        check(ok, "cli-user3 9: --dump-logits -p hello: the prompt's logits and no generation; with -n 3: 3 tokens");
        if (!ok) printf("     rc=%d output: %.300s\n", rc, out);
        unlink(f);
    }
    // row 10: a stray positional argument
    snprintf(cmd, sizeof cmd, "%s -m %s --cpu Hello 2>&1", QWEN, m);
    rc = run_cmd(cmd, out, sizeof out);
    check(rc == 1 && strstr(out, "unexpected argument 'Hello' (a prompt goes after -p)"),
          "cli-user3 10: -m M Hello -> 'unexpected argument 'Hello' (a prompt goes after -p)'");
    // row 11: -f - reads standard input
    {
        static char a1[4096];
        snprintf(cmd, sizeof cmd, "%s -m %s --tokenize -p 'Hello, world' 2>/dev/null", QWEN, m);
        int r1 = run_cmd(cmd, a1, sizeof a1);
        snprintf(cmd, sizeof cmd, "printf 'Hello, world' | %s -m %s --tokenize -f - 2>/dev/null", QWEN, m);
        rc = run_cmd(cmd, out, sizeof out);
        check(r1 == 0 && rc == 0 && a1[0] && !strcmp(a1, out), "cli-user3 11: -f - reads the prompt from standard input");
    }
    // row 12: --version: the build's commit (git describe), on stdout, exit 0
    {
        static char head[128];
        int have_git = run_cmd("git rev-parse --short HEAD 2>/dev/null", head, sizeof head) == 0 && head[0];
        head[strcspn(head, "\n")] = 0;
        snprintf(cmd, sizeof cmd, "%s --version 2>/dev/null", QWEN);
        rc = run_cmd(cmd, out, sizeof out);
        check(rc == 0 && !strncmp(out, "qwen.cu ", 8) && (!have_git || strstr(out, head)),
              "cli-user3 12: --version prints 'qwen.cu' and the build's commit, exit 0");
        if (rc) printf("     rc=%d output: %.300s (HEAD %s)\n", rc, out, head);
    }

    // --- 4. Messages and behaviour
    // row 13: a prompt longer than the model's own context: shorten it (no -c can help); one
    // longer than a -c below the model's: raise -c to its length
    if (need_fixture(tm, "cli-user3 13: the trained qwen3")) {
        snprintf(cmd, sizeof cmd, "%s -m %s --cpu -f %s -c 4096 -n 1 2>&1", QWEN, tm, sample);
        rc = run_cmd(cmd, out, sizeof out);
        int ok = rc == 1 && strstr(out, "the prompt has 2549 tokens, more than the model's context of 512: shorten it");
        snprintf(cmd, sizeof cmd, "%s -m %s --cpu -c 4 --tokens 1,2,3,4,5 2>&1", QWEN, m);
        int rc2 = run_cmd(cmd, out + strlen(out), sizeof out - strlen(out));
        ok &= rc2 == 1 && strstr(out, "the prompt has 5 tokens but the context is 4: raise -c to 5 or more") != NULL;
        check(ok, "cli-user3 13: a prompt past the model's context -> 'shorten it'; past -c -> 'raise -c to N or more'");
        if (!ok) printf("     %.400s\n", out);
    }
    // row 14: a chat turn longer than what is left is refused, and the chat goes on
    {
        snprintf(cmd, sizeof cmd, "printf 'hi\\naaaa bbbb cccc dddd eeee ffff gggg hhhh iiii jjjj kkkk llll mmmm nnnn\\nok\\n' | "
                 "%s --cpu -m %s --chat -c 48 -n 4 --temp 0 2>&1", QWEN, m);
        rc = run_cmd(cmd, out, sizeof out);
        int toks = prompt_tokens(out);
        check(rc == 1 && strstr(out, "error: this turn has ") && strstr(out, "left: it was not read (a shorter turn fits") &&
              toks > 0 && strstr(out, "[the answer reached -n 4 tokens") && strstr(strstr(out, "not read"), "[the answer reached"),
              "cli-user3 14: a chat turn longer than what is left -> refused with its length and what is left; the next turn is answered");
        if (rc != 1) printf("     rc=%d output: %.500s\n", rc, out);
    }
    // row 15: --info --vram-limit without a GPU: the verdict against the limit, and what would fit
    {
        snprintf(cmd, sizeof cmd, "%s -m %s --info --vram-limit 15.5G 2>&1", QWEN, m);
        rc = run_cmd(cmd, out, sizeof out);
        int ok = rc == 0 && strstr(out, ": fits");
        snprintf(cmd, sizeof cmd, "%s -m %s --info --vram-limit 10M 2>&1", QWEN, m);
        int rc2 = run_cmd(cmd, out, sizeof out);
        ok &= rc2 == 0 && strstr(out, "DOES NOT FIT") && strstr(out, "hint: ") != NULL;
        check(ok, "cli-user3 15: --info --vram-limit 15.5G -> fits; 10M -> DOES NOT FIT with the hints (any machine)");
        if (!ok) printf("     rc=%d output: %.400s\n", rc2, out);
    }
    // row 16: --bench passes the VRAM budget first, --vram-limit honoured
    snprintf(cmd, sizeof cmd, "%s -m %s --bench --vram-limit 10M 2>&1", QWEN, m);
    rc = run_cmd(cmd, out, sizeof out);
    check(rc == 1 && strstr(out, "VRAM budget for -c 4096") && strstr(out, "DOES NOT FIT"),
          "cli-user3 16: --bench --vram-limit 10M -> the budget at the bench's context, refused");
    if (rc != 1) printf("     rc=%d output: %.300s\n", rc, out);
    // the same family: the budget's -c hint only where the run can take that context (--bench's
    // is at least 2049), and no hint of --tokens for a chat (which reads no ids)
    {
        snprintf(cmd, sizeof cmd, "%s -m %s --bench --vram-limit 90M 2>&1", QWEN, m);
        rc = run_cmd(cmd, out, sizeof out);
        const char *hc = strstr(out, "largest context that fits is -c ");
        int ok = rc == 1 && strstr(out, "hint: ") && (!hc || atoi(hc + 33) >= 2049);
        size_t n = 0;
        char *copy = read_file(m, &n), *at = NULL, nt[300];
        for (size_t i = 0; copy && i + 21 <= n && !at; i++)
            if (!memcmp(copy + i, "tokenizer.ggml.tokens", 21)) at = copy + i;
        if (at) at[20] = 'z'; // the key renamed: no tokenizer
        snprintf(nt, sizeof nt, "%s/notok.gguf", dir);
        write_file(nt, copy, n);
        free(copy);
        snprintf(cmd, sizeof cmd, "%s -m %s --cpu --chat -p hi 2>&1", QWEN, nt);
        int rc2 = run_cmd(cmd, out + strlen(out), sizeof out - strlen(out));
        ok &= at && rc2 == 1 && strstr(out, "--chat needs the file's tokenizer") && !strstr(out, "with --tokens");
        check(ok, "cli-user3: a fix a message suggests is possible: --bench's -c hint >= 2049; no --tokens for a chat");
        if (!ok) printf("     rc=%d,%d output: %.500s\n", rc, rc2, out);
        unlink(nt);
    }
    // row 20, 21: --perplexity of 10 scored tokens or fewer: no error estimate ("n/a"); "1 chunk"
    snprintf(cmd, sizeof cmd, "%s -m %s --cpu --perplexity -c 8 --tokens 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16 2>&1", QWEN, m);
    rc = run_cmd(cmd, out, sizeof out);
    check(rc == 0 && strstr(out, "+/- n/a   (6 scored tokens"), "cli-user3 20: --perplexity scoring 6 tokens -> PPL +/- n/a");
    if (rc) printf("     rc=%d output: %.300s\n", rc, out);
    snprintf(cmd, sizeof cmd, "%s -m %s --cpu --perplexity -c 64 --chunks 1 -f %s 2>&1", QWEN, m, txt);
    rc = run_cmd(cmd, out, sizeof out);
    check(rc == 0 && strstr(out, "perplexity: 1 chunk of 64 tokens\n"), "cli-user3 21: one chunk -> '1 chunk'");
    // row 22: -n cuts a chat answer inside a UTF-8 sequence: the held bytes (U+FFFD) come before
    // the notice. A near-uniform draw finds a seed whose one token is a lone lead byte.
    {
        int seed = 0, ok = 0;
        for (int s = 1; s <= 200 && !seed; s++) {
            snprintf(cmd, sizeof cmd, "printf 'hello\\n' | %s -m %s --cpu --chat -n 1 --temp 50 --top-k 0 --top-p 1 --min-p 0 "
                     "--seed %d 2>&1", QWEN, m, s);
            rc = run_cmd(cmd, out, sizeof out);
            const char *fffd = strstr(out, "\xef\xbf\xbd"), *notice = strstr(out, "[the answer reached -n 1 token");
            if (rc == 0 && fffd && notice) seed = s, ok = fffd < notice;
        }
        check(seed && ok, "cli-user3 22: -n cuts a chat answer inside a UTF-8 sequence -> U+FFFD before the -n notice");
        if (!ok) printf("     seed %d: %.300s\n", seed, out);
    }
    // row 23: Ctrl-C during a chat answer stops it and the chat goes on (the next turn is answered,
    // the timing lines follow, exit 0). The first turn is long (~600 tokens, a few seconds of the
    // CPU path), so that SIGINT lands while it is read; the answer then stops before its first token.
    {
        char fifo[300], long_turn[4000] = "";
        snprintf(fifo, sizeof fifo, "%s/chat.fifo", dir);
        mkfifo(fifo, 0600);
        for (int k = 0; k < 300; k++) strcat(long_turn, "ab ");
        snprintf(cmd, sizeof cmd,
                 "env --default-signal=INT %s -m %s --cpu --chat -c 2048 -n 4 --temp 0 <%s >%s/chat.out 2>%s/chat.err & "
                 "p=$!; exec 3>%s; "
                 "printf '%s\\n' >&3; while ! grep -q 'sampling:' %s/chat.err && kill -0 $p 2>/dev/null; do sleep 0.01; done; "
                 "sleep 0.3; kill -INT $p; sleep 0.3; printf 'hello\\n' >&3; exec 3>&-; wait $p; echo status=$?; cat %s/chat.err",
                 QWEN, m, fifo, dir, dir, fifo, long_turn, dir, dir);
        run_cmd(cmd, out, sizeof out);
        check(strstr(out, "status=0") && strstr(out, "[stopped: Ctrl-C]") && strstr(out, "[the answer reached -n 4 tokens") &&
              strstr(out, "prompt eval time"),
              "cli-user3 23: Ctrl-C during a chat answer stops it; the next turn is answered, exit 0");
        if (!strstr(out, "status=0")) printf("     %.400s\n", out);
        unlink(fifo);
    }
    // row 25: the tests' temporary folder is removed on a signal (this binary, waiting in it)
    {
        static char self[1024];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        self[n > 0 ? n : 0] = 0;
        int good = n > 0;
        const char *sigs[2] = {"INT", "TERM"};
        for (int k = 0; k < 2 && good; k++) {
            snprintf(cmd, sizeof cmd, "exec 2>/dev/null; rm -f %s/wait.out; QWEN_TEST_TMP_WAIT=1 env --default-signal=INT %s >%s/wait.out 2>/dev/null & p=$!; "
                     "while [ ! -s %s/wait.out ] && kill -0 $p; do sleep 0.01; done; d=$(cat %s/wait.out); "
                     "test -f $d/waiting && echo made; kill -%s $p; wait $p; test -e $d || echo removed",
                     dir, self, dir, dir, dir, sigs[k]);
            run_cmd(cmd, out, sizeof out);
            good &= strstr(out, "made") && strstr(out, "removed");
        }
        check(good, "cli-user3 25: the tests' one temporary folder is removed on SIGINT and SIGTERM");
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) {}
}

// A fourth new user's report: two output files open at once, a dump over an older one, sizes past
// a size_t, a chat whose stdin cannot be read, values that start with '-', long output names,
// sampler options with nothing to sample, what run.sh passes to the dump modes, and a file with
// more layers than its block_count.
static int one_error(const char *out) { // exactly one "error:" line, and it is the last line
    const char *e = strstr(out, "error:");
    return e && !strstr(e + 1, "error:") && strchr(e, '\n') && !strchr(e, '\n')[1];
}

// test_cli_user4's checks that chat, on the chat model tm (m: the trained qwen3; dir: scratch).
static void test_cli_user4_chat(const char *m, const char *tm, const char *dir) {
    static char out[1 << 16], cmd[4096];
    int rc;
    // 5: a chat whose stdin is a directory: an error, not the end of the chat
    snprintf(cmd, sizeof cmd, "%s -m %s --cpu --chat -n 2 < %s 2>&1", QWEN, tm, dir);
    rc = run_cmd(cmd, out, sizeof out);
    check(rc == 1 && one_error(out) && strstr(out, "reading standard input failed"),
          "cli-user4 5: --chat with stdin a directory -> an error, exit 1");
    // 6: a value with a space that starts with '-' is text; one without is still an option
    snprintf(cmd, sizeof cmd, "echo hi | %s -m %s --cpu --chat -n 2 --system '-Be brief' "
             ">/dev/null 2>&1; echo rc=$?; %s -m %s --cpu --chat -n 2 --system -Be 2>&1", QWEN,
             tm, QWEN, tm);
    run_cmd(cmd, out, sizeof out);
    check(strstr(out, "rc=0\n") == out && strstr(out, "the next argument '-Be' is an option"),
          "cli-user4 6: --system '-Be brief' is a value; --system -Be is a missing value");
    // 9: a range error echoes the value as typed; a chat -c too small for any turn says so
    snprintf(cmd, sizeof cmd, "%s -m %s --cpu -p hi --top-p 1e-50 2>&1; echo hi | %s -m %s --cpu "
             "--chat -c 8 -n 2 2>&1", QWEN, m, QWEN, tm);
    run_cmd(cmd, out, sizeof out);
    check(strstr(out, "--top-p '1e-50': must be in (0, 1]") &&
          strstr(out, "the context cannot hold the shortest turn"),
          "cli-user4 9: --top-p 1e-50 named as typed; chat -c 8: the context cannot hold a turn");
}

static void test_cli_user4(void) {
    static char m[512], tm[512], out[1 << 16], cmd[4096];
    snprintf(m, sizeof m, "%s/trained/qwen3-f16.gguf", DATA);
    snprintf(tm, sizeof tm, "%s/tiny-qwen3/tiny-qwen3-f32.gguf", DATA);
    if (!need_fixture(m, "cli-user4 tests (on the trained qwen3)")) return;
    char dir[128], ids[] = "39,4791,11,1879,0";
    snprintf(dir, sizeof dir, "%s/user4", TMP);
    mkdir(dir, 0700);
    // 1: --dump-hidden with --diff-hidden and --diff-out: both outputs renamed into place
    snprintf(cmd, sizeof cmd, "mkdir -p %s/ref %s/o && %s -m %s --cpu --tokens %s --dump-hidden "
             "%s/ref >/dev/null 2>&1 && %s -m %s --cpu --tokens %s --dump-hidden %s/d "
             "--diff-hidden %s/ref --diff-out %s/o/diff.tsv >/dev/null 2>&1; echo rc=$?; "
             "ls -A %s/o; test -f %s/d/manifest.tsv && echo manifest", dir, dir, QWEN, m, ids,
             dir, QWEN, m, ids, dir, dir, dir, dir, dir);
    run_cmd(cmd, out, sizeof out);
    check(strstr(out, "rc=0\ndiff.tsv\nmanifest\n") != NULL,
          "cli-user4 1: --dump-hidden with --diff-out: the table and the dump both in place, no "
          "temporary file left");
    if (!strstr(out, "rc=0\ndiff.tsv\nmanifest\n")) printf("     %.400s\n", out);
    // 2: --diff-out inside the dump's directory is refused before any work
    snprintf(cmd, sizeof cmd, "%s -m %s --cpu --tokens %s --dump-hidden %s/d --diff-hidden %s/ref "
             "--diff-out %s/d/manifest.tsv 2>&1", QWEN, m, ids, dir, dir, dir);
    int rc = run_cmd(cmd, out, sizeof out);
    check(rc == 1 && one_error(out) && strstr(out, "is in the --dump-hidden directory"),
          "cli-user4 2: --diff-out inside the --dump-hidden directory -> one error line, exit 1");
    // 3: a dump over an older one (5 tokens, every tensor) that fails half way: 12 tokens' logits
    // pass the file-size limit, and the other tensors were written before them. No manifest is
    // left, the older result_output.npy (a name this run writes) is gone, and every file left
    // holds this run's 12 tokens: no mix of the two runs
    snprintf(cmd, sizeof cmd, "%s -m %s --cpu --tokens %s --dump-hidden %s/ref --hidden-filter "
             "'.*' >/dev/null 2>&1; (ulimit -f 100; %s -m %s --cpu --tokens "
             "1,2,3,4,5,6,7,8,9,10,11,12 --dump-hidden %s/ref --hidden-filter '.*' >/dev/null) "
             "2>/dev/null; echo rc=$?; ls %s/ref | grep -c -e manifest -e result_output; "
             "grep -L \"'shape': (12,\" %s/ref/*.npy | wc -l; ls %s/ref/*.npy | wc -l", QWEN, m,
             ids, dir, QWEN, m, dir, dir, dir, dir);
    run_cmd(cmd, out, sizeof out);
    const char *last = out + strlen(out); // the last line: how many files are left
    while (last > out && last[-1] == '\n') last--;
    while (last > out && last[-1] != '\n') last--;
    int left = atoi(last);
    check(!strncmp(out, "rc=153\n0\n0\n", 11) && left > 10, "cli-user4 3: a dump killed half "
          "way over an older one: no manifest, the older logits gone, every file left this run's");
    if (strncmp(out, "rc=153\n0\n0\n", 11)) printf("     %.300s\n", out);
    // 4: --vram-limit past 2^60 bytes, or not finite
    int good = 1;
    const char *sizes[3] = {"1e10T", "16777216T", "1e300T"};
    for (int k = 0; k < 3; k++) {
        snprintf(cmd, sizeof cmd, "%s -m %s --info --vram-limit %s 2>&1", QWEN, m, sizes[k]);
        rc = run_cmd(cmd, out, sizeof out);
        good &= rc == 1 && one_error(out) && strstr(out, "below 1048576T");
    }
    check(good, "cli-user4 4: --vram-limit 1e10T, 16777216T, 1e300T -> one error line, exit 1");
    // 5, 6 and 9: chats, on tiny-qwen3-f32 (the trained models are not chat models)
    if (need_fixture(tm, "cli-user4 5, 6 and 9 (chats on tiny-qwen3-f32)"))
        test_cli_user4_chat(m, tm, dir);
    // 7: an output name of 250 bytes (its temporary name is cut, the name is not)
    char longname[300];
    memset(longname, 'c', 250);
    longname[250] = 0;
    snprintf(cmd, sizeof cmd, "%s -m %s --cpu -p hi --dump-logits %s/%s >/dev/null 2>&1; "
             "echo rc=$?; ls -A %s | grep -c '^c*$'; ls -A %s | grep -c tmp", QWEN, m, dir,
             longname, dir, dir);
    run_cmd(cmd, out, sizeof out);
    check(!strcmp(out, "rc=0\n1\n0\n"), "cli-user4 7: --dump-logits to a name of 250 bytes -> "
          "written, no temporary file left");
    // 8: sampler options with --dump-logits and no -n: nothing is sampled, so they are refused
    char xbin[200];
    snprintf(xbin, sizeof xbin, "%s/x.bin", dir);
    snprintf(cmd, sizeof cmd, "%s -m %s --cpu -p hi --dump-logits %s --top-k 3 2>&1", QWEN, m,
             xbin);
    rc = run_cmd(cmd, out, sizeof out);
    check(rc == 1 && one_error(out) && strstr(out, "--top-k does not apply to --dump-logits "
          "without -n") && access(xbin, F_OK) != 0, "cli-user4 8: --dump-logits --top-k 3 "
          "without -n -> refused, no file");
    snprintf(cmd, sizeof cmd, "%s -m %s --cpu -p hi --dump-logits %s --special >/dev/null 2>&1",
             QWEN, m, xbin);
    check(run_cmd(cmd, out, sizeof out) == 0 && access(xbin, F_OK) == 0, "cli-user4 8: "
          "--dump-logits --special without -n is taken (it shapes the prompt's echo)");
    // 10: run.sh gives the dump modes the default prompt and no sampler options
    snprintf(cmd, sizeof cmd, "./run.sh --dump-hidden %s/rh 2>&1; echo rc=$?", dir);
    rc = run_cmd(cmd, out, sizeof out);
    check(strstr(out, "dump-hidden: ") && strstr(out, "rc=0\n"),
          "cli-user4 10: ./run.sh --dump-hidden DIR -> the default prompt's dump");
    if (!strstr(out, "rc=0\n")) printf("     %.400s\n", out);
    // 11: a file whose block_count is one below its layers' tensors: refused, not run short
    {
        GGUF g;
        if (gguf_open(&g, m) != 0) die("test: %s", g.err);
        const GGUFKV *kv = gguf_find(&g, "qwen3.block_count");
        uint32_t nb = 0;
        if (kv) memcpy(&nb, kv->data, 4);
        char cut[200], want[120];
        snprintf(cut, sizeof cut, "%s/cut.gguf", dir);
        uint8_t *copy = (uint8_t *)xmalloc(g.size, "a test");
        memcpy(copy, g.base, g.size);
        uint32_t less = nb - 1;
        if (kv) memcpy(copy + (kv->data - g.base), &less, 4);
        write_file(cut, copy, g.size);
        free(copy);
        gguf_close(&g);
        snprintf(cmd, sizeof cmd, "%s -m %s --cpu -p hi -n 1 2>&1", QWEN, cut);
        rc = run_cmd(cmd, out, sizeof out);
        snprintf(want, sizeof want, "is of layer %u, but qwen3.block_count = %u", less, less);
        check(kv && rc == 1 && one_error(out) && strstr(out, want), "cli-user4 11: block_count "
              "one below the file's layers -> one error line naming the tensor, exit 1");
        if (rc != 1) printf("     rc=%d: %.300s\n", rc, out);
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) {}
}

// A .npy file: header dict with descr and shape (e.g. "'<f4'", "(16, 1024)"), then n bytes of data.
static void write_npy(const char *path, const char *descr, const char *fortran, const char *shape,
                      const void *data, size_t n) {
    char dict[256];
    int dl = snprintf(dict, sizeof dict, "{'descr': %s, 'fortran_order': %s, 'shape': %s, }", descr, fortran, shape);
    int pad = 64 - (10 + dl + 1) % 64; // numpy aligns the data to 64 bytes; the dict ends with '\n'
    Buf b = {0};
    put(&b, "\x93NUMPY\x01\x00", 8);
    uint16_t hl = (uint16_t)(dl + pad + 1);
    put(&b, &hl, 2);
    put(&b, dict, dl);
    for (int i = 0; i < pad; i++) put(&b, " ", 1);
    put(&b, "\n", 1);
    put(&b, data, n);
    write_file(path, b.p, b.n);
    free(b.p);
}

// --diff-logits: another engine's logits against ours (--cpu on tiny-qwen3-q4_0, 24 tokens)
static void test_diff_logits(void) {
    char m[512], dir[256], ref[300], f[300], out_tsv[300], cmd[2048];
    static char out[1 << 16];
    snprintf(m, sizeof m, "%s/tiny-qwen3/tiny-qwen3-q4_0.gguf", DATA);
    if (!need_fixture(m, "diff-logits tests (on tiny-qwen3-q4_0)")) return;
    snprintf(dir, sizeof dir, "%s/diff", TMP);
    mkdir(dir, 0700);
    snprintf(ref, sizeof ref, "%s/ours.f32", dir);
    snprintf(f, sizeof f, "%s/theirs", dir);
    snprintf(out_tsv, sizeof out_tsv, "%s/table.tsv", dir);
    const char *ids = "9,8,7,6,5,4,3,2,100,200,300,400,500,600,700,800,11,22,33,44,55,66,77,88";
    const int T = 24, V = 1024;
    snprintf(cmd, sizeof cmd, "%s -m %s --cpu --tokens %s --dump-logits %s 2>&1", QWEN, m, ids, ref);
    size_t n = 0;
    float *ours = run_cmd(cmd, out, sizeof out) == 0 ? read_f32(ref, &n) : NULL;
    if (!ours || n != (size_t)T * V) { check(0, "diff-logits: --dump-logits of 24 tokens"); free(ours); return; }
#define DIFF(file, extra) (snprintf(cmd, sizeof cmd, "%s -m %s --cpu --tokens %s --diff-logits %s %s 2>&1", QWEN, m, ids, \
                                    file, extra), run_cmd(cmd, out, sizeof out))
    // its own logits: KL 0, exit 0, and the table of every position
    snprintf(cmd, sizeof cmd, "%s -m %s --cpu --tokens %s --diff-logits %s --diff-out %s 2>&1", QWEN, m, ids, ref, out_tsv);
    int rc = run_cmd(cmd, out, sizeof out);
    size_t tl = 0;
    char *tsv = read_file(out_tsv, &tl);
    int lines = 0;
    for (size_t i = 0; tsv && i < tl; i++) lines += tsv[i] == '\n';
    check(rc == 0 && strstr(out, "KL(ours || theirs): mean 0, max 0") && strstr(out, "24 of 24") &&
          strstr(out, "result: PASS") && strstr(out, "last / first n/a (the first quarter's KL is 0)\n") &&
          lines == T + 1,
          "diff-logits: a file qwen.cu wrote itself gives KL 0, exit 0, the ratio n/a and no diagnosis; --diff-out has every position");
    if (rc != 0 || !strstr(out, "mean 0, max 0")) printf("     rc=%d output: %.400s\n", rc, out);
    free(tsv);
    unlink(out_tsv);
    // one position perturbed: found at that position, exit 1
    float *x = (float *)xmalloc((size_t)T * V * 4, "a test");
    memcpy(x, ours, (size_t)T * V * 4);
    for (int k = 0; k < V; k++) x[(size_t)13 * V + k] += (k % 7) * 0.5f;
    write_file(f, x, (size_t)T * V * 4);
    rc = DIFF(f, "");
    check(rc == 1 && strstr(out, "first position with KL over 0.001: 13 ") && strstr(out, "max") &&
          strstr(out, "at position 13") && strstr(out, "result: FAIL"),
          "diff-logits: one position perturbed is found at that position, exit 1");
    if (rc != 1) printf("     rc=%d output: %.400s\n", rc, out);
    // an error that grows with the position shows as a trend; a flat one as flat; both only when
    // the comparison fails: within --diff-max-kl there is no diagnosis (issue 51, row 17)
    for (int pass = 0; pass < 3; pass++) {
        for (int t = 0; t < T; t++)
            for (int k = 0; k < V; k++)
                x[(size_t)t * V + k] = ours[(size_t)t * V + k] + (pass == 1 ? 0.05f : 0.01f * t) * (float)((k * 37) % 11 - 5);
        write_file(f, x, (size_t)T * V * 4);
        rc = DIFF(f, pass == 2 ? "--diff-max-kl 10" : "");
        const char *name[3] = {"diff-logits: logits that drift with the position show the trend (exit 1)",
                               "diff-logits: a flat error is called flat (exit 1)",
                               "diff-logits: 17: the same drift within --diff-max-kl 10 -> exit 0 and no diagnosis"};
        int ok = pass == 2 ? rc == 0 && strstr(out, "result: PASS") && !strstr(out, "grows") && !strstr(out, "flat")
                           : rc == 1 && strstr(out, pass ? ": flat (the way" : ": it grows with the position");
        check(ok, name[pass]);
        if (!ok) printf("     rc=%d output: %.400s\n", rc, out);
    }
    // another model's logits (far over the threshold, flat): no diagnosis that calls it benign
    {
        uint64_t r = 7;
        for (size_t i = 0; i < (size_t)T * V; i++) x[i] = 8.0f * rng_f32(&r);
        write_file(f, x, (size_t)T * V * 4);
        rc = DIFF(f, "");
        int ok = rc == 1 && !strstr(out, "the way quantization") && strstr(out, "another model, other weights or other tokens?");
        check(ok, "diff-logits: 17: another model's logits (mean KL far over) -> no benign diagnosis");
        if (!ok) printf("     rc=%d output: %.600s\n", rc, out);
    }
    // a transposed .npy, and big-endian raw float32: the likely cause named (issue 51, row 18);
    // a structured dtype: its whole descr (row 19)
    {
        float *tr = (float *)xmalloc((size_t)T * V * 4, "a test");
        for (int t = 0; t < T; t++)
            for (int k = 0; k < V; k++) tr[(size_t)k * T + t] = ours[(size_t)t * V + k];
        write_npy(f, "'<f4'", "False", "(1024, 24)", tr, (size_t)T * V * 4);
        rc = DIFF(f, "");
        int ok = rc == 1 && strstr(out, "has the shape (1024, 24): transposed?");
        uint8_t *be = (uint8_t *)tr;
        for (size_t i = 0; i < (size_t)T * V; i++) {
            const uint8_t *s = (const uint8_t *)&ours[i];
            uint8_t *d = be + 4 * i;
            d[0] = s[3], d[1] = s[2], d[2] = s[1], d[3] = s[0];
        }
        write_file(f, be, (size_t)T * V * 4);
        rc = DIFF(f, "");
        ok &= rc == 1 && strstr(out, "(big-endian?") != NULL;
        check(ok, "diff-logits: 18: a transposed .npy -> 'transposed?'; big-endian raw float32 -> 'big-endian?'");
        if (!ok) printf("     rc=%d output: %.300s\n", rc, out);
        write_npy(f, "[('x', '<f4'), ('y', '<f4')]", "False", "(24, 512)", ours, (size_t)T * V * 4);
        rc = DIFF(f, "");
        check(rc == 1 && strstr(out, "dtype [('x', '<f4'), ('y', '<f4')]: a structured dtype"),
              "diff-logits: 19: a structured dtype -> the whole descr in the message");
        if (rc != 1 || !strstr(out, "structured")) printf("     rc=%d output: %.300s\n", rc, out);
        free(tr);
    }
    // 6 tokens, the last one perturbed: the last quarter holds it (no position is dropped)
    for (int k = 0; k < V; k++) x[k] = ours[(size_t)5 * V + k] + (k % 5) * 0.4f;
    {
        float *six = (float *)xmalloc((size_t)6 * V * 4, "a test");
        memcpy(six, ours, (size_t)5 * V * 4);
        memcpy(six + (size_t)5 * V, x, (size_t)V * 4);
        write_file(f, six, (size_t)6 * V * 4);
        free(six);
        snprintf(cmd, sizeof cmd, "%s -m %s --cpu --tokens 9,8,7,6,5,4 --diff-logits %s 2>&1", QWEN, m, f);
        rc = run_cmd(cmd, out, sizeof out);
        check(rc == 1 && strstr(out, "first position with KL over 0.001: 5 ") && strstr(out, "it grows with the position"),
              "diff-logits: 6 tokens, the last one off: found, and the trend grows (every position in a quarter)");
        if (rc != 1) printf("     rc=%d output: %.400s\n", rc, out);
    }
    // .npy of float32 (2-D and transformers' 3-D), float16, float64
    {
        uint16_t *h = (uint16_t *)xmalloc((size_t)T * V * 2, "a test");
        double *d = (double *)xmalloc((size_t)T * V * 8, "a test");
        for (size_t i = 0; i < (size_t)T * V; i++) { h[i] = f32_to_fp16_bits(ours[i]); d[i] = ours[i]; }
        struct { const char *descr, *shape; const void *p; size_t n; double tol; } np[4] = {
            {"'<f4'", "(24, 1024)", ours, (size_t)T * V * 4, 0}, {"'<f4'", "(1, 24, 1024)", ours, (size_t)T * V * 4, 0},
            {"'<f2'", "(24, 1024)", h, (size_t)T * V * 2, 1e-5}, {"'<f8'", "(24, 1024)", d, (size_t)T * V * 8, 0}};
        int good = 1;
        for (int k = 0; k < 4; k++) {
            write_npy(f, np[k].descr, "False", np[k].shape, np[k].p, np[k].n);
            rc = DIFF(f, "");
            const char *mx = strstr(out, ", max ");
            double kl = mx ? atof(mx + 6) : 1;
            int ok = rc == 0 && strstr(out, ".npy, float") && kl <= np[k].tol;
            if (!ok) printf("     %s %s: rc=%d output: %.300s\n", np[k].descr, np[k].shape, rc, out);
            good &= ok;
        }
        check(good, "diff-logits: .npy float32 (n, V) and (1, n, V), float16 and float64 are read");
        free(h); free(d);
    }
    // bad input: a one-line error, exit 1, and no --diff-out file left behind
    {
        float nan_row[1024];
        memcpy(nan_row, ours, sizeof nan_row);
        nan_row[77] = NAN;
        struct { const char *descr, *fortran, *shape; size_t n; const char *expect; } bad[] = {
            {"'>f4'", "False", "(24, 1024)", (size_t)T * V * 4, "only little-endian float16"},
            {"'<i4'", "False", "(24, 1024)", (size_t)T * V * 4, "dtype '<i4'"},
            {"'<f4'", "True", "(24, 1024)", (size_t)T * V * 4, "Fortran order"},
            {"'<f4'", "False", "(2, 24, 1024)", (size_t)T * V * 4, "(n_tokens, n_vocab) or (1, n_tokens, n_vocab)"},
            {"'<f4'", "False", "(23, 1024)", (size_t)23 * V * 4, "holds 23 rows of logits; the prompt has 24 tokens"},
            {"'<f4'", "False", "(24, 1000)", (size_t)T * 1000 * 4, "has 1000 logits per position; this model has 1024"},
            {"'<f4'", "False", "(24, 1024)", (size_t)T * V * 4 - 8, "(24, 1024) float32 is 98304 bytes, and 98296 follow"},
            {"'<f4'", "False", "(24, 1024)", (size_t)T * V * 4, "the logit of id 77 at position 5 is not finite"},
            {NULL, NULL, NULL, (size_t)T * V * 4 - 4, "are not 24 rows of float32"},
            {NULL, NULL, NULL, 0, "is not a regular, non-empty file"},
            {NULL, NULL, NULL, (size_t)5 * V * 4, "holds 5 rows of logits; the prompt has 24 tokens"},
            {"'<f8'", "False", "(24, 1024)", (size_t)T * V * 8, "the logit of id 3 at position 0 is past float32's range"},
            {NULL, NULL, NULL, 11, "too short for a .npy header"},
        };
        int good = 1, nb = (int)(sizeof bad / sizeof bad[0]);
        for (int k = 0; k < nb; k++) {
            float *data = x;
            memcpy(x, ours, (size_t)T * V * 4);
            if (k == 7) memcpy(x + (size_t)5 * V, nan_row, sizeof nan_row);
            double *big = NULL;
            if (k == 11) { // float64 logits past float32's range (finite in float64)
                big = (double *)xmalloc((size_t)T * V * 8, "a test");
                for (size_t i = 0; i < (size_t)T * V; i++) big[i] = i == 3 ? 1e300 : ours[i];
                data = (float *)big;
            }
            if (k == 12) memcpy(x, "\x93NUMPY\x02\x00\x05\x00\x00", 11); // a v2 header cut short
            if (bad[k].descr) write_npy(f, bad[k].descr, bad[k].fortran, bad[k].shape, data, bad[k].n);
            else write_file(f, data, bad[k].n);
            free(big);
            snprintf(cmd, sizeof cmd, "%s -m %s --cpu --tokens %s --diff-logits %s --diff-out %s 2>&1", QWEN, m, ids, f, out_tsv);
            rc = run_cmd(cmd, out, sizeof out);
            const char *e = strstr(out, "error:"); // the model's line, then one error line, the last
            int one_line = e && strchr(e, '\n') && !strchr(e, '\n')[1];
            int ok = rc == 1 && strstr(out, bad[k].expect) && strstr(out, "error:") && one_line && access(out_tsv, F_OK) != 0;
            if (!ok) printf("     case %d: rc=%d output: %.300s\n", k, rc, out);
            good &= ok;
            unlink(out_tsv);
        }
        check(good, "diff-logits: 13 bad headers, shapes, sizes and values -> a one-line error, exit 1, no --diff-out left");
        // an output that cannot be written is an error before any work (no report printed)
        snprintf(cmd, sizeof cmd, "%s -m %s --cpu --tokens %s --diff-logits %s --diff-out /nonexistent/t.tsv 2>&1", QWEN, m,
                 ids, ref);
        rc = run_cmd(cmd, out, sizeof out);
        check(rc == 1 && strstr(out, "--diff-out '/nonexistent/t.tsv': no such directory") && !strstr(out, "diff-logits:"),
              "diff-logits: an unwritable --diff-out is an error before any work");
        // an output that is one of the inputs
        snprintf(cmd, sizeof cmd, "%s -m %s --cpu --tokens %s --diff-logits %s --diff-out %s 2>&1", QWEN, m, ids, ref, ref);
        rc = run_cmd(cmd, out, sizeof out);
        check(rc == 1 && strstr(out, "is the --diff-logits file"), "diff-logits: --diff-out onto the --diff-logits file is refused");
    }
#undef DIFF
    free(x);
    free(ours);
    unlink(f);
    unlink(ref);
    rmdir(dir);
}

// =================================================================================================
// Tokenizer: reference ids from Hugging Face tokenizers and llama.cpp's vectors, round trips, NFC
// =================================================================================================

// Minimal JSON for tok-ref-public.json: an array of {"text": "...", "ids": [...], ...}.
static const char *json_skip(const char *p) { while (*p && isspace((unsigned char)*p)) p++; return p; }
static const char *json_string(const char *p, char *out, size_t cap, size_t *len) { // p at the opening quote
    size_t n = 0;
    p++;
    while (*p && *p != '"') {
        uint32_t cp;
        if (*p == '\\') {
            p++;
            switch (*p) {
            case 'n': cp = '\n'; break;
            case 't': cp = '\t'; break;
            case 'r': cp = '\r'; break;
            case 'b': cp = '\b'; break;
            case 'f': cp = '\f'; break;
            case 'u': {
                char hex[5] = {p[1], p[2], p[3], p[4], 0};
                cp = (uint32_t)strtol(hex, NULL, 16);
                p += 4;
                if (cp >= 0xd800 && cp < 0xdc00 && p[1] == '\\' && p[2] == 'u') { // surrogate pair
                    char hex2[5] = {p[3], p[4], p[5], p[6], 0};
                    uint32_t lo = (uint32_t)strtol(hex2, NULL, 16);
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                    p += 6;
                }
                break;
            }
            default: cp = (unsigned char)*p; break;
            }
            p++;
            char u[4];
            int l = cp_to_utf8(cp, u);
            if (n + l < cap) { memcpy(out + n, u, l); n += l; }
        } else {
            if (n + 1 < cap) out[n++] = *p;
            p++;
        }
    }
    out[n] = 0;
    *len = n;
    return *p ? p + 1 : p;
}

static int same_ids(const int *a, int na, const int *b, int nb) { return na == nb && (na == 0 || !memcmp(a, b, na * sizeof(int))); }

static void print_ids_diff(const char *what, const int *got, int ng, const int *want, int nw) {
    printf("     %s: got", what);
    for (int i = 0; i < ng && i < 40; i++) printf(" %d", got[i]);
    printf("\n     %*s  want", (int)strlen(what), "");
    for (int i = 0; i < nw && i < 40; i++) printf(" %d", want[i]);
    printf("\n");
}

// NFC of a UTF-8 string with the tokenizer's normalizer
static char *nfc_utf8(const char *s, size_t len, size_t *out_len) {
    uint32_t *c = (uint32_t *)xmalloc(len * 4 + 4, "a test"), *d = (uint32_t *)xmalloc((len * NFC_MAX_DECOMP + 1) * 4, "a test");
    int n = nfc(c, utf8_to_cps((const unsigned char *)s, len, c), d);
    char *o = (char *)xmalloc((size_t)n * 4 + 1, "a test");
    size_t k = 0;
    for (int i = 0; i < n; i++) k += cp_to_utf8(d[i], o + k);
    o[k] = 0;
    *out_len = k;
    free(c); free(d);
    return o;
}

// llama.cpp's vector files: one line of blank-separated ids per case (an empty line: no ids)
static int parse_space_ids(const char *s, int **out) {
    int n = 0, cap = 16;
    int *ids = (int *)xmalloc(cap * sizeof(int), "a test");
    for (char *end; *s; s = end) {
        long v = strtol(s, &end, 10);
        if (end == s) break;
        if (n == cap) ids = (int *)realloc(ids, (cap *= 2) * sizeof(int));
        ids[n++] = (int)v;
    }
    *out = ids;
    return n;
}

static int load_vocab(const char *name, GGUF *g, Tokenizer *t) {
    char path[512], err[300];
    snprintf(path, sizeof path, "%s/tokenizer/%s", DATA, name);
    if (!need_fixture(path, name)) return -1;
    if (gguf_open(g, path) != 0) { printf("FAIL open %s: %s\n", name, g->err); n_fail++; return -1; }
    if (tokenizer_init(t, g, 0, err, sizeof err) != 0) { printf("FAIL tokenizer %s: %s\n", name, err); n_fail++; return -1; }
    return 0;
}

// llama.cpp's vectors: .inp strings separated by "\n__ggml_vocab_test__\n", .out one line of ids each
static void check_vocab_vectors(const Tokenizer *t, const char *stem, const char *label) {
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizer/%s.inp", DATA, stem);
    size_t il;
    char *inp = read_file(path, &il);
    snprintf(path, sizeof path, "%s/tokenizer/%s.out", DATA, stem);
    char *outs = read_file(path, NULL);
    if (!inp || !outs) { check(0, "vocab vectors readable"); return; }
    const char *sep = "\n__ggml_vocab_test__\n";
    int cases = 0, ok = 0, round = 0, expected = 0; // expected: one line of ids per case
    for (const char *c = outs; *c; c++) expected += *c == '\n';
    char *p = inp, *o = outs;
    for (;;) {
        char *e = strstr(p, sep);
        if (!e) break;
        char *oe = strchr(o, '\n');
        if (!oe) break;
        *oe = 0;
        int *want, nw = parse_space_ids(o, &want), *got;
        int ng = tokenizer_encode(t, p, (size_t)(e - p), 0, &got);
        cases++;
        if (same_ids(got, ng, want, nw)) ok++;
        else { printf("     case %d: %.60s\n", cases - 1, p); print_ids_diff("ids", got, ng, want, nw); }
        size_t dl, nl;
        char *dec = tokenizer_decode(t, got, ng, 1, &dl);
        char *norm = t->nfc ? nfc_utf8(p, (size_t)(e - p), &nl) : NULL;
        if (t->nfc ? (dl == nl && !memcmp(dec, norm, dl)) : (dl == (size_t)(e - p) && !memcmp(dec, p, dl))) round++;
        free(dec); free(norm); free(want); free(got);
        p = e + strlen(sep);
        o = oe + 1;
    }
    char name[200];
    snprintf(name, sizeof name, "tokenizer %s: %d llama.cpp vectors, identical ids (mismatches)", label, cases);
    report(cases > 0 && cases == expected && ok == cases, name, cases == expected ? cases - ok : expected - cases, 0);
    snprintf(name, sizeof name, "tokenizer %s: decode(encode(s)) == %s for all %d (mismatches)", label, t->nfc ? "NFC(s)" : "s", cases);
    report(cases > 0 && cases == expected && round == cases, name, cases == expected ? cases - round : expected - cases, 0);
    free(inp);
    free(outs);
}

// The tokenizer's fixed-size buffers against their worst cases, without a vocabulary: every code
// point's full decomposition fits NFC_MAX_DECOMP (and one needs all of it, so the bound is the
// table's, not a guess); a text of the longest decompositions normalizes within nfc's room; every
// lead byte the streaming printer buffers, followed by continuation bytes that utf8_to_cps rejects
// or accepts, prints whole (one U+FFFD for a rejected sequence).
static void test_utf8_bounds(void) {
    int worst = 0;
    uint32_t worst_cp = 0, buf[64];
    for (uint32_t cp = 0; cp <= 0x10ffff; cp++) {
        int n = decompose(cp, buf);
        if (n > worst) { worst = n; worst_cp = cp; }
    }
    char name[160];
    snprintf(name, sizeof name, "NFC: the longest full decomposition (U+%04X) is NFC_MAX_DECOMP", worst_cp);
    report(worst == NFC_MAX_DECOMP, name, worst, NFC_MAX_DECOMP);
    // U+1F82 x 200 and a combining acute accent (no quick path): 801 code points before composing
    const int reps = 200;
    uint32_t *in = (uint32_t *)xmalloc((reps + 1) * 4, "a test"), *out = (uint32_t *)xmalloc(((size_t)(reps + 1) * NFC_MAX_DECOMP + 1) * 4, "a test");
    for (int i = 0; i < reps; i++) in[i] = 0x1f82;
    in[reps] = 0x301;
    int n = nfc(in, reps + 1, out), same = n == reps + 1;
    for (int i = 0; i < reps && same; i++) same = out[i] == 0x1f82;
    check(same && out[reps] == 0x301, "NFC: 200 x U+1F82 + U+0301 normalizes to itself (4 code points each on the way)");
    free(in); free(out);
    // the streaming printer: every lead byte 0x80..0xff, then 3 bytes that complete or break it
    int whole = 1;
    for (int lead = 0x80; lead <= 0xff; lead++)
        for (int k = 0; k < 4; k++) {
            const unsigned char tails[4][3] = {{0x80, 0x80, 0x80}, {0xbf, 0xbf, 0xbf}, {0xa0, 0x90, 0x80}, {0x8f, 0x9f, 0xbf}};
            char bytes[4] = {(char)lead, (char)tails[k][0], (char)tails[k][1], (char)tails[k][2]};
            static char obuf[64];
            FILE *f = fmemopen(obuf, sizeof obuf, "w");
            Stream st = {{0}, 0, f};
            stream_bytes(&st, bytes, 4);
            stream_flush(&st);
            long len = ftell(f);
            fclose(f);
            // expected: the input cut where each lead byte says its sequence ends (C0-DF: 2 bytes,
            // E0-EF: 3, F0-F7: 4, anything else: 1); a piece that is one valid code point is
            // printed as it is, any other piece as one U+FFFD
            char want[64];
            size_t nw = 0;
            for (int i = 0; i < 4;) { // only byte 0 can be a lead: every piece ends inside the 4 bytes
                unsigned c = (unsigned char)bytes[i];
                int L = c >= 0xc0 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf7 ? 4 : 1;
                uint32_t one[4];
                if (utf8_to_cps((const unsigned char *)bytes + i, (size_t)L, one) == 1 && one[0] != 0xfffd) {
                    memcpy(want + nw, bytes + i, (size_t)L);
                    nw += (size_t)L;
                } else {
                    memcpy(want + nw, "\xef\xbf\xbd", 3);
                    nw += 3;
                }
                i += L;
            }
            whole &= (size_t)len == nw && !memcmp(obuf, want, nw);
        }
    check(whole, "tokenizer: the streaming printer, every lead byte with 4 tails: each sequence as itself or one U+FFFD");
}

static void test_tokenizer(void) {
    GGUF g;
    Tokenizer t;
    double t0 = now_sec();
    if (load_vocab("vocab-qwen2.gguf", &g, &t) == 0) {
        double load_ms = (now_sec() - t0) * 1e3;
        printf("info tokenizer: vocab-qwen2.gguf (%d tokens) loaded in %.1f ms (not a timed test: see make bench-tokenizer)\n", t.n_vocab, load_ms);
        // Hugging Face's ids (special tokens recognised, no BOS)
        char path[512];
        snprintf(path, sizeof path, "%s/tokenizer/tok-ref-public.json", DATA);
        char *json = read_file(path, NULL);
        int cases = 0, ok = 0, round = 0;
        static char text[1 << 16];
        for (const char *p = json ? strstr(json, "\"text\"") : NULL; p; p = strstr(p, "\"text\"")) {
            size_t tl;
            p = json_skip(strchr(p + 6, ':') + 1);
            p = json_string(p, text, sizeof text, &tl);
            const char *q = strstr(p, "\"ids\"");
            q = strchr(q, '[') + 1;
            int want[4096], nw = 0;
            while (*(q = json_skip(q)) != ']') {
                want[nw++] = (int)strtol(q, (char **)&q, 10);
                q = json_skip(q);
                if (*q == ',') q++;
            }
            int *got, ng = tokenizer_encode(&t, text, tl, 1, &got);
            cases++;
            if (same_ids(got, ng, want, nw)) ok++;
            else { printf("     case %d: %.60s\n", cases - 1, text); print_ids_diff("ids", got, ng, want, nw); }
            size_t dl, nl;
            char *dec = tokenizer_decode(&t, got, ng, 1, &dl), *norm = nfc_utf8(text, tl, &nl);
            if (dl == nl && !memcmp(dec, norm, dl)) round++;
            free(dec); free(norm); free(got);
            p = q;
        }
        free(json);
        const int n_ref = 28; // the cases in tok-ref-public.json: a short read would pass on fewer
        report(cases == n_ref && ok == cases, "tokenizer qwen2: Hugging Face tok-ref-public.json, 28 cases, identical ids (mismatches)",
               cases == n_ref ? cases - ok : n_ref - cases, 0);
        report(cases == n_ref && round == cases, "tokenizer qwen2: tok-ref-public.json decode(encode(s)) == NFC(s) (mismatches)",
               cases == n_ref ? cases - round : n_ref - cases, 0);
        check_vocab_vectors(&t, "ggml-vocab-qwen2.gguf", "qwen2");
        // the special tokens are tried longest first (a token that is a prefix of another must lose),
        // ties by id
        {
            int ordered = t.n_special > 20;
            for (int i = 1; i < t.n_special; i++) {
                int la = t.text_len[t.special[i - 1]], lb = t.text_len[t.special[i]];
                ordered &= la > lb || (la == lb && t.special[i - 1] < t.special[i]);
            }
            check(ordered, "tokenizer: special tokens are matched longest first");
        }

        // invalid UTF-8: each maximal ill-formed subpart becomes one U+FFFD, as Python decodes it
        {
            // a stray byte, a cut sequence, a surrogate; overlong forms (C0/C1 leads, E0 80, F0 8F), a
            // lead past U+10FFFF (F5) and a sequence past it (F4 90): U+FFFD counts as Python gives them
            const char bad[] = "a\xff" "b\xe2\x82" "c\xed\xa0\x80" "d\xc0\x80" "e\xc1\xbf" "f\xe0\x80\x80" "g\xf0\x8f\xbf\xbf"
                               "h\xf5\x80" "i\xf4\x90\x80\x80" "j";
            const int n_fffd[] = {1, 1, 3, 2, 2, 3, 4, 2, 4};
            char fixed[256];
            size_t fl = 0;
            for (int k = 0; k < 9; k++) {
                fixed[fl++] = (char)('a' + k);
                for (int r = 0; r < n_fffd[k]; r++) { memcpy(fixed + fl, "\xef\xbf\xbd", 3); fl += 3; }
            }
            fixed[fl++] = 'j';
            int *x, *y, nx = tokenizer_encode(&t, bad, sizeof bad - 1, 1, &x), ny = tokenizer_encode(&t, fixed, fl, 1, &y);
            check(same_ids(x, nx, y, ny) && nx > 0, "tokenizer: invalid UTF-8 is read as U+FFFD (maximal subparts, overlong forms)");
            free(x); free(y);
        }
        // the pre-tokenizer's pieces against its pattern, worked out by hand: contractions in any case
        // ('s 't 're 've 'm 'll 'd), letter runs with one leading non-letter, single digits, the
        // whitespace rules (up to the last newline; a run before a word leaves its last space to it)
        {
            const char *in = "I'dog've you'LLama they'REd x'Mx'Sy'Tz 'M 123 ab\n\n  x!!\n?";
            const char *want = "I|'d|og|'ve| you|'LL|ama| they|'RE|d| x|'M|x|'S|y|'T|z| '|M| |1|2|3| ab|\n\n| | x|!!\n|?|";
            uint32_t cp[64];
            int n = (int)strlen(in);
            for (int i = 0; i < n; i++) cp[i] = (unsigned char)in[i];
            char got[256];
            size_t gl = 0;
            for (int pos = 0; pos < n;) {
                int l = pretok_match(cp, n, pos, PRE_QWEN2);
                for (int i = 0; i < l; i++) got[gl++] = (char)cp[pos + i];
                got[gl++] = '|';
                pos += l;
            }
            got[gl] = 0;
            check(!strcmp(got, want), "tokenizer: pre-tokenizer pieces of a hand-checked string (contractions, digits, spaces)");
            if (strcmp(got, want)) printf("     got  %s\n     want %s\n", got, want);
        }
        // special tokens: recognised, or plain text with parse_special off (user-defined ones still split)
        {
            const char *chat = "<|im_start|>user\nhi<think></think><|im_end|>";
            int *a, *b, na = tokenizer_encode(&t, chat, strlen(chat), 1, &a), nb = tokenizer_encode(&t, chat, strlen(chat), 0, &b);
            int has_ctrl_a = 0, has_ctrl_b = 0, think_b = 0;
            for (int i = 0; i < na; i++) has_ctrl_a += a[i] == t.im_start_id || a[i] == t.im_end_id;
            for (int i = 0; i < nb; i++) { has_ctrl_b += b[i] == t.im_start_id || b[i] == t.im_end_id; think_b += b[i] == tok_id(&t, "<think>"); }
            check(has_ctrl_a == 2 && has_ctrl_b == 0 && think_b == 1, "tokenizer: control tokens split out only with parse_special; <think> always");
            free(a); free(b);
        }
        // end of generation and the chat template
        check(tokenizer_is_eog(&t, t.im_end_id) && tokenizer_is_eog(&t, tok_id(&t, "<|endoftext|>")) && !tokenizer_is_eog(&t, 9707),
              "tokenizer: <|im_end|> and <|endoftext|> end generation");
        {
            size_t at, at2;
            char *turn = chat_turn(&t, "Be brief.", "Hi", 1, 0, &at), *turn2 = chat_turn(&t, NULL, "More", 0, 1, &at2);
            check(!strcmp(turn, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n") &&
                  !strcmp(turn2, "\n<|im_start|>user\nMore<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n") &&
                  !strncmp(turn + at, "Hi<|im_end|>", 12) && !strncmp(turn2 + at2, "More<|im_end|>", 14),
                  "tokenizer: ChatML turns (system, next turn, thinking off; where the user's text starts)");
            free(turn); free(turn2);
        }
        // streaming: feeding one token at a time never leaves a partial UTF-8 sequence on the output
        {
            const char *mixed = "🚀 нещо на Български 我想在apple工作 ✅ 🦙🦙 é";
            int *x, nx = tokenizer_encode(&t, mixed, strlen(mixed), 1, &x);
            static char buf[4096];
            FILE *f = fmemopen(buf, sizeof buf, "w");
            Stream st = {{0}, 0, f};
            int partial = 0;
            for (int i = 0; i < nx; i++) {
                int plen;
                const char *piece = tokenizer_piece(&t, x[i], 0, &plen);
                stream_bytes(&st, piece, plen);
                fflush(f);
                long len = ftell(f);
                uint32_t tmp[4096];
                // a cut sequence would decode into U+FFFD at the end
                int nc = utf8_to_cps((const unsigned char *)buf, (size_t)len, tmp);
                if (nc > 0 && tmp[nc - 1] == 0xfffd) partial++;
            }
            stream_flush(&st);
            long len = ftell(f);
            fclose(f);
            check(partial == 0 && len == (long)strlen(mixed) && !memcmp(buf, mixed, len), "tokenizer: streamed output is whole UTF-8 and equals the text");
            free(x);
        }
        tokenizer_free(&t);
        gguf_close(&g);
    }
    if (load_vocab("vocab-qwen2-pre35.gguf", &g, &t) == 0) {
        check(t.pre == PRE_QWEN35 && !t.nfc, "tokenizer: pre 'qwen35' selected, no NFC");
        check_vocab_vectors(&t, "ggml-vocab-qwen35.gguf", "qwen35");
        tokenizer_free(&t);
        gguf_close(&g);
    }
    // the tiny models' own vocabulary: their token sequences survive decode + encode
    if (load_vocab("vocab-tiny.gguf", &g, &t) == 0) {
        for (int si = 0; si < n_seqs; si++) {
            if (strcmp(SEQS[si].name, "text") && strcmp(SEQS[si].name, "chat")) continue;
            size_t dl;
            char *dec = tokenizer_decode(&t, SEQS[si].ids, SEQS[si].n, 1, &dl);
            int *x, nx = tokenizer_encode(&t, dec, dl, 1, &x);
            char name[160];
            snprintf(name, sizeof name, "tokenizer tiny vocab: encode(decode(seq-%s)) == seq-%s", SEQS[si].name, SEQS[si].name);
            check(same_ids(x, nx, SEQS[si].ids, SEQS[si].n), name);
            if (!same_ids(x, nx, SEQS[si].ids, SEQS[si].n)) print_ids_diff("ids", x, nx, SEQS[si].ids, SEQS[si].n);
            free(dec); free(x);
        }
        tokenizer_free(&t);
        gguf_close(&g);
    }
    // NFC against the Unicode conformance file, when the UCD is installed (Debian: unicode-data)
    FILE *nt = popen("bzcat /usr/share/unicode/NormalizationTest.txt.bz2 2>/dev/null || cat /usr/share/unicode/NormalizationTest.txt 2>/dev/null", "r");
    int lines = 0, bad = 0;
    char line[4096];
    while (nt && fgets(line, sizeof line, nt)) {
        if (line[0] == '#' || line[0] == '@' || line[0] == '\n') continue;
        uint32_t col[5][32];
        int nc[5] = {0, 0, 0, 0, 0}, k = 0;
        for (char *p = line; *p && *p != '#' && k < 5; p++) {
            if (*p == ';') { k++; continue; }
            if (isxdigit((unsigned char)*p)) {
                col[k][nc[k]++] = (uint32_t)strtol(p, &p, 16);
                p--;
            }
        }
        if (k < 5) continue;
        lines++;
        // NFC: c2 == NFC(c1) == NFC(c2) == NFC(c3); c4 == NFC(c4) == NFC(c5)
        int want_of[5] = {1, 1, 1, 3, 3};
        for (int c = 0; c < 5; c++) {
            uint32_t out[128];
            int n = nfc(col[c], nc[c], out), w = want_of[c];
            if (n != nc[w] || memcmp(out, col[w], (size_t)n * 4)) bad++;
        }
    }
    if (nt) pclose(nt);
    if (lines > 0) report(bad == 0 && lines > 18000, "NFC: Unicode NormalizationTest.txt, every line (> 18000), 5 columns (failures)", bad, 0);
    else skip("NFC: Unicode NormalizationTest.txt", "/usr/share/unicode not installed (Debian package unicode-data)");
}

// =================================================================================================
// Perplexity and llama.cpp's KL-divergence base files (CPU path)
// =================================================================================================
// One KL-divergence base record, each value against the format's definition (llama.cpp's): the log
// probability log_softmax(logits)[i] stored as min_log_prob + scale * q[i], q a uint16 rounded to
// nearest, logits below max - 16 clamped to q = 0. Checked per value against log-probabilities
// computed here in double, so an encoder that truncates or clamps wrongly fails even though its own
// decoder would agree with it.
static void test_kld_record(void) {
    const int V = 5000;
    float *lg = (float *)xmalloc(V * 4, "a test");
    for (int i = 0; i < V; i++) lg[i] = nrand() * 6.0f; // a range of ~50: some values below max - 16
    lg[123] = 21.0f;
    uint16_t *rec = (uint16_t *)xcalloc(kld_record_words(V), 2, "a test");
    kld_encode(lg, V, rec);
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < V; i++) mx = fmax(mx, lg[i]);
    for (int i = 0; i < V; i++) sum += exp(lg[i] - mx);
    float scale, min_lp;
    memcpy(&scale, rec, 4);
    memcpy(&min_lp, rec + 2, 4);
    double lse = mx + log(sum), e = 0;
    int clamped = 0, bad_clamp = 0;
    e = worse(e, fabs(scale - 16.0 / 65535) / (16.0 / 65535));         // the range is exactly 16 here
    e = worse(e, fabs(min_lp - (mx - 16 - lse)) / (16.0 / 65535));     // in steps of the grid
    for (int i = 0; i < V; i++) {
        double lp = lg[i] - lse;
        if (lg[i] < mx - 16) { clamped++; bad_clamp += rec[4 + i] != 0; continue; }
        // within half a step of the grid, plus float rounding of the encoder's arithmetic
        e = worse(e, fabs(min_lp + (double)scale * rec[4 + i] - lp) / scale);
    }
    report(e <= 0.5 + 1e-2 && clamped > 0 && bad_clamp == 0,
           "kl-divergence base record: each log-prob within half a uint16 step, below max-16 stored as 0: steps", e, 0.51);
    // and the engine's decoder of that record, against the log-probabilities computed here
    double *lpd = (double *)xmalloc(V * sizeof(double), "a test"), ed = 0;
    kld_decode(rec, V, lpd);
    for (int i = 0; i < V; i++)
        if (lg[i] >= mx - 16) ed = worse(ed, fabs(lpd[i] - (lg[i] - lse)) / scale);
    report(ed <= 0.5 + 1e-2, "kl-divergence base record: kld_decode within half a step of log_softmax: steps", ed, 0.51);
    // the clamped tail: scored against logits whose tail lies far below the clamp (30 and 100 nats
    // under the top instead of the record's -16), the tail adds nothing; counted, it would add
    // sum_tail e^(min_log_prob) (min_log_prob - ours) ~ 1e-7 x 84 nats for each of ~2000 entries
    {
        float *ours = (float *)xmalloc(V * 4, "a test");
        for (int i = 0; i < V; i++) ours[i] = lg[i] < mx - 16 ? (float)mx - 30 - 70 * (i % 2) : lg[i];
        double *lq = (double *)xmalloc(V * sizeof(double), "a test"), tail = 0, all = 0;
        log_softmax(ours, V, lq);
        for (int i = 0; i < V; i++) all += exp(lpd[i]) * (lpd[i] - lq[i]);
        double k = kld_position(lpd, lq, V);
        tail = all - k;
        report(fabs(k) < 1e-6 && tail > 1e-3, "kl-divergence: a clamped tail far below the clamp adds nothing (|KLD| with the tail left out)",
               fabs(k), 1e-6);
        printf("info kl-divergence: the same record with its clamped tail counted: KLD %.3g\n", all);
        free(ours);
        free(lq);
    }
    // llama-perplexity's statistics: percentiles by linear interpolation at q (n - 1), the median
    // of an even count the mean of the middle two, no standard error from 10 values or fewer
    {
        double v[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, mean, err;
        mean_err(45, 285, 10, &mean, &err);
        double m2, e2;
        mean_err(55, 385, 11, &m2, &e2); // 0..10: variance 10, standard error sqrt(10/10) = 1
        check(fabs(percentile(v, 10, 0.999) - 8.991) < 1e-12 && percentile(v, 10, 0.05) == 0.45 &&
              median(v, 10) == 4.5 && median(v, 9) == 4 && percentile(v, 10, 1) == 9 && percentile(v, 10, 0) == 0 &&
              mean == 4.5 && err == 0 && m2 == 5 && fabs(e2 - 1) < 1e-12,
              "kl-divergence statistics: percentiles, median and standard errors as llama-perplexity defines them");
    }
    free(lpd);
    free(lg);
    free(rec);
}

static void test_perplexity(void) {
    test_kld_record();
    char f32p[512], q40p[512], base[256];
    snprintf(f32p, sizeof f32p, "%s/tiny-qwen3/tiny-qwen3-f32.gguf", DATA);
    snprintf(q40p, sizeof q40p, "%s/tiny-qwen3/tiny-qwen3-q4_0.gguf", DATA);
    if (!need_fixture(f32p, "perplexity: tiny-qwen3 f32") || !need_fixture(q40p, "perplexity: tiny-qwen3 q4_0")) return;
    const Seq *seq = NULL;
    for (int i = 0; i < n_seqs; i++) if (!strcmp(SEQS[i].name, "long")) seq = &SEQS[i];
    if (!seq) { check(0, "perplexity: seq-long present"); return; }
    snprintf(base, sizeof base, "%s/base.kld", TMP);
    const int n_ctx = 256; // one chunk: the scored positions 128..254 are rows of the reference files
    Model mf, mq;
    model_open(&mf, f32p);
    model_open(&mq, q40p);
    Engine ef, eq;
    engine_init(&ef, &mf, 0, n_ctx);
    engine_init(&eq, &mq, 0, n_ctx);
    FILE *f = fopen(base, "wb");
    kld_base_write_header(f, n_ctx, mf.c.n_vocab, 1, seq->ids);
    PplResult w = perplexity(&ef, seq->ids, 1, n_ctx, f, NULL, 0);
    fclose(f);
    // the NLL straight from the exact reference logits
    char path[600];
    size_t rn, qn;
    snprintf(path, sizeof path, "%s/tiny-qwen3/tiny-qwen3-f32-long.f32", DATA);
    float *ref = read_f32(path, &rn);
    snprintf(path, sizeof path, "%s/tiny-qwen3/tiny-qwen3-q4_0-long.f32", DATA);
    float *refq = read_f32(path, &qn);
    int V = mf.c.n_vocab;
    double nll = 0, kl = 0, *lp = (double *)xmalloc(V * sizeof(double), "a test"), *lq = (double *)xmalloc(V * sizeof(double), "a test");
    for (int j = n_ctx / 2; j <= n_ctx - 2; j++) {
        log_softmax(ref + (size_t)j * V, V, lp);
        log_softmax(refq + (size_t)j * V, V, lq);
        nll -= lp[seq->ids[j + 1]];
        for (int i = 0; i < V; i++) kl += exp(lp[i]) * (lp[i] - lq[i]);
    }
    int ns = n_ctx - 1 - n_ctx / 2;
    double ppl_ref = exp(nll / ns), kl_ref = kl / ns;
    report(fabs(w.ppl - ppl_ref) / ppl_ref <= 1e-4, "perplexity: PPL of tiny-qwen3 f32 (seq-long, -c 256) vs the exact logits' PPL: rel. diff",
           fabs(w.ppl - ppl_ref) / ppl_ref, 1e-4);
    // the plain path (no base file: only the targets' log-probabilities come back, engine_nll)
    PplResult w2 = perplexity(&ef, seq->ids, 1, n_ctx, NULL, NULL, 0);
    report(fabs(w2.ppl - ppl_ref) / ppl_ref <= 1e-4 && w2.n_scored == ns,
           "perplexity without a base file (engine_nll): PPL vs the exact logits' PPL: rel. diff", fabs(w2.ppl - ppl_ref) / ppl_ref, 1e-4);
    KldBase b;
    char err[600];
    int rc = kld_base_read(&b, base, V, err, sizeof err);
    check(rc == 0 && b.n_ctx == (uint32_t)n_ctx && b.n_chunk == 1 && !memcmp(b.tokens, seq->ids, n_ctx * 4),
          "kl-divergence base: written file reads back (header, tokens)");
    if (rc == 0) {
        // Against itself the KLD is what the u16 format leaves: log-probabilities in steps of at most
        // 16/65535 nats; the entries clamped 16 nats below the top are not scored. Work that floor
        // out from the exact logits; the measured KLD must be that and nothing more, and tiny.
        double floor_kl = 0, *lb = (double *)xmalloc(V * sizeof(double), "a test");
        uint16_t *rec = (uint16_t *)xmalloc(kld_record_words(V) * 2, "a test");
        for (int j = n_ctx / 2; j <= n_ctx - 2; j++) {
            kld_encode(ref + (size_t)j * V, V, rec);
            kld_decode(rec, V, lb);
            log_softmax(ref + (size_t)j * V, V, lp);
            floor_kl += kld_position(lb, lp, V);
        }
        floor_kl /= ns;
        free(lb); free(rec);
        PplResult self = perplexity(&ef, seq->ids, 1, n_ctx, NULL, &b, 0);
        printf("info kl-divergence: f32 against its own base: KLD %.3g, the format's floor %.3g\n", self.kld_mean, floor_kl);
        report(self.kld_mean >= 0 && self.kld_mean < 1e-7 && fabs(self.kld_mean - floor_kl) <= 1e-9 && self.same_top == 1.0,
               "kl-divergence base: f32 against its own base: KLD minus the u16 format's floor (same top 100 %)",
               fabs(self.kld_mean - floor_kl), 1e-9);
        PplResult q = perplexity(&eq, seq->ids, 1, n_ctx, NULL, &b, 0);
        // the u16 log-probabilities: steps of at most 16/65535 nats, and the tail below max - 16 clamped
        double d = fabs(q.kld_mean - kl_ref);
        report(d <= 2e-4 * fmax(1.0, kl_ref), "kl-divergence base: q4_0 scored against the f32 base vs KL from the exact logits: |d|",
               d, 2e-4 * fmax(1.0, kl_ref)); // measured 4.4e-5
        printf("info kl-divergence: KL(f32 || q4_0) from the base file %.6f, from the exact logits %.6f\n", q.kld_mean, kl_ref);
        // the base's own side of the report: its PPL, from the targets' stored log-probabilities
        // (within half a u16 step of the exact ones, and clamped at max - 16 as the format stores
        // them: a random model puts many targets down there), and how often the top tokens agree
        int agree = 0;
        double nllb = 0;
        for (int j = n_ctx / 2; j <= n_ctx - 2; j++) {
            const float *r = ref + (size_t)j * V;
            agree += argmax(r, V) == argmax(refq + (size_t)j * V, V);
            double rmx = -INFINITY, rmn = INFINITY, rs = 0;
            for (int i = 0; i < V; i++) { rmx = fmax(rmx, r[i]); rmn = fmin(rmn, r[i]); }
            for (int i = 0; i < V; i++) rs += exp(r[i] - rmx);
            double lse = rmx + log(rs);
            nllb -= fmax(r[seq->ids[j + 1]], fmax(rmn, rmx - 16)) - lse;
        }
        double pplb_ref = exp(nllb / ns);
        report(fabs(q.ppl_base - pplb_ref) / pplb_ref <= 3e-4,
               "kl-divergence base: PPL(base) vs the exact f32 logits' PPL, clamped as stored: rel. diff",
               fabs(q.ppl_base - pplb_ref) / pplb_ref, 3e-4);
        report(fabs(q.same_top - (double)agree / ns) <= 1.0 / ns,
               "kl-divergence base: q4_0's same-top fraction vs the exact logits' agreement: |d|", fabs(q.same_top - (double)agree / ns),
               1.0 / ns);
        free(b.data);
    }
    // self-score through the command line, one fixture of each architecture: a base written by
    // --cpu and scored by --cpu on the same file is the u16 format's rounding alone
    {
        const char *fx[4] = {"tiny-qwen2/tiny-qwen2-f16", "tiny-qwen3/tiny-qwen3-q4_0", "tiny-qwen3-tied/tiny-qwen3-tied-f32",
                             "tiny-qwen35/tiny-qwen35-f16"};
        char txt[300], mp[400], c2[1200], name[300], sbase[300];
        static char out[16384];
        snprintf(sbase, sizeof sbase, "%s.self", base);
        snprintf(txt, sizeof txt, "%s/greedy.jsonl", DATA);
        for (int k = 0; k < 4; k++) {
            snprintf(mp, sizeof mp, "%s/%s.gguf", DATA, fx[k]);
            snprintf(name, sizeof name, "kl-divergence: %s scored against its own --cpu base: mean < 1e-5, no value below -1e-6", fx[k]);
            if (!need_fixture(mp, name)) continue;
            snprintf(c2, sizeof c2, "%s -m %s --cpu --perplexity -c 64 --chunks 8 -f %s --kl-divergence-base %s >/dev/null 2>&1 && "
                     "%s -m %s --cpu --kl-divergence --kl-divergence-base %s 2>&1", QWEN, mp, txt, sbase, QWEN, mp, sbase);
            int rc = run_cmd(c2, out, sizeof out);
            const char *mean = strstr(out, "Mean    KLD:"), *mn = strstr(out, "Minimum KLD:");
            double km = mean ? atof(mean + 12) : 1, kmin = mn ? atof(mn + 12) : -1;
            printf("info kl-divergence: %s against its own base: mean KLD %.3g, minimum %.3g\n", fx[k], km, kmin);
            report(rc == 0 && mean && mn && km < 1e-5 && kmin >= -1e-6, name, km, 1e-5);
            unlink(sbase);
        }
    }
    // broken files are refused with a reason
    {
        size_t len;
        char *whole = read_file(base, &len), tpath[300], e2[600];
        snprintf(tpath, sizeof tpath, "%s.trunc", base);
        write_file(tpath, whole, len - 100);
        KldBase x;
        int r1 = kld_base_read(&x, tpath, V, e2, sizeof e2);
        check(r1 != 0 && strstr(e2, "truncated"), "kl-divergence base: a truncated file is refused");
        free(x.data);
        whole[0] = 'X';
        write_file(tpath, whole, len);
        int r2 = kld_base_read(&x, tpath, V, e2, sizeof e2);
        check(r2 != 0 && strstr(e2, "not a KL-divergence base file"), "kl-divergence base: a foreign file is refused");
        free(x.data);
        int r3 = kld_base_read(&x, base, V + 1, e2, sizeof e2);
        check(r3 != 0 && strstr(e2, "not comparable"), "kl-divergence base: another vocabulary is refused");
        free(x.data);
        whole[0] = '_';
        int32_t bad_id = V; // the last token of the file's first chunk, one past the vocabulary
        memcpy(whole + 20 + 4 * (n_ctx - 1), &bad_id, 4);
        write_file(tpath, whole, len);
        int r4 = kld_base_read(&x, tpath, V, e2, sizeof e2);
        check(r4 != 0 && strstr(e2, "outside the vocabulary"), "kl-divergence base: a token id past the vocabulary is refused");
        free(x.data);
        unlink(tpath);
        free(whole);
    }
    // on the GPU: batched prompts, only the NLLs coming back (one batch, and batches of 100 rows)
    for (int bi = 0; bi < 2; bi++) {
        int nb = bi ? 100 : 512;
        char nm[200], nm2[200];
        snprintf(nm, sizeof nm, "perplexity on the GPU (-b %d): PPL of tiny-qwen3 f32 vs the exact logits' PPL: rel. diff", nb);
        snprintf(nm2, sizeof nm2, "kl-divergence on the GPU (-b %d): q4_0 against the f32 base vs KL from the exact logits: |d|", nb);
        if (!HAVE_GPU) { skip(nm, "no GPU"); skip(nm2, "no GPU"); continue; }
        g_n_batch = nb;
        Engine gf, gq;
        engine_init(&gf, &mf, 1, n_ctx);
        engine_init(&gq, &mq, 1, n_ctx);
        g_n_batch = 512;
        PplResult gp = perplexity(&gf, seq->ids, 1, n_ctx, NULL, NULL, 0);
        report(fabs(gp.ppl - ppl_ref) / ppl_ref <= 1e-4, nm, fabs(gp.ppl - ppl_ref) / ppl_ref, 1e-4);
        FILE *gfile = fopen(base, "wb");
        kld_base_write_header(gfile, n_ctx, V, 1, seq->ids);
        perplexity(&gf, seq->ids, 1, n_ctx, gfile, NULL, 0);
        fclose(gfile);
        KldBase gb;
        char gerr[600];
        if (kld_base_read(&gb, base, V, gerr, sizeof gerr) == 0) {
            PplResult q = perplexity(&gq, seq->ids, 1, n_ctx, NULL, &gb, 0);
            double d = fabs(q.kld_mean - kl_ref);
            report(d <= 1e-3 * fmax(1.0, kl_ref), nm2, d, 1e-3 * fmax(1.0, kl_ref));
            free(gb.data);
        } else {
            check(0, nm2);
        }
        engine_free(&gf); engine_free(&gq);
    }
    unlink(base);
    free(ref); free(refq); free(lp); free(lq);
    engine_free(&ef); engine_free(&eq);
    gguf_close(&mf.gguf); gguf_close(&mq.gguf);
}

// =================================================================================================
// VRAM budget arithmetic and the refusal path (host only: the card is simulated)
// =================================================================================================
static void test_budget(void) {
    const char *models[] = {"tiny-qwen3/tiny-qwen3-q4_0", "tiny-qwen3-tied/tiny-qwen3-tied-q6_k", "tiny-qwen35/tiny-qwen35-iq4_xs"};
    for (int mi = 0; mi < 3; mi++) {
        char path[300], name[200];
        snprintf(path, sizeof path, "%s/%s.gguf", DATA, models[mi]);
        snprintf(name, sizeof name, "budget %s", models[mi]);
        if (!need_fixture(path, name)) continue;
        Model m;
        model_open(&m, path);
        const Config *c = &m.c;
        int n_ctx = 1000;
        Budget b;
        memset(&b, 0, sizeof b);
        budget_compute(&b, &m, n_ctx);
        // independent count from the file: every tensor but token_embd, unless the output is tied to it
        size_t w = 0;
        double elems = 0;
        int tied = gguf_tensor(&m.gguf, "output.weight") == NULL;
        for (int64_t i = 0; i < m.gguf.n_tensors; i++) {
            const GGUFTensor *t = &m.gguf.tensors[i];
            if (!strcmp(t->name, "token_embd.weight") && !tied) continue;
            w += (t->nbytes + 255) / 256 * 256;
            elems += (double)t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
        }
        size_t kv = 2 * (((size_t)c->n_kv_layers * n_ctx * c->n_head_kv * c->head_dim * 2 + 255) / 256 * 256);
        size_t conv_dim = (2 * (size_t)c->ssm_k_heads + c->ssm_v_heads) * c->ssm_state;
        size_t st = ((size_t)c->n_gdn_layers * (3 * conv_dim + (size_t)c->ssm_v_heads * c->ssm_state * c->ssm_state) * 4 + 255) / 256 * 256;
        snprintf(name, sizeof name, "budget %s: weights, KV cache, DeltaNet state match the file", models[mi]);
        check(b.weights == w && b.kv == kv && b.state == st && b.logits == ((size_t)c->n_vocab * 4 + 255) / 256 * 256, name);
        if (b.weights != w || b.kv != kv || b.state != st)
            printf("     weights %zu vs %zu, kv %zu vs %zu, state %zu vs %zu\n", b.weights, w, b.kv, kv, b.state, st);
        // a card 1 byte too small: refused, and the hinted context is the largest that fits
        b.measured = 1;
        b.context = 300u << 20;
        b.card_free = budget_need(&b) - 1;
        b.card_total = b.card_free + b.context;
        FitHint h = budget_hint(&b, &m, n_ctx);
        Budget at = b, above = b;
        budget_compute(&at, &m, h.max_ctx);
        budget_compute(&above, &m, h.max_ctx + 1);
        snprintf(name, sizeof name, "budget %s: 1 byte short is refused; hint -c %d fits, -c %d does not", models[mi], h.max_ctx, h.max_ctx + 1);
        check(!budget_fits(&b) && h.max_ctx < n_ctx && h.max_ctx > 0 && budget_fits(&at) && !budget_fits(&above), name);
        snprintf(name, sizeof name, "budget %s: bits/weight of the refusal = 8 x the weights' bytes / their count in the file", models[mi]);
        report(fabs(h.bpw - 8.0 * w / elems) <= 1e-9 * h.bpw, name, fabs(h.bpw - 8.0 * w / elems), 1e-9 * h.bpw);
        // what must be free is every part of the table, the upload staging included; an exact fit fits;
        // one byte short, the weights must average just under what they do now
        Budget exact = b;
        exact.card_free = budget_need(&b);
        snprintf(name, sizeof name, "budget %s: the need is the sum of its parts; an exact fit fits; 1 byte short asks bits/weight just below the file's", models[mi]);
        check(budget_need(&b) == b.weights + b.kv + b.state + b.logits + b.scratch + b.batch + 2 * (size_t)UPLOAD_CHUNK &&
              b.staging == 2 * (size_t)UPLOAD_CHUNK && budget_fits(&exact) && h.bpw_fit < h.bpw && h.bpw_fit > h.bpw - 1e-3, name);
        char msg[8192];
        FILE *f = fmemopen(msg, sizeof msg, "w");
        budget_refusal(&b, &m, n_ctx, 15.5 * 1073741824.0, f);
        fclose(f);
        snprintf(name, sizeof name, "budget %s: the refusal names the sizes, the largest -c and the bits/weight", models[mi]);
        check(strstr(msg, "DOES NOT FIT") && strstr(msg, "largest context that fits is -c") && strstr(msg, "bits/weight") &&
              h.bpw > 3 && h.bpw_fit < h.bpw, name);
        // a card too small for the rest of the budget alone: no quantization can fit, and the
        // hint says so instead of asking for a bits/weight of 0 or less (issue 51, its family of
        // messages that suggest a fix)
        Budget tiny = b;
        tiny.card_free = (budget_need(&b) - b.weights) / 2;
        f = fmemopen(msg, sizeof msg, "w");
        budget_refusal(&tiny, &m, n_ctx, 0, f);
        fclose(f);
        snprintf(name, sizeof name, "budget %s: a card too small for any quantization -> the hint says so, no impossible bits/weight", models[mi]);
        check(strstr(msg, "no quantization of this model fits") && !strstr(msg, "at most 0.00") && !strstr(msg, "at most -"), name);
        gguf_close(&m.gguf);
    }
    check(parse_size("15.5G") == 15.5 * 1073741824.0 && parse_size("900MiB") == 900.0 * 1048576 && parse_size("1x") < 0 &&
          parse_size("-3G") < 0, "parse_size: 15.5G, 900MiB; rejects 1x and -3G");
}

// =================================================================================================
// GPU: each kernel against its C twin
// =================================================================================================

// Random but valid blocks of a type: random quant bits, fp16 scales drawn from a sane range.
static void random_row(int type, uint8_t *dst, int64_t n_in) {
    size_t nb = row_bytes(type, n_in);
    for (size_t i = 0; i < nb; i++) dst[i] = (uint8_t)(urand() * 256);
    int64_t nblk = n_in / TYPE_TRAITS[type].blck;
    for (int64_t b = 0; b < nblk; b++) {
        uint8_t *blk = dst + b * TYPE_TRAITS[type].type_size;
        uint16_t d = f32_to_fp16_bits(nrand() * 0.02f), m = f32_to_fp16_bits(nrand() * 0.02f);
        switch (type) {
        case GGML_TYPE_F32: for (int64_t i = 0; i < n_in; i++) ((float *)dst)[i] = nrand(); return;
        case GGML_TYPE_F16: for (int64_t i = 0; i < n_in; i++) ((uint16_t *)dst)[i] = f32_to_fp16_bits(nrand()); return;
        case GGML_TYPE_BF16:
            for (int64_t i = 0; i < n_in; i++) { float f = nrand(); uint32_t u; memcpy(&u, &f, 4); ((uint16_t *)dst)[i] = (uint16_t)(u >> 16); }
            return;
        case GGML_TYPE_Q6_K: memcpy(blk + 208, &d, 2); break;              // d is last
        case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_1: case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K:
            memcpy(blk, &d, 2); memcpy(blk + 2, &m, 2); break;
        default: memcpy(blk, &d, 2); break;                                 // d first
        }
    }
}

// activations with the occasional large outlier, as real Qwen activations have
static void random_act(float *x, int n) {
    for (int i = 0; i < n; i++) x[i] = nrand() * (urand() < 0.02f ? 40.0f : 1.0f);
}

static void *dcopy(const void *h, size_t n) {
    void *d;
    CUDA_CHECK(cudaMalloc(&d, n ? n : 4));
    if (n) CUDA_CHECK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    return d;
}

// host copy of a quantized vector, from the C twin
typedef struct { int n; int8_t *H, *L; float *s; int *sum; } HostXQ;
static HostXQ quantize_host(const float *x, int n) {
    HostXQ h = {n, (int8_t *)xmalloc(n, "a test"), (int8_t *)xmalloc(n, "a test"), (float *)xmalloc(n / 32 * 4, "a test"), (int *)xmalloc(n / 32 * 4, "a test")};
    for (int b = 0; b < n / 32; b++) quantize_block_c(x + 32 * b, h.H + 32 * b, h.L + 32 * b, &h.s[b], &h.sum[b]);
    return h;
}
static void free_hxq(HostXQ *h) { free(h->H); free(h->L); free(h->s); free(h->sum); }
// the device layout: chunk c of block b at q[c * nb + b]
static XQ upload_xq(const HostXQ *h) {
    int nb = h->n / 32;
    int8_t *q = (int8_t *)xmalloc((size_t)nb * 64, "a test");
    for (int b = 0; b < nb; b++)
        for (int c = 0; c < 4; c++) memcpy(q + ((size_t)c * nb + b) * 16, (c < 2 ? h->H : h->L) + 32 * b + 16 * (c % 2), 16);
    XQ x = {(int4 *)dcopy(q, (size_t)nb * 64), (float *)dcopy(h->s, nb * 4u), (int *)dcopy(h->sum, nb * 4u)};
    free(q);
    return x;
}
// A kernel's 16-bit output buffer for n values, filled beforehand with the blocks of another
// vector (its own random stream, so the tests' data stay as they are): a kernel that leaves blocks
// unwritten then fails its check instead of passing on what the test put there.
static XQ upload_junk_xq(int n) {
    static uint64_t jr = 0x5eed0f7e57ull;
    float *x = (float *)xmalloc((size_t)n * 4, "a test");
    for (int i = 0; i < n; i++) x[i] = (rng_f32(&jr) - 0.5f) * 7.0f;
    HostXQ h = quantize_host(x, n);
    XQ d = upload_xq(&h);
    free_hxq(&h);
    free(x);
    return d;
}
static HostXQ download_xq(XQ x, int n) {
    int nb = n / 32;
    HostXQ h = {n, (int8_t *)xmalloc(n, "a test"), (int8_t *)xmalloc(n, "a test"), (float *)xmalloc(nb * 4u, "a test"), (int *)xmalloc(nb * 4u, "a test")};
    int8_t *q = (int8_t *)xmalloc((size_t)nb * 64, "a test");
    CUDA_CHECK(cudaMemcpy(q, x.q, (size_t)nb * 64, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(h.s, x.s, nb * 4u, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(h.sum, x.sum, nb * 4u, cudaMemcpyDeviceToHost));
    for (int b = 0; b < nb; b++)
        for (int c = 0; c < 4; c++) memcpy((c < 2 ? h.H : h.L) + 32 * b + 16 * (c % 2), q + ((size_t)c * nb + b) * 16, 16);
    free(q);
    return h;
}
static int same_xq(const HostXQ *a, const HostXQ *b) {
    return !memcmp(a->H, b->H, a->n) && !memcmp(a->L, b->L, a->n) && !memcmp(a->s, b->s, a->n / 32 * 4) &&
           !memcmp(a->sum, b->sum, a->n / 32 * 4);
}
static void free_xq(XQ x) { cudaFree(x.q); cudaFree(x.s); cudaFree(x.sum); }

// Upload W as the engine does: file blocks as they are, the fast types rewritten into planes on the
// GPU by repack_kernel, in two launches as the engine's upload chunks do (the second starts at file
// block b0 > 0 of a source pointer moved to it). Returns 1 if the GPU's planes equal repack_c's.
// (Both call repack_block: this checks the launches' indexing; the plane layout itself is checked
// by the mat-vec tests, whose C twin reads the file blocks, and by test_iq4_planes.)
static int upload_like_engine(Tensor *W) {
    W->dev = dcopy(W->host, W->nbytes);
    W->planes = 0;
    if (!is_fast_type(W->type)) return 1;
    size_t tsz = TYPE_TRAITS[W->type].type_size, nblk = W->nbytes / tsz, NB = (size_t)(W->n_in / 32) * W->n_out;
    uint8_t *planes;
    CUDA_CHECK(cudaMalloc(&planes, W->nbytes));
    int n_sub = (int)(W->n_in / 32);
    CUDA_CHECK(cudaMemset(planes, 0xa5, W->nbytes)); // bytes no launch writes show
    size_t half = nblk / 2;
    for (int part = 0; part < 2; part++) {
        size_t b0 = part ? half : 0, n = part ? nblk - half : half;
        if (n == 0) continue;
        repack_kernel<<<(unsigned)((n + 255) / 256), 256>>>(W->type, (int)tsz, (const uint8_t *)W->dev + b0 * tsz, planes,
                                                            b0, n, NB, W->so, n_sub);
        KERNEL_CHECK();
    }
    uint8_t *got = (uint8_t *)xmalloc(W->nbytes, "a test"), *want = (uint8_t *)xmalloc(W->nbytes, "a test");
    CUDA_CHECK(cudaMemcpy(got, planes, W->nbytes, cudaMemcpyDeviceToHost));
    repack_c(W->type, W->host, want, nblk, NB, W->so, n_sub);
    int same = !memcmp(got, want, W->nbytes);
    free(got); free(want);
    cudaFree(W->dev);
    W->dev = planes;
    W->planes = 1;
    return same;
}

// The error scale of a product y[t, n] = W[n, :] . x[t, :]: scale[t * n_out + n] = sum_k |W[n, k] x[t, k]|
// for T input rows x (T, n_in) and the n_out rows of W (file bytes of `type`, rb bytes a row).
static void abs_dot_scale(int type, const uint8_t *w, size_t rb, int n_in, int n_out, const float *x, int T,
                          double *scale, float *row /* (n_in) scratch */) {
    for (int n = 0; n < n_out; n++) {
        dequant_row(type, w + n * rb, row, n_in);
        for (int t = 0; t < T; t++) {
            double sa = 0;
            for (int k = 0; k < n_in; k++) sa += fabs((double)row[k] * x[(size_t)t * n_in + k]);
            scale[(size_t)t * n_out + n] = sa;
        }
    }
}

static double max_rel_err(const float *got, const float *ref, const double *scale, int n) {
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double e = fabs((double)got[i] - ref[i]) / (scale[i] + 1e-6);
        worst = worse(worst, e);
    }
    return worst;
}

// softplus(x) = log(1 + e^x), for the DeltaNet gates written out independently of gdn_gates
static float softplus_ref(float x) { return x > 20.0f ? x : logf(1.0f + expf(x)); }

// Quantize a whole fp32 vector (n a multiple of 32), one warp per block: the tests' entry to
// quantize_block_warp (the engine quantizes inside the kernels that produce its vectors).
__global__ void quantize_kernel(XQ xq, const float *x /* (n) */, int n) {
    int b = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP, nb = n / 32;
    if (b < nb) quantize_block_warp(x[32 * b + threadIdx.x % WARP], xq, b, nb);
}

static void test_gpu_quantize(void) {
    const char *name = "gpu quantize_kernel vs quantize_block_c: bit-identical";
    const int n = 4096;
    float *x = (float *)xmalloc(n * 4, "a test");
    random_act(x, n);
    for (int i = 64; i < 96; i++) x[i] = 0.0f;     // an all-zero block
    x[200] = 1e6f; x[300] = -3e-8f;               // extremes
    HostXQ want = quantize_host(x, n);
    // the C quantizer alone (no GPU needed): x^ = s*X is at most amax/65024 per block from x
    double worst = 0;
    for (int i = 0; i < n; i++) {
        float amax = want.s[i / 32] * XQ_MAX;
        double xh = (double)want.s[i / 32] * (256 * want.H[i] + want.L[i]);
        if (amax > 0) worst = worse(worst, fabs(xh - x[i]) / amax);
    }
    // half a step (amax/65024), plus the fp32 rounding of x * (32512/amax) (up to ~0.002 of a step)
    report(worst <= 1.02 / 65024, "quantize_block_c: |x^ - x| / amax(block)", worst, 1.02 / 65024);
    if (!HAVE_GPU) { skip(name, "no GPU"); free_hxq(&want); free(x); return; }
    float *dx = (float *)dcopy(x, n * 4);
    // the output starts as another vector's blocks, so that blocks the kernel leaves alone show
    float *y = (float *)xmalloc(n * 4, "a test");
    random_act(y, n);
    HostXQ other = quantize_host(y, n);
    XQ dq = upload_xq(&other);
    quantize_kernel<<<n / 32 / 4, 128>>>(dq, dx, n);
    KERNEL_CHECK();
    HostXQ got = download_xq(dq, n);
    check(same_xq(&got, &want) && !same_xq(&other, &want), name);
    free_hxq(&want); free_hxq(&got); free_hxq(&other); free_xq(dq); cudaFree(dx); free(x); free(y);
}

// How far the 16-bit x can move y = W x, per row r of W (n_out rows of n_in, file bytes of `type`):
// each x_i moves by at most d_i = 1.02 amax(block)/65024 (test_gpu_quantize), so y moves by at
// most lin[r] = sum |w_i| d_i. The moves are rounding errors, spread evenly over [-d_i, d_i]
// (variance d_i^2 / 3) and independent, so their sum has a standard deviation of
// sd[r] = sqrt(sum w_i^2 d_i^2 / 3): a row's sum over 6 sd is a bug, not bad luck, and on long
// rows that bound is the tighter one. scale (or NULL) gets each row's sum |w_i x_i|.
static void xq_bounds(int type, const uint8_t *w, size_t rb, int64_t n_in, int64_t n_out,
                      const float *x, const HostXQ *hq, double *scale, double *lin, double *sd,
                      float *row /* (n_in) scratch */) {
    for (int64_t r = 0; r < n_out; r++) {
        dequant_row(type, w + r * rb, row, n_in);
        double s = 0, l = 0, v = 0;
        for (int64_t i = 0; i < n_in; i++) {
            double d = 1.02 * hq->s[i / 32] * XQ_MAX / 65024, aw = fabs((double)row[i]);
            s += aw * fabs(x[i]);
            l += aw * d;
            v += aw * aw * d * d / 3;
        }
        if (scale) scale[r] = s;
        lin[r] = l, sd[r] = sqrt(v);
    }
}

// The largest |got - exact| of n rows against xq_bounds' two bounds (plus 1e-5 of the scale for
// the fp32 sums), folded into *worst_lin and *worst_sd.
static void xq_worst(const float *got, const float *exact, const double *scale, const double *lin,
                     const double *sd, int64_t n, double *worst_lin, double *worst_sd) {
    for (int64_t r = 0; r < n; r++) {
        double d = fabs((double)got[r] - exact[r]), f = 1e-5 * scale[r] + 1e-30;
        *worst_lin = worse(*worst_lin, d / (lin[r] + f));
        *worst_sd = worse(*worst_sd, d / (6 * sd[r] + f));
    }
}

// The C twins alone (no GPU): matvec_xq_c with the 16-bit x against matvec_c with the fp32 x,
// within xq_bounds' two bounds (plus 1e-5 of the scale for the fp32 sums), every quantized type
// and the shapes of the GPU check below.
static void test_xq_rounding(void) {
    const int types[] = {GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1,
                         GGML_TYPE_Q8_0, GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS, GGML_TYPE_Q4_K,
                         GGML_TYPE_Q5_K, GGML_TYPE_Q6_K};
    const int shapes[][2] = {{1, 1}, {3, 37}, {8, 129}, {17, 64}, {40, 300}, {300, 9}};
    double worst_lin = 0, worst_sd = 0;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            int type = types[ti];
            int64_t n_in = (int64_t)shapes[si][0] * TYPE_TRAITS[type].blck, n_out = shapes[si][1];
            size_t rb = row_bytes(type, n_in);
            uint8_t *w = (uint8_t *)xmalloc(rb * n_out, "a test");
            for (int64_t r = 0; r < n_out; r++) random_row(type, w + r * rb, n_in);
            float *x = (float *)xmalloc(n_in * 4, "a test"), *row = (float *)xmalloc(n_in * 4, "a test");
            float *yq = (float *)xmalloc(n_out * 4, "a test"), *y = (float *)xmalloc(n_out * 4, "a test");
            double *sc = (double *)xmalloc(n_out * 3 * sizeof(double), "a test");
            random_act(x, (int)n_in);
            HostXQ hq = quantize_host(x, (int)n_in);
            Tensor W = {"test", type, n_in, n_out, w, rb * n_out, NULL, 0};
            matvec_xq_c(&W, hq.H, hq.L, hq.s, NULL, yq, 0, row);
            matvec_c(&W, x, y, NULL, 0, row);
            xq_bounds(type, w, rb, n_in, n_out, x, &hq, sc, sc + n_out, sc + 2 * n_out, row);
            xq_worst(yq, y, sc, sc + n_out, sc + 2 * n_out, n_out, &worst_lin, &worst_sd);
            free_hxq(&hq);
            free(w); free(x); free(row); free(yq); free(y); free(sc);
        }
    report(worst_lin <= 1, "matvec_xq_c (16-bit x) vs matvec_c (fp32 x), 10 types: |d| / (the sum "
           "of |w_i| times x_i's rounding bound)", worst_lin, 1);
    report(worst_sd <= 1, "matvec_xq_c (16-bit x) vs matvec_c (fp32 x), 10 types: |d| / (6 sd of "
           "the roundings' sum)", worst_sd, 1);
}

// the fast mat-vec kernel under test, for the check names
#define MV_TAG(fast) (!(fast) ? "" : g_mv_mode == MV_STREAM ? " (streaming)" : " (per-block)")
static void test_gpu_matvec(void) {
    const int types[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1,
                         GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0, GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS,
                         GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K};
    // (n_in in blocks, n_out): odd row counts, one-block rows, long rows, rows longer than a block's pass (the
    // fast kernel then takes half the rows per block)
    const int shapes[][2] = {{1, 1}, {3, 37}, {8, 129}, {17, 64}, {40, 300}, {300, 9}};
    cudaStream_t st = 0;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        int type = types[ti], fast = is_fast_type(type);
        double worst = 0, worst_exact = 0, worst_sd = 0;
        int repack_ok = 1;
        char name[160], name2[160], name3[160], name4[160];
        snprintf(name, sizeof name, "gpu mat-vec %s%s vs %s (6 shapes, bias, accumulate): |d|/sum|wx|", type_name(type), MV_TAG(fast),
                 fast ? "matvec_xq_c" : "matvec_c");
        if (!fast && g_mv_mode == MV_BLOCKS) continue; // one kernel for the other types
        snprintf(name2, sizeof name2, "gpu repack_kernel %s%s vs repack_c: bit-identical planes", type_name(type), MV_TAG(fast));
        // against the fp32 x: within xq_bounds' two bounds (plus 1e-5 of the scale for the sums)
        snprintf(name3, sizeof name3, "gpu mat-vec %s%s with 16-bit x vs exact fp32 x: |d| / (sum |w_i| x_i's bound)", type_name(type), MV_TAG(fast));
        snprintf(name4, sizeof name4, "gpu mat-vec %s%s with 16-bit x vs exact fp32 x: |d| / (6 sd of the sum)", type_name(type), MV_TAG(fast));
        if (!HAVE_GPU) {
            skip(name, "no GPU");
            if (fast) { skip(name2, "no GPU"); skip(name3, "no GPU"); skip(name4, "no GPU"); }
            continue;
        }
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            int blk = TYPE_TRAITS[type].blck == 1 ? 32 : TYPE_TRAITS[type].blck;
            int64_t n_in = (int64_t)shapes[si][0] * blk, n_out = shapes[si][1];
            // float types: rows of any length (6.1's kernel), and rows of whole 16-byte vectors (6.4c's)
            if (TYPE_TRAITS[type].blck == 1 && si % 2 == 0) n_in += 13;
            if (fast && n_in % 32) continue;
            size_t rb = row_bytes(type, n_in);
            uint8_t *w = (uint8_t *)xmalloc(rb * n_out, "a test");
            for (int64_t r = 0; r < n_out; r++) random_row(type, w + r * rb, n_in);
            float *x = (float *)xmalloc(n_in * 4, "a test"), *bias = (float *)xmalloc(n_out * 4, "a test");
            float *y0 = (float *)xmalloc(n_out * 4, "a test"), *y_ref = (float *)xmalloc(n_out * 4, "a test"), *y = (float *)xmalloc(n_out * 4, "a test");
            float *y_exact = (float *)xmalloc(n_out * 4, "a test");
            double *scale = (double *)xmalloc(n_out * sizeof(double), "a test");
            double *lin = (double *)xmalloc(n_out * 2 * sizeof(double), "a test"), *sd = lin + n_out;
            float *row = (float *)xmalloc(n_in * 4, "a test");
            random_act(x, (int)n_in);
            for (int64_t i = 0; i < n_out; i++) { bias[i] = nrand(); y0[i] = nrand(); }
            HostXQ hq;
            memset(&hq, 0, sizeof hq);
            Act act;
            memset(&act, 0, sizeof act);
            act.f = (float *)dcopy(x, n_in * 4);
            if (fast) {
                hq = quantize_host(x, (int)n_in);
                act.q = upload_xq(&hq);
                xq_bounds(type, w, rb, n_in, n_out, x, &hq, NULL, lin, sd, row);
            }
            Tensor W = {"test", type, n_in, n_out, w, rb * n_out, NULL, 0};
            repack_ok &= upload_like_engine(&W);
            float *dy, *db = (float *)dcopy(bias, n_out * 4);
            CUDA_CHECK(cudaMalloc(&dy, n_out * 4));
            for (int accumulate = 0; accumulate < 2; accumulate++) {
                Tensor B = {"bias", GGML_TYPE_F32, n_out, 1, (const uint8_t *)bias, (size_t)n_out * 4, NULL, 0};
                memcpy(y_ref, y0, n_out * 4);
                memcpy(y_exact, y0, n_out * 4);
                if (fast) matvec_xq_c(&W, hq.H, hq.L, hq.s, bias, y_ref, accumulate, row);
                else matvec_c(&W, x, y_ref, &B, accumulate, row);
                matvec_c(&W, x, y_exact, &B, accumulate, row);
                for (int64_t r = 0; r < n_out; r++) { // error scale: sum |w_i x_i| (+ |bias| + |y0|)
                    dequant_row(type, w + r * rb, row, n_in);
                    double s = fabs(bias[r]) + (accumulate ? fabs(y0[r]) : 0);
                    for (int64_t i = 0; i < n_in; i++) s += fabs((double)row[i] * x[i]);
                    scale[r] = s;
                }
                CUDA_CHECK(cudaMemcpy(dy, y0, n_out * 4, cudaMemcpyHostToDevice));
                matvec(&W, &act, dy, db, accumulate, st);
                CUDA_CHECK(cudaMemcpy(y, dy, n_out * 4, cudaMemcpyDeviceToHost));
                worst = worse(worst, max_rel_err(y, y_ref, scale, (int)n_out));
                if (fast) xq_worst(y, y_exact, scale, lin, sd, n_out, &worst_exact, &worst_sd);
            }
            cudaFree(W.dev); cudaFree(act.f); cudaFree(dy); cudaFree(db);
            if (fast) { free_xq(act.q); free_hxq(&hq); }
            free(w); free(x); free(bias); free(y0); free(y_ref); free(y); free(y_exact); free(scale); free(lin);
            free(row);
        }
        report(worst <= 1e-5, name, worst, 1e-5);
        if (fast) {
            check(repack_ok, name2);
            report(worst_exact <= 1.0, name3, worst_exact, 1.0);
            report(worst_sd <= 1.0, name4, worst_sd, 1.0);
        }
    }
}

// FFN gate + up + SiLU (fast types: one mat-vec launch and silu_mul_quant_kernel) against two C
// mat-vecs, silu and the quantizer
static void test_gpu_gate_up(void) {
    const int types[] = {GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0,
                         GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K};
    for (int ti = 0; ti < 10; ti++) {
        int type = types[ti];
        char name[160];
        snprintf(name, sizeof name, "gpu ffn_gate_up %s%s vs matvec_xq_c x2 + silu_c: |d|/scale", type_name(type), MV_TAG(1));
        if (!HAVE_GPU) { skip(name, "no GPU"); continue; }
        const int n_in = 512, n_ff = 96;
        size_t rb = row_bytes(type, n_in);
        uint8_t *wg = (uint8_t *)xmalloc(rb * n_ff, "a test"), *wu = (uint8_t *)xmalloc(rb * n_ff, "a test");
        for (int r = 0; r < n_ff; r++) { random_row(type, wg + r * rb, n_in); random_row(type, wu + r * rb, n_in); }
        float x[n_in], g[n_ff], u[n_ff], h[n_ff], got[n_ff], row[n_in];
        random_act(x, n_in);
        HostXQ hq = quantize_host(x, n_in);
        Tensor G = {"gate", type, n_in, n_ff, wg, rb * n_ff, NULL, 0}, U = {"up", type, n_in, n_ff, wu, rb * n_ff, NULL, 0};
        upload_like_engine(&G);
        upload_like_engine(&U);
        matvec_xq_c(&G, hq.H, hq.L, hq.s, NULL, g, 0, row);
        matvec_xq_c(&U, hq.H, hq.L, hq.s, NULL, u, 0, row);
        for (int i = 0; i < n_ff; i++) h[i] = silu_c(g[i]) * u[i];
        XQ dq = upload_xq(&hq);
        double worst = 0;
        Act in, out;
        memset(&in, 0, sizeof in);
        in.q = dq;
        CUDA_CHECK(cudaMalloc(&out.f, n_ff * 4));
        CUDA_CHECK(cudaMemset(out.f, 0xff, n_ff * 4)); // NaNs until the kernel writes
        out.q = upload_junk_xq(n_ff);
        float *du;
        CUDA_CHECK(cudaMalloc(&du, n_ff * 4));
        ffn_gate_up(&G, &U, &in, &out, du, 0);
        cudaFree(du);
        CUDA_CHECK(cudaMemcpy(got, out.f, n_ff * 4, cudaMemcpyDeviceToHost));
        // relative to |h| plus its mean magnitude: a value near zero carries the rounding of its
        // inputs' sums, not its own size
        double hmean = 0;
        for (int i = 0; i < n_ff; i++) hmean += fabs(h[i]) / n_ff;
        for (int i = 0; i < n_ff; i++) worst = worse(worst, fabs(got[i] - h[i]) / (fabs(h[i]) + hmean));
        HostXQ gq = download_xq(out.q, n_ff), wq = quantize_host(got, n_ff); // its 16-bit copy of its own output
        report(worst <= 1e-4 && same_xq(&gq, &wq), name, worst, 1e-4);
        free_hxq(&hq); free_hxq(&gq); free_hxq(&wq);
        free_xq(dq); free_xq(out.q); cudaFree(out.f); cudaFree(G.dev); cudaFree(U.dev); free(wg); free(wu);
    }
}

// Kernel launches that fn(arg) enqueues on a fresh stream, counted in the graph it captures.
static int launches_of(void (*fn)(void *, cudaStream_t), void *arg) {
    cudaStream_t st;
    cudaGraph_t g;
    size_t nodes = 0;
    CUDA_CHECK(cudaStreamCreate(&st));
    CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    fn(arg, st);
    CUDA_CHECK(cudaStreamEndCapture(st, &g));
    CUDA_CHECK(cudaGraphGetNodes(g, NULL, &nodes));
    cudaGraphDestroy(g);
    cudaStreamDestroy(st);
    return (int)nodes;
}
// matvec_batch's arguments, for launches_of (matvec_qkv is matvec_batch of 3)
struct BatchCall {
    int n;
    const Tensor *const *W;
    const float *const *bias;
    float *const *y;
    const Act *in;
};
static void batch_call(void *arg, cudaStream_t st) {
    const BatchCall *c = (const BatchCall *)arg;
    matvec_batch(c->n, c->W, c->bias, c->y, c->in, st);
}

// q, k, v in one launch: three matrices of different fast types against matvec_xq_c (the mixed
// kernels switch on each matrix's type); or three float matrices against matvec_c, in one launch
// when they are of one type (6.4c), in three when not.
static void test_gpu_qkv_batch_types(const int types[3]) {
    char name[200];
    int fast = is_fast_type(types[0]);
    if (!fast && g_mv_mode == MV_BLOCKS) return; // one kernel for the float types
    int one_launch = fast || (types[1] == types[0] && types[2] == types[0]);
    snprintf(name, sizeof name, "gpu q/k/v in %s launch%s%s (%s + %s + %s, bias) vs %s: |d|/scale",
             one_launch ? "one" : "three", one_launch ? "" : "es", MV_TAG(fast), type_name(types[0]),
             type_name(types[1]), type_name(types[2]), fast ? "matvec_xq_c" : "matvec_c");
    if (!HAVE_GPU) { skip(name, "no GPU"); return; }
    const int n_in = 768, n_out[3] = {130, 34, 64};
    float x[n_in], row[n_in];
    random_act(x, n_in);
    HostXQ hq = quantize_host(x, n_in);
    Act in;
    memset(&in, 0, sizeof in);
    if (fast) in.q = upload_xq(&hq);
    else in.f = (float *)dcopy(x, n_in * 4);
    Tensor W[3];
    uint8_t *w[3];
    float *bias[3], *dbias[3], *dy[3], *ref[3], *got[3];
    for (int i = 0; i < 3; i++) {
        size_t rb = row_bytes(types[i], n_in);
        w[i] = (uint8_t *)xmalloc(rb * n_out[i], "a test");
        for (int r = 0; r < n_out[i]; r++) random_row(types[i], w[i] + r * rb, n_in);
        W[i] = (Tensor){"w", types[i], n_in, n_out[i], w[i], rb * n_out[i], NULL, 0};
        upload_like_engine(&W[i]);
        bias[i] = (float *)xmalloc(n_out[i] * 4, "a test");
        for (int r = 0; r < n_out[i]; r++) bias[i][r] = nrand();
        dbias[i] = (float *)dcopy(bias[i], n_out[i] * 4);
        CUDA_CHECK(cudaMalloc(&dy[i], n_out[i] * 4));
        ref[i] = (float *)xmalloc(n_out[i] * 4, "a test");
        got[i] = (float *)xmalloc(n_out[i] * 4, "a test");
        Tensor B = {"bias", GGML_TYPE_F32, n_out[i], 1, (const uint8_t *)bias[i],
                    (size_t)n_out[i] * 4, NULL, 0};
        if (fast) matvec_xq_c(&W[i], hq.H, hq.L, hq.s, bias[i], ref[i], 0, row);
        else matvec_c(&W[i], x, ref[i], &B, 0, row);
    }
    const Tensor *Wp[3] = {&W[0], &W[1], &W[2]};
    BatchCall call = {3, Wp, dbias, dy, &in};
    int launches = launches_of(batch_call, &call);
    for (int i = 0; i < 3; i++) // NaNs until the kernel writes
        CUDA_CHECK(cudaMemset(dy[i], 0xff, n_out[i] * 4));
    matvec_qkv(&W[0], &W[1], &W[2], dbias[0], dbias[1], dbias[2], &in, dy[0], dy[1], dy[2], 0);
    double worst = 0;
    for (int i = 0; i < 3; i++) {
        CUDA_CHECK(cudaMemcpy(got[i], dy[i], n_out[i] * 4, cudaMemcpyDeviceToHost));
        size_t rb = row_bytes(types[i], n_in);
        for (int r = 0; r < n_out[i]; r++) {
            dequant_row(types[i], w[i] + r * rb, row, n_in);
            double sc = fabs(bias[i][r]);
            for (int k = 0; k < n_in; k++) sc += fabs((double)row[k] * x[k]);
            worst = worse(worst, fabs(got[i][r] - ref[i][r]) / sc);
        }
        cudaFree(W[i].dev); cudaFree(dbias[i]); cudaFree(dy[i]); free(w[i]); free(bias[i]); free(ref[i]); free(got[i]);
    }
    report(worst <= 1e-5 && launches == (one_launch ? 1 : 3), name, worst, 1e-5);
    if (launches != (one_launch ? 1 : 3)) printf("    %d launches, not %d\n", launches, one_launch ? 1 : 3);
    free_hxq(&hq);
    if (fast) free_xq(in.q);
    else cudaFree(in.f);
}
// Four float matrices without biases in one launch (DeltaNet's in-projections: the last slot of
// FloatMv), one of them with no rows, against matvec_c.
static void test_gpu_float_batch4(void) {
    const char *name = "gpu mat-vec of 4 F16 matrices in one launch (no bias; 300, 0, 2 and 9 rows) "
                       "vs matvec_c: |d|/scale";
    if (g_mv_mode == MV_BLOCKS) return; // one kernel for the float types
    if (!HAVE_GPU) { skip(name, "no GPU"); return; }
    const int n_in = 264, n_out[4] = {300, 0, 2, 9};
    float x[n_in], row[n_in];
    random_act(x, n_in);
    Act in;
    memset(&in, 0, sizeof in);
    in.f = (float *)dcopy(x, n_in * 4);
    Tensor W[4];
    const Tensor *Wp[4];
    uint8_t *w[4];
    float *dy[4], *ref[4], *got[4];
    const float *nob[4] = {NULL, NULL, NULL, NULL};
    size_t rb = row_bytes(GGML_TYPE_F16, n_in);
    for (int i = 0; i < 4; i++) {
        w[i] = (uint8_t *)xmalloc(rb * n_out[i] + 1, "a test");
        for (int r = 0; r < n_out[i]; r++) random_row(GGML_TYPE_F16, w[i] + r * rb, n_in);
        W[i] = (Tensor){"w", GGML_TYPE_F16, n_in, n_out[i], w[i], rb * n_out[i], NULL, 0};
        upload_like_engine(&W[i]);
        Wp[i] = &W[i];
        CUDA_CHECK(cudaMalloc(&dy[i], n_out[i] * 4 + 4));
        CUDA_CHECK(cudaMemset(dy[i], 0xff, n_out[i] * 4 + 4)); // NaNs until the kernel writes
        ref[i] = (float *)xmalloc(n_out[i] * 4 + 4, "a test");
        got[i] = (float *)xmalloc(n_out[i] * 4 + 4, "a test");
        matvec_c(&W[i], x, ref[i], NULL, 0, row);
    }
    BatchCall call = {4, Wp, nob, dy, &in};
    int launches = launches_of(batch_call, &call);
    matvec_batch(4, Wp, nob, dy, &in, 0);
    double worst = 0;
    for (int i = 0; i < 4; i++) {
        CUDA_CHECK(cudaMemcpy(got[i], dy[i], n_out[i] * 4, cudaMemcpyDeviceToHost));
        for (int r = 0; r < n_out[i]; r++) {
            dequant_row(GGML_TYPE_F16, w[i] + r * rb, row, n_in);
            double sc = 0;
            for (int k = 0; k < n_in; k++) sc += fabs((double)row[k] * x[k]);
            worst = worse(worst, fabs(got[i][r] - ref[i][r]) / sc);
        }
        cudaFree(W[i].dev); cudaFree(dy[i]); free(w[i]); free(ref[i]); free(got[i]);
    }
    report(worst <= 1e-5 && launches == 1, name, worst, 1e-5);
    if (launches != 1) printf("    %d launches, not 1\n", launches);
    cudaFree(in.f);
}
static void test_gpu_qkv_batch(void) {
    const int a[3] = {GGML_TYPE_Q4_0, GGML_TYPE_Q5_K, GGML_TYPE_IQ4_XS},
              b[3] = {GGML_TYPE_Q4_K, GGML_TYPE_Q8_0, GGML_TYPE_IQ4_NL},
              d[3] = {GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1},
              c[3] = {GGML_TYPE_Q4_K, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K}; // Q4_K_M's q, k, v
    test_gpu_qkv_batch_types(a);
    test_gpu_qkv_batch_types(b);
    test_gpu_qkv_batch_types(c);
    test_gpu_qkv_batch_types(d);
    const int f[4][3] = {{GGML_TYPE_F16, GGML_TYPE_F16, GGML_TYPE_F16},
                         {GGML_TYPE_BF16, GGML_TYPE_BF16, GGML_TYPE_BF16},
                         {GGML_TYPE_F32, GGML_TYPE_F32, GGML_TYPE_F32},
                         {GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_F32}};
    for (int i = 0; i < 4; i++) test_gpu_qkv_batch_types(f[i]);
    test_gpu_float_batch4();
}

// The C side of a token's RoPE: optional RMSNorm per head (weights qn / kn, or NULL), then
// rope_neox_c, on n_head q heads and n_kv k heads in place (base 1e6, the tests' value).
static void rope_ref_c(float *qr, int n_head, float *kr, int n_kv, int hd, int n_rot, int pos, const float *qn,
                       const float *kn) {
    if (qn) for (int h = 0; h < n_head; h++) rmsnorm_c(qr + h * hd, qr + h * hd, qn, hd, 1e-6f);
    if (kn) for (int h = 0; h < n_kv; h++) rmsnorm_c(kr + h * hd, kr + h * hd, kn, hd, 1e-6f);
    rope_neox_c(qr, n_head, hd, n_rot, pos, 1e6f, 1.0f);
    rope_neox_c(kr, n_kv, hd, n_rot, pos, 1e6f, 1.0f);
}
// Error of the fp16 cache rows hk, hv (n values each) against the C values k, v rounded to fp16:
// relative to |value| + 1e-2 and divided by 10, so an off-by-one rounding (2^-11) shows as 4.9e-5.
static double kv_row_err(const __half *hk, const __half *hv, const float *k, const float *v, int n) {
    double e = 0;
    for (int i = 0; i < n; i++) {
        e = worse(e, fabs(__half2float(hk[i]) - __half2float(__float2half(k[i]))) / (fabs(k[i]) + 1e-2) / 10);
        e = worse(e, fabs(__half2float(hv[i]) - __half2float(__float2half(v[i]))) / (fabs(v[i]) + 1e-2) / 10);
    }
    return e;
}

static void test_gpu_small_kernels(void) {
    const char *names[] = {"gpu rmsnorm_quant_kernel vs rmsnorm_c + quantize_block_c",
                           "gpu rope_and_kv_store (full rotation) vs rope_neox_c: q, k",
                           "gpu rope_and_kv_store (qwen3 q/k norm) vs rmsnorm_c + rope_neox_c: q, k",
                           "gpu rope_and_kv_store (partial: 16 of 64 dims) vs rope_neox_c: q, k",
                           "gpu attention split+combine (chunks of 16-64 keys, 1 or more per split) vs attention_c (g=3, hd=64)",
                           "gpu attention split+combine (chunks of 16-64 keys, 1 or more per split) vs attention_c (g=8, hd=128)",
                           "gpu attention split+combine (chunks of 16-32 keys, 1 or more per split), sigmoid gate vs attention_c (g=6, hd=256)",
                           "gpu silu_mul_quant_kernel vs silu_c * u + quantize_block_c",
                           "gpu rope_angles + attention with RoPE + KV store folded in vs rope_neox_c + attention_c (g=3, hd=64)",
                           "gpu attention with q/k norm, RoPE + KV store folded in vs rmsnorm_c + rope_neox_c + attention_c (g=8, hd=128)",
                           "gpu attention with q/k norm, partial RoPE (64 of 256) + KV store folded in, sigmoid gate vs C (g=6, hd=256)",
                           "gpu attention split+combine (chunks of 16-40 keys, 1 or more per split) vs attention_c (g=2, hd=192)",
                           "gpu attention with q/k norm, RoPE + KV store folded in vs rmsnorm_c + rope_neox_c + attention_c (g=2, hd=192)"};
    if (SKIP_ALL_WITHOUT_GPU(names)) return;
    // rmsnorm + quantize
    {
        const int n = 1024;
        float x[n], w[n], ref[n], got[n];
        random_act(x, n);
        for (int i = 0; i < n; i++) w[i] = 1 + nrand() * 0.1f;
        rmsnorm_c(ref, x, w, n, 1e-6f);
        Act out;
        CUDA_CHECK(cudaMalloc(&out.f, n * 4));
        CUDA_CHECK(cudaMemset(out.f, 0xff, n * 4)); // NaNs until the kernel writes
        out.q = upload_junk_xq(n);
        float *dx = (float *)dcopy(x, n * 4), *dw = (float *)dcopy(w, n * 4);
        rmsnorm_quant(&out, dx, dw, n, 1e-6f, 0);
        CUDA_CHECK(cudaMemcpy(got, out.f, n * 4, cudaMemcpyDeviceToHost));
        double e = 0;
        for (int i = 0; i < n; i++) e = worse(e, fabs(got[i] - ref[i]) / (fabs(ref[i]) + 1e-3));
        HostXQ gq = download_xq(out.q, n), wq = quantize_host(got, n);
        report(e <= 1e-5 && same_xq(&gq, &wq), names[0], e, 1e-5);
        free_hxq(&gq); free_hxq(&wq); free_xq(out.q); cudaFree(out.f); cudaFree(dx); cudaFree(dw);
    }
    // RoPE (+ optional per-head norm) + KV store at several positions
    for (int variant = 0; variant < 3; variant++) {
        const int n_head = 6, n_kv = 2, hd = 64, n_ctx = 4100;
        int n_rot = variant == 2 ? 16 : 64, use_norm = variant == 1;
        float q[n_head * hd], k[n_kv * hd], v[n_kv * hd], qr[n_head * hd], kr[n_kv * hd], qn[hd], kn[hd];
        for (int i = 0; i < hd; i++) { qn[i] = 1 + nrand() * 0.2f; kn[i] = 1 + nrand() * 0.2f; }
        float *dq, *dk = NULL, *dv = NULL, *dqn = (float *)dcopy(qn, sizeof qn), *dkn = (float *)dcopy(kn, sizeof kn);
        __half *kc, *vc;
        int *dpos;
        CUDA_CHECK(cudaMalloc(&dq, sizeof q));
        CUDA_CHECK(cudaMalloc(&dk, sizeof k));
        CUDA_CHECK(cudaMalloc(&dv, sizeof v));
        CUDA_CHECK(cudaMalloc(&kc, (size_t)n_ctx * n_kv * hd * 2));
        CUDA_CHECK(cudaMalloc(&vc, (size_t)n_ctx * n_kv * hd * 2));
        CUDA_CHECK(cudaMalloc(&dpos, 4));
        double e = 0;
        int positions[3] = {0, 7, 4000};
        for (int pi = 0; pi < 3; pi++) {
            int pos = positions[pi];
            for (int i = 0; i < n_head * hd; i++) q[i] = qr[i] = nrand();
            for (int i = 0; i < n_kv * hd; i++) { k[i] = kr[i] = nrand(); v[i] = nrand(); }
            rope_ref_c(qr, n_head, kr, n_kv, hd, n_rot, pos, use_norm ? qn : NULL, use_norm ? kn : NULL);
            CUDA_CHECK(cudaMemcpy(dq, q, sizeof q, cudaMemcpyHostToDevice));
            CUDA_CHECK(cudaMemcpy(dk, k, sizeof k, cudaMemcpyHostToDevice));
            CUDA_CHECK(cudaMemcpy(dv, v, sizeof v, cudaMemcpyHostToDevice));
            CUDA_CHECK(cudaMemcpy(dpos, &pos, 4, cudaMemcpyHostToDevice));
            rope_and_kv_store_kernel<<<n_head + n_kv, 128, hd * 4>>>(dq, dq, hd, dk, dv, use_norm ? dqn : NULL,
                                                                      use_norm ? dkn : NULL, kc, vc, dpos, n_head, n_kv, hd,
                                                                      n_rot, 1e6f, 1.0f, 1e-6f);
            KERNEL_CHECK();
            __half hk[n_kv * hd], hv[n_kv * hd];
            CUDA_CHECK(cudaMemcpy(q, dq, sizeof q, cudaMemcpyDeviceToHost));
            CUDA_CHECK(cudaMemcpy(hk, kc + (size_t)pos * n_kv * hd, sizeof hk, cudaMemcpyDeviceToHost));
            CUDA_CHECK(cudaMemcpy(hv, vc + (size_t)pos * n_kv * hd, sizeof hv, cudaMemcpyDeviceToHost));
            for (int i = 0; i < n_head * hd; i++) e = worse(e, fabs(q[i] - qr[i]) / (fabs(qr[i]) + 1e-2));
            e = worse(e, kv_row_err(hk, hv, kr, v, n_kv * hd)); // the cache holds fp16
        }
        // q: fp32 vs fp32; k, v: the fp16 cache vs the C values rounded to fp16, where an off-by-one
        // rounding (2^-11 relative) shows as 4.9e-5 after the /10
        report(e <= 1e-4, names[1 + variant], e, 1e-4);
        cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(kc); cudaFree(vc); cudaFree(dpos); cudaFree(dqn); cudaFree(dkn);
    }
    // attention: a random fp16 cache; the C twin reads the same fp16 values widened to fp32
    // n_head, n_kv, hd; 192: a head dim of the generic kernel whose chunk is not 8192 / hd (a multiple
    // of 8: the score rows are read as float4s)
    const int cfg[4][3] = {{6, 2, 64}, {8, 1, 128}, {12, 2, 256}, {4, 2, 192}};
    for (int ci = 0; ci < 4; ci++) {
        int n_head = cfg[ci][0], n_kv = cfg[ci][1], hd = cfg[ci][2], n_ctx = 300, gated = ci == 2; // qwen35-like
        float *gate = (float *)xmalloc((size_t)n_head * 2 * hd * 4, "a test");
        for (int i = 0; i < n_head * 2 * hd; i++) gate[i] = nrand() * 2;
        float *dgate = (float *)dcopy(gate, (size_t)n_head * 2 * hd * 4) + hd; // gate half of [q | gate]
        int n_split = att_splits(n_ctx, hd); // the engine's: one chunk per split here; 2 splits: several each
        attention_setup(n_head, n_kv, hd);
        size_t csz = (size_t)n_ctx * n_kv * hd;
        __half *hk = (__half *)xmalloc(csz * 2, "a test"), *hv = (__half *)xmalloc(csz * 2, "a test");
        float *fk = (float *)xmalloc(csz * 4, "a test"), *fv = (float *)xmalloc(csz * 4, "a test");
        for (size_t i = 0; i < csz; i++) {
            hk[i] = __float2half(nrand()); hv[i] = __float2half(nrand());
            fk[i] = __half2float(hk[i]); fv[i] = __half2float(hv[i]);
        }
        float *q = (float *)xmalloc(n_head * hd * 4, "a test"), *out = (float *)xmalloc(n_head * hd * 4, "a test");
        float *ref = (float *)xmalloc(n_head * hd * 4, "a test"), att[300];
        for (int i = 0; i < n_head * hd; i++) q[i] = nrand() * 2;
        __half *dk = (__half *)dcopy(hk, csz * 2), *dv = (__half *)dcopy(hv, csz * 2);
        float *dq = (float *)dcopy(q, n_head * hd * 4), *po, *pml;
        int *dpos;
        CUDA_CHECK(cudaMalloc(&po, (size_t)n_head * n_split * hd * 4));
        CUDA_CHECK(cudaMalloc(&pml, (size_t)n_head * n_split * 8));
        CUDA_CHECK(cudaMalloc(&dpos, 4));
        int *kv_done;
        CUDA_CHECK(cudaMalloc(&kv_done, n_kv * 4));
        CUDA_CHECK(cudaMemset(kv_done, 0, n_kv * 4));
        HostXQ hz = quantize_host(q, n_head * hd);
        Act o;
        o.f = (float *)dcopy(q, n_head * hd * 4);
        o.q = upload_xq(&hz);
        double e = 0;
        int same = 1;
        int positions[6] = {0, 1, 63, 64, 100, n_ctx - 1};
        for (int pi = 0; pi < 12; pi++) {
            int pos = positions[pi % 6], splits = pi < 6 ? n_split : 2;
            attention_c(ref, q, fk, fv, att, n_head, n_kv, hd, pos);
            CUDA_CHECK(cudaMemcpy(dpos, &pos, 4, cudaMemcpyHostToDevice));
            attention(dq, dk, dv, NULL, po, pml, kv_done, &o, gated ? dgate : NULL, 2 * hd, dpos, n_head, n_kv, hd, splits, 0);
            if (gated)
                for (int i = 0; i < n_head * hd; i++) ref[i] *= sigmoid_c(gate[(size_t)(i / hd) * 2 * hd + hd + i % hd]);
            CUDA_CHECK(cudaMemcpy(out, o.f, n_head * hd * 4, cudaMemcpyDeviceToHost));
            for (int i = 0; i < n_head * hd; i++) e = worse(e, fabs(out[i] - ref[i]));
            HostXQ gq = download_xq(o.q, n_head * hd), wq = quantize_host(out, n_head * hd);
            same &= same_xq(&gq, &wq);
            free_hxq(&gq); free_hxq(&wq);
        }
        int counters[2] = {1, 1};
        CUDA_CHECK(cudaMemcpy(counters, kv_done, n_kv * 4, cudaMemcpyDeviceToHost));
        same &= counters[0] == 0 && (n_kv < 2 || counters[1] == 0); // reset for the next token
        report(e <= 1e-4 && same, names[ci < 3 ? 4 + ci : 11], e, 1e-4);

        // The same attention with this token's RoPE (after the per-head norm for ci >= 1) and KV store
        // folded in: raw q (qwen35: [q | gate] per head), raw k and v. The C side: rmsnorm_c and
        // rope_neox_c, the cache row *pos as the kernel wrote it (compared with the C values rounded
        // to fp16, as the RoPE kernel's test does), then attention_c.
        {
            int stride = gated ? 2 * hd : hd, n_rot = gated ? hd / 4 : hd, use_norm = ci >= 1;
            float *qsrc = (float *)xmalloc((size_t)n_head * stride * 4, "a test"), *qr = (float *)xmalloc(n_head * hd * 4, "a test");
            float *k = (float *)xmalloc(n_kv * hd * 4, "a test"), *v = (float *)xmalloc(n_kv * hd * 4, "a test");
            float *kr = (float *)xmalloc(n_kv * hd * 4, "a test"), *qn = (float *)xmalloc(hd * 4, "a test"), *kn = (float *)xmalloc(hd * 4, "a test");
            for (int i = 0; i < hd; i++) { qn[i] = 1 + nrand() * 0.2f; kn[i] = 1 + nrand() * 0.2f; }
            for (int i = 0; i < n_head * stride; i++) qsrc[i] = gated && i % stride >= hd ? gate[i] : nrand() * 2;
            float *dqs = (float *)dcopy(qsrc, (size_t)n_head * stride * 4), *dqn = (float *)dcopy(qn, hd * 4);
            float *dkn = (float *)dcopy(kn, hd * 4), *dkr, *dvr;
            float2 *dcs;
            CUDA_CHECK(cudaMalloc(&dkr, n_kv * hd * 4));
            CUDA_CHECK(cudaMalloc(&dvr, n_kv * hd * 4));
            CUDA_CHECK(cudaMalloc(&dcs, hd / 2 * 8));
            AttNew cur = {dqs, stride, dkr, dvr, use_norm ? dqn : NULL, use_norm ? dkn : NULL, n_rot, dcs, 1e-6f};
            double ea = 0, ec = 0;
            int samef = 1;
            __half *row = (__half *)xmalloc(n_kv * hd * 2 * 2, "a test");
            for (int pi = 0; pi < 12; pi++) {
                int pos = positions[pi % 6], splits = pi < 6 ? n_split : 2;
                for (int i = 0; i < n_head * hd; i++) qr[i] = qsrc[(size_t)(i / hd) * stride + i % hd];
                for (int i = 0; i < n_kv * hd; i++) { k[i] = kr[i] = nrand(); v[i] = nrand(); }
                rope_ref_c(qr, n_head, kr, n_kv, hd, n_rot, pos, use_norm ? qn : NULL, use_norm ? kn : NULL);
                CUDA_CHECK(cudaMemcpy(dkr, k, n_kv * hd * 4, cudaMemcpyHostToDevice));
                CUDA_CHECK(cudaMemcpy(dvr, v, n_kv * hd * 4, cudaMemcpyHostToDevice));
                CUDA_CHECK(cudaMemcpy(dpos, &pos, 4, cudaMemcpyHostToDevice));
                rope_angles_kernel<<<1, 256>>>(dcs, dpos, n_rot, 1e6f, 1.0f);
                attention(NULL, dk, dv, &cur, po, pml, kv_done, &o, gated ? dqs + hd : NULL, stride, dpos, n_head, n_kv,
                          hd, splits, 0);
                KERNEL_CHECK();
                size_t r0 = (size_t)pos * n_kv * hd;
                CUDA_CHECK(cudaMemcpy(row, dk + r0, n_kv * hd * 2, cudaMemcpyDeviceToHost));
                CUDA_CHECK(cudaMemcpy(row + n_kv * hd, dv + r0, n_kv * hd * 2, cudaMemcpyDeviceToHost));
                ec = worse(ec, kv_row_err(row, row + n_kv * hd, kr, v, n_kv * hd)); // the cache row vs C in fp16
                for (int i = 0; i < n_kv * hd; i++) { // the C attention reads the row the kernel wrote
                    fk[r0 + i] = __half2float(row[i]);
                    fv[r0 + i] = __half2float(row[n_kv * hd + i]);
                }
                attention_c(ref, qr, fk, fv, att, n_head, n_kv, hd, pos);
                if (gated)
                    for (int i = 0; i < n_head * hd; i++) ref[i] *= sigmoid_c(gate[(size_t)(i / hd) * 2 * hd + hd + i % hd]);
                CUDA_CHECK(cudaMemcpy(out, o.f, n_head * hd * 4, cudaMemcpyDeviceToHost));
                for (int i = 0; i < n_head * hd; i++) ea = worse(ea, fabs(out[i] - ref[i]));
                HostXQ gq = download_xq(o.q, n_head * hd), wq = quantize_host(out, n_head * hd);
                samef &= same_xq(&gq, &wq);
                free_hxq(&gq); free_hxq(&wq);
            }
            // output: |d| as above; the cache rows: an off-by-one fp16 rounding shows as 4.9e-5
            report(ea <= 1e-4 && ec <= 1e-4 && samef, names[ci < 3 ? 8 + ci : 12], fmax(ea, ec), 1e-4);
            cudaFree(dqs); cudaFree(dqn); cudaFree(dkn); cudaFree(dkr); cudaFree(dvr); cudaFree(dcs);
            free(qsrc); free(qr); free(k); free(v); free(kr); free(qn); free(kn); free(row);
        }
        free_hxq(&hz); free_xq(o.q); cudaFree(o.f); cudaFree(kv_done); cudaFree(dgate - hd); free(gate);
        cudaFree(dk); cudaFree(dv); cudaFree(dq); cudaFree(po); cudaFree(pml); cudaFree(dpos);
        free(hk); free(hv); free(fk); free(fv); free(q); free(out); free(ref);
    }
    // silu * mul + quantize
    {
        const int n = 800;
        float a[n], b[n], ref[n];
        for (int i = 0; i < n; i++) { a[i] = nrand() * 4; b[i] = nrand(); ref[i] = silu_c(a[i]) * b[i]; }
        Act h;
        h.f = (float *)dcopy(a, sizeof a);
        h.q = upload_junk_xq(n);
        float *db = (float *)dcopy(b, sizeof b);
        silu_mul_quant_kernel<<<(n + 255) / 256, 256>>>(h, db, n);
        KERNEL_CHECK();
        CUDA_CHECK(cudaMemcpy(a, h.f, sizeof a, cudaMemcpyDeviceToHost));
        double e = 0;
        for (int i = 0; i < n; i++) e = worse(e, fabs(a[i] - ref[i]) / (fabs(ref[i]) + 1e-3));
        HostXQ gq = download_xq(h.q, n), wq = quantize_host(a, n);
        report(e <= 1e-5 && same_xq(&gq, &wq), names[7], e, 1e-5);
        free_hxq(&gq); free_hxq(&wq); free_xq(h.q); cudaFree(h.f); cudaFree(db);
    }
}
// The delta rule over T rows in one launch (a prompt's layout: 8 or 16 lanes per state row, 2 rows
// per lane group) against gdn_step_c token by token: every output row and the final state.
static void test_gpu_deltanet_rows(void) {
    const int cfgs[3][3] = {{64, 2, 4}, {128, 4, 12}, {160, 1, 2}}; // S, Hk, Hv (160: 16 lanes per row)
    for (int ci = 0; ci < 3; ci++) {
        int S = cfgs[ci][0], Hk = cfgs[ci][1], Hv = cfgs[ci][2], conv_dim = (2 * Hk + Hv) * S, T = 7;
        char name[160];
        snprintf(name, sizeof name, "gpu gdn_step over %d rows at once (S=%d) vs gdn_step_c per row: outputs and state", T, S);
        if (!HAVE_GPU) { skip(name, "no GPU"); continue; }
        float *x = (float *)xmalloc((size_t)T * conv_dim * 4, "a test"), *gb = (float *)xmalloc((size_t)T * 2 * Hv * 4, "a test");
        float *M = (float *)xmalloc((size_t)Hv * S * S * 4, "a test"), *Mg = (float *)xmalloc((size_t)Hv * S * S * 4, "a test");
        float *o = (float *)xmalloc((size_t)T * Hv * S * 4, "a test"), *og = (float *)xmalloc((size_t)T * Hv * S * 4, "a test");
        for (int i = 0; i < T * conv_dim; i++) x[i] = nrand() / sqrtf((float)S); // q, k of about unit length
        for (int t = 0; t < T; t++)
            for (int h = 0; h < Hv; h++) {
                gb[(size_t)t * 2 * Hv + h] = -urand();                     // g: log decay
                gb[(size_t)t * 2 * Hv + Hv + h] = sigmoid_c(nrand());      // beta
            }
        for (size_t i = 0; i < (size_t)Hv * S * S; i++) M[i] = nrand() * 0.1f;
        float *dx = (float *)dcopy(x, (size_t)T * conv_dim * 4), *dgb = (float *)dcopy(gb, (size_t)T * 2 * Hv * 4);
        float *dM = (float *)dcopy(M, (size_t)Hv * S * S * 4), *dO;
        CUDA_CHECK(cudaMalloc(&dO, (size_t)T * Hv * S * 4));
        gdn_step(dM, dx, dgb, dO, S, Hk, Hv, T, 0);
        KERNEL_CHECK();
        CUDA_CHECK(cudaMemcpy(og, dO, (size_t)T * Hv * S * 4, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(Mg, dM, (size_t)Hv * S * S * 4, cudaMemcpyDeviceToHost));
        for (int t = 0; t < T; t++) {
            const float *y = x + (size_t)t * conv_dim;
            for (int h = 0; h < Hv; h++)
                gdn_step_c(M + (size_t)h * S * S, y + (h % Hk) * S, y + (Hk + h % Hk) * S, y + (2 * Hk + h) * S,
                           gb[(size_t)t * 2 * Hv + h], gb[(size_t)t * 2 * Hv + Hv + h], o + ((size_t)t * Hv + h) * S, S);
        }
        double e = 0;
        for (size_t i = 0; i < (size_t)T * Hv * S; i++) e = worse(e, fabs(og[i] - o[i]) / (fabs(o[i]) + 1e-2));
        for (size_t i = 0; i < (size_t)Hv * S * S; i++) e = worse(e, fabs(Mg[i] - M[i]) / (fabs(M[i]) + 1e-2));
        report(e <= 1e-4, name, e, 1e-4);
        cudaFree(dx); cudaFree(dgb); cudaFree(dM); cudaFree(dO);
        free(x); free(gb); free(M); free(Mg); free(o); free(og);
    }
}

// Gated DeltaNet kernels against their C twins, over several tokens so the states carry over
static void test_gpu_deltanet(void) {
    const int cfgs[2][3] = {{64, 2, 4}, {128, 4, 12}}; // S, Hk, Hv (the tiny fixture; the 27B's S)
    for (int ci = 0; ci < 2; ci++) {
        int S = cfgs[ci][0], Hk = cfgs[ci][1], Hv = cfgs[ci][2], conv_dim = (2 * Hk + Hv) * S, steps = 6;
        char n1[160], n2[160], n3[160], n4[200];
        snprintf(n1, sizeof n1, "gpu gdn_conv_norm (S=%d, Hk=%d, Hv=%d, %d steps) vs gdn_conv_c + l2norm_c: y, conv state", S, Hk, Hv, steps);
        snprintf(n4, sizeof n4, "gpu gdn_token (S=%d, Hk=%d, Hv=%d, %d steps) vs gdn_conv_c, l2norm_c, gdn_step_c, gated_rmsnorm_c: "
                 "outputs, 16-bit copy, state, conv state, counters", S, Hk, Hv, steps);
        snprintf(n2, sizeof n2, "gpu gdn_step (S=%d, %d steps) vs gdn_step_c: outputs and state", S, steps);
        snprintf(n3, sizeof n3, "gpu gdn_gated_norm (S=%d) vs gated_rmsnorm_c + quantize_block_c", S);
        if (!HAVE_GPU) { skip(n1, "no GPU"); skip(n2, "no GPU"); skip(n3, "no GPU"); skip(n4, "no GPU"); continue; }
        float *w = (float *)xmalloc(conv_dim * 16, "a test"), *cs = (float *)xcalloc(3 * conv_dim, 4, "a test"), *mixed = (float *)xmalloc(conv_dim * 4, "a test");
        float *y = (float *)xmalloc(conv_dim * 4, "a test"), *got = (float *)xmalloc(conv_dim * 4, "a test");
        float braw[64], araw[64], dtb[64], a[64], gb[128], ggb[128];
        float *M = (float *)xcalloc((size_t)Hv * S * S, 4, "a test"), *o = (float *)xmalloc(Hv * S * 4, "a test"), *og = (float *)xmalloc(Hv * S * 4, "a test");
        float *Mg = (float *)xmalloc((size_t)Hv * S * S * 4, "a test"), *z = (float *)xmalloc(Hv * S * 4, "a test"), nw[256];
        for (int i = 0; i < conv_dim * 4; i++) w[i] = nrand() * 0.3f;
        for (int i = 0; i < S; i++) nw[i] = 1 + nrand() * 0.1f;
        for (int h = 0; h < Hv; h++) { dtb[h] = nrand(); a[h] = -expf(urand() * 3 - 1); }
        float *dw = (float *)dcopy(w, conv_dim * 16), *dcs = (float *)dcopy(cs, 3 * conv_dim * 4);
        float *dmixed, *dgb, *dM = (float *)dcopy(M, (size_t)Hv * S * S * 4), *dO, *dz, *dnw = (float *)dcopy(nw, S * 4);
        float *dbraw, *daraw, *ddtb = (float *)dcopy(dtb, Hv * 4), *da = (float *)dcopy(a, Hv * 4);
        CUDA_CHECK(cudaMalloc(&dmixed, conv_dim * 4)); CUDA_CHECK(cudaMalloc(&dgb, 2 * Hv * 4));
        CUDA_CHECK(cudaMalloc(&dO, Hv * S * 4)); CUDA_CHECK(cudaMalloc(&dz, Hv * S * 4));
        CUDA_CHECK(cudaMalloc(&dbraw, Hv * 4)); CUDA_CHECK(cudaMalloc(&daraw, Hv * 4));
        double e1 = 0, e2 = 0, e3 = 0, e4 = 0;
        int same_q = 1, same_q4 = 1, counts_zero = 1;
        // the token kernel's own state, conv state and counters, fed the same inputs
        float *dM4 = (float *)dcopy(M, (size_t)Hv * S * S * 4), *dcs4 = (float *)dcopy(cs, 3 * conv_dim * 4);
        int *dcount, zeros[256] = {0}, hcount[256];
        dcount = (int *)dcopy(zeros, Hk * 4);
        Act out4;
        CUDA_CHECK(cudaMalloc(&out4.f, Hv * S * 4));
        CUDA_CHECK(cudaMemset(out4.f, 0xff, Hv * S * 4)); // NaNs until the kernel writes
        out4.q = upload_junk_xq(Hv * S);
        for (int step = 0; step < steps; step++) {
            for (int i = 0; i < conv_dim; i++) mixed[i] = nrand();
            for (int h = 0; h < Hv; h++) { braw[h] = nrand(); araw[h] = nrand(); }
            for (int i = 0; i < Hv * S; i++) z[i] = nrand();
            CUDA_CHECK(cudaMemcpy(dmixed, mixed, conv_dim * 4, cudaMemcpyHostToDevice));
            CUDA_CHECK(cudaMemcpy(dbraw, braw, Hv * 4, cudaMemcpyHostToDevice));
            CUDA_CHECK(cudaMemcpy(daraw, araw, Hv * 4, cudaMemcpyHostToDevice));
            CUDA_CHECK(cudaMemcpy(dz, z, Hv * S * 4, cudaMemcpyHostToDevice));
            // C: conv, norms, gates, delta rule, gated norm
            gdn_conv_c(y, mixed, w, cs, conv_dim);
            for (int h = 0; h < 2 * Hk; h++) l2norm_c(y + h * S, S, 1e-6f);
            for (int h = 0; h < Hv; h++) { gb[h] = softplus_ref(araw[h] + dtb[h]) * a[h]; gb[Hv + h] = sigmoid_c(braw[h]); }
            for (int h = 0; h < Hv; h++)
                gdn_step_c(M + (size_t)h * S * S, y + (h % Hk) * S, y + (Hk + h % Hk) * S, y + (2 * Hk + h) * S, gb[h],
                           gb[Hv + h], o + h * S, S);
            // GPU: the token kernel first (the conv kernel below overwrites dmixed)
            gdn_token(dM4, dcs4, dmixed, dw, dz, dbraw, daraw, ddtb, da, dnw, &out4, dcount, S, Hk, Hv, 1e-6f, 0);
            {
                float *ref4 = (float *)xmalloc(Hv * S * 4, "a test"), *g4 = (float *)xmalloc(Hv * S * 4, "a test");
                memcpy(ref4, o, Hv * S * 4);
                for (int h = 0; h < Hv; h++) gated_rmsnorm_c(ref4 + h * S, z + h * S, nw, S, 1e-6f);
                CUDA_CHECK(cudaMemcpy(g4, out4.f, Hv * S * 4, cudaMemcpyDeviceToHost));
                for (int i = 0; i < Hv * S; i++) e4 = worse(e4, fabs(g4[i] - ref4[i]) / (fabs(ref4[i]) + 1e-2));
                HostXQ gq = download_xq(out4.q, Hv * S), wq = quantize_host(g4, Hv * S);
                same_q4 &= same_xq(&gq, &wq);
                CUDA_CHECK(cudaMemcpy(hcount, dcount, Hk * 4, cudaMemcpyDeviceToHost));
                for (int h = 0; h < Hk; h++) counts_zero &= hcount[h] == 0;
                free_hxq(&gq); free_hxq(&wq); free(ref4); free(g4);
            }
            gdn_conv_norm_kernel<<<2 * Hk + Hv, S>>>(dmixed, dw, dcs, dbraw, daraw, ddtb, da, dgb, Hk, Hv, 1e-6f);
            gdn_step(dM, dmixed, dgb, dO, S, Hk, Hv, 1, 0);
            KERNEL_CHECK();
            CUDA_CHECK(cudaMemcpy(got, dmixed, conv_dim * 4, cudaMemcpyDeviceToHost));
            CUDA_CHECK(cudaMemcpy(ggb, dgb, 2 * Hv * 4, cudaMemcpyDeviceToHost));
            CUDA_CHECK(cudaMemcpy(og, dO, Hv * S * 4, cudaMemcpyDeviceToHost));
            for (int i = 0; i < conv_dim; i++) e1 = worse(e1, fabs(got[i] - y[i]) / (fabs(y[i]) + 1e-2));
            for (int i = 0; i < 2 * Hv; i++) e1 = worse(e1, fabs(ggb[i] - gb[i]) / (fabs(gb[i]) + 1e-2));
            for (int i = 0; i < Hv * S; i++) e2 = worse(e2, fabs(og[i] - o[i]) / (fabs(o[i]) + 1e-2));
            // gated norm + quantize on this step's output
            Act out;
            CUDA_CHECK(cudaMalloc(&out.f, Hv * S * 4));
            CUDA_CHECK(cudaMemset(out.f, 0xff, Hv * S * 4)); // NaNs until the kernel writes
            out.q = upload_junk_xq(Hv * S);
            gdn_gated_norm_kernel<<<Hv, S>>>(out, dO, dz, dnw, 1e-6f);
            KERNEL_CHECK();
            float *ref = (float *)xmalloc(Hv * S * 4, "a test"), *gn = (float *)xmalloc(Hv * S * 4, "a test");
            for (int h = 0; h < Hv; h++) { memcpy(ref + h * S, og + h * S, S * 4); gated_rmsnorm_c(ref + h * S, z + h * S, nw, S, 1e-6f); }
            CUDA_CHECK(cudaMemcpy(gn, out.f, Hv * S * 4, cudaMemcpyDeviceToHost));
            for (int i = 0; i < Hv * S; i++) e3 = worse(e3, fabs(gn[i] - ref[i]) / (fabs(ref[i]) + 1e-2));
            HostXQ gq = download_xq(out.q, Hv * S), wq = quantize_host(gn, Hv * S);
            same_q &= same_xq(&gq, &wq);
            free_hxq(&gq); free_hxq(&wq); free_xq(out.q); cudaFree(out.f); free(ref); free(gn);
        }
        float *gcs = (float *)xmalloc(3 * conv_dim * 4, "a test");
        CUDA_CHECK(cudaMemcpy(gcs, dcs, 3 * conv_dim * 4, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(Mg, dM, (size_t)Hv * S * S * 4, cudaMemcpyDeviceToHost));
        for (int i = 0; i < 3 * conv_dim; i++) e1 = worse(e1, fabs(gcs[i] - cs[i])); // exact copies of inputs
        for (size_t i = 0; i < (size_t)Hv * S * S; i++) e2 = worse(e2, fabs(Mg[i] - M[i]) / (fabs(M[i]) + 1e-2));
        report(e1 <= 1e-5, n1, e1, 1e-5);
        report(e2 <= 1e-4, n2, e2, 1e-4);
        report(e3 <= 1e-4 && same_q, n3, e3, 1e-4);
        CUDA_CHECK(cudaMemcpy(gcs, dcs4, 3 * conv_dim * 4, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(Mg, dM4, (size_t)Hv * S * S * 4, cudaMemcpyDeviceToHost));
        for (int i = 0; i < 3 * conv_dim; i++) e4 = worse(e4, fabs(gcs[i] - cs[i]));
        for (size_t i = 0; i < (size_t)Hv * S * S; i++) e4 = worse(e4, fabs(Mg[i] - M[i]) / (fabs(M[i]) + 1e-2));
        report(e4 <= 1e-4 && same_q4 && counts_zero, n4, e4, 1e-4);
        cudaFree(dM4); cudaFree(dcs4); cudaFree(dcount); cudaFree(out4.f); free_xq(out4.q);
        free(gcs); free(w); free(cs); free(mixed); free(y); free(got); free(M); free(o); free(og); free(Mg); free(z);
        cudaFree(dw); cudaFree(dcs); cudaFree(dmixed); cudaFree(dgb); cudaFree(dM); cudaFree(dO); cudaFree(dz);
        cudaFree(dnw); cudaFree(dbraw); cudaFree(daraw); cudaFree(ddtb); cudaFree(da);
    }
}

// =================================================================================================
// Prefill kernels (section 8) against their C twins
// =================================================================================================

// fp16 input rows as the engine makes them: per-row power-of-two scale, X = fp16(x / s)
static void make_rows(const float *x, int T, int n, uint16_t *X, float *s) {
    for (int t = 0; t < T; t++) {
        float amax = 0;
        for (int i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[(size_t)t * n + i]));
        s[t] = row_scale(amax);
        for (int i = 0; i < n; i++) X[(size_t)t * n + i] = f32_to_fp16_bits(x[(size_t)t * n + i] / s[t]);
    }
}

// Planes in step order on the GPU: two matrices streamed in one launch (as gate and up), stored in
// the order of that launch's reads (step_order_set), against matvec_xq_c; then the prefill product
// reading the second one's planes, against matmul_c. Every fast type, and a launch that mixes
// IQ4_XS with Q5_K (the 27B IQ4_XS file's DeltaNet in-projections: the mixed kernel, whose block
// shape differs in step order). Sizes: runs of several units, the second matrix starting inside a
// warp's run.
static void test_gpu_step_order(void) {
    const int pairs[][2] = {{GGML_TYPE_Q4_0, GGML_TYPE_Q4_0},
                            {GGML_TYPE_Q8_0, GGML_TYPE_Q8_0},
                            {GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_NL},
                            {GGML_TYPE_IQ4_XS, GGML_TYPE_IQ4_XS},
                            {GGML_TYPE_Q4_K, GGML_TYPE_Q4_K},
                            {GGML_TYPE_Q5_K, GGML_TYPE_Q5_K},
                            {GGML_TYPE_Q6_K, GGML_TYPE_Q6_K},
                            {GGML_TYPE_IQ4_XS, GGML_TYPE_Q5_K},
                            {GGML_TYPE_Q4_K, GGML_TYPE_Q6_K},
                            {GGML_TYPE_Q4_1, GGML_TYPE_Q4_1},
                            {GGML_TYPE_Q5_0, GGML_TYPE_Q5_1}};
    for (int pi = 0; pi < 11; pi++) {
        const int *tp = pairs[pi];
        char tn[40], name[160], name2[160];
        if (tp[0] == tp[1]) snprintf(tn, sizeof tn, "%s", type_name(tp[0]));
        else snprintf(tn, sizeof tn, "%s + %s", type_name(tp[0]), type_name(tp[1]));
        snprintf(name, sizeof name, "gpu step-order planes %s: streaming mat-vec of 2 matrices vs matvec_xq_c: |d|/sum|wx|", tn);
        snprintf(name2, sizeof name2, "gpu step-order planes %s: prefill product vs matmul_c: |d|/sum|wx|", tn);
        if (!HAVE_GPU) { skip(name, "no GPU"); skip(name2, "no GPU"); continue; }
        int saved = g_mv_mode;
        g_mv_mode = MV_STREAM;
        const int n_in = 2048, warps = mv_grid_warps();
        const int n_out[2] = {MV_ROWS * (2 * warps + 7), MV_ROWS * (warps + 5)}; // a few units a run
        size_t rbs[2] = {row_bytes(tp[0], n_in), row_bytes(tp[1], n_in)};
        Tensor W[2];
        uint8_t *w[2];
        for (int i = 0; i < 2; i++) {
            w[i] = (uint8_t *)xmalloc(rbs[i] * n_out[i], "a test");
            for (int r = 0; r < n_out[i]; r++) random_row(tp[i], w[i] + r * rbs[i], n_in);
            W[i] = Tensor{"test", tp[i], n_in, n_out[i], w[i], rbs[i] * n_out[i], NULL, 0};
        }
        Tensor *WW[2] = {&W[0], &W[1]};
        step_order_set(2, WW);
        int ordered = W[0].so.upw > 1 && W[1].so.upw > 1 && W[1].so.first % W[1].so.upw != 0;
        int repack_ok = upload_like_engine(&W[0]) & upload_like_engine(&W[1]);
        float *x = (float *)xmalloc(n_in * 4, "a test");
        random_act(x, n_in);
        HostXQ hq = quantize_host(x, n_in);
        Act act;
        memset(&act, 0, sizeof act);
        act.f = (float *)dcopy(x, n_in * 4);
        act.q = upload_xq(&hq);
        float *dy[2], *y = (float *)xmalloc(n_out[0] * 4, "a test"), *ref = (float *)xmalloc(n_out[0] * 4, "a test");
        float *row = (float *)xmalloc(n_in * 4, "a test");
        double *scale = (double *)xmalloc(n_out[0] * sizeof(double), "a test");
        for (int i = 0; i < 2; i++) CUDA_CHECK(cudaMalloc(&dy[i], n_out[i] * 4));
        const Tensor *Wc[2] = {&W[0], &W[1]};
        const float *nob[2] = {NULL, NULL};
        matvec_batch(2, Wc, nob, dy, &act, 0);
        double worst = 0;
        for (int i = 0; i < 2; i++) {
            CUDA_CHECK(cudaMemcpy(y, dy[i], n_out[i] * 4, cudaMemcpyDeviceToHost));
            matvec_xq_c(&W[i], hq.H, hq.L, hq.s, NULL, ref, 0, row);
            abs_dot_scale(tp[i], w[i], rbs[i], n_in, n_out[i], x, 1, scale, row);
            worst = worse(worst, max_rel_err(y, ref, scale, n_out[i]));
        }
        report(ordered && repack_ok && worst <= 1e-5, name, ordered && repack_ok ? worst : INFINITY, 1e-5);
        // the prefill product over the second matrix's planes (it starts inside a run)
        const int T = 9;
        float *xt = (float *)xmalloc((size_t)T * n_in * 4, "a test"), *xs = (float *)xmalloc(T * 4, "a test");
        uint16_t *X = (uint16_t *)xmalloc((size_t)T * n_in * 2, "a test");
        random_act(xt, T * n_in);
        make_rows(xt, T, n_in, X, xs);
        float *pref = (float *)xmalloc((size_t)T * n_out[1] * 4, "a test"), *got = (float *)xmalloc((size_t)T * n_out[1] * 4, "a test");
        double *pscale = (double *)xmalloc((size_t)T * n_out[1] * sizeof(double), "a test");
        memset(pref, 0, (size_t)T * n_out[1] * 4);
        matmul_c(&W[1], X, xs, xt, n_in, T, pref, n_out[1], NULL, 0, row);
        abs_dot_scale(tp[1], w[1], rbs[1], n_in, n_out[1], xt, T, pscale, row);
        GpuState s;
        memset(&s, 0, sizeof s);
        s.part_elems = 2 * MM_SLOT * (size_t)mm_resident(-1);
        CUDA_CHECK(cudaMalloc(&s.bpart, s.part_elems * 4));
        ActH a = {(__half *)dcopy(X, (size_t)T * n_in * 2), (float *)dcopy(xs, T * 4), n_in,
                  (float *)dcopy(xt, (size_t)T * n_in * 4)};
        float *dp;
        CUDA_CHECK(cudaMalloc(&dp, (size_t)T * n_out[1] * 4));
        CUDA_CHECK(cudaMemset(dp, 0, (size_t)T * n_out[1] * 4));
        matmul(&W[1], &a, T, dp, n_out[1], NULL, 0, &s);
        CUDA_CHECK(cudaMemcpy(got, dp, (size_t)T * n_out[1] * 4, cudaMemcpyDeviceToHost));
        double pw = max_rel_err(got, pref, pscale, T * n_out[1]);
        report(ordered && pw <= 1e-5, name2, ordered ? pw : INFINITY, 1e-5);
        g_mv_mode = saved;
        cudaFree(dp); cudaFree(s.bpart); cudaFree(a.h); cudaFree(a.s); cudaFree(a.f);
        cudaFree(act.f); free_xq(act.q); free_hxq(&hq);
        for (int i = 0; i < 2; i++) { cudaFree(dy[i]); cudaFree(W[i].dev); free(w[i]); }
        free(x); free(y); free(ref); free(row); free(scale); free(xt); free(xs); free(X); free(pref); free(got); free(pscale);
    }
}

static void test_gpu_matmul(void) {
    const int types[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1,
                         GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0, GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS,
                         GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K};
    // (T rows, n_in in blocks, n_out): one row, edges of the 128 x 128 tiles, several tiles each way,
    // long rows with few outputs (a tile cut between many blocks)
    const int shapes[][3] = {{1, 1, 1}, {5, 3, 37}, {130, 2, 129}, {200, 5, 300}, {7, 48, 40}, {300, 3, 150}};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        int type = types[ti];
        char name[160], name2[160];
        snprintf(name, sizeof name, "gpu prefill product %s vs matmul_c (6 shapes, bias, accumulate, tiles cut between blocks): |d|/sum|wx|",
                 type_name(type));
        snprintf(name2, sizeof name2, "gpu prefill product %s vs fp32 operands%s: |d|/sum|wx|", type_name(type),
                 type == GGML_TYPE_F32 ? "" : " (fp16 rounding)");
        if (!HAVE_GPU) { skip(name, "no GPU"); skip(name2, "no GPU"); continue; }
        double worst = 0, worst_exact = 0;
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            int blk = TYPE_TRAITS[type].blck == 1 ? 32 : TYPE_TRAITS[type].blck;
            int T = shapes[si][0], n_in = shapes[si][1] * blk, n_out = shapes[si][2];
            size_t rb = row_bytes(type, n_in);
            uint8_t *w = (uint8_t *)xmalloc(rb * n_out, "a test");
            for (int r = 0; r < n_out; r++) random_row(type, w + r * rb, n_in);
            float *x = (float *)xmalloc((size_t)T * n_in * 4, "a test"), *xs = (float *)xmalloc(T * 4, "a test");
            uint16_t *X = (uint16_t *)xmalloc((size_t)T * n_in * 2, "a test");
            random_act(x, T * n_in);
            make_rows(x, T, n_in, X, xs);
            float *bias = (float *)xmalloc(n_out * 4, "a test"), *y0 = (float *)xmalloc((size_t)T * n_out * 4, "a test");
            float *ref = (float *)xmalloc((size_t)T * n_out * 4, "a test"), *got = (float *)xmalloc((size_t)T * n_out * 4, "a test");
            float *row = (float *)xmalloc(n_in * 4, "a test");
            double *scale = (double *)xmalloc((size_t)T * n_out * sizeof(double), "a test");
            for (int i = 0; i < n_out; i++) bias[i] = nrand();
            for (int i = 0; i < T * n_out; i++) y0[i] = nrand();
            Tensor W = {"test", type, n_in, n_out, w, rb * n_out, NULL, 0};
            upload_like_engine(&W);
            GpuState s;
            memset(&s, 0, sizeof s);
            s.part_elems = 2 * MM_SLOT * (size_t)mm_resident(-1); // the engine's grid: tiles cut between blocks
            CUDA_CHECK(cudaMalloc(&s.bpart, s.part_elems * 4));
            ActH a = {(__half *)dcopy(X, (size_t)T * n_in * 2), (float *)dcopy(xs, T * 4), n_in,
                      (float *)dcopy(x, (size_t)T * n_in * 4)};
            float *dy, *db = (float *)dcopy(bias, n_out * 4);
            CUDA_CHECK(cudaMalloc(&dy, (size_t)T * n_out * 4));
            float *exact = (float *)xmalloc((size_t)T * n_out * 4, "a test");
            for (int accumulate = 0; accumulate < 2; accumulate++) {
                memcpy(ref, y0, (size_t)T * n_out * 4);
                matmul_c(&W, X, xs, x, n_in, T, ref, n_out, bias, accumulate, row);
                for (int n = 0; n < n_out; n++) { // the fp32 product and the error scale sum |w_i x_i| (+ |bias| + |y0|)
                    dequant_row(type, w + n * rb, row, n_in);
                    for (int t = 0; t < T; t++) {
                        size_t o = (size_t)t * n_out + n;
                        double sa = fabs(bias[n]) + (accumulate ? fabs(y0[o]) : 0), e = 0;
                        for (int i = 0; i < n_in; i++) {
                            sa += fabs((double)row[i] * x[(size_t)t * n_in + i]);
                            e += (double)row[i] * x[(size_t)t * n_in + i];
                        }
                        scale[o] = sa;
                        exact[o] = (float)(e + bias[n] + (accumulate ? y0[o] : 0));
                    }
                }
                CUDA_CHECK(cudaMemcpy(dy, y0, (size_t)T * n_out * 4, cudaMemcpyHostToDevice));
                matmul(&W, &a, T, dy, n_out, db, accumulate, &s);
                CUDA_CHECK(cudaMemcpy(got, dy, (size_t)T * n_out * 4, cudaMemcpyDeviceToHost));
                worst = worse(worst, max_rel_err(got, ref, scale, T * n_out));
                worst_exact = worse(worst_exact, max_rel_err(got, exact, scale, T * n_out));
            }
            free(exact);
            cudaFree(W.dev); cudaFree(a.h); cudaFree(a.s); cudaFree(a.f); cudaFree(dy); cudaFree(db); cudaFree(s.bpart);
            free(w); free(x); free(xs); free(X); free(bias); free(y0); free(ref); free(got); free(row); free(scale);
        }
        report(worst <= 1e-5, name, worst, 1e-5);
        double tol2 = type == GGML_TYPE_F32 ? 1e-5 : 2e-3; // F32 weights: fp32 all the way
        report(worst_exact <= tol2, name2, worst_exact, tol2);
    }
}

// A BF16 weight of 2^16 or more cannot enter the prefill product's fp16 tiles: the upload finds it
// and the engine sends prompts token by token. The kernel alone on 2^20 values (4x its grid of
// threads) with the last one planted: -2^16 and inf are found, -65280 (the largest BF16 below 2^16,
// exact in fp16) is not. Then tiny-qwen3-bf16 with one weight changed: 2^16 in layer 0's ffn_down or
// -2^16 as the output matrix's last value turns the batched path off; 65280 keeps it on, as in the
// unchanged file.
static void test_gpu_bf16_range(void) {
    const char *name = "gpu prefill: bf16_past_f16_kernel on 2^20 values: the last one -2^16 or inf found, -65280 not";
    const char *name2 = "gpu prefill: a BF16 weight of +-2^16 (layer 0, output) turns the batched path off, 65280 keeps it (n_batch)";
    if (!HAVE_GPU) { skip(name, "no GPU"); skip(name2, "no GPU"); return; }
    const size_t N = 1 << 20;
    uint16_t *h = (uint16_t *)xmalloc(N * 2, "a test");
    for (size_t i = 0; i < N; i++) h[i] = 0x3f80; // 1.0
    const uint16_t last[3] = {0xc780, 0x7f80, 0xc77f};
    int found[3], *dflag;
    uint16_t *dw;
    CUDA_CHECK(cudaMalloc(&dw, N * 2));
    CUDA_CHECK(cudaMalloc(&dflag, sizeof(int)));
    for (int k = 0; k < 3; k++) {
        h[N - 1] = last[k];
        CUDA_CHECK(cudaMemcpy(dw, h, N * 2, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemset(dflag, 0, sizeof(int)));
        bf16_past_f16_kernel<<<1024, 256>>>(dw, N, dflag);
        CUDA_CHECK(cudaMemcpy(&found[k], dflag, sizeof(int), cudaMemcpyDeviceToHost));
    }
    cudaFree(dw); cudaFree(dflag); free(h);
    check(found[0] == 1 && found[1] == 1 && found[2] == 0, name);
    char path[600], tmp[700];
    snprintf(path, sizeof path, "%s/tiny-qwen3/tiny-qwen3-bf16.gguf", DATA);
    if (!need_fixture(path, name2)) return;
    size_t len;
    uint8_t *file = (uint8_t *)read_file(path, &len);
    Model m;
    model_open(&m, path);
    const Tensor *D = &m.w.layers[0].w_down, *O = &m.w.output;
    size_t off_d = (size_t)(D->host - m.gguf.base) + 2 * 7, // the 8th weight of its first row
        off_o = (size_t)(O->host - m.gguf.base) + O->nbytes - 2; // the last weight
    int types_ok = D->type == GGML_TYPE_BF16 && O->type == GGML_TYPE_BF16;
    gguf_close(&m.gguf);
    // the file as it is; 2^16 in ffn_down; -2^16 at the output's end; 65280 in ffn_down
    const size_t off[4] = {0, off_d, off_o, off_d};
    const uint16_t bits[4] = {0, 0x4780, 0xc780, 0x477f};
    int n_batch[4];
    snprintf(tmp, sizeof tmp, "%s/bf16_range.gguf", TMP);
    for (int k = 0; k < 4; k++) {
        uint8_t *copy = (uint8_t *)memcpy(xmalloc(len, "a test"), file, len);
        if (k) memcpy(copy + off[k], &bits[k], 2);
        write_file(tmp, copy, len);
        free(copy);
        model_open(&m, tmp);
        Engine e;
        engine_init(&e, &m, 1, 512);
        n_batch[k] = e.gpu.n_batch;
        engine_free(&e);
        gguf_close(&m.gguf);
    }
    unlink(tmp);
    free(file);
    int ok = types_ok && n_batch[0] == 512 && n_batch[1] == 0 && n_batch[2] == 0 && n_batch[3] == 512;
    check(ok, name2);
    if (!ok)
        printf("     BF16 tensors %d; n_batch: file %d, 2^16 %d, -2^16 at the end %d, 65280 %d\n", types_ok,
               n_batch[0], n_batch[1], n_batch[2], n_batch[3]);
}

// Causal attention over a batch: every row t against attention_c at position pos0 + t
static void test_gpu_attention_prefill(void) {
    const int cfg[][4] = {{3, 64, 0, 0}, {8, 128, 37, 0}, {6, 256, 5, 1}}; // g, hd, pos0, gated
    for (int ci = 0; ci < 3; ci++) {
        int g = cfg[ci][0], hd = cfg[ci][1], pos0 = cfg[ci][2], gated = cfg[ci][3];
        const int n_kv = 2, T = 45;
        int n_head = g * n_kv, n_pos = pos0 + T, qdim = n_head * hd;
        char name[160];
        snprintf(name, sizeof name, "gpu attention_prefill_kernel vs attention_prefill_c (g=%d, hd=%d, %d rows from pos %d%s): |d|/sum p|v|", g,
                 hd, T, pos0, gated ? ", sigmoid gate" : "");
        if (!HAVE_GPU) { skip(name, "no GPU"); continue; }
        size_t cn = (size_t)n_pos * n_kv * hd;
        float *fk = (float *)xmalloc(cn * 4, "a test"), *fv = (float *)xmalloc(cn * 4, "a test");
        __half *hk = (__half *)xmalloc(cn * 2, "a test"), *hv = (__half *)xmalloc(cn * 2, "a test");
        for (size_t i = 0; i < cn; i++) {
            hk[i] = __float2half(nrand()); hv[i] = __float2half(nrand());
            fk[i] = __half2float(hk[i]); fv[i] = __half2float(hv[i]);
        }
        float *q = (float *)xmalloc((size_t)T * qdim * 4, "a test"), *gate = (float *)xmalloc((size_t)T * 2 * qdim * 4, "a test");
        for (int i = 0; i < T * qdim; i++) q[i] = nrand() * 2;
        for (int i = 0; i < T * 2 * qdim; i++) gate[i] = nrand();
        float *ref = (float *)xmalloc(qdim * 4, "a test"), *mag = (float *)xmalloc(qdim * 4, "a test"), *att = (float *)xmalloc(n_pos * 4, "a test");
        __half *dk = (__half *)dcopy(hk, cn * 2), *dv = (__half *)dcopy(hv, cn * 2);
        float *dq = (float *)dcopy(q, (size_t)T * qdim * 4), *dg = (float *)dcopy(gate, (size_t)T * 2 * qdim * 4);
        ActH out;
        out.ld = qdim;
        out.f = NULL;
        CUDA_CHECK(cudaMalloc(&out.h, (size_t)T * qdim * 2));
        CUDA_CHECK(cudaMalloc(&out.s, T * 4));
        if (pa_smem(hd) > 48 * 1024)
            CUDA_CHECK(cudaFuncSetAttribute(attention_prefill_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)pa_smem(hd)));
        attention_prefill_kernel<<<dim3((T + PA_TQ - 1) / PA_TQ, n_head), PA_THREADS, pa_smem(hd)>>>(
            dq, dk, dv, out, gated ? dg + hd : NULL, 2 * qdim, pos0, T, n_head, n_kv, hd);
        KERNEL_CHECK();
        __half *got = (__half *)xmalloc((size_t)T * qdim * 2, "a test");
        float *gs = (float *)xmalloc(T * 4, "a test");
        CUDA_CHECK(cudaMemcpy(got, out.h, (size_t)T * qdim * 2, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(gs, out.s, T * 4, cudaMemcpyDeviceToHost));
        double e = 0;
        int scales_ok = 1;
        for (int t = 0; t < T; t++) {
            attention_prefill_c(ref, mag, q + (size_t)t * qdim, fk, fv, att, n_head, n_kv, hd, pos0 + t);
            scales_ok &= gs[t] == 1.0f;
            for (int i = 0; i < qdim; i++) {
                float r = ref[i], a = mag[i];
                if (gated) {
                    float sg = sigmoid_c(gate[(size_t)t * 2 * qdim + (size_t)(i / hd) * 2 * hd + hd + i % hd]);
                    r *= sg;
                    a *= sg;
                }
                // the output is fp16 (half a step: 2^-11 of |r| <= sum p|v|), the fp32 sums differ in
                // order, and a probability can round to the other fp16 neighbour (2^-11 of its term)
                e = worse(e, fabs(__half2float(got[(size_t)t * qdim + i]) - r) / (a + 1e-6));
            }
        }
        report(e <= 1e-3 && scales_ok, name, e, 1e-3);
        cudaFree(dk); cudaFree(dv); cudaFree(dq); cudaFree(dg); cudaFree(out.h); cudaFree(out.s);
        free(fk); free(fv); free(hk); free(hv); free(q); free(gate); free(ref); free(mag); free(att); free(got); free(gs);
    }
}

// The prefill's row kernels against their C twins: RMSNorm rows, SiLU * up rows, the DeltaNet conv
// over a batch (and the conv state it leaves), the gated norm rows, and the per-row NLL.
// fp16 rows are compared as values: |X*s - v| within half an fp16 step of v (plus fp32 noise).
static double rows_err(const ActH *a, int T, int n, const float *ref /* (T, n) */) {
    uint16_t *h = (uint16_t *)xmalloc((size_t)T * a->ld * 2, "a test");
    float *s = (float *)xmalloc(T * 4, "a test"), *f = a->f ? (float *)xmalloc((size_t)T * a->ld * 4, "a test") : NULL;
    CUDA_CHECK(cudaMemcpy(h, a->h, (size_t)T * a->ld * 2, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(s, a->s, T * 4, cudaMemcpyDeviceToHost));
    if (f) CUDA_CHECK(cudaMemcpy(f, a->f, (size_t)T * a->ld * 4, cudaMemcpyDeviceToHost));
    double e = 0;
    for (int t = 0; t < T; t++) {
        float amax = 0;
        for (int i = 0; i < n; i++) amax = fmaxf(amax, fabsf(ref[(size_t)t * n + i]));
        if (s[t] != row_scale(amax)) e = INFINITY; // a power of two: exact unless amax sits on a boundary
        for (int i = 0; i < n; i++) {
            double r = ref[(size_t)t * n + i], g = (double)fp16_to_f32(h[(size_t)t * a->ld + i]) * s[t];
            double d = fabs(g - r) / (fabs(r) * (1.0 / 2048) + 1e-6 * amax); // in half-steps of fp16
            if (!(d <= e)) e = isnan(d) ? INFINITY : d;
            if (f) { // the fp32 copy: fp32 noise only
                double d2 = fabs(f[(size_t)t * a->ld + i] - r) / (1e-5 * (fabs(r) + 1e-3 * amax));
                if (!(d2 <= e)) e = isnan(d2) ? INFINITY : d2;
            }
        }
    }
    free(h); free(s); free(f);
    return e;
}
static ActH rows_alloc(int T, int ld, int with_f) {
    ActH a;
    a.ld = ld;
    CUDA_CHECK(cudaMalloc(&a.h, (size_t)T * ld * 2));
    CUDA_CHECK(cudaMalloc(&a.s, T * 4));
    a.f = NULL;
    if (with_f) CUDA_CHECK(cudaMalloc(&a.f, (size_t)T * ld * 4));
    return a;
}
static void rows_free(ActH *a) { cudaFree(a->h); cudaFree(a->s); cudaFree(a->f); }

static void test_gpu_prefill_rows(void) {
    const char *names[] = {"gpu rmsnorm_rows_kernel vs rmsnorm_c per row (fp16 rows in half-steps, fp32 copy)",
                           "gpu silu_mul_rows_kernel vs silu_c * up per row (fp16 rows in half-steps)",
                           "gpu gdn_conv_rows + gdn_conv_state (6 rows, then 2) vs gdn_conv_c per row: out |d|/sum|wx|, state",
                           "gpu gdn_gated_norm_rows_kernel vs gated_rmsnorm_c per head (fp16 rows in half-steps)",
                           "gpu row_nll_kernel vs log_softmax: |d nll|"};
    if (SKIP_ALL_WITHOUT_GPU(names)) return;
    const int T = 3, n = 1024, ld = 1032;
    float *x = (float *)xmalloc((size_t)T * n * 4, "a test"), *u = (float *)xmalloc((size_t)T * n * 4, "a test");
    float *w = (float *)xmalloc(n * 4, "a test"), *ref = (float *)xmalloc((size_t)T * n * 4, "a test");
    random_act(x, T * n);
    random_act(u, T * n);
    for (int i = 0; i < n; i++) w[i] = 1 + nrand() * 0.1f;
    x[5] = 3e4f; // a row whose values would overflow fp16 without the row scale
    {
        for (int t = 0; t < T; t++) rmsnorm_c(ref + (size_t)t * n, x + (size_t)t * n, w, n, 1e-6f);
        for (int i = 0; i < T * n; i++) ref[i] *= 100.0f; // and a large weight
        float *w100 = (float *)xmalloc(n * 4, "a test");
        for (int i = 0; i < n; i++) w100[i] = w[i] * 100.0f;
        float *dx = (float *)dcopy(x, (size_t)T * n * 4), *dw = (float *)dcopy(w100, n * 4);
        ActH a = rows_alloc(T, ld, 1);
        rmsnorm_rows_kernel<<<T, ROW_THREADS>>>(a, dx, dw, n, 1e-6f);
        KERNEL_CHECK();
        double e = rows_err(&a, T, n, ref);
        report(e <= 1.1, names[0], e, 1.1);
        rows_free(&a); cudaFree(dx); cudaFree(dw); free(w100);
    }
    {
        for (int i = 0; i < T * n; i++) ref[i] = silu_c(x[i]) * u[i];
        float *dg = (float *)dcopy(x, (size_t)T * n * 4), *du = (float *)dcopy(u, (size_t)T * n * 4);
        ActH a = rows_alloc(T, ld, 0);
        silu_mul_rows_kernel<<<T, ROW_THREADS>>>(a, dg, du, n);
        KERNEL_CHECK();
        double e = rows_err(&a, T, n, ref);
        report(e <= 1.1, names[1], e, 1.1);
        rows_free(&a); cudaFree(dg); cudaFree(du);
    }
    {
        const int cd = 96, R = 8; // 6 rows, then 2 more continuing from the state the first left
        float *mx = (float *)xmalloc(R * cd * 4, "a test"), *cw = (float *)xmalloc(cd * 4 * 4, "a test"), cs[3 * cd], cs_ref[3 * cd];
        float *yr = (float *)xmalloc(R * cd * 4, "a test"), *yg = (float *)xmalloc(R * cd * 4, "a test");
        for (int i = 0; i < R * cd; i++) mx[i] = nrand();
        for (int i = 0; i < cd * 4; i++) cw[i] = nrand() * 0.5f;
        float cs0[3 * cd];
        for (int i = 0; i < 3 * cd; i++) cs0[i] = cs[i] = cs_ref[i] = nrand();
        for (int t = 0; t < R; t++) gdn_conv_c(yr + t * cd, mx + t * cd, cw, cs_ref, cd);
        float *dm = (float *)dcopy(mx, R * cd * 4), *dwt = (float *)dcopy(cw, cd * 16), *dcs = (float *)dcopy(cs, sizeof cs);
        float *dy;
        CUDA_CHECK(cudaMalloc(&dy, R * cd * 4));
        const int parts[2][2] = {{0, 6}, {6, 2}};
        for (int p = 0; p < 2; p++) {
            int r0 = parts[p][0], nr = parts[p][1];
            gdn_conv_rows_kernel<<<(nr * cd + 127) / 128, 128>>>(dy + r0 * cd, dm + r0 * cd, dwt, dcs, cd, nr);
            gdn_conv_state_kernel<<<1, 128>>>(dcs, dm + r0 * cd, cd, nr);
        }
        KERNEL_CHECK();
        CUDA_CHECK(cudaMemcpy(yg, dy, R * cd * 4, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(cs, dcs, sizeof cs, cudaMemcpyDeviceToHost));
        double e = 0; // |d| against the scale sum_k |w_k x_k| of the conv sum (silu' <= 1.1)
        for (int i = 0; i < R * cd; i++) {
            int t = i / cd, c = i % cd;
            double sa = 1e-6;
            for (int k = 0; k < 4; k++) {
                int tt = t - 3 + k; // rows before the batch: the initial state (host copy cs0)
                sa += fabs(cw[4 * c + k] * (tt >= 0 ? mx[tt * cd + c] : cs0[(3 + tt) * cd + c]));
            }
            e = worse(e, fabs(yg[i] - yr[i]) / sa);
        }
        for (int i = 0; i < 3 * cd; i++) e = worse(e, cs[i] == cs_ref[i] ? 0.0 : INFINITY); // copies: exact
        report(e <= 1e-5, names[2], e, 1e-5);
        cudaFree(dm); cudaFree(dwt); cudaFree(dcs); cudaFree(dy);
        free(mx); free(cw); free(yr); free(yg);
    }
    {
        const int Hv = 4, S = 64, vd = Hv * S;
        float *o = (float *)xmalloc(T * vd * 4, "a test"), *z = (float *)xmalloc(T * vd * 4, "a test"), nw[S];
        for (int i = 0; i < T * vd; i++) { o[i] = nrand(); z[i] = nrand(); }
        for (int i = 0; i < S; i++) nw[i] = 1 + nrand() * 0.1f;
        memcpy(ref, o, T * vd * 4);
        for (int t = 0; t < T; t++)
            for (int h = 0; h < Hv; h++) gated_rmsnorm_c(ref + t * vd + h * S, z + t * vd + h * S, nw, S, 1e-6f);
        float *dO = (float *)dcopy(o, T * vd * 4), *dz = (float *)dcopy(z, T * vd * 4), *dnw = (float *)dcopy(nw, sizeof nw);
        ActH a = rows_alloc(T, vd, 1);
        gdn_gated_norm_rows_kernel<<<T, S>>>(a, dO, dz, dnw, Hv, 1e-6f);
        KERNEL_CHECK();
        double e = rows_err(&a, T, vd, ref);
        report(e <= 1.1, names[3], e, 1.1);
        rows_free(&a); cudaFree(dO); cudaFree(dz); cudaFree(dnw);
        free(o); free(z);
    }
    {
        const int nr = 3, V = 1000;
        float *lg = (float *)xmalloc(nr * V * 4, "a test"), got[nr];
        int tg[nr] = {0, 517, 999};
        double *lp = (double *)xmalloc(V * sizeof(double), "a test"), e = 0;
        for (int i = 0; i < nr * V; i++) lg[i] = nrand() * 4;
        float *dl = (float *)dcopy(lg, nr * V * 4), *dn;
        int *dt = (int *)dcopy(tg, sizeof tg);
        CUDA_CHECK(cudaMalloc(&dn, nr * 4));
        row_nll_kernel<<<nr, 1024>>>(dl, dt, dn, V);
        KERNEL_CHECK();
        CUDA_CHECK(cudaMemcpy(got, dn, sizeof got, cudaMemcpyDeviceToHost));
        for (int r = 0; r < nr; r++) {
            log_softmax(lg + r * V, V, lp);
            e = worse(e, fabs(got[r] + lp[tg[r]]));
        }
        report(e <= 1e-4, names[4], e, 1e-4);
        cudaFree(dl); cudaFree(dt); cudaFree(dn);
        free(lg); free(lp);
    }
    free(x); free(u); free(w); free(ref);
}

#include "test_quantize.h"
#include "test_trained.h"
#include "test_hidden.h"
#include "fuzz_targets.h"

int main(int argc, char **argv) {
    (void)argc; (void)argv;
    if (getenv("QWEN_TEST_DATA")) DATA = getenv("QWEN_TEST_DATA");
    if (getenv("QWEN_BIN")) QWEN = getenv("QWEN_BIN");
    if (getenv("QUANTIZE_BIN")) QUANTIZE = getenv("QUANTIZE_BIN");
    SUBSET = getenv("QWEN_TEST_SUBSET") && atoi(getenv("QWEN_TEST_SUBSET"));
    // QWEN_TEST_GPU_ONLY=1 (test/gpu_run.sh): leave out the slow CPU-only checks of the trained
    // models, which a run on the CPU machine has made
    int gpu_only = getenv("QWEN_TEST_GPU_ONLY") && atoi(getenv("QWEN_TEST_GPU_ONLY"));
    g_verbose = 0;
    tmp_make();
    // QWEN_TEST_TMP_WAIT=1: the check of TMP's removal on a signal (test_cli_user3) runs this
    // binary so; it makes TMP, puts a file in it, prints its name and waits for the signal
    if (getenv("QWEN_TEST_TMP_WAIT") && atoi(getenv("QWEN_TEST_TMP_WAIT"))) {
        char f[128];
        snprintf(f, sizeof f, "%s/waiting", TMP);
        write_file(f, "x", 1);
        printf("%s\n", TMP);
        fflush(stdout);
        for (int i = 0; i < 600; i++) sleep(1);
        return 1;
    }
    test_fuzz_replays(); // first: its children are forked, and CUDA does not survive a fork
    setenv("CUDA_MODULE_LOADING", "EAGER", 0);
    int gpu = HAVE_GPU = gpu_available();
    if (gpu) {
        cudaDeviceProp p;
        CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
        printf("# GPU: %s (sm_%d%d)\n", p.name, p.major, p.minor);
    } else {
        printf("# no CUDA GPU: GPU checks are skipped\n");
    }
    // QWEN_REQUIRE_GPU=1 (test/gpu_run.sh): on the GPU machine a missing device is a failure, not a
    // run whose GPU checks all quietly became skips
    if (getenv("QWEN_REQUIRE_GPU") && atoi(getenv("QWEN_REQUIRE_GPU"))) check(gpu, "gpu: a CUDA device is present (QWEN_REQUIRE_GPU)");
    load_seqs();

    test_conversions();
    test_gguf_reader();
    test_dequantizers();
    test_dequant_spec();
    test_quantizers();
    test_xq_rounding();
    test_iq4_planes();
    test_step_order();
    test_att_cut();
    test_source_form();
    test_sampler();
    test_sampler_keep();
    test_sampler_draws();
    test_utf8_bounds();
    test_tokenizer();
    test_cli();
    test_cli_user();
    test_cli_user3();
    test_cli_user4();
    test_diff_logits();
    test_budget();
    test_perplexity();
    test_models(0);
    if (!gpu_only) test_trained(0);
    if (!gpu_only) test_hidden();

    test_gpu_quantize();
    for (g_mv_mode = MV_STREAM; g_mv_mode <= MV_BLOCKS; g_mv_mode++) { // both fast mat-vec kernels
        test_gpu_matvec();
        test_gpu_gate_up();
        test_gpu_qkv_batch();
    }
    g_mv_mode = MV_AUTO;
    test_gpu_small_kernels();
    test_gpu_deltanet();
    test_gpu_deltanet_rows();
    test_gpu_matmul();
    test_gpu_bf16_range();
    test_gpu_step_order();
    test_gpu_attention_prefill();
    test_gpu_prefill_rows();
    test_models(1);
    test_trained(1);
    test_hidden_gpu();
    printf("%d passed, %d failed, %d skipped\n", n_pass, n_fail, n_skip);
    return n_fail ? 1 : 0;
}
