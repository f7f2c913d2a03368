// test_hidden.h — --dump-hidden and --diff-hidden (included by test_qwen.cu).
//
// The tool must name the right place when a port goes wrong. The ports here are the trained models
// with one planted bug each, against the clean file's --cpu dump (what transformers computes, to
// the 1e-5 that test/gpu_hidden.sh measures):
//   - one weight of layer 3's attn_q: with the intermediates, Qcur-3 diverges first, at token 0;
//     with the residual stream alone, l_out-3, at token 1 (at token 0 the attention has one key,
//     so its output is v whatever q is);
//   - a wrong rope.freq_base: Qcur-0 first, and token 0 is clean (RoPE turns it by angle 0);
//   - qwen35's layer 1 ssm_a (head 0's set to 0, no decay): layer 1's DeltaNet diverges first
//     (its gate, at token 0), but its output only from token 1 (the state it decays is zero at
//     token 0): l_out-1 at token 1;
//   - the last layer's ffn_down, with --diff-inject: only that layer's row is over the threshold;
//   - a NaN weight in layer 2's ffn_down: ffn_out-2 at token 0 (a NaN is an error, never a pass).
// Then every kind of bad input, and on the GPU, both paths against --cpu on every fixture.
// Layer numbers, counts and widths come from the files (hidden_shape), so that retrained models of
// other shapes run the same checks.

// A copy of model `src` at `dst` with the bytes at [at, at + n) of tensor `tensor` (or of the
// value of metadata key `key`) replaced by `bytes`.
static void plant(const char *src, const char *dst, const char *tensor, const char *key, size_t at,
                  const void *bytes, size_t n) {
    GGUF g;
    if (gguf_open(&g, src) != 0) die("test: %s", g.err);
    const uint8_t *p = NULL;
    if (tensor) {
        const GGUFTensor *t = gguf_tensor(&g, tensor);
        if (!t || at + n > t->nbytes) die("test: no tensor %s in %s", tensor, src);
        p = t->data;
    } else {
        const GGUFKV *kv = gguf_find(&g, key);
        if (!kv) die("test: no key %s in %s", key, src);
        p = kv->data;
    }
    size_t off = (size_t)(p - g.base) + at, len = g.size;
    uint8_t *copy = (uint8_t *)xmalloc(len, "a test");
    memcpy(copy, g.base, len);
    memcpy(copy + off, bytes, n);
    write_file(dst, copy, len);
    free(copy);
    gguf_close(&g);
}

// The first tensor over the threshold and its token, as the report names them ("Qcur-3", 0), from
// the output of a --diff-hidden run; 0 when there is none.
static int hidden_first(const char *out, char *name, size_t cap, int *token) {
    const char *p = strstr(out, "first tensor over --diff-max-rel");
    if (!p || !(p = strchr(p, ':')) || !strncmp(p, ": none", 6)) return 0;
    int n = 0;
    p += 2;
    while (p[n] && p[n] != ' ' && n + 1 < (int)cap) name[n] = p[n], n++;
    name[n] = 0;
    const char *t = strstr(p, "first at token ");
    *token = t ? atoi(t + 15) : -1;
    return 1;
}

// One row of a --diff-out table: the relative error of `tensor` and its first token over the
// threshold (-1: none); 0 when the table has no such row.
static int hidden_row(const char *tsv_path, const char *tensor, double *rel, int *first) {
    char *t = read_file(tsv_path, NULL), key[80];
    if (!t) return 0;
    snprintf(key, sizeof key, "\t%s\t", tensor);
    const char *p = strstr(t, key);
    int ok = 0;
    if (p) { // path, tensor, layer, rel, cosine, max_d, max_token, max_channel, growth, first
        const char *f = p + strlen(key);
        int col = 2;
        *rel = -1;
        for (; *f && *f != '\n'; f++) {
            if (col == 3 && f[-1] == '\t') *rel = atof(f);
            if (col == 9 && f[-1] == '\t') *first = atoi(f), ok = 1;
            if (*f == '\t') col++;
        }
    }
    free(t);
    return ok;
}

