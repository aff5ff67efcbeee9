/* sdpa_mha_backward_f32: dq, dk, dv against a double-precision evaluation of the textbook
 * gradient (tests/reference.c, itself checked against central finite differences of a double
 * forward pass), on every backend, within include/sdpa.h's per-output bounds; GQA, broadcast
 * K/V, causal with len_q != len_kv, masks with -inf and fully masked rows, the special-value
 * rules, the argument checks (nothing written on error), and the same bits at every thread
 * count and under a host's scheduler. */
#include <fenv.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bounds.h"
#include "common.h"
#include "reference.h"

typedef struct bw_case {
    size_t batch, heads_q, heads_kv, len_q, len_kv, d_k, d_v;
    int causal, bshd;
    int masked;       /* a random mask with -inf entries, and its row 0 all -inf */
    int kv_broadcast; /* 1: one k and v for the batch (batch stride 0); 2: for the kv heads (head
                         stride 0); 3: both. dk and dv alike, so summed over that axis */
    float scale;      /* SDPA_DEFAULT_SCALE or another */
} bw_case;

typedef struct bw_data {
    bw_case c;
    sdpa_mha_desc desc;
    sdpa_mha_grads grads;
    float *q, *k, *v, *out, *lse, *mask, *dout, *dq, *dk, *dv;
    size_t n_q, n_k, n_v, n_out, n_lse, n_dk, n_dv;
} bw_data;

static float *alloc_floats(size_t n) {
    float *p = malloc((n ? n : 1) * sizeof(float));
    cr_assert(p);
    return p;
}

static size_t extent(const size_t stride[3], size_t d0, size_t d1, size_t d2, size_t row) {
    return (d0 - 1) * stride[0] + (d1 - 1) * stride[1] + (d2 - 1) * stride[2] + row;
}

/* The case's tensors, random, and the forward with its lse. */
static void bw_setup(rng *r, const bw_case *c, bw_data *x) {
    memset(x, 0, sizeof *x);
    x->c = *c;
    sdpa_mha_desc *desc = &x->desc;
    cr_assert_eq((c->bshd ? sdpa_mha_desc_bshd : sdpa_mha_desc_dense)(
                     desc, c->batch, c->heads_q, c->heads_kv, c->len_q, c->len_kv, c->d_k, c->d_v,
                     c->scale, c->causal ? SDPA_CAUSAL : 0),
                 SDPA_OK);
    if (c->kv_broadcast & 1) desc->k_stride[0] = desc->v_stride[0] = 0;
    if (c->kv_broadcast & 2) desc->k_stride[1] = desc->v_stride[1] = 0;
    x->n_q = extent(desc->q_stride, c->batch, c->heads_q, c->len_q, c->d_k);
    x->n_out = extent(desc->out_stride, c->batch, c->heads_q, c->len_q, c->d_v);
    x->n_k = extent(desc->k_stride, c->batch, c->heads_kv, c->len_kv, c->d_k);
    x->n_v = extent(desc->v_stride, c->batch, c->heads_kv, c->len_kv, c->d_v);
    x->n_lse = c->batch * c->heads_q * c->len_q;
    x->q = alloc_floats(x->n_q);
    x->k = alloc_floats(x->n_k);
    x->v = alloc_floats(x->n_v);
    x->out = alloc_floats(x->n_out);
    x->dout = alloc_floats(x->n_out);
    x->dq = alloc_floats(x->n_q);
    x->lse = alloc_floats(x->n_lse);
    fill_normal(r, x->q, x->n_q);
    fill_normal(r, x->k, x->n_k);
    fill_normal(r, x->v, x->n_v);
    fill_normal(r, x->dout, x->n_out);
    if (c->masked) {
        x->mask = alloc_floats(c->len_q * c->len_kv);
        for (size_t i = 0; i < c->len_q * c->len_kv; i++)
            x->mask[i] = rng_uniform(r, 0, 1) < 0.2 ? -INFINITY : (float)rng_uniform(r, -2, 2);
        for (size_t j = 0; j < c->len_kv; j++) x->mask[j] = -INFINITY;
        sdpa_mha_desc_set_mask(desc, x->mask, 0, 0, c->len_kv);
    }
    desc->lse = x->lse;
    desc->lse_stride[0] = c->heads_q * c->len_q;
    desc->lse_stride[1] = c->len_q;
    cr_assert_eq(sdpa_mha_f32(desc, x->out, x->q, x->k, x->v), SDPA_OK);

    sdpa_mha_grads *g = &x->grads;
    g->struct_size = sizeof *g;
    memcpy(g->dq_stride, desc->q_stride, sizeof g->dq_stride);
    memcpy(g->dk_stride, desc->k_stride, sizeof g->dk_stride);
    memcpy(g->dv_stride, desc->v_stride, sizeof g->dv_stride);
    memcpy(g->dout_stride, desc->out_stride, sizeof g->dout_stride);
    x->n_dk = x->n_k;
    x->n_dv = x->n_v;
    x->dk = alloc_floats(x->n_dk);
    x->dv = alloc_floats(x->n_dv);
    g->dq = x->dq;
    g->dk = x->dk;
    g->dv = x->dv;
    g->dout = x->dout;
}

