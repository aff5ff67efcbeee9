/* LD_PRELOAD shim that keeps a test under qemu-user across execve. Criterion runs every test
 * in a re-executed copy of its binary; under qemu-user that execve goes to the host kernel,
 * so an x86-64 test would silently run natively (on the host's CPU, not the emulated one)
 * and an aarch64 one would not start at all. With QEXEC_QEMU set (the emulator's path), every
 * execve becomes `$QEXEC_QEMU -0 argv[0] path argv[1..]`.
 *
 * Built for the guest and preloaded into it through QEMU_SET_ENV=LD_PRELOAD=<this .so>, which
 * the emulator reads (and its children inherit); LD_PRELOAD itself is dropped from the host
 * environment of the new emulator, whose own (host) loader could not load a guest library.
 * The other QEMU_* variables (QEMU_CPU, QEMU_LD_PREFIX) pass through unchanged.
 * Used by the test setups in tests/meson.build; never part of the library. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int (*execve_fn)(const char *, char *const[], char *const[]);

int execve(const char *path, char *const argv[], char *const envp[]) {
    execve_fn real = (execve_fn)dlsym(RTLD_NEXT, "execve");
    if (!real) {
        errno = ENOSYS;
        return -1;
    }
    const char *qemu = getenv("QEXEC_QEMU");
    if (!qemu || !*qemu) return real(path, argv, envp);

    size_t n_args = 0, n_env = 0;
    while (argv[n_args]) n_args++;
    while (envp[n_env]) n_env++;
    char **args = malloc((n_args + 4) * sizeof *args);
    char **env = malloc((n_env + 1) * sizeof *env);
    if (!args || !env) {
        free(args);
        free(env);
        errno = ENOMEM;
        return -1;
    }
    size_t k = 0;
    args[k++] = (char *)qemu;
    if (n_args > 0) { /* the guest sees its own argv[0], not the path */
        args[k++] = "-0";
        args[k++] = argv[0];
    }
    args[k++] = (char *)path;
    for (size_t i = 1; i < n_args; i++) args[k++] = argv[i];
    args[k] = NULL;
    k = 0;
    for (size_t i = 0; i < n_env; i++)
        if (strncmp(envp[i], "LD_PRELOAD=", 11) != 0) env[k++] = envp[i];
    env[k] = NULL;

    int status = real(qemu, args, env);
    int saved = errno; /* only reached when the exec failed */
    free(args);
    free(env);
    errno = saved;
    return status;
}
