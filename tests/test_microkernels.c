/* White-box: every attention microkernel of every backend's table, called directly at every
 * tail shape (nq 1..block_q, nk 1..block_kv, d 1..257), against double-precision references;
 * and every table against the rules of arch/kernels.h. The driver reaches some of these only
 * for some shapes (the packed ones for blocks of 8 rows or more with d_k <= 128), so a kernel
 * wrong at a shape the driver seldom picks would otherwise go unseen.
 *
 * Every input ends at a guard page and every output tile carries a sentinel border: a read past
 * an input faults, a write past the tile shows. Shapes: every nq with a spread of nk around the
 * register blocks, every nk with a spread of nq, and every d (every 7th in quick mode) with a
 * rotating (nq, nk). The add-ons' kernels, the score stage's tiles and the tables' rules are in
 * test_microkernels_addons.c. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bounds.h"
#include "common.h"
#include "dispatch.h"
#include "microkernels.h"
#include "reference.h"

const sdpa_kernels *kernels_of(const char *name) {
    use_backend(name); /* skips, visibly, what this build or CPU cannot run */
    const sdpa_kernels *k = sdpa_backend_kernels(name);
    cr_assert_not_null(k);
    return k;
}

size_t shapes_of(const sdpa_attention_kernels *a, size_t max_d, shape *out) {
    const size_t nks[] = {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, a->block_kv - 1, a->block_kv};
    const size_t nqs[] = {1, 2, 3, 4, 5, 8, 9, 16, 17, a->block_q - 1, a->block_q};
    const size_t ds[] = {1, 4, 16, 17, 64, max_d};
    size_t n = 0, rot = 0;
    for (size_t nq = 1; nq <= a->block_q; nq++)
        for (size_t i = 0; i < sizeof nks / sizeof nks[0]; i++, rot++)
            if (nks[i] >= 1 && nks[i] <= a->block_kv)
                out[n++] = (shape){nq, nks[i], ds[rot % (sizeof ds / sizeof ds[0])]};
    for (size_t nk = 1; nk <= a->block_kv; nk++)
        for (size_t i = 0; i < sizeof nqs / sizeof nqs[0]; i += 3, rot++)
            if (nqs[i] >= 1 && nqs[i] <= a->block_q)
                out[n++] = (shape){nqs[i], nk, ds[rot % (sizeof ds / sizeof ds[0])]};
    const size_t d_step = test_quick() ? 7 : 1;
    for (size_t d = 1; d <= max_d; d += d_step, rot++)
        out[n++] = (shape){nqs[rot % (sizeof nqs / sizeof nqs[0])],
                           nks[rot % (sizeof nks / sizeof nks[0])], d};
    return n;
}

/* Operands for one shape: q [nq][d] and k [nk][d] with padded rows, v [nk][d], each ending at a
 * guard page, values in [-1, 1). */
typedef struct operands {
    guarded q, k, v;
    size_t q_stride, k_stride, v_stride;
} operands;

static operands operands_alloc(rng *r, const shape *s) {
    operands o;
    o.q_stride = s->d + 1;
    o.k_stride = s->d + 2;
    o.v_stride = s->d + 3;
    o.q = guard_alloc((s->nq - 1) * o.q_stride + s->d, GUARD_AFTER);
    o.k = guard_alloc((s->nk - 1) * o.k_stride + s->d, GUARD_AFTER);
    o.v = guard_alloc((s->nk - 1) * o.v_stride + s->d, GUARD_AFTER);
    fill_uniform(r, o.q.p, (s->nq - 1) * o.q_stride + s->d, -1.0f, 1.0f);
    fill_uniform(r, o.k.p, (s->nk - 1) * o.k_stride + s->d, -1.0f, 1.0f);
    fill_uniform(r, o.v.p, (s->nk - 1) * o.v_stride + s->d, -1.0f, 1.0f);
    return o;
}

static void operands_free(operands *o) {
    guard_free(&o->q);
    guard_free(&o->k);
    guard_free(&o->v);
}

/* s[i][j] = scale * dot(q_i, k_j) within the dot's bound, and nothing past the tile written */
static void expect_scores(const float *s, size_t ld, int key_major, const operands *o,
                          const shape *sh, float scale, const char *what) {
    for (size_t i = 0; i < sh->nq; i++)
        for (size_t j = 0; j < sh->nk; j++) {
            const float *qi = o->q.p + i * o->q_stride, *kj = o->k.p + j * o->k_stride;
            double want = scale * ref_dot(qi, kj, sh->d);
            double bound = bound_dot(fabs(scale) * ref_dot_abs(qi, kj, sh->d));
            float got = key_major ? s[j * ld + i] : s[i * ld + j];
            cr_assert(fabs(got - want) <= bound,
                      "%s nq %zu nk %zu d %zu: s[%zu][%zu] %.9g want %.9g", what, sh->nq, sh->nk,
                      sh->d, i, j, got, want);
        }
    if (key_major) return;
    for (size_t i = 0; i < sh->nq; i++)
        for (size_t j = sh->nk; j < sh->nk + BORDER; j++)
            cr_assert_eq(s[i * ld + j], SENTINEL, "%s nq %zu nk %zu: wrote past the row", what,
                         sh->nq, sh->nk);
    for (size_t j = 0; j < ld; j++)
        cr_assert_eq(s[sh->nq * ld + j], SENTINEL, "%s nq %zu nk %zu: wrote past the rows", what,
                     sh->nq, sh->nk);
}

