"""The memory a page-in fills: fresh or kept :class:`PageMemory`, a freed value's :class:`DonatedMemory`.

Mapping fresh memory in is most of a page-in's CPU (a copy that faults memory in as it first writes
runs below the disk's speed), so a read maps it in ahead of the bytes (:func:`populate`), and memory
already mapped in (kept from an earlier page-in, or donated by a freed value) is reused where the
schedule plans it (:func:`schedules.timeline.plan_io`).  Figures in docs/benchmarks.md.
"""

from __future__ import annotations

import mmap
import sys
from typing import Sequence

import torch

from engine import allocator
from engine.errors import PageError
from engine.pagefile.layout import BLOCK, aligned, file_order
from engine.pagefile.system import SystemCalls


class PageMemory:
    """Anonymous memory a page-in reads into: one mapping, each slot at a page-aligned offset and its own
    storage.  The storages keep the mapping alive; with the last one (and this object) gone it is unmapped.

    A page-in fills memory nobody has touched, and mapping it in is most of its CPU.  Kept past its value's
    life, the same memory takes a later page of the same layout with no page fault (:mod:`schedules.timeline`
    plans where the budget has room for that).  Mapping and unmapping take the process's memory map for
    writing, which every tensor allocation on mmap (:func:`engine.rss.return_freed_memory`) on the computing
    thread needs too, so a value gets one mapping, not one per slot.  Huge pages (``MADV_HUGEPAGE``) map in
    faster on their own but slow the training step around them, so they are not used.
    """

    def __init__(self, slot_bytes: Sequence[int]) -> None:
        self.nbytes = self.layout_bytes(slot_bytes)
        self.mapped = False  # every page of the slots mapped in (by a read that filled them)
        self._map: mmap.mmap | memoryview | None = None
        if self.nbytes >= allocator.LARGE_BYTES and allocator.installed() is not None:
            # a block of the caching allocator: page-aligned, counted in what the step holds, and often one a
            # freed value left mapped in; the memoryview holds it, as the slots' storages hold the memoryview
            self._map = storage_bytes(torch.empty(self.nbytes, dtype=torch.uint8).untyped_storage())
        elif self.nbytes:
            self._map = mmap.mmap(-1, self.nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)

    @staticmethod
    def layout_bytes(slot_bytes: Sequence[int]) -> int:
        """Bytes of memory a page with these slots takes (each slot rounded up to whole blocks)."""
        return sum(aligned(size) for size in slot_bytes)

    def buffers(self, slot_bytes: Sequence[int]) -> list[torch.Tensor]:
        """Byte tensors of the slots, in slot order; they lie back to back in file order at block-aligned
        offsets, so the slots of whole blocks are one range, as in the file."""
        out: list[torch.Tensor] = [torch.empty(0, dtype=torch.uint8)] * len(slot_bytes)
        at = 0
        for slot in file_order(slot_bytes):
            if slot_bytes[slot]:
                out[slot] = torch.frombuffer(self._map, dtype=torch.uint8, count=slot_bytes[slot], offset=at)
            at += aligned(slot_bytes[slot])
        return out

    def head(self, nbytes: int) -> memoryview:
        """The first ``nbytes`` of the memory, where :meth:`buffers` puts the slots of whole blocks."""
        return memoryview(self._map)[:nbytes] if self._map is not None else memoryview(b"")

    def views(self, slot_bytes: Sequence[int]) -> tuple[list[torch.Tensor], list[memoryview], list[memoryview]]:
        """What a read fills: the slots' byte tensors (slot order), the whole-block slots as one range (read
        in place) and the other slots in file order (read through the bounce buffer)."""
        buffers = self.buffers(slot_bytes)
        order = file_order(slot_bytes)
        whole = self.head(sum(slot_bytes[slot] for slot in order if slot_bytes[slot] % BLOCK == 0))
        return buffers, [whole] if len(whole) else [], [byte_view(buffers[slot]) for slot in order
                                                         if slot_bytes[slot] % BLOCK]

    def fits(self, slot_bytes: Sequence[int]) -> bool:
        """Whether a page of these slots can be read here: the same layout size, and nothing of it in use."""
        return self.nbytes == self.layout_bytes(slot_bytes) and not self.in_use()

    def in_use(self) -> bool:
        """Whether a storage of an earlier page still lies here (it holds the mapping through the buffer
        protocol: one reference each)."""
        return self._map is not None and sys.getrefcount(self._map) > 2  # this object's, and the call's argument


