/* Score modifiers (sdpa.h, sdpa_score_mods): windows, softcap, ALiBi, sinks and segments, alone
 * and together, on every backend, against a double-precision reference written here from the
 * header's formulas; their errors; the same bits at every thread count. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "reference.h"

typedef struct shape {
    size_t batch, heads_q, heads_kv, len_q, len_kv, d;
    uint32_t kv_type; /* q and out are f32 */
    int causal;
} shape;

typedef struct inputs {
    float *q, *k, *v;    /* k and v hold the kv_type's values as floats (exact) */
    uint16_t *k16, *v16; /* the same as kv_type, when 16-bit */
    float *slopes, *sinks;
    int32_t *qseg, *kseg;
} inputs;

static double value_of(uint32_t t, uint16_t h) { return t == SDPA_F16 ? ref_f16(h) : ref_bf16(h); }

static inputs make_inputs(const shape *s, uint64_t seed) {
    rng r = rng_seed(seed);
    inputs in;
    const size_t nq = s->batch * s->heads_q * s->len_q * s->d;
    const size_t nk = s->batch * s->heads_kv * s->len_kv * s->d;
    in.q = malloc(nq * sizeof(float));
    in.k = malloc(nk * sizeof(float));
    in.v = malloc(nk * sizeof(float));
    in.k16 = malloc(nk * sizeof(uint16_t));
    in.v16 = malloc(nk * sizeof(uint16_t));
    fill_normal(&r, in.q, nq);
    fill_normal(&r, in.k, nk);
    fill_normal(&r, in.v, nk);
    if (s->kv_type != SDPA_F32) { /* the reference reads the 16-bit values, decoded here */
        cr_assert_eq(sdpa_convert(in.k16, s->kv_type, in.k, SDPA_F32, nk), SDPA_OK);
        cr_assert_eq(sdpa_convert(in.v16, s->kv_type, in.v, SDPA_F32, nk), SDPA_OK);
        for (size_t i = 0; i < nk; i++) {
            in.k[i] = (float)value_of(s->kv_type, in.k16[i]);
            in.v[i] = (float)value_of(s->kv_type, in.v16[i]);
        }
    }
    in.slopes = malloc(s->heads_q * sizeof(float));
    in.sinks = malloc(s->heads_q * sizeof(float));
    for (size_t h = 0; h < s->heads_q; h++) {
        in.slopes[h] = (float)pow(2.0, -8.0 * (double)(h + 1) / (double)s->heads_q); /* as BLOOM */
        in.sinks[h] = (float)rng_uniform(&r, -1.0, 3.0);
    }
    in.qseg = malloc(s->batch * s->len_q * sizeof(int32_t));
    in.kseg = malloc(s->batch * s->len_kv * sizeof(int32_t));
    /* documents of a few tokens, the query rows being the last len_q positions */
    for (size_t b = 0; b < s->batch; b++) {
        for (size_t j = 0; j < s->len_kv; j++) in.kseg[b * s->len_kv + j] = (int32_t)(j / 7 + b);
        for (size_t i = 0; i < s->len_q; i++) {
            const ptrdiff_t p = (ptrdiff_t)i + (ptrdiff_t)s->len_kv - (ptrdiff_t)s->len_q;
            in.qseg[b * s->len_q + i] = p < 0 ? -1 : (int32_t)((size_t)p / 7 + b);
        }
    }
    return in;
}

static void free_inputs(inputs *in) {
    free(in->q);
    free(in->k);
    free(in->v);
    free(in->k16);
    free(in->v16);
    free(in->slopes);
    free(in->sinks);
    free(in->qseg);
    free(in->kseg);
}

/* The header's formulas for row i of (b, h), in double: out (d values) and the lse. */
static double ref_row(const shape *s, const inputs *in, const sdpa_score_mods *m, size_t b,
                      size_t h, size_t i, double scale, double *out) {
    const size_t hk = h / (s->heads_q / s->heads_kv), d = s->d;
    const float *q = in->q + ((b * s->heads_q + h) * s->len_q + i) * d;
    const ptrdiff_t p = (ptrdiff_t)i + (ptrdiff_t)s->len_kv - (ptrdiff_t)s->len_q;
    double *w = malloc((s->len_kv + 1) * sizeof(double)), hi = -INFINITY;
    for (size_t j = 0; j < s->len_kv; j++) {
        const ptrdiff_t jj = (ptrdiff_t)j;
        int sees = (!s->causal || jj <= p) && (m->window_left < 0 || jj >= p - m->window_left) &&
                   (m->window_right < 0 || jj <= p + m->window_right);
        if (m->q_segment)
            sees = sees && m->q_segment[b * s->len_q + i] == m->k_segment[b * s->len_kv + j];
        w[j] = -INFINITY;
        if (!sees) continue;
        double x = scale * ref_dot(q, in->k + ((b * s->heads_kv + hk) * s->len_kv + j) * d, d);
        if (m->softcap != 0.0f) x = m->softcap * tanh(x / m->softcap);
        if (m->alibi_slopes) x += m->alibi_slopes[h] * (double)(jj - p);
        w[j] = x;
        if (x > hi) hi = x;
    }
    const double sink = m->sinks ? m->sinks[h] : -INFINITY;
    if (sink > hi) hi = sink;
    for (size_t c = 0; c < d; c++) out[c] = 0.0;
    if (hi == -INFINITY) {
        free(w);
        return -INFINITY;
    }
    double den = exp(sink - hi);
    for (size_t j = 0; j < s->len_kv; j++) {
        if (w[j] == -INFINITY) continue;
        const double e = exp(w[j] - hi);
        den += e;
        const float *v = in->v + ((b * s->heads_kv + hk) * s->len_kv + j) * d;
        for (size_t c = 0; c < d; c++) out[c] += e * v[c];
    }
    for (size_t c = 0; c < d; c++) out[c] /= den;
    free(w);
    return hi + log(den);
}

