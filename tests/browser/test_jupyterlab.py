"""The panels in JupyterLab, where errors show that Voilà hides.

A real `jupyter lab` on a free loopback port (its own settings, workspaces and token) runs notebook
03 and a notebook with the Embeddings panel in headless Chromium; the test clicks as a student
would and collects the browser console's errors and what the kernel writes to JupyterLab's log.

What broke here, and was fixed at its cause:
- Attention → Head view (or bertviz) → new sentence → Show → Heatmap threw "Error setting state:
  Cannot read properties of undefined (reading 'length')": plotly's figure view never removes its
  listeners, so the heatmap's view taken off the stage still ran `Plotly.update` on its purged plot.
  bertlab's figure module (bertlab/viz/figure_widget.py) removes them with the view.
- Embeddings → "One word" / "Word map" logged "No such comm" twice each: the panel remade a figure
  on first show and closed the old widget while its view, just shown, still talked to the kernel.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from servers import free_port as _free_port
from servers import stop as _stop

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
START_S = 120
ON_SHOW = ".widget-tab-contents > .lm-Widget:not(.lm-mod-hidden)"  # the sub-tab on show
EMBEDDINGS = [
    "import bertlab\nfrom bertlab.panels.similarity import SimilarityPanel\n\nmodel, tok = bertlab.load()",
    "SimilarityPanel(model, tok).widget",
]
# In the page: what the kernel writes to JupyterLab's log (stderr, errors) and the comms it opened.
HOOK = """() => {
    const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
    window.bertlabLog = {opened: [], stderr: [], errors: []};
    kernel.iopubMessage.connect((_, msg) => {
        const type = msg.header.msg_type, content = msg.content;
        if (type === 'comm_open') window.bertlabLog.opened.push(content.comm_id);
        if (type === 'stream' && content.name === 'stderr') window.bertlabLog.stderr.push(content.text);
        if (type === 'error') window.bertlabLog.errors.push(content.ename + ': ' + content.evalue);
    });
}"""
KERNEL_READY = """() => {
    const panel = window.jupyterapp && window.jupyterapp.shell.currentWidget;
    const session = panel && panel.sessionContext && panel.sessionContext.session;
    return session && session.kernel && session.kernel.status === 'idle';
}"""
ALL_RUN = """() => {
    const panel = window.jupyterapp.shell.currentWidget;
    const cells = [...panel.content.model.cells].filter(c => c.type === 'code');
    return panel.sessionContext.session.kernel.status === 'idle' && cells.every(c => c.executionCount !== null);
}"""




@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(base URL, token) of `jupyter lab` serving a folder with the two notebooks; stopped at the end."""
    pytest.importorskip("jupyterlab", reason="jupyterlab is in the test extra: pip install -e '.[test]'")
    home = tmp_path_factory.mktemp("jupyterlab")
    root = home / "notebooks"
    root.mkdir()
    shutil.copy(REPO / "notebooks" / "03_attention.ipynb", root)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in EMBEDDINGS])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, root / "embeddings.ipynb")
    settings = home / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)  # no "get notified about news?" toast over the page
    (settings / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    port, token = _free_port(), secrets.token_hex(16)
    env = {k: v for k, v in os.environ.items() if k not in ("BERTLAB_MODEL", "BERTLAB_PLOTLY_BUNDLE")}
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", JUPYTER_CONFIG_DIR=str(home / "config"),
               JUPYTERLAB_SETTINGS_DIR=str(home / "settings"), JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"),
               JUPYTER_RUNTIME_DIR=str(home / "runtime"))
    log = home / "lab.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ServerApp.ip=127.0.0.1",
             f"--ServerApp.port={port}", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
             "--LabApp.expose_app_in_browser=True",  # window.jupyterapp: run cells, read the kernel's messages
             "--LabApp.extension_manager=readonly", "--LabApp.news_url=None",
             "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
            cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        deadline = time.monotonic() + START_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"jupyter lab exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"jupyter lab did not listen within {START_S} s:\n{log.read_text()[-3000:]}")
                time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/", token
    finally:
        _stop(proc)  # the server stops its kernels


