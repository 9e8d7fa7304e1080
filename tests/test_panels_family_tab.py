"""The Family tab: one sentence through several family members side by side.
Tiny random checkpoints written by transformers (BertForPreTraining, RobertaForMaskedLM,
AlbertForPreTraining, an ELECTRA generator + discriminator) with tokenizers trained here; every
number on show is checked against the model itself or against transformers."""

from __future__ import annotations

import html
import math
import re

import pytest
import torch
from tiny_models import electra_pair_folders, family_folder, wordpiece

from bertlab.analysis.family import MAX_CHARS, halves, parameter_count, word_choices
from bertlab.loading import load
from bertlab.panels import family as family_panel
from bertlab.panels.app import TABS, App
from bertlab.panels.family import FamilyPanel
from bertlab.panels.state import ModelEntry, ModelState
from bertlab.tokenizer import WORD_START_MARK
from bertlab.viz import theme
from bertlab.viz.family import REPLACED

TEXT = "The quick brown fox jumps over the lazy dog. It sleeps in the sun."
BROKE = "Something went wrong"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("family-tab")
    gen, disc = electra_pair_folders(root)
    shared = wordpiece()  # a teacher and its distilled student read one vocabulary
    return {"bert": family_folder(root, "bert"), "roberta": family_folder(root, "roberta"),
            "albert": family_folder(root, "albert"), "generator": gen, "discriminator": disc,
            "teacher": family_folder(root / "teacher", "bert", tok=shared),
            "distilbert": family_folder(root / "student", "distilbert", seed=1, tok=shared)}


@pytest.fixture(scope="module")
def members(folders):
    return {name: load(str(folder)) for name, folder in folders.items()}


def _state(members, *names: str) -> ModelState:
    state = ModelState(*members[names[0]], name=names[0])
    for n in names[1:]:
        state.add(n, *members[n])
    return state


def _panel(members, *names: str) -> FamilyPanel:
    panel = FamilyPanel(*members[names[0]], state=_state(members, *names), text=TEXT)
    if len(names) > 2:
        panel.pick(*names)
    return panel


def _errors(panel) -> list[str]:
    return [t for level, t in panel.messages if level == "error"]


def _mlm_top(model, tok, text: str, start: int, end: int, k: int) -> list[tuple[str, float]]:
    """Straight from the model: hide every piece overlapping characters [start, end) behind the
    tokenizer's mask token and read the first hidden piece's top-k ordinary guesses."""
    enc = tok.encode(text)
    hidden = [i for i, (a, b) in enumerate(enc.offsets) if enc.word_ids[i] is not None and a < end and b > start]
    ids = torch.tensor([[tok.mask_token_id if i in hidden else t for i, t in enumerate(enc.ids)]])
    with torch.inference_mode():
        logits = model(ids, torch.tensor([enc.type_ids])).mlm_logits[0, hidden[0]]
    p = logits.float().softmax(-1)
    p[sorted(tok.placeholder_ids)] = -1
    values, idx = p.topk(k)
    return [(tok.id_to_token(int(i)), float(v)) for v, i in zip(values, idx)]


def test_two_models_side_by_side_tokenizers_guesses_and_parameters(members, folders):
    panel = _panel(members, "bert", "roberta")
    assert not _errors(panel) and BROKE not in panel.message.value, panel.messages
    assert [v.name for v in panel.views] == ["bert", "roberta"]
    assert set(panel.figures()) == {"tokenizers", "hidden word", "parameters"}

    # How each tokenizer cuts it: one row of chips per model, one chip per token, named by the family's kind.
    cuts = panel.figures()["tokenizers"]
    for trace, name in zip(cuts.data, ["bert", "roberta"]):
        model, tok = members[name]
        enc = tok.encode(TEXT)
        assert trace.name == name and list(trace.customdata) and len(trace.x) == len(enc.tokens)
        assert [t.split("<br>")[0] for t in trace.customdata] == [f"<b>{html.escape(t)}</b>" for t in enc.tokens]
    assert "WordPiece" in cuts.data[0].y[0] and "byte-level BPE" in cuts.data[1].y[0]
    # word starts drawn as the Input tab draws them, never the vocabulary's "Ġ"
    assert any(WORD_START_MARK in t for t in cuts.data[1].text) and not any("Ġ" in t for t in cuts.data[1].text)
    assert not any(WORD_START_MARK in t for t in cuts.data[0].text)

    # The same hidden word: each model's bars are its own top-k with its own mask token.
    word = panel.word.value
    assert word.text == "sun"  # the default: the last word of three letters or more
    guesses = panel.figures()["hidden word"]
    for trace, name in zip(guesses.data, ["bert", "roberta"]):
        model, tok = members[name]
        top = _mlm_top(model, tok, TEXT, word.start, word.end, panel.k.value)
        assert list(trace.customdata) == [t for t, _ in top]
        assert list(trace.x) == pytest.approx([p for _, p in top], abs=1e-4)
    view = {v.name: v for v in panel.views}
    assert view["roberta"].masked.mask_token == "<mask>" and view["bert"].masked.mask_token != "<mask>"

    # Parameters: each model's parts add up to what transformers counts for the same checkpoint.
    import transformers

    params = panel.figures()["parameters"]
    totals = [sum(t.x[i] for t in params.data) for i in range(2)]
    for total, name, arch in zip(totals, ["bert", "roberta"], ["BertForPreTraining", "RobertaForMaskedLM"]):
        hf = getattr(transformers, arch).from_pretrained(folders[name])
        assert total == hf.num_parameters() == sum(p.numel() for p in members[name][0].parameters())

    # Another word and k: the figure follows.
    panel.word.value = next(w for w in panel.word.options if w[1].text == "fox")[1]
    panel.k.value = 3
    assert len(panel.figures()["hidden word"].data[0].x) == 3 and panel.views[0].masked.word == "fox"


