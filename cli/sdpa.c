/* The sdpa command: what this CPU runs, why attention scales its scores, and how fast each
 * backend is. It loads the library as a plugin host does (dlopen + sdpa_get_api) and calls it
 * only through the table, so it is also the first client of the plugin ABI.
 *
 *   sdpa info [--json]
 *   sdpa demo [--seed N] [--dims LIST] [--backend NAME] [--plot FILE.png]
 *   sdpa bench [--json]
 *
 * Exit status: 0 success, 1 failure at run time (library not found, gnuplot failed), 2 usage
 * error (unknown command or option, bad value), with one line on stderr. */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <link.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "sdpa.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpu_features/cpuinfo_x86.h>
#include <cpuid.h>
#elif defined(__aarch64__)
#include <cpu_features/cpuinfo_aarch64.h>
#endif

#ifndef SDPA_SLEEF_VERSION
#define SDPA_SLEEF_VERSION "unknown"
#endif

static const sdpa_api *api;
static void *library;

/* ---- errors and option parsing ---- */

/* One line on stderr, exit status 2. */
static int usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("sdpa: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs(" (see 'sdpa --help')\n", stderr);
    va_end(ap);
    return 2;
}

/* Matches argv[*i] against --name or --name=value; stores the value (from the same or the next
 * argument). Returns 1 on a match, 0 if it is another option, -1 if the value is missing. */
static int option_value(int argc, char **argv, int *i, const char *name, const char **value) {
    size_t len = strlen(name);
    if (strncmp(argv[*i], name, len) != 0) return 0;
    if (argv[*i][len] == '=') {
        *value = argv[*i] + len + 1;
        return 1;
    }
    if (argv[*i][len] != 0) return 0;
    if (*i + 1 >= argc) return -1;
    *value = argv[++*i];
    return 1;
}

static int parse_u64(const char *s, uint64_t *out) {
    if (!*s || *s == '-') return 0;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return 0;
    *out = v;
    return 1;
}

/* ---- the library ---- */

/* Loads libsdpa.so.1 (or $SDPA_LIBRARY) and its v1 table; 0 on success. */
static int load_library(void) {
    const char *path = getenv("SDPA_LIBRARY");
    if (!path || !*path) path = "libsdpa.so.1";
    library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!library) {
        fprintf(stderr, "sdpa: cannot load %s: %s\n", path, dlerror());
        return 1;
    }
    const sdpa_api *(*get)(uint32_t) =
        (const sdpa_api *(*)(uint32_t))(uintptr_t)dlsym(library, "sdpa_get_api");
    api = get ? get(SDPA_ABI_VERSION) : NULL;
    if (!api) {
        fprintf(stderr, "sdpa: %s does not serve ABI version %u\n", path, SDPA_ABI_VERSION);
        return 1;
    }
    return 0;
}

/* The file the dynamic loader mapped for handle, or for the loaded object whose name contains
 * part (when part is not NULL); "" if unknown. */
static const char *loaded_file(void *handle, const char *part, char *buf, size_t size) {
    struct link_map *map = NULL;
    buf[0] = 0;
    if (dlinfo(handle, RTLD_DI_LINKMAP, &map) != 0 || !map) return buf;
    if (part) {
        while (map->l_prev) map = map->l_prev;
        while (map && !strstr(map->l_name, part)) map = map->l_next;
        if (!map) return buf;
    }
    char *real = realpath(map->l_name, NULL);
    snprintf(buf, size, "%s", real ? real : map->l_name);
    free(real);
    return buf;
}

/* ---- CPU ---- */

typedef struct feature {
    const char *name;
    int present;
} feature;

typedef struct cpu_report {
    char vendor[16];
    char model[64];
    int family, model_number, stepping;
    feature features[8];
    int n_features;
    int os_known, os_ymm, os_zmm; /* OS saves the AVX / AVX-512 register state (XCR0) */
    unsigned long long xcr0;
} cpu_report;

#if defined(__x86_64__) || defined(__i386__)
/* XCR0, read only when CPUID says the OS has enabled XSAVE (else xgetbv would fault). */
static int read_xcr0(unsigned long long *xcr0) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    *xcr0 = ((unsigned long long)hi << 32) | lo;
    return 1;
}
#endif

static cpu_report cpu_probe(void) {
    cpu_report r;
    memset(&r, 0, sizeof r);
#if defined(__x86_64__) || defined(__i386__)
    X86Info info = GetX86Info();
    snprintf(r.vendor, sizeof r.vendor, "%s", info.vendor);
    const char *brand = info.brand_string;
    while (*brand == ' ') brand++;
    snprintf(r.model, sizeof r.model, "%s", brand);
    for (size_t len = strlen(r.model); len && r.model[len - 1] == ' ';) r.model[--len] = 0;
    r.family = info.family;
    r.model_number = info.model;
    r.stepping = info.stepping;
    feature f[] = {{"SSE4.1", info.features.sse4_1},
                   {"AVX", info.features.avx},
                   {"AVX2", info.features.avx2},
                   {"FMA", info.features.fma3},
                   {"AVX-512F", info.features.avx512f}};
    r.n_features = (int)(sizeof f / sizeof f[0]);
    memcpy(r.features, f, sizeof f);
    r.os_known = read_xcr0(&r.xcr0);
    r.os_ymm = (r.xcr0 & 0x6) == 0x6;   /* SSE and AVX state */
    r.os_zmm = (r.xcr0 & 0xe6) == 0xe6; /* plus opmask, ZMM0-15 upper halves, ZMM16-31 */
#elif defined(__aarch64__)
    Aarch64Info info = GetAarch64Info();
    snprintf(r.vendor, sizeof r.vendor, "0x%02x", info.implementer);
    snprintf(r.model, sizeof r.model, "part 0x%03x, variant %d, revision %d", info.part,
             info.variant, info.revision);
    feature f[] = {{"ASIMD", info.features.asimd}, {"SVE", info.features.sve}};
    r.n_features = (int)(sizeof f / sizeof f[0]);
    memcpy(r.features, f, sizeof f);
#else
    snprintf(r.vendor, sizeof r.vendor, "unknown");
#endif
    return r;
}

