/* sdpa demo: why attention divides its scores by sqrt(d_k), in six sections, each computed
 * by the library's kernels. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

rng rng_seed(uint64_t seed) {
    rng r = {seed * 0x9E3779B97F4A7C15ULL ^ 0xD1B54A32D192ED03ULL};
    if (!r.s) r.s = 1;
    return r;
}

static double uniform01(rng *r) {
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return (double)((r->s * 0x2545F4914F6CDD1DULL) >> 11) * 0x1p-53;
}

void fill(rng *r, float *x, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * (float)uniform01(r);
}

static void mean_var(const double *x, size_t n, double *mean, double *var) {
    double m = 0, v = 0;
    for (size_t i = 0; i < n; i++) m += x[i];
    m /= (double)n;
    for (size_t i = 0; i < n; i++) v += (x[i] - m) * (x[i] - m);
    *mean = m;
    *var = v / (double)(n - 1);
}

static void print_vector(const float *x, size_t n, int digits) {
    printf("[");
    for (size_t i = 0; i < n; i++) printf("%s%.*f", i ? ", " : "", digits, x[i]);
    printf("]");
}

static void heading(const char *title) {
    printf("\n%s\n", title);
    for (const char *c = title; *c; c++) putchar('=');
    printf("\n\n");
}

enum { PAIRS = 1000, BINS = 15 };

/* Var(x*y) for independent x, y uniform on [0, 1): E[x^2] E[y^2] - (E[x] E[y])^2. */
static const double VAR_XY = 1.0 / 9.0 - 1.0 / 16.0; /* 7/144 */

typedef struct histogram {
    double lo, width;
    int count[MAX_DIMS][BINS];
} histogram;

static void histogram_fill(histogram *h, size_t col, const double *x, size_t n) {
    for (size_t i = 0; i < n; i++) {
        long b = (long)floor((x[i] - h->lo) / h->width);
        b = b < 0 ? 0 : b >= BINS ? BINS - 1 : b; /* the end bins also hold what lies beyond */
        h->count[col][b]++;
    }
}

/* Bins down, one column per dimension; each column's bars are scaled to its tallest bin, so
 * the columns compare by width of spread, not by height. */
static void histogram_print(const histogram *h, const size_t *dims, size_t n_dims) {
    int top[MAX_DIMS];
    for (size_t c = 0; c < n_dims; c++) {
        top[c] = 1;
        for (int b = 0; b < BINS; b++)
            if (h->count[c][b] > top[c]) top[c] = h->count[c][b];
    }
    enum { BAR = 14 };
    printf("  %17s", "bin");
    for (size_t c = 0; c < n_dims; c++) printf("  d = %-*zu", BAR - 4, dims[c]);
    printf("\n");
    for (int b = 0; b < BINS; b++) {
        printf("  [%7.2f,%7.2f)", h->lo + b * h->width, h->lo + (b + 1) * h->width);
        for (size_t c = 0; c < n_dims; c++) {
            int len = (int)lround((double)h->count[c][b] * BAR / top[c]);
            if (len == 0 && h->count[c][b] > 0) len = 1;
            printf("  %.*s%*s", len, "##############", BAR - len, "");
        }
        printf("\n");
    }
}

int find_on_path(const char *program) {
    const char *path = getenv("PATH");
    if (!path) return 0;
    char buf[PATH_MAX];
    for (const char *p = path; *p;) {
        size_t len = strcspn(p, ":");
        snprintf(buf, sizeof buf, "%.*s/%s", (int)len, p, program);
        if (len && access(buf, X_OK) == 0) return 1;
        p += len;
        if (*p == ':') p++;
    }
    return 0;
}

