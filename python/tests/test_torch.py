"""sdpa on torch tensors: forward against torch's own attention and the float64 reference,
gradients against torch autograd of the textbook formula in float64."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import sdpa  # noqa: E402
import sdpa.torch  # noqa: E402
from conftest import reference  # noqa: E402

has_backward = sdpa._core.api.has("mha_backward_f32")
needs_backward = pytest.mark.skipif(
    not has_backward, reason="the loaded libsdpa has no sdpa_mha_backward_f32")


@pytest.fixture
def gen(rng):
    return torch.Generator().manual_seed(int(rng.integers(2**31)))


def randn(gen, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=gen).to(dtype)


def scores(q, k, causal, mask, scale):
    """scale q k^T plus a float mask, -inf where causality or a False bool mask entry removes the
    key (k has as many heads as q)."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = scale * q @ k.transpose(-1, -2)
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else s + mask.double()
    if causal:
        lq, lkv = s.shape[-2:]
        s = s.masked_fill(~torch.ones(lq, lkv, dtype=torch.bool).tril(lkv - lq), -math.inf)
    return s


def weights(s):
    """The softmax of each row of s, zeros for a row that sees no key (as sdpa gives) rather than
    NaN; the max is only a shift, so it carries no gradient."""
    m = s.detach().amax(dim=-1, keepdim=True)
    e = torch.exp(s - torch.where(torch.isfinite(m), m, torch.zeros_like(m)))
    z = e.sum(dim=-1, keepdim=True)
    return e / torch.where(z > 0, z, torch.ones_like(z))


def textbook(q, k, v, causal=False, mask=None, scale=None, layout="bhsd"):
    """softmax(scale q k^T + mask) v by torch operations, differentiable (float64 in, float64
    out); GQA by repeating the kv heads."""
    if q.dim() == 2:
        q, k, v = q[None, None], k[None, None], v[None, None]
        two_d = True
    else:
        two_d = False
        if layout == "bshd":
            q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    out = weights(scores(q, k, causal, mask, scale)) @ v
    if two_d:
        return out[0, 0]
    return out.transpose(1, 2) if layout == "bshd" else out


def f64(*xs):
    return [x.detach().double().requires_grad_() for x in xs]


def bound(v):
    return 1e-5 * v.detach().abs().max().item() + 1e-7


