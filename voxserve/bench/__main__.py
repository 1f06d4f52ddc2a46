"""`python -m voxserve.bench SUBCOMMAND ...`: the bench command without the main CLI."""

from __future__ import annotations

import argparse
import sys

from voxserve.bench.cli import add_bench_parser, run_bench


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m voxserve")
    add_bench_parser(parser.add_subparsers(dest="command", required=True))
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] != ["bench"]:
        args.insert(0, "bench")
    return run_bench(parser.parse_args(args))


if __name__ == "__main__":
    sys.exit(main())
