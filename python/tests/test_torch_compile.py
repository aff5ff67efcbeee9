"""sdpa's torch.library custom op (torch >= 2.4): its registration checked by torch's own
opcheck, and torch.compile keeping it in one graph, with the eager results and gradients."""

import math

import pytest

torch = pytest.importorskip("torch")

import sdpa  # noqa: E402
import sdpa.torch  # noqa: E402

pytestmark = pytest.mark.skipif(
    sdpa.torch._custom_op is None,
    reason=f"torch {torch.__version__} has no torch.library.custom_op (2.4 and later)")
needs_backward = pytest.mark.skipif(
    not sdpa._core.api.has("mha_backward_f32"),
    reason="the loaded libsdpa has no sdpa_mha_backward_f32")


@pytest.fixture
def gen(rng):
    return torch.Generator().manual_seed(int(rng.integers(2**31)))


def randn(gen, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=gen).to(dtype)


@needs_backward
@pytest.mark.parametrize("case", ["plain", "causal", "float mask", "gqa", "bfloat16"])
def test_opcheck(gen, case):
    # schema, fake (shape-only) implementation, autograd registration, AOT dispatch
    shape_kv = (2, 2, 11, 16) if case == "gqa" else (2, 4, 11, 16)
    dtype = torch.bfloat16 if case == "bfloat16" else torch.float32
    q = randn(gen, 2, 4, 7, 16, dtype=dtype).requires_grad_()
    k, v = (randn(gen, *shape_kv, dtype=dtype).requires_grad_() for _ in range(2))
    mask = randn(gen, 7, 11) if case == "float mask" else None
    scale = 0.3 if case == "float mask" else None
    args = (q, k, v, mask, case == "causal", scale)
    result = torch.library.opcheck(torch.ops.sdpa.attention.default, args)
    assert all(r == "SUCCESS" for r in result.values()), result


class Block(torch.nn.Module):
    """A causal self-attention block with grouped-query heads, as a decoder layer has."""

    def __init__(self, dim=64, heads=4, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.d = heads, kv_heads, dim // heads
        self.q = torch.nn.Linear(dim, dim)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * self.d)
        self.o = torch.nn.Linear(dim, dim)

    def forward(self, x, mask=None):
        b, n, _ = x.shape
        q = self.q(x).view(b, n, self.heads, self.d).transpose(1, 2)
        k, v = self.kv(x).view(b, n, 2, self.kv_heads, self.d).permute(2, 0, 3, 1, 4)
        y = sdpa.torch.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=True)
        return self.o(y.transpose(1, 2).reshape(b, n, -1))


