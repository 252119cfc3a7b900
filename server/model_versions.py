"""Global model versions: the model after every federated round, kept in the server's data directory and signed.

A version is a weights file and a row.  The file, ``<data dir>/models/<sha256>.npz``, is the round's
aggregated ``ArrayRecord`` as NumPy arrays in their order (``numpy.savez``, no pickles), written
atomically; its name is its hash, so a file is never overwritten with other bytes.  The row
(:class:`server.db.models.ModelVersion`) says where it came from: the Flower run and round, the version it
was aggregated from (``parent``), the round's aggregated metrics, and the server's Ed25519 signature over
all of that and the file's hash (:func:`schedules.signing.sign_payload`), so a device or an operator can
check a downloaded model as it checks a schedule.

The ServerApp (:mod:`server.federated.serverapp`) stores a version after each round and starts a run from the newest
unless told otherwise; the dashboard lists them.  No Flower and no torch here: arrays are NumPy's.
"""

from __future__ import annotations

import hashlib
import io
import time
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import desc, select
from sqlalchemy.exc import SQLAlchemyError

from schedules.errors import SignatureError
from common.files import write_atomically
from schedules.signing import sign_payload, verify_payload
from server.db.engine import Database
from server.db.models import ModelVersion
from server.errors import DatabaseError, ModelVersionError

MODELS_FOLDER = "models"


@dataclass(frozen=True)
class VersionInfo:
    """A stored version's row, as plain data."""

    version: int
    run_id: str
    round: int
    parent: int | None
    model: str
    sha256: str
    size_bytes: int
    metrics: dict[str, Any]
    signature: dict[str, str]
    created_at: float

    def payload(self) -> dict[str, Any]:
        """What the signature covers: everything but the signature."""
        return {"format": "poet-edge/model-version", "version": self.version, "run_id": self.run_id,
                "round": self.round, "parent": self.parent, "model": self.model, "sha256": self.sha256,
                "size_bytes": self.size_bytes, "metrics": self.metrics, "created_at": self.created_at}

    @classmethod
    def of(cls, row: ModelVersion) -> VersionInfo:
        return cls(row.version, row.run_id, row.round, row.parent, row.model, row.sha256, row.size_bytes,
                   dict(row.metrics), dict(row.signature), row.created_at)


def model_identity(name: str, arrays: Mapping[str, np.ndarray]) -> str:
    """``name`` and a hash of the arrays' names, shapes and dtypes in name order: versions of one identity fit
    one model, whatever order a file lists its arrays in (safetensors sorts them its own way)."""
    return _identity(name, [(key, arrays[key]) for key in sorted(arrays)])


