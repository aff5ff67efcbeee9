/* AVX-512F attention microkernels (the tiling driver is src/attention.c); avx512.c's table points
 * at sdpa_attention_kernels_avx512. */
#include "avx512_exp.h"

#define ISA_NAME(f) f##_avx512

#include "attention_tiles.h"

/* Scores: 4 x 4 blocks, 8 loads for 16 FMAs and the 16 dots reduced by one fv_hsums; a single
 * query against 16 keys at a time. */
enum { SCORES_MR = 4, SCORES_NR = 4, SCORES_KEYWISE = 0, SCORES_ROW_NR = 16 };

ALWAYS_INLINE float isa_dot(const float *a, const float *b, size_t n) {
    return dot_avx512(a, b, n);
}

/* A single query against 16 keys (decode) with the 16 dots in named accumulators: in
 * scores_row's form, with the dots in an array, GCC spends more instructions a block on the 16
 * key pointers, which this loop, bound by its 17 loads a step, does not hide. */
ALWAYS_INLINE void row16_key(fv *acc, fv vq, const float *k, const fv_lanes *m) {
    *acc = fv_madd(vq, tile_load(k, m), *acc);
}
ALWAYS_INLINE void row16_step(fv *a0, fv *a1, fv *a2, fv *a3, fv *a4, fv *a5, fv *a6, fv *a7,
                              fv *a8, fv *a9, fv *a10, fv *a11, fv *a12, fv *a13, fv *a14, fv *a15,
                              const float *q, const float *k, size_t ks, size_t p,
                              const fv_lanes *m) {
    const fv vq = tile_load(q + p, m);
    row16_key(a0, vq, k + p, m), row16_key(a1, vq, k + ks + p, m);
    row16_key(a2, vq, k + 2 * ks + p, m), row16_key(a3, vq, k + 3 * ks + p, m);
    row16_key(a4, vq, k + 4 * ks + p, m), row16_key(a5, vq, k + 5 * ks + p, m);
    row16_key(a6, vq, k + 6 * ks + p, m), row16_key(a7, vq, k + 7 * ks + p, m);
    row16_key(a8, vq, k + 8 * ks + p, m), row16_key(a9, vq, k + 9 * ks + p, m);
    row16_key(a10, vq, k + 10 * ks + p, m), row16_key(a11, vq, k + 11 * ks + p, m);
    row16_key(a12, vq, k + 12 * ks + p, m), row16_key(a13, vq, k + 13 * ks + p, m);
    row16_key(a14, vq, k + 14 * ks + p, m), row16_key(a15, vq, k + 15 * ks + p, m);
}
#define ISA_SCORES_ROW
ALWAYS_INLINE void isa_scores_row(float *s, const float *q, const float *k, size_t k_stride,
                                  size_t d, fv vscale) {
    fv a0 = fv_zero(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0,
       a9 = a0, a10 = a0, a11 = a0, a12 = a0, a13 = a0, a14 = a0, a15 = a0;
    size_t p = 0;
    for (; p + W <= d; p += W)
        row16_step(&a0, &a1, &a2, &a3, &a4, &a5, &a6, &a7, &a8, &a9, &a10, &a11, &a12, &a13, &a14,
                   &a15, q, k, k_stride, p, NULL);
    if (p < d) {
        const fv_lanes m = fv_first(d - p);
        row16_step(&a0, &a1, &a2, &a3, &a4, &a5, &a6, &a7, &a8, &a9, &a10, &a11, &a12, &a13, &a14,
                   &a15, q, k, k_stride, p, &m);
    }
    const fv a[16] = {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15};
    fv_store(s, fv_mul(fv_hsums(a), vscale));
}

#include "attention_entries.h"

/* The P V microkernels: acc[i][c] = acc[i][c] alpha[i] + sum_j P(i, j) v[j][c], with the weight
 * P(i, j) at p[i * p_row + j * p_key] (row-major tiles: p_row = ld_p, p_key = 1; the key-major
 * tiles of exp_pv: p_row = 1, p_key = SDPA_ATTN_MAX_BLOCK_Q) and alpha = NULL for 1 (so that
 * rescaling a row for a new max costs a multiply at the load, not a pass over the row). Inlined
 * into each caller with its constants. */
ALWAYS_INLINE __m512 pv_load_acc(const float *o, __mmask16 m, const float *alpha) {
    __m512 c = _mm512_maskz_loadu_ps(m, o);
    return alpha ? _mm512_mul_ps(c, _mm512_set1_ps(*alpha)) : c;
}

/* acc[4 rows][64 columns]: the block of acc stays in 16 registers for all nk keys; each key
 * costs 4 loads of v and 4 broadcasts for 16 FMAs. */
ALWAYS_INLINE void pv_4x64_avx512(float *acc, size_t ld_acc, const float *p, size_t p_row,
                                  size_t p_key, const float *alpha, size_t nk, const float *v,
                                  size_t v_stride) {
    float *o0 = acc, *o1 = acc + ld_acc, *o2 = acc + 2 * ld_acc, *o3 = acc + 3 * ld_acc;
    const __mmask16 all = 0xFFFF;
    const float *a0 = alpha, *a1 = alpha ? alpha + 1 : NULL, *a2 = alpha ? alpha + 2 : NULL,
                *a3 = alpha ? alpha + 3 : NULL;
    __m512 c00 = pv_load_acc(o0, all, a0), c01 = pv_load_acc(o0 + W, all, a0),
           c02 = pv_load_acc(o0 + 2 * W, all, a0), c03 = pv_load_acc(o0 + 3 * W, all, a0);
    __m512 c10 = pv_load_acc(o1, all, a1), c11 = pv_load_acc(o1 + W, all, a1),
           c12 = pv_load_acc(o1 + 2 * W, all, a1), c13 = pv_load_acc(o1 + 3 * W, all, a1);
    __m512 c20 = pv_load_acc(o2, all, a2), c21 = pv_load_acc(o2 + W, all, a2),
           c22 = pv_load_acc(o2 + 2 * W, all, a2), c23 = pv_load_acc(o2 + 3 * W, all, a2);
    __m512 c30 = pv_load_acc(o3, all, a3), c31 = pv_load_acc(o3 + W, all, a3),
           c32 = pv_load_acc(o3 + 2 * W, all, a3), c33 = pv_load_acc(o3 + 3 * W, all, a3);
    for (size_t j = 0; j < nk; j++) {
        const float *vj = v + j * v_stride, *pj = p + j * p_key;
        __m512 v0 = _mm512_loadu_ps(vj), v1 = _mm512_loadu_ps(vj + W),
               v2 = _mm512_loadu_ps(vj + 2 * W), v3 = _mm512_loadu_ps(vj + 3 * W);
        __m512 w = _mm512_set1_ps(pj[0]);
        c00 = _mm512_fmadd_ps(w, v0, c00), c01 = _mm512_fmadd_ps(w, v1, c01);
        c02 = _mm512_fmadd_ps(w, v2, c02), c03 = _mm512_fmadd_ps(w, v3, c03);
        w = _mm512_set1_ps(pj[p_row]);
        c10 = _mm512_fmadd_ps(w, v0, c10), c11 = _mm512_fmadd_ps(w, v1, c11);
        c12 = _mm512_fmadd_ps(w, v2, c12), c13 = _mm512_fmadd_ps(w, v3, c13);
        w = _mm512_set1_ps(pj[2 * p_row]);
        c20 = _mm512_fmadd_ps(w, v0, c20), c21 = _mm512_fmadd_ps(w, v1, c21);
        c22 = _mm512_fmadd_ps(w, v2, c22), c23 = _mm512_fmadd_ps(w, v3, c23);
        w = _mm512_set1_ps(pj[3 * p_row]);
        c30 = _mm512_fmadd_ps(w, v0, c30), c31 = _mm512_fmadd_ps(w, v1, c31);
        c32 = _mm512_fmadd_ps(w, v2, c32), c33 = _mm512_fmadd_ps(w, v3, c33);
    }
    _mm512_storeu_ps(o0, c00), _mm512_storeu_ps(o0 + W, c01);
    _mm512_storeu_ps(o0 + 2 * W, c02), _mm512_storeu_ps(o0 + 3 * W, c03);
    _mm512_storeu_ps(o1, c10), _mm512_storeu_ps(o1 + W, c11);
    _mm512_storeu_ps(o1 + 2 * W, c12), _mm512_storeu_ps(o1 + 3 * W, c13);
    _mm512_storeu_ps(o2, c20), _mm512_storeu_ps(o2 + W, c21);
    _mm512_storeu_ps(o2 + 2 * W, c22), _mm512_storeu_ps(o2 + 3 * W, c23);
    _mm512_storeu_ps(o3, c30), _mm512_storeu_ps(o3 + W, c31);
    _mm512_storeu_ps(o3 + 2 * W, c32), _mm512_storeu_ps(o3 + 3 * W, c33);
}

/* acc[4 rows][16 columns, masked by m]; two keys per step keep eight independent FMA chains. */
ALWAYS_INLINE void pv_4x16_avx512(float *acc, size_t ld_acc, const float *p, size_t p_row,
                                  size_t p_key, const float *alpha, size_t nk, const float *v,
                                  size_t v_stride, __mmask16 m) {
    __m512 c0 = pv_load_acc(acc, m, alpha),
           c1 = pv_load_acc(acc + ld_acc, m, alpha ? alpha + 1 : NULL);
    __m512 c2 = pv_load_acc(acc + 2 * ld_acc, m, alpha ? alpha + 2 : NULL);
    __m512 c3 = pv_load_acc(acc + 3 * ld_acc, m, alpha ? alpha + 3 : NULL);
    __m512 e0 = _mm512_setzero_ps(), e1 = e0, e2 = e0, e3 = e0;
    size_t j = 0;
    for (; j + 2 <= nk; j += 2) {
        const float *p0 = p + j * p_key, *p1 = p0 + p_key;
        __m512 v0 = _mm512_maskz_loadu_ps(m, v + j * v_stride);
        __m512 v1 = _mm512_maskz_loadu_ps(m, v + (j + 1) * v_stride);
        c0 = _mm512_fmadd_ps(_mm512_set1_ps(p0[0]), v0, c0);
        c1 = _mm512_fmadd_ps(_mm512_set1_ps(p0[p_row]), v0, c1);
        c2 = _mm512_fmadd_ps(_mm512_set1_ps(p0[2 * p_row]), v0, c2);
        c3 = _mm512_fmadd_ps(_mm512_set1_ps(p0[3 * p_row]), v0, c3);
        e0 = _mm512_fmadd_ps(_mm512_set1_ps(p1[0]), v1, e0);
        e1 = _mm512_fmadd_ps(_mm512_set1_ps(p1[p_row]), v1, e1);
        e2 = _mm512_fmadd_ps(_mm512_set1_ps(p1[2 * p_row]), v1, e2);
        e3 = _mm512_fmadd_ps(_mm512_set1_ps(p1[3 * p_row]), v1, e3);
    }
    if (j < nk) {
        const float *p0 = p + j * p_key;
        __m512 v0 = _mm512_maskz_loadu_ps(m, v + j * v_stride);
        c0 = _mm512_fmadd_ps(_mm512_set1_ps(p0[0]), v0, c0);
        c1 = _mm512_fmadd_ps(_mm512_set1_ps(p0[p_row]), v0, c1);
        c2 = _mm512_fmadd_ps(_mm512_set1_ps(p0[2 * p_row]), v0, c2);
        c3 = _mm512_fmadd_ps(_mm512_set1_ps(p0[3 * p_row]), v0, c3);
    }
    _mm512_mask_storeu_ps(acc, m, _mm512_add_ps(c0, e0));
    _mm512_mask_storeu_ps(acc + ld_acc, m, _mm512_add_ps(c1, e1));
    _mm512_mask_storeu_ps(acc + 2 * ld_acc, m, _mm512_add_ps(c2, e2));
    _mm512_mask_storeu_ps(acc + 3 * ld_acc, m, _mm512_add_ps(c3, e3));
}

/* One row (decode, and the rows left over): 64 columns, two keys per step for eight chains. */
ALWAYS_INLINE void pv_1x64_avx512(float *acc, const float *p, size_t p_key, const float *alpha,
                                  size_t nk, const float *v, size_t v_stride) {
    const __mmask16 all = 0xFFFF;
    __m512 c0 = pv_load_acc(acc, all, alpha), c1 = pv_load_acc(acc + W, all, alpha),
           c2 = pv_load_acc(acc + 2 * W, all, alpha), c3 = pv_load_acc(acc + 3 * W, all, alpha);
    __m512 e0 = _mm512_setzero_ps(), e1 = e0, e2 = e0, e3 = e0;
    size_t j = 0;
    for (; j + 2 <= nk; j += 2) {
        const float *v0 = v + j * v_stride, *v1 = v0 + v_stride;
        __m512 w0 = _mm512_set1_ps(p[j * p_key]), w1 = _mm512_set1_ps(p[(j + 1) * p_key]);
        c0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(v0), c0);
        c1 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(v0 + W), c1);
        c2 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(v0 + 2 * W), c2);
        c3 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(v0 + 3 * W), c3);
        e0 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(v1), e0);
        e1 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(v1 + W), e1);
        e2 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(v1 + 2 * W), e2);
        e3 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(v1 + 3 * W), e3);
    }
    if (j < nk) {
        const float *v0 = v + j * v_stride;
        __m512 w0 = _mm512_set1_ps(p[j * p_key]);
        c0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(v0), c0);
        c1 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(v0 + W), c1);
        c2 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(v0 + 2 * W), c2);
        c3 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(v0 + 3 * W), c3);
    }
    _mm512_storeu_ps(acc, _mm512_add_ps(c0, e0));
    _mm512_storeu_ps(acc + W, _mm512_add_ps(c1, e1));
    _mm512_storeu_ps(acc + 2 * W, _mm512_add_ps(c2, e2));
    _mm512_storeu_ps(acc + 3 * W, _mm512_add_ps(c3, e3));
}

