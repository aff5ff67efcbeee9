/* Internal: the checks the paged call (paged.c) and the cache store (kv_cache.c) share, on an
 * sdpa_kv_cache and its pools. */
#ifndef SDPA_SRC_PAGED_H
#define SDPA_SRC_PAGED_H

#include <stddef.h>

#include "sdpa.h"

/* The cache's own fields, whatever the call touches: cache not NULL, its struct_size, kv_type,
 * scales and heads_kv. */
sdpa_status paged_cache_check(const sdpa_kv_cache *cache);

/* The pools of a call that reads or writes keys: not NULL, block_size and d_k, d_v not 0, token
 * strides at least their rows, extents within PTRDIFF_MAX bytes. */
sdpa_status paged_pools_check(const sdpa_kv_cache *cache, const void *k_pool, const void *v_pool);

/* Bytes from a checked pool's first element to one past its last; 0 without blocks. */
size_t paged_pool_bytes(const sdpa_kv_cache *cache, int values);

/* The name of a valid sdpa_dtype, for messages. */
const char *paged_type_name(uint32_t type);

#endif
