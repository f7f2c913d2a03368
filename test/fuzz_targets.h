// fuzz_targets.h — the coverage-guided fuzz targets: one function per reader of untrusted bytes,
// and the replay of their saved inputs. Included after qwen.cu by
//   test/fuzz_main.cu   the libFuzzer driver (make fuzz-lib): each target on millions of inputs,
//                       with AddressSanitizer and UBSan
//   test/test_qwen.cu   make test: test_fuzz_replays() runs every input kept in test/data/fuzz
//
// The targets, each given one input of bytes:
//   gguf   a model file: gguf_parse, then what loading does (the tokenizer's init,
//          config_from_gguf, weights_from_gguf), --info's printers and the VRAM budget's
//          arithmetic. No GPU, and no tensor data is read: a header without its data gets
//          unreadable pages in their place.
//   vocab  a vocabulary file: tokenizer_init, then a fixed text encoded, decoded, streamed and
//          encoded again, and a chat turn, as the command line does them
//   text   the real Qwen2 vocabulary (NFC, `qwen2` pre-tokenizer) or its `qwen35` variant on fuzzed
//          text: invalid UTF-8, NFC, special tokens, the chat template. Decoding must give the text
//          back (NFC of it for Qwen2), and the streaming printer the decoded bytes.
//   kld    a KL-divergence base file: kld_base_read, then its records decoded and scored
//   args   the command line split at NUL bytes: parse_args, then parse_ids on --detokenize and
//          --tokens. parse_args exists only where qwen.cu is built without TESTING, so test_qwen
//          replays these inputs through the qwen binary instead.
// Besides the sanitizers' reports, a target fails (abort) when a check of its own fails: fz_fail.
//
// die() ends the process. The libFuzzer driver renames exit() in qwen.cu to fuzz_exit, which jumps
// back into the running target (FUZZ_TRY ... FUZZ_END), so an input that ends in a named error is
// simply done; what a target must free after such a jump is in static variables (a longjmp leaves
// the locals of the function that called setjmp indeterminate). The replay runs each input in a
// child process instead, where die() ends the child with status 1: a clean outcome.

#include <dirent.h>
#include <sys/wait.h>

#ifdef FUZZ_CATCH_EXIT // fuzz_main.cu: g_fuzz_jmp, and exit() renamed in qwen.cu
#define FUZZ_TRY                                                                                   \
    {                                                                                              \
        jmp_buf fz_jb_;                                                                            \
        if (setjmp(fz_jb_) == 0) {                                                                 \
            g_fuzz_jmp = &fz_jb_;
#define FUZZ_END                                                                                   \
        }                                                                                          \
        g_fuzz_jmp = NULL;                                                                         \
    }
#else
#define FUZZ_TRY {
#define FUZZ_END }
#endif

// A target's own check failed: say which, and abort (libFuzzer saves the input as a crash).
static void fz_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fuzz check failed: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    abort();
}

// Where the printers' output goes (the targets run their code for the reads, not the text).
static FILE *fz_null(void) {
    static FILE *f;
    if (!f) f = fopen("/dev/null", "w");
    if (!f) f = tmpfile();
    return f;
}

// Is s[0..n) well-formed UTF-8 (RFC 3629: no overlong form, no surrogate, at most U+10FFFF)? Our
// own decoder, written apart from the tokenizer's utf8_to_cps, which it checks.
static int fz_utf8_valid(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t k;
        uint32_t cp, min;
        if (c < 0x80) { i++; continue; }
        if ((c & 0xe0) == 0xc0) k = 1, cp = c & 0x1f, min = 0x80;
        else if ((c & 0xf0) == 0xe0) k = 2, cp = c & 0x0f, min = 0x800;
        else if ((c & 0xf8) == 0xf0) k = 3, cp = c & 0x07, min = 0x10000;
        else return 0;
        if (i + k >= n) return 0; // fewer than k bytes left
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xc0) != 0x80) return 0;
            cp = cp << 6 | (s[i + j] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
        i += k + 1;
    }
    return 1;
}

