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

/* ---- Attention microkernels (the tiling driver is src/attention.c) ---- */

#define ALWAYS_INLINE static inline __attribute__((always_inline))

#define LOAD_FULL(ptr) _mm_loadu_ps(ptr)
#define LOAD_TAIL(ptr) load_partial(ptr, len, 0.0f)
#define MADD(a, b, c)  _mm_add_ps(c, _mm_mul_ps(a, b))

/* One step of a 2 x 4 block: 6 loads feed 8 multiply-adds. The keys are taken one at a time
 * so that 8 sums, 2 query rows and the temporaries fit the 16 registers without spilling. */
#define SCORES_2X4_KEY(LOAD, C)                                                                    \
    do {                                                                                           \
        __m128 kc = LOAD(k + (C)*k_stride + p);                                                    \
        a0##C = MADD(q0, kc, a0##C);                                                               \
        a1##C = MADD(q1, kc, a1##C);                                                               \
    } while (0)
#define SCORES_2X4_STEP(LOAD)                                                                      \
    do {                                                                                           \
        __m128 q0 = LOAD(q + p), q1 = LOAD(q + q_stride + p);                                      \
        SCORES_2X4_KEY(LOAD, 0);                                                                   \
        SCORES_2X4_KEY(LOAD, 1);                                                                   \
        SCORES_2X4_KEY(LOAD, 2);                                                                   \
        SCORES_2X4_KEY(LOAD, 3);                                                                   \
    } while (0)

/* Lane i of the result is the sum of the lanes of the i-th argument. */
ALWAYS_INLINE __m128 hsum4_sse41(__m128 a0, __m128 a1, __m128 a2, __m128 a3) {
    return _mm_hadd_ps(_mm_hadd_ps(a0, a1), _mm_hadd_ps(a2, a3));
}

ALWAYS_INLINE void scores_2x4_sse41(float *s, size_t ld_s, const float *q, size_t q_stride,
                                    const float *k, size_t k_stride, size_t d, __m128 vscale) {
    __m128 a00 = _mm_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00,
           a13 = a00;
    size_t p = 0;
    for (; p + W <= d; p += W) SCORES_2X4_STEP(LOAD_FULL);
    if (p < d) {
        size_t len = d - p;
        SCORES_2X4_STEP(LOAD_TAIL);
    }
    _mm_storeu_ps(s, _mm_mul_ps(hsum4_sse41(a00, a01, a02, a03), vscale));
    _mm_storeu_ps(s + ld_s, _mm_mul_ps(hsum4_sse41(a10, a11, a12, a13), vscale));
}

#define SCORES_1X8_STEP(LOAD)                                                                      \
    do {                                                                                           \
        __m128 vq = LOAD(q + p);                                                                   \
        a0 = MADD(vq, LOAD(k + p), a0), a1 = MADD(vq, LOAD(k + k_stride + p), a1);                 \
        a2 = MADD(vq, LOAD(k + 2 * k_stride + p), a2);                                             \
        a3 = MADD(vq, LOAD(k + 3 * k_stride + p), a3);                                             \
        a4 = MADD(vq, LOAD(k + 4 * k_stride + p), a4);                                             \
        a5 = MADD(vq, LOAD(k + 5 * k_stride + p), a5);                                             \
        a6 = MADD(vq, LOAD(k + 6 * k_stride + p), a6);                                             \
        a7 = MADD(vq, LOAD(k + 7 * k_stride + p), a7);                                             \
    } while (0)

/* One query x 8 keys (decode). */
ALWAYS_INLINE void scores_1x8_sse41(float *s, const float *q, const float *k, size_t k_stride,
                                    size_t d, __m128 vscale) {
    __m128 a0 = _mm_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    size_t p = 0;
    for (; p + W <= d; p += W) SCORES_1X8_STEP(LOAD_FULL);
    if (p < d) {
        size_t len = d - p;
        SCORES_1X8_STEP(LOAD_TAIL);
    }
    _mm_storeu_ps(s, _mm_mul_ps(hsum4_sse41(a0, a1, a2, a3), vscale));
    _mm_storeu_ps(s + 4, _mm_mul_ps(hsum4_sse41(a4, a5, a6, a7), vscale));
}

