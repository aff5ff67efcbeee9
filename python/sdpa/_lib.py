"""Loading libsdpa.so.1 and its function table (``sdpa_get_api``) with ctypes.

The library is found, in this order, at ``$SDPA_LIBRARY``, as ``libsdpa.so.1`` in this package's
directory (where a wheel puts it), or by the dynamic loader's search (``meson install`` puts it
in the prefix's libdir). Only ``sdpa_get_api`` is looked up; every function comes from the
table, which is checked for the ABI major version and for its ``struct_size``: a function the
loaded library lacks raises NotImplementedError naming it when it is first used.
"""

import ctypes
import os

ABI_VERSION = 1
DEFAULT_SCALE = 0.0
CAUSAL = 1
F32, F16, BF16 = 0, 1, 2

_size = ctypes.c_size_t
_vp = ctypes.c_void_p


class MhaDesc(ctypes.Structure):
    """sdpa_mha_desc, as include/sdpa.h declares it (v2: types and lse)."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("batch", _size),
        ("heads_q", _size),
        ("heads_kv", _size),
        ("len_q", _size),
        ("len_kv", _size),
        ("d_k", _size),
        ("d_v", _size),
        ("scale", ctypes.c_float),
        ("q_stride", _size * 3),
        ("k_stride", _size * 3),
        ("v_stride", _size * 3),
        ("out_stride", _size * 3),
        ("mask", _vp),
        ("mask_stride", _size * 3),
        ("q_type", ctypes.c_uint32),
        ("kv_type", ctypes.c_uint32),
        ("out_type", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("lse", _vp),
        ("lse_stride", _size * 2),
    ]


class ScoreMods(ctypes.Structure):
    """sdpa_score_mods, as include/sdpa.h declares it (ABI 1.4)."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("window_left", ctypes.c_int64),
        ("window_right", ctypes.c_int64),
        ("softcap", ctypes.c_float),
        ("reserved2", ctypes.c_float),
        ("alibi_slopes", _vp),
        ("sinks", _vp),
        ("q_segment", _vp),
        ("k_segment", _vp),
        ("q_segment_stride", _size),
        ("k_segment_stride", _size),
    ]


_status = ctypes.c_int
_str = ctypes.c_char_p
# (field of sdpa_api, C name, restype, argtypes), in the table's order. Pointers are passed as
# c_void_p (Python ints), which ctypes converts fastest.
_TABLE = [
    ("status_string", "sdpa_status_string", _str, [_status]),
    ("abi_version_fn", "sdpa_abi_version", ctypes.c_uint32, []),
    ("version", "sdpa_version", _str, []),
    ("dot_f32", "sdpa_dot_f32", _status, [_vp, _vp, _size, _vp]),
    ("scale_f32", "sdpa_scale_f32", _status, [_vp, _vp, _size, ctypes.c_float]),
    ("softmax_f32", "sdpa_softmax_f32", _status, [_vp, _vp, _size, ctypes.c_float]),
    ("softmax_backward_f32", "sdpa_softmax_backward_f32", _status,
     [_vp, _vp, _vp, _size, ctypes.c_float]),
    ("scores_f32", "sdpa_scores_f32", _status, [_vp, _vp, _vp, _size, _size, _size, ctypes.c_float]),
    ("backend", "sdpa_backend", _str, []),
    ("set_backend", "sdpa_set_backend", _status, [_str]),
    ("backend_supported", "sdpa_backend_supported", ctypes.c_int, [_str]),
    ("backend_name", "sdpa_backend_name", _str, [_size]),
    ("exp_mode", "sdpa_exp_mode", _str, []),
    ("set_exp_mode", "sdpa_set_exp_mode", _status, [_str]),
    ("attention_f32", "sdpa_attention_f32", _status,
     [_vp, _vp, _vp, _vp, _size, _size, _size, _size, ctypes.c_float, ctypes.c_uint32]),
    ("mha_f32", "sdpa_mha_f32", _status, [_vp, _vp, _vp, _vp, _vp]),
    ("mha_desc_dense", "sdpa_mha_desc_dense", _status, [_vp] + [_size] * 7 + [ctypes.c_float, ctypes.c_uint32]),
    ("mha_desc_bshd", "sdpa_mha_desc_bshd", _status, [_vp] + [_size] * 7 + [ctypes.c_float, ctypes.c_uint32]),
    ("mha_desc_set_mask", "sdpa_mha_desc_set_mask", _status, [_vp, _vp, _size, _size, _size]),
    ("mha", "sdpa_mha", _status, [_vp, _vp, _vp, _vp, _vp]),
    ("convert", "sdpa_convert", _status, [_vp, ctypes.c_int, _vp, ctypes.c_int, _size]),
    ("set_num_threads", "sdpa_set_num_threads", _status, [_size]),
    ("num_threads", "sdpa_num_threads", _size, []),
    ("set_parallel_for", "sdpa_set_parallel_for", _status, [_vp, _vp]),
    ("attention_merge_f32", "sdpa_attention_merge_f32", _status,
     [_vp, _vp, _vp, _vp, _size, _size, _size, _size]),
    ("mha_backward_f32", "sdpa_mha_backward_f32", _status, [_vp, _vp, _vp, _vp, _vp, _vp]),
    ("last_error_detail", "sdpa_last_error_detail", _str, []),
]


