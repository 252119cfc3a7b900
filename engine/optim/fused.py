"""The optimizer update fused into the backward pass: each gradient applied and freed as soon as it is final.

Plain training holds every parameter's gradient at the end of ``backward()``
and then runs ``optimizer.step()``; for the models a device trains, the
gradients and the optimizer state are most of a step's memory.
:class:`FusedOptimizer` wraps a torch ``SGD``, ``Adam`` or ``AdamW`` (built
with ``foreach=False``) and updates each parameter from a hook that runs
when autograd has accumulated its gradient
(``register_post_accumulate_grad_hook``), once that gradient is final: after
the last backward node that contributes to it (a tied weight gets one
contribution per segment that uses it; the graph's parameter layout says how
many).  The update runs chunk by chunk (:mod:`engine.optim.chunks`) through
PyTorch's own per-tensor code (:mod:`engine.optim.rules`), then the gradient
is freed.  Parameters, optimizer state and the optimizer's ``state_dict()``
are bit for bit those of ``loss.backward(); optimizer.step()``.

Modes (what a final gradient triggers is its parameter's :mod:`engine.optim.modes` class):

* **accumulation** over micro-batches: gradients accumulate in ``.grad``
  through every micro-batch but the last, whose hooks apply them;
* **clipping** by global norm (``clip_grad_norm_(..., foreach=False)``):
  each gradient's norm is taken when it is final and the gradient held;
  :meth:`finish_step` takes the total norm, scales and applies them all;
* **optimizer state on flash** for the parameters the schedule names
  (:class:`~engine.optim.state_pages.StatePages`): read a chunk ahead,
  written behind, a few chunks in RAM at a time; such an update runs in the
  background (:mod:`engine.optim.background`) beside the next backward node's
  computation, which the executor brackets with :meth:`computing` /
  :meth:`computed`;
* **embedding tables updated by rows** (``tables``, :mod:`engine.optim.rows`):
  with their state on flash, the rows a step does not look up are updated
  in the background from the lookup on, the looked-up ones at the end.

One step: :meth:`begin_step`, one :meth:`begin_micro_batch` per
micro-batch (the backward pass runs in between, wherever it runs: plain
``loss.backward()`` or the executor), then :meth:`finish_step`.  Once any
parameter is updated the step cannot be undone (:attr:`started`): a failure
after that leaves the model between two steps, to be restored from a
checkpoint.  ``live_grad_bytes`` / ``peak_grad_bytes`` account the gradient
memory the step holds (what the agent checks as the ``gradients`` part).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

import torch

from engine.errors import OptimizerError
from engine.optim.background import END, UpdateWorker
from engine.optim.chunks import Chunking
from engine.optim.modes import HoldForClipping, UpdateMode, mode_for
from engine.optim.rows import RowTable, row_chunking, row_updatable
from engine.optim.rules import UpdateRule, rule_for
from engine.optim.state_pages import StatePages
from schedules.step_memory import READ_AHEAD_CHUNKS


@dataclass(frozen=True)
class Clip:
    """Clip gradients by their global norm before the update, as ``clip_grad_norm_(foreach=False)`` does."""

    max_norm: float
    norm_type: float = 2.0


@dataclass(eq=False)
class _Slot:
    """One trained parameter and where its update stands this step."""

    index: int
    name: str
    param: torch.Tensor
    rule: UpdateRule
    contributions: int
    chunking: Chunking
    paged: bool
    streamed: bool
    seen: int = 0  # contributions accumulated this micro-batch
    holding: bool = False  # its gradient is counted in live_grad_bytes
    done: bool = False  # updated this step
    norm: torch.Tensor | None = None  # its gradient's norm (clipping)
    fresh: tuple[str, ...] = ()  # state tensors this update makes (its first): every chunk starts from none
    slot_bytes: list[list[int]] = field(default_factory=list)  # per chunk: the state page's slot sizes
    table: RowTable | None = None  # an embedding table updated by rows
    mode: UpdateMode | None = None  # what its final gradient triggers (engine.optim.modes)


class FusedOptimizer:
    """``optimizer``'s updates run inside the backward pass; see the module docstring.

    Parameters
    ----------
    optimizer:
        A torch ``SGD``, ``Adam`` or ``AdamW`` with ``foreach=False`` over the trained parameters.
    parameters:
        ``(name, parameter, contributions, streamed)`` for every trained parameter, in the order of the
        graph's parameter layout (and of ``model.parameters()``): ``contributions`` backward nodes add to its
        gradient per micro-batch; a ``streamed`` weight's gradient arrives in column blocks
        (:mod:`engine.optim.streamed`).
    chunk_bytes:
        Bytes of a parameter updated at once.
    accumulation:
        Micro-batches per step.
    clip:
        Clip by global norm, or ``None``.
    paged:
        Indices into ``parameters`` whose optimizer state lives in ``pages``.
    pages:
        Where paged state lives (needed with ``paged``).
    background:
        Run updates of state on flash on a thread of their own (with updates in the backward pass, neither
        accumulating nor clipping).
    tables:
        Indices into ``parameters`` of embedding tables whose state is on flash, updated by rows
        (:mod:`engine.optim.rows`), each with the ``nn.Embedding`` that looks it up.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, parameters: Sequence[tuple[str, torch.Tensor, int, bool]],
                 *, chunk_bytes: int, accumulation: int = 1, clip: Clip | None = None,
                 paged: Sequence[int] = (), pages: StatePages | None = None, background: bool = True,
                 tables: Mapping[int, torch.nn.Module] | None = None) -> None:
        if accumulation < 1:
            raise OptimizerError(f"accumulation must be at least 1 micro-batch, got {accumulation}")
        if paged and pages is None:
            raise OptimizerError("optimizer state on flash needs StatePages")
        self.optimizer = optimizer
        self.accumulation = accumulation
        self.clip = clip
        self.pages = pages
        tables = dict(tables or {})
        in_backward = accumulation == 1 and clip is None  # each update runs as its gradient is final
        self.slots = _slots(optimizer, parameters, chunk_bytes, set(paged), tables,
                            may_stream=in_backward, by_rows=in_backward and background)
        self._by_param = {id(s.param): s for s in self.slots}
        self._by_data = {s.param.data_ptr(): s for s in self.slots}  # autograd may hand back another tensor object
        self._ahead = _ReadAhead.first_guess(self)
        self._hooks = self._attach(tables)
        self._worker = UpdateWorker() if background and in_backward and any(s.paged for s in self.slots) else None
        self._choose_modes(clip)
        self._stepping = False  # between begin_step and the step's end: lookups start updates
        self._last_micro = True
        self.updates = 0  # parameters updated this step
        self.live_grad_bytes = 0
        self.peak_grad_bytes = 0
        self._lock = threading.Lock()
        self._node: int | None = None  # the backward node computing (tags background updates)
        self._submitted = 0
        if pages is not None:
            pages.reserve(self._page_slots())

    def _attach(self, tables: Mapping[int, torch.nn.Module]) -> list[Any]:
        """Hooks: every parameter's final gradient, and every lookup of a table updated by rows."""
        hooks = [s.param.register_post_accumulate_grad_hook(self._on_gradient) for s in self.slots]
        for index, module in tables.items():
            slot = self.slots[index]
            slot.table = RowTable(slot.param, slot.chunking)
            hooks.append(module.register_forward_pre_hook(
                lambda _module, args, slot=slot: self._looked_up(slot, args[0])))
        return hooks

    def _page_slots(self) -> dict[tuple[int, int], list[int]]:
        """Every chunk of state on flash, by ``(parameter, chunk)``: the sizes of its state tensors."""
        return {(s.index, k): sizes for s in self.slots if s.paged for k, sizes in enumerate(s.slot_bytes)}

    def _choose_modes(self, clip: Clip | None) -> None:
        """Each parameter's mode (:mod:`engine.optim.modes`); clipping is one for the whole step."""
        clipping = HoldForClipping(clip) if clip is not None else None
        for s in self.slots:
            s.mode = mode_for(s, clipping, background=self._worker is not None)

    # -- a step ----------------------------------------------------------------------
    @property
    def started(self) -> bool:
        """True once a parameter was updated (or handed to the background) this step: it cannot be rolled back."""
        return self.updates > 0 or self._submitted > 0

    def computing(self, node: int) -> None:
        """Backward node ``node`` starts computing: updates it makes final are its."""
        self._node = node

    def computed(self, node: int) -> None:
        """Backward node ``node`` is computed: the background updates due by now must be done."""
        self._node = None
        if self._worker is not None:
            self._worker.wait_for(node)

    def settle(self) -> None:
        """After a failed step: wait for background updates to stop (their errors are the step's, already)."""
        if self._worker is not None:
            self._worker.settle()

    @property
    def streamed_weights(self) -> set[int]:
        """``id`` of every weight whose gradient arrives in column blocks (:mod:`engine.optim.streamed`)."""
        return {id(s.param) for s in self.slots if s.streamed}

    def chunking_of(self, weight: torch.Tensor) -> Chunking:
        """How ``weight``'s update is cut (a streamed weight's gradient is made in the same blocks)."""
        return self._slot_of(weight).chunking

    def _slot_of(self, param: torch.Tensor) -> _Slot:
        slot = self._by_param.get(id(param))
        return slot if slot is not None else self._by_data[param.data_ptr()]

    def begin_step(self) -> None:
        """Before the first micro-batch: no gradients may be held from before."""
        held = [s.name for s in self.slots if s.param.grad is not None]
        if held:
            raise OptimizerError(f"parameters {held[:3]} hold gradients from before the step; updates in the "
                                 "backward pass start from none (zero_grad(set_to_none=True))")
        for s in self.slots:
            s.seen, s.done, s.norm, s.holding = 0, False, None, False
            if s.table is not None:
                s.table.end_step()
        self.updates = self.live_grad_bytes = self.peak_grad_bytes = self._submitted = 0
        self._node = None
        self._stepping = True
        self._ahead.start()

    def begin_micro_batch(self, last: bool) -> None:
        """Before each micro-batch's backward pass; ``last`` for the one whose gradients are applied."""
        self._last_micro = last
        for s in self.slots:
            s.seen = 0

    def finish_step(self) -> None:
        """After the last micro-batch: clip and apply held gradients; apply any a skipped branch left final."""
        self._stepping = False
        if self._worker is not None:
            self._worker.drain()
        unfinished = [s.name for s in self.slots if s.table is not None and s.table.looked_up is not None]
        if unfinished:  # its other rows are updated already: plain PyTorch would have left the table alone
            raise OptimizerError(f"embedding table {unfinished[0]!r} was looked up but got no gradient this step; "
                                 "its update by rows assumes every lookup reaches the loss: profile the model again")
        # held for clipping, or a parameter some contribution did not reach this step (a branch not taken)
        pending: dict[int, tuple[UpdateMode, list[_Slot]]] = {}
        for s in self.slots:
            if not s.done and s.param.grad is not None:
                pending.setdefault(id(s.mode), (s.mode, []))[1].append(s)
        for mode, slots in pending.values():
            mode.finish(self, slots)
        self._ahead.finish()

    def discard_step(self) -> None:
        """A step that will not be applied (cancelled or failed before any update): drop its gradients."""
        if self.started:
            raise OptimizerError("this step already updated parameters; it cannot be discarded")
        self._stepping = False
        for s in self.slots:
            s.param.grad = None
            s.seen, s.done, s.norm, s.holding = 0, False, None, False
            if s.table is not None:
                s.table.end_step()
        self.live_grad_bytes = 0
        if self.pages is not None:
            self.pages.drop_reads()
        self._ahead.start()

    def close(self) -> None:
        """Remove the hooks and stop the background thread; paged state stays in ``pages`` until they are closed."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        if self._worker is not None:
            self._worker.close()
            self._worker = None

    # -- gradients arriving ----------------------------------------------------------
    def _on_gradient(self, param: torch.Tensor) -> None:
        slot = self._by_param[id(param)]
        if param.grad is None:  # a streamed weight: its blocks were applied as they were made
            return
        slot.seen += 1
        if not slot.holding:
            slot.holding = True
            self._count(param.grad.nbytes)
        if slot.seen < slot.contributions or not self._last_micro:
            return  # more contributions come, or more micro-batches
        slot.mode.final(self, slot)

    def weight_gradient(self, weight: torch.Tensor, grad_out: torch.Tensor, inputs: torch.Tensor) -> None:
        """Apply a streamed weight's gradient, ``grad_out.t() @ inputs``, a column block at a time
        (:mod:`engine.optim.streamed`).  With its state on flash the blocks are made and applied in the
        background, the gradient kept as its two small factors until the step ends; otherwise here."""
        slot = self._slot_of(weight)
        if slot.paged and self._worker is not None:
            grad_out, inputs = grad_out.detach().clone(), inputs.detach().clone()
            self._count(grad_out.nbytes + inputs.nbytes)
            self._submitted += 1
            for k in range(len(slot.chunking)):
                self._worker.submit(END, self._made_block, slot, k, grad_out, inputs)
            return
        for k in range(len(slot.chunking)):
            self._made_block(slot, k, grad_out, inputs)

    def _made_block(self, slot: _Slot, block: int, grad_out: torch.Tensor, inputs: torch.Tensor) -> None:
        """Make column block ``block`` of the weight's gradient and apply it (the same product ``F.linear``'s
        backward computes whole: :mod:`engine.optim.streamed`)."""
        start, end = slot.chunking.bounds[block]
        with torch.no_grad():
            grad = grad_out.t().mm(inputs[:, start:end])
        self._count(grad.nbytes)
        try:
            if block == 0:
                self._begin_update(slot)
            with torch.no_grad():
                self._update_chunk(slot, block, grad)
        finally:
            self._count(-grad.nbytes)
        if block == len(slot.chunking) - 1:
            if slot.paged and self._worker is not None:
                self._count(-(grad_out.nbytes + inputs.nbytes))
            self._finished(slot)

    # -- tables updated by rows (engine.optim.rows) -------------------------------------
    def _looked_up(self, slot: _Slot, ids: torch.Tensor) -> None:
        """The table is looked up: the first time in a step, its pass over the rows not looked up starts."""
        table = slot.table
        if not self._stepping or table.looked_up is not None or not table.look_up(ids):
            return  # outside a step (evaluation), a recomputed lookup, or ids the lookup itself will refuse
        self._begin_update(slot)
        self._submitted += 1
        for k in range(len(slot.chunking)):
            self._worker.submit(END, self._pass_rows, slot, k)

    def _pass_rows(self, slot: _Slot, k: int) -> None:
        self._ahead.updating(slot, k)
        made = slot.table.pass_chunk(k, slot.rule, self.optimizer.state[slot.param], self._read(slot, k))
        self.pages.write((slot.index, k), [t.untyped_storage() for t in made])

    def _apply_rows(self, slot: _Slot) -> None:
        slot.table.update_looked_up(slot.rule, self.optimizer.state[slot.param], slot.param.grad)
        self._release_gradient(slot)

    # -- updates ----------------------------------------------------------------------
    def _apply(self, slot: _Slot, coefficient: torch.Tensor | None = None) -> None:
        grad = slot.param.grad
        self._begin_update(slot)
        with torch.no_grad():
            for k in range(len(slot.chunking)):
                chunk = slot.chunking.view(grad, k)
                if coefficient is not None:
                    chunk.mul_(coefficient)  # clip_grad_norm_'s in-place scaling, a chunk at a time
                self._update_chunk(slot, k, chunk)
        self._release_gradient(slot)

    def _release_gradient(self, slot: _Slot) -> None:
        """The parameter's update is done: its gradient goes, and with it the bytes it held."""
        self._count(-slot.param.grad.nbytes)
        slot.param.grad = None
        slot.holding = False
        self._finished(slot)

    def _begin_update(self, slot: _Slot) -> None:
        """Before a parameter's chunks: its step counted, room made for state it does not have yet."""
        if not (slot.rule.state_names or slot.rule.kind == "adam"):
            return  # plain SGD keeps no state, and PyTorch then keeps no entry for the parameter
        state = self.optimizer.state[slot.param]
        slot.rule.begin(state, slot.param)
        if slot.paged:
            return
        slot.fresh = tuple(name for name in slot.rule.state_names if name not in state)
        for name in slot.fresh:  # filled chunk by chunk below, every element once
            state[name] = torch.empty_like(slot.param, memory_format=torch.preserve_format)

    def _update_chunk(self, slot: _Slot, k: int, grad: torch.Tensor) -> None:
        state = self.optimizer.state[slot.param] if slot.rule.state_names or slot.rule.kind == "adam" else {}
        view = slot.chunking.view(slot.param, k)
        if slot.paged:
            self._ahead.updating(slot, k)
            tensors = self._read(slot, k)
            made = slot.rule.update(state, view, grad, tensors)
            self.pages.write((slot.index, k), [t.untyped_storage() for t in made])
            return
        tensors = [None if name in slot.fresh else slot.chunking.view(state[name], k) for name in slot.rule.state_names]
        made = slot.rule.update(state, view, grad, tensors)
        for name, new in zip(slot.rule.state_names, made):
            if name in slot.fresh:  # made for this chunk as PyTorch makes the whole tensor: same values
                slot.chunking.view(state[name], k).copy_(new)

    def _finished(self, slot: _Slot) -> None:
        slot.done = True
        slot.fresh = ()
        self.updates += 1

    def _read(self, slot: _Slot, k: int) -> list[torch.Tensor | None]:
        storages = self.pages.read((slot.index, k), slot.slot_bytes[k])
        if storages is None:
            return [None] * len(slot.rule.state_names)
        shape = slot.chunking.chunk_shape(k)
        return [_tensor(s, slot.param.dtype, shape) for s in storages]

    def _prefetch(self, slot: _Slot, k: int) -> None:
        self.pages.prefetch((slot.index, k), slot.slot_bytes[k])

    def _count(self, nbytes: int) -> None:
        with self._lock:  # the background thread frees what it applied
            self.live_grad_bytes += nbytes
            self.peak_grad_bytes = max(self.peak_grad_bytes, self.live_grad_bytes)

    # -- state -------------------------------------------------------------------------
    @property
    def resident_state_bytes(self) -> int:
        """Bytes of optimizer state held in RAM (parameter-sized tensors of the parameters not paged)."""
        total = 0
        for s in self.slots:
            if not s.paged:
                state = self.optimizer.state.get(s.param, {})
                total += sum(state[n].nbytes for n in s.rule.state_names if n in state)
            elif s.table is not None:
                total += s.table.overlay_bytes
        return total

    def state_sources(self) -> dict[int, dict[str, Any]]:
        """The optimizer state as ``state_dict()['state']`` lays it out, paged tensors as
        :class:`PagedTensor` (read chunk by chunk, never whole) and the rest as they are."""
        if self.pages is not None:
            self.pages.flush()
        out: dict[int, dict[str, Any]] = {}
        for s in self.slots:
            state = dict(self.optimizer.state.get(s.param, {}))
            if s.paged and (s.index, 0) in self.pages.written:
                for position, name in enumerate(s.rule.state_names):
                    state[name] = PagedTensor(self, s, position)
            if state:
                out[self._state_index(s)] = state
        return out

    def state_dict(self) -> dict[str, Any]:
        """``optimizer.state_dict()`` with paged state read back whole: for tests and small models; a
        checkpoint streams :meth:`state_sources` instead."""
        sd = self.optimizer.state_dict()
        for index, state in self.state_sources().items():
            sd["state"][index] = {k: v.materialize() if isinstance(v, PagedTensor) else v for k, v in state.items()}
        return sd

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Load ``optimizer.state_dict()``-shaped state; paged parameters' tensors go to their pages chunk by
        chunk (a tensor, or anything with ``read_range(start, end)`` over its flat elements)."""
        paged = {self._state_index(s): s for s in self.slots if s.paged}
        in_ram = {}
        for i, state in sd["state"].items():
            on_flash = paged[i].rule.state_names if i in paged else ()
            in_ram[i] = {k: _whole(v) for k, v in state.items() if k not in on_flash}
        self.optimizer.load_state_dict({"param_groups": sd["param_groups"], "state": in_ram})
        for i, s in paged.items():
            state = sd["state"].get(i, {})
            if all(name in state for name in s.rule.state_names):
                for k in range(len(s.chunking)):
                    chunks = [_chunk_of(state[name], s.chunking, k) for name in s.rule.state_names]
                    self.pages.write((s.index, k), [c.untyped_storage() for c in chunks])
            if s.table is not None:
                s.table.forget()
        if self.pages is not None:
            self.pages.flush()

    def _state_index(self, slot: _Slot) -> int:
        """The parameter's index in ``optimizer.state_dict()`` (its place across the param groups)."""
        if not hasattr(self, "_indices"):
            order = [p for g in self.optimizer.param_groups for p in g["params"]]
            self._indices = {id(p): i for i, p in enumerate(order)}
        return self._indices[id(slot.param)]


