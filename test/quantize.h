// quantize.h — encoders: fp32 rows to the GGML block formats that qwen.cu reads (test/ only).
//
// Each quantize_row_TYPE(x, n, dst) writes n values (n a multiple of the block size) as n / blck
// blocks of TYPE. The decoder every encoder must agree with is qwen.cu's dequant_unit (section 3):
// the tests (test/test_quantize.h) quantize here and dequantize there. Include after qwen.cu.
//
// The encoders are plain, deterministic loops (no randomness, no threads): the same input gives
// the same bytes. An all-zero block gets a zero scale (never a division by zero, never NaN); a
// scale too small for fp16 rounds to zero and the block decodes to zeros; a scale too large for
// fp16 saturates at 65504 instead of becoming inf. Every stored fp16 is rounded to nearest-even
// (cuda_fp16's host __float2half), and the integers are always chosen against the rounded scale,
// the one the decoder will use.
//
// The fits, in one line each (details at each function):
//   Q8_0    d = amax / 127, q = round(x / d)
//   Q4_0    d = (signed extreme) / -8: the extreme lands exactly on q = 0
//   Q6_K    per 16 values a searched scale, those 16 scales to int8 under one fp16 d
//   Q5_K    per 32 values a least-squares scale and min, both to 6 bits under fp16 d and dmin
//   Q5_1    per 32 values the same least-squares scale and offset, each stored as fp16
//   IQ4_XS  per 32 values a searched scale on the non-linear table, to 6 bits under one fp16 d
//   IQ4_NL  per 32 values the same search, the scale stored as fp16
#pragma once

// --- shared helpers ------------------------------------------------------------------------------

// Tests only: 1 replaces every fit by its naive first guess (no search, no least squares, no
// nudging of the stored scales), so that the tests can show what the search buys. Q8_0 and Q4_0
// have no search; their naive forms are named at each.
static int qz_naive = 0;

// f rounded to the nearest fp16 (ties to even), as raw bits; beyond fp16's range it saturates at
// +-65504 (the largest finite half) so that a scale never becomes inf.
static uint16_t qz_fp16(float f) {
    if (f > 65504.0f) f = 65504.0f;
    if (f < -65504.0f) f = -65504.0f;
    __half_raw r = __float2half(f);
    return r.x;
}

// round(v), halves away from zero, as an integer clamped to [lo, hi]; a NaN gives lo. The clamp
// comes before the conversion so that a huge v never overflows it. (Adding +-1/2 and truncating is
// lroundf without the library call, which the searches would otherwise make millions of times.)
static int qz_round(float v, int lo, int hi) {
    if (!(v > (float)lo)) return lo;
    if (v >= (float)hi) return hi;
    return (int)(v + (v >= 0.0f ? 0.5f : -0.5f));
}

// The value of largest magnitude, with its sign (0 for an all-zero block).
static float qz_extreme(const float *x, int n) {
    float m = 0.0f;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > fabsf(m)) m = x[i];
    return m;
}

// Squared error of y = s * q with q = round(x / s) clamped to [lo, hi] (s = 0: q = 0).
static double qz_err_linear(const float *x, int n, float s, int lo, int hi) {
    double e = 0.0;
    float is = s != 0.0f ? 1.0f / s : 0.0f;
    for (int i = 0; i < n; i++) {
        float d = x[i] - s * qz_round(x[i] * is, lo, hi);
        e += (double)d * d;
    }
    return e;
}

// --- Q8_0: 32 values, y = d * q, q int8 ---------------------------------------------------------
// The plain symmetric fit: d = amax / 127 maps the largest magnitude to +-127; every value is
// rounded to its nearest multiple of the stored (fp16) d. (Naive: rounded against the fp32 d.)
static void quantize_row_q8_0(const float *x, int64_t n, void *dst) {
    block_q8_0 *b = (block_q8_0 *)dst;
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        float amax = fabsf(qz_extreme(x, 32));
        b[i].d = qz_fp16(amax / 127.0f);
        float d = qz_naive ? amax / 127.0f : fp16_to_f32(b[i].d);
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int j = 0; j < 32; j++) b[i].qs[j] = (int8_t)qz_round(x[j] * id, -127, 127);
    }
}