static int has_feature(const cpu_report *r, const char *name) {
    for (int i = 0; i < r->n_features; i++)
        if (strcmp(r->features[i].name, name) == 0) return r->features[i].present;
    return 0;
}

/* Whether this command was built alongside each backend (the library it loads is normally the
 * one built with it; a backend the library reports as supported is compiled in either way). */
static int built_with(const char *name) {
    static const char *const BUILT[] = {
#if defined(SDPA_HAVE_SSE41)
        "sse",
#endif
#if defined(SDPA_HAVE_AVX2)
        "avx2",
#endif
#if defined(SDPA_HAVE_AVX512)
        "avx512",
#endif
#if defined(SDPA_HAVE_NEON)
        "neon",
#endif
        "scalar"
    };
    for (size_t i = 0; i < sizeof BUILT / sizeof BUILT[0]; i++)
        if (strcmp(BUILT[i], name) == 0) return 1;
    return 0;
}

/* Why this CPU cannot run a backend, or NULL if it can (the dispatcher's rules). */
static const char *cpu_reason(const cpu_report *r, const char *name) {
    if (strcmp(name, "avx512") == 0) {
        if (has_feature(r, "AVX-512F")) return NULL;
        return r->os_known && !r->os_zmm ? "OS does not enable the ZMM/opmask state"
                                         : "CPU lacks AVX-512F";
    }
    if (strcmp(name, "avx2") == 0) {
        if (!has_feature(r, "AVX2")) return "CPU lacks AVX2";
        if (!has_feature(r, "FMA")) return "CPU lacks FMA";
        return NULL;
    }
    if (strcmp(name, "sse") == 0) return has_feature(r, "SSE4.1") ? NULL : "CPU lacks SSE4.1";
    if (strcmp(name, "neon") == 0) {
#if defined(__aarch64__)
        return has_feature(r, "ASIMD") ? NULL : "CPU lacks ASIMD";
#else
        return "AArch64 only";
#endif
    }
    return NULL;
}

/* ---- JSON ---- */

static void json_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

static const char *json_bool(int b) { return b ? "true" : "false"; }

/* ---- info ---- */

typedef struct backend_row {
    const char *name;
    int compiled, supported, active;
    char note[128];
} backend_row;

enum { MAX_BACKENDS = 16 };

/* The backend table of `sdpa info`; returns the number of rows and whether SDPA_BACKEND forced
 * the active backend. */
static size_t backend_rows(const cpu_report *cpu, backend_row *rows, int *forced) {
    const char *env = getenv("SDPA_BACKEND");
    int env_set = env && *env && strcmp(env, "auto") != 0;
    const char *active = api->backend();
    *forced = env_set && strcmp(env, active) == 0;
    size_t n = 0, active_index = 0;
    const char *best = NULL;
    for (size_t i = 0; api->backend_name(i) && n < MAX_BACKENDS; i++, n++) {
        backend_row *r = &rows[i];
        r->name = api->backend_name(i);
        r->supported = api->backend_supported(r->name);
        r->compiled = r->supported || built_with(r->name);
        r->active = strcmp(r->name, active) == 0;
        if (r->active) active_index = i;
        if (r->supported && !best) best = r->name;
    }
    for (size_t i = 0; i < n; i++) {
        backend_row *r = &rows[i];
        const char *why = cpu_reason(cpu, r->name);
        if (r->active)
            snprintf(r->note, sizeof r->note, "%s",
                     *forced                              ? "active: forced by SDPA_BACKEND"
                     : best && strcmp(best, r->name) == 0 ? "active: the best this CPU and OS run"
                                                          : "active: chosen with sdpa_set_backend");
        else if (!r->compiled)
            snprintf(r->note, sizeof r->note, "not compiled into this library%s%s%s",
                     why ? " (" : "", why ? why : "", why ? ")" : "");
        else if (!r->supported)
            snprintf(r->note, sizeof r->note, "%s", why ? why : "not runnable here");
        else if (i < active_index)
            snprintf(r->note, sizeof r->note, "runnable, not chosen: %s",
                     *forced ? "SDPA_BACKEND forces another" : "another was set at run time");
        else
            snprintf(r->note, sizeof r->note, "runnable; a better backend is active");
    }
    return n;
}

