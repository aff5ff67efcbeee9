/* Differential fuzzer for the attention family: sdpa_attention_f32 and sdpa_mha_f32 (with
 * descriptors from sdpa_mha_desc_dense / _bshd / _set_mask, then edited).
 *
 * The input picks the shapes (batch, heads_q, heads_kv with GQA/MQA/MHA ratios, len_q, len_kv,
 * d_k, d_v: mostly <= 40, sometimes a d_v past the 256-float stack accumulator), the layout
 * (BHSD, BSHD, padded rows, K/V and mask broadcast over the batch or heads with stride 0), the
 * causal flag, the thread count (1, 2, 3 or 16: calls with enough work run on the pool, and must
 * give what one thread gives), an optional mask (finite values, -inf entries, whole -inf rows,
 * NaN), the scale (SDPA_DEFAULT_SCALE, ordinary values, non-finite), bad arguments (NULL pointers,
 * unknown flags, heads that do not divide, short row strides, extents that overflow size_t, a short
 * struct_size) and the float bit patterns of q, k, v (moderate values, with NaN/inf/huge values
 * sprinkled in, and NaN in the values of keys that a mask or causality removes). Each case runs
 * on every backend this CPU runs (in the exp mode the input picks), and is checked against
 * include/sdpa.h:
 *   - the status is one that the arguments call for; on error out is untouched;
 *   - inputs are never written; out is written only inside its view (padding keeps its canary);
 *     nothing outside any array is touched (AddressSanitizer plus canaries);
 *   - a row that sees no key is exactly zeros; a NaN or +inf score (NaN in q or in the k of a
 *     seen key, NaN in a seen mask entry, inf that makes a score NaN or +inf) gives a NaN row; a
 *     score of -inf gives its key weight 0 (and a row of only -inf scores is zeros); NaN in the
 *     v of a seen key with a finite score gives NaN in its columns; NaN in the v of a removed
 *     key changes nothing;
 *   - with finite scores of moderate size, |out - ref| <= 1e-5 * max|v| (plus the score-rounding
 *     term) against tests/reference.c's double-precision textbook attention.
 *
 * Run it with scripts/fuzz; a crash file it leaves reproduces with build-fuzz/fuzz_attention. */
#include "bounds.h"
#include "fuzz_common.h"
#include "reference.h"

#define MAX_LEN 40
#define MAX_D   40

/* A view [d0][d1][d2][row] with strides; extent in floats, or SIZE_MAX when it passes
 * PTRDIFF_MAX bytes (no array is larger). */
static size_t view_extent(const size_t s[3], size_t d0, size_t d1, size_t d2, size_t row) {
    if (!d0 || !d1 || !d2 || !row) return 0;
    unsigned __int128 e = (unsigned __int128)(d0 - 1) * s[0] + (unsigned __int128)(d1 - 1) * s[1] +
                          (unsigned __int128)(d2 - 1) * s[2] + row;
    return e > PTRDIFF_MAX / sizeof(float) ? SIZE_MAX : (size_t)e;
}

/* Values: moderate (|x| <= range) except, in "special" cases, roughly one in `rate` elements is
 * a special value or raw bits (while the input lasts; random moderate values after). */
static float value(fuzz_reader *r, float range, int rate) {
    if (!r->left) return fuzz_float(r, range);
    if (rate && fuzz_u8(r) % rate == 0) return fuzz_float(r, range);
    int16_t v = (int16_t)(fuzz_u8(r) << 8 | fuzz_u8(r));
    return (float)v / 32768.0f * range;
}

typedef struct fcase {
    int single;     /* sdpa_attention_f32 instead of sdpa_mha_f32 */
    size_t threads; /* sdpa_set_num_threads for the case: the results must not depend on it */
    sdpa_mha_desc d;
    int null_desc, null_index; /* which of out, q, k, v is NULL, -1 for none */
    int want_null, want_size, want_arg;
    size_t ext_q, ext_k, ext_v, ext_o, ext_m; /* floats each array spans (SIZE_MAX: overflow) */
} fcase;

