/* Portable C: what the scalar files share (the width-1 vector vocabulary, the exps, the dot).
 * A "vector" is one float, so the templates compile to plain C for any CPU; the compiler may
 * still vectorise the loops over their independent elements, which changes no result. */
#ifndef SDPA_ARCH_SCALAR_SCALAR_H
#define SDPA_ARCH_SCALAR_SCALAR_H

#include <fenv.h>
#include <float.h>
#include <math.h>
#include <sleef.h>
#include <stddef.h>
#include <stdint.h>

#include "any_address.h"
#include "convert_portable.h"
#include "exp_constants.h"
#include "kernels.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))

#define W 1

/* ---- the vector vocabulary (docs/porting.md), one lane: a partial vector is never reached,
 * since 1 <= n <= W makes every vector whole ---- */
typedef float vf;
typedef size_t vpart;
#define VF_MASKED 0
ALWAYS_INLINE vf vf_load(const f32_any *p) { return *p; }
ALWAYS_INLINE void vf_store(f32_any *p, vf v) { *p = v; }
ALWAYS_INLINE vf vf_load_part(const f32_any *p, vpart n) { return (void)n, *p; }
ALWAYS_INLINE void vf_store_part(f32_any *p, vpart n, vf v) { (void)n, *p = v; }
ALWAYS_INLINE vpart vpart_first(size_t n) { return n; }
ALWAYS_INLINE vf vf_zero(void) { return 0.0f; }
ALWAYS_INLINE vf vf_set1(float x) { return x; }
ALWAYS_INLINE vf vf_bcast(const f32_any *p) { return *p; }
/* no FMA: the product rounded, then the sum (-ffp-contract=off keeps them apart) */
ALWAYS_INLINE vf vf_madd(vf a, vf b, vf c) { return a * b + c; }
ALWAYS_INLINE void vf_pin(vf *x) { (void)x; }
/* lane i of the sums of a[i], i < W: a[0] itself */
ALWAYS_INLINE vf vf_hsums(const vf *a) { return a[0]; }
/* lanes [4c, 4c + 4) of a vector: none at W = 1 (scores_store never asks) */
ALWAYS_INLINE void vf_store4(float *p, vf v, int c) { (void)p, (void)v, (void)c; }
ALWAYS_INLINE int rounds_to_nearest(void) { return fegetround() == FE_TONEAREST; }
ALWAYS_INLINE vf vf_first(vf v) { return v; }
/* b where either is NaN, as x86's: a max skips NaN z as scalar's always did */
ALWAYS_INLINE vf vf_max(vf a, vf b) { return a > b ? a : b; }
ALWAYS_INLINE vf vf_min(vf a, vf b) { return a < b ? a : b; }
ALWAYS_INLINE float vf_hsum(vf v) { return v; }
ALWAYS_INLINE float vf_hmax(vf v) { return v; }
ALWAYS_INLINE vf vf_max_part(vf acc, vpart n, vf z) { return (void)n, vf_max(z, acc); }
ALWAYS_INLINE vf vf_add_part(vf acc, vpart n, vf e) { return (void)n, acc + e; }
ALWAYS_INLINE size_t vf_lead(const float *p) { return (void)p, 0; } /* no line-aligned loops */

/* one value to and from the 16-bit types: convert_portable.h's, exact in any floating-point
 * environment, so the "ok" tests always pass */
ALWAYS_INLINE vf vf_widen_f16(const u16_any *p) { return f16_to_f32(*p); }
ALWAYS_INLINE vf vf_widen_bf16(const u16_any *p) { return bf16_to_f32(*p); }
ALWAYS_INLINE void vf_narrow_f16(u16_any *p, vf x) { *p = f32_to_f16(x); }
ALWAYS_INLINE void vf_narrow_bf16(u16_any *p, vf x) { *p = f32_to_bf16(x); }
ALWAYS_INLINE int vf_widen_f16_ok(void) { return 1; }
ALWAYS_INLINE int vf_narrow_f16_ok(void) { return 1; }
#define vf_of_lanes(x) f32_from_bits((x)[0])

/* ---- the exps ---- */

