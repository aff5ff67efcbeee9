/* The range of values the attention holds (docs/guarantees.md, "The range of v"): with every
 * |v| <= FLT_MAX / (2 len_kv) the output is finite for finite scores, on every path (packed rows,
 * unpacked rows, split-KV, 16-bit K/V, the backward), and a split-KV chunk whose keys all lie far
 * below the row's max drops out of the merge whatever its values. Every backend, both exp modes.
 * Expected values come from the inputs' construction (equal values, a key alone at the max). */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

static const char *const EXP_MODES[] = {"fast", "sleef"};

static float *floats(size_t n) {
    float *x = calloc(n ? n : 1, sizeof(float));
    cr_assert(x);
    return x;
}

/* One head: len_q rows over len_kv keys of width d, q = k = 0 (every score 0 before the mask),
 * the mask row shared by every query (row stride 0), out and lse written. */
static void one_head(float *out, float *lse, const float *v, const float *mask, size_t len_q,
                     size_t len_kv, size_t d) {
    float *qk = floats((len_q > len_kv ? len_q : len_kv) * d);
    sdpa_mha_desc desc;
    cr_assert_eq(sdpa_mha_desc_dense(&desc, 1, 1, 1, len_q, len_kv, d, d, 0.0f, 0), SDPA_OK);
    if (mask) cr_assert_eq(sdpa_mha_desc_set_mask(&desc, mask, 0, 0, 0), SDPA_OK);
    desc.lse = lse;
    desc.lse_stride[0] = desc.lse_stride[1] = len_q;
    cr_assert_eq(sdpa_mha_f32(&desc, out, qk, qk, v), SDPA_OK);
    free(qk);
}

/* Key 0 has mask 0 and v = 0; keys 1.. have mask -1e30 and a huge v. The exact output is 0:
 * the masked keys' weights are exp(-1e30) = 0. With one query row the keys are split into
 * chunks, and the second chunk, normalised by its own max, must drop out of the merge rather
 * than give 0 * inf = NaN (its sum overflows for v beyond the range, 1e38 here). The fast exp
 * may leave such weights subnormal: then only finiteness is asserted for v in the range. */
BACKEND_TEST(split, chunk_far_below_the_max_drops_out) {
    enum { KEYS = 1100, ROWS = 17 };
    const float bigs[] = {1e38f, FLT_MAX / (2.0f * KEYS)};
    float *v = floats(KEYS), *mask = floats(KEYS), *out = floats(ROWS), *lse = floats(ROWS);
    for (size_t e = 0; e < 2; e++) {
        cr_assert_eq(sdpa_set_exp_mode(EXP_MODES[e]), SDPA_OK);
        for (size_t b = 0; b < sizeof bigs / sizeof bigs[0]; b++) {
            for (size_t j = 1; j < KEYS; j++) {
                v[j] = bigs[b];
                mask[j] = -1e30f;
            }
            const size_t rows[] = {1, ROWS}; /* split-KV, and the unsplit rows */
            for (size_t r = 0; r < 2; r++) {
                one_head(out, lse, v, mask, rows[r], KEYS, 1);
                for (size_t i = 0; i < rows[r]; i++) {
                    cr_assert(!isnan(out[i]) && !isnan(lse[i]),
                              "exp %s v %g rows %zu: out[%zu] = %g, lse %g", EXP_MODES[e], bigs[b],
                              rows[r], i, out[i], lse[i]);
                    if (e == 1) /* sleef: exact zeros for the masked weights */
                        cr_assert(out[i] == 0.0f && lse[i] == 0.0f,
                                  "sleef v %g rows %zu: out[%zu] = %g, lse %g", bigs[b], rows[r], i,
                                  out[i], lse[i]);
                    else if (bigs[b] < 1e38f)
                        cr_assert(isfinite(out[i]), "fast: out[%zu] = %g", i, out[i]);
                }
            }
        }
    }
    sdpa_set_exp_mode("fast");
    free(v);
    free(mask);
    free(out);
    free(lse);
}

