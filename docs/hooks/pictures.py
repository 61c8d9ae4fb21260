"""MkDocs hook: the pictures of the concept pages, drawn at build time by tensorarena itself.

Each picture is a memory timeline written by :func:`tensorarena.report.viz.write_png` (the
``plot`` extra's matplotlib) from data the package makes: a shipped trace replayed on a pool of
one strategy, or a static plan's offsets. The PNGs are added to the site as generated files, so
the pages link them like any other file and ``--strict`` checks the links; a picture whose code
fails fails the build. Nothing is fetched and no screenshot is kept in the repository.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

_DPI = 55  # write_png's figure is 12 x 12 inches: about 660 pixels wide


def _trace_on(strategy: str, trace: str = "training_step") -> Callable[[Path], None]:
    def draw(path: Path) -> None:
        from tensorarena.report import timeline_from_events
        from tensorarena.report.viz import write_png
        from tensorarena.trace import iter_events, shipped_traces

        events = iter_events(shipped_traces()[trace])
        timeline = timeline_from_events(events, strategy=strategy, name=f"{trace} on {strategy}")
        write_png(timeline, path, dpi=_DPI)

    return draw


def _snapshot_of_plan(plan: Any) -> dict[str, Any]:
    """A PyTorch-style memory snapshot whose addresses are the plan's offsets.

    At each time step frees come before allocations: lifetimes are half-open ``[start, end)``.
    """
    actions: list[tuple[int, int, dict[str, Any]]] = []
    for buffer, offset in zip(plan.problem.buffers, plan.offsets, strict=True):
        frame = [{"filename": buffer.id, "line": 0, "name": buffer.id}]
        actions.append((buffer.start, 1, {"action": "alloc", "addr": offset,
                                          "size": buffer.nbytes, "frames": frame}))
        actions.append((buffer.end, 0, {"action": "free_completed", "addr": offset,
                                        "size": buffer.nbytes}))
    actions.sort(key=lambda item: (item[0], item[1]))
    trace = [dict(entry, time_us=time) for time, _, entry in actions]
    segment = {"device": 0, "address": 0, "total_size": plan.height, "blocks": []}
    return {"segments": [segment], "device_traces": [trace]}


def _plan(path: Path) -> None:
    from tensorarena.planning import Buffer, Problem, plan
    from tensorarena.report import timeline_from_snapshot
    from tensorarena.report.viz import write_png

    kib = 1024
    problem = Problem([
        Buffer("embed", 0, 3, 96 * kib), Buffer("attn", 1, 4, 64 * kib),
        Buffer("scores", 2, 3, 128 * kib), Buffer("mlp_in", 3, 6, 96 * kib),
        Buffer("mlp_act", 4, 6, 160 * kib), Buffer("mlp_out", 6, 8, 96 * kib),
        Buffer("norm", 5, 7, 32 * kib), Buffer("logits", 7, 9, 128 * kib),
    ], name="a small plan")
    result = plan(problem)
    timeline = timeline_from_snapshot(_snapshot_of_plan(result),
                                      name=f"{problem.name}: height {result.height // kib} KiB, "
                                           f"lower bound {problem.lower_bound() // kib} KiB")
    write_png(timeline, path, dpi=_DPI, max_blocks=100)


#: picture (path in the site) -> how to draw it
PICTURES: dict[str, Callable[[Path], None]] = {
    "concepts/pictures/best_fit.png": _trace_on("best_fit"),
    "concepts/pictures/buddy.png": _trace_on("buddy"),
    "concepts/pictures/decoding.png": _trace_on("best_fit", "decoding"),
    "concepts/pictures/plan.png": _plan,
}


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    with tempfile.TemporaryDirectory() as folder:
        for uri, draw in PICTURES.items():
            path = Path(folder) / Path(uri).name
            draw(path)
            files.append(File.generated(config, uri, content=path.read_bytes()))
    return files
