#include "common.h"

#include <criterion/hooks.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int test_quick(void) {
    const char *quick = getenv("SDPA_TEST_QUICK");
    return quick && strcmp(quick, "1") == 0;
}

/* The backend a BACKEND_TEST (or a per-backend test named like one) is for, from its name's
 * suffix; NULL for the others. */
static const char *backend_of(const char *test_name) {
#define BACKEND_NAME_(unused, b, ...) #b,
    static const char *const names[] = {SDPA_BACKENDS(BACKEND_NAME_, )};
#undef BACKEND_NAME_
    size_t len = strlen(test_name);
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        size_t b = strlen(names[i]);
        if (len > b + 1 && test_name[len - b - 1] == '_' &&
            strcmp(test_name + len - b, names[i]) == 0)
            return names[i];
    }
    return NULL;
}

/* Suites whose kernels never call exp: the exp mode cannot change what they test. */
static int exp_independent(const char *suite) {
    static const char *const names[] = {"dot", "scale", "scores", "softmax_backward"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(suite, names[i]) == 0) return 1;
    return 0;
}

/* Criterion runs each test in a re-executed process: under qemu-user that costs about 0.3 s
 * even for a test that skips at once. In quick mode the runner's parent marks disabled, which
 * Criterion reports as skipped without spawning them:
 * - the tests of backends this CPU cannot run;
 * - in the SDPA_EXP=sleef run, the suites that do not depend on the exp mode (they ran in the
 *   default run);
 * - when the setup names the backend its CPU model is there to prove (SDPA_EXPECT_BACKEND, or
 *   SDPA_BACKEND when that forces one), the per-backend tests of the other backends. Each of
 *   those is proven on its own emulated setup, on the oldest CPU model that runs it, and
 *   natively; running scalar's and sse's tests again on an emulated Haswell took two thirds of
 *   that setup's time and proved nothing new. */
ReportHook(PRE_ALL)(struct criterion_test_set *set) {
    if (!test_quick()) return;
    const char *exp = getenv("SDPA_EXP"), *only = getenv("SDPA_EXPECT_BACKEND");
    int sleef_run = exp && strcmp(exp, "sleef") == 0;
    if (!only) only = getenv("SDPA_BACKEND");
    if (only && !sdpa_backend_supported(only)) only = NULL;
    for (struct criterion_ordered_set_node *s = set->suites->first; s; s = s->next) {
        struct criterion_suite_set *suite = (struct criterion_suite_set *)(s + 1);
        if (!suite->tests) continue;
        int skip_suite = sleef_run && exp_independent(suite->suite.name);
        for (struct criterion_ordered_set_node *t = suite->tests->first; t; t = t->next) {
            struct criterion_test *test = (struct criterion_test *)(t + 1);
            const char *backend = backend_of(test->name);
            if (skip_suite || (backend && !sdpa_backend_supported(backend)) ||
                (backend && only && strcmp(backend, only) != 0))
                test->data->disabled = true;
        }
    }
}

void use_backend(const char *name) {
    if (!sdpa_backend_supported(name))
        cr_skip_test("backend %s is not compiled in or not supported by this CPU", name);
    cr_assert_eq(sdpa_set_backend(name), SDPA_OK, "sdpa_set_backend(%s)", name);
    cr_assert_str_eq(sdpa_backend(), name, "forced backend is not the active one");
}

/* qemu 7.2's TCG loads every lane of VMASKMOVPS, masked off or not, so an AVX2 masked tail next
 * to a PROT_NONE page faults under emulation, although the architecture guarantees that
 * masked-off lanes never fault (checked with a 3-float maskload before a PROT_NONE page: fine
 * natively, SIGSEGV under qemu-x86_64). The emulated setups hit by that name such backends in
 * SDPA_TEST_NO_GUARD_PAGE; their guard-page tests are proven by the native run instead. */