// --- Q4_0: 32 values, y = d * (q - 8), q in 0..15 -----------------------------------------------
// The range -8..7 is lopsided, so the value of largest magnitude m (with its sign) takes the long
// end: d = m / -8 makes x = m exactly q = 0 (y = -8 d = m), and the other values round to their
// nearest step, clamped to 0..15. (Naive: the symmetric d = amax / 7, which leaves q = 0 unused.)
static void quantize_row_q4_0(const float *x, int64_t n, void *dst) {
    block_q4_0 *b = (block_q4_0 *)dst;
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        float m = qz_extreme(x, 32);
        b[i].d = qz_fp16(qz_naive ? fabsf(m) / 7.0f : m / -8.0f);
        float d = fp16_to_f32(b[i].d), id = d != 0.0f ? 1.0f / d : 0.0f;
        uint8_t q[32];
        for (int j = 0; j < 32; j++) q[j] = (uint8_t)(qz_round(x[j] * id, -8, 7) + 8);
        for (int j = 0; j < 16; j++) b[i].qs[j] = (uint8_t)(q[j] | q[j + 16] << 4);
    }
}

// --- Q6_K: 256 values = 16 sub-blocks of 16, y = d * sc * (q - 32), q in 0..63, sc int8 ----------

// The scale of one 16-value sub-block: the signed extreme m mapped near the long end of -32..31,
// i.e. s = m / den for den in -34..-28 in steps of 1/4 (den = -32 is the naive choice; a smaller
// |den| clips nothing and rounds the rest more finely, a larger one clips the extreme a little).
// Each candidate's integers then get their least-squares scale sum(x q) / sum(q^2), and the
// candidate with the least squared error wins.
static float qz_fit_q6_sub(const float *x) {
    float m = qz_extreme(x, 16);
    if (m == 0.0f || qz_naive) return m / -32.0f;
    float best_s = m / -32.0f;
    double best = qz_err_linear(x, 16, best_s, -32, 31);
    for (int k = -8; k <= 16; k++) {
        float s = m / (-32.0f + 0.25f * k), is = 1.0f / s;
        double sxq = 0.0, sqq = 0.0;
        for (int i = 0; i < 16; i++) {
            int q = qz_round(x[i] * is, -32, 31);
            sxq += (double)x[i] * q;
            sqq += (double)q * q;
        }
        if (sqq == 0.0) continue;
        float s2 = (float)(sxq / sqq); // least squares for these integers
        double e = qz_err_linear(x, 16, s2, -32, 31);
        if (e < best) best = e, best_s = s2;
    }
    return best_s;
}

// The fp16 values to try for a stored scale f: its round-to-nearest-even value first, then that
// value's two fp16 neighbours (never crossing zero or reaching inf). A block's scale d is shared
// by all its sub-block scales, and for small weights it lies in fp16's subnormal range, where one
// step is several percent: rounding it down can clip the block's largest value, and one neighbour
// often fits the whole block better than the nearest. Returns how many were written (1 for zero).
static int qz_fp16_candidates(float f, uint16_t out[3]) {
    uint16_t h = qz_fp16(f);
    int n = 0;
    out[n++] = h;
    if ((h & 0x7fff) == 0 || qz_naive) return n;
    out[n++] = (uint16_t)(h - 1);                                 // one step smaller in magnitude
    if ((h & 0x7fff) < 0x7bff) out[n++] = (uint16_t)(h + 1);      // one step larger, still finite
    return n;
}

