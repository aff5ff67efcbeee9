/* Portable C backend: the baseline every CPU runs, and the fallback of every dispatch ladder.
 * Several independent accumulators keep the sums accurate and give the compiler room, without
 * relying on -ffast-math. */
#include <float.h>
#include <math.h>
#include <sleef.h>
#include <stdint.h>
#include <string.h>

#include "any_address.h"
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

static void narrow_f16_scalar(void *dst, const f32_any *src, size_t n) {
    u16_any *d = dst;
    for (size_t i = 0; i < n; i++) d[i] = f32_to_f16(src[i]);
}

static void narrow_bf16_scalar(void *dst, const f32_any *src, size_t n) {
    u16_any *d = dst;
    for (size_t i = 0; i < n; i++) d[i] = f32_to_bf16(src[i]);
}

/* ---- Attention microkernels: arch/attention_tiles.h over the compiler's vectors ---- */

/* The vector vocabulary (docs/porting.md) in portable C: GCC's vectors of 4 floats, which the
 * compiler maps to the baseline's SIMD registers (SSE2, Advanced SIMD) or, on a target without
 * them, to four floats. A multiply-add is a product rounded, then a sum (no FMA in the baseline);
 * a partial vector is loaded and stored element by element. */
#define W             4
#define ALWAYS_INLINE static inline __attribute__((always_inline))
typedef float vf __attribute__((vector_size(4 * W)));
typedef float vf_any __attribute__((vector_size(4 * W), aligned(1)));
typedef size_t vpart;
#define VF_MASKED        0
#define vf_load(p)       (*(const vf_any *)(const void *)(p))
#define vf_store(p, v)   (*(vf_any *)(void *)(p) = (v))
#define vpart_first(len) (len)
ALWAYS_INLINE vf vf_zero(void) { return (vf){0.0f, 0.0f, 0.0f, 0.0f}; }
ALWAYS_INLINE vf vf_set1(float x) { return (vf){x, x, x, x}; }
ALWAYS_INLINE vf vf_bcast(const float *p) { return vf_set1(load_f32(p)); }
ALWAYS_INLINE vf vf_madd(vf a, vf b, vf c) { return c + a * b; }
ALWAYS_INLINE void vf_pin(vf *x) { (void)x; }
ALWAYS_INLINE vf vf_load_part(const f32_any *p, vpart n) {
    return (vf){p[0], n > 1 ? p[1] : 0.0f, n > 2 ? p[2] : 0.0f, 0.0f};
}
ALWAYS_INLINE void vf_store_part(f32_any *p, vpart n, vf x) {
    for (size_t i = 0; i < n; i++) p[i] = x[i];
}
/* lane i: the sum of the lanes of a[i] */
ALWAYS_INLINE vf vf_hsums(const vf *a) {
    vf r;
    for (int i = 0; i < W; i++) r[i] = (a[i][0] + a[i][1]) + (a[i][2] + a[i][3]);
    return r;
}
ALWAYS_INLINE void vf_store4(float *p, vf x, int c) { (void)c, vf_store(p, x); }

#define ISA_NAME(f) f##_scalar
/* the scores keep dot_scalar's order (lanes in blocks along d), which a register block's one
 * chain a dot would not give */
#define ISA_SCORES_TILE 1
/* pv_tile_t keeps its own loops, a row over all its keys, two a pass: the templates' passes of
 * PV_T_KEYS keys measured slower here in the backward of a single query */
#define ISA_PV_TILE_T 1
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

#include "attention_tiles.h"

enum { BLOCK_Q = 16, BLOCK_KV = 64 };

ALWAYS_INLINE float isa_dot(const float *a, const float *b, size_t n) {
    return dot_scalar(a, b, n);
}

/* P V: a row at a time, 16 columns in registers, a key a step: each column one chain of
 * products and sums in key order, the order of the scalar backend's loops before it */
ALWAYS_INLINE void isa_pv(const pv_operands *o, int vt) { pv_tile_loops(o, vt, 1, 4, 0, 0, 1, 1); }

static void scores_tile_scalar(f32_any *s, size_t ld_s, const f32_any *q, size_t q_stride,
                               size_t nq, const f32_any *k, size_t k_stride, size_t nk, size_t d,
                               float scale) {
    for (size_t i = 0; i < nq; i++)
        for (size_t j = 0; j < nk; j++)
            s[i * ld_s + j] = scale * dot_scalar(q + i * q_stride, k + j * k_stride, d);
}

#include "attention_entries.h"

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
    .attention = &sdpa_attention_kernels_scalar,
};
