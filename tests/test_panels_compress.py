"""Compression tab without a browser: a tiny SST-2 classifier (2 layers, 32 wide, the MiniLM
vocabulary) quantized, pruned and distilled through the panel's widgets in class mode; every
variant lands in the table and the plot with the original, joins the model list and is saved in
the student's workspace; refusals and a path outside the workspace show as messages."""

from __future__ import annotations

import html
import random
from pathlib import Path

import pytest
import torch

import bertlab
from bertlab.compressed.structure import heads_per_layer
from bertlab.config import BertConfig
from bertlab.families.bert import Bert
from bertlab.panels.app import TABS
from bertlab.panels.compress import CompressPanel
from bertlab.tasks import SST2_LABELS
from bertlab.viz.compress import variants_html
from bertlab.workspace import Workspace

pytestmark = pytest.mark.usefixtures("one_thread")


def classifier(vocab: int, layers: int = 2) -> Bert:
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=128, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, task="sequence_classification", id2label=dict(SST2_LABELS))
    return Bert(cfg).eval()


def write_sst2(folder: Path) -> Path:
    rng = random.Random(0)
    folder.mkdir(parents=True)
    for name, n in (("train.tsv", 64), ("dev.tsv", 24)):
        rows = ["sentence\tlabel"]
        for _ in range(n):
            label = rng.randint(0, 1)
            rows.append(f"the film was {rng.choice(['good', 'fun'] if label else ['bad', 'dull'])} today\t{label}")
        (folder / name).write_text("\n".join(rows) + "\n")
    return folder


@pytest.fixture
def panel(tok, tmp_path):
    ws = Workspace(tmp_path / "ws")  # class mode: typed paths and outputs stay in here
    data = write_sst2(ws.uploads / "sst2")
    made: list = []
    p = CompressPanel(classifier(tok.vocab_size), tok, workspace=ws, latency_reps=1)
    p.model_made = lambda name, m, t: made.append((name, m))
    p.path.value = str(data)
    p.max_train.value, p.max_dev.value = 64, 24
    p.made_list = made
    return p


def errors(panel) -> str:
    return " ".join(text for level, text in panel.messages if level == "error")


def test_the_tab_is_in_the_app():
    assert ("Compression", "bertlab.panels.compress:CompressPanel") in TABS


def test_each_method_makes_a_variant_that_joins_the_table_the_plot_and_the_list(panel, tok):
    ws_runs = panel.workspace.runs
    for method in ("quantize", "prune", "distill"):
        panel.method.value = method
        if method == "distill":
            panel.layers.value, panel.epochs.value, panel.lr.value = 1, 1, 1e-3
        panel.start_button.click()
        assert panel.start_button.disabled and not panel.cancel_button.disabled or not panel.job.running
        assert panel.job.wait(60), method
        assert not errors(panel), errors(panel)
        assert not panel.start_button.disabled and "bertlab-busy" not in panel.message.value
    names = [v["name"] for v in panel.variants]
    assert [v["method"] for v in panel.variants] == ["original", "int8", "int8 (onnxruntime)", "pruned",
                                                     "distilled"], names
    original = panel.variants[0]
    assert all(v["baseline"] == original for v in panel.variants[1:])  # each compared with the model it came from
    assert all(v["score"] is not None and v["latency_ms_b1"] > 0 for v in panel.variants)
    int8, ort, pruned, student = panel.variants[1:]
    assert int8["disk_mb"] < 0.4 * original["memory_mb"]
    assert pruned["heads"] == 4 and student["layers"] == 1
    # the table: one row per variant; the plot: one marker per variant, grouped by method
    assert panel.table.value.count("<tr>") == 1 + 5
    plot = panel.plot_box.children[0]
    assert sorted(t.name for t in plot.data) == ["distilled", "int8", "int8 (onnxruntime)", "original", "pruned"]
    assert sum(len(t.x) for t in plot.data) == 5
    # the last curve drawn is the student's (loss by step); the pruning curve was drawn before it
    assert panel.curve_box.children[0].data[0].x
    # the variants joined the model list (not ONNX Runtime's file: no torch model), and each folder reloads
    assert [name for name, _ in panel.made_list] == [names[1], *names[3:]]
    folders = [Path(v["folder"]) for v in (int8, pruned, student)]
    assert all(ws_runs in f.parents for f in folders)
    again, _ = bertlab.load(str(folders[1]))
    assert heads_per_layer(again) == heads_per_layer(panel.made_list[1][1])
    assert "runs/" in panel.message.value  # where it was saved, as the student sees it


