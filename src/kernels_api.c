/* Public kernel entry points: check arguments once, then hand valid input to the active
 * backend. The softmax special-value rules live here, once, for every backend. */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include "dispatch.h"
#include "error.h"
#include "sdpa.h"
#include "shift_guess.h"
#include "sizes.h"

/* softmax works on chunks of at least SOFTMAX_CHUNK floats (16 KiB, which stays in L1 between a
 * chunk's max pass and its exp pass, so a long row is read from memory once, not twice), at most
 * SOFTMAX_MAX_CHUNKS of them (longer rows use longer chunks). The chunks' float sums are added in
 * double: a row of 2^20 weights then loses no more accuracy in its sum than one chunk does. */
#define SOFTMAX_CHUNK      4096
#define SOFTMAX_MAX_CHUNKS 256

SDPA_API const char *sdpa_status_string(sdpa_status status) {
    switch (status) {
    case SDPA_OK: return "ok";
    case SDPA_ERR_NULL: return "a required pointer is NULL";
    case SDPA_ERR_SIZE: return "invalid size: zero where work is needed, or overflowing";
    case SDPA_ERR_ARG: return "invalid argument (scale, flags or descriptor)";
    case SDPA_ERR_UNSUPPORTED: return "unsupported: unknown name or not runnable on this CPU";
    }
    return "unknown status";
}

/* Long enough for a rule with its numbers: "heads_q (8) is not a multiple of heads_kv (3)". */
#define DETAIL_SIZE 256
static _Thread_local char last_detail[DETAIL_SIZE];

sdpa_status sdpa_fail(sdpa_status status, const char *format, ...) {
    va_list args;
    va_start(args, format);
    vsnprintf(last_detail, sizeof last_detail, format, args);
    va_end(args);
    return status;
}

SDPA_API const char *sdpa_last_error_detail(void) { return last_detail; }

SDPA_API uint32_t sdpa_abi_version(void) { return SDPA_ABI_VERSION; }

SDPA_API const char *sdpa_version(void) { return SDPA_VERSION_STRING; }

/* SDPA_OK, or the error of a pointer among n floats that is NULL though n > 0 */
static sdpa_status null_arg(const char *name, const void *p, size_t n) {
    return n && !p ? sdpa_fail(SDPA_ERR_NULL, "%s is NULL with n = %zu", name, n) : SDPA_OK;
}

static sdpa_status count_arg(size_t n) {
    return n > SDPA_MAX_FLOATS
               ? sdpa_fail(SDPA_ERR_SIZE, "n (%zu) is past PTRDIFF_MAX bytes of floats", n)
               : SDPA_OK;
}

/* the checks of softmax and its backward: a NULL array, the count, then the scale */
static sdpa_status row_args(const char *n1, const void *p1, const char *n2, const void *p2,
                            const char *n3, const void *p3, size_t n, float scale) {
    sdpa_status st = null_arg(n1, p1, n);
    if (st == SDPA_OK) st = null_arg(n2, p2, n);
    if (st == SDPA_OK && n3) st = null_arg(n3, p3, n);
    if (st == SDPA_OK) st = count_arg(n);
    if (st == SDPA_OK && (!isfinite(scale) || scale == 0.0f))
        st = sdpa_fail(SDPA_ERR_ARG, "scale (%g) must be finite and non-zero", (double)scale);
    return st;
}

SDPA_API sdpa_status sdpa_dot_f32(const float *a, const float *b, size_t n, float *result) {
    if (!result) return sdpa_fail(SDPA_ERR_NULL, "result is NULL");
    sdpa_status st = null_arg("a", a, n);
    if (st == SDPA_OK) st = null_arg("b", b, n);
    if (st == SDPA_OK) st = count_arg(n);
    if (st != SDPA_OK) return st;
    return (sdpa_status)sdpa_kernels_now()->dot_to(a, b, n, result); /* n == 0 too */
}

SDPA_API sdpa_status sdpa_scale_f32(float *y, const float *x, size_t n, float alpha) {
    sdpa_status st = null_arg("y", y, n);
    if (st == SDPA_OK) st = null_arg("x", x, n);
    if (st == SDPA_OK) st = count_arg(n);
    if (st != SDPA_OK) return st;
    if (n) sdpa_kernels_now()->scale(y, x, n, alpha);
    return SDPA_OK;
}

