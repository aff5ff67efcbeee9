/* SSE4.1 backend: 4 floats a vector, no FMA. Tails go through a small stack vector filled
 * with memcpy, so no load or store ever reaches past the end of an array. */
#include <float.h>
#include <math.h>
#include <sleef.h>
#include <smmintrin.h>
#include <string.h>

#include "kernels.h"

#define W 4

/* the first `len` (< W) floats of p in a vector, the rest `fill` */
static inline __m128 load_partial(const float *p, size_t len, float fill) {
    float buf[W] = {fill, fill, fill, fill};
    memcpy(buf, p, len * sizeof(float));
    return _mm_loadu_ps(buf);
}

static inline void store_partial(float *p, __m128 v, size_t len) {
    float buf[W];
    _mm_storeu_ps(buf, v);
    memcpy(p, buf, len * sizeof(float));
}

static inline float hsum(__m128 s) {
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static float dot_sse41(const float *a, const float *b, size_t n) {
    __m128 acc0 = _mm_setzero_ps(), acc1 = _mm_setzero_ps(), acc2 = _mm_setzero_ps(),
           acc3 = _mm_setzero_ps(), acc4 = _mm_setzero_ps(), acc5 = _mm_setzero_ps(),
           acc6 = _mm_setzero_ps(), acc7 = _mm_setzero_ps();
    size_t i = 0;
    for (; i + 8 * W <= n; i += 8 * W) {
        acc0 = _mm_add_ps(acc0, _mm_mul_ps(_mm_loadu_ps(a + i), _mm_loadu_ps(b + i)));
        acc1 = _mm_add_ps(acc1, _mm_mul_ps(_mm_loadu_ps(a + i + W), _mm_loadu_ps(b + i + W)));
        acc2 =
            _mm_add_ps(acc2, _mm_mul_ps(_mm_loadu_ps(a + i + 2 * W), _mm_loadu_ps(b + i + 2 * W)));
        acc3 =
            _mm_add_ps(acc3, _mm_mul_ps(_mm_loadu_ps(a + i + 3 * W), _mm_loadu_ps(b + i + 3 * W)));
        acc4 =
            _mm_add_ps(acc4, _mm_mul_ps(_mm_loadu_ps(a + i + 4 * W), _mm_loadu_ps(b + i + 4 * W)));
        acc5 =
            _mm_add_ps(acc5, _mm_mul_ps(_mm_loadu_ps(a + i + 5 * W), _mm_loadu_ps(b + i + 5 * W)));
        acc6 =
            _mm_add_ps(acc6, _mm_mul_ps(_mm_loadu_ps(a + i + 6 * W), _mm_loadu_ps(b + i + 6 * W)));
        acc7 =
            _mm_add_ps(acc7, _mm_mul_ps(_mm_loadu_ps(a + i + 7 * W), _mm_loadu_ps(b + i + 7 * W)));
    }
    for (; i + W <= n; i += W)
        acc0 = _mm_add_ps(acc0, _mm_mul_ps(_mm_loadu_ps(a + i), _mm_loadu_ps(b + i)));
    if (i < n)
        acc1 = _mm_add_ps(
            acc1, _mm_mul_ps(load_partial(a + i, n - i, 0.0f), load_partial(b + i, n - i, 0.0f)));
    acc0 = _mm_add_ps(_mm_add_ps(acc0, acc1), _mm_add_ps(acc2, acc3));
    acc4 = _mm_add_ps(_mm_add_ps(acc4, acc5), _mm_add_ps(acc6, acc7));
    return hsum(_mm_add_ps(acc0, acc4));
}

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

/* Four keys at a time share each load of q. */
static void scores_sse41(float *s, const float *q, const float *k, size_t n_keys, size_t d,
                         size_t k_stride, float scale) {
    size_t j = 0;
    for (; j + 4 <= n_keys; j += 4) {
        const float *k0 = k + j * k_stride, *k1 = k0 + k_stride, *k2 = k1 + k_stride,
                    *k3 = k2 + k_stride;
        __m128 a0 = _mm_setzero_ps(), a1 = _mm_setzero_ps(), a2 = _mm_setzero_ps(),
               a3 = _mm_setzero_ps();
        size_t i = 0;
        for (; i + W <= d; i += W) {
            __m128 vq = _mm_loadu_ps(q + i);
            a0 = _mm_add_ps(a0, _mm_mul_ps(vq, _mm_loadu_ps(k0 + i)));
            a1 = _mm_add_ps(a1, _mm_mul_ps(vq, _mm_loadu_ps(k1 + i)));
            a2 = _mm_add_ps(a2, _mm_mul_ps(vq, _mm_loadu_ps(k2 + i)));
            a3 = _mm_add_ps(a3, _mm_mul_ps(vq, _mm_loadu_ps(k3 + i)));
        }
        if (i < d) {
            size_t len = d - i;
            __m128 vq = load_partial(q + i, len, 0.0f);
            a0 = _mm_add_ps(a0, _mm_mul_ps(vq, load_partial(k0 + i, len, 0.0f)));
            a1 = _mm_add_ps(a1, _mm_mul_ps(vq, load_partial(k1 + i, len, 0.0f)));
            a2 = _mm_add_ps(a2, _mm_mul_ps(vq, load_partial(k2 + i, len, 0.0f)));
            a3 = _mm_add_ps(a3, _mm_mul_ps(vq, load_partial(k3 + i, len, 0.0f)));
        }
        /* transpose-free reduction of the four sums at once */
        __m128 s01 = _mm_hadd_ps(a0, a1), s23 = _mm_hadd_ps(a2, a3);
        _mm_storeu_ps(s + j, _mm_mul_ps(_mm_set1_ps(scale), _mm_hadd_ps(s01, s23)));
    }
    for (; j < n_keys; j++) s[j] = scale * dot_sse41(q, k + j * k_stride, d);
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

/* The shared "fast" exp (kernels.h) without FMA: the 15-bit ln 2 split keeps n * LN2_HI exact. */
static inline __m128 exp_fast_sse41(__m128 x) {
    /* max/min return their second operand when either is NaN: NaN passes through */
    x = _mm_min_ps(_mm_set1_ps(SDPA_EXP_X_CLAMP_HI),
                   _mm_max_ps(_mm_set1_ps(SDPA_EXP_X_CLAMP_LO), x));
    __m128 n = _mm_round_ps(_mm_mul_ps(x, _mm_set1_ps(SDPA_EXP_LOG2E)),
                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m128 r = _mm_sub_ps(x, _mm_mul_ps(n, _mm_set1_ps(SDPA_EXP_LN2_HI_NOFMA)));
    r = _mm_sub_ps(r, _mm_mul_ps(n, _mm_set1_ps(SDPA_EXP_LN2_LO_NOFMA)));
    __m128 p = _mm_add_ps(_mm_mul_ps(_mm_set1_ps(SDPA_EXP_C5), r), _mm_set1_ps(SDPA_EXP_C4));
    p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(SDPA_EXP_C3));
    p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(SDPA_EXP_C2));
    p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.0f));
    p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.0f));
    __m128i bits = _mm_add_epi32(_mm_castps_si128(p), _mm_slli_epi32(_mm_cvtps_epi32(n), 23));
    __m128 e = _mm_castsi128_ps(bits);
    /* drop results below FLT_MIN (not NaN: the ordered compare is false for it) */
    e = _mm_andnot_ps(_mm_cmplt_ps(e, _mm_set1_ps(FLT_MIN)), e);
    return _mm_blendv_ps(e, _mm_set1_ps(INFINITY),
                         _mm_cmpge_ps(x, _mm_set1_ps(SDPA_EXP_X_OVERFLOW)));
}

