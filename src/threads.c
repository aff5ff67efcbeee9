/* Threads: the process-wide thread setting, the built-in pool, a host's parallel_for, and the
 * split-KV workspace.
 *
 * The pool grows to the largest sdpa_num_threads() - 1 a call has asked for and never shrinks; a
 * job uses the first n - 1 workers for a count of n, and the calling thread is the last one.
 * One call uses the pool at a time: a call that finds it taken (trylock) runs on its own thread,
 * so the pool never runs more threads than asked and no call waits for another. A job is
 * published as one atomic word (its generation and how many workers take part); tasks are
 * claimed from a shared counter, so a worker that wakes late simply finds fewer left. A worker
 * that took part in the last job spins on the word for a bounded number of pause instructions
 * (SPIN_ROUNDS, some tens of microseconds), then sleeps on a condition variable: an idle pool
 * costs no CPU. The workers are joined and the memory freed by the library's destructor (exit or
 * dlclose). In a child of fork() the workers do not exist: the child forgets them and starts a
 * new pool at its first parallel call. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "sizes.h"
#include "threads.h"

/* Largest sdpa_set_num_threads; also the cap of the default. */
#define MAX_THREADS 1024
/* pause instructions an idle thread spins before it sleeps: about 10 to 100 us depending on the
   CPU's pause latency, long enough to catch the next call of a loop of attention calls */
#define SPIN_ROUNDS 2048

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* ---- the thread setting ---- */

static _Atomic size_t requested_threads; /* sdpa_set_num_threads; 0: the default */
static _Atomic size_t default_threads;   /* set once by init; 0 before */
static _Atomic int shut_down;            /* the destructor ran: every call runs alone */
static _Thread_local int in_task;        /* this thread runs one of sdpa's tasks (or is a worker) */

/* ---- the host's scheduler ---- */

static pthread_mutex_t host_lock = PTHREAD_MUTEX_INITIALIZER;
static sdpa_parallel_for_fn host_fn; /* under host_lock */
static void *host_ctx;

/* ---- the pool ---- */

#define ACTIVE_BITS          16 /* MAX_THREADS - 1 workers fit */
#define JOB_GENERATION(word) ((word) >> ACTIVE_BITS)
#define JOB_ACTIVE(word)     ((size_t)((word) & ((1u << ACTIVE_BITS) - 1)))

typedef struct pool {
    pthread_mutex_t run;  /* held by the one call that uses the pool */
    pthread_mutex_t lock; /* guards stop, sleepers and the two condition variables */
    pthread_cond_t wake, done;
    pthread_t *threads;
    size_t n_threads; /* workers running; changed only by the holder of run */
    size_t tried;     /* the largest size asked for (n_threads is less when creation failed) */
    size_t sleepers;  /* workers waiting on wake */
    int stop;
    /* the job's generation (one more per job) << ACTIVE_BITS | the workers it uses: worker i
       takes part when i < active. One word, so that a worker never pairs a generation with
       another job's count. Stored under lock. */
    _Atomic uint64_t job;
    /* the job, written by the holder of run before it stores job */
    sdpa_task_fn task;
    void *arg;
    size_t n_tasks;
    _Atomic size_t next; /* next task index to claim */
    _Atomic size_t busy; /* workers not yet done with the job */
} pool;

static pool P = {.run = PTHREAD_MUTEX_INITIALIZER,
                 .lock = PTHREAD_MUTEX_INITIALIZER,
                 .wake = PTHREAD_COND_INITIALIZER,
                 .done = PTHREAD_COND_INITIALIZER};

/* ---- the split-KV workspace ---- */

static pthread_mutex_t workspace_lock = PTHREAD_MUTEX_INITIALIZER;
static float *workspace;
static size_t workspace_floats;

/* ---- init, fork, unload ---- */

static size_t cpus_available(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return (size_t)n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN); /* more CPUs than a cpu_set_t holds */
    return n > 0 ? (size_t)n : 1;
}

/* The child has only the thread that called fork: the workers' slots are forgotten (a new pool
   starts at the first parallel call) and every lock starts free, whatever the parent's threads
   were doing. */
static void after_fork_in_child(void) {
    pthread_mutex_init(&P.run, NULL);
    pthread_mutex_init(&P.lock, NULL);
    pthread_cond_init(&P.wake, NULL);
    pthread_cond_init(&P.done, NULL);
    P.n_threads = 0;
    P.tried = 0;
    P.sleepers = 0;
    P.stop = 0;
    pthread_mutex_init(&host_lock, NULL);
    pthread_mutex_init(&workspace_lock, NULL);
}

/* SDPA_NUM_THREADS as a thread count: only a plain decimal from 0 to MAX_THREADS (0: the
   default), digits alone; no sign, space or base prefix, which strtoull would accept and wrap
   ("-18446744073709551615" is 1 to it). -1 for anything else. */
