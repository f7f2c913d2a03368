// quantize.cu — converts a GGUF model to a quantized file type, with llama-quantize's choice of
// type per tensor (no imatrix), using the encoders of test/quantize.h:
//
//   test/quantize IN.gguf OUT.gguf TYPE        TYPE: q8_0, q4_0 or iq4_xs
//
// The input is read with qwen.cu's own GGUF reader; it is normally F32/F16/BF16 (any type qwen.cu
// can dequantize is accepted: each tensor is dequantized with dequant_row, then quantized; one
// already of its target type is copied as it is). The output has the input's metadata, every
// key/value copied in order, except general.file_type, which becomes llama.cpp's ftype id for
// TYPE (q8_0 = 7, q4_0 = 2, iq4_xs = 30; appended when absent, as is general.quantization_version
// = 2). The tensors are the same, in the same order, with contiguous offsets padded to
// general.alignment (32 when absent). Types per tensor:
//
//   kept as they are: 1-D tensors, *_norm.weight, ssm_conv1d, names not ending in "weight"
//                     (ssm_a, *.bias, ...)
//   q8_0:    every other tensor Q8_0 (output.weight too)
//   q4_0:    every other tensor Q4_0, but output.weight Q6_K (no output.weight, i.e. tied
//            embeddings: token_embd.weight Q6_K)
//   iq4_xs:  every other tensor IQ4_XS, but output.weight Q6_K (or token_embd when tied), and Q5_K
//            for attn_v.weight and attn_qkv.weight when n_head / n_head_kv >= 4, and for
//            ffn_down.weight in the first n_layer / 8 layers
//
// attn_qkv follows attn_v because current llama.cpp puts both in one category (its fixtures in
// test/data agree: tiny-qwen35-iq4_xs, n_head / n_head_kv = 2, keeps attn_qkv IQ4_XS, while
// Qwen3.6-27B, ratio 6, gets Q5_K). A row length that is not a multiple of 256 falls back as
// llama-quantize does: IQ4_XS -> IQ4_NL, Q5_K -> Q5_1, Q6_K -> Q8_0 (output / tied embeddings
// straight to Q8_0), and to F16 when not even a multiple of 32. Q4_0 and Q8_0 have no fallback: a
// row length that is not a multiple of 32 is an error, as it is in llama-quantize.
//
// Each converted tensor's relative RMS error (||dequant(quant(w)) - w|| / ||w||) is printed.
// Built by `make test/quantize`; like test/gen_model it includes qwen.cu with TESTING defined.

#define TESTING
#include "../qwen.cu"
#include "gguf_write.h"
#include "quantize.h"

static const struct {
    const char *name;
    int type;       // the mix's default ggml type
    uint32_t ftype; // llama.cpp's LLAMA_FTYPE_MOSTLY_* id, stored in general.file_type
} FTYPES[] = {
    {"q8_0", GGML_TYPE_Q8_0, 7}, {"q4_0", GGML_TYPE_Q4_0, 2}, {"iq4_xs", GGML_TYPE_IQ4_XS, 30},
};

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

// Dimensions as ggml counts them: trailing dimensions of 1 do not count ({256, 1} is 1-D).
static int ggml_dims(const GGUFTensor *t) {
    int n = 1;
    for (int d = 1; d < GGUF_MAX_DIMS; d++)
        if (t->ne[d] > 1) n = d + 1;
    return n;
}

// llama-quantize's test of whether a tensor is quantized at all (the parts a Qwen file can meet).
static int allows_quantization(const GGUFTensor *t) {
    return ggml_dims(t) >= 2 && ends_with(t->name, "weight") && !strstr(t->name, "_norm.weight") &&
           !strstr(t->name, "ssm_conv1d") && !strstr(t->name, "ffn_gate_inp.weight") &&
           !strstr(t->name, ".position_embd.");
}

// An integer key stored as a u32/i32 scalar, or the first element of an array of them (llama.cpp
// takes layer 0's value); def when absent.
static int64_t meta_int(const GGUF *g, const char *key, int64_t def) {
    const GGUFKV *kv = gguf_find(g, key);
    if (!kv) return def;
    int type = kv->type == GGUF_TYPE_ARRAY ? kv->arr_type : kv->type;
    if (kv->type == GGUF_TYPE_ARRAY && kv->n == 0) return def;
    int32_t v;
    if (type == GGUF_TYPE_U32 || type == GGUF_TYPE_I32) {
        memcpy(&v, kv->data, 4);
        return type == GGUF_TYPE_U32 ? (int64_t)(uint32_t)v : (int64_t)v;
    }
    return def;
}

// The mix's state over the tensors, in file order.
typedef struct {
    int base;           // the default type
    int has_output;     // the file has output.weight (else the embeddings are tied)
    int64_t n_gqa;      // n_head / n_head_kv (0 when unknown)
    int64_t n_layer;    // {arch}.block_count (else the number of ffn_down tensors), as llama.cpp
    int i_ffn_down;     // ffn_down tensors seen so far: the layer index, as llama.cpp counts it
} Mix;

