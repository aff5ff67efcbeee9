/* Many threads at once: every entry point (attention: a causal head, and GQA with a mask) from 8
 * threads on shared read-only inputs while another thread switches the exp mode (and, in the second
 * test, the backend) in a loop. Every result must be bit-identical to a single-threaded run: on a
 * fixed backend, the same bits as that backend's run (softmax and attention: its "fast" or its
 * "sleef" run); while backends switch, the bits of one of the backends this CPU runs (a call
 * finishes on the backend it started on). Failures in threads are counted and reported by the main
 * thread (Criterion asserts only there). The first-call race in a fresh process is
 * tests/race_init.c.
 *
 * Criterion's runner cannot start under ThreadSanitizer (its worker arena is mapped where TSan
 * keeps its shadow), so the same file builds with -DTHREADS_STANDALONE into a plain program
 * (threads_standalone) that runs both tests on every backend; scripts/test-sanitizers runs that
 * one under TSan. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "checks.h"
#include "common.h"
#include "tsan.h"

#ifdef THREADS_STANDALONE
#include <stdlib.h>
#define REQUIRE(cond, ...)                                                                         \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)
#else
#define REQUIRE(cond, ...) cr_assert(cond, __VA_ARGS__)
#endif

#define N_WORKERS 8
/* per worker; a fortieth under emulation (the races are native's and TSan's job), a tenth under
   TSan (tsan.h) */
#define ITERATIONS 1000
#define N          1000
#define N_KEYS     48
#define D          64
/* attention: one causal head, and GQA (4 query heads on 2 kv heads) with a mask */
#define LQ 24
#define LK 40
#define DA 32
#define HQ 4
#define HK 2

/* The shared inputs, written once before any thread starts. */
static float a[N], b[N], x[N], y_soft[N], dy[N], q[D], k[N_KEYS * D];
static float aq[HQ * LQ * DA], ak[HK * LK * DA], av[HK * LK * DA], amask[LQ * LK];
static sdpa_mha_desc adesc;

typedef struct results {
    float dot;
    float scale[N], softmax[N], backward[N], scores[N_KEYS];
    float attention[LQ * DA], mha[HQ * LQ * DA];
} results;

static void make_inputs(void) {
    rng r = rng_seed(300);
    fill_uniform(&r, a, N, -2.0f, 2.0f);
    fill_uniform(&r, b, N, -2.0f, 2.0f);
    fill_uniform(&r, x, N, -8.0f, 8.0f);
    fill_uniform(&r, dy, N, -1.0f, 1.0f);
    fill_uniform(&r, q, D, -1.0f, 1.0f);
    fill_uniform(&r, k, N_KEYS * D, -1.0f, 1.0f);
    REQUIRE(sdpa_softmax_f32(y_soft, x, N, 1.0f) == SDPA_OK, "softmax");
    fill_uniform(&r, aq, HQ * LQ * DA, -1.0f, 1.0f);
    fill_uniform(&r, ak, HK * LK * DA, -1.0f, 1.0f);
    fill_uniform(&r, av, HK * LK * DA, -1.0f, 1.0f);
    fill_uniform(&r, amask, LQ * LK, -2.0f, 2.0f);
    for (size_t i = 0; i < LQ * LK; i += 5) amask[i] = -INFINITY;
    REQUIRE(sdpa_mha_desc_dense(&adesc, 1, HQ, HK, LQ, LK, DA, DA, SDPA_DEFAULT_SCALE,
                                SDPA_CAUSAL) == SDPA_OK,
            "desc");
    REQUIRE(sdpa_mha_desc_set_mask(&adesc, amask, 0, 0, LK) == SDPA_OK, "mask");
}

/* Every entry point once; 0 when every status was OK. */
static int compute_all(results *out) {
    int bad = 0;
    bad |= sdpa_dot_f32(a, b, N, &out->dot) != SDPA_OK;
    bad |= sdpa_scale_f32(out->scale, a, N, 0.3f) != SDPA_OK;
    bad |= sdpa_softmax_f32(out->softmax, x, N, 0.5f) != SDPA_OK;
    bad |= sdpa_softmax_backward_f32(out->backward, y_soft, dy, N, 0.5f) != SDPA_OK;
    bad |= sdpa_scores_f32(out->scores, q, k, N_KEYS, D, D, 0.125f) != SDPA_OK;
    bad |= sdpa_attention_f32(out->attention, aq, ak, av, LQ, LK, DA, DA, 0.2f, SDPA_CAUSAL) !=
           SDPA_OK;
    bad |= sdpa_mha_f32(&adesc, out->mha, aq, ak, av) != SDPA_OK;
    return bad;
}

