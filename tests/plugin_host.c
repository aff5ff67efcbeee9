/* A plugin host: loads libsdpa with dlopen, as applications that treat it as a plugin do, and
 * uses it only through the table of sdpa_get_api. It never links the library.
 *
 *   plugin_host LIBRARY load     every function through the table against the double reference,
 *                                version negotiation, SDPA_BACKEND handling, dlclose and reload
 *   plugin_host LIBRARY threads  8 threads run the kernels through the table while another
 *                                thread keeps switching backends and exp modes
 *
 * Prints one line per failed check and exits 1 if there was any. */
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bounds.h"
#include "reference.h"
#include "sdpa.h"

static int failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            failures++;                                                                            \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                            \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
        }                                                                                          \
    } while (0)

typedef const sdpa_api *(*get_api_fn)(uint32_t);

/* Deterministic floats in [lo, hi) (xorshift64*), independent of the test helpers' generator. */
static float uniform(uint64_t *s, float lo, float hi) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    uint64_t r = *s * 0x2545F4914F6CDD1DULL;
    return lo + (hi - lo) * (float)((double)(r >> 11) * 0x1p-53);
}

/* ---- One set of small inputs with double-precision expectations. ---- */

enum { MAX_N = 100, D = 24, N_KEYS = 7, K_STRIDE = 29, LQ = 3 };

typedef struct problem {
    size_t n;
    float a[MAX_N], b[MAX_N], dy[MAX_N];
    float k[N_KEYS * K_STRIDE];
    double dot, dot_abs;
    double softmax[MAX_N];
    float y[MAX_N]; /* softmax(a * SCALE) rounded, the input of the backward check */
    double dx[MAX_N], dx_bound[MAX_N];
    double scores[N_KEYS], scores_abs[N_KEYS];
    /* attention: LQ query rows of D (the first LQ*D of a), keys k (rows K_STRIDE apart, and a
       dense copy kd), values v; causal, scale 1/sqrt(D) */
    float kd[N_KEYS * D], v[N_KEYS * K_STRIDE], vd[N_KEYS * D];
    double att[LQ * D], v_max;
} problem;

static const float SCALE = 0.7f;

static void make_problem(problem *p, size_t n, uint64_t seed) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 1;
    p->n = n;
    /* all MAX_N entries: scores reads D of them whatever n is */
    for (size_t i = 0; i < MAX_N; i++) {
        p->a[i] = uniform(&s, -3, 3);
        p->b[i] = uniform(&s, -3, 3);
        p->dy[i] = uniform(&s, -1, 1);
    }
    for (size_t i = 0; i < N_KEYS * K_STRIDE; i++) p->k[i] = uniform(&s, -1, 1);
    p->dot = ref_dot(p->a, p->b, n);
    p->dot_abs = ref_dot_abs(p->a, p->b, n);
    ref_softmax(p->softmax, p->a, n, SCALE);
    double y_dot_dy = 0, y_abs_dy = 0;
    for (size_t i = 0; i < n; i++) {
        p->y[i] = (float)p->softmax[i];
        y_dot_dy += (double)p->y[i] * p->dy[i];
        y_abs_dy += (double)p->y[i] * fabs(p->dy[i]);
    }
    for (size_t i = 0; i < n; i++) {
        p->dx[i] = SCALE * (double)p->y[i] * (p->dy[i] - y_dot_dy);
        p->dx_bound[i] = bound_backward(fabs(p->dy[i]) + y_abs_dy, SCALE * p->y[i], n);
    }
    p->v_max = 0;
    for (size_t j = 0; j < N_KEYS; j++)
        for (size_t c = 0; c < D; c++) {
            p->v[j * K_STRIDE + c] = uniform(&s, -2, 2);
            p->kd[j * D + c] = p->k[j * K_STRIDE + c];
            p->vd[j * D + c] = p->v[j * K_STRIDE + c];
            p->v_max = fmax(p->v_max, fabs(p->vd[j * D + c]));
        }
    ref_attention(p->att, D, p->a, D, p->kd, D, p->vd, D, NULL, 0, LQ, N_KEYS, D, D,
                  (double)(float)(1 / sqrt((double)D)), 1);
    for (size_t j = 0; j < N_KEYS; j++) {
        p->scores[j] = SCALE * ref_dot(p->a, p->k + j * K_STRIDE, D);
        p->scores_abs[j] = SCALE * ref_dot_abs(p->a, p->k + j * K_STRIDE, D);
    }
}

