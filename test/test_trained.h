// test_trained.h — the trained tiny models (test/data/trained) against transformers, the reference
// definition of the math. Included by test_qwen.cu after its helpers (report, run_seq, ...).
//
// Two models trained with transformers' own classes on public-domain English (test/train/): qwen3
// (tied output) and qwen35 (3 DeltaNet : 1 gated attention, untied). Their F16 files hold exactly
// the weights transformers computed its references with, in float64 on the CPU: the logits of the
// held-out sample's first 128 tokens ({arch}-ref.f32), a 32-token greedy continuation and the
// sample's perplexity ({arch}-ref.txt). Trained weights are where the engine's shortcuts are
// stressed (the fp16 KV cache, the 16-bit activations, the prefill's fp16 operands): learned
// attention patterns, peaked softmaxes, activation outliers. The CPU pass holds the exact path to
// transformers and ranks the quantized files by KL divergence; the GPU pass holds both GPU paths
// (token by token, and the batched prompt) to the exact logits of every file.
//
// The quantized files (Q4_0, IQ4_XS) are not committed: make builds them from the F16 files with
// test/quantize. quantized.sha256 (sha256sum's format) records the sha256 of the files the
// figures in README.md and test/PERF_NOTES.md were measured on; the made files must match it, and
// so must what test/quantize makes of the F16 file in this run.

static const char *const TRAINED[2] = {"qwen3", "qwen35"};
static const char *const TRAINED_TYPES[3] = {"f16", "q4_0", "iq4_xs"};

// SHA-256 (FIPS 180-4) of p[0..n) in hex: 64 lowercase digits and a NUL.
static void sha256_hex(const uint8_t *p, size_t n, char hex[65]) {
    static const uint32_t K[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1,
        0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3,
        0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
        0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
        0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147,
        0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
        0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
        0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
        0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208,
        0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
    uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                     0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
#define ROR(x, r) ((x) >> (r) | (x) << (32 - (r)))
    // the whole blocks of p, then one or two blocks of the tail, 0x80, zeros and the bit length
    size_t full = n / 64 * 64, tail_n = n - full, nb = full / 64 + (tail_n < 56 ? 1 : 2);
    uint8_t tail[128] = {0};
    memcpy(tail, p + full, tail_n);
    tail[tail_n] = 0x80;
    uint64_t bits = (uint64_t)n * 8;
    for (int i = 0; i < 8; i++) tail[(nb - full / 64) * 64 - 1 - i] = (uint8_t)(bits >> (8 * i));
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *q = b < full / 64 ? p + 64 * b : tail + 64 * (b - full / 64);
        uint32_t w[64], v[8];
        for (int i = 0; i < 16; i++)
            w[i] = (uint32_t)q[4 * i] << 24 | (uint32_t)q[4 * i + 1] << 16 |
                   (uint32_t)q[4 * i + 2] << 8 | q[4 * i + 3];
        for (int i = 16; i < 64; i++) {
            uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
            uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16] + s0 + w[i - 7] + s1;
        }
        memcpy(v, h, sizeof v);
        for (int i = 0; i < 64; i++) {
            uint32_t e = v[4], a = v[0];
            uint32_t ch = (e & v[5]) ^ (~e & v[6]), maj = (a & v[1]) ^ (a & v[2]) ^ (v[1] & v[2]);
            uint32_t t1 = v[7] + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ch + K[i] + w[i];
            uint32_t t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + maj;
            memmove(v + 1, v, 7 * sizeof v[0]);
            v[4] += t1;
            v[0] = t1 + t2;
        }
        for (int i = 0; i < 8; i++) h[i] += v[i];
    }
#undef ROR
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", (unsigned)(h[i / 4] >> (24 - 8 * (i % 4))) & 0xff);
}

