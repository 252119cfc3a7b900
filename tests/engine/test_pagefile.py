"""Page files: odd sizes across the chunk pipeline, corruption anywhere, the buffered fallback, a clean page cache.

The filesystems, disks and kernels that misbehave are fakes of :class:`engine.pagefile.SystemCalls` handed to
``write`` and ``read``: each is the real system with one call changed.
"""

from __future__ import annotations

import ctypes
import errno
import gc
import mmap
import os
import struct
import time

import pytest
import torch

from engine import pagefile
from engine.errors import PageCorruptError
from engine.pagefile.memory import populate
from engine.pagefile.pipeline import CHUNK
from engine.pagefile.system import LIBC_MADVISE, MADV_POPULATE_WRITE, O_DIRECT, OperatingSystem


def _storages(*sizes: int) -> list[torch.UntypedStorage]:
    return [torch.randint(0, 256, (n,), dtype=torch.uint8).untyped_storage() for n in sizes]


def _same(a: list[torch.UntypedStorage], b: list[torch.UntypedStorage]) -> bool:
    as_tensor = lambda s: torch.empty(0, dtype=torch.uint8).set_(s)  # noqa: E731
    return len(a) == len(b) and all(torch.equal(as_tensor(x), as_tensor(y)) for x, y in zip(a, b))


class _RecordingDisk(OperatingSystem):
    """The real disk, noting each read: (where in memory it lands, bytes, file position)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[tuple[int, int, int]] = []

    def pread(self, fd, into, position):
        self.reads.append((ctypes.addressof(ctypes.c_char.from_buffer(into)), len(into), position))
        return super().pread(fd, into, position)


class _SlowDisk(OperatingSystem):
    """The real disk, slow to answer reads from ``slow_from`` on, noting when each read ends and the file closes."""

    def __init__(self, slow_from: int) -> None:
        super().__init__()
        self.slow_from = slow_from
        self.events: list[tuple[str, int]] = []

    def pread(self, fd, into, position):
        try:
            if position >= self.slow_from:
                time.sleep(0.05)
            return super().pread(fd, into, position)
        finally:
            self.events.append(("read", position))

    def close(self, fd):
        self.events.append(("close", fd))
        super().close(fd)


class _NoDirectIO(OperatingSystem):
    """A filesystem that refuses O_DIRECT when a file is opened (tmpfs on older kernels, some FUSE filesystems)."""

    def __init__(self) -> None:
        super().__init__()
        self.refused = 0

    def open(self, path, flags, direct):
        if direct:
            self.refused += 1
            raise OSError(errno.EINVAL, "Invalid argument")
        return super().open(path, flags, direct)


class _FailingWrites(OperatingSystem):
    """A disk whose writes fail with ``error``: the first one only, or every one."""

    def __init__(self, error: int, first_only: bool) -> None:
        super().__init__()
        self.error, self.first_only = error, first_only
        self.writes: list[int] = []

    def pwrite(self, fd, data, position):
        self.writes.append(position)
        if len(self.writes) == 1 or not self.first_only:
            raise OSError(self.error, os.strerror(self.error))
        return super().pwrite(fd, data, position)


def _lands_in(address: int, storages: list[torch.UntypedStorage]) -> bool:
    return any(s.data_ptr() <= address < s.data_ptr() + s.nbytes() for s in storages)


def _runs_into(reads: list[tuple[int, int, int]], storages: list[torch.UntypedStorage]) -> list[int]:
    """Bytes read straight into the storages' memory, as runs of reads that lie back to back in it."""
    runs: list[int] = []
    end = None
    for address, length, _ in sorted(reads):
        if _lands_in(address, storages):
            if address == end:
                runs[-1] += length
            else:
                runs.append(length)
            end = address + length
    return runs


