// fuzz_mutate.c — writes a mutated copy of a GGUF file for test/fuzz.sh.
//
//   test/fuzz_mutate IN OUT SEED
//
// IN is mapped and taken apart: the header, each metadata entry (key, type, value), each tensor
// info (name, dims, type) and each tensor's data. One to three mutations are picked from SEED:
//   structural, applied to the parts before OUT is written from them:
//     a scalar value set to an edge value (0, 1, -1, 2^31, 2^32, NaN, inf, off by one, ...);
//     a key the engine reads set to another type or value, or added; an entry deleted,
//     duplicated, retyped, or its key changed; array elements overwritten, an array shortened or
//     its element count or type changed; a string or a string array element changed (bytes,
//     invalid UTF-8, special-token text, another element's text, empty, long);
//     a tensor's type, dims or n_dims changed (its data cut or padded to the new size, so the
//     file stays consistent), a tensor deleted, duplicated or renamed;
//   on the bytes written:
//     bits flipped or edge values written in the header region; the version or a count
//     overwritten; a tensor's offset moved; a span of a tensor's data overwritten (NaN and inf
//     patterns, random bytes); the file cut at a random length; random bytes appended.
// OUT is written with the offsets and padding of the (mutated) alignment, so that a structural
// change reaches the checks behind the reader's; it is cut at 16 MiB whatever sizes it declares.
// Tensor data is written from a private mapping of IN, so a case costs little more than the bytes
// it writes.
// One line on stdout names the mutations. The same IN and SEED always give the same OUT.
// Exit status 0, or 2 on a usage or I/O error.

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#define MAX_OUT ((size_t)16 << 20) // OUT is cut at 16 MiB whatever the sizes it declares

// ---- random numbers: splitmix64 ----
static uint64_t g_rng;
static uint64_t rnd(void) {
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static uint64_t below(uint64_t n) { return n ? rnd() % n : 0; }
static int one_in(int n) { return below((uint64_t)n) == 0; }

// ---- growable byte buffers ----
typedef struct {
    uint8_t *p;
    size_t n, cap;
} Buf;

static void *xrealloc(void *p, size_t n) {
    p = realloc(p, n ? n : 1);
    if (!p) { fprintf(stderr, "fuzz_mutate: out of memory\n"); exit(2); }
    return p;
}
static void buf_reserve(Buf *b, size_t n) {
    if (b->n + n <= b->cap) return;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + n) cap *= 2;
    b->p = (uint8_t *)xrealloc(b->p, cap);
    b->cap = cap;
}
static void buf_put(Buf *b, const void *src, size_t n) {
    buf_reserve(b, n);
    if (n) memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void buf_zero(Buf *b, size_t n) {
    buf_reserve(b, n);
    memset(b->p + b->n, 0, n);
    b->n += n;
}
static void buf_u32(Buf *b, uint32_t v) { buf_put(b, &v, 4); }
static void buf_u64(Buf *b, uint64_t v) { buf_put(b, &v, 8); }
// replace old_n bytes at off with new_n bytes of src
static void buf_splice(Buf *b, size_t off, size_t old_n, const void *src, size_t new_n) {
    if (new_n > old_n) buf_reserve(b, new_n - old_n);
    memmove(b->p + off + new_n, b->p + off + old_n, b->n - off - old_n);
    if (new_n) memcpy(b->p + off, src, new_n);
    b->n = b->n - old_n + new_n;
}
static uint64_t get_u64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static uint32_t get_u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }

// ---- the parts of a GGUF file ----
enum { G_U8, G_I8, G_U16, G_I16, G_U32, G_I32, G_F32, G_BOOL, G_STR, G_ARR, G_U64, G_I64, G_F64,
       G_NTYPES };
static const int G_SIZE[G_NTYPES] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
static const char *G_NAME[G_NTYPES] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool",
                                       "str", "arr", "u64", "i64", "f64"};

// ggml types: elements and bytes per block (0: removed or unknown, size kept from the input)
static const int BLCK[40] = {1, 1, 32, 32, 0, 0, 32, 32, 32, 32, 256, 256, 256, 256, 256, 256,
                             256, 256, 256, 256, 32, 256, 256, 256, 1, 1, 1, 1, 1, 256, 1,
                             0, 0, 0, 256, 256, 0, 0, 0, 32};
static const int TSZ[40] = {4, 2, 18, 20, 0, 0, 22, 24, 34, 36, 84, 110, 144, 176, 210, 292,
                            66, 74, 98, 50, 18, 110, 82, 136, 1, 2, 4, 8, 8, 56, 2,
                            0, 0, 0, 54, 66, 0, 0, 0, 17};

// One metadata entry as it is written: u64 key length, key, i32 type, value.
typedef struct {
    Buf b;
} KV;
static size_t kv_klen(const KV *kv) { return (size_t)get_u64(kv->b.p); }
static size_t kv_toff(const KV *kv) { return 8 + kv_klen(kv); }  // offset of the type
static size_t kv_voff(const KV *kv) { return 12 + kv_klen(kv); } // offset of the value
static int32_t kv_type(const KV *kv) { return (int32_t)get_u32(kv->b.p + kv_toff(kv)); }
static void kv_key(const KV *kv, char *out, size_t cap) {
    size_t n = kv_klen(kv) < cap - 1 ? kv_klen(kv) : cap - 1;
    memcpy(out, kv->b.p + 8, n);
    out[n] = 0;
    for (size_t i = 0; i < n; i++)
        if (out[i] < 0x20 || out[i] > 0x7e) out[i] = '?';
}

typedef struct {
    Buf name;
    uint32_t n_dims; // as written; ne[] holds 6 so that n_dims 5 and 6 can be written
    int64_t ne[6];
    int32_t type;
    uint8_t *data; // the input's bytes of this tensor (in its private mapping)
    size_t len;
    size_t off_field, out_len, have; // OUT: where its offset is, its size, bytes from the input
} Tensor;

