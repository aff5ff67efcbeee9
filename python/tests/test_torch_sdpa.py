"""sdpa.torch.scaled_dot_product_attention, the drop-in for torch's function: forward and
gradients against a float64 reference of torch's definition written here (top-left causal, bool
or added float mask, GQA by repeating the key/value heads), on every backend; and against
torch's own function where this torch has it (2.0 and later)."""

import math

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import sdpa  # noqa: E402
import sdpa.torch  # noqa: E402

sdpa_fn = sdpa.torch.scaled_dot_product_attention
has_backward = sdpa._core.api.has("mha_backward_f32")
needs_backward = pytest.mark.skipif(
    not has_backward, reason="the loaded libsdpa has no sdpa_mha_backward_f32")
torch_version = tuple(int(x) for x in torch.__version__.split(".")[:2])


@pytest.fixture(params=sdpa.backends())
def backend(request):
    with sdpa.use_backend(request.param):
        yield request.param


@pytest.fixture
def gen(rng):
    return torch.Generator().manual_seed(int(rng.integers(2**31)))


def randn(gen, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=gen).to(dtype)


def reference(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    """torch's definition in float64, differentiable: softmax(q k^T scale + bias) v, the bias
    -inf above the top-left diagonal (is_causal) or where a bool mask is False, or the float
    mask; a row that sees no key gives zeros."""
    q, k, v = (x.double() for x in (q, k, v))
    if enable_gqa:
        group = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * scale
    lq, lkv = s.shape[-2:]
    if is_causal:
        s = s.masked_fill(~torch.ones(lq, lkv, dtype=torch.bool).tril(), -math.inf)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            s = s.masked_fill(~attn_mask, -math.inf)
        else:
            s = s + attn_mask.double()
    m = s.detach().amax(dim=-1, keepdim=True)
    e = torch.exp(s - torch.where(torch.isfinite(m), m, torch.zeros_like(m)))
    z = e.sum(dim=-1, keepdim=True)
    return (e / torch.where(z > 0, z, torch.ones_like(z))) @ v


def bound(v):
    return 1e-5 * v.detach().abs().max().item() + 1e-7


def check_forward(q, k, v, **kw):
    out = sdpa_fn(q, k, v, **kw)
    ref = reference(q, k, v, **kw)
    assert out.shape == ref.shape and out.dtype == q.dtype
    assert (out.double() - ref).abs().max().item() <= bound(v)
    peer = torch_peer(q, k, v, **kw)
    if peer is not None:
        assert (out - peer).abs().max().item() <= 4 * bound(v)
    return out


def torch_peer(q, k, v, **kw):
    """torch's own result, or None where this torch lacks the function or the argument."""
    if not hasattr(F, "scaled_dot_product_attention"):
        return None
    # enable_gqa came in 2.5 (compared on 4-d inputs only, the shape torch's GQA checks
    # name), scale in 2.1
    if (kw.get("enable_gqa") and (torch_version < (2, 5) or q.dim() != 4)) or (
            kw.get("scale") is not None and torch_version < (2, 1)):
        return None
    # torch's CPU flash kernel scales after masking: with a negative scale, its causal rows
    # are NaN (-inf times the scale); the float64 reference still checks sdpa there
    if kw.get("is_causal") and kw.get("scale") is not None and kw["scale"] < 0:
        return None
    mask = kw.get("attn_mask")
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(q.dtype)  # exact here; some versions want q's dtype
    if mask is not None and mask.dim() < 2:
        mask = mask[None]  # the same broadcast; torch 2.x rejects a 1-d mask (IndexError)
    if mask is not None:
        kw = dict(kw, attn_mask=mask)
    return F.scaled_dot_product_attention(q, k, v, **kw)


@pytest.mark.parametrize("len_q,len_kv", [(5, 9), (9, 5), (7, 7), (1, 6), (6, 1)])
def test_is_causal_is_top_left_aligned(gen, backend, len_q, len_kv):
    q, k, v = randn(gen, 2, 3, len_q, 16), randn(gen, 2, 3, len_kv, 16), randn(gen, 2, 3, len_kv, 8)
    out = check_forward(q, k, v, is_causal=True)
    # with more queries than keys, every row still sees key 0 (bottom-right would zero some)
    assert out.abs().amax(dim=-1).min().item() > 0
    if len_q != len_kv:
        bottom_right = sdpa.attention(q, k, v, causal=True)
        assert (out - bottom_right).abs().max().item() > 1e-2


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32, torch.float16])
@pytest.mark.parametrize("mask_shape", [(11, 13), (13,), (2, 1, 11, 13), (1, 4, 1, 13)])
def test_masks_broadcast(gen, backend, dtype, mask_shape):
    q, k, v = randn(gen, 2, 4, 11, 16), randn(gen, 2, 4, 13, 16), randn(gen, 2, 4, 13, 16)
    if dtype == torch.bool:
        mask = torch.rand(*mask_shape, generator=gen) < 0.7
        mask[..., 0] = True  # no row without keys here (its torch result depends on the version)
    else:
        mask = torch.randn(*mask_shape, generator=gen).to(dtype)
    check_forward(q, k, v, attn_mask=mask)


