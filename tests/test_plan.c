/* White-box: the planner (src/plan.h) and the visibility rule (src/visibility.h), the two
 * things every attention driver reads to cut its work and to know which keys a row sees.
 * Contract: the visibility rule is the causal one of sdpa.h (row i sees key j when
 * j <= i + len_kv - len_q), checked pair by pair against that definition; a plan covers every
 * row and every key exactly once, and nothing in it but "parallel" depends on the thread
 * count, so the order of every sum is the shape's alone; the key-chunk reduction sums in chunk
 * order in both its schedules. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chunks.h"
#include "common.h"
#include "plan.h"
#include "threads.h"
#include "visibility.h"

/* sdpa.h's definition, written without the subtraction that can go below 0 */
static int sees(int causal, size_t len_q, size_t len_kv, size_t i, size_t j) {
    return j < len_kv && (!causal || j + len_q <= i + len_kv);
}

static attention_problem shape(size_t len_q, size_t len_kv, int causal) {
    attention_problem p;
    memset(&p, 0, sizeof p);
    p.batch = p.heads_q = p.heads_kv = 1;
    p.len_q = len_q;
    p.len_kv = len_kv;
    p.d_k = p.d_v = 64;
    p.causal = causal;
    return p;
}

/* Every row's run of keys, and the first row seeing each key, against the definition. */
static void check_rows(size_t len_q, size_t len_kv, int causal) {
    const attention_problem p = shape(len_q, len_kv, causal);
    const visibility v = visibility_of(&p);
    for (size_t i = 0; i < len_q; i++) {
        const size_t first = visibility_row_first(&v, i), end = visibility_row_end(&v, i);
        for (size_t j = 0; j < len_kv; j++)
            cr_assert_eq(j >= first && j < end, sees(causal, len_q, len_kv, i, j),
                         "len_q %zu len_kv %zu causal %d: row %zu key %zu", len_q, len_kv, causal,
                         i, j);
    }
    for (size_t j = 0; j < len_kv; j++) {
        const size_t first = visibility_first_row(&v, j);
        for (size_t i = 0; i < len_q; i++)
            cr_assert_eq(i >= first, sees(causal, len_q, len_kv, i, j),
                         "len_q %zu len_kv %zu causal %d: first row of key %zu is %zu, row %zu",
                         len_q, len_kv, causal, j, first, i);
    }
}

/* Every block of rows against every block of keys, classified by counting its pairs; and the
   rule on a key range against the whole rule. */
static void check_blocks(size_t len_q, size_t len_kv, int causal) {
    const attention_problem p = shape(len_q, len_kv, causal);
    const visibility v = visibility_of(&p);
    for (size_t q0 = 0; q0 < len_q; q0++)
        for (size_t nq = 1; q0 + nq <= len_q; nq++)
            for (size_t k0 = 0; k0 < len_kv; k0++)
                for (size_t nk = 1; k0 + nk <= len_kv; nk++) {
                    size_t seen = 0;
                    for (size_t i = q0; i < q0 + nq; i++)
                        for (size_t j = k0; j < k0 + nk; j++)
                            seen += (size_t)sees(causal, len_q, len_kv, i, j);
                    const visibility_class want = seen == 0         ? VIS_NONE
                                                  : seen == nq * nk ? VIS_ALL
                                                                    : VIS_PARTIAL;
                    cr_assert_eq(visibility_block(&v, q0, nq, k0, nk), want,
                                 "len_q %zu len_kv %zu causal %d: rows %zu+%zu keys %zu+%zu", len_q,
                                 len_kv, causal, q0, nq, k0, nk);
                }
    for (size_t k0 = 0; k0 < len_kv; k0++)
        for (size_t nk = 1; k0 + nk <= len_kv; nk++) {
            const visibility r = visibility_keys(&v, k0, nk);
            for (size_t i = 0; i < len_q; i++)
                for (size_t j = 0; j < nk; j++) {
                    const int got =
                        j >= visibility_row_first(&r, i) && j < visibility_row_end(&r, i);
                    cr_assert_eq(got, sees(causal, len_q, len_kv, i, k0 + j),
                                 "keys %zu+%zu of len_q %zu len_kv %zu: row %zu key %zu", k0, nk,
                                 len_q, len_kv, i, j);
                }
        }
}