// s[0..n) as the tokenizer reads it, back in UTF-8: every ill-formed sequence becomes U+FFFD, and
// with nfc, in Unicode's normal form C. malloc'd; its length in *len.
static char *fz_normalize(const char *s, size_t n, int nfc_too, size_t *len) {
    uint32_t *cps = (uint32_t *)xmalloc((n + 1) * 4, "fuzz: code points");
    int m = utf8_to_cps((const unsigned char *)s, n, cps);
    if (nfc_too) {
        uint32_t *norm = (uint32_t *)xmalloc(((size_t)m * NFC_MAX_DECOMP + 1) * 4, "fuzz: NFC");
        m = nfc(cps, m, norm);
        free(cps);
        cps = norm;
    }
    char *out = (char *)xmalloc((size_t)m * 4 + 1, "fuzz: text");
    size_t k = 0;
    for (int i = 0; i < m; i++) k += (size_t)cp_to_utf8(cps[i], out + k);
    out[k] = 0;
    free(cps);
    *len = k;
    return out;
}

static int fz_same(const char *a, size_t na, const char *b, size_t nb) {
    return na == nb && memcmp(a, b, na) == 0;
}

// ---- the tokenizer at work: what --tokenize, --detokenize, generation and --chat do ----

// The ids of one chat turn, as --chat makes them: the template's tags as special tokens, the
// user's text with them or as plain text.
static void fz_chat(const Tokenizer *t, const char *system, const char *user, int first,
                    int no_think, int parse_special) {
    if (t->im_start_id < 0 || t->im_end_id < 0) return; // mode_chat refuses such a vocabulary
    static int *ids;
    free(ids); // left by a die() in the last call
    ids = NULL;
    int n = chat_turn_ids(t, system, user, first, no_think, parse_special, &ids);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= t->n_vocab) fz_fail("chat_turn_ids: id %d", ids[i]);
    free(ids);
    ids = NULL;
}

// Encode text[0..len) and check the ids; decode them (with and without special tokens), stream
// them through the printer, encode the decoded text again. strict (a real vocabulary, which has a
// token for every byte): decoding must give the text back, as the tokenizer reads it (ill-formed
// UTF-8 replaced by U+FFFD; NFC equal where the vocabulary normalizes).
static void fz_tokenize(const Tokenizer *t, const char *text, size_t len, int parse_special,
                        int strict) {
    static int *ids, *ids2;
    static char *dec, *dec0, *streamed, *want, *got;
    free(ids), free(ids2), free(dec), free(dec0), free(streamed), free(want), free(got); // after a
    ids = ids2 = NULL, dec = dec0 = streamed = want = got = NULL; // die() (none: no tokenizer)
    int n = tokenizer_encode(t, text, len, parse_special, &ids);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= t->n_vocab) fz_fail("encode: id %d of %d", ids[i], t->n_vocab);
    size_t dlen, d0len, slen = 0;
    int skip = t->add_bos && t->bos_id >= 0 && n > 0; // the BOS the encoder added
    dec = tokenizer_decode(t, ids + skip, n - skip, 1, &dlen);
    dec0 = tokenizer_decode(t, ids + skip, n - skip, 0, &d0len); // without control tokens
    // the streaming printer: always well-formed UTF-8, and the decoded bytes where they are
    FILE *f = open_memstream(&streamed, &slen);
    if (!f) fz_fail("open_memstream: %s", strerror(errno));
    Stream st;
    memset(&st, 0, sizeof st);
    st.f = f;
    for (int i = skip; i < n; i++) {
        int l;
        const char *p = tokenizer_piece(t, ids[i], 1, &l);
        stream_bytes(&st, p, l);
    }
    stream_flush(&st);
    fclose(f);
    if (!fz_utf8_valid((const unsigned char *)streamed, slen))
        fz_fail("the streaming printer wrote ill-formed UTF-8");
    int valid = fz_utf8_valid((const unsigned char *)dec, dlen);
    if (valid && !fz_same(streamed, slen, dec, dlen))
        fz_fail("the streaming printer changed well-formed text (%zu bytes -> %zu)", dlen, slen);
    if (strict) {
        size_t wl, gl;
        if (!valid) fz_fail("decode(encode(text)) is ill-formed UTF-8");
        want = fz_normalize(text, len, t->nfc, &wl);
        got = fz_normalize(dec, dlen, t->nfc, &gl);
        if (!fz_same(want, wl, got, gl))
            fz_fail("decode(encode(text)) != the text%s: %zu bytes -> %zu", t->nfc ? " (NFC)" : "",
                    wl, gl);
        if (t->nfc) { // NFC is idempotent
            free(got);
            got = fz_normalize(want, wl, 1, &gl);
            if (!fz_same(want, wl, got, gl)) fz_fail("NFC(NFC(text)) != NFC(text)");
        }
        free(want);
        free(got);
        want = got = NULL;
    }
    // the decoded text encoded again (--detokenize's output as the next prompt; where strict, the
    // decoded text is the text, normalized: nothing new)
    int n2 = strict ? 0 : tokenizer_encode(t, dec, dlen, parse_special, &ids2);
    for (int i = 0; i < n2; i++)
        if (ids2[i] < 0 || ids2[i] >= t->n_vocab) fz_fail("re-encode: id %d", ids2[i]);
    free(ids);
    free(ids2);
    free(dec);
    free(dec0);
    free(streamed);
    ids = ids2 = NULL;
    dec = dec0 = streamed = NULL;
}