/* Equal scores and every v at the edge of the range, +-FLT_MAX / (2 len_kv) by column: each
 * output is that value, within 1e-5 relative, on each path a shape selects: len_q 1 over 10 keys
 * (unpacked), over 1100 (split-KV), 17 rows (packed blocks, d <= 128), d = 1 and 64. */
BACKEND_TEST(split, values_at_the_edge_of_the_range) {
    const size_t shapes[][3] = {{1, 10, 1},    {1, 10, 64},   {3, 10, 64},    {1, 1100, 1},
                                {1, 1100, 64}, {17, 1100, 1}, {17, 1100, 64}, {17, 10, 64}};
    for (size_t e = 0; e < 2; e++) {
        cr_assert_eq(sdpa_set_exp_mode(EXP_MODES[e]), SDPA_OK);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const size_t len_q = shapes[s][0], len_kv = shapes[s][1], d = shapes[s][2];
            const float edge = FLT_MAX / (2.0f * (float)len_kv);
            float *v = floats(len_kv * d), *out = floats(len_q * d), *lse = floats(len_q);
            for (size_t j = 0; j < len_kv; j++)
                for (size_t c = 0; c < d; c++) v[j * d + c] = c % 2 ? -edge : edge;
            one_head(out, lse, v, NULL, len_q, len_kv, d);
            for (size_t i = 0; i < len_q * d; i++) {
                const double want = i % d % 2 ? -(double)edge : (double)edge;
                cr_assert(fabs(out[i] - want) <= 1e-5 * fabs(want),
                          "exp %s %zux%zu d %zu: out[%zu] = %g, want %g", EXP_MODES[e], len_q,
                          len_kv, d, i, out[i], want);
            }
            for (size_t i = 0; i < len_q; i++)
                cr_assert(fabs(lse[i] - log((double)len_kv)) <= 1e-5 * log((double)len_kv) + 1e-6,
                          "lse[%zu] = %g", i, lse[i]);
            free(v);
            free(out);
            free(lse);
        }
    }
    sdpa_set_exp_mode("fast");
}

/* The same edge through bf16 K and V (f16 cannot hold such values), decode and prefill rows: the
 * bf16 value nearest below the edge, which each output equals within 1e-5. */
BACKEND_TEST(split, bf16_values_at_the_edge_of_the_range) {
    const size_t shapes[][3] = {{1, 1100, 64}, {17, 1100, 64}, {2, 10, 8}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const size_t len_q = shapes[s][0], len_kv = shapes[s][1], d = shapes[s][2];
        /* truncating the float's low 16 bits rounds toward zero: at most the edge */
        float edge = FLT_MAX / (2.0f * (float)len_kv);
        uint32_t bits;
        memcpy(&bits, &edge, sizeof bits);
        bits &= 0xffff0000u;
        memcpy(&edge, &bits, sizeof bits);
        float *vf = floats(len_kv * d), *out = floats(len_q * d), *q = floats(len_q * d);
        uint16_t *k16 = calloc(len_kv * d, sizeof(uint16_t)), *v16 = calloc(len_kv * d, 2);
        cr_assert(k16 && v16);
        for (size_t i = 0; i < len_kv * d; i++) vf[i] = i % d % 2 ? -edge : edge;
        cr_assert_eq(sdpa_convert(v16, SDPA_BF16, vf, SDPA_F32, len_kv * d), SDPA_OK);
        sdpa_mha_desc desc;
        cr_assert_eq(sdpa_mha_desc_dense(&desc, 1, 1, 1, len_q, len_kv, d, d, 0.0f, 0), SDPA_OK);
        desc.kv_type = SDPA_BF16;
        for (size_t e = 0; e < 2; e++) {
            cr_assert_eq(sdpa_set_exp_mode(EXP_MODES[e]), SDPA_OK);
            cr_assert_eq(sdpa_mha(&desc, out, q, k16, v16), SDPA_OK);
            for (size_t i = 0; i < len_q * d; i++) {
                const double want = i % d % 2 ? -(double)edge : (double)edge;
                cr_assert(fabs(out[i] - want) <= 1e-5 * fabs(want),
                          "exp %s %zux%zu d %zu: out[%zu] = %g, want %g", EXP_MODES[e], len_q,
                          len_kv, d, i, out[i], want);
            }
        }
        sdpa_set_exp_mode("fast");
        free(vf);
        free(out);
        free(q);
        free(k16);
        free(v16);
    }
}