/* sdpa_mha on the shape with mods (BHSD, f32 q and out, lse asked) into out and lse. */
static sdpa_status run(const shape *s, const inputs *in, const sdpa_score_mods *m, float *out,
                       float *lse) {
    sdpa_mha_desc desc;
    cr_assert_eq(sdpa_mha_desc_dense(&desc, s->batch, s->heads_q, s->heads_kv, s->len_q, s->len_kv,
                                     s->d, s->d, 0.0f, s->causal ? SDPA_CAUSAL : 0),
                 SDPA_OK);
    desc.kv_type = s->kv_type;
    desc.lse = lse;
    desc.lse_stride[1] = s->len_q;
    desc.lse_stride[0] = s->heads_q * s->len_q;
    cr_assert_eq(sdpa_mha_desc_set_mods(&desc, m), SDPA_OK);
    const int wide = s->kv_type != SDPA_F32;
    return sdpa_mha(&desc, out, in->q, wide ? (const void *)in->k16 : in->k,
                    wide ? (const void *)in->v16 : in->v);
}

/* One call against the reference: every output within 2e-5 (f32 math on exactly stored inputs;
 * the softcap's tanh through exp adds a few float ulps of its cap), every lse within 1e-5. */
static void check(const shape *s, const sdpa_score_mods *m, uint64_t seed, const char *what) {
    inputs in = make_inputs(s, seed);
    sdpa_score_mods mm = *m;
    if (m->alibi_slopes) mm.alibi_slopes = in.slopes;
    if (m->sinks) mm.sinks = in.sinks;
    if (m->q_segment) {
        mm.q_segment = in.qseg;
        mm.k_segment = in.kseg;
        mm.q_segment_stride = s->len_q;
        mm.k_segment_stride = s->len_kv;
    }
    const size_t rows = s->batch * s->heads_q * s->len_q, d = s->d;
    float *out = malloc(rows * d * sizeof(float)), *lse = malloc(rows * sizeof(float));
    double *want = malloc(d * sizeof(double));
    cr_assert_eq(run(s, &in, &mm, out, lse), SDPA_OK, "%s: %s", what, sdpa_last_error_detail());
    const double scale = 1.0 / sqrt((double)d);
    for (size_t b = 0; b < s->batch; b++)
        for (size_t h = 0; h < s->heads_q; h++)
            for (size_t i = 0; i < s->len_q; i++) {
                const size_t row = (b * s->heads_q + h) * s->len_q + i;
                const double want_lse = ref_row(s, &in, &mm, b, h, i, scale, want);
                cr_assert(lse[row] == want_lse ||
                              fabs(lse[row] - want_lse) <= 1e-5 * (1 + fabs(want_lse)),
                          "%s: lse of b %zu h %zu row %zu is %.9g, want %.9g", what, b, h, i,
                          lse[row], want_lse);
                for (size_t c = 0; c < d; c++)
                    cr_assert(fabs(out[row * d + c] - want[c]) <= 2e-5,
                              "%s: out b %zu h %zu row %zu col %zu is %.9g, want %.9g", what, b, h,
                              i, c, out[row * d + c], want[c]);
            }
    free(out);
    free(lse);
    free(want);
    free_inputs(&in);
}

static sdpa_score_mods none(void) {
    sdpa_score_mods m;
    memset(&m, 0, sizeof m);
    m.struct_size = sizeof m;
    m.window_left = m.window_right = -1;
    return m;
}

/* Stand-ins: check() swaps them for the inputs' arrays. */
static const float SOME[1] = {0.0f};
static const int32_t SEGS[1] = {0};

/* Each modifier alone and all together, on shapes that take each path: decode (grouped heads,
 * split over keys), a few rows, packed prefill blocks, causal with len_q above and below len_kv. */
