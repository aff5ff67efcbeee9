/* Inputs the fuzzers (tests/fuzz/, scripts/fuzz) found to break the contract of sdpa.h, one
 * test each, named after what broke; every backend, both exp modes where softmax is involved.
 * What an outside probe of the header's promises found is in test_regressions_probe.c. */
#include <fenv.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "bounds.h"
#include "checks.h"
#include "common.h"
#include "reference.h"

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
        cr_assert(fabs(got - want) <= bound_dot(want), "dot of %a: rel error %.3g", values[v],
                  fabs(got - want) / want);
        float s[2];
        cr_assert_eq(sdpa_scores_f32(s, b, a, 1, N, N, 1.0f), SDPA_OK);
        cr_assert(fabs(s[0] - want) <= bound_dot(want), "scores of %a: rel error %.3g", values[v],
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

/* ---- Attention scores formed as scale * (q . k) on every path ----
 * The packed path (blocks of 8 or more query rows with d_k <= 128, and GQA decode, whose group's
 * heads become the rows of one block) multiplied q by the scale before the dot, where the other
 * paths scale the finished dot. For q = {3e38, 3e38}, k_0 = {1, -1} and scale 2, 2 * 3e38
 * overflowed and the row came out NaN in calls of 8 or more rows, (2, 3) in smaller ones; under
 * FTZ a scaled q below FLT_MIN was flushed. A row's result must not depend on the rows or heads
 * it is called with. */

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
/* MXCSR flush to zero (bit 15) and denormals are zero (bit 6), as tests/test_fpenv.c sets them;
 * returns the word to restore */
static uint64_t attn_ftz_daz_on(void) {
    const unsigned old = _mm_getcsr();
    _mm_setcsr(old | 0x8040u);
    return old;
}
static void attn_fpenv_restore(uint64_t old) { _mm_setcsr((unsigned)old); }
#elif defined(__aarch64__)
static uint64_t attn_ftz_daz_on(void) { /* FPCR.FZ (bit 24) */
    uint64_t old;
    __asm__ volatile("mrs %0, fpcr" : "=r"(old));
    __asm__ volatile("msr fpcr, %0" : : "r"(old | (1u << 24)));
    return old;
}
static void attn_fpenv_restore(uint64_t old) { __asm__ volatile("msr fpcr, %0" : : "r"(old)); }
#else
static uint64_t attn_ftz_daz_on(void) { return 0; }
static void attn_fpenv_restore(uint64_t old) { (void)old; }
#endif

/* The reproducer: both scores are 2 * (3e38 - 3e38) = 0, so every row is the mean of v,
 * (2, 3), in calls of any number of rows and in GQA decode with groups of any size. */
BACKEND_TEST(regressions, attention_scaled_query_overflow_is_not_nan) {
    enum { MAX_ROWS = 40, MAX_GROUP = 16 };
    const float k[4] = {1.0f, -1.0f, 0.0f, 0.0f}, v[4] = {1.0f, 2.0f, 3.0f, 4.0f};
    const float bound = (float)bound_attention(4.0); /* max|v| = 4 */
    float q[2 * MAX_ROWS], out[2 * MAX_ROWS];
    for (size_t i = 0; i < 2 * MAX_ROWS; i++) q[i] = 3e38f;
    for (size_t e = 0; e < 2; e++) {
        cr_assert_eq(sdpa_set_exp_mode(EXP_MODES[e]), SDPA_OK);
        for (size_t len_q = 1; len_q <= MAX_ROWS; len_q++) {
            cr_assert_eq(sdpa_attention_f32(out, q, k, v, len_q, 2, 2, 2, 2.0f, 0), SDPA_OK);
            for (size_t i = 0; i < len_q; i++)
                cr_assert(fabsf(out[2 * i] - 2.0f) <= bound &&
                              fabsf(out[2 * i + 1] - 3.0f) <= bound,
                          "exp %s len_q=%zu row %zu: (%g, %g), want (2, 3)", EXP_MODES[e], len_q, i,
                          out[2 * i], out[2 * i + 1]);
        }
        for (size_t heads_q = 1; heads_q <= MAX_GROUP; heads_q++) {
            sdpa_mha_desc desc;
            cr_assert_eq(sdpa_mha_desc_dense(&desc, 1, heads_q, 1, 1, 2, 2, 2, 2.0f, 0), SDPA_OK);
            cr_assert_eq(sdpa_mha_f32(&desc, out, q, k, v), SDPA_OK);
            for (size_t h = 0; h < heads_q; h++)
                cr_assert(fabsf(out[2 * h] - 2.0f) <= bound &&
                              fabsf(out[2 * h + 1] - 3.0f) <= bound,
                          "exp %s GQA heads_q=%zu head %zu: (%g, %g), want (2, 3)", EXP_MODES[e],
                          heads_q, h, out[2 * h], out[2 * h + 1]);
        }
    }
    sdpa_set_exp_mode("fast");
}

/* |got[c] - want[c]| <= bound for c < n, or the test fails naming what was compared */
static void attn_assert_close(const float *got, const double *want, size_t n, double bound,
                              const char *what, const char *context, size_t d_k, size_t size,
                              size_t row) {
    for (size_t c = 0; c < n; c++)
        cr_assert(fabs((double)got[c] - want[c]) <= bound,
                  "%s d_k=%zu: %s of %zu, row %zu [%zu]: got %.9g want %.9g (bound %.3g)", context,
                  d_k, what, size, row, c, got[c], want[c], bound);
}

/* Emulated (quick): only the counts at and beside multiples of 8, where blocks of 8, 16 and 32
 * rows begin and end, and the first few. */
static int near_block_edge(size_t n) { return n < 4 || (n + 1) % 8 <= 2; }

/* The same query row alone, in calls of 1..40 rows and as one head of a GQA group of 1..16 heads
 * (len_q = 1, one kv head), on unit-normal data: every result within the bound of sdpa.h of the
 * row computed alone and of the double reference, with and without FTZ/DAZ, d_k on both sides of
 * the packed path's limit of 128. Also with q and k scaled by powers of two that cancel in the
 * scores (q 2^-100, k 2^124, scale 2^-24 / sqrt(d_k)): there scale * q alone is below FLT_MIN.
 * Emulated, only the counts near_block_edge picks, and two d_k. */
BACKEND_TEST(regressions, attention_row_independent_of_call_shape) {
    enum { ROWS = 40, GROUP = 16, KEYS = 70, DV = 24, MAX_DK = 200 };
    /* emulated: the first two, one on each side of the packed path's limit */
    static const size_t d_ks[] = {37, 129, 8, 64, 128, 200};
    const size_t n_d_ks = test_quick() ? 2 : sizeof d_ks / sizeof d_ks[0];
    static const struct {
        const char *name;
        int q_exp, k_exp, scale_exp;
        float sign;
    } cases[] = {
        {"unit-normal", 0, 0, 0, 1.0f},
        {"negative scale", 0, 0, 0, -1.0f},
        {"scale * q below FLT_MIN", -100, 124, -24, 1.0f},
    };
    static float q[ROWS * MAX_DK], k[KEYS * MAX_DK], v[KEYS * DV], alone[ROWS * DV], out[ROWS * DV];
    static double want[ROWS * DV];
    rng r = rng_seed(2020);
    for (size_t i = 0; i < KEYS * DV; i++) v[i] = (float)rng_normal(&r);
    double max_v = 0.0;
    for (size_t i = 0; i < KEYS * DV; i++)
        if (fabs((double)v[i]) > max_v) max_v = fabs((double)v[i]);
    const double bound = bound_attention(max_v);
    for (size_t di = 0; di < n_d_ks; di++) {
        const size_t d = d_ks[di];
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            for (size_t i = 0; i < ROWS * d; i++)
                q[i] = (float)ldexp(rng_normal(&r), cases[ci].q_exp);
            for (size_t i = 0; i < KEYS * d; i++)
                k[i] = (float)ldexp(rng_normal(&r), cases[ci].k_exp);
            const float scale =
                cases[ci].sign * (float)ldexp(1.0 / sqrt((double)d), cases[ci].scale_exp);
            ref_attention(want, DV, q, d, k, d, v, DV, NULL, 0, ROWS, KEYS, d, DV, scale, 0);
            for (int ftz = 0; ftz < 2; ftz++) {
                for (size_t e = 0; e < 2; e++) {
                    char context[128];
                    snprintf(context, sizeof context, "%s, %s, exp %s", cases[ci].name,
                             ftz ? "FTZ+DAZ" : "default environment", EXP_MODES[e]);
                    cr_assert_eq(sdpa_set_exp_mode(EXP_MODES[e]), SDPA_OK);
                    const uint64_t env = ftz ? attn_ftz_daz_on() : 0;
                    for (size_t i = 0; i < ROWS; i++)
                        cr_assert_eq(sdpa_attention_f32(alone + i * DV, q + i * d, k, v, 1, KEYS, d,
                                                        DV, scale, 0),
                                     SDPA_OK);
                    for (size_t len_q = 1; len_q <= ROWS; len_q++) {
                        if (test_quick() && !near_block_edge(len_q)) continue;
                        cr_assert_eq(sdpa_attention_f32(out, q, k, v, len_q, KEYS, d, DV, scale, 0),
                                     SDPA_OK);
                        for (size_t i = 0; i < len_q; i++) {
                            double a[DV];
                            for (size_t c = 0; c < DV; c++) a[c] = alone[i * DV + c];
                            attn_assert_close(out + i * DV, a, DV, bound, "vs alone, call", context,
                                              d, len_q, i);
                            attn_assert_close(out + i * DV, want + i * DV, DV, bound,
                                              "vs reference, call", context, d, len_q, i);
                        }
                    }
                    for (size_t heads_q = 1; heads_q <= GROUP; heads_q++) {
                        if (test_quick() && !near_block_edge(heads_q)) continue;
                        sdpa_mha_desc desc;
                        cr_assert_eq(
                            sdpa_mha_desc_dense(&desc, 1, heads_q, 1, 1, KEYS, d, DV, scale, 0),
                            SDPA_OK);
                        cr_assert_eq(sdpa_mha_f32(&desc, out, q, k, v), SDPA_OK);
                        for (size_t h = 0; h < heads_q; h++) {
                            double a[DV];
                            for (size_t c = 0; c < DV; c++) a[c] = alone[h * DV + c];
                            attn_assert_close(out + h * DV, a, DV, bound, "vs alone, GQA group",
                                              context, d, heads_q, h);
                            attn_assert_close(out + h * DV, want + h * DV, DV, bound,
                                              "vs reference, GQA group", context, d, heads_q, h);
                        }
                    }
                    if (ftz) attn_fpenv_restore(env);
                    for (size_t i = 0; i < ROWS; i++)
                        attn_assert_close(alone + i * DV, want + i * DV, DV, bound,
                                          "alone vs reference, row", context, d, 1, i);
                }
            }
        }
    }
    sdpa_set_exp_mode("fast");
}