def test_2d_3d_and_5d_inputs(gen, backend):
    for lead in [(), (3,), (2, 3), (2, 2, 3)]:
        q, k, v = randn(gen, *lead, 6, 8), randn(gen, *lead, 10, 8), randn(gen, *lead, 10, 4)
        check_forward(q, k, v)
        check_forward(q, k, v, is_causal=True)
        mask = torch.rand(*lead[-1:], 6, 10, generator=gen) < 0.8
        mask[..., 0] = True
        check_forward(q, k, v, attn_mask=mask)
    # a 5-d mask whose leading axes cannot be merged as a view, and a strided 5-d query
    q = randn(gen, 3, 2, 2, 6, 8).transpose(0, 1)
    k, v = randn(gen, 2, 3, 2, 10, 8), randn(gen, 2, 3, 2, 10, 4)
    check_forward(q, k, v, attn_mask=torch.randn(3, 1, 6, 10, generator=gen))


def test_4d_inputs_in_bshd_storage_are_views(gen, backend):
    q, k, v = (randn(gen, 2, n, 4, 16).transpose(1, 2) for n in (7, 9, 9))
    check_forward(q, k, v, is_causal=True)


@pytest.mark.parametrize("shape_q,shape_kv", [((2, 6, 5, 16), (2, 2, 8, 16)),
                                              ((8, 5, 16), (2, 8, 16)),
                                              ((2, 4, 9, 16), (2, 1, 9, 16))])
def test_gqa_with_enable_gqa(gen, backend, shape_q, shape_kv):
    q, k, v = randn(gen, *shape_q), randn(gen, *shape_kv), randn(gen, *shape_kv)
    check_forward(q, k, v, enable_gqa=True)
    check_forward(q, k, v, enable_gqa=True, is_causal=True)


def test_equal_heads_with_enable_gqa_is_plain_attention(gen):
    q, k, v = (randn(gen, 1, 3, 5, 8) for _ in range(3))
    assert torch.equal(sdpa_fn(q, k, v, enable_gqa=True), sdpa_fn(q, k, v))


def test_scale(gen, backend):
    q, k, v = (randn(gen, 1, 2, 6, 8) for _ in range(3))
    check_forward(q, k, v, scale=0.3)
    check_forward(q, k, v, scale=-2.0, is_causal=True)


def test_a_row_that_sees_no_key_is_zeros(gen, backend):
    # torch >= 2.5 gives zeros too (earlier versions NaN); a causal row cannot be empty
    q, k, v = (randn(gen, 1, 2, 4, 8) for _ in range(3))
    mask = torch.ones(4, 4, dtype=torch.bool)
    mask[1] = False
    out = sdpa_fn(q, k, v, attn_mask=mask)
    assert torch.equal(out[:, :, 1], torch.zeros(1, 2, 8))
    ref = reference(q, k, v, attn_mask=mask)
    assert (out.double() - ref).abs().max().item() <= bound(v)
    if torch_version >= (2, 5):
        assert (out - F.scaled_dot_product_attention(q, k, v, attn_mask=mask)).abs().max() <= 1e-5