/* Runs every kernel of the table on p; returns the number of wrong results (and prints them
 * unless quiet, which the threads use to keep the log short). */
static int run_kernels(const sdpa_api *api, const problem *p, int quiet) {
    int bad = 0;
    size_t n = p->n;
    float out[MAX_N], y[MAX_N], s[N_KEYS], att[LQ * D], r = 0;
#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            bad++;                                                                                 \
            if (!quiet) {                                                                          \
                printf("FAIL n=%zu: ", n);                                                         \
                printf(__VA_ARGS__);                                                               \
                printf("\n");                                                                      \
            }                                                                                      \
        }                                                                                          \
    } while (0)
    EXPECT(api->dot_f32(p->a, p->b, n, &r) == SDPA_OK, "dot status");
    EXPECT(fabs(r - p->dot) <= bound_dot(p->dot_abs), "dot %.9g, expected %.9g", r, p->dot);

    EXPECT(api->scale_f32(out, p->a, n, SCALE) == SDPA_OK, "scale status");
    for (size_t i = 0; i < n; i++)
        EXPECT(out[i] == p->a[i] * SCALE, "scale[%zu] %.9g, expected %.9g", i, out[i],
               p->a[i] * SCALE);

    EXPECT(api->softmax_f32(y, p->a, n, SCALE) == SDPA_OK, "softmax status");
    for (size_t i = 0; i < n; i++)
        EXPECT(fabs(y[i] - p->softmax[i]) <= bound_softmax_rel(n) * p->softmax[i],
               "softmax[%zu] %.9g, expected %.9g", i, y[i], p->softmax[i]);

    EXPECT(api->softmax_backward_f32(out, p->y, p->dy, n, SCALE) == SDPA_OK, "backward status");
    for (size_t i = 0; i < n; i++)
        EXPECT(fabs(out[i] - p->dx[i]) <= p->dx_bound[i], "backward[%zu] %.9g, expected %.9g", i,
               out[i], p->dx[i]);

    EXPECT(api->scores_f32(s, p->a, p->k, N_KEYS, D, K_STRIDE, SCALE) == SDPA_OK, "scores status");
    for (size_t j = 0; j < N_KEYS; j++)
        EXPECT(fabs(s[j] - p->scores[j]) <= bound_dot(p->scores_abs[j]),
               "scores[%zu] %.9g, expected %.9g", j, s[j], p->scores[j]);

    /* attention: the dense call, then mha_f32 on strided k and v from a desc the table made */
    EXPECT(api->attention_f32(att, p->a, p->kd, p->vd, LQ, N_KEYS, D, D, SDPA_DEFAULT_SCALE,
                              SDPA_CAUSAL) == SDPA_OK,
           "attention status");
    for (size_t i = 0; i < LQ * D; i++)
        EXPECT(fabs(att[i] - p->att[i]) <= bound_attention(p->v_max),
               "attention[%zu] %.9g, expected %.9g", i, att[i], p->att[i]);
    sdpa_mha_desc desc;
    EXPECT(api->mha_desc_dense(&desc, 1, 1, 1, LQ, N_KEYS, D, D, SDPA_DEFAULT_SCALE, SDPA_CAUSAL) ==
               SDPA_OK,
           "mha_desc_dense status");
    desc.k_stride[2] = desc.v_stride[2] = K_STRIDE;
    memset(att, 0, sizeof att);
    EXPECT(api->mha_f32(&desc, att, p->a, p->k, p->v) == SDPA_OK, "mha status");
    for (size_t i = 0; i < LQ * D; i++)
        EXPECT(fabs(att[i] - p->att[i]) <= bound_attention(p->v_max),
               "mha[%zu] %.9g, expected %.9g", i, att[i], p->att[i]);
    EXPECT(api->mha_f32(NULL, att, p->a, p->k, p->v) == SDPA_ERR_NULL, "mha(NULL desc) status");

    /* the backward through the table, for L = |out|^2 / 2 (dout = out): every row sees a key,
       and its weights sum to 1, so sum_j dv_j = sum_i dout_i */
    if (SDPA_API_HAS(api, mha_backward_f32)) {
        float lse[LQ], dq[LQ * D], dk[N_KEYS * D], dv[N_KEYS * D];
        desc.lse = lse;
        desc.lse_stride[0] = desc.lse_stride[1] = LQ;
        EXPECT(api->mha_f32(&desc, att, p->a, p->k, p->v) == SDPA_OK, "mha with lse status");
        sdpa_mha_grads g = {sizeof g,  0,
                            dq,        dk,
                            dv,        {LQ * D, LQ * D, D},
                            {0, 0, D}, {0, 0, D},
                            att,       {LQ * D, LQ * D, D},
                            NULL};
        EXPECT(api->mha_backward_f32(&desc, &g, p->a, p->k, p->v, att) == SDPA_OK,
               "mha_backward status");
        for (size_t c = 0; c < D; c++) {
            double sum_dv = 0, sum_dout = 0, size = 0;
            for (size_t j = 0; j < N_KEYS; j++) sum_dv += dv[j * D + c];
            for (size_t i = 0; i < LQ; i++)
                sum_dout += att[i * D + c], size += fabs(att[i * D + c]);
            EXPECT(fabs(sum_dv - sum_dout) <= 1e-5 * size + 1e-30,
                   "backward: sum of dv[.][%zu] %.9g, of dout %.9g", c, sum_dv, sum_dout);
        }
        EXPECT(api->mha_backward_f32(&desc, NULL, p->a, p->k, p->v, att) == SDPA_ERR_NULL,
               "mha_backward(NULL grads) status");
    }