ALWAYS_INLINE void pv_1x16_avx512(float *acc, const float *p, size_t p_key, const float *alpha,
                                  size_t nk, const float *v, size_t v_stride, __mmask16 m) {
    __m512 c0 = pv_load_acc(acc, m, alpha), c1 = _mm512_setzero_ps(), c2 = c1, c3 = c1;
    size_t j = 0;
    for (; j + 4 <= nk; j += 4) {
        const float *v0 = v + j * v_stride, *p0 = p + j * p_key;
        c0 = _mm512_fmadd_ps(_mm512_set1_ps(p0[0]), _mm512_maskz_loadu_ps(m, v0), c0);
        c1 =
            _mm512_fmadd_ps(_mm512_set1_ps(p0[p_key]), _mm512_maskz_loadu_ps(m, v0 + v_stride), c1);
        c2 = _mm512_fmadd_ps(_mm512_set1_ps(p0[2 * p_key]),
                             _mm512_maskz_loadu_ps(m, v0 + 2 * v_stride), c2);
        c3 = _mm512_fmadd_ps(_mm512_set1_ps(p0[3 * p_key]),
                             _mm512_maskz_loadu_ps(m, v0 + 3 * v_stride), c3);
    }
    for (; j < nk; j++)
        c0 = _mm512_fmadd_ps(_mm512_set1_ps(p[j * p_key]),
                             _mm512_maskz_loadu_ps(m, v + j * v_stride), c0);
    _mm512_mask_storeu_ps(acc, m, _mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3)));
}

