/* The backward pass of attention (sdpa.h, sdpa_mha_backward_f32), one driver for every backend.
 *
 * FlashAttention-2's order: for each block of keys, every block of query rows that sees it. A
 * tile is key-major, st[key][query] with SDPA_ATTN_MAX_BLOCK_Q queries a key, the layout the
 * packed forward's scores leave, so that the three products that need a transposed operand
 * read it as it is:
 *     S^T  = scale K Q^T          scores_keymajor (packed Q) or scores_tile (A = K, B = Q)
 *     dP^T = V dO^T               the same, with scale 1
 *     P^T  = exp(S^T - lse)       exp_keymajor, or exp_sum key by key
 *     dS^T = scale P^T (dP^T - D) ds_keymajor, D_i = dO_i . O_i
 *     dV  += P^T dO               pv_tile (rows: keys), sum_rows query rows at a time
 *     dK  += dS^T Q               pv_tile, the same
 *     dQ  += dS K                 pv_tile_t (the weights key-major)
 * dK and dV are added into their output rows, which stay in cache through the query blocks; dQ
 * into its rows, block of keys after block of keys. No len_q x len_kv matrix is formed: a tile
 * and its operands live on the stack (about 180 KiB), and only key chunks (below) use the
 * workspace.
 *
 * A pair (query row, key) that must not count (causal, a mask entry of -inf, a row with lse
 * -inf, which saw no key) gets P = dS = 0 exactly. pv_tile forms every product, so a tile with
 * such pairs takes the whole-tile products only when every row it multiplies (q, dout, k) is
 * finite, where 0 * x is 0; otherwise it sums the runs of pairs that count, so that NaN in a
 * removed key's k or v, or in a removed row's q or dout, reaches nothing.
 *
 * Threads: a task owns the dk and dv rows of one (batch, kv head) and the dq rows of the query
 * heads that read it, zeroes them and adds into them in a fixed order; where a gradient's batch
 * or head stride is 0 (summed over that axis) one task takes the whole axis; a call with few
 * such units also cuts their keys into chunks ("key chunks" below). Tasks are cut by the shape
 * alone, so the bits never depend on the thread count or the scheduler. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "attention_problem.h"
#include "chunks.h"
#include "dispatch.h"
#include "plan.h"
#include "score_stage.h"
#include "sdpa.h"
#include "threads.h"
#include "visibility.h"

#if defined(__AVX__) || defined(__SSE4_1__)
#error "src/attention_backward.c must be compiled for the baseline ISA, without -m flags"
#endif

#define QT        SDPA_ATTN_MAX_BLOCK_Q /* queries a tile: the columns of the key-major tiles */
#define TRIM_KEYS 32 /* pv_tile_t's keys a pass (PV_T_KEYS, arch/attention_entries.h) */

/* A key's dk and dv are summed over pl.sum_rows query rows at a time (plan.h) from 0 in stack
 * tiles, which are then added to the rows. A tile holds a block of keys times d up to
 * SUM_TILE_FLOATS (d <= 128 packed, 512 at 32 keys a block); past it that sum is one chain. The
 * blocks cost about one percent of the backward. */
#define SUM_TILE_FLOATS (SDPA_ATTN_MAX_BLOCK_KV * SDPA_ATTN_PACK_MAX_D)

/* Kernels and constants of one call. */
typedef struct backward_run {
    const backward_problem *bp;
    visibility vis; /* the keys each query row sees */
    const sdpa_kernels *k;
    const sdpa_attention_kernels *a;
    int packed; /* pack_q and scores_keymajor for S^T and dP^T (d_k, d_v <= SDPA_ATTN_PACK_MAX_D) */
    size_t keys; /* keys a tile: SDPA_ATTN_MAX_BLOCK_KV packed (the more keys, the fewer times
                    each block of queries is packed and its D formed), else block_q (the rows
                    of scores_tile, which here are keys) */
    void (*exp_keymajor)(float *st, size_t ld_st, size_t nk, size_t nq, const float *shift);
    float (*exp_sum)(float *y, const float *x, size_t n, float scale, float shift);
    backward_plan pl; /* units, key chunks, sum_rows (plan.h) */
} backward_run;

