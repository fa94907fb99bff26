"""The ``attnkit`` command: thin argument parsing, one sub-command per tool."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["main"]


def _tour(args: argparse.Namespace) -> int:
    from .tour import run_tour

    for number, stop in enumerate(run_tour(args.out, seed=args.seed), 1):
        print(f"[{number:2d}] {stop.name}")
        for name, value in stop.facts.items():
            print(f"       {name}: {value}")
        if stop.picture is not None:
            print(f"       heatmap: {stop.picture}")
    print(f"\nheatmaps written to {Path(args.out).resolve()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnkit", description="Attention mechanisms: library and workbench.")
    commands = parser.add_subparsers(dest="command", required=True)
    tour = commands.add_parser("tour", help="run every mechanism once and write one heatmap PNG per mechanism")
    tour.add_argument("--out", type=Path, default=Path("out/tour"), help="folder for the PNGs (default out/tour)")
    tour.add_argument("--seed", type=int, default=0)
    tour.set_defaults(run=_tour)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
