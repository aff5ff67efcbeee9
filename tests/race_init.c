/* The first calls into a freshly loaded library, from 8 threads at once: a process that has not
 * touched sdpa (this program is not linked with it) starts its threads, lets them go together,
 * and each dlopens libsdpa (argv[1]) and calls every kernel entry point straight away.
 *
 * What is raced: concurrent dlopen of the library, its load-time constructor (the backend
 * choice), and the first calls, which read the published kernel table. The loader runs
 * constructors under its own lock, so two threads never run sdpa's init at the same moment
 * through dlopen; the other path into init (a call that arrives before the constructor, from
 * another library's constructor) goes through pthread_once and is not raced here.
 * Results must be identical in every thread and right against a double-precision reference.
 * Prints one line and exits 0 on success. */
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "bounds.h"
#include "sdpa.h"

#define N_THREADS 8
#define N         300

typedef sdpa_status (*softmax_fn)(float *, const float *, size_t, float);
typedef sdpa_status (*dot_fn)(const float *, const float *, size_t, float *);
typedef const char *(*backend_fn)(void);

static const char *library;
static pthread_barrier_t start;
static float x[N];

typedef struct outcome {
    int ok;
    const char *backend;
    float dot, y[N];
} outcome;

static void *first_call(void *arg) {
    outcome *o = arg;
    pthread_barrier_wait(&start);
    void *h = dlopen(library, RTLD_NOW | RTLD_LOCAL);
    if (!h) return NULL;
    softmax_fn softmax = (softmax_fn)dlsym(h, "sdpa_softmax_f32");
    dot_fn dot = (dot_fn)dlsym(h, "sdpa_dot_f32");
    backend_fn backend = (backend_fn)dlsym(h, "sdpa_backend");
    if (softmax && dot && backend) {
        o->ok = softmax(o->y, x, N, 0.25f) == SDPA_OK && dot(x, x, N, &o->dot) == SDPA_OK;
        o->backend = backend();
    }
    /* the handle stays open: the library is unloaded at exit, after every thread is done */
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s path/to/libsdpa.so\n", argv[0]);
        return 2;
    }
    library = argv[1];
    for (size_t i = 0; i < N; i++) x[i] = (float)((i * 37) % 101) * 0.1f - 5.0f;
    static outcome out[N_THREADS];
    pthread_t threads[N_THREADS];
    pthread_barrier_init(&start, NULL, N_THREADS);
    for (int i = 0; i < N_THREADS; i++) pthread_create(&threads[i], NULL, first_call, &out[i]);
    for (int i = 0; i < N_THREADS; i++) pthread_join(threads[i], NULL);

    /* the reference: softmax of 0.25 x and x . x in double */
    double m = -INFINITY, sum = 0.0, dot = 0.0;
    /* a compare, not fmax: gcc 12 for aarch64 dies vectorising an fmax reduction (ICE in
       vect_transform_reduction) */
    for (size_t i = 0; i < N; i++) m = 0.25f * x[i] > m ? 0.25f * x[i] : m;
    for (size_t i = 0; i < N; i++) sum += exp((double)(0.25f * x[i]) - m);
    for (size_t i = 0; i < N; i++) dot += (double)x[i] * x[i];
    int failures = 0;
    for (int t = 0; t < N_THREADS; t++) {
        if (!out[t].ok) {
            fprintf(stderr, "thread %d: dlopen, dlsym or a call failed (%s)\n", t, dlerror());
            failures++;
            continue;
        }
        if (strcmp(out[t].backend, out[0].backend) != 0 || out[t].dot != out[0].dot ||
            memcmp(out[t].y, out[0].y, sizeof out[t].y) != 0) {
            fprintf(stderr, "thread %d: results differ from thread 0\n", t);
            failures++;
        }
        if (fabs(out[t].dot - dot) > bound_dot(dot)) failures++;
        for (size_t i = 0; i < N; i++) {
            double want = exp((double)(0.25f * x[i]) - m) / sum;
            if (fabs(out[t].y[i] - want) > bound_softmax_rel(N) * want) {
                fprintf(stderr, "thread %d: y[%zu] = %.9g, want %.9g\n", t, i, out[t].y[i], want);
                failures++;
                break;
            }
        }
    }
    printf("race_init: %d threads, first calls on %s: %s\n", N_THREADS,
           out[0].backend ? out[0].backend : "?", failures ? "FAILED" : "ok");
    return failures != 0;
}