void fill_sentinel(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = SENTINEL;
}

float s_tile[(SDPA_ATTN_MAX_BLOCK_Q + 1) * LD_S];
static _Alignas(64) float qt[SDPA_ATTN_PACK_MAX_D * SDPA_ATTN_MAX_BLOCK_Q];
_Alignas(64) float st[SDPA_ATTN_MAX_BLOCK_KV * SDPA_ATTN_MAX_BLOCK_Q];
shape shapes[MAX_SHAPES];

BACKEND_TEST(microkernels, scores_tile) {
    const sdpa_kernels *k = kernels_of(sdpa_backend());
    const sdpa_attention_kernels *a = k->attention;
    rng r = rng_seed(11);
    const size_t n = shapes_of(a, MAX_D, shapes);
    for (size_t t = 0; t < n; t++) {
        operands o = operands_alloc(&r, &shapes[t]);
        const float scale = t % 3 == 0 ? 0.125f : t % 3 == 1 ? -1.5f : 1.0f;
        fill_sentinel(s_tile, sizeof s_tile / sizeof s_tile[0]);
        a->scores_tile(s_tile, LD_S, o.q.p, o.q_stride, shapes[t].nq, o.k.p, o.k_stride,
                       shapes[t].nk, shapes[t].d, scale);
        expect_scores(s_tile, LD_S, 0, &o, &shapes[t], scale, "scores_tile");
        operands_free(&o);
    }
}

/* A single query takes any number of keys (sdpa_scores_f32 passes all of them at once). */
BACKEND_TEST(microkernels, scores_tile_one_query_many_keys) {
    const sdpa_kernels *k = kernels_of(sdpa_backend());
    const sdpa_attention_kernels *a = k->attention;
    rng r = rng_seed(16);
    static float s[2 * (4 * SDPA_ATTN_MAX_BLOCK_KV + 8 + BORDER)];
    const size_t nks[] = {a->block_kv + 1, 3 * a->block_kv + 5, 4 * a->block_kv + 8};
    for (size_t t = 0; t < sizeof nks / sizeof nks[0]; t++) {
        const shape sh = {1, nks[t], 37 + t};
        operands o = operands_alloc(&r, &sh);
        fill_sentinel(s, sizeof s / sizeof s[0]);
        a->scores_tile(s, sh.nk + BORDER, o.q.p, o.q_stride, 1, o.k.p, o.k_stride, sh.nk, sh.d,
                       0.125f);
        expect_scores(s, sh.nk + BORDER, 0, &o, &sh, 0.125f, "scores_tile, one query");
        operands_free(&o);
    }
}

/* The packed path: pack_q, then scores_packed (row-major) and scores_max (key-major, with the
 * tile's row maxima), for d up to SDPA_ATTN_PACK_MAX_D. */
BACKEND_TEST(microkernels, packed_scores) {
    const sdpa_kernels *k = kernels_of(sdpa_backend());
    const sdpa_attention_kernels *a = k->attention;
    if (!a->pack_q) cr_skip_test("%s has no packed path", k->name);
    rng r = rng_seed(12);
    const size_t n = shapes_of(a, SDPA_ATTN_PACK_MAX_D, shapes);
    for (size_t t = 0; t < n; t++) {
        const shape *sh = &shapes[t];
        operands o = operands_alloc(&r, sh);
        const float scale = t % 3 == 0 ? 0.125f : t % 3 == 1 ? -1.5f : 1.0f;
        a->pack_q(qt, LD_Q, o.q.p, o.q_stride, sh->nq, sh->d);
        fill_sentinel(s_tile, sizeof s_tile / sizeof s_tile[0]);
        a->scores_packed(s_tile, LD_S, qt, LD_Q, sh->nq, o.k.p, o.k_stride, sh->nk, sh->d, scale);
        expect_scores(s_tile, LD_S, 0, &o, sh, scale, "scores_packed");
        if (a->scores_max) {
            float tile_max[SDPA_ATTN_MAX_BLOCK_Q];
            a->scores_max(st, LD_Q, tile_max, qt, LD_Q, sh->nq, o.k.p, o.k_stride, sh->nk, sh->d,
                          scale);
            expect_scores(st, LD_Q, 1, &o, sh, scale, "scores_max");
            for (size_t i = 0; i < sh->nq; i++) {
                float m = -INFINITY;
                for (size_t j = 0; j < sh->nk; j++) m = st[j * LD_Q + i] > m ? st[j * LD_Q + i] : m;
                cr_assert_eq(tile_max[i], m, "scores_max nq %zu nk %zu: max of row %zu", sh->nq,
                             sh->nk, i);
            }
        }
        operands_free(&o);
    }
    /* scores_max also takes SDPA_ATTN_MAX_BLOCK_KV keys (the backward's tiles) */
    const size_t nqs[] = {1, 8, 31, SDPA_ATTN_MAX_BLOCK_Q}, ds[] = {16, SDPA_ATTN_PACK_MAX_D};
    for (size_t t = 0; a->scores_max && t < 8; t++) {
        const shape sh = {nqs[t % 4], SDPA_ATTN_MAX_BLOCK_KV, ds[t / 4]};
        operands o = operands_alloc(&r, &sh);
        float tile_max[SDPA_ATTN_MAX_BLOCK_Q];
        a->pack_q(qt, LD_Q, o.q.p, o.q_stride, sh.nq, sh.d);
        a->scores_max(st, LD_Q, tile_max, qt, LD_Q, sh.nq, o.k.p, o.k_stride, sh.nk, sh.d, 0.5f);
        expect_scores(st, LD_Q, 1, &o, &sh, 0.5f, "scores_max");
        operands_free(&o);
    }
}

