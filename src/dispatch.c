/* Chooses the backend once, at load time, from what cpu_features reports, and lets users
 * force another. Compiled for the baseline ISA only: nothing here may execute an instruction
 * the CPU lacks before the choice is made. */
#if defined(__AVX__) || defined(__SSE4_1__) || defined(__ARM_FEATURE_SVE)
#error "src/dispatch.c must be compiled for the baseline ISA, without -m flags"
#endif

/* syscall(), for the AMX permission request on Linux */
#if defined(__linux__)
#define _GNU_SOURCE
#endif

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention_problem.h"
#include "backends.h"
#include "bf16_dot_default.h"
#include "dispatch.h"
#include "error.h"
#include "sdpa.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpu_features/cpuinfo_x86.h>
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#elif defined(__aarch64__)
#include <sys/auxv.h>
#endif

_Atomic(const sdpa_kernels *) sdpa_active_kernels;
_Atomic int sdpa_active_exp;

/* A backend's record (meson.build, through the generated backends.h) and its kernel table. */
typedef struct backend {
    const char *name;
    const sdpa_kernels *kernels; /* NULL when not compiled into this library */
    const char *requires;        /* CPU features, joined by '+': the CPU must have every one */
    const char *arch, *description;
} backend;

/* Best first: the dispatcher takes the first entry that is compiled in and runnable. */
#define KERNELS_IF_BUILT_1(table) &table
#define KERNELS_IF_BUILT_0(table) NULL
#define BACKEND_(unused, name, built, table, arch, requires, description)                          \
    {#name, KERNELS_IF_BUILT_##built(table), requires, arch, description},
static const backend BACKENDS[] = {SDPA_BACKENDS(BACKEND_, )};
#undef BACKEND_
#define N_BACKENDS (sizeof BACKENDS / sizeof BACKENDS[0])

/* How to probe each CPU feature a record may require, by the name the record uses. */
typedef struct cpu_feature {
    const char *name;
    int (*present)(void);
} cpu_feature;

#if defined(__x86_64__) || defined(__i386__)
/* XCR0, the register state the OS saves; read only when CPUID says the OS enabled XSAVE (else
 * xgetbv faults). 0 if not. */
static unsigned long long read_xcr0(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}
/* cpu_features checks OS support (XCR0) for the wide registers. On CPUs without OSXSAVE it takes
 * the SSE flags from /proc/cpuinfo, which under an emulator describes the host: CPUID itself
 * (GCC's builtin) must agree before SSE4.1 code runs. */
static X86Features x86_features(void) { return GetX86Info().features; }
static int cpu_has_sse41(void) {
    __builtin_cpu_init();
    return x86_features().sse4_1 != 0 && __builtin_cpu_supports("sse4.1");
}
static int cpu_has_avx2(void) { return x86_features().avx2 != 0; }
static int cpu_has_fma(void) { return x86_features().fma3 != 0; }
static int cpu_has_f16c(void) { return x86_features().f16c != 0; }
static int cpu_has_avx512f(void) { return x86_features().avx512f != 0; }
static int cpu_has_avx512bw(void) { return x86_features().avx512bw != 0; }
static int cpu_has_avx512_bf16(void) { return x86_features().avx512_bf16 != 0; }
/* AMX: the CPU's flag is not enough. The OS must save the tile state (XCR0 bits 17, XTILECFG,
 * and 18, XTILEDATA), and Linux hands the tile data to a process only when it asks
 * (ARCH_REQ_XCOMP_PERM; Linux 5.16 and later): a tile instruction before that raises SIGILL.
 * The features below are the CPU's and the OS's; the request itself (amx_permission) waits for
 * the first call that would run tiles, because its effect is process-wide (sigaltstack must then
 * hold the AMX signal frame): a process that never does all-bf16 attention is left as it was.
 * On other systems AMX counts as absent. */
static int amx_os_saves_tiles(void) {
#if defined(__linux__) && defined(SYS_arch_prctl)
    const unsigned long long tile_state = (1u << 17) | (1u << 18);
    return (read_xcr0() & tile_state) == tile_state;
#else
    return 0; /* no way to ask for the tile data */
#endif
}
static int amx_granted;
static void amx_request(void) {
#if defined(__linux__) && defined(SYS_arch_prctl)
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    amx_granted = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#endif
}
/* Whether Linux grants this process the tile state: asked once, at the first need
   (process-wide and idempotent, so a host that asked already gets yes at once). */
static int amx_permission(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, amx_request);
    return amx_granted;
}
static int cpu_has_amx_tile(void) { return x86_features().amx_tile != 0 && amx_os_saves_tiles(); }
static int cpu_has_amx_bf16(void) { return x86_features().amx_bf16 != 0 && cpu_has_amx_tile(); }
static const cpu_feature FEATURES[] = {{"SSE4.1", cpu_has_sse41},
                                       {"AVX2", cpu_has_avx2},
                                       {"FMA", cpu_has_fma},
                                       {"F16C", cpu_has_f16c},
                                       {"AVX-512F", cpu_has_avx512f},
                                       {"AVX512BW", cpu_has_avx512bw},
                                       {"AVX512_BF16", cpu_has_avx512_bf16},
                                       {"AMX_TILE", cpu_has_amx_tile},
                                       {"AMX_BF16", cpu_has_amx_bf16},
                                       {NULL, NULL}};
