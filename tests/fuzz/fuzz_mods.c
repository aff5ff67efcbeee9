/* Differential fuzzer for the score modifiers (sdpa_score_mods): sdpa_mha and its backward with
 * windows, softcap, ALiBi, sinks and segments drawn at random, against the header's formulas
 * written here in double, on every backend this CPU runs.
 *
 * The input picks the shape (batch, GQA heads, len_q and len_kv up to 40, now and then keys in
 * more than one 512-key chunk, d up to 32), causal, the K/V type, each modifier (windows of
 * -1, 0, 1, a few, or INT64_MAX on either side; a softcap from 1e-3 to 1e30; slopes of either
 * sign; sinks from -inf to 30; segments per batch or broadcast) and, now and then, one bad
 * field. It checks:
 *   - a bad field is SDPA_ERR_ARG and writes nothing;
 *   - every output within 4e-5 * max(1, max|v|) of the reference (values are exact in every
 *     K/V type), and lse within 1e-5 relative, or -inf (no key, no sink) exactly;
 *   - NaN in the keys and values no row sees never shows;
 *   - the same bits at 1 and 2 threads;
 *   - for f32, the backward's dq, dk, dv and dsinks within 1e-4 of their largest magnitude of
 *     the gradients written here from the formulas.
 *
 * Run it with scripts/fuzz; a crash file it leaves reproduces with build-fuzz/fuzz_mods. */
#include "fuzz_common.h"
#include "reference.h"

#define MAX_LEN 40
#define MAX_D   32

typedef struct mcase {
    size_t batch, hq, hk, len_q, len_kv, d;
    uint32_t kv_type;
    int causal, bad;
    sdpa_score_mods m;
    float *q, *k, *v; /* exact values of the K/V type, NaN where no row sees a key */
    void *k_typed, *v_typed;
    float slopes[6], sinks[6];
    int32_t qseg[2 * MAX_LEN], kseg[2 * 600];
} mcase;

/* An ordinary value k/64 with |k| <= 128: exact in f32, f16 and bf16. */
static float ordinary(fuzz_reader *r) { return (float)((int)(fuzz_u8(r) % 257) - 128) / 64.0f; }

static int64_t pick_window(fuzz_reader *r) {
    const uint8_t b = fuzz_u8(r);
    if (b < 96) return -1;
    if (b < 112) return b % 2; /* 0 or 1 */
    if (b < 120) return INT64_MAX;
    return b % 24;
}

static float pick_softcap(fuzz_reader *r) {
    static const float CAPS[] = {0.0f, 0.0f, 0.0f, 1e-3f, 0.5f, 2.0f, 5.0f, 30.0f, 50.0f, 1e30f};
    return CAPS[fuzz_u8(r) % (sizeof CAPS / sizeof CAPS[0])];
}

/* Does row i of batch b see key j: causal, the window, the segments. */
static int sees(const mcase *c, size_t b, size_t i, size_t j) {
    const int64_t p = (int64_t)i + (int64_t)c->len_kv - (int64_t)c->len_q, jj = (int64_t)j;
    if (c->causal && jj > p) return 0;
    if (c->m.window_left >= 0 && jj < p - (c->m.window_left > 1 << 30 ? 1 << 30 : c->m.window_left))
        return 0;
    if (c->m.window_right >= 0 &&
        jj > p + (c->m.window_right > 1 << 30 ? 1 << 30 : c->m.window_right))
        return 0;
    if (c->m.q_segment)
        return c->m.q_segment[b * c->m.q_segment_stride + i] ==
               c->m.k_segment[b * c->m.k_segment_stride + j];
    return 1;
}

/* One bad field of the modifiers, which must be SDPA_ERR_ARG. */
static void spoil(fuzz_reader *r, mcase *c) {
    switch (fuzz_u8(r) % 8) {
    case 0: c->m.window_left = -2 - fuzz_u8(r); break;
    case 1: c->m.window_right = INT64_MIN; break;
    case 2: c->m.softcap = fuzz_u8(r) & 1 ? -1.0f : NAN; break;
    case 3: c->m.softcap = INFINITY; break;
    case 4: c->m.reserved = 1; break;
    case 5: c->m.q_segment = c->qseg, c->m.k_segment = NULL; break;
    case 6: c->m.sinks = c->sinks, c->sinks[0] = fuzz_u8(r) & 1 ? NAN : INFINITY; break;
    default: c->m.struct_size = 8; break;
    }
    c->bad = 1;
}

