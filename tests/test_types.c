/* sdpa_mha with 16-bit views on every backend: every combination of q, k/v and out types over
 * random shapes (GQA, BSHD views, masks with -inf rows, causal), long decodes, special values
 * and the errors, against the double-precision reference of reference.c on the values the
 * 16-bit arrays hold. Every array ends at a PROT_NONE page. */
#include <fenv.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bounds.h"
#include "common.h"
#include "reference.h"

/* ---- the 16-bit formats from their definitions (reference.c), independent of the library ---- */

/* the value an element of type t holds */
static double value_of(const void *base, size_t i, sdpa_dtype t) {
    if (t == SDPA_F32) return ((const float *)base)[i];
    const uint16_t h = ((const uint16_t *)base)[i];
    return t == SDPA_F16 ? ref_f16(h) : ref_bf16(h);
}

/* x stored as type t at element i, truncated toward zero (how does not matter: the reference
 * reads back what was stored), with specials as such */
static void store(void *base, size_t i, double x, sdpa_dtype t) {
    if (t == SDPA_F32) {
        ((float *)base)[i] = (float)x;
        return;
    }
    const int mbits = t == SDPA_F16 ? 10 : 7, bias = t == SDPA_F16 ? 15 : 127;
    const int emax = t == SDPA_F16 ? 30 : 254;
    uint16_t sign = signbit(x) ? 0x8000 : 0, bits;
    if (isnan(x)) {
        bits = t == SDPA_F16 ? 0x7e00 : 0x7fc0;
    } else if (isinf(x)) {
        bits = (uint16_t)(0x7fff & ~((1u << mbits) - 1));
    } else {
        int e;
        const double m = frexp(fabs(x), &e); /* |x| = m 2^e, m in [0.5, 1) */
        int field = e - 1 + bias;
        if (x == 0.0 || field < 1 - mbits) {
            bits = 0;
        } else if (field < 1) { /* subnormal: |x| / 2^(1 - bias - mbits) */
            bits = (uint16_t)floor(ldexp(fabs(x), bias - 1 + mbits));
        } else if (field > emax) {
            bits = (uint16_t)(emax << mbits | ((1u << mbits) - 1)); /* the largest */
        } else {
            bits = (uint16_t)(field << mbits | (unsigned)floor((2.0 * m - 1.0) * (1 << mbits)));
        }
    }
    ((uint16_t *)base)[i] = sign | bits;
}

static size_t type_size(sdpa_dtype t) { return t == SDPA_F32 ? 4 : 2; }
static const char *type_name(sdpa_dtype t) {
    return t == SDPA_F32 ? "f32" : t == SDPA_F16 ? "f16" : "bf16";
}

/* n elements of type t ending where a PROT_NONE page begins */
typedef struct typed_array {
    guarded g;
    void *p;
} typed_array;
static typed_array typed_alloc(size_t n, sdpa_dtype t) {
    typed_array a;
    const size_t bytes = n * type_size(t);
    a.g = guard_alloc((bytes + 3) / 4, GUARD_AFTER);
    a.p = (char *)(a.g.p + (bytes + 3) / 4) - bytes;
    return a;
}

/* ---- one multi-head case ---- */

typedef struct typed_case {
    size_t batch, heads_q, heads_kv, len_q, len_kv, d_k, d_v;
    int causal, masked, bshd;
    sdpa_dtype q_type, kv_type, out_type;
} typed_case;

/* Runs c through sdpa_mha and checks every output against the reference: the f32 bound, plus
 * half an ULP of the out type where it is 16-bit. */
