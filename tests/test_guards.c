/* Every public entry point on every backend, for every tail length 0..32 (twice the widest
 * vector, AVX-512's 16 floats): each array placed so that its last float is the last one before
 * a PROT_NONE page, and again so that its first float is the first one after a PROT_NONE page.
 * A read or write outside [p, p + n) of any array faults; results must still be right. */
#include <math.h>
#include <string.h>

#include "checks.h"
#include "common.h"

#define MAX_TAIL 32

static const enum guard_side SIDES[] = {GUARD_AFTER, GUARD_BEFORE};

BACKEND_TEST(guards, dot_every_tail_both_sides) {
    rng r = rng_seed(101);
    for (size_t n = 0; n <= MAX_TAIL; n++) {
        for (size_t s = 0; s < 4; s++) {
            guarded a = guard_alloc(n, SIDES[s & 1]), b = guard_alloc(n, SIDES[s >> 1]),
                    out = guard_alloc(1, SIDES[s & 1]);
            fill_uniform(&r, a.p, n, -2.0f, 2.0f);
            fill_uniform(&r, b.p, n, -2.0f, 2.0f);
            cr_assert_eq(sdpa_dot_f32(a.p, b.p, n, out.p), SDPA_OK);
            CHECK_OK(check_dot, "guarded", out.p[0], a.p, b.p, n);
            guard_free(&a);
            guard_free(&b);
            guard_free(&out);
        }
    }
}

BACKEND_TEST(guards, scale_every_tail_both_sides_and_in_place) {
    rng r = rng_seed(102);
    for (size_t n = 0; n <= MAX_TAIL; n++) {
        for (size_t s = 0; s < 4; s++) {
            guarded x = guard_alloc(n, SIDES[s & 1]), y = guard_alloc(n, SIDES[s >> 1]);
            fill_uniform(&r, x.p, n, -100.0f, 100.0f);
            cr_assert_eq(sdpa_scale_f32(y.p, x.p, n, -0.375f), SDPA_OK);
            CHECK_OK(check_scale, "guarded", y.p, x.p, n, -0.375f);
            memcpy(y.p, x.p, n * sizeof(float));
            cr_assert_eq(sdpa_scale_f32(y.p, y.p, n, 3.0f), SDPA_OK);
            CHECK_OK(check_scale, "guarded, in place", y.p, x.p, n, 3.0f);
            guard_free(&x);
            guard_free(&y);
        }
    }
}

BACKEND_TEST(guards, softmax_every_tail_both_sides_and_in_place) {
    rng r = rng_seed(103);
    const char *modes[] = {"fast", "sleef"};
    for (size_t e = 0; e < 2; e++) {
        cr_assert_eq(sdpa_set_exp_mode(modes[e]), SDPA_OK);
        for (size_t n = 0; n <= MAX_TAIL; n++) {
            for (size_t s = 0; s < 4; s++) {
                guarded x = guard_alloc(n, SIDES[s & 1]), y = guard_alloc(n, SIDES[s >> 1]);
                fill_uniform(&r, x.p, n, -10.0f, 10.0f);
                float scale = s & 1 ? 0.5f : -1.25f; /* the sign picks the SSE tail padding */
                cr_assert_eq(sdpa_softmax_f32(y.p, x.p, n, scale), SDPA_OK);
                CHECK_OK(check_softmax, modes[e], y.p, x.p, n, scale);
                memcpy(y.p, x.p, n * sizeof(float));
                cr_assert_eq(sdpa_softmax_f32(y.p, y.p, n, scale), SDPA_OK);
                CHECK_OK(check_softmax, "in place", y.p, x.p, n, scale);
                guard_free(&x);
                guard_free(&y);
            }
        }
    }
    sdpa_set_exp_mode("fast");
}

BACKEND_TEST(guards, softmax_backward_every_tail_both_sides_and_aliased) {
    rng r = rng_seed(104);
    for (size_t n = 0; n <= MAX_TAIL; n++) {
        for (size_t s = 0; s < 8; s++) {
            guarded y = guard_alloc(n, SIDES[s & 1]), dy = guard_alloc(n, SIDES[(s >> 1) & 1]),
                    dx = guard_alloc(n, SIDES[s >> 2]);
            fill_uniform(&r, y.p, n, -3.0f, 3.0f);
            cr_assert_eq(sdpa_softmax_f32(y.p, y.p, n, 1.0f), SDPA_OK);
            fill_uniform(&r, dy.p, n, -1.0f, 1.0f);
            cr_assert_eq(sdpa_softmax_backward_f32(dx.p, y.p, dy.p, n, 0.25f), SDPA_OK);
            CHECK_OK(check_backward, "guarded", dx.p, y.p, dy.p, n, 0.25f);
            memcpy(dx.p, dy.p, n * sizeof(float));
            cr_assert_eq(sdpa_softmax_backward_f32(dx.p, y.p, dx.p, n, 0.25f), SDPA_OK);
            CHECK_OK(check_backward, "dx == dy", dx.p, y.p, dy.p, n, 0.25f);
            guard_free(&y);
            guard_free(&dy);
            guard_free(&dx);
        }
    }
}