// The sha256 that a sha256sum-format list ("HEX  NAME" per line) records for name, or "".
static void recorded_sha256(const char *list, const char *name, char hex[65]) {
    hex[0] = 0;
    size_t k = strlen(name);
    for (const char *p = list; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        const char *f = p + 64;
        if (strspn(p, "0123456789abcdef") != 64 || f[0] != ' ') continue;
        if (f[1] != ' ' && f[1] != '*') continue;
        if (strncmp(f + 2, name, k) || (f[2 + k] != '\n' && f[2 + k] != 0)) continue;
        memcpy(hex, p, 64);
        hex[64] = 0;
        return;
    }
}

// Does the file at path have the sha256 that quantized.sha256 (list) records for its name? One
// check: a missing file, a name the list lacks and another sum each fail, with a line saying
// which (and what to do: if_missing, if_other).
static void check_sha256(const char *list, const char *path, const char *check_name,
                         const char *if_missing, const char *if_other) {
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    char want[65], got[65] = "";
    recorded_sha256(list ? list : "", base, want);
    size_t n = 0;
    char *data = read_file(path, &n);
    int have = data != NULL;
    if (have) sha256_hex((const uint8_t *)data, n, got);
    free(data);
    int ok = have && want[0] && !strcmp(got, want);
    if (!have) printf("     %s is missing: %s\n", path, if_missing);
    else if (!want[0]) printf("     quantized.sha256 records no sum for %s\n", base);
    else if (!ok)
        printf("     %s: sha256 %s, quantized.sha256 records %s: %s\n", path, got, want, if_other);
    check(ok, check_name);
}

// The value of "key value" in a reference file's text (a malloc'd copy), or NULL.
static char *ref_value(const char *text, const char *key) {
    size_t k = strlen(key);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (strncmp(p, key, k) || p[k] != ' ') continue;
        const char *v = p + k + 1, *e = strchr(v, '\n');
        size_t n = e ? (size_t)(e - v) : strlen(v);
        char *out = (char *)xmalloc(n + 1, "a test");
        memcpy(out, v, n);
        out[n] = 0;
        return out;
    }
    return NULL;
}

// Every row's logits of ids[0..n) on the CPU path: the exact logits of a quantized file.
static float *cpu_logits(Model *m, const int *ids, int n) {
    Engine e;
    engine_init(&e, m, 0, n);
    int V = m->c.n_vocab;
    float *out = (float *)xmalloc((size_t)n * V * 4, "a test");
    for (int i = 0; i < n; i++) memcpy(out + (size_t)i * V, engine_forward(&e, ids[i], i), (size_t)V * 4);
    engine_free(&e);
    return out;
}