static void run_typed(rng *r, const typed_case *c) {
    sdpa_mha_desc desc;
    cr_assert_eq((c->bshd ? sdpa_mha_desc_bshd : sdpa_mha_desc_dense)(
                     &desc, c->batch, c->heads_q, c->heads_kv, c->len_q, c->len_kv, c->d_k, c->d_v,
                     0.0f, c->causal ? SDPA_CAUSAL : 0),
                 SDPA_OK);
    desc.q_type = c->q_type;
    desc.kv_type = c->kv_type;
    desc.out_type = c->out_type;
    const size_t nq = c->batch * c->heads_q * c->len_q * c->d_k;
    const size_t nk = c->batch * c->heads_kv * c->len_kv * c->d_k;
    const size_t nv = c->batch * c->heads_kv * c->len_kv * c->d_v;
    const size_t no = c->batch * c->heads_q * c->len_q * c->d_v;
    typed_array q = typed_alloc(nq, c->q_type), k = typed_alloc(nk, c->kv_type);
    typed_array v = typed_alloc(nv, c->kv_type), out = typed_alloc(no, c->out_type);
    for (size_t i = 0; i < nq; i++) store(q.p, i, rng_normal(r), c->q_type);
    for (size_t i = 0; i < nk; i++) store(k.p, i, rng_normal(r), c->kv_type);
    for (size_t i = 0; i < nv; i++) store(v.p, i, rng_normal(r), c->kv_type);
    float *mask = NULL;
    if (c->masked) { /* one mask for every head: some keys removed, and row 0 sees none */
        mask = malloc(c->len_q * c->len_kv * sizeof *mask);
        for (size_t i = 0; i < c->len_q * c->len_kv; i++)
            mask[i] = rng_uniform(r, 0, 1) < 0.25 ? -INFINITY : (float)rng_uniform(r, -1, 1);
        for (size_t j = 0; j < c->len_kv; j++) mask[j] = -INFINITY;
        sdpa_mha_desc_set_mask(&desc, mask, 0, 0, c->len_kv);
    }
    cr_assert_eq(sdpa_mha(&desc, out.p, q.p, k.p, v.p), SDPA_OK);

    /* one head at a time, in float rows of the stored values */
    float *qh = malloc(c->len_q * c->d_k * 4), *kh = malloc(c->len_kv * c->d_k * 4);
    float *vh = malloc(c->len_kv * c->d_v * 4);
    double *ref = malloc(c->len_q * c->d_v * sizeof *ref);
    const double scale = 1.0 / sqrt((double)c->d_k);
    const double half_ulp = c->out_type == SDPA_F16    ? 0x1p-11
                            : c->out_type == SDPA_BF16 ? 0x1p-8
                                                       : 0;
    for (size_t b = 0; b < c->batch; b++) {
        for (size_t h = 0; h < c->heads_q; h++) {
            const size_t hk = h / (c->heads_q / c->heads_kv);
            double max_v = 0.0;
            for (size_t i = 0; i < c->len_q; i++)
                for (size_t p = 0; p < c->d_k; p++)
                    qh[i * c->d_k + p] = (float)value_of(
                        q.p, b * desc.q_stride[0] + h * desc.q_stride[1] + i * desc.q_stride[2] + p,
                        c->q_type);
            for (size_t j = 0; j < c->len_kv; j++) {
                for (size_t p = 0; p < c->d_k; p++)
                    kh[j * c->d_k + p] = (float)value_of(
                        k.p,
                        b * desc.k_stride[0] + hk * desc.k_stride[1] + j * desc.k_stride[2] + p,
                        c->kv_type);
                for (size_t p = 0; p < c->d_v; p++) {
                    vh[j * c->d_v + p] = (float)value_of(
                        v.p,
                        b * desc.v_stride[0] + hk * desc.v_stride[1] + j * desc.v_stride[2] + p,
                        c->kv_type);
                    if (fabs(vh[j * c->d_v + p]) > max_v) max_v = fabs(vh[j * c->d_v + p]);
                }
            }
            ref_attention(ref, c->d_v, qh, c->d_k, kh, c->d_k, vh, c->d_v, mask, c->len_kv,
                          c->len_q, c->len_kv, c->d_k, c->d_v, scale, c->causal);
            const double bound = bound_attention(max_v);
            for (size_t i = 0; i < c->len_q; i++) {
                for (size_t col = 0; col < c->d_v; col++) {
                    const double want = ref[i * c->d_v + col];
                    const double got = value_of(out.p,
                                                b * desc.out_stride[0] + h * desc.out_stride[1] +
                                                    i * desc.out_stride[2] + col,
                                                c->out_type);
                    const double tol = bound + half_ulp * (fabs(want) + bound) + 0x1p-25;
                    cr_assert(fabs(got - want) <= tol && (want != 0.0 || !signbit(got)),
                              "q %s kv %s out %s, b%zu h%zu/%zu q%zu kv%zu d%zu/%zu causal %d "
                              "mask %d bshd %d: row %zu col %zu got %.9g want %.9g (tol %.3g)",
                              type_name(c->q_type), type_name(c->kv_type), type_name(c->out_type),
                              c->batch, c->heads_q, c->heads_kv, c->len_q, c->len_kv, c->d_k,
                              c->d_v, c->causal, c->masked, c->bshd, i, col, got, want, tol);
                }
            }
        }
    }
    free(qh);
    free(kh);
    free(vh);
    free(ref);
    free(mask);
    guard_free(&q.g);
    guard_free(&k.g);
    guard_free(&v.g);
    guard_free(&out.g);
}

