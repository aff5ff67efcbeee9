/* Inputs the fuzzers (tests/fuzz/, scripts/fuzz) found to break the contract of sdpa.h, one
 * test each, named after what broke; every backend, both exp modes where softmax is involved. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "checks.h"
#include "common.h"

static const char *const EXP_MODES[] = {"fast", "sleef"};

/* fuzz_kernels, softmax, n=4, scale ~ -4e31: with a fused multiply-subtract, exp_sum computed
 * scale * x_i - max exactly instead of from the rounded z_i = fl(scale * x_i), so the largest
 * entry got exp(rounding error of its product) = exp(+-1e22) = inf or 0 instead of exp(0) = 1,
 * and the row came out NaN (inf * 0 or 0 * inf in the normalisation). Finite inputs whose
 * scaled values are beyond the accuracy range must still give a distribution. */
BACKEND_TEST(regressions, softmax_huge_scaled_inputs_are_not_nan) {
    const float x[] = {0.1f, 0.7f, 0.3f, -0.5f, 0.69999999f, 0.123456f, -0.9f, 0.33f, 0.7f};
    const float scales[] = {1e30f, -4e31f, 3.3e37f, 1e-30f * 1e20f};
    for (size_t e = 0; e < 2; e++) {
        cr_assert_eq(sdpa_set_exp_mode(EXP_MODES[e]), SDPA_OK);
        for (size_t s = 0; s < sizeof scales / sizeof scales[0]; s++) {
            for (size_t n = 1; n <= sizeof x / sizeof x[0]; n++) {
                float y[16];
                cr_assert_eq(sdpa_softmax_f32(y, x, n, scales[s]), SDPA_OK);
                double sum = 0.0;
                for (size_t i = 0; i < n; i++) {
                    cr_assert(y[i] >= 0.0f && y[i] <= 1.0f, "exp %s scale %g n=%zu i=%zu: %a",
                              EXP_MODES[e], scales[s], n, i, y[i]);
                    sum += y[i];
                }
                cr_assert(fabs(sum - 1.0) <= 1e-6, "exp %s scale %g n=%zu: sum %.9g", EXP_MODES[e],
                          scales[s], n, sum);
            }
        }
    }
    sdpa_set_exp_mode("fast");
}

/* Equal values in a long row: every rounding of a lane accumulator errs the same way, so the
 * scalar backend's dot (four lanes of 1024 additions at n = 4096) reached a relative error of
 * 1.53e-5 against the documented 1e-5 * sum |a_i b_i| (found by a scan of constant rows after
 * the fuzzer's "repeat" mode was added). Both entry points built on the dot are checked. */
BACKEND_TEST(regressions, dot_of_equal_values_within_bound) {
    enum { N = 4096 };
    static float a[N], b[N];
    const float values[] = {0x1.03aap+0f, 1.1f, 0.7f, 0.1f, 3.1f, 0x1.f8b58p+0f};
    for (size_t v = 0; v < sizeof values / sizeof values[0]; v++) {
        for (size_t i = 0; i < N; i++) {
            a[i] = values[v];
            b[i] = 1.0f;
        }
        double want = (double)N * values[v];
        float got;
        cr_assert_eq(sdpa_dot_f32(a, b, N, &got), SDPA_OK);
        cr_assert(fabs(got - want) <= 1e-5 * want, "dot of %a: rel error %.3g", values[v],
                  fabs(got - want) / want);
        float s[2];
        cr_assert_eq(sdpa_scores_f32(s, b, a, 1, N, N, 1.0f), SDPA_OK);
        cr_assert(fabs(s[0] - want) <= 1e-5 * want, "scores of %a: rel error %.3g", values[v],
                  fabs(s[0] - want) / want);
    }
}

/* fuzz_kernels, softmax, n = 2815, scale -1 (scalar backend): x = {2, -23.12, then -13.28
 * repeated}. The max weight 1 and 2813 weights of 5.3e-5 share lane sums; adding a small weight
 * to a sum near 1 rounds the same way every time, and with up to 1024 additions per lane (the
 * driver's chunk was 4096) the normalised weights came out 3.14e-5 off (bound 2e-5). The driver
 * now sums chunks of 512 in double. Also nearby values, and the same with the max in front. */
