/* Differential fuzzer for sdpa_mha_backward_f32.
 *
 * The input picks the shape (batch, heads with GQA/MQA ratios, len_q and len_kv up to 40 and
 * sometimes past a tile of 128 keys, d_k and d_v up to 40 and sometimes past the packed path's
 * 128), the layout (BHSD or BSHD, K/V broadcast over the batch with dk and dv summed over it),
 * the causal flag, a mask (finite values, -inf entries, whole -inf rows), the scale, the thread
 * count, values (moderate, or NaN and inf placed in keys every row's mask removes and in rows
 * that see no key), and at most one bad argument. Each case runs the forward (for lse and out)
 * and then the backward on every backend this CPU runs, and is checked against include/sdpa.h:
 *   - the status is the one the arguments call for; on error nothing is written;
 *   - inputs are never written, nothing outside any array is touched (AddressSanitizer plus
 *     canaries);
 *   - the bits are the same at the input's thread count as at one thread;
 *   - with moderate values, every dq, dk, dv is within the header's per-output bound (grown with
 *     the scores' rounding) of tests/reference.c's double-precision gradient;
 *   - with NaN and inf only in removed keys and blind rows, every gradient is finite, removed
 *     keys' dk and dv and blind rows' dq are exactly zero.
 *
 * Run it with scripts/fuzz; a crash file it leaves reproduces with build-fuzz/fuzz_backward. */
#include "fuzz_common.h"
#include "reference.h"

enum {
    BAD_NONE,
    BAD_NULL_LSE,
    BAD_SHORT_GRADS,
    BAD_RESERVED,
    BAD_DQ_ON_Q,
    BAD_DK_ON_DV,
    BAD_NULL_DOUT,
    BAD_FLAGS,
    BAD_KINDS
};

typedef struct bcase {
    sdpa_mha_desc d;
    size_t threads;
    int bcast;    /* K/V (and dk, dv) broadcast over the batch */
    int masked;   /* a mask with -inf entries and perhaps whole -inf rows */
    int specials; /* NaN/inf in removed keys' k, v and blind rows' q, dout */
    int bad;
    size_t n_q, n_k, n_v, n_o, n_lse, n_m;
} bcase;

static size_t pick_len(fuzz_reader *r) {
    uint8_t b = fuzz_u8(r);
    if (b < 16) return b % 3;
    if (b >= 254) return 1000 + (size_t)b % 2 * 99; /* key chunks (few heads) */
    if (b >= 250) return 120 + (size_t)b % 6 * 7;   /* more than one tile of keys */
    return (size_t)b % 41;
}

static size_t pick_d(fuzz_reader *r) {
    uint8_t b = fuzz_u8(r);
    if (b >= 250) return 129 + (size_t)b % 6; /* past the packed tiles */
    return 1 + (size_t)b % 40;
}

static size_t extent(const size_t s[3], size_t d0, size_t d1, size_t d2, size_t row) {
    if (!d0 || !d1 || !d2 || !row) return 0;
    return (d0 - 1) * s[0] + (d1 - 1) * s[1] + (d2 - 1) * s[2] + row;
}

