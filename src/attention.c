/* Attention entry points and the tiling driver shared by every backend.
 *
 * For each (batch, query head) and each block of block_q query rows, K and V are streamed in
 * blocks of block_kv keys (FlashAttention's order): the backend's scores_tile forms the scaled
 * scores of the block in a small stack tile, the online softmax updates each row's running max
 * m and sum l (rescaling the row's accumulator by exp(m_old - m_new) when the max grows), and
 * pv_tile adds the weights times the block of V into the accumulator. The accumulator is a
 * stack tile (or, for d_v > 256, the output rows themselves); each row is divided by l at the
 * end. Causal blocks above the diagonal are never visited.
 *
 * Views of a 16-bit type are widened to float a block at a time (the backend's widen), so every
 * microkernel works in float: the block's queries once, each block of keys before its scores
 * and the same block of values before P V, once for all the blocks of rows a unit holds (two
 * for a 16-bit K/V prefill, ROW_BLOCKS); a 16-bit out is rounded once, from the finished float
 * row. Where the backend's bf16 dot add-on is on (kernels.h, sdpa_bf16_dot_kernels) and Q
 * and K are both bf16, the packed path forms Q.K from them as they are, and only V is widened.
 * Where the backend has typed entries (kernels.h, scores_tile_typed and pv_tile_typed), the
 * unpacked blocks (fewer than 8 rows: decode) read 16-bit K as it is, and every P V step but the
 * fused one reads 16-bit V so, each vector widened in registers: widened first, each element
 * would be stored and loaded again for only nq FMAs. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attention_problem.h"
#include "dispatch.h"
#include "error.h"
#include "plan.h"
#include "sdpa.h"
#include "sizes.h"
#include "threads.h"
#include "visibility.h"

#if defined(__AVX__) || defined(__SSE4_1__)
#error "src/attention.c must be compiled for the baseline ISA, without -m flags"
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
    size_t kv_end;  /* keys seen by the last (widest) row */
    size_t all_see; /* keys seen by every row (the first, under causality) */
    enum { STEP_NONE, STEP_FUSED, STEP_ROWS } step; /* what the scores of a block left for P V */
    int simple; /* STEP_ROWS: every row sees every key of the block */
    float m[SDPA_ATTN_MAX_BLOCK_Q], m_new[SDPA_ATTN_MAX_BLOCK_Q];
    double l[SDPA_ATTN_MAX_BLOCK_Q];
    size_t visible[SDPA_ATTN_MAX_BLOCK_Q]; /* keys row r sees: [0, visible[r]) */
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
    /* the row blocks past the first that share each widened block of keys and values */
    row_block more[ROW_BLOCKS - 1];
    float more_acc[ROW_BLOCKS - 1][ACC_FLOATS];
} wide_tiles;

/* ---- the driver ---- */

/* Kernels and per-call constants of one run. */
typedef struct attention_run {
    const sdpa_kernels *k;
    const sdpa_attention_kernels *a;
    size_t rows_max, keys_max; /* a block's queries and keys: the table's tile, or fewer where a
                                  16-bit view's widened rows must fit SDPA_WIDE_FLOATS */
    wide_tiles *wide;          /* NULL when every view is f32 */
    const sdpa_bf16_dot_kernels *bf16_dot; /* bf16 Q and K and the add-on on; else NULL */
    float (*exp_sum)(float *y, const float *x, size_t n, float scale, float shift);
    void (*exp_tile)(float *s, size_t ld_s, size_t nq, size_t nk, const float *shift, float *sums);
    void (*exp_pv)(float *acc, size_t ld_acc, float *st, const float *m, const float *m_new,
                   float *alpha, float *sums, size_t nq, size_t nk, const float *v, size_t v_stride,
                   size_t d_v);
} attention_run;

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

/* Rows [r0, r0 + n) of a view, `stride` elements apart, as float rows of `row` floats: in place
 * for f32, else widened into tile */
static const float *float_rows(const attention_run *run, uint32_t type, const void *base, size_t r0,
                               size_t n, size_t stride, size_t row, float *tile,
                               size_t *float_stride) {
    if (type == SDPA_F32) {
        *float_stride = stride;
        return (const float *)base + r0 * stride;
    }
    const uint16_t *src = (const uint16_t *)base + r0 * stride;
    if (stride == row || n == 1) {
        run->k->widen[type](tile, src, n * row);
    } else {
        for (size_t i = 0; i < n; i++) run->k->widen[type](tile + i * row, src + i * stride, row);
    }
    *float_stride = row;
    return tile;
}

/* The block of values [k0, k0 + nk) as float rows, and their stride */
static const float *value_rows(const attention_run *run, const attention_problem *p, const void *v,
                               size_t k0, size_t nk, size_t *stride) {
    return float_rows(run, p->kv_type, v, k0, nk, p->v_stride[2], p->d_v,
                      run->wide ? run->wide->kv : NULL, stride);
}

/* Rows [q0, q0 + nq) into b: their queries packed or as float rows, the keys each sees (vis: a
 * row's keys start at the first), an empty state. acc_tile holds ACC_FLOATS. */