def test_albert_shared_layer_factorised_embeddings_and_sop_on_the_halves(members, folders):
    import transformers

    panel = _panel(members, "albert", "bert")
    assert not _errors(panel), panel.messages
    albert, tok = members["albert"]
    count = parameter_count(albert)
    hf = transformers.AlbertForPreTraining.from_pretrained(folders["albert"])
    assert count.total == hf.num_parameters()
    assert count.shared and count.stored_layers == 1 and count.layers == 2
    assert count.factorised and count.embedding_size == 16 and count.parts["embedding projection"] == 16 * 32 + 32
    assert count.parts["word embeddings"] == hf.config.vocab_size * 16
    per_layer = sum(p.numel() for p in hf.albert.encoder.albert_layer_groups.parameters())
    assert count.parts["encoder layers"] == per_layer and count.unshared_encoder == 2 * per_layer
    bert_count = parameter_count(members["bert"][0])
    assert not bert_count.shared and not bert_count.factorised and bert_count.stored_layers == 2
    labels = panel.figures()["parameters"].data[0].y
    assert "1 stored (shared)" in labels[0] and "embeddings 16 → 32" in labels[0] and "shared" not in labels[1]
    assert panel.figures()["parameters"].layout.shapes  # the dotted outline: what sharing saves

    # SOP on the sentence's halves, in order and swapped, straight from the SOP head.
    a, b = halves(TEXT)
    assert (a, b) == ("The quick brown fox jumps over the lazy dog.", "It sleeps in the sun.")
    pair = next(v for v in panel.views if v.name == "albert").pair
    assert pair.task == "sop"
    for first, second, shown in ((a, b, pair.in_order), (b, a, pair.swapped)):
        enc = tok.encode(first, second)
        with torch.inference_mode():
            logits = albert(torch.tensor([enc.ids]), torch.tensor([enc.type_ids])).nsp_logits[0]
        assert shown == pytest.approx(float(logits.softmax(-1)[0]), abs=1e-5)
    cards = panel.objectives.value
    assert "MLM + SOP" in cards and "MLM + NSP" in cards and f"{100 * pair.swapped:.0f}%" in cards
    assert "SentencePiece" in panel.kinds.value and "WordPiece" in panel.kinds.value


def test_roberta_card_shows_dynamic_masking(members):
    panel = _panel(members, "roberta", "bert")
    assert "no next-sentence" in panel.objectives.value and panel.objectives.value.count('class="bl-epoch"') == 3
    cells = re.findall(r'class="bl-tok"[^>]*>([^<]*)</span>', panel.objectives.value)  # the pieces on show
    assert cells and not any("Ġ" in c for c in cells) and any(WORD_START_MARK in c for c in cells)  # as the Input tab
    assert next(v for v in panel.views if v.name == "roberta").pair is None


