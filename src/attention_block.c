/* The executor: one head's block of query rows against the keys they see, for every backend.
 * It takes the rows (q, out), a key source (key_source.h: where each block of keys and values
 * is, dense or paged), a visibility (visibility.h: which keys each row sees) and a score stage
 * (score_stage.h), and nothing of a descriptor; the planner (plan.h) and the tasks
 * (attention.c) decide which rows and keys it gets.
 *
 * K and V stream in blocks of block_kv keys (FlashAttention's order): the scores of a block in a
 * stack tile, the stage, the online softmax (running max m and sum l a row, the accumulator
 * rescaled by exp(m_old - m_new) when the max grows), then P V into the accumulator (a stack
 * tile, or for d_v > 256 the output rows), each row divided by l at the end. Blocks no row sees
 * are never visited. Every microkernel works in float: a 16-bit view is widened a block at a
 * time (once for the ROW_BLOCKS a 16-bit prefill unit holds), or read as it is, a vector widened
 * in registers, by the typed entries (decode's unpacked blocks; P V but the fused step) and the
 * bf16 dot add-on (bf16 Q and K, packed). fp8 K/V is read by the backend's fp8 entries where the
 * typed ones apply (bit for bit widen_fp8 and the f16 entries), else widened to f16 rows a block
 * at a time (key_rows.c) and taken as f16. A 16-bit out is rounded once, from the float row. */
#include "attention_block.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "dispatch.h"
#include "fp8.h"
#include "plan.h"
#include "sdpa.h"
#include "sizes.h"

#if defined(__AVX__) || defined(__SSE4_1__)
#error "src/attention_block.c must be compiled for the baseline ISA, without -m flags"
#endif

/* Accumulator tile on the stack: block_q rows of d_v floats when they fit. */
#define ACC_FLOATS (SDPA_ATTN_MAX_BLOCK_Q * 256)

/* A block of at most SDPA_ATTN_MAX_BLOCK_Q query rows of one head, and the state of its online
 * softmax: running max m and sum l per row, and the accumulator acc. */
typedef struct row_block {
    size_t q0, nq;
    int packed;      /* the key-major path: pack_q, scores_packed, scores_max */
    const float *qb; /* the rows as floats, for scores_tile (unpacked) */
    size_t qs;       /* their stride */
    float *acc;      /* stack tile, or for d_v past it the output rows */
    size_t ld_acc;
    size_t kv_begin, kv_end;  /* the keys any row sees lie in [kv_begin, kv_end) */
    size_t all_from, all_see; /* every row sees the keys [all_from, all_see) */
    enum { STEP_NONE, STEP_FUSED, STEP_ROWS } step; /* what the scores of a block left for P V */
    int simple;   /* STEP_ROWS: every row sees every key of the block, or (filled) has weight
                     exactly 0 for the keys it does not see */
    int filled;   /* the zeros are the window's, over values not yet known to be finite */
    int zeros_ok; /* a window: a block's unseen keys may take weight 0 in the tile P V */
    size_t skip; /* filled, or fused: the first keys, which no row sees, left out of the products */
    float m[SDPA_ATTN_MAX_BLOCK_Q], m_new[SDPA_ATTN_MAX_BLOCK_Q];
    double l[SDPA_ATTN_MAX_BLOCK_Q];
    size_t from[SDPA_ATTN_MAX_BLOCK_Q], visible[SDPA_ATTN_MAX_BLOCK_Q]; /* row r sees keys
                                                                 [from[r], visible[r]) */
    unsigned char poisoned[SDPA_ATTN_MAX_BLOCK_Q], live[SDPA_ATTN_MAX_BLOCK_Q];
    _Alignas(64) float s[SDPA_ATTN_MAX_BLOCK_Q * SDPA_ATTN_MAX_BLOCK_KV]; /* scores, weights */
    /* the rows, transposed: floats, or with the bf16 dot words of bf16 pairs */
    union {
        _Alignas(64) float f[SDPA_ATTN_PACK_MAX_D * SDPA_ATTN_MAX_BLOCK_Q];
        uint32_t pairs[SDPA_ATTN_PACK_MAX_D / 2 * SDPA_ATTN_MAX_BLOCK_Q];
    } qt;
} row_block;

/* A problem with a 16-bit view: its rows widened to float. kv holds a block of keys for the
 * scores, then the same block of values for P V, never both at once; q the block's queries,
 * where the scores read them as rows (the packed path widens them into kv for pack_q). */
