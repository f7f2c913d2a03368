// hf_to_gguf.cu — a Hugging Face checkpoint directory (as our training script saves it) to an F16
// GGUF laid out as llama.cpp's convert_hf_to_gguf.py lays it out: the same tensor names, shapes,
// types, transforms and metadata keys (docs: /work/shared/docs/qwen-spec.md, sections 1.1-1.2, 4).
//
//   test/train/hf_to_gguf [--name NAME] CKPT_DIR VOCAB.gguf N_VOCAB_TOKENS OUT.gguf
//
//   CKPT_DIR         config.json (transformers 5.x, flat: Qwen3ForCausalLM "qwen3" or
//                    Qwen3_5ForCausalLM "qwen3_5_text") and model.safetensors (one file)
//   VOCAB.gguf       a GGUF with a byte-level BPE vocabulary (e.g. test/data/tokenizer/
//                    vocab-qwen2.gguf); its first N_VOCAB_TOKENS tokens are kept, <|endoftext|> is
//                    appended as id N (CONTROL; bos, eos and padding id), and only the merges whose
//                    two parts and result are all kept tokens stay, in their order
//   N_VOCAB_TOKENS   N; config.json's vocab_size must be N + 1
//   OUT.gguf         written to a temporary file next to it, renamed into place when complete
//   --name NAME      general.name (default: the checkpoint directory's last path component)
//
// What the converter does, per architecture:
//   qwen3   names mapped, nothing transformed.
//   qwen35  (Qwen3.5: Gated DeltaNet + gated attention) every *norm.weight except
//           linear_attn.norm gets +1 (the model trains zero-centred RMSNorm, x*(1+w)); A_log is
//           stored as ssm_a = -exp(A_log); dt_bias becomes ssm_dt.bias; conv1d [C,1,K] is squeezed
//           to {K, C}; the value heads of the linear-attention tensors go from HF's order (grouped
//           by key head) to llama.cpp's (tiled): old index (g*r + j)*hd + d -> new index
//           (j*Hk + g)*hd + d for g < Hk key heads, j < r = Hv/Hk, d < hd, in the V rows of
//           in_proj_qkv, the rows of in_proj_z, in_proj_a, in_proj_b, A_log, dt_bias, the V
//           channels of conv1d and the columns of out_proj (linear_attn.norm is not reordered).
//           layer_types must follow one interval: layer i is full attention iff
//           (i+1) % interval == 0 (written as full_attention_interval).
// Types: 1-D tensors, *_norm.weight, ssm_conv1d and names not ending in ".weight" are F32, every
// other tensor F16 (F16 sources copied bit for bit; F32 and BF16 rounded to nearest even).
// Values that are not finite, or too large for F16, are errors: a checkpoint with them is broken.
// Every error is one line on stderr and exit status 1; no partial output file is left behind.
//
// Built by `make test/train/hf_to_gguf`; it includes qwen.cu for its GGUF reader (the vocabulary),
// die() and the ggml type ids, and test/gguf_write.h for the writer.

#define TESTING
#include "../../qwen.cu"
#include "../gguf_write.h"

// ------------------------------------------------------------------------------------------------
// JSON: a small parser into a tree. Every read is bounded by the end of the text, nesting is
// capped, and any malformed input is one error line naming the file, the line and the column.
// ------------------------------------------------------------------------------------------------

typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } JType;
static const char *J_TYPE_NAME[] = {"null", "a boolean", "a number", "a string", "an array",
                                    "an object"};

typedef struct JVal {
    JType t;
    int b;              // J_BOOL
    double num;         // J_NUM
    int integral;       // J_NUM written without a fraction or an exponent
    char *s;            // J_STR: decoded, NUL-terminated (a \u0000 escape is refused)
    struct JVal *items; // J_ARR, J_OBJ: n values
    char **keys;        // J_OBJ: n keys
    int n;
} JVal;

typedef struct {
    const char *start, *p, *end;
    const char *what; // the file, for error messages
    int depth;
} JParser;

#define JSON_MAX_DEPTH 64

static void jfail(const JParser *j, const char *msg) {
    int line = 1, col = 1;
    for (const char *q = j->start; q < j->p && q < j->end; q++) {
        if (*q == '\n') line++, col = 1;
        else col++;
    }
    die("%s: bad JSON at line %d, column %d: %s", j->what, line, col, msg);
}

static void jskip_ws(JParser *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

static int jhex4(JParser *j) {
    if (j->end - j->p < 4) jfail(j, "truncated \\u escape");
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char c = j->p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) jfail(j, "bad hex digit in a \\u escape");
        v = v * 16 + d;
    }
    j->p += 4;
    return v;
}

// A string, j->p at its opening quote. The decoded text is never longer than the source.
static char *jstring(JParser *j) {
    j->p++; // the quote
    const char *q = j->p;
    while (q < j->end && *q != '"') q += (*q == '\\' && q + 1 < j->end) ? 2 : 1;
    if (q >= j->end) jfail(j, "unterminated string");
    char *out = (char *)xmalloc((size_t)(q - j->p) + 1, "a JSON string");
    size_t n = 0;
    while (*j->p != '"') {
        unsigned char c = (unsigned char)*j->p;
        if (c < 0x20) jfail(j, "control character in a string");
        if (c != '\\') {
            out[n++] = (char)c;
            j->p++;
            continue;
        }
        j->p++;
        char e = *j->p++;
        switch (e) {
        case '"': out[n++] = '"'; break;
        case '\\': out[n++] = '\\'; break;
        case '/': out[n++] = '/'; break;
        case 'b': out[n++] = '\b'; break;
        case 'f': out[n++] = '\f'; break;
        case 'n': out[n++] = '\n'; break;
        case 'r': out[n++] = '\r'; break;
        case 't': out[n++] = '\t'; break;
        case 'u': {
            uint32_t cp = (uint32_t)jhex4(j);
            if (cp >= 0xDC00 && cp <= 0xDFFF) jfail(j, "lone low surrogate in a \\u escape");
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u')
                    jfail(j, "high surrogate without a low one in a \\u escape");
                j->p += 2;
                uint32_t lo = (uint32_t)jhex4(j);
                if (lo < 0xDC00 || lo > 0xDFFF)
                    jfail(j, "high surrogate without a low one in a \\u escape");
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            if (cp == 0) jfail(j, "\\u0000 in a string is not supported");
            // UTF-8 is never longer than the 6 (or 12) source bytes of the escape
            if (cp < 0x80) out[n++] = (char)cp;
            else if (cp < 0x800) {
                out[n++] = (char)(0xC0 | (cp >> 6));
                out[n++] = (char)(0x80 | (cp & 0x3F));
            } else if (cp < 0x10000) {
                out[n++] = (char)(0xE0 | (cp >> 12));
                out[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                out[n++] = (char)(0x80 | (cp & 0x3F));
            } else {
                out[n++] = (char)(0xF0 | (cp >> 18));
                out[n++] = (char)(0x80 | ((cp >> 12) & 0x3F));
                out[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                out[n++] = (char)(0x80 | (cp & 0x3F));
            }
            break;
        }
        default: j->p--; jfail(j, "unknown escape in a string");
        }
    }
    j->p++; // the closing quote
    out[n] = 0;
    return out;
}

static int jdigit(const JParser *j) { return j->p < j->end && *j->p >= '0' && *j->p <= '9'; }

// A number, by JSON's grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
static void jnumber(JParser *j, JVal *v) {
    const char *s = j->p;
    v->integral = 1;
    if (j->p < j->end && *j->p == '-') j->p++;
    if (!jdigit(j)) jfail(j, "bad number");
    if (*j->p == '0') j->p++;
    else while (jdigit(j)) j->p++;
    if (j->p < j->end && *j->p == '.') {
        j->p++, v->integral = 0;
        if (!jdigit(j)) jfail(j, "bad number: no digit after the point");
        while (jdigit(j)) j->p++;
    }
    if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
        j->p++, v->integral = 0;
        if (j->p < j->end && (*j->p == '+' || *j->p == '-')) j->p++;
        if (!jdigit(j)) jfail(j, "bad number: no digit in the exponent");
        while (jdigit(j)) j->p++;
    }
    char buf[80];
    if (j->p - s >= (ptrdiff_t)sizeof buf) jfail(j, "number too long");
    memcpy(buf, s, (size_t)(j->p - s));
    buf[j->p - s] = 0;
    v->num = strtod(buf, NULL);
    if (!isfinite(v->num)) jfail(j, "number out of range");
}

static int jlit(JParser *j, const char *lit) {
    size_t n = strlen(lit);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, lit, n) != 0) return 0;
    j->p += n;
    return 1;
}

