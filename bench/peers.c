/* OpenBLAS and oneDNN behind the small interface of peers.h; each compiled in only when meson
 * found it (BENCH_HAVE_OPENBLAS, BENCH_HAVE_DNNL). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "peers.h"
#include "sdpa.h"

#ifdef BENCH_HAVE_OPENBLAS
#include <cblas.h>

const char *peer_openblas_describe(void) {
    static char text[512];
    const char *forced = getenv("OPENBLAS_CORETYPE");
    const char *was = getenv("SDPA_BENCH_CORETYPE_WAS");
    snprintf(text, sizeof text,
             "%s; kernels for core %s; OPENBLAS_CORETYPE=%s (set by the bench, was %s: Debian's "
             "0.3.21 takes Zen 5 for Haswell); OPENBLAS_NUM_THREADS=%s",
             openblas_get_config(), openblas_get_corename(), forced ? forced : "(unset)",
             was ? was : "?",
             getenv("OPENBLAS_NUM_THREADS") ? getenv("OPENBLAS_NUM_THREADS") : "?");
    return text;
}

float peer_openblas_sdot(const float *a, const float *b, size_t n) {
    return cblas_sdot((blasint)n, a, 1, b, 1);
}

void peer_openblas_scores(float *s, const float *q, const float *k, size_t n_keys, size_t d,
                          size_t k_stride, float scale) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, (blasint)n_keys, (blasint)d, scale, k,
                (blasint)k_stride, q, 1, 0.0f, s, 1);
}

void peer_openblas_attention(float *out, const float *q, const float *k, const float *v,
                             float *scores, size_t batch, size_t heads_q, size_t heads_kv,
                             size_t len_q, size_t len_kv, size_t d, int causal) {
    const float scale = (float)(1.0 / sqrt((double)d));
    const size_t group = heads_q / heads_kv;
    const blasint m = (blasint)len_q, n = (blasint)len_kv, dd = (blasint)d;
    for (size_t b = 0; b < batch; b++)
        for (size_t h = 0; h < heads_q; h++) {
            const float *qh = q + (b * heads_q + h) * len_q * d;
            const float *kh = k + (b * heads_kv + h / group) * len_kv * d;
            const float *vh = v + (b * heads_kv + h / group) * len_kv * d;
            float *oh = out + (b * heads_q + h) * len_q * d;
            if (m == 1)
                cblas_sgemv(CblasRowMajor, CblasNoTrans, n, dd, scale, kh, dd, qh, 1, 0.0f, scores,
                            1);
            else
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, dd, scale, qh, dd, kh,
                            dd, 0.0f, scores, n);
            for (size_t i = 0; i < len_q; i++) {
                float *row = scores + i * len_kv;
                if (causal) /* bottom-right aligned, as sdpa: row i sees j <= i + len_kv - len_q */
                    for (size_t j = i + len_kv >= len_q ? i + len_kv - len_q + 1 : 0; j < len_kv;
                         j++)
                        row[j] = -INFINITY;
                sdpa_softmax_f32(row, row, len_kv, 1.0f);
            }
            if (m == 1)
                cblas_sgemv(CblasRowMajor, CblasTrans, n, dd, 1.0f, vh, dd, scores, 1, 0.0f, oh, 1);
            else
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, dd, n, 1.0f, scores, n,
                            vh, dd, 0.0f, oh, dd);
        }
}
#else
const char *peer_openblas_describe(void) { return NULL; }
void peer_openblas_attention(float *out, const float *q, const float *k, const float *v,
                             float *scores, size_t batch, size_t heads_q, size_t heads_kv,
                             size_t len_q, size_t len_kv, size_t d, int causal) {
    (void)out, (void)q, (void)k, (void)v, (void)scores, (void)batch, (void)heads_q;
    (void)heads_kv, (void)len_q, (void)len_kv, (void)d, (void)causal;
}
float peer_openblas_sdot(const float *a, const float *b, size_t n) {
    (void)a, (void)b, (void)n;
    return 0.0f;
}
void peer_openblas_scores(float *s, const float *q, const float *k, size_t n_keys, size_t d,
                          size_t k_stride, float scale) {
    (void)s, (void)q, (void)k, (void)n_keys, (void)d, (void)k_stride, (void)scale;
}
#endif

#ifdef BENCH_HAVE_DNNL
#include <dnnl.h>

struct peer_dnnl_softmax {
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    dnnl_primitive_t prim;
    dnnl_memory_t src, dst;
};

const char *peer_dnnl_describe(void) {
    static char text[128];
    const dnnl_version_t *v = dnnl_version();
    snprintf(text, sizeof text,
             "oneDNN %d.%d.%d, softmax_v2 forward_inference accurate; "
             "OMP_NUM_THREADS=%s",
             v->major, v->minor, v->patch,
             getenv("OMP_NUM_THREADS") ? getenv("OMP_NUM_THREADS") : "(unset)");
    return text;
}

peer_dnnl_softmax *peer_dnnl_softmax_create(float *y, const float *x, size_t n) {
    peer_dnnl_softmax *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    dnnl_memory_desc_t md;
    dnnl_dims_t dims = {1, (dnnl_dim_t)n};
    dnnl_softmax_v2_desc_t desc;
    dnnl_primitive_desc_t pd = NULL;
    int ok = dnnl_engine_create(&p->engine, dnnl_cpu, 0) == dnnl_success &&
             dnnl_stream_create(&p->stream, p->engine, dnnl_stream_default_flags) == dnnl_success &&
             dnnl_memory_desc_init_by_tag(&md, 2, dims, dnnl_f32, dnnl_ab) == dnnl_success &&
             dnnl_softmax_v2_forward_desc_init(&desc, dnnl_forward_inference, dnnl_softmax_accurate,
                                               &md, &md, 1) == dnnl_success &&
             dnnl_primitive_desc_create(&pd, &desc, NULL, p->engine, NULL) == dnnl_success &&
             dnnl_primitive_create(&p->prim, pd) == dnnl_success &&
             dnnl_memory_create(&p->src, &md, p->engine, (void *)x) == dnnl_success &&
             dnnl_memory_create(&p->dst, &md, p->engine, y) == dnnl_success;
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (!ok) {
        peer_dnnl_softmax_destroy(p);
        return NULL;
    }
    return p;
}

void peer_dnnl_softmax_run(peer_dnnl_softmax *p) {
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_SRC, p->src}, {DNNL_ARG_DST, p->dst}};
    dnnl_primitive_execute(p->prim, p->stream, 2, args);
    dnnl_stream_wait(p->stream);
}

void peer_dnnl_softmax_destroy(peer_dnnl_softmax *p) {
    if (!p) return;
    if (p->src) dnnl_memory_destroy(p->src);
    if (p->dst) dnnl_memory_destroy(p->dst);
    if (p->prim) dnnl_primitive_destroy(p->prim);
    if (p->stream) dnnl_stream_destroy(p->stream);
    if (p->engine) dnnl_engine_destroy(p->engine);
    free(p);
}
#else
const char *peer_dnnl_describe(void) { return NULL; }
peer_dnnl_softmax *peer_dnnl_softmax_create(float *y, const float *x, size_t n) {
    (void)y, (void)x, (void)n;
    return NULL;
}
void peer_dnnl_softmax_run(peer_dnnl_softmax *p) { (void)p; }
void peer_dnnl_softmax_destroy(peer_dnnl_softmax *p) { (void)p; }
#endif