BACKEND_TEST(mods, each_alone_and_together) {
    const shape shapes[] = {
        {1, 8, 2, 1, 1500, 64, SDPA_F32, 1},  {2, 4, 2, 5, 37, 16, SDPA_F32, 1},
        {1, 2, 1, 70, 150, 64, SDPA_F16, 1},  {1, 2, 2, 40, 30, 32, SDPA_BF16, 1},
        {1, 2, 1, 33, 300, 128, SDPA_F32, 0}, {1, 4, 4, 1, 700, 72, SDPA_BF16, 0},
    };
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const shape *s = &shapes[si];
        for (int which = 0; which < 7; which++) {
            sdpa_score_mods m = none();
            if (which == 0 || which == 6) m.window_left = 20;
            if (which == 1 || which == 6) m.softcap = 2.5f;
            if (which == 2 || which == 6) m.alibi_slopes = SOME;
            if (which == 3 || which == 6) m.sinks = SOME;
            if (which == 4 || which == 6) m.q_segment = m.k_segment = SEGS;
            if (which == 5) m.window_right = 3;
            char what[96];
            snprintf(what, sizeof what, "shape %zu, modifier %d", si, which);
            check(s, &m, 1000 + si * 10 + (uint64_t)which, what);
        }
    }
}

/* Windows of 0 and 1, and wider than the sequence; rows left with no key but a sink (out 0, lse
 * the sink), rows left with none at all (len_q > len_kv under causality). */
BACKEND_TEST(mods, window_edges_and_empty_rows) {
    const shape s = {1, 2, 1, 12, 9, 16, SDPA_F32, 1};
    const int64_t windows[] = {0, 1, 8, 30, 1000000};
    for (size_t w = 0; w < sizeof windows / sizeof windows[0]; w++)
        for (int sink = 0; sink < 2; sink++) {
            sdpa_score_mods m = none();
            m.window_left = windows[w];
            m.window_right = windows[w] == 1 ? 0 : -1;
            if (sink) m.sinks = SOME;
            char what[64];
            snprintf(what, sizeof what, "window %lld sink %d", (long long)windows[w], sink);
            check(&s, &m, 77 + w, what);
        }
    const shape wide = {1, 1, 1, 3, 3000, 32, SDPA_F16, 0}; /* split over keys, non-causal */
    sdpa_score_mods m = none();
    m.window_left = 2;
    m.window_right = 2; /* a window in the middle of a long row: most chunks see nothing */
    m.sinks = SOME;
    check(&wide, &m, 5, "window in the middle of 3000 keys");
}

/* A window's unseen keys are never read: a NaN value and an infinite key poison exactly the rows
 * whose windows hold them; every other row, including its neighbours in the same blocks of rows
 * and keys, matches the reference (packed prefill rows, f32 and f16 values, ALiBi on or off). */
BACKEND_TEST(mods, window_never_reads_unseen_keys) {
    const shape shapes[] = {{1, 1, 1, 200, 200, 32, SDPA_F32, 1},
                            {1, 1, 1, 200, 200, 32, SDPA_F16, 1}};
    enum { NAN_V = 90, INF_K = 131, LEFT = 20 };
    for (size_t si = 0; si < 2; si++)
        for (int alibi = 0; alibi < 2; alibi++) {
            const shape *s = &shapes[si];
            inputs in = make_inputs(s, 60 + si);
            const size_t d = s->d;
            for (size_t c = 0; c < d; c++) {
                in.v[NAN_V * d + c] = NAN;
                in.k[INF_K * d + c] = INFINITY;
            }
            if (s->kv_type != SDPA_F32) {
                cr_assert_eq(sdpa_convert(in.k16, s->kv_type, in.k, SDPA_F32, s->len_kv * d),
                             SDPA_OK);
                cr_assert_eq(sdpa_convert(in.v16, s->kv_type, in.v, SDPA_F32, s->len_kv * d),
                             SDPA_OK);
            }
            sdpa_score_mods m = none();
            m.window_left = LEFT;
            if (alibi) m.alibi_slopes = in.slopes;
            float *out = malloc(s->len_q * d * sizeof(float)), lse[200];
            double want[32];
            cr_assert_eq(run(s, &in, &m, out, lse), SDPA_OK);
            for (size_t i = 0; i < s->len_q; i++) {
                const int sees =
                    (i >= NAN_V && i <= NAN_V + LEFT) || (i >= INF_K && i <= INF_K + LEFT);
                if (sees) {
                    cr_assert(isnan(out[i * d]), "row %zu sees a bad key: %g", i, out[i * d]);
                    continue;
                }
                ref_row(s, &in, &m, 0, 0, i, 1.0 / sqrt((double)d), want);
                for (size_t c = 0; c < d; c++)
                    cr_assert(fabs(out[i * d + c] - want[c]) <= 2e-5,
                              "shape %zu alibi %d row %zu col %zu: %.9g, want %.9g", si, alibi, i,
                              c, out[i * d + c], want[c]);
            }
            free(out);
            free_inputs(&in);
        }
}

