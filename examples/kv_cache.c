/* An inference engine's K/V cache: buffers allocated once for max_len tokens, filled a token at a
 * time, and handed to sdpa_mha viewed at their current length, without a copy.
 *
 * The view is the descriptor's len_kv (the tokens cached so far) with the strides of the
 * max_len buffer. Strides are in elements and go [batch][head][row]:
 *
 *   BSHD cache k[batch][max_len][heads_kv][d]:  k_stride = {max_len * heads_kv * d, d, heads_kv *
 * d} BHSD cache k[batch][heads_kv][max_len][d]:  k_stride = {heads_kv * max_len * d, max_len * d,
 * d}
 *
 * (and v_stride the same with d_v). In BSHD only the batch stride differs from a dense tensor of
 * len_kv tokens; in BHSD the batch and head strides do. A 16-bit cache keeps the same strides,
 * with kv_type set. Here one cache of each layout (BSHD in f16, BHSD in f32, holding the same
 * values) runs a causal prefill of a prompt and then one decode step per new token, and every
 * output is checked against a double-precision reference over the tokens cached so far.
 *
 * Build: cc kv_cache.c $(pkg-config --cflags --libs sdpa) -lm  (or through meson:
 * examples/kv_cache). Prints one line per phase and "ok"; exits 1 if a result is off. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "sdpa.h"

enum { BATCH = 2, HEADS_Q = 8, HEADS_KV = 2, D = 64, MAX_LEN = 48, PROMPT = 7 };

/* the caches, allocated once at their full length */
static uint16_t k_bshd[BATCH][MAX_LEN][HEADS_KV][D], v_bshd[BATCH][MAX_LEN][HEADS_KV][D];
static float k_bhsd[BATCH][HEADS_KV][MAX_LEN][D], v_bhsd[BATCH][HEADS_KV][MAX_LEN][D];

static float uniform(void) { /* in [-1, 1), the same sequence on every machine */
    static uint32_t state = 12345;
    state = state * 1664525u + 1013904223u;
    return (float)(state >> 8) / (float)(1u << 23) - 1.0f;
}

/* Appends n new tokens at position pos of both caches. Values are rounded to f16 first, so that
 * the two caches hold the same numbers. */
static void append_tokens(size_t pos, size_t n) {
    for (size_t b = 0; b < BATCH; b++)
        for (size_t t = pos; t < pos + n; t++)
            for (size_t h = 0; h < HEADS_KV; h++)
                for (size_t c = 0; c < D; c++) {
                    float kv[2] = {uniform(), uniform()};
                    uint16_t half[2];
                    sdpa_convert(half, SDPA_F16, kv, SDPA_F32, 2);
                    sdpa_convert(kv, SDPA_F32, half, SDPA_F16, 2);
                    k_bshd[b][t][h][c] = half[0], v_bshd[b][t][h][c] = half[1];
                    k_bhsd[b][h][t][c] = kv[0], v_bhsd[b][h][t][c] = kv[1];
                }
}

/* The descriptor for len_q new query rows over the first len cached tokens; q and out are dense
 * [batch][heads_q][len_q][d]. Only the K and V strides say where the cache's rows are. */
static sdpa_mha_desc cache_view(int bshd, size_t len_q, size_t len) {
    sdpa_mha_desc desc;
    sdpa_mha_desc_dense(&desc, BATCH, HEADS_Q, HEADS_KV, len_q, len, D, D, SDPA_DEFAULT_SCALE,
                        SDPA_CAUSAL);
    const size_t bshd_strides[3] = {MAX_LEN * HEADS_KV * D, D, HEADS_KV * D};
    const size_t bhsd_strides[3] = {HEADS_KV * MAX_LEN * D, MAX_LEN * D, D};
    for (int i = 0; i < 3; i++)
        desc.k_stride[i] = desc.v_stride[i] = bshd ? bshd_strides[i] : bhsd_strides[i];
    desc.kv_type = bshd ? SDPA_F16 : SDPA_F32;
    return desc;
}

/* The largest |out - exact| over the call's rows, the exact attention computed in double from
 * the BHSD cache (the same values as the BSHD one): query row i is token len - len_q + i and
 * sees the tokens up to itself. */
static double max_error(const float *out, const float *q, size_t len_q, size_t len) {
    double worst = 0, s[MAX_LEN];
    const double scale = 1.0 / sqrt((double)D);
    for (size_t b = 0; b < BATCH; b++)
        for (size_t h = 0; h < HEADS_Q; h++) {
            const size_t hk = h / (HEADS_Q / HEADS_KV);
            for (size_t i = 0; i < len_q; i++) {
                const float *qi = q + ((b * HEADS_Q + h) * len_q + i) * D;
                const size_t seen = len - len_q + i + 1;
                double max = -INFINITY, sum = 0;
                for (size_t j = 0; j < seen; j++) {
                    s[j] = 0;
                    for (size_t c = 0; c < D; c++) s[j] += (double)qi[c] * k_bhsd[b][hk][j][c];
                    s[j] *= scale;
                    max = s[j] > max ? s[j] : max;
                }
                for (size_t j = 0; j < seen; j++) sum += s[j] = exp(s[j] - max);
                for (size_t c = 0; c < D; c++) {
                    double o = 0;
                    for (size_t j = 0; j < seen; j++) o += s[j] * v_bhsd[b][hk][j][c];
                    const double e = fabs(out[((b * HEADS_Q + h) * len_q + i) * D + c] - o / sum);
                    worst = e > worst ? e : worst;
                }
            }
        }
    return worst;
}

/* One attention call on each cache, len_q new rows over len cached tokens; the worst error. */
static double attend(size_t len_q, size_t len) {
    static float q[BATCH * HEADS_Q * PROMPT * D], out[BATCH * HEADS_Q * PROMPT * D];
    for (size_t i = 0; i < BATCH * HEADS_Q * len_q * D; i++) q[i] = uniform();
    double worst = 0;
    for (int bshd = 0; bshd < 2; bshd++) {
        const sdpa_mha_desc desc = cache_view(bshd, len_q, len);
        const void *k = bshd ? (const void *)k_bshd : (const void *)k_bhsd;
        const void *v = bshd ? (const void *)v_bshd : (const void *)v_bhsd;
        sdpa_status st = sdpa_mha(&desc, out, q, k, v);
        if (st != SDPA_OK) {
            fprintf(stderr, "sdpa_mha: %s\n", sdpa_status_string(st));
            exit(1);
        }
        const double e = max_error(out, q, len_q, len);
        worst = e > worst ? e : worst;
    }
    return worst;
}

int main(void) {
    /* sdpa.h's attention bound, 1e-5 max|v|, with |v| < 1 here */
    const double bound = 1e-5;
    append_tokens(0, PROMPT);
    const double prefill = attend(PROMPT, PROMPT);
    printf("prefill: %d tokens into both caches (BSHD f16, BHSD f32), max |error| %.2g\n", PROMPT,
           prefill);
    double decode = 0;
    for (size_t len = PROMPT + 1; len <= MAX_LEN; len++) {
        append_tokens(len - 1, 1);
        const double e = attend(1, len);
        decode = e > decode ? e : decode;
    }
    printf("decode: %d steps, one token each, to %d of %d cached, max |error| %.2g\n",
           MAX_LEN - PROMPT, MAX_LEN, MAX_LEN, decode);
    const int ok = prefill <= bound && decode <= bound;
    printf("%s: every output within %g of the exact attention (backend %s)\n", ok ? "ok" : "FAIL",
           bound, sdpa_backend());
    return ok ? 0 : 1;
}
