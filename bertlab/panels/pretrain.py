"""Pre-training tab: how BERT's training data is made, then pre-train a small model and watch it learn.

Section 1 masks one text as the training collator does (the 80/10/10 cases coloured, every strategy
side by side, RoBERTa's dynamic re-draws) and shows NSP / SOP pairs made from real documents.
Section 2 runs `training.pretrain.pretrain` in a background thread that only appends events to the run's
state (`training.run_state.PretrainRun`): loop events, the probe's guesses every N steps, where the model
was saved. The tab draws from that state on the kernel's thread (`draw`): a progress bar, live curves, the
probe, Stop at any time; the model (finished or stopped) joins the model picker through `self.model_made`.
The tab's words are in `viz/pretrain_words.py`.
"""

from __future__ import annotations

import functools
import html
import logging
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go
import torch

from bertlab.analysis import normalise_masks
from bertlab.analysis.mask import Candidate, fill_mask
from bertlab.analysis.replay import ReplayRun
from bertlab.panels.base import Level, Panel, input_notes, note_html
from bertlab.panels.pretrain_compare import CompareView
from bertlab.panels.replay import ReplaySection, read_run
from bertlab.panels.runs import error_text, run_controls
from bertlab.tokenizer import Tokenizer, spell_specials
from bertlab.training.checkpoint import save_model_atomically
from bertlab.training.corpora import (
    FALLBACK_DOCUMENTS,
    NAMED_SOURCES,
    Document,
    available_corpora,
    documents_for_run,
    read_corpus,
)
from bertlab.training.loop import TrainEvent, TrainResult
from bertlab.training.masking import STRATEGIES, TAGGED_STRATEGIES, tagged_text_needed
from bertlab.training.objectives import DEFAULT_OBJECTIVE, OBJECTIVES, get_objective
from bertlab.training.objectives.compare import ComparedRun, CurveRecorder
from bertlab.training.pretrain import (
    SIZES,
    PretrainConfig,
    new_model,
    objective_module,
    pretrain,
    pretrain_objective,
    require_tags,
)
from bertlab.training.preview import (
    TaggedSpans,
    VocabTables,
    dynamic_draws,
    example_pairs,
    mask_every_strategy,
    mask_example,
    spans_of_phrases,
    tagged_sentences,
    untagged_strategies,
    vocab_tables,
)
from bertlab.training.queue import waiting_text
from bertlab.training.run_state import Note, Outcome, PretrainRun
from bertlab.training.snapshots import REPLAY_DIR, SnapshotKeeper
from bertlab.viz import pretrain_words as words
from bertlab.viz.figure_widget import SyncedFigureWidget
from bertlab.viz.pretrain import (
    STRATEGY_NAMES,
    curve_xy,
    dynamic_html,
    masked_example_html,
    pairs_html,
    plot_pretrain_curves,
    probe_html,
    strategies_html,
)
from bertlab.viz.pretrain_words import DEFAULT_MENTIONS, DEFAULT_PROBE_TEMPLATE, DEFAULT_TEXT
from bertlab.viz.theme import HELP_STYLE, busy_html, help_html
from bertlab.workspace import Workspace

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_PROBE", "DEFAULT_TEXT", "FALLBACK_DOCUMENTS", "PretrainPanel"]  # bench_replay reads these

DEFAULT_SEED = 9  # shows all three 80/10/10 cases on the default text at 15 %
DEFAULT_PROBE = spell_specials(DEFAULT_PROBE_TEMPLATE)  # as the offline default (WordPiece) spells it
PAIR_SOURCE = "ovos-wiki"  # the quickest corpus to load; built-in documents when it is not installed
TAGGED_SOURCE = "conll2003"  # where the tagged sentences for entity / phrase masking come from
MAX_TOKENS = 128  # section 1 shows at most this many tokens (longer text is cut, with a note)



