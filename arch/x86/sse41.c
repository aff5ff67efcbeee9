/* SSE4.1 backend: 4 floats a vector, no FMA. Tails are loaded and stored element by element
 * (load_partial, store_partial), so no load or store ever reaches past the end of an array. */
#include "sse41_exp.h"

SDPA_DOT_TO(dot_sse41)

static void scale_sse41(float *y, const float *x, size_t n, float alpha) {
    const __m128 va = _mm_set1_ps(alpha);
    size_t i = 0;
    for (; i + 4 * W <= n; i += 4 * W) {
        __m128 x0 = _mm_loadu_ps(x + i), x1 = _mm_loadu_ps(x + i + W);
        __m128 x2 = _mm_loadu_ps(x + i + 2 * W), x3 = _mm_loadu_ps(x + i + 3 * W);
        _mm_storeu_ps(y + i, _mm_mul_ps(va, x0));
        _mm_storeu_ps(y + i + W, _mm_mul_ps(va, x1));
        _mm_storeu_ps(y + i + 2 * W, _mm_mul_ps(va, x2));
        _mm_storeu_ps(y + i + 3 * W, _mm_mul_ps(va, x3));
    }
    for (; i + W <= n; i += W) _mm_storeu_ps(y + i, _mm_mul_ps(va, _mm_loadu_ps(x + i)));
    if (i < n) store_partial(y + i, _mm_mul_ps(va, load_partial(x + i, n - i, 0.0f)), n - i);
}

