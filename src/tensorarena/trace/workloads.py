"""Real workloads, recorded: the traces shipped in ``tensorarena/trace/data``.

Three small ``transformers`` models with random weights (never downloaded), each run on the CPU
under :func:`~tensorarena.trace.record_torch`:

``training_step``
    one steady-state training step of a two-layer GPT-2 language model (hidden size 128,
    vocabulary 2048, batch 4, 64 tokens):
    zero the gradients, forward, cross-entropy loss, backward, AdamW step. A step was run
    before recording, so the optimizer's state exists (and the old gradients that
    ``zero_grad`` frees, allocated before the recording, are not in the trace).
``decoding``
    greedy autoregressive generation of 20 tokens by a two-layer Llama after a 32-token prompt
    (batch 2), with the KV cache growing at every step: the dynamic shapes of a decoder.
``serving``
    16 requests to a two-layer BERT encoder with batch sizes from 1 to 8 and sequence lengths
    from 8 to 128, drawn with a fixed seed: what an inference server sees.

``python -m tensorarena.trace.workloads [FOLDER]`` records them again (into the package's data
folder by default); :func:`shipped_traces` finds the files. The files keep the op, id, size and
tag of each event, not its time (which changes from run to run), so that recording again on the
same versions of torch and transformers gives the same files. The sizes are chosen so that each
file stays small (tens of KiB) while the patterns are the real ones: a larger model repeats the
same calls with larger sizes.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from tensorarena._optional import require
from tensorarena.trace.csv_format import write_csv
from tensorarena.trace.model import Trace
from tensorarena.trace.torch_recorder import record_torch

__all__ = ["WORKLOADS", "record_workload", "shipped_traces"]


def _modules() -> tuple[Any, Any]:
    torch = require("torch", extra="torch", feature="tensorarena.trace.workloads")
    transformers = require("transformers", extra="models", feature="tensorarena.trace.workloads")
    return torch, transformers


def training_step(*, layers: int = 2, hidden: int = 128, batch: int = 4, tokens: int = 64,
                  vocab: int = 2048) -> Trace:
    """Record one steady-state training step of a small GPT-2 (see the module docstring)."""
    torch, tf = _modules()
    torch.manual_seed(0)
    config = tf.GPT2Config(vocab_size=vocab, n_positions=tokens, n_embd=hidden, n_layer=layers,
                           n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                           bos_token_id=0, eos_token_id=0)
    model = tf.GPT2LMHeadModel(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, vocab, (batch, tokens))

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()

    step()  # the optimizer's state is made here, outside the recording
    with record_torch(name="training_step") as recording:
        step()
    return recording.trace


def decoding(*, layers: int = 2, hidden: int = 128, batch: int = 2, prompt: int = 32,
             new_tokens: int = 20, vocab: int = 2048) -> Trace:
    """Record greedy generation with a growing KV cache by a small Llama."""
    torch, tf = _modules()
    torch.manual_seed(0)
    config = tf.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                            num_hidden_layers=layers, num_attention_heads=4,
                            num_key_value_heads=2, max_position_embeddings=prompt + new_tokens)
    model = tf.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, vocab, (batch, prompt))
    mask = torch.ones_like(ids)
    with torch.no_grad(), record_torch(name="decoding") as recording:
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                       min_new_tokens=new_tokens, do_sample=False, use_cache=True,
                       pad_token_id=0)
    return recording.trace


def serving(*, layers: int = 2, hidden: int = 128, requests: int = 16, vocab: int = 2048,
            seed: int = 0) -> Trace:
    """Record requests of varying batch size and sequence length to a small BERT encoder."""
    torch, tf = _modules()
    torch.manual_seed(0)
    config = tf.BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                           num_attention_heads=4, intermediate_size=2 * hidden,
                           max_position_embeddings=128)
    model = tf.BertModel(config).eval()
    rng = random.Random(seed)
    shapes = [(rng.randint(1, 8), rng.choice((8, 16, 24, 32, 48, 64, 96, 128)))
              for _ in range(requests)]
    inputs = [torch.randint(0, vocab, shape) for shape in shapes]
    with torch.no_grad(), record_torch(name="serving") as recording:
        for ids in inputs:
            model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state.sum()
    return recording.trace


#: name -> recorder, in the order they are listed.
WORKLOADS: dict[str, Callable[[], Trace]] = {
    "training_step": training_step,
    "decoding": decoding,
    "serving": serving,
}


def record_workload(name: str) -> Trace:
    """Record the workload ``name`` now (needs the ``models`` extra)."""
    return WORKLOADS[name]()


def shipped_traces() -> dict[str, Path]:
    """The traces shipped with the package: name -> path of its CSV file."""
    folder = resources.files("tensorarena.trace") / "data"
    found = {}
    for name in WORKLOADS:
        path = Path(str(folder / f"{name}.csv"))
        if path.exists():
            found[name] = path
    return found


def main(argv: list[str] | None = None) -> int:
    """Record every workload into FOLDER (default: the package's data folder)."""
    argv = sys.argv[1:] if argv is None else argv
    folder = Path(argv[0]) if argv else Path(str(resources.files("tensorarena.trace"))) / "data"
    folder.mkdir(parents=True, exist_ok=True)
    for name, make in WORKLOADS.items():
        trace = make()
        write_csv(trace, folder / f"{name}.csv", columns=("op", "id", "size", "tag"))
        summary = trace.summary()
        print(f"{name}: {summary.events} events, peak live {summary.peak_live_bytes} bytes",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
