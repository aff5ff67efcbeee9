/* AVX2 + FMA backend: 8 floats a vector; tails use vmaskmovps, whose masked-off lanes are
 * neither read nor written (no fault past the end of an array). */
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <sleef.h>

#include "kernels.h"

#define W 8

/* lanes [0, remaining) set, for remaining < W */
static inline __m256i tail_mask(size_t remaining) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)remaining),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float hmax(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static float dot_avx2(const float *a, const float *b, size_t n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps(),
           acc3 = _mm256_setzero_ps(), acc4 = _mm256_setzero_ps(), acc5 = _mm256_setzero_ps(),
           acc6 = _mm256_setzero_ps(), acc7 = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 * W <= n; i += 8 * W) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + W), _mm256_loadu_ps(b + i + W), acc1);
        acc2 =
            _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 2 * W), _mm256_loadu_ps(b + i + 2 * W), acc2);
        acc3 =
            _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 3 * W), _mm256_loadu_ps(b + i + 3 * W), acc3);
        acc4 =
            _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 4 * W), _mm256_loadu_ps(b + i + 4 * W), acc4);
        acc5 =
            _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 5 * W), _mm256_loadu_ps(b + i + 5 * W), acc5);
        acc6 =
            _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 6 * W), _mm256_loadu_ps(b + i + 6 * W), acc6);
        acc7 =
            _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 7 * W), _mm256_loadu_ps(b + i + 7 * W), acc7);
    }
    for (; i + W <= n; i += W)
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    if (i < n) {
        __m256i m = tail_mask(n - i);
        acc1 = _mm256_fmadd_ps(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m), acc1);
    }
    acc0 = _mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3));
    acc4 = _mm256_add_ps(_mm256_add_ps(acc4, acc5), _mm256_add_ps(acc6, acc7));
    return hsum(_mm256_add_ps(acc0, acc4));
}

static void scale_avx2(float *y, const float *x, size_t n, float alpha) {
    const __m256 va = _mm256_set1_ps(alpha);
    size_t i = 0;
    for (; i + 4 * W <= n; i += 4 * W) {
        __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + W);
        __m256 x2 = _mm256_loadu_ps(x + i + 2 * W), x3 = _mm256_loadu_ps(x + i + 3 * W);
        _mm256_storeu_ps(y + i, _mm256_mul_ps(va, x0));
        _mm256_storeu_ps(y + i + W, _mm256_mul_ps(va, x1));
        _mm256_storeu_ps(y + i + 2 * W, _mm256_mul_ps(va, x2));
        _mm256_storeu_ps(y + i + 3 * W, _mm256_mul_ps(va, x3));
    }
    for (; i + W <= n; i += W) _mm256_storeu_ps(y + i, _mm256_mul_ps(va, _mm256_loadu_ps(x + i)));
    if (i < n) {
        __m256i m = tail_mask(n - i);
        _mm256_maskstore_ps(y + i, m, _mm256_mul_ps(va, _mm256_maskload_ps(x + i, m)));
    }
}

/* Four keys at a time share each load of q. */
static void scores_avx2(float *s, const float *q, const float *k, size_t n_keys, size_t d,
                        size_t k_stride, float scale) {
    size_t j = 0;
    for (; j + 4 <= n_keys; j += 4) {
        const float *k0 = k + j * k_stride, *k1 = k0 + k_stride, *k2 = k1 + k_stride,
                    *k3 = k2 + k_stride;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(),
               a3 = _mm256_setzero_ps();
        size_t i = 0;
        for (; i + W <= d; i += W) {
            __m256 vq = _mm256_loadu_ps(q + i);
            a0 = _mm256_fmadd_ps(vq, _mm256_loadu_ps(k0 + i), a0);
            a1 = _mm256_fmadd_ps(vq, _mm256_loadu_ps(k1 + i), a1);
            a2 = _mm256_fmadd_ps(vq, _mm256_loadu_ps(k2 + i), a2);
            a3 = _mm256_fmadd_ps(vq, _mm256_loadu_ps(k3 + i), a3);
        }
        if (i < d) {
            __m256i m = tail_mask(d - i);
            __m256 vq = _mm256_maskload_ps(q + i, m);
            a0 = _mm256_fmadd_ps(vq, _mm256_maskload_ps(k0 + i, m), a0);
            a1 = _mm256_fmadd_ps(vq, _mm256_maskload_ps(k1 + i, m), a1);
            a2 = _mm256_fmadd_ps(vq, _mm256_maskload_ps(k2 + i, m), a2);
            a3 = _mm256_fmadd_ps(vq, _mm256_maskload_ps(k3 + i, m), a3);
        }
        s[j] = scale * hsum(a0);
        s[j + 1] = scale * hsum(a1);
        s[j + 2] = scale * hsum(a2);
        s[j + 3] = scale * hsum(a3);
    }
    for (; j < n_keys; j++) s[j] = scale * dot_avx2(q, k + j * k_stride, d);
}