// CPU: tokenizer, exact logits, greedy, perplexity against transformers; the quantized files
// reproduced by test/quantize and ranked by KL divergence against the F16 base.
static void test_trained_cpu(const char *arch, const char *dir, const char *sample, size_t sample_len,
                             const int *sample_ids, int n_sample) {
    char f16[600], path[600], name[300], err[300];
    snprintf(f16, sizeof f16, "%s/%s-f16.gguf", dir, arch);
    Model m;
    model_open(&m, f16);
    // the tokenizer: the file's vocabulary (Qwen's cut to 8192 ids) gives tokenizers' ids
    Tokenizer tok;
    memset(&tok, 0, sizeof tok);
    int *ids = NULL, n = -1;
    if (tokenizer_init(&tok, &m.gguf, 0, err, sizeof err) == 0) n = tokenizer_encode(&tok, sample, sample_len, 0, &ids);
    snprintf(name, sizeof name, "trained %s: --tokenize of the held-out sample (%d tokens) = tokenizers' ids", arch, n_sample);
    check(n == n_sample && same_ids(ids, n, sample_ids, n_sample), name);
    free(ids);
    // exact logits: the CPU path against transformers' float64, the sample's first 128 tokens
    snprintf(path, sizeof path, "%s/%s-ref.f32", dir, arch);
    size_t rn = 0;
    float *ref = read_f32(path, &rn);
    int V = m.c.n_vocab, P = ref ? (int)(rn / V) : 0;
    Seq s = {"sample", (int *)sample_ids, P};
    Engine e;
    engine_init(&e, &m, 0, 512);
    SeqResult r = ref && P <= n_sample ? run_seq(&e, &s, ref, rn, NULL) : (SeqResult){0, 0, 0, 0};
    snprintf(name, sizeof name, "trained %s-f16: cpu logits vs transformers float64 (%d positions, KL %.2g): max|d|/std",
             arch, P, r.kl_mean);
    report(r.ok && P == 128 && r.max_over_std <= 2e-4, name, r.ok ? r.max_over_std : NAN, 2e-4);
    engine_free(&e);
    // greedy: 32 tokens after a fixed prompt, as transformers chose them
    snprintf(path, sizeof path, "%s/%s-ref.txt", dir, arch);
    char *reftxt = read_file(path, NULL), *prompt = reftxt ? ref_value(reftxt, "greedy_prompt") : NULL;
    char *gids = reftxt ? ref_value(reftxt, "greedy_ids") : NULL, *ppl_s = reftxt ? ref_value(reftxt, "sample_ppl_c256") : NULL;
    int *want = NULL, nw = gids ? parse_ids("greedy_ids", gids, &want) : 0, same = 0;
    if (prompt && nw == 32 && tok.n_vocab) {
        int *pids, np = tokenizer_encode(&tok, prompt, strlen(prompt), 0, &pids);
        engine_init(&e, &m, 0, np + 32);
        float *lg = NULL;
        for (int i = 0; i < np; i++) lg = engine_forward(&e, pids[i], i);
        for (int i = 0; i < 32; i++) {
            int t = argmax(lg, V);
            if (t != want[i]) break;
            same++;
            if (i < 31) lg = engine_forward(&e, t, np + i);
        }
        engine_free(&e);
        free(pids);
    }
    snprintf(name, sizeof name, "trained %s-f16: cpu greedy 32 tokens = transformers': tokens before the first difference", arch);
    report(nw == 32 && same == 32, name, 32 - same, 0);
    // perplexity of the sample, chunks of 256 with the second half scored, as llama-perplexity does;
    // the same pass writes the KL-divergence base of the quantized files
    int n_ctx = 256, n_chunk = n_sample / n_ctx;
    char base[300];
    snprintf(base, sizeof base, "%s/trained_%s.kld", TMP, arch);
    FILE *bf = fopen(base, "wb");
    if (!bf) die("test: cannot write %s", base);
    engine_init(&e, &m, 0, n_ctx);
    kld_base_write_header(bf, n_ctx, V, n_chunk, sample_ids);
    PplResult pr = perplexity(&e, sample_ids, n_chunk, n_ctx, bf, NULL, 0);
    fclose(bf);
    engine_free(&e);
    double want_ppl = ppl_s ? atof(ppl_s) : NAN, d = fabs(pr.ppl - want_ppl) / want_ppl;
    snprintf(name, sizeof name, "trained %s-f16: --perplexity -c 256 of the sample (%.4f) vs transformers' (%.4f): rel. diff",
             arch, pr.ppl, want_ppl);
    report(d <= 5e-3, name, d, 5e-3);
    // the quantized files: test/quantize makes Q4_0 and IQ4_XS with the recorded sha256 (the
    // bytes of the files that make builds, and that the figures were measured on), and a Q8_0;
    // against the F16 base, Q8_0 is closer than both 4-bit files
    snprintf(path, sizeof path, "%s/quantized.sha256", dir);
    char *sums = read_file(path, NULL);
    KldBase kb;
    int have_base = kld_base_read(&kb, base, V, err, sizeof err) == 0;
    const char *types[3] = {"q8_0", "q4_0", "iq4_xs"};
    double kld[3] = {NAN, NAN, NAN};
    for (int t = 0; t < 3; t++) {
        char made[400], cmd[1600];
        // named as in dir: quantized.sha256 lists the files by name
        snprintf(made, sizeof made, "%s/%s-%s.gguf", TMP, arch, types[t]);
        snprintf(cmd, sizeof cmd, "%s %s %s %s >/dev/null 2>&1", QUANTIZE, f16, made, types[t]);
        int rc = system(cmd);
        if (t > 0) {
            snprintf(name, sizeof name,
                     "trained %s-%s: test/quantize of the F16 file has the recorded sha256", arch,
                     types[t]);
            check_sha256(sums, made, name, "test/quantize failed",
                         "test/quantize writes other bytes now; if on purpose, record the new sums "
                         "(sha256sum) and measure the figures again");
        }
        if (rc == 0 && have_base) {
            Model mq;
            model_open(&mq, made);
            Engine eq;
            engine_init(&eq, &mq, 0, n_ctx);
            PplResult q = perplexity(&eq, sample_ids, 2, n_ctx, NULL, &kb, 0); // 2 chunks: 254 positions
            kld[t] = q.kld_mean;
            printf("info trained %s-%s against the f16 base (2 chunks of the sample): KLD %.6f, PPL %.3f (f16 %.3f), same top %.1f %%\n",
                   arch, types[t], q.kld_mean, q.ppl, q.ppl_base, 100 * q.same_top);
            engine_free(&eq);
            gguf_close(&mq.gguf);
        }
        unlink(made);
    }
    snprintf(name, sizeof name, "trained %s: KLD against the F16 base ranks Q8_0 (%.2g) below Q4_0 (%.2g) and IQ4_XS (%.2g)", arch,
             kld[0], kld[1], kld[2]);
    check(kld[0] > 0 && kld[0] < kld[1] && kld[0] < kld[2] && kld[1] < 1 && kld[2] < 1, name);
    if (have_base) free(kb.data);
    unlink(base);
    free(ref); free(reftxt); free(prompt); free(gids); free(ppl_s); free(want); free(sums);
    if (tok.n_vocab) tokenizer_free(&tok);
    gguf_close(&m.gguf);
}

