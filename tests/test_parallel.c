/* Threads and split-KV: every attention shape gives the same bits at every thread count and under
 * every host scheduler, on every backend; split-KV results (output and log-sum-exp) hold the
 * accuracy bound against a double-precision reference; sdpa_attention_merge_f32 rebuilds the
 * unsplit attention from 1 to 8 random parts merged in random order, keeps its special-value
 * rules and checks its arguments; the thread setting's own rules. Concurrency (host threads at
 * once, racing settings, fork) is tests/parallel_stress.c, which also runs under TSan. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bounds.h"
#include "common.h"
#include "reference.h"

/* ---- host schedulers ---- */

/* Runs the tasks on the calling thread, last first. */
static void reverse_parallel_for(void *ctx, sdpa_task_fn task, void *arg, size_t n_tasks) {
    (void)ctx;
    for (size_t i = n_tasks; i-- > 0;) task(arg, i);
}

typedef struct host_pool_job {
    sdpa_task_fn task;
    void *arg;
    size_t n_tasks;
    atomic_size_t next;
} host_pool_job;

static void *host_worker(void *p) {
    host_pool_job *j = p;
    for (size_t i; (i = atomic_fetch_add(&j->next, 1)) < j->n_tasks;) j->task(j->arg, i);
    return NULL;
}

/* Runs the tasks on threads of its own (ctx: how many), none on the caller's. */
static void threaded_parallel_for(void *ctx, sdpa_task_fn task, void *arg, size_t n_tasks) {
    const size_t n = (size_t)(uintptr_t)ctx;
    host_pool_job j = {task, arg, n_tasks, 0};
    pthread_t t[8];
    for (size_t i = 0; i < n; i++) cr_assert_eq(pthread_create(&t[i], NULL, host_worker, &j), 0);
    for (size_t i = 0; i < n; i++) pthread_join(t[i], NULL);
}

/* ---- one problem ---- */

typedef struct shape {
    const char *name;
    size_t batch, heads_q, heads_kv, len_q, len_kv, d;
    int causal, masked, bshd;
} shape;

typedef struct problem {
    const shape *s; /* &own */
    shape own;
    sdpa_mha_desc desc;
    float *q, *k, *v, *mask, *out, *lse;
    size_t n_out, n_lse;
} problem;

static void problem_make(problem *p, const shape *s, uint64_t seed) {
    memset(p, 0, sizeof *p);
    p->own = *s;
    /* emulated (qemu's FMA is some 10x slower than its other float operations): fewer rows, still
       several blocks of them, and fewer keys, still over 1100 (a masked head hides a chunk) */
    if (test_quick() && p->own.len_q > 160) {
        if (p->own.len_kv == p->own.len_q) p->own.len_kv = 160;
        p->own.len_q = 160;
    }
    if (test_quick() && p->own.len_kv > 1700) p->own.len_kv = 1700;
    p->s = s = &p->own;
    rng r = rng_seed(seed);
    cr_assert_eq((s->bshd ? sdpa_mha_desc_bshd : sdpa_mha_desc_dense)(
                     &p->desc, s->batch, s->heads_q, s->heads_kv, s->len_q, s->len_kv, s->d, s->d,
                     SDPA_DEFAULT_SCALE, s->causal ? SDPA_CAUSAL : 0),
                 SDPA_OK);
    const size_t nq = s->batch * s->heads_q * s->len_q * s->d;
    const size_t nkv = s->batch * s->heads_kv * s->len_kv * s->d;
    p->n_out = nq;
    p->n_lse = s->batch * s->heads_q * s->len_q;
    p->q = malloc(nq * sizeof(float));
    p->k = malloc(nkv * sizeof(float));
    p->v = malloc(nkv * sizeof(float));
    p->out = malloc(nq * sizeof(float));
    p->lse = malloc(p->n_lse * sizeof(float));
    cr_assert(p->q && p->k && p->v && p->out && p->lse);
    fill_normal(&r, p->q, nq);
    fill_normal(&r, p->k, nkv);
    fill_normal(&r, p->v, nkv);
    if (s->masked) {
        /* a mask per query head; head 1 (or 0) hides its first 1100 keys, a whole split-KV
           chunk or more, so that merges see parts with an lse of -inf */
        const size_t per_head = s->len_q * s->len_kv;
        p->mask = malloc(s->heads_q * per_head * sizeof(float));
        cr_assert(p->mask);
        for (size_t i = 0; i < s->heads_q * per_head; i++)
            p->mask[i] = rng_uniform(&r, 0, 1) < 0.1 ? -INFINITY : (float)rng_uniform(&r, -1, 1);
        const size_t h = s->heads_q > 1 ? 1 : 0;
        for (size_t i = 0; i < s->len_q; i++)
            for (size_t j = 0; j < s->len_kv && j < 1100; j++)
                p->mask[h * per_head + i * s->len_kv + j] = -INFINITY;
        sdpa_mha_desc_set_mask(&p->desc, p->mask, 0, per_head, s->len_kv);
    }
    /* lse dense [batch][heads_q][len_q] */
    p->desc.lse = p->lse;
    p->desc.lse_stride[0] = s->heads_q * s->len_q;
    p->desc.lse_stride[1] = s->len_q;
}