static void skip_guard_pages_if_emulator_faults(void) {
    const char *list = getenv("SDPA_TEST_NO_GUARD_PAGE"), *active = sdpa_backend();
    if (!list) return;
    size_t len = strlen(active);
    for (const char *p = strstr(list, active); p; p = strstr(p + 1, active))
        if ((p == list || p[-1] == ',') && (p[len] == 0 || p[len] == ','))
            cr_skip_test("guard pages with %s: the emulator faults on masked-off lanes (proven "
                         "natively)",
                         active);
}

guarded guard_alloc(size_t n, enum guard_side side) {
    skip_guard_pages_if_emulator_faults();
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t bytes = n * sizeof(float);
    size_t data_pages = (bytes + page - 1) / page;
    if (data_pages == 0) data_pages = 1;
    guarded g;
    g.map_len = (data_pages + 1) * page;
    g.map = mmap(NULL, g.map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(g.map, MAP_FAILED, "mmap");
    char *base = g.map;
    if (side == GUARD_AFTER) {
        char *guard = base + data_pages * page;
        cr_assert_eq(mprotect(guard, page, PROT_NONE), 0);
        g.p = (float *)(guard - bytes);
    } else {
        cr_assert_eq(mprotect(base, page, PROT_NONE), 0);
        g.p = (float *)(base + page);
    }
    return g;
}

void guard_free(guarded *g) { munmap(g->map, g->map_len); }

rng rng_seed(uint64_t seed) {
    rng r = {seed * 0x9E3779B97F4A7C15ull + 1};
    return r;
}

static uint64_t next(rng *r) { /* splitmix64 */
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double rng_uniform(rng *r, double lo, double hi) {
    return lo + (hi - lo) * ((double)(next(r) >> 11) * 0x1p-53);
}

double rng_normal(rng *r) {
    double u = rng_uniform(r, 0x1p-53, 1.0), v = rng_uniform(r, 0.0, 1.0);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

void fill_uniform(rng *r, float *x, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++) x[i] = (float)rng_uniform(r, lo, hi);
}

void fill_normal(rng *r, float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = (float)rng_normal(r);
}

float *alloc_offset(size_t n, size_t offset, void **base) {
    *base = aligned_alloc(64, ((n + offset) * sizeof(float) + 63) / 64 * 64 + 64);
    cr_assert_not_null(*base);
    return (float *)*base + offset;
}

const size_t TEST_SIZES[] = {0,  1,   2,   3,   4,   5,   6,   7,    8,    9,    10,   11, 12, 13,
                             14, 15,  16,  17,  18,  19,  20,  21,   22,   23,   24,   25, 26, 27,
                             28, 29,  30,  31,  32,  33,  34,  35,   36,   37,   38,   39, 40, 41,
                             42, 43,  44,  45,  46,  47,  48,  49,   50,   51,   52,   53, 54, 55,
                             56, 57,  58,  59,  60,  61,  62,  63,   64,   65,   66,   67, 68, 69,
                             70, 127, 128, 129, 255, 256, 257, 1000, 4096, 4097, 65537};
const size_t N_TEST_SIZES = sizeof TEST_SIZES / sizeof TEST_SIZES[0];

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
void set_ftz_daz(int on) {
    const unsigned bits = 0x8040u; /* MXCSR: flush to zero (15), denormals are zero (6) */
    _mm_setcsr(on ? _mm_getcsr() | bits : _mm_getcsr() & ~bits);
}
#elif defined(__aarch64__)
void set_ftz_daz(int on) {
    const uint64_t fz = 1u << 24; /* FPCR.FZ */
    uint64_t fpcr;
    __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
    fpcr = on ? fpcr | fz : fpcr & ~fz;
    __asm__ volatile("msr fpcr, %0" : : "r"(fpcr));
}
#else
void set_ftz_daz(int on) { (void)on; }
#endif

#if defined(__x86_64__) || defined(__i386__)
uint64_t fp_control_word(void) { return _mm_getcsr() & 0xffc0u; }
#elif defined(__aarch64__)
uint64_t fp_control_word(void) {
    uint64_t fpcr;
    __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
    return fpcr;
}
#else
uint64_t fp_control_word(void) { return 0; }
#endif