/* One query head's views; dq is where its dq rows from dq_first on are summed (dq_row floats
 * apart): the output rows (dq_first 0), or a key chunk's partial (below). */
typedef struct head {
    const float *q, *out, *dout, *lse, *mask;
    float *dq;
    size_t dq_row, dq_first;
    score_stage st; /* the forward's score stage for this head's rows */
} head;

/* One block of keys: its rows of k and v, and of dk and dv; dk_to and dv_to are where
 * backward_tile adds their terms, dk_row and dv_row floats a key: the rows themselves, or the
 * stack tiles of rows_against_keys. */
typedef struct key_block {
    const float *k, *v;
    float *dk, *dv, *dk_to, *dv_to;
    size_t dk_row, dv_row;
    size_t k0, nk;
    int k_finite; /* its k rows hold no inf or NaN: 1, 0, or -1 until a tile needs to know */
} key_block;

/* The stack tiles of a task. */
typedef struct tiles {
    _Alignas(64) float qt[SDPA_ATTN_PACK_MAX_D * QT];
    _Alignas(64) float s[SDPA_ATTN_MAX_BLOCK_KV * QT];   /* S^T, then P^T */
    _Alignas(64) float ds[SDPA_ATTN_MAX_BLOCK_KV * QT];  /* dP^T, then dS^T */
    _Alignas(64) float dk[SUM_TILE_FLOATS];              /* a block's dk terms; else zeros */
    _Alignas(64) float dv[SUM_TILE_FLOATS];              /* the same for dv */
    _Alignas(64) float cap[SDPA_ATTN_MAX_BLOCK_KV * QT]; /* a softcap's derivative, S^T's shape */
} tiles;

/* One tile: nq query rows from q0 of head h against the first nk keys of block kb, with their
 * views at the tile's first row and each row's lse (INFINITY for a row that saw no key) and D. */
typedef struct tile {
    const head *h;
    key_block *kb;
    size_t q0, nq, nk;
    const float *q, *dout;
    float *dq;
    float lse[QT], dd[QT];
    size_t live; /* rows that saw a key */
} tile;

/* Pair (row i, key j) of the tile counts: seen (vis), by a live row, not removed by the stage
   (the mask, a segment). */
static inline int pair_counts(const visibility *vis, const tile *x, size_t i, size_t j) {
    const size_t r = x->q0 + i, k = x->kb->k0 + j;
    if (k >= visibility_row_end(vis, r) || k < visibility_row_first(vis, r) ||
        x->h->lse[r] == -INFINITY)
        return 0;
    return !score_stage_removes(&x->h->st, r, k);
}

/* The tile's rows: lse and D of each (zeros past nq), and how many saw a key. */
static void tile_rows(const backward_run *run, tile *x) {
    const attention_problem *p = &run->bp->fwd;
    const size_t os = p->out_stride[2], dos = run->bp->dout_stride[2];
    x->live = 0;
    for (size_t i = 0; i < QT; i++) {
        x->lse[i] = 0.0f;
        x->dd[i] = 0.0f;
        if (i >= x->nq) continue;
        x->lse[i] = x->h->lse[x->q0 + i];
        if (x->lse[i] == -INFINITY) { /* exp(s - inf) = 0; the pair is zeroed anyway */
            x->lse[i] = INFINITY;
            continue;
        }
        x->live++;
        x->dd[i] = run->k->dot(x->dout + i * dos, x->h->out + (x->q0 + i) * os, p->d_v);
    }
}

/* Every pair counts: all rows live, all seen, none removed by the stage. */
static int tile_clean(const backward_run *run, const tile *x) {
    if (x->live != x->nq || visibility_block(&run->vis, x->q0, x->nq, x->kb->k0, x->nk) != VIS_ALL)
        return 0;
    for (size_t i = 0; !score_stage_keeps_keys(&x->h->st) && i < x->nq; i++)
        for (size_t j = 0; j < x->nk; j++)
            if (score_stage_removes(&x->h->st, x->q0 + i, x->kb->k0 + j)) return 0;
    return 1;
}

