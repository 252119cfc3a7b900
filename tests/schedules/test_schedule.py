import json

import pytest

from schedules.errors import FormatError, ScheduleMismatchError, SignatureError, UnsupportedVersionError
from schedules.schedule import Schedule, SolverInfo, decode_instructions, encode_instructions
from schedules.signing import generate_keypair, load_private_key, load_public_key, sign, verify
from tests.schedules.test_graph import tiny_graph

INSTRUCTIONS = (("compute", 0), ("compute", 1), ("page_out", 0), ("free", 0), ("compute", 2),
                ("page_in", 0), ("compute", 3), ("free", 1), ("free", 2), ("compute", 4))


def make_schedule(**overrides) -> Schedule:
    g = tiny_graph()
    fields = dict(
        instructions=INSTRUCTIONS, graph_fingerprint=g.fingerprint, graph_size=g.size, model=g.model,
        device="rpi4", memory_budget=600, runtime_budget_ms=12.0, predicted_peak_bytes=504,
        predicted_runtime_ms=7.0, predicted_energy_j=0.5,
        solver=SolverInfo("poet", "highs", "optimal", 0.5, 0.0, 0.12),
    )
    fields.update(overrides)
    return Schedule(**fields)


def test_instruction_encoding_is_compact_and_round_trips():
    instructions = [("compute", n) for n in range(6)] + [("free", 2), ("free", 4), ("page_out", 3)]
    text = encode_instructions(instructions)
    assert text == "c0-5 f2,4 o3"
    assert decode_instructions(text) == tuple(instructions)


@pytest.mark.parametrize("token", ["x3", "c", "c3-1", "c1,,2", "c-1", "c1 2"])
def test_malformed_tokens_are_rejected(token):
    with pytest.raises(FormatError):
        decode_instructions(token)


def test_save_load_round_trip_is_canonical(tmp_path):
    s = make_schedule()
    size = s.save(tmp_path / "s.json")
    loaded = Schedule.load(tmp_path / "s.json")
    assert loaded == s
    assert (tmp_path / "s.json").read_bytes() == loaded.to_json()
    assert size == len(loaded.to_json()) < 1000


def test_node_outside_graph_and_unknown_fields_are_refused(tmp_path):
    data = json.loads(make_schedule().to_json())
    data["instructions"] = "c0-9"
    with pytest.raises(FormatError, match="outside the graph"):
        Schedule.from_json(json.dumps(data))
    data = json.loads(make_schedule().to_json())
    data["surprise"] = 1
    with pytest.raises(FormatError, match="unknown fields"):
        Schedule.from_json(json.dumps(data))
    data = json.loads(make_schedule().to_json())
    data["version"] = 7
    with pytest.raises(UnsupportedVersionError):
        Schedule.from_json(json.dumps(data))
    with pytest.raises(FormatError, match="not valid JSON"):
        Schedule.from_json(b"\x00\x01")


def test_schedule_for_another_graph_is_refused():
    s = make_schedule(graph_fingerprint="sha256:" + "0" * 64)
    with pytest.raises(ScheduleMismatchError, match="planned for graph"):
        s.check_graph(tiny_graph())


@pytest.fixture
def keys(tmp_path):
    private, public = generate_keypair(tmp_path / "keys")
    return load_private_key(private), load_public_key(public), tmp_path


def test_signed_schedule_verifies_after_round_trip(keys):
    private, public, tmp = keys
    signed = sign(make_schedule(), private)
    signed.save(tmp / "s.json")
    assert Schedule.load(tmp / "s.json", public_key=public).signature == signed.signature


def test_tampered_schedule_is_refused(keys):
    private, public, tmp = keys
    data = json.loads(sign(make_schedule(), private).to_json())
    data["memory_budget"] = 10**9  # an attacker lifts the budget
    (tmp / "s.json").write_text(json.dumps(data))
    with pytest.raises(SignatureError, match="modified after signing"):
        Schedule.load(tmp / "s.json", public_key=public)


@pytest.mark.parametrize("position", range(0, 40, 3))
def test_a_byte_changed_inside_the_instructions_fails_the_signature_not_the_parser(keys, position):
    private, public, tmp = keys
    raw = sign(make_schedule(), private).to_json()
    start = raw.index(b'"instructions":"') + len(b'"instructions":"')
    tokens = raw[start:raw.index(b'"', start)]
    at = start + position % len(tokens)
    flipped = raw[:at] + (b"#" if raw[at:at + 1] != b"#" else b"c") + raw[at + 1:]  # not an instruction token
    (tmp / "s.json").write_bytes(flipped)
    with pytest.raises(FormatError):
        Schedule.load(tmp / "s.json")  # unsigned reading: the parser finds the bad token
    with pytest.raises(SignatureError, match="modified after signing"):
        Schedule.load(tmp / "s.json", public_key=public)


def test_foreign_and_missing_signatures_are_refused(keys, tmp_path):
    private, public, _ = keys
    other_private, _ = generate_keypair(tmp_path / "other")
    foreign = sign(make_schedule(), load_private_key(other_private))
    with pytest.raises(SignatureError, match="not by the trusted key"):
        verify(foreign, public)
    with pytest.raises(SignatureError, match="not signed"):
        verify(make_schedule(), public)


def test_keypair_is_private_and_never_overwritten(tmp_path):
    private, _ = generate_keypair(tmp_path)
    assert private.stat().st_mode & 0o777 == 0o600
    with pytest.raises(FileExistsError):
        generate_keypair(tmp_path)


def test_flags_and_solver_names_must_have_their_json_types():
    data = json.loads(make_schedule().to_json())
    data["count_paging_time"] = "false"  # a string is not false
    with pytest.raises(FormatError, match="count_paging_time must be true or false"):
        Schedule.from_json(json.dumps(data))
    data = json.loads(make_schedule().to_json())
    data["solver"]["method"] = 7
    with pytest.raises(FormatError, match="solver.method"):
        Schedule.from_json(json.dumps(data))


def test_a_huge_range_outside_the_graph_is_refused_before_it_is_expanded():
    data = json.loads(make_schedule().to_json())
    data["instructions"] = "c0-999999999999"
    with pytest.raises(FormatError, match="outside the graph"):
        Schedule.from_json(json.dumps(data))  # at once: a trillion tuples would never finish
    with pytest.raises(FormatError, match="malformed"):
        decode_instructions("c\u0661")  # an Arabic-Indic digit is not a node id


def test_a_signature_block_with_an_extra_key_fails_as_a_signature(keys):
    private, public, tmp = keys
    data = json.loads(sign(make_schedule(), private).to_json())
    data["signature"]["note"] = "trust me"
    with pytest.raises(SignatureError, match="malformed"):
        Schedule.from_json(json.dumps(data), public_key=public)
