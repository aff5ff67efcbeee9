/* Differential fuzzer for the kernel family: dot, scale, softmax, softmax_backward, scores.
 *
 * The input picks the entry point, sizes, strides, alignment offsets, aliasing, NULL pointers,
 * scale and the floats themselves (fuzz_common.h). Each case runs on every backend this CPU
 * runs (and both exp modes for softmax) and is checked against include/sdpa.h:
 *   - the status is the one the arguments call for, and the same on every backend;
 *   - on error no output is written; inputs are never written; nothing outside any array is
 *     touched (AddressSanitizer plus canaries);
 *   - results are within the documented error bounds of the double-precision reference
 *     (tests/reference.c) where the inputs are in range, and follow the special-value rules
 *     (NaN, +-inf, never-subnormal softmax weights) everywhere.
 *
 * Run it with scripts/fuzz; a crash file it leaves is a reproducer: pass it as the argument of
 * build-fuzz/fuzz_kernels. */
#include "bounds.h"
#include "fuzz_common.h"
#include "reference.h"

/* What "in range" means for the bounds: no partial sum can overflow. */
#define NO_OVERFLOW (FLT_MAX / 4.0)
/* Products and sums in the subnormal range lose absolute accuracy that no relative bound
 * covers: at most half a subnormal step per rounding, a few roundings per term. */
#define SUBNORMAL_SLACK(n) (4.0 * (double)(n)*0x1p-149)

enum { OP_DOT, OP_SCALE, OP_SOFTMAX, OP_SOFTMAX_BACKWARD, OP_SCORES, N_OPS };

/* The parameters every entry point shares; which fields matter depends on the op. */
typedef struct fuzz_case {
    uint8_t flags;
    size_t n;
    size_t offset[3];
    int null_index; /* which pointer argument is passed as NULL, -1 for none */
    float scale;
    float range;
    int repeat; /* rows end in copies of their last value once the input runs out */
} fuzz_case;

static const float NICE_SCALES[] = {1.0f,  -1.0f, 0.125f, 0.5f,  2.0f, -2.0f, 0.0883883f, 1e-3f,
                                    10.0f, 1e10f, 1e-10f, 3e38f, 0.3f, -0.7f, 1e-30f,     1e30f};
static const float RANGES[] = {1.0f, 10.0f, 80.0f, 1e30f};

static fuzz_case read_case(fuzz_reader *r) {
    fuzz_case c;
    c.flags = fuzz_u8(r);
    uint8_t a = fuzz_u8(r), b = fuzz_u8(r);
    /* mostly short rows, where every tail shape lives; sometimes up to 4096 */
    c.n = a < 0xe0 ? (size_t)b % 72 : ((size_t)(a & 0x1f) << 8 | b) % 4097;
    uint8_t off = fuzz_u8(r), off2 = fuzz_u8(r);
    c.offset[0] = off & 15;
    c.offset[1] = off >> 4;
    c.offset[2] = off2 & 15;
    c.repeat = off2 >> 7;
    int null_sel = (c.flags >> 2) & 7;
    c.null_index = null_sel >= 5 ? null_sel - 5 : -1;
    uint8_t s = fuzz_u8(r);
    if (s < 160)
        c.scale = NICE_SCALES[s % (sizeof NICE_SCALES / sizeof NICE_SCALES[0])];
    else if (s < 224)
        c.scale = FUZZ_SPECIALS[s % FUZZ_N_SPECIALS];
    else
        c.scale = fuzz_bits(fuzz_u32(r));
    c.range = RANGES[c.flags >> 6];
    return c;
}

/* Random values past the end of the input, or (repeat) copies of the last one: equal values
 * make every rounding of an accumulator err the same way, the worst case for sums. */
static void fill(fuzz_reader *r, float *x, size_t n, float range, int repeat) {
    for (size_t i = 0; i < n; i++) x[i] = repeat && !r->left && i ? x[i - 1] : fuzz_float(r, range);
}

static int bad_softmax_scale(float scale) { return !isfinite(scale) || scale == 0.0f; }

/* The status must be OK when no error applies, else one of the errors that apply (the header
 * does not rank them). */
