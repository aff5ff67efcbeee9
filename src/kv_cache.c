/* The paged K/V cache: the checks of an sdpa_kv_cache and its pools, and sdpa_kv_cache_store,
 * which writes new tokens' k and v into their slots through the backend's widen and narrow
 * kernels (arch/kernels.h). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attention_problem.h"
#include "dispatch.h"
#include "error.h"
#include "fp8.h"
#include "paged.h"
#include "sdpa.h"
#include "sizes.h"

/* the whole sdpa_kv_cache of ABI 1.4 */
#define CACHE_V1_SIZE (offsetof(sdpa_kv_cache, v_scale) + sizeof(float))

/* one 16-bit type to the other goes through float in chunks this long, on the stack */
#define CHUNK 1024

const char *paged_type_name(uint32_t type) {
    static const char *const NAMES[] = {"f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2"};
    return type <= SDPA_FP8_E5M2 ? NAMES[type] : "unknown";
}

sdpa_status paged_cache_check(const sdpa_kv_cache *c) {
    if (!c) return sdpa_fail(SDPA_ERR_NULL, "cache is NULL");
    if (c->struct_size < CACHE_V1_SIZE)
        return sdpa_fail(SDPA_ERR_ARG,
                         "cache->struct_size (%u) is smaller than sdpa_kv_cache (%zu)",
                         (unsigned)c->struct_size, (size_t)CACHE_V1_SIZE);
    if (c->kv_type > SDPA_FP8_E5M2)
        return sdpa_fail(SDPA_ERR_ARG, "cache->kv_type (%u) is not an sdpa_dtype (0 to 4)",
                         (unsigned)c->kv_type);
    if (c->kv_type > SDPA_BF16 && (!isfinite(c->k_scale) || !isfinite(c->v_scale)))
        return sdpa_fail(SDPA_ERR_ARG, "cache->%s (%g) is not finite",
                         isfinite(c->k_scale) ? "v_scale" : "k_scale",
                         (double)(isfinite(c->k_scale) ? c->v_scale : c->k_scale));
    /* a scale applies to 8-bit types only: any other value would be silently ignored */
    const int k_bad = c->k_scale != 0.0f && c->k_scale != 1.0f;
    if (c->kv_type <= SDPA_BF16 && (k_bad || (c->v_scale != 0.0f && c->v_scale != 1.0f)))
        return sdpa_fail(SDPA_ERR_ARG, "cache->%s (%g) is not 0 or 1, as a %s cache needs",
                         k_bad ? "k_scale" : "v_scale", (double)(k_bad ? c->k_scale : c->v_scale),
                         paged_type_name(c->kv_type));
    if (!c->heads_kv) return sdpa_fail(SDPA_ERR_SIZE, "cache->heads_kv is 0");
    return SDPA_OK;
}

/* one pool: its token stride and its extent */
static sdpa_status pool_check(const sdpa_kv_cache *c, const char *name, const size_t stride[3],
                              size_t row, const char *row_name) {
    if (!row) return sdpa_fail(SDPA_ERR_SIZE, "cache->%s is 0", row_name);
    if (c->block_size > 1 && stride[2] < row)
        return sdpa_fail(SDPA_ERR_SIZE,
                         "cache->%c_stride[2] (%zu), the token stride, is smaller than %s (%zu)",
                         name[0], stride[2], row_name, row);
    if (c->num_blocks && !sdpa_view_fits_sized(stride, c->num_blocks, c->heads_kv, c->block_size,
                                               row, sdpa_type_size(c->kv_type)))
        return sdpa_fail(SDPA_ERR_SIZE,
                         "%s's extent (%zu blocks of %zu heads of %zu tokens) is past PTRDIFF_MAX "
                         "bytes",
                         name, c->num_blocks, c->heads_kv, c->block_size);
    return SDPA_OK;
}

sdpa_status paged_pools_check(const sdpa_kv_cache *c, const void *k_pool, const void *v_pool) {
    if (!k_pool || !v_pool)
        return sdpa_fail(SDPA_ERR_NULL, "%s is NULL", k_pool ? "v_pool" : "k_pool");
    if (!c->block_size) return sdpa_fail(SDPA_ERR_SIZE, "cache->block_size is 0");
    sdpa_status st = pool_check(c, "k_pool", c->k_stride, c->d_k, "d_k");
    return st != SDPA_OK ? st : pool_check(c, "v_pool", c->v_stride, c->d_v, "d_v");
}

