/* Attention (sdpa_attention_f32, sdpa_mha_f32) on every backend against the double-precision
 * textbook reference of reference.c: random shapes, causal, decode, GQA/MQA, strided views,
 * masks, special values, error paths, and arrays that end at a PROT_NONE page. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bounds.h"
#include "checks.h"
#include "common.h"
#include "reference.h"

static const size_t DIMS[] = {1, 3, 8, 16, 17, 64, 80, 96, 128, 256};
#define N_DIMS (sizeof DIMS / sizeof DIMS[0])

static size_t pick(rng *r, size_t lo, size_t hi) { /* uniform in [lo, hi] */
    return lo + (size_t)rng_uniform(r, 0.0, (double)(hi - lo + 1));
}

static double max_abs_finite(const float *x, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(x[i]) && fabs(x[i]) > m) m = fabs(x[i]);
    return m;
}

/* A dense single-head case, d_k = d_v = d: q, k, v filled with unit normals, and room for the
 * output and a double-precision reference. */
typedef struct dense_case {
    float *q, *k, *v, *out;
    double *ref;
} dense_case;

static dense_case dense_case_alloc(rng *r, size_t lq, size_t lkv, size_t d) {
    dense_case c = {malloc(lq * d * 4), malloc(lkv * d * 4), malloc(lkv * d * 4),
                    malloc(lq * d * 4), malloc(lq * d * sizeof(double))};
    fill_normal(r, c.q, lq * d);
    fill_normal(r, c.k, lkv * d);
    fill_normal(r, c.v, lkv * d);
    return c;
}

static void dense_case_free(dense_case *c) {
    free(c->q);
    free(c->k);
    free(c->v);
    free(c->out);
    free(c->ref);
}

/* The contract's bound (bounds.h); NaN exactly where the reference has it. */
static void expect_close(const float *out, size_t out_stride, const double *ref, size_t ref_stride,
                         size_t rows, size_t d_v, double tol, const char *what) {
    for (size_t i = 0; i < rows; i++) {
        for (size_t c = 0; c < d_v; c++) {
            float got = out[i * out_stride + c];
            double want = ref[i * ref_stride + c];
            if (isnan(want)) {
                cr_assert(isnan(got), "%s: row %zu col %zu: want NaN, got %g", what, i, c, got);
            } else {
                cr_assert(fabs(got - want) <= tol,
                          "%s: row %zu col %zu: got %.9g want %.9g (|err| %.3g > tol %.3g)", what,
                          i, c, got, want, fabs(got - want), tol);
            }
        }
    }
}

/* One single-head case through sdpa_attention_f32, every array ending at a guard page. */
/* growth: the error allowed, in multiples of the contract's bound (1 within its range) */
static void single_case(rng *r, size_t lq, size_t lkv, size_t dk, size_t dv, int causal,
                        float scale, double growth) {
    guarded gq = guard_alloc(lq * dk, GUARD_AFTER), gk = guard_alloc(lkv * dk, GUARD_AFTER);
    guarded gv = guard_alloc(lkv * dv, GUARD_AFTER), go = guard_alloc(lq * dv, GUARD_AFTER);
    fill_normal(r, gq.p, lq * dk);
    fill_normal(r, gk.p, lkv * dk);
    fill_normal(r, gv.p, lkv * dv);
    double *ref = malloc(lq * dv * sizeof *ref);
    cr_assert_eq(sdpa_attention_f32(go.p, gq.p, gk.p, gv.p, lq, lkv, dk, dv, scale,
                                    causal ? SDPA_CAUSAL : 0),
                 SDPA_OK);
    double s = scale == SDPA_DEFAULT_SCALE ? 1.0 / sqrt((double)dk) : scale;
    ref_attention(ref, dv, gq.p, dk, gk.p, dk, gv.p, dv, NULL, 0, lq, lkv, dk, dv, s, causal);
    char what[128];
    snprintf(what, sizeof what, "len_q %zu len_kv %zu d_k %zu d_v %zu causal %d", lq, lkv, dk, dv,
             causal);
    expect_close(go.p, dv, ref, dv, lq, dv,
                 growth * bound_attention(max_abs_finite(gv.p, lkv * dv)), what);
    free(ref);
    guard_free(&gq);
    guard_free(&gk);
    guard_free(&gv);
    guard_free(&go);
}

BACKEND_TEST(attention, random_shapes) {
    rng r = rng_seed(301);
    for (int t = 0; t < 40; t++) {
        size_t lq = pick(&r, 1, 300), lkv = pick(&r, 1, 300);
        size_t dk = DIMS[pick(&r, 0, N_DIMS - 1)], dv = DIMS[pick(&r, 0, N_DIMS - 1)];
        single_case(&r, lq, lkv, dk, dv, t & 1, SDPA_DEFAULT_SCALE, 1.0);
    }
}

BACKEND_TEST(attention, small_and_edge_shapes) {
    rng r = rng_seed(302);
    static const size_t LENS[] = {1, 2, 3, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 129};
    for (size_t a = 0; a < sizeof LENS / sizeof LENS[0]; a++) {
        for (size_t b = 0; b < sizeof LENS / sizeof LENS[0]; b += 3) {
            size_t dk = DIMS[(a + b) % N_DIMS], dv = DIMS[(a * 3 + b) % N_DIMS];
            single_case(&r, LENS[a], LENS[b], dk, dv, (a + b) & 1, SDPA_DEFAULT_SCALE, 1.0);
        }
    }
}