static void scores_tile_sse41(float *s, size_t ld_s, const float *q, size_t q_stride, size_t nq,
                              const float *k, size_t k_stride, size_t nk, size_t d, float scale) {
    const __m128 vscale = _mm_set1_ps(scale);
    size_t i = 0;
    for (; i + 2 <= nq; i += 2) {
        const float *qi = q + i * q_stride;
        float *si = s + i * ld_s;
        size_t j = 0;
        for (; j + 4 <= nk; j += 4)
            scores_2x4_sse41(si + j, ld_s, qi, q_stride, k + j * k_stride, k_stride, d, vscale);
        for (; j < nk; j++) {
            si[j] = scale * dot_sse41(qi, k + j * k_stride, d);
            si[ld_s + j] = scale * dot_sse41(qi + q_stride, k + j * k_stride, d);
        }
    }
    for (; i < nq; i++) {
        const float *qi = q + i * q_stride;
        float *si = s + i * ld_s;
        size_t j = 0;
        for (; j + 8 <= nk; j += 8)
            scores_1x8_sse41(si + j, qi, k + j * k_stride, k_stride, d, vscale);
        for (; j < nk; j++) si[j] = scale * dot_sse41(qi, k + j * k_stride, d);
    }
}

/* acc[2 rows][16 columns] += p[2 rows][nk] * v[nk][16 columns]: 8 accumulators in registers,
 * 4 loads of v and 2 broadcasts per key. */
static void pv_2x16_sse41(float *acc, size_t ld_acc, const float *p, size_t ld_p, size_t nk,
                          const float *v, size_t v_stride) {
    float *o0 = acc, *o1 = acc + ld_acc;
    __m128 c00 = _mm_loadu_ps(o0), c01 = _mm_loadu_ps(o0 + W), c02 = _mm_loadu_ps(o0 + 2 * W),
           c03 = _mm_loadu_ps(o0 + 3 * W);
    __m128 c10 = _mm_loadu_ps(o1), c11 = _mm_loadu_ps(o1 + W), c12 = _mm_loadu_ps(o1 + 2 * W),
           c13 = _mm_loadu_ps(o1 + 3 * W);
    for (size_t j = 0; j < nk; j++) {
        const float *vj = v + j * v_stride;
        __m128 v0 = _mm_loadu_ps(vj), v1 = _mm_loadu_ps(vj + W), v2 = _mm_loadu_ps(vj + 2 * W),
               v3 = _mm_loadu_ps(vj + 3 * W);
        __m128 w = _mm_set1_ps(p[j]);
        c00 = MADD(w, v0, c00), c01 = MADD(w, v1, c01), c02 = MADD(w, v2, c02);
        c03 = MADD(w, v3, c03);
        w = _mm_set1_ps(p[ld_p + j]);
        c10 = MADD(w, v0, c10), c11 = MADD(w, v1, c11), c12 = MADD(w, v2, c12);
        c13 = MADD(w, v3, c13);
    }
    _mm_storeu_ps(o0, c00), _mm_storeu_ps(o0 + W, c01), _mm_storeu_ps(o0 + 2 * W, c02);
    _mm_storeu_ps(o0 + 3 * W, c03);
    _mm_storeu_ps(o1, c10), _mm_storeu_ps(o1 + W, c11), _mm_storeu_ps(o1 + 2 * W, c12);
    _mm_storeu_ps(o1 + 3 * W, c13);
}