def identities(name: str, arrays: Mapping[str, np.ndarray], tied: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Every identity a version that fits the devices' ``arrays`` may carry: :func:`model_identity`; the same
    without the arrays ``tied`` to another (``alias -> source``: a file written by ``save_pretrained`` holds a
    tied weight once); and the identity of the arrays in the devices' order, which versions stored before
    identities were order-free carry."""
    untied = {key: value for key, value in arrays.items() if key not in (tied or {})}
    found = (model_identity(name, arrays), model_identity(name, untied), _identity(name, list(arrays.items())))
    return tuple(dict.fromkeys(found))


def fit(weights: Mapping[str, np.ndarray], like: Mapping[str, np.ndarray], tied: Mapping[str, str] | None = None,
        what: str = "the version") -> dict[str, np.ndarray]:
    """``weights`` in ``like``'s order and dtypes, each tied array absent from ``weights`` taken from its source
    (FedAvg's mean makes a float of an integer counter; a float16 file loads into float32).

    Raises :class:`ModelVersionError` naming the arrays that are missing, extra or of another shape.
    """
    tied = tied or {}
    filled = dict(weights)
    for alias, source in tied.items():
        if alias not in filled and source in filled:
            filled[alias] = filled[source]
    missing = [k for k in like if k not in filled]
    extra = [k for k in filled if k not in like]
    differ = [f"{k} {tuple(filled[k].shape)} (the devices' {tuple(like[k].shape)})"
              for k in like if k in filled and filled[k].shape != like[k].shape]
    reasons = [f"{label}: {', '.join(names[:5])}{f' and {len(names) - 5} more' if len(names) > 5 else ''}"
               for label, names in (("missing", missing), ("not in the devices' model", extra), ("differ", differ))
               if names]
    if reasons:
        raise ModelVersionError(f"{what} does not fit the devices' model ({'; '.join(reasons)}): import weights "
                                "of the model the devices train")
    return {k: filled[k].astype(like[k].dtype, copy=False) for k in like}


def _identity(name: str, layout_of: list[tuple[str, np.ndarray]]) -> str:
    layout = ";".join(f"{key}:{tuple(value.shape)}:{value.dtype.str}" for key, value in layout_of)
    return f"{name[:170]} {hashlib.sha256(layout.encode()).hexdigest()[:16]}"


def weights_path(data_dir: Path, sha256: str) -> Path:
    """Where the weights file with this hash lives."""
    return data_dir / MODELS_FOLDER / f"{sha256}.npz"


def encode_weights(arrays: Mapping[str, np.ndarray]) -> bytes:
    """``arrays`` as an ``.npz`` file's bytes, in their order."""
    buffer = io.BytesIO()
    np.savez(buffer, **{name: np.asarray(value, order="C") for name, value in arrays.items()})
    return buffer.getvalue()


def decode_weights(data: bytes, what: str) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file's bytes, in their order; pickled objects are refused."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
        raise ModelVersionError(f"{what} is not a weights file: {exc}") from exc


def store_version(database: Database, data_dir: Path, private_key: Any, arrays: Mapping[str, np.ndarray], *,
                  run_id: int | str, round: int, parent: int | None, model: str,
                  metrics: Mapping[str, Any]) -> VersionInfo:
    """Write ``arrays`` as a new version (the file first, fsynced, then the signed row); its row."""
    data = encode_weights(arrays)
    sha256 = hashlib.sha256(data).hexdigest()
    path = weights_path(data_dir, sha256)
    if not (path.exists() and path.stat().st_size == len(data)):  # content-addressed: the same bytes are there
        try:
            write_atomically(path, data)
        except OSError as exc:
            raise ModelVersionError(f"cannot write the global model to {path}: {exc.strerror or exc}") from exc
    clean = {str(k): v for k, v in metrics.items() if isinstance(v, (int, float, str, bool))}
    try:
        with database.write() as session:
            row = ModelVersion(run_id=str(run_id), round=round, parent=parent, model=model[:200], sha256=sha256,
                               size_bytes=len(data), metrics=clean, signature={}, created_at=time.time())
            session.add(row)
            session.flush()  # the version number is the row's id
            info = VersionInfo.of(row)
            row.signature = sign_payload(info.payload(), private_key)
            return VersionInfo.of(row)
    except SQLAlchemyError as exc:
        raise DatabaseError(f"cannot store model version: {getattr(exc, 'orig', None) or exc}") from exc


IMPORTED = "import"  # the run_id of a version imported from a file, not made by a Flower run


def import_version(database: Database, data_dir: Path, private_key: Any, arrays: Mapping[str, np.ndarray], *,
                   name: str, source: str) -> VersionInfo:
    """Store pretrained ``arrays`` as a signed version of the devices' model ``name`` (the workload name they
    report: ``poet-edge server versions`` shows it before each identity's hash), with no parent; a federation
    of that model starts from it (``--from-version latest`` or its number)."""
    if not arrays:
        raise ModelVersionError(f"{source} holds no arrays")
    return store_version(database, data_dir, private_key, arrays, run_id=IMPORTED, round=0, parent=None,
                         model=model_identity(name, arrays), metrics={"imported-from": Path(source).name[:200]})


def list_versions(database: Database, limit: int = 100, run_id: str | None = None) -> list[VersionInfo]:
    """The newest ``limit`` versions (of one Flower run where ``run_id`` is given), newest first."""
    query = select(ModelVersion).order_by(desc(ModelVersion.version)).limit(limit)
    if run_id is not None:
        query = query.where(ModelVersion.run_id == str(run_id))
    with database.read() as session:
        return [VersionInfo.of(row) for row in session.scalars(query)]


def version_info(database: Database, version: int | None = None,
                 model: str | Sequence[str] | None = None) -> VersionInfo | None:
    """Version ``version``'s row, or the newest's (of ``model``, or of any of several identities, where given)
    when ``None``; ``None`` when there is none."""
    with database.read() as session:
        if version is not None:
            row = session.get(ModelVersion, version)
        else:
            query = select(ModelVersion).order_by(desc(ModelVersion.version)).limit(1)
            if model is not None:
                query = query.where(ModelVersion.model.in_([model] if isinstance(model, str) else list(model)))
            row = session.scalars(query).first()
        return VersionInfo.of(row) if row is not None else None


def load_version(database: Database, data_dir: Path, public_key: Any,
                 version: int | None = None, model: str | None = None) -> tuple[VersionInfo, dict[str, np.ndarray]]:
    """Version ``version`` (the newest, of ``model`` where given, when ``None``), checked against its hash and
    the server's signature.

    Raises
    ------
    ModelVersionError
        No such version, its file is missing or changed, or its row is not signed by ``public_key``.
    """
    info = version_info(database, version, model)
    if info is None:
        raise ModelVersionError("no global model is stored yet" if version is None else
                                f"no global model version {version}: `poet-edge server versions` lists them")
    return info, checked_weights(info, data_dir, public_key)


def checked_weights(info: VersionInfo, data_dir: Path, public_key: Any) -> dict[str, np.ndarray]:
    """The weights of the version ``info`` describes, once its row's signature and its file's hash check out."""
    try:
        verify_payload(info.payload(), info.signature, public_key, what=f"model version {info.version}")
    except SignatureError as exc:
        raise ModelVersionError(str(exc)) from exc
    path = weights_path(data_dir, info.sha256)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ModelVersionError(f"model version {info.version}: cannot read {path}: {exc.strerror or exc}") from exc
    if hashlib.sha256(data).hexdigest() != info.sha256:
        raise ModelVersionError(f"model version {info.version}: {path} was changed after it was stored (its hash "
                                "differs): restore it from a backup, or start the next run afresh")
    return decode_weights(data, str(path))