static int cmd_info(int json) {
    cpu_report cpu = cpu_probe();
    backend_row rows[MAX_BACKENDS];
    int forced;
    size_t n = backend_rows(&cpu, rows, &forced);
    char lib_path[PATH_MAX], sleef_path[PATH_MAX];
    loaded_file(library, NULL, lib_path, sizeof lib_path);
    loaded_file(library, "libsleef", sleef_path, sizeof sleef_path);
    const char *env = getenv("SDPA_BACKEND");

    if (json) {
        printf("{\n  \"command_version\": ");
        json_string(SDPA_COMMAND_VERSION);
        printf(",\n  \"library\": {\"path\": ");
        json_string(lib_path);
        printf(", \"version\": ");
        json_string(api->version());
        printf(", \"abi_version\": %u, \"table_size\": %u},\n", api->abi_version_fn(),
               api->struct_size);
        printf("  \"sleef\": {\"version\": ");
        json_string(SDPA_SLEEF_VERSION);
        printf(", \"path\": ");
        json_string(sleef_path);
        printf("},\n  \"cpu\": {\"vendor\": ");
        json_string(cpu.vendor);
        printf(", \"model\": ");
        json_string(cpu.model);
        printf(", \"family\": %d, \"model_number\": %d, \"stepping\": %d, \"features\": {",
               cpu.family, cpu.model_number, cpu.stepping);
        for (int i = 0; i < cpu.n_features; i++) {
            printf("%s", i ? ", " : "");
            json_string(cpu.features[i].name);
            printf(": %s", json_bool(cpu.features[i].present));
        }
        printf("}");
        if (cpu.os_known)
            printf(", \"os\": {\"xcr0\": %llu, \"ymm_state\": %s, \"zmm_state\": %s}", cpu.xcr0,
                   json_bool(cpu.os_ymm), json_bool(cpu.os_zmm));
        printf("},\n  \"backends\": [\n");
        for (size_t i = 0; i < n; i++) {
            printf("    {\"name\": ");
            json_string(rows[i].name);
            printf(", \"compiled\": %s, \"supported\": %s, \"active\": %s, \"note\": ",
                   json_bool(rows[i].compiled), json_bool(rows[i].supported),
                   json_bool(rows[i].active));
            json_string(rows[i].note);
            printf("}%s\n", i + 1 < n ? "," : "");
        }
        printf("  ],\n  \"active\": ");
        json_string(api->backend());
        printf(",\n  \"forced\": %s,\n  \"sdpa_backend_env\": ", json_bool(forced));
        if (env)
            json_string(env);
        else
            printf("null");
        printf(",\n  \"exp_mode\": ");
        json_string(api->exp_mode());
        printf("\n}\n");
        return 0;
    }

    printf("sdpa %s\n", SDPA_COMMAND_VERSION);
    printf("  library   %s\n            version %s, ABI %u (table of %u bytes)\n", lib_path,
           api->version(), api->abi_version_fn(), api->struct_size);
    printf("  SLEEF     %s%s%s\n", SDPA_SLEEF_VERSION, *sleef_path ? ", " : "", sleef_path);
    printf("\nCPU\n  vendor    %s\n  model     %s\n", cpu.vendor, *cpu.model ? cpu.model : "?");
#if defined(__x86_64__) || defined(__i386__)
    printf("            family %d, model %d, stepping %d\n", cpu.family, cpu.model_number,
           cpu.stepping);
#endif
    printf("  features ");
    for (int i = 0; i < cpu.n_features; i++)
        printf(" %s %s", cpu.features[i].name, cpu.features[i].present ? "yes" : "no");
    printf("\n");
    if (cpu.os_known)
        printf("  OS        saves AVX (YMM) state: %s, AVX-512 (ZMM, opmask) state: %s "
               "(XCR0 = 0x%llx)\n",
               cpu.os_ymm ? "yes" : "no", cpu.os_zmm ? "yes" : "no", cpu.xcr0);
    printf("\nBackends, best first\n  %-8s %-9s %-10s %-7s %s\n", "name", "compiled", "supported",
           "active", "");
    for (size_t i = 0; i < n; i++)
        printf("  %-8s %-9s %-10s %-7s %s\n", rows[i].name, rows[i].compiled ? "yes" : "no",
               rows[i].supported ? "yes" : "no", rows[i].active ? "yes" : "-", rows[i].note);
    if (env && *env && strcmp(env, "auto") != 0 && !forced)
        printf("\n  SDPA_BACKEND=%s was ignored: %s\n", env,
               api->backend_supported(env) ? "another backend was set at run time"
                                           : "not a backend this library and CPU can run");
    printf("\nactive backend: %s%s; exp: %s\n", api->backend(),
           forced ? " (forced by SDPA_BACKEND)" : "", api->exp_mode());
    return 0;
}

/* ---- demo ---- */

/* xorshift64*: deterministic for a seed, the same on every machine. */
typedef struct rng {
    uint64_t s;
} rng;

static rng rng_seed(uint64_t seed) {
    rng r = {seed * 0x9E3779B97F4A7C15ULL ^ 0xD1B54A32D192ED03ULL};
    if (!r.s) r.s = 1;
    return r;
}

static double uniform01(rng *r) {
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return (double)((r->s * 0x2545F4914F6CDD1DULL) >> 11) * 0x1p-53;
}

static void fill(rng *r, float *x, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * (float)uniform01(r);
}

static void mean_var(const double *x, size_t n, double *mean, double *var) {
    double m = 0, v = 0;
    for (size_t i = 0; i < n; i++) m += x[i];
    m /= (double)n;
    for (size_t i = 0; i < n; i++) v += (x[i] - m) * (x[i] - m);
    *mean = m;
    *var = v / (double)(n - 1);
}

static void print_vector(const float *x, size_t n, int digits) {
    printf("[");
    for (size_t i = 0; i < n; i++) printf("%s%.*f", i ? ", " : "", digits, x[i]);
    printf("]");
}

static void heading(const char *title) {
    printf("\n%s\n", title);
    for (const char *c = title; *c; c++) putchar('=');
    printf("\n\n");
}

enum { MAX_DIMS = 8, PAIRS = 1000, BINS = 15 };

/* Var(x*y) for independent x, y uniform on [0, 1): E[x^2] E[y^2] - (E[x] E[y])^2. */
static const double VAR_XY = 1.0 / 9.0 - 1.0 / 16.0; /* 7/144 */

typedef struct histogram {
    double lo, width;
    int count[MAX_DIMS][BINS];
} histogram;

static void histogram_fill(histogram *h, size_t col, const double *x, size_t n) {
    for (size_t i = 0; i < n; i++) {
        long b = (long)floor((x[i] - h->lo) / h->width);
        b = b < 0 ? 0 : b >= BINS ? BINS - 1 : b; /* the end bins also hold what lies beyond */
        h->count[col][b]++;
    }
}

/* Bins down, one column per dimension; each column's bars are scaled to its tallest bin, so
 * the columns compare by width of spread, not by height. */
static void histogram_print(const histogram *h, const size_t *dims, size_t n_dims) {
    int top[MAX_DIMS];
    for (size_t c = 0; c < n_dims; c++) {
        top[c] = 1;
        for (int b = 0; b < BINS; b++)
            if (h->count[c][b] > top[c]) top[c] = h->count[c][b];
    }
    enum { BAR = 14 };
    printf("  %17s", "bin");
    for (size_t c = 0; c < n_dims; c++) printf("  d = %-*zu", BAR - 4, dims[c]);
    printf("\n");
    for (int b = 0; b < BINS; b++) {
        printf("  [%7.2f,%7.2f)", h->lo + b * h->width, h->lo + (b + 1) * h->width);
        for (size_t c = 0; c < n_dims; c++) {
            int len = (int)lround((double)h->count[c][b] * BAR / top[c]);
            if (len == 0 && h->count[c][b] > 0) len = 1;
            printf("  %.*s%*s", len, "##############", BAR - len, "");
        }
        printf("\n");
    }
}

