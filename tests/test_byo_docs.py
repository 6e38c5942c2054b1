"""The "bring your own model, data and reward" pages run as written.

Each page under ``docs/bring-your-own-*.md`` is executed top to bottom in a fresh
directory, the way a reader would copy it:

* a fenced block right after ``<!-- file: NAME -->`` is written to ``NAME``;
* a fenced ``bash`` block right after ``<!-- run -->`` is run with ``bash -euo pipefail``
  (the workspace's commands on ``PATH``), and must exit 0;
* ``<!-- exists: PATH -->`` asserts that the commands so far produced ``PATH``.

Blocks without a marker are illustration (outputs, alternatives for a GPU).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").glob("bring-your-own-*.md"))
MARKER = re.compile(r"^<!-- (file|run|exists)(?:: *(.*?))? *-->$")
FENCE = re.compile(r"^```")


def steps(text: str) -> list[tuple[str, str, str]]:
    """``(kind, argument, body)`` for every marker of a page, in order."""
    lines = text.splitlines()
    out, i = [], 0
    while i < len(lines):
        m = MARKER.match(lines[i].strip())
        i += 1
        if not m:
            continue
        kind, arg = m.group(1), m.group(2) or ""
        if kind == "exists":
            out.append((kind, arg, ""))
            continue
        if i >= len(lines) or not FENCE.match(lines[i]):
            raise AssertionError(f"<!-- {kind} --> must be followed by a fenced block: {arg}")
        j = i + 1
        while not FENCE.match(lines[j]):
            j += 1
        out.append((kind, arg, "\n".join(lines[i + 1 : j]) + "\n"))
        i = j + 1
    return out


def test_the_marker_parser():
    page = "<!-- file: a.py -->\n```python\nx = 1\n```\ntext\n<!-- run -->\n```bash\necho hi\n```\n"
    page += "<!-- exists: out/x -->\n```text\nnot run\n```\n"
    assert steps(page) == [("file", "a.py", "x = 1\n"), ("run", "", "echo hi\n"),
                           ("exists", "out/x", "")]  # fmt: skip


def test_every_name_a_pages_python_imports_from_rlpost_exists():
    """The pages run in the slow tier only; this keeps their Python files importable in the
    default one: each ``from rlpost... import name`` of a ``<!-- file: X.py -->`` block names
    a module and an attribute that exist (a name moved by a refactor fails here)."""
    import ast
    import importlib
    import importlib.util

    wrong = []
    for page in PAGES:
        for kind, arg, body in steps(page.read_text()):
            if kind != "file" or not arg.endswith(".py"):
                continue
            for node in ast.walk(ast.parse(body)):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rlpost"):
                    module = importlib.import_module(node.module)
                    wrong += [
                        f"{page.name} {arg}: {node.module}.{a.name}"
                        for a in node.names
                        if not hasattr(module, a.name)
                        and importlib.util.find_spec(f"{node.module}.{a.name}") is None
                    ]
    assert not wrong, "names the pages import that do not exist: " + ", ".join(wrong)


def test_every_domain_has_a_page():
    assert {p.stem.removeprefix("bring-your-own-") for p in PAGES} >= {
        "llm",
        "diffusion",
        "robot",
    }


@pytest.mark.slow  # (the slow tier: uv run pytest -m slow)
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem.removeprefix("bring-your-own-"))
def test_page_runs_as_written(page, tmp_path, record_result, load_tool):
    """With ``RLPOST_RESULTS`` set, what each run block printed is kept
    (``docs/results/tests/byo_<domain>.json``): the page's output blocks are copied from it
    (``tests/test_docs.py`` checks their numbers)."""
    clean = load_tool("transcripts").clean
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("VIRTUAL_ENV", None)
    todo = steps(page.read_text())
    assert any(kind == "run" for kind, _, _ in todo), f"{page.name} runs nothing"
    printed = []
    for kind, arg, body in todo:
        if kind == "file":
            (tmp_path / arg).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / arg).write_text(body)
        elif kind == "exists":
            assert (tmp_path / arg).exists(), f"{page.name}: the commands did not write {arg}"
        else:
            out = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", body],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert out.returncode == 0, (
                f"{page.name}: exit {out.returncode} from\n{body}\n"
                f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
            )
            printed.append(
                {"commands": body, "stdout": clean(out.stdout), "stderr": clean(out.stderr)}
            )
    domain = page.stem.removeprefix("bring-your-own-")
    record_result(f"byo_{domain}", printed, config={"page": f"docs/{page.name}"})