/* The forward's stage on S^T past the product (the mask below): a softcap, whose derivative
   1 - tanh^2 goes to t->cap for tile_grads, then ALiBi. */
static void tile_stage(const backward_run *run, tiles *t, const tile *x) {
    const score_stage *st = &x->h->st;
    if (st->softcap == 0.0f && !st->alibi) return;
    const stage_kernels kn = stage_kernels_of(run->k, run->exp_sum);
    score_stage_keymajor(st, t->s, QT, QT, x->q0, x->nq, x->kb->k0, x->nk, NULL,
                         st->softcap != 0.0f ? t->cap : NULL, t->cap, &kn);
}

/* S^T (plus the mask) and dP^T, key-major; columns past nq hold zeros. */
static void tile_scores(const backward_run *run, tiles *t, const tile *x) {
    const backward_problem *bp = run->bp;
    const attention_problem *p = &bp->fwd;
    const sdpa_attention_kernels *a = run->a;
    const size_t qs = p->q_stride[2], dos = bp->dout_stride[2], nq = x->nq, nk = x->nk;
    const key_block *kb = x->kb;
    if (run->packed) {
        a->pack_q(t->qt, QT, x->q, qs, nq, p->d_k);
        a->scores_keymajor(t->s, QT, t->qt, QT, nq, kb->k, p->k_stride[2], nk, p->d_k, p->scale);
        a->pack_q(t->qt, QT, x->dout, dos, nq, p->d_v);
        a->scores_keymajor(t->ds, QT, t->qt, QT, nq, kb->v, p->v_stride[2], nk, p->d_v, 1.0f);
    } else {
        a->scores_tile(t->s, QT, kb->k, p->k_stride[2], nk, x->q, qs, nq, p->d_k, p->scale);
        a->scores_tile(t->ds, QT, kb->v, p->v_stride[2], nk, x->dout, dos, nq, p->d_v, 1.0f);
    }
    if (nq < QT)
        for (size_t j = 0; j < nk; j++) {
            memset(t->s + j * QT + nq, 0, (QT - nq) * sizeof(float));
            memset(t->ds + j * QT + nq, 0, (QT - nq) * sizeof(float));
        }
    tile_stage(run, t, x);
    if (p->mask)
        for (size_t i = 0; i < nq; i++) {
            const float *mr = x->h->mask + (x->q0 + i) * p->mask_stride[2] + kb->k0;
            for (size_t j = 0; j < nk; j++) t->s[j * QT + i] += mr[j];
        }
}

/* P^T = exp(S^T - lse), each difference rounded to float as the forward's, and
   dS^T = scale P^T (dP^T - D). */
static void tile_grads(const backward_run *run, tiles *t, const tile *x) {
    const size_t nk = x->nk;
    if (run->exp_keymajor) {
        run->exp_keymajor(t->s, QT, nk, QT, x->lse);
    } else {
        for (size_t j = 0; j < nk; j++) {
            float *sj = t->s + j * QT;
            for (size_t i = 0; i < QT; i++) sj[i] -= x->lse[i];
            run->exp_sum(sj, sj, QT, 1.0f, 0.0f); /* its sum unused */
        }
    }
    run->a->ds_keymajor(t->ds, t->s, QT, nk, QT, x->dd, run->bp->fwd.scale);
    if (x->h->st.softcap != 0.0f) /* through the softcap: dS times its derivative */
        for (size_t e = 0; e < nk * QT; e++) t->ds[e] *= t->cap[e];
}

/* P = dS = 0 exactly where the pair does not count; under visibility alone (every row live, a
   stage that removes no key), the rows that see key j are a run [lo, hi) that moves down as j
   grows: the rows before it (causality, or not yet at the key) and, under a window, the rows
   from the first that has left the key behind. */
