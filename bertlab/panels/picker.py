"""The model picker above every tab: the offline default, a hub name, a local folder, or a
model made in the training tabs. Switching here updates every tab (see ModelState)."""

from __future__ import annotations

import html
import logging

import ipywidgets as widgets

from bertlab.panels.base import Panel
from bertlab.panels.state import ModelState

log = logging.getLogger(__name__)

HELP = (
    "Type a Hugging Face name (e.g. bert-base-uncased: needs the network or the hub cache) "
    "or a local folder with config.json + model.safetensors, then press Load."
)


def model_card(model, name: str) -> str:
    """HTML: what the current model is and which heads it has."""
    c = model.config
    n = sum(p.numel() for p in model.parameters()) / 1e6
    task = (c.task or "").replace("_", " ")
    labels = ", ".join(str(v) for v in (c.id2label or {}).values())

    def mark(ok: bool, what: str) -> str:
        colour, sign = ("#1a7f37", "✓") if ok else ("#888", "✗")
        return f'<span style="color:{colour};margin-right:12px">{sign} {what}</span>'

    heads = mark(model.has_mlm, "MLM head") + mark(model.has_nsp, "NSP head")
    named = f": {task}" if task else ""
    named += f" ({labels})" if labels and len(labels) < 80 else ""
    heads += mark(bool(task), f"task head{named}")
    return (
        f'<div style="line-height:1.6"><b>{html.escape(name)}</b> · {c.num_hidden_layers} layers · '
        f"{c.hidden_size} wide · {c.num_attention_heads} heads · {n:.1f} M parameters · "
        f"vocabulary {c.vocab_size:,} · up to {c.max_position_embeddings} tokens<br>{heads}</div>"
    )


class ModelPicker(Panel):
    """Pick or load the model every tab shows."""

    title = "Model"

    def __init__(self, state: ModelState) -> None:
        super().__init__()
        self.state = state
        self.choice = widgets.Dropdown(
            options=list(state.entries), value=state.name, description="Model",
            layout=widgets.Layout(width="min(100%, 420px)"),
        )
        self.source = widgets.Text(
            placeholder="hub name or local folder", layout=widgets.Layout(width="min(100%, 360px)"),
        )
        self.load_button = widgets.Button(description="Load", tooltip="Load this model and show it in every tab")
        self.card = widgets.HTML(model_card(state.model, state.name))
        self._syncing = False  # True while _on_state rewrites the dropdown (its changes are not the student's)
        self.help = widgets.HTML(f'<div style="color:#555;font-size:0.85em">{HELP}</div>')
        self.choice.observe(self._on_choice, names="value")
        self.load_button.on_click(self._on_load)
        self.source.continuous_update = False
        state.observe(self._on_state)
        self._widget = widgets.VBox(
            [widgets.HBox([self.choice, self.source, self.load_button]), self.card, self.message],
            layout=widgets.Layout(width="100%", border="1px solid #ddd", padding="4px 8px"),
        )

    @property
    def widget(self) -> widgets.VBox:
        return self._widget

    def _on_choice(self, change) -> None:
        if self._syncing or change["new"] == self.state.name:
            return
        with self.reporting():
            self.show_message(f"Loading {change['new']}…")
            self.state.switch(change["new"])
            self.show_messages([])

    def _on_load(self, _=None) -> None:
        source = self.source.value.strip()
        with self.reporting():
            if not source:
                raise ValueError("Type a Hugging Face model name or a local folder first.")
            from bertlab.loading import load

            self.load_button.disabled = True
            self.show_message(f"Loading {source}…")
            try:
                model, tok = load(source)
            finally:
                self.load_button.disabled = False
            self.state.add(source, model, tok, source=source, switch=True)
            notes = [("info", f"Loaded {source}: every tab now shows it.")]
            missing = [h for h, has in (("MLM", model.has_mlm), ("NSP", model.has_nsp)) if not has]
            if missing:
                notes.append(("warning", (f"It has no {' / '.join(missing)} head: the tabs that need one say so "
                                          "(the Pre-training tab can train one).")))
            self.show_messages(notes)

    def _on_state(self, state: ModelState) -> None:
        """Another part of the app added or switched a model: list it and show its card."""
        self._syncing = True
        try:
            self.choice.options = list(state.entries)
            self.choice.value = state.name
        finally:
            self._syncing = False
        self.card.value = model_card(state.model, state.name)
