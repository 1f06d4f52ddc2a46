"""The admin HTTP client the commands that talk to a running server share (`cache`, `stats`,
`engines reload`, `models --url`): its flags, URL from them or the server's own settings,
the admin key as a bearer token, errors as one CLI line."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from voxserve.cli.errors import CliError

if TYPE_CHECKING:
    import httpx

    from voxserve.config import Settings


ADMIN_KEY_HELP = "admin key (default: VOXSERVE_ADMIN_KEY; prefer it, flags show in ps)"


def add_server_flags(
    parser: argparse.ArgumentParser, url_help: str, key_help: str = ADMIN_KEY_HELP
) -> None:
    """`--url` and `--admin-key`, what `admin_client` reads."""
    parser.add_argument("--url", help=url_help)
    parser.add_argument("--admin-key", help=key_help)


def url_host(host: str) -> str:
    """`host` as a URL writes it: a wildcard is reached on loopback; IPv6 in brackets."""
    shown = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"[{shown}]" if ":" in shown else shown


def admin_client(args: argparse.Namespace, settings: Settings) -> httpx.Client:
    import httpx

    key = args.admin_key or (
        settings.admin_key.get_secret_value() if settings.admin_key is not None else ""
    )
    url = (args.url or f"http://{url_host(settings.host)}:{settings.port}").rstrip("/")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=url, headers=headers, timeout=30)


def call(
    client: httpx.Client, method: str, path: str, body: dict[str, Any] | None = None
) -> dict[str, Any]:
    import httpx

    try:
        response = client.request(method, path, json=body)
    except httpx.HTTPError as exc:
        raise CliError(
            f"cannot reach the server at {client.base_url} ({type(exc).__name__}); is it "
            "running? (--url)"
        ) from exc
    try:
        data = response.json()
    except ValueError:
        data = {}
    if response.status_code >= 400:
        error = data.get("error", {}) if isinstance(data, dict) else {}
        message = error.get("message") or f"HTTP {response.status_code}"
        raise CliError(f"{error.get('code', 'error')}: {message}")
    if not isinstance(data, dict):
        raise CliError(f"unexpected answer from {client.base_url}{path}")
    return data
