/* sdpa: scaled dot-product attention on the CPU, one stable C ABI over per-ISA SIMD backends.
 *
 *     Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V
 *
 * ABI v1. Names, argument orders and meanings below never change within 1.x; new functions are
 * only ever added. Every function is thread-safe. Pointers need no particular alignment.
 *
 * Errors: every call that can fail returns an sdpa_status. Arguments are checked before any work,
 * and on error no output is written. Nothing aborts and nothing prints, except one line on
 * stderr at load time when SDPA_BACKEND names a backend that cannot run here.
 *
 * Special values (z below is the scaled input of a softmax, z_i = scale * x_i rounded to float):
 *   - entries with z = -inf get exactly 0; a row that is entirely -inf gives all zeros (a fully
 *     masked row), never NaN;
 *   - any NaN in z makes every output of the row NaN;
 *   - +inf entries share the mass equally and every other entry gets 0 (the limit);
 *   - outputs are never subnormal: a weight below FLT_MIN is exactly 0.
 *   dot, scale and scores follow IEEE arithmetic (NaN and inf propagate as in the sums they are).
 *
 * Accuracy, measured against a double-precision reference in the test suite on every backend:
 *   - sdpa_scale_f32: bit-exact, one IEEE multiply per element on every backend;
 *   - sdpa_dot_f32, sdpa_scores_f32: |error| <= 1e-5 * sum_i |a_i * b_i| for n <= 4096;
 *   - sdpa_softmax_f32: relative error per element <= 2e-5 for n <= 4096 and <= 1e-4 for
 *     n <= 2^20 when |scale * x_i| <= 80 (outputs below 2 * FLT_MIN may be 0);
 *   - sdpa_softmax_backward_f32: |error| <= 1e-5 * |scale| * y_i * (|dy_i| + sum_j y_j |dy_j|).
 *   The default exp ("fast", an inlined degree-5 polynomial) is within 3 ULP of exp (2.4 measured)
 * over the whole float range where the result is a normal float (subnormal results are flushed to
 * 0, overflow gives +inf, NaN stays NaN); "sleef" uses SLEEF's 1-ULP expf instead (SDPA_EXP=sleef
 * or sdpa_set_exp_mode("sleef")).
 */
#ifndef SDPA_H
#define SDPA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(SDPA_BUILDING_LIBRARY)
#define SDPA_API __attribute__((visibility("default")))
#else
#define SDPA_API
#endif

#define SDPA_ABI_VERSION 1u

typedef enum sdpa_status {
    SDPA_OK = 0,
    SDPA_ERR_NULL = 1, /* a required pointer is NULL */
    SDPA_ERR_SIZE = 2, /* a size that must not be zero is zero, or a size computation overflows */
    SDPA_ERR_ARG = 3,  /* another invalid argument: non-finite scale, unknown flag bits, ... */
    SDPA_ERR_UNSUPPORTED = 4 /* unknown backend name, or a backend this CPU cannot run */
} sdpa_status;

/* A short English description of status; never NULL (unknown values give "unknown status"). */
SDPA_API const char *sdpa_status_string(sdpa_status status);

/* SDPA_ABI_VERSION of the library that was loaded. */
SDPA_API uint32_t sdpa_abi_version(void);

/* Library version, "MAJOR.MINOR.PATCH". */
SDPA_API const char *sdpa_version(void);

/* ---- Kernels. n == 0 is valid and does nothing (dot stores 0). NULL is an error only when
 *      something would be read or written through it. ---- */

/* *result = sum_i a[i] * b[i]. */
SDPA_API sdpa_status sdpa_dot_f32(const float *a, const float *b, size_t n, float *result);

/* y[i] = alpha * x[i]; y == x is allowed. Any alpha, including non-finite, is valid. */
SDPA_API sdpa_status sdpa_scale_f32(float *y, const float *x, size_t n, float alpha);

/* y = softmax(scale * x), numerically stable (the row max is subtracted first, so no finite
 * input overflows); y == x is allowed. scale must be finite and non-zero (else SDPA_ERR_ARG). */
SDPA_API sdpa_status sdpa_softmax_f32(float *y, const float *x, size_t n, float scale);

/* Gradient of softmax(scale * x) given its output y and the upstream gradient dy:
 * dx[i] = scale * y[i] * (dy[i] - sum_j y[j] * dy[j]). dx may alias y or dy.
 * scale must be finite and non-zero. */
SDPA_API sdpa_status sdpa_softmax_backward_f32(float *dx, const float *y, const float *dy, size_t n,
                                               float scale);