static size_t pick(rng *r, size_t lo, size_t hi) {
    return lo + (size_t)rng_uniform(r, 0.0, (double)(hi - lo + 1));
}

static const size_t DIMS[] = {1, 8, 17, 64, 96, 128, 256};

/* every q x kv x out combination, each on shapes drawn at random */
BACKEND_TEST(types, every_combination_random_shapes) {
    rng r = rng_seed(2201);
    const int per_combination = test_quick() ? 1 : 3;
    for (int qt = 0; qt < 3; qt++)
        for (int kt = 0; kt < 3; kt++)
            for (int ot = 0; ot < 3; ot++)
                for (int t = 0; t < per_combination; t++) {
                    typed_case c = {0};
                    c.batch = pick(&r, 1, 2);
                    c.heads_kv = pick(&r, 1, 2);
                    c.heads_q = c.heads_kv * pick(&r, 1, 3);
                    c.len_q = pick(&r, 1, test_quick() ? 40 : 120);
                    c.len_kv = pick(&r, 1, test_quick() ? 70 : 200);
                    c.d_k = DIMS[pick(&r, 0, 6)];
                    c.d_v = DIMS[pick(&r, 0, 6)];
                    c.causal = (int)pick(&r, 0, 1);
                    c.masked = pick(&r, 0, 3) == 0;
                    c.bshd = (int)pick(&r, 0, 1);
                    c.q_type = (sdpa_dtype)qt;
                    c.kv_type = (sdpa_dtype)kt;
                    c.out_type = (sdpa_dtype)ot;
                    run_typed(&r, &c);
                }
}

/* blocks of 8 and more queries at d <= 128 (the packed path), and decode with grouped heads */
BACKEND_TEST(types, prefill_blocks_and_grouped_decode) {
    rng r = rng_seed(2202);
    for (int t = SDPA_F16; t <= SDPA_BF16; t++) {
        const sdpa_dtype ty = (sdpa_dtype)t;
        typed_case prefill = {1, 2, 1, 70, 150, 64, 64, 1, 0, 0, ty, ty, ty};
        run_typed(&r, &prefill);
        typed_case mixed = {1, 1, 1, 33, 129, 128, 80, 0, 1, 1, SDPA_F32, ty, SDPA_F32};
        run_typed(&r, &mixed);
        typed_case gqa = {2, 8, 2, 1, 300, 128, 128, 0, 0, 1, ty, ty, ty};
        run_typed(&r, &gqa);
        typed_case wide = {1, 1, 1, 40, 40, 512, 300, 1, 0, 0, ty, ty, ty};
        run_typed(&r, &wide);
    }
}

