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

/* TODO(attention): the same for sdpa's attention entry points (Q, K, V and the output each
 * against a guard, every head-dimension tail 0..32), when they land. */
