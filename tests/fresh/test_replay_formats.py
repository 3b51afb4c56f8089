"""Replay formats against a Python model of their semantics: the order-book trace (B/S insert,
E reduces a volume or removes the order, D/F remove it, others ignored) and TPC-H directories
(round-robin inserts; `order|op|` files merged by order with deletions); and the bench harness
end to end on tiny synthetic streams."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from idivm.bench import fresh_bench
from idivm.catalog import Catalog
from idivm.fresh import FreshView

BOOK = fresh_bench.FINANCE_DDL
AXF = fresh_bench.QUERIES["AXF"][1].replace("1000", "30")


def _trace(path: Path, seed: int, n: int) -> dict[str, dict[int, tuple[int, int, int, float,
                                                                          float]]]:
    """Write a random trace; return the final books as the README defines them."""
    g = random.Random(seed)
    books: dict[str, dict[int, tuple[int, int, int, float, float]]] = {"bids": {}, "asks": {}}
    lines = []
    next_id = 1
    for t in range(n):
        r = g.random()
        live = [(b, i) for b in books for i in books[b]]
        if r < 0.5 or not live:
            action = g.choice("BS")
            oid = next_id
            next_id += 1
            vol, price = g.randint(1, 20), g.randint(90, 200)
            lines.append(f"{t},{oid},{action},{vol},{price}")
            book = "bids" if action == "B" else "asks"
            books[book][oid] = (t, oid, oid % 10, float(vol), float(price))
        elif r < 0.8:
            b, oid = g.choice(live)
            cut = g.randint(1, 12)
            lines.append(f"{t},{oid},E,{cut},0")
            row = books[b][oid]
            left = row[3] - cut
            if left > 0:
                books[b][oid] = (*row[:3], left, row[4])
            else:
                del books[b][oid]
        elif r < 0.95:
            b, oid = g.choice(live)
            lines.append(f"{t},{oid},{g.choice('DF')},0,0")
            del books[b][oid]
        else:
            lines.append(f"{t},{g.randint(1, next_id)},{g.choice('CTX')},0,0")
    path.write_text("\n".join(lines) + "\n")
    return books


def _axf(books: dict[str, dict[int, tuple[int, int, int, float, float]]]) -> list[tuple[int,
                                                                                      float]]:
    out: dict[int, float] = {}
    for b in books["bids"].values():
        for a in books["asks"].values():
            if b[2] == a[2] and (a[4] - b[4] > 30 or b[4] - a[4] > 30):
                out[b[2]] = out.get(b[2], 0.0) + a[3] - b[3]
    return sorted((k, round(v, 6)) for k, v in out.items())


@pytest.mark.parametrize("depth", [None, 1])
def test_orderbook_replay_matches_the_books(tmp_path: Path, depth: int | None,
                                            cxx: None) -> None:
    fv = FreshView.compile(AXF, Catalog.from_ddl(BOOK), depth)
    for seed in range(3):
        fv2 = FreshView.compile(AXF, Catalog.from_ddl(BOOK), depth)
        books = _trace(tmp_path / f"f{seed}.csv", seed, 600)
        st = fv2.replay(tmp_path / f"f{seed}.csv", "orderbook")
        assert st.refused == 0 and st.events == st.stream_events > 0
        got = sorted((k, round(v, 6)) for k, v in fv2.rows())
        assert got == _axf(books)
        fv2.close()
    fv.close()


def test_tpch_directory_round_robin_and_deletions(tmp_path: Path, cxx: None) -> None:
    cat = Catalog.from_ddl("create table nation(n_nationkey int primary key, n_name text not "
                           "null, n_regionkey int not null, n_comment text not null);"
                           "create table supplier(s_suppkey int primary key, s_nationkey int "
                           "not null);")
    view = ("select n.n_name, count(*) as n from supplier s, nation n "
            "where s.s_nationkey = n.n_nationkey group by n.n_name")
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "nation.csv").write_text("0|ALGERIA|0|x|\n1|BRAZIL|1|y|\n")
    (plain / "supplier.tbl").write_text("1|0|\n2|1|\n3|1|\n")
    fv = FreshView.compile(view, cat)
    st = fv.replay(plain, "tpch")
    assert (st.events, st.stream_events) == (3, 3)  # nation is static: loaded untimed
    assert sorted(fv.rows()) == [("ALGERIA", 1), ("BRAZIL", 2)]
    dele = tmp_path / "del"
    dele.mkdir()
    (dele / "nation.csv").write_text("1|1|0|ALGERIA|0|x\n2|1|1|BRAZIL|1|y\n")
    (dele / "supplier.csv").write_text("3|1|1|0\n4|1|2|1\n6|0|1|0\n5|1|3|1\n")
    fv = FreshView.compile(view, cat)
    fv.replay(dele, "tpch")
    assert sorted(fv.rows()) == [("BRAZIL", 2)]
    with pytest.raises(Exception, match="no .*region"):
        FreshView.compile("select count(*) as n from region", Catalog.from_ddl(
            "create table region(r_regionkey int primary key, r_name text not null)")
        ).replay(plain, "tpch")


def test_bench_harness_on_tiny_streams(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       cxx: None) -> None:
    data = tmp_path / "data"
    for size in ("standard", "big"):
        (data / "finance" / size).mkdir(parents=True)
        _trace(data / "finance" / size / "finance.csv", 1, 300)
    monkeypatch.setenv("IDIVM_DBTOASTER_DATA", str(data))
    out = tmp_path / "out"
    assert fresh_bench.run(out, ["BSV"], sf=0, budget=0.2, which=("finance",), repeat=1) == 0
    report = json.loads((out / "results.json").read_text())
    assert {r["program"] for r in report["results"]} == {"higher-order", "depth 1", "depth 0"}
    assert all(r["events"] > 0 for r in report["results"])
    assert (out / "fresh_rates.png").exists()
