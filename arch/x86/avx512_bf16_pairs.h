/* The vdpbf16ps pieces of the avx512 backend's bf16 dot (kernels.h: sdpa_bf16_dot_kernels), for
 * the files compiled with -mavx512bf16 that build a bf16 dot table: arch/x86/avx512_bf16.c, and
 * arch/x86/avx512_amx.c, whose tiles take qt in this pack_q's layout and which falls back to
 * these pairs where a tile would read past a row. */
#ifndef SDPA_ARCH_X86_AVX512_BF16_PAIRS_H
#define SDPA_ARCH_X86_AVX512_BF16_PAIRS_H

#include <string.h>

#include "avx512.h"

#include "attention_keymajor.h"

#if !defined(__AVX512BF16__) || !defined(__AVX512BW__)
#error "arch/x86/avx512_bf16_pairs.h needs -mavx512bf16 (which brings -mavx512bw)"
#endif

/* kernels.h's pack_q of the bf16 dot: W x W blocks of 32-bit pairs through the register
 * transpose. A row's pairs load as W x 2 bf16 elements under a 16-bit mask, which stops at its
 * d-th element, so an odd d's last pair gets a zero second element and nothing past the row is
 * read (a masked-off element never faults). */
static void pack_q_avx512_bf16(uint32_t *qt, const uint16_t *q, size_t q_stride, size_t nq,
                               size_t d) {
    for (size_t p0 = 0; p0 < d; p0 += 2 * W) {
        const size_t ne = d - p0 < 2 * W ? d - p0 : 2 * W, np = (ne + 1) / 2;
        const __mmask32 m = (__mmask32)((1ull << ne) - 1);
        for (size_t i0 = 0; i0 < QT_LD; i0 += W) {
            fv r[W];
            for (size_t t = 0; t < W; t++)
                r[t] = i0 + t < nq ? _mm512_castsi512_ps(
                                         _mm512_maskz_loadu_epi16(m, q + (i0 + t) * q_stride + p0))
                                   : fv_zero();
            fv_transpose(r);
            for (size_t t = 0; t < np; t++)
                fv_store((float *)(qt + (p0 / 2 + t) * QT_LD + i0), r[t]);
        }
    }
}

/* k's pair at p as a word in every lane; last: an odd d's last pair, whose second element lies
 * past the row and reads as 0 */
ALWAYS_INLINE __m512bh k_pair(const uint16_t *p, int last) {
    uint32_t word = p[0];
    if (!last) memcpy(&word, p, sizeof word); /* k rows need not be 4-byte aligned */
    return (__m512bh)_mm512_set1_epi32((int)word);
}

/* one pair step of an nkeys x nv block: acc[c * nv + t] += q pairs of vector t . k_c's pair */
ALWAYS_INLINE void pairs_step(fv *acc, const uint32_t *qt_row, const uint16_t *k, size_t k_stride,
                              int nkeys, int nv, int last) {
    __m512bh qv[2];
    for (int t = 0; t < nv; t++) qv[t] = (__m512bh)_mm512_loadu_si512(qt_row + t * W);
    for (int c = 0; c < nkeys; c++) {
        const __m512bh kc = k_pair(k + c * k_stride, last);
        for (int t = 0; t < nv; t++) acc[c * nv + t] = _mm512_dpbf16_ps(acc[c * nv + t], kc, qv[t]);
    }
}

/* st[j][i] = scale * dot(q_i, k_j) for the keys j0..j0 + nkeys and nv vectors of queries, every
 * dot in registers for all of d (nkeys * nv accumulators, independent chains) */
ALWAYS_INLINE void pairs_block(float *st, const uint32_t *qt, const uint16_t *k, size_t k_stride,
                               size_t d, fv vscale, int nkeys, int nv) {
    fv acc[16];
    for (int x = 0; x < nkeys * nv; x++) acc[x] = fv_zero();
    const size_t whole = d / 2;
    for (size_t p = 0; p < whole; p++)
        pairs_step(acc, qt + p * QT_LD, k + 2 * p, k_stride, nkeys, nv, 0);
    if (d % 2) pairs_step(acc, qt + whole * QT_LD, k + 2 * whole, k_stride, nkeys, nv, 1);
    for (int c = 0; c < nkeys; c++)
        for (int t = 0; t < nv; t++)
            fv_store_aligned(st + c * QT_LD + t * W, fv_mul(acc[c * nv + t], vscale));
}

/* The key-major tile for the queries that hold nq (one vector of them or two): 8 keys a block,
 * 2 loads of qt and 8 broadcasts of k for 16 vdpbf16ps a step, then the keys left over one at a
 * time. */
ALWAYS_INLINE void pairs_keymajor_nv(float *st, const uint32_t *qt, const uint16_t *k,
                                     size_t k_stride, size_t nk, size_t d, float scale, int nv) {
    const fv vscale = fv_set1(scale);
    size_t j = 0;
    for (; j + 8 <= nk; j += 8)
        pairs_block(st + j * QT_LD, qt, k + j * k_stride, k_stride, d, vscale, 8, nv);
    for (; j < nk; j++)
        pairs_block(st + j * QT_LD, qt, k + j * k_stride, k_stride, d, vscale, 1, nv);
}

static void pairs_keymajor(float *st, const uint32_t *qt, const uint16_t *k, size_t k_stride,
                           size_t nk, size_t d, size_t nq, float scale) {
    if (nq > W)
        pairs_keymajor_nv(st, qt, k, k_stride, nk, d, scale, 2);
    else
        pairs_keymajor_nv(st, qt, k, k_stride, nk, d, scale, 1);
}

#endif
