"""A caching CPU allocator bounded by the step's budget: freed tensors reused, not faulted back in.

Without it, the engine serves every large tensor from a fresh mapping (:func:`engine.rss.return_freed_memory`),
so that freeing one gives its memory back and the process's RSS follows the step's ledger; every such tensor
is then faulted in and zeroed page by page, which costs a convolutional network's step up to half of plain
PyTorch's time.  Plain PyTorch as users run it keeps freed tensors in glibc's heap instead, at the price of
RSS that no longer follows what is live.

This allocator (``caching.cpp``, registered with ``c10::SetCPUAllocator``) keeps both: large blocks freed by
a step wait on free lists, by size, for the next request they can serve, and the blocks in use plus those
cached never exceed a limit (:meth:`CachingAllocator.set_limit`), past which freed blocks are unmapped
largest first.  :class:`engine.training.Training` sets the limit to what the schedule plans for the step,
so whatever the cache holds is inside the step's budget.  Results are bit-identical with it and without.
A request of a size the cache does not hold takes the head of the smallest cached block large enough (its
tail stays cached; a block freed joins its cached neighbours again).  With no such block and no room under the
limit, cached blocks are moved side by side into one range (``mremap`` moves their page tables: their pages
stay resident, nothing is faulted in or zeroed), and only what the cache lacks is mapped afresh; a request is
not gathered from more than 64 pieces (a fresh mapping is cheaper than that many moves).  resnet18's steps at
half of a plain step's memory: about 30 page faults a step (1,600 in the steps where the piece limit maps part
of a request afresh), where unmapping blocks and mapping them afresh took 11,000 and 60-70 ms of system time.

Blocks of 2 MiB and more are advised to use transparent huge pages (``madvise(MADV_HUGEPAGE)``), one fault
per 2 MiB instead of 512, unless ``POET_EDGE_HUGE_PAGES=off``; they are mapped to start on a 2 MiB boundary
(the kernel aligns only lengths of whole 2 MiB), so that every whole 2 MiB of a block can be a huge page
(resnet18's steps at a whole-step budget: about 1,900 page faults and 4 ms of system time a step, against
3,000 and 11 ms).  A block unmapped while a huge page it shares with a neighbour stays mapped leaves its part
of that page to the kernel's deferred split: out of RSS at once, given back to the system when memory runs
short.  A huge page moved to an address it is not aligned to is split into small pages (resident still).

Small requests go to malloc; the allocator counts the bytes they give back (:meth:`CachingAllocator.heap_freed_bytes`),
so that the executor asks glibc how much of its heap is free (``mallinfo2``, which walks the free lists: 2-6 ms a
step on resnet18) only once enough went back for a trim to be due (:class:`engine.rss.HeapTrimmer`).

The library is compiled from its C++ source against the installed PyTorch's headers (``torch.utils.cpp_extension``
gives their paths) by :func:`build`, which the installer and ``make`` run, and which :func:`load` runs on
first use where a compiler exists.  Where none does, or ``POET_EDGE_ALLOCATOR=off``, :func:`load` returns
``None`` and the engine keeps the fresh-mapping path.

``python -m engine.allocator build`` compiles it (printing where it went); ``python -m engine.allocator
status`` says whether this machine has it.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("caching.cpp")
SWITCH = "POET_EDGE_ALLOCATOR"  # "off": the fresh-mapping path; anything else: the caching allocator
DIRECTORY = "POET_EDGE_ALLOCATOR_DIR"  # where the compiled library goes (default: beside the environment)
POISON = "POET_EDGE_ALLOCATOR_POISON"  # "1": every large block handed out filled with 0xFF (NaN): for tests
HUGE_PAGES = "POET_EDGE_HUGE_PAGES"  # "off": blocks of 2 MiB and more are not advised to use transparent huge pages
LARGE_BYTES = 64 << 10  # requests from this size up are cached (smaller ones go to malloc, as before)
_STATS = ("live_bytes", "cached_bytes", "peak_bytes", "hits", "misses", "released_bytes", "reshaped",
          "moved")


class AllocatorBuildError(RuntimeError):
    """The allocator's C++ source did not compile here (the engine then keeps the fresh-mapping path)."""


