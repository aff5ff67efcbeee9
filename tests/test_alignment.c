/* Results are a function of the values, the shape, the backend and the settings, never of where
 * the data sits: every entry point, given the same values at other addresses, writes the same
 * bits. Float views move by whole floats (4 to 60 bytes past a 64-byte boundary); the views that
 * sdpa_mha and sdpa_convert take as void * also move to odd byte addresses, which the header
 * allows: pointers need no particular alignment (a float * at an odd address cannot be formed in
 * C without undefined behaviour, so the mask and lse beside them keep to whole floats). The
 * sanitizers' build (scripts/test-sanitizers) runs this file under UBSan, where a misaligned
 * access inside the library is a failure. Each array gets its own offset, so that q, k, v, out,
 * the mask and lse are misaligned against each other too. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

/* bytes past a 64-byte boundary: whole floats, then any byte */
static const size_t FLOAT_OFFSETS[] = {0, 4, 12, 36, 60};
static const size_t BYTE_OFFSETS[] = {0, 1, 3, 6, 13, 35, 61};
#define N_OF(a) (sizeof(a) / sizeof((a)[0]))
static const char *const EXP_MODES[] = {"fast", "sleef"};

enum { MAX_ARRAYS = 12 };
typedef struct array {
    const void *data; /* the values (NULL for an output) */
    size_t bytes;
} array;
/* runs the call under test on the arrays at p[i], in the order of its array list */
typedef void (*run_fn)(void *const *p, const void *ctx);

/* The call on every array at offset 0, then with array i at offsets[(t + i) % n_offsets] for
 * t = 1 .. n_offsets - 1 (whole floats where bit i of float_views is set: a float * view): the
 * outputs must match the first run's bit for bit. */
static void same_bits_anywhere(const array *arr, size_t n, run_fn run, const void *ctx,
                               const size_t *offsets, size_t n_offsets, unsigned float_views,
                               const char *what) {
    cr_assert(n <= MAX_ARRAYS);
    unsigned char *want[MAX_ARRAYS] = {0};
    for (size_t t = 0; t < n_offsets; t++) {
        unsigned char *base[MAX_ARRAYS];
        void *p[MAX_ARRAYS];
        for (size_t i = 0; i < n; i++) {
            size_t off = t ? offsets[(t + i) % n_offsets] : 0;
            if (float_views >> i & 1) off -= off % sizeof(float);
            base[i] = aligned_alloc(64, (arr[i].bytes + 64 + 63) / 64 * 64);
            cr_assert_not_null(base[i]);
            p[i] = base[i] + off;
            if (arr[i].data)
                memcpy(p[i], arr[i].data, arr[i].bytes);
            else
                memset(p[i], 0, arr[i].bytes);
        }
        run(p, ctx);
        for (size_t i = 0; i < n; i++) {
            if (arr[i].data) {
                cr_assert(memcmp(p[i], arr[i].data, arr[i].bytes) == 0, "%s: input %zu written",
                          what, i);
            } else if (t == 0) {
                want[i] = malloc(arr[i].bytes + 1);
                memcpy(want[i], p[i], arr[i].bytes);
            } else {
                size_t differ = 0, first = 0;
                for (size_t b = arr[i].bytes; b-- > 0;)
                    if (((unsigned char *)p[i])[b] != want[i][b]) differ++, first = b;
                cr_assert(
                    differ == 0,
                    "%s (%s, %s): output %zu differs in %zu bytes (first at byte %zu), the first "
                    "array at %zu bytes past a 64-byte boundary and each next one at the "
                    "next offset of the list",
                    what, sdpa_backend(), sdpa_exp_mode(), i, differ, first,
                    offsets[t % n_offsets]);
            }
            free(base[i]);
        }
    }
    for (size_t i = 0; i < n; i++) free(want[i]);
}

/* body() once in each exp mode, the mode restored after */
static void each_exp_mode(void (*body)(void)) {
    char saved[16];
    strncpy(saved, sdpa_exp_mode(), sizeof saved - 1);
    saved[sizeof saved - 1] = 0;
    for (size_t e = 0; e < N_OF(EXP_MODES); e++) {
        cr_assert_eq(sdpa_set_exp_mode(EXP_MODES[e]), SDPA_OK);
        body();
    }
    sdpa_set_exp_mode(saved);
}