/* A whole tile: rows of four, then the rows left over; 64 columns at a time, then 16. */
ALWAYS_INLINE void pv_tile_body(float *acc, size_t ld_acc, const float *p, size_t p_row,
                                size_t p_key, const float *alpha, size_t nq, size_t nk,
                                const float *v, size_t v_stride, size_t d_v) {
    size_t i = 0;
    for (; i + 4 <= nq; i += 4) {
        float *a = acc + i * ld_acc;
        const float *pi = p + i * p_row, *ai = alpha ? alpha + i : NULL;
        size_t c = 0;
        for (; c + 4 * W <= d_v; c += 4 * W)
            pv_4x64_avx512(a + c, ld_acc, pi, p_row, p_key, ai, nk, v + c, v_stride);
        for (; c < d_v; c += W) {
            __mmask16 m = d_v - c >= W ? (__mmask16)0xFFFF : tail_mask(d_v - c);
            pv_4x16_avx512(a + c, ld_acc, pi, p_row, p_key, ai, nk, v + c, v_stride, m);
        }
    }
    for (; i < nq; i++) {
        float *a = acc + i * ld_acc;
        const float *pi = p + i * p_row, *ai = alpha ? alpha + i : NULL;
        size_t c = 0;
        for (; c + 4 * W <= d_v; c += 4 * W)
            pv_1x64_avx512(a + c, pi, p_key, ai, nk, v + c, v_stride);
        for (; c < d_v; c += W) {
            __mmask16 m = d_v - c >= W ? (__mmask16)0xFFFF : tail_mask(d_v - c);
            pv_1x16_avx512(a + c, pi, p_key, ai, nk, v + c, v_stride, m);
        }
    }
}