static void read_mods(fuzz_reader *r, mcase *c) {
    const uint8_t which = fuzz_u8(r);
    memset(&c->m, 0, sizeof c->m);
    c->m.struct_size = sizeof c->m;
    c->m.window_left = pick_window(r), c->m.window_right = pick_window(r);
    if (which & 1) c->m.softcap = pick_softcap(r);
    for (size_t h = 0; h < c->hq; h++) {
        c->slopes[h] = (float)((int)fuzz_u8(r) - 128) / 128.0f;
        c->sinks[h] = fuzz_u8(r) < 16 ? -INFINITY : (float)(fuzz_u8(r) % 36) - 6.0f;
    }
    if (which & 2) c->m.alibi_slopes = c->slopes;
    if (which & 4) c->m.sinks = c->sinks;
    if (which & 8) { /* documents of 1 to 8 tokens, the rows at the last len_q positions */
        const size_t doc = 1 + (which >> 4) % 8, bcast = (which >> 7) & 1;
        for (size_t b = 0; b < c->batch; b++) {
            for (size_t j = 0; j < c->len_kv; j++) c->kseg[b * c->len_kv + j] = (int32_t)(j / doc);
            for (size_t i = 0; i < c->len_q; i++) {
                const int64_t p = (int64_t)i + (int64_t)c->len_kv - (int64_t)c->len_q;
                c->qseg[b * c->len_q + i] = p < 0 ? -1 : (int32_t)((size_t)p / doc);
            }
        }
        c->m.q_segment = c->qseg, c->m.k_segment = c->kseg;
        c->m.q_segment_stride = bcast ? 0 : c->len_q;
        c->m.k_segment_stride = bcast ? 0 : c->len_kv;
    }
    if (fuzz_u8(r) < 16) spoil(r, c);
}

static size_t type_size(uint32_t t) { return t == SDPA_F32 ? 4 : 2; }

/* The inputs, with NaN in the keys and values no row of their batch sees. */
static void read_values(fuzz_reader *r, mcase *c) {
    const size_t nq = c->batch * c->hq * c->len_q * c->d, nk = c->batch * c->hk * c->len_kv * c->d;
    c->q = malloc((nq + 1) * 4), c->k = malloc((nk + 1) * 4), c->v = malloc((nk + 1) * 4);
    c->k_typed = malloc(nk * 4 + 1), c->v_typed = malloc(nk * 4 + 1);
    for (size_t i = 0; i < nq; i++) c->q[i] = ordinary(r);
    for (size_t i = 0; i < nk; i++) c->k[i] = ordinary(r), c->v[i] = ordinary(r);
    for (size_t b = 0; b < c->batch && !c->bad; b++)
        for (size_t j = 0; j < c->len_kv; j++) {
            int seen = 0;
            for (size_t i = 0; i < c->len_q && !seen; i++) seen = sees(c, b, i, j);
            if (seen) continue;
            for (size_t h = 0; h < c->hk; h++)
                for (size_t x = 0; x < c->d; x++) {
                    const size_t at = ((b * c->hk + h) * c->len_kv + j) * c->d + x;
                    c->k[at] = c->v[at] = NAN;
                }
        }
    FUZZ_CHECK(sdpa_convert(c->k_typed, c->kv_type, c->k, SDPA_F32, nk) == SDPA_OK, "convert");
    FUZZ_CHECK(sdpa_convert(c->v_typed, c->kv_type, c->v, SDPA_F32, nk) == SDPA_OK, "convert");
}

static void read_case(fuzz_reader *r, mcase *c) {
    memset(c, 0, sizeof *c);
    const uint8_t sel = fuzz_u8(r);
    c->batch = 1 + (sel & 1), c->hk = 1 + (sel >> 1 & 1), c->hq = c->hk * (1 + (sel >> 2) % 3);
    c->causal = sel >> 4 & 1;
    c->kv_type = (sel >> 5) % 3;
    c->len_q = fuzz_u8(r) % (MAX_LEN + 1);
    c->len_kv = fuzz_u8(r) % (MAX_LEN + 1);
    if (sel >> 7) c->len_q = 1 + c->len_q % 3, c->len_kv = 500 + c->len_kv * 2; /* chunks */
    c->d = 1 + fuzz_u8(r) % MAX_D;
    read_mods(r, c);
    read_values(r, c);
}