static uint32_t g_version;
static KV *g_kv;
static int g_nkv;
static Tensor *g_t;
static int g_nt;
static char g_arch[32] = "qwen3";
static char g_desc[4096]; // what was done, printed at the end
static size_t g_header_len; // OUT: bytes before the data section

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
    size_t n = strlen(g_desc);
    if (n + 4 >= sizeof g_desc) return;
    if (n) { strcpy(g_desc + n, "; "); n += 2; }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_desc + n, sizeof g_desc - n, fmt, ap);
    va_end(ap);
}

// Byte length of a value of type `type` at p (end bounds it), or -1.
static int64_t value_len(const uint8_t *p, const uint8_t *end, int32_t type) {
    if (type < 0 || type >= G_NTYPES) return -1;
    if (type == G_STR) {
        if (end - p < 8) return -1;
        uint64_t n = get_u64(p);
        return n <= (uint64_t)(end - p - 8) ? (int64_t)(8 + n) : -1;
    }
    if (type == G_ARR) {
        if (end - p < 12) return -1;
        int32_t at = (int32_t)get_u32(p);
        uint64_t n = get_u64(p + 4);
        if (at < 0 || at >= G_NTYPES || at == G_ARR) return -1;
        const uint8_t *q = p + 12;
        if (at != G_STR) {
            if (n > (uint64_t)(end - q) / (uint64_t)G_SIZE[at]) return -1;
            return 12 + (int64_t)(n * (uint64_t)G_SIZE[at]);
        }
        for (uint64_t i = 0; i < n; i++) {
            int64_t l = value_len(q, end, G_STR);
            if (l < 0) return -1;
            q += l;
        }
        return q - p;
    }
    return G_SIZE[type] <= end - p ? G_SIZE[type] : -1;
}

// Read IN into g_version, g_kv, g_t. Returns 0, or -1 when it is not a GGUF file this tool can
// take apart (then only byte mutations are applied).
static int parse(uint8_t *base, size_t size) {
    const uint8_t *p = base, *end = base + size;
    if (size < 24 || memcmp(p, "GGUF", 4)) return -1;
    g_version = get_u32(p + 4);
    uint64_t nt = get_u64(p + 8), nkv = get_u64(p + 16);
    p += 24;
    if (nt > size / 24 || nkv > size / 13) return -1;
    g_kv = (KV *)xrealloc(NULL, (nkv + 1) * sizeof *g_kv);
    memset(g_kv, 0, (nkv + 1) * sizeof *g_kv);
    uint32_t align = 32;
    for (uint64_t i = 0; i < nkv; i++) {
        int64_t kl = value_len(p, end, G_STR);
        if (kl < 0 || end - p - kl < 4) return -1;
        int32_t type = (int32_t)get_u32(p + kl);
        int64_t vl = value_len(p + kl + 4, end, type);
        if (vl < 0) return -1;
        KV *kv = &g_kv[g_nkv++];
        buf_put(&kv->b, p, (size_t)(kl + 4 + vl));
        char key[128];
        kv_key(kv, key, sizeof key);
        if (!strcmp(key, "general.alignment") && type == G_U32) align = get_u32(p + kl + 4);
        if (!strcmp(key, "general.architecture") && type == G_STR) {
            uint64_t n = get_u64(p + kl + 4);
            if (n < sizeof g_arch) { memcpy(g_arch, p + kl + 12, n); g_arch[n] = 0; }
        }
        p += kl + 4 + vl;
    }
    if (align == 0 || (align & (align - 1))) return -1;
    g_t = (Tensor *)xrealloc(NULL, (nt + 1) * sizeof *g_t);
    memset(g_t, 0, (nt + 1) * sizeof *g_t);
    uint64_t *offs = (uint64_t *)xrealloc(NULL, (nt + 1) * sizeof *offs);
    for (uint64_t i = 0; i < nt; i++) {
        int64_t nl = value_len(p, end, G_STR);
        if (nl < 0 || end - p - nl < 4) return -1;
        Tensor *t = &g_t[g_nt++];
        buf_put(&t->name, p + 8, (size_t)(nl - 8));
        p += nl;
        t->n_dims = get_u32(p);
        p += 4;
        if (t->n_dims > 4 || (size_t)(end - p) < 8 * t->n_dims + 12) return -1;
        for (int d = 0; d < 6; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < t->n_dims; d++, p += 8) t->ne[d] = (int64_t)get_u64(p);
        t->type = (int32_t)get_u32(p);
        offs[i] = get_u64(p + 4);
        p += 12;
    }
    size_t data = ((size_t)(p - base) + align - 1) / align * align;
    if (data > size) return -1;
    for (int i = 0; i < g_nt; i++) { // each tensor's bytes run to the next one's (or the end)
        uint64_t a = offs[i], b = i + 1 < g_nt ? offs[i + 1] : size - data;
        if (a > b || b > size - data) return -1;
        g_t[i].data = base + data + a;
        g_t[i].len = (size_t)(b - a);
    }
    free(offs);
    return 0;
}