#elif defined(__aarch64__)
/* The kernel's hwcaps directly: Debian's arm64 cpu_features 0.7 prints a debug line to stdout
 * on cores without AT_HWCAP2 (ARMv8.0), which a library must never do to its users. */
#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD (1ul << 1)
#endif
static int cpu_has_asimd(void) { return (getauxval(AT_HWCAP) & HWCAP_ASIMD) != 0; }
static const cpu_feature FEATURES[] = {{"ASIMD", cpu_has_asimd}, {NULL, NULL}};
#else
static const cpu_feature FEATURES[] = {{NULL, NULL}};
#endif

/* The first feature of a record's list ('+'-joined) this CPU lacks, its length in *len; NULL if
 * it has every one. A name not probed here counts as missing, so a record can never enable code
 * the CPU was not checked for. */
static const char *cpu_missing(const char *requires, size_t *len) {
    for (const char *p = requires; *p;) {
        *len = strcspn(p, "+");
        const cpu_feature *f = FEATURES;
        while (f->name && !(strncmp(f->name, p, *len) == 0 && f->name[*len] == 0)) f++;
        if (!f->name || !f->present()) return p;
        p += *len + (p[*len] == '+');
    }
    return NULL;
}

static int cpu_has_all(const char *requires) {
    size_t len;
    return cpu_missing(requires, &len) == NULL;
}

/* Which backends this CPU can run, probed once by init (a probe per call would be slow), and
 * why not, for sdpa_info. */
static int runnable[N_BACKENDS];
static char backend_reason[N_BACKENDS][80];

/* The CPU as the dispatcher saw it, for sdpa_info and the per-CPU add-on rule; set by init. */
static struct {
    char vendor[16], model[64];
    int64_t number[4]; /* family, model, stepping, XCR0; -1 where unknown */
} cpu_seen;

#if defined(__aarch64__) && !defined(HWCAP_CPUID)
#define HWCAP_CPUID (1ul << 11)
#endif

static void cpu_identify(void) {
    for (int i = 0; i < 4; i++) cpu_seen.number[i] = -1;
    snprintf(cpu_seen.vendor, sizeof cpu_seen.vendor, "unknown");
#if defined(__x86_64__) || defined(__i386__)
    const X86Info info = GetX86Info();
    snprintf(cpu_seen.vendor, sizeof cpu_seen.vendor, "%s", info.vendor);
    const char *brand = info.brand_string;
    while (*brand == ' ') brand++;
    snprintf(cpu_seen.model, sizeof cpu_seen.model, "%s", brand);
    for (size_t len = strlen(cpu_seen.model); len && cpu_seen.model[len - 1] == ' ';)
        cpu_seen.model[--len] = 0;
    cpu_seen.number[0] = info.family;
    cpu_seen.number[1] = info.model;
    cpu_seen.number[2] = info.stepping;
    unsigned a, b, c, d;
    if (__get_cpuid(1, &a, &b, &c, &d) && (c & bit_OSXSAVE))
        cpu_seen.number[3] = (int64_t)read_xcr0();
#elif defined(__aarch64__)
    /* MIDR_EL1: Linux emulates the read for user space where it sets HWCAP_CPUID */
    if (getauxval(AT_HWCAP) & HWCAP_CPUID) {
        uint64_t midr;
        __asm__ volatile("mrs %0, MIDR_EL1" : "=r"(midr));
        snprintf(cpu_seen.vendor, sizeof cpu_seen.vendor, "0x%02x", (unsigned)(midr >> 24) & 0xff);
        snprintf(cpu_seen.model, sizeof cpu_seen.model, "part 0x%03x, variant %u, revision %u",
                 (unsigned)(midr >> 4) & 0xfff, (unsigned)(midr >> 20) & 0xf, (unsigned)midr & 0xf);
    }
#endif
}