class _ApiTable(ctypes.Structure):
    _fields_ = [("abi_version", ctypes.c_uint32), ("struct_size", ctypes.c_uint32)] + [
        (field, _vp) for field, _, _, _ in _TABLE
    ]


def library_path():
    """The path the library is loaded from: $SDPA_LIBRARY, the copy beside this module, or the
    name the dynamic loader resolves."""
    env = os.environ.get("SDPA_LIBRARY")
    if env:
        return env
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libsdpa.so.1")
    return here if os.path.exists(here) else "libsdpa.so.1"


class Api:
    """The loaded library's functions, as attributes named like the sdpa_api fields.

    A field past the table's struct_size is absent: require() raises NotImplementedError that
    names its C function."""

    def __init__(self, path=None):
        self.path = path or library_path()
        try:
            self._dll = ctypes.CDLL(self.path)
        except OSError as e:
            raise ImportError(
                f"sdpa: cannot load {self.path} ({e}); set SDPA_LIBRARY to the path of libsdpa.so.1"
            ) from None
        try:
            get = self._dll.sdpa_get_api
        except AttributeError:
            raise ImportError(f"sdpa: {self.path} has no sdpa_get_api") from None
        get.restype = ctypes.POINTER(_ApiTable)
        get.argtypes = [ctypes.c_uint32]
        table = get(ABI_VERSION)
        if not table:
            raise ImportError(f"sdpa: {self.path} cannot serve ABI version {ABI_VERSION}")
        self._table = table.contents
        if self._table.abi_version != ABI_VERSION:
            raise ImportError(
                f"sdpa: {self.path} filled its table for ABI {self._table.abi_version}, "
                f"not {ABI_VERSION}"
            )
        self.struct_size = self._table.struct_size
        for field, cname, restype, argtypes in _TABLE:
            if self.has(field):
                address = getattr(self._table, field)
                fn = ctypes.CFUNCTYPE(restype, *argtypes)(address) if address else None
            else:
                fn = None
            if fn is not None:
                setattr(self, field, fn)

    def has(self, field):
        """True if the loaded table holds field (it lies below the table's struct_size)."""
        f = getattr(_ApiTable, field)
        return self.struct_size >= f.offset + f.size

    def require(self, field):
        """The function of field; NotImplementedError naming the C function if the loaded
        table lacks it."""
        if self.has(field):
            fn = getattr(self, field, None)
            if fn is not None:
                return fn
        cname = next(c for f, c, _, _ in _TABLE if f == field)
        raise NotImplementedError(
            f"{cname} is not in the loaded library ({self.path}, version "
            f"{self.version().decode()}, table of {self.struct_size} bytes): it needs a newer "
            "libsdpa.so.1"
        )

    def status_text(self, status):
        return self.status_string(status).decode()


def check(api, status, what):
    """Raises ValueError with the library's status string, and the detail of the failure where
    the library has sdpa_last_error_detail, unless status is SDPA_OK. Call it on the thread
    that made the call (the detail is per thread)."""
    if status:
        detail = api.last_error_detail().decode() if api.has("last_error_detail") else ""
        raise ValueError(f"{what}: {api.status_text(status)} (status {status})"
                         + (f": {detail}" if detail else ""))
