"""The index is read in pieces, each checksummed in a thread while the next is read
(fanfs/format/index.py): the same bytes and the same crc32 verdict as reading it whole, and
no thread left behind, whatever happens (the mount forks right after)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from fanfs.errors import PackFormatError
from fanfs.format import index as index_module
from fanfs.format.reader import PackReader
from tests.forge import copy_pack

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden-v5" / "auto.fan"


@pytest.mark.parametrize("piece", [1, 4095, 4096, 100_003, 1 << 30])
def test_an_index_read_in_pieces_is_the_file(piece: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index_module, "READ_PIECE", piece)
    threads = threading.active_count()
    reader = PackReader(str(GOLDEN))
    try:
        assert bytes(reader.index._map) == (GOLDEN / "index").read_bytes()
        assert np.array_equal(reader.index.arrays["parent"][:3], [0, 0, 0])
    finally:
        reader.close()
    assert threading.active_count() == threads


@pytest.mark.parametrize("where", [0, 5000, -1])
def test_a_flipped_byte_anywhere_fails_the_checksum(
    where: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(index_module, "READ_PIECE", 4096)
    pack = copy_pack(GOLDEN, tmp_path / "pack.fan")
    data = bytearray((pack / "index").read_bytes())
    data[where] ^= 0x40
    (pack / "index").write_bytes(data)
    threads = threading.active_count()
    with pytest.raises(PackFormatError) as caught:
        PackReader(str(pack))
    assert str(caught.value) == "%s: index checksum mismatch (corrupt pack)" % pack
    assert threading.active_count() == threads


def test_a_failed_read_leaves_no_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index_module, "READ_PIECE", 4096)
    pack = copy_pack(GOLDEN, tmp_path / "pack.fan")
    calls = []

    def failing_preadv(fd: int, buffers: list[memoryview], offset: int) -> int:
        calls.append(offset)
        if len(calls) == 3:
            raise OSError(5, "Input/output error")
        view = buffers[0]
        data = (pack / "index").read_bytes()[offset : offset + len(view)]
        view[: len(data)] = data
        return len(data)

    monkeypatch.setattr(index_module.os, "preadv", failing_preadv)
    threads = threading.active_count()
    with pytest.raises(PackFormatError) as caught:
        PackReader(str(pack))
    assert str(caught.value) == "%s: cannot read index: Input/output error" % pack
    assert threading.active_count() == threads


@pytest.mark.parametrize("rows", [1, 2, 7, 1 << 15])
def test_subdir_counts_in_blocks(rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index_module, "_SCAN_ROWS", rows)
    reader = PackReader(str(GOLDEN))
    try:
        arrays = reader.index.arrays
        is_dir = (arrays["mode"] & 0o170000) == 0o040000
        is_dir[0] = False
        expected = np.bincount(arrays["parent"][is_dir], minlength=reader.index.entry_count)
        got = reader.index.subdir_counts()
        assert got.dtype == expected.dtype and np.array_equal(got, expected)
        assert got[0] > 0
    finally:
        reader.close()
