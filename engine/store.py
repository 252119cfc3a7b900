"""The value store: which node owns which tensor storage, and what autograd keeps instead.

Every tensor of a training step that outlives the instruction computing it is
owned by exactly one graph node: a forward node owns its outputs and the
tensors its backward needs (captured with ``saved_tensors_hooks``), a backward
node owns the gradients of its unit's inputs.  The pack hook replaces each saved
tensor by a :class:`Handle` -- owner, storage slot, dtype and geometry -- and
the unpack hook rebuilds the tensor from whatever storage the owner holds *at
that moment*: the original, a recomputed copy or one read back from flash.  So
autograd never holds activation memory itself, and:

* dropping a node's storages really returns their memory (nothing else refers
  to them), which is what makes the ledger an honest account;
* a value can be freed and recomputed, or paged out and back in, under a graph
  that was built before, since handles name slots, not tensors;
* parameters and buffers are referenced, never copied or counted (they are the
  graph's fixed bytes), and a tensor owned by another node is referenced, not
  counted twice -- the reference is recorded, because that node must then be
  resident when this node's backward runs.

Storages are deduplicated by data pointer: a ReLU's output that the next conv
also saves is one slot.

A forward value's slots are of two kinds: its outputs, and what its own
backward saved (``saved_slots``).  When the backward reads none of the outputs
and saves little of its own (a convolution, a BatchNorm, a linear layer: they
save their *input*, which another node owns), the value can be released with
its saved slots *kept* (:meth:`Store.release`, ``keep_slots``): the outputs'
memory returns, and the backward still runs on the graph and the few bytes
kept (:attr:`Store.kept_bytes`, outside :attr:`Store.resident_bytes`).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import torch
from torch.autograd.graph import GradientEdge

from engine.errors import ExecutorError
from engine.segments import Port


@dataclass(frozen=True)
class Handle:
    """A tensor seen through a node's storage slot: what autograd and the store keep instead of it."""

    node: int
    slot: int
    dtype: torch.dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    requires_grad: bool = False


@dataclass
class Value:
    """One node's value.

    ``storages`` is empty while the value is not resident; everything else is its
    *skeleton*, kept across a page-out so a page-in can restore the value under
    the same autograd graph: slot sizes, output handles (input and forward
    nodes), autograd edges of the outputs and of the boundaries its inputs
    entered through (forward nodes), gradient handles by port (backward nodes).
    """

    node: int
    storages: list[torch.UntypedStorage] = field(default_factory=list)
    slot_bytes: list[int] = field(default_factory=list)
    outputs: list[Handle | torch.Tensor] = field(default_factory=list)
    roots: list[GradientEdge | None] = field(default_factory=list)
    entries: dict[Port, GradientEdge] = field(default_factory=dict)
    grads: dict[Port, Handle] = field(default_factory=dict)
    refs: set[int] = field(default_factory=set)
    resident: bool = True
    saved_slots: set[int] = field(default_factory=set)  # own slots autograd saved (forward nodes)
    kept: dict[int, torch.UntypedStorage] | None = None  # after a release for backward: the saved slots kept

    @property
    def nbytes(self) -> int:
        """Bytes this value holds in RAM when resident."""
        return sum(self.slot_bytes)