/* The key-major entries with leading dimensions wider than the packed block, at up to
 * SDPA_ATTN_MAX_BLOCK_KV keys: pack_q, scores_keymajor, scores_max (from the wide qt into a wide
 * st) and scores_packed (from the wide qt). The padding of every row (poisoned with NaN in qt,
 * the sentinel in st) is never read or written, and scores_keymajor's tile is scores_max's bit
 * for bit (the backward's scores are the forward's). */
BACKEND_TEST(microkernels, scores_keymajor) {
    const sdpa_kernels *k = kernels_of(sdpa_backend());
    const sdpa_attention_kernels *a = k->attention;
    if (!a->scores_keymajor) cr_skip_test("%s has no scores_keymajor", k->name);
    cr_assert(a->pack_q, "scores_keymajor reads pack_q's tile");
    enum { LD_WIDE = SDPA_ATTN_MAX_BLOCK_Q + 16 };
    static _Alignas(64) float qt_wide[SDPA_ATTN_PACK_MAX_D * LD_WIDE];
    static _Alignas(64) float st_wide[(SDPA_ATTN_MAX_BLOCK_KV + 1) * LD_WIDE];
    static _Alignas(64) float st_max[(SDPA_ATTN_MAX_BLOCK_KV + 1) * LD_WIDE];
    const size_t nqs[] = {1, 3, 8, 9, 17, SDPA_ATTN_MAX_BLOCK_Q - 1, SDPA_ATTN_MAX_BLOCK_Q};
    const size_t nks[] = {1, 2, 5, 7, 8, 9, 31, 64, SDPA_ATTN_MAX_BLOCK_KV};
    const size_t ds[] = {1, 3, 16, 17, 64, SDPA_ATTN_PACK_MAX_D};
    rng r = rng_seed(16);
    for (size_t t = 0; t < 7 * 9; t++) {
        const shape sh = {nqs[t % 7], nks[t / 7], ds[t % 6]};
        operands o = operands_alloc(&r, &sh);
        const float scale = t % 2 ? -0.75f : 0.125f;
        for (size_t e = 0; e < sizeof qt_wide / sizeof qt_wide[0]; e++) qt_wide[e] = NAN;
        fill_sentinel(st_wide, sizeof st_wide / sizeof st_wide[0]);
        a->pack_q(qt_wide, LD_WIDE, o.q.p, o.q_stride, sh.nq, sh.d);
        for (size_t p = 0; p < sh.d; p++)
            for (size_t i = 0; i < LD_WIDE; i++) {
                const float got = qt_wide[p * LD_WIDE + i];
                if (i < sh.nq)
                    cr_assert_eq(got, o.q.p[i * o.q_stride + p], "pack_q: qt[%zu][%zu]", p, i);
                else if (i < SDPA_ATTN_MAX_BLOCK_Q)
                    cr_assert_eq(got, 0.0f, "pack_q nq %zu: query %zu not zero", sh.nq, i);
                else
                    cr_assert(isnan(got), "pack_q ld %d: wrote qt[%zu][%zu]", LD_WIDE, p, i);
            }
        a->scores_keymajor(st_wide, LD_WIDE, qt_wide, LD_WIDE, sh.nq, o.k.p, o.k_stride, sh.nk,
                           sh.d, scale);
        expect_scores(st_wide, LD_WIDE, 1, &o, &sh, scale, "scores_keymajor");
        for (size_t j = 0; j <= sh.nk; j++)
            for (size_t i = j < sh.nk ? SDPA_ATTN_MAX_BLOCK_Q : 0; i < LD_WIDE; i++)
                cr_assert_eq(st_wide[j * LD_WIDE + i], SENTINEL,
                             "scores_keymajor nq %zu nk %zu: wrote st[%zu][%zu]", sh.nq, sh.nk, j,
                             i);
        if (a->scores_packed) {
            fill_sentinel(s_tile, sizeof s_tile / sizeof s_tile[0]);
            a->scores_packed(s_tile, LD_S, qt_wide, LD_WIDE, sh.nq, o.k.p, o.k_stride, sh.nk, sh.d,
                             scale);
            expect_scores(s_tile, LD_S, 0, &o, &sh, scale, "scores_packed, ld_qt wide");
        }
        if (a->scores_max) {
            float tile_max[SDPA_ATTN_MAX_BLOCK_Q];
            fill_sentinel(st_max, sizeof st_max / sizeof st_max[0]);
            a->scores_max(st_max, LD_WIDE, tile_max, qt_wide, LD_WIDE, sh.nq, o.k.p, o.k_stride,
                          sh.nk, sh.d, scale);
            for (size_t j = 0; j < sh.nk; j++) {
                cr_assert(
                    memcmp(st_wide + j * LD_WIDE, st_max + j * LD_WIDE, sh.nq * sizeof(float)) == 0,
                    "scores_keymajor nq %zu nk %zu d %zu: key %zu not scores_max's bits", sh.nq,
                    sh.nk, sh.d, j);
                for (size_t i = SDPA_ATTN_MAX_BLOCK_Q; i < LD_WIDE; i++)
                    cr_assert_eq(st_max[j * LD_WIDE + i], SENTINEL,
                                 "scores_max ld %d: wrote st[%zu][%zu]", LD_WIDE, j, i);
            }
            for (size_t i = 0; i < LD_WIDE; i++)
                cr_assert_eq(st_max[sh.nk * LD_WIDE + i], SENTINEL,
                             "scores_max nk %zu: wrote key row %zu", sh.nk, sh.nk);
            for (size_t i = 0; i < sh.nq; i++) {
                float m = -INFINITY;
                for (size_t j = 0; j < sh.nk; j++)
                    m = st_max[j * LD_WIDE + i] > m ? st_max[j * LD_WIDE + i] : m;
                cr_assert_eq(tile_max[i], m, "scores_max ld %d: max of row %zu", LD_WIDE, i);
            }
        }
        operands_free(&o);
    }
}