// ---- GGUF images: the input's bytes, and unreadable pages where its tensor data would be ----

typedef struct {
    void *map;   // NULL: the input itself was parsed
    size_t len;
} FzImage;

#define FZ_MAX_IMAGE ((uint64_t)1 << 40) // 1 TiB of address space at most, never backed

static void fz_unmap(FzImage *img) {
    if (img->map) munmap(img->map, img->len);
    img->map = NULL;
}

// Parse the input as a GGUF file into g. The seeds are headers without their tensor data (the
// fixtures' data are MBs), and so are most inputs: when the only thing wrong is that the data run
// past the end, parse again an image as long as they need: the input's bytes, then pages that
// cannot be read, so that any read of tensor data crashes the run. Returns 0 when g holds a
// parsed file (free with gguf_close, then fz_unmap).
static int fz_gguf_parse(GGUF *g, const uint8_t *data, size_t size, FzImage *img) {
    memset(g, 0, sizeof *g);
    g->fd = -1; // a memory buffer: gguf_close unmaps nothing
    img->map = NULL;
    if (gguf_parse(g, data, size) == 0) return 0;
    // the tensor infos are complete when place_tensors fails: the image's size from them
    int missing = strstr(g->err, "run past the end of the file") ||
                  strstr(g->err, "the data section would start at");
    uint64_t al = missing ? g->alignment : 1, need = (size + al - 1) / al * al;
    for (int64_t i = 0; missing && i < g->n_tensors; i++) {
        uint64_t padded = ((uint64_t)g->tensors[i].nbytes + al - 1) / al * al;
        if (padded > FZ_MAX_IMAGE || need + padded > FZ_MAX_IMAGE) missing = 0;
        need += padded;
    }
    gguf_close(g);
    if (!missing) return -1;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t len = (need + page - 1) / page * page, head = (size + page - 1) / page * page;
    void *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return -1;
    img->map = p;
    img->len = len;
    if (head && mprotect(p, head, PROT_READ | PROT_WRITE) != 0) fz_fail("mprotect");
    memcpy(p, data, size);
    if (head && mprotect(p, head, PROT_READ) != 0) fz_fail("mprotect"); // mapped read-only
    memset(g, 0, sizeof *g);
    g->fd = -1;
    if (gguf_parse(g, (const uint8_t *)p, (size_t)need) == 0) return 0;
    gguf_close(g);
    fz_unmap(img);
    return -1;
}

// ---- the targets ----