@pytest.mark.parametrize("dtype,rel", [(torch.float16, 2.0**-11), (torch.bfloat16, 2.0**-8)])
def test_16_bit_forward(gen, backend, dtype, rel):
    q, k, v = (randn(gen, 2, 3, n, 32, dtype=dtype) for n in (9, 12, 12))
    for kw in [{"is_causal": True}, {"attn_mask": torch.randn(9, 12, generator=gen)}]:
        out = sdpa_fn(q, k, v, **kw)
        assert out.dtype == dtype
        ref = reference(q, k, v, **kw)
        err = (out.double() - ref).abs()
        assert bool((err <= bound(v.float()) + rel * ref.abs() + 2.0**-24).all())
        peer = torch_peer(q, k, v, **kw)
        if peer is not None:
            assert peer.dtype == dtype
            # torch rounds its probabilities to dtype, too: its error is relative to the
            # largest output rather than to each element
            err = (out.double() - peer.double()).abs().max().item()
            assert err <= 4 * rel * ref.abs().max().item()


def grads(q, k, v, dout, **kw):
    """(out, dq, dk, dv) of sdpa and of the float64 reference."""
    dout = dout.to(q.dtype)
    xs = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    out = sdpa_fn(*xs, **kw)
    out.backward(dout)
    ds = [x.detach().double().requires_grad_() for x in (q, k, v)]
    ref = reference(*ds, **kw)
    ref.backward(dout.double())
    return (out, *(x.grad for x in xs)), (ref, *(x.grad for x in ds))


def peer_grads(q, k, v, dout, **kw):
    """(out, dq, dk, dv) of torch's own function and autograd, or None where torch lacks it."""
    xs = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    out = torch_peer(*xs, **kw)
    if out is None:
        return None
    out.backward(dout.to(q.dtype))
    return (out, *(x.grad for x in xs))


@needs_backward
def test_gradients_match_the_float64_reference(gen, backend):
    cases = [((2, 3, 5, 16), (2, 3, 9, 16), {"is_causal": True}),
             ((2, 3, 9, 16), (2, 3, 5, 16), {"is_causal": True}),
             ((2, 4, 7, 16), (2, 2, 7, 16), {"is_causal": True, "enable_gqa": True}),
             ((6, 7, 16), (6, 11, 16), {"attn_mask": None}),
             ((2, 3, 7, 16), (2, 3, 11, 16), {"attn_mask": "bool"}),
             ((2, 3, 7, 16), (2, 3, 11, 16), {"attn_mask": "float", "scale": 0.5})]
    for shape_q, shape_kv, kw in cases:
        q, k, v = randn(gen, *shape_q), randn(gen, *shape_kv), randn(gen, *shape_kv)
        if kw.get("attn_mask") == "bool":
            kw["attn_mask"] = torch.rand(shape_q[-2], shape_kv[-2], generator=gen) < 0.6
            kw["attn_mask"][2] = False  # a row that sees nothing passes no gradient
        elif kw.get("attn_mask") == "float":
            kw["attn_mask"] = torch.randn(shape_q[1], 1, shape_kv[-2], generator=gen)
        dout = randn(gen, *shape_q)
        got, want = grads(q, k, v, dout, **kw)
        peer = peer_grads(q, k, v, dout, **kw) or want
        for name, g, w, p in zip(("out", "dq", "dk", "dv"), got, want, peer):
            assert g.shape == w.shape, name
            assert (g.double() - w).abs().max().item() <= 2e-5 * w.abs().max().item() + 1e-7, name
            # torch's own gradients (2.x), each float32 and so further from the reference
            assert (g - p.to(g.dtype)).abs().max().item() <= 4e-5 * w.abs().max().item() + 1e-6, name


