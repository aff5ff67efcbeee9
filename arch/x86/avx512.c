/* AVX-512F backend: 16 floats a vector; tails use masked loads and stores, which never touch
 * the masked-off bytes, so no kernel reads or writes past its arrays. */
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <sleef.h>

#include "kernels.h"

#define W 16

static inline __mmask16 tail_mask(size_t remaining) { return (__mmask16)((1u << remaining) - 1u); }

static float dot_avx512(const float *a, const float *b, size_t n) {
    /* eight accumulators: two loads feed each FMA, so the loop is load-bound, and eight
       independent chains cover the FMA latency on every core that has AVX-512 */
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps(), acc2 = _mm512_setzero_ps(),
           acc3 = _mm512_setzero_ps(), acc4 = _mm512_setzero_ps(), acc5 = _mm512_setzero_ps(),
           acc6 = _mm512_setzero_ps(), acc7 = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 8 * W <= n; i += 8 * W) {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + W), _mm512_loadu_ps(b + i + W), acc1);
        acc2 =
            _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 2 * W), _mm512_loadu_ps(b + i + 2 * W), acc2);
        acc3 =
            _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 3 * W), _mm512_loadu_ps(b + i + 3 * W), acc3);
        acc4 =
            _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 4 * W), _mm512_loadu_ps(b + i + 4 * W), acc4);
        acc5 =
            _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 5 * W), _mm512_loadu_ps(b + i + 5 * W), acc5);
        acc6 =
            _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 6 * W), _mm512_loadu_ps(b + i + 6 * W), acc6);
        acc7 =
            _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 7 * W), _mm512_loadu_ps(b + i + 7 * W), acc7);
    }
    for (; i + W <= n; i += W)
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        acc1 =
            _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc1);
    }
    acc0 = _mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3));
    acc4 = _mm512_add_ps(_mm512_add_ps(acc4, acc5), _mm512_add_ps(acc6, acc7));
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc4));
}

static void scale_avx512(float *y, const float *x, size_t n, float alpha) {
    const __m512 va = _mm512_set1_ps(alpha);
    size_t i = 0;
    for (; i + 4 * W <= n; i += 4 * W) {
        __m512 x0 = _mm512_loadu_ps(x + i), x1 = _mm512_loadu_ps(x + i + W);
        __m512 x2 = _mm512_loadu_ps(x + i + 2 * W), x3 = _mm512_loadu_ps(x + i + 3 * W);
        _mm512_storeu_ps(y + i, _mm512_mul_ps(va, x0));
        _mm512_storeu_ps(y + i + W, _mm512_mul_ps(va, x1));
        _mm512_storeu_ps(y + i + 2 * W, _mm512_mul_ps(va, x2));
        _mm512_storeu_ps(y + i + 3 * W, _mm512_mul_ps(va, x3));
    }
    for (; i + W <= n; i += W) _mm512_storeu_ps(y + i, _mm512_mul_ps(va, _mm512_loadu_ps(x + i)));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(va, _mm512_maskz_loadu_ps(m, x + i)));
    }
}

/* Four keys at a time share each load of q. */
static void scores_avx512(float *s, const float *q, const float *k, size_t n_keys, size_t d,
                          size_t k_stride, float scale) {
    size_t j = 0;
    for (; j + 4 <= n_keys; j += 4) {
        const float *k0 = k + j * k_stride, *k1 = k0 + k_stride, *k2 = k1 + k_stride,
                    *k3 = k2 + k_stride;
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(),
               a3 = _mm512_setzero_ps();
        size_t i = 0;
        for (; i + W <= d; i += W) {
            __m512 vq = _mm512_loadu_ps(q + i);
            a0 = _mm512_fmadd_ps(vq, _mm512_loadu_ps(k0 + i), a0);
            a1 = _mm512_fmadd_ps(vq, _mm512_loadu_ps(k1 + i), a1);
            a2 = _mm512_fmadd_ps(vq, _mm512_loadu_ps(k2 + i), a2);
            a3 = _mm512_fmadd_ps(vq, _mm512_loadu_ps(k3 + i), a3);
        }
        if (i < d) {
            __mmask16 m = tail_mask(d - i);
            __m512 vq = _mm512_maskz_loadu_ps(m, q + i);
            a0 = _mm512_fmadd_ps(vq, _mm512_maskz_loadu_ps(m, k0 + i), a0);
            a1 = _mm512_fmadd_ps(vq, _mm512_maskz_loadu_ps(m, k1 + i), a1);
            a2 = _mm512_fmadd_ps(vq, _mm512_maskz_loadu_ps(m, k2 + i), a2);
            a3 = _mm512_fmadd_ps(vq, _mm512_maskz_loadu_ps(m, k3 + i), a3);
        }
        s[j] = scale * _mm512_reduce_add_ps(a0);
        s[j + 1] = scale * _mm512_reduce_add_ps(a1);
        s[j + 2] = scale * _mm512_reduce_add_ps(a2);
        s[j + 3] = scale * _mm512_reduce_add_ps(a3);
    }
    for (; j < n_keys; j++) s[j] = scale * dot_avx512(q, k + j * k_stride, d);
}