/* Causal with len_q > len_kv: the first len_q - len_kv rows see no key and must be exact zeros. */
BACKEND_TEST(attention, causal_rows_without_keys_are_zero) {
    rng r = rng_seed(303);
    const size_t lq = 70, lkv = 20, d = 17;
    dense_case c = dense_case_alloc(&r, lq, lkv, d);
    float *q = c.q, *k = c.k, *v = c.v, *out = c.out;
    double *ref = c.ref;
    cr_assert_eq(sdpa_attention_f32(out, q, k, v, lq, lkv, d, d, SDPA_DEFAULT_SCALE, SDPA_CAUSAL),
                 SDPA_OK);
    for (size_t i = 0; i < lq - lkv; i++)
        for (size_t c = 0; c < d; c++)
            cr_assert(out[i * d + c] == 0.0f && !signbit(out[i * d + c]), "row %zu not zero", i);
    ref_attention(ref, d, q, d, k, d, v, d, NULL, 0, lq, lkv, d, d, 1.0 / sqrt((double)d), 1);
    expect_close(out, d, ref, d, lq, d, bound_attention(max_abs_finite(v, lkv * d)),
                 "causal lq > lkv");
    /* the last row sees every key: the same as the first row of a non-causal call */
    float last[17];
    cr_assert_eq(sdpa_attention_f32(last, q + (lq - 1) * d, k, v, 1, lkv, d, d, 0.0f, 0), SDPA_OK);
    expect_close(last, d, ref + (lq - 1) * d, d, 1, d, bound_attention(max_abs_finite(v, lkv * d)),
                 "last");
    dense_case_free(&c);
}

BACKEND_TEST(attention, decode_long_kv) {
    rng r = rng_seed(304);
    static const size_t LKV[] = {1, 5, 127, 1000, 4096, 32768};
    for (size_t t = 0; t < sizeof LKV / sizeof LKV[0]; t++) {
        /* the contract's bound covers len_kv <= 4096; beyond it the sums are longer */
        double tol = LKV[t] <= 4096 ? 1.0 : 2.0;
        /* under emulation the longest cache once, not twice (seconds of qemu per backend) */
        if (!(test_quick() && LKV[t] > 4096))
            single_case(&r, 1, LKV[t], 128, 128, t & 1, SDPA_DEFAULT_SCALE, tol);
        single_case(&r, 1, LKV[t], 64, 80, 0, SDPA_DEFAULT_SCALE, tol);
    }
}

BACKEND_TEST(attention, explicit_scale_and_large_scores) {
    rng r = rng_seed(305);
    single_case(&r, 40, 90, 64, 64, 0, 0.3f, 1.0);
    single_case(&r, 40, 90, 64, 64, 1, -0.125f, 1.0);
    /* scores of a few hundred: the running max keeps every exp in range. Rounding a score of
       size 600 to float moves it by up to 2^-15, which moves the weights by as much: the bound
       grows with the scores (this checks stability, not the unit-normal bound): 20 times it. */
    single_case(&r, 33, 150, 16, 16, 0, 40.0f, 20.0);
    single_case(&r, 33, 150, 16, 16, 1, 40.0f, 20.0);
}

/* d_v beyond the stack accumulator: the output rows hold the running sums. */
BACKEND_TEST(attention, wide_values) {
    rng r = rng_seed(306);
    single_case(&r, 37, 70, 16, 300, 0, SDPA_DEFAULT_SCALE, 1.0);
    single_case(&r, 5, 130, 33, 1024, 1, SDPA_DEFAULT_SCALE, 1.0);
}

BACKEND_TEST(attention, zero_keys_and_zero_queries) {
    float out[6] = {SENTINEL, SENTINEL, SENTINEL, SENTINEL, SENTINEL, SENTINEL};
    cr_assert_eq(sdpa_attention_f32(out, NULL, NULL, NULL, 2, 0, 4, 3, 0.0f, 0), SDPA_OK);
    for (int i = 0; i < 6; i++) cr_assert(out[i] == 0.0f, "len_kv == 0 gives zeros");
    out[0] = SENTINEL;
    cr_assert_eq(sdpa_attention_f32(out, NULL, NULL, NULL, 0, 5, 4, 3, 0.0f, 0), SDPA_OK);
    cr_assert_eq(sdpa_attention_f32(NULL, NULL, NULL, NULL, 0, 5, 4, 3, 0.0f, 0), SDPA_OK);
    cr_assert(out[0] == SENTINEL);
}

/* ---- multi-head: layouts, GQA, masks ---- */

enum mask_kind { MASK_NONE, MASK_FULL, MASK_BROADCAST_BH, MASK_ONE_ROW };

typedef struct mha_case {
    size_t batch, hq, hkv, lq, lkv, dk, dv;
    int causal, bshd;
    size_t pad; /* extra floats at the end of every row of every view */
    enum mask_kind mask;
    int nan_in_masked_v; /* NaN in the values of keys that the mask removes for every row */
} mha_case;

/* strides of [d0][heads][len][row] (or [d0][len][heads][row] when bshd) with padded rows */
static void view_strides(size_t s[3], size_t heads, size_t len, size_t row, int bshd) {
    if (bshd) {
        s[2] = heads * row;
        s[1] = row;
        s[0] = len * heads * row;
    } else {
        s[2] = row;
        s[1] = len * row;
        s[0] = heads * len * row;
    }
}

static size_t view_extent(const size_t s[3], size_t d0, size_t d1, size_t d2, size_t row) {
    return (d0 - 1) * s[0] + (d1 - 1) * s[1] + (d2 - 1) * s[2] + row;
}

