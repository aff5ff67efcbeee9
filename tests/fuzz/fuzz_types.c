/* Differential fuzzer for the 16-bit types: sdpa_mha with every combination of q, k/v and out
 * types against sdpa_mha_f32 on the same values widened to float (decoded here from the bit
 * patterns, independently of the library), on every backend this CPU runs.
 *
 * The input picks the shape (batch, GQA heads, len_q, len_kv, d_k, d_v: mostly <= 40, now and
 * then past 128, where a 16-bit view's blocks of keys are shorter), BHSD or BSHD, causal, a mask
 * (finite values and -inf), the types, and the 16-bit bit patterns (moderate values, with
 * subnormals, the largest finite, infinities and NaNs sprinkled in). It checks:
 *   - both calls return the same status, and on error out is untouched;
 *   - inputs are never written, and nothing outside out's array is (canaries, AddressSanitizer);
 *   - where q is f32 and d_k, d_v <= 128, the blocks and the query rows are the f32 path's, so
 *     out is bit for bit the f32 path's out rounded once to out's type (NaN where it is NaN);
 *     otherwise within the f32 bound plus that rounding, for inputs without specials. (A 16-bit
 *     q is widened into an aligned tile, and a dot's order of summation may follow its row's
 *     alignment: avx512's long dots start at a cache line. The bf16 dot add-ons (AMX, on by
 *     default, and AVX512_BF16), which form Q.K for bf16 q and k/v when on, add in their own
 *     order, and with specials may turn a score the f32 path finds infinite into NaN or back:
 *     tests/test_types.c holds their special-value rules. Run with SDPA_AMX and SDPA_BF16_DOT
 *     each on alone, and both off, to cover every path.)
 *
 * K and V may also be 8-bit (fp8 e4m3 or e5m2, with a power-of-two k_scale and v_scale now and
 * then), compared against the f32 path on their values times the scales: bit for bit where the
 * scales are 1, within the bound otherwise. e4m3's values go to the f32 path at 2^-8 with the
 * scale at 2^8 and out at 2^8 after, as the library reads them (docs/numerics.md): the 2^-8
 * moves where a product underflows (which can tip a tie in a sum) and where a dot overflows.
 *
 * Run it with scripts/fuzz; a crash file it leaves reproduces with build-fuzz/fuzz_types. */
#include "fuzz_common.h"
#include "reference.h"

#define MAX_LEN 40
#define MAX_D   40

/* the value of a 16-bit pattern of type t, from its fields (reference.c), exact in a float */
static float decode(uint16_t h, sdpa_dtype t) {
    return (float)(t == SDPA_F16 ? ref_f16(h) : ref_bf16(h));
}

/* the value of an 8-bit pattern of type t, from its fields (OCP: e4m3 has no inf, S.1111.111 is
   NaN; e5m2 is IEEE-like), exact in a float */
static float decode8(uint8_t c, sdpa_dtype t) {
    const int mbits = t == SDPA_FP8_E4M3 ? 3 : 2, bias = t == SDPA_FP8_E4M3 ? 7 : 15;
    const int e = c >> mbits & (t == SDPA_FP8_E4M3 ? 15 : 31), m = c & ((1 << mbits) - 1);
    const double sign = c & 0x80 ? -1.0 : 1.0;
    if (t == SDPA_FP8_E4M3 && (c & 0x7f) == 0x7f) return NAN;
    if (t == SDPA_FP8_E5M2 && e == 31) return m ? NAN : (float)(sign * INFINITY);
    if (e == 0) return (float)(sign * ldexp(m, 1 - bias - mbits));
    return (float)(sign * ldexp((1 << mbits) + m, e - bias - mbits));
}

/* an 8-bit pattern: mostly a moderate value, sometimes a special (NaN, e5m2's inf, a
   subnormal, the largest finite) */