@dataclass(frozen=True)
class AllocatorStats:
    """What the allocator holds and has done since it was installed (large blocks only)."""

    live_bytes: int  # in use
    cached_bytes: int  # freed, kept for reuse
    peak_bytes: int  # the most in use plus cached since the last reset
    hits: int  # requests served from the cache
    misses: int  # requests that mapped fresh memory
    released_bytes: int  # unmapped to stay within the limit
    reshaped: int  # requests with no room under the limit served from cached blocks of other sizes
    moved: int  # cached ranges moved into the range of such a request (their pages stay resident)


class CachingAllocator:
    """The installed allocator, driven through its C functions."""

    def __init__(self, library: ctypes.CDLL, path: Path) -> None:
        self._lib = library
        self.path = path

    def set_limit(self, limit_bytes: int) -> None:
        """Hold at most ``limit_bytes`` of large blocks, in use and cached (cached ones go first)."""
        self._lib.poet_allocator_set_limit(ctypes.c_uint64(max(0, int(limit_bytes))))

    @property
    def limit_bytes(self) -> int:
        return int(self._lib.poet_allocator_limit())

    def unlimited(self) -> None:
        """No limit: cache every freed block (outside a budgeted step)."""
        self._lib.poet_allocator_set_limit(ctypes.c_uint64(2 ** 64 - 1))

    def heap_freed_bytes(self) -> int:
        """Bytes of small blocks (below the caching threshold) given back to malloc since install: the most that
        can have become free in glibc's heap through PyTorch."""
        return int(self._lib.poet_allocator_heap_freed())

    def empty_cache(self) -> None:
        """Unmap every cached block."""
        self._lib.poet_allocator_empty_cache()

    def reset_peak(self) -> None:
        self._lib.poet_allocator_reset_peak()

    def stats(self) -> AllocatorStats:
        out = (ctypes.c_uint64 * len(_STATS))()
        self._lib.poet_allocator_stats(out)
        return AllocatorStats(*(int(v) for v in out))


_INSTALLED: CachingAllocator | None = None


def enabled() -> bool:
    """False where ``POET_EDGE_ALLOCATOR=off``."""
    return _switched_on(SWITCH)


def _switched_on(variable: str) -> bool:
    return os.environ.get(variable, "on").strip().lower() not in ("off", "0", "no", "false")


def load(*, build_if_missing: bool = True) -> CachingAllocator | None:
    """Install the caching allocator as PyTorch's CPU allocator (once per process) and return it; ``None`` where
    it is switched off or cannot be built here (logged once), so the caller keeps the fresh-mapping path."""
    global _INSTALLED
    if _INSTALLED is not None:
        return _INSTALLED
    if not enabled():
        return None
    import torch  # noqa: F401  (libc10 must be loaded before the library that links against it)

    path = library_path()
    if not path.exists():
        if not build_if_missing:
            return None
        try:
            build()
        except AllocatorBuildError as exc:
            log.warning("caching allocator unavailable, large tensors are mapped afresh: %s", exc)
            return None
    try:
        library = ctypes.CDLL(str(path))
    except OSError as exc:  # built for another machine (a copied environment), or damaged
        log.warning("caching allocator unavailable, large tensors are mapped afresh: %s (rebuild it with "
                    "`python -m engine.allocator build`)", exc)
        return None
    library.poet_allocator_install.restype = ctypes.c_int
    library.poet_allocator_install.argtypes = [ctypes.c_uint64, ctypes.c_uint64]
    library.poet_allocator_set_limit.argtypes = [ctypes.c_uint64]
    library.poet_allocator_limit.restype = ctypes.c_uint64
    library.poet_allocator_heap_freed.restype = ctypes.c_uint64
    if library.poet_allocator_install(LARGE_BYTES, 2 ** 64 - 1) != 1:
        log.warning("caching allocator not installed: PyTorch kept another CPU allocator of higher priority")
        return None
    library.poet_allocator_set_poison(int(os.environ.get(POISON, "0") not in ("", "0")))
    library.poet_allocator_set_huge_pages(int(_switched_on(HUGE_PAGES)))
    _INSTALLED = CachingAllocator(library, path)
    return _INSTALLED


def installed() -> CachingAllocator | None:
    """The allocator if this process installed it."""
    return _INSTALLED