SDPA_API sdpa_status sdpa_scores_f32(float *s, const float *q, const float *k, size_t n_keys,
                                     size_t d, size_t k_stride, float scale) {
    sdpa_status st = null_arg("s", s, n_keys);
    if (st == SDPA_OK) st = null_arg("q", q, n_keys);
    if (st == SDPA_OK) st = null_arg("k", k, n_keys);
    if (st != SDPA_OK) return st;
    if (n_keys && d == 0) return sdpa_fail(SDPA_ERR_SIZE, "d is 0 with n_keys = %zu", n_keys);
    if (n_keys && k_stride < d)
        return sdpa_fail(SDPA_ERR_SIZE, "k_stride (%zu) is smaller than d (%zu)", k_stride, d);
    if (n_keys && !sdpa_rows_fit(n_keys, d, k_stride))
        return sdpa_fail(SDPA_ERR_SIZE,
                         "k's extent (n_keys %zu, k_stride %zu) is past "
                         "PTRDIFF_MAX bytes",
                         n_keys, k_stride);
    if (!isfinite(scale)) return sdpa_fail(SDPA_ERR_ARG, "scale (%g) is not finite", (double)scale);
    /* one query's row of attention's score tiles, which takes any number of keys */
    if (n_keys)
        sdpa_kernels_now()->attention->scores_tile(s, 0, q, 0, 1, k, k_stride, n_keys, d, scale);
    return SDPA_OK;
}

static void fill(float *y, size_t n, float value) {
    for (size_t i = 0; i < n; i++) y[i] = value;
}

/* The compiler assumes round-to-nearest (no -frounding-math), under which -(-a / b) is a / b, and
 * folds it so: OPAQUE(v) hides v's value from it. */
#if defined(__x86_64__) || defined(__i386__)
#define OPAQUE(v) __asm__("" : "+x"(v))
#elif defined(__aarch64__)
#define OPAQUE(v) __asm__("" : "+w"(v))
#else
#define OPAQUE(v) ((v) = *(volatile float *)&(v))
#endif

/* The factor normalize multiplies exps e <= sum (a sum of them) by: 1 / sum, such that no
 * weight e * factor exceeds 1 in any rounding mode. sum rounded to float is still >= every e (the
 * exps are floats), and -1 / it, negated, is rounded the mirror way of the mode: down where the
 * mode rounds up, and up where it rounds down, where the product's own rounding then takes
 * e * factor < 1 + 2^-23 down to at most 1; under round-to-nearest, e * fl(1 / sum) <= 1 + 2^-24
 * rounds to at most 1. Otherwise a dominant exp times the reciprocal of a sum just above it could
 * round to 1 + 2^-23 under FE_UPWARD. A float division: shorter than a double one and its
 * conversion. */
static inline float reciprocal_factor(double sum) {
    float q = -1.0f / (float)sum;
    OPAQUE(q);
    return -q;
}

/* The factor for a chunk whose exps e <= bound (their sum) were taken against a shift below the
 * row's max, `want` = exp(shift - max) / sum: want rounded, then lowered while bound * factor
 * rounds above 1, which the multiply of every weight then cannot do either (it rounds alike and
 * is monotonic). */
static float weight_factor(double want, double bound) {
    float f = (float)want, b = (float)bound;
    if (b > bound) b = nextafterf(b, 0.0f); /* the exps are floats, so none exceeds b */
    while (b * f > 1.0f) f = nextafterf(f, 0.0f);
    return f;
}

/* Each exp_sum call covers at most the backend's exp_sum_block floats and the calls' float sums
 * are added in double: a backend's lane sums then stay well inside the 2e-5 bound even when every
 * rounding errs the same way (the scalar backend's four lane sums did 3.1e-5 on a row of equal
 * small weights at n = 2815 with one call per 4096: tests/test_regressions.c). */
static double exp_sum_blocked(const sdpa_kernels *k, int exp_kind, float *y, const float *x,
                              size_t n, float scale, float shift) {
    const size_t block = k->exp_sum_block;
    double sum = 0.0;
    for (size_t i = 0; i < n; i += block)
        sum += k->exp_sum[exp_kind](y + i, x + i, n - i < block ? n - i : block, scale, shift);
    return sum;
}

/* exp_sum_blocked with the backend's exp_sum_max: also the max of scale * x[i] in *max */
static double exp_sum_max_blocked(const sdpa_kernels *k, int exp_kind, float *y, const float *x,
                                  size_t n, float scale, float shift, float *max) {
    const size_t block = k->exp_sum_block;
    double sum = 0.0;
    *max = -INFINITY;
    for (size_t i = 0; i < n; i += block) {
        float mb;
        sum += k->exp_sum_max[exp_kind](y + i, x + i, n - i < block ? n - i : block, scale, shift,
                                        &mb);
        if (!(mb <= *max)) *max = mb; /* NaN sticks */
    }
    return sum;
}

