"""The fine-tuning engine: each task end to end on small synthetic data a tiny BERT can learn
(loss goes down, the real metric is computed, the saved model reloads and predicts the same),
the three modes (what learns and what stays frozen), cancel, failures, the CLI, and a smoke run
of each task on the real data sets. Tiny models on CPU, no timing."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from tiny_models import tiny_bert

from bertlab.families.bert import Bert
from bertlab.loading import load, save_pretrained
from bertlab.tasks import NLI_LABELS, get_task, read_train_dev
from bertlab.tokenizer import Tokenizer
from bertlab.training.checkpoint import DiskFullError
from bertlab.training.finetune import (
    EvalSet,
    FinetuneConfig,
    FinetuneError,
    evaluate,
    evaluate_set,
    finetune,
    is_trainable,
    read_results,
    set_trainable,
    subset,
    with_task_head,
)
from bertlab.training.finetune_cli import add_evaluate_parser, add_finetune_parser, config_from_args
from bertlab.training.finetune_defaults import recipe

REPO = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("one_thread")  # torch on one thread (see conftest)


def quick(task: str, data: Path, tok: Tokenizer, **kw) -> FinetuneConfig:
    """A config for a tiny model on synthetic data: high lr, short sequences."""
    settings = dict(task=task, data=str(data), model=tiny_bert(tok), lr=3e-3, epochs=4, batch_size=16,
                    max_length=48, log_every=2, warmup_ratio=0.0)
    settings.update(kw)
    return FinetuneConfig(**settings)


def losses(result) -> list[float]:
    return [h["loss"] for h in result.train.history if h["kind"] == "train"]


# ---------------------------------------------------------------------------------------------
# Synthetic data in each task's file format, with a rule a tiny model can learn
# ---------------------------------------------------------------------------------------------
GOOD = ["great", "wonderful", "excellent", "brilliant", "lovely", "superb"]
BAD = ["awful", "terrible", "boring", "dreadful", "horrible", "dull"]
OPENERS = ["the film was", "this movie is", "honestly , a", "what a", "the story felt", "all in all"]
PEOPLE = ["John", "Mary", "Peter", "Susan", "David", "Laura"]
PLACES = ["Paris", "London", "Berlin", "Madrid", "Tokyo", "Rome"]
ORGS = ["Google", "Reuters", "Microsoft", "Toyota", "Nike", "Intel"]


def _pick(g: torch.Generator, items: list[str]) -> str:
    return items[int(torch.randint(len(items), (1,), generator=g))]


def write_sst2(folder: Path, n_train: int = 192, n_dev: int = 48) -> Path:
    g = torch.Generator().manual_seed(1)
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("dev", n_dev)):
        rows = ["sentence\tlabel"]
        for i in range(n):
            label = i % 2
            text = f"{_pick(g, OPENERS)} {_pick(g, GOOD if label else BAD)}"
            rows.append(f"{text} in review {i}\t{label}" if split == "dev" else f"{text}\t{label}")  # dev: its own
        (folder / f"{split}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return folder


def write_sick(folder: Path, n_train: int = 192, n_dev: int = 48) -> Path:
    """Entailment: "someone" does what A says; contradiction: "nobody" does it; neutral: another scene."""
    g = torch.Generator().manual_seed(2)
    header = "pair_ID\tsentence_A\tsentence_B\tentailment_label\tSemEval_set"
    rows, pid = [header], 0
    for part, n in (("TRAIN", n_train), ("TRIAL", n_dev)):
        for i in range(n):
            who, place = _pick(g, PEOPLE), _pick(g, PLACES)
            a = f"{who} plays the guitar in {place}"
            label = ("ENTAILMENT", "NEUTRAL", "CONTRADICTION")[i % 3]
            b = {"ENTAILMENT": "someone plays", "NEUTRAL": f"{_pick(g, PEOPLE)} cooks",
                 "CONTRADICTION": "nobody plays"}[label]
            pid += 1
            rows.append(f"{pid}\t{a}\t{b}\t{label}\t{part}")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "SICK_synthetic.txt").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return folder


def ner_sentence(g: torch.Generator) -> list[tuple[str, str]]:
    kind = int(torch.randint(3, (1,), generator=g))
    per = [(_pick(g, PEOPLE), "B-PER")]
    if int(torch.randint(2, (1,), generator=g)):
        per.append(("Smith", "I-PER"))
    loc, org = [(_pick(g, PLACES), "B-LOC")], [(_pick(g, ORGS), "B-ORG")]
    if kind == 0:
        return per + [("flew", "O"), ("to", "O")] + loc + [("on", "O"), ("Monday", "O"), (".", "O")]
    if kind == 1:
        return per + [("works", "O"), ("for", "O")] + org + [("in", "O")] + loc + [(".", "O")]
    return org + [("opened", "O"), ("an", "O"), ("office", "O"), ("in", "O")] + loc + [(".", "O")]


def write_conll(folder: Path, n_train: int = 160, n_dev: int = 40) -> Path:
    g = torch.Generator().manual_seed(3)
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("dev", n_dev)):
        lines = ["-DOCSTART- -X- -X- O", ""]
        for _ in range(n):
            lines += [f"{w} NNP B-NP {t}" for w, t in ner_sentence(g)] + [""]
        (folder / f"{split}.txt").write_text("\n".join(lines), encoding="utf-8")
    return folder


def write_squad(folder: Path, articles: int = 30) -> Path:
    """Paragraphs "X was born in P . X works for O ." with a where- and a who-question each."""
    g = torch.Generator().manual_seed(4)
    data = []
    for a in range(articles):
        paragraphs = []
        for p in range(2):
            who, place, org = _pick(g, PEOPLE), _pick(g, PLACES), _pick(g, ORGS)
            context = f"{who} was born in {place} . {who} works for {org} ."
            qas = [
                {"id": f"{a}-{p}-born", "question": f"Where was {who} born ?",
                 "answers": [{"text": place, "answer_start": context.index(place)}]},
                {"id": f"{a}-{p}-works", "question": f"Who does {who} work for ?",
                 "answers": [{"text": org, "answer_start": context.index(org)}]},
            ]
            paragraphs.append({"context": context, "qas": qas})
        data.append({"title": f"Article {a}", "paragraphs": paragraphs})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "synthetic.json").write_text(json.dumps({"version": "1.1", "data": data}), encoding="utf-8")
    return folder


WRITERS = {"sst2": write_sst2, "nli": write_sick, "ner": write_conll, "qa": write_squad}


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("synthetic")
    return {task: write(root / task) for task, write in WRITERS.items()}


@pytest.fixture(scope="module")
def sst2_run(synthetic, tok, tmp_path_factory):
    """A full-mode SST-2 run on synthetic data, saved to out_dir (shared by several tests)."""
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("runs") / "sst2"
    return finetune(quick("sst2", synthetic["sst2"], tok, out_dir=str(out)), tokenizer=tok)


def logits_of(model: Bert, tok: Tokenizer, texts: list[str]) -> torch.Tensor:
    batch = tok.encode_batch(texts)
    model.eval()
    with torch.no_grad():
        return model(batch.input_ids, batch.token_type_ids, batch.attention_mask).logits


# ---------------------------------------------------------------------------------------------
# Each task end to end
# ---------------------------------------------------------------------------------------------
def test_sst2_end_to_end_learns_saves_and_reloads(sst2_run, tok):
    r = sst2_run
    assert r.status == "completed" and r.error is None
    loss = losses(r)
    assert loss[-1] < 0.5 * loss[0]
    assert r.main_metric == "accuracy" and r.score >= 0.9
    assert r.metrics["examples"] == 48 and sum(map(sum, r.metrics["confusion_matrix"])) == 48
    assert [h["step"] for h in r.history] == [12, 24, 36, 48]  # once per epoch: 192 / 16 = 12 steps
    assert r.train_examples == 192 and r.eval_examples == 48 and r.device == "cpu" and r.mode == "full"
    assert r.trainable_parameters == r.total_parameters
    # saved in HF layout with labels, and bertlab.load reads it back with the same predictions
    folder = Path(r.saved_to)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"]
    assert config["id2label"] == {"0": "negative", "1": "positive"}
    model, tok2 = load(folder)
    texts = ["what a superb film", "the story felt dull", "this movie is brilliant"]
    torch.testing.assert_close(logits_of(model, tok2, texts), logits_of(r.model, tok, texts))
    summary = read_results(folder)
    assert summary["status"] == "completed" and summary["score"] == r.score and summary["config"]["task"] == "sst2"
    assert summary["config"]["lr"] == 3e-3


def test_transformers_loads_the_full_mode_classifier(sst2_run, tok):
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.set_verbosity_error()
    hf = transformers.BertForSequenceClassification.from_pretrained(sst2_run.saved_to).eval()
    assert hf.config.id2label == {0: "negative", 1: "positive"}
    texts = ["what a superb film", "the story felt dull"]
    batch = tok.encode_batch(texts)
    with torch.no_grad():
        theirs = hf(input_ids=batch.input_ids, token_type_ids=batch.token_type_ids,
                    attention_mask=batch.attention_mask).logits
    torch.testing.assert_close(theirs, logits_of(sst2_run.model, tok, texts), atol=1e-5, rtol=1e-4)


def test_nli_end_to_end(synthetic, tok):
    r = finetune(quick("nli", synthetic["nli"], tok, epochs=6), tokenizer=tok)
    assert r.status == "completed"
    assert sum(losses(r)[-3:]) / 3 < 0.5 * losses(r)[0]
    assert r.score >= 0.9
    matrix = r.metrics["confusion_matrix"]
    assert len(matrix) == 3 and sum(map(sum, matrix)) == 48
    assert r.model.config.id2label == NLI_LABELS


def test_ner_end_to_end_entity_f1_and_reload(synthetic, tok, tmp_path):
    r = finetune(quick("ner", synthetic["ner"], tok, out_dir=str(tmp_path / "ner")), tokenizer=tok)
    assert r.status == "completed"
    assert losses(r)[-1] < 0.3 * losses(r)[0]
    assert r.main_metric == "f1" and r.score >= 0.9
    assert set(r.metrics["per_type"]) == {"PER", "LOC", "ORG"}
    model, tok2 = load(tmp_path / "ner")
    assert model.config.task == "token_classification"
    dev = get_task("ner").read("dev", path=synthetic["ner"])
    assert evaluate(model, tok2, "ner", dev, max_length=48) == evaluate(r.model, tok, "ner", dev, max_length=48)


def test_qa_end_to_end_squad_metrics_and_reload(synthetic, tok, tmp_path):
    r = finetune(quick("qa", synthetic["qa"], tok, epochs=10, lr=5e-3, out_dir=str(tmp_path / "qa")), tokenizer=tok)
    assert r.status == "completed"
    assert losses(r)[-1] < 0.3 * losses(r)[0]
    assert set(r.metrics) >= {"exact_match", "f1"} and r.main_metric == "f1"
    assert r.metrics["exact_match"] >= 80  # percent, as the official script
    assert r.train_examples == 92 and r.eval_examples == 28  # 23 / 7 articles, 4 questions each
    model, tok2 = load(tmp_path / "qa")
    dev = get_task("qa").read("dev", path=synthetic["qa"])
    assert evaluate(model, tok2, "qa", dev, max_length=48) == pytest.approx(r.metrics)


# ---------------------------------------------------------------------------------------------
# Modes
# ---------------------------------------------------------------------------------------------
def _changed(before: dict[str, torch.Tensor], model: Bert) -> set[str]:
    after = model.state_dict()
    return {k for k, v in before.items() if not torch.equal(v, after[k])}


def test_feature_mode_trains_the_head_only(synthetic, tok):
    cfg = quick("sst2", synthetic["sst2"], tok, mode="feature", epochs=1, lr=None, max_train_examples=64)
    start = with_task_head(cfg.model, get_task("sst2"))
    before = {k: v.clone() for k, v in start.state_dict().items()}
    r = finetune(cfg, tokenizer=tok)
    assert r.status == "completed" and cfg.learning_rate == recipe("sst2", "feature").lr
    changed = _changed(before, r.model)
    assert changed == {"classifier.weight", "classifier.bias", "bert.pooler.dense.weight", "bert.pooler.dense.bias"}
    assert r.trainable_parameters == sum(before[k].numel() for k in changed)
    assert not any(p.requires_grad for n, p in r.model.named_parameters() if n.startswith("bert.encoder"))


def test_adapter_mode_changes_only_adapters_layernorms_and_head(synthetic, tok, tmp_path):
    cfg = quick("sst2", synthetic["sst2"], tok, mode="adapter", adapter_size=8, epochs=1, max_train_examples=64,
                out_dir=str(tmp_path / "adapter"))
    r = finetune(cfg, tokenizer=tok)
    assert r.status == "completed" and r.model.config.adapter_size == 8
    fresh = with_task_head(tiny_bert(tok), get_task("sst2"), adapter_size=8)  # same seed: the start point
    changed = _changed(fresh.state_dict(), r.model)
    assert changed and all(is_trainable(k, "adapter") for k in changed)
    assert any(".adapter." in k for k in changed) and any("LayerNorm" in k for k in changed)
    assert "classifier.weight" in changed
    assert not any(k.endswith(("query.weight", "intermediate.dense.weight", "word_embeddings.weight")) for k in changed)
    assert r.trainable_parameters < 0.2 * r.total_parameters
    model, _ = load(tmp_path / "adapter")  # adapters are in config.json and the weights
    assert model.config.adapter_size == 8
    texts = ["what a lovely film"]
    torch.testing.assert_close(logits_of(model, tok, texts), logits_of(r.model, tok, texts))


def test_set_trainable_counts_and_rules(tok):
    model = with_task_head(tiny_bert(tok), get_task("qa"))
    trainable, total = set_trainable(model, "feature")
    head = ("qa_outputs.", "bert.pooler.")
    assert trainable == sum(p.numel() for n, p in model.named_parameters() if n.startswith(head))
    assert set_trainable(model, "full") == (total, total)
    assert is_trainable("bert.encoder.layer.0.output.LayerNorm.weight", "adapter")
    assert not is_trainable("bert.encoder.layer.0.output.LayerNorm.weight", "feature")
    with pytest.raises(ValueError, match="mode"):
        is_trainable("x", "lora")


def test_a_model_with_another_head_gets_a_fresh_one(sst2_run, tok):
    nli = with_task_head(sst2_run.model, get_task("nli"))
    assert nli.config.id2label == NLI_LABELS and nli.classifier.out_features == 3
    same = with_task_head(sst2_run.model, get_task("sst2"))  # same task and labels: the trained head stays
    torch.testing.assert_close(same.classifier.weight, sst2_run.model.classifier.weight)
    for name, p in nli.named_parameters():
        if name.startswith("bert.encoder"):
            torch.testing.assert_close(p, dict(sst2_run.model.named_parameters())[name])


# ---------------------------------------------------------------------------------------------
# Cancel, failures, errors
# ---------------------------------------------------------------------------------------------
def test_cancel_mid_run_keeps_a_usable_checkpoint(synthetic, tok, tmp_path):
    cancel = threading.Event()

    def stop_at_5(event):
        if event.kind == "step" and event.step >= 5:
            cancel.set()

    cfg = quick("sst2", synthetic["sst2"], tok, log_every=1, out_dir=str(tmp_path / "run"))
    r = finetune(cfg, callbacks=[stop_at_5], cancel=cancel, tokenizer=tok)
    assert r.status == "cancelled" and r.train.step == 5
    assert not (tmp_path / "run" / "config.json").exists()  # no "final" model from a cancelled run
    assert r.saved_to == tmp_path / "run" / "checkpoints" / "checkpoint-5"
    model, tok2 = load(r.saved_to)  # the checkpoint is a loadable HF folder
    torch.testing.assert_close(logits_of(model, tok2, ["a dull film"]), logits_of(r.model, tok, ["a dull film"]))
    assert read_results(tmp_path / "run")["status"] == "cancelled"
    # and the run goes on from it to the end
    done = finetune(quick("sst2", synthetic["sst2"], tok, log_every=1, out_dir=str(tmp_path / "run")),
                    tokenizer=tok, resume_from=r.saved_to)
    assert done.status == "completed" and done.train.step == 48 and (tmp_path / "run" / "config.json").is_file()


def test_a_failure_inside_training_is_reported_not_raised(synthetic, tok, tmp_path):
    def explode(event):
        if event.kind == "step" and event.step >= 2:
            raise RuntimeError("CUDA out of memory (simulated)")

    r = finetune(quick("sst2", synthetic["sst2"], tok, out_dir=str(tmp_path / "x")), callbacks=[explode], tokenizer=tok)
    assert r.status == "failed" and "out of memory (simulated)" in r.error
    assert not (tmp_path / "x" / "config.json").exists()
    assert read_results(tmp_path / "x")["error"] == r.error


# ---------------------------------------------------------------------------------------------
# Data without a dev part: a seeded part held out, and said so
# ---------------------------------------------------------------------------------------------
def _reviews(path: Path, n: int = 30) -> Path:
    path.write_text("".join(f"{('dull', 'great')[i % 2]} film number {i}\t{i % 2}\n" for i in range(n)),
                    encoding="utf-8")
    return path


def test_a_single_file_holds_out_a_seeded_dev_part_and_says_so(tok, tmp_path, caplog):
    data = _reviews(tmp_path / "reviews.tsv")
    cfg = quick("sst2", data, tok, epochs=1, out_dir=str(tmp_path / "run"))
    with caplog.at_level("WARNING", logger="bertlab.training.finetune"):
        r = finetune(cfg, tokenizer=tok)
    assert r.status == "completed" and (r.train_examples, r.eval_examples) == (27, 3) and r.dev_held_out
    assert "reviews.tsv: 27 training examples, 3 held out as dev (10%, seed 0" in caplog.text
    summary = read_results(tmp_path / "run")
    assert summary["dev_held_out"] is True and "3 held out as dev" in summary["data"]
    # the dev part is never trained on, and the same seed holds out the same examples
    split = read_train_dev(get_task("sst2"), data, seed=0)
    assert {e.text_a for e in split.train}.isdisjoint(e.text_a for e in split.dev)
    assert read_train_dev(get_task("sst2"), data, seed=0).dev == split.dev != read_train_dev(
        get_task("sst2"), data, seed=1).dev
    # a dev file of one's own is used as given
    own = finetune(quick("sst2", data, tok, epochs=1, eval_data=_reviews(tmp_path / "mine.tsv", 8)), tokenizer=tok)
    assert (own.train_examples, own.eval_examples, own.dev_held_out) == (30, 8, False)


def test_every_format_without_a_dev_part_holds_one_out(tmp_path, synthetic):
    sick = tmp_path / "SICK_mine.txt"
    header = "pair_ID\tsentence_A\tsentence_B\tentailment_label\tSemEval_set\n"
    rows = [f"{i}\tA man plays {i}\tA man plays\t{('ENTAILMENT', 'NEUTRAL')[i % 2]}\t{part}\n"
            for i, part in enumerate(["TRAIN"] * 20 + ["TEST"] * 4)]
    sick.write_text(header + "".join(rows), encoding="utf-8")
    split = read_train_dev(get_task("nli"), sick)
    assert (len(split.train), len(split.dev), split.held_out) == (18, 2, True)  # the TEST part is never used
    assert "no TRIAL part" in split.note
    folder = tmp_path / "conll"
    folder.mkdir()
    (folder / "train.txt").write_text((synthetic["ner"] / "train.txt").read_text())
    split = read_train_dev(get_task("ner"), folder)  # a folder without dev.txt
    assert (len(split.train), len(split.dev), split.held_out) == (144, 16, True)
    squad = json.loads((synthetic["qa"] / "synthetic.json").read_text())
    squad["data"] = [dict(squad["data"][0], paragraphs=squad["data"][0]["paragraphs"] * 5)]
    for k, para in enumerate(squad["data"][0]["paragraphs"]):
        squad["data"][0]["paragraphs"][k] = dict(para, context=para["context"] + " " * k)  # 10 paragraphs
    (tmp_path / "one.json").write_text(json.dumps(squad))
    split = read_train_dev(get_task("qa"), tmp_path / "one.json")  # one article: whole paragraphs held out
    assert split.held_out and len(split.dev) == 2 and len(split.train) == 18
    assert {e.context for e in split.train}.isdisjoint(e.context for e in split.dev)
    split = read_train_dev(get_task("qa"), synthetic["qa"])  # 30 articles: 7 held out, as before
    assert not split.held_out and len({e.title for e in split.dev}) == 7


# ---------------------------------------------------------------------------------------------
# Saving that survives
# ---------------------------------------------------------------------------------------------
def test_a_failure_mid_save_leaves_the_previous_model_whole(synthetic, tok, tmp_path, monkeypatch):
    import bertlab.loading as loading

    out = tmp_path / "run"
    first = finetune(quick("sst2", synthetic["sst2"], tok, epochs=1, out_dir=str(out)), tokenizer=tok)
    texts = ["what a superb film"]
    before = logits_of(load(out)[0], tok, texts)
    torch.testing.assert_close(before, logits_of(first.model, tok, texts))
    real = loading.save_file

    def half_then_full(state, filename, *a, **k):
        if "checkpoints" in str(filename):  # the loop's checkpoints go through; the final save fails
            return real(state, filename, *a, **k)
        Path(filename).write_bytes(b"half a file")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 2496 vs 2388")

    monkeypatch.setattr(loading, "save_file", half_then_full)
    cfg = quick("nli", synthetic["nli"], tok, epochs=1, out_dir=str(out), overwrite=True)  # another head
    with pytest.raises(DiskFullError, match=f"^the disk is full while writing {out}: free some space"):
        finetune(cfg, tokenizer=tok)
    monkeypatch.setattr(loading, "save_file", real)
    model, _ = load(out)  # still the SST-2 model, whole: not the NLI config over SST-2 weights
    assert model.config.id2label == {0: "negative", 1: "positive"}
    torch.testing.assert_close(logits_of(model, tok, texts), before)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no temp folder left beside it


def test_cli_finetune_reports_a_full_disk_as_one_line(synthetic, tok, tmp_path, monkeypatch, capsys):
    import bertlab.loading as loading

    save_pretrained(tiny_bert(tok), tok, tmp_path / "tiny")

    real = loading.save_file

    def full(state, filename, *a, **k):
        if "checkpoints" in str(filename):
            return real(state, filename, *a, **k)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(loading, "save_file", full)
    args = _parser().parse_args(["finetune", "--task", "sst2", "--data", str(synthetic["sst2"]), "--model",
                                 str(tmp_path / "tiny"), "--out", str(tmp_path / "out"), "--epochs", "1",
                                 "--max-train-examples", "16", "--max-length", "16", "--no-progress"])
    assert args.func(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"bertlab finetune: the disk is full while writing {tmp_path / 'out'}: free some space (or "
                       f"write to a folder on another disk, e.g. --out elsewhere) and run again.")
    assert not any("Traceback" in line for line in err)
    assert not (tmp_path / "out" / "config.json").exists()


def test_bad_settings_fail_early_with_a_message(tok, synthetic):
    with pytest.raises(ValueError, match="mode must be one of"):
        FinetuneConfig(mode="lora")
    with pytest.raises(KeyError, match="unknown task"):
        FinetuneConfig(task="squad2")
    with pytest.raises(ValueError, match="epochs"):
        FinetuneConfig(epochs=0)
    with pytest.raises(FinetuneError, match="tokenizer"):
        finetune(FinetuneConfig(task="sst2", model=tiny_bert(tok)))
    assert FinetuneConfig(mode="adapter").learning_rate == recipe("sst2", "adapter").lr
    assert FinetuneConfig().learning_rate == recipe("sst2").lr
    with pytest.raises(ValueError, match="warmup_ratio"):
        FinetuneConfig(warmup_ratio=1.0)


@pytest.mark.parametrize("task", ["sst2", "nli", "sts", "ner", "qa"])
@pytest.mark.parametrize("mode", ["full", "feature", "adapter"])
def test_settings_left_out_take_the_tasks_measured_defaults(task, mode):
    r = recipe(task, mode)
    cfg = FinetuneConfig(task=task, mode=mode).resolved()
    got = (cfg.model, cfg.epochs, cfg.lr, cfg.batch_size, cfg.max_length, cfg.warmup_ratio)
    assert got == (r.model, r.epochs, r.lr, r.batch_size, r.max_length, r.warmup_ratio)
    train = FinetuneConfig(task=task, mode=mode).train_config(batches_per_epoch=10)  # the loop gets them too
    assert (train.epochs, train.lr, train.batch_size, train.warmup_ratio) == (r.epochs, r.lr, r.batch_size,
                                                                               r.warmup_ratio)
    given = FinetuneConfig(task=task, mode=mode, model="x", epochs=7, lr=0.25, batch_size=3, max_length=40,
                           warmup_ratio=0.0).resolved()  # what the caller gives wins
    assert (given.model, given.epochs, given.lr, given.batch_size, given.max_length, given.warmup_ratio) == (
        "x", 7, 0.25, 3, 40, 0.0)
    assert FinetuneConfig(task=task, mode=mode).to_dict()["lr"] == r.lr
    with pytest.raises(KeyError, match="no defaults"):
        recipe(task, "lora")


def test_the_cli_leaves_unset_options_to_the_tasks_defaults():
    args = _parser().parse_args(["finetune", "--task", "ner", "--out", "o"])
    cfg = config_from_args(args).resolved()
    r = recipe("ner")
    assert (cfg.model, cfg.epochs, cfg.lr, cfg.batch_size, cfg.max_length) == (
        r.model, r.epochs, r.lr, r.batch_size, r.max_length)
    args = _parser().parse_args(["finetune", "--task", "ner", "--out", "o", "--model", "default",
                                      "--warmup-ratio", "0.2", "--epochs", "1"])
    cfg = config_from_args(args).resolved()
    assert (cfg.model, cfg.warmup_ratio, cfg.epochs) == ("default", 0.2, 1)


def test_evaluate_needs_the_right_head(tok, sst2_run, synthetic):
    dev = get_task("nli").read("dev", path=synthetic["nli"])
    with pytest.raises(FinetuneError, match="needs a sequence classification head, but this model has no task head"):
        evaluate(tiny_bert(tok), tok, "nli", dev)
    with pytest.raises(FinetuneError, match="negative, positive"):  # an SST-2 model on NLI data
        evaluate(sst2_run.model, tok, "nli", dev)
    qa = get_task("qa").read("dev", path=synthetic["qa"])
    with pytest.raises(FinetuneError, match="has sequence classification"):
        evaluate(sst2_run.model, tok, "qa", qa)


def test_subset_is_seeded_and_keeps_order():
    items = list(range(100))
    a, b = subset(items, 10, seed=0, what="train"), subset(items, 10, seed=0, what="train")
    assert a == b == sorted(a) and len(set(a)) == 10
    assert subset(items, 10, seed=1, what="train") != a
    assert subset(items, None, 0) == items and subset(items, 500, 0) == items


def test_evaluate_set_scores_what_the_model_predicts(sst2_run, tok, synthetic):
    task = get_task("sst2")
    dev = task.read("dev", path=synthetic["sst2"])
    data = EvalSet.build(task, dev, tok, 48, batch_size=5)  # batches of mixed lengths
    scores = evaluate_set(sst2_run.model, data)
    preds = logits_of(sst2_run.model, tok, [e.text_a for e in dev]).argmax(-1).tolist()
    assert scores["accuracy"] == pytest.approx(sum(p == e.label for p, e in zip(preds, dev)) / len(dev))


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------
def _parser():
    import argparse

    parser = argparse.ArgumentParser(prog="bertlab")
    sub = parser.add_subparsers(dest="command")
    add_finetune_parser(sub)
    add_evaluate_parser(sub)
    return parser


def test_cli_evaluate_prints_one_json_line(sst2_run, synthetic, capsys):
    args = _parser().parse_args(["evaluate", "--task", "sst2", "--model", str(sst2_run.saved_to),
                                 "--data", str(synthetic["sst2"] / "dev.tsv")])
    assert args.func(args) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    scores = json.loads(lines[0])
    assert scores["task"] == "sst2" and scores["main_metric"] == "accuracy" and scores["examples"] == 48
    assert scores["accuracy"] == pytest.approx(sst2_run.score)


def test_cli_evaluate_reports_a_missing_head(synthetic, tmp_path, tok, capsys):
    save_pretrained(tiny_bert(tok), tok, tmp_path / "encoder")
    args = _parser().parse_args(["evaluate", "--task", "sst2", "--model", str(tmp_path / "encoder"),
                                 "--data", str(synthetic["sst2"])])
    assert args.func(args) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "no task head" in captured.err


def test_cli_evaluate_scores_a_test_part_and_whole_files(tok, tmp_path, capsys):
    """--split test reads SICK's TEST part (or a folder's test file); --split all a whole file, in every format."""
    nli = tmp_path / "nli"
    save_pretrained(with_task_head(tiny_bert(tok), get_task("nli")), tok, nli)
    sick = tmp_path / "SICK.txt"
    header = "pair_ID\tsentence_A\tsentence_B\tentailment_label\tSemEval_set\n"
    parts = ["TRAIN"] * 6 + ["TRIAL"] * 3 + ["TEST"] * 5
    sick.write_text(header + "".join(f"{i}\tA dog runs {i}\tAn animal runs\t{('ENTAILMENT', 'CONTRADICTION')[i % 2]}"
                                     f"\t{p}\n" for i, p in enumerate(parts)), encoding="utf-8")

    def scores(*argv: str) -> dict:
        args = _parser().parse_args(["evaluate", "--model", str(nli), "--task", "nli", "--data", str(sick), *argv])
        assert args.func(args) == 0
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    assert scores("--split", "test")["examples"] == 5
    assert scores("--split", "all")["examples"] == 14
    assert scores()["examples"] == 3  # dev: the TRIAL part
    sst2 = tmp_path / "sst2"
    save_pretrained(with_task_head(tiny_bert(tok), get_task("sst2")), tok, tmp_path / "sst2-model")
    sst2.mkdir()
    for split, n in (("train", 4), ("dev", 2), ("test", 6)):
        _reviews(sst2 / f"{split}.tsv", n)
    for split, n in (("test", 6), ("all", 12)):
        args = _parser().parse_args(["evaluate", "--model", str(tmp_path / "sst2-model"), "--task", "sst2",
                                     "--data", str(sst2), "--split", split])
        assert args.func(args) == 0
        assert json.loads(capsys.readouterr().out.strip())["examples"] == n


def test_cli_finetune_options_reach_the_config():
    from bertlab.training.finetune_cli import config_from_args

    args = _parser().parse_args(["finetune", "--task", "ner", "--out", "o", "--mode", "adapter", "--adapter-size",
                                 "16", "--max-train-examples", "100", "--label-all-pieces", "--lr", "2e-4"])
    cfg = config_from_args(args)
    assert (cfg.task, cfg.mode, cfg.adapter_size, cfg.max_train_examples, cfg.label_all_pieces, cfg.lr) == (
        "ner", "adapter", 16, 100, True, 2e-4)
    assert cfg.out_dir == "o" and cfg.model is None and cfg.eval_every is None


@pytest.mark.slow
def test_cli_finetune_runs_in_a_subprocess(synthetic, tmp_path, tok):
    """`python -m` through the real entry point: a MiniLM full run on 32 synthetic sentences."""
    code = ("import sys, argparse; from bertlab.training.finetune_cli import add_finetune_parser as a;"
            "p = argparse.ArgumentParser(); s = p.add_subparsers(); a(s); args = p.parse_args(sys.argv[1:]);"
            "sys.exit(args.func(args))")
    out = subprocess.run(
        [sys.executable, "-c", code, "finetune", "--task", "sst2", "--data", str(synthetic["sst2"]), "--out",
         str(tmp_path / "m"), "--max-train-examples", "32", "--max-eval-examples", "16", "--max-length", "16",
         "--epochs", "1", "--batch-size", "16"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["status"] == "completed"
    assert "fine-tuning sst2" in out.stderr  # the progress bar
    model, _ = load(tmp_path / "m")
    assert model.config.num_hidden_layers == 6 and model.config.task == "sequence_classification"


# ---------------------------------------------------------------------------------------------
# The real data sets (BERTLAB_DATA): a smoke run of each task on a small subset
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("task, metric", [("sst2", "accuracy"), ("nli", "accuracy"), ("ner", "f1"), ("qa", "f1")])
def test_each_task_runs_on_the_real_data(shared_data, tok, task, metric):
    cfg = FinetuneConfig(task=task, model=tiny_bert(tok), lr=1e-3, epochs=1, batch_size=16, max_length=64,
                         max_train_examples=48, max_eval_examples=24, eval_every=0)
    r = finetune(cfg, tokenizer=tok)
    assert r.status == "completed" and r.eval_examples == 24
    assert r.main_metric == metric and 0 <= r.score <= (100 if task == "qa" else 1)
    assert len(r.history) == 1 and all(h["loss"] > 0 for h in r.train.history if h["kind"] == "train")


# ---------------------------------------------------------------------------------------------
# bf16 autocast: the path a CUDA run takes by default (precision "auto"), run here on the CPU
# ---------------------------------------------------------------------------------------------
def test_bf16_autocast_on_cpu_learns_and_stays_close_to_fp32(synthetic, tok):
    """precision="bf16" takes the loop's autocast branch that "auto" takes on CUDA: the matmuls run in bf16,
    the loss still falls, and the run tracks the fp32 run of the same seed and batches."""
    seen: dict[str, set[torch.dtype]] = {}
    runs = {}
    for precision in ("fp32", "bf16"):
        dtypes: set[torch.dtype] = set()

        def record(module, args, out, dtypes=dtypes):
            if isinstance(module, torch.nn.Linear) and isinstance(out, torch.Tensor):
                dtypes.add(out.dtype)

        handle = torch.nn.modules.module.register_module_forward_hook(record)
        try:
            cfg = quick("sst2", synthetic["sst2"], tok, extra_train={"precision": precision})
            runs[precision] = finetune(cfg, tokenizer=tok)
        finally:
            handle.remove()
        seen[precision] = dtypes
    assert seen["fp32"] == {torch.float32} and torch.bfloat16 in seen["bf16"]  # autocast really ran
    fp32, bf16 = runs["fp32"], runs["bf16"]
    assert bf16.status == "completed" and bf16.error is None
    loss32, loss16 = losses(fp32), losses(bf16)
    assert len(loss16) == len(loss32) and loss16[-1] < 0.5 * loss16[0]
    assert max(abs(a - b) for a, b in zip(loss32, loss16)) < 0.05
    assert bf16.score >= 0.9 and abs(bf16.score - fp32.score) <= 0.05
    # the weights stay fp32 (autocast casts on the fly), so the model saves and runs as an fp32 one
    assert {p.dtype for p in bf16.model.parameters()} == {torch.float32}
    texts = ["what a superb film", "the story felt dull", "this movie is brilliant", "all in all boring"]
    torch.testing.assert_close(logits_of(bf16.model, tok, texts), logits_of(fp32.model, tok, texts),
                               atol=0.15, rtol=0.1)


def test_default_encoder_is_the_offline_defaults_encoder_as_the_package_ships_it(default_model, bare_default):
    """`load("default-encoder")`: the start of the pair and span tasks; the package's weights, no heads,
    none of the layers bertlab's MLM/NSP heads re-trained."""
    encoder, tok = load("default-encoder")
    shipped, _ = bare_default
    assert encoder.config.pretraining_heads == () and encoder.config.task is None
    assert encoder.load_report.source == "default-encoder"
    assert encoder.state_dict().keys() == shipped.state_dict().keys()
    assert all(torch.equal(v, shipped.state_dict()[k]) for k, v in encoder.state_dict().items())
    layer = "bert.encoder.layer.5.output.dense.weight"
    assert not torch.equal(encoder.state_dict()[layer], default_model[0].state_dict()[layer])
    assert tok.vocab_size == default_model[1].vocab_size


