// test_quantize.h — the encoders of test/quantize.h against the engine's decoder (dequant_row).
// Included by test_qwen.cu after its reporting helpers (report, check); test_quantizers() runs it.
//
// For each type: rows from several distributions are quantized, dequantized by qwen.cu, and the
// relative RMS error ||y - x|| / ||x|| is held to a measured tolerance. Also: all-zero rows decode
// to exact zeros, nothing decodes to NaN or inf, the same row gives the same bytes twice, each
// encoder does at least as well as its naive form (qz_naive) on Gaussian rows, and the types rank
// as their bits say: Q8_0 < Q6_K < Q5_K < {IQ4_XS, Q4_0}.
#pragma once
#include "quantize.h"

#define TQ_ROW 4096  // values per row: a multiple of 256
#define TQ_ROWS 4    // rows per distribution

enum { TQ_GAUSS, TQ_OUTLIERS, TQ_ZERO, TQ_CONST, TQ_TINY, TQ_NDIST };

// The test rows of one distribution, TQ_ROWS x TQ_ROW, from a fixed seed.
static void tq_fill(int dist, float *x) {
    uint64_t st = 0x51ed270b27a1f0c3ull + (uint64_t)dist;
    for (int r = 0; r < TQ_ROWS; r++) {
        float *row = x + (size_t)r * TQ_ROW;
        for (int i = 0; i < TQ_ROW; i++) {
            float u1 = rng_f32(&st) + 1e-7f, u2 = rng_f32(&st);
            float g = sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2); // ~N(0, 1)
            switch (dist) {
            case TQ_GAUSS: case TQ_OUTLIERS: row[i] = 0.02f * g; break;
            case TQ_ZERO: row[i] = 0.0f; break;
            case TQ_CONST: row[i] = r % 2 ? -0.0377f : 0.0123f; break; // both signs
            default: row[i] = 1e-8f * g; break;
            }
        }
        if (dist == TQ_OUTLIERS) // eight outliers of 10 to 30 sigma, either sign, in each row
            for (int k = 0; k < 8; k++) {
                int at = (int)(rng_f32(&st) * TQ_ROW);
                float sign = rng_f32(&st) < 0.5f ? -1.0f : 1.0f;
                row[at] = sign * 0.02f * (10.0f + 20.0f * rng_f32(&st));
            }
    }
}

typedef struct {
    int type;
    double tol_gauss, tol_outliers, tol_const; // relative RMS error bounds
} TqType;

// Measured relative RMS errors (Gaussian rows: ours, then the naive fit; Gaussian with outliers;
// constant rows), the bounds about 10 % above them:
//   Q8_0    0.00533 / 0.00533   outliers 0.0094   constant 7e-5
//   Q6_K    0.0165  / 0.0189    outliers 0.0270   constant 2.8e-3
//   Q5_K    0.0347  / 0.0385    outliers 0.0431   constant 9.9e-4
//   Q5_1    0.0336  / 0.0381    outliers 0.0420   constant 2.7e-4
//   IQ4_XS  0.0740  / 0.0798    outliers 0.1109   constant 1.4e-3
//   IQ4_NL  0.0735  / 0.0796    outliers 0.1092   constant 2.3e-4
//   Q4_0    0.0861  / 0.0970    outliers 0.1437   constant 2.7e-4
// Q8_0's error is its step over sqrt(12): amax/127/sqrt(12) = 0.5 % of sigma for 32 Gaussians.
// IQ4's is the format's own: a brute-force search over 4000 scales per block does no better.
// Constant rows are one point of the grid but not exactly: Q6_K's d (c / 4096 for c = 0.0123) and
// IQ4_XS's are fp16 subnormals, whose steps are ~2 % of d, and no d * sc * q lands closer.
static const TqType TQ_TYPES[] = {
    {GGML_TYPE_Q8_0, 0.0059, 0.0104, 1e-3},   {GGML_TYPE_Q6_K, 0.0182, 0.0300, 4e-3},
    {GGML_TYPE_Q5_K, 0.0380, 0.0470, 2e-3},   {GGML_TYPE_Q5_1, 0.0370, 0.0460, 1e-3},
    {GGML_TYPE_IQ4_XS, 0.0810, 0.1220, 2e-3}, {GGML_TYPE_IQ4_NL, 0.0810, 0.1200, 1e-3},
    {GGML_TYPE_Q4_0, 0.0950, 0.1580, 1e-3},
};
#define TQ_NTYPES ((int)(sizeof TQ_TYPES / sizeof TQ_TYPES[0]))

// Quantize TQ_ROWS rows of x as `type` into q, dequantize them into y with the engine's decoder,
// and return ||y - x|| / ||x|| (the plain ||y|| when x is all zero). *finite: every y finite.
static double tq_roundtrip(int type, const float *x, uint8_t *q, float *y, int *finite) {
    size_t rb = row_bytes(type, TQ_ROW);
    double ee = 0.0, xx = 0.0;
    *finite = 1;
    for (int r = 0; r < TQ_ROWS; r++) {
        quantize_row(type, x + (size_t)r * TQ_ROW, TQ_ROW, q + r * rb);
        dequant_row(type, q + r * rb, y + (size_t)r * TQ_ROW, TQ_ROW);
    }
    for (size_t i = 0; i < (size_t)TQ_ROWS * TQ_ROW; i++) {
        if (!isfinite(y[i])) *finite = 0;
        double d = (double)y[i] - x[i];
        ee += d * d, xx += (double)x[i] * x[i];
    }
    return xx > 0.0 ? sqrt(ee / xx) : sqrt(ee);
}

