/* sdpa info: the library, the CPU and its features, and every backend with whether it is
 * compiled in, whether this CPU runs it, and why the active one was chosen. */
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__linux__) && (defined(__x86_64__) || defined(__i386__))
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "backends.h"
#include "bf16_dot_default.h"
#include "cli.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpu_features/cpuinfo_x86.h>
#include <cpuid.h>
#elif defined(__aarch64__)
#include <cpu_features/cpuinfo_aarch64.h>
#endif

#ifndef SDPA_SLEEF_VERSION
#define SDPA_SLEEF_VERSION "unknown"
#endif

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
    const char *os_off; /* when absent: the reason if the OS, not the CPU, lacks it; else NULL */
} feature;

typedef struct cpu_report {
    char vendor[16];
    char model[64];
    int family, model_number, stepping;
    feature features[10];
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
    r.os_known = read_xcr0(&r.xcr0);
    r.os_ymm = (r.xcr0 & 0x6) == 0x6;   /* SSE and AVX state */
    r.os_zmm = (r.xcr0 & 0xe6) == 0xe6; /* plus opmask, ZMM0-15 upper halves, ZMM16-31 */
    /* cpu_features reports the wide-register features only when the OS saves their state */
    const char *no_ymm = r.os_known && !r.os_ymm ? "OS does not enable the YMM state" : NULL;
    const char *no_zmm = r.os_known && !r.os_zmm ? "OS does not enable the ZMM/opmask state" : NULL;
    /* AMX as the library counts it at its first all-bf16 call (src/dispatch.c): the OS saves
       the tile state, and Linux grants it to the process (this command asks as the library
       would; asking twice changes nothing) */
    const int os_tiles = r.os_known && (r.xcr0 & 0x60000) == 0x60000;
    int granted = 0;
#if defined(__linux__) && defined(SYS_arch_prctl)
    if (os_tiles && info.features.amx_tile)
        granted = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */,
                          18 /* XFEATURE_XTILEDATA */) == 0;
#endif
    const char *no_tiles = !os_tiles  ? "OS does not enable the AMX tile state"
                           : !granted ? "the OS did not grant the AMX tile state"
                                      : NULL;
    feature f[] = {{"SSE4.1", info.features.sse4_1, NULL},
                   {"AVX", info.features.avx, no_ymm},
                   {"AVX2", info.features.avx2, no_ymm},
                   {"FMA", info.features.fma3, no_ymm},
                   {"F16C", info.features.f16c, no_ymm},
                   {"AVX-512F", info.features.avx512f, no_zmm},
                   {"AVX512BW", info.features.avx512bw, no_zmm},
                   {"AVX512_BF16", info.features.avx512_bf16, no_zmm},
                   {"AMX_TILE", info.features.amx_tile && granted, no_tiles},
                   {"AMX_BF16", info.features.amx_bf16 && granted, no_tiles}};
    r.n_features = (int)(sizeof f / sizeof f[0]);
    memcpy(r.features, f, sizeof f);
#elif defined(__aarch64__)
    Aarch64Info info = GetAarch64Info();
    snprintf(r.vendor, sizeof r.vendor, "0x%02x", info.implementer);
    snprintf(r.model, sizeof r.model, "part 0x%03x, variant %d, revision %d", info.part,
             info.variant, info.revision);
    feature f[] = {{"ASIMD", info.features.asimd, NULL}, {"SVE", info.features.sve, NULL}};
    r.n_features = (int)(sizeof f / sizeof f[0]);
    memcpy(r.features, f, sizeof f);
#else
    snprintf(r.vendor, sizeof r.vendor, "unknown");
#endif
    return r;
}

/* The feature named by the len characters at name; NULL if this CPU report has none such. */
static const feature *find_feature(const cpu_report *r, const char *name, size_t len) {
    for (int i = 0; i < r->n_features; i++)
        if (strncmp(r->features[i].name, name, len) == 0 && r->features[i].name[len] == 0)
            return &r->features[i];
    return NULL;
}

/* What this command was built with about each backend (backends.h, from the records in
 * meson.build). The library it loads is normally the one built with it; the rows of `sdpa info`
 * come from the library, and a name this list lacks gets no reasons. */
typedef struct record {
    const char *name;
    int built;
    const char *arch, *requires, *description;
} record;

