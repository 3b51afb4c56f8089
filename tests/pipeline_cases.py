"""The pipeline both backends' pipeline tests maintain: five views over two tables, three
levels deep (``tests/test_pg_pipeline.py``, ``tests/test_spark_pipeline.py``)."""

from __future__ import annotations

# name → SQL over the tables t(id, g, x) and u(g, name) and the views before it (creation order)
VIEWS = {
    "a": "SELECT g, sum(x) AS s, count(*) AS n FROM t GROUP BY g",
    "b": "SELECT sum(s) AS total, count(*) AS groups FROM a",
    "c": "SELECT a.g, u.name, a.s FROM a JOIN u ON a.g = u.g WHERE a.s > 1000",
    "d": "SELECT name, count(*) AS k, sum(s) AS s FROM c GROUP BY name",
    # reads a base table and a view of it: both at the same snapshot / versions
    "e": "SELECT t.id, t.x, a.s FROM t JOIN a ON t.g = a.g WHERE t.x > 20",
}
UPSTREAM = {"a": [], "b": ["a"], "c": ["a"], "d": ["c"], "e": ["a"]}


def closure(name: str) -> list[str]:
    """The views ``name`` reads (transitively, upstream first), then ``name``."""
    out: list[str] = []
    for u in UPSTREAM[name]:
        out += [v for v in closure(u) if v not in out]
    return [*out, name]


def recompute_sql(name: str) -> str:
    """The view's definition over the base tables: the views it reads as WITH queries."""
    ups = closure(name)[:-1]
    with_ = ", ".join(f"{v} AS ({VIEWS[v]})" for v in ups)
    return (f"WITH {with_} " if with_ else "") + VIEWS[name]
