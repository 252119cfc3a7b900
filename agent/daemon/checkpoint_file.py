"""One checkpoint file, written and read a tensor (or a chunk of one) at a time: never a second copy in memory.

Layout::

    MAGIC      b"POETCKPT2\\n"
    sha256     32 bytes, over everything after it
    length     u64, of the skeleton
    skeleton   what torch.save writes for the state with every tensor replaced by a marker
               ({"__tensor__": k}); its "__tensors__" entry lists each tensor's dtype, shape and offset
    data       each tensor's bytes, row-major, at a 64-byte aligned offset

Writing (:func:`write`) streams every tensor from where it lives: a tensor in
memory is written from its own storage; optimizer state on flash
(:class:`engine.optim.PagedTensor`) is copied in chunk by chunk, a column
block of a streamed weight's state row by row.  The checksum is then taken
over the file as written.  Reading (:func:`read`) checks the checksum by
streaming the file, then returns the state with a :class:`StoredTensor` for
each tensor: ``load()`` reads it into new memory, ``load_into(t)`` into an
existing tensor (a model's parameter: no second copy of the model), and
``read_range`` / ``read_columns`` read a part (a chunk going to a state page).
Files of the first format (``POETCKPT1``: torch.save of the whole state)
still read, with tensors in memory.
"""

from __future__ import annotations

import hashlib
import io
import os
import struct
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import torch

MAGIC = b"POETCKPT2\n"
MAGIC_V1 = b"POETCKPT1\n"
_LENGTH = struct.Struct("<Q")
_ALIGN = 64
_READ = 1 << 20
_MARK = "__tensor__"
_TABLE = "__tensors__"


