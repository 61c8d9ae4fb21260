"""``tensorarena bench eager``: real eager PyTorch loops under ``tensorarena.torch.learned()``.

Four loops from ``transformers`` at small configs: GPT-2 and BERT trained with AdamW, a ResNet
training step (``ResNetForImageClassification``), and Llama's ``generate()`` with a static cache
(one request per step). Each runs ``--steps`` steps (5 at least) under each allocator, every
configuration in its own fresh Python process (process memory is only comparable between
processes that ran nothing else: :mod:`tensorarena.bench.exec_subprocess`):

* ``learned``: ``tensorarena.torch.learned()``, a marker between steps;
* ``pool``: ``tensorarena.torch.use(Pool(HostMemory()))`` (best fit, default growth);
* ``pytorch_like``: ``use(PyTorchLike(HostMemory()))``: PyTorch's caching-allocator policy
  (:mod:`tensorarena.trace.pytorch_like`) serving the same allocation stream, live;
* ``glibc``: no route (torch's CPU allocator, malloc): resident-memory growth above the baseline
  taken after the model is built (``VmHWM``, reset through ``/proc/self/clear_refs``);
* ``timing``: three copies of the model in one process, stepped in turn, one under torch's
  allocator, one under ``learned()`` and one under ``learned(native=False)`` (every allocation
  a Python call to the plans), each route installed for its step only: the median step time of
  each, from the 4th step on.

``--threads N`` sets torch's intra-op threads in every process (default: torch's own), so that
step times on a machine shared with other work are not dominated by oversubscribed threads.
``--zero-grad first`` calls the optimizer's ``zero_grad()`` at the start of each training step
instead of at its end (``last``, the default): the gradients then outlive their step and are
freed by the next one, a common loop shape that learned plans must serve cyclically;
``middle`` calls it between the forward and the backward pass (the activations then live
across those frees).

The *steady* window is every step after the first three (learning has settled by then: the
first step is recorded, the second planned again cyclically, see :mod:`tensorarena.learned`).
Each configuration reports the peak of live bytes that went through it in the window and the
peak reserved there (the resource's reserved bytes; for glibc the resident growth), and the
peak reserved over the whole run. Every step's fingerprint (the loss and a hash of every
gradient, or the generated tokens) is compared across configurations: ``bit_identical``.
A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import copy
import gc
import hashlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from tensorarena._version import build

__all__ = ["MODELS", "configure", "measure", "run", "worker"]

MODELS = ("gpt2", "bert", "resnet", "llama")
ZERO_GRAD = ("last", "first", "middle")  #: where a training step calls ``zero_grad()``
MEMORY_CONFIGS = ("learned", "pool", "pytorch_like", "glibc")
WARM_STEPS = 3  #: steps before the steady window


# --- the loops ----------------------------------------------------------------------------------

def _config(kind: str, **options: Any) -> Any:
    """A ``transformers`` config (their constructors take ``**kwargs`` that stubs do not see)."""
    import transformers

    return getattr(transformers, kind)(**options)


def _loop(name: str, zero_grad: str = "last") -> tuple[Any, Callable[[Any, int, Any], str]]:
    """A fresh model and its step (``step(model, number, state) -> fingerprint``), calling
    ``zero_grad()`` at the step's start, end, or before the backward pass (``zero_grad``:
    ``"first"``, ``"last"`` or ``"middle"``)."""
    import torch
    import transformers

    torch.manual_seed(0)
    ids = torch.randint(0, 512, (4, 64), generator=torch.Generator().manual_seed(1))
    if name == "gpt2":
        model: Any = transformers.GPT2LMHeadModel(_config("GPT2Config",
            n_layer=2, n_embd=128, n_head=4, vocab_size=512, n_positions=64, bos_token_id=0,
            eos_token_id=0,
            attn_implementation="eager"))
    elif name == "bert":
        model = transformers.BertForMaskedLM(_config("BertConfig",
            num_hidden_layers=2, hidden_size=128, num_attention_heads=4, intermediate_size=512,
            vocab_size=512, max_position_embeddings=64, attn_implementation="eager"))
    elif name == "resnet":
        model = transformers.ResNetForImageClassification(_config("ResNetConfig",
            embedding_size=16, hidden_sizes=[16, 32, 64], depths=[1, 1, 1], num_labels=10))
        images = torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(1))
        labels = torch.arange(4)
    elif name == "llama":
        model = transformers.LlamaForCausalLM(_config("LlamaConfig",
            num_hidden_layers=2, hidden_size=128, num_attention_heads=4, num_key_value_heads=4,
            intermediate_size=256, vocab_size=512, max_position_embeddings=128,
            bos_token_id=0, eos_token_id=None, pad_token_id=0))
        model.eval()

        def decode(model: Any, number: int, state: Any) -> str:
            with torch.no_grad():
                tokens = model.generate(ids[:, :16], max_new_tokens=16, do_sample=False,
                                        cache_implementation="static")
            return hashlib.sha1(tokens.numpy().tobytes()).hexdigest()[:16]

        return model, decode
    else:
        raise ValueError(f"unknown model {name!r}")

    def train(model: Any, number: int, state: Any) -> str:
        if zero_grad == "first":
            state.zero_grad()
        torch.manual_seed(100 + number)
        if name == "resnet":
            loss = model(pixel_values=images, labels=labels).loss
        else:
            loss = model(input_ids=ids, labels=ids).loss
        if zero_grad == "middle":
            state.zero_grad()
        loss.backward()
        digest = hashlib.sha1(loss.detach().numpy().tobytes())
        for parameter in model.parameters():
            digest.update(parameter.grad.numpy().tobytes())
        state.step()
        if zero_grad == "last":
            state.zero_grad()
        return f"{loss.item():.6f}/{digest.hexdigest()[:16]}"

    return model, train


def _optimizer(model: Any) -> Any:
    import torch

    return torch.optim.AdamW(model.parameters(), lr=1e-3)


# --- one configuration, in its own process ------------------------------------------------------

def _memory(name: str, config: str, steps: int, zero_grad: str) -> dict[str, Any]:
    from tensorarena.bench import process_memory
    from tensorarena.memory import HostMemory, Pool
    from tensorarena.torch import learned, use
    from tensorarena.trace import PyTorchLike

    model, step = _loop(name, zero_grad)
    state = _optimizer(model)
    gc.collect()
    baseline = process_memory.rss() or 0
    fingerprints: list[str] = []
    result: dict[str, Any] = {}
    if config == "glibc":
        process_memory.reset_peak()
        for number in range(steps):
            if number == WARM_STEPS:
                result["peak_reserved"] = (process_memory.peak_rss() or 0) - baseline
                result["peak_reset"] = process_memory.reset_peak()
            fingerprints.append(step(model, number, state))
        result["steady_reserved"] = (process_memory.peak_rss() or 0) - baseline
        result["peak_reserved"] = max(result["peak_reserved"], result["steady_reserved"])
        return {**result, "fingerprints": fingerprints}
    if config == "learned":
        context: Any = learned()
        resource: Any = context.plans
    else:
        resource = (Pool(HostMemory(), strategy="best_fit") if config == "pool"
                    else PyTorchLike(HostMemory()))
        context = use(resource)
    with context:
        for number in range(steps):
            if number == WARM_STEPS:
                result["peak_reserved"] = resource.statistics().reserved_bytes.peak
                resource.reset_peak_stats()
            fingerprints.append(step(model, number, state))
            if config == "learned":
                context.step()
        stats = resource.statistics()
        result.update(steady_live=stats.requested_bytes.peak,
                      steady_reserved=stats.reserved_bytes.peak)
        result["peak_reserved"] = max(result["peak_reserved"], result["steady_reserved"])
        if config == "learned":
            report = context.report()
            result.update(served=report.served, fell_back=report.fell_back,
                          arena_bytes=report.arena_bytes,
                          arena_lower_bound=sum(p.lower_bound for p in report.plans),
                          fallbacks={r.value: n for r, n in report.fallbacks().items() if n})
    return {**result, "fingerprints": fingerprints}


def _timing(name: str, steps: int, zero_grad: str) -> dict[str, Any]:
    from tensorarena.torch import learned

    model, step = _loop(name, zero_grad)
    twins = {"learned": copy.deepcopy(model), "learned_python": copy.deepcopy(model)}
    states = {"default": _optimizer(model), **{k: _optimizer(m) for k, m in twins.items()}}
    times: dict[str, list[float]] = {k: [] for k in states}
    fingerprints: dict[str, list[str]] = {k: [] for k in states}
    contexts = {"learned": learned(), "learned_python": learned(native=False)}
    for context in contexts.values():
        context.route.uninstall()
    for number in range(steps):
        start = time.perf_counter()
        fingerprints["default"].append(step(model, number, states["default"]))
        times["default"].append(time.perf_counter() - start)
        for key, context in contexts.items():
            context.route.install()
            start = time.perf_counter()
            fingerprints[key].append(step(twins[key], number, states[key]))
            context.step()
            times[key].append(time.perf_counter() - start)
            context.route.uninstall()
    for context in contexts.values():
        context.close()
    medians = {k: statistics.median(v[WARM_STEPS:]) * 1e3 for k, v in times.items()}
    return {"ms_default": medians["default"], "ms_learned": medians["learned"],
            "ms_learned_python": medians["learned_python"],
            "fingerprints_default": fingerprints["default"],
            "fingerprints_python": fingerprints["learned_python"],
            "fingerprints": fingerprints["learned"]}


def worker(argv: list[str]) -> None:
    """A configuration's process: ``worker([model, config, steps, threads, zero_grad])`` prints
    one JSON line (``threads``, optional: torch's intra-op threads; 0 or absent: torch's
    default; ``zero_grad``, optional: ``first``, ``middle`` or ``last``, the default)."""
    name, config, steps = argv[0], argv[1], int(argv[2])
    zero_grad = argv[4] if len(argv) > 4 else "last"
    if len(argv) > 3 and int(argv[3]) > 0:
        import torch

        torch.set_num_threads(int(argv[3]))
    result = (_timing(name, steps, zero_grad) if config == "timing"
              else _memory(name, config, steps, zero_grad))
    print(json.dumps(result))


def _in_process(name: str, config: str, steps: int, timeout: float, threads: int,
                zero_grad: str) -> dict[str, Any]:
    code = "import sys; from tensorarena.bench.eager import worker; worker(sys.argv[1:])"
    try:
        done = subprocess.run([sys.executable, "-c", code, name, config, str(steps), str(threads),
                               zero_grad],
                              capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"skipped": f"ran past {timeout:.0f} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        return {"skipped": tail[0]}
    return json.loads(lines[-1])  # type: ignore[no-any-return]


# --- the whole run ------------------------------------------------------------------------------

def measure(models: tuple[str, ...] = MODELS, *, steps: int = 6, timeout: float = 600.0,
            threads: int = 0, zero_grad: str = "last") -> dict[str, dict[str, Any]]:
    """Every configuration of every model, each in a fresh process; the ratios per model
    (``threads``: torch's intra-op threads in each, 0: torch's default; ``zero_grad``: where
    a training step calls it, ``first``, ``middle`` or ``last``)."""
    results: dict[str, dict[str, Any]] = {}
    for name in models:
        runs = {config: _in_process(name, config, steps, timeout, threads, zero_grad)
                for config in (*MEMORY_CONFIGS, "timing")}
        results[name] = {"runs": runs, **_ratios(runs)}
    return results


def _ratios(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The comparisons: each steady reserved over the steady live peak (the routed stream's,
    the same program in every process), whole-run peaks, step time, identical fingerprints."""
    learned = runs["learned"]
    live = learned.get("steady_live")
    out: dict[str, Any] = {"steady_live": live}
    for config in MEMORY_CONFIGS:
        reserved = runs[config].get("steady_reserved")
        out[f"steady_ratio_{config}"] = (None if reserved is None or not live
                                         else round(reserved / live, 3))
    if "peak_reserved" in learned and "peak_reserved" in runs["pool"]:
        out["peak_learned_over_pool"] = round(
            learned["peak_reserved"] / runs["pool"]["peak_reserved"], 3)
    timing = runs["timing"]
    if "ms_default" in timing:
        out["step_time_ratio"] = round(timing["ms_learned"] / timing["ms_default"], 3)
        out["step_time_ratio_python"] = round(
            timing["ms_learned_python"] / timing["ms_default"], 3)
    prints = [r["fingerprints"] for r in runs.values() if "fingerprints" in r]
    prints += [timing[k] for k in ("fingerprints_default", "fingerprints_python") if k in timing]
    out["bit_identical"] = len(prints) == len(runs) + 2 and all(p == prints[0] for p in prints)
    return out


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the benchmark's options to ``parser``."""
    parser.add_argument("--json", action="store_true", help="print one JSON object, no table")
    parser.add_argument("--steps", type=int, default=6, help="steps per loop (5 at least)")
    parser.add_argument("--model", action="append", choices=MODELS,
                        help="a loop to run (repeatable; default all)")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds per configuration's process")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch's intra-op threads per process (default: torch's)")
    parser.add_argument("--zero-grad", choices=ZERO_GRAD, default="last",
                        help="where a training step calls zero_grad(): at its start (first), "
                             "before the backward pass (middle) or at its end (last, the "
                             "default)")


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; print a table (or JSON with ``--json``); return the exit status."""
    from tensorarena.interop import torch_cpu_shim

    reason = torch_cpu_shim.unavailable()
    if reason:
        print(f"torch's CPU allocator shim cannot be built here: {reason}")
        return 1
    if args.steps < WARM_STEPS + 2:
        print(f"--steps must be {WARM_STEPS + 2} at least (a steady window of two steps)")
        return 2
    models = tuple(args.model or MODELS)
    results = measure(models, steps=args.steps, timeout=args.timeout, threads=args.threads,
                      zero_grad=args.zero_grad)
    if args.json:
        print(json.dumps({"build": build(), "steps": args.steps, "threads": args.threads,
                          "zero_grad": args.zero_grad, "models": results}, indent=2))
        return 0
    print(f"steady reserved / steady live peak, {args.steps} steps ({WARM_STEPS} warm-up)")
    print(f"{'model':>7} {'live MiB':>9} {'learned':>8} {'pool':>6} {'pt_like':>8} "
          f"{'glibc':>6} {'peak l/p':>9} {'time l/d':>9} {'py l/d':>7} {'ms dflt':>8} "
          f"{'identical':>9}")
    for name, r in results.items():
        def cell(value: float | None, width: int) -> str:
            return f"{'-' if value is None else f'{value:.2f}':>{width}}"
        live = r["steady_live"]
        timing = r["runs"]["timing"]
        print(f"{name:>7} {cell(live and live / 2**20, 9)} {cell(r['steady_ratio_learned'], 8)}"
              f" {cell(r['steady_ratio_pool'], 6)} {cell(r['steady_ratio_pytorch_like'], 8)}"
              f" {cell(r['steady_ratio_glibc'], 6)} {cell(r.get('peak_learned_over_pool'), 9)}"
              f" {cell(r.get('step_time_ratio'), 9)} {cell(r.get('step_time_ratio_python'), 7)}"
              f" {cell(timing.get('ms_default'), 8)}"
              f" {'yes' if r['bit_identical'] else 'NO':>9}")
        for config, result in r["runs"].items():
            if "skipped" in result:
                print(f"{'':>7} {config} skipped: {result['skipped']}")
    return 0