static void rows_begin(const attention_run *run, const attention_problem *p, const visibility *vis,
                       const void *q, void *out, float *acc_tile, size_t q0, size_t nq,
                       row_block *b) {
    const sdpa_attention_kernels *a = run->a;
    const size_t d_v = p->d_v, os = p->out_stride[2];
    b->q0 = q0;
    b->nq = nq;
    b->packed = a->pack_q && nq >= 8 && p->d_k <= SDPA_ATTN_PACK_MAX_D;
    const sdpa_bf16_dot_kernels *pairs = b->packed ? run->bf16_dot : NULL;
    b->qs = 0;
    b->qb = NULL;
    if (pairs)
        pairs->pack_q(b->qt.pairs, (const uint16_t *)q + q0 * p->q_stride[2], p->q_stride[2], nq,
                      p->d_k);
    else
        b->qb = float_rows(run, p->q_type, q, q0, nq, p->q_stride[2], p->d_k,
                           run->wide ? (b->packed ? run->wide->kv : run->wide->q) : NULL, &b->qs);
    if (b->packed && !pairs) a->pack_q(b->qt.f, b->qb, b->qs, nq, p->d_k);

    /* accumulate on the stack when the tile fits (always, for a 16-bit out: rows_max), else in
       the output rows themselves */
    b->acc = nq * d_v <= ACC_FLOATS ? acc_tile : (float *)out + q0 * os;
    b->ld_acc = b->acc == acc_tile ? d_v : os;
    b->kv_end = 0;
    b->all_see = SIZE_MAX;
    for (size_t r = 0; r < nq; r++) {
        const size_t seen = visibility_row_end(vis, q0 + r);
        b->visible[r] = seen;
        if (seen > b->kv_end) b->kv_end = seen;
        if (seen < b->all_see) b->all_see = seen;
        b->m[r] = -INFINITY;
        b->l[r] = 0.0;
        b->poisoned[r] = 0;
        memset(b->acc + r * b->ld_acc, 0, d_v * sizeof(float));
    }
}

/* Whether the backend's typed entries (kernels.h) take this problem's 16-bit K (for unpacked
 * blocks) and V as they are. */
static int typed_k(const attention_run *run, const attention_problem *p) {
    return p->kv_type != SDPA_F32 && p->d_k <= SDPA_ATTN_TYPED_MAX_D &&
           run->a->scores_tile_typed[p->kv_type];
}
static int typed_v(const attention_run *run, const attention_problem *p) {
    return p->kv_type != SDPA_F32 && p->d_v <= SDPA_ATTN_TYPED_MAX_D &&
           run->a->pv_tile_typed[p->kv_type];
}

/* The first half of a block of keys [k0, k0 + nk) for the rows of b: their scores, and the
 * running max. A block every row sees whole, with no mask, takes the fused path (scores_max now,
 * exp_pv in rows_values) unless a new row max would not be finite (+inf among the scores, or a
 * row with nothing but -inf so far); every other block has its weights formed here. K is kb,
 * float rows ks apart, or kb16, the 16-bit rows themselves, for a packed block with the bf16 dot
 * and an unpacked one with typed_k. */
