/* Internal: the constants of the inlined "fast" exps every backend shares (fitted by
 * scripts/fit_exp.py), and the fold of a row's shift into them. */
#ifndef SDPA_ARCH_EXP_CONSTANTS_H
#define SDPA_ARCH_EXP_CONSTANTS_H

/* The "fast" exp of the scalar, sse and neon backends: e^x = 2^n * p(r), n = round(x / ln 2),
 * r = x - n ln 2 in two steps (Cody-Waite), p a degree-5 polynomial fitted for minimal relative
 * error on [-ln2/2, ln2/2] (scripts/fit_exp.py 0 5; max relative error 1.06e-7 before rounding).
 * 2^n is added to p's exponent bits, which is exact for n in [-125, 128]; x is first clamped to
 * [EXP_X_CLAMP_LO, EXP_X_CLAMP_HI] so n stays in [-126, 128], then results below FLT_MIN become 0
 * and x >= EXP_X_OVERFLOW gives +inf. */
#define SDPA_EXP_LOG2E  0x1.715476p+0f
#define SDPA_EXP_LN2_HI 0x1.62e43p-1f
#define SDPA_EXP_LN2_LO -0x1.05c61p-29f
/* Without FMA: a 15-bit high part, so that n * LN2_HI_NOFMA is exact for |n| <= 256. */
#define SDPA_EXP_LN2_HI_NOFMA 0x1.62e4p-1f
#define SDPA_EXP_LN2_LO_NOFMA 0x1.7f7d1cp-20f
#define SDPA_EXP_C2           0x1.fffdfcp-2f
#define SDPA_EXP_C3           0x1.5557aep-3f
#define SDPA_EXP_C4           0x1.5729fp-5f
#define SDPA_EXP_C5           0x1.106284p-7f
#define SDPA_EXP_X_CLAMP_LO   -87.5f
#define SDPA_EXP_X_CLAMP_HI   88.8f
#define SDPA_EXP_X_OVERFLOW   0x1.62e43p+6f /* float(ln FLT_MAX), whose exp exceeds FLT_MAX */

/* The "fast" exp of the avx512 (K = 16) and avx2 (K = 8) backends, where one permute looks up a
 * table held in a register: e^x = 2^(N/K) e^r with N = round(x K / ln 2) and
 * |r| = |x - N ln2 / K| <= ln2 / 2K, so that a cubic e^r ~ 1 + r + C2 r^2 + C3 r^3 suffices
 * (scripts/fit_exp.py 4 3 and 3 3: max relative error 1.6e-9 for K = 16, 2.6e-8 for K = 8).
 * The result is T p(r) with T = 2^(j/K) 2^(N div K), j = N mod K: seven operations on the FMA
 * pipes where the degree-5 form takes nine, and an input NaN reaches the result through r,
 * whatever the integer arithmetic did to T (p stays near 1, so nothing underflows before the
 * last multiply, which matters when the caller has FTZ set). N comes from an
 * explicit round-to-nearest, never the caller's MXCSR mode. 2^(N div K) is added to T's exponent
 * bits, exact while N div K >= -126 (x >= -87.33); below, down to EXP_X_CLAMP_LO, T turns into a
 * number below 2^-126 and so does the result: the callers' flush makes it 0, as it must. */
#define SDPA_EXP16_SCALE  0x1.715476p+4f  /* 16 / ln2 */
#define SDPA_EXP16_LN2_HI 0x1.62e43p-5f   /* ln2 / 16, rounded */
#define SDPA_EXP16_LN2_LO -0x1.05c61p-33f /* what the rounding left out */
#define SDPA_EXP16_C2     0x1.00021ep-1f
#define SDPA_EXP16_C3     0x1.55559ap-3f
/* 2^(j/16), j = 0..15, rounded to float */
#define SDPA_EXP2_SIXTEENTHS                                                                       \
    0x1p+0f, 0x1.0b5586p+0f, 0x1.172b84p+0f, 0x1.2387a6p+0f, 0x1.306fep+0f, 0x1.3dea64p+0f,        \
        0x1.4bfdaep+0f, 0x1.5ab07ep+0f, 0x1.6a09e6p+0f, 0x1.7a1148p+0f, 0x1.8ace54p+0f,            \
        0x1.9c4918p+0f, 0x1.ae89fap+0f, 0x1.c199bep+0f, 0x1.d5818ep+0f, 0x1.ea4afap+0f
