/* The benchmark's command line (options.h). */
#include "options.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdpa.h"

static void usage(int status) {
    fprintf(
        status ? stderr : stdout,
        "usage: bench [--op NAME]... [--backend NAME]... [--n N]... [--d D]...\n"
        "             [--shape SHAPE]... [--reps R] [--min-ms MS] [--cpu C] [--wall] [--no-peers]\n"
        "             [--no-roofline] [--openblas-core NAME] [--csv FILE] [--json FILE]\n"
        "             [--plot DIR] [--smoke] [--threads LIST] [--pool-offset BYTES]\n"
        "             [--cold] [--huge-pages] [--against LIB]\n"
        "ops:");
    for (size_t i = 0; i < N_OPS; i++) fprintf(status ? stderr : stdout, " %s", OPS[i]->name);
    fprintf(status ? stderr : stdout,
            " (default: all)\n"
            "--n: elements (scores: keys), replacing each op's sizes; --d: scores' key length\n"
            "(default 64 and 128); --shape: an attention shape in the benchdnn style,\n"
            "b<batch>h<heads_q>[kv<heads_kv>]q<len_q>k<len_kv>d<d>[causal], for example\n"
            "b1h8kv2q512k512d128causal; then score modifiers, in this order, w<left> (a window),\n"
            "sc<cap> (softcap), alibi, sink; then kvf16, kvbf16, kve4m3, kve5m2, f16 or bf16\n"
            "for other types; last paged<block>: sdpa_attention_paged on the same values, each\n"
            "of the batch's sequences in blocks of that many tokens scattered in a pool, with a\n"
            "row of sdpa_mha on them dense (b16h32kv8q1k4096d128kvf16paged16); mixed in place\n"
            "of b..k..: 7 decodes over 1024-8192 keys and a 512-token prefill on 1536 cached,\n"
            "paged only (mixedh32kv8d128causalkvf16paged16). --shape replaces\n"
            "the default shapes; alone, it selects the attention op. --smoke: tiny sizes, one\n"
            "round, no roofline; --threads 1,2: attention rows of the active\n"
            "backend at those thread counts too (wall clock, pinned to as many cores as the\n"
            "largest; every other row runs on 1 thread); --pool-offset: a paged shape's pools\n"
            "start that many bytes past a 4 KiB page (default 0); --cold: batches of one call,\n"
            "each after a read of twice the largest cache (K and V from memory, as a serving\n"
            "engine's decode finds them); --huge-pages: arrays of 2 MiB and more in 2 MiB\n"
            "pages (madvise), as a serving engine's cache should be; --against: another build's\n"
            "libsdpa.so.1 beside this one, in the same rounds, for the first backend's rows\n"
            "(its \"old\" row; vs old: old / new, over pairs of rounds)\n");
    exit(status);
}

/* --threads 1,2,4: the counts, each in [1, 1024], at most 8 */
static void parse_threads(options *o, const char *v) {
    for (const char *p = v; *p;) {
        char *end;
        errno = 0;
        unsigned long long t = strtoull(p, &end, 10);
        if (end == p || errno || t < 1 || t > 1024 || o->n_threads == 8) usage(2);
        o->threads[o->n_threads++] = (size_t)t;
        if (t > o->max_threads) o->max_threads = (size_t)t;
        p = *end == ',' && end[1] ? end + 1 : end;
        if (*p && *end != ',') usage(2);
    }
    if (!o->n_threads) usage(2);
}

options options_parse(int argc, char **argv) {
    options o = {.reps = 11, .min_ms = 4, .cpu = -1, .peers = 1, .roofline = 1};
    int any_op = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0)
            usage(0);
        else if (strcmp(a, "--smoke") == 0)
            o.smoke = 1;
        else if (strcmp(a, "--wall") == 0)
            o.wall = 1;
        else if (strcmp(a, "--no-peers") == 0)
            o.peers = 0;
        else if (strcmp(a, "--no-roofline") == 0)
            o.roofline = 0;
        else if (strcmp(a, "--cold") == 0)
            o.cold = 1;
        else if (strcmp(a, "--huge-pages") == 0)
            bench_huge_pages();
        else if (!v)
            usage(2);
        else if (++i, strcmp(a, "--op") == 0) {
            size_t k = 0;
            while (k < N_OPS && strcmp(v, OPS[k]->name) != 0) k++;
            if (k == N_OPS) usage(2);
            o.ops[k] = any_op = 1;
        } else if (strcmp(a, "--shape") == 0 && o.n_shapes < MAX_SHAPES) {
            if (!attention_set_shape(o.n_shapes + 1, v)) {
                fprintf(stderr, "bench: bad shape %s (example: b1h8kv2q512k512d128causal)\n", v);
                exit(2);
            }
            o.shape_sizes[o.n_shapes] = o.n_shapes + 1;
            o.n_shapes++;
        } else if (strcmp(a, "--backend") == 0 && o.n_backends < 8) {
            if (!sdpa_backend_supported(v)) {
                fprintf(stderr, "bench: backend %s cannot run here\n", v);
                exit(2);
            }
            o.backends[o.n_backends++] = v;
        } else if (strcmp(a, "--n") == 0 && o.n_sizes < MAX_SIZES - 1) {
            if (!(o.sizes[o.n_sizes++] = strtoull(v, NULL, 0))) usage(2);
        } else if (strcmp(a, "--d") == 0 && o.n_dims < MAX_DIMS - 1) {
            if (!(o.dims[o.n_dims++] = strtoull(v, NULL, 0))) usage(2);
        } else if (strcmp(a, "--reps") == 0)
            o.reps = atoi(v);
        else if (strcmp(a, "--min-ms") == 0)
            o.min_ms = atof(v);
        else if (strcmp(a, "--openblas-core") == 0)
            continue; /* used by set_peer_environment */
        else if (strcmp(a, "--cpu") == 0)
            o.cpu = atoi(v);
        else if (strcmp(a, "--pool-offset") == 0)
            attention_pool_offset(strtoull(v, NULL, 0));
        else if (strcmp(a, "--threads") == 0)
            parse_threads(&o, v);
        else if (strcmp(a, "--against") == 0)
            o.against = v;
        else if (strcmp(a, "--csv") == 0)
            o.csv = v;
        else if (strcmp(a, "--json") == 0)
            o.json = v;
        else if (strcmp(a, "--plot") == 0)
            o.plot = v;
        else
            usage(2);
    }
    if (o.smoke) o.reps = 1, o.roofline = 0;
    if (o.reps < 1 || o.reps > MAX_REPS) usage(2);
    if (!any_op)
        for (size_t k = 0; k < N_OPS; k++) o.ops[k] = !o.n_shapes || OPS[k]->shaped;
    if (o.n_shapes) attention_use_shapes(o.n_shapes);
    if (!o.n_backends) {
        /* scalar is always measured: it is the baseline of every ratio */
        for (size_t i = 0; sdpa_backend_name(i); i++)
            if (sdpa_backend_supported(sdpa_backend_name(i)))
                o.backends[o.n_backends++] = sdpa_backend_name(i);
    } else if (!sdpa_backend_supported("scalar") || o.n_backends == 8) {
        usage(2);
    } else {
        int has_scalar = 0;
        for (size_t i = 0; i < o.n_backends; i++) has_scalar |= !strcmp(o.backends[i], "scalar");
        if (!has_scalar) o.backends[o.n_backends++] = "scalar";
    }
    return o;
}
