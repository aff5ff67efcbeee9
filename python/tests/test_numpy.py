"""sdpa on NumPy arrays, against the float64 reference of conftest.py."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

import sdpa
from conftest import reference

STATUS_SIZE = "invalid size"
STATUS_ARG = "invalid argument"
STATUS_UNSUPPORTED = "unsupported"


def randn(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def bound(v):
    # sdpa.h: max abs error <= 1e-5 * max|v| for unit-normal inputs and the default scale
    return 1e-5 * float(np.abs(np.asarray(v, dtype=np.float64)).max()) + 1e-7


def shape_of(layout, b, h, s, d):
    return (b, h, s, d) if layout == "bhsd" else (b, s, h, d)


def assert_close(out, ref, tol):
    assert out.shape == ref.shape
    err = np.abs(out.astype(np.float64) - ref)
    assert np.all(np.isfinite(out))
    assert err.max() <= tol, f"max error {err.max():.3g} > {tol:.3g}"


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_random_shapes_with_gqa_match_the_reference(rng, layout):
    for _ in range(12):
        b = int(rng.integers(1, 3))
        hkv = int(rng.choice([1, 2, 3]))
        hq = hkv * int(rng.choice([1, 2, 4]))
        lq, lkv = (int(x) for x in rng.integers(1, 80, size=2))
        dk, dv = (int(x) for x in rng.choice([1, 7, 16, 64, 100, 128], size=2))
        q = randn(rng, *shape_of(layout, b, hq, lq, dk))
        k = randn(rng, *shape_of(layout, b, hkv, lkv, dk))
        v = randn(rng, *shape_of(layout, b, hkv, lkv, dv))
        out, lse = sdpa.attention(q, k, v, layout=layout, return_lse=True)
        ref, ref_lse = reference(q, k, v, layout=layout)
        assert out.dtype == np.float32 and out.shape == shape_of(layout, b, hq, lq, dv)
        assert out.flags.c_contiguous
        assert_close(out, ref, bound(v))
        assert lse.shape == (b, hq, lq) and lse.dtype == np.float32
        assert_close(lse, ref_lse, 1e-5 * np.abs(ref_lse).max() + 1e-5)


def test_two_d_inputs_are_one_head(rng):
    q, k, v = randn(rng, 5, 32), randn(rng, 9, 32), randn(rng, 9, 12)
    out, lse = sdpa.attention(q, k, v, return_lse=True)
    ref, ref_lse = reference(q, k, v)
    assert out.shape == (5, 12) and lse.shape == (5,)
    assert_close(out, ref, bound(v))
    assert_close(lse, ref_lse, 1e-5 * np.abs(ref_lse).max())


@pytest.mark.parametrize("lq,lkv", [(1, 50), (17, 17), (30, 70), (40, 25)])
def test_causal_is_bottom_right_aligned(rng, lq, lkv):
    q, k, v = randn(rng, 2, 4, lq, 32), randn(rng, 2, 2, lkv, 32), randn(rng, 2, 2, lkv, 32)
    out, lse = sdpa.attention(q, k, v, causal=True, return_lse=True)
    ref, ref_lse = reference(q, k, v, causal=True)
    assert_close(out, ref, bound(v))
    if lq > lkv:  # the first lq - lkv rows see no key: zeros, lse -inf
        blind = lq - lkv
        assert np.all(out[:, :, :blind] == 0)
        assert np.all(lse[:, :, :blind] == -np.inf)
    seen = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse[seen], ref_lse[seen], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("mask_shape", [(2, 4, 6, 40), (6, 40), (40,), (2, 1, 1, 40), (1, 4, 6, 1)])
def test_bool_masks_keep_true_and_broadcast(rng, layout, mask_shape):
    q = randn(rng, *shape_of(layout, 2, 4, 6, 16))
    k = randn(rng, *shape_of(layout, 2, 2, 40, 16))
    v = randn(rng, *shape_of(layout, 2, 2, 40, 8))
    mask = rng.random(mask_shape) < 0.6
    out = sdpa.attention(q, k, v, mask=mask, layout=layout)
    ref, _ = reference(q, k, v, mask=np.broadcast_to(mask, (2, 4, 6, 40)), layout=layout)
    assert_close(out, ref, bound(v))


def test_a_fully_masked_row_is_zeros_even_with_nan_in_removed_values(rng):
    q, k, v = randn(rng, 1, 1, 3, 8), randn(rng, 1, 1, 5, 8), randn(rng, 1, 1, 5, 8)
    v[0, 0, 4] = np.nan
    mask = np.ones((3, 5), dtype=bool)
    mask[:, 4] = False  # the NaN value is removed from every row
    mask[1] = False  # row 1 sees nothing
    out, lse = sdpa.attention(q, k, v, mask=mask, return_lse=True)
    assert np.all(out[0, 0, 1] == 0) and lse[0, 0, 1] == -np.inf
    keep = [0, 2]
    ref, _ = reference(q[:, :, keep], k[:, :, :4], v[:, :, :4])
    assert_close(out[:, :, keep], ref, bound(v[:, :, :4]))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_float_masks_are_added(rng, dtype):
    q, k, v = randn(rng, 2, 3, 7, 24), randn(rng, 2, 3, 11, 24), randn(rng, 2, 3, 11, 24)
    mask = rng.standard_normal((1, 3, 7, 11)).astype(dtype)
    mask[0, 1, 2, 5] = -np.inf
    out = sdpa.attention(q, k, v, mask=mask)
    ref, _ = reference(q, k, v, mask=mask.astype(np.float32))
    assert_close(out, ref, bound(v))


def test_mask_and_causal_together(rng):
    q, k, v = randn(rng, 1, 2, 9, 16), randn(rng, 1, 2, 12, 16), randn(rng, 1, 2, 12, 16)
    mask = rng.random((9, 12)) < 0.7
    out = sdpa.attention(q, k, v, mask=mask, causal=True)
    ref, _ = reference(q, k, v, mask=mask, causal=True)
    assert_close(out, ref, bound(v))


@pytest.mark.parametrize("scale", [0.05, 1.0, -0.3])
def test_explicit_scale(rng, scale):
    q, k, v = randn(rng, 1, 2, 8, 32), randn(rng, 1, 2, 8, 32), randn(rng, 1, 2, 8, 32)
    out = sdpa.attention(q, k, v, scale=scale)
    ref, _ = reference(q, k, v, scale=scale)
    # scores grow with the scale (sdpa.h: up to about 1e-5 * max|v| at scale 1 here)
    assert_close(out, ref, 4 * bound(v))


def no_copies(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a copy was made")

    monkeypatch.setattr(np, "ascontiguousarray", refuse)


def test_strided_views_are_read_in_place(rng, monkeypatch):
    # q stored (batch, len, heads, d) and viewed as bhsd; k sliced along len and d;
    # v a broadcast of one head over the batch (stride 0)
    q_store = randn(rng, 2, 10, 4, 16)
    k_store = randn(rng, 2, 2, 30, 20)
    v_one = randn(rng, 1, 2, 15, 8)
    q = q_store.transpose(0, 2, 1, 3)
    k = k_store[:, :, ::2, :16]
    v = np.broadcast_to(v_one, (2, 2, 15, 8))
    ref, _ = reference(q, k, v)
    no_copies(monkeypatch)
    out = sdpa.attention(q, k, v)
    assert_close(out, ref, bound(v))


@pytest.mark.parametrize("name", sdpa.backends())
@pytest.mark.parametrize("layout", ["bhsd", "bshd", "2d"])
def test_views_broadcast_along_len_are_copied(rng, name, layout):
    # sdpa.h wants q, k and v rows at least a row apart: a broadcast along len (stride 0), such
    # as one key repeated, was passed through and raised "invalid size"
    q = randn(rng, 2, 3, 5, 16)
    k1 = randn(rng, 2, 3, 1, 16)
    v1 = randn(rng, 2, 3, 1, 8)
    k = np.broadcast_to(k1, (2, 3, 9, 16))
    v = np.broadcast_to(v1, (2, 3, 9, 8))
    qr = np.broadcast_to(q[:, :, :1], q.shape)
    ref, _ = reference(qr, k, v)
    if layout == "bshd":
        qr, k, v, ref = (x.transpose(0, 2, 1, 3) for x in (qr, k, v, ref))
    elif layout == "2d":
        qr, k, v, ref = qr[0, 0], k[0, 0], v[0, 0], ref[0, 0]
    with sdpa.use_backend(name):
        out = sdpa.attention(qr, k, v, layout="bshd" if layout == "bshd" else "bhsd")
    assert_close(out, ref, bound(v))


def test_a_non_contiguous_last_axis_is_copied(rng):
    q = randn(rng, 1, 2, 6, 32)[..., ::2]
    k = randn(rng, 1, 2, 9, 16)
    v = np.asfortranarray(randn(rng, 1, 2, 9, 16))
    out = sdpa.attention(q, k, v)
    ref, _ = reference(q, k, v)
    assert_close(out, ref, bound(v))


def test_negative_strides_are_copied(rng):
    q, k, v = randn(rng, 1, 2, 6, 16), randn(rng, 1, 2, 9, 16), randn(rng, 1, 2, 9, 16)
    out = sdpa.attention(q[:, ::-1], k[:, :, ::-1], v[:, :, ::-1])
    ref, _ = reference(q[:, ::-1], k[:, :, ::-1], v[:, :, ::-1])
    assert_close(out, ref, bound(v))


def test_strides_of_no_whole_number_of_elements_are_copied(rng):
    # rows 66 bytes apart: the library takes strides in elements, so such a view is copied
    raw = np.zeros(7 * 66, dtype=np.uint8)
    q = np.ndarray((7, 16), dtype=np.float32, buffer=raw, strides=(66, 4))
    q[...] = randn(rng, 7, 16)
    k, v = randn(rng, 9, 16), randn(rng, 9, 16)
    out = sdpa.attention(q, k, v)
    assert_close(out, reference(q, k, v)[0], bound(v))
    # a field of a structured array: its last axis is not contiguous either
    rec = np.zeros((7, 16), dtype=[("x", np.float32), ("y", np.float16)])
    rec["x"] = q
    assert_close(sdpa.attention(rec["x"], k, v), reference(q, k, v)[0], bound(v))


def test_float16_views(rng):
    q = randn(rng, 2, 4, 9, 64, dtype=np.float16)
    k = randn(rng, 2, 2, 33, 64, dtype=np.float16)
    v = randn(rng, 2, 2, 33, 64, dtype=np.float16)
    out = sdpa.attention(q, k, v)
    assert out.dtype == np.float16
    ref, _ = reference(q, k, v)  # on the stored 16-bit values
    err = np.abs(out.astype(np.float64) - ref)
    assert np.all(err <= bound(v) + 2.0**-11 * np.abs(ref) + 2.0**-24)


def test_float32_q_over_a_float16_cache(rng):
    q = randn(rng, 1, 8, 1, 64)
    k = randn(rng, 1, 2, 100, 64, dtype=np.float16)
    v = randn(rng, 1, 2, 100, 64, dtype=np.float16)
    out = sdpa.attention(q, k, v)
    assert out.dtype == np.float32
    assert_close(out, reference(q, k, v)[0], bound(v))


@pytest.mark.parametrize("name", sdpa.backends())
def test_every_backend_matches_the_reference(rng, name):
    q, k, v = randn(rng, 2, 4, 37, 64), randn(rng, 2, 2, 53, 64), randn(rng, 2, 2, 53, 48)
    mask = rng.random((37, 53)) < 0.8
    before = sdpa.backend()
    with sdpa.use_backend(name):
        assert sdpa.backend() == name
        out = sdpa.attention(q, k, v, mask=mask, causal=True)
        y = sdpa.softmax(q[0, 0])
    assert sdpa.backend() == before
    assert_close(out, reference(q, k, v, mask=mask, causal=True)[0], bound(v))
    assert_close(y, softmax_reference(q[0, 0]), 2e-5)


def test_use_backend_restores_after_an_exception():
    before = sdpa.backend()
    with pytest.raises(KeyError):
        with sdpa.use_backend("scalar"):
            raise KeyError("inside")
    assert sdpa.backend() == before


def test_unknown_backend_raises_with_the_status_string():
    before = sdpa.backend()
    with pytest.raises(ValueError, match=STATUS_UNSUPPORTED):
        with sdpa.use_backend("no-such-isa"):
            pass
    assert sdpa.backend() == before
    with pytest.raises(TypeError):
        sdpa.set_backend(3)


def test_library_facts():
    assert re.fullmatch(r"\d+\.\d+\.\d+", sdpa.version())
    assert sdpa.__version__ == sdpa.version()
    names = sdpa.backends()
    assert names[-1] == "scalar" and sdpa.backend() in names
    assert os.path.exists(sdpa.library_path())


def test_threads_give_bitwise_identical_results(rng):
    q, k, v = randn(rng, 1, 4, 256, 64), randn(rng, 1, 4, 256, 64), randn(rng, 1, 4, 256, 64)
    try:
        sdpa.set_num_threads(1)
        assert sdpa.num_threads() == 1
        one = sdpa.attention(q, k, v, causal=True)
        sdpa.set_num_threads(3)
        assert sdpa.num_threads() == 3
        three = sdpa.attention(q, k, v, causal=True)
    finally:
        sdpa.set_num_threads(0)
    assert sdpa.num_threads() >= 1
    assert np.array_equal(one, three)


def test_calls_from_many_python_threads_at_once(rng):
    # the GIL is released during the C call; results must not depend on what runs beside it
    import concurrent.futures

    cases = [(randn(rng, 1, 4, 64, 32), randn(rng, 1, 2, 96, 32), randn(rng, 1, 2, 96, 32))
             for _ in range(8)]
    alone = [sdpa.attention(*c, causal=True) for c in cases]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda c: sdpa.attention(*c, causal=True), cases * 4))
    for i, out in enumerate(together):
        assert np.array_equal(out, alone[i % len(cases)])


def test_thread_count_errors():
    with pytest.raises(ValueError):
        sdpa.set_num_threads(-1)
    with pytest.raises(ValueError, match="between 0 and 1024"):
        sdpa.set_num_threads(100000)
    before = sdpa.num_threads()
    for n in (1025, 2**64 + 3, 2**64):  # ctypes passed n modulo 2**64: 3 threads, or 0
        with pytest.raises(ValueError, match="between 0 and 1024"):
            sdpa.set_num_threads(n)
    assert sdpa.num_threads() == before
    with pytest.raises(TypeError):
        sdpa.set_num_threads(2.0)


def softmax_reference(x, scale=1.0, axis=-1):
    z = scale * np.asarray(x, dtype=np.float64)
    e = np.exp(z - z.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def test_softmax(rng):
    x = randn(rng, 3, 5, 70)
    for axis, scale in [(-1, 1.0), (0, 0.5), (1, -2.0)]:
        y = sdpa.softmax(x, scale=scale, axis=axis)
        assert y.shape == x.shape and y.dtype == np.float32
        ref = softmax_reference(x, scale, axis)
        assert np.all(np.abs(y - ref) <= 2e-5 * ref + 1e-37)
    strided = x[:, ::2, ::3]
    assert_close(sdpa.softmax(strided), softmax_reference(strided), 2e-5)
    row = np.array([-np.inf, -np.inf], dtype=np.float32)
    assert np.all(sdpa.softmax(row) == 0)
    assert sdpa.softmax(np.zeros((4, 0), np.float32)).shape == (4, 0)


def test_softmax_errors():
    with pytest.raises(TypeError):
        sdpa.softmax(np.zeros(4))
    with pytest.raises(TypeError):
        sdpa.softmax([1.0, 2.0])
    with pytest.raises(ValueError, match=STATUS_ARG):
        sdpa.softmax(np.zeros(4, np.float32), scale=0.0)
    with pytest.raises(ValueError, match=STATUS_ARG):
        sdpa.softmax(np.zeros(4, np.float32), scale=np.inf)
    with pytest.raises(ValueError):
        sdpa.softmax(np.array(1.0, dtype=np.float32))


def three(rng, qs=(1, 4, 5, 16), ks=(1, 2, 7, 16), vs=(1, 2, 7, 8), dtype=np.float32):
    return randn(rng, *qs, dtype=dtype), randn(rng, *ks, dtype=dtype), randn(rng, *vs, dtype=dtype)


def test_dtype_errors(rng):
    q, k, v = three(rng)
    with pytest.raises(TypeError, match="float32 or float16"):
        sdpa.attention(q.astype(np.float64), k, v)
    with pytest.raises(TypeError, match="one dtype"):
        sdpa.attention(q, k, v.astype(np.float16))
    with pytest.raises(TypeError, match="q: expected a NumPy array or a torch tensor"):
        sdpa.attention(q.tolist(), k, v)
    with pytest.raises(TypeError, match="v: expected a NumPy array, as q is"):
        sdpa.attention(q, k, v.tolist())
    with pytest.raises(TypeError, match="neither bool nor floating"):
        sdpa.attention(q, k, v, mask=np.zeros((5, 7), dtype=np.int32))


def test_shape_errors(rng):
    q, k, v = three(rng)
    with pytest.raises(ValueError, match="4-d"):
        sdpa.attention(q[0], k[0], v[0])
    with pytest.raises(ValueError, match="4-d"):
        sdpa.attention(q, k[0, 0], v[0, 0])
    with pytest.raises(ValueError, match="do not match"):
        sdpa.attention(q, k, v[:, :, :6])
    with pytest.raises(ValueError, match="do not match"):
        sdpa.attention(q, k[..., :8], v)
    with pytest.raises(ValueError, match="do not match"):
        sdpa.attention(q, np.concatenate([k, k]), np.concatenate([v, v]))
    with pytest.raises(ValueError, match="broadcast"):
        sdpa.attention(q, k, v, mask=np.zeros((5, 8), bool))
    with pytest.raises(ValueError, match="broadcast"):
        sdpa.attention(q, k, v, mask=np.zeros((1, 1, 1, 5, 7), bool))
    with pytest.raises(ValueError, match="layout"):
        sdpa.attention(q, k, v, layout="sbhd")


def test_library_status_errors_come_with_its_string_and_detail(rng):
    q, k, v = three(rng, qs=(1, 4, 5, 0), ks=(1, 2, 7, 0))  # d_k = 0 with output rows
    with pytest.raises(ValueError, match=STATUS_SIZE + ".*: d_k is 0 with output rows"):
        sdpa.attention(q, k, v)
    with pytest.raises(ValueError, match='"no-such" is not one this library knows'):
        sdpa.set_backend("no-such")


def test_heads_that_do_not_divide_name_the_fields(rng):
    # the status alone said "invalid size: zero where work is needed, or overflowing"
    q, k, v = three(rng, ks=(1, 3, 7, 16), vs=(1, 3, 7, 8))
    with pytest.raises(ValueError, match=r"k and v have 3 heads \(heads_kv\), which must divide "
                                         r"q's 4 heads \(heads_q\)"):
        sdpa.attention(q, k, v)
    with pytest.raises(ValueError, match="k and v have 3 heads"):
        sdpa.attention(*(x.transpose(0, 2, 1, 3) for x in (q, k, v)), layout="bshd")


@pytest.mark.parametrize("scale,why", [
    (np.nan, "finite"), (np.inf, "finite"), (-np.inf, "finite"), (0, "is 0 in float32"),
    (1e-50, "is 0 in float32"), (-1e-46, "is 0 in float32"), (1e300, "overflows float32"),
    (3.5e38, "overflows float32")])
def test_a_scale_that_float32_cannot_hold_raises(rng, scale, why):
    # 1e-50 was cast to 0.0f, which the library takes for the default 1/sqrt(d_k)
    q, k, v = three(rng)
    with pytest.raises(ValueError, match=why):
        sdpa.attention(q, k, v, scale=scale)


@pytest.mark.parametrize("scale", ["0.5", b"0.5", True, 1j, [0.5]])
def test_a_scale_that_is_not_a_real_number_raises(rng, scale):
    # float("0.5") would have taken a string for a scale without a word
    q, k, v = three(rng)
    with pytest.raises(TypeError, match="scale must be a real number"):
        sdpa.attention(q, k, v, scale=scale)


@pytest.mark.parametrize("scale", [np.float32(0.5), np.float64(0.5), 1, 0.5])
def test_a_scale_of_any_real_type_is_taken(rng, scale):
    q, k, v = three(rng)
    ref, _ = reference(q, k, v, scale=float(scale))
    assert_close(sdpa.attention(q, k, v, scale=scale), ref, bound(v))


def test_a_tiny_scale_that_float32_holds_is_used(rng):
    # 1e-44 is a float32 subnormal: every score is about 0, so every row is the mean of v
    q, k, v = three(rng)
    ref, _ = reference(q, k, v, scale=float(np.float32(1e-44)))
    assert_close(sdpa.attention(q, k, v, scale=1e-44), ref, bound(v))
    default, _ = reference(q, k, v)
    assert np.abs(ref - default).max() > 100 * bound(v)  # the default would be told apart


def test_empty_query_gives_an_empty_output(rng):
    q, k, v = three(rng, qs=(1, 4, 0, 16))
    assert sdpa.attention(q, k, v).shape == (1, 4, 0, 8)


def run_python(code, **env):
    full = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True)


def test_sdpa_library_names_the_library():
    r = run_python("import sdpa; print(sdpa.library_path())")
    assert r.returncode == 0, r.stderr
    if os.environ.get("SDPA_LIBRARY"):
        assert r.stdout.strip() == os.environ["SDPA_LIBRARY"]
    bad = run_python("import sdpa", SDPA_LIBRARY="/nonexistent/libsdpa.so.1")
    assert bad.returncode != 0
    assert "ImportError" in bad.stderr and "SDPA_LIBRARY" in bad.stderr


def test_a_function_past_the_tables_size_raises_not_implemented(monkeypatch):
    api = sdpa._core.api
    offset = sdpa._lib._ApiTable.attention_merge_f32.offset
    monkeypatch.setattr(api, "struct_size", offset)
    assert not api.has("attention_merge_f32")
    with pytest.raises(NotImplementedError, match="sdpa_attention_merge_f32"):
        api.require("attention_merge_f32")
    assert api.require("mha") is not None


def test_the_benchmark_runs_and_prints_its_table():
    r = subprocess.run([sys.executable, "-m", "sdpa.bench", "--min-time", "0", "--shape", "decode 8",
                        "--calls", "100"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "Python overhead" in r.stdout
    rows = [line for line in r.stdout.splitlines() if line.startswith("| decode 8 heads")]
    assert len(rows) == len({1, len(os.sched_getaffinity(0))})
