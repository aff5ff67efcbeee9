/* The OCP 8-bit floats through sdpa_convert: every pattern of e4m3 and e5m2 widened against a
 * decoder written here from the formats' fields, in double; narrowing against the nearest of
 * those 256 values (ties to the even code) for every value, every midpoint between neighbours
 * and the floats on either side of each midpoint, and past the range; under each rounding mode
 * and with FTZ/DAZ on, every backend; and each backend's kernel that widens them to f16. */
#include <fenv.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bounds.h"
#include "common.h"
#include "dispatch.h"
#include "reference.h"

/* The value of code c of e4m3 (type 3) or e5m2 (4) from its fields; NaN for a NaN. */
static double decode(uint8_t c, int type) {
    const int m_bits = type == 3 ? 3 : 2, bias = type == 3 ? 7 : 15;
    const int e = (c & 0x7f) >> m_bits, m = c & ((1 << m_bits) - 1);
    const int e_all = (1 << (7 - m_bits)) - 1;
    const double sign = c & 0x80 ? -1.0 : 1.0;
    if (type == 3 && e == e_all && m == 7) return NAN;
    if (type == 4 && e == e_all) return m ? NAN : sign * INFINITY;
    if (e == 0) return sign * ldexp(m, 1 - bias - m_bits);
    return sign * ldexp(1.0 + ldexp(m, -m_bits), e - bias);
}

/* The code RNE gives x (not NaN), from the table of values: the nearest finite one, the even
 * code on a tie; beyond the largest finite value's rounding boundary, e4m3 saturates and e5m2
 * goes to inf. */
static uint8_t expect_code(double x, int type) {
    const double largest = type == 3 ? 448.0 : 57344.0, ulp_top = type == 3 ? 32.0 : 8192.0;
    const uint8_t sign = signbit(x) ? 0x80 : 0, top = type == 3 ? 0x7e : 0x7b;
    const double a = fabs(x);
    if (a >= largest + ulp_top / 2) /* at or past the midpoint to the next binade's step */
        return sign | (type == 3 ? top : 0x7c);
    uint8_t best = 0;
    double best_d = INFINITY;
    for (uint8_t c = 0; c <= top; c++) {
        const double d = fabs(decode(c, type) - a);
        if (d < best_d || (d == best_d && !(c & 1))) best = c, best_d = d;
    }
    return sign | best;
}

static void check_widen(int type) {
    uint8_t codes[256];
    float got[256];
    for (int i = 0; i < 256; i++) codes[i] = (uint8_t)i;
    cr_assert_eq(sdpa_convert(got, SDPA_F32, codes, (sdpa_dtype)type, 256), SDPA_OK);
    for (int i = 0; i < 256; i++) {
        const double want = decode((uint8_t)i, type);
        if (isnan(want))
            cr_assert(isnan(got[i]), "type %d code 0x%02x: %g, want NaN", type, i, got[i]);
        else
            cr_assert(got[i] == want && !signbit(got[i]) == !signbit(want),
                      "type %d code 0x%02x: %.9g, want %.9g", type, i, got[i], want);
    }
}

/* the floats x to narrow: each value, each midpoint between neighbours and its float
   neighbours, tiny and huge values, both signs */
static size_t probes(float *x, int type) {
    size_t n = 0;
    const uint8_t top = type == 3 ? 0x7e : 0x7b;
    for (uint8_t c = 0; c <= top; c++) {
        const double v = decode(c, type), next = decode((uint8_t)(c + 1), type);
        const double mid =
            isfinite(next) && !isnan(next) ? (v + next) / 2 : v + (v - decode(c - 1, type)) / 2;
        const float m = (float)mid;
        const float list[] = {(float)v, m, nextafterf(m, 0), nextafterf(m, INFINITY)};
        for (size_t i = 0; i < 4; i++) x[n++] = list[i], x[n++] = -list[i];
    }
    const float extra[] = {1e-30f,   1e-45f, 1e30f,  INFINITY, 3.4e38f,  0x1p-10f,
                           0x1p-17f, 500.0f, 464.0f, 465.0f,   61440.0f, 61439.0f};
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++)
        x[n++] = extra[i], x[n++] = -extra[i];
    return n;
}