static void check_status(sdpa_status got, int want_null, int want_size, int want_arg,
                         const char *what) {
    if (!want_null && !want_size && !want_arg) {
        FUZZ_CHECK(got == SDPA_OK, "%s: status %d, want OK", what, (int)got);
        return;
    }
    FUZZ_CHECK((want_null && got == SDPA_ERR_NULL) || (want_size && got == SDPA_ERR_SIZE) ||
                   (want_arg && got == SDPA_ERR_ARG),
               "%s: status %d, want error (null %d size %d arg %d)", what, (int)got, want_null,
               want_size, want_arg);
}

/* ---- dot and scores share the check of one dot product ---- */

typedef enum { DOT_CHECK_BOUND, DOT_NAN, DOT_PLUS_INF, DOT_MINUS_INF, DOT_UNSPECIFIED } dot_kind;

/* What IEEE arithmetic makes of sum a_i b_i in float: NaN if an input is NaN, or inf meets 0,
 * or both infinities appear; +-inf if only one sign of infinity; a value within the bound when
 * nothing can overflow; else (finite inputs whose float sums may overflow) unspecified. */
static dot_kind classify_dot(const float *a, const float *b, size_t n, size_t b_step) {
    int nan = 0, plus = 0, minus = 0;
    double finite_abs = 0.0;
    for (size_t i = 0; i < n; i++) {
        float x = a[i], y = b[i * b_step];
        if (isnan(x) || isnan(y)) {
            nan = 1;
        } else if (isinf(x) || isinf(y)) {
            if (x == 0.0f || y == 0.0f)
                nan = 1;
            else if ((x > 0) == (y > 0))
                plus = 1;
            else
                minus = 1;
        } else {
            finite_abs += fabs((double)x * (double)y);
        }
    }
    if (nan || (plus && minus)) return DOT_NAN;
    if (finite_abs > NO_OVERFLOW) return DOT_UNSPECIFIED;
    if (plus) return DOT_PLUS_INF;
    if (minus) return DOT_MINUS_INF;
    return DOT_CHECK_BOUND;
}

/* got == scale * sum a_i b_i within |error| <= 1e-5 |scale| sum |a_i b_i| (sdpa.h). */
static void check_dot_value(float got, const float *a, const float *b, size_t n, float scale,
                            const char *what, size_t j) {
    dot_kind kind = classify_dot(a, b, n, 1);
    double sum_abs = ref_dot_abs(a, b, n);
    if (kind == DOT_CHECK_BOUND && fabs((double)scale) * sum_abs > NO_OVERFLOW)
        kind = DOT_UNSPECIFIED;
    switch (kind) {
    case DOT_NAN: FUZZ_CHECK(isnan(got), "%s[%zu] n=%zu: want NaN, got %a", what, j, n, got); break;
    case DOT_PLUS_INF:
    case DOT_MINUS_INF: {
        /* scale * +-inf: +-inf for a non-zero scale, NaN for 0 */
        float want = (kind == DOT_PLUS_INF ? INFINITY : -INFINITY) * scale;
        FUZZ_CHECK(isnan(want) ? isnan(got) : got == want, "%s[%zu] n=%zu: want %g, got %a", what,
                   j, n, want, got);
        break;
    }
    case DOT_CHECK_BOUND: {
        double want = (double)scale * ref_dot(a, b, n);
        double bound = bound_dot(fabs((double)scale) * sum_abs) +
                       fabs((double)scale) * SUBNORMAL_SLACK(n) + 0x1p-149;
        FUZZ_CHECK(fabs((double)got - want) <= bound,
                   "%s[%zu] n=%zu scale=%a: got %.9g, want %.9g, |error| %.3g > bound %.3g", what,
                   j, n, scale, got, want, fabs((double)got - want), bound);
        break;
    }
    case DOT_UNSPECIFIED: break;
    }
}

/* A copy of n floats, to check later that inputs were not written. */
static float *snapshot(const float *x, size_t n) {
    float *c = malloc((n ? n : 1) * sizeof(float));
    if (!c) abort();
    if (n) memcpy(c, x, n * sizeof(float));
    return c;
}

static void fill_canary(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = fuzz_bits(CANARY_BITS);
}

/* ---- dot ---- */