def test_the_pruning_curve_draws_every_fraction(panel):
    panel.method.value = "prune"
    panel.keep.value = 0.25
    panel.start()
    assert panel.job.wait(60)
    curve = panel.curve_box.children[0]
    assert list(curve.data[0].x) == [8, 7, 6, 6, 5, 4, 3, 2, 2, 2]  # heads kept, one head per layer at least
    assert panel.variants[-1]["heads"] == 2 and "figures" not in errors(panel)
    assert set(panel.figures()) == {"variants", "curve"}


def test_refusals_are_messages(panel, tok):
    panel.set_model(Bert(BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                                    num_attention_heads=4, intermediate_size=64)), tok)
    panel.method.value = "prune"
    panel.start_button.click()
    assert "no sentiment, NLI or NER head" in errors(panel) and not panel.job.running
    panel.method.value = "quantize"  # quantization needs no task: size and speed only
    panel.start_button.click()
    assert panel.job.wait(60) and not errors(panel)
    assert panel.variants[-1]["method"] == "int8" and panel.variants[-1]["score"] is None
    panel.set_model(panel.made_list[-1][1], tok)
    panel.start_button.click()
    assert "int8 already" in errors(panel)
    panel.set_model(classifier(tok.vocab_size), tok)
    panel.path.value = "/etc"
    panel.method.value = "prune"
    panel.start_button.click()
    assert "Only files in your workspace" in errors(panel) and not panel.job.running


def test_a_run_shows_a_busy_sign_and_cancel_stops_it(panel):
    panel.method.value = "distill"
    panel.layers.value, panel.epochs.value = 1, 50
    panel.start()
    assert "bertlab-busy" in panel.message.value and panel.start_button.disabled
    panel.cancel_button.click()
    assert panel.job.wait(60)
    assert not errors(panel) and "bertlab-busy" not in panel.message.value
    assert not panel.start_button.disabled and panel.cancel_button.disabled
    assert all(v["method"] != "distilled" for v in panel.variants) and not panel.made_list


def test_a_cancelled_distillation_does_not_join_the_model_list(panel):
    """Cancelled after its first steps: no row, no entry in the model list, no folder; the message says so."""
    panel.method.value = "distill"
    panel.layers.value, panel.epochs.value = 1, 50
    real = panel._on_event

    def cancel_at_2(event):
        real(event)
        if event.kind == "step" and event.step == 2:
            panel.cancel_button.click()

    panel._on_event = cancel_at_2
    panel.start_button.click()
    assert panel.job.wait(60) and panel.job.cancelled
    assert [v["method"] for v in panel.variants] == ["original"] and not panel.made_list
    warnings = " ".join(text for level, text in panel.messages if level == "warning")
    assert "not kept" in warnings and not errors(panel)
    assert not list(panel.workspace.runs.glob("*compress-distill*"))  # the run's folder went with it


def test_one_latency_per_model_per_session(panel):
    """The original scored again on other dev examples keeps the latency it was timed with first."""
    panel.method.value = "quantize"
    panel.start_button.click()
    assert panel.job.wait(60) and not errors(panel)
    panel.max_dev.value = 10
    panel.method.value = "prune"
    panel.start_button.click()
    assert panel.job.wait(60) and not errors(panel)
    originals = [v for v in panel.variants if v["method"] == "original"]
    assert [v["eval_examples"] for v in originals] == [24, 10]
    for field in ("latency_ms_b1", "latency_ms_b32", "latency_range_b1", "latency_range_b32"):
        assert originals[0][field] == originals[1][field], field
    assert "timed once a session" in panel.table.value


def test_a_pruned_row_says_why_it_is_barely_smaller(panel):
    """A small model's heads are a small part of its weights: the row says how much pruning took, measured."""
    panel.method.value = "prune"
    panel.start_button.click()
    assert panel.job.wait(60) and not errors(panel)
    row = panel.variants[-1]
    assert row["method"] == "pruned" and row["why"]
    assert "of this model's weights" in row["why"] and "matmul work" in row["why"]
    assert "under 1% of this model's weights" in row["why"]  # 2 layers 32 wide beside 30,522 embedding rows
    assert html.escape(row["why"]) in panel.message.value and html.escape(row["why"]) in panel.table.value


def test_pruned_why_speaks_of_noise_or_of_when_it_was_timed():
    from bertlab.compress.lab import pruned_why

    base = {"memory_mb": 10.0, "disk_mb": None, "latency_ms_b1": 10.0, "latency_range_b1": (9.0, 11.0)}
    shares = {"weights_removed": 0.08, "embeddings_share": 0.5, "work_removed": 0.2}
    slower = {"memory_mb": 9.2, "disk_mb": None, "latency_ms_b1": 16.0, "latency_range_b1": (15.0, 17.0)}
    text = pruned_why(slower, base, shares)
    assert "8% of this model's weights" in text and "50% of it" in text and "20% of its matmul work" in text
    assert "0.62× the original's speed" in text and "different moments" in text and "1.25×" in text
    close = {**slower, "latency_ms_b1": 10.2, "latency_range_b1": (9.5, 10.9)}
    assert "cannot be told apart" in pruned_why(close, base, shares)
    clearly = {"memory_mb": 5.0, "disk_mb": None, "latency_ms_b1": 5.0, "latency_range_b1": (4.9, 5.1)}
    assert pruned_why(clearly, base, shares) == "" and pruned_why(slower, base, {}) == ""


