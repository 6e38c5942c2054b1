"""The skeleton of every ``rlpost-<domain>`` command.

An :class:`App` is an argparse parser with ``--version``, ``--import MODULE`` (a user's
module that registers methods, algorithms or presets, imported before the command), a
``doctor`` subcommand (the
versions of the engines the domain uses) and :meth:`App.main`, which runs the chosen
subcommand and turns bad input into one line on stderr and exit code 2 instead of a
traceback (``RLPOST_TRACEBACK=1`` shows the traceback). A domain's app adds its own
subcommands and keeps only those.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence

Handler = Callable[[argparse.Namespace], int]

#: Errors that mean "the input is wrong": a config that fails validation (ConfigError is
#: a ValueError), a missing file, a bad value.
USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError)


class App:
    def __init__(
        self,
        prog: str,
        doc: str | None,
        version: str,
        report: Callable[[], Mapping[str, str]],
    ) -> None:
        self.prog = prog
        self.parser = argparse.ArgumentParser(
            prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        self.parser.add_argument("--version", action="version", version=f"{prog} {version}")
        self.parser.add_argument(
            "--import",
            dest="imports",
            action="append",
            default=[],
            metavar="MODULE",
            help="import MODULE first (repeatable): a module of yours that registers "
            "methods, algorithms, presets or rewards",
        )
        self.sub = self.parser.add_subparsers(dest="command", required=True)
        self._report = report

    def command(
        self,
        name: str,
        fn: Handler,
        help: str,
        config: str | None = None,
        config_required: bool = False,
    ) -> argparse.ArgumentParser:
        """Add subcommand ``name`` running ``fn(args)``. ``config`` (an example recipe name)
        adds ``--config <recipe name or YAML path>`` and the ``key.sub=value`` overrides."""
        sp = self.sub.add_parser(name, help=help)
        if config is not None:
            sp.add_argument(
                "--config",
                required=config_required,
                help=f"YAML recipe path or shipped recipe name (e.g. {config})",
            )
            sp.add_argument(
                "overrides", nargs="*", help="field overrides, key.sub=value (e.g. run.seed=1)"
            )
        sp.set_defaults(fn=fn)
        return sp

    def _doctor(self, _: argparse.Namespace) -> int:
        for name, version in self._report().items():
            print(f"{name:<14} {version}")
        return 0

    def main(self, argv: Sequence[str] | None = None) -> int:
        if "doctor" not in self.sub.choices:  # listed after the domain's own commands
            self.command("doctor", self._doctor, "print the versions of the engines it uses")
        args = self.parser.parse_args(argv)
        try:
            for module in args.imports:
                try:
                    importlib.import_module(module)
                except ImportError as exc:
                    raise ValueError(f"--import {module}: {exc}") from exc
            return args.fn(args)
        except USER_ERRORS as exc:
            if os.environ.get("RLPOST_TRACEBACK"):
                raise
            print(f"{self.prog}: {exc}", file=sys.stderr)
            return 2
