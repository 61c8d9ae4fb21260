"""Static memory planning: lifetimes in, offsets out, checked by an independent validator."""

from tensorarena.planning.problem import Buffer, Plan, Problem, lower_bound
from tensorarena.planning.validate import is_valid, validate

__all__ = ["Buffer", "Plan", "Problem", "is_valid", "lower_bound", "validate"]
