/* The packed attention microkernels (kernels.h: pack_q, scores_packed, scores_max, exp_pv,
 * exp_tile, and the backward's scores_keymajor; exp_keymajor is arch/attention_keymajor_steps.h's,
 * which a backend without the packed path includes alone), written once over a backend's
 * vector operations as arch/attention_tiles.h is, for a block of queries transposed once (qt[p][i],
 * SDPA_ATTN_MAX_BLOCK_Q queries a row) and scores kept key-major (st[j][i]), as a GEMM with
 * broadcasts of k leaves them. In that layout a row's max, its exps and its sum are vector
 * operations across W queries at a time, with no transposes, no horizontal sums and no call per
 * row. What a backend supplies for them is declared below, as in attention_tiles.h. */
#ifndef SDPA_ARCH_ATTENTION_PACKED_H
#define SDPA_ARCH_ATTENTION_PACKED_H

#include "attention_keymajor.h"
#include "attention_tiles.h"

/* ---- the backend's part (defined in <isa>_attention.c) ---- */

/* kernels.h's scores_keymajor: st[j * ld_st + i] = scale * sum_p k[j * k_stride + p]
 * qt[p * ld_qt + i] for j < nk and i < SDPA_ATTN_MAX_BLOCK_Q, or only the first queries that hold
 * nq (rounded up to a block); the entry itself, which scores_packed and scores_max call too */
static void ISA_NAME(scores_keymajor)(float *st, size_t ld_st, const float *qt, size_t ld_qt,
                                      size_t nq, const float *k, size_t k_stride, size_t nk,
                                      size_t d, float scale);
/* the constants of the exps (the fast exp's table), loaded once a call */
ALWAYS_INLINE vf isa_exp_table(void);
/* x[u] = exp(x[u]) for u < n (the exps side by side, as far as that helps), the exp of kind
 * (enum sdpa_exp_kind), for arguments <= 0: no upper clamp, and results below FLT_MIN may stay
 * below it (kernels.h, exp_tile) */
ALWAYS_INLINE void isa_exps(vf *x, int n, vf table, int kind);

/* exp_keymajor, whose exps are those above where the backend has exp_tile */
#include "attention_keymajor_steps.h"

/* vf_load_upto with fill in the lanes past n */
ALWAYS_INLINE vf vf_load_upto_or(const float *p, size_t n, vpart m, float fill) {
    return VF_MASKED || n < W ? vf_load_part_or(p, m, fill) : vf_load(p);
}

/* kernels.h's pack_q: qt[p * ld_qt + i] = q[i][p], padded with zero queries up to
 * SDPA_ATTN_MAX_BLOCK_Q, W x W blocks (partial loads for the d tail). */
ALWAYS_INLINE void pack_q_loops(float *qt, size_t ld_qt, const float *q, size_t q_stride, size_t nq,
                                size_t d) {
    for (size_t p0 = 0; p0 < d; p0 += W) {
        const size_t np = d - p0 < W ? d - p0 : W;
        for (size_t i0 = 0; i0 < SDPA_ATTN_MAX_BLOCK_Q; i0 += W) {
            const size_t rows = nq <= i0 ? 0 : nq - i0 < W ? nq - i0 : W;
            transpose_block(qt + p0 * ld_qt + i0, ld_qt, np, W, q + i0 * q_stride + p0, q_stride,
                            rows, np);
        }
    }
}

/* Key-major scores in blocks of nkeys keys x nv vectors of queries (the block repeated across
 * all SDPA_ATTN_MAX_BLOCK_Q queries), keys j.. while whole blocks are left; returns the first
 * key not done. */
ALWAYS_INLINE size_t keymajor_blocks(float *st, size_t ld_st, const float *qt, size_t ld_qt,
                                     const float *k, size_t k_stride, size_t j, size_t nk, size_t d,
                                     vf vscale, int nkeys, int nv) {
    for (; j + nkeys <= nk; j += nkeys)
        for (size_t h = 0; h < SDPA_ATTN_MAX_BLOCK_Q; h += nv * W)
            bcast_block(st + j * ld_st + h, ld_st, k + j * k_stride, k_stride, 1, qt + h, ld_qt,
                        SDPA_TYPE_F32, 0, NULL, d, nkeys, nv, 1, NULL, &vscale, NULL);
    return j;
}

/* kernels.h's scores_packed: the key-major tile, on the stack, then into rows s[query][key]. */
ALWAYS_INLINE void scores_packed_loops(float *s, size_t ld_s, const float *qt, size_t ld_qt,
                                       size_t nq, const float *k, size_t k_stride, size_t nk,
                                       size_t d, float scale) {
    _Alignas(64) float st[SDPA_ATTN_MAX_BLOCK_KV * QT_LD];
    ISA_NAME(scores_keymajor)(st, QT_LD, qt, ld_qt, nq, k, k_stride, nk, d, scale);
    keymajor_to_rows(s, ld_s, st, QT_LD, nq, nk);
}

