// gen_model.cu — writes a synthetic Qwen GGUF with the exact tensor names, shapes, types and
// metadata of a real model, filled with random, finite, realistically scaled weights. Used to
// benchmark full-size models anywhere (real weights are not needed to measure speed or memory).
//
//   test/gen_model --model qwen3.6-27b --ftype iq4_xs -o models/q36-27b-iq4_xs.gguf
//   test/gen_model --model qwen2.5-32b --ftype q4_0 --layers 4 -o small.gguf     (fewer layers)
//   ... --vocab test/data/tokenizer/vocab-qwen2.gguf     (copy a real tokenizer; padded to n_vocab)
//
// Type mixes follow llama-quantize without an imatrix (its choice of type per tensor):
//   q4_0:   every 2-D weight Q4_0, output.weight Q6_K
//   iq4_xs: every 2-D weight IQ4_XS, output.weight Q6_K, attn_v Q5_K when n_head/n_head_kv >= 4,
//           DeltaNet attn_qkv Q5_K, ffn_down Q5_K in layers < n_layer/8
//   iq4_nl: as iq4_xs, with IQ4_NL in place of IQ4_XS
//   q8_0:   every 2-D weight Q8_0, output.weight too
//   q4_k_m: every 2-D weight Q4_K, output.weight Q6_K, attn_v and ffn_down Q6_K in the layers that
//           llama-quantize gives more bits (the first and last eighth, and every third between),
//           DeltaNet attn_qkv Q5_K
//   q4_k_s: every 2-D weight Q4_K, output.weight Q6_K, attn_v Q5_K in the first 4 attention
//           layers, ffn_down Q5_K in layers < n_layer/8
//   q5_k_m: as q4_k_m, with Q5_K in place of Q4_K
//   q6_k:   every 2-D weight Q6_K
//   q4_1, q5_0, q5_1: every 2-D weight of that type, output.weight Q6_K
//   f16, bf16, f32: every 2-D weight of that type, output.weight too
// 1-D tensors, norms and ssm_conv1d stay F32. The files carry everything llama.cpp's loader reads,
// so the same file can be timed in both engines.
//
// Built by `make test/gen_model`; it includes qwen.cu for the block layouts and the type table.

#define TESTING
#include "../qwen.cu"
#include "gguf_write.h"

#include <pthread.h>

typedef struct {
    const char *name, *arch;
    int n_embd, n_ff, n_layer, n_head, n_head_kv, head_dim, n_vocab, n_ctx_train;
    float rope_base, eps;
    int tied;
    // qwen35 only
    int n_rot, ssm_conv, ssm_state, ssm_v_heads, ssm_k_heads, attn_interval;
} Preset;

// Shapes from the models' published configs.
static const Preset PRESETS[] = {
    {"qwen3.6-27b", "qwen35", 5120, 17408, 64, 24, 4, 256, 248320, 262144, 1e7f, 1e-6f, 0, 64, 4, 128, 48, 16, 4},
    {"qwen2.5-32b", "qwen2", 5120, 27648, 64, 40, 8, 128, 152064, 32768, 1e6f, 1e-5f, 0},
    {"qwen3-32b", "qwen3", 5120, 25600, 64, 64, 8, 128, 151936, 40960, 1e6f, 1e-6f, 0},
    {"qwen3-8b", "qwen3", 4096, 12288, 36, 32, 8, 128, 151936, 40960, 1e6f, 1e-6f, 0},
    {"qwen2.5-7b", "qwen2", 3584, 18944, 28, 28, 4, 128, 152064, 32768, 1e6f, 1e-6f, 0},
    {"qwen3-0.6b", "qwen3", 1024, 3072, 28, 16, 8, 128, 151936, 40960, 1e6f, 1e-6f, 1},
};

// One tensor to write: name, shape, type, how to fill it.
typedef enum { FILL_WEIGHT, FILL_NORM, FILL_BIAS, FILL_CONV, FILL_SSM_A, FILL_DT_BIAS } Fill;
typedef struct {
    char name[GGUF_MAX_NAME];
    int n_dims;
    int64_t ne[2];
    int type;
    Fill fill;
    size_t nbytes;
    uint64_t offset; // in the data blob
} Spec;

static Spec *specs = NULL;
static int n_specs = 0, cap_specs = 0;

