/* The dot of the narrow-vector backends (sse, avx2, neon), written once over their vector
 * vocabulary: eight accumulators, enough independent multiply-add chains for cores with four
 * 4-cycle FMA pipes fed by two loads each; the vectors after the unrolled loop into the first,
 * the partial last one into the second. No head to reach alignment: the order of the sum follows
 * n, never a's address. An ISA header includes this after its vocabulary. */
#ifndef SDPA_ARCH_DOT_LANES_H
#define SDPA_ARCH_DOT_LANES_H

#include <stddef.h>

ALWAYS_INLINE float dot_lanes(const float *a, const float *b, size_t n) {
    vf acc[8];
    _Pragma("GCC unroll 8") for (int u = 0; u < 8; u++) acc[u] = vf_zero();
    size_t i = 0;
    for (; i + 8 * W <= n; i += 8 * W)
        _Pragma("GCC unroll 8") for (int u = 0; u < 8; u++) acc[u] =
            vf_madd(vf_load(a + i + u * W), vf_load(b + i + u * W), acc[u]);
    for (; i + W <= n; i += W) acc[0] = vf_madd(vf_load(a + i), vf_load(b + i), acc[0]);
    if (i < n) {
        const vpart m = vpart_first(n - i);
        acc[1] = vf_madd(vf_load_part(a + i, m), vf_load_part(b + i, m), acc[1]);
    }
    const vf low = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    return vf_hsum(low + ((acc[4] + acc[5]) + (acc[6] + acc[7])));
}

#endif