// The largest relative error of a tensor and of a token's row per tensor kind (the name without
// its layer) and path (0: decode or the only one, 1: the batched pass), from a --diff-out file,
// folded into kinds[0 .. *n_kinds). -1: no row of that kind and path yet.
typedef struct { char kind[40]; double rel[2], row[2]; } HiddenKind;
static void hidden_kinds_add(const char *tsv, HiddenKind *kinds, int *n_kinds, int cap) {
    char *t = read_file(tsv, NULL), *save = NULL;
    // path, tensor, layer, rel_err, cosine, max_abs_d, max_token, max_channel, growth,
    // first_token_over, row_rel_err, row_token
    for (char *line = t ? strtok_r(t, "\n", &save) : NULL; line;
         line = strtok_r(NULL, "\n", &save)) {
        char *col[12];
        int nc = 0;
        for (char *c = line; nc < 12; c++) {
            col[nc++] = c;
            c = strchr(c, '\t');
            if (!c) break;
            *c = 0;
        }
        if (nc < 12 || !strcmp(col[0], "path")) continue;
        int path = strstr(col[0], "batched") != NULL;
        char kind[40];
        snprintf(kind, sizeof kind, "%s", col[1]);
        char *dash = strrchr(kind, '-');
        if (dash && dash[1] >= '0' && dash[1] <= '9') *dash = 0;
        int k = 0;
        while (k < *n_kinds && strcmp(kinds[k].kind, kind)) k++;
        if (k == *n_kinds) {
            if (k == cap) continue;
            snprintf(kinds[k].kind, sizeof kinds[k].kind, "%s", kind);
            kinds[k].rel[0] = kinds[k].rel[1] = kinds[k].row[0] = kinds[k].row[1] = -1;
            (*n_kinds)++;
        }
        kinds[k].rel[path] = worse(kinds[k].rel[path], atof(col[3]));
        kinds[k].row[path] = worse(kinds[k].row[path], atof(col[10]));
    }
    free(t);
}

// The held-out sample's first n ids, "1,2,3" (ids: cap bytes); 0 when its file cannot be read.
static int sample_ids(int n, char *ids, size_t cap) {
    char path[600];
    snprintf(path, sizeof path, "%s/trained/sample-ids.txt", DATA);
    char *all = read_file(path, NULL);
    if (!all) return 0;
    int k = 0, commas = 0;
    for (; all[k] && commas < n && k < (int)cap - 1; k++) commas += all[k] == ',';
    snprintf(ids, cap, "%.*s", k - 1, all);
    free(all);
    return 1;
}

// What the checks below need of a model's shape: its layers, its width, and how many tensors a
// dump of every tensor holds in the layers (an attention layer 10, or 11 with qwen35's output
// gate; a DeltaNet layer 16).
typedef struct { int n_layer, n_embd, in_layers; } HiddenShape;

static HiddenShape hidden_shape(const char *path) {
    Model m;
    model_open(&m, path);
    HiddenShape h = {m.c.n_layer, m.c.n_embd, 0};
    for (int l = 0; l < m.c.n_layer; l++)
        h.in_layers += m.c.kind[l] == LAYER_DELTANET ? 16 : m.c.arch == ARCH_QWEN35 ? 11 : 10;
    gguf_close(&m.gguf);
    return h;
}

// src with the placeholders of test_hidden's bad-input cases filled in from h, into dst.
static void hidden_fill(char *dst, size_t cap, const char *src, const HiddenShape *h) {
    char v[5][16];
    const char *pat[5] = {"HALFW", "TWOW", "WIDTH", "NLAYER", "BADL"};
    snprintf(v[0], 16, "%d", h->n_embd / 2);
    snprintf(v[1], 16, "%d", 2 * h->n_embd);
    snprintf(v[2], 16, "%d", h->n_embd);
    snprintf(v[3], 16, "%d", h->n_layer);
    snprintf(v[4], 16, "%d", h->n_layer + 3);
    snprintf(dst, cap, "%s", src);
    for (int k = 0; k < 5; k++)
        while (strstr(dst, pat[k])) subst(dst, cap, pat[k], v[k]);
}

