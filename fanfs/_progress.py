"""A one-line progress bar with rate and ETA for long commands (pack, verify).

Writes to stderr only when enabled (a terminal and not --quiet), redrawn at most 10 times a
second so it costs nothing measurable.
"""

from __future__ import annotations

import sys
import time
from typing import Final

from fanfs._sizes import format_size

REDRAW_S: Final = 0.1


class Progress:
    def __init__(
        self, total_bytes: int, total_items: int, *, enabled: bool, label: str = "packing"
    ) -> None:
        self.total_bytes = total_bytes
        self.total_items = total_items
        self.enabled = enabled
        self.label = label
        self.done_bytes = 0
        self.done_items = 0
        self._start = time.monotonic()
        self._last = 0.0
        self._drawn = False

    def advance(self, nbytes: int, items: int = 1) -> None:
        self.done_bytes += nbytes
        self.done_items += items
        if self.enabled:
            now = time.monotonic()
            if now - self._last >= REDRAW_S:
                self._last = now
                self._draw(now)

    def _draw(self, now: float) -> None:
        elapsed = max(now - self._start, 1e-6)
        rate = self.done_bytes / elapsed
        frac = self.done_bytes / self.total_bytes if self.total_bytes else 1.0
        eta = (self.total_bytes - self.done_bytes) / rate if rate > 0 else 0.0
        width = 24
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        line = "%s [%s] %5.1f%% %s/%s %s/s ETA %s" % (
            self.label,
            bar,
            100 * frac,
            format_size(self.done_bytes),
            format_size(self.total_bytes),
            format_size(rate),
            _clock(eta),
        )
        sys.stderr.write("\r" + line + "\033[K")
        sys.stderr.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn:
            self._draw(time.monotonic())
            sys.stderr.write("\n")
            sys.stderr.flush()


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return "%d:%02d:%02d" % (seconds // 3600, seconds // 60 % 60, seconds % 60)
