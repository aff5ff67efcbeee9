/* sdpa_convert: arrays between float and the 16-bit types, through the backend's widen and
 * narrow kernels (arch/kernels.h), and the 8-bit ones, through fp8.c. */
#include <stdint.h>
#include <string.h>

#include "attention_problem.h"
#include "dispatch.h"
#include "error.h"
#include "fp8.h"
#include "sdpa.h"
#include "sizes.h"

/* The kernel tables index widen and narrow by the public type number: the two enums must agree. */
_Static_assert(SDPA_TYPE_F32 == (int)SDPA_F32, "sdpa_dtype and enum sdpa_type disagree on f32");
_Static_assert(SDPA_TYPE_F16 == (int)SDPA_F16, "sdpa_dtype and enum sdpa_type disagree on f16");
_Static_assert(SDPA_TYPE_BF16 == (int)SDPA_BF16, "sdpa_dtype and enum sdpa_type disagree on bf16");
_Static_assert(SDPA_TYPES == (int)SDPA_FP8_E4M3,
               "a public type the kernel tables do not number, other than the 8-bit ones (fp8.h)");

/* f16 <-> bf16 go through float in chunks this long, on the stack */
#define CHUNK 1024

/* A copy to the same type with every signalling NaN quieted, as a conversion quiets it (sdpa.h):
 * in all three formats the quiet bit is the mantissa's top bit, just below the exponent. One
 * element at a time through memcpy, since the pointers need no alignment; dst == src works. */
static void copy_quieted(void *dst, const void *src, size_t n, sdpa_dtype type) {
    if (type == SDPA_F32) {
        for (size_t i = 0; i < n; i++) {
            uint32_t x;
            memcpy(&x, (const char *)src + 4 * i, 4);
            if ((x & 0x7f800000u) == 0x7f800000u && (x & 0x007fffffu)) x |= 0x00400000u;
            memcpy((char *)dst + 4 * i, &x, 4);
        }
        return;
    }
    const uint16_t exponent = type == SDPA_F16 ? 0x7c00u : 0x7f80u;
    const uint16_t quiet = type == SDPA_F16 ? 0x0200u : 0x0040u;
    for (size_t i = 0; i < n; i++) {
        uint16_t x;
        memcpy(&x, (const char *)src + 2 * i, 2);
        if ((x & exponent) == exponent && (x & (uint16_t)(2 * quiet - 1)))
            x = (uint16_t)(x | quiet);
        memcpy((char *)dst + 2 * i, &x, 2);
    }
}

/* m elements of type t as floats in y, exactly */
static void to_floats(const sdpa_kernels *k, float *y, const void *x, sdpa_dtype t, size_t m) {
    if (sdpa_type_is_fp8(t))
        sdpa_fp8_widen(y, x, m, t);
    else
        t == SDPA_F32 ? (void)memcpy(y, x, m * sizeof(float)) : k->widen[t](y, x, m);
}

/* m floats x as type t in y, rounded to nearest even */
static void from_floats(const sdpa_kernels *k, void *y, const float *x, sdpa_dtype t, size_t m) {
    if (sdpa_type_is_fp8(t))
        sdpa_fp8_narrow(y, x, m, t);
    else
        t == SDPA_F32 ? (void)memcpy(y, x, m * sizeof(float)) : k->narrow[t](y, x, m);
}

/* Conversions with an 8-bit side, through float in chunks: widening is exact, so each element
   is rounded once (an e5m2 NaN comes out quiet, as from the other types). dst == src works. */
static void convert_fp8(const sdpa_kernels *k, void *dst, sdpa_dtype dst_type, const void *src,
                        sdpa_dtype src_type, size_t n) {
    float chunk[CHUNK];
    const size_t dsize = sdpa_type_size(dst_type), ssize = sdpa_type_size(src_type);
    for (size_t i = 0; i < n; i += CHUNK) {
        const size_t m = n - i < CHUNK ? n - i : CHUNK;
        to_floats(k, chunk, (const char *)src + i * ssize, src_type, m);
        from_floats(k, (char *)dst + i * dsize, chunk, dst_type, m);
    }
}

SDPA_API sdpa_status sdpa_convert(void *dst, sdpa_dtype dst_type, const void *src,
                                  sdpa_dtype src_type, size_t n) {
    if ((uint32_t)dst_type > SDPA_FP8_E5M2)
        return sdpa_fail(SDPA_ERR_ARG, "dst_type (%u) is not an sdpa_dtype (0 to 4)",
                         (unsigned)dst_type);
    if ((uint32_t)src_type > SDPA_FP8_E5M2)
        return sdpa_fail(SDPA_ERR_ARG, "src_type (%u) is not an sdpa_dtype (0 to 4)",
                         (unsigned)src_type);
    if (n == 0) return SDPA_OK;
    if (!dst || !src)
        return sdpa_fail(SDPA_ERR_NULL, "%s is NULL with n = %zu", dst ? "src" : "dst", n);
    const size_t dst_size = sdpa_type_size(dst_type), src_size = sdpa_type_size(src_type);
    if (n > (size_t)PTRDIFF_MAX / (dst_size > src_size ? dst_size : src_size))
        return sdpa_fail(SDPA_ERR_SIZE, "n (%zu) elements are past PTRDIFF_MAX bytes", n);
    const int in_place = dst == src && dst_size == src_size;
    if (!in_place && sdpa_bytes_overlap(dst, n * dst_size, src, n * src_size))
        return sdpa_fail(SDPA_ERR_SIZE, "dst and src overlap, and are not the same array of "
                                        "elements of one size");

    const sdpa_kernels *k = sdpa_kernels_now();
    if (sdpa_type_is_fp8(dst_type) || sdpa_type_is_fp8(src_type)) {
        convert_fp8(k, dst, dst_type, src, src_type, n);
    } else if (dst_type == src_type) {
        copy_quieted(dst, src, n, dst_type);
    } else if (src_type == SDPA_F32) {
        k->narrow[dst_type](dst, src, n);
    } else if (dst_type == SDPA_F32) {
        k->widen[src_type](dst, src, n);
    } else { /* one 16-bit type to the other: exact to float, then rounded once */
        float chunk[CHUNK];
        for (size_t i = 0; i < n; i += CHUNK) {
            const size_t m = n - i < CHUNK ? n - i : CHUNK;
            k->widen[src_type](chunk, (const uint16_t *)src + i, m);
            k->narrow[dst_type]((uint16_t *)dst + i, chunk, m);
        }
    }
    return SDPA_OK;
}