static void test_hidden(void) {
    static char q3[512], q35[512], ids[512], out[1 << 17], cmd[3072];
    snprintf(q3, sizeof q3, "%s/trained/qwen3-f16.gguf", DATA);
    snprintf(q35, sizeof q35, "%s/trained/qwen35-f16.gguf", DATA);
    if (!need_fixture(q3, "hidden: the trained models") || !need_fixture(q35, "hidden")) return;
    // the held-out sample's first 16 tokens, and its first 32 (against transformers)
    char path[600], ids32[1024];
    if (!sample_ids(16, ids, sizeof ids) || !sample_ids(32, ids32, sizeof ids32)) {
        check(0, "hidden: the sample's ids");
        return;
    }
    HiddenShape h3 = hidden_shape(q3), h35 = hidden_shape(q35);
    if (h3.n_layer < 4) die("test: the trained qwen3 has %d layers; the checks need 4", h3.n_layer);
    char d3[256], d35[256], bad[256], tsv[256];
    snprintf(d3, sizeof d3, "%s/hidden-q3", TMP);
    snprintf(d35, sizeof d35, "%s/hidden-q35", TMP);
    snprintf(bad, sizeof bad, "%s/hidden-bad.gguf", TMP);
    snprintf(tsv, sizeof tsv, "%s/hidden.tsv", TMP);
    // the clean files' dumps, every tensor
    for (int a = 0; a < 2; a++) {
        snprintf(cmd, sizeof cmd, "%s -m %s --cpu --tokens %s --dump-hidden %s --hidden-filter "
                 "'.*' 2>&1", QWEN, a ? q35 : q3, ids, a ? d35 : d3);
        int rc = run_cmd(cmd, out, sizeof out);
        snprintf(path, sizeof path, "%s/manifest.tsv", a ? d35 : d3);
        char *man = read_file(path, NULL);
        int rows = 0;
        for (char *p = man; p && *p; p++) rows += *p == '\n';
        // the layers' tensors, and 3 outside them: inp_embd, result_norm, result_output
        int want = (a ? h35 : h3).in_layers + 3;
        char name[160];
        snprintf(name, sizeof name, "hidden: --dump-hidden of trained %s, every tensor (%d files "
                 "and the manifest's rows)", a ? "qwen35" : "qwen3", want);
        check(rc == 0 && man && rows == want + 1, name);
        if (rc || rows != want + 1) printf("     rc=%d rows=%d: %.400s\n", rc, rows, out);
        free(man);
    }
    // a dump against itself: every error exactly 0 (a metric that is not 0 here hides a bias)
    snprintf(cmd, sizeof cmd, "%s -m %s --cpu --tokens %s --diff-hidden %s --hidden-filter '.*' "
             "2>&1", QWEN, q35, ids, d35);
    int rc = run_cmd(cmd, out, sizeof out);
    check(rc == 0 && strstr(out, "largest relative error: 0 ") &&
          strstr(out, "largest of a token's row: 0 ") && strstr(out, "result: PASS"),
          "hidden: a dump against itself: every relative error 0, every row's too, PASS");

    // Against transformers: test/gpu_hidden.sh's float64 dumps (stored as float32) of every tensor
    // for the sample's first 32 tokens, from checkpoints rebuilt from these F16 files; the logits
    // are left out (the -ref.f32 files hold them). --cpu is within 1e-5 of every tensor. qwen3
    // holds every token's row to 1e-5 too. qwen35's rows are held to 4e-5: transformers' L2 norm
    // is x * rsqrt(sum x^2 + eps), the GGUF one x / max(|x|, eps), which differ by eps / (2 sum
    // x^2), 1.6e-5 where sum x^2 is smallest (0.0315, q of token 0 in layer 0); the delta rule's
    // output at token 0 is v (k . q), which takes both q's and k's share.
    for (int a = 0; a < 2; a++)
        for (int inject = 0; inject < 2; inject++) {
            char ref[512], man[600];
            snprintf(ref, sizeof ref, "%s/trained/hidden-%s", DATA, a ? "qwen35" : "qwen3");
            snprintf(man, sizeof man, "%s/manifest.tsv", ref);
            if (!need_fixture(man, "hidden: trained --cpu against transformers")) continue;
            unlink(tsv);
            snprintf(cmd, sizeof cmd, "%s -m %s --cpu --tokens %s --diff-hidden %s --hidden-filter "
                     "'.*' --diff-max-rel %s %s --diff-out %s 2>&1", QWEN, a ? q35 : q3, ids32,
                     ref, a ? "4e-5" : "1e-5", inject ? "--diff-inject" : "", tsv);
            rc = run_cmd(cmd, out, sizeof out);
            const char *lg = strstr(out, "largest relative error: ");
            double largest = lg ? atof(lg + 24) : INFINITY;
            const char *lr = strstr(out, "largest of a token's row: ");
            if (lr) printf("info %.*s\n", (int)strcspn(lr, "\n"), lr);
            // every tensor but the logits: the layers' and 2 (inp_embd, result_norm)
            int rows = 0;
            for (const char *p = out; (p = strstr(p, "  cpu\n")) != NULL; p++) rows++;
            int want = (a ? h35 : h3).in_layers + 2;
            char name[200];
            snprintf(name, sizeof name, "hidden: trained %s --cpu against transformers%s, %d "
                     "tensors (largest relative error of a tensor)", a ? "qwen35" : "qwen3",
                     inject ? " (--diff-inject)" : "", want);
            int ok = rc == 0 && rows == want && strstr(out, "result: PASS");
            report(ok && largest <= 1e-5, name, largest, 1e-5);
            if (!ok) printf("     rc=%d rows=%d\n%.3000s\n", rc, rows, out);
            if (a || inject) continue;
            // --diff-out's rows by tensor kind (what the GPU check tabulates): 12 kinds, and
            // their largest errors are the report's, to its 3 digits
            HiddenKind kinds[32];
            int n_kinds = 0;
            hidden_kinds_add(tsv, kinds, &n_kinds, 32);
            double k_rel = -1, k_row = -1;
            for (int k = 0; k < n_kinds; k++)
                k_rel = worse(k_rel, kinds[k].rel[0]), k_row = worse(k_row, kinds[k].row[0]);
            double row = lr ? atof(lr + 26) : INFINITY;
            check(n_kinds == 12 && fabs(k_rel - largest) <= 5e-3 * largest &&
                  fabs(k_row - row) <= 5e-3 * row && kinds[0].rel[1] == -1,
                  "hidden: --diff-out's rows per tensor kind: 12 kinds, the report's largest "
                  "errors");
        }

    // the planted bugs (the last layer's names from the file)
    char last_ffn[48], last_out[16];
    snprintf(last_ffn, sizeof last_ffn, "blk.%d.ffn_down.weight", h3.n_layer - 1);
    snprintf(last_out, sizeof last_out, "l_out-%d", h3.n_layer - 1);
    struct {
        const char *what, *model, *tensor, *key; size_t at; float v32; int f16;
        const char *filter, *extra, *want; int token;
    } bugs[] = {
        {"attn_q of layer 3, one weight: every tensor", q3, "blk.3.attn_q.weight", NULL, 0, 1.0f,
         1, ".*", "", "Qcur-3", 0},
        {"attn_q of layer 3, one weight: the residual stream", q3, "blk.3.attn_q.weight", NULL, 0,
         1.0f, 1, NULL, "", "l_out-3", 1},
        {"rope.freq_base 1e4 for 1e6", q3, NULL, "qwen3.rope.freq_base", 0, 1e4f, 0, ".*", "",
         "Qcur-0", 1},
        {"qwen35 ssm_a of layer 1, head 0 set to 0: every tensor", q35, "blk.1.ssm_a", NULL, 0, 0,
         0, ".*", "", "gate-1", 0},
        {"qwen35 ssm_a of layer 1, head 0 set to 0: the residual stream", q35, "blk.1.ssm_a", NULL,
         0, 0, 0, NULL, "", "l_out-1", 1},
        {"ffn_down of the last layer, one weight, --diff-inject", q3, last_ffn, NULL, 0, 1.0f, 1,
         NULL, "--diff-inject", last_out, 0},
        {"a NaN weight in layer 2's ffn_down", q3, "blk.2.ffn_down.weight", NULL, 0, NAN, 1, ".",
         "", "ffn_out-2", 0},
    };
    for (int b = 0; b < (int)(sizeof bugs / sizeof bugs[0]); b++) {
        uint8_t bytes[4];
        if (bugs[b].key) memcpy(bytes, &bugs[b].v32, 4);
        else if (bugs[b].f16) { __half h = __float2half(bugs[b].v32); memcpy(bytes, &h, 2); }
        else { // ssm_a[0] = 0: head 0's state never decays (g = 0)
            float a0 = 0.0f;
            memcpy(bytes, &a0, 4);
        }
        plant(bugs[b].model, bad, bugs[b].tensor, bugs[b].key, bugs[b].at, bytes,
              bugs[b].key || !bugs[b].f16 ? 4 : 2);
        char filt[64] = "";
        if (bugs[b].filter) snprintf(filt, sizeof filt, "--hidden-filter '%s'", bugs[b].filter);
        snprintf(cmd, sizeof cmd, "%s -m %s --cpu --tokens %s --diff-hidden %s %s %s --diff-out %s "
                 "2>&1", QWEN, bad, ids, bugs[b].model == q3 ? d3 : d35, filt, bugs[b].extra, tsv);
        rc = run_cmd(cmd, out, sizeof out);
        char first[64] = "";
        int token = -1, found = hidden_first(out, first, sizeof first, &token);
        int ok = rc == 1 && found && !strcmp(first, bugs[b].want) && token == bugs[b].token;
        double rel = 0;
        int ft = 0;
        if (b == 2) // the same run: Kcur-0 too, from token 1
            ok &= hidden_row(tsv, "Kcur-0", &rel, &ft) && ft == 1;
        if (b == 3) // the DeltaNet's output is clean at token 0
            ok &= hidden_row(tsv, "attn_output-1", &rel, &ft) && ft == 1;
        if (b == 5) // each layer fed their input: the layers before it are exact, only it is off
            for (int l = 0; l < h3.n_layer - 1; l++) {
                char nm[16];
                snprintf(nm, sizeof nm, "l_out-%d", l);
                ok &= hidden_row(tsv, nm, &rel, &ft) && rel == 0 && ft == -1;
            }
        char name[200];
        snprintf(name, sizeof name, "hidden: planted bug, %s -> %s at token %d", bugs[b].what,
                 bugs[b].want, bugs[b].token);
        check(ok, name);
        if (!ok)
            printf("     rc=%d first=%s token=%d rel=%g ft=%d\n%.3000s\n", rc, first, token, rel,
                   ft, out);
        unlink(bad);
        unlink(tsv);
    }

    // bad input: one line and exit 1, each
    char theirs[256], npy[300];
    snprintf(theirs, sizeof theirs, "%s/hidden-theirs", TMP);
    mkdir(theirs, 0777);
    float *zero = (float *)calloc((size_t)16 * 2 * h3.n_embd, sizeof(float));
#define MANIFEST "file\tlayer\tname\tshape\ttransformers\twritten_by\n"
    // in the texts, shapes and messages: WIDTH, HALFW and TWOW are the trained qwen3's width, half
    // of it and twice it; NLAYER its layer count, BADL a layer past its last
    struct { const char *what, *file, *text, *descr, *shape; const char *args, *expect; }
    cases[] = {
        {"a missing directory", NULL, NULL, NULL, NULL, "--diff-hidden /nonexistent/dir",
         "no such directory"},
        {"a manifest with more layers", "manifest.tsv",
         MANIFEST "l_out-BADL.npy\tBADL\tl_out-BADL\t16,WIDTH\t-\tx\n",
         NULL, NULL, "--diff-hidden THEIRS", "names l_out-BADL, but this model has NLAYER layers"},
        {"a manifest of another width", "manifest.tsv",
         MANIFEST "l_out-0.npy\t0\tl_out-0\t16,TWOW\t-\tx\n",
         NULL, NULL, "--diff-hidden THEIRS",
         "l_out-0 has TWOW values per token; this model's has WIDTH"},
        {"a .npy of the wrong shape", "l_out-0.npy", NULL, "'<f4'", "(16, HALFW)",
         "--diff-hidden THEIRS", "has the shape (16, HALFW); this model's l_out-0 is (16, WIDTH)"},
        {"a .npy of the wrong dtype", "l_out-0.npy", NULL, "'<i4'", "(16, WIDTH)",
         "--diff-hidden THEIRS", "dtype '<i4'"},
        {"fewer tokens than the prompt", "l_out-0.npy", NULL, "'<f4'", "(8, WIDTH)",
         "--diff-hidden THEIRS", "holds 8 tokens; the prompt has 16"},
        {"--diff-inject without their residual stream", "l_out-0.npy", NULL, "'<f4'", "(16, WIDTH)",
         "--diff-hidden THEIRS --diff-inject", "inp_embd.npy is missing"},
        {"--diff-inject without --diff-hidden", NULL, NULL, NULL, NULL,
         "--dump-hidden THEIRS --diff-inject", "it needs --diff-hidden THEIRS"},
        {"a filter that matches nothing", NULL, NULL, NULL, NULL,
         "--dump-hidden THEIRS --hidden-filter nothing", "matches no tensor"},
        {"no prompt", NULL, NULL, NULL, NULL, "--dump-hidden THEIRS NOIDS",
         "needs a prompt"},
        {"a FIFO for a .npy (it would block)", "FIFO", NULL, NULL, NULL, "--diff-hidden THEIRS",
         "is not a regular file"},
        {"a count regcomp cannot take", NULL, NULL, NULL, NULL,
         "--dump-hidden THEIRS --hidden-filter '(.*){1,32767}'", "a count above 64"},
        {"a manifest's shape that is not sizes", "manifest.tsv",
         MANIFEST "l_out-0.npy\t0\tl_out-0\t16,abc\t-\tx\n", NULL, NULL,
         "--diff-hidden THEIRS", "is not sizes such as 64,256"},
        {"the dump into their directory", NULL, NULL, NULL, NULL,
         "--dump-hidden THEIRS --diff-hidden THEIRS", "their files would be overwritten"},
        {"--diff-out without a comparison", NULL, NULL, NULL, NULL,
         "--dump-hidden THEIRS --diff-out THEIRS/x.tsv", "it needs --diff-hidden"},
        {"-c, which the prompt sizes", NULL, NULL, NULL, NULL, "--dump-hidden THEIRS -c 64",
         "does not apply"},
    };
    int good = 1, nc = (int)(sizeof cases / sizeof cases[0]);
    for (int c = 0; c < nc; c++) {
        char f[400], args[300], text[300], shape[64], expect[200];
        int r = 0, c2 = 0;
        hidden_fill(text, sizeof text, cases[c].text ? cases[c].text : "", &h3);
        hidden_fill(shape, sizeof shape, cases[c].shape ? cases[c].shape : "", &h3);
        hidden_fill(expect, sizeof expect, cases[c].expect, &h3);
        sscanf(shape, "(%d, %d)", &r, &c2);
        snprintf(cmd, sizeof cmd, "rm -f %s/*", theirs);
        if (system(cmd) != 0) die("test: rm");
        if (cases[c].file && !strcmp(cases[c].file, "FIFO")) {
            snprintf(f, sizeof f, "%s/l_out-0.npy", theirs);
            if (mkfifo(f, 0666) != 0) die("test: mkfifo %s", f);
        } else if (cases[c].file) {
            snprintf(f, sizeof f, "%s/%s", theirs, cases[c].file);
            if (cases[c].text) write_file(f, text, strlen(text));
            else write_npy(f, cases[c].descr, "False", shape, zero, (size_t)r * c2 * 4);
        }
        snprintf(args, sizeof args, "%s", cases[c].args);
        for (int k = 0; k < 3; k++) subst(args, sizeof args, "THEIRS", theirs);
        int noids = strstr(args, "NOIDS") != NULL;
        subst(args, sizeof args, " NOIDS", "");
        snprintf(cmd, sizeof cmd, "%s -m %s --cpu %s%s %s 2>&1", QWEN, q3, noids ? "" : "--tokens ",
                 noids ? "" : ids, args);
        rc = run_cmd(cmd, out, sizeof out);
        const char *e = strstr(out, "error:");
        int one_line = e && strchr(e, '\n') && !strchr(e, '\n')[1];
        int ok = rc == 1 && e && one_line && strstr(out, expect);
        if (!ok) printf("     case '%s': rc=%d: %.400s\n", cases[c].what, rc, out);
        good &= ok;
    }
    snprintf(npy, sizeof npy, "hidden: %d kinds of bad input -> a one-line error naming it, exit 1",
             nc);
    check(good, npy);
    // a filter without the logits (their slot stays empty), and transformers' leading batch of 1
    snprintf(cmd, sizeof cmd, "rm -f %s/*", theirs);
    if (system(cmd) != 0) die("test: rm");
    snprintf(cmd, sizeof cmd, "%s -m %s --cpu --tokens %s --dump-hidden %s --hidden-filter Qcur "
             "2>&1 && ls %s | wc -l", QWEN, q3, ids, theirs, theirs);
    rc = run_cmd(cmd, out, sizeof out);
    char want_n[32], qname[100];
    snprintf(want_n, sizeof want_n, "%d tensors", h3.n_layer);
    snprintf(qname, sizeof qname, "hidden: --hidden-filter Qcur: %d files and the manifest (no "
             "logits)", h3.n_layer);
    check(rc == 0 && strstr(out, want_n) && atoi(strrchr(out, ')') + 1) == h3.n_layer + 1, qname);
    snprintf(cmd, sizeof cmd, "rm -f %s/*", theirs);
    if (system(cmd) != 0) die("test: rm");
    snprintf(npy, sizeof npy, "%s/l_out-0.npy", theirs);
    char shape3[32];
    snprintf(shape3, sizeof shape3, "(1, 16, %d)", h3.n_embd);
    write_npy(npy, "'<f4'", "False", shape3, zero, (size_t)16 * h3.n_embd * 4);
    snprintf(cmd, sizeof cmd, "%s -m %s --cpu --tokens %s --diff-hidden %s 2>&1", QWEN, q3, ids,
             theirs);
    rc = run_cmd(cmd, out, sizeof out);
    check(rc == 1 && strstr(out, "  l_out-0 ") && strstr(out, "result: FAIL") &&
          !strstr(out, "\nerror: "), "hidden: a .npy of shape (1, n_tokens, width) is read");
    free(zero);
}

