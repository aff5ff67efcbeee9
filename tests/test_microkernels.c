/* White-box: every attention microkernel of every backend's table, called directly at every
 * tail shape (nq 1..block_q, nk 1..block_kv, d 1..257), against double-precision references;
 * and every table against the rules of arch/kernels.h. The driver reaches some of these only
 * for some shapes (the packed ones for blocks of 8 rows or more with d_k <= 128), so a kernel
 * wrong at a shape the driver seldom picks would otherwise go unseen.
 *
 * Every input ends at a guard page and every output tile carries a sentinel border: a read past
 * an input faults, a write past the tile shows. Shapes: every nq with a spread of nk around the
 * register blocks, every nk with a spread of nq, and every d (every 7th in quick mode) with a
 * rotating (nq, nk). */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bounds.h"
#include "common.h"
#include "dispatch.h"
#include "reference.h"

#if defined(__x86_64__)
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

#define MAX_D  257
#define BORDER 3 /* sentinel floats past each tile row */
enum { LD_S = SDPA_ATTN_MAX_BLOCK_KV + BORDER, LD_Q = SDPA_ATTN_MAX_BLOCK_Q };

static const sdpa_kernels *kernels_of(const char *name) {
    use_backend(name); /* skips, visibly, what this build or CPU cannot run */
    const sdpa_kernels *k = sdpa_backend_kernels(name);
    cr_assert_not_null(k);
    return k;
}

/* The (nq, nk, d) triples a kernel is called with: every nq against a spread of nk, every nk
 * against a spread of nq, every d against a rotating pair. */
typedef struct shape {
    size_t nq, nk, d;
} shape;