typedef struct wide_tiles {
    _Alignas(64) float q[SDPA_WIDE_FLOATS];
    _Alignas(64) float kv[SDPA_WIDE_FLOATS];
    /* a paged block of 16-bit keys, then of values, gathered as they are, for the entries that
       read 16-bit rows (a paged f32 block gathers into kv) */
    _Alignas(64) uint16_t kv16[SDPA_WIDE_FLOATS];
    /* the row blocks past the first that share each widened block of keys and values */
    row_block more[ROW_BLOCKS - 1];
    float more_acc[ROW_BLOCKS - 1][ACC_FLOATS];
} wide_tiles;

/* ---- the executor ---- */

static int row_has_nan(const float *s, size_t n) {
    for (size_t j = 0; j < n; j++)
        if (isnan(s[j])) return 1;
    return 0;
}

static int all_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

/* Rows [q0, q0 + nq) into b: their queries packed or as float rows, the keys each sees (vis: a
 * row's keys start at the first), an empty state. acc_tile holds ACC_FLOATS. */
static void rows_begin(const attention_run *run, const attention_problem *p, const visibility *vis,
                       const void *q, void *out, float *acc_tile, size_t q0, size_t nq,
                       row_block *b) {
    const sdpa_attention_kernels *a = run->a;
    const size_t d_v = p->d_v, os = p->out_stride[2];
    b->q0 = q0, b->nq = nq, b->qs = 0, b->qb = NULL;
    b->packed = a->pack_q && nq >= 8 && p->d_k <= SDPA_ATTN_PACK_MAX_D;
    const sdpa_bf16_dot_kernels *pairs = b->packed ? run->bf16_dot : NULL;
    if (pairs)
        pairs->pack_q(b->qt.pairs, SDPA_ATTN_MAX_BLOCK_Q, (const uint16_t *)q + q0 * p->q_stride[2],
                      p->q_stride[2], nq, p->d_k);
    else
        b->qb = key_rows_as_floats(run->k, p->q_type, q, q0, nq, p->q_stride[2], p->d_k,
                                   run->wide ? (b->packed ? run->wide->kv : run->wide->q) : NULL,
                                   &b->qs);
    if (b->packed && !pairs) a->pack_q(b->qt.f, SDPA_ATTN_MAX_BLOCK_Q, b->qb, b->qs, nq, p->d_k);

    /* accumulate on the stack when the tile fits (always, for a 16-bit out: rows_max), else in
       the output rows themselves */
    b->acc = nq * d_v <= ACC_FLOATS ? acc_tile : (float *)out + q0 * os;
    b->ld_acc = b->acc == acc_tile ? d_v : os;
    b->kv_begin = b->all_see = SIZE_MAX;
    b->kv_end = b->all_from = 0;
    /* only with a window (a modifier): the one-row runs give causality's diagonal its bits */
    b->zeros_ok = vis->before >= 0 || vis->after > 0;
    for (size_t r = 0; r < nq; r++) {
        const size_t from = visibility_row_first(vis, q0 + r),
                     seen = visibility_row_end(vis, q0 + r);
        b->from[r] = from, b->visible[r] = seen;
        if (from < b->kv_begin) b->kv_begin = from;
        if (from > b->all_from) b->all_from = from;
        if (seen > b->kv_end) b->kv_end = seen;
        if (seen < b->all_see) b->all_see = seen;
        b->m[r] = -INFINITY, b->l[r] = 0.0, b->poisoned[r] = 0;
        memset(b->acc + r * b->ld_acc, 0, d_v * sizeof(float));
    }
}

/* The type of the 16-bit rows the typed entries read: K and V's own, or f16 for an 8-bit K/V,
 * which key_rows.c widens to f16 rows a block at a time (exactly: every fp8 value is an f16)
 * where the backend's fp8 entries, which need the f16 ones (kernels.h), do not read it. */
static uint32_t rows16_type(const attention_problem *p) {
    return sdpa_type_is_fp8(p->kv_type) ? SDPA_F16 : p->kv_type;
}

/* Whether the backend's typed entries (kernels.h) take this problem's 16-bit K (values 0: for
 * unpacked blocks) or V (values 1) as they are (8-bit: as f16 rows). */
static int typed(const attention_run *run, const attention_problem *p, int values) {
    const uint32_t t = rows16_type(p);
    return (t == SDPA_F16 || t == SDPA_BF16) &&
           (values ? p->d_v : p->d_k) <= SDPA_ATTN_TYPED_MAX_D &&
           (values ? run->a->pv_tile_typed[t] != NULL : run->a->scores_tile_typed[t] != NULL);
}

typedef void scores_typed_fn(float *s, size_t ld_s, const float *q, size_t q_stride, size_t nq,
                             const void *k, size_t k_stride, const void *ahead, size_t nk, size_t d,
                             float scale);