static void check_narrow(int type) {
    static float x[2048];
    static uint8_t got[2048];
    const size_t n = probes(x, type);
    cr_assert_eq(sdpa_convert(got, (sdpa_dtype)type, x, SDPA_F32, n), SDPA_OK);
    for (size_t i = 0; i < n; i++) {
        const uint8_t want = expect_code(x[i], type);
        cr_assert_eq(got[i], want, "type %d: %.9g gives 0x%02x, want 0x%02x", type, x[i], got[i],
                     want);
    }
    const float nan = NAN;
    cr_assert_eq(sdpa_convert(got, (sdpa_dtype)type, &nan, SDPA_F32, 1), SDPA_OK);
    cr_assert(isnan(decode(got[0], type)), "NaN gives 0x%02x", got[0]);
}

static const int ROUNDINGS[] = {FE_TONEAREST, FE_UPWARD, FE_DOWNWARD, FE_TOWARDZERO};

BACKEND_TEST(fp8, widen_exact_and_narrow_to_nearest_even_in_every_environment) {
    for (size_t r = 0; r < 4; r++)
        for (int ftz = 0; ftz < 2; ftz++) {
            fesetround(ROUNDINGS[r]);
            set_ftz_daz(ftz);
            for (int type = 3; type <= 4; type++) {
                check_widen(type);
                check_narrow(type);
            }
            set_ftz_daz(0);
            fesetround(FE_TONEAREST);
        }
}

/* The value of f16 bits h, from the format's fields; NaN for a NaN. */
static double f16_value(uint16_t h) {
    const int e = h >> 10 & 0x1f, m = h & 0x3ff;
    const double sign = h & 0x8000 ? -1.0 : 1.0;
    if (e == 0x1f) return m ? NAN : sign * INFINITY;
    return sign * (e ? ldexp(1024 + m, e - 25) : ldexp(m, -24));
}

/* The backend's widening to f16 (arch/kernels.h's widen_fp8) of n codes from `first`, the
   source ending at a guard page and the destination too: every f16 is the code's value (e4m3:
   times 2^-8, the factor the driver takes back in the scales), NaN for NaN, with the sign. */
static void check_widen_kernel(const sdpa_kernels *k, int type, size_t n, unsigned first) {
    guarded gs = guard_alloc((n + 3) / 4, GUARD_AFTER), gd = guard_alloc((n + 1) / 2, GUARD_AFTER);
    uint8_t *src = (uint8_t *)(gs.p + (n + 3) / 4) - n;
    uint16_t *dst = (uint16_t *)(gd.p + (n + 1) / 2) - n;
    for (size_t i = 0; i < n; i++) src[i] = (uint8_t)(first + i);
    k->widen_fp8[type - 3](dst, src, n);
    const double unit = type == 3 ? 0x1p-8 : 1.0;
    for (size_t i = 0; i < n; i++) {
        const double want = decode(src[i], type) * unit, got = f16_value(dst[i]);
        if (isnan(want))
            cr_assert(isnan(got), "%s type %d code 0x%02x: 0x%04x, want NaN", k->name, type, src[i],
                      dst[i]);
        else
            cr_assert(got == want && !signbit(got) == !signbit(want),
                      "%s type %d code 0x%02x (n %zu): 0x%04x is %.9g, want %.9g", k->name, type,
                      src[i], n, dst[i], got, want);
    }
    guard_free(&gs);
    guard_free(&gd);
}

BACKEND_TEST(fp8, widen_kernel_every_code_every_tail_every_environment) {
    const sdpa_kernels *k = sdpa_backend_kernels(sdpa_backend());
    cr_assert(k && k->widen_fp8[0] && k->widen_fp8[1]);
    for (size_t r = 0; r < 4; r++)
        for (int ftz = 0; ftz < 2; ftz++) {
            fesetround(ROUNDINGS[r]);
            set_ftz_daz(ftz);
            for (int type = 3; type <= 4; type++) {
                check_widen_kernel(k, type, 256, 0); /* every code, in one call */
                for (size_t n = 1; n <= 40; n++)     /* every tail of the widest vector step */
                    check_widen_kernel(k, type, n, (unsigned)(n * 37 + 0x70));
            }
            set_ftz_daz(0);
            fesetround(FE_TONEAREST);
        }
}

