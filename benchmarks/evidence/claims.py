"""The predictions and rules of ``docs/results/PLAN.md`` (sections 5 to 7) as
data, and the verdict functions that apply them.  Nothing here depends on a
result; ``report.py`` gathers the records and applies them.

Every comparison is a paired difference a - b of final test error in points,
intention to treat (a run that did not train counts at 90%), over the
evaluation seeds; negative: a ends lower.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

ALPHA = 0.05
NONINFERIORITY = 1.0  # points: P4's margin
#: The commit that holds the plan, written before any run of this design (None: not committed yet).
PLAN_COMMIT: Optional[str] = "12230fd"
#: What was decided after a result of this design was read: (when, what, why).
POST_HOC: List[Tuple[str, str, str]] = []

#: The Holm family, at every M: (a, b) rows of the tables, a - b.
COMPARISONS: Tuple[Tuple[str, str], ...] = (
    ("adaptive", "none"),
    ("adaptive", "gap_aware"),
    ("adaptive", "adaptive_paper"),
    ("adaptive", "horovod"),
    ("adaptive@default", "none"),
)


@dataclass(frozen=True)
class Prediction:
    number: int
    text: str
    refuted_by: str


PREDICTIONS = (
    Prediction(1, "Bounded DC-ASGD-a trains in every seed at every M at its tuned values.",
               "any of its runs there that does not train"),
    Prediction(2, "Bounded DC-ASGD-a trains in every seed at every M at the package defaults before this study "
                  "(lambda_0 2, bound 1) and ASGD's tuned rate (out of the box).",
               "any of its runs there that does not train"),
    Prediction(3, "Its intention-to-treat mean test error is below ASGD's at every M.",
               "an M where the Holm-adjusted 95% interval of (DC-ASGD-a - ASGD) lies above 0 (not decided at an M "
               "where it holds 0)"),
    Prediction(4, f"It is not worse than Gap-Aware by more than {NONINFERIORITY:g} point.",
               f"an M where the upper end of the Holm-adjusted 95% interval of (DC-ASGD-a - Gap-Aware) is above "
               f"+{NONINFERIORITY:g} point"),
    Prediction(5, "The paper's unbounded DC-ASGD-a, tuned the same way, still does not train in at least one seed "
                  "at some M.", "its training in every seed at every M"),
)

RULES = [
    "A run **did not train** when its weights became NaN or Inf (the server refused the gradient) or its final "
    "error is at least 85% (ten balanced classes: chance is 90%).",
    "Every mean and comparison is **intention to treat**: a run that did not train counts at 90% error. The mean "
    "over the runs that trained, and how many did not, are shown beside it.",
    "Comparisons are paired by seed (a seed fixes the initial weights, the batches and the delays). The p-value is "
    "the paired t test's; Holm's correction runs over the whole family at once, each comparison counted once (a "
    "comparison whose two cells are the same runs, or the same runs as an earlier comparison, is left out).",
    "A comparison's **Holm-adjusted interval** is its t interval at the confidence level Holm's step-down tests it "
    "at (the i-th smallest p of m at 1 - 0.05 / (m - i + 1), every test after the first not rejected at that "
    "one's level): it excludes 0 exactly where the Holm-adjusted p is below 0.05.",
]


# --- verdicts ---------------------------------------------------------------------
def trains_everywhere(counts: Dict[int, Optional[Tuple[int, int]]], seeds: int) -> str:
    """P1, P2: ``counts`` M -> (runs that did not train, runs recorded), or
    ``None`` where none is recorded yet."""
    if any(c is not None and c[0] > 0 for c in counts.values()):
        return "refuted"
    if all(c is not None and c[1] == seeds for c in counts.values()):
        return "holds"
    return "pending"


def fails_somewhere(counts: Dict[int, Optional[Tuple[int, int]]], seeds: int) -> str:
    """P5: the converse of ``trains_everywhere``."""
    return {"refuted": "holds", "holds": "refuted", "pending": "pending"}[trains_everywhere(counts, seeds)]


def below_at(interval: Tuple[float, float]) -> str:
    """P3 at one M, on the Holm-adjusted interval of (DC-ASGD-a - ASGD)."""
    low, high = interval
    return "holds" if high < 0 else "refuted" if low > 0 else "not decided"


def noninferior_at(interval: Tuple[float, float]) -> str:
    """P4 at one M, on the Holm-adjusted interval of (DC-ASGD-a - Gap-Aware)."""
    return "refuted" if interval[1] > NONINFERIORITY else "holds"


def over_every_m(at: Dict[int, Optional[str]]) -> str:
    """A prediction over every M from its verdicts at each (``None``: not
    compared yet): refuted at one M refutes it; it holds where it holds at
    every M; otherwise not decided, or pending while an M is missing."""
    found = list(at.values())
    if "refuted" in found:
        return "refuted"
    if None in found:
        return "pending"
    return "holds" if all(v == "holds" for v in found) else "not decided"


@dataclass(frozen=True)
class Default:
    """The rule for the package default, applied: ``kept`` (None: not decided
    yet), the lambda_0 and bound it takes where kept (the pair tuned at the
    most values of M, ties to the smaller), and the reasons where not."""

    kept: Optional[bool]
    lambda_0: Optional[float] = None
    bound: Optional[float] = None
    tuned_at: int = 0
    reasons: Tuple[str, ...] = ()


def default_rule(p1: str, p2: str, p3_at: Dict[int, Optional[str]], tuned: Sequence[Tuple[float, float]],
                 failed: Dict[str, List[str]]) -> Default:
    """Bounded DC-ASGD-a stays the default where P1 and P2 hold and P3 is not
    refuted at any M; its lambda_0 and bound then become the (lambda_0,
    bound) pair tuned at the most values of M (``tuned``: one pair per M),
    ties to the smaller lambda_0, then bound.  ``failed``: "tuned" and
    "default", the cells (in words) where it did not train, for the reasons."""
    p3_refuted = [m for m, v in p3_at.items() if v == "refuted"]
    reasons = []
    if p1 == "refuted":
        reasons.append(f"it did not train in {', '.join(failed['tuned'])} at its tuned values (P1)")
    if p2 == "refuted":
        reasons.append(f"it did not train in {', '.join(failed['default'])} at the defaults before this study (P2)")
    if p3_refuted:
        reasons.append("its intention-to-treat error was above ASGD's at "
                       + ", ".join(f"M={m}" for m in sorted(p3_refuted)) + " (P3)")
    if reasons:
        return Default(False, reasons=tuple(reasons))
    if p1 != "holds" or p2 != "holds" or None in p3_at.values() or len(tuned) < len(p3_at):
        return Default(None)
    counts = Counter(tuned)
    pair = min(counts, key=lambda c: (-counts[c], c))
    return Default(True, pair[0], pair[1], counts[pair])


def default_sentence(rule: Default, workers: int) -> str:
    """The page's and the README's sentence on which method is the default."""
    if rule.kept is None:
        return ("The rule for the package default (plan, section 7) is decided once DC-ASGD-a's cells and its "
                "comparison with ASGD are recorded at every M.")
    if rule.kept:
        return (f"By the rule fixed before the runs, bounded DC-ASGD-a (`compensation=\"adaptive\"`) stays the "
                f"package default, with lambda_0 = {rule.lambda_0:g} and bound = {rule.bound:g} (the pair tuned at "
                f"{rule.tuned_at} of {workers} values of M): it trained in every seed at its tuned values and at "
                "the defaults before this study (lambda_0 2, bound 1), and its intention-to-treat error was above "
                "ASGD's at no M.")
    return ("By the rule fixed before the runs, this study does not support bounded DC-ASGD-a as the package "
            "default: " + "; ".join(rule.reasons) + ".")
