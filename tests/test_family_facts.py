"""The registry hands out every family fact: a member fills in fields of its own module (`Family`, every
new field with a default), and the lab reads them there: the Input tab's notes on positions and segments,
the Family tab's objective and "what this member changed", the pair task, a new model's config.json, and
the pre-training objectives' own facts (their loss's name, MLM metric, masking, continued training)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from bertlab.analysis.family import objective_of, view_model
from bertlab.classroom.questions import pair_objective
from bertlab.config import BertConfig, ConfigError
from bertlab.families import FAMILIES, Family, FamilyError
from bertlab.families.bert import Bert
from bertlab.families.core import POSITION_NOTES
from bertlab.panels.base import lacks, pair_task
from bertlab.panels.representation import RepresentationPanel
from bertlab.training.loop import TrainEvent
from bertlab.training.objectives import get_objective
from bertlab.training.objectives.base import ObjectiveError
from bertlab.training.objectives.compare import CurveRecorder
from bertlab.training.pretrain import PretrainConfig, check_continuable, objective_module
from bertlab.viz.family import objective_html
from bertlab.viz.objectives import run_label

TINY = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def bare_family(**fields) -> Family:
    """A member's record with only the fields every module must fill (the rest keep their defaults)."""
    bert = FAMILIES["bert"]
    return Family(name="newbert", prefix="bert", model_class=Bert, fields={}, architectures={"BertModel": ((), None)},
                  hook_paths=bert.hook_paths, head_keys={}, pooler_key=None, tokenizer_kind="wordpiece",
                  special_tokens={}, base_keys=(), **fields)


def member(**facts) -> type[Bert]:
    """A model class whose family record says `facts` (BERT's weights: what the lab reads is the record)."""
    return type("MemberBert", (Bert,), {"FAMILY": dataclasses.replace(FAMILIES["bert"], **facts)})


def tiny(cls: type[Bert] = Bert, heads: tuple[str, ...] = ("mlm",)) -> Bert:
    torch.manual_seed(0)
    return cls(BertConfig(**TINY, pretraining_heads=heads)).eval()


# -- the record and its defaults ----------------------------------------------------------------------
def test_a_new_member_may_leave_every_new_field_out():
    f = bare_family()
    assert (f.positions, f.positions_note, f.has_segments) == ("learned", "", True)
    assert (f.objective, f.objective_about, f.objective_demo, f.mlm_role, f.changes, f.new_fields) == (
        "MLM", "masked-word prediction", "", "mlm", (), None)
    fam = f.bind(BertConfig(**TINY))
    assert fam.has_position_embeddings and fam.positions_note == POSITION_NOTES["learned"] and fam.has_segments


@pytest.mark.parametrize("field, value, message", [
    ("positions", "absolute", "positions must be one of learned, rotary, relative; got 'absolute'"),
    ("objective_demo", "show", "objective_demo must be one of"),
])
def test_a_misspelt_fact_is_refused_by_name(field, value, message):
    with pytest.raises(FamilyError, match=message):
        bare_family(**{field: value})


def test_every_member_says_its_objective_in_its_own_module():
    for name, f in FAMILIES.items():
        assert f.objective and f.objective_about, name
    assert FAMILIES["electra"].mlm_role == "generator" and not FAMILIES["distilbert"].has_segments


# -- the Input tab ---------------------------------------------------------------------------------
@pytest.mark.parametrize("positions", ["rotary", "relative"])
def test_the_input_tab_says_what_a_model_uses_instead_of_position_embeddings(default_model, positions):
    _, tok = default_model
    model = tiny(member(positions=positions))
    assert lacks(model, "position_embeddings") == POSITION_NOTES[positions]
    panel = RepresentationPanel(model, tok)
    infos = [text for level, text in panel.messages if level == "info"]
    assert POSITION_NOTES[positions] in infos
    own = tiny(member(positions=positions, positions_note="Each <layer> turns q and k."))
    assert lacks(own, "position_embeddings") == "Each <layer> turns q and k."
    assert "Each &lt;layer&gt; turns q and k." in RepresentationPanel(own, tok).message.value


def test_learned_positions_get_no_note(default_model):
    model, tok = default_model
    assert lacks(model, "position_embeddings") is None
    shown = " ".join(text for _, text in RepresentationPanel(model, tok).messages)
    assert not any(note in shown for note in POSITION_NOTES.values())


def test_a_member_without_segments_says_so_for_a_pair(default_model):
    _, tok = default_model
    model = tiny(member(has_segments=False))  # its config still has two segment types: the record decides
    assert not model.family.has_segments
    infos = " ".join(text for level, text in RepresentationPanel(model, tok).messages if level == "info")
    assert "has no segment embeddings" in infos and "separator token" in infos


# -- the Family tab --------------------------------------------------------------------------------
def test_the_family_card_shows_what_the_member_changed_from_its_module(default_model):
    _, tok = default_model
    cls = member(objective="MLM at 30 %, no NSP", objective_about="a bigger share of pieces hidden",
                 changes=("rotary positions", "GeGLU <MLP>"), mlm_role="generator")
    model = tiny(cls)
    o = objective_of(model)
    assert (o.name, o.about, o.role, o.demo, o.pair_task) == ("MLM at 30 %, no NSP", "a bigger share of pieces hidden",
                                                               "generator", "pair", None)
    view = view_model("m", model, tok, "The quick brown fox.", None)
    card = objective_html(view)
    assert "MLM at 30 %, no NSP" in card and "Architecture: rotary positions; GeGLU &lt;MLP&gt;." in card
    assert "Architecture:" not in objective_html(view_model("b", tiny(), tok, "The quick brown fox.", None))