def _slots(optimizer: torch.optim.Optimizer, parameters: Sequence[tuple[str, torch.Tensor, int, bool]],
           chunk_bytes: int, paged: set[int], tables: Mapping[int, torch.nn.Module], *, may_stream: bool,
           by_rows: bool) -> list[_Slot]:
    """One slot per trained parameter: its update rule, how it is cut into chunks, whether its state is on
    flash; every parameter of ``optimizer`` must be among them."""
    groups = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    slots: list[_Slot] = []
    for index, (name, param, contributions, streamed) in enumerate(parameters):
        if id(param) not in groups:
            raise OptimizerError(f"parameter {name!r} is trained but not in the optimizer's param groups")
        streamed = streamed and contributions == 1 and may_stream  # a gradient that must be held is made whole
        rule = rule_for(optimizer, groups[id(param)])
        paged_here = index in paged and bool(rule.state_names)
        if index in tables:
            _check_table(name, param, tables[index], paged_here and by_rows and contributions == 1)
            chunking = row_chunking(param, chunk_bytes)
        else:
            chunking = Chunking.of(param, chunk_bytes, columns=streamed)
        slot = _Slot(index, name, param, rule, contributions, chunking, paged_here, streamed)
        slot.slot_bytes = [[chunking.chunk_numel(k) * param.element_size()] * len(rule.state_names)
                           for k in range(len(chunking))]
        slots.append(slot)
    known = {id(s.param) for s in slots}
    missing = [p for g in optimizer.param_groups for p in g["params"] if id(p) not in known]
    if missing:
        raise OptimizerError(f"the optimizer holds {len(missing)} parameters the graph does not train; "
                             "build it over the trained parameters only")
    return slots


