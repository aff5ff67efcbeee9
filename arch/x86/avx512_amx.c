/* The avx512 backend's AMX add-on (kernels.h: sdpa_bf16_dot_kernels): Q.K from bf16 Q and K with
 * AMX's TDPBF16PS, a 16 x 16 tile of float dots over 16 pairs an instruction, where vdpbf16ps
 * gives 16 dots of one pair. The tiles compute S^T = K Q^T: K's rows are the A tiles as they lie
 * in memory (16 keys x 32 elements, the row stride K's), pack_q's qt is already the B tiles'
 * layout (row p the pair p of 16 queries), and each C tile (16 keys x 16 queries) is stored
 * straight into the key-major st. Compiled alone with -mamx-tile -mamx-bf16 -mavx512bw
 * (meson.build: the avx512 record's add-ons): nothing here may run before src/dispatch.c has
 * found AVX512BW, AMX_BF16 and AMX_TILE and had the OS grant this process the tile
 * state (Linux's ARCH_REQ_XCOMP_PERM). pack_q is the vdpbf16ps add-on's
 * (arch/x86/avx512_bf16_pairs.h). No tile load reads past what it may: a d that is not a
 * multiple of 32 takes its last chunk from zero-padded copies of K's and qt's (tail_chunk), and a
 * key tail of fewer than 16 keys its rows from a zero-padded copy.
 *
 * The tile configuration is per thread and any thread may call: every call loads its own and
 * releases the tiles when done, which also keeps the 8 KB of tile data out of the thread's
 * saved state between calls. TDPBF16PS rounds to nearest whatever MXCSR says, counts subnormal
 * inputs as 0 and flushes subnormal results, as kernels.h allows. */
#include "avx512_bf16_pairs.h"

/* gcc names the flags' macros __AMX_TILE__ and __AMX_BF16__, clang __AMXTILE__ and __AMXBF16__ */
#if !(defined(__AMX_TILE__) || defined(__AMXTILE__)) ||                                            \
    !(defined(__AMX_BF16__) || defined(__AMXBF16__))
#error "arch/x86/avx512_amx.c needs -mamx-tile -mamx-bf16"
#endif

#define TILE_KEYS    16 /* rows of an A and a C tile */
#define TILE_QUERIES 16 /* a C tile row's floats, a B tile row's words (one pair a query) */
#define TILE_PAIRS   16 /* pairs of d a tile step: 64 bytes of an A row, the rows of a B tile */
#define TILE_D       (2 * TILE_PAIRS)

/* Palette 1's configuration: every tile used here is 16 rows of 64 bytes.
 *   C tiles 0-3: tile 0 keys 0-15 x queries 0-15, 1 the same keys x queries 16-31, 2 and 3
 *                keys 16-31 likewise
 *   A tiles 4-5: keys 0-15 and 16-31, one chunk of 32 elements of d
 *   B tiles 6-7: queries 0-15 and 16-31, the same chunk's 16 pairs */
typedef struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

static void tiles_configure(void) {
    _Alignas(64) tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) c.colsb[t] = 64, c.rows[t] = TILE_KEYS;
    _tile_loadconfig(&c);
}

/* The last chunk of d when d is not a multiple of TILE_D, as whole tiles: each key's last
 * d % TILE_D elements, zero-padded to TILE_D (64 bytes a key, an A tile's row; the keys from nk
 * to the next multiple of 16 all zeros), and qt's pairs of that chunk with zero pairs after them
 * (a B tile's 16 rows, which past pack_q's last pair qt need not have). */
typedef struct tail_chunk {
    _Alignas(64) uint16_t k[SDPA_ATTN_MAX_BLOCK_KV * TILE_D];
    _Alignas(64) uint32_t q[TILE_PAIRS * QT_LD];
} tail_chunk;