static void run_mha_case(rng *r, const mha_case *c) {
    sdpa_mha_desc desc;
    cr_assert_eq(sdpa_mha_desc_dense(&desc, c->batch, c->hq, c->hkv, c->lq, c->lkv, c->dk, c->dv,
                                     SDPA_DEFAULT_SCALE, c->causal ? SDPA_CAUSAL : 0),
                 SDPA_OK);
    view_strides(desc.q_stride, c->hq, c->lq, c->dk + c->pad, c->bshd);
    view_strides(desc.k_stride, c->hkv, c->lkv, c->dk + c->pad, c->bshd);
    view_strides(desc.v_stride, c->hkv, c->lkv, c->dv + c->pad, c->bshd);
    view_strides(desc.out_stride, c->hq, c->lq, c->dv + c->pad, c->bshd);
    size_t nq = view_extent(desc.q_stride, c->batch, c->hq, c->lq, c->dk);
    size_t nk = view_extent(desc.k_stride, c->batch, c->hkv, c->lkv, c->dk);
    size_t nv = view_extent(desc.v_stride, c->batch, c->hkv, c->lkv, c->dv);
    size_t no = view_extent(desc.out_stride, c->batch, c->hq, c->lq, c->dv);
    guarded gq = guard_alloc(nq, GUARD_AFTER), gk = guard_alloc(nk, GUARD_AFTER);
    guarded gv = guard_alloc(nv, GUARD_AFTER), go = guard_alloc(no, GUARD_AFTER);
    fill_normal(r, gq.p, nq);
    fill_normal(r, gk.p, nk);
    fill_normal(r, gv.p, nv);
    for (size_t i = 0; i < no; i++) go.p[i] = SENTINEL;

    float *mask = NULL;
    guarded gm = {0};
    size_t mask_n = 0;
    if (c->mask != MASK_NONE) {
        size_t ms[3] = {c->hq * c->lq * c->lkv, c->lq * c->lkv, c->lkv};
        if (c->mask == MASK_BROADCAST_BH) ms[0] = ms[1] = 0;
        if (c->mask == MASK_ONE_ROW) ms[0] = ms[1] = ms[2] = 0;
        mask_n = c->mask == MASK_FULL           ? c->batch * ms[0]
                 : c->mask == MASK_BROADCAST_BH ? c->lq * c->lkv
                                                : c->lkv;
        gm = guard_alloc(mask_n, GUARD_AFTER); /* the last mask row ends at a PROT_NONE page */
        mask = gm.p;
        for (size_t i = 0; i < mask_n; i++) {
            size_t row = i / c->lkv, col = i % c->lkv;
            double u = rng_uniform(r, 0.0, 1.0);
            mask[i] = u < 0.2 ? -INFINITY : (float)rng_uniform(r, -2.0, 2.0);
            if (col % 5 == 2) mask[i] = -INFINITY; /* keys removed for every row */
            if (row % 7 == 3) mask[i] = -INFINITY; /* rows that see no key */
            if (c->mask == MASK_ONE_ROW && col == 0) mask[i] = 0.5f; /* one row: keep it alive */
        }
        sdpa_mha_desc_set_mask(&desc, mask, ms[0], ms[1], ms[2]);
        if (c->nan_in_masked_v)
            for (size_t b = 0; b < c->batch; b++)
                for (size_t h = 0; h < c->hkv; h++)
                    for (size_t j = 2; j < c->lkv; j += 5)
                        for (size_t e = 0; e < c->dv; e++)
                            gv.p[b * desc.v_stride[0] + h * desc.v_stride[1] +
                                 j * desc.v_stride[2] + e] = NAN;
    }

    cr_assert_eq(sdpa_mha_f32(&desc, go.p, gq.p, gk.p, gv.p), SDPA_OK);

    double *ref = malloc(c->lq * c->dv * sizeof *ref);
    double tol = bound_attention(max_abs_finite(gv.p, nv));
    for (size_t b = 0; b < c->batch; b++) {
        for (size_t h = 0; h < c->hq; h++) {
            size_t hk = h / (c->hq / c->hkv);
            const float *mk =
                mask ? mask + b * desc.mask_stride[0] + h * desc.mask_stride[1] : NULL;
            ref_attention(ref, c->dv, gq.p + b * desc.q_stride[0] + h * desc.q_stride[1],
                          desc.q_stride[2], gk.p + b * desc.k_stride[0] + hk * desc.k_stride[1],
                          desc.k_stride[2], gv.p + b * desc.v_stride[0] + hk * desc.v_stride[1],
                          desc.v_stride[2], mk, desc.mask_stride[2], c->lq, c->lkv, c->dk, c->dv,
                          1.0 / sqrt((double)c->dk), c->causal);
            char what[200];
            snprintf(what, sizeof what,
                     "b %zu h %zu of batch %zu hq %zu hkv %zu lq %zu lkv %zu dk %zu dv %zu causal "
                     "%d bshd %d pad %zu mask %d",
                     b, h, c->batch, c->hq, c->hkv, c->lq, c->lkv, c->dk, c->dv, c->causal, c->bshd,
                     c->pad, (int)c->mask);
            const float *o = go.p + b * desc.out_stride[0] + h * desc.out_stride[1];
            expect_close(o, desc.out_stride[2], ref, c->dv, c->lq, c->dv, tol, what);
            if (c->nan_in_masked_v)
                for (size_t i = 0; i < c->lq * c->dv; i++)
                    cr_assert(!isnan(ref[i]), "reference must not see the NaN values");
        }
    }
    /* padding between rows (and heads, in BSHD) is never written */
    if (c->pad) {
        size_t written = 0;
        for (size_t i = 0; i < no; i++) written += go.p[i] != SENTINEL;
        cr_assert_eq(written, c->batch * c->hq * c->lq * c->dv, "only the output rows are written");
    }
    free(ref);
    if (mask) guard_free(&gm);
    guard_free(&gq);
    guard_free(&gk);
    guard_free(&gv);
    guard_free(&go);
}

BACKEND_TEST(attention, gqa_mqa_mha) {
    rng r = rng_seed(307);
    static const size_t RATIOS[] = {1, 2, 4, 8};
    for (size_t t = 0; t < 4; t++) {
        mha_case c = {.batch = 2,
                      .hq = 8,
                      .hkv = 8 / RATIOS[t],
                      .lq = pick(&r, 1, 70),
                      .lkv = pick(&r, 1, 140),
                      .dk = DIMS[pick(&r, 0, N_DIMS - 1)],
                      .dv = DIMS[pick(&r, 0, N_DIMS - 1)],
                      .causal = (int)(t & 1)};
        run_mha_case(&r, &c);
        c.causal = !c.causal;
        c.bshd = 1;
        run_mha_case(&r, &c);
    }
    mha_case mqa = {.batch = 1, .hq = 6, .hkv = 1, .lq = 1, .lkv = 333, .dk = 64, .dv = 64};
    run_mha_case(&r, &mqa);
}

