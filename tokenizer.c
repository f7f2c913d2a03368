// tokenizer.c — text <-> token ids for Qwen's byte-level BPE, read from the GGUF. #included by
// qwen.cu in its section 10 (it needs only the GGUF reader of section 2). Matches Hugging Face
// `tokenizers` (the model authors' tokenizer):
//
//   text --(split out special/added tokens, longest first)--> fragments
//        --(UTF-8 -> code points; invalid bytes -> U+FFFD)-->
//        --(Qwen2/2.5/3 only: Unicode NFC)-->
//        --(pre-tokenizer: the `qwen2` or `qwen35` regex, matched by hand)--> words
//        --(each word: bytes -> GPT-2 byte characters -> BPE merges by rank)--> token ids
//
// and back: ids -> bytes through the inverse byte map, streamed so that no partial UTF-8
// sequence is ever printed. The Unicode tables come from unicode_tables.h, generated from the
// Unicode Character Database by unicode_tables.py.

#include "unicode_tables.h"

// ------------------------------------------------------------------------------------------------
// Unicode: classes, case folding, UTF-8, NFC
// ------------------------------------------------------------------------------------------------

// Binary search in a sorted table of [lo, hi, value] ranges; 0 when cp is in none.
static uint32_t range_lookup(const uint32_t (*t)[3], int n, uint32_t cp) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < t[mid][0]) hi = mid - 1;
        else if (cp > t[mid][1]) lo = mid + 1;
        else return t[mid][2];
    }
    return 0;
}
#define NELEM(a) ((int)(sizeof(a) / sizeof((a)[0])))

static int uni_flags(uint32_t cp) {
    if (cp < 0x80) { // ASCII without a search
        if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return UNI_LETTER;
        if (cp >= '0' && cp <= '9') return UNI_NUMBER;
        if (cp == ' ' || (cp >= 0x09 && cp <= 0x0d)) return UNI_SPACE;
        return 0;
    }
    return (int)range_lookup(UNI_FLAG_RANGES, NELEM(UNI_FLAG_RANGES), cp);
}

static uint32_t uni_fold(uint32_t cp) {
    if (cp < 0x80) return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp;
    int lo = 0, hi = NELEM(UNI_FOLD) - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < UNI_FOLD[mid][0]) hi = mid - 1;
        else if (cp > UNI_FOLD[mid][0]) lo = mid + 1;
        else return UNI_FOLD[mid][1];
    }
    return cp;
}

static int uni_ccc(uint32_t cp) {
    return cp < 0x300 ? 0 : (int)range_lookup(UNI_CCC_RANGES, NELEM(UNI_CCC_RANGES), cp);
}

// UTF-8 -> code points. An ill-formed sequence is replaced by one U+FFFD per maximal subpart (the
// longest prefix of a valid sequence), as Python's and the WHATWG decoders do. Returns the count;
// out needs room for len code points.
static int utf8_to_cps(const unsigned char *s, size_t len, uint32_t *out) {
    int n = 0;
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        if (c < 0x80) { out[n++] = c; i++; continue; }
        int need;        // continuation bytes
        unsigned lo = 0x80, hi = 0xbf; // allowed range of the first continuation byte
        uint32_t cp;
        if (c >= 0xc2 && c <= 0xdf) { need = 1; cp = c & 0x1f; }
        else if (c >= 0xe0 && c <= 0xef) {
            need = 2; cp = c & 0x0f;
            if (c == 0xe0) lo = 0xa0;      // no overlong forms
            if (c == 0xed) hi = 0x9f;      // no surrogates
        } else if (c >= 0xf0 && c <= 0xf4) {
            need = 3; cp = c & 0x07;
            if (c == 0xf0) lo = 0x90;
            if (c == 0xf4) hi = 0x8f;      // at most U+10FFFF
        } else { out[n++] = 0xfffd; i++; continue; }
        size_t j = i + 1;
        int ok = 1;
        for (int k = 0; k < need; k++, j++) {
            unsigned b = j < len ? s[j] : 0;
            if (j >= len || b < (k == 0 ? lo : 0x80) || b > (k == 0 ? hi : 0xbf)) { ok = 0; break; }
            cp = (cp << 6) | (b & 0x3f);
        }
        out[n++] = ok ? cp : 0xfffd;
        i = j; // past the sequence, or past its maximal valid prefix
    }
    return n;
}

// length of the UTF-8 sequence a lead byte starts (0: not a lead byte)
static int utf8_seq_len(unsigned char c) {
    return c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
}

static int cp_to_utf8(uint32_t cp, char *out) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | (cp >> 18)); out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3f)); out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

// --- NFC: canonical decomposition, canonical ordering, canonical composition ---
// Hangul syllables are decomposed and composed arithmetically (Unicode §3.12).
enum {
    H_SBASE = 0xac00,
    H_LBASE = 0x1100,
    H_VBASE = 0x1161,
    H_TBASE = 0x11a7,
    H_LCOUNT = 19,
    H_VCOUNT = 21,
    H_TCOUNT = 28,
    H_NCOUNT = H_VCOUNT * H_TCOUNT,
    H_SCOUNT = H_LCOUNT * H_NCOUNT
};

static const uint32_t *decomp_of(uint32_t cp) {
    int lo = 0, hi = NELEM(UNI_DECOMP) - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < UNI_DECOMP[mid][0]) hi = mid - 1;
        else if (cp > UNI_DECOMP[mid][0]) lo = mid + 1;
        else return UNI_DECOMP[mid];
    }
    return NULL;
}

