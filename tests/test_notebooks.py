"""The teaching notebooks: stored without outputs, and each one runs from top to bottom in a fresh
kernel with no error, drawing a figure where a cell asks for one and a widget where a cell shows one."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
NEEDS_DATA = {"05_fine_tuning.ipynb", "06_what_bert_knows.ipynb",  # read SST-2, CoNLL, UD,
              "07_before_and_around_bert.ipynb"}  # WikiText-2 from BERTLAB_DATA
PLOTLY = "application/vnd.plotly.v1+json"
WIDGET = "application/vnd.jupyter.widget-view+json"


def _last_line(cell) -> str:
    lines = [line for line in cell.source.strip().splitlines() if line.strip() and not line.startswith(" ")]
    return lines[-1] if lines else ""


def _expects(cell) -> str | None:
    """What the cell's last expression should display: a plotly figure, a widget, or nothing we check."""
    last = _last_line(cell)
    if last.startswith("plot_"):
        return PLOTLY
    if last.endswith(".widget") or last.startswith(("AttentionView(", "bertviz_")):
        return WIDGET
    return None


def _mimes(cell) -> set[str]:
    return {mime for out in cell.get("outputs", []) for mime in out.get("data", {})}


def test_there_are_teaching_notebooks():
    assert len(NOTEBOOKS) >= 5, [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_stored_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not dirty, f"{path.name}: cells {dirty} hold outputs; strip them before committing"
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# "), "a title first"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, tmp_path, monkeypatch, request):
    if path.name in NEEDS_DATA:
        request.getfixturevalue("shared_data")  # sets BERTLAB_DATA, or skips without the data
    monkeypatch.setenv("BERTLAB_NOTEBOOK_EXAMPLES", "64")  # the fine-tuning notebook's runs, kept short
    monkeypatch.setenv("BERTLAB_MODELS", str(tmp_path / "models"))
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()

    errors = [out for c in nb.cells for out in c.get("outputs", []) if out.output_type == "error"]
    assert not errors, json.dumps(errors[0], indent=1)[:2000] if errors else ""
    checked = 0
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or (want := _expects(cell)) is None:
            continue
        assert want in _mimes(cell), f"{path.name} cell {i} ({_last_line(cell)!r}) shows {_mimes(cell)}, not {want}"
        checked += 1
    assert checked >= 2, f"{path.name}: only {checked} cells show a figure or a widget"


MEMBER_NOTEBOOKS = [p for p in NOTEBOOKS if p.name not in NEEDS_DATA]  # the ones that read only a model


@pytest.fixture(scope="module")
def modern_members(tmp_path_factory):
    """Tiny random ModernBERT and DeBERTa-v3 masked LMs with their tokenizers (no NSP head, no segments)."""
    import torch
    import transformers
    from test_family_deberta import VARIANTS, deberta_tokenizer
    from test_family_modernbert import modernbert_tokenizer, write_checkpoint

    root = tmp_path_factory.mktemp("members")
    hf_tok = deberta_tokenizer()
    torch.manual_seed(0)
    cfg = transformers.DebertaV2Config(**{**VARIANTS["v3"], "vocab_size": len(hf_tok)})
    transformers.DebertaV2ForMaskedLM(cfg).save_pretrained(root / "deberta")
    hf_tok.save_pretrained(root / "deberta")
    return {"modernbert": write_checkpoint(root / "mb", "ModernBertForMaskedLM", modernbert_tokenizer()),
            "deberta": root / "deberta"}


@pytest.mark.slow
@pytest.mark.parametrize("member", ["modernbert", "deberta"])
@pytest.mark.parametrize("path", MEMBER_NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_with_a_modern_member(path, member, modern_members, tmp_path, monkeypatch):
    """Each notebook that reads only a model runs with ModernBERT and DeBERTa-v3 loaded instead of the default:
    no layer number the model lacks, no NSP it was not trained with; every plotting cell still draws."""
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    nb = nbformat.read(path, as_version=4)
    loads = 0
    for cell in nb.cells:
        if cell.cell_type == "code" and "bertlab.load()" in cell.source:
            cell.source = cell.source.replace("bertlab.load()", f"bertlab.load({str(modern_members[member])!r})")
            loads += 1
    assert loads == 1
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [out for c in nb.cells for out in c.get("outputs", []) if out.output_type == "error"]
    assert not errors, json.dumps(errors[0], indent=1)[:2000] if errors else ""
    described = "".join(out.get("text", "") for out in nb.cells[1].outputs if out.output_type == "stream")
    assert member.split("-")[0] in described.lower() or "deberta" in described.lower()
    drawn = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and _expects(c) and _expects(c) in _mimes(c)]
    assert len(drawn) >= 2, f"{path.name} with {member}: only cells {drawn} drew"
