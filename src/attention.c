/* The dense attention calls: their tasks, the split-KV chunks and their merge, and the public
 * entry points. The loop over one head's keys is the executor's (attention_block.h). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attention.h"
#include "attention_block.h"
#include "attention_problem.h"
#include "chunks.h"
#include "dispatch.h"
#include "error.h"
#include "plan.h"
#include "sdpa.h"
#include "sizes.h"
#include "threads.h"
#include "visibility.h"

/* base + index elements of type t */
static const void *element(const void *base, size_t index, uint32_t t) {
    return (const char *)base + index * sdpa_type_size(t);
}

/* ---- tasks ----
 *
 * A call's work is cut by plan.h, from its shape alone. Every task writes rows no other task
 * writes, and the chunks' partial results are merged in key order (chunks.h), so the bits never
 * depend on which thread ran what, or how many there were. */

/* A call: its kernels and its plan (plan.h). */
typedef struct forward_call {
    attention_run run; /* with no wide tiles: a task that needs them makes its own */
    int wide;          /* a view is 16-bit */
    const attention_problem *p;
    forward_plan f;
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
    visibility vis;    /* which keys each row sees */
    score_stage stage; /* what happens to its scores */
} unit;

/* Unit x's visibility and score stage: those of its batch entry b and query head h, where
   grouped rows are heads h, h + 1, ... all at the one query row's position. */
static void unit_rules(const forward_call *pl, size_t b, size_t h, unit *x) {
    const attention_problem *p = pl->p;
    const int grouped = pl->f.grouped;
    x->vis = visibility_of(p);
    if (grouped) x->vis = visibility_one_position(&x->vis);
    x->stage = score_stage_of(p, b, h, grouped, x->vis.shift, x->mask, x->mask_row);
}

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
        x->lse_row = sdpa_problem_lse_row(p);
    }
    x->q = element(p->q, b * p->q_stride[0] + h * p->q_stride[1], p->q_type);
    x->k = element(p->k, b * p->k_stride[0] + hk * p->k_stride[1], p->kv_type);
    x->v = element(p->v, b * p->v_stride[0] + hk * p->v_stride[1], p->kv_type);
    x->mask = p->mask ? p->mask + b * p->mask_stride[0] + h * p->mask_stride[1] : NULL;
    x->out = (void *)element(p->out, b * p->out_stride[0] + h * p->out_stride[1], p->out_type);
    x->lse = p->lse ? p->lse + b * p->lse_stride[0] + h * p->lse_stride[1] : NULL;
    unit_rules(pl, b, h, x);
}

static void unit_run(const attention_run *run, const void *ctx, size_t u) {
    const forward_call *pl = ctx;
    unit x;
    unit_of(pl, u, &x);
    const key_source src = key_source_of(&x.sub, x.k, x.v, 0);
    attention_block(run, &x.sub, &x.vis, x.q, &src, &x.stage, x.out, x.lse, x.lse_row, NULL, x.q0,
                    x.nq);
}

static void unit_task(void *arg, size_t u) {
    const forward_call *pl = arg;
    attention_with_tiles(unit_run, &pl->run, pl->wide, pl, u);
}

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
   (out_row floats apart), each row's max to m[r] and sum to l[r]; next: the keys of the task
   that runs next, or NULL. */
static void split_rows(const attention_run *run, const forward_call *pl, const unit *x, size_t c,
                       const key_source *next, float *out, size_t out_row, float *m, float *l) {
    const attention_problem *p = pl->p;
    size_t begin, end;
    plan_forward_chunk(&pl->f, p, c, &begin, &end);
    const visibility vis = visibility_keys(&x->vis, begin, end - begin);
    attention_problem sub = x->sub; /* the chunk's keys; which of them each row sees is vis */
    sub.len_kv = end - begin;
    sub.out_stride[2] = out_row;
    key_source src = key_source_of(&x->sub, x->k, x->v, begin);
    src.next = next;
    const score_stage stage = score_stage_from(&x->stage, begin);
    attention_block(run, &sub, &vis, x->q, &src, &stage, out, m, 1, l, 0, x->nq);
}

/* The keys of the task that runs after unit u's chunk c on this thread, into *next, where the
   plan interleaves: the kernels of this one read ahead into them (a paged cache's pages lie
   apart, so the rows past a page are not what anyone reads next). NULL where it does not. */
static const key_source *next_task_keys(const forward_call *pl, size_t u, size_t c,
                                        key_source *next) {
    const chunk_plan r = plan_forward_chunks(&pl->f);
    size_t u_next, c_next, begin, end;
    if (!r.interleave || !chunk_plan_next(&r, u, c, &u_next, &c_next)) return NULL;
    unit y;
    unit_of(pl, u_next, &y);
    plan_forward_chunk(&pl->f, pl->p, c_next, &begin, &end);
    *next = key_source_of(&y.sub, y.k, y.v, begin);
    return next;
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
        float *o = out + r * out_row;
        const float row_lse =
            attention_row_finish(k, o, o, d_v, m[r], l[r], score_stage_sink(&x->stage, x->q0 + r),
                                 x->sub.v_scale, x->lse != NULL);
        if (x->lse) x->lse[r * x->lse_row] = row_lse;
    }
}

