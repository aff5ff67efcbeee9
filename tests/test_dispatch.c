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

/* Reads what fd holds until EOF into buf (NUL-terminated, truncated to len - 1). */
static void read_all(int fd, char *buf, size_t len) {
    size_t got = 0;
    ssize_t r;
    while ((r = read(fd, buf + got, len - 1 - got)) > 0) got += (size_t)r;
    buf[got] = 0;
}

/* Runs the helper program (it prints the backend it loaded with, or with arg "exp" the exp mode)
   with the environment variable var set to value; returns its stdout line and its stderr.
   fork + execve, not popen: popen's shell is a host program, which under qemu-user would escape
   the emulator (tests/qexec.c routes execve only). */
static void run_with_env(const char *var, const char *value, const char *arg, char *out,
                         size_t out_len, char *err, size_t err_len) {
    /* the helper is built next to this test binary (meson also passes its path) */
    char helper[4096];
    const char *path = getenv("SDPA_PRINT_BACKEND");
    if (path) {
        snprintf(helper, sizeof helper, "%s", path);
    } else {
        ssize_t len = readlink("/proc/self/exe", helper, sizeof helper - 32);
        cr_assert_gt(len, 0);
        helper[len] = 0;
        strcpy(strrchr(helper, '/') + 1, "print_backend");
    }
    /* this environment, with var replaced */
    extern char **environ;
    size_t n_env = 0, var_len = strlen(var);
    while (environ[n_env]) n_env++;
    char **env = calloc(n_env + 2, sizeof *env);
    cr_assert_not_null(env);
    size_t k = 0;
    for (size_t i = 0; i < n_env; i++)
        if (strncmp(environ[i], var, var_len) != 0 || environ[i][var_len] != '=')
            env[k++] = environ[i];
    char forced[256];
    snprintf(forced, sizeof forced, "%s=%s", var, value);
    env[k++] = forced;
    env[k] = NULL;

    int out_pipe[2], err_pipe[2];
    cr_assert_eq(pipe(out_pipe), 0);
    cr_assert_eq(pipe(err_pipe), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0, "fork");
    if (pid == 0) {
        dup2(out_pipe[1], STDOUT_FILENO);
        dup2(err_pipe[1], STDERR_FILENO);
        close(out_pipe[0]);
        close(out_pipe[1]);
        close(err_pipe[0]);
        close(err_pipe[1]);
        char *argv[] = {helper, (char *)arg, NULL};
        execve(helper, argv, env);
        _exit(127);
    }
    close(out_pipe[1]);
    close(err_pipe[1]);
    /* the helper writes a line to each at most: neither pipe can fill while the other waits */
    read_all(out_pipe[0], out, out_len);
    read_all(err_pipe[0], err, err_len);
    close(out_pipe[0]);
    close(err_pipe[0]);
    free(env);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "helper failed: %s", err);
    out[strcspn(out, "\n")] = 0;
}

Test(dispatch, environment_forces_each_supported_backend) {
    char out[256], err[1024];
    for (size_t i = 0; sdpa_backend_name(i); i++) {
        const char *name = sdpa_backend_name(i);
        run_with_env("SDPA_BACKEND", name, NULL, out, sizeof out, err, sizeof err);
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
    run_with_env("SDPA_BACKEND", "bogus", NULL, out, sizeof out, err, sizeof err);
    cr_assert_str_eq(out, best_supported());
    cr_assert(strstr(err, "bogus") != NULL, "stderr names the bad value: %s", err);
    cr_assert_eq(strchr(err, '\n'), err + strlen(err) - 1, "exactly one line: %s", err);
}

/* SDPA_EXP is read like SDPA_BACKEND: a known name is used silently, an unknown one falls back
 * to "fast" with one line on stderr that names it. */
Test(dispatch, environment_sets_the_exp_mode_or_says_why_not) {
    char out[256], err[1024];
    run_with_env("SDPA_EXP", "sleef", "exp", out, sizeof out, err, sizeof err);
    cr_assert_str_eq(out, "sleef");
    cr_assert_str_empty(err, "no message for a known mode: %s", err);
    run_with_env("SDPA_EXP", "fast", "exp", out, sizeof out, err, sizeof err);
    cr_assert_str_eq(out, "fast");
    cr_assert_str_empty(err, "no message for a known mode: %s", err);
    run_with_env("SDPA_EXP", "sleeef", "exp", out, sizeof out, err, sizeof err);
    cr_assert_str_eq(out, "fast");
    cr_assert(strstr(err, "sleeef") != NULL, "stderr names the bad value: %s", err);
    cr_assert_eq(strchr(err, '\n'), err + strlen(err) - 1, "exactly one line: %s", err);
}

/* SDPA_NUM_THREADS: a plain decimal from 0 to 1024 is used silently (0: the default); anything
 * else keeps the default with one line on stderr that names the value. strtoull would take a
 * sign after blanks and wrap it: " -18446744073709551615" is 1 to it. */
Test(dispatch, environment_thread_count_is_a_plain_decimal_or_the_default) {
    char out[256], err[1024], want[256];
    run_with_env("SDPA_NUM_THREADS", "0", "threads", out, sizeof out, err, sizeof err);
    cr_assert_str_empty(err, "no message for 0: %s", err);
    snprintf(want, sizeof want, "%s", out); /* the default: 0 asks for it */
    cr_assert_neq(strcmp(want, "0"), 0, "the default is never 0 threads");
    const char *good[][2] = {{"3", "3"}, {"1024", "1024"}, {"0007", "7"}};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        run_with_env("SDPA_NUM_THREADS", good[i][0], "threads", out, sizeof out, err, sizeof err);
        cr_assert_str_eq(out, good[i][1], "SDPA_NUM_THREADS=%s", good[i][0]);
        cr_assert_str_empty(err, "no message for %s: %s", good[i][0], err);
    }
    const char *bad[] = {" -18446744073709551615",
                         "\t-18446744073709551613",
                         "-1",
                         "+3",
                         " 3",
                         "3 ",
                         "0x10",
                         "1025",
                         "18446744073709551619",
                         "2.5",
                         "three"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        run_with_env("SDPA_NUM_THREADS", bad[i], "threads", out, sizeof out, err, sizeof err);
        cr_assert_str_eq(out, want, "SDPA_NUM_THREADS=\"%s\" keeps the default", bad[i]);
        cr_assert(strstr(err, "SDPA_NUM_THREADS=") && strstr(err, bad[i]),
                  "stderr names the bad value \"%s\": %s", bad[i], err);
        cr_assert_eq(strchr(err, '\n'), err + strlen(err) - 1, "exactly one line: %s", err);
    }
}