def graphs_of(fn, *args):
    """The FX graphs dynamo hands its backend when compiling fn (fullgraph: a break raises)."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=backend, fullgraph=True)(*args)
    return graphs


def test_dynamo_keeps_the_op_in_one_graph(gen):
    block = Block()
    x = randn(gen, 2, 9, 64)
    explanation = torch._dynamo.explain(block)(x)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    (graph,) = graphs_of(block, x)
    targets = [str(n.target) for n in graph.graph.nodes if n.op == "call_function"]
    assert "sdpa.attention.default" in targets, targets


@needs_backward
def test_compiled_module_gives_the_eager_result_and_gradients(gen):
    torch.manual_seed(int(torch.randint(2**31, (1,), generator=gen)))
    block = Block()
    x = randn(gen, 2, 9, 64)
    mask = randn(gen, 9, 9)  # an added float mask, besides is_causal
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True)  # inductor, torch's default
    for m in (None, mask):
        want = block(x, m)
        want.square().sum().backward()
        want_grads = [p.grad.clone() for p in block.parameters()]
        block.zero_grad()
        got = compiled(x, m)
        got.square().sum().backward()
        tol = 1e-5 * want.abs().max().item()
        assert (got - want).abs().max().item() <= tol
        for p, w in zip(block.parameters(), want_grads):
            assert (p.grad - w).abs().max().item() <= 1e-5 * w.abs().max().item() + 1e-7
        block.zero_grad()
    # and both agree with torch's own attention, computed in float64
    xd = x.double()
    b, n, _ = x.shape
    with torch.no_grad():
        q = torch.nn.functional.linear(xd, block.q.weight.double(), block.q.bias.double())
        kv = torch.nn.functional.linear(xd, block.kv.weight.double(), block.kv.bias.double())
        q = q.view(b, n, 4, 16).transpose(1, 2)
        k, v = kv.view(b, n, 2, 2, 16).permute(2, 0, 3, 1, 4)
        k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
        s = q @ k.transpose(-1, -2) / math.sqrt(16)
        s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), -math.inf)
        y = torch.softmax(s, dim=-1) @ v
        ref = torch.nn.functional.linear(y.transpose(1, 2).reshape(b, n, -1),
                                         block.o.weight.double(), block.o.bias.double())
        assert (compiled(x) - ref).abs().max().item() <= 1e-5 * ref.abs().max().item()


MODS = ("window", "softcap", "sinks", "alibi_slopes", "segments")


def op_mods(gen, field):
    """One modifier (or all) for heads 4, batch 2, 7 queries and 7 keys, sinks requiring grad."""
    values = {"window": (3, None), "softcap": 2.0,
              "sinks": randn(gen, 4).requires_grad_(),
              "alibi_slopes": 0.3 * torch.rand(4, generator=gen),
              "segments": (torch.tensor([0, 0, 0, 1, 1, 2, 2], dtype=torch.int32),) * 2}
    return values if field == "all" else {field: values[field]}


@needs_backward
@pytest.mark.parametrize("field", ["window", "sinks", "all"])
def test_opcheck_with_modifiers(gen, field):
    q = randn(gen, 2, 4, 7, 16).requires_grad_()
    k, v = (randn(gen, 2, 2, 7, 16).requires_grad_() for _ in range(2))
    mods = sdpa.torch._op_mods(*(op_mods(gen, field).get(f) for f in MODS))
    result = torch.library.opcheck(torch.ops.sdpa.attention.default,
                                   (q, k, v, None, True, None) + mods)
    assert all(r == "SUCCESS" for r in result.values()), result


@needs_backward
def test_compiled_call_with_modifiers_is_one_graph_with_the_eager_gradients(gen):
    mods = op_mods(gen, "all")
    q = randn(gen, 2, 4, 7, 16).requires_grad_()
    k, v = (randn(gen, 2, 2, 7, 16).requires_grad_() for _ in range(2))
    inputs = (q, k, v, mods["sinks"])

    def fn(q, k, v, sinks):
        return sdpa.attention(q, k, v, causal=True, **dict(mods, sinks=sinks)).square().sum()

    (graph,) = graphs_of(fn, *inputs)  # fullgraph: a break raises
    targets = [str(n.target) for n in graph.graph.nodes if n.op == "call_function"]
    assert "sdpa.attention.default" in targets, targets
    want = torch.autograd.grad(fn(*inputs), inputs)
    torch._dynamo.reset()
    got = torch.autograd.grad(torch.compile(fn, fullgraph=True)(*inputs), inputs)
    for g, w in zip(got, want):
        assert (g - w).abs().max().item() <= 1e-5 * w.abs().max().item() + 1e-7


def test_eager_calls_do_not_go_through_the_op(gen, monkeypatch):
    # outside compilation, the autograd.Function path (no dispatcher cost) serves eager calls
    calls = []
    real = sdpa.torch._custom_op
    monkeypatch.setattr(sdpa.torch, "_custom_op", lambda *a: calls.append(1) or real(*a))
    q = randn(gen, 1, 2, 5, 8)
    sdpa.torch.scaled_dot_product_attention(q, q, q)
    assert calls == []
