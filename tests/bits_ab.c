/* Two builds of the library, bit for bit: random calls of the attention forward (every type
 * combination, GQA, causal, masks, lse, split-KV lengths) and backward, on every backend both can
 * run, both exp modes and one and two threads, each given the same inputs; any output bit that
 * differs is reported. A refactoring that must not change results runs it against the library it
 * replaces:
 *
 *   scripts/bits-ab OLD_BUILD NEW_BUILD [CALLS] [SEED]
 *
 * Each library is loaded with dlmopen into a namespace of its own, so that both can be
 * libsdpa.so.1, and used only through its sdpa_get_api table. */
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdpa.h"

typedef const sdpa_api *(*get_api_fn)(uint32_t);

static const sdpa_api *load(const char *path) {
    void *h = dlmopen(LM_ID_NEWLM, path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "bits_ab: %s\n", dlerror());
        exit(2);
    }
    get_api_fn get = (get_api_fn)(uintptr_t)dlsym(h, "sdpa_get_api");
    const sdpa_api *api = get ? get(SDPA_ABI_VERSION) : NULL;
    if (!api || api->struct_size <= offsetof(sdpa_api, mha_backward_f32)) {
        fprintf(stderr, "bits_ab: %s has no ABI 1.2 table\n", path);
        exit(2);
    }
    return api;
}

static uint64_t rng_state;
static uint64_t next(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static size_t pick(const size_t *choices, size_t n) { return choices[next() % n]; }
static float normal(void) {
    double u = ((double)(next() >> 11) + 0.5) / 9007199254740992.0;
    double w = ((double)(next() >> 11) + 0.5) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * w));
}

/* n elements of type t from unit normals (f16 and bf16 by the first library's sdpa_convert) */
static void *fill(const sdpa_api *api, uint32_t t, size_t n) {
    float *f = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) f[i] = normal();
    if (t == SDPA_F32) return f;
    void *x = malloc((n ? n : 1) * 2);
    api->convert(x, (sdpa_dtype)t, f, SDPA_F32, n);
    free(f);
    return x;
}

typedef struct call {
    sdpa_mha_desc d;
    void *q, *k, *v;
    float *mask;
    size_t out_elems, out_bytes, lse_n;
} call;

static void random_call(const sdpa_api *api, call *c) {
    static const size_t heads[][2] = {{1, 1}, {2, 2}, {4, 1}, {8, 2}, {32, 8}, {3, 3}};
    static const size_t lens_q[] = {1, 1, 1, 2, 5, 8, 17, 33, 64, 100};
    static const size_t lens_kv[] = {1, 7, 64, 129, 513, 600, 1100, 2049, 4099};
    static const size_t dims[] = {1, 8, 16, 31, 64, 64, 128, 128, 130, 256};
    static const uint32_t types[][3] = {{0, 0, 0}, {0, 1, 0}, {1, 1, 1}, {2, 2, 2},
                                        {2, 2, 0}, {0, 2, 0}, {1, 1, 0}, {0, 0, 1}};
    const size_t *hq = heads[next() % 6];
    const uint32_t *ty = types[next() % 8];
    size_t batch = 1 + next() % 2, len_q = pick(lens_q, 10), len_kv = pick(lens_kv, 9);
    size_t d_k = pick(dims, 10), d_v = next() % 3 ? d_k : pick(dims, 10);
    const uint32_t flags = next() % 3 == 0 ? SDPA_CAUSAL : 0;
    const float scale = next() % 4 == 0 ? 0.3f + (float)(next() % 100) / 64.0f : 0.0f;
    /* keep a call under a few million elements */
    while (batch * hq[0] * (len_q + len_kv) * (d_k + d_v) > (size_t)6 << 20 && len_kv > 64)
        len_kv /= 2;
    sdpa_mha_desc *d = &c->d;
    if (next() % 2)
        api->mha_desc_dense(d, batch, hq[0], hq[1], len_q, len_kv, d_k, d_v, scale, flags);
    else
        api->mha_desc_bshd(d, batch, hq[0], hq[1], len_q, len_kv, d_k, d_v, scale, flags);
    d->q_type = ty[0], d->kv_type = ty[1], d->out_type = ty[2];
    c->q = fill(api, ty[0], batch * hq[0] * len_q * d_k);
    c->k = fill(api, ty[1], batch * hq[1] * len_kv * d_k);
    c->v = fill(api, ty[1], batch * hq[1] * len_kv * d_v);
    c->mask = NULL;
    if (next() % 3 == 0) { /* one mask row per query row, shared by the heads; some -inf */
        c->mask = malloc(len_q * len_kv * sizeof(float));
        for (size_t i = 0; i < len_q * len_kv; i++)
            c->mask[i] = next() % 5 == 0 ? -INFINITY : normal();
        api->mha_desc_set_mask(d, c->mask, 0, 0, len_kv);
    }
    c->out_elems = batch * hq[0] * len_q * d_v;
    c->out_bytes = c->out_elems * (ty[2] == SDPA_F32 ? 4 : 2);
    c->lse_n = next() % 2 ? batch * hq[0] * len_q : 0;
}

/* Runs c on api into out (and lse, with the dense lse strides); returns the status. */
static sdpa_status run_forward(const sdpa_api *api, const call *c, void *out, float *lse) {
    sdpa_mha_desc d = c->d;
    d.lse = c->lse_n ? lse : NULL;
    d.lse_stride[0] = d.heads_q * d.len_q;
    d.lse_stride[1] = d.len_q;
    return api->mha(&d, out, c->q, c->k, c->v);
}

