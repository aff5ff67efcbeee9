/* AArch64 Advanced SIMD (NEON) backend: 4 floats a vector, fused multiply-add. Advanced SIMD
 * is part of the AArch64 baseline, so this file needs no extra compiler flags. Tails are
 * loaded and stored lane by lane (neon_tails.h), so no load or store ever reaches past the end
 * of an array. The row kernels are arch/row_kernels.h, over the operations below. */
#include <arm_neon.h>
#include <float.h>
#include <math.h>
#include <sleef.h>
#include <stdint.h>

#include "exp_constants.h"
#include "neon.h"

/* all ones in lanes [0, len), zero in the others */
static inline uint32x4_t lanes_below(size_t len) {
    const uint32x4_t index = {0, 1, 2, 3};
    return vcltq_u32(index, vdupq_n_u32((uint32_t)len));
}

static inline float32x4_t zero_where_not(uint32x4_t keep, float32x4_t v) {
    return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(v), keep));
}

/* ---- vector operations for the row templates ---- */
/* What arch/row_kernels.h asks of an ISA, beyond + - * on its vector type (the compiler's
 * vector operators, the intrinsics' own instructions); macros over the intrinsics where one
 * does, as on x86 (arch/x86/avx512.h). An `acc` is a variable. */
typedef float32x4_t vf;
typedef size_t vpart; /* the length of a row's last, partial vector */
#define vf_load(p)               vld1q_f32(p)
#define vf_store(p, v)           vst1q_f32(p, v)
#define vf_set1(a)               vdupq_n_f32(a)
#define vf_first(v)              vgetq_lane_f32(v, 0)
#define vf_max(a, b)             vmaxq_f32(a, b) /* NaN where either is */
#define vf_min(a, b)             vminq_f32(a, b)
#define vf_hsum(v)               vaddvq_f32(v)
#define vf_hmax(v)               vmaxvq_f32(v)
#define vpart_first(len)         (len) /* the first len floats, len < W, lane by lane */
#define vf_load_part(p, len)     load_partial(p, len)
#define vf_store_part(p, len, v) store_partial(p, v, len)
#define vf_max_part(acc, len, z)                                                                   \
    vmaxq_f32(acc, vbslq_f32(lanes_below(len), z, vdupq_n_f32(-INFINITY)))
#define vf_add_part(acc, len, e) vaddq_f32(acc, zero_where_not(lanes_below(len), e))
#define vf_lead(p)               ((void)(p), (size_t)0) /* no line-aligned loops */
static inline int rounds_to_nearest(void) {
    uint64_t fpcr;
    __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
    return !(fpcr & (3u << 22)); /* RMode */
}

/* One vector to and from the 16-bit types (arch/convert_rows.h): ARMv8.0's f16 conversions
 * (FCVTL, FCVTN), the narrowing only where it rounds as convert_portable.h does: under
 * round-to-nearest (it follows FPCR's mode) and with FPCR.FZ16 clear (with it, cores that have
 * it flush f16 subnormal results); bf16 is the upper half of a float, rounded in integers. */
static inline int narrow_f16_in_vectors(void) {
    uint64_t fpcr;
    __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
    return !(fpcr & (3u << 22 | 1u << 19)); /* RMode, FZ16 */
}
#define vf_widen_f16(p)     vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)))
#define vf_narrow_f16(p, x) vst1_u16(p, vreinterpret_u16_f16(vcvt_f16_f32(x)))
#define vf_narrow_f16_ok()  narrow_f16_in_vectors()
#define vf_widen_f16_ok()   narrow_f16_in_vectors() /* FZ16 would flush its inputs too */
static inline float32x4_t vf_widen_bf16(const uint16_t *p) {
    const uint32x4_t b = vshll_n_u16(vld1_u16(p), 16);
    const uint32x4_t nan = vmvnq_u32(vceqq_f32(vreinterpretq_f32_u32(b), vreinterpretq_f32_u32(b)));
    return vreinterpretq_f32_u32(vorrq_u32(b, vandq_u32(nan, vdupq_n_u32(0x00400000))));
}
static inline void vf_narrow_bf16(uint16_t *p, float32x4_t x) {
    const uint32x4_t b = vreinterpretq_u32_f32(x), high = vshrq_n_u32(b, 16);
    const uint32x4_t odd = vandq_u32(high, vdupq_n_u32(1));
    const uint32x4_t r = vshrq_n_u32(vaddq_u32(b, vaddq_u32(odd, vdupq_n_u32(0x7fff))), 16);
    const uint32x4_t nan = vmvnq_u32(vceqq_f32(x, x));
    vst1_u16(p, vmovn_u32(vbslq_u32(nan, vorrq_u32(high, vdupq_n_u32(0x0040)), r)));
}