static void rows_scores(const attention_run *run, const attention_problem *p, row_block *b,
                        const float *kb, const uint16_t *kb16, size_t ks, const float *mask,
                        size_t mask_row, size_t k0, size_t nk) {
    const sdpa_attention_kernels *a = run->a;
    const sdpa_bf16_dot_kernels *pairs = b->packed ? run->bf16_dot : NULL;
    const size_t nq = b->nq, ld_s = run->keys_max;
    float *s_tile = b->s;
    if (b->packed && run->exp_pv && !mask && b->all_see >= k0 + nk) {
        if (pairs)
            pairs->scores_max(s_tile, b->m_new, b->qt.pairs, nq, kb16, p->k_stride[2], nk, p->d_k,
                              p->scale);
        else
            a->scores_max(s_tile, b->m_new, b->qt.f, nq, kb, ks, nk, p->d_k, p->scale);
        for (size_t r = 0; r < nq; r++) b->m_new[r] = b->m_new[r] > b->m[r] ? b->m_new[r] : b->m[r];
        if (all_finite(b->m_new, nq)) {
            b->step = STEP_FUSED;
            return;
        }
    }
    b->step = STEP_ROWS;
    if (pairs)
        pairs->scores_packed(s_tile, ld_s, b->qt.pairs, nq, kb16, p->k_stride[2], nk, p->d_k,
                             p->scale);
    else if (b->packed)
        a->scores_packed(s_tile, ld_s, b->qt.f, nq, kb, ks, nk, p->d_k, p->scale);
    else if (typed_k(run, p))
        a->scores_tile_typed[p->kv_type](s_tile, ld_s, b->qb, b->qs, nq, kb16, p->k_stride[2], nk,
                                         p->d_k, p->scale);
    else
        a->scores_tile(s_tile, ld_s, b->qb, b->qs, nq, kb, ks, nk, p->d_k, p->scale);

    int simple = 1; /* every row sees every key of the block: one pv_tile for all rows */
    for (size_t r = 0; r < nq; r++) {
        float *s = s_tile + r * ld_s;
        size_t n = b->visible[r] > k0 ? b->visible[r] - k0 : 0;
        if (n > nk) n = nk;
        b->live[r] = 0;
        if (n < nk) simple = 0;
        if (b->poisoned[r] || n == 0) continue;
        if (mask) {
            const float *mr = mask + (b->q0 + r) * mask_row + k0;
            for (size_t j = 0; j < n; j++) {
                if (mr[j] == -INFINITY) {
                    s[j] = -INFINITY;
                    simple = 0;
                } else {
                    s[j] += mr[j];
                }
            }
        }
        float bm = run->k->max_scaled(s, n, 1.0f);
        if (isnan(bm) || (bm == -INFINITY && row_has_nan(s, n))) {
            b->poisoned[r] = 1;
            continue;
        }
        if (bm == -INFINITY) continue; /* nothing seen in this block */
        float m_new = bm > b->m[r] ? bm : b->m[r];
        if (m_new > b->m[r] && b->m[r] != -INFINITY) {
            float alpha = expf(b->m[r] - m_new);
            b->l[r] *= alpha;
            run->k->scale(b->acc + r * b->ld_acc, b->acc + r * b->ld_acc, p->d_v, alpha);
        }
        b->m[r] = m_new;
        b->live[r] = 1;
    }
    b->simple = simple;

    /* p = exp(s - m) and the row sums: one call for the tile when every row is full */
    if (simple && run->exp_tile) {
        float shift[SDPA_ATTN_MAX_BLOCK_Q], sums[SDPA_ATTN_MAX_BLOCK_Q];
        for (size_t r = 0; r < nq; r++) shift[r] = b->live[r] ? b->m[r] : 0.0f;
        run->exp_tile(s_tile, ld_s, nq, nk, shift, sums);
        for (size_t r = 0; r < nq; r++)
            if (b->live[r]) b->l[r] += sums[r];
    } else {
        for (size_t r = 0; r < nq; r++) {
            if (!b->live[r]) continue;
            size_t n = b->visible[r] - k0 < nk ? b->visible[r] - k0 : nk;
            float *s = s_tile + r * ld_s;
            b->l[r] += run->exp_sum(s, s, n, 1.0f, b->m[r]);
        }
    }
}

/* pv_tile on the values from key j of the block: vb's float rows, vs apart, or vb16's 16-bit
 * rows through the typed entry */
static void values_pv(const attention_run *run, const attention_problem *p, float *acc,
                      size_t ld_acc, const float *w, size_t ld_w, size_t nq, size_t nk,
                      const float *vb, const uint16_t *vb16, size_t vs, size_t j) {
    if (vb16)
        run->a->pv_tile_typed[p->kv_type](acc, ld_acc, w, ld_w, nq, nk, vb16 + j * p->v_stride[2],
                                          p->v_stride[2], p->d_v);
    else
        run->a->pv_tile(acc, ld_acc, w, ld_w, nq, nk, vb + j * vs, vs, p->d_v);
}

/* The second half: the weights of rows_scores times the block of values into acc: vb, float
 * rows vs apart (NULL unless a block took the fused path or V is not typed_v), or vb16, the
 * 16-bit rows themselves (with typed_v). */
static void rows_values(const attention_run *run, const attention_problem *p, row_block *b,
                        const float *vb, const uint16_t *vb16, size_t vs, const float *mask,
                        size_t mask_row, size_t k0, size_t nk) {
    const size_t nq = b->nq, ld_s = run->keys_max, d_v = p->d_v;
    float *s_tile = b->s;
    if (b->step == STEP_FUSED) {
        float alpha[SDPA_ATTN_MAX_BLOCK_Q], sums[SDPA_ATTN_MAX_BLOCK_Q];
        run->exp_pv(b->acc, b->ld_acc, s_tile, b->m, b->m_new, alpha, sums, nq, nk, vb, vs, d_v);
        for (size_t r = 0; r < nq; r++) {
            b->l[r] = b->l[r] * alpha[r] + sums[r];
            b->m[r] = b->m_new[r];
        }
        return;
    }
    if (b->simple) {
        for (size_t r = 0; r < nq; r++)
            if (!b->live[r]) memset(s_tile + r * ld_s, 0, nk * sizeof(float));
        values_pv(run, p, b->acc, b->ld_acc, s_tile, ld_s, nq, nk, vb, vb16, vs, 0);
        return;
    }
    /* Rows that leave keys out: only the runs of keys they see are summed, so a removed key's
       values are never multiplied (0 * NaN would be NaN). */
    for (size_t r = 0; r < nq; r++) {
        if (!b->live[r]) continue;
        size_t n = b->visible[r] - k0 < nk ? b->visible[r] - k0 : nk;
        const float *s = s_tile + r * ld_s;
        const float *mr = mask ? mask + (b->q0 + r) * mask_row + k0 : NULL;
        size_t j = 0;
        while (j < n) {
            if (mr && mr[j] == -INFINITY) {
                j++;
                continue;
            }
            size_t start = j;
            while (j < n && !(mr && mr[j] == -INFINITY)) j++;
            values_pv(run, p, b->acc + r * b->ld_acc, b->ld_acc, s + start, ld_s, 1, j - start, vb,
                      vb16, vs, start);
        }
    }
}