/* A key some rows of a block do not see, whose score would be far above every other, changes
 * nothing for them: were it in their max, the weights of the keys they see would vanish beside
 * it (a window's edge, on either side of the block, with and without ALiBi and a softcap). */
BACKEND_TEST(mods, window_unseen_score_stays_out_of_the_max) {
    const shape s = {1, 1, 1, 200, 200, 32, SDPA_F32, 1};
    enum { BIG_K = 100, LEFT = 40 };
    for (int extra = 0; extra < 3; extra++) {
        inputs in = make_inputs(&s, 70 + (uint64_t)extra);
        const size_t d = s.d;
        for (size_t i = 0; i < s.len_q; i++) in.q[i * d] = 1.0f;
        for (size_t c = 0; c < d; c++) in.k[BIG_K * d + c] = c == 0 ? 1000.0f : 0.0f;
        sdpa_score_mods m = none();
        m.window_left = LEFT;
        if (extra == 1) m.alibi_slopes = in.slopes;
        if (extra == 2) m.softcap = 100.0f;
        float *out = malloc(s.len_q * d * sizeof(float)), lse[200];
        double want[32];
        cr_assert_eq(run(&s, &in, &m, out, lse), SDPA_OK);
        for (size_t i = 0; i < s.len_q; i++) {
            ref_row(&s, &in, &m, 0, 0, i, 1.0 / sqrt((double)d), want);
            for (size_t c = 0; c < d; c++)
                cr_assert(fabs(out[i * d + c] - want[c]) <= 2e-5,
                          "extra %d row %zu col %zu: %.9g, want %.9g", extra, i, c, out[i * d + c],
                          want[c]);
        }
        free(out);
        free_inputs(&in);
    }
}

/* Same bits at 1 to 4 threads, with every modifier on the split decode and on prefill. */
BACKEND_TEST(mods, same_bits_at_every_thread_count) {
    const shape shapes[] = {{1, 8, 2, 1, 2500, 64, SDPA_F16, 1},
                            {1, 4, 2, 100, 300, 64, SDPA_F32, 1}};
    for (size_t si = 0; si < 2; si++) {
        const shape *s = &shapes[si];
        inputs in = make_inputs(s, 9);
        sdpa_score_mods m = none();
        m.window_left = 400;
        m.softcap = 4.0f;
        m.alibi_slopes = in.slopes;
        m.sinks = in.sinks;
        const size_t rows = s->batch * s->heads_q * s->len_q;
        float *first = malloc(rows * s->d * sizeof(float)),
              *out = malloc(rows * s->d * sizeof(float));
        float *lse = malloc(rows * sizeof(float));
        for (size_t t = 1; t <= 4; t++) {
            cr_assert_eq(sdpa_set_num_threads(t), SDPA_OK);
            cr_assert_eq(run(s, &in, &m, t == 1 ? first : out, lse), SDPA_OK);
            if (t > 1)
                cr_assert(!memcmp(first, out, rows * s->d * sizeof(float)),
                          "shape %zu: %zu threads give other bits than 1", si, t);
        }
        sdpa_set_num_threads(0);
        free(first);
        free(out);
        free(lse);
        free_inputs(&in);
    }
}

/* Every error of sdpa_score_mods, before any work: out untouched. */
Test(mods, errors_write_nothing) {
    const shape s = {1, 2, 1, 3, 5, 8, SDPA_F32, 0};
    inputs in = make_inputs(&s, 3);
    float out[2 * 3 * 8], lse[6];
    const float bad_slopes[2] = {0.5f, NAN}, bad_sinks[2] = {INFINITY, 0.0f};
    for (int e = 0; e < 9; e++) {
        sdpa_score_mods m = none();
        if (e == 0) m.struct_size = 8;
        if (e == 1) m.reserved = 1;
        if (e == 2) m.reserved2 = 1.0f;
        if (e == 3) m.window_left = -2;
        if (e == 4) m.softcap = -1.0f;
        if (e == 5) m.softcap = NAN;
        if (e == 6) m.q_segment = in.qseg;
        if (e == 7) m.alibi_slopes = bad_slopes;
        if (e == 8) m.sinks = bad_sinks;
        memset(out, 0x55, sizeof out);
        cr_assert_eq(run(&s, &in, &m, out, lse), SDPA_ERR_ARG, "error case %d", e);
        for (size_t i = 0; i < sizeof out / sizeof out[0]; i++)
            cr_assert_eq(((uint32_t *)out)[i], 0x55555555u, "case %d wrote out", e);
    }
    free_inputs(&in);
}

/* sdpa_mha_desc_dense and _bshd write the v2 descriptor only, so a caller compiled before the
 * v3 tail (whose struct ends at lse_stride) keeps its next bytes; sdpa_mha_desc_set_mods then
 * extends a descriptor to v3, and a modifier set without it is not read. */