static void pv_tile_avx512(float *acc, size_t ld_acc, const float *p, size_t ld_p, size_t nq,
                           size_t nk, const float *v, size_t v_stride, size_t d_v) {
    pv_tile_body(acc, ld_acc, p, ld_p, 1, NULL, nq, nk, v, v_stride, d_v);
}

/* exp of a whole tile of scores minus each row's shift, with the row sums: four vectors per
 * step so that the exp's dependency chains overlap. */
#define EXP_TILE_AVX512(NAME, EXP)                                                                 \
    static void NAME(float *s, size_t ld_s, size_t nq, size_t nk, const float *shift,              \
                     float *sums) {                                                                \
        const __m512 table = exp_table_avx512();                                                   \
        for (size_t i = 0; i < nq; i++) {                                                          \
            float *row = s + i * ld_s;                                                             \
            const __m512 vshift = _mm512_set1_ps(shift[i]);                                        \
            __m512 t0 = _mm512_setzero_ps(), t1 = t0, t2 = t0, t3 = t0;                            \
            size_t j = 0;                                                                          \
            for (; j + 4 * W <= nk; j += 4 * W) {                                                  \
                __m512 e0 = EXP(_mm512_sub_ps(_mm512_loadu_ps(row + j), vshift), table);           \
                __m512 e1 = EXP(_mm512_sub_ps(_mm512_loadu_ps(row + j + W), vshift), table);       \
                __m512 e2 = EXP(_mm512_sub_ps(_mm512_loadu_ps(row + j + 2 * W), vshift), table);   \
                __m512 e3 = EXP(_mm512_sub_ps(_mm512_loadu_ps(row + j + 3 * W), vshift), table);   \
                _mm512_storeu_ps(row + j, e0);                                                     \
                _mm512_storeu_ps(row + j + W, e1);                                                 \
                _mm512_storeu_ps(row + j + 2 * W, e2);                                             \
                _mm512_storeu_ps(row + j + 3 * W, e3);                                             \
                t0 = _mm512_add_ps(t0, e0), t1 = _mm512_add_ps(t1, e1);                            \
                t2 = _mm512_add_ps(t2, e2), t3 = _mm512_add_ps(t3, e3);                            \
            }                                                                                      \
            for (; j < nk; j += W) {                                                               \
                __mmask16 m = nk - j >= W ? (__mmask16)0xFFFF : tail_mask(nk - j);                 \
                __m512 e = EXP(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, row + j), vshift), table);   \
                _mm512_mask_storeu_ps(row + j, m, e);                                              \
                t0 = _mm512_mask_add_ps(t0, m, t0, e);                                             \
            }                                                                                      \
            sums[i] =                                                                              \
                _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(t0, t1), _mm512_add_ps(t2, t3))); \
        }                                                                                          \
    }
