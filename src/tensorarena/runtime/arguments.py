"""A call's arguments against the ones a program was built with: their layout and baked values.

``torch.export`` (and ``make_fx``) bake every non-tensor argument into the graph: a program
built with ``n=3`` multiplies by 3 whatever ``n`` a later call passes, and a flag or a string
chose its branch once, at build. :class:`CallLayout` turns a call's ``(args, kwargs)`` into
the flat list of leaves the graph's placeholders take, refuses a call laid out otherwise (an
argument more or less, an unknown or a missing keyword, a container of another shape) with a
message that says what the program takes and what it got, and compares the call's non-tensor
leaves (ints, floats, bools, strings, ``None``, inside containers too) with the values the
graph was built with.

Both checks are cheap where a call is laid out as at build: arguments that are leaves are taken
as they are (a pytree walk only for an argument that is a container), and the baked values are
compared as one tuple, their types first (so ``1``, ``1.0`` and ``True``, equal to Python but
not to the graph, differ).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tensorarena.errors import InvalidArgumentError, ShapeNotCoveredError

__all__ = ["BakedValues", "CallLayout"]


class BakedValues:
    """Values a graph has built in, at given indices of a flat list (index → (label, value)),
    checked as one tuple; ``advice`` ends the message of one that differs."""

    def __init__(self, baked: Mapping[int, tuple[str, Any]], advice: str = "") -> None:
        self._baked = dict(sorted(baked.items()))
        self._advice = advice
        positions = tuple(self._baked)
        self._values = tuple(value for _, value in self._baked.values())
        self._types = tuple(type(v) for v in self._values)
        self._getter: Callable[[Sequence[Any]], tuple[Any, ...]] | None = None
        if positions:
            getter = operator.itemgetter(*positions)
            # itemgetter of one index returns the item, not a 1-tuple: compare likewise.
            self._getter = getter if len(positions) > 1 else lambda flat: (getter(flat),)

    def __bool__(self) -> bool:
        return bool(self._baked)

    def moved(self, position: Callable[[int], int]) -> BakedValues:
        """The same values at other indices (``position(index)``): a placeholder list's."""
        return BakedValues({position(i): v for i, v in self._baked.items()}, self._advice)

    def check(self, flat: Sequence[Any]) -> None:
        """Raise :class:`ShapeNotCoveredError` where ``flat`` holds another value (or type)."""
        if self._getter is None:
            return
        got = self._getter(flat)
        # Types first: a tensor where a value was baked must not be compared with ==.
        if tuple(map(type, got)) != self._types or got != self._values:
            self._refuse(got)

    def key(self, flat: Sequence[Any]) -> tuple[Any, ...]:
        """``flat``'s values at the baked indices, with their types: equal for two calls exactly
        when one graph serves both (hashable where the values are)."""
        got = self._getter(flat) if self._getter is not None else ()
        # A NaN is never equal to itself: as a key, every NaN is one value.
        return tuple((type(v), "nan" if isinstance(v, float) and math.isnan(v) else v)
                     for v in got)

    def _refuse(self, got: tuple[Any, ...]) -> None:
        for (label, expected), value in zip(self._baked.values(), got, strict=True):
            if not _same(value, expected):
                shown, built = repr(value), repr(expected)
                if shown == built:  # 1 and 1.0 print apart; a subclass may not
                    shown += f" ({type(value).__name__})"
                    built += f" ({type(expected).__name__})"
                raise ShapeNotCoveredError(
                    f"argument {label!r} is {shown}; the program was built with "
                    f"{label}={built}, which its graph has built in (torch.export "
                    f"specialises every non-tensor argument).{self._advice}",
                    dim=label, got=value, expected=expected,
                )