Test(mods, desc_helpers_keep_to_the_callers_struct) {
    const size_t v2 = offsetof(sdpa_mha_desc, lse_stride) + 2 * sizeof(size_t);
    for (int bshd = 0; bshd < 2; bshd++) {
        union {
            sdpa_mha_desc d;
            unsigned char bytes[sizeof(sdpa_mha_desc)];
        } u;
        memset(&u, 0xab, sizeof u);
        sdpa_status (*fill)(sdpa_mha_desc *, size_t, size_t, size_t, size_t, size_t, size_t, size_t,
                            float, uint32_t) = bshd ? sdpa_mha_desc_bshd : sdpa_mha_desc_dense;
        cr_assert_eq(fill(&u.d, 1, 1, 1, 2, 2, 4, 4, 0.0f, 0), SDPA_OK);
        cr_assert_eq(u.d.struct_size, v2);
        for (size_t i = v2; i < sizeof u; i++)
            cr_assert_eq(u.bytes[i], 0xab, "byte %zu past the v2 descriptor was written", i);
        sdpa_score_mods m = none();
        cr_assert_eq(sdpa_mha_desc_set_mods(&u.d, &m), SDPA_OK);
        cr_assert_eq(u.d.struct_size, sizeof u.d);
        cr_assert(u.d.mods == &m && u.d.k_scale == 0.0f && u.d.v_scale == 0.0f);
    }
    cr_assert_eq(sdpa_mha_desc_set_mods(NULL, NULL), SDPA_ERR_NULL);
}

/* The softcap alone, read off the lse of rows over one key (lse = the capped score there, as
 * the row's sum is 1): q_i = x_i, k = 1, d = 1, scale 1, so each score is x_i exactly. Over
 * x/c from 1e-9 to 1e4 both signs, 0, +-inf and NaN, on the unpacked rows (3 rows) and the
 * fused tile (40 rows): relative error <= 2^-20 against tanh in double (docs/numerics.md),
 * plus 2^-22 for the lse's own log(l) of a sum of one weight that the fast exp may round
 * below 1. */
BACKEND_TEST(mods, softcap_within_its_bound) {
    enum { N = 200 };
    static float x[N], lse[N], out[N];
    const float caps[] = {30.0f, 1.0f, 1e-3f, 1e20f};
    const float k = 1.0f, v = 1.0f;
    for (size_t ci = 0; ci < sizeof caps / sizeof caps[0]; ci++) {
        const float c = caps[ci];
        for (size_t i = 0; i < N - 4; i++)
            x[i] = (float)((i % 2 ? -1.0 : 1.0) * c * pow(10.0, -9.0 + 13.0 * (double)i / N));
        x[N - 4] = 0.0f, x[N - 3] = INFINITY, x[N - 2] = -INFINITY, x[N - 1] = NAN;
        const size_t rows[] = {3, 40};
        for (size_t ri = 0; ri < 2; ri++) {
            const size_t done = N / rows[ri] * rows[ri];
            for (size_t r0 = 0; r0 < done; r0 += rows[ri]) {
                sdpa_mha_desc desc;
                cr_assert_eq(sdpa_mha_desc_dense(&desc, 1, 1, 1, rows[ri], 1, 1, 1, 1.0f, 0),
                             SDPA_OK);
                sdpa_score_mods m = none();
                m.softcap = c;
                cr_assert_eq(sdpa_mha_desc_set_mods(&desc, &m), SDPA_OK);
                desc.lse = lse + r0;
                desc.lse_stride[0] = desc.lse_stride[1] = rows[ri];
                cr_assert_eq(sdpa_mha_f32(&desc, out + r0, x + r0, &k, &v), SDPA_OK);
            }
            for (size_t i = 0; i < done; i++) {
                if (isnan(x[i])) {
                    cr_assert(isnan(lse[i]), "cap %g: softcap(NaN) gives lse %g", c, lse[i]);
                    continue;
                }
                const double want = c * tanh((double)x[i] / c);
                cr_assert(fabs(lse[i] - want) <= 0x1p-20 * fabs(want) + 0x1p-22,
                          "cap %g, %zu rows: softcap(%.9g) = %.9g, want %.9g", c, rows[ri], x[i],
                          lse[i], want);
            }
        }
    }
}

/* The gradients of row i of (b, h) with modifiers, by the formulas in double, added into dq
 * (this row), dk and dv (this kv head's rows) and *dsink: u = scale q.k, s = the stage's score,
 * P = e^(s - lse) (the sink in lse), dS = P (dout.v - D), D = dout.out, dU = dS (1 - tanh^2(u/c)),
 * dq = scale sum dU k, dk = scale sum dU q, dv = sum P dout, dsink = -P(sink) D. */