/* Keys: each row length d in 0..32 at strides d and d + 1, the last row against the guard (or
 * the first row right after it); the query and the scores likewise. */
BACKEND_TEST(guards, scores_every_tail_both_sides) {
    rng r = rng_seed(105);
    const size_t key_counts[] = {1, 2, 3, 4, 5, 8, 9};
    for (size_t d = 0; d <= MAX_TAIL; d++) {
        for (size_t c = 0; c < sizeof key_counts / sizeof key_counts[0]; c++) {
            size_t n_keys = key_counts[c];
            for (size_t s = 0; s < 8; s++) {
                size_t stride = d + (s >> 2);
                size_t k_len = (n_keys - 1) * stride + d;
                guarded q = guard_alloc(d, SIDES[s & 1]), k = guard_alloc(k_len, SIDES[s & 1]),
                        out = guard_alloc(n_keys, SIDES[(s >> 1) & 1]);
                fill_uniform(&r, q.p, d, -1.0f, 1.0f);
                fill_uniform(&r, k.p, k_len, -1.0f, 1.0f);
                for (size_t j = 0; j < n_keys; j++) out.p[j] = SENTINEL;
                sdpa_status st = sdpa_scores_f32(out.p, q.p, k.p, n_keys, d, stride, 0.125f);
                if (d == 0) {
                    cr_assert_eq(st, SDPA_ERR_SIZE, "d == 0 with keys");
                    for (size_t j = 0; j < n_keys; j++) cr_assert_eq(out.p[j], SENTINEL);
                } else {
                    cr_assert_eq(st, SDPA_OK);
                    CHECK_OK(check_scores, "guarded", out.p, q.p, k.p, n_keys, d, stride, 0.125f);
                }
                guard_free(&q);
                guard_free(&k);
                guard_free(&out);
            }
        }
    }
    /* every tail of the scores array itself */
    for (size_t n_keys = 0; n_keys <= MAX_TAIL + 1; n_keys++) {
        for (size_t s = 0; s < 2; s++) {
            guarded q = guard_alloc(3, SIDES[s]), k = guard_alloc(n_keys * 3, SIDES[s]),
                    out = guard_alloc(n_keys, SIDES[1 - s]);
            fill_uniform(&r, q.p, 3, -1.0f, 1.0f);
            fill_uniform(&r, k.p, n_keys * 3, -1.0f, 1.0f);
            cr_assert_eq(sdpa_scores_f32(out.p, q.p, k.p, n_keys, 3, 3, -2.0f), SDPA_OK);
            CHECK_OK(check_scores, "scores tails", out.p, q.p, k.p, n_keys, 3, 3, -2.0f);
            guard_free(&q);
            guard_free(&k);
            guard_free(&out);
        }
    }
}

/* ---- attention ---- */

typedef struct guard_case {
    size_t heads_q, heads_kv, len_q, len_kv, d_k, d_v;
    int causal, mha, masked;
    unsigned sides; /* bit i: GUARD_BEFORE for array i (q, k, v, out, mask) */
} guard_case;

static enum guard_side side_of(const guard_case *c, unsigned i) {
    return (c->sides >> i) & 1 ? GUARD_BEFORE : GUARD_AFTER;
}

/* q[heads_q][len_q][d_k], k[heads_kv][len_kv][d_k], v[heads_kv][len_kv][d_v],
 * out[heads_q][len_q][d_v] and mask[len_q][len_kv] (broadcast over heads), each against a
 * guard page; through sdpa_attention_f32 (one head) or sdpa_mha_f32 (dense descriptor). */
