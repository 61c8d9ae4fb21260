"""Activation memory of real models on a GPU: PyTorch's caching allocator vs our static plan.

For each architecture (random weights from a config, as in ``tensorarena.planning.models``), one
forward pass (inference) and one forward+backward pass (training) run on the GPU while PyTorch's
allocator records its peak; the same model's graph is planned by tensorarena on the CPU. Printed
side by side, in one run:

- ``torch_peak``      ``max_memory_allocated`` during the pass, minus what was allocated before
                      it (weights, inputs): the bytes PyTorch's allocator had live at its worst;
- ``torch_reserved``  the growth of ``max_memory_reserved``: what its caching pools held from CUDA;
- ``plan_height``     the arena our planner needs for every intermediate of the graph;
- ``lower_bound``     the peak of live intermediate bytes in the graph (no plan can be lower).

The two sides do not see identical programs (CUDA kernels pick their own workspaces and fused
attention), so read the ratio as "how much a static plan would save", not as an exact identity.
Usage: python bench/gpu_model_memory.py [--models gpt2,bert,llama,vit] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any


def _first_tensor(out: Any) -> Any:
    """The first tensor of a model's output (a tensor, a tuple, or a transformers ModelOutput)."""
    if hasattr(out, "backward"):
        return out
    values = out.values() if hasattr(out, "values") else out
    return next(v for v in values if hasattr(v, "backward"))


def _gpu_peak(torch: Any, model: Any, args: Any, kwargs: Any, training: bool) -> tuple[int, int]:
    def to_cuda(value: Any) -> Any:
        return value.cuda() if hasattr(value, "cuda") else value

    model = model.cuda()
    args = tuple(to_cuda(a) for a in args)
    kwargs = {k: to_cuda(v) for k, v in kwargs.items()}
    model.train(training)

    def step() -> None:
        if training:
            _first_tensor(model(*args, **kwargs)).float().sum().backward()
            model.zero_grad(set_to_none=True)
        else:
            with torch.no_grad():
                model(*args, **kwargs)

    step()  # warm-up: kernels choose their algorithms, lazy state is made
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base_allocated = torch.cuda.memory_allocated()
    base_reserved = torch.cuda.memory_reserved()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base_allocated
    reserved = torch.cuda.max_memory_reserved() - base_reserved
    model.cpu()
    return peak, reserved


def run(names: list[str], size: str) -> list[dict[str, Any]]:
    import torch

    from tensorarena.planning import plan
    from tensorarena.planning.models import build_model, model_problem

    rows: list[dict[str, Any]] = []
    for name in names:
        for training in (False, True):
            row: dict[str, Any] = {"model": name, "mode": "training" if training else "inference"}
            started = time.perf_counter()
            try:
                graph = model_problem(name, size=size, training=training)  # type: ignore[arg-type]
                planned = plan(graph.problem, "portfolio")
                model, (args, kwargs) = build_model(name, size=size)  # type: ignore[arg-type]
                peak, reserved = _gpu_peak(torch, model, args, kwargs, training)
                row.update(
                    buffers=len(graph.problem),
                    lower_bound=graph.problem.lower_bound(),
                    plan_height=planned.height,
                    torch_peak=peak,
                    torch_reserved=reserved,
                    torch_over_plan=round(peak / planned.height, 3) if planned.height else None,
                )
            except Exception as exc:  # one architecture failing must not hide the others
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            row["seconds"] = round(time.perf_counter() - started, 1)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt2,bert,llama,vit")
    parser.add_argument("--size", default="base", choices=("tiny", "base"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("skipped: torch is not installed")
        return 0
    if not torch.cuda.is_available():
        print("skipped: no CUDA device")
        return 0
    rows = run(args.models.split(","), args.size)
    if args.json:
        print(json.dumps({"device": torch.cuda.get_device_name(0), "rows": rows}))
        return 0
    mib = 1 << 20
    print(f"activation memory on {torch.cuda.get_device_name(0)} ({args.size} configs), MiB")
    print(f"{'model':<10} {'mode':<10} {'torch peak':>11} {'reserved':>9} {'plan':>8} "
          f"{'LB':>8} {'torch/plan':>10}")
    for r in rows:
        if "error" in r:
            print(f"{r['model']:<10} {r['mode']:<10} error: {r['error']}")
            continue
        print(f"{r['model']:<10} {r['mode']:<10} {r['torch_peak'] / mib:>11.1f} "
              f"{r['torch_reserved'] / mib:>9.1f} {r['plan_height'] / mib:>8.1f} "
              f"{r['lower_bound'] / mib:>8.1f} {r['torch_over_plan']:>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
