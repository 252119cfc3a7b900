"""Page files, the pager and prefetch planning, without a model."""

from __future__ import annotations

import errno
import gc
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

from engine import pagefile
from engine.errors import PageCorruptError, PageError, SwapSpaceError
from engine.pagefile import OperatingSystem
from engine.pager import HEADER_ALLOWANCE, Pager, remove_stale


class _FullDisk(OperatingSystem):
    """A filesystem that says it has room but cannot allocate it (another writer filled it meanwhile)."""

    def fallocate(self, fd, size):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class _BrokenDisk(OperatingSystem):
    """A disk whose writes fail with EIO."""

    def pwrite(self, fd, data, position):
        raise OSError(errno.EIO, os.strerror(errno.EIO))


def _storages(*sizes: int) -> list[torch.UntypedStorage]:
    return [torch.randint(0, 256, (n,), dtype=torch.uint8).untyped_storage() for n in sizes]


def _same(a: list[torch.UntypedStorage], b: list[torch.UntypedStorage]) -> bool:
    as_tensor = lambda s: torch.empty(0, dtype=torch.uint8).set_(s)  # noqa: E731
    return len(a) == len(b) and all(torch.equal(as_tensor(x), as_tensor(y)) for x, y in zip(a, b))


def test_page_round_trip(tmp_path):
    slots = _storages(10, 0, 5000, 1 << 20)
    path = tmp_path / "p.page"
    assert pagefile.write(path, 7, slots) == sum(s.nbytes() for s in slots)
    assert path.stat().st_size == pagefile.page_size([s.nbytes() for s in slots])
    assert _same(pagefile.read(path, 7, [s.nbytes() for s in slots]), slots)


def test_flipped_byte_is_caught(tmp_path):
    slots = _storages(4096, 300)
    path = tmp_path / "p.page"
    pagefile.write(path, 3, slots)
    with open(path, "r+b") as f:
        f.seek(pagefile.data_offset(2) + 4200)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))
    with pytest.raises(PageCorruptError, match="checksum"):
        pagefile.read(path, 3, [4096, 300])


def test_missing_truncated_and_foreign_pages_are_refused(tmp_path):
    with pytest.raises(PageCorruptError, match="missing"):
        pagefile.read(tmp_path / "none.page", 1, [8])
    path = tmp_path / "p.page"
    pagefile.write(path, 1, _storages(100_000))
    with pytest.raises(PageCorruptError, match="not node 2's page"):
        pagefile.read(path, 2, [100_000])
    os.truncate(path, pagefile.data_offset(1) + 10)
    with pytest.raises(PageCorruptError, match="truncated"):
        pagefile.read(path, 1, [100_000])


def test_a_shorter_page_of_another_value_is_named_foreign_not_truncated(tmp_path):
    """The header is read beside the data; when the data runs out, the header still says whose page it is."""
    path = tmp_path / "p.page"
    pagefile.write(path, 1, _storages(5000))
    with pytest.raises(PageCorruptError, match="not node 2's page .*node 1, 1 slots"):
        pagefile.read(path, 2, [3 << 20, 64])


def test_pager_writes_in_background_and_prefetches(tmp_path):
    pager = Pager(tmp_path)
    slots = _storages(1 << 20, 77)
    pager.reserve({4: sum(s.nbytes() for s in slots)})
    pager.write(4, slots)
    pager.wait_written(4)
    pager.prefetch(4, [1 << 20, 77])
    assert pager.inflight_bytes == (1 << 20) + 77
    assert _same(pager.read(4, [1 << 20, 77]), slots)
    assert pager.inflight_bytes == 0 and pager.bytes_out == pager.bytes_in == (1 << 20) + 77
    pager.close()
    assert not list(tmp_path.iterdir())  # the step's files are gone


def test_reservation_refuses_a_full_disk_with_the_figures(tmp_path):
    pager = Pager(tmp_path, free_space=lambda path: 1_000_000)
    with pytest.raises(SwapSpaceError) as info:
        pager.reserve({1: 800_000, 2: 300_000})
    assert info.value.needed == 1_100_000 + 2 * HEADER_ALLOWANCE and info.value.available == 1_000_000
    assert "1,000,000 bytes free" in str(info.value) and f"{info.value.needed:,}" in str(info.value)
    assert not list(tmp_path.iterdir())
    pager.close()


