"""``rlpost-robot``: command-line entry point of the robot domain."""

from __future__ import annotations

import argparse
import sys

import rlpost.robot as domain


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlpost-robot", description=__doc__)
    parser.add_argument("--version", action="version", version=f"rlpost-robot {domain.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help="print the versions of the engines this domain uses")
    parser.parse_args(argv)
    for name, version in domain.environment_report().items():
        print(f"{name:<14} {version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