static void jvalue(JParser *j, JVal *v);

// The items of an array or the members of an object, j->p at the opening bracket.
static void jcontainer(JParser *j, JVal *v, int is_obj) {
    if (++j->depth > JSON_MAX_DEPTH) jfail(j, "nested more than 64 deep");
    v->t = is_obj ? J_OBJ : J_ARR;
    char close = is_obj ? '}' : ']';
    int cap = 0;
    j->p++;
    jskip_ws(j);
    if (j->p < j->end && *j->p == close) {
        j->p++;
        j->depth--;
        return;
    }
    for (;;) {
        if (v->n == cap) {
            cap = cap ? 2 * cap : 8;
            v->items = (JVal *)xrealloc(v->items, (size_t)cap * sizeof(JVal), "a JSON array");
            if (is_obj) v->keys = (char **)xrealloc(v->keys, (size_t)cap * sizeof(char *),
                                                    "a JSON object");
        }
        jskip_ws(j);
        if (is_obj) {
            if (j->p >= j->end || *j->p != '"') jfail(j, "expected a string key");
            v->keys[v->n] = jstring(j);
            jskip_ws(j);
            if (j->p >= j->end || *j->p != ':') jfail(j, "expected ':' after a key");
            j->p++;
        }
        memset(&v->items[v->n], 0, sizeof(JVal));
        jvalue(j, &v->items[v->n]);
        v->n++;
        jskip_ws(j);
        if (j->p < j->end && *j->p == ',') {
            j->p++;
            continue;
        }
        if (j->p < j->end && *j->p == close) {
            j->p++;
            break;
        }
        jfail(j, is_obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
    if (is_obj) { // sorted, so that a huge object cannot stall the check
        char dup[128], msg[160];
        const char **names = (const char **)xmalloc((size_t)v->n * sizeof *names, "a JSON object");
        for (int i = 0; i < v->n; i++) names[i] = v->keys[i];
        if (find_duplicate(names, v->n, dup, sizeof dup)) {
            j->p--;
            snprintf(msg, sizeof msg, "duplicate key \"%.100s\" in the object ending here", dup);
            jfail(j, msg);
        }
    }
    j->depth--;
}

static void jvalue(JParser *j, JVal *v) {
    jskip_ws(j);
    if (j->p >= j->end) jfail(j, "unexpected end of input");
    char c = *j->p;
    if (c == '{' || c == '[') jcontainer(j, v, c == '{');
    else if (c == '"') v->t = J_STR, v->s = jstring(j);
    else if (c == '-' || (c >= '0' && c <= '9')) v->t = J_NUM, jnumber(j, v);
    else if (jlit(j, "true")) v->t = J_BOOL, v->b = 1;
    else if (jlit(j, "false")) v->t = J_BOOL, v->b = 0;
    else if (jlit(j, "null")) v->t = J_NULL;
    else jfail(j, "unexpected character");
}

// Parse text[0..n) as one JSON value; `what` names the source in errors.
static JVal *json_parse(const char *text, size_t n, const char *what) {
    JParser j = {text, text, text + n, what, 0};
    JVal *v = (JVal *)xcalloc(1, sizeof(JVal), "a JSON value");
    jvalue(&j, v);
    jskip_ws(&j);
    if (j.p != j.end) jfail(&j, "text after the end of the value");
    return v;
}

// --- typed access; every error names the file and the key ---

static const JVal *jget(const JVal *obj, const char *key) {
    if (!obj || obj->t != J_OBJ) return NULL;
    for (int i = 0; i < obj->n; i++)
        if (strcmp(obj->keys[i], key) == 0) return &obj->items[i];
    return NULL;
}

static const char *g_cfg_name = "config.json";

static const JVal *cfg_need(const JVal *obj, const char *key, JType t) {
    const JVal *v = jget(obj, key);
    if (!v) die("%s: required key \"%s\" is missing", g_cfg_name, key);
    if (v->t != t)
        die("%s: \"%s\" must be %s, found %s", g_cfg_name, key, J_TYPE_NAME[t], J_TYPE_NAME[v->t]);
    return v;
}

// An integer in [lo, hi] (an integral value written as 8.0 is accepted).
static int64_t jint_of(const JVal *v, const char *key, int64_t lo, int64_t hi) {
    if (v->t != J_NUM || v->num != floor(v->num))
        die("%s: \"%s\" must be an integer, found %s", g_cfg_name, key,
            v->t == J_NUM ? "a fraction" : J_TYPE_NAME[v->t]);
    if (v->num < (double)lo || v->num > (double)hi)
        die("%s: \"%s\" = %.17g: must be in [%lld, %lld]", g_cfg_name, key, v->num,
            (long long)lo, (long long)hi);
    return (int64_t)v->num;
}
static int64_t cfg_int(const JVal *obj, const char *key, int64_t lo, int64_t hi) {
    return jint_of(cfg_need(obj, key, J_NUM), key, lo, hi);
}

// ------------------------------------------------------------------------------------------------
// Files: read whole (config.json), map (model.safetensors)
// ------------------------------------------------------------------------------------------------

static char *read_small_file(const char *path, size_t max, size_t *len) {
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) die("cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) die("'%s' is not a regular file", path);
    if ((uint64_t)st.st_size > max)
        die("'%s' is %lld bytes, more than the %zu this tool reads", path, (long long)st.st_size,
            max);
    char *buf = (char *)xmalloc((size_t)st.st_size + 1, path);
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) die("cannot read '%s': %s", path, r < 0 ? strerror(errno) : "file shrank");
        got += (size_t)r;
    }
    close(fd);
    buf[got] = 0;
    *len = got;
    return buf;
}

