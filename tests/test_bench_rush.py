"""The rush-hour benchmark (bench/bench_rush.py): how its light clients read the kernel's messages,
and a small rush against a real `bertlab serve --class 3 --fork-kernels` whose edits must bring the
Mask chart's new guesses back."""

from __future__ import annotations

import importlib.util
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _module():
    spec = importlib.util.spec_from_file_location("bench_rush", BENCH / "bench_rush.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_rush"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_mask_text_box_is_found_by_its_placeholder_among_other_text_boxes():
    br = _module()
    states = {
        "a": {"_model_name": "TextareaModel", "description": "Text", "placeholder": "Sentence A"},
        "b": {"_model_name": "TextModel", "placeholder": "put [MASK] where a word should go"},
        "c": {"_model_name": "TextareaModel", "description": "Text",
              "placeholder": "Type a sentence; put [MASK] where a word should go"},
    }
    assert br.find_text_box(states) == "c"
    del states["c"]
    assert br.find_text_box(states) is None


def test_the_page_s_dashboard_is_the_widget_view_in_its_html():
    br = _module()
    output = {"output_type": "display_data", "metadata": {}, "data": {
        "text/plain": "VBox()", "application/vnd.jupyter.widget-view+json": {
            "version_major": 2, "version_minor": 0, "model_id": "abc123"}}}
    tag = '<script type="application/vnd.voila.cell-output+json">'  # as Voila writes a cell's output into the page
    html = f'<div class="jp-OutputArea-output">{tag}\n{json.dumps(output, sort_keys=True)}\n</script></div>'
    assert br.page_view(html) == "abc123"
    assert br.page_view('<div class="jp-OutputArea-output"></div>') is None  # the cell's output was lost


def test_a_chart_update_is_a_figure_message_with_the_expected_guess():
    br = _module()

    def msg(msg_type: str, data: dict) -> dict:
        return {"msg_type": msg_type, "content": {"comm_id": "f", "data": data}}

    figure = {"method": "update", "state": {"_widget_data": [{"y": ["capital", "city"]}]}}
    assert br.is_chart_update(msg("comm_msg", figure), "capital")
    assert not br.is_chart_update(msg("comm_msg", figure), "kitchen")  # an old chart
    assert not br.is_chart_update(msg("comm_msg", {"method": "update", "state": {"value": "capital"}}), "capital")
    assert not br.is_chart_update(msg("status", figure), "capital")
    opened = {"state": {"_py2js_restyle": {"restyle_data": {"y": [["capital"]]}}}}
    assert br.is_chart_update(msg("comm_open", opened), "capital")


def test_binary_frames_are_read_as_the_server_writes_them():
    br = _module()
    body = json.dumps({"msg_type": "comm_msg", "content": {}}).encode()
    buffer = b"\x00\x01\x02"
    offsets = (12, 12 + len(body))  # two parts: the message, one buffer
    frame = struct.pack("!I", 2) + struct.pack("!2I", *offsets) + body + buffer
    assert br.decode(frame)["msg_type"] == "comm_msg"
    assert br.decode(json.dumps({"msg_type": "status"}))["msg_type"] == "status"


def test_v1_frames_are_written_and_read_as_jupyter_server_does():
    from jupyter_server.services.kernels.connection.base import (
        deserialize_msg_from_ws_v1,
        serialize_msg_to_ws_v1,
    )

    br = _module()
    frame = br.message_v1("comm_open", {"target_name": br.CONTROL_TARGET}, "s", version=br.CONTROL_PROTOCOL)
    channel, parts = deserialize_msg_from_ws_v1(frame)
    assert channel == "shell"
    assert json.loads(parts[0])["msg_type"] == "comm_open"
    assert json.loads(parts[2]) == {"version": br.CONTROL_PROTOCOL}  # else the kernel closes the control comm
    assert json.loads(parts[3]) == {"target_name": "jupyter.widget.control"}
    header = json.dumps({"msg_type": "comm_msg"}).encode()
    content = json.dumps({"data": {"method": "update_states"}}).encode()
    msg = br.decode_v1(serialize_msg_to_ws_v1([header, b"{}", b"{}", content, b"\x00buffer"], "iopub"))
    assert msg["msg_type"] == "comm_msg" and msg["channel"] == "iopub"
    assert msg["content"]["data"]["method"] == "update_states"


def test_the_spread_is_min_median_max_across_runs():
    br = _module()
    assert br._spread([3.0, None, 1.0, 2.0]) == {"min": 1.0, "median": 2.0, "max": 3.0}
    assert br._spread([None]) == {"min": None, "median": None, "max": None}


@pytest.mark.slow
@pytest.mark.parametrize("speaks", [("v1", "control"), ("json", "per-widget")])
def test_a_small_rush_gets_a_chart_update_for_every_edit(tmp_path, monkeypatch, speaks):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "rush.json"
    args = ["--quick", "--n", "3", "--browsers", "0", "--rounds", "2", "--arrive-within", "2", "--wait", "120",
            "--protocol", speaks[0], "--states", speaks[1], "--out", str(out)]
    # its own process: a browser test earlier in the session leaves Playwright's event loop running in this one
    proc = subprocess.run([sys.executable, str(BENCH / "bench_rush.py"), *args], capture_output=True, text=True,
                          timeout=600, cwd=BENCH.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    run = result["runs"][0]
    assert run["n"] == 3 and run["light_clients"] == 3 and run["failures"] == 0, run["failure_details"]
    assert run["light_client_speaks"] == "/".join(speaks)
    assert run["edits_sent"] == 6 and run["edits_redrawn"] == 6
    assert run["page_ready_s"]["n"] == 3 and run["edit_ms"]["p50"] > 0
    assert set(run["cpu_share"]) >= {"load_generator", "server", "kernels"}
    assert run["cpu_s"]["kernels"] > 0  # forked kernels are found and counted
    assert "load_avg" in run and set(result["spread"]["page_ready_p50_s"]) == {"min", "median", "max"}


@pytest.mark.slow
def test_one_page_cost_is_measured_by_phase(tmp_path, monkeypatch):
    """bench/bench_page.py on a real class server: each phase of a page read, with the CPU it took."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "page.json"
    proc = subprocess.run([sys.executable, str(BENCH / "bench_page.py"), "--repeat", "1", "--variants", "v1/control",
                           "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=BENCH.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    (page,) = result["pages"]
    assert page["errors"] == [] and set(page["phases"]) == {"page", "states", "edit"}
    assert page["phases"]["states"]["bytes"] > 10_000  # every widget's state came in one reply
    assert page["phases"]["states"]["kernels_cpu_s"] + page["phases"]["edit"]["kernels_cpu_s"] > 0
    assert set(result["median"]["v1/control"]) == {"page", "states", "edit"}