size_t paged_pool_bytes(const sdpa_kv_cache *c, int values) {
    if (!c->num_blocks) return 0;
    const size_t *s = values ? c->v_stride : c->k_stride;
    const size_t end = (c->num_blocks - 1) * s[0] + (c->heads_kv - 1) * s[1] +
                       (c->block_size - 1) * s[2] + (values ? c->d_v : c->d_k);
    return end * sdpa_type_size(c->kv_type);
}

/* A source, [n tokens][heads_kv][row] of src_type: its strides and extent; its bytes to *bytes. */
static sdpa_status source_check(const char *name, const size_t stride[2], size_t n, size_t heads,
                                size_t row, size_t size, size_t *bytes) {
    const size_t s3[3] = {stride[0], stride[1], 0};
    if (!sdpa_view_fits_sized(s3, n, heads, 1, row, size))
        return sdpa_fail(SDPA_ERR_SIZE, "%s's extent (%zu tokens) is past PTRDIFF_MAX bytes", name,
                         n);
    *bytes = ((n - 1) * stride[0] + (heads - 1) * stride[1] + row) * size;
    return SDPA_OK;
}

/* everything sdpa_kv_cache_store reads, for n > 0 */
static sdpa_status store_check(const sdpa_kv_cache *c, void *k_pool, void *v_pool,
                               const int64_t *slots, size_t n, const void *k, const void *v,
                               uint32_t src_type, const size_t *k_src_stride,
                               const size_t *v_src_stride) {
    const char *missing = !slots          ? "slots"
                          : !k            ? "k"
                          : !v            ? "v"
                          : !k_src_stride ? "k_src_stride"
                          : !v_src_stride ? "v_src_stride"
                                          : NULL;
    if (missing) return sdpa_fail(SDPA_ERR_NULL, "%s is NULL with n = %zu", missing, n);
    if (src_type > SDPA_BF16)
        return sdpa_fail(SDPA_ERR_ARG, "src_type (%u) is not an sdpa_dtype (0 to 2)",
                         (unsigned)src_type);
    sdpa_status st = paged_pools_check(c, k_pool, v_pool);
    if (st != SDPA_OK) return st;
    if (n > (size_t)PTRDIFF_MAX / sizeof *slots)
        return sdpa_fail(SDPA_ERR_SIZE, "n (%zu) slots are past PTRDIFF_MAX bytes", n);
    for (size_t t = 0; t < n; t++)
        if (slots[t] < 0 || (uint64_t)slots[t] / c->block_size >= c->num_blocks)
            return sdpa_fail(SDPA_ERR_ARG,
                             "slots[%zu] (%lld) is outside [0, num_blocks * block_size) "
                             "(%zu blocks of %zu)",
                             t, (long long)slots[t], c->num_blocks, c->block_size);
    const size_t size = sdpa_type_size(src_type);
    size_t k_bytes, v_bytes;
    st = source_check("k", k_src_stride, n, c->heads_kv, c->d_k, size, &k_bytes);
    if (st == SDPA_OK) st = source_check("v", v_src_stride, n, c->heads_kv, c->d_v, size, &v_bytes);
    if (st != SDPA_OK) return st;
    const size_t kp = paged_pool_bytes(c, 0), vp = paged_pool_bytes(c, 1);
    const char *meet = sdpa_bytes_overlap(k, k_bytes, k_pool, kp)   ? "k meets k_pool"
                       : sdpa_bytes_overlap(k, k_bytes, v_pool, vp) ? "k meets v_pool"
                       : sdpa_bytes_overlap(v, v_bytes, k_pool, kp) ? "v meets k_pool"
                       : sdpa_bytes_overlap(v, v_bytes, v_pool, vp) ? "v meets v_pool"
                       : sdpa_bytes_overlap(slots, n * sizeof *slots, k_pool, kp) ||
                               sdpa_bytes_overlap(slots, n * sizeof *slots, v_pool, vp)
                           ? "slots meets a pool"
                           : NULL;
    return meet ? sdpa_fail(SDPA_ERR_SIZE, "%s", meet) : SDPA_OK;
}

