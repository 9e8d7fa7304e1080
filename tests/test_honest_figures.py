"""A figure says what it was measured on, and warns when that is too little to mean anything."""

from __future__ import annotations

import pytest

from bertlab.analysis.sample_size import MIN_EXAMPLES, examples_text, measured_on, share_interval, too_few
from bertlab.viz.finetune import plot_confusion_matrix, plot_training_curves
from bertlab.viz.objectives import plot_objective_curves
from bertlab.viz.theme import share_tickformat


def test_wilson_interval_of_a_share():
    lo, hi = share_interval(0.5, 100)
    assert lo == pytest.approx(0.4038, abs=1e-3) and hi == pytest.approx(0.5962, abs=1e-3)
    assert share_interval(1.0, 1)[0] == pytest.approx(0.2065, abs=1e-3)  # one right answer proves little
    assert share_interval(1.0, 1)[1] == 1.0 and share_interval(0.0, 0) == (0.0, 1.0)
    narrow, wide = share_interval(0.9, 1000), share_interval(0.9, 20)
    assert narrow[1] - narrow[0] < wide[1] - wide[0]


def test_sizes_in_words_and_the_warning_threshold():
    assert examples_text(1, "dev examples") == "1 dev example" and examples_text(2500) == "2,500 examples"
    assert measured_on(0.85, 40, "dev examples") == "85.0 % of 40 dev examples (95 % interval 71–93 %)"
    assert too_few(MIN_EXAMPLES) == "" and "Only 1 dev example" in too_few(1, "dev examples")


def _history(accuracy: float) -> list[dict]:
    return [{"kind": "train", "step": 1, "epoch": 1.0, "loss": 0.7},
            {"kind": "eval", "step": 1, "epoch": 1.0, "accuracy (%)": accuracy}]


def _texts(fig) -> list[str]:
    return [a.text for a in fig.layout.annotations]


def test_a_run_scored_on_one_dev_example_warns_and_keeps_a_full_axis():
    fig = plot_training_curves({"sst2 · full": _history(100.0)}, "accuracy (%)", dev_examples=1)
    assert any("Only 1 dev example" in t for t in _texts(fig))
    assert "dev accuracy (%) (1 example)" in _texts(fig)
    assert tuple(fig.layout.yaxis2.range) == (0, 102.0)  # not an axis from 99 to 101 %
    fine = plot_training_curves({"sst2 · full": _history(91.0)}, "accuracy (%)", dev_examples=872)
    assert not any("Only" in t for t in _texts(fine)) and "dev accuracy (%) (872 examples)" in _texts(fine)


def test_the_confusion_matrix_names_its_sample_and_interval():
    fig = plot_confusion_matrix([[1, 0], [0, 0]], ["negative", "positive"])
    assert "of 1 dev example (95 % interval" in fig.layout.title.text
    assert any("too few" in t for t in _texts(fig))
    big = plot_confusion_matrix([[400, 50], [40, 382]], ["negative", "positive"])
    assert "of 872 dev examples" in big.layout.title.text and not _texts(big)


@pytest.mark.parametrize("top", [0.93, 0.31, 0.05, 0.0123, 0.002, 0.00021, 0.00008])
def test_share_ticks_read_differently_and_never_in_si_units(top):
    fmt = share_tickformat([top / 3, top])
    decimals = int(fmt[1:-1])
    labels = [f"{100 * top * k / 8:.{decimals}f} %" for k in range(9)]  # d3's ".N%" as Python writes it
    assert len(set(labels)) == len(labels), labels
    assert fmt.endswith("%") and "s" not in fmt  # "s" would be d3's SI format ("80μ")


def test_compare_objectives_before_any_run_is_a_message_not_empty_log_axes():
    fig = plot_objective_curves({})
    assert not fig.data and "Pre-train with two or more objectives" in _texts(fig)[0]
    one = plot_objective_curves({"bert": [{"step": 1, "own_loss": 5.0, "mlm_acc": 0.01, "probe_p": 0.0001},
                                          {"step": 2, "own_loss": 4.0, "mlm_acc": 0.02, "probe_p": 0.00015}]})
    assert len(one.data) == 3 and one.layout.yaxis3.tickformat == ".3%"
