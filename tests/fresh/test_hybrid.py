"""The hybrid pipeline on PostgreSQL: one view deferred (Δ-scripts), one fresh (C++), fed by
the same change log; both equal the recomputed query after random DML."""

from __future__ import annotations

import random

import psycopg
import pytest
from psycopg import sql

from idivm.catalog import Catalog
from idivm.errors import IdivmError
from idivm.hybrid import Pipeline
from idivm.postgres import PostgresMaintainer

DDL = ("create table item(id int primary key, cat int not null, price numeric(8,2) not null);"
       "create table cat(cid int primary key, name text not null);")
VIEW = ("select c.name, count(*) as n, sum(i.price) as total from item i join cat c "
        "on i.cat = c.cid group by c.name")


def _norm(rows: list[tuple[object, ...]]) -> list[tuple[object, ...]]:
    return sorted(tuple(round(float(x), 4) if not isinstance(x, str | int) else x for x in r)
                  for r in rows)


def test_deferred_and_fresh_views_share_the_change_log(pg_dsn: str, pg_schema: str,
                                                       cxx: None) -> None:
    cat = Catalog.from_ddl(DDL)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(pg_schema)))
        for ddl in cat.ddl():
            conn.execute(ddl)
        conn.execute("insert into cat values (1, 'a'), (2, 'b'), (3, 'c')")
        conn.execute("insert into item select g, g % 3 + 1, g * 1.5 from generate_series(1, 30) g")
        with PostgresMaintainer(pg_dsn, pg_schema) as pg:
            pipe = Pipeline(cat, postgres=pg)
            pipe.add_view("by_cat", VIEW, "deferred")
            pipe.add_view("by_cat_fresh", VIEW, "fresh")
            with pytest.raises(IdivmError, match="already"):
                pipe.add_view("by_cat", VIEW, "fresh")
            rng = random.Random(3)
            for rnd in range(4):
                for _ in range(15):
                    k = rng.randint(1, 45)
                    r = rng.random()
                    if r < 0.4:
                        conn.execute("insert into item values (%s, %s, %s) on conflict do "
                                     "nothing", (k, rng.randint(1, 3), rng.randint(1, 99)))
                    elif r < 0.7:
                        conn.execute("update item set price = price + 1 where id = %s", (k,))
                    elif r < 0.85:
                        conn.execute("update item set cat = %s where id = %s",
                                     (rng.randint(1, 3), k))
                    else:
                        conn.execute("delete from item where id = %s", (k,))
                if rnd == 2:
                    conn.execute("update cat set name = 'z' where cid = 2")
                pipe.refresh()
                want = conn.execute(VIEW).fetchall()
                assert _norm(pipe.rows("by_cat")) == _norm(want)
                assert _norm(pipe.rows("by_cat_fresh")) == _norm(want)


def test_fresh_views_see_nested_changes_once(pg_dsn: str, pg_schema: str, cxx: None) -> None:
    """A row trigger that writes its own table logs the nested UPDATE before the outer INSERT:
    a fresh view fed from the log gets the net change per key, not the log's order."""
    cat = Catalog.from_ddl("create table t(i int primary key, v int)")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(pg_schema)))
        for ddl in cat.ddl():
            conn.execute(ddl)
        with PostgresMaintainer(pg_dsn, pg_schema) as pg:
            pipe = Pipeline(cat, postgres=pg)
            pipe.add_view("vf", "select t.i, t.v from t", "fresh")
            conn.execute("create function bump() returns trigger language plpgsql as "
                         "$$ begin update t set i = i + 1 where i = new.i; return null; end $$")
            conn.execute("create trigger bump after insert on t for each row "
                         "execute function bump()")
            conn.execute("insert into t values (10, 1)")
            conn.execute("insert into t values (9, 2)")
            conn.execute("update t set v = v + 1")
            pipe.refresh()
            want = conn.execute("select i, v from t").fetchall()
            assert _norm(pipe.rows("vf")) == _norm(want)