// ---- edge values ----
static uint64_t edge_int(uint64_t orig, int bytes) {
    static const uint64_t E[] = {0, 1, 2, 3, 4, 7, 8, 16, 31, 32, 33, 63, 64, 127, 128, 255, 256,
                                 512, 1023, 1024, 1025, 4096, 32767, 32768, 65535, 65536,
                                 1u << 20, (1u << 20) + 1, 1u << 24, 0x7fffffff, 0x80000000u,
                                 0xfffffffe, 0xffffffff, 0x100000000ull, 0x100000001ull,
                                 0x7fffffffffffffffull, 0x8000000000000000ull,
                                 0xffffffffffffffffull};
    uint64_t v;
    switch (below(6)) {
    case 0: v = orig + 1; break;
    case 1: v = orig - 1; break;
    case 2: v = orig * 2; break;
    case 3: v = orig ^ (1ull << below((uint64_t)bytes * 8)); break;
    case 4: v = rnd(); break;
    default: v = E[below(sizeof E / sizeof E[0])]; break;
    }
    if (bytes < 8) v &= (1ull << (bytes * 8)) - 1;
    return v;
}
static float edge_f32(float orig) {
    static const uint32_t E[] = {0x00000000, 0x80000000, 0x3f800000, 0xbf800000, 0x3f000000,
                                 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000, 0x7f7fffff,
                                 0xff7fffff, 0x00000001, 0x00800000, 0x0da24260, 0x7149f2ca,
                                 0x4b800000, 0xcb800000};
    uint32_t u;
    if (one_in(3)) {
        memcpy(&u, &orig, 4);
        u ^= 1u << below(32);
    } else if (one_in(3)) {
        float f = orig * (float)(below(2001) - 1000) / 100.0f;
        memcpy(&u, &f, 4);
    } else {
        u = E[below(sizeof E / sizeof E[0])];
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}
// an edge value of GGUF scalar type `type` into out (G_SIZE[type] bytes) from the value at orig
static void edge_scalar(int type, const uint8_t *orig, uint8_t *out) {
    int n = G_SIZE[type];
    if (type == G_F32) {
        float f;
        memcpy(&f, orig, 4);
        f = edge_f32(f);
        memcpy(out, &f, 4);
    } else if (type == G_F64) {
        double d;
        memcpy(&d, orig, 8);
        static const double E[] = {0.0, -1.0, 1e300, 1e-300, INFINITY, -INFINITY};
        d = one_in(4) ? NAN : one_in(2) ? d * 2 : E[below(6)];
        memcpy(out, &d, 8);
    } else if (type == G_BOOL) {
        static const uint8_t E[] = {0, 1, 2, 0x80, 0xff};
        out[0] = E[below(5)];
    } else {
        uint64_t o = 0;
        memcpy(&o, orig, (size_t)n);
        uint64_t v = edge_int(o, n);
        memcpy(out, &v, (size_t)n);
    }
}

// ---- strings ----
static const char *STRINGS[] = {
    "", "qwen2", "qwen3", "qwen35", "llama", "gpt2", "bert", "none", "linear", "yarn",
    "deepseek-r1-qwen", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<0x41>", "<0xZZ>", "<0x",
    "<0x4", "\xc4\xa0", "\xc4\xa0 \xc4\xa0", " ", "a b", "a  b", "ab", "\n", "\xff\xfe", "\xc3",
    "\xe4\xbd", "\xf0\x9f\x98", "\xed\xa0\x80", "\xc0\x80", "\xf4\x90\x80\x80", "\xe2\x80\x8b",
    "You are a helpful assistant.", "Hello", "\xc4\xa0Hello", "%s%n%x"};

// A new text for a string whose current bytes are s[0..n): into out (returns its length).
static size_t mutate_text(const uint8_t *s, size_t n, uint8_t *out, size_t cap, const char **how) {
    size_t m = 0;
    switch (below(7)) {
    case 0: case 1: { // a string from the list
        const char *e = STRINGS[below(sizeof STRINGS / sizeof STRINGS[0])];
        m = strlen(e);
        memcpy(out, e, m);
        *how = "text";
        break;
    }
    case 2: // one byte changed
        m = n < cap ? n : cap;
        memcpy(out, s, m);
        if (m) out[below(m)] = one_in(2) ? (uint8_t)rnd() : (uint8_t)"\x00\x80\xc0\xff\n"[below(5)];
        *how = "byte";
        break;
    case 3: // cut
        m = n ? below(n < cap ? n : cap) : 0;
        memcpy(out, s, m);
        *how = "cut";
        break;
    case 4: { // random bytes appended
        m = n < cap / 2 ? n : cap / 2;
        memcpy(out, s, m);
        size_t k = 1 + below(16);
        for (size_t i = 0; i < k; i++) out[m++] = (uint8_t)rnd();
        *how = "grow";
        break;
    }
    case 5: // long: half the room or more
        m = cap / 2 + below(cap / 2 + 1);
        memset(out, one_in(2) ? 'a' : ' ', m);
        *how = "long";
        break;
    default: // random bytes
        m = below(32);
        for (size_t i = 0; i < m; i++) out[i] = (uint8_t)rnd();
        *how = "random";
        break;
    }
    return m;
}

// ---- structural mutations; each returns 1 when it did something ----
// whether an entry's value is what its type says (an earlier mutation may have retyped it)
static int kv_valid(const KV *kv) {
    int64_t l = value_len(kv->b.p + kv_voff(kv), kv->b.p + kv->b.n, kv_type(kv));
    return l >= 0 && (size_t)l == kv->b.n - kv_voff(kv);
}
static KV *any_kv(void) { return g_nkv ? &g_kv[below((uint64_t)g_nkv)] : NULL; }
// a valid entry of type want_type (-1: any, -2: any scalar); arrays of want_arr_type (-1: any,
// -2: any number type)
static KV *random_kv(int want_type, int want_arr_type) {
    int cand[4096], n = 0;
    for (int i = 0; i < g_nkv && n < 4096; i++) {
        if (!kv_valid(&g_kv[i])) continue;
        int32_t t = kv_type(&g_kv[i]);
        if (want_type >= 0 && t != want_type) continue;
        if (want_type == -2 && (t < 0 || t >= G_NTYPES || t == G_STR || t == G_ARR)) continue;
        if (want_arr_type != -1 && t == G_ARR) {
            int32_t at = (int32_t)get_u32(g_kv[i].b.p + kv_voff(&g_kv[i]));
            if (want_arr_type >= 0 && at != want_arr_type) continue;
            if (want_arr_type == -2 && at == G_STR) continue;
        }
        cand[n++] = i;
    }
    return n ? &g_kv[cand[below((uint64_t)n)]] : NULL;
}

static int m_kv_scalar(void) { // a scalar's value to an edge value
    KV *kv = random_kv(-2, -1);
    if (!kv) return 0;
    char key[96];
    kv_key(kv, key, sizeof key);
    int t = kv_type(kv);
    uint8_t v[8];
    edge_scalar(t, kv->b.p + kv_voff(kv), v);
    memcpy(kv->b.p + kv_voff(kv), v, (size_t)G_SIZE[t]);
    uint64_t u = 0;
    memcpy(&u, v, (size_t)G_SIZE[t]);
    say("kv_scalar %s %s=0x%llx", key, G_NAME[t], (unsigned long long)u);
    return 1;
}

// the keys the engine reads; "%s" is the file's architecture
static const char *KEYS[] = {
    "%s.context_length", "%s.embedding_length", "%s.block_count", "%s.feed_forward_length",
    "%s.attention.head_count", "%s.attention.head_count_kv", "%s.attention.key_length",
    "%s.attention.value_length", "%s.rope.dimension_count", "%s.rope.freq_base",
    "%s.rope.scaling.type", "%s.rope.scaling.factor", "%s.rope.scale_linear",
    "%s.attention.layer_norm_rms_epsilon", "%s.rope.dimension_sections",
    "%s.full_attention_interval", "%s.attention.recurrent_layers", "%s.nextn_predict_layers",
    "%s.ssm.conv_kernel", "%s.ssm.inner_size", "%s.ssm.state_size", "%s.ssm.time_step_rank",
    "%s.ssm.group_count", "general.alignment", "general.architecture", "tokenizer.ggml.model",
    "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.eot_token_id", "tokenizer.ggml.add_bos_token", "tokenizer.chat_template"};

static KV *find_kv(const char *key) {
    for (int i = 0; i < g_nkv; i++) {
        char k[256];
        kv_key(&g_kv[i], k, sizeof k);
        if (!strcmp(k, key)) return &g_kv[i];
    }
    return NULL;
}

static int m_kv_set(void) { // a key the engine reads: set to a new type and value, or added
    char key[128];
    snprintf(key, sizeof key, KEYS[below(sizeof KEYS / sizeof KEYS[0])], g_arch);
    KV *kv = find_kv(key);
    if (!kv) {
        g_kv = (KV *)xrealloc(g_kv, (size_t)(g_nkv + 1) * sizeof *g_kv);
        kv = &g_kv[g_nkv++];
        memset(kv, 0, sizeof *kv);
        buf_u64(&kv->b, strlen(key));
        buf_put(&kv->b, key, strlen(key));
        buf_u32(&kv->b, G_U32);
        buf_u32(&kv->b, 0);
    }
    // keep the entry's key, write a new type and value after it
    kv->b.n = kv_toff(kv);
    static const int TYPES[] = {G_U32, G_U32, G_U32, G_I32, G_F32, G_F32, G_U64, G_BOOL, G_STR,
                                G_ARR, G_ARR, G_U8, G_I16, G_F64};
    int t = TYPES[below(sizeof TYPES / sizeof TYPES[0])];
    buf_u32(&kv->b, (uint32_t)t);
    uint8_t zero[8] = {0}, v[8];
    if (t == G_STR) {
        uint8_t s[4096];
        const char *how;
        size_t n = mutate_text((const uint8_t *)"", 0, s, sizeof s, &how);
        buf_u64(&kv->b, n);
        buf_put(&kv->b, s, n);
        say("kv_set %s str(%s, %zu bytes)", key, how, n);
    } else if (t == G_ARR) { // of u32/i32/f32/str, 0 to 8 elements
        static const int AT[] = {G_I32, G_U32, G_F32, G_STR, G_I32};
        int at = AT[below(5)];
        uint64_t n = below(9);
        buf_u32(&kv->b, (uint32_t)at);
        buf_u64(&kv->b, n);
        for (uint64_t i = 0; i < n; i++) {
            if (at == G_STR) {
                const char *e = STRINGS[below(sizeof STRINGS / sizeof STRINGS[0])];
                buf_u64(&kv->b, strlen(e));
                buf_put(&kv->b, e, strlen(e));
            } else {
                edge_scalar(at, zero, v);
                buf_put(&kv->b, v, 4);
            }
        }
        say("kv_set %s arr[%llu x %s]", key, (unsigned long long)n, G_NAME[at]);
    } else {
        edge_scalar(t, zero, v);
        buf_put(&kv->b, v, (size_t)G_SIZE[t]);
        uint64_t u = 0;
        memcpy(&u, v, (size_t)G_SIZE[t]);
        say("kv_set %s %s=0x%llx", key, G_NAME[t], (unsigned long long)u);
    }
    return 1;
}

static int m_kv_delete(void) {
    if (!g_nkv) return 0;
    int i = (int)below((uint64_t)g_nkv);
    char key[96];
    kv_key(&g_kv[i], key, sizeof key);
    free(g_kv[i].b.p);
    memmove(&g_kv[i], &g_kv[i + 1], (size_t)(g_nkv - i - 1) * sizeof *g_kv);
    g_nkv--;
    say("kv_delete %s", key);
    return 1;
}

static int m_kv_dup(void) { // a copy of an entry, at a random place
    if (!g_nkv) return 0;
    int i = (int)below((uint64_t)g_nkv), at = (int)below((uint64_t)g_nkv + 1);
    KV copy = {{NULL, 0, 0}};
    buf_put(&copy.b, g_kv[i].b.p, g_kv[i].b.n);
    g_kv = (KV *)xrealloc(g_kv, (size_t)(g_nkv + 1) * sizeof *g_kv);
    memmove(&g_kv[at + 1], &g_kv[at], (size_t)(g_nkv - at) * sizeof *g_kv);
    g_kv[at] = copy;
    g_nkv++;
    char key[96];
    kv_key(&copy, key, sizeof key);
    say("kv_dup %s", key);
    return 1;
}

static int m_kv_key(void) { // the key's text changed
    KV *kv = any_kv();
    if (!kv) return 0;
    char old[96];
    kv_key(kv, old, sizeof old);
    uint8_t s[4096];
    size_t n;
    const char *how = "other arch";
    if (one_in(3)) { // the same key under another architecture
        static const char *ARCH[] = {"qwen2", "qwen3", "qwen35", "llama", ""};
        const char *dot = memchr(kv->b.p + 8, '.', kv_klen(kv));
        size_t rest = dot ? kv_klen(kv) - (size_t)(dot - (const char *)kv->b.p - 8) : 0;
        const char *a = ARCH[below(5)];
        n = strlen(a);
        memcpy(s, a, n);
        if (dot && rest < sizeof s - n) memcpy(s + n, dot, rest), n += rest;
    } else {
        n = mutate_text(kv->b.p + 8, kv_klen(kv), s, sizeof s, &how);
    }
    uint64_t n64 = n;
    buf_splice(&kv->b, 0, 8 + kv_klen(kv), &n64, 8);
    buf_splice(&kv->b, 8, 0, s, n);
    say("kv_key %s (%s, %zu bytes)", old, how, n);
    return 1;
}

static int m_kv_retype(void) { // only the type id: the value's bytes stay as they are
    KV *kv = any_kv();
    if (!kv) return 0;
    char key[96];
    kv_key(kv, key, sizeof key);
    static const int32_t E[] = {-1, 13, 14, 0x7fffffff, (int32_t)0x80000000};
    int32_t t = one_in(5) ? E[below(5)] : (int32_t)below(G_NTYPES);
    memcpy(kv->b.p + kv_toff(kv), &t, 4);
    say("kv_retype %s to %d", key, t);
    return 1;
}

static int m_arr_elem(void) { // elements of a number array to edge values
    KV *kv = random_kv(G_ARR, -2);
    if (!kv) return 0;
    uint8_t *a = kv->b.p + kv_voff(kv);
    int at = (int)get_u32(a);
    uint64_t n = get_u64(a + 4);
    if (n == 0 || at < 0 || at >= G_NTYPES || !G_SIZE[at]) return 0;
    size_t es = (size_t)G_SIZE[at];
    uint64_t k = one_in(4) ? n : 1 + below(4); // sometimes every element
    uint8_t v[8];
    uint64_t first = below(n);
    for (uint64_t j = 0; j < k; j++) {
        uint64_t i = j == 0 ? first : below(n);
        edge_scalar(at, a + 12 + i * es, v);
        memcpy(a + 12 + i * es, v, es);
    }
    char key[96];
    kv_key(kv, key, sizeof key);
    uint64_t u = 0;
    memcpy(&u, a + 12 + first * es, es);
    say("arr_elem %s [%llu of %llu] e.g. [%llu]=0x%llx", key, (unsigned long long)k,
        (unsigned long long)n, (unsigned long long)first, (unsigned long long)u);
    return 1;
}

// offset in kv->b of element i of a string array (its u64 length)
static size_t str_elem_off(const KV *kv, uint64_t i) {
    size_t off = kv_voff(kv) + 12;
    for (uint64_t j = 0; j < i; j++) off += 8 + (size_t)get_u64(kv->b.p + off);
    return off;
}

static int m_arr_len(void) { // an array's count or element type
    KV *kv = random_kv(G_ARR, -1);
    if (!kv) return 0;
    char key[96];
    kv_key(kv, key, sizeof key);
    uint8_t *a = kv->b.p + kv_voff(kv);
    int at = (int)get_u32(a);
    uint64_t n = get_u64(a + 4);
    switch (below(3)) {
    case 0: { // shortened, the dropped elements removed
        uint64_t m = n ? below(n) : 0;
        if (one_in(2) && n > 1) m = n - 1 - below(n < 8 ? n - 1 : 8);
        size_t cut = at == G_STR ? str_elem_off(kv, m) : kv_voff(kv) + 12 + m * (size_t)G_SIZE[at];
        kv->b.n = cut;
        memcpy(kv->b.p + kv_voff(kv) + 4, &m, 8);
        say("arr_len %s %llu -> %llu (elements dropped)", key, (unsigned long long)n,
            (unsigned long long)m);
        break;
    }
    case 1: { // the count alone
        uint64_t m = edge_int(n, 8);
        memcpy(a + 4, &m, 8);
        say("arr_len %s count %llu -> %llu", key, (unsigned long long)n, (unsigned long long)m);
        break;
    }
    default: { // the element type alone
        int32_t t = (int32_t)below(G_NTYPES + 1);
        memcpy(a, &t, 4);
        say("arr_len %s element type %d -> %d", key, at, t);
        break;
    }
    }
    return 1;
}

static int m_str(void) { // a string value, or one element of a string array
    KV *kv = one_in(3) ? random_kv(G_STR, -1) : random_kv(G_ARR, G_STR);
    if (!kv) kv = random_kv(G_STR, -1);
    if (!kv) return 0;
    char key[96];
    kv_key(kv, key, sizeof key);
    size_t off;
    uint64_t idx = 0, n = 0;
    if (kv_type(kv) == G_STR) off = kv_voff(kv);
    else {
        n = get_u64(kv->b.p + kv_voff(kv) + 4);
        if (!n) return 0;
        idx = below(n);
        // often the first ~300 (byte characters, merges of the tiny vocabularies) or the last
        // ones (special tokens)
        if (one_in(3)) idx = below(n < 300 ? n : 300);
        else if (one_in(3)) idx = n - 1 - below(n < 40 ? n : 40);
        off = str_elem_off(kv, idx);
    }
    size_t len = (size_t)get_u64(kv->b.p + off);
    static uint8_t s[1 << 16];
    size_t m;
    const char *how;
    if (n > 1 && one_in(4)) { // the text of another element: a duplicate token or merge
        size_t o2 = str_elem_off(kv, below(n));
        m = (size_t)get_u64(kv->b.p + o2);
        if (m > sizeof s) m = sizeof s;
        memcpy(s, kv->b.p + o2 + 8, m);
        how = "copy";
    } else {
        m = mutate_text(kv->b.p + off + 8, len, s, 4096, &how);
    }
    uint64_t m64 = m;
    buf_splice(&kv->b, off + 8, len, s, m);
    memcpy(kv->b.p + off, &m64, 8);
    if (kv_type(kv) == G_STR) say("str %s (%s, %zu bytes)", key, how, m);
    else say("str %s[%llu] (%s, %zu bytes)", key, (unsigned long long)idx, how, m);
    return 1;
}

static int m_t_type(void) {
    if (!g_nt) return 0;
    Tensor *t = &g_t[below((uint64_t)g_nt)];
    int32_t old = t->type;
    // same bytes per weight (the data still fits) or any id, including removed and unknown ones
    static const int32_t SAME[][2] = {{2, 20}, {1, 30}, {0, 26}, {1, 25}, {12, 2}};
    if (one_in(2)) {
        const int32_t *p = SAME[below(5)];
        t->type = t->type == p[0] ? p[1] : p[0];
    } else {
        static const int32_t E[] = {-1, 40, 41, 42, 43, 255, 0x7fffffff};
        t->type = one_in(5) ? E[below(7)] : (int32_t)below(40);
    }
    say("t_type %.*s %d -> %d", (int)t->name.n, (const char *)t->name.p, old, t->type);
    return 1;
}

static int m_t_dims(void) {
    if (!g_nt) return 0;
    Tensor *t = &g_t[below((uint64_t)g_nt)];
    int nd = t->n_dims < 4 ? (int)t->n_dims : 4;
    int how = (int)below(4);
    if (how == 0 && nd < 2) how = 1;
    switch (how) {
    case 0: { // two dims swapped: the same size
        int64_t x = t->ne[0];
        t->ne[0] = t->ne[1];
        t->ne[1] = x;
        say("t_dims %.*s swapped", (int)t->name.n, (const char *)t->name.p);
        break;
    }
    case 1: { // n_dims
        static const uint32_t E[] = {0, 1, 2, 3, 4, 5, 6, 0xffffffff};
        uint32_t old = t->n_dims;
        t->n_dims = E[below(8)];
        for (uint32_t d = old; d < 6 && d < t->n_dims; d++) t->ne[d] = one_in(2) ? 1 : 2;
        say("t_dims %.*s n_dims %u -> %u", (int)t->name.n, (const char *)t->name.p, old,
            t->n_dims);
        break;
    }
    default: { // one dim to an edge value, a multiple of 32 or 256 half the time
        int d = nd ? (int)below((uint64_t)nd) : 0;
        int64_t v = (int64_t)edge_int((uint64_t)t->ne[d], 8);
        if (one_in(2)) v = (int64_t)((uint64_t)(one_in(2) ? 32 : 256) * (1 + below(64)));
        if (one_in(4)) v = -v;
        int64_t old = t->ne[d];
        t->ne[d] = v;
        if (!t->n_dims) t->n_dims = 1;
        say("t_dims %.*s ne[%d] %lld -> %lld", (int)t->name.n, (const char *)t->name.p, d,
            (long long)old, (long long)v);
        break;
    }
    }
    return 1;
}

static int m_t_list(void) { // a tensor deleted, duplicated or renamed
    if (!g_nt) return 0;
    int i = (int)below((uint64_t)g_nt);
    Tensor *t = &g_t[i];
    switch (below(4)) {
    case 0:
        say("t_delete %.*s", (int)t->name.n, (const char *)t->name.p);
        free(t->name.p);
        memmove(t, t + 1, (size_t)(g_nt - i - 1) * sizeof *t);
        g_nt--;
        break;
    case 1: {
        g_t = (Tensor *)xrealloc(g_t, (size_t)(g_nt + 1) * sizeof *g_t);
        t = &g_t[i];
        Tensor c = *t;
        memset(&c.name, 0, sizeof c.name);
        buf_put(&c.name, t->name.p, t->name.n);
        g_t[g_nt++] = c;
        say("t_dup %.*s", (int)t->name.n, (const char *)t->name.p);
        break;
    }
    case 2: { // names of two tensors swapped: shapes and types no longer match the names
        Tensor *u = &g_t[below((uint64_t)g_nt)];
        Buf x = t->name;
        t->name = u->name;
        u->name = x;
        say("t_swap_names %.*s %.*s", (int)t->name.n, (const char *)t->name.p, (int)u->name.n,
            (const char *)u->name.p);
        break;
    }
    default: {
        uint8_t s[4096];
        const char *how;
        size_t n = mutate_text(t->name.p, t->name.n, s, 100, &how);
        say("t_rename %.*s (%s, %zu bytes)", (int)t->name.n, (const char *)t->name.p, how, n);
        t->name.n = 0;
        buf_put(&t->name, s, n);
        break;
    }
    }
    return 1;
}

// ---- writing OUT from the parts ----
static uint64_t tensor_bytes(const Tensor *t) {
    if (t->type < 0 || t->type >= 40 || !BLCK[t->type]) return t->len;
    unsigned __int128 n = 1;
    for (uint32_t d = 0; d < t->n_dims && d < 4; d++) {
        if (t->ne[d] <= 0) return 0;
        n *= (uint64_t)t->ne[d];
        if (n > ((unsigned __int128)1 << 80)) return UINT64_MAX;
    }
    n = n / (uint64_t)BLCK[t->type] * (uint64_t)TSZ[t->type];
    return n > UINT64_MAX ? UINT64_MAX : (uint64_t)n;
}

static uint32_t out_alignment(void) {
    KV *kv = find_kv("general.alignment");
    if (!kv || kv_type(kv) != G_U32 || kv->b.n < kv_voff(kv) + 4) return 32;
    uint32_t a = get_u32(kv->b.p + kv_voff(kv));
    if (a == 0 || (a & (a - 1)) || a > 65536) return 32;
    return a;
}

// OUT is the header (g_hdr: every byte before the data section) followed by segments: each
// tensor's bytes in the input's private mapping (changes to them stay in this process), the bytes
// that pad a grown tensor, zeros up to the alignment, and any bytes appended; cut at g_cut.
typedef struct {
    const uint8_t *p; // NULL: a pattern of n bytes
    size_t n;
} Seg;
static Buf g_hdr, g_tail;
static Seg *g_seg;
static int g_nseg;
static size_t g_cut = SIZE_MAX;
static const uint8_t ZEROS[65536];

static void seg_add(const uint8_t *p, size_t n) {
    if (!n) return;
    g_seg = (Seg *)xrealloc(g_seg, (size_t)(g_nseg + 1) * sizeof *g_seg);
    g_seg[g_nseg].p = p;
    g_seg[g_nseg++].n = n;
}
static size_t out_size(void) {
    size_t n = g_hdr.n + g_tail.n;
    for (int i = 0; i < g_nseg; i++) n += g_seg[i].n;
    return n < g_cut ? n : g_cut;
}

static void serialize(int wrong_align) {
    uint32_t align = wrong_align ? 32 : out_alignment();
    if (wrong_align) say("written with alignment 32 whatever the key says");
    Buf *out = &g_hdr;
    buf_put(out, "GGUF", 4);
    buf_u32(out, g_version);
    buf_u64(out, (uint64_t)g_nt);
    buf_u64(out, (uint64_t)g_nkv);
    for (int i = 0; i < g_nkv; i++) buf_put(out, g_kv[i].b.p, g_kv[i].b.n);
    uint64_t off = 0;
    for (int i = 0; i < g_nt; i++) {
        Tensor *t = &g_t[i];
        buf_u64(out, t->name.n);
        buf_put(out, t->name.p, t->name.n);
        buf_u32(out, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims && d < 6; d++) buf_u64(out, (uint64_t)t->ne[d]);
        buf_u32(out, (uint32_t)t->type);
        t->off_field = out->n;
        buf_u64(out, off);
        uint64_t nb = tensor_bytes(t), padded = (nb + align - 1) / align * align;
        t->out_len = nb > MAX_OUT ? MAX_OUT : (size_t)nb;
        off = padded < nb || off + padded < off ? UINT64_MAX : off + padded;
    }
    buf_zero(out, (align - out->n % align) % align);
    g_header_len = out->n;
    size_t at = out->n;
    for (int i = 0; i < g_nt && at < MAX_OUT; i++) {
        Tensor *t = &g_t[i];
        size_t nb = t->out_len < MAX_OUT - at ? t->out_len : MAX_OUT - at;
        t->have = nb < t->len ? nb : t->len;
        seg_add(t->data, t->have);
        seg_add(NULL, nb - t->have);
        at += nb;
        seg_add(ZEROS, (align - at % align) % align);
        at += (align - at % align) % align;
    }
}

static int write_out(const char *path) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    static uint8_t pattern[65536];
    for (size_t k = 0; k < sizeof pattern; k++) pattern[k] = (uint8_t)(k * 0x9d);
    size_t left = g_cut;
    int ok = 1;
#define PUT(ptr, len)                                                                          \
    do {                                                                                       \
        size_t n_ = (len) < left ? (len) : left;                                               \
        if (n_ && fwrite((ptr), 1, n_, f) != n_) ok = 0;                                       \
        left -= n_;                                                                            \
    } while (0)
    PUT(g_hdr.p, g_hdr.n);
    for (int i = 0; i < g_nseg; i++) {
        if (g_seg[i].p) {
            PUT(g_seg[i].p, g_seg[i].n);
            continue;
        }
        for (size_t k = 0; k < g_seg[i].n; k += sizeof pattern) {
            size_t n = g_seg[i].n - k < sizeof pattern ? g_seg[i].n - k : sizeof pattern;
            PUT(pattern, n);
        }
    }
    PUT(g_tail.p, g_tail.n);
#undef PUT
    return fclose(f) == 0 && ok ? 0 : -1;
}

