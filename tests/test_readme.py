"""The README's code example runs as written (docs and code cannot drift)."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    core = [b for b in blocks if "from rlpost.core import" in b]
    assert core, "README has no core example"  # (the Python-API one: tests/test_docs.py)
    namespace: dict = {}
    exec(compile(core[0], str(README), "exec"), namespace)
    assert namespace["logp"].grad is not None
    assert namespace["adv"].shape == (4, 5)