/* Which backends this CPU runs, and in words why one does not. */
static void backends_probe(void) {
    for (size_t i = 0; i < N_BACKENDS; i++) {
        const backend *b = &BACKENDS[i];
        size_t len = 0;
        const char *missing = b->kernels ? cpu_missing(b->requires, &len) : NULL;
        runnable[i] = b->kernels != NULL && missing == NULL;
        char *why = backend_reason[i];
        if (!b->kernels && *b->arch && strcmp(b->arch, SDPA_BUILD_ARCH) != 0)
            snprintf(why, sizeof backend_reason[i], "not compiled into this library (%s only)",
                     b->arch);
        else if (!b->kernels)
            snprintf(why, sizeof backend_reason[i], "not compiled into this library");
        else if (missing)
            snprintf(why, sizeof backend_reason[i], "this CPU or OS lacks %.*s", (int)len, missing);
    }
}

/* The add-ons (meson.build: a record's 'addons'), and which are on: compiled in, every feature
 * present (the backend's and the add-on's own), and on by its variable or by default; set by
 * init, before anything can call them. bf16_dot is the only kind so far, so the table has its
 * type. default_on: 1 on, 0 off, -1 chosen per CPU (bf16_dot_default.h). */
typedef struct addon {
    const char *name, *kind, *backend;
    const sdpa_bf16_dot_kernels *table; /* NULL when not compiled into this library */
    const char *requires, *env;
    int default_on;
    const char *description;
} addon;
#define ADDON_(unused, name, kind, built, table, backend, requires, env, default_on, description)  \
    {#name,    #kind, #backend,   KERNELS_IF_BUILT_##built(table),                                 \
     requires, env,   default_on, description},
static const addon ADDONS[] = {SDPA_ADDONS(ADDON_, ){NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL}};
#undef ADDON_
#define N_ADDONS (sizeof ADDONS / sizeof ADDONS[0] - 1)
static int addon_on[N_ADDONS + 1];
static int addon_default[N_ADDONS + 1];        /* the default resolved for this CPU: 1 on, 0 off */
static const char *addon_reason[N_ADDONS + 1]; /* why it is on or off, for sdpa_info */

static const backend *find(const char *name) {
    for (size_t i = 0; i < N_BACKENDS; i++)
        if (strcmp(BACKENDS[i].name, name) == 0) return &BACKENDS[i];
    return NULL;
}

static const sdpa_kernels *best(void) {
    for (size_t i = 0; i < N_BACKENDS; i++)
        if (runnable[i]) return BACKENDS[i].kernels;
    return &sdpa_kernels_scalar;
}

static const char *const EXP_NAMES[SDPA_EXP_KINDS] = {"fast", "sleef"};

/* The CPU as bf16_dot_default.h's rule sees it, for the add-on i; amx_on: an add-on of the same
 * kind and backend listed before it is on (and so used first). */
static sdpa_cpu_id cpu_id_for(size_t i) {
    sdpa_cpu_id id = {"", 0, 0, cpu_has_all(ADDONS[i].requires), 0};
#if defined(__x86_64__) || defined(__i386__)
    id.vendor = cpu_seen.vendor;
    id.family = (int)cpu_seen.number[0];
    id.model = (int)cpu_seen.number[1];
#endif
    for (size_t j = 0; j < i; j++)
        if (addon_on[j] && strcmp(ADDONS[j].kind, ADDONS[i].kind) == 0 &&
            strcmp(ADDONS[j].backend, ADDONS[i].backend) == 0)
            id.amx_on = 1;
    return id;
}