static void read_case(fuzz_reader *r, bcase *c) {
    memset(c, 0, sizeof *c);
    const uint8_t sel = fuzz_u8(r), shape = fuzz_u8(r), bad = fuzz_u8(r);
    static const size_t THREADS[] = {1, 2, 3, 16};
    static const float SCALES[] = {SDPA_DEFAULT_SCALE, 0.125f, 1.0f, -0.5f, 0.3f, 2.0f};
    c->threads = THREADS[sel & 3];
    const size_t batch = 1 + (shape & 1), heads_kv = 1 + (shape >> 1 & 1);
    const size_t heads_q = heads_kv * (1 + (shape >> 2) % 3);
    size_t len_q = pick_len(r), len_kv = pick_len(r), d_k = pick_d(r), d_v = pick_d(r);
    /* the long lengths with short rows, and fewer query rows while the case's work is large: a
       case (every backend, the reference, coverage instrumentation) stays near a second */
    if (len_q > 200 || len_kv > 200) {
        d_k = d_k > 40 ? 1 + d_k % 40 : d_k;
        d_v = d_v > 40 ? 1 + d_v % 40 : d_v;
    }
    while (len_q > 1 && (double)(batch * heads_q * len_q * len_kv) * (double)(d_k + d_v) > 2e6)
        len_q /= 2;
    const float scale = SCALES[fuzz_u8(r) % 6];
    (sel >> 2 & 1 ? sdpa_mha_desc_bshd : sdpa_mha_desc_dense)(&c->d, batch, heads_q, heads_kv,
                                                              len_q, len_kv, d_k, d_v, scale,
                                                              sel >> 3 & 1 ? SDPA_CAUSAL : 0);
    c->bcast = sel >> 4 & 1;
    if (c->bcast) c->d.k_stride[0] = c->d.v_stride[0] = 0;
    c->masked = sel >> 5 & 1;
    c->specials = sel >> 6 & 1;
    c->bad = bad < 64 ? 1 + bad % (BAD_KINDS - 1) : BAD_NONE;
    const sdpa_mha_desc *d = &c->d;
    c->n_q = extent(d->q_stride, batch, heads_q, len_q, d_k);
    c->n_o = extent(d->out_stride, batch, heads_q, len_q, d_v);
    c->n_k = extent(d->k_stride, batch, heads_kv, len_kv, d_k);
    c->n_v = extent(d->v_stride, batch, heads_kv, len_kv, d_v);
    c->n_lse = batch * heads_q * len_q;
    c->n_m = c->masked ? len_q * len_kv : 0;
}

/* The status the header calls for. */
static sdpa_status expected(const bcase *c) {
    const sdpa_mha_desc *d = &c->d;
    const int rows = d->len_q > 0, keys = d->len_kv > 0;
    switch (c->bad) {
    case BAD_NULL_LSE: return rows ? SDPA_ERR_NULL : SDPA_OK;
    case BAD_NULL_DOUT: return rows ? SDPA_ERR_NULL : SDPA_OK;
    case BAD_SHORT_GRADS:
    case BAD_RESERVED:
    case BAD_FLAGS: return SDPA_ERR_ARG;
    case BAD_DQ_ON_Q: return rows && keys ? SDPA_ERR_SIZE : SDPA_OK;
    case BAD_DK_ON_DV: return keys ? SDPA_ERR_SIZE : SDPA_OK;
    default: return SDPA_OK;
    }
}

static float moderate(fuzz_reader *r) {
    return fuzz_float(r, 2.0f) * (fuzz_u8(r) & 1 ? 1.0f : 0.5f);
}

static float special(fuzz_reader *r) {
    static const float S[] = {NAN, -NAN, INFINITY, -INFINITY, FLT_MAX};
    return S[fuzz_u8(r) % 5];
}

static void fill(fuzz_reader *r, float *x, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float f = fuzz_float(r, 2.0f);
        x[i] = isfinite(f) && fabsf(f) < 4.0f ? f : moderate(r);
    }
}

/* One head's inputs as dense doubles, its reference gradients and their bounds' terms. */
typedef struct ref_head {
    double *dq, *dk, *dv, *tq, *tk, *tv;
} ref_head;

static double *dense(const float *x, size_t stride, size_t rows, size_t row) {
    double *y = malloc((rows * row + 1) * sizeof *y);
    if (!y) abort();
    for (size_t i = 0; i < rows; i++)
        for (size_t c = 0; c < row; c++) y[i * row + c] = x[i * stride + c];
    return y;
}

static double *zeros(size_t n) {
    double *y = calloc(n + 1, sizeof *y);
    if (!y) abort();
    return y;
}

