"""`voxserve bench`: the load tester in `voxserve.bench`, wired in only when it is the command.

Building bench's parser imports the load clients and matplotlib, which `voxserve --help`
should not wait for (nor need: they come with the dev extra). So every other command parses
with a placeholder `bench` entry that only lists it, and `main` builds the real one when
bench is the command; a missing optional package is then one line naming the extra.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from voxserve.cli.errors import PROG, CliError, import_hint

if TYPE_CHECKING:
    from voxserve.cli.argtypes import Subparsers

COMMAND = "bench"
HELP = "load-test a server: latency, capacity, overhead"
"""The placeholder's line in `voxserve --help`; voxserve.bench.cli gives its parser the same."""
DEV_EXTRA_HINT = "pip install -e '.[dev]'"


def add_placeholder(commands: Subparsers) -> None:
    """List `bench` without importing it; the parse that finds it rebuilds with `add_bench`."""
    commands.add_parser(COMMAND, help=HELP, add_help=False)


def add_bench(commands: Subparsers) -> None:
    """The real `bench` command and its sub-commands."""
    try:
        from voxserve.bench.cli import add_bench_parser

        add_bench_parser(commands)
    except ImportError as exc:
        raise missing_extra(exc) from exc
    commands.choices[COMMAND].set_defaults(handler=cmd_bench)


# Imported only while a run reports (charts, WER): checked before the run, not after it.
RUN_NEEDS = ("matplotlib", "jiwer")


def cmd_bench(args: argparse.Namespace) -> int:
    import importlib

    from voxserve.bench.cli import run_bench

    try:
        for module in RUN_NEEDS:
            importlib.import_module(module)
        return run_bench(args)
    except ImportError as exc:  # e.g. jiwer, imported when WER is first computed
        raise missing_extra(exc) from exc


def missing_extra(exc: ImportError) -> CliError:
    """The one line for a package bench needs and the core install lacks."""
    if (exc.name or "").split(".")[0] == PROG:  # voxserve's own module: no extra brings it
        return CliError(f"cannot import {exc.name} ({exc}); {import_hint(exc)}")
    return CliError(f"the bench command needs the dev extra: {DEV_EXTRA_HINT} ({exc})")