static float max_scaled_avx2(const float *x, size_t n, float scale) {
    const __m256 vs = _mm256_set1_ps(scale), ninf = _mm256_set1_ps(-INFINITY);
    __m256 m0 = ninf, m1 = ninf, m2 = ninf, m3 = ninf;
    size_t i = 0;
    for (; i + 4 * W <= n; i += 4 * W) {
        m0 = _mm256_max_ps(_mm256_mul_ps(vs, _mm256_loadu_ps(x + i)), m0);
        m1 = _mm256_max_ps(_mm256_mul_ps(vs, _mm256_loadu_ps(x + i + W)), m1);
        m2 = _mm256_max_ps(_mm256_mul_ps(vs, _mm256_loadu_ps(x + i + 2 * W)), m2);
        m3 = _mm256_max_ps(_mm256_mul_ps(vs, _mm256_loadu_ps(x + i + 3 * W)), m3);
    }
    for (; i + W <= n; i += W) m0 = _mm256_max_ps(_mm256_mul_ps(vs, _mm256_loadu_ps(x + i)), m0);
    if (i < n) {
        __m256i m = tail_mask(n - i);
        __m256 z = _mm256_mul_ps(vs, _mm256_maskload_ps(x + i, m));
        m1 = _mm256_max_ps(_mm256_blendv_ps(ninf, z, _mm256_castsi256_ps(m)), m1);
    }
    return hmax(_mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
}

/* The shared "fast" exp (kernels.h): 2^n goes into p's exponent bits. */
static inline __m256 exp_fast_avx2(__m256 x) {
    /* max/min return their second operand when either is NaN: NaN passes through */
    x = _mm256_min_ps(_mm256_set1_ps(SDPA_EXP_X_CLAMP_HI),
                      _mm256_max_ps(_mm256_set1_ps(SDPA_EXP_X_CLAMP_LO), x));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(SDPA_EXP_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(SDPA_EXP_LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(SDPA_EXP_LN2_LO), r);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(SDPA_EXP_C5), r, _mm256_set1_ps(SDPA_EXP_C4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SDPA_EXP_C3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SDPA_EXP_C2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i bits =
        _mm256_add_epi32(_mm256_castps_si256(p), _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23));
    __m256 e = _mm256_castsi256_ps(bits);
    /* drop results below FLT_MIN (not NaN: the ordered compare is false for it) */
    e = _mm256_andnot_ps(_mm256_cmp_ps(e, _mm256_set1_ps(FLT_MIN), _CMP_LT_OQ), e);
    return _mm256_blendv_ps(e, _mm256_set1_ps(INFINITY),
                            _mm256_cmp_ps(x, _mm256_set1_ps(SDPA_EXP_X_OVERFLOW), _CMP_GE_OQ));
}

static inline __m256 exp_sleef_avx2(__m256 x) {
    __m256 e = Sleef_expf8_u10avx2(x);
    return _mm256_andnot_ps(_mm256_cmp_ps(e, _mm256_set1_ps(FLT_MIN), _CMP_LT_OQ), e);
}

/* z = scale * x is rounded before the max is subtracted, as sdpa.h defines z (no fused
 * multiply-subtract): the largest entry then gets exp(0) = 1 exactly, where a fused one gets
 * exp of its product's rounding error, inf or 0 once |z| > ~1e9, and a NaN row
 * (tests/test_regressions.c). */
#define EXP_SUM_AVX2(NAME, EXP)                                                                    \
    static float NAME(float *y, const float *x, size_t n, float scale, float shift) {              \
        const __m256 vs = _mm256_set1_ps(scale), vshift = _mm256_set1_ps(shift);                   \
        __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();                                 \
        size_t i = 0;                                                                              \
        for (; i + 2 * W <= n; i += 2 * W) {                                                       \
            __m256 e0 = EXP(_mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vs), vshift));     \
            __m256 e1 = EXP(_mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i + W), vs), vshift)); \
            _mm256_storeu_ps(y + i, e0);                                                           \
            _mm256_storeu_ps(y + i + W, e1);                                                       \
            s0 = _mm256_add_ps(s0, e0);                                                            \
            s1 = _mm256_add_ps(s1, e1);                                                            \
        }                                                                                          \
        for (; i < n; i += W) {                                                                    \
            __m256i m = tail_mask(n - i < W ? n - i : W);                                          \
            __m256 e =                                                                             \
                EXP(_mm256_sub_ps(_mm256_mul_ps(_mm256_maskload_ps(x + i, m), vs), vshift));       \
            _mm256_maskstore_ps(y + i, m, e);                                                      \
            s0 = _mm256_add_ps(s0, _mm256_and_ps(e, _mm256_castsi256_ps(m)));                      \
        }                                                                                          \
        return hsum(_mm256_add_ps(s0, s1));                                                        \
    }