static void problem_free(problem *p) {
    free(p->q);
    free(p->k);
    free(p->v);
    free(p->mask);
    free(p->out);
    free(p->lse);
}

static void problem_run(problem *p) {
    memset(p->out, 0xff, p->n_out * sizeof(float));
    memset(p->lse, 0xff, p->n_lse * sizeof(float));
    cr_assert_eq(sdpa_mha_f32(&p->desc, p->out, p->q, p->k, p->v), SDPA_OK, "%s", p->s->name);
}

/* Every head's output and lse against a double-precision evaluation. */
static void problem_check(const problem *p) {
    const shape *s = p->s;
    const sdpa_mha_desc *d = &p->desc;
    const size_t group = s->heads_q / s->heads_kv;
    const double scale = 1.0 / sqrt((double)s->d);
    double *ref = malloc(s->len_q * s->d * sizeof(double));
    cr_assert(ref);
    for (size_t b = 0; b < s->batch; b++)
        for (size_t h = 0; h < s->heads_q; h++) {
            const float *q = p->q + b * d->q_stride[0] + h * d->q_stride[1];
            const float *k = p->k + b * d->k_stride[0] + h / group * d->k_stride[1];
            const float *v = p->v + b * d->v_stride[0] + h / group * d->v_stride[1];
            const float *mask = p->mask ? p->mask + h * d->mask_stride[1] : NULL;
            const float *out = p->out + b * d->out_stride[0] + h * d->out_stride[1];
            ref_attention(ref, s->d, q, d->q_stride[2], k, d->k_stride[2], v, d->v_stride[2], mask,
                          s->len_kv, s->len_q, s->len_kv, s->d, s->d, scale, s->causal);
            double max_v = 0;
            for (size_t j = 0; j < s->len_kv; j++)
                for (size_t c = 0; c < s->d; c++)
                    if (fabs(v[j * d->v_stride[2] + c]) > max_v)
                        max_v = fabs(v[j * d->v_stride[2] + c]);
            for (size_t i = 0; i < s->len_q; i++) {
                for (size_t c = 0; c < s->d; c++)
                    cr_assert(fabs(out[i * d->out_stride[2] + c] - ref[i * s->d + c]) <=
                                  bound_attention(max_v),
                              "%s: b %zu h %zu row %zu col %zu: %.9g, want %.9g", s->name, b, h, i,
                              c, out[i * d->out_stride[2] + c], ref[i * s->d + c]);
                /* lse: the log of the sum of exp(s_j) over the keys the row sees */
                size_t seen = s->len_kv;
                if (s->causal) seen = i + 1 + s->len_kv - s->len_q;
                double m = -INFINITY, sum = 0, terms = 0;
                double *sc = malloc(seen * sizeof(double));
                cr_assert(sc);
                for (size_t j = 0; j < seen; j++) {
                    const float *kj = k + j * d->k_stride[2];
                    sc[j] = scale * ref_dot(q + i * d->q_stride[2], kj, s->d);
                    const double t = scale * ref_dot_abs(q + i * d->q_stride[2], kj, s->d);
                    if (t > terms) terms = t;
                    if (mask) {
                        const float mj = mask[i * s->len_kv + j];
                        sc[j] = mj == -INFINITY ? -INFINITY : sc[j] + mj;
                    }
                    if (sc[j] > m) m = sc[j];
                }
                for (size_t j = 0; j < seen; j++) sum += m == -INFINITY ? 0 : exp(sc[j] - m);
                free(sc);
                const double want = m == -INFINITY ? -INFINITY : m + log(sum);
                const float got = p->lse[(b * s->heads_q + h) * s->len_q + i];
                const double tol =
                    2.0 * (double)(s->d + 2) * 0x1p-24 * terms + 16.0 * 0x1p-24 * fabs(want) + 1e-6;
                if (isinf(want))
                    cr_assert(got == (float)want, "%s: lse %g, want -inf", s->name, got);
                else
                    cr_assert(fabs(got - want) <= tol,
                              "%s: b %zu h %zu row %zu: lse %.9g want %.9g", s->name, b, h, i, got,
                              want);
            }
        }
    free(ref);
}