// gguf: a model file, loaded as main loads it, and --info.
static int fuzz_gguf(const uint8_t *data, size_t size) {
    static Model m; // static: what a die() jumps out of is freed after the jump
    static FzImage img;
    static Tokenizer tok;
    memset(&m, 0, sizeof m);
    if (fz_gguf_parse(&m.gguf, data, size, &img) != 0) return 0;
    FUZZ_TRY
        char err[300];
        if (tokenizer_init(&tok, &m.gguf, 0, err, sizeof err) == 0) tokenizer_free(&tok);
        print_gguf(&m.gguf); // --info; a vocabulary-only file ends here
        if (m.gguf.n_tensors > 0) {
            model_load(&m);
            const Config *c = &m.c;
            print_model(&m, c->n_ctx_train < 4096 ? c->n_ctx_train : 4096); // the default -c
            // the largest -c the command line lets through (it caps -c at the training context),
            // on a measured card of 16 GiB: the table, and the refusal with its hints
            int n_ctx = c->n_ctx_train;
            Budget b;
            memset(&b, 0, sizeof b);
            budget_compute(&b, &m, n_ctx);
            b.card_total = (size_t)16 << 30;
            b.context = (size_t)400 << 20;
            b.card_free = b.card_total - b.context;
            b.measured = 1;
            budget_print(&b, &m, n_ctx, 0, fz_null());
            if (!budget_fits(&b)) budget_refusal(&b, &m, n_ctx, 0, fz_null());
        }
    FUZZ_END
    tokenizer_free(&tok);
    gguf_close(&m.gguf);
    fz_unmap(&img);
    return 0;
}

// The fixed text of the vocab target: words, contractions, numbers, special-token texts, blanks,
// ill-formed UTF-8, text that NFC recomposes or expands, other scripts, emoji.
static const char FZ_TEXT[] =
    "Hello world, don't I'll WE'VE 12345 3.14 <|im_start|>user\n<think>x</think><|im_end|>\n"
    "<|endoftext|>  \t\n\n  caf\xc3\xa9 cafe\xcc\x81 \xef\xac\x81 \xe0\xbd\xb3\xe0\xa5\x98 "
    "\xea\xb0\x80\xe1\x86\xa8 bad \xff\xfe \xc3 \xed\xa0\x80 \xf4\x90\x80\x80 \xc0\x80 "
    "\xe4\xbd\xa0\xe5\xa5\xbd \xd0\x9f\xd1\x80\xd0\xb8 \xf0\x9f\x98\x80\xf0\x9f\x91\x8d end";

// vocab: a vocabulary file, and the tokenizer built from it at work on the fixed text.
static int fuzz_vocab(const uint8_t *data, size_t size) {
    static GGUF g;
    static FzImage img;
    static Tokenizer tok;
    if (fz_gguf_parse(&g, data, size, &img) != 0) return 0;
    FUZZ_TRY
        char err[300];
        if (tokenizer_init(&tok, &g, 0, err, sizeof err) == 0 && tok.n_vocab > 0) {
            fz_tokenize(&tok, FZ_TEXT, sizeof FZ_TEXT - 1, 1, 0);
            fz_tokenize(&tok, FZ_TEXT, sizeof FZ_TEXT - 1, 0, 0);
            fz_chat(&tok, "Be brief.", FZ_TEXT, 1, 0, 1);
            fz_chat(&tok, NULL, FZ_TEXT, 0, 1, 0);
            // every token's bytes once, as --detokenize prints them
            static int *all;
            int n = tok.n_vocab < 4096 ? tok.n_vocab : 4096;
            all = (int *)xmalloc((size_t)n * sizeof(int), "fuzz: ids");
            for (int i = 0; i < n; i++) all[i] = i;
            size_t len;
            free(tokenizer_decode(&tok, all, n, 1, &len));
            free(all);
            all = NULL;
        }
    FUZZ_END
    tokenizer_free(&tok);
    gguf_close(&g);
    fz_unmap(&img);
    return 0;
}

// text: the first byte's bits choose what is done with the rest
enum {
    FZ_PRE35 = 1,    // the vocabulary with the qwen35 pre-tokenizer (no NFC); else Qwen2's
    FZ_SPECIAL = 2,  // special tokens parsed (the default of the command line)
    FZ_CHAT = 4,     // also a chat turn, with the text up to its first NUL as the user's line
    FZ_FIRST = 8,    // ... the first turn
    FZ_NO_THINK = 16,
    FZ_SYSTEM = 32,  // ... and the text after that NUL as the system prompt
    FZ_REPEAT = 64,  // a text of at most 256 bytes 32 times over: long texts from short inputs
                     // (for what depends on length, such as a turn's ids against its bytes)
};
static GGUF fz_vocab_file[2];
static Tokenizer fz_vocab_tok[2];
static int fz_text_ready = 0;