static void test_quantizers(void) {
    const size_t nv = (size_t)TQ_ROWS * TQ_ROW;
    float *x = (float *)xmalloc(TQ_NDIST * nv * sizeof(float), "the quantizer test");
    float *y = (float *)xmalloc(nv * sizeof(float), "the quantizer test");
    // the largest rows: Q8_0's 34 bytes per 32 values; two copies for the determinism check
    size_t qcap = row_bytes(GGML_TYPE_Q8_0, TQ_ROW) * TQ_ROWS;
    uint8_t *q = (uint8_t *)xmalloc(qcap, "the quantizer test");
    uint8_t *q2 = (uint8_t *)xmalloc(qcap, "the quantizer test");
    for (int d = 0; d < TQ_NDIST; d++) tq_fill(d, x + d * nv);
    double gauss[TQ_NTYPES];
    char name[128];

    for (int t = 0; t < TQ_NTYPES; t++) {
        const TqType *T = &TQ_TYPES[t];
        const char *tn = type_name(T->type);
        int fin_all = 1, fin;
        double e;

        // Gaussian rows: the error bound, then the same rows again (identical bytes)
        e = gauss[t] = tq_roundtrip(T->type, x + TQ_GAUSS * nv, q, y, &fin);
        fin_all &= fin;
        snprintf(name, sizeof name, "quantize %s: gaussian rows, relative RMS error", tn);
        report(e <= T->tol_gauss, name, e, T->tol_gauss);
        tq_roundtrip(T->type, x + TQ_GAUSS * nv, q2, y, &fin);
        snprintf(name, sizeof name, "quantize %s: the same rows twice give the same bytes", tn);
        check(memcmp(q, q2, row_bytes(T->type, TQ_ROW) * TQ_ROWS) == 0, name);

        // the naive fit (no search) on the same rows: the search must not do worse
        qz_naive = 1;
        double naive = tq_roundtrip(T->type, x + TQ_GAUSS * nv, q2, y, &fin);
        qz_naive = 0;
        snprintf(name, sizeof name, "quantize %s: gaussian, no worse than the naive fit (tol)", tn);
        report(gauss[t] <= naive, name, gauss[t], naive);

        e = tq_roundtrip(T->type, x + TQ_OUTLIERS * nv, q, y, &fin);
        fin_all &= fin;
        snprintf(name, sizeof name, "quantize %s: gaussian with outliers, relative RMS error", tn);
        report(e <= T->tol_outliers, name, e, T->tol_outliers);

        // all-zero rows: every value decodes to exactly 0 (err: ||y||)
        e = tq_roundtrip(T->type, x + TQ_ZERO * nv, q, y, &fin);
        fin_all &= fin;
        snprintf(name, sizeof name, "quantize %s: all-zero rows decode to exact zeros", tn);
        report(e == 0.0, name, e, 0.0);

        // constant rows (one sign, then the other): one level of the grid, so nearly exact
        e = tq_roundtrip(T->type, x + TQ_CONST * nv, q, y, &fin);
        fin_all &= fin;
        snprintf(name, sizeof name, "quantize %s: constant rows, relative RMS error", tn);
        report(e <= T->tol_const, name, e, T->tol_const);

        // values of ~1e-8: every scale is below fp16's smallest subnormal and rounds to zero,
        // so the rows decode to zeros (error 1), never to NaN, inf or anything larger
        e = tq_roundtrip(T->type, x + TQ_TINY * nv, q, y, &fin);
        fin_all &= fin;
        snprintf(name, sizeof name, "quantize %s: tiny values (~1e-8), relative RMS error", tn);
        report(e <= 1.0, name, e, 1.0);

        snprintf(name, sizeof name, "quantize %s: every decoded value is finite", tn);
        check(fin_all, name);
    }

    // the ranking by bits per weight (8.5, 6.56, 5.5, 4.25, 4.5) on the Gaussian rows
    double e8 = gauss[0], e6 = gauss[1], e5 = gauss[2], eiq = gauss[4], e4 = gauss[6]; // TQ_TYPES
    // (err: Q5_K's error over the better 4-bit one's, which must stay below 1)
    report(e8 < e6 && e6 < e5 && e5 < eiq && e5 < e4,
           "quantize: gaussian error ranks Q8_0 < Q6_K < Q5_K < IQ4_XS, Q4_0",
           e5 / fmin(eiq, e4), 1.0);

    // the IQ4 table lookup against a plain scan, on a grid of 1/8 that hits every midpoint
    {
        int bad = 0;
        for (int k = -140 * 8; k <= 140 * 8; k++) {
            float v = k / 8.0f;
            int best = 0;
            for (int i = 1; i < 16; i++) // nearest, ties to the upper entry
                if (fabsf(v - KVALUES_IQ4NL[i]) <= fabsf(v - KVALUES_IQ4NL[best])) best = i;
            bad += qz_iq4_nearest(v) != best;
        }
        check(bad == 0, "quantize: IQ4 nearest-entry lookup agrees with a plain scan");
    }

    // F16 and BF16 through quantize_row: round to nearest-even, as cuda_fp16 and the bit rule say
    {
        const float v[4] = {1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048, -70000.0f, 2.0e-8f};
        uint16_t h[4], bf[4];
        quantize_row(GGML_TYPE_F16, v, 4, h);
        check(h[0] == 0x3c00 && h[1] == 0x3c02 && h[2] == 0xfbff && h[3] == 0x0000,
              "quantize F16: nearest-even, saturates past 65504, 2e-8 to 0");
        const float w[2] = {1.0f + 1.0f / 256, 1.0f + 3.0f / 256};
        quantize_row(GGML_TYPE_BF16, w, 2, bf);
        check(bf[0] == 0x3f80 && bf[1] == 0x3f82, "quantize BF16: round to nearest-even");
    }
    free(x);
    free(y);
    free(q);
    free(q2);
}
