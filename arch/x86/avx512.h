/* AVX-512F: what every avx512 file shares (the vector width, tails, reductions, the dot). */
#ifndef SDPA_ARCH_X86_AVX512_H
#define SDPA_ARCH_X86_AVX512_H

#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <sleef.h>
#include <stdint.h>

#include "any_address.h"
#include "exp_constants.h"
#include "kernels.h"
#include "shift_guess.h"

#define W 16

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* ---- the vector vocabulary (docs/porting.md) ---- */
/* What the templates (arch/row_kernels.h, arch/softmax_passes.h, arch/attention_tiles.h, ...) are
 * written in, beyond + - * on vf (the compiler's vector operators, the intrinsics' own
 * instructions). Macros over the intrinsics where one does, so that the row templates compile to
 * what the intrinsics written out give: even an always_inline wrapper is inlined at another
 * point, after which gcc picks other registers and another loop layout, and a short call shows
 * it. An `acc` is a variable. vpart names the real lanes of a partial vector: a mask here, a
 * count where an ISA has no masked loads and stores. VF_MASKED: the partial operations also take
 * all W lanes, so that a loop need not tell its last vector apart. */
typedef __m512 vf;
typedef __mmask16 vpart;
#define VF_MASKED              1
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
#define vf_lead(p)             lead_to_line(p)             /* below */
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

/* One vector to and from the 16-bit types (arch/convert_rows.h): F16C's conversions, which
 * AVX-512F has at its width, with the rounding named (to nearest) rather than MXCSR's; bf16 is
 * the upper half of a float, rounded in integers. Some CPUs (and
 * qemu) read f16 subnormals as 0 under DAZ and write them as 0 under FTZ: convert_rows.h then
 * takes its exact integer forms. */
#define vf_widen_f16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define vf_narrow_f16(p, x)                                                                        \
    _mm256_storeu_si256((__m256i *)(p),                                                            \
                        _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))
#define vf_narrow_f16_ok() (!(_mm_getcsr() & 0x8000u)) /* FTZ clear */
#define vf_widen_f16_ok()  (!(_mm_getcsr() & 0x0040u)) /* DAZ clear */
static inline __attribute__((always_inline)) vf vf_widen_bf16(const uint16_t *p) {
    const __m512i b =
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16);
    const __mmask16 nan =
        _mm512_cmp_ps_mask(_mm512_castsi512_ps(b), _mm512_castsi512_ps(b), _CMP_UNORD_Q);
    return _mm512_castsi512_ps(_mm512_mask_or_epi32(b, nan, b, _mm512_set1_epi32(0x00400000)));
}
static inline __attribute__((always_inline)) void vf_narrow_bf16(uint16_t *p, vf x) {
    const __m512i b = _mm512_castps_si512(x), high = _mm512_srli_epi32(b, 16);
    const __m512i odd = _mm512_and_si512(high, _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(b, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    r = _mm512_mask_or_epi32(r, nan, high, _mm512_set1_epi32(0x0040));
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(r));
}

/* 16 fp8 codes at p as f16 bits (arch/convert_fp8.h's steps), in registers: e5m2 in 16-bit
 * lanes (AVX2's, which AVX-512F has); e4m3 in 32-bit lanes, which AVX-512F has at its width
 * (16-bit operations need BW) and in all 32 registers (the VEX-encoded 16-bit ones reach only
 * 16, which a microkernel's accumulators leave short), narrowed by vpmovdw; e4m3's NaN made by
 * a carry (0x3f80 + 0x80 is the one sum that reaches bit 14) and a ternary logic op. */
static inline __attribute__((always_inline)) __m256i vf_fp8_to_f16(const uint8_t *p, int e5m2) {
    if (e5m2)
        return _mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p)), 8);
    const __m512i c = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p));
    const __m512i h = _mm512_and_si512(_mm512_slli_epi32(c, 7), _mm512_set1_epi32(0xbfff));
    const __m512i carry = _mm512_add_epi32(h, _mm512_set1_epi32(0x80));
    return _mm512_cvtepi32_epi16(
        _mm512_ternarylogic_epi32(h, carry, _mm512_set1_epi32(0x4000), 0xf8)); /* a | b & c */
}
#define VF_FP8_LANES 16
static inline __attribute__((always_inline)) void vf_widen_fp8(uint16_t *q, const uint8_t *p,
                                                               int e5m2) {
    _mm256_storeu_si256((__m256i *)q, vf_fp8_to_f16(p, e5m2));
}

/* W fp8 codes at p sign-extended to 16-bit lanes (AVX2's vpmovsxbw; GCC's generic conversion
   splits it in two halves) */
#define vf_fp8_codes(p) _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p)))

/* lanes [0, remaining) set, for remaining <= W */
static inline __mmask16 tail_mask(size_t remaining) { return (__mmask16)((1u << remaining) - 1u); }

