/* NEON (AArch64 Advanced SIMD) attention microkernels: 4 floats a vector, 32 registers, FMA.
 * Kept apart from arch/arm/neon.c so that both can be written at once; neon.c's table points
 * at sdpa_attention_kernels_neon. The scores are arch/attention_tiles.h's, with NEON's register
 * blocks. Tails are loaded and stored lane by lane (neon_tails.h), so nothing past the end of a
 * row is read or written. */
#include "neon.h"

#define ISA_NAME(f) f##_neon

#include "attention_tiles.h"

/* Scores: 4 x 4 blocks, 8 loads for 16 FMAs (24 of the 32 registers), each row's 4 dots reduced
 * by two pairwise adds; a single query against 8 keys at a time. */
enum { SCORES_MR = 4, SCORES_NR = 4, SCORES_KEYWISE = 0, SCORES_ROW_NR = 8 };

static float dot_neon(const float *a, const float *b, size_t n) {
    float32x4_t s0 = vdupq_n_f32(0.0f), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 4 * W <= n; i += 4 * W) {
        s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
        s1 = vfmaq_f32(s1, vld1q_f32(a + i + W), vld1q_f32(b + i + W));
        s2 = vfmaq_f32(s2, vld1q_f32(a + i + 2 * W), vld1q_f32(b + i + 2 * W));
        s3 = vfmaq_f32(s3, vld1q_f32(a + i + 3 * W), vld1q_f32(b + i + 3 * W));
    }
    for (; i + W <= n; i += W) s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
    if (i < n) s1 = vfmaq_f32(s1, load_partial(a + i, n - i), load_partial(b + i, n - i));
    return vaddvq_f32(vaddq_f32(vaddq_f32(s0, s1), vaddq_f32(s2, s3)));
}
ALWAYS_INLINE float isa_dot(const float *a, const float *b, size_t n) { return dot_neon(a, b, n); }

#include "attention_entries.h"

/* acc[4 rows][16 columns] += p[4 rows][nk] * v[nk][16 columns]: 16 accumulators, 4 loads of v
 * and 4 scalar weights per key for 16 FMAs. */
static void pv_4x16_neon(float *acc, size_t ld_acc, const float *p, size_t ld_p, size_t nk,
                         const float *v, size_t v_stride) {
    float *o0 = acc, *o1 = acc + ld_acc, *o2 = acc + 2 * ld_acc, *o3 = acc + 3 * ld_acc;
    float32x4_t c00 = vld1q_f32(o0), c01 = vld1q_f32(o0 + W), c02 = vld1q_f32(o0 + 2 * W),
                c03 = vld1q_f32(o0 + 3 * W);
    float32x4_t c10 = vld1q_f32(o1), c11 = vld1q_f32(o1 + W), c12 = vld1q_f32(o1 + 2 * W),
                c13 = vld1q_f32(o1 + 3 * W);
    float32x4_t c20 = vld1q_f32(o2), c21 = vld1q_f32(o2 + W), c22 = vld1q_f32(o2 + 2 * W),
                c23 = vld1q_f32(o2 + 3 * W);
    float32x4_t c30 = vld1q_f32(o3), c31 = vld1q_f32(o3 + W), c32 = vld1q_f32(o3 + 2 * W),
                c33 = vld1q_f32(o3 + 3 * W);
    for (size_t j = 0; j < nk; j++) {
        const float *vj = v + j * v_stride;
        float32x4_t v0 = vld1q_f32(vj), v1 = vld1q_f32(vj + W), v2 = vld1q_f32(vj + 2 * W),
                    v3 = vld1q_f32(vj + 3 * W);
        float w = p[j];
        c00 = vfmaq_n_f32(c00, v0, w), c01 = vfmaq_n_f32(c01, v1, w);
        c02 = vfmaq_n_f32(c02, v2, w), c03 = vfmaq_n_f32(c03, v3, w);
        w = p[ld_p + j];
        c10 = vfmaq_n_f32(c10, v0, w), c11 = vfmaq_n_f32(c11, v1, w);
        c12 = vfmaq_n_f32(c12, v2, w), c13 = vfmaq_n_f32(c13, v3, w);
        w = p[2 * ld_p + j];
        c20 = vfmaq_n_f32(c20, v0, w), c21 = vfmaq_n_f32(c21, v1, w);
        c22 = vfmaq_n_f32(c22, v2, w), c23 = vfmaq_n_f32(c23, v3, w);
        w = p[3 * ld_p + j];
        c30 = vfmaq_n_f32(c30, v0, w), c31 = vfmaq_n_f32(c31, v1, w);
        c32 = vfmaq_n_f32(c32, v2, w), c33 = vfmaq_n_f32(c33, v3, w);
    }
    vst1q_f32(o0, c00), vst1q_f32(o0 + W, c01), vst1q_f32(o0 + 2 * W, c02);
    vst1q_f32(o0 + 3 * W, c03);
    vst1q_f32(o1, c10), vst1q_f32(o1 + W, c11), vst1q_f32(o1 + 2 * W, c12);
    vst1q_f32(o1 + 3 * W, c13);
    vst1q_f32(o2, c20), vst1q_f32(o2 + W, c21), vst1q_f32(o2 + 2 * W, c22);
    vst1q_f32(o2 + 3 * W, c23);
    vst1q_f32(o3, c30), vst1q_f32(o3 + W, c31), vst1q_f32(o3 + 2 * W, c32);
    vst1q_f32(o3 + 3 * W, c33);
}

