/* The threaded driver under concurrency, as a plain program (Criterion's runner cannot start under
 * ThreadSanitizer; scripts/test-sanitizers runs this one under TSan):
 *   - several host threads call at once, each result bitwise the 1-thread one (sdpa_mha, and a
 *     paged batch whose short decodes run side by side, one a pool thread);
 *   - the same while another thread changes the thread count and switches a host parallel_for
 *     on and off;
 *   - fork() while the pool exists and another thread is calling: the child calls at once, gets
 *     the same bits and does not hang (an alarm turns a hang into a failure);
 *   - SDPA_EXPECT_THREADS=n: sdpa_num_threads() at start is n (the test sets SDPA_NUM_THREADS).
 * The fork part is skipped under qemu-user (SDPA_TEST_QUICK), which cannot run it.
 * Exit status 0 when everything holds; the first failure is printed. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sdpa.h"
#include "tsan.h"

#define REQUIRE(cond, ...)                                                                         \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "parallel_stress: " __VA_ARGS__);                                      \
            fputc('\n', stderr);                                                                   \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define N_CALLERS 4
#define ROUNDS    12

/* Three problems: GQA decode over 3000 keys with a mask and lse (split-KV), causal prefill, and
   GQA decode over an f16 K/V cache (split-KV, each task widening into tiles of its own). */
typedef struct problem {
    sdpa_mha_desc desc;
    float *q, *mask;
    void *k, *v; /* of desc.kv_type */
    size_t n_out, n_lse;
    float *want, *want_lse; /* the 1-thread bits */
} problem;

static problem A, B, C;

static uint64_t seed = 12345;
static float next_float(void) { /* deterministic, in [-1, 1) */
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(seed >> 11) * 0x1p-53 * 2.0 - 1.0);
}

static float *filled(size_t n) {
    float *x = malloc(n * sizeof(float));
    REQUIRE(x, "out of memory");
    for (size_t i = 0; i < n; i++) x[i] = next_float();
    return x;
}

static void make(problem *p, size_t hq, size_t hk, size_t lq, size_t lk, size_t d, uint32_t flags,
                 int masked, sdpa_dtype kv_type) {
    REQUIRE(sdpa_mha_desc_dense(&p->desc, 1, hq, hk, lq, lk, d, d, 0.0f, flags) == SDPA_OK, "desc");
    p->desc.kv_type = kv_type;
    p->q = filled(hq * lq * d);
    p->k = filled(hk * lk * d);
    p->v = filled(hk * lk * d);
    if (kv_type != SDPA_F32) {
        const size_t n = hk * lk * d;
        void *k16 = malloc(n * 2), *v16 = malloc(n * 2);
        REQUIRE(k16 && v16, "out of memory");
        REQUIRE(sdpa_convert(k16, kv_type, p->k, SDPA_F32, n) == SDPA_OK, "convert");
        REQUIRE(sdpa_convert(v16, kv_type, p->v, SDPA_F32, n) == SDPA_OK, "convert");
        free(p->k);
        free(p->v);
        p->k = k16;
        p->v = v16;
    }
    p->mask = NULL;
    if (masked) {
        p->mask = filled(lq * lk);
        for (size_t j = 0; j < lq * lk; j += 7) p->mask[j] = -INFINITY;
        sdpa_mha_desc_set_mask(&p->desc, p->mask, 0, 0, lk);
    }
    p->n_out = hq * lq * d;
    p->n_lse = hq * lq;
    p->desc.lse_stride[0] = hq * lq;
    p->desc.lse_stride[1] = lq;
    p->want = malloc(p->n_out * sizeof(float));
    p->want_lse = malloc(p->n_lse * sizeof(float));
    REQUIRE(p->want && p->want_lse, "out of memory");
    sdpa_mha_desc desc = p->desc;
    desc.lse = p->want_lse;
    REQUIRE(sdpa_mha(&desc, p->want, p->q, p->k, p->v) == SDPA_OK, "1-thread run");
}

static void release(problem *p) {
    free(p->q);
    free(p->k);
    free(p->v);
    free(p->mask);
    free(p->want);
    free(p->want_lse);
}

/* One call into out and lse (the caller's, n_out and n_lse floats); 0 when the bits match. */
static int call_matches(const problem *p, float *out, float *lse) {
    sdpa_mha_desc desc = p->desc;
    desc.lse = lse;
    if (sdpa_mha(&desc, out, p->q, p->k, p->v) != SDPA_OK) return 0;
    return memcmp(out, p->want, p->n_out * sizeof(float)) == 0 &&
           memcmp(lse, p->want_lse, p->n_lse * sizeof(float)) == 0;
}

/* A paged batch over an f16 cache in blocks of 16, placed in the pool in reverse order: short
   decodes that each take one thread, and sequences (a long decode, a 40-row prefill) that take
   every thread. */
#define PAGED_SEQS   6
#define PAGED_BLOCK  16
#define PAGED_HQ     8
#define PAGED_HKV    2
#define PAGED_D      64
#define PAGED_STRIDE 190 /* table entries a sequence: 3000 keys in blocks of 16 */
static const int32_t PAGED_ROWS[PAGED_SEQS] = {1, 1, 40, 1, 1, 1};
static const int32_t PAGED_KEYS[PAGED_SEQS] = {40, 3000, 600, 100, 7, 64};