def test_a_variant_compressed_again_is_compared_with_its_own_row(panel, tok):
    panel.method.value = "prune"
    panel.start()
    assert panel.job.wait(60)
    pruned = panel.variants[-1]
    panel.set_model(panel.made_list[-1][1], tok)  # the student picks the pruned model in the list
    panel.method.value = "quantize"
    panel.start()
    assert panel.job.wait(60) and not errors(panel)
    torch_rows = [v for v in panel.variants if v["method"] != "int8 (onnxruntime)"]
    assert [v["method"] for v in torch_rows] == ["original", "pruned", "int8"]
    assert torch_rows[-1]["baseline"] is pruned and torch_rows[-1]["heads"] == pruned["heads"]


def test_scores_compare_only_on_the_same_dev_examples_and_timings_show_their_spread(panel):
    panel.method.value = "quantize"
    panel.start()
    assert panel.job.wait(60) and not errors(panel)
    panel.max_dev.value = 10  # the student asks for fewer dev examples: the original is scored again on them
    panel.start()
    assert panel.job.wait(60) and not errors(panel)
    torch_rows = [v for v in panel.variants if v["method"] != "int8 (onnxruntime)"]
    methods = [(v["method"], v["eval_examples"]) for v in torch_rows]
    assert methods == [("original", 24), ("int8", 24), ("original", 10), ("int8", 10)]
    for row in torch_rows[1::2]:  # each int8 row is compared with the original scored on its own examples
        base = row["baseline"]
        assert base["eval_key"] == row["eval_key"] and base["eval_examples"] == row["eval_examples"]
    assert "both on the same 10 held-out examples" in panel.message.value
    assert "scored on" in panel.table.value and all(v["latency_range_b1"] for v in panel.variants)


def test_a_delta_between_scores_on_other_examples_is_not_shown():
    base = {"name": "original", "method": "original", "layers": 2, "heads": 8, "memory_mb": 1.0, "disk_mb": None,
            "latency_ms_b1": 10.0, "latency_ms_b32": 100.0, "score": 0.9, "eval_examples": 500, "eval_key": "a",
            "latency_range_b1": (9.0, 11.0), "latency_range_b32": (90.0, 110.0)}
    other = {**base, "name": "int8", "method": "int8", "score": 0.4, "eval_examples": 20, "eval_key": "b",
             "latency_ms_b1": 9.5, "latency_range_b1": (9.2, 9.9), "latency_ms_b32": 50.0,
             "latency_range_b32": (48.0, 52.0), "baseline": base}
    table = variants_html([{**base, "baseline": None}, other])
    assert "-50.0" not in table and "+" not in table.split("int8")[-1].split("</tr>")[0]
    assert "1.05 (noise)" in table and "2.00 (noise)" not in table and "2.00" in table
    same = variants_html([{**other, "eval_key": "a"}])
    assert "-50.0" in same


def test_an_essay_in_the_data_field_is_one_short_message(panel):
    panel.path.value = "word " * 5000
    panel.start_button.click()
    panel.job.wait(30)
    text = errors(panel)
    assert "not a path" in text and "Errno" not in text and len(text) < 300


def test_variants_without_scores_are_plotted_by_size_not_at_no_height():
    from bertlab.viz.compress import plot_variants

    def row(name, method, ms, mb, score=None):
        return {"name": name, "method": method, "latency_ms_b1": ms, "disk_mb": mb, "score": score, "heads": 72,
                "layers": 6}

    # a model without a task head: nothing is scored, so size is the y axis and every variant is drawn
    fig = plot_variants([row("original", "original", 49.0, 87.3), row("int8", "int8", 28.0, 22.7)])
    assert sorted(y for tr in fig.data for y in tr.y) == [22.7, 87.3]
    assert fig.layout.yaxis.title.text == "size (MB)" and "not scored" in fig.layout.title.text
    # scored and unscored together: the scored on the score axis, the others named under the plot
    fig = plot_variants([row("original", "original", 49.0, 87.3, 0.9), row("int8", "int8", 28.0, 22.7)])
    assert [list(tr.y) for tr in fig.data] == [[0.9]]
    assert "not scored, so not drawn: int8" in fig.layout.annotations[0].text