/* Writes the two histograms as a PNG with gnuplot; 0 on success. */
static int plot(const char *file, const histogram *raw, const histogram *scaled, const size_t *dims,
                size_t n_dims) {
    char data[] = "/tmp/sdpa-plot-XXXXXX";
    int fd = mkstemp(data);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        fprintf(stderr, "sdpa demo: cannot write a temporary file: %s\n", strerror(errno));
        return 1;
    }
    const histogram *hs[2] = {raw, scaled};
    for (int k = 0; k < 2; k++) {
        for (int b = 0; b < BINS; b++) {
            fprintf(f, "%g", hs[k]->lo + (b + 0.5) * hs[k]->width);
            for (size_t c = 0; c < n_dims; c++) fprintf(f, " %d", hs[k]->count[c][b]);
            fprintf(f, "\n");
        }
        fprintf(f, "\n\n");
    }
    fclose(f);
    FILE *g = popen("gnuplot", "w");
    if (!g) {
        remove(data);
        fprintf(stderr, "sdpa demo: cannot run gnuplot: %s\n", strerror(errno));
        return 1;
    }
    fprintf(g, "set terminal pngcairo size 1200,500\nset output '");
    for (const char *c = file; *c; c++) fprintf(g, *c == '\'' ? "''" : "%c", *c);
    fprintf(g, "'\nset multiplot layout 1,2\nset style data histeps\nset ylabel 'pairs'\n");
    const char *titles[2] = {"x.y - d/4 (raw dot product, centred)",
                             "(x.y - d/4) / sqrt(d) (scaled)"};
    for (int k = 0; k < 2; k++) {
        fprintf(g, "set title '%s'\nplot ", titles[k]);
        for (size_t c = 0; c < n_dims; c++)
            fprintf(g, "%s'%s' index %d using 1:%zu title 'd = %zu' lw 2", c ? ", " : "", data, k,
                    c + 2, dims[c]);
        fprintf(g, "\n");
    }
    fprintf(g, "unset multiplot\n");
    int status = pclose(g);
    remove(data);
    if (status != 0) {
        fprintf(stderr, "sdpa demo: gnuplot failed to write %s\n", file);
        return 1;
    }
    printf("\n  wrote %s\n", file);
    return 0;
}

/* 1. Dot products grow with the dimension. */
static void demo_dot(void) {
    heading("1. Dot products grow with the dimension");
    const float a[] = {1, 2, 3, 4, 5, 6}, b[] = {3, 4, 5, 6, 7, 8};
    for (size_t n = 2; n <= 6; n += 2) {
        char left[96];
        int len = 0;
        for (int side = 0; side < 2; side++) {
            const float *v = side ? b : a;
            len += snprintf(left + len, sizeof left - len, "%s[", side ? " . " : "");
            for (size_t i = 0; i < n; i++)
                len += snprintf(left + len, sizeof left - len, "%s%g", i ? ", " : "", v[i]);
            len += snprintf(left + len, sizeof left - len, "]");
        }
        float r;
        api->dot_f32(a, b, n, &r);
        printf("  d = %zu:  %-40s = %g\n", n, left, r);
    }
}

/* 2. The variance of the dot product grows linearly with d; dividing by sqrt(d) flattens it. */
static int demo_variance(rng *r, const size_t *dims, size_t n_dims, const char *plot_file) {
    heading("2. Their variance grows linearly with d; divided by sqrt(d) it stays flat");
    printf("  %d pairs of random vectors x, y per d, components uniform in [0, 1).\n", PAIRS);
    printf(
        "  Theory: E[x.y] = d/4, Var(x.y) = d * Var(x_i y_i) = d * (1/9 - 1/16) = d * 7/144.\n\n");
    printf("  %6s %10s %9s %11s %11s %14s %13s\n", "d", "mean x.y", "(d/4)", "var x.y", "(d*7/144)",
           "var x.y/sqrt d", "(7/144)");
    size_t d_max = 1;
    for (size_t c = 0; c < n_dims; c++) d_max = dims[c] > d_max ? dims[c] : d_max;
    float *x = malloc(d_max * sizeof *x), *y = malloc(d_max * sizeof *y);
    double *dot = malloc(PAIRS * sizeof *dot), *scaled = malloc(PAIRS * sizeof *scaled);
    if (!x || !y || !dot || !scaled) {
        fprintf(stderr, "sdpa demo: out of memory\n");
        return 1;
    }
    /* Centred at d/4 so that every d shares one axis: the spread is what grows. */
    double sd_max = sqrt((double)d_max * VAR_XY);
    histogram raw_h = {-4 * sd_max, 8 * sd_max / BINS, {{0}}};
    histogram scaled_h = {-4 * sqrt(VAR_XY), 8 * sqrt(VAR_XY) / BINS, {{0}}};
    for (size_t c = 0; c < n_dims; c++) {
        size_t d = dims[c];
        for (int p = 0; p < PAIRS; p++) {
            fill(r, x, d, 0, 1);
            fill(r, y, d, 0, 1);
            float v;
            api->dot_f32(x, y, d, &v);
            dot[p] = v;
        }
        double m, var, ms, vars;
        mean_var(dot, PAIRS, &m, &var);
        for (int p = 0; p < PAIRS; p++) {
            scaled[p] = (dot[p] - d / 4.0) / sqrt((double)d);
            dot[p] -= d / 4.0;
        }
        mean_var(scaled, PAIRS, &ms, &vars);
        printf("  %6zu %10.3f %9.3f %11.4f %11.4f %14.4f %13.4f\n", d, m, d / 4.0, var, d * VAR_XY,
               vars, VAR_XY);
        histogram_fill(&raw_h, c, dot, PAIRS);
        histogram_fill(&scaled_h, c, scaled, PAIRS);
    }
    printf("\n  Distribution of x.y - d/4 (the end bins also count what lies beyond):\n\n");
    histogram_print(&raw_h, dims, n_dims);
    printf("\n  Distribution of (x.y - d/4) / sqrt(d): the same shape for every d.\n\n");
    histogram_print(&scaled_h, dims, n_dims);
    free(x);
    free(y);
    free(dot);
    free(scaled);
    return plot_file ? plot(plot_file, &raw_h, &scaled_h, dims, n_dims) : 0;
}