class Notebook:
    """One notebook open in JupyterLab, all its cells run, and everything wrong it reported."""

    def __init__(self, browser, lab: tuple[str, str], name: str) -> None:
        url, token = lab
        self.context = browser.new_context(viewport={"width": 1400, "height": 1000})
        self.page = page = self.context.new_page()
        page.set_default_timeout(180_000)
        self.console: list[str] = []
        page.on("console", lambda m: self.console.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.console.append(f"page error: {e}"))
        page.goto(f"{url}lab/tree/{name}?reset&token={token}")
        page.wait_for_function(KERNEL_READY)
        page.evaluate(HOOK)
        page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
        page.wait_for_function(ALL_RUN, polling=500)

    def cell(self, text: str):
        """The code cell whose source contains `text` (scrolled into view)."""
        cell = self.page.locator(".jp-CodeCell", has_text=text).last
        cell.scroll_into_view_if_needed()
        return cell

    def problems(self, settle_s: float = 2.0) -> list[str]:
        """Console errors, cell errors, and "No such comm" for a comm the kernel opened (a widget of
        ours; the page's own comm to a kernel that has not imported ipywidgets yet is not ours)."""
        time.sleep(settle_s)  # a message to a closed comm comes back a moment later
        log = self.page.evaluate("() => window.bertlabLog")
        ours = set(log["opened"])
        closed = [line for text in log["stderr"] for line in text.splitlines()
                  if (m := re.search(r"No such comm: (\S+)", line)) and m.group(1) in ours]
        return self.console + log["errors"] + closed

    def close(self) -> None:
        self.page.evaluate("async () => { await window.jupyterapp.serviceManager.sessions.shutdownAll(); }")
        self.context.close()


@pytest.fixture
def notebook(chromium_browser, lab) -> Iterator:
    opened: list[Notebook] = []

    def open_notebook(name: str) -> Notebook:
        opened.append(Notebook(chromium_browser, lab, name))
        return opened[-1]

    yield open_notebook
    for nb in opened:
        nb.close()


def _heatmap_rows(cell) -> list[str]:
    return cell.locator(".js-plotly-plot .yaxislayer-above .ytick text").all_text_contents()


def test_notebook_03_and_its_attention_panel_leave_no_errors(notebook):
    nb = notebook("03_attention.ipynb")
    assert nb.problems() == [], "running notebook 03"
    panel = nb.cell("AttentionPanel(model, tok).widget")
    panel.locator(".js-plotly-plot .main-svg").first.wait_for()
    for view, word in (("Head view", "dog"), ("bertviz", "piano"), ("Rollout", "river"),
                       ("Model view", "apple")):
        panel.get_by_role("button", name=view, exact=True).click()
        panel.locator("textarea").first.fill(f"The {word} was left near the door.")
        panel.get_by_role("button", name="Show", exact=True).click()
        panel.get_by_role("button", name="Heatmap", exact=True).click()
        nb.page.wait_for_function(
            "([cell, word]) => [...document.querySelectorAll('.jp-CodeCell')].some(c => c.textContent.includes(cell)"
            " && [...c.querySelectorAll('.js-plotly-plot .ytick text')].some(t => t.textContent === word))",
            arg=["AttentionPanel(model, tok).widget", word],
        )
        assert word in _heatmap_rows(panel)
        assert nb.problems() == [], f"{view} → new sentence → Show → Heatmap"


def test_embeddings_sub_tabs_leave_no_errors(notebook):
    nb = notebook("embeddings.ipynb")
    panel = nb.cell("SimilarityPanel(model, tok).widget")
    panel.locator(".js-plotly-plot .main-svg").first.wait_for()
    for tab in ("One word", "Word map", "Tokens", "Word map"):
        panel.locator(".lm-TabBar-tab", has_text=tab).click()
        panel.locator(".lm-TabBar-tab.lm-mod-current", has_text=tab).wait_for()
        panel.locator(f"{ON_SHOW} .js-plotly-plot .main-svg").first.wait_for()
    assert nb.problems() == [], "opening the sub-tabs"
    words = panel.locator(f"{ON_SHOW} input[type=text]").first
    for value in ("river, money", "river"):  # fewer traces each time: a new figure widget
        words.fill(value)
        panel.get_by_role("button", name="Map", exact=True).click()
        nb.page.wait_for_function(  # one trace per word, each point labelled "word (sentence)"
            "([plot, n]) => document.querySelectorAll(plot + ' .scatterlayer .trace').length === n"
            " && [...document.querySelectorAll(plot + ' .textpoint')]"
            ".every(t => /^(river|money) /.test(t.textContent))",
            arg=[f"{ON_SHOW} .js-plotly-plot", len(value.split(","))],
        )
    assert nb.problems() == [], "new words in the Word map"
