/* What the files of the sdpa command share. The command loads the library as a plugin host
 * does (dlopen + sdpa_get_api) and calls it only through the table, so it is also the first
 * client of the plugin ABI: nothing here links libsdpa. */
#ifndef SDPA_CLI_H
#define SDPA_CLI_H

#include <stddef.h>
#include <stdint.h>

#include "sdpa.h"

/* The loaded library and its v1 table, set by load_library (main.c). */
extern const sdpa_api *api;
extern void *library;

/* Loads libsdpa.so.1 (or $SDPA_LIBRARY) and its v1 table; 0 on success, else 1 after one line
 * on stderr. */
int load_library(void);

enum {
    MAX_BACKENDS = 16, /* rows `sdpa info` and `sdpa bench` show at most */
    MAX_DIMS = 8       /* sizes `sdpa demo --dims` takes at most */
};

/* JSON output (info.c): a quoted, escaped string; a boolean. */
void json_string(const char *s);
const char *json_bool(int b);

/* xorshift64* (demo.c): deterministic for a seed, the same on every machine. */
typedef struct rng {
    uint64_t s;
} rng;
rng rng_seed(uint64_t seed);
void fill(rng *r, float *x, size_t n, float lo, float hi); /* uniform in [lo, hi) */

/* 1 if program is an executable file in a directory of $PATH (demo.c). */
int find_on_path(const char *program);

/* The commands; each returns the exit status. */
int cmd_info(int json);
int cmd_demo(uint64_t seed, const size_t *dims, size_t n_dims, const char *plot_file);
int cmd_bench(int json);

#endif