/* a tile's arguments are <= 0 (scores minus their row's max): the light exp of exp_sum */
static inline __m512 exp_tile_fast_arg(__m512 x, __m512 table) {
    return exp_fast_avx512(x, table, 0);
}
static inline __m512 exp_tile_sleef_arg(__m512 x, __m512 table) {
    return exp_sleef_avx512(x, table, 0);
}
EXP_TILE_AVX512(exp_tile_fast_avx512, exp_tile_fast_arg)
EXP_TILE_AVX512(exp_tile_sleef_avx512, exp_tile_sleef_arg)

/* In-register transpose of 16 rows of 16 floats: three rounds of unpack and lane shuffles. */
ALWAYS_INLINE void transpose16_avx512(__m512 r[16]) {
    __m512 t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    /* u[4g + m], 128-bit chunk c: rows 4g..4g+3 of column 4c + m */
    for (int g = 0; g < 4; g++) {
        __m512d a = _mm512_castps_pd(t[4 * g]), b = _mm512_castps_pd(t[4 * g + 1]);
        __m512d c = _mm512_castps_pd(t[4 * g + 2]), e = _mm512_castps_pd(t[4 * g + 3]);
        u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, e));
        u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, e));
    }
    for (int m = 0; m < 4; m++) {
        __m512 a = _mm512_shuffle_f32x4(u[m], u[4 + m], 0x88);
        __m512 b = _mm512_shuffle_f32x4(u[m], u[4 + m], 0xDD);
        __m512 c = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0x88);
        __m512 e = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0xDD);
        r[m] = _mm512_shuffle_f32x4(a, c, 0x88);
        r[8 + m] = _mm512_shuffle_f32x4(a, c, 0xDD);
        r[4 + m] = _mm512_shuffle_f32x4(b, e, 0x88);
        r[12 + m] = _mm512_shuffle_f32x4(b, e, 0xDD);
    }
}