def test_electra_pair_generator_replacements_and_discriminator_verdict(members, folders):
    panel = _panel(members, "generator", "discriminator")
    assert not _errors(panel), panel.messages
    pic = panel.picture
    gen, gtok = members["generator"]
    disc, dtok = members["discriminator"]
    enc = gtok.encode(TEXT)
    assert pic.tokens == enc.tokens
    word = panel.word.value
    hidden = [i for i, (a, b) in enumerate(enc.offsets)
              if enc.word_ids[i] is not None and a < word.end and b > word.start]
    assert hidden and all(pic.masked[i] for i in hidden)  # the chosen word is among the hidden pieces
    assert not any(pic.masked[i] for i, s in enumerate(pic.special) if s)
    ids = [gtok.token_to_id(t) for t in pic.corrupted]
    assert [c != o for c, o in zip(ids, enc.ids)] == pic.replaced  # the truth: sample differs from the original
    assert all(m or not r for m, r in zip(pic.masked, pic.replaced))  # only hidden pieces can change
    with torch.inference_mode():  # the discriminator's own verdict on what it read
        p = torch.sigmoid(disc(torch.tensor([ids])).rtd_logits[0]).tolist()
    assert pic.p_replaced == pytest.approx(p, abs=1e-5)
    import transformers

    hf = transformers.ElectraForPreTraining.from_pretrained(folders["discriminator"])
    assert parameter_count(disc).total == hf.num_parameters()
    fig = panel.figures()["ELECTRA"]
    ordinary = [i for i, s in enumerate(pic.special) if not s]
    assert list(fig.data[0].y) == pytest.approx([p[i] for i in ordinary], abs=1e-4)
    assert [c == REPLACED for c in fig.data[0].marker.color] == [pic.replaced[i] for i in ordinary]
    # The same seed draws the same; "draw again" draws anew (another seed), deterministically.
    again = FamilyPanel(gen, gtok, state=panel.state, text=TEXT)
    assert [s.value for s in again.slots[:2]] == ["generator", "discriminator"]
    assert again.picture.masked == pic.masked and again.picture.corrupted == pic.corrupted
    panel.draw_button.click()
    assert panel.seed == 1 and panel.picture.seed == 1
    assert (panel.picture.masked, panel.picture.corrupted) != (pic.masked, pic.corrupted)
    # The generator guesses the hidden word; the discriminator, with no MLM head, says so in place of bars.
    guesses = panel.figures()["hidden word"]
    assert len(guesses.data[0].x) == panel.k.value and len(guesses.data[1].x) == 0
    assert any("no MLM head" in a.text for a in guesses.layout.annotations)


def test_distilbert_depth_and_its_distillation_loss_against_the_teacher(members, folders):
    import transformers

    panel = _panel(members, "distilbert", "teacher")
    assert not _errors(panel), panel.messages
    student, stok = members["distilbert"]
    teacher, ttok = members["teacher"]
    count = parameter_count(student)
    assert count.total == transformers.DistilBertForMaskedLM.from_pretrained(folders["distilbert"]).num_parameters()
    assert count.parts["pooler"] == 0 and count.layers == 2
    assert count.parts["position + segment embeddings"] == sum(  # no segment embeddings in DistilBERT
        p.numel() for n, p in student.named_parameters() if "embeddings" in n and "word" not in n)
    name, d = panel.distilled["distilbert"]
    assert name == "teacher" and d.word == "sun"
    word = panel.word.value
    enc = stok.encode(TEXT)
    hidden = [i for i, (a, b) in enumerate(enc.offsets)
              if enc.word_ids[i] is not None and a < word.end and b > word.start]
    first = hidden[0]
    ids = torch.tensor([[stok.mask_token_id if i in hidden else t for i, t in enumerate(enc.ids)]])
    special = sorted(stok.placeholder_ids)
    with torch.no_grad():
        ls, lt = student(ids).mlm_logits[0, first].clone(), teacher(ids).mlm_logits[0, first].clone()
    ls[special] = lt[special] = -math.inf
    ps, pt = ls.log_softmax(-1), lt.log_softmax(-1)
    keep = pt.exp() > 0
    ce = float(-(pt.exp()[keep] * ps[keep]).sum())
    assert d.cross_entropy == pytest.approx(ce, abs=1e-4)
    assert d.kl == pytest.approx(float((pt.exp()[keep] * (pt[keep] - ps[keep])).sum()), abs=1e-4) and d.kl >= 0
    assert "Distillation on 'sun'" in panel.objectives.value and "MLM by distillation" in panel.objectives.value
    # Without a teacher of its vocabulary, the card says what to pick.
    alone = _panel(members, "distilbert", "roberta")
    assert alone.distilled == {} and any("distilled from a teacher" in t for _, t in alone.messages)


def test_a_discriminator_alone_shows_its_verdict_on_the_sentence_as_typed(members):
    panel = _panel(members, "discriminator", "bert")
    assert panel.picture is None and panel.replaced is not None and "ELECTRA" in panel.figures()
    assert any("discriminator" in t for _, t in panel.messages)