def for_step(planned_bytes: int) -> CachingAllocator | None:
    """Install the allocator (where it can be) for steps that plan to hold ``planned_bytes`` above what is in use
    now: it then caches freed blocks only while everything it holds stays within that."""
    held = load()
    if held is not None:
        held.set_limit(held.stats().live_bytes + planned_bytes)
    return held


def caching_off() -> None:
    """Cache nothing from now on (where the allocator is installed): extraction measures each node's memory by
    RSS, which must follow the tensors alive, and times nodes as the first step after it runs them."""
    if _INSTALLED is not None:
        _INSTALLED.set_limit(0)


@contextmanager
def caching_everything() -> Iterator[CachingAllocator | None]:
    """Inside, cache every freed block (installing the allocator where it can be); after, unmap them all and
    put the limit back.  Extraction times nodes inside: a training step's large tensors come from the
    allocator's cache, not fresh pages, so its nodes run at that speed (timed on freshly faulted pages,
    resnet18's nodes summed to about 1.5x the executor's step); afterwards the process caches what it cached
    before (nothing, where the allocator was not yet installed), so RSS follows tensors for what is measured
    by it."""
    before = installed()
    held = load()
    if held is None:
        yield None
        return
    limit = before.limit_bytes if before is not None else 0  # not installed before: nothing was cached
    held.unlimited()
    try:
        yield held
    finally:
        held.set_limit(limit)
        held.empty_cache()


def release_cache() -> None:
    """Unmap every cached block (where the allocator is installed): before a baseline RSS is read.  Garbage is
    collected first, so that tensors in dead reference cycles are not freed into the cache a moment later."""
    if _INSTALLED is not None:
        import gc

        gc.collect()
        _INSTALLED.empty_cache()


def library_path() -> Path:
    """Where the library for this source and this PyTorch is (or goes): named by a hash of both."""
    import torch

    key = hashlib.sha256(SOURCE.read_bytes() + torch.__version__.encode()
                         + str(torch._C._GLIBCXX_USE_CXX11_ABI).encode()).hexdigest()[:16]
    return _directory() / f"poet_caching_allocator-{key}.so"


def _directory() -> Path:
    if os.environ.get(DIRECTORY):
        return Path(os.environ[DIRECTORY])
    beside = Path(sys.prefix) / "lib" / "poet-edge"
    if beside.exists() or os.access(beside.parent, os.W_OK):  # built at install, or buildable now
        return beside
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "poet-edge"


def build() -> Path:
    """Compile ``caching.cpp`` against the installed PyTorch; returns the library's path (already there: as is)."""
    import torch
    from torch.utils.cpp_extension import include_paths, library_paths

    path = library_path()
    if path.exists():
        return path
    named = os.environ.get("CXX")
    compiler = shutil.which(named) if named else shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        raise AllocatorBuildError(f"no C++ compiler ({named or 'c++ or g++'} not found): install g++")
    path.parent.mkdir(parents=True, exist_ok=True)
    libs = library_paths()
    with tempfile.TemporaryDirectory(dir=path.parent) as scratch:
        out = Path(scratch) / path.name
        command = [compiler, "-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden",
                   f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
                   *(f"-I{p}" for p in include_paths()), str(SOURCE), "-o", str(out),
                   *(f"-L{p}" for p in libs), *(f"-Wl,-rpath,{p}" for p in libs), "-lc10"]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise AllocatorBuildError(f"{compiler} failed:\n{done.stderr[-2000:]}")
        os.replace(out, path)  # atomic: a concurrent build or load sees the whole library or none
    return path


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m engine.allocator", description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=("build", "status"))
    args = parser.parse_args(argv)
    if args.action == "build":
        try:
            path = build()
        except AllocatorBuildError as exc:
            print(f"caching allocator not built ({exc}); training maps large tensors afresh", file=sys.stderr)
            return 1
        if load(build_if_missing=False) is None:  # built, but not loadable here: a cross compiler's output
            path.unlink(missing_ok=True)
            print("caching allocator built but does not load here; removed", file=sys.stderr)
            return 1
        print(f"caching allocator: {path}")
        return 0
    path = library_path()
    state = "off (POET_EDGE_ALLOCATOR)" if not enabled() else "built" if path.exists() else "not built"
    print(f"caching allocator: {state}: {path}")
    return 0