// GPU: both GPU paths of every trained file against its exact logits (transformers' for F16, the
// CPU path's for the quantized files), the sample's first 128 tokens.
static void test_trained_gpu(const char *arch, const char *dir, const int *sample_ids, int n_sample) {
    char path[600], name[300];
    snprintf(path, sizeof path, "%s/%s-ref.f32", dir, arch);
    size_t rn = 0;
    float *ref16 = read_f32(path, &rn);
    for (int t = 0; t < 3; t++) {
        snprintf(path, sizeof path, "%s/%s-%s.gguf", dir, arch, TRAINED_TYPES[t]);
        if (!HAVE_GPU) {
            snprintf(name, sizeof name, "gpu trained %s-%s: decode and -b 512 KL vs the exact logits", arch, TRAINED_TYPES[t]);
            skip(name, "no GPU");
            continue;
        }
        if (!need_fixture(path, "trained models") || !ref16) continue;
        Model m;
        model_open(&m, path);
        int V = m.c.n_vocab, P = (int)(rn / V);
        if (P > n_sample) P = n_sample;
        Seq s = {"sample", (int *)sample_ids, P};
        float *exact = t == 0 ? ref16 : cpu_logits(&m, sample_ids, P);
        float *tok = (float *)xmalloc((size_t)P * V * 4, "a test");
        Engine e;
        engine_init(&e, &m, 1, 512);
        SeqResult r = run_seq(&e, &s, exact, (size_t)P * V, tok);
        double tol = t == 0 ? 5e-5 : 1e-3, kr = NAN, kt = NAN, t1 = 0;
        snprintf(name, sizeof name, "gpu trained %s-%s: decode KL vs the exact logits (%s, top1 %.0f%%)", arch, TRAINED_TYPES[t],
                 t == 0 ? "transformers float64" : "the CPU path", 100 * r.top1);
        report(r.ok && r.kl_mean <= tol, name, r.ok ? r.kl_mean : NAN, tol);
        if (r.ok) run_seq_prompt(&e, &s, exact, tok, &kr, &kt, &t1);
        snprintf(name, sizeof name, "gpu trained %s-%s: -b 512 prompt KL vs the exact logits (top1 vs decode %.0f%%)", arch,
                 TRAINED_TYPES[t], 100 * t1);
        double tol_b = t == 0 ? 2e-4 : 1e-3; // the products' fp16 operands (qwen.cu section 8)
        report(r.ok && kr <= tol_b, name, kr, tol_b);
        engine_free(&e);
        free(tok);
        if (t > 0) free(exact);
        gguf_close(&m.gguf);
    }
    free(ref16);
}

