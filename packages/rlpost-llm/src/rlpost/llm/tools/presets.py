"""The GRPO-family presets the LLM trainer accepts (defined in :mod:`rlpost.core.presets`)."""

from __future__ import annotations

from rlpost.core.presets import PRESETS, Preset, get_preset

__all__ = ["PRESETS", "Preset", "get_preset", "preset_table"]


def preset_table() -> str:
    """One line per preset: its entries, what it needs from the trainer beyond the base
    inputs, how its loss couples rows, and the paper (``rlpost-llm presets``)."""
    rows = [("preset", "advantage", "ratio", "correction", "objective", "needs", "loss coupling")]
    for name in sorted(PRESETS):
        p = PRESETS[name]
        r = p.build()
        rows.append(
            (
                p.name,
                p.advantage.name,
                p.ratio.name,
                p.correction.name,
                p.objective.name,
                ", ".join(sorted(r.needs())) or "-",
                str(r.coupling()),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
