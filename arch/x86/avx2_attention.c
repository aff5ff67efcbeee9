/* AVX2 + FMA attention microkernels (the tiling driver is src/attention.c); avx2.c's table points
 * at sdpa_attention_kernels_avx2. */
#include "avx2_exp.h"

#define ISA_NAME(f) f##_avx2

#include "attention_tiles.h"

/* Scores: 2 x 4 blocks, 6 loads for 8 FMAs (16 registers hold no more) and the 8 dots reduced by
 * one fv_hsums; a single query against 8 keys at a time. */
enum { SCORES_MR = 2, SCORES_NR = 4, SCORES_KEYWISE = 0, SCORES_ROW_NR = 8 };

ALWAYS_INLINE float isa_dot(const float *a, const float *b, size_t n) { return dot_avx2(a, b, n); }

/* P V: 6 rows x 16 columns, 12 accumulators (more chains than the 8 that two FMA pipes need), 2
 * loads of v and 6 broadcasts for 12 FMAs a key; then pairs of rows x 32 columns (8
 * accumulators, 4 loads and 2 broadcasts for 8 FMAs); the columns left over 8 at a time, masked,
 * row by row with four keys a step. */
ALWAYS_INLINE void isa_pv(const pv_operands *o) { pv_tile_loops(o, 6, 2, 2, 4, 1, 4); }

#include "attention_entries.h"

/* In-register transpose of 8 rows of 8 floats: unpack, shuffle, then swap 128-bit halves. */
ALWAYS_INLINE void transpose8_avx2(__m256 r[8]) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20), r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    r[1] = _mm256_permute2f128_ps(u1, u5, 0x20), r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20), r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    r[3] = _mm256_permute2f128_ps(u3, u7, 0x20), r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* qt[p][i] = q[i][p], padded with zero queries up to SDPA_ATTN_MAX_BLOCK_Q: 8 x 8 blocks through
 * the register transpose (masked loads for the d tail, zeros for the missing rows). */
static void pack_q_avx2(float *qt, const float *q, size_t q_stride, size_t nq, size_t d) {
    const size_t ld = SDPA_ATTN_MAX_BLOCK_Q;
    for (size_t p0 = 0; p0 < d; p0 += W) {
        const size_t np = d - p0 < W ? d - p0 : W;
        const __m256i m = tail_mask(np);
        for (size_t i0 = 0; i0 < ld; i0 += W) {
            __m256 r[8];
            for (size_t t = 0; t < W; t++)
                r[t] = i0 + t < nq ? _mm256_maskload_ps(q + (i0 + t) * q_stride + p0, m)
                                   : _mm256_setzero_ps();
            transpose8_avx2(r);
            for (size_t t = 0; t < np; t++) _mm256_storeu_ps(qt + (p0 + t) * ld + i0, r[t]);
        }
    }
}

/* two vectors of one key's scores, scaled as they leave the registers */
#define KEYMAJOR_STORE(p, a0, a1)                                                                  \
    do {                                                                                           \
        _mm256_storeu_ps(p, _mm256_mul_ps(a0, vscale));                                            \
        _mm256_storeu_ps((p) + W, _mm256_mul_ps(a1, vscale));                                      \
    } while (0)

/* st[key][query] = scale * sum_p k[key][p] qt[p][query] for nk keys and all
 * SDPA_ATTN_MAX_BLOCK_Q (zero-padded) queries: two keys a step, 4 loads of qt and 2 broadcasts of
 * k for 8 FMAs, no horizontal sums. The scale multiplies the finished dots, as in scores_tile:
 * scaling q first could overflow or underflow where the dot does not. */
/* Six keys and 16 queries: 12 accumulators (more independent chains than the 8 that two FMA
 * pipes of 4-cycle latency need), 2 loads of qt and 6 broadcasts for 12 FMAs. */
ALWAYS_INLINE void keymajor_6x16_avx2(float *st, const float *qt, const float *k, size_t k_stride,
                                      size_t d, __m256 vscale) {
    const size_t ld = SDPA_ATTN_MAX_BLOCK_Q;
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00,
           a30 = a00, a31 = a00, a40 = a00, a41 = a00, a50 = a00, a51 = a00;
    for (size_t p = 0; p < d; p++) {
        __m256 q0 = _mm256_loadu_ps(qt + p * ld), q1 = _mm256_loadu_ps(qt + p * ld + W);
        __asm__("" : "+x"(q0), "+x"(q1));
        __m256 w = _mm256_broadcast_ss(k + p);
        a00 = _mm256_fmadd_ps(w, q0, a00), a01 = _mm256_fmadd_ps(w, q1, a01);
        w = _mm256_broadcast_ss(k + k_stride + p);
        a10 = _mm256_fmadd_ps(w, q0, a10), a11 = _mm256_fmadd_ps(w, q1, a11);
        w = _mm256_broadcast_ss(k + 2 * k_stride + p);
        a20 = _mm256_fmadd_ps(w, q0, a20), a21 = _mm256_fmadd_ps(w, q1, a21);
        w = _mm256_broadcast_ss(k + 3 * k_stride + p);
        a30 = _mm256_fmadd_ps(w, q0, a30), a31 = _mm256_fmadd_ps(w, q1, a31);
        w = _mm256_broadcast_ss(k + 4 * k_stride + p);
        a40 = _mm256_fmadd_ps(w, q0, a40), a41 = _mm256_fmadd_ps(w, q1, a41);
        w = _mm256_broadcast_ss(k + 5 * k_stride + p);
        a50 = _mm256_fmadd_ps(w, q0, a50), a51 = _mm256_fmadd_ps(w, q1, a51);
    }
    KEYMAJOR_STORE(st, a00, a01);
    KEYMAJOR_STORE(st + ld, a10, a11);
    KEYMAJOR_STORE(st + 2 * ld, a20, a21);
    KEYMAJOR_STORE(st + 3 * ld, a30, a31);
    KEYMAJOR_STORE(st + 4 * ld, a40, a41);
    KEYMAJOR_STORE(st + 5 * ld, a50, a51);
}