static void add(const char *name, int64_t ne0, int64_t ne1, int type, Fill fill) {
    if (n_specs == cap_specs) {
        cap_specs = cap_specs ? 2 * cap_specs : 256;
        specs = (Spec *)realloc(specs, cap_specs * sizeof(Spec));
    }
    Spec *s = &specs[n_specs++];
    snprintf(s->name, sizeof s->name, "%s", name);
    s->n_dims = ne1 > 0 ? 2 : 1;
    s->ne[0] = ne0;
    s->ne[1] = ne1 > 0 ? ne1 : 1;
    s->type = type;
    s->fill = fill;
    s->nbytes = row_bytes(type, ne0) * s->ne[1];
}

// --- random blocks --------------------------------------------------------------------------------
static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static float frand(uint64_t *s) { return (splitmix(s) >> 40) / 16777216.0f; }          // [0, 1)
static float grand(uint64_t *s) {                                                      // ~N(0, 1)
    float u1 = frand(s) + 1e-7f, u2 = frand(s);
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}
static uint16_t to_fp16(float f) {
    __half_raw r = __float2half(f);
    return r.x;
}

// Fill n blocks of a quantized type: random quant bits, scales chosen so the weights have a standard
// deviation near `std` (0.02, as in trained Qwen layers).
static void fill_blocks(int type, uint8_t *dst, size_t n_blocks, uint64_t seed, float std) {
    uint64_t s = seed;
    size_t tsz = TYPE_TRAITS[type].type_size;
    for (size_t i = 0; i < n_blocks * tsz; i += 8) {
        uint64_t r = splitmix(&s);
        memcpy(dst + i, &r, n_blocks * tsz - i < 8 ? n_blocks * tsz - i : 8);
    }
    for (size_t b = 0; b < n_blocks; b++) {
        uint8_t *blk = dst + b * tsz;
        float jitter = 0.75f + 0.5f * frand(&s);
        if (type == GGML_TYPE_Q4_0) {            // d * (q - 8), q uniform: std 4.6 d
            uint16_t d = to_fp16(std / 4.6f * jitter);
            memcpy(blk, &d, 2);
        } else if (type == GGML_TYPE_Q8_0) {     // d * q, q uniform in [-128, 127]: std 73.9 d
            uint16_t d = to_fp16(std / 73.9f * jitter);
            memcpy(blk, &d, 2);
        } else if (type == GGML_TYPE_Q4_1) {     // d * q + m, q uniform in [0, 15]: std 4.6 d
            float d = std / 4.6f * jitter;
            uint16_t h[2] = {to_fp16(d), to_fp16(-7.5f * d)};
            memcpy(blk, h, 4);
        } else if (type == GGML_TYPE_Q5_0) {     // d * (q5 - 16): std 9.2 d
            uint16_t d = to_fp16(std / 9.2f * jitter);
            memcpy(blk, &d, 2);
        } else if (type == GGML_TYPE_Q5_1) {     // d * q5 + m
            float d = std / 9.2f * jitter;
            uint16_t h[2] = {to_fp16(d), to_fp16(-15.5f * d)};
            memcpy(blk, h, 4);
        } else if (type == GGML_TYPE_F16) {      // one value a block, uniform: std * sqrt(12) wide
            uint16_t v = to_fp16(std * 3.464f * (frand(&s) - 0.5f));
            memcpy(blk, &v, 2);
        } else if (type == GGML_TYPE_BF16) {     // the float's top 16 bits
            float f = std * 3.464f * (frand(&s) - 0.5f);
            uint32_t u;
            memcpy(&u, &f, 4);
            uint16_t v = (uint16_t)(u >> 16);
            memcpy(blk, &v, 2);
        } else if (type == GGML_TYPE_IQ4_NL) {   // d * kv: std(kv) ~ 70
            uint16_t d = to_fp16(std / 70.0f * jitter);
            memcpy(blk, &d, 2);
        } else if (type == GGML_TYPE_Q4_K) {     // d * sc * q4 - dmin * m, sc and m ~ 31, std(q4) 4.6
            uint16_t d = to_fp16(std / (31.0f * 4.6f) * jitter), dmin = to_fp16(std / (31.0f * 4.6f) * 7.5f * jitter);
            memcpy(blk, &d, 2);
            memcpy(blk + 2, &dmin, 2);
        } else if (type == GGML_TYPE_IQ4_XS) {   // d * (ls - 32) * kv: |ls - 32| ~ 16, std(kv) ~ 70
            uint16_t d = to_fp16(std / (18.0f * 70.0f) * jitter);
            memcpy(blk, &d, 2);
        } else if (type == GGML_TYPE_Q5_K) {     // d * sc * q5 - dmin * m, sc and m ~ 31, std(q5) 9.2
            uint16_t d = to_fp16(std / (31.0f * 9.2f) * jitter), dmin = to_fp16(std / (31.0f * 9.2f) * 15.5f * jitter);
            memcpy(blk, &d, 2);
            memcpy(blk + 2, &dmin, 2);
        } else if (type == GGML_TYPE_Q6_K) {     // d * sc * (q6 - 32), std(q6) 18.5; scales int8 in [-24, 24]
            block_q6_K *q = (block_q6_K *)blk;
            for (int k = 0; k < 16; k++) q->scales[k] = (int8_t)((int)(frand(&s) * 33) - 16 + (frand(&s) < 0.5f ? 8 : -8));
            q->d = to_fp16(std / (18.5f * 14.0f) * jitter);
        }
    }
}