// Q6_K with the shared scale d fixed: each sub-block's int8 scale sc = round(s / d), nudged by -1,
// 0, +1 to whichever gives the least error once its values are re-quantized with d * sc. Writes
// the scales and the stored values (q + 32) and returns the block's squared error.
static double qz_q6_finish(const float *x, const float *s, float d, int8_t *sc, uint8_t *q) {
    double total = 0.0;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int k = 0; k < 16; k++) {
        const float *xs = x + 16 * k;
        int sc0 = qz_round(s[k] * id, -128, 127), best_sc = sc0;
        double best = qz_err_linear(xs, 16, d * sc0, -32, 31);
        for (int t = sc0 - 1; t <= sc0 + 1 && !qz_naive; t += 2) {
            if (t < -128 || t > 127) continue;
            double e = qz_err_linear(xs, 16, d * t, -32, 31);
            if (e < best) best = e, best_sc = t;
        }
        total += best;
        sc[k] = (int8_t)best_sc;
        float e = d * best_sc, ie = e != 0.0f ? 1.0f / e : 0.0f;
        for (int l = 0; l < 16; l++)
            q[16 * k + l] = (uint8_t)(qz_round(xs[l] * ie, -32, 31) + 32);
    }
    return total;
}

// The sub-block scales s[16] are stored as int8 sc under one fp16 d: d = (signed extreme of s) /
// -128 puts the largest scale on the long end of int8; d's fp16 neighbours are tried too
// (qz_fp16_candidates), and qz_q6_finish quantizes the scales and the values for each d.
static void quantize_row_q6_K(const float *x, int64_t n, void *dst) {
    block_q6_K *b = (block_q6_K *)dst;
    for (int64_t i = 0; i < n / 256; i++, x += 256) {
        float s[16];
        for (int k = 0; k < 16; k++) s[k] = qz_fit_q6_sub(x + 16 * k);
        uint16_t cand[3];
        int nc = qz_fp16_candidates(qz_extreme(s, 16) / -128.0f, cand);
        int8_t sc[16];
        uint8_t q[256], best_q[256] = {0};
        double best = -1.0;
        for (int c = 0; c < nc; c++) {
            double e = qz_q6_finish(x, s, fp16_to_f32(cand[c]), sc, q);
            if (best < 0.0 || e < best) {
                best = e;
                b[i].d = cand[c];
                memcpy(b[i].scales, sc, sizeof sc);
                memcpy(best_q, q, sizeof q);
            }
        }
        // pack: value p = 128 h + 32 j + l (half h, quarter j, l < 32) keeps its low 4 bits in
        // ql[64 h + 32 (j % 2) + l] (low nibble for j < 2, high for j >= 2) and its top 2 bits in
        // bits 2j, 2j+1 of qh[32 h + l]; its scale is scales[p / 16]
        memset(b[i].ql, 0, sizeof b[i].ql);
        memset(b[i].qh, 0, sizeof b[i].qh);
        for (int p = 0; p < 256; p++) {
            int h = p / 128, j = (p % 128) / 32, l = p % 32;
            b[i].ql[64 * h + 32 * (j % 2) + l] |= (uint8_t)((best_q[p] & 0xf) << 4 * (j / 2));
            b[i].qh[32 * h + l] |= (uint8_t)((best_q[p] >> 4) << 2 * j);
        }
    }
}

// --- the affine fit of Q5_K and Q5_1: y = s * q + c, q in 0..qmax -------------------------------

// Squared error of y = s q + c with q = round((x - c) / s) clamped to 0..qmax (s = 0: q = 0).
static double qz_err_affine(const float *x, int n, float s, float c, int qmax) {
    double e = 0.0;
    float is = s != 0.0f ? 1.0f / s : 0.0f;
    for (int i = 0; i < n; i++) {
        float d = x[i] - (s * qz_round((x[i] - c) * is, 0, qmax) + c);
        e += (double)d * d;
    }
    return e;
}