typedef void pv_typed_fn(float *acc, size_t ld_acc, const float *p, size_t ld_p, size_t nq,
                         size_t nk, const void *v, size_t v_stride, const void *ahead, size_t d_v);

/* The typed entries for rows of type t (key_rows_of's h rows): an 8-bit type's own, which widen
   its codes in their loads, or the 16-bit type's. */
static scores_typed_fn *scores_typed(const attention_run *run, uint32_t t) {
    return sdpa_type_is_fp8(t) ? run->a->scores_tile_fp8[t - SDPA_FP8_E4M3]
                               : run->a->scores_tile_typed[t];
}
static pv_typed_fn *pv_typed(const attention_run *run, uint32_t t) {
    return sdpa_type_is_fp8(t) ? run->a->pv_tile_fp8[t - SDPA_FP8_E4M3] : run->a->pv_tile_typed[t];
}

/* An unpacked block's scores, run by run (each score is its own dot, so runs give the bits of
   one call): the typed entry on the rows as they are (typed), scores_tile on float ones. */
static void scores_runs(const attention_run *run, const attention_problem *p, row_block *b,
                        const row_runs *k, int typed, size_t nk) {
    const size_t ld_s = run->keys_max;
    for (size_t i = 0; i < k->n && k->at[i] < nk; i++) {
        const size_t j = k->at[i], n = (k->at[i + 1] < nk ? k->at[i + 1] : nk) - j;
        if (typed)
            scores_typed(run, k->type)(b->s + j, ld_s, b->qb, b->qs, b->nq, k->row[i], k->stride,
                                       run_ahead(k, i, j + n), n, p->d_k, p->scale);
        else {
            key_rows_prefetch_next(k, i, p->d_k, 4);
            run->a->scores_tile(b->s + j, ld_s, b->qb, b->qs, b->nq, k->row[i], k->stride, n,
                                p->d_k, p->scale);
        }
    }
}

/* Whether a window's edge block [k0, k0 + nk) may take the fused path from its key j0: f32 rows
   read in place (no wide tiles), V's finite at the keys some row does not see (weight 0). */
static int edge_fuses(const attention_run *run, const attention_problem *p, const row_block *b,
                      const key_source *src, size_t k0, size_t j0, size_t nk) {
    if (!b->zeros_ok || run->wide) return 0;
    const void *v;
    key_source_run(src, 1, k0, nk, &v);
    const size_t a = b->all_from > k0 + j0 ? b->all_from - k0 : j0; /* [a, e): every row's */
    const size_t a_in = a < nk ? a : nk, e = b->all_see > k0 + a_in ? b->all_see - k0 : a_in;
    const size_t e_in = e < nk ? e : nk, vs = src->v_stride;
    return run->k->rows_finite((const float *)v + j0 * vs, vs, a_in - j0, p->d_v) &&
           run->k->rows_finite((const float *)v + e_in * vs, vs, nk - e_in, p->d_v);
}

/* A window's edge: -inf at b's pairs unseen from key k0 + b->skip, each row's max over the rest. */
static void edge_maxima(row_block *b, const stage_kernels *kn, size_t k0, size_t nk) {
    visibility_hide_keymajor(b->s, SDPA_ATTN_MAX_BLOCK_Q, b->from, b->visible, b->nq, k0, b->skip,
                             nk);
    score_stage_keymajor_max(b->s + b->skip * SDPA_ATTN_MAX_BLOCK_Q, SDPA_ATTN_MAX_BLOCK_Q, b->nq,
                             b->nq, nk - b->skip, b->m_new, kn);
}

/* The fused path's first half, where it applies: a packed block with a stage that removes no
   key, that every row sees whole or that is a window's edge (edge_fuses: from the multiple of 8
   at or before its first seen key, b->skip; exp_pv weighs the -inf of unseen pairs exactly 0),
   takes scores_max (and the stage on its tile) now and exp_pv in rows_values, unless a new row
   max would not be finite (+inf among the scores, or a row with nothing but -inf so far). */