static float *normal_floats(uint64_t seed, size_t n) {
    rng r = rng_seed(seed);
    float *x = malloc((n + 1) * sizeof *x);
    fill_normal(&r, x, n);
    return x;
}

/* n values of type t (from unit normals), as bytes */
static void *typed_values(uint64_t seed, size_t n, sdpa_dtype t) {
    float *x = normal_floats(seed, n);
    if (t == SDPA_F32) return x;
    void *y = malloc(2 * n + 2);
    cr_assert_eq(sdpa_convert(y, t, x, SDPA_F32, n), SDPA_OK);
    free(x);
    return y;
}
static size_t type_size(sdpa_dtype t) { return t == SDPA_F32 ? 4 : 2; }

/* ---- the row entry points ---- */
typedef struct row_call {
    size_t n, d;
} row_call;

static void run_dot(void *const *p, const void *ctx) {
    const row_call *c = ctx;
    cr_assert_eq(sdpa_dot_f32(p[0], p[1], c->n, p[2]), SDPA_OK);
}
static void run_softmax(void *const *p, const void *ctx) {
    const row_call *c = ctx;
    cr_assert_eq(sdpa_softmax_f32(p[1], p[0], c->n, 0.7f), SDPA_OK);
}
static void run_scale(void *const *p, const void *ctx) {
    const row_call *c = ctx;
    cr_assert_eq(sdpa_scale_f32(p[1], p[0], c->n, 0.3f), SDPA_OK);
}
static void run_scores(void *const *p, const void *ctx) {
    const row_call *c = ctx;
    cr_assert_eq(sdpa_scores_f32(p[2], p[0], p[1], c->n, c->d, c->d, 0.125f), SDPA_OK);
}

static void rows_modes(void) {
    static const size_t SIZES[] = {17, 64, 100, 257, 1000, 4099, 5000, 20000};
    for (size_t s = 0; s < N_OF(SIZES); s++) {
        const row_call c = {SIZES[s], 0};
        float *a = normal_floats(1 + s, c.n), *b = normal_floats(100 + s, c.n);
        const array dot[] = {{a, c.n * 4}, {b, c.n * 4}, {NULL, 4}};
        same_bits_anywhere(dot, 3, run_dot, &c, FLOAT_OFFSETS, N_OF(FLOAT_OFFSETS), 0, "dot");
        const array row[] = {{a, c.n * 4}, {NULL, c.n * 4}};
        same_bits_anywhere(row, 2, run_softmax, &c, FLOAT_OFFSETS, N_OF(FLOAT_OFFSETS), 0,
                           "softmax");
        same_bits_anywhere(row, 2, run_scale, &c, FLOAT_OFFSETS, N_OF(FLOAT_OFFSETS), 0, "scale");
        free(a), free(b);
    }
    /* scores over long rows: the dot's own loops */
    const row_call c = {37, 300};
    float *q = normal_floats(7, c.d), *k = normal_floats(8, c.n * c.d);
    const array sc[] = {{q, c.d * 4}, {k, c.n * c.d * 4}, {NULL, c.n * 4}};
    same_bits_anywhere(sc, 3, run_scores, &c, FLOAT_OFFSETS, N_OF(FLOAT_OFFSETS), 0, "scores");
    free(q), free(k);
}

BACKEND_TEST(alignment, rows) { each_exp_mode(rows_modes); }

/* softmax and scale in place (y == x) write the bits they write into another array: where y
 * holds the result is no more a setting than where x sits. Rows short and long (the chunked
 * path), with a max that a chunk's guessed shift misses. */
