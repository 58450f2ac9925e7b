"""The README's sample of what ``bash .ci/example`` prints: runs it, keeps
the lines a reader needs (the epochs, the server's summary, the final line),
and writes them, with the date, the machine and the time from start to exit,
as the README's generated section.  Nothing in that section is typed by hand.

    python benchmarks/example_output.py [--markdown README.md]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import docs_section

ROOT = Path(__file__).resolve().parent.parent
COMMAND = ["bash", ".ci/example"]
#: What the sample keeps: the example's epoch lines, the server's first three
#: summary lines (behind ``[rank 0]``), and the final line.
KEPT = re.compile(r"^(epoch \d+:|final test accuracy|\[rank 0\] hvd_dcasgd server: "
                  r"(\d+ updates|staleness|pushes per worker))")
WIDTH = 118  # a long line of the server's is cut here, with "..."


def sample(output: str) -> List[str]:
    """The kept lines of the example's ``output``, the server's each at most :data:`WIDTH` characters."""
    kept = []
    for line in output.splitlines():
        line = re.sub(r"^\[\d+,\d+\]<std\w+>:", "", line).rstrip()  # mpirun's --tag-output, if a user set it
        if KEPT.match(line):  # the final line whole: it names the method and its constants
            whole = len(line) <= WIDTH or line.startswith("final test accuracy")
            kept.append(line if whole else line[:WIDTH - 4].rstrip() + " ...")
    return kept


def section(lines: List[str], seconds: float) -> List[str]:
    """The section's text under the line naming the command, the date and the machine."""
    return [f"`{' '.join(COMMAND)}` took {seconds:.0f} s from start to exit (the set-up found everything "
            "installed); the asynchronous runs differ in their last digits. It printed (trimmed; the lines "
            "behind `[rank 0]` are the server's summary):", "", "```", *lines, "```"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", metavar="PATH", help="write the sample as this script's section of PATH")
    args = parser.parse_args()
    start = time.monotonic()
    run = subprocess.run(COMMAND, cwd=ROOT, capture_output=True, text=True, timeout=900)
    seconds = time.monotonic() - start
    if run.returncode != 0:
        print(run.stdout[-4000:], run.stderr[-4000:], sep="\n")
        print(f"{' '.join(COMMAND)} ended with status {run.returncode}; nothing written", file=sys.stderr)
        return 1
    docs_section.publish("example_output.py", sys.argv[1:], section(sample(run.stdout + run.stderr), seconds),
                         args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