static void ref_row_grads(const shape *s, const inputs *in, const sdpa_score_mods *m,
                          const float *dout, size_t b, size_t h, size_t i, double scale, double *dq,
                          double *dk, double *dv, double *dsink) {
    const size_t hk = h / (s->heads_q / s->heads_kv), d = s->d;
    const size_t row = (b * s->heads_q + h) * s->len_q + i;
    const float *q = in->q + row * d, *g = dout + row * d;
    double *out = malloc(d * sizeof(double));
    const double lse = ref_row(s, in, m, b, h, i, scale, out);
    double dd = 0;
    for (size_t c = 0; c < d; c++) dd += g[c] * out[c];
    if (m->sinks && isfinite(lse)) *dsink -= exp(m->sinks[h] - lse) * dd;
    const ptrdiff_t p = (ptrdiff_t)i + (ptrdiff_t)s->len_kv - (ptrdiff_t)s->len_q;
    for (size_t j = 0; j < s->len_kv && isfinite(lse); j++) {
        const ptrdiff_t jj = (ptrdiff_t)j;
        int sees = (!s->causal || jj <= p) && (m->window_left < 0 || jj >= p - m->window_left) &&
                   (m->window_right < 0 || jj <= p + m->window_right);
        if (m->q_segment)
            sees = sees && m->q_segment[b * s->len_q + i] == m->k_segment[b * s->len_kv + j];
        if (!sees) continue;
        const size_t kr = (b * s->heads_kv + hk) * s->len_kv + j;
        const float *k = in->k + kr * d, *v = in->v + kr * d;
        const double u = scale * ref_dot(q, k, d);
        double x = u, chain = 1.0;
        if (m->softcap != 0.0f) {
            const double t = tanh(u / m->softcap);
            x = m->softcap * t;
            chain = 1.0 - t * t;
        }
        if (m->alibi_slopes) x += m->alibi_slopes[h] * (double)(jj - p);
        const double pr = exp(x - lse), dp = ref_dot(g, v, d);
        const double du = pr * (dp - dd) * chain;
        for (size_t c = 0; c < d; c++) {
            dq[c] += scale * du * k[c];
            dk[kr * d + c] += scale * du * q[c];
            dv[kr * d + c] += pr * g[c];
        }
    }
    free(out);
}

/* |got - want| <= 1e-4 of want's largest magnitude, over n values */
static void close_to(const float *got, const double *want, size_t n, const char *what) {
    double big = 1e-30;
    for (size_t i = 0; i < n; i++) big = fabs(want[i]) > big ? fabs(want[i]) : big;
    for (size_t i = 0; i < n; i++)
        cr_assert(fabs(got[i] - want[i]) <= 1e-4 * big, "%s[%zu] = %.9g, want %.9g (max %.3g)",
                  what, i, got[i], want[i], big);
}

/* sdpa_mha_backward_f32 of the shape's forward (out, lse) with mods, given dout, into dq, dk,
 * dv and dsinks (with m->sinks). */
static sdpa_status backward(const shape *s, const inputs *in, const sdpa_score_mods *m,
                            const float *out, float *lse, const float *dout, float *dq, float *dk,
                            float *dv, float *dsinks) {
    const size_t d = s->d;
    sdpa_mha_desc desc;
    sdpa_mha_desc_dense(&desc, s->batch, s->heads_q, s->heads_kv, s->len_q, s->len_kv, d, d, 0.0f,
                        s->causal ? SDPA_CAUSAL : 0);
    sdpa_mha_desc_set_mods(&desc, m);
    desc.lse = lse;
    desc.lse_stride[1] = s->len_q;
    desc.lse_stride[0] = s->heads_q * s->len_q;
    sdpa_mha_grads g;
    memset(&g, 0, sizeof g);
    g.struct_size = sizeof g;
    g.dq = dq, g.dk = dk, g.dv = dv, g.dout = dout, g.dsinks = m->sinks ? dsinks : NULL;
    memcpy(g.dq_stride, desc.q_stride, sizeof g.dq_stride);
    memcpy(g.dk_stride, desc.k_stride, sizeof g.dk_stride);
    memcpy(g.dv_stride, desc.v_stride, sizeof g.dv_stride);
    memcpy(g.dout_stride, desc.out_stride, sizeof g.dout_stride);
    return sdpa_mha_backward_f32(&desc, &g, in->q, in->k, in->v, out);
}

/* The backward with each modifier and all together: dq, dk, dv and dsinks against
 * ref_row_grads, f32, GQA, causal with len_q below and above len_kv. */
