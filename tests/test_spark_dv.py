"""Merge-on-read storage: Delta deletion vectors written by idivm, read by every reader.

A small refresh marks the rows it changes in deletion vectors and adds their new versions in
one file (``DeltaStore.stage_dv``); a later copy-on-write refresh folds those leftovers back
into the buckets. The view must equal its recomputation whichever engine reads or writes it,
and delta-rs and DuckDB's ``delta`` extension must read the same rows.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import idivm
from idivm.examples import PAPER_DDL, V_PRIME_SQL, V_SQL

try:
    from tests.differential.harness import normalize_rows
    from tests.test_spark_delta import duckdb_rows
except ImportError:  # pragma: no cover
    from differential.harness import normalize_rows  # type: ignore[no-redef]
    from test_spark_delta import duckdb_rows  # type: ignore[no-redef]


def test_deletion_vectors_as_delta_readers_read_them(tmp_path: Path) -> None:
    """A DV written and committed by ``idivm.spark.dv`` deletes exactly its rows for
    delta-rs and DuckDB; the log replay finds its descriptor before and after a checkpoint."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    from idivm.spark import dv
    from idivm.spark.delta import add_actions, delta_rows

    hello = b"\x86\x4f\xd2\x6f\xb5\x59\xf7\x5b"
    assert dv.z85(hello) == "HelloWorld" and dv.unz85("HelloWorld") == hello  # ZeroMQ's vector
    assert dv.deserialize(dv.serialize([5, 1, 2**33])) == [1, 5, 2**33]
    root = tmp_path / "t"
    write_deltalake(str(root), pa.table({"k": list(range(50)), "v": [i * 2 for i in range(50)]}),
                    configuration=dv.ENABLE)
    f = add_actions(DeltaTable(str(root)))[0]
    name = uuid.uuid4()
    descriptors = dv.write_dvs(root, {f["path"]: [0, 7, 49]}, name)
    assert dv.read_dv(root, descriptors[f["path"]]) == [0, 7, 49]
    now = int(time.time() * 1000)
    dv.commit(root, 1, [
        {"commitInfo": {"timestamp": now, "operation": "DELETE"}},
        {"remove": {"path": f["path"], "dataChange": True, "deletionTimestamp": now,
                    "partitionValues": {}, "size": f["size_bytes"]}},
        {"add": {"path": f["path"], "partitionValues": {}, "size": f["size_bytes"],
                 "modificationTime": now, "dataChange": True,
                 "stats": json.dumps({"numRecords": 50}),
                 "deletionVector": descriptors[f["path"]]}}])
    with pytest.raises(dv.DeltaCommitConflict):
        dv.commit(root, 1, [{"commitInfo": {"timestamp": now}}])
    want = {(k, 2 * k) for k in range(50)} - {(0, 0), (7, 14), (49, 98)}
    assert set(delta_rows(root, ["k", "v"])) == want
    assert set(duckdb_rows(str(root), ["k", "v"])) == want
    assert dv.live_descriptors(root, 1).descriptors == descriptors
    assert dv.live_descriptors(root, 0).descriptors == {}
    DeltaTable(str(root)).create_checkpoint()
    assert dv.live_descriptors(root, 1).descriptors[f["path"]]["cardinality"] == 3
    assert dv.dv_paths(descriptors.values()) == {f"deletion_vector_{name}.bin"}


def _maintainer(spark: Any, tmp_path: Path) -> Any:
    from idivm.spark import SparkMaintainer

    m = SparkMaintainer(idivm.Catalog.from_ddl(PAPER_DDL), tmp_path / "wh", spark=spark,
                        buckets=4, engine="driver")
    devices = [(f"D{i}", "phone" if i % 3 else "tablet") for i in range(40)]
    parts = [(f"P{j}", 10 + j) for j in range(20)]
    links = [(f"D{i}", f"P{(i * 7 + k) % 20}") for i in range(40) for k in range(3)]
    m.load_table("devices", spark.createDataFrame(devices, "did string, category string"))
    m.load_table("parts", spark.createDataFrame(parts, "pid string, price int"))
    m.load_table("devices_parts", spark.createDataFrame(links, "did string, pid string"))
    return m


def _price(spark: Any, m: Any, pid: str, old: int, new: int) -> None:
    m.apply_changes("parts", spark.createDataFrame(
        [(pid, old, "update_preimage"), (pid, new, "update_postimage")],
        "pid string, price int, _change_type string"))