static size_t pick_len(fuzz_reader *r) {
    uint8_t b = fuzz_u8(r);
    if (b < 16) return b % 3;                     /* 0, 1, 2 */
    if (b >= 252) return 60 + (size_t)b % 4 * 23; /* more than one block of keys */
    return (size_t)b % (MAX_LEN + 1);
}

static size_t pick_d(fuzz_reader *r) {
    uint8_t b = fuzz_u8(r);
    if (b < 4) return 0;
    if (b >= 250) return 257 + (size_t)b % 3 * 7; /* past the stack accumulator / packed path */
    return 1 + (size_t)b % MAX_D;
}

static const float SCALES[] = {SDPA_DEFAULT_SCALE, 0.125f, 0.25f, 1.0f, -0.5f,
                               0.0883883f,         2.0f,   1e-3f};

static void set_view(size_t s[3], uint8_t how, size_t heads, size_t len, size_t row, int bshd,
                     int input) {
    /* dense strides first, then padding of rows / heads / batches, or broadcast (inputs only) */
    size_t pad = how & 3;
    size_t rs = bshd ? heads * (row + pad) : row + pad;
    size_t hs = bshd ? row + pad : len * rs + (how >> 2 & 1);
    size_t bs = bshd ? len * rs + (how >> 3 & 1) * 3 : heads * hs + (how >> 3 & 1) * 5;
    s[0] = bs;
    s[1] = hs;
    s[2] = rs;
    if (input && (how & 0x30) == 0x30) s[0] = 0; /* one tensor for every batch entry */
}

/* size, if sdpa.h refuses it as a descriptor's struct_size (below the v1 struct, or ending
   inside a group of fields), else 8, which it refuses */
static uint32_t bad_desc_size(uint32_t size) {
    const size_t v1 = offsetof(sdpa_mha_desc, q_type), types = offsetof(sdpa_mha_desc, lse);
    const size_t v2 = offsetof(sdpa_mha_desc, lse_stride) + 2 * sizeof(size_t);
    const size_t v3 = offsetof(sdpa_mha_desc, v_scale) + sizeof(float);
    const int refused = size < v1 || (size > v1 && size < types) || (size > types && size < v2) ||
                        (size > v2 && size < v3);
    return refused ? size : 8;
}