static int scores_fused(const attention_run *run, const attention_problem *p, row_block *b,
                        const block_rows *kr, const key_source *src, const score_stage *stage,
                        size_t k0, size_t nk) {
    if (!b->packed || !run->exp_pv || !score_stage_keeps_keys(stage)) return 0;
    const int whole = b->all_from <= k0 && b->all_see >= k0 + nk;
    b->skip = whole || b->kv_begin <= k0 ? 0 : (b->kv_begin - k0) / 8 * 8;
    if (!whole && !edge_fuses(run, p, b, src, k0, b->skip, nk)) return 0;
    float *st = b->s + b->skip * SDPA_ATTN_MAX_BLOCK_Q;
    const size_t n = nk - b->skip;
    if (run->bf16_dot)
        run->bf16_dot->scores_max(st, SDPA_ATTN_MAX_BLOCK_Q, b->m_new, b->qt.pairs,
                                  SDPA_ATTN_MAX_BLOCK_Q, b->nq,
                                  (const uint16_t *)kr->h.row[0] + b->skip * kr->h.stride,
                                  kr->h.stride, n, p->d_k, p->scale);
    else
        run->a->scores_max(st, SDPA_ATTN_MAX_BLOCK_Q, b->m_new, b->qt.f, SDPA_ATTN_MAX_BLOCK_Q,
                           b->nq, (const float *)kr->f.row[0] + b->skip * kr->f.stride,
                           kr->f.stride, n, p->d_k, p->scale);
    const stage_kernels kn = stage_kernels_of(run->k, run->exp_sum);
    if (!score_stage_is_scale(stage)) { /* the stage on the tile, and its maxima */
        float scratch[SDPA_ATTN_MAX_BLOCK_KV * SDPA_ATTN_MAX_BLOCK_Q];
        score_stage_keymajor(stage, st, SDPA_ATTN_MAX_BLOCK_Q, b->nq, b->q0, b->nq, k0 + b->skip, n,
                             whole ? b->m_new : NULL, NULL, scratch, &kn);
    }
    if (!whole) edge_maxima(b, &kn, k0, nk);
    for (size_t r = 0; r < b->nq; r++) b->m_new[r] = b->m_new[r] > b->m[r] ? b->m_new[r] : b->m[r];
    return all_finite(b->m_new, b->nq);
}

/* The product: the block's scaled scores into b's tile, from key j0 on (packed blocks only; each
   score is its own dot, so the others are those of the whole block). */
static void scores_product(const attention_run *run, const attention_problem *p, row_block *b,
                           const block_rows *kr, size_t j0, size_t nk) {
    const size_t ld_s = run->keys_max;
    if (b->packed && run->bf16_dot)
        run->bf16_dot->scores_packed(b->s + j0, ld_s, b->qt.pairs, SDPA_ATTN_MAX_BLOCK_Q, b->nq,
                                     (const uint16_t *)kr->h.row[0] + j0 * kr->h.stride,
                                     kr->h.stride, nk - j0, p->d_k, p->scale);
    else if (b->packed)
        run->a->scores_packed(b->s + j0, ld_s, b->qt.f, SDPA_ATTN_MAX_BLOCK_Q, b->nq,
                              (const float *)kr->f.row[0] + j0 * kr->f.stride, kr->f.stride,
                              nk - j0, p->d_k, p->scale);
    else {
        scores_runs(run, p, b, run->typed_k ? &kr->h : &kr->f, run->typed_k, nk);
    }
}

/* The keys [k0 + *a, k0 + *e) of a block [k0, k0 + nk) that row r of b sees (none: *a >= *e). */
static void row_keys(const row_block *b, size_t r, size_t k0, size_t nk, size_t *a, size_t *e) {
    *a = b->from[r] > k0 ? b->from[r] - k0 : 0;
    *e = b->visible[r] > k0 ? b->visible[r] - k0 : 0;
    if (*e > nk) *e = nk;
}

/* Row r's scores of keys [k0 + a, k0 + a + n) through the stage, and its online softmax state: the
   block's max, a poisoned row (NaN), the accumulator rescaled when the max grows. Returns 0 if
   the stage removed a key. */
static int row_online(const attention_run *run, const attention_problem *p, row_block *b,
                      const score_stage *stage, size_t r, size_t k0, size_t a, size_t n) {
    float *s = b->s + r * run->keys_max + a, scratch[SDPA_ATTN_MAX_BLOCK_KV];
    const stage_kernels kn = stage_kernels_of(run->k, run->exp_sum);
    const int all = score_stage_row(stage, b->q0 + r, k0 + a, s, n, scratch, &kn);
    const float bm = run->k->max_scaled(s, n, 1.0f);
    if (isnan(bm) || (bm == -INFINITY && row_has_nan(s, n))) {
        b->poisoned[r] = 1;
        return all;
    }
    if (bm == -INFINITY) return all; /* nothing seen in this block */
    const float m_new = bm > b->m[r] ? bm : b->m[r];
    if (m_new > b->m[r] && b->m[r] != -INFINITY) {
        const float alpha = expf(b->m[r] - m_new);
        b->l[r] *= alpha;
        run->k->scale(b->acc + r * b->ld_acc, b->acc + r * b->ld_acc, p->d_v, alpha);
    }
    b->m[r] = m_new;
    b->live[r] = 1;
    return all;
}

