"""Three plain training steps of the zoo's small U-Net from given weights and batches: run on x86_64 and on
emulated arm64 by tests/arm64/test_arm64.py, which compares what each ends with.

    python tests/arm64/train_steps.py START.pt END.pt

START.pt holds ``{"weights": state_dict, "batches": [(inputs, targets), ...]}``; END.pt gets the state dict
after SGD with momentum over the batches (dropout's masks from seed 0).
"""

from __future__ import annotations

import sys

import torch

from agent.zoo import SmallUNet


def model() -> torch.nn.Module:
    return SmallUNet(channels=8, classes=4, dropout=0.2)


def train(start: dict) -> dict[str, torch.Tensor]:
    net = model()
    net.load_state_dict(start["weights"])
    net.train()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    torch.manual_seed(0)
    for inputs, targets in start["batches"]:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(net(inputs), targets).backward()
        optimizer.step()
    return net.state_dict()


if __name__ == "__main__":
    torch.save(train(torch.load(sys.argv[1])), sys.argv[2])
