/* sdpa info: the library, the CPU and its features, and every backend with whether it is
 * compiled in, whether this CPU runs it, and why the active one was chosen. Everything about the
 * CPU, the backends and the add-ons comes from the library it loads (sdpa_info), which is what
 * decided: this command probes nothing and lists nothing of its own. */
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

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

/* ---- what the library saw and chose ---- */

enum { MAX_FEATURES = 32, MAX_ADDONS = 16, MAX_TYPES = 16 };

/* The index-th entry of kind, or an entry of empty strings if the library has none such (an older
 * library without sdpa_info: the rows then say so). */
static sdpa_info_entry entry_of(sdpa_info_kind kind, size_t index) {
    sdpa_info_entry e = {sizeof e, 0, "", "", "", "", "", "", "", {-1, -1, -1, -1}};
    if (SDPA_API_HAS(api, info) && api->info(kind, index, &e) != SDPA_OK) e.name = "";
    return e;
}

static size_t count_of(sdpa_info_kind kind, size_t max) {
    size_t n = SDPA_API_HAS(api, info_count) ? api->info_count(kind) : 0;
    return n < max ? n : max;
}

typedef struct cpu_report {
    sdpa_info_entry cpu, features[MAX_FEATURES];
    size_t n_features;
} cpu_report;

static cpu_report cpu_report_get(void) {
    cpu_report r;
    r.cpu = entry_of(SDPA_INFO_CPU, 0);
    r.n_features = count_of(SDPA_INFO_FEATURE, MAX_FEATURES);
    for (size_t i = 0; i < r.n_features; i++) r.features[i] = entry_of(SDPA_INFO_FEATURE, i);
    return r;
}

/* XCR0's AVX (SSE and YMM) and AVX-512 (opmask, ZMM0-15 upper halves, ZMM16-31) state bits */
static int xcr0_has(int64_t xcr0, int64_t bits) { return xcr0 >= 0 && (xcr0 & bits) == bits; }

typedef struct addon_row {
    sdpa_info_entry e;
    char note[160];
} addon_row;

/* What `sdpa info` says of each add-on, from its flags and the library's reason. */
static size_t addon_rows(addon_row *rows) {
    const size_t n = count_of(SDPA_INFO_ADDON, MAX_ADDONS);
    for (size_t i = 0; i < n; i++) rows[i].e = entry_of(SDPA_INFO_ADDON, i);
    for (size_t i = 0; i < n; i++) {
        const sdpa_info_entry *a = &rows[i].e;
        const char *var = a->variable, *env = getenv(var);
        const int forced_on = env && strcmp(env, "on") == 0;
        const sdpa_info_entry *first = NULL;
        for (size_t j = 0; j < i && !first; j++)
            if ((rows[j].e.flags & SDPA_INFO_IN_USE) && strcmp(rows[j].e.backend, a->backend) == 0)
                first = &rows[j].e;
        char *note = rows[i].note;
        const size_t size = sizeof rows[i].note;
        if (!(a->flags & SDPA_INFO_PRESENT))
            snprintf(note, size, "%s", a->reason);
        else if (!(a->flags & SDPA_INFO_RUNNABLE))
            snprintf(note, size, "off: %s", a->reason);
        else if (!(a->flags & SDPA_INFO_ON))
            snprintf(note, size, forced_on ? "off: %s" : "off: %s (%s=on turns it on)", a->reason,
                     var);
        else if (a->flags & SDPA_INFO_IN_USE)
            snprintf(note, size, "in use: %s (%s=off turns it off)", a->reason, var);
        else if (strcmp(api->backend(), a->backend) != 0)
            snprintf(note, size, "off: its backend, %s, is not the active one", a->backend);
        else
            snprintf(note, size, "on, unused: %s comes first (%s=off)",
                     first ? first->name : "another", first ? first->variable : "its variable");
    }
    return n;
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
    sdpa_info_entry e;
    int compiled, supported, active;
    char note[128];
} backend_row;

/* The backend table of `sdpa info`; returns the number of rows and whether SDPA_BACKEND forced
 * the active backend. */
