"""The Host allow-list: the DNS-rebinding defence, before any route sees a request.

A page at `http://evil.example:8000` whose name its owner re-points at 127.0.0.1 is, to
the browser, its own origin: the page reads the answers, and its requests carry
`Origin` and `Host` both `evil.example:8000`, so an Origin check alone (origin equals Host)
lets it drive a local server (Ollama's CVE-2024-28224). The `Host` it cannot change: it is
the name the page was loaded from. So a request is served only when its Host names this
server:

- a loopback name or address (`localhost`, 127.0.0.0/8, `::1`), any port;
- the configured `host` (unless it is every interface: "", 0.0.0.0, ::);
- the IP address the connection reached (an address is looked up by no one, so it cannot
  be rebound: `--host 0.0.0.0` keeps answering `http://192.168.1.5:8000`);
- an `allowed_hosts` entry: a name, `*.example.com` (its sub-domains), or `*` (any Host:
  the check off, for a proxy that checks it itself).

Anything else (another name, a malformed value, two Host headers) is refused: 403
`host_not_allowed` on HTTP; on a WebSocket the same refusal as a foreign Origin (accepted,
one `error` event in the route's protocol, close 1008). Exempt: /healthz, /readyz and
/metrics (a Kubernetes probe or a scraper sends the pod's IP or a service name; none of
them acts). A request without a Host header (HTTP/1.0) is served: every browser sends one,
so it is not a page's. With the Host trusted, the Origin check's "origin equals Host" means
the server's own page again."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from voxserve.config import Settings
from voxserve.errors import ErrorCode, VoxError, quoted
from voxserve.server.realtime_api.events import RealtimeEncoder
from voxserve.server.realtime_api.session import BETA_SUBPROTOCOL, Installed, initial_wire
from voxserve.server.realtime_api.session import SUBPROTOCOL as REALTIME_SUBPROTOCOL
from voxserve.server.session.auth import SUBPROTOCOL as STREAM_SUBPROTOCOL
from voxserve.server.session.errors import error_response
from voxserve.server.session.events import refusal_event
from voxserve.server.session.stream_protocol import encode_event
from voxserve.server.websocket.close_codes import CLOSE_POLICY

OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
MAX_HOST = 300  # characters of a Host value judged at all (a name is at most 253)
_NAME = re.compile(r"[a-z0-9_-]{1,63}(\.[a-z0-9_-]{1,63})*\.?")
_PORT = re.compile(r"(:[0-9]{0,5})?")
_EVERY_INTERFACE = {"", "0.0.0.0", "::", "[::]"}


def host_of(value: str) -> str | None:
    """The host of a Host header value, as allow-list entries are written (config.py
    `host_entry`): lower case, no port, no trailing dot, an IP address in its short form
    without brackets. None when the value is not `host[:port]`."""
    if len(value) > MAX_HOST:
        return None
    value = value.strip(" \t").lower()
    if value.startswith("["):
        host, bracket, port = value[1:].partition("]")
        if not bracket or not _PORT.fullmatch(port):
            return None
        try:
            return ipaddress.IPv6Address(host).compressed
        except ValueError:
            return None
    host, colon, port = value.partition(":")
    if not _NAME.fullmatch(host) or not _PORT.fullmatch(colon + port):
        return None
    host = host.removesuffix(".")
    try:
        return ipaddress.IPv4Address(host).compressed
    except ValueError:
        return host


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    address = _address(host)
    return address is not None and address.is_loopback


@dataclass(frozen=True)
class HostRule:
    """Which Host names a request may carry; `allows` takes `host_of`'s form."""

    names: frozenset[str]
    suffixes: tuple[str, ...]  # ".example.com" of "*.example.com"
    any_host: bool = False

    @classmethod
    def from_settings(cls, settings: Settings) -> HostRule:
        entries = list(settings.allowed_hosts)  # normalised by config.host_entry
        configured = settings.host.strip()
        if configured not in _EVERY_INTERFACE:
            host = host_of(configured)
            if host is not None:
                entries.append(host)
        names = frozenset(e for e in entries if not e.startswith("*"))
        suffixes = tuple(e[1:] for e in entries if e.startswith("*."))
        return cls(names, suffixes, any_host="*" in entries)

    def allows(self, host: str, local: str | None = None) -> bool:
        """Whether `host` names this server; `local`: the address the connection reached."""
        if self.any_host or host in self.names or is_loopback_host(host):
            return True
        if local is not None and _address(host) is not None and _address(host) == _address(local):
            return True
        return host.endswith(self.suffixes) if self.suffixes else False

    def refusal(self, scope: Scope) -> VoxError | None:
        """The error refusing this request, or None to serve it."""
        values = [v for k, v in scope.get("headers", ()) if k.lower() == b"host"]
        if not values or self.any_host:
            return None  # HTTP/1.0: no browser's
        if len(values) > 1:
            return host_error("more than one Host header")
        text = values[0].decode("latin-1")
        host = host_of(text)
        server = scope.get("server")
        local = server[0] if server and isinstance(server[0], str) else None
        if host is not None and self.allows(host, local):
            return None
        return host_error(f"Host {quoted(text, 80)} is not this server's name (allowed_hosts)")


def host_error(message: str) -> VoxError:
    return VoxError(ErrorCode.HOST_NOT_ALLOWED, message, fatal=True)


class HostGuard:
    """ASGI middleware: every http and websocket request but OPEN_PATHS checked against
    `rule` before anything else runs. `count(transport)` counts a refusal."""

    def __init__(
        self, app: ASGIApp, rule: HostRule, count: Callable[[str], None] = lambda _: None
    ) -> None:
        self.app = app
        self.rule = rule
        self.count = count

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind in ("http", "websocket") and scope["path"] not in OPEN_PATHS:
            error = self.rule.refusal(scope)
            if error is not None:
                self.count(kind)
                if kind == "http":
                    await error_response(error)(scope, receive, send)
                else:
                    await refuse_websocket(scope, receive, send, error)
                return
        await self.app(scope, receive, send)


async def refuse_websocket(scope: Scope, receive: Receive, send: Send, error: VoxError) -> None:
    """What /v1/stream and /v1/realtime do with a foreign Origin: accept, one `error` event
    in the route's protocol, close 1008 with the code as reason. Other paths: the handshake
    refused (403)."""
    message = await receive()
    if message["type"] != "websocket.connect":
        return
    offered = list(scope.get("subprotocols") or [])
    path = scope["path"]
    if path == "/v1/stream":
        subprotocol = STREAM_SUBPROTOCOL
        texts = [encode_event(refusal_event(error, try_again=False))]
    elif path == "/v1/realtime":
        subprotocol = REALTIME_SUBPROTOCOL
        beta_header = b"realtime=v1" in _header(scope, b"openai-beta").replace(b" ", b"")
        beta = beta_header or BETA_SUBPROTOCOL in offered
        wire = initial_wire(Installed((), ""), model="", beta=beta)
        texts = RealtimeEncoder(wire).encode(refusal_event(error, try_again=False))
    else:
        await send({"type": "websocket.close", "code": CLOSE_POLICY})
        return
    accept = subprotocol if subprotocol in offered else None
    await send({"type": "websocket.accept", "subprotocol": accept})
    for text in texts:
        await send({"type": "websocket.send", "text": text})
    await send({"type": "websocket.close", "code": CLOSE_POLICY, "reason": error.code.value})


def _header(scope: Scope, name: bytes) -> bytes:
    return next((v for k, v in scope.get("headers", ()) if k.lower() == name), b"")
