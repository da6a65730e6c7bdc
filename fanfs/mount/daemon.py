"""Run the mount as a background daemon: fork before any thread exists, detach, and tell
the waiting parent "ok" once the kernel has mounted, or why start-up failed.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from fanfs.errors import FanfsError
from fanfs.format.reader import PackReader
from fanfs.logsetup import setup_logging
from fanfs.mount.options import MountConfig
from fanfs.mount.serve import serve

# The logger of the whole `fanfs mount` command, whichever module of it writes: the log says
# "fanfs.mount: mounted ...", as it always has.
log = logging.getLogger("fanfs.mount")


def daemonize(reader: PackReader, config: MountConfig, pyfuse3: Any, logfile: str) -> int:
    """Fork; the parent returns once the child has mounted (or failed, with its message)."""
    setup_logging(debug=config.debug, logfile=logfile)  # a bad log path fails here, in one line
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as status_pipe:
            status = status_pipe.read().decode(errors="replace")
        if status.startswith("ok"):
            return 0
        told, _, message = status.partition(" ")
        if not told.isdigit():
            message, told = "the mount daemon died during start-up; see %s" % logfile, "4"
        print("fanfs mount: error: %s" % message.strip(), file=sys.stderr)
        return int(told)
    os.close(read_fd)
    os.setsid()
    pipe = [write_fd]  # emptied once the parent has been told; the fd number is then reused
    # A process forked before the parent is told (the cache filler of a one-process mount)
    # must not hold the pipe open: the parent reads it to the end.
    os.register_at_fork(after_in_child=lambda: _forget(pipe))
    code = 1
    try:
        _detach_stdio()

        def ready() -> None:
            os.write(pipe.pop(), b"ok\n")
            os.close(write_fd)

        code = serve(reader, config, pyfuse3, on_ready=ready)
    except FanfsError as exc:
        log.error("%s", exc)
        _report(pipe, exc.exit_code, str(exc))
        code = exc.exit_code
    except BaseException as exc:
        log.exception("mount daemon failed")
        _report(pipe, 1, "internal error: %s (see %s)" % (exc, logfile))
    finally:
        logging.shutdown()
        os._exit(code)


def _report(pipe: list[int], code: int, message: str) -> None:
    """Tell the waiting parent why start-up failed (unless it was already told "ok")."""
    if pipe:
        fd = pipe.pop()
        os.write(fd, ("%d %s\n" % (code, message)).encode())
        os.close(fd)


def _forget(pipe: list[int]) -> None:
    """In a forked child: close the status pipe if the parent has not been told yet."""
    if pipe:
        os.close(pipe.pop())


def _detach_stdio() -> None:
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