static const uint8_t *map_file(const char *path, size_t *size, struct stat *st) {
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) die("cannot open '%s': %s", path, strerror(errno));
    if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) die("'%s' is not a regular file", path);
    if (st->st_size == 0) die("'%s' is empty", path);
    void *p = mmap(NULL, (size_t)st->st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) die("cannot map '%s': %s", path, strerror(errno));
    close(fd);
    *size = (size_t)st->st_size;
    return (const uint8_t *)p;
}

// ------------------------------------------------------------------------------------------------
// safetensors: u64 header length | JSON header | data. The header maps each tensor's name to
// {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the data); "__metadata__" is
// skipped. Every tensor's bytes are checked to lie inside the file and to match its shape.
// ------------------------------------------------------------------------------------------------

enum { ST_F16, ST_BF16, ST_F32 };
static const char *ST_DTYPE_NAME[] = {"F16", "BF16", "F32"};

typedef struct {
    const char *name;
    int dtype;
    int ndim;
    int64_t shape[4];
    int64_t numel;
    const uint8_t *data;
    int used; // claimed by the conversion plan
} STensor;

static STensor *g_st;
static int g_n_st;
static const char *g_st_path;

static int st_cmp(const void *a, const void *b) {
    return strcmp(((const STensor *)a)->name, ((const STensor *)b)->name);
}

#define ST_MAX_HEADER (100u << 20) // the limit of the safetensors library

static void safetensors_load(const char *path) {
    g_st_path = path;
    size_t size;
    struct stat st;
    const uint8_t *base = map_file(path, &size, &st);
    if (size < 8) die("%s: %zu bytes, too short for a safetensors file", path, size);
    uint64_t hlen;
    memcpy(&hlen, base, 8);
    if (hlen > ST_MAX_HEADER)
        die("%s: header length %llu is over the 100 MiB limit: not a safetensors file?", path,
            (unsigned long long)hlen);
    if (hlen > size - 8)
        die("%s: the header needs %llu bytes, the file has %zu after the length: truncated?",
            path, (unsigned long long)hlen, size - 8);
    char what[600];
    snprintf(what, sizeof what, "%s (header)", path);
    JVal *h = json_parse((const char *)base + 8, (size_t)hlen, strdup(what));
    if (h->t != J_OBJ) die("%s: the header is %s, expected an object", path, J_TYPE_NAME[h->t]);
    const uint8_t *data = base + 8 + hlen;
    uint64_t data_len = size - 8 - hlen;
    g_st = (STensor *)xcalloc((size_t)h->n, sizeof(STensor), "the safetensors table");
    for (int i = 0; i < h->n; i++) {
        const char *name = h->keys[i];
        const JVal *e = &h->items[i];
        if (strcmp(name, "__metadata__") == 0) {
            if (e->t != J_OBJ) die("%s: __metadata__ is not an object", path);
            continue;
        }
        if (e->t != J_OBJ) die("%s: tensor '%s': its entry is not an object", path, name);
        const JVal *dt = jget(e, "dtype"), *sh = jget(e, "shape"), *off = jget(e, "data_offsets");
        if (!dt || dt->t != J_STR || !sh || sh->t != J_ARR || !off || off->t != J_ARR ||
            off->n != 2)
            die("%s: tensor '%s': needs \"dtype\" (a string), \"shape\" (an array) and "
                "\"data_offsets\" (two numbers)", path, name);
        STensor *t = &g_st[g_n_st];
        t->name = name;
        if (!strcmp(dt->s, "F16")) t->dtype = ST_F16;
        else if (!strcmp(dt->s, "BF16")) t->dtype = ST_BF16;
        else if (!strcmp(dt->s, "F32")) t->dtype = ST_F32;
        else die("%s: tensor '%s' has dtype %.20s; supported: F16, BF16, F32", path, name, dt->s);
        if (sh->n < 1 || sh->n > 4)
            die("%s: tensor '%s' has %d dimensions; 1 to 4 are supported", path, name, sh->n);
        t->ndim = sh->n;
        t->numel = 1;
        for (int d = 0; d < sh->n; d++) {
            const JVal *x = &sh->items[d];
            if (x->t != J_NUM || x->num != floor(x->num) || x->num < 1 || x->num > INT32_MAX)
                die("%s: tensor '%s': shape entry %d is not an integer in [1, 2^31)", path, name,
                    d);
            t->shape[d] = (int64_t)x->num;
            if (t->numel > ((int64_t)1 << 40) / t->shape[d])
                die("%s: tensor '%s': more than 2^40 elements", path, name);
            t->numel *= t->shape[d];
        }
        double b = off->items[0].num, en = off->items[1].num;
        if (off->items[0].t != J_NUM || off->items[1].t != J_NUM || b != floor(b) ||
            en != floor(en) || b < 0 || en < b || en > (double)data_len)
            die("%s: tensor '%s': data_offsets [%.17g, %.17g] are not inside the %llu data "
                "bytes: truncated file?", path, name, b, en, (unsigned long long)data_len);
        uint64_t esz = t->dtype == ST_F32 ? 4 : 2;
        if ((uint64_t)(en - b) != (uint64_t)t->numel * esz)
            die("%s: tensor '%s': %.17g data bytes for %lld %s elements (%llu bytes)", path, name,
                en - b, (long long)t->numel, ST_DTYPE_NAME[t->dtype],
                (unsigned long long)((uint64_t)t->numel * esz));
        t->data = data + (uint64_t)b;
        g_n_st++;
    }
    qsort(g_st, (size_t)g_n_st, sizeof *g_st, st_cmp);
}

static STensor *st_find(const char *name) { // g_st is sorted by name
    STensor key;
    key.name = name;
    return (STensor *)bsearch(&key, g_st, (size_t)g_n_st, sizeof key, st_cmp);
}

// ------------------------------------------------------------------------------------------------
// The model's shape, from config.json
// ------------------------------------------------------------------------------------------------

typedef struct {
    int q35;          // 0: qwen3, 1: qwen35
    int64_t V, E, F, L, H, Hkv, hd, ctx;
    double eps, theta;
    int tied;
    // qwen35
    int64_t n_rot, conv_k, dk, dv, Hk, Hv, interval;
    int32_t sections[4];
    int full[4096];   // layer i is full attention
} Cfg;

#define MAX_DIM ((int64_t)1 << 24)

// A float key that may sit at the top level and/or inside rope_parameters: both present must agree.
static int cfg_float_either(const JVal *cfg, const JVal *rope, const char *key, double *out) {
    const JVal *a = jget(cfg, key), *b = rope ? jget(rope, key) : NULL;
    if (a && a->t != J_NUM) die("%s: \"%s\" must be a number", g_cfg_name, key);
    if (b && b->t != J_NUM) die("%s: rope_parameters.\"%s\" must be a number", g_cfg_name, key);
    if (a && b && a->num != b->num)
        die("%s: \"%s\" = %.17g at the top level but %.17g in rope_parameters", g_cfg_name, key,
            a->num, b->num);
    if (!a && !b) return 0;
    *out = a ? a->num : b->num;
    return 1;
}

