"""Re-render the recorded HTML viewers under docs/ with the current viewer page (viewer.html,
viewer.css, viewer.js), keeping each one's recorded data and title: a recorded report never ships
an old viewer. `make docs` runs it; tests/viz/test_docs_viewers.py fails when one has drifted.

    python scripts/refresh_viewers.py            # every docs/**/viewer.html
    python scripts/refresh_viewers.py --check    # exit 1 and name the stale ones, change nothing
"""

from __future__ import annotations

import argparse
import html
import json
import re
import sys
from pathlib import Path

from attnkit._files import atomic_path
from attnkit.viz.html import render_page

DOCS = Path(__file__).resolve().parents[1] / "docs"
DATA = re.compile(r'<script id="attnkit-data" type="application/json">(.*?)</script>', re.S)
TITLE = re.compile(r"<title>(.*?)</title>", re.S)
VIEW_KEYS = {"L", "S", "coverage", "heads", "index", "k", "keys", "layers", "name", "queries", "self", "thumb", "tk",
             "tq", "weight"}


def rerendered(page: str, path: Path) -> str:
    """``page`` rendered again with the current viewer, its data and title kept."""
    data, title = DATA.search(page), TITLE.search(page)
    if data is None or title is None:
        raise ValueError(f"{path}: not an attnkit viewer page (no data block or title)")
    payload = json.loads(data.group(1))
    for view in payload["views"]:
        if set(view) != VIEW_KEYS:
            raise ValueError(f"{path}: recorded with another data format ({sorted(set(view) ^ VIEW_KEYS)}); "
                             "re-run the command that made it instead")
    return render_page(html.escape(html.unescape(title.group(1))), data.group(1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report viewers that differ from a re-render")
    args = parser.parse_args(argv)
    stale = []
    for path in sorted(DOCS.rglob("viewer.html")):
        page = path.read_text(encoding="utf-8")
        fresh = rerendered(page, path)
        if fresh != page:
            stale.append(path)
            if not args.check:
                with atomic_path(path) as tmp:
                    tmp.write_text(fresh, encoding="utf-8")
    verb = "stale" if args.check else "re-rendered"
    print(f"{verb}: " + (", ".join(str(p.relative_to(DOCS.parent)) for p in stale) or "none"))
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