// ---- byte mutations of OUT ----
static int r_flip(void) { // bits in the header region
    size_t region = g_hdr.n;
    static const size_t R[] = {32, 256, 4096};
    if (!one_in(3) && R[below(3)] < region) region = R[below(3)];
    if (!region) return 0;
    int k = 1 + (int)below(8);
    size_t first = below(region);
    for (int i = 0; i < k; i++) {
        size_t at = i ? below(region) : first;
        g_hdr.p[at] ^= (uint8_t)(1u << below(8));
    }
    say("flip %d bits in the first %zu bytes (at %zu, ...)", k, region, first);
    return 1;
}

static int r_edge(void) { // an edge value at a random place in the header region
    static const int W[] = {1, 2, 4, 8};
    int w = W[below(4)];
    if (g_hdr.n < (size_t)w) return 0;
    size_t at = below(g_hdr.n - (size_t)w + 1);
    uint64_t v = edge_int(0, w);
    memcpy(g_hdr.p + at, &v, (size_t)w);
    say("edge %d-byte 0x%llx at %zu", w, (unsigned long long)v, at);
    return 1;
}

static int r_count(void) { // the version, n_tensors or n_kv
    if (g_hdr.n < 24) return 0;
    int f = (int)below(3);
    static const char *NAME[] = {"version", "n_tensors", "n_kv"};
    static const size_t AT[] = {4, 8, 16};
    int w = f ? 8 : 4;
    uint64_t old = 0, v;
    memcpy(&old, g_hdr.p + AT[f], (size_t)w);
    v = edge_int(old, w);
    memcpy(g_hdr.p + AT[f], &v, (size_t)w);
    say("%s %llu -> %llu", NAME[f], (unsigned long long)old, (unsigned long long)v);
    return 1;
}