/* the decode of the K/V caches engines keep: 4096 and 32768 keys */
BACKEND_TEST(types, long_decode) {
    rng r = rng_seed(2203);
    const size_t lens[] = {4096, 32768};
    for (size_t i = 0; i < (test_quick() ? 1u : 2u); i++)
        for (int t = SDPA_F16; t <= SDPA_BF16; t++) {
            typed_case c = {1, 4, 2, 1,        lens[i],       128,     128,
                            0, 0, 0, SDPA_F32, (sdpa_dtype)t, SDPA_F32};
            run_typed(&r, &c);
        }
}

/* All-bf16 blocks of 8 and more queries at d <= 128: the packed path, which forms Q.K with the
 * avx512 backend's bf16 dot where the CPU has one (AMX by default; types-bf16_dot-only and
 * types-avx512-addons-off run this suite again with vdpbf16ps and with neither).
 * Odd d (the last pair half a pair, at the end of the array: a guard page follows), BSHD views
 * (rows that start between two pairs), causal and masked blocks, several blocks of keys. */
BACKEND_TEST(types, bf16_prefill_packed) {
    rng r = rng_seed(2205);
    const size_t ds[] = {1, 2, 7, 8, 33, 64, 127, 128};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) {
        const sdpa_dtype out_type = i % 2 ? SDPA_BF16 : SDPA_F32;
        typed_case dense = {1, 2, 1, 40, 150, ds[i], 24, 0, 0, 0, SDPA_BF16, SDPA_BF16, out_type};
        run_typed(&r, &dense);
        typed_case bshd = {2, 2, 2,         9,         70,      ds[i], ds[i], (int)(i % 2),
                           0, 1, SDPA_BF16, SDPA_BF16, out_type};
        run_typed(&r, &bshd);
        typed_case masked = {1, 1, 1, 33, 65, ds[i], 16, 0, 1, 0, SDPA_BF16, SDPA_BF16, out_type};
        run_typed(&r, &masked);
    }
}

/* The same under every rounding mode and with FTZ/DAZ: vdpbf16ps and AMX's TDPBF16PS round their
 * sums to nearest whatever MXCSR says, the rest of the path follows the caller's mode, and the
 * bound holds in all of them; the mode is left as it was. d is odd (vdpbf16ps, also where AMX is
 * on) or, with FTZ/DAZ, 64 or 96 (whole AMX tile steps). */
BACKEND_TEST(types, bf16_prefill_packed_in_every_rounding_mode) {
    static const int modes[] = {FE_UPWARD, FE_DOWNWARD, FE_TOWARDZERO, FE_TONEAREST};
    rng r = rng_seed(2206);
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
        for (int ftz_daz = 0; ftz_daz < 2; ftz_daz++) {
            const size_t d = ftz_daz ? 64 + 32 * (i % 2) : 63 + 2 * i;
            typed_case c = {1,          1, 1, 40,        100,       d,        32,
                            (int)i % 2, 0, 0, SDPA_BF16, SDPA_BF16, SDPA_BF16};
            cr_assert_eq(fesetround(modes[i]), 0);
            set_ftz_daz(ftz_daz);
            run_typed(&r, &c);
            cr_assert_eq(fegetround(), modes[i], "the rounding mode changed");
            set_ftz_daz(0);
            fesetround(FE_TONEAREST);
        }
}

/* ---- special values ---- */

/* attention over one head of n keys, d_k = d_v = d, q/k/v of type t, out of type t; values given as
 * doubles, stored exactly (the ones used are representable) */