// append the full canonical decomposition of cp
static int decompose(uint32_t cp, uint32_t *out) {
    if (cp >= H_SBASE && cp < H_SBASE + H_SCOUNT) {
        uint32_t s = cp - H_SBASE, t = s % H_TCOUNT;
        out[0] = H_LBASE + s / H_NCOUNT;
        out[1] = H_VBASE + (s % H_NCOUNT) / H_TCOUNT;
        if (t) { out[2] = H_TBASE + t; return 3; }
        return 2;
    }
    const uint32_t *d = cp >= 0xc0 ? decomp_of(cp) : NULL;
    if (!d) { out[0] = cp; return 1; }
    int n = decompose(d[1], out);
    if (d[2]) n += decompose(d[2], out + n);
    return n;
}

static uint32_t compose_pair(uint32_t a, uint32_t b) {
    if (a >= H_LBASE && a < H_LBASE + H_LCOUNT && b >= H_VBASE && b < H_VBASE + H_VCOUNT)
        return H_SBASE + ((a - H_LBASE) * H_VCOUNT + (b - H_VBASE)) * H_TCOUNT;
    if (a >= H_SBASE && a < H_SBASE + H_SCOUNT && (a - H_SBASE) % H_TCOUNT == 0 && b > H_TBASE &&
        b < H_TBASE + H_TCOUNT)
        return a + (b - H_TBASE);
    int lo = 0, hi = NELEM(UNI_COMPOSE) - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        uint32_t x = UNI_COMPOSE[mid][0], y = UNI_COMPOSE[mid][1];
        if (a < x || (a == x && b < y)) hi = mid - 1;
        else if (a > x || (a == x && b > y)) lo = mid + 1;
        else return UNI_COMPOSE[mid][2];
    }
    return 0;
}

static int nfc_quick_no(uint32_t c) { // NFC_Quick_Check is No or Maybe
    int lo = 0, hi = NELEM(UNI_NFC_QC_RANGES) - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (c < UNI_NFC_QC_RANGES[mid][0]) hi = mid - 1;
        else if (c > UNI_NFC_QC_RANGES[mid][1]) lo = mid + 1;
        else return 1;
    }
    return 0;
}

// The longest full canonical decomposition of one code point (U+1F82 and its kin: 4; a Hangul
// syllable: 3). The tests check every code point against it.
#define NFC_MAX_DECOMP 4

// NFC of cps[0..n) into out (room for NFC_MAX_DECOMP * n + 1); returns the count.
static int nfc(const uint32_t *cps, int n, uint32_t *out) {
    // quick check: no combining mark and no code point with NFC_QC No/Maybe -> already NFC
    int quick = 1;
    for (int i = 0; i < n && quick; i++)
        if (cps[i] >= 0x300 && (uni_ccc(cps[i]) || nfc_quick_no(cps[i]))) quick = 0;
    if (quick) {
        memcpy(out, cps, (size_t)n * 4);
        return n;
    }
    int m = 0;
    for (int i = 0; i < n; i++) m += decompose(cps[i], out + m);
    // canonical ordering: stable sort of each run of non-starters by combining class
    for (int i = 1; i < m; i++) {
        int cc = uni_ccc(out[i]);
        if (!cc) continue;
        for (int j = i; j > 0; j--) {
            int cp = uni_ccc(out[j - 1]);
            if (cp <= cc) break;
            uint32_t t = out[j]; out[j] = out[j - 1]; out[j - 1] = t;
        }
    }
    // canonical composition: a character joins the last starter when it composes with it and is
    // not blocked (a character in between with a class >= its own, or the character right after
    // the starter: last_class 0)
    if (m == 0) return 0;
    int starter = 0, k = 1;
    int last_class = uni_ccc(out[0]) ? 256 : 0; // a leading non-starter blocks everything after it
    for (int i = 1; i < m; i++) {
        uint32_t c = out[i];
        int cc = uni_ccc(c);
        uint32_t comp = compose_pair(out[starter], c);
        if (comp && (last_class < cc || last_class == 0)) {
            out[starter] = comp;
            continue;
        }
        if (cc == 0) starter = k;
        last_class = cc;
        out[k++] = c;
    }
    return k;
}

// ------------------------------------------------------------------------------------------------
// Pre-tokenizer: the regexes of Qwen's tokenizer.json, matched by hand
// ------------------------------------------------------------------------------------------------
// qwen2 (Qwen2/2.5/3), one alternative after the other at each position, the first that matches:
//   (?i:'s|'t|'re|'ve|'m|'ll|'d) | [^\r\n\p{L}\p{N}]?\p{L}+ | \p{N} | ?[^\s\p{L}\p{N}]+[\r\n]*
//   | \s*[\r\n]+ | \s+(?!\S) | \s+
// qwen35 (Qwen3.5/3.6) is the same with combining marks kept inside letter runs:
//   ... | [^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+ | \p{N} | ?[^\s\p{L}\p{M}\p{N}]+[\r\n]* | ...

enum { PRE_QWEN2, PRE_QWEN35 };