static int r_offset(void) { // one tensor's offset moved
    if (!g_nt) return 0;
    Tensor *t = &g_t[below((uint64_t)g_nt)];
    if (t->off_field + 8 > g_hdr.n) return 0;
    static const int64_t D[] = {1, 4, 32, -32, 64, 4096, 1ll << 40, -1};
    uint64_t v = get_u64(g_hdr.p + t->off_field) + (uint64_t)D[below(8)];
    memcpy(g_hdr.p + t->off_field, &v, 8);
    say("offset %.*s -> %llu", (int)t->name.n, (const char *)t->name.p, (unsigned long long)v);
    return 1;
}

static int r_data(void) { // a span of one tensor's data
    if (!g_nt) return 0;
    Tensor *t = &g_t[below((uint64_t)g_nt)];
    size_t len = t->have;
    if (!len) return 0;
    size_t at = below(len), n = 1 + below(one_in(4) ? len - at : (len - at < 64 ? len - at : 64));
    static const char *HOW[] = {"ff", "nan32", "inf16", "random", "zero"};
    int h = (int)below(5);
    for (size_t k = 0; k < n; k++) {
        uint8_t *p = t->data + at + k;
        switch (h) {
        case 0: *p = 0xff; break;
        case 1: *p = (uint8_t)"\x00\x00\xc0\x7f"[(at + k) % 4]; break;
        case 2: *p = (uint8_t)"\x00\x7c"[(at + k) % 2]; break;
        case 3: *p = (uint8_t)rnd(); break;
        default: *p = 0; break;
        }
    }
    say("data %.*s %zu bytes at %zu (%s)", (int)t->name.n, (const char *)t->name.p, n, at, HOW[h]);
    return 1;
}