// Fit s >= 0 and c to n values. The naive fit is the range: c = min, s = (max - min) / qmax. The
// search starts again from grids of a finer step, s = (max - min) / (qmax + k/2) for k = 0..8,
// centred on the range and then shifted by -1/2 .. +1/2 of a step (so the extremes may clip a
// little in exchange for a finer step, at either end), and from each start alternates a few
// rounds: the integers q for the current (s, c) and the error they give, then the least-squares
// line through (q_i, x_i) for those integers as the next (s, c). The pair with the least error
// wins. With c_le_0 the offset may only subtract (Q5_K stores it as -dmin * m with m >= 0): c is
// clamped to <= 0 and s refit alone.
static void qz_fit_affine(const float *x, int n, int qmax, int c_le_0, float *s_out, float *c_out) {
    float lo = x[0], hi = x[0];
    double sx = 0.0;
    for (int i = 0; i < n; i++) lo = fminf(lo, x[i]), hi = fmaxf(hi, x[i]), sx += x[i];
    if (c_le_0 && lo > 0.0f) lo = 0.0f;
    *s_out = (hi - lo) / qmax, *c_out = lo;
    if (hi == lo || qz_naive) return;
    double best = qz_err_affine(x, n, *s_out, *c_out, qmax);
    for (int start = 0; start < 9 * 5; start++) {
        int k = start / 5, j = start % 5 - 2;
        float s = (hi - lo) / (qmax + 0.5f * k);
        float c = lo + 0.5f * (hi - lo - qmax * s) + 0.25f * j * s;
        if (c_le_0 && c > 0.0f) c = 0.0f;
        for (int round = 0; round < 5; round++) {
            double e = 0.0, sq = 0.0, sqq = 0.0, sqx = 0.0;
            float is = 1.0f / s;
            for (int i = 0; i < n; i++) {
                int q = qz_round((x[i] - c) * is, 0, qmax);
                float d = x[i] - (s * q + c);
                e += (double)d * d, sq += q, sqq += (double)q * q, sqx += (double)q * x[i];
            }
            if (e < best) best = e, *s_out = s, *c_out = c;
            double det = n * sqq - sq * sq;
            if (det <= 0.0) break; // every q equal: the line is not determined
            double s2 = (n * sqx - sq * sx) / det, c2 = (sx - s2 * sq) / n;
            if (c_le_0 && c2 > 0.0) c2 = 0.0, s2 = sqq > 0.0 ? sqx / sqq : 0.0;
            if (!(s2 > 0.0)) break;
            s = (float)s2, c = (float)c2;
        }
    }
}

// Q5_K with d and dmin fixed: each sub-block's 6-bit scale sc = round(s / d) and min
// m = round(min / dmin), each nudged by -1, 0, +1, keeping the pair with the least error once the
// values are re-quantized with the final scale d * sc and min dmin * m. Writes sc, m and the
// values and returns the block's squared error.
static double qz_q5k_finish(const float *x, const float *s, const float *mn, float d, float dmin,
                            int *sc, int *m, uint8_t *q) {
    double total = 0.0;
    float id = d != 0.0f ? 1.0f / d : 0.0f, idmin = dmin != 0.0f ? 1.0f / dmin : 0.0f;
    for (int k = 0; k < 8; k++) {
        const float *xs = x + 32 * k;
        int sc0 = qz_round(s[k] * id, 0, 63), m0 = qz_round(mn[k] * idmin, 0, 63);
        double best = -1.0;
        for (int a = sc0 - 1; a <= sc0 + 1; a++)
            for (int c = m0 - 1; c <= m0 + 1; c++) {
                if (a < 0 || a > 63 || c < 0 || c > 63) continue;
                if (qz_naive && (a != sc0 || c != m0)) continue;
                double e = qz_err_affine(xs, 32, d * a, -dmin * c, 31);
                if (best < 0.0 || e < best) best = e, sc[k] = a, m[k] = c;
            }
        total += best;
        float e = d * sc[k], ie = e != 0.0f ? 1.0f / e : 0.0f, off = dmin * m[k];
        for (int l = 0; l < 32; l++) q[32 * k + l] = (uint8_t)qz_round((xs[l] + off) * ie, 0, 31);
    }
    return total;
}

