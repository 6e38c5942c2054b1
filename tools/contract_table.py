"""Print the contract table of docs/core.md: every registry entry's declared inputs and
coupling (with its default parameters). ``tests/test_docs.py`` checks that the page holds
exactly this table, so the docs cannot drift from the declarations.

    uv run --frozen python tools/contract_table.py
"""

from __future__ import annotations

import dataclasses

from rlpost.core import REGISTRIES


def _defaults(reg, name: str):
    entry = reg.get(name)
    kw = {}
    for f in dataclasses.fields(entry.params_cls):
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kw[f.name] = 1.0  # required parameters without a default
    return reg.build(name, **kw)


def table() -> str:
    lines = [
        "| registry | entry | needs | reads (optional) | coupling |",
        "|---|---|---|---|---|",
    ]
    for kind, reg in REGISTRIES.items():
        for name in reg.names():
            b = _defaults(reg, name)
            needs = ", ".join(sorted(b.needs)) or "—"
            opt = ", ".join(sorted(b.reads - b.needs)) or "—"
            lines.append(f"| {kind} | `{name}` | {needs} | {opt} | {b.coupling} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