def _cached_pages(path) -> int:
    """Pages of ``path`` in the page cache (``mincore`` over a private mapping of the file, never touched)."""
    size = os.path.getsize(path)
    libc = ctypes.CDLL(None, use_errno=True)
    vector = (ctypes.c_ubyte * -(-size // mmap.PAGESIZE))()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as mapping:
        holder = ctypes.c_char.from_buffer(mapping)
        try:
            status = libc.mincore(ctypes.c_void_p(ctypes.addressof(holder)), ctypes.c_size_t(size), vector)
        finally:
            del holder
    assert status == 0, os.strerror(ctypes.get_errno())
    return sum(v & 1 for v in vector)


@pytest.mark.parametrize("sizes", [
    (1,), (4097,), (CHUNK,), (CHUNK + 1,), (0, 0), (0, 5, 0),
    (CHUNK - 3, 7, CHUNK + 4096, 1),  # slots that straddle chunk boundaries
    (3 * CHUNK + 11,),                # several chunks: both halves of the bounce buffer reused
])
def test_odd_sizes_round_trip(tmp_path, sizes):
    slots = _storages(*sizes)
    path = tmp_path / "p.page"
    assert pagefile.write(path, 5, slots) == sum(sizes)
    assert path.stat().st_size == pagefile.page_size(list(sizes))
    assert pagefile.page_size(list(sizes)) % pagefile.BLOCK == 0
    assert _same(pagefile.read(path, 5, list(sizes)), slots)


@pytest.mark.parametrize("sizes, at", [
    *[([CHUNK + 10, CHUNK + 4100], at) for at in (0, CHUNK - 1, CHUNK, 2 * CHUNK + 4100)],  # through the bounce
    # slots of whole blocks are read straight into the storages (in 4 MiB pieces), the others through the bounce
    *[([3 * 4096 + 10, 5 * CHUNK, 4096], at) for at in (0, 4 * CHUNK + 7, 5 * CHUNK + 4095, 5 * CHUNK + 4096 * 4 + 9)],
])
def test_a_flipped_byte_anywhere_is_caught(tmp_path, sizes, at):
    path = tmp_path / "p.page"
    pagefile.write(path, 3, _storages(*sizes))
    with open(path, "r+b") as f:
        f.seek(pagefile.data_offset(2) + at)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))
    with pytest.raises(PageCorruptError, match="checksum"):
        pagefile.read(path, 3, sizes)


def test_an_old_format_page_is_refused_with_its_version(tmp_path):
    path = tmp_path / "p.page"
    pagefile.write(path, 2, _storages(100))
    with open(path, "r+b") as f:
        f.seek(8)
        f.write(struct.pack("<I", 2))
    with pytest.raises(PageCorruptError, match="format version 2, this build reads 3"):
        pagefile.read(path, 2, [100])


def _direct_io_works(directory) -> bool:
    try:
        os.close(os.open(directory / "probe", os.O_WRONLY | os.O_CREAT | O_DIRECT))
        return bool(O_DIRECT)
    except OSError:
        return False


def test_slots_of_whole_blocks_are_read_in_place_wherever_they_sit_and_round_trip(tmp_path):
    if not _direct_io_works(tmp_path):
        pytest.skip("this filesystem refuses O_DIRECT: pages go through the buffered path")
    sizes = (512, 5 * CHUNK, 3 * 4096 + 10, 4096)  # a BatchNorm's statistics before the activation
    slots = _storages(*sizes)
    path = tmp_path / "p.page"
    pagefile.write(path, 4, slots)
    disk = _RecordingDisk()
    got = pagefile.read(path, 4, list(sizes), system=disk)
    assert _same(got, slots)
    assert _runs_into(disk.reads, got) == [5 * CHUNK + 4096]  # the whole-block slots, straight into memory
    bounced = [length for address, length, at in disk.reads if at > 0 and not _lands_in(address, got)]
    assert sum(bounced) == 4 * 4096  # besides the header, only the other slots' 12,810 bytes, in whole blocks
    assert [s.data_ptr() % pagefile.BLOCK for s in got] == [0, 0, 0, 0]
    os.truncate(path, pagefile.data_offset(4) + 2 * CHUNK)
    with pytest.raises(PageCorruptError, match="truncated"):
        pagefile.read(path, 4, list(sizes))