/* Decode (len_q == 1) with grouped heads runs a kv head's query heads as one block of rows. */
BACKEND_TEST(attention, gqa_decode) {
    rng r = rng_seed(315);
    static const size_t HQ[] = {2, 8, 40, 64};
    static const enum mask_kind KINDS[] = {MASK_NONE, MASK_FULL, MASK_BROADCAST_BH, MASK_ONE_ROW};
    for (size_t t = 0; t < 8; t++) {
        size_t hq = HQ[t % 4];
        mha_case c = {.batch = 2,
                      .hq = hq,
                      .hkv = t < 4 ? 1 : hq / 2,
                      .lq = 1,
                      .lkv = pick(&r, 1, 700),
                      .dk = DIMS[pick(&r, 0, N_DIMS - 1)],
                      .dv = DIMS[pick(&r, 0, N_DIMS - 1)],
                      .causal = (int)(t & 1),
                      .bshd = (int)(t / 2 % 2),
                      .pad = t % 3,
                      .mask = KINDS[t % 4],
                      .nan_in_masked_v = t % 4 != 0};
        run_mha_case(&r, &c);
    }
}

BACKEND_TEST(attention, strided_bshd_views) {
    rng r = rng_seed(308);
    for (int t = 0; t < 6; t++) {
        mha_case c = {.batch = pick(&r, 1, 3),
                      .hq = 4,
                      .hkv = t % 2 ? 2 : 4,
                      .lq = pick(&r, 1, 100),
                      .lkv = pick(&r, 1, 100),
                      .dk = DIMS[pick(&r, 0, N_DIMS - 1)],
                      .dv = DIMS[pick(&r, 0, N_DIMS - 1)],
                      .causal = t % 3 == 0,
                      .bshd = t < 4,
                      .pad = (size_t)t % 3 + 1};
        run_mha_case(&r, &c);
    }
}

BACKEND_TEST(attention, masks) {
    rng r = rng_seed(309);
    static const enum mask_kind KINDS[] = {MASK_FULL, MASK_BROADCAST_BH, MASK_ONE_ROW};
    for (int t = 0; t < 6; t++) {
        mha_case c = {.batch = 2,
                      .hq = 2,
                      .hkv = t % 2 ? 1 : 2,
                      .lq = pick(&r, 1, 90),
                      .lkv = pick(&r, 1, 200),
                      .dk = DIMS[pick(&r, 0, N_DIMS - 1)],
                      .dv = DIMS[pick(&r, 0, N_DIMS - 1)],
                      .causal = t >= 3,
                      .bshd = t % 2,
                      .mask = KINDS[t % 3],
                      .nan_in_masked_v = 1};
        run_mha_case(&r, &c);
    }
}

/* NaN in q, or in k of a key a row sees, makes that row NaN; NaN in v of such a key makes its
 * column NaN; rows that do not see the key stay finite. */
BACKEND_TEST(attention, nan_propagates_to_the_rows_that_see_it) {
    rng r = rng_seed(310);
    const size_t lq = 40, lkv = 90, d = 24;
    for (int which = 0; which < 3; which++) {
        dense_case c = dense_case_alloc(&r, lq, lkv, d);
        float *q = c.q, *k = c.k, *v = c.v, *out = c.out;
        double *ref = c.ref;
        if (which == 0) q[7 * d + 5] = NAN;
        if (which == 1) k[70 * d + 3] = NAN; /* causal: rows 20.. see key 70 */
        if (which == 2) v[75 * d + 1] = NAN;
        cr_assert_eq(sdpa_attention_f32(out, q, k, v, lq, lkv, d, d, 0.0f, SDPA_CAUSAL), SDPA_OK);
        ref_attention(ref, d, q, d, k, d, v, d, NULL, 0, lq, lkv, d, d, 1.0 / sqrt((double)d), 1);
        size_t nan_rows = 0;
        for (size_t i = 0; i < lq; i++) {
            int any = 0;
            for (size_t c = 0; c < d; c++) any |= isnan(ref[i * d + c]);
            nan_rows += any;
        }
        cr_assert(nan_rows > 0 && nan_rows < lq, "the case has both kinds of rows");
        expect_close(out, d, ref, d, lq, d, bound_attention(max_abs_finite(v, lkv * d)),
                     "NaN rows");
        dense_case_free(&c);
    }
}

/* Special scores inside blocks that every row sees whole, with no mask (on avx512 a one-call
 * path that hands a block back to the general one when a row's max would not be finite): 40
 * queries (blocks of 32 and 8) x 200 keys (blocks of 64), every k_j0 > 0. Key 150 has k0 = +inf:
 * rows with q0 > 0 get a +inf score there (NaN rows), rows with q0 < 0 a -inf one (the key drops
 * out). Row 20 has a NaN (NaN row). In the second variant row 3 has q0 = -inf, so all its scores
 * are -inf (zeros) and its block never takes the one-call path. Both exp modes. */
