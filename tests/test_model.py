"""bertlab's BERT equals Hugging Face transformers (fp32, max abs diff <= 1e-5)."""

from __future__ import annotations

import pytest
import torch

from bertlab.loading import load
from bertlab.model import MissingHeadError

TOL = 1e-5
ARCHS = ["BertForPreTraining", "BertForMaskedLM", "BertModel"]


def _batch(vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (3, 17), generator=g)
    ids[:, 0] = 2  # any id works; keep a [CLS]-like start
    types = torch.zeros_like(ids)
    types[:, 9:] = 1
    mask = torch.ones_like(ids)
    mask[1, 12:] = 0  # padding in one row
    mask[2, 5:] = 0
    return ids, types, mask


def _hf(folder, arch):
    import transformers

    return getattr(transformers, arch).from_pretrained(folder, attn_implementation="eager").eval()


def _max_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    d = (a - b).detach().abs()
    if mask is not None:
        d = d[mask.bool()]
    return float(d.max())


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("path", ["eager", "sdpa"])
def test_tiny_checkpoint_equals_transformers(tiny_checkpoints, arch, path):
    folder = tiny_checkpoints[arch]
    model, _ = load(folder)
    model.set_attn_implementation(path)
    hf = _hf(folder, arch)
    ids, types, mask = _batch(model.config.vocab_size)
    with torch.no_grad():
        out, cache = model.run_with_cache(ids, types, mask, names=lambda n: n.endswith(("hook_resid_post", "hook_out")))
        ref = hf(input_ids=ids, token_type_ids=types, attention_mask=mask, output_hidden_states=True,
                 output_attentions=True)
        if path == "eager":  # the pattern hooks switch the model to eager attention; read them there
            _, pat = model.run_with_cache(ids, types, mask, names=lambda n: n.endswith("hook_pattern"))
            for i, a in enumerate(ref.attentions):
                assert _max_diff(pat.layer(i, "hook_pattern"), a) <= TOL
    hidden = ref.hidden_states
    assert _max_diff(cache["bert.embeddings.hook_out"], hidden[0], mask) <= TOL
    for i in range(model.config.num_hidden_layers):
        assert _max_diff(cache.layer(i, "hook_resid_post"), hidden[i + 1], mask) <= TOL
    if arch == "BertModel":
        assert _max_diff(out.last_hidden_state, ref.last_hidden_state, mask) <= TOL
        assert _max_diff(out.pooler_output, ref.pooler_output) <= TOL
    if arch == "BertForPreTraining":
        assert _max_diff(out.mlm_logits, ref.prediction_logits, mask) <= TOL
        assert _max_diff(out.nsp_logits, ref.seq_relationship_logits) <= TOL
        assert model.has_mlm and model.has_nsp
    if arch == "BertForMaskedLM":
        assert _max_diff(out.mlm_logits, ref.logits, mask) <= TOL
        assert model.has_mlm and not model.has_nsp and model.bert.pooler is None


@pytest.mark.parametrize("arch,field", [("BertForSequenceClassification", "logits"),
                                        ("BertForTokenClassification", "logits"),
                                        ("BertForQuestionAnswering", "start_logits")])
def test_task_heads_equal_transformers(tiny_checkpoints, arch, field):
    folder = tiny_checkpoints[arch]
    model, _ = load(folder)
    hf = _hf(folder, arch)
    ids, types, mask = _batch(model.config.vocab_size, seed=1)
    with torch.no_grad():
        out = model(ids, types, mask)
        ref = hf(input_ids=ids, token_type_ids=types, attention_mask=mask)
    ours, theirs = getattr(out, field), getattr(ref, field)
    valid = mask if ours.dim() >= 2 and ours.shape[:2] == mask.shape else None
    assert _max_diff(ours, theirs, valid) <= TOL
    if arch == "BertForQuestionAnswering":
        assert _max_diff(out.end_logits, ref.end_logits, mask) <= TOL