// The quantized files that make builds in dir (the ones the GPU pass, run.sh and the README use)
// have the sha256 that quantized.sha256 records. A missing one fails: make builds them.
static void test_trained_made(const char *arch, const char *dir) {
    char path[600], name[300], *sums;
    snprintf(path, sizeof path, "%s/quantized.sha256", dir);
    if (!need_fixture(path, "trained: quantized.sha256 (the quantized files' sha256)")) return;
    sums = read_file(path, NULL);
    for (int t = 1; t < 3; t++) {
        snprintf(path, sizeof path, "%s/%s-%s.gguf", dir, arch, TRAINED_TYPES[t]);
        snprintf(name, sizeof name, "trained %s-%s.gguf (made by make) has the recorded sha256",
                 arch, TRAINED_TYPES[t]);
        check_sha256(sums, path, name, "make builds it from the F16 file (make trained)",
                     "delete it, and make trained makes it again");
    }
    free(sums);
}

// The bytes of the regular files under dir, its subdirectories included, except the quantized
// files that make builds (*-q4_0.gguf, *-iq4_xs.gguf): what the repository holds of the models.
static long long trained_bytes(const char *dir) {
    DIR *dp = opendir(dir);
    if (!dp) return -1;
    long long sum = 0;
    struct dirent *de;
    while ((de = readdir(dp)) != NULL) {
        if (de->d_name[0] == '.') continue;
        char path[800];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        struct stat st;
        if (stat(path, &st) != 0) continue;
        size_t n = strlen(de->d_name);
        int made = (n > 10 && !strcmp(de->d_name + n - 10, "-q4_0.gguf")) ||
                   (n > 12 && !strcmp(de->d_name + n - 12, "-iq4_xs.gguf"));
        if (S_ISDIR(st.st_mode)) sum += trained_bytes(path);
        else if (S_ISREG(st.st_mode) && !made) sum += st.st_size;
    }
    closedir(dp);
    return sum;
}

static void test_trained(int use_gpu) {
    static int made_checked = 0; // once, in the first pass that runs (the GPU-only run has one)
    char dir[400], path[600];
    snprintf(dir, sizeof dir, "%s/trained", DATA);
    snprintf(path, sizeof path, "%s/sample.txt", dir);
    if (!need_fixture(path, "trained models: the held-out sample")) return;
    if (!use_gpu) { // the repository's budget for the models, their references and dumps
        long long b = trained_bytes(dir);
        char name[160];
        snprintf(name, sizeof name, "trained: test/data/trained holds %.2f MB (the made quantized "
                 "files left out): at most 60 MB", b / 1e6);
        check(b > 0 && b <= 60000000, name);
    }
    size_t sample_len = 0;
    char *sample = read_file(path, &sample_len), *idtext;
    snprintf(path, sizeof path, "%s/sample-ids.txt", dir);
    idtext = read_file(path, NULL);
    int *ids = NULL, n = idtext ? parse_ids("sample-ids", idtext, &ids) : 0;
    for (int a = 0; a < 2; a++) {
        snprintf(path, sizeof path, "%s/%s-f16.gguf", dir, TRAINED[a]);
        if (!need_fixture(path, "trained models")) continue;
        if (!made_checked) test_trained_made(TRAINED[a], dir);
        if (use_gpu) test_trained_gpu(TRAINED[a], dir, ids, n);
        else test_trained_cpu(TRAINED[a], dir, sample, sample_len, ids, n);
    }
    made_checked = 1;
    free(sample); free(idtext); free(ids);
}