/* Whether the add-on i is on, from its variable (on, off; unset, empty or auto: its default)
 * and what the CPU has. A value that is none of those is reported like an unknown backend: one
 * line saying what the default then gives here and why. */
static int addon_choose(size_t i) {
    const addon *a = &ADDONS[i];
    const char *env = getenv(a->env);
    const int runnable = a->table && cpu_has_all(a->requires);
    sdpa_addon_choice c;
    if (a->default_on < 0) {
        const sdpa_cpu_id id = cpu_id_for(i);
        addon_default[i] = sdpa_bf16_dot_default(&id, NULL).on;
        c = sdpa_bf16_dot_default(&id, env);
    } else {
        addon_default[i] = a->default_on;
        c.env_invalid = env && *env && strcmp(env, "auto") != 0 && strcmp(env, "on") != 0 &&
                        strcmp(env, "off") != 0;
        const int set = env && (!strcmp(env, "on") || !strcmp(env, "off"));
        c.on = set ? !strcmp(env, "on") : a->default_on;
        c.reason = set ? (c.on ? "turned on" : "turned off")
                       : (a->default_on ? "on by default" : "off by default");
    }
    if (!a->table) {
        c.on = 0, c.reason = "not compiled into this library";
    } else if (!runnable) {
        static char lacks[N_ADDONS + 1][64]; /* init runs once */
        size_t len = 0;
        const char *missing = cpu_missing(a->requires, &len);
        snprintf(lacks[i], sizeof lacks[i], "this CPU or OS lacks %.*s", (int)len, missing);
        c.on = 0, c.reason = lacks[i];
    }
    if (c.env_invalid)
        fprintf(stderr, "sdpa: %s=%s is not on, off or auto; using auto: %s (%s)\n", a->env, env,
                c.on ? "on" : "off", c.reason);
    addon_reason[i] = c.reason;
    return c.on;
}

static void addons_init(void) {
    for (size_t i = 0; i < N_ADDONS; i++) addon_on[i] = addon_choose(i);
}

static void init_once(void) {
    cpu_identify();
    backends_probe();
    addons_init();

    const sdpa_kernels *chosen = best();
    const char *forced = getenv("SDPA_BACKEND");
    if (forced && *forced && strcmp(forced, "auto") != 0) {
        const backend *b = find(forced);
        if (b && runnable[b - BACKENDS])
            chosen = b->kernels;
        else
            fprintf(stderr, "sdpa: SDPA_BACKEND=%s is %s; using %s\n", forced,
                    b ? "not supported on this CPU" : "not a known backend", chosen->name);
    }
    /* an unknown exp mode is reported like an unknown backend: one line, then the default */
    const char *exp = getenv("SDPA_EXP");
    int exp_kind = SDPA_EXP_FAST;
    if (exp && *exp) {
        int known = 0;
        for (int i = 0; i < SDPA_EXP_KINDS; i++)
            if (strcmp(exp, EXP_NAMES[i]) == 0) exp_kind = i, known = 1;
        if (!known)
            fprintf(stderr, "sdpa: SDPA_EXP=%s is not a known exp mode; using %s\n", exp,
                    EXP_NAMES[exp_kind]);
    }
    atomic_store_explicit(&sdpa_active_exp, exp_kind, memory_order_relaxed);
    atomic_store_explicit(&sdpa_active_kernels, chosen, memory_order_release);
}

void sdpa_dispatch_init(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, init_once);
}

__attribute__((cold, noinline)) const sdpa_kernels *sdpa_kernels_first(void) {
    sdpa_dispatch_init();
    return atomic_load_explicit(&sdpa_active_kernels, memory_order_acquire);
}

/* At load time, so that the first call pays nothing; calls that come earlier (from another
 * library's constructor) go through sdpa_dispatch_init themselves. */
__attribute__((constructor)) static void sdpa_load(void) { sdpa_dispatch_init(); }

/* the i-th add-on is a bf16 dot of backend k */
static int bf16_dot_of(size_t i, const sdpa_kernels *k) {
    return strcmp(ADDONS[i].kind, "bf16_dot") == 0 && strcmp(ADDONS[i].backend, k->name) == 0;
}