def test_a_truncated_last_chunk_is_refused(tmp_path):
    path = tmp_path / "p.page"
    pagefile.write(path, 1, _storages(CHUNK + 5000))
    os.truncate(path, pagefile.data_offset(1) + CHUNK + 100)
    with pytest.raises(PageCorruptError, match="truncated"):
        pagefile.read(path, 1, [CHUNK + 5000])


def test_a_failed_read_closes_the_page_only_after_its_queued_reads(tmp_path):
    """Reads run several chunks ahead on the disk threads; one failing must not close the file under the others
    (a reused descriptor number would read another file into the storages)."""
    path = tmp_path / "p.page"
    pagefile.write(path, 1, _storages(6 * CHUNK))
    offset = pagefile.data_offset(1)
    os.truncate(path, offset + 2 * CHUNK)
    disk = _SlowDisk(slow_from=offset + 3 * CHUNK)  # still reading those when the chunk at 2 * CHUNK fails
    with pytest.raises(PageCorruptError, match="truncated"):
        pagefile.read(path, 1, [6 * CHUNK], system=disk)
    events = disk.events
    late = [i for i, event in enumerate(events) if event[0] == "read" and event[1] >= offset + 3 * CHUNK]
    assert late, "no chunk was queued behind the failing one"
    assert events[-1][0] == "close" and max(late) < len(events) - 1


@pytest.mark.skipif(not O_DIRECT, reason="no O_DIRECT on this platform: the buffered path is the only one")
def test_a_filesystem_refusing_o_direct_gets_the_buffered_path(tmp_path):
    filesystem = _NoDirectIO()
    slots = _storages(CHUNK + 4097, 3)
    path = tmp_path / "p.page"
    pagefile.write(path, 9, slots, system=filesystem)
    assert _same(pagefile.read(path, 9, [CHUNK + 4097, 3], system=filesystem), slots)
    assert filesystem.refused == 2  # the write and the read each tried O_DIRECT first
    assert _cached_pages(path) == 0  # fdatasync + DONTNEED kept the page out of RAM


@pytest.mark.skipif(not O_DIRECT, reason="no O_DIRECT on this platform")
def test_o_direct_refused_at_the_first_write_is_retried_buffered(tmp_path):
    disk = _FailingWrites(errno.EINVAL, first_only=True)
    slots = _storages(2 * CHUNK + 1)
    path = tmp_path / "p.page"
    pagefile.write(path, 4, slots, system=disk)
    assert _same(pagefile.read(path, 4, [2 * CHUNK + 1]), slots)
    assert len(disk.writes) > 4  # the whole page was written again


def test_pages_leave_nothing_in_the_page_cache(tmp_path):
    slots = _storages(3 * CHUNK + 123)
    path = tmp_path / "p.page"
    pagefile.reserve(path, pagefile.page_size([3 * CHUNK + 123]))
    pagefile.write(path, 1, slots)
    assert _cached_pages(path) == 0
    pagefile.read(path, 1, [3 * CHUNK + 123])
    assert _cached_pages(path) == 0


