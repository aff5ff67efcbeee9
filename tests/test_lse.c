/* The log-sum-exp output of sdpa_mha_f32 (sdpa_mha_desc's v2 tail): each query row's
 * log sum_j exp(s_j) over the keys it sees, against a double-precision evaluation of the scores,
 * through every path the driver takes (blocks of one row and of many, GQA decode, causal rows
 * that see nothing, masks, NaN rows, no keys), every backend. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "reference.h"

/* row i of one head in double: lse and the size of its terms, sum_p |scale q_p k_jp| at most */
static void ref_lse(const float *q, const float *k, size_t k_stride, const float *mask,
                    size_t len_kv, size_t seen, size_t d_k, double scale, double *lse,
                    double *terms) {
    double m = -INFINITY, s[512];
    int nan = 0;
    *terms = 0.0;
    for (size_t j = 0; j < seen; j++) {
        double dot = ref_dot(q, k + j * k_stride, d_k),
               t = fabs(scale) * ref_dot_abs(q, k + j * k_stride, d_k);
        s[j] = scale * dot + (mask ? mask[j] : 0.0);
        if (mask && mask[j] == -INFINITY) s[j] = -INFINITY;
        if (t > *terms) *terms = t;
        nan |= isnan(s[j]);
        if (s[j] > m) m = s[j];
    }
    (void)len_kv;
    if (nan) {
        *lse = NAN;
        return;
    }
    if (m == -INFINITY) {
        *lse = -INFINITY;
        return;
    }
    double sum = 0.0;
    for (size_t j = 0; j < seen; j++) sum += exp(s[j] - m);
    *lse = m + log(sum);
}

typedef struct lse_case {
    size_t batch, heads_q, heads_kv, len_q, len_kv, d;
    int causal, masked, bshd, nan_row;
} lse_case;

static void run_case(rng *r, const lse_case *c) {
    sdpa_mha_desc desc;
    sdpa_status st = (c->bshd ? sdpa_mha_desc_bshd : sdpa_mha_desc_dense)(
        &desc, c->batch, c->heads_q, c->heads_kv, c->len_q, c->len_kv, c->d, c->d, 0.0f,
        c->causal ? SDPA_CAUSAL : 0);
    cr_assert_eq(st, SDPA_OK);
    const size_t nq = c->batch * c->heads_q * c->len_q * c->d;
    const size_t nkv = c->batch * c->heads_kv * c->len_kv * c->d;
    float *q = malloc((nq + 1) * sizeof(float)), *k = malloc((nkv + 1) * sizeof(float));
    float *v = malloc((nkv + 1) * sizeof(float)), *out = malloc((nq + 1) * sizeof(float));
    float *mask = malloc((c->len_q * c->len_kv + 1) * sizeof(float));
    /* lse padded between heads and batches: its strides are the caller's */
    const size_t head_stride = c->len_q + 3, batch_stride = c->heads_q * head_stride + 5;
    float *lse = malloc(c->batch * batch_stride * sizeof(float));
    cr_assert(q && k && v && out && mask && lse);
    for (size_t i = 0; i < nq; i++) q[i] = (float)rng_normal(r);
    for (size_t i = 0; i < nkv; i++) k[i] = (float)rng_normal(r), v[i] = (float)rng_normal(r);
    for (size_t i = 0; i < c->len_q * c->len_kv; i++)
        mask[i] = rng_uniform(r, 0, 1) < 0.2 ? -INFINITY : (float)rng_uniform(r, -2, 2);
    if (c->masked && c->len_kv)
        for (size_t j = 0; j < c->len_kv; j++) mask[j] = -INFINITY; /* row 0 sees nothing */
    if (c->nan_row) q[c->d / 2] = NAN;                              /* row 0 of head 0, batch 0 */
    for (size_t i = 0; i < c->batch * batch_stride; i++) lse[i] = SENTINEL;
    if (c->masked) sdpa_mha_desc_set_mask(&desc, mask, 0, 0, c->len_kv);
    desc.lse = lse;
    desc.lse_stride[0] = batch_stride;
    desc.lse_stride[1] = head_stride;
    cr_assert_eq(sdpa_mha_f32(&desc, out, q, k, v), SDPA_OK);

    const double scale = 1.0 / sqrt((double)c->d);
    const size_t group = c->heads_q / c->heads_kv;
    for (size_t b = 0; b < c->batch; b++)
        for (size_t h = 0; h < c->heads_q; h++) {
            for (size_t i = 0; i < c->len_q; i++) {
                const float *qi =
                    q + b * desc.q_stride[0] + h * desc.q_stride[1] + i * desc.q_stride[2];
                const float *kb = k + b * desc.k_stride[0] + h / group * desc.k_stride[1];
                size_t seen = c->len_kv;
                if (c->causal) {
                    size_t i1 = i + 1;
                    seen = i1 + c->len_kv > c->len_q ? i1 + c->len_kv - c->len_q : 0;
                    if (seen > c->len_kv) seen = c->len_kv;
                }
                double want, terms;
                ref_lse(qi, kb, desc.k_stride[2], c->masked ? mask + i * c->len_kv : NULL,
                        c->len_kv, seen, c->d, scale, &want, &terms);
                const float got = lse[b * batch_stride + h * head_stride + i];
                if (isnan(want) || isinf(want)) {
                    cr_assert(isnan(want) ? isnan(got) : got == (float)want,
                              "b %zu h %zu row %zu: want %g, got %g", b, h, i, want, got);
                    continue;
                }
                /* the scores' float rounding (a dot's error scales with its terms), then the
                   rounding of the result */
                const double tol =
                    2.0 * (double)(c->d + 2) * 0x1p-24 * terms + 8.0 * 0x1p-24 * fabs(want) + 1e-6;
                cr_assert(fabs(got - want) <= tol,
                          "b %zu h %zu row %zu (len_q %zu len_kv %zu d %zu causal %d): lse %.9g "
                          "want %.9g",
                          b, h, i, c->len_q, c->len_kv, c->d, c->causal, got, want);
            }
            /* the padding between heads is the caller's */
            for (size_t i = c->len_q; i < head_stride; i++)
                cr_assert_eq(lse[b * batch_stride + h * head_stride + i], SENTINEL);
        }
    free(q);
    free(k);
    free(v);
    free(out);
    free(mask);
    free(lse);
}