static void softmax_line(const char *label, const float *z, size_t n, float scale) {
    float y[2];
    api->softmax_f32(y, z, n, scale);
    printf("  %-45s = ", label);
    print_vector(y, n, 3);
    if (y[0] < 0.001f) printf("   (%.3g, %.6f)", y[0], y[1]);
    printf("\n");
}

/* 3. Softmax saturates on large scores. */
static void demo_softmax(void) {
    heading("3. Softmax saturates on large scores");
    const float z1[] = {14, 10}, z2[] = {4, 5}, z3[] = {1, 10};
    printf("  Two scores, raw and divided by sqrt(d_k) for d_k = 4:\n\n");
    softmax_line("softmax([14, 10])", z1, 2, 1.0f);
    softmax_line("softmax([14, 10] / sqrt(4)) = softmax([7, 5])", z1, 2, 0.5f);
    softmax_line("softmax([4, 5])", z2, 2, 1.0f);
    softmax_line("softmax([1, 10])", z3, 2, 1.0f);
    printf("\n  A gap of 4 between two scores already gives 98%% of the weight to one of them;\n"
           "  dividing by sqrt(d_k) = 2 halves the gap and keeps both in play.\n");
}

/* Largest |d softmax_i / d z_j| at the softmax output y, each row of the Jacobian from
 * sdpa_softmax_backward_f32 with a unit upstream gradient. */
static double largest_gradient(const float *y, size_t n) {
    float dy[64], dx[64];
    double top = 0;
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < n; j++) dy[j] = i == j ? 1.0f : 0.0f;
        api->softmax_backward_f32(dx, y, dy, n, 1.0f);
        for (size_t j = 0; j < n; j++) top = fabs(dx[j]) > top ? fabs(dx[j]) : top;
    }
    return top;
}

/* 4. Gradients vanish when softmax saturates. */
static int demo_gradient(rng *r, const size_t *dims, size_t n_dims) {
    heading("4. Gradients vanish when softmax saturates");
    printf("  Jacobian d sigma_i / d z_j = sigma_i (delta_ij - sigma_j), by "
           "sdpa_softmax_backward_f32:\n\n");
    const float sigmas[2][2] = {{0.99f, 0.01f}, {0.881f, 0.119f}};
    for (int s = 0; s < 2; s++) {
        float dx[2][2];
        for (int i = 0; i < 2; i++) {
            float dy[2] = {i == 0, i == 1};
            api->softmax_backward_f32(dx[i], sigmas[s], dy, 2, 1.0f);
        }
        printf("  sigma = [%.3f, %.3f]:  [[%8.4f, %8.4f], [%8.4f, %8.4f]]\n", sigmas[s][0],
               sigmas[s][1], dx[0][0], dx[0][1], dx[1][0], dx[1][1]);
    }
    enum { KEYS = 2, TRIALS = 500 };
    printf("\n  Largest Jacobian entry, sigma_1 sigma_2, for one query against %d keys\n"
           "  (components uniform in [0, 1)), averaged over %d queries:\n\n",
           KEYS, TRIALS);
    printf("  %6s %16s %22s\n", "d", "softmax(q.k)", "softmax(q.k / sqrt d)");
    size_t d_max = 1;
    for (size_t c = 0; c < n_dims; c++) d_max = dims[c] > d_max ? dims[c] : d_max;
    float *q = malloc(d_max * sizeof *q), *k = malloc(KEYS * d_max * sizeof *k);
    if (!q || !k) {
        fprintf(stderr, "sdpa demo: out of memory\n");
        return 1;
    }
    for (size_t c = 0; c < n_dims; c++) {
        size_t d = dims[c];
        double sum[2] = {0, 0};
        for (int t = 0; t < TRIALS; t++) {
            fill(r, q, d, 0, 1);
            fill(r, k, KEYS * d, 0, 1);
            float scores[KEYS], y[KEYS];
            api->scores_f32(scores, q, k, KEYS, d, d, 1.0f);
            for (int scaled = 0; scaled < 2; scaled++) {
                api->softmax_f32(y, scores, KEYS, scaled ? (float)(1 / sqrt((double)d)) : 1.0f);
                sum[scaled] += largest_gradient(y, KEYS);
            }
        }
        printf("  %6zu %16.4f %22.4f\n", d, sum[0] / TRIALS, sum[1] / TRIALS);
    }
    printf("\n  (0.25 is the most it can be, at sigma = [0.5, 0.5]; 0.0099 at [0.99, 0.01].)\n");
    free(q);
    free(k);
    return 0;
}