static int r_truncate(void) {
    size_t size = out_size();
    if (size < 2) return 0;
    size_t n = one_in(2) && g_header_len && g_header_len < size ? below(g_header_len + 1)
                                                                 : below(size);
    say("cut %zu -> %zu bytes", size, n);
    g_cut = n;
    return 1;
}

static int r_append(void) {
    size_t n = 1 + below(one_in(4) ? 65536 : 64);
    buf_reserve(&g_tail, n);
    for (size_t k = 0; k < n; k++) g_tail.p[g_tail.n++] = (uint8_t)rnd();
    say("append %zu random bytes", n);
    return 1;
}

typedef int (*Op)(void);

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s IN OUT SEED\n", argv[0]);
        return 2;
    }
    g_rng = strtoull(argv[3], NULL, 10) * 0x2545f4914f6cdd1dULL + 1;
    // the input, mapped privately: tensor data is written from the mapping, and changes to it
    // (r_data) are this process's own
    int fd = open(argv[1], O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) { perror(argv[1]); return 2; }
    size_t size = (size_t)st.st_size;
    uint8_t *in = size ? (uint8_t *)mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0)
                       : (uint8_t *)ZEROS;
    if (in == MAP_FAILED) { perror(argv[1]); return 2; }
    close(fd);

    // weights: how often each mutation is picked
    static const struct { Op op; int w; } S[] = {
        {m_kv_scalar, 6}, {m_kv_set, 6}, {m_kv_delete, 3}, {m_kv_dup, 1}, {m_kv_key, 2},
        {m_kv_retype, 1}, {m_arr_elem, 3}, {m_arr_len, 2}, {m_str, 5}, {m_t_type, 3},
        {m_t_dims, 4}, {m_t_list, 3}};
    static const struct { Op op; int w; } B[] = {
        {r_flip, 6}, {r_edge, 4}, {r_count, 1}, {r_offset, 1}, {r_data, 3}, {r_append, 1},
        {r_truncate, 3}};
    enum { NS = sizeof S / sizeof S[0], NB = sizeof B / sizeof B[0] };
    int ws = 0, wb = 0;
    for (int i = 0; i < NS; i++) ws += S[i].w;
    for (int i = 0; i < NB; i++) wb += B[i].w;

    int structured = parse(in, size) == 0;
    int k = 1 + (int)below(3), picks[3];
    for (int i = 0; i < k; i++) { // picks: structural ops 0..NS-1, byte ops NS..NS+NB-1
        int r = (int)below((uint64_t)(structured ? ws + wb : wb)), j = 0;
        if (structured && r < ws) {
            while (r >= S[j].w) r -= S[j++].w;
            picks[i] = j;
        } else {
            if (structured) r -= ws;
            while (r >= B[j].w) r -= B[j++].w;
            picks[i] = NS + j;
        }
    }
    for (int i = 0; i < k; i++)
        if (picks[i] < NS && !S[picks[i]].op()) say("(%d: nothing to change)", picks[i]);
    if (structured) serialize(one_in(40));
    else buf_put(&g_hdr, in, size); // not a file this tool can take apart: its bytes as they are
    // byte ops in the order drawn, except that cuts come last
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < k; i++) {
            if (picks[i] < NS) continue;
            int is_cut = B[picks[i] - NS].op == r_truncate;
            if (is_cut == pass) B[picks[i] - NS].op();
        }
    if (!g_desc[0]) say("rewritten unchanged");
    if (write_out(argv[2]) != 0) {
        perror(argv[2]);
        return 2;
    }
    printf("%s\n", g_desc);
    return 0;
}