static float max_scaled_avx512(const float *x, size_t n, float scale) {
    const __m512 vs = _mm512_set1_ps(scale);
    __m512 m0 = _mm512_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
    size_t i = 0;
    for (; i + 4 * W <= n; i += 4 * W) {
        m0 = _mm512_max_ps(_mm512_mul_ps(vs, _mm512_loadu_ps(x + i)), m0);
        m1 = _mm512_max_ps(_mm512_mul_ps(vs, _mm512_loadu_ps(x + i + W)), m1);
        m2 = _mm512_max_ps(_mm512_mul_ps(vs, _mm512_loadu_ps(x + i + 2 * W)), m2);
        m3 = _mm512_max_ps(_mm512_mul_ps(vs, _mm512_loadu_ps(x + i + 3 * W)), m3);
    }
    for (; i + W <= n; i += W) m0 = _mm512_max_ps(_mm512_mul_ps(vs, _mm512_loadu_ps(x + i)), m0);
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        m1 = _mm512_mask_max_ps(m1, m, _mm512_mul_ps(vs, _mm512_maskz_loadu_ps(m, x + i)), m1);
    }
    return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3)));
}

/* The shared "fast" exp (kernels.h); scalef applies 2^n with IEEE overflow to +inf, so only the
 * clamp (which also keeps +-inf from turning into NaN) and the flush of subnormals remain. */
static inline __m512 exp_fast_avx512(__m512 x) {
    /* max/min return their second operand when either is NaN: NaN passes through */
    x = _mm512_min_ps(_mm512_set1_ps(SDPA_EXP_X_CLAMP_HI),
                      _mm512_max_ps(_mm512_set1_ps(SDPA_EXP_X_CLAMP_LO), x));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(SDPA_EXP_LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(SDPA_EXP_LN2_HI), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(SDPA_EXP_LN2_LO), r);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(SDPA_EXP_C5), r, _mm512_set1_ps(SDPA_EXP_C4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(SDPA_EXP_C3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(SDPA_EXP_C2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    __m512 e = _mm512_scalef_ps(p, n);
    /* keep e where it is >= FLT_MIN or NaN (unordered): subnormal results become 0 */
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(e, _mm512_set1_ps(FLT_MIN), _CMP_NLT_UQ), e);
}

static inline __m512 exp_sleef_avx512(__m512 x) {
    __m512 e = Sleef_expf16_u10avx512f(x);
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(e, _mm512_set1_ps(FLT_MIN), _CMP_NLT_UQ), e);
}

/* z = scale * x is rounded before the max is subtracted, as sdpa.h defines z (no fused
 * multiply-subtract): the largest entry then gets exp(0) = 1 exactly, where a fused one gets
 * exp of its product's rounding error, inf or 0 once |z| > ~1e9, and a NaN row
 * (tests/test_regressions.c). One body for both exp kinds; the exp is inlined, so each
 * instance is a tight loop. */
#define EXP_SUM_AVX512(NAME, EXP)                                                                  \
    static float NAME(float *y, const float *x, size_t n, float scale, float shift) {              \
        const __m512 vs = _mm512_set1_ps(scale), vshift = _mm512_set1_ps(shift);                   \
        __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();                                 \
        size_t i = 0;                                                                              \
        for (; i + 2 * W <= n; i += 2 * W) {                                                       \
            __m512 e0 = EXP(_mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), vs), vshift));     \
            __m512 e1 = EXP(_mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i + W), vs), vshift)); \
            _mm512_storeu_ps(y + i, e0);                                                           \
            _mm512_storeu_ps(y + i + W, e1);                                                       \
            s0 = _mm512_add_ps(s0, e0);                                                            \
            s1 = _mm512_add_ps(s1, e1);                                                            \
        }                                                                                          \
        for (; i < n; i += W) {                                                                    \
            __mmask16 m = n - i >= W ? (__mmask16)0xFFFF : tail_mask(n - i);                       \
            __m512 e =                                                                             \
                EXP(_mm512_sub_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), vs), vshift));    \
            _mm512_mask_storeu_ps(y + i, m, e);                                                    \
            s0 = _mm512_mask_add_ps(s0, m, s0, e);                                                 \
        }                                                                                          \
        return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));                                        \
    }