@pytest.mark.parametrize("member", ["distilbert", "albert"])
def test_adapter_mode_trains_every_encoder_norm_under_the_familys_own_names(member, tmp_path):
    from tiny_models import family_folder

    model, _ = load(family_folder(tmp_path, member))
    norms = [n for n, _ in model.named_parameters() if n.startswith(model.family.prefix + ".") and
             n.endswith(("norm.weight", "LayerNorm.weight"))]
    named = [n for n in norms if "LayerNorm" not in n]  # DistilBERT's sa_layer_norm, ALBERT's full_layer_layer_norm
    assert named, norms
    assert all(is_trainable(n, "adapter", model.family) for n in norms)
    assert not is_trainable(norms[0], "feature", model.family)


def test_a_new_task_head_starts_from_the_runs_seed_not_from_what_ran_before(synthetic, tok):
    """Two runs with one seed give one model, whatever the global random state was before each."""
    models = []
    for before in (1, 2):
        cfg = quick("sst2", synthetic["sst2"], tok, epochs=1, max_train_examples=32)  # tiny_bert seeds torch
        torch.manual_seed(before)
        r = finetune(cfg, tokenizer=tok)
        models.append(r.model.state_dict())
    assert models[0].keys() == models[1].keys()
    assert all(torch.equal(models[0][k], models[1][k]) for k in models[0])