// length of the match at pos (always >= 1)
static int pretok_match(const uint32_t *c, int n, int pos, int pre) {
    int letterish = pre == PRE_QWEN35 ? (UNI_LETTER | UNI_MARK) : UNI_LETTER;
#define FL(i) ((i) < n ? uni_flags(c[i]) : 0)
#define IS_CRLF(i) ((i) < n && (c[i] == '\r' || c[i] == '\n'))
    // 1. contractions, case-insensitive (case folding: 'ſ' folds to 's' too)
    if (c[pos] == '\'' && pos + 1 < n) {
        uint32_t a = uni_fold(c[pos + 1]), b = pos + 2 < n ? uni_fold(c[pos + 2]) : 0;
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    }
    // 2. an optional non-letter, non-number, non-CR/LF character, then a run of letters (and marks)
    {
        int i = pos;
        if (!(FL(i) & letterish)) { // the optional prefix, if the character after it starts the run
            if (!IS_CRLF(i) && !(FL(i) & (UNI_LETTER | UNI_NUMBER)) && (FL(i + 1) & letterish)) i++;
            else i = -1;
        }
        if (i >= 0) {
            while (i < n && (FL(i) & letterish)) i++;
            return i - pos;
        }
    }
    // 3. a single number
    if (FL(pos) & UNI_NUMBER) return 1;
    // 4. an optional space, a run of "other" characters (not whitespace, letter, number; qwen35:
    // mark), CR/LF
    {
        int other = UNI_SPACE | UNI_LETTER | UNI_NUMBER | (pre == PRE_QWEN35 ? UNI_MARK : 0);
        int i = pos + (c[pos] == ' ');
        if (i < n && !(FL(i) & other)) {
            while (i < n && !(FL(i) & other)) i++;
            while (IS_CRLF(i)) i++;
            return i - pos;
        }
    }
    // 5-7. whitespace: up to the last CR/LF of the run; else all but the last (if followed by
    //      non-space); else all
    int end = pos;
    while (end < n && (FL(end) & UNI_SPACE)) end++;
    int last_crlf = -1;
    for (int i = pos; i < end; i++)
        if (c[i] == '\r' || c[i] == '\n') last_crlf = i;
    if (last_crlf >= 0) return last_crlf + 1 - pos;
    if (end - pos > 1 && end < n) return end - 1 - pos;
    if (end > pos) return end - pos;
    return 1; // unreachable: every character matches one of the classes above
#undef FL
#undef IS_CRLF
}

// ------------------------------------------------------------------------------------------------
// Vocabulary, merges, special tokens
// ------------------------------------------------------------------------------------------------

enum {
    TOK_NORMAL = 1,
    TOK_UNKNOWN = 2,
    TOK_CONTROL = 3,
    TOK_USER_DEFINED = 4,
    TOK_UNUSED = 5,
    TOK_BYTE = 6
};

// Open-addressing hash map from a byte string to an int. The keys live in the mapped file (the
// vocabulary's strings): a slot keeps the key as a 32-bit offset from `base`, its length and its
// hash, 16 bytes in all, so the tables of a 151k vocabulary stay small (fewer pages to touch).
typedef struct {
    uint32_t off, hash;
    int len, value; // len -1: empty slot
} HashSlot;
typedef struct {
    HashSlot *slots;
    uint32_t mask;
    const char *base;
} HashMap;

