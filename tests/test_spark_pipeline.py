"""Views over views on Spark (pipelines): a view reads other views of its maintainer as tables
keyed by their IDs, and consumes their stored relations' change feeds — the net changes their
refreshes committed — never by recomputing them.

The contract (as on PostgreSQL, ``tests/test_pg_pipeline.py``): ``maintain(name)`` refreshes
every view ``name`` reads (transitively, each once) first, all up to the same base-table
versions; ``maintain_all`` refreshes every view in dependency order and returns view → stats;
``drop_view`` is refused while views read the view, ``cascade=True`` drops them first; a view
reading itself is refused; ``status`` names each view's upstream views.

Differential, on both engines (the driver's DuckDB and Spark SQL) and with merge-on-read folds
forced often (``fold_rows``): after random batches each view brought up to date equals its
recomputation, and reads back the same through delta-rs.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import idivm
from idivm.cli import main as cli_main
from idivm.errors import BackendError, UnsupportedSQL

try:
    from tests.pipeline_cases import VIEWS, closure, recompute_sql
except ImportError:  # pragma: no cover - run from inside tests/
    from pipeline_cases import VIEWS, closure, recompute_sql  # type: ignore[no-redef]

DDL = """CREATE TABLE t (id int PRIMARY KEY, g int NOT NULL, x int);
CREATE TABLE u (g int PRIMARY KEY, name text);"""


def _pipeline(spark: Any, root: Path, engine: str = "auto", fold_rows: int | None = None
              ) -> Any:
    from idivm.spark import SparkMaintainer

    m = SparkMaintainer(idivm.Catalog.from_ddl(DDL), root, spark=spark, engine=engine)
    m.store.fold_rows = fold_rows
    m.load_table("t", spark.createDataFrame(
        [(i, i % 7, (i * 13) % 50) for i in range(1, 301)], "id int, g int, x int"))
    m.load_table("u", spark.createDataFrame([(i, f"n{i % 3}") for i in range(7)],
                                            "g int, name string"))
    for name, sql in VIEWS.items():
        m.create_view(name, sql, strategy="id")
    return m


def _check(m: Any, names: list[str]) -> None:
    """Each view equals its definition over the base tables (the views it reads recomputed
    too, as WITH queries), as Spark and as delta-rs read it."""
    from idivm.spark.delta import delta_rows

    for v in names:
        want = Counter(map(tuple, m.spark.sql(recompute_sql(v)).collect()))
        assert Counter(map(tuple, m.read_view(v).collect())) == want, v
        cols = list(m.plan_of(v).columns)
        got = Counter(delta_rows(m.view_location(v), cols))
        assert got == Counter(tuple(r) for r in want), v


def _batch(m: Any, rng: random.Random, n: int) -> None:
    cur = {r[0] for r in m.spark.table("t").select("id").collect()}
    seen: set[int] = set()
    rows = []
    for _ in range(n):
        k = rng.randrange(1, 400)
        if k in seen:
            continue
        seen.add(k)
        kind = ("delete" if rng.random() < 0.3 else "update_postimage") if k in cur \
            else "insert"
        rows.append((k, rng.randrange(7), rng.randrange(50), kind))
    m.apply_changes("t", m.spark.createDataFrame(
        rows, "id int, g int, x int, _change_type string"))
    if rng.random() < 0.3:
        g = rng.randrange(7)
        m.apply_changes("u", m.spark.createDataFrame(
            [(g, f"n{rng.randrange(4)}", "update_postimage")],
            "g int, name string, _change_type string"))


@pytest.mark.parametrize("engine,fold_rows,rounds", [("driver", None, 5), ("driver", 8, 5),
                                                     ("spark", None, 3)])
def test_views_over_views_differential(spark: Any, tmp_path: Path, engine: str,
                                       fold_rows: int | None, rounds: int) -> None:
    m = _pipeline(spark, tmp_path / "wh", engine, fold_rows)
    _check(m, list(VIEWS))
    rng = random.Random(26)
    for rnd in range(rounds):
        _batch(m, rng, rng.choice([1, 10, 60]))
        if rnd % 3 == 2:
            stats = m.maintain_all()
            assert list(stats) == ["a", "b", "c", "d", "e"]
            done = list(VIEWS)
        else:
            name = rng.choice(["b", "d", "e"])
            st = m.maintain(name)
            assert sorted(st.upstream) == sorted(closure(name)[:-1])
            done = closure(name)
        _check(m, done)
    m.maintain_all()
    _check(m, list(VIEWS))
    again = m.maintain_all()  # nothing pending: nothing read twice
    assert all(sum(s.changes.values()) == 0 for s in again.values())


def test_consumes_upstream_changes_at_one_set_of_versions(spark: Any, tmp_path: Path) -> None:
    """One changed row of t: a refresh of e reads one changed row of a (its change feed),
    and e reads t at the version a was refreshed to."""
    m = _pipeline(spark, tmp_path / "wh")
    v0 = m.table_version("t")
    m.apply_changes("t", spark.createDataFrame([(5, 5, 49, "update_postimage")],
                                               "id int, g int, x int, _change_type string"))
    st = m.maintain("e")
    assert st.upstream["a"].changes == {"t": 1}
    assert st.changes["a"] == 1 and st.changes["t"] == 1
    assert st.versions["t"] == st.upstream["a"].versions["t"] == [v0, v0 + 1]
    assert m.maintain("b").changes == {"a": 1}  # the same change of a, read by b later
    assert m.maintain("b").changes == {}
    _check(m, ["a", "b", "e"])


def test_contract_and_refusals(spark: Any, tmp_path: Path) -> None:
    m = _pipeline(spark, tmp_path / "wh")
    rows = {r["view"]: r for r in m.status()}
    assert rows["d"]["upstream"] == ["c"] and rows["a"]["upstream"] == []
    assert rows["e"]["watermarks"].keys() == {"t", "a"}
    with pytest.raises(UnsupportedSQL, match="reads itself"):
        m.create_view("s", "SELECT g FROM s")
    m.create_view("j", "SELECT t.x, u.name FROM t JOIN u ON t.g = u.g")
    with pytest.raises(UnsupportedSQL, match=r"IDs it does not show \(t__id\)"):
        m.create_view("k", "SELECT name, count(*) AS n FROM j GROUP BY name")
    with pytest.raises(UnsupportedSQL, match="has no IDs"):
        m.create_view("k", "SELECT total FROM b")
    with pytest.raises(BackendError, match=r"read by view\(s\) b, c, e"):
        m.drop_view("a")
    m.drop_view("c", cascade=True)
    assert {r["view"] for r in m.status()} == {"a", "b", "e", "j"}
    root = str(tmp_path / "wh")
    assert cli_main(["spark", "maintain", "--all", "--json", "--warehouse", root,
                     "--ddl", _ddl_file(tmp_path)]) == 0
    m.drop_view("a", cascade=True)
    assert {r["view"] for r in m.status()} == {"j"}


def _ddl_file(tmp_path: Path) -> str:
    f = tmp_path / "ddl.sql"
    f.write_text(DDL)
    return str(f)


def test_cli_maintain_all_json(spark: Any, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    m = _pipeline(spark, tmp_path / "wh")
    _batch(m, random.Random(3), 20)
    capsys.readouterr()
    assert cli_main(["spark", "maintain", "--all", "--json", "--warehouse",
                     str(tmp_path / "wh"), "--ddl", _ddl_file(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out) == ["a", "b", "c", "d", "e"]
    assert out["a"]["changes"]["t"] > 0


def test_crash_at_every_step_of_a_pipeline_refresh(spark: Any, tmp_path: Path) -> None:
    """Kill ``maintain("d")`` (a, then c, then d) before each of its steps, as a dead process
    would; the next ``maintain("d")`` leaves every view of the pipeline equal to its
    recomputation, and no upstream change is lost or read twice."""
    from idivm.spark import InjectedFailure

    m = _pipeline(spark, tmp_path / "wh", "driver")
    rng = random.Random(5)
    k = 0
    while True:
        _batch(m, rng, 15)
        calls = {"n": 0, "hit": False}

        def kill(step: str, k: int = k, calls: dict[str, Any] = calls) -> bool:
            calls["n"] += 1
            calls["hit"] = calls["n"] == k + 1
            return bool(calls["hit"])

        m.fail_at = kill
        try:
            m.maintain("d")
        except InjectedFailure:
            pass
        m.fail_at = None
        m.maintain("d")
        _check(m, ["a", "c", "d"])
        if not calls["hit"]:  # the run had fewer steps than k: every step was crashed before
            break
        k += 1
    assert k > 6