/* Finite q (or k) with entries of 1e38..3e38 in size against k (or q) small enough that no sum
 * of products, in any order, leaves the float range: every true score scale * (q . k) is
 * finite (|q . k| <= 1.6e38, |scale| <= 2), so no row may be NaN, in calls of 1, 8 and 33 rows
 * and in GQA decode, for scales 0.5, 2, -2 and 1/sqrt(d_k). The scores are far apart, so each
 * output must be finite and within the range of v. */
BACKEND_TEST(regressions, attention_huge_finite_inputs_are_not_nan) {
    enum { ROWS = 33, KEYS = 70, DV = 3, MAX_DK = 200 };
    static const size_t d_ks[] = {2, 5, 16, 64, 128, 200};
    static const size_t lens[] = {1, 8, 33};
    static float q[ROWS * MAX_DK], k[KEYS * MAX_DK], out[ROWS * DV];
    float v[KEYS * DV], lo[DV], hi[DV];
    const double total = 1.6e38; /* bound on sum_p |q_p k_p| for every row and key */
    rng r = rng_seed(338);
    for (size_t i = 0; i < KEYS * DV; i++) v[i] = (float)rng_uniform(&r, -4.0, 4.0);
    for (size_t c = 0; c < DV; c++) {
        lo[c] = hi[c] = v[c];
        for (size_t j = 1; j < KEYS; j++) {
            lo[c] = fminf(lo[c], v[j * DV + c]);
            hi[c] = fmaxf(hi[c], v[j * DV + c]);
        }
    }
    for (size_t di = 0; di < sizeof d_ks / sizeof d_ks[0]; di++) {
        const size_t d = d_ks[di];
        const float scales[] = {0.5f, 2.0f, -2.0f, (float)(1.0 / sqrt((double)d))};
        for (int huge_k = 0; huge_k < 2; huge_k++) {
            /* the huge side: +-[1e38, 3e38]; the other: at most total / (3e38 d) in size */
            float *big = huge_k ? k : q, *small = huge_k ? q : k;
            const size_t n_big = (huge_k ? KEYS : ROWS) * d, n_small = (huge_k ? ROWS : KEYS) * d;
            for (size_t i = 0; i < n_big; i++)
                big[i] =
                    (float)(rng_uniform(&r, 1e38, 3e38) * (rng_uniform(&r, 0, 1) < 0.5 ? -1 : 1));
            for (size_t i = 0; i < n_small; i++)
                small[i] = (float)(rng_uniform(&r, -1.0, 1.0) * total / (3e38 * (double)d));
            for (size_t s = 0; s < sizeof scales / sizeof scales[0]; s++) {
                for (size_t i = 0; i < ROWS; i++)
                    for (size_t j = 0; j < KEYS; j++)
                        cr_assert(fabs(scales[s] * ref_dot(q + i * d, k + j * d, d)) < FLT_MAX,
                                  "the test's own inputs: a true score is not finite");
                for (size_t e = 0; e < 2; e++) {
                    cr_assert_eq(sdpa_set_exp_mode(EXP_MODES[e]), SDPA_OK);
                    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
                        for (int gqa = 0; gqa < 2; gqa++) {
                            const size_t n = lens[li];
                            if (gqa) {
                                sdpa_mha_desc desc;
                                cr_assert_eq(sdpa_mha_desc_dense(&desc, 1, n, 1, 1, KEYS, d, DV,
                                                                 scales[s], 0),
                                             SDPA_OK);
                                cr_assert_eq(sdpa_mha_f32(&desc, out, q, k, v), SDPA_OK);
                            } else {
                                cr_assert_eq(
                                    sdpa_attention_f32(out, q, k, v, n, KEYS, d, DV, scales[s], 0),
                                    SDPA_OK);
                            }
                            for (size_t i = 0; i < n; i++)
                                for (size_t c = 0; c < DV; c++)
                                    cr_assert(out[i * DV + c] >= lo[c] - 1e-5f * 4.0f &&
                                                  out[i * DV + c] <= hi[c] + 1e-5f * 4.0f,
                                              "exp %s d_k=%zu huge %s scale %g %s of %zu, row "
                                              "%zu [%zu]: %g, want a finite value in [%g, %g]",
                                              EXP_MODES[e], d, huge_k ? "k" : "q", scales[s],
                                              gqa ? "GQA group" : "call", n, i, c, out[i * DV + c],
                                              lo[c], hi[c]);
                        }
                    }
                }
            }
        }
    }
    sdpa_set_exp_mode("fast");
}

