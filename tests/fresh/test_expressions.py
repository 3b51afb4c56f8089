"""Fresh views over LIKE with constant patterns, EXTRACT and SUBSTRING (text is interned, so the
runtime memoizes each answer per string): random inserts, updates and deletes, then the view
must equal PostgreSQL evaluating the same SQL; and the forms refused, by name."""

from __future__ import annotations

import datetime
import random
from typing import Any

import psycopg
import pytest
from psycopg import sql

from idivm.catalog import Catalog
from idivm.errors import UnsupportedSQL
from idivm.fresh import FreshView
from idivm.fresh import expr as E

from .test_differential import assert_same

DDL = ("create table item(id int primary key, name text not null, phone text not null, "
       "d date not null, v int not null)")
NAMES = ["forest green", "PROMO BRASS", "STANDARD BRASS", "a_c", "abc", "xa%c", "%", "",
         "the Customer said Complaints", "Customer", "forest", "brass"]
PHONES = ["13-555", "31-000", "1", "", "23-1", "29", "99-1"]

VIEWS = [
    "select extract(year from i.d) as y, extract(month from i.d) as m, sum(i.v) as s, "
    "count(*) as n from i_ i group by extract(year from i.d), extract(month from i.d)",
    "select i.name, sum(i.v) as s from i_ i where i.name like '%BRASS' or i.name like "
    "'forest%' group by i.name",
    "select count(*) as n from i_ i where i.name like '%a_c%' and i.name not like "
    "'%Customer%Complaints%'",
    "select substring(i.phone from 1 for 2) as cc, count(*) as n, sum(i.v) as s from i_ i "
    "where substring(i.phone from 1 for 2) in ('13', '31', '23', '29') "
    "group by substring(i.phone from 1 for 2)",
    "select substring(i.name from 0 for 3) as p, substring(i.name from 3) as rest, "
    "count(*) as n from i_ i group by substring(i.name from 0 for 3), substring(i.name from 3)",
]


def _row(g: random.Random, k: int) -> tuple[Any, ...]:
    return (k, g.choice(NAMES), g.choice(PHONES),
            datetime.date(1994, 11, 20) + datetime.timedelta(days=g.randint(0, 90)),
            g.randint(-5, 20))


@pytest.mark.parametrize("view", range(len(VIEWS)))
def test_text_and_date_functions_equal_recompute(view: int, pg_dsn: str, pg_schema: str,
                                                 cxx: None) -> None:
    view_sql = VIEWS[view].replace("i_", "item")
    fv = FreshView.compile(view_sql, Catalog.from_ddl(DDL), None)
    g = random.Random(view)
    rows: dict[int, tuple[Any, ...]] = {}
    for n in range(300):
        r = g.random()
        if r < 0.6 or len(rows) < 3:
            row = _row(g, n)
            rows[n] = row
            fv.insert("item", row)
        elif r < 0.8:
            k = g.choice(sorted(rows))
            fv.delete("item", rows.pop(k))
        else:
            k = g.choice(sorted(rows))
            new = (k, *_row(g, k)[1:])
            fv.update("item", rows[k], new)
            rows[k] = new
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(pg_schema)))
        conn.execute("DROP TABLE IF EXISTS item")
        conn.execute(DDL)
        with conn.cursor().copy("COPY item FROM STDIN") as cp:
            for row in rows.values():
                cp.write_row(row)
        want = conn.execute(view_sql).fetchall()
    assert_same(fv.rows(), [tuple(int(x) if hasattr(x, "as_integer_ratio") and
                                  not isinstance(x, float) else x for x in r) for r in want],
                VIEWS[view])
    fv.close()


@pytest.mark.parametrize("view_sql, construct", [
    ("select count(*) from item where name ilike 'a%'", "ILIKE"),
    ("select count(*) from item where name like phone", "LIKE with a non-constant pattern"),
    ("select extract(epoch from d) as e, count(*) from item group by extract(epoch from d)",
     "EXTRACT(EPOCH)"),
    ("select substring(name from v for 2) as s, count(*) from item "
     "group by substring(name from v for 2)", "SUBSTRING with non-constant bounds"),
])
def test_refused_forms_name_the_construct(view_sql: str, construct: str) -> None:
    with pytest.raises(UnsupportedSQL, match=construct.replace("(", r"\(").replace(")", r"\)")):
        FreshView.compile(view_sql, Catalog.from_ddl(DDL))


def test_python_evaluation_matches_sql_semantics() -> None:
    assert E.substring("13-555", 1, 2) == "13"
    assert E.substring("abc", 0, 2) == "a"  # PostgreSQL: positions 0 and 1
    assert E.substring("abc", -3, 2) == ""
    assert E.like_regex("%a_c%").fullmatch("xxabcyy")
    assert not E.like_regex("a%").fullmatch("ba")