/* To and from the 16-bit types (through float: each element rounded once), and errors. */
BACKEND_TEST(fp8, with_the_16_bit_types) {
    uint8_t codes[256], back[256];
    uint16_t h[256];
    for (int i = 0; i < 256; i++) codes[i] = (uint8_t)i;
    /* every e5m2 value is an f16 value, and every e4m3 value a bf16 and an f16 one */
    for (int type = 3; type <= 4; type++)
        for (int t16 = SDPA_F16; t16 <= SDPA_BF16; t16++) {
            cr_assert_eq(sdpa_convert(h, (sdpa_dtype)t16, codes, (sdpa_dtype)type, 256), SDPA_OK);
            cr_assert_eq(sdpa_convert(back, (sdpa_dtype)type, h, (sdpa_dtype)t16, 256), SDPA_OK);
            for (int i = 0; i < 256; i++) {
                if (isnan(decode((uint8_t)i, type))) continue;
                cr_assert_eq(back[i], codes[i], "type %d via %d: 0x%02x came back 0x%02x", type,
                             t16, i, back[i]);
            }
        }
    cr_assert_eq(sdpa_convert(back, (sdpa_dtype)5, codes, SDPA_FP8_E4M3, 4), SDPA_ERR_ARG);
    cr_assert_eq(sdpa_convert(back, SDPA_FP8_E4M3, back + 1, SDPA_FP8_E5M2, 4), SDPA_ERR_SIZE);
}

/* Attention over 8-bit K and V with scales: against attention in double on the dequantized
 * values (scale times the decoded codes), within sdpa_mha's bound; decode split over keys and
 * prefill blocks, causal, GQA; a masked key's NaN never read. */
static void fp8_attention_case(int type, size_t heads_q, size_t heads_kv, size_t len_q,
                               size_t len_kv, size_t d, int causal, uint64_t seed, int tiny) {
    rng r = rng_seed(seed);
    const size_t nq = heads_q * len_q * d, nk = heads_kv * len_kv * d;
    float *q = calloc(nq, 4), *kf = calloc(nk, 4), *vf = calloc(nk, 4), *out = calloc(nq, 4);
    uint8_t *k8 = calloc(nk, 1), *v8 = calloc(nk, 1);
    float *mask = calloc(len_q * len_kv, 4);
    fill_normal(&r, q, nq);
    fill_normal(&r, kf, nk);
    fill_normal(&r, vf, nk);
    /* tiny: every code a subnormal one, scaled up to values near 1, which a DAZ or FTZ anywhere
       on their way would lose */
    const float k_scale = tiny ? (type == 3 ? 64.0f : 8192.0f) : 0.25f;
    const float v_scale = tiny ? 2 * k_scale : 3.0f;
    cr_assert_eq(sdpa_convert(k8, (sdpa_dtype)type, kf, SDPA_F32, nk), SDPA_OK);
    cr_assert_eq(sdpa_convert(v8, (sdpa_dtype)type, vf, SDPA_F32, nk), SDPA_OK);
    for (size_t i = 0; tiny && i < nk; i++) {
        const int top = type == 3 ? 7 : 3;
        k8[i] = (uint8_t)((k8[i] & 0x80) | (1 + k8[i] % top));
        v8[i] = (uint8_t)((v8[i] & 0x80) | (1 + v8[i] % top));
    }
    for (size_t i = 0; i < nk; i++) { /* the dequantized values the reference sees */
        kf[i] = (float)(k_scale * decode(k8[i], type));
        vf[i] = (float)(v_scale * decode(v8[i], type));
    }
    /* key 1 of every head is masked out and holds NaN */
    for (size_t i = 0; i < len_q; i++) mask[i * len_kv + 1 % len_kv] = len_kv > 1 ? -INFINITY : 0;
    if (len_kv > 1)
        for (size_t h = 0; h < heads_kv; h++) v8[(h * len_kv + 1) * d] = 0x7f;
    sdpa_mha_desc desc;
    cr_assert_eq(sdpa_mha_desc_dense(&desc, 1, heads_q, heads_kv, len_q, len_kv, d, d,
                                     SDPA_DEFAULT_SCALE, causal ? SDPA_CAUSAL : 0),
                 SDPA_OK);
    cr_assert_eq(sdpa_mha_desc_set_mods(&desc, NULL), SDPA_OK); /* a v3 descriptor */
    cr_assert_eq(sdpa_mha_desc_set_mask(&desc, mask, 0, 0, len_kv), SDPA_OK);
    desc.kv_type = (uint32_t)type;
    desc.k_scale = k_scale;
    desc.v_scale = v_scale;
    cr_assert_eq(sdpa_mha(&desc, out, q, k8, v8), SDPA_OK, "%s", sdpa_last_error_detail());
    double *want = calloc(len_q * d, sizeof(double));
    double vmax = 0;
    for (size_t i = 0; i < nk; i++)
        vmax = fabs(vf[i]) > vmax && isfinite(vf[i]) ? fabs(vf[i]) : vmax;
    for (size_t h = 0; h < heads_q; h++) {
        const size_t hk = h / (heads_q / heads_kv);
        ref_attention(want, d, q + h * len_q * d, d, kf + hk * len_kv * d, d, vf + hk * len_kv * d,
                      d, mask, len_kv, len_q, len_kv, d, d, 1.0 / sqrt((double)d), causal);
        for (size_t i = 0; i < len_q * d; i++)
            cr_assert(fabs(out[h * len_q * d + i] - want[i]) <= 2e-5 * vmax,
                      "type %d %zux%zu: head %zu out[%zu] = %.9g, want %.9g", type, len_q, len_kv,
                      h, i, out[h * len_q * d + i], want[i]);
    }
    free(q), free(kf), free(vf), free(out), free(k8), free(v8), free(mask), free(want);
}