/* The first half of a block of keys [k0, k0 + nk) for the rows of b: their scores, through the
 * stage, and the running max; the fused path (scores_fused) leaves the rest to rows_values,
 * every other block has its weights formed here. */
static void rows_scores(const attention_run *run, const attention_problem *p, row_block *b,
                        const block_rows *kr, const key_source *src, const score_stage *stage,
                        size_t k0, size_t nk) {
    const size_t nq = b->nq, ld_s = run->keys_max;
    if (scores_fused(run, p, b, kr, src, stage, k0, nk)) {
        b->step = STEP_FUSED;
        return;
    }
    b->step = STEP_ROWS;
    /* a window's first block: keys before every row's first take weight 0 (filled, below), and
       so are not formed, from a multiple of 4 on, so that pv_tile's chains keep each key's
       place (u keys a step) */
    const int fills = b->zeros_ok && run->exp_tile && score_stage_keeps_keys(stage);
    b->skip = fills && b->packed && b->kv_begin > k0 ? (b->kv_begin - k0) / 4 * 4 : 0;
    scores_product(run, p, b, kr, b->skip, nk);
    int simple = 1; /* every row sees every key of the block: one pv_tile for all rows */
    int kept = 1;   /* the stage removed no key */
    for (size_t r = 0; r < nq; r++) {
        size_t a, e;
        row_keys(b, r, k0, nk, &a, &e);
        b->live[r] = 0;
        if (a != 0 || e < nk) simple = 0;
        if (b->poisoned[r] || a >= e) continue;
        if (!row_online(run, p, b, stage, r, k0, a, e - a)) kept = simple = 0;
    }
    b->filled = 0;
    if (!simple && kept && fills) { /* a window's edge: -inf where unseen */
        for (size_t r = 0; r < nq; r++) {
            size_t a = nk, e = nk; /* a row that takes no weight: all of it (zeros later) */
            if (b->live[r]) row_keys(b, r, k0, nk, &a, &e);
            float *s = b->s + r * ld_s;
            for (size_t j = 0; j < a; j++) s[j] = -INFINITY;
            for (size_t j = e; j < nk; j++) s[j] = -INFINITY;
        }
        simple = b->filled = 1;
    }
    b->simple = simple;

    /* p = exp(s - m) and the row sums: one call for the tile when every row is full */
    if (simple && run->exp_tile) {
        float shift[SDPA_ATTN_MAX_BLOCK_Q], sums[SDPA_ATTN_MAX_BLOCK_Q];
        for (size_t r = 0; r < nq; r++) shift[r] = b->live[r] ? b->m[r] : 0.0f;
        run->exp_tile(b->s, ld_s, nq, nk, shift, sums);
        for (size_t r = 0; r < nq; r++)
            if (b->live[r]) b->l[r] += sums[r];
    } else {
        for (size_t r = 0; r < nq; r++) {
            size_t a = nk, e = nk; /* a row that takes no weight: all of it (zeros later) */
            if (b->live[r]) row_keys(b, r, k0, nk, &a, &e);
            float *s = b->s + r * ld_s + a;
            b->l[r] += run->exp_sum(s, s, e - a, 1.0f, b->m[r]);
        }
    }
}

/* pv_tile on the values [j, j + nk) of the block, run by run: the 16-bit rows through the
 * typed entry where vr has them, else the float rows. w is the weights of key j. Inline: a
 * decode calls it once a block of keys, beside kernels of a few hundred cycles. */
static inline __attribute__((always_inline)) void
values_pv(const attention_run *run, const attention_problem *p, float *acc, size_t ld_acc,
          const float *w, size_t ld_w, size_t nq, size_t nk, const block_rows *vr, size_t j) {
    const row_runs *v = vr->h.n ? &vr->h : &vr->f;
    const size_t end = j + nk, size = vr->h.n ? sdpa_type_size(vr->h.type) : 4;
    for (size_t i = 0; i < v->n && v->at[i] < end; i++) {
        size_t from;
        const size_t n = run_part(v, i, j, end, &from);
        if (!n) continue;
        const void *rows = (const char *)v->row[i] + (from - v->at[i]) * v->stride * size;
        if (vr->h.n)
            pv_typed(run, vr->h.type)(acc, ld_acc, w + (from - j), ld_w, nq, n, rows, v->stride,
                                      run_ahead(v, i, from + n), p->d_v);
        else {
            key_rows_prefetch_next(v, i, p->d_v, size);
            run->a->pv_tile(acc, ld_acc, w + (from - j), ld_w, nq, n, rows, v->stride, p->d_v);
        }
    }
}

