"""Global model versions: stored per round in the data directory and the database, signed, checked on load;
the ServerApp's choice of where a run starts."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

from server.db.models import ModelVersion
from server.errors import ModelVersionError, ServerConfigError
from server.federated.serverapp import DevicesModel, GlobalModels
from server.keys import load_or_create
from server.model_versions import list_versions, load_version, model_identity, store_version, weights_path
from server.federated.rounds import open_store


def weights(seed: int, width: int = 4) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"conv.weight": rng.standard_normal((width, 3), dtype=np.float32),
            "conv.bias": rng.standard_normal(width, dtype=np.float32),
            "bn.num_batches_tracked": np.array(seed, dtype=np.int64)}


@pytest.fixture
def store(tmp_path: Path):
    database = open_store(f"sqlite:///{tmp_path / 'server.db'}")
    key = load_or_create(tmp_path / "keys")
    yield database, tmp_path, key
    database.dispose()


def stored(store, arrays, round_, parent, run_id=7, model="digits abc"):
    database, data_dir, key = store
    return store_version(database, data_dir, key.private_key, arrays, run_id=run_id, round=round_, parent=parent,
                         model=model, metrics={"evaluate.accuracy": 0.5 + round_ / 10, "note": object()})


def test_versions_round_trip_bit_for_bit_in_order_with_their_provenance(store) -> None:
    database, data_dir, key = store
    first = stored(store, weights(1), 1, None)
    second = stored(store, weights(2), 2, first.version)
    assert second.version == first.version + 1 and second.parent == first.version
    assert weights_path(data_dir, second.sha256).is_file()
    info, arrays = load_version(database, data_dir, key.private_key.public_key())  # the newest
    assert info.version == second.version and info.metrics == {"evaluate.accuracy": 0.7}  # plain values only
    expected = weights(2)
    assert list(arrays) == list(expected)
    assert all(arrays[k].dtype == expected[k].dtype and np.array_equal(arrays[k], expected[k]) for k in expected)
    older, _ = load_version(database, data_dir, key.private_key.public_key(), first.version)
    assert older.round == 1 and older.parent is None
    assert [v.version for v in list_versions(database)] == [second.version, first.version]
    assert list_versions(database, run_id="8") == []


def test_a_changed_weights_file_is_refused_naming_the_version(store) -> None:
    database, data_dir, key = store
    info = stored(store, weights(1), 1, None)
    path = weights_path(data_dir, info.sha256)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte of the weights
    path.write_bytes(bytes(data))
    with pytest.raises(ModelVersionError, match=f"model version {info.version}: .* was changed"):
        load_version(database, data_dir, key.private_key.public_key())
    path.unlink()
    with pytest.raises(ModelVersionError, match="cannot read"):
        load_version(database, data_dir, key.private_key.public_key())


def test_a_row_changed_in_the_database_or_signed_by_another_key_is_refused(store, tmp_path) -> None:
    database, data_dir, key = store
    info = stored(store, weights(1), 1, None)
    other = load_or_create(tmp_path / "other-keys")
    with pytest.raises(ModelVersionError, match="not by the trusted key"):
        load_version(database, data_dir, other.private_key.public_key())
    with database.write() as session:
        session.get(ModelVersion, info.version).round = 5
    with pytest.raises(ModelVersionError, match="does not verify"):
        load_version(database, data_dir, key.private_key.public_key())


def test_a_weights_file_with_pickled_objects_is_not_unpickled(store) -> None:
    database, data_dir, key = store
    info = stored(store, weights(1), 1, None)
    buffer = io.BytesIO()
    np.savez(buffer, w=np.array([{"x": 1}], dtype=object))
    data = buffer.getvalue()
    import hashlib

    path = weights_path(data_dir, hashlib.sha256(data).hexdigest())
    path.write_bytes(data)
    with database.write() as session:  # a row re-signed by the server's own key: only the file is hostile
        row = session.get(ModelVersion, info.version)
        row.sha256, row.size_bytes = path.stem, len(data)
    from server.model_versions import VersionInfo, version_info
    from schedules.signing import sign_payload

    fresh = version_info(database, info.version)
    with database.write() as session:
        session.get(ModelVersion, info.version).signature = sign_payload(VersionInfo.payload(fresh), key.private_key)
    with pytest.raises(ModelVersionError, match="not a weights file"):
        load_version(database, data_dir, key.private_key.public_key())
    assert zipfile.is_zipfile(path)


def test_a_run_starts_from_the_newest_version_of_its_own_model(store) -> None:
    database, data_dir, key = store
    models = GlobalModels(database, data_dir, key)
    initial = ArrayRecord({k: Array(v) for k, v in weights(0).items()})
    digits = model_identity("digits", weights(0))
    wider = model_identity("digits", weights(0, width=8))  # same name, another layout: another model
    assert digits != wider
    devices = DevicesModel(initial, "digits", {})
    assert devices.identity == digits
    arrays, version = models.start("latest", devices)
    assert arrays is initial and version is None  # nothing stored yet: the seeded weights
    mine = stored(store, weights(1), 1, None, model=digits)
    theirs = stored(store, weights(2, width=8), 1, None, model=wider)
    arrays, version = models.start("latest", devices)
    assert version == mine.version
    assert np.array_equal(arrays["conv.weight"].numpy(), weights(1)["conv.weight"])
    assert models.start("none", devices) == (initial, None)
    assert models.start(str(mine.version), devices)[1] == mine.version
    with pytest.raises(ServerConfigError, match=f"version {theirs.version} is of .* but the devices train"):
        models.start(str(theirs.version), devices)
    with pytest.raises(ServerConfigError, match="no global model version 99"):
        models.start("99", devices)
    weights_path(data_dir, mine.sha256).unlink()
    with pytest.raises(ServerConfigError, match="initial-version = \"none\" starts afresh"):
        models.start("latest", devices)


def lm_weights(seed: int) -> dict[str, np.ndarray]:
    """A language model's weights in its own order, the output layer tied to the token embedding."""
    rng = np.random.default_rng(seed)
    embedding = rng.standard_normal((16, 4), dtype=np.float32)
    return {"wte.weight": embedding, "block.weight": rng.standard_normal((4, 4), dtype=np.float32),
            "ln.bias": rng.standard_normal(4, dtype=np.float32), "lm_head.weight": embedding.copy()}