BACKEND_TEST(fp8, attention_over_8_bit_caches) {
    for (int type = 3; type <= 4; type++) {
        fp8_attention_case(type, 8, 2, 1, 3000, 64, 0, 1, 0);  /* grouped decode, split over keys */
        fp8_attention_case(type, 2, 1, 70, 150, 32, 1, 2, 0);  /* packed prefill blocks, causal */
        fp8_attention_case(type, 2, 2, 3, 40, 136, 0, 3, 0);   /* unpacked rows, d past 128 */
        fp8_attention_case(type, 4, 1, 1, 32768, 64, 0, 6, 0); /* MQA decode over 32768 keys */
    }
}

/* Scales whose product with the scores' scale, or with e4m3's 2^8, passes float's range are
   SDPA_ERR_ARG naming them, and nothing is written; e5m2 takes a v_scale e4m3 cannot. */
Test(fp8, scales_that_overflow_are_errors) {
    float q[4] = {1, 2, 3, 4}, out[4] = {7, 7, 7, 7};
    uint8_t k8[8] = {0x38, 0x38, 0x38, 0x38, 0x30, 0x30, 0x30, 0x30}, v8[8] = {0};
    const struct {
        int type;
        float k_scale, v_scale;
        const char *named; /* NULL: accepted */
    } cases[] = {{3, 3e38f, 1.0f, "k_scale"},
                 {4, 3e38f, 1.0f, "k_scale"},
                 {3, 1.0f, 3e38f, "v_scale"},
                 {4, 1.0f, 3e38f, NULL},
                 {3, 1e30f, 1e30f, NULL}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        sdpa_mha_desc desc;
        cr_assert_eq(sdpa_mha_desc_dense(&desc, 1, 1, 1, 1, 2, 4, 4, 4.0f, 0), SDPA_OK);
        cr_assert_eq(sdpa_mha_desc_set_mods(&desc, NULL), SDPA_OK);
        desc.kv_type = (uint32_t)cases[i].type;
        desc.k_scale = cases[i].k_scale, desc.v_scale = cases[i].v_scale;
        const sdpa_status st = sdpa_mha(&desc, out, q, k8, v8);
        if (!cases[i].named) {
            cr_assert_eq(st, SDPA_OK, "case %zu: %s", i, sdpa_last_error_detail());
            continue;
        }
        cr_assert_eq(st, SDPA_ERR_ARG, "case %zu", i);
        cr_assert(strstr(sdpa_last_error_detail(), cases[i].named), "case %zu: %s", i,
                  sdpa_last_error_detail());
        for (int c = 0; c < 4; c++) cr_assert(out[c] == 7.0f, "case %zu wrote out", i);
    }
}