static void backward_case(const shape *s, const sdpa_score_mods *m0, uint64_t seed,
                          const char *what) {
    inputs in = make_inputs(s, seed);
    sdpa_score_mods m = *m0;
    if (m.alibi_slopes) m.alibi_slopes = in.slopes;
    if (m.sinks) m.sinks = in.sinks;
    if (m.q_segment) {
        m.q_segment = in.qseg, m.k_segment = in.kseg;
        m.q_segment_stride = s->len_q, m.k_segment_stride = s->len_kv;
    }
    const size_t rows = s->batch * s->heads_q * s->len_q, keys = s->batch * s->heads_kv * s->len_kv;
    const size_t d = s->d;
    float *out = malloc(rows * d * 4), *lse = malloc(rows * 4), *dout = malloc(rows * d * 4);
    float *dq = malloc(rows * d * 4), *dk = malloc(keys * d * 4), *dv = malloc(keys * d * 4);
    float dsinks[16];
    rng r = rng_seed(seed + 99);
    fill_normal(&r, dout, rows * d);
    cr_assert_eq(run(s, &in, &m, out, lse), SDPA_OK);
    cr_assert_eq(backward(s, &in, &m, out, lse, dout, dq, dk, dv, dsinks), SDPA_OK, "%s: %s", what,
                 sdpa_last_error_detail());
    double *wq = calloc(rows * d, 8), *wk = calloc(keys * d, 8), *wv = calloc(keys * d, 8);
    double ws[16] = {0};
    for (size_t b = 0; b < s->batch; b++)
        for (size_t h = 0; h < s->heads_q; h++)
            for (size_t i = 0; i < s->len_q; i++)
                ref_row_grads(s, &in, &m, dout, b, h, i, 1.0 / sqrt((double)d),
                              wq + ((b * s->heads_q + h) * s->len_q + i) * d, wk, wv, ws + h);
    char label[96];
    snprintf(label, sizeof label, "%s dq", what);
    close_to(dq, wq, rows * d, label);
    snprintf(label, sizeof label, "%s dk", what);
    close_to(dk, wk, keys * d, label);
    snprintf(label, sizeof label, "%s dv", what);
    close_to(dv, wv, keys * d, label);
    if (m.sinks) {
        snprintf(label, sizeof label, "%s dsinks", what);
        close_to(dsinks, ws, s->heads_q, label);
    }
    /* the same bits on one thread as on all */
    float *dq1 = malloc(rows * d * 4), *dk1 = malloc(keys * d * 4);
    cr_assert_eq(sdpa_set_num_threads(1), SDPA_OK);
    cr_assert_eq(backward(s, &in, &m, out, lse, dout, dq1, dk1, dv, dsinks), SDPA_OK);
    sdpa_set_num_threads(0);
    cr_assert(!memcmp(dq1, dq, rows * d * 4) && !memcmp(dk1, dk, keys * d * 4),
              "%s: one thread gives other bits", what);
    free(dq1), free(dk1);
    free(out), free(lse), free(dout), free(dq), free(dk), free(dv), free(wq), free(wk), free(wv);
    free_inputs(&in);
}

BACKEND_TEST(mods, backward_against_double) {
    const shape shapes[] = {{2, 4, 2, 9, 20, 16, SDPA_F32, 1},
                            {1, 2, 1, 40, 30, 32, SDPA_F32, 1},
                            {1, 2, 2, 70, 140, 64, SDPA_F32, 0},
                            {1, 1, 1, 3, 1100, 16, SDPA_F32, 1}}; /* keys in chunks */
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int which = 0; which < 7; which++) {
            sdpa_score_mods m = none();
            if (which == 0 || which == 6) m.window_left = 5;
            if (which == 1 || which == 6) m.softcap = 2.0f;
            if (which == 2 || which == 6) m.alibi_slopes = SOME;
            if (which == 3 || which == 6) m.sinks = SOME;
            if (which == 4 || which == 6) m.q_segment = m.k_segment = SEGS;
            if (which == 5) m.window_right = 2;
            char what[64];
            snprintf(what, sizeof what, "shape %zu modifier %d", si, which);
            backward_case(&shapes[si], &m, 300 + si * 10 + (uint64_t)which, what);
        }
}

/* L = sum over rows of dout . out, from the formulas in double (ref_row). */
static double ref_loss(const shape *s, const inputs *in, const sdpa_score_mods *m,
                       const float *dout) {
    double loss = 0.0, *o = malloc(s->d * sizeof(double));
    for (size_t b = 0; b < s->batch; b++)
        for (size_t h = 0; h < s->heads_q; h++)
            for (size_t i = 0; i < s->len_q; i++) {
                ref_row(s, in, m, b, h, i, 1.0 / sqrt((double)s->d), o);
                const float *g = dout + ((b * s->heads_q + h) * s->len_q + i) * s->d;
                for (size_t c = 0; c < s->d; c++) loss += g[c] * o[c];
            }
    free(o);
    return loss;
}

/* dL/dx by a central difference of ref_loss, x one of the inputs' floats. */
static double central_difference(const shape *s, inputs *in, const sdpa_score_mods *m,
                                 const float *dout, float *x) {
    const float x0 = *x, up = x0 + 1e-3f, down = x0 - 1e-3f;
    *x = up;
    const double l_up = ref_loss(s, in, m, dout);
    *x = down;
    const double l_down = ref_loss(s, in, m, dout);
    *x = x0;
    return (l_up - l_down) / ((double)up - (double)down);
}

/* The backward through every modifier at once, softcap foremost, against central differences
 * of the forward's formulas: checks the chain rule that ref_row_grads and the library share. */
