/* Partial vectors for the NEON files (neon.c, neon_attention.c): the first `len` (< 4) floats
 * of an array, loaded and stored lane by lane, so nothing past its end is touched. Element
 * accesses rather than a memcpy through a stack vector: that costs a call and a store-forwarding
 * stall per tail, as much as a short row's work (as on sse41, arch/x86/sse41.h). */
#ifndef SDPA_NEON_TAILS_H
#define SDPA_NEON_TAILS_H

#include <arm_neon.h>
#include <stddef.h>

/* the first len (1 to 3) floats of p, zeros after */
static inline float32x4_t load_partial(const float *p, size_t len) {
    const float32x2_t zero = vdup_n_f32(0.0f);
    if (len == 1) return vcombine_f32(vld1_lane_f32(p, zero, 0), zero);
    return vcombine_f32(vld1_f32(p), len == 3 ? vld1_lane_f32(p + 2, zero, 0) : zero);
}

/* v's first len (1 to 3) lanes to p */
static inline void store_partial(float *p, float32x4_t v, size_t len) {
    if (len == 1) {
        vst1q_lane_f32(p, v, 0);
        return;
    }
    vst1_f32(p, vget_low_f32(v));
    if (len == 3) vst1q_lane_f32(p + 2, v, 2);
}

#endif