/* A chunk's weights against a guessed shift s (arch/shift_guess.h, "A guessed shift"), or against
 * its max where that passes s by more than the guess's range. Returns the shift used, with the
 * chunk's sum in *sum, or NaN for a chunk holding a NaN or +inf z (nothing written then, in
 * place). Apart from x, the max comes with the exps and a miss is done again from x, which is
 * still whole; in place, a max pass comes first. Both form the same exps with the same shift, so
 * y == x gives the bits of y apart from x. */
static float chunk_guessed(const sdpa_kernels *k, int exp_kind, float *y, const float *x,
                           size_t len, float scale, float s, int apart, double *sum) {
    float mc;
    if (apart) {
        *sum = exp_sum_max_blocked(k, exp_kind, y, x, len, scale, s, &mc);
        if (sdpa_guess_fits(s, mc)) return s;
    } else {
        mc = k->max_scaled(x, len, scale);
        if (sdpa_guess_fits(s, mc)) {
            *sum = exp_sum_blocked(k, exp_kind, y, x, len, scale, s);
            return s;
        }
    }
    if (!isfinite(mc)) return NAN; /* fits for -inf: mc is NaN or +inf */
    *sum = exp_sum_blocked(k, exp_kind, y, x, len, scale, mc);
    return mc;
}

/* The final pass of softmax_chunked: chunk c of y (its exps against shift[c], summing to
 * chunk_sum[c]) times exp(shift[c] - m) / sum, with m the row's max. sum >= 1 (the max
 * contributes exp(0)), or NaN when x holds a NaN: then every y is NaN. */
static void chunks_normalize(const sdpa_kernels *k, float *y, size_t n, size_t chunk,
                             const float *shift, const double *chunk_sum, float m, double sum) {
    size_t c = 0;
    for (size_t i = 0; i < n; i += chunk, c++) {
        size_t len = n - i < chunk ? n - i : chunk;
        if (shift[c] == -INFINITY && !isnan(sum))
            fill(y + i, len, 0.0f);
        else
            k->normalize(y + i, len,
                         shift[c] == m
                             ? reciprocal_factor(sum)
                             : weight_factor(exp((double)shift[c] - m) / sum, chunk_sum[c]));
    }
}

/* softmax of a row that softmax_short does not take, in chunks; apart from sdpa_softmax_f32 so
 * that the short rows' path carries none of this one's frame (six saved registers and the chunks'
 * shifts). Each chunk's weights are computed against the running max when the chunk is
 * reached (its shift); the final pass scales chunk c by exp(shift[c] - max) / sum, which is
 * exactly 1 / sum for a row of one chunk. A chunk whose z are all -inf has no weights and gets
 * zeros. */
