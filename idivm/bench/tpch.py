"""TPC-H for the benchmarks: the schema with the specification's primary keys, DuckDB's TPC-H
extension loaded offline, and the 22 queries as view definitions."""

from __future__ import annotations

import glob
from pathlib import Path
from typing import Any

import sqlglot
from sqlglot import exp

TPCH_DDL = """
create table part(p_partkey int primary key, p_name text not null, p_mfgr text not null,
  p_brand text not null, p_type text not null, p_size int not null, p_container text not null,
  p_retailprice numeric not null, p_comment text not null);
create table supplier(s_suppkey int primary key, s_name text not null, s_address text not null,
  s_nationkey int not null, s_phone text not null, s_acctbal numeric not null,
  s_comment text not null);
create table partsupp(ps_partkey int not null, ps_suppkey int not null, ps_availqty int not null,
  ps_supplycost numeric not null, ps_comment text not null, primary key (ps_partkey, ps_suppkey));
create table customer(c_custkey int primary key, c_name text not null, c_address text not null,
  c_nationkey int not null, c_phone text not null, c_acctbal numeric not null,
  c_mktsegment text not null, c_comment text not null);
create table orders(o_orderkey int primary key, o_custkey int not null,
  o_orderstatus text not null, o_totalprice numeric not null, o_orderdate date not null,
  o_orderpriority text not null, o_clerk text not null, o_shippriority int not null,
  o_comment text not null);
create table lineitem(l_orderkey int not null, l_partkey int not null, l_suppkey int not null,
  l_linenumber int not null, l_quantity numeric not null, l_extendedprice numeric not null,
  l_discount numeric not null, l_tax numeric not null, l_returnflag text not null,
  l_linestatus text not null, l_shipdate date not null, l_commitdate date not null,
  l_receiptdate date not null, l_shipinstruct text not null, l_shipmode text not null,
  l_comment text not null, primary key (l_orderkey, l_linenumber));
create table nation(n_nationkey int primary key, n_name text not null, n_regionkey int not null,
  n_comment text not null);
create table region(r_regionkey int primary key, r_name text not null, r_comment text not null);
"""

# Indexes on the foreign keys, as TPC-H allows (clause 1.4.2.2: primary and foreign keys
# only): a DBA gives them to any workload that joins through them, and every refresh strategy
# here (recompute, REFRESH, tuple, pg_ivm, id) runs with them. lineitem's key to partsupp is
# (l_partkey, l_suppkey); l_orderkey and ps_partkey lead their primary keys already.
FK_INDEXES = """
create index on nation (n_regionkey);
create index on supplier (s_nationkey);
create index on customer (c_nationkey);
create index on partsupp (ps_suppkey);
create index on orders (o_custkey);
create index on lineitem (l_partkey, l_suppkey);
create index on lineitem (l_suppkey);
"""

TABLES = ("region", "nation", "part", "supplier", "partsupp", "customer", "orders", "lineitem")


def load_tpch_extension(con: Any) -> None:
    """Load DuckDB's TPC-H extension from the ``duckdb-ext-tpch`` wheel (``INSTALL tpch``
    would download it, which fails offline); fall back to INSTALL where the wheel is absent."""
    import duckdb

    ext = glob.glob(str(Path(duckdb.__file__).parent.parent / "duckdb_ext" / "**" /
                        "tpch.duckdb_extension*"), recursive=True)
    if ext:
        con.execute(f"LOAD '{ext[0]}'")
    else:
        con.execute("INSTALL tpch")
        con.execute("LOAD tpch")


def as_view(query: str) -> str:
    """A TPC-H query as a view definition (PostgreSQL SQL): ORDER BY and LIMIT removed, since
    a materialized view has no order."""
    tree = sqlglot.parse_one(query, read="duckdb")
    assert isinstance(tree, exp.Query)
    tree.set("order", None)
    tree.set("limit", None)
    return tree.sql("postgres")


def queries() -> dict[int, str]:
    """The 22 TPC-H queries (as DuckDB's extension ships them), as view definitions."""
    import duckdb

    con = duckdb.connect()
    load_tpch_extension(con)
    rows = con.execute("SELECT query_nr, query FROM tpch_queries()").fetchall()
    return {int(n): as_view(q) for n, q in rows}
