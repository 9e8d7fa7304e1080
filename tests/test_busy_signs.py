"""A busy sign (and the button greyed out) on every slow action of the tabs: what the student sees while the
kernel works. Each test catches the panel in the middle of its work (the slow function, wrapped) and reads
its message line there."""

from __future__ import annotations

import pytest
from tiny_models import tiny_bert


def _during(monkeypatch, module, name: str, panel, button) -> list[tuple[str | None, bool]]:
    """Wrap `module.name`: each call records (the panel's busy text, whether `button` is greyed out)."""
    seen: list[tuple[str | None, bool]] = []
    real = getattr(module, name)

    def wrapped(*args, **kwargs):
        seen.append((panel._busy_text, button.disabled))
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapped)
    return seen


def test_the_cls_picture_shows_a_busy_sign(tok, tmp_path, shared_data, monkeypatch):
    import bertlab.panels.use as use_module
    from bertlab.panels.finetune import FinetunePanel
    from bertlab.tasks import SST2_LABELS

    model = tiny_bert(tok, seed=1).with_heads(task="sequence_classification", id2label=SST2_LABELS)
    use = FinetunePanel(model, tok, runs_dir=tmp_path, device="cpu").use
    seen = _during(monkeypatch, use_module, "cls_maps", use, use.pca_button)
    use.pca_button.click()
    assert seen and seen[0][0] and tok.cls_token in seen[0][0] and seen[0][1], seen
    assert use._busy_text is None and not use.pca_button.disabled and "bertlab-busy" not in use.message.value


@pytest.mark.parametrize("fmt", ["png", "html"])
def test_an_export_shows_a_busy_sign(default_model, tmp_path, monkeypatch, fmt):
    import bertlab.panels.export as export_module
    from bertlab.viz.mask import empty_figure

    model, tok = default_model
    fig = empty_figure("x")
    fig.add_scatter(x=[0, 1], y=[1, 0])
    panel = export_module.ExportPanel(model, tok, figures=lambda: {"a figure": fig}, folder=tmp_path)
    panel.format.value = fmt
    seen = _during(monkeypatch, export_module, "export_figure", panel, panel.export_button)
    panel.export_button.click()
    assert seen and seen[0][0] and fmt.upper() in seen[0][0] and seen[0][1], seen
    view = _during(monkeypatch, export_module, "attention_page", panel, panel.view_button)
    panel.view_button.click()
    assert view and view[0][0] and view[0][1], view
