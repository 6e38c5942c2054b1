"""List the numbers in the docs' prose that the result files their sections cite do not hold.

The audit behind issue 44's "every documented number is backed by a committed result
file", kept for the next one::

    uv run --frozen python tools/check_doc_numbers.py            # README.md and docs/
    uv run --frozen python tools/check_doc_numbers.py docs/algorithms/lwd.md

For every section (a heading and the text up to the next heading) that names files under
``docs/results/`` (``results/<name>.json``, ``results/transcripts/<name>.log``,
``results/tests/<name>.json``), each decimal number in its prose (code blocks left out)
must equal, at the decimals shown, a number in one of those files, or a hundredth of one
(a percentage). It prints the section and the numbers that match nothing.

Those are leads, not errors: a difference or ratio of cited values, a config value, a
hand-worked test value or a paper's figure is fine where it stands. A measurement must
either come from a cited file or go.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NUMBER = re.compile(r"(?<![\w.\-/])(\d+\.\d+)(?!\w|\.\d)")
CITED = re.compile(r"results/((?:transcripts/|tests/)?[\w.\-]+\.(?:log|json))")
IN_FILE = re.compile(r"-?\d+\.?\d*(?:e-?\d+)?")


def numbers_in(path: Path) -> set[float]:
    """Every number a result file holds (JSON values and the numbers inside its strings;
    a log's every number)."""
    text = path.read_text()
    if path.suffix != ".json":
        return {float(m) for m in IN_FILE.findall(text)}
    found: set[float] = set()

    def walk(o) -> None:
        if isinstance(o, bool):
            return
        if isinstance(o, int | float):
            found.add(float(o))
        elif isinstance(o, dict):
            for v in o.values():
                walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)
        elif isinstance(o, str):
            found.update(float(m) for m in IN_FILE.findall(o))

    walk(json.loads(text))
    return found


def backed(shown: str, values: set[float]) -> bool:
    """``shown`` (e.g. ``"0.355"``) is one of ``values`` at its decimals, or 100 times one."""
    digits = len(shown.split(".")[1])
    x, tol = float(shown), 0.5 * 10**-digits + 1e-12
    return any(abs(c - x) <= tol for v in values for c in (v, abs(v), 100 * v, 100 * abs(v)))


def unbacked(page: Path, results: Path) -> list[tuple[str, list[str]]]:
    """``(section heading, numbers not found)`` for each citing section of ``page``."""
    out = []
    for section in re.split(r"\n(?=#{1,4} )", page.read_text()):
        files = [results / f for f in sorted(set(CITED.findall(section)))]
        if not files:
            continue
        values = set().union(*(numbers_in(f) for f in files if f.exists()))
        prose = re.sub(r"```.*?```", "", section, flags=re.S)
        missing = sorted({n for n in NUMBER.findall(prose) if not backed(n, values)})
        if missing:
            out.append((section.splitlines()[0][:70], missing))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("pages", nargs="*", type=Path, help="default: README.md and docs/**/*.md")
    args = ap.parse_args(argv)
    pages = args.pages or [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    total = 0
    for page in pages:
        for heading, missing in unbacked(page, REPO / "docs" / "results"):
            total += len(missing)
            name = page.resolve().relative_to(REPO) if page.resolve().is_relative_to(REPO) else page
            print(f"{name} | {heading} | {missing}")
    print(f"{total} numbers to look at", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