/* ---- Softmax under directed rounding, and rows of one entry (found probing the ABI from the
 * header alone) ---- */

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

/* ---- Keys far below the row's max weigh exactly nothing ----
 * The fast exp of avx512, avx2 and sse clamped its argument at -87.5 and, on every attention path
 * (and in the backward), left the clamped value's exp, about 8e-39, as the weight of a key whose
 * score was -inf or far below the row's max: with v = 1e38 that key added 0.81 to the output, and
 * 1,099 keys masked with -1e30 added 889. exp(-1e30) is 0 in any precision, so each of these keys
 * must add exactly 0, on every path and backend, in both exp modes. Key 0 scores `top` (the
 * row's max, which the fast exp folds into its constants) with v = 0, the others score `far`
 * (through k with q = 1, or through a mask shared by the rows) with a large v: every output is
 * exactly 0. */
typedef struct far_keys {
    size_t heads, len_q, len_kv;
    sdpa_dtype kv_type;
    int masked;
} far_keys;

static void far_keys_add_nothing(const far_keys *c, float top, float far) {
    const size_t n_kv = c->heads * c->len_kv, n_q = c->heads * c->len_q;
    const size_t size = c->kv_type == SDPA_F32 ? 4 : 2;
    /* the largest v of the type: f16 holds no 1e38 */
    const float big = c->kv_type == SDPA_F16 ? 65504.0f : 1e38f;
    float *q = malloc(n_q * 4), *k = malloc(n_kv * 4), *v = malloc(n_kv * 4),
          *out = malloc(n_q * 4);
    float *mask = malloc(c->len_kv * 4);
    void *kt = malloc(n_kv * size), *vt = malloc(n_kv * size);
    for (size_t i = 0; i < n_q; i++) q[i] = 1.0f;
    for (size_t j = 0; j < n_kv; j++) {
        const int first = j % c->len_kv == 0;
        k[j] = first ? top : c->masked ? 0.0f : far;
        v[j] = first ? 0.0f : big;
    }
    for (size_t j = 0; j < c->len_kv; j++) mask[j] = j == 0 ? 0.0f : far;
    cr_assert_eq(sdpa_convert(kt, c->kv_type, k, SDPA_F32, n_kv), SDPA_OK);
    cr_assert_eq(sdpa_convert(vt, c->kv_type, v, SDPA_F32, n_kv), SDPA_OK);
    sdpa_mha_desc desc;
    cr_assert_eq(
        sdpa_mha_desc_dense(&desc, 1, c->heads, c->heads, c->len_q, c->len_kv, 1, 1, 1.0f, 0),
        SDPA_OK);
    desc.kv_type = c->kv_type;
    if (c->masked) cr_assert_eq(sdpa_mha_desc_set_mask(&desc, mask, 0, 0, 0), SDPA_OK);
    cr_assert_eq(sdpa_mha(&desc, out, q, kt, vt), SDPA_OK);
    for (size_t i = 0; i < n_q; i++)
        cr_assert(out[i] == 0.0f,
                  "%s, exp %s, %zu x %zu keys, max %g, %s, %s %g: out[%zu] = %g, want 0",
                  sdpa_backend(), sdpa_exp_mode(), c->len_q, c->len_kv, top,
                  c->kv_type == SDPA_F32   ? "f32"
                  : c->kv_type == SDPA_F16 ? "f16"
                                           : "bf16",
                  c->masked ? "mask" : "score", far, i, out[i]);
    free(q), free(k), free(v), free(out), free(mask), free(kt), free(vt);
}