/* acc[i] += sum_j p[i][j] v_j, within the dot's bound; nothing past the rows written. The
 * weights row-major (pv_tile) or key-major in an aligned tile (pv_tile_t). */
static void check_pv(int keymajor) {
    const sdpa_kernels *k = kernels_of(sdpa_backend());
    const sdpa_attention_kernels *a = k->attention;
    const char *name = keymajor ? "pv_tile_t" : "pv_tile";
    static _Alignas(64) float pt[SDPA_ATTN_MAX_BLOCK_KV * LD_Q];
    rng r = rng_seed(keymajor ? 14 : 13);
    const size_t n = shapes_of(a, MAX_D, shapes);
    enum { LD_ACC = MAX_D + BORDER };
    static float acc[(SDPA_ATTN_MAX_BLOCK_Q + 1) * LD_ACC], acc0[SDPA_ATTN_MAX_BLOCK_Q * LD_ACC];
    for (size_t t = 0; t < n; t++) {
        const shape *sh = &shapes[t];
        operands o = operands_alloc(&r, sh); /* v is [nk][d]: d plays d_v */
        fill_sentinel(acc, sizeof acc / sizeof acc[0]);
        for (size_t i = 0; i < sh->nq; i++)
            for (size_t c = 0; c < sh->d; c++)
                acc[i * LD_ACC + c] = acc0[i * LD_ACC + c] = (float)rng_uniform(&r, -1, 1);
        for (size_t i = 0; i < sh->nq; i++)
            for (size_t j = 0; j < sh->nk; j++) s_tile[i * LD_S + j] = (float)rng_uniform(&r, 0, 1);
        if (keymajor) {
            for (size_t i = 0; i < sh->nq; i++)
                for (size_t j = 0; j < sh->nk; j++) pt[j * LD_Q + i] = s_tile[i * LD_S + j];
            a->pv_tile_t(acc, LD_ACC, pt, LD_Q, sh->nq, sh->nk, o.v.p, o.v_stride, sh->d);
        } else {
            a->pv_tile(acc, LD_ACC, s_tile, LD_S, sh->nq, sh->nk, o.v.p, o.v_stride, sh->d);
        }
        for (size_t i = 0; i < sh->nq; i++) {
            for (size_t c = 0; c < sh->d; c++) {
                double want = acc0[i * LD_ACC + c], terms = fabs(want);
                for (size_t j = 0; j < sh->nk; j++) {
                    double pv = (double)s_tile[i * LD_S + j] * o.v.p[j * o.v_stride + c];
                    want += pv;
                    terms += fabs(pv);
                }
                cr_assert(fabs(acc[i * LD_ACC + c] - want) <= bound_dot(terms),
                          "%s nq %zu nk %zu d_v %zu: acc[%zu][%zu] %.9g want %.9g", name, sh->nq,
                          sh->nk, sh->d, i, c, acc[i * LD_ACC + c], want);
            }
            for (size_t c = sh->d; c < sh->d + BORDER; c++)
                cr_assert_eq(acc[i * LD_ACC + c], SENTINEL, "%s wrote past a row", name);
        }
        for (size_t c = 0; c < LD_ACC; c++)
            cr_assert_eq(acc[sh->nq * LD_ACC + c], SENTINEL, "%s wrote past the rows", name);
        operands_free(&o);
    }
}

BACKEND_TEST(microkernels, pv_tile) { check_pv(0); }
BACKEND_TEST(microkernels, pv_tile_t) { check_pv(1); }

/* exp(s - shift), the difference rounded to float as the kernels' contract has it, within the
 * exp's bound (3 ULP fast, 1 ULP sleef; a little more with the shift folded in), and the row
 * sums (sums not NULL). A weight whose exp is below FLT_MIN may be 0 or anything below FLT_MIN
 * (kernels.h). */