def _check(m: Any, view: str, context: str) -> None:
    from idivm.spark.delta import delta_rows

    want = normalize_rows(r for r in m.recompute(view).collect())
    cols = m.read_view(view).columns
    assert normalize_rows(m.read_view(view).collect()) == want, f"Spark, {context}"
    path = m.view_location(view)
    assert normalize_rows(delta_rows(path, cols)) == want, f"delta-rs, {context}"
    assert normalize_rows(duckdb_rows(path, cols)) == want, f"duckdb, {context}"


def _leftovers(m: Any, rel: str) -> tuple[int, int]:
    """(files in the RECENT partition, rows deletion vectors delete) of a stored relation."""
    from idivm.spark.delta import RECENT, _bucket_value

    files = m.store.files(rel)
    return (sum(_bucket_value(f) == RECENT for f in files),
            sum(len(f["deleted"]) for f in files))


def test_merge_on_read_then_fold(spark: Any, tmp_path: Path) -> None:
    """Price updates mark rows in deletion vectors (nothing rewritten), every reader sees the
    maintained view, the view's change feed carries the changes; a copy-on-write refresh
    (the Spark engine, or the driver past ``fold_rows``) folds the leftovers away."""
    import pyarrow as pa
    from deltalake import DeltaTable

    m = _maintainer(spark, tmp_path)
    m.create_view("v", V_SQL, strategy="id")
    m.create_view("vp", V_PRIME_SQL, strategy="id")
    store, cache = m.plan_of("v").store.name, m.plan_of("vp").materialized[0].name
    before = normalize_rows(r for r in m.read_view("v").collect())
    _price(spark, m, "P3", 13, 99)
    for view in ("v", "vp"):
        m.maintain(view)
        _check(m, view, "after a merge-on-read refresh")
    # P3's rows (its links to phones): marked in their files, re-added in one file
    recent, marked = _leftovers(m, store)
    assert recent == 1 and marked > 0
    assert _leftovers(m, cache)[1] > 0
    log = (Path(m.store.path(store)) / "_delta_log" / f"{1:020d}.json").read_text()
    assert '"deletionVector"' in log and '"cdc"' in log
    feed = pa.table(DeltaTable(m.view_location("v")).load_cdf(starting_version=1))
    cols = m.read_view("v").columns
    rows = feed.to_pylist()
    old = normalize_rows(tuple(r[c] for c in cols) for r in rows
                         if r["_change_type"] in ("delete", "update_preimage"))
    new = normalize_rows(tuple(r[c] for c in cols) for r in rows
                         if r["_change_type"] in ("insert", "update_postimage"))
    assert before - old | new == normalize_rows(r for r in m.read_view("v").collect())
    # the same rows changed again: the RECENT file's rows are marked in turn
    _price(spark, m, "P3", 99, 98)
    _price(spark, m, "P4", 14, 41)
    for view in ("v", "vp"):
        m.maintain(view)
        _check(m, view, "after a second merge-on-read refresh")
    assert _leftovers(m, store)[0] >= 1
    # the Spark engine reads the marked files and folds them (copy-on-write)
    m.engine = "spark"
    _price(spark, m, "P5", 15, 51)
    m.maintain("v")
    _check(m, "v", "after a copy-on-write refresh on Spark")
    assert _leftovers(m, store) == (0, 0)
    # on the driver past fold_rows: copy-on-write too
    m.engine = "driver"
    m.store.fold_rows = 0
    _price(spark, m, "P6", 16, 61)
    m.maintain("vp")
    _check(m, "vp", "after a copy-on-write refresh on the driver")
    assert _leftovers(m, cache) == (0, 0)
    # the change feed across merge-on-read commits and the folds (which remove marked files:
    # they carry their own change-data file) adds up to the view as it is now
    feed = pa.table(DeltaTable(m.view_location("v")).load_cdf(starting_version=1)).to_pylist()
    state = Counter(before)
    for r in sorted(feed, key=lambda r: r["_commit_version"]):
        row = normalize_rows([tuple(r[c] for c in cols)])
        for k in row:
            state[k] += -1 if r["_change_type"] in ("delete", "update_preimage") else 1
            assert state[k] >= 0, (k, r["_commit_version"])
    assert +state == Counter(normalize_rows(r for r in m.read_view("v").collect()))
