"""Ablation tab: switch attention heads off and watch the masked word's log-probability move;
the effect of every head alone as a layer x head heatmap; the logit lens at the [MASK]."""

from __future__ import annotations

import html

import ipywidgets as widgets
import plotly.graph_objects as go
import torch

from bertlab.analysis.ablation import (
    AblationResult,
    HeadEffects,
    LogitLens,
    head_ablation,
    logit_lens,
    single_head_effects,
)
from bertlab.panels.base import Panel, lacks, run_button
from bertlab.panels.classroom import AnswerHold
from bertlab.panels.views import Hold, on_input
from bertlab.tokenizer import Tokenizer, spell_specials
from bertlab.viz.ablation import ablation_notes, plot_head_effects, plot_logit_lens, summary_html
from bertlab.viz.figure_widget import box_figures, show_figure, shown_figure
from bertlab.viz.theme import help_html

DEFAULT_TEMPLATE = "The capital of France is {mask}."  # spelled with the model's mask token
DEFAULT_TEXT = spell_specials(DEFAULT_TEMPLATE)  # as the offline default (WordPiece) spells it
DEFAULT_TARGET = "paris"
NEXT_TOKEN_TEXT = "The capital of France is"  # a left-to-right model's lens reads the guess for what follows
TOP_K = 5
HELP = (
    "Click heads in the grid to switch them off (red = off): their output is multiplied by 0 and the "
    "change in the target's log-probability (nats) is shown. “Effect of every head” switches off each "
    "head alone (click a cell of the heatmap to switch that head off). The logit lens applies the MLM "
    "head to the {mask}'s vector after every layer: where does the answer appear?"
)


