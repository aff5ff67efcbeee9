/* sdpa_convert on every backend: every f16 and bf16 bit pattern to float and back, and float to
 * the 16-bit types over a dense sample that holds every rounding boundary (each value, each
 * midpoint between neighbours and the floats on either side of it), against a reference that
 * decodes the formats' fields in double and rounds by searching the sorted values; the same
 * under every rounding mode; and the argument errors. */
#include <fenv.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "reference.h"

/* ---- the reference: the formats from their definitions ---- */

/* the formats' values: reference.c's ref_f16 and ref_bf16 */
static double f16_value(uint16_t h) { return ref_f16(h); }
static double bf16_value(uint16_t h) { return ref_bf16(h); }

static float float_of(uint32_t bits) {
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* The environment sdpa_convert runs in: the tests build their samples and references in the
 * default one (with DAZ, even printf would read a subnormal as 0) and set this around the call */
typedef struct environment {
    const char *name;
    int round, ftz_daz;
} environment;
static const environment DEFAULT_ENV = {"nearest", FE_TONEAREST, 0};

static sdpa_status convert_in(const environment *env, void *dst, sdpa_dtype dst_type,
                              const void *src, sdpa_dtype src_type, size_t n) {
    fesetround(env->round);
    set_ftz_daz(env->ftz_daz);
    sdpa_status st = sdpa_convert(dst, dst_type, src, src_type, n);
    set_ftz_daz(0);
    fesetround(FE_TONEAREST);
    return st;
}

/* The positive finite values of a type in increasing order (their patterns are increasing too),
 * and the largest: the nearest of them to x rounds x, ties to the even pattern; past the largest
 * by half its spacing or more is inf. */
typedef struct format {
    double (*value)(uint16_t);
    uint16_t max; /* the pattern of the largest finite value */
} format;
static const format F16 = {f16_value, 0x7bff}, BF16 = {bf16_value, 0x7f7f};

static uint16_t round_ref(const format *f, float x) {
    if (isnan(x)) return 0; /* checked apart */
    const uint16_t sign = signbit(x) ? 0x8000 : 0;
    const double a = fabs((double)x);
    const double top = f->value(f->max), spacing = top - f->value((uint16_t)(f->max - 1));
    if (a >= top + spacing / 2) return sign | (uint16_t)(f->max + 1); /* inf */
    uint16_t lo = 0, hi = f->max; /* the largest pattern whose value is <= a */
    while (lo < hi) {
        uint16_t mid = (uint16_t)((lo + hi + 1) / 2);
        if (f->value(mid) <= a)
            lo = mid;
        else
            hi = (uint16_t)(mid - 1);
    }
    if (lo == f->max) return sign | lo;
    const double below = a - f->value(lo), above = f->value((uint16_t)(lo + 1)) - a;
    if (below < above || (below == above && !(lo & 1))) return sign | lo;
    return sign | (uint16_t)(lo + 1);
}

/* ---- widening: every pattern ---- */

static void check_widen_all(sdpa_dtype type, const environment *env) {
    static uint16_t in[65536];
    static float out[65536];
    for (uint32_t i = 0; i < 65536; i++) in[i] = (uint16_t)i;
    cr_assert_eq(convert_in(env, out, SDPA_F32, in, type, 65536), SDPA_OK);
    for (uint32_t i = 0; i < 65536; i++) {
        const double want = type == SDPA_F16 ? f16_value((uint16_t)i) : bf16_value((uint16_t)i);
        if (isnan(want)) {
            cr_assert(isnan(out[i]) && (bits_of(out[i]) & 0x00400000u),
                      "%s, type %d pattern 0x%04x: want a quiet NaN, got 0x%08x", env->name, type,
                      i, bits_of(out[i]));
            cr_assert_eq(!!signbit(out[i]), !!(i & 0x8000), "pattern 0x%04x: NaN's sign", i);
        } else {
            cr_assert(out[i] == want && !!signbit(out[i]) == !!signbit(want),
                      "%s, type %d pattern 0x%04x: got %a want %a", env->name, type, i, out[i],
                      want);
        }
    }
    /* and back: every value comes back to its pattern, a NaN to a quiet NaN */
    static uint16_t back[65536];
    cr_assert_eq(convert_in(env, back, type, out, SDPA_F32, 65536), SDPA_OK);
    const uint16_t quiet = type == SDPA_F16 ? 0x0200 : 0x0040;
    for (uint32_t i = 0; i < 65536; i++) {
        if (isnan(out[i]))
            cr_assert_eq(back[i], (uint16_t)(i | quiet), "type %d NaN 0x%04x came back 0x%04x",
                         type, i, back[i]);
        else
            cr_assert_eq(back[i], (uint16_t)i, "type %d 0x%04x came back 0x%04x", type, i, back[i]);
    }
}

BACKEND_TEST(convert, every_f16_to_float_and_back) { check_widen_all(SDPA_F16, &DEFAULT_ENV); }
BACKEND_TEST(convert, every_bf16_to_float_and_back) { check_widen_all(SDPA_BF16, &DEFAULT_ENV); }

/* ---- narrowing: every boundary ---- */

/* Each value of the format, the midpoints between neighbours, a float on either side of each,
 * the far ends (f32 subnormals, past the largest, inf, NaN); `stride` thins the patterns in the
 * emulated runs. */
static size_t boundary_sample(const format *f, float *x, size_t stride) {
    size_t n = 0;
    for (uint32_t h = 0; h <= f->max; h += (uint32_t)stride) {
        const float v = (float)f->value((uint16_t)h);
        const float mid = (float)((f->value((uint16_t)h) + f->value((uint16_t)(h + 1))) / 2);
        const float points[] = {v, nextafterf(v, INFINITY), mid, nextafterf(mid, 0.0f),
                                nextafterf(mid, INFINITY)};
        for (size_t i = 0; i < sizeof points / sizeof points[0]; i++) {
            x[n++] = points[i];
            x[n++] = -points[i];
        }
    }
    const float ends[] = {float_of(1), float_of(0x007fffff),
                          FLT_MIN,     65504.0f,
                          65519.996f,  65520.0f,
                          65536.0f,    1e30f,
                          FLT_MAX,     INFINITY,
                          -INFINITY,   NAN,
                          -NAN,        float_of(0x7f800001u)};
    for (size_t i = 0; i < sizeof ends / sizeof ends[0]; i++) x[n++] = ends[i];
    return n;
}

static void check_narrow(sdpa_dtype type, const environment *env) {
    const char *mode = env->name;
    const format *f = type == SDPA_F16 ? &F16 : &BF16;
    const size_t stride = test_quick() ? 7 : 1;
    float *x = malloc((10u * 65536 + 32) * sizeof *x);
    const size_t n = boundary_sample(f, x, stride);
    uint16_t *got = malloc(n * sizeof *got);
    cr_assert_eq(convert_in(env, got, type, x, SDPA_F32, n), SDPA_OK);
    const uint16_t quiet = type == SDPA_F16 ? 0x7e00 : 0x7fc0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(x[i])) {
            cr_assert_eq(got[i] & 0x7fff & quiet, quiet, "%s: NaN %a gave 0x%04x", mode, x[i],
                         got[i]);
            cr_assert_eq(!!(got[i] & 0x8000), !!signbit(x[i]), "%s: NaN's sign", mode);
            continue;
        }
        const uint16_t want = round_ref(f, x[i]);
        cr_assert_eq(got[i], want, "%s, type %d: %a gave 0x%04x, want 0x%04x", mode, type, x[i],
                     got[i], want);
    }
    free(got);
    free(x);
}

