"""The verdict heatmap of a saved report: ``python bench/heatmap.py REPORT.json OUT.png|OUT.svg``.

Draws ``bench/results/matrix-cpu-heatmap.png`` from ``bench/results/matrix-cpu.json``; the same
picture ``sglfix matrix --heatmap FILE`` draws after a run.
"""

from __future__ import annotations

import json
import sys

from sglfix.common.errors import ConfigError
from sglfix.report.heatmap import check_heatmap_path, write_heatmap


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        return 2
    source, target = argv
    try:
        check_heatmap_path(target, option="OUT")
    except ConfigError as exc:
        print(f"heatmap: error: {exc}", file=sys.stderr)
        return 2
    with open(source, encoding="utf-8") as fh:
        write_heatmap(json.load(fh), target)
    print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
