"""Text similarity, two ways, on SICK's relatedness: the `sts` task (a cross-encoder with a regression head)
and the frozen encoder's mean-pooled sentence embeddings compared by cosine. The metrics on known values
(scipy as the reference), the reader, a tiny regression fine-tune whose folder transformers loads with equal
logits, the evaluate CLI's JSON line, the cosine against sentence-transformers' own encoding, and the
Embeddings tab's "Sentences" sub-tab and "Use it" view built on tiny models. Tiny models on CPU, no timing."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
from tiny_models import tiny_bert

from bertlab.analysis.predict import relatedness
from bertlab.analysis.sentences import (
    cosine_score,
    one_against_many,
    pair_cosines,
    sentence_embeddings,
    sick_cosine_score,
    split_sentences,
)
from bertlab.inputs import InputError
from bertlab.loading import load
from bertlab.tasks import DataFormatError, ScoredExample, get_task, read_train_dev
from bertlab.tasks.metrics import MetricError, pearson, ranks, regression_metrics, spearman
from bertlab.tasks.models import model_task
from bertlab.training.finetune import FinetuneConfig, FinetuneError, evaluate, finetune, with_task_head
from bertlab.training.finetune_cli import add_evaluate_parser, add_finetune_parser
from bertlab.training.finetune_defaults import recipe

pytestmark = pytest.mark.usefixtures("one_thread")  # torch on one thread (see conftest)

HEADER = "pair_ID\tsentence_A\tsentence_B\tentailment_label\trelatedness_score\tSemEval_set"
PEOPLE, PLACES = ["John", "Mary", "Peter", "Susan", "David", "Laura"], ["Paris", "London", "Rome", "Tokyo"]
PAIRS = [  # (sentence A, sentence B, relatedness): a handful of real-looking SICK-style pairs
    ("A man is playing a guitar.", "A person is playing a guitar.", 4.8),
    ("A man is playing a guitar.", "A man is playing a flute.", 3.4),
    ("A woman is slicing an onion.", "A woman is cutting an onion.", 4.9),
    ("A woman is slicing an onion.", "A dog is running in the park.", 1.1),
    ("Two children are swimming in a pool.", "Kids are swimming.", 4.3),
    ("Two children are swimming in a pool.", "A man is reading a newspaper.", 1.2),
]


def write_sick(folder: Path, n_train: int = 96, n_dev: int = 30) -> Path:
    """Relatedness a tiny model can learn: 'someone plays' is close (4.8), 'nobody plays' half (3.5), a cook far."""
    g = torch.Generator().manual_seed(3)

    def pick(items: list[str]) -> str:
        return items[int(torch.randint(len(items), (1,), generator=g))]

    rows, pid = [HEADER], 0
    for part, n in (("TRAIN", n_train), ("TRIAL", n_dev)):
        for i in range(n):
            k = i % 3
            b = ("someone plays", "nobody plays", f"{pick(PEOPLE)} cooks")[k]
            label, score = (("ENTAILMENT", 4.8), ("CONTRADICTION", 3.5), ("NEUTRAL", 1.2))[k]
            pid += 1
            rows.append(f"{pid}\t{pick(PEOPLE)} plays the guitar in {pick(PLACES)}\t{b}\t{label}\t{score}\t{part}")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "SICK_synthetic.txt").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def sick(tmp_path_factory) -> Path:
    return write_sick(tmp_path_factory.mktemp("sick"))


@pytest.fixture(scope="module")
def sts_run(sick, tok, tmp_path_factory):
    """A full-mode sts run of a tiny BERT on the synthetic pairs, saved (shared by several tests)."""
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("runs") / "sts"
    cfg = FinetuneConfig(task="sts", data=str(sick), model=tiny_bert(tok), lr=1e-2, epochs=6, batch_size=16,
                         max_length=32, log_every=2, warmup_ratio=0.0, out_dir=str(out),
                         precision="fp32")  # bf16 autocast (a CPU with native bf16) rounds a tiny model's numbers
    return finetune(cfg, tokenizer=tok)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bertlab")
    sub = parser.add_subparsers(dest="command")
    add_finetune_parser(sub)
    add_evaluate_parser(sub)
    return parser


def notes(panel, section: int, level: str) -> str:
    return " ".join(text for lvl, text in panel.notes[section] if lvl == level)


def logits_of(model, tok, pairs) -> torch.Tensor:
    batch = tok.encode_batch([a for a, _, _ in pairs], [b for _, b, _ in pairs])
    model.eval()
    with torch.no_grad():
        return model(batch.input_ids, batch.token_type_ids, batch.attention_mask).logits


# -- metrics ----------------------------------------------------------------------------------
def test_correlations_and_mse_on_known_values():
    stats = pytest.importorskip("scipy.stats")
    assert pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert ranks([3.5, 1.0, 3.5, 2.0]) == [3.5, 1.0, 3.5, 2.0]  # ties share their mean rank
    x, y = [4.5, 3.2, 3.2, 1.0, 4.9, 2.2, 3.2], [4.1, 3.9, 2.8, 1.7, 4.0, 3.3, 3.0]  # ties, as in SICK
    assert pearson(x, y) == pytest.approx(stats.pearsonr(x, y)[0], abs=1e-12)
    assert spearman(x, y) == pytest.approx(stats.spearmanr(x, y)[0], abs=1e-12)
    scores = regression_metrics([1.0, 2.0, 4.0], [1.0, 3.0, 2.0])
    assert scores["mse"] == pytest.approx((0 + 1 + 4) / 3)
    assert set(scores) == {"pearson", "spearman", "mse"}
    assert pearson([2, 2, 2], [1, 2, 3]) == 0.0  # a constant side: no correlation to speak of
    with pytest.raises(MetricError, match="at least 2"):
        pearson([1.0], [2.0])
    with pytest.raises(MetricError):
        regression_metrics([1.0, 2.0], [1.0])


# -- the task ---------------------------------------------------------------------------------
def test_the_task_reads_relatedness_from_sicks_parts(sick, tmp_path):
    task = get_task("sts")
    assert task.regression and task.main_metric == "pearson" and dict(task.id2label) == {0: "relatedness"}
    split = read_train_dev(task, sick)
    assert (len(split.train), len(split.dev)) == (96, 30) and not split.held_out  # TRAIN and TRIAL, as nli
    assert isinstance(split.dev[0], ScoredExample) and {e.score for e in split.train} == {4.8, 3.5, 1.2}
    assert {e.guid for e in split.train}.isdisjoint(e.guid for e in split.dev)
    bad = tmp_path / "SICK_bad.txt"
    bad.write_text(f"{HEADER}\n1\tA man sings\tA man sings\tENTAILMENT\t7.5\tTRAIN\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match="line 2: relatedness_score 7.5 is outside 1-5"):
        task.read("train", path=bad)
    bad.write_text(f"{HEADER}\n1\tA man sings\tA man sings\tENTAILMENT\thigh\tTRAIN\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match="line 2: relatedness_score must be a number"):
        task.read("train", path=bad)


def test_the_real_sick_split_holds_out_the_trial_part(shared_data):
    split = read_train_dev(get_task("sts"))
    assert (len(split.train), len(split.dev)) == (4439, 495)
    nli = read_train_dev(get_task("nli"))
    assert [e.guid for e in split.dev] == [e.guid for e in nli.dev]  # the same held-out pairs as entailment


def test_a_tiny_regression_fine_tune_learns_and_saves_a_regression_folder(sts_run):
    r = sts_run
    assert r.status == "completed" and r.main_metric == "pearson"
    assert {"pearson", "spearman", "mse"} <= set(r.metrics) and r.metrics["examples"] == 30
    gold = [e.score for e in get_task("sts").read("dev", path=Path(r.data_note.rsplit(" from ", 1)[1][:-1]))]
    variance = sum((g - sum(gold) / len(gold)) ** 2 for g in gold) / len(gold)
    assert r.score > 0.8 and r.metrics["mse"] < 0.5 * variance  # well below always saying the mean
    assert model_task(r.model) == "sts"
    config = json.loads((Path(r.saved_to) / "config.json").read_text())
    assert config["problem_type"] == "regression" and config["id2label"] == {"0": "relatedness"}
    assert config["architectures"] == ["BertForSequenceClassification"]
    assert recipe("sts").epochs == 3 and FinetuneConfig(task="sts").resolved().lr == recipe("sts").lr


def test_transformers_loads_the_regression_folder_with_equal_logits(sts_run, tok):
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.set_verbosity_error()
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(sts_run.saved_to).eval()
    assert hf.config.problem_type == "regression" and hf.config.num_labels == 1
    batch = tok.encode_batch([a for a, _, _ in PAIRS], [b for _, b, _ in PAIRS])
    with torch.no_grad():
        theirs = hf(input_ids=batch.input_ids, token_type_ids=batch.token_type_ids,
                    attention_mask=batch.attention_mask).logits
    ours = logits_of(sts_run.model, tok, PAIRS)
    assert ours.shape == (len(PAIRS), 1)
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=1e-4)
    model, tok2 = load(sts_run.saved_to)  # and bertlab reads it back
    torch.testing.assert_close(logits_of(model, tok2, PAIRS), ours)


def test_evaluate_cli_prints_one_json_line(sts_run, sick, capsys):
    args = _parser().parse_args(["evaluate", "--task", "sts", "--model", str(sts_run.saved_to),
                                 "--data", str(sick)])
    assert args.func(args) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    scores = json.loads(lines[0])
    assert scores["task"] == "sts" and scores["main_metric"] == "pearson" and scores["examples"] == 30
    assert scores["pearson"] == pytest.approx(sts_run.metrics["pearson"], abs=1e-6)
    assert scores["spearman"] == pytest.approx(sts_run.metrics["spearman"], abs=1e-6)
    assert scores["mse"] == pytest.approx(sts_run.metrics["mse"], rel=1e-5)


def test_heads_of_other_tasks_are_refused_and_replaced(sts_run, sick, tok):
    nli = with_task_head(tiny_bert(tok), get_task("nli"))
    dev = get_task("sts").read("dev", path=sick)
    with pytest.raises(FinetuneError, match="needs a head with one output"):
        evaluate(nli, tok, "sts", dev)
    back = with_task_head(sts_run.model, get_task("nli"))  # sts -> nli: a 3-way head, no regression left
    assert back.config.num_labels == 3 and "problem_type" not in back.config.extra
    assert sts_run.model.config.extra["problem_type"] == "regression"  # the model given is unchanged
    with pytest.raises(InputError, match="one output"):
        relatedness(nli, tok, "A man sings.", "A man is singing.")


# -- the cosine of sentence embeddings --------------------------------------------------------
def test_the_cosine_equals_sentence_transformers_on_the_package_encoder(bare_default):
    st = pytest.importorskip("sentence_transformers")
    from bertlab.loading import default_model_folder

    model, tok = bare_default
    a, b = [p[0] for p in PAIRS], [p[1] for p in PAIRS]
    reference = st.SentenceTransformer(str(default_model_folder()), device="cpu")
    ea, eb = (torch.as_tensor(reference.encode(t, convert_to_numpy=True)) for t in (a, b))
    want = torch.nn.functional.cosine_similarity(ea, eb, dim=-1)
    got = torch.tensor(pair_cosines(model, tok, a, b, batch_size=4))  # batches padded: the mask must hold
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    score = cosine_score(model, tok, [ScoredExample(str(i), x, y, s) for i, (x, y, s) in enumerate(PAIRS)])
    gold = [s for _, _, s in PAIRS]
    assert score.pairs == 6 and score.pearson == pytest.approx(pearson(got.tolist(), gold), abs=1e-4)
    assert score.pearson > 0.8  # an encoder trained for this ranks these pairs the people's way


def test_one_against_many_and_bad_input(tok):
    model = tiny_bert(tok)
    vectors, encodings = sentence_embeddings(model, tok, ["A man sings.", "A dog runs."])
    assert vectors.shape == (2, 32) and [e.warning for e in encodings] == [None, None]
    result = one_against_many(model, tok, "A man sings.", ["A man sings.", "A dog runs."])
    assert result.cosines[0] == pytest.approx(1.0, abs=1e-5) and result.ranked()[0][0] == "A man sings."
    for text, message in (("", "empty"), ("   \n  ", "empty"), ("Only one sentence here.", "only one sentence")):
        with pytest.raises(InputError, match=message):
            split_sentences(text)
    first, others = split_sentences("One.\n\n  Two. \nThree.")
    assert (first, others) == ("One.", ["Two.", "Three."])
    long = one_against_many(model, tok, "A man sings.", ["word " * 600])  # a 3,000-character line
    assert long.warnings and "were cut" in long.warnings[0] and long.warnings[0].startswith("Sentence 2")


# -- the tabs ---------------------------------------------------------------------------------
def test_sentences_sub_tab_draws_bars_scores_on_sick_and_says_what_is_wrong(tok, monkeypatch, tmp_path):
    from bertlab.panels.similarity import SECTIONS, SimilarityPanel

    panel = SimilarityPanel(tiny_bert(tok), tok)
    section = SECTIONS.index("Sentences")
    panel.sections.selected_index = section  # the message line holds the open sub-tab's notes
    first, others = split_sentences(panel.sentences.value)
    bars = panel.sentences_figure.data[0]
    want = one_against_many(panel.model, panel.tok, first, others).cosines
    assert len(bars.x) == len(others) == 4 and list(bars.x) == pytest.approx(want, abs=1e-4)
    assert "sentence cosine" in panel.figures()
    panel.sentences.value = "Only one line."  # bad input: a message, and the old bars go
    assert panel.sentences_result is None and "only one sentence" in panel.message.value.lower()
    assert len(panel.sentences_figure.data) == 0 or not list(panel.sentences_figure.data[0].x or [])
    panel.sentences.value = "A man sings.\n" + "word " * 600  # 3,000 characters: cut to the model's limit
    assert panel.sentences_result is not None and "were cut" in notes(panel, section, "warning")
    panel.sentences.value = "A man sings.\n" + "x" * 3000  # one 3,000-character word: one unknown piece
    assert "vocabulary" in notes(panel, section, "warning")

    write_sick(tmp_path / "data" / "sick")  # BERTLAB_DATA's layout: sick/ holds the SICK file
    monkeypatch.setenv("BERTLAB_DATA", str(tmp_path / "data"))
    panel.score_pairs.value = 20
    panel.score_button.click()
    assert panel.score is not None and panel.score.pairs == 20 and "Pearson" in panel.score_out.value
    assert not panel.score_button.disabled and panel._busy_text is None  # the busy sign is gone
    monkeypatch.setenv("BERTLAB_DATA", str(tmp_path / "nowhere"))
    panel.score_button.click()
    assert panel.score is None and panel.score_out.value == "" and "BERTLAB_DATA" in panel.message.value


def test_score_on_sick_puts_a_fine_tuned_heads_scores_beside_the_cosine(sts_run, tok, monkeypatch, tmp_path):
    from bertlab.panels.similarity import SimilarityPanel

    write_sick(tmp_path / "sick")
    monkeypatch.setenv("BERTLAB_DATA", str(tmp_path))
    panel = SimilarityPanel(sts_run.model, tok)
    panel.score_pairs.value = 1000  # more than there are: all 30
    panel.score_button.click()
    head = evaluate(sts_run.model, tok, "sts", get_task("sts").read("dev"))
    assert panel.score.pairs == 30 and "regression head" in panel.score_out.value
    assert f"{head['pearson']:.3f}" in panel.score_out.value


def test_a_bf16_run_scores_its_numbers_in_fp32(sick, tok):
    cfg = FinetuneConfig(task="sts", data=str(sick), model=tiny_bert(tok), lr=1e-2, epochs=2, batch_size=16,
                         max_length=32, warmup_ratio=0.0, precision="bf16")
    r = finetune(cfg, tokenizer=tok)
    again = evaluate(r.model, tok, "sts", get_task("sts").read("dev", path=sick), max_length=32)  # no autocast
    assert r.precision == "bf16" and r.metrics["pearson"] == pytest.approx(again["pearson"], abs=1e-6)
    assert r.metrics["mse"] == pytest.approx(again["mse"], rel=1e-6)


def test_start_at_mean_sets_a_new_heads_bias(tok):
    from bertlab.training.finetune import regression_output, start_at_mean

    model = with_task_head(tiny_bert(tok), get_task("sts"))
    start_at_mean(model, [1.0, 2.0, 4.5])
    assert regression_output(model).bias.item() == pytest.approx(2.5) and model.config.num_labels == 1


def test_use_it_shows_a_predicted_relatedness(sts_run, tok):
    from bertlab.panels.use import UsePanel

    use = UsePanel(sts_run.model, tok)
    assert use.kind == "sts" and use.view.children[0] is use.views["sts"]
    want = relatedness(sts_run.model, tok, use.sts_a.value, use.sts_b.value).score
    assert "Predicted relatedness" in use.relatedness_out.value and f"{want:.2f}" in use.relatedness_out.value
    use.sts_b.value = "  "
    assert use.relatedness_out.value == "" and "empty" in use.message.value


def test_fine_tuning_tab_offers_the_task(tok, tmp_path):
    from bertlab.panels.finetune import FinetunePanel

    panel = FinetunePanel(tiny_bert(tok), tok, runs_dir=tmp_path, device="cpu")
    assert "sts" in [value for _, value in panel.task.options]
    panel.task.value = "sts"
    assert (panel.epochs.value, panel.lr.value) == (recipe("sts").epochs, pytest.approx(recipe("sts").lr))


def test_sick_cosine_score_reads_the_held_out_part(tok, sick):
    score, where = sick_cosine_score(tiny_bert(tok), tok, 10, path=str(sick))
    assert score.pairs == 10 and "TRIAL" in where and "30" in where


@pytest.mark.slow  # ~1 min on 2 cores: loads MiniLM twice and fine-tunes it on 400 pairs
def test_the_bench_script_writes_both_ways(shared_data, tmp_path):
    import subprocess
    import sys

    out = tmp_path / "sts.json"
    script = Path(__file__).resolve().parents[1] / "bench" / "bench_sts.py"
    proc = subprocess.run([sys.executable, str(script), "--quick", "--out", str(out)], capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert [r["encoder"].split(",")[1].strip() for r in data["rows"]] == ["frozen", "frozen", "fine-tuned"]
    assert all(r["pairs"] == 100 and -1 <= r["pearson"] <= 1 for r in data["rows"]) and data["meta"]["quick"]
