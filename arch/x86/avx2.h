/* AVX2 + FMA: what every avx2 file shares (the vector width, tails, reductions, the dot). */
#ifndef SDPA_ARCH_X86_AVX2_H
#define SDPA_ARCH_X86_AVX2_H

#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <sleef.h>
#include <stdint.h>

#include "exp_constants.h"
#include "kernels.h"
#include "shift_guess.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))

#define W 8

/* lanes [0, remaining) set, for remaining <= W (W sets them all) */
static inline __m256i tail_mask(size_t remaining) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)remaining),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float hmax(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float dot_avx2(const float *a, const float *b, size_t n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps(),
           acc3 = _mm256_setzero_ps(), acc4 = _mm256_setzero_ps(), acc5 = _mm256_setzero_ps(),
           acc6 = _mm256_setzero_ps(), acc7 = _mm256_setzero_ps();
    size_t i = 0;
    if (n >= 8 * W) {
        /* A load that straddles two cache lines costs two of the load ports' slots: a masked
           head brings a to a 32-byte boundary (no 32-byte load then crosses a line), and b with
           it when they are misaligned alike (buffers from malloc, in place). */
        size_t lead = (32 - ((uintptr_t)a & 31)) % 32 / sizeof(float);
        if (lead) {
            __m256i m = tail_mask(lead);
            acc1 = _mm256_mul_ps(_mm256_maskload_ps(a, m), _mm256_maskload_ps(b, m));
            a += lead, b += lead, n -= lead;
        }
    }
    for (; i + 8 * W <= n; i += 8 * W) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + W), _mm256_loadu_ps(b + i + W), acc1);
        acc2 =
            _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 2 * W), _mm256_loadu_ps(b + i + 2 * W), acc2);
        acc3 =
            _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 3 * W), _mm256_loadu_ps(b + i + 3 * W), acc3);
        acc4 =
            _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 4 * W), _mm256_loadu_ps(b + i + 4 * W), acc4);
        acc5 =
            _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 5 * W), _mm256_loadu_ps(b + i + 5 * W), acc5);
        acc6 =
            _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 6 * W), _mm256_loadu_ps(b + i + 6 * W), acc6);
        acc7 =
            _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 7 * W), _mm256_loadu_ps(b + i + 7 * W), acc7);
    }
    for (; i + W <= n; i += W)
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    if (i < n) {
        __m256i m = tail_mask(n - i);
        acc1 = _mm256_fmadd_ps(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m), acc1);
    }
    acc0 = _mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3));
    acc4 = _mm256_add_ps(_mm256_add_ps(acc4, acc5), _mm256_add_ps(acc6, acc7));
    return hsum(_mm256_add_ps(acc0, acc4));
}

#endif
