/* A backend's attention entries from arch/attention_tiles.h with the backend's part, each named
 * ISA_NAME(entry) (scores_tile_avx512, ...). Included once by <isa>_attention.c, after:
 *   ISA_NAME(f)             f with the backend's suffix (f##_avx512)
 *   SCORES_MR, SCORES_NR    the scores' register block (scores_block)
 *   SCORES_KEYWISE          its loads keywise (scores_step)
 *   SCORES_ROW_NR           the keys of a single query's block
 *   ISA_SCORES_ROW          defined where the backend has an isa_scores_row of its own */
#ifndef SDPA_ARCH_ATTENTION_ENTRIES_H
#define SDPA_ARCH_ATTENTION_ENTRIES_H

#ifndef ISA_SCORES_ROW
ALWAYS_INLINE void isa_scores_row(float *s, const float *q, const float *k, size_t k_stride,
                                  size_t d, fv vscale) {
    scores_row(s, q, k, k_stride, d, vscale, SCORES_ROW_NR);
}
#endif

/* a function of its own, so that the registers its row_nr key streams need are allocated for it
 * alone, not along with the blocks' */
__attribute__((noinline)) static void ISA_NAME(scores_query)(float *s, const float *q,
                                                             const float *k, size_t k_stride,
                                                             size_t nk, size_t d, float scale) {
    scores_query(s, q, k, k_stride, nk, d, scale, SCORES_ROW_NR);
}

static void ISA_NAME(scores_tile)(float *s, size_t ld_s, const float *q, size_t q_stride, size_t nq,
                                  const float *k, size_t k_stride, size_t nk, size_t d,
                                  float scale) {
    size_t i = scores_row_blocks(s, ld_s, q, q_stride, nq, k, k_stride, nk, d, scale, SCORES_MR,
                                 SCORES_NR, SCORES_KEYWISE);
    for (; i < nq; i++)
        ISA_NAME(scores_query)(s + i * ld_s, q + i * q_stride, k, k_stride, nk, d, scale);
}

static void ISA_NAME(pv_tile)(float *acc, size_t ld_acc, const float *p, size_t ld_p, size_t nq,
                              size_t nk, const float *v, size_t v_stride, size_t d_v) {
    const pv_operands o = {acc, ld_acc, p, ld_p, 1, NULL, nq, nk, v, v_stride, d_v};
    isa_pv(&o);
}

#endif
