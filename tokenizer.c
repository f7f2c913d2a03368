// tokenizer.c — text <-> token ids for Qwen's byte-level BPE, read from the GGUF.
// #included by qwen.cu (it uses the GGUF reader of section 2).
//
// This first version only decodes: token ids -> bytes through the inverse of GPT-2's byte map.
// Encoding text is not implemented yet: pass prompt ids with --tokens.

typedef struct {
    int n_vocab;
    char **piece;    // (n_vocab) decoded bytes of each token
    int *piece_len;  // (n_vocab)
    int *type;       // (n_vocab) token type: 1 normal, 3 control, 4 user-defined, 6 byte...
    int eos_id;      // -1 if absent
} Tokenizer;

// GPT-2's byte map sends every byte to a printable codepoint: 0x21-0x7E, 0xA1-0xAC and 0xAE-0xFF
// map to themselves, the other 68 bytes to U+0100, U+0101, ... in order. Inverse: codepoint -> byte.
static int byte_of_codepoint(int cp) {
    static int inv[324];
    static int ready = 0;
    if (!ready) {
        for (int i = 0; i < 324; i++) inv[i] = -1;
        int next = 256;
        for (int b = 0; b < 256; b++) {
            int self = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
            inv[self ? b : next++] = b;
        }
        ready = 1;
    }
    return cp >= 0 && cp < 324 ? inv[cp] : -1;
}

// Decode one UTF-8 sequence at s (n bytes left); returns its length, or 0 if invalid.
static int utf8_decode(const unsigned char *s, size_t n, int *cp) {
    if (n == 0) return 0;
    if (s[0] < 0x80) { *cp = s[0]; return 1; }
    int len = (s[0] & 0xe0) == 0xc0 ? 2 : (s[0] & 0xf0) == 0xe0 ? 3 : (s[0] & 0xf8) == 0xf0 ? 4 : 0;
    if (len == 0 || (size_t)len > n) return 0;
    int v = s[0] & (0x7f >> len);
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3f);
    }
    *cp = v;
    return len;
}

static void tokenizer_init(Tokenizer *t, const GGUF *g, int n_vocab) {
    memset(t, 0, sizeof *t);
    t->n_vocab = n_vocab;
    t->eos_id = -1;
    t->piece = (char **)xcalloc(n_vocab, sizeof(char *));
    t->piece_len = (int *)xcalloc(n_vocab, sizeof(int));
    t->type = (int *)xcalloc(n_vocab, sizeof(int));
    const GGUFKV *tokens = gguf_find(g, "tokenizer.ggml.tokens");
    if (!tokens || tokens->type != GGUF_TYPE_ARRAY || tokens->arr_type != GGUF_TYPE_STRING) return;
    const GGUFKV *types = gguf_find(g, "tokenizer.ggml.token_type");
    int n = tokens->n < (uint64_t)n_vocab ? (int)tokens->n : n_vocab;
    const uint8_t *p = tokens->data;
    for (int i = 0; i < n; i++) {
        uint64_t len;
        const char *s = gguf_next_str(&p, &len);
        int ty = 1;
        if (types && types->type == GGUF_TYPE_ARRAY && types->arr_type == GGUF_TYPE_I32 && (uint64_t)i < types->n)
            memcpy(&ty, types->data + 4 * (size_t)i, 4);
        t->type[i] = ty;
        char *out = (char *)xmalloc(len + 1);
        int o = 0;
        if (ty == 1) { // normal token: map codepoints back to bytes
            size_t k = 0;
            while (k < len) {
                int cp, b;
                int l = utf8_decode((const unsigned char *)s + k, len - k, &cp);
                if (l == 0 || (b = byte_of_codepoint(cp)) < 0) { // not byte-mapped: keep as is
                    memcpy(out + o, s + k, l ? l : 1);
                    o += l ? l : 1;
                    k += l ? l : 1;
                } else {
                    out[o++] = (char)b;
                    k += l;
                }
            }
        } else {
            memcpy(out, s, len);
            o = (int)len;
        }
        out[o] = 0;
        t->piece[i] = out;
        t->piece_len[i] = o;
    }
    if (gguf_find(g, "tokenizer.ggml.eos_token_id"))
        t->eos_id = (int)gguf_u32(g, "tokenizer.ggml.eos_token_id", 0, 0);
}

static void tokenizer_free(Tokenizer *t) {
    for (int i = 0; i < t->n_vocab; i++) free(t->piece[i]);
    free(t->piece);
    free(t->piece_len);
    free(t->type);
}

// Is this token an end of generation?
static int tokenizer_is_eog(const Tokenizer *t, int id) {
    return id == t->eos_id || (id >= 0 && id < t->n_vocab && t->type[id] == 3 && t->piece[id] &&
                               (strcmp(t->piece[id], "<|im_end|>") == 0 || strcmp(t->piece[id], "<|endoftext|>") == 0));
}

// Write token id's text to f; control tokens are hidden.
static void tokenizer_print(const Tokenizer *t, int id, FILE *f) {
    if (id < 0 || id >= t->n_vocab || !t->piece[id] || t->type[id] == 3) return;
    fwrite(t->piece[id], 1, t->piece_len[id], f);
}

// Text -> ids: not implemented in this version.
static int tokenizer_encode(const Tokenizer *t, const char *text, size_t len, int **ids) {
    (void)t; (void)text; (void)len; (void)ids;
    die("text prompts need the BPE encoder, which this build does not have yet: pass ids with --tokens 1,2,3");
    return 0;
}