/* The shapes: prefill, causal (the uneven rows), GQA decode and decode over many keys
   (split-KV, grouped and not), short causal queries over many keys (split-KV with the diagonal in
   the last chunk), a group wider than a block of rows, masks with whole chunks hidden, lse. */
static const shape SHAPES[] = {
    {"prefill", 2, 3, 3, 100, 130, 64, 0, 0, 0},
    {"causal-gqa-bshd", 1, 4, 2, 300, 300, 64, 1, 1, 1},
    {"gqa-decode", 2, 8, 2, 1, 3000, 64, 0, 1, 0},
    {"decode", 1, 2, 2, 1, 5000, 128, 1, 1, 0},
    {"short-causal", 1, 2, 2, 7, 2600, 32, 1, 1, 0},
    {"wide-group", 1, 40, 1, 1, 1100, 48, 0, 0, 1},
};
#define N_SHAPES (sizeof SHAPES / sizeof SHAPES[0])

static void expect_same(const problem *p, const float *out, const float *lse, const char *how) {
    cr_assert(memcmp(p->out, out, p->n_out * sizeof(float)) == 0, "%s, %s: output differs",
              p->s->name, how);
    cr_assert(memcmp(p->lse, lse, p->n_lse * sizeof(float)) == 0, "%s, %s: lse differs", p->s->name,
              how);
}

static void restore_threads(void) {
    sdpa_set_parallel_for(NULL, NULL);
    sdpa_set_num_threads(0);
}

BACKEND_TEST(parallel, bitwise_identical_at_every_thread_count_and_scheduler) {
    static const size_t THREADS[] = {2, 3, 16, 4, 7, 8}; /* emulated: the first three */
    const size_t n_threads = test_quick() ? 3 : sizeof THREADS / sizeof THREADS[0];
    for (size_t si = 0; si < N_SHAPES; si++) {
        problem p;
        problem_make(&p, &SHAPES[si], 100 + si);
        cr_assert_eq(sdpa_set_num_threads(1), SDPA_OK);
        problem_run(&p);
        float *out = malloc(p.n_out * sizeof(float)), *lse = malloc(p.n_lse * sizeof(float));
        cr_assert(out && lse);
        memcpy(out, p.out, p.n_out * sizeof(float));
        memcpy(lse, p.lse, p.n_lse * sizeof(float));
        for (size_t t = 0; t < n_threads; t++) {
            cr_assert_eq(sdpa_set_num_threads(THREADS[t]), SDPA_OK);
            cr_assert_eq(sdpa_num_threads(), THREADS[t]);
            problem_run(&p);
            char how[32];
            snprintf(how, sizeof how, "%zu threads", THREADS[t]);
            expect_same(&p, out, lse, how);
        }
        sdpa_set_num_threads(4);
        sdpa_set_parallel_for(reverse_parallel_for, NULL);
        problem_run(&p);
        expect_same(&p, out, lse, "host parallel_for in reverse");
        sdpa_set_parallel_for(threaded_parallel_for, (void *)(uintptr_t)3);
        problem_run(&p);
        expect_same(&p, out, lse, "host parallel_for on 3 threads of its own");
        restore_threads();
        problem_run(&p);
        expect_same(&p, out, lse, "default threads");
        free(out);
        free(lse);
        problem_free(&p);
    }
}