/* One masked load a key, which reads nothing past the row (a masked-off element never faults) */
static void tail_chunk_fill(tail_chunk *t, const uint32_t *qt, size_t ld_qt, const uint16_t *k,
                            size_t k_stride, size_t nk, size_t d) {
    const size_t d0 = d - d % TILE_D, np = (d % TILE_D + 1) / 2;
    const __mmask32 m = (__mmask32)((1u << (d % TILE_D)) - 1);
    size_t j = 0;
    for (; j < nk; j++)
        _mm512_store_si512(t->k + j * TILE_D, _mm512_maskz_loadu_epi16(m, k + j * k_stride + d0));
    for (; j % TILE_KEYS != 0; j++) _mm512_store_si512(t->k + j * TILE_D, _mm512_setzero_si512());
    for (size_t p = 0; p < TILE_PAIRS; p++)
        for (size_t h = 0; h < QT_LD; h += W)
            _mm512_store_si512(t->q + p * QT_LD + h,
                               p < np ? _mm512_loadu_si512(qt + (d0 / 2 + p) * ld_qt + h)
                                      : _mm512_setzero_si512());
}

/* st[j][i] (unscaled dots) for the 16 keys from k (two_keys: 32) and the queries 0-15
 * (two_queries: 0-31): the first d0 elements (a multiple of TILE_D) from k, k_bytes the bytes
 * from one key to the next, then, where kt is not NULL, one more chunk from the tail copies (kt
 * these keys' rows of tail_chunk's k, qtail its q) */
ALWAYS_INLINE void tiles_dots(float *st, size_t ld_st, const uint32_t *qt, size_t ld_qt,
                              const uint16_t *k, size_t k_bytes, size_t d0, const uint16_t *kt,
                              const uint32_t *qtail, int two_keys, int two_queries) {
    const char *k0 = (const char *)k, *k1 = k0 + TILE_KEYS * k_bytes;
    _tile_zero(0);
    if (two_queries) _tile_zero(1);
    if (two_keys) _tile_zero(2);
    if (two_keys && two_queries) _tile_zero(3);
    for (size_t p0 = 0; p0 < d0; p0 += TILE_D) {
        const uint32_t *b = qt + p0 / 2 * ld_qt;
        _tile_loadd(6, b, ld_qt * sizeof(uint32_t));
        if (two_queries) _tile_loadd(7, b + TILE_QUERIES, ld_qt * sizeof(uint32_t));
        _tile_loadd(4, k0 + p0 * sizeof(uint16_t), k_bytes);
        _tile_dpbf16ps(0, 4, 6);
        if (two_queries) _tile_dpbf16ps(1, 4, 7);
        if (two_keys) {
            _tile_loadd(5, k1 + p0 * sizeof(uint16_t), k_bytes);
            _tile_dpbf16ps(2, 5, 6);
            if (two_queries) _tile_dpbf16ps(3, 5, 7);
        }
    }
    if (kt) {
        const size_t kt_bytes = TILE_D * sizeof(uint16_t);
        _tile_loadd(6, qtail, QT_LD * sizeof(uint32_t));
        if (two_queries) _tile_loadd(7, qtail + TILE_QUERIES, QT_LD * sizeof(uint32_t));
        _tile_loadd(4, kt, kt_bytes);
        _tile_dpbf16ps(0, 4, 6);
        if (two_queries) _tile_dpbf16ps(1, 4, 7);
        if (two_keys) {
            _tile_loadd(5, kt + TILE_KEYS * TILE_D, kt_bytes);
            _tile_dpbf16ps(2, 5, 6);
            if (two_queries) _tile_dpbf16ps(3, 5, 7);
        }
    }
    const size_t st_bytes = ld_st * sizeof(float);
    _tile_stored(0, st, st_bytes);
    if (two_queries) _tile_stored(1, st + TILE_QUERIES, st_bytes);
    if (two_keys) _tile_stored(2, st + TILE_KEYS * ld_st, st_bytes);
    if (two_keys && two_queries) _tile_stored(3, st + TILE_KEYS * ld_st + TILE_QUERIES, st_bytes);
}

/* The unscaled key-major tile of nk keys: 32 keys a step, then 16, then the last nk % 16 keys
 * from a zero-padded copy (a tile load of 16 rows from k would read past its last key), whose C
 * tile goes to the stack and its real rows to st (st need not hold more than nk rows). tail: the
 * last chunk of d, where d is not a multiple of TILE_D; else NULL. */