static void fill_f32(Fill fill, float *dst, size_t n, uint64_t seed) {
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) {
        switch (fill) {
        case FILL_NORM: dst[i] = 1.0f + 0.05f * grand(&s); break;        // qwen35 norms have +1 baked in too
        case FILL_BIAS: dst[i] = 0.05f * grand(&s); break;
        case FILL_CONV: dst[i] = 0.3f * grand(&s); break;
        case FILL_SSM_A: dst[i] = -expf(-1.0f + 3.0f * frand(&s)); break; // -exp(A_log)
        case FILL_DT_BIAS: dst[i] = grand(&s); break;
        default: dst[i] = 0.02f * grand(&s); break;
        }
    }
}

// --- parallel writer: the data blob in chunks, each thread fills and pwrites its own -------------
typedef struct {
    int spec;
    size_t first_block, n_blocks; // for F32: first element and count
} Job;
static Job *jobs;
static int n_jobs;
static int next_job = 0;
static pthread_mutex_t job_lock = PTHREAD_MUTEX_INITIALIZER;
static int out_fd;
static uint64_t data_start, base_seed;

static void *worker(void *arg) {
    (void)arg;
    uint8_t *buf = NULL;
    size_t cap = 0;
    for (;;) {
        pthread_mutex_lock(&job_lock);
        int j = next_job < n_jobs ? next_job++ : -1;
        pthread_mutex_unlock(&job_lock);
        if (j < 0) break;
        Job *jb = &jobs[j];
        Spec *sp = &specs[jb->spec];
        size_t tsz = TYPE_TRAITS[sp->type].type_size, bytes = jb->n_blocks * tsz;
        if (bytes > cap) {
            free(buf);
            buf = (uint8_t *)xmalloc(bytes, "the model generator");
            cap = bytes;
        }
        uint64_t seed = base_seed ^ ((uint64_t)jb->spec << 32) ^ jb->first_block * 0x9E3779B97F4A7C15ull;
        if (sp->type == GGML_TYPE_F32) fill_f32(sp->fill, (float *)buf, jb->n_blocks, seed);
        else fill_blocks(sp->type, buf, jb->n_blocks, seed, 0.02f);
        uint64_t off = data_start + sp->offset + jb->first_block * tsz;
        for (size_t done = 0; done < bytes;) {
            ssize_t w = pwrite(out_fd, buf + done, bytes - done, (off_t)(off + done));
            if (w <= 0) die("write failed: %s", strerror(errno));
            done += (size_t)w;
        }
    }
    free(buf);
    return NULL;
}

static int pick_type(int ftype, int default_type) { return ftype == GGML_TYPE_F32 ? GGML_TYPE_F32 : default_type; }

