/* A first look at sdpa: which backends this CPU has, and each kernel on a small example.
 * Build: cc kernels.c $(pkg-config --cflags --libs sdpa)  (or through meson: examples/kernels) */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "sdpa.h"

int main(void) {
    printf("sdpa %s (ABI %u), exp: %s\n", sdpa_version(), (unsigned)sdpa_abi_version(),
           sdpa_exp_mode());
    printf("backends (best first):");
    for (size_t i = 0; sdpa_backend_name(i); i++) {
        const char *name = sdpa_backend_name(i);
        printf(" %s%s", name,
               strcmp(name, sdpa_backend()) == 0 ? " (active)"
               : sdpa_backend_supported(name)    ? ""
                                                 : " (not on this CPU)");
    }
    printf("\n\n");

    /* dot products grow with the dimension */
    const float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {3, 4, 5, 6, 7, 8};
    for (size_t n = 2; n <= 6; n += 2) {
        float d;
        sdpa_dot_f32(a, b, n, &d);
        printf("dot([1..%zu], [3..%zu]) = %g\n", n, n + 2, d);
    }

    /* softmax saturates on large scores; scaling by 1/sqrt(d_k) (d_k = 4) keeps it soft */
    const float scores[2] = {14, 10};
    float w[2], g[2];
    sdpa_softmax_f32(w, scores, 2, 1.0f);
    printf("softmax([14, 10])          = [%.3f, %.3f]\n", w[0], w[1]);
    sdpa_softmax_f32(w, scores, 2, 1.0f / sqrtf(4.0f));
    printf("softmax([14, 10] / sqrt 4) = [%.3f, %.3f]\n", w[0], w[1]);

    /* and its gradient vanishes when saturated: d sigma_0 / d z_1 = -sigma_0 sigma_1 */
    const float sat[2] = {0.99f, 0.01f}, dy[2] = {0, 1};
    sdpa_softmax_backward_f32(g, sat, dy, 2, 1.0f);
    printf("gradient at sigma = [0.99, 0.01]: %.4f\n", g[1]);

    /* scores of one query against three keys, scaled by 1/sqrt(d) */
    const float q[4] = {1, 0, 1, 0}, k[12] = {1, 0, 1, 0, 0, 1, 0, 1, 1, 1, 1, 1};
    float s[3];
    sdpa_scores_f32(s, q, k, 3, 4, 4, 0.5f);
    printf("scores q.k_j / sqrt(4) = [%g, %g, %g]\n", s[0], s[1], s[2]);

    sdpa_status bad = sdpa_softmax_f32(w, scores, 2, 0.0f);
    printf("softmax with scale 0 -> %s\n", sdpa_status_string(bad));
    return 0;
}