static int find_on_path(const char *program) {
    const char *path = getenv("PATH");
    if (!path) return 0;
    char buf[PATH_MAX];
    for (const char *p = path; *p;) {
        size_t len = strcspn(p, ":");
        snprintf(buf, sizeof buf, "%.*s/%s", (int)len, p, program);
        if (len && access(buf, X_OK) == 0) return 1;
        p += len;
        if (*p == ':') p++;
    }
    return 0;
}

/* Writes the two histograms as a PNG with gnuplot; 0 on success. */
static int plot(const char *file, const histogram *raw, const histogram *scaled, const size_t *dims,
                size_t n_dims) {
    char data[] = "/tmp/sdpa-plot-XXXXXX";
    int fd = mkstemp(data);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        fprintf(stderr, "sdpa demo: cannot write a temporary file: %s\n", strerror(errno));
        return 1;
    }
    const histogram *hs[2] = {raw, scaled};
    for (int k = 0; k < 2; k++) {
        for (int b = 0; b < BINS; b++) {
            fprintf(f, "%g", hs[k]->lo + (b + 0.5) * hs[k]->width);
            for (size_t c = 0; c < n_dims; c++) fprintf(f, " %d", hs[k]->count[c][b]);
            fprintf(f, "\n");
        }
        fprintf(f, "\n\n");
    }
    fclose(f);
    FILE *g = popen("gnuplot", "w");
    if (!g) {
        remove(data);
        fprintf(stderr, "sdpa demo: cannot run gnuplot: %s\n", strerror(errno));
        return 1;
    }
    fprintf(g, "set terminal pngcairo size 1200,500\nset output '");
    for (const char *c = file; *c; c++) fprintf(g, *c == '\'' ? "''" : "%c", *c);
    fprintf(g, "'\nset multiplot layout 1,2\nset style data histeps\nset ylabel 'pairs'\n");
    const char *titles[2] = {"x.y - d/4 (raw dot product, centred)",
                             "(x.y - d/4) / sqrt(d) (scaled)"};
    for (int k = 0; k < 2; k++) {
        fprintf(g, "set title '%s'\nplot ", titles[k]);
        for (size_t c = 0; c < n_dims; c++)
            fprintf(g, "%s'%s' index %d using 1:%zu title 'd = %zu' lw 2", c ? ", " : "", data, k,
                    c + 2, dims[c]);
        fprintf(g, "\n");
    }
    fprintf(g, "unset multiplot\n");
    int status = pclose(g);
    remove(data);
    if (status != 0) {
        fprintf(stderr, "sdpa demo: gnuplot failed to write %s\n", file);
        return 1;
    }
    printf("\n  wrote %s\n", file);
    return 0;
}

/* 1. Dot products grow with the dimension. */
static void demo_dot(void) {
    heading("1. Dot products grow with the dimension");
    const float a[] = {1, 2, 3, 4, 5, 6}, b[] = {3, 4, 5, 6, 7, 8};
    for (size_t n = 2; n <= 6; n += 2) {
        char left[96];
        int len = 0;
        for (int side = 0; side < 2; side++) {
            const float *v = side ? b : a;
            len += snprintf(left + len, sizeof left - len, "%s[", side ? " . " : "");
            for (size_t i = 0; i < n; i++)
                len += snprintf(left + len, sizeof left - len, "%s%g", i ? ", " : "", v[i]);
            len += snprintf(left + len, sizeof left - len, "]");
        }
        float r;
        api->dot_f32(a, b, n, &r);
        printf("  d = %zu:  %-40s = %g\n", n, left, r);
    }
}

/* 2. The variance of the dot product grows linearly with d; dividing by sqrt(d) flattens it. */
static int demo_variance(rng *r, const size_t *dims, size_t n_dims, const char *plot_file) {
    heading("2. Their variance grows linearly with d; divided by sqrt(d) it stays flat");
    printf("  %d pairs of random vectors x, y per d, components uniform in [0, 1).\n", PAIRS);
    printf(
        "  Theory: E[x.y] = d/4, Var(x.y) = d * Var(x_i y_i) = d * (1/9 - 1/16) = d * 7/144.\n\n");
    printf("  %6s %10s %9s %11s %11s %14s %13s\n", "d", "mean x.y", "(d/4)", "var x.y", "(d*7/144)",
           "var x.y/sqrt d", "(7/144)");
    size_t d_max = 1;
    for (size_t c = 0; c < n_dims; c++) d_max = dims[c] > d_max ? dims[c] : d_max;
    float *x = malloc(d_max * sizeof *x), *y = malloc(d_max * sizeof *y);
    double *dot = malloc(PAIRS * sizeof *dot), *scaled = malloc(PAIRS * sizeof *scaled);
    if (!x || !y || !dot || !scaled) {
        fprintf(stderr, "sdpa demo: out of memory\n");
        return 1;
    }
    /* Centred at d/4 so that every d shares one axis: the spread is what grows. */
    double sd_max = sqrt((double)d_max * VAR_XY);
    histogram raw_h = {-4 * sd_max, 8 * sd_max / BINS, {{0}}};
    histogram scaled_h = {-4 * sqrt(VAR_XY), 8 * sqrt(VAR_XY) / BINS, {{0}}};
    for (size_t c = 0; c < n_dims; c++) {
        size_t d = dims[c];
        for (int p = 0; p < PAIRS; p++) {
            fill(r, x, d, 0, 1);
            fill(r, y, d, 0, 1);
            float v;
            api->dot_f32(x, y, d, &v);
            dot[p] = v;
        }
        double m, var, ms, vars;
        mean_var(dot, PAIRS, &m, &var);
        for (int p = 0; p < PAIRS; p++) {
            scaled[p] = (dot[p] - d / 4.0) / sqrt((double)d);
            dot[p] -= d / 4.0;
        }
        mean_var(scaled, PAIRS, &ms, &vars);
        printf("  %6zu %10.3f %9.3f %11.4f %11.4f %14.4f %13.4f\n", d, m, d / 4.0, var, d * VAR_XY,
               vars, VAR_XY);
        histogram_fill(&raw_h, c, dot, PAIRS);
        histogram_fill(&scaled_h, c, scaled, PAIRS);
    }
    printf("\n  Distribution of x.y - d/4 (the end bins also count what lies beyond):\n\n");
    histogram_print(&raw_h, dims, n_dims);
    printf("\n  Distribution of (x.y - d/4) / sqrt(d): the same shape for every d.\n\n");
    histogram_print(&scaled_h, dims, n_dims);
    free(x);
    free(y);
    free(dot);
    free(scaled);
    return plot_file ? plot(plot_file, &raw_h, &scaled_h, dims, n_dims) : 0;
}

