"""Logging setup for the commands and the mount daemon, and the log-once filter.

Not named logging.py so it never shadows the stdlib module.
"""

from __future__ import annotations

import errno
import logging
import os
import sys
from typing import Any, Final

from fanfs.errors import MountSetupError

LOG_ONCE: Final = {"log_once": True}


class LogOnceFilter(logging.Filter):
    """Drop repeats of records logged with `extra=LOG_ONCE` (same message and arguments)."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[tuple[str, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "log_once", False):
            return True
        key = (record.msg if isinstance(record.msg, str) else repr(record.msg), repr(record.args))
        if key in self._seen:
            return False
        self._seen.add(key)
        return True


def setup_logging(
    *, debug: bool = False, quiet: bool = False, logfile: str | None = None, prefix: str = ""
) -> None:
    """Send fanfs's records to stderr (commands) or to `logfile` (a background daemon)."""
    root = logging.getLogger("fanfs")
    handler: logging.Handler
    if logfile:
        handler = _open_log(logfile)  # first: if it fails, the old handlers stay
        fmt = (
            "%(asctime)s.%(msecs)03d %(process)d " + prefix + "%(levelname)s %(name)s: %(message)s"
        )
        handler.setFormatter(logging.Formatter(fmt, datefmt="%Y-%m-%d %H:%M:%S"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(
            logging.Formatter("fanfs: " + prefix + "%(levelname_lower)s: %(message)s")
        )
        handler.addFilter(_lower_level)
    handler.addFilter(LogOnceFilter())
    # pyfuse3's own warnings (a reply that failed, the patch's fallbacks) go to the same
    # place: a daemon's stderr is /dev/null.
    pyfuse3_log = logging.getLogger("pyfuse3")
    for logger in (root, pyfuse3_log):
        for old in list(logger.handlers):
            logger.removeHandler(old)
        logger.addHandler(handler)
        logger.propagate = False
    root.setLevel(logging.DEBUG if debug else logging.WARNING if quiet else logging.INFO)
    pyfuse3_log.setLevel(logging.DEBUG if debug else logging.WARNING)
    if not debug:
        # Disabled DEBUG calls on hot paths then cost one integer comparison.
        logging.disable(logging.DEBUG)


def _lower_level(record: logging.LogRecord) -> bool:
    record.levelname_lower = record.levelname.lower()
    return True


class NoFollowFileHandler(logging.FileHandler):
    """A log file opened with O_NOFOLLOW, created mode 0600: a daemon running as root never
    appends through a symlink someone planted at its log's path."""

    def _open(self) -> Any:
        return open(
            self.baseFilename,
            self.mode,
            encoding=self.encoding,
            errors=self.errors,
            opener=_nofollow,
        )


def _nofollow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def _open_log(logfile: str) -> logging.Handler:
    try:
        return NoFollowFileHandler(logfile)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise MountSetupError(
                "log file %s is a symbolic link; fanfs does not write through links "
                "(give the real path with --log)" % logfile
            ) from exc
        raise MountSetupError("cannot write the log file %s: %s" % (logfile, exc.strerror)) from exc