EXP_SUM_AVX2(exp_sum_fast_avx2, exp_fast_avx2)
EXP_SUM_AVX2(exp_sum_sleef_avx2, exp_sleef_avx2)

#define EXP_ARRAY_AVX2(NAME, EXP)                                                                  \
    static void NAME(float *y, const float *x, size_t n) {                                         \
        for (size_t i = 0; i < n; i += W) {                                                        \
            __m256i m = tail_mask(n - i < W ? n - i : W);                                          \
            _mm256_maskstore_ps(y + i, m, EXP(_mm256_maskload_ps(x + i, m)));                      \
        }                                                                                          \
    }
EXP_ARRAY_AVX2(exp_fast_array_avx2, exp_fast_avx2)
EXP_ARRAY_AVX2(exp_sleef_array_avx2, exp_sleef_avx2)

static inline __m256 flush_below_min(__m256 w) {
    return _mm256_andnot_ps(_mm256_cmp_ps(w, _mm256_set1_ps(FLT_MIN), _CMP_LT_OQ), w);
}

static void normalize_avx2(float *y, size_t n, float factor) {
    const __m256 vf = _mm256_set1_ps(factor);
    size_t i = 0;
    for (; i + 2 * W <= n; i += 2 * W) {
        _mm256_storeu_ps(y + i, flush_below_min(_mm256_mul_ps(_mm256_loadu_ps(y + i), vf)));
        _mm256_storeu_ps(y + i + W, flush_below_min(_mm256_mul_ps(_mm256_loadu_ps(y + i + W), vf)));
    }
    for (; i < n; i += W) {
        __m256i m = tail_mask(n - i < W ? n - i : W);
        _mm256_maskstore_ps(y + i, m,
                            flush_below_min(_mm256_mul_ps(_mm256_maskload_ps(y + i, m), vf)));
    }
}

static void softmax_backward_avx2(float *dx, const float *y, const float *dy, size_t n, float scale,
                                  float y_dot_dy) {
    const __m256 vs = _mm256_set1_ps(scale), vd = _mm256_set1_ps(y_dot_dy);
    for (size_t i = 0; i < n; i += W) {
        __m256i m = tail_mask(n - i < W ? n - i : W);
        __m256 t = _mm256_sub_ps(_mm256_maskload_ps(dy + i, m), vd);
        _mm256_maskstore_ps(dx + i, m,
                            _mm256_mul_ps(_mm256_mul_ps(vs, _mm256_maskload_ps(y + i, m)), t));
    }
}

const sdpa_kernels sdpa_kernels_avx2 = {
    .name = "avx2",
    .dot = dot_avx2,
    .scale = scale_avx2,
    .scores = scores_avx2,
    .max_scaled = max_scaled_avx2,
    .exp_sum = {exp_sum_fast_avx2, exp_sum_sleef_avx2},
    .normalize = normalize_avx2,
    .softmax_backward = softmax_backward_avx2,
    .exp = {exp_fast_array_avx2, exp_sleef_array_avx2},
};