/* The finished rows of b: normalised (a 16-bit out rounded once, from the float row), and their
 * log-sum-exps; or, with part_l (a split-KV chunk, f32 out), the state its merge takes: the rows
 * of acc as they are, the max m to lse and the sum l to part_l (NaN for a poisoned row). */
static void rows_end(const attention_run *run, const attention_problem *p, const row_block *b,
                     void *out, float *lse, size_t lse_row, float *part_l) {
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
        float row_lse;
        if (b->poisoned[r] || isnan(b->l[r])) {
            for (size_t c = 0; c < d_v; c++) o[c] = NAN;
            row_lse = NAN;
        } else if (b->l[r] == 0.0) {
            memset(o, 0, d_v * sizeof(float));
            row_lse = -INFINITY;
        } else {
            run->k->scale(o, b->acc + r * b->ld_acc, d_v, (float)(1.0 / b->l[r]));
            row_lse = (float)((double)b->m[r] + log(b->l[r]));
        }
        if (narrow) run->k->narrow[p->out_type]((uint16_t *)out + i * os, o, d_v);
        if (lse) lse[i * lse_row] = row_lse;
    }
}

/* Query rows [q0, q0 + nq) of one head against all the keys they see (vis), in blocks of
 * run->rows_max rows (at most ROW_BLOCKS of them; more than one only with the wide tiles, which
 * hold the others' state): each block of keys, and of values, is read (widened) once for all of
 * them. */
static void attention_block(const attention_run *run, const attention_problem *p,
                            const visibility *vis, const void *q, const void *k, const void *v,
                            const float *mask, size_t mask_row, void *out, float *lse,
                            size_t lse_row, float *part_l, size_t q0, size_t nq) {
    const size_t block_kv = run->keys_max;
    row_block first;
    float acc_tile[ACC_FLOATS];
    row_block *blocks[ROW_BLOCKS] = {&first};
    size_t n_blocks = 0, kv_end = 0;
    for (size_t r0 = 0; r0 < nq; r0 += run->rows_max, n_blocks++) {
        if (n_blocks) blocks[n_blocks] = &run->wide->more[n_blocks - 1];
        const size_t n = nq - r0 < run->rows_max ? nq - r0 : run->rows_max;
        rows_begin(run, p, vis, q, out, n_blocks ? run->wide->more_acc[n_blocks - 1] : acc_tile,
                   q0 + r0, n, blocks[n_blocks]);
        if (blocks[n_blocks]->kv_end > kv_end) kv_end = blocks[n_blocks]->kv_end;
    }
    /* the bf16 dot reads K as it is for packed blocks, typed_k for unpacked ones; any other
       block needs float rows */
    const int tk = typed_k(run, p), tv = typed_v(run, p);
    int raw = 0, floats = 0;
    for (size_t i = 0; i < n_blocks; i++) {
        const int as_is = blocks[i]->packed ? run->bf16_dot != NULL : tk;
        raw |= as_is;
        floats |= !as_is;
    }
    for (size_t k0 = 0; k0 < kv_end; k0 += block_kv) {
        const size_t nk = kv_end - k0 < block_kv ? kv_end - k0 : block_kv;
        size_t ks = p->k_stride[2], vs = p->v_stride[2];
        const uint16_t *kb16 = raw ? (const uint16_t *)k + k0 * p->k_stride[2] : NULL;
        const float *kb = floats ? float_rows(run, p->kv_type, k, k0, nk, p->k_stride[2], p->d_k,
                                              run->wide ? run->wide->kv : NULL, &ks)
                                 : NULL;
        for (size_t i = 0; i < n_blocks; i++) {
            row_block *b = blocks[i];
            b->step = STEP_NONE;
            if (k0 < b->kv_end)
                rows_scores(run, p, b, kb, kb16, ks, mask, mask_row, k0,
                            b->kv_end - k0 < nk ? b->kv_end - k0 : nk);
        }
        /* V as float rows for the fused path (exp_pv), and where it is not typed_v */
        int fused = 0;
        for (size_t i = 0; i < n_blocks; i++) fused |= blocks[i]->step == STEP_FUSED;
        const float *vb = fused || !tv ? value_rows(run, p, v, k0, nk, &vs) : NULL;
        const uint16_t *vb16 = tv ? (const uint16_t *)v + k0 * p->v_stride[2] : NULL;
        for (size_t i = 0; i < n_blocks; i++)
            if (blocks[i]->step != STEP_NONE)
                rows_values(run, p, blocks[i], vb, vb16, vs, mask, mask_row, k0,
                            blocks[i]->kv_end - k0 < nk ? blocks[i]->kv_end - k0 : nk);
    }
    for (size_t i = 0; i < n_blocks; i++) rows_end(run, p, blocks[i], out, lse, lse_row, part_l);
}

