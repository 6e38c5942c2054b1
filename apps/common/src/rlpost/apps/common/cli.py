"""The skeleton of every ``rlpost-<domain>`` command.

An :class:`App` is an argparse parser with ``--version``, ``--import MODULE`` (a user's
module that registers methods, algorithms or presets, imported before the command), a
``doctor`` subcommand (the
versions of the engines the domain uses) and :meth:`App.main`, which runs the chosen
subcommand and turns bad input into one line on stderr and exit code 2 instead of a
traceback, and a run that stops on purpose (an exception marked ``one_line``, e.g.
``rlpost.core.guard.RunStopped``) into one line and exit code 3 (``RLPOST_TRACEBACK=1``
shows the traceback). A domain's app adds its own
subcommands and keeps only those.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

Handler = Callable[[argparse.Namespace], int]

#: Errors that mean "the input is wrong": a config that fails validation (ConfigError is
#: a ValueError), a missing file, a bad value.
USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError)


def _took(seconds: float) -> str:
    """``53 s``, ``4 min 12 s``, ``1 h 3 min``."""
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


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
        #: command -> (its config model class, a loader of ``args`` -> the loaded config)
        self._schemas: dict[str, tuple[Callable[[], Any], Callable[[Any], Any]]] = {}

    def command(
        self,
        name: str,
        fn: Handler,
        help: str,
        config: str | None = None,
        config_required: bool = False,
        run: bool = False,
        schema: tuple[Callable[[], Any], Callable[[Any], Any]] | None = None,
    ) -> argparse.ArgumentParser:
        """Add subcommand ``name`` running ``fn(args)``. ``config`` (an example recipe name)
        adds ``--config <recipe name or YAML path>`` and the ``key.sub=value`` overrides
        (accepted anywhere on the line, between flags too). ``run``: the command writes a
        run directory, so it takes ``--resume`` and ``--overwrite``. ``schema``: (the
        config's model class, ``args`` -> the loaded config), for ``config NAME``."""
        epilog = None
        if schema is not None:
            self._schemas[name] = schema
            epilog = (
                f"config keys: '{self.prog} config {name}' lists every key with its default "
                f"and what it does ('--section optim' one section, '--config X' a recipe's "
                "values)"
            )
        sp = self.sub.add_parser(name, help=help, epilog=epilog)
        if config is not None:
            sp.add_argument(
                "--config",
                required=config_required,
                help=f"YAML recipe path or shipped recipe name (e.g. {config})",
            )
            sp.add_argument(
                "overrides", nargs="*", help="field overrides, key.sub=value (e.g. run.seed=1)"
            )
        if run:
            sp.add_argument(
                "--resume", action="store_true", help="continue the run in run.dir exactly"
            )
            sp.add_argument(
                "--overwrite",
                action="store_true",
                help="replace the run in run.dir (its metrics and checkpoints are deleted)",
            )
        sp.set_defaults(fn=fn)
        return sp

    def _doctor(self, _: argparse.Namespace) -> int:
        for name, version in self._report().items():
            print(f"{name:<14} {version}")
        return 0

    def _config(self, args: argparse.Namespace) -> int:
        from rlpost.apps.common.describe import describe

        names = [a for a in args.of if "=" not in a]  # ``of`` and the key=value overrides
        if len(names) > 1 or (names and names[0] not in self._schemas):
            raise ValueError(
                f"config: {' '.join(names)!r} is not a command with a config; choose one of "
                f"{list(self._schemas)} (then key=value overrides)"
            )
        args.overrides = [*args.overrides, *(a for a in args.of if "=" in a)]
        model, load = self._schemas[names[0] if names else next(iter(self._schemas))]
        values = load(args) if args.config or args.overrides else None
        print(describe(model(), values, args.section))
        return 0

    def _builtin_commands(self) -> None:
        """``config`` (when a command has a schema) and ``doctor``, after the domain's own."""
        if self._schemas and "config" not in self.sub.choices:
            c = self.command(
                "config", self._config, "list the config keys, their defaults and docs"
            )
            c.add_argument("of", nargs="*", metavar="[COMMAND] [key=value ...]",
                           help=f"whose config ({', '.join(self._schemas)}; default "
                           f"{next(iter(self._schemas))}), with overrides")  # fmt: skip
            c.add_argument("--section", default=None, help="only the keys under it (optim)")
            c.add_argument("--config", default=None, help="show a recipe's values (name or YAML)")
            c.set_defaults(overrides=[])
        if "doctor" not in self.sub.choices:
            self.command("doctor", self._doctor, "print the versions of the engines it uses")

    def _parse(self, argv: Sequence[str] | None) -> argparse.Namespace:
        """The arguments, with ``key=value`` left after a flag taken as overrides."""
        args, extra = self.parser.parse_known_args(argv)
        overrides = [a for a in extra if "=" in a and not a.startswith("-")]
        if extra and (len(overrides) < len(extra) or not hasattr(args, "overrides")):
            self.parser.error(f"unrecognized arguments: {' '.join(extra)}")
        if overrides:
            args.overrides = [*args.overrides, *overrides]
        if getattr(args, "resume", False) and getattr(args, "overwrite", False):
            self.parser.error("--resume and --overwrite exclude each other")
        return args

    def _run(self, args: argparse.Namespace) -> int:
        """The user's ``--import`` modules, then the command (a run: its whole time told)."""
        for module in args.imports:
            try:
                importlib.import_module(module)
            except ImportError as exc:
                raise ValueError(f"--import {module}: {exc}") from exc
        t0 = time.perf_counter()
        code = args.fn(args)
        if getattr(args, "resume", None) is not None:  # a run command
            print(f"{self.prog} {args.command}: {_took(time.perf_counter() - t0)} in all "
                  "(set-up, training, evaluation, plots)")  # fmt: skip
        return code

    def main(self, argv: Sequence[str] | None = None) -> int:
        self._builtin_commands()
        args = self._parse(argv)
        try:
            return self._run(args)
        except USER_ERRORS as exc:
            # a bug raising ValueError mid-training (rlpost.core.guard.training_loop) is
            # not an input error: its traceback is what the user needs
            if os.environ.get("RLPOST_TRACEBACK") or getattr(exc, "during_training", False):
                raise
            print(f"{self.prog}: {exc}", file=sys.stderr)
            return 2
        except Exception as exc:
            if not getattr(exc, "one_line", False) or os.environ.get("RLPOST_TRACEBACK"):
                raise
            # a run that stopped on purpose (e.g. repeated non-finite steps): its message
            print(f"{self.prog}: stopped: {exc}", file=sys.stderr)
            return int(getattr(exc, "exit_code", 3))