@needs_backward
@pytest.mark.parametrize("dtype,rel", [(torch.float16, 2.0**-10), (torch.bfloat16, 2.0**-7)])
def test_16_bit_gradients(gen, dtype, rel):
    q, k, v = randn(gen, 1, 4, 9, 16, dtype=dtype), *(randn(gen, 1, 2, 6, 16, dtype=dtype)
                                                        for _ in range(2))
    dout = randn(gen, 1, 4, 9, 16)
    got, want = grads(q, k, v, dout, is_causal=True, enable_gqa=True)
    peer = peer_grads(q, k, v, dout, is_causal=True, enable_gqa=True) or want
    for name, g, w, p in zip(("out", "dq", "dk", "dv"), got, want, peer):
        assert g.dtype == dtype and p.dtype in (dtype, torch.float64), name
        assert (g.double() - w).abs().max().item() <= rel * w.abs().max().item() + 1e-6, name
        # torch's own 16-bit result rounds too: within twice the bound of the reference
        assert (g.double() - p.double()).abs().max().item() <= (
            2 * rel * w.abs().max().item() + 1e-6), name


@needs_backward
def test_without_grad_no_graph_is_built(gen):
    q, k, v = (randn(gen, 1, 2, 5, 8).requires_grad_() for _ in range(3))
    assert sdpa_fn(q, k, v).requires_grad
    with torch.no_grad():
        assert not sdpa_fn(q, k, v).requires_grad
    assert not sdpa_fn(*(x.detach() for x in (q, k, v))).requires_grad


def test_errors(gen):
    q, k, v = randn(gen, 1, 4, 3, 8), randn(gen, 1, 2, 5, 8), randn(gen, 1, 2, 5, 8)
    q2 = randn(gen, 1, 2, 3, 8)
    with pytest.raises(NotImplementedError, match="dropout_p=0.1: sdpa has no dropout"):
        sdpa_fn(q2, k, v, dropout_p=0.1)
    with pytest.raises(TypeError, match="dropout_p must be a real number"):
        sdpa_fn(q2, k, v, dropout_p="0")
    with pytest.raises(ValueError, match="is_causal=True and attn_mask"):
        sdpa_fn(q2, k, v, attn_mask=torch.ones(3, 5, dtype=torch.bool), is_causal=True)
    with pytest.raises(ValueError, match="query has 4 heads and key and value 2: pass enable_gqa"):
        sdpa_fn(q, k, v)
    with pytest.raises(ValueError, match="query's 4 heads must be a multiple of key and value's 3"):
        sdpa_fn(q, *(randn(gen, 1, 3, 5, 8) for _ in range(2)), enable_gqa=True)
    with pytest.raises(ValueError, match="key has 2 heads and value 1"):
        sdpa_fn(q, k, v[:, :1], enable_gqa=True)
    with pytest.raises(NotImplementedError, match="attn_mask requires grad"):
        sdpa_fn(q2, k, v, attn_mask=torch.zeros(3, 5, requires_grad=True))
    with pytest.raises(TypeError, match="attn_mask: dtype torch.int32"):
        sdpa_fn(q2, k, v, attn_mask=torch.zeros(3, 5, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"attn_mask of shape \(3, 4\) does not broadcast"):
        sdpa_fn(q2, k, v, attn_mask=torch.zeros(3, 4))
    with pytest.raises(ValueError, match=r"attn_mask of shape \(1, 1, 1, 3, 5\) has more axes"):
        sdpa_fn(q2, k, v, attn_mask=torch.zeros(1, 1, 1, 3, 5))
    with pytest.raises(TypeError, match="query: dtype torch.float64"):
        sdpa_fn(q2.double(), k, v)
    with pytest.raises(TypeError, match="value: expected a torch tensor"):
        sdpa_fn(q2, k, v.numpy())
    with pytest.raises(ValueError, match="key: expected at least 2 axes"):
        sdpa_fn(q2, k[0, 0, 0], v)
    with pytest.raises(ValueError, match="the same number of axes"):
        sdpa_fn(q2, k[0], v[0])
    with pytest.raises(ValueError, match="the same leading axes"):
        sdpa_fn(randn(gen, 2, 2, 3, 8), k, v)
    with pytest.raises(ValueError, match="is 0 in float32"):
        sdpa_fn(q2, k, v, scale=0.0)
    with pytest.raises(ValueError, match="do not match"):
        sdpa_fn(q2, k, v[:, :, :4])
    # the mask's gradient is not needed without grad mode, so the call goes through
    with torch.no_grad():
        sdpa_fn(q2, k, v, attn_mask=torch.zeros(3, 5, requires_grad=True))