static void config_load(Cfg *c, const char *path) {
    g_cfg_name = path;
    size_t len;
    char *text = read_small_file(path, 16u << 20, &len);
    const JVal *cfg = json_parse(text, len, path);
    if (cfg->t != J_OBJ) die("%s: expected a JSON object", path);
    memset(c, 0, sizeof *c);
    const char *mt = cfg_need(cfg, "model_type", J_STR)->s;
    if (!strcmp(mt, "qwen3")) c->q35 = 0;
    else if (!strcmp(mt, "qwen3_5_text")) c->q35 = 1;
    else die("%s: model_type \"%.60s\" is not supported (qwen3 or qwen3_5_text; a nested "
             "text_config is not read)", path, mt);

    c->V = cfg_int(cfg, "vocab_size", 1, MAX_DIM);
    c->E = cfg_int(cfg, "hidden_size", 1, MAX_DIM);
    c->F = cfg_int(cfg, "intermediate_size", 1, MAX_DIM);
    c->L = cfg_int(cfg, "num_hidden_layers", 1, 4096);
    c->H = cfg_int(cfg, "num_attention_heads", 1, 65536);
    c->Hkv = cfg_int(cfg, "num_key_value_heads", 1, 65536);
    c->hd = cfg_int(cfg, "head_dim", 1, 65536);
    c->ctx = cfg_int(cfg, "max_position_embeddings", 1, UINT32_MAX);
    c->eps = cfg_need(cfg, "rms_norm_eps", J_NUM)->num;
    if (!(c->eps > 0 && c->eps < 1)) die("%s: rms_norm_eps = %g: must be in (0, 1)", path, c->eps);
    c->tied = cfg_need(cfg, "tie_word_embeddings", J_BOOL)->b;
    if (c->H * c->hd > MAX_DIM || c->Hkv * c->hd > MAX_DIM)
        die("%s: %lld heads of %lld: too large", path, (long long)c->H, (long long)c->hd);
    const JVal *act = jget(cfg, "hidden_act");
    if (act && (act->t != J_STR || strcmp(act->s, "silu") != 0))
        die("%s: hidden_act must be \"silu\"", path);
    const JVal *bias = jget(cfg, "attention_bias");
    if (bias && bias->t == J_BOOL && bias->b)
        die("%s: attention_bias is true: q/k/v biases are not supported", path);
    const JVal *sw = jget(cfg, "use_sliding_window");
    if (sw && sw->t == J_BOOL && sw->b) die("%s: use_sliding_window is true: not supported", path);
    const JVal *rs = jget(cfg, "rope_scaling");
    if (rs && rs->t != J_NULL) die("%s: rope_scaling is set: RoPE scaling is not supported", path);

    // RoPE: rope_parameters (transformers 5) and/or a top-level rope_theta (older configs)
    const JVal *rope = jget(cfg, "rope_parameters");
    if (rope && rope->t == J_NULL) rope = NULL;
    if (rope && rope->t != J_OBJ) die("%s: rope_parameters must be an object", path);
    if (rope) {
        const JVal *rt = jget(rope, "rope_type");
        if (rt && (rt->t != J_STR || strcmp(rt->s, "default") != 0))
            die("%s: rope_parameters.rope_type must be \"default\" (RoPE scaling is not "
                "supported)", path);
    }
    if (!cfg_float_either(cfg, rope, "rope_theta", &c->theta))
        die("%s: rope_theta is missing (neither in rope_parameters nor at the top level)", path);
    if (!(c->theta > 0 && c->theta < 3.4e38)) die("%s: rope_theta = %g is out of range", path,
                                                 c->theta);

    if (c->q35) {
        c->conv_k = cfg_int(cfg, "linear_conv_kernel_dim", 1, 64);
        c->dk = cfg_int(cfg, "linear_key_head_dim", 1, 65536);
        c->dv = cfg_int(cfg, "linear_value_head_dim", 1, 65536);
        c->Hk = cfg_int(cfg, "linear_num_key_heads", 1, 65536);
        c->Hv = cfg_int(cfg, "linear_num_value_heads", 1, 65536);
        if (c->dk != c->dv)
            die("%s: linear_key_head_dim %lld != linear_value_head_dim %lld: not supported", path,
                (long long)c->dk, (long long)c->dv);
        if (c->Hv % c->Hk)
            die("%s: linear_num_value_heads %lld is not a multiple of linear_num_key_heads %lld",
                path, (long long)c->Hv, (long long)c->Hk);
        if ((2 * c->Hk * c->dk + c->Hv * c->dv) > MAX_DIM)
            die("%s: linear attention dims too large", path);
        double prf;
        if (!cfg_float_either(cfg, rope, "partial_rotary_factor", &prf))
            die("%s: partial_rotary_factor is missing", path);
        double rot = (double)c->hd * prf;
        if (!(prf > 0 && prf <= 1) || rot != floor(rot) || (int64_t)rot % 2)
            die("%s: head_dim %lld x partial_rotary_factor %g = %g is not an even whole number "
                "of dims", path, (long long)c->hd, prf, rot);
        c->n_rot = (int64_t)rot;
        // multi-token-prediction blocks: Qwen3_5ForCausalLM keeps no mtp.* weights (an mtp.*
        // tensor is an error below), so the key of a released config is noted and left out
        const JVal *mtp = jget(cfg, "mtp_num_hidden_layers");
        if (mtp && mtp->t == J_NUM && mtp->num != 0)
            fprintf(stderr, "note: mtp_num_hidden_layers = %g ignored: the checkpoint's model "
                            "has no MTP blocks\n", mtp->num);
        const JVal *gate = jget(cfg, "attn_output_gate");
        if (gate && gate->t == J_BOOL && !gate->b)
            die("%s: attn_output_gate is false: Qwen3.5 attention has the output gate", path);
        // MRoPE sections: rope_parameters.mrope_section, padded to 4; else llama.cpp's default
        int32_t def[4] = {11, 11, 10, 0};
        memcpy(c->sections, def, sizeof def);
        const JVal *ms = rope ? jget(rope, "mrope_section") : NULL;
        if (ms && ms->t != J_NULL) {
            if (ms->t != J_ARR || ms->n > 4)
                die("%s: rope_parameters.mrope_section must be an array of at most 4", path);
            for (int i = 0; i < 4; i++)
                c->sections[i] = i < ms->n ? (int32_t)jint_of(&ms->items[i], "mrope_section", 0,
                                                              INT32_MAX) : 0;
        }
        // layer kinds: layer_types must follow "(i+1) % interval == 0 -> full attention"
        const JVal *lt = cfg_need(cfg, "layer_types", J_ARR);
        if (lt->n != c->L)
            die("%s: layer_types has %d entries, num_hidden_layers is %lld", path, lt->n,
                (long long)c->L);
        int first_full = -1;
        for (int i = 0; i < lt->n; i++) {
            const JVal *x = &lt->items[i];
            if (x->t != J_STR || (strcmp(x->s, "full_attention") && strcmp(x->s,
                                                                            "linear_attention")))
                die("%s: layer_types[%d] must be \"full_attention\" or \"linear_attention\"",
                    path, i);
            c->full[i] = !strcmp(x->s, "full_attention");
            if (c->full[i] && first_full < 0) first_full = i;
        }
        const JVal *fi = jget(cfg, "full_attention_interval");
        if (fi) c->interval = jint_of(fi, "full_attention_interval", 1, 1 << 20);
        else c->interval = first_full >= 0 ? first_full + 1 : c->L + 1; // none: past the last
        for (int i = 0; i < c->L; i++)
            if (c->full[i] != ((i + 1) % c->interval == 0))
                die("%s: layer_types do not follow one full-attention interval (layer %d is %s; "
                    "interval %lld): an irregular layout is not supported", path, i,
                    c->full[i] ? "full_attention" : "linear_attention", (long long)c->interval);
    } else {
        const JVal *lt = jget(cfg, "layer_types");
        if (lt && lt->t == J_ARR)
            for (int i = 0; i < lt->n; i++)
                if (lt->items[i].t != J_STR || strcmp(lt->items[i].s, "full_attention"))
                    die("%s: layer_types[%d] is not \"full_attention\": not supported for qwen3",
                        path, i);
    }
}