class Store:
    """All node values of a step, the owner of every storage, and the saved-tensor hooks."""

    def __init__(self) -> None:
        self.values: dict[int, Value] = {}
        self._owner: dict[int, tuple[int, int]] = {}   # storage data_ptr -> (node, slot)
        self._fixed: set[int] = set()                   # data_ptrs of parameters, buffers, constants
        self.resident_bytes = 0
        self.kept_bytes = 0                             # saved slots of released values, kept for backward

    def set_fixed(self, tensors: Iterable[torch.Tensor]) -> None:
        """Declare the tensors that live outside the activation budget (parameters, buffers)."""
        self._fixed = {t.untyped_storage().data_ptr() for t in tensors if t.untyped_storage().nbytes()}

    # -- values ------------------------------------------------------------------
    def new(self, node: int) -> Value:
        """Start a fresh, resident, empty value for ``node`` (replacing any skeleton it had)."""
        if node in self.values and self.values[node].resident:
            raise ExecutorError(f"node {node} is already resident; free it before computing it again")
        if node in self.values:
            self._drop_kept(self.values[node])
            _unlink(self.values[node])  # the skeleton a recomputation replaces
        value = Value(node)
        self.values[node] = value
        return value

    def value(self, node: int) -> Value:
        """The resident value of ``node``; an error names the node when it is not in RAM."""
        value = self.values.get(node)
        if value is None or not value.resident:
            raise ExecutorError(
                f"node {node}'s value is needed but not resident: the schedule frees or pages it out too "
                "early (the simulator should have refused it)")
        return value

    def adopt(self, value: Value, tensor: torch.Tensor) -> Handle | torch.Tensor:
        """Make ``tensor`` part of ``value``: a handle to its slot, or the tensor itself if fixed or empty."""
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        if storage.nbytes() == 0 or ptr in self._fixed:
            return tensor
        owner = self._owner.get(ptr)
        if owner is None:
            owner = (value.node, len(value.storages))
            value.storages.append(storage)
            value.slot_bytes.append(storage.nbytes())
            self._owner[ptr] = owner
            self.resident_bytes += storage.nbytes()
        elif owner[0] != value.node:
            value.refs.add(owner[0])
        return Handle(owner[0], owner[1], tensor.dtype, tuple(tensor.shape), tuple(tensor.stride()),
                      tensor.storage_offset(), tensor.requires_grad)

    def owner_of(self, tensor: torch.Tensor) -> int | None:
        """The node owning ``tensor``'s storage, or ``None`` (not owned yet, fixed, or empty)."""
        owner = self._owner.get(tensor.untyped_storage().data_ptr())
        return None if owner is None else owner[0]

    def tensor(self, ref: Handle | torch.Tensor) -> torch.Tensor:
        """The tensor a handle stands for, viewed on its owner's current storage."""
        if isinstance(ref, torch.Tensor):
            return ref
        value = self.values.get(ref.node)
        kept = value.kept.get(ref.slot) if value is not None and value.kept is not None else None
        storage = kept if kept is not None else self.value(ref.node).storages[ref.slot]
        view = torch.empty(0, dtype=ref.dtype, device=storage.device)
        return view.set_(storage, ref.offset, ref.size, ref.stride)

    @contextmanager
    def capturing(self, value: Value) -> Iterator[None]:
        """Saved-tensor hooks that make ``value`` own (or reference) everything autograd saves."""

        def pack(t: torch.Tensor) -> Handle | torch.Tensor:
            ref = self.adopt(value, t)
            if isinstance(ref, Handle) and ref.node == value.node:
                value.saved_slots.add(ref.slot)
            return ref

        def unpack(ref: Handle | torch.Tensor) -> torch.Tensor:
            return self.tensor(ref)

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield

    # -- residency ---------------------------------------------------------------
    def release(self, node: int, keep_skeleton: bool, keep_slots: bool = False) -> int:
        """Drop ``node``'s storages (their memory returns); keep its skeleton for a later page-in.

        With ``keep_slots`` the skeleton stays and so do the storages of the value's saved slots, so that its
        backward can run without the value (see the module docstring); they count in :attr:`kept_bytes`.
        """
        value = self.value(node)
        for storage in value.storages:
            self._owner.pop(storage.data_ptr(), None)
        self.resident_bytes -= value.nbytes
        if keep_slots:  # copies: a paged-in value's slots share one mapping, which a kept view would hold whole
            value.kept = {slot: value.storages[slot].clone() for slot in value.saved_slots}
            self.kept_bytes += sum(s.nbytes() for s in value.kept.values())
        value.storages = []
        value.resident = False
        if not (keep_skeleton or keep_slots):
            _unlink(self.values.pop(node))
        return value.nbytes

    def forget(self, node: int) -> None:
        """Drop what is left of a released ``node``: its skeleton and the slots it kept."""
        value = self.values.pop(node, None)
        if value is not None:
            self._drop_kept(value)
            _unlink(value)

    def _drop_kept(self, value: Value) -> None:
        if value.kept is not None:
            self.kept_bytes -= sum(s.nbytes() for s in value.kept.values())
            value.kept = None

    def install(self, node: int, storages: list[torch.UntypedStorage]) -> None:
        """Make a paged-out value resident again with ``storages`` read back from flash."""
        value = self.values.get(node)
        if value is None or value.resident:
            raise ExecutorError(f"node {node} has no paged-out value to restore")
        if [s.nbytes() for s in storages] != value.slot_bytes:
            raise ExecutorError(f"node {node}: page holds slots of {[s.nbytes() for s in storages]} bytes, "
                                f"the value needs {value.slot_bytes}")
        for slot, storage in enumerate(storages):
            self._owner[storage.data_ptr()] = (node, slot)
        self._drop_kept(value)  # the page holds the saved slots too
        value.storages = list(storages)
        value.resident = True
        self.resident_bytes += value.nbytes

    def clear(self) -> None:
        """Forget every value (end of step, or abort)."""
        for value in self.values.values():
            _unlink(value)
        self.values.clear()
        self._owner.clear()
        self.resident_bytes = 0
        self.kept_bytes = 0


def _unlink(value: Value) -> None:
    """Drop a value's autograd edges as it is forgotten.  Its graph's saved-tensor hooks hold the value (the
    pack closure of :meth:`Store.capturing`) and the value's edges hold the graph: a cycle through C++ nodes
    that Python's collector cannot see, which would keep every recomputed or freed value's graph (its Python
    objects: some 60 KB a step on a small network) for the life of the process."""
    value.roots = []
    value.entries = {}