static void read_case(fuzz_reader *r, fcase *c) {
    memset(c, 0, sizeof *c);
    uint8_t sel = fuzz_u8(r), shape = fuzz_u8(r), lay = fuzz_u8(r), bad = fuzz_u8(r);
    c->single = (sel & 7) == 0;
    static const size_t THREADS[] = {1, 2, 3, 16};
    c->threads = THREADS[sel >> 6];
    size_t batch = c->single ? 1 : 1 + (shape & 1) + (shape >> 1 & 1);
    size_t heads_kv = c->single ? 1 : 1 + (shape >> 2 & 1);
    size_t group = c->single ? 1 : 1 + (shape >> 4) % 4; /* 1: MHA, else GQA (MQA if kv 1) */
    if (!c->single && (shape >> 6) == 3 && shape & 1) batch = 0;
    size_t len_q = pick_len(r), len_kv = pick_len(r);
    if ((sel & 0x18) == 0x18) len_q = 1; /* decode: the grouped-heads path */
    size_t d_k = pick_d(r), d_v = pick_d(r);
    uint8_t sc = fuzz_u8(r);
    float scale = SCALES[sc % (sizeof SCALES / sizeof SCALES[0])];
    uint32_t flags = sel >> 5 & 1 ? SDPA_CAUSAL : 0;
    size_t heads_q = heads_kv * group;

    sdpa_mha_desc *d = &c->d;
    int bshd = lay & 1;
    if (bshd)
        sdpa_mha_desc_bshd(d, batch, heads_q, heads_kv, len_q, len_kv, d_k, d_v, scale, flags);
    else
        sdpa_mha_desc_dense(d, batch, heads_q, heads_kv, len_q, len_kv, d_k, d_v, scale, flags);
    if (!c->single && lay & 2) {
        uint8_t a = fuzz_u8(r), b = fuzz_u8(r), o = fuzz_u8(r);
        set_view(d->q_stride, a & 0xf, heads_q, len_q, d_k, bshd, 1);
        set_view(d->k_stride, a >> 4, heads_kv, len_kv, d_k, bshd, 1);
        set_view(d->v_stride, b & 0xf, heads_kv, len_kv, d_v, bshd, 1);
        set_view(d->out_stride, o & 0xf, heads_q, len_q, d_v, bshd, 0);
        if (b & 0x10 && heads_kv == 1) d->k_stride[1] = d->v_stride[1] = 0;
    }
    if (!c->single && lay & 4) { /* a mask, perhaps broadcast over batch and/or heads */
        uint8_t m = fuzz_u8(r);
        size_t row = len_kv + (m & 3);
        size_t hs = m & 4 ? 0 : len_q * row + (m >> 3 & 1);
        size_t bs = m & 0x10 ? 0 : heads_q * (hs ? hs : len_q * row) + (m >> 5 & 1);
        sdpa_mha_desc_set_mask(d, (const float *)1, bs, hs, row); /* pointer set later */
    }

    /* bad arguments, one at a time (several may still apply at once) */
    c->null_index = -1;
    switch (bad % 32) {
    case 0: c->null_index = bad / 32 % 4; break;
    case 1: d->flags |= 1u << (1 + bad / 32); break;
    case 2: d->scale = bad & 0x20 ? NAN : bad & 0x40 ? INFINITY : -INFINITY; break;
    case 3:
        if (!c->single) d->heads_kv = heads_q + 1 + (bad >> 5); /* never divides */
        break;
    case 4:
        if (!c->single) {
            size_t *s = bad & 0x20 ? d->q_stride : bad & 0x40 ? d->k_stride : d->v_stride;
            if (s[2]) s[2] -= 1 + (bad >> 7); /* a short row, an error with 2 rows or more */
        }
        break;
    case 5:
        if (!c->single) {
            size_t *s = (bad >> 5) % 4 == 0   ? d->q_stride
                        : (bad >> 5) % 4 == 1 ? d->k_stride
                        : (bad >> 5) % 4 == 2 ? d->v_stride
                                              : d->out_stride;
            s[bad >> 7] = SIZE_MAX / 8 + (bad & 0x60); /* overflows where that axis has > 1 */
        }
        break;
    case 6:
        if (!c->single && d->mask) d->mask_stride[2] = SIZE_MAX / 2;
        break;
    case 7:
        if (!c->single) {
            d->struct_size = bad_desc_size((uint32_t)(bad >> 5) * 8);
            c->want_arg = 1;
        }
        break;
    case 8:
        if (!c->single) c->null_desc = 1;
        break;
    default: break;
    }
    if (c->single) { /* attention_f32 has only the dense layout, no mask, no struct */
        d->mask = NULL;
        d->struct_size = sizeof *d;
    }

    /* what the header says the status must be */
    heads_kv = d->heads_kv;
    int has_out = batch && heads_q && len_q, reads = has_out && len_kv;
    c->ext_q = view_extent(d->q_stride, batch, heads_q, len_q, d_k);
    c->ext_k = view_extent(d->k_stride, batch, heads_kv, len_kv, d_k);
    c->ext_v = view_extent(d->v_stride, batch, heads_kv, len_kv, d_v);
    c->ext_o = view_extent(d->out_stride, batch, heads_q, len_q, d_v);
    c->ext_m = d->mask ? view_extent(d->mask_stride, batch, heads_q, len_q, len_kv) : 0;
    if (c->null_desc) {
        c->want_null = 1;
        return;
    }
    if (d->flags & ~SDPA_CAUSAL || !isfinite(d->scale)) c->want_arg = 1;
    if (c->null_index == 0 && has_out) c->want_null = 1;
    if (c->null_index > 0 && reads) c->want_null = 1;
    if (heads_kv == 0 || heads_q % heads_kv) c->want_size = 1;
    if (has_out) {
        if (!d_k || !d_v) c->want_size = 1;
        if (len_q > 1 && d->out_stride[2] < d_v) c->want_size = 1;
        if (c->ext_o == SIZE_MAX) c->want_size = 1;
    }
    if (reads && !c->want_size) {
        if ((len_q > 1 && d->q_stride[2] < d_k) || (len_kv > 1 && d->k_stride[2] < d_k) ||
            (len_kv > 1 && d->v_stride[2] < d_v))
            c->want_size = 1;
        if (c->ext_q == SIZE_MAX || c->ext_k == SIZE_MAX || c->ext_v == SIZE_MAX ||
            c->ext_m == SIZE_MAX)
            c->want_size = 1;
    }
}

