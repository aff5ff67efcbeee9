/* A serving engine's loop over a paged f16 K/V cache, with continuous batching: requests arrive,
 * are admitted while seats and cache blocks are free, prefill their prompt in the same step as
 * others decode one token, and leave when done, giving their blocks back.
 *
 * The cache is one pool of BLOCKS blocks of BLOCK tokens ([block][head][token][d] in f16) and a
 * block table with one row per seat: seat s's n-th block. Each step:
 *   1. new tokens' k and v (the model's, here pseudo-random) go into their slots through
 *      sdpa_kv_cache_store (slot = block * BLOCK + position in the block, converted to f16);
 *   2. one sdpa_attention_paged call serves every seat: the new tokens' queries packed
 *      [token][head][d], q_start and kv_len per seat, causal within each sequence;
 *   3. every output is checked against sdpa_mha on a dense copy of the sequence's cache.
 *
 * Build: cc serving.c $(pkg-config --cflags --libs sdpa) -lm  (or through meson: examples/serving).
 * Prints one line per step and "ok"; exits 1 if an output differs. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdpa.h"

enum { HEADS_Q = 8, HEADS_KV = 2, D = 64, BLOCK = 16, BLOCKS = 40, SEATS = 4, MAX_BLOCKS = 12 };
enum { REQUESTS = 7 };

/* a request: its prompt's length and the tokens it generates */
static const int32_t PROMPT[REQUESTS] = {37, 5, 80, 12, 64, 20, 9};
static const int32_t GENERATE[REQUESTS] = {6, 9, 4, 7, 5, 3, 8};

static uint16_t k_pool[BLOCKS][HEADS_KV][BLOCK][D], v_pool[BLOCKS][HEADS_KV][BLOCK][D];
static int32_t block_table[SEATS][MAX_BLOCKS];
static int free_blocks[BLOCKS], n_free;

typedef struct seat {
    int request;     /* -1: empty */
    int32_t cached;  /* tokens in the cache */
    int32_t decoded; /* tokens generated so far */
    int32_t blocks;  /* blocks it holds */
} seat;

static float uniform(uint32_t *state) { /* in [-1, 1), the same sequence on every machine */
    *state = *state * 1664525u + 1013904223u;
    return (float)(*state >> 8) / (float)(1u << 23) - 1.0f;
}

/* Gives seat s enough blocks for `tokens` tokens; 0 if the pool has too few left. */
static int reserve(seat *st, int s, int32_t tokens) {
    const int32_t need = (tokens + BLOCK - 1) / BLOCK;
    if (need > MAX_BLOCKS || need - st->blocks > n_free) return 0;
    for (; st->blocks < need; st->blocks++) block_table[s][st->blocks] = free_blocks[--n_free];
    return 1;
}

/* Seat s's request is done: its blocks go back to the pool. */
static void leave(seat *st, int s) {
    for (int32_t b = 0; b < st->blocks; b++) free_blocks[n_free++] = block_table[s][b];
    st->request = -1;
    st->blocks = 0;
}

/* The dense call on sequence s's cache (gathered from its blocks) agrees with out, rows x
   HEADS_Q x D: each is within sdpa.h's bound, 1e-5 max|v| with |v| < 1 here, of the exact
   result, and blocks of 16 keys may split a block of values where the dense call does not, so
   the two may round apart (with blocks of a multiple of 64 keys they are the same bits). */
static int dense_agrees(const seat *st, int s, const float *q, const float *out, int32_t rows) {
    const int32_t n = st->cached;
    uint16_t *k = malloc((size_t)n * HEADS_KV * D * 2), *v = malloc((size_t)n * HEADS_KV * D * 2);
    float *dense = malloc((size_t)rows * HEADS_Q * D * sizeof *dense);
    for (int32_t j = 0; j < n; j++)
        for (int h = 0; h < HEADS_KV; h++) {
            const int32_t b = block_table[s][j / BLOCK];
            memcpy(k + ((size_t)j * HEADS_KV + h) * D, k_pool[b][h][j % BLOCK], D * 2);
            memcpy(v + ((size_t)j * HEADS_KV + h) * D, v_pool[b][h][j % BLOCK], D * 2);
        }
    sdpa_mha_desc desc;
    sdpa_mha_desc_bshd(&desc, 1, HEADS_Q, HEADS_KV, (size_t)rows, (size_t)n, D, D,
                       SDPA_DEFAULT_SCALE, SDPA_CAUSAL);
    desc.kv_type = SDPA_F16;
    int ok = sdpa_mha(&desc, dense, q, k, v) == SDPA_OK;
    for (size_t i = 0; ok && i < (size_t)rows * HEADS_Q * D; i++)
        ok = fabsf(dense[i] - out[i]) <= 2e-5f;
    free(k);
    free(v);
    free(dense);
    return ok;
}

/* One step: every seated request's new tokens (a prompt, or one decoded token) stored, then
   attended to in one paged call. Returns 0 if an output disagrees with the dense call. */
