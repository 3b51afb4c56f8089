"""Spark differential harness: the PostgreSQL workloads' exact model drives CDF batches."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlglot import exp

import idivm
from idivm.spark import SparkMaintainer

try:
    from tests.differential.harness import normalize_rows
    from tests.differential.schemas import SCHEMAS
    from tests.differential.views import VIEWS_BY_NAME
    from tests.differential.workload import Workload
except ImportError:  # pragma: no cover - tests/ on sys.path
    from differential.harness import normalize_rows  # type: ignore[no-redef]
    from differential.schemas import SCHEMAS  # type: ignore[no-redef]
    from differential.views import VIEWS_BY_NAME  # type: ignore[no-redef]
    from differential.workload import Workload  # type: ignore[no-redef]

Rows = dict[str, list[tuple[Any, ...]]]


def spark_schema(table: idivm.Table) -> str:
    return ", ".join(
        f"`{c.name}` {exp.DataType.build(c.type, dialect='postgres').sql('spark')}"
        for c in table.columns)


def cdf_rows(table: idivm.Table, before: Sequence[tuple[Any, ...]],
             after: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """One commit's change feed between two states of a table (Delta CDF rows)."""
    idx = [table.column_names.index(k) for k in table.primary_key]

    def key(r: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(r[i] for i in idx)

    old = {key(r): r for r in before}
    new = {key(r): r for r in after}
    out: list[tuple[Any, ...]] = []
    for k, r in old.items():
        if k not in new:
            out.append((*r, "delete"))
        elif new[k] != r:
            out += [(*r, "update_preimage"), (*new[k], "update_postimage")]
    out += [(*r, "insert") for k, r in new.items() if k not in old]
    return out


class SparkDifferential:
    """Drives a SparkMaintainer with a seeded workload; checks views against recomputation."""

    def __init__(self, m: SparkMaintainer, schema_key: str, seed: int) -> None:
        self.m = m
        self.catalog = m.catalog
        self.work = Workload(schema_key, "unused", seed)
        self.work.initial_statements()
        self.state: Rows = self.work.snapshot()
        for name, rows in self.state.items():
            self.load(name, rows)
        self.tables_checked = False  # the base tables compared with the model since the
        #                              last step (a maintain never writes them)

    def load(self, name: str, rows: Sequence[tuple[Any, ...]]) -> None:
        """A base table's initial rows (here: loaded through idivm)."""
        t = self.catalog.table(name)
        self.m.load_table(name, self.m.spark.createDataFrame(list(rows), spark_schema(t)))

    def commit(self, name: str, rows: Sequence[tuple[Any, ...]]) -> None:
        """One commit's CDF rows for a base table (here: handed to ``apply_changes``)."""
        df = self.m.spark.createDataFrame(
            list(rows), spark_schema(self.catalog.table(name)) + ", `_change_type` string")
        self.m.apply_changes(name, df)

    def step(self, n_statements: int) -> None:
        """One commit per table: the net change of ``n_statements`` random statements."""
        self.work.next_round(n_statements)
        new = self.work.snapshot()
        for name in new:
            t = self.catalog.table(name)
            rows = cdf_rows(t, self.state[name], new[name])
            if rows:
                self.commit(name, rows)
        self.state = new
        self.tables_checked = False

    def check(self, view: str, context: str) -> None:
        got = normalize_rows(r for r in self.m.read_view(view).collect())
        want = normalize_rows(r for r in self.m.recompute(view).collect())
        if got != want:
            missing, extra = want - got, got - want
            raise AssertionError(
                f"{view} differs from recomputation ({context}): missing {list(missing)[:10]}"
                f", extra {list(extra)[:10]}")
        self.check_tables()

    def check_tables(self) -> None:
        """The base tables themselves, as the maintainer reads them, equal the workload's
        model — once per state: between two steps only the maintains run, which write views
        and caches, never a base table. (Not before a step: an attached Delta table is read
        at the version its last maintain pinned.)"""
        if self.tables_checked:
            return
        for name, rows in self.state.items():
            stored = Counter(tuple(r) for r in self.m.spark.table(name).collect())
            assert normalize_rows(stored.elements()) == normalize_rows(rows), name
        self.tables_checked = True


def schema_ddl(schema_key: str) -> str:
    return SCHEMAS[schema_key].ddl


def maintainer(spark: Any, tmp_path: Path, ddl: str, engine: str = "auto") -> Any:
    """A SparkMaintainer over ``ddl`` in ``tmp_path``: four buckets per cache and view (a
    round rewrites some of them, not always all)."""
    return SparkMaintainer(idivm.Catalog.from_ddl(ddl), tmp_path / "wh", spark=spark, buckets=4,
                           engine=engine)  # type: ignore[arg-type]


# every operator: σ ⋈ π (paper_v), γ with a cache (paper_v_cost), AVG/MIN/MAX/HAVING, global γ,
# ▷, ⋉, γ below ⋈ with σ above, θ self-join, ∪all, UNION, EXCEPT, DISTINCT, numeric sums
SPARK_VIEWS = (
    "paper_v", "paper_v_cost", "paper_using_group_aggs", "paper_not_exists", "paper_exists_in",
    "paper_subquery_agg_from", "paper_self_theta", "paper_devices_per_part_count",
    "social_union_all_roles",
    "social_distinct_buckets", "setops_union", "setops_except", "setops_global_filtered",
    "setops_any_all", "setops_scalar_padded", "setops_without_from",
)  # the orders schema's views: tests/test_spark_delta.py, over tables delta-rs writes
ROUNDS = 2


def views_by_schema() -> list[tuple[str, list[str]]]:
    """``SPARK_VIEWS`` by the schema of their workload."""
    out: dict[str, list[str]] = {}
    for name in SPARK_VIEWS:
        out.setdefault(VIEWS_BY_NAME[name].schema, []).append(name)
    return sorted(out.items())


def views_match_recomputation(spark: Any, tmp_path: Path, schema_key: str,
                              views: Sequence[str], engine: str) -> None:
    """Every operator on Spark: one workload per schema, all its views maintained per round,
    the Δ-script run by Spark SQL (``spark``), by DuckDB on the driver (``driver``), or by
    each in turn (``mixed``: a row one engine wrote is found by the other in the bucket it
    expects); each view equals its recomputation after every round."""
    m = maintainer(spark, tmp_path, schema_ddl(schema_key),
                   engine if engine != "mixed" else "driver")
    if engine == "mixed":  # the driver folds merge-on-read's leftovers early (copy-on-write)
        m.store.fold_rows = 8
    run = SparkDifferential(m, schema_key, seed=11)
    for name in views:
        m.create_view(name, VIEWS_BY_NAME[name].sql, strategy="id")
        run.check(name, "after create_view")
    rewritten: list[tuple[int, int]] = []
    rounds = ROUNDS if engine != "mixed" else 4
    for r in range(rounds):
        if engine == "mixed":  # Spark SQL in rounds 0 and 2 (0: two commits folded at once)
            m.engine = ("spark", "driver")[r % 2]
        run.step(8)
        if r == 0:
            run.step(8)  # two commits before one maintain: folding across versions
        for name in views:
            stats = m.maintain(name)
            assert stats.decision["choice"] == "id"
            assert stats.decision["engine"] == m.engine
            run.check(name, f"round {r}, stats {stats.as_dict()}")
            rewritten += stats.partitions_rewritten.values()
    assert any(0 < done for done, _ in rewritten), rewritten