#define RECORD_(unused, name, built, table, arch, requires, description)                           \
    {#name, built, arch, requires, description},
static const record RECORDS[] = {SDPA_BACKENDS(RECORD_, )};
#undef RECORD_

static const record *record_of(const char *name) {
    for (size_t i = 0; i < sizeof RECORDS / sizeof RECORDS[0]; i++)
        if (strcmp(RECORDS[i].name, name) == 0) return &RECORDS[i];
    return NULL;
}

/* Why this CPU cannot run a backend, from its record: it is for another architecture, or the
 * CPU (or the OS) lacks a feature it requires; NULL if neither. Written into buf when composed. */
static const char *cpu_reason(const cpu_report *r, const record *rec, char *buf, size_t size) {
    if (!rec) return NULL;
    if (*rec->arch && strcmp(rec->arch, SDPA_BUILD_ARCH) != 0) {
        snprintf(buf, size, "%s only", rec->arch);
        return buf;
    }
    for (const char *p = rec->requires; *p;) {
        size_t len = strcspn(p, "+");
        const feature *f = find_feature(r, p, len);
        if (!f || !f->present) {
            if (f && f->os_off) return f->os_off;
            snprintf(buf, size, "CPU lacks %.*s", (int)len, p);
            return buf;
        }
        p += len + (p[len] == '+');
    }
    return NULL;
}

/* ---- add-ons ---- */

/* A backend's add-on as this command was built with it (the records' 'addons', backends.h). */
typedef struct addon_record {
    const char *name, *kind, *backend;
    int built;
    const char *requires, *env;
    int default_on;
    const char *description;
} addon_record;

#define ADDON_RECORD_(unused, name, kind, built, table, backend, requires, env, default_on,        \
                      description)                                                                 \
    {#name, #kind, #backend, built, requires, env, default_on, description},
static const addon_record ADDON_RECORDS[] = {SDPA_ADDONS(ADDON_RECORD_, )};
#undef ADDON_RECORD_
#define N_ADDONS (sizeof ADDON_RECORDS / sizeof ADDON_RECORDS[0])

/* Whether an add-on is in use, and why not: the library's load-time rule (src/dispatch.c)
 * applied here to the same records, CPU and environment, with its backend active. The plugin
 * ABI has no call that asks the library itself. */
typedef struct addon_row {
    const addon_record *rec;
    int on, in_use; /* on: the library turns it on (whichever backend is active) */
    char note[160];
} addon_row;

/* Of the add-ons of rec's kind and backend, the one before row n that is in use (the library
 * uses the first of a kind that is on); NULL if none */
static const addon_row *first_in_use(const addon_row *rows, size_t n, const addon_record *rec) {
    for (size_t i = 0; i < n; i++)
        if (rows[i].in_use && strcmp(rows[i].rec->kind, rec->kind) == 0 &&
            strcmp(rows[i].rec->backend, rec->backend) == 0)
            return &rows[i];
    return NULL;
}

/* Whether the add-on of row i is on, and why, as the library's load-time rule decides it. */
static sdpa_addon_choice addon_choice(const cpu_report *cpu, const addon_row *rows, size_t i,
                                      int runnable) {
    const addon_record *rec = rows[i].rec;
    const char *env = getenv(rec->env);
    if (rec->default_on < 0) {
        sdpa_cpu_id id = {cpu->vendor, cpu->family, cpu->model_number, runnable, 0};
        for (size_t j = 0; j < i; j++)
            if (rows[j].on && strcmp(rows[j].rec->kind, rec->kind) == 0 &&
                strcmp(rows[j].rec->backend, rec->backend) == 0)
                id.amx_on = 1;
        return sdpa_bf16_dot_default(&id, env);
    }
    const int set = env && (strcmp(env, "on") == 0 || strcmp(env, "off") == 0);
    sdpa_addon_choice c = {set ? strcmp(env, "on") == 0 : rec->default_on, 0, NULL};
    c.reason = set    ? (c.on ? "turned on" : "turned off")
               : c.on ? "on by default"
                      : "off by default";
    return c;
}

static void addon_rows(const cpu_report *cpu, addon_row *rows) {
    for (size_t i = 0; i < N_ADDONS; i++) {
        const addon_row *first;
        addon_row *a = &rows[i];
        a->rec = &ADDON_RECORDS[i];
        a->in_use = a->on = 0;
        const record as_backend = {a->rec->backend, a->rec->built, SDPA_BUILD_ARCH,
                                   a->rec->requires, a->rec->description};
        char buf[64];
        const char *why = cpu_reason(cpu, &as_backend, buf, sizeof buf);
        const sdpa_addon_choice c = addon_choice(cpu, rows, i, why == NULL);
        a->on = a->rec->built && !why && c.on;
        if (!a->rec->built)
            snprintf(a->note, sizeof a->note, "not compiled into this library");
        else if (why)
            snprintf(a->note, sizeof a->note, "off: %s", why);
        else if (!c.on)
            snprintf(a->note, sizeof a->note, "off: %s (%s=on turns it on)", c.reason, a->rec->env);
        else if (strcmp(api->backend(), a->rec->backend) != 0)
            snprintf(a->note, sizeof a->note, "off: its backend, %s, is not the active one",
                     a->rec->backend);
        else if ((first = first_in_use(rows, i, a->rec)) != NULL)
            snprintf(a->note, sizeof a->note, "on, unused: %s comes first (%s=off)",
                     first->rec->name, first->rec->env);
        else
            snprintf(a->note, sizeof a->note, "in use: %s (%s=off turns it off)", c.reason,
                     a->rec->env),
                a->in_use = 1;
    }
}

/* ---- JSON ---- */

void json_string(const char *s) {
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

const char *json_bool(int b) { return b ? "true" : "false"; }

/* ---- info ---- */

typedef struct backend_row {
    const char *name;
    const record *rec; /* NULL for a name this command was not built with */
    int compiled, supported, active;
    char note[128];
} backend_row;

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
        r->rec = record_of(r->name);
        r->compiled = r->supported || (r->rec && r->rec->built);
        r->active = strcmp(r->name, active) == 0;
        if (r->active) active_index = i;
        if (r->supported && !best) best = r->name;
    }
    for (size_t i = 0; i < n; i++) {
        backend_row *r = &rows[i];
        char buf[64];
        const char *why = cpu_reason(cpu, r->rec, buf, sizeof buf);
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

int cmd_info(int json) {
    cpu_report cpu = cpu_probe();
    backend_row rows[MAX_BACKENDS];
    int forced;
    size_t n = backend_rows(&cpu, rows, &forced);
    char lib_path[PATH_MAX], sleef_path[PATH_MAX];
    loaded_file(library, NULL, lib_path, sizeof lib_path);
    loaded_file(library, "libsleef", sleef_path, sizeof sleef_path);
    const char *env = getenv("SDPA_BACKEND");
    addon_row addons[N_ADDONS];
    addon_rows(&cpu, addons);

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
            if (rows[i].rec) {
                printf(", \"requires\": ");
                json_string(rows[i].rec->requires);
                printf(", \"description\": ");
                json_string(rows[i].rec->description);
            }
            printf("}%s\n", i + 1 < n ? "," : "");
        }
        printf("  ],\n  \"addons\": [\n");
        for (size_t i = 0; i < N_ADDONS; i++) {
            printf("    {\"name\": ");
            json_string(addons[i].rec->name);
            printf(", \"kind\": ");
            json_string(addons[i].rec->kind);
            printf(", \"backend\": ");
            json_string(addons[i].rec->backend);
            printf(", \"in_use\": %s, \"note\": ", json_bool(addons[i].in_use));
            json_string(addons[i].note);
            printf(", \"description\": ");
            json_string(addons[i].rec->description);
            printf("}%s\n", i + 1 < N_ADDONS ? "," : "");
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
        if (SDPA_API_HAS(api, num_threads)) printf(",\n  \"threads\": %zu", api->num_threads());
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
    printf("\nAdd-ons\n");
    for (size_t i = 0; i < N_ADDONS; i++)
        printf("  %-8s of %-7s %s\n            %s\n", addons[i].rec->name, addons[i].rec->backend,
               addons[i].note, addons[i].rec->description);
    printf("\nactive backend: %s%s; exp: %s\n", api->backend(),
           forced ? " (forced by SDPA_BACKEND)" : "", api->exp_mode());
    if (SDPA_API_HAS(api, num_threads))
        printf("threads per attention call: %zu\n", api->num_threads());
    return 0;
}