/* Subnormal codes under FTZ/DAZ and every rounding mode: the widening is exact in any
   environment, so decode and prefill still meet the bound. */
BACKEND_TEST(fp8, attention_over_subnormal_codes_in_every_environment) {
    for (size_t r = 0; r < 4; r++) {
        fesetround(ROUNDINGS[r]);
        set_ftz_daz(1);
        for (int type = 3; type <= 4; type++) {
            fp8_attention_case(type, 8, 2, 1, 200, 64, 0, 4, 1);
            fp8_attention_case(type, 2, 1, 40, 90, 32, 1, 5, 1);
        }
        set_ftz_daz(0);
        fesetround(FE_TONEAREST);
    }
}

/* One query row of hq heads (d each, packed) against the cache's first `keys` tokens of
 * sequence 0: the paged call's decode of one sequence. */
static sdpa_status decode_one(const sdpa_kv_cache *c, float *out, const float *q, const void *kp,
                              const void *vp, size_t hq, size_t d, int32_t keys) {
    const int32_t q_start[2] = {0, 1}, kv_len[1] = {keys};
    const sdpa_batch b = {.struct_size = sizeof b,
                          .num_seqs = 1,
                          .heads_q = hq,
                          .q_start = q_start,
                          .kv_len = kv_len,
                          .q_stride = {hq * d, d},
                          .out_stride = {hq * d, d}};
    return sdpa_attention_paged(&b, c, out, q, kp, vp);
}

/* An fp8 paged cache: sdpa_kv_cache_store quantizes x / scale as sdpa_convert rounds, e4m3
 * saturating; the paged call over it gives sdpa_mha's bits on the same codes laid out densely
 * (blocks of 64 keys), with the scales. */
BACKEND_TEST(fp8, paged_cache_store_and_attention) {
    enum { HQ = 4, HK = 2, D = 32, BS = 64, KEYS = 150, BLOCKS = 4 };
    rng r = rng_seed(11);
    static float kf[KEYS * HK * D], vf[KEYS * HK * D], q[HQ * D], out[HQ * D], dense_out[HQ * D];
    static uint8_t kp[BLOCKS * HK * BS * D], vp[BLOCKS * HK * BS * D];
    static uint8_t kd[HK * KEYS * D], vd[HK * KEYS * D], want[D];
    fill_normal(&r, kf, KEYS * HK * D);
    fill_normal(&r, vf, KEYS * HK * D);
    fill_normal(&r, q, HQ * D);
    kf[5] = 1e6f; /* past e4m3's range after the scale: saturates */
    const int32_t table[BLOCKS] = {2, 0, 3, 1};
    int64_t slots[KEYS];
    for (size_t t = 0; t < KEYS; t++) slots[t] = (int64_t)(table[t / BS] * BS + t % BS);
    for (int type = 3; type <= 4; type++) {
        const sdpa_kv_cache c = {.struct_size = sizeof c,
                                 .kv_type = (uint32_t)type,
                                 .num_blocks = BLOCKS,
                                 .block_size = BS,
                                 .heads_kv = HK,
                                 .d_k = D,
                                 .d_v = D,
                                 .k_stride = {HK * BS * D, BS * D, D},
                                 .v_stride = {HK * BS * D, BS * D, D},
                                 .block_table = table,
                                 .block_table_stride = BLOCKS,
                                 .k_scale = 0.5f,
                                 .v_scale = 4.0f};
        const size_t src_stride[2] = {HK * D, D};
        cr_assert_eq(
            sdpa_kv_cache_store(&c, kp, vp, slots, KEYS, kf, vf, SDPA_F32, src_stride, src_stride),
            SDPA_OK, "%s", sdpa_last_error_detail());
        for (size_t t = 0; t < KEYS; t++)
            for (size_t h = 0; h < HK; h++) {
                const size_t at = ((size_t)table[t / BS] * HK + h) * BS * D + t % BS * D;
                float scaled[D];
                for (size_t i = 0; i < D; i++) scaled[i] = kf[(t * HK + h) * D + i] / 0.5f;
                sdpa_convert(want, (sdpa_dtype)type, scaled, SDPA_F32, D);
                cr_assert(!memcmp(kp + at, want, D), "type %d token %zu head %zu stored otherwise",
                          type, t, h);
                memcpy(kd + (h * KEYS + t) * D, kp + at, D);
                memcpy(vd + (h * KEYS + t) * D, vp + at, D);
            }
        cr_assert_eq(decode_one(&c, out, q, kp, vp, HQ, D, KEYS), SDPA_OK, "%s",
                     sdpa_last_error_detail());
        sdpa_mha_desc desc;
        sdpa_mha_desc_dense(&desc, 1, HQ, HK, 1, KEYS, D, D, SDPA_DEFAULT_SCALE, 0);
        sdpa_mha_desc_set_mods(&desc, NULL);
        desc.kv_type = (uint32_t)type, desc.k_scale = 0.5f, desc.v_scale = 4.0f;
        cr_assert_eq(sdpa_mha(&desc, dense_out, q, kd, vd), SDPA_OK);
        cr_assert(!memcmp(out, dense_out, sizeof out), "type %d: paged and dense differ", type);
    }
}