static int same(const void *p, const void *q_, size_t bytes) { return memcmp(p, q_, bytes) == 0; }

/* Expected bits: one run per (backend, exp mode) this CPU supports. */
typedef struct expected {
    size_t count;
    results run[8][2]; /* [backend][exp mode] */
} expected;

static const char *const EXP_MODES[] = {"fast", "sleef"};

static void record(expected *e, const char *backend) {
    const char *saved = sdpa_backend();
    REQUIRE(sdpa_set_backend(backend) == SDPA_OK, "set_backend %s", backend);
    for (size_t m = 0; m < 2; m++) {
        REQUIRE(sdpa_set_exp_mode(EXP_MODES[m]) == SDPA_OK, "exp mode");
        REQUIRE(compute_all(&e->run[e->count][m]) == 0, "single-threaded run");
    }
    sdpa_set_exp_mode("fast");
    sdpa_set_backend(saved);
    e->count++;
}

/* Each output matches some recorded backend (and, for softmax, exp mode), independently:
 * the backend may change between two calls of one compute_all. */
static const char *mismatch(const expected *e, const results *got) {
    int dot = 0, scale = 0, softmax = 0, backward = 0, scores = 0, attention = 0, mha = 0;
    for (size_t i = 0; i < e->count; i++) {
        const results *r = &e->run[i][0];
        dot |= same(&got->dot, &r->dot, sizeof r->dot);
        scale |= same(got->scale, r->scale, sizeof r->scale);
        backward |= same(got->backward, r->backward, sizeof r->backward);
        scores |= same(got->scores, r->scores, sizeof r->scores);
        for (size_t m = 0; m < 2; m++) {
            softmax |= same(got->softmax, e->run[i][m].softmax, sizeof got->softmax);
            attention |= same(got->attention, e->run[i][m].attention, sizeof got->attention);
            mha |= same(got->mha, e->run[i][m].mha, sizeof got->mha);
        }
    }
    return !dot         ? "dot"
           : !scale     ? "scale"
           : !softmax   ? "softmax"
           : !backward  ? "softmax_backward"
           : !scores    ? "scores"
           : !attention ? "attention"
           : !mha       ? "mha"
                        : NULL;
}

typedef struct shared {
    const expected *want;
    atomic_int failures;
    atomic_int workers_left;
    int switch_backends;
    pthread_barrier_t start;
    pthread_mutex_t lock;
    char first_failure[WHY_LEN];
} shared;

static void fail(shared *s, const char *what) {
    if (atomic_fetch_add(&s->failures, 1) == 0) {
        pthread_mutex_lock(&s->lock);
        snprintf(s->first_failure, WHY_LEN, "%s", what);
        pthread_mutex_unlock(&s->lock);
    }
}

static void *worker(void *arg) {
    shared *s = arg;
    static _Thread_local results got; /* large: not on a thread's stack */
    pthread_barrier_wait(&s->start);
    const int iterations = test_quick() ? ITERATIONS / 40 : ITERATIONS / (TSAN_BUILD ? 10 : 1);
    for (int it = 0; it < iterations; it++) {
        if (compute_all(&got)) fail(s, "a call returned an error");
        const char *bad = mismatch(s->want, &got);
        if (bad) fail(s, bad);
        const char *name = sdpa_backend();
        if (!name || !sdpa_backend_supported(name)) fail(s, "sdpa_backend() names no backend");
    }
    atomic_fetch_sub(&s->workers_left, 1);
    return NULL;
}