static void scores_keymajor_avx2(float *st, const float *qt, const float *k, size_t k_stride,
                                 size_t nk, size_t d, float scale) {
    const size_t ld = SDPA_ATTN_MAX_BLOCK_Q;
    const __m256 vscale = _mm256_set1_ps(scale);
    size_t j = 0;
    for (; j + 6 <= nk; j += 6)
        for (size_t h = 0; h < ld; h += 2 * W)
            keymajor_6x16_avx2(st + j * ld + h, qt + h, k + j * k_stride, k_stride, d, vscale);
    for (; j + 2 <= nk; j += 2) {
        const float *k0 = k + j * k_stride, *k1 = k0 + k_stride;
        __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00,
               a12 = a00, a13 = a00;
        for (size_t p = 0; p < d; p++) {
            const float *qp = qt + p * ld;
            __m256 q0 = _mm256_loadu_ps(qp), q1 = _mm256_loadu_ps(qp + W),
                   q2 = _mm256_loadu_ps(qp + 2 * W), q3 = _mm256_loadu_ps(qp + 3 * W);
            /* one load of qt for both keys (see pv_2x32_avx2) */
            __asm__("" : "+x"(q0), "+x"(q1), "+x"(q2), "+x"(q3));
            __m256 w = _mm256_broadcast_ss(k0 + p);
            a00 = _mm256_fmadd_ps(w, q0, a00), a01 = _mm256_fmadd_ps(w, q1, a01);
            a02 = _mm256_fmadd_ps(w, q2, a02), a03 = _mm256_fmadd_ps(w, q3, a03);
            w = _mm256_broadcast_ss(k1 + p);
            a10 = _mm256_fmadd_ps(w, q0, a10), a11 = _mm256_fmadd_ps(w, q1, a11);
            a12 = _mm256_fmadd_ps(w, q2, a12), a13 = _mm256_fmadd_ps(w, q3, a13);
        }
        float *s0 = st + j * ld, *s1 = s0 + ld;
        KEYMAJOR_STORE(s0, a00, a01);
        KEYMAJOR_STORE(s0 + 2 * W, a02, a03);
        KEYMAJOR_STORE(s1, a10, a11);
        KEYMAJOR_STORE(s1 + 2 * W, a12, a13);
    }
    if (j < nk) {
        const float *k0 = k + j * k_stride;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (size_t p = 0; p < d; p++) {
            const float *qp = qt + p * ld;
            __m256 w = _mm256_broadcast_ss(k0 + p);
            a0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(qp), a0);
            a1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(qp + W), a1);
            a2 = _mm256_fmadd_ps(w, _mm256_loadu_ps(qp + 2 * W), a2);
            a3 = _mm256_fmadd_ps(w, _mm256_loadu_ps(qp + 3 * W), a3);
        }
        float *s0 = st + j * ld;
        KEYMAJOR_STORE(s0, a0, a1);
        KEYMAJOR_STORE(s0 + 2 * W, a2, a3);
    }
}

/* The scores tile from the packed queries: the key-major tile, then 8 x 8 in-register
 * transposes into s[query][key]. */
static void scores_packed_avx2(float *s, size_t ld_s, const float *qt, size_t nq, const float *k,
                               size_t k_stride, size_t nk, size_t d, float scale) {
    const size_t ld = SDPA_ATTN_MAX_BLOCK_Q;
    float st[SDPA_ATTN_MAX_BLOCK_KV * SDPA_ATTN_MAX_BLOCK_Q];
    scores_keymajor_avx2(st, qt, k, k_stride, nk, d, scale);
    for (size_t j0 = 0; j0 < nk; j0 += W) {
        const size_t nj = nk - j0 < W ? nk - j0 : W;
        const __m256i m = tail_mask(nj);
        for (size_t i0 = 0; i0 < nq; i0 += W) {
            __m256 r[8];
            for (size_t t = 0; t < W; t++)
                r[t] = t < nj ? _mm256_loadu_ps(st + (j0 + t) * ld + i0) : _mm256_setzero_ps();
            transpose8_avx2(r);
            for (size_t t = 0; t < W && i0 + t < nq; t++)
                _mm256_maskstore_ps(s + (i0 + t) * ld_s + j0, m, r[t]);
        }
    }
}