static size_t differing(const void *a, const void *b, size_t bytes, size_t elem) {
    size_t n = 0;
    for (size_t i = 0; i < bytes; i += elem)
        n += memcmp((const char *)a + i, (const char *)b + i, elem) != 0;
    return n;
}

/* The backward of an all-f32 call on both libraries; returns the differing gradient floats. */
static size_t compare_backward(const sdpa_api *a, const sdpa_api *b, const call *c,
                               const float *out, const float *lse) {
    const sdpa_mha_desc *d = &c->d;
    const size_t nq = d->batch * d->heads_q * d->len_q * d->d_k;
    const size_t nk = d->batch * d->heads_kv * d->len_kv * d->d_k;
    const size_t nv = d->batch * d->heads_kv * d->len_kv * d->d_v;
    float *dout = fill(a, SDPA_F32, c->out_elems), *g[2][3];
    sdpa_mha_desc fd = *d;
    fd.lse = (float *)lse;
    fd.lse_stride[0] = d->heads_q * d->len_q;
    fd.lse_stride[1] = d->len_q;
    size_t bad = 0;
    sdpa_status st[2];
    for (int lib = 0; lib < 2; lib++) {
        g[lib][0] = calloc(nq, 4), g[lib][1] = calloc(nk, 4), g[lib][2] = calloc(nv, 4);
        sdpa_mha_grads gr = {sizeof gr, 0,   g[lib][0], g[lib][1], g[lib][2], {0},
                             {0},       {0}, dout,      {0},       NULL};
        memcpy(gr.dq_stride, d->q_stride, sizeof gr.dq_stride);
        memcpy(gr.dk_stride, d->k_stride, sizeof gr.dk_stride);
        memcpy(gr.dv_stride, d->v_stride, sizeof gr.dv_stride);
        memcpy(gr.dout_stride, d->out_stride, sizeof gr.dout_stride);
        st[lib] = (lib ? b : a)->mha_backward_f32(&fd, &gr, c->q, c->k, c->v, out);
    }
    if (st[0] != st[1])
        bad = 1;
    else {
        bad += differing(g[0][0], g[1][0], nq * 4, 4);
        bad += differing(g[0][1], g[1][1], nk * 4, 4);
        bad += differing(g[0][2], g[1][2], nv * 4, 4);
    }
    for (int lib = 0; lib < 2; lib++)
        for (int i = 0; i < 3; i++) free(g[lib][i]);
    free(dout);
    return bad;
}

static void describe(const call *c, const char *backend, const char *exp, size_t threads) {
    const sdpa_mha_desc *d = &c->d;
    fprintf(stderr,
            "  b%zu h%zu/%zu q%zu k%zu d%zu/%zu types %u/%u/%u %s%s%s scale %g, %s, exp %s, "
            "%zu threads\n",
            d->batch, d->heads_q, d->heads_kv, d->len_q, d->len_kv, d->d_k, d->d_v, d->q_type,
            d->kv_type, d->out_type, d->flags & SDPA_CAUSAL ? "causal " : "",
            c->mask ? "mask " : "", c->lse_n ? "lse" : "", (double)d->scale, backend, exp, threads);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: bits_ab OLD_LIBRARY NEW_LIBRARY [CALLS] [SEED]\n");
        return 2;
    }
    const sdpa_api *a = load(argv[1]), *b = load(argv[2]);
    const size_t calls = argc > 3 ? strtoul(argv[3], NULL, 10) : 2000;
    rng_state = argc > 4 ? strtoull(argv[4], NULL, 10) : 1;
    static const char *const exps[] = {"fast", "sleef"};
    size_t compared = 0, failed = 0;
    for (size_t i = 0; i < calls; i++) {
        call c;
        random_call(a, &c);
        const char *backend = NULL;
        for (size_t n = 0; (backend = a->backend_name(n)) != NULL; n++) {
            if (!a->backend_supported(backend) || !b->backend_supported(backend)) continue;
            if (next() % 2) continue; /* a random half of the backends per call */
            const char *exp = exps[next() % 2];
            const size_t threads = 1 + next() % 2;
            a->set_backend(backend), b->set_backend(backend);
            a->set_exp_mode(exp), b->set_exp_mode(exp);
            a->set_num_threads(threads), b->set_num_threads(threads);
            void *out[2] = {malloc(c.out_bytes + 1), malloc(c.out_bytes + 1)};
            float *lse[2] = {calloc(c.lse_n + 1, 4), calloc(c.lse_n + 1, 4)};
            sdpa_status st[2] = {run_forward(a, &c, out[0], lse[0]),
                                 run_forward(b, &c, out[1], lse[1])};
            size_t bad = st[0] != st[1];
            if (!bad && st[0] == SDPA_OK) {
                bad += differing(out[0], out[1], c.out_bytes, c.d.out_type ? 2 : 4);
                bad += differing(lse[0], lse[1], c.lse_n * 4, 4);
                const int f32 = !c.d.q_type && !c.d.kv_type && !c.d.out_type;
                if (!bad && f32 && c.lse_n && c.d.len_kv <= 1100)
                    bad += compare_backward(a, b, &c, out[0], lse[0]);
            }
            compared++;
            if (bad) {
                failed++;
                fprintf(stderr, "bits_ab: call %zu: %zu values differ (status %d, %d)\n", i, bad,
                        st[0], st[1]);
                describe(&c, backend, exp, threads);
            }
            free(out[0]), free(out[1]), free(lse[0]), free(lse[1]);
        }
        free(c.q), free(c.k), free(c.v), free(c.mask);
    }
    printf("bits_ab: %zu runs of %zu random calls compared, %zu differ\n", compared, calls, failed);
    return failed != 0;
}