static uint32_t hash_bytes(const char *s, int n) { // FNV-1a
    uint32_t h = 2166136261u;
    for (int i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}
static void hm_init(HashMap *m, int n, const char *base) {
    uint32_t cap = 1;
    while (cap < (uint32_t)n + (uint32_t)n / 2 + 16) cap <<= 1; // load factor <= 2/3
    m->slots = (HashSlot *)xmalloc((size_t)cap * sizeof(HashSlot), "the vocabulary's hash table");
    for (uint32_t i = 0; i < cap; i++) m->slots[i].len = -1;
    m->mask = cap - 1;
    m->base = base;
}
// keeps the first value of a key
static void hm_put(HashMap *m, const char *key, int len, int value) {
    if ((size_t)(key - m->base) > UINT32_MAX)
        die("tokenizer: vocabulary strings lie more than 4 GiB into the file");
    uint32_t h = hash_bytes(key, len);
    for (uint32_t i = h & m->mask;; i = (i + 1) & m->mask) {
        HashSlot *s = &m->slots[i];
        if (s->len < 0) { *s = (HashSlot){(uint32_t)(key - m->base), h, len, value}; return; }
        if (s->hash == h && s->len == len && !memcmp(m->base + s->off, key, len)) return;
    }
}
static int hm_get(const HashMap *m, const char *key, int len) {
    uint32_t h = hash_bytes(key, len);
    for (uint32_t i = h & m->mask;; i = (i + 1) & m->mask) {
        const HashSlot *s = &m->slots[i];
        if (s->len < 0) return -1;
        if (s->hash == h && s->len == len && !memcmp(m->base + s->off, key, len)) return s->value;
    }
}

typedef struct {
    int n_vocab;
    // (n_vocab) token text as stored (byte-level characters), in the mapped file
    const char **text;
    int *text_len;       // (n_vocab)
    int *type;           // (n_vocab) TOK_*
    char *pieces;        // (sum of piece_len) decoded bytes of every token, back to back
    int *piece_off, *piece_len; // (n_vocab) each token's bytes in pieces
    unsigned char *eog;  // (n_vocab) 1: ends generation
    HashMap token_id;    // text -> id
    HashMap merge_rank;  // "left right" -> rank
    int *special;        // ids of CONTROL/USER_DEFINED/UNKNOWN tokens, longest text first
    int n_special;
    int pre;             // PRE_QWEN2 | PRE_QWEN35
    int nfc;             // Qwen2/2.5/3's normalizer: NFC before pre-tokenizing
    int bos_id, eos_id, eot_id, im_start_id, im_end_id;
    int add_bos;
    // default system prompt of the file's chat template, if any
    char chat_template_default_system[128];
    // the GPT-2 byte map: byte -> its character as UTF-8
    char byte_char[256][3];
    int byte_char_len[256];
} Tokenizer;

// GPT-2's byte map sends every byte to a printable codepoint: 0x21-0x7E, 0xA1-0xAC and 0xAE-0xFF
// map to themselves, the other 68 bytes to U+0100, U+0101, ... in order.
static int byte_to_codepoint(int b) {
    int self = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    if (self) return b;
    int k = 0;
    for (int x = 0; x < b; x++)
        if (!((x >= 0x21 && x <= 0x7e) || (x >= 0xa1 && x <= 0xac) || (x >= 0xae && x <= 0xff)))
            k++;
    return 256 + k;
}
// inverse of byte_to_codepoint, -1 elsewhere (filled by tokenizer_init)
static int g_byte_of_cp[324];
static int codepoint_to_byte(uint32_t cp) { return cp < 324 ? g_byte_of_cp[cp] : -1; }

static int tok_id(const Tokenizer *t, const char *text) {
    return hm_get(&t->token_id, text, (int)strlen(text));
}

static void tokenizer_free(Tokenizer *t);
// c an ASCII hex digit
static int hex_digit(int c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; }
static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

// Read the vocabulary from the GGUF. Errors name the key; a file without a tokenizer is an error
// only when text is encoded or decoded.
static int tokenizer_init(Tokenizer *t, const GGUF *g, int n_vocab_model, char *err,
                          size_t errlen) {
    memset(t, 0, sizeof *t);
    const GGUFKV *tokens = gguf_find(g, "tokenizer.ggml.tokens");
    if (!tokens || tokens->type != GGUF_TYPE_ARRAY || tokens->arr_type != GGUF_TYPE_STRING) {
        snprintf(err, errlen, "the file has no tokenizer.ggml.tokens string array");
        return -1;
    }
    char model[32] = "", pre[32] = "";
    gguf_str(g, "tokenizer.ggml.model", model, sizeof model);
    if (strcmp(model, "gpt2") != 0) {
        snprintf(err, errlen,
                 "tokenizer.ggml.model is '%s'; qwen.cu reads byte-level BPE ('gpt2') vocabularies",
                 model);
        return -1;
    }
    gguf_str(g, "tokenizer.ggml.pre", pre, sizeof pre);
    if (!strcmp(pre, "qwen35")) t->pre = PRE_QWEN35;
    else if (!strcmp(pre, "qwen2") || !strcmp(pre, "deepseek-r1-qwen") || !strcmp(pre, "kormo") ||
             !strcmp(pre, "f2llmv2"))
        t->pre = PRE_QWEN2;
    else {
        snprintf(
            err, errlen,
            "tokenizer.ggml.pre is '%s'; qwen.cu knows the 'qwen2' and 'qwen35' pre-tokenizers",
            pre);
        return -1;
    }
    t->nfc = t->pre == PRE_QWEN2; // Qwen3.5's tokenizer has no normalizer
    for (int i = 0; i < 324; i++) g_byte_of_cp[i] = -1;
    for (int b = 0; b < 256; b++) g_byte_of_cp[byte_to_codepoint(b)] = b;
    if (tokens->n > MAX_VOCAB) {
        snprintf(err, errlen,
                 "tokenizer.ggml.tokens has %llu entries, more than the %d this engine takes",
                 (unsigned long long)tokens->n, MAX_VOCAB);
        return -1;
    }
    int n = (int)tokens->n;
    // ids past the embedding cannot be used
    if (n_vocab_model > 0 && n > n_vocab_model) n = n_vocab_model;
    t->n_vocab = n;
    t->text = (const char **)xmalloc((size_t)n * sizeof(char *), "the vocabulary");
    t->text_len = (int *)xmalloc((size_t)n * sizeof(int), "the vocabulary");
    t->type = (int *)xmalloc((size_t)n * sizeof(int), "the vocabulary");
    t->eog = (unsigned char *)xcalloc(n, 1, "the vocabulary");
    const GGUFKV *types = gguf_find(g, "tokenizer.ggml.token_type");
    int have_types = types && types->type == GGUF_TYPE_ARRAY && types->arr_type == GGUF_TYPE_I32 &&
                     types->n >= (uint64_t)n;
    hm_init(&t->token_id, n, (const char *)g->base);
    const uint8_t *p = tokens->data;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        uint64_t len;
        t->text[i] = gguf_next_str(&p, &len);
        t->text_len[i] = (int)len;
        total += len;
        int ty = TOK_NORMAL;
        if (have_types) memcpy(&ty, types->data + 4 * (size_t)i, 4);
        t->type[i] = ty;
        hm_put(&t->token_id, t->text[i], (int)len, i);
    }
    if (total >= INT32_MAX) { // piece offsets are ints
        snprintf(err, errlen, "the vocabulary's token texts add up to %zu bytes, more than 2 GiB",
                 total);
        tokenizer_free(t);
        return -1;
    }
    // decoded bytes of each token: normal tokens through the inverse byte map, <0xXX> byte tokens
    // to their byte, the others (control, user-defined, unused) as their text
    t->pieces = (char *)xmalloc(total + 1, "the vocabulary");
    t->piece_off = (int *)xmalloc((size_t)n * sizeof(int), "the vocabulary");
    t->piece_len = (int *)xmalloc((size_t)n * sizeof(int), "the vocabulary");
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        t->piece_off[i] = (int)off;
        const unsigned char *s = (const unsigned char *)t->text[i];
        int len = t->text_len[i];
        if (t->type[i] == TOK_NORMAL) {
            // the byte characters are U+0021..U+0143: 1 or 2 UTF-8 bytes
            for (int k = 0; k < len;) {
                int b = -1, bytes = 1;
                if (s[k] < 0x80) b = codepoint_to_byte(s[k]);
                else if ((s[k] >> 5) == 6 && k + 1 < len) {
                    b = codepoint_to_byte(((uint32_t)(s[k] & 0x1f) << 6) | (s[k + 1] & 0x3f));
                    bytes = 2;
                }
                if (b >= 0) t->pieces[off++] = (char)b;
                else { // not a byte character: keep the text as it is
                    bytes = utf8_seq_len(s[k]);
                    if (bytes == 0 || k + bytes > len) bytes = 1;
                    memcpy(t->pieces + off, s + k, bytes);
                    off += bytes;
                }
                k += bytes;
            }
        } else if (t->type[i] == TOK_BYTE && len == 6 && !memcmp(s, "<0x", 3) && isxdigit(s[3]) &&
                   isxdigit(s[4]) &&
                   s[5] == '>') { // <0xXX>: exactly two hex digits (the text is not NUL-terminated)
            t->pieces[off++] = (char)(hex_digit(s[3]) * 16 + hex_digit(s[4]));
        } else {
            memcpy(t->pieces + off, s, len);
            off += len;
        }
        t->piece_len[i] = (int)(off - t->piece_off[i]);
    }
    // merges: "left right", rank = position
    const GGUFKV *merges = gguf_find(g, "tokenizer.ggml.merges");
    if (merges && merges->type == GGUF_TYPE_ARRAY && merges->arr_type == GGUF_TYPE_STRING) {
        if (merges->n > MAX_VOCAB) { // the hash table is sized from the count
            snprintf(err, errlen,
                     "tokenizer.ggml.merges has %llu entries, more than the %d this engine takes",
                     (unsigned long long)merges->n, MAX_VOCAB);
            tokenizer_free(t);
            return -1;
        }
        hm_init(&t->merge_rank, (int)merges->n, (const char *)g->base);
        const uint8_t *q = merges->data;
        for (uint64_t i = 0; i < merges->n; i++) {
            uint64_t len;
            const char *m = gguf_next_str(&q, &len);
            hm_put(&t->merge_rank, m, (int)len, (int)i);
        }
    } else {
        hm_init(&t->merge_rank, 1, (const char *)g->base);
    }
    // special and added tokens, longest first; end-of-generation tokens by their text
    t->special = (int *)xmalloc((size_t)n * sizeof(int), "the vocabulary");
    for (int i = 0; i < n; i++)
        if (t->type[i] == TOK_CONTROL || t->type[i] == TOK_USER_DEFINED ||
            t->type[i] == TOK_UNKNOWN)
            t->special[t->n_special++] = i;
    { // by length, longest first, ids in order among equal lengths: as keys (2^31 - 1 - length, id)
        // sorted by qsort (any token may be marked special, so there can be many)
        uint64_t *key =
            (uint64_t *)xmalloc((size_t)t->n_special * sizeof *key + 1, "the vocabulary");
        for (int i = 0; i < t->n_special; i++)
            key[i] =
                (uint64_t)(INT32_MAX - t->text_len[t->special[i]]) << 32 | (uint32_t)t->special[i];
        qsort(key, (size_t)t->n_special, sizeof *key, cmp_u64);
        for (int i = 0; i < t->n_special; i++) t->special[i] = (int)(uint32_t)key[i];
        free(key);
    }
    static const char *EOG_TEXT[] = {
        "<|im_end|>",  "<|endoftext|>", "<|eot_id|>",    "<|end|>",      "<|eom_id|>",     "<EOT>",
        "<|fim_pad|>", "<|fim_repo|>",  "<|repo_name|>", "<|file_sep|>", "<|end_of_text|>"};
    for (size_t k = 0; k < sizeof EOG_TEXT / sizeof EOG_TEXT[0]; k++) {
        int id = tok_id(t, EOG_TEXT[k]);
        if (id >= 0) { t->eog[id] = 1; t->type[id] = TOK_CONTROL; }
    }
