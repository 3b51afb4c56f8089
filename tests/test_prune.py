"""Runtime pruning of EXISTS over empty i-diffs (idivm.planner.prune)."""

from __future__ import annotations

from sqlglot import parse_one

from idivm.planner.prune import prune_empty

Q = ("SELECT x.a FROM c AS x WHERE (EXISTS(SELECT 1 FROM d1 AS z WHERE x.a = z.a) "
     "OR EXISTS(SELECT 1 FROM d2 AS z WHERE x.a = z.a)) AND NOT EXISTS(SELECT 1 FROM d3 AS z) "
     "AND x.b > 1")


def _sql(q: str, empty: set[str]) -> str:
    return prune_empty(parse_one(q, read="spark"), empty).sql("spark")


def test_empty_exists_folds_away() -> None:
    assert _sql(Q, {"d1", "d3"}) == \
        "SELECT x.a FROM c AS x WHERE (EXISTS(SELECT 1 FROM d2 AS z WHERE x.a = z.a)) AND x.b > 1"
    assert _sql(Q, {"d1", "d2"}) == "SELECT x.a FROM c AS x WHERE FALSE"


def test_nothing_empty_or_not_provably_empty_is_kept() -> None:
    q = parse_one(Q, read="spark")
    assert prune_empty(q, set()) is q
    # an aggregate without GROUP BY returns a row over an empty input; a RIGHT JOIN keeps rows
    for sub in ("SELECT COUNT(*) FROM d1", "SELECT 1 FROM d1 RIGHT JOIN e ON d1.a = e.a"):
        kept = f"SELECT 1 FROM c WHERE EXISTS({sub})"
        assert _sql(kept, {"d1"}) == parse_one(kept, read="spark").sql("spark")
