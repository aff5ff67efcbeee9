"""The score modifiers of sdpa.attention and sdpa.attention_paged (window, softcap, ALiBi, sinks,
segments) on every backend, against a float64 reference written from sdpa.h's formulas."""

import numpy as np
import pytest

import sdpa

MODS_FIELDS = ("window", "softcap", "sinks", "alibi_slopes", "segments")


def reference_mods(q, k, v, causal=False, scale=None, window=None, softcap=None, sinks=None,
                   alibi_slopes=None, segments=None):
    """(out, lse) in float64 for bhsd inputs, straight from sdpa.h: row i at key position
    p_i = i + len_kv - len_q; s = scale q.k; softcap; + ALiBi; the pairs outside causality, the
    window or the segment removed; softmax with e^sink in the denominator."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    batch, heads_q, len_q, d = q.shape
    group = heads_q // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    len_kv = k.shape[2]
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    out = np.zeros((batch, heads_q, len_q, v.shape[-1]))
    lse = np.full((batch, heads_q, len_q), -np.inf)
    for b in range(batch):
        for h in range(heads_q):
            for i in range(len_q):
                p = i + len_kv - len_q
                terms, values = [], []
                for j in range(len_kv):
                    if causal and j > p:
                        continue
                    if window is not None:
                        left, right = window
                        if (left not in (None, -1) and j < p - left) or (
                                right not in (None, -1) and j > p + right):
                            continue
                    if segments is not None:
                        qs, ks = (np.broadcast_to(np.asarray(x), (batch, n))
                                  for x, n in zip(segments, (len_q, len_kv)))
                        if qs[b, i] != ks[b, j]:
                            continue
                    s = scale * float(q[b, h, i] @ k[b, h, j])
                    if softcap:
                        s = softcap * np.tanh(s / softcap)
                    if alibi_slopes is not None:
                        s += float(alibi_slopes[h]) * (j - p)
                    terms.append(s)
                    values.append(v[b, h, j])
                sink = None if sinks is None else float(sinks[h])
                logits = terms + ([sink] if sink is not None and sink != -np.inf else [])
                if not logits:
                    continue
                m = max(logits)
                z = sum(np.exp(t - m) for t in logits)
                lse[b, h, i] = np.log(z) + m
                for t, val in zip(terms, values):
                    out[b, h, i] += np.exp(t - m) / z * val
    return out, lse


def randn(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def bound(v):
    # sdpa.h's attention bound for unit-normal inputs, as test_numpy.py
    return 1e-5 * float(np.abs(np.asarray(v, dtype=np.float64)).max()) + 1e-7


def check(out, lse, ref, ref_lse, tol):
    assert np.abs(out.astype(np.float64) - ref).max() <= tol
    assert np.array_equal(np.isinf(lse), np.isinf(ref_lse))
    seen = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse[seen], ref_lse[seen], rtol=1e-5, atol=1e-5)


def problem(rng, batch=2, heads_q=4, heads_kv=2, len_q=7, len_kv=11, d=16):
    return (randn(rng, batch, heads_q, len_q, d), randn(rng, batch, heads_kv, len_kv, d),
            randn(rng, batch, heads_kv, len_kv, d))


def some_mods(rng, heads_q, batch, len_q, len_kv):
    """One value of each modifier, the segments in runs so that rows see a few keys."""
    return {
        "window": (3, 1),
        "softcap": 2.5,
        "sinks": rng.standard_normal(heads_q).astype(np.float32),
        "alibi_slopes": (0.25 * rng.random(heads_q)).astype(np.float32),
        "segments": (np.sort(rng.integers(0, 3, (batch, len_q))).astype(np.int32),
                     np.sort(rng.integers(0, 3, (batch, len_kv))).astype(np.int32)),
    }


@pytest.mark.parametrize("backend", sdpa.backends())
@pytest.mark.parametrize("field", MODS_FIELDS + ("all",))
def test_each_modifier_alone_and_all_together_on_every_backend(rng, backend, field):
    q, k, v = problem(rng)
    mods = some_mods(rng, 4, 2, 7, 11)
    if field != "all":
        mods = {field: mods[field]}
    ref, ref_lse = reference_mods(q, k, v, **mods)
    with sdpa.use_backend(backend):
        out, lse = sdpa.attention(q, k, v, return_lse=True, **mods)
    check(out, lse, ref, ref_lse, bound(v))
    # the modifier changed the result: the test would see it ignored
    plain = reference_mods(q, k, v)[0]
    assert np.abs(plain - ref).max() > 100 * bound(v)


@pytest.mark.parametrize("len_q,len_kv", [(9, 5), (5, 9), (6, 6)])
@pytest.mark.parametrize("window", [(0, 0), (1, 0), (0, 1), (1, 1), (2**40, 2**40), (None, 2),
                                    (4, None)])
def test_windows_with_causal_and_gqa(rng, len_q, len_kv, window):
    q, k, v = problem(rng, heads_q=6, heads_kv=2, len_q=len_q, len_kv=len_kv)
    for causal in (False, True):
        ref, ref_lse = reference_mods(q, k, v, causal=causal, window=window)
        out, lse = sdpa.attention(q, k, v, causal=causal, return_lse=True, window=window)
        check(out, lse, ref, ref_lse, bound(v))


def test_a_row_with_no_key_but_a_sink_is_zeros_with_lse_the_sink(rng):
    q, k, v = problem(rng, batch=1, heads_q=2, heads_kv=1, len_q=4, len_kv=4)
    sinks = np.array([0.5, -1.25], dtype=np.float32)
    # query 3's segment (9) holds no key
    segments = (np.array([0, 0, 1, 9], dtype=np.int32), np.array([0, 0, 1, 1], dtype=np.int32))
    out, lse = sdpa.attention(q, k, v, return_lse=True, sinks=sinks, segments=segments)
    assert np.all(out[0, :, 3] == 0)
    np.testing.assert_allclose(lse[0, :, 3], sinks, rtol=1e-6)
    ref, ref_lse = reference_mods(q, k, v, sinks=sinks, segments=segments)
    check(out, lse, ref, ref_lse, bound(v))
    # causal with more queries than keys: the first two rows see no key
    q6 = randn(rng, 1, 2, 6, 16)
    out, lse = sdpa.attention(q6, k, v, causal=True, return_lse=True, sinks=sinks, window=(1, 0),
                              alibi_slopes=np.ones(2, np.float32))
    assert np.all(out[0, :, :2] == 0)
    np.testing.assert_allclose(lse[0, :, :2], np.repeat(sinks[:, None], 2, 1), rtol=1e-6)
    ref, ref_lse = reference_mods(q6, k, v, causal=True, sinks=sinks, window=(1, 0),
                                  alibi_slopes=np.ones(2))
    check(out, lse, ref, ref_lse, bound(v))
    # without a sink, such a row is zeros with lse -inf
    out, lse = sdpa.attention(q, k, v, return_lse=True, segments=segments)
    assert np.all(out[0, :, 3] == 0) and np.all(lse[0, :, 3] == -np.inf)


def test_two_d_bshd_float16_and_broadcast_segments(rng):
    q, k, v = problem(rng, batch=2, heads_q=4, heads_kv=4, len_q=5, len_kv=8)
    mods = dict(window=(2, 0), softcap=5.0, segments=(np.array([0, 0, 1, 1, 1]),
                                                      np.array([0, 0, 0, 1, 1, 1, 1, 1])))
    ref, ref_lse = reference_mods(q, k, v, causal=True, **mods)
    got = sdpa.attention(*(x.transpose(0, 2, 1, 3) for x in (q, k, v)), causal=True,
                         layout="bshd", **mods)
    assert np.abs(got.transpose(0, 2, 1, 3) - ref).max() <= bound(v)
    got = sdpa.attention(q[1, 2], k[1, 2], v[1, 2], causal=True, **mods)
    assert np.abs(got - ref[1, 2]).max() <= bound(v)
    h = tuple(x.astype(np.float16) for x in (q, k, v))
    ref16 = reference_mods(*h, causal=True, **mods)[0]
    got = sdpa.attention(*h, causal=True, **mods)
    assert got.dtype == np.float16
    assert np.abs(got.astype(np.float64) - ref16).max() <= 2e-3 * np.abs(ref16).max()


def test_bad_modifiers_raise_naming_them(rng):
    q, k, v = problem(rng)
    with pytest.raises(ValueError, match=r"sinks must have one value per query head, shape \(4,\)"):
        sdpa.attention(q, k, v, sinks=np.zeros(2, np.float32))
    with pytest.raises(ValueError, match=r"alibi_slopes must have one value per query head"):
        sdpa.attention(q, k, v, alibi_slopes=np.zeros(5, np.float32))
    with pytest.raises(ValueError, match=r"window: left \(-2\)"):
        sdpa.attention(q, k, v, window=(-2, 0))
    with pytest.raises(TypeError, match="window must be a pair"):
        sdpa.attention(q, k, v, window=3)
    with pytest.raises(ValueError, match=r"softcap \(-1\.0\)"):
        sdpa.attention(q, k, v, softcap=-1.0)
    with pytest.raises(ValueError, match=r"softcap \(inf\)"):
        sdpa.attention(q, k, v, softcap=float("inf"))
    with pytest.raises(TypeError, match="segments must be a pair"):
        sdpa.attention(q, k, v, segments=np.zeros((3, 7), np.int32))
    with pytest.raises(ValueError, match=r"k_segment must have shape \(11,\) or \(2, 11\)"):
        sdpa.attention(q, k, v, segments=(np.zeros(7, np.int32), np.zeros(7, np.int32)))
    with pytest.raises(ValueError, match="sinks.*NaN"):
        sdpa.attention(q, k, v, sinks=np.array([0, np.nan, 0, 0], np.float32))


def test_torch_tensors_every_dtype():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(11)
    q, k, v = problem(rng, heads_q=4, heads_kv=2, len_q=6, len_kv=9)
    mods = some_mods(rng, 4, 2, 6, 9)
    ref = reference_mods(q, k, v, causal=True, **mods)[0]
    tmods = dict(mods, sinks=torch.from_numpy(mods["sinks"]),
                 segments=tuple(torch.from_numpy(s) for s in mods["segments"]))
    for dtype, tol in ((torch.float32, bound(v)), (torch.float16, 3e-3), (torch.bfloat16, 2e-2)):
        t = [torch.from_numpy(x).to(dtype) for x in (q, k, v)]
        got = sdpa.attention(*t, causal=True, **tmods)
        assert got.dtype == dtype
        want = reference_mods(*(x.double().numpy() for x in t), causal=True, **mods)[0]
        assert np.abs(got.double().numpy() - want).max() <= tol * max(1.0, np.abs(want).max())
    assert np.abs(sdpa.attention(*(torch.from_numpy(x) for x in (q, k, v)), causal=True, **tmods)
                  .numpy() - ref).max() <= bound(v)
    with torch.no_grad():
        got = sdpa.attention(torch.from_numpy(q).requires_grad_(), torch.from_numpy(k),
                             torch.from_numpy(v), causal=True, **tmods)
    assert np.abs(got.numpy() - ref).max() <= bound(v)


def torch_reference(torch, q, k, v, causal=False, window=None, softcap=None, sinks=None,
                    alibi_slopes=None, segments=None):
    """out of bhsd float64 tensors from sdpa.h's formulas, in torch operations so that autograd
    differentiates it (sinks may be a tensor that requires grad)."""
    batch, heads_q, len_q, d = q.shape
    group = heads_q // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    len_kv = k.shape[2]
    s = (q @ k.transpose(-1, -2)) / d ** 0.5
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    pos = torch.arange(len_q)[:, None] + (len_kv - len_q)  # p_i
    rel = torch.arange(len_kv)[None, :] - pos  # j - p_i
    if alibi_slopes is not None:
        s = s + torch.as_tensor(alibi_slopes, dtype=torch.float64)[:, None, None] * rel
    seen = torch.ones(batch, 1, len_q, len_kv, dtype=torch.bool)
    if causal:
        seen = seen & (rel <= 0)
    if window is not None:
        left, right = (-1 if w is None else w for w in window)
        if left != -1:
            seen = seen & (rel >= -left)
        if right != -1:
            seen = seen & (rel <= right)
    if segments is not None:
        qs, ks = (torch.as_tensor(np.broadcast_to(np.asarray(x), (batch, n)).copy())
                  for x, n in zip(segments, (len_q, len_kv)))
        seen = seen & (qs[:, None, :, None] == ks[:, None, None, :])
    s = torch.where(seen, s, torch.full_like(s, -np.inf))
    if sinks is not None:
        sink = torch.as_tensor(sinks).to(torch.float64)[None, :, None, None]
        s = torch.cat([s, sink.expand(batch, heads_q, len_q, 1)], dim=-1)
    m = s.detach().amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    p = e[..., :len_kv] / e.sum(dim=-1, keepdim=True).clamp_min(1e-300)
    return p @ v


def grads_of(torch, fn, inputs, dout):
    """The gradients of sum(fn(*inputs) * dout) with respect to every input, in float64."""
    out = fn(*inputs)
    return torch.autograd.grad((out * dout.to(out.dtype)).sum(), inputs)


@pytest.mark.parametrize("backend", sdpa.backends())
@pytest.mark.parametrize("field", MODS_FIELDS + ("all",))
def test_gradients_through_each_modifier_and_all_together(rng, backend, field):
    torch = pytest.importorskip("torch")
    heads_q, batch, len_q, len_kv = 4, 2, 7, 11
    q, k, v = (torch.from_numpy(x) for x in problem(rng, batch, heads_q, 2, len_q, len_kv))
    mods = some_mods(rng, heads_q, batch, len_q, len_kv)
    if field != "all":
        mods = {field: mods[field]}
    sinks = mods.pop("sinks", None)
    dout = torch.from_numpy(randn(rng, batch, heads_q, len_q, 16))
    ins = [q, k, v] + ([] if sinks is None else [torch.from_numpy(sinks)])

    def reference(*x):
        return torch_reference(torch, *x[:3], causal=True, sinks=x[3] if len(x) > 3 else None,
                               **mods)

    want = grads_of(torch, reference, [x.double().requires_grad_() for x in ins], dout)
    with sdpa.use_backend(backend):
        got = grads_of(torch, lambda *x: sdpa.attention(*x[:3], causal=True,
                                                        sinks=x[3] if len(x) > 3 else None,
                                                        **mods),
                       [x.clone().requires_grad_() for x in ins], dout)
    names = ("dq", "dk", "dv", "dsinks")
    for name, g, w in zip(names, got, want):
        assert g.dtype == torch.float32
        tol = 1e-4 * max(1.0, float(w.abs().max()))
        assert float((g.double() - w).abs().max()) <= tol, name
    # the modifier changed the gradients: the test would see it ignored in the backward
    plain = grads_of(torch, lambda *x: torch_reference(torch, *x, causal=True),
                     [x.double().requires_grad_() for x in ins[:3]], dout)
    assert max(float((p - w).abs().max()) for p, w in zip(plain, want)) > 1e-2
    if sinks is not None:
        assert float(want[3].abs().max()) > 1e-2  # dsinks is not trivially 0


def test_gradient_of_sinks_alone_and_of_16_bit_inputs(rng):
    torch = pytest.importorskip("torch")
    q, k, v = (torch.from_numpy(x) for x in problem(rng, 1, 4, 4, 5, 5))
    sinks = torch.from_numpy(randn(rng, 4))
    dout = torch.from_numpy(randn(rng, 1, 4, 5, 16))
    want = grads_of(torch, lambda *x: torch_reference(torch, *x[:3], sinks=x[3], softcap=3.0),
                    [x.double().requires_grad_() for x in (q, k, v, sinks)], dout)[3]
    # only the sinks ask for a gradient
    got = grads_of(torch, lambda s: sdpa.attention(q, k, v, sinks=s, softcap=3.0),
                   [sinks.clone().requires_grad_()], dout)[0]
    assert float((got.double() - want).abs().max()) <= 1e-4 * max(1.0, float(want.abs().max()))
    # bfloat16 sinks and inputs: the gradients come back in their own dtype
    t = [x.to(torch.bfloat16).requires_grad_() for x in (q, k, v, sinks)]
    got = grads_of(torch, lambda *x: sdpa.attention(*x[:3], sinks=x[3], softcap=3.0), t, dout)
    assert [g.dtype for g in got] == [torch.bfloat16] * 4
    want = grads_of(torch, lambda *x: torch_reference(torch, *x[:3], sinks=x[3], softcap=3.0),
                    [x.detach().double().requires_grad_() for x in t], dout)
    for g, w in zip(got, want):
        assert float((g.double() - w).abs().max()) <= 3e-2 * max(1.0, float(w.abs().max()))


@pytest.mark.parametrize("backend", sdpa.backends())
def test_paged_call_takes_the_modifiers(rng, backend):
    heads_q, heads_kv, d, block = 4, 2, 16, 4
    rows, keys = [3, 1, 0, 5], [9, 1, 7, 5]
    mods = {"window": (2, 1), "softcap": 3.0,
            "sinks": rng.standard_normal(heads_q).astype(np.float32),
            "alibi_slopes": (0.3 * rng.random(heads_q)).astype(np.float32)}
    blocks = [-(-n // block) for n in keys]
    table = np.full((len(rows), max(blocks)), -1, dtype=np.int32)
    order = rng.permutation(sum(blocks))
    at = 0
    for s, n in enumerate(blocks):
        table[s, :n] = order[at:at + n]
        at += n
    k_pool = randn(rng, sum(blocks), heads_kv, block, d)
    v_pool = randn(rng, sum(blocks), heads_kv, block, d)
    q_start = np.concatenate([[0], np.cumsum(rows)]).astype(np.int32)
    q = randn(rng, int(q_start[-1]), heads_q, d)
    with sdpa.use_backend(backend):
        out, lse = sdpa.attention_paged(q, k_pool, v_pool, table, q_start, keys, causal=True,
                                        return_lse=True, **mods)
    for s, (n_rows, n) in enumerate(zip(rows, keys)):
        if n_rows == 0:
            continue
        dense = [np.concatenate([pool[b] for b in table[s, :blocks[s]]], axis=1)[None, :, :n]
                 for pool in (k_pool, v_pool)]
        qs = q[q_start[s]:q_start[s + 1]].transpose(1, 0, 2)[None]
        ref, ref_lse = reference_mods(qs, *dense, causal=True, **mods)
        check(out[q_start[s]:q_start[s + 1]].transpose(1, 0, 2)[None],
              lse[q_start[s]:q_start[s + 1]].T[None], ref, ref_lse, bound(v_pool))