static void guarded_attention(rng *r, const guard_case *c) {
    const size_t nq = c->heads_q * c->len_q * c->d_k, nk = c->heads_kv * c->len_kv * c->d_k;
    const size_t nv = c->heads_kv * c->len_kv * c->d_v, no = c->heads_q * c->len_q * c->d_v;
    const size_t nm = c->masked ? c->len_q * c->len_kv : 0;
    guarded q = guard_alloc(nq, side_of(c, 0)), k = guard_alloc(nk, side_of(c, 1)),
            v = guard_alloc(nv, side_of(c, 2)), out = guard_alloc(no, side_of(c, 3)),
            mask = guard_alloc(nm, side_of(c, 4));
    fill_uniform(r, q.p, nq, -1.0f, 1.0f);
    fill_uniform(r, k.p, nk, -1.0f, 1.0f);
    fill_uniform(r, v.p, nv, -2.0f, 2.0f);
    fill_uniform(r, mask.p, nm, -1.0f, 1.0f);
    for (size_t i = 0; i < nm; i += 3) mask.p[i] = -INFINITY; /* some keys removed */
    for (size_t i = 0; i < no; i++) out.p[i] = SENTINEL;
    sdpa_status st;
    if (c->mha) {
        sdpa_mha_desc desc;
        cr_assert_eq(sdpa_mha_desc_dense(&desc, 1, c->heads_q, c->heads_kv, c->len_q, c->len_kv,
                                         c->d_k, c->d_v, SDPA_DEFAULT_SCALE,
                                         c->causal ? SDPA_CAUSAL : 0),
                     SDPA_OK);
        if (c->masked)
            cr_assert_eq(sdpa_mha_desc_set_mask(&desc, mask.p, 0, 0, c->len_kv), SDPA_OK);
        st = sdpa_mha_f32(&desc, out.p, q.p, k.p, v.p);
    } else {
        st = sdpa_attention_f32(out.p, q.p, k.p, v.p, c->len_q, c->len_kv, c->d_k, c->d_v,
                                SDPA_DEFAULT_SCALE, c->causal ? SDPA_CAUSAL : 0);
    }
    if (c->len_q && (c->d_k == 0 || c->d_v == 0)) {
        cr_assert_eq(st, SDPA_ERR_SIZE, "d_k %zu d_v %zu", c->d_k, c->d_v);
        for (size_t i = 0; i < no; i++) cr_assert_eq(out.p[i], SENTINEL);
    } else {
        cr_assert_eq(st, SDPA_OK);
        const size_t group = c->heads_q / c->heads_kv;
        for (size_t h = 0; h < c->heads_q; h++) {
            const size_t hk = h / group;
            CHECK_OK(check_attention, c->mha ? "guarded mha" : "guarded attention",
                     out.p + h * c->len_q * c->d_v, c->d_v, q.p + h * c->len_q * c->d_k, c->d_k,
                     k.p + hk * c->len_kv * c->d_k, c->d_k, v.p + hk * c->len_kv * c->d_v, c->d_v,
                     c->masked ? mask.p : NULL, c->len_kv, c->len_q, c->len_kv, c->d_k, c->d_v,
                     0.0f, c->causal);
        }
    }
    guard_free(&q);
    guard_free(&k);
    guard_free(&v);
    guard_free(&out);
    guard_free(&mask);
}

/* Every head-dimension tail 0..32 of d_k and d_v (alone and together), each array ending at a
 * guard or starting right after one, single head, MHA, GQA and the grouped decode path, causal
 * or not, with and without a mask; then every tail of the mask rows (len_kv 0..33). */
BACKEND_TEST(guards, attention_every_head_tail_both_sides) {
    rng r = rng_seed(106);
    const char *modes[] = {"fast", "sleef"};
    for (size_t t = 0; t <= MAX_TAIL; t++) {
        const size_t dims[3][2] = {{t, 7}, {9, t}, {t, t}};
        for (size_t dd = 0; dd < 3; dd++) {
            for (unsigned s = 0; s < 4; s++) {
                guard_case c = {0};
                c.d_k = dims[dd][0];
                c.d_v = dims[dd][1];
                c.mha = s >= 2;
                c.heads_kv = c.mha ? 1 + (t & 1) : 1;
                c.heads_q = c.mha ? 2 * c.heads_kv : 1;
                c.len_q = s == 3 ? 1 : 1 + (t + dd) % 6; /* s == 3: the grouped decode path */
                c.len_kv = 1 + (t * 7 + dd) % 37;
                c.causal = (t + s) & 1;
                c.masked = c.mha && (t + dd) % 2;
                /* all after, all before, and two mixes */
                const unsigned patterns[4] = {0x00, 0x1f, 0x15, 0x0a};
                c.sides = patterns[(s + dd + t) % 4];
                cr_assert_eq(sdpa_set_exp_mode(modes[(t + s) & 1]), SDPA_OK);
                guarded_attention(&r, &c);
            }
        }
    }
    for (size_t len_kv = 0; len_kv <= MAX_TAIL + 1; len_kv++) {
        for (unsigned s = 0; s < 2; s++) {
            guard_case c = {.heads_q = 2,
                            .heads_kv = 1,
                            .len_q = 3,
                            .len_kv = len_kv,
                            .d_k = 5,
                            .d_v = 4,
                            .causal = (int)s,
                            .mha = 1,
                            .masked = 1,
                            .sides = s ? 0x1f : 0x00};
            guarded_attention(&r, &c);
        }
    }
    sdpa_set_exp_mode("fast");
}