// Load the two real vocabularies of the text target (DATA/tokenizer/); 0 when both load.
static int fuzz_text_init(const char *data_dir) {
    static const char *const NAMES[2] = {"vocab-qwen2.gguf", "vocab-qwen2-pre35.gguf"};
    for (int k = 0; k < 2 && !fz_text_ready; k++) {
        char path[1024], err[300];
        snprintf(path, sizeof path, "%s/tokenizer/%s", data_dir, NAMES[k]);
        if (gguf_open(&fz_vocab_file[k], path) != 0) {
            fprintf(stderr, "fuzz text: %s\n", fz_vocab_file[k].err);
            return -1;
        }
        if (tokenizer_init(&fz_vocab_tok[k], &fz_vocab_file[k], 0, err, sizeof err) != 0) {
            fprintf(stderr, "fuzz text: %s: %s\n", path, err);
            return -1;
        }
    }
    fz_text_ready = 1;
    return 0;
}

static int fuzz_text(const uint8_t *data, size_t size) {
    if (!fz_text_ready) fz_fail("fuzz_text_init was not called, or failed");
    if (size < 1) return 0;
    static char *text; // NUL-terminated copy: the chat turn takes C strings
    int flags = data[0], times = flags & FZ_REPEAT && size <= 257 ? 32 : 1;
    size_t len = (size - 1) * times;
    text = (char *)xmalloc(len + 2, "fuzz: text");
    for (int i = 0; i < times; i++) memcpy(text + i * (size - 1), data + 1, size - 1);
    text[len] = text[len + 1] = 0;
    const Tokenizer *t = &fz_vocab_tok[flags & FZ_PRE35];
    FUZZ_TRY
        fz_tokenize(t, text, len, (flags & FZ_SPECIAL) != 0, 1);
        if (flags & FZ_CHAT) {
            size_t ul = strlen(text);
            const char *system = (flags & FZ_SYSTEM) && ul < len ? text + ul + 1 : NULL;
            fz_chat(t, system, text, (flags & FZ_FIRST) != 0, (flags & FZ_NO_THINK) != 0,
                    (flags & FZ_SPECIAL) != 0);
        }
    FUZZ_END
    free(text);
    text = NULL;
    return 0;
}

// kld: a base file, read as --kl-divergence reads it, with a model vocabulary of the size its
// header names (else nothing past the header is read); then its records decoded and scored.
static int fuzz_kld(const uint8_t *data, size_t size) {
    static int fd = -1;
    static char path[64];
    static KldBase b;
    static double *lpb, *lp;
    if (fd < 0) { // the input goes to a file in memory: kld_base_read takes a path
        fd = memfd_create("fuzz-kld", 0);
        if (fd < 0) fz_fail("memfd_create: %s", strerror(errno));
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size)
        fz_fail("writing the input to %s: %s", path, strerror(errno));
    int32_t nv = 0;
    if (size >= 16) memcpy(&nv, data + 12, 4);
    int n_vocab = nv >= 1 && nv <= MAX_VOCAB ? nv : 151936;
    char err[600];
    FUZZ_TRY
        if (kld_base_read(&b, path, n_vocab, err, sizeof err) == 0) {
            size_t first = b.n_ctx / 2, per_chunk = b.n_ctx - 1 - first;
            size_t n_rec = (size_t)b.n_chunk * per_chunk, words = kld_record_words(b.n_vocab);
            lpb = (double *)xmalloc((size_t)b.n_vocab * sizeof(double), "fuzz: kld");
            lp = (double *)xmalloc((size_t)b.n_vocab * sizeof(double), "fuzz: kld");
            for (int i = 0; i < b.n_vocab; i++) lp[i] = -log((double)b.n_vocab);
            for (size_t r = 0; r < n_rec && r < 256; r++) {
                kld_decode(b.records + r * words, b.n_vocab, lpb);
                (void)kld_position(lpb, lp, b.n_vocab);
            }
        }
    FUZZ_END
    free(lpb);
    free(lp);
    free(b.data);
    lpb = lp = NULL;
    b.data = NULL;
    return 0;
}

