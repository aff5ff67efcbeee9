/* Portable C backend: the baseline every CPU runs, and the fallback of every dispatch ladder.
 * Several independent accumulators keep the sums accurate and give the compiler room, without
 * relying on -ffast-math. The attention microkernels are the templates' at W = 1
 * (scalar_attention.c); the vocabulary, the exps and the dot are scalar.h's. */
#include <string.h>

#include "convert_fp8.h"
#include "scalar.h"

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
    .attention = &sdpa_attention_kernels_scalar,
};