BACKEND_TEST(parallel, split_kv_holds_the_accuracy_bound) {
    for (size_t si = 0; si < N_SHAPES; si++) {
        problem p;
        problem_make(&p, &SHAPES[si], 200 + si);
        problem_run(&p);
        problem_check(&p);
        problem_free(&p);
    }
}

/* A query row of NaN gives a NaN row and NaN lse, the same bits at every thread count. */
BACKEND_TEST(parallel, nan_rows_under_split_kv) {
    problem p;
    problem_make(&p, &SHAPES[2], 7);
    p.q[3] = NAN; /* batch 0, head 0 */
    sdpa_set_num_threads(1);
    problem_run(&p);
    cr_assert(isnan(p.lse[0]) && isnan(p.out[0]) && isnan(p.out[63]));
    cr_assert(!isnan(p.lse[1]) && !isnan(p.out[64]));
    float *out = malloc(p.n_out * sizeof(float)), *lse = malloc(p.n_lse * sizeof(float));
    cr_assert(out && lse);
    memcpy(out, p.out, p.n_out * sizeof(float));
    memcpy(lse, p.lse, p.n_lse * sizeof(float));
    sdpa_set_num_threads(2);
    problem_run(&p);
    expect_same(&p, out, lse, "2 threads");
    restore_threads();
    free(out);
    free(lse);
    problem_free(&p);
}

/* sdpa_attention_f32 uses the threads too: its bits do not depend on them. */
BACKEND_TEST(parallel, single_head_entry_point_identical) {
    const size_t lq = 200, lk = 180, d = 64;
    rng r = rng_seed(5);
    float *q = malloc(lq * d * sizeof(float)), *k = malloc(lk * d * sizeof(float));
    float *v = malloc(lk * d * sizeof(float)), *o1 = malloc(lq * d * sizeof(float));
    float *o2 = malloc(lq * d * sizeof(float));
    cr_assert(q && k && v && o1 && o2);
    fill_uniform(&r, q, lq * d, -1, 1);
    fill_uniform(&r, k, lk * d, -1, 1);
    fill_uniform(&r, v, lk * d, -1, 1);
    sdpa_set_num_threads(1);
    cr_assert_eq(sdpa_attention_f32(o1, q, k, v, lq, lk, d, d, 0, SDPA_CAUSAL), SDPA_OK);
    sdpa_set_num_threads(7);
    cr_assert_eq(sdpa_attention_f32(o2, q, k, v, lq, lk, d, d, 0, SDPA_CAUSAL), SDPA_OK);
    cr_assert(memcmp(o1, o2, lq * d * sizeof(float)) == 0);
    restore_threads();
    free(q);
    free(k);
    free(v);
    free(o1);
    free(o2);
}

/* ---- merge ---- */

/* Attention of one head over keys split into 1..8 random parts, each part computed with its lse,
   merged in random order, against the unsplit double-precision reference. */
