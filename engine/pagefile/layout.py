"""Where each byte of a page file lies: the header, the order of the slots, the padding.

Layout (little endian)::

    magic    8 bytes   b"POETPAGE"
    version  u32       3
    slots    u32       number of storages
    crc32c   u32       CRC-32C (Castagnoli) over all data bytes, in file order
    node     u32       graph node id (a page copied under another node's name is refused)
    sizes    u64 x slots, in slot order
    padding  to BLOCK
    data     the slots' bytes, back to back in file order (:func:`file_order`: the slots of whole
             blocks first, then the others), zero-padded to a whole BLOCK

The slots of whole blocks come first so that a direct read can put them straight into their memory,
which holds them back to back in the same order (:class:`engine.pagefile.memory.PageMemory`); only the
others (a BatchNorm's saved statistics: a few hundred bytes) go through the bounce buffer.  CRC-32C
catches every flipped bit and every burst of up to 32 bits.  A page of another format version (the
earlier ones used zlib's CRC-32) is refused as not this node's page.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Sequence

from engine.errors import PageCorruptError

MAGIC = b"POETPAGE"
VERSION = 3
BLOCK = 4096  # O_DIRECT alignment of offsets, lengths and memory (the largest logical block in use)
DATA_ALIGN = BLOCK
HEAD = struct.Struct("<8sIIII")  # magic, version, slots, crc32c, node; the slot sizes follow


def aligned(n: int) -> int:
    """``n`` rounded up to whole blocks."""
    return -(-n // BLOCK) * BLOCK


def data_offset(slots: int) -> int:
    """Where the data starts in a page with ``slots`` storages."""
    return aligned(HEAD.size + 8 * slots)


def file_order(slot_bytes: Sequence[int]) -> list[int]:
    """The slots in the order a page holds their bytes: those of whole blocks first, then the rest."""
    return sorted(range(len(slot_bytes)), key=lambda i: slot_bytes[i] % BLOCK != 0)


def page_size(slot_bytes: Sequence[int]) -> int:
    """Bytes a page with these slot sizes takes on disk (the data is padded to a whole block)."""
    return data_offset(len(slot_bytes)) + aligned(sum(slot_bytes))


def header(node: int, crc: int, slot_bytes: Sequence[int]) -> bytes:
    """The header of ``node``'s page with these slot sizes and data checksum, without its padding."""
    return HEAD.pack(MAGIC, VERSION, len(slot_bytes), crc, node) + struct.pack(f"<{len(slot_bytes)}Q", *slot_bytes)


def check_header(got: int, block: memoryview, path: Path, node: int, slot_bytes: Sequence[int]) -> int:
    """The written CRC in a page's header (``got`` bytes of it read into ``block``), once it says the page is
    ``node``'s, of these slot sizes and this format.

    Raises
    ------
    PageCorruptError
        The header is cut short, or it belongs to another node, another layout or another format version.
    """
    offset = data_offset(len(slot_bytes))
    if got < HEAD.size:
        raise PageCorruptError(f"page {path} for node {node} is truncated (header of {got} bytes)")
    magic, version, slots, crc, owner = HEAD.unpack_from(block)
    sizes = list(struct.unpack_from(f"<{slots}Q", block, HEAD.size)) if got >= offset and slots == len(slot_bytes) \
        else None
    if magic != MAGIC or version != VERSION or owner != node or sizes != list(slot_bytes):
        raise PageCorruptError(f"page {path} is not node {node}'s page (header says node {owner}, "
                               f"{slots} slots, format version {version}, this build reads {VERSION}); "
                               "the step is aborted")
    return crc