static void softmax_line(const char *label, const float *z, size_t n, float scale) {
    float y[2];
    api->softmax_f32(y, z, n, scale);
    printf("  %-45s = ", label);
    print_vector(y, n, 3);
    if (y[0] < 0.001f) printf("   (%.3g, %.6f)", y[0], y[1]);
    printf("\n");
}

/* 3. Softmax saturates on large scores. */
static void demo_softmax(void) {
    heading("3. Softmax saturates on large scores");
    const float z1[] = {14, 10}, z2[] = {4, 5}, z3[] = {1, 10};
    printf("  Two scores, raw and divided by sqrt(d_k) for d_k = 4:\n\n");
    softmax_line("softmax([14, 10])", z1, 2, 1.0f);
    softmax_line("softmax([14, 10] / sqrt(4)) = softmax([7, 5])", z1, 2, 0.5f);
    softmax_line("softmax([4, 5])", z2, 2, 1.0f);
    softmax_line("softmax([1, 10])", z3, 2, 1.0f);
    printf("\n  A gap of 4 between two scores already gives 98%% of the weight to one of them;\n"
           "  dividing by sqrt(d_k) = 2 halves the gap and keeps both in play.\n");
}

/* Largest |d softmax_i / d z_j| at the softmax output y, each row of the Jacobian from
 * sdpa_softmax_backward_f32 with a unit upstream gradient. */
static double largest_gradient(const float *y, size_t n) {
    float dy[64], dx[64];
    double top = 0;
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < n; j++) dy[j] = i == j ? 1.0f : 0.0f;
        api->softmax_backward_f32(dx, y, dy, n, 1.0f);
        for (size_t j = 0; j < n; j++) top = fabs(dx[j]) > top ? fabs(dx[j]) : top;
    }
    return top;
}

/* 4. Gradients vanish when softmax saturates. */
static int demo_gradient(rng *r, const size_t *dims, size_t n_dims) {
    heading("4. Gradients vanish when softmax saturates");
    printf("  Jacobian d sigma_i / d z_j = sigma_i (delta_ij - sigma_j), by "
           "sdpa_softmax_backward_f32:\n\n");
    const float sigmas[2][2] = {{0.99f, 0.01f}, {0.881f, 0.119f}};
    for (int s = 0; s < 2; s++) {
        float dx[2][2];
        for (int i = 0; i < 2; i++) {
            float dy[2] = {i == 0, i == 1};
            api->softmax_backward_f32(dx[i], sigmas[s], dy, 2, 1.0f);
        }
        printf("  sigma = [%.3f, %.3f]:  [[%8.4f, %8.4f], [%8.4f, %8.4f]]\n", sigmas[s][0],
               sigmas[s][1], dx[0][0], dx[0][1], dx[1][0], dx[1][1]);
    }
    enum { KEYS = 2, TRIALS = 500 };
    printf("\n  Largest Jacobian entry, sigma_1 sigma_2, for one query against %d keys\n"
           "  (components uniform in [0, 1)), averaged over %d queries:\n\n",
           KEYS, TRIALS);
    printf("  %6s %16s %22s\n", "d", "softmax(q.k)", "softmax(q.k / sqrt d)");
    size_t d_max = 1;
    for (size_t c = 0; c < n_dims; c++) d_max = dims[c] > d_max ? dims[c] : d_max;
    float *q = malloc(d_max * sizeof *q), *k = malloc(KEYS * d_max * sizeof *k);
    if (!q || !k) {
        fprintf(stderr, "sdpa demo: out of memory\n");
        return 1;
    }
    for (size_t c = 0; c < n_dims; c++) {
        size_t d = dims[c];
        double sum[2] = {0, 0};
        for (int t = 0; t < TRIALS; t++) {
            fill(r, q, d, 0, 1);
            fill(r, k, KEYS * d, 0, 1);
            float scores[KEYS], y[KEYS];
            api->scores_f32(scores, q, k, KEYS, d, d, 1.0f);
            for (int scaled = 0; scaled < 2; scaled++) {
                api->softmax_f32(y, scores, KEYS, scaled ? (float)(1 / sqrt((double)d)) : 1.0f);
                sum[scaled] += largest_gradient(y, KEYS);
            }
        }
        printf("  %6zu %16.4f %22.4f\n", d, sum[0] / TRIALS, sum[1] / TRIALS);
    }
    printf("\n  (0.25 is the most it can be, at sigma = [0.5, 0.5]; 0.0099 at [0.99, 0.01].)\n");
    free(q);
    free(k);
    return 0;
}

static void print_matrix(const char *const *labels, const float *w, size_t n) {
    printf("  %6s", "");
    for (size_t j = 0; j < n; j++) printf(" %6s", labels[j]);
    printf("\n");
    for (size_t i = 0; i < n; i++) {
        printf("  %6s", labels[i]);
        for (size_t j = 0; j < n; j++) printf(" %6.3f", w[i * n + j]);
        printf("\n");
    }
}

/* 5. A small attention: the weights from the kernels (scores, softmax), the output from the
 * fused sdpa_attention_f32, checked against the weights times V. */
