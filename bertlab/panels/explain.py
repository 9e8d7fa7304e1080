""""Does attention explain it?": a section a tab adds under its prediction (Mask, Next sentence,
"Use it"). Closed it costs nothing; opened, it computes the attribution of the tab's prediction and
draws it beside the attention from the same token and the rollout, with their rank agreement and
the heads test (switch off the heads the attention credits: does the prediction move?)."""

from __future__ import annotations

import html
from collections.abc import Callable

import ipywidgets as widgets
import plotly.graph_objects as go
import torch

from bertlab.analysis.attention_check import DEFAULT_HEADS_OFF, AttentionCheck, check_attention
from bertlab.analysis.attribution import METHOD_NAMES, Attribution, ExplainInput, Target, attribute
from bertlab.inputs import InputError
from bertlab.model import MissingHeadError
from bertlab.panels.base import Panel, clear_view
from bertlab.panels.views import Hold, on_input
from bertlab.tokenizer import Tokenizer
from bertlab.viz.explain import explain_notes, plot_attention_check
from bertlab.viz.figure_widget import show_figure
from bertlab.viz.theme import BOX_BORDER, help_html

# request(choice) -> (input, target): what the tab explains now; raises InputError when there is nothing.
Request = Callable[[int], tuple[ExplainInput, Target]]
TITLE = "Does attention explain it?"
NOTHING_TO_EXPLAIN = "Nothing to explain until the tab shows a prediction: its message above says why."
HELP = (
    "Attention says where a token looks; an attribution says what the prediction rests on. Integrated "
    "gradients follow the prediction's probability from a baseline (each word replaced by the {pad} "
    "token) to your input and share the change among the tokens: red helped the prediction, blue worked "
    "against it, and the scores add up to the change (the completeness gap says how closely). The rows are "
    "each scaled to their largest value; the black box is the token the prediction is read at. ρ and τ: "
    "do attention and rollout rank the words as the attribution does (1: same order, 0: unrelated)? "
    "Bottom: switch off the heads the attention view credits and see whether the prediction moves, "
    "compared with as many heads picked at random."
)


