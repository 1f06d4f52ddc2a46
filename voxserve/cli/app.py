"""The entry point: parse the command line, run one command, turn what it raises into one
line on stderr and an exit code."""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence

from voxserve.cli import bench
from voxserve.cli.errors import (
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    PROG,
    CliError,
    describe_error,
    exit_code_for,
)
from voxserve.cli.parser import build_parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command and return its exit code: 0 ok, 1 failure, 2 usage or config error,
    130 interrupted. Errors are printed, not raised, so scripts get one stderr line."""
    try:
        args = parse_command_line(argv)
    except SystemExit as exc:  # --help, --version, usage errors: keep argparse's codes
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    except CliError as exc:  # the bench command without its optional packages
        return report_error(exc, verbose=False)
    verbose = bool(getattr(args, "verbose", False))
    try:
        code: int = args.handler(args)
        return code
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        return report_error(exc, verbose=verbose)


def parse_command_line(argv: Sequence[str] | None) -> argparse.Namespace:
    """`parse_args`, except that the bench command's parser (which imports the load tester)
    is built only when bench is the command: every other command parses with a placeholder.
    """
    parser = build_parser(bench.add_placeholder)
    args, extras = parser.parse_known_args(argv)
    if args.command != bench.COMMAND:
        if extras:  # as parse_args reports them
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
        return args
    return build_parser(bench.add_bench).parse_args(argv)


def report_error(exc: BaseException, *, verbose: bool) -> int:
    """Print the one error line (after the traceback with --verbose); return the exit code."""
    if verbose:
        traceback.print_exc()
    print(f"{PROG}: error: {describe_error(exc)}", file=sys.stderr, flush=True)
    return exit_code_for(exc)
