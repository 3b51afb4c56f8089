"""Per-statement plans of a compiled maintenance, from PostgreSQL's ``auto_explain``.

idivm compiles a view's Δ-script into a PL/pgSQL function run by ``CALL <companion>.maintain``;
``EXPLAIN`` cannot reach the statements inside it, but ``auto_explain`` can:
``auto_explain.log_nested_statements`` logs each statement the function runs, with
``log_analyze`` / ``log_buffers`` its actual rows, times and buffers, ``log_format = json`` as
JSON, and ``log_level = notice`` sends each plan to the client as a NOTICE. ``captured(conn)``
turns that on for one connection (restoring every setting after), collects the notices, and
``parse_notices`` turns them into ``StatementPlan``s: the statement's SQL, time, rows, buffers
and its costliest plan node. Timing every plan node slows the statements down: a maintain
under ``captured`` is for reading, not for timing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypeAlias

import psycopg

from idivm.postgres.compile import PREPARED_CTE, PREPARED_PREFIX, prepared_text

Conn: TypeAlias = "psycopg.Connection[Any]"

SQL_CHARS = 200  # of a statement's text kept
# set in this order, put back in the reverse one: explaining starts with the last and stops
# with the first (so no set_config itself is explained)
SETTINGS = (("client_min_messages", "notice"), ("auto_explain.log_analyze", "on"),
            ("auto_explain.log_buffers", "on"), ("auto_explain.log_timing", "on"),
            ("auto_explain.log_nested_statements", "on"), ("auto_explain.log_format", "json"),
            ("auto_explain.log_level", "notice"), ("auto_explain.log_min_duration", "0"))
_DURATION = re.compile(r"duration:\s*([0-9.]+)\s*ms")
# a Δ-script statement run as a prepared statement, its rows counted (``compile._prepared``)
_COUNTED = re.compile(re.escape(prepared_text(PREPARED_PREFIX + "NAME", "SQL"))
                      .replace("NAME", "[0-9a-f]{32}").replace("SQL", "(.*)"), re.S)
_FRAME = re.compile(r"PL/pgSQL function (\S+?)(?:\(.*?\))? line (\d+)")


@dataclass(frozen=True)
class PlanNode:
    """A plan node: its type (``Hash Join``, ``Index Scan``, ``ModifyTable Update`` …), the
    relation (and index) it reads or writes, its actual rows over all loops, and the time
    spent in it alone (its children's time taken out)."""

    node_type: str
    relation: str | None
    index: str | None
    rows: int
    self_ms: float


@dataclass(frozen=True)
class StatementPlan:
    """One statement as ``auto_explain`` reported it."""

    sql: str  # the statement's text, whitespace collapsed, first ``SQL_CHARS`` characters
    ms: float  # its duration
    rows: int  # rows it produced; for an INSERT/UPDATE/DELETE, the rows it wrote
    shared_hit: int
    shared_read: int
    local_hit: int  # temporary tables' buffers
    local_read: int
    costliest: PlanNode | None
    function: str | None = None  # the innermost PL/pgSQL function running it
    line: int | None = None  # its line in that function
    depth: int = 0  # PL/pgSQL frames around it (0: sent by the client)
    wraps: int = 0  # statements that ran inside it (its time includes theirs)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Capture:
    """What ``captured`` collected: the raw notices (message, context) and, once the block
    ended, the parsed statements."""

    notices: list[tuple[str, str | None]] = field(default_factory=list)
    statements: list[StatementPlan] = field(default_factory=list)


def _int(node: Mapping[str, Any], key: str) -> int:
    v = node.get(key)
    return int(v) if isinstance(v, int | float) else 0


def _total_ms(node: Mapping[str, Any]) -> float:
    t = node.get("Actual Total Time")
    loops = node.get("Actual Loops") or 1
    return float(t) * float(loops) if isinstance(t, int | float) else 0.0


def _rows(node: Mapping[str, Any]) -> int:
    return _int(node, "Actual Rows") * max(_int(node, "Actual Loops"), 1)


def _nodes(node: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    yield node
    for child in node.get("Plans") or ():
        yield from _nodes(child)


def _cte(node: Mapping[str, Any]) -> str | None:
    """The name of the CTE whose plan ``node`` is (an InitPlan ``CTE <name>``), else None."""
    sub = node.get("Subplan Name")
    return sub[4:] if isinstance(sub, str) and sub.startswith("CTE ") else None


def costliest(plan: Mapping[str, Any]) -> PlanNode | None:
    """The node of ``plan`` (auto_explain's ``Plan``) with the most time spent in it alone.
    A CTE's plan runs as its scans pull rows: its time is inside theirs, not beside them —
    taken out of the scans' (the first ones, up to its total), not out of its parent's
    (a fold's ``CTE Scan on __idivm_k`` was its grouping's time; a counted INSERT's
    ``CTE Scan on idivm__w`` the INSERT's)."""
    left = {name: _total_ms(n) for n in _nodes(plan) if (name := _cte(n)) is not None}
    best: PlanNode | None = None
    for n in _nodes(plan):
        own = _total_ms(n) - sum(_total_ms(c) for c in n.get("Plans") or ()
                                 if _cte(c) is None)
        name = n.get("CTE Name")
        if n.get("Node Type") == "CTE Scan" and isinstance(name, str) and name in left:
            inner = min(left[name], max(own, 0.0))
            own -= inner
            left[name] -= inner
        kind = str(n.get("Node Type", "?"))
        if kind == "ModifyTable" and n.get("Operation"):
            kind = f"{kind} {n['Operation']}"
        rel = n.get("Relation Name") or n.get("CTE Name") or n.get("Function Name")
        node = PlanNode(kind, str(rel) if rel else None,
                        str(n["Index Name"]) if n.get("Index Name") else None, _rows(n),
                        round(max(own, 0.0), 3))
        if best is None or node.self_ms > best.self_ms:
            best = node
    return best


def parse_notice(message: str, context: str | None = None) -> StatementPlan | None:
    """One ``auto_explain`` notice (``duration: … ms  plan:`` and the plan as JSON) as a
    ``StatementPlan``; ``None`` for any other notice."""
    m = _DURATION.match(message.strip())
    start = message.find("{")
    if m is None or start < 0:
        return None
    try:
        doc = json.loads(message[start:])
    except json.JSONDecodeError:
        return None
    plan = doc.get("Plan") or {}
    text = " ".join(str(doc.get("Query Text", "")).split())
    rows = _rows(plan)
    counted = _COUNTED.fullmatch(text)
    if counted is not None:  # the INSERT inside, its rows in a CTE: the INSERT's
        text = counted.group(1)
        inner = [n for n in _nodes(plan) if _cte(n) == PREPARED_CTE]
        if inner:
            plan = inner[0]
    if plan.get("Node Type") == "ModifyTable":  # it returns nothing: count what it wrote
        rows = sum(_rows(c) for c in plan.get("Plans") or ()
                   if c.get("Parent Relationship") == "Outer")
    frames = _frames(context)
    return StatementPlan(
        sql=text[:SQL_CHARS],
        ms=float(m.group(1)), rows=rows,
        shared_hit=_int(plan, "Shared Hit Blocks"), shared_read=_int(plan, "Shared Read Blocks"),
        local_hit=_int(plan, "Local Hit Blocks"), local_read=_int(plan, "Local Read Blocks"),
        costliest=costliest(plan), function=frames[0][0] if frames else None,
        line=frames[0][1] if frames else None, depth=len(frames))


def _frames(context: str | None) -> tuple[tuple[str, int], ...]:
    """The PL/pgSQL frames of a notice's context, innermost first: (function, line)."""
    return tuple((f, int(n)) for f, n in _FRAME.findall(context or ""))


def parse_notices(notices: Sequence[tuple[str, str | None]]) -> list[StatementPlan]:
    """The plans among ``notices`` (message, context), in the order they ran to completion.
    A statement's notice comes after those of the statements that ran inside it (in a
    function it called): those are counted in its ``wraps`` — the deeper statements since the
    last one at its depth or above whose context passes through its own line. (A function
    called from a PL/pgSQL assignment is not a statement: nothing wraps its statements.)"""
    out: list[tuple[StatementPlan, tuple[tuple[str, int], ...]]] = []
    for msg, ctx in notices:
        s = parse_notice(msg, ctx)
        if s is None:
            continue
        frames = _frames(ctx)
        inner = 0
        for prev, pf in reversed(out):
            if prev.depth <= s.depth:
                break
            if pf[len(pf) - len(frames):] == frames:
                inner += 1
        out.append((replace(s, wraps=inner) if inner else s, frames))
    return [s for s, _ in out]


def top(statements: Sequence[StatementPlan], k: int = 5) -> list[StatementPlan]:
    """The ``k`` slowest statements that wrap no other (a wrapper's time is theirs too)."""
    return sorted((s for s in statements if not s.wraps), key=lambda s: -s.ms)[:k]


@contextmanager
def captured(conn: Conn) -> Iterator[Capture]:
    """Every statement run on ``conn`` inside the block (nested ones too) explained with
    ``auto_explain`` and collected; ``Capture.statements`` is filled when the block ends, and
    the settings are put back as they were. Raises ``psycopg.Error`` when auto_explain cannot
    be loaded (it is in PostgreSQL's contrib; loading it needs a superuser)."""
    cap = Capture()
    conn.execute("LOAD 'auto_explain'")
    before = {name: conn.execute("SELECT current_setting(%s, true)", (name,)).fetchone()
              for name, _ in SETTINGS}

    def keep(d: psycopg.errors.Diagnostic) -> None:  # the Diagnostic lives only in this call
        cap.notices.append((d.message_primary or "", d.context))

    for name, value in SETTINGS:
        conn.execute("SELECT set_config(%s, %s, false)", (name, value))
    conn.add_notice_handler(keep)
    try:
        yield cap
    finally:
        conn.remove_notice_handler(keep)
        if not conn.broken and not conn.closed:
            for name, row in reversed(before.items()):  # (after the LOAD, each has a value)
                if row and row[0] is not None:
                    conn.execute("SELECT set_config(%s, %s, false)", (name, str(row[0])))
        cap.statements = parse_notices(cap.notices)
