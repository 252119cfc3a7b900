"""The standard library's source as a fleet's text (agent.stdlib_text): one package per device, honest splits."""

from __future__ import annotations

import pytest
import torch

from agent.digits import device_dataset, fleet_workload, vendor_dataset
from agent.errors import FederationError
from agent.federated.virtual import FleetData
from agent.federated.virtual import STDLIB_TEXT
from agent.stdlib_text import SEQUENCE, TRAIN_SHARE, device_packages, package_text, vendor_text

TEXT = FleetData(samples=32, dataset=STDLIB_TEXT, viewpoints=0.0)


def test_each_device_holds_its_own_package_tested_on_text_it_never_trained_on() -> None:
    shares = [device_dataset(i, 3, data=TEXT, seed=0) for i in range(3)]
    assert [s.source.name for s in shares] == list(device_packages()[:3])  # three packages, one each
    for share in shares:
        stream = package_text(share.source.name).tobytes()
        cut = int(TRAIN_SHARE * len(stream))
        assert share.train_x.shape == (32, SEQUENCE) and len(share.holdout_x) == TEXT.holdout
        assert torch.equal(share.train_y[:, :-1], share.train_x[:, 1:])  # each position's target: the next byte
        for x, y in zip(share.holdout_x, share.holdout_y):
            window = bytes(x.tolist()) + bytes(y[-1:].tolist())
            assert window in stream[cut:]  # held-out text comes after every byte it trained on
        for x in share.train_x[:8]:
            assert bytes(x.tolist()) in stream[:cut]
    again = device_dataset(1, 3, data=TEXT, seed=0)
    assert torch.equal(again.train_x, shares[1].train_x)  # a function of its arguments


def test_the_vendor_pretrains_on_the_modules_in_no_package() -> None:
    vendor = vendor_dataset(3, data=TEXT)
    stream = vendor_text().tobytes()
    assert len(vendor.train_x) == (int(TRAIN_SHARE * len(stream)) - 1) // SEQUENCE  # every window of its part
    assert b"def " in bytes(vendor.train_x[:200].flatten().tolist())  # Python source, read from disk
    device = package_text(device_packages()[0]).tobytes()
    assert len(stream) > len(device) and stream[:4096] not in device  # other text than any device's


def test_text_fleets_train_adapters_only_and_refuse_settings_that_make_no_sense_for_text() -> None:
    work = fleet_workload(TEXT, 0)
    trainable = {n for n, p in work.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    base = fleet_workload(TEXT, 0, adapters=False)  # what the vendor pretrains: the whole model
    assert all(p.requires_grad for p in base.model.parameters())
    with pytest.raises(FederationError, match="python-stdlib text is split by package"):
        FleetData(samples=32, dataset=STDLIB_TEXT, label_alpha=1.0).check(3, 16)
