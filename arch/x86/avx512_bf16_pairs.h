/* The bf16 dot's pack_q (kernels.h: sdpa_bf16_dot_kernels) for the avx512 backend's add-ons:
 * the pairs of qt are vdpbf16ps's operands (arch/x86/avx512_bf16.c) and, as they lie, AMX's B
 * tiles (arch/x86/avx512_amx.c). AVX512BW only (16-bit masked loads), so that each file can
 * bring the flags of its own ISA. */
#ifndef SDPA_ARCH_X86_AVX512_BF16_PAIRS_H
#define SDPA_ARCH_X86_AVX512_BF16_PAIRS_H

#include <string.h>

#include "avx512.h"

#include "attention_keymajor.h"

#if !defined(__AVX512BW__)
#error "arch/x86/avx512_bf16_pairs.h needs -mavx512bw"
#endif

/* kernels.h's pack_q of the bf16 dot: W x W blocks of 32-bit pairs through the register
 * transpose. A row's pairs load as W x 2 bf16 elements under a 16-bit mask, which stops at its
 * d-th element, so an odd d's last pair gets a zero second element and nothing past the row is
 * read (a masked-off element never faults). */
static void pack_q_avx512_bf16(uint32_t *qt, size_t ld_qt, const uint16_t *q, size_t q_stride,
                               size_t nq, size_t d) {
    for (size_t p0 = 0; p0 < d; p0 += 2 * W) {
        const size_t ne = d - p0 < 2 * W ? d - p0 : 2 * W, np = (ne + 1) / 2;
        const __mmask32 m = (__mmask32)((1ull << ne) - 1);
        for (size_t i0 = 0; i0 < SDPA_ATTN_MAX_BLOCK_Q; i0 += W) {
            vf r[W];
            for (size_t t = 0; t < W; t++)
                r[t] = i0 + t < nq ? _mm512_castsi512_ps(
                                         _mm512_maskz_loadu_epi16(m, q + (i0 + t) * q_stride + p0))
                                   : vf_zero();
            vf_transpose(r);
            for (size_t t = 0; t < np; t++)
                vf_store((float *)(qt + (p0 / 2 + t) * ld_qt + i0), r[t]);
        }
    }
}

#endif