class _ReadAhead:
    """Reads of state chunks on flash queued ahead of their updates, in the order updates run.

    The order is the one the last step's updates ran in (backward order is fixed by the graph); the first
    step guesses it.  At most :data:`~schedules.step_memory.READ_AHEAD_CHUNKS` reads wait ahead of the chunk
    being updated; an update that comes out of order reads its chunk at once and the window moves there.
    """

    def __init__(self, owner: FusedOptimizer, sequence: list[tuple[_Slot, int]]) -> None:
        self.owner = owner
        self.sequence = sequence
        self.position = {(id(s.param), k): i for i, (s, k) in enumerate(sequence)}
        self.issued = 0  # sequence positions below this have had their read queued
        self.seen: list[tuple[_Slot, int]] = []

    @classmethod
    def first_guess(cls, owner: FusedOptimizer) -> _ReadAhead:
        """Before the first step: by node, last layers first (the backward pass's order, near enough)."""
        guess = [s for s in reversed(owner.slots) if s.paged]
        return cls(owner, [(s, k) for s in guess for k in range(len(s.chunking))])

    def start(self) -> None:
        self.issued = 0
        self.seen = []
        self._fill(0)

    def updating(self, slot: _Slot, k: int) -> None:
        self.seen.append((slot, k))
        at = self.position.get((id(slot.param), k))
        if at is not None:
            self.issued = max(self.issued, at + 1)
            self._fill(at + 1)

    def finish(self) -> None:
        if self.seen and len(self.seen) == len(self.sequence):
            self.sequence = self.seen  # the order updates really ran in
            self.position = {(id(s.param), k): i for i, (s, k) in enumerate(self.sequence)}
        if self.owner.pages is not None:
            self.owner.pages.drop_reads()

    def _fill(self, start: int) -> None:
        end = min(start + READ_AHEAD_CHUNKS, len(self.sequence))
        for i in range(max(start, self.issued), end):
            slot, k = self.sequence[i]
            self.owner._prefetch(slot, k)
        self.issued = max(self.issued, end)