# ---------------------------------------------------------------------------------------------
# What a run leaves on disk
# ---------------------------------------------------------------------------------------------
def test_a_finished_run_keeps_its_model_and_replay_and_says_what_it_dropped(synthetic, tok, tmp_path):
    """A finished run kept its last checkpoint (the weights again + the optimizer state, 3x the model) and
    fp16 snapshots with a full first one: now one weights file and the snapshots stored as what changed."""
    from bertlab.training.snapshots import REPLAY_DIR, SnapshotKeeper, iter_snapshots

    out = tmp_path / "run"
    keeper = SnapshotKeeper(out / REPLAY_DIR)
    cfg = quick("sst2", synthetic["sst2"], tok, epochs=1, out_dir=str(out), checkpoint_every=2)
    r = finetune(cfg, callbacks=[keeper], tokenizer=tok)
    assert r.status == "completed" and r.saved_to == out
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "finetune_results.json", "model.safetensors",
                                                     REPLAY_DIR, "tokenizer.json", "tokenizer_config.json",
                                                     "vocab.txt"]  # no checkpoints/, nothing twice
    disk = read_results(out)["disk"]
    assert disk["dropped"].startswith("checkpoints/ (checkpoint-") and "optimizer state" in disk["dropped"]
    assert "what changed" in disk["replay"]
    frames = dict((step, {n: p.detach().clone() for n, p in m.named_parameters()})
                  for step, m in iter_snapshots(load(out)[0], out / REPLAY_DIR, last_first=False))
    assert list(frames) == keeper.saved
    for name, p in r.model.named_parameters():  # the last frame is the final model
        torch.testing.assert_close(frames[keeper.saved[-1]][name], p.detach(), atol=1e-6, rtol=1e-6)