Test(visibility, rows_match_the_definition) {
    /* len_q > len_kv (early rows see nothing), <, ==, and decode (len_q 1) */
    for (int causal = 0; causal < 2; causal++)
        for (size_t len_q = 1; len_q <= 13; len_q++)
            for (size_t len_kv = 1; len_kv <= 13; len_kv++) check_rows(len_q, len_kv, causal);
    check_rows(1, 4097, 1);
    check_rows(3, 1000, 1);
    check_rows(1000, 3, 1);
}

Test(visibility, blocks_match_the_definition) {
    for (int causal = 0; causal < 2; causal++)
        for (size_t len_q = 1; len_q <= 9; len_q++)
            for (size_t len_kv = 1; len_kv <= 9; len_kv++) check_blocks(len_q, len_kv, causal);
}

/* ---- the forward's plan ---- */

typedef struct fwd_case {
    size_t batch, heads_q, heads_kv, len_q, len_kv, d_v;
    uint32_t kv_type, out_type;
    int causal;
} fwd_case;

static attention_problem fwd_problem(const fwd_case *c) {
    attention_problem p = shape(c->len_q, c->len_kv, c->causal);
    p.batch = c->batch;
    p.heads_q = c->heads_q;
    p.heads_kv = c->heads_kv;
    p.d_v = c->d_v;
    p.kv_type = p.q_type = c->kv_type;
    p.out_type = c->out_type;
    return p;
}

/* Everything a plan says but whether to run in parallel. */
static void assert_same_forward(const forward_plan *a, const forward_plan *b, size_t threads) {
    cr_assert(a->grouped == b->grouped && a->group == b->group && a->block_q == b->block_q &&
                  a->blocks_per_head == b->blocks_per_head && a->n_units == b->n_units &&
                  a->pieces == b->pieces && a->n_chunks == b->n_chunks && a->slot == b->slot &&
                  a->workspace == b->workspace,
              "the forward plan changes at %zu threads", threads);
}

/* Units cover every (batch, query head, row) once, each reading its query head's kv head. */
static void check_forward_units(const forward_plan *pl, const attention_problem *p) {
    const size_t rows = p->batch * p->heads_q * p->len_q;
    unsigned char *seen = calloc(rows, 1);
    for (size_t u = 0; u < pl->n_units; u++) {
        plan_unit x;
        plan_forward_unit(pl, p, u, &x);
        cr_assert(x.nq >= 1 && x.nq <= pl->block_q, "unit %zu has %zu rows", u, x.nq);
        cr_assert_lt(x.batch, p->batch);
        for (size_t r = 0; r < x.nq; r++) {
            const size_t h = pl->grouped ? x.head + r : x.head, i = pl->grouped ? 0 : x.q0 + r;
            cr_assert(h < p->heads_q && i < p->len_q, "unit %zu: head %zu row %zu", u, h, i);
            cr_assert_eq(x.kv_head, h / (p->heads_q / p->heads_kv), "unit %zu: kv head", u);
            cr_assert_eq(seen[(x.batch * p->heads_q + h) * p->len_q + i]++, 0,
                         "unit %zu: head %zu row %zu twice", u, h, i);
        }
        /* a split unit's chunks have no q0: its rows start at the head's first */
        if (pl->n_chunks > 1) cr_assert_eq(x.q0, 0, "split unit %zu starts at row %zu", u, x.q0);
    }
    for (size_t r = 0; r < rows; r++) cr_assert_eq(seen[r], 1, "row %zu of %zu uncovered", r, rows);
    free(seen);
}

/* The chunks are whole pieces, in key order, covering [0, len_kv) once; the reduction keeps
   one part a unit, chunk 0's state, and a slot and a state fit the in-order schedule's stack. */