BACKEND_TEST(lse, matches_the_reference_on_every_path) {
    rng r = rng_seed(2024);
    const lse_case cases[] = {
        {1, 1, 1, 1, 1, 4, 0, 0, 0, 0},     /* one key */
        {1, 1, 1, 5, 37, 16, 0, 0, 0, 0},   /* rows one at a time */
        {2, 2, 2, 40, 130, 64, 0, 0, 0, 0}, /* blocks of many rows, several key blocks */
        {1, 2, 1, 33, 70, 128, 1, 0, 1, 0}, /* causal, GQA, BSHD */
        {1, 1, 1, 50, 20, 32, 1, 0, 0, 0},  /* causal rows that see no key: -inf */
        {1, 8, 1, 1, 300, 64, 0, 0, 0, 0},  /* GQA decode: heads as the rows of one block */
        {2, 16, 2, 1, 65, 80, 0, 0, 1, 0},  /* the same, BSHD, two blocks of heads */
        {1, 2, 2, 12, 24, 24, 0, 1, 0, 0},  /* masked, row 0 sees nothing */
        {1, 1, 1, 9, 10, 8, 0, 0, 0, 1},    /* a NaN query row: NaN */
        {1, 1, 1, 9, 10, 300, 0, 0, 0, 0},  /* past the packed path's d_k */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&r, &cases[i]);
}

/* No key at all: every row's lse is -inf (and out is zeros). */
BACKEND_TEST(lse, no_keys_gives_minus_infinity) {
    sdpa_mha_desc desc;
    cr_assert_eq(sdpa_mha_desc_dense(&desc, 1, 2, 1, 3, 0, 4, 4, 0.0f, 0), SDPA_OK);
    float out[2 * 3 * 4], lse[6], in[1] = {0};
    desc.lse = lse;
    desc.lse_stride[0] = 6;
    desc.lse_stride[1] = 3;
    cr_assert_eq(sdpa_mha_f32(&desc, out, in, in, in), SDPA_OK);
    for (size_t i = 0; i < 6; i++) cr_assert_eq(lse[i], -INFINITY);
}

/* The v2 tail's rules: unknown types or a non-zero reserved are SDPA_ERR_ARG, an lse whose
 * entries share a place or run past any array is SDPA_ERR_SIZE, and a v1 caller's struct_size
 * leaves the tail unread, whatever it holds. Nothing is written on error. */
BACKEND_TEST(lse, descriptor_tail_rules) {
    static float in[256], out[256], lse[16];
    sdpa_mha_desc ok, d;
    cr_assert_eq(sdpa_mha_desc_dense(&ok, 2, 2, 1, 3, 4, 4, 4, 0.0f, 0), SDPA_OK);
    cr_assert_eq(ok.lse, NULL, "the helpers leave lse NULL");
    cr_assert(ok.q_type == 0 && ok.kv_type == 0 && ok.out_type == 0 && ok.reserved == 0);
    ok.lse = lse;
    ok.lse_stride[0] = 6;
    ok.lse_stride[1] = 3;
    cr_assert_eq(sdpa_mha_f32(&ok, out, in, in, in), SDPA_OK);
    struct {
        const char *what;
        sdpa_status want;
    } bad[] = {{"q_type", SDPA_ERR_ARG},          {"kv_type", SDPA_ERR_ARG},
               {"out_type", SDPA_ERR_ARG},        {"reserved", SDPA_ERR_ARG},
               {"batch stride 0", SDPA_ERR_SIZE}, {"head stride 2", SDPA_ERR_SIZE},
               {"huge stride", SDPA_ERR_SIZE}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        d = ok;
        switch (i) {
        case 0: d.q_type = 1; break;
        case 1: d.kv_type = 2; break;
        case 2: d.out_type = 7; break;
        case 3: d.reserved = 1; break;
        case 4: d.lse_stride[0] = 0; break;
        case 5: d.lse_stride[1] = 2; break;
        default: d.lse_stride[0] = SIZE_MAX / 2; break;
        }
        for (size_t j = 0; j < 16; j++) lse[j] = SENTINEL;
        for (size_t j = 0; j < 256; j++) out[j] = SENTINEL;
        cr_assert_eq(sdpa_mha_f32(&d, out, in, in, in), bad[i].want, "%s", bad[i].what);
        for (size_t j = 0; j < 16; j++)
            cr_assert_eq(lse[j], SENTINEL, "%s: lse written", bad[i].what);
        for (size_t j = 0; j < 256; j++)
            cr_assert_eq(out[j], SENTINEL, "%s: out written", bad[i].what);
    }
    /* a v1 caller: the tail is not part of its struct */
    d = ok;
    d.struct_size = (uint32_t)(offsetof(sdpa_mha_desc, mask_stride) + sizeof d.mask_stride);
    d.q_type = 99, d.reserved = 5, d.lse = (float *)1;
    cr_assert_eq(sdpa_mha_f32(&d, out, in, in, in), SDPA_OK);
}