static void in_place_modes(void) {
    static const size_t SIZES[] = {17, 1000, 4096, 4097, 10000, 70000};
    for (size_t s = 0; s < N_OF(SIZES); s++) {
        const size_t n = SIZES[s];
        float *x = normal_floats(200 + s, n), *apart = malloc(n * 4), *in_place = malloc(n * 4);
        x[n / 2] = 90.0f; /* far above the ends that a chunk's shift is guessed from */
        memcpy(in_place, x, n * 4);
        cr_assert_eq(sdpa_softmax_f32(apart, x, n, 0.7f), SDPA_OK);
        cr_assert_eq(sdpa_softmax_f32(in_place, in_place, n, 0.7f), SDPA_OK);
        cr_assert(memcmp(apart, in_place, n * 4) == 0, "softmax in place, n = %zu (%s, %s)", n,
                  sdpa_backend(), sdpa_exp_mode());
        memcpy(in_place, x, n * 4);
        cr_assert_eq(sdpa_scale_f32(apart, x, n, 0.3f), SDPA_OK);
        cr_assert_eq(sdpa_scale_f32(in_place, in_place, n, 0.3f), SDPA_OK);
        cr_assert(memcmp(apart, in_place, n * 4) == 0, "scale in place, n = %zu (%s)", n,
                  sdpa_backend());
        free(x), free(apart), free(in_place);
    }
}

BACKEND_TEST(alignment, in_place) { each_exp_mode(in_place_modes); }

/* ---- attention ---- */
typedef struct attn_call {
    size_t len_q, len_kv, d;
} attn_call;

static void run_attention(void *const *p, const void *ctx) {
    const attn_call *c = ctx;
    cr_assert_eq(
        sdpa_attention_f32(p[3], p[0], p[1], p[2], c->len_q, c->len_kv, c->d, c->d, 0.0f, 0),
        SDPA_OK);
}

static void attention_f32_modes(void) {
    /* a prefill whose last keys fall outside a full key block, and single queries */
    static const attn_call CALLS[] = {{100, 37, 64}, {1, 4099, 128}, {3, 513, 200}};
    for (size_t i = 0; i < N_OF(CALLS); i++) {
        const attn_call *c = &CALLS[i];
        float *q = normal_floats(11, c->len_q * c->d), *k = normal_floats(12, c->len_kv * c->d);
        float *v = normal_floats(13, c->len_kv * c->d);
        const array a[] = {{q, c->len_q * c->d * 4},
                           {k, c->len_kv * c->d * 4},
                           {v, c->len_kv * c->d * 4},
                           {NULL, c->len_q * c->d * 4}};
        same_bits_anywhere(a, 4, run_attention, c, FLOAT_OFFSETS, N_OF(FLOAT_OFFSETS), 0,
                           "sdpa_attention_f32");
        free(q), free(k), free(v);
    }
}

BACKEND_TEST(alignment, attention_f32) { each_exp_mode(attention_f32_modes); }

/* sdpa_mha: one batch, dense heads, an optional mask shared by the heads, and lse */
typedef struct mha_call {
    size_t heads_q, heads_kv, len_q, len_kv, d;
    sdpa_dtype q_type, kv_type, out_type;
    int masked;
    uint32_t flags;
} mha_call;

static void mha_desc(sdpa_mha_desc *desc, const mha_call *c) {
    cr_assert_eq(sdpa_mha_desc_dense(desc, 1, c->heads_q, c->heads_kv, c->len_q, c->len_kv, c->d,
                                     c->d, SDPA_DEFAULT_SCALE, c->flags),
                 SDPA_OK);
    desc->q_type = c->q_type, desc->kv_type = c->kv_type, desc->out_type = c->out_type;
    desc->lse_stride[0] = c->heads_q * c->len_q;
    desc->lse_stride[1] = c->len_q;
}

/* arrays: q, k, v, out, lse, mask (when masked) */
static void run_mha(void *const *p, const void *ctx) {
    const mha_call *c = ctx;
    sdpa_mha_desc desc;
    mha_desc(&desc, c);
    desc.lse = p[4];
    if (c->masked) cr_assert_eq(sdpa_mha_desc_set_mask(&desc, p[5], 0, 0, c->len_kv), SDPA_OK);
    cr_assert_eq(sdpa_mha(&desc, p[3], p[0], p[1], p[2]), SDPA_OK);
}