/* the i-th add-on may run here: for one that runs AMX tiles, Linux has granted them (asked now,
   at the first need) */
static int addon_permitted(size_t i) {
#if defined(__x86_64__) || defined(__i386__)
    if (strstr(ADDONS[i].requires, "AMX_TILE")) return amx_permission();
#else
    (void)i;
#endif
    return 1;
}

const sdpa_bf16_dot_kernels *sdpa_bf16_dot_for(const sdpa_kernels *k) {
    for (size_t i = 0; i < N_ADDONS; i++)
        if (addon_on[i] && bf16_dot_of(i, k) && addon_permitted(i)) return ADDONS[i].table;
    return NULL;
}

int sdpa_bf16_dot_addon(const sdpa_kernels *k, size_t index, sdpa_addon_info *info) {
    sdpa_dispatch_init();
    for (size_t i = 0; i < N_ADDONS; i++) {
        if (!bf16_dot_of(i, k) || index-- != 0) continue;
        info->name = ADDONS[i].name;
        info->requires = ADDONS[i].requires;
        info->env = ADDONS[i].env;
        info->default_on = addon_default[i];
        info->runnable = ADDONS[i].table && cpu_has_all(ADDONS[i].requires) && addon_permitted(i);
        info->on = addon_on[i] && info->runnable;
        info->table = info->runnable ? ADDONS[i].table : NULL;
        return 1;
    }
    return 0;
}

SDPA_API const char *sdpa_backend(void) { return sdpa_kernels_now()->name; }

SDPA_API int sdpa_backend_supported(const char *name) { return sdpa_backend_kernels(name) != NULL; }

SDPA_API const char *sdpa_backend_name(size_t index) {
    return index < N_BACKENDS ? BACKENDS[index].name : NULL;
}

const sdpa_kernels *sdpa_backend_kernels(const char *name) {
    sdpa_dispatch_init();
    const backend *b = name ? find(name) : NULL;
    return b && runnable[b - BACKENDS] ? b->kernels : NULL;
}

SDPA_API sdpa_status sdpa_set_backend(const char *name) {
    if (!name) return sdpa_fail(SDPA_ERR_NULL, "name is NULL");
    const sdpa_kernels *k =
        strcmp(name, "auto") == 0 ? (sdpa_dispatch_init(), best()) : sdpa_backend_kernels(name);
    if (!k)
        return sdpa_fail(SDPA_ERR_UNSUPPORTED, "backend \"%.64s\" is %s", name,
                         find(name) ? "not runnable on this CPU" : "not one this library knows");
    atomic_store_explicit(&sdpa_active_kernels, k, memory_order_release);
    return SDPA_OK;
}

SDPA_API const char *sdpa_exp_mode(void) { return EXP_NAMES[sdpa_exp_now()]; }

SDPA_API sdpa_status sdpa_set_exp_mode(const char *name) {
    if (!name) return sdpa_fail(SDPA_ERR_NULL, "name is NULL");
    sdpa_dispatch_init();
    for (int i = 0; i < SDPA_EXP_KINDS; i++) {
        if (strcmp(name, EXP_NAMES[i]) == 0) {
            atomic_store_explicit(&sdpa_active_exp, i, memory_order_relaxed);
            return SDPA_OK;
        }
    }
    return sdpa_fail(SDPA_ERR_UNSUPPORTED, "exp mode \"%.64s\" is not \"fast\" or \"sleef\"", name);
}

/* ---- sdpa_info: what init saw and chose ---- */

static size_t n_features(void) {
    size_t n = 0;
    while (FEATURES[n].name) n++;
    return n;
}

SDPA_API size_t sdpa_info_count(sdpa_info_kind kind) {
    switch (kind) {
    case SDPA_INFO_CPU: return 1;
    case SDPA_INFO_FEATURE: return n_features();
    case SDPA_INFO_BACKEND: return N_BACKENDS;
    case SDPA_INFO_ADDON: return N_ADDONS;
    case SDPA_INFO_TYPE: return SDPA_FP8_E5M2 + 1;
    }
    return 0;
}

