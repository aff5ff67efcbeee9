/* The kv_store op: sdpa_kv_cache_store of n new tokens' f32 k and v into an f16 paged cache, the
 * write a serving engine makes every step. The cache is a GQA model's (KV_HEADS kv heads of
 * KV_D), in blocks of KV_BLOCK tokens laid out [block][head][token][d], the blocks placed by a
 * fixed-seed permutation of a pool an eighth larger; token t goes to position t % KV_BLOCK of
 * the t / KV_BLOCK-th block, as a prompt's tokens do. Its peer, "naive" in the table, is memcpy
 * of the same f16 output from a ready copy, as the to_f16 op's: the store against putting its
 * result in place. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "rng.h"
#include "sdpa.h"

#define KV_HEADS 8
#define KV_D     128
#define KV_BLOCK 16

typedef struct kv_store_state {
    sdpa_kv_cache cache;
    int64_t *slots;
    int32_t *table;
    uint16_t *k_pool, *v_pool;
    uint16_t *ref_k, *ref_v;   /* the tokens' rows as f16, [token][head][d] (sdpa_convert) */
    uint16_t *copy, *copy_src; /* the peer's: the output bytes and a ready copy of them */
    float *v;                  /* the v tokens (k is j->x) */
    size_t floats;             /* of k (and of v): n KV_HEADS KV_D */
} kv_store_state;

/* All of 0xff (NaN halves) in the pools and the peer's output, so that the next implementation
   checked starts from nothing right */
static void poison(kv_store_state *st) {
    const size_t pool_bytes = st->cache.num_blocks * KV_HEADS * KV_BLOCK * KV_D * 2;
    memset(st->k_pool, 0xff, pool_bytes), memset(st->v_pool, 0xff, pool_bytes);
    memset(st->copy, 0xff, st->floats * 4);
}

static void kv_store_prepare(job *j) {
    kv_store_state *st = calloc(1, sizeof *st);
    if (!st) exit(2);
    const size_t n = j->n;
    st->cache =
        bench_paged_cache(SDPA_F16, (n + KV_BLOCK - 1) / KV_BLOCK, KV_BLOCK, KV_HEADS, KV_D);
    const size_t pool = st->cache.num_blocks;
    st->floats = n * KV_HEADS * KV_D;
    j->x = xalloc(st->floats), st->v = xalloc(st->floats);
    fill(j->x, st->floats, -8, 8);
    fill(st->v, st->floats, -8, 8);
    st->table = malloc(pool * sizeof *st->table);
    st->slots = malloc(n * sizeof *st->slots);
    if (!st->table || !st->slots) exit(2);
    rng_permutation(st->table, pool, POOL_SEED);
    for (size_t t = 0; t < n; t++)
        st->slots[t] = (int64_t)st->table[t / KV_BLOCK] * KV_BLOCK + (int64_t)(t % KV_BLOCK);
    const size_t pool_halves = pool * KV_HEADS * KV_BLOCK * KV_D;
    st->k_pool = xalloc_bytes(pool_halves * 2, 64), st->v_pool = xalloc_bytes(pool_halves * 2, 64);
    /* the reference: each value narrowed by the scalar backend's sdpa_convert */
    st->ref_k = xalloc_bytes(st->floats * 2, 64), st->ref_v = xalloc_bytes(st->floats * 2, 64);
    use_scalar();
    if (sdpa_convert(st->ref_k, SDPA_F16, j->x, SDPA_F32, st->floats) != SDPA_OK ||
        sdpa_convert(st->ref_v, SDPA_F16, st->v, SDPA_F32, st->floats) != SDPA_OK)
        exit(2);
    st->copy = xalloc_bytes(st->floats * 4, 64), st->copy_src = xalloc_bytes(st->floats * 4, 64);
    memcpy(st->copy_src, st->ref_k, st->floats * 2);
    memcpy(st->copy_src + st->floats, st->ref_v, st->floats * 2);
    j->y = xalloc(1), j->y_len = 1; /* the store writes the pools; check() poisons only this */
    j->extra = st;
    poison(st);
}

static void kv_store_run(enum kind kind, job *j, size_t iters) {
    kv_store_state *st = j->extra;
    static const size_t src_stride[2] = {KV_HEADS * KV_D, KV_D};
    if (kind == KIND_SDPA || kind == KIND_OLD)
        for (size_t i = 0; i < iters; i++)
            if (bench_api(kind)->kv_cache_store(&st->cache, st->k_pool, st->v_pool, st->slots, j->n,
                                                j->x, st->v, SDPA_F32, src_stride,
                                                src_stride) != SDPA_OK)
                exit(2);
    if (kind == KIND_NAIVE)
        for (size_t i = 0; i < iters; i++) memcpy(st->copy, st->copy_src, st->floats * 4);
    j->sink += (float)st->k_pool[0] + (float)st->copy[0];
}

/* Every token's rows at its slot, bit for bit the scalar sdpa_convert's (narrowing rounds to
   nearest even on every backend) */
static int pools_right(const job *j, const kv_store_state *st) {
    const size_t row = KV_D * sizeof(uint16_t);
    for (size_t t = 0; t < j->n; t++) {
        const size_t block = (size_t)st->slots[t] / KV_BLOCK, at = (size_t)st->slots[t] % KV_BLOCK;
        for (size_t h = 0; h < KV_HEADS; h++) {
            const size_t in_pool = ((block * KV_HEADS + h) * KV_BLOCK + at) * KV_D;
            const size_t in_ref = (t * KV_HEADS + h) * KV_D;
            if (memcmp(st->k_pool + in_pool, st->ref_k + in_ref, row) ||
                memcmp(st->v_pool + in_pool, st->ref_v + in_ref, row))
                return 0;
        }
    }
    return 1;
}

/* The store's pools right, or (the peer, which writes only its copy) the copy whole; each check
   runs one implementation once after the last one's poison */
static int kv_store_verify(const job *j, int exp_index) {
    (void)exp_index;
    kv_store_state *st = j->extra;
    const int ok = pools_right(j, st) || !memcmp(st->copy, st->copy_src, st->floats * 4);
    poison(st);
    return ok;
}

/* per token, k and v: KV_HEADS KV_D floats read and halves written each, and its slot */
static void kv_store_cost(const job *j, double *flops, double *bytes, double *working_set) {
    *flops = 0;
    *bytes = *working_set = (double)j->n * (2.0 * KV_HEADS * KV_D * 6.0 + 8.0);
}

static void kv_store_release(job *j) {
    kv_store_state *st = j->extra;
    free(st->v), free(st->table), free(st->slots), free(st->k_pool), free(st->v_pool);
    free(st->ref_k), free(st->ref_v), free(st->copy), free(st->copy_src), free(st);
    j->extra = NULL;
}

/* the other build's store (--against), where its table has one */
static int kv_store_against(job *j) {
    (void)j;
    return bench_against && bench_against->struct_size > offsetof(sdpa_api, kv_cache_store);
}

const op_def KV_STORE_OP = {
    .name = "kv_store",
    .sizes = {1, 16, 512, 8192},
    .smoke_sizes = {1, 17},
    .peers = {KIND_NAIVE, KIND_NONE},
    .exp_modes = 1,
    .plot_unit = "GB/s",
    .prepare = kv_store_prepare,
    .run = kv_store_run,
    .verify = kv_store_verify,
    .cost = kv_store_cost,
    .release = kv_store_release,
    .against = kv_store_against,
};
