/* AVX-512F: what every avx512 file shares (the vector width, tails, reductions, the dot). */
#ifndef SDPA_ARCH_X86_AVX512_H
#define SDPA_ARCH_X86_AVX512_H

#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <sleef.h>
#include <stdint.h>

#include "exp_constants.h"
#include "kernels.h"
#include "shift_guess.h"

#define W 16

/* ---- vector operations for the row templates ---- */
/* What arch/row_kernels.h and arch/softmax_passes.h ask of an ISA, beyond + - * on its vector
 * type (the compiler's vector operators, the intrinsics' own instructions). Macros over the
 * intrinsics where one does, so that the templates compile to what the intrinsics written out
 * give: even an always_inline wrapper is inlined at another point, after which gcc picks other
 * registers and another loop layout, and a short call shows it. An `acc` is a variable. */
typedef __m512 vf;
typedef __mmask16 vpart; /* the lanes of a row's last, partial vector */
#define vf_load(p)             _mm512_loadu_ps(p)
#define vf_store(p, v)         _mm512_storeu_ps(p, v)
#define vf_set1(a)             _mm512_set1_ps(a)
#define vf_first(v)            _mm512_cvtss_f32(v)
#define vf_max(a, b)           _mm512_max_ps(a, b) /* b where either is NaN */
#define vf_min(a, b)           _mm512_min_ps(a, b)
#define vf_hsum(v)             _mm512_reduce_add_ps(v)
#define vf_hmax(v)             _mm512_reduce_max_ps(v)
#define vpart_first(len)       tail_mask(len) /* lanes [0, len), len <= W: below */
#define vf_load_part(p, m)     _mm512_maskz_loadu_ps(m, p)
#define vf_store_part(p, m, v) _mm512_mask_storeu_ps(p, m, v)
#define vf_max_part(acc, m, z) _mm512_mask_max_ps(acc, m, z, acc)
#define vf_add_part(acc, m, e) _mm512_mask_add_ps(acc, m, acc, e)
#define vf_lead(p)             lead_to_line(p) /* the long loops start at a line: below */
#define rounds_to_nearest()    (!(_mm_getcsr() & 0x6000u)) /* MXCSR's RC */
/* Lane-wise max and sum of all 16 lanes, in every lane, with no trip through a scalar register
 * (the result feeds vector code at once): inside each 128-bit chunk, then across the four chunks,
 * each as three exchanges side by side (the partners i ^ 1, i ^ 2 and i ^ 3), not two in turn. A
 * 512-bit shuffle across chunks takes 5 cycles on Zen 5: the reduction's chain is one such
 * shuffle, not two, and a short row's time includes that chain. */
#define ALL_OF_4(OP, v, SHUFFLE) OP(OP(v, SHUFFLE(v, 0xB1)), OP(SHUFFLE(v, 0x4E), SHUFFLE(v, 0x1B)))
#define IN_CHUNKS_(v, imm)       _mm512_permute_ps(v, imm)
#define ACROSS_CHUNKS_(v, imm)   _mm512_shuffle_f32x4(v, v, imm)
static inline __attribute__((always_inline)) vf vf_allmax(vf v) {
    v = ALL_OF_4(_mm512_max_ps, v, IN_CHUNKS_);
    return ALL_OF_4(_mm512_max_ps, v, ACROSS_CHUNKS_);
}
static inline __attribute__((always_inline)) vf vf_allsum(vf v) {
    v = ALL_OF_4(_mm512_add_ps, v, IN_CHUNKS_);
    return ALL_OF_4(_mm512_add_ps, v, ACROSS_CHUNKS_);
}
#undef IN_CHUNKS_
#undef ACROSS_CHUNKS_
#undef ALL_OF_4

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* lanes [0, remaining) set, for remaining <= W */
static inline __mmask16 tail_mask(size_t remaining) { return (__mmask16)((1u << remaining) - 1u); }

/* Floats from p to the next 64-byte boundary (0 when aligned). A 64-byte load or store that
 * straddles two cache lines costs two of the ports' slots, so the long loops take a masked head
 * of this many first: the stream they align (and any other misaligned alike, as buffers from
 * malloc are) then never straddles. */
static inline size_t lead_to_line(const float *p) {
    return (64 - ((uintptr_t)p & 63)) % 64 / sizeof(float);
}

/* sum of the 16 lanes: halves folded in three steps, then the last pair */
static inline float hsum_avx512(__m512 v) {
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
}

static inline float dot_avx512(const float *a, const float *b, size_t n) {
    /* short rows (the head dimensions of attention) first, without the four-way setup */
    if (__builtin_expect(n <= W, 1)) { /* straight through, with no taken branch */
        __mmask16 m = tail_mask(n);
        return hsum_avx512(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, a), _mm512_maskz_loadu_ps(m, b)));
    }
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    size_t i = 0;
    if (n >= 4 * W) {
        /* a to a line boundary, b with it when misaligned alike: no load straddles two lines */
        size_t lead = lead_to_line(a);
        if (lead) {
            __mmask16 m = tail_mask(lead);
            acc1 = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, a), _mm512_maskz_loadu_ps(m, b));
            a += lead, b += lead, n -= lead;
        }
        /* two loads feed each FMA, so two load ports allow one FMA per cycle, which four
           independent chains of 4-cycle FMAs sustain; eight measured slower for n <= 1024 */
        __m512 acc2 = _mm512_setzero_ps(), acc3 = _mm512_setzero_ps();
        for (; i + 4 * W <= n; i += 4 * W) {
            acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
            acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + W), _mm512_loadu_ps(b + i + W), acc1);
            acc2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 2 * W), _mm512_loadu_ps(b + i + 2 * W),
                                   acc2);
            acc3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 3 * W), _mm512_loadu_ps(b + i + 3 * W),
                                   acc3);
        }
        acc0 = _mm512_add_ps(acc0, acc2);
        acc1 = _mm512_add_ps(acc1, acc3);
    }
    for (; i + 2 * W <= n; i += 2 * W) {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + W), _mm512_loadu_ps(b + i + W), acc1);
    }
    if (i < n) {
        /* one or two vectors left, the last one partial */
        if (n - i > W) {
            acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
            i += W;
        }
        __mmask16 m = tail_mask(n - i);
        acc1 =
            _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc1);
    }
    return hsum_avx512(_mm512_add_ps(acc0, acc1));
}

#endif