typedef struct paged_problem {
    sdpa_batch batch;
    sdpa_kv_cache cache;
    int32_t q_start[PAGED_SEQS + 1], table[PAGED_SEQS * PAGED_STRIDE];
    float *q;
    uint16_t *k_pool, *v_pool;
    size_t n_out;
    float *want;
} paged_problem;

static paged_problem D;

static void make_paged(paged_problem *p) {
    size_t blocks = 0;
    for (size_t s = 0; s < PAGED_SEQS; s++)
        blocks += (PAGED_KEYS[s] + PAGED_BLOCK - 1) / PAGED_BLOCK;
    for (size_t s = 0, used = 0; s < PAGED_SEQS; s++) { /* the last blocks of the pool first */
        p->q_start[s + 1] = p->q_start[s] + PAGED_ROWS[s];
        for (int32_t n = 0; n * PAGED_BLOCK < PAGED_KEYS[s]; n++)
            p->table[s * PAGED_STRIDE + n] = (int32_t)(blocks - 1 - used++);
    }
    const size_t pool = blocks * PAGED_HKV * PAGED_BLOCK * PAGED_D, rows = p->q_start[PAGED_SEQS];
    float *k = filled(pool), *v = filled(pool);
    p->k_pool = malloc(pool * 2), p->v_pool = malloc(pool * 2);
    REQUIRE(p->k_pool && p->v_pool, "out of memory");
    REQUIRE(sdpa_convert(p->k_pool, SDPA_F16, k, SDPA_F32, pool) == SDPA_OK, "convert");
    REQUIRE(sdpa_convert(p->v_pool, SDPA_F16, v, SDPA_F32, pool) == SDPA_OK, "convert");
    free(k), free(v);
    p->n_out = rows * PAGED_HQ * PAGED_D;
    p->q = filled(p->n_out);
    const size_t block = PAGED_HKV * PAGED_BLOCK * PAGED_D, head = PAGED_BLOCK * PAGED_D;
    p->cache = (sdpa_kv_cache){.struct_size = sizeof(sdpa_kv_cache),
                               .kv_type = SDPA_F16,
                               .num_blocks = blocks,
                               .block_size = PAGED_BLOCK,
                               .heads_kv = PAGED_HKV,
                               .d_k = PAGED_D,
                               .d_v = PAGED_D,
                               .k_stride = {block, head, PAGED_D},
                               .v_stride = {block, head, PAGED_D},
                               .block_table = p->table,
                               .block_table_stride = PAGED_STRIDE};
    p->batch = (sdpa_batch){.struct_size = sizeof(sdpa_batch),
                            .flags = SDPA_CAUSAL,
                            .num_seqs = PAGED_SEQS,
                            .heads_q = PAGED_HQ,
                            .q_start = p->q_start,
                            .kv_len = PAGED_KEYS,
                            .scale = SDPA_DEFAULT_SCALE,
                            .q_stride = {PAGED_HQ * PAGED_D, PAGED_D},
                            .out_stride = {PAGED_HQ * PAGED_D, PAGED_D}};
    p->want = malloc(p->n_out * sizeof(float));
    REQUIRE(p->want, "out of memory");
    REQUIRE(sdpa_attention_paged(&p->batch, &p->cache, p->want, p->q, p->k_pool, p->v_pool) ==
                SDPA_OK,
            "1-thread paged run");
}

static int paged_matches(const paged_problem *p, float *out) {
    return sdpa_attention_paged(&p->batch, &p->cache, out, p->q, p->k_pool, p->v_pool) == SDPA_OK &&
           memcmp(out, p->want, p->n_out * sizeof(float)) == 0;
}

static atomic_int failures, callers_left;

static void *caller(void *unused) {
    (void)unused;
    const size_t n_out = A.n_out > B.n_out ? A.n_out : B.n_out;
    float *out = malloc((n_out > D.n_out ? n_out : D.n_out) * sizeof(float));
    float *lse = malloc((A.n_lse > B.n_lse ? A.n_lse : B.n_lse) * sizeof(float));
    REQUIRE(out && lse, "out of memory");
    /* emulated: one round (races are native's); under TSan a quarter (tsan.h) */
    const char *quick = getenv("SDPA_TEST_QUICK");
    const int rounds = quick && *quick && *quick != '0' ? 1 : ROUNDS / (TSAN_BUILD ? 4 : 1);
    for (int i = 0; i < rounds; i++) {
        if (!call_matches(&A, out, lse)) atomic_fetch_add(&failures, 1);
        if (!call_matches(&B, out, lse)) atomic_fetch_add(&failures, 1);
        if (!call_matches(&C, out, lse)) atomic_fetch_add(&failures, 1);
        if (!paged_matches(&D, out)) atomic_fetch_add(&failures, 1);
    }
    free(out);
    free(lse);
    atomic_fetch_sub(&callers_left, 1);
    return NULL;
}

