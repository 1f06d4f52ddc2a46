"""Zeroconf discovery of the Wyoming port, seen by a real zeroconf browser on the loopback
(multicast works there in this sandbox; the servers bind 127.0.0.1, so that is where they
answer): the record names the port and the address, Home Assistant's next step (connect,
`describe`) works on what was found, a name already taken is changed, no record without
zeroconf, the record leaves at shutdown, and a network where zeroconf cannot start costs
one warning, not the server. SIGTERM's goodbye is in tests/test_cli.py."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Iterator

import ifaddr
import pytest
from wyoming.client import AsyncTcpClient
from wyoming.info import Describe, Info
from zeroconf import IPVersion, ServiceStateChange, Zeroconf
from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf

from tests.conftest import LiveServer, free_port, start_server, stop_server
from tests.fakes import fake_runtime
from voxserve.config import WyomingConfig, load_settings
from voxserve.server.wyoming.server import WyomingTransport
from voxserve.server.wyoming.zeroconf import (
    SERVICE_TYPE,
    WyomingAdvertiser,
    advertised_addresses,
    mdns_source_address,
)

WAIT_S = 10.0


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def discoverable_server(name: str, *, zeroconf: bool = True) -> LiveServer:
    settings = load_settings(port=free_port(), log_level="warning")
    wyoming = WyomingConfig(zeroconf=zeroconf, zeroconf_name=name)
    settings = settings.model_copy(update={"wyoming": wyoming})
    return start_server(settings, fake_runtime(settings), wyoming_port=free_port())


class Browser:
    """A zeroconf browser of `_wyoming._tcp.local.` on the loopback: names seen added and
    removed, as Home Assistant's zeroconf integration sees them."""

    def __init__(self) -> None:
        self.zeroconf = AsyncZeroconf(interfaces=["127.0.0.1"], ip_version=IPVersion.V4Only)
        self.added: set[str] = set()
        self.removed: set[str] = set()
        self.browser = AsyncServiceBrowser(
            self.zeroconf.zeroconf, SERVICE_TYPE, handlers=[self._changed]
        )

    def _changed(
        self, zeroconf: Zeroconf, service_type: str, name: str, state_change: ServiceStateChange
    ) -> None:
        if state_change is ServiceStateChange.Added:
            self.added.add(name)
        elif state_change is ServiceStateChange.Removed:
            self.removed.add(name)

    async def until(self, seen: set[str], name: str) -> bool:
        for _ in range(int(WAIT_S / 0.05)):
            if f"{name}.{SERVICE_TYPE}" in seen:
                return True
            await asyncio.sleep(0.05)
        return False

    async def resolve(self, name: str, timeout_ms: int = 3000) -> AsyncServiceInfo | None:
        info = AsyncServiceInfo(SERVICE_TYPE, f"{name}.{SERVICE_TYPE}")
        found = await info.async_request(self.zeroconf.zeroconf, timeout_ms)
        return info if found else None

    async def close(self) -> None:
        await self.browser.async_cancel()
        await self.zeroconf.async_close()


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    watching = Browser()
    yield watching
    await watching.close()


def _forget_own_multicasts(advertiser: WyomingAdvertiser) -> None:
    """Make the first stack answer the second's probe by multicast, as another host's would
    reach it. On one host the unicast answer to a QU probe goes to whichever socket of port
    5353 the kernel's SO_REUSEPORT hash picks, with a secret drawn at boot: on some machines
    the prober's, on others the responder's own (then the conflict is never seen, and the
    test failed on every run there). A responder that has not multicast a record recently
    answers by multicast (RFC 6762 5.4; zeroconf reads "recently" from its cache), so the
    first stack's cache is emptied of what it heard of its own announcements."""
    zeroconf = advertiser._zeroconf
    assert zeroconf is not None
    cache = zeroconf.zeroconf.cache
    cache.async_remove_records(
        [record for name in cache.names() for record in cache.async_entries_with_name(name)]
    )


