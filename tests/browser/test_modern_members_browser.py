"""Every tab of the dashboard with ModernBERT and with DeBERTa-v3 as the page's model, in headless Chromium
(`bertlab serve --model FOLDER`, tiny random checkpoints written by transformers, tokenizers trained in the
test): each tab opens with no traceback and no red error, the views that read any encoder draw, and the ones
that need a head the member was not trained with (next-sentence prediction) say so in words.

Screenshots go to $TMPDIR/bertlab-screenshots/<member>-tab-*.png."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from conftest import REPO, _free_port, _stop, _wait_for_port
from dashboard_page import CURRENT, PLOT, open_dashboard_offline, open_tab

from bertlab.panels.app import TABS

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# Tabs that draw a figure as soon as they open whatever the encoder (NSP needs a head these members lack; the
# Ablation tab's default target word is several pieces in the tiny test vocabularies, and says so).
DRAWS_AT_OPEN = {"Input", "Mask", "Attention", "Embeddings"}
TINY_VOCABULARY = re.compile(r"split into \d+ pieces|not in the model's vocabulary")


def _member_folder(member: str, root):
    sys.path.insert(0, str(REPO / "tests"))
    import torch
    import transformers
    from test_family_deberta import VARIANTS, deberta_tokenizer
    from test_family_modernbert import modernbert_tokenizer, write_checkpoint

    if member == "modernbert":
        return write_checkpoint(root / "mb", "ModernBertForMaskedLM", modernbert_tokenizer())
    hf_tok = deberta_tokenizer()
    torch.manual_seed(0)
    cfg = transformers.DebertaV2Config(**{**VARIANTS["v3"], "vocab_size": len(hf_tok)})
    transformers.DebertaV2ForMaskedLM(cfg).save_pretrained(root / "deberta")
    hf_tok.save_pretrained(root / "deberta")
    return root / "deberta"


@pytest.fixture(scope="module", params=["modernbert", "deberta"])
def member_url(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    folder = _member_folder(request.param, root)
    port = _free_port()
    log = root / "voila.log"
    env = {k: v for k, v in os.environ.items() if k != "BERTLAB_MODEL"}
    env["HF_HUB_OFFLINE"] = "1"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bertlab.cli", "serve", "--no-browser", "--port", str(port), "--model", str(folder)],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_for_port(proc, port, log)
        yield request.param, f"http://127.0.0.1:{port}/", log
    finally:
        _stop(proc)


def test_every_tab_works_with_the_member(member_url, dashboard_page, screenshot_dirs):
    member, url, log = member_url
    page = dashboard_page
    seen = open_dashboard_offline(page, url)
    for title, _ in TABS:
        open_tab(page, title)
        if title in DRAWS_AT_OPEN:
            try:
                page.wait_for_selector(f"{CURRENT} {PLOT} .main-svg", timeout=60_000)
            except Exception:
                for d in screenshot_dirs:
                    page.screenshot(path=str(d / f"{member}-failed.png"), full_page=True)
                shows = page.inner_text(CURRENT)[:600]
                pytest.fail(f"{member}: the {title} tab drew nothing in 60 s; it shows: {shows}")
        page.wait_for_timeout(400)
        text = page.inner_text(CURRENT)
        errors = page.eval_on_selector_all(f"{CURRENT} .bertlab-error", "els => els.map(e => e.textContent)")
        assert "Traceback" not in text, (member, title)
        assert not [e for e in errors if not TINY_VOCABULARY.search(e)], (member, title, errors)
        if title == "Next sentence":
            assert re.search(r"no NSP head|next-sentence prediction", text), (member, text[:400])
        for d in screenshot_dirs:
            page.screenshot(path=str(d / f"{member}-tab-{re.sub(r'[^a-z0-9]+', '-', title.lower()).strip('-')}.png"),
                            full_page=True)
    assert not seen.errors, seen.errors
    assert not seen.refused, seen.refused
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
