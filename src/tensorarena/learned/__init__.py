"""Plans learned from the first run of a repeating step, served from one planned arena.

    LearnedPlans(upstream=None, *, max_patterns=4, ...)   the resource (markers or detect_steps)
    LearnedPlansReport, PlanSummary, FallbackReason         what report() returns
    PeriodDetector, Period                                  finding steps without markers

The layer sits after :mod:`tensorarena.planning` (it plans) and before :mod:`tensorarena.trace`
(whose replay can run it).
"""

from tensorarena.learned.learned_plans import DEFAULT_LEARNED_NODE_LIMIT, LearnedPlans
from tensorarena.learned.period import Period, PeriodDetector
from tensorarena.learned.report import FallbackReason, LearnedPlansReport, PlanSummary

__all__ = [
    "DEFAULT_LEARNED_NODE_LIMIT",
    "FallbackReason",
    "LearnedPlans",
    "LearnedPlansReport",
    "Period",
    "PeriodDetector",
    "PlanSummary",
]