class ExplainSection(Panel):
    """The attribution of a tab's prediction beside its attention, in a section that opens on demand."""

    title = TITLE

    def __init__(self, model: torch.nn.Module | None, tok: Tokenizer | None, request: Request,
                 choices: list[str] | None = None, seed: int = 0, host: Panel | None = None) -> None:
        """`host`: the tab the section sits in; when its message line says why there is no prediction,
        the section points there instead of saying it again."""
        super().__init__()
        self.model, self.tok, self.request, self.seed, self.host = model, tok, request, seed, host
        self.toggle = widgets.ToggleButton(
            value=False, description=TITLE, layout=widgets.Layout(width="auto"),
            tooltip="Attribution (integrated gradients) beside attention and rollout, and a test of the heads",
        )
        self.toggle.add_class("bertlab-explain-toggle")  # for the browser tests
        self.method = widgets.ToggleButtons(
            options=[(METHOD_NAMES["ig"], "ig"), (METHOD_NAMES["grad-x-input"], "grad-x-input")], value="ig",
            description="Attribution", style=widgets.ToggleButtonsStyle(button_width="auto"))
        self.choice = widgets.Dropdown(description="Explain", layout=widgets.Layout(width="min(100%, 420px)"))
        self.layer = widgets.Dropdown(description="Attention", layout=widgets.Layout(width="220px"))
        self.head = widgets.Dropdown(description="Head", layout=widgets.Layout(width="200px"))
        self.explain_button = widgets.Button(description="Explain", button_style="primary",
                                             tooltip="Compute the attribution and the checks again")
        self.figure_box = widgets.VBox([])
        self.figure_box.add_class("bertlab-explain-figure")
        self.help = widgets.HTML()
        self.attribution: Attribution | None = None
        self.check: AttentionCheck | None = None
        self._key: tuple | None = None  # what `attribution` was computed for
        self._stale = True  # the tab's prediction changed since the section last computed
        self.hold = Hold()  # set while the section fills its own dropdowns: no recompute
        self.set_choices(choices or [])
        self._fill_attention_options()
        self.body = widgets.VBox(
            [self.help, widgets.HBox([self.choice, self.method], layout=widgets.Layout(flex_flow="row wrap")),
             widgets.HBox([self.layer, self.head, self.explain_button], layout=widgets.Layout(flex_flow="row wrap")),
             self.message, self.figure_box],
            layout=widgets.Layout(display="none", width="100%", border=BOX_BORDER, padding="4px"),
        )
        self._widget = widgets.VBox([self.toggle, self.body], layout=widgets.Layout(width="100%"))
        self._widget.add_class("bertlab-explain")
        self.toggle.observe(self._on_toggle, names="value")
        self.explain_button.on_click(lambda _b: self.run())
        on_input(lambda _c: self._on_setting(), self.method, self.choice)
        on_input(lambda _c: self._on_view(), self.layer, self.head)

    @property
    def is_open(self) -> bool:
        return bool(self.toggle.value)

    def set_model(self, model: torch.nn.Module | None, tok: Tokenizer | None, refresh: bool = True) -> None:
        """Another model; `refresh` False when the tab refreshes the section itself after redrawing."""
        self.model, self.tok = model, tok
        self._fill_attention_options()
        if refresh:
            self.refresh()

    def set_choices(self, choices: list[str]) -> None:
        """What the tab can explain (e.g. one entry per hidden word); the dropdown hides for one or none."""
        old = [label for label, _ in self.choice.options]
        keep = old[self.choice.value] if self.choice.value is not None and self.choice.value < len(old) else None
        with self.hold():
            self.choice.options = [(label, i) for i, label in enumerate(choices)]
            self.choice.value = choices.index(keep) if keep in choices else (0 if choices else None)
        self.choice.layout.display = None if len(choices) > 1 else "none"

    def refresh(self) -> None:
        """The tab's prediction changed: recompute now if the section is open, else when it opens."""
        self._stale = True
        if self.is_open and self.model is not None:
            self.run()
        else:
            self._clear()

    def figures(self) -> dict[str, go.Figure]:
        if self.check is None or not self.figure_box.children:
            return {}
        return {"does attention explain it": go.Figure(self.figure_box.children[0])}

    # -- callbacks -------------------------------------------------------------------------
    def _on_toggle(self, change) -> None:
        self.body.layout.display = None if change["new"] else "none"
        if change["new"] and (self._stale or self.check is None):
            self.run()

    def _on_setting(self) -> None:
        if self.hold:
            return
        if self.is_open:
            self.run()
        else:
            self._stale = True

    def _on_view(self) -> None:
        """Another attention view: the attribution stays, the check is redone (no gradients)."""
        if self.hold:
            return
        if self.is_open and self.attribution is not None and not self._stale:
            self.run(reuse=True)
        elif self.is_open:
            self.run()

    # -- computing and drawing -------------------------------------------------------------------
    def run(self, reuse: bool = False) -> None:
        """Compute the attribution (unless `reuse` and it is current) and the checks; draw them."""
        method = self.method.value
        text = "Computing integrated gradients…" if method == "ig" else "Computing gradient × input…"
        help_text = html.escape(HELP.format(pad=self.tok.pad_token))
        self.help.value = help_html(help_text)
        with self.busy(self.explain_button, self.method, self.layer, self.head, text=text):
            self.show_messages([])
            self.check = None  # until the new figure is drawn
            with self.reporting(self.figure_box):  # an old figure never stays under a new message
                asked = self._asked()
                if asked is not None:
                    ex, target = asked
                    key = (tuple(ex.input_ids[0].tolist()), tuple(ex.token_type_ids[0].tolist()), target, method)
                    if not (reuse and key == self._key and self.attribution is not None):
                        self.attribution = attribute(self.model, self.tok, ex, target, method=method)
                        self._key = key
                    layer = None if self.layer.value in (None, -1) else int(self.layer.value)
                    head = None if layer is None or self.head.value in (None, -1) else int(self.head.value)
                    self.check = check_attention(self.model, ex, target, self.attribution, layer, head,
                                                 heads_off=DEFAULT_HEADS_OFF, seed=self.seed)
                    self._stale = False
                    show_figure(self.figure_box, plot_attention_check(self.check, self.attribution))  # in place
                    self.show_messages(explain_notes(self.attribution, self.check))
        self.head.disabled = self.layer.value in (None, -1)  # a head is picked within a layer

    def _asked(self) -> tuple[ExplainInput, Target] | None:
        """What the tab asks to explain now; None (the figure cleared, a note) when it has no prediction.
        The tab's own message line already says what is wrong with its input: the section never repeats
        it as a second error, it points there (or says it, when the tab shows no message)."""
        try:
            return self.request(self.choice.value or 0)
        except (InputError, MissingHeadError) as e:
            clear_view(self.figure_box)
            said = self.host is not None and self.host.messages
            self.show_message(NOTHING_TO_EXPLAIN if said else f"Nothing to explain: {e}", "info")
            return None

    def _clear(self) -> None:
        self.check = None
        clear_view(self.figure_box)
        self.show_messages([])

    def _fill_attention_options(self) -> None:
        """The model's layers and heads in the attention dropdowns (the picks kept where it has them)."""
        if self.model is None:  # "Use it" before any fine-tuned model: nothing to pick yet
            return
        cfg = self.model.config
        with self.hold():
            layer = self.layer.value if isinstance(self.layer.value, int) \
                and self.layer.value < cfg.num_hidden_layers else -1
            self.layer.options = [("all layers", -1)] + [(f"layer {i}", i) for i in range(cfg.num_hidden_layers)]
            self.layer.value = layer
            head = self.head.value if isinstance(self.head.value, int) \
                and self.head.value < cfg.num_attention_heads else -1
            self.head.options = [("mean of heads", -1)] + [(f"head {h}", h) for h in range(cfg.num_attention_heads)]
            self.head.value = head