/* The backward at the edge: with q = k = 0 (equal weights 1/len_kv) and dout = 1/d_v, dv_j =
 * len_q / (len_kv d_v) exactly, and D_i = dout_i . out_i and dP_ij = dout_i . v_j stay within
 * the values' range (docs/guarantees.md: sum_c |dout_ic| <= 1), so dq and dk are finite. */
BACKEND_TEST(split, backward_values_at_the_edge_of_the_range) {
    const size_t shapes[][3] = {{4, 10, 8}, {40, 600, 16}, {1, 1100, 1}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const size_t len_q = shapes[s][0], len_kv = shapes[s][1], d = shapes[s][2];
        const float edge = FLT_MAX / (2.0f * (float)len_kv);
        float *q = floats(len_q * d), *k = floats(len_kv * d), *v = floats(len_kv * d);
        float *out = floats(len_q * d), *lse = floats(len_q), *dout = floats(len_q * d);
        float *dq = floats(len_q * d), *dk = floats(len_kv * d), *dv = floats(len_kv * d);
        for (size_t i = 0; i < len_kv * d; i++) v[i] = i % d % 2 ? -edge : edge;
        for (size_t i = 0; i < len_q * d; i++) dout[i] = 1.0f / (float)d;
        sdpa_mha_desc desc;
        cr_assert_eq(sdpa_mha_desc_dense(&desc, 1, 1, 1, len_q, len_kv, d, d, 0.0f, 0), SDPA_OK);
        desc.lse = lse;
        desc.lse_stride[0] = desc.lse_stride[1] = len_q;
        cr_assert_eq(sdpa_mha_f32(&desc, out, q, k, v), SDPA_OK);
        sdpa_mha_grads g = {sizeof g, 0, dq, dk, dv, {0}, {0}, {0}, dout, {0}, NULL};
        for (int a = 0; a < 3; a++)
            g.dq_stride[a] = g.dk_stride[a] = g.dv_stride[a] = g.dout_stride[a] = 0;
        g.dq_stride[2] = g.dout_stride[2] = g.dk_stride[2] = g.dv_stride[2] = d;
        g.dq_stride[1] = g.dq_stride[0] = g.dout_stride[1] = g.dout_stride[0] = len_q * d;
        g.dk_stride[1] = g.dk_stride[0] = g.dv_stride[1] = g.dv_stride[0] = len_kv * d;
        cr_assert_eq(sdpa_mha_backward_f32(&desc, &g, q, k, v, out), SDPA_OK);
        const double want_dv = (double)len_q / ((double)len_kv * (double)d);
        for (size_t i = 0; i < len_kv * d; i++) {
            cr_assert(fabs(dv[i] - want_dv) <= 1e-5 * want_dv, "%zux%zu d %zu: dv[%zu] = %g", len_q,
                      len_kv, d, i, dv[i]);
            cr_assert(isfinite(dk[i]), "%zux%zu d %zu: dk[%zu] = %g", len_q, len_kv, d, i, dk[i]);
        }
        for (size_t i = 0; i < len_q * d; i++)
            cr_assert(isfinite(dq[i]), "%zux%zu d %zu: dq[%zu] = %g", len_q, len_kv, d, i, dq[i]);
        float *all[] = {q, k, v, out, lse, dout, dq, dk, dv};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
    }
}
