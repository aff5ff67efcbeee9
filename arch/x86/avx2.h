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

/* ---- the vector vocabulary (docs/porting.md; avx512.h says why macros) ---- */
typedef __m256 vf;
typedef __m256i vpart;           /* the lanes of a partial vector */
#define VF_MASKED              1 /* through maskload and maskstore, which never touch the lanes outside */
#define vf_load(p)             _mm256_loadu_ps(p)
#define vf_store(p, v)         _mm256_storeu_ps(p, v)
#define vf_set1(a)             _mm256_set1_ps(a)
#define vf_first(v)            _mm256_cvtss_f32(v)
#define vf_max(a, b)           _mm256_max_ps(a, b) /* b where either is NaN */
#define vf_min(a, b)           _mm256_min_ps(a, b)
#define vf_hsum(v)             hsum(v) /* below */
#define vf_hmax(v)             hmax(v)
#define vpart_first(len)       tail_mask(len) /* lanes [0, len), len <= W */
#define vf_load_part(p, m)     _mm256_maskload_ps(p, m)
#define vf_store_part(p, m, v) _mm256_maskstore_ps(p, m, v)
#define vf_max_part(acc, m, z)                                                                     \
    _mm256_max_ps(_mm256_blendv_ps(_mm256_set1_ps(-INFINITY), z, _mm256_castsi256_ps(m)), acc)
#define vf_add_part(acc, m, e) _mm256_add_ps(acc, _mm256_and_ps(e, _mm256_castsi256_ps(m)))
#define vf_lead(p)             ((void)(p), (size_t)0)      /* no line-aligned loops */
#define rounds_to_nearest()    (!(_mm_getcsr() & 0x6000u)) /* MXCSR's RC */
/* lane-wise max and sum of all 8 lanes, in every lane, without a trip through a scalar register */
static inline __attribute__((always_inline)) vf vf_allmax(vf v) {
    v = _mm256_max_ps(v, _mm256_permute2f128_ps(v, v, 1));
    v = _mm256_max_ps(v, _mm256_permute_ps(v, 0x4E));
    return _mm256_max_ps(v, _mm256_permute_ps(v, 0xB1));
}
static inline __attribute__((always_inline)) vf vf_allsum(vf v) {
    v = _mm256_add_ps(v, _mm256_permute2f128_ps(v, v, 1));
    v = _mm256_add_ps(v, _mm256_permute_ps(v, 0x4E));
    return _mm256_add_ps(v, _mm256_permute_ps(v, 0xB1));
}

/* One vector to and from the 16-bit types (arch/convert_rows.h): F16C's conversions (the avx2
 * backend requires F16C), with the rounding named (to nearest) rather than MXCSR's; bf16 is the
 * upper half of a float, rounded in integers. Some CPUs (and
 * qemu) read f16 subnormals as 0 under DAZ and write them as 0 under FTZ: convert_rows.h then
 * takes its exact integer forms. */
#define vf_widen_f16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define vf_narrow_f16(p, x)                                                                        \
    _mm_storeu_si128((__m128i *)(p), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT))
#define vf_narrow_f16_ok() (!(_mm_getcsr() & 0x8000u)) /* FTZ clear */
#define vf_widen_f16_ok()  (!(_mm_getcsr() & 0x0040u)) /* DAZ clear */
static inline __attribute__((always_inline)) vf vf_widen_bf16(const uint16_t *p) {
    const __m256 x = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
    const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    return _mm256_or_ps(x, _mm256_and_ps(nan, _mm256_castsi256_ps(_mm256_set1_epi32(0x00400000))));
}
static inline __attribute__((always_inline)) void vf_narrow_bf16(uint16_t *p, vf x) {
    const __m256i b = _mm256_castps_si256(x), high = _mm256_srli_epi32(b, 16);
    const __m256i odd = _mm256_and_si256(high, _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(b, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    const __m256i q = _mm256_blendv_epi8(r, _mm256_or_si256(high, _mm256_set1_epi32(0x0040)), nan);
    _mm_storeu_si128((__m128i *)p,
                     _mm_packus_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)));
}

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

/* ---- the vector vocabulary, continued: what the attention templates add ---- */
ALWAYS_INLINE vf vf_zero(void) { return _mm256_setzero_ps(); }
ALWAYS_INLINE vf vf_bcast(const float *p) { return _mm256_broadcast_ss(p); }
ALWAYS_INLINE vf vf_load_aligned(const float *p) { return _mm256_load_ps(p); } /* 32 bytes */
ALWAYS_INLINE void vf_store_aligned(float *p, vf x) { _mm256_store_ps(p, x); }
ALWAYS_INLINE vf vf_madd(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
/* An empty asm that takes x in a register: folded into its uses as a memory operand (what GCC
 * does otherwise), a vector loaded for several FMAs is loaded again for each, and with two
 * loads a cycle the loop becomes load-bound. */
ALWAYS_INLINE void vf_pin(vf *x) { __asm__("" : "+x"(*x)); }

ALWAYS_INLINE size_t vpart_count(vpart m) {
    return (size_t)__builtin_popcount(_mm256_movemask_ps(_mm256_castsi256_ps(m)));
}
ALWAYS_INLINE vf vf_load_part_or(const float *p, vpart m, float fill) {
    return _mm256_blendv_ps(_mm256_set1_ps(fill), _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
}

/* lane i: the sum of the lanes of a[i], for i < W (hadd twice: each 128-bit half holds the
 * half-sums of four inputs) */
ALWAYS_INLINE vf vf_hsums(const vf *a) {
    __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20),
                         _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* lanes [4c, 4c + 4) of x to p */
ALWAYS_INLINE void vf_store4(float *p, vf x, int c) {
    _mm_storeu_ps(p, c == 0 ? _mm256_castps256_ps128(x) : _mm256_extractf128_ps(x, 1));
}

/* r[i] lane j <- r[j] lane i for i, j < W: unpack, shuffle, then swap 128-bit halves */
ALWAYS_INLINE void vf_transpose(vf *r) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20), r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    r[1] = _mm256_permute2f128_ps(u1, u5, 0x20), r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20), r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    r[3] = _mm256_permute2f128_ps(u3, u7, 0x20), r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

#include "dot_lanes.h"
static inline float dot_avx2(const float *a, const float *b, size_t n) {
    return dot_lanes(a, b, n);
}

#endif