static void tile_zero_pairs(const backward_run *run, tiles *t, const tile *x) {
    if (score_stage_keeps_keys(&x->h->st) && x->live == x->nq) {
        size_t lo = 0, hi = 0;
        for (size_t j = 0; j < x->nk; j++) {
            const size_t k = x->kb->k0 + j;
            while (lo < x->nq && visibility_row_end(&run->vis, x->q0 + lo) <= k) lo++;
            if (hi < lo) hi = lo;
            while (hi < x->nq && visibility_row_first(&run->vis, x->q0 + hi) <= k) hi++;
            memset(t->s + j * QT, 0, lo * sizeof(float));
            memset(t->ds + j * QT, 0, lo * sizeof(float));
            memset(t->s + j * QT + hi, 0, (x->nq - hi) * sizeof(float));
            memset(t->ds + j * QT + hi, 0, (x->nq - hi) * sizeof(float));
        }
        return;
    }
    for (size_t j = 0; j < x->nk; j++)
        for (size_t i = 0; i < x->nq; i++)
            if (!pair_counts(&run->vis, x, i, j)) t->s[j * QT + i] = t->ds[j * QT + i] = 0.0f;
}

/* Pair e along key `at` (by_key: e is the row) or along row `at` (e is the key) counts. */
static inline int counts_along(const backward_run *run, const tile *x, int by_key, size_t at,
                               size_t e) {
    return by_key ? pair_counts(&run->vis, x, e, at) : pair_counts(&run->vis, x, at, e);
}

/* The next run [*begin, *end) of pairs that count, from *end on and below n, along key or row
   `at` (counts_along). 0 when there is none. */
static int next_run(const backward_run *run, const tile *x, int by_key, size_t at, size_t n,
                    size_t *begin, size_t *end) {
    size_t e = *end;
    while (e < n && !counts_along(run, x, by_key, at, e)) e++;
    *begin = e;
    while (e < n && counts_along(run, x, by_key, at, e)) e++;
    *end = e;
    return *begin < n;
}

/* Non-finite rows: dk, dv and dq from the runs of pairs that count alone, along each key's row
   for dk and dv, down each query's column for dq, so that no removed pair's inf or NaN counts. */
static void tile_products_runs(const backward_run *run, const tiles *t, const tile *x) {
    const attention_problem *p = &run->bp->fwd;
    const sdpa_attention_kernels *a = run->a;
    const size_t qs = p->q_stride[2], dos = run->bp->dout_stride[2], ks = p->k_stride[2];
    const key_block *kb = x->kb;
    for (size_t j = 0; j < x->nk; j++)
        for (size_t i0, i = 0; next_run(run, x, 1, j, x->nq, &i0, &i);) {
            a->pv_tile(kb->dv_to + j * kb->dv_row, 0, t->s + j * QT + i0, QT, 1, i - i0,
                       x->dout + i0 * dos, dos, p->d_v);
            a->pv_tile(kb->dk_to + j * kb->dk_row, 0, t->ds + j * QT + i0, QT, 1, i - i0,
                       x->q + i0 * qs, qs, p->d_k);
        }
    for (size_t i = 0; i < x->nq; i++) {
        float w[SDPA_ATTN_MAX_BLOCK_KV]; /* the column, as a row: pv_tile_t wants whole tiles */
        for (size_t j = 0; j < x->nk; j++) w[j] = t->ds[j * QT + i];
        for (size_t j0, j = 0; next_run(run, x, 0, i, x->nk, &j0, &j);)
            a->pv_tile(x->dq + i * x->h->dq_row, 0, w + j0, 0, 1, j - j0, kb->k + j0 * ks, ks,
                       p->d_k);
    }
}

/* The tile of nq query rows from q0 of head h against key block kb; 0 if no pair of it counts
 * (nothing added anywhere). A tile with pairs that do not count takes the whole-tile products
 * only when every row it multiplies (q, dout, k) is finite, where 0 * x is 0. */