/* An fp8 token table whose slots run in order (read in place) gives the bits of the same codes
 * at random slots (gathered), on every backend and for keys and values both. */
BACKEND_TEST(fp8, token_table_in_order_gives_the_bits_of_slots_at_random) {
    enum { HQ = 4, HK = 2, D = 40, KEYS = 150, SLOTS = KEYS + 7 };
    rng r = rng_seed(12);
    static float kf[KEYS * HK * D], vf[KEYS * HK * D], q[HQ * D], out[2][HQ * D], dense[HQ * D];
    static uint8_t kp[SLOTS * HK * D], vp[SLOTS * HK * D], kd[HK * KEYS * D], vd[HK * KEYS * D];
    fill_normal(&r, kf, KEYS * HK * D);
    fill_normal(&r, vf, KEYS * HK * D);
    fill_normal(&r, q, HQ * D);
    int32_t table[2][KEYS];
    for (size_t t = 0; t < KEYS; t++) table[0][t] = table[1][t] = (int32_t)(t + 3);
    for (size_t t = KEYS - 1; t > 0; t--) { /* a random placement of the same tokens */
        const size_t j = (size_t)rng_uniform(&r, 0.0, (double)(t + 1));
        const int32_t x = table[1][t];
        table[1][t] = table[1][j], table[1][j] = x;
    }
    for (int type = 3; type <= 4; type++) {
        for (int placing = 0; placing < 2; placing++) {
            const sdpa_kv_cache c = {.struct_size = sizeof c,
                                     .kv_type = (uint32_t)type,
                                     .num_blocks = SLOTS,
                                     .block_size = 1,
                                     .heads_kv = HK,
                                     .d_k = D,
                                     .d_v = D,
                                     .k_stride = {HK * D, D, D},
                                     .v_stride = {HK * D, D, D},
                                     .block_table = table[placing],
                                     .block_table_stride = KEYS,
                                     .k_scale = 0.5f,
                                     .v_scale = 2.0f};
            int64_t slots[KEYS];
            for (size_t t = 0; t < KEYS; t++) slots[t] = table[placing][t];
            const size_t src_stride[2] = {HK * D, D};
            memset(kp, 0x7f, sizeof kp), memset(vp, 0x7f, sizeof vp); /* NaN where unused */
            cr_assert_eq(sdpa_kv_cache_store(&c, kp, vp, slots, KEYS, kf, vf, SDPA_F32, src_stride,
                                             src_stride),
                         SDPA_OK, "%s", sdpa_last_error_detail());
            cr_assert_eq(decode_one(&c, out[placing], q, kp, vp, HQ, D, KEYS), SDPA_OK, "%s",
                         sdpa_last_error_detail());
        }
        /* and sdpa_mha's values on the same codes laid out densely */
        for (size_t t = 0; t < KEYS; t++)
            for (size_t h = 0; h < HK; h++) {
                memcpy(kd + (h * KEYS + t) * D, kp + ((size_t)table[1][t] * HK + h) * D, D);
                memcpy(vd + (h * KEYS + t) * D, vp + ((size_t)table[1][t] * HK + h) * D, D);
            }
        sdpa_mha_desc desc;
        sdpa_mha_desc_dense(&desc, 1, HQ, HK, 1, KEYS, D, D, SDPA_DEFAULT_SCALE, 0);
        cr_assert_eq(sdpa_mha_desc_set_mods(&desc, NULL), SDPA_OK); /* a v3 descriptor: scales */
        desc.kv_type = (uint32_t)type, desc.k_scale = 0.5f, desc.v_scale = 2.0f;
        cr_assert_eq(sdpa_mha(&desc, dense, q, kd, vd), SDPA_OK);
        cr_assert(!memcmp(out[0], out[1], sizeof out[0]),
                  "type %d: slots in order and at random "
                  "differ",
                  type);
        for (size_t i = 0; i < HQ * D; i++)
            cr_assert(fabsf(out[0][i] - dense[i]) <= 1e-5f * (1 + fabsf(dense[i])),
                      "type %d: %zu is %g, dense %g", type, i, out[0][i], dense[i]);
    }
}