def lesson_lr(objective: str | None) -> dict[str, float]:
    """The learning rate of an objective's lesson-length run (the tab has no learning-rate field), else {}."""
    lesson = get_objective(objective).lesson if objective else {}
    return {"lr": lesson["lr"]} if "lr" in lesson else {}

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
        # texts whose mentions are known (entity / phrase masking): the default text, tagged sentences drawn
        self._tagged: dict[str, TaggedSpans] = {
            DEFAULT_TEXT: {k: spans_of_phrases(DEFAULT_TEXT, v) for k, v in DEFAULT_MENTIONS.items()}}
        self._tagged_draws = 0
        self._build_data_section(text, seed)
        self._build_train_section(probe)
        self._build_replay_section(probe)
        self.draw_example()
        self.draw_pairs()
        self._widget = widgets.VBox(
            [w for title, section in zip(words.SECTIONS, (self.data_section, self.train_section, self.replay.widget))
             for w in (widgets.HTML(f"<h3>{html.escape(title)}</h3>"), section)],
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
        self.tagged_draw = widgets.Button(description=words.TAGGED_BUTTON, icon="tags", tooltip=words.TAGGED_TOOLTIP)
        self.tagged_draw.on_click(self._on_tagged_draw)
        self.example_html = widgets.HTML()
        self.strategies_html = widgets.HTML()
        self.dynamic_html = widgets.HTML()
        self.pairs_html = widgets.HTML()
        for w in (self.text, self.strategy, self.rate):
            w.observe(lambda _: self.draw_example(), names="value")
        self.seed.observe(self._on_seed, names="value")
        self.new_draw.on_click(self._on_new_draw)
        help_data = words.HELP_DATA.format(mask=html.escape(self.tok.mask_token))
        note = widgets.HTML(help_html(help_data))
        self.data_section = widgets.VBox([
            note, self.text, self.strategy, widgets.HBox([self.rate, self.seed, self.new_draw, self.tagged_draw]),
            self.message,
            self.example_html,
            widgets.HTML(words.SAME_TEXT_HTML), self.strategies_html,
            widgets.HTML(words.DYNAMIC_HTML), self.dynamic_html,
            widgets.HTML(words.PAIRS_HTML), self.pairs_html,
        ])

    # -- section 1: callbacks -----------------------------------------------------------------
    def _on_seed(self, _=None) -> None:
        self.draw_example()
        self.draw_pairs()

    def _on_new_draw(self, _=None) -> None:
        self.seed.value = self.seed.value + 1  # redraws through _on_seed

    def _on_tagged_draw(self, _=None) -> None:
        """Put a tagged sentence of CoNLL-2003's training text in the text box (redraws through its observer)."""
        with self.reporting():
            sentences = tagged_sentences(self._load(TAGGED_SOURCE))
            self._tagged_draws += 1
            sentence, spans = random.Random(f"{self.seed.value}/{self._tagged_draws}").choice(sentences)
            self._tagged[sentence] = spans
            self.text.value = sentence
            self.show_message(words.TAGGED_FROM, "info")

    def draw_example(self) -> None:
        """Mask the text with the chosen strategy, rate and seed; show it, every strategy, and re-draws."""
        self.example = None  # until the new text is masked
        with self.reporting(self.example_html, self.strategies_html, self.dynamic_html):
            text, rate, seed, strategy = self.text.value, self.rate.value, self.seed.value, self.strategy.value
            spans = self._tagged.get(text)
            if strategy in untagged_strategies(spans):
                raise ValueError(words.untagged_text(strategy))
            ex = mask_example(self.tok, text, strategy, rate, seed, tables=self._tables,
                              max_length=MAX_TOKENS, spans=spans)
            self.example = ex
            self.example_html.value = masked_example_html(ex)
            self.strategies_html.value = strategies_html(
                mask_every_strategy(self.tok, text, rate, seed, self._tables, spans=spans, max_length=MAX_TOKENS),
                {s: words.untagged_row(s) for s in untagged_strategies(spans)})
            self.dynamic_html.value = dynamic_html(
                dynamic_draws(self.tok, text, strategy, rate, seed, tables=self._tables, spans=spans))
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
            options=[(words.OWN_MIX, "")]
            + [(o.title, o.name) for o in OBJECTIVES.values()],
            value="", description="Objective", layout=widgets.Layout(width="min(100%, 640px)"),
        )
        self.embedding_size = widgets.BoundedIntText(
            value=0, min=0, max=1024, description="Embedding", disabled=True, layout=widgets.Layout(width="200px"),
            tooltip="ALBERT / ELECTRA: the factorised embedding's width (0 = the objective's default)")
        self.shared_layers = widgets.Checkbox(value=True, description="one layer shared across depth (ALBERT)",
                                              disabled=True, indent=False)
        self.objective_note = widgets.HTML()  # what the objective picked teaches
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
        self.seq_len = widgets.Dropdown(options=[16, 32, 64, 128], value=64, description="Seq length",
                                        layout=widgets.Layout(width="180px"))
        self.train_strategy = widgets.Dropdown(options=[(STRATEGY_NAMES[s], s) for s in STRATEGIES], value="token",
                                               description="Masking", layout=widgets.Layout(width="260px"))
        self.pair_task = widgets.Dropdown(options=list(words.PAIR_TASKS), value="nsp", description="Pair task",
                                          layout=widgets.Layout(width="260px"))
        self.probe = widgets.Text(value=probe, description="Probe",
                                  placeholder=f"a sentence with {self.tok.mask_token}",
                                  layout=widgets.Layout(width="min(100%, 520px)"))
        self.probe_every = widgets.BoundedIntText(value=20, min=1, max=100_000, description="every N steps",
                                                  style={"description_width": "auto"},
                                                  layout=widgets.Layout(width="180px"))
        self.start, self.stop, self.job, self.progress, self.progress_label = run_controls(
            "bertlab-pretrain", "Start", None, words.STOP_TOOLTIP, stop="Stop",
            idle="", width="min(100%, 520px)")
        self.run_message = widgets.HTML(layout=widgets.Layout(width="100%"))
        self.run_messages: list[tuple[Level, str]] = []
        self.probe_html = widgets.HTML()
        self.curves = SyncedFigureWidget(plot_pretrain_curves([]))
        self.start.on_click(self._on_start)
        self.stop.on_click(lambda _: self.stop_run())
        self.download = widgets.Button(description="Download the model", icon="download", disabled=True,
                                       tooltip=words.DOWNLOAD_TOOLTIP)
        self.download.on_click(self._on_download)
        self.download_link = widgets.HTML()
        self.compare = CompareView(hide=self.workspace.hide_root)
        self.last_run: ComparedRun | None = None
        self.run: PretrainRun | None = None  # the last run's state (training.run_state)
        self._curve_words: tuple[str | None, bool] = (None, False)  # the subplots' words on show: why the NSP / SOP
        # chart stays empty, whether the first two are next-token curves
        self._seen = 0  # how many of its events the view has shown
        self.train_section = widgets.VBox([
            widgets.HTML(help_html(words.HELP_TRAIN)),
            self.objective, self.objective_note,
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
        note = words.objective_note(name)
        self.objective_note.value = help_html(html.escape(note)) if note else ""
        lesson = get_objective(name).lesson if name else {}
        if lesson:  # the run this objective needs to show what it teaches in a lesson (its note says so)
            self.steps.value, self.batch.value = lesson.get("steps", self.steps.value), lesson.get(
                "batch_size", self.batch.value)
            self.seq_len.value = lesson.get("seq_len", self.seq_len.value)
            self.objective_note.value += help_html(html.escape(words.lesson_note(lesson)))
        options = get_objective(name).size_options if name else ()
        self.embedding_size.disabled = "embedding_size" not in options
        self.shared_layers.disabled = "shared_layers" not in options

    def show_run_messages(self, messages: list[tuple[Level, str]], busy: bool = False) -> None:
        """Replace the training section's message line (as `show_messages` does for section 1); `busy`: with
        the busy sign (work under way that says nothing until it is done)."""
        self.run_messages = list(messages)
        self.run_message.value = "".join(busy_html(text) if busy else note_html(level, text)
                                         for level, text in self.run_messages)

    def show_run_message(self, text: str, level: Level = "info", busy: bool = False) -> None:
        self.show_run_messages([(level, text)], busy)

    # -- section 2: start / stop ----------------------------------------------------------------
    @property
    def points(self) -> list[dict[str, Any]]:
        """The last run's curve points ([] before a run)."""
        return self.run.points if self.run is not None else []

    @property
    def probe_rows(self) -> list[tuple[int, list[Candidate]]]:
        return self.run.probe_rows if self.run is not None else []

    @property
    def result(self) -> TrainResult | None:
        return self.run.result if self.run is not None else None

    def _on_start(self, _=None) -> None:
        if self.job.running:
            return
        tok = self.tok
        if tok.mask_token_id in (tok.pad_token_id, tok.sep_token_id, tok.cls_token_id):  # GPT-2's: one token for all
            self.show_run_message(
                f"This tokenizer has no mask token of its own ({tok.mask_token} also pads and ends texts): it is a "
                "left-to-right model's, and the pre-training here hides words, so it needs a mask token. Pick a "
                "model with a BERT-style tokenizer first (the offline default has one).", "error")
            return
        try:
            cfg = self._config()
        except ValueError as e:
            self.show_run_message(str(e), "error")
            return
        tok, probe = self.tok, self.probe.value
        probe = probe if tok.mask_token in normalise_masks(probe, tok) else ""  # any case
        self.run = PretrainRun(label=words.run_label(cfg), config=cfg, family=words.family(cfg),
                               pair_task=words.pair_task(cfg), probe=probe)
        self._seen = 0
        self.progress.max, self.progress.value = cfg.steps, 0
        self.progress_label.value = words.PREPARING
        # said where the guesses would be, where it stays for the whole run
        self.probe_html.value = "" if probe else note_html("warning", words.no_probe_text(tok, DEFAULT_PROBE_TEMPLATE))
        if words.next_token(cfg):
            self.probe_html.value = note_html("info", words.NEXT_TOKEN_PROBE)
        self.run.add(Note(words.preparing_text(cfg), busy=True))
        self._draw_curves(f"{self.run.label}: {words.PREPARING}")
        self.draw()
        run = self.run
        self.job.start(functools.partial(self._train, run, tok, self.probe_every.value, self.replay.probe.value,
                                         len(self.replay.runs) + 1),
                       queue=f"pre-training {cfg.size}",
                       on_place=lambda ahead: run.add(Note(waiting_text(ahead, leave="Stop"))),
                       on_left_queue=self._left_queue, on_error=functools.partial(self._failed, run),
                       redraw=self.draw, on_done=self.draw)

    def stop_run(self) -> None:
        """Ask the run to stop after its current step (the Stop button)."""
        self.job.cancel()
        if self.job.running:
            self.show_run_message(words.STOPPING)

    def _config(self) -> PretrainConfig:
        typed = self.corpus_path.value.strip()
        if typed and self.workspace.confined and typed not in {name for _, name in available_corpora()}:
            typed = str(self.workspace.resolve(typed, "data"))  # class mode: the workspace and BERTLAB_DATA only
        corpus = typed or self.corpus.value
        if not corpus:
            raise ValueError(words.NO_CORPUS)
        masking = self.train_strategy.value if not self.objective.value else "token"
        if masking in TAGGED_STRATEGIES and corpus in NAMED_SOURCES and corpus != TAGGED_SOURCE:
            raise ValueError(tagged_text_needed(masking, corpus))  # at once: no need to load it to know
        every = max(1, min(10, self.steps.value // 100))
        objective = self.objective.value or None
        custom = objective is None
        return PretrainConfig(size=self.size.value, corpus=corpus, steps=self.steps.value,
                              seq_len=self.seq_len.value, batch_size=self.batch.value,
                              masking=masking,
                              pair_task=self.pair_task.value if custom else "nsp", log_every=every,
                              objective=objective, **lesson_lr(objective),
                              embedding_size=(self.embedding_size.value or None)
                              if not self.embedding_size.disabled else None,
                              shared_layers=self.shared_layers.value if not self.shared_layers.disabled else None)

    # -- section 2: the run (in the background thread: it only appends events to `run`) --------------
    def _train(self, run: PretrainRun, tok: Tokenizer, probe_every: int, replay_probe: str,
               replay_number: int) -> None:
        """The background job (its place in the class queue is taken): load, build, train, save."""
        cfg = run.config
        docs = self._load(cfg.corpus)
        require_tags(docs, cfg.masking, cfg.corpus)  # entity / phrase masking of plain text: said in words
        docs = documents_for_run(docs, cfg.steps * cfg.batch_size * cfg.seq_len, cfg.seed)
        objective = get_objective(cfg.objective or DEFAULT_OBJECTIVE)  # your own mix is recorded as BERT's curves
        model = objective_module(objective, cfg, tok) if cfg.objective else new_model(cfg.size, tok, cfg.pair_task)
        recorder = CurveRecorder(model, objective, tok)
        trained = objective.mlm_model(model)  # the probe reads the MLM part (Replay too)
        trained = objective.kept(model) if trained is None else trained  # a next-token model: no probe to read
        prober = Prober(run, None if objective.predicts_next else trained, tok, probe_every)
        keeper = self._snapshot_keeper(cfg, trained)
        callbacks = [run.add, keeper, recorder, prober]
        objective_run = None
        if cfg.objective:
            objective_run = pretrain_objective(cfg, tokenizer=tok, documents=docs, callbacks=callbacks,
                                               cancel=self.job.cancel_event, module=model)
            result = objective_run.result
        else:
            _, _, result = pretrain(cfg, model=model, tokenizer=tok, documents=docs, callbacks=callbacks,
                                    cancel=self.job.cancel_event)
        if result.status != "failed":
            prober.read(result.step, force=True)
        if result.status != "failed" and result.step > 0:  # keep the model: the run's folder
            kept = objective_run.kept if objective_run is not None else model
            run.add(Outcome("model", (kept, trained, tok)))
            try:
                folder = keeper.folder.parent / "model"
                folder = objective_run.save(folder) if objective_run is not None else \
                    save_model_atomically(kept, tok, folder)
                run.add(Outcome("saved", ComparedRun(words.model_name(cfg, result.step), cfg.objective or "your mix",
                                                     recorder.as_dicts(), folder, result.step)))
            except (OSError, ValueError, RuntimeError) as e:
                log.exception("keeping the pre-trained model failed")
                run.add(Outcome("save error", self.workspace.hide_root(str(e))))
        run.add(Outcome("result", result))
        if result.status != "failed" and result.step > 0:  # read for Replay here (it shows a busy sign meanwhile)
            label = words.replay_label(cfg, result.step, replay_number)
            probe = run.probe or replay_probe
            try:
                replayed = read_run(ReplayRun(label, trained, tok, keeper.folder), probe)
            except Exception:  # noqa: BLE001 - the run itself is done and kept; Replay reads it again and says why
                log.exception("reading the replay of %s failed", label)
                replayed = None
            run.add(Outcome("replay", (label, trained, tok, keeper.folder, probe, replayed)))

    def _left_queue(self) -> None:
        self.show_run_message(words.LEFT_QUEUE, "warning")
        self._draw_curves(words.NOT_STARTED)

    def _failed(self, run: PretrainRun, error: BaseException) -> None:
        run.add(Outcome("error", error_text(error, self.workspace.hide_root)))
        self._seen = len(run.events)
        self.show_run_message(words.failed_text(run.error), "error")
        self._draw_curves(words.ERROR_TITLE)
        self.progress_label.value = words.ERROR_LINE

    def _load(self, corpus: str) -> list[Document]:
        if corpus not in self._corpora:
            self._corpora[corpus] = read_corpus(corpus)
        return self._corpora[corpus]

    # -- section 2: drawing, on the kernel's thread, from the run's state ---------------------------
    def draw(self) -> None:
        """Show what the run reported since the last draw: its lines, progress, curves, probe, its end."""
        run = self.run
        if run is None:
            return
        events = run.snapshot()
        for event in events[self._seen:]:
            if isinstance(event, Note):
                self.show_run_message(event.text, event.level, busy=event.busy)
            elif isinstance(event, TrainEvent) and event.kind == "start":
                self.show_run_message(words.started_text(event.message))
            elif isinstance(event, Outcome) and event.what == "probe error":
                self.probe_html.value = note_html("error", words.probe_error_text(event.value))
            elif isinstance(event, Outcome) and event.what == "result":
                self._finish(run, event.value)
            elif isinstance(event, Outcome) and event.what == "replay":
                label, trained, tok, folder, probe, replayed = event.value
                self.replay.offer(label, trained, tok, folder, self.workspace.hide_root, probe=probe, read=replayed)
        self._seen = len(events)
        if run.ended:
            return
        last = run.last_event
        if last is not None and last.kind in ("start", "step"):
            self.progress.value = last.step
            self.progress_label.value = words.progress_text(last.step, last.total_steps, last.tokens_per_s,
                                                            last.elapsed_s)
            self._draw_curves(f"{run.label}: step {last.step} / {last.total_steps}")
        if run.probe_rows:
            self.probe_html.value = probe_html(run.probe, run.probe_rows, mask_token=self.tok.mask_token)

    def _finish(self, run: PretrainRun, result: TrainResult) -> None:
        """Final drawing and message; offer the model (picker, comparison, download, replay) when at least one
        step was taken."""
        cfg = run.config
        done = {"completed": "finished", "failed": "failed"}.get(result.status, "stopped")
        self.progress.value = result.step
        self.progress_label.value = words.ended_text(done, result.step, result.total_steps)  # no "time left"
        if run.probe_rows:
            self.probe_html.value = probe_html(run.probe, run.probe_rows, mask_token=self.tok.mask_token)
        if result.status == "failed":
            self._draw_curves(f"{run.label}: failed at step {result.step}")
            self.show_run_message(words.training_failed_text(result.error), "error")
            return
        self._draw_curves(words.ended_title(run.label, done, result.step, result.total_steps))
        if result.step == 0:
            self.show_run_message(words.NOTHING_KEPT, "warning")
            return
        kept, trained, tok = run.outcome("model")
        name = words.model_name(cfg, result.step)
        last = next((p for p in reversed(run.points) if p.get("mlm_acc") is not None), None)
        what = "next-token" if words.next_token(cfg) else "MLM"
        acc = f" (last {what} accuracy {100 * last['mlm_acc']:.0f}%)" if last else ""
        saved = run.outcome("saved")
        if saved is not None:
            self.last_run = saved
            self.compare.add(saved)
            self.download.disabled, self.download_link.value = False, ""
            said, level = words.saved_text(self.workspace.shown(saved.folder)), "info"
        else:
            said, level = words.not_saved_text(run.outcome("save error", "")), "warning"
        if self.model_made is not None:
            self.model_made(name, kept, tok)
        self.show_run_messages([(level, words.joined_text(done, result.step, acc, name, said,
                                                          self.model_made is not None))]
                               + ([("info", ended)] if (ended := words.objective_ended(cfg)) else []))
        if run.outcome("replay") is None:
            self.replay.waiting(words.replaying_text(run.label))

    def _on_download(self, _=None) -> None:
        """A download link for the last kept model's folder (made on demand: a model is megabytes)."""
        if self.last_run is None:
            return
        try:
            with self.busy(self.download, text="Packing the model…"):
                self.download_link.value = self.compare.download_html(self.last_run)
        except OSError as e:
            self.show_run_message(words.not_packed_text(self.workspace.hide_root(str(e))), "error")

    # -- section 3: replay (snapshots kept by the run, see panels/replay.py) -----------------------
    def _build_replay_section(self, probe: str) -> None:
        self.runs_dir: Path | None = None  # where run folders go (None: the session's workspace)
        self.replay = ReplaySection(self.tok, probe, intro=words.REPLAY_INTRO)
        self.replay.show_message(words.REPLAY_WAITING)

    def _snapshot_keeper(self, cfg: PretrainConfig, model: torch.nn.Module) -> SnapshotKeeper:
        """Snapshots of this run go to a new run folder (the student's workspace in class mode)."""
        folder = self.workspace.new_run_dir(f"pretrain-{cfg.size}", parent=self.runs_dir)
        return SnapshotKeeper(folder / REPLAY_DIR, model=model)

    # -- drawing --------------------------------------------------------------------------------
    def _draw_curves(self, title: str) -> None:
        """New x/y for the three traces (always three, so the figure keeps its layout), the title, and why the
        NSP / SOP chart stays empty when the run's objective has no pair task."""
        run = self.run
        no_pair = words.no_pair_text(run.config) if run is not None and run.pair_task is None else None
        notes = (no_pair, run is not None and words.next_token(run.config))  # what the subplots' words say
        with self.curves.batch_update():
            for trace, key in zip(self.curves.data, ("mlm_loss", "mlm_acc", "nsp_acc")):
                trace.x, trace.y = curve_xy(self.points, key)
            self.curves.layout.title.text = title
            if notes != self._curve_words:
                fresh = plot_pretrain_curves([], no_pair=no_pair, next_token=notes[1])
                self.curves.layout.annotations = fresh.layout.annotations
                for trace, words_of in zip(self.curves.data, fresh.data):
                    trace.name, trace.hovertemplate = words_of.name, words_of.hovertemplate
                self._curve_words = notes

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


class Prober:
    """A training-loop callback that reads the probe's top-5 guesses every `every` steps (and at the start), in
    the training thread between steps, and hands them to the run (`Outcome("probe", (step, guesses))`)."""

    def __init__(self, run: PretrainRun, model: torch.nn.Module | None, tok: Tokenizer, every: int) -> None:
        self.run, self.model, self.tok, self.every = run, model, tok, every
        self.probe = run.probe
        self.read_at = -1

    def __call__(self, event: TrainEvent) -> None:
        if event.kind in ("start", "step"):
            self.read(event.step)

    def read(self, step: int, force: bool = False) -> None:
        """Read the probe at `step` when `every` steps passed since the last reading (or `force`)."""
        if not self.probe or self.model is None or step == self.read_at:
            return
        if not force and self.read_at >= 0 and step - self.read_at < self.every:
            return
        try:
            preds = fill_mask(self.model, self.tok, self.probe, k=5)
        except ValueError as e:  # the probe text cannot be used: say so once, train on
            self.run.add(Outcome("probe error", str(e)))
            self.probe = ""
            return
        self.read_at = step
        self.run.add(Outcome("probe", (step, preds[0].candidates)))