/* Floats from p to the next 64-byte boundary (0 when aligned). A 64-byte load or store that
 * straddles two cache lines costs two of the ports' slots, so the element-wise and max loops take
 * a masked head of this many first (row_kernels.h); no sum does, whose order would follow it. */
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
        /* two loads feed each FMA, so two load ports allow one FMA per cycle, which four
           independent chains of 4-cycle FMAs sustain; eight measured slower for n <= 1024. No
           head to reach a line boundary: the order of the sum follows n, never a's address. */
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

/* ---- the vector vocabulary, continued: what the attention templates add ---- */
ALWAYS_INLINE vf vf_zero(void) { return _mm512_setzero_ps(); }
ALWAYS_INLINE vf vf_bcast(const float *p) { return _mm512_set1_ps(load_f32(p)); }
ALWAYS_INLINE vf vf_load_aligned(const float *p) { return _mm512_load_ps(p); } /* 64 bytes */
ALWAYS_INLINE void vf_store_aligned(float *p, vf x) { _mm512_store_ps(p, x); }
ALWAYS_INLINE vf vf_madd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); } /* a b + c */
/* keep x in a register, not folded into its uses as a memory operand: nothing to do here */
ALWAYS_INLINE void vf_pin(vf *x) { (void)x; }
/* the lanes of m, n of vpart_first(n) */
ALWAYS_INLINE size_t vpart_count(vpart m) { return (size_t)__builtin_popcount(m); }
/* vf_load_part with fill in the other lanes */
ALWAYS_INLINE vf vf_load_part_or(const float *p, vpart m, float fill) {
    return _mm512_mask_loadu_ps(_mm512_set1_ps(fill), m, p);
}

/* Two 128-bit-chunked partial sums of four vectors: chunk k of the result holds, in lane i,
 * the sum over chunk k of the lanes of the i-th input. */
ALWAYS_INLINE __m512 hsum4_chunks_avx512(__m512 a, __m512 b, __m512 c, __m512 d) {
    __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    return _mm512_add_ps(_mm512_shuffle_ps(ab, cd, 0x44), _mm512_shuffle_ps(ab, cd, 0xEE));
}

/* lane i: the sum of the lanes of a[i], for i < W. A transpose-and-add tree, 15 adds for 16
 * sums instead of 16 separate reductions. */
ALWAYS_INLINE vf vf_hsums(const vf *a) {
    __m512 x0 = hsum4_chunks_avx512(a[0], a[1], a[2], a[3]);
    __m512 x1 = hsum4_chunks_avx512(a[4], a[5], a[6], a[7]);
    __m512 x2 = hsum4_chunks_avx512(a[8], a[9], a[10], a[11]);
    __m512 x3 = hsum4_chunks_avx512(a[12], a[13], a[14], a[15]);
    __m512 y01 =
        _mm512_add_ps(_mm512_shuffle_f32x4(x0, x1, 0x44), _mm512_shuffle_f32x4(x0, x1, 0xEE));
    __m512 y23 =
        _mm512_add_ps(_mm512_shuffle_f32x4(x2, x3, 0x44), _mm512_shuffle_f32x4(x2, x3, 0xEE));
    return _mm512_add_ps(_mm512_shuffle_f32x4(y01, y23, 0x88),
                         _mm512_shuffle_f32x4(y01, y23, 0xDD));
}

/* lanes [4c, 4c + 4) of x to p (the immediate must be a literal) */
ALWAYS_INLINE void vf_store4(float *p, vf x, int c) {
    _mm_storeu_ps(p, c == 0   ? _mm512_extractf32x4_ps(x, 0)
                     : c == 1 ? _mm512_extractf32x4_ps(x, 1)
                     : c == 2 ? _mm512_extractf32x4_ps(x, 2)
                              : _mm512_extractf32x4_ps(x, 3));
}

/* r[i] lane j <- r[j] lane i for i, j < W: three rounds of unpack and lane shuffles */
ALWAYS_INLINE void vf_transpose(vf *r) {
    __m512 t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    /* u[4g + m], 128-bit chunk c: rows 4g..4g+3 of column 4c + m */
    for (int g = 0; g < 4; g++) {
        __m512d a = _mm512_castps_pd(t[4 * g]), b = _mm512_castps_pd(t[4 * g + 1]);
        __m512d c = _mm512_castps_pd(t[4 * g + 2]), e = _mm512_castps_pd(t[4 * g + 3]);
        u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, e));
        u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, e));
    }
    for (int m = 0; m < 4; m++) {
        __m512 a = _mm512_shuffle_f32x4(u[m], u[4 + m], 0x88);
        __m512 b = _mm512_shuffle_f32x4(u[m], u[4 + m], 0xDD);
        __m512 c = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0x88);
        __m512 e = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0xDD);
        r[m] = _mm512_shuffle_f32x4(a, c, 0x88);
        r[8 + m] = _mm512_shuffle_f32x4(a, c, 0xDD);
        r[4 + m] = _mm512_shuffle_f32x4(b, e, 0x88);
        r[12 + m] = _mm512_shuffle_f32x4(b, e, 0xDD);
    }
}

#endif