/* The second half: the weights of rows_scores times the block of values vr into acc (its float
 * rows for the fused path, else the 16-bit rows with typed_v, else the float rows). */
static void rows_values(const attention_run *run, const attention_problem *p, row_block *b,
                        const block_rows *vr, const score_stage *stage, size_t k0, size_t nk) {
    const size_t nq = b->nq, ld_s = run->keys_max, d_v = p->d_v;
    float *s_tile = b->s;
    if (b->step == STEP_FUSED) {
        float alpha[SDPA_ATTN_MAX_BLOCK_Q], sums[SDPA_ATTN_MAX_BLOCK_Q];
        run->exp_pv(b->acc, b->ld_acc, s_tile + b->skip * SDPA_ATTN_MAX_BLOCK_Q,
                    SDPA_ATTN_MAX_BLOCK_Q, b->m, b->m_new, alpha, sums, nq, nk - b->skip,
                    (const float *)vr->f.row[0] + b->skip * vr->f.stride, vr->f.stride, d_v);
        for (size_t r = 0; r < nq; r++) {
            b->l[r] = b->l[r] * alpha[r] + sums[r];
            b->m[r] = b->m_new[r];
        }
        return;
    }
    if (b->simple && (!b->filled || block_rows_finite(run->k, vr, b->skip, nk, d_v))) {
        for (size_t r = 0; r < nq; r++) {
            float *s = s_tile + r * ld_s;
            if (!b->live[r]) {
                memset(s, 0, nk * sizeof(float));
            } else if (b->filled) { /* exactly 0, where the exp of -inf may leave a subnormal */
                size_t a, e;
                row_keys(b, r, k0, nk, &a, &e);
                memset(s, 0, a * sizeof(float));
                memset(s + e, 0, (nk - e) * sizeof(float));
            }
        }
        const size_t j0 = b->filled ? b->skip : 0;
        values_pv(run, p, b->acc, b->ld_acc, s_tile + j0, ld_s, nq, nk - j0, vr, j0);
        return;
    }
    /* Rows that leave keys out: only the runs of keys they see are summed, so a removed key's
       values are never multiplied (0 * NaN would be NaN). */
    for (size_t r = 0; r < nq; r++) {
        if (!b->live[r]) continue;
        size_t j, n;
        row_keys(b, r, k0, nk, &j, &n);
        const float *s = s_tile + r * ld_s;
        const size_t i = b->q0 + r;
        while (j < n) {
            if (score_stage_removes(stage, i, k0 + j)) {
                j++;
                continue;
            }
            size_t start = j;
            while (j < n && !score_stage_removes(stage, i, k0 + j)) j++;
            values_pv(run, p, b->acc + r * b->ld_acc, b->ld_acc, s + start, ld_s, 1, j - start, vr,
                      start);
        }
    }
}

/* The finished rows of b: normalised (a 16-bit out rounded once, from the float row), and their
 * log-sum-exps; or, with part_l (a split-KV chunk, f32 out), the state its merge takes: the rows
 * of acc as they are, the max m to lse and the sum l to part_l (NaN for a poisoned row). */
float attention_row_finish(const sdpa_kernels *k, float *o, const float *acc, size_t d_v, float m,
                           double l, float sink, float v_scale, int lse) {
    const double vs = v_scale != 0.0f ? v_scale : 1.0;
    if (isnan(l) || isnan(sink)) {
        for (size_t c = 0; c < d_v; c++) o[c] = NAN;
        return NAN;
    }
    if (l == 0.0) { /* no key: zeros, and the log of the sink's term alone */
        memset(o, 0, d_v * sizeof(float));
        return sink;
    }
    if (sink == -INFINITY) {
        k->scale(o, acc, d_v, (float)(vs / l));
        return lse ? (float)((double)m + log(l)) : 0.0f;
    }
    /* l e^m + e^sink, as e^hi (l e^(m - hi) + e^(sink - hi)) so that neither term overflows */
    const double hi = m > sink ? m : sink, w = exp((double)m - hi);
    const double den = l * w + exp((double)sink - hi);
    k->scale(o, acc, d_v, (float)(vs * w / den));
    return lse ? (float)(hi + log(den)) : 0.0f;
}