/* ---- the entries that widen 8-bit rows in their loads (kernels.h's scores_tile_fp8 and
 * pv_tile_fp8) ---- */

/* the value a kernel reads for code c: e4m3 at 2^-8 of its value */
static double kernel_value(uint8_t c, int type) {
    return decode(c, type) * (type == 3 ? 0x1p-8 : 1);
}

/* got against the double ref of terms summing to abs_sum: NaN for NaN, an inf exactly, else
   within the dot's bound */
static void expect_near(float got, double ref, double abs_sum, const char *what, size_t i, size_t j,
                        size_t d) {
    if (isnan(ref))
        cr_assert(isnan(got), "%s (%zu, %zu) d %zu: %.9g, want NaN", what, i, j, d, got);
    else if (isinf(ref))
        cr_assert(got == ref, "%s (%zu, %zu) d %zu: %.9g, want %g", what, i, j, d, got, ref);
    else
        cr_assert(fabs(got - ref) <= bound_dot(abs_sum), "%s (%zu, %zu) d %zu: %.9g, want %.9g",
                  what, i, j, d, got, ref);
}

/* One shape of the backend's fp8 entries: nq queries (or rows of weights) against nk rows of d
   codes from `first` on (every code, where nk d >= 256; nan_at_end 0: NaN codes replaced, 1:
   then the last code NaN), d apart, the last ending at a guard page. The scores and the P V sums
   against double sums of the values the kernels read, and bit for bit what the f16 entries give on
   widen_fp8's rows (the contract). */
