/* White-box, as test_microkernels.c: the bf16 dot add-on's kernels (and AMX's permission), the
 * backends' score-stage tiles, and every kernel table against the rules of arch/kernels.h. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bounds.h"
#include "common.h"
#include "dispatch.h"
#include "microkernels.h"
#include "reference.h"

#if defined(__x86_64__)
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

/* ---- the bf16 dot add-on (kernels.h: sdpa_bf16_dot_kernels) ---- */

/* n bf16 elements ending where a PROT_NONE page begins, from floats in [-1, 1) cut to bf16
 * (their upper halves), with every 5th of them a subnormal when subnormals is set */
static uint16_t *bf16_alloc(rng *r, guarded *g, size_t n, int subnormals) {
    const size_t bytes = n * sizeof(uint16_t);
    *g = guard_alloc((bytes + 3) / 4, GUARD_AFTER);
    uint16_t *x = (uint16_t *)((char *)(g->p + (bytes + 3) / 4) - bytes);
    for (size_t i = 0; i < n; i++) {
        float f = (float)rng_uniform(r, -1.0, 1.0);
        uint32_t u;
        memcpy(&u, &f, sizeof u);
        x[i] = (uint16_t)(u >> 16);
        if (subnormals && i % 5 == 0) x[i] = (uint16_t)((x[i] & 0x8000u) | (1u + i % 127));
    }
    return x;
}

