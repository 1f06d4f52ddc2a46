"""The `voxserve` command: serve, say, transcribe, engines, bench.

Every failure a user can cause or fix (bad config, missing file, busy port, missing optional
engines) ends as ONE line on stderr, ``voxserve: error: ...``, and a non-zero exit code;
``--verbose`` adds the traceback. Heavy modules (models, uvicorn, the bench) are imported
inside the commands so ``voxserve --help`` answers at once.

Modules, one job each: `app` (entry point and dispatch), `parser` (the argparse tree),
`errors` (one-line errors and exit codes), `settings` (what every command loads first),
`serve`, `speech` (say, transcribe), `engines_report` and `licences` (the engines command),
`bench` (the bench command, built only when asked for), `argtypes` (the argparse types the
command modules share) and `signals` (SIGTERM as Ctrl-C).
"""

from voxserve.cli.app import main

__all__ = ["main"]