static __attribute__((noinline)) void softmax_chunked(const sdpa_kernels *k, int exp_kind, float *y,
                                                      const float *x, size_t n, float scale) {
    if (n <= SOFTMAX_CHUNK) {
        /* one chunk, straight through: short rows are dominated by fixed costs */
        float m = k->max_scaled(x, n, scale);
        if (!isfinite(m)) {
            sdpa_softmax_nonfinite_from(y, x, n, scale, 0, 0);
            return;
        }
        /* the sum is >= 1 (the max contributes exp(0)), or NaN when x holds a NaN: then the
           factor, and so every y, is NaN */
        k->normalize(y, n, reciprocal_factor(exp_sum_blocked(k, exp_kind, y, x, n, scale, m)));
        return;
    }
    size_t chunk = SOFTMAX_CHUNK;
    if (n / SOFTMAX_MAX_CHUNKS >= chunk) chunk = (n / SOFTMAX_MAX_CHUNKS + 64) & ~(size_t)63;
    float shift[SOFTMAX_MAX_CHUNKS];
    double chunk_sum[SOFTMAX_MAX_CHUNKS]; /* each chunk's own, before any rescaling */
    float m = -INFINITY;
    double sum = 0.0;
    size_t c = 0;
    /* with exp_sum_max, a chunk's shift is guessed: the larger of m and the chunk's two ends, so
       never above the row's max (chunk_guessed) */
    const int guess = k->exp_sum_max[exp_kind] != NULL, apart = sdpa_apart(y, x, n);
    for (size_t i = 0; i < n; i += chunk, c++) {
        size_t len = n - i < chunk ? n - i : chunk;
        if (guess) {
            const float ends = sdpa_ends_guess(x + i, len, scale);
            float s = ends > m ? ends : m;
            if (sdpa_guess_usable(s)) {
                double sc;
                s = chunk_guessed(k, exp_kind, y + i, x + i, len, scale, s, apart, &sc);
                if (isnan(s)) {
                    sdpa_softmax_nonfinite_from(y, x, n, scale, i, isnan(sum));
                    return;
                }
                if (s > m) { /* s >= m: the chunk's shift is the new m */
                    if (sum != 0.0) sum *= exp((double)m - s);
                    m = s;
                }
                shift[c] = m;
                chunk_sum[c] = sc;
                sum += sc;
                continue;
            }
        }
        float mc = k->max_scaled(x + i, len, scale);
        if (!isfinite(mc) && !(mc == -INFINITY)) { /* NaN or +inf */
            sdpa_softmax_nonfinite_from(y, x, n, scale, i, isnan(sum));
            return;
        }
        if (mc == -INFINITY) {
            /* all -inf, unless max_scaled passed over a NaN */
            for (size_t j = i; j < i + len; j++)
                if (isnan(scale * x[j])) {
                    fill(y, n, NAN);
                    return;
                }
            shift[c] = -INFINITY;
            chunk_sum[c] = 0.0;
            continue;
        }
        if (mc > m) {
            if (sum != 0.0) sum *= exp((double)m - mc);
            m = mc;
        }
        shift[c] = m;
        /* the exp pass is compute-bound: meanwhile, bring the next chunk of x towards L2 so that
           its max pass does not wait for L3 or memory (about 5% at n = 2^20) */
        for (size_t j = i + chunk; j < i + 2 * chunk && j < n; j += 16)
            __builtin_prefetch(x + j, 0, 2);
        chunk_sum[c] = exp_sum_blocked(k, exp_kind, y + i, x + i, len, scale, m);
        sum += chunk_sum[c];
    }
    if (m == -INFINITY) { /* a fully masked row */
        fill(y, n, 0.0f);
        return;
    }
    chunks_normalize(k, y, n, chunk, shift, chunk_sum, m, sum);
}

SDPA_API sdpa_status sdpa_softmax_f32(float *y, const float *x, size_t n, float scale) {
    sdpa_status st = row_args("y", y, "x", x, NULL, NULL, n, scale);
    if (st != SDPA_OK) return st;
    if (!n) return SDPA_OK;
    const sdpa_kernels *k = sdpa_kernels_now();
    const int exp_kind = sdpa_exp_with(k);
    /* one call for the whole row, a jump: softmax_short returns SDPA_OK */
    if (n <= SDPA_SOFTMAX_SHORT && k->softmax_short[exp_kind])
        return k->softmax_short[exp_kind](y, x, n, scale);
    softmax_chunked(k, exp_kind, y, x, n, scale);
    return SDPA_OK;
}

/* sum y[i] dy[i] for the backward pass, whose every dx depends on it: the backend's float dot
 * over blocks of DOT_BLOCK, the blocks added in double. In any backend's dot of DOT_BLOCK floats
 * a product meets at most about 70 float roundings (the vector backends keep 32 or more partial
 * sums, scalar four lanes in blocks of 256), in any rounding mode, however long the row; one
 * float dot over a row of 2^20 drifted by 1.4e-5 on equal terms. Rows long enough to need
 * blocks are memory-bound, so a call per block costs nothing measurable. */
#define DOT_BLOCK 1024
static float dot_blocked(const sdpa_kernels *k, const float *a, const float *b, size_t n) {
    if (n <= DOT_BLOCK) return k->dot(a, b, n);
    double sum = 0.0;
    for (size_t i = 0; i < n; i += DOT_BLOCK)
        sum += k->dot(a + i, b + i, n - i < DOT_BLOCK ? n - i : DOT_BLOCK);
    return (float)sum;
}

SDPA_API sdpa_status sdpa_softmax_backward_f32(float *dx, const float *y, const float *dy, size_t n,
                                               float scale) {
    sdpa_status st = row_args("dx", dx, "y", y, "dy", dy, n, scale);
    if (st != SDPA_OK) return st;
    if (!n) return SDPA_OK;
    const sdpa_kernels *k = sdpa_kernels_now();
    k->softmax_backward(dx, y, dy, n, scale, dot_blocked(k, y, dy, n));
    return SDPA_OK;
}