// --- Q5_K: 256 values = 8 sub-blocks of 32, y = d * sc * q - dmin * m, q in 0..31 ----------------
// Each sub-block gets a scale and a min by qz_fit_affine (c = -min, min >= 0). The eight scales and
// eight mins are stored as 6-bit integers under d = max(scale) / 63 and dmin = max(min) / 63, the
// largest of each exact. d's fp16 neighbours are tried (with dmin's nearest), then dmin's (with the
// best d), and qz_q5k_finish quantizes the scales, mins and values for each.
static void quantize_row_q5_K(const float *x, int64_t n, void *dst) {
    block_q5_K *b = (block_q5_K *)dst;
    for (int64_t i = 0; i < n / 256; i++, x += 256) {
        float s[8], mn[8], smax = 0.0f, mmax = 0.0f;
        for (int k = 0; k < 8; k++) {
            float c;
            qz_fit_affine(x + 32 * k, 32, 31, 1, &s[k], &c);
            mn[k] = -c;
            smax = fmaxf(smax, s[k]), mmax = fmaxf(mmax, mn[k]);
        }
        uint16_t cd[3], cm[3];
        int ncd = qz_fp16_candidates(smax / 63.0f, cd), ncm = qz_fp16_candidates(mmax / 63.0f, cm);
        int sc[8], m[8], best_sc[8] = {0}, best_m[8] = {0};
        uint8_t q[256], best_q[256] = {0};
        double best = -1.0;
        b[i].dmin = cm[0];
        // pass 0: d's candidates with dmin's nearest; pass 1: dmin's others with the best d
        for (int pass = 0; pass < 2; pass++)
            for (int c = pass; c < (pass ? ncm : ncd); c++) {
                uint16_t dh = pass ? b[i].d : cd[c], mh = pass ? cm[c] : b[i].dmin;
                double e = qz_q5k_finish(x, s, mn, fp16_to_f32(dh), fp16_to_f32(mh), sc, m, q);
                if (best < 0.0 || e < best) {
                    best = e;
                    b[i].d = dh, b[i].dmin = mh;
                    memcpy(best_sc, sc, sizeof sc);
                    memcpy(best_m, m, sizeof m);
                    memcpy(best_q, q, sizeof q);
                }
            }
        // the 6-bit pairs, as k_scale_min unpacks them: sub-blocks 0..3 in the low 6 bits of
        // scales[k] (scale) and scales[k+4] (min); sub-blocks 4..7 as low nibbles in scales[k+4]
        // (scale low, min high) with their top 2 bits in the top bits of scales[k-4] and scales[k]
        memset(b[i].scales, 0, sizeof b[i].scales);
        for (int k = 0; k < 8; k++) {
            if (k < 4) {
                b[i].scales[k] |= (uint8_t)best_sc[k];
                b[i].scales[k + 4] |= (uint8_t)best_m[k];
            } else {
                b[i].scales[k + 4] = (uint8_t)((best_sc[k] & 0xf) | (best_m[k] & 0xf) << 4);
                b[i].scales[k - 4] |= (uint8_t)((best_sc[k] >> 4) << 6);
                b[i].scales[k] |= (uint8_t)((best_m[k] >> 4) << 6);
            }
        }
        // value l of sub-block k: low 4 bits in qs[32 (k / 2) + l] (low nibble for even k, high
        // for odd), the 5th bit is bit k of qh[l]
        memset(b[i].qs, 0, sizeof b[i].qs);
        memset(b[i].qh, 0, sizeof b[i].qh);
        for (int k = 0; k < 8; k++)
            for (int l = 0; l < 32; l++) {
                b[i].qs[32 * (k / 2) + l] |= (uint8_t)((best_q[32 * k + l] & 0xf) << 4 * (k % 2));
                b[i].qh[l] |= (uint8_t)((best_q[32 * k + l] >> 4) << k);
            }
    }
}