/* The reference gradients of every view, dk and dv summed as the call sums them; the bound
 * terms likewise. */
static void reference(const bcase *c, const float *q, const float *k, const float *v,
                      const float *dout, const float *mask, ref_head *all) {
    const sdpa_mha_desc *d = &c->d;
    const size_t group = d->heads_q / d->heads_kv, nb = c->bcast ? 1 : d->batch;
    const double scale =
        d->scale == SDPA_DEFAULT_SCALE ? (double)(float)(1.0 / sqrt((double)d->d_k)) : d->scale;
    all->dq = zeros(c->n_q);
    all->tq = zeros(c->n_q);
    all->dk = zeros(nb * d->heads_kv * d->len_kv * d->d_k);
    all->tk = zeros(nb * d->heads_kv * d->len_kv * d->d_k);
    all->dv = zeros(nb * d->heads_kv * d->len_kv * d->d_v);
    all->tv = zeros(nb * d->heads_kv * d->len_kv * d->d_v);
    const size_t kd = d->len_kv * d->d_k, vd = d->len_kv * d->d_v, qd = d->len_q * d->d_k;
    double *gq = zeros(qd), *tq = zeros(qd), *gk = zeros(kd), *tk = zeros(kd), *gv = zeros(vd),
           *tv = zeros(vd);
    for (size_t b = 0; b < d->batch; b++)
        for (size_t h = 0; h < d->heads_q; h++) {
            const size_t hk = h / group, at = (c->bcast ? 0 : b) * d->heads_kv + hk;
            double *dq_ = dense(q + b * d->q_stride[0] + h * d->q_stride[1], d->q_stride[2],
                                d->len_q, d->d_k);
            double *dk_ = dense(k + b * d->k_stride[0] + hk * d->k_stride[1], d->k_stride[2],
                                d->len_kv, d->d_k);
            double *dv_ = dense(v + b * d->v_stride[0] + hk * d->v_stride[1], d->v_stride[2],
                                d->len_kv, d->d_v);
            double *do_ = dense(dout + b * d->out_stride[0] + h * d->out_stride[1],
                                d->out_stride[2], d->len_q, d->d_v);
            ref_attention_grads(gq, gk, gv, NULL, tq, tk, tv, dq_, dk_, dv_, do_, mask, d->len_q,
                                d->len_kv, d->d_k, d->d_v, scale, (d->flags & SDPA_CAUSAL) != 0);
            /* dq in the view's layout, dense per (b, h) for the comparison */
            memcpy(all->dq + (b * d->heads_q + h) * qd, gq, qd * sizeof(double));
            memcpy(all->tq + (b * d->heads_q + h) * qd, tq, qd * sizeof(double));
            for (size_t e = 0; e < kd; e++)
                all->dk[at * kd + e] += gk[e], all->tk[at * kd + e] += tk[e];
            for (size_t e = 0; e < vd; e++)
                all->dv[at * vd + e] += gv[e], all->tv[at * vd + e] += tv[e];
            free(dq_);
            free(dk_);
            free(dv_);
            free(do_);
        }
    free(gq);
    free(tq);
    free(gk);
    free(tk);
    free(gv);
    free(tv);
}

static void ref_free(ref_head *a) {
    free(a->dq);
    free(a->tq);
    free(a->dk);
    free(a->tk);
    free(a->dv);
    free(a->tv);
}