/* Row i of (b, h) by the formulas, in double: out (d values) and lse; *max_v the largest |v|
   among the keys it sees. */
static double ref_row(const mcase *c, size_t b, size_t h, size_t i, double *out, double *max_v) {
    const size_t hk = h / (c->hq / c->hk), d = c->d;
    const float *q = c->q + ((b * c->hq + h) * c->len_q + i) * d;
    const double scale = 1.0 / sqrt((double)d);
    const int64_t p = (int64_t)i + (int64_t)c->len_kv - (int64_t)c->len_q;
    double *w = malloc((c->len_kv + 1) * sizeof(double)), hi = -INFINITY;
    for (size_t j = 0; j < c->len_kv; j++) {
        w[j] = -INFINITY;
        if (!sees(c, b, i, j)) continue;
        double x = scale * ref_dot(q, c->k + ((b * c->hk + hk) * c->len_kv + j) * d, d);
        if (c->m.softcap != 0.0f) x = c->m.softcap * tanh(x / c->m.softcap);
        if (c->m.alibi_slopes) x += c->m.alibi_slopes[h] * (double)((int64_t)j - p);
        w[j] = x;
        hi = x > hi ? x : hi;
    }
    const double sink = c->m.sinks ? c->m.sinks[h] : -INFINITY;
    hi = sink > hi ? sink : hi;
    *max_v = 0.0;
    for (size_t x = 0; x < d; x++) out[x] = 0.0;
    if (hi == -INFINITY) {
        free(w);
        return -INFINITY;
    }
    double den = exp(sink - hi);
    for (size_t j = 0; j < c->len_kv; j++) {
        if (w[j] == -INFINITY) continue;
        const double e = exp(w[j] - hi);
        const float *v = c->v + ((b * c->hk + hk) * c->len_kv + j) * d;
        den += e;
        for (size_t x = 0; x < d; x++) {
            out[x] += e * v[x];
            *max_v = fabs(v[x]) > *max_v ? fabs(v[x]) : *max_v;
        }
    }
    for (size_t x = 0; x < d; x++) out[x] /= den;
    free(w);
    return hi + log(den);
}

static void describe(const mcase *c, char *s, size_t n) {
    snprintf(s, n,
             "b%zu h%zu/%zu q%zu k%zu d%zu causal %d type %u window %lld/%lld softcap %g alibi %d "
             "sinks %d segments %d (stride %zu)",
             c->batch, c->hq, c->hk, c->len_q, c->len_kv, c->d, c->causal, c->kv_type,
             (long long)c->m.window_left, (long long)c->m.window_right, (double)c->m.softcap,
             c->m.alibi_slopes != NULL, c->m.sinks != NULL, c->m.q_segment != NULL,
             c->m.q_segment_stride);
}

/* The forward at `threads` threads into out and lse (BHSD). */
static sdpa_status forward(const mcase *c, size_t threads, float *out, float *lse) {
    sdpa_mha_desc desc;
    sdpa_mha_desc_dense(&desc, c->batch, c->hq, c->hk, c->len_q, c->len_kv, c->d, c->d,
                        SDPA_DEFAULT_SCALE, c->causal ? SDPA_CAUSAL : 0);
    desc.kv_type = c->kv_type;
    desc.lse = lse;
    desc.lse_stride[1] = c->len_q, desc.lse_stride[0] = c->hq * c->len_q;
    const sdpa_status set = sdpa_mha_desc_set_mods(&desc, &c->m);
    FUZZ_CHECK(set == SDPA_OK, "set_mods: %s", sdpa_last_error_detail());
    FUZZ_CHECK(sdpa_set_num_threads(threads) == SDPA_OK, "threads");
    const int wide = c->kv_type != SDPA_F32;
    const sdpa_status st = sdpa_mha(&desc, out, c->q, wide ? c->k_typed : (void *)c->k,
                                    wide ? c->v_typed : (void *)c->v);
    sdpa_set_num_threads(0);
    return st;
}