def test_reservation_allocates_the_files(tmp_path):
    pager = Pager(tmp_path)
    pager.reserve({1: 5_000_000})
    [path] = tmp_path.iterdir()
    assert path.stat().st_blocks * 512 >= 5_000_000  # allocated, not sparse
    pager.close()


@pytest.fixture
def small_filesystem(tmp_path):
    """A 1 MiB tmpfs, where this machine lets us mount one (root); skipped elsewhere."""
    mount = tmp_path / "small"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root); the injected reading covers this")
    yield mount
    subprocess.run(["umount", str(mount)], check=False)


def test_reservation_on_a_real_small_filesystem(small_filesystem):
    pager = Pager(small_filesystem)
    with pytest.raises(SwapSpaceError) as info:
        pager.reserve({1: 2_000_000})
    assert info.value.available <= 1 << 20
    pager.close()


def test_stale_files_of_dead_processes_are_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    stale = tmp_path / f"poet-{dead}-0123abcd-n3.page"
    alive = tmp_path / f"poet-{os.getpid()}-0123abcd-n3.page"
    other = tmp_path / "notes.txt"
    for path in (stale, alive, other):
        path.write_bytes(b"x")
    assert remove_stale(tmp_path) == [stale]
    assert alive.exists() and other.exists()
    Pager(tmp_path).close()  # a new pager cleans up on start too
    assert alive.exists()


def test_files_kept_between_steps_count_as_room_and_go_at_close(tmp_path):
    reading = {"free": 10_000_000}
    pager = Pager(tmp_path, free_space=lambda path: reading["free"])
    pager.reserve({1: 3_000_000, 2: 1_000_000})
    pager.end_step(keep_files=True)
    assert len(list(tmp_path.iterdir())) == 2
    reading["free"] = 0  # the disk filled up between steps: the kept files are still ours
    pager.reserve({1: 3_000_000, 2: 1_000_000})
    with pytest.raises(SwapSpaceError) as info:  # only the growth needs new room
        pager.reserve({1: 3_000_000, 2: 1_500_000})
    assert 0 < info.value.needed <= 500_000
    pager.end_step(keep_files=True)
    pager.close()
    assert not list(tmp_path.iterdir())


def test_a_pager_left_unclosed_removes_its_files_when_collected(tmp_path):
    pager = Pager(tmp_path)
    pager.reserve({1: 100_000})
    pager.end_step(keep_files=True)
    assert list(tmp_path.iterdir())
    del pager
    gc.collect()
    assert not list(tmp_path.iterdir())


def test_a_swap_directory_removed_between_steps_is_made_again(tmp_path):
    """A cleaner of /tmp or /var/tmp may remove it while the agent waits between steps."""
    swap = tmp_path / "swap"
    pager = Pager(swap)
    slots = _storages(5000)
    for _ in range(2):
        pager.reserve({3: 5000})
        pager.write(3, slots)
        pager.wait_written(3)
        assert _same(pager.read(3, [5000]), slots)
        pager.end_step()
        shutil.rmtree(swap)
    pager.close()


def test_a_file_where_the_swap_directory_should_be_is_named(tmp_path):
    (tmp_path / "swap").write_text("not a directory")
    with pytest.raises(PageError, match="is a file, not a directory"):
        Pager(tmp_path / "swap")


def test_a_disk_that_fills_up_during_the_reservation_is_reported_and_leaves_no_files(tmp_path):
    pager = Pager(tmp_path, system=_FullDisk())
    with pytest.raises(SwapSpaceError, match="could not reserve .*No space left on device"):
        pager.reserve({1: 100_000, 2: 5000})
    assert not list(tmp_path.iterdir())
    pager.close()


def test_a_failing_disk_fails_the_page_out_with_the_file_named(tmp_path):
    pager = Pager(tmp_path, system=_BrokenDisk())
    pager.reserve({4: 5000})
    pager.write(4, _storages(5000))
    with pytest.raises(PageError, match=re.escape(f"cannot write page {pager.path(4)}: Input/output error")):
        pager.wait_written(4)
    pager.close()