/* ---- checking one (batch, head) ---- */

typedef struct head_view {
    const float *q, *k, *v, *mask;
    const float *out;
    size_t qs, ks, vs, ms, os;
} head_view;

/* What one output row must be: computed once per case, compared on every backend. */
enum { ROW_ZERO, ROW_NAN, ROW_FREE, ROW_VALUES };
typedef struct head_expect {
    unsigned char *kind; /* len_q */
    double *bound;       /* len_q */
    double *ref;         /* len_q * d_v */
} head_expect;

static void expect_head(const fcase *c, const head_view *h, head_expect *e) {
    const sdpa_mha_desc *d = &c->d;
    const size_t len_q = d->len_q, len_kv = d->len_kv, d_k = d->d_k, d_v = d->d_v;
    const int causal = (d->flags & SDPA_CAUSAL) != 0;
    const double scale =
        d->scale == SDPA_DEFAULT_SCALE ? (double)(float)(1.0 / sqrt((double)d_k)) : d->scale;
    e->kind = malloc(len_q ? len_q : 1);
    e->bound = malloc((len_q ? len_q : 1) * sizeof(double));
    e->ref = malloc((len_q * d_v + 1) * sizeof(double));
    if (!e->kind || !e->bound || !e->ref) abort();
    for (size_t i = 0; i < len_q; i++) {
        const float *qi = h->q + i * h->qs, *mi = h->mask ? h->mask + i * h->ms : NULL;
        /* keys j < seen pass the causal rule (bottom-right aligned) */
        size_t seen = len_kv;
        if (causal) {
            seen = i + 1 + len_kv > len_q ? i + 1 + len_kv - len_q : 0;
            if (seen > len_kv) seen = len_kv;
        }
        /* which keys the row sees, and what its scores are */
        int any = 0, nan_row = 0, finite_max = 0, wild = 0, minus_inf_bad_v = 0;
        double max_abs_s = 0.0, max_v = 0.0; /* max_v over finite values */
        double max_terms = 0.0;              /* max_j |scale| sum_p |q_p k_jp| */
        for (size_t j = 0; j < seen; j++) {
            if (mi && mi[j] == -INFINITY) continue;
            any = 1;
            const float *kj = h->k + j * h->ks;
            double finite_abs = 0.0;
            for (size_t p = 0; p < d_k; p++) {
                double t = (double)qi[p] * kj[p];
                if (isfinite(t)) finite_abs += fabs(t);
            }
            /* float partial sums of finite products may overflow: the row is unspecified */
            if (fabs(scale) * finite_abs > 1e37) wild = 1;
            if (fabs(scale) * finite_abs > max_terms) max_terms = fabs(scale) * finite_abs;
            double s = scale * ref_dot(qi, kj, d_k) + (mi ? mi[j] : 0.0);
            if (isnan(s) || s == INFINITY) nan_row = 1;
            if (isfinite(s)) {
                finite_max = 1;
                if (fabs(s) > max_abs_s) max_abs_s = fabs(s);
            }
            for (size_t cc = 0; cc < d_v; cc++) {
                double a = fabs((double)h->v[j * h->vs + cc]);
                if (isfinite(a) && a > max_v) max_v = a;
                /* a -inf score gives the key weight 0, but whether 0 * its NaN/inf v reaches
                   the sum depends on the tiling (a block of only -inf scores is skipped) */
                if (!isfinite(a) && s == -INFINITY) minus_inf_bad_v = 1;
            }
        }
        if (!any) {
            e->kind[i] = ROW_ZERO;
        } else if (wild) {
            e->kind[i] = ROW_FREE;
        } else if (nan_row) {
            e->kind[i] = ROW_NAN;
        } else if (!finite_max) {
            /* every seen score is -inf (an inf in q or k made it so): every weight is 0, the
               row is zeros, as softmax gives for a row of -inf (test_regressions.c) */
            e->kind[i] = ROW_ZERO;
        } else if (minus_inf_bad_v || max_abs_s > 200.0 || max_v > 1e30) {
            e->kind[i] = ROW_FREE; /* see above, or far out of the accuracy range */
        } else {
            e->kind[i] = ROW_VALUES;
            ref_attention(e->ref + i * d_v, 0, qi, 0, h->k, h->ks, h->v, h->vs, mi, 0, 1, seen, d_k,
                          d_v, scale, 0);
            e->bound[i] = bound_attention_scores(max_v, max_abs_s, max_terms, d_k) + 0x1p-126;
        }
    }
}