static long parse_thread_count(const char *s) {
    long v = 0;
    if (!*s) return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9') return -1;
        v = v * 10 + (*s - '0');
        if (v > MAX_THREADS) return -1;
    }
    return v;
}

static void init_once(void) {
    size_t n = cpus_available();
    if (n > MAX_THREADS) n = MAX_THREADS;
    const char *env = getenv("SDPA_NUM_THREADS");
    if (env && *env) {
        const long v = parse_thread_count(env);
        if (v < 0)
            fprintf(stderr,
                    "sdpa: SDPA_NUM_THREADS=%s is not a decimal thread count from 0 to %d; "
                    "using the CPUs available, %zu\n",
                    env, MAX_THREADS, n);
        else if (v)
            n = (size_t)v;
    }
    atomic_store_explicit(&default_threads, n, memory_order_release);
    pthread_atfork(NULL, NULL, after_fork_in_child);
}

static void threads_init(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, init_once);
}

__attribute__((constructor)) static void threads_load(void) { threads_init(); }

/* Stops and joins every worker; the caller holds P.run. */
static void pool_stop(void) {
    pthread_mutex_lock(&P.lock);
    P.stop = 1;
    pthread_cond_broadcast(&P.wake);
    pthread_mutex_unlock(&P.lock);
    for (size_t i = 0; i < P.n_threads; i++) pthread_join(P.threads[i], NULL);
    P.n_threads = 0;
    P.stop = 0;
}

/* At exit or dlclose: the workers must not outlive the code they run. A call still running on
   another thread finishes first (the destructor waits for the pool); later calls run alone. */
__attribute__((destructor)) static void threads_unload(void) {
    atomic_store(&shut_down, 1);
    pthread_mutex_lock(&P.run);
    pool_stop();
    free(P.threads);
    P.threads = NULL;
    pthread_mutex_unlock(&P.run);
    pthread_mutex_lock(&workspace_lock);
    free(workspace);
    workspace = NULL;
    workspace_floats = 0;
    pthread_mutex_unlock(&workspace_lock);
}

/* ---- the pool's work ---- */

static void claim_tasks(void) {
    const size_t n = P.n_tasks;
    for (size_t i; (i = atomic_fetch_add_explicit(&P.next, 1, memory_order_relaxed)) < n;)
        P.task(P.arg, i);
}

typedef struct worker_start {
    size_t index;
    uint64_t generation; /* the pool's when the worker was created: no job in flight */
} worker_start;

static void *worker(void *start) {
    in_task = 1; /* a call from inside a task runs on this thread */
    const size_t index = ((worker_start *)start)->index;
    uint64_t seen = ((worker_start *)start)->generation;
    free(start);
    int spin_first = 1; /* spin only after a job it took part in: more are likely to follow */
    for (;;) {
        uint64_t word = atomic_load_explicit(&P.job, memory_order_acquire);
        for (int spin = 0; spin_first && JOB_GENERATION(word) == seen && spin < SPIN_ROUNDS;
             spin++) {
            cpu_relax();
            word = atomic_load_explicit(&P.job, memory_order_acquire);
        }
        if (JOB_GENERATION(word) == seen) {
            pthread_mutex_lock(&P.lock);
            P.sleepers++;
            while (JOB_GENERATION(word = atomic_load_explicit(&P.job, memory_order_acquire)) ==
                       seen &&
                   !P.stop)
                pthread_cond_wait(&P.wake, &P.lock);
            P.sleepers--;
            const int stop = P.stop && JOB_GENERATION(word) == seen;
            pthread_mutex_unlock(&P.lock);
            if (stop) return NULL;
        }
        seen = JOB_GENERATION(word);
        spin_first = index < JOB_ACTIVE(word);
        if (!spin_first) continue; /* a job for fewer threads than the pool has */
        claim_tasks();
        if (atomic_fetch_sub_explicit(&P.busy, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&P.lock);
            pthread_cond_signal(&P.done);
            pthread_mutex_unlock(&P.lock);
        }
    }
}

/* Grows the pool to `want` workers (the caller holds P.run); fewer when memory or threads run
   out, and then no new attempt until a larger size is asked for. It never shrinks: a job for
   fewer threads leaves the others asleep, so a host that changes the count pays for no thread
   creation after the first time. */