static void expect_exps(const float *got, const float *s0, size_t ld, int key_major, size_t nq,
                        size_t nk, const float *shift, const float *sums, const char *what) {
    for (size_t i = 0; i < nq; i++) {
        double sum = 0.0;
        for (size_t j = 0; j < nk; j++) {
            const size_t at = key_major ? j * ld + i : i * ld + j;
            double want = exp((double)(s0[at] - shift[i]));
            float e = got[at];
            sum += e;
            if (want < FLT_MIN) {
                cr_assert(e >= 0.0f && e < FLT_MIN, "%s: %a for %g", what, e, want);
                continue;
            }
            cr_assert(fabs(e - want) <= 5e-7 * want, "%s nq %zu nk %zu [%zu][%zu]: %.9g want %.9g",
                      what, nq, nk, i, j, e, want);
        }
        if (sums)
            cr_assert(fabs(sums[i] - sum) <= 1e-6 * sum + 1e-30,
                      "%s: row %zu sums %.9g, its exps %.9g", what, i, sums[i], sum);
    }
}

BACKEND_TEST(microkernels, exp_tile) {
    const sdpa_kernels *k = kernels_of(sdpa_backend());
    const sdpa_attention_kernels *a = k->attention;
    if (!a->exp_tile[SDPA_EXP_FAST]) cr_skip_test("%s has no exp_tile", k->name);
    rng r = rng_seed(14);
    static float s0[SDPA_ATTN_MAX_BLOCK_Q * LD_S];
    const size_t n = shapes_of(a, 1, shapes);
    for (int kind = 0; kind < SDPA_EXP_KINDS; kind++)
        for (size_t t = 0; t < n; t++) {
            const shape *sh = &shapes[t];
            float shift[SDPA_ATTN_MAX_BLOCK_Q], sums[SDPA_ATTN_MAX_BLOCK_Q];
            for (size_t i = 0; i < sh->nq; i++) {
                float m = -INFINITY;
                for (size_t j = 0; j < sh->nk; j++) {
                    float v = (float)rng_uniform(&r, -90.0, 20.0); /* some flush to 0 */
                    s0[i * LD_S + j] = s_tile[i * LD_S + j] = v;
                    m = v > m ? v : m;
                }
                shift[i] = m;
            }
            a->exp_tile[kind](s_tile, LD_S, sh->nq, sh->nk, shift, sums);
            expect_exps(s_tile, s0, LD_S, 0, sh->nq, sh->nk, shift, sums,
                        kind ? "exp_tile sleef" : "exp_tile fast");
        }
}

/* The backward's P^T = exp(S^T - lse) in a key-major tile whose rows are wider than the columns
 * it takes (the padding, sentinels, never read or written): within the exp's bound, and bit for
 * bit the exps the forward's tiles take (exp_tile at a zero shift where the backend has it, else
 * exp_sum at a zero shift, each on s - shift rounded to float). */
BACKEND_TEST(microkernels, exp_keymajor) {
    const sdpa_kernels *k = kernels_of(sdpa_backend());
    const sdpa_attention_kernels *a = k->attention;
    if (!a->exp_keymajor[SDPA_EXP_FAST]) cr_skip_test("%s has no exp_keymajor", k->name);
    enum { LD_WIDE = SDPA_ATTN_MAX_BLOCK_Q + 16, KEYS = SDPA_ATTN_MAX_BLOCK_KV };
    static _Alignas(64) float got[(KEYS + 1) * LD_WIDE], s0[KEYS * LD_WIDE], want[KEYS * LD_WIDE];
    const size_t nqs[] = {1, 3, 4, 5, 8, 15, 16, 17, 31, SDPA_ATTN_MAX_BLOCK_Q};
    const size_t nks[] = {1, 2, 3, 7, 64, KEYS};
    rng r = rng_seed(17);
    for (int kind = 0; kind < SDPA_EXP_KINDS; kind++)
        for (size_t t = 0; t < 10 * 6; t++) {
            const size_t nq = nqs[t % 10], nk = nks[t / 10];
            float shift[SDPA_ATTN_MAX_BLOCK_Q], zero[KEYS] = {0}, sums[KEYS];
            fill_sentinel(got, sizeof got / sizeof got[0]);
            for (size_t i = 0; i < nq; i++) {
                float m = -INFINITY;
                for (size_t j = 0; j < nk; j++) {
                    const float v = (float)rng_uniform(&r, -90.0, 20.0); /* some flush to 0 */
                    s0[j * LD_WIDE + i] = got[j * LD_WIDE + i] = v;
                    m = v > m ? v : m;
                }
                shift[i] = m + (float)rng_uniform(&r, 0.0, 2.0); /* an lse: at least the max */
            }
            a->exp_keymajor[kind](got, LD_WIDE, nk, nq, shift);
            const char *what = kind ? "exp_keymajor sleef" : "exp_keymajor fast";
            expect_exps(got, s0, LD_WIDE, 1, nq, nk, shift, NULL, what);
            for (size_t j = 0; j <= nk; j++)
                for (size_t i = j < nk ? nq : 0; i < LD_WIDE; i++)
                    cr_assert_eq(got[j * LD_WIDE + i], SENTINEL,
                                 "%s nq %zu nk %zu: wrote [%zu][%zu]", what, nq, nk, j, i);
            for (size_t j = 0; j < nk; j++) {
                for (size_t i = 0; i < nq; i++)
                    want[j * LD_WIDE + i] = s0[j * LD_WIDE + i] - shift[i];
                if (!a->exp_tile[kind])
                    k->exp_sum[kind](want + j * LD_WIDE, want + j * LD_WIDE, nq, 1.0f, 0.0f);
            }
            if (a->exp_tile[kind]) a->exp_tile[kind](want, LD_WIDE, nk, nq, zero, sums);
            for (size_t j = 0; j < nk; j++)
                cr_assert(memcmp(got + j * LD_WIDE, want + j * LD_WIDE, nq * sizeof(float)) == 0,
                          "%s nq %zu nk %zu: key %zu not the forward's exps", what, nq, nk, j);
        }
}