class DonatedMemory:
    """The storages of a value just freed, taken over by a later page-in of the same layout
    (:func:`schedules.timeline.plan_io` plans which, where the budget holds them in between).

    Like kept :class:`PageMemory` it is mapped in already, and the free that gave it unmapped nothing.
    The storages lie wherever the allocator put them, not in one range: the slots of whole blocks that start
    on a block boundary (the caching allocator's blocks do) are read straight into their storages, one after
    another; the others through the bounce buffer, one copy into mapped memory, cheaper than mapping fresh
    memory in.  A storage anything else still refers to (a view, a parameter's gradient that is the same
    tensor) is never read into: the read then takes fresh memory.
    """

    mapped = True

    def __init__(self, storages: Sequence[torch.UntypedStorage]) -> None:
        self.storages = list(storages)

    def fits(self, slot_bytes: Sequence[int]) -> bool:
        """Whether a page of these slots can be read here: storages of the same sizes, none in use."""
        return sorted(s.nbytes() for s in self.storages) == sorted(slot_bytes) and not self.in_use()

    def in_use(self) -> bool:
        """Whether anything but this object refers to one of the storages (always, where torch cannot say)."""
        return _USE_COUNT is None or any(_USE_COUNT(s._cdata) > 1 for s in self.storages)

    def views(self, slot_bytes: Sequence[int]) -> tuple[list[torch.Tensor], list[memoryview], list[memoryview]]:
        """As :meth:`PageMemory.views`: the leading slots (in file order) that lie on whole, aligned blocks are
        read in place, each into its own storage; the rest through the bounce buffer."""
        by_size: dict[int, list[torch.UntypedStorage]] = {}
        for storage in self.storages:
            by_size.setdefault(storage.nbytes(), []).append(storage)
        buffers = [torch.empty(0, dtype=torch.uint8).set_(by_size[size].pop()) for size in slot_bytes]
        stream = [byte_view(buffers[slot]) for slot in file_order(slot_bytes)]
        lead = in_place_prefix(stream)
        return buffers, stream[:lead], stream[lead:]


# ``torch._C._storage_Use_Count``: the references to a storage (torch's own CUDA-graph trees use it likewise)
_USE_COUNT = getattr(torch._C, "_storage_Use_Count", None)


def byte_view(buffer: torch.Tensor) -> memoryview:
    """The bytes of a uint8 tensor as a flat memoryview, without a copy."""
    return memoryview(buffer.numpy()).cast("B")


def storage_bytes(storage: torch.UntypedStorage) -> memoryview:
    """The storage's bytes, without a copy.

    Raises
    ------
    PageError
        The storage is not in CPU memory.
    """
    if storage.device.type != "cpu":
        raise PageError(f"paging {storage.device} memory is not supported; page CPU values only")
    if storage.nbytes() == 0:
        return memoryview(b"")
    return byte_view(torch.empty(0, dtype=torch.uint8).set_(storage))


def in_place_prefix(stream: Sequence[memoryview]) -> int:
    """How many of the leading views of ``stream`` (a page's slots in file order) a direct transfer can use as
    they are: whole blocks long and starting on a block boundary (a large block of the caching allocator does;
    one of glibc's mapped chunks starts 16 bytes in, and takes the bounce buffer)."""
    lead = 0
    for view in stream:
        if len(view) and (len(view) % BLOCK or torch.frombuffer(view, dtype=torch.uint8).data_ptr() % BLOCK):
            break
        lead += 1
    return lead


def populate(view: memoryview, system: SystemCalls) -> None:
    """Map in the pages under ``view`` (fresh memory of a :class:`PageMemory`), writable, before a read fills them.

    ``MADV_POPULATE_WRITE`` maps a range in with one call.  It holds the process's memory map for reading
    meanwhile, and every tensor the computing thread allocates or frees on mmap waits for it, so a read
    calls this chunk by chunk (1 MiB) beside its disk reads, holding the map briefly each time; against a
    zero written into each page (a page fault each) that reads faster and slows the training step less.
    Where the kernel cannot, pages are touched one by one (the write is a torch op, so the GIL is free
    meanwhile).
    """
    if not len(view) or view.readonly:
        return
    pages = torch.frombuffer(view, dtype=torch.uint8)
    page_size = system.page_size
    start = pages.data_ptr() - pages.data_ptr() % page_size  # within the mapping: it starts on a page
    if not system.populate(start, pages.data_ptr() + len(view) - start):
        pages[-(pages.data_ptr() % -page_size)::page_size].fill_(0)  # the first byte of each page, from the first whole one
        pages[:1].fill_(0)  # and the page the view starts in