#undef EXPECT
    return bad;
}

static const size_t SIZES[] = {1, 3, 7, 8, 15, 16, 17, 33, 64, MAX_N};
#define N_SIZES (sizeof SIZES / sizeof SIZES[0])

/* ---- load ---- */

/* Opens the library with fd 2 sent to a file; returns the handle and the number of lines the
 * library printed on stderr while loading. */
static void *open_capturing(const char *path, int *stderr_lines, char *text, size_t text_size) {
    fflush(stderr);
    FILE *capture = tmpfile();
    int saved = dup(2);
    dup2(fileno(capture), 2);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(capture);
    size_t len = fread(text, 1, text_size - 1, capture);
    text[len] = 0;
    fclose(capture);
    *stderr_lines = 0;
    for (size_t i = 0; i < len; i++) *stderr_lines += text[i] == '\n';
    return h;
}

static const sdpa_api *table_of(void *h) {
    get_api_fn get = (get_api_fn)(uintptr_t)dlsym(h, "sdpa_get_api");
    CHECK(get != NULL, "dlsym(sdpa_get_api): %s", dlerror());
    return get ? get(SDPA_ABI_VERSION) : NULL;
}

static void check_table(const sdpa_api *api, get_api_fn get) {
    CHECK(api->abi_version == SDPA_ABI_VERSION, "abi_version %u", api->abi_version);
    CHECK(api->struct_size >= sizeof(sdpa_api), "struct_size %u < %zu", api->struct_size,
          sizeof(sdpa_api));
    CHECK(SDPA_API_HAS(api, set_exp_mode), "SDPA_API_HAS(set_exp_mode)");
    CHECK(SDPA_API_HAS(api, mha_desc_set_mask),
          "SDPA_API_HAS(mha_desc_set_mask): attention in the table");
    CHECK(SDPA_API_HAS(api, mha_backward_f32), "SDPA_API_HAS(mha_backward_f32): ABI 1.2");
    CHECK(get(SDPA_ABI_VERSION) == api, "sdpa_get_api returns one table");
    CHECK(get(0) == NULL, "sdpa_get_api(0) must be NULL");
    CHECK(get(SDPA_ABI_VERSION + 1) == NULL, "sdpa_get_api(%u) must be NULL", SDPA_ABI_VERSION + 1);
    CHECK(get(UINT32_MAX) == NULL, "sdpa_get_api(UINT32_MAX) must be NULL");

    /* Every field is filled: a NULL pointer would mean a function was left out of the table. */
    const char *first = (const char *)&api->status_string;
    for (const char *f = first; f < (const char *)api + sizeof(sdpa_api);
         f += sizeof(void (*)(void))) {
        void (*fn)(void);
        memcpy(&fn, f, sizeof fn);
        CHECK(fn != NULL, "table field at offset %zu is NULL", (size_t)(f - (const char *)api));
    }

    CHECK(api->abi_version_fn() == SDPA_ABI_VERSION, "abi_version() %u", api->abi_version_fn());
    unsigned major, minor, patch;
    CHECK(sscanf(api->version(), "%u.%u.%u", &major, &minor, &patch) == 3 && major == 1,
          "version() \"%s\"", api->version());
    for (int st = SDPA_OK; st <= SDPA_ERR_UNSUPPORTED; st++) {
        const char *text = api->status_string((sdpa_status)st);
        CHECK(text && *text && strcmp(text, "unknown status") != 0, "status_string(%d)", st);
    }
    CHECK(strcmp(api->status_string((sdpa_status)99), "unknown status") == 0, "status_string(99)");
    CHECK(api->dot_f32(NULL, NULL, 4, NULL) == SDPA_ERR_NULL, "dot(NULL) through the table");
    CHECK(api->set_backend("no-such-backend") == SDPA_ERR_UNSUPPORTED, "set_backend(bogus)");
    CHECK(api->set_exp_mode("no-such-exp") == SDPA_ERR_UNSUPPORTED, "set_exp_mode(bogus)");
}