/* The backward's dS^T = scale P^T o (dP^T - D) (ds_keymajor), key-major with a leading
 * dimension wider than the block: each element as the contract's three float operations,
 * computed here in double and rounded to float after each (exact: double holds more than twice
 * float's bits, so each rounding is float's own); nothing past nq in a row nor past key nk is
 * written. */
BACKEND_TEST(microkernels, ds_keymajor) {
    const sdpa_kernels *k = kernels_of(sdpa_backend());
    const sdpa_attention_kernels *a = k->attention;
    enum { LD_WIDE = SDPA_ATTN_MAX_BLOCK_Q + 16, KEYS = SDPA_ATTN_MAX_BLOCK_KV };
    static _Alignas(64) float got[(KEYS + 1) * LD_WIDE], p[KEYS * LD_WIDE], dp[KEYS * LD_WIDE];
    const size_t nqs[] = {1, 3, 4, 5, 8, 15, 16, 17, 31, SDPA_ATTN_MAX_BLOCK_Q};
    const size_t nks[] = {1, 2, 7, 64, KEYS};
    rng r = rng_seed(18);
    for (size_t t = 0; t < 10 * 5; t++) {
        const size_t nq = nqs[t % 10], nk = nks[t / 10];
        const float scale = t % 2 ? -0.125f : 0.0883883f;
        float dd[SDPA_ATTN_MAX_BLOCK_Q];
        for (size_t i = 0; i < nq; i++) dd[i] = (float)rng_uniform(&r, -3.0, 3.0);
        fill_sentinel(got, sizeof got / sizeof got[0]);
        for (size_t j = 0; j < nk; j++)
            for (size_t i = 0; i < nq; i++) {
                p[j * LD_WIDE + i] = (float)rng_uniform(&r, 0.0, 1.0);
                got[j * LD_WIDE + i] = dp[j * LD_WIDE + i] = (float)rng_uniform(&r, -3.0, 3.0);
            }
        a->ds_keymajor(got, p, LD_WIDE, nk, nq, dd, scale);
        for (size_t j = 0; j <= nk; j++)
            for (size_t i = 0; i < LD_WIDE; i++) {
                const float g = got[j * LD_WIDE + i];
                if (j == nk || i >= nq) {
                    cr_assert_eq(g, SENTINEL, "ds_keymajor nq %zu nk %zu: wrote [%zu][%zu]", nq, nk,
                                 j, i);
                    continue;
                }
                const float diff = (float)((double)dp[j * LD_WIDE + i] - dd[i]);
                const float prod = (float)((double)p[j * LD_WIDE + i] * diff);
                const float want = (float)((double)scale * prod);
                cr_assert_eq(g, want, "ds_keymajor nq %zu nk %zu: [%zu][%zu] %.9g want %.9g", nq,
                             nk, j, i, g, want);
            }
    }
}

/* The online-softmax step of the packed path: scores_max, the driver's new maxima, then exp_pv:
 * alpha, the weights in place, their sums, and acc scaled by alpha plus the weights times v. */