/* base + index elements of type t */
static const void *element(const void *base, size_t index, uint32_t t) {
    return (const char *)base + index * sdpa_type_size(t);
}

/* ---- tasks ----
 *
 * A call's work is cut by plan.h, from its shape alone. Every task writes rows no other task
 * writes, and the chunks' partial results are merged in key order on the calling thread, so the
 * bits never depend on which thread ran what, or how many there were. */

/* A call: its kernels, its plan (plan.h) and the workspace its tasks share. */
typedef struct forward_call {
    attention_run run; /* with no wide tiles: a task that needs them makes its own */
    int wide;          /* a view is 16-bit */
    const attention_problem *p;
    forward_plan f;
    float *workspace; /* the split's partials, f.workspace floats */
} forward_call;

/* One unit: its rows as attention_block takes them. */
typedef struct unit {
    attention_problem sub; /* the problem of its head (grouped: its query heads as rows) */
    const void *q, *k, *v; /* of their views' types */
    const float *mask;
    size_t mask_row;
    void *out;
    float *lse;
    size_t lse_row, q0, nq;
} unit;

static void unit_of(const forward_call *pl, size_t u, unit *x) {
    const attention_problem *p = pl->p;
    plan_unit pu;
    plan_forward_unit(&pl->f, p, u, &pu);
    const size_t b = pu.batch, h = pu.head, hk = pu.kv_head;
    x->sub = *p;
    x->q0 = pu.q0;
    x->nq = pu.nq;
    if (pl->f.grouped) {
        /* the rows are query heads; with one query row, causal masking removes nothing */
        x->sub.causal = 0;
        x->sub.q_stride[2] = p->q_stride[1];
        x->sub.out_stride[2] = p->out_stride[1];
        x->sub.len_q = pu.nq;
        x->mask_row = p->mask_stride[1];
        x->lse_row = p->lse_stride[1];
    } else {
        x->mask_row = p->mask_stride[2];
        x->lse_row = 1;
    }
    x->q = element(p->q, b * p->q_stride[0] + h * p->q_stride[1], p->q_type);
    x->k = element(p->k, b * p->k_stride[0] + hk * p->k_stride[1], p->kv_type);
    x->v = element(p->v, b * p->v_stride[0] + hk * p->v_stride[1], p->kv_type);
    x->mask = p->mask ? p->mask + b * p->mask_stride[0] + h * p->mask_stride[1] : NULL;
    x->out = (void *)element(p->out, b * p->out_stride[0] + h * p->out_stride[1], p->out_type);
    x->lse = p->lse ? p->lse + b * p->lse_stride[0] + h * p->lse_stride[1] : NULL;
}

static void unit_run(const attention_run *run, const forward_call *pl, size_t u) {
    unit x;
    unit_of(pl, u, &x);
    const visibility vis = visibility_of(&x.sub);
    attention_block(run, &x.sub, &vis, x.q, x.k, x.v, x.mask, x.mask_row, x.out, x.lse, x.lse_row,
                    NULL, x.q0, x.nq);
}

typedef void (*run_fn)(const attention_run *run, const forward_call *pl, size_t index);

/* fn with a 16-bit view's widening tiles on the stack of the thread that runs it, in a frame of
   its own that an f32 call never makes */
static __attribute__((noinline)) void call_wide(run_fn fn, const forward_call *pl, size_t index) {
    wide_tiles wide;
    attention_run run = pl->run;
    run.wide = &wide;
    fn(&run, pl, index);
}

static void call_run(run_fn fn, const forward_call *pl, size_t index) {
    if (pl->wide)
        call_wide(fn, pl, index);
    else
        fn(&pl->run, pl, index);
}

static void unit_task(void *arg, size_t u) { call_run(unit_run, arg, u); }

/* (out, lse) <- the merge of (out, lse) and (b, lse_b), rows x d_v, as sdpa.h states for
   sdpa_attention_merge_f32; lse and lse_b are contiguous. In float with the backend's own
   scale and P V kernels. (Split-KV merges its chunks' unnormalised state instead: merge_state.) */
static void merge_rows(const sdpa_kernels *k, float *out, size_t out_row, float *lse,
                       const float *b, size_t b_row, const float *lse_b, size_t rows, size_t d_v) {
    for (size_t r = 0; r < rows; r++) {
        float *o = out + r * out_row;
        const float *ob = b + r * b_row;
        const float la = lse[r], lb = lse_b[r];
        if (lb == -INFINITY) { /* b saw no key; if a saw none either, the row is zeros */
            if (la == -INFINITY) memset(o, 0, d_v * sizeof(float));
            continue;
        }
        if (la == -INFINITY) {
            if (o != ob) memcpy(o, ob, d_v * sizeof(float));
            lse[r] = lb;
            continue;
        }
        if (isnan(la) || isnan(lb) || la == INFINITY || lb == INFINITY) {
            for (size_t c = 0; c < d_v; c++) o[c] = NAN;
            lse[r] = NAN;
            continue;
        }
        /* the larger part has weight 1, the other w = exp(lo - hi) <= 1 */
        const int a_larger = la >= lb;
        const float hi = a_larger ? la : lb, lo = a_larger ? lb : la;
        const float w = expf(lo - hi), inv = 1.0f / (1.0f + w);
        if (w == 0.0f) { /* the smaller part drops out whole: never 0 times its rows */
            if (!a_larger) {
                if (o != ob) memcpy(o, ob, d_v * sizeof(float));
                lse[r] = lb;
            }
            continue;
        }
        const float ca = a_larger ? inv : w * inv, cb = a_larger ? w * inv : inv;
        lse[r] = hi + log1pf(w);
        if (o == ob) continue; /* a part merged with itself: the same rows */
        k->scale(o, o, d_v, ca);
        k->attention->pv_tile(o, d_v, &cb, 1, 1, 1, ob, d_v, d_v);
    }
}