BACKEND_TEST(regressions, attention_far_keys_add_exactly_nothing) {
    /* the reproducer: one -inf score beside a score of 0 */
    const float q1[1] = {1.0f}, k1[2] = {0.0f, -INFINITY}, v1[2] = {0.0f, 1e38f};
    static const far_keys CALLS[] = {
        {1, 16, 300, SDPA_F32, 0},  /* the packed path: 8 or more rows, no mask */
        {1, 3, 300, SDPA_F32, 0},   /* few rows: scores row by row */
        {1, 17, 1100, SDPA_F32, 1}, /* masked */
        {1, 2, 70, SDPA_F32, 1},    {4, 1, 200, SDPA_F32, 0}, /* decode */
        {1, 16, 300, SDPA_F16, 0},                            /* 16-bit K and V */
        {1, 2, 300, SDPA_BF16, 1},  {2, 16, 150, SDPA_BF16, 0},
    };
    static const float FAR[] = {-INFINITY, -1e30f, -FLT_MAX};
    static const float TOPS[] = {0.0f, 3.25f, -1234.5f, 60000.0f, 1e6f};
    for (size_t e = 0; e < 2; e++) {
        cr_assert_eq(sdpa_set_exp_mode(EXP_MODES[e]), SDPA_OK);
        float out[1];
        cr_assert_eq(sdpa_attention_f32(out, q1, k1, v1, 1, 2, 1, 1, 1.0f, 0), SDPA_OK);
        cr_assert(out[0] == 0.0f, "exp %s: %g, want 0", EXP_MODES[e], out[0]);
        for (size_t i = 0; i < sizeof CALLS / sizeof CALLS[0]; i++)
            for (size_t f = 0; f < sizeof FAR / sizeof FAR[0]; f++) {
                /* f16 holds no -1e30: its k would be -inf, already covered */
                if (CALLS[i].kv_type == SDPA_F16 && !CALLS[i].masked && isfinite(FAR[f])) continue;
                /* nor 1e6 */
                for (size_t t = 0; t < sizeof TOPS / sizeof TOPS[0]; t++)
                    if (CALLS[i].kv_type != SDPA_F16 || TOPS[t] < 65504.0f)
                        far_keys_add_nothing(&CALLS[i], TOPS[t], FAR[f]);
            }
        /* split-KV (one query over many keys, in pieces, each with its own max) */
        const far_keys split[] = {
            {1, 1, 1100, SDPA_F32, 1}, {1, 1, 4099, SDPA_F32, 0}, {1, 1, 2000, SDPA_BF16, 0}};
        for (size_t i = 0; i < sizeof split / sizeof split[0]; i++)
            for (size_t f = 0; f < sizeof FAR / sizeof FAR[0]; f++)
                far_keys_add_nothing(&split[i], 3.25f, FAR[f]);
    }
    sdpa_set_exp_mode("fast");
}