static void check_fp8_entries(const sdpa_kernels *k, int type, size_t nq, size_t nk, size_t d,
                              unsigned first, int nan_at_end, rng *r) {
    const sdpa_attention_kernels *a = k->attention;
    const size_t n = nk * d;
    guarded g = guard_alloc((n + 3) / 4, GUARD_AFTER);
    uint8_t *codes = (uint8_t *)(g.p + (n + 3) / 4) - n;
    uint16_t *h = malloc(n * sizeof(uint16_t));
    float *q = malloc(nq * d * sizeof(float)), *p = malloc(nq * nk * sizeof(float));
    float *s = malloc(nq * nk * sizeof(float)), *s16 = malloc(nq * nk * sizeof(float));
    float *acc = malloc(nq * d * sizeof(float)), *acc16 = malloc(nq * d * sizeof(float));
    float *acc0 = malloc(nq * d * sizeof(float));
    for (size_t i = 0; i < n; i++) codes[i] = (uint8_t)(first + i);
    if (nan_at_end >= 0) /* no NaN but one (or none) in the last code, e4m3's form for NaN-free
                            rows and the pass that finds them */
        for (size_t i = 0; i < n; i++)
            if (isnan(decode(codes[i], type)) || (nan_at_end && i == n - 1))
                codes[i] = (uint8_t)((codes[i] & 0x80) | (i == n - 1 && nan_at_end ? 0x7f : 0x38));
    k->widen_fp8[type - 3](h, codes, n);
    fill_uniform(r, q, nq * d, -1.0f, 1.0f);
    fill_uniform(r, p, nq * nk, 0.0f, 1.0f);
    fill_uniform(r, acc, nq * d, -1.0f, 1.0f);
    memcpy(acc16, acc, nq * d * sizeof(float));
    memcpy(acc0, acc, nq * d * sizeof(float));
    /* the fp8 entries read ahead into other rows (h): that never changes a result */
    a->scores_tile_fp8[type - 3](s, nk, q, d, nq, codes, d, h, nk, d, 0.5f);
    a->scores_tile_typed[SDPA_F16](s16, nk, q, d, nq, h, d, NULL, nk, d, 0.5f);
    cr_assert(!memcmp(s, s16, nq * nk * sizeof(float)),
              "%s type %d scores nq %zu nk %zu d %zu: not the f16 entry's", k->name, type, nq, nk,
              d);
    for (size_t i = 0; i < nq; i++)
        for (size_t j = 0; j < nk; j++) {
            double ref = 0, abs_sum = 0;
            for (size_t c = 0; c < d; c++) {
                const double t = (double)q[i * d + c] * kernel_value(codes[j * d + c], type);
                ref += t, abs_sum += fabs(t);
            }
            expect_near(s[i * nk + j], 0.5 * ref, 0.5 * abs_sum, "score", i, j, d);
        }
    a->pv_tile_fp8[type - 3](acc, d, p, nk, nq, nk, codes, d, h, d);
    a->pv_tile_typed[SDPA_F16](acc16, d, p, nk, nq, nk, h, d, NULL, d);
    cr_assert(!memcmp(acc, acc16, nq * d * sizeof(float)),
              "%s type %d P V nq %zu nk %zu d %zu: not the f16 entry's", k->name, type, nq, nk, d);
    for (size_t i = 0; i < nq; i++)
        for (size_t c = 0; c < d; c++) {
            double ref = acc0[i * d + c], abs_sum = fabs(ref);
            for (size_t j = 0; j < nk; j++) {
                const double t = (double)p[i * nk + j] * kernel_value(codes[j * d + c], type);
                ref += t, abs_sum += fabs(t);
            }
            expect_near(acc[i * d + c], ref, abs_sum, "P V", i, c, d);
        }
    free(h), free(q), free(p), free(s), free(s16), free(acc), free(acc16), free(acc0);
    guard_free(&g);
}

/* Every code, every tail of a vector (d up to 40, past two of the widest) for 1, 3 and 5 rows
   (a register block of 4 and one left over), with NaN codes, without, and with one at the end
   only, under each rounding mode and with FTZ/DAZ (the f16 conversion then the exact integer
   one); and the table's rules: both entries or neither, only beside the f16 entries they
   match. */
BACKEND_TEST(fp8, entries_that_widen_in_their_loads) {
    const sdpa_kernels *k = sdpa_backend_kernels(sdpa_backend());
    const sdpa_attention_kernels *a = k->attention;
    for (int t = 0; t < 2; t++) {
        cr_assert(!a->scores_tile_fp8[t] == !a->pv_tile_fp8[t], "fp8 entries: both or neither");
        cr_assert(!a->scores_tile_fp8[t] ||
                      (a->scores_tile_typed[SDPA_F16] && a->pv_tile_typed[SDPA_F16]),
                  "fp8 entries without the f16 ones");
    }
    rng r = rng_seed(38);
    for (size_t m = 0; m < 4; m++)
        for (int ftz = 0; ftz < 2; ftz++) {
            fesetround(ROUNDINGS[m]);
            set_ftz_daz(ftz);
            for (int type = 3; type <= 4; type++) {
                if (!a->scores_tile_fp8[type - 3]) continue;
                /* every code, decode's shape; every code but NaN */
                check_fp8_entries(k, type, 4, 64, 128, 0, -1, &r);
                check_fp8_entries(k, type, 4, 64, 128, 0, 0, &r);
                for (size_t d = 1; d <= 40; d++)
                    for (size_t nq = 1; nq <= 5; nq += 2) {
                        check_fp8_entries(k, type, nq, 7, d, (unsigned)(d * 37), -1, &r);
                        check_fp8_entries(k, type, nq, 3, d, (unsigned)(d * 11), 0, &r);
                        check_fp8_entries(k, type, nq, 3, d, (unsigned)(d * 11), 1, &r);
                    }
            }
            set_ftz_daz(0);
            fesetround(FE_TONEAREST);
        }
}
