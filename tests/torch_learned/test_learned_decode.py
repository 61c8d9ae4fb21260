"""A decode loop under ``tensorarena.torch.learned()``: a two-layer Llama's ``generate()`` with a
static cache gives the tokens it gives under torch's allocator, and repeated requests are served
from the plan learned from the first, holding no more than issue 24's target (1.02x the live
peak)."""

from __future__ import annotations

import gc
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from _eager_models import batch, llama  # noqa: E402

from tensorarena.torch import learned, routed_blocks  # noqa: E402

pytestmark = pytest.mark.torch


def generate(model: Any, ids: Any) -> Any:
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=8, do_sample=False,
                              cache_implementation="static")


def test_generate_with_a_static_cache_gives_the_same_tokens(shim: Any) -> None:
    model = llama()
    ids = batch()[:, :8]
    expected = generate(model, ids)
    tokens = []
    with learned() as steps:
        for _ in range(4):
            with steps.step():
                tokens.append(generate(model, ids))
        report = steps.report()
        live = steps.statistics().requested_bytes.peak
    for got in tokens:
        assert torch.equal(got, expected)
    assert report.steps == 4 and report.served > 0
    # Generate keeps nothing across requests in the route: the steady state is the plan's
    # arena alone (measured: 77377 bytes held for a live peak of 76849, 1.007x).
    assert report.steady_peak_reserved_bytes is not None
    assert report.steady_peak_reserved_bytes <= 1.02 * live
    del tokens, got
    gc.collect()
    assert routed_blocks() == 0