BACKEND_TEST(convert, float_to_f16_at_every_boundary) { check_narrow(SDPA_F16, &DEFAULT_ENV); }
BACKEND_TEST(convert, float_to_bf16_at_every_boundary) { check_narrow(SDPA_BF16, &DEFAULT_ENV); }

/* the caller's rounding mode, flush-to-zero and denormals-are-zero change nothing */
BACKEND_TEST(convert, conversions_ignore_the_floating_point_environment) {
    static const environment ENVS[] = {{"upward", FE_UPWARD, 0},
                                       {"downward", FE_DOWNWARD, 0},
                                       {"toward zero", FE_TOWARDZERO, 0},
                                       {"FTZ+DAZ", FE_TONEAREST, 1},
                                       {"FTZ+DAZ, downward", FE_DOWNWARD, 1}};
    for (size_t e = 0; e < sizeof ENVS / sizeof ENVS[0]; e++) {
        check_narrow(SDPA_F16, &ENVS[e]);
        check_narrow(SDPA_BF16, &ENVS[e]);
        check_widen_all(SDPA_F16, &ENVS[e]);
        check_widen_all(SDPA_BF16, &ENVS[e]);
    }
}

/* f16 and bf16 to each other: through float, rounded once; unaligned and odd lengths for the
 * tails, in place where the sizes allow */