def test_other_io_errors_are_not_mistaken_for_a_refusal(tmp_path):
    disk = _FailingWrites(errno.EIO, first_only=False)
    with pytest.raises(pagefile.PageError, match="Input/output error"):
        pagefile.write(tmp_path / "p.page", 1, _storages(10), system=disk)
    assert len(disk.writes) == 1  # not retried buffered


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="RSS needs Linux /proc")
def test_read_back_memory_is_resident_while_held_and_returned_when_dropped(tmp_path):
    from engine import rss

    sizes = [16 << 20, (16 << 20) + 100]  # one mapping for the value, a storage of its own for each slot
    path = tmp_path / "big.page"
    pagefile.write(path, 3, _storages(*sizes))
    gc.collect()  # earlier tests' garbage, freed mid-measurement, would offset the growth measured here
    rss.trim_heap()
    before = rss.current()
    storages = pagefile.read(path, 3, sizes)
    held = rss.current()
    assert [s.nbytes() for s in storages] == sizes
    assert all(s.data_ptr() % pagefile.BLOCK == 0 for s in storages)
    storages[0][0] = 7  # writable, like any tensor memory
    assert held - before >= 0.9 * sum(sizes)  # mapped in when read, not lazily later
    del storages[0]
    assert held - rss.current() < 0.1 * sum(sizes)  # a value is dropped whole: its mapping lives while a slot does
    del storages
    assert held - rss.current() >= 0.9 * sum(sizes)  # and unmapped as soon as the value is dropped


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="RSS needs Linux /proc")
@pytest.mark.parametrize("kernel_refuses", [False, True])
def test_fresh_memory_is_mapped_in_before_a_read_fills_it(kernel_refuses):
    """MADV_POPULATE_WRITE where the kernel has it; where it refuses (before Linux 5.14), a write into each page."""
    from engine import rss

    if LIBC_MADVISE is None and not kernel_refuses:
        pytest.skip("no libc madvise here")
    asked: list[int] = []
    kernel_mapped: list[bool] = []  # whether this kernel's yes mapped the pages (qemu-user's maps nothing)

    def madvise(start: int, length: int, advice: int) -> int:
        asked.append(advice)
        if kernel_refuses:
            return -1
        before = rss.current()
        answer = LIBC_MADVISE(start, length, advice)
        kernel_mapped.append(answer == 0 and rss.current() - before >= 0.9 * length)
        return answer

    kernel = OperatingSystem(madvise=madvise)
    size = 16 << 20
    memory = pagefile.PageMemory([size])
    before = rss.current()
    populate(memory.head(size)[4096:], kernel)
    assert rss.current() - before >= 0.9 * size
    populate(memory.head(size)[:4096], kernel)
    # a refusal, or a yes that mapped nothing: pages are touched from then on, and the kernel is not asked again
    assert asked == [MADV_POPULATE_WRITE] * (2 if kernel_mapped[:1] == [True] else 1)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="RSS needs Linux /proc")
def test_a_kernel_that_says_yes_to_populate_write_and_maps_nothing_is_caught():
    """qemu-user answers MADV_POPULATE_WRITE with 0 and maps nothing in: mincore shows it, and pages are touched."""
    from engine import rss

    asked: list[int] = []

    def ignores_advice(start: int, length: int, advice: int) -> int:
        asked.append(advice)
        return 0

    kernel = OperatingSystem(madvise=ignores_advice)
    size = 16 << 20
    memory = pagefile.PageMemory([size])
    before = rss.current()
    populate(memory.head(size), kernel)
    assert rss.current() - before >= 0.9 * size  # mapped in all the same, by touching each page
    populate(memory.head(size), kernel)
    assert asked == [MADV_POPULATE_WRITE]  # not asked again once caught


class _PageSizeKernel(OperatingSystem):
    """A kernel of another memory page size (arm64's 16 KiB or 64 KiB), which records what populate asks."""

    def __init__(self, page_size: int, answer: int) -> None:
        super().__init__(madvise=self._madvise_call, page_size=page_size)
        self.answer = answer
        self.asked: list[tuple[int, int]] = []

    def _madvise_call(self, start: int, length: int, advice: int) -> int:
        self.asked.append((start, length))
        return self.answer