#define ID_KEY(field, key)                                                                         \
    do {                                                                                           \
        const GGUFKV *kv_ = gguf_find(g, key);                                                     \
        uint32_t v_ = 0;                                                                           \
        t->field = -1;                                                                             \
        if (kv_ && kv_->type == GGUF_TYPE_U32) {                                                   \
            memcpy(&v_, kv_->data, 4);                                                             \
            if (v_ < (uint32_t)n) t->field = (int)v_;                                              \
        }                                                                                          \
    } while (0)
    ID_KEY(bos_id, "tokenizer.ggml.bos_token_id");
    ID_KEY(eos_id, "tokenizer.ggml.eos_token_id");
    ID_KEY(eot_id, "tokenizer.ggml.eot_token_id");
#undef ID_KEY
    if (t->eos_id >= 0) t->eog[t->eos_id] = 1;
    if (t->eot_id >= 0) t->eog[t->eot_id] = 1;
    t->im_start_id = tok_id(t, "<|im_start|>");
    t->im_end_id = tok_id(t, "<|im_end|>");
    t->add_bos = gguf_bool(g, "tokenizer.ggml.add_bos_token", 0);
    // the chat template's default system prompt (Qwen2/2.5 templates add one; Qwen3's do not)
    const GGUFKV *tmpl = gguf_find(g, "tokenizer.chat_template");
    if (tmpl && tmpl->type == GGUF_TYPE_STRING) {
        static const char *DEFAULTS[] = {
            "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
            "You are a helpful assistant."};
        for (int k = 0; k < 2 && !t->chat_template_default_system[0]; k++) {
            size_t dl = strlen(DEFAULTS[k]);
            for (uint64_t i = 0; i + dl <= tmpl->n; i++)
                if (!memcmp(tmpl->data + i, DEFAULTS[k], dl)) {
                    snprintf(t->chat_template_default_system,
                             sizeof t->chat_template_default_system, "%s", DEFAULTS[k]);
                    break;
                }
        }
    }
    for (int b = 0; b < 256; b++)
        t->byte_char_len[b] = cp_to_utf8((uint32_t)byte_to_codepoint(b), t->byte_char[b]);
    return 0;
}

