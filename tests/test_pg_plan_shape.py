"""Plan shape on PostgreSQL: a maintain costs in proportion to the change, not to the view.

One changed part is maintained over the paper's views at two data sizes (10× apart); the
rows the compiled Δ-script reads from the stored view and its caches (PostgreSQL's own
counters: sequential and index tuple reads) must not grow with the size, and no stored
relation may be scanned whole.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import psycopg
from psycopg import sql

from idivm.examples import PAPER_DDL, V_PRIME_SQL, V_SQL
from idivm.postgres import PostgresMaintainer

VIEWS = {"v": V_SQL, "v_prime": V_PRIME_SQL}


def load(conn: psycopg.Connection[Any], schema: str, links: int) -> None:
    conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(schema)))
    conn.execute(PAPER_DDL)
    n = links // 10
    conn.execute("INSERT INTO devices SELECT 'D' || g, CASE WHEN g %% 5 = 0 THEN 'phone' "
                 "ELSE 'tablet' END FROM generate_series(1, %s) g", (n,))
    conn.execute("INSERT INTO parts SELECT 'P' || g, g %% 100 FROM generate_series(1, %s) g",
                 (n,))
    conn.execute("INSERT INTO devices_parts SELECT DISTINCT 'D' || d, "
                 "'P' || (1 + abs(hashint4(d * 10 + k)) %% %s) "
                 "FROM generate_series(1, %s) d, generate_series(1, 10) k", (n, n))
    conn.execute("ANALYZE")


def stored_reads(conn: psycopg.Connection[Any], companion: str, relations: list[str]
                 ) -> Counter[str]:
    """Tuples read and sequential scans of the given stored relations, summed per kind."""
    out: Counter[str] = Counter()
    for relname, seq, seq_read, idx_fetch in conn.execute(
            "SELECT relname, seq_scan, seq_tup_read, coalesce(idx_tup_fetch, 0) "
            "FROM pg_stat_user_tables WHERE schemaname = %s AND relname = ANY(%s)",
            (companion, relations)):
        out[f"{relname} seq_scan"] += seq
        out["rows"] += seq_read + idx_fetch
    return out


def one_change_reads(dsn: str, schema: str, links: int, parts: int = 1,
                     skip: frozenset[str] = frozenset()) -> dict[str, Counter[str]]:
    """Per view: what maintaining ``parts`` changed parts (one UPDATE) read from its stored
    relations (but those in ``skip``)."""
    batch = [f"P{7 + 13 * i}" for i in range(parts)]
    out: dict[str, Counter[str]] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        load(conn, schema, links)
        with PostgresMaintainer(dsn, schema=schema) as m:
            for view, sql_ in VIEWS.items():
                rels = [r.name for r in m.create_view(view, sql_).materialized
                        if r.name not in skip]
                # a first run compiles the code and fills the session's plan cache
                conn.execute("UPDATE parts SET price = price + 1 WHERE pid = 'P3'")
                m.maintain(view)
                m.conn.execute("SELECT pg_stat_force_next_flush()")
                before = stored_reads(conn, f"{schema}__idivm", rels)
                conn.execute("UPDATE parts SET price = price + 1 WHERE pid = ANY(%s)", (batch,))
                stats = m.maintain(view)
                assert stats.changes["parts"] == parts
                m.conn.execute("SELECT pg_stat_force_next_flush()")
                after = stored_reads(conn, f"{schema}__idivm", rels)
                got = Counter(tuple(r) for r in conn.execute(
                    sql.SQL("SELECT * FROM {}").format(sql.Identifier(schema, view))))
                assert got == Counter(tuple(r) for r in conn.execute(sql_))
                after.subtract(before)
                out[view] = after
                m.drop_view(view)  # the other view's maintain must not touch its relations
    return out


def test_one_change_reads_a_constant_number_of_stored_rows(pg_dsn: str, pg_schema: str
                                                            ) -> None:
    from tests.conftest import at_two_sizes

    small, big = at_two_sizes(pg_dsn, pg_schema, one_change_reads, 20_000, 200_000)
    for view in VIEWS:
        # at the larger size no stored relation is small enough for a whole scan to be cheaper
        scans = {k: n for k, n in big[view].items() if k.endswith("seq_scan") and n}
        assert not scans, f"{view}: stored relations scanned whole: {scans}"
        # a part sits in ~10 links, 2 of them phones: a few dozen rows whatever the size
        assert big[view]["rows"] <= 100, (view, big[view])
        assert big[view]["rows"] <= 2 * small[view]["rows"] + 10, (view, small[view], big[view])


def test_a_batch_probes_the_stored_relations_by_their_ids(pg_dsn: str, pg_schema: str
                                                          ) -> None:
    """200 changed parts at 200k links: each stored relation is probed through its ID index
    for the rows the batch names, never hashed whole (at PostgreSQL's default
    random_page_cost the planner scanned V′'s 20k-row cache for its snapshot and UPDATE)."""
    # (not V′'s own rows, one per phone — 4k — of which the batch changes ~10%: a scan of
    # them may well be the cheaper plan; its cache holds 40k)
    got = one_change_reads(pg_dsn, pg_schema, 200_000, parts=200,
                           skip=frozenset({"v_prime__store"}))
    for view in VIEWS:
        scans = {k: n for k, n in got[view].items() if k.endswith("seq_scan") and n}
        assert not scans, f"{view}: stored relations scanned whole: {scans}"
        # 200 parts in ~10 links each, ~2 of them phones: rows read ≈ a few per part
        assert got[view]["rows"] <= 12 * 200, (view, got[view])
