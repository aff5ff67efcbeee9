/* Whether the avx512 backend's vdpbf16ps add-on (bf16_dot, the record whose 'default' is
 * 'per-cpu' in meson.build) is on, and why: a pure function of what the CPU reports and of
 * SDPA_BF16_DOT, so that the library (src/dispatch.c), `sdpa info` and the tests apply one rule.
 *
 * The rule, in order:
 *   1. SDPA_BF16_DOT=on or off decides (on only where the CPU has AVX512_BF16);
 *   2. a CPU without AVX512_BF16 (or whose OS does not save the ZMM state): off;
 *   3. where the AMX add-on is on, AMX comes first: off (tiles beat vdpbf16ps wherever measured);
 *   4. a CPU in BF16_DOT_MEASURED: what its measurement showed (docs/performance.md);
 *   5. any other CPU: off, since vdpbf16ps pays only where it keeps up with the FMAs, and that
 *      differs between cores of one family. */
#ifndef SDPA_SRC_BF16_DOT_DEFAULT_H
#define SDPA_SRC_BF16_DOT_DEFAULT_H

#include <string.h>

/* What the rule looks at: CPUID's vendor string and display family and model, and features. */
typedef struct sdpa_cpu_id {
    const char *vendor; /* "AuthenticAMD", "GenuineIntel", ... */
    int family, model;
    int avx512_bf16; /* the CPU has AVX512_BF16 (and AVX512BW) and the OS saves the ZMM state */
    int amx_on;      /* the AMX add-on is on here: it is listed first, so it is used first */
} sdpa_cpu_id;

/* The rule's answer: on or off, why (a phrase for `sdpa info` and messages), and whether the
 * variable held something other than on, off, auto or nothing (then the rest of the rule chose). */
typedef struct sdpa_addon_choice {
    int on;
    int env_invalid;
    const char *reason;
} sdpa_addon_choice;

/* The CPUs whose all-bf16 prefill was measured with SDPA_BF16_DOT=on and off against f32 on the
 * same run (docs/performance.md, "bf16 Q.K with AMX and AVX512_BF16"); model -1: any model. */
typedef struct bf16_dot_measured {
    const char *vendor;
    int family, model, on;
    const char *reason;
} bf16_dot_measured;
static const bf16_dot_measured BF16_DOT_MEASURED[] = {
    {"AuthenticAMD", 26, -1, 1, "AMD family 26 (Zen 5), measured faster"},
    {"GenuineIntel", 6, 167, 0, "Intel family 6 model 167, measured slower than widening"},
};

static inline sdpa_addon_choice sdpa_bf16_dot_default(const sdpa_cpu_id *cpu, const char *env) {
    sdpa_addon_choice c = {0, 0, "not measured on this CPU"};
    if (env && *env && strcmp(env, "auto") != 0) {
        if (strcmp(env, "on") == 0)
            return cpu->avx512_bf16 ? (sdpa_addon_choice){1, 0, "SDPA_BF16_DOT=on"}
                                    : (sdpa_addon_choice){0, 0, "the CPU lacks AVX512_BF16"};
        if (strcmp(env, "off") == 0) return (sdpa_addon_choice){0, 0, "SDPA_BF16_DOT=off"};
        c.env_invalid = 1;
    }
    if (!cpu->avx512_bf16) {
        c.reason = "the CPU lacks AVX512_BF16";
    } else if (cpu->amx_on) {
        c.reason = "AMX comes first on this CPU";
    } else {
        for (size_t i = 0; i < sizeof BF16_DOT_MEASURED / sizeof BF16_DOT_MEASURED[0]; i++) {
            const bf16_dot_measured *m = &BF16_DOT_MEASURED[i];
            if (cpu->vendor && strcmp(cpu->vendor, m->vendor) == 0 && cpu->family == m->family &&
                (m->model < 0 || cpu->model == m->model)) {
                c.on = m->on;
                c.reason = m->reason;
                break;
            }
        }
    }
    return c;
}

#endif