int main(int argc, char **argv) {
    const char *model = NULL, *ftype_s = "iq4_xs", *out = NULL, *vocab_path = NULL;
    int layers = 0, threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    base_seed = 1234;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--ftype") && i + 1 < argc) ftype_s = argv[++i];
        else if (!strcmp(argv[i], "-o") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--layers") && i + 1 < argc) layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--vocab") && i + 1 < argc) vocab_path = argv[++i];
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) base_seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else die("usage: gen_model --model NAME --ftype TYPE -o OUT.gguf [--layers N] [--vocab VOCAB.gguf] [--seed S]");
    }
    if (!model || !out) die("usage: gen_model --model NAME --ftype TYPE -o OUT.gguf [--layers N] [--vocab VOCAB.gguf]");
    const Preset *P = NULL;
    for (size_t i = 0; i < sizeof PRESETS / sizeof PRESETS[0]; i++)
        if (!strcmp(PRESETS[i].name, model)) P = &PRESETS[i];
    if (!P) {
        fprintf(stderr, "models:");
        for (size_t i = 0; i < sizeof PRESETS / sizeof PRESETS[0]; i++) fprintf(stderr, " %s", PRESETS[i].name);
        fprintf(stderr, "\n");
        die("unknown model '%s'", model);
    }
    // the mix: base type, llama.cpp's ftype id, and the rules above
    static const struct { const char *name; int base; uint32_t ftype; } MIXES[] = {
        {"q4_0", GGML_TYPE_Q4_0, 2},     {"iq4_xs", GGML_TYPE_IQ4_XS, 30},
        {"iq4_nl", GGML_TYPE_IQ4_NL, 25}, {"q8_0", GGML_TYPE_Q8_0, 7},
        {"q4_k_m", GGML_TYPE_Q4_K, 15},   {"q4_k_s", GGML_TYPE_Q4_K, 14},
        {"q4_1", GGML_TYPE_Q4_1, 3},      {"q5_0", GGML_TYPE_Q5_0, 8},
        {"q5_1", GGML_TYPE_Q5_1, 9},      {"f16", GGML_TYPE_F16, 1},
        {"bf16", GGML_TYPE_BF16, 32},     {"q5_k_m", GGML_TYPE_Q5_K, 17},
        {"q6_k", GGML_TYPE_Q6_K, 18},     {"f32", GGML_TYPE_F32, 0}};
    int mix = -1;
    for (int i = 0; i < (int)(sizeof MIXES / sizeof MIXES[0]); i++)
        if (!strcmp(ftype_s, MIXES[i].name)) mix = i;
    if (mix < 0) die("--ftype must be one of q4_0 iq4_xs iq4_nl q8_0 q4_k_m q4_k_s q5_k_m q6_k q4_1 "
                     "q5_0 q5_1 f16 bf16 f32");
    int is_iq4 = is_iq4_type(MIXES[mix].base);
    int is_k = MIXES[mix].base == GGML_TYPE_Q4_K || MIXES[mix].base == GGML_TYPE_Q5_K;
    // the K-quant _M mixes (their "more bits" layers) and Q4_K_S
    int is_km = is_k && !strcmp(ftype_s + strlen(ftype_s) - 2, "_m"), is_ks = is_k && !is_km;
    int is_float = is_float_weight(MIXES[mix].base);
    int n_layer = layers > 0 && layers < P->n_layer ? layers : P->n_layer;
    int E = P->n_embd, F = P->n_ff, hd = P->head_dim, V = P->n_vocab;
    int q35 = !strcmp(P->arch, "qwen35"), q2 = !strcmp(P->arch, "qwen2");
    int base = MIXES[mix].base;
    int bump = is_iq4 || is_k ? GGML_TYPE_Q5_K : base; // the DeltaNet attn_qkv
    int gqa_bump = is_iq4 && P->n_head / P->n_head_kv >= 4;
    int key_dim = P->ssm_state * P->ssm_k_heads, value_dim = P->ssm_state * P->ssm_v_heads;
    int conv_dim = 2 * key_dim + value_dim;
    (void)pick_type;

    // --- tensors, in the order llama.cpp's converter writes them ---
    char name[96];
    add("token_embd.weight", E, V, base, FILL_WEIGHT);
    add("output_norm.weight", E, 0, GGML_TYPE_F32, FILL_NORM);
    int out_type = base == GGML_TYPE_Q8_0 || is_float ? base : GGML_TYPE_Q6_K;
    int n_attn = 0; // attention layers so far (Q4_K_S's attn_v rule counts them)
    if (!P->tied) add("output.weight", E, V, out_type, FILL_WEIGHT);
    for (int l = 0; l < n_layer; l++) {
#define N(suffix) (snprintf(name, sizeof name, "blk.%d." suffix, l), name)
        // llama-quantize's "more bits" layers of the _M mixes: the first and last eighth, every third
        int more = l < n_layer / 8 || l >= 7 * n_layer / 8 || (l - n_layer / 8) % 3 == 2;
        int down = (is_iq4 && l < n_layer / 8) ? GGML_TYPE_Q5_K : base;
        if (is_km && more) down = GGML_TYPE_Q6_K;
        if (is_ks && l < n_layer / 8) down = GGML_TYPE_Q5_K;
        add(N("attn_norm.weight"), E, 0, GGML_TYPE_F32, FILL_NORM);
        int recurrent = q35 && (l + 1) % P->attn_interval != 0;
        if (recurrent) {
            add(N("attn_qkv.weight"), E, conv_dim, bump, FILL_WEIGHT);
            add(N("attn_gate.weight"), E, value_dim, base, FILL_WEIGHT);
            add(N("ssm_conv1d.weight"), P->ssm_conv, conv_dim, GGML_TYPE_F32, FILL_CONV);
            add(N("ssm_dt.bias"), P->ssm_v_heads, 0, GGML_TYPE_F32, FILL_DT_BIAS);
            add(N("ssm_a"), P->ssm_v_heads, 0, GGML_TYPE_F32, FILL_SSM_A);
            add(N("ssm_beta.weight"), E, P->ssm_v_heads, base, FILL_WEIGHT);
            add(N("ssm_alpha.weight"), E, P->ssm_v_heads, base, FILL_WEIGHT);
            add(N("ssm_norm.weight"), P->ssm_state, 0, GGML_TYPE_F32, FILL_NORM);
            add(N("ssm_out.weight"), value_dim, E, base, FILL_WEIGHT);
        } else {
            int qrows = hd * P->n_head * (q35 ? 2 : 1); // qwen35: q and its gate, per head
            add(N("attn_q.weight"), E, qrows, base, FILL_WEIGHT);
            add(N("attn_k.weight"), E, hd * P->n_head_kv, base, FILL_WEIGHT);
            int vt = gqa_bump ? GGML_TYPE_Q5_K : is_km && more ? GGML_TYPE_Q6_K : base;
            if (is_ks && n_attn++ < 4) vt = GGML_TYPE_Q5_K;
            add(N("attn_v.weight"), E, hd * P->n_head_kv, vt, FILL_WEIGHT);
            add(N("attn_output.weight"), hd * P->n_head, E, base, FILL_WEIGHT);
            if (q2) {
                add(N("attn_q.bias"), hd * P->n_head, 0, GGML_TYPE_F32, FILL_BIAS);
                add(N("attn_k.bias"), hd * P->n_head_kv, 0, GGML_TYPE_F32, FILL_BIAS);
                add(N("attn_v.bias"), hd * P->n_head_kv, 0, GGML_TYPE_F32, FILL_BIAS);
            } else {
                add(N("attn_q_norm.weight"), hd, 0, GGML_TYPE_F32, FILL_NORM);
                add(N("attn_k_norm.weight"), hd, 0, GGML_TYPE_F32, FILL_NORM);
            }
        }
        add(q35 ? N("post_attention_norm.weight") : N("ffn_norm.weight"), E, 0, GGML_TYPE_F32, FILL_NORM);
        add(N("ffn_gate.weight"), E, F, base, FILL_WEIGHT);
        add(N("ffn_up.weight"), E, F, base, FILL_WEIGHT);
        add(N("ffn_down.weight"), F, E, down, FILL_WEIGHT);
#undef N
    }
    if (P->tied) { // a tied embedding gets the output type
        specs[0].type = out_type;
        specs[0].nbytes = row_bytes(out_type, specs[0].ne[0]) * specs[0].ne[1];
    }

    // --- metadata ---
    Buf kv = {0};
    int n_kv = 0;
    char key[128];