class CallLayout:
    """The layout of ``(args, kwargs)`` given by ``in_spec`` (a pytree ``TreeSpec`` of the pair),
    with ``names`` for the positional arguments where known and ``baked``, flat leaf index →
    value, for the leaves whose value the graph has built in. ``advice`` ends the message of a
    baked value that differs (what to do instead)."""

    def __init__(self, in_spec: Any, *, names: Sequence[str] = (),
                 baked: Mapping[int, Any] | None = None, advice: str = "") -> None:
        from torch.utils import _pytree as pytree

        self._in_spec = in_spec
        positional, keywords = _children(in_spec)
        self._positional: list[Any] = _children(positional)
        self._keys: tuple[str, ...] = tuple(keywords.context)
        self._keyword_specs: list[Any] = _children(keywords)
        self._npos = len(self._positional)
        given = list(names)
        self.names: list[str] = [given[i] if i < len(given) else f"args[{i}]"
                                 for i in range(self._npos)]
        #: every argument is a leaf: the flat list is the arguments themselves
        self._plain = all(s.is_leaf() for s in (*self._positional, *self._keyword_specs))
        # Each leaf's label in messages: n, nest[1][0], mask.
        dummy = pytree.tree_unflatten(list(range(in_spec.num_leaves)), in_spec)
        self.labels: list[str] = [""] * in_spec.num_leaves
        for path, index in pytree.tree_flatten_with_path(dummy)[0]:
            side: Any = path[0]  # 0: args, 1: kwargs
            where: Any = path[1]  # args[i] (a SequenceKey) or kwargs[k] (a MappingKey)
            top = self.names[where.idx] if side.idx == 0 else str(where.key)
            self.labels[index] = top + "".join(str(k) for k in path[2:])
        #: the baked values, at their indices in :meth:`flatten`'s list
        self.baked = BakedValues({i: (self.labels[i], v) for i, v in (baked or {}).items()},
                                 advice)

    # ------------------------------------------------------------------------------------------
    # The call
    # ------------------------------------------------------------------------------------------

    def flatten(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list[Any]:
        """The call's leaves in the graph's order; raises :class:`InvalidArgumentError` for a
        call laid out otherwise and :class:`ShapeNotCoveredError` for a baked value that
        differs."""
        flat = self.leaves(args, kwargs)
        self.baked.check(flat)
        return flat

    def leaves(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list[Any]:
        """:meth:`flatten` without comparing the baked values (the layout is checked)."""
        if len(args) != self._npos or len(kwargs) != len(self._keys):
            raise self._refusal(args, kwargs)
        if not self._plain:
            return self._nested(args, kwargs)
        if not self._keys:
            return list(args)
        try:
            return [*args, *[kwargs[k] for k in self._keys]]
        except KeyError:
            raise self._refusal(args, kwargs) from None

    def _nested(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list[Any]:
        from torch.utils import _pytree as pytree

        if any(k not in kwargs for k in self._keys):
            raise self._refusal(args, kwargs)
        flat: list[Any] = []
        pairs = [*zip(self.names, args, self._positional, strict=True),
                 *((k, kwargs[k], s) for k, s in zip(self._keys, self._keyword_specs,
                                                     strict=True))]
        for name, value, spec in pairs:
            if spec.is_leaf():
                flat.append(value)
                continue
            leaves, got = pytree.tree_flatten(value)
            if got != spec:
                raise InvalidArgumentError(
                    f"argument {name!r} is laid out as {describe(got)}; the program was built "
                    f"with {describe(spec)} there (each '*' a tensor or a value)"
                )
            flat.extend(leaves)
        return flat

    # ------------------------------------------------------------------------------------------
    # Errors
    # ------------------------------------------------------------------------------------------

    def takes(self) -> str:
        """What the program takes, in words."""
        count = _count(self._npos, "positional argument")
        names = f" ({', '.join(self.names)})" if self._npos else ""
        keys = (f"the keyword arguments {', '.join(self._keys)}" if self._keys
                else "no keyword arguments")
        return f"{count}{names} and {keys}"

    def _refusal(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> InvalidArgumentError:
        problems = []
        if len(args) != self._npos:
            problems.append(_count(len(args), "positional argument"))
        unknown = [k for k in kwargs if k not in self._keys]
        missing = [k for k in self._keys if k not in kwargs]
        if unknown:
            problems.append(f"the unknown keyword argument{'s' if len(unknown) > 1 else ''} "
                            f"{', '.join(unknown)}")
        if missing:
            problems.append(f"no keyword argument{'s' if len(missing) > 1 else ''} "
                            f"{', '.join(missing)}")
        hint = (" (call it as it was built: the same positional arguments, the same keywords; "
                "a default it was built without cannot be passed)")
        return InvalidArgumentError(
            f"the program takes {self.takes()}; got {' and '.join(problems)}{hint}"
        )


def _same(value: Any, expected: Any) -> bool:
    """``value`` serves a graph built with ``expected``: the same type and value (a NaN, never
    equal to itself, matches a NaN)."""
    if type(value) is not type(expected):
        return False
    if isinstance(value, float) and math.isnan(value):
        return math.isnan(expected)
    try:
        return bool(value == expected)
    except Exception:  # an object whose comparison fails is not the value built with
        return False


def _children(spec: Any) -> list[Any]:
    """A ``TreeSpec``'s child specs (``children()`` in newer torch, ``children_specs`` in
    older, where newer ones warn that it is deprecated)."""
    children = getattr(spec, "children", None)
    return list(children() if callable(children) else spec.children_specs)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def describe(spec: Any) -> str:
    """A pytree ``TreeSpec`` as a short literal: ``(*, [*, *], {'k': *})``."""
    if spec.is_leaf():
        return "*"
    children = [describe(s) for s in _children(spec)]
    if spec.type is tuple:
        return f"({', '.join(children)}{',' if len(children) == 1 else ''})"
    if spec.type is list:
        return f"[{', '.join(children)}]"
    if spec.type is dict:
        return "{" + ", ".join(f"{k!r}: {c}" for k, c in zip(spec.context, children,
                                                               strict=True)) + "}"
    return f"{getattr(spec.type, '__name__', spec.type)}({', '.join(children)})"
