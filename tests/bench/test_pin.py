"""`bench baseline --pin`: the servers on core 0, the load (this process) on the others."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PINNING = """
import os, subprocess, sys
from voxserve.bench.procstat import pin_servers
server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
try:
    pin_servers(server.pid)
    print(sorted(os.sched_getaffinity(server.pid)), sorted(os.sched_getaffinity(0)))
finally:
    server.kill()
"""


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="--pin needs two cores")
def test_pin_puts_the_server_on_core_0_and_the_load_elsewhere() -> None:
    # In a child process: pinning the test's own process would pin the tests after it.
    out = subprocess.run(
        [sys.executable, "-c", PINNING], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split("] [")
    server, load = out[0].strip(" []\n"), out[1].strip(" []\n")
    assert server == "0"
    assert "0" not in load.split(", ") and load


def test_pin_refuses_a_server_it_cannot_see() -> None:
    from voxserve.bench.procstat import pin_servers

    if (os.cpu_count() or 1) < 2:
        with pytest.raises(SystemExit, match="two cores"):
            pin_servers(None)
        return
    with pytest.raises(SystemExit, match="server's pid"):
        pin_servers(None)