static void one_head(sdpa_dtype t, sdpa_dtype out_type, size_t len_q, size_t len_kv, size_t d,
                     const double *q, const double *k, const double *v, const float *mask,
                     double *out) {
    sdpa_mha_desc desc;
    sdpa_mha_desc_dense(&desc, 1, 1, 1, len_q, len_kv, d, d, 0.0f, 0);
    desc.q_type = desc.kv_type = t;
    desc.out_type = out_type;
    if (mask) sdpa_mha_desc_set_mask(&desc, mask, 0, 0, len_kv);
    typed_array tq = typed_alloc(len_q * d, t), tk = typed_alloc(len_kv * d, t);
    typed_array tv = typed_alloc(len_kv * d, t), to = typed_alloc(len_q * d, out_type);
    for (size_t i = 0; i < len_q * d; i++) store(tq.p, i, q[i], t);
    for (size_t i = 0; i < len_kv * d; i++) store(tk.p, i, k[i], t), store(tv.p, i, v[i], t);
    cr_assert_eq(sdpa_mha(&desc, to.p, tq.p, tk.p, tv.p), SDPA_OK);
    for (size_t i = 0; i < len_q * d; i++) out[i] = value_of(to.p, i, out_type);
    guard_free(&tq.g);
    guard_free(&tk.g);
    guard_free(&tv.g);
    guard_free(&to.g);
}

BACKEND_TEST(types, special_values) {
    for (int t = SDPA_F16; t <= SDPA_BF16; t++) {
        const sdpa_dtype ty = (sdpa_dtype)t;
        double q[16], k[24], v[24], out[16];
        for (size_t i = 0; i < 16; i++) q[i] = 0.25 * (double)(i % 5);
        for (size_t i = 0; i < 24; i++) k[i] = 0.5 - 0.125 * (double)(i % 7), v[i] = 1.0;
        /* a removed key's NaN and inf in V never reach the output; row 1 sees no key */
        const float mask[6] = {0, -INFINITY, 0, -INFINITY, -INFINITY, -INFINITY};
        v[8] = NAN;
        v[9] = INFINITY;
        one_head(ty, ty, 2, 3, 8, q, k, v, mask, out);
        for (size_t c = 0; c < 8; c++) {
            cr_assert(out[c] == 1.0, "%s: removed key leaked: %g", type_name(ty), out[c]);
            cr_assert(out[8 + c] == 0.0 && !signbit(out[8 + c]), "%s: empty row", type_name(ty));
        }
        /* NaN in a query row makes that row NaN, the other row is untouched */
        v[8] = 1.0, v[9] = 1.0;
        q[3] = NAN;
        one_head(ty, ty, 2, 3, 8, q, k, v, NULL, out);
        for (size_t c = 0; c < 8; c++) {
            cr_assert(isnan(out[c]), "%s: NaN query row", type_name(ty));
            cr_assert(out[8 + c] == 1.0, "%s: other row", type_name(ty));
        }
        q[3] = 0.5;
        /* the largest finite value of the type in V: out holds it, finite */
        const double big = ty == SDPA_F16 ? 65504.0 : 0x1.fep100; /* 3 of bf16's largest would
                                                                     overflow the float sum */
        for (size_t i = 0; i < 24; i++) v[i] = big;
        one_head(ty, ty, 2, 3, 8, q, k, v, NULL, out);
        for (size_t c = 0; c < 16; c++)
            cr_assert(out[c] == big, "%s: largest value gave %g", type_name(ty), out[c]);
        /* subnormals of the type: scores of 0, the output the mean of the values */
        const double tiny = ty == SDPA_F16 ? 0x1p-24 : 0x1p-127;
        for (size_t i = 0; i < 24; i++) k[i] = tiny, v[i] = (double)(i / 8) * tiny;
        one_head(ty, SDPA_F32, 2, 3, 8, q, k, v, NULL, out);
        for (size_t c = 0; c < 16; c++)
            cr_assert(fabs(out[c] - tiny) <= 2e-5 * tiny + 0x1p-147, "%s: subnormal mean %a",
                      type_name(ty), out[c]);
    }
}

/* The special values in all-bf16 blocks of 8 queries (the packed path, with the bf16 dot where
 * the CPU has it), d = 5 so that some sit in the odd last pair, and d = 32, one whole AMX tile
 * step: out as the f32 path gives on the same values, NaN where it has NaN (inf or NaN in q or
 * k), zeros for a row that sees no key, and a removed key's NaN V never leaks. */