static float max_scaled_sse41(const float *x, size_t n, float scale) {
    const __m128 vs = _mm_set1_ps(scale);
    __m128 m0 = _mm_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
    size_t i = 0;
    for (; i + 4 * W <= n; i += 4 * W) {
        m0 = _mm_max_ps(_mm_mul_ps(vs, _mm_loadu_ps(x + i)), m0);
        m1 = _mm_max_ps(_mm_mul_ps(vs, _mm_loadu_ps(x + i + W)), m1);
        m2 = _mm_max_ps(_mm_mul_ps(vs, _mm_loadu_ps(x + i + 2 * W)), m2);
        m3 = _mm_max_ps(_mm_mul_ps(vs, _mm_loadu_ps(x + i + 3 * W)), m3);
    }
    for (; i + W <= n; i += W) m0 = _mm_max_ps(_mm_mul_ps(vs, _mm_loadu_ps(x + i)), m0);
    if (i < n) {
        /* the padding is scaled too; pick the padding value whose product is -inf */
        float pad = scale > 0 ? -INFINITY : INFINITY;
        m1 = _mm_max_ps(_mm_mul_ps(vs, load_partial(x + i, n - i, pad)), m1);
    }
    __m128 m = _mm_max_ps(_mm_max_ps(m0, m1), _mm_max_ps(m2, m3));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* Four vectors a step, their exps side by side (EXP4): with one or two, the exp's chain of some
 * fifty cycles fills the scheduler before it fills the pipes. The last vectors take EXP, the
 * full-range exp, whose flush makes the padded lanes of a partial one exactly 0. */
#define EXP_SUM_SSE41(NAME, EXP, EXP4)                                                             \
    static float NAME(float *y, const float *x, size_t n, float scale, float shift) {              \
        const __m128 vs = _mm_set1_ps(scale), vshift = _mm_set1_ps(shift);                         \
        __m128 s0 = _mm_setzero_ps(), s1 = _mm_setzero_ps();                                       \
        size_t i = 0;                                                                              \
        for (; i + 4 * W <= n; i += 4 * W) {                                                       \
            __m128 e[4];                                                                           \
            for (int u = 0; u < 4; u++)                                                            \
                e[u] = _mm_sub_ps(_mm_mul_ps(_mm_loadu_ps(x + i + u * W), vs), vshift);            \
            EXP4(e);                                                                               \
            for (int u = 0; u < 4; u++) _mm_storeu_ps(y + i + u * W, e[u]);                        \
            s0 = _mm_add_ps(s0, _mm_add_ps(e[0], e[2]));                                           \
            s1 = _mm_add_ps(s1, _mm_add_ps(e[1], e[3]));                                           \
        }                                                                                          \
        for (; i + W <= n; i += W) {                                                               \
            __m128 e = EXP(_mm_sub_ps(_mm_mul_ps(_mm_loadu_ps(x + i), vs), vshift));               \
            _mm_storeu_ps(y + i, e);                                                               \
            s0 = _mm_add_ps(s0, e);                                                                \
        }                                                                                          \
        if (i < n) {                                                                               \
            /* -inf padding (for the product with scale > 0 or not) gives exp = 0 */               \
            float pad = scale > 0 ? -INFINITY : INFINITY;                                          \
            __m128 e = EXP(_mm_sub_ps(_mm_mul_ps(load_partial(x + i, n - i, pad), vs), vshift));   \
            store_partial(y + i, e, n - i);                                                        \
            s1 = _mm_add_ps(s1, e);                                                                \
        }                                                                                          \
        return hsum(_mm_add_ps(s0, s1));                                                           \
    }
EXP_SUM_SSE41(exp_sum_fast_sse41, exp_fast_sse41, exp_light4_sse41)
EXP_SUM_SSE41(exp_sum_sleef_sse41, exp_sleef_sse41, exp_sleef_light4_sse41)

#define EXP_ARRAY_SSE41(NAME, EXP)                                                                 \
    static void NAME(float *y, const float *x, size_t n) {                                         \
        size_t i = 0;                                                                              \
        for (; i + W <= n; i += W) _mm_storeu_ps(y + i, EXP(_mm_loadu_ps(x + i)));                 \
        if (i < n) store_partial(y + i, EXP(load_partial(x + i, n - i, 0.0f)), n - i);             \
    }
EXP_ARRAY_SSE41(exp_fast_array_sse41, exp_fast_sse41)
EXP_ARRAY_SSE41(exp_sleef_array_sse41, exp_sleef_sse41)

static inline __m128 flush_below_min(__m128 w) {
    return _mm_andnot_ps(_mm_cmplt_ps(w, _mm_set1_ps(FLT_MIN)), w);
}

static void normalize_sse41(float *y, size_t n, float factor) {
    const __m128 vf = _mm_set1_ps(factor);
    size_t i = 0;
    for (; i + W <= n; i += W)
        _mm_storeu_ps(y + i, flush_below_min(_mm_mul_ps(_mm_loadu_ps(y + i), vf)));
    if (i < n)
        store_partial(y + i, flush_below_min(_mm_mul_ps(load_partial(y + i, n - i, 0.0f), vf)),
                      n - i);
}

static void softmax_backward_sse41(float *dx, const float *y, const float *dy, size_t n,
                                   float scale, float y_dot_dy) {
    const __m128 vs = _mm_set1_ps(scale), vd = _mm_set1_ps(y_dot_dy);
    size_t i = 0;
    for (; i + W <= n; i += W) {
        __m128 t = _mm_sub_ps(_mm_loadu_ps(dy + i), vd);
        _mm_storeu_ps(dx + i, _mm_mul_ps(_mm_mul_ps(vs, _mm_loadu_ps(y + i)), t));
    }
    if (i < n) {
        __m128 t = _mm_sub_ps(load_partial(dy + i, n - i, 0.0f), vd);
        store_partial(dx + i, _mm_mul_ps(_mm_mul_ps(vs, load_partial(y + i, n - i, 0.0f)), t),
                      n - i);
    }
}

const sdpa_kernels sdpa_kernels_sse41 = {
    .name = SDPA_BACKEND_NAME,
    .dot = dot_sse41,
    .dot_to = dot_sse41_to,
    .scale = scale_sse41,
    .max_scaled = max_scaled_sse41,
    .exp_sum = {exp_sum_fast_sse41, exp_sum_sleef_sse41},
    .exp_sum_block = 512,
    .normalize = normalize_sse41,
    .softmax_backward = softmax_backward_sse41,
    .exp = {exp_fast_array_sse41, exp_sleef_array_sse41},
    .attention = &sdpa_attention_kernels_sse41,
};
