/* sdpa_attention_paged and sdpa_kv_cache_store on every backend: random batches of sequences
 * (0 and 1 query rows, no keys, partly used last blocks, block sizes 1, 5, 16, 32 and 64, random
 * block tables) over pools whose unused blocks and slots hold NaN, against the double-precision
 * reference and sdpa_mha on gathered dense copies (the same bits where blocks hold a multiple of
 * 64 keys); the same bits whatever the table (the same values at other blocks) and at 1 to 5
 * threads; every error, with nothing written. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bounds.h"
#include "common.h"
#include "reference.h"

#define MAX_SEQS 8

static size_t type_size(sdpa_dtype t) { return t == SDPA_F32 ? 4 : 2; }

/* the value element i of an array of type t holds, from the formats' definitions */
static double value_of(const void *base, size_t i, sdpa_dtype t) {
    if (t == SDPA_F32) return ((const float *)base)[i];
    uint16_t h;
    memcpy(&h, (const char *)base + 2 * i, 2);
    return t == SDPA_F16 ? ref_f16(h) : ref_bf16(h);
}

/* n elements of type t from n floats */
static void store_row(void *dst, const float *src, size_t n, sdpa_dtype t) {
    cr_assert_eq(sdpa_convert(dst, t, src, SDPA_F32, n), SDPA_OK);
}

/* n NaNs of type t */
static void fill_nan(void *dst, size_t n, sdpa_dtype t) {
    for (size_t i = 0; i < n; i++) {
        if (t == SDPA_F32) {
            const float x = NAN;
            memcpy((char *)dst + 4 * i, &x, 4);
        } else {
            const uint16_t x = t == SDPA_F16 ? 0x7e00 : 0x7fc0;
            memcpy((char *)dst + 2 * i, &x, 2);
        }
    }
}

static size_t pick(rng *r, size_t lo, size_t hi) {
    return lo + (size_t)rng_uniform(r, 0.0, (double)(hi - lo + 1));
}

/* ---- a batch and its pool ---- */

typedef struct paged_case {
    size_t num_seqs, heads_q, heads_kv, d_k, d_v, block_size;
    sdpa_dtype q_type, kv_type, out_type;
    int causal;
    int lse;              /* 0: none, 1: [token][head], 2: [head][token] */
    int in_order;         /* the sequences' blocks one after another in the pool, not at random */
    size_t threads_after; /* check_case's run at random blocks on this many threads (0: as set) */
    int32_t rows[MAX_SEQS], keys[MAX_SEQS];
} paged_case;

typedef struct paged_data {
    sdpa_batch batch;
    sdpa_kv_cache cache;
    int32_t q_start[MAX_SEQS + 1], kv_len[MAX_SEQS];
    int32_t *table;
    void *q, *k_pool, *v_pool, *out;
    float *lse;
    size_t rows, q_bytes, out_bytes, lse_floats, k_elems, v_elems;
} paged_data;

/* a random pool of (stride[2] apart) rows of `row` values of type t at the used tokens, NaN
   everywhere else */
static void fill_pool(rng *r, const paged_case *c, const paged_data *d, void *pool,
                      const size_t stride[3], size_t row, size_t elems) {
    fill_nan(pool, elems, c->kv_type);
    float *f = malloc(row * sizeof *f);
    for (size_t s = 0; s < c->num_seqs; s++)
        for (int32_t j = 0; j < c->keys[s]; j++) {
            const int32_t b = d->table[s * d->cache.block_table_stride + (size_t)j / c->block_size];
            for (size_t h = 0; h < c->heads_kv; h++) {
                fill_normal(r, f, row);
                const size_t at =
                    (size_t)b * stride[0] + h * stride[1] + ((size_t)j % c->block_size) * stride[2];
                store_row((char *)pool + at * type_size(c->kv_type), f, row, c->kv_type);
            }
        }
    free(f);
}