static double bf16_value(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* scale * dot of row i of q and row j of k, and the dot's bound, in double; a subnormal element
 * may count as 0 (kernels.h), which the bound covers: each such product is below 2^-126 */
static double bf16_dot_ref(const uint16_t *q, const uint16_t *k, size_t d, double scale,
                           double *bound) {
    double sum = 0.0, abs_sum = 0.0;
    for (size_t p = 0; p < d; p++) {
        sum += bf16_value(q[p]) * bf16_value(k[p]);
        abs_sum += fabs(bf16_value(q[p]) * bf16_value(k[p]));
    }
    *bound = bound_dot(fabs(scale) * abs_sum) + (double)d * 0x1p-126;
    return scale * sum;
}

static _Alignas(64) uint32_t qt_pairs[SDPA_ATTN_PACK_MAX_D / 2 * SDPA_ATTN_MAX_BLOCK_Q];

/* Every bf16 dot add-on of backend k that this build has and this CPU runs, whichever the
 * environment turns on (the one in use is only the first of them): up to max into out, their
 * number returned. */
enum { MAX_BF16_DOTS = 4 };
static size_t bf16_dots(const sdpa_kernels *k, sdpa_addon_info *out) {
    size_t n = 0;
    sdpa_addon_info info;
    for (size_t i = 0; sdpa_bf16_dot_addon(k, i, &info) && n < MAX_BF16_DOTS; i++)
        if (info.runnable) out[n++] = info;
    return n;
}

/* The shapes for the bf16 dot: the attention kernels' (nq from 8: the driver's blocks), and d
 * 32 and 96 (whole AMX tiles, which the spread above gives only once each) against every key
 * tail of a 16-key tile and both halves of the queries. */
static size_t bf16_dot_shapes(const sdpa_kernels *k, shape *out) {
    const size_t all = shapes_of(k->attention, SDPA_ATTN_PACK_MAX_D, out);
    size_t n = 0;
    for (size_t t = 0; t < all; t++)
        if (out[t].nq >= 8) out[n++] = out[t];
    const size_t nqs[] = {8, 16, 17, SDPA_ATTN_MAX_BLOCK_Q};
    const size_t nks[] = {1, 15, 16, 17, 31, 32, 33, 47, 48, 63, 127, SDPA_ATTN_MAX_BLOCK_KV};
    const size_t ds[] = {32, 96};
    for (size_t a = 0; a < sizeof ds / sizeof ds[0]; a++)
        for (size_t b = 0; b < sizeof nqs / sizeof nqs[0]; b++)
            for (size_t c = 0; c < sizeof nks / sizeof nks[0]; c++)
                out[n++] = (shape){nqs[b], nks[c], ds[a]};
    return n;
}

/* Each bf16 dot add-on this CPU runs (whether or not the environment turned it on): pack_q's
 * pairs and zero queries, scores_packed (row-major, nothing written past the tile) and
 * scores_max (key-major, with the maxima, no key row past nk written), at every packed shape,
 * odd and even d, odd strides (rows that start between two pairs), inputs ending at a guard
 * page (an odd d's last pair, a tile's last rows, must not read past a row), some elements
 * subnormal. */
BACKEND_TEST(microkernels, bf16_dot_scores) {
    const sdpa_kernels *k = kernels_of(sdpa_backend());
    sdpa_addon_info dots[MAX_BF16_DOTS];
    const size_t n_dots = bf16_dots(k, dots);
    if (!n_dots) cr_skip_test("no bf16 dot for %s here (CPU or build)", k->name);
    const size_t n = bf16_dot_shapes(k, shapes);
    for (size_t x = 0; x < n_dots; x++) {
        const sdpa_bf16_dot_kernels *b = dots[x].table;
        const char *name = dots[x].name;
        rng r = rng_seed(17);
        for (size_t t = 0; t < n; t++) {
            const shape *sh = &shapes[t];
            const size_t q_stride = sh->d + (t % 2), k_stride = sh->d + (t % 3);
            guarded gq, gk;
            const uint16_t *q = bf16_alloc(&r, &gq, (sh->nq - 1) * q_stride + sh->d, t % 4 == 0);
            const uint16_t *kk = bf16_alloc(&r, &gk, (sh->nk - 1) * k_stride + sh->d, t % 4 == 1);
            const float scale = t % 3 == 0 ? 0.125f : t % 3 == 1 ? -1.5f : 1.0f;
            memset(qt_pairs, 0xff, sizeof qt_pairs);
            b->pack_q(qt_pairs, LD_Q, q, q_stride, sh->nq, sh->d);
            for (size_t p = 0; p < (sh->d + 1) / 2; p++)
                for (size_t i = 0; i < SDPA_ATTN_MAX_BLOCK_Q; i++) {
                    const uint16_t *qi = q + i * q_stride + 2 * p;
                    const uint32_t want =
                        i >= sh->nq ? 0 : qi[0] | (2 * p + 1 < sh->d ? (uint32_t)qi[1] << 16 : 0);
                    cr_assert_eq(qt_pairs[p * SDPA_ATTN_MAX_BLOCK_Q + i], want,
                                 "%s pack_q nq %zu d %zu: pair %zu of query %zu", name, sh->nq,
                                 sh->d, p, i);
                }
            fill_sentinel(s_tile, sizeof s_tile / sizeof s_tile[0]);
            b->scores_packed(s_tile, LD_S, qt_pairs, LD_Q, sh->nq, kk, k_stride, sh->nk, sh->d,
                             scale);
            float tile_max[SDPA_ATTN_MAX_BLOCK_Q];
            fill_sentinel(st, sizeof st / sizeof st[0]);
            b->scores_max(st, LD_Q, tile_max, qt_pairs, LD_Q, sh->nq, kk, k_stride, sh->nk, sh->d,
                          scale);
            for (size_t i = 0; i < sh->nq; i++) {
                float m = -INFINITY;
                for (size_t j = 0; j < sh->nk; j++) {
                    double bound;
                    const double want =
                        bf16_dot_ref(q + i * q_stride, kk + j * k_stride, sh->d, scale, &bound);
                    const float rows = s_tile[i * LD_S + j], keys = st[j * LD_Q + i];
                    cr_assert(fabs(rows - want) <= bound && fabs(keys - want) <= bound,
                              "%s nq %zu nk %zu d %zu: s[%zu][%zu] %.9g (packed) %.9g (max) "
                              "want %.9g",
                              name, sh->nq, sh->nk, sh->d, i, j, rows, keys, want);
                    m = keys > m ? keys : m;
                }
                cr_assert_eq(tile_max[i], m, "%s scores_max nq %zu nk %zu: max of row %zu", name,
                             sh->nq, sh->nk, i);
                for (size_t j = sh->nk; j < sh->nk + BORDER; j++)
                    cr_assert_eq(s_tile[i * LD_S + j], SENTINEL,
                                 "%s scores_packed wrote past the row", name);
            }
            for (size_t j = 0; j < LD_S; j++)
                cr_assert_eq(s_tile[sh->nq * LD_S + j], SENTINEL,
                             "%s scores_packed wrote past the rows", name);
            for (size_t j = sh->nk * LD_Q; j < sizeof st / sizeof st[0]; j++)
                cr_assert_eq(st[j], SENTINEL, "%s scores_max nk %zu wrote key row %zu", name,
                             sh->nk, j / LD_Q);
            guard_free(&gq);
            guard_free(&gk);
        }
    }
}

/* Each bf16 dot on the special values: inf and NaN in q or k make the scores that see them NaN
 * or inf as a float dot would (so the driver's NaN rows and +inf rules hold), a finite row next
 * to them stays finite. d 5 (an odd last pair) and d 32 (one whole AMX tile step, where AMX
 * takes it), the special elements in the first and in the last pair. */
BACKEND_TEST(microkernels, bf16_dot_special_values) {
    const sdpa_kernels *k = kernels_of(sdpa_backend());
    sdpa_addon_info dots[MAX_BF16_DOTS];
    const size_t n_dots = bf16_dots(k, dots);
    if (!n_dots) cr_skip_test("no bf16 dot for %s here (CPU or build)", k->name);
    enum { NQ = 8, NK = 9, MAXD = 32 };
    const size_t ds[] = {5, MAXD};
    for (size_t x = 0; x < n_dots; x++)
        for (size_t di = 0; di < sizeof ds / sizeof ds[0]; di++) {
            const sdpa_bf16_dot_kernels *b = dots[x].table;
            const size_t D = ds[di];
            uint16_t q[NQ * MAXD], kk[NK * MAXD];
            for (size_t i = 0; i < NQ * D; i++) q[i] = 0x3f80;  /* 1 */
            for (size_t i = 0; i < NK * D; i++) kk[i] = 0x3f00; /* 0.5 */
            q[1 * D + D - 1] = 0x7f80;  /* query 1: +inf, in the last pair */
            q[2 * D + 1] = 0x7fc1;      /* query 2: NaN */
            kk[3 * D + 2] = 0xff80;     /* key 3: -inf */
            kk[4 * D + D - 1] = 0xffc0; /* key 4: NaN, in the last pair */
            b->pack_q(qt_pairs, LD_Q, q, D, NQ, D);
            float tile_max[SDPA_ATTN_MAX_BLOCK_Q];
            b->scores_max(st, LD_Q, tile_max, qt_pairs, LD_Q, NQ, kk, D, NK, D, 1.0f);
            const float finite = 0.5f * (float)D;
            for (size_t i = 0; i < NQ; i++)
                for (size_t j = 0; j < NK; j++) {
                    const float s = st[j * LD_Q + i];
                    if (i == 2 || j == 4 || (i == 1 && j == 3))
                        cr_assert(isnan(s), "%s d %zu: s[%zu][%zu] = %g, want NaN", dots[x].name, D,
                                  i, j, s);
                    else if (i == 1)
                        cr_assert(s == INFINITY, "%s d %zu: s[1][%zu] = %g, want +inf",
                                  dots[x].name, D, j, s);
                    else if (j == 3)
                        cr_assert(s == -INFINITY, "%s d %zu: s[%zu][3] = %g, want -inf",
                                  dots[x].name, D, i, s);
                    else
                        cr_assert(s == finite, "%s d %zu: s[%zu][%zu] = %g, want %g", dots[x].name,
                                  D, i, j, s, finite);
                }
        }
}

/* Whether Linux has granted this process AMX's tile data (ARCH_GET_XCOMP_PERM) */
static int amx_granted_now(void) {
#if defined(__x86_64__) && defined(__linux__)
    unsigned long perm = 0;
    return syscall(SYS_arch_prctl, 0x1022 /* ARCH_GET_XCOMP_PERM */, &perm) == 0 &&
           (perm & (1ul << 18)) != 0;
#else
    return 0;
#endif
}

/* This CPU's own word on a feature a record requires, apart from src/dispatch.c's probes: GCC's
 * CPUID for the AVX-512 flags; for AMX, CPUID and XCR0's tile state (Linux's grant comes at the
 * first use, checked by the tests below). */
static int test_cpu_has(const char *name, size_t len) {
#if defined(__x86_64__)
    char f[32];
    snprintf(f, sizeof f, "%.*s", (int)len, name);
    __builtin_cpu_init();
    if (strcmp(f, "AVX-512F") == 0) return __builtin_cpu_supports("avx512f");
    if (strcmp(f, "AVX512BW") == 0) return __builtin_cpu_supports("avx512bw");
    if (strcmp(f, "AVX512_BF16") == 0) return __builtin_cpu_supports("avx512bf16");
    if (strcmp(f, "AMX_TILE") == 0 || strcmp(f, "AMX_BF16") == 0) {
        unsigned a, b, c, d;
        if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
        if (!(d & (1u << (strcmp(f, "AMX_TILE") == 0 ? 24 : 22)))) return 0;
        if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return 0;
        unsigned lo, hi;
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        return (lo & 0x60000u) == 0x60000u;
    }
#else
    (void)name, (void)len;
#endif
    return 0;
}

static int test_cpu_has_all(const char *requires) {
    for (const char *p = requires; *p;) {
        const size_t len = strcspn(p, "+");
        if (!test_cpu_has(p, len)) return 0;
        p += len + (p[len] == '+');
    }
    return 1;
}

/* Each add-on is on exactly where it should be: for its backend when this CPU has what it
 * requires and its variable is on or, unset, its record's default is (the suites run with the
 * variables set every way), and the bf16 dot in use is the first of them that is on. */
BACKEND_TEST(microkernels, bf16_dot_follows_cpu_and_environment) {
    const sdpa_kernels *k = kernels_of(sdpa_backend());
    const sdpa_bf16_dot_kernels *first = NULL;
    /* the permission check must come before sdpa_bf16_dot_addon, which asks for it itself */
    int want[MAX_BF16_DOTS];
    sdpa_addon_info info;
    size_t n = 0;
    for (; sdpa_bf16_dot_addon(k, n, &info) && n < MAX_BF16_DOTS; n++) {
        const char *env = getenv(info.env);
        const int set = env && (strcmp(env, "on") == 0 || strcmp(env, "off") == 0);
        want[n] =
            (set ? strcmp(env, "on") == 0 : info.default_on) && test_cpu_has_all(info.requires);
    }
    if (strcmp(k->name, "avx512") != 0) cr_assert_eq(n, 0, "%s: no bf16 dot add-ons", k->name);
    for (size_t i = 0; i < n; i++) {
        cr_assert(sdpa_bf16_dot_addon(k, i, &info));
        cr_assert_eq(info.on, want[i], "%s: %s %s, expected %s", k->name, info.name,
                     info.on ? "on" : "off", want[i] ? "on" : "off");
        if (info.on) {
            cr_assert(info.runnable && info.table, "%s: on, so runnable", info.name);
            cr_assert(info.table->pack_q && info.table->scores_packed && info.table->scores_max,
                      "%s: a bf16 dot table is whole", info.name);
            if (!first) first = info.table;
        }
    }
    cr_assert(sdpa_bf16_dot_for(k) == first, "%s: the bf16 dot in use is the first one on",
              k->name);
    for (size_t i = 0; i < n; i++)
        if (sdpa_bf16_dot_addon(k, i, &info) && info.on && strstr(info.requires, "AMX_TILE"))
            cr_assert(amx_granted_now(), "%s on, so Linux granted the tile state", info.name);
}

/* Loading the library asks Linux for nothing (the grant of AMX's tile state is process-wide: it
 * makes sigaltstack refuse small stacks); the first all-bf16 attention on avx512 asks, if the
 * AMX add-on is on (SDPA_AMX not off), and otherwise never. Each test runs in a process of its
 * own, forked from a runner that made no such call. */
Test(microkernels, amx_permission_waits_for_first_use) {
    if (!test_cpu_has_all("AVX512BW+AMX_TILE+AMX_BF16") || !sdpa_backend_supported("avx512"))
        cr_skip_test("no AMX here (CPU, OS state, or an emulator)");
    cr_assert(!amx_granted_now(), "the tile state was granted before any call asked for it");
    cr_assert_eq(sdpa_set_backend("avx512"), SDPA_OK);
    enum { LQ = 32, LK = 64, D = 64 };
    uint16_t q[LQ * D], kv[LK * D], out[LQ * D];
    for (size_t i = 0; i < LQ * D; i++) q[i] = 0x3f80;  /* bf16 1.0 */
    for (size_t i = 0; i < LK * D; i++) kv[i] = 0x3f00; /* bf16 0.5 */
    sdpa_mha_desc desc;
    sdpa_mha_desc_dense(&desc, 1, 1, 1, LQ, LK, D, D, SDPA_DEFAULT_SCALE, 0);
    desc.q_type = desc.kv_type = desc.out_type = SDPA_BF16;
    cr_assert_eq(sdpa_mha(&desc, out, q, kv, kv), SDPA_OK);
    for (size_t i = 0; i < LQ * D; i++) cr_assert_eq(out[i], 0x3f00, "out[%zu] = %#x", i, out[i]);
    const char *env = getenv("SDPA_AMX");
    const int wanted = !(env && strcmp(env, "off") == 0);
    cr_assert_eq(amx_granted_now(), wanted, "after an all-bf16 call with SDPA_AMX=%s: %s",
                 env ? env : "(unset)", amx_granted_now() ? "granted" : "not asked");
}

/* ulps of x's magnitude in float, at least the smallest subnormal's */
static double float_ulp(double x) {
    const float f = (float)fabs(x);
    return f < FLT_MIN ? 0x1p-149 : (double)(nextafterf(f, INFINITY) - f);
}

/* stage_tile's softcap (docs/numerics.md: within 8 ulps of c tanh(s / c), its derivative within
 * 2^-21 of 1 - tanh^2) over |s / c| from 1e-9 to 1e4, both signs, dense around the switch from
 * the series at 1/4, with +-0, +-inf and NaN; then ALiBi after it, each bias one rounding of
 * slope (dist + j), key-major with the row maxima (NaN where a score is) and along one row. */
static void check_stage_cap(const sdpa_kernels *k, int kind, float c) {
    enum { N = 4099 }; /* a partial last vector on every width */
    static float s[N], s0[N], deriv[N];
    for (size_t i = 0; i < N - 5; i++) {
        const double a = i % 3 ? pow(10.0, -9.0 + 13.0 * (double)i / N) : 0.2 + 0.1 * i / N;
        s0[i] = (float)((i % 2 ? -1.0 : 1.0) * c * a);
    }
    s0[N - 5] = 0.0f, s0[N - 4] = -0.0f, s0[N - 3] = INFINITY, s0[N - 2] = -INFINITY;
    s0[N - 1] = NAN;
    memcpy(s, s0, sizeof s);
    const sdpa_stage_tile t = {s, N, 1, N, c, 0, deriv, NULL, NULL, NULL};
    k->stage_tile[kind](&t);
    for (size_t i = 0; i < N; i++) {
        if (isnan(s0[i])) {
            cr_assert(isnan(s[i]), "cap %g: softcap(NaN) = %g", c, s[i]);
            continue;
        }
        const double th = tanh((double)s0[i] / c), want = c * th;
        cr_assert(fabs(s[i] - want) <= 8.0 * float_ulp(want) && signbit(s[i]) == signbit(s0[i]),
                  "kind %d cap %g: softcap(%.9g) = %.9g, want %.9g (%.1f ulps)", kind, c, s0[i],
                  s[i], want, fabs(s[i] - want) / float_ulp(want));
        cr_assert(fabs(deriv[i] - (1.0 - th * th)) <= 0x1p-21, "kind %d cap %g: %.9g: %.9g", kind,
                  c, s0[i], deriv[i]);
    }
}

static void check_stage_alibi(const sdpa_kernels *k, int kind, rng *r) {
    enum { LD = SDPA_ATTN_MAX_BLOCK_Q, KEYS = 37 };
    static float s[KEYS * LD], s0[KEYS * LD], capped[KEYS * LD];
    float slope[LD], dist[LD], max[LD];
    for (size_t n = 1; n <= LD; n++)
        for (int cap = 0; cap < 2; cap++) {
            for (size_t x = 0; x < LD; x++) {
                slope[x] = (float)rng_uniform(r, -1.0, 1.0);
                dist[x] = (float)(int)rng_uniform(r, -5000.0, 5000.0);
            }
            for (size_t e = 0; e < KEYS * LD; e++) s0[e] = (float)rng_uniform(r, -40.0, 40.0);
            s0[(n - 1) * LD + (n - 1) / 2] = NAN; /* one row's max is NaN */
            memcpy(s, s0, sizeof s);
            memcpy(capped, s0, sizeof s);
            const float c = cap ? 20.0f : 0.0f;
            if (cap) { /* the softcap alone, checked above, gives the capped scores */
                const sdpa_stage_tile t = {capped, LD, KEYS, n, c, 0, NULL, NULL, NULL, NULL};
                k->stage_tile[kind](&t);
            }
            const sdpa_stage_tile t = {s, LD, KEYS, n, c, 0, NULL, slope, dist, max};
            k->stage_tile[kind](&t);
            for (size_t x = 0; x < n; x++) {
                double m = -INFINITY;
                int nan = 0;
                for (size_t j = 0; j < KEYS; j++) {
                    const float bias = (float)((double)slope[x] * (dist[x] + (double)j));
                    const float want = capped[j * LD + x] + bias;
                    const float got = s[j * LD + x];
                    nan |= isnan(want);
                    if (!isnan(want)) m = got > m ? got : m;
                    cr_assert(isnan(want) ? isnan(got) : got == want,
                              "n %zu cap %d [%zu][%zu]: %.9g, want %.9g", n, cap, j, x, got, want);
                }
                cr_assert(nan ? isnan(max[x]) : max[x] == m, "n %zu: max[%zu] %g, want %g", n, x,
                          max[x], m);
            }
            for (size_t j = 0; j < KEYS; j++) /* positions from n on untouched */
                for (size_t x = n; x < LD; x++)
                    cr_assert(s[j * LD + x] == s0[j * LD + x] || isnan(s0[j * LD + x]));
        }
    for (size_t n = 1; n <= 131; n += 13) { /* one row: slope[0] (dist[0] + x) */
        for (size_t x = 0; x < n; x++) s0[x] = s[x] = (float)rng_uniform(r, -40.0, 40.0);
        const sdpa_stage_tile t = {s, n, 1, n, 0.0f, 1, NULL, slope, dist, NULL};
        k->stage_tile[kind](&t);
        for (size_t x = 0; x < n; x++)
            cr_assert(s[x] == s0[x] + (float)((double)slope[0] * (dist[0] + (double)x)),
                      "one row of %zu: [%zu]", n, x);
    }
}

BACKEND_TEST(microkernels, stage_tile) {
    const sdpa_kernels *k = kernels_of(sdpa_backend());
    if (!k->stage_tile[SDPA_EXP_FAST]) cr_skip_test("%s has no stage_tile", k->name);
    rng r = rng_seed(37);
    const float caps[] = {30.0f, 1.0f, 1e-3f, 1e20f};
    for (int kind = 0; kind < SDPA_EXP_KINDS; kind++) {
        for (size_t ci = 0; ci < sizeof caps / sizeof caps[0]; ci++)
            check_stage_cap(k, kind, caps[ci]);
        check_stage_alibi(k, kind, &r);
    }
}

/* rows_finite against isfinite element by element: n rows of d floats, stride apart, the last
 * ending at a guard page, with finite extremes (FLT_MAX, subnormals, signed zeros) everywhere
 * and inf between the rows, which must not count; then each of inf, -inf and NaN at every place
 * in turn, every one of which must. */
BACKEND_TEST(microkernels, rows_finite_finds_every_inf_and_nan) {
    const sdpa_kernels *k = kernels_of(sdpa_backend());
    const size_t shapes[][3] = {{1, 1, 1}, {3, 17, 20}, {5, 16, 16}, {2, 33, 40}, {4, 128, 131},
                                {2, 7, 7}, {0, 8, 8},   {2, 0, 4}}; /* n, d, stride */
    const float good[] = {FLT_MAX, -FLT_MAX, FLT_MIN, 1e-45f, -0.0f, 0.0f, 1.0f};
    const float bad[] = {INFINITY, -INFINITY, NAN};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const size_t n = shapes[i][0], d = shapes[i][1], stride = shapes[i][2];
        const size_t total = n && d ? (n - 1) * stride + d : 0;
        guarded g = guard_alloc(total, GUARD_AFTER);
        float *x = g.p;
        for (size_t j = 0; j < total; j++) x[j] = INFINITY;
        for (size_t r = 0; r < n; r++)
            for (size_t c = 0; c < d; c++) x[r * stride + c] = good[(r + c) % 7];
        cr_assert_eq(k->rows_finite(x, stride, n, d), 1, "n %zu d %zu", n, d);
        for (size_t r = 0; r < n; r++)
            for (size_t c = 0; c < d; c++)
                for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
                    const float keep = x[r * stride + c];
                    x[r * stride + c] = bad[b];
                    cr_assert_eq(k->rows_finite(x, stride, n, d), 0, "n %zu d %zu at %zu,%zu: %g",
                                 n, d, r, c, (double)bad[b]);
                    x[r * stride + c] = keep;
                }
        guard_free(&g);
    }
}