BACKEND_TEST(types, bf16_special_values_in_packed_blocks) {
    enum { NQ = 8, NK = 11, MAX_D_ = 32 };
    const double specials[] = {INFINITY, -INFINITY, NAN, 0x1p-130 /* subnormal */};
    double q[NQ * MAX_D_], k[NK * MAX_D_], v[NK * MAX_D_];
    for (int place = 0; place < 2 * 2 * 4 * 2; place++) {
        const size_t D = place < 2 * 4 * 2 ? 5 : MAX_D_;
        const int in_q = place % 2, which = place / 2 % 4, masked = place / 8 % 2;
        for (size_t i = 0; i < NQ * D; i++) q[i] = 0.25 * (double)(i % 5) - 0.375;
        for (size_t i = 0; i < NK * D; i++) k[i] = 0.5 - 0.125 * (double)(i % 7), v[i] = i % 3;
        const size_t at = in_q ? 3 * D + (size_t)(place % 5) : 6 * D + (size_t)(place % 5);
        (in_q ? q : k)[at] = specials[which];
        v[2 * D + 1] = NAN; /* key 2, removed by the mask where masked */
        float mask[NQ * NK];
        for (size_t i = 0; i < NQ * NK; i++) mask[i] = i % NK == 2 || i < NK ? -INFINITY : 0.0f;
        double got[NQ * MAX_D_], want[NQ * MAX_D_];
        one_head(SDPA_BF16, SDPA_F32, NQ, NK, D, q, k, v, masked ? mask : NULL, got);
        one_head(SDPA_F32, SDPA_F32, NQ, NK, D, q, k, v, masked ? mask : NULL, want);
        for (size_t i = 0; i < NQ * D; i++) {
            const int row = (int)(i / D);
            cr_assert(isnan(got[i]) == isnan(want[i]) &&
                          (isnan(want[i]) || fabs(got[i] - want[i]) <= 1e-5 * 2 + 0x1p-25),
                      "special %g in %s at %zu, mask %d: out[%d][%zu] %g, f32 path %g",
                      specials[which], in_q ? "q" : "k", at, masked, row, i % D, got[i], want[i]);
            if (masked && row == 0)
                cr_assert(got[i] == 0.0 && !signbit(got[i]), "a row that sees no key: %g", got[i]);
            if (masked && which == 3) /* finite q and k: nothing is NaN */
                cr_assert(!isnan(got[i]), "the removed key's NaN leaked into row %d", row);
        }
        if (which == 2 && in_q)
            for (size_t c = 0; c < D; c++) cr_assert(isnan(got[3 * D + c]), "a NaN query's row");
    }
}

/* an f16 out takes inf for a float result past 65504, and its subnormals where they fall */
BACKEND_TEST(types, f16_out_overflows_to_inf_and_keeps_subnormals) {
    const size_t d = 8;
    float q[8] = {0}, k[16] = {0}, v[16];
    uint16_t out[8];
    sdpa_mha_desc desc;
    sdpa_mha_desc_dense(&desc, 1, 1, 1, 1, 2, d, d, 0.0f, 0);
    desc.out_type = SDPA_F16;
    for (size_t i = 0; i < 16; i++) v[i] = i % 2 ? 1e5f : -70000.0f;
    for (size_t i = 0; i < 8; i++) v[i] = (i % 3 == 0) ? 0x1p-20f : v[i];
    cr_assert_eq(sdpa_mha(&desc, out, q, k, v), SDPA_OK);
    for (size_t c = 0; c < 8; c++) {
        const double want = ((double)v[c] + v[8 + c]) / 2;
        const double got = ref_f16(out[c]);
        if (fabs(want) >= 65520)
            cr_assert(isinf(got) && (got > 0) == (want > 0), "col %zu: %g", c, got);
        else
            cr_assert(fabs(got - want) <= fabs(want) * 0x1p-11, "col %zu: %g want %g", c, got,
                      want);
    }
    /* a subnormal result */
    for (size_t i = 0; i < 16; i++) v[i] = 0x1p-20f;
    cr_assert_eq(sdpa_mha(&desc, out, q, k, v), SDPA_OK);
    for (size_t c = 0; c < 8; c++) cr_assert_eq(out[c], 0x0010, "0x1p-20 as f16: 0x%04x", out[c]);
}