static int backward_tile(const backward_run *run, tiles *t, const head *h, key_block *kb, size_t q0,
                         size_t nq) {
    const backward_problem *bp = run->bp;
    const attention_problem *p = &bp->fwd;
    const size_t qs = p->q_stride[2], dos = bp->dout_stride[2], ks = p->k_stride[2];
    /* the keys past what the last row sees are left out of the tile */
    if (visibility_block(&run->vis, q0, nq, kb->k0, kb->nk) == VIS_NONE) return 0;
    const size_t last_end = visibility_row_end(&run->vis, q0 + nq - 1) - kb->k0;
    tile x = {h,
              kb,
              q0,
              nq,
              last_end < kb->nk ? last_end : kb->nk,
              h->q + q0 * qs,
              h->dout + q0 * dos,
              h->dq + (q0 - h->dq_first) * h->dq_row,
              {0},
              {0},
              0};
    tile_rows(run, &x);
    if (!x.live) return 0;
    const int clean = tile_clean(run, &x);
    /* a window that starts past the block's first keys: those no row of the tile sees are left
       out of every product, from a multiple of TRIM_KEYS on (each pass of pv_tile_t keeps its
       keys), with the block's k_finite known first */
    key_block trimmed;
    const size_t first = visibility_row_first(&run->vis, q0);
    const size_t j0 = first > kb->k0 ? (first - kb->k0) / TRIM_KEYS * TRIM_KEYS : 0;
    if (!clean && run->packed && j0 && j0 < x.nk) {
        if (kb->k_finite < 0) kb->k_finite = run->k->rows_finite(kb->k, ks, kb->nk, p->d_k);
        trimmed = *kb;
        trimmed.k0 += j0;
        trimmed.nk -= j0;
        trimmed.k += j0 * ks;
        trimmed.v += j0 * p->v_stride[2];
        trimmed.dk += j0 * bp->dk_stride[2];
        trimmed.dv += j0 * bp->dv_stride[2];
        trimmed.dk_to += j0 * kb->dk_row;
        trimmed.dv_to += j0 * kb->dv_row;
        kb = x.kb = &trimmed;
        x.nk -= j0;
    }
    tile_scores(run, t, &x);
    tile_grads(run, t, &x);
    if (!clean) {
        tile_zero_pairs(run, t, &x);
        if (kb->k_finite < 0) kb->k_finite = run->k->rows_finite(kb->k, ks, kb->nk, p->d_k);
    }
    if (clean || (kb->k_finite && run->k->rows_finite(x.q, qs, nq, p->d_k) &&
                  run->k->rows_finite(x.dout, dos, nq, p->d_v))) {
        run->a->pv_tile(kb->dv_to, kb->dv_row, t->s, QT, x.nk, nq, x.dout, dos, p->d_v);
        run->a->pv_tile(kb->dk_to, kb->dk_row, t->ds, QT, x.nk, nq, x.q, qs, p->d_k);
        run->a->pv_tile_t(x.dq, h->dq_row, t->ds, QT, nq, x.nk, kb->k, ks, p->d_k);
    } else {
        tile_products_runs(run, t, &x);
    }
    return 1;
}

/* rows x d floats: dst (dst_row apart) += src (src_row apart) */
static void add_rows(float *dst, size_t dst_row, const float *src, size_t src_row, size_t rows,
                     size_t d) {
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < d; c++) dst[r * dst_row + c] += src[r * src_row + c];
}

/* rows x d floats: dst (dst_row apart) += the dense tile src, which is left zeroed. The adds
 * are pv_tile's products by 1, which are exact, so each is one rounding of the sum, in the
 * backend's vectors (a baseline loop costs a few percent of the backward). */
static void add_tile_clear(const backward_run *run, float *dst, size_t dst_row, float *src,
                           size_t rows, size_t d) {
    static const float one = 1.0f;
    if (dst_row == d)
        run->a->pv_tile(dst, 0, &one, 0, 1, 1, src, 0, rows * d);
    else
        for (size_t r = 0; r < rows; r++)
            run->a->pv_tile(dst + r * dst_row, 0, &one, 0, 1, 1, src + r * d, 0, d);
    memset(src, 0, rows * d * sizeof(float));
}

/* Rows [r_begin, r_end) of head h (r_begin a multiple of QT) against key block kb, a tile at a
 * time, dk and dv in blocks of sum_rows rows (above; t->dk and t->dv hold zeros on entry, and
 * again on return); a block whose tiles count nowhere adds nothing. */