// args: argv[1..] are the input's fields between NUL bytes (an empty input: no arguments). The
// value of -f/--file is replaced by /dev/null: a fuzzer must not read the files of this machine
// (parse_args reads the prompt file), and would block on /dev/stdin. Fills argv (argv[0] is
// "qwen") from a malloc'd copy in *buf; returns argc.
#define FZ_MAX_ARGS 256
static int fz_split_args(const uint8_t *data, size_t size, char **buf, char **argv) {
    *buf = (char *)xmalloc(size + 1, "fuzz: argv");
    memcpy(*buf, data, size);
    (*buf)[size] = 0;
    int argc = 0;
    argv[argc++] = (char *)"qwen";
    for (size_t i = 0; size > 0 && i <= size && argc < FZ_MAX_ARGS; i += strlen(*buf + i) + 1)
        argv[argc++] = *buf + i;
    for (int i = 1; i + 1 < argc; i++) {
        const char *v = argv[i + 1];
        int option_like = v[0] == '-' && (isalpha((unsigned char)v[1]) || (v[1] == '-' && v[2]));
        if ((!strcmp(argv[i], "-f") || !strcmp(argv[i], "--file")) && !option_like)
            argv[i + 1] = (char *)"/dev/null";
    }
    argv[argc] = NULL;
    return argc;
}

#ifndef TESTING
static int fuzz_args(const uint8_t *data, size_t size) {
    static char *buf;
    static int *ids;
    static Args a;
    char *argv[FZ_MAX_ARGS + 1];
    int argc = fz_split_args(data, size, &buf, argv);
    FUZZ_TRY
        parse_args(&a, argc, argv);
        // the id lists, as --detokenize and --tokens read them
        if (a.detok_arg) {
            parse_ids("--detokenize", a.detok_arg, &ids);
            free(ids);
            ids = NULL;
        }
        if (a.tokens_arg) parse_ids("--tokens", a.tokens_arg, &ids);
    FUZZ_END
    free(ids);
    free(a.prompt_buf);
    free(buf);
    ids = NULL;
    a.prompt_buf = NULL;
    buf = NULL;
    return 0;
}
#endif

// ---- the replay (make test) ----
#ifdef TESTING

// Inputs kept in test/data/fuzz whose bug is not fixed in qwen.cu yet: listed here (target/file
// and the fix), they are skipped rather than failed. Remove an entry once its fix is in.
static const char *const FUZZ_XFAIL[][2] = {
    {NULL, NULL},
};

// Replay one input in a child process: 0 when it ends cleanly (exit 0, or exit 1 with an
// "error: " line), else 1 with why it did not. The args target runs the qwen binary (QWEN).
static int fz_replay_one(const char *target, int (*fn)(const uint8_t *, size_t), const char *path,
                         char *why, size_t cap) {
    size_t size;
    char *data = read_file(path, &size);
    if (!data) { snprintf(why, cap, "cannot read it"); return 1; }
    char err_path[128]; // in the tests' temporary folder (test_qwen.cu)
    snprintf(err_path, sizeof err_path, "%s/fuzz_replay_XXXXXX", TMP);
    int err_fd = mkstemp(err_path);
    if (err_fd < 0) { free(data); snprintf(why, cap, "mkstemp failed"); return 1; }
    unlink(err_path);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        int null_fd = open("/dev/null", O_RDWR);
        dup2(null_fd, 0);
        dup2(null_fd, 1);
        dup2(err_fd, 2);
        alarm(30); // a hang is a finding too
        if (!fn) { // args: through the binary, its argv[0] the binary's path
            char *buf, *argv[FZ_MAX_ARGS + 1];
            fz_split_args((const uint8_t *)data, size, &buf, argv);
            argv[0] = (char *)QWEN;
            execv(QWEN, argv);
            _exit(127);
        }
        fn((const uint8_t *)data, size);
        _exit(0);
    }
    free(data);
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid) {
        close(err_fd);
        snprintf(why, cap, "fork failed");
        return 1;
    }
    char text[4096];
    ssize_t n = pread(err_fd, text, sizeof text - 1, 0);
    close(err_fd);
    text[n > 0 ? n : 0] = 0;
    int named = !strncmp(text, "error: ", 7) || strstr(text, "\nerror: ");
    if (WIFEXITED(st) && (WEXITSTATUS(st) == 0 || (WEXITSTATUS(st) == 1 && named))) return 0;
    // the first line that says what went wrong
    const char *line = strstr(text, "ERROR: ");
    if (!line) line = strstr(text, "runtime error: ");
    if (!line) line = strstr(text, "fuzz check failed: ");
    if (!line) line = text;
    int ll = (int)strcspn(line, "\n");
    if (WIFSIGNALED(st))
        snprintf(why, cap, "%s %s: %.*s", target, strsignal(WTERMSIG(st)), ll > 200 ? 200 : ll,
                 line);
    else
        snprintf(why, cap, "%s exit %d: %.*s", target, WEXITSTATUS(st), ll > 200 ? 200 : ll,
                 line);
    return 1;
}

