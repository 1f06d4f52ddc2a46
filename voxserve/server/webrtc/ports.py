"""Host candidates on the configured UDP ports (`webrtc.port_min..port_max`), so a firewall
opens just those.

aioice binds every host candidate to `(address, 0)`, an ephemeral port. `PortRange.install`
replaces, on one ICE connection (an instance attribute: nothing global is patched), the
method that gathers a component's candidates: each host address gets the first free port of
the range, scanning from a cursor that moves on (a port just given back is not the next
one taken); STUN server-reflexive candidates are asked for on those same sockets, and TURN
relays are left to aioice (its own method, called with no host addresses). A range with no
free port for any address refuses the call (`PortsExhausted` -> 503 overloaded).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # aiortc/aioice are an optional extra: imported where a call is made
    from aioice import Candidate, Connection
    from aioice.ice import StunProtocol

GATHER_TIMEOUT_S = 5  # aioice's own wait for STUN/TURN answers
UDP_BUFFER_BYTES = 1024 * 1024  # as aioice sets (turn.UDP_SOCKET_BUFFER_SIZE)

Gather = Callable[[int, list[str], int], Awaitable[list["Candidate"]]]


class PortsExhausted(Exception):
    """No port of the range is free on any host address."""


class PortRange:
    """The ports host candidates may bind; `any` (0, 0) leaves aioice as it is."""

    def __init__(self, port_min: int, port_max: int) -> None:
        self.port_min = port_min
        self.port_max = port_max
        self._next = port_min

    @property
    def any(self) -> bool:
        return self.port_min == 0

    @property
    def size(self) -> int:
        return self.port_max - self.port_min + 1

    def install(self, connection: Connection) -> None:
        """Make `connection` gather its host candidates in the range (before gathering)."""
        if self.any:
            return
        original: Gather = connection.get_component_candidates
        range_ = self

        async def get_component_candidates(
            component: int,
            addresses: list[str],
            timeout: int = GATHER_TIMEOUT_S,  # noqa: ASYNC109
        ) -> list[Candidate]:
            return await range_.gather(connection, original, component, addresses, timeout)

        connection.get_component_candidates = get_component_candidates  # type: ignore[method-assign]

    def bind(self, address: str) -> socket.socket | None:
        """A UDP socket on `address` and the first free port of the range from the cursor."""
        family = socket.AF_INET6 if ipaddress.ip_address(address).version == 6 else socket.AF_INET
        for i in range(self.size):
            port = self.port_min + (self._next - self.port_min + i) % self.size
            sock = socket.socket(family, socket.SOCK_DGRAM)
            try:
                sock.bind((address, port))
            except OSError:
                sock.close()
                continue
            self._next = self.port_min + (port + 1 - self.port_min) % self.size
            sock.setblocking(False)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, UDP_BUFFER_BYTES)
            except OSError:
                pass
            return sock
        return None

    async def gather(
        self,
        connection: Connection,
        original: Gather,
        component: int,
        addresses: list[str],
        timeout: int,  # noqa: ASYNC109 (aioice's signature)
    ) -> list[Candidate]:
        """aioice's gathering (Connection.get_component_candidates), host ports from the
        range."""
        from aioice.candidate import Candidate, candidate_foundation, candidate_priority
        from aioice.ice import StunProtocol, server_reflexive_candidate

        loop = asyncio.get_running_loop()
        hosts: list[StunProtocol] = []
        for address in addresses:
            sock = self.bind(address)
            if sock is None:
                continue
            _, protocol = await loop.create_datagram_endpoint(
                lambda: StunProtocol(connection), sock=sock
            )
            host, port = protocol.transport.get_extra_info("sockname")[:2]
            protocol.local_candidate = Candidate(
                foundation=candidate_foundation("host", "udp", host),
                component=component,
                transport="udp",
                priority=candidate_priority(component, "host"),
                host=host,
                port=port,
                type="host",
            )
            hosts.append(protocol)
        if addresses and not hosts:
            raise PortsExhausted(
                f"no free UDP port in webrtc.port_min..port_max "
                f"({self.port_min}-{self.port_max}) for a new call"
            )
        connection._protocols += hosts
        candidates = [p.local_candidate for p in hosts]
        stun_server = connection.stun_server
        if stun_server is not None:
            ipv4 = [p for p in hosts if ipaddress.ip_address(p.local_candidate.host).version == 4]
            tasks = [asyncio.create_task(server_reflexive_candidate(p, stun_server)) for p in ipv4]
            if tasks:
                done, pending = await asyncio.wait(tasks, timeout=timeout)
                for task in pending:
                    task.cancel()
                candidates += [t.result()[0] for t in done if t.exception() is None]
        # TURN (when configured): aioice's own path; with no host addresses it binds nothing.
        if connection.turn_server is not None:
            candidates += await original(component, [], timeout)
        return candidates
