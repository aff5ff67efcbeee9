/* SSE4.1: what every sse41 file shares (the vector width, tails, reductions, the dot). */
#ifndef SDPA_ARCH_X86_SSE41_H
#define SDPA_ARCH_X86_SSE41_H

#include <float.h>
#include <math.h>
#include <sleef.h>
#include <smmintrin.h>

#include "any_address.h"
#include "convert_portable.h"
#include "exp_constants.h"
#include "kernels.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))

#define W 4

/* ---- the vector vocabulary (docs/porting.md; avx512.h says why macros) ---- */
typedef __m128 vf;
typedef size_t vpart;              /* the length of a partial vector, < W */
#define VF_MASKED                0 /* no masked loads: element by element (load_partial) */
#define vf_load(p)               _mm_loadu_ps(p)
#define vf_store(p, v)           _mm_storeu_ps(p, v)
#define vf_set1(a)               _mm_set1_ps(a)
#define vf_first(v)              _mm_cvtss_f32(v)
#define vf_max(a, b)             _mm_max_ps(a, b) /* b where either is NaN */
#define vf_min(a, b)             _mm_min_ps(a, b)
#define vf_hsum(v)               hsum(v) /* below */
#define vpart_first(len)         (len)   /* the first len floats, len < W, element by element: */
#define vf_load_part(p, len)     load_partial(p, len, 0.0f) /* below */
#define vf_store_part(p, len, v) store_partial(p, v, len)
#define vf_lead(p)               ((void)(p), (size_t)0)      /* no line-aligned loops */
#define rounds_to_nearest()      (!(_mm_getcsr() & 0x6000u)) /* MXCSR's RC */
static inline float vf_hmax(vf m) {
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}
static inline vf vpart_lanes(size_t len) {
    return _mm_castsi128_ps(_mm_cmpgt_epi32(_mm_set1_epi32((int)len), _mm_setr_epi32(0, 1, 2, 3)));
}
static inline vf vf_max_part(vf acc, vpart len, vf z) {
    return _mm_max_ps(_mm_blendv_ps(_mm_set1_ps(-INFINITY), z, vpart_lanes(len)), acc);
}
static inline vf vf_add_part(vf acc, vpart len, vf e) {
    return _mm_add_ps(acc, _mm_and_ps(e, vpart_lanes(len)));
}

/* the first `len` (< W) floats of p in a vector, the rest `fill`; element loads, not a memcpy
 * through the stack: a libc call and a 16-byte load of bytes just stored in pieces (not
 * forwarded) would cost a short row more than its work */
static inline __m128 load_partial(const f32_any *p, size_t len, float fill) {
    return _mm_setr_ps(p[0], len > 1 ? p[1] : fill, len > 2 ? p[2] : fill, fill);
}

static inline void store_partial(f32_any *p, __m128 v, size_t len) {
    if (len >= 2) {
        _mm_storel_pi((__m64 *)p, v);
        if (len == 3) store_f32(p + 2, _mm_cvtss_f32(_mm_movehl_ps(v, v)));
    } else {
        store_f32(p, _mm_cvtss_f32(v));
    }
}

static inline float hsum(__m128 s) {
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* One vector to and from the 16-bit types (arch/convert_rows.h), in integer operations: SSE4.1
 * has no f16 conversion. f16's widening is convert_rows.h's exact integer form; its narrowing,
 * rarer (the outputs of attention, and sdpa_convert), convert_portable.h's a lane at a time. */
static inline __m128i load4_u16(const uint16_t *p) {
    return _mm_cvtepu16_epi32(_mm_loadl_epi64((const __m128i *)p));
}
#define vf_widen_f16(p)   widen_f16_exact(p)
#define vf_widen_f16_ok() 1
static inline void vf_narrow_f16(uint16_t *p, __m128 x) {
    float v[4];
    _mm_storeu_ps(v, x);
    for (int i = 0; i < 4; i++) ((u16_any *)p)[i] = f32_to_f16(v[i]);
}
#define vf_narrow_f16_ok() 1
static inline __m128 vf_widen_bf16(const uint16_t *p) {
    const __m128 x = _mm_castsi128_ps(_mm_slli_epi32(load4_u16(p), 16));
    const __m128 nan = _mm_cmpunord_ps(x, x);
    return _mm_or_ps(x, _mm_and_ps(nan, _mm_castsi128_ps(_mm_set1_epi32(0x00400000))));
}
static inline void vf_narrow_bf16(uint16_t *p, __m128 x) {
    const __m128i b = _mm_castps_si128(x), high = _mm_srli_epi32(b, 16);
    const __m128i odd = _mm_and_si128(high, _mm_set1_epi32(1));
    const __m128i r =
        _mm_srli_epi32(_mm_add_epi32(b, _mm_add_epi32(odd, _mm_set1_epi32(0x7fff))), 16);
    const __m128i nan = _mm_castps_si128(_mm_cmpunord_ps(x, x));
    const __m128i q = _mm_blendv_epi8(r, _mm_or_si128(high, _mm_set1_epi32(0x0040)), nan);
    _mm_storel_epi64((__m128i *)p, _mm_packus_epi32(q, q));
}

/* ---- the vector vocabulary, continued: what the attention templates add ---- */
ALWAYS_INLINE vf vf_zero(void) { return _mm_setzero_ps(); }
ALWAYS_INLINE vf vf_bcast(const float *p) { return _mm_set1_ps(load_f32(p)); }
ALWAYS_INLINE vf vf_load_aligned(const float *p) { return _mm_load_ps(p); } /* 16 bytes */
ALWAYS_INLINE void vf_store_aligned(float *p, vf x) { _mm_store_ps(p, x); }
ALWAYS_INLINE vf vf_madd(vf a, vf b, vf c) { return _mm_add_ps(c, _mm_mul_ps(a, b)); }
ALWAYS_INLINE void vf_pin(vf *x) { (void)x; }
ALWAYS_INLINE vf vf_load_part_or(const float *p, vpart n, float fill) {
    return load_partial(p, n, fill);
}

/* lane i: the sum of the lanes of a[i], for i < W */
ALWAYS_INLINE vf vf_hsums(const vf *a) {
    return _mm_hadd_ps(_mm_hadd_ps(a[0], a[1]), _mm_hadd_ps(a[2], a[3]));
}
ALWAYS_INLINE void vf_store4(float *p, vf x, int c) {
    (void)c;
    _mm_storeu_ps(p, x);
}
ALWAYS_INLINE void vf_transpose(vf *r) { _MM_TRANSPOSE4_PS(r[0], r[1], r[2], r[3]); }

#include "dot_lanes.h"
static inline float dot_sse41(const float *a, const float *b, size_t n) {
    return dot_lanes(a, b, n);
}

#endif