def test_errors_in_the_page_and_figures_cleared(members, tmp_path, monkeypatch):
    panel = _panel(members, "bert", "roberta")
    assert panel.figures()
    panel.text.value = "   "
    assert _errors(panel) == ["The sentence is empty: type a sentence first."] and panel.figures() == {}
    assert panel.objectives.value == ""
    panel.text.value = "word " * (MAX_CHARS // 4)
    assert "at most 300 characters" in _errors(panel)[0] and panel.figures() == {}
    assert len(_errors(panel)[0]) < 260  # the text is echoed short
    panel.text.value = TEXT
    assert not _errors(panel) and len(panel.figures()) == 3

    # A model that fails to load: an error naming it; the others still show.
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    panel.state.entries["broken"] = ModelEntry("broken", str(broken))  # listed, loaded when first picked
    panel._fill_options()
    panel.slots[2].value = "broken"
    assert any("broken could not be loaded" in e for e in _errors(panel)), panel.messages
    assert [v.name for v in panel.views] == ["bert", "roberta"] and panel.figures()

    # A cached hub model is offered; one that cannot load says so in the page.
    monkeypatch.setattr(family_panel, "in_hub_cache", lambda name: name == "google/electra-small-generator")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    panel._fill_options()
    labels = dict(panel.slots[3].options)
    assert "google/electra-small-generator (hub cache)" in labels
    panel.slots[3].value = labels["google/electra-small-generator (hub cache)"]
    assert any("google/electra-small-generator could not be loaded" in e for e in _errors(panel))
    assert BROKE not in panel.message.value


def test_a_cached_hub_model_loads_when_picked_and_joins_the_picker(members, monkeypatch):
    import bertlab.loading

    panel = _panel(members, "bert")
    name = "google/electra-small-generator"
    asked = []

    def fake_load(source=None, revision=None):  # the hub cache's copy, here a tiny generator
        asked.append(source)
        return members["generator"]

    monkeypatch.setattr(family_panel, "in_hub_cache", lambda n: n == name)
    monkeypatch.setattr(bertlab.loading, "load", fake_load)
    panel._fill_options()
    assert (f"{name} (hub cache)", f"hub:{name}") in panel.slots[1].options
    panel.slots[1].value = f"hub:{name}"
    assert asked == [name] and not _errors(panel), panel.messages
    assert name in panel.state.entries and panel.state.name == "bert"  # listed in the picker, not switched to
    assert panel.slots[1].value == name and [v.name for v in panel.views] == ["bert", name]
    assert (f"{name} (hub cache)", f"hub:{name}") not in panel.slots[2].options  # listed once, as loaded


def test_busy_sign_while_computing(members, monkeypatch):
    panel = _panel(members, "bert")
    seen = []
    real = family_panel.view_model

    def spy(*args, **kwargs):
        seen.append("bertlab-busy" in panel.message.value and panel.compare_button.disabled)
        return real(*args, **kwargs)

    monkeypatch.setattr(family_panel, "view_model", spy)
    panel.compare_button.click()
    assert seen == [True] and "bertlab-busy" not in panel.message.value and not panel.compare_button.disabled
    assert any("Only one model" in t for _, t in panel.messages)


def test_figures_follow_the_projector_theme(members):
    panel = _panel(members, "bert", "albert")
    normal = {k: f.layout.title.font.size for k, f in panel.figures().items()}
    try:
        theme.use(True)
        panel.compare_button.click()
        big = {k: f.layout.title.font.size for k, f in panel.figures().items()}
        assert big.keys() == normal.keys() and all(big[k] == pytest.approx(1.5 * normal[k]) for k in big)
        assert panel.figures()["parameters"].layout.width == theme.current().page_width
    finally:
        theme.use(False)


def test_the_app_offers_the_pickers_models_and_follows_new_ones(members):
    state = _state(members, "bert")
    app = App(state, first=0)
    index = [t for t, _ in TABS].index("Family")
    panel = app.open(index)
    assert isinstance(panel, FamilyPanel) and panel.state is state
    assert [s.value for s in panel.slots] == ["bert", "", "", ""]
    state.add("roberta", *members["roberta"])  # e.g. loaded in the picker, or made in a training tab
    assert ("roberta", "roberta") in panel.slots[1].options
    panel.slots[1].value = "roberta"
    assert [v.name for v in panel.views] == ["bert", "roberta"]
    state.switch("roberta")  # the picker switched: slot 1 follows when the tab is on show
    app.tabs.selected_index = index
    assert panel.slots[0].value == "roberta"


def test_words_and_halves():
    words = word_choices("Don't stop: 3.14 apples!")
    assert [w.text for w in words] == ["Don't", "stop", "3", "14", "apples"]
    assert halves("One two three four") == ("One two", "three four")
    assert math.isclose(len(halves(TEXT)[0]), 44)