// GPU: both paths against the exact C path, tensor by tensor, on every fixture and the trained
// models (--diff-hidden cpu, every tensor the GPU writes), the largest relative error per path.
static void test_hidden_gpu(void) {
    static const char *names[] = {"gpu hidden: --diff-hidden cpu, both paths, every model"};
    if (SKIP_ALL_WITHOUT_GPU(names)) return;
    static char out[1 << 18], cmd[2048];
    const char *dirs[] = {"tiny-qwen2", "tiny-qwen3", "tiny-qwen35", "trained"};
    int n_files = 0, good = 1, n_kinds = 0;
    double worst[2] = {0, 0}, worst_row[2] = {0, 0};
    // per tensor kind (the name without its layer), over every file: the largest relative error
    // of a tensor and of a token's row, for each path (from --diff-out's rows)
    HiddenKind kinds[64];
    char tsv[256];
    snprintf(tsv, sizeof tsv, "%s/self-diff.tsv", TMP);
    for (int d = 0; d < 4; d++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/%s", DATA, dirs[d]);
        DIR *dp = opendir(dir);
        if (!dp) continue;
        for (struct dirent *e; (e = readdir(dp)) != NULL;) {
            size_t n = strlen(e->d_name);
            if (n < 5 || strcmp(e->d_name + n - 5, ".gguf")) continue;
            unlink(tsv);
            snprintf(cmd, sizeof cmd, "%s -m %s/%s --tokens 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,"
                     "16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32 --diff-hidden cpu "
                     "--hidden-filter '.*' --diff-out %s 2>&1", QWEN, dir, e->d_name, tsv);
            int rc = run_cmd(cmd, out, sizeof out);
            const char *p = out;
            for (int path = 0; path < 2; path++) {
                p = strstr(p, "largest relative error: ");
                double r = p ? atof(p + 24) : INFINITY;
                if (p) p += 24;
                const char *q = p ? strstr(p, "largest of a token's row: ") : NULL;
                double row = q ? atof(q + 26) : INFINITY;
                printf("info gpu hidden %-32s %s: largest relative error %.3g, %.*s\n",
                       e->d_name, path ? "batched" : "decode ", r, q ? (int)strcspn(q, "\n") : 0,
                       q ? q : "");
                worst[path] = worse(worst[path], r);
                worst_row[path] = worse(worst_row[path], row);
            }
            hidden_kinds_add(tsv, kinds, &n_kinds, 64);
            if (rc != 0) { // the verdict's lines
                printf("     %s: rc=%d\n", e->d_name, rc);
                for (const char *l = out; *l; l += strcspn(l, "\n") + (l[strcspn(l, "\n")] != 0))
                    if (!strncmp(l, "largest", 7) || !strncmp(l, "first tensor", 12) ||
                        !strncmp(l, "error", 5) || !strncmp(l, "result", 6))
                        printf("     %.*s\n", (int)strcspn(l, "\n"), l);
                good = 0;
            }
            n_files++;
        }
        closedir(dp);
    }
    for (int k = 0; k < n_kinds; k++) // -1: the path does not write it
        printf("info gpu hidden, every file, %-24s decode %9.3g (a row %9.3g)  batched %9.3g "
               "(a row %9.3g)\n", kinds[k].kind, kinds[k].rel[0], kinds[k].row[0],
               kinds[k].rel[1], kinds[k].row[1]);
    char name[200];
    snprintf(name, sizeof name, "gpu hidden: --diff-hidden cpu on %d files, PASS: decode %.2g "
             "(a row %.2g), batched %.2g (a row %.2g)", n_files, worst[0], worst_row[0], worst[1],
             worst_row[1]);
    check(good && n_files > 0, name);
}
