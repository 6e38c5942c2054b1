"""``rlpost-llm``: command-line entry point of the language-model domain."""

from __future__ import annotations

import argparse
import sys

import rlpost.llm as llm
from rlpost.llm.presets import PRESETS


def _doctor(_: argparse.Namespace) -> int:
    for name, version in llm.environment_report().items():
        print(f"{name:<14} {version}")
    return 0


def _presets(_: argparse.Namespace) -> int:
    for p in PRESETS.values():
        print(
            f"{p.name:<14} {p.advantage.name:>13} | {p.ratio.name:>8} | {p.objective.name:>9} | "
            f"{p.aggregation.name:<19} | {p.paper}"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlpost-llm", description=__doc__)
    parser.add_argument("--version", action="version", version=f"rlpost-llm {llm.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "doctor", help="print the versions of the engines this domain uses"
    ).set_defaults(fn=_doctor)
    sub.add_parser("presets", help="list the GRPO-family presets").set_defaults(fn=_presets)
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