// --- Q5_1: 32 values, y = d * q + m, q in 0..31 -------------------------------------------------
// (Q5_K's fallback for a row length that is not a multiple of 256.) The same least-squares fit
// with the offset free in sign. Then d and m as fp16: d's candidates (qz_fp16_candidates), and for
// each, m's candidates plus the best offset for that d, mean(x - d q), rounded: the pair with the
// least error is stored and the values re-quantized against it.
static void quantize_row_q5_1(const float *x, int64_t n, void *dst) {
    block_q5_1 *b = (block_q5_1 *)dst;
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        float s, c;
        qz_fit_affine(x, 32, 31, 0, &s, &c);
        uint16_t cd[3], cm[4];
        int ncd = qz_fp16_candidates(s, cd);
        double best = -1.0;
        for (int a = 0; a < ncd; a++) {
            float d = fp16_to_f32(cd[a]), id = d != 0.0f ? 1.0f / d : 0.0f;
            int ncm = qz_fp16_candidates(c, cm);
            if (!qz_naive) {
                double r = 0.0; // the offset that fits best with this d and these integers
                for (int j = 0; j < 32; j++) r += x[j] - d * qz_round((x[j] - c) * id, 0, 31);
                cm[ncm++] = qz_fp16((float)(r / 32));
            }
            for (int k = 0; k < ncm; k++) {
                double e = qz_err_affine(x, 32, d, fp16_to_f32(cm[k]), 31);
                if (best < 0.0 || e < best) best = e, b[i].d = cd[a], b[i].m = cm[k];
            }
        }
        float d = fp16_to_f32(b[i].d), m = fp16_to_f32(b[i].m), id = d != 0.0f ? 1.0f / d : 0.0f;
        uint32_t qh = 0;
        memset(b[i].qs, 0, sizeof b[i].qs);
        // value j: low 4 bits in qs[j % 16] (low nibble for j < 16), its 5th bit is bit j of qh
        for (int j = 0; j < 32; j++) {
            int q = qz_round((x[j] - m) * id, 0, 31);
            b[i].qs[j % 16] |= (uint8_t)((q & 0xf) << 4 * (j / 16));
            qh |= (uint32_t)(q >> 4) << j;
        }
        memcpy(b[i].qh, &qh, 4); // little-endian, as the decoder reads it
    }
}

// --- IQ4_NL / IQ4_XS: y = scale * kvalues[q], q in 0..15 ----------------------------------------

// The table entry nearest to v, ties to the upper one. The midpoints between neighbouring entries
// are all multiples of 1/2, so every half-unit cell [k/2, (k+1)/2) of -128..128 lies wholly on one
// side of each: a 512-entry table of the answer per cell, filled once by a plain scan, replaces a
// search whose branches the processor cannot predict (the scale searches call this millions of
// times).
static uint8_t qz_iq4_cell[512];
static int qz_iq4_nearest(float v) {
    if (!(v > -128.0f)) return 0;
    if (v >= 127.5f) return 15;
    if (!qz_iq4_cell[511]) // not filled yet (the last cell's answer is 15, never 0)
        for (int k = 0; k < 512; k++) {
            float c = (k - 256) * 0.5f + 0.25f; // the cell's centre: never on a midpoint
            int best = 0;
            for (int i = 1; i < 16; i++)
                if (fabsf(c - KVALUES_IQ4NL[i]) < fabsf(c - KVALUES_IQ4NL[best])) best = i;
            qz_iq4_cell[k] = (uint8_t)best;
        }
    return qz_iq4_cell[(int)floorf(2.0f * v) + 256];
}

// Squared error of y = s * kv[nearest(x / s)] (s = 0: y = 0).
static double qz_err_iq4(const float *x, int n, float s) {
    double e = 0.0;
    float is = s != 0.0f ? 1.0f / s : 0.0f;
    for (int i = 0; i < n; i++) {
        float d = s != 0.0f ? x[i] - s * KVALUES_IQ4NL[qz_iq4_nearest(x[i] * is)] : x[i];
        e += (double)d * d;
    }
    return e;
}