static int step(seat seats[SEATS], uint32_t *rng, int32_t *tokens_out) {
    int32_t q_start[SEATS + 1] = {0}, kv_len[SEATS];
    for (int s = 0; s < SEATS; s++) {
        const int32_t n = seats[s].request < 0   ? 0
                          : seats[s].cached == 0 ? PROMPT[seats[s].request]
                                                 : 1;
        q_start[s + 1] = q_start[s] + n;
        kv_len[s] = seats[s].cached + n;
    }
    const int32_t total = q_start[SEATS];
    const size_t row = (size_t)HEADS_Q * D, kv_row = (size_t)HEADS_KV * D;
    float *q = malloc(total * row * 4), *out = malloc(total * row * 4);
    float *k = malloc(total * kv_row * 4), *v = malloc(total * kv_row * 4);
    int64_t *slots = malloc(total * sizeof *slots);
    for (size_t i = 0; i < total * row; i++) q[i] = uniform(rng);
    for (size_t i = 0; i < total * kv_row; i++) k[i] = uniform(rng), v[i] = uniform(rng);
    for (int s = 0; s < SEATS; s++)
        for (int32_t t = q_start[s]; t < q_start[s + 1]; t++) {
            const int32_t pos = seats[s].cached + (t - q_start[s]);
            slots[t] = (int64_t)block_table[s][pos / BLOCK] * BLOCK + pos % BLOCK;
        }
    const sdpa_kv_cache cache = {.struct_size = sizeof cache,
                                 .kv_type = SDPA_F16,
                                 .num_blocks = BLOCKS,
                                 .block_size = BLOCK,
                                 .heads_kv = HEADS_KV,
                                 .d_k = D,
                                 .d_v = D,
                                 .k_stride = {HEADS_KV * BLOCK * D, BLOCK * D, D},
                                 .v_stride = {HEADS_KV * BLOCK * D, BLOCK * D, D},
                                 .block_table = &block_table[0][0],
                                 .block_table_stride = MAX_BLOCKS};
    const size_t src_stride[2] = {kv_row, D};
    sdpa_status st = sdpa_kv_cache_store(&cache, k_pool, v_pool, slots, (size_t)total, k, v,
                                         SDPA_F32, src_stride, src_stride);
    const sdpa_batch batch = {.struct_size = sizeof batch,
                              .flags = SDPA_CAUSAL,
                              .num_seqs = SEATS,
                              .heads_q = HEADS_Q,
                              .q_start = q_start,
                              .kv_len = kv_len,
                              .scale = SDPA_DEFAULT_SCALE,
                              .q_type = SDPA_F32,
                              .out_type = SDPA_F32,
                              .q_stride = {row, D},
                              .out_stride = {row, D}};
    if (st == SDPA_OK) st = sdpa_attention_paged(&batch, &cache, out, q, k_pool, v_pool);
    int ok = st == SDPA_OK;
    if (!ok) fprintf(stderr, "serving: %s: %s\n", sdpa_status_string(st), sdpa_last_error_detail());
    for (int s = 0; ok && s < SEATS; s++) {
        const int32_t n = q_start[s + 1] - q_start[s];
        if (!n) continue;
        seats[s].cached += n;
        ok = dense_agrees(&seats[s], s, q + q_start[s] * row, out + q_start[s] * row, n);
        if (!ok) fprintf(stderr, "serving: seat %d disagrees with the dense call\n", s);
    }
    *tokens_out = total;
    free(q);
    free(out);
    free(k);
    free(v);
    free(slots);
    return ok;
}

/* Seats waiting requests while seats and blocks last, and gives every decoding seat room for
   its next token. Returns 0 if a decoding seat cannot grow (this pool is sized so it always
   can; a real engine would preempt a request). */
static int schedule(seat seats[SEATS], int *next, int *prefills, int *decodes) {
    *prefills = *decodes = 0;
    for (int s = 0; s < SEATS; s++) {
        if (seats[s].request >= 0) {
            if (!reserve(&seats[s], s, seats[s].cached + 1)) return 0;
            ++*decodes;
        } else if (*next < REQUESTS) {
            seat arriving = {*next, 0, 0, 0};
            if (!reserve(&arriving, s, PROMPT[*next])) continue; /* waits for blocks */
            seats[s] = arriving;
            ++*next;
            ++*prefills;
        }
    }
    return 1;
}

int main(void) {
    seat seats[SEATS];
    for (int s = 0; s < SEATS; s++) seats[s].request = -1, seats[s].blocks = 0;
    for (int b = 0; b < BLOCKS; b++) free_blocks[n_free++] = BLOCKS - 1 - b;
    int next = 0, done = 0;
    uint32_t rng = 2024;
    for (int n = 0; done < REQUESTS; n++) {
        int prefills, decodes;
        int32_t tokens;
        if (!schedule(seats, &next, &prefills, &decodes)) {
            fprintf(stderr, "serving: the pool ran out of blocks\n");
            return 1;
        }
        if (!step(seats, &rng, &tokens)) return 1;
        printf(
            "step %2d: %d prefills, %d decodes, %3d tokens, %2d blocks free: as the dense call\n",
            n, prefills, decodes, (int)tokens, n_free);
        /* each step gives every seated request one new token (a prefill its first) */
        for (int s = 0; s < SEATS; s++)
            if (seats[s].request >= 0 && ++seats[s].decoded == GENERATE[seats[s].request]) {
                leave(&seats[s], s);
                done++;
            }
    }
    printf("ok\n");
    return 0;
}