/* ---- errors ---- */

Test(types, errors) {
    float buf[64] = {0};
    uint16_t out16[64];
    sdpa_mha_desc desc;
    sdpa_mha_desc_dense(&desc, 1, 1, 1, 2, 2, 4, 4, 0.0f, 0);
    desc.kv_type = 5;
    cr_assert_eq(sdpa_mha(&desc, buf, buf, buf, buf), SDPA_ERR_ARG);
    desc.kv_type = SDPA_F32;
    desc.q_type = SDPA_FP8_E4M3; /* the 8-bit types are for k and v only */
    cr_assert_eq(sdpa_mha(&desc, buf, buf, buf, buf), SDPA_ERR_ARG);
    desc.q_type = SDPA_F32;
    desc.out_type = SDPA_FP8_E5M2;
    cr_assert_eq(sdpa_mha(&desc, buf, buf, buf, buf), SDPA_ERR_ARG);
    desc.out_type = SDPA_F32;
    desc.kv_type = SDPA_F16;
    /* sdpa_mha_f32 takes f32 only */
    cr_assert_eq(sdpa_mha_f32(&desc, buf, buf, buf, buf), SDPA_ERR_ARG);
    desc.kv_type = 0;
    desc.q_type = 0xffffffffu;
    cr_assert_eq(sdpa_mha(&desc, buf, buf, buf, buf), SDPA_ERR_ARG);
    desc.q_type = 0;
    desc.reserved = 1;
    cr_assert_eq(sdpa_mha(&desc, buf, buf, buf, buf), SDPA_ERR_ARG);
    desc.reserved = 0;
    cr_assert_eq(sdpa_mha(NULL, buf, buf, buf, buf), SDPA_ERR_NULL);
    /* a 16-bit view's rows must fit the widening tiles */
    sdpa_mha_desc_dense(&desc, 1, 1, 1, 1, 1, 8193, 1, 0.0f, 0);
    desc.kv_type = SDPA_BF16;
    cr_assert_eq(sdpa_mha(&desc, buf, buf, buf, buf), SDPA_ERR_SIZE);
    /* extents count the element's bytes: 2^61 floats apart is past PTRDIFF_MAX */
    sdpa_mha_desc_dense(&desc, 1, 1, 1, 1, 2, 4, 4, 0.0f, 0);
    desc.k_stride[2] = (size_t)1 << 61;
    desc.kv_type = SDPA_F32;
    for (size_t i = 0; i < 64; i++) out16[i] = 0x1234;
    cr_assert_eq(sdpa_mha(&desc, out16, buf, buf, buf), SDPA_ERR_SIZE);
    cr_assert_eq(out16[0], 0x1234, "nothing written on error");
    /* a v1 descriptor through sdpa_mha is f32 */
    float q[4] = {1, 0, 0, 0}, k[4] = {1, 0, 0, 0}, v[4] = {2, 3, 4, 5}, out[4];
    sdpa_mha_desc_dense(&desc, 1, 1, 1, 1, 1, 4, 4, 0.0f, 0);
    desc.struct_size = (uint32_t)offsetof(sdpa_mha_desc, q_type);
    desc.q_type = desc.kv_type = desc.out_type = SDPA_F16; /* not read */
    cr_assert_eq(sdpa_mha(&desc, out, q, k, v), SDPA_OK);
    cr_assert(out[0] == 2 && out[3] == 5);
}