static void check_forward_chunks(const forward_plan *pl, const attention_problem *p) {
    size_t next = 0;
    for (size_t c = 0; c < pl->n_chunks; c++) {
        size_t begin, end;
        plan_forward_chunk(pl, p, c, &begin, &end);
        cr_assert_eq(begin, next, "chunk %zu starts at %zu, not %zu", c, begin, next);
        cr_assert_gt(end, begin, "chunk %zu is empty", c);
        cr_assert_eq(begin % KEY_PIECE, 0);
        next = end;
    }
    cr_assert_eq(next, p->len_kv, "the chunks end at %zu of %zu keys", next, p->len_kv);
    if (pl->n_chunks == 1) {
        cr_assert_eq(pl->workspace, 0);
        return;
    }
    const chunk_plan r = plan_forward_chunks(pl);
    cr_assert(r.n_units == pl->n_units && r.n_chunks == pl->n_chunks && r.n_parts == 1);
    cr_assert(r.state && r.last_first);
    cr_assert_eq(pl->workspace, pl->n_units * pl->n_chunks * pl->slot);
    cr_assert_geq(pl->slot, pl->block_q * (p->d_v + 2), "a slot holds rows, maxima and sums");
    cr_assert_leq(2 * r.slot, CHUNK_STACK_FLOATS, "a slot and a state fit the stack");
}

Test(plan, forward_covers_every_row_and_key_once_at_every_thread_count) {
    static const size_t lens_q[] = {1, 2, 7, 16, 17, 33, 100},
                        lens_kv[] = {1, 511, 1024, 1500, 4096, 70000};
    static const size_t heads[][2] = {{1, 1}, {4, 4}, {8, 2}, {6, 1}, {40, 1}};
    static const size_t block_rows[] = {8, 32};
    size_t split = 0, grouped = 0;
    for (size_t a = 0; a < 7; a++)
        for (size_t b = 0; b < 6; b++)
            for (size_t h = 0; h < 5; h++)
                for (size_t k = 0; k < 8; k++) {
                    const fwd_case fc = {1 + k % 2,
                                         heads[h][0],
                                         heads[h][1],
                                         lens_q[a],
                                         lens_kv[b],
                                         k & 2 ? 300 : 64,
                                         k & 4 ? SDPA_BF16 : SDPA_F32,
                                         k & 4 && a & 1 ? SDPA_BF16 : SDPA_F32,
                                         (int)(a + b) & 1};
                    const attention_problem p = fwd_problem(&fc);
                    const size_t rows = block_rows[(a + h) % 2];
                    forward_plan one;
                    plan_forward(&one, &p, rows, (int)k & 1, 1);
                    cr_assert(!one.parallel, "parallel on one thread");
                    check_forward_units(&one, &p);
                    check_forward_chunks(&one, &p);
                    split += one.n_chunks > 1;
                    grouped += (size_t)one.grouped;
                    for (size_t threads = 2; threads <= 64; threads++) {
                        forward_plan many;
                        plan_forward(&many, &p, rows, (int)k & 1, threads);
                        assert_same_forward(&one, &many, threads);
                    }
                }
    cr_assert(split > 0 && grouped > 0, "the shapes reach split-KV (%zu) and grouped decode (%zu)",
              split, grouped);
}

/* ---- the backward's plan ---- */

