/* The plugin entry point: one const table of every public function, for hosts that dlopen the
 * library and look up a single symbol. Compiled for the baseline ISA; it runs no code of its own
 * (the table is filled by the static linker, so no constructor is needed). */
#include <stddef.h>

#include "sdpa.h"

/* Append-only: a new public function gets a new field at the end of sdpa_api (include/sdpa.h)
 * and one line at the end of this initializer. Never reorder, remove or retype a field. */
static const sdpa_api API_V1 = {
    .abi_version = SDPA_ABI_VERSION,
    .struct_size = sizeof(sdpa_api),
    /* ABI 1.0 */
    .status_string = sdpa_status_string,
    .abi_version_fn = sdpa_abi_version,
    .version = sdpa_version,
    .dot_f32 = sdpa_dot_f32,
    .scale_f32 = sdpa_scale_f32,
    .softmax_f32 = sdpa_softmax_f32,
    .softmax_backward_f32 = sdpa_softmax_backward_f32,
    .scores_f32 = sdpa_scores_f32,
    .backend = sdpa_backend,
    .set_backend = sdpa_set_backend,
    .backend_supported = sdpa_backend_supported,
    .backend_name = sdpa_backend_name,
    .exp_mode = sdpa_exp_mode,
    .set_exp_mode = sdpa_set_exp_mode,
    .attention_f32 = sdpa_attention_f32,
    .mha_f32 = sdpa_mha_f32,
    .mha_desc_dense = sdpa_mha_desc_dense,
    .mha_desc_bshd = sdpa_mha_desc_bshd,
    .mha_desc_set_mask = sdpa_mha_desc_set_mask,
    /* ABI 1.1 */
    .mha = sdpa_mha,
    .convert = sdpa_convert,
    .set_num_threads = sdpa_set_num_threads,
    .num_threads = sdpa_num_threads,
    .set_parallel_for = sdpa_set_parallel_for,
    .attention_merge_f32 = sdpa_attention_merge_f32,
    /* ABI 1.2 */
    .mha_backward_f32 = sdpa_mha_backward_f32,
    /* ABI 1.3 */
    .last_error_detail = sdpa_last_error_detail,
    .info_count = sdpa_info_count,
    .info = sdpa_info,
    /* ABI 1.4 */
    .attention_paged = sdpa_attention_paged,
    .kv_cache_store = sdpa_kv_cache_store,
    .mha_desc_set_mods = sdpa_mha_desc_set_mods,
};

/* Major version 1 is the only one this library serves; every 1.x table is a prefix-compatible
 * extension of the previous one, so there is nothing to choose between. */
SDPA_API const sdpa_api *sdpa_get_api(uint32_t abi_version) {
    return abi_version == SDPA_ABI_VERSION ? &API_V1 : NULL;
}