#define K(suffix) (snprintf(key, sizeof key, "%s." suffix, P->arch), n_kv++, key)
    kv_str(&kv, "general.architecture", P->arch); n_kv++;
    char gname[128];
    snprintf(gname, sizeof gname, "synthetic %s %s (random weights)", P->name, ftype_s);
    kv_str(&kv, "general.name", gname); n_kv++;
    kv_u32(&kv, "general.file_type", MIXES[mix].ftype); n_kv++;    // LLAMA_FTYPE_MOSTLY_*
    kv_u32(&kv, "general.quantization_version", 2); n_kv++;
    kv_u32(&kv, K("context_length"), (uint32_t)P->n_ctx_train);
    kv_u32(&kv, K("embedding_length"), (uint32_t)E);
    kv_u32(&kv, K("block_count"), (uint32_t)n_layer);
    kv_u32(&kv, K("feed_forward_length"), (uint32_t)F);
    kv_u32(&kv, K("attention.head_count"), (uint32_t)P->n_head);
    kv_u32(&kv, K("attention.head_count_kv"), (uint32_t)P->n_head_kv);
    kv_u32(&kv, K("attention.key_length"), (uint32_t)hd);
    kv_u32(&kv, K("attention.value_length"), (uint32_t)hd);
    kv_f32(&kv, K("rope.freq_base"), P->rope_base);
    kv_f32(&kv, K("attention.layer_norm_rms_epsilon"), P->eps);
    if (q35) {
        int32_t sections[4] = {11, 11, 10, 0};
        kv_u32(&kv, K("rope.dimension_count"), (uint32_t)P->n_rot);
        kv_arr_i32(&kv, K("rope.dimension_sections"), sections, 4);
        kv_u32(&kv, K("ssm.conv_kernel"), (uint32_t)P->ssm_conv);
        kv_u32(&kv, K("ssm.state_size"), (uint32_t)P->ssm_state);
        kv_u32(&kv, K("ssm.group_count"), (uint32_t)P->ssm_k_heads);
        kv_u32(&kv, K("ssm.time_step_rank"), (uint32_t)P->ssm_v_heads);
        kv_u32(&kv, K("ssm.inner_size"), (uint32_t)value_dim);
        kv_u32(&kv, K("full_attention_interval"), (uint32_t)P->attn_interval);
    }