static void print_matrix(const char *const *labels, const float *w, size_t n) {
    printf("  %6s", "");
    for (size_t j = 0; j < n; j++) printf(" %6s", labels[j]);
    printf("\n");
    for (size_t i = 0; i < n; i++) {
        printf("  %6s", labels[i]);
        for (size_t j = 0; j < n; j++) printf(" %6.3f", w[i * n + j]);
        printf("\n");
    }
}

/* 5. A small attention: the weights from the kernels (scores, softmax), the output from the
 * fused sdpa_attention_f32, checked against the weights times V. */
static void demo_attention(rng *r) {
    heading("5. A small attention");
    enum { T = 6, D = 64, SHOW = 4 };
    static const char *const TOKENS[T] = {"the", "cat", "sat", "on", "the", "mat"};
    float q[T * D], k[T * D], v[T * D], vt[D * T], w[T * T], out[T * D], composed[T * D];
    fill(r, q, T * D, -1, 1);
    fill(r, k, T * D, -1, 1);
    fill(r, v, T * D, -1, 1);
    for (size_t t = 0; t < T; t++)
        for (size_t c = 0; c < D; c++) vt[c * T + t] = v[t * D + c];
    printf("  \"the cat sat on the mat\": Q, K, V are %d x %d, random in [-1, 1).\n"
           "  weights = softmax(Q K^T * scale) by sdpa_scores_f32 + sdpa_softmax_f32;\n"
           "  output by the fused sdpa_attention_f32, which never forms the weights.\n",
           T, D);
    double worst = 0; /* fused output against weights V (sdpa_dot_f32), both scalings */
    double row_max[2] = {0, 0};
    for (int scaled = 0; scaled < 2; scaled++) {
        float scale = scaled ? (float)(1 / sqrt((double)D)) : 1.0f;
        for (size_t i = 0; i < T; i++) {
            api->scores_f32(w + i * T, q + i * D, k, T, D, D, 1.0f);
            api->softmax_f32(w + i * T, w + i * T, T, scale);
            for (size_t c = 0; c < D; c++)
                api->dot_f32(w + i * T, vt + c * T, T, composed + i * D + c);
            float top = 0;
            for (size_t j = 0; j < T; j++) top = w[i * T + j] > top ? w[i * T + j] : top;
            row_max[scaled] += top / T;
        }
        if (!SDPA_API_HAS(api, attention_f32) ||
            api->attention_f32(out, q, k, v, T, T, D, D, scale, 0) != SDPA_OK)
            memcpy(out, composed, sizeof out); /* a 1.0 library without attention */
        for (size_t i = 0; i < T * D; i++) {
            double e = fabs((double)out[i] - composed[i]);
            worst = e > worst ? e : worst;
        }
        printf("\n  Attention weights, %s:\n\n", scaled ? "scaled by 1/sqrt(64)" : "unscaled");
        print_matrix(TOKENS, w, T);
        printf("\n  Output, first %d of %d columns:\n\n", SHOW, D);
        for (size_t i = 0; i < T; i++) {
            printf("  %6s", TOKENS[i]);
            for (size_t c = 0; c < SHOW; c++) printf(" %7.3f", out[i * D + c]);
            printf("\n");
        }
    }
    printf("\n  Largest weight in a row, on average: %.2f unscaled, %.2f scaled (1/%d would be\n"
           "  uniform). Unscaled, a row leans on one or two tokens and softmax sits where its\n"
           "  gradient is small; scaled, every token still mixes in the others.\n",
           row_max[0], row_max[1], T);
    printf("\n  The fused output and weights V agree to %.1e (largest difference).\n", worst);
}