EXP_SUM_AVX512(exp_sum_fast_avx512, exp_fast_avx512)
EXP_SUM_AVX512(exp_sum_sleef_avx512, exp_sleef_avx512)

#define EXP_ARRAY_AVX512(NAME, EXP)                                                                \
    static void NAME(float *y, const float *x, size_t n) {                                         \
        for (size_t i = 0; i < n; i += W) {                                                        \
            __mmask16 m = n - i >= W ? (__mmask16)0xFFFF : tail_mask(n - i);                       \
            _mm512_mask_storeu_ps(y + i, m, EXP(_mm512_maskz_loadu_ps(m, x + i)));                 \
        }                                                                                          \
    }
EXP_ARRAY_AVX512(exp_fast_array_avx512, exp_fast_avx512)
EXP_ARRAY_AVX512(exp_sleef_array_avx512, exp_sleef_avx512)

static void normalize_avx512(float *y, size_t n, float factor) {
    const __m512 vf = _mm512_set1_ps(factor), vmin = _mm512_set1_ps(FLT_MIN);
    size_t i = 0;
    for (; i + 2 * W <= n; i += 2 * W) {
        __m512 w0 = _mm512_mul_ps(_mm512_loadu_ps(y + i), vf);
        __m512 w1 = _mm512_mul_ps(_mm512_loadu_ps(y + i + W), vf);
        _mm512_storeu_ps(y + i, _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(w0, vmin, _CMP_NLT_UQ), w0));
        _mm512_storeu_ps(y + i + W,
                         _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(w1, vmin, _CMP_NLT_UQ), w1));
    }
    for (; i < n; i += W) {
        __mmask16 m = n - i >= W ? (__mmask16)0xFFFF : tail_mask(n - i);
        __m512 w = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, y + i), vf);
        _mm512_mask_storeu_ps(y + i, m,
                              _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(w, vmin, _CMP_NLT_UQ), w));
    }
}

static void softmax_backward_avx512(float *dx, const float *y, const float *dy, size_t n,
                                    float scale, float y_dot_dy) {
    const __m512 vs = _mm512_set1_ps(scale), vd = _mm512_set1_ps(y_dot_dy);
    for (size_t i = 0; i < n; i += W) {
        __mmask16 m = n - i >= W ? (__mmask16)0xFFFF : tail_mask(n - i);
        __m512 t = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, dy + i), vd);
        _mm512_mask_storeu_ps(dx + i, m,
                              _mm512_mul_ps(_mm512_mul_ps(vs, _mm512_maskz_loadu_ps(m, y + i)), t));
    }
}

const sdpa_kernels sdpa_kernels_avx512 = {
    .name = "avx512",
    .dot = dot_avx512,
    .scale = scale_avx512,
    .scores = scores_avx512,
    .max_scaled = max_scaled_avx512,
    .exp_sum = {exp_sum_fast_avx512, exp_sum_sleef_avx512},
    .normalize = normalize_avx512,
    .softmax_backward = softmax_backward_avx512,
    .exp = {exp_fast_array_avx512, exp_sleef_array_avx512},
};