def test_offline_default_equals_transformers(bare_default, minilm_folder):
    from transformers import BertModel

    model, tok = bare_default
    hf = BertModel.from_pretrained(minilm_folder, attn_implementation="eager").eval()
    batch = tok.encode_batch(["The river bank was muddy after the rain.", "Ich zahle Geld auf der Bank ein. 東京 🙂"],
                             ["She sat down by the water.", "short"])
    args = (batch.input_ids, batch.token_type_ids, batch.attention_mask)
    with torch.no_grad():
        ref = hf(input_ids=args[0], token_type_ids=args[1], attention_mask=args[2],
                 output_attentions=True, output_hidden_states=True)
        out, cache = model.run_with_cache(*args)
        fast = model(*args)  # nothing hooked: the fused path
    assert not model.bert.encoder.layer[0].attention.self.uses_eager()
    m = batch.attention_mask
    for i in range(model.config.num_hidden_layers):
        assert _max_diff(cache.layer(i, "hook_pattern"), ref.attentions[i]) <= TOL
        assert _max_diff(cache.layer(i, "hook_resid_post"), ref.hidden_states[i + 1], m) <= TOL
    assert _max_diff(out.last_hidden_state, ref.last_hidden_state, m) <= TOL
    assert _max_diff(fast.last_hidden_state, ref.last_hidden_state, m) <= TOL
    assert _max_diff(out.pooler_output, ref.pooler_output) <= TOL


def test_head_mask_same_on_both_paths_and_equals_zeroed_pattern(tiny_checkpoints):
    model, _ = load(tiny_checkpoints["BertModel"])
    ids, types, mask = _batch(model.config.vocab_size, seed=2)
    head_mask = torch.ones(2, 4)
    head_mask[0, 1] = 0
    head_mask[1, 3] = 0
    with torch.no_grad():
        model.set_attn_implementation("eager")
        eager = model(ids, types, mask, head_mask=head_mask).last_hidden_state
        model.set_attn_implementation("sdpa")
        fused = model(ids, types, mask, head_mask=head_mask).last_hidden_state
        plain = model(ids, types, mask).last_hidden_state
        model.set_attn_implementation("sdpa")

        def zero(pattern, name):  # reference: switch the head off by zeroing its pattern
            layer = int(name.split(".layer.")[1].split(".")[0])
            return pattern * head_mask[layer].view(1, -1, 1, 1)

        with model.hooks([(lambda n: n.endswith("hook_pattern"), zero)]):
            hooked = model(ids, types, mask).last_hidden_state
    assert _max_diff(eager, fused, mask) <= TOL
    assert _max_diff(eager, hooked, mask) <= TOL
    assert _max_diff(eager, plain, mask) > 1e-3  # the mask really changed something


def test_a_pattern_hook_runs_the_model_eager_while_it_is_on(tiny_checkpoints):
    """The attention implementation is the model's ("sdpa" by default); a hook on the scores or the pattern
    switches every layer to "eager" for the block, and the block's end switches back."""
    model, _ = load(tiny_checkpoints["BertModel"])
    impls = lambda: {m.attn_implementation for m in model.modules() if hasattr(m, "attn_implementation")}  # noqa: E731
    assert impls() == {"sdpa"}
    with model.hooks([("bert.encoder.layer.0.hook_resid_post", lambda x, n: None)]):
        assert impls() == {"sdpa"}  # nothing only eager computes is read
    with model.hooks([("bert.encoder.layer.1.attention.self.hook_pattern", lambda x, n: None)]):
        assert impls() == {"eager"}
    assert impls() == {"sdpa"}
    model.set_attn_implementation("eager")
    with model.hooks([("bert.encoder.layer.0.hook_resid_post", lambda x, n: None)]):
        assert impls() == {"eager"}
    assert impls() == {"eager"}
    with pytest.raises(ValueError, match="attn_implementation must be one of eager, sdpa"):
        model.set_attn_implementation("auto")


def test_hooks_are_removed_even_after_an_error(tiny_checkpoints):
    model, _ = load(tiny_checkpoints["BertModel"])
    ids, types, mask = _batch(model.config.vocab_size)

    def boom(x, name):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        with model.hooks([("bert.encoder.layer.0.hook_resid_pre", boom)]):
            model(ids)
    assert not any(p.active for p in model.hook_points.values())
    model(ids)  # runs again without the hook


def test_hook_points_are_plain_modules_whose_torch_hooks_run(tiny_checkpoints):
    """A hook point without hooks hands back its input as it is; torch's own hooks on it (per module, pre-hooks,
    and hooks for every module) run, as on any module."""
    model, _ = load(tiny_checkpoints["BertModel"])
    ids = _batch(model.config.vocab_size)[0]
    point = model.hook_points["bert.encoder.layer.0.hook_resid_mid"]
    x = torch.randn(2, 3)
    assert point(x) is x
    seen: list[str] = []
    handles = [point.register_forward_pre_hook(lambda m, args: seen.append("pre")),
               point.register_forward_hook(lambda m, args, out: seen.append("post"))]
    with torch.no_grad():
        model(ids)
    for h in handles:
        h.remove()
    assert seen == ["pre", "post"]
    everywhere: set[str] = set()
    names = {m: n for n, m in model.named_modules()}
    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda m, args, out: everywhere.add(names.get(m, "")))
    try:
        with torch.no_grad():
            model(ids)
    finally:
        handle.remove()
    plain = {n for n in model.hook_points if n.rsplit(".", 1)[1] in ("hook_resid_pre", "hook_resid_mid",
                                                                      "hook_resid_post", "hook_q", "hook_z")}
    assert len(plain) == 5 * model.family.num_layers and plain <= everywhere  # called as modules, as before
    assert point(x) is x