static void check_head(const fcase *c, const head_view *h, const head_expect *e, size_t b,
                       size_t hq) {
    const sdpa_mha_desc *d = &c->d;
    const size_t d_v = d->d_v;
    for (size_t i = 0; i < d->len_q; i++) {
        const float *o = h->out + i * h->os;
        switch (e->kind[i]) {
        case ROW_ZERO:
            for (size_t cc = 0; cc < d_v; cc++)
                FUZZ_CHECK(fuzz_to_bits(o[cc]) == 0, "b%zu h%zu row %zu sees no key: out[%zu] = %a",
                           b, hq, i, cc, o[cc]);
            break;
        case ROW_NAN:
            for (size_t cc = 0; cc < d_v; cc++)
                FUZZ_CHECK(isnan(o[cc]), "b%zu h%zu row %zu: NaN/+inf score, out[%zu] = %a", b, hq,
                           i, cc, o[cc]);
            break;
        case ROW_FREE: break;
        default:
            for (size_t cc = 0; cc < d_v; cc++) {
                double want = e->ref[i * d_v + cc], bound = e->bound[i];
                float got = o[cc];
                if (isnan(want)) {
                    FUZZ_CHECK(isnan(got), "b%zu h%zu row %zu col %zu: want NaN (v), got %a", b, hq,
                               i, cc, got);
                } else if (isinf(want)) {
                    /* inf in a seen v: that infinity, or NaN where a weight underflowed to 0 */
                    FUZZ_CHECK(isnan(got) || got == want,
                               "b%zu h%zu row %zu col %zu: want %g, got %a", b, hq, i, cc, want,
                               got);
                } else {
                    FUZZ_CHECK(fabs((double)got - want) <= bound,
                               "b%zu h%zu row %zu col %zu (len_q %zu len_kv %zu d_k %zu d_v %zu "
                               "flags %u mask %d scale %g): got %.9g want %.9g |err| %.3g > %.3g",
                               b, hq, i, cc, d->len_q, d->len_kv, d->d_k, d_v, d->flags,
                               h->mask != NULL, (double)d->scale, got, want,
                               fabs((double)got - want), bound);
                }
            }
        }
    }
}

/* ---- one case ---- */

static void fill_values(fuzz_reader *r, float *x, size_t n, float range, int rate) {
    for (size_t i = 0; i < n; i++) x[i] = value(r, range, rate);
}

static float *snapshot(const float *x, size_t n) {
    float *s = malloc((n ? n : 1) * sizeof(float));
    if (!s) abort();
    if (n) memcpy(s, x, n * sizeof(float));
    return s;
}