def test_an_imported_pretrained_model_starts_the_federation_in_the_devices_order(store, tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    from server.model_files import read_weights
    from server.model_versions import IMPORTED, import_version

    database, data_dir, key = store
    devices = DevicesModel(ArrayRecord({k: Array(v) for k, v in lm_weights(0).items()}), "gpt2",
                           {"lm_head.weight": "wte.weight"})
    pretrained = lm_weights(1)
    file = tmp_path / "pretrained.safetensors"  # as save_pretrained writes it: the tied weight once, names sorted
    save_file({k: v for k, v in pretrained.items() if k != "lm_head.weight"}, str(file))
    assert list(read_weights(file)) != [k for k in pretrained if k != "lm_head.weight"]  # another order
    info = import_version(database, data_dir, key.private_key, read_weights(file), name="gpt2", source=str(file))
    assert info.run_id == IMPORTED and info.parent is None and info.metrics == {"imported-from": file.name}

    arrays, version = GlobalModels(database, data_dir, key).start("latest", devices)

    assert version == info.version
    assert list(arrays) == list(devices.arrays)  # the devices' order
    for name in pretrained:
        assert np.array_equal(arrays[name].numpy(), pretrained[name])  # the tied layer from its source
    # a model of another name, or of other shapes, is not the devices' model
    other = import_version(database, data_dir, key.private_key, {**read_weights(file), "ln.bias": np.zeros(5, np.float32)},
                           name="gpt2", source="other.safetensors")
    with pytest.raises(ServerConfigError, match=f"version {other.version} is of .* but the devices train"):
        GlobalModels(database, data_dir, key).start(str(other.version), devices)
    assert GlobalModels(database, data_dir, key).start("latest", devices)[1] == info.version


def test_versions_stored_before_identities_were_order_free_still_start_a_run(store) -> None:
    from server.model_versions import identities

    database, data_dir, key = store
    devices = DevicesModel(ArrayRecord({k: Array(v) for k, v in weights(0).items()}), "digits", {})
    legacy = identities("digits", weights(0))[-1]  # the devices' order hashed, as older servers stored it
    assert legacy != devices.identity
    old = stored(store, weights(3), 4, None, model=legacy)
    arrays, version = GlobalModels(database, data_dir, key).start("latest", devices)
    assert version == old.version and np.array_equal(arrays["conv.weight"].numpy(), weights(3)["conv.weight"])


def test_weights_files_in_and_out_without_torch(tmp_path: Path) -> None:
    import json

    from safetensors.numpy import save_file

    from server.model_files import read_weights, write_weights

    arrays = weights(5)
    for suffix in (".safetensors", ".npz"):
        written = write_weights(arrays, tmp_path / f"v1{suffix}")
        back = read_weights(written)
        assert set(back) == set(arrays)
        assert all(back[k].dtype == arrays[k].dtype and np.array_equal(back[k], arrays[k]) for k in arrays)
    folder = tmp_path / "sharded"  # save_pretrained's sharded folder: an index naming each shard
    folder.mkdir()
    save_file({"conv.weight": arrays["conv.weight"]}, str(folder / "model-00001-of-00002.safetensors"))
    save_file({"conv.bias": arrays["conv.bias"]}, str(folder / "model-00002-of-00002.safetensors"))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "conv.weight": "model-00001-of-00002.safetensors", "conv.bias": "model-00002-of-00002.safetensors"}}))
    assert set(read_weights(folder)) == {"conv.weight", "conv.bias"}

    (tmp_path / "model.pt").write_bytes(b"\x80\x04pickle")
    (tmp_path / "cut.safetensors").write_bytes((tmp_path / "v1.safetensors").read_bytes()[:40])
    for path, says in ((tmp_path / "model.pt", "does not unpickle .* convert it to safetensors"),
                       (tmp_path / "cut.safetensors", "not a safetensors file"),
                       (tmp_path / "absent.npz", "does not exist"), (tmp_path, "holds no model.safetensors"),
                       (tmp_path / "weights.h5", "unknown kind of weights file")):
        with pytest.raises(ModelVersionError, match=says):
            read_weights(path)
    with pytest.raises(ModelVersionError, match="write a .safetensors or .npz"):
        write_weights(arrays, tmp_path / "out.pt")
