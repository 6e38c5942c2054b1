"""docs/core.md lists every registered entry and preset, and its contract table is current."""

from pathlib import Path

from rlpost.core import PRESETS, REGISTRIES

DOC = (Path(__file__).resolve().parents[1] / "docs" / "core.md").read_text()


def test_every_registry_entry_and_preset_is_documented():
    missing = [
        f"{kind}:{name}"
        for kind, reg in REGISTRIES.items()
        for name in reg.names()
        if f"`{name}`" not in DOC
    ]
    missing += [f"preset:{name}" for name in PRESETS if f"`{name}`" not in DOC]
    assert not missing, f"add to docs/core.md: {missing}"


def test_the_contract_table_matches_the_declarations(load_tool):
    mod = load_tool("contract_table")
    begin, end = "<!-- contract-table:begin -->\n", "\n<!-- contract-table:end -->"
    current = DOC[DOC.index(begin) + len(begin) : DOC.index(end)]
    assert current == mod.table(), "regenerate with: uv run python tools/contract_table.py"


def test_the_readme_python_api_example_runs_as_written(tmp_path):
    import subprocess
    import sys

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    begin, end = "<!-- python-api:begin -->\n```python\n", "```\n<!-- python-api:end -->"
    code = readme[readme.index(begin) + len(begin) : readme.index(end)]
    (tmp_path / "example.py").write_text(code)
    out = subprocess.run(
        [sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("2 steps;")
    ckpt = tmp_path / "runs/my-run/checkpoints/step-000002"
    assert (ckpt / "config.json").is_file() and (ckpt / "model.safetensors").is_file()


ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").rglob("*.md"))
#: a cited result file: docs/results/x.json from the root, or a page's relative ../results/x.json
CITED = r"(?<![\w])results/([\w.\-/{},]+\.(?:json|log|txt))"
#: a benchmark or profiling tool's command
TOOL = r"tools/(?:bench|profile)_\w+\.py"


def _sections(text: str) -> list[str]:
    """A page's text split before each heading."""
    import re

    return re.split(r"^(?=#+ )", text, flags=re.M)


def test_each_seed_citation_names_the_paragraph_of_its_catalog_entry():
    """A page's "seed file F, paragraph P" is the abstract of catalog entry F-P (the
    catalog numbers each seed file's abstracts from the title, 0): a page that gives the
    file's line number instead (dora.md said 59 for 29) fails here."""
    import re

    wrong = []
    for page in PAGES:
        text = page.read_text()
        ids = {(f, int(n)) for f, n in re.findall(r"\b(\d{3})-(\d{2})[a-z]?\b", text)}
        for f, p in re.findall(r"seed file (\d{3}),? paragraphs? (\d+)", text):
            if (f, int(p)) not in ids:
                near = sorted(n for g, n in ids if g == f)
                wrong.append(f"{page.relative_to(ROOT)}: paragraph {p} of {f} (its ids: {near})")
    assert not wrong, "\n".join(wrong)


def test_the_counts_the_readme_and_docs_state_equal_the_registries():
    import re

    entries = sum(len(reg.names()) for reg in REGISTRIES.values())
    wrong = []
    for page in [ROOT / "README.md", *PAGES]:
        text = page.read_text()
        for n in re.findall(r"\ball (\d+) (?:contract )?entries\b", text):
            if int(n) != entries:
                wrong.append(f"{page.relative_to(ROOT)}: 'all {n} entries', there are {entries}")
        for n in re.findall(r"\b(\d+) presets\b", text):
            if int(n) != len(PRESETS):
                wrong.append(f"{page.relative_to(ROOT)}: '{n} presets', there are {len(PRESETS)}")
    assert not wrong, "\n".join(wrong)


def test_every_result_file_the_docs_cite_is_committed():
    import re

    def expand(name: str) -> list[str]:
        """``a_{2,4}_b.json`` -> ``a_2_b.json``, ``a_4_b.json`` (shell brace patterns)."""
        m = re.search(r"\{([^{}]*)\}", name)
        if m is None:
            return [name]
        alts = m.group(1).split(",")
        return [x for a in alts for x in expand(name[: m.start()] + a + name[m.end() :])]

    missing, seen = [], 0
    for page in [ROOT / "README.md", *PAGES]:
        for cited in re.findall(CITED, page.read_text()):
            for name in expand(cited):
                seen += 1
                if not (ROOT / "docs" / "results" / name).is_file():
                    missing.append(f"{page.relative_to(ROOT)}: results/{name}")
    assert not missing, "\n".join(missing)
    assert seen > 100  # (the pattern still finds the citations)


def test_no_page_cites_a_result_from_the_ignored_bench_results():
    """``bench_results/`` is git-ignored, so a number read from a file there cannot be
    checked: a page cites the copy under ``docs/results/``. Inside a code block only a
    command that writes there (``--out bench_results/...``) is refused; a tool's printed
    path is the tool's default, not a citation."""
    import re

    cited = re.compile(r"bench_results/[\w.\-{},]+")
    bad = []
    for page in [ROOT / "README.md", *PAGES]:
        fenced = False
        for n, line in enumerate(page.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            hit = re.search(r"--out\s+bench_results/", line) if fenced else cited.search(line)
            if hit:
                bad.append(f"{page.relative_to(ROOT)}:{n}: {line.strip()[:90]}")
    assert not bad, "\n".join(bad)


def test_a_page_that_reports_a_measurement_cites_its_result_file():
    """A page that runs a benchmark (``tools/bench_*.py``, ``tools/profile_*.py``) or has a
    "Measured" / "Benchmark" section with numbers in it names the committed result file
    (``docs/results/...``) its numbers come from; a section that only says what is not
    measured yet needs none."""
    import re

    heading = re.compile(r"^#+ .*\b(?:Measured|Benchmark)\b", re.M)
    number = re.compile(r"(?<![\w.])\d+\.\d+(?![\w.])")
    shown = re.compile(r"^\$ uv run[^\n]*" + TOOL, re.M)  # a benchmark's printed output
    bare, unnamed = [], []
    for page in [ROOT / "README.md", *PAGES]:
        if "results" in page.parts:
            continue
        text = page.read_text()
        sections = _sections(text)
        measured = [s for s in sections if heading.match(s) and number.search(s)]
        if page in PAGES and not re.search(CITED, text) and (re.search(TOOL, text) or measured):
            bare.append(str(page.relative_to(ROOT)))
        # and the output names its file in the same section
        unnamed += [
            f"{page.relative_to(ROOT)}: {s.splitlines()[0][:60]}"
            for s in sections
            if shown.search(s) and not re.search(CITED, s)
        ]
    assert not bare, "cite the result file (docs/results/...) on: " + ", ".join(bare)
    assert not unnamed, "name the result file beside the output: " + "; ".join(unnamed)


#: a fenced code block, and a command line in it that runs one of the apps
FENCED = r"```[^\n]*\n(.*?)```"
APP_COMMAND = r"^\$ .*\brlpost-\w+"


def _shown_transcripts(page: Path):
    """``(line, block text, nearby text)`` of each fenced block of ``page`` that shows an
    app's command (``$ ... rlpost-x ...``); nearby: the paragraphs just before and after."""
    import re

    text = page.read_text()
    for m in re.finditer(FENCED, text, flags=re.S):
        if re.search(APP_COMMAND, m.group(1), flags=re.M):
            before = text[: m.start()].rstrip().rsplit("\n\n", 1)[-1]
            after = text[m.end() :].lstrip().split("\n\n", 1)[0]
            yield text[: m.start()].count("\n") + 1, m.group(1), before + after


def test_a_shown_command_output_names_the_log_it_was_copied_from():
    """A page that shows an app's command and the numbers it printed names, in the block
    or the paragraph before or after it, the log ``tools/transcripts.py`` kept
    (``docs/results/transcripts/<name>.log``): the log holds that command, and every
    number of the shown output is in it (a number edited by hand, or left from an older
    run, fails)."""
    import re

    number = re.compile(r"(?<![\w.])\d+(?:\.\d+)?%?(?![\w.])")
    bare, wrong = [], []
    for page in [ROOT / "README.md", *PAGES]:
        for line, block, nearby in _shown_transcripts(page):
            output = [x for x in block.splitlines() if not x.startswith("$")]
            if not any(re.search(r"\d\.\d", x) for x in output):
                continue  # no measured number shown
            where = f"{page.relative_to(ROOT)}:{line}"
            logs = re.findall(r"results/(transcripts/[\w.\-]+\.log)", block + nearby)
            if not logs:
                bare.append(where)
                continue
            log = "\n".join((ROOT / "docs/results" / p).read_text() for p in logs)
            for cmd in re.findall(r"^\$ (.*)$", block, flags=re.M):
                cmd = cmd.split("  #")[0].rstrip()
                if f"$ {cmd}\n" not in log:
                    wrong.append(f"{where}: the command {cmd!r} is not in {logs}")
            printed = set(number.findall(log))  # (whole numbers: "0.5" is not in "0.55")
            missing = {n for x in output for n in number.findall(x) if n not in printed}
            if missing:
                wrong.append(f"{where}: numbers not in {logs}: {sorted(missing)[:8]}")
    assert not bare, "name the transcript log beside the output: " + ", ".join(bare)
    assert not wrong, "\n".join(wrong)


def _printed_text(source: str) -> str | None:
    """What a cited source printed: a transcript log, or the outputs a test recorded from
    a page's commands (``tests/byo_*.json``); ``None`` for a benchmark's JSON (its numbers
    are stored unrounded, so they are not compared as text)."""
    import json

    path = ROOT / "docs/results" / source
    if source.endswith(".log"):
        return path.read_text()
    if source.startswith("tests/byo_"):
        rows = json.loads(path.read_text())["rows"]
        return "\n".join(r["stdout"] + "\n" + r["stderr"] for r in rows)
    return None


def test_a_printed_output_block_names_where_it_was_copied_from():
    """A ```text block that shows two or more measured decimals names, in the block or the
    paragraph before or after it, the file it was copied from under ``docs/results/``; when
    that file kept what a command printed (a transcript log, a page's recorded outputs),
    every number of the block is in it. A "bring your own" page names its record
    (``tests/byo_<domain>.json``) once, for all its blocks."""
    import re

    number = re.compile(r"(?<![\w.])\d+(?:\.\d+)?%?(?![\w.])")
    source = re.compile(r"results/((?:transcripts/|tests/)?[\w.\-]+\.(?:log|json))")
    bare, wrong = [], []
    for page in [ROOT / "README.md", *PAGES]:
        text = page.read_text()
        for m in re.finditer(r"```text\n(.*?)```", text, flags=re.S):
            block = m.group(1)
            if len(re.findall(r"\d\.\d", block)) < 2:
                continue
            where = f"{page.relative_to(ROOT)}:{text[: m.start()].count(chr(10)) + 1}"
            before = text[: m.start()].rstrip().rsplit("\n\n", 1)[-1]
            after = text[m.end() :].lstrip().split("\n\n", 1)[0]
            cited = source.findall(before + block + after) or re.findall(
                r"results/(tests/byo_\w+\.json)", text
            )
            if not cited:
                bare.append(where)
                continue
            kept = [t for t in map(_printed_text, cited) if t is not None]
            if not kept:
                continue
            printed = set(number.findall("\n".join(kept)))
            lines = [x for x in block.splitlines() if not x.startswith("$")]
            missing = {n for x in lines for n in number.findall(x) if n not in printed}
            if missing:
                wrong.append(f"{where}: numbers not in {cited}: {sorted(missing)[:8]}")
    assert not bare, "name the file the output was copied from: " + ", ".join(bare)
    assert not wrong, "\n".join(wrong)


def test_every_transcript_log_belongs_to_a_transcript_of_the_tool(load_tool):
    """Each kept log is one of ``tools/transcripts.py``'s, starts with its commands, and ran
    to exit 0."""
    mod = load_tool("transcripts")
    logs = sorted((ROOT / "docs/results/transcripts").glob("*.log"))
    assert logs
    for log in logs:
        text = log.read_text()
        t = mod.TRANSCRIPTS.get(log.stem)
        assert t is not None, f"{log.name}: no such transcript in tools/transcripts.py"
        shown = [x[2:] for x in text.splitlines() if x.startswith("$ ")]
        assert shown == list(t.commands), f"{log.name}: ran {shown}, the tool says {t.commands}"
        assert text.rstrip().splitlines()[-1].startswith("# exit 0 "), f"{log.name} failed"


def test_the_transcript_tool_logs_commands_their_last_drawn_lines_and_exit(load_tool):
    mod = load_tool("transcripts")
    t = mod.Transcript(
        "docs/x.md",
        (
            "python -c \"import time; print('up', flush=True); time.sleep(60)\" &",
            "printf '10%%\\r100%% \\033[1mdone\\033[0m 1.5\\n'",
            "exit 3",
        ),
        ready="up",
    )
    status, text = mod.run("x", t)
    lines = text.splitlines()
    assert status == 3 and lines[-1].startswith("# exit 3 in ")
    assert lines[1:6] == [f"$ {t.commands[0]}", "up", f"$ {t.commands[1]}", "100% done 1.5",
                          f"$ {t.commands[2]}"]  # fmt: skip
    assert mod.runnable("OMP_NUM_THREADS=1 uv run rlpost-x y &") == "OMP_NUM_THREADS=1 rlpost-x y"
    # a command past its time limit: logged with what it printed, the tool goes on
    slow = mod.Transcript("docs/x.md", ("echo started; sleep 30",), timeout_s=2)
    status, text = mod.run("y", slow)
    assert status == 124, text
    assert text.splitlines()[1:4] == [f"$ {slow.commands[0]}", "started", "# timed out after 2 s"]