/* Marks which floats of out lie inside its view, to check that nothing else is written. */
static unsigned char *out_in_view(const fcase *c, size_t n) {
    const sdpa_mha_desc *d = &c->d;
    unsigned char *in = calloc(n ? n : 1, 1);
    if (!in) abort();
    for (size_t b = 0; b < d->batch; b++)
        for (size_t h = 0; h < d->heads_q; h++)
            for (size_t i = 0; i < d->len_q; i++)
                for (size_t cc = 0; cc < d->d_v; cc++)
                    in[b * d->out_stride[0] + h * d->out_stride[1] + i * d->out_stride[2] + cc] = 1;
    return in;
}

static void run_case(fuzz_reader *r) {
    fcase c;
    read_case(r, &c);
    sdpa_mha_desc *d = &c.d;
    int error = c.want_null || c.want_size || c.want_arg;
    /* On an expected error nothing may be read: arrays too big to allocate stand as 1 float. */
    size_t cap = 1u << 20;
    size_t nq = c.ext_q > cap ? 1 : c.ext_q, nk = c.ext_k > cap ? 1 : c.ext_k,
           nv = c.ext_v > cap ? 1 : c.ext_v, no = c.ext_o > cap ? 1 : c.ext_o,
           nm = c.ext_m > cap ? 1 : c.ext_m;
    if (!error &&
        (nq != c.ext_q || nk != c.ext_k || nv != c.ext_v || no != c.ext_o || nm != c.ext_m))
        return; /* a huge but legal view: not what this fuzzer is for */
    uint8_t vals = fuzz_u8(r), off = fuzz_u8(r);
    int rate = vals & 1 ? 0 : 8 + (vals >> 1 & 3) * 64; /* specials: none, or 1 in 8..200 */
    float range = vals & 0x10 ? 4.0f : 1.0f;
    fenced q = fenced_alloc(nq, off & 3), k = fenced_alloc(nk, off >> 2 & 3),
           v = fenced_alloc(nv, off >> 4 & 3), o = fenced_alloc(no, off >> 6),
           m = fenced_alloc(nm, 1);
    fill_values(r, q.p, nq, range, rate);
    fill_values(r, k.p, nk, range, rate);
    fill_values(r, v.p, nv, range, rate);
    if (d->mask) {
        uint8_t mm = fuzz_u8(r);
        int ninf = mm & 3; /* -inf entries: none, some, many */
        for (size_t i = 0; i < nm; i++) {
            uint8_t t = fuzz_u8(r);
            m.p[i] = ninf && t % (ninf == 1 ? 16 : 3) == 0 ? -INFINITY
                     : rate && t == 0xff                   ? NAN
                                                           : value(r, 3.0f, 0);
        }
        /* whole -inf rows, and NaN in the values of keys removed everywhere */
        if (mm & 4 && d->len_kv && d->len_q)
            for (size_t i = 0; i + d->len_kv <= nm; i += d->mask_stride[2] ? d->mask_stride[2] : nm)
                if (fuzz_u8(r) & 1)
                    for (size_t j = 0; j < d->len_kv; j++) m.p[i + j] = -INFINITY;
        d->mask = m.p;
    }
    if (vals & 0x20 && nv) /* NaN values: they must reach only rows that see their keys */
        for (size_t i = 0; i < nv; i++)
            if (fuzz_u8(r) < 24) v.p[i] = NAN;
    float *q0 = snapshot(q.p, nq), *k0 = snapshot(k.p, nk), *v0 = snapshot(v.p, nv),
          *m0 = snapshot(m.p, nm);
    unsigned char *in_view = error ? NULL : out_in_view(&c, no);
    const float *pq = c.null_index == 1 ? NULL : q.p, *pk = c.null_index == 2 ? NULL : k.p,
                *pv = c.null_index == 3 ? NULL : v.p;
    float *po = c.null_index == 0 ? NULL : o.p;

    size_t n_heads = error ? 0 : d->batch * d->heads_q;
    head_expect *ex = calloc(n_heads ? n_heads : 1, sizeof *ex);
    if (!ex) abort();
    int expected = 0;
    static const char *const EXP_MODES[] = {"fast", "sleef"};
    if (sdpa_set_num_threads(c.threads) != SDPA_OK) FUZZ_FAIL("set_num_threads");
    for (size_t bi = 0; next_backend(&bi);) {
        /* one exp mode per case (the input picks it): both would double the cost */
        for (size_t e = vals >> 7; e == vals >> 7; e++) {
            if (sdpa_set_exp_mode(EXP_MODES[e]) != SDPA_OK) FUZZ_FAIL("exp mode");
            for (size_t i = 0; i < no; i++) o.p[i] = fuzz_bits(CANARY_BITS);
            sdpa_status st;
            if (c.single)
                st = sdpa_attention_f32(po, pq, pk, pv, d->len_q, d->len_kv, d->d_k, d->d_v,
                                        d->scale, d->flags);
            else
                st = sdpa_mha_f32(c.null_desc ? NULL : d, po, pq, pk, pv);
            if (!error)
                FUZZ_CHECK(st == SDPA_OK, "status %d, want OK", (int)st);
            else
                FUZZ_CHECK((c.want_null && st == SDPA_ERR_NULL) ||
                               (c.want_size && st == SDPA_ERR_SIZE) ||
                               (c.want_arg && st == SDPA_ERR_ARG),
                           "status %d, want error (null %d size %d arg %d)", (int)st, c.want_null,
                           c.want_size, c.want_arg);
            fenced_check(&q, "q");
            fenced_check(&k, "k");
            fenced_check(&v, "v");
            fenced_check(&o, "out");
            fenced_check(&m, "mask");
            FUZZ_CHECK(same_bits(q.p, q0, nq) && same_bits(k.p, k0, nk) && same_bits(v.p, v0, nv) &&
                           same_bits(m.p, m0, nm),
                       "an input was written");
            for (size_t i = 0; i < no; i++)
                if (error || !in_view[i])
                    FUZZ_CHECK(fuzz_to_bits(o.p[i]) == CANARY_BITS,
                               "out[%zu] written (%s, status %d)", i,
                               error ? "on error" : "outside the view", (int)st);
            /* no rows: nothing to check, and strides of empty views may be anything (even
             * huge), so no view pointers are formed from them */
            if (error || !d->len_q) continue;
            for (size_t b = 0; b < d->batch; b++) {
                for (size_t h = 0; h < d->heads_q; h++) {
                    size_t hk = h / (d->heads_q / d->heads_kv);
                    if (!d->len_kv) { /* inputs unread (and their strides unchecked) */
                        for (size_t i = 0; i < d->len_q; i++)
                            for (size_t cc = 0; cc < d->d_v; cc++)
                                FUZZ_CHECK(
                                    fuzz_to_bits(o.p[b * d->out_stride[0] + h * d->out_stride[1] +
                                                     i * d->out_stride[2] + cc]) == 0,
                                    "len_kv 0: out not zero");
                        continue;
                    }
                    head_view hv = {
                        q.p + b * d->q_stride[0] + h * d->q_stride[1],
                        k.p + b * d->k_stride[0] + hk * d->k_stride[1],
                        v.p + b * d->v_stride[0] + hk * d->v_stride[1],
                        d->mask ? m.p + b * d->mask_stride[0] + h * d->mask_stride[1] : NULL,
                        o.p + b * d->out_stride[0] + h * d->out_stride[1],
                        d->q_stride[2],
                        d->k_stride[2],
                        d->v_stride[2],
                        d->mask_stride[2],
                        d->out_stride[2],
                    };
                    head_expect *he = &ex[b * d->heads_q + h];
                    if (!expected) expect_head(&c, &hv, he);
                    check_head(&c, &hv, he, b, h);
                }
            }
            expected = 1;
        }
    }
    sdpa_set_exp_mode("fast");
    free(q0);
    free(k0);
    free(v0);
    free(m0);
    free(in_view);
    for (size_t i = 0; i < n_heads; i++) {
        free(ex[i].kind);
        free(ex[i].bound);
        free(ex[i].ref);
    }
    free(ex);
    fenced_free(&q);
    fenced_free(&k);
    fenced_free(&v);
    fenced_free(&o);
    fenced_free(&m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_reader r = fuzz_reader_init(data, size);
    run_case(&r);
    return 0;
}