#undef K
    // tokenizer: copied from a vocabulary GGUF, or a minimal byte-level one; padded to n_vocab
    GGUF vg;
    memset(&vg, 0, sizeof vg);
    vg.fd = -1;
    const GGUFKV *toks = NULL, *types = NULL, *merges = NULL;
    if (vocab_path) {
        if (gguf_open(&vg, vocab_path) != 0) die("%s", vg.err);
        toks = gguf_find(&vg, "tokenizer.ggml.tokens");
        types = gguf_find(&vg, "tokenizer.ggml.token_type");
        merges = gguf_find(&vg, "tokenizer.ggml.merges");
        if (!toks || toks->arr_type != GGUF_TYPE_STRING || !types || types->arr_type != GGUF_TYPE_I32)
            die("%s has no tokenizer.ggml.tokens / token_type arrays", vocab_path);
    }
    kv_str(&kv, "tokenizer.ggml.model", "gpt2"); n_kv++;
    kv_str(&kv, "tokenizer.ggml.pre", q35 ? "qwen35" : "qwen2"); n_kv++;
    {
        put_str(&kv, "tokenizer.ggml.tokens");
        put_i32(&kv, GGUF_TYPE_ARRAY);
        put_i32(&kv, GGUF_TYPE_STRING);
        put_u64(&kv, (uint64_t)V);
        n_kv++;
        const uint8_t *p = toks ? toks->data : NULL;
        uint64_t have = toks ? toks->n : 0;
        for (int i = 0; i < V; i++) {
            char tmp[32];
            if ((uint64_t)i < have) {
                uint64_t len;
                const char *t = gguf_next_str(&p, &len);
                put_strn(&kv, t, (size_t)len);
            } else if (!toks && i < 256) { // byte tokens through GPT-2's byte map (tokenizer.c)
                char u[4];
                put_strn(&kv, u, cp_to_utf8((uint32_t)byte_to_codepoint(i), u));
            } else if (!toks && i == V - 2) {
                put_str(&kv, "<|endoftext|>");
            } else if (!toks && i == V - 1) {
                put_str(&kv, "<|im_end|>");
            } else {
                snprintf(tmp, sizeof tmp, "[PAD%d]", i);
                put_str(&kv, tmp);
            }
        }
        put_str(&kv, "tokenizer.ggml.token_type");
        put_i32(&kv, GGUF_TYPE_ARRAY);
        put_i32(&kv, GGUF_TYPE_I32);
        put_u64(&kv, (uint64_t)V);
        n_kv++;
        for (int i = 0; i < V; i++) {
            int32_t t;
            if ((uint64_t)i < have) memcpy(&t, types->data + 4 * (size_t)i, 4);
            else if (!toks && i < 256) t = 1;
            else if (!toks && i >= V - 2) t = 3;
            else t = 5; // unused padding
            put_i32(&kv, t);
        }
        put_str(&kv, "tokenizer.ggml.merges");
        put_i32(&kv, GGUF_TYPE_ARRAY);
        put_i32(&kv, GGUF_TYPE_STRING);
        n_kv++;
        if (merges && merges->arr_type == GGUF_TYPE_STRING) {
            put_u64(&kv, merges->n);
            const uint8_t *p2 = merges->data;
            for (uint64_t i = 0; i < merges->n; i++) {
                uint64_t len;
                const char *m = gguf_next_str(&p2, &len);
                put_strn(&kv, m, (size_t)len);
            }
        } else {
            put_u64(&kv, 0);
        }
        uint32_t eos = (uint32_t)(toks ? 151645 : V - 1), bos = (uint32_t)(toks ? 151643 : V - 2);
        if (eos >= (uint32_t)V) eos = (uint32_t)V - 1;
        if (bos >= (uint32_t)V) bos = (uint32_t)V - 2;
        kv_u32(&kv, "tokenizer.ggml.bos_token_id", bos); n_kv++;
        kv_u32(&kv, "tokenizer.ggml.eos_token_id", eos); n_kv++;
        kv_bool(&kv, "tokenizer.ggml.add_bos_token", 0); n_kv++;
    }
    if (vocab_path) gguf_close(&vg);

    // --- header: magic, counts, metadata, tensor infos; then the aligned data blob ---
    uint64_t off = 0;
    for (int i = 0; i < n_specs; i++) {
        specs[i].offset = off;
        off += (specs[i].nbytes + 31) / 32 * 32;
    }
    Buf h = {0};
    put(&h, "GGUF", 4);
    put_u32(&h, 3);
    put_u64(&h, (uint64_t)n_specs);
    put_u64(&h, (uint64_t)n_kv);
    put(&h, kv.p, kv.n);
    for (int i = 0; i < n_specs; i++) put_tensor_info(&h, specs[i].name, specs[i].n_dims, specs[i].ne, specs[i].type, specs[i].offset);
    put_pad(&h, 32);
    data_start = h.n;

    out_fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out_fd < 0) die("cannot create '%s': %s", out, strerror(errno));
    if (ftruncate(out_fd, (off_t)(data_start + off)) != 0) die("cannot size '%s': %s", out, strerror(errno));
    if (pwrite(out_fd, h.p, h.n, 0) != (ssize_t)h.n) die("write failed: %s", strerror(errno));

    // jobs of ~16 MB of blocks
    n_jobs = 0;
    int cap = 1024;
    jobs = (Job *)xmalloc(cap * sizeof(Job), "the model generator");
    for (int i = 0; i < n_specs; i++) {
        size_t tsz = TYPE_TRAITS[specs[i].type].type_size, nb = specs[i].nbytes / tsz;
        size_t per = (16u << 20) / tsz;
        for (size_t b = 0; b < nb; b += per) {
            if (n_jobs == cap) jobs = (Job *)realloc(jobs, (cap *= 2) * sizeof(Job));
            jobs[n_jobs++] = (Job){i, b, nb - b < per ? nb - b : per};
        }
    }
    double t0 = now_sec();
    if (threads < 1) threads = 1;
    pthread_t th[256];
    if (threads > 256) threads = 256;
    for (int i = 0; i < threads; i++) pthread_create(&th[i], NULL, worker, NULL);
    for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
    if (close(out_fd) != 0) die("closing '%s' failed: %s", out, strerror(errno));
    double dt = now_sec() - t0;
    double total = (double)(data_start + off);
    fprintf(stderr, "wrote %s: %s %s, %d layers, %d tensors, %.2f GiB in %.1f s\n", out, P->name, ftype_s, n_layer,
            n_specs, total / (1u << 30), dt);
    return 0;
}