def test_a_data_path_a_headless_model_cannot_use_is_said_unread_and_never_opened(tok, tmp_path, monkeypatch):
    """Quantizing a model with no task head scores nothing: whatever the Data field holds (here a file
    outside the workspace) is not opened, and the page says the field went unread."""
    import bertlab.panels.compress as compress

    ws = Workspace(tmp_path / "ws")
    torch.manual_seed(0)
    headless = Bert(BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                               intermediate_size=64, max_position_embeddings=128)).eval()
    p = CompressPanel(headless, tok, workspace=ws, latency_reps=1)
    p.model_made = lambda name, m, t: None
    opened = []
    monkeypatch.setattr(compress.TaskData, "read", lambda *a, **k: opened.append(a) or pytest.fail("data read"))
    secret = tmp_path / "secret.txt"
    secret.write_text("do-not-show-this\n")
    p.path.value = str(secret)
    p.method.value = "quantize"
    p.start_button.click()
    assert p.job.wait(60)
    assert not errors(p) and not opened
    warnings = [text for level, text in p.messages if level == "warning"]
    assert warnings == [compress.DATA_UNREAD]
    assert "do-not-show-this" not in p.message.value and "Data field was not read" in p.message.value
    p.path.value = ""
    p.start_button.click()
    assert p.job.wait(60)
    assert not [text for level, text in p.messages if level == "warning"]  # an empty field: nothing to say


def test_int8_runs_beside_onnx_runtime_on_the_same_sentences(panel):
    """The int8 model exported to ONNX: ONNX Runtime's row beside torch's, timed in turns, scored on the same
    dev examples, the .onnx file in the variant's folder; a missing onnxruntime is said plainly."""
    pytest.importorskip("onnxruntime")
    import onnxruntime

    from bertlab.compress.onnx import OnnxRuntimeModel

    panel.method.value = "quantize"
    panel.start_button.click()
    assert panel.job.wait(120) and not errors(panel), panel.messages
    original, int8, ort = panel.variants
    assert ort["method"] == "int8 (onnxruntime)" and ort["eval_key"] == int8["eval_key"]
    assert abs(ort["score"] - int8["score"]) <= 2 / 24  # the same int8 weights: at most a couple of answers differ
    assert Path(ort["folder"]).parent == Path(int8["folder"]) and Path(ort["folder"]).name == "model-int8.onnx"
    assert ort["latency_range_b1"] and int8["latency_range_b1"]
    assert "ONNX Runtime runs the same int8 model" in panel.message.value
    # the file ONNX Runtime runs gives the int8 model's logits (within int8 rounding of the activations)
    session = onnxruntime.InferenceSession(ort["folder"], providers=["CPUExecutionProvider"])
    assert {i.name for i in session.get_inputs()} <= {"input_ids", "token_type_ids", "attention_mask"}
    small = panel.made_list[0][1]
    b = panel.tok.encode_batch(["the film was good today", "bad"], max_length=32)
    peer = OnnxRuntimeModel(ort["folder"], small)
    with torch.no_grad():
        ours = small(b.input_ids, b.token_type_ids, b.attention_mask).logits
    torch.testing.assert_close(peer(b.input_ids, b.token_type_ids, b.attention_mask).logits, ours, atol=0.05, rtol=0)


def test_without_onnx_runtime_the_tab_says_how_to_get_it(panel, monkeypatch):
    import bertlab.compress.lab as lab
    from bertlab.compress.onnx import ONNX_MISSING

    monkeypatch.setattr(lab, "onnx_missing", lambda: ONNX_MISSING)
    panel.method.value = "quantize"
    panel.start_button.click()
    assert panel.job.wait(60) and not errors(panel)
    assert [v["method"] for v in panel.variants] == ["original", "int8"]
    warnings = [text for level, text in panel.messages if level == "warning"]
    assert warnings == [ONNX_MISSING] and 'bert-classroom-lab[onnx]' in ONNX_MISSING


def test_an_export_that_fails_leaves_torchs_row_and_says_why(panel, monkeypatch):
    import bertlab.compress.lab as lab

    def no_export(*args, **kwargs):
        raise RuntimeError("Exporting the operator 'aten::made_up' to ONNX opset 17 is not supported")

    monkeypatch.setattr(lab, "export_int8", no_export)
    panel.method.value = "quantize"
    panel.start_button.click()
    assert panel.job.wait(60) and not errors(panel)
    assert [v["method"] for v in panel.variants] == ["original", "int8"] and panel.made_list
    warnings = " ".join(text for level, text in panel.messages if level == "warning")
    assert "could not be exported to ONNX (RuntimeError: Exporting the operator" in warnings