class PagedTensor:
    """One state tensor of a parameter whose state lives on flash, read a chunk at a time."""

    def __init__(self, owner: FusedOptimizer, slot: _Slot, position: int) -> None:
        self.owner, self.slot, self.position = owner, slot, position
        self.dtype = slot.param.dtype
        self.shape = tuple(slot.param.shape)
        self.nbytes = slot.param.nbytes
        self.columns = slot.chunking.columns  # chunks are column blocks (else flat ranges)

    def chunks(self) -> Iterator[tuple[tuple[int, int], torch.Tensor]]:
        """``(bounds, chunk)`` in order: the chunk as a contiguous tensor of its own."""
        s = self.slot
        for k in range(len(s.chunking)):
            storages = self.owner.pages.read((s.index, k), s.slot_bytes[k])
            chunk = _tensor(storages[self.position], self.dtype, s.chunking.chunk_shape(k))
            yield s.chunking.bounds[k], chunk if s.table is None else s.table.overlay_chunk(k, self.position, chunk)

    def materialize(self) -> torch.Tensor:
        whole = torch.empty(self.shape, dtype=self.dtype)
        for k, (_, chunk) in enumerate(self.chunks()):
            self.slot.chunking.view(whole, k).copy_(chunk)
        return whole


def _check_table(name: str, param: torch.Tensor, module: torch.nn.Module, eligible: bool) -> None:
    """Refuse a table the plan updates by rows where this optimizer cannot."""
    if getattr(module, "weight", None) is not param or not row_updatable(module):
        raise OptimizerError(f"parameter {name!r} is planned as an embedding table updated by rows, but its module "
                             f"is not a plain nn.Embedding lookup of it with rows of a multiple of 64: profile the "
                             "model again")
    if not eligible:
        raise OptimizerError(f"embedding table {name!r} is updated by rows only with its state on flash, updates in "
                             "the backward pass (no accumulation, no clipping) on the background thread, and one "
                             "lookup")


def _tensor(storage: torch.UntypedStorage, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape)


def _whole(value: Any) -> Any:
    """A loaded value as a tensor (a checkpoint's stored tensor is read whole for resident state)."""
    return value.load() if hasattr(value, "load") and not isinstance(value, torch.Tensor) else value


def _chunk_of(value: Any, chunking: Chunking, k: int) -> torch.Tensor:
    """Chunk ``k`` of a state tensor being loaded, as a contiguous tensor of its own."""
    if isinstance(value, torch.Tensor):
        return chunking.view(value, k).contiguous().clone()
    start, end = chunking.bounds[k]
    if chunking.columns:
        return value.read_columns(start, end)
    return value.read_range(start, end).reshape(chunking.chunk_shape(k))