/* One row, 16 columns, two keys per step for eight independent chains. */
static void pv_1x16_sse41(float *acc, const float *p, size_t nk, const float *v, size_t v_stride) {
    __m128 c0 = _mm_loadu_ps(acc), c1 = _mm_loadu_ps(acc + W), c2 = _mm_loadu_ps(acc + 2 * W),
           c3 = _mm_loadu_ps(acc + 3 * W);
    __m128 e0 = _mm_setzero_ps(), e1 = e0, e2 = e0, e3 = e0;
    size_t j = 0;
    for (; j + 2 <= nk; j += 2) {
        const float *v0 = v + j * v_stride, *v1 = v0 + v_stride;
        __m128 w0 = _mm_set1_ps(p[j]), w1 = _mm_set1_ps(p[j + 1]);
        c0 = MADD(w0, _mm_loadu_ps(v0), c0), c1 = MADD(w0, _mm_loadu_ps(v0 + W), c1);
        c2 = MADD(w0, _mm_loadu_ps(v0 + 2 * W), c2), c3 = MADD(w0, _mm_loadu_ps(v0 + 3 * W), c3);
        e0 = MADD(w1, _mm_loadu_ps(v1), e0), e1 = MADD(w1, _mm_loadu_ps(v1 + W), e1);
        e2 = MADD(w1, _mm_loadu_ps(v1 + 2 * W), e2), e3 = MADD(w1, _mm_loadu_ps(v1 + 3 * W), e3);
    }
    if (j < nk) {
        const float *v0 = v + j * v_stride;
        __m128 w0 = _mm_set1_ps(p[j]);
        c0 = MADD(w0, _mm_loadu_ps(v0), c0), c1 = MADD(w0, _mm_loadu_ps(v0 + W), c1);
        c2 = MADD(w0, _mm_loadu_ps(v0 + 2 * W), c2), c3 = MADD(w0, _mm_loadu_ps(v0 + 3 * W), c3);
    }
    _mm_storeu_ps(acc, _mm_add_ps(c0, e0)), _mm_storeu_ps(acc + W, _mm_add_ps(c1, e1));
    _mm_storeu_ps(acc + 2 * W, _mm_add_ps(c2, e2)), _mm_storeu_ps(acc + 3 * W, _mm_add_ps(c3, e3));
}

/* One row, the last len (1..4) columns of a vector; partial vectors go through a stack buffer
 * so that nothing past the row is read or written. */
static void pv_1x4_sse41(float *acc, const float *p, size_t nk, const float *v, size_t v_stride,
                         size_t len) {
    __m128 c0 = len == W ? _mm_loadu_ps(acc) : load_partial(acc, len, 0.0f);
    __m128 c1 = _mm_setzero_ps();
    size_t j = 0;
    if (len == W) {
        for (; j + 2 <= nk; j += 2) {
            c0 = MADD(_mm_set1_ps(p[j]), _mm_loadu_ps(v + j * v_stride), c0);
            c1 = MADD(_mm_set1_ps(p[j + 1]), _mm_loadu_ps(v + (j + 1) * v_stride), c1);
        }
        for (; j < nk; j++) c0 = MADD(_mm_set1_ps(p[j]), _mm_loadu_ps(v + j * v_stride), c0);
        _mm_storeu_ps(acc, _mm_add_ps(c0, c1));
        return;
    }
    for (; j < nk; j++) c0 = MADD(_mm_set1_ps(p[j]), load_partial(v + j * v_stride, len, 0.0f), c0);
    store_partial(acc, c0, len);
}

static void pv_tile_sse41(float *acc, size_t ld_acc, const float *p, size_t ld_p, size_t nq,
                          size_t nk, const float *v, size_t v_stride, size_t d_v) {
    size_t i = 0;
    for (; i + 2 <= nq; i += 2) {
        float *a = acc + i * ld_acc;
        const float *pi = p + i * ld_p;
        size_t c = 0;
        for (; c + 4 * W <= d_v; c += 4 * W)
            pv_2x16_sse41(a + c, ld_acc, pi, ld_p, nk, v + c, v_stride);
        for (; c < d_v; c += W) {
            size_t len = d_v - c < W ? d_v - c : W;
            pv_1x4_sse41(a + c, pi, nk, v + c, v_stride, len);
            pv_1x4_sse41(a + ld_acc + c, pi + ld_p, nk, v + c, v_stride, len);
        }
    }
    for (; i < nq; i++) {
        float *a = acc + i * ld_acc;
        const float *pi = p + i * ld_p;
        size_t c = 0;
        for (; c + 4 * W <= d_v; c += 4 * W) pv_1x16_sse41(a + c, pi, nk, v + c, v_stride);
        for (; c < d_v; c += W)
            pv_1x4_sse41(a + c, pi, nk, v + c, v_stride, d_v - c < W ? d_v - c : W);
    }
}

static const sdpa_attention_kernels attention_sse41 = {
    .block_q = 32,
    .block_kv = 64,
    .scores_tile = scores_tile_sse41,
    .pv_tile = pv_tile_sse41,
};

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
    .attention = &attention_sse41,
};
