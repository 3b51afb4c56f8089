"""Per-operator rules: one module per operator, each defining ``RULE`` (an ``OperatorRule``).

Adding an operator is adding a module here; the passes find rules by operator type.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from idivm import algebra as A
from idivm.planner.ruleapi import OperatorRule


@cache
def registry() -> dict[type[A.Node], OperatorRule]:
    out: dict[type[A.Node], OperatorRule] = {}
    for mod in pkgutil.iter_modules(__path__):
        if mod.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{mod.name}")
        rule = getattr(module, "RULE", None)
        if isinstance(rule, OperatorRule):
            out[rule.op] = rule
    return out


def rule_for(node: A.Node) -> OperatorRule:
    try:
        return registry()[type(node)]
    except KeyError:
        raise NotImplementedError(f"no rules for operator {type(node).__name__}") from None