static size_t shapes_of(const sdpa_attention_kernels *a, size_t max_d, shape *out) {
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

/* the bf16 dot adds 2 x 4 x 12 shapes of its own (bf16_dot_shapes) */
#define MAX_SHAPES (SDPA_ATTN_MAX_BLOCK_Q * 15 + SDPA_ATTN_MAX_BLOCK_KV * 4 + MAX_D + 8 + 96)

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

static void fill_sentinel(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = SENTINEL;
}

static float s_tile[(SDPA_ATTN_MAX_BLOCK_Q + 1) * LD_S];
static _Alignas(64) float qt[SDPA_ATTN_PACK_MAX_D * SDPA_ATTN_MAX_BLOCK_Q];
static _Alignas(64) float st[SDPA_ATTN_MAX_BLOCK_KV * SDPA_ATTN_MAX_BLOCK_Q];
static shape shapes[MAX_SHAPES];

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

/* ---- the bf16 dot add-on (kernels.h: sdpa_bf16_dot_kernels) ---- */

/* n bf16 elements ending where a PROT_NONE page begins, from floats in [-1, 1) cut to bf16
 * (their upper halves), with every 5th of them a subnormal when subnormals is set */
static uint16_t *bf16_alloc(rng *r, guarded *g, size_t n, int subnormals) {
    const size_t bytes = n * sizeof(uint16_t);
    *g = guard_alloc((bytes + 3) / 4, GUARD_AFTER);
    uint16_t *x = (uint16_t *)((char *)(g->p + (bytes + 3) / 4) - bytes);
    for (size_t i = 0; i < n; i++) {
        float f = (float)rng_uniform(r, -1.0, 1.0);
        uint32_t u;
        memcpy(&u, &f, sizeof u);
        x[i] = (uint16_t)(u >> 16);
        if (subnormals && i % 5 == 0) x[i] = (uint16_t)((x[i] & 0x8000u) | (1u + i % 127));
    }
    return x;
}

static double bf16_value(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* scale * dot of row i of q and row j of k, and the dot's bound, in double; a subnormal element
 * may count as 0 (kernels.h), which the bound covers: each such product is below 2^-126 */
static double bf16_dot_ref(const uint16_t *q, const uint16_t *k, size_t d, double scale,
                           double *bound) {
    double sum = 0.0, abs_sum = 0.0;
    for (size_t p = 0; p < d; p++) {
        sum += bf16_value(q[p]) * bf16_value(k[p]);
        abs_sum += fabs(bf16_value(q[p]) * bf16_value(k[p]));
    }
    *bound = bound_dot(fabs(scale) * abs_sum) + (double)d * 0x1p-126;
    return scale * sum;
}

static _Alignas(64) uint32_t qt_pairs[SDPA_ATTN_PACK_MAX_D / 2 * SDPA_ATTN_MAX_BLOCK_Q];

/* Every bf16 dot add-on of backend k that this build has and this CPU runs, whichever the
 * environment turns on (the one in use is only the first of them): up to max into out, their
 * number returned. */
enum { MAX_BF16_DOTS = 4 };
static size_t bf16_dots(const sdpa_kernels *k, sdpa_addon_info *out) {
    size_t n = 0;
    sdpa_addon_info info;
    for (size_t i = 0; sdpa_bf16_dot_addon(k, i, &info) && n < MAX_BF16_DOTS; i++)
        if (info.runnable) out[n++] = info;
    return n;
}

/* The shapes for the bf16 dot: the attention kernels' (nq from 8: the driver's blocks), and d
 * 32 and 96 (whole AMX tiles, which the spread above gives only once each) against every key
 * tail of a 16-key tile and both halves of the queries. */
static size_t bf16_dot_shapes(const sdpa_kernels *k, shape *out) {
    const size_t all = shapes_of(k->attention, SDPA_ATTN_PACK_MAX_D, out);
    size_t n = 0;
    for (size_t t = 0; t < all; t++)
        if (out[t].nq >= 8) out[n++] = out[t];
    const size_t nqs[] = {8, 16, 17, SDPA_ATTN_MAX_BLOCK_Q};
    const size_t nks[] = {1, 15, 16, 17, 31, 32, 33, 47, 48, 63, 127, SDPA_ATTN_MAX_BLOCK_KV};
    const size_t ds[] = {32, 96};
    for (size_t a = 0; a < sizeof ds / sizeof ds[0]; a++)
        for (size_t b = 0; b < sizeof nqs / sizeof nqs[0]; b++)
            for (size_t c = 0; c < sizeof nks / sizeof nks[0]; c++)
                out[n++] = (shape){nqs[b], nks[c], ds[a]};
    return n;
}

/* Each bf16 dot add-on this CPU runs (whether or not the environment turned it on): pack_q's
 * pairs and zero queries, scores_packed (row-major, nothing written past the tile) and
 * scores_max (key-major, with the maxima, no key row past nk written), at every packed shape,
 * odd and even d, odd strides (rows that start between two pairs), inputs ending at a guard
 * page (an odd d's last pair, a tile's last rows, must not read past a row), some elements
 * subnormal. */
BACKEND_TEST(microkernels, bf16_dot_scores) {
    const sdpa_kernels *k = kernels_of(sdpa_backend());
    sdpa_addon_info dots[MAX_BF16_DOTS];
    const size_t n_dots = bf16_dots(k, dots);
    if (!n_dots) cr_skip_test("no bf16 dot for %s here (CPU or build)", k->name);
    const size_t n = bf16_dot_shapes(k, shapes);
    for (size_t x = 0; x < n_dots; x++) {
        const sdpa_bf16_dot_kernels *b = dots[x].table;
        const char *name = dots[x].name;
        rng r = rng_seed(17);
        for (size_t t = 0; t < n; t++) {
            const shape *sh = &shapes[t];
            const size_t q_stride = sh->d + (t % 2), k_stride = sh->d + (t % 3);
            guarded gq, gk;
            const uint16_t *q = bf16_alloc(&r, &gq, (sh->nq - 1) * q_stride + sh->d, t % 4 == 0);
            const uint16_t *kk = bf16_alloc(&r, &gk, (sh->nk - 1) * k_stride + sh->d, t % 4 == 1);
            const float scale = t % 3 == 0 ? 0.125f : t % 3 == 1 ? -1.5f : 1.0f;
            memset(qt_pairs, 0xff, sizeof qt_pairs);
            b->pack_q(qt_pairs, LD_Q, q, q_stride, sh->nq, sh->d);
            for (size_t p = 0; p < (sh->d + 1) / 2; p++)
                for (size_t i = 0; i < SDPA_ATTN_MAX_BLOCK_Q; i++) {
                    const uint16_t *qi = q + i * q_stride + 2 * p;
                    const uint32_t want =
                        i >= sh->nq ? 0 : qi[0] | (2 * p + 1 < sh->d ? (uint32_t)qi[1] << 16 : 0);
                    cr_assert_eq(qt_pairs[p * SDPA_ATTN_MAX_BLOCK_Q + i], want,
                                 "%s pack_q nq %zu d %zu: pair %zu of query %zu", name, sh->nq,
                                 sh->d, p, i);
                }
            fill_sentinel(s_tile, sizeof s_tile / sizeof s_tile[0]);
            b->scores_packed(s_tile, LD_S, qt_pairs, LD_Q, sh->nq, kk, k_stride, sh->nk, sh->d,
                             scale);
            float tile_max[SDPA_ATTN_MAX_BLOCK_Q];
            fill_sentinel(st, sizeof st / sizeof st[0]);
            b->scores_max(st, LD_Q, tile_max, qt_pairs, LD_Q, sh->nq, kk, k_stride, sh->nk, sh->d,
                          scale);
            for (size_t i = 0; i < sh->nq; i++) {
                float m = -INFINITY;
                for (size_t j = 0; j < sh->nk; j++) {
                    double bound;
                    const double want =
                        bf16_dot_ref(q + i * q_stride, kk + j * k_stride, sh->d, scale, &bound);
                    const float rows = s_tile[i * LD_S + j], keys = st[j * LD_Q + i];
                    cr_assert(fabs(rows - want) <= bound && fabs(keys - want) <= bound,
                              "%s nq %zu nk %zu d %zu: s[%zu][%zu] %.9g (packed) %.9g (max) "
                              "want %.9g",
                              name, sh->nq, sh->nk, sh->d, i, j, rows, keys, want);
                    m = keys > m ? keys : m;
                }
                cr_assert_eq(tile_max[i], m, "%s scores_max nq %zu nk %zu: max of row %zu", name,
                             sh->nq, sh->nk, i);
                for (size_t j = sh->nk; j < sh->nk + BORDER; j++)
                    cr_assert_eq(s_tile[i * LD_S + j], SENTINEL,
                                 "%s scores_packed wrote past the row", name);
            }
            for (size_t j = 0; j < LD_S; j++)
                cr_assert_eq(s_tile[sh->nq * LD_S + j], SENTINEL,
                             "%s scores_packed wrote past the rows", name);
            for (size_t j = sh->nk * LD_Q; j < sizeof st / sizeof st[0]; j++)
                cr_assert_eq(st[j], SENTINEL, "%s scores_max nk %zu wrote key row %zu", name,
                             sh->nk, j / LD_Q);
            guard_free(&gq);
            guard_free(&gk);
        }
    }
}

/* Each bf16 dot on the special values: inf and NaN in q or k make the scores that see them NaN
 * or inf as a float dot would (so the driver's NaN rows and +inf rules hold), a finite row next
 * to them stays finite. d 5 (an odd last pair) and d 32 (one whole AMX tile step, where AMX
 * takes it), the special elements in the first and in the last pair. */
BACKEND_TEST(microkernels, bf16_dot_special_values) {
    const sdpa_kernels *k = kernels_of(sdpa_backend());
    sdpa_addon_info dots[MAX_BF16_DOTS];
    const size_t n_dots = bf16_dots(k, dots);
    if (!n_dots) cr_skip_test("no bf16 dot for %s here (CPU or build)", k->name);
    enum { NQ = 8, NK = 9, MAXD = 32 };
    const size_t ds[] = {5, MAXD};
    for (size_t x = 0; x < n_dots; x++)
        for (size_t di = 0; di < sizeof ds / sizeof ds[0]; di++) {
            const sdpa_bf16_dot_kernels *b = dots[x].table;
            const size_t D = ds[di];
            uint16_t q[NQ * MAXD], kk[NK * MAXD];
            for (size_t i = 0; i < NQ * D; i++) q[i] = 0x3f80;  /* 1 */
            for (size_t i = 0; i < NK * D; i++) kk[i] = 0x3f00; /* 0.5 */
            q[1 * D + D - 1] = 0x7f80;  /* query 1: +inf, in the last pair */
            q[2 * D + 1] = 0x7fc1;      /* query 2: NaN */
            kk[3 * D + 2] = 0xff80;     /* key 3: -inf */
            kk[4 * D + D - 1] = 0xffc0; /* key 4: NaN, in the last pair */
            b->pack_q(qt_pairs, LD_Q, q, D, NQ, D);
            float tile_max[SDPA_ATTN_MAX_BLOCK_Q];
            b->scores_max(st, LD_Q, tile_max, qt_pairs, LD_Q, NQ, kk, D, NK, D, 1.0f);
            const float finite = 0.5f * (float)D;
            for (size_t i = 0; i < NQ; i++)
                for (size_t j = 0; j < NK; j++) {
                    const float s = st[j * LD_Q + i];
                    if (i == 2 || j == 4 || (i == 1 && j == 3))
                        cr_assert(isnan(s), "%s d %zu: s[%zu][%zu] = %g, want NaN", dots[x].name, D,
                                  i, j, s);
                    else if (i == 1)
                        cr_assert(s == INFINITY, "%s d %zu: s[1][%zu] = %g, want +inf",
                                  dots[x].name, D, j, s);
                    else if (j == 3)
                        cr_assert(s == -INFINITY, "%s d %zu: s[%zu][3] = %g, want -inf",
                                  dots[x].name, D, i, s);
                    else
                        cr_assert(s == finite, "%s d %zu: s[%zu][%zu] = %g, want %g", dots[x].name,
                                  D, i, j, s, finite);
                }
        }
}

/* Whether Linux has granted this process AMX's tile data (ARCH_GET_XCOMP_PERM) */
static int amx_granted_now(void) {
#if defined(__x86_64__) && defined(__linux__)
    unsigned long perm = 0;
    return syscall(SYS_arch_prctl, 0x1022 /* ARCH_GET_XCOMP_PERM */, &perm) == 0 &&
           (perm & (1ul << 18)) != 0;
#else
    return 0;
#endif
}

/* This CPU's own word on a feature a record requires, apart from src/dispatch.c's probes: GCC's
 * CPUID for the AVX-512 flags; for AMX, CPUID and XCR0's tile state (Linux's grant comes at the
 * first use, checked by the tests below). */
static int test_cpu_has(const char *name, size_t len) {
#if defined(__x86_64__)
    char f[32];
    snprintf(f, sizeof f, "%.*s", (int)len, name);
    __builtin_cpu_init();
    if (strcmp(f, "AVX-512F") == 0) return __builtin_cpu_supports("avx512f");
    if (strcmp(f, "AVX512BW") == 0) return __builtin_cpu_supports("avx512bw");
    if (strcmp(f, "AVX512_BF16") == 0) return __builtin_cpu_supports("avx512bf16");
    if (strcmp(f, "AMX_TILE") == 0 || strcmp(f, "AMX_BF16") == 0) {
        unsigned a, b, c, d;
        if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
        if (!(d & (1u << (strcmp(f, "AMX_TILE") == 0 ? 24 : 22)))) return 0;
        if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return 0;
        unsigned lo, hi;
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        return (lo & 0x60000u) == 0x60000u;
    }
#else
    (void)name, (void)len;
#endif
    return 0;
}

static int test_cpu_has_all(const char *requires) {
    for (const char *p = requires; *p;) {
        const size_t len = strcspn(p, "+");
        if (!test_cpu_has(p, len)) return 0;
        p += len + (p[len] == '+');
    }
    return 1;
}

/* Each add-on is on exactly where it should be: for its backend when this CPU has what it
 * requires and its variable is on or, unset, its record's default is (the suites run with the
 * variables set every way), and the bf16 dot in use is the first of them that is on. */
BACKEND_TEST(microkernels, bf16_dot_follows_cpu_and_environment) {
    const sdpa_kernels *k = kernels_of(sdpa_backend());
    const sdpa_bf16_dot_kernels *first = NULL;
    /* the permission check must come before sdpa_bf16_dot_addon, which asks for it itself */
    int want[MAX_BF16_DOTS];
    sdpa_addon_info info;
    size_t n = 0;
    for (; sdpa_bf16_dot_addon(k, n, &info) && n < MAX_BF16_DOTS; n++) {
        const char *env = getenv(info.env);
        const int set = env && (strcmp(env, "on") == 0 || strcmp(env, "off") == 0);
        want[n] =
            (set ? strcmp(env, "on") == 0 : info.default_on) && test_cpu_has_all(info.requires);
    }
    if (strcmp(k->name, "avx512") != 0) cr_assert_eq(n, 0, "%s: no bf16 dot add-ons", k->name);
    for (size_t i = 0; i < n; i++) {
        cr_assert(sdpa_bf16_dot_addon(k, i, &info));
        cr_assert_eq(info.on, want[i], "%s: %s %s, expected %s", k->name, info.name,
                     info.on ? "on" : "off", want[i] ? "on" : "off");
        if (info.on) {
            cr_assert(info.runnable && info.table, "%s: on, so runnable", info.name);
            cr_assert(info.table->pack_q && info.table->scores_packed && info.table->scores_max,
                      "%s: a bf16 dot table is whole", info.name);
            if (!first) first = info.table;
        }
    }
    cr_assert(sdpa_bf16_dot_for(k) == first, "%s: the bf16 dot in use is the first one on",
              k->name);
    for (size_t i = 0; i < n; i++)
        if (sdpa_bf16_dot_addon(k, i, &info) && info.on && strstr(info.requires, "AMX_TILE"))
            cr_assert(amx_granted_now(), "%s on, so Linux granted the tile state", info.name);
}

/* Loading the library asks Linux for nothing (the grant of AMX's tile state is process-wide: it
 * makes sigaltstack refuse small stacks); the first all-bf16 attention on avx512 asks, if the
 * AMX add-on is on (SDPA_AMX not off), and otherwise never. Each test runs in a process of its
 * own, forked from a runner that made no such call. */
Test(microkernels, amx_permission_waits_for_first_use) {
    if (!test_cpu_has_all("AVX512BW+AMX_TILE+AMX_BF16") || !sdpa_backend_supported("avx512"))
        cr_skip_test("no AMX here (CPU, OS state, or an emulator)");
    cr_assert(!amx_granted_now(), "the tile state was granted before any call asked for it");
    cr_assert_eq(sdpa_set_backend("avx512"), SDPA_OK);
    enum { LQ = 32, LK = 64, D = 64 };
    uint16_t q[LQ * D], kv[LK * D], out[LQ * D];
    for (size_t i = 0; i < LQ * D; i++) q[i] = 0x3f80;  /* bf16 1.0 */
    for (size_t i = 0; i < LK * D; i++) kv[i] = 0x3f00; /* bf16 0.5 */
    sdpa_mha_desc desc;
    sdpa_mha_desc_dense(&desc, 1, 1, 1, LQ, LK, D, D, SDPA_DEFAULT_SCALE, 0);
    desc.q_type = desc.kv_type = desc.out_type = SDPA_BF16;
    cr_assert_eq(sdpa_mha(&desc, out, q, kv, kv), SDPA_OK);
    for (size_t i = 0; i < LQ * D; i++) cr_assert_eq(out[i], 0x3f00, "out[%zu] = %#x", i, out[i]);
    const char *env = getenv("SDPA_AMX");
    const int wanted = !(env && strcmp(env, "off") == 0);
    cr_assert_eq(amx_granted_now(), wanted, "after an all-bf16 call with SDPA_AMX=%s: %s",
                 env ? env : "(unset)", amx_granted_now() ? "granted" : "not asked");
}

/* ulps of x's magnitude in float, at least the smallest subnormal's */
static double float_ulp(double x) {
    const float f = (float)fabs(x);
    return f < FLT_MIN ? 0x1p-149 : (double)(nextafterf(f, INFINITY) - f);
}

/* stage_tile's softcap (docs/numerics.md: within 8 ulps of c tanh(s / c), its derivative within
 * 2^-21 of 1 - tanh^2) over |s / c| from 1e-9 to 1e4, both signs, dense around the switch from
 * the series at 1/4, with +-0, +-inf and NaN; then ALiBi after it, each bias one rounding of
 * slope (dist + j), key-major with the row maxima (NaN where a score is) and along one row. */
static void check_stage_cap(const sdpa_kernels *k, int kind, float c) {
    enum { N = 4099 }; /* a partial last vector on every width */
    static float s[N], s0[N], deriv[N];
    for (size_t i = 0; i < N - 5; i++) {
        const double a = i % 3 ? pow(10.0, -9.0 + 13.0 * (double)i / N) : 0.2 + 0.1 * i / N;
        s0[i] = (float)((i % 2 ? -1.0 : 1.0) * c * a);
    }
    s0[N - 5] = 0.0f, s0[N - 4] = -0.0f, s0[N - 3] = INFINITY, s0[N - 2] = -INFINITY;
    s0[N - 1] = NAN;
    memcpy(s, s0, sizeof s);
    const sdpa_stage_tile t = {s, N, 1, N, c, 0, deriv, NULL, NULL, NULL};
    k->stage_tile[kind](&t);
    for (size_t i = 0; i < N; i++) {
        if (isnan(s0[i])) {
            cr_assert(isnan(s[i]), "cap %g: softcap(NaN) = %g", c, s[i]);
            continue;
        }
        const double th = tanh((double)s0[i] / c), want = c * th;
        cr_assert(fabs(s[i] - want) <= 8.0 * float_ulp(want) && signbit(s[i]) == signbit(s0[i]),
                  "kind %d cap %g: softcap(%.9g) = %.9g, want %.9g (%.1f ulps)", kind, c, s0[i],
                  s[i], want, fabs(s[i] - want) / float_ulp(want));
        cr_assert(fabs(deriv[i] - (1.0 - th * th)) <= 0x1p-21, "kind %d cap %g: %.9g: %.9g", kind,
                  c, s0[i], deriv[i]);
    }
}

static void check_stage_alibi(const sdpa_kernels *k, int kind, rng *r) {
    enum { LD = SDPA_ATTN_MAX_BLOCK_Q, KEYS = 37 };
    static float s[KEYS * LD], s0[KEYS * LD], capped[KEYS * LD];
    float slope[LD], dist[LD], max[LD];
    for (size_t n = 1; n <= LD; n++)
        for (int cap = 0; cap < 2; cap++) {
            for (size_t x = 0; x < LD; x++) {
                slope[x] = (float)rng_uniform(r, -1.0, 1.0);
                dist[x] = (float)(int)rng_uniform(r, -5000.0, 5000.0);
            }
            for (size_t e = 0; e < KEYS * LD; e++) s0[e] = (float)rng_uniform(r, -40.0, 40.0);
            s0[(n - 1) * LD + (n - 1) / 2] = NAN; /* one row's max is NaN */
            memcpy(s, s0, sizeof s);
            memcpy(capped, s0, sizeof s);
            const float c = cap ? 20.0f : 0.0f;
            if (cap) { /* the softcap alone, checked above, gives the capped scores */
                const sdpa_stage_tile t = {capped, LD, KEYS, n, c, 0, NULL, NULL, NULL, NULL};
                k->stage_tile[kind](&t);
            }
            const sdpa_stage_tile t = {s, LD, KEYS, n, c, 0, NULL, slope, dist, max};
            k->stage_tile[kind](&t);
            for (size_t x = 0; x < n; x++) {
                double m = -INFINITY;
                int nan = 0;
                for (size_t j = 0; j < KEYS; j++) {
                    const float bias = (float)((double)slope[x] * (dist[x] + (double)j));
                    const float want = capped[j * LD + x] + bias;
                    const float got = s[j * LD + x];
                    nan |= isnan(want);
                    if (!isnan(want)) m = got > m ? got : m;
                    cr_assert(isnan(want) ? isnan(got) : got == want,
                              "n %zu cap %d [%zu][%zu]: %.9g, want %.9g", n, cap, j, x, got, want);
                }
                cr_assert(nan ? isnan(max[x]) : max[x] == m, "n %zu: max[%zu] %g, want %g", n, x,
                          max[x], m);
            }
            for (size_t j = 0; j < KEYS; j++) /* positions from n on untouched */
                for (size_t x = n; x < LD; x++)
                    cr_assert(s[j * LD + x] == s0[j * LD + x] || isnan(s0[j * LD + x]));
        }
    for (size_t n = 1; n <= 131; n += 13) { /* one row: slope[0] (dist[0] + x) */
        for (size_t x = 0; x < n; x++) s0[x] = s[x] = (float)rng_uniform(r, -40.0, 40.0);
        const sdpa_stage_tile t = {s, n, 1, n, 0.0f, 1, NULL, slope, dist, NULL};
        k->stage_tile[kind](&t);
        for (size_t x = 0; x < n; x++)
            cr_assert(s[x] == s0[x] + (float)((double)slope[0] * (dist[0] + (double)x)),
                      "one row of %zu: [%zu]", n, x);
    }
}

BACKEND_TEST(microkernels, stage_tile) {
    const sdpa_kernels *k = kernels_of(sdpa_backend());
    if (!k->stage_tile[SDPA_EXP_FAST]) cr_skip_test("%s has no stage_tile", k->name);
    rng r = rng_seed(37);
    const float caps[] = {30.0f, 1.0f, 1e-3f, 1e20f};
    for (int kind = 0; kind < SDPA_EXP_KINDS; kind++) {
        for (size_t ci = 0; ci < sizeof caps / sizeof caps[0]; ci++)
            check_stage_cap(k, kind, caps[ci]);
        check_stage_alibi(k, kind, &r);
    }
}

/* rows_finite against isfinite element by element: n rows of d floats, stride apart, the last
 * ending at a guard page, with finite extremes (FLT_MAX, subnormals, signed zeros) everywhere
 * and inf between the rows, which must not count; then each of inf, -inf and NaN at every place
 * in turn, every one of which must. */
BACKEND_TEST(microkernels, rows_finite_finds_every_inf_and_nan) {
    const sdpa_kernels *k = kernels_of(sdpa_backend());
    const size_t shapes[][3] = {{1, 1, 1}, {3, 17, 20}, {5, 16, 16}, {2, 33, 40}, {4, 128, 131},
                                {2, 7, 7}, {0, 8, 8},   {2, 0, 4}}; /* n, d, stride */
    const float good[] = {FLT_MAX, -FLT_MAX, FLT_MIN, 1e-45f, -0.0f, 0.0f, 1.0f};
    const float bad[] = {INFINITY, -INFINITY, NAN};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const size_t n = shapes[i][0], d = shapes[i][1], stride = shapes[i][2];
        const size_t total = n && d ? (n - 1) * stride + d : 0;
        guarded g = guard_alloc(total, GUARD_AFTER);
        float *x = g.p;
        for (size_t j = 0; j < total; j++) x[j] = INFINITY;
        for (size_t r = 0; r < n; r++)
            for (size_t c = 0; c < d; c++) x[r * stride + c] = good[(r + c) % 7];
        cr_assert_eq(k->rows_finite(x, stride, n, d), 1, "n %zu d %zu", n, d);
        for (size_t r = 0; r < n; r++)
            for (size_t c = 0; c < d; c++)
                for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
                    const float keep = x[r * stride + c];
                    x[r * stride + c] = bad[b];
                    cr_assert_eq(k->rows_finite(x, stride, n, d), 0, "n %zu d %zu at %zu,%zu: %g",
                                 n, d, r, c, (double)bad[b]);
                    x[r * stride + c] = keep;
                }
        guard_free(&g);
    }
}

