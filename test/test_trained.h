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

static const char *const TRAINED[2] = {"qwen3", "qwen35"};
static const char *const TRAINED_TYPES[3] = {"f16", "q4_0", "iq4_xs"};

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
    // the quantized files: test/quantize makes the committed Q4_0 and IQ4_XS again, byte for byte,
    // and a Q8_0; against the F16 base, Q8_0 is closer than both 4-bit files
    KldBase kb;
    int have_base = kld_base_read(&kb, base, V, err, sizeof err) == 0;
    const char *types[3] = {"q8_0", "q4_0", "iq4_xs"};
    double kld[3] = {NAN, NAN, NAN};
    for (int t = 0; t < 3; t++) {
        char made[400], committed[600], cmd[1600];
        snprintf(made, sizeof made, "%s/trained_%s-%s.gguf", TMP, arch, types[t]);
        snprintf(committed, sizeof committed, "%s/%s-%s.gguf", dir, arch, types[t]);
        snprintf(cmd, sizeof cmd, "%s %s %s %s >/dev/null 2>&1", QUANTIZE, f16, made, types[t]);
        int rc = system(cmd);
        if (t > 0) {
            size_t l1 = 0, l2 = 0;
            char *a = rc == 0 ? read_file(made, &l1) : NULL, *b = read_file(committed, &l2);
            snprintf(name, sizeof name, "trained %s-%s: test/quantize of the F16 file gives the committed file, byte for byte", arch, types[t]);
            check(a && b && l1 == l2 && !memcmp(a, b, l1), name);
            free(a); free(b);
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
    free(ref); free(reftxt); free(prompt); free(gids); free(ppl_s); free(want);
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
        report(r.ok && kr <= tol, name, kr, tol);
        engine_free(&e);
        free(tok);
        if (t > 0) free(exact);
        gguf_close(&m.gguf);
    }
    free(ref16);
}

static void test_trained(int use_gpu) {
    char dir[400], path[600];
    snprintf(dir, sizeof dir, "%s/trained", DATA);
    snprintf(path, sizeof path, "%s/sample.txt", dir);
    if (!need_fixture(path, "trained models: the held-out sample")) return;
    size_t sample_len = 0;
    char *sample = read_file(path, &sample_len), *idtext;
    snprintf(path, sizeof path, "%s/sample-ids.txt", dir);
    idtext = read_file(path, NULL);
    int *ids = NULL, n = idtext ? parse_ids("sample-ids", idtext, &ids) : 0;
    for (int a = 0; a < 2; a++) {
        snprintf(path, sizeof path, "%s/%s-f16.gguf", dir, TRAINED[a]);
        if (!need_fixture(path, "trained models")) continue;
        if (use_gpu) test_trained_gpu(TRAINED[a], dir, ids, n);
        else test_trained_cpu(TRAINED[a], dir, sample, sample_len, ids, n);
    }
    free(sample); free(idtext); free(ids);
}