static void run_case(fuzz_reader *r) {
    bcase c;
    read_case(r, &c);
    sdpa_mha_desc *d = &c.d;
    if (c.n_q * 2 + c.n_k + c.n_v > (1u << 20)) return;
    fenced q = fenced_alloc(c.n_q, 0), k = fenced_alloc(c.n_k, 1), v = fenced_alloc(c.n_v, 2),
           dout = fenced_alloc(c.n_o, 3), out = fenced_alloc(c.n_o, 0),
           lse = fenced_alloc(c.n_lse, 1), m = fenced_alloc(c.n_m, 0), dq = fenced_alloc(c.n_q, 2),
           dk = fenced_alloc(c.n_k, 3), dv = fenced_alloc(c.n_v, 1);
    fill(r, q.p, c.n_q);
    fill(r, k.p, c.n_k);
    fill(r, v.p, c.n_v);
    fill(r, dout.p, c.n_o);
    /* removed keys (a -inf column) and blind rows (a -inf row) of the shared mask */
    unsigned char *removed = calloc(d->len_kv + 1, 1), *blind = calloc(d->len_q + 1, 1);
    if (!removed || !blind) abort();
    if (c.masked) {
        for (size_t i = 0; i < c.n_m; i++) {
            const uint8_t t = fuzz_u8(r);
            m.p[i] = t < 40 ? -INFINITY : (float)(t - 128) / 40.0f;
        }
        for (size_t j = 0; j < d->len_kv; j++)
            if (fuzz_u8(r) < 40) {
                removed[j] = 1;
                for (size_t i = 0; i < d->len_q; i++) m.p[i * d->len_kv + j] = -INFINITY;
            }
        for (size_t i = 0; i < d->len_q; i++)
            if (fuzz_u8(r) < 30) {
                blind[i] = 1;
                for (size_t j = 0; j < d->len_kv; j++) m.p[i * d->len_kv + j] = -INFINITY;
            }
        sdpa_mha_desc_set_mask(d, m.p, 0, 0, d->len_kv);
    }
    d->lse = lse.p;
    d->lse_stride[0] = d->heads_q * d->len_q;
    d->lse_stride[1] = d->len_q;
    sdpa_mha_grads g = {sizeof g, 0, dq.p, dk.p, dv.p, {0}, {0}, {0}, dout.p, {0}, NULL};
    memcpy(g.dq_stride, d->q_stride, sizeof g.dq_stride);
    memcpy(g.dk_stride, d->k_stride, sizeof g.dk_stride);
    memcpy(g.dv_stride, d->v_stride, sizeof g.dv_stride);
    memcpy(g.dout_stride, d->out_stride, sizeof g.dout_stride);

    ref_head ref = {0};
    const int check_values = !c.specials && c.bad == BAD_NONE;
    if (check_values) reference(&c, q.p, k.p, v.p, dout.p, c.masked ? m.p : NULL, &ref);
    if (c.specials) { /* only where nothing may read them into a gradient */
        const size_t group = d->heads_q / d->heads_kv;
        for (size_t b = 0; b < d->batch; b++)
            for (size_t h = 0; h < d->heads_q; h++) {
                for (size_t j = 0; j < d->len_kv; j++)
                    if (removed[j]) {
                        k.p[b * d->k_stride[0] + h / group * d->k_stride[1] + j * d->k_stride[2]] =
                            special(r);
                        v.p[b * d->v_stride[0] + h / group * d->v_stride[1] + j * d->v_stride[2] +
                            d->d_v - 1] = special(r);
                    }
                for (size_t i = 0; i < d->len_q; i++)
                    if (blind[i]) {
                        q.p[b * d->q_stride[0] + h * d->q_stride[1] + i * d->q_stride[2]] =
                            special(r);
                        dout.p[b * d->out_stride[0] + h * d->out_stride[1] + i * d->out_stride[2]] =
                            special(r);
                    }
            }
    }
    const float *arg_q = q.p;
    switch (c.bad) {
    case BAD_NULL_LSE: d->lse = NULL; break;
    case BAD_SHORT_GRADS: g.struct_size = (uint32_t)offsetof(sdpa_mha_grads, dout_stride); break;
    case BAD_RESERVED: g.reserved = 1; break;
    case BAD_DQ_ON_Q: g.dq = (float *)q.p; break;
    case BAD_DK_ON_DV: g.dk = dv.p; break;
    case BAD_NULL_DOUT: g.dout = NULL; break;
    case BAD_FLAGS: d->flags |= 4; break;
    default: break;
    }
    const sdpa_status want = expected(&c);
    float *q0 = malloc((c.n_q + 1) * sizeof(float)), *k0 = malloc((c.n_k + 1) * sizeof(float)),
          *v0 = malloc((c.n_v + 1) * sizeof(float)), *g0 = malloc((c.n_o + 1) * sizeof(float));
    float *first[3] = {malloc((c.n_q + 1) * sizeof(float)), malloc((c.n_k + 1) * sizeof(float)),
                       malloc((c.n_v + 1) * sizeof(float))};
    if (!q0 || !k0 || !v0 || !g0 || !first[0] || !first[1] || !first[2]) abort();
    memcpy(q0, q.p, c.n_q * sizeof(float));
    memcpy(k0, k.p, c.n_k * sizeof(float));
    memcpy(v0, v.p, c.n_v * sizeof(float));
    memcpy(g0, dout.p, c.n_o * sizeof(float));
    for (size_t bi = 0; next_backend(&bi);) {
        /* the forward on this backend: its lse and out are what the backward is given */
        float *saved_lse = d->lse;
        const uint32_t flags = d->flags;
        d->lse = lse.p;
        d->flags &= SDPA_CAUSAL;
        sdpa_set_num_threads(1);
        FUZZ_CHECK(sdpa_mha_f32(d, out.p, q.p, k.p, v.p) == SDPA_OK, "forward");
        d->lse = saved_lse;
        d->flags = flags;
        for (int run = 0; run < 2; run++) {
            sdpa_set_num_threads(run ? c.threads : 1);
            const float canary = fuzz_bits(CANARY_BITS);
            for (size_t i = 0; i < c.n_q; i++) dq.p[i] = canary;
            for (size_t i = 0; i < c.n_k; i++) dk.p[i] = canary;
            for (size_t i = 0; i < c.n_v; i++) dv.p[i] = canary;
            const sdpa_status st = sdpa_mha_backward_f32(d, &g, arg_q, k.p, v.p, out.p);
            FUZZ_CHECK(st == want, "status %d, want %d (bad %d)", (int)st, (int)want, c.bad);
            const fenced *all[] = {&q, &k, &v, &dout, &out, &lse, &m, &dq, &dk, &dv};
            static const char *const names[] = {"q",   "k",    "v",  "dout", "out",
                                                "lse", "mask", "dq", "dk",   "dv"};
            for (size_t i = 0; i < 10; i++) fenced_check(all[i], names[i]);
            /* dq on q is valid where q is not read (no keys): then q holds dq's zeros */
            const int q_is_dq = c.bad == BAD_DQ_ON_Q && st == SDPA_OK;
            FUZZ_CHECK((q_is_dq || same_bits(q.p, q0, c.n_q)) && same_bits(k.p, k0, c.n_k) &&
                           same_bits(v.p, v0, c.n_v) && same_bits(dout.p, g0, c.n_o),
                       "an input was written");
            if (st != SDPA_OK) {
                for (size_t i = 0; i < c.n_q; i++)
                    FUZZ_CHECK(fuzz_to_bits(dq.p[i]) == CANARY_BITS, "dq written on error");
                for (size_t i = 0; i < c.n_k; i++)
                    FUZZ_CHECK(fuzz_to_bits(dk.p[i]) == CANARY_BITS, "dk written on error");
                for (size_t i = 0; i < c.n_v; i++)
                    FUZZ_CHECK(fuzz_to_bits(dv.p[i]) == CANARY_BITS, "dv written on error");
                break;
            }
            if (c.bad != BAD_NONE) break;
            if (run == 0) {
                memcpy(first[0], dq.p, c.n_q * sizeof(float));
                memcpy(first[1], dk.p, c.n_k * sizeof(float));
                memcpy(first[2], dv.p, c.n_v * sizeof(float));
            } else {
                FUZZ_CHECK(same_bits(first[0], dq.p, c.n_q) && same_bits(first[1], dk.p, c.n_k) &&
                               same_bits(first[2], dv.p, c.n_v),
                           "%zu threads: other bits than 1 thread", c.threads);
            }
        }
        if (c.bad != BAD_NONE) continue;
        for (size_t b = 0; b < d->batch; b++)
            for (size_t h = 0; h < d->heads_q; h++)
                for (size_t i = 0; i < d->len_q; i++)
                    for (size_t col = 0; col < d->d_k; col++) {
                        const float got = dq.p[b * d->q_stride[0] + h * d->q_stride[1] +
                                               i * d->q_stride[2] + col];
                        if (c.specials) {
                            FUZZ_CHECK(isfinite(got), "dq[%zu][%zu][%zu][%zu] = %g", b, h, i, col,
                                       got);
                            if (blind[i] || !d->len_kv)
                                FUZZ_CHECK(got == 0.0f, "blind row %zu: dq %g", i, got);
                        } else if (check_values) {
                            const size_t e = ((b * d->heads_q + h) * d->len_q + i) * d->d_k + col;
                            const double tol =
                                2e-5 * (1.0 + fabs((double)d->scale) * sqrt((double)d->d_k)) *
                                    ref.tq[e] +
                                1e-30;
                            FUZZ_CHECK(fabs(got - ref.dq[e]) <= tol,
                                       "dq[%zu][%zu][%zu][%zu] = %.9g, want %.9g (tol %.3g)", b, h,
                                       i, col, got, ref.dq[e], tol);
                        }
                    }
        const size_t nb = c.bcast ? 1 : d->batch;
        for (size_t b = 0; b < nb; b++)
            for (size_t hk = 0; hk < d->heads_kv; hk++)
                for (size_t j = 0; j < d->len_kv; j++)
                    for (int which = 0; which < 2; which++) {
                        const size_t row = which ? d->d_v : d->d_k;
                        const size_t *s = which ? g.dv_stride : g.dk_stride;
                        const float *base = which ? dv.p : dk.p;
                        for (size_t col = 0; col < row; col++) {
                            const float got = base[b * s[0] + hk * s[1] + j * s[2] + col];
                            if (c.specials) {
                                FUZZ_CHECK(isfinite(got), "d%c[%zu][%zu][%zu][%zu] = %g",
                                           which ? 'v' : 'k', b, hk, j, col, got);
                                if (removed[j] || !d->len_q)
                                    FUZZ_CHECK(got == 0.0f, "removed key %zu: %g", j, got);
                            } else if (check_values) {
                                const size_t e =
                                    ((b * d->heads_kv + hk) * d->len_kv + j) * row + col;
                                const double want = which ? ref.dv[e] : ref.dk[e];
                                const double terms = which ? ref.tv[e] : ref.tk[e];
                                const double tol =
                                    2e-5 * (1.0 + fabs((double)d->scale) * sqrt((double)d->d_k)) *
                                        terms +
                                    1e-30;
                                FUZZ_CHECK(fabs(got - want) <= tol,
                                           "d%c[%zu][%zu][%zu][%zu] = %.9g, want %.9g (tol %.3g)",
                                           which ? 'v' : 'k', b, hk, j, col, got, want, tol);
                            }
                        }
                    }
    }
    sdpa_set_num_threads(0);
    if (check_values) ref_free(&ref);
    free(q0);
    free(k0);
    free(v0);
    free(g0);
    for (int i = 0; i < 3; i++) free(first[i]);
    free(removed);
    free(blind);
    fenced *all[] = {&q, &k, &v, &dout, &out, &lse, &m, &dq, &dk, &dv};
    for (size_t i = 0; i < 10; i++) fenced_free(all[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_reader r = fuzz_reader_init(data, size);
    run_case(&r);
    return 0;
}