/* One row, 16 columns, two keys per step for eight independent chains. */
static void pv_1x16_neon(float *acc, const float *p, size_t nk, const float *v, size_t v_stride) {
    float32x4_t c0 = vld1q_f32(acc), c1 = vld1q_f32(acc + W), c2 = vld1q_f32(acc + 2 * W),
                c3 = vld1q_f32(acc + 3 * W);
    float32x4_t e0 = vdupq_n_f32(0.0f), e1 = e0, e2 = e0, e3 = e0;
    size_t j = 0;
    for (; j + 2 <= nk; j += 2) {
        const float *v0 = v + j * v_stride, *v1 = v0 + v_stride;
        c0 = vfmaq_n_f32(c0, vld1q_f32(v0), p[j]), c1 = vfmaq_n_f32(c1, vld1q_f32(v0 + W), p[j]);
        c2 = vfmaq_n_f32(c2, vld1q_f32(v0 + 2 * W), p[j]);
        c3 = vfmaq_n_f32(c3, vld1q_f32(v0 + 3 * W), p[j]);
        e0 = vfmaq_n_f32(e0, vld1q_f32(v1), p[j + 1]);
        e1 = vfmaq_n_f32(e1, vld1q_f32(v1 + W), p[j + 1]);
        e2 = vfmaq_n_f32(e2, vld1q_f32(v1 + 2 * W), p[j + 1]);
        e3 = vfmaq_n_f32(e3, vld1q_f32(v1 + 3 * W), p[j + 1]);
    }
    if (j < nk) {
        const float *v0 = v + j * v_stride;
        c0 = vfmaq_n_f32(c0, vld1q_f32(v0), p[j]), c1 = vfmaq_n_f32(c1, vld1q_f32(v0 + W), p[j]);
        c2 = vfmaq_n_f32(c2, vld1q_f32(v0 + 2 * W), p[j]);
        c3 = vfmaq_n_f32(c3, vld1q_f32(v0 + 3 * W), p[j]);
    }
    vst1q_f32(acc, vaddq_f32(c0, e0)), vst1q_f32(acc + W, vaddq_f32(c1, e1));
    vst1q_f32(acc + 2 * W, vaddq_f32(c2, e2)), vst1q_f32(acc + 3 * W, vaddq_f32(c3, e3));
}

/* One row, one vector of len (1..4) columns. */
static void pv_1x4_neon(float *acc, const float *p, size_t nk, const float *v, size_t v_stride,
                        size_t len) {
    if (len == W) {
        float32x4_t c0 = vld1q_f32(acc), c1 = vdupq_n_f32(0.0f);
        size_t j = 0;
        for (; j + 2 <= nk; j += 2) {
            c0 = vfmaq_n_f32(c0, vld1q_f32(v + j * v_stride), p[j]);
            c1 = vfmaq_n_f32(c1, vld1q_f32(v + (j + 1) * v_stride), p[j + 1]);
        }
        if (j < nk) c0 = vfmaq_n_f32(c0, vld1q_f32(v + j * v_stride), p[j]);
        vst1q_f32(acc, vaddq_f32(c0, c1));
        return;
    }
    float32x4_t c0 = load_partial(acc, len);
    for (size_t j = 0; j < nk; j++) c0 = vfmaq_n_f32(c0, load_partial(v + j * v_stride, len), p[j]);
    store_partial(acc, c0, len);
}

static void pv_tile_neon(float *acc, size_t ld_acc, const float *p, size_t ld_p, size_t nq,
                         size_t nk, const float *v, size_t v_stride, size_t d_v) {
    size_t i = 0;
    for (; i + 4 <= nq; i += 4) {
        float *a = acc + i * ld_acc;
        const float *pi = p + i * ld_p;
        size_t c = 0;
        for (; c + 4 * W <= d_v; c += 4 * W)
            pv_4x16_neon(a + c, ld_acc, pi, ld_p, nk, v + c, v_stride);
        for (; c < d_v; c += W) {
            size_t len = d_v - c < W ? d_v - c : W;
            for (size_t r = 0; r < 4; r++)
                pv_1x4_neon(a + r * ld_acc + c, pi + r * ld_p, nk, v + c, v_stride, len);
        }
    }
    for (; i < nq; i++) {
        float *a = acc + i * ld_acc;
        const float *pi = p + i * ld_p;
        size_t c = 0;
        for (; c + 4 * W <= d_v; c += 4 * W) pv_1x16_neon(a + c, pi, nk, v + c, v_stride);
        for (; c < d_v; c += W)
            pv_1x4_neon(a + c, pi, nk, v + c, v_stride, d_v - c < W ? d_v - c : W);
    }
}

const sdpa_attention_kernels sdpa_attention_kernels_neon = {
    .block_q = 32,
    .block_kv = 64,
    .scores_tile = scores_tile_neon,
    .pv_tile = pv_tile_neon,
};