BACKEND_TEST(convert, between_the_16_bit_types) {
    static uint16_t in[65536 + 3], out[65536 + 3], again[65536 + 3];
    for (uint32_t i = 0; i < 65536; i++) in[i + 1] = (uint16_t)i;
    for (size_t n = 65533; n <= 65535; n++) {
        cr_assert_eq(sdpa_convert(out + 2, SDPA_BF16, in + 1, SDPA_F16, n), SDPA_OK);
        for (size_t i = 0; i < n; i++) {
            const double v = f16_value(in[i + 1]);
            if (isnan(v))
                cr_assert(isnan(bf16_value(out[i + 2])), "f16 NaN 0x%04x", in[i + 1]);
            else
                cr_assert_eq(out[i + 2], round_ref(&BF16, (float)v), "f16 0x%04x to bf16 0x%04x",
                             in[i + 1], out[i + 2]);
        }
        memcpy(again, in, sizeof in);
        cr_assert_eq(sdpa_convert(again + 1, SDPA_F16, again + 1, SDPA_BF16, n), SDPA_OK);
        for (size_t i = 0; i < n; i++) {
            const double v = bf16_value(in[i + 1]);
            if (isnan(v))
                cr_assert(isnan(f16_value(again[i + 1])), "bf16 NaN 0x%04x", in[i + 1]);
            else
                cr_assert_eq(again[i + 1], round_ref(&F16, (float)v), "bf16 0x%04x in place",
                             in[i + 1]);
        }
    }
}

/* every length 0..70 and several offsets: the vector loops and their scalar tails, with the
 * arrays ending at a guard page */
BACKEND_TEST(convert, tails_stay_inside_their_arrays) {
    for (size_t n = 1; n <= 70; n++) {
        guarded src = guard_alloc(n, GUARD_AFTER), dst = guard_alloc(n, GUARD_AFTER);
        for (size_t i = 0; i < n; i++) src.p[i] = (float)i - 30.5f;
        /* 16-bit arrays that end where the page ends: the last n halves of the float array */
        uint16_t *h = (uint16_t *)(dst.p + n) - n;
        for (int t = SDPA_F16; t <= SDPA_BF16; t++) {
            cr_assert_eq(sdpa_convert(h, (sdpa_dtype)t, src.p, SDPA_F32, n), SDPA_OK);
            cr_assert_eq(sdpa_convert(src.p, SDPA_F32, h, (sdpa_dtype)t, n), SDPA_OK);
            for (size_t i = 0; i < n; i++)
                cr_assert_eq(src.p[i], (float)i - 30.5f, "type %d n %zu i %zu", t, n, i);
        }
        guard_free(&src);
        guard_free(&dst);
    }
}

Test(convert, errors) {
    uint16_t h[8] = {0};
    float f[8] = {0};
    cr_assert_eq(sdpa_convert(NULL, SDPA_F16, f, SDPA_F32, 1), SDPA_ERR_NULL);
    cr_assert_eq(sdpa_convert(h, SDPA_F16, NULL, SDPA_F32, 1), SDPA_ERR_NULL);
    cr_assert_eq(sdpa_convert(NULL, SDPA_F16, NULL, SDPA_F32, 0), SDPA_OK);
    cr_assert_eq(sdpa_convert(h, (sdpa_dtype)5, f, SDPA_F32, 1), SDPA_ERR_ARG);
    cr_assert_eq(sdpa_convert(h, SDPA_F16, f, (sdpa_dtype)-1, 1), SDPA_ERR_ARG);
    cr_assert_eq(sdpa_convert(h, (sdpa_dtype)7, f, SDPA_F32, 0), SDPA_ERR_ARG);
    cr_assert_eq(sdpa_convert(h, SDPA_F16, f, SDPA_F32, SIZE_MAX / 2), SDPA_ERR_SIZE);
    /* overlap: only src == dst with one element size; any other is SDPA_ERR_SIZE, as an overlap
       is for every entry point */
    cr_assert_eq(sdpa_convert(f, SDPA_F16, f, SDPA_F32, 4), SDPA_ERR_SIZE);
    cr_assert_eq(sdpa_convert(h + 1, SDPA_BF16, h, SDPA_F16, 4), SDPA_ERR_SIZE);
    cr_assert_eq(sdpa_convert(f + 1, SDPA_F32, h, SDPA_F16, 7), SDPA_OK); /* disjoint */
    f[0] = 1.5f;
    cr_assert_eq(sdpa_convert(f, SDPA_F32, f, SDPA_F32, 8), SDPA_OK);
    cr_assert_eq(f[0], 1.5f);
    /* nothing written on error */
    h[0] = 0x1234;
    cr_assert_eq(sdpa_convert(h, (sdpa_dtype)5, f, SDPA_F32, 1), SDPA_ERR_ARG);
    cr_assert_eq(h[0], 0x1234);
}