/* The bf16 dot's default, as a pure function of the CPU and SDPA_BF16_DOT (bf16_dot_default.h):
 * on where a measurement showed vdpbf16ps faster than widening, off elsewhere, AMX first, and the
 * variable decides when it says on or off. */
#include "bf16_dot_default.h"

static void expect_choice(sdpa_cpu_id cpu, const char *env, int on, int invalid, const char *why) {
    const sdpa_addon_choice c = sdpa_bf16_dot_default(&cpu, env);
    cr_assert_eq(c.on, on, "%s family %d model %d, SDPA_BF16_DOT=%s: %s (%s)", cpu.vendor,
                 cpu.family, cpu.model, env ? env : "unset", c.on ? "on" : "off", c.reason);
    cr_assert_eq(c.env_invalid, invalid, "SDPA_BF16_DOT=%s flagged %d", env ? env : "unset",
                 c.env_invalid);
    cr_assert(c.reason && strstr(c.reason, why), "reason \"%s\" says \"%s\"", c.reason, why);
}

Test(dispatch, bf16_dot_default_follows_the_measured_rule) {
    /* AMD EPYC (Zen 5), as CPUID gives it: measured faster */
    const sdpa_cpu_id zen5 = {"AuthenticAMD", 26, 2, 1, 0};
    expect_choice(zen5, NULL, 1, 0, "Zen 5");
    expect_choice(zen5, "", 1, 0, "measured faster");
    expect_choice(zen5, "auto", 1, 0, "measured faster");
    expect_choice(zen5, "off", 0, 0, "SDPA_BF16_DOT=off");
    expect_choice(zen5, "maybe", 1, 1, "Zen 5");
    /* Zen 4 has AVX512_BF16 too, but was not measured */
    expect_choice((sdpa_cpu_id){"AuthenticAMD", 25, 17, 1, 0}, NULL, 0, 0, "not measured");
    /* the Intel Xeon measured: AMX first; with AMX off, vdpbf16ps measured slower */
    const sdpa_cpu_id xeon_amx = {"GenuineIntel", 6, 167, 1, 1};
    expect_choice(xeon_amx, NULL, 0, 0, "AMX");
    expect_choice(xeon_amx, "on", 1, 0, "SDPA_BF16_DOT=on");
    const sdpa_cpu_id xeon_amx_off = {"GenuineIntel", 6, 167, 1, 0};
    expect_choice(xeon_amx_off, NULL, 0, 0, "measured slower");
    /* an Intel with AVX512_BF16 and no AMX (Cooper Lake): not measured */
    expect_choice((sdpa_cpu_id){"GenuineIntel", 6, 85, 1, 0}, NULL, 0, 0, "not measured");
    /* an unknown vendor, and no vendor at all */
    expect_choice((sdpa_cpu_id){"HygonGenuine", 26, 2, 1, 0}, NULL, 0, 0, "not measured");
    expect_choice((sdpa_cpu_id){NULL, 0, 0, 1, 0}, "on", 1, 0, "SDPA_BF16_DOT=on");
    expect_choice((sdpa_cpu_id){NULL, 0, 0, 1, 0}, NULL, 0, 0, "not measured");
    /* no AVX512_BF16: off whatever the variable says */
    const sdpa_cpu_id zen5_no_bf16 = {"AuthenticAMD", 26, 2, 0, 0};
    expect_choice(zen5_no_bf16, NULL, 0, 0, "lacks AVX512_BF16");
    expect_choice(zen5_no_bf16, "on", 0, 0, "lacks AVX512_BF16");
}
