"""Small modules the export tests share (import after ``pytest.importorskip("torch")``)."""

from __future__ import annotations

from typing import Any

import torch


class Block(torch.nn.Module):
    """A linear layer, a batch norm (buffers that training updates), a non-persistent buffer
    and a constant made in ``forward``: each kind of input an export lifts."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.norm = torch.nn.BatchNorm1d(8)
        self.register_buffer("scale", torch.full((8,), 0.5), persistent=False)

    def forward(self, x: Any) -> Any:
        return torch.relu(self.norm(self.linear(x))) * self.scale + torch.tensor(1.0)