static uint8_t pattern8(fuzz_reader *r, sdpa_dtype t, int specials) {
    const int mbits = t == SDPA_FP8_E4M3 ? 3 : 2, bias = t == SDPA_FP8_E4M3 ? 7 : 15;
    const uint8_t sign = fuzz_u8(r) & 0x80, m = fuzz_u8(r) & ((1u << mbits) - 1);
    const uint8_t c = specials ? fuzz_u8(r) : 0;
    if (c >= 250) return t == SDPA_FP8_E4M3 ? sign | 0x7f : sign | (c == 250 ? 0x7c : 0x7d | m);
    if (c >= 245) return sign | m;                                     /* subnormal or zero */
    if (c >= 242) return sign | (t == SDPA_FP8_E4M3 ? 0x7e : 0x7b);    /* the largest */
    return sign | (uint8_t)((bias - 4 + fuzz_u8(r) % 6) << mbits) | m; /* |x| in [2^-4, 4) */
}

/* a 16-bit pattern: mostly a moderate value (|x| in [2^-4, 4)), sometimes a special */
static uint16_t pattern(fuzz_reader *r, sdpa_dtype t, int specials) {
    const int mbits = t == SDPA_F16 ? 10 : 7, bias = t == SDPA_F16 ? 15 : 127;
    const uint16_t sign = fuzz_u8(r) & 1 ? 0x8000 : 0;
    const uint16_t m = (uint16_t)((fuzz_u8(r) << 8 | fuzz_u8(r)) & ((1u << mbits) - 1));
    const uint8_t c = specials ? fuzz_u8(r) : 0;
    const uint16_t einf = (uint16_t)((1u << (15 - mbits)) - 1);
    if (c >= 250) return sign | (uint16_t)(einf << mbits) | (c == 250 ? 0 : m | 1); /* inf, NaN */
    if (c >= 245) return sign | m;                                                  /* subnormal */
    if (c >= 242) return sign | (uint16_t)((einf - 1) << mbits) | m;                /* huge */
    return sign | (uint16_t)((bias - 4 + fuzz_u8(r) % 6) << mbits) | m;
}

static size_t pick_len(fuzz_reader *r) {
    uint8_t b = fuzz_u8(r);
    if (b < 12) return b % 3;
    if (b >= 250) return 65 + (size_t)b % 3 * 30; /* more than one block of keys */
    return (size_t)b % (MAX_LEN + 1);
}

static size_t pick_d(fuzz_reader *r) {
    uint8_t b = fuzz_u8(r);
    if (b >= 248) return 120 + (size_t)b % 4 * 60; /* around and past 128 */
    return 1 + (size_t)b % MAX_D;
}

static size_t size_of(sdpa_dtype t) { return t == SDPA_F32 ? 4 : t <= SDPA_BF16 ? 2 : 1; }

/* n elements of type t at the end of a fenced array (so a write past them hits the fence) */
typedef struct typed {
    fenced f;
    void *p;
} typed;
static typed typed_alloc(size_t n, sdpa_dtype t, size_t offset) {
    typed a;
    const size_t floats = (n * size_of(t) + 3) / 4;
    a.f = fenced_alloc(floats, offset);
    a.p = (char *)(a.f.p + floats) - n * size_of(t);
    return a;
}

