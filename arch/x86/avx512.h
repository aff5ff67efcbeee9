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