static void rows_end(const attention_run *run, const attention_problem *p, const row_block *b,
                     const score_stage *stage, void *out, float *lse, size_t lse_row,
                     float *part_l) {
    const size_t d_v = p->d_v, os = p->out_stride[2];
    const int narrow = p->out_type != SDPA_F32;
    for (size_t r = 0; r < b->nq; r++) {
        const size_t i = b->q0 + r;
        if (part_l) {
            float *o = (float *)out + i * os;
            if (o != b->acc + r * b->ld_acc) memcpy(o, b->acc + r * b->ld_acc, d_v * sizeof(float));
            lse[i * lse_row] = b->m[r];
            part_l[i] = b->poisoned[r] ? NAN : (float)b->l[r];
            continue;
        }
        float *o = narrow ? b->acc + r * b->ld_acc : (float *)out + i * os;
        const float row_lse = attention_row_finish(
            run->k, o, b->acc + r * b->ld_acc, d_v, b->m[r], b->poisoned[r] ? NAN : b->l[r],
            score_stage_sink(stage, i), p->v_scale, lse != NULL);
        if (narrow) run->k->narrow[p->out_type]((uint16_t *)out + i * os, o, d_v);
        if (lse) lse[i * lse_row] = row_lse;
    }
}

/* Share t of n_t, one with each block of keys, of the lines that would otherwise come from
   memory with nothing to hide behind: this unit's out rows, written at its end, and what its
   head's next unit reads first and this one does not, its query rows [q0 - nq, q0)
   (plan_forward_unit runs a head's blocks from its last rows) and, under a window, its keys
   before this unit's first (kv_begin). */
static void prefetch_ahead(const attention_problem *p, const visibility *vis, const void *q,
                           const key_source *src, const void *out, size_t q0, size_t nq,
                           size_t kv_begin, size_t t, size_t n_t) {
    const size_t qs = sdpa_type_size(p->q_type), os = sdpa_type_size(p->out_type);
    rows_prefetch((const char *)out + q0 * p->out_stride[2] * os, p->out_stride[2] * os,
                  p->d_v * os, t * nq / n_t, (t + 1) * nq / n_t, 1);
    const size_t n = q0 < nq ? q0 : nq;
    rows_prefetch((const char *)q + (q0 - n) * p->q_stride[2] * qs, p->q_stride[2] * qs,
                  p->d_k * qs, t * n / n_t, (t + 1) * n / n_t, 0);
    const size_t from = n ? visibility_row_first(vis, q0 - n) : kv_begin;
    if (from < kv_begin && from < visibility_row_end(vis, q0 - n)) { /* keys that row reads */
        const size_t keys = kv_begin - from, a = t * keys / n_t;
        key_source_prefetch(src, from + a, (t + 1) * keys / n_t - a);
    }
}

/* Query rows [q0, q0 + nq) of one head against all the keys they see (vis), in blocks of
 * run->rows_max rows (at most ROW_BLOCKS of them; more than one only with the wide tiles, which
 * hold the others' state): each block of keys, and of values, is read (widened) once for all of
 * them. */
