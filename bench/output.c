/* --json and --plot: the rows of the table, kept in memory until the run ends. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "output.h"

#define MAX_RECORDS 2048

static bench_record records[MAX_RECORDS];
static size_t n_records;

void record_add(const bench_record *r) {
    if (n_records < MAX_RECORDS) records[n_records++] = *r;
}

/* s as a JSON string (the texts here hold no control characters, only quotes or backslashes
 * might need escaping) */
static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; s && *s; s++) {
        if (*s == '"' || *s == '\\') fputc('\\', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

int write_json(const char *path, const bench_context *c) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "bench: cannot write %s\n", path);
        return -1;
    }
    const char *keys[] = {"date",  "cpu",      "active_backend", "compiler", "flags",
                          "sleef", "openblas", "onednn",         "naive",    "clock"};
    const char *values[] = {c->date,  c->cpu,      c->backend, c->compiler, c->flags,
                            c->sleef, c->openblas, c->onednn,  c->naive,    c->clock};
    fprintf(f, "{\n  \"context\": {\n");
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        fprintf(f, "    \"%s\": ", keys[i]);
        if (values[i])
            json_string(f, values[i]);
        else
            fprintf(f, "null");
        fprintf(f, ",\n");
    }
    if (c->roof) {
        const roofline *r = c->roof;
        fprintf(
            f,
            "    \"roofline\": {\"clock_ghz\": %.3f, \"fma_isa\": \"%s\", \"fma_gflops\": %.1f, "
            "\"read_isa\": \"%s\", \"read_gbytes_per_s\": {",
            r->clock_ghz, r->fma_isa, r->fma_gflops, r->read_isa);
        for (int l = 0; l < ROOF_LEVELS; l++)
            fprintf(f, "\"%s\": %.1f%s", ROOF_LEVEL_NAMES[l], r->read_gbytes_per_s[l],
                    l + 1 < ROOF_LEVELS ? ", " : "");
        fprintf(f, "}, \"random_rows_gbytes_per_s\": %.1f}\n  },\n", r->rows_gbytes_per_s);
    } else {
        fprintf(f, "    \"roofline\": null\n  },\n");
    }
    fprintf(f, "  \"rows\": [\n");
    for (size_t i = 0; i < n_records; i++) {
        const bench_record *r = &records[i];
        fprintf(f,
                "    {\"op\": \"%s\", \"size\": \"%s\", \"n\": %zu, \"d\": %zu, \"impl\": \"%s\", "
                "\"ns_median\": %.4f, "
                "\"ns_min\": %.4f, \"ns_max\": %.4f, \"ns_per_element\": %.6f, \"gflops\": %.4f, "
                "\"gbytes_per_s\": %.4f, ",
                r->op, r->size, r->n, r->d, r->impl, r->ns, r->ns_min, r->ns_max,
                r->ns / (double)r->n, r->gflops, r->gbytes_per_s);
        if (r->roof_percent >= 0)
            fprintf(f, "\"roof_percent\": %.1f, \"roof_limit\": \"%s\", ", r->roof_percent,
                    r->limit);
        else
            fprintf(f, "\"roof_percent\": null, \"roof_limit\": null, ");
        fprintf(f, "\"vs_scalar\": %.4f, \"check\": \"%s\"}%s\n", r->vs_scalar,
                r->ok ? "ok" : "wrong", i + 1 < n_records ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    return fclose(f) == 0 ? 0 : -1;
}

/* One data file and one gnuplot script per operation; gnuplot draws throughput against n on a
 * log2 axis, one line per implementation (attention: against the shapes, in the order run). */
int write_plots(const char *dir) {
    if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
        fprintf(stderr, "bench: --plot needs gnuplot (Debian: apt-get install gnuplot-nox); "
                        "no plots written\n");
        return -1;
    }
    mkdir(dir, 0777);
    /* operations in order of first appearance */
    const char *ops[64];
    const char *ylabel[64];
    size_t n_ops = 0;
    for (size_t i = 0; i < n_records; i++) {
        size_t k = 0;
        while (k < n_ops && strcmp(ops[k], records[i].op) != 0) k++;
        if (k == n_ops && n_ops < 64) ops[n_ops] = records[i].op, ylabel[n_ops++] = records[i].unit;
    }
    for (size_t o = 0; o < n_ops; o++) {
        char file[32]; /* "scores d128" -> "scores_d128" */
        snprintf(file, sizeof file, "%s", ops[o]);
        for (char *c = file; *c; c++)
            if (*c == ' ') *c = '_';
        /* implementation labels in order of first appearance */
        const char *labels[64];
        size_t n_labels = 0;
        for (size_t i = 0; i < n_records; i++) {
            if (strcmp(records[i].op, ops[o]) != 0) continue;
            size_t l = 0;
            while (l < n_labels && strcmp(labels[l], records[i].impl) != 0) l++;
            if (l == n_labels && n_labels < 64) labels[n_labels++] = records[i].impl;
        }
        if (!n_labels) continue;
        char path[4096], script[4096];
        snprintf(path, sizeof path, "%s/%s.dat", dir, file);
        FILE *d = fopen(path, "w");
        snprintf(script, sizeof script, "%s/%s.gp", dir, file);
        FILE *g = fopen(script, "w");
        if (!d || !g) {
            fprintf(stderr, "bench: cannot write in %s\n", dir);
            if (d) fclose(d);
            if (g) fclose(g);
            return -1;
        }
        int shapes = strncmp(ops[o], "attention", 9) == 0;
        for (size_t l = 0; l < n_labels; l++) {
            fprintf(d, "# %s\n", labels[l]);
            size_t shape = 0; /* attention: the shapes in order, for every implementation */
            for (size_t i = 0; i < n_records; i++)
                if (strcmp(records[i].op, ops[o]) == 0 && strcmp(records[i].impl, labels[l]) == 0)
                    fprintf(d, "%zu %.6f %s\n", shapes ? shape++ : records[i].n, records[i].per_ns,
                            records[i].size);
            fprintf(d, "\n\n");
        }
        fclose(d);
        fprintf(g, "set terminal pngcairo size 1000,600\nset output '%s/%s.png'\n", dir, file);
        if (shapes)
            fprintf(g,
                    "set title 'sdpa %s: throughput per shape (higher is better)'\n"
                    "set xtics rotate by -30\nset xlabel 'shape'\nset offsets 0.5, 0.5, 0, 0\n",
                    ops[o]);
        else
            fprintf(g,
                    "set title 'sdpa %s: throughput against size (higher is better)'\n"
                    "set logscale x 2\nset format x '2^{%%L}'\nset xlabel '%s'\n",
                    ops[o], strncmp(ops[o], "scores", 6) == 0 ? "keys" : "n (floats)");
        fprintf(g, "set ylabel '%s'\nset key outside right\nset grid\nplot ", ylabel[o]);
        for (size_t l = 0; l < n_labels; l++)
            fprintf(g, "%s'%s' index %zu using 1:2%s with linespoints title '%s'", l ? ", " : "",
                    path, l, shapes ? ":xtic(3)" : "", labels[l]);
        fprintf(g, "\n");
        fclose(g);
        char cmd[8300];
        snprintf(cmd, sizeof cmd, "gnuplot '%s'", script);
        if (system(cmd) != 0) {
            fprintf(stderr, "bench: gnuplot failed on %s\n", script);
            return -1;
        }
        printf("plot: %s/%s.png\n", dir, file);
    }
    return 0;
}