BACKEND_TEST(microkernels, scores_max_and_exp_pv) {
    const sdpa_kernels *k = kernels_of(sdpa_backend());
    const sdpa_attention_kernels *a = k->attention;
    if (!a->scores_max) cr_skip_test("%s has no scores_max/exp_pv pair", k->name);
    rng r = rng_seed(15);
    enum { LD_ACC = MAX_D + BORDER };
    static float acc[SDPA_ATTN_MAX_BLOCK_Q * LD_ACC], acc0[SDPA_ATTN_MAX_BLOCK_Q * LD_ACC];
    enum { LD_WIDE = SDPA_ATTN_MAX_BLOCK_Q + 16 };
    static _Alignas(64) float st_ld[SDPA_ATTN_MAX_BLOCK_KV * LD_WIDE];
    static float s0[SDPA_ATTN_MAX_BLOCK_KV * LD_WIDE];
    const size_t n = shapes_of(a, SDPA_ATTN_PACK_MAX_D, shapes);
    for (int kind = 0; kind < SDPA_EXP_KINDS; kind++)
        for (size_t t = 0; t < n; t++) {
            const shape *sh = &shapes[t];
            operands o = operands_alloc(&r, sh);
            const size_t ld = t % 2 ? LD_WIDE : LD_Q; /* the tile's leading dimension */
            float m[SDPA_ATTN_MAX_BLOCK_Q], m_new[SDPA_ATTN_MAX_BLOCK_Q],
                tile_max[SDPA_ATTN_MAX_BLOCK_Q], alpha[SDPA_ATTN_MAX_BLOCK_Q],
                sums[SDPA_ATTN_MAX_BLOCK_Q];
            a->pack_q(qt, LD_Q, o.q.p, o.q_stride, sh->nq, sh->d);
            fill_sentinel(st_ld, sizeof st_ld / sizeof st_ld[0]);
            a->scores_max(st_ld, ld, tile_max, qt, LD_Q, sh->nq, o.k.p, o.k_stride, sh->nk, sh->d,
                          2.0f);
            memcpy(s0, st_ld, sizeof s0);
            for (size_t i = 0; i < sh->nq; i++) {
                /* the first block (m = -inf), a max that holds, one that moves, and one so far
                   above this tile that its weights fall below FLT_MIN (and must be 0) */
                m[i] = i % 4 == 0   ? -INFINITY
                       : i % 4 == 1 ? tile_max[i] + 1.0f
                       : i % 4 == 2 ? tile_max[i] - 0.75f
                                    : tile_max[i] + 95.0f;
                m_new[i] = m[i] > tile_max[i] ? m[i] : tile_max[i];
                for (size_t c = 0; c < sh->d; c++)
                    acc[i * LD_ACC + c] = acc0[i * LD_ACC + c] = (float)rng_uniform(&r, -1, 1);
            }
            a->exp_pv[kind](acc, LD_ACC, st_ld, ld, m, m_new, alpha, sums, sh->nq, sh->nk, o.v.p,
                            o.v_stride, sh->d);
            const char *what = kind ? "exp_pv sleef" : "exp_pv fast";
            expect_exps(st_ld, s0, ld, 1, sh->nq, sh->nk, m_new, sums, what);
            for (size_t j = 0; j < sh->nk; j++)
                for (size_t i = SDPA_ATTN_MAX_BLOCK_Q; i < ld; i++)
                    cr_assert_eq(st_ld[j * ld + i], SENTINEL, "%s ld %zu: wrote st[%zu][%zu]", what,
                                 ld, j, i);
            for (size_t i = 0; i < sh->nq; i++) {
                /* an alpha below FLT_MIN only scales what the new weights (one of them 1)
                   outweigh beyond float's precision: the contract lets it be any such value */
                double want_alpha = exp((double)(m[i] - m_new[i]));
                cr_assert(want_alpha < FLT_MIN ? alpha[i] >= 0.0f && alpha[i] < FLT_MIN
                                               : fabs(alpha[i] - want_alpha) <= 5e-7 * want_alpha,
                          "%s: alpha %.9g want %.9g", what, alpha[i], want_alpha);
                for (size_t c = 0; c < sh->d; c++) {
                    double want = (double)alpha[i] * acc0[i * LD_ACC + c], terms = fabs(want);
                    for (size_t j = 0; j < sh->nk; j++) {
                        double pv = (double)st_ld[j * ld + i] * o.v.p[j * o.v_stride + c];
                        want += pv;
                        terms += fabs(pv);
                    }
                    cr_assert(fabs(acc[i * LD_ACC + c] - want) <= bound_dot(terms),
                              "%s nq %zu nk %zu d %zu: acc[%zu][%zu] %.9g want %.9g", what, sh->nq,
                              sh->nk, sh->d, i, c, acc[i * LD_ACC + c], want);
                }
            }
            operands_free(&o);
        }
}

/* ---- the typed entries (kernels.h: scores_tile_typed, pv_tile_typed) ---- */

/* n elements of the 16-bit type ending where a PROT_NONE page begins, from floats in [-1, 1)
 * rounded to the type, with every 7th a subnormal of the type (f16's widen to normal floats,
 * bf16's to subnormal ones) */
static uint16_t *half_alloc(const sdpa_kernels *k, int type, rng *r, guarded *g, size_t n) {
    const size_t bytes = n * sizeof(uint16_t);
    *g = guard_alloc((bytes + 3) / 4, GUARD_AFTER);
    uint16_t *x = (uint16_t *)((char *)(g->p + (bytes + 3) / 4) - bytes);
    for (size_t i = 0; i < n; i++) {
        const float f = (float)rng_uniform(r, -1.0, 1.0);
        k->narrow[type](x + i, &f, 1);
        if (i % 7 == 3)
            x[i] = (uint16_t)((x[i] & 0x8000u) | (1u + i % (type == SDPA_TYPE_F16 ? 1023 : 127)));
    }
    return x;
}

/* The shapes of the float entries' tests, and single queries against more than a block of keys
 * (as scores_tile_one_query_many_keys) */
static size_t typed_shapes(const sdpa_attention_kernels *a) {
    size_t n = shapes_of(a, MAX_D, shapes);
    const size_t nks[] = {a->block_kv + 1, 3 * a->block_kv + 5, 4 * a->block_kv + 8};
    for (size_t t = 0; t < 3; t++) shapes[n++] = (shape){1, nks[t], 37 + 45 * t};
    return n;
}

