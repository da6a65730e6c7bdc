"""Dropping one file's pages from the kernel's page cache, and checking that they are gone.

A single POSIX_FADV_DONTNEED is a request, not a promise: a page that is locked or busy at
that moment stays (CI saw a partition, and 183 of 3,000 mounted files, survive it). Tests
that count the reads reaching fanfs drop until `mincore` says the pages are gone."""

from __future__ import annotations

import ctypes
import mmap
import os
import time

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
_libc.mmap.argtypes += [ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def cached_pages(fd: int) -> int:
    """How many of the file's pages the page cache holds (mincore on a mapping that is never
    touched: unlike a probing read, it brings nothing in and sends no request)."""
    size = os.fstat(fd).st_size
    if size == 0:
        return 0
    page = os.sysconf("SC_PAGESIZE")
    addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
    try:
        vec = (ctypes.c_ubyte * ((size + page - 1) // page))()
        assert _libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
        return sum(b & 1 for b in vec)
    finally:
        _libc.munmap(addr, size)


def drop_from_page_cache(fd: int, timeout: float = 5.0) -> None:
    """POSIX_FADV_DONTNEED until the kernel has really dropped the file's pages."""
    deadline = time.monotonic() + timeout
    while True:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        if not cached_pages(fd):
            return
        assert time.monotonic() < deadline, "the kernel keeps the file in its page cache"
        time.sleep(0.01)
