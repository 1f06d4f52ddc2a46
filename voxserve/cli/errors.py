"""Exit codes and the one line a failure prints: `main` turns any exception into
``voxserve: error: ...`` and a code, so scripts get one stderr line, never a traceback."""

from __future__ import annotations

PROG = "voxserve"
EXTRA_HINT = "pip install -e '.[default]'"

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2  # bad flags or bad configuration, as argparse uses
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """A failure the user can act on; `main` prints it as one line."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def import_hint(exc: ImportError) -> str:
    """The install command, when what is missing is a third-party package (not voxserve)."""
    missing = (exc.name or "").split(".")[0]
    if missing == PROG:
        return "voxserve itself looks incomplete; reinstall it"
    return f"the default engines need the optional extra: {EXTRA_HINT}"


def describe_error(exc: BaseException) -> str:
    """One line a user can act on, for any exception the commands let through."""
    from voxserve.config import ConfigError
    from voxserve.engines.registry import EngineConfigError, EngineNotFound
    from voxserve.errors import VoxError

    if isinstance(exc, CliError | ConfigError | EngineNotFound | EngineConfigError):
        text = str(exc)
    elif isinstance(exc, VoxError):
        text = f"{exc.code.value}: {exc.message}"
    elif isinstance(exc, ImportError):
        text = f"cannot import {exc.name or 'a module'} ({exc}); {import_hint(exc)}"
    elif isinstance(exc, OSError) and exc.filename is not None:
        text = f"{exc.filename}: {exc.strerror or exc}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    # One line, and no dangling colon when an exception had no message of its own.
    return " ".join(text.split()).rstrip(" :")


def exit_code_for(exc: BaseException) -> int:
    from voxserve.config import ConfigError
    from voxserve.engines.registry import EngineConfigError, EngineNotFound

    if isinstance(exc, CliError):
        return exc.exit_code
    if isinstance(exc, ConfigError | EngineNotFound | EngineConfigError):
        return EXIT_USAGE
    return EXIT_FAILURE