static inline __m128 exp_sleef_sse41(__m128 x) {
    __m128 e = Sleef_expf4_u10sse4(x);
    return _mm_andnot_ps(_mm_cmplt_ps(e, _mm_set1_ps(FLT_MIN)), e);
}

#define EXP_SUM_SSE41(NAME, EXP)                                                                   \
    static float NAME(float *y, const float *x, size_t n, float scale, float shift) {              \
        const __m128 vs = _mm_set1_ps(scale), vshift = _mm_set1_ps(shift);                         \
        __m128 s0 = _mm_setzero_ps(), s1 = _mm_setzero_ps();                                       \
        size_t i = 0;                                                                              \
        for (; i + 2 * W <= n; i += 2 * W) {                                                       \
            __m128 e0 = EXP(_mm_sub_ps(_mm_mul_ps(_mm_loadu_ps(x + i), vs), vshift));              \
            __m128 e1 = EXP(_mm_sub_ps(_mm_mul_ps(_mm_loadu_ps(x + i + W), vs), vshift));          \
            _mm_storeu_ps(y + i, e0);                                                              \
            _mm_storeu_ps(y + i + W, e1);                                                          \
            s0 = _mm_add_ps(s0, e0);                                                               \
            s1 = _mm_add_ps(s1, e1);                                                               \
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
EXP_SUM_SSE41(exp_sum_fast_sse41, exp_fast_sse41)
EXP_SUM_SSE41(exp_sum_sleef_sse41, exp_sleef_sse41)

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
    .name = "sse",
    .dot = dot_sse41,
    .scale = scale_sse41,
    .scores = scores_sse41,
    .max_scaled = max_scaled_sse41,
    .exp_sum = {exp_sum_fast_sse41, exp_sum_sleef_sse41},
    .normalize = normalize_sse41,
    .softmax_backward = softmax_backward_sse41,
    .exp = {exp_fast_array_sse41, exp_sleef_array_sse41},
};