static void tokenizer_free(Tokenizer *t) {
    free(t->text);
    free(t->text_len);
    free(t->type);
    free(t->pieces);
    free(t->piece_off);
    free(t->piece_len);
    free(t->eog); free(t->token_id.slots); free(t->merge_rank.slots); free(t->special);
    memset(t, 0, sizeof *t);
}

static int tokenizer_is_eog(const Tokenizer *t, int id) {
    return id >= 0 && id < t->n_vocab && t->eog[id];
}

// ------------------------------------------------------------------------------------------------
// Encoding
// ------------------------------------------------------------------------------------------------

typedef struct { int *ids; int n, cap; } IdList;
static void ids_push(IdList *l, int id) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->ids = (int *)xrealloc(l->ids, (size_t)l->cap * sizeof(int), "the token ids");
    }
    l->ids[l->n++] = id;
}

// BPE scratch, reused across words
typedef struct {
    int start, len, prev, next; // a symbol: bytes [start, start+len) of the byte-encoded word
} Symbol;
typedef struct {
    int left, right, rank, len; // len: total bytes when queued, to notice stale entries
} Bigram;
typedef struct {
    char *word; int word_cap;       // the word, byte-encoded (GPT-2 characters, UTF-8)
    Symbol *sym; int sym_cap;
    Bigram *heap; int heap_n, heap_cap;
    char *key; int key_cap;         // "left right" lookup key
} BpeScratch;

static int bigram_before(const Bigram *a, const Bigram *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static void heap_push(BpeScratch *s, Bigram b) {
    if (s->heap_n == s->heap_cap) {
        s->heap_cap = s->heap_cap ? 2 * s->heap_cap : 64;
        s->heap =
            (Bigram *)xrealloc(s->heap, (size_t)s->heap_cap * sizeof(Bigram), "the BPE queue");
    }
    int i = s->heap_n++;
    s->heap[i] = b;
    while (i > 0 && bigram_before(&s->heap[i], &s->heap[(i - 1) / 2])) {
        Bigram t = s->heap[i]; s->heap[i] = s->heap[(i - 1) / 2]; s->heap[(i - 1) / 2] = t;
        i = (i - 1) / 2;
    }
}
static Bigram heap_pop(BpeScratch *s) {
    Bigram top = s->heap[0];
    s->heap[0] = s->heap[--s->heap_n];
    for (int i = 0;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < s->heap_n && bigram_before(&s->heap[l], &s->heap[m])) m = l;
        if (r < s->heap_n && bigram_before(&s->heap[r], &s->heap[m])) m = r;
        if (m == i) break;
        Bigram t = s->heap[i]; s->heap[i] = s->heap[m]; s->heap[m] = t;
        i = m;
    }
    return top;
}

// queue the pair (left, right) if "left right" is a merge
static void try_pair(const Tokenizer *t, BpeScratch *s, int left, int right) {
    if (left < 0 || right < 0) return;
    const Symbol *a = &s->sym[left], *b = &s->sym[right];
    int klen = a->len + 1 + b->len;
    if (klen > s->key_cap) {
        s->key_cap = 2 * klen;
        s->key = (char *)xrealloc(s->key, s->key_cap, "a BPE merge's key");
    }
    memcpy(s->key, s->word + a->start, a->len);
    s->key[a->len] = ' ';
    memcpy(s->key + a->len + 1, s->word + b->start, b->len);
    int rank = hm_get(&t->merge_rank, s->key, klen);
    if (rank >= 0) heap_push(s, (Bigram){left, right, rank, a->len + b->len});
}

// One pre-tokenized word (code points) -> token ids. BPE by merge rank with a priority queue: pop
// the best pair, skip it if either side has changed since it was queued, merge, queue the new
// neighbours. Symbols that are not tokens at the end fall back to one token per byte.
static void bpe_word(const Tokenizer *t, BpeScratch *s, const uint32_t *cps, int n, IdList *out) {
    // bytes of the word -> GPT-2 byte characters, one symbol each
    int need = n * 4 * 3;
    if (need > s->word_cap) {
        s->word_cap = 2 * need;
        s->word = (char *)xrealloc(s->word, s->word_cap, "a pre-tokenized word");
    }
    if (n * 4 > s->sym_cap) {
        s->sym_cap = 2 * n * 4;
        s->sym =
            (Symbol *)xrealloc(s->sym, (size_t)s->sym_cap * sizeof(Symbol), "a pre-tokenized word");
    }
    int wl = 0, ns = 0;
    for (int i = 0; i < n; i++) {
        char u[4];
        int ul = cp_to_utf8(cps[i], u);
        for (int k = 0; k < ul; k++) {
            int b = (unsigned char)u[k];
            s->sym[ns] = (Symbol){wl, t->byte_char_len[b], ns - 1, ns + 1};
            memcpy(s->word + wl, t->byte_char[b], t->byte_char_len[b]);
            wl += t->byte_char_len[b];
            ns++;
        }
    }
    s->sym[ns - 1].next = -1;
    s->heap_n = 0;
    for (int i = 0; i + 1 < ns; i++) try_pair(t, s, i, i + 1);
    while (s->heap_n) {
        Bigram b = heap_pop(s);
        Symbol *l = &s->sym[b.left], *r = &s->sym[b.right];
        // a stale entry: one side merged into another since it was queued
        if (l->len == 0 || r->len == 0 || l->len + r->len != b.len || l->next != b.right) continue;
        l->len += r->len; // merge right into left (they are adjacent in the word)
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0) s->sym[r->next].prev = b.left;
        try_pair(t, s, l->prev, b.left);
        try_pair(t, s, b.left, l->next);
    }
    for (int i = 0; i >= 0; i = s->sym[i].next) {
        const Symbol *y = &s->sym[i];
        int id = hm_get(&t->token_id, s->word + y->start, y->len);
        if (id >= 0 && id < t->n_vocab) { ids_push(out, id); continue; }
        for (int k = 0; k < y->len;) { // byte fallback: each byte character on its own
            int cl = ((unsigned char)s->word[y->start + k] < 0x80) ? 1 : 2;
            int bid = hm_get(&t->token_id, s->word + y->start + k, cl);
            if (bid >= 0) ids_push(out, bid);
            k += cl;
        }
    }
}