/* s[j] = scale * dot(q, k + j * k_stride) over d floats, for j < n_keys.
 * k_stride >= d (else SDPA_ERR_SIZE, also when d == 0 with n_keys > 0); scale finite. */
SDPA_API sdpa_status sdpa_scores_f32(float *s, const float *q, const float *k, size_t n_keys,
                                     size_t d, size_t k_stride, float scale);

/* ---- Backends: "scalar", "sse" (SSE4.1), "avx2" (AVX2+FMA), "avx512" (AVX-512F),
 *      "neon" (AArch64 Advanced SIMD). The best one this CPU and OS can run is chosen once, at
 *      load time; SDPA_BACKEND=<name> in the environment forces one (an unknown or unsupported
 *      name falls back to the best, with one line on stderr). ---- */

/* Name of the active backend. */
SDPA_API const char *sdpa_backend(void);

/* Make name the active backend for the whole process, or "auto" for the best one.
 * SDPA_ERR_NULL for NULL, SDPA_ERR_UNSUPPORTED for an unknown name or one this CPU cannot run
 * (the active backend is then unchanged). Calls in flight finish on the backend they started on. */
SDPA_API sdpa_status sdpa_set_backend(const char *name);

/* 1 if the backend is compiled into this library and this CPU (and OS) can run it, else 0. */
SDPA_API int sdpa_backend_supported(const char *name);

/* The index-th backend name this library knows, best first; NULL past the end. */
SDPA_API const char *sdpa_backend_name(size_t index);

/* exp used by softmax (and attention): "fast" (default) or "sleef" (see Accuracy above).
 * SDPA_EXP=sleef in the environment selects "sleef" at load time. */
SDPA_API const char *sdpa_exp_mode(void);
SDPA_API sdpa_status sdpa_set_exp_mode(const char *name); /* SDPA_ERR_UNSUPPORTED if unknown */

/* ---- Plugin entry point. A host that dlopen()s the library looks up only this symbol:
 *
 *     const sdpa_api *(*get)(uint32_t) = (const sdpa_api *(*)(uint32_t))dlsym(h, "sdpa_get_api");
 *     const sdpa_api *api = get ? get(SDPA_ABI_VERSION) : NULL;
 *
 * The table is append-only: every public function gets one pointer, in the order the functions
 * were added to the ABI, and a field never moves or changes type within 1.x. A host built
 * against an older header reads only the fields it knows; a host built against a newer header
 * must check that a field lies below struct_size before reading it (SDPA_API_HAS below). ---- */

typedef struct sdpa_api {
    uint32_t abi_version; /* SDPA_ABI_VERSION of the library that filled the table */
    uint32_t struct_size; /* sizeof(sdpa_api) in that library: fields at or past it are absent */
    /* ABI 1.0, in header order */
    const char *(*status_string)(sdpa_status status);
    uint32_t (*abi_version_fn)(void);
    const char *(*version)(void);
    sdpa_status (*dot_f32)(const float *a, const float *b, size_t n, float *result);
    sdpa_status (*scale_f32)(float *y, const float *x, size_t n, float alpha);
    sdpa_status (*softmax_f32)(float *y, const float *x, size_t n, float scale);
    sdpa_status (*softmax_backward_f32)(float *dx, const float *y, const float *dy, size_t n,
                                        float scale);
    sdpa_status (*scores_f32)(float *s, const float *q, const float *k, size_t n_keys, size_t d,
                              size_t k_stride, float scale);
    const char *(*backend)(void);
    sdpa_status (*set_backend)(const char *name);
    int (*backend_supported)(const char *name);
    const char *(*backend_name)(size_t index);
    const char *(*exp_mode)(void);
    sdpa_status (*set_exp_mode)(const char *name);
    /* New functions go here, at the end, and nowhere else. */
} sdpa_api;

/* 1 if the table api (of size api->struct_size) contains the field member. */
#define SDPA_API_HAS(api, member)                                                                  \
    ((api)->struct_size >= offsetof(sdpa_api, member) + sizeof((api)->member))

/* The function table for ABI major version abi_version (pass SDPA_ABI_VERSION), or NULL if this
 * library cannot serve that version. The table is static and const: the call costs nothing,
 * allocates nothing, and always returns the same pointer. */
SDPA_API const sdpa_api *sdpa_get_api(uint32_t abi_version);

#ifdef __cplusplus
}
#endif

#endif /* SDPA_H */