/* The rules of arch/kernels.h that no call would show: required kernels present, optional
 * pairs both present or both absent, blocks within the driver's stack tiles. */
BACKEND_TEST(microkernels, table_obeys_its_rules) {
    const sdpa_kernels *k = kernels_of(sdpa_backend());
    cr_assert_str_eq(k->name, sdpa_backend());
    cr_assert(k->dot && k->dot_to && k->scale && k->max_scaled && k->rows_finite && k->normalize &&
              k->softmax_backward && k->attention);
    cr_assert(k->exp_sum_block >= 16);
    for (int kind = 0; kind < SDPA_EXP_KINDS; kind++) {
        cr_assert(k->exp_sum[kind] && k->exp[kind], "exp kind %d", kind);
        cr_assert(!k->exp_sum_max[kind] == !k->exp_sum_max[0], "exp_sum_max: both or neither");
        cr_assert(!k->softmax_short[kind] == !k->softmax_short[0],
                  "softmax_short: both or neither");
    }
    const sdpa_attention_kernels *a = k->attention;
    cr_assert(a->block_q >= 1 && a->block_q <= SDPA_ATTN_MAX_BLOCK_Q);
    cr_assert(a->block_kv >= 1 && a->block_kv <= SDPA_ATTN_MAX_BLOCK_KV);
    cr_assert(a->scores_tile && a->pv_tile && a->pv_tile_t && a->ds_keymajor);
    cr_assert(!a->exp_tile[0] == !a->exp_tile[1], "exp_tile: both kinds or neither");
    cr_assert(!a->pack_q == !a->scores_packed, "pack_q and scores_packed: both or neither");
    cr_assert(!a->scores_max == !a->exp_pv[0] && !a->exp_pv[0] == !a->exp_pv[1],
              "scores_max and exp_pv: all or none");
    cr_assert(!a->scores_max || a->pack_q, "scores_max needs pack_q");
    cr_assert(!a->scores_keymajor || a->pack_q, "scores_keymajor needs pack_q");
    cr_assert(!a->exp_keymajor[0] == !a->exp_keymajor[1], "exp_keymajor: both kinds or neither");
    cr_assert(!k->stage_tile[0] == !k->stage_tile[1], "stage_tile: both kinds or neither");
    cr_assert(!a->scores_tile_typed[SDPA_TYPE_F32] && !a->pv_tile_typed[SDPA_TYPE_F32],
              "typed entries: none for f32");
    for (int t = SDPA_TYPE_F16; t < SDPA_TYPES; t++)
        cr_assert(!a->scores_tile_typed[t] == !a->pv_tile_typed[t],
                  "typed entries of type %d: both or neither", t);
}
