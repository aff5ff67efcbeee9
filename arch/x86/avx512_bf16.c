/* The avx512 backend's AVX512_BF16 add-on (kernels.h: sdpa_bf16_dot_kernels): Q.K from bf16 Q and
 * K with vdpbf16ps, two exact products and their sum into each of 16 float lanes an instruction,
 * straight from the bf16 rows of K. Compiled alone with -mavx512bf16 (meson.build: the avx512
 * record's add-on), which also lets the compiler use AVX512BW: nothing here may run before
 * src/dispatch.c has found both on the CPU. The tiles' max and transposes are the float path's
 * (arch/attention_keymajor.h); what is this ISA's own is the pair packing (in
 * arch/x86/avx512_bf16_pairs.h, which the AMX add-on shares) and the GEMM step. */
#include "avx512_bf16_pairs.h"

#if !defined(__AVX512BF16__)
#error "arch/x86/avx512_bf16.c needs -mavx512bf16"
#endif

/* k's pair at p as a word in every lane; last: an odd d's last pair, whose second element lies
 * past the row and reads as 0 */
ALWAYS_INLINE __m512bh k_pair(const uint16_t *p, int last) {
    uint32_t word = *(const u16_any *)p; /* k rows need no alignment at all */
    if (!last) memcpy(&word, p, sizeof word);
    return (__m512bh)_mm512_set1_epi32((int)word);
}

/* one pair step of an nkeys x nv block: acc[c * nv + t] += q pairs of vector t . k_c's pair */
ALWAYS_INLINE void pairs_step(vf *acc, const uint32_t *qt_row, const uint16_t *k, size_t k_stride,
                              int nkeys, int nv, int last) {
    __m512bh qv[2];
    for (int t = 0; t < nv; t++) qv[t] = (__m512bh)_mm512_loadu_si512(qt_row + t * W);
    for (int c = 0; c < nkeys; c++) {
        const __m512bh kc = k_pair(k + c * k_stride, last);
        for (int t = 0; t < nv; t++) acc[c * nv + t] = _mm512_dpbf16_ps(acc[c * nv + t], kc, qv[t]);
    }
}

/* st[j * ld_st + i] = scale * dot(q_i, k_j) for the keys j0..j0 + nkeys and nv vectors of
 * queries, every dot in registers for all of d (nkeys * nv accumulators, independent chains) */
ALWAYS_INLINE void pairs_block(float *st, size_t ld_st, const uint32_t *qt, size_t ld_qt,
                               const uint16_t *k, size_t k_stride, size_t d, vf vscale, int nkeys,
                               int nv) {
    vf acc[16];
    for (int x = 0; x < nkeys * nv; x++) acc[x] = vf_zero();
    const size_t whole = d / 2;
    for (size_t p = 0; p < whole; p++)
        pairs_step(acc, qt + p * ld_qt, k + 2 * p, k_stride, nkeys, nv, 0);
    if (d % 2) pairs_step(acc, qt + whole * ld_qt, k + 2 * whole, k_stride, nkeys, nv, 1);
    for (int c = 0; c < nkeys; c++)
        for (int t = 0; t < nv; t++)
            vf_store_aligned(st + c * ld_st + t * W, acc[c * nv + t] * vscale);
}

/* The key-major tile for the queries that hold nq (one vector of them or two): 8 keys a block,
 * 2 loads of qt and 8 broadcasts of k for 16 vdpbf16ps a step, then the keys left over one at a
 * time. */
ALWAYS_INLINE void pairs_keymajor_nv(float *st, size_t ld_st, const uint32_t *qt, size_t ld_qt,
                                     const uint16_t *k, size_t k_stride, size_t nk, size_t d,
                                     float scale, int nv) {
    const vf vscale = vf_set1(scale);
    size_t j = 0;
    for (; j + 8 <= nk; j += 8)
        pairs_block(st + j * ld_st, ld_st, qt, ld_qt, k + j * k_stride, k_stride, d, vscale, 8, nv);
    for (; j < nk; j++)
        pairs_block(st + j * ld_st, ld_st, qt, ld_qt, k + j * k_stride, k_stride, d, vscale, 1, nv);
}

static void pairs_keymajor(float *st, size_t ld_st, const uint32_t *qt, size_t ld_qt,
                           const uint16_t *k, size_t k_stride, size_t nk, size_t d, size_t nq,
                           float scale) {
    if (nq > W)
        pairs_keymajor_nv(st, ld_st, qt, ld_qt, k, k_stride, nk, d, scale, 2);
    else
        pairs_keymajor_nv(st, ld_st, qt, ld_qt, k, k_stride, nk, d, scale, 1);
}

static void scores_packed_avx512_bf16(float *s, size_t ld_s, const uint32_t *qt, size_t ld_qt,
                                      size_t nq, const uint16_t *k, size_t k_stride, size_t nk,
                                      size_t d, float scale) {
    _Alignas(64) float st[SDPA_ATTN_MAX_BLOCK_KV * QT_LD];
    pairs_keymajor(st, QT_LD, qt, ld_qt, k, k_stride, nk, d, nq, scale);
    keymajor_to_rows(s, ld_s, st, QT_LD, nq, nk);
}

static void scores_max_avx512_bf16(float *st, size_t ld_st, float *tile_max, const uint32_t *qt,
                                   size_t ld_qt, size_t nq, const uint16_t *k, size_t k_stride,
                                   size_t nk, size_t d_k, float scale) {
    pairs_keymajor(st, ld_st, qt, ld_qt, k, k_stride, nk, d_k, nq, scale);
    keymajor_max(tile_max, st, ld_st, nq, nk);
}

const sdpa_bf16_dot_kernels sdpa_bf16_dot_avx512 = {
    .pack_q = pack_q_avx512_bf16,
    .scores_packed = scores_packed_avx512_bf16,
    .scores_max = scores_max_avx512_bf16,
};
