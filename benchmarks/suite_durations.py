"""The testing page's table of the slowest tests, from the times the last
run of the whole suite left in ``build/test-durations.json`` (written by
``tests/conftest.py`` after ``bash .ci/run`` or ``pytest tests``).

    python benchmarks/suite_durations.py [--markdown docs/TESTING.md] [--top 10]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import List

import docs_section

ROOT = Path(__file__).resolve().parent.parent
DURATIONS = ROOT / "build" / "test-durations.json"


def lines(record: dict, top: int) -> List[str]:
    tests = sorted(record["tests"].items(), key=lambda item: -item[1])
    total = sum(seconds for _, seconds in tests)
    rows = [(f"`{name}`", f"{seconds:.0f}", f"{100 * seconds / total:.1f}%") for name, seconds in tests[:top]]
    return [f"The whole suite: {len(tests)} tests, {record['seconds'] / 60:.1f} minutes from start to end "
            f"(exit status {record['status']}); the {top} slowest take {sum(s for _, s in tests[:top]) / 60:.1f} "
            "of them:", "", *docs_section.table(["test", "seconds", "share of the suite"], rows)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", metavar="PATH", help="write the table as this script's section of PATH")
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args()
    if not DURATIONS.exists():
        print(f"{DURATIONS} is missing: run the whole suite first (bash .ci/run)", file=sys.stderr)
        return 1
    docs_section.publish("suite_durations.py", sys.argv[1:], lines(json.loads(DURATIONS.read_text()), args.top),
                         args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