/* The add-on i's flags: on as init chose it (an AMX one also needs Linux's grant, asked here as
 * at the first call that would use it), in use where its backend is active and no add-on of its
 * kind before it is on. */
static uint32_t addon_flags(size_t i, const char **reason) {
    const addon *a = &ADDONS[i];
    uint32_t flags = a->table ? SDPA_INFO_PRESENT : 0;
    if (a->table && cpu_has_all(a->requires)) flags |= SDPA_INFO_RUNNABLE;
    if (!addon_on[i]) return flags;
    if (!addon_permitted(i)) {
        *reason = "Linux did not grant the AMX tile state";
        return flags;
    }
    flags |= SDPA_INFO_ON;
    if (strcmp(a->backend, sdpa_backend()) != 0) return flags;
    for (size_t j = 0; j < i; j++)
        if (addon_on[j] && strcmp(ADDONS[j].kind, a->kind) == 0 &&
            strcmp(ADDONS[j].backend, a->backend) == 0 && addon_permitted(j))
            return flags;
    return flags | SDPA_INFO_IN_USE;
}

static void info_fill(sdpa_info_kind kind, size_t i, sdpa_info_entry *e) {
    if (kind == SDPA_INFO_CPU) {
        e->name = cpu_seen.vendor;
        e->description = cpu_seen.model;
        for (int j = 0; j < 4; j++) e->number[j] = cpu_seen.number[j];
    } else if (kind == SDPA_INFO_FEATURE) {
        e->name = FEATURES[i].name;
        e->flags = FEATURES[i].present() ? SDPA_INFO_PRESENT : 0;
    } else if (kind == SDPA_INFO_BACKEND) {
        const backend *b = &BACKENDS[i];
        e->name = b->name;
        e->description = b->description;
        e->requires = b->requires;
        e->arch = b->arch;
        e->reason = backend_reason[i];
        e->flags = (b->kernels ? SDPA_INFO_PRESENT : 0) | (runnable[i] ? SDPA_INFO_RUNNABLE : 0);
        if (b->kernels && b->kernels == sdpa_kernels_now())
            e->flags |= SDPA_INFO_ON | SDPA_INFO_IN_USE;
    } else if (kind == SDPA_INFO_TYPE) {
        e->name = SDPA_TYPE_NAMES[i];
        e->description = i <= SDPA_BF16 ? "q, k, v and out; sdpa_convert"
                                        : "k and v, with k_scale and v_scale; sdpa_convert";
        e->flags = SDPA_INFO_PRESENT;
        e->number[0] = (int64_t)i;
        e->number[1] = (int64_t)sdpa_type_size((uint32_t)i);
    } else {
        const addon *a = &ADDONS[i];
        e->name = a->name;
        e->description = a->description;
        e->requires = a->requires;
        e->backend = a->backend;
        e->variable = a->env;
        e->reason = addon_reason[i];
        e->flags = addon_flags(i, &e->reason);
        e->number[0] = a->default_on;
        e->number[1] = addon_default[i];
    }
}

SDPA_API sdpa_status sdpa_info(sdpa_info_kind kind, size_t index, sdpa_info_entry *entry) {
    if (!entry) return sdpa_fail(SDPA_ERR_NULL, "entry is NULL");
    const size_t count = sdpa_info_count(kind);
    if (count == 0) return sdpa_fail(SDPA_ERR_ARG, "kind (%d) is not an sdpa_info_kind", (int)kind);
    if (index >= count)
        return sdpa_fail(SDPA_ERR_ARG, "index (%zu) is past the last of %zu entries", index, count);
    /* ABI 1.3's struct; a later, longer one keeps it as its prefix */
    if (entry->struct_size < sizeof(sdpa_info_entry))
        return sdpa_fail(SDPA_ERR_ARG,
                         "entry->struct_size (%u) is below %zu, sizeof(sdpa_info_entry)",
                         (unsigned)entry->struct_size, sizeof(sdpa_info_entry));
    sdpa_dispatch_init();
    sdpa_info_entry e = {(uint32_t)sizeof e, 0, "", "", "", "", "", "", "", {0, 0, 0, 0}};
    info_fill(kind, index, &e);
    *entry = e;
    return SDPA_OK;
}