/* A row's shift (exp_sum, softmax_short on avx512 and avx2): exp(z - shift) = e^d exp(z - M'),
 * with M' = Mi ln2 / K for the integer Mi = round(shift K / ln2), |d| = |M' - shift| <= ln2 / K.
 * round((z - M') K / ln2) = round(z K / ln2) - Mi comes from one FMA against the magic number
 * 1.5 * 2^23 - Mi, r = z - round(z K / ln2) ln2 / K from z in the usual two steps, and e^d
 * scales the polynomial's coefficients: no subtraction z - shift per element. Mi stays far
 * inside the magic number's integer range while |shift| <= SDPA_EXP_FOLD_MAX. */
#define SDPA_EXP_FOLD_MAX 0x1p16f
/* the ln2 / K that r's two steps subtract, exact in double */
#define SDPA_EXP16_LN2 ((double)SDPA_EXP16_LN2_HI + (double)SDPA_EXP16_LN2_LO)
#define SDPA_EXP8_LN2  ((double)SDPA_EXP8_LN2_HI + (double)SDPA_EXP8_LN2_LO)
/* e^d for |d| <= 0.05: Taylor to d^6 / 720, error below 2e-13 */
static inline double sdpa_exp_small(double d) {
    return 1.0 + d * (1.0 + d * (0.5 + d * (1.0 / 6 + d * (1.0 / 24 + d * (1.0 / 120 + d / 720)))));
}
/* avx512 softmax_short's exp, where the weights only matter up to a common factor: K = 32, so
 * |r| <= ln2 / 64 and a quadratic 1 + C1 r + C2 r^2 suffices (scripts/fit_exp.py --free-c1 5 2:
 * max relative error 5.4e-8 before rounding); the 32-entry table takes a two-register permute.
 * One FMA fewer than the K = 16 cubic. */
#define SDPA_EXP32_SCALE  0x1.715476p+5f  /* 32 / ln2 */
#define SDPA_EXP32_LN2_HI 0x1.62e43p-6f   /* ln2 / 32, rounded */
#define SDPA_EXP32_LN2_LO -0x1.05c61p-34f /* what the rounding left out */
#define SDPA_EXP32_C1     0x1.0000f8p+0f
#define SDPA_EXP32_C2     0x1.000174p-1f
/* 2^(j/32), j = 0..31, rounded to float */
#define SDPA_EXP2_THIRTYSECONDS                                                                    \
    0x1p+0f, 0x1.059b0ep+0f, 0x1.0b5586p+0f, 0x1.11301ep+0f, 0x1.172b84p+0f, 0x1.1d4874p+0f,       \
        0x1.2387a6p+0f, 0x1.29e9ep+0f, 0x1.306fep+0f, 0x1.371a74p+0f, 0x1.3dea64p+0f,              \
        0x1.44e086p+0f, 0x1.4bfdaep+0f, 0x1.5342b6p+0f, 0x1.5ab07ep+0f, 0x1.6247ecp+0f,            \
        0x1.6a09e6p+0f, 0x1.71f75ep+0f, 0x1.7a1148p+0f, 0x1.82589ap+0f, 0x1.8ace54p+0f,            \
        0x1.93737cp+0f, 0x1.9c4918p+0f, 0x1.a5503cp+0f, 0x1.ae89fap+0f, 0x1.b7f77p+0f,             \
        0x1.c199bep+0f, 0x1.cb720ep+0f, 0x1.d5818ep+0f, 0x1.dfc974p+0f, 0x1.ea4afap+0f,            \
        0x1.f50766p+0f
#define SDPA_EXP8_SCALE  0x1.715476p+3f  /* 8 / ln2 */
#define SDPA_EXP8_LN2_HI 0x1.62e43p-4f   /* ln2 / 8, rounded */
#define SDPA_EXP8_LN2_LO -0x1.05c61p-32f /* what the rounding left out */
#define SDPA_EXP8_C2     0x1.000874p-1f
#define SDPA_EXP8_C3     0x1.555656p-3f
/* 2^(j/8), j = 0..7, rounded to float */
#define SDPA_EXP2_EIGHTHS                                                                          \
    0x1p+0f, 0x1.172b84p+0f, 0x1.306fep+0f, 0x1.4bfdaep+0f, 0x1.6a09e6p+0f, 0x1.8ace54p+0f,        \
        0x1.ae89fap+0f, 0x1.d5818ep+0f

#endif