static void run_case(fuzz_reader *r) {
    const uint8_t sel = fuzz_u8(r), shape = fuzz_u8(r), types = fuzz_u8(r);
    const size_t batch = 1 + (shape & 1), heads_kv = 1 + (shape >> 1 & 1);
    const size_t heads_q = heads_kv * (1 + (shape >> 2) % 3);
    size_t len_q = pick_len(r);
    const size_t len_kv = pick_len(r), d_k = pick_d(r), d_v = pick_d(r);
    if (sel & 1) len_q = 1; /* decode: the grouped-heads path */
    const int bshd = sel >> 1 & 1, causal = sel >> 2 & 1, masked = sel >> 3 & 1;
    const int specials = sel >> 4 & 1;
    const sdpa_dtype qt = (sdpa_dtype)(types % 3), kt = (sdpa_dtype)(types / 3 % 5);
    const sdpa_dtype ot = (sdpa_dtype)(types / 15 % 3);
    /* 8-bit K/V: k_scale and v_scale 1 (as 0) or powers of two, which the f32 path multiplies
       into its copies (exactly) */
    const int fp8 = kt >= SDPA_FP8_E4M3, scaled = fp8 && sel >> 5 & 1;
    const float k_scale = scaled ? ldexpf(1.0f, fuzz_u8(r) % 7 - 3) : 0.0f;
    const float v_scale = scaled ? ldexpf(1.0f, fuzz_u8(r) % 7 - 3) : 0.0f;
    const int e4m3_at = kt == SDPA_FP8_E4M3 && !scaled;
    const float at = e4m3_at ? 0x1p-8f : 1.0f;
    sdpa_set_exp_mode(sel >> 7 ? "sleef" : "fast");

    sdpa_mha_desc desc;
    (bshd ? sdpa_mha_desc_bshd : sdpa_mha_desc_dense)(
        &desc, batch, heads_q, heads_kv, len_q, len_kv, d_k, d_v, 0.0f, causal ? SDPA_CAUSAL : 0);
    const size_t nq = batch * heads_q * len_q * d_k, nk = batch * heads_kv * len_kv * d_k;
    const size_t nv = batch * heads_kv * len_kv * d_v, no = batch * heads_q * len_q * d_v;
    typed q = typed_alloc(nq, qt, 1), k = typed_alloc(nk, kt, 2), v = typed_alloc(nv, kt, 3);
    typed out = typed_alloc(no, ot, 0);
    /* q32 at q's alignment: a dot's order of summation may follow its query row's */
    fenced q32 = fenced_alloc(nq, 1), k32 = fenced_alloc(nk, 0), v32 = fenced_alloc(nv, 0);
    fenced o32 = fenced_alloc(no, 0), expect = fenced_alloc(no, 0);
    typed inputs[3] = {q, k, v};
    fenced *wide[3] = {&q32, &k32, &v32};
    const sdpa_dtype in_types[3] = {qt, kt, kt};
    int any_special = 0;
    for (int a = 0; a < 3; a++)
        for (size_t i = 0; i < wide[a]->n; i++) {
            float x;
            if (in_types[a] == SDPA_F32) {
                x = fuzz_float(r, 2.0f);
                if (!specials) x = isfinite(x) && fabsf(x) < 4 ? x : 0.5f;
                ((float *)inputs[a].p)[i] = x;
            } else if (in_types[a] >= SDPA_FP8_E4M3) {
                const uint8_t c = pattern8(r, in_types[a], specials);
                ((uint8_t *)inputs[a].p)[i] = c;
                x = decode8(c, in_types[a]) * (scaled ? (a == 1 ? k_scale : v_scale) : at);
            } else {
                uint16_t h = pattern(r, in_types[a], specials);
                ((uint16_t *)inputs[a].p)[i] = h;
                x = decode(h, in_types[a]);
            }
            any_special |= !isfinite(x) || fabsf(x) > 4;
            wide[a]->p[i] = x;
        }
    float *mask = NULL;
    if (masked) {
        mask = malloc((len_q * len_kv + 1) * sizeof *mask);
        for (size_t i = 0; i < len_q * len_kv; i++)
            mask[i] = fuzz_u8(r) < 64 ? -INFINITY : (float)(fuzz_u8(r) % 9) * 0.25f - 1.0f;
        sdpa_mha_desc_set_mask(&desc, mask, 0, 0, len_kv);
    }
    sdpa_mha_desc desc32 = desc;
    if (e4m3_at) desc32.scale = (float)(1.0 / sqrt((double)d_k)) / at;
    /* copies of the inputs, to check they are never written */
    const size_t in_bytes[3] = {nq * size_of(qt), nk * size_of(kt), nv * size_of(kt)};
    void *saved[3];
    for (int a = 0; a < 3; a++) {
        saved[a] = malloc(in_bytes[a] + 1);
        memcpy(saved[a], inputs[a].p, in_bytes[a]);
    }

    for (size_t b = 0; next_backend(&b);) {
        const size_t out_bytes = no * size_of(ot);
        memset(out.p, 0x5a, out_bytes);
        sdpa_mha_desc typed_desc = desc;
        typed_desc.q_type = qt, typed_desc.kv_type = kt, typed_desc.out_type = ot;
        typed_desc.struct_size = sizeof typed_desc; /* the v3 tail: no modifiers, the scales */
        typed_desc.mods = NULL, typed_desc.k_scale = k_scale, typed_desc.v_scale = v_scale;
        const sdpa_status st = sdpa_mha(&typed_desc, out.p, q.p, k.p, v.p);
        const sdpa_status st32 = sdpa_mha_f32(&desc32, o32.p, q32.p, k32.p, v32.p);
        for (size_t i = 0; st32 == SDPA_OK && i < no; i++) o32.p[i] /= at;
        FUZZ_CHECK(st == st32, "status %d, the f32 path's %d", st, st32);
        for (int a = 0; a < 3; a++)
            FUZZ_CHECK(memcmp(saved[a], inputs[a].p, in_bytes[a]) == 0, "input %d written", a);
        fenced_check(&out.f, "out");
        if (st != SDPA_OK) {
            for (size_t i = 0; i < out_bytes; i++)
                FUZZ_CHECK(((unsigned char *)out.p)[i] == 0x5a, "out written on error %d", st);
            continue;
        }
        /* the f32 path's out, rounded once to out's type, then both as floats */
        float *got = o32.p;
        if (ot != SDPA_F32) {
            FUZZ_CHECK(sdpa_convert(expect.p, ot, o32.p, SDPA_F32, no) == SDPA_OK, "convert");
            FUZZ_CHECK(sdpa_convert(o32.p, SDPA_F32, expect.p, ot, no) == SDPA_OK, "convert");
            FUZZ_CHECK(sdpa_convert(expect.p, SDPA_F32, out.p, ot, no) == SDPA_OK, "convert");
            got = expect.p; /* the typed out, widened; o32 holds the f32 path's, rounded */
        } else {
            memcpy(expect.p, out.p, no * sizeof(float));
            got = expect.p;
        }
        const int same_blocks = qt == SDPA_F32 && d_k <= 128 && d_v <= 128 && !scaled;
        const double half_ulp = ot == SDPA_F16 ? 0x1p-11 : ot == SDPA_BF16 ? 0x1p-8 : 0.0;
        /* out at 2^-8 rounds where it falls below FLT_MIN, and out takes its 2^8 after */
        const double slack = e4m3_at ? 0x1p-100 : 0.0;
        for (size_t i = 0; i < no; i++) {
            const float a = got[i], e = o32.p[i];
            if (same_blocks) {
                FUZZ_CHECK((isnan(a) && isnan(e)) || fuzz_to_bits(a) == fuzz_to_bits(e) ||
                               fabs((double)a - e) <= slack,
                           "q %d kv %d out %d, b%zu h%zu/%zu q%zu k%zu d%zu/%zu: out[%zu] %a, "
                           "the f32 path's %a",
                           qt, kt, ot, batch, heads_q, heads_kv, len_q, len_kv, d_k, d_v, i, a, e);
            } else if (!any_special) {
                const double tol = 2 * 1e-5 * 4 + 2 * half_ulp * fabs(e) + 0x1p-24;
                FUZZ_CHECK(isnan(a) == isnan(e) && (isnan(a) || fabs((double)a - e) <= tol),
                           "d%zu/%zu: out[%zu] %a, the f32 path's %a", d_k, d_v, i, a, e);
            }
        }
    }
    for (int a = 0; a < 3; a++) free(saved[a]);
    free(mask);
    fenced_free(&q.f), fenced_free(&k.f), fenced_free(&v.f), fenced_free(&out.f);
    fenced_free(&q32), fenced_free(&k32), fenced_free(&v32), fenced_free(&o32);
    fenced_free(&expect);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_reader r = fuzz_reader_init(data, size);
    run_case(&r);
    return 0;
}