/* qt[p][i] = q[i][p], padded with zero queries up to SDPA_ATTN_MAX_BLOCK_Q: 16 x 16 blocks
 * through the register transpose (masked loads for the d tail and the missing rows). */
static void pack_q_avx512(float *qt, const float *q, size_t q_stride, size_t nq, size_t d) {
    const size_t ld = SDPA_ATTN_MAX_BLOCK_Q;
    for (size_t p0 = 0; p0 < d; p0 += W) {
        const size_t np = d - p0 < W ? d - p0 : W;
        const __mmask16 m = np == W ? (__mmask16)0xFFFF : tail_mask(np);
        for (size_t i0 = 0; i0 < ld; i0 += W) {
            __m512 r[16];
            for (size_t t = 0; t < W; t++)
                r[t] = i0 + t < nq ? _mm512_maskz_loadu_ps(m, q + (i0 + t) * q_stride + p0)
                                   : _mm512_setzero_ps();
            transpose16_avx512(r);
            for (size_t t = 0; t < np; t++) _mm512_storeu_ps(qt + (p0 + t) * ld + i0, r[t]);
        }
    }
}

/* One step of 8 keys x 32 queries: 2 loads of qt and 8 broadcasts of k feed 16 FMAs. */
#define PACKED_8X32_STEP(R)                                                                        \
    do {                                                                                           \
        __m512 w = _mm512_set1_ps(k[(R)*k_stride + p]);                                            \
        a##R##0 = _mm512_fmadd_ps(w, q0, a##R##0);                                                 \
        a##R##1 = _mm512_fmadd_ps(w, q1, a##R##1);                                                 \
    } while (0)