// The type a tensor is written as (its own type when it is not quantized).
static int choose_type(const GGUFTensor *t, Mix *mx) {
    if (!allows_quantization(t)) return t->type;
    int type = mx->base;
    int64_t ne0 = t->ne[0];
    int output = strcmp(t->name, "output.weight") == 0;
    int embd = strcmp(t->name, "token_embd.weight") == 0;
    if (output || (embd && !mx->has_output)) {
        if (ne0 % TYPE_TRAITS[type].blck != 0) type = GGML_TYPE_Q8_0;
        else if (type != GGML_TYPE_Q8_0) type = GGML_TYPE_Q6_K;
    } else if (embd) {
        // the default type
    } else if (strstr(t->name, "attn_v.weight") || strstr(t->name, "attn_qkv.weight")) {
        if (mx->base == GGML_TYPE_IQ4_XS && mx->n_gqa >= 4) type = GGML_TYPE_Q5_K;
    } else if (strstr(t->name, "ffn_down")) {
        if (mx->base == GGML_TYPE_IQ4_XS && mx->i_ffn_down < mx->n_layer / 8) type = GGML_TYPE_Q5_K;
        mx->i_ffn_down++;
    }
    if (ne0 % TYPE_TRAITS[type].blck != 0) { // the fallbacks for row lengths off the block size
        switch (type) {
        case GGML_TYPE_IQ4_XS: type = GGML_TYPE_IQ4_NL; break;
        case GGML_TYPE_Q5_K: type = GGML_TYPE_Q5_1; break;
        case GGML_TYPE_Q6_K: type = GGML_TYPE_Q8_0; break;
        default:
            die("tensor '%s': row length %lld is not a multiple of 32, which %s needs", t->name,
                (long long)ne0, type_name(type));
        }
        if (ne0 % TYPE_TRAITS[type].blck != 0) type = GGML_TYPE_F16;
        fprintf(stderr, "note: %s: row length %lld is not a multiple of 256: %s\n", t->name,
                (long long)ne0, type_name(type));
    }
    return type;
}

// One metadata key/value copied as it is in the file (the reader bounded it already).
static void put_kv_copy(Buf *b, const GGUFKV *kv) {
    put_str(b, kv->key);
    put_i32(b, kv->type);
    if (kv->type == GGUF_TYPE_STRING) {
        put_strn(b, (const char *)kv->data, (size_t)kv->n);
    } else if (kv->type == GGUF_TYPE_ARRAY) {
        put_i32(b, kv->arr_type);
        put_u64(b, kv->n);
        if (kv->arr_type == GGUF_TYPE_STRING) {
            const uint8_t *p = kv->data;
            for (uint64_t i = 0; i < kv->n; i++) {
                uint64_t len;
                const char *s = gguf_next_str(&p, &len);
                put_strn(b, s, (size_t)len);
            }
        } else {
            put(b, kv->data, (size_t)(kv->n * GGUF_TYPE_SIZE[kv->arr_type]));
        }
    } else {
        put(b, kv->data, GGUF_TYPE_SIZE[kv->type]);
    }
}

static void write_all(FILE *f, const void *p, size_t n, const char *path) {
    if (n && fwrite(p, 1, n, f) != n) die("writing '%s' failed: %s", path, strerror(errno));
}