/* ---- split-KV: a unit's key chunks, reduced by chunks.h ----
 *
 * Chunk 0 writes the output rows, the others their slot's rows; every chunk's maxima and sums
 * follow its slot's rows (chunk 0's are the state its merges update). */

/* A thread's scratch: the call's kernels with its widening tiles, and the unit it last took
   (a unit's chunks and merges come one after another). */
typedef struct split_scratch {
    const attention_run *run;
    size_t u; /* SIZE_MAX: none yet */
    unit x;
} split_scratch;

typedef struct scratch_call {
    void (*body)(void *arg, void *scratch);
    void *arg;
} scratch_call;

static void scratch_run(const attention_run *run, const void *ctx, size_t index) {
    (void)index;
    const scratch_call *c = ctx;
    split_scratch s;
    s.run = run;
    s.u = SIZE_MAX;
    c->body(c->arg, &s);
}

static void split_with_scratch(const void *ctx, void (*body)(void *arg, void *scratch), void *arg) {
    const forward_call *pl = ctx;
    const scratch_call c = {body, arg};
    attention_with_tiles(scratch_run, &pl->run, pl->wide, &c, 0);
}

static const unit *split_unit(const forward_call *pl, split_scratch *s, size_t u) {
    if (s->u != u) unit_of(pl, u, &s->x);
    s->u = u;
    return &s->x;
}

static void split_chunk(const void *ctx, void *scratch, size_t u, size_t c, size_t part,
                        float *slot) {
    (void)part;
    const forward_call *pl = ctx;
    const unit *x = split_unit(pl, scratch, u);
    float *m = slot + pl->f.block_q * pl->p->d_v, *l = m + pl->f.block_q;
    const attention_run *run = ((split_scratch *)scratch)->run;
    key_source keys;
    const key_source *next = next_task_keys(pl, u, c, &keys);
    if (c == 0)
        split_rows(run, pl, x, 0, next, (float *)x->out, x->sub.out_stride[2], m, l);
    else
        split_rows(run, pl, x, c, next, slot, pl->p->d_v, m, l);
}

static void split_merge(const void *ctx, void *scratch, size_t u, size_t c, size_t part,
                        float *state, const float *slot) {
    (void)c;
    (void)part;
    const forward_call *pl = ctx;
    const unit *x = split_unit(pl, scratch, u);
    const size_t d_v = pl->p->d_v, rows = pl->f.block_q * d_v;
    merge_state(pl->run.k, (float *)x->out, x->sub.out_stride[2], state + rows,
                state + rows + pl->f.block_q, slot, d_v, slot + rows, slot + rows + pl->f.block_q,
                x->nq, d_v);
}

static void split_done(const void *ctx, void *scratch, size_t u, size_t part, float *state) {
    (void)part;
    const forward_call *pl = ctx;
    const unit *x = split_unit(pl, scratch, u);
    const size_t rows = pl->f.block_q * pl->p->d_v;
    split_finish(pl->run.k, x, (float *)x->out, x->sub.out_stride[2], state + rows,
                 state + rows + pl->f.block_q, pl->p->d_v);
}

static const chunk_ops split_ops = {split_with_scratch, split_chunk, split_merge, split_done};

static void forward_call_init(forward_call *pl, const attention_problem *p, size_t threads) {
    pl->wide = attention_run_init(&pl->run, p);
    pl->p = p;
    plan_forward(&pl->f, p, pl->run.rows_max,
                 pl->run.a->pack_q != NULL && p->d_k <= SDPA_ATTN_PACK_MAX_D, threads);
}

int attention_shares_threads(const attention_problem *p, size_t threads) {
    forward_call pl;
    forward_call_init(&pl, p, threads);
    return pl.f.parallel;
}

void attention_run_all(const attention_problem *p) {
    forward_call pl;
    const size_t threads = sdpa_threads_for_call();
    forward_call_init(&pl, p, threads);
    const chunk_plan r = plan_forward_chunks(&pl.f);
    work_run(&r, &split_ops, unit_task, &pl, pl.f.parallel, threads);
}

void attention_no_keys(const attention_problem *p) {
    const size_t size = sdpa_type_size(p->out_type);
    for (size_t b = 0; b < p->batch; b++)
        for (size_t h = 0; h < p->heads_q; h++)
            for (size_t i = 0; i < p->len_q; i++) {
                size_t at = b * p->out_stride[0] + h * p->out_stride[1] + i * p->out_stride[2];
                memset((char *)p->out + at * size, 0, p->d_v * size);
                if (p->lse) /* the log of the sink's term alone, if any */
                    p->lse[b * p->lse_stride[0] + h * p->lse_stride[1] +
                           i * sdpa_problem_lse_row(p)] =
                        p->mods.sinks ? p->mods.sinks[h] : -INFINITY;
            }
}

static sdpa_status attention_checked_run(attention_problem *p, uint32_t flags) {
    sdpa_status st = sdpa_problem_check(p, flags);
    if (st != SDPA_OK) return st;
    if (!sdpa_problem_has_rows(p)) return SDPA_OK;
    if (p->len_kv == 0)
        attention_no_keys(p);
    else
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
