/* What every key-major score kernel does after its GEMM (kernels.h: scores_packed, scores_max,
 * and the bf16 dot's pair): the scores are left key-major, st[j * ld_st + i], and from there go
 * to each query's max or to rows s[i][j]; and the W x W transpose that both those rows and
 * pack_q's tile are made of. Written once over a backend's vector operations; it asks nothing
 * else of the backend, so that a file compiled with flags of its own (arch/x86/avx512_bf16.c)
 * shares it with arch/attention_packed.h. */
#ifndef SDPA_ARCH_ATTENTION_KEYMAJOR_H
#define SDPA_ARCH_ATTENTION_KEYMAJOR_H

#include "attention_vectors.h"

/* the leading dimension of a key-major tile a kernel keeps on its own stack (scores_packed's) */
#define QT_LD SDPA_ATTN_MAX_BLOCK_Q

/* st's vector at s, first scaled in place where scale is not NULL */
ALWAYS_INLINE vf keymajor_scaled(float *s, const vf *scale) {
    vf x = vf_load_aligned(s);
    if (scale) {
        x = x * *scale;
        vf_store_aligned(s, x);
    }
    return x;
}

/* For the vectors of queries that hold nq and the keys j < nk: with scale, st[j * ld_st + i] *=
 * *scale; with tile_max, tile_max[i] = max_j st[j * ld_st + i] (after the scaling), in the same
 * pass; two keys a step for two chains */
ALWAYS_INLINE void keymajor_scale_max(float *tile_max, float *st, size_t ld_st, size_t nq,
                                      size_t nk, const vf *scale) {
    const vf ninf = vf_set1(-INFINITY);
    for (size_t h = 0; h * W < nq; h++) {
        vf mx0 = ninf, mx1 = ninf;
        size_t j = 0;
        for (; j + 2 <= nk; j += 2) {
            mx0 = vf_max(keymajor_scaled(st + j * ld_st + h * W, scale), mx0);
            mx1 = vf_max(keymajor_scaled(st + (j + 1) * ld_st + h * W, scale), mx1);
        }
        if (j < nk) mx0 = vf_max(keymajor_scaled(st + j * ld_st + h * W, scale), mx0);
        if (tile_max) vf_store(tile_max + h * W, vf_max(mx0, mx1));
    }
}

/* tile_max[i] = max_j st[j * ld_st + i] for j < nk, for the vectors of queries that hold nq */
ALWAYS_INLINE void keymajor_max(float *tile_max, const float *st, size_t ld_st, size_t nq,
                                size_t nk) {
    keymajor_scale_max(tile_max, (float *)st, ld_st, nq, nk, NULL);
}

/* One W x W block through the register transpose: dst[c * ld_dst + r] = src[r * ld_src + c] for
 * the first rows rows of src (zeros in place of the rest) and their first cols columns, of which
 * the first out_rows rows of dst take their first out_cols columns. Whole vectors where a row is
 * whole, so that a masked ISA masks only the tails. */
ALWAYS_INLINE void transpose_block(float *dst, size_t ld_dst, size_t out_rows, size_t out_cols,
                                   const float *src, size_t ld_src, size_t rows, size_t cols) {
    const vpart in = vpart_first(cols), out = vpart_first(out_cols);
    vf r[W];
    for (size_t t = 0; t < W; t++)
        r[t] = t >= rows  ? vf_zero()
               : cols < W ? vf_load_upto(src + t * ld_src, cols, in)
                          : vf_load(src + t * ld_src);
    vf_transpose(r);
    for (size_t t = 0; t < out_rows; t++)
        if (out_cols < W)
            vf_store_upto(dst + t * ld_dst, r[t], out_cols, out);
        else
            vf_store(dst + t * ld_dst, r[t]);
}

/* s[i * ld_s + j] = st[j * ld_st + i] for i < nq, j < nk (st's rows whole vectors up to nq) */
ALWAYS_INLINE void keymajor_to_rows(float *s, size_t ld_s, const float *st, size_t ld_st, size_t nq,
                                    size_t nk) {
    for (size_t j0 = 0; j0 < nk; j0 += W) {
        const size_t nj = nk - j0 < W ? nk - j0 : W;
        for (size_t i0 = 0; i0 < nq; i0 += W)
            transpose_block(s + i0 * ld_s + j0, ld_s, nq - i0 < W ? nq - i0 : W, nj,
                            st + j0 * ld_st + i0, ld_st, nj, W);
    }
}

#endif
