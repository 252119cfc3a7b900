"""Serial power meters: UM frames through a pseudo-terminal, volts,amps lines through loop://."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import serial

from engine.energy.errors import MeterReadError, MeterUnavailableError
from engine.energy.serial_meter import LineSource, UMSource, decode_um_frame, open_port, open_serial_meter
from tests.engine.energy.fakes import UM24C, UM25C, UM25C_FRAME, UM34C, FakeClock, PtyMeter, um_frame


@pytest.fixture
def pty_meter() -> Iterator[PtyMeter]:
    meter = PtyMeter(UM25C_FRAME)
    yield meter
    meter.close()


def test_um25c_frame_scales() -> None:
    reading = decode_um_frame(UM25C_FRAME)
    assert (reading.model, reading.volts, reading.amps, reading.watts) == (
        "UM25C",
        pytest.approx(5.123),
        pytest.approx(0.4567),
        pytest.approx(2.339),
    )


@pytest.mark.parametrize("model_id", [UM24C, UM34C])
def test_um24c_and_um34c_send_a_tenth_of_the_resolution(model_id: int) -> None:
    # 5.12 V as 512 x 10 mV, 0.456 A as 456 mA; the power field is mW on every model
    reading = decode_um_frame(um_frame(model_id, 512, 456, 2335, end=0xFFF1 if model_id == UM24C else 0x00A7))
    assert (reading.volts, reading.amps, reading.watts) == (pytest.approx(5.12), pytest.approx(0.456), 2.335)


@pytest.mark.parametrize(
    ("frame", "expected_model", "message"),
    [
        (UM25C_FRAME[:129], None, "129 bytes"),
        (um_frame(0x1234, 5000, 1000, 500), None, "unknown model ID 0x1234"),
        (um_frame(UM25C, 5000, 1000, 500, end=0xF1FF), None, "ends with 0xF1FF"),
        (UM25C_FRAME, "UM24C", "is a UM25C, but the config says UM24C"),
    ],
)
def test_bad_frames_are_refused(frame: bytes, expected_model: str | None, message: str) -> None:
    with pytest.raises(MeterReadError, match=message):
        decode_um_frame(frame, expected_model)


def test_um25c_through_a_pseudo_terminal(pty_meter: PtyMeter) -> None:
    source = UMSource(open_port(pty_meter.path, timeout_s=2.0), "UM25C", label=pty_meter.path)
    try:
        pty_meter.send_stale(UM25C_FRAME[70:])  # the tail of an answer that came too late last time
        assert source.read_watts() == pytest.approx(2.339)
        assert source.read().volts == pytest.approx(5.123)
    finally:
        source.close()
    assert bytes(pty_meter.requests) == b"\xf0\xf0"
    assert source.description == f"UM25C on {pty_meter.path}"


def test_a_silent_meter_times_out_with_advice() -> None:
    silent = PtyMeter(frame=None)
    source = UMSource(open_port(silent.path, timeout_s=0.1), "UM25C")
    try:
        with pytest.raises(MeterReadError, match="got 0 of 130 bytes .* switched on, paired"):
            source.read_watts()
    finally:
        source.close()
        silent.close()


def test_sampled_um25c_energy(pty_meter: PtyMeter, clock: FakeClock) -> None:
    meter = open_serial_meter(pty_meter.path, protocol="um25c", timeout_s=2.0, interval_s=3600, clock=clock)
    with meter, meter.measure() as m:
        clock.advance(10.0)
    assert (meter.name, meter.source, m.joules) == ("um25c", f"UM25C on {pty_meter.path}", pytest.approx(23.39))


def _loop() -> serial.SerialBase:
    return serial.serial_for_url("loop://", timeout=0.1)


def test_volts_amps_lines_skip_junk_and_keep_the_newest() -> None:
    port = _loop()
    source = LineSource(port, label="loop://")
    port.write(b"INA219 logger v1.2\r\nV,A\r\n5.01,0.50\r\n5.00,0.80,extra\r\n")
    assert source.read_watts() == pytest.approx(4.0)  # 5.00 V x 0.80 A; the 2.5 W line was stale
    assert source.junk_lines == 2
    port.write(b"nan,1\n4.9,-1.0\n")  # a shunt wired backwards still draws power
    assert source.read_watts() == pytest.approx(4.9)
    assert source.junk_lines == 3


def test_a_buffered_line_is_returned_without_waiting_for_the_timeout() -> None:
    port = serial.serial_for_url("loop://", timeout=2.0)
    port.write(b"5.0,0.2\n")
    started = time.perf_counter()
    assert LineSource(port).read_watts() == pytest.approx(1.0)
    assert time.perf_counter() - started < 1.0  # the sampler must not stall for a line that is not coming


def test_a_line_cut_by_the_timeout_is_completed_by_the_next_read() -> None:
    port = _loop()
    source = LineSource(port)
    port.write(b"5.0,0.")
    with pytest.raises(MeterReadError, match="no 'volts,amps' line before the timeout"):
        source.read_watts()
    port.write(b"5\n")
    assert source.read_watts() == pytest.approx(2.5)
    assert source.junk_lines == 0


def test_only_junk_is_a_read_error_that_counts_it() -> None:
    port = _loop()
    source = LineSource(port)
    port.write(b"hello\nworld\n")
    with pytest.raises(MeterReadError, match="2 junk lines"):
        source.read_watts()


def test_a_missing_port_is_unavailable_with_advice(tmp_path: object) -> None:
    with pytest.raises(MeterUnavailableError, match="rfcomm bind.*dialout"):
        open_port(f"{tmp_path}/rfcomm9")


def test_unknown_protocol_is_refused() -> None:
    with pytest.raises(ValueError, match="UM25C"):
        open_serial_meter("loop://", protocol="UM99")
