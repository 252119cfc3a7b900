"""Page files: a node's value on flash, checksummed, kept out of the page cache.

One module per concern:

* :mod:`engine.pagefile.layout` the on-disk format: header, slot order, padding, what a page's size is.
* :mod:`engine.pagefile.page` reserving, writing and reading one page (O_DIRECT, else buffered).
* :mod:`engine.pagefile.pipeline` the bounce buffer and disk threads that overlap copies and checksums
  with the disk's I/O.
* :mod:`engine.pagefile.memory` the memory a page-in fills (fresh, kept, or a freed value's).
* :mod:`engine.pagefile.system` the system calls all of this makes, behind :class:`SystemCalls`, so a
  caller (or a test) can hand in another filesystem, disk or kernel; :data:`SYSTEM` is the real one.

Checksums are CRC-32C in hardware (the ``crc32c`` package: SSE4.2 / ARMv8 CRC instructions, several
times ``zlib.crc32``, and it releases the GIL).  Why each piece is built as it is, with measurements
from ``benchmarks/paging.py``: docs/benchmarks.md.
"""

from engine.errors import PageCorruptError, PageError
from engine.pagefile.layout import BLOCK, DATA_ALIGN, MAGIC, VERSION, data_offset, file_order, page_size
from engine.pagefile.memory import DonatedMemory, PageMemory
from engine.pagefile.page import read, reserve, write
from engine.pagefile.system import SYSTEM, OperatingSystem, SystemCalls

__all__ = [
    "BLOCK",
    "DATA_ALIGN",
    "MAGIC",
    "VERSION",
    "SYSTEM",
    "DonatedMemory",
    "OperatingSystem",
    "PageCorruptError",
    "PageError",
    "PageMemory",
    "SystemCalls",
    "data_offset",
    "file_order",
    "page_size",
    "read",
    "reserve",
    "write",
]
