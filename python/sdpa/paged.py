"""The paged call (sdpa_attention_paged): a batch of sequences whose keys and values sit in the
blocks of a shared pool, as a serving engine keeps its K/V cache.

Reached through the library's sdpa_get_api table like every other function: its two ABI 1.4
fields are read from the table the package loaded, and a library without them raises
NotImplementedError at the first call.
"""

import ctypes
import math

import numpy as np

from . import _core, _lib

_size = ctypes.c_size_t
_vp = ctypes.c_void_p


class KvCache(ctypes.Structure):
    """sdpa_kv_cache, as include/sdpa.h declares it."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("kv_type", ctypes.c_uint32),
        ("num_blocks", _size),
        ("block_size", _size),
        ("heads_kv", _size),
        ("d_k", _size),
        ("d_v", _size),
        ("k_stride", _size * 3),
        ("v_stride", _size * 3),
        ("block_table", _vp),
        ("block_table_stride", _size),
        ("k_scale", ctypes.c_float),
        ("v_scale", ctypes.c_float),
    ]


class Batch(ctypes.Structure):
    """sdpa_batch, as include/sdpa.h declares it."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("num_seqs", _size),
        ("heads_q", _size),
        ("q_start", _vp),
        ("kv_len", _vp),
        ("scale", ctypes.c_float),
        ("q_type", ctypes.c_uint32),
        ("out_type", ctypes.c_uint32),
        ("q_stride", _size * 2),
        ("out_stride", _size * 2),
        ("lse", _vp),
        ("lse_stride", _size * 2),
        ("mods", _vp),
    ]


# sdpa_api: abi_version and struct_size, then the 29 function pointers of ABI 1.0 to 1.3, then
# attention_paged (ABI 1.4)
_PAGED_OFFSET = 8 + 29 * ctypes.sizeof(_vp)
_paged_fn = None


def _attention_paged():
    """The table's sdpa_attention_paged, or NotImplementedError for a library without it."""
    global _paged_fn
    if _paged_fn is None:
        api = _core.api
        if api.struct_size < _PAGED_OFFSET + ctypes.sizeof(_vp):
            raise NotImplementedError(
                f"sdpa_attention_paged is not in the loaded library ({api.path}, version "
                f"{api.version().decode()}): it needs libsdpa.so.1 of ABI 1.4 or later")
        address = _vp.from_address(ctypes.addressof(api._table) + _PAGED_OFFSET).value
        _paged_fn = ctypes.CFUNCTYPE(ctypes.c_int, _vp, _vp, _vp, _vp, _vp, _vp)(address)
    return _paged_fn


_NP_TYPES = {np.dtype(np.float32): _lib.F32, np.dtype(np.float16): _lib.F16}