// A raw text fragment (no special tokens in it) -> ids.
static void encode_fragment(const Tokenizer *t, BpeScratch *s, const char *text, size_t len,
                            IdList *out) {
    if (len == 0) return;
    uint32_t *cps = (uint32_t *)xmalloc(len * 4 + 4, "the text's code points");
    int n = utf8_to_cps((const unsigned char *)text, len, cps);
    if (t->nfc) {
        uint32_t *norm =
            (uint32_t *)xmalloc(((size_t)n * NFC_MAX_DECOMP + 1) * 4, "the text's NFC form");
        n = nfc(cps, n, norm);
        free(cps);
        cps = norm;
    }
    for (int pos = 0; pos < n;) {
        int l = pretok_match(cps, n, pos, t->pre);
        bpe_word(t, s, cps + pos, l, out);
        pos += l;
    }
    free(cps);
}

// Text -> ids. Special and added tokens are split out first, longest first (with parse_special = 0
// only user-defined ones, such as <think>, are; control tokens are then plain text). BOS is added
// only when the file asks for it (Qwen files do not).
static int tokenizer_encode(const Tokenizer *t, const char *text, size_t len, int parse_special,
                            int **ids_out) {
    if (t->n_vocab == 0)
        die("this model file has no tokenizer: pass the prompt as ids with --tokens");
    IdList out = {NULL, 0, 0};
    BpeScratch s;
    memset(&s, 0, sizeof s);
    if (t->add_bos && t->bos_id >= 0) ids_push(&out, t->bos_id);
    // fragments: (start, len, token id or -1 for raw text), refined one special token at a time
    typedef struct { size_t start, len; int id; } Frag;
    int nf = 1, cap = 16;
    Frag *fr = (Frag *)xmalloc(cap * sizeof(Frag), "the special-token split");
    fr[0] = (Frag){0, len, -1};
    for (int k = 0; k < t->n_special; k++) {
        int id = t->special[k];
        if (!parse_special && t->type[id] != TOK_USER_DEFINED) continue;
        const char *tx = t->text[id];
        size_t tl = (size_t)t->text_len[id];
        if (tl == 0) continue;
        for (int f = 0; f < nf; f++) {
            if (fr[f].id >= 0 || fr[f].len < tl) continue;
            const char *base = text + fr[f].start;
            const char *hit = NULL;
            for (size_t i = 0; i + tl <= fr[f].len; i++)
                if (base[i] == tx[0] && !memcmp(base + i, tx, tl)) { hit = base + i; break; }
            if (!hit) continue;
            // split: [left][token][right]; continue scanning in right (the next f)
            if (nf + 2 > cap) {
                cap = 2 * (nf + 2);
                fr = (Frag *)xrealloc(fr, cap * sizeof(Frag), "the special-token split");
            }
            size_t left = (size_t)(hit - base), right_start = fr[f].start + left + tl,
                   right_len = fr[f].len - left - tl;
            memmove(&fr[f + 3], &fr[f + 1], (size_t)(nf - f - 1) * sizeof(Frag));
            Frag orig = fr[f];
            fr[f] = (Frag){orig.start, left, -1};
            fr[f + 1] = (Frag){orig.start + left, tl, id};
            fr[f + 2] = (Frag){right_start, right_len, -1};
            nf += 2;
            f += 1; // the loop's f++ lands on the right part
        }
    }
    for (int f = 0; f < nf; f++) {
        if (fr[f].id >= 0) ids_push(&out, fr[f].id);
        else encode_fragment(t, &s, text + fr[f].start, fr[f].len, &out);
    }
    free(fr);
    free(s.word); free(s.sym); free(s.heap); free(s.key);
    *ids_out = out.ids;
    return out.n;
}

// ------------------------------------------------------------------------------------------------
// Decoding: ids -> bytes, streamed without ever cutting a UTF-8 sequence
// ------------------------------------------------------------------------------------------------

// The bytes of one token: control, unknown and unused tokens only with special = 1.
static const char *tokenizer_piece(const Tokenizer *t, int id, int special, int *len) {
    *len = 0;
    if (id < 0 || id >= t->n_vocab) return "";
    int ty = t->type[id];
    if (!special && (ty == TOK_CONTROL || ty == TOK_UNKNOWN || ty == TOK_UNUSED)) return "";
    *len = t->piece_len[id];
    return t->pieces + t->piece_off[id];
}

// A streaming printer: holds back the bytes of an incomplete UTF-8 sequence until the token that
// completes it arrives; a sequence that can no longer become valid is printed as U+FFFD.
typedef struct {
    unsigned char pend[4];
    int n;
    FILE *f;
} Stream;