/* kernels.h's scores_max: the key-major tile and each query's max over its keys. */
ALWAYS_INLINE void scores_max_loops(float *st, size_t ld_st, float *tile_max, const float *qt,
                                    size_t ld_qt, size_t nq, const float *k, size_t k_stride,
                                    size_t nk, size_t d_k, float scale) {
    ISA_NAME(scores_keymajor)(st, ld_st, qt, ld_qt, nq, k, k_stride, nk, d_k, scale);
    keymajor_max(tile_max, st, ld_st, nq, nk);
}

/* one key's W weights of a key-major tile, p = exp(s - mx) in place; returns them */
ALWAYS_INLINE vf exp_in_place(float *p, vf mx, vf table, int kind) {
    vf e = vf_load_aligned(p) - mx;
    isa_exps(&e, 1, table, kind);
    vf_store_aligned(p, e);
    return e;
}

/* kernels.h's exp_pv: per W queries, alpha = exp(m - m_new), the weights exp(s - m_new) in place
 * with their sums (u keys a step, 2 or 4, their exps side by side, added into two chains), then
 * the P V step from the key-major weights, rescaling each accumulator row as it loads it. */
ALWAYS_INLINE void exp_pv_loops(float *acc, size_t ld_acc, float *st, size_t ld_st, const float *m,
                                const float *m_new, float *alpha, float *sums, size_t nq, size_t nk,
                                const float *v, size_t v_stride, size_t d_v, int kind, int u) {
    const vf table = isa_exp_table();
    for (size_t h = 0; h * W < nq; h++) {
        const size_t n = nq - h * W < W ? nq - h * W : W;
        const vpart valid = vpart_first(n);
        /* rows past nq (zero queries, scores 0): shift 0, alpha exp(-inf) = 0, both unused */
        const vf mx = vf_load_upto_or(m_new + h * W, n, valid, 0.0f);
        vf a = vf_load_upto_or(m + h * W, n, valid, -INFINITY) - mx;
        /* exp(0) is exactly 1: a row whose max did not move is not rescaled at all */
        isa_exps(&a, 1, table, kind);
        vf_store(alpha + h * W, a);
        vf s0 = vf_zero(), s1 = s0;
        size_t j = 0;
        for (; j + u <= nk; j += u) {
            float *p = st + j * ld_st + h * W;
            vf e[4];
            for (int x = 0; x < u; x++) e[x] = vf_load_aligned(p + x * ld_st) - mx;
            isa_exps(e, u, table, kind);
            for (int x = 0; x < u; x++) vf_store_aligned(p + x * ld_st, e[x]);
            if (u == 4) {
                s0 = s0 + (e[0] + e[2]);
                s1 = s1 + (e[1] + e[3]);
            } else {
                s0 = s0 + e[0];
                s1 = s1 + e[1];
            }
        }
        if (u == 2) {
            if (j < nk) s0 = s0 + exp_in_place(st + j * ld_st + h * W, mx, table, kind);
        } else {
            for (; j < nk; j++) s0 = s0 + exp_in_place(st + j * ld_st + h * W, mx, table, kind);
        }
        vf_store(sums + h * W, s0 + s1);
    }
    const pv_operands o = {acc, ld_acc, st, 1, ld_st, alpha, nq, nk, v, v_stride, d_v, NULL};
    isa_pv(&o, SDPA_TYPE_F32);
}

/* kernels.h's exp_tile: s = exp(s - shift) row by row, with the row sums, four vectors a step
 * so that the exps' dependency chains overlap. */
ALWAYS_INLINE void exp_tile_loops(float *s, size_t ld_s, size_t nq, size_t nk, const float *shift,
                                  float *sums, int kind) {
    const vf table = isa_exp_table();
    for (size_t i = 0; i < nq; i++) {
        float *row = s + i * ld_s;
        const vf vshift = vf_set1(shift[i]);
        vf t[4], e[4];
        for (int x = 0; x < 4; x++) t[x] = vf_zero();
        size_t j = 0;
        for (; j + 4 * W <= nk; j += 4 * W) {
            for (int x = 0; x < 4; x++) e[x] = vf_load(row + j + x * W) - vshift;
            isa_exps(e, 4, table, kind);
            for (int x = 0; x < 4; x++) vf_store(row + j + x * W, e[x]);
            for (int x = 0; x < 4; x++) t[x] = t[x] + e[x];
        }
        for (; j < nk; j += W) {
            const size_t n = nk - j < W ? nk - j : W;
            const vpart m = vpart_first(n);
            e[0] = vf_load_upto(row + j, n, m) - vshift;
            isa_exps(e, 1, table, kind);
            vf_store_upto(row + j, e[0], n, m);
            if (VF_MASKED || n < W)
                t[0] = vf_add_part(t[0], m, e[0]);
            else
                t[0] = t[0] + e[0];
        }
        const vf late = t[2] + t[3]; /* first: the registers of the measured code */
        sums[i] = vf_hsum((t[0] + t[1]) + late);
    }
}

#endif