static void demo_attention(rng *r) {
    heading("5. A small attention");
    enum { T = 6, D = 64, SHOW = 4 };
    static const char *const TOKENS[T] = {"the", "cat", "sat", "on", "the", "mat"};
    float q[T * D], k[T * D], v[T * D], vt[D * T], w[T * T], out[T * D], composed[T * D];
    fill(r, q, T * D, -1, 1);
    fill(r, k, T * D, -1, 1);
    fill(r, v, T * D, -1, 1);
    for (size_t t = 0; t < T; t++)
        for (size_t c = 0; c < D; c++) vt[c * T + t] = v[t * D + c];
    printf("  \"the cat sat on the mat\": Q, K, V are %d x %d, random in [-1, 1).\n"
           "  weights = softmax(Q K^T * scale) by sdpa_scores_f32 + sdpa_softmax_f32;\n"
           "  output by the fused sdpa_attention_f32, which never forms the weights.\n",
           T, D);
    double worst = 0; /* fused output against weights V (sdpa_dot_f32), both scalings */
    double row_max[2] = {0, 0};
    for (int scaled = 0; scaled < 2; scaled++) {
        float scale = scaled ? (float)(1 / sqrt((double)D)) : 1.0f;
        for (size_t i = 0; i < T; i++) {
            api->scores_f32(w + i * T, q + i * D, k, T, D, D, 1.0f);
            api->softmax_f32(w + i * T, w + i * T, T, scale);
            for (size_t c = 0; c < D; c++)
                api->dot_f32(w + i * T, vt + c * T, T, composed + i * D + c);
            float top = 0;
            for (size_t j = 0; j < T; j++) top = w[i * T + j] > top ? w[i * T + j] : top;
            row_max[scaled] += top / T;
        }
        if (!SDPA_API_HAS(api, attention_f32) ||
            api->attention_f32(out, q, k, v, T, T, D, D, scale, 0) != SDPA_OK)
            memcpy(out, composed, sizeof out); /* a 1.0 library without attention */
        for (size_t i = 0; i < T * D; i++) {
            double e = fabs((double)out[i] - composed[i]);
            worst = e > worst ? e : worst;
        }
        printf("\n  Attention weights, %s:\n\n", scaled ? "scaled by 1/sqrt(64)" : "unscaled");
        print_matrix(TOKENS, w, T);
        printf("\n  Output, first %d of %d columns:\n\n", SHOW, D);
        for (size_t i = 0; i < T; i++) {
            printf("  %6s", TOKENS[i]);
            for (size_t c = 0; c < SHOW; c++) printf(" %7.3f", out[i * D + c]);
            printf("\n");
        }
    }
    printf("\n  Largest weight in a row, on average: %.2f unscaled, %.2f scaled (1/%d would be\n"
           "  uniform). Unscaled, a row leans on one or two tokens and softmax sits where its\n"
           "  gradient is small; scaled, every token still mixes in the others.\n",
           row_max[0], row_max[1], T);
    printf("\n  The fused output and weights V agree to %.1e (largest difference).\n", worst);
}

static int parse_dims(const char *s, size_t *dims, size_t *n_dims) {
    *n_dims = 0;
    while (*s) {
        char *end;
        if (*s < '0' || *s > '9') return 0;
        errno = 0;
        unsigned long v = strtoul(s, &end, 10);
        if (errno || v == 0 || v > 100000 || *n_dims == MAX_DIMS) return 0;
        dims[(*n_dims)++] = v;
        s = end;
        if (*s == ',') {
            s++;
            if (!*s) return 0;
        } else if (*s) {
            return 0;
        }
    }
    return *n_dims > 0;
}

static int cmd_demo(uint64_t seed, const size_t *dims, size_t n_dims, const char *plot_file) {
    printf("sdpa demo: why attention divides its scores by sqrt(d_k)\n");
    printf("(library %s, backend %s, seed %llu)\n", api->version(), api->backend(),
           (unsigned long long)seed);
    rng r = rng_seed(seed);
    demo_dot();
    if (demo_variance(&r, dims, n_dims, plot_file)) return 1;
    demo_softmax();
    if (demo_gradient(&r, dims, n_dims)) return 1;
    demo_attention(&r);
    return 0;
}

/* ---- bench ---- */

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct bench_data {
    size_t n;
    float *a, *b, *y;
    /* attention, fused: len_q x len_kv, d_k = d_v = d */
    size_t lq, lkv, d;
    uint32_t flags;
    float *q, *k, *v, *out;
} bench_data;

enum { KERNEL_DOT, KERNEL_SOFTMAX, KERNEL_ATTENTION };
static const char *const KERNEL_NAMES[] = {"dot", "softmax", "attention"};

static void run_once(int kernel, bench_data *bd) {
    float r;
    switch (kernel) {
    case KERNEL_DOT: api->dot_f32(bd->a, bd->b, bd->n, &r); break;
    case KERNEL_SOFTMAX: api->softmax_f32(bd->y, bd->a, bd->n, 0.125f); break;
    case KERNEL_ATTENTION:
        api->attention_f32(bd->out, bd->q, bd->k, bd->v, bd->lq, bd->lkv, bd->d, bd->d,
                           SDPA_DEFAULT_SCALE, bd->flags);
        break;
    }
}

/* Best time of 5 runs of enough calls for about 4 ms each, in nanoseconds per call. */
static double time_kernel(int kernel, bench_data *bd) {
    long calls = 1;
    for (;;) {
        double t0 = now_seconds();
        for (long i = 0; i < calls; i++) run_once(kernel, bd);
        double dt = now_seconds() - t0;
        if (dt > 0.004 || calls > (1L << 24)) break;
        calls *= dt > 0.0005 ? (long)(0.004 / dt) + 1 : 8;
    }
    double best = INFINITY;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now_seconds();
        for (long i = 0; i < calls; i++) run_once(kernel, bd);
        double dt = (now_seconds() - t0) / (double)calls;
        best = dt < best ? dt : best;
    }
    return best * 1e9;
}

/* One row of the table: a kernel at a size (an attention shape in the benchdnn style). */
typedef struct bench_row {
    int kernel;
    size_t n, lq, lkv, d;
    uint32_t flags;
    char label[32];
} bench_row;