static void reverse_parallel_for(void *ctx, sdpa_task_fn task, void *arg, size_t n_tasks) {
    (void)ctx;
    for (size_t i = n_tasks; i-- > 0;) task(arg, i);
}

/* Changes the thread count and the scheduler until the callers are done. */
static void *setter(void *unused) {
    (void)unused;
    static const size_t COUNTS[] = {1, 2, 3, 8, 16, 0};
    for (size_t i = 0; atomic_load(&callers_left) > 0; i++) {
        if (sdpa_set_num_threads(COUNTS[i % 6]) != SDPA_OK) atomic_fetch_add(&failures, 1);
        if (sdpa_set_parallel_for(i % 5 == 4 ? reverse_parallel_for : NULL, NULL) != SDPA_OK)
            atomic_fetch_add(&failures, 1);
        usleep(200);
    }
    sdpa_set_parallel_for(NULL, NULL);
    return NULL;
}

static void run_callers(int with_setter, const char *what) {
    atomic_store(&failures, 0);
    atomic_store(&callers_left, N_CALLERS);
    pthread_t t[N_CALLERS + 1];
    for (int i = 0; i < N_CALLERS; i++)
        REQUIRE(pthread_create(&t[i], NULL, caller, NULL) == 0, "pthread_create");
    if (with_setter) REQUIRE(pthread_create(&t[N_CALLERS], NULL, setter, NULL) == 0, "create");
    for (int i = 0; i < N_CALLERS + with_setter; i++) pthread_join(t[i], NULL);
    REQUIRE(atomic_load(&failures) == 0, "%s: %d calls gave other bits or failed", what,
            atomic_load(&failures));
    printf("parallel_stress: %s ok\n", what);
}

static atomic_int stop_background;

static void *background(void *unused) {
    (void)unused;
    float *out = malloc(A.n_out * sizeof(float)), *lse = malloc(A.n_lse * sizeof(float));
    REQUIRE(out && lse, "out of memory");
    while (!atomic_load(&stop_background))
        if (!call_matches(&A, out, lse)) atomic_fetch_add(&failures, 1);
    free(out);
    free(lse);
    return NULL;
}

/* The child calls at once, with the pool's threads gone and possibly a call of the parent in
   flight when it forked. */
static void fork_and_call(void) {
    sdpa_set_num_threads(4);
    atomic_store(&failures, 0);
    atomic_store(&stop_background, 0);
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, background, NULL) == 0, "pthread_create");
    for (int round = 0; round < 4; round++) {
        usleep(1000);
        const pid_t pid = fork();
        REQUIRE(pid >= 0, "fork");
        if (pid == 0) {
            alarm(120); /* a hang fails instead of blocking the suite */
            float *out = malloc(B.n_out * sizeof(float)), *lse = malloc(B.n_lse * sizeof(float));
            int ok = out && lse && call_matches(&A, out, lse) && call_matches(&B, out, lse);
            sdpa_set_num_threads(1); /* and alone */
            ok = ok && call_matches(&A, out, lse);
            free(out);
            free(lse);
            _exit(ok ? 0 : 3);
        }
        int status = 0;
        REQUIRE(waitpid(pid, &status, 0) == pid, "waitpid");
        REQUIRE(WIFEXITED(status) && WEXITSTATUS(status) == 0, "fork round %d: child %s %d", round,
                WIFEXITED(status) ? "exited" : "killed by signal",
                WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    }
    atomic_store(&stop_background, 1);
    pthread_join(t, NULL);
    REQUIRE(atomic_load(&failures) == 0, "calls beside fork gave other bits");
    printf("parallel_stress: fork ok\n");
}

int main(void) {
    const char *expect = getenv("SDPA_EXPECT_THREADS");
    if (expect)
        REQUIRE(sdpa_num_threads() == strtoul(expect, NULL, 10), "default threads %zu, want %s",
                sdpa_num_threads(), expect);
    REQUIRE(sdpa_set_num_threads(1) == SDPA_OK, "set_num_threads");
    make(&A, 8, 2, 1, 3000, 64, 0, 1, SDPA_F32);
    make(&B, 2, 2, 160, 160, 64, SDPA_CAUSAL, 0, SDPA_F32);
    make(&C, 8, 2, 1, 2100, 64, 0, 0, SDPA_F16);
    make_paged(&D);

    sdpa_set_num_threads(2);
    run_callers(0, "host threads at once, 2 threads");
    sdpa_set_num_threads(16);
    run_callers(0, "host threads at once, 16 threads");
    run_callers(1, "thread count and scheduler changing during calls");
    /* qemu-user (the emulated setups, which set SDPA_TEST_QUICK) aborts in a child of a threaded
       process that starts threads; the native run and TSan cover fork */
    const char *quick = getenv("SDPA_TEST_QUICK");
    if (quick && *quick && *quick != '0')
        printf("parallel_stress: fork skipped under emulation\n");
    else
        fork_and_call();
    sdpa_set_num_threads(0);
    release(&A);
    release(&B);
    release(&C);
    free(D.q), free(D.k_pool), free(D.v_pool), free(D.want);
    return 0;
}