@pytest.mark.parametrize("positions, shown", [("learned", "learned position embeddings"), ("rotary", "rotary"),
                                              ("relative", "relative")])
def test_the_family_card_says_how_each_member_knows_positions(default_model, positions, shown):
    _, tok = default_model
    card = objective_html(view_model("m", tiny(member(positions=positions)), tok, "The quick brown fox.", None))
    assert f"Positions: {shown}" in card


# -- the sentence-pair task --------------------------------------------------------------------------
@pytest.mark.parametrize("heads, task", [(("mlm", "nsp"), "nsp"), (("mlm",), None)])
def test_the_pair_task_is_the_protocols_answer(heads, task):
    model = tiny(heads=heads)
    assert model.family.pair_task == task == pair_task(model)
    assert pair_objective(model) == (task or "nsp")


def test_an_albert_pair_task_is_sentence_order():
    f = FAMILIES["albert"]
    cfg = f.new_config("AlbertForPreTraining", vocab_size=100, hidden_size=32, num_layers=2, num_heads=4,
                       max_len=64, pad_token_id=0)
    model = f.model_class(f.spec_from_hf(cfg))
    assert model.family.pair_task == "sop" == pair_task(model) == pair_objective(model)


# -- a new model's config.json ----------------------------------------------------------------------
SIZE = dict(vocab_size=100, hidden_size=32, num_layers=2, num_heads=4, max_len=64)


def test_a_new_config_leaves_room_for_the_position_offset():
    assert FAMILIES["bert"].new_config("BertForMaskedLM", **SIZE, pad_token_id=0)["max_position_embeddings"] == 64
    d = FAMILIES["roberta"].new_config("RobertaForMaskedLM", **SIZE, pad_token_id=1)
    spec = FAMILIES["roberta"].spec_from_hf(d)
    assert d["max_position_embeddings"] == 64 + 2 and spec.max_position_embeddings - spec.position_offset == 64


@pytest.mark.parametrize("options, groups, width", [
    ({"shared_layers": True}, 1, 32), ({"shared_layers": False}, 2, 32), ({"embedding_size": 16}, 2, 16)])
def test_a_new_config_gets_the_members_own_fields(options, groups, width):
    d = FAMILIES["albert"].new_config("AlbertForPreTraining", **SIZE, pad_token_id=0, **options)
    assert (d["num_hidden_groups"], d["embedding_size"]) == (groups, width)


def test_a_new_config_speaks_the_members_config_names():
    f = FAMILIES["distilbert"]
    d = f.new_config("DistilBertForMaskedLM", **SIZE, pad_token_id=0)
    assert (d["dim"], d["n_layers"], d["n_heads"], d["hidden_dim"]) == (32, 2, 4, 128)
    spec = f.spec_from_hf(d)
    assert (spec.hidden_size, spec.num_hidden_layers, spec.intermediate_size, spec.max_position_embeddings) == (
        32, 2, 128, 64)


def test_a_new_config_refuses_an_architecture_of_another_member():
    with pytest.raises(FamilyError, match="'BertForMaskedLM' is not a RoBERTa architecture"):
        FAMILIES["roberta"].new_config("BertForMaskedLM", **SIZE, pad_token_id=1)


def test_a_model_class_refuses_a_config_of_another_member():
    with pytest.raises(ConfigError, match="model_type 'roberta' is not 'bert'"):
        Bert(BertConfig(**TINY, model_type="roberta"))
    with pytest.raises(ConfigError, match="model_type 'bert' is not 'roberta'"):
        FAMILIES["roberta"].model_class(BertConfig(**TINY))


# -- the pre-training objectives' own facts --------------------------------------------------------
def test_the_curves_read_the_objectives_own_mlm_metric_and_loss_name():
    objective = dataclasses.replace(get_objective("roberta"), mlm_acc_key="their_acc", loss_name="their loss")
    recorder = CurveRecorder(torch.nn.Linear(1, 1), dataclasses.replace(objective, mlm_model=lambda m: None), None,
                             probe="")
    recorder(TrainEvent("step", 3, 10, 0.1, loss=2.0, metrics={"mlm_loss": 1.5, "mlm_acc": 0.1, "their_acc": 0.4}))
    assert (recorder.points[-1].own_loss, recorder.points[-1].mlm_acc) == (1.5, 0.4)
    assert run_label("run 1", "albert") == "run 1 (MLM + SOP loss)"
    assert run_label("mine", "no such objective") == "mine"


def test_continued_training_follows_the_objectives_own_facts():
    model = tiny(heads=("mlm", "nsp"))
    wrapped = dataclasses.replace(get_objective("spanbert"), continue_with=lambda m: ("wrapped", m))
    kind, inner = objective_module(wrapped, PretrainConfig(objective="spanbert"), None, model)
    assert kind == "wrapped" and inner.config.pretraining_heads == wrapped.heads == ("mlm",)
    scratch_only = dataclasses.replace(get_objective("bert"), continue_with=None, builds="two towers")
    with pytest.raises(ObjectiveError, match="trains two towers from scratch"):
        check_continuable(scratch_only, model)
