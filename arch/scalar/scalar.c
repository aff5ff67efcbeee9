/* Portable C backend: the baseline every CPU runs, and the fallback of every dispatch ladder.
 * Several independent accumulators keep the sums accurate and give the compiler room, without
 * relying on -ffast-math. */
#include <float.h>
#include <math.h>
#include <sleef.h>
#include <stdint.h>
#include <string.h>

#include "any_address.h"
#include "convert_fp8.h"
#include "convert_portable.h"
#include "exp_constants.h"
#include "kernels.h"

#define LANES 4

/* Lanes within blocks of DOT_BLOCK, block sums added into a running total: a product meets at
 * most DOT_BLOCK / LANES + n / DOT_BLOCK + 2 roundings rather than n / LANES, which keeps the
 * documented 1e-5 relative bound at n = 4096 even when every rounding errs the same way (a row
 * of equal values did 1.5e-5 with plain lanes: tests/test_regressions.c). */
#define DOT_BLOCK 256

static float dot_scalar(const f32_any *a, const f32_any *b, size_t n) {
    float total = 0.0f;
    for (size_t start = 0; start < n; start += DOT_BLOCK) {
        size_t end = n - start < DOT_BLOCK ? n : start + DOT_BLOCK;
        float acc[LANES] = {0};
        size_t i = start;
        for (; i + LANES <= end; i += LANES)
            for (int l = 0; l < LANES; l++) acc[l] += a[i + l] * b[i + l];
        for (; i < end; i++) acc[0] += a[i] * b[i];
        total += (acc[0] + acc[1]) + (acc[2] + acc[3]);
    }
    return total;
}
SDPA_DOT_TO(dot_scalar)

static void scale_scalar(f32_any *y, const f32_any *x, size_t n, float alpha) {
    for (size_t i = 0; i < n; i++) y[i] = alpha * x[i];
}

static float max_scaled_scalar(const f32_any *x, size_t n, float scale) {
    float m = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        float z = scale * x[i];
        m = z > m ? z : m;
    }
    return m;
}

/* The shared "fast" exp (see exp_constants.h). */
static float exp_fast_scalar(float x) {
    if (x >= SDPA_EXP_X_OVERFLOW) return INFINITY;
    if (!(x >= SDPA_EXP_X_CLAMP_LO)) return x != x ? x : 0.0f; /* NaN stays, -inf and tiny go */
    /* Round half away from zero by truncation, which ignores the caller's rounding mode
       (nearbyintf follows it: under FE_UPWARD r = x - n ln 2 left [-ln2/2, ln2/2], where the
       polynomial is fitted, and softmax was 5.3e-5 off: tests/test_fpenv.c). |t| < 128 here. */
    float t = x * SDPA_EXP_LOG2E;
    float n = (float)(int32_t)(t + (t < 0.0f ? -0.5f : 0.5f));
    float r = (x - n * SDPA_EXP_LN2_HI_NOFMA) - n * SDPA_EXP_LN2_LO_NOFMA;
    float p = SDPA_EXP_C5;
    p = p * r + SDPA_EXP_C4;
    p = p * r + SDPA_EXP_C3;
    p = p * r + SDPA_EXP_C2;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    float e = f32_from_bits(f32_bits(p) + (uint32_t)((int32_t)n * (1 << 23)));
    return e < FLT_MIN ? 0.0f : e;
}

static float exp_sleef_scalar(float x) {
    float e = Sleef_expf_u10(x);
    return e < FLT_MIN ? 0.0f : e;
}