static void stream_bytes(Stream *st, const char *bytes, int len) {
    for (int i = 0; i < len; i++) {
        unsigned char c = (unsigned char)bytes[i];
        if (st->n > 0 && (c & 0xc0) != 0x80) { // the pending sequence was cut short
            fputs("\xef\xbf\xbd", st->f);
            st->n = 0;
        }
        if (st->n == 0) {
            int need = utf8_seq_len(c);
            if (need == 1) { fputc(c, st->f); continue; }
            if (need == 0) { fputs("\xef\xbf\xbd", st->f); continue; } // a stray continuation byte
        }
        // cannot happen (need <= 4): bounds it for the compiler
        if ((unsigned)st->n >= 4) st->n = 0;
        st->pend[st->n++] = c;
        int need = utf8_seq_len(st->pend[0]);
        if (st->n == need) { // whole: valid, or up to `need` U+FFFDs (utf8_seq_len takes lead bytes
                             // such as F5 or an overlong E0 80 that utf8_to_cps then rejects)
            uint32_t cp[4];
            if (utf8_to_cps(st->pend, (size_t)need, cp) == 1 && cp[0] != 0xfffd)
                fwrite(st->pend, 1, need, st->f);
            else fputs("\xef\xbf\xbd", st->f);
            st->n = 0;
        }
    }
}
static void stream_flush(Stream *st) {
    if (st->n) fputs("\xef\xbf\xbd", st->f);
    st->n = 0;
    fflush(st->f);
}

// Ids -> a NUL-terminated malloc'd string (raw bytes, as the tokens hold them).
static char *tokenizer_decode(const Tokenizer *t, const int *ids, int n, int special,
                              size_t *len_out) {
    size_t cap = 64, len = 0;
    char *s = (char *)xmalloc(cap, "the decoded text");
    for (int i = 0; i < n; i++) {
        int l;
        const char *p = tokenizer_piece(t, ids[i], special, &l);
        if (len + l + 1 > cap) {
            cap = 2 * (len + l + 1);
            s = (char *)xrealloc(s, cap, "the decoded text");
        }
        memcpy(s + len, p, l);
        len += l;
    }
    s[len] = 0;
    if (len_out) *len_out = len;
    return s;
}

// ------------------------------------------------------------------------------------------------
// Chat: Qwen's ChatML
// ------------------------------------------------------------------------------------------------
//   <|im_start|>system\n{system}<|im_end|>\n
//   <|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n   (one string)
// The system turn appears on the first turn only, when given or when the file's template has a
// default one (Qwen2/2.5). Qwen3/3.5 think before answering; with thinking off their templates
// open the answer with an empty think block, "<think>\n\n</think>\n\n".
// *user_at: where the user's text starts in the turn (its length is strlen(user)), so that a caller
// can read the tags as special tokens and the user's text as plain text (--no-parse-special).

static char *chat_turn(const Tokenizer *t, const char *system, const char *user, int first,
                       int no_think, size_t *user_at) {
    const char *sys =
        system ? system
               : (first && t->chat_template_default_system[0] ? t->chat_template_default_system
                                                              : NULL);
    size_t cap = strlen(user) + (sys ? strlen(sys) : 0) + 256;
    char *s = (char *)xmalloc(cap, "a chat turn");
    int n = 0;
    if (!first) n += snprintf(s + n, cap - n, "\n"); // after the previous answer's <|im_end|>
    if (sys && first) n += snprintf(s + n, cap - n, "<|im_start|>system\n%s<|im_end|>\n", sys);
    n += snprintf(s + n, cap - n, "<|im_start|>user\n");
    *user_at = (size_t)n;
    n += snprintf(s + n, cap - n, "%s<|im_end|>\n<|im_start|>assistant\n", user);
    if (no_think) snprintf(s + n, cap - n, "<think>\n\n</think>\n\n");
    return s;
}

// The ids of one user turn of ChatML (the first with the system prompt). A later turn starts by
// closing the last answer with <|im_end|>, which the answer stopped at without feeding it. The
// template's tags are special tokens. The user's text is read as the prompt is: with special tokens
// (parse_special: the whole turn at once, so the ids are those of the model's own chat template),
// or as plain text (the tags, the text and the tags, each alone). The count, the ids in *ids
// (malloc'd). An id may stand for fewer bytes than one (NFC expands U+0F73, 3 bytes, to 6; an
// ill-formed byte becomes U+FFFD, 3 bytes), so the list grows as the pieces are encoded.
static int chat_turn_ids(const Tokenizer *t, const char *system, const char *user, int first,
                         int no_think, int parse_special, int **ids) {
    size_t at, len = strlen(user);
    char *turn = chat_turn(t, first ? system : NULL, user, first, no_think, &at);
    size_t total = strlen(turn);
    const char *piece[3] = {turn, turn + at, turn + at + len};
    size_t piece_len[3] = {at, len, total - at - len};
    int parse[3] = {1, 0, 1}, n_pieces = 3;
    if (parse_special) piece_len[0] = total, n_pieces = 1;
    IdList out = {NULL, 0, 0};
    if (!first) ids_push(&out, t->im_end_id >= 0 ? t->im_end_id : t->eos_id);
    for (int i = 0; i < n_pieces; i++) {
        int *p, np = tokenizer_encode(t, piece[i], piece_len[i], parse[i], &p);
        int bos = i > 0 && t->add_bos && t->bos_id >= 0; // one BOS, before the first piece
        for (int j = bos; j < np; j++) ids_push(&out, p[j]);
        free(p);
    }
    free(turn);
    *ids = out.ids;
    return out.n;
}