static void pool_grow(size_t want) {
    if (want <= P.n_threads || want <= P.tried) return;
    P.tried = want;
    pthread_t *threads = realloc(P.threads, want * sizeof *threads);
    if (!threads) return;
    P.threads = threads;
    /* workers take no signals: the host's handlers run on the host's threads */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    const uint64_t g = JOB_GENERATION(atomic_load_explicit(&P.job, memory_order_relaxed));
    while (P.n_threads < want) {
        worker_start *start = malloc(sizeof *start);
        if (!start) break;
        start->index = P.n_threads;
        start->generation = g;
        if (pthread_create(&P.threads[P.n_threads], NULL, worker, start) != 0) {
            free(start);
            break;
        }
        P.n_threads++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* The job on the pool with the caller as one more thread; 0, having run nothing, when the pool
   is taken or has no worker. */
static int pool_run(sdpa_task_fn task, void *arg, size_t n_tasks, size_t threads) {
    if (pthread_mutex_trylock(&P.run) != 0) return 0;
    pool_grow(threads - 1);
    const size_t active = threads - 1 < P.n_threads ? threads - 1 : P.n_threads;
    if (active == 0) {
        pthread_mutex_unlock(&P.run);
        return 0;
    }
    P.task = task;
    P.arg = arg;
    P.n_tasks = n_tasks;
    atomic_store_explicit(&P.next, 0, memory_order_relaxed);
    atomic_store_explicit(&P.busy, active, memory_order_relaxed);
    pthread_mutex_lock(&P.lock);
    const uint64_t g = JOB_GENERATION(atomic_load_explicit(&P.job, memory_order_relaxed)) + 1;
    atomic_store_explicit(&P.job, g << ACTIVE_BITS | active, memory_order_release);
    if (P.sleepers) pthread_cond_broadcast(&P.wake);
    pthread_mutex_unlock(&P.lock);

    in_task = 1;
    claim_tasks();
    in_task = 0;

    for (int spin = 0; atomic_load_explicit(&P.busy, memory_order_acquire) && spin < SPIN_ROUNDS;
         spin++)
        cpu_relax();
    if (atomic_load_explicit(&P.busy, memory_order_acquire)) {
        pthread_mutex_lock(&P.lock);
        while (atomic_load_explicit(&P.busy, memory_order_acquire))
            pthread_cond_wait(&P.done, &P.lock);
        pthread_mutex_unlock(&P.lock);
    }
    pthread_mutex_unlock(&P.run);
    return 1;
}

/* ---- what the driver calls ---- */

size_t sdpa_threads_for_call(void) {
    if (in_task || atomic_load_explicit(&shut_down, memory_order_relaxed)) return 1;
    return sdpa_num_threads();
}

typedef struct host_job {
    sdpa_task_fn task;
    void *arg;
} host_job;

/* A task as the host runs it, on whatever thread, flagged so that calls inside it run there. */
static void host_task(void *job, size_t index) {
    const host_job *j = job;
    const int was = in_task;
    in_task = 1;
    j->task(j->arg, index);
    in_task = was;
}

void sdpa_parallel_run(sdpa_task_fn task, void *arg, size_t n_tasks, size_t threads) {
    if (threads > 1 && n_tasks > 1) {
        pthread_mutex_lock(&host_lock);
        const sdpa_parallel_for_fn fn = host_fn;
        void *ctx = host_ctx;
        pthread_mutex_unlock(&host_lock);
        if (fn) {
            host_job j = {task, arg};
            fn(ctx, host_task, &j, n_tasks);
            return;
        }
        if (pool_run(task, arg, n_tasks, threads)) return;
    }
    const int was = in_task;
    in_task = 1;
    for (size_t i = 0; i < n_tasks; i++) task(arg, i);
    in_task = was;
}

float *sdpa_workspace_acquire(size_t n_floats) {
    if (atomic_load_explicit(&shut_down, memory_order_relaxed) ||
        pthread_mutex_trylock(&workspace_lock) != 0)
        return NULL;
    if (n_floats > workspace_floats) {
        void *p = NULL;
        if (n_floats > SDPA_MAX_FLOATS || posix_memalign(&p, 64, n_floats * sizeof(float))) {
            pthread_mutex_unlock(&workspace_lock);
            return NULL;
        }
        free(workspace);
        workspace = p;
        workspace_floats = n_floats;
    }
    return workspace;
}

void sdpa_workspace_release(void) { pthread_mutex_unlock(&workspace_lock); }

/* ---- public ---- */

SDPA_API sdpa_status sdpa_set_num_threads(size_t n) {
    if (n > MAX_THREADS)
        return sdpa_fail(SDPA_ERR_ARG, "n (%zu) is above %d threads", n, MAX_THREADS);
    atomic_store_explicit(&requested_threads, n, memory_order_relaxed);
    return SDPA_OK;
}

SDPA_API size_t sdpa_num_threads(void) {
    const size_t n = atomic_load_explicit(&requested_threads, memory_order_relaxed);
    if (n) return n;
    size_t d = atomic_load_explicit(&default_threads, memory_order_acquire);
    if (__builtin_expect(d == 0, 0)) { /* a call before the constructor */
        threads_init();
        d = atomic_load_explicit(&default_threads, memory_order_acquire);
    }
    return d;
}

SDPA_API sdpa_status sdpa_set_parallel_for(sdpa_parallel_for_fn fn, void *ctx) {
    pthread_mutex_lock(&host_lock);
    host_fn = fn;
    host_ctx = fn ? ctx : NULL;
    pthread_mutex_unlock(&host_lock);
    return SDPA_OK;
}