static sdpa_info_entry info_entry(const sdpa_api *api, sdpa_info_kind kind, size_t i) {
    sdpa_info_entry e;
    memset(&e, 0, sizeof e);
    e.struct_size = sizeof e;
    sdpa_status st = api->info(kind, i, &e);
    CHECK(st == SDPA_OK, "info(%d, %zu): %s", (int)kind, i, api->last_error_detail());
    CHECK(e.name && e.description && e.requires && e.arch && e.reason && e.backend && e.variable,
          "info(%d, %zu) leaves a string NULL", (int)kind, i);
    return e;
}

/* The element types: the header's numbers, the formats' names and sizes, and each one a type
   sdpa_convert takes (1.5 round-trips exactly through every one). */
static void check_types(const sdpa_api *api) {
    static const char *const names[] = {"f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2"};
    static const int64_t bytes[] = {4, 2, 2, 1, 1};
    const size_t n = api->info_count(SDPA_INFO_TYPE);
    CHECK(n == (size_t)SDPA_FP8_E5M2 + 1, "%zu types, not %d", n, (int)SDPA_FP8_E5M2 + 1);
    for (size_t i = 0; i < n && i < 5; i++) {
        const sdpa_info_entry t = info_entry(api, SDPA_INFO_TYPE, i);
        CHECK(t.number[0] == (int64_t)i && strcmp(t.name, names[i]) == 0 && t.number[1] == bytes[i],
              "type %zu: %s, number %lld, %lld bytes", i, t.name, (long long)t.number[0],
              (long long)t.number[1]);
        const float x = 1.5f;
        float y = 0.0f;
        unsigned char mid[8];
        CHECK(api->convert(mid, (sdpa_dtype)i, &x, SDPA_F32, 1) == SDPA_OK &&
                  api->convert(&y, SDPA_F32, mid, (sdpa_dtype)i, 1) == SDPA_OK && y == x,
              "type %s: sdpa_convert round trip of 1.5 gives %g", t.name, y);
    }
}

/* The features the dispatcher reports against the compiler's own CPUID prober, which also asks
 * the OS (XCR0) for the wide registers; the names both know. */
static void check_features(const sdpa_api *api) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    const struct {
        const char *name;
        int present;
    } expect[] = {{"SSE4.1", __builtin_cpu_supports("sse4.1") != 0},
                  {"AVX2", __builtin_cpu_supports("avx2") != 0},
                  {"FMA", __builtin_cpu_supports("fma") != 0},
                  {"AVX-512F", __builtin_cpu_supports("avx512f") != 0},
                  {"AVX512BW", __builtin_cpu_supports("avx512bw") != 0}};
    for (size_t j = 0; j < sizeof expect / sizeof expect[0]; j++) {
        int found = 0;
        for (size_t i = 0; i < api->info_count(SDPA_INFO_FEATURE); i++) {
            sdpa_info_entry f = info_entry(api, SDPA_INFO_FEATURE, i);
            if (strcmp(f.name, expect[j].name) != 0) continue;
            found = 1;
            CHECK(!!(f.flags & SDPA_INFO_PRESENT) == expect[j].present,
                  "feature %s: library says %d, CPUID %d", f.name, !!(f.flags & SDPA_INFO_PRESENT),
                  expect[j].present);
        }
        CHECK(found, "feature %s is not among those the library reports", expect[j].name);
    }
    sdpa_info_entry cpu = info_entry(api, SDPA_INFO_CPU, 0);
    CHECK(*cpu.name && cpu.number[0] > 0, "CPU vendor \"%s\", family %lld", cpu.name,
          (long long)cpu.number[0]);