static void bw_free(bw_data *x) {
    float *all[] = {x->q, x->k, x->v, x->out, x->lse, x->mask, x->dout, x->dq, x->dk, x->dv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

static sdpa_status bw_run(bw_data *x) {
    return sdpa_mha_backward_f32(&x->desc, &x->grads, x->q, x->k, x->v, x->out);
}

/* rows of a strided head as dense doubles */
static double *head_rows(const float *base, size_t stride, size_t rows, size_t row) {
    double *d = malloc((rows * row + 1) * sizeof *d);
    cr_assert(d);
    for (size_t i = 0; i < rows; i++)
        for (size_t c = 0; c < row; c++) d[i * row + c] = base[i * stride + c];
    return d;
}

/* include/sdpa.h's bound; with another scale than the default it grows with the scores' standard
 * deviation, |scale| sqrt(d_k) for unit-normal inputs (the scores' rounding moves P) */
static double coefficient(const bw_case *c) {
    const double sd = c->scale == 0.0f ? 1.0 : fabs((double)c->scale) * sqrt((double)c->d_k);
    return 1e-5 * (sd > 1.0 ? sd : 1.0);
}

static void expect_close(const char *what, const bw_case *c, size_t b, size_t h, size_t i,
                         size_t col, float got, double want, double terms) {
    const double tol = coefficient(c) * terms + 1e-30;
    cr_assert(fabs(got - want) <= tol,
              "%s[b %zu][h %zu][%zu][%zu] = %.9g, want %.9g (|err| %.3g > %.3g; %zux%zux%zu "
              "%zux%zu d %zu/%zu causal %d mask %d bcast %d)",
              what, b, h, i, col, got, want, fabs(got - want), tol, c->batch, c->heads_q,
              c->heads_kv, c->len_q, c->len_kv, c->d_k, c->d_v, c->causal, c->masked,
              c->kv_broadcast);
}

/* The call's gradients against the reference, head by head; dk and dv summed over the query
 * heads of a group and, for broadcast K/V, over the batch. */
static void bw_check(const bw_data *x) {
    const bw_case *c = &x->c;
    const sdpa_mha_desc *desc = &x->desc;
    const sdpa_mha_grads *g = &x->grads;
    const size_t group = c->heads_q / c->heads_kv, nb_kv = c->kv_broadcast & 1 ? 1 : c->batch;
    const size_t nh_kv = c->kv_broadcast & 2 ? 1 : c->heads_kv;
    const size_t kd = c->len_kv * c->d_k, vd = c->len_kv * c->d_v;
    double *dk_sum = calloc(nb_kv * c->heads_kv * kd + 1, sizeof(double));
    double *tk_sum = calloc(nb_kv * c->heads_kv * kd + 1, sizeof(double));
    double *dv_sum = calloc(nb_kv * c->heads_kv * vd + 1, sizeof(double));
    double *tv_sum = calloc(nb_kv * c->heads_kv * vd + 1, sizeof(double));
    double *dq = malloc((c->len_q * c->d_k + 1) * sizeof(double));
    double *tq = malloc((c->len_q * c->d_k + 1) * sizeof(double));
    double *dk = malloc((kd + 1) * sizeof(double)), *tk = malloc((kd + 1) * sizeof(double));
    double *dv = malloc((vd + 1) * sizeof(double)), *tv = malloc((vd + 1) * sizeof(double));
    cr_assert(dk_sum && tk_sum && dv_sum && tv_sum && dq && tq && dk && tk && dv && tv);
    const double scale = c->scale == 0.0f ? 1.0 / sqrt((double)c->d_k) : (double)c->scale;
    for (size_t b = 0; b < c->batch; b++)
        for (size_t h = 0; h < c->heads_q; h++) {
            const size_t hk = h / group, bk = c->kv_broadcast & 1 ? 0 : b;
            double *q = head_rows(x->q + b * desc->q_stride[0] + h * desc->q_stride[1],
                                  desc->q_stride[2], c->len_q, c->d_k);
            double *k = head_rows(x->k + b * desc->k_stride[0] + hk * desc->k_stride[1],
                                  desc->k_stride[2], c->len_kv, c->d_k);
            double *v = head_rows(x->v + b * desc->v_stride[0] + hk * desc->v_stride[1],
                                  desc->v_stride[2], c->len_kv, c->d_v);
            double *go = head_rows(x->dout + b * g->dout_stride[0] + h * g->dout_stride[1],
                                   g->dout_stride[2], c->len_q, c->d_v);
            ref_attention_grads(dq, dk, dv, NULL, tq, tk, tv, q, k, v, go, x->mask, c->len_q,
                                c->len_kv, c->d_k, c->d_v, scale, c->causal);
            const float *got_q = x->dq + b * g->dq_stride[0] + h * g->dq_stride[1];
            for (size_t i = 0; i < c->len_q; i++)
                for (size_t col = 0; col < c->d_k; col++)
                    expect_close("dq", c, b, h, i, col, got_q[i * g->dq_stride[2] + col],
                                 dq[i * c->d_k + col], tq[i * c->d_k + col]);
            const size_t at = bk * c->heads_kv + (c->kv_broadcast & 2 ? 0 : hk);
            for (size_t e = 0; e < kd; e++) {
                dk_sum[at * kd + e] += dk[e];
                tk_sum[at * kd + e] += tk[e];
            }
            for (size_t e = 0; e < vd; e++) {
                dv_sum[at * vd + e] += dv[e];
                tv_sum[at * vd + e] += tv[e];
            }
            free(q);
            free(k);
            free(v);
            free(go);
        }
    for (size_t b = 0; b < nb_kv; b++)
        for (size_t hk = 0; hk < nh_kv; hk++) {
            const size_t at = b * c->heads_kv + hk;
            const float *got_k = x->dk + b * g->dk_stride[0] + hk * g->dk_stride[1];
            const float *got_v = x->dv + b * g->dv_stride[0] + hk * g->dv_stride[1];
            for (size_t j = 0; j < c->len_kv; j++) {
                for (size_t col = 0; col < c->d_k; col++)
                    expect_close("dk", c, b, hk, j, col, got_k[j * g->dk_stride[2] + col],
                                 dk_sum[at * kd + j * c->d_k + col],
                                 tk_sum[at * kd + j * c->d_k + col]);
                for (size_t col = 0; col < c->d_v; col++)
                    expect_close("dv", c, b, hk, j, col, got_v[j * g->dv_stride[2] + col],
                                 dv_sum[at * vd + j * c->d_v + col],
                                 tv_sum[at * vd + j * c->d_v + col]);
            }
        }
    free(dk_sum);
    free(tk_sum);
    free(dv_sum);
    free(tv_sum);
    free(dq);
    free(tq);
    free(dk);
    free(tk);
    free(dv);
    free(tv);
}

static void run_case(rng *r, const bw_case *c) {
    bw_data x;
    bw_setup(r, c, &x);
    cr_assert_eq(bw_run(&x), SDPA_OK);
    bw_check(&x);
    bw_free(&x);
}

/* ---- accuracy on every backend ---- */

/* Small shapes through every path: the whole-tile products, the causal diagonal, partial blocks
 * of queries and keys, the packed tiles (d <= 128) and the rows of scores_tile (d > 128). */
BACKEND_TEST(backward, small_shapes) {
    rng r = rng_seed(2401);
    const bw_case cases[] = {
        {1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0},         {1, 2, 2, 37, 53, 24, 40, 0, 0, 0, 0, 0},
        {1, 2, 2, 37, 53, 24, 40, 1, 0, 0, 0, 0},     {1, 1, 1, 70, 30, 16, 16, 1, 0, 0, 0, 0},
        {2, 4, 2, 33, 65, 32, 32, 1, 1, 0, 0, 0},     {2, 3, 1, 9, 140, 8, 20, 0, 1, 0, 0, 0},
        {2, 2, 2, 31, 47, 16, 16, 0, 0, 1, 0, 0},     {1, 2, 1, 45, 45, 20, 12, 1, 0, 1, 0, 0},
        {3, 2, 1, 20, 70, 24, 24, 1, 0, 0, 1, 0},     {2, 4, 2, 17, 33, 130, 136, 1, 0, 0, 0, 0},
        {1, 1, 1, 64, 128, 64, 64, 0, 0, 0, 0, 2.0f}, {1, 1, 1, 96, 96, 40, 40, 1, 0, 1, 0, -0.5f},
        {2, 6, 3, 21, 40, 16, 24, 0, 1, 0, 2, 0},     {2, 4, 2, 19, 50, 24, 16, 1, 0, 1, 3, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&r, &cases[i]);
}

/* The sizes include/sdpa.h's bound is stated for: len to 4096, d to 256 (fewer under
 * emulation). */
BACKEND_TEST(backward, long_and_wide) {
    rng r = rng_seed(2402);
    const int quick = test_quick();
    const bw_case cases[] = {
        {1, 1, 1, quick ? 8 : 24, quick ? 1024 : 4096, 64, 64, 0, 0, 0, 0, 0},
        {1, 1, 1, quick ? 512 : 4096, quick ? 24 : 40, 32, 32, 1, 0, 0, 0, 0},
        {1, 1, 1, quick ? 40 : 100, quick ? 40 : 120, 256, 256, 1, 0, 0, 0, 0},
        {1, 2, 1, quick ? 64 : 160, quick ? 64 : 160, 128, 128, 0, 1, 0, 0, 0},
        /* causal past one 512-key chunk: the rows before the last chunk's first see none of it */
        {1, 1, 1, quick ? 600 : 1100, quick ? 600 : 1100, 32, 32, 1, 0, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&r, &cases[i]);
}

/* One q for every query head (head stride 0), and so one dq summed over them: MQA over enough
 * keys for key chunks, at 1 and 2 threads. */
BACKEND_TEST(backward, dq_summed_over_broadcast_q) {
    enum { HQ = 3, LQ = 40, D = 16 };
    const size_t LK = test_quick() ? 600 : 1100; /* two key pieces, or three */
    rng r = rng_seed(2410);
    float *q = alloc_floats(LQ * D), *k = alloc_floats(LK * D), *v = alloc_floats(LK * D);
    float *out = alloc_floats(HQ * LQ * D), *dout = alloc_floats(HQ * LQ * D);
    float *dq = alloc_floats(LQ * D), *dq1 = alloc_floats(LQ * D), *dk = alloc_floats(LK * D);
    float *dv = alloc_floats(LK * D), *lse = alloc_floats(HQ * LQ);
    fill_normal(&r, q, LQ * D);
    fill_normal(&r, k, LK * D);
    fill_normal(&r, v, LK * D);
    fill_normal(&r, dout, HQ * LQ * D);
    sdpa_mha_desc d;
    sdpa_mha_desc_dense(&d, 1, HQ, 1, LQ, LK, D, D, SDPA_DEFAULT_SCALE, SDPA_CAUSAL);
    d.q_stride[1] = 0;
    d.lse = lse;
    d.lse_stride[0] = HQ * LQ;
    d.lse_stride[1] = LQ;
    cr_assert_eq(sdpa_mha_f32(&d, out, q, k, v), SDPA_OK);
    sdpa_mha_grads g = {sizeof g, 0, dq, dk, dv, {LQ * D, 0, D}, {0}, {0}, dout, {0}, NULL};
    memcpy(g.dk_stride, d.k_stride, sizeof g.dk_stride);
    memcpy(g.dv_stride, d.v_stride, sizeof g.dv_stride);
    memcpy(g.dout_stride, d.out_stride, sizeof g.dout_stride);
    sdpa_set_num_threads(1);
    cr_assert_eq(sdpa_mha_backward_f32(&d, &g, q, k, v, out), SDPA_OK);
    memcpy(dq1, dq, LQ * D * sizeof(float));
    sdpa_set_num_threads(2);
    cr_assert_eq(sdpa_mha_backward_f32(&d, &g, q, k, v, out), SDPA_OK);
    sdpa_set_num_threads(0);
    cr_assert(memcmp(dq, dq1, LQ * D * sizeof(float)) == 0, "2 threads: other bits");
    double *qd = head_rows(q, D, LQ, D), *kd = head_rows(k, D, LK, D), *vd = head_rows(v, D, LK, D);
    double *want = calloc(LQ * D, sizeof(double)), *terms = calloc(LQ * D, sizeof(double));
    double *gq = malloc(LQ * D * sizeof(double)), *tq = malloc(LQ * D * sizeof(double));
    double *gk = malloc(LK * D * sizeof(double)), *gv = malloc(LK * D * sizeof(double));
    cr_assert(want && terms && gq && tq && gk && gv);
    for (size_t h = 0; h < HQ; h++) {
        double *go = head_rows(dout + h * LQ * D, D, LQ, D);
        ref_attention_grads(gq, gk, gv, NULL, tq, NULL, NULL, qd, kd, vd, go, NULL, LQ, LK, D, D,
                            1.0 / sqrt((double)D), 1);
        for (size_t e = 0; e < LQ * D; e++) want[e] += gq[e], terms[e] += tq[e];
        free(go);
    }
    for (size_t e = 0; e < LQ * D; e++)
        cr_assert(fabs(dq[e] - want[e]) <= 1e-5 * terms[e] + 1e-30, "dq[%zu] %.9g, want %.9g", e,
                  dq[e], want[e]);
    float *all[] = {q, k, v, out, dout, dq, dq1, dk, dv, lse};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
    double *alld[] = {qd, kd, vd, want, terms, gq, tq, gk, gv};
    for (size_t i = 0; i < sizeof alld / sizeof alld[0]; i++) free(alld[i]);
}

/* ---- the reference itself ---- */

static double loss(double *out, const double *q, const double *k, const double *v,
                   const double *dout, const float *mask, size_t lq, size_t lk, size_t dk,
                   size_t dv, double scale, int causal) {
    double gq[64], gk[64], gv[64];
    ref_attention_grads(gq, gk, gv, out, NULL, NULL, NULL, q, k, v, dout, mask, lq, lk, dk, dv,
                        scale, causal);
    double l = 0.0;
    for (size_t i = 0; i < lq * dv; i++) l += out[i] * dout[i];
    return l;
}

/* Each gradient of the reference against (L(x + h) - L(x - h)) / 2h of a double forward pass,
 * L = sum out * dout, with a -inf mask entry and the causal cut. */
Test(backward, reference_is_the_gradient) {
    enum { LQ = 3, LK = 4, DK = 3, DV = 2 };
    rng r = rng_seed(2403);
    double q[LQ * DK], k[LK * DK], v[LK * DV], go[LQ * DV], out[LQ * DV];
    double gq[LQ * DK], gk[LK * DK], gv[LK * DV];
    float mask[LQ * LK];
    for (size_t i = 0; i < LQ * DK; i++) q[i] = rng_normal(&r);
    for (size_t i = 0; i < LK * DK; i++) k[i] = rng_normal(&r);
    for (size_t i = 0; i < LK * DV; i++) v[i] = rng_normal(&r);
    for (size_t i = 0; i < LQ * DV; i++) go[i] = rng_normal(&r);
    for (size_t i = 0; i < LQ * LK; i++) mask[i] = (float)rng_uniform(&r, -1, 1);
    mask[1 * LK + 0] = -INFINITY;
    for (int causal = 0; causal < 2; causal++) {
        const double scale = 0.7, h = 1e-6;
        ref_attention_grads(gq, gk, gv, out, NULL, NULL, NULL, q, k, v, go, mask, LQ, LK, DK, DV,
                            scale, causal);
        struct {
            double *x, *g;
            size_t n;
            const char *name;
        } in[] = {{q, gq, LQ * DK, "q"}, {k, gk, LK * DK, "k"}, {v, gv, LK * DV, "v"}};
        for (size_t t = 0; t < 3; t++)
            for (size_t i = 0; i < in[t].n; i++) {
                const double x0 = in[t].x[i];
                in[t].x[i] = x0 + h;
                const double lp = loss(out, q, k, v, go, mask, LQ, LK, DK, DV, scale, causal);
                in[t].x[i] = x0 - h;
                const double lm = loss(out, q, k, v, go, mask, LQ, LK, DK, DV, scale, causal);
                in[t].x[i] = x0;
                const double fd = (lp - lm) / (2 * h);
                cr_assert(fabs(fd - in[t].g[i]) <= 1e-7 * (1.0 + fabs(fd)),
                          "causal %d d%s[%zu]: reference %.12g, finite difference %.12g", causal,
                          in[t].name, i, in[t].g[i], fd);
            }
    }
}

/* ---- special values ---- */

static int all_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

/* An entry made NaN or inf, and the value it held, which the reference gets back. */
typedef struct poisoned {
    float *at, kept, poison;
} poisoned;

/* NaN in the k and v of a key every row's mask removes, and in the q and dout of a row that sees
 * no key, reaches no gradient; the removed key's dk and dv and the blind row's dq are zeros. */
BACKEND_TEST(backward, removed_pairs_do_not_leak) {
    rng r = rng_seed(2404);
    for (int causal = 0; causal < 2; causal++) {
        const bw_case c = {1, 2, 1, 40, 70, 24, 24, causal, 0, 1, 0, 0};
        bw_data x;
        bw_setup(&r, &c, &x);
        const size_t removed = 5;
        for (size_t i = 0; i < c.len_q; i++) x.mask[i * c.len_kv + removed] = -INFINITY;
        cr_assert_eq(sdpa_mha_f32(&x.desc, x.out, x.q, x.k, x.v), SDPA_OK);
        poisoned poison[8];
        size_t n_poison = 0;
        for (size_t h = 0; h < c.heads_kv; h++) {
            poison[n_poison++] =
                (poisoned){&x.k[h * x.desc.k_stride[1] + removed * x.desc.k_stride[2] + 3], 0, NAN};
            poison[n_poison++] = (poisoned){
                &x.v[h * x.desc.v_stride[1] + removed * x.desc.v_stride[2] + 1], 0, INFINITY};
        }
        for (size_t h = 0; h < c.heads_q; h++) { /* row 0 is all -inf in the mask */
            poison[n_poison++] = (poisoned){&x.q[h * x.desc.q_stride[1] + 2], 0, NAN};
            poison[n_poison++] = (poisoned){&x.dout[h * x.grads.dout_stride[1] + 4], 0, NAN};
        }
        for (size_t i = 0; i < n_poison; i++) {
            poison[i].kept = *poison[i].at;
            *poison[i].at = poison[i].poison;
        }
        cr_assert_eq(bw_run(&x), SDPA_OK);
        cr_assert(all_finite(x.dq, x.n_q) && all_finite(x.dk, x.n_dk) && all_finite(x.dv, x.n_dv),
                  "a NaN reached a gradient (causal %d)", causal);
        for (size_t c2 = 0; c2 < c.d_k; c2++) {
            cr_assert_eq(x.dk[removed * x.grads.dk_stride[2] + c2], 0.0f);
            cr_assert_eq(x.dq[c2], 0.0f);
        }
        for (size_t c2 = 0; c2 < c.d_v; c2++)
            cr_assert_eq(x.dv[removed * x.grads.dv_stride[2] + c2], 0.0f);
        /* the rest as the reference has it, with the NaNs put back to numbers it can use */
        for (size_t i = 0; i < n_poison; i++) *poison[i].at = poison[i].kept;
        bw_check(&x);
        bw_free(&x);
    }
}

/* Causal: NaN in the q of row 0, which sees key 0 alone, makes that row's dq and key 0's dk and
 * dv NaN, and nothing else. */
BACKEND_TEST(backward, nan_reaches_what_the_row_sees) {
    rng r = rng_seed(2405);
    const bw_case c = {1, 1, 1, 50, 50, 16, 16, 1, 0, 0, 0, 0};
    bw_data x;
    bw_setup(&r, &c, &x);
    x.q[3] = NAN;
    cr_assert_eq(sdpa_mha_f32(&x.desc, x.out, x.q, x.k, x.v), SDPA_OK);
    cr_assert(isnan(x.lse[0]));
    cr_assert_eq(bw_run(&x), SDPA_OK);
    for (size_t col = 0; col < c.d_k; col++) {
        cr_assert(isnan(x.dq[col]) && isnan(x.dk[col]));
        cr_assert(isnan(x.dv[col]));
    }
    cr_assert(all_finite(x.dq + c.d_k, x.n_q - c.d_k) && all_finite(x.dk + c.d_k, x.n_dk - c.d_k) &&
              all_finite(x.dv + c.d_v, x.n_dv - c.d_v));
    bw_free(&x);
}

/* No keys: dq is zeros. No query rows: dk and dv are zeros. Both written over garbage. */
Test(backward, empty_sides_write_zeros) {
    rng r = rng_seed(2406);
    const bw_case c = {2, 2, 1, 5, 7, 8, 8, 0, 0, 0, 0, 0};
    bw_data x;
    bw_setup(&r, &c, &x);
    for (size_t i = 0; i < x.n_q; i++) x.dq[i] = SENTINEL;
    x.desc.len_kv = 0;
    for (size_t i = 0; i < x.n_lse; i++) x.lse[i] = -INFINITY;
    cr_assert_eq(bw_run(&x), SDPA_OK);
    for (size_t i = 0; i < x.n_q; i++) cr_assert_eq(x.dq[i], 0.0f);
    x.desc.len_kv = c.len_kv;
    x.desc.len_q = 0;
    for (size_t i = 0; i < x.n_dk; i++) x.dk[i] = x.dv[i] = SENTINEL;
    cr_assert_eq(bw_run(&x), SDPA_OK);
    for (size_t i = 0; i < x.n_dk; i++) cr_assert(x.dk[i] == 0.0f && x.dv[i] == 0.0f);
    bw_free(&x);
}

/* ---- errors: checked before any work, nothing written ---- */

static void expect_error(bw_data *x, sdpa_status want, const char *what) {
    for (size_t i = 0; i < x->n_q; i++) x->dq[i] = SENTINEL;
    for (size_t i = 0; i < x->n_dk; i++) x->dk[i] = SENTINEL;
    for (size_t i = 0; i < x->n_dv; i++) x->dv[i] = SENTINEL;
    cr_assert_eq(bw_run(x), want, "%s: status %d", what, (int)bw_run(x));
    for (size_t i = 0; i < x->n_q; i++) cr_assert_eq(x->dq[i], SENTINEL, "%s wrote dq", what);
    for (size_t i = 0; i < x->n_dk; i++) cr_assert_eq(x->dk[i], SENTINEL, "%s wrote dk", what);
    for (size_t i = 0; i < x->n_dv; i++) cr_assert_eq(x->dv[i], SENTINEL, "%s wrote dv", what);
}

Test(backward, errors_write_nothing) {
    rng r = rng_seed(2407);
    const bw_case c = {2, 4, 2, 9, 11, 8, 8, 1, 0, 0, 0, 0};
    bw_data x;
    bw_setup(&r, &c, &x);
    cr_assert_eq(sdpa_mha_backward_f32(NULL, &x.grads, x.q, x.k, x.v, x.out), SDPA_ERR_NULL);
    cr_assert_eq(sdpa_mha_backward_f32(&x.desc, NULL, x.q, x.k, x.v, x.out), SDPA_ERR_NULL);
    x.desc.lse = NULL;
    expect_error(&x, SDPA_ERR_NULL, "NULL lse");
    x.desc.lse = x.lse;
    x.desc.struct_size = offsetof(sdpa_mha_desc, q_type);
    expect_error(&x, SDPA_ERR_ARG, "a v1 descriptor");
    x.desc.struct_size = sizeof x.desc;
    x.desc.kv_type = SDPA_F16;
    expect_error(&x, SDPA_ERR_ARG, "f16 K/V");
    x.desc.kv_type = SDPA_F32;
    x.grads.struct_size = sizeof x.grads - 1;
    expect_error(&x, SDPA_ERR_ARG, "short grads");
    x.grads.struct_size = sizeof x.grads;
    x.grads.reserved = 1;
    expect_error(&x, SDPA_ERR_ARG, "reserved");
    x.grads.reserved = 0;
    float *const dq = x.grads.dq, *const dk = x.grads.dk;
    x.grads.dout = NULL;
    expect_error(&x, SDPA_ERR_NULL, "NULL dout");
    x.grads.dout = x.dout;
    x.grads.dv = NULL;
    expect_error(&x, SDPA_ERR_NULL, "NULL dv");
    x.grads.dv = x.dv;
    x.desc.flags = 2;
    expect_error(&x, SDPA_ERR_ARG, "unknown flag");
    x.desc.flags = SDPA_CAUSAL;
    x.grads.dq_stride[2] = c.d_k - 1;
    expect_error(&x, SDPA_ERR_SIZE, "dq row stride below d_k");
    x.grads.dq_stride[2] = c.d_k;
    x.grads.dk_stride[1] = 1;
    expect_error(&x, SDPA_ERR_SIZE, "dk heads sharing floats");
    x.grads.dk_stride[1] = x.desc.k_stride[1];
    x.grads.dk = dq;
    expect_error(&x, SDPA_ERR_SIZE, "dk on dq");
    x.grads.dk = dk;
    x.grads.dq = x.q + 1;
    expect_error(&x, SDPA_ERR_SIZE, "dq over q");
    x.grads.dq = dq;
    x.grads.dv = x.lse;
    expect_error(&x, SDPA_ERR_SIZE, "dv over lse");
    x.grads.dv = x.dv;
    x.grads.dq_stride[0] = SIZE_MAX / 2;
    expect_error(&x, SDPA_ERR_SIZE, "dq past PTRDIFF_MAX");
    x.grads.dq_stride[0] = x.desc.q_stride[0];
    cr_assert_eq(bw_run(&x), SDPA_OK);
    bw_free(&x);
}

/* The plugin table has the call. */
Test(backward, plugin_table) {
    const sdpa_api *api = sdpa_get_api(SDPA_ABI_VERSION);
    cr_assert(api && SDPA_API_HAS(api, mha_backward_f32));
    cr_assert_eq(api->mha_backward_f32, sdpa_mha_backward_f32);
}

/* ---- the floating-point environment ---- */

/* Under each directed rounding mode and with FTZ/DAZ the bounds hold and the control word is the
 * caller's after the call. */
BACKEND_TEST(backward, any_rounding_mode_and_ftz) {
    static const struct {
        int round, ftz;
    } ENVS[] = {{FE_UPWARD, 0}, {FE_DOWNWARD, 0}, {FE_TOWARDZERO, 0}, {FE_TONEAREST, 1}};
    rng r = rng_seed(2409);
    const bw_case c = {1, 4, 2, 45, test_quick() ? 60 : 150, 40, 24, 1, 0, 1, 0, 0};
    for (size_t e = 0; e < sizeof ENVS / sizeof ENVS[0]; e++) {
        bw_data x;
        cr_assert_eq(fesetround(ENVS[e].round), 0);
        set_ftz_daz(ENVS[e].ftz);
        const uint64_t before = fp_control_word();
        bw_setup(&r, &c, &x);
        const sdpa_status st = bw_run(&x);
        const uint64_t after = fp_control_word();
        fesetround(FE_TONEAREST);
        set_ftz_daz(0);
        cr_assert_eq(st, SDPA_OK);
        cr_assert_eq(after, before, "environment %zu: the control word changed", e);
        bw_check(&x);
        bw_free(&x);
    }
}

/* Long causal rows under each directed rounding mode: a key's dk and dv sum the terms of up to
 * len_q rows (of both query heads of its group here), and every rounding of a long chain errs
 * the same way, so the sums must be taken in blocks for the bounds to hold. */
BACKEND_TEST(backward, directed_rounding_long_causal_rows) {
    static const int ROUNDS[] = {FE_UPWARD, FE_DOWNWARD, FE_TOWARDZERO};
    rng r = rng_seed(2413);
    const int quick = test_quick();
    const bw_case cases[] = {
        {1, 2, 1, quick ? 1024 : 4096, quick ? 1024 : 4096, 16, 16, 1, 0, 0, 0, 0},
        {1, 1, 1, 1024, 1024, 32, 32, 1, 0, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (size_t e = 0; e < sizeof ROUNDS / sizeof ROUNDS[0]; e++) {
            bw_data x;
            cr_assert_eq(fesetround(ROUNDS[e]), 0); /* the forward too */
            bw_setup(&r, &cases[i], &x);
            const sdpa_status st = bw_run(&x);
            fesetround(FE_TONEAREST);
            cr_assert_eq(st, SDPA_OK);
            bw_check(&x);
            bw_free(&x);
        }
}

/* ---- threads ---- */

static void reverse_parallel_for(void *ctx, sdpa_task_fn task, void *arg, size_t n_tasks) {
    (void)ctx;
    for (size_t i = n_tasks; i-- > 0;) task(arg, i);
}

static float *copy_of(const float *x, size_t n) {
    float *c = alloc_floats(n);
    memcpy(c, x, n * sizeof(float));
    return c;
}

/* The same bits at 1, 2 and 3 threads and under a host's parallel_for, with GQA, causal, masks
 * and broadcast K/V. */
BACKEND_TEST(backward, same_bits_at_any_thread_count) {
    rng r = rng_seed(2408);
    const bw_case cases[] = {
        /* one unit: its keys in chunks (two pieces and more), dq summed from partials; the
           square causal one's first 512 rows see no key of its second chunk */
        {1, 2, 1, 24, 600, 16, 24, 1, 0, 0, 0, 0},
        {1, 2, 1, 70, 1500, 32, 24, 1, 0, 0, 0, 0},
        {1, 1, 1, 40, 1100, 20, 20, 0, 0, 1, 0, 0},
        {1, 1, 1, 600, 600, 16, 16, 1, 0, 0, 0, 0},
        /* rows past one band of the serial order (128 rows at d_k 96), the second chunk's
           first row inside a block of dv rows */
        {1, 1, 1, 700, 1100, 96, 96, 1, 0, 0, 0, 0},
        /* a unit per (batch, kv head) */
        {2, 4, 2, 70, 90, 32, 32, 1, 0, 0, 0, 0},
        {3, 2, 1, 40, 100, 24, 40, 0, 1, 1, 0, 0},
        {3, 4, 2, 30, 60, 16, 16, 1, 0, 0, 1, 0},
    };
    const size_t first_unit_case = 5;
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        if (test_quick() && t != 0 && t != first_unit_case) continue; /* the first of each kind */
        bw_data x;
        bw_setup(&r, &cases[t], &x);
        sdpa_set_num_threads(1);
        cr_assert_eq(bw_run(&x), SDPA_OK);
        float *dq = copy_of(x.dq, x.n_q), *dk = copy_of(x.dk, x.n_dk), *dv = copy_of(x.dv, x.n_dv);
        for (int mode = 0; mode < 3; mode++) {
            if (mode < 2) {
                sdpa_set_num_threads((size_t)mode + 2);
            } else {
                sdpa_set_num_threads(4);
                sdpa_set_parallel_for(reverse_parallel_for, NULL);
            }
            memset(x.dq, 0xff, x.n_q * sizeof(float));
            cr_assert_eq(bw_run(&x), SDPA_OK);
            sdpa_set_parallel_for(NULL, NULL);
            cr_assert(memcmp(dq, x.dq, x.n_q * sizeof(float)) == 0 &&
                          memcmp(dk, x.dk, x.n_dk * sizeof(float)) == 0 &&
                          memcmp(dv, x.dv, x.n_dv * sizeof(float)) == 0,
                      "case %zu mode %d: other bits", t, mode);
        }
        sdpa_set_num_threads(0);
        free(dq);
        free(dk);
        free(dv);
        bw_free(&x);
    }
}