static void fuzz_dot(fuzz_reader *r) {
    fuzz_case c = read_case(r);
    size_t n = c.n;
    fenced a = fenced_alloc(n, c.offset[0]), b = fenced_alloc(n, c.offset[1]),
           out = fenced_alloc(1, c.offset[2]);
    fill(r, a.p, n, c.range, c.repeat);
    fill(r, b.p, n, c.range, c.repeat);
    const float *pb_data = c.flags & 1 ? a.p : b.p; /* a == b: the squared norm */
    const float *pa = c.null_index == 0 ? NULL : a.p, *pb = c.null_index == 1 ? NULL : pb_data;
    float *presult = c.null_index == 2 ? NULL : out.p;
    int want_null = !presult || (n && (!pa || !pb));
    float *a0 = snapshot(a.p, n), *b0 = snapshot(b.p, n);
    for (size_t bi = 0; next_backend(&bi);) {
        out.p[0] = fuzz_bits(CANARY_BITS);
        sdpa_status st = sdpa_dot_f32(pa, pb, n, presult);
        check_status(st, want_null, 0, 0, "dot");
        fenced_check(&a, "dot a");
        fenced_check(&b, "dot b");
        fenced_check(&out, "dot result");
        FUZZ_CHECK(same_bits(a.p, a0, n) && same_bits(b.p, b0, n), "dot: an input was written");
        if (st != SDPA_OK)
            FUZZ_CHECK(fuzz_to_bits(out.p[0]) == CANARY_BITS, "dot: result written on error");
        else
            check_dot_value(out.p[0], a.p, pb_data, n, 1.0f, "dot", 0);
    }
    free(a0);
    free(b0);
    fenced_free(&a);
    fenced_free(&b);
    fenced_free(&out);
}

/* ---- scale ---- */

static void fuzz_scale(fuzz_reader *r) {
    fuzz_case c = read_case(r);
    size_t n = c.n;
    int in_place = c.flags & 1;
    fenced y = fenced_alloc(n, c.offset[0]), x = fenced_alloc(n, c.offset[1]);
    fill(r, x.p, n, c.range, c.repeat);
    float *x0 = snapshot(x.p, n);
    float *py = c.null_index == 0 ? NULL : y.p;
    const float *px = c.null_index == 1 ? NULL : in_place ? y.p : x.p;
    int want_null = n && (!py || !px);
    for (size_t bi = 0; next_backend(&bi);) {
        if (in_place)
            memcpy(y.p, x0, n * sizeof(float));
        else
            fill_canary(y.p, n);
        float *y_before = snapshot(y.p, n);
        sdpa_status st = sdpa_scale_f32(py, px, n, c.scale);
        check_status(st, want_null, 0, 0, "scale");
        fenced_check(&y, "scale y");
        fenced_check(&x, "scale x");
        FUZZ_CHECK(same_bits(x.p, x0, n), "scale: the input was written");
        if (st != SDPA_OK) {
            FUZZ_CHECK(same_bits(y.p, y_before, n), "scale: output written on error");
        } else {
            /* bit-exact: one IEEE multiply per element */
            for (size_t i = 0; i < n; i++) {
                volatile float want = c.scale * x0[i];
                FUZZ_CHECK(isnan(want) ? isnan(y.p[i]) : fuzz_to_bits(y.p[i]) == fuzz_to_bits(want),
                           "scale n=%zu i=%zu: %a * %a gave %a, want %a", n, i, c.scale, x0[i],
                           y.p[i], want);
            }
        }
        free(y_before);
    }
    free(x0);
    fenced_free(&y);
    fenced_free(&x);
}

/* ---- softmax ---- */