static double row_flops(const bench_row *row) {
    if (row->kernel == KERNEL_DOT) return 2.0 * (double)row->n;
    if (row->kernel == KERNEL_SOFTMAX) return 0; /* not a flop-bound kernel: ns/element */
    double pairs = (double)row->lq * (double)row->lkv;
    if (row->flags & SDPA_CAUSAL) pairs = (double)row->lq * ((double)row->lq + 1) / 2;
    return 4.0 * pairs * (double)row->d; /* Q K^T and P V */
}

static int cmd_bench(int json) {
    static const size_t SIZES[] = {256, 4096, 65536};
    static const struct {
        size_t lq, lkv, d;
        uint32_t flags;
    } SHAPES[] = {{1, 4096, 128, 0}, {256, 256, 64, 0}, {256, 256, 64, SDPA_CAUSAL}};
    enum {
        N_SIZES = 3,
        N_SHAPES = 3,
        ROWS = 2 * N_SIZES + N_SHAPES,
        QMAX = 256 * 128,
        KMAX = 4096 * 128
    };
    size_t n_max = SIZES[N_SIZES - 1];
    if (!SDPA_API_HAS(api, attention_f32)) {
        fprintf(stderr, "sdpa bench: this library has no attention_f32\n");
        return 1;
    }
    bench_data bd = {.a = malloc(n_max * 4),
                     .b = malloc(n_max * 4),
                     .y = malloc(n_max * 4),
                     .q = malloc(QMAX * 4),
                     .k = malloc(KMAX * 4),
                     .v = malloc(KMAX * 4),
                     .out = malloc(QMAX * 4)};
    int status = 0;
    if (!bd.a || !bd.b || !bd.y || !bd.q || !bd.k || !bd.v || !bd.out) {
        fprintf(stderr, "sdpa bench: out of memory\n");
        status = 1;
        goto done;
    }
    rng r = rng_seed(1);
    fill(&r, bd.a, n_max, -1, 1);
    fill(&r, bd.b, n_max, -1, 1);
    fill(&r, bd.q, QMAX, -1, 1);
    fill(&r, bd.k, KMAX, -1, 1);
    fill(&r, bd.v, KMAX, -1, 1);

    bench_row rows[ROWS];
    for (int i = 0; i < ROWS; i++) {
        bench_row *row = &rows[i];
        memset(row, 0, sizeof *row);
        if (i < 2 * N_SIZES) {
            row->kernel = i / N_SIZES;
            row->n = SIZES[i % N_SIZES];
            snprintf(row->label, sizeof row->label, "n=%zu", row->n);
        } else {
            int sh = i - 2 * N_SIZES;
            row->kernel = KERNEL_ATTENTION;
            row->lq = SHAPES[sh].lq;
            row->lkv = SHAPES[sh].lkv;
            row->d = SHAPES[sh].d;
            row->flags = SHAPES[sh].flags;
            snprintf(row->label, sizeof row->label, "q%zuk%zud%zu%s", row->lq, row->lkv, row->d,
                     row->flags & SDPA_CAUSAL ? " causal" : "");
        }
    }

    char initial[32];
    snprintf(initial, sizeof initial, "%s", api->backend());
    const char *names[MAX_BACKENDS];
    size_t n_backends = 0;
    for (size_t i = 0; api->backend_name(i) && n_backends < MAX_BACKENDS; i++)
        if (api->backend_supported(api->backend_name(i)))
            names[n_backends++] = api->backend_name(i);

    double ns[ROWS][MAX_BACKENDS];
    for (size_t b = 0; b < n_backends; b++) {
        api->set_backend(names[b]);
        for (int i = 0; i < ROWS; i++) {
            bd.n = rows[i].n;
            bd.lq = rows[i].lq;
            bd.lkv = rows[i].lkv;
            bd.d = rows[i].d;
            bd.flags = rows[i].flags;
            ns[i][b] = time_kernel(rows[i].kernel, &bd);
        }
    }
    api->set_backend(initial);
    size_t scalar = 0;
    for (size_t b = 0; b < n_backends; b++)
        if (strcmp(names[b], "scalar") == 0) scalar = b;

    if (json) {
        printf("{\n  \"library_version\": ");
        json_string(api->version());
        printf(",\n  \"backends\": [");
        for (size_t b = 0; b < n_backends; b++) {
            printf("%s", b ? ", " : "");
            json_string(names[b]);
        }
        printf("],\n  \"results\": [\n");
        for (int i = 0; i < ROWS; i++) {
            const bench_row *row = &rows[i];
            for (size_t b = 0; b < n_backends; b++) {
                printf("    {\"kernel\": \"%s\", ", KERNEL_NAMES[row->kernel]);
                if (row->kernel == KERNEL_ATTENTION)
                    printf("\"len_q\": %zu, \"len_kv\": %zu, \"d\": %zu, \"causal\": %s, ", row->lq,
                           row->lkv, row->d, row->flags & SDPA_CAUSAL ? "true" : "false");
                else
                    printf("\"n\": %zu, ", row->n);
                printf("\"backend\": \"%s\", \"ns_per_call\": %.1f, ", names[b], ns[i][b]);
                if (row_flops(row) > 0) printf("\"gflops\": %.2f, ", row_flops(row) / ns[i][b]);
                printf("\"speedup_vs_scalar\": %.3f}%s\n", ns[i][scalar] / ns[i][b],
                       i + 1 == ROWS && b + 1 == n_backends ? "" : ",");
            }
        }
        printf("  ]\n}\n");
    } else {
        printf("sdpa bench: best of 5 runs; dot and attention in GFLOP/s, softmax in ns per\n"
               "element; in parentheses the speedup over scalar. Attention is the fused\n"
               "sdpa_attention_f32, shapes q<len_q>k<len_kv>d<d_k = d_v>, scale 1/sqrt(d).\n\n");
        printf("  %-10s %-18s", "kernel", "size");
        for (size_t b = 0; b < n_backends; b++) printf(" %17s", names[b]);
        printf("\n");
        for (int i = 0; i < ROWS; i++) {
            const bench_row *row = &rows[i];
            printf("  %-10s %-18s", KERNEL_NAMES[row->kernel], row->label);
            for (size_t b = 0; b < n_backends; b++) {
                double f = row_flops(row);
                double shown = f > 0 ? f / ns[i][b] : ns[i][b] / (double)row->n;
                printf(" %8.*f (%5.1fx)", f > 0 ? 1 : 3, shown, ns[i][scalar] / ns[i][b]);
            }
            printf("\n");
        }
        printf("\nThe full benchmark, with peers and a roofline, is in bench/ "
               "(docs/performance.md).\n");
    }
done:
    free(bd.a);
    free(bd.b);
    free(bd.y);
    free(bd.q);
    free(bd.k);
    free(bd.v);
    free(bd.out);
    return status;
}

