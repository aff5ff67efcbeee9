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
 * and the same block of values before P V; a 16-bit out is rounded once, from the finished
 * float row. Where the backend's bf16 dot add-on is on (kernels.h, sdpa_bf16_dot_kernels) and Q
 * and K are both bf16, the packed path forms Q.K from them as they are, and only V is widened. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attention_problem.h"
#include "dispatch.h"
#include "sdpa.h"

#if defined(__AVX__) || defined(__SSE4_1__)
#error "src/attention.c must be compiled for the baseline ISA, without -m flags"
#endif

/* Accumulator tile on the stack: block_q rows of d_v floats when they fit. */
#define ACC_FLOATS (SDPA_ATTN_MAX_BLOCK_Q * 256)

/* A problem with a 16-bit view: its rows widened to float. kv holds a block of keys for the
 * scores, then the same block of values for P V, never both at once; q the block's queries,
 * where the scores read them as rows (the packed path widens them into kv for pack_q). */
typedef struct wide_tiles {
    _Alignas(64) float q[SDPA_WIDE_FLOATS];
    _Alignas(64) float kv[SDPA_WIDE_FLOATS];
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

/* One step of the online softmax for a block that every row sees whole, with no mask, in the
 * backend's key-major kernels (kernels.h, scores_max and exp_pv). Returns 0, having changed
 * nothing, when a new row max is not finite (+inf among the scores, or a row with nothing but
 * -inf so far): the general path then takes the block. k is float rows, or with the bf16 dot
 * the bf16 rows themselves (qt then holds pairs). */
static int packed_step(const attention_run *run, const attention_problem *p, float *st, float *acc,
                       size_t ld_acc, float *m, double *l, const void *qt, size_t nq, const void *k,
                       size_t k_stride, const void *v, size_t k0, size_t nk) {
    float m_new[SDPA_ATTN_MAX_BLOCK_Q], alpha[SDPA_ATTN_MAX_BLOCK_Q], sums[SDPA_ATTN_MAX_BLOCK_Q];
    if (run->bf16_dot)
        run->bf16_dot->scores_max(st, m_new, qt, nq, k, k_stride, nk, p->d_k, p->scale);
    else
        run->a->scores_max(st, m_new, qt, nq, k, k_stride, nk, p->d_k, p->scale);
    for (size_t r = 0; r < nq; r++) m_new[r] = m_new[r] > m[r] ? m_new[r] : m[r];
    if (!all_finite(m_new, nq)) return 0;
    size_t vs;
    const float *vb = value_rows(run, p, v, k0, nk, &vs);
    run->exp_pv(acc, ld_acc, st, m, m_new, alpha, sums, nq, nk, vb, vs, p->d_v);
    for (size_t r = 0; r < nq; r++) {
        l[r] = l[r] * alpha[r] + sums[r];
        m[r] = m_new[r];
    }
    return 1;
}

/* One block of nq query rows of one head against all the keys they see. */
static void attention_block(const attention_run *run, const attention_problem *p, const void *q,
                            const void *k, const void *v, const float *mask, size_t mask_row,
                            void *out, float *lse, size_t lse_row, size_t q0, size_t nq) {
    const sdpa_attention_kernels *a = run->a;
    const size_t block_kv = run->keys_max, d_v = p->d_v;
    const size_t os = p->out_stride[2];
    _Alignas(64) float s_tile[SDPA_ATTN_MAX_BLOCK_Q * SDPA_ATTN_MAX_BLOCK_KV];
    float acc_tile[ACC_FLOATS];
    float m[SDPA_ATTN_MAX_BLOCK_Q];
    double l[SDPA_ATTN_MAX_BLOCK_Q];
    size_t visible[SDPA_ATTN_MAX_BLOCK_Q]; /* keys row r sees (all keys unless causal) */
    unsigned char poisoned[SDPA_ATTN_MAX_BLOCK_Q], live[SDPA_ATTN_MAX_BLOCK_Q];
    /* the block of queries, transposed: floats, or with the bf16 dot words of bf16 pairs */
    union {
        _Alignas(64) float f[SDPA_ATTN_PACK_MAX_D * SDPA_ATTN_MAX_BLOCK_Q];
        uint32_t pairs[SDPA_ATTN_PACK_MAX_D / 2 * SDPA_ATTN_MAX_BLOCK_Q];
    } qt;
    const int packed = a->pack_q && nq >= 8 && p->d_k <= SDPA_ATTN_PACK_MAX_D;
    const sdpa_bf16_dot_kernels *pairs = packed ? run->bf16_dot : NULL;
    size_t qs = 0;
    const float *qb = NULL;
    if (pairs)
        pairs->pack_q(qt.pairs, (const uint16_t *)q + q0 * p->q_stride[2], p->q_stride[2], nq,
                      p->d_k);
    else
        qb = float_rows(run, p->q_type, q, q0, nq, p->q_stride[2], p->d_k,
                        run->wide ? (packed ? run->wide->kv : run->wide->q) : NULL, &qs);
    if (packed && !pairs) a->pack_q(qt.f, qb, qs, nq, p->d_k);

    /* accumulate on the stack when the tile fits (always, for a 16-bit out: rows_max), else in
       the output rows themselves */
    float *acc = nq * d_v <= ACC_FLOATS ? acc_tile : (float *)out + q0 * os;
    const size_t ld_acc = acc == acc_tile ? d_v : os;
    const size_t ld_s = block_kv;

    size_t kv_end = 0;         /* keys seen by the last (widest) row */
    size_t all_see = SIZE_MAX; /* keys seen by every row (the first, under causality) */
    for (size_t r = 0; r < nq; r++) {
        size_t seen = p->len_kv;
        if (p->causal) {
            /* row i sees j <= i + len_kv - len_q, i.e. i + 1 + len_kv - len_q keys, clipped */
            size_t i1 = q0 + r + 1;
            seen = i1 + p->len_kv > p->len_q ? i1 + p->len_kv - p->len_q : 0;
            if (seen > p->len_kv) seen = p->len_kv;
        }
        visible[r] = seen;
        if (seen > kv_end) kv_end = seen;
        if (seen < all_see) all_see = seen;
        m[r] = -INFINITY;
        l[r] = 0.0;
        poisoned[r] = 0;
        memset(acc + r * ld_acc, 0, d_v * sizeof(float));
    }

    for (size_t k0 = 0; k0 < kv_end; k0 += block_kv) {
        const size_t nk = kv_end - k0 < block_kv ? kv_end - k0 : block_kv;
        size_t ks = p->k_stride[2];
        const uint16_t *kb16 = pairs ? (const uint16_t *)k + k0 * ks : NULL;
        const float *kb = pairs ? NULL
                                : float_rows(run, p->kv_type, k, k0, nk, p->k_stride[2], p->d_k,
                                             run->wide ? run->wide->kv : NULL, &ks);
        /* a block every row sees whole, with no mask: one call does all of it, unless a row's
           max would not be finite (then nothing changed, and the general path below runs) */
        if (packed && run->exp_pv && !mask && all_see >= k0 + nk &&
            packed_step(run, p, s_tile, acc, ld_acc, m, l, qt.f, nq,
                        pairs ? (const void *)kb16 : kb, ks, v, k0, nk))
            continue;
        if (pairs)
            pairs->scores_packed(s_tile, ld_s, qt.pairs, nq, kb16, ks, nk, p->d_k, p->scale);
        else if (packed)
            a->scores_packed(s_tile, ld_s, qt.f, nq, kb, ks, nk, p->d_k, p->scale);
        else
            a->scores_tile(s_tile, ld_s, qb, qs, nq, kb, ks, nk, p->d_k, p->scale);

        int simple = 1; /* every row sees every key of the block: one pv_tile for all rows */
        for (size_t r = 0; r < nq; r++) {
            float *s = s_tile + r * ld_s;
            size_t n = visible[r] > k0 ? visible[r] - k0 : 0;
            if (n > nk) n = nk;
            live[r] = 0;
            if (n < nk) simple = 0;
            if (poisoned[r] || n == 0) continue;
            if (mask) {
                const float *mr = mask + (q0 + r) * mask_row + k0;
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
                poisoned[r] = 1;
                continue;
            }
            if (bm == -INFINITY) continue; /* nothing seen in this block */
            float m_new = bm > m[r] ? bm : m[r];
            if (m_new > m[r] && m[r] != -INFINITY) {
                float alpha = expf(m[r] - m_new);
                l[r] *= alpha;
                run->k->scale(acc + r * ld_acc, acc + r * ld_acc, d_v, alpha);
            }
            m[r] = m_new;
            live[r] = 1;
        }

        /* p = exp(s - m) and the row sums: one call for the tile when every row is full */
        if (simple && run->exp_tile) {
            float shift[SDPA_ATTN_MAX_BLOCK_Q], sums[SDPA_ATTN_MAX_BLOCK_Q];
            for (size_t r = 0; r < nq; r++) shift[r] = live[r] ? m[r] : 0.0f;
            run->exp_tile(s_tile, ld_s, nq, nk, shift, sums);
            for (size_t r = 0; r < nq; r++)
                if (live[r]) l[r] += sums[r];
        } else {
            for (size_t r = 0; r < nq; r++) {
                if (!live[r]) continue;
                size_t n = visible[r] - k0 < nk ? visible[r] - k0 : nk;
                float *s = s_tile + r * ld_s;
                l[r] += run->exp_sum(s, s, n, 1.0f, m[r]);
            }
        }

        size_t vs;
        const float *vb = value_rows(run, p, v, k0, nk, &vs);
        if (simple) {
            for (size_t r = 0; r < nq; r++)
                if (!live[r]) memset(s_tile + r * ld_s, 0, nk * sizeof(float));
            a->pv_tile(acc, ld_acc, s_tile, ld_s, nq, nk, vb, vs, d_v);
            continue;
        }
        /* Rows that leave keys out: only the runs of keys they see are summed, so a removed
           key's values are never multiplied (0 * NaN would be NaN). */
        for (size_t r = 0; r < nq; r++) {
            if (!live[r]) continue;
            size_t n = visible[r] - k0 < nk ? visible[r] - k0 : nk;
            const float *s = s_tile + r * ld_s;
            const float *mr = mask ? mask + (q0 + r) * mask_row + k0 : NULL;
            size_t j = 0;
            while (j < n) {
                if (mr && mr[j] == -INFINITY) {
                    j++;
                    continue;
                }
                size_t start = j;
                while (j < n && !(mr && mr[j] == -INFINITY)) j++;
                a->pv_tile(acc + r * ld_acc, ld_acc, s + start, ld_s, 1, j - start, vb + start * vs,
                           vs, d_v);
            }
        }
    }

    /* a 16-bit out: the row finished in acc, then rounded once */
    const int narrow = p->out_type != SDPA_F32;
    for (size_t r = 0; r < nq; r++) {
        float *o = narrow ? acc + r * ld_acc : (float *)out + (q0 + r) * os;
        float row_lse;
        if (poisoned[r] || isnan(l[r])) {
            for (size_t c = 0; c < d_v; c++) o[c] = NAN;
            row_lse = NAN;
        } else if (l[r] == 0.0) {
            memset(o, 0, d_v * sizeof(float));
            row_lse = -INFINITY;
        } else {
            run->k->scale(o, acc + r * ld_acc, d_v, (float)(1.0 / l[r]));
            row_lse = (float)((double)m[r] + log(l[r]));
        }
        if (narrow) run->k->narrow[p->out_type]((uint16_t *)out + (q0 + r) * os, o, d_v);
        if (lse) lse[(q0 + r) * lse_row] = row_lse;
    }
}

/* base + index elements of type t */
static const void *element(const void *base, size_t index, uint32_t t) {
    return (const char *)base + index * sdpa_type_size(t);
}

static void attention_run_all(const attention_problem *p, wide_tiles *wide) {
    attention_run run;
    run.k = sdpa_kernels_now();
    run.a = run.k->attention;
    run.wide = wide;
    run.bf16_dot =
        p->q_type == SDPA_BF16 && p->kv_type == SDPA_BF16 ? sdpa_bf16_dot_for(run.k) : NULL;
    const int exp_kind = sdpa_exp_with(run.k);
    run.exp_sum = run.k->exp_sum[exp_kind];
    run.exp_tile = run.a->exp_tile[exp_kind];
    run.exp_pv = run.a->scores_max ? run.a->exp_pv[exp_kind] : NULL;
    run.rows_max = run.a->block_q;
    run.keys_max = run.a->block_kv;
    if (wide) {
        const size_t d = p->d_k > p->d_v ? p->d_k : p->d_v; /* <= SDPA_WIDE_FLOATS (checked) */
        if (p->q_type != SDPA_F32 && run.rows_max > SDPA_WIDE_FLOATS / p->d_k)
            run.rows_max = SDPA_WIDE_FLOATS / p->d_k;
        if (p->out_type != SDPA_F32 && run.rows_max > ACC_FLOATS / p->d_v)
            run.rows_max = ACC_FLOATS / p->d_v;
        if (p->kv_type != SDPA_F32 && run.keys_max > SDPA_WIDE_FLOATS / d)
            run.keys_max = SDPA_WIDE_FLOATS / d;
    }
    const size_t block_q = run.rows_max, group = p->heads_q / p->heads_kv;
    if (p->len_q == 1 && group > 1) {
        /* Decode with grouped heads: the group's query heads become the rows of one block, so
           the kv head's K and V are read once for all of them instead of once per head. With
           one query row, causal masking removes nothing. */
        attention_problem rows = *p;
        rows.causal = 0;
        rows.q_stride[2] = p->q_stride[1];
        rows.out_stride[2] = p->out_stride[1];
        for (size_t b = 0; b < p->batch; b++) {
            for (size_t hk = 0; hk < p->heads_kv; hk++) {
                const void *k = element(p->k, b * p->k_stride[0] + hk * p->k_stride[1], p->kv_type);
                const void *v = element(p->v, b * p->v_stride[0] + hk * p->v_stride[1], p->kv_type);
                for (size_t g0 = 0; g0 < group; g0 += block_q) {
                    const size_t h = hk * group + g0;
                    rows.len_q = group - g0 < block_q ? group - g0 : block_q;
                    const void *q =
                        element(p->q, b * p->q_stride[0] + h * p->q_stride[1], p->q_type);
                    const float *mask =
                        p->mask ? p->mask + b * p->mask_stride[0] + h * p->mask_stride[1] : NULL;
                    void *out = (void *)element(p->out, b * p->out_stride[0] + h * p->out_stride[1],
                                                p->out_type);
                    float *lse =
                        p->lse ? p->lse + b * p->lse_stride[0] + h * p->lse_stride[1] : NULL;
                    attention_block(&run, &rows, q, k, v, mask, p->mask_stride[1], out, lse,
                                    p->lse_stride[1], 0, rows.len_q);
                }
            }
        }
        return;
    }
    for (size_t b = 0; b < p->batch; b++) {
        for (size_t h = 0; h < p->heads_q; h++) {
            const size_t hk = h / group;
            const void *q = element(p->q, b * p->q_stride[0] + h * p->q_stride[1], p->q_type);
            const void *k = element(p->k, b * p->k_stride[0] + hk * p->k_stride[1], p->kv_type);
            const void *v = element(p->v, b * p->v_stride[0] + hk * p->v_stride[1], p->kv_type);
            const float *mask =
                p->mask ? p->mask + b * p->mask_stride[0] + h * p->mask_stride[1] : NULL;
            void *out =
                (void *)element(p->out, b * p->out_stride[0] + h * p->out_stride[1], p->out_type);
            float *lse = p->lse ? p->lse + b * p->lse_stride[0] + h * p->lse_stride[1] : NULL;
            for (size_t q0 = 0; q0 < p->len_q; q0 += block_q) {
                size_t nq = p->len_q - q0 < block_q ? p->len_q - q0 : block_q;
                attention_block(&run, p, q, k, v, mask, p->mask_stride[2], out, lse, 1, q0, nq);
            }
        }
    }
}

/* A problem with a 16-bit view: the widening tiles on a stack frame of its own, which an f32
 * call never makes */
__attribute__((noinline)) static void attention_run_wide(const attention_problem *p) {
    wide_tiles wide;
    attention_run_all(p, &wide);
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
    if (p->q_type == SDPA_F32 && p->kv_type == SDPA_F32 && p->out_type == SDPA_F32)
        attention_run_all(p, NULL);
    else
        attention_run_wide(p);
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
