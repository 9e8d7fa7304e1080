"""Write the docs' measured figures from the results files, so none is typed by hand.

A page marks each generated block; `TABLES` (bench/tables.py) declares what goes in it (a results file, its rows, the
columns: header, key, format) and a caption made from the file's own meta, so every figure says what it
was measured on:

    <!-- figures:forward -->
    ...written here...
    <!-- /figures:forward -->

    python bench/render.py           rewrite every block from the results files
    python bench/render.py --check   exit 1 (and name the blocks) when a page differs from its files
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DOCS = ROOT / "docs"

Key = str | Callable[[dict], Any]  # a dotted path into a row ("page_ready_s.p50"), or a function of the row
Format = str | Callable[[Any], str]  # a format spec (",.1f", ".1%") or a function of the value


@dataclass(frozen=True)
class Table:
    page: str  # under docs/
    marker: str  # the block's name; tables with the same page and marker follow each other in the block
    file: str  # bench/results/<file>.json, or a path from the repository's root when it holds a "/"
    columns: tuple[tuple[str, Key, Format], ...]
    caption: str = ""  # str.format_map over the file's data: "{meta[device]}, {meta[when]}"
    rows: Key = "rows"  # where the rows are (a dotted path), or a function of the file's data


def get(data: Any, key: Key) -> Any:
    if callable(key):
        return key(data)
    for part in key.split("."):
        if data is None:
            return None
        data = data[int(part)] if isinstance(data, list) else data.get(part)
    return data


def cell(value: Any, fmt: Format) -> str:
    if value is None:
        return "–"
    if callable(fmt):
        return fmt(value)
    return format(value, fmt) if fmt else str(value).replace("|", "\\|")


def aim(key: Key, limit: float, at_most: bool = False) -> Callable[[dict], str | None]:
    """A column that compares one figure with its aim (at least `limit`, or at most): "yes" or "no"."""
    def verdict(row: dict) -> str | None:
        v = get(row, key)
        return None if v is None else ("yes" if (v <= limit if at_most else v >= limit) else "no")
    return verdict


class Meta(dict):
    """A results file's data for a caption: a figure the file lacks reads "–" (older files record less)."""

    def __getitem__(self, key: Any) -> Any:
        v = self.get(key)
        return Meta(v) if isinstance(v, dict) else ("–" if v is None else v)


def load(file: str, results: Path | None = None) -> dict:
    path = ROOT / file if "/" in file else (results or RESULTS) / f"{file}.json"
    return json.loads(path.read_text(encoding="utf-8"))


def table(spec: Table, results: Path | None = None, file: str | None = None) -> str:
    data = load(file or spec.file, results)
    lines = ["| " + " | ".join(h for h, _, _ in spec.columns) + " |", "|---" * len(spec.columns) + "|"]
    for row in get(data, spec.rows):
        lines.append("| " + " | ".join(cell(get(row, k), f) for _, k, f in spec.columns) + " |")
    if spec.caption:
        lines += ["", spec.caption.format_map(Meta(data))]
    return "\n".join(lines)


def block(page: str, marker: str, results: Path | None = None, suffix: str = "cuda") -> str:
    """The text of one block: its tables, in the order TABLES declares them. Another `suffix` (a GPU check's
    dry run: "dryrun") reads `*_dryrun.json` for the `*_cuda.json` files and leaves out those it lacks."""
    parts = []
    for t in tables().TABLES:
        if (t.page, t.marker) != (page, marker):
            continue
        file = t.file.removesuffix("_cuda") + f"_{suffix}" if t.file.endswith("_cuda") else t.file
        if suffix != "cuda" and not ((results or RESULTS) / f"{file}.json").is_file():
            continue
        parts.append(table(t, results, file))
    return "\n\n".join(parts)


def render(page: str, text: str) -> tuple[str, list[str]]:
    """`text` with every declared block of `page` rewritten; also the names of the blocks that changed."""
    changed = []
    for marker in dict.fromkeys(t.marker for t in tables().TABLES if t.page == page):
        pattern = re.compile(rf"(<!-- figures:{marker} -->\n)(.*?)(<!-- /figures:{marker} -->)", re.S)
        match = pattern.search(text)
        if match is None:
            raise SystemExit(f"docs/{page} has no <!-- figures:{marker} --> block (declared in bench/render.py)")
        body = block(page, marker).rstrip("\n") + "\n"
        if match.group(2) != body:
            changed.append(marker)
            text = text[: match.start(2)] + body + text[match.end(2):]
    return text, changed


def pct(v: float) -> str:
    return f"{100 * v:.1f} %"


def times(v: float) -> str:
    return f"{v:.2f}×"


def duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def tables():
    """bench/tables.py, which declares every table (it imports this module for `Table` and the formats)."""
    sys.path.insert(0, str(ROOT / "bench"))
    import tables as declared
    return declared


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether the docs pages are up to date")
    args = parser.parse_args(argv)
    stale = []
    for path in sorted(DOCS.glob("*.md")):  # a block no table declares would never be rewritten
        undeclared = set(re.findall(r"<!-- figures:([\w-]+) -->", path.read_text(encoding="utf-8"))) - {
            t.marker for t in tables().TABLES if t.page == path.name}
        stale += [f"docs/{path.name} ({m}: no table declares it)" for m in sorted(undeclared)]
    for page in dict.fromkeys(t.page for t in tables().TABLES):
        path = DOCS / page
        new, changed = render(page, path.read_text(encoding="utf-8"))
        if changed and args.check:
            stale.append(f"docs/{page} ({', '.join(changed)})")
        elif changed:
            path.write_text(new, encoding="utf-8")
            print(f"docs/{page}: rewrote {', '.join(changed)}")
    if stale:
        print(f"figures differ from their results files in: {'; '.join(stale)} (run python bench/render.py)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