static void mha_anywhere(const mha_call *c, const size_t *offsets, size_t n_offsets) {
    const size_t nq = c->heads_q * c->len_q * c->d, nk = c->heads_kv * c->len_kv * c->d;
    void *q = typed_values(21, nq, c->q_type), *k = typed_values(22, nk, c->kv_type);
    void *v = typed_values(23, nk, c->kv_type);
    float *mask = normal_floats(24, c->len_q * c->len_kv);
    for (size_t i = 0; i < c->len_q * c->len_kv; i += 7) mask[i] = -INFINITY;
    const array a[] = {{q, nq * type_size(c->q_type)},    {k, nk * type_size(c->kv_type)},
                       {v, nk * type_size(c->kv_type)},   {NULL, nq * type_size(c->out_type)},
                       {NULL, c->heads_q * c->len_q * 4}, {mask, c->len_q * c->len_kv * 4}};
    same_bits_anywhere(a, c->masked ? 6 : 5, run_mha, c, offsets, n_offsets,
                       1u << 4 | 1u << 5 /* lse, mask */, "sdpa_mha");
    free(q), free(k), free(v), free(mask);
}

static const mha_call MHA_CALLS[] = {
    /* decode, grouped heads, 16-bit K and V */
    {32, 8, 1, 513, 128, SDPA_F32, SDPA_F16, SDPA_F32, 0, 0},
    {32, 8, 1, 513, 128, SDPA_F16, SDPA_F16, SDPA_F16, 0, 0},
    {32, 8, 1, 4099, 128, SDPA_F32, SDPA_F32, SDPA_F32, 0, 0},
    {8, 2, 1, 1000, 64, SDPA_BF16, SDPA_BF16, SDPA_BF16, 1, 0},
    /* prefill: f32 with a mask, all-bf16 (the bf16 dot's blocks), f16 causal */
    {2, 1, 100, 37, 64, SDPA_F32, SDPA_F32, SDPA_F32, 1, 0},
    {2, 2, 40, 300, 64, SDPA_BF16, SDPA_BF16, SDPA_F32, 0, 0},
    {2, 1, 33, 150, 40, SDPA_F16, SDPA_F16, SDPA_BF16, 1, SDPA_CAUSAL},
};

static void mha_whole_floats_modes(void) {
    for (size_t i = 0; i < N_OF(MHA_CALLS); i++)
        mha_anywhere(&MHA_CALLS[i], FLOAT_OFFSETS, N_OF(FLOAT_OFFSETS));
}

BACKEND_TEST(alignment, mha_whole_floats) { each_exp_mode(mha_whole_floats_modes); }

/* every void * view at odd byte addresses, every type */
BACKEND_TEST(alignment, mha_any_byte) {
    for (size_t i = 0; i < N_OF(MHA_CALLS); i++)
        mha_anywhere(&MHA_CALLS[i], BYTE_OFFSETS, N_OF(BYTE_OFFSETS));
    static const sdpa_dtype TYPES[] = {SDPA_F32, SDPA_F16, SDPA_BF16};
    for (size_t t = 0; t < N_OF(TYPES); t++) {
        const mha_call c = {4, 2, 19, 70, 24, TYPES[t], TYPES[t], TYPES[t], 1, SDPA_CAUSAL};
        mha_anywhere(&c, BYTE_OFFSETS, N_OF(BYTE_OFFSETS));
        const mha_call d = {4, 4, 1, 70, 24, TYPES[t], TYPES[(t + 1) % 3], TYPES[(t + 2) % 3],
                            1, 0};
        mha_anywhere(&d, BYTE_OFFSETS, N_OF(BYTE_OFFSETS));
    }
}

/* ---- sdpa_convert ---- */
typedef struct convert_call {
    size_t n;
    sdpa_dtype from, to;
} convert_call;

static void run_convert(void *const *p, const void *ctx) {
    const convert_call *c = ctx;
    cr_assert_eq(sdpa_convert(p[1], c->to, p[0], c->from, c->n), SDPA_OK);
}