def test_hook_can_edit_activation_and_names_are_checked(tiny_checkpoints):
    model, _ = load(tiny_checkpoints["BertModel"])
    ids = _batch(model.config.vocab_size)[0]
    with torch.no_grad():
        base = model(ids).last_hidden_state
        with model.hooks([("bert.embeddings.hook_position", lambda x, n: torch.zeros_like(x))]):
            edited = model(ids).last_hidden_state
    assert _max_diff(base, edited) > 1e-3
    with pytest.raises(KeyError, match="no hook point named"):
        model.run_with_cache(ids, names=["bert.encoder.layer.9.hook_nothing"])


def test_cache_shapes_and_embedding_parts_sum(default_model):
    model, tok = default_model
    b = tok.encode_batch(["a short sentence"], ["and a second"])
    with torch.no_grad():
        _, cache = model.run_with_cache(b.input_ids, b.token_type_ids, b.attention_mask)
    s, h, d = b.input_ids.shape[1], 12, 384
    assert cache["bert.encoder.layer.2.attention.self.hook_pattern"].shape == (1, h, s, s)
    assert cache["bert.encoder.layer.2.attention.self.hook_q"].shape == (1, s, h, d // h)
    assert cache["bert.encoder.layer.2.attention.output.hook_result"].shape == (1, s, h, d)
    e = "bert.embeddings."
    parts = cache[e + "hook_word"] + cache[e + "hook_token_type"] + cache[e + "hook_position"]
    assert torch.allclose(parts, cache[e + "hook_sum"])
    # per-head results plus the bias give the attention output
    res = cache["bert.encoder.layer.2.attention.output.hook_result"].sum(2)
    bias = model.bert.encoder.layer[2].attention.output.dense.bias
    assert _max_diff(res + bias, cache["bert.encoder.layer.2.attention.output.hook_attn_out"]) <= 1e-4
    assert cache.stack("hook_pattern").shape == (6, 1, h, s, s)


def test_missing_heads_are_reported_and_refused_clearly(bare_default):
    model, _ = bare_default
    assert not model.has_mlm and not model.has_nsp
    assert "no MLM head" in " ".join(model.load_report.notes)
    with pytest.raises(MissingHeadError, match="pre-training tab"):
        model.require("mlm")


def test_mlm_positions_only_project_masked_tokens(tiny_checkpoints):
    model, _ = load(tiny_checkpoints["BertForMaskedLM"])
    ids, types, mask = _batch(model.config.vocab_size)
    pos = torch.zeros_like(ids, dtype=torch.bool)
    pos[0, 3] = pos[1, 5] = pos[2, 1] = True
    with torch.no_grad():
        full = model(ids, types, mask).mlm_logits
        part = model(ids, types, mask, mlm_positions=pos).mlm_logits
    assert part.shape == (3, model.config.vocab_size)
    assert _max_diff(part, full[pos]) <= TOL


def test_with_heads_keeps_encoder_and_adds_fresh_heads(default_model):
    model, tok = default_model
    new = model.with_heads(["mlm", "nsp"])
    assert new.has_mlm and new.has_nsp
    assert new.cls.predictions.decoder.weight is new.bert.embeddings.word_embeddings.weight
    b = tok.encode_batch(["hello world"])
    with torch.no_grad():
        a = model(b.input_ids).last_hidden_state
        c = new.eval()(b.input_ids)
    assert _max_diff(a, c.last_hidden_state) == 0.0
    assert c.mlm_logits.shape[-1] == tok.vocab_size and c.nsp_logits.shape == (1, 2)


def test_too_long_input_is_refused_with_a_message(tiny_checkpoints):
    model, _ = load(tiny_checkpoints["BertModel"])
    with pytest.raises(ValueError, match="reads at most 64"):
        model(torch.ones(1, 65, dtype=torch.long))