def _float_view(x, name, ndim, torch):
    """(x or a contiguous copy, its data pointer, its strides in elements, its sdpa_dtype)."""
    if torch is not None:
        if not _core.is_tensor(x):
            raise TypeError(f"{name}: expected a torch tensor, as q is, got {type(x).__name__}")
        _core.check_strided(x, name)
        t = _core._torch_types.get(x.dtype)
        if t is None:
            raise TypeError(f"{name}: dtype {x.dtype} is not float32, float16 or bfloat16")
        if not x.is_cpu:
            raise ValueError(f"{name}: tensor on {x.device}; sdpa runs on the CPU")
        if x.dim() != ndim:
            raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(x.shape)}")
        if (x.shape[-1] > 1 and x.stride(-1) != 1) or min(x.stride(), default=0) < 0:
            x = x.contiguous()
        return x, x.data_ptr(), tuple(x.stride()), t
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name}: expected a NumPy array, as q is, got {type(x).__name__}")
    t = _NP_TYPES.get(x.dtype)
    if t is None:
        raise TypeError(f"{name}: dtype {x.dtype} is not float32 or float16")
    if x.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {x.shape}")
    st = x.strides
    if ((x.shape[-1] > 1 and st[-1] != x.itemsize) or min(st, default=0) < 0
            or not x.flags.aligned or any(s % x.itemsize for s in st)):
        x = np.ascontiguousarray(x)
    return x, x.ctypes.data, tuple(s // x.itemsize for s in x.strides), t


def _int32(x, name, ndim):
    """x as a C-contiguous int32 NumPy array (torch tensors included), ndim dimensions."""
    if _core.is_tensor(x):
        x = x.detach().cpu().numpy()
    a = np.ascontiguousarray(np.asarray(x), dtype=np.int32)
    if a.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {a.shape}")
    if not np.array_equal(a, np.asarray(x)):
        raise ValueError(f"{name}: values do not fit in int32")
    return a


def attention_paged(q, k_pool, v_pool, block_table, q_start, kv_len, causal=False, scale=None,
                    return_lse=False, window=None, softcap=None, sinks=None, alibi_slopes=None):
    """Attention of a batch of sequences over a paged K/V cache, in one call.

    q: (tokens, heads_q, d_k), the batch's new tokens packed one sequence after the other.
    k_pool, v_pool: (num_blocks, heads_kv, block_size, d_k or d_v), the blocks of the cache
        (vLLM's layout); heads_kv divides heads_q (GQA).
    block_table: (num_seqs, max_blocks) integers: sequence s's n-th block. Entries past a
        sequence's keys are never read.
    q_start: (num_seqs + 1,), non-decreasing from 0: sequence s owns rows q_start[s] to
        q_start[s+1]-1 of q (its newest tokens). kv_len: (num_seqs,) keys of each sequence in
        the cache, its new tokens included.
    causal: bottom-right within each sequence (then kv_len[s] >= its rows).
    scale: None for 1/sqrt(d_k), else a finite float.
    window, softcap, sinks, alibi_slopes: the score modifiers of ``sdpa.attention``, within each
        sequence (its query row i at key position i + kv_len[s] - its rows). No segments: the
        sequences are the segments. No autograd here.
    All NumPy arrays (float32 or float16) or all CPU torch tensors (float32, float16 or
    bfloat16) for q and the pools, the pools of one dtype; integers as arrays, lists or tensors.

    Returns out, (tokens, heads_q, d_v) of q's dtype and kind; with return_lse also lse,
    float32 (tokens, heads_q), -inf for a row that sees no key. ValueError with the library's
    detail for an invalid batch (nothing is computed then)."""
    torch = _core.torch_module() if _core.is_tensor(q) else None
    q, q_ptr, q_st, q_type = _float_view(q, "q", 3, torch)
    k_pool, k_ptr, k_st, k_type = _float_view(k_pool, "k_pool", 4, torch)
    v_pool, v_ptr, v_st, v_type = _float_view(v_pool, "v_pool", 4, torch)
    if k_type != v_type:
        raise TypeError("k_pool and v_pool must share one dtype")
    if tuple(k_pool.shape[:3]) != tuple(v_pool.shape[:3]):
        raise ValueError(f"k_pool {tuple(k_pool.shape)} and v_pool {tuple(v_pool.shape)} differ "
                         "in blocks, heads or block size")
    table = _int32(block_table, "block_table", 2)
    starts, lens = _int32(q_start, "q_start", 1), _int32(kv_len, "kv_len", 1)
    num_seqs = lens.shape[0]
    if starts.shape[0] != num_seqs + 1 or table.shape[0] != num_seqs:
        raise ValueError(f"q_start has {starts.shape[0]} entries and block_table "
                         f"{table.shape[0]} rows; kv_len's {num_seqs} sequences need "
                         f"{num_seqs + 1} and {num_seqs}")
    tokens, heads_q, d_k = q.shape
    num_blocks, heads_kv, block_size, d_v = v_pool.shape
    if k_pool.shape[3] != d_k:
        raise ValueError(f"k_pool's d ({k_pool.shape[3]}) is not q's ({d_k})")
    if num_seqs and starts[-1] != tokens:
        raise ValueError(f"q_start ends at {starts[-1]}, but q has {tokens} tokens")
    if scale is not None and not math.isfinite(scale):
        raise ValueError(f"scale ({scale}) is not finite")

    if torch is not None:
        out = torch.empty((tokens, heads_q, d_v), dtype=q.dtype)
        out_ptr = out.data_ptr()
    else:
        out = np.empty((tokens, heads_q, d_v), dtype=q.dtype)
        out_ptr = out.ctypes.data
    lse = np.empty((tokens, heads_q), dtype=np.float32) if return_lse else None
    cache = KvCache(struct_size=ctypes.sizeof(KvCache), kv_type=k_type, num_blocks=num_blocks,
                    block_size=block_size, heads_kv=heads_kv, d_k=d_k, d_v=d_v,
                    block_table=table.ctypes.data, block_table_stride=table.shape[1])
    cache.k_stride[:] = k_st[:3]
    cache.v_stride[:] = v_st[:3]
    batch = Batch(struct_size=ctypes.sizeof(Batch), flags=_lib.CAUSAL if causal else 0,
                  num_seqs=num_seqs, heads_q=heads_q, q_start=starts.ctypes.data,
                  kv_len=lens.ctypes.data,
                  scale=_lib.DEFAULT_SCALE if scale is None else float(scale),
                  q_type=q_type, out_type=q_type, lse=lse.ctypes.data if return_lse else None)
    mods = (window, softcap, sinks, alibi_slopes, None)
    if any(x is not None for x in mods):
        sm, keep = _core.score_mods(mods, heads_q)
        batch.mods = ctypes.addressof(sm)
    batch.q_stride[:] = q_st[:2]
    batch.out_stride[:] = (heads_q * d_v, d_v)
    if return_lse:
        batch.lse_stride[:] = (heads_q, 1)
    status = _attention_paged()(ctypes.addressof(batch), ctypes.addressof(cache), out_ptr,
                                q_ptr, k_ptr, v_ptr)
    _lib.check(_core.api, status, "sdpa.attention_paged")
    if return_lse and torch is not None:
        lse = torch.from_numpy(lse)
    return (out, lse) if return_lse else out


__all__ = ["attention_paged"]