static int fz_cmp_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

// Every input of test/data/fuzz/<target>/ (the findings of make fuzz-lib: each a bug that must
// stay fixed) and of test/data/fuzz/seeds/<target>/ (the seed corpora), through its target in a
// child process: each must end in a clean accept or a named error. Call it before anything
// touches the GPU: the children are forked, and CUDA does not survive a fork.
static void test_fuzz_replays(void) {
    const char *data_dir = getenv("QWEN_TEST_DATA") ? getenv("QWEN_TEST_DATA") : DATA;
    struct {
        const char *name;
        int (*fn)(const uint8_t *, size_t);
    } targets[] = {{"gguf", fuzz_gguf}, {"vocab", fuzz_vocab}, {"text", fuzz_text},
                   {"kld", fuzz_kld}, {"args", NULL}};
    char vocab[1024];
    snprintf(vocab, sizeof vocab, "%s/tokenizer/vocab-qwen2.gguf", data_dir);
    for (size_t k = 0; k < sizeof targets / sizeof targets[0]; k++) {
        const char *tn = targets[k].name;
        char check_name[160];
        snprintf(check_name, sizeof check_name, "fuzz replay: %s", tn);
        if (!strcmp(tn, "text") &&
            (!need_fixture(vocab, check_name) || fuzz_text_init(data_dir) != 0)) {
            if (access(vocab, R_OK) == 0) check(0, check_name);
            continue;
        }
        if (!strcmp(tn, "args") && access(QWEN, X_OK) != 0) {
            check(0, "fuzz replay: args (the qwen binary is built)");
            continue;
        }
        int n_files = 0, n_found = 0, n_bad = 0, n_xfail = 0;
        for (int seeds = 0; seeds < 2; seeds++) {
            char dir[1024];
            snprintf(dir, sizeof dir, "%s/fuzz/%s%s", data_dir, seeds ? "seeds/" : "", tn);
            DIR *d = opendir(dir);
            if (!d) continue;
            char *names[4096];
            int nn = 0;
            for (struct dirent *e; (e = readdir(d)) && nn < 4096;)
                if (e->d_name[0] != '.') names[nn++] = strdup(e->d_name);
            closedir(d);
            qsort(names, (size_t)nn, sizeof *names, fz_cmp_names);
            for (int i = 0; i < nn; i++) {
                char path[2048], rel[512], why[512];
                snprintf(path, sizeof path, "%s/%s", dir, names[i]);
                snprintf(rel, sizeof rel, "%s/%s", tn, names[i]);
                const char *fix = NULL;
                for (size_t x = 0; !seeds && FUZZ_XFAIL[x][0]; x++)
                    if (!strcmp(FUZZ_XFAIL[x][0], rel)) fix = FUZZ_XFAIL[x][1];
                free(names[i]);
                if (fix) {
                    char sk[700];
                    snprintf(sk, sizeof sk, "fuzz replay: %s", rel);
                    skip(sk, fix);
                    n_xfail++;
                    continue;
                }
                n_files++;
                n_found += !seeds;
                if (fz_replay_one(tn, targets[k].fn, path, why, sizeof why)) {
                    printf("     %s: %s\n", path, why);
                    n_bad++;
                }
            }
        }
        snprintf(check_name, sizeof check_name,
                 "fuzz replay: %s, %d inputs (%d findings kept) -> clean accept or named error",
                 tn, n_files, n_found);
        if (n_files == 0 && n_xfail == 0) skip(check_name, "no inputs in test/data/fuzz");
        else check(n_bad == 0, check_name);
    }
}
#endif // TESTING
