/* AVX-512F attention microkernels (the tiling driver is src/attention.c); avx512.c's table points
 * at sdpa_attention_kernels_avx512. The algorithms are arch/attention_tiles.h's and
 * arch/attention_packed.h's; this file gives them avx512's register blocks and exps. */
#include "avx512_exp.h"

#define ISA_NAME(f) f##_avx512

#include "attention_packed.h"

enum { BLOCK_Q = 32, BLOCK_KV = 64 };
/* Scores: 4 x 4 blocks, 8 loads for 16 FMAs and the 16 dots reduced by one fv_hsums; a single
 * query against 16 keys at a time. */
enum { SCORES_MR = 4, SCORES_NR = 4, SCORES_KEYWISE = 0, SCORES_ROW_NR = 16 };
/* exp_pv two keys a step: two exps side by side already keep the pipes busy */
enum { EXP_PV_KEYS = 2 };
/* decode: the exps of a whole tile in one call */
#define ISA_EXP_TILE 1

ALWAYS_INLINE float isa_dot(const float *a, const float *b, size_t n) {
    return dot_avx512(a, b, n);
}

/* A single query against 16 keys (decode) with the 16 dots in named accumulators: in
 * scores_row's form, with the dots in an array, GCC spends more instructions a block on the 16
 * key pointers, which this loop, bound by its 17 loads a step, does not hide. */
ALWAYS_INLINE void row16_key(fv *acc, fv vq, const float *k, const fv_lanes *m) {
    *acc = fv_madd(vq, tile_load(k, m), *acc);
}
ALWAYS_INLINE void row16_step(fv *a0, fv *a1, fv *a2, fv *a3, fv *a4, fv *a5, fv *a6, fv *a7,
                              fv *a8, fv *a9, fv *a10, fv *a11, fv *a12, fv *a13, fv *a14, fv *a15,
                              const float *q, const float *k, size_t ks, size_t p,
                              const fv_lanes *m) {
    const fv vq = tile_load(q + p, m);
    row16_key(a0, vq, k + p, m), row16_key(a1, vq, k + ks + p, m);
    row16_key(a2, vq, k + 2 * ks + p, m), row16_key(a3, vq, k + 3 * ks + p, m);
    row16_key(a4, vq, k + 4 * ks + p, m), row16_key(a5, vq, k + 5 * ks + p, m);
    row16_key(a6, vq, k + 6 * ks + p, m), row16_key(a7, vq, k + 7 * ks + p, m);
    row16_key(a8, vq, k + 8 * ks + p, m), row16_key(a9, vq, k + 9 * ks + p, m);
    row16_key(a10, vq, k + 10 * ks + p, m), row16_key(a11, vq, k + 11 * ks + p, m);
    row16_key(a12, vq, k + 12 * ks + p, m), row16_key(a13, vq, k + 13 * ks + p, m);
    row16_key(a14, vq, k + 14 * ks + p, m), row16_key(a15, vq, k + 15 * ks + p, m);
}
#define ISA_SCORES_ROW
ALWAYS_INLINE void isa_scores_row(float *s, const float *q, const float *k, size_t k_stride,
                                  size_t d, fv vscale) {
    fv a0 = fv_zero(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0,
       a9 = a0, a10 = a0, a11 = a0, a12 = a0, a13 = a0, a14 = a0, a15 = a0;
    size_t p = 0;
    for (; p + W <= d; p += W)
        row16_step(&a0, &a1, &a2, &a3, &a4, &a5, &a6, &a7, &a8, &a9, &a10, &a11, &a12, &a13, &a14,
                   &a15, q, k, k_stride, p, NULL);
    if (p < d) {
        const fv_lanes m = fv_first(d - p);
        row16_step(&a0, &a1, &a2, &a3, &a4, &a5, &a6, &a7, &a8, &a9, &a10, &a11, &a12, &a13, &a14,
                   &a15, q, k, k_stride, p, &m);
    }
    const fv a[16] = {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15};
    fv_store(s, fv_mul(fv_hsums(a), vscale));
}

/* P V: 4 rows x 64 columns, the block of acc in 16 registers for all nk keys (4 loads of v and 4
 * broadcasts for 16 FMAs a key); the columns left over 16 at a time, masked, for the 4 rows at
 * once; the rows left over one at a time. */
ALWAYS_INLINE void isa_pv(const pv_operands *o) { pv_tile_loops(o, 4, 4, 0, 0, 4, 4); }

/* Key-major scores: 8 keys x 32 queries, 2 loads of qt and 8 broadcasts of k for 16 FMAs a step,
 * then the keys left over one at a time. */
static void ISA_NAME(scores_keymajor)(float *st, const float *qt, const float *k, size_t k_stride,
                                      size_t nk, size_t d, size_t nq, float scale) {
    (void)nq;
    const fv vscale = fv_set1(scale);
    const size_t j = keymajor_blocks(st, qt, k, k_stride, 0, nk, d, vscale, 8, 2);
    keymajor_blocks(st, qt, k, k_stride, j, nk, d, vscale, 1, 2);
}

/* the exps of scores minus their row's max, <= 0: exp_sum's light form */
ALWAYS_INLINE fv isa_exp_table(void) { return exp_table_avx512(); }
ALWAYS_INLINE void isa_exps(fv *x, int n, fv table, int kind) {
    for (int u = 0; u < n; u++)
        x[u] = kind == SDPA_EXP_FAST ? exp_fast_avx512(x[u], table, 0)
                                     : exp_sleef_avx512(x[u], table, 0);
}

#include "attention_entries.h"