/* ---- main ---- */

static const char HELP[] =
    "Usage: sdpa COMMAND [OPTIONS]\n"
    "\n"
    "Scaled dot-product attention on the CPU: softmax(Q K^T / sqrt(d_k)) V.\n"
    "\n"
    "Commands:\n"
    "  info     the CPU, its features, and which backend runs (and why)\n"
    "  demo     why attention scales its scores, computed with the library's kernels\n"
    "  bench    a quick per-backend timing of dot, softmax and a small attention\n"
    "\n"
    "Options:\n"
    "  -h, --help     this text; 'sdpa COMMAND --help' describes a command\n"
    "  --version      versions of the command, the library and its ABI\n"
    "\n"
    "Environment: SDPA_BACKEND=NAME forces a backend, SDPA_EXP=sleef selects SLEEF's exp,\n"
    "SDPA_LIBRARY=PATH loads another build of libsdpa.so.1.\n";

static const char HELP_INFO[] =
    "Usage: sdpa info [--json]\n"
    "\n"
    "Shows the CPU (vendor, model, the features the backends need, the OS support for the\n"
    "wide registers), every backend with compiled / supported / active and why a better one\n"
    "was not chosen, and the versions of the library, its ABI and SLEEF.\n"
    "\n"
    "  --json     the same as one JSON object\n";

static const char HELP_DEMO[] =
    "Usage: sdpa demo [--seed N] [--dims LIST] [--backend NAME] [--plot FILE.png]\n"
    "\n"
    "Five short sections on why attention divides Q K^T by sqrt(d_k): dot products grow with\n"
    "d, their variance grows linearly with d, softmax saturates, its gradient vanishes, and a\n"
    "small attention with and without the scaling. Everything is computed by the library.\n"
    "\n"
    "  --seed N          random seed (default 1)\n"
    "  --dims LIST       dimensions for sections 2 and 4, comma-separated, at most 8\n"
    "                    (default 3,10,100,1000)\n"
    "  --backend NAME    run on this backend (scalar, sse, avx2, avx512, neon)\n"
    "  --plot FILE.png   also draw the distributions of section 2 with gnuplot\n";

static const char HELP_BENCH[] =
    "Usage: sdpa bench [--json]\n"
    "\n"
    "Times dot and softmax at n = 256, 4096, 65536 and the fused attention at three shapes\n"
    "(decode 1 x 4096 keys d = 128, prefill 256 x 256 d = 64, and the same causal) on every\n"
    "backend this CPU runs, with the speedup over scalar. About a second; the full benchmark,\n"
    "with peers and a roofline, is in bench/.\n"
    "\n"
    "  --json     results as one JSON object\n";

int main(int argc, char **argv) {
    if (argc < 2) return usage_error("missing command: info, demo or bench");
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        fputs(HELP, stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0) {
        printf("sdpa %s\n", SDPA_COMMAND_VERSION);
        if (load_library()) return 1;
        printf("library %s, ABI %u\n", api->version(), api->abi_version_fn());
        return 0;
    }
    if (cmd[0] == '-') return usage_error("unknown option '%s'", cmd);

    int is_info = strcmp(cmd, "info") == 0, is_demo = strcmp(cmd, "demo") == 0,
        is_bench = strcmp(cmd, "bench") == 0;
    if (!is_info && !is_demo && !is_bench) return usage_error("unknown command '%s'", cmd);

    int json = 0;
    uint64_t seed = 1;
    size_t dims[MAX_DIMS] = {3, 10, 100, 1000}, n_dims = 4;
    const char *backend = NULL, *plot_file = NULL;
    for (int i = 2; i < argc; i++) {
        const char *v = NULL;
        int m;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(is_info ? HELP_INFO : is_demo ? HELP_DEMO : HELP_BENCH, stdout);
            return 0;
        }
        if ((is_info || is_bench) && strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else if (is_demo && (m = option_value(argc, argv, &i, "--seed", &v)) != 0) {
            if (m < 0 || !parse_u64(v, &seed))
                return usage_error("--seed needs a non-negative integer, not '%s'", v ? v : "");
        } else if (is_demo && (m = option_value(argc, argv, &i, "--dims", &v)) != 0) {
            if (m < 0 || !parse_dims(v, dims, &n_dims))
                return usage_error("--dims needs 1 to %d comma-separated sizes in 1..100000, not "
                                   "'%s'",
                                   MAX_DIMS, v ? v : "");
        } else if (is_demo && (m = option_value(argc, argv, &i, "--backend", &v)) != 0) {
            if (m < 0 || !*v) return usage_error("--backend needs a name");
            backend = v;
        } else if (is_demo && (m = option_value(argc, argv, &i, "--plot", &v)) != 0) {
            if (m < 0 || !*v) return usage_error("--plot needs a file name");
            plot_file = v;
        } else {
            return usage_error("%s: unknown option '%s'", cmd, argv[i]);
        }
    }
    if (plot_file && !find_on_path("gnuplot")) {
        fprintf(stderr, "sdpa demo: --plot needs gnuplot, which is not installed (Debian: "
                        "apt-get install gnuplot-nox)\n");
        return 1;
    }

    if (load_library()) return 1;
    if (backend && api->set_backend(backend) != SDPA_OK)
        return usage_error("--backend %s: not a backend this library and CPU can run", backend);
    if (is_info) return cmd_info(json);
    if (is_demo) return cmd_demo(seed, dims, n_dims, plot_file);
    return cmd_bench(json);
}