int main(int argc, char **argv) {
    if (argc != 4) die("usage: test/quantize IN.gguf OUT.gguf TYPE   (TYPE: q8_0, q4_0, iq4_xs)");
    const char *in = argv[1], *out = argv[2];
    int f = -1;
    for (int i = 0; i < (int)(sizeof FTYPES / sizeof FTYPES[0]); i++)
        if (strcmp(argv[3], FTYPES[i].name) == 0) f = i;
    if (f < 0) die("unknown TYPE '%s': use q8_0, q4_0 or iq4_xs", argv[3]);

    GGUF g;
    if (gguf_open(&g, in) != 0) die("%s: %s", in, g.err);
    struct stat si, so;
    if (stat(out, &so) == 0 && fstat(g.fd, &si) == 0 && si.st_dev == so.st_dev &&
        si.st_ino == so.st_ino)
        die("OUT '%s' is the input file: write the quantized model to another path", out);

    // the mix: default type, tied embeddings, GQA ratio, ffn_down count
    char arch[64], key[128];
    if (!gguf_str(&g, "general.architecture", arch, sizeof arch)) arch[0] = 0;
    Mix mx = {FTYPES[f].type, gguf_tensor(&g, "output.weight") != NULL, 0, 0, 0};
    snprintf(key, sizeof key, "%s.attention.head_count", arch);
    int64_t n_head = meta_int(&g, key, 0);
    snprintf(key, sizeof key, "%s.attention.head_count_kv", arch);
    int64_t n_head_kv = meta_int(&g, key, n_head);
    mx.n_gqa = n_head_kv > 0 ? n_head / n_head_kv : 0;
    snprintf(key, sizeof key, "%s.block_count", arch);
    mx.n_layer = meta_int(&g, key, 0);
    if (mx.n_layer <= 0) // no block_count: count the layers' ffn_down tensors
        for (int64_t i = 0; i < g.n_tensors; i++)
            if (allows_quantization(&g.tensors[i]) && strstr(g.tensors[i].name, "ffn_down"))
                mx.n_layer++;

    // the output types, sizes and offsets
    int64_t nt = g.n_tensors;
    int *otype = (int *)xcalloc((size_t)nt, sizeof(int), "the tensor table");
    size_t *obytes = (size_t *)xcalloc((size_t)nt, sizeof(size_t), "the tensor table");
    uint64_t *ooff = (uint64_t *)xcalloc((size_t)nt, sizeof(uint64_t), "the tensor table");
    uint64_t off = 0, align = g.alignment;
    for (int64_t i = 0; i < nt; i++) {
        const GGUFTensor *t = &g.tensors[i];
        otype[i] = choose_type(t, &mx);
        if (otype[i] != t->type && !type_supported(t->type))
            die("tensor '%s': cannot read type %s to convert it", t->name, type_name(t->type));
        int64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
        obytes[i] = otype[i] == t->type ? t->nbytes : row_bytes(otype[i], t->ne[0]) * (size_t)rows;
        ooff[i] = off;
        off += (obytes[i] + align - 1) / align * align;
    }

    // the header: magic, version, counts, the metadata (file_type replaced), the tensor infos
    int has_ft = gguf_find(&g, "general.file_type") != NULL;
    int has_qv = gguf_find(&g, "general.quantization_version") != NULL;
    Buf h = {0};
    put(&h, "GGUF", 4);
    put_u32(&h, 3);
    put_u64(&h, (uint64_t)nt);
    put_u64(&h, (uint64_t)(g.n_kv + !has_ft + !has_qv));
    for (int64_t i = 0; i < g.n_kv; i++) {
        if (strcmp(g.kv[i].key, "general.file_type") == 0)
            kv_u32(&h, "general.file_type", FTYPES[f].ftype);
        else put_kv_copy(&h, &g.kv[i]);
    }
    if (!has_qv) kv_u32(&h, "general.quantization_version", 2);
    if (!has_ft) kv_u32(&h, "general.file_type", FTYPES[f].ftype);
    for (int64_t i = 0; i < nt; i++)
        put_tensor_info(&h, g.tensors[i].name, g.tensors[i].n_dims, g.tensors[i].ne, otype[i],
                        ooff[i]);
    put_pad(&h, align);

    // the data: each tensor converted row by row, then padded
    // written to a temporary file beside OUT, renamed over it once complete (qwen.cu's
    // output_open): an error or a signal from here on deletes it and leaves OUT as it was
    catch_fatal_signals();
    FILE *fo = output_open("output", out);
    write_all(fo, h.p, h.n, out);
    static const uint8_t zeros[256] = {0};
    double t0 = now_sec();
    for (int64_t i = 0; i < nt; i++) {
        const GGUFTensor *t = &g.tensors[i];
        if (otype[i] == t->type) {
            write_all(fo, t->data, t->nbytes, out);
            fprintf(stderr, "%-36s %-7s kept\n", t->name, type_name(t->type));
        } else {
            int64_t ne0 = t->ne[0], rows = t->ne[1] * t->ne[2] * t->ne[3];
            size_t in_rb = row_bytes(t->type, ne0), out_rb = row_bytes(otype[i], ne0);
            float *x = (float *)xmalloc((size_t)ne0 * sizeof(float), "a row");
            float *y = (float *)xmalloc((size_t)ne0 * sizeof(float), "a row");
            uint8_t *q = (uint8_t *)xmalloc(out_rb, "a quantized row");
            double ee = 0.0, xx = 0.0;
            for (int64_t r = 0; r < rows; r++) {
                dequant_row(t->type, t->data + (size_t)r * in_rb, x, ne0);
                for (int64_t j = 0; j < ne0; j++)
                    if (!isfinite(x[j]))
                        die("tensor '%s': row %lld holds a non-finite value", t->name,
                            (long long)r);
                quantize_row(otype[i], x, ne0, q);
                write_all(fo, q, out_rb, out);
                dequant_row(otype[i], q, y, ne0); // the error, as the engine will read it
                for (int64_t j = 0; j < ne0; j++) {
                    double d = (double)y[j] - x[j];
                    ee += d * d, xx += (double)x[j] * x[j];
                }
            }
            free(x), free(y), free(q);
            fprintf(stderr, "%-36s %-7s -> %-7s relative RMS error %.4f\n", t->name,
                    type_name(t->type), type_name(otype[i]), xx > 0.0 ? sqrt(ee / xx) : sqrt(ee));
        }
        for (size_t pad = (align - obytes[i] % align) % align; pad > 0;) {
            size_t k = pad < sizeof zeros ? pad : sizeof zeros;
            write_all(fo, zeros, k, out);
            pad -= k;
        }
    }
    output_close(fo, "output", out);
    fprintf(stderr, "wrote %s: %s, %lld tensors, %.2f MiB (from %.2f MiB) in %.1f s\n", out,
            FTYPES[f].name, (long long)nt, (h.n + off) / 1048576.0, g.size / 1048576.0,
            now_sec() - t0);
    gguf_close(&g);
    free(h.p), free(otype), free(obytes), free(ooff);
    return 0;
}