BACKEND_TEST(attention, special_scores_in_whole_blocks) {
    const size_t lq = 40, lkv = 200, d = 32;
    static const char *const modes[] = {"fast", "sleef"};
    for (int variant = 0; variant < 4; variant++) {
        rng r = rng_seed(320 + (uint64_t)variant);
        cr_assert_eq(sdpa_set_exp_mode(modes[variant & 1]), SDPA_OK);
        dense_case c = dense_case_alloc(&r, lq, lkv, d);
        float *q = c.q, *k = c.k, *v = c.v, *out = c.out;
        double *ref = c.ref;
        for (size_t j = 0; j < lkv; j++) k[j * d] = fabsf(k[j * d]) + 0.1f;
        k[150 * d] = INFINITY;
        q[20 * d + 5] = NAN;
        const int all_minus_inf_row = variant >= 2;
        if (all_minus_inf_row) q[3 * d] = -INFINITY;
        cr_assert_eq(sdpa_attention_f32(out, q, k, v, lq, lkv, d, d, 0.0f, 0), SDPA_OK);
        ref_attention(ref, d, q, d, k, d, v, d, NULL, 0, lq, lkv, d, d, 1.0 / sqrt((double)d), 0);
        size_t nan_rows = 0, finite_rows = 0;
        for (size_t i = 0; i < lq; i++) {
            if (all_minus_inf_row && i == 3) { /* the reference says NaN; the contract zeros */
                for (size_t c = 0; c < d; c++)
                    cr_assert(out[i * d + c] == 0.0f, "all -inf scores: row 3 col %zu = %g", c,
                              out[i * d + c]);
                for (size_t c = 0; c < d; c++) ref[i * d + c] = 0.0;
            }
            int want_nan = i == 20 || q[i * d] > 0.0f;
            cr_assert_eq(isnan(ref[i * d]) != 0, want_nan, "the reference's row %zu", i);
            nan_rows += want_nan, finite_rows += !want_nan;
        }
        cr_assert(nan_rows > 2 && finite_rows > 2, "the case has both kinds of rows");
        expect_close(out, d, ref, d, lq, d, bound_attention(max_abs_finite(v, lkv * d)),
                     "special scores");
        dense_case_free(&c);
    }
    sdpa_set_exp_mode("fast");
}

/* A key removed by causality never reaches the rows before it, even when its values are NaN. */
BACKEND_TEST(attention, causal_hides_nan_values) {
    rng r = rng_seed(311);
    const size_t n = 100, d = 16;
    dense_case c = dense_case_alloc(&r, n, n, d);
    float *q = c.q, *k = c.k, *v = c.v, *out = c.out;
    double *ref = c.ref;
    for (size_t c = 0; c < d; c++) v[50 * d + c] = NAN;
    cr_assert_eq(sdpa_attention_f32(out, q, k, v, n, n, d, d, 0.0f, SDPA_CAUSAL), SDPA_OK);
    ref_attention(ref, d, q, d, k, d, v, d, NULL, 0, n, n, d, d, 0.25, 1);
    for (size_t i = 0; i < n; i++) cr_assert_eq(isnan(out[i * d]), i >= 50, "row %zu", i);
    expect_close(out, d, ref, d, n, d, bound_attention(max_abs_finite(v, n * d)), "causal NaN");
    dense_case_free(&c);
}

/* With batch = heads = 1 and dense views both entry points run the same computation. */
BACKEND_TEST(attention, single_head_and_mha_agree) {
    rng r = rng_seed(312);
    for (int t = 0; t < 8; t++) {
        size_t lq = pick(&r, 1, 150), lkv = pick(&r, 1, 150);
        size_t dk = DIMS[pick(&r, 0, N_DIMS - 1)], dv = DIMS[pick(&r, 0, N_DIMS - 1)];
        uint32_t flags = t & 1 ? SDPA_CAUSAL : 0;
        float *q = malloc(lq * dk * 4), *k = malloc(lkv * dk * 4), *v = malloc(lkv * dv * 4);
        float *o1 = malloc(lq * dv * 4), *o2 = malloc(lq * dv * 4);
        fill_normal(&r, q, lq * dk);
        fill_normal(&r, k, lkv * dk);
        fill_normal(&r, v, lkv * dv);
        cr_assert_eq(sdpa_attention_f32(o1, q, k, v, lq, lkv, dk, dv, 0.0f, flags), SDPA_OK);
        sdpa_mha_desc desc;
        cr_assert_eq(sdpa_mha_desc_dense(&desc, 1, 1, 1, lq, lkv, dk, dv, 0.0f, flags), SDPA_OK);
        cr_assert_eq(sdpa_mha_f32(&desc, o2, q, k, v), SDPA_OK);
        cr_assert(memcmp(o1, o2, lq * dv * 4) == 0, "case %d: results differ", t);
        free(q);
        free(k);
        free(v);
        free(o1);
        free(o2);
    }
}

/* Inputs that start right after a PROT_NONE page: no read before the first element. */
BACKEND_TEST(attention, no_read_before_the_arrays) {
    rng r = rng_seed(313);
    const size_t lq = 19, lkv = 45, dk = 17, dv = 3;
    guarded gq = guard_alloc(lq * dk, GUARD_BEFORE), gk = guard_alloc(lkv * dk, GUARD_BEFORE);
    guarded gv = guard_alloc(lkv * dv, GUARD_BEFORE), go = guard_alloc(lq * dv, GUARD_BEFORE);
    fill_normal(&r, gq.p, lq * dk);
    fill_normal(&r, gk.p, lkv * dk);
    fill_normal(&r, gv.p, lkv * dv);
    cr_assert_eq(sdpa_attention_f32(go.p, gq.p, gk.p, gv.p, lq, lkv, dk, dv, 0.0f, 0), SDPA_OK);
    double ref[19 * 3];
    ref_attention(ref, dv, gq.p, dk, gk.p, dk, gv.p, dv, NULL, 0, lq, lkv, dk, dv,
                  1.0 / sqrt((double)dk), 0);
    expect_close(go.p, dv, ref, dv, lq, dv, bound_attention(max_abs_finite(gv.p, lkv * dv)),
                 "guard before");
    guard_free(&gq);
    guard_free(&gk);
    guard_free(&gv);
    guard_free(&go);
}

/* ---- errors: a status, and outputs untouched ---- */

static float ERR_OUT[64];
static void reset_out(void) {
    for (int i = 0; i < 64; i++) ERR_OUT[i] = SENTINEL;
}
static void expect_untouched(void) {
    for (int i = 0; i < 64; i++) cr_assert(ERR_OUT[i] == SENTINEL, "output written on error");
}

