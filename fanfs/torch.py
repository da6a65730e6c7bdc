"""`HintedSampler`: a PyTorch sampler wrapper that tells a fanfs mount each epoch's order.

    from fanfs.torch import HintedSampler

    dataset = ImageFolder("/mnt/data/train")
    sampler = HintedSampler(RandomSampler(dataset), [path for path, _ in dataset.samples])
    loader = DataLoader(dataset, sampler=sampler, batch_size=64, num_workers=4)

Each time the DataLoader starts an epoch, the wrapper draws the wrapped sampler's order,
sends it to the mount (fanfs.hints: the paths once, then 4 bytes per sample and epoch), and
yields the same indices,
reporting its position every `every` samples so the daemon stays a window ahead. The order and
the randomness are the wrapped sampler's own: training is unchanged with or without fanfs.

Hints are advice. If the paths are not on a fanfs mount, or the mount goes away, the wrapper
logs one warning and keeps yielding indices. Needs no import of torch: DataLoader accepts any
iterable with a length as its sampler.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from fanfs.errors import FanfsError
from fanfs.hints import HintChannel

log = logging.getLogger(__name__)


def find_mountpoint(path: str) -> str:
    """The mount point that holds `path`."""
    path = os.path.abspath(path)
    while not os.path.ismount(path):
        path = os.path.dirname(path)
    return path


class HintedSampler:
    """Wraps `sampler` (an iterable of dataset indices); `paths[i]` is sample i's file."""

    def __init__(
        self,
        sampler: Iterable[int],
        paths: Sequence[str],
        *,
        mountpoint: str | None = None,
        every: int = 32,
    ) -> None:
        self.sampler = sampler
        self.paths = paths
        self.mountpoint = mountpoint
        self.every = max(1, every)
        self._channel: HintChannel | None = None
        self._warned = False

    def __len__(self) -> int:
        return len(self.sampler)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[int]:
        order = [int(i) for i in self.sampler]
        channel = self._send(order)
        for position, index in enumerate(order):
            if channel is not None and position % self.every == 0:
                try:
                    channel.progress(position)
                except (OSError, FanfsError) as exc:
                    self._lost(exc)
                    channel = None
            yield index

    def _send(self, order: list[int]) -> HintChannel | None:
        if not order:
            return None
        try:
            if self._channel is None:
                # The paths go once per channel; each epoch then costs 4 bytes per sample.
                channel = HintChannel(self.mountpoint or find_mountpoint(self.paths[0]))
                self._channel = channel
                known, missing = channel.register(self.paths)
                if missing and not self._warned:
                    self._warned = True
                    log.warning(
                        "fanfs: %d of %d hinted paths are not in the mount",
                        missing,
                        known + missing,
                    )
            self._channel.send_indices(order)
        except (OSError, FanfsError) as exc:
            self._lost(exc)
        return self._channel

    def _lost(self, exc: Exception) -> None:
        if not self._warned:
            self._warned = True
            log.warning("fanfs: sampler hints disabled: %s", exc)
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def __getstate__(self) -> dict[str, Any]:
        # DataLoader workers may receive a copy: the socket stays in the main process.
        state = self.__dict__.copy()
        state["_channel"] = None
        return state
