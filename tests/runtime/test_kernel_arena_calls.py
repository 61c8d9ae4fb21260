"""A model large enough to crash, called several times with the kernel arena, every output mode.

Each program runs in a child process under ``faulthandler``, so that a segfault fails the test
with the child's exit status and its Python stack instead of killing the test run. The model is
the smallest that segfaulted in issue 22: BERT with its real hidden size (768) and two of its
twelve layers, at batch 2 x 256 (``outputs="handover"`` served a layer norm's result past the
persistent arena; one layer does not place that slot in the tail, shorter inputs wrote past it
without a crash). Every call's outputs are kept until the end and compared with eager's, so an
arena or tail written while a caller holds it fails too.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tensorarena.runtime import kernel_arena  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]

CHILD = """
import faulthandler
import sys

import torch
import transformers

from tensorarena.runtime import PlannedProgram

faulthandler.enable()
torch.set_num_threads(1)
torch.manual_seed(0)
config = transformers.BertConfig(num_hidden_layers=2)  # BERT-base's widths, 2 of its 12 layers
model = transformers.BertModel(config).eval()
tokens = torch.randint(0, config.vocab_size, (2, 256), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    expected = model(tokens).to_tuple()
    exported = torch.export.export(model, (tokens,), strict=False)
for outputs in sys.argv[1:]:
    program = PlannedProgram.from_exported(exported, outputs=outputs, kernel_arena=True)
    kept = []
    for call in range(4):  # recorded, planned again with the kernels' allocations, served
        kept.append(program(tokens).to_tuple())
        print(outputs, "call", call, flush=True)
    for call, got in enumerate(kept):
        same = all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
        assert same, f"{outputs}: call {call}'s outputs differ from eager's at the end"
    report = program.report()
    assert report.kernel_arena.startswith("on"), report.kernel_arena
    assert report.kernel_served > 0, report.kernel_served
    print(outputs, "ok", flush=True)
"""


def test_every_output_mode_runs_bert_base_widths_for_several_calls_with_the_kernel_arena(
) -> None:
    reason = kernel_arena.unavailable()  # built here once: the child finds it cached
    if reason:
        pytest.skip(f"kernel arena shim unavailable: {reason}")
    modes = ("fresh", "arena", "handover")
    done = subprocess.run([sys.executable, "-X", "faulthandler", "-c", textwrap.dedent(CHILD),
                           *modes], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (
        f"exit {done.returncode} (-11 is SIGSEGV) after:\n{done.stdout[-400:]}\n"
        f"{done.stderr[-3000:]}")
    assert [line for line in done.stdout.splitlines() if line.endswith(" ok")] == [
        f"{mode} ok" for mode in modes]