@pytest.fixture
def small_disk(tmp_path):
    """A real small filesystem (a tmpfs of `size` bytes) at tmp_path / "disk"; skipped where mounting is not
    allowed (not root)."""
    mounted = []

    def make(size: str) -> Path:
        where = tmp_path / "disk"
        where.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                              capture_output=True, check=False)
        if done.returncode:
            pytest.skip(f"cannot mount a small filesystem here: {done.stderr.decode()[:200]}")
        mounted.append(where)
        return where

    yield make
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)  # lazily: a loaded model may still map a file


def _leftovers(folder: Path) -> list[str]:
    return [str(p.relative_to(folder)) for p in folder.rglob("*") if p.name.startswith((".tmp-", ".trash-"))]


def test_a_run_that_fills_the_disk_ends_with_its_last_good_checkpoint(synthetic, tok, small_disk):
    """On a 20 MB filesystem the first checkpoint (~13 MB with the optimizer state) fits, the second does
    not: the run ends failed with the disk-full message, its first checkpoint whole, nothing half-written."""
    from bertlab.training.checkpoint import read_state

    out = small_disk("20m") / "run"
    cfg = quick("sst2", synthetic["sst2"], tok, epochs=2, out_dir=str(out), checkpoint_every=4,
                extra_train={"keep_last": 1})
    r = finetune(cfg, tokenizer=tok)
    assert r.status == "failed" and r.error.startswith(f"the disk is full while writing {out / 'checkpoints'}")
    assert r.saved_to == out / "checkpoints" / "checkpoint-4" and read_state(r.saved_to).step == 4
    model, _ = load(r.saved_to)  # the last good checkpoint loads
    assert model.config.id2label == {0: "negative", 1: "positive"}
    assert _leftovers(out) == [] and not (out / "config.json").exists()
    assert read_results(out)["status"] == "failed"


def test_a_final_save_that_fills_the_disk_keeps_the_last_checkpoint(synthetic, tok, small_disk):
    """Training ends, its last checkpoint fits, the final model does not: a message, and the checkpoint."""
    out = small_disk("16m") / "run"
    cfg = quick("sst2", synthetic["sst2"], tok, epochs=1, out_dir=str(out))
    with pytest.raises(DiskFullError, match=f"^the disk is full while writing {out}: free some space"):
        finetune(cfg, tokenizer=tok)
    kept = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert len(kept) == 1 and load(out / "checkpoints" / kept[0])[0] is not None
    assert _leftovers(out.parent) == [] and not (out / "config.json").exists()