static void check_backward(const backward_problem *bp) {
    const attention_problem *p = &bp->fwd;
    backward_plan pl;
    plan_backward(&pl, bp, 1);
    cr_assert(!pl.parallel);
    /* units: every (batch, kv head) once */
    cr_assert_eq(pl.tasks_b * pl.task_b, p->batch);
    cr_assert_eq(pl.tasks_h * pl.task_h, p->heads_kv);
    cr_assert_eq(pl.n_units, pl.tasks_b * pl.tasks_h);
    unsigned char *seen = calloc(p->batch * p->heads_kv, 1);
    for (size_t u = 0; u < pl.n_units; u++)
        for (size_t b = u / pl.tasks_h * pl.task_b; b < (u / pl.tasks_h + 1) * pl.task_b; b++)
            for (size_t h = u % pl.tasks_h * pl.task_h; h < (u % pl.tasks_h + 1) * pl.task_h; h++)
                seen[b * p->heads_kv + h]++;
    for (size_t i = 0; i < p->batch * p->heads_kv; i++) cr_assert_eq(seen[i], 1);
    free(seen);
    /* chunks: whole pieces in key order over [0, len_kv), each partial its own */
    size_t next = 0;
    for (size_t c = 0; c < pl.n_chunks; c++) {
        size_t begin, end;
        plan_backward_chunk(&pl, p->len_kv, c, &begin, &end);
        cr_assert(begin == next && end >= begin, "chunk %zu: [%zu, %zu) after %zu", c, begin, end,
                  next);
        cr_assert(begin % KEY_PIECE == 0 || begin == p->len_kv);
        next = end;
    }
    cr_assert_eq(next, pl.n_chunks ? p->len_kv : 0);
    if (pl.n_chunks) {
        cr_assert(pl.n_chunks >= 2 && pl.task_b == 1 && pl.task_h == 1);
        /* parts: bands of whole blocks of sum_rows rows, covering each head's rows once */
        cr_assert(pl.band >= pl.sum_rows && pl.band % pl.sum_rows == 0, "band %zu", pl.band);
        cr_assert(pl.bands * pl.band >= p->len_q && (pl.bands - 1) * pl.band < p->len_q);
        cr_assert_eq(pl.slot, pl.band * p->d_k);
        cr_assert_leq(pl.slot, CHUNK_STACK_FLOATS, "a band's slot fits the stack");
        const chunk_plan r = plan_backward_chunks(&pl);
        cr_assert(r.n_units == pl.n_units && r.n_chunks == pl.n_chunks && !r.state);
        cr_assert_eq(r.n_parts, pl.group * pl.bands);
        cr_assert_eq(pl.workspace, pl.n_units * (pl.n_chunks - 1) * r.n_parts * pl.slot);
    } else {
        cr_assert_eq(pl.workspace, 0);
    }
    for (size_t threads = 2; threads <= 64; threads++) {
        backward_plan many;
        plan_backward(&many, bp, threads);
        cr_assert(many.group == pl.group && many.task_b == pl.task_b && many.task_h == pl.task_h &&
                      many.n_units == pl.n_units && many.n_chunks == pl.n_chunks &&
                      many.chunk_keys == pl.chunk_keys && many.sum_rows == pl.sum_rows &&
                      many.band == pl.band && many.slot == pl.slot &&
                      many.workspace == pl.workspace,
                  "the backward plan changes at %zu threads", threads);
    }
}

Test(plan, backward_covers_every_unit_and_key_once_at_every_thread_count) {
    static const size_t lens[] = {1, 100, 513, 1024, 2560, 5000};
    static const size_t heads[][2] = {{1, 1}, {4, 4}, {8, 2}, {32, 32}};
    for (size_t a = 0; a < 6; a++)
        for (size_t b = 0; b < 6; b++)
            for (size_t h = 0; h < 4; h++)
                for (size_t s = 0; s < 4; s++) {
                    backward_problem bp;
                    memset(&bp, 0, sizeof bp);
                    bp.fwd = shape(lens[a], lens[b], (int)(a + s) & 1);
                    bp.fwd.batch = 1 + s % 2;
                    bp.fwd.heads_q = heads[h][0];
                    bp.fwd.heads_kv = heads[h][1];
                    bp.fwd.d_k = s == 3 ? 300 : 64;
                    for (int i = 0; i < 3; i++) bp.dq_stride[i] = bp.dk_stride[i] = 1;
                    if (s == 2) bp.dk_stride[1] = 0; /* dk summed over kv heads */
                    if (s == 1) bp.dq_stride[0] = 0; /* dq summed over the batch */
                    check_backward(&bp);
                }
}

/* ---- the key-chunk reduction (src/chunks.h) ----
 * A toy reduction whose result shows the order of its sums: chunk c of part p of unit u gives
 * a value of its own (magnitudes 2^-20 to 2^20, so that float sums in another order differ), and
 * the output is chunk 0's value plus each further chunk's, in chunk order. Both schedules, at
 * several thread counts and with the workspace held by another call, must give the bits of that
 * sum written out here, run every (unit, chunk, part) once, and merge in chunk order. */

#define TOY_MAX 64 /* units times parts */

typedef struct toy {
    const chunk_plan *r;
    float out[TOY_MAX];
    unsigned char runs[TOY_MAX * 8];
    size_t merged[TOY_MAX]; /* the last chunk merged */
    int bad, finished[TOY_MAX];
    uintptr_t held_lo, held_hi; /* a workspace another call holds, which no slot may be in */
} toy;

static float toy_value(size_t u, size_t c, size_t part) {
    const unsigned h = (unsigned)(u * 2654435761u + c * 40503u + part * 97u);
    return ldexpf(1.0f + (float)(h % 1000) / 1000.0f, (int)(h >> 8) % 41 - 20);
}

static void toy_with_scratch(const void *ctx, void (*body)(void *, void *), void *arg) {
    (void)ctx;
    int magic = 12345;
    body(arg, &magic);
}