void attention_block(const attention_run *run, const attention_problem *p, const visibility *vis,
                     const void *q, const key_source *src, const score_stage *stage, void *out,
                     float *lse, size_t lse_row, float *part_l, size_t q0, size_t nq) {
    const size_t block_kv = run->keys_max;
    row_block first;
    _Alignas(64) float acc_tile[ACC_FLOATS];
    row_block *blocks[ROW_BLOCKS] = {&first};
    size_t n_blocks = 0, kv_begin = SIZE_MAX, kv_end = 0;
    for (size_t r0 = 0; r0 < nq; r0 += run->rows_max, n_blocks++) {
        if (n_blocks) blocks[n_blocks] = &run->wide->more[n_blocks - 1];
        const size_t n = nq - r0 < run->rows_max ? nq - r0 : run->rows_max;
        rows_begin(run, p, vis, q, out, n_blocks ? run->wide->more_acc[n_blocks - 1] : acc_tile,
                   q0 + r0, n, blocks[n_blocks]);
        if (blocks[n_blocks]->kv_end > kv_end) kv_end = blocks[n_blocks]->kv_end;
        if (blocks[n_blocks]->kv_begin < kv_begin) kv_begin = blocks[n_blocks]->kv_begin;
    }
    /* the bf16 dot reads K as it is for packed blocks, typed_k for unpacked ones; any other
       block needs float rows */
    const int tk = run->typed_k, tv = run->typed_v;
    int raw = 0, floats = 0, packed = 0; /* packed kernels take one run of keys */
    for (size_t i = 0; i < n_blocks; i++) {
        const int as_is = blocks[i]->packed ? run->bf16_dot != NULL : tk;
        raw |= as_is;
        floats |= !as_is;
        packed |= blocks[i]->packed;
    }
    /* blocks of keys on the grid of block_kv from the call's key 0, so that the blocks a row
       meets do not depend on its neighbours' windows */
    const size_t k_first = kv_begin / block_kv * block_kv;
    const size_t n_kb = (kv_end - k_first + block_kv - 1) / block_kv;
    for (size_t k0 = k_first; k0 < kv_end; k0 += block_kv) {
        const size_t nk = kv_end - k0 < block_kv ? kv_end - k0 : block_kv;
        if (q0) /* a head's first rows (decode's only ones) have no unit after them */
            prefetch_ahead(p, vis, q, src, out, q0, nq, kv_begin, (k0 - k_first) / block_kv, n_kb);
        block_rows kr, vr;
        key_rows_of(run->k, src, 0, k0, nk, floats, raw, packed, run->wide ? run->wide->kv : NULL,
                    run->wide ? run->wide->kv16 : NULL, &kr);
        for (size_t i = 0; i < n_blocks; i++) {
            row_block *b = blocks[i];
            b->step = STEP_NONE;
            if (k0 < b->kv_end && k0 + nk > b->kv_begin)
                rows_scores(run, p, b, &kr, src, stage, k0,
                            b->kv_end - k0 < nk ? b->kv_end - k0 : nk);
        }
        /* V as float rows for the fused path (exp_pv), and where it is not typed_v */
        int fused = 0;
        for (size_t i = 0; i < n_blocks; i++) fused |= blocks[i]->step == STEP_FUSED;
        key_rows_of(run->k, src, 1, k0, nk, fused || !tv, tv, fused,
                    run->wide ? run->wide->kv : NULL, run->wide ? run->wide->kv16 : NULL, &vr);
        for (size_t i = 0; i < n_blocks; i++)
            if (blocks[i]->step != STEP_NONE)
                rows_values(run, p, blocks[i], &vr, stage, k0,
                            blocks[i]->kv_end - k0 < nk ? blocks[i]->kv_end - k0 : nk);
    }
    for (size_t i = 0; i < n_blocks; i++)
        rows_end(run, p, blocks[i], stage, out, lse, lse_row, part_l);
}

int attention_run_init(attention_run *run, const attention_problem *p) {
    run->k = sdpa_kernels_now();
    run->a = run->k->attention;
    const int exp_kind = sdpa_exp_with(run->k);
    run->exp_sum = run->k->exp_sum[exp_kind];
    run->exp_tile = run->a->exp_tile[exp_kind];
    run->exp_pv = run->a->scores_max ? run->a->exp_pv[exp_kind] : NULL;
    run->wide = NULL;
    run->bf16_dot =
        p->q_type == SDPA_BF16 && p->kv_type == SDPA_BF16 ? sdpa_bf16_dot_for(run->k) : NULL;
    run->rows_max = run->a->block_q;
    run->keys_max = run->a->block_kv;
    run->typed_k = typed(run, p, 0), run->typed_v = typed(run, p, 1);
    /* a paged block gathers across pages into the wide tiles */
    const int wide =
        p->q_type != SDPA_F32 || p->kv_type != SDPA_F32 || p->out_type != SDPA_F32 || p->pages;
    if (wide) {
        const size_t d = p->d_k > p->d_v ? p->d_k : p->d_v; /* <= SDPA_WIDE_FLOATS (checked) */
        if (p->q_type != SDPA_F32 && run->rows_max > SDPA_WIDE_FLOATS / p->d_k)
            run->rows_max = SDPA_WIDE_FLOATS / p->d_k;
        if (p->out_type != SDPA_F32 && run->rows_max > ACC_FLOATS / p->d_v)
            run->rows_max = ACC_FLOATS / p->d_v;
        if ((p->kv_type != SDPA_F32 || p->pages) && run->keys_max > SDPA_WIDE_FLOATS / d)
            run->keys_max = SDPA_WIDE_FLOATS / d;
    }
    return wide;
}

/* fn with a 16-bit view's widening tiles on the stack of the thread that runs it, in a frame of
   its own that an f32 call never makes */
static __attribute__((noinline)) void call_wide(block_fn fn, const attention_run *base,
                                                const void *ctx, size_t index) {
    wide_tiles wide;
    attention_run run = *base;
    run.wide = &wide;
    fn(&run, ctx, index);
}

void attention_with_tiles(block_fn fn, const attention_run *base, int wide, const void *ctx,
                          size_t index) {
    if (wide)
        call_wide(fn, base, ctx, index);
    else
        fn(base, ctx, index);
}
