/* The dispatcher: names, forcing, "auto", the environment, status strings. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"

Test(dispatch, abi_and_version) {
    cr_assert_eq(sdpa_abi_version(), SDPA_ABI_VERSION);
    cr_assert_not_null(sdpa_version());
}

Test(dispatch, status_strings_never_null) {
    for (int s = -1; s <= 8; s++) {
        const char *text = sdpa_status_string((sdpa_status)s);
        cr_assert_not_null(text);
        cr_assert_gt(strlen(text), 0);
    }
    cr_assert_str_neq(sdpa_status_string(SDPA_ERR_NULL), sdpa_status_string(SDPA_ERR_SIZE));
}

Test(dispatch, backend_names_best_first) {
    const char *want[] = {"avx512", "avx2", "sse", "neon", "scalar"};
    size_t i = 0;
    for (; sdpa_backend_name(i); i++) cr_assert_str_eq(sdpa_backend_name(i), want[i]);
    cr_assert_eq(i, 5);
    cr_assert(sdpa_backend_supported("scalar"), "scalar runs everywhere");
    cr_assert(!sdpa_backend_supported("bogus"));
    cr_assert(!sdpa_backend_supported(NULL));
    cr_assert(!sdpa_backend_supported("auto"), "auto is not a backend");
#if defined(__x86_64__)
    cr_assert(!sdpa_backend_supported("neon"));
#elif defined(__aarch64__)
    cr_assert(!sdpa_backend_supported("avx2"));
    cr_assert(sdpa_backend_supported("neon"), "every AArch64 CPU has Advanced SIMD");
#endif
}

static const char *best_supported(void) {
    for (size_t i = 0; sdpa_backend_name(i); i++)
        if (sdpa_backend_supported(sdpa_backend_name(i))) return sdpa_backend_name(i);
    return NULL;
}

Test(dispatch, auto_picks_the_best_supported) {
    cr_assert_eq(sdpa_set_backend("scalar"), SDPA_OK);
    cr_assert_eq(sdpa_set_backend("auto"), SDPA_OK);
    cr_assert_str_eq(sdpa_backend(), best_supported());
}

Test(dispatch, loads_with_the_expected_backend) {
    /* Test setups that emulate a CPU say which backend it must get (SDPA_EXPECT_BACKEND);
       without one, the best this CPU supports. SDPA_BACKEND must not be set for this test. */
    const char *expect = getenv("SDPA_EXPECT_BACKEND");
    cr_log_info("dispatcher picked %s", sdpa_backend());
    cr_assert_str_eq(sdpa_backend(), expect ? expect : best_supported());
}

Test(dispatch, unsupported_names_change_nothing) {
    cr_assert_eq(sdpa_set_backend("scalar"), SDPA_OK);
    cr_assert_eq(sdpa_set_backend("bogus"), SDPA_ERR_UNSUPPORTED);
    cr_assert_eq(sdpa_set_backend(""), SDPA_ERR_UNSUPPORTED);
    cr_assert_eq(sdpa_set_backend(NULL), SDPA_ERR_NULL);
#if defined(__x86_64__)
    cr_assert_eq(sdpa_set_backend("neon"), SDPA_ERR_UNSUPPORTED);
#endif
    cr_assert_str_eq(sdpa_backend(), "scalar");
}

Test(dispatch, exp_mode) {
    const char *env = getenv("SDPA_EXP");
    cr_assert_str_eq(sdpa_exp_mode(), env && strcmp(env, "sleef") == 0 ? "sleef" : "fast");
    cr_assert_eq(sdpa_set_exp_mode("sleef"), SDPA_OK);
    cr_assert_str_eq(sdpa_exp_mode(), "sleef");
    cr_assert_eq(sdpa_set_exp_mode("fast"), SDPA_OK);
    cr_assert_str_eq(sdpa_exp_mode(), "fast");
    cr_assert_eq(sdpa_set_exp_mode("bogus"), SDPA_ERR_UNSUPPORTED);
    cr_assert_eq(sdpa_set_exp_mode(NULL), SDPA_ERR_NULL);
    cr_assert_str_eq(sdpa_exp_mode(), "fast");
}

/* Runs the helper program (it prints the backend it loaded with) with SDPA_BACKEND set; returns
   its stdout line and whether it wrote to stderr. */
static void run_with_backend_env(const char *value, char *out, size_t out_len, char *err,
                                 size_t err_len) {
    /* the helper is built next to this test binary (meson also passes its path) */
    char helper[4096];
    const char *env = getenv("SDPA_PRINT_BACKEND");
    if (env) {
        snprintf(helper, sizeof helper, "%s", env);
    } else {
        ssize_t len = readlink("/proc/self/exe", helper, sizeof helper - 32);
        cr_assert_gt(len, 0);
        helper[len] = 0;
        strcpy(strrchr(helper, '/') + 1, "print_backend");
    }
    char cmd[8300];
    snprintf(cmd, sizeof cmd, "SDPA_BACKEND='%s' '%s' 2>/tmp/sdpa_dispatch_err.%d", value, helper,
             (int)getpid());
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    out[0] = 0;
    if (!fgets(out, (int)out_len, p)) out[0] = 0;
    cr_assert_eq(pclose(p), 0, "helper failed");
    out[strcspn(out, "\n")] = 0;
    snprintf(cmd, sizeof cmd, "/tmp/sdpa_dispatch_err.%d", (int)getpid());
    FILE *e = fopen(cmd, "r");
    size_t got = e ? fread(err, 1, err_len - 1, e) : 0;
    err[got] = 0;
    if (e) fclose(e);
    remove(cmd);
}

Test(dispatch, environment_forces_each_supported_backend) {
    char out[256], err[1024];
    for (size_t i = 0; sdpa_backend_name(i); i++) {
        const char *name = sdpa_backend_name(i);
        run_with_backend_env(name, out, sizeof out, err, sizeof err);
        if (sdpa_backend_supported(name)) {
            cr_assert_str_eq(out, name);
            cr_assert_str_empty(err, "no message when the forced backend runs: %s", err);
        } else {
            cr_assert_str_eq(out, best_supported(), "unsupported %s falls back", name);
            cr_assert(strstr(err, name) && strstr(err, "not supported"), "stderr: %s", err);
        }
    }
}

Test(dispatch, environment_with_unknown_name_falls_back_with_one_line) {
    char out[256], err[1024];
    run_with_backend_env("bogus", out, sizeof out, err, sizeof err);
    cr_assert_str_eq(out, best_supported());
    cr_assert(strstr(err, "bogus") != NULL, "stderr names the bad value: %s", err);
    cr_assert_eq(strchr(err, '\n'), err + strlen(err) - 1, "exactly one line: %s", err);
}
