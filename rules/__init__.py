"""Per-operator rules: one module per operator, each defining ``RULE`` (an ``OperatorRule``).

Adding an operator is adding a module here; the passes find rules by operator type.
``tuple_based/`` holds the classical tuple-based (t-diff) rules of the baseline strategy
(``strategy="tuple"``), again a module per operator; an operator without one there uses its
ID-based rule when that rule declares ``tuple_safe`` (it is already the classical rule when
every diff is a full tuple).
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache
from types import ModuleType

from idivm import algebra as A
from idivm.planner.ruleapi import OperatorRule


def _collect(package: ModuleType) -> dict[type[A.Node], OperatorRule]:
    out: dict[type[A.Node], OperatorRule] = {}
    for mod in pkgutil.iter_modules(package.__path__):
        if mod.name.startswith("_") or mod.ispkg:
            continue
        module = importlib.import_module(f"{package.__name__}.{mod.name}")
        rule = getattr(module, "RULE", None)
        if isinstance(rule, OperatorRule):
            out[rule.op] = rule
    return out


@cache
def registry(strategy: str = "id") -> dict[type[A.Node], OperatorRule]:
    """Operator → its rule for an incremental strategy (``id`` or ``tuple``)."""
    import sys

    own = _collect(sys.modules[__name__])
    if strategy == "id":
        return own
    if strategy != "tuple":
        raise ValueError(f"no propagation rules for strategy {strategy!r}")
    tuple_rules = _collect(importlib.import_module(f"{__name__}.tuple_based"))
    out = {op: r for op, r in own.items() if r.tuple_safe}
    out.update(tuple_rules)
    return out


def rule_for(node: A.Node, strategy: str = "id") -> OperatorRule:
    try:
        return registry(strategy)[type(node)]
    except KeyError:
        what = "" if strategy == "id" else f" {strategy}-based"
        raise NotImplementedError(
            f"no{what} rules for operator {type(node).__name__}") from None
