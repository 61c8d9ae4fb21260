"""The short table ``scripts/gpu_check.sh`` prints last: the headline figure of each GPU run.

Reads the ``step:`` lines the script wrote into ``env.txt`` (one per step, with that step's own
pass/fail counts) and the JSON records the GPU benchmarks wrote into a folder
(``gpu_alloc.json``, ``gpu_transfer.json``, ``gpu_managed.json``, ``gpu_replay.json``), and
prints one line per claim, with the file to look in for the rest. A missing or failed run is a
line saying so, never a traceback. Usage: python bench/gpu_summary.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

MiB = 1 << 20


def _load(folder: Path, name: str) -> dict[str, Any] | None:
    path = folder / name
    try:
        lines = [line for line in path.read_text().splitlines() if line.startswith("{")]
        return json.loads(lines[-1]) if lines else None  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return None


def _missing(folder: Path, name: str) -> str:
    """Why a run left no record: its first line (``skipped: ...``), or that there is none."""
    try:
        first = (folder / name).read_text().strip().splitlines()
    except OSError:
        first = []
    return first[0][:100] if first else f"no result ({name})"


def _steps(folder: Path) -> list[str]:
    """The ``step:`` lines ``gpu_check.sh`` wrote into env.txt: one per step, its own counts."""
    try:
        lines = (folder / "env.txt").read_text().splitlines()
    except OSError:
        return []
    return [line for line in lines if line.startswith("step: ")]


def _lines(folder: Path) -> list[str]:
    out: list[str] = _steps(folder)
    if not out:  # a folder written by hand, without the script's step lines
        tests = folder / "pytest.txt"
        summary = [ln for ln in tests.read_text().splitlines() if " in " in ln and (
            "passed" in ln or "failed" in ln or "error" in ln)] if tests.exists() else []
        out.append(f"gpu tests          {summary[-1].strip('= ') if summary else 'no result'}")

    alloc = _load(folder, "gpu_alloc.json")
    if alloc:
        for nbytes in ("4096", str(MiB), str(64 * MiB)):
            row = alloc["sizes"].get(nbytes, {})
            cells = "  ".join(f"{k}={v:.2f}" for k, v in row.items() if isinstance(v, float))
            out.append(f"alloc+free µs {int(nbytes) // 1024:>6} KiB  {cells}")
    else:
        out.append(f"alloc+free         {_missing(folder, 'gpu_alloc.json')}")

    transfer = _load(folder, "gpu_transfer.json")
    if transfer:
        for nbytes, row in transfer["sizes"].items():
            cells = "  ".join(
                f"{kind}={m['h2d_gb_per_s']:.1f}/{m['d2h_gb_per_s']:.1f}"
                for kind, m in row.items() if "h2d_gb_per_s" in m
            )
            out.append(f"GB/s H2D/D2H {int(nbytes) // MiB:>5} MiB  {cells}")
    else:
        out.append(f"bandwidth          {_missing(folder, 'gpu_transfer.json')}")

    managed = _load(folder, "gpu_managed.json")
    if managed:
        for nbytes, row in managed["sizes"].items():
            if "error" in row:
                out.append(f"managed {int(nbytes) // MiB} MiB: error {row['error'][:80]}")
                continue
            out.append(
                f"managed ms {int(nbytes) // MiB:>5} MiB  device={row['device_ms']:.2f}  "
                f"faulting={row['managed_faulting_ms']:.2f}  "
                f"prefetched={row['managed_prefetched_ms']:.2f}  "
                f"host read {row['host_read_faulting_ms']:.1f} vs "
                f"{row['host_read_prefetched_ms']:.1f} prefetched"
            )
    else:
        out.append(f"managed            {_missing(folder, 'gpu_managed.json')}")

    replay = _load(folder, "gpu_replay.json")
    if replay:
        for r in replay["rows"]:
            if "error" in r:
                out.append(f"replay {r['model']} {r['mode']}: error {r['error'][:80]}")
                continue
            out.append(
                f"replay MiB {r['model']:<6} {r['mode']:<9} LB={r['lower_bound'] / MiB:.0f}  "
                f"ta_pool={r['ta_pool']['reserved_peak'] / MiB:.0f}  "
                f"torch={r['torch']['reserved_peak'] / MiB:.0f}  "
                f"µs/op {r['ta_pool']['us_per_op']:.1f} vs {r['torch']['us_per_op']:.1f}"
            )
    else:
        out.append(f"replay             {_missing(folder, 'gpu_replay.json')}")
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    folder = Path(args[0]) if args else Path(".")
    print("== summary (" + str(folder) + ")")
    for line in _lines(folder):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