/* The rules of arch/kernels.h that no call would show: required kernels present, optional
 * pairs both present or both absent, blocks within the driver's stack tiles. */
BACKEND_TEST(microkernels, table_obeys_its_rules) {
    const sdpa_kernels *k = kernels_of(sdpa_backend());
    cr_assert_str_eq(k->name, sdpa_backend());
    cr_assert(k->dot && k->dot_to && k->scale && k->max_scaled && k->rows_finite && k->normalize &&
              k->softmax_backward && k->attention);
    cr_assert(k->exp_sum_block >= 16);
    for (int kind = 0; kind < SDPA_EXP_KINDS; kind++) {
        cr_assert(k->exp_sum[kind] && k->exp[kind], "exp kind %d", kind);
        cr_assert(!k->exp_sum_max[kind] == !k->exp_sum_max[0], "exp_sum_max: both or neither");
        cr_assert(!k->softmax_short[kind] == !k->softmax_short[0],
                  "softmax_short: both or neither");
    }
    const sdpa_attention_kernels *a = k->attention;
    cr_assert(a->block_q >= 1 && a->block_q <= SDPA_ATTN_MAX_BLOCK_Q);
    cr_assert(a->block_kv >= 1 && a->block_kv <= SDPA_ATTN_MAX_BLOCK_KV);
    cr_assert(a->scores_tile && a->pv_tile && a->pv_tile_t && a->ds_keymajor);
    cr_assert(!a->exp_tile[0] == !a->exp_tile[1], "exp_tile: both kinds or neither");
    cr_assert(!a->pack_q == !a->scores_packed, "pack_q and scores_packed: both or neither");
    cr_assert(!a->scores_max == !a->exp_pv[0] && !a->exp_pv[0] == !a->exp_pv[1],
              "scores_max and exp_pv: all or none");
    cr_assert(!a->scores_max || a->pack_q, "scores_max needs pack_q");
    cr_assert(!a->scores_keymajor || a->pack_q, "scores_keymajor needs pack_q");
    cr_assert(!a->exp_keymajor[0] == !a->exp_keymajor[1], "exp_keymajor: both kinds or neither");
    cr_assert(!k->stage_tile[0] == !k->stage_tile[1], "stage_tile: both kinds or neither");
    cr_assert(!a->scores_tile_typed[SDPA_TYPE_F32] && !a->pv_tile_typed[SDPA_TYPE_F32],
              "typed entries: none for f32");
    for (int t = SDPA_TYPE_F16; t < SDPA_TYPES; t++)
        cr_assert(!a->scores_tile_typed[t] == !a->pv_tile_typed[t],
                  "typed entries of type %d: both or neither", t);
}