/* The backward: a key that every row masks (-inf, or -1e30) has weight exactly 0 in every row,
 * so its dv and dk are exactly 0; the fast exp gave it dv = 7.3e-8. */
BACKEND_TEST(regressions, backward_far_keys_get_zero_gradients) {
    enum { LQ = 40, LK = 300, D = 16 };
    static float q[LQ * D], k[LK * D], v[LK * D], out[LQ * D], dout[LQ * D], lse[LQ];
    static float dq[LQ * D], dk[LK * D], dv[LK * D], mask[LQ * LK];
    rng r = rng_seed(34);
    fill_normal(&r, q, LQ * D);
    fill_normal(&r, k, LK * D);
    fill_normal(&r, v, LK * D);
    fill_normal(&r, dout, LQ * D);
    static const float FAR[] = {-INFINITY, -1e30f, -FLT_MAX};
    for (size_t e = 0; e < 2; e++) {
        cr_assert_eq(sdpa_set_exp_mode(EXP_MODES[e]), SDPA_OK);
        for (size_t f = 0; f < sizeof FAR / sizeof FAR[0]; f++) {
            /* every third key masked in every row, the others with small random masks */
            for (size_t i = 0; i < LQ; i++)
                for (size_t j = 0; j < LK; j++)
                    mask[i * LK + j] = j % 3 == 1 ? FAR[f] : (float)rng_uniform(&r, -1, 1);
            sdpa_mha_desc d;
            cr_assert_eq(sdpa_mha_desc_dense(&d, 1, 1, 1, LQ, LK, D, D, 0.0f, 0), SDPA_OK);
            cr_assert_eq(sdpa_mha_desc_set_mask(&d, mask, 0, 0, LK), SDPA_OK);
            d.lse = lse;
            d.lse_stride[0] = d.lse_stride[1] = LQ;
            cr_assert_eq(sdpa_mha_f32(&d, out, q, k, v), SDPA_OK);
            sdpa_mha_grads g = {sizeof g,  0,         dq,   dk,        dv,  {0, 0, D},
                                {0, 0, D}, {0, 0, D}, dout, {0, 0, D}, NULL};
            cr_assert_eq(sdpa_mha_backward_f32(&d, &g, q, k, v, out), SDPA_OK);
            for (size_t j = 1; j < LK; j += 3)
                for (size_t c = 0; c < D; c++)
                    cr_assert(dv[j * D + c] == 0.0f && dk[j * D + c] == 0.0f,
                              "%s, exp %s, mask %g: key %zu: dv %g, dk %g, want 0", sdpa_backend(),
                              EXP_MODES[e], FAR[f], j, dv[j * D + c], dk[j * D + c]);
        }
    }
    sdpa_set_exp_mode("fast");
}