class ChunkedSource(Protocol):
    """A tensor that is written chunk by chunk (optimizer state on flash)."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    columns: bool

    def chunks(self) -> Any: ...  # yields ((start, end), chunk): flat ranges, or column ranges when ``columns``


class DamagedError(Exception):
    """The file is not a whole checkpoint (the message says how); the caller names the file."""


def write(f: BinaryIO, state: dict[str, Any]) -> None:
    """Write ``state`` (nested dicts and lists of tensors, chunked sources and plain values) to ``f``."""
    tensors: list[Any] = []
    skeleton = _mark(state, tensors)
    table, offset = [], 0
    for t in tensors:
        offset = -(-offset // _ALIGN) * _ALIGN
        table.append({"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "offset": offset})
        offset += _nbytes(t)
    skeleton[_TABLE] = table
    buffer = io.BytesIO()
    torch.save(skeleton, buffer)
    head = buffer.getvalue()
    f.write(MAGIC + bytes(32) + _LENGTH.pack(len(head)) + head)
    data_start = f.tell()
    for t, entry in zip(tensors, table):
        at = data_start + entry["offset"]
        if isinstance(t, torch.Tensor):
            f.seek(at)
            _write_tensor(f, t)
        else:
            _write_chunks(f, at, t)
    digest = _digest(f, len(MAGIC) + 32)
    f.seek(len(MAGIC))
    f.write(digest)


def read(path: Path) -> dict[str, Any]:
    """The state in ``path``: tensors as :class:`StoredTensor` (format 2) or in memory (format 1).

    Raises :class:`DamagedError` for a file that is not a whole checkpoint, and ``OSError`` when it cannot be
    read at all.
    """
    with open(path, "rb") as f:
        magic = f.read(len(MAGIC))
        if magic == MAGIC_V1:
            return _read_v1(f)
        if magic != MAGIC:
            raise DamagedError("not a checkpoint (bad header)")
        written = f.read(32)
        if len(written) != 32 or _digest(f, len(MAGIC) + 32) != written:
            raise DamagedError("damaged (checksum does not match)")
        f.seek(len(MAGIC) + 32)
        (length,) = _LENGTH.unpack(f.read(_LENGTH.size))
        try:
            skeleton = torch.load(io.BytesIO(f.read(length)), weights_only=True)
        except Exception as exc:  # noqa: BLE001 - any unpickling failure means an unusable file
            raise DamagedError(f"cannot be loaded: {exc}") from exc
        data_start = f.tell()
    if not isinstance(skeleton, dict) or not isinstance(skeleton.get(_TABLE), list):
        raise DamagedError("holds no checkpoint state")
    stored = [StoredTensor(path, data_start + e["offset"], getattr(torch, e["dtype"]), tuple(e["shape"]))
              for e in skeleton.pop(_TABLE)]
    return _unmark(skeleton, stored)


class StoredTensor:
    """A tensor in a checkpoint file, read when asked: whole, into a tensor, or a part."""

    def __init__(self, path: Path, offset: int, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
        self.path, self.offset, self.dtype, self.shape = path, offset, dtype, shape
        self.itemsize = torch.empty(0, dtype=dtype).element_size()

    @property
    def nbytes(self) -> int:
        return _count(self.shape) * self.itemsize

    def load(self) -> torch.Tensor:
        """The tensor, read into new memory."""
        out = torch.empty(self.shape, dtype=self.dtype)
        self._read_into(out, self.offset)
        return out

    def load_into(self, target: torch.Tensor) -> None:
        """Read the tensor straight into ``target`` (same shape and dtype, contiguous), with no copy beside."""
        if tuple(target.shape) != self.shape or target.dtype != self.dtype:
            raise ValueError(f"stored tensor of {self.shape} {self.dtype} does not fit {tuple(target.shape)} "
                             f"{target.dtype}")
        if not target.is_contiguous():
            target.copy_(self.load())
            return
        self._read_into(target, self.offset)

    def read_range(self, start: int, end: int) -> torch.Tensor:
        """Flat elements ``start..end`` as a tensor of their own."""
        out = torch.empty(end - start, dtype=self.dtype)
        self._read_into(out, self.offset + start * self.itemsize)
        return out

    def read_columns(self, start: int, end: int) -> torch.Tensor:
        """Columns ``start..end`` of a 2-D tensor, as a contiguous ``rows x (end - start)`` tensor."""
        rows, cols = self.shape
        out = torch.empty((rows, end - start), dtype=self.dtype)
        raw = _bytes_of(out)
        width = (end - start) * self.itemsize
        with open(self.path, "rb", buffering=0) as f:
            fd = f.fileno()
            for r in range(rows):
                at = self.offset + (r * cols + start) * self.itemsize
                _read_exactly(fd, raw[r * width:(r + 1) * width], at)
        return out

    def _read_into(self, target: torch.Tensor, at: int) -> None:
        with open(self.path, "rb", buffering=0) as f:
            view = _bytes_of(target)
            done = 0
            while done < len(view):
                got = os.preadv(f.fileno(), [view[done:done + (64 << 20)]], at + done)
                if got <= 0:
                    raise DamagedError("truncated tensor data")
                done += got


def _mark(value: Any, tensors: list[Any]) -> Any:
    """``value`` with every tensor (or chunked source) replaced by a marker, the tensors listed in order."""
    if isinstance(value, torch.Tensor) or hasattr(value, "chunks"):
        tensors.append(value)
        return {_MARK: len(tensors) - 1}
    if isinstance(value, dict):
        return {k: _mark(v, tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_mark(v, tensors) for v in value)
    return value


def _unmark(value: Any, stored: list[StoredTensor]) -> Any:
    if isinstance(value, dict):
        if set(value) == {_MARK}:
            return stored[value[_MARK]]
        return {k: _unmark(v, stored) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_unmark(v, stored) for v in value)
    return value


def _write_tensor(f: BinaryIO, t: torch.Tensor) -> None:
    t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()  # rare (a strided view): one copy of this tensor alone
    f.write(_bytes_of(t))


def _write_chunks(f: BinaryIO, at: int, source: ChunkedSource) -> None:
    """Each chunk at its place in the row-major layout (a column block: row by row)."""
    itemsize = torch.empty(0, dtype=source.dtype).element_size()
    for (start, end), chunk in source.chunks():
        raw = _bytes_of(chunk)
        if not source.columns:
            f.seek(at + start * itemsize)
            f.write(raw)
            continue
        rows, cols = source.shape
        width = (end - start) * itemsize
        for r in range(rows):
            f.seek(at + (r * cols + start) * itemsize)
            f.write(raw[r * width:(r + 1) * width])


def _digest(f: BinaryIO, start: int) -> bytes:
    """SHA-256 of ``f`` from ``start`` to its end, read a megabyte at a time."""
    f.flush()
    f.seek(start)
    h = hashlib.sha256()
    while block := f.read(_READ):
        h.update(block)
    return h.digest()


def _read_v1(f: BinaryIO) -> dict[str, Any]:
    written = f.read(32)
    body = f.read()
    if len(written) != 32 or hashlib.sha256(body).digest() != written:
        raise DamagedError("damaged (checksum does not match)")
    try:
        state = torch.load(io.BytesIO(body), weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means an unusable file
        raise DamagedError(f"cannot be loaded: {exc}") from exc
    if not isinstance(state, dict):
        raise DamagedError(f"holds {type(state).__name__}, not a checkpoint")
    return state


def _bytes_of(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, without a copy."""
    if t.numel() == 0:
        return memoryview(b"")
    return memoryview(t.view(torch.uint8).numpy()).cast("B") if t.dim() else \
        memoryview(t.reshape(1).view(torch.uint8).numpy()).cast("B")


def _read_exactly(fd: int, view: memoryview, at: int) -> None:
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], at + done)
        if got <= 0:
            raise DamagedError("truncated tensor data")
        done += got


def _nbytes(t: Any) -> int:
    if isinstance(t, torch.Tensor):
        return t.nbytes
    return _count(t.shape) * torch.empty(0, dtype=t.dtype).element_size()


def _count(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