#else
    (void)api;
#endif
}

/* sdpa_info agrees with the other calls: the backends in sdpa_backend_name's order, runnable
 * exactly where sdpa_backend_supported says so, the active one flagged alone; an add-on in use
 * is on, runnable and of the active backend, at most one per backend; bad arguments fail and
 * leave the entry alone. */
static void check_info(const sdpa_api *api) {
    CHECK(SDPA_API_HAS(api, info) && SDPA_API_HAS(api, info_count), "sdpa_info in the table");
    if (!SDPA_API_HAS(api, info)) return;
    size_t n = 0, active = 0;
    while (api->backend_name(n)) n++;
    CHECK(api->info_count(SDPA_INFO_BACKEND) == n, "info_count(BACKEND) %zu, backend names %zu",
          api->info_count(SDPA_INFO_BACKEND), n);
    for (size_t i = 0; i < n && i < api->info_count(SDPA_INFO_BACKEND); i++) {
        sdpa_info_entry b = info_entry(api, SDPA_INFO_BACKEND, i);
        const char *name = api->backend_name(i);
        CHECK(strcmp(b.name, name) == 0, "backend %zu: %s, not %s", i, b.name, name);
        CHECK(!!(b.flags & SDPA_INFO_RUNNABLE) == api->backend_supported(name),
              "backend %s: runnable flag against backend_supported", name);
        CHECK(!(b.flags & SDPA_INFO_RUNNABLE) || (b.flags & SDPA_INFO_PRESENT),
              "backend %s runnable but not compiled", name);
        CHECK((b.flags & SDPA_INFO_RUNNABLE) || *b.reason, "backend %s not runnable, no reason",
              name);
        const int is_active = strcmp(api->backend(), name) == 0;
        CHECK(!!(b.flags & SDPA_INFO_IN_USE) == is_active, "backend %s: in-use flag", name);
        active += (b.flags & SDPA_INFO_IN_USE) != 0;
    }
    CHECK(active == 1, "%zu backends flagged active", active);
    for (size_t i = 0; i < api->info_count(SDPA_INFO_ADDON); i++) {
        sdpa_info_entry a = info_entry(api, SDPA_INFO_ADDON, i);
        const uint32_t f = a.flags;
        CHECK(*a.name && *a.backend && *a.variable && *a.reason, "add-on %zu: empty field", i);
        CHECK(!(f & SDPA_INFO_IN_USE) ||
                  ((f & SDPA_INFO_ON) && strcmp(a.backend, api->backend()) == 0),
              "add-on %s in use but off or of another backend", a.name);
        CHECK(!(f & SDPA_INFO_ON) || (f & SDPA_INFO_RUNNABLE), "add-on %s on, not runnable",
              a.name);
        CHECK(!(f & SDPA_INFO_RUNNABLE) || (f & SDPA_INFO_PRESENT), "add-on %s runnable, absent",
              a.name);
        for (size_t j = 0; j < i; j++) {
            sdpa_info_entry b = info_entry(api, SDPA_INFO_ADDON, j);
            CHECK(!((f & b.flags & SDPA_INFO_IN_USE) && strcmp(a.backend, b.backend) == 0),
                  "add-ons %s and %s both in use", b.name, a.name);
        }
    }
    check_features(api);
    check_types(api);
    sdpa_info_entry e;
    memset(&e, 0x5a, sizeof e);
    e.struct_size = sizeof e;
    const size_t n_cpu = api->info_count(SDPA_INFO_CPU);
    CHECK(n_cpu == 1 && api->info_count((sdpa_info_kind)99) == 0, "info_count of CPU, of 99");
    CHECK(api->info(SDPA_INFO_CPU, 0, NULL) == SDPA_ERR_NULL, "info(NULL entry)");
    CHECK(api->info((sdpa_info_kind)99, 0, &e) == SDPA_ERR_ARG, "info(kind 99)");
    CHECK(api->info(SDPA_INFO_BACKEND, n, &e) == SDPA_ERR_ARG, "info(backend past the end)");
    CHECK(strstr(api->last_error_detail(), "index"), "detail names the index: %s",
          api->last_error_detail());
    e.struct_size = sizeof e - 1;
    CHECK(api->info(SDPA_INFO_CPU, 0, &e) == SDPA_ERR_ARG, "info(struct_size too small)");
    CHECK(e.flags == 0x5a5a5a5au, "a failed info call wrote the entry");
    printf("sdpa_info: %zu backends, %zu add-ons, %zu features, agreeing\n", n,
           api->info_count(SDPA_INFO_ADDON), api->info_count(SDPA_INFO_FEATURE));
}