BACKEND_TEST(mods, backward_by_central_differences) {
    const shape s = {1, 2, 1, 5, 9, 8, SDPA_F32, 1};
    inputs in = make_inputs(&s, 77);
    sdpa_score_mods m = none();
    m.softcap = 1.5f, m.window_left = 4, m.alibi_slopes = in.slopes, m.sinks = in.sinks;
    const size_t rows = s.heads_q * s.len_q, keys = s.len_kv, d = s.d;
    float *out = malloc(rows * d * 4), *lse = malloc(rows * 4), *dout = malloc(rows * d * 4);
    float *dq = malloc(rows * d * 4), *dk = malloc(keys * d * 4), *dv = malloc(keys * d * 4);
    float dsinks[2];
    rng r = rng_seed(78);
    fill_normal(&r, dout, rows * d);
    for (size_t i = 0; i < rows * d; i++) in.q[i] *= 3.0f; /* scores well into the softcap */
    cr_assert_eq(run(&s, &in, &m, out, lse), SDPA_OK);
    cr_assert_eq(backward(&s, &in, &m, out, lse, dout, dq, dk, dv, dsinks), SDPA_OK);
    struct {
        const char *name;
        float *x, *grad;
        size_t n;
    } wrt[] = {{"q", in.q, dq, rows * d},
               {"k", in.k, dk, keys * d},
               {"v", in.v, dv, keys * d},
               {"sinks", in.sinks, dsinks, s.heads_q}};
    for (size_t w = 0; w < 4; w++) {
        double fd[80], big = 1e-3;
        const size_t n = wrt[w].n < 80 ? wrt[w].n : 80;
        for (size_t i = 0; i < n; i++) {
            fd[i] = central_difference(&s, &in, &m, dout, wrt[w].x + i * (wrt[w].n / n));
            big = fabs(fd[i]) > big ? fabs(fd[i]) : big;
        }
        for (size_t i = 0; i < n; i++) {
            const float got = wrt[w].grad[i * (wrt[w].n / n)];
            cr_assert(fabs(got - fd[i]) <= 1e-4 * big, "d%s[%zu] = %.7g, central difference %.7g",
                      wrt[w].name, i * (wrt[w].n / n), got, fd[i]);
        }
    }
    free(out), free(lse), free(dout), free(dq), free(dk), free(dv);
    free_inputs(&in);
}

/* Two calls over disjoint keys, the sink given to one, merged through lse with
 * sdpa_attention_merge_f32, are the one call (numerics.md, "Merging through lse"): against the
 * formulas in double, as check() holds the one call to them. */
BACKEND_TEST(mods, split_calls_merge_through_lse) {
    const shape s = {1, 2, 1, 6, 40, 16, SDPA_F32, 0}, a = {1, 2, 1, 6, 17, 16, SDPA_F32, 0},
                b = {1, 2, 1, 6, 23, 16, SDPA_F32, 0};
    inputs in = make_inputs(&s, 31);
    sdpa_score_mods m = none();
    m.softcap = 3.0f, m.sinks = in.sinks;
    m.q_segment = in.qseg, m.k_segment = in.kseg; /* documents of 7 keys */
    const size_t rows = s.heads_q * s.len_q, d = s.d;
    float *out = malloc(rows * d * 4), *lse = malloc(rows * 4);
    float *out_b = malloc(rows * d * 4), *lse_b = malloc(rows * 4);
    inputs part = in; /* keys 0..16, with the sink */
    cr_assert_eq(run(&a, &part, &m, out, lse), SDPA_OK);
    part.k += a.len_kv * d, part.v += a.len_kv * d; /* keys 17..39, without it */
    sdpa_score_mods mb = m;
    mb.sinks = NULL, mb.k_segment = in.kseg + a.len_kv;
    cr_assert_eq(run(&b, &part, &mb, out_b, lse_b), SDPA_OK);
    cr_assert_eq(sdpa_attention_merge_f32(out, lse, out_b, lse_b, rows, d, d, d), SDPA_OK);
    double want[16];
    for (size_t h = 0; h < s.heads_q; h++)
        for (size_t i = 0; i < s.len_q; i++) {
            const size_t row = h * s.len_q + i;
            const double want_lse = ref_row(&s, &in, &m, 0, h, i, 1.0 / sqrt((double)d), want);
            cr_assert(fabs(lse[row] - want_lse) <= 1e-5 * (1 + fabs(want_lse)),
                      "h %zu row %zu: merged lse %.9g, want %.9g", h, i, lse[row], want_lse);
            for (size_t c = 0; c < d; c++)
                cr_assert(fabs(out[row * d + c] - want[c]) <= 4e-5,
                          "h %zu row %zu col %zu: merged %.9g, want %.9g", h, i, c,
                          out[row * d + c], want[c]);
        }
    free(out), free(lse), free(out_b), free(lse_b);
    free_inputs(&in);
}