// The scale of one 32-value sub-block on the non-linear table. The table runs from -127 to +113,
// so the signed extreme m can go to either end and the two are not mirror images: the candidates
// put m at -127 + k (k = -4..32) or at +113 - k (k = -4..24), i.e. the inverse scale
// t = (end -+ k) / m. For each, every value takes its nearest table entry, then the least-squares
// scale sum(x kv) / sum(kv^2) for those entries gives the candidate's error
// sum(x^2) - sum(x kv)^2 / sum(kv^2); the least error wins. (k = 0 at -127 is the naive choice.)
static float qz_fit_iq4_sub(const float *x, int n) {
    float m = qz_extreme(x, n);
    if (m == 0.0f || qz_naive) return m / -127.0f;
    double sxx = 0.0;
    for (int i = 0; i < n; i++) sxx += (double)x[i] * x[i];
    float best_s = m / -127.0f;
    double best = qz_err_iq4(x, n, best_s);
    for (int side = 0; side < 2; side++)
        for (int k = -4; k <= (side ? 24 : 32); k++) {
            float t = (side ? 113.0f - k : -127.0f + k) / m;
            double sxv = 0.0, svv = 0.0;
            for (int i = 0; i < n; i++) {
                int v = KVALUES_IQ4NL[qz_iq4_nearest(x[i] * t)];
                sxv += (double)x[i] * v, svv += (double)v * v;
            }
            double e = sxx - sxv * sxv / svv; // svv > 0: no table entry is 0
            if (e < best) best = e, best_s = (float)(sxv / svv);
        }
    return best_s;
}

// IQ4_XS with d fixed: each sub-block's l = round(s / d) in -32..31, nudged by -1, 0, +1 to
// whichever gives the least error once its values are re-quantized (nearest table entry) with
// the final scale d * l. Writes l and the table indexes and returns the block's squared error.
static double qz_iq4xs_finish(const float *x, const float *s, float d, int *l, uint8_t *q) {
    double total = 0.0;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int k = 0; k < 8; k++) {
        const float *xs = x + 32 * k;
        int l0 = qz_round(s[k] * id, -32, 31);
        double best = qz_err_iq4(xs, 32, d * l0);
        l[k] = l0;
        for (int t = l0 - 1; t <= l0 + 1 && !qz_naive; t += 2) {
            if (t < -32 || t > 31) continue;
            double e = qz_err_iq4(xs, 32, d * t);
            if (e < best) best = e, l[k] = t;
        }
        total += best;
        float e = d * l[k], ie = e != 0.0f ? 1.0f / e : 0.0f;
        for (int j = 0; j < 32; j++)
            q[32 * k + j] = (uint8_t)(e != 0.0f ? qz_iq4_nearest(xs[j] * ie) : 8);
    }
    return total;
}

// IQ4_XS: 256 values = 8 sub-blocks of 32, y = d * (ls - 32) * kvalues[q], ls 6 bits.
// Each sub-block's scale comes from qz_fit_iq4_sub (either sign). The eight are stored as integers
// l = ls - 32 in -32..31 under one fp16 d = (signed extreme of the scales) / -32, which puts the
// largest on the long end exactly; d's fp16 neighbours are tried too, and qz_iq4xs_finish
// quantizes the scales and the values for each d.
static void quantize_row_iq4_xs(const float *x, int64_t n, void *dst) {
    block_iq4_xs *b = (block_iq4_xs *)dst;
    for (int64_t i = 0; i < n / 256; i++, x += 256) {
        float s[8];
        for (int k = 0; k < 8; k++) s[k] = qz_fit_iq4_sub(x + 32 * k, 32);
        uint16_t cand[3];
        int nc = qz_fp16_candidates(qz_extreme(s, 8) / -32.0f, cand);
        int l[8], best_l[8] = {0};
        uint8_t q[256], best_q[256] = {0};
        double best = -1.0;
        for (int c = 0; c < nc; c++) {
            double e = qz_iq4xs_finish(x, s, fp16_to_f32(cand[c]), l, q);
            if (best < 0.0 || e < best) {
                best = e;
                b[i].d = cand[c];
                memcpy(best_l, l, sizeof l);
                memcpy(best_q, q, sizeof q);
            }
        }
        // ls = l + 32: 4 low bits in scales_l (two sub-blocks a byte), 2 high bits in scales_h;
        // value j of sub-block k in qs[16 k + j % 16], the low nibble for j < 16, else the high
        b[i].scales_h = 0;
        memset(b[i].scales_l, 0, sizeof b[i].scales_l);
        for (int k = 0; k < 8; k++) {
            int ls = best_l[k] + 32;
            b[i].scales_l[k / 2] |= (uint8_t)((ls & 0xf) << 4 * (k % 2));
            b[i].scales_h |= (uint16_t)((ls >> 4) << 2 * k);
            for (int j = 0; j < 16; j++)
                b[i].qs[16 * k + j] = (uint8_t)(best_q[32 * k + j] | best_q[32 * k + j + 16] << 4);
        }
    }
}

