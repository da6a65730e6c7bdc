"""Signals of a mount daemon: SIGINT/SIGTERM unmount (a signal that arrives before trio's
receiver exists is remembered, not raised); faulthandler and SIGUSR1 stack dumps to the log.
"""

from __future__ import annotations

import faulthandler
import logging
import signal
import sys
from typing import Any

from fanfs.mount.options import MountConfig

# The logger of the whole `fanfs mount` command, whichever module of it writes: the log says
# "fanfs.mount: mounted ...", as it always has.
log = logging.getLogger("fanfs.mount")


def enable_faulthandler(config: MountConfig) -> None:
    """Fatal-signal tracebacks and SIGUSR1 stack dumps go to the log (stderr is /dev/null
    in a background daemon)."""
    stream = sys.stderr
    for handler in logging.getLogger("fanfs").handlers:
        if isinstance(handler, logging.FileHandler):
            stream = handler.stream
    faulthandler.enable(file=stream, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=stream, all_threads=True)


_EARLY_SIGNALS: list[int] = []


def remember_signal(signum: int, frame: object) -> None:
    _EARLY_SIGNALS.append(signum)


async def handle_signals(pyfuse3: Any, cluster: Any) -> None:
    import trio

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        # A signal that came before this receiver (during start-up, or while another
        # serving process already answered requests) was kept by remember_signal.
        signum = _EARLY_SIGNALS[0] if _EARLY_SIGNALS else None
        if signum is None:
            async for received in signals:
                signum = received
                break
        if signum is None:
            return
        log.info("received %s, unmounting", signal.Signals(signum).name)
        if cluster is not None:
            cluster.shutdown()
        pyfuse3.terminate()