def torch_attention(q, k, v, mask):
    """torch's own attention: the public function from 2.0, the private one in 1.13."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return F._scaled_dot_product_attention(q, k, v, mask, 0.0, False, False)[0]


def test_tensors_in_tensors_out_against_torchs_attention(gen):
    q, k, v = randn(gen, 2, 8, 33, 64), randn(gen, 2, 8, 47, 64), randn(gen, 2, 8, 47, 64)
    out = sdpa.attention(q, k, v)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    theirs = torch_attention(q, k, v, None)
    assert (out - theirs).abs().max().item() <= 4 * bound(v)
    mask = torch.rand(33, 47, generator=gen) < 0.7
    out = sdpa.attention(q, k, v, mask=mask)
    theirs = torch_attention(q, k, v, mask.expand(2, 8, 33, 47))
    assert (out - theirs).abs().max().item() <= 4 * bound(v)


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_forward_matches_the_float64_reference(gen, layout):
    shape = (lambda b, h, s, d: (b, h, s, d)) if layout == "bhsd" else (lambda b, h, s, d: (b, s, h, d))
    q, k, v = randn(gen, *shape(2, 6, 20, 32)), randn(gen, *shape(2, 3, 29, 32)), randn(gen, *shape(2, 3, 29, 16))
    mask = torch.randn(2, 1, 20, 29, generator=gen)
    out, lse = sdpa.attention(q, k, v, causal=True, mask=mask, layout=layout, return_lse=True)
    ref, ref_lse = reference(q.numpy(), k.numpy(), v.numpy(), causal=True, mask=mask.numpy(),
                             layout=layout)
    assert np.abs(out.numpy() - ref).max() <= bound(v)
    assert np.abs(lse.numpy() - ref_lse).max() <= 1e-5 * np.abs(ref_lse).max()


@pytest.mark.parametrize("dtype,rel", [(torch.float16, 2.0**-11), (torch.bfloat16, 2.0**-8)])
def test_16_bit_tensors(gen, dtype, rel):
    q, k, v = (randn(gen, 1, 4, 17, 64, dtype=dtype) for _ in range(3))
    out = sdpa.attention(q, k, v)
    assert out.dtype == dtype
    ref, _ = reference(*(x.float().numpy() for x in (q, k, v)))
    err = np.abs(out.float().numpy() - ref)
    assert np.all(err <= bound(v.float()) + rel * np.abs(ref) + 2.0**-24)


def test_strided_tensors_are_read_in_place(gen):
    q = randn(gen, 2, 12, 4, 32).transpose(1, 2)  # bshd storage seen as bhsd
    k = randn(gen, 2, 4, 40, 48)[:, :, ::2, :32]
    v = randn(gen, 1, 4, 20, 16).expand(2, 4, 20, 16)
    ref, _ = reference(q.numpy(), k.numpy(), v.numpy())
    out = sdpa.attention(q, k, v)
    assert np.abs(out.numpy() - ref).max() <= bound(v)


def test_errors(gen):
    q, k, v = randn(gen, 1, 2, 3, 8), randn(gen, 1, 2, 4, 8), randn(gen, 1, 2, 4, 8)
    with pytest.raises(TypeError, match="k: expected a torch tensor, as q is"):
        sdpa.attention(q, k.numpy(), v.numpy())
    with pytest.raises(TypeError, match="k: expected a NumPy array, as q is"):
        sdpa.attention(q.numpy(), k, v)
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        sdpa.attention(q.double(), k, v)
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        sdpa.attention(q, k.to(torch.int32), v)
    with pytest.raises(ValueError, match="do not match"):
        sdpa.attention(q, k, v[:, :, :3])
    with pytest.raises(ValueError, match="finite"):
        sdpa.attention(q, k, v, scale=math.inf)
    with pytest.raises(ValueError, match="is 0 in float32"):
        sdpa.attention(q, k, v, scale=1e-50)
    with pytest.raises(ValueError, match="broadcast"):
        sdpa.attention(q, k, v, mask=torch.ones(3, 5, dtype=torch.bool))
    with pytest.raises(TypeError):
        sdpa.softmax(q.double())


def test_softmax_on_tensors(gen):
    x = randn(gen, 4, 9, 33)
    y = sdpa.softmax(x, scale=0.7, axis=1)
    assert isinstance(y, torch.Tensor) and y.shape == x.shape
    assert (y - torch.softmax(0.7 * x.double(), dim=1)).abs().max().item() <= 2e-5


def grads_case(gen, layout, b, hq, hkv, lq, lkv, dk, dv):
    shape = (lambda h, s, d: (b, h, s, d)) if layout == "bhsd" else (lambda h, s, d: (b, s, h, d))
    q, k, v = randn(gen, *shape(hq, lq, dk)), randn(gen, *shape(hkv, lkv, dk)), randn(gen, *shape(hkv, lkv, dv))
    dout = randn(gen, *shape(hq, lq, dv))
    return q, k, v, dout


def to_bhsd(x, layout):
    if x.dim() == 2:
        return x[None, None]
    return x.transpose(1, 2) if layout == "bshd" else x


def from_bhsd(x, like, layout):
    if like.dim() == 2:
        return x[0, 0]
    return x.transpose(1, 2) if layout == "bshd" else x


def grad_bounds(q, k, v, dout, causal=False, mask=None, scale=None, layout="bhsd"):
    """sdpa.h's accuracy bound of sdpa_mha_backward_f32 per element of dq, dk and dv, from
    float64 P: with E_ij = P_ij (|dP_ij| + |D_i| + sum_c |dout_ic v_jc| + sum_c |dout_ic out_ic|),
    |err dv_jc| <= 1e-5 sum_i P_ij |dout_ic|, |err dk_jc| <= 1e-5 |scale| sum_i E_ij |q_ic|,
    |err dq_ic| <= 1e-5 |scale| sum_j E_ij |k_jc|, each plus 1e-30; dk and dv summed over the
    query heads of a group."""
    like = (q, k, v)
    q, k, v, dout = (to_bhsd(x.detach().double(), layout) for x in (q, k, v, dout))
    hkv, group = k.shape[1], q.shape[1] // k.shape[1]
    kr, vr = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    p = weights(scores(q, kr, causal, mask, scale))
    out = p @ vr
    dp = dout @ vr.transpose(-1, -2)
    d_row = (dout * out).sum(-1, keepdim=True)
    big_e = p * (dp.abs() + d_row.abs() + dout.abs() @ vr.abs().transpose(-1, -2)
                 + (dout * out).abs().sum(-1, keepdim=True))

    def per_kv_head(x):  # (b, hq, len_kv, d) -> (b, hkv, len_kv, d)
        return x.reshape(x.shape[0], hkv, group, *x.shape[2:]).sum(2)

    dv_b = 1e-5 * per_kv_head(p.transpose(-1, -2) @ dout.abs()) + 1e-30
    dk_b = 1e-5 * abs(scale) * per_kv_head(big_e.transpose(-1, -2) @ q.abs()) + 1e-30
    dq_b = 1e-5 * abs(scale) * (big_e @ kr.abs()) + 1e-30
    return [from_bhsd(x, y, layout) for x, y in zip((dq_b, dk_b, dv_b), like)]


def check_grads(q, k, v, dout, **kw):
    qs, ks, vs = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = sdpa.torch.attention(qs, ks, vs, **kw)
    out.backward(dout)
    qd, kd, vd = f64(q, k, v)
    ref = textbook(qd, kd, vd, **kw)
    ref.backward(dout.double())
    assert (out.detach().double() - ref.detach()).abs().max().item() <= bound(v)
    bounds = grad_bounds(q, k, v, dout, **kw)
    for name, got, want, b in zip(("dq", "dk", "dv"), (qs.grad, ks.grad, vs.grad),
                                  (qd.grad, kd.grad, vd.grad), bounds):
        assert got.shape == want.shape and got.dtype == torch.float32
        ratio = ((got.double() - want).abs() / b).max().item()
        assert ratio <= 1, f"{name}: an error {ratio:.3g} times sdpa.h's bound"


@needs_backward
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_gradients_match_torch_autograd_in_float64(gen, layout):
    cases = [(4, 4, 16, 16, False), (8, 2, 13, 40, True), (4, 1, 33, 9, False),
             (4, 2, 20, 9, True)]  # the last: 11 query rows see no key
    for hq, hkv, lq, lkv, causal in cases:
        q, k, v, dout = grads_case(gen, layout, 2, hq, hkv, lq, lkv, 32, 24)
        check_grads(q, k, v, dout, causal=causal, layout=layout)


@needs_backward
def test_gradients_with_masks_and_scale(gen):
    q, k, v, dout = grads_case(gen, "bhsd", 1, 4, 2, 11, 19, 16, 16)
    mask = torch.rand(1, 4, 11, 19, generator=gen) < 0.7
    mask[0, 0, 3] = False  # a row that sees nothing contributes nothing
    check_grads(q, k, v, dout, mask=mask)
    check_grads(q, k, v, dout, mask=torch.randn(11, 19, generator=gen), scale=0.3)


@needs_backward
def test_gradients_of_strided_and_2d_inputs(gen):
    q = randn(gen, 1, 20, 2, 32).transpose(1, 2)
    k = randn(gen, 1, 2, 40, 32)[:, :, ::2]
    v = randn(gen, 1, 1, 20, 32).expand(1, 2, 20, 32)
    check_grads(q, k, v, randn(gen, 1, 2, 20, 32), causal=True)
    check_grads(randn(gen, 7, 16), randn(gen, 12, 16), randn(gen, 12, 8), randn(gen, 7, 8))


@needs_backward
def test_gradcheck_at_float32_tolerance(gen):
    q, k, v = (randn(gen, 1, 2, 5, 8).double().requires_grad_() for _ in range(3))

    def f(q, k, v):
        return sdpa.torch.attention(q.float(), k.float(), v.float(), causal=True).double()

    assert torch.autograd.gradcheck(f, (q, k, v), eps=1e-2, atol=5e-3, rtol=5e-3)


@needs_backward
def test_16_bit_gradients_are_their_inputs_types(gen):
    q, k, v = (randn(gen, 1, 2, 8, 16, dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    out = sdpa.torch.attention(q, k, v)
    out.float().sum().backward()
    assert q.grad.dtype == k.grad.dtype == v.grad.dtype == torch.bfloat16
    qd, kd, vd = f64(q, k, v)
    textbook(qd, kd, vd).sum().backward()
    for got, want in [(q.grad, qd.grad), (k.grad, kd.grad), (v.grad, vd.grad)]:
        assert (got.double() - want).abs().max().item() <= 2.0**-7 * want.abs().max().item() + 1e-2 * 2.0**-7


@needs_backward
def test_sdpa_attention_on_tensors_that_require_grad_flows(gen):
    q, k, v = (randn(gen, 1, 2, 6, 8).requires_grad_() for _ in range(3))
    out, lse = sdpa.attention(q, k, v, return_lse=True)
    assert out.requires_grad and not lse.requires_grad
    out.sum().backward()
    assert q.grad is not None and k.grad is not None and v.grad is not None
    with torch.no_grad():
        assert not sdpa.attention(q, k, v).requires_grad


def test_backward_without_the_c_function_raises_not_implemented(gen, monkeypatch):
    api = sdpa._core.api
    monkeypatch.setattr(api, "struct_size", sdpa._lib._ApiTable.mha_backward_f32.offset)
    q, k, v = (randn(gen, 1, 2, 6, 8).requires_grad_() for _ in range(3))
    out = sdpa.torch.attention(q, k, v)  # the forward needs nothing new
    with pytest.raises(NotImplementedError, match="sdpa_mha_backward_f32"):
        out.sum().backward()


def test_heads_that_do_not_divide_name_the_fields(gen):
    # the status alone said "invalid size: zero where work is needed, or overflowing"
    q, k = randn(gen, 1, 8, 4, 16), randn(gen, 1, 3, 4, 16)
    with pytest.raises(ValueError, match=r"k and v have 3 heads \(heads_kv\), which must divide "
                                         r"q's 8 heads \(heads_q\)"):
        sdpa.torch.attention(q, k, k)


def test_sparse_tensors_raise_type_error(gen):
    # sdpa.attention documents TypeError for what it does not take; data_ptr raised RuntimeError
    q = randn(gen, 1, 2, 3, 8)
    with pytest.raises(TypeError, match="q: a torch.sparse_coo tensor"):
        sdpa.attention(q.to_sparse(), q, q)
    with pytest.raises(TypeError, match="v: a torch.sparse_coo tensor"):
        sdpa.attention(q, q, q.to_sparse())
    with pytest.raises(TypeError, match="mask: a torch.sparse_coo tensor"):
        sdpa.attention(q, q, q, mask=torch.zeros(3, 3).to_sparse())
    with pytest.raises(TypeError, match="softmax: x: a torch.sparse_coo tensor"):
        sdpa.softmax(q.to_sparse())


def test_jit_trace_raises_a_clear_error(gen):
    # it failed inside the binding with "TypeError: an integer is required"
    q = randn(gen, 1, 2, 3, 8)
    for f in (sdpa.attention, sdpa.torch.attention):
        with pytest.raises(NotImplementedError, match="does not support torch.jit.trace"):
            torch.jit.trace(lambda a, b, c: f(a, b, c), (q, q, q))


@pytest.mark.parametrize("name", sdpa.backends())
def test_tensors_expanded_along_len_are_copied(gen, name):
    # expand along len (stride 0) raised "invalid size"; the gradient of an expanded k or v is
    # summed back by autograd
    q = randn(gen, 1, 2, 5, 16)
    k1, v1 = randn(gen, 1, 2, 1, 16), randn(gen, 1, 2, 1, 8)
    k1.requires_grad_()
    k, v = k1.expand(1, 2, 7, 16), v1.expand(1, 2, 7, 8)
    ref, _ = reference(q.numpy(), k.detach().numpy(), v.numpy())
    with sdpa.use_backend(name):
        out = sdpa.attention(q, k, v)
        assert np.abs(out.detach().numpy() - ref).max() <= bound(v)
        if has_backward:
            out.sum().backward()
            # every key is the same, so the weights do not depend on k: its gradient is 0
            assert k1.grad.shape == k1.shape
            assert k1.grad.abs().max().item() <= 1e-5


@needs_backward
@pytest.mark.parametrize("shape_q,shape_kv", [((1, 2, 0, 8), (1, 2, 5, 8)),
                                              ((0, 2, 3, 8), (0, 2, 5, 8)),
                                              ((0, 2, 0, 8), (0, 2, 0, 8))])
def test_backward_without_query_rows_gives_zero_gradients(gen, shape_q, shape_kv):
    # the upstream gradient of an empty output is an expanded empty tensor, which raised
    # "dout: the last axis is not contiguous"
    q, k, v = (randn(gen, *s).requires_grad_() for s in (shape_q, shape_kv, shape_kv))
    out = sdpa.torch.attention(q, k, v)
    out.sum().backward()
    for x in (q, k, v):
        assert x.grad.shape == x.shape and x.grad.dtype == x.dtype
        assert not x.grad.any()


def test_empty_tensors_with_any_strides_are_taken(gen):
    # an empty tensor counts as contiguous for torch, so .contiguous() keeps its strides: a view
    # with no element is taken whatever its strides (nothing is read)
    q = torch.empty(1, 2, 0, 32)[..., ::2]
    k, v = randn(gen, 1, 2, 5, 16), randn(gen, 1, 2, 5, 8)
    assert q.stride(-1) == 2
    assert sdpa.attention(q, k, v).shape == (1, 2, 0, 8)