BACKEND_TEST(merge, random_parts_in_random_order_match_the_reference) {
    rng r = rng_seed(77);
    const size_t lq = 6, d = 40;
    const int trials = test_quick() ? 10 : 40; /* emulated: the native run covers the rest */
    for (int trial = 0; trial < trials; trial++) {
        const size_t lk = 8 + (size_t)rng_uniform(&r, 0, 900);
        const size_t n_parts = 1 + (size_t)rng_uniform(&r, 0, 8);
        float *q = malloc(lq * d * sizeof(float)), *k = malloc(lk * d * sizeof(float));
        float *v = malloc(lk * d * sizeof(float));
        float *outs = malloc(n_parts * lq * d * sizeof(float));
        float *lses = malloc(n_parts * lq * sizeof(float));
        double *ref = malloc(lq * d * sizeof(double));
        cr_assert(q && k && v && outs && lses && ref);
        fill_normal(&r, q, lq * d);
        fill_normal(&r, k, lk * d);
        fill_normal(&r, v, lk * d);
        /* cut points: n_parts - 1 distinct random keys (parts may be empty only at n > lk) */
        size_t cut[9];
        cut[0] = 0;
        cut[n_parts] = lk;
        for (size_t i = 1; i < n_parts; i++) cut[i] = (size_t)rng_uniform(&r, 0, (double)lk + 1);
        for (size_t i = 1; i < n_parts; i++) /* sort */
            for (size_t j = i; j > 1 && cut[j - 1] > cut[j]; j--) {
                size_t t = cut[j];
                cut[j] = cut[j - 1];
                cut[j - 1] = t;
            }
        for (size_t i = 0; i < n_parts; i++) {
            sdpa_mha_desc desc;
            const size_t n = cut[i + 1] - cut[i];
            sdpa_mha_desc_dense(&desc, 1, 1, 1, lq, n, d, d, SDPA_DEFAULT_SCALE, 0);
            desc.lse = lses + i * lq;
            cr_assert_eq(sdpa_mha_f32(&desc, outs + i * lq * d, q, k + cut[i] * d, v + cut[i] * d),
                         SDPA_OK);
        }
        /* a random order: Fisher-Yates over the parts, then merge into the first */
        size_t order[8];
        for (size_t i = 0; i < n_parts; i++) order[i] = i;
        for (size_t i = n_parts; i-- > 1;) {
            size_t j = (size_t)rng_uniform(&r, 0, (double)i + 1);
            size_t t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        float *acc = outs + order[0] * lq * d, *acc_lse = lses + order[0] * lq;
        for (size_t i = 1; i < n_parts; i++)
            cr_assert_eq(sdpa_attention_merge_f32(acc, acc_lse, outs + order[i] * lq * d,
                                                  lses + order[i] * lq, lq, d, d, d),
                         SDPA_OK);
        ref_attention(ref, d, q, d, k, d, v, d, NULL, 0, lq, lk, d, d, 1.0 / sqrt((double)d), 0);
        double max_v = 0;
        for (size_t i = 0; i < lk * d; i++) max_v = fabs(v[i]) > max_v ? fabs(v[i]) : max_v;
        for (size_t i = 0; i < lq * d; i++)
            cr_assert(fabs(acc[i] - ref[i]) <= bound_attention(max_v),
                      "trial %d (%zu keys, %zu parts): out[%zu] %.9g, want %.9g", trial, lk,
                      n_parts, i, acc[i], ref[i]);
        free(q);
        free(k);
        free(v);
        free(outs);
        free(lses);
        free(ref);
    }
}

Test(merge, a_part_that_saw_no_key_contributes_exactly_nothing) {
    enum { ROWS = 3, D = 5 };
    float a[ROWS * D], b[ROWS * D], la[ROWS], lb[ROWS], keep[ROWS * D], keep_l[ROWS];
    for (int i = 0; i < ROWS * D; i++) a[i] = 0.1f * (float)i - 0.3f, b[i] = 7.0f + (float)i;
    la[0] = 1.5f, la[1] = -INFINITY, la[2] = -INFINITY;
    lb[0] = -INFINITY, lb[1] = 0.25f, lb[2] = -INFINITY;
    for (int c = 0; c < D; c++) a[2 * D + c] = 0.0f, b[2 * D + c] = 0.0f; /* two empty parts */
    memcpy(keep, a, sizeof a);
    memcpy(keep_l, la, sizeof la);
    cr_assert_eq(sdpa_attention_merge_f32(a, la, b, lb, ROWS, D, D, D), SDPA_OK);
    cr_assert(memcmp(a, keep, D * sizeof(float)) == 0 && la[0] == keep_l[0], "row 0: a kept");
    cr_assert(memcmp(a + D, b + D, D * sizeof(float)) == 0 && la[1] == 0.25f, "row 1: b taken");
    for (int c = 0; c < D; c++) cr_assert(a[2 * D + c] == 0.0f);
    cr_assert(la[2] == -INFINITY, "two empty parts: -inf");
}

Test(merge, nan_or_plus_inf_lse_gives_a_nan_row) {
    float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, la[2] = {NAN, 0.5f}, lb[2] = {0.0f, INFINITY};
    cr_assert_eq(sdpa_attention_merge_f32(a, la, b, lb, 2, 2, 2, 2), SDPA_OK);
    for (int i = 0; i < 4; i++) cr_assert(isnan(a[i]));
    cr_assert(isnan(la[0]) && isnan(la[1]));
    /* but an empty part keeps even a NaN row as it is */
    float c[2] = {NAN, 1}, lc[1] = {NAN}, e[2] = {0, 0}, le[1] = {-INFINITY};
    cr_assert_eq(sdpa_attention_merge_f32(c, lc, e, le, 1, 2, 2, 2), SDPA_OK);
    cr_assert(isnan(c[0]) && c[1] == 1 && isnan(lc[0]));
}

Test(merge, equal_weights_and_self_merge) {
    float a[2] = {1, 3}, b[2] = {3, 5}, la[1] = {2.0f}, lb[1] = {2.0f};
    cr_assert_eq(sdpa_attention_merge_f32(a, la, b, lb, 1, 2, 2, 2), SDPA_OK);
    cr_assert(a[0] == 2 && a[1] == 4);
    cr_assert(fabsf(la[0] - (2.0f + logf(2.0f))) < 1e-6f);
    /* a part merged with itself: out stays, lse grows by log 2 */
    float s[3] = {1, 2, 3}, ls[1] = {0.0f};
    cr_assert_eq(sdpa_attention_merge_f32(s, ls, s, ls, 1, 3, 3, 3), SDPA_OK);
    cr_assert(s[0] == 1 && s[1] == 2 && s[2] == 3);
    cr_assert(fabsf(ls[0] - logf(2.0f)) < 1e-6f);
}

Test(merge, checks_its_arguments) {
    float out[32], lse[4], ob[32], lb[4];
    for (int i = 0; i < 32; i++) out[i] = ob[i] = SENTINEL;
    for (int i = 0; i < 4; i++) lse[i] = lb[i] = 0.0f;
    cr_assert_eq(sdpa_attention_merge_f32(NULL, NULL, NULL, NULL, 0, 4, 4, 4), SDPA_OK);
    cr_assert_eq(sdpa_attention_merge_f32(NULL, lse, ob, lb, 2, 4, 4, 4), SDPA_ERR_NULL);
    cr_assert_eq(sdpa_attention_merge_f32(out, NULL, ob, lb, 2, 4, 4, 4), SDPA_ERR_NULL);
    cr_assert_eq(sdpa_attention_merge_f32(out, lse, NULL, lb, 2, 4, 4, 4), SDPA_ERR_NULL);
    cr_assert_eq(sdpa_attention_merge_f32(out, lse, ob, NULL, 2, 4, 4, 4), SDPA_ERR_NULL);
    cr_assert_eq(sdpa_attention_merge_f32(out, lse, ob, lb, 2, 0, 4, 4), SDPA_ERR_SIZE);
    cr_assert_eq(sdpa_attention_merge_f32(out, lse, ob, lb, 2, 4, 3, 4), SDPA_ERR_SIZE);
    cr_assert_eq(sdpa_attention_merge_f32(out, lse, ob, lb, 2, 4, 4, 3), SDPA_ERR_SIZE);
    cr_assert_eq(sdpa_attention_merge_f32(out, lse, ob, lb, 2, 4, SIZE_MAX / 2, 4), SDPA_ERR_SIZE);
    /* overlaps: out with out_b shifted, lse inside out, out_b with lse, lse with lse_b shifted */
    cr_assert_eq(sdpa_attention_merge_f32(out, lse, out + 2, lb, 2, 4, 4, 4), SDPA_ERR_SIZE);
    cr_assert_eq(sdpa_attention_merge_f32(out, out + 5, ob, lb, 2, 4, 4, 4), SDPA_ERR_SIZE);
    cr_assert_eq(sdpa_attention_merge_f32(out, lse, ob, out + 1, 2, 4, 4, 4), SDPA_ERR_SIZE);
    cr_assert_eq(sdpa_attention_merge_f32(out, lse, ob, lse + 1, 2, 4, 4, 4), SDPA_ERR_SIZE);
    cr_assert_eq(sdpa_attention_merge_f32(out, lse, out, lb, 2, 4, 4, 8), SDPA_ERR_SIZE);
    for (int i = 0; i < 32; i++) cr_assert(out[i] == SENTINEL, "written on error");
    /* the one alias allowed: the same rows (and the same lse) */
    cr_assert_eq(sdpa_attention_merge_f32(out, lse, out, lse, 2, 4, 4, 4), SDPA_OK);
}

/* ---- the thread setting ---- */

Test(threads_setting, default_count_and_limits) {
    cr_assert_eq(sdpa_set_num_threads(0), SDPA_OK);
    const size_t def = sdpa_num_threads();
    cr_assert(def >= 1);
    cr_assert_eq(sdpa_set_num_threads(3), SDPA_OK);
    cr_assert_eq(sdpa_num_threads(), 3);
    cr_assert_eq(sdpa_set_num_threads(1025), SDPA_ERR_ARG);
    cr_assert_eq(sdpa_num_threads(), 3, "unchanged on error");
    cr_assert_eq(sdpa_set_num_threads(1024), SDPA_OK);
    cr_assert_eq(sdpa_set_num_threads(0), SDPA_OK);
    cr_assert_eq(sdpa_num_threads(), def);
    cr_assert_eq(sdpa_set_parallel_for(NULL, NULL), SDPA_OK);
}

/* sdpa_mha over 16-bit views (each task widens into tiles of its own): the same bits at every
   thread count, for prefill with an f16 K/V cache and a bf16 out, GQA decode over bf16 and
   decode over f16 (both split-KV); with an f32 out, also the bits of sdpa_mha_f32 on the widened
   K and V (the same blocks, chunks and merges). */
BACKEND_TEST(parallel, sixteen_bit_views_identical) {
    static const struct {
        size_t hq, hk, lq, lk, d;
        uint32_t kv_type, out_type, flags;
    } CASES[] = {{4, 2, 150, 170, 64, SDPA_F16, SDPA_BF16, SDPA_CAUSAL},
                 {16, 4, 1, 2100, 64, SDPA_BF16, SDPA_F32, 0},
                 {1, 1, 1, 2600, 128, SDPA_F16, SDPA_F32, 0}};
    for (size_t ci = 0; ci < sizeof CASES / sizeof CASES[0]; ci++) {
        const size_t hq = CASES[ci].hq, hk = CASES[ci].hk, lq = CASES[ci].lq, lk = CASES[ci].lk,
                     d = CASES[ci].d;
        sdpa_mha_desc desc;
        cr_assert_eq(sdpa_mha_desc_dense(&desc, 1, hq, hk, lq, lk, d, d, 0, CASES[ci].flags),
                     SDPA_OK);
        desc.kv_type = CASES[ci].kv_type;
        desc.out_type = CASES[ci].out_type;
        const size_t nq = hq * lq * d, nkv = hk * lk * d;
        rng r = rng_seed(40 + ci);
        float *q = malloc(nq * sizeof(float)), *kf = malloc(nkv * sizeof(float));
        float *vf = malloc(nkv * sizeof(float));
        uint16_t *k = malloc(nkv * 2), *v = malloc(nkv * 2);
        char *o1 = malloc(nq * 4), *o2 = malloc(nq * 4);
        cr_assert(q && kf && vf && k && v && o1 && o2);
        fill_uniform(&r, q, nq, -1, 1);
        fill_uniform(&r, kf, nkv, -1, 1);
        fill_uniform(&r, vf, nkv, -1, 1);
        cr_assert_eq(sdpa_convert(k, CASES[ci].kv_type, kf, SDPA_F32, nkv), SDPA_OK);
        cr_assert_eq(sdpa_convert(v, CASES[ci].kv_type, vf, SDPA_F32, nkv), SDPA_OK);
        const size_t out_bytes = nq * (CASES[ci].out_type == SDPA_F32 ? 4 : 2);
        sdpa_set_num_threads(1);
        cr_assert_eq(sdpa_mha(&desc, o1, q, k, v), SDPA_OK);
        static const size_t THREADS[] = {2, 3, 16};
        for (size_t t = 0; t < 3; t++) {
            sdpa_set_num_threads(THREADS[t]);
            memset(o2, 0xff, nq * 4);
            cr_assert_eq(sdpa_mha(&desc, o2, q, k, v), SDPA_OK);
            cr_assert(memcmp(o1, o2, out_bytes) == 0, "case %zu, %zu threads: output differs", ci,
                      THREADS[t]);
        }
        if (CASES[ci].out_type == SDPA_F32) {
            cr_assert_eq(sdpa_convert(kf, SDPA_F32, k, CASES[ci].kv_type, nkv), SDPA_OK);
            cr_assert_eq(sdpa_convert(vf, SDPA_F32, v, CASES[ci].kv_type, nkv), SDPA_OK);
            desc.kv_type = desc.out_type = SDPA_F32;
            cr_assert_eq(sdpa_mha_f32(&desc, (float *)o2, q, kf, vf), SDPA_OK);
            cr_assert(memcmp(o1, o2, out_bytes) == 0, "case %zu: not the f32 path's bits", ci);
        }
        restore_threads();
        free(q);
        free(kf);
        free(vf);
        free(k);
        free(v);
        free(o1);
        free(o2);
    }
}

/* Short queries of a wide f16 q (d_k 1024): 16-bit rows come in blocks of 8, so a head's 12 rows
   are two units, which must not be split over keys (a chunk covers a head's first rows); every
   row against the double reference on the widened q, at 1 and 3 threads. */
BACKEND_TEST(parallel, short_wide_queries_in_two_blocks) {
    const size_t lq = 12, lk = 1100, dk = 1024, dv = 64;
    rng r = rng_seed(9);
    float *qf = malloc(lq * dk * sizeof(float)), *k = malloc(lk * dk * sizeof(float));
    float *v = malloc(lk * dv * sizeof(float)), *out = malloc(lq * dv * sizeof(float));
    uint16_t *q = malloc(lq * dk * 2);
    double *ref = malloc(lq * dv * sizeof(double));
    cr_assert(qf && k && v && out && q && ref);
    fill_uniform(&r, qf, lq * dk, -1, 1);
    fill_uniform(&r, k, lk * dk, -1, 1);
    fill_uniform(&r, v, lk * dv, -1, 1);
    cr_assert_eq(sdpa_convert(q, SDPA_F16, qf, SDPA_F32, lq * dk), SDPA_OK);
    cr_assert_eq(sdpa_convert(qf, SDPA_F32, q, SDPA_F16, lq * dk), SDPA_OK);
    ref_attention(ref, dv, qf, dk, k, dk, v, dv, NULL, 0, lq, lk, dk, dv, 1.0 / sqrt((double)dk),
                  1);
    sdpa_mha_desc desc;
    cr_assert_eq(sdpa_mha_desc_dense(&desc, 1, 1, 1, lq, lk, dk, dv, 0, SDPA_CAUSAL), SDPA_OK);
    desc.q_type = SDPA_F16;
    static const size_t THREADS[] = {1, 3};
    for (size_t t = 0; t < 2; t++) {
        sdpa_set_num_threads(THREADS[t]);
        cr_assert_eq(sdpa_mha(&desc, out, q, k, v), SDPA_OK);
        for (size_t i = 0; i < lq * dv; i++)
            cr_assert(fabs(out[i] - ref[i]) <= 1e-4, "%zu threads, row %zu col %zu: %g, want %g",
                      THREADS[t], i / dv, i % dv, out[i], ref[i]);
    }
    restore_threads();
    free(qf);
    free(k);
    free(v);
    free(out);
    free(q);
    free(ref);
}