@pytest.mark.parametrize("page_size", [4096, 16384, 65536])
@pytest.mark.parametrize("answer", [0, -1])  # says yes (and maps nothing: caught), refuses
def test_pages_read_back_exactly_whatever_the_kernels_page_size(tmp_path, page_size, answer):
    sizes = [3 * CHUNK + page_size + 5, page_size - 1, 2 * page_size, 7]  # slots that straddle pages of that size
    slots = _storages(*sizes)
    pagefile.write(tmp_path / "p.page", 1, slots)
    kernel = _PageSizeKernel(page_size, answer)
    assert _same(pagefile.read(tmp_path / "p.page", 1, sizes, system=kernel), slots)
    assert kernel.asked  # the fresh memory was offered to madvise first, in ranges on that size's page boundaries
    assert all(start % page_size == 0 for start, _ in kernel.asked)
    assert _same(pagefile.read(tmp_path / "p.page", 1, sizes, system=kernel), slots)  # and again, with pages touched
    assert len(kernel.asked) == 1


def test_a_page_reads_back_on_a_kernel_without_populate_write(tmp_path):
    slots = _storages(3 * CHUNK, 4096 + 7)
    pagefile.write(tmp_path / "p.page", 1, slots)
    kernel = OperatingSystem(madvise=lambda start, length, advice: -1)
    assert _same(pagefile.read(tmp_path / "p.page", 1, [3 * CHUNK, 4096 + 7], system=kernel), slots)


@pytest.mark.parametrize("sizes", [(5 * 4096, 3 * 4096 + 10), (CHUNK + 10, 7)])  # in place, and through the bounce
def test_a_page_read_into_kept_memory_lands_in_it_with_the_right_bytes(tmp_path, sizes):
    first, second = _storages(*sizes), _storages(*sizes)
    pagefile.write(tmp_path / "a.page", 1, first)
    pagefile.write(tmp_path / "b.page", 2, second)
    memory = pagefile.PageMemory(sizes)
    got = pagefile.read(tmp_path / "a.page", 1, list(sizes), memory)
    assert _same(got, first) and memory.mapped
    start = got[0].data_ptr()
    del got
    again = pagefile.read(tmp_path / "b.page", 2, list(sizes), memory)
    assert _same(again, second)
    assert again[0].data_ptr() == start  # the same memory, not a fresh mapping


def test_kept_memory_a_storage_still_uses_is_never_read_into(tmp_path):
    sizes = (2 * 4096, 4096)
    first, second = _storages(*sizes), _storages(*sizes)
    pagefile.write(tmp_path / "a.page", 1, first)
    pagefile.write(tmp_path / "b.page", 2, second)
    memory = pagefile.PageMemory(sizes)
    held = pagefile.read(tmp_path / "a.page", 1, list(sizes), memory)
    view = torch.empty(0, dtype=torch.uint8).set_(held[1])[100:200]  # a view keeps the storage alive
    del held
    assert memory.in_use() and not memory.fits(sizes)
    other = pagefile.read(tmp_path / "b.page", 2, list(sizes), memory)
    assert _same(other, second)
    assert torch.equal(view, torch.empty(0, dtype=torch.uint8).set_(first[1])[100:200])  # left intact
    del view
    assert memory.fits(sizes) and not memory.fits((4096, 4096))  # free again; another layout never fits


@pytest.mark.parametrize("sizes", [(5 * 4096, 3 * 4096 + 10, 0), (CHUNK + 10, 7, 2 * 4096)])
def test_a_page_read_into_a_freed_values_storages_lands_in_them_with_the_right_bytes(tmp_path, sizes):
    page = _storages(*sizes)
    pagefile.write(tmp_path / "a.page", 1, page)
    donated = _storages(*reversed(sizes))  # another value's storages: the same sizes, in another order
    pointers = {s.data_ptr() for s in donated if s.nbytes()}
    memory = pagefile.DonatedMemory(donated)
    del donated  # the free: only the donated memory holds them now
    assert memory.fits(sizes) and not memory.fits((*sizes[:-1], sizes[-1] + 4096))
    got = pagefile.read(tmp_path / "a.page", 1, list(sizes), memory)
    assert _same(got, page)
    assert {s.data_ptr() for s in got if s.nbytes()} == pointers  # filled in place, no fresh memory