// ------------------------------------------------------------------------------------------------
// The conversion plan: one entry per GGUF tensor
// ------------------------------------------------------------------------------------------------
// Each source is seen as a matrix of rows x cols (torch shape [rows, ...]: a 2-D weight [out, in],
// a vector [n] as n rows of 1, the conv1d [C, 1, K] as C rows of K); the GGUF tensor holds the
// same matrix, ne = {cols, rows}, with its rows or columns permuted by the V-head reorder.

typedef struct {
    char hf[160];          // HF name without the "model." prefix (or "lm_head.weight")
    char name[GGUF_MAX_NAME];
    int ndim;              // torch shape expected
    int64_t shape[3];
    int gguf_ndim;         // 1 or 2
    int64_t rows, cols;
    int type;              // GGML_TYPE_F16 / GGML_TYPE_F32
    int add1, negexp;      // +1 (zero-centred norms); -exp (A_log -> ssm_a)
    int ro_axis;           // V-head reorder: -1 none, 0 rows, 1 columns
    int64_t ro_start, ro_hd;
    const STensor *src;
    uint64_t offset;
    size_t nbytes;
} Item;

static Item *g_items;
static int g_n_items, g_cap_items;
static const Cfg *g_cfg;

// The GGUF type of a tensor, by llama.cpp's converter's rule for an F16 file.
static int out_type(const char *name, int gguf_ndim) {
    size_t n = strlen(name);
    int ends_weight = n >= 7 && !strcmp(name + n - 7, ".weight");
    int ends_norm = n >= 12 && !strcmp(name + n - 12, "_norm.weight");
    if (gguf_ndim == 1 || ends_norm || strstr(name, "ssm_conv1d") || !ends_weight)
        return GGML_TYPE_F32;
    return GGML_TYPE_F16;
}

static Item *plan(const char *hf, const char *name, int ndim, int64_t s0, int64_t s1, int64_t s2) {
    if (g_n_items == g_cap_items) {
        g_cap_items = g_cap_items ? 2 * g_cap_items : 256;
        g_items = (Item *)xrealloc(g_items, (size_t)g_cap_items * sizeof(Item), "the plan");
    }
    Item *it = &g_items[g_n_items++];
    memset(it, 0, sizeof *it);
    snprintf(it->hf, sizeof it->hf, "%s", hf);
    snprintf(it->name, sizeof it->name, "%s", name);
    it->ndim = ndim;
    it->shape[0] = s0, it->shape[1] = s1, it->shape[2] = s2;
    it->rows = s0;
    it->cols = ndim == 1 ? 1 : ndim == 2 ? s1 : s1 * s2;
    it->gguf_ndim = ndim == 1 ? 1 : 2; // conv1d [C, 1, K] squeezed to {K, C}
    it->type = out_type(name, it->gguf_ndim);
    it->ro_axis = -1;
    return it;
}

static void make_plan(const Cfg *c) {
    char hf[160], name[GGUF_MAX_NAME];
    int64_t E = c->E, F = c->F, V = c->V, hd = c->hd;
    int64_t key_dim = c->Hk * c->dk, value_dim = c->Hv * c->dv, conv_dim = 2 * key_dim + value_dim;
    plan("embed_tokens.weight", "token_embd.weight", 2, V, E, 0);
    for (int l = 0; l < c->L; l++) {
#define P(hfs, gs, nd, a, b, cc)                                                                   \
    (snprintf(hf, sizeof hf, "layers.%d." hfs, l), snprintf(name, sizeof name, "blk.%d." gs, l),   \
     plan(hf, name, nd, a, b, cc))
        P("input_layernorm.weight", "attn_norm.weight", 1, E, 0, 0)->add1 = c->q35;
        if (c->q35 && !c->full[l]) {
            Item *it = P("linear_attn.in_proj_qkv.weight", "attn_qkv.weight", 2, conv_dim, E, 0);
            it->ro_axis = 0, it->ro_start = 2 * key_dim, it->ro_hd = c->dv;
            it = P("linear_attn.in_proj_z.weight", "attn_gate.weight", 2, value_dim, E, 0);
            it->ro_axis = 0, it->ro_hd = c->dv;
            it = P("linear_attn.conv1d.weight", "ssm_conv1d.weight", 3, conv_dim, 1, c->conv_k);
            it->ro_axis = 0, it->ro_start = 2 * key_dim, it->ro_hd = c->dv;
            it = P("linear_attn.dt_bias", "ssm_dt.bias", 1, c->Hv, 0, 0);
            it->ro_axis = 0, it->ro_hd = 1;
            it = P("linear_attn.A_log", "ssm_a", 1, c->Hv, 0, 0);
            it->ro_axis = 0, it->ro_hd = 1, it->negexp = 1;
            it = P("linear_attn.in_proj_b.weight", "ssm_beta.weight", 2, c->Hv, E, 0);
            it->ro_axis = 0, it->ro_hd = 1;
            it = P("linear_attn.in_proj_a.weight", "ssm_alpha.weight", 2, c->Hv, E, 0);
            it->ro_axis = 0, it->ro_hd = 1;
            P("linear_attn.norm.weight", "ssm_norm.weight", 1, c->dv, 0, 0); // raw: no +1
            it = P("linear_attn.out_proj.weight", "ssm_out.weight", 2, E, value_dim, 0);
            it->ro_axis = 1, it->ro_hd = c->dv;
        } else {
            // qwen35: per head [q | gate], copied as is
            P("self_attn.q_proj.weight", "attn_q.weight", 2, c->H * hd * (c->q35 ? 2 : 1), E, 0);
            P("self_attn.k_proj.weight", "attn_k.weight", 2, c->Hkv * hd, E, 0);
            P("self_attn.v_proj.weight", "attn_v.weight", 2, c->Hkv * hd, E, 0);
            P("self_attn.o_proj.weight", "attn_output.weight", 2, E, c->H * hd, 0);
            P("self_attn.q_norm.weight", "attn_q_norm.weight", 1, hd, 0, 0)->add1 = c->q35;
            P("self_attn.k_norm.weight", "attn_k_norm.weight", 1, hd, 0, 0)->add1 = c->q35;
        }
        if (c->q35) P("post_attention_layernorm.weight", "post_attention_norm.weight", 1, E, 0,
                      0)->add1 = 1;
        else P("post_attention_layernorm.weight", "ffn_norm.weight", 1, E, 0, 0);
        P("mlp.gate_proj.weight", "ffn_gate.weight", 2, F, E, 0);
        P("mlp.up_proj.weight", "ffn_up.weight", 2, F, E, 0);
        P("mlp.down_proj.weight", "ffn_down.weight", 2, E, F, 0);
#undef P
    }
    plan("norm.weight", "output_norm.weight", 1, E, 0, 0)->add1 = c->q35;
    plan("lm_head.weight", "output.weight", 2, V, E, 0); // dropped below when tied
}