/* y against the reference and the special-value rules of sdpa.h. */
static void check_softmax(const float *y, const float *x, size_t n, float scale) {
    double *want = malloc((n ? n : 1) * sizeof(double));
    if (!want) abort();
    ref_softmax(want, x, n, scale);
    int nan = 0, in_range = n <= 4096, nonfinite_max = 1;
    for (size_t i = 0; i < n; i++) {
        float z = scale * x[i];
        nan |= isnan(z);
        if (isfinite(z)) nonfinite_max = 0;
        if (isfinite(z) && fabsf(z) > 80.0f) in_range = 0;
    }
    float max_z = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        float z = scale * x[i];
        if (z == INFINITY) nonfinite_max = 1;
        max_z = z > max_z ? z : max_z;
    }
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) {
        float z = scale * x[i];
        FUZZ_CHECK(!(y[i] != 0.0f && fabsf(y[i]) < FLT_MIN), "softmax n=%zu i=%zu: subnormal %a", n,
                   i, y[i]);
        if (nan) {
            FUZZ_CHECK(isnan(y[i]), "softmax n=%zu i=%zu: a NaN in the row, got %a", n, i, y[i]);
            continue;
        }
        FUZZ_CHECK(y[i] >= 0.0f && y[i] <= 1.0f, "softmax n=%zu i=%zu: weight %a (z=%a)", n, i,
                   y[i], z);
        sum += y[i];
        if (z == -INFINITY)
            FUZZ_CHECK(y[i] == 0.0f, "softmax n=%zu i=%zu: -inf got %a", n, i, y[i]);
        if (nonfinite_max) {
            /* +inf entries share the mass, the rest get exactly 0; a masked row is all 0 */
            FUZZ_CHECK(want[i] == 0.0 ? y[i] == 0.0f : fabs(y[i] - want[i]) <= 1e-7 * want[i],
                       "softmax n=%zu i=%zu (non-finite max): got %a want %a", n, i, y[i], want[i]);
        } else if (in_range) {
            if (want[i] < 2.0 * FLT_MIN)
                FUZZ_CHECK(y[i] < 3.0 * FLT_MIN, "softmax n=%zu i=%zu: got %a want %a", n, i, y[i],
                           want[i]);
            else
                FUZZ_CHECK(fabs(y[i] - want[i]) <= bound_softmax_rel(n) * want[i],
                           "softmax n=%zu i=%zu scale=%a z=%a max z=%a: got %.9g want %.9g (rel "
                           "%.3g)",
                           n, i, scale, z, max_z, y[i], want[i], fabs(y[i] - want[i]) / want[i]);
        }
    }
    /* outside the accuracy range the weights still form a distribution */
    if (!nan && !nonfinite_max && n)
        FUZZ_CHECK(fabs(sum - 1.0) <= 1e-3, "softmax n=%zu scale=%a: weights sum to %.9g", n, scale,
                   sum);
    free(want);
}

static void fuzz_softmax(fuzz_reader *r) {
    fuzz_case c = read_case(r);
    size_t n = c.n;
    int in_place = c.flags & 1;
    fenced y = fenced_alloc(n, c.offset[0]), x = fenced_alloc(n, c.offset[1]);
    fill(r, x.p, n, c.range, c.repeat);
    float *x0 = snapshot(x.p, n);
    float *py = c.null_index == 0 ? NULL : y.p;
    const float *px = c.null_index == 1 ? NULL : in_place ? y.p : x.p;
    int want_null = n && (!py || !px), want_arg = bad_softmax_scale(c.scale);
    static const char *const EXP_MODES[] = {"fast", "sleef"};
    for (size_t bi = 0; next_backend(&bi);) {
        for (size_t e = 0; e < 2; e++) {
            if (sdpa_set_exp_mode(EXP_MODES[e]) != SDPA_OK) FUZZ_FAIL("exp mode %s", EXP_MODES[e]);
            if (in_place)
                memcpy(y.p, x0, n * sizeof(float));
            else
                fill_canary(y.p, n);
            float *y_before = snapshot(y.p, n);
            sdpa_status st = sdpa_softmax_f32(py, px, n, c.scale);
            check_status(st, want_null, 0, want_arg, "softmax");
            fenced_check(&y, "softmax y");
            fenced_check(&x, "softmax x");
            FUZZ_CHECK(same_bits(x.p, x0, n), "softmax: the input was written");
            if (st != SDPA_OK)
                FUZZ_CHECK(same_bits(y.p, y_before, n), "softmax: output written on error");
            else
                check_softmax(y.p, x0, n, c.scale);
            free(y_before);
        }
    }
    sdpa_set_exp_mode("fast");
    free(x0);
    fenced_free(&y);
    fenced_free(&x);
}

/* ---- softmax_backward ---- */