BACKEND_TEST(alignment, convert_any_byte) {
    static const sdpa_dtype TYPES[] = {SDPA_F32, SDPA_F16, SDPA_BF16};
    static const size_t SIZES[] = {1, 7, 16, 33, 100, 1001};
    for (size_t s = 0; s < N_OF(SIZES); s++)
        for (size_t f = 0; f < N_OF(TYPES); f++)
            for (size_t t = 0; t < N_OF(TYPES); t++) {
                const convert_call c = {SIZES[s], TYPES[f], TYPES[t]};
                void *src = typed_values(31 + s, c.n, c.from);
                const array a[] = {{src, c.n * type_size(c.from)}, {NULL, c.n * type_size(c.to)}};
                same_bits_anywhere(a, 2, run_convert, &c, BYTE_OFFSETS, N_OF(BYTE_OFFSETS), 0,
                                   "sdpa_convert");
                free(src);
            }
}

/* ---- the backward ---- */
typedef struct backward_call {
    size_t heads_q, heads_kv, len_q, len_kv, d;
    int masked;
    uint32_t flags;
} backward_call;

static void backward_desc(sdpa_mha_desc *desc, sdpa_mha_grads *g, const backward_call *c) {
    const mha_call m = {c->heads_q, c->heads_kv, c->len_q, c->len_kv, c->d,
                        SDPA_F32,   SDPA_F32,    SDPA_F32, c->masked, c->flags};
    mha_desc(desc, &m);
    memset(g, 0, sizeof *g);
    g->struct_size = sizeof *g;
    memcpy(g->dq_stride, desc->q_stride, sizeof g->dq_stride);
    memcpy(g->dk_stride, desc->k_stride, sizeof g->dk_stride);
    memcpy(g->dv_stride, desc->v_stride, sizeof g->dv_stride);
    memcpy(g->dout_stride, desc->out_stride, sizeof g->dout_stride);
}

/* arrays: q, k, v, out, lse, dout, dq, dk, dv, mask (when masked) */
static void run_backward(void *const *p, const void *ctx) {
    const backward_call *c = ctx;
    sdpa_mha_desc desc;
    sdpa_mha_grads g;
    backward_desc(&desc, &g, c);
    desc.lse = p[4];
    if (c->masked) cr_assert_eq(sdpa_mha_desc_set_mask(&desc, p[9], 0, 0, c->len_kv), SDPA_OK);
    g.dout = p[5], g.dq = p[6], g.dk = p[7], g.dv = p[8];
    cr_assert_eq(sdpa_mha_backward_f32(&desc, &g, p[0], p[1], p[2], p[3]), SDPA_OK);
}

static void backward_modes(void) {
    static const backward_call CALLS[] = {
        {2, 1, 60, 700, 64, 1, 0}, {4, 2, 37, 1100, 40, 0, SDPA_CAUSAL}, {1, 1, 1, 513, 128, 0, 0}};
    for (size_t i = 0; i < N_OF(CALLS); i++) {
        const backward_call *c = &CALLS[i];
        const size_t nq = c->heads_q * c->len_q * c->d, nk = c->heads_kv * c->len_kv * c->d;
        float *q = normal_floats(41, nq), *k = normal_floats(42, nk);
        float *v = normal_floats(43, nk), *dout = normal_floats(44, nq);
        float *mask = normal_floats(45, c->len_q * c->len_kv);
        float *out = malloc(nq * 4), *lse = malloc(c->heads_q * c->len_q * 4);
        sdpa_mha_desc desc;
        sdpa_mha_grads g;
        backward_desc(&desc, &g, c);
        desc.lse = lse;
        if (c->masked) sdpa_mha_desc_set_mask(&desc, mask, 0, 0, c->len_kv);
        cr_assert_eq(sdpa_mha_f32(&desc, out, q, k, v), SDPA_OK);
        const array a[] = {{q, nq * 4},
                           {k, nk * 4},
                           {v, nk * 4},
                           {out, nq * 4},
                           {lse, c->heads_q * c->len_q * 4},
                           {dout, nq * 4},
                           {NULL, nq * 4},
                           {NULL, nk * 4},
                           {NULL, nk * 4},
                           {mask, c->len_q * c->len_kv * 4}};
        same_bits_anywhere(a, c->masked ? 10 : 9, run_backward, c, FLOAT_OFFSETS,
                           N_OF(FLOAT_OFFSETS), 0, "sdpa_mha_backward_f32");
        free(q), free(k), free(v), free(dout), free(mask), free(out), free(lse);
    }
}

BACKEND_TEST(alignment, backward) { each_exp_mode(backward_modes); }