class AblationPanel(Panel):
    """Head ablation and the logit lens for one masked word."""

    title = "Ablation"
    teaches = (
        "Switching heads off shows which ones the prediction depends on, and the logit lens shows "
        "in which layer the answer appears."
    )

    def __init__(
        self, model: torch.nn.Module, tok: Tokenizer, text: str | None = None, target: str = DEFAULT_TARGET
    ) -> None:
        super().__init__()
        self.answer_hold = AnswerHold.of_kernel()  # the class question's answer, until the teacher reveals it
        self.model, self.tok = model, tok
        if text is None and model.family.causal:  # its top guess for the next token is followed
            text, target = NEXT_TOKEN_TEXT, ""
        text = tok.spell(DEFAULT_TEMPLATE) if text is None else text
        self.text = widgets.Text(
            value=text, description="Text", placeholder=f"A sentence with one {tok.mask_token}",
            continuous_update=False,
            layout=widgets.Layout(width="min(100%, 720px)"),
        )
        self.target = widgets.Text(
            value=target, description="Target", placeholder="blank = the model's top guess",
            continuous_update=False, tooltip="The word (one vocabulary piece) whose probability to follow",
        )
        self.show_button = run_button()
        self.reset_button = widgets.Button(description="All heads on", tooltip="Switch every head back on")
        self.grid = widgets.GridBox(layout=widgets.Layout(grid_gap="2px"))
        self.heads_label = widgets.HTML("<b>Heads</b> (rows = layers, columns = heads; click to switch off)")
        self.head_buttons: list[list[widgets.ToggleButton]] = []
        self.summary = widgets.HTML()
        self.effects_button = widgets.Button(
            description="Effect of every head", tooltip="Switch off each head alone (one run per head)",
        )
        self.progress = widgets.IntProgress(
            value=0, min=0, max=1, description="", layout=widgets.Layout(visibility="hidden", width="240px"),
        )
        self.effects_box = widgets.VBox(layout=widgets.Layout(width="100%"))
        self.lens_box = widgets.VBox(layout=widgets.Layout(width="100%"))
        help_text = HELP.format(mask=html.escape(tok.mask_token))
        self.help = widgets.HTML(help_html(help_text))

        self.ablation: AblationResult | None = None
        self.lens: LogitLens | None = None
        self.effects: HeadEffects | None = None
        self._effects_inputs: tuple[str, str | None] | None = None  # (text, target) of `effects`
        self.hold = Hold()  # set while the panel itself flips head buttons

        self._build_grid()
        on_input(self._on_text, self.text, self.target, self.show_button)
        self.reset_button.on_click(self._on_reset)
        self.effects_button.on_click(self._on_effects)
        self._widget = widgets.VBox(
            [
                self.text,
                widgets.HBox([self.target, self.show_button]),
                self.message,
                self.heads_label,
                self.grid,
                self.reset_button,
                self.summary,
                widgets.HBox([self.effects_button, self.progress]),
                self.effects_box,
                self.lens_box,
                self.help,
            ],
            layout=widgets.Layout(width="100%"),
        )
        self.update()

    # -- callbacks: read the widgets, call the pure functions, assign ------------------------
    def _on_text(self, _=None) -> None:
        with self.busy(self.show_button):
            self.update()

    def _on_head_toggle(self, change: dict) -> None:
        button = change["owner"]
        button.button_style = "danger" if button.value else ""
        if self.hold:
            return
        with self.reporting():
            if self._ready():
                self._run_ablation()

    def _on_reset(self, _=None) -> None:
        with self.reporting():
            with self.hold():
                for row in self.head_buttons:
                    for button in row:
                        button.value = False
            if self._ready():
                self._run_ablation()

    def _on_effects(self, _=None) -> None:
        with self.busy(self.show_button, text="Switching off each head in turn…"), self.reporting():
            if self._ready():
                self._run_effects()

    def _on_effects_click(self, trace, points, selector) -> None:
        """A click on the effects heatmap switches that head off (or on again)."""
        with self.reporting():
            for head, layer in zip(points.xs, points.ys):
                button = self.head_buttons[int(layer)][int(head)]
                button.value = not button.value

    def update(self, effects_again: bool = False) -> None:
        """Recompute for the current text and target: the ablation and the lens. Head effects made
        for other inputs are dropped (73 runs: the button asks for them), or re-made with `effects_again`."""
        with self.reporting():
            ahead = bool(getattr(self.model, "has_lm", False))  # a next-word head: the next-token lens
            for w in (self.heads_label, self.grid, self.reset_button, self.effects_button, self.progress):
                w.layout.display = "none" if ahead else None  # a left-to-right model: no masked word to ablate
            if ahead:
                return self._next_token_lens()
            if not self._ready():
                return
            self._run_ablation()
            self._run_lens()
            if self.effects is not None and self._effects_inputs != self._inputs():
                if effects_again:
                    self._run_effects()
                else:
                    self._drop_effects()

    def set_model(self, model: torch.nn.Module, tok: Tokenizer) -> None:
        """Same text and target, another model: a grid of its heads, everything recomputed."""
        self.model, self.tok = model, tok
        self._build_grid()
        self._effects_inputs = None  # made by the other model
        self.update(effects_again=True)

    def figures(self) -> dict[str, go.Figure]:
        """The head-effects heatmap (once computed) and the logit lens."""
        return box_figures({"head effects": self.effects_box, "logit lens": self.lens_box})

    # the figures on show (None before a first result, or while there is none)
    effects_figure = property(lambda self: shown_figure(self.effects_box))
    lens_figure = property(lambda self: shown_figure(self.lens_box))

    # -- state ----------------------------------------------------------------------------
    def heads_off(self) -> list[tuple[int, int]]:
        """(layer, head) of every head switched off in the grid."""
        return [(la, h) for la, row in enumerate(self.head_buttons) for h, b in enumerate(row) if b.value]

    def _ready(self) -> bool:
        """Whether this model can predict the masked word, and may now (not the class question's
        answer before the reveal); if not, say why."""
        lack = lacks(self.model, "mlm_head")
        held = self.answer_hold.note(self.text.value, self.tok.mask_token) if lack is None else None
        if lack is None and held is None:
            return True
        self._clear()
        if held is not None:
            self.show_message(held, "info")
        else:
            self.show_message(f"{lack} This tab ablates heads of its masked-word prediction.", "warning")
        return False

    def _clear(self) -> None:
        """No results on show (the model or the input cannot be used): the message says why."""
        self.ablation = self.lens = self.effects = None
        self._effects_inputs = None
        self.summary.value = ""
        self.effects_box.children, self.lens_box.children = (), ()
        self.effects_button.disabled = True

    def _build_grid(self) -> None:
        """One toggle per head of this model; heads switched off before stay off where they exist."""
        cfg = self.model.config
        was_off = set(self.heads_off())
        self.head_buttons = [
            [
                widgets.ToggleButton(
                    value=(layer, head) in was_off, description=str(head),
                    tooltip=f"layer {layer}, head {head}: click to switch it off / on",
                    button_style="danger" if (layer, head) in was_off else "",
                    layout=widgets.Layout(width="34px", padding="0"),
                )
                for head in range(cfg.num_attention_heads)
            ]
            for layer in range(cfg.num_hidden_layers)
        ]
        cells: list[widgets.Widget] = []
        for layer, row in enumerate(self.head_buttons):
            cells.append(widgets.HTML(f'<span style="line-height:28px">layer {layer}</span>'))
            cells.extend(row)
            for button in row:
                button.observe(self._on_head_toggle, names="value")
        self.grid.layout.grid_template_columns = f"64px repeat({cfg.num_attention_heads}, 34px)"
        self.grid.children = cells

    def _target(self) -> str | None:
        return self.target.value.strip() or None

    def _inputs(self) -> tuple[str, str | None]:
        return self.text.value, self._target()

    # -- computing and drawing ------------------------------------------------------------
    def _run_ablation(self) -> None:
        try:
            result = head_ablation(self.model, self.tok, self.text.value, self.heads_off(), self._target(), k=TOP_K)
        except Exception:  # the input cannot be used: the previous input's results go with it
            self._clear()
            raise
        self.ablation = result
        self.effects_button.disabled = False
        self.summary.value = summary_html(result)
        unknown = self.unknown_notes(result.query.tokens)
        self.show_messages(ablation_notes(result, self.tok.mask_token, self._target() is None, unknown))

    def _run_lens(self) -> None:
        lens = logit_lens(self.model, self.tok, self.text.value, self._target(), k=TOP_K)
        self.lens = lens
        show_figure(self.lens_box, plot_logit_lens(lens))

    def _next_token_lens(self) -> None:
        """A left-to-right model: no masked word to ablate heads of, but the lens reads its next-token guess."""
        self._clear()
        try:
            self._run_lens()
        finally:  # the lens's own error (a bad text) comes after this note
            why = " (it reads left to right)" if self.model.family.causal else ""
            self.show_message(f"This {self.model.family.title} model predicts the next word{why}, not a masked one. "
                              "This tab ablates heads of masked-word prediction, so its head switches are hidden; "
                              "the next-token lens below reads the guess for the word after your text after every "
                              "layer.", "info")

    def _run_effects(self) -> None:
        """Every head switched off alone, with a progress bar (the button waits meanwhile)."""
        cfg = self.model.config
        self.effects_button.disabled = True
        self.progress.value, self.progress.max = 0, 1 + cfg.num_hidden_layers * cfg.num_attention_heads
        self.progress.layout.visibility = "visible"
        try:
            effects = single_head_effects(self.model, self.tok, *self._inputs(), progress=self._tick)
        finally:
            self.effects_button.disabled = False
            self.progress.layout.visibility = "hidden"
        self.effects, self._effects_inputs = effects, self._inputs()
        old = self.effects_figure
        if show_figure(self.effects_box, plot_head_effects(effects)) is not old:  # a new widget: make it clickable
            self.effects_figure.data[0].on_click(self._on_effects_click)

    def _drop_effects(self) -> None:
        self.effects, self._effects_inputs = None, None
        self.effects_box.children = ()
        self.show_messages(self.messages + [
            ("info", "The head effects were for the previous text: press “Effect of every head” again."),
        ])

    def _tick(self, done: int, total: int) -> None:
        self.progress.max, self.progress.value = total, done
        self.progress.description = f"{done}/{total}"

