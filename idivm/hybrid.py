"""One pipeline, two freshness modes: views maintained in bulk by Δ-scripts (``deferred``, on
PostgreSQL or Spark) next to views kept fresh event by event by C++ triggers (``fresh``), over
the same catalog and the same change feed.

* On Spark the feed is the CDF-shaped batches: :meth:`Pipeline.ingest` hands each batch to the
  Spark maintainer's versioned log (deferred views consume it at :meth:`refresh`) and, event by
  event, to every fresh view reading that table.
* On PostgreSQL the feed is idivm's change log (statement triggers on the base tables): a fresh
  view registers on it like a deferred view, with its own watermark, and :meth:`poll` applies
  the rows logged since; :meth:`refresh` polls and then runs the deferred maintenances.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from psycopg import sql

from idivm.catalog import Catalog
from idivm.errors import IdivmError
from idivm.fresh import FreshView
from idivm.postgres.changelog import HAS_POST, HAS_PRE

Mode = Literal["deferred", "fresh"]


@dataclass
class _Fresh:
    view: FreshView
    tables: tuple[str, ...]


@dataclass
class Pipeline:
    """Views over one catalog; give exactly one of ``postgres`` (a PostgresMaintainer) or
    ``spark`` (a SparkMaintainer)."""

    catalog: Catalog
    postgres: Any = None
    spark: Any = None
    fresh: dict[str, _Fresh] = field(default_factory=dict)
    deferred: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if (self.postgres is None) == (self.spark is None):
            raise IdivmError("a pipeline runs on one backend: give postgres= or spark=")

    def add_view(self, name: str, view_sql: str, mode: Mode = "deferred", **kw: Any) -> None:
        """Declare a view. ``deferred``: created by the backend's maintainer (``kw`` go to
        its ``create_view``); ``fresh``: compiled to C++ (``kw`` go to ``FreshView.compile``),
        loaded with the tables' current rows and fed from then on."""
        if name in self.fresh or name in self.deferred:
            raise IdivmError(f"view {name!r} is already in the pipeline")
        if mode == "deferred":
            backend = self.postgres if self.postgres is not None else self.spark
            backend.create_view(name, view_sql, **kw)
            self.deferred.append(name)
            return
        if mode != "fresh":
            raise IdivmError(f"mode must be 'deferred' or 'fresh', not {mode!r}")
        fv = FreshView.compile(view_sql, self.catalog, **kw)
        tables = tuple(t.name for t in fv.pipeline.base_tables)
        if self.postgres is not None:
            self._pg_register(name, fv, tables)
        else:
            for t in tables:
                for r in self.spark.store.read(t).toLocalIterator():
                    fv.insert(t, r.asDict())
        self.fresh[name] = _Fresh(fv, tables)

    # ------------------------------------------------------------------------ Spark

    def ingest(self, table: str, batch: Any) -> int:
        """Spark: append a CDF batch to the table's feed and apply it to the fresh views."""
        if self.spark is None:
            raise IdivmError("ingest() feeds a Spark pipeline; on PostgreSQL write to the "
                             "tables and call poll() or refresh()")
        self.spark.apply_changes(table, batch)
        n = 0
        for f in self.fresh.values():
            if table in f.tables:
                n += f.view.apply_changes(table, batch)
        return n

    # ------------------------------------------------------------------------ PostgreSQL

    def _pg_register(self, name: str, fv: FreshView, tables: tuple[str, ...]) -> None:
        from idivm.postgres import changelog

        pg = self.postgres
        with pg.conn.transaction():  # logging first: the trigger DDL waits for writers
            for t in tables:
                changelog.install(pg.conn, pg.schema, self.catalog.table(t), _feed(name))
        with pg.conn.transaction():  # then the rows and the watermark, in one snapshot
            pg.conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            for t in tables:
                cols = self.catalog.table(t).column_names
                cur = pg.conn.execute(sql.SQL("SELECT {} FROM {}.{}").format(
                    sql.SQL(", ").join(sql.Identifier(c) for c in cols),
                    sql.Identifier(pg.schema), sql.Identifier(t)))
                for row in cur:
                    fv.insert(t, row)
            changelog.advance(pg.conn, pg.schema, _feed(name), tables)

    def poll(self) -> int:
        """PostgreSQL: apply the changes committed since each fresh view's watermark: the log
        rows its last snapshot did not see, folded into the net change per key (the log's
        order is not the order of the row changes when statements nest: cascades, triggers
        writing the table), handed over as one change-feed version."""
        from idivm.postgres import changelog

        if self.postgres is None:
            return 0
        pg = self.postgres
        n = 0
        for name, f in self.fresh.items():
            with pg.conn.transaction():
                pg.conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                for t in f.tables:
                    mark = changelog.snapshot_literal(
                        changelog.watermark(pg.conn, pg.schema, t, _feed(name)))
                    table = self.catalog.table(t)
                    query = changelog.fold_select(table, changelog.log_ref(pg.schema, t),
                                                  changelog.pending_predicate(mark))
                    cur = pg.conn.execute(query.sql("postgres"))
                    names = [d.name for d in cur.description or ()]
                    rows = _feed_rows(table.primary_key, table.non_key_columns,
                                      [dict(zip(names, r, strict=True)) for r in cur])
                    if rows:
                        n += f.view.apply_changes(t, rows)
                changelog.advance(pg.conn, pg.schema, _feed(name), f.tables)
        return n

    # ------------------------------------------------------------------------ both

    def refresh(self) -> dict[str, Any]:
        """Bring every view up to date: fresh views poll (PostgreSQL), deferred views run
        their Δ-scripts. Returns the maintainers' statistics per deferred view."""
        self.poll()
        backend = self.postgres if self.postgres is not None else self.spark
        return {name: backend.maintain(name) for name in self.deferred}

    def rows(self, name: str) -> list[tuple[Any, ...]]:
        if name in self.fresh:
            return self.fresh[name].view.rows()
        if name not in self.deferred:
            raise IdivmError(f"no view {name!r} in the pipeline")
        if self.postgres is not None:
            pg = self.postgres
            with pg.conn.transaction():
                return [tuple(r) for r in pg.conn.execute(sql.SQL("SELECT * FROM {}.{}").format(
                    sql.Identifier(pg.schema), sql.Identifier(name)))]
        return [tuple(r) for r in self.spark.read_view(name).collect()]


def _feed_rows(keys: Sequence[str], others: Sequence[str],
               folded: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Net changes per key (``fold_select``'s rows) as one change-feed version: a key with a
    pre- and a post-image is an update, one with only a pre-image a delete, one with only a
    post-image an insert."""
    out: list[dict[str, Any]] = []
    for r in folded:
        def image(suffix: str, r: Mapping[str, Any] = r) -> dict[str, Any]:
            return {**{k: r[k] for k in keys}, **{c: r[f"{c}{suffix}"] for c in others}}

        pre, post = bool(r[HAS_PRE]), bool(r[HAS_POST])
        if pre:
            out.append({**image("__pre"),
                        "_change_type": "update_preimage" if post else "delete"})
        if post:
            out.append({**image("__post"),
                        "_change_type": "update_postimage" if pre else "insert"})
    return out


def _feed(view: str) -> str:
    return f"fresh:{view}"