/* Key R's two vectors of scores, scaled as they leave the registers. */
#define PACKED_8X32_STORE(R)                                                                       \
    do {                                                                                           \
        _mm512_storeu_ps(st + (R)*ld, _mm512_mul_ps(a##R##0, vscale));                             \
        _mm512_storeu_ps(st + (R)*ld + W, _mm512_mul_ps(a##R##1, vscale));                         \
    } while (0)

/* st[j][i] = scale * sum_p k[j][p] * qt[p][i] for 8 keys and 32 queries */
static inline void packed_8x32_avx512(float *st, const float *qt, const float *k, size_t k_stride,
                                      size_t d, __m512 vscale) {
    const size_t ld = SDPA_ATTN_MAX_BLOCK_Q;
    __m512 a00 = _mm512_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00,
           a30 = a00, a31 = a00, a40 = a00, a41 = a00, a50 = a00, a51 = a00, a60 = a00, a61 = a00,
           a70 = a00, a71 = a00;
    for (size_t p = 0; p < d; p++) {
        __m512 q0 = _mm512_loadu_ps(qt + p * ld), q1 = _mm512_loadu_ps(qt + p * ld + W);
        PACKED_8X32_STEP(0);
        PACKED_8X32_STEP(1);
        PACKED_8X32_STEP(2);
        PACKED_8X32_STEP(3);
        PACKED_8X32_STEP(4);
        PACKED_8X32_STEP(5);
        PACKED_8X32_STEP(6);
        PACKED_8X32_STEP(7);
    }
    PACKED_8X32_STORE(0);
    PACKED_8X32_STORE(1);
    PACKED_8X32_STORE(2);
    PACKED_8X32_STORE(3);
    PACKED_8X32_STORE(4);
    PACKED_8X32_STORE(5);
    PACKED_8X32_STORE(6);
    PACKED_8X32_STORE(7);
}

/* st[key][query] = scale * sum_p k[key][p] qt[p][query] for nk keys and all
 * SDPA_ATTN_MAX_BLOCK_Q (zero-padded) queries: broadcasts of k, vector loads of qt, no horizontal
 * sums. The scale multiplies the finished dots, as in scores_tile: scaling q first could
 * overflow or underflow where the dot does not. */
static void scores_keymajor_avx512(float *st, const float *qt, const float *k, size_t k_stride,
                                   size_t nk, size_t d, float scale) {
    const size_t ld = SDPA_ATTN_MAX_BLOCK_Q;
    const __m512 vscale = _mm512_set1_ps(scale);
    size_t j = 0;
    for (; j + 8 <= nk; j += 8)
        packed_8x32_avx512(st + j * ld, qt, k + j * k_stride, k_stride, d, vscale);
    for (; j < nk; j++) {
        __m512 a0 = _mm512_setzero_ps(), a1 = a0;
        const float *kj = k + j * k_stride;
        for (size_t p = 0; p < d; p++) {
            __m512 w = _mm512_set1_ps(kj[p]);
            a0 = _mm512_fmadd_ps(w, _mm512_loadu_ps(qt + p * ld), a0);
            a1 = _mm512_fmadd_ps(w, _mm512_loadu_ps(qt + p * ld + W), a1);
        }
        _mm512_storeu_ps(st + j * ld, _mm512_mul_ps(a0, vscale));
        _mm512_storeu_ps(st + j * ld + W, _mm512_mul_ps(a1, vscale));
    }
}

/* The scores tile from the packed queries: the key-major tile, then 16 x 16 in-register
 * transposes into s[query][key]. */
static void scores_packed_avx512(float *s, size_t ld_s, const float *qt, size_t nq, const float *k,
                                 size_t k_stride, size_t nk, size_t d, float scale) {
    const size_t ld = SDPA_ATTN_MAX_BLOCK_Q;
    float st[SDPA_ATTN_MAX_BLOCK_KV * SDPA_ATTN_MAX_BLOCK_Q];
    scores_keymajor_avx512(st, qt, k, k_stride, nk, d, scale);
    for (size_t j0 = 0; j0 < nk; j0 += W) {
        const size_t nj = nk - j0 < W ? nk - j0 : W;
        const __mmask16 m = nj == W ? (__mmask16)0xFFFF : tail_mask(nj);
        for (size_t i0 = 0; i0 < nq; i0 += W) {
            __m512 r[16];
            for (size_t t = 0; t < W; t++)
                r[t] = t < nj ? _mm512_loadu_ps(st + (j0 + t) * ld + i0) : _mm512_setzero_ps();
            transpose16_avx512(r);
            for (size_t t = 0; t < W && i0 + t < nq; t++)
                _mm512_mask_storeu_ps(s + (i0 + t) * ld_s + j0, m, r[t]);
        }
    }
}

/* The online softmax's step for a whole tile, in two halves around the driver's bookkeeping
 * (kernels.h, scores_max and exp_pv). The scores stay key-major, as the packed GEMM leaves them,
 * so the row maxima, the exps and the row sums are vector operations across 16 queries at a
 * time (no transposes, no horizontal sums, no call per row), and the P V step reads the weights
 * in that layout and rescales each accumulator row as it loads it. */
static void scores_max_avx512(float *st, float *tile_max, const float *qt, size_t nq,
                              const float *k, size_t k_stride, size_t nk, size_t d_k, float scale) {
    const size_t ld = SDPA_ATTN_MAX_BLOCK_Q;
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    scores_keymajor_avx512(st, qt, k, k_stride, nk, d_k, scale);
    for (size_t h = 0; h * W < nq; h++) {
        __m512 mx0 = ninf, mx1 = ninf;
        size_t j = 0;
        for (; j + 2 <= nk; j += 2) {
            mx0 = _mm512_max_ps(_mm512_load_ps(st + j * ld + h * W), mx0);
            mx1 = _mm512_max_ps(_mm512_load_ps(st + (j + 1) * ld + h * W), mx1);
        }
        if (j < nk) mx0 = _mm512_max_ps(_mm512_load_ps(st + j * ld + h * W), mx0);
        _mm512_storeu_ps(tile_max + h * W, _mm512_max_ps(mx0, mx1));
    }
}

#define EXP_PV_AVX512(NAME, EXP)                                                                   \
    static void NAME(float *acc, size_t ld_acc, float *st, const float *m, const float *m_new,     \
                     float *alpha, float *sums, size_t nq, size_t nk, const float *v,              \
                     size_t v_stride, size_t d_v) {                                                \
        const size_t ld = SDPA_ATTN_MAX_BLOCK_Q;                                                   \
        const __m512 table = exp_table_avx512();                                                   \
        for (size_t h = 0; h * W < nq; h++) {                                                      \
            const __mmask16 valid = nq - h * W >= W ? (__mmask16)0xFFFF : tail_mask(nq - h * W);   \
            /* rows past nq (zero queries, scores 0): shift 0, alpha exp(-inf) = 0, both unused */ \
            const __m512 mx = _mm512_maskz_loadu_ps(valid, m_new + h * W);                         \
            const __m512 old = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), valid, m + h * W);  \
            /* exp(0) is exactly 1: a row whose max did not move is not rescaled at all */         \
            _mm512_storeu_ps(alpha + h * W, EXP(_mm512_sub_ps(old, mx), table, 0));                \
            __m512 s0 = _mm512_setzero_ps(), s1 = s0;                                              \
            size_t j = 0;                                                                          \
            for (; j + 2 <= nk; j += 2) {                                                          \
                float *p0 = st + j * ld + h * W, *p1 = p0 + ld;                                    \
                __m512 e0 = EXP(_mm512_sub_ps(_mm512_load_ps(p0), mx), table, 0);                  \
                __m512 e1 = EXP(_mm512_sub_ps(_mm512_load_ps(p1), mx), table, 0);                  \
                _mm512_store_ps(p0, e0), _mm512_store_ps(p1, e1);                                  \
                s0 = _mm512_add_ps(s0, e0), s1 = _mm512_add_ps(s1, e1);                            \
            }                                                                                      \
            if (j < nk) {                                                                          \
                float *p0 = st + j * ld + h * W;                                                   \
                __m512 e0 = EXP(_mm512_sub_ps(_mm512_load_ps(p0), mx), table, 0);                  \
                _mm512_store_ps(p0, e0);                                                           \
                s0 = _mm512_add_ps(s0, e0);                                                        \
            }                                                                                      \
            _mm512_storeu_ps(sums + h * W, _mm512_add_ps(s0, s1));                                 \
        }                                                                                          \
        pv_tile_body(acc, ld_acc, st, 1, ld, alpha, nq, nk, v, v_stride, d_v);                     \
    }
EXP_PV_AVX512(exp_pv_fast_avx512, exp_fast_avx512)
EXP_PV_AVX512(exp_pv_sleef_avx512, exp_sleef_avx512)

const sdpa_attention_kernels sdpa_attention_kernels_avx512 = {
    .block_q = 32,
    .block_kv = 64,
    .scores_tile = scores_tile_avx512,
    .pv_tile = pv_tile_avx512,
    .exp_tile = {exp_tile_fast_avx512, exp_tile_sleef_avx512},
    .pack_q = pack_q_avx512,
    .scores_packed = scores_packed_avx512,
    .scores_max = scores_max_avx512,
    .exp_pv = {exp_pv_fast_avx512, exp_pv_sleef_avx512},
};