static size_t backend_rows(backend_row *rows, int *forced) {
    const char *env = getenv("SDPA_BACKEND");
    int env_set = env && *env && strcmp(env, "auto") != 0;
    const char *active = api->backend();
    *forced = env_set && strcmp(env, active) == 0;
    size_t n = 0, active_index = 0;
    const char *best = NULL;
    for (size_t i = 0; api->backend_name(i) && n < MAX_BACKENDS; i++, n++) {
        backend_row *r = &rows[i];
        r->e = entry_of(SDPA_INFO_BACKEND, i);
        r->e.name = api->backend_name(i);
        r->supported = api->backend_supported(r->e.name);
        r->compiled = r->supported || (r->e.flags & SDPA_INFO_PRESENT);
        r->active = strcmp(r->e.name, active) == 0;
        if (r->active) active_index = i;
        if (r->supported && !best) best = r->e.name;
    }
    for (size_t i = 0; i < n; i++) {
        backend_row *r = &rows[i];
        const char *why = *r->e.reason ? r->e.reason : NULL;
        if (r->active)
            snprintf(r->note, sizeof r->note, "%s",
                     *forced ? "active: forced by SDPA_BACKEND"
                     : best && strcmp(best, r->e.name) == 0
                         ? "active: the best this CPU and OS run"
                         : "active: chosen with sdpa_set_backend");
        else if (!r->compiled)
            snprintf(r->note, sizeof r->note, "%s", why ? why : "not compiled into this library");
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

/* Everything `sdpa info` shows, gathered once. */
typedef struct info_report {
    cpu_report cpu;
    sdpa_info_entry types[MAX_TYPES]; /* none from a library before ABI 1.5 */
    size_t n_types;
    backend_row backends[MAX_BACKENDS];
    size_t n_backends;
    addon_row addons[MAX_ADDONS];
    size_t n_addons;
    int forced;
    const char *env; /* SDPA_BACKEND */
    char lib_path[PATH_MAX], sleef_path[PATH_MAX];
} info_report;

static void json_cpu(const cpu_report *cpu) {
    printf("  \"cpu\": {\"vendor\": ");
    json_string(cpu->cpu.name);
    printf(", \"model\": ");
    json_string(cpu->cpu.description);
    printf(", \"family\": %lld, \"model_number\": %lld, \"stepping\": %lld, \"features\": {",
           (long long)cpu->cpu.number[0], (long long)cpu->cpu.number[1],
           (long long)cpu->cpu.number[2]);
    for (size_t i = 0; i < cpu->n_features; i++) {
        printf("%s", i ? ", " : "");
        json_string(cpu->features[i].name);
        printf(": %s", json_bool(cpu->features[i].flags & SDPA_INFO_PRESENT));
    }
    printf("}");
    const int64_t xcr0 = cpu->cpu.number[3];
    if (xcr0 >= 0)
        printf(", \"os\": {\"xcr0\": %lld, \"ymm_state\": %s, \"zmm_state\": %s}", (long long)xcr0,
               json_bool(xcr0_has(xcr0, 0x6)), json_bool(xcr0_has(xcr0, 0xe6)));
    printf("},\n");
}

static void json_rows(const info_report *r) {
    printf("  \"backends\": [\n");
    for (size_t i = 0; i < r->n_backends; i++) {
        const backend_row *b = &r->backends[i];
        printf("    {\"name\": ");
        json_string(b->e.name);
        printf(", \"compiled\": %s, \"supported\": %s, \"active\": %s, \"note\": ",
               json_bool(b->compiled), json_bool(b->supported), json_bool(b->active));
        json_string(b->note);
        printf(", \"requires\": ");
        json_string(b->e.requires);
        printf(", \"description\": ");
        json_string(b->e.description);
        printf("}%s\n", i + 1 < r->n_backends ? "," : "");
    }
    printf("  ],\n  \"addons\": [\n");
    for (size_t i = 0; i < r->n_addons; i++) {
        const addon_row *a = &r->addons[i];
        printf("    {\"name\": ");
        json_string(a->e.name);
        printf(", \"backend\": ");
        json_string(a->e.backend);
        printf(", \"in_use\": %s, \"note\": ", json_bool(a->e.flags & SDPA_INFO_IN_USE));
        json_string(a->note);
        printf(", \"description\": ");
        json_string(a->e.description);
        printf("}%s\n", i + 1 < r->n_addons ? "," : "");
    }
    printf("  ],\n  \"types\": [\n");
    for (size_t i = 0; i < r->n_types; i++) {
        const sdpa_info_entry *t = &r->types[i];
        printf("    {\"name\": ");
        json_string(t->name);
        printf(", \"dtype\": %lld, \"bytes\": %lld, \"accepted\": ", (long long)t->number[0],
               (long long)t->number[1]);
        json_string(t->description);
        printf("}%s\n", i + 1 < r->n_types ? "," : "");
    }
    printf("  ],\n");
}

static void print_json(const info_report *r) {
    printf("{\n  \"command_version\": ");
    json_string(SDPA_COMMAND_VERSION);
    printf(",\n  \"library\": {\"path\": ");
    json_string(r->lib_path);
    printf(", \"version\": ");
    json_string(api->version());
    printf(", \"abi_version\": %u, \"table_size\": %u},\n", api->abi_version_fn(),
           api->struct_size);
    printf("  \"sleef\": {\"version\": ");
    json_string(SDPA_SLEEF_VERSION);
    printf(", \"path\": ");
    json_string(r->sleef_path);
    printf("},\n");
    json_cpu(&r->cpu);
    json_rows(r);
    printf("  \"active\": ");
    json_string(api->backend());
    printf(",\n  \"forced\": %s,\n  \"sdpa_backend_env\": ", json_bool(r->forced));
    if (r->env)
        json_string(r->env);
    else
        printf("null");
    printf(",\n  \"exp_mode\": ");
    json_string(api->exp_mode());
    if (SDPA_API_HAS(api, num_threads)) printf(",\n  \"threads\": %zu", api->num_threads());
    printf("\n}\n");
}

static void print_cpu(const cpu_report *cpu) {
    const sdpa_info_entry *c = &cpu->cpu;
    printf("\nCPU\n  vendor    %s\n  model     %s\n", *c->name ? c->name : "?",
           *c->description ? c->description : "?");
    if (c->number[0] >= 0)
        printf("            family %lld, model %lld, stepping %lld\n", (long long)c->number[0],
               (long long)c->number[1], (long long)c->number[2]);
    printf("  features ");
    for (size_t i = 0; i < cpu->n_features; i++)
        printf(" %s %s", cpu->features[i].name,
               cpu->features[i].flags & SDPA_INFO_PRESENT ? "yes" : "no");
    printf("\n");
    if (c->number[3] >= 0)
        printf("  OS        saves AVX (YMM) state: %s, AVX-512 (ZMM, opmask) state: %s "
               "(XCR0 = 0x%llx)\n",
               xcr0_has(c->number[3], 0x6) ? "yes" : "no",
               xcr0_has(c->number[3], 0xe6) ? "yes" : "no", (unsigned long long)c->number[3]);
}

static void print_text(const info_report *r) {
    printf("sdpa %s\n", SDPA_COMMAND_VERSION);
    printf("  library   %s\n            version %s, ABI %u (table of %u bytes)\n", r->lib_path,
           api->version(), api->abi_version_fn(), api->struct_size);
    printf("  SLEEF     %s%s%s\n", SDPA_SLEEF_VERSION, *r->sleef_path ? ", " : "", r->sleef_path);
    print_cpu(&r->cpu);
    printf("\nBackends, best first\n  %-8s %-9s %-10s %-7s %s\n", "name", "compiled", "supported",
           "active", "");
    for (size_t i = 0; i < r->n_backends; i++) {
        const backend_row *b = &r->backends[i];
        printf("  %-8s %-9s %-10s %-7s %s\n", b->e.name, b->compiled ? "yes" : "no",
               b->supported ? "yes" : "no", b->active ? "yes" : "-", b->note);
    }
    const char *env = r->env;
    if (env && *env && strcmp(env, "auto") != 0 && !r->forced)
        printf("\n  SDPA_BACKEND=%s was ignored: %s\n", env,
               api->backend_supported(env) ? "another backend was set at run time"
                                           : "not a backend this library and CPU can run");
    printf("\nAdd-ons\n");
    if (!SDPA_API_HAS(api, info)) printf("  (this library does not say)\n");
    for (size_t i = 0; i < r->n_addons; i++)
        printf("  %-8s of %-7s %s\n            %s\n", r->addons[i].e.name, r->addons[i].e.backend,
               r->addons[i].note, r->addons[i].e.description);
    printf("\nElement types (sdpa_dtype)\n");
    if (!r->n_types) printf("  (this library does not say)\n");
    for (size_t i = 0; i < r->n_types; i++)
        printf("  %lld %-9s %lld byte%s  %s\n", (long long)r->types[i].number[0], r->types[i].name,
               (long long)r->types[i].number[1], r->types[i].number[1] > 1 ? "s" : " ",
               r->types[i].description);
    printf("\nactive backend: %s%s; exp: %s\n", api->backend(),
           r->forced ? " (forced by SDPA_BACKEND)" : "", api->exp_mode());
    if (SDPA_API_HAS(api, num_threads))
        printf("threads per attention call: %zu\n", api->num_threads());
}

int cmd_info(int json) {
    static info_report r; /* large: the paths */
    r.cpu = cpu_report_get();
    r.n_backends = backend_rows(r.backends, &r.forced);
    r.n_addons = addon_rows(r.addons);
    r.n_types = count_of(SDPA_INFO_TYPE, MAX_TYPES);
    for (size_t i = 0; i < r.n_types; i++) r.types[i] = entry_of(SDPA_INFO_TYPE, i);
    r.env = getenv("SDPA_BACKEND");
    loaded_file(library, NULL, r.lib_path, sizeof r.lib_path);
    loaded_file(library, "libsleef", r.sleef_path, sizeof r.sleef_path);
    if (json)
        print_json(&r);
    else
        print_text(&r);
    return 0;
}