/* Flips the exp mode, and the backend when asked, until every worker is done. */
static void *switcher(void *arg) {
    shared *s = arg;
    pthread_barrier_wait(&s->start);
    for (size_t i = 0; atomic_load(&s->workers_left) > 0; i++) {
        if (sdpa_set_exp_mode(EXP_MODES[i % 2]) != SDPA_OK) fail(s, "set_exp_mode");
        if (s->switch_backends) {
            const char *name = sdpa_backend_name(i % 6);
            name = name ? name : "auto";
            sdpa_status st = sdpa_set_backend(name);
            if (st != (sdpa_backend_supported(name) || strcmp(name, "auto") == 0
                           ? SDPA_OK
                           : SDPA_ERR_UNSUPPORTED))
                fail(s, "set_backend status");
        }
    }
    return NULL;
}

static void run_threads(const expected *want, int switch_backends) {
    shared s = {.want = want, .switch_backends = switch_backends};
    atomic_init(&s.failures, 0);
    atomic_init(&s.workers_left, N_WORKERS);
    pthread_barrier_init(&s.start, NULL, N_WORKERS + 1);
    pthread_mutex_init(&s.lock, NULL);
    pthread_t threads[N_WORKERS + 1];
    for (int i = 0; i < N_WORKERS; i++)
        REQUIRE(pthread_create(&threads[i], NULL, worker, &s) == 0, "pthread_create");
    REQUIRE(pthread_create(&threads[N_WORKERS], NULL, switcher, &s) == 0, "pthread_create");
    for (int i = 0; i <= N_WORKERS; i++) pthread_join(threads[i], NULL);
    pthread_barrier_destroy(&s.start);
    pthread_mutex_destroy(&s.lock);
    sdpa_set_exp_mode("fast");
    REQUIRE(atomic_load(&s.failures) == 0, "%d failures; first: %s", atomic_load(&s.failures),
            s.first_failure);
}

static expected want; /* large: static */

/* One backend, results checked against the reference once, then raced. */
static void fixed_backend(void) {
    make_inputs();
    want.count = 0;
    record(&want, sdpa_backend());
    char why[WHY_LEN] = "";
    REQUIRE(!check_dot(want.run[0][0].dot, a, b, N, why), "%s", why);
    REQUIRE(!check_softmax(want.run[0][0].softmax, x, N, 0.5f, why), "%s", why);
    REQUIRE(!check_softmax(want.run[0][1].softmax, x, N, 0.5f, why), "%s", why);
    REQUIRE(!check_backward(want.run[0][0].backward, y_soft, dy, N, 0.5f, why), "%s", why);
    REQUIRE(!check_scores(want.run[0][0].scores, q, k, N_KEYS, D, D, 0.125f, why), "%s", why);
    for (size_t m = 0; m < 2; m++) {
        const results *r = &want.run[0][m];
        REQUIRE(!check_attention(r->attention, DA, aq, DA, ak, DA, av, DA, NULL, 0, LQ, LK, DA, DA,
                                 0.2f, 1, why),
                "%s", why);
        for (size_t h = 0; h < HQ; h++)
            REQUIRE(!check_attention(r->mha + h * LQ * DA, DA, aq + h * LQ * DA, DA,
                                     ak + h / (HQ / HK) * LK * DA, DA, av + h / (HQ / HK) * LK * DA,
                                     DA, amask, LK, LQ, LK, DA, DA, 0.0f, 1, why),
                    "%s", why);
    }
    run_threads(&want, 0);
}

static void switching_backends(void) {
    make_inputs();
    want.count = 0;
    for (size_t i = 0; sdpa_backend_name(i); i++)
        if (sdpa_backend_supported(sdpa_backend_name(i))) record(&want, sdpa_backend_name(i));
    run_threads(&want, 1);
    REQUIRE(sdpa_set_backend("auto") == SDPA_OK, "auto");
}

#ifndef THREADS_STANDALONE
BACKEND_TEST(threads, fixed_backend_bit_identical_while_exp_mode_flips) { fixed_backend(); }

Test(threads, bit_identical_to_some_backend_while_backends_switch) { switching_backends(); }
#else
int main(void) {
    for (size_t i = 0; sdpa_backend_name(i); i++) {
        const char *name = sdpa_backend_name(i);
        if (!sdpa_backend_supported(name)) continue;
        REQUIRE(sdpa_set_backend(name) == SDPA_OK, "set_backend %s", name);
        fixed_backend();
        printf("threads: %s ok\n", name);
    }
    sdpa_set_backend("auto");
    switching_backends();
    printf("threads: switching backends ok\n");
    return 0;
}
#endif
