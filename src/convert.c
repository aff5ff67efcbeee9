/* sdpa_convert: arrays between float and the 16-bit types, through the backend's widen and
 * narrow kernels (arch/kernels.h). */
#include <stdint.h>
#include <string.h>

#include "attention_problem.h"
#include "dispatch.h"
#include "error.h"
#include "sdpa.h"
#include "sizes.h"

/* f16 <-> bf16 go through float in chunks this long, on the stack */
#define CHUNK 1024

SDPA_API sdpa_status sdpa_convert(void *dst, sdpa_dtype dst_type, const void *src,
                                  sdpa_dtype src_type, size_t n) {
    if ((uint32_t)dst_type > SDPA_BF16)
        return sdpa_fail(SDPA_ERR_ARG, "dst_type (%u) is not an sdpa_dtype (0 to 2)",
                         (unsigned)dst_type);
    if ((uint32_t)src_type > SDPA_BF16)
        return sdpa_fail(SDPA_ERR_ARG, "src_type (%u) is not an sdpa_dtype (0 to 2)",
                         (unsigned)src_type);
    if (n == 0) return SDPA_OK;
    if (!dst || !src)
        return sdpa_fail(SDPA_ERR_NULL, "%s is NULL with n = %zu", dst ? "src" : "dst", n);
    const size_t dst_size = sdpa_type_size(dst_type), src_size = sdpa_type_size(src_type);
    if (n > (size_t)PTRDIFF_MAX / (dst_size > src_size ? dst_size : src_size))
        return sdpa_fail(SDPA_ERR_SIZE, "n (%zu) elements are past PTRDIFF_MAX bytes", n);
    const int in_place = dst == src && dst_size == src_size;
    if (!in_place && sdpa_bytes_overlap(dst, n * dst_size, src, n * src_size))
        return sdpa_fail(SDPA_ERR_ARG, "dst and src overlap, and are not the same array of "
                                       "elements of one size");

    const sdpa_kernels *k = sdpa_kernels_now();
    if (dst_type == src_type) {
        if (!in_place) memcpy(dst, src, n * dst_size);
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