static void toy_run(const void *ctx, void *scratch, size_t u, size_t c, size_t part, float *slot) {
    toy *t = (toy *)ctx;
    const size_t at = u * t->r->n_parts + part;
    if (*(int *)scratch != 12345 || (c == 0 && (slot != NULL) != t->r->state)) t->bad = 1;
    t->runs[at * t->r->n_chunks + c]++;
    if ((uintptr_t)slot >= t->held_lo && (uintptr_t)slot < t->held_hi) t->bad = 1;
    if (c == 0) {
        t->out[at] = toy_value(u, 0, part);
        if (slot) slot[0] = 0.0f; /* the state: merges so far */
        return;
    }
    for (size_t i = 0; i < t->r->slot; i++) slot[i] = toy_value(u, c, part);
}

static void toy_merge(const void *ctx, void *scratch, size_t u, size_t c, size_t part, float *state,
                      const float *slot) {
    toy *t = (toy *)ctx;
    if (*(int *)scratch != 12345) t->bad = 1;
    const size_t at = u * t->r->n_parts + part;
    for (size_t i = 0; i < t->r->slot; i++) /* a slot no other (unit, chunk, part) wrote */
        if (slot[i] != toy_value(u, c, part)) t->bad = 1;
    if (c != t->merged[at] + 1 || (state && state[0] != (float)(c - 1))) t->bad = 1;
    if (state) state[0] = (float)c;
    t->merged[at] = c;
    t->out[at] += slot[0];
}

static void toy_finish(const void *ctx, void *scratch, size_t u, size_t part, float *state) {
    toy *t = (toy *)ctx;
    if (*(int *)scratch != 12345) t->bad = 1;
    const size_t at = u * t->r->n_parts + part;
    if (t->merged[at] + 1 != t->r->n_chunks || (state && state[0] != (float)t->merged[at]))
        t->bad = 1;
    t->finished[at]++;
}

static void check_toy(const chunk_plan *r, int parallel, size_t threads, const float *held) {
    static const chunk_ops ops = {toy_with_scratch, toy_run, toy_merge, toy_finish};
    toy *t = calloc(1, sizeof *t);
    t->r = r;
    if (held) {
        t->held_lo = (uintptr_t)held;
        t->held_hi = (uintptr_t)(held + chunk_plan_workspace(r));
    }
    chunks_run(r, &ops, t, parallel, threads);
    cr_assert(!t->bad, "parallel %d, %zu threads: a slot, a scratch or the order is wrong",
              parallel, threads);
    for (size_t u = 0; u < r->n_units; u++)
        for (size_t part = 0; part < r->n_parts; part++) {
            const size_t at = u * r->n_parts + part;
            float want = toy_value(u, 0, part);
            for (size_t c = 1; c < r->n_chunks; c++) want += toy_value(u, c, part);
            cr_assert(t->out[at] == want,
                      "unit %zu part %zu: %a, not %a (parallel %d, %zu threads)", u, part,
                      (double)t->out[at], (double)want, parallel, threads);
            cr_assert_eq(t->finished[at], 1);
            for (size_t c = 0; c < r->n_chunks; c++)
                cr_assert_eq(t->runs[at * r->n_chunks + c], 1, "unit %zu chunk %zu part %zu", u, c,
                             part);
        }
    free(t);
}

Test(chunks, both_schedules_sum_in_chunk_order_at_every_thread_count) {
    static const size_t shapes[][3] = {{1, 2, 1}, {1, 8, 1}, {3, 5, 4}, {16, 2, 3}, {2, 8, 1}};
    for (size_t s = 0; s < 5; s++)
        for (int flags = 0; flags < 4; flags++) {
            const int state = flags & 1, interleave = flags >> 1;
            const chunk_plan r = {shapes[s][0], shapes[s][1], shapes[s][2], 3 + s,
                                  state,        s & 1,        interleave};
            cr_assert_leq(r.n_units * r.n_parts, TOY_MAX);
            for (size_t threads = 1; threads <= 4; threads++) {
                check_toy(&r, 0, threads, NULL);
                check_toy(&r, 1, threads, NULL);
            }
            /* another call holds the workspace: the call runs in order, on its own slots */
            float *held = sdpa_workspace_acquire(chunk_plan_workspace(&r));
            cr_assert_not_null(held);
            check_toy(&r, 1, 2, held);
            sdpa_workspace_release();
        }
}