/* The online softmax's step for a whole tile (kernels.h, scores_max and exp_pv; the avx512
 * version says why): scores key-major, row maxima, exps and row sums across 8 queries at a time,
 * the P V step reading the weights in that layout and rescaling each accumulator row as it loads
 * it. */
static void scores_max_avx2(float *st, float *tile_max, const float *qt, size_t nq, const float *k,
                            size_t k_stride, size_t nk, size_t d_k, float scale) {
    const size_t ld = SDPA_ATTN_MAX_BLOCK_Q;
    scores_keymajor_avx2(st, qt, k, k_stride, nk, d_k, scale);
    for (size_t g = 0; g * W < nq; g++) {
        __m256 mx0 = _mm256_set1_ps(-INFINITY), mx1 = mx0;
        size_t j = 0;
        for (; j + 2 <= nk; j += 2) {
            mx0 = _mm256_max_ps(_mm256_load_ps(st + j * ld + g * W), mx0);
            mx1 = _mm256_max_ps(_mm256_load_ps(st + (j + 1) * ld + g * W), mx1);
        }
        if (j < nk) mx0 = _mm256_max_ps(_mm256_load_ps(st + j * ld + g * W), mx0);
        _mm256_storeu_ps(tile_max + g * W, _mm256_max_ps(mx0, mx1));
    }
}

#define EXP_PV_AVX2(NAME, EXP)                                                                     \
    static void NAME(float *acc, size_t ld_acc, float *st, const float *m, const float *m_new,     \
                     float *alpha, float *sums, size_t nq, size_t nk, const float *v,              \
                     size_t v_stride, size_t d_v) {                                                \
        const size_t ld = SDPA_ATTN_MAX_BLOCK_Q, groups = (nq + W - 1) / W;                        \
        float old[SDPA_ATTN_MAX_BLOCK_Q], shift[SDPA_ATTN_MAX_BLOCK_Q];                            \
        /* rows past nq (zero queries, scores 0): shift 0, alpha exp(-inf) = 0, both unused */     \
        for (size_t i = 0; i < groups * W; i++) {                                                  \
            old[i] = i < nq ? m[i] : -INFINITY;                                                    \
            shift[i] = i < nq ? m_new[i] : 0.0f;                                                   \
        }                                                                                          \
        const __m256 table = exp_table_avx2();                                                     \
        for (size_t g = 0; g < groups; g++) {                                                      \
            const __m256 mx = _mm256_loadu_ps(shift + g * W);                                      \
            /* exp(0) is exactly 1: a row whose max did not move is not rescaled at all */         \
            _mm256_storeu_ps(alpha + g * W,                                                        \
                             EXP(_mm256_sub_ps(_mm256_loadu_ps(old + g * W), mx), table, 0));      \
            __m256 s0 = _mm256_setzero_ps(), s1 = s0;                                              \
            size_t j = 0;                                                                          \
            for (; j + 2 <= nk; j += 2) {                                                          \
                float *p0 = st + j * ld + g * W, *p1 = p0 + ld;                                    \
                __m256 e0 = EXP(_mm256_sub_ps(_mm256_load_ps(p0), mx), table, 0);                  \
                __m256 e1 = EXP(_mm256_sub_ps(_mm256_load_ps(p1), mx), table, 0);                  \
                _mm256_store_ps(p0, e0), _mm256_store_ps(p1, e1);                                  \
                s0 = _mm256_add_ps(s0, e0), s1 = _mm256_add_ps(s1, e1);                            \
            }                                                                                      \
            if (j < nk) {                                                                          \
                float *p0 = st + j * ld + g * W;                                                   \
                __m256 e0 = EXP(_mm256_sub_ps(_mm256_load_ps(p0), mx), table, 0);                  \
                _mm256_store_ps(p0, e0);                                                           \
                s0 = _mm256_add_ps(s0, e0);                                                        \
            }                                                                                      \
            _mm256_storeu_ps(sums + g * W, _mm256_add_ps(s0, s1));                                 \
        }                                                                                          \
        const pv_operands o = {acc, ld_acc, st, 1, ld, alpha, nq, nk, v, v_stride, d_v};           \
        isa_pv(&o);                                                                                \
    }
EXP_PV_AVX2(exp_pv_fast_avx2, exp_fast_avx2)
EXP_PV_AVX2(exp_pv_sleef_avx2, exp_sleef_avx2)

const sdpa_attention_kernels sdpa_attention_kernels_avx2 = {
    .block_q = 32,
    .block_kv = 64,
    .scores_tile = scores_tile_avx2,
    .pv_tile = pv_tile_avx2,
    .pack_q = pack_q_avx2,
    .scores_packed = scores_packed_avx2,
    .scores_max = scores_max_avx2,
    .exp_pv = {exp_pv_fast_avx2, exp_pv_sleef_avx2},
};