BACKEND_TEST(regressions, softmax_many_small_equal_weights_within_bound) {
    enum { N = 2815 };
    static float x[N], y[N];
    for (size_t e = 0; e < 2; e++) {
        cr_assert_eq(sdpa_set_exp_mode(EXP_MODES[e]), SDPA_OK);
        for (int k = -8; k <= 8; k++) {
            float c = -0x1.a914p+3f + 0.37f * (float)k;
            for (size_t front = 0; front < 2; front++) {
                x[0] = front ? -0x1.71f6p+4f : 2.0f;
                x[1] = front ? 2.0f : -0x1.71f6p+4f;
                for (size_t i = 2; i < N; i++) x[i] = c;
                cr_assert_eq(sdpa_softmax_f32(y, x, N, -1.0f), SDPA_OK);
                CHECK_OK(check_softmax, EXP_MODES[e], y, x, N, -1.0f);
            }
        }
    }
    sdpa_set_exp_mode("fast");
}

/* fuzz_attention: an inf in q or k that makes a score -inf. The header said that inf in q or in
 * a seen key's k gives a NaN row "(which makes the scores non-finite)"; the library (in line with
 * softmax's rules, sdpa.h) gives a -inf score weight 0, and a row whose scores are all -inf
 * zeros; only NaN or +inf scores give a NaN row. The header now says so; this pins it. */
BACKEND_TEST(regressions, attention_minus_inf_scores_get_weight_zero) {
    for (size_t e = 0; e < 2; e++) {
        cr_assert_eq(sdpa_set_exp_mode(EXP_MODES[e]), SDPA_OK);
        /* d_k = 2: q . k_j = q0 k_j0 + q1 k_j1 */
        const float v[3] = {3.0f, 4.0f, 5.0f};
        float out[2];
        /* q0 = -inf, every k_j0 > 0: every score -inf, the row is zeros */
        const float q_all[4] = {-INFINITY, 1.0f};
        const float k_all[6] = {1.0f, 0.5f, 2.0f, -1.0f, 0.25f, 0.0f};
        cr_assert_eq(sdpa_attention_f32(out, q_all, k_all, v, 1, 3, 2, 1, 1.0f, 0), SDPA_OK);
        cr_assert(out[0] == 0.0f && !signbit(out[0]), "all -inf scores: %a", out[0]);
        /* one key's k0 = -inf with q0 > 0: that key drops out, the others share the weight */
        const float q_one[2] = {1.0f, 0.5f};
        const float k_one[6] = {-INFINITY, 1.0f, 0.5f, 0.5f, 0.5f, 0.5f};
        cr_assert_eq(sdpa_attention_f32(out, q_one, k_one, v, 1, 3, 2, 1, 1.0f, 0), SDPA_OK);
        cr_assert(fabsf(out[0] - 4.5f) <= 1e-5f, "one -inf score: %a, want 4.5", out[0]);
        /* a +inf score: NaN row (exp(inf - inf)) */
        const float k_plus[6] = {INFINITY, 1.0f, 0.5f, 0.5f, 0.5f, 0.5f};
        cr_assert_eq(sdpa_attention_f32(out, q_one, k_plus, v, 1, 3, 2, 1, 1.0f, 0), SDPA_OK);
        cr_assert(isnan(out[0]), "+inf score: %a, want NaN", out[0]);
        /* the same through mha with a causal row that sees only the -inf-score key */
        sdpa_mha_desc desc;
        cr_assert_eq(sdpa_mha_desc_dense(&desc, 1, 1, 1, 2, 2, 2, 1, 1.0f, SDPA_CAUSAL), SDPA_OK);
        const float q2[4] = {1.0f, 0.5f, 1.0f, 0.5f};
        float out2[2];
        cr_assert_eq(sdpa_mha_f32(&desc, out2, q2, k_one, v), SDPA_OK);
        cr_assert(out2[0] == 0.0f && !signbit(out2[0]), "causal row 0, -inf score: %a", out2[0]);
        cr_assert(fabsf(out2[1] - 4.0f) <= 1e-5f, "causal row 1: %a, want 4", out2[1]);
    }
    sdpa_set_exp_mode("fast");
}

/* ---- Softmax under directed rounding, and rows of one entry (found probing the ABI from the
 * header alone). Self-contained: its own include and helper. ---- */
#include <fenv.h>

/* softmax of x[0, n) under `round`, on the active backend and exp mode; the mode is restored */
static void softmax_rounded(int round, float *y, const float *x, size_t n, float scale) {
    cr_assert_eq(fesetround(round), 0);
    const sdpa_status st = sdpa_softmax_f32(y, x, n, scale);
    fesetround(FE_TONEAREST);
    cr_assert_eq(st, SDPA_OK);
}