static void rows_against_keys(const backward_run *run, tiles *t, const head *h, key_block *kb,
                              size_t r_begin, size_t r_end) {
    const backward_problem *bp = run->bp;
    const size_t d_k = bp->fwd.d_k, d_v = bp->fwd.d_v, rows = run->pl.sum_rows;
    const int tile_k = kb->nk * d_k <= SUM_TILE_FLOATS, tile_v = kb->nk * d_v <= SUM_TILE_FLOATS;
    if (tile_k) {
        kb->dk_to = t->dk;
        kb->dk_row = d_k;
    }
    if (tile_v) {
        kb->dv_to = t->dv;
        kb->dv_row = d_v;
    }
    for (size_t q0 = r_begin; q0 < r_end;) {
        const size_t end = (q0 / rows + 1) * rows < r_end ? (q0 / rows + 1) * rows : r_end;
        int added = 0;
        for (; q0 < end; q0 += QT)
            added |= backward_tile(run, t, h, kb, q0, end - q0 < QT ? end - q0 : QT);
        if (!added) continue;
        if (tile_k) add_tile_clear(run, kb->dk, bp->dk_stride[2], t->dk, kb->nk, d_k);
        if (tile_v) add_tile_clear(run, kb->dv, bp->dv_stride[2], t->dv, kb->nk, d_v);
    }
}

/* Query head g of kv head hk of batch entry b, its dq rows summed into the output. */
static void head_of(const backward_run *run, size_t b, size_t hk, size_t g, head *h) {
    const backward_problem *bp = run->bp;
    const attention_problem *p = &bp->fwd;
    const size_t hq = hk * run->pl.group + g;
    h->q = (const float *)p->q + b * p->q_stride[0] + hq * p->q_stride[1];
    h->out = (const float *)p->out + b * p->out_stride[0] + hq * p->out_stride[1];
    h->dout = bp->dout + b * bp->dout_stride[0] + hq * bp->dout_stride[1];
    h->lse = p->lse + b * p->lse_stride[0] + hq * p->lse_stride[1];
    h->mask = p->mask ? p->mask + b * p->mask_stride[0] + hq * p->mask_stride[1] : NULL;
    h->dq = bp->dq + b * bp->dq_stride[0] + hq * bp->dq_stride[1];
    h->dq_row = bp->dq_stride[2];
    h->dq_first = 0;
    h->st = score_stage_of(p, b, hq, 0, run->vis.shift, h->mask, p->mask_stride[2]);
}

/* The block of keys from k0 of kv head hk of batch entry b. */
static void key_block_of(const backward_run *run, size_t b, size_t hk, size_t k0, key_block *kb) {
    const backward_problem *bp = run->bp;
    const attention_problem *p = &bp->fwd;
    kb->k0 = k0;
    kb->nk = p->len_kv - k0 < run->keys ? p->len_kv - k0 : run->keys;
    kb->k = (const float *)p->k + b * p->k_stride[0] + hk * p->k_stride[1] + k0 * p->k_stride[2];
    kb->v = (const float *)p->v + b * p->v_stride[0] + hk * p->v_stride[1] + k0 * p->v_stride[2];
    kb->dk = bp->dk + b * bp->dk_stride[0] + hk * bp->dk_stride[1] + k0 * bp->dk_stride[2];
    kb->dv = bp->dv + b * bp->dv_stride[0] + hk * bp->dv_stride[1] + k0 * bp->dv_stride[2];
    kb->dk_to = kb->dk;
    kb->dk_row = bp->dk_stride[2];
    kb->dv_to = kb->dv;
    kb->dv_row = bp->dv_stride[2];
    kb->k_finite = -1;
}

/* Every key of kv head hk of batch entry b against every row of its query heads, block of keys
 * by block of keys, into the output rows. */
static void backward_keys(const backward_run *run, tiles *t, size_t b, size_t hk) {
    const attention_problem *p = &run->bp->fwd;
    for (size_t k0 = 0; k0 < p->len_kv; k0 += run->keys) {
        key_block kb;
        key_block_of(run, b, hk, k0, &kb);
        const size_t first = visibility_first_row(&run->vis, k0);
        if (first >= p->len_q) break;
        for (size_t g = 0; g < run->pl.group; g++) {
            head h;
            head_of(run, b, hk, g, &h);
            rows_against_keys(run, t, &h, &kb, first / QT * QT, p->len_q);
        }
    }
}