/* One shape of one type: K and V of the type (rows with odd strides, each array against a guard
 * page) and their widened copies as the float operands. The scores and P V of the typed entries
 * must be the float entries' on the widened rows bit for bit (the border of each tile
 * included), and so also within the double references' bounds. */
static void check_typed_shape(const sdpa_kernels *k, int type, rng *r, const shape *sh, size_t t) {
    const sdpa_attention_kernels *a = k->attention;
    enum { LD_ACC = MAX_D + BORDER };
    static float acc[(SDPA_ATTN_MAX_BLOCK_Q + 1) * LD_ACC],
        acc_ref[(SDPA_ATTN_MAX_BLOCK_Q + 1) * LD_ACC];
    static float s_ref[(SDPA_ATTN_MAX_BLOCK_Q + 1) * LD_S];
    static float s_long[2][2 * (4 * SDPA_ATTN_MAX_BLOCK_KV + 8 + BORDER)]; /* a row and a border */
    operands o = operands_alloc(r, sh);
    guarded gk, gv;
    const size_t kn = (sh->nk - 1) * o.k_stride + sh->d, vn = (sh->nk - 1) * o.v_stride + sh->d;
    const uint16_t *k16 = half_alloc(k, type, r, &gk, kn), *v16 = half_alloc(k, type, r, &gv, vn);
    k->widen[type](o.k.p, k16, kn);
    k->widen[type](o.v.p, v16, vn);
    const char *tn = type == SDPA_TYPE_F16 ? "f16" : "bf16";
    const float scale = t % 3 == 0 ? 0.125f : t % 3 == 1 ? -1.5f : 1.0f;

    /* one query's row may be longer than a tile's */
    const int one = sh->nk > a->block_kv;
    float *got = one ? s_long[0] : s_tile, *want = one ? s_long[1] : s_ref;
    const size_t ld = one ? sh->nk + BORDER : LD_S;
    const size_t s_len = one ? sizeof s_long[0] / sizeof(float) : sizeof s_ref / sizeof(float);
    fill_sentinel(got, s_len);
    fill_sentinel(want, s_len);
    a->scores_tile(want, ld, o.q.p, o.q_stride, sh->nq, o.k.p, o.k_stride, sh->nk, sh->d, scale);
    /* where the entry reads ahead past its rows (here every other shape: rows of another
       buffer) never changes a result */
    const void *ahead = t % 2 ? (const void *)o.v.p : NULL;
    a->scores_tile_typed[type](got, ld, o.q.p, o.q_stride, sh->nq, k16, o.k_stride, ahead, sh->nk,
                               sh->d, scale);
    cr_assert(memcmp(got, want, s_len * sizeof(float)) == 0,
              "scores_tile_typed %s nq %zu nk %zu d %zu: not the float entry's tile", tn, sh->nq,
              sh->nk, sh->d);
    expect_scores(got, ld, 0, &o, sh, scale, "scores_tile_typed");

    if (!one) {
        fill_sentinel(acc, sizeof acc / sizeof acc[0]);
        for (size_t i = 0; i < sh->nq; i++) {
            for (size_t c = 0; c < sh->d; c++) acc[i * LD_ACC + c] = (float)rng_uniform(r, -1, 1);
            for (size_t j = 0; j < sh->nk; j++) s_tile[i * LD_S + j] = (float)rng_uniform(r, 0, 1);
        }
        memcpy(acc_ref, acc, sizeof acc);
        a->pv_tile(acc_ref, LD_ACC, s_tile, LD_S, sh->nq, sh->nk, o.v.p, o.v_stride, sh->d);
        a->pv_tile_typed[type](acc, LD_ACC, s_tile, LD_S, sh->nq, sh->nk, v16, o.v_stride, ahead,
                               sh->d);
        cr_assert(memcmp(acc, acc_ref, sizeof acc) == 0,
                  "pv_tile_typed %s nq %zu nk %zu d_v %zu: not the float entry's sums", tn, sh->nq,
                  sh->nk, sh->d);
    }
    guard_free(&gk);
    guard_free(&gv);
    operands_free(&o);
}

/* Every shape, f16 and bf16; with DAZ set too, under which f16 takes the exact widening (F16C
 * may read subnormals as 0 there, and widen does not) */
BACKEND_TEST(microkernels, typed_tiles) {
    const sdpa_kernels *k = kernels_of(sdpa_backend());
    const sdpa_attention_kernels *a = k->attention;
    if (!a->scores_tile_typed[SDPA_TYPE_F16] && !a->scores_tile_typed[SDPA_TYPE_BF16])
        cr_skip_test("%s has no typed entries", k->name);
    rng r = rng_seed(18);
    const size_t n = typed_shapes(a);
    for (int type = SDPA_TYPE_F16; type <= SDPA_TYPE_BF16; type++) {
        if (!a->scores_tile_typed[type]) continue;
        for (size_t t = 0; t < n; t++) check_typed_shape(k, type, &r, &shapes[t], t);
    }
    set_ftz_daz(1);
    for (size_t t = 0; t < n; t += 5) check_typed_shape(k, SDPA_TYPE_F16, &r, &shapes[t], t);
    set_ftz_daz(0);
}
