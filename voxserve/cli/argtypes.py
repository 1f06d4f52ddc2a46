"""The argparse types every command module shares: the subparsers action a module adds its
command to, a command made of actions, and the value checkers of flags. Here, below
`parser`, so the command modules need not import the parser that imports them."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeAlias

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
Handler = Callable[[argparse.Namespace], int]


def action_command(
    commands: Subparsers,
    common: argparse.ArgumentParser,
    name: str,
    handler: Handler,
    *,
    help_text: str,
    description: str,
) -> Callable[[str, str], argparse.ArgumentParser]:
    """Add the command `name` whose first argument is an action (`voxserve cache stats`);
    the function returned adds one action (name, help) with `common`'s flags, run by
    `handler`."""
    command = commands.add_parser(name, parents=[common], help=help_text, description=description)
    actions = command.add_subparsers(title="actions", dest="action", required=True)

    def action(action_name: str, action_help: str) -> argparse.ArgumentParser:
        sub = actions.add_parser(
            action_name, parents=[common], help=action_help, description=action_help
        )
        sub.set_defaults(handler=handler)
        return sub

    return action


def _integer(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None


def positive_int(text: str) -> int:
    """A count for argparse: an integer of at least 1."""
    value = _integer(text, "a whole number")
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not at least 1")
    return value


def port_number(text: str) -> int:
    """A TCP port for argparse: 0-65535 (0 disables the transports that allow it)."""
    port = _integer(text, "a port number")
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is not in 0-65535")
    return port