// Find each planned tensor in the checkpoint (under "model." or "model.language_model."; lm_head at
// the top level) and check its shape; every checkpoint tensor must be used exactly once.
static void bind_plan(const Cfg *c) {
    int n = 0;
    for (int i = 0; i < g_n_items; i++) {
        Item *it = &g_items[i];
        char a[200], b[200];
        STensor *s = NULL;
        if (!strcmp(it->hf, "lm_head.weight")) {
            s = st_find("lm_head.weight");
            if (c->tied) {
                if (s) {
                    fprintf(stderr, "note: tie_word_embeddings is true: lm_head.weight is not "
                                    "written (the output uses token_embd.weight)\n");
                    s->used = 1;
                }
                continue; // dropped
            }
            if (!s)
                die("%s: lm_head.weight is missing, and config.json says tie_word_embeddings is "
                    "false", g_st_path);
        } else {
            snprintf(a, sizeof a, "model.%s", it->hf);
            snprintf(b, sizeof b, "model.language_model.%s", it->hf);
            STensor *sa = st_find(a), *sb = st_find(b);
            if (sa && sb) die("%s: both '%s' and '%s' are present", g_st_path, a, b);
            s = sa ? sa : sb;
            if (!s) die("%s: tensor '%s' is missing", g_st_path, a);
        }
        int ok = s->ndim == it->ndim;
        for (int d = 0; ok && d < it->ndim; d++) ok = s->shape[d] == it->shape[d];
        if (!ok) {
            char got[96] = "", want[96] = "";
            for (int d = 0; d < s->ndim; d++)
                snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? ", " : "",
                         (long long)s->shape[d]);
            for (int d = 0; d < it->ndim; d++)
                snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", d ? ", " : "",
                         (long long)it->shape[d]);
            die("%s: tensor '%s' has shape [%s]; config.json implies [%s]", g_st_path, s->name,
                got, want);
        }
        if (s->used) die("%s: tensor '%s' is used twice", g_st_path, s->name);
        s->used = 1;
        it->src = s;
        it->nbytes = (size_t)(it->rows * it->cols) * (it->type == GGML_TYPE_F32 ? 4 : 2);
        g_items[n++] = *it;
    }
    g_n_items = n;
    for (int i = 0; i < g_n_st; i++)
        if (!g_st[i].used)
            die("%s: tensor '%s' is not part of a %s model as config.json describes it", g_st_path,
                g_st[i].name, c->q35 ? "qwen35" : "qwen3");
}

// ------------------------------------------------------------------------------------------------
// Tensor data
// ------------------------------------------------------------------------------------------------

// The source index of output index i along an axis of the V-head reorder: grouped by key head in
// the source ((g*r + j)*hd + d), tiled in the output ((j*Hk + g)*hd + d).
static int64_t reorder_src(const Item *it, int64_t i) {
    if (i < it->ro_start) return i;
    int64_t k = i - it->ro_start, hd = it->ro_hd, Hk = g_cfg->Hk, r = g_cfg->Hv / g_cfg->Hk;
    int64_t head = k / hd, d = k % hd, j = head / Hk, g = head % Hk;
    return it->ro_start + (g * r + j) * hd + d;
}

static float src_value(const STensor *s, int64_t idx, uint16_t *bits16) {
    const uint8_t *p = s->data + idx * (s->dtype == ST_F32 ? 4 : 2);
    if (s->dtype == ST_F32) {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p, 2);
    *bits16 = h;
    return s->dtype == ST_F16 ? fp16_to_f32(h) : bf16_to_f32(h);
}

// One tensor's GGUF bytes into out (it->nbytes).
static void convert_tensor(const Item *it, uint8_t *out) {
    const STensor *s = it->src;
    for (int64_t r = 0; r < it->rows; r++) {
        int64_t sr = it->ro_axis == 0 ? reorder_src(it, r) : r;
        for (int64_t c = 0; c < it->cols; c++) {
            int64_t sc = it->ro_axis == 1 ? reorder_src(it, c) : c;
            int64_t si = sr * it->cols + sc, oi = r * it->cols + c;
            uint16_t bits = 0;
            float v = src_value(s, si, &bits);
            if (!isfinite(v))
                die("%s: tensor '%s' holds a non-finite value (%g) at element %lld", g_st_path,
                    s->name, v, (long long)si);
            if (it->add1) v = 1.0f + v;
            if (it->negexp) v = -expf(v);
            if (it->type == GGML_TYPE_F32) {
                if (!isfinite(v))
                    die("%s: tensor '%s': element %lld gives %g in %s", g_st_path, s->name,
                        (long long)si, v, it->name);
                memcpy(out + 4 * oi, &v, 4);
            } else {
                uint16_t h = bits; // an F16 source: its bits as they are (no transform makes F16)
                if (s->dtype != ST_F16) {
                    __half_raw hr = __float2half_rn(v);
                    h = hr.x;
                    if ((h & 0x7C00) == 0x7C00)
                        die("%s: tensor '%s': element %lld = %g does not fit in F16 (max 65504)",
                            g_st_path, s->name, (long long)si, v);
                }
                memcpy(out + 2 * oi, &h, 2);
            }
        }
    }
}

// ------------------------------------------------------------------------------------------------
// The tokenizer: the first N tokens of the vocabulary, <|endoftext|> appended as N
// ------------------------------------------------------------------------------------------------

// A set of byte strings (the kept tokens), open addressing.
typedef struct {
    const char **s;
    uint32_t *len;
    uint64_t cap;
} StrSet;

static uint64_t str_hash(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}
static void set_init(StrSet *t, uint64_t n) {
    t->cap = 16;
    while (t->cap < 2 * n) t->cap *= 2;
    t->s = (const char **)xcalloc(t->cap, sizeof(char *), "the token set");
    t->len = (uint32_t *)xcalloc(t->cap, sizeof(uint32_t), "the token set");
}
// Returns 1 when s is in the set; inserts it when add.
static int set_has(StrSet *t, const char *s, size_t n, int add) {
    uint64_t i = str_hash(s, n) & (t->cap - 1);
    while (t->s[i]) {
        if (t->len[i] == n && memcmp(t->s[i], s, n) == 0) return 1;
        i = (i + 1) & (t->cap - 1);
    }
    if (add) t->s[i] = s, t->len[i] = (uint32_t)n;
    return 0;
}

