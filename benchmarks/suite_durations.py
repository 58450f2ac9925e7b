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
from typing import Dict, List

import docs_section

ROOT = Path(__file__).resolve().parent.parent
DURATIONS = ROOT / "build" / "test-durations.json"


def lines(record: dict, top: int) -> List[str]:
    """The run in one sentence, then its slowest tests and its slowest files."""
    tests = sorted(record["tests"].items(), key=lambda item: -item[1])
    total = sum(seconds for _, seconds in tests)
    processes = record.get("processes", 1)
    files: Dict[str, float] = {}
    for name, seconds in tests:
        files[name.split("::")[0]] = files.get(name.split("::")[0], 0.0) + seconds
    slowest_files = sorted(files.items(), key=lambda item: -item[1])[:top]
    side_by_side = (f", {processes} test processes side by side; the tests' own times add up to {total / 60:.1f} "
                    "minutes" if processes > 1 else "")
    return [f"The whole suite: {len(tests)} tests, {record['seconds'] / 60:.1f} minutes from start to end "
            f"(exit status {record['status']}){side_by_side}. The {top} slowest tests take "
            f"{sum(s for _, s in tests[:top]) / 60:.1f} minutes of them:", "",
            *docs_section.table(["test", "seconds", "share of the tests' time"],
                                [(f"`{name}`", f"{seconds:.0f}", f"{100 * seconds / total:.1f}%")
                                 for name, seconds in tests[:top]]),
            "", f"The {len(slowest_files)} slowest files:", "",
            *docs_section.table(["file", "tests", "seconds", "share of the tests' time"],
                                [(f"`{name}`", str(sum(t.split("::")[0] == name for t, _ in tests)), f"{seconds:.0f}",
                                  f"{100 * seconds / total:.1f}%") for name, seconds in slowest_files])]


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
