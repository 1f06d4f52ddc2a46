"""A stop signal while uvicorn's event loop closes (server/serve.py DrainingServer): noted,
and raised once the loop is closed, so the CLI's handler (cli/signals.py: KeyboardInterrupt)
never runs inside uvloop's teardown. It did, once in CI: a worker of `serve --workers 2`
stopped with the others logged "Cannot close a running event loop" and its traceback."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import os, signal, types
    import uvicorn
    from voxserve.cli.signals import interrupt, sigterm_interrupts
    from voxserve.server.serve import DrainingServer

    async def app(scope, receive, send):
        pass

    found = signal.getsignal(signal.SIGINT)  # SIG_IGN where the parent ignores it (xdist)
    with sigterm_interrupts():
        server = DrainingServer(uvicorn.Config(app), types.SimpleNamespace())
        with server.capture_signals():
            assert signal.getsignal(signal.SIGTERM) == server.handle_exit
        os.kill(os.getpid(), signal.SIGTERM)  # the loop closing: noted, not raised
        os.kill(os.getpid(), signal.SIGINT)
        caught = server.restore_signals()
        assert caught == [signal.SIGTERM, signal.SIGINT], caught
        assert signal.getsignal(signal.SIGTERM) is interrupt  # the CLI's, back
        assert signal.getsignal(signal.SIGINT) == found
        try:
            signal.raise_signal(signal.SIGTERM)
        except KeyboardInterrupt:
            print("stopped cleanly")
    """
)


def test_a_signal_while_the_loop_closes_is_raised_after_it() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "stopped cleanly"
    assert "Traceback" not in proc.stderr