/* The shared "fast" exp (see exp_constants.h). */
ALWAYS_INLINE float exp_fast_scalar(float x) {
    if (x >= SDPA_EXP_X_OVERFLOW) return INFINITY;
    if (!(x >= SDPA_EXP_X_CLAMP_LO)) return x != x ? x : 0.0f; /* NaN stays, -inf and tiny go */
    /* Round half away from zero by truncation, which ignores the caller's rounding mode
       (nearbyintf follows it: under FE_UPWARD r = x - n ln 2 left [-ln2/2, ln2/2], where the
       polynomial is fitted, and softmax was 5.3e-5 off: tests/test_fpenv.c). |t| < 128 here. */
    float t = x * SDPA_EXP_LOG2E;
    float n = (float)(int32_t)(t + (t < 0.0f ? -0.5f : 0.5f));
    float r = (x - n * SDPA_EXP_LN2_HI_NOFMA) - n * SDPA_EXP_LN2_LO_NOFMA;
    float p = SDPA_EXP_C5;
    p = p * r + SDPA_EXP_C4;
    p = p * r + SDPA_EXP_C3;
    p = p * r + SDPA_EXP_C2;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    float e = f32_from_bits(f32_bits(p) + (uint32_t)((int32_t)n * (1 << 23)));
    return e < FLT_MIN ? 0.0f : e;
}

ALWAYS_INLINE float exp_sleef_scalar(float x) {
    float e = Sleef_expf_u10(x);
    return e < FLT_MIN ? 0.0f : e;
}

ALWAYS_INLINE float exp_of_kind(float x, int kind) {
    return kind == SDPA_EXP_FAST ? exp_fast_scalar(x) : exp_sleef_scalar(x);
}

/* the row exps (arch/row_kernels.h's; exp_keymajor takes them at a zero shift): four a step,
 * each into a lane sum of its own, element i into sum i mod 4, the tails too (ROW_TAIL_SUM) */
#include "row_exp_plain.h"
#define ROW_EXPS         4
#define ROW_SUMS         4
#define ROW_TAIL_SUM(i)  ((i) % ROW_SUMS)
#define ROW_SUM_BLOCK    512 /* 128 weights a lane sum */
#define ROW_AUTO_VECTORS     /* scale_row a plain loop (row_kernels.h) */
ALWAYS_INLINE int row_sums_after(int kind) { return (void)kind, 0; }
ALWAYS_INLINE void row_exps(vf *z, int count, const row_exp *c, int kind) {
    (void)c;
    for (int u = 0; u < count; u++) z[u] = exp_of_kind(z[u], kind);
}
ALWAYS_INLINE vf exp_whole(vf x, const row_exp *c, int kind) {
    return (void)c, exp_of_kind(x, kind);
}
/* e * factor, 0 below FLT_MIN */
ALWAYS_INLINE vf row_weight(vf e, vf factor, vf keep_from, int from_e) {
    (void)keep_from, (void)from_e;
    const float w = e * factor;
    return w < FLT_MIN ? 0.0f : w;
}

/* ---- the dot ---- */

#define LANES 4

/* Lanes within blocks of DOT_BLOCK, block sums added into a running total: a product meets at
 * most DOT_BLOCK / LANES + n / DOT_BLOCK + 2 roundings rather than n / LANES, which keeps the
 * documented 1e-5 relative bound at n = 4096 even when every rounding errs the same way (a row
 * of equal values did 1.5e-5 with plain lanes: tests/test_regressions.c). */
#define DOT_BLOCK 256

ALWAYS_INLINE float dot_scalar(const f32_any *a, const f32_any *b, size_t n) {
    float total = 0.0f;
    for (size_t start = 0; start < n; start += DOT_BLOCK) {
        size_t end = n - start < DOT_BLOCK ? n : start + DOT_BLOCK;
        float acc[LANES] = {0};
        size_t i = start;
        for (; i + LANES <= end; i += LANES)
            for (int l = 0; l < LANES; l++) acc[l] += a[i + l] * b[i + l];
        for (; i < end; i++) acc[0] += a[i] * b[i];
        total += (acc[0] + acc[1]) + (acc[2] + acc[3]);
    }
    return total;
}

#endif
