/* The backward's element-wise steps on a key-major tile, written once over a backend's vector
 * operations: kernels.h's exp_keymajor (P^T = exp(S^T - lse)) and ds_keymajor (dS^T = scale P^T
 * o (dP^T - D)). exp_keymajor's exps are exp_tile's (isa_exps, isa_exp_table;
 * arch/attention_packed.h declares them) where ISA_EXP_TILE is defined before this header is
 * included, else the row exps (row_exps, row_exp_shift and row_exp_folds, as arch/row_kernels.h
 * takes them): avx512 defines it later, so its exp_keymajor takes the row exps. Apart from the
 * packed path, so that a backend without it (neon) has them too. */
#ifndef SDPA_ARCH_ATTENTION_KEYMAJOR_STEPS_H
#define SDPA_ARCH_ATTENTION_KEYMAJOR_STEPS_H

#include "attention_vectors.h"

/* The exps of exp_keymajor_loops: exp_tile's (isa_exps) where ISA_EXP_TILE is defined here, else
 * exp_sum's at a zero shift (row_exps, the shift folded or subtracted as exp_sum_of does), the
 * exps the forward's tiles take on the backend. kind is a constant at every call. */
typedef struct keymajor_exps {
#ifdef ISA_EXP_TILE
    vf table;
#endif
    row_exp c;
    int kind, folded;
} keymajor_exps;

ALWAYS_INLINE keymajor_exps keymajor_exps_of(int kind) {
    keymajor_exps e;
#ifdef ISA_EXP_TILE
    e.table = isa_exp_table();
#endif
    e.kind = kind;
    e.folded = row_exp_folds(kind);
    e.c = row_exp_shift(0.0f, e.folded);
    return e;
}

ALWAYS_INLINE void keymajor_exps_run(vf *z, int n, const keymajor_exps *e) {
#ifdef ISA_EXP_TILE
    isa_exps(z, n, e->table, e->kind);
#else
    if (!e->folded)
        for (int u = 0; u < n; u++) z[u] = z[u] - e->c.shift;
    row_exps(z, n, &e->c, e->kind);
#endif
}

/* count (1..4) whole vectors of a key's row of a key-major tile, exp(row - shift) in place,
 * their exps side by side (the chains overlap; with no sums, nothing joins them) */
ALWAYS_INLINE void exp_keymajor_vectors(float *row, const float *shift, int count,
                                        const keymajor_exps *e) {
    vf z[4];
    for (int x = 0; x < count; x++) z[x] = vf_load(row + x * W) - vf_load(shift + x * W);
    keymajor_exps_run(z, count, e);
    for (int x = 0; x < count; x++) vf_store(row + x * W, z[x]);
}

/* kernels.h's exp_keymajor: st[j][i] = exp(st[j][i] - shift[i]), a key's row at a time, four
 * vectors a step, then two, then one (the last one partial where nq is not whole vectors). */
ALWAYS_INLINE void exp_keymajor_loops(float *st, size_t ld_st, size_t nk, size_t nq,
                                      const float *shift, int kind) {
    const keymajor_exps e = keymajor_exps_of(kind);
    for (size_t j = 0; j < nk; j++) {
        float *row = st + j * ld_st;
        size_t i = 0;
        for (; i + 4 * W <= nq; i += 4 * W) exp_keymajor_vectors(row + i, shift + i, 4, &e);
        if (i + 2 * W <= nq) {
            exp_keymajor_vectors(row + i, shift + i, 2, &e);
            i += 2 * W;
        }
        for (; i < nq; i += W) {
            const size_t n = nq - i < W ? nq - i : W;
            const vpart m = vpart_first(n);
            vf z = vf_load_upto(row + i, n, m) - vf_load_upto(shift + i, n, m);
            keymajor_exps_run(&z, 1, &e);
            vf_store_upto(row + i, z, n, m);
        }
    }
}

/* a vector of a key-major tile's row at p: whole where n == W, so that a masked ISA masks only
 * the tails */
ALWAYS_INLINE vf keymajor_load(const float *p, size_t n, vpart m) {
    return n < W ? vf_load_upto(p, n, m) : vf_load(p);
}

/* one vector of ds_keymajor: x = scale * (p * (x - d)), the lanes of n */
ALWAYS_INLINE void ds_vector(float *x, const float *p, vf d, vf vscale, size_t n, vpart m) {
    const vf g = vscale * (keymajor_load(p, n, m) * (keymajor_load(x, n, m) - d));
    if (n < W)
        vf_store_upto(x, g, n, m);
    else
        vf_store(x, g);
}

/* kernels.h's ds_keymajor: ds = scale * (p * (ds - dd)), down each vector of queries' keys
 * with its dd in a register; or, where the backend defines DS_BY_KEYS (scalar, whose one-lane
 * vector down the keys would walk a column), along each key's row, a loop its compiler
 * vectorises */
ALWAYS_INLINE void ds_keymajor_loops(float *ds, const float *p, size_t ld, size_t nk, size_t nq,
                                     const float *dd, float scale) {
    const vf vscale = vf_set1(scale);
#ifdef DS_BY_KEYS
    for (size_t j = 0; j < nk; j++)
        for (size_t i = 0; i < nq; i += W) {
            const size_t n = nq - i < W ? nq - i : W;
            const vpart m = vpart_first(n);
            ds_vector(ds + j * ld + i, p + j * ld + i, keymajor_load(dd + i, n, m), vscale, n, m);
        }
#else
    for (size_t i = 0; i < nq; i += W) {
        const size_t n = nq - i < W ? nq - i : W;
        const vpart m = vpart_first(n);
        const vf d = keymajor_load(dd + i, n, m);
        for (size_t j = 0; j < nk; j++) ds_vector(ds + j * ld + i, p + j * ld + i, d, vscale, n, m);
    }
#endif
}

#endif
