"""bench/finetune_table.py writes the docs' fine-tuning rows, and the page shows only the rows measured with
today's defaults."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from bertlab.training.finetune_defaults import RECIPES, recipe

ROOT = Path(__file__).resolve().parent.parent


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _summary(task: str = "nli", mode: str = "full", **config) -> dict:
    """What `bertlab finetune` writes to OUT/finetune_results.json (the fields the table reads)."""
    r = recipe(task, mode)
    cfg = {"model": r.model, "epochs": r.epochs, "lr": r.lr, "batch_size": r.batch_size, "max_length": r.max_length,
           "warmup_ratio": r.warmup_ratio, **config}
    return {"config": cfg, "mode": mode, "main_metric": "accuracy", "score": 0.8571,
            "metrics": {"accuracy": 0.8571, "confusion_matrix": [[1]]},
            "history": [{"epoch": 1.0, "accuracy": 0.8}, {"epoch": 2.0, "accuracy": 0.8571}],
            "train_examples": 4439, "eval_examples": 495, "trainable_parameters": 10, "wall_time_s": 380.5,
            "device": "cpu", "data": "4,439 training pairs"}


def test_a_row_re_run_replaces_only_itself(tmp_path):
    table = _module("finetune_table")
    path = tmp_path / "t.json"
    for name, score in (("nli", 0.5), ("ner", 0.7), ("nli", 0.9)):
        row = table.row_from_results(name, "nli", [], {**_summary(), "score": score}, 12.0, 1, "1")
        table.merge_row(path, row)
    rows = json.loads(path.read_text())["rows"]
    assert [(r["name"], r["score"]) for r in rows] == [("ner", 0.7), ("nli", 0.9)]
    assert rows[1]["command"] == "bertlab finetune --task nli" and (rows[1]["threads"], rows[1]["cpus"]) == (1, "1")
    assert rows[1]["metrics"] == {"accuracy": 0.8571}  # no confusion matrix in the table file


def test_every_row_is_a_finetune_command_and_names_are_unique():
    table = _module("finetune_table")
    names = [r.name for r in table.ROWS]
    assert len(names) == len(set(names)) and {"nli", "ner", "qa", "sst2"} <= set(names)
    assert all((r.task, "full") in RECIPES for r in table.ROWS)


def test_the_page_shows_only_rows_measured_with_todays_defaults(tmp_path):
    table = _module("finetune_table")
    today = table.row_from_results("nli", "nli", [], _summary(), 400.0, 1, "1", data="SICK TRAIN")
    old = table.row_from_results("ner", "ner", [], _summary("ner", epochs=99), 400.0, 2, None, data="CoNLL")
    (tmp_path / "finetune_table.json").write_text(json.dumps({"rows": [today, old]}))
    text = _module("render").block("results.md", "finetune-table", tmp_path)
    assert "SICK TRAIN" in text and "CoNLL" not in text  # the row of other defaults is left out
    assert "| SICK (NLI) | SICK TRAIN | full |" in text and "accuracy 85.7; by epoch 80.0 / 85.7" in text
    assert "| 6.3 min |" in text