static void check_backward(const float *dx, const float *y, const float *dy, size_t n,
                           float scale) {
    int nan = 0, inf = 0;
    for (size_t i = 0; i < n; i++) {
        nan |= isnan(y[i]) || isnan(dy[i]);
        inf |= isinf(y[i]) || isinf(dy[i]);
    }
    if (nan) {
        /* the NaN reaches sum_j y_j dy_j, and through it every element */
        for (size_t i = 0; i < n; i++)
            FUZZ_CHECK(isnan(dx[i]), "softmax_backward n=%zu i=%zu: NaN input, got %a", n, i,
                       dx[i]);
        return;
    }
    if (inf) return; /* inf - inf or inf * 0 somewhere, or not: IEEE decides, no bound */
    double s_abs = ref_dot_abs(y, dy, n), y_dot_dy = ref_dot(y, dy, n);
    if (s_abs > NO_OVERFLOW) return;
    double as = fabs((double)scale);
    for (size_t i = 0; i < n; i++) {
        double mag = as * fabs((double)y[i]) * (fabs((double)dy[i]) + s_abs);
        /* in range: no intermediate overflows (scale * y_i with y_i > 1 may, before the
           product with a zero dy_i - sum gives inf * 0) */
        if (mag > NO_OVERFLOW || as * fabs((double)y[i]) > NO_OVERFLOW ||
            fabs((double)dy[i]) + s_abs > NO_OVERFLOW)
            continue;
        double want = (double)scale * y[i] * ((double)dy[i] - y_dot_dy);
        double bound = bound_backward(fabs((double)dy[i]) + s_abs, as * fabs((double)y[i]), n) +
                       as * fabs((double)y[i]) * SUBNORMAL_SLACK(n) +
                       0x1p-149 * (fabs((double)dy[i]) + s_abs + 4.0);
        FUZZ_CHECK(fabs(dx[i] - want) <= bound,
                   "softmax_backward n=%zu i=%zu scale=%a: got %.9g want %.9g, |error| %.3g > "
                   "bound %.3g",
                   n, i, scale, dx[i], want, fabs(dx[i] - want), bound);
    }
}

static void fuzz_softmax_backward(fuzz_reader *r) {
    fuzz_case c = read_case(r);
    size_t n = c.n;
    fenced dx = fenced_alloc(n, c.offset[0]), y = fenced_alloc(n, c.offset[1]),
           dy = fenced_alloc(n, c.offset[2]);
    fill(r, y.p, n, c.range, c.repeat);
    fill(r, dy.p, n, c.range, c.repeat);
    if (c.flags & 0x20) {
        /* y a softmax output, as in training, rather than arbitrary values */
        double *w = malloc((n ? n : 1) * sizeof(double));
        if (!w) abort();
        ref_softmax(w, y.p, n, 1.0f);
        for (size_t i = 0; i < n; i++) y.p[i] = w[i] < FLT_MIN ? 0.0f : (float)w[i];
        free(w);
    }
    float *y0 = snapshot(y.p, n), *dy0 = snapshot(dy.p, n);
    /* dx may alias y or dy */
    int alias = c.flags & 3; /* 1: dx == y, 2: dx == dy, else separate */
    float *dx_buf = alias == 1 ? y.p : alias == 2 ? dy.p : dx.p;
    float *pdx = c.null_index == 0 ? NULL : dx_buf;
    const float *py = c.null_index == 1 ? NULL : y.p, *pdy = c.null_index == 2 ? NULL : dy.p;
    int want_null = n && (!pdx || !py || !pdy), want_arg = bad_softmax_scale(c.scale);
    for (size_t bi = 0; next_backend(&bi);) {
        memcpy(y.p, y0, n * sizeof(float));
        memcpy(dy.p, dy0, n * sizeof(float));
        if (alias != 1 && alias != 2) fill_canary(dx.p, n);
        float *dx_before = snapshot(dx_buf, n);
        sdpa_status st = sdpa_softmax_backward_f32(pdx, py, pdy, n, c.scale);
        check_status(st, want_null, 0, want_arg, "softmax_backward");
        fenced_check(&dx, "softmax_backward dx");
        fenced_check(&y, "softmax_backward y");
        fenced_check(&dy, "softmax_backward dy");
        if (alias != 1) FUZZ_CHECK(same_bits(y.p, y0, n), "softmax_backward: y was written");
        if (alias != 2) FUZZ_CHECK(same_bits(dy.p, dy0, n), "softmax_backward: dy was written");
        if (st != SDPA_OK)
            FUZZ_CHECK(same_bits(dx_buf, dx_before, n), "softmax_backward: dx written on error");
        else
            check_backward(dx_buf, y0, dy0, n, c.scale);
        free(dx_before);
    }
    free(y0);
    free(dy0);
    fenced_free(&dx);
    fenced_free(&y);
    fenced_free(&dy);
}

