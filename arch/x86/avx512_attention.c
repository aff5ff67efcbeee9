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

/* P V: 4 rows x 64 columns, the block of acc in 16 registers for all nk keys (4 loads of v and 4
 * broadcasts for 16 FMAs a key); the columns left over 16 at a time, masked, for the 4 rows at
 * once; the rows left over one at a time. */
ALWAYS_INLINE void isa_pv(const pv_operands *o) { pv_tile_loops(o, 4, 4, 0, 0, 4, 4); }

#include "attention_entries.h"

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
        const pv_operands o = {acc, ld_acc, st, 1, ld, alpha, nq, nk, v, v_stride, d_v};           \
        isa_pv(&o);                                                                                \
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
