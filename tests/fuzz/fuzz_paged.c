/* Differential fuzzer for the paged call: sdpa_attention_paged on a random batch (sequences of
 * 0 to 6 query rows over 0 to 90 keys, causal or not, GQA, blocks of 1 to 17 tokens scattered
 * through a pool whose unused slots hold NaN, every K/V type, score modifiers now and then)
 * against sdpa_mha on each sequence's keys gathered densely, on every backend this CPU runs.
 * It checks:
 *   - both return the same status, and the paged call writes nothing on error;
 *   - every output is within sdpa_mha's bound of the dense one (the two may split P V at other
 *     keys), on ordinary values (the NaN in unused slots must never show);
 *   - nothing outside out's array is written (canaries, AddressSanitizer).
 *
 * Run it with scripts/fuzz; a crash file it leaves reproduces with build-fuzz/fuzz_paged. */
#include "fuzz_common.h"

#define MAX_SEQS 3
#define MAX_ROWS 6
#define MAX_KEYS 90
#define MAX_D    24

/* An ordinary value in [-2, 2): the specials are fuzz_types' and fuzz_attention's to try; here
   the two paths must agree within the bound, which overflow would not keep. */
static float ordinary(fuzz_reader *r) {
    const int16_t v = (int16_t)(fuzz_u8(r) << 8 | fuzz_u8(r));
    return (float)v / 16384.0f;
}

static size_t size_of(uint32_t t) { return t == SDPA_F32 ? 4 : t <= SDPA_BF16 ? 2 : 1; }

/* One sequence through sdpa_mha on dense copies: q rows r0.. of the batch, keys 0..n. */
static sdpa_status dense_sequence(const sdpa_batch *b, const sdpa_kv_cache *c, size_t s,
                                  const uint8_t *kd, const uint8_t *vd, const float *q,
                                  float *out) {
    const size_t r0 = (size_t)b->q_start[s], rows = (size_t)b->q_start[s + 1] - r0;
    const size_t keys = (size_t)b->kv_len[s], hq = b->heads_q, hk = c->heads_kv;
    sdpa_mha_desc d;
    sdpa_mha_desc_bshd(&d, 1, hq, hk, rows, keys, c->d_k, c->d_v, b->scale, b->flags);
    sdpa_mha_desc_set_mods(&d, b->mods);
    d.kv_type = c->kv_type, d.k_scale = c->k_scale, d.v_scale = c->v_scale;
    return sdpa_mha(&d, out + r0 * hq * c->d_v, q + r0 * hq * c->d_k, kd, vd);
}