/* dsinks of a head whose sink is -inf (no sink) is 0: rows that see no key have lse -inf, and
 * e^(sink - lse) was e^NaN there (found by fuzz_mods). The other head's dsink stays finite. */
BACKEND_TEST(regressions, minus_inf_sink_gets_zero_gradient) {
    enum { H = 2, LQ = 8, LK = 3, D = 4 };
    static float q[H * LQ * D], k[LK * D], v[LK * D], out[H * LQ * D], dout[H * LQ * D];
    static float lse[H * LQ], dq[H * LQ * D], dk[LK * D], dv[LK * D];
    rng r = rng_seed(35);
    fill_normal(&r, q, H * LQ * D);
    fill_normal(&r, k, LK * D);
    fill_normal(&r, v, LK * D);
    fill_normal(&r, dout, H * LQ * D);
    const float sinks[H] = {-INFINITY, 0.5f};
    sdpa_score_mods m = {.struct_size = sizeof m, .window_left = -1, .window_right = -1};
    m.sinks = sinks;
    sdpa_mha_desc d; /* causal with more rows than keys: rows 0 to 4 see no key */
    cr_assert_eq(sdpa_mha_desc_dense(&d, 1, H, 1, LQ, LK, D, D, 0.0f, SDPA_CAUSAL), SDPA_OK);
    cr_assert_eq(sdpa_mha_desc_set_mods(&d, &m), SDPA_OK);
    d.lse = lse;
    d.lse_stride[0] = H * LQ, d.lse_stride[1] = LQ;
    cr_assert_eq(sdpa_mha_f32(&d, out, q, k, v), SDPA_OK);
    float dsinks[H] = {1.0f, 1.0f};
    sdpa_mha_grads g = {sizeof g,       0,         dq,        dk,   dv,
                        {0, LQ * D, D}, {0, 0, D}, {0, 0, D}, dout, {0, LQ * D, D},
                        dsinks};
    cr_assert_eq(sdpa_mha_backward_f32(&d, &g, q, k, v, out), SDPA_OK);
    cr_assert(dsinks[0] == 0.0f, "%s: dsink of a -inf sink is %g, want 0", sdpa_backend(),
              dsinks[0]);
    cr_assert(isfinite(dsinks[1]) && dsinks[1] != 0.0f, "%s: dsink of 0.5 is %g", sdpa_backend(),
              dsinks[1]);
}