async def test_a_name_already_taken_is_changed() -> None:
    """First in the module, with no other zeroconf stack open: on one host several stacks
    share port 5353, and the unicast answer to a probe (RFC 6762 QU) reaches only one of
    them (in production the conflicting server is another host)."""
    name = unique("voxserve-taken")
    first = WyomingAdvertiser(name, "127.0.0.1", free_port())
    first.start()
    assert await first.wait_registered() == name
    _forget_own_multicasts(first)
    second = WyomingAdvertiser(name, "127.0.0.1", free_port())
    second.start()
    try:
        assert await second.wait_registered() == f"{name}-2"
    finally:
        await second.stop()
        await first.stop()


@pytest.fixture(scope="module")
def named_server() -> Iterator[tuple[LiveServer, str]]:
    name = unique("voxserve-test")
    live = discoverable_server(name)
    yield live, name
    stop_server(live)


async def test_the_record_names_the_port_and_home_assistant_can_describe_it(
    named_server: tuple[LiveServer, str], browser: Browser
) -> None:
    live, name = named_server
    assert await browser.until(browser.added, name)
    info = await browser.resolve(name)
    assert info is not None
    assert info.port == live.settings.wyoming_port
    assert info.parsed_addresses() == ["127.0.0.1"]  # the bind address, nothing else
    # Home Assistant's config flow: connect to the first address and port, `describe`.
    host = info.parsed_addresses()[0]
    async with AsyncTcpClient(host, info.port, read_timeout=10) as wyoming:
        await wyoming.write_event(Describe().event())
        event = await wyoming.read_event()
    assert event is not None and Info.is_type(event.type)
    assert [program.name for program in Info.from_event(event).asr] == ["voxserve"]


async def test_no_zeroconf_advertises_nothing_and_shutdown_withdraws_the_record(
    browser: Browser,
) -> None:
    quiet_name, name = unique("voxserve-quiet"), unique("voxserve-leaving")
    quiet = discoverable_server(quiet_name, zeroconf=False)
    live = discoverable_server(name)
    try:
        assert await browser.until(browser.added, name)  # the other one shows by now
        assert await browser.resolve(quiet_name, timeout_ms=1000) is None
        assert f"{quiet_name}.{SERVICE_TYPE}" not in browser.added
    finally:
        stop_server(quiet)
        stop_server(live)
    assert await browser.until(browser.removed, name)  # goodbye packets, not a TTL expiry


async def test_zeroconf_that_cannot_start_is_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # An address not on this machine: no socket can join the multicast group there.
    advertiser = WyomingAdvertiser(unique("voxserve-nowhere"), "192.0.2.99", free_port())
    with caplog.at_level(logging.WARNING, logger="voxserve.server.wyoming.zeroconf"):
        advertiser.start()
        assert await advertiser.wait_registered() is None
        await advertiser.stop()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "not advertised" in warnings[0].getMessage()


def test_on_every_interface_the_record_has_the_lan_address_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`--host 0.0.0.0` on a machine with a Docker bridge: Home Assistant connects to the
    first address of the record it holds, so the record carries the one address mDNS
    leaves from (the machine's own adapters, plus a bridge this test adds)."""
    adapters = ifaddr.get_adapters()
    bridge = ifaddr.Adapter("docker0", "docker0", [ifaddr.IP("172.17.0.1", 16, "docker0")])
    monkeypatch.setattr(ifaddr, "get_adapters", lambda: [*adapters, bridge])
    route = mdns_source_address()
    assert route is not None and route != "172.17.0.1"
    assert advertised_addresses("0.0.0.0") == [route]
    assert advertised_addresses("192.0.2.7") == ["192.0.2.7"]  # a bind address stays


async def test_the_record_appears_once_the_engines_are_loaded(browser: Browser) -> None:
    """Home Assistant describes a record as soon as it sees it; before the models load
    `describe` is `not_ready` and its discovery would give up for good."""
    name = unique("voxserve-loading")
    settings = load_settings(port=free_port(), log_level="warning")
    settings = settings.model_copy(
        update={"host": "127.0.0.1", "wyoming": WyomingConfig(zeroconf_name=name)}
    )
    transport = WyomingTransport(fake_runtime(settings), 0)  # not loaded yet
    await transport.start()
    try:
        assert transport.advertiser is not None
        assert await browser.resolve(name, timeout_ms=2500) is None
        transport.runtime.loaded.set()  # what Runtime.load does once ready
        assert await transport.advertiser.wait_registered() == name
        assert await browser.until(browser.added, name)
    finally:
        await transport.stop()