/* 0 .. n-1 in a random order */
static int32_t *random_permutation(rng *r, size_t n) {
    int32_t *perm = malloc(n * sizeof *perm);
    for (size_t i = 0; i < n; i++) perm[i] = (int32_t)i;
    for (size_t i = n - 1; i > 0; i--) {
        const size_t j = pick(r, 0, i);
        const int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    return perm;
}

static size_t blocks_of(const paged_case *c, size_t s) {
    return ((size_t)c->keys[s] + c->block_size - 1) / c->block_size;
}

/* the blocks of every sequence, a random permutation of the pool's (or the pool's nearly in
   order), with spare blocks unused */
static size_t fill_table(rng *r, const paged_case *c, paged_data *d) {
    size_t used = 0, most = 0;
    for (size_t s = 0; s < c->num_seqs; s++) {
        const size_t n = ((size_t)c->keys[s] + c->block_size - 1) / c->block_size;
        used += n;
        if (n > most) most = n;
    }
    const size_t num_blocks = used + pick(r, 1, 4);
    int32_t *perm = random_permutation(r, num_blocks);
    if (c->in_order) { /* with a pair swapped now and then, so that some runs end mid-block */
        for (size_t i = 0; i < num_blocks; i++) perm[i] = (int32_t)i;
        for (size_t i = pick(r, 0, 99); i + 1 < num_blocks; i += pick(r, 2, 99)) {
            perm[i] = (int32_t)(i + 1);
            perm[i + 1] = (int32_t)i;
        }
    }
    const size_t stride = most + pick(r, 0, 2) + 1;
    d->table = malloc(c->num_seqs * stride * sizeof *d->table);
    size_t next = 0;
    for (size_t s = 0; s < c->num_seqs; s++) {
        const size_t n = ((size_t)c->keys[s] + c->block_size - 1) / c->block_size;
        for (size_t i = 0; i < stride; i++)
            d->table[s * stride + i] = i < n ? perm[next++] : -1; /* past the keys: never read */
    }
    free(perm);
    d->cache.block_table = d->table;
    d->cache.block_table_stride = stride;
    return num_blocks;
}

static void build(rng *r, const paged_case *c, paged_data *d) {
    memset(d, 0, sizeof *d);
    sdpa_kv_cache *k = &d->cache;
    k->struct_size = sizeof *k;
    k->kv_type = c->kv_type;
    k->block_size = c->block_size;
    k->heads_kv = c->heads_kv;
    k->d_k = c->d_k;
    k->d_v = c->d_v;
    k->num_blocks = fill_table(r, c, d);
    /* padded token and block strides on one case in two */
    const size_t pad = pick(r, 0, 1) * 3;
    k->k_stride[2] = c->d_k + pad;
    k->k_stride[1] = c->block_size * k->k_stride[2];
    k->k_stride[0] = c->heads_kv * k->k_stride[1] + pad;
    k->v_stride[2] = c->d_v + pad;
    k->v_stride[1] = c->block_size * k->v_stride[2];
    k->v_stride[0] = c->heads_kv * k->v_stride[1] + pad;
    d->k_elems = k->num_blocks * k->k_stride[0];
    d->v_elems = k->num_blocks * k->v_stride[0];
    d->k_pool = malloc(d->k_elems * type_size(c->kv_type));
    d->v_pool = malloc(d->v_elems * type_size(c->kv_type));
    fill_pool(r, c, d, d->k_pool, k->k_stride, c->d_k, d->k_elems);
    fill_pool(r, c, d, d->v_pool, k->v_stride, c->d_v, d->v_elems);

    sdpa_batch *b = &d->batch;
    b->struct_size = sizeof *b;
    b->flags = c->causal ? SDPA_CAUSAL : 0;
    b->num_seqs = c->num_seqs;
    b->heads_q = c->heads_q;
    b->q_type = c->q_type;
    b->out_type = c->out_type;
    for (size_t s = 0; s < c->num_seqs; s++) {
        d->q_start[s + 1] = d->q_start[s] + c->rows[s];
        d->kv_len[s] = c->keys[s];
    }
    d->rows = (size_t)d->q_start[c->num_seqs];
    b->q_start = d->q_start;
    b->kv_len = d->kv_len;
    b->q_stride[1] = c->d_k;
    b->q_stride[0] = c->heads_q * c->d_k;
    b->out_stride[1] = c->d_v;
    b->out_stride[0] = c->heads_q * c->d_v;
    const size_t nq = d->rows * c->heads_q * c->d_k, no = d->rows * c->heads_q * c->d_v;
    d->q_bytes = nq * type_size(c->q_type);
    d->out_bytes = no * type_size(c->out_type);
    d->q = malloc(d->q_bytes + 1);
    d->out = malloc(d->out_bytes + 1);
    float *f = malloc((nq + 1) * sizeof *f);
    fill_normal(r, f, nq);
    store_row(d->q, f, nq, c->q_type);
    free(f);
    memset(d->out, 0xa5, d->out_bytes);
    if (c->lse) {
        d->lse_floats = d->rows * c->heads_q;
        d->lse = malloc((d->lse_floats + 1) * sizeof *d->lse);
        for (size_t i = 0; i < d->lse_floats; i++) d->lse[i] = SENTINEL;
        b->lse = d->lse;
        b->lse_stride[0] = c->lse == 1 ? c->heads_q : 1;
        b->lse_stride[1] = c->lse == 1 ? 1 : d->rows;
    }
}

static void release(paged_data *d) {
    free(d->table);
    free(d->q);
    free(d->k_pool);
    free(d->v_pool);
    free(d->out);
    free(d->lse);
}

/* The same keys and values at other blocks of the pool, through a new table: each used block
   moved whole to a random place, NaN everywhere else. */
static void shuffle_blocks(rng *r, const paged_case *c, paged_data *d) {
    const size_t size = type_size(c->kv_type), *ks = d->cache.k_stride, *vs = d->cache.v_stride;
    int32_t *perm = random_permutation(r, d->cache.num_blocks);
    char *k = malloc(d->k_elems * size), *v = malloc(d->v_elems * size);
    fill_nan(k, d->k_elems, c->kv_type);
    fill_nan(v, d->v_elems, c->kv_type);
    for (size_t s = 0; s < c->num_seqs; s++)
        for (size_t n = 0; n < blocks_of(c, s); n++) {
            int32_t *entry = &d->table[s * d->cache.block_table_stride + n];
            const size_t from = (size_t)*entry, to = (size_t)perm[from];
            memcpy(k + to * ks[0] * size, (char *)d->k_pool + from * ks[0] * size, ks[0] * size);
            memcpy(v + to * vs[0] * size, (char *)d->v_pool + from * vs[0] * size, vs[0] * size);
            *entry = (int32_t)to;
        }
    free(perm);
    free(d->k_pool);
    free(d->v_pool);
    d->k_pool = k;
    d->v_pool = v;
}

static sdpa_status run(paged_data *d) {
    return sdpa_attention_paged(&d->batch, &d->cache, d->out, d->q, d->k_pool, d->v_pool);
}

/* ---- the checks ---- */

/* element [token][head][c] of a [token][head] view, and the key j of kv head h in the pool */
static size_t token_at(const size_t stride[2], size_t t, size_t h) {
    return t * stride[0] + h * stride[1];
}
static size_t key_at(const paged_data *d, const size_t stride[3], size_t s, size_t j, size_t h) {
    const sdpa_kv_cache *c = &d->cache;
    const int32_t b = d->table[s * c->block_table_stride + j / c->block_size];
    return (size_t)b * stride[0] + h * stride[1] + (j % c->block_size) * stride[2];
}

/* Sequence s through sdpa_mha on dense copies of its rows, keys and values: the same bits,
   where blocks hold a multiple of 64 keys (a block of values is then never split at a page). */
static void check_dense(const paged_case *c, const paged_data *d, size_t s) {
    const size_t r0 = (size_t)d->q_start[s], nq = (size_t)c->rows[s], nk = (size_t)c->keys[s];
    const size_t hq = c->heads_q, hk = c->heads_kv;
    const size_t qs = type_size(c->q_type), ks = type_size(c->kv_type);
    const size_t os = type_size(c->out_type);
    char *q = malloc(hq * nq * c->d_k * qs), *out = malloc(hq * nq * c->d_v * os);
    char *k = malloc(hk * nk * c->d_k * ks + 1), *v = malloc(hk * nk * c->d_v * ks + 1);
    float *lse = malloc(hq * nq * sizeof *lse);
    for (size_t h = 0; h < hq; h++)
        for (size_t i = 0; i < nq; i++)
            memcpy(q + (h * nq + i) * c->d_k * qs,
                   (char *)d->q + token_at(d->batch.q_stride, r0 + i, h) * qs, c->d_k * qs);
    for (size_t h = 0; h < hk; h++)
        for (size_t j = 0; j < nk; j++) {
            memcpy(k + (h * nk + j) * c->d_k * ks,
                   (char *)d->k_pool + key_at(d, d->cache.k_stride, s, j, h) * ks, c->d_k * ks);
            memcpy(v + (h * nk + j) * c->d_v * ks,
                   (char *)d->v_pool + key_at(d, d->cache.v_stride, s, j, h) * ks, c->d_v * ks);
        }
    sdpa_mha_desc desc;
    sdpa_mha_desc_dense(&desc, 1, hq, hk, nq, nk, c->d_k, c->d_v, SDPA_DEFAULT_SCALE,
                        d->batch.flags);
    desc.q_type = c->q_type;
    desc.kv_type = c->kv_type;
    desc.out_type = c->out_type;
    desc.lse = lse;
    desc.lse_stride[1] = nq;
    cr_assert_eq(sdpa_mha(&desc, out, q, k, v), SDPA_OK, "%s", sdpa_last_error_detail());
    for (size_t h = 0; h < hq; h++)
        for (size_t i = 0; i < nq; i++) {
            const char *got = (char *)d->out + token_at(d->batch.out_stride, r0 + i, h) * os;
            cr_assert(memcmp(got, out + (h * nq + i) * c->d_v * os, c->d_v * os) == 0,
                      "sequence %zu (%zu rows, %zu keys, block %zu) head %zu row %zu: not the "
                      "bits of sdpa_mha",
                      s, nq, nk, c->block_size, h, i);
            if (!c->lse) continue;
            const float l = d->lse[token_at(d->batch.lse_stride, r0 + i, h)];
            cr_assert(memcmp(&l, lse + h * nq + i, sizeof l) == 0,
                      "sequence %zu head %zu row %zu: lse %.9g, sdpa_mha's %.9g", s, h, i, l,
                      lse[h * nq + i]);
        }
    free(q);
    free(out);
    free(k);
    free(v);
    free(lse);
}

/* Sequence s against the double reference on the values the arrays hold: the f32 bound, plus
   half an ULP of a 16-bit out. */
static void check_reference(const paged_case *c, const paged_data *d, size_t s) {
    const size_t r0 = (size_t)d->q_start[s], nq = (size_t)c->rows[s], nk = (size_t)c->keys[s];
    float *q = malloc(nq * c->d_k * sizeof *q), *k = malloc((nk * c->d_k + 1) * sizeof *k);
    float *v = malloc((nk * c->d_v + 1) * sizeof *v);
    double *want = malloc(nq * c->d_v * sizeof *want);
    const double half_ulp = c->out_type == SDPA_F16    ? 0x1p-11
                            : c->out_type == SDPA_BF16 ? 0x1p-8
                                                       : 0;
    for (size_t h = 0; h < c->heads_q; h++) {
        const size_t hk = h / (c->heads_q / c->heads_kv);
        double max_v = 0.0;
        for (size_t i = 0; i < nq; i++)
            for (size_t p = 0; p < c->d_k; p++)
                q[i * c->d_k + p] =
                    (float)value_of(d->q, token_at(d->batch.q_stride, r0 + i, h) + p, c->q_type);
        for (size_t j = 0; j < nk; j++) {
            for (size_t p = 0; p < c->d_k; p++)
                k[j * c->d_k + p] = (float)value_of(
                    d->k_pool, key_at(d, d->cache.k_stride, s, j, hk) + p, c->kv_type);
            for (size_t p = 0; p < c->d_v; p++) {
                v[j * c->d_v + p] = (float)value_of(
                    d->v_pool, key_at(d, d->cache.v_stride, s, j, hk) + p, c->kv_type);
                if (fabs(v[j * c->d_v + p]) > max_v) max_v = fabs(v[j * c->d_v + p]);
            }
        }
        ref_attention(want, c->d_v, q, c->d_k, k, c->d_k, v, c->d_v, NULL, 0, nq, nk, c->d_k,
                      c->d_v, 1.0 / sqrt((double)c->d_k), c->causal);
        const double bound = bound_attention(max_v);
        for (size_t i = 0; i < nq; i++)
            for (size_t col = 0; col < c->d_v; col++) {
                const double w = want[i * c->d_v + col];
                const double got =
                    value_of(d->out, token_at(d->batch.out_stride, r0 + i, h) + col, c->out_type);
                const double tol = bound + half_ulp * (fabs(w) + bound) + 0x1p-25;
                cr_assert(fabs(got - w) <= tol,
                          "sequence %zu (%zu rows, %zu keys, block %zu, causal %d) head %zu row "
                          "%zu col %zu: got %.9g want %.9g (tol %.3g)",
                          s, nq, nk, c->block_size, c->causal, h, i, col, got, w, tol);
            }
        if (c->lse && !nk)
            for (size_t i = 0; i < nq; i++)
                cr_assert_eq(d->lse[token_at(d->batch.lse_stride, r0 + i, h)], -INFINITY);
    }
    free(q);
    free(k);
    free(v);
    free(want);
}

/* A random case: GQA heads, the types, the layout of lse, and sequences of 0 or 1 rows, of no
   keys, decodes and prefills over cached keys. */
static paged_case random_case(rng *r, size_t block_size, sdpa_dtype kv_type) {
    static const size_t DIMS[] = {1, 8, 17, 64, 128};
    paged_case c = {0};
    c.num_seqs = pick(r, 1, MAX_SEQS);
    c.heads_kv = pick(r, 1, 2);
    c.heads_q = c.heads_kv * pick(r, 1, 4);
    c.d_k = DIMS[pick(r, 0, 4)];
    c.d_v = pick(r, 0, 1) ? c.d_k : DIMS[pick(r, 0, 4)];
    c.block_size = block_size;
    c.q_type = (sdpa_dtype)pick(r, 0, 2);
    c.kv_type = kv_type;
    c.out_type = (sdpa_dtype)pick(r, 0, 2);
    c.causal = (int)pick(r, 0, 1);
    c.lse = (int)pick(r, 0, 2);
    for (size_t s = 0; s < c.num_seqs; s++) {
        const size_t kind = pick(r, 0, 5);
        c.keys[s] = (int32_t)pick(r, 0, 150);
        c.rows[s] = kind == 0 ? 0 : kind <= 2 ? 1 : (int32_t)pick(r, 2, 40);
        if (c.causal && c.rows[s] > c.keys[s]) c.keys[s] += c.rows[s];
        if (kind == 5 && !c.causal) c.keys[s] = 0; /* rows that see no key */
    }
    return c;
}

static void check_case(rng *r, const paged_case *c) {
    paged_data d;
    build(r, c, &d);
    cr_assert_eq(run(&d), SDPA_OK, "%s", sdpa_last_error_detail());
    char *first = malloc(d.out_bytes + 1);
    float *first_lse = malloc((d.lse_floats + 1) * sizeof *first_lse);
    memcpy(first, d.out, d.out_bytes);
    if (c->lse) memcpy(first_lse, d.lse, d.lse_floats * sizeof *first_lse);
    shuffle_blocks(r, c, &d);
    if (c->threads_after) sdpa_set_num_threads(c->threads_after);
    cr_assert_eq(run(&d), SDPA_OK, "%s", sdpa_last_error_detail());
    if (c->threads_after) sdpa_set_num_threads(0);
    cr_assert(memcmp(first, d.out, d.out_bytes) == 0 &&
                  (!c->lse || memcmp(first_lse, d.lse, d.lse_floats * sizeof *first_lse) == 0),
              "block %zu: other bits with the same values at other blocks", c->block_size);
    free(first);
    free(first_lse);
    for (size_t s = 0; s < c->num_seqs; s++) {
        if (!c->rows[s]) continue;
        if (c->block_size % 64 == 0) check_dense(c, &d, s);
        check_reference(c, &d, s);
    }
    release(&d);
}

static const size_t BLOCK_SIZES[] = {1, 5, 16, 32, 64};

BACKEND_TEST(paged, random_batches_match_dense_and_reference) {
    rng r = rng_seed(3601);
    const int per = test_quick() ? 1 : 2;
    for (size_t b = 0; b < sizeof BLOCK_SIZES / sizeof BLOCK_SIZES[0]; b++)
        for (int t = 0; t < 3; t++)
            for (int i = 0; i < per; i++) {
                const paged_case c = random_case(&r, BLOCK_SIZES[b], (sdpa_dtype)t);
                check_case(&r, &c);
            }
}

/* Blocks that follow one another in the pool, which the library reads in place where they are
   short (a token table in order streams like a dense cache), give the bits of the same values
   placed at random, and the reference's values: check_case moves the blocks to random places.
   One kv head and no padding on some cases, so that blocks of 2 and 5 follow on too; the run
   at random blocks on 3 threads, the first on 1. */
BACKEND_TEST(paged, blocks_in_order_give_the_bits_of_blocks_at_random) {
    static const size_t SIZES[] = {1, 2, 5};
    rng r = rng_seed(3604);
    for (size_t b = 0; b < sizeof SIZES / sizeof SIZES[0]; b++)
        for (int t = 0; t < 3; t++) {
            paged_case c = random_case(&r, SIZES[b], (sdpa_dtype)t);
            c.in_order = 1;
            c.threads_after = 3;
            if (SIZES[b] > 1) {
                c.heads_q /= c.heads_kv;
                c.heads_kv = 1;
            }
            for (size_t s = 0; s < c.num_seqs; s++)
                if (c.keys[s] < 64) c.keys[s] += 64; /* whole blocks of keys in one run */
            cr_assert_eq(sdpa_set_num_threads(1), SDPA_OK);
            check_case(&r, &c);
            sdpa_set_num_threads(0);
        }
}

/* long decodes of a GQA group, split over keys where the plan says */
BACKEND_TEST(paged, long_decodes) {
    rng r = rng_seed(3602);
    paged_case c = {0};
    c.num_seqs = 3;
    c.heads_kv = 2;
    c.heads_q = 8;
    c.d_k = c.d_v = 64;
    c.block_size = 64;
    c.kv_type = SDPA_F16;
    c.causal = 1;
    c.lse = 1;
    const int32_t keys[3] = {2000, 1, 777};
    for (size_t s = 0; s < 3; s++) {
        c.rows[s] = 1;
        c.keys[s] = keys[s];
    }
    check_case(&r, &c);
}

/* the same bits at 1 to 5 threads, and right: sequences that take every thread (60 rows, 3000
   keys) and short decodes that run side by side, one a thread */
BACKEND_TEST(paged, same_bits_at_every_thread_count) {
    rng r = rng_seed(3603);
    paged_case c = {0};
    c.num_seqs = 8;
    c.heads_kv = 2;
    c.heads_q = 4;
    c.d_k = c.d_v = 32;
    c.block_size = 5;
    c.kv_type = SDPA_BF16;
    c.causal = 1;
    c.lse = 1;
    const int32_t rows[8] = {1, 60, 0, 1, 1, 2, 1, 1};
    const int32_t keys[8] = {900, 200, 30, 3000, 40, 70, 5, 130};
    memcpy(c.rows, rows, sizeof rows);
    memcpy(c.keys, keys, sizeof keys);
    paged_data d;
    build(&r, &c, &d);
    cr_assert_eq(sdpa_set_num_threads(1), SDPA_OK);
    cr_assert_eq(run(&d), SDPA_OK);
    char *first = malloc(d.out_bytes);
    float *first_lse = malloc(d.lse_floats * sizeof *first_lse);
    memcpy(first, d.out, d.out_bytes);
    memcpy(first_lse, d.lse, d.lse_floats * sizeof *first_lse);
    for (size_t n = 2; n <= 5; n++) {
        cr_assert_eq(sdpa_set_num_threads(n), SDPA_OK);
        memset(d.out, 0, d.out_bytes);
        cr_assert_eq(run(&d), SDPA_OK);
        cr_assert(memcmp(first, d.out, d.out_bytes) == 0, "out differs at %zu threads", n);
        cr_assert(memcmp(first_lse, d.lse, d.lse_floats * sizeof *first_lse) == 0,
                  "lse differs at %zu threads", n);
    }
    for (size_t s = 0; s < c.num_seqs; s++)
        if (c.rows[s]) check_reference(&c, &d, s);
    sdpa_set_num_threads(0);
    free(first);
    free(first_lse);
    release(&d);
}

/* ---- errors ---- */

/* a small valid batch, with lse */
static paged_case error_case(void) {
    paged_case c = {0};
    c.num_seqs = 3;
    c.heads_kv = 2;
    c.heads_q = 4;
    c.d_k = c.d_v = 8;
    c.block_size = 4;
    c.causal = 1;
    c.lse = 1;
    const int32_t rows[3] = {2, 1, 3}, keys[3] = {9, 4, 3};
    memcpy(c.rows, rows, sizeof rows);
    memcpy(c.keys, keys, sizeof keys);
    return c;
}

/* What an error case changes of a valid batch. */
typedef void (*spoil_fn)(paged_data *d);

static void expect_error(spoil_fn spoil, sdpa_status want, const char *what) {
    rng r = rng_seed(3604);
    const paged_case c = error_case();
    paged_data d;
    build(&r, &c, &d);
    const paged_data keep = d; /* the arrays to free, whatever spoil points d at */
    spoil(&d);
    unsigned char *out = malloc(d.out_bytes);
    memcpy(out, d.out, d.out_bytes);
    const sdpa_status st = run(&d);
    cr_assert_eq(st, want, "%s: status %d, want %d (%s)", what, st, want, sdpa_last_error_detail());
    cr_assert(strlen(sdpa_last_error_detail()) > 0, "%s: no detail", what);
    cr_assert(memcmp(out, d.out, d.out_bytes) == 0, "%s: out written", what);
    for (size_t i = 0; i < d.lse_floats; i++) cr_assert_eq(d.lse[i], SENTINEL, "%s", what);
    free(out);
    release((paged_data *)&keep);
}

static uint32_t small_size(void) { return 8; }
static void no_batch_size(paged_data *d) { d->batch.struct_size = small_size(); }
static void no_cache_size(paged_data *d) { d->cache.struct_size = small_size(); }
static void with_mods(paged_data *d) { d->batch.mods = (const sdpa_score_mods *)d->table; }
static void bad_q_type(paged_data *d) { d->batch.q_type = 3; }
static void bad_out_type(paged_data *d) { d->batch.out_type = 7; }
static void bad_kv_type(paged_data *d) { d->cache.kv_type = 5; }
static void bad_k_scale(paged_data *d) { d->cache.k_scale = 0.5f; }
static void bad_flags(paged_data *d) { d->batch.flags = 2; }
static void bad_scale(paged_data *d) { d->batch.scale = INFINITY; }
static void q_start_late(paged_data *d) { d->q_start[0] = 1; }
static void q_start_down(paged_data *d) { d->q_start[2] = 1; }
static void negative_keys(paged_data *d) { d->kv_len[1] = -1; }
static void causal_short(paged_data *d) { d->kv_len[2] = 2; }
static void entry_high(paged_data *d) {
    d->table[d->cache.block_table_stride + 0] = (int32_t)d->cache.num_blocks;
}
static void entry_negative(paged_data *d) { d->table[2] = -3; } /* the 3rd block of 9 keys */
static void no_heads_kv(paged_data *d) { d->cache.heads_kv = 0; }
static void heads_not_multiple(paged_data *d) { d->batch.heads_q = 3; }
static void no_block_size(paged_data *d) { d->cache.block_size = 0; }
static void no_d_k(paged_data *d) { d->cache.d_k = 0; }
static void short_token_stride(paged_data *d) { d->cache.k_stride[2] = 7; }
static void short_q_stride(paged_data *d) { d->batch.q_stride[0] = 7; }
static void out_rows_overlap(paged_data *d) { d->batch.out_stride[0] = 8; }
static void lse_entries_overlap(paged_data *d) { d->batch.lse_stride[0] = 1; }
static void huge_pool(paged_data *d) { d->cache.num_blocks = SIZE_MAX / 2; }
static void huge_q(paged_data *d) { d->batch.q_stride[0] = SIZE_MAX / 4; }
static void out_meets_q(paged_data *d) { d->out = d->q; }
static void out_meets_pool(paged_data *d) { d->out = d->k_pool; }
static void lse_meets_out(paged_data *d) { d->batch.lse = (float *)d->out; }
static void lse_meets_table(paged_data *d) { d->batch.lse = (float *)d->table; }
static void no_q_start(paged_data *d) { d->batch.q_start = NULL; }
static void no_kv_len(paged_data *d) { d->batch.kv_len = NULL; }
static void no_table(paged_data *d) { d->cache.block_table = NULL; }
static void no_q(paged_data *d) { d->q = NULL; }
static void no_v_pool(paged_data *d) { d->v_pool = NULL; }

Test(paged, every_error_writes_nothing) {
    static const struct {
        spoil_fn spoil;
        sdpa_status want;
        const char *what;
    } cases[] = {
        {no_batch_size, SDPA_ERR_ARG, "batch struct_size"},
        {no_cache_size, SDPA_ERR_ARG, "cache struct_size"},
        {with_mods, SDPA_ERR_ARG, "mods"},
        {bad_q_type, SDPA_ERR_ARG, "q_type"},
        {bad_out_type, SDPA_ERR_ARG, "out_type"},
        {bad_kv_type, SDPA_ERR_ARG, "kv_type"},
        {bad_k_scale, SDPA_ERR_ARG, "k_scale"},
        {bad_flags, SDPA_ERR_ARG, "flags"},
        {bad_scale, SDPA_ERR_ARG, "scale"},
        {q_start_late, SDPA_ERR_ARG, "q_start[0]"},
        {q_start_down, SDPA_ERR_ARG, "q_start decreasing"},
        {negative_keys, SDPA_ERR_ARG, "negative kv_len"},
        {causal_short, SDPA_ERR_ARG, "causal with more rows than keys"},
        {entry_high, SDPA_ERR_ARG, "table entry num_blocks"},
        {entry_negative, SDPA_ERR_ARG, "negative table entry"},
        {no_heads_kv, SDPA_ERR_SIZE, "heads_kv 0"},
        {heads_not_multiple, SDPA_ERR_SIZE, "heads_q not a multiple"},
        {no_block_size, SDPA_ERR_SIZE, "block_size 0"},
        {no_d_k, SDPA_ERR_SIZE, "d_k 0"},
        {short_token_stride, SDPA_ERR_SIZE, "k token stride"},
        {short_q_stride, SDPA_ERR_SIZE, "q token stride"},
        {out_rows_overlap, SDPA_ERR_SIZE, "out rows overlap"},
        {lse_entries_overlap, SDPA_ERR_SIZE, "lse entries overlap"},
        {huge_pool, SDPA_ERR_SIZE, "pool past PTRDIFF_MAX"},
        {huge_q, SDPA_ERR_SIZE, "q past PTRDIFF_MAX"},
        {out_meets_q, SDPA_ERR_SIZE, "out meets q"},
        {out_meets_pool, SDPA_ERR_SIZE, "out meets k_pool"},
        {lse_meets_out, SDPA_ERR_SIZE, "lse meets out"},
        {lse_meets_table, SDPA_ERR_SIZE, "lse meets block_table"},
        {no_q_start, SDPA_ERR_NULL, "q_start NULL"},
        {no_kv_len, SDPA_ERR_NULL, "kv_len NULL"},
        {no_table, SDPA_ERR_NULL, "block_table NULL"},
        {no_q, SDPA_ERR_NULL, "q NULL"},
        {no_v_pool, SDPA_ERR_NULL, "v_pool NULL"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_error(cases[i].spoil, cases[i].want, cases[i].what);
    cr_assert_eq(sdpa_attention_paged(NULL, NULL, NULL, NULL, NULL, NULL), SDPA_ERR_NULL);
}

/* what the call does not read is not checked: a sequence without rows, and table entries past
   a sequence's keys */
Test(paged, entries_the_call_does_not_read_are_not_checked) {
    rng r = rng_seed(3605);
    paged_case c = error_case();
    c.rows[1] = 0;
    paged_data d;
    build(&r, &c, &d);
    d.table[d.cache.block_table_stride] = -5; /* sequence 1 has no rows */
    cr_assert_eq(run(&d), SDPA_OK, "%s", sdpa_last_error_detail());
    release(&d);
    /* a batch without rows reads nothing at all */
    sdpa_batch b = {0};
    b.struct_size = sizeof b;
    sdpa_kv_cache k = {0};
    k.struct_size = sizeof k;
    k.heads_kv = 1;
    cr_assert_eq(sdpa_attention_paged(&b, &k, NULL, NULL, NULL, NULL), SDPA_OK);
}

/* ---- sdpa_kv_cache_store ---- */

/* n tokens to random distinct slots of a pool: each row is sdpa_convert's, every other slot
   untouched */
BACKEND_TEST(paged, store_writes_each_token_to_its_slot) {
    rng r = rng_seed(3606);
    for (int kv = 0; kv < 3; kv++)
        for (int src = 0; src < 3; src++) {
            sdpa_kv_cache c = {0};
            c.struct_size = sizeof c;
            c.kv_type = (uint32_t)kv;
            c.num_blocks = 7;
            c.block_size = 5;
            c.heads_kv = 2;
            c.d_k = 17;
            c.d_v = 8;
            c.k_stride[2] = 20;
            c.k_stride[1] = 5 * 20;
            c.k_stride[0] = 2 * 5 * 20;
            c.v_stride[2] = 8;
            c.v_stride[1] = 5 * 8;
            c.v_stride[0] = 2 * 5 * 8 + 1;
            const size_t ks = type_size((sdpa_dtype)kv), ss = type_size((sdpa_dtype)src);
            const size_t k_elems = 7 * c.k_stride[0], v_elems = 7 * c.v_stride[0];
            char *kp = malloc(k_elems * ks), *vp = malloc(v_elems * ks);
            memset(kp, 0x5a, k_elems * ks);
            memset(vp, 0x5a, v_elems * ks);
            char *k_before = malloc(k_elems * ks);
            memcpy(k_before, kp, k_elems * ks);
            enum { N = 12 };
            int64_t slots[N];
            for (size_t t = 0; t < N; t++) slots[t] = (int64_t)(t * 3 % 35); /* distinct */
            const size_t k_src_stride[2] = {2 * 17 + 1, 17}, v_src_stride[2] = {8, 4 * N};
            const size_t nk = N * k_src_stride[0], nv = (N - 1) * 8 + 4 * N + 8;
            float *kf = malloc(nk * 4), *vf = malloc(nv * 4);
            fill_normal(&r, kf, nk);
            fill_normal(&r, vf, nv);
            char *k_src = malloc(nk * ss), *v_src = malloc(nv * ss);
            store_row(k_src, kf, nk, (sdpa_dtype)src);
            store_row(v_src, vf, nv, (sdpa_dtype)src);
            cr_assert_eq(sdpa_kv_cache_store(&c, kp, vp, slots, N, k_src, v_src, (uint32_t)src,
                                             k_src_stride, v_src_stride),
                         SDPA_OK, "%s", sdpa_last_error_detail());
            char want[17 * 4];
            for (size_t t = 0; t < N; t++)
                for (size_t h = 0; h < 2; h++) {
                    const size_t b = (size_t)slots[t] / 5, at = (size_t)slots[t] % 5;
                    const size_t kd = b * c.k_stride[0] + h * c.k_stride[1] + at * c.k_stride[2];
                    const size_t vd = b * c.v_stride[0] + h * c.v_stride[1] + at * c.v_stride[2];
                    const char *kr = k_src + (t * k_src_stride[0] + h * k_src_stride[1]) * ss;
                    const char *vr = v_src + (t * v_src_stride[0] + h * v_src_stride[1]) * ss;
                    cr_assert_eq(sdpa_convert(want, (sdpa_dtype)kv, kr, (sdpa_dtype)src, 17),
                                 SDPA_OK);
                    cr_assert(memcmp(kp + kd * ks, want, 17 * ks) == 0, "k of token %zu", t);
                    for (size_t p = 0; p < 17; p++) /* and as a value: within half an ULP */
                        cr_assert(fabs(value_of(kp, kd + p, (sdpa_dtype)kv) -
                                       value_of(kr, p, (sdpa_dtype)src)) <=
                                  0x1p-8 * fabs(value_of(kr, p, (sdpa_dtype)src)) + 1e-7);
                    cr_assert_eq(sdpa_convert(want, (sdpa_dtype)kv, vr, (sdpa_dtype)src, 8),
                                 SDPA_OK);
                    cr_assert(memcmp(vp + vd * ks, want, 8 * ks) == 0, "v of token %zu", t);
                    memcpy(k_before + kd * ks, kp + kd * ks, 17 * ks); /* written: as expected */
                }
            cr_assert(memcmp(k_before, kp, k_elems * ks) == 0, "a slot not named was written");
            /* a slot past the pool: an error, and nothing written */
            memcpy(k_before, kp, k_elems * ks);
            slots[N - 1] = 35;
            cr_assert_eq(sdpa_kv_cache_store(&c, kp, vp, slots, N, k_src, v_src, (uint32_t)src,
                                             k_src_stride, v_src_stride),
                         SDPA_ERR_ARG);
            slots[N - 1] = -1;
            cr_assert_eq(sdpa_kv_cache_store(&c, kp, vp, slots, N, k_src, v_src, (uint32_t)src,
                                             k_src_stride, v_src_stride),
                         SDPA_ERR_ARG);
            cr_assert(memcmp(k_before, kp, k_elems * ks) == 0, "written on error");
            free(kp);
            free(vp);
            free(k_before);
            free(kf);
            free(vf);
            free(k_src);
            free(v_src);
        }
}

Test(paged, store_errors) {
    sdpa_kv_cache c = {0};
    c.struct_size = sizeof c;
    c.num_blocks = 2;
    c.block_size = 4;
    c.heads_kv = 1;
    c.d_k = c.d_v = 4;
    c.k_stride[2] = c.v_stride[2] = 4;
    c.k_stride[1] = c.v_stride[1] = 16;
    c.k_stride[0] = c.v_stride[0] = 16;
    float kp[32], vp[32], k[8], v[8];
    for (int i = 0; i < 32; i++) kp[i] = vp[i] = SENTINEL;
    for (int i = 0; i < 8; i++) k[i] = v[i] = 1.0f;
    const int64_t slots[2] = {0, 7};
    const size_t st[2] = {4, 4};
    cr_assert_eq(sdpa_kv_cache_store(NULL, kp, vp, slots, 2, k, v, 0, st, st), SDPA_ERR_NULL);
    cr_assert_eq(sdpa_kv_cache_store(&c, kp, vp, slots, 0, NULL, NULL, 0, NULL, NULL), SDPA_OK);
    cr_assert_eq(sdpa_kv_cache_store(&c, kp, vp, NULL, 2, k, v, 0, st, st), SDPA_ERR_NULL);
    cr_assert_eq(sdpa_kv_cache_store(&c, NULL, vp, slots, 2, k, v, 0, st, st), SDPA_ERR_NULL);
    cr_assert_eq(sdpa_kv_cache_store(&c, kp, vp, slots, 2, k, v, 0, st, NULL), SDPA_ERR_NULL);
    cr_assert_eq(sdpa_kv_cache_store(&c, kp, vp, slots, 2, k, v, 3, st, st), SDPA_ERR_ARG);
    const size_t short_st[2] = {4, 4};
    c.k_stride[2] = 3;
    cr_assert_eq(sdpa_kv_cache_store(&c, kp, vp, slots, 2, k, v, 0, short_st, st), SDPA_ERR_SIZE);
    c.k_stride[2] = 4;
    c.v_scale = 2.0f;
    cr_assert_eq(sdpa_kv_cache_store(&c, kp, vp, slots, 2, k, v, 0, st, st), SDPA_ERR_ARG);
    c.v_scale = 0.0f;
    /* a source inside a pool */
    cr_assert_eq(sdpa_kv_cache_store(&c, kp, vp, slots, 2, kp + 8, v, 0, st, st), SDPA_ERR_SIZE);
    const size_t huge[2] = {SIZE_MAX / 8, 4};
    cr_assert_eq(sdpa_kv_cache_store(&c, kp, vp, slots, 2, k, v, 0, huge, st), SDPA_ERR_SIZE);
    for (int i = 0; i < 32; i++) cr_assert(kp[i] == SENTINEL && vp[i] == SENTINEL);
    cr_assert_eq(sdpa_kv_cache_store(&c, kp, vp, slots, 2, k, v, 0, st, st), SDPA_OK);
    cr_assert(kp[0] == 1.0f && kp[28] == 1.0f && kp[4] == SENTINEL);
}
