/* What every key-major score kernel does after its GEMM (kernels.h: scores_packed, scores_max,
 * and the bf16 dot's pair): the scores are left key-major, st[j][i] (SDPA_ATTN_MAX_BLOCK_Q
 * queries a row), and from there go to each query's max or to rows s[i][j]. Written once over a
 * backend's vector operations; it asks nothing else of the backend, so that a file compiled with
 * flags of its own (arch/x86/avx512_bf16.c) shares it with arch/attention_packed.h. */
#ifndef SDPA_ARCH_ATTENTION_KEYMAJOR_H
#define SDPA_ARCH_ATTENTION_KEYMAJOR_H

#include "attention_vectors.h"

#define QT_LD SDPA_ATTN_MAX_BLOCK_Q /* floats from one row of qt or st to the next */

/* st's vector at s, first scaled in place where scale is not NULL */
ALWAYS_INLINE vf keymajor_scaled(float *s, const vf *scale) {
    vf x = vf_load_aligned(s);
    if (scale) {
        x = x * *scale;
        vf_store_aligned(s, x);
    }
    return x;
}

/* For the vectors of queries that hold nq and the keys j < nk: with scale, st[j][i] *= *scale;
 * with tile_max, tile_max[i] = max_j st[j][i] (after the scaling), in the same pass; two keys a
 * step for two chains */
ALWAYS_INLINE void keymajor_scale_max(float *tile_max, float *st, size_t nq, size_t nk,
                                      const vf *scale) {
    const vf ninf = vf_set1(-INFINITY);
    for (size_t h = 0; h * W < nq; h++) {
        vf mx0 = ninf, mx1 = ninf;
        size_t j = 0;
        for (; j + 2 <= nk; j += 2) {
            mx0 = vf_max(keymajor_scaled(st + j * QT_LD + h * W, scale), mx0);
            mx1 = vf_max(keymajor_scaled(st + (j + 1) * QT_LD + h * W, scale), mx1);
        }
        if (j < nk) mx0 = vf_max(keymajor_scaled(st + j * QT_LD + h * W, scale), mx0);
        if (tile_max) vf_store(tile_max + h * W, vf_max(mx0, mx1));
    }
}

/* tile_max[i] = max_j st[j][i] for j < nk, for the vectors of queries that hold nq */
ALWAYS_INLINE void keymajor_max(float *tile_max, const float *st, size_t nq, size_t nk) {
    keymajor_scale_max(tile_max, (float *)st, nq, nk, NULL);
}

/* s[i * ld_s + j] = st[j][i] for i < nq, j < nk: W x W register transposes */
ALWAYS_INLINE void keymajor_to_rows(float *s, size_t ld_s, const float *st, size_t nq, size_t nk) {
    for (size_t j0 = 0; j0 < nk; j0 += W) {
        const size_t nj = nk - j0 < W ? nk - j0 : W;
        const vpart m = vpart_first(nj);
        for (size_t i0 = 0; i0 < nq; i0 += W) {
            vf r[W];
            for (size_t t = 0; t < W; t++)
                r[t] = t < nj ? vf_load_aligned(st + (j0 + t) * QT_LD + i0) : vf_zero();
            vf_transpose(r);
            for (size_t t = 0; t < W && i0 + t < nq; t++)
                vf_store_upto(s + (i0 + t) * ld_s + j0, r[t], nj, m);
        }
    }
}

#endif