SDPA_DOT_TO(dot_neon)

/* weights below FLT_MIN become exactly 0 (NaN stays: the ordered compare is false for it) */
static inline float32x4_t flush_below_min(float32x4_t w) {
    uint32x4_t tiny = vcltq_f32(w, vdupq_n_f32(FLT_MIN));
    return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(w), tiny));
}

/* The shared "fast" exp (kernels.h): 2^n goes into p's exponent bits. */
static inline float32x4_t exp_fast_neon(float32x4_t x) {
    /* FMAX/FMIN return NaN when either operand is NaN: NaN passes through the clamp */
    x = vminq_f32(vmaxq_f32(x, vdupq_n_f32(SDPA_EXP_X_CLAMP_LO)), vdupq_n_f32(SDPA_EXP_X_CLAMP_HI));
    /* FCVTNS: round to nearest, ties to even, straight to an integer */
    int32x4_t ni = vcvtnq_s32_f32(vmulq_n_f32(x, SDPA_EXP_LOG2E));
    float32x4_t n = vcvtq_f32_s32(ni);
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(SDPA_EXP_LN2_HI));
    r = vfmsq_f32(r, n, vdupq_n_f32(SDPA_EXP_LN2_LO));
    float32x4_t p = vfmaq_f32(vdupq_n_f32(SDPA_EXP_C4), vdupq_n_f32(SDPA_EXP_C5), r);
    p = vfmaq_f32(vdupq_n_f32(SDPA_EXP_C3), p, r);
    p = vfmaq_f32(vdupq_n_f32(SDPA_EXP_C2), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    /* a NaN x gave ni = 0 and p = NaN, so e stays NaN */
    float32x4_t e = vreinterpretq_f32_s32(vaddq_s32(vreinterpretq_s32_f32(p), vshlq_n_s32(ni, 23)));
    e = flush_below_min(e);
    return vbslq_f32(vcgeq_f32(x, vdupq_n_f32(SDPA_EXP_X_OVERFLOW)), vdupq_n_f32(INFINITY), e);
}

static inline float32x4_t exp_sleef_neon(float32x4_t x) {
    return flush_below_min(Sleef_expf4_u10advsimd(x));
}

/* ---- the row exps and weights of the templates ---- */
/* exp_sum runs the whole-range exps, two side by side */
#include "row_exp_plain.h"
#define ROW_EXPS 2
#define ROW_SUMS 2
ALWAYS_INLINE int row_sums_after(int kind) { return (void)kind, 0; }
ALWAYS_INLINE float32x4_t exp_whole(float32x4_t x, const row_exp *c, int kind) {
    (void)c;
    return kind == SDPA_EXP_FAST ? exp_fast_neon(x) : exp_sleef_neon(x);
}
ALWAYS_INLINE void row_exps(float32x4_t *z, int count, const row_exp *c, int kind) {
    for (int u = 0; u < count; u++) z[u] = exp_whole(z[u], c, kind);
}
ALWAYS_INLINE float32x4_t row_weight(float32x4_t e, float32x4_t factor, float32x4_t keep_from,
                                     int from_e) {
    (void)keep_from, (void)from_e;
    return flush_below_min(vmulq_f32(e, factor));
}

#include "row_kernels.h"

const sdpa_kernels sdpa_kernels_neon = {
    ROW_KERNELS(dot_neon),
    .attention = &sdpa_attention_kernels_neon,
};