def test_a_freed_values_storage_still_referred_to_is_never_read_into(tmp_path):
    sizes = (2 * 4096, 4096)
    page = _storages(*sizes)
    pagefile.write(tmp_path / "a.page", 1, page)
    donated = _storages(*sizes)
    alias = torch.empty(0, dtype=torch.uint8).set_(donated[1])[:100]  # e.g. a parameter's .grad is the same tensor
    before = alias.clone()
    memory = pagefile.DonatedMemory(donated)
    del donated
    assert memory.in_use() and not memory.fits(sizes)
    got = pagefile.read(tmp_path / "a.page", 1, list(sizes), memory)
    assert _same(got, page)
    assert torch.equal(alias, before)  # left intact: the read took fresh memory
    del alias
    assert memory.fits(sizes)


class _RecordingWrites(OperatingSystem):
    """The real disk, noting each write: (where in memory it comes from, bytes, file position)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[int, int, int]] = []

    def pwrite(self, fd, data, position):
        self.writes.append((torch.frombuffer(data, dtype=torch.uint8).data_ptr(), len(data), position))
        return super().pwrite(fd, data, position)


def _aligned_storages(*sizes: int) -> list[torch.UntypedStorage]:
    """Random bytes in storages that start on a page boundary, as the caching allocator's large blocks do."""
    out = []
    for n in sizes:
        tensor = torch.frombuffer(mmap.mmap(-1, n), dtype=torch.uint8) if n else torch.empty(0, dtype=torch.uint8)
        tensor.copy_(torch.randint(0, 256, (n,), dtype=torch.uint8))
        out.append(tensor.untyped_storage())
    return out


def test_slots_of_whole_blocks_on_block_boundaries_are_written_straight_from_their_memory(tmp_path):
    if not _direct_io_works(tmp_path):
        pytest.skip("this filesystem refuses O_DIRECT: pages go through the buffered path")
    sizes = (5 * CHUNK, 3 * 4096 + 10, 3 * 4096, 512)  # a BatchNorm's statistics beside two activations
    slots = _aligned_storages(*sizes)
    path = tmp_path / "p.page"
    disk = _RecordingWrites()
    assert pagefile.write(path, 4, slots, system=disk) == sum(sizes)
    straight = [length for address, length, _ in disk.writes if _lands_in(address, slots)]
    assert sum(straight) == 5 * CHUNK + 3 * 4096  # the whole-block slots: no copy into the bounce buffer
    assert max(straight) <= CHUNK  # in chunks, checksummed while the ones before them are written
    assert _same(pagefile.read(path, 4, list(sizes)), slots)
    # memory off a block boundary (glibc's chunks start 16 bytes in) goes through the bounce buffer instead
    unaligned = _storages(*sizes)
    disk = _RecordingWrites()
    pagefile.write(path, 4, unaligned, system=disk)
    off = [s for s in unaligned if s.nbytes() % 4096 == 0 and s.data_ptr() % 4096]
    assert not [length for address, length, _ in disk.writes if _lands_in(address, off)]
    assert _same(pagefile.read(path, 4, list(sizes)), unaligned)


def test_a_freed_values_storages_on_block_boundaries_are_read_into_in_place(tmp_path):
    if not _direct_io_works(tmp_path):
        pytest.skip("this filesystem refuses O_DIRECT: pages go through the buffered path")
    sizes = (5 * 4096, 3 * 4096 + 10, 2 * CHUNK, 0)
    page = _storages(*sizes)
    pagefile.write(tmp_path / "a.page", 1, page)
    donated = _aligned_storages(*reversed(sizes))
    memory = pagefile.DonatedMemory(donated)
    del donated
    disk = _RecordingDisk()
    got = pagefile.read(tmp_path / "a.page", 1, list(sizes), memory, system=disk)
    assert _same(got, page)
    # the whole-block slots straight into their own storages, the other one through the bounce buffer
    assert sum(_runs_into(disk.reads, got)) == 5 * 4096 + 2 * CHUNK