static void put_kv_arr_header(Buf *b, const char *key, int elem_type, uint64_t n) {
    put_str(b, key);
    put_i32(b, GGUF_TYPE_ARRAY);
    put_i32(b, elem_type);
    put_u64(b, n);
}

static const char *EOT_TEXT = "<|endoftext|>";

// Writes the tokenizer keys into kv; returns how many.
static int tokenizer_kvs(Buf *kv, const char *vocab_path, int64_t n_keep) {
    GGUF vg;
    if (gguf_open(&vg, vocab_path) != 0) die("%s", vg.err);
    const GGUFKV *toks = gguf_find(&vg, "tokenizer.ggml.tokens");
    const GGUFKV *types = gguf_find(&vg, "tokenizer.ggml.token_type");
    const GGUFKV *merges = gguf_find(&vg, "tokenizer.ggml.merges");
    if (!toks || toks->type != GGUF_TYPE_ARRAY || toks->arr_type != GGUF_TYPE_STRING)
        die("%s: no tokenizer.ggml.tokens string array", vocab_path);
    if (!types || types->type != GGUF_TYPE_ARRAY || types->arr_type != GGUF_TYPE_I32 ||
        types->n != toks->n)
        die("%s: no tokenizer.ggml.token_type i32 array of %llu entries", vocab_path,
            (unsigned long long)toks->n);
    if (merges && (merges->type != GGUF_TYPE_ARRAY || merges->arr_type != GGUF_TYPE_STRING))
        die("%s: tokenizer.ggml.merges is not a string array", vocab_path);
    char model[64], pre[64];
    if (!gguf_str(&vg, "tokenizer.ggml.model", model, sizeof model) || strcmp(model, "gpt2"))
        die("%s: tokenizer.ggml.model must be \"gpt2\" (byte-level BPE)", vocab_path);
    if (!gguf_str(&vg, "tokenizer.ggml.pre", pre, sizeof pre))
        die("%s: tokenizer.ggml.pre is missing", vocab_path);
    if ((uint64_t)n_keep > toks->n)
        die("N_VOCAB_TOKENS = %lld, but %s has only %llu tokens", (long long)n_keep, vocab_path,
            (unsigned long long)toks->n);

    int n_kv = 0;
    kv_str(kv, "tokenizer.ggml.model", "gpt2"), n_kv++;
    kv_str(kv, "tokenizer.ggml.pre", pre), n_kv++;
    StrSet kept;
    set_init(&kept, (uint64_t)n_keep + 1);
    put_kv_arr_header(kv, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, (uint64_t)n_keep + 1), n_kv++;
    const uint8_t *p = toks->data;
    for (int64_t i = 0; i < n_keep; i++) {
        uint64_t len;
        const char *t = gguf_next_str(&p, &len);
        if (len == strlen(EOT_TEXT) && !memcmp(t, EOT_TEXT, len))
            die("token %lld of %s is %s, which is appended as id N = %lld: use N <= %lld",
                (long long)i, vocab_path, EOT_TEXT, (long long)n_keep, (long long)i);
        if (set_has(&kept, t, (size_t)len, 1))
            die("%s: token %lld (\"%.40s\") appears twice", vocab_path, (long long)i, t);
        put_strn(kv, t, (size_t)len);
    }
    put_str(kv, EOT_TEXT);
    put_kv_arr_header(kv, "tokenizer.ggml.token_type", GGUF_TYPE_I32, (uint64_t)n_keep + 1), n_kv++;
    put(kv, types->data, (size_t)n_keep * 4);
    put_i32(kv, 3); // CONTROL

    // merges "left right" (split at the first space after the first byte), kept in their order
    // when left, right and left+right are all kept tokens
    put_kv_arr_header(kv, "tokenizer.ggml.merges", GGUF_TYPE_STRING, 0), n_kv++;
    size_t count_at = kv->n - 8;
    uint64_t n_merges = 0;
    char *cat = NULL;
    size_t cat_cap = 0;
    const uint8_t *q = merges ? merges->data : NULL;
    for (uint64_t i = 0; merges && i < merges->n; i++) {
        uint64_t len;
        const char *m = gguf_next_str(&q, &len);
        const char *sp = len > 1 ? (const char *)memchr(m + 1, ' ', (size_t)len - 1) : NULL;
        if (!sp) die("%s: merge %llu (\"%.40s\") has no space", vocab_path,
                     (unsigned long long)i, m);
        size_t nl = (size_t)(sp - m), nr = (size_t)len - nl - 1;
        if (!set_has(&kept, m, nl, 0) || !set_has(&kept, sp + 1, nr, 0)) continue;
        if (nl + nr > cat_cap)
            cat_cap = 2 * (nl + nr), cat = (char *)xrealloc(cat, cat_cap, "a merge");
        memcpy(cat, m, nl);
        memcpy(cat + nl, sp + 1, nr);
        if (!set_has(&kept, cat, nl + nr, 0)) continue;
        put_strn(kv, m, (size_t)len);
        n_merges++;
    }
    memcpy(kv->p + count_at, &n_merges, 8);
    free(cat);
    kv_u32(kv, "tokenizer.ggml.bos_token_id", (uint32_t)n_keep), n_kv++;
    kv_u32(kv, "tokenizer.ggml.eos_token_id", (uint32_t)n_keep), n_kv++;
    kv_u32(kv, "tokenizer.ggml.padding_token_id", (uint32_t)n_keep), n_kv++;
    kv_bool(kv, "tokenizer.ggml.add_bos_token", 0), n_kv++;
    fprintf(stderr, "vocabulary: %lld tokens + %s, %llu of %llu merges kept\n",
            (long long)n_keep, EOT_TEXT, (unsigned long long)n_merges,
            (unsigned long long)(merges ? merges->n : 0));
    // the strings were copied into kv: the vocabulary can go
    gguf_close(&vg);
    return n_kv;
}

// ------------------------------------------------------------------------------------------------
// main: read, plan, write the header, then each tensor
// ------------------------------------------------------------------------------------------------

static void usage(void) {
    die("usage: hf_to_gguf [--name NAME] CKPT_DIR VOCAB.gguf N_VOCAB_TOKENS OUT.gguf");
}

static void write_all(int fd, const void *p, size_t n, const char *path) {
    const uint8_t *b = (const uint8_t *)p;
    while (n) {
        ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) die("writing '%s' failed: %s", path, w < 0 ? strerror(errno) : "no space?");
        b += w, n -= (size_t)w;
    }
}