static int compare_doubles(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* A standard normal, by Box-Muller from two uniforms. */
static float normal(rng *r) {
    const double u = 1.0 - uniform01(r), v = uniform01(r);
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

/* The plot of section 6: |dL/dQ| and the median |dL/dZ_i| against d_k, scaled and not, on log axes.
 */
static int plot_gradients(const char *file, const size_t *dims, const double norms[][4], size_t n) {
    FILE *g = popen("gnuplot", "w");
    if (!g) {
        fprintf(stderr, "sdpa demo: cannot run gnuplot: %s\n", strerror(errno));
        return 1;
    }
    fprintf(g, "set terminal pngcairo size 800,600\nset output '");
    for (const char *c = file; *c; c++) fprintf(g, *c == '\'' ? "''" : "%c", *c);
    fprintf(g, "'\nset logscale xy\nset xlabel 'd_k'\nset ylabel 'norm'\n"
               "set title 'Gradients through attention, from the backward pass'\n"
               "set xrange [12:1400]\nset key below\nplot");
    static const char *const titles[4] = {"|dL/dQ|, Q K^T", "|dL/dQ|, Q K^T / sqrt(d_k)",
                                          "median |dL/dZ_i|, Q K^T",
                                          "median |dL/dZ_i|, Q K^T / sqrt(d_k)"};
    for (int t = 0; t < 4; t++)
        fprintf(g, "%s '-' using 1:2 with linespoints lw 2 dt %d title '%s'", t ? "," : "",
                t < 2 ? 1 : 2, titles[t]);
    fprintf(g, "\n");
    for (int t = 0; t < 4; t++) {
        for (size_t c = 0; c < n; c++) fprintf(g, "%zu %g\n", dims[c], norms[c][t]);
        fprintf(g, "e\n");
    }
    if (pclose(g) != 0) {
        fprintf(stderr, "sdpa demo: gnuplot failed to write %s\n", file);
        return 1;
    }
    printf("\n  wrote %s\n", file);
    return 0;
}

/* 6. The same at the level of attention: dL/dQ from the library's fused backward pass, and
 * dL/dZ at the softmax's input Z (the scaled scores), row by row with its softmax backward. */
static int demo_attention_gradient(rng *r, const char *plot_file) {
    heading("6. Gradients through attention");
    if (!SDPA_API_HAS(api, mha_backward_f32)) {
        printf("  (this library has no backward pass: sdpa_mha_backward_f32 needs ABI 1.2)\n");
        return 0;
    }
    enum { T = 64, N_D = 4, D_MAX = 1024 };
    static const size_t DK[N_D] = {16, 64, 256, 1024};
    printf("  One head of %d queries and %d keys; q, k, v with unit-normal components and an\n"
           "  upstream gradient G = dL/d out with rows of unit norm (so that G . v does not grow\n"
           "  with d_k). dL/dQ from sdpa_mha_backward_f32; dL/dZ_i, the gradient at row i of the\n"
           "  softmax's input Z (the scaled scores), from sdpa_softmax_backward_f32, its median\n"
           "  over the rows; and the rows whose largest weight exceeds 0.99.\n\n",
           T, T);
    printf("  %6s %19s %19s %21s\n", "", "|dL/dQ|", "median |dL/dZ_i|", "saturated rows");
    printf("  %6s %9s %9s %9s %9s %10s %10s\n", "d_k", "raw", "scaled", "raw", "scaled", "raw",
           "scaled");
    /* q, k, v, G, out, dq, dk, dv, then lse and a row's z, weights, dP and dZ */
    float *buf = malloc(((size_t)8 * T * D_MAX + 5 * T) * sizeof(float));
    if (!buf) {
        fprintf(stderr, "sdpa demo: out of memory\n");
        return 1;
    }
    double norms[N_D][4];
    for (size_t c = 0; c < N_D; c++) {
        const size_t d = DK[c], n = (size_t)T * d;
        float *q = buf, *k = q + n, *v = k + n, *g = v + n, *out = g + n, *dq = out + n,
              *dk = dq + n, *dv = dk + n, *lse = dv + n, *z = lse + T, *w = z + T, *dp = w + T,
              *dz = dp + T;
        for (size_t i = 0; i < 4 * n; i++) q[i] = normal(r);
        for (size_t i = 0; i < n; i++) g[i] /= (float)sqrt((double)d);
        double frac[2];
        for (int scaled = 0; scaled < 2; scaled++) {
            const float s = scaled ? (float)(1.0 / sqrt((double)d)) : 1.0f;
            sdpa_mha_desc desc;
            api->mha_desc_dense(&desc, 1, 1, 1, T, T, d, d, s, 0);
            desc.lse = lse;
            desc.lse_stride[0] = desc.lse_stride[1] = T;
            sdpa_mha_grads gr = {sizeof gr, 0,         dq, dk,        dv,  {n, n, d},
                                 {n, n, d}, {n, n, d}, g,  {n, n, d}, NULL};
            if (api->mha_f32(&desc, out, q, k, v) != SDPA_OK ||
                api->mha_backward_f32(&desc, &gr, q, k, v, out) != SDPA_OK) {
                fprintf(stderr, "sdpa demo: the attention calls failed\n");
                free(buf);
                return 1;
            }
            double sum_q = 0.0, row_z[T];
            for (size_t i = 0; i < n; i++) sum_q += (double)dq[i] * dq[i];
            size_t saturated = 0;
            for (size_t i = 0; i < T; i++) {
                api->scores_f32(z, q + i * d, k, T, d, d, s);
                api->softmax_f32(w, z, T, 1.0f);
                api->scores_f32(dp, g + i * d, v, T, d, d, 1.0f); /* dL/dw = G_i . v_j */
                api->softmax_backward_f32(dz, w, dp, T, 1.0f);
                float top = 0.0f;
                double sum_z = 0.0;
                for (size_t j = 0; j < T; j++) {
                    top = w[j] > top ? w[j] : top;
                    sum_z += (double)dz[j] * dz[j];
                }
                row_z[i] = sqrt(sum_z);
                saturated += top > 0.99f;
            }
            qsort(row_z, T, sizeof row_z[0], compare_doubles);
            norms[c][scaled] = sqrt(sum_q);
            norms[c][2 + scaled] = 0.5 * (row_z[T / 2 - 1] + row_z[T / 2]);
            frac[scaled] = (double)saturated / T;
        }
        printf("  %6zu %9.3g %9.3g %9.3g %9.3g %9.0f%% %9.0f%%\n", d, norms[c][0], norms[c][1],
               norms[c][2], norms[c][3], 100 * frac[0], 100 * frac[1]);
    }
    free(buf);
    printf("\n  Unscaled, the scores' spread grows like sqrt(d_k): ever more rows put all their\n"
           "  weight on one key, where the softmax's gradient vanishes: what passes through it,\n"
           "  dL/dZ_i, collapses for the typical row. dL/dQ = scale dL/dZ K also carries\n"
           "  |k| ~ sqrt(d_k) and the rows not yet saturated, which hide the collapse in its\n"
           "  norm. Divided by sqrt(d_k), no row saturates and both hold.\n");
    if (!plot_file) return 0;
    /* next to the plot of section 2: FILE.png gives FILE-gradients.png */
    char file[PATH_MAX];
    const char *dot = strrchr(plot_file, '.');
    const int stem = dot && !strchr(dot, '/') ? (int)(dot - plot_file) : (int)strlen(plot_file);
    snprintf(file, sizeof file, "%.*s-gradients.png", stem, plot_file);
    return plot_gradients(file, DK, norms, N_D);
}

int cmd_demo(uint64_t seed, const size_t *dims, size_t n_dims, const char *plot_file) {
    printf("sdpa demo: why attention divides its scores by sqrt(d_k)\n");
    printf("(library %s, backend %s, seed %llu)\n", api->version(), api->backend(),
           (unsigned long long)seed);
    rng r = rng_seed(seed);
    demo_dot();
    if (demo_variance(&r, dims, n_dims, plot_file)) return 1;
    demo_softmax();
    if (demo_gradient(&r, dims, n_dims)) return 1;
    demo_attention(&r);
    return demo_attention_gradient(&r, plot_file);
}