static void zero_rows(float *x, const size_t stride[3], size_t b, size_t h, size_t r0, size_t rows,
                      size_t row) {
    if (!rows) return; /* x may be NULL then */
    float *base = x + b * stride[0] + h * stride[1];
    for (size_t r = r0; r < r0 + rows; r++) memset(base + r * stride[2], 0, row * sizeof(float));
}

/* Task index: its batch entries and kv heads, zeroed, then summed into. */
static void backward_task(void *arg, size_t index) {
    const backward_run *run = arg;
    const backward_problem *bp = run->bp;
    const attention_problem *p = &bp->fwd;
    const size_t b0 = index / run->pl.tasks_h * run->pl.task_b,
                 h0 = index % run->pl.tasks_h * run->pl.task_h;
    tiles t; /* its sum tiles start as zeros, and rows_against_keys leaves them so */
    memset(t.dk, 0, sizeof t.dk), memset(t.dv, 0, sizeof t.dv);
    for (size_t b = b0; b < b0 + run->pl.task_b; b++)
        for (size_t hk = h0; hk < h0 + run->pl.task_h; hk++) {
            zero_rows(bp->dk, bp->dk_stride, b, hk, 0, p->len_kv, p->d_k);
            zero_rows(bp->dv, bp->dv_stride, b, hk, 0, p->len_kv, p->d_v);
            for (size_t g = 0; g < run->pl.group; g++)
                zero_rows(bp->dq, bp->dq_stride, b, hk * run->pl.group + g, 0, p->len_q, p->d_k);
        }
    if (!p->len_q || !p->len_kv) return;
    for (size_t b = b0; b < b0 + run->pl.task_b; b++)
        for (size_t hk = h0; hk < h0 + run->pl.task_h; hk++) backward_keys(run, &t, b, hk);
}

/* ---- key chunks ----
 *
 * A call with few (batch, kv head) units (one head, say) also cuts each unit's keys into chunks
 * of whole pieces (plan.h, KEY_PIECE), about 16 tasks in all, and its query rows into parts:
 * bands of whole blocks of sum_rows rows of one query head. Chunk c of a part writes the dk and
 * dv rows of its keys (zeroed with the first part), and the part's share of dq: chunk 0 into
 * the output rows, chunk c >= 1 into a slot, which chunks.h adds to dq in chunk order. Every dk
 * and dv row gets the same tiles in the same order as in backward_keys (query heads, then
 * blocks of rows), and every dq row the same slots in the same order, at any thread count and
 * in either of chunks.h's schedules. Units own no summed axis (task_b = task_h = 1, and dq not
 * summed over query heads). */

static void chunk_with_scratch(const void *ctx, void (*body)(void *arg, void *scratch), void *arg) {
    (void)ctx;
    tiles t; /* its sum tiles start as zeros, and rows_against_keys leaves them so */
    memset(t.dk, 0, sizeof t.dk), memset(t.dv, 0, sizeof t.dv);
    body(arg, &t);
}

/* Part `part` of unit u: query head g, rows [*r0, *r1); h its views. */
static void part_of(const backward_run *run, size_t u, size_t part, head *h, size_t *r0,
                    size_t *r1) {
    const size_t len_q = run->bp->fwd.len_q;
    head_of(run, u / run->pl.tasks_h, u % run->pl.tasks_h, part / run->pl.bands, h);
    *r0 = part % run->pl.bands * run->pl.band;
    *r1 = len_q - *r0 < run->pl.band ? len_q : *r0 + run->pl.band;
}

/* The first row of chunk c's share of dq: that of the tile of the first row that sees any of
 * its keys (rows before it see none). */
static size_t chunk_first_row(const backward_run *run, size_t c) {
    size_t k_begin, k_end;
    plan_backward_chunk(&run->pl, run->bp->fwd.len_kv, c, &k_begin, &k_end);
    return visibility_first_row(&run->vis, k_begin) / QT * QT;
}