// IQ4_NL: 32 values, y = d * kvalues[q], d fp16. (IQ4_XS's fallback for a row length that is not a
// multiple of 256.) The same scale search; of the scale's fp16 candidates the one with the least
// error is stored, and the values re-quantized to it.
static void quantize_row_iq4_nl(const float *x, int64_t n, void *dst) {
    block_iq4_nl *b = (block_iq4_nl *)dst;
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        uint16_t cand[3];
        int nc = qz_fp16_candidates(qz_fit_iq4_sub(x, 32), cand);
        double best = -1.0;
        for (int c = 0; c < nc; c++) {
            double e = qz_err_iq4(x, 32, fp16_to_f32(cand[c]));
            if (best < 0.0 || e < best) best = e, b[i].d = cand[c];
        }
        float d = fp16_to_f32(b[i].d), id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int j = 0; j < 16; j++) {
            int q0 = d != 0.0f ? qz_iq4_nearest(x[j] * id) : 8;
            int q1 = d != 0.0f ? qz_iq4_nearest(x[j + 16] * id) : 8;
            b[i].qs[j] = (uint8_t)(q0 | q1 << 4);
        }
    }
}

// --- any type, by its GGML id --------------------------------------------------------------------

// Whether quantize_row can write this type.
static int quantize_type_supported(int type) {
    switch (type) {
    case GGML_TYPE_F32: case GGML_TYPE_F16: case GGML_TYPE_BF16: case GGML_TYPE_Q8_0:
    case GGML_TYPE_Q4_0: case GGML_TYPE_Q6_K: case GGML_TYPE_Q5_K: case GGML_TYPE_Q5_1:
    case GGML_TYPE_IQ4_XS: case GGML_TYPE_IQ4_NL: return 1;
    default: return 0;
    }
}

// n values of x as `type`, n a multiple of its block size. F32 is a copy; F16 and BF16 round to
// nearest-even (bf16: the top half of the fp32 after rounding; a NaN stays a NaN).
static void quantize_row(int type, const float *x, int64_t n, void *dst) {
    switch (type) {
    case GGML_TYPE_F32: memcpy(dst, x, (size_t)n * sizeof(float)); return;
    case GGML_TYPE_F16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = qz_fp16(x[i]);
        return;
    case GGML_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, &x[i], 4);
            if ((u & 0x7fffffffu) > 0x7f800000u) u |= 0x00400000u;  // NaN: keep it quiet and NaN
            else u += 0x7fffu + ((u >> 16) & 1);                     // round to nearest-even
            ((uint16_t *)dst)[i] = (uint16_t)(u >> 16);
        }
        return;
    case GGML_TYPE_Q8_0: quantize_row_q8_0(x, n, dst); return;
    case GGML_TYPE_Q4_0: quantize_row_q4_0(x, n, dst); return;
    case GGML_TYPE_Q6_K: quantize_row_q6_K(x, n, dst); return;
    case GGML_TYPE_Q5_K: quantize_row_q5_K(x, n, dst); return;
    case GGML_TYPE_Q5_1: quantize_row_q5_1(x, n, dst); return;
    case GGML_TYPE_IQ4_XS: quantize_row_iq4_xs(x, n, dst); return;
    case GGML_TYPE_IQ4_NL: quantize_row_iq4_nl(x, n, dst); return;
    default: die("quantize_row: no encoder for type %s", type_name(type));
    }
}