/* The kernels on every backend this CPU runs and in both exp modes; leaves the library as it
 * found it. */
static void check_kernels(const sdpa_api *api) {
    char initial[32];
    snprintf(initial, sizeof initial, "%s", api->backend());
    int ran = 0;
    for (size_t b = 0; api->backend_name(b); b++) {
        const char *name = api->backend_name(b);
        if (!api->backend_supported(name)) continue;
        CHECK(api->set_backend(name) == SDPA_OK, "set_backend(%s)", name);
        CHECK(strcmp(api->backend(), name) == 0, "backend() %s after set_backend(%s)",
              api->backend(), name);
        for (int e = 0; e < 2; e++) {
            const char *exp = e ? "sleef" : "fast";
            CHECK(api->set_exp_mode(exp) == SDPA_OK, "set_exp_mode(%s)", exp);
            CHECK(strcmp(api->exp_mode(), exp) == 0, "exp_mode() %s", api->exp_mode());
            for (size_t i = 0; i < N_SIZES; i++) {
                problem p;
                make_problem(&p, SIZES[i], i + 1);
                int bad = run_kernels(api, &p, 0);
                CHECK(bad == 0, "%d wrong results on %s, exp %s, n = %zu", bad, name, exp,
                      SIZES[i]);
            }
        }
        ran++;
    }
    CHECK(ran >= 1 && api->backend_supported("scalar"), "scalar is always supported");
    api->set_exp_mode("fast");
    CHECK(api->set_backend(initial) == SDPA_OK, "restore %s", initial);
    printf("kernels correct through the table on %d backends\n", ran);
}

static int test_load(const char *path) {
    const char *forced = getenv("SDPA_BACKEND");
    char text[4096];
    int lines;
    void *h = open_capturing(path, &lines, text, sizeof text);
    if (!h) {
        printf("FAIL dlopen(%s): %s\n", path, dlerror());
        return 1;
    }
    get_api_fn get = (get_api_fn)(uintptr_t)dlsym(h, "sdpa_get_api");
    const sdpa_api *api = table_of(h);
    if (!api) {
        printf("FAIL sdpa_get_api(%u) returned NULL\n", SDPA_ABI_VERSION);
        return 1;
    }
    check_table(api, get);
    check_info(api);

    /* What SDPA_BACKEND should have done: a name this CPU runs is active and silent; anything
     * else falls back to the best backend with exactly one line on stderr. */
    const char *best = NULL;
    for (size_t b = 0; api->backend_name(b) && !best; b++)
        if (api->backend_supported(api->backend_name(b))) best = api->backend_name(b);
    int honoured =
        forced && *forced && strcmp(forced, "auto") != 0 && api->backend_supported(forced);
    int rejected = forced && *forced && strcmp(forced, "auto") != 0 && !honoured;
    const char *expected = honoured ? forced : best;
    CHECK(strcmp(api->backend(), expected) == 0, "SDPA_BACKEND=%s: active %s, expected %s",
          forced ? forced : "(unset)", api->backend(), expected);
    CHECK(lines == (rejected ? 1 : 0), "SDPA_BACKEND=%s: %d lines on stderr, expected %d: %s",
          forced ? forced : "(unset)", lines, rejected ? 1 : 0, text);
    if (rejected)
        CHECK(strstr(text, forced) && strstr(text, best), "the fallback line names %s and %s: %s",
              forced, best, text);
    /* Set by the emulator tests, which know what the emulated CPU can run. */
    const char *want = getenv("PLUGIN_HOST_EXPECT_BACKEND");
    if (want)
        CHECK(strcmp(api->backend(), want) == 0, "active %s, expected %s", api->backend(), want);
    printf("SDPA_BACKEND=%s -> %s%s%s", forced ? forced : "(unset)", api->backend(),
           rejected ? ", said: " : "\n", rejected ? text : "");

    check_kernels(api);

    /* Unload and load again: the same choice, made afresh. */
    char before[32];
    snprintf(before, sizeof before, "%s", api->backend());
    CHECK(dlclose(h) == 0, "dlclose: %s", dlerror());
    int unloaded = dlopen(path, RTLD_NOW | RTLD_NOLOAD) == NULL;
    h = open_capturing(path, &lines, text, sizeof text);
    if (!h) {
        printf("FAIL second dlopen: %s\n", dlerror());
        return 1;
    }
    api = table_of(h);
    if (api) {
        CHECK(strcmp(api->backend(), before) == 0, "after reload: %s, before: %s", api->backend(),
              before);
        CHECK(lines == (rejected && unloaded ? 1 : 0), "after reload: %d lines on stderr", lines);
        check_kernels(api);
    }
    printf("reloaded (%s): %s\n", unloaded ? "was unloaded" : "stayed mapped",
           api ? api->backend() : "?");
    dlclose(h);
    return failures != 0;
}

