"""``tensorarena bench learned``: plans learned from the first steps, replayed without markers,
against best fit and PyTorch.

Not a test: it prints numbers (recorded in ``bench/RESULTS.md``, "learned plans"). For
each trace, in one run: ``best_fit`` (the default pool: best fit, default growth),
``pytorch_like`` (PyTorch's caching-allocator policy) and ``learned``
(:class:`tensorarena.learned.LearnedPlans` finding the steps itself), each over VirtualMemory:

* the three shipped traces (one training step; a decoder whose KV cache grows every token;
  requests of varying shapes): single steps or no exact repeat, so ``learned`` can at best match
  the pool there;
* ``training_step x8``: the shipped training step repeated eight times, the blocks it leaves
  live (the gradients) freed at the start of the next step, as ``zero_grad`` does; also run
  with a marker after each step (``step()``) rather than found without markers;
* ``gpt2_train x6`` / ``bert_serve x8`` (``--record``, needs torch and transformers): six real
  AdamW training steps of a two-layer GPT-2 from a fresh optimizer (the first step makes the
  optimizer's state: a warm-up), and eight fixed-shape requests to a two-layer BERT, recorded
  with ``record_torch``.

Columns: peak reserved over peak live for the whole trace (``footprint``), for the steps served
from a plan (``steady``, learned only), at the end, and ns per replayed event (learned includes
its planning).

    tensorarena bench learned [--record] [--json]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from tensorarena.learned import LearnedPlans
from tensorarena.memory.virtual import VirtualMemory
from tensorarena.trace.configs import configuration
from tensorarena.trace.formats import read_all
from tensorarena.trace.model import ALLOC, FREE, Event, Trace
from tensorarena.trace.replay import replay
from tensorarena.trace.workloads import shipped_traces

CONFIGS = ("best_fit", "pytorch_like", "learned")


def repeat_steps(trace: Trace, steps: int) -> Trace:
    """``trace`` run ``steps`` times; what one run leaves live is freed as the next begins."""
    events = list(trace)
    left: dict[int, int] = {}
    for event in events:
        if event.op == ALLOC:
            left[event.id] = event.nbytes
        else:
            left.pop(event.id)
    stride = max(e.id for e in events) + 1
    out: list[Event] = []
    previous: dict[int, int] = {}
    for k in range(steps):
        out += [Event(FREE, ident, nbytes) for ident, nbytes in previous.items()]
        out += [e._replace(id=e.id + k * stride) for e in events]
        previous = {ident + k * stride: nbytes for ident, nbytes in left.items()}
    out += [Event(FREE, ident, nbytes) for ident, nbytes in previous.items()]
    return Trace.from_events(out, name=f"{trace.name} x{steps}")


def marked_replay(step: Trace, steps: int) -> dict[str, Any]:
    """``step`` run ``steps`` times on LearnedPlans with a marker after each run (what
    ``repeat_steps`` replays without markers): whole-run and steady footprints."""
    plans = LearnedPlans(VirtualMemory())
    events = list(step)
    left: dict[int, tuple[int, int]] = {}
    live = peak = 0
    markers: list[float] = []  # seconds per step(): planning happens there
    for _ in range(steps):
        for address, nbytes in left.values():
            plans.deallocate(address, nbytes)
            live -= nbytes
        left = {}
        for event in events:
            if event.op == ALLOC:
                left[event.id] = (plans.allocate(event.nbytes), event.nbytes)
                live += event.nbytes
                peak = max(peak, live)
            else:
                plans.deallocate(left.pop(event.id)[0], event.nbytes)
                live -= event.nbytes
        began = time.perf_counter()
        plans.step()
        markers.append(time.perf_counter() - began)
    for address, nbytes in left.values():
        plans.deallocate(address, nbytes)
    report = plans.report()
    steady = report.steady_peak_reserved_bytes
    return {"footprint_ratio": round(report.peak_reserved_bytes / peak, 6),
            "steady_footprint_ratio": None if steady is None else round(steady / peak, 6),
            "served": report.served, "allocations": report.allocations,
            "marker_seconds": [round(t, 3) for t in markers],
            "fallbacks": {r.value: n for r, n in report.fallbacks().items() if n}}


def recorded_traces() -> dict[str, Trace]:
    """Real multi-step loops recorded with record_torch (torch and transformers needed)."""
    import torch
    import transformers as tf

    from tensorarena.trace.torch_recorder import record_torch

    torch.manual_seed(0)
    config = tf.GPT2Config(vocab_size=2048, n_positions=64, n_embd=128, n_layer=2, n_head=4,
                           resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = tf.GPT2LMHeadModel(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 2048, (4, 64))
    with record_torch(name="gpt2_train x6") as training:
        for _ in range(6):
            optimizer.zero_grad(set_to_none=True)
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
    bert = tf.BertModel(tf.BertConfig(vocab_size=2048, hidden_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, intermediate_size=256))
    bert.eval()  # type: ignore[no-untyped-call]  # transformers' stubs leave it untyped
    request = torch.randint(0, 2048, (4, 64))
    with torch.no_grad(), record_torch(name="bert_serve x8") as serving:
        for _ in range(8):
            bert(input_ids=request).last_hidden_state.sum()
    return {"gpt2_train x6": training.trace, "bert_serve x8": serving.trace}


def measure(trace: Trace) -> dict[str, Any]:
    row: dict[str, Any] = {"peak_live": trace.summary().peak_live_bytes}
    for name in CONFIGS:
        row[name] = configuration(name).run(trace).as_dict()
    plans = LearnedPlans(VirtualMemory(), detect_steps=True)
    replay(trace, plans)
    report = plans.report()
    row["learned_report"] = {"period": report.period, "steps": report.steps,
                             "served": report.served, "allocations": report.allocations,
                             "plans": len(report.plans),
                             "fallbacks": {r.value: n for r, n in report.fallbacks().items()
                                           if n}}
    return row


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the benchmark's options to ``parser``."""
    parser.add_argument("--record", action="store_true", help="also record real torch loops")
    parser.add_argument("--json", action="store_true", help="print one JSON object, no table")


def run(args: argparse.Namespace) -> int:
    """Replay every trace on the three configurations and print the table (or JSON); return 0."""
    traces: dict[str, Trace] = {}
    for name, path in shipped_traces().items():
        traces[name] = Trace.from_events(read_all(path), name=name)
    traces["training_step x8"] = repeat_steps(traces["training_step"], 8)
    if args.record:
        traces.update(recorded_traces())
    rows = {name: measure(trace) for name, trace in traces.items()}
    marked = marked_replay(traces["training_step"], 8)
    if args.json:
        print(json.dumps({"replays": rows, "training_step x8 with markers": marked}))
        return 0
    print(f"{'trace':18} {'config':13} {'footprint':>9} {'steady':>7} {'at end':>7} "
          f"{'ns/op':>8}")
    for name, row in rows.items():
        for config in CONFIGS:
            r = row[config]
            steady = r["steady_footprint_ratio"]
            print(f"{name:18} {config:13} {r['footprint_ratio']:9.3f} "
                  f"{'-' if steady is None else f'{steady:.3f}':>7} "
                  f"{r['end_footprint_ratio']:7.3f} {r['ns_per_op']:8,.0f}")
        print(f"{'':18} learned: {row['learned_report']}")
    print(f"training_step x8 with a marker after each step: {marked}")
    return 0