/* n = 4097, x = 3 but one 1.5, scale 1e37 under FE_DOWNWARD: the answer is 1/4096 for the equal
 * entries and 0 for the other; avx2 gave 4096 NaN. The driver found the max of z = scale * x
 * rounded in the caller's mode (0x1.691ca2p+124), then avx2's exp_sum set round-to-nearest for
 * its magic-number rounding and rounded z again, one ULP above the max (0x1.691ca4p+124): exp
 * gave +inf. The same double rounding gave all zeros for x = 3e38, scale 2, n = 300: the rows
 * kernel's max overflowed to +inf under round-to-nearest, the special-value path in the caller's
 * mode found z = FLT_MAX and no +inf entry. */
BACKEND_TEST(regressions, softmax_directed_rounding_rounds_z_once) {
    static float x[4097], y[4097];
    static const int rounds[] = {FE_DOWNWARD, FE_TOWARDZERO};
    for (size_t e = 0; e < 2; e++) {
        cr_assert_eq(sdpa_set_exp_mode(EXP_MODES[e]), SDPA_OK);
        for (size_t r = 0; r < 2; r++) {
            for (size_t i = 0; i < 4097; i++) x[i] = 3.0f;
            x[1234] = 1.5f;
            softmax_rounded(rounds[r], y, x, 4097, 1e37f);
            for (size_t i = 0; i < 4097; i++)
                cr_assert(i == 1234 ? y[i] == 0.0f : fabsf(y[i] - 0x1p-12f) <= 1e-6f * 0x1p-12f,
                          "exp %s, mode %d: y[%zu] = %a", EXP_MODES[e], rounds[r], i, y[i]);
            static const size_t sizes[] = {300, 4097};
            for (size_t s = 0; s < 2; s++) {
                const size_t n = sizes[s];
                for (size_t i = 0; i < n; i++) x[i] = 3e38f;
                softmax_rounded(rounds[r], y, x, n, 2.0f); /* every z is FLT_MAX */
                for (size_t i = 0; i < n; i++)
                    cr_assert(fabsf(y[i] - 1.0f / (float)n) <= 1e-6f / (float)n,
                              "exp %s, mode %d, n=%zu: y[%zu] = %a", EXP_MODES[e], rounds[r], n, i,
                              y[i]);
            }
        }
    }
    sdpa_set_exp_mode("fast");
}

/* The softmax of one entry was 0x1.fffffep-1 for x = 100 or 123, scale 1, on avx512 (123 on
 * avx2 too) under round-to-nearest, and 1 + 2^-23 under FE_UPWARD: exp(z - shift) times the
 * float reciprocal of itself. A row of one finite entry is exactly 1. */
BACKEND_TEST(regressions, softmax_of_one_entry_is_one) {
    static const int rounds[] = {FE_TONEAREST, FE_UPWARD, FE_DOWNWARD, FE_TOWARDZERO};
    for (size_t e = 0; e < 2; e++) {
        cr_assert_eq(sdpa_set_exp_mode(EXP_MODES[e]), SDPA_OK);
        for (size_t r = 0; r < 4; r++) {
            for (int k = 0; k < 400; k++) {
                const float x = k == 0 ? 100.0f : k == 1 ? 123.0f : -20.0f + 0.1373f * (float)k;
                float y = 0.0f;
                softmax_rounded(rounds[r], &y, &x, 1, 1.0f);
                cr_assert(y == 1.0f, "exp %s, mode %d: softmax of %a is %a", EXP_MODES[e],
                          rounds[r], x, y);
            }
        }
    }
    sdpa_set_exp_mode("fast");
}

/* Under FE_UPWARD, a row with one dominant entry (x = {t - 20, t}) gave that entry the weight
 * 1 + 2^-23 on avx512 and avx2: its exp times the reciprocal of a sum just above it, both
 * rounded up. So did rows longer than a chunk on avx2 (the driver's factor). No weight is ever
 * above 1. */
BACKEND_TEST(regressions, softmax_no_weight_above_one_upward) {
    static float x[4097], y[4097];
    static const size_t sizes[] = {2, 3, 8, 17, 40, 300, 4097};
    for (size_t e = 0; e < 2; e++) {
        cr_assert_eq(sdpa_set_exp_mode(EXP_MODES[e]), SDPA_OK);
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            const size_t n = sizes[s];
            for (int k = 0; k < 200; k++) {
                const float t = -20.0f + 0.1373f * (float)k;
                for (size_t i = 0; i < n; i++) x[i] = t - 20.0f - (float)(i % 7);
                x[(size_t)k % n] = t;
                softmax_rounded(FE_UPWARD, y, x, n, 1.0f);
                for (size_t i = 0; i < n; i++)
                    cr_assert(y[i] <= 1.0f, "exp %s, n=%zu, t = %a: y[%zu] = %a", EXP_MODES[e], n,
                              t, i, y[i]);
            }
        }
    }
    sdpa_set_exp_mode("fast");
}