int main(int argc, char **argv) {
    catch_fatal_signals();
    const char *gname = NULL, *pos[4];
    int npos = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--name")) {
            if (i + 1 >= argc) die("--name needs a value");
            gname = argv[++i];
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage();
        } else if (argv[i][0] == '-' && argv[i][1]) {
            die("unknown option '%s'", argv[i]);
        } else {
            if (npos == 4) usage();
            pos[npos++] = argv[i];
        }
    }
    if (npos != 4) usage();
    const char *dir = pos[0], *vocab = pos[1], *out = pos[3];
    char *endp;
    errno = 0;
    long long n_keep = strtoll(pos[2], &endp, 10);
    if (errno || endp == pos[2] || *endp || n_keep < 1 || n_keep >= MAX_VOCAB)
        die("N_VOCAB_TOKENS '%s' must be a whole number in [1, %d)", pos[2], MAX_VOCAB);

    char cfg_path[4096], st_path[4096];
    if (snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir) >= (int)sizeof cfg_path ||
        snprintf(st_path, sizeof st_path, "%s/model.safetensors", dir) >= (int)sizeof st_path)
        die("checkpoint path too long");
    char default_name[256];
    if (!gname) { // the directory's last component
        size_t n = strlen(dir);
        while (n > 1 && dir[n - 1] == '/') n--;
        size_t s = n;
        while (s > 0 && dir[s - 1] != '/') s--;
        snprintf(default_name, sizeof default_name, "%.*s", (int)(n - s), dir + s);
        gname = default_name;
    }

    // the output must not be one of the inputs (it replaces its path only at the end, but a
    // checkpoint or vocabulary overwritten by its own conversion is lost)
    struct stat so;
    if (stat(out, &so) == 0) {
        if (S_ISDIR(so.st_mode)) die("output '%s' is a directory", out);
        const char *ins[3] = {cfg_path, st_path, vocab};
        for (int i = 0; i < 3; i++) {
            struct stat si;
            if (stat(ins[i], &si) == 0 && si.st_dev == so.st_dev && si.st_ino == so.st_ino)
                die("output '%s' is the input '%s'", out, ins[i]);
        }
    }

    // the output: a temporary file next to OUT, renamed when complete (die() deletes it)
    static char tmp[4200];
    if (snprintf(tmp, sizeof tmp, "%s.tmp-XXXXXX", out) >= (int)sizeof tmp)
        die("output path too long");
    int fd = mkstemp(tmp);
    if (fd < 0) die("cannot create a file next to '%s': %s", out, strerror(errno));
    g_partial_file[0] = tmp;
    fchmod(fd, 0644);

    Cfg *c = (Cfg *)xcalloc(1, sizeof(Cfg), "the config");
    config_load(c, cfg_path);
    g_cfg = c;
    if (c->V != n_keep + 1)
        die("%s: vocab_size is %lld, but N_VOCAB_TOKENS = %lld gives %lld tokens (N + "
            "<|endoftext|>)", cfg_path, (long long)c->V, n_keep, n_keep + 1);
    Buf tok = {0}; // the tokenizer's keys, written after the model's
    int n_tok_kv = tokenizer_kvs(&tok, vocab, n_keep);
    safetensors_load(st_path);
    make_plan(c);
    bind_plan(c);

    // --- metadata ---
    const char *arch = c->q35 ? "qwen35" : "qwen3";
    Buf kv = {0};
    int n_kv = 0;
    char key[128];
#define K(suffix) (snprintf(key, sizeof key, "%s." suffix, arch), n_kv++, key)
    kv_str(&kv, "general.architecture", arch), n_kv++;
    kv_str(&kv, "general.type", "model"), n_kv++;
    kv_str(&kv, "general.name", gname), n_kv++;
    kv_u32(&kv, K("block_count"), (uint32_t)c->L);
    kv_u32(&kv, K("context_length"), (uint32_t)c->ctx);
    kv_u32(&kv, K("embedding_length"), (uint32_t)c->E);
    kv_u32(&kv, K("feed_forward_length"), (uint32_t)c->F);
    kv_u32(&kv, K("attention.head_count"), (uint32_t)c->H);
    kv_u32(&kv, K("attention.head_count_kv"), (uint32_t)c->Hkv);
    kv_f32(&kv, K("rope.freq_base"), (float)c->theta);
    kv_f32(&kv, K("attention.layer_norm_rms_epsilon"), (float)c->eps);
    kv_u32(&kv, K("attention.key_length"), (uint32_t)c->hd);
    kv_u32(&kv, K("attention.value_length"), (uint32_t)c->hd);
    kv_u32(&kv, "general.file_type", 1), n_kv++; // LLAMA_FTYPE_MOSTLY_F16
    if (c->q35) {
        kv_arr_i32(&kv, K("rope.dimension_sections"), c->sections, 4);
        kv_u32(&kv, K("ssm.conv_kernel"), (uint32_t)c->conv_k);
        kv_u32(&kv, K("ssm.state_size"), (uint32_t)c->dk);
        kv_u32(&kv, K("ssm.group_count"), (uint32_t)c->Hk);
        kv_u32(&kv, K("ssm.time_step_rank"), (uint32_t)c->Hv);
        kv_u32(&kv, K("ssm.inner_size"), (uint32_t)(c->dv * c->Hv));
        kv_u32(&kv, K("full_attention_interval"), (uint32_t)c->interval);
        kv_u32(&kv, K("rope.dimension_count"), (uint32_t)c->n_rot);
    }
#undef K
    kv_u32(&kv, "general.quantization_version", 2), n_kv++;
    put(&kv, tok.p, tok.n);
    n_kv += n_tok_kv;

    // --- header: tensor infos with contiguous offsets, alignment 32 ---
    uint64_t off = 0;
    for (int i = 0; i < g_n_items; i++) {
        g_items[i].offset = off;
        off += (g_items[i].nbytes + 31) / 32 * 32;
    }
    Buf h = {0};
    put(&h, "GGUF", 4);
    put_u32(&h, 3);
    put_u64(&h, (uint64_t)g_n_items);
    put_u64(&h, (uint64_t)n_kv);
    put(&h, kv.p, kv.n);
    for (int i = 0; i < g_n_items; i++) {
        const Item *it = &g_items[i];
        int64_t ne[2] = {it->cols, it->rows};
        if (it->gguf_ndim == 1) ne[0] = it->rows;
        put_tensor_info(&h, it->name, it->gguf_ndim, ne, it->type, it->offset);
    }
    put_pad(&h, 32);

    // --- the data ---
    write_all(fd, h.p, h.n, tmp);
    size_t cap = 0;
    uint8_t *buf = NULL;
    for (int i = 0; i < g_n_items; i++) {
        const Item *it = &g_items[i];
        size_t padded = (it->nbytes + 31) / 32 * 32;
        if (padded > cap) {
            free(buf);
            cap = padded;
            buf = (uint8_t *)xmalloc(cap, "a tensor's converted data");
        }
        memset(buf + it->nbytes, 0, padded - it->nbytes);
        convert_tensor(it, buf);
        write_all(fd, buf, padded, tmp);
    }
    if (fsync(fd) != 0 || close(fd) != 0) die("writing '%s' failed: %s", tmp, strerror(errno));
    if (rename(tmp, out) != 0) die("cannot rename '%s' to '%s': %s", tmp, out, strerror(errno));
    g_partial_file[0] = NULL;
    fprintf(stderr, "wrote %s: %s, %lld layers, %d tensors, %.1f MiB\n", out, arch,
            (long long)c->L, g_n_items, (double)(h.n + off) / (1 << 20));
    return 0;
}
