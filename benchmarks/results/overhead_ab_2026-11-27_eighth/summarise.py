"""The before/after ranges of each case of an A/B folder (before_N.json, after_N.json from benchmarks/overhead.py).

    python benchmarks/results/overhead_ab_2026-11-27_eighth/summarise.py FOLDER
"""

import glob
import json
import sys

folder = sys.argv[1]
rows: dict = {}
for side in ("before", "after"):
    for path in sorted(glob.glob(f"{folder}/{side}_*.json")):
        for row in json.load(open(path))["results"]:
            ratio = row["attnkit_us"] / row["torch_us"]
            rows.setdefault(row["case"], {}).setdefault(side, []).append((row["attnkit_us"], ratio))


def span(values: list, index: int, digits: int) -> str:
    picked = [value[index] for value in values]
    return f"{min(picked):.{digits}f}-{max(picked):.{digits}f}" if picked else "-"


print(f"{'case':42s} {'before ratio':>14s} {'after ratio':>14s} {'before us':>16s} {'after us':>16s}")
for case, sides in rows.items():
    before, after = sides.get("before", []), sides.get("after", [])
    print(f"{case:42s} {span(before, 1, 2):>14s} {span(after, 1, 2):>14s} {span(before, 0, 1):>16s} "
          f"{span(after, 0, 1):>16s}")