/* ---- scores ---- */

static void fuzz_scores(fuzz_reader *r) {
    fuzz_case c = read_case(r);
    size_t n_keys = c.n % 41;
    uint8_t dsel = fuzz_u8(r), ssel = fuzz_u8(r);
    size_t d = dsel < 200 ? (size_t)dsel % 72 : 64 + (size_t)(dsel - 200) * 4; /* up to 284 */
    size_t stride;
    if (ssel < 160)
        stride = d + ssel % 9; /* padded rows */
    else if (ssel < 200)
        stride = d ? (size_t)ssel % d : 0; /* overlapping rows: SIZE unless n_keys == 0 */
    else if (ssel < 230)
        stride = d;
    else if (ssel < 245 && n_keys >= 2)
        /* the smallest stride whose extent passes PTRDIFF_MAX bytes, and a few above */
        stride = (PTRDIFF_MAX / sizeof(float) - d) / (n_keys - 1) + 1 + ssel % 3;
    else
        stride = SIZE_MAX - ssel % 3;
    unsigned __int128 extent = n_keys ? (unsigned __int128)(n_keys - 1) * stride + d : 0;
    int overflow = extent > PTRDIFF_MAX / sizeof(float); /* no array is larger */
    int want_size = n_keys && (d == 0 || stride < d || overflow);
    int want_arg = !isfinite(c.scale);
    /* when the call must fail on size, the keys are never read: d floats stand for them */
    size_t k_len = n_keys == 0 ? 0 : extent > (1u << 20) ? d : (size_t)extent;
    fenced s = fenced_alloc(n_keys, c.offset[0]), q = fenced_alloc(d, c.offset[1]),
           k = fenced_alloc(k_len, c.offset[2]);
    fill(r, q.p, d, c.range, c.repeat);
    fill(r, k.p, k_len, c.range, c.repeat);
    float *q0 = snapshot(q.p, d), *k0 = snapshot(k.p, k_len);
    float *ps = c.null_index == 0 ? NULL : s.p;
    const float *pq = c.null_index == 1 ? NULL : q.p, *pk = c.null_index == 2 ? NULL : k.p;
    int want_null = n_keys && (!ps || !pq || !pk);
    if (!want_null && !want_size && !want_arg && k_len < extent) abort(); /* cannot happen */
    for (size_t bi = 0; next_backend(&bi);) {
        fill_canary(s.p, n_keys);
        sdpa_status st = sdpa_scores_f32(ps, pq, pk, n_keys, d, stride, c.scale);
        check_status(st, want_null, want_size, want_arg, "scores");
        fenced_check(&s, "scores s");
        fenced_check(&q, "scores q");
        fenced_check(&k, "scores k");
        FUZZ_CHECK(same_bits(q.p, q0, d) && same_bits(k.p, k0, k_len), "scores: input written");
        for (size_t j = 0; j < n_keys; j++) {
            if (st != SDPA_OK)
                FUZZ_CHECK(fuzz_to_bits(s.p[j]) == CANARY_BITS, "scores: s written on error");
            else
                check_dot_value(s.p[j], q.p, k.p + j * stride, d, c.scale, "scores", j);
        }
    }
    free(q0);
    free(k0);
    fenced_free(&s);
    fenced_free(&q);
    fenced_free(&k);
}

/* The attention family has its own fuzzer, tests/fuzz/fuzz_attention.c, on the same pieces. */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_reader r = fuzz_reader_init(data, size);
    switch (fuzz_u8(&r) % N_OPS) {
    case OP_DOT: fuzz_dot(&r); break;
    case OP_SCALE: fuzz_scale(&r); break;
    case OP_SOFTMAX: fuzz_softmax(&r); break;
    case OP_SOFTMAX_BACKWARD: fuzz_softmax_backward(&r); break;
    case OP_SCORES: fuzz_scores(&r); break;
    }
    return 0;
}