/* Unit x's rows over the keys of chunk c, as rows_end leaves a chunk: its rows of acc to out
   (out_row floats apart), each row's max to m[r] and sum to l[r]. */
static void chunk_run(const attention_run *run, const forward_call *pl, const unit *x, size_t c,
                      float *out, size_t out_row, float *m, float *l) {
    const attention_problem *p = pl->p;
    size_t begin, end;
    plan_forward_chunk(&pl->f, p, c, &begin, &end);
    const visibility whole = visibility_of(&x->sub);
    const visibility vis = visibility_keys(&whole, begin, end - begin);
    attention_problem sub = x->sub; /* the chunk's keys; which of them each row sees is vis */
    sub.len_kv = end - begin;
    sub.out_stride[2] = out_row;
    attention_block(run, &sub, &vis, x->q, element(x->k, begin * p->k_stride[2], p->kv_type),
                    element(x->v, begin * p->v_stride[2], p->kv_type),
                    x->mask ? x->mask + begin : NULL, x->mask_row, out, m, 1, l, 0, x->nq);
}

/* Chunk b's state (rows b, b_row floats apart, maxima mb, sums lb) into a's (rows a, maxima ma,
   sums la), rows x d_v, unnormalised, as the online softmax takes a block of keys: the part with
   the smaller max is scaled by exp(its max - the larger), and a part whose factor is 0 drops
   out whole (never 0 times its rows, which may hold inf). A NaN sum (a poisoned row) or a max of
   +inf makes the row NaN. */
static void merge_state(const sdpa_kernels *k, float *a, size_t a_row, float *ma, float *la,
                        const float *b, size_t b_row, const float *mb, const float *lb, size_t rows,
                        size_t d_v) {
    static const float one = 1.0f;
    for (size_t r = 0; r < rows; r++) {
        float *o = a + r * a_row;
        const float *ob = b + r * b_row;
        if (isnan(la[r]) || isnan(lb[r]) || ma[r] == INFINITY || mb[r] == INFINITY) {
            la[r] = NAN;
            continue;
        }
        if (lb[r] == 0.0f) continue; /* b saw no key */
        const float hi = ma[r] > mb[r] ? ma[r] : mb[r];
        const float wa = la[r] == 0.0f ? 0.0f : expf(ma[r] - hi), wb = expf(mb[r] - hi);
        if (wb == 0.0f) continue;
        if (wa == 0.0f) {
            memcpy(o, ob, d_v * sizeof(float));
            ma[r] = mb[r];
            la[r] = lb[r];
            continue;
        }
        if (wa != 1.0f) k->scale(o, o, d_v, wa);
        k->attention->pv_tile(o, d_v, wb == 1.0f ? &one : &wb, 1, 1, 1, ob, d_v, d_v);
        la[r] = (float)((double)la[r] * wa + (double)lb[r] * wb);
        ma[r] = hi;
    }
}

/* The merged state of unit x's rows (out, out_row floats apart), normalised as rows_end does,
   and their log-sum-exps */
static void split_finish(const sdpa_kernels *k, const unit *x, float *out, size_t out_row,
                         const float *m, const float *l, size_t d_v) {
    for (size_t r = 0; r < x->nq; r++) {
        float *o = out + r * out_row, row_lse;
        if (isnan(l[r])) {
            for (size_t c = 0; c < d_v; c++) o[c] = NAN;
            row_lse = NAN;
        } else if (l[r] == 0.0f) {
            memset(o, 0, d_v * sizeof(float));
            row_lse = -INFINITY;
        } else {
            k->scale(o, o, d_v, (float)(1.0 / l[r]));
            row_lse = (float)((double)m[r] + log(l[r]));
        }
        if (x->lse) x->lse[r * x->lse_row] = row_lse;
    }
}

/* The 1-thread split-KV unit: the same chunks and merges as split_task and split_merge, with
   the partial on the stack. */