/* ---- threads ---- */

enum { N_WORKERS = 8 };

typedef struct shared {
    const sdpa_api *api;
    problem problems[N_SIZES];
    int iterations;
    atomic_int running;
    atomic_int wrong;
    atomic_long calls;
    atomic_long switches;
} shared;

/* The workers keep going until the switcher has switched at least this often, so that calls
 * really overlap switches however the threads are scheduled. */
enum { MIN_SWITCHES = 500 };

static void *worker(void *arg) {
    shared *sh = arg;
    while (atomic_load(&sh->switches) == 0) sched_yield();
    for (long it = 0; it < sh->iterations || atomic_load(&sh->switches) < MIN_SWITCHES; it++) {
        const problem *p = &sh->problems[it % N_SIZES];
        int bad = run_kernels(sh->api, p, 1);
        if (bad) atomic_fetch_add(&sh->wrong, bad);
        atomic_fetch_add(&sh->calls, 5);
    }
    atomic_fetch_sub(&sh->running, 1);
    return NULL;
}

static void *switcher(void *arg) {
    shared *sh = arg;
    long switches = 0;
    do {
        for (size_t b = 0; sh->api->backend_name(b); b++) {
            const char *name = sh->api->backend_name(b);
            if (!sh->api->backend_supported(name)) continue;
            if (sh->api->set_backend(name) != SDPA_OK) atomic_fetch_add(&sh->wrong, 1);
            sh->api->set_exp_mode(switches % 3 ? "fast" : "sleef");
            atomic_store(&sh->switches, ++switches);
        }
        if (sh->api->set_backend("auto") != SDPA_OK) atomic_fetch_add(&sh->wrong, 1);
    } while (atomic_load(&sh->running) > 0);
    return NULL;
}

static int test_threads(const char *path, int iterations) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        printf("FAIL dlopen(%s): %s\n", path, dlerror());
        return 1;
    }
    static shared sh;
    sh.api = table_of(h);
    if (!sh.api) return 1;
    sh.iterations = iterations;
    for (size_t i = 0; i < N_SIZES; i++) make_problem(&sh.problems[i], SIZES[i], 100 + i);
    atomic_store(&sh.running, N_WORKERS);
    pthread_t workers[N_WORKERS], sw;
    for (int i = 0; i < N_WORKERS; i++) pthread_create(&workers[i], NULL, worker, &sh);
    pthread_create(&sw, NULL, switcher, &sh);
    for (int i = 0; i < N_WORKERS; i++) pthread_join(workers[i], NULL);
    pthread_join(sw, NULL);
    CHECK(atomic_load(&sh.wrong) == 0, "%d wrong results or failed switches",
          atomic_load(&sh.wrong));
    printf("%d threads, %ld kernel calls through the table, %ld backend switches meanwhile\n",
           N_WORKERS, atomic_load(&sh.calls), atomic_load(&sh.switches));
    dlclose(h);
    return failures != 0;
}

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[2], "load") == 0) return test_load(argv[1]);
    if (argc >= 3 && strcmp(argv[2], "threads") == 0)
        return test_threads(argv[1], argc >= 4 ? atoi(argv[3]) : 2000);
    fprintf(stderr, "usage: %s LIBRARY load|threads [ITERATIONS]\n", argv[0]);
    return 2;
}