static void run_case(fuzz_reader *r) {
    const uint8_t sel = fuzz_u8(r);
    const size_t n_seqs = 1 + sel % MAX_SEQS, hk = 1 + (sel >> 2 & 1),
                 hq = hk * (1 + (sel >> 3) % 2);
    const size_t d = 1 + fuzz_u8(r) % MAX_D, bs = 1 + fuzz_u8(r) % 17;
    const uint32_t kv_type = fuzz_u8(r) % 5;
    int32_t q_start[MAX_SEQS + 1] = {0}, kv_len[MAX_SEQS];
    size_t blocks = 0;
    for (size_t s = 0; s < n_seqs; s++) {
        kv_len[s] = (int32_t)(fuzz_u8(r) % (MAX_KEYS + 1));
        size_t rows = fuzz_u8(r) % (MAX_ROWS + 1);
        if ((sel & 0x40) && rows > (size_t)kv_len[s]) rows = (size_t)kv_len[s]; /* causal */
        q_start[s + 1] = q_start[s] + (int32_t)rows;
        blocks += ((size_t)kv_len[s] + bs - 1) / bs;
    }
    const size_t pool = blocks + 2, per_seq = (MAX_KEYS + bs - 1) / bs, row = hk * bs * d;
    int32_t table[MAX_SEQS * 90];
    for (size_t i = 0; i < n_seqs * per_seq; i++) table[i] = 0;
    /* a permutation of the pool's blocks, from the input */
    size_t order[MAX_SEQS * 90 + 2];
    for (size_t i = 0; i < pool; i++) order[i] = i;
    for (size_t i = pool; i > 1; i--) {
        const size_t j = fuzz_u8(r) % i, t = order[i - 1];
        order[i - 1] = order[j], order[j] = t;
    }
    uint8_t *kp = malloc(pool * row * 4), *vp = malloc(pool * row * 4);
    memset(kp, 0xff, pool * row * 4), memset(vp, 0xff, pool * row * 4); /* NaN in every type */
    const size_t es = size_of(kv_type), rows = (size_t)q_start[n_seqs];
    float *q = malloc((rows * hq * d + 1) * 4), *out = malloc((rows * hq * d + 1) * 4);
    float *want = malloc((rows * hq * d + 1) * 4);
    for (size_t i = 0; i < rows * hq * d; i++) q[i] = ordinary(r);
    uint8_t *kd = malloc(MAX_KEYS * hk * d * 4 + 1), *vd = malloc(MAX_KEYS * hk * d * 4 + 1);
    size_t next = 0;
    for (size_t s = 0; s < n_seqs; s++)
        for (size_t b = 0; b < ((size_t)kv_len[s] + bs - 1) / bs; b++)
            table[s * per_seq + b] = (int32_t)order[next++];
    const sdpa_kv_cache c = {.struct_size = sizeof c,
                             .kv_type = kv_type,
                             .num_blocks = pool,
                             .block_size = bs,
                             .heads_kv = hk,
                             .d_k = d,
                             .d_v = d,
                             .k_stride = {row, bs * d, d},
                             .v_stride = {row, bs * d, d},
                             .block_table = table,
                             .block_table_stride = per_seq,
                             .k_scale = kv_type > SDPA_BF16 ? 0.5f : 0.0f,
                             .v_scale = kv_type > SDPA_BF16 ? 2.0f : 0.0f};
    sdpa_score_mods m = {.struct_size = sizeof m, .window_left = -1, .window_right = -1};
    if (sel & 0x80) m.window_left = fuzz_u8(r) % 40, m.softcap = (float)(1 + fuzz_u8(r) % 30);
    sdpa_batch b = {.struct_size = sizeof b,
                    .flags = sel & 0x40 ? SDPA_CAUSAL : 0,
                    .num_seqs = n_seqs,
                    .heads_q = hq,
                    .q_start = q_start,
                    .kv_len = kv_len,
                    .scale = SDPA_DEFAULT_SCALE,
                    .q_stride = {hq * d, d},
                    .out_stride = {hq * d, d},
                    .mods = sel & 0x80 ? &m : NULL};
    for (size_t t = 0; t < n_seqs * MAX_KEYS;
         t++) { /* every key's values, stored through the cache */
        const size_t s = t / MAX_KEYS, j = t % MAX_KEYS;
        if (j >= (size_t)kv_len[s]) continue;
        float kv[2 * 2 * MAX_D];
        for (size_t i = 0; i < 2 * hk * d; i++) kv[i] = ordinary(r);
        const int64_t slot = (int64_t)table[s * per_seq + j / bs] * (int64_t)bs + (int64_t)(j % bs);
        const size_t src_stride[2] = {hk * d, d};
        FUZZ_CHECK(sdpa_kv_cache_store(&c, kp, vp, &slot, 1, kv, kv + hk * d, SDPA_F32, src_stride,
                                       src_stride) == SDPA_OK,
                   "store: %s", sdpa_last_error_detail());
    }
    for (size_t be = 0; next_backend(&be);) {
        const sdpa_status st = sdpa_attention_paged(&b, &c, out, q, kp, vp);
        for (size_t s = 0; s < n_seqs; s++) {
            for (size_t j = 0; j < (size_t)kv_len[s]; j++)
                for (size_t h = 0; h < hk; h++) {
                    const size_t at =
                        ((size_t)table[s * per_seq + j / bs] * hk + h) * bs * d + j % bs * d;
                    memcpy(kd + (j * hk + h) * d * es, kp + at * es, d * es);
                    memcpy(vd + (j * hk + h) * d * es, vp + at * es, d * es);
                }
            const sdpa_status sd = dense_sequence(&b, &c, s, kd, vd, q, want);
            FUZZ_CHECK(sd == st || st != SDPA_OK, "sequence %zu: dense %d, paged %d", s, sd, st);
        }
        if (st != SDPA_OK) continue;
        for (size_t i = 0; i < rows * hq * d; i++)
            FUZZ_CHECK(
                isnan(out[i]) == isnan(want[i]) &&
                    (isnan(out[i]) || fabsf(out[i] - want[i]) <= 1e-5f * (1 + fabsf(want[i])) * 8),
                "out[%zu] %g, dense %g (block %zu, type %u)", i, out[i], want[i], bs, kv_type);
    }
    free(kp), free(vp), free(q), free(out), free(want), free(kd), free(vd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_reader r = fuzz_reader_init(data, size);
    run_case(&r);
    return 0;
}