static __attribute__((noinline)) void split_serial_unit(const attention_run *run,
                                                        const forward_call *pl, size_t u) {
    const size_t d_v = pl->p->d_v;
    float m[SDPA_ATTN_MAX_BLOCK_Q], l[SDPA_ATTN_MAX_BLOCK_Q];
    float part_m[SDPA_ATTN_MAX_BLOCK_Q], part_l[SDPA_ATTN_MAX_BLOCK_Q];
    float part[SDPA_ATTN_MAX_BLOCK_Q * SPLIT_MAX_D_V];
    unit x;
    unit_of(pl, u, &x);
    float *out = (float *)x.out;
    const size_t os = x.sub.out_stride[2];
    chunk_run(run, pl, &x, 0, out, os, m, l);
    for (size_t c = 1; c < pl->f.n_chunks; c++) {
        chunk_run(run, pl, &x, c, part, d_v, part_m, part_l);
        merge_state(pl->run.k, out, os, m, l, part, d_v, part_m, part_l, x.nq, d_v);
    }
    split_finish(pl->run.k, &x, out, os, m, l, d_v);
}

/* Task t: unit t / n_chunks, its chunks last (longest) first. Chunk 0 writes the output rows,
   the others their slot's rows; every chunk's maxima and sums go to its slot. */
static void split_run(const attention_run *run, const forward_call *pl, size_t t) {
    const size_t u = t / pl->f.n_chunks, c = pl->f.n_chunks - 1 - t % pl->f.n_chunks;
    float *slot = pl->workspace + plan_forward_slot(&pl->f, u, c) * pl->f.slot;
    float *m = slot + pl->f.block_q * pl->p->d_v, *l = m + pl->f.block_q;
    unit x;
    unit_of(pl, u, &x);
    if (c == 0)
        chunk_run(run, pl, &x, 0, (float *)x.out, x.sub.out_stride[2], m, l);
    else
        chunk_run(run, pl, &x, c, slot, pl->p->d_v, m, l);
}

static void split_task(void *arg, size_t t) { call_run(split_run, arg, t); }

static void split_merge(const forward_call *pl, size_t u) {
    const size_t d_v = pl->p->d_v, n = pl->f.n_chunks, rows_floats = pl->f.block_q * d_v;
    unit x;
    unit_of(pl, u, &x);
    float *m = pl->workspace + plan_forward_slot(&pl->f, u, 0) * pl->f.slot + rows_floats;
    float *l = m + pl->f.block_q;
    float *out = (float *)x.out;
    const size_t os = x.sub.out_stride[2];
    for (size_t c = 1; c < n; c++) {
        const float *s = pl->workspace + plan_forward_slot(&pl->f, u, c) * pl->f.slot;
        merge_state(pl->run.k, out, os, m, l, s, d_v, s + rows_floats,
                    s + rows_floats + pl->f.block_q, x.nq, d_v);
    }
    split_finish(pl->run.k, &x, out, os, m, l, d_v);
}

static void attention_run_all(const attention_problem *p) {
    forward_call pl;
    pl.run.k = sdpa_kernels_now();
    pl.run.a = pl.run.k->attention;
    const int exp_kind = sdpa_exp_with(pl.run.k);
    pl.run.exp_sum = pl.run.k->exp_sum[exp_kind];
    pl.run.exp_tile = pl.run.a->exp_tile[exp_kind];
    pl.run.exp_pv = pl.run.a->scores_max ? pl.run.a->exp_pv[exp_kind] : NULL;
    pl.run.wide = NULL;
    pl.run.bf16_dot =
        p->q_type == SDPA_BF16 && p->kv_type == SDPA_BF16 ? sdpa_bf16_dot_for(pl.run.k) : NULL;
    pl.run.rows_max = pl.run.a->block_q;
    pl.run.keys_max = pl.run.a->block_kv;
    pl.wide = p->q_type != SDPA_F32 || p->kv_type != SDPA_F32 || p->out_type != SDPA_F32;
    if (pl.wide) {
        const size_t d = p->d_k > p->d_v ? p->d_k : p->d_v; /* <= SDPA_WIDE_FLOATS (checked) */
        if (p->q_type != SDPA_F32 && pl.run.rows_max > SDPA_WIDE_FLOATS / p->d_k)
            pl.run.rows_max = SDPA_WIDE_FLOATS / p->d_k;
        if (p->out_type != SDPA_F32 && pl.run.rows_max > ACC_FLOATS / p->d_v)
            pl.run.rows_max = ACC_FLOATS / p->d_v;
        if (p->kv_type != SDPA_F32 && pl.run.keys_max > SDPA_WIDE_FLOATS / d)
            pl.run.keys_max = SDPA_WIDE_FLOATS / d;
    }
    pl.p = p;
    const size_t threads = sdpa_threads_for_call();
    plan_forward(&pl.f, p, pl.run.rows_max,
                 pl.run.a->pack_q != NULL && p->d_k <= SDPA_ATTN_PACK_MAX_D, threads);
    pl.workspace = NULL;
    if (pl.f.n_chunks == 1) {
        if (pl.f.parallel && pl.f.n_units > 1) {
            sdpa_parallel_run(unit_task, &pl, pl.f.n_units, threads);
            return;
        }
        for (size_t u = 0; u < pl.f.n_units; u++) unit_task(&pl, u);
        return;
    }
    const size_t n_tasks = pl.f.n_units * pl.f.n_chunks;
    if (pl.f.parallel && (pl.workspace = sdpa_workspace_acquire(pl.f.workspace)) != NULL) {
        sdpa_parallel_run(split_task, &pl, n_tasks, threads);
        for (size_t u = 0; u < pl.f.n_units; u++) split_merge(&pl, u);
        sdpa_workspace_release();
        return;
    }
    for (size_t u = 0; u < pl.f.n_units; u++) call_run(split_serial_unit, &pl, u);
}