#define EXPECT_ATT(status, ...)                                                                    \
    do {                                                                                           \
        reset_out();                                                                               \
        cr_assert_eq(sdpa_attention_f32(__VA_ARGS__), status, "sdpa_attention_f32(%s)",            \
                     #__VA_ARGS__);                                                                \
        expect_untouched();                                                                        \
    } while (0)

#define EXPECT_MHA(status, d)                                                                      \
    do {                                                                                           \
        reset_out();                                                                               \
        cr_assert_eq(sdpa_mha_f32(&(d), ERR_OUT, in, in, in), status, "line %d", __LINE__);        \
        expect_untouched();                                                                        \
    } while (0)

BACKEND_TEST(attention, errors_single_head) {
    static float in[64];
    EXPECT_ATT(SDPA_ERR_NULL, NULL, in, in, in, 2, 2, 4, 4, 0.0f, 0);
    EXPECT_ATT(SDPA_ERR_NULL, ERR_OUT, NULL, in, in, 2, 2, 4, 4, 0.0f, 0);
    EXPECT_ATT(SDPA_ERR_NULL, ERR_OUT, in, NULL, in, 2, 2, 4, 4, 0.0f, 0);
    EXPECT_ATT(SDPA_ERR_NULL, ERR_OUT, in, in, NULL, 2, 2, 4, 4, 0.0f, 0);
    EXPECT_ATT(SDPA_ERR_SIZE, ERR_OUT, in, in, in, 2, 2, 0, 4, 0.0f, 0);
    EXPECT_ATT(SDPA_ERR_SIZE, ERR_OUT, in, in, in, 2, 2, 4, 0, 0.0f, 0);
    EXPECT_ATT(SDPA_ERR_SIZE, ERR_OUT, in, in, in, 2, SIZE_MAX / 8, 4, 4, 0.0f, 0);
    EXPECT_ATT(SDPA_ERR_SIZE, ERR_OUT, in, in, in, SIZE_MAX / 8, 2, 4, 4, 0.0f, 0);
    EXPECT_ATT(SDPA_ERR_SIZE, ERR_OUT, in, in, in, 2, 2, SIZE_MAX / 2, 4, 0.0f, 0);
    EXPECT_ATT(SDPA_ERR_SIZE, ERR_OUT, in, in, in, 2, 2, 4, SIZE_MAX / 2, 0.0f, 0);
    EXPECT_ATT(SDPA_ERR_ARG, ERR_OUT, in, in, in, 2, 2, 4, 4, 0.0f, 2u);
    EXPECT_ATT(SDPA_ERR_ARG, ERR_OUT, in, in, in, 2, 2, 4, 4, 0.0f, 1u << 31);
    EXPECT_ATT(SDPA_ERR_ARG, ERR_OUT, in, in, in, 2, 2, 4, 4, NAN, 0);
    EXPECT_ATT(SDPA_ERR_ARG, ERR_OUT, in, in, in, 2, 2, 4, 4, INFINITY, 0);
    EXPECT_ATT(SDPA_ERR_ARG, ERR_OUT, in, in, in, 2, 2, 4, 4, -INFINITY, SDPA_CAUSAL);
}

/* the size of sdpa_mha_desc in a v1 header: it ended with mask_stride */
#define V1_DESC_SIZE                                                                               \
    (offsetof(sdpa_mha_desc, mask_stride) + sizeof(((sdpa_mha_desc *)0)->mask_stride))

BACKEND_TEST(attention, errors_mha) {
    static float in[64];
    sdpa_mha_desc ok, d;
    cr_assert_eq(sdpa_mha_desc_dense(&ok, 1, 2, 1, 2, 3, 4, 4, 0.0f, SDPA_CAUSAL), SDPA_OK);
    cr_assert_eq(sdpa_mha_desc_dense(NULL, 1, 2, 1, 2, 3, 4, 4, 0.0f, 0), SDPA_ERR_NULL);
    cr_assert_eq(sdpa_mha_desc_bshd(NULL, 1, 2, 1, 2, 3, 4, 4, 0.0f, 0), SDPA_ERR_NULL);
    cr_assert_eq(sdpa_mha_desc_set_mask(NULL, in, 0, 0, 0), SDPA_ERR_NULL);
    d = ok;
    /* the base case is valid (and writes); the rest must not */
    cr_assert_eq(sdpa_mha_f32(&d, ERR_OUT, in, in, in), SDPA_OK);
    reset_out();
    cr_assert_eq(sdpa_mha_f32(NULL, ERR_OUT, in, in, in), SDPA_ERR_NULL);
    expect_untouched();
    cr_assert_eq(sdpa_mha_f32(&ok, NULL, in, in, in), SDPA_ERR_NULL);
    cr_assert_eq(sdpa_mha_f32(&ok, ERR_OUT, NULL, in, in), SDPA_ERR_NULL);
    expect_untouched();
    cr_assert_eq(sdpa_mha_f32(&ok, ERR_OUT, in, NULL, in), SDPA_ERR_NULL);
    expect_untouched();
    cr_assert_eq(sdpa_mha_f32(&ok, ERR_OUT, in, in, NULL), SDPA_ERR_NULL);
    expect_untouched();
    d = ok, d.struct_size = 0;
    EXPECT_MHA(SDPA_ERR_ARG, d);
    d = ok, d.struct_size = (uint32_t)V1_DESC_SIZE - 1;
    EXPECT_MHA(SDPA_ERR_ARG, d);
    d = ok, d.flags = 4;
    EXPECT_MHA(SDPA_ERR_ARG, d);
    d = ok, d.scale = NAN;
    EXPECT_MHA(SDPA_ERR_ARG, d);
    d = ok, d.heads_kv = 0;
    EXPECT_MHA(SDPA_ERR_SIZE, d);
    d = ok, d.heads_q = 3, d.heads_kv = 2;
    EXPECT_MHA(SDPA_ERR_SIZE, d);
    d = ok, d.d_k = 0;
    EXPECT_MHA(SDPA_ERR_SIZE, d);
    d = ok, d.d_v = 0;
    EXPECT_MHA(SDPA_ERR_SIZE, d);
    d = ok, d.q_stride[2] = 3;
    EXPECT_MHA(SDPA_ERR_SIZE, d);
    d = ok, d.k_stride[2] = 3;
    EXPECT_MHA(SDPA_ERR_SIZE, d);
    d = ok, d.v_stride[2] = 3;
    EXPECT_MHA(SDPA_ERR_SIZE, d);
    d = ok, d.out_stride[2] = 3;
    EXPECT_MHA(SDPA_ERR_SIZE, d);
    d = ok, d.batch = 2, d.q_stride[0] = SIZE_MAX / 2;
    EXPECT_MHA(SDPA_ERR_SIZE, d);
    d = ok, d.k_stride[1] = SIZE_MAX / 4; /* heads_kv == 1: the head stride is never used */
    cr_assert_eq(sdpa_mha_f32(&d, ERR_OUT, in, in, in), SDPA_OK);
    d = ok, d.heads_kv = 2, d.k_stride[1] = SIZE_MAX / 4;
    EXPECT_MHA(SDPA_ERR_SIZE, d);
    d = ok, d.len_kv = SIZE_MAX / 8;
    EXPECT_MHA(SDPA_ERR_SIZE, d);
    d = ok;
    sdpa_mha_desc_set_mask(&d, in, 0, 0, SIZE_MAX / 2);
    EXPECT_MHA(SDPA_ERR_SIZE, d);
    cr_assert_eq(sdpa_mha_desc_dense(&d, SIZE_MAX / 2, 4, 4, 4, 4, 4, 4, 0.0f, 0), SDPA_OK);
    EXPECT_MHA(SDPA_ERR_SIZE, d);
    cr_assert_eq(sdpa_mha_desc_bshd(&d, 2, SIZE_MAX / 4, 1, 4, 4, 4, 4, 0.0f, 0), SDPA_OK);
    EXPECT_MHA(SDPA_ERR_SIZE, d);
}

/* heads_kv divides heads_q, so 0 is an error even when there are no query heads; an output view
 * whose rows share floats (a stride of 0 over a batch or heads, a head stride inside a row) is an
 * error, where it would compute every batch entry into one place. */
BACKEND_TEST(attention, mha_errors_heads_and_output_overlap) {
    static float in[64];
    sdpa_mha_desc ok, d;
    cr_assert_eq(sdpa_mha_desc_dense(&ok, 2, 2, 1, 2, 3, 2, 2, 0.0f, 0), SDPA_OK);
    d = ok, d.heads_q = 0, d.heads_kv = 0;
    EXPECT_MHA(SDPA_ERR_SIZE, d);
    d = ok, d.batch = 0, d.heads_kv = 0;
    EXPECT_MHA(SDPA_ERR_SIZE, d);
    d = ok, d.out_stride[0] = 0;
    EXPECT_MHA(SDPA_ERR_SIZE, d);
    d = ok, d.out_stride[1] = 1; /* heads one float apart, rows of two */
    EXPECT_MHA(SDPA_ERR_SIZE, d);
    d = ok, d.out_stride[0] = 4, d.out_stride[1] = 4; /* batch and heads on one place */
    EXPECT_MHA(SDPA_ERR_SIZE, d);
    d = ok, d.batch = SIZE_MAX, d.out_stride[0] = 0, d.q_stride[0] = d.k_stride[0] = 0;
    d.v_stride[0] = 0;
    EXPECT_MHA(SDPA_ERR_SIZE, d);
    /* interleaved but disjoint, the BSHD layout: valid */
    cr_assert_eq(sdpa_mha_desc_bshd(&d, 2, 2, 1, 2, 3, 2, 2, 0.0f, 0), SDPA_OK);
    reset_out();
    cr_assert_eq(sdpa_mha_f32(&d, ERR_OUT, in, in, in), SDPA_OK);
    /* an axis of one entry may have any stride */
    d = ok, d.batch = 1, d.out_stride[0] = 0;
    cr_assert_eq(sdpa_mha_f32(&d, ERR_OUT, in, in, in), SDPA_OK);
}

/* The mask is only read, so its strides may be anything that stays in range: a row stride of 0
 * gives every query row the same mask row (a key-padding mask, as PyTorch broadcasts one). */
BACKEND_TEST(attention, mask_row_broadcast) {
    enum { LQ = 9, LKV = 13, D = 8 };
    static float q[LQ * D], k[LKV * D], v[LKV * D], out[LQ * D], want[LQ * D], row[LKV],
        full[LQ * LKV];
    rng r = rng_seed(77);
    fill_uniform(&r, q, LQ * D, -1.0f, 1.0f);
    fill_uniform(&r, k, LKV * D, -1.0f, 1.0f);
    fill_uniform(&r, v, LKV * D, -1.0f, 1.0f);
    for (size_t j = 0; j < LKV; j++) row[j] = j % 4 == 3 ? -INFINITY : (float)j * 0.1f;
    for (size_t i = 0; i < LQ; i++) memcpy(full + i * LKV, row, sizeof row);
    sdpa_mha_desc d;
    cr_assert_eq(sdpa_mha_desc_dense(&d, 1, 1, 1, LQ, LKV, D, D, 0.0f, 0), SDPA_OK);
    cr_assert_eq(sdpa_mha_desc_set_mask(&d, row, 0, 0, 0), SDPA_OK);
    cr_assert_eq(sdpa_mha_f32(&d, out, q, k, v), SDPA_OK);
    CHECK_OK(check_attention, "row stride 0", out, D, q, D, k, D, v, D, row, 0, LQ, LKV, D, D, 0.0f,
             0);
    cr_assert_eq(sdpa_mha_desc_set_mask(&d, full, 0, 0, LKV), SDPA_OK);
    cr_assert_eq(sdpa_mha_f32(&d, want, q, k, v), SDPA_OK);
    cr_assert_arr_eq(out, want, sizeof out, "the broadcast row is the full mask");
}

/* No output rows: nothing to do, so nothing is read or written (but arguments are checked). */
BACKEND_TEST(attention, mha_empty) {
    sdpa_mha_desc d;
    cr_assert_eq(sdpa_mha_desc_dense(&d, 0, 4, 2, 8, 8, 16, 16, 0.0f, 0), SDPA_OK);
    cr_assert_eq(sdpa_mha_f32(&d, NULL, NULL, NULL, NULL), SDPA_OK);
    d.flags = 8;
    cr_assert_eq(sdpa_mha_f32(&d, NULL, NULL, NULL, NULL), SDPA_ERR_ARG);
}

/* ---- concurrency: calls from several threads at once give the single-threaded results ---- */

typedef struct thread_case {
    const float *q, *k, *v;
    float *out;
    size_t lq, lkv, d;
    int repeats;
} thread_case;

static void *attention_thread(void *arg) {
    thread_case *c = arg;
    for (int i = 0; i < c->repeats; i++)
        if (sdpa_attention_f32(c->out, c->q, c->k, c->v, c->lq, c->lkv, c->d, c->d, 0.0f,
                               SDPA_CAUSAL) != SDPA_OK)
            return arg;
    return NULL;
}

BACKEND_TEST(attention, concurrent_calls) {
    enum { THREADS = 4 };
    rng r = rng_seed(314);
    const size_t lq = 70, lkv = 130, d = 40;
    float *q = malloc(THREADS * lq * d * 4), *k = malloc(THREADS * lkv * d * 4);
    float *v = malloc(THREADS * lkv * d * 4), *out = malloc(THREADS * lq * d * 4);
    float *want = malloc(THREADS * lq * d * 4);
    fill_normal(&r, q, THREADS * lq * d);
    fill_normal(&r, k, THREADS * lkv * d);
    fill_normal(&r, v, THREADS * lkv * d);
    thread_case cases[THREADS];
    for (int t = 0; t < THREADS; t++) {
        cases[t] = (thread_case){
            q + t * lq * d, k + t * lkv * d, v + t * lkv * d, out + t * lq * d, lq, lkv, d, 20};
        cr_assert_eq(sdpa_attention_f32(want + t * lq * d, cases[t].q, cases[t].k, cases[t].v, lq,
                                        lkv, d, d, 0.0f, SDPA_CAUSAL),
                     SDPA_OK);
    }
    pthread_t tid[THREADS];
    for (int t = 0; t < THREADS; t++)
        cr_assert_eq(pthread_create(&tid[t], NULL, attention_thread, &cases[t]), 0);
    for (int t = 0; t < THREADS; t++) {
        void *failed;
        cr_assert_eq(pthread_join(tid[t], &failed), 0);
        cr_assert_null(failed, "a call failed in thread %d", t);
    }
    cr_assert(memcmp(out, want, THREADS * lq * d * 4) == 0, "threaded results differ");
    free(q);
    free(k);
    free(v);
    free(out);
    free(want);
}

/* A mask entry of +inf makes that score +inf, and the row NaN (docs/numerics.md): attention does
 * not share the mass among +inf scores as softmax does. The other rows are untouched by it; on
 * every path (a decode row, a block of 8 and of 32 rows) and with f16 K/V. */
static void plus_inf_mask_rows(size_t len_q, sdpa_dtype kv_type) {
    const size_t len_kv = 70, d = 16;
    rng r = rng_seed(len_q * 3 + kv_type);
    float *q = malloc(len_q * d * 4), *k = malloc(len_kv * d * 4), *v = malloc(len_kv * d * 4);
    float *mask = calloc(len_q * len_kv, 4), *out = malloc(len_q * d * 4);
    fill_normal(&r, q, len_q * d), fill_normal(&r, k, len_kv * d), fill_normal(&r, v, len_kv * d);
    mask[0 * len_kv + 5] = INFINITY; /* row 0 */
    uint16_t *k16 = malloc(len_kv * d * 2), *v16 = malloc(len_kv * d * 2);
    cr_assert_eq(sdpa_convert(k16, SDPA_F16, k, SDPA_F32, len_kv * d), SDPA_OK);
    cr_assert_eq(sdpa_convert(v16, SDPA_F16, v, SDPA_F32, len_kv * d), SDPA_OK);
    sdpa_mha_desc desc;
    cr_assert_eq(sdpa_mha_desc_dense(&desc, 1, 1, 1, len_q, len_kv, d, d, 0.0f, 0), SDPA_OK);
    cr_assert_eq(sdpa_mha_desc_set_mask(&desc, mask, 0, 0, len_kv), SDPA_OK);
    desc.kv_type = kv_type;
    const int f16 = kv_type == SDPA_F16;
    cr_assert_eq(sdpa_mha(&desc, out, q, f16 ? (void *)k16 : k, f16 ? (void *)v16 : v), SDPA_OK);
    for (size_t c = 0; c < d; c++) cr_assert(isnan(out[c]), "len_q %zu col %zu", len_q, c);
    for (size_t i = d; i < len_q * d; i++)
        cr_assert(isfinite(out[i]), "len_q %zu: row %zu is not finite", len_q, i / d);
    free(q), free(k), free(v), free(mask), free(out), free(k16), free(v16);
}

BACKEND_TEST(attention, plus_inf_mask_entry_gives_a_nan_row) {
    static const size_t LENS[] = {1, 8, 32};
    for (size_t i = 0; i < 3; i++) {
        plus_inf_mask_rows(LENS[i], SDPA_F32);
        plus_inf_mask_rows(LENS[i], SDPA_F16);
    }
}
