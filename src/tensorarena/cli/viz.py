"""``tensorarena viz INPUT -o report.html [--png [FILE]]``: a memory timeline you can look at.

INPUT is a trace in any format :mod:`tensorarena.trace` reads (our CSV, RMM's log, a PyTorch
memory snapshot), or a snapshot written by ``tensorarena.report.dump_snapshot``; the format is
told by the content. A snapshot is drawn at its own addresses; a trace, which has none, is
replayed on a pool of ``--strategy`` over virtual memory first. The page is one self-contained
HTML file (:mod:`tensorarena.report.viz`); ``--png`` also writes the same charts as a picture.

Exit status 0, or 2 with one line on stderr for a malformed input, a bad option or a missing
optional dependency (it names the extra to install).
"""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["configure", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``viz`` command's arguments."""
    parser.add_argument("input", metavar="INPUT", help="a trace (CSV, RMM log) or a snapshot")
    parser.add_argument("-o", "--output", metavar="HTML",
                        help="the page to write (default: INPUT's name with .html)")
    parser.add_argument("--png", nargs="?", const="", metavar="FILE",
                        help="also write the charts as a PNG (default: the page's name, .png)")
    parser.add_argument("--strategy", default="best_fit",
                        help="placement strategy a trace is replayed with (default best_fit)")
    parser.add_argument("--device", type=int, default=None,
                        help="the device of a snapshot with several (default: the one used)")
    parser.add_argument("--max-points", type=int, default=2000,
                        help="points per curve before the curves are aggregated (default 2000)")
    parser.add_argument("--max-blocks", type=int, default=2000,
                        help="blocks drawn one by one before an occupancy map (default 2000)")


def run(args: argparse.Namespace) -> int:
    """Write the page (and the PNG); print where; return the exit status."""
    from tensorarena.report.timeline import load_timeline
    from tensorarena.report.views import check_view_options
    from tensorarena.report.viz import write_html, write_png

    options = {"max_points": args.max_points, "max_blocks": args.max_blocks}
    check_view_options(**options)  # before a long load
    source = Path(args.input)
    output = Path(args.output) if args.output else source.with_suffix(".html")
    timeline = load_timeline(source, strategy=args.strategy, device=args.device)
    write_html(timeline, output, **options)
    print(f"wrote {output} ({timeline.steps:,} allocations and frees, "
          f"{timeline.blocks:,} blocks)")
    if args.png is not None:
        picture = Path(args.png) if args.png else output.with_suffix(".png")
        write_png(timeline, picture, **options)
        print(f"wrote {picture}")
    return 0
