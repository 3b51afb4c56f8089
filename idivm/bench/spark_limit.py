"""The physical limit of a refresh on Delta: the ``limit`` column of ``idivm bench spark``.

Any refresh of a view stored as a (copy-on-write) Delta table must at least read the batch's
change feeds and commit the view's final changes. The *limit copy* of a view is a Delta table
of the view's declared columns that a hand-written refresh keeps equal to the view, in the
layout best for each batch:

1. (untimed) the final changes are taken as given — the rows the batch removes from the view
   (old − new, as multisets) and the rows it adds (new − old), from the id copy's state before
   and after its refresh — and the copy is rewritten so that the rows to remove sit in one
   file of their own (the best layout for this batch: nothing else in a file the refresh
   replaces);
2. (timed) the refresh: read each base table's change feed over the batch's versions (delta-rs,
   as idivm does) and commit one Delta version that removes that file and adds one file with
   the added rows;
3. (untimed) verify: the copy, read back by delta-rs, equals the view.

So the limit neither derives the changes nor rewrites a row the batch leaves alone; a refresh
that must do either is measured against it as ``id / limit``.
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from idivm.catalog import Catalog


def _read(path: str | Path, columns: Sequence[str]) -> Any:
    from idivm.spark.delta import arrow, open_table

    # scan: the view's deletion vectors applied (to_pyarrow_table refuses them)
    return arrow(open_table(path).scan(columns=list(columns)).read_all())


def _multiset_minus(con: Any, left: Any, right: Any) -> Any:
    """``left`` EXCEPT ALL ``right`` (Arrow tables of the same columns), in DuckDB."""
    con.register("__l", left)
    con.register("__r", right)
    try:
        return con.execute("SELECT * FROM __l EXCEPT ALL SELECT * FROM __r").fetch_arrow_table()
    finally:
        con.unregister("__l")
        con.unregister("__r")


def _write_file(table: Any, folder: Path) -> dict[str, Any]:
    """``table`` as one parquet file in ``folder``; the add action's fields (relative path)."""
    import pyarrow.parquet as pq

    name = f"part-{uuid.uuid4().hex}.parquet"
    pq.write_table(table, folder / name)
    return {"path": name, "size": (folder / name).stat().st_size, "rows": table.num_rows,
            "partition": {}}


class LimitCopy:
    """One view's limit copy (see the module doc), a Delta table at ``path``."""

    def __init__(self, path: Path, view_location: str, columns: Sequence[str]) -> None:
        import duckdb

        self.path = path
        self.view_location = view_location
        self.columns = list(columns)
        self.con = duckdb.connect()
        self.con.execute("SET threads = 2")
        self._removed: dict[str, Any] | None = None  # the file holding the rows to remove
        self._added: Any = None
        self._write([_read(view_location, self.columns)])

    def _write(self, parts: Sequence[Any]) -> list[dict[str, Any]]:
        """Replace the copy by one file per (non-empty) Arrow table of ``parts``."""
        from deltalake import Schema
        from deltalake.transaction import create_table_with_add_actions

        from idivm.spark.delta import _add

        self.path.mkdir(parents=True, exist_ok=True)
        adds = [_write_file(p, self.path) for p in parts if p.num_rows]
        create_table_with_add_actions(str(self.path), Schema.from_arrow(parts[0].schema),
                                      [_add(a) for a in adds], mode="overwrite")
        return adds

    def prepare(self) -> dict[str, int]:
        """Step 1 (untimed), once the view has been refreshed: the final changes, and the copy
        laid out with the rows to remove in a file of their own. Returns their sizes."""
        old, new = _read(self.path, self.columns), _read(self.view_location, self.columns)
        removed = _multiset_minus(self.con, old, new)
        self._added = _multiset_minus(self.con, new, old).cast(old.schema)
        kept = _multiset_minus(self.con, old, removed).cast(old.schema)
        adds = self._write([kept, removed.cast(old.schema)])
        self._removed = adds[-1] if removed.num_rows else None
        return {"removed": removed.num_rows, "added": self._added.num_rows}

    def refresh(self, catalog: Catalog, feeds: Mapping[str, tuple[str, int, int]]) -> float:
        """Step 2, timed: read the change feeds (``feeds``: table → (location, since, upto)),
        commit the removal and the added rows as one Delta version. Returns seconds."""
        from deltalake import CommitProperties
        from deltalake.transaction import RemoveAction

        from idivm.spark.changes import read_cdf_arrow
        from idivm.spark.delta import _add, open_table

        t0 = time.perf_counter()
        for t, (location, since, upto) in feeds.items():
            if upto > since:
                read_cdf_arrow(catalog.table(t), location, since, upto)
        actions: list[Any] = []
        if self._removed is not None:
            r = self._removed
            actions.append(RemoveAction(r["path"], True, int(time.time() * 1000), r["size"], {}))
        if self._added is not None and self._added.num_rows:
            actions.append(_add(_write_file(self._added, self.path)))
        if actions:
            dt = open_table(self.path)
            dt.create_write_transaction(actions, mode="append", schema=dt.schema(),
                                        partition_by=[],
                                        commit_properties=CommitProperties(
                                            custom_metadata={"idivm": "limit"}))
        return time.perf_counter() - t0

    def verify(self) -> bool:
        """Step 3: the copy equals the view (as multisets of the declared columns)."""
        got, want = _read(self.path, self.columns), _read(self.view_location, self.columns)
        return got.num_rows == want.num_rows and \
            _multiset_minus(self.con, got, want.cast(got.schema)).num_rows == 0

    def close(self) -> None:
        self.con.close()


def limit_copies(root: Path, views: Mapping[str, tuple[str, Sequence[str]]]
                 ) -> dict[str, LimitCopy]:
    """A limit copy per view label (``views``: label → (view location, declared columns)),
    under ``root/limit`` (replaced)."""
    base = root / "limit"
    shutil.rmtree(base, ignore_errors=True)
    return {label: LimitCopy(base / label.replace("'", "_prime"), loc, cols)
            for label, (loc, cols) in views.items()}