/* dst[0..n) of an 8-bit dst_type = src[0..n) (f32 or 16-bit) divided by scale (0: 1) in float,
   then rounded to nearest even (fp8.h: e4m3 saturates, e5m2 goes to inf). */
static void quantize_row(const sdpa_kernels *k, uint8_t *dst, uint32_t dst_type, const void *src,
                         uint32_t src_type, size_t n, float scale) {
    float chunk[CHUNK];
    for (size_t i = 0; i < n; i += CHUNK) {
        const size_t m = n - i < CHUNK ? n - i : CHUNK;
        const char *s = (const char *)src + i * sdpa_type_size(src_type);
        if (src_type == SDPA_F32)
            memcpy(chunk, s, m * sizeof(float));
        else
            k->widen[src_type](chunk, s, m);
        if (scale != 0.0f && scale != 1.0f)
            for (size_t j = 0; j < m; j++) chunk[j] /= scale;
        sdpa_fp8_narrow(dst + i, chunk, m, dst_type);
    }
}

/* dst[0..n) of dst_type = src[0..n) of src_type: bit for bit for one type, else as
   sdpa_convert rounds (16-bit to the other 16-bit exactly to float first, then rounded once);
   an 8-bit dst_type through quantize_row with the cache's scale. */
static void convert_row(const sdpa_kernels *k, void *dst, uint32_t dst_type, const void *src,
                        uint32_t src_type, size_t n, float scale) {
    if (dst_type > SDPA_BF16) {
        quantize_row(k, dst, dst_type, src, src_type, n, scale);
    } else if (dst_type == src_type) {
        memcpy(dst, src, n * sdpa_type_size(dst_type));
    } else if (src_type == SDPA_F32) {
        k->narrow[dst_type](dst, src, n);
    } else if (dst_type == SDPA_F32) {
        k->widen[src_type](dst, src, n);
    } else {
        float chunk[CHUNK];
        for (size_t i = 0; i < n; i += CHUNK) {
            const size_t m = n - i < CHUNK ? n - i : CHUNK;
            k->widen[src_type](chunk, (const uint16_t *)src + i, m);
            k->narrow[dst_type]((uint16_t *)dst + i, chunk, m);
        }
    }
}

SDPA_API sdpa_status sdpa_kv_cache_store(const sdpa_kv_cache *cache, void *k_pool, void *v_pool,
                                         const int64_t *slots, size_t n, const void *k,
                                         const void *v, uint32_t src_type,
                                         const size_t k_src_stride[2],
                                         const size_t v_src_stride[2]) {
    sdpa_status st = paged_cache_check(cache);
    if (st != SDPA_OK || n == 0) return st;
    st = store_check(cache, k_pool, v_pool, slots, n, k, v, src_type, k_src_stride, v_src_stride);
    if (st != SDPA_OK) return st;
    const sdpa_kernels *kernels = sdpa_kernels_now();
    const size_t src_size = sdpa_type_size(src_type), kv_size = sdpa_type_size(cache->kv_type);
    const size_t *ks = cache->k_stride, *vs = cache->v_stride;
    for (size_t t = 0; t < n; t++) {
        const size_t block = (size_t)slots[t] / cache->block_size;
        const size_t at = (size_t)slots[t] % cache->block_size;
        for (size_t h = 0; h < cache->heads_kv; h++) {
            const size_t k_dst = block * ks[0] + h * ks[1] + at * ks[2];
            const size_t v_dst = block * vs[0] + h * vs[1] + at * vs[2];
            const size_t k_src = t * k_src_stride[0] + h * k_src_stride[1];
            const size_t v_src = t * v_src_stride[0] + h * v_src_stride[1];
            convert_row(kernels, (char *)k_pool + k_dst * kv_size, cache->kv_type,
                        (const char *)k + k_src * src_size, src_type, cache->d_k, cache->k_scale);
            convert_row(kernels, (char *)v_pool + v_dst * kv_size, cache->kv_type,
                        (const char *)v + v_src * src_size, src_type, cache->d_v, cache->v_scale);
        }
    }
    return SDPA_OK;
}
