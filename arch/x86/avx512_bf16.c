/* The avx512 backend's AVX512_BF16 add-on (kernels.h: sdpa_bf16_dot_kernels): Q.K from bf16 Q and
 * K with vdpbf16ps, two exact products and their sum into each of 16 float lanes an instruction,
 * straight from the bf16 rows of K. Compiled alone with -mavx512bf16 (meson.build: the avx512
 * record's add-on), which also lets the compiler use AVX512BW: nothing here may run before
 * src/dispatch.c has found both on the CPU. The tiles' max and transposes are the float path's
 * (arch/attention_keymajor.h); what is this ISA's own, the pair packing and the GEMM step, lives
 * in arch/x86/avx512_bf16_pairs.h, which the AMX add-on shares. */
#include "avx512_bf16_pairs.h"

static void scores_packed_avx512_bf16(float *s, size_t ld_s, const uint32_t *qt, size_t nq,
                                      const uint16_t *k, size_t k_stride, size_t nk, size_t d,
                                      float scale) {
    _Alignas(64) float st[SDPA_ATTN_MAX_BLOCK_KV * QT_LD];
    pairs_keymajor(st, qt, k, k_stride, nk, d, nq, scale);
    keymajor_to_rows(s, ld_s, st, nq, nk);
}

static void scores_max_avx512_bf16(float *st, float *tile_max, const uint32_t *qt, size_t nq,
                                   const uint16_t *k, size_t k_stride, size_t nk, size_t d_k,
                                   float scale) {
    pairs_keymajor(st, qt, k, k_stride, nk, d_k, nq, scale);
    keymajor_max(tile_max, st, nq, nk);
}

const sdpa_bf16_dot_kernels sdpa_bf16_dot_avx512 = {
    .pack_q = pack_q_avx512_bf16,
    .scores_packed = scores_packed_avx512_bf16,
    .scores_max = scores_max_avx512_bf16,
};