static void check_forward(const mcase *c, const float *out, const float *lse) {
    char what[256];
    describe(c, what, sizeof what);
    double ref[MAX_D], max_v;
    for (size_t b = 0; b < c->batch; b++)
        for (size_t h = 0; h < c->hq; h++)
            for (size_t i = 0; i < c->len_q; i++) {
                const size_t row = (b * c->hq + h) * c->len_q + i;
                const double want = ref_row(c, b, h, i, ref, &max_v);
                FUZZ_CHECK(want == -INFINITY ? lse[row] == -INFINITY
                                             : fabs(lse[row] - want) <= 1e-5 * (1 + fabs(want)),
                           "%s: lse of b%zu h%zu row %zu %.9g, want %.9g", what, b, h, i, lse[row],
                           want);
                const double bound = 4e-5 * (max_v > 1 ? max_v : 1);
                for (size_t x = 0; x < c->d; x++)
                    FUZZ_CHECK(fabs(out[row * c->d + x] - ref[x]) <= bound,
                               "%s: out b%zu h%zu row %zu col %zu %.9g, want %.9g", what, b, h, i,
                               x, out[row * c->d + x], ref[x]);
            }
}

/* The gradients of row i of (b, h), added into dq (this row's d values), dk, dv and dsink[h]:
   u = scale q.k, x = the stage's score, P = e^(x - lse), dU = P (dout.v - dout.out) (1 - t^2)
   with t = tanh(u / softcap) (1 without one), dsink = -e^(sink - lse) dout.out. */
static void ref_row_grads(const mcase *c, const float *dout, size_t b, size_t h, size_t i,
                          double *dq, double *dk, double *dv, double *dsink) {
    const size_t hk = h / (c->hq / c->hk), d = c->d, row = (b * c->hq + h) * c->len_q + i;
    const float *q = c->q + row * d, *g = dout + row * d;
    const double scale = 1.0 / sqrt((double)d);
    const int64_t p = (int64_t)i + (int64_t)c->len_kv - (int64_t)c->len_q;
    double out[MAX_D], max_v, dd = 0.0;
    const double lse = ref_row(c, b, h, i, out, &max_v);
    if (lse == -INFINITY) return;
    for (size_t x = 0; x < d; x++) dd += g[x] * out[x];
    if (c->m.sinks) dsink[h] -= exp(c->m.sinks[h] - lse) * dd;
    for (size_t j = 0; j < c->len_kv; j++) {
        if (!sees(c, b, i, j)) continue;
        const size_t kr = (b * c->hk + hk) * c->len_kv + j;
        const float *k = c->k + kr * d, *v = c->v + kr * d;
        const double u = scale * ref_dot(q, k, d);
        double x = u, chain = 1.0;
        if (c->m.softcap != 0.0f) {
            const double t = tanh(u / c->m.softcap);
            x = c->m.softcap * t, chain = 1.0 - t * t;
        }
        if (c->m.alibi_slopes) x += c->m.alibi_slopes[h] * (double)((int64_t)j - p);
        const double pr = exp(x - lse), du = pr * (ref_dot(g, v, d) - dd) * chain;
        for (size_t y = 0; y < d; y++) {
            dq[y] += scale * du * k[y];
            dk[kr * d + y] += scale * du * q[y];
            dv[kr * d + y] += pr * g[y];
        }
    }
}

/* Every value within 1e-4 of the largest wanted magnitude, at least 1e-2: a gradient that is 0
   in exact arithmetic (a row that sees one key has dS = P (dp - D) = 0) comes out as the
   rounding of its terms, which are of the order of the values. */
static void close_to(const mcase *c, const float *got, const double *want, size_t n,
                     const char *name) {
    char what[256];
    describe(c, what, sizeof what);
    double big = 1e-2;
    for (size_t i = 0; i < n; i++) big = fabs(want[i]) > big ? fabs(want[i]) : big;
    for (size_t i = 0; i < n; i++) {
        const double w = isnan(want[i]) ? 0.0 : want[i];
        FUZZ_CHECK(fabs(got[i] - w) <= 1e-4 * big || (isnan(got[i]) && isnan(want[i])),
                   "%s: %s[%zu] %.9g, want %.9g (largest %.3g)", what, name, i, got[i], w, big);
    }
}

/* The backward (f32) against ref_row_grads. Keys no row sees hold NaN: their gradients must
   come out 0 (dk, dv) and never reach dq. */