/* One body for both exp kinds; exp is a constant at each call site, so it inlines. */
static inline float exp_sum_with(float (*exp)(float), f32_any *y, const f32_any *x, size_t n,
                                 float scale, float shift) {
    float acc[LANES] = {0};
    for (size_t i = 0; i < n; i++) {
        float e = exp(scale * x[i] - shift);
        y[i] = e;
        acc[i % LANES] += e;
    }
    return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

static float exp_sum_fast_scalar(f32_any *y, const f32_any *x, size_t n, float scale, float shift) {
    return exp_sum_with(exp_fast_scalar, y, x, n, scale, shift);
}

static float exp_sum_sleef_scalar(f32_any *y, const f32_any *x, size_t n, float scale,
                                  float shift) {
    return exp_sum_with(exp_sleef_scalar, y, x, n, scale, shift);
}

static void normalize_scalar(f32_any *y, size_t n, float factor) {
    for (size_t i = 0; i < n; i++) {
        float w = y[i] * factor;
        y[i] = w < FLT_MIN ? 0.0f : w;
    }
}

static void softmax_backward_scalar(f32_any *dx, const f32_any *y, const f32_any *dy, size_t n,
                                    float scale, float y_dot_dy) {
    for (size_t i = 0; i < n; i++) dx[i] = scale * y[i] * (dy[i] - y_dot_dy);
}

static void exp_fast_array_scalar(f32_any *y, const f32_any *x, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = exp_fast_scalar(x[i]);
}

static void exp_sleef_array_scalar(f32_any *y, const f32_any *x, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = exp_sleef_scalar(x[i]);
}

static void widen_f16_scalar(f32_any *dst, const void *src, size_t n) {
    const u16_any *s = src;
    for (size_t i = 0; i < n; i++) dst[i] = f16_to_f32(s[i]);
}

static void widen_bf16_scalar(f32_any *dst, const void *src, size_t n) {
    const u16_any *s = src;
    for (size_t i = 0; i < n; i++) dst[i] = bf16_to_f32(s[i]);
}

static void widen_e4m3_scalar(uint16_t *dst, const uint8_t *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = fp8_e4m3_to_f16(src[i]);
}

static void widen_e5m2_scalar(uint16_t *dst, const uint8_t *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = fp8_e5m2_to_f16(src[i]);
}

static void narrow_f16_scalar(void *dst, const f32_any *src, size_t n) {
    u16_any *d = dst;
    for (size_t i = 0; i < n; i++) d[i] = f32_to_f16(src[i]);
}

static void narrow_bf16_scalar(void *dst, const f32_any *src, size_t n) {
    u16_any *d = dst;
    for (size_t i = 0; i < n; i++) d[i] = f32_to_bf16(src[i]);
}

/* ---- Attention microkernels (the driver is src/attention.c) ---- */

static void scores_tile_scalar(f32_any *s, size_t ld_s, const f32_any *q, size_t q_stride,
                               size_t nq, const f32_any *k, size_t k_stride, size_t nk, size_t d,
                               float scale) {
    for (size_t i = 0; i < nq; i++)
        for (size_t j = 0; j < nk; j++)
            s[i * ld_s + j] = scale * dot_scalar(q + i * q_stride, k + j * k_stride, d);
}

/* Two keys per pass over an output row halve its loads and stores. */
static void pv_tile_scalar(f32_any *acc, size_t ld_acc, const f32_any *p, size_t ld_p, size_t nq,
                           size_t nk, const f32_any *v, size_t v_stride, size_t d_v) {
    for (size_t i = 0; i < nq; i++) {
        f32_any *o = acc + i * ld_acc;
        const f32_any *pi = p + i * ld_p;
        size_t j = 0;
        for (; j + 2 <= nk; j += 2) {
            const float p0 = pi[j], p1 = pi[j + 1];
            const f32_any *v0 = v + j * v_stride, *v1 = v0 + v_stride;
            for (size_t c = 0; c < d_v; c++) o[c] = (o[c] + p0 * v0[c]) + p1 * v1[c];
        }
        if (j < nk) {
            const float p0 = pi[j];
            const f32_any *v0 = v + j * v_stride;
            for (size_t c = 0; c < d_v; c++) o[c] += p0 * v0[c];
        }
    }
}

/* The same with p[j * ld_p + i]: a key's row of v against every output row, two keys a pass. */
static void pv_tile_t_scalar(float *acc, size_t ld_acc, const float *p, size_t ld_p, size_t nq,
                             size_t nk, const float *v, size_t v_stride, size_t d_v) {
    for (size_t i = 0; i < nq; i++) {
        float *o = acc + i * ld_acc;
        size_t j = 0;
        for (; j + 2 <= nk; j += 2) {
            const float p0 = p[j * ld_p + i], p1 = p[(j + 1) * ld_p + i];
            const float *v0 = v + j * v_stride, *v1 = v0 + v_stride;
            for (size_t c = 0; c < d_v; c++) o[c] = (o[c] + p0 * v0[c]) + p1 * v1[c];
        }
        if (j < nk) {
            const float p0 = p[j * ld_p + i], *v0 = v + j * v_stride;
            for (size_t c = 0; c < d_v; c++) o[c] += p0 * v0[c];
        }
    }
}

/* The backward's P^T from S^T, key-major: st[j][i] = exp(st[j][i] - shift[i]), by exp_sum's exps
 * (which the forward's tiles take), with no sums. */
static inline void exp_keymajor_with(float (*exp)(float), float *st, size_t ld_st, size_t nk,
                                     size_t nq, const float *shift) {
    for (size_t j = 0; j < nk; j++)
        for (size_t i = 0; i < nq; i++) st[j * ld_st + i] = exp(st[j * ld_st + i] - shift[i]);
}

static void exp_keymajor_fast_scalar(float *st, size_t ld_st, size_t nk, size_t nq,
                                     const float *shift) {
    exp_keymajor_with(exp_fast_scalar, st, ld_st, nk, nq, shift);
}

static void exp_keymajor_sleef_scalar(float *st, size_t ld_st, size_t nk, size_t nq,
                                      const float *shift) {
    exp_keymajor_with(exp_sleef_scalar, st, ld_st, nk, nq, shift);
}

/* kernels.h's ds_keymajor, the backward's dS^T = scale P^T o (dP^T - D) */
static void ds_keymajor_scalar(float *ds, const float *p, size_t ld, size_t nk, size_t nq,
                               const float *dd, float scale) {
    for (size_t j = 0; j < nk; j++)
        for (size_t i = 0; i < nq; i++)
            ds[j * ld + i] = scale * (p[j * ld + i] * (ds[j * ld + i] - dd[i]));
}

static const sdpa_attention_kernels attention_scalar = {
    .block_q = 16,
    .block_kv = 64,
    .scores_tile = scores_tile_scalar,
    .pv_tile = pv_tile_scalar,
    .pv_tile_t = pv_tile_t_scalar,
    .exp_keymajor = {exp_keymajor_fast_scalar, exp_keymajor_sleef_scalar},
    .ds_keymajor = ds_keymajor_scalar,
};

const sdpa_kernels sdpa_kernels_scalar = {
    .name = SDPA_BACKEND_NAME,
    .dot = dot_scalar,
    .dot_to = dot_scalar_to,
    .scale = scale_scalar,
    .max_scaled = max_scaled_scalar,
    .exp_sum = {exp_sum_fast_scalar, exp_sum_sleef_scalar},
    .exp_sum_block = 512,
    .normalize = normalize_scalar,
    .softmax_backward = softmax_backward_scalar,
    .exp = {exp_fast_array_scalar, exp_sleef_array_scalar},
    .widen = {NULL, widen_f16_scalar, widen_bf16_scalar},
    .narrow = {NULL, narrow_f16_scalar, narrow_bf16_scalar},
    .widen_fp8 = {widen_e4m3_scalar, widen_e5m2_scalar},
    .attention = &attention_scalar,
};
