/* The sdpa command: what this CPU runs, why attention scales its scores, and how fast each
 * backend is. This file parses the arguments, loads the library and runs one command: info.c,
 * demo.c, bench.c.
 *
 *   sdpa info [--json] [--threads N]
 *   sdpa demo [--seed N] [--dims LIST] [--backend NAME] [--plot FILE.png] [--threads N]
 *   sdpa bench [--json] [--threads N]
 *
 * Exit status: 0 success, 1 failure at run time (library not found, gnuplot failed), 2 usage
 * error (unknown command or option, bad value), with one line on stderr. */
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

const sdpa_api *api;
void *library;

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

/* ---- the library ---- */

int load_library(void) {
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

/* ---- usage and main ---- */

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
    "  --threads N    after the command: threads per attention call (0: the default, the\n"
    "                 CPUs this process may run on; 1: the calling thread only)\n"
    "\n"
    "Environment: SDPA_BACKEND=NAME forces a backend, SDPA_EXP=sleef selects SLEEF's exp,\n"
    "SDPA_NUM_THREADS=N sets the default thread count, SDPA_LIBRARY=PATH loads another build\n"
    "of libsdpa.so.1.\n"
    "\n"
    "Backends, best first (the first one this CPU runs is the default):\n";

/* HELP's list of backends and add-ons, as the library it loads describes them. */
static void help_backends(void) {
    if (load_library() || !SDPA_API_HAS(api, info)) {
        printf("  (sdpa info lists them: this library does not say)\n");
        return;
    }
    for (size_t i = 0; i < api->info_count(SDPA_INFO_BACKEND); i++) {
        sdpa_info_entry e = {sizeof e, 0, "", "", "", "", "", "", "", {0, 0, 0, 0}};
        if (api->info(SDPA_INFO_BACKEND, i, &e) != SDPA_OK) continue;
        char needs[32];
        snprintf(needs, sizeof needs, "%s%s%s", *e.arch ? e.arch : "any CPU",
                 *e.requires ? " " : "", e.requires);
        printf("  %-8s %-17s %s\n", e.name, needs, e.description);
    }
    printf("\nAdd-ons of a backend, where the CPU has what they need ('sdpa info': in use?):\n");
    for (size_t i = 0; i < api->info_count(SDPA_INFO_ADDON); i++) {
        sdpa_info_entry e = {sizeof e, 0, "", "", "", "", "", "", "", {0, 0, 0, 0}};
        if (api->info(SDPA_INFO_ADDON, i, &e) != SDPA_OK) continue;
        printf("  %s of %s, needs %s; %s, %s=on|off\n      %s\n", e.name, e.backend, e.requires,
               e.number[0] < 0 ? "on or off by default by CPU (sdpa info says which)"
               : e.number[0]   ? "on by default"
                               : "off by default",
               e.variable, e.description);
    }
    printf("\nElement types (sdpa_dtype), as this library takes them:\n");
    for (size_t i = 0; i < api->info_count(SDPA_INFO_TYPE); i++) {
        sdpa_info_entry e = {sizeof e, 0, "", "", "", "", "", "", "", {0, 0, 0, 0}};
        if (api->info(SDPA_INFO_TYPE, i, &e) != SDPA_OK) continue;
        printf("  %-9s %s\n", e.name, e.description);
    }
}

static const char HELP_INFO[] =
    "Usage: sdpa info [--json] [--threads N]\n"
    "\n"
    "Shows the CPU (vendor, model, the features the backends need, the OS support for the\n"
    "wide registers), every backend with compiled / supported / active and why a better one\n"
    "was not chosen, the element types the library takes, the threads an attention call uses,\n"
    "and the versions of the library, its ABI and SLEEF.\n"
    "\n"
    "  --json         the same as one JSON object\n"
    "  --threads N    set the thread count first (0: the default)\n";

static const char HELP_DEMO[] =
    "Usage: sdpa demo [--seed N] [--dims LIST] [--backend NAME] [--plot FILE.png]\n"
    "                 [--threads N]\n"
    "\n"
    "Six short sections on why attention divides Q K^T by sqrt(d_k): dot products grow with\n"
    "d, their variance grows linearly with d, softmax saturates, its gradient vanishes, a\n"
    "small attention with and without the scaling, and the gradient through attention (its\n"
    "backward pass) as d_k grows. Everything is computed by the library.\n"
    "\n"
    "  --seed N          random seed (default 1)\n"
    "  --dims LIST       dimensions for sections 2 and 4, comma-separated, at most 8\n"
    "                    (default 3,10,100,1000)\n"
    "  --backend NAME    run on this backend (sdpa --help and sdpa info list them)\n"
    "  --plot FILE.png   also draw the distributions of section 2 with gnuplot, and\n"
    "                    section 6 in FILE-gradients.png\n"
    "  --threads N       threads per attention call (0: the default)\n";

static const char HELP_BENCH[] =
    "Usage: sdpa bench [--json] [--threads N]\n"
    "\n"
    "Times dot and softmax at n = 256, 4096, 65536 and the fused attention at three shapes\n"
    "(decode 1 x 4096 keys d = 128, prefill 256 x 256 d = 64, and the same causal) on every\n"
    "backend this CPU runs, with the speedup over scalar. About a second; the full benchmark,\n"
    "with peers and a roofline, is in bench/.\n"
    "\n"
    "  --json         results as one JSON object\n"
    "  --threads N    threads per attention call (default: the library's default)\n";

int main(int argc, char **argv) {
    if (argc < 2) return usage_error("missing command: info, demo or bench");
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        fputs(HELP, stdout);
        help_backends();
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
    uint64_t threads = 0;
    int set_threads = 0;
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
        } else if ((m = option_value(argc, argv, &i, "--threads", &v)) != 0) {
            if (m < 0 || !parse_u64(v, &threads) || threads > 1024)
                return usage_error("--threads needs a count from 0 to 1024, not '%s'", v ? v : "");
            set_threads = 1;
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
    if (set_threads) {
        if (!SDPA_API_HAS(api, set_num_threads)) {
            fprintf(stderr, "sdpa: this library (%s) has no thread setting\n", api->version());
            return 1;
        }
        if (api->set_num_threads((size_t)threads) != SDPA_OK)
            return usage_error("--threads %llu: refused by the library",
                               (unsigned long long)threads);
    }
    if (backend && api->set_backend(backend) != SDPA_OK)
        return usage_error("--backend %s: not a backend this library and CPU can run", backend);
    if (is_info) return cmd_info(json);
    if (is_demo) return cmd_demo(seed, dims, n_dims, plot_file);
    return cmd_bench(json);
}
