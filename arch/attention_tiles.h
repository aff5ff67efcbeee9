/* The attention microkernels' algorithms, written once over a backend's vector operations (the
 * block "vector operations for the attention templates" of arch/x86/<isa>.h and arch/arm/neon.h)
 * and compiled into each <isa>_attention.c with its vector width W a constant: the register blocks
 * of scores_tile and the loops around them (BLIS's microkernel and its loops). Every function is
 * inlined, and its int parameters (block shapes, keys a step) are constants at every call, so that
 * each call compiles to straight-line code for its shape. What a backend supplies besides its
 * vector operations is declared below ("the backend's part"); arch/attention_entries.h turns it
 * all into the backend's entries. */
#ifndef SDPA_ARCH_ATTENTION_TILES_H
#define SDPA_ARCH_ATTENTION_TILES_H

/* ---- the backend's part (defined in <isa>_attention.c) ---- */

/* the dot of the scores' leftover keys */
ALWAYS_INLINE float isa_dot(const float *a, const float *b, size_t n);
/* s[c] = scale * dot(q, k + c * k_stride, d) for c < SCORES_ROW_NR, vscale = scale in every
 * lane: the backend's own where it defines ISA_SCORES_ROW, else attention_entries.h's */
ALWAYS_INLINE void isa_scores_row(float *s, const float *q, const float *k, size_t k_stride,
                                  size_t d, fv vscale);

/* ---- partial vectors of up to W lanes ---- */

/* A vector whose first n (1..W) lanes are real, m = fv_first(n) (computed once by the caller):
 * a masked ISA's partial operations take all W lanes as well, the others' need a full vector
 * told apart. */
ALWAYS_INLINE fv fv_load_upto(const float *p, size_t n, fv_lanes m) {
    return FV_MASKED || n < W ? fv_load_part(p, m) : fv_load(p);
}
ALWAYS_INLINE void fv_store_upto(float *p, fv x, size_t n, fv_lanes m) {
    if (FV_MASKED || n < W)
        fv_store_part(p, x, m);
    else
        fv_store(p, x);
}
/* a full vector (m NULL) or the lanes m of one */
ALWAYS_INLINE fv tile_load(const float *p, const fv_lanes *m) {
    return m ? fv_load_part(p, *m) : fv_load(p);
}
ALWAYS_INLINE void tile_store(float *p, fv x, const fv_lanes *m) {
    if (m)
        fv_store_part(p, x, *m);
    else
        fv_store(p, x);
}

/* ---- scores: s = scale * q k^T, a register block of dots along d ---- */

#define SCORES_MAX_SUMS 16 /* mr * nr, the dots a block keeps in registers */

/* One step along d of an mr x nr block of dots, a[r * nr + c] += q_r k_c over W (or the lanes
 * m) of d. keywise: each key's vector is loaded and used against every query before the next is
 * loaded, for few registers (16-register ISAs; and a single query, whose keys are then read
 * straight into their FMAs); else every vector is loaded first and kept in a register. */
ALWAYS_INLINE void scores_step(fv *a, const float *q, size_t q_stride, const float *k,
                               size_t k_stride, int mr, int nr, int keywise, const fv_lanes *m) {
    fv vq[SCORES_MAX_SUMS], vk[SCORES_MAX_SUMS];
    for (int r = 0; r < mr; r++) vq[r] = tile_load(q + r * q_stride, m);
    if (keywise) {
        for (int c = 0; c < nr; c++) {
            const fv kc = tile_load(k + c * k_stride, m);
            for (int r = 0; r < mr; r++) a[r * nr + c] = fv_madd(vq[r], kc, a[r * nr + c]);
        }
        return;
    }
    for (int c = 0; c < nr; c++) vk[c] = tile_load(k + c * k_stride, m);
    for (int r = 0; r < mr; r++) fv_pin(&vq[r]);
    for (int c = 0; c < nr; c++) fv_pin(&vk[c]);
    for (int r = 0; r < mr; r++)
        for (int c = 0; c < nr; c++) a[r * nr + c] = fv_madd(vq[r], vk[c], a[r * nr + c]);
}

/* s[r * ld_s + c] = scale * dot(q_r, k_c) for r < mr queries and c < nr keys: mr * nr dots in
 * registers for all of d, then reduced W at a time (fv_hsums), which takes mr * nr a multiple
 * of W, and nr a multiple of W or 4 (a reduced vector then spans W / 4 rows). */
ALWAYS_INLINE void scores_block(float *s, size_t ld_s, const float *q, size_t q_stride,
                                const float *k, size_t k_stride, size_t d, fv vscale, int mr,
                                int nr, int keywise) {
    fv a[SCORES_MAX_SUMS];
    for (int t = 0; t < mr * nr; t++) a[t] = fv_zero();
    size_t p = 0;
    for (; p + W <= d; p += W)
        scores_step(a, q + p, q_stride, k + p, k_stride, mr, nr, keywise, NULL);
    if (p < d) {
        const fv_lanes m = fv_first(d - p);
        scores_step(a, q + p, q_stride, k + p, k_stride, mr, nr, keywise, &m);
    }
    for (int g = 0; g < mr * nr / W; g++) {
        const fv sum = fv_mul(fv_hsums(a + g * W), vscale);
        const int r = g * W / nr;
        if (nr >= W)
            fv_store(s + r * ld_s + g * W % nr, sum);
        else
            for (int h = 0; h < W / 4; h++) fv_store4(s + (r + h) * ld_s, sum, h);
    }
}

/* a single query against row_nr keys, its vector loaded once for all of them */
ALWAYS_INLINE void scores_row(float *s, const float *q, const float *k, size_t k_stride, size_t d,
                              fv vscale, int row_nr) {
    scores_block(s, 0, q, 0, k, k_stride, d, vscale, 1, row_nr, 1);
}

/* kernels.h's scores_tile for the rows from 0 in blocks of mr, against nr keys at a time
 * (keywise as in scores_step), the keys left over one dot each; returns the first row not done */
ALWAYS_INLINE size_t scores_row_blocks(float *s, size_t ld_s, const float *q, size_t q_stride,
                                       size_t nq, const float *k, size_t k_stride, size_t nk,
                                       size_t d, float scale, int mr, int nr, int keywise) {
    const fv vscale = fv_set1(scale);
    size_t i = 0;
    for (; i + mr <= nq; i += mr) {
        const float *qi = q + i * q_stride;
        float *si = s + i * ld_s;
        size_t j = 0;
        for (; j + nr <= nk; j += nr)
            scores_block(si + j, ld_s, qi, q_stride, k + j * k_stride, k_stride, d, vscale, mr, nr,
                         keywise);
        for (; j < nk; j++)
            for (int r = 0; r < mr; r++)
                si[r * ld_s + j] = scale * isa_dot(qi + r * q_stride, k + j * k_stride, d);
    }
    return i;
}

/* one query's scores (a row left over, or decode): row_nr keys at a time (isa_scores_row), then
 * a dot each */
ALWAYS_INLINE void scores_query(float *s, const float *q, const float *k, size_t k_stride,
                                size_t nk, size_t d, float scale, int row_nr) {
    const fv vscale = fv_set1(scale);
    size_t j = 0;
    for (; j + row_nr <= nk; j += row_nr)
        isa_scores_row(s + j, q, k + j * k_stride, k_stride, d, vscale);
    for (; j < nk; j++) s[j] = scale * isa_dot(q, k + j * k_stride, d);
}

#endif