ALWAYS_INLINE void tiles_keymajor_nv(float *st, size_t ld_st, const uint32_t *qt, size_t ld_qt,
                                     const uint16_t *k, size_t k_stride, size_t nk, size_t d,
                                     const tail_chunk *tail, int two_queries) {
    const size_t k_bytes = k_stride * sizeof(uint16_t), d0 = d - d % TILE_D;
    const uint32_t *qtail = tail ? tail->q : NULL;
    size_t j = 0;
    for (; j + 2 * TILE_KEYS <= nk; j += 2 * TILE_KEYS)
        tiles_dots(st + j * ld_st, ld_st, qt, ld_qt, k + j * k_stride, k_bytes, d0,
                   tail ? tail->k + j * TILE_D : NULL, qtail, 1, two_queries);
    if (j + TILE_KEYS <= nk) {
        tiles_dots(st + j * ld_st, ld_st, qt, ld_qt, k + j * k_stride, k_bytes, d0,
                   tail ? tail->k + j * TILE_D : NULL, qtail, 0, two_queries);
        j += TILE_KEYS;
    }
    if (j < nk) {
        _Alignas(64) uint16_t kpad[TILE_KEYS * SDPA_ATTN_PACK_MAX_D];
        _Alignas(64) float ctail[TILE_KEYS * QT_LD];
        memset(kpad, 0, TILE_KEYS * d0 * sizeof(uint16_t));
        for (size_t t = 0; t < nk - j; t++)
            memcpy(kpad + t * d0, k + (j + t) * k_stride, d0 * sizeof(uint16_t));
        tiles_dots(ctail, QT_LD, qt, ld_qt, kpad, d0 * sizeof(uint16_t), d0,
                   tail ? tail->k + j * TILE_D : NULL, qtail, 0, two_queries);
        for (size_t t = 0; t < nk - j; t++)
            memcpy(st + (j + t) * ld_st, ctail + t * QT_LD, QT_LD * sizeof(float));
    }
}

/* The scaled key-major tile, and where tile_max is not NULL its max */
ALWAYS_INLINE void keymajor_tile(float *st, size_t ld_st, float *tile_max, const uint32_t *qt,
                                 size_t ld_qt, size_t nq, const uint16_t *k, size_t k_stride,
                                 size_t nk, size_t d, float scale) {
    tail_chunk tail_copy, *tail = NULL;
    if (d % TILE_D != 0) {
        tail = &tail_copy;
        tail_chunk_fill(tail, qt, ld_qt, k, k_stride, nk, d);
    }
    tiles_configure();
    if (nq > TILE_QUERIES)
        tiles_keymajor_nv(st, ld_st, qt, ld_qt, k, k_stride, nk, d, tail, 1);
    else
        tiles_keymajor_nv(st, ld_st, qt, ld_qt, k, k_stride, nk, d, tail, 0);
    _tile_release();
    const vf vscale = vf_set1(scale);
    keymajor_scale_max(tile_max, st, ld_st, nq, nk, &vscale);
}

static void scores_packed_amx(float *s, size_t ld_s, const uint32_t *qt, size_t ld_qt, size_t nq,
                              const uint16_t *k, size_t k_stride, size_t nk, size_t d,
                              float scale) {
    _Alignas(64) float st[SDPA_ATTN_MAX_BLOCK_KV * QT_LD];
    keymajor_tile(st, QT_LD, NULL, qt, ld_qt, nq, k, k_stride, nk, d, scale);
    keymajor_to_rows(s, ld_s, st, QT_LD, nq, nk);
}

static void scores_max_amx(float *st, size_t ld_st, float *tile_max, const uint32_t *qt,
                           size_t ld_qt, size_t nq, const uint16_t *k, size_t k_stride, size_t nk,
                           size_t d_k, float scale) {
    keymajor_tile(st, ld_st, tile_max, qt, ld_qt, nq, k, k_stride, nk, d_k, scale);
}

const sdpa_bf16_dot_kernels sdpa_bf16_dot_avx512_amx = {
    .pack_q = pack_q_avx512_bf16,
    .scores_packed = scores_packed_amx,
    .scores_max = scores_max_amx,
};
