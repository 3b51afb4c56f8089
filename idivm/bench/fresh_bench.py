"""``idivm bench fresh``: fresh views on DBToaster's streams, three programs side by side.

For each query and stream: the higher-order program (the default), first-order IVM in the same
runtime (depth 1: view maps maintained, deltas evaluated over base relations) and re-evaluation
(depth 0: the view recomputed after every event), each replaying the whole stream inside C++
with parsing untimed (DBToaster's ``--preload``). Slow programs run under a time budget and their
rate is the events they got through per second. Rates are printed next to DBToaster's own rates
measured on these machines (``../shared/dbtoaster-data/README.md``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from idivm.bench.tpch import TPCH_DDL, load_tpch_extension
from idivm.catalog import Catalog
from idivm.errors import UnsupportedSQL

FINANCE_DDL = """
create table bids(t bigint not null, id bigint primary key, broker_id bigint not null,
  volume numeric not null, price numeric not null);
create table asks(t bigint not null, id bigint primary key, broker_id bigint not null,
  volume numeric not null, price numeric not null);
"""

QUERIES: dict[str, tuple[str, str]] = {
    # TPC-H Q3 as DBToaster runs it
    "Q3": ("tpch", """select l.l_orderkey, o.o_orderdate, o.o_shippriority,
        sum(l.l_extendedprice * (1 - l.l_discount)) as query3
      from customer c, orders o, lineitem l
      where c.c_mktsegment = 'BUILDING' and o.o_custkey = c.c_custkey
        and l.l_orderkey = o.o_orderkey and o.o_orderdate < date '1995-03-15'
        and l.l_shipdate > date '1995-03-15'
      group by l.l_orderkey, o.o_orderdate, o.o_shippriority"""),
    # TPC-H Q11 without its HAVING subquery (nested aggregates are a later issue)
    "Q11core": ("tpch", """select ps.ps_partkey, sum(ps.ps_supplycost * ps.ps_availqty) as value
      from partsupp ps, supplier s, nation n
      where ps.ps_suppkey = s.s_suppkey and s.s_nationkey = n.n_nationkey
        and n.n_name = 'GERMANY'
      group by ps.ps_partkey"""),
    # DBToaster's ssb4: the SSB Q4-style star join over TPC-H
    "SSB4": ("tpch", """select sn.n_regionkey as s_region, cn.n_regionkey as c_region,
        p.p_type, sum(l.l_quantity) as quantity
      from customer c, orders o, lineitem l, part p, supplier s, nation sn, nation cn
      where c.c_custkey = o.o_custkey and o.o_orderkey = l.l_orderkey
        and p.p_partkey = l.l_partkey and s.s_suppkey = l.l_suppkey
        and o.o_orderdate >= date '1997-01-01' and o.o_orderdate < date '1998-01-01'
        and sn.n_nationkey = s.s_nationkey and cn.n_nationkey = c.c_nationkey
      group by sn.n_regionkey, cn.n_regionkey, p.p_type"""),
    # DBToaster's nested-aggregate headline queries (its test/queries/tpch), in TPC-H names
    "Q11": ("tpch", """select p.ps_partkey, sum(p.value) as query11
      from (select ps.ps_partkey, sum(ps.ps_supplycost * ps.ps_availqty) as value
            from partsupp ps, supplier s, nation n
            where ps.ps_suppkey = s.s_suppkey and s.s_nationkey = n.n_nationkey
              and n.n_name = 'GERMANY'
            group by ps.ps_partkey) p
      where p.value > (select sum(ps.ps_supplycost * ps.ps_availqty) * 0.001
                       from partsupp ps, supplier s, nation n
                       where ps.ps_suppkey = s.s_suppkey and s.s_nationkey = n.n_nationkey
                         and n.n_name = 'GERMANY')
      group by p.ps_partkey"""),
    "Q17": ("tpch", """select sum(l.l_extendedprice) / 7.0 as avg_yearly
      from lineitem l, part p
      where p.p_partkey = l.l_partkey and p.p_brand = 'Brand#23'
        and p.p_container = 'MED BOX'
        and l.l_quantity < (select 0.2 * avg(l2.l_quantity) from lineitem l2
                            where l2.l_partkey = p.p_partkey)"""),
    "Q18": ("tpch", """select c.c_name, c.c_custkey, o.o_orderkey, o.o_orderdate,
        o.o_totalprice, sum(l.l_quantity) as query18
      from customer c, orders o, lineitem l
      where o.o_orderkey in (select l3.l_orderkey
                             from (select l2.l_orderkey, sum(l2.l_quantity) as qty
                                   from lineitem l2 group by l2.l_orderkey) l3
                             where l3.qty > 100)
        and c.c_custkey = o.o_custkey and o.o_orderkey = l.l_orderkey
      group by c.c_name, c.c_custkey, o.o_orderkey, o.o_orderdate, o.o_totalprice"""),
    "Q22": ("tpch", """select cntrycode, count(*) as numcust, sum(custsale.c_acctbal)
        as totalacctbal
      from (select substring(c.c_phone from 1 for 2) as cntrycode, c.c_acctbal
            from customer c
            where substring(c.c_phone from 1 for 2) in ('13', '31', '23', '29', '30', '18',
                                                        '17')
              and c.c_acctbal > (select avg(c2.c_acctbal) from customer c2
                                 where c2.c_acctbal > 0.00
                                   and substring(c2.c_phone from 1 for 2) in
                                       ('13', '31', '23', '29', '30', '18', '17'))
              and not exists (select * from orders o where o.o_custkey = c.c_custkey)
           ) as custsale
      group by cntrycode"""),
    "AXF": ("finance", """select b.broker_id, sum(a.volume - b.volume) as axfinder
      from bids b, asks a
      where b.broker_id = a.broker_id
        and (a.price - b.price > 1000 or b.price - a.price > 1000)
      group by b.broker_id"""),
    "BSP": ("finance", """select x.broker_id, sum(x.volume * x.price - y.volume * y.price) as bsp
      from bids x, bids y where x.broker_id = y.broker_id and x.t > y.t
      group by x.broker_id"""),
    "BSV": ("finance", """select x.broker_id, sum(x.volume * x.price * y.volume * y.price * 0.5)
        as bsv
      from bids x, bids y where x.broker_id = y.broker_id group by x.broker_id"""),
    # DBToaster's finance queries with nested aggregates (its test/queries/finance)
    "PSP": ("finance", """select sum(a.price - b.price) as psp
      from bids b, asks a
      where b.volume > 0.0001 * (select sum(b1.volume) from bids b1)
        and a.volume > 0.0001 * (select sum(a1.volume) from asks a1)"""),
    "VWAP": ("finance", """select sum(b1.price * b1.volume) as vwap
      from bids b1
      where 0.25 * (select sum(b3.volume) from bids b3)
            > (select sum(b2.volume) from bids b2 where b2.price > b1.price)"""),
    "MST": ("finance", """select b.broker_id, sum(a.price * a.volume - b.price * b.volume)
        as mst
      from bids b, asks a
      where 0.25 * (select sum(a1.volume) from asks a1)
              > (select sum(a2.volume) from asks a2 where a2.price > a.price)
        and 0.25 * (select sum(b1.volume) from bids b1)
              > (select sum(b2.volume) from bids b2 where b2.price > b.price)
      group by b.broker_id"""),
}

# DBToaster's rates on this machine class (tuples/s), from ../shared/dbtoaster-data/README.md
DBTOASTER = {("Q3", "tpch-sf0.1"): 12.8e6,
             ("SSB4", "tpch-sf0.1"): 489e3, ("AXF", "finance-big"): 333e3,
             ("BSP", "finance-big"): 600e3, ("Q11", "tpch-sf0.1"): 95e3,
             ("Q17", "tpch-sf0.1"): 952e3, ("Q18", "tpch-sf0.1"): 2.4e6,
             ("Q22", "tpch-sf0.1"): 198e3, ("Q3", "tpch-sf1"): 4.7e6,
             ("Q11", "tpch-sf1"): 11.2e3, ("Q17", "tpch-sf1"): 435e3,
             ("Q18", "tpch-sf1"): 1.48e6, ("Q22", "tpch-sf1"): 11.1e3,
             ("SSB4", "tpch-sf1"): 206e3, ("PSP", "finance-big"): 167e3,
             ("VWAP", "finance-big"): 2.1e3, ("MST", "finance-big"): 180.0}
DEPTHS: tuple[tuple[str, int | None], ...] = (("higher-order", None), ("depth 1", 1),
                                             ("depth 0", 0))


def auto_choice(query: str, catalog: Catalog) -> str:
    """The program FreshView.compile(depth="auto") picks for this query."""
    from idivm.fresh.program import compile_pipeline
    from idivm.fresh.query import translate

    pipe = compile_pipeline(translate(QUERIES[query][1], catalog), catalog, "auto")
    return "depth 1" if pipe.view.depth == 1 else "higher-order"


def shared_data() -> Path:
    env = os.environ.get("IDIVM_DBTOASTER_DATA")
    if env:
        return Path(env)
    here = Path(__file__).resolve()
    for up in here.parents:
        cand = up.parent / "shared" / "dbtoaster-data"
        if cand.exists():
            return cand
    return Path("../shared/dbtoaster-data")


def tpch_dir(sf: float, cache: Path, console: Console) -> Path:
    """TPC-H at ``sf`` as '|'-separated files, generated once with DuckDB's TPC-H extension
    (loaded offline from the ``duckdb-ext-tpch`` wheel)."""
    out = cache / f"tpch_sf{sf:g}"
    if (out / "lineitem.csv").exists():
        return out
    import duckdb

    con = duckdb.connect()
    load_tpch_extension(con)
    console.print(f"generating TPC-H SF {sf:g} with DuckDB into {out}")
    con.execute(f"CALL dbgen(sf={float(sf)})")
    out.mkdir(parents=True, exist_ok=True)
    for t in ("part", "supplier", "partsupp", "customer", "orders", "lineitem", "nation",
              "region"):
        tmp = out / f"{t}.tmp"
        con.execute(f"COPY {t} TO '{tmp}' (DELIMITER '|', HEADER false)")
        tmp.rename(out / f"{t}.csv")
    return out


@dataclass
class Result:
    query: str
    stream: str
    program: str
    events: int
    stream_events: int
    seconds: float
    rate: float
    map_bytes: int
    compile_seconds: float
    complete: bool
    rate_min: float
    rate_max: float


def streams(data: Path, sf: float, cache: Path, console: Console,
            which: list[str]) -> dict[str, tuple[str, Path, str]]:
    out: dict[str, tuple[str, Path, str]] = {}
    if "finance" in which:
        out["finance-std"] = ("finance", data / "finance/standard/finance.csv", "orderbook")
        out["finance-big"] = ("finance", data / "finance/big/finance.csv", "orderbook")
    if "tpch" in which:
        out["tpch-std"] = ("tpch", data / "tpch/standard", "tpch")
        out["tpch-std-del"] = ("tpch", data / "tpch/standard_del", "tpch")
        if sf > 0:
            out[f"tpch-sf{sf:g}"] = ("tpch", tpch_dir(sf, cache, console), "tpch")
    return out


def run(out: Path, queries: list[str], sf: float = 0.1, budget: float = 10.0,
        which: tuple[str, ...] = ("finance", "tpch"), repeat: int = 3,
        console: Console | None = None) -> int:
    from rich.progress import Progress

    from idivm.fresh import FreshView

    c = console or Console(width=None if sys.stdout.isatty() else 200)
    data = shared_data()
    cats = {"tpch": Catalog.from_ddl(TPCH_DDL), "finance": Catalog.from_ddl(FINANCE_DDL)}
    srcs = streams(data, sf, out / "_data", c, list(which))
    jobs = [(q, s) for q in queries for s, (kind, _, _) in srcs.items() if kind == QUERIES[q][0]]
    results: list[Result] = []
    with Progress(console=c) as prog:
        task = prog.add_task("replaying", total=len(jobs) * len(DEPTHS))
        for q, s in jobs:
            kind, path, fmt = srcs[s]
            for label, depth in DEPTHS:
                prog.update(task, description=f"{q} on {s}: {label}")
                t0 = time.perf_counter()
                try:
                    fv = FreshView.compile(QUERIES[q][1], cats[kind], depth)
                except UnsupportedSQL as e:  # depth 0 of a nested aggregate
                    c.print(f"{q} {label}: not run ({e})")
                    prog.advance(task)
                    continue
                compile_s = time.perf_counter() - t0
                fv.close()
                runs = []
                for _ in range(repeat):  # each replay on a fresh instance of the program
                    fv = FreshView.compile(QUERIES[q][1], cats[kind], depth)
                    runs.append(fv.replay(path, fmt, budget_seconds=budget
                                          if depth is not None else 0.0))
                    fv.close()
                    if runs[-1].events < runs[-1].stream_events:
                        break  # stopped by the budget: one run says enough
                st = sorted(runs, key=lambda r: r.rate)[len(runs) // 2]
                results.append(Result(q, s, label, st.events, st.stream_events, st.seconds,
                                      st.rate, st.map_bytes, compile_s,
                                      st.events == st.stream_events,
                                      min(r.rate for r in runs), max(r.rate for r in runs)))
                prog.advance(task)
    chosen = {q: auto_choice(q, cats[QUERIES[q][0]]) for q in queries}
    report = _report(results, chosen)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(
        {"config": {"sf": sf, "budget_seconds": budget, "queries": queries, "repeat": repeat,
                    "cpus": os.cpu_count()},
         "results": [asdict(r) for r in results], "summary": report}, indent=1))
    _print(c, report)
    png = _plot(report, out)
    c.print(f"wrote {out / 'results.json'} and {png}")
    return 0


def _report(results: list[Result], chosen: dict[str, str]) -> list[dict[str, Any]]:
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for r in results:
        row = rows.setdefault((r.query, r.stream), {"query": r.query, "stream": r.stream,
                                                    "events": r.stream_events})
        row[r.program] = r.rate
        row[f"{r.program} range"] = (r.rate_min, r.rate_max)
        row[f"{r.program} complete"] = r.complete
        if r.program == "higher-order":
            row["map_bytes"] = r.map_bytes
    for (q, s), row in rows.items():
        ho = row.get("higher-order", 0.0)
        row["auto"] = chosen[q]
        auto = row.get(chosen[q], 0.0)
        row["× depth 0"] = ho / row["depth 0"] if row.get("depth 0") else None
        row["auto × depth 0"] = auto / row["depth 0"] if row.get("depth 0") else None
        ref = DBTOASTER.get((q, s))
        row["dbtoaster"] = ref
        row["× dbtoaster"] = ho / ref if ref else None
        row["auto × dbtoaster"] = auto / ref if ref else None
    return list(rows.values())


def _fmt_rate(x: float | None, complete: bool = True) -> str:
    if x is None:
        return "–"
    mark = "" if complete else "†"
    if x >= 1e6:
        return f"{x / 1e6:.2f}M{mark}"
    if x >= 1e3:
        return f"{x / 1e3:.1f}k{mark}"
    return f"{x:.0f}{mark}"


def _print(c: Console, report: list[dict[str, Any]]) -> None:
    t = Table(title="fresh views: tuples/second, median of the replays (higher-order vs depth 1 "
              "vs depth 0); † = stopped at the time budget", title_style="bold")
    for col in ("query", "stream", "events", "higher-order", "depth 1", "depth 0",
                "HO × d0", "DBToaster", "HO × DBT", "auto", "auto × DBT", "map MB"):
        t.add_column(col, justify="left" if col in ("query", "stream") else "right")
    for r in report:
        t.add_row(r["query"], r["stream"], f"{r['events']:,}",
                  *[_fmt_rate(r.get(p), r.get(f"{p} complete", True))
                    for p in ("higher-order", "depth 1", "depth 0")],
                  f"{r['× depth 0']:.0f}×" if r["× depth 0"] else "–",
                  _fmt_rate(r["dbtoaster"]),
                  f"{r['× dbtoaster']:.2f}×" if r["× dbtoaster"] else "–",
                  r["auto"],
                  f"{r['auto × dbtoaster']:.2f}×" if r["auto × dbtoaster"] else "–",
                  f"{r.get('map_bytes', 0) / 2**20:.1f}")
    c.print(t)
    c.print("HO = higher-order; auto = the program FreshView.compile picks by default "
            "(first-order when the higher-order one needs more than 4 maps per relation)")


def _plot(report: list[dict[str, Any]], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['query']}\n{r['stream']}" for r in report]
    fig, ax = plt.subplots(figsize=(max(8, len(report) * 1.1), 4.5))
    width = 0.2
    series = [("higher-order", "tab:green"), ("depth 1", "tab:blue"), ("depth 0", "tab:gray"),
              ("dbtoaster", "tab:red")]
    for i, (name, color) in enumerate(series):
        xs = [j + (i - 1.5) * width for j in range(len(report))]
        ys = [r.get(name) or 0 for r in report]
        ax.bar(xs, ys, width, label="DBToaster (README)" if name == "dbtoaster" else name,
               color=color)
    ax.set_yscale("log")
    ax.set_ylabel("tuples / second")
    ax.set_xticks(range(len(report)))
    ax.set_xticklabels(labels, fontsize=7)
    ax.legend(fontsize=8)
    ax.set_title("fresh views: refresh rate per program")
    fig.tight_layout()
    path = out / "fresh_rates.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
