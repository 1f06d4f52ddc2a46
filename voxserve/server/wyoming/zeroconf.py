"""Zeroconf (mDNS/DNS-SD) for the Wyoming port, so Home Assistant finds the server itself.

Home Assistant's Wyoming integration browses `_wyoming._tcp.local.`; for each record it
connects to the record's first IPv4 address and port, sends `describe`, and offers the
server under the program's name (its unique id is the record's instance name plus that
name). So the record says: the instance name (`wyoming.zeroconf_name`, default
`voxserve-<host>`), the bound port, and addresses HA can reach: the bind address when
`host` is one address (127.0.0.1 stays on the loopback: nothing else could connect), else
the one address mDNS packets leave from (the LAN Home Assistant listens on), as the
`wyoming` package's own `HomeAssistantZeroconf` does. Not every address: Home Assistant
connects to the first IPv4 address of the record it happens to hold, and on a machine
with Docker or a VPN that is as likely `172.17.0.1` (unreachable) as the LAN address.

Advertising is best effort: the server serves the same without it. A network without
multicast (a container, a sandbox) gives one warning and no record; a name another host
already uses is changed (`name-2`), as DNS-SD wants, and logged. The record is withdrawn
(goodbye packets) when the transport stops, SIGTERM included (the app's lifespan). With
`--workers N` Wyoming is off (cli/workers.py), so only a one-process server advertises.

The record appears once the engines are loaded, not when the port opens: Home Assistant
answers a new record at once with `describe` (1 s timeout, 3 tries 2 s apart), and
before the models load `describe` is an `error` (not_ready): the discovery would end in
"no services", and no new record comes to start it again.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import socket

import ifaddr
from zeroconf import InterfaceChoice, IPVersion
from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

log = logging.getLogger(__name__)

SERVICE_TYPE = "_wyoming._tcp.local."
MDNS_GROUP = "224.0.0.251"  # the interface packets to it leave by is the LAN's
ANY_HOST = ("", "0.0.0.0", "::")
REGISTER_TIMEOUT_S = 10.0  # probing and announcing take ~2 s; a stuck network must not hang


def host_label() -> str:
    """This machine's name as a DNS label (letters, digits, hyphens; 63 at most)."""
    label = re.sub(r"[^A-Za-z0-9-]+", "-", socket.gethostname().split(".")[0]).strip("-")
    return (label or "host")[:40]


def default_name() -> str:
    return f"voxserve-{host_label()}"


def advertised_addresses(host: str) -> list[str]:
    """The IPv4 addresses a client can connect to: the bind address if it is one, else
    the mDNS route's source address (without a route: every non-loopback IPv4 address,
    the loopback's if the machine has no other)."""
    if host not in ANY_HOST:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:  # a host name: what it resolves to
            resolved = socket.getaddrinfo(host, None, socket.AF_INET)
            return sorted({str(info[4][0]) for info in resolved})
        return [str(address)] if address.version == 4 else []
    if route := mdns_source_address():
        return [route]
    found = {
        ip.ip
        for adapter in ifaddr.get_adapters()
        for ip in adapter.ips
        if isinstance(ip.ip, str) and not ipaddress.ip_address(ip.ip).is_loopback
    }
    return sorted(found) or ["127.0.0.1"]


def mdns_source_address() -> str | None:
    """The local address packets to the mDNS group leave from (no packet is sent: a UDP
    connect only picks the route), or None where there is no route."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((MDNS_GROUP, 5353))
            address = str(probe.getsockname()[0])
        except OSError:
            return None
    return None if ipaddress.ip_address(address).is_unspecified else address


class WyomingAdvertiser:
    """The `_wyoming._tcp.local.` record of one server: registered in the background at
    start (probing takes seconds; the port serves meanwhile), withdrawn at stop."""

    def __init__(self, name: str, host: str, port: int) -> None:
        self.name = name  # the instance name asked for; `registered_name` once registered
        self.host = host
        self.port = port
        self.registered_name: str | None = None
        self._zeroconf: AsyncZeroconf | None = None
        self._info: AsyncServiceInfo | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self, after: asyncio.Event | None = None) -> None:
        """Register once `after` is set (the engines loaded: see WyomingTransport)."""
        self._task = asyncio.get_running_loop().create_task(
            self._register(after), name="voxserve-zeroconf"
        )

    async def wait_registered(self) -> str | None:
        """The registered instance name, once registration ended (None: it failed)."""
        if self._task is not None:
            await asyncio.wait([self._task])
        return self.registered_name

    async def _register(self, after: asyncio.Event | None) -> None:
        if after is not None:
            await after.wait()
        try:
            addresses = advertised_addresses(self.host)
            if not addresses:
                raise OSError(f"no IPv4 address to advertise for host {self.host}")
            # A specific bind address: answer on that interface only (the loopback too).
            interfaces = InterfaceChoice.All if self.host in ANY_HOST else addresses
            self._zeroconf = AsyncZeroconf(interfaces=interfaces, ip_version=IPVersion.V4Only)
            info = AsyncServiceInfo(
                SERVICE_TYPE,
                f"{self.name}.{SERVICE_TYPE}",
                port=self.port,
                parsed_addresses=addresses,
                server=f"voxserve-{host_label()}.local.",
            )
            async with asyncio.timeout(REGISTER_TIMEOUT_S):
                # Probing (a name conflict renames), then the announcements it schedules.
                await (await self._zeroconf.async_register_service(info, allow_name_change=True))
            self._info = info
            self.registered_name = info.name.removesuffix(f".{SERVICE_TYPE}")
        except Exception as exc:  # best effort: the port serves without it
            log.warning(
                "zeroconf: Wyoming not advertised; Home Assistant must be given host and port",
                extra={"error": f"{type(exc).__name__}: {exc}"},
            )
            await self._close()
            return
        if self.registered_name != self.name:
            log.warning(
                "zeroconf: the name is taken on the network; advertised under another",
                extra={"wanted": self.name, "advertised": self.registered_name},
            )
        log.info(
            "zeroconf: Wyoming advertised",
            extra={"service": self.registered_name, "port": self.port, "addresses": addresses},
        )

    async def stop(self) -> None:
        """Withdraw the record (goodbye packets: browsers drop it at once) and close."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.wait([self._task])
        if self._zeroconf is not None and self._info is not None:
            try:
                async with asyncio.timeout(REGISTER_TIMEOUT_S):
                    # The goodbyes are sent before the sockets close (awaited twice).
                    await (await self._zeroconf.async_unregister_service(self._info))
            except Exception as exc:  # shutting down: say so, go on
                log.warning("zeroconf: goodbye not sent", extra={"error": repr(exc)})
        self._info = None
        await self._close()

    async def _close(self) -> None:
        zeroconf, self._zeroconf = self._zeroconf, None
        if zeroconf is not None:
            try:
                await zeroconf.async_close()
            except Exception as exc:
                log.debug("zeroconf close failed", extra={"error": repr(exc)})