static void chunk_part(const void *ctx, void *scratch, size_t u, size_t c, size_t part,
                       float *slot) {
    const backward_run *run = ctx;
    const backward_problem *bp = run->bp;
    const attention_problem *p = &bp->fwd;
    const size_t b = u / run->pl.tasks_h, hk = u % run->pl.tasks_h;
    size_t k_begin, k_end, r0, r1;
    plan_backward_chunk(&run->pl, p->len_kv, c, &k_begin, &k_end);
    head h;
    part_of(run, u, part, &h, &r0, &r1);
    if (!part) {
        zero_rows(bp->dk, bp->dk_stride, b, hk, k_begin, k_end - k_begin, p->d_k);
        zero_rows(bp->dv, bp->dv_stride, b, hk, k_begin, k_end - k_begin, p->d_v);
    }
    if (slot) {
        memset(slot, 0, (r1 - r0) * p->d_k * sizeof(float));
        h.dq = slot;
        h.dq_row = p->d_k;
        h.dq_first = r0;
    } else {
        for (size_t r = r0; r < r1; r++) memset(h.dq + r * h.dq_row, 0, p->d_k * sizeof(float));
    }
    for (size_t k0 = k_begin; k0 < k_end; k0 += run->keys) {
        const size_t first = visibility_first_row(&run->vis, k0) / QT * QT;
        if (first >= r1) break;
        key_block kb;
        key_block_of(run, b, hk, k0, &kb);
        rows_against_keys(run, scratch, &h, &kb, first > r0 ? first : r0, r1);
    }
}

/* Chunk c's slot of a part added to its dq rows, from the first that the chunk reaches. */
static void chunk_add(const void *ctx, void *scratch, size_t u, size_t c, size_t part, float *state,
                      const float *slot) {
    (void)scratch;
    (void)state;
    const backward_run *run = ctx;
    const size_t d_k = run->bp->fwd.d_k, first = chunk_first_row(run, c);
    size_t r0, r1;
    head h;
    part_of(run, u, part, &h, &r0, &r1);
    const size_t from = first > r0 ? first : r0;
    if (from < r1)
        add_rows(h.dq + from * h.dq_row, h.dq_row, slot + (from - r0) * d_k, d_k, r1 - from, d_k);
}

static const chunk_ops chunk_dq_ops = {chunk_with_scratch, chunk_part, chunk_add, NULL};

static void backward_run_all(const backward_problem *bp) {
    const attention_problem *p = &bp->fwd;
    backward_run run;
    run.bp = bp;
    run.vis = visibility_of(p);
    run.k = sdpa_kernels_now();
    run.a = run.k->attention;
    const int kind = sdpa_exp_with(run.k);
    run.exp_keymajor = run.a->exp_keymajor[kind];
    run.exp_sum = run.k->exp_sum[kind];
    run.packed = run.a->pack_q && run.a->scores_keymajor && p->d_k <= SDPA_ATTN_PACK_MAX_D &&
                 p->d_v <= SDPA_ATTN_PACK_MAX_D;
    run.keys = run.packed ? SDPA_ATTN_MAX_BLOCK_KV : run.a->block_q;
    const size_t threads = sdpa_threads_for_call();
    plan_backward(&run.pl, bp, threads);
    const chunk_plan r = plan_backward_chunks(&run.pl);
    work_run(&r, &chunk_dq_ops, backward_task, &run, run.pl.parallel, threads);
    if (bp->dsinks) sdpa_problem_dsinks(bp);
}

SDPA_API sdpa_status sdpa_mha_backward_f32(const sdpa_mha_desc *desc, const sdpa_mha_grads *grads,
                                           const float *q, const float *k, const float *v,
                                           const float *out) {
    backward_problem bp;
    sdpa_status st = sdpa_backward_problem(&bp, desc, grads, q, k, v, out);
    if (st != SDPA_OK) return st;
    if (bp.dsinks) memset(bp.dsinks, 0, bp.fwd.heads_q * sizeof(float)); /* no rows: 0 */
    if (!bp.fwd.batch || !bp.fwd.heads_q || (!bp.fwd.len_q && !bp.fwd.len_kv)) return SDPA_OK;
    backward_run_all(&bp);
    return SDPA_OK;
}