static sdpa_status attention_checked_run(attention_problem *p, uint32_t flags) {
    sdpa_status st = sdpa_problem_check(p, flags);
    if (st != SDPA_OK) return st;
    if (!sdpa_problem_has_rows(p)) return SDPA_OK;
    if (p->len_kv == 0) { /* no key at all: every row is zeros, its log-sum-exp -inf */
        const size_t size = sdpa_type_size(p->out_type);
        for (size_t b = 0; b < p->batch; b++)
            for (size_t h = 0; h < p->heads_q; h++)
                for (size_t i = 0; i < p->len_q; i++) {
                    size_t at = b * p->out_stride[0] + h * p->out_stride[1] + i * p->out_stride[2];
                    memset((char *)p->out + at * size, 0, p->d_v * size);
                    if (p->lse) p->lse[b * p->lse_stride[0] + h * p->lse_stride[1] + i] = -INFINITY;
                }
        return SDPA_OK;
    }
    attention_run_all(p);
    return SDPA_OK;
}

/* ---- public entry points ---- */

SDPA_API sdpa_status sdpa_attention_f32(float *out, const float *q, const float *k, const float *v,
                                        size_t len_q, size_t len_kv, size_t d_k, size_t d_v,
                                        float scale, uint32_t flags) {
    attention_problem p;
    sdpa_problem_single(&p, out, q, k, v, len_q, len_kv, d_k, d_v, scale);
    return attention_checked_run(&p, flags);
}

SDPA_API sdpa_status sdpa_mha_f32(const sdpa_mha_desc *desc, float *out, const float *q,
                                  const float *k, const float *v) {
    attention_problem p;
    sdpa_status st = sdpa_problem_from_desc(&p, desc, out, q, k, v, 0);
    return st != SDPA_OK ? st : attention_checked_run(&p, desc->flags);
}

SDPA_API sdpa_status sdpa_mha(const sdpa_mha_desc *desc, void *out, const void *q, const void *k,
                              const void *v) {
    attention_problem p;
    sdpa_status st = sdpa_problem_from_desc(&p, desc, out, q, k, v, 1);
    return st != SDPA_OK ? st : attention_checked_run(&p, desc->flags);
}

/* The extents [a, a + na) and [b, b + nb) floats share a byte. */
static int overlaps(const float *a, size_t na, const float *b, size_t nb) {
    return sdpa_bytes_overlap(a, na * sizeof(float), b, nb * sizeof(float));
}

SDPA_API sdpa_status sdpa_attention_merge_f32(float *out, float *lse, const float *out_b,
                                              const float *lse_b, size_t rows, size_t d_v,
                                              size_t out_stride, size_t out_b_stride) {
    if (!rows) return SDPA_OK;
    if (!out || !lse || !out_b || !lse_b)
        return sdpa_fail(SDPA_ERR_NULL, "%s is NULL with rows = %zu",
                         !out     ? "out"
                         : !lse   ? "lse"
                         : !out_b ? "out_b"
                                  : "lse_b",
                         rows);
    if (!d_v) return sdpa_fail(SDPA_ERR_SIZE, "d_v is 0 with rows = %zu", rows);
    if (rows > 1 && (out_stride < d_v || out_b_stride < d_v))
        return sdpa_fail(SDPA_ERR_SIZE, "%s (%zu) is smaller than d_v (%zu)",
                         out_stride < d_v ? "out_stride" : "out_b_stride",
                         out_stride < d_v ? out_stride : out_b_stride, d_v);
    if (!sdpa_rows_fit(rows, d_v, out_stride) || !sdpa_rows_fit(rows, d_v, out_b_stride) ||
        !sdpa_rows_fit(rows, 1, 1))
        return sdpa_fail(SDPA_ERR_SIZE, "an extent of %zu rows is past PTRDIFF_MAX bytes", rows);
    /* the spans fit (checked above) */
    const size_t n_out = (rows - 1) * out_stride + d_v, n_out_b = (rows - 1) * out_b_stride + d_v;
    const int same_out = out == out_b && out_stride == out_b_stride;
    if (overlaps(out, n_out, lse, rows) || overlaps(out, n_out, lse_b, rows) ||
        overlaps(lse, rows, out_b, n_out_b) ||
        (!same_out && overlaps(out, n_out, out_b, n_out_b)) ||
        (lse != lse_b && overlaps(lse, rows, lse_b, rows)))
        return sdpa_fail(SDPA_ERR_SIZE, "out, lse, out_b and lse_b overlap other than as one "
                                        "part merged with itself");
    merge_rows(sdpa_kernels_now(), out, out_stride, lse, out_b, out_b_stride, lse_b, rows, d_v);
    return SDPA_OK;
}