static void check_backward(const mcase *c, const float *out, const float *lse, fuzz_reader *r) {
    const size_t rows = c->batch * c->hq * c->len_q, keys = c->batch * c->hk * c->len_kv, d = c->d;
    float *dout = malloc((rows * d + 1) * 4), *dq = malloc((rows * d + 1) * 4);
    float *dk = malloc((keys * d + 1) * 4), *dv = malloc((keys * d + 1) * 4), dsinks[6];
    for (size_t i = 0; i < rows * d; i++) dout[i] = ordinary(r);
    sdpa_mha_desc desc;
    sdpa_mha_desc_dense(&desc, c->batch, c->hq, c->hk, c->len_q, c->len_kv, d, d,
                        SDPA_DEFAULT_SCALE, c->causal ? SDPA_CAUSAL : 0);
    sdpa_mha_desc_set_mods(&desc, &c->m);
    desc.lse = (float *)lse;
    desc.lse_stride[1] = c->len_q, desc.lse_stride[0] = c->hq * c->len_q;
    sdpa_mha_grads g;
    memset(&g, 0, sizeof g);
    g.struct_size = sizeof g;
    g.dq = dq, g.dk = dk, g.dv = dv, g.dout = dout, g.dsinks = c->m.sinks ? dsinks : NULL;
    memcpy(g.dq_stride, desc.q_stride, sizeof g.dq_stride);
    memcpy(g.dk_stride, desc.k_stride, sizeof g.dk_stride);
    memcpy(g.dv_stride, desc.v_stride, sizeof g.dv_stride);
    memcpy(g.dout_stride, desc.out_stride, sizeof g.dout_stride);
    FUZZ_CHECK(sdpa_mha_backward_f32(&desc, &g, c->q, c->k, c->v, out) == SDPA_OK, "backward: %s",
               sdpa_last_error_detail());
    double *wq = calloc(rows * d + 1, 8), *wk = calloc(keys * d + 1, 8),
           *wv = calloc(keys * d + 1, 8), ws[6] = {0};
    for (size_t b = 0; b < c->batch; b++)
        for (size_t h = 0; h < c->hq; h++)
            for (size_t i = 0; i < c->len_q; i++)
                ref_row_grads(c, dout, b, h, i, wq + ((b * c->hq + h) * c->len_q + i) * d, wk, wv,
                              ws);
    close_to(c, dq, wq, rows * d, "dq");
    close_to(c, dk, wk, keys * d, "dk");
    close_to(c, dv, wv, keys * d, "dv");
    if (c->m.sinks) close_to(c, dsinks, ws, c->hq, "dsinks");
    free(dout), free(dq), free(dk), free(dv), free(wq), free(wk), free(wv);
}

static void run_case(fuzz_reader *r) {
    mcase c;
    read_case(r, &c);
    const size_t rows = c.batch * c.hq * c.len_q, n = rows * c.d;
    float *out = malloc((n + 1) * 4), *lse = malloc((rows + 1) * 4);
    float *out2 = malloc((n + 1) * 4), *lse2 = malloc((rows + 1) * 4);
    const int backward = c.kv_type == SDPA_F32 && fuzz_u8(r) < 96;
    for (size_t be = 0; next_backend(&be);) {
        memset(out, 0x5a, n * 4), memset(lse, 0x5a, rows * 4);
        const sdpa_status st = forward(&c, 1, out, lse);
        if (c.bad) {
            FUZZ_CHECK(st == SDPA_ERR_ARG || (rows == 0 && st == SDPA_OK) ||
                           (c.len_kv == 0 && st == SDPA_OK),
                       "a bad modifier gave status %d", st);
            for (size_t i = 0; i < n && st != SDPA_OK; i++)
                FUZZ_CHECK(fuzz_to_bits(out[i]) == 0x5a5a5a5au, "out written on error");
            continue;
        }
        FUZZ_CHECK(st == SDPA_OK, "status %d: %s", st, sdpa_last_error_detail());
        check_forward(&c, out, lse);
        FUZZ_CHECK(forward(&c, 2, out2, lse2) == SDPA_OK, "2 threads");
        FUZZ_CHECK(!memcmp(out, out2, n * 4) && !memcmp(lse, lse2, rows * 4),
                   "2 threads give other bits");
        if (backward) check_backward(&c, out, lse, r);
    }
    free(out), free(lse), free(out2), free(lse2);
    free(c.q), free(c.k), free(c.v), free(c.k_typed), free(c.v_typed);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_reader r = fuzz_reader_init(data, size);
    run_case(&r);
    return 0;
}
