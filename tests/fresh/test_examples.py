"""The worked examples of the DBToaster papers, reproduced on fresh views; refusals; the C ABI
paths (upsert, key errors, replay formats)."""

from __future__ import annotations

from pathlib import Path

import pytest

from idivm.catalog import Catalog
from idivm.errors import UnsupportedSQL
from idivm.fresh import FreshError, FreshView
from idivm.fresh.program import compile_program
from idivm.fresh.query import translate

RS = Catalog.from_ddl("create table r(id int primary key, a int not null);"
                      "create table s(id int primary key, b int not null);")


def test_seed000_example1_counts(cxx: None) -> None:
    """Example 1: Q = count(R × S) with ΔR Q = count(S), ΔS Q = count(R): the table of states
    after inserts S, R, S, S from |R| = 2, |S| = 3."""
    fv = FreshView.compile("select count(*) as q from r, s", RS)
    prog = fv.program
    # the first-order maps are count(S) and count(R); the second-order delta is the constant 1
    defs = {m.name: m.show() for m in prog.maps if m.role == "aux"}
    assert len(defs) == 2 and all(m.arity == 0 for m in prog.maps)
    by_rel = {next(iter({a.rel for mono in m.monos for a in mono.atoms})): m.name
              for m in prog.maps if m.role == "aux"}

    def state() -> tuple[int, int, int]:
        q = fv.rows()[0][0]
        d_r = fv.map_contents(by_rel["s"]).get((), 0)  # ΔR Q = count(S)
        d_s = fv.map_contents(by_rel["r"]).get((), 0)  # ΔS Q = count(R)
        return q, int(d_r), int(d_s)

    for i in range(2):
        fv.insert("r", (i, 0))
    for i in range(3):
        fv.insert("s", (i, 0))
    assert state() == (6, 3, 2)
    rows = []
    for n, rel in enumerate("SRSS"):
        fv.insert(rel.lower(), (100 + n, 0))
        rows.append(state())
    assert rows == [(8, 4, 2), (12, 4, 3), (15, 5, 3), (18, 6, 3)]


def test_seed000_example2_triggers(cxx: None) -> None:
    """Example 2: sum(LI.price * O.xch) over Orders ⋈ LineItem: insert into O adds
    xch * Q_O[ordk] to Q and xch to Q_LI[ordk]; and symmetrically; deletes negate."""
    cat = Catalog.from_ddl("create table o(ordk int primary key, custk int not null, "
                           "xch numeric not null);"
                           "create table li(ordk int not null, partk int not null, "
                           "price numeric not null, primary key (ordk, partk));")
    q = translate("select sum(li.price * o.xch) as q from o, li where o.ordk = li.ordk", cat)
    prog = compile_program(q, cat)
    ins_o = [s for s in prog.triggers["o"]["insert"] if s.target == prog.agg_maps[0]]
    ins_li = [s for s in prog.triggers["li"]["insert"] if s.target == prog.agg_maps[0]]
    # one point lookup per statement, keyed by the event's ordk: no loop, no join
    for stmts in (ins_o, ins_li):
        assert len(stmts) == 1 and len(stmts[0].loops) == 1
        assert all(b is not None for b in stmts[0].loops[0].bound)
    fv = FreshView.compile(q.sql, cat)
    fv.insert("o", (1, 7, 2.0))
    fv.insert("li", (1, 1, 10.0))
    fv.insert("li", (1, 2, 5.0))
    fv.insert("o", (2, 7, 3.0))
    fv.insert("li", (2, 1, 1.0))
    assert fv.rows() == [(33.0,)]
    fv.delete("li", (1, 1, 10.0))
    assert fv.rows() == [(13.0,)]
    fv.update("o", (1, 7, 2.0), (1, 7, 4.0))  # xch is a value column: adjusted in place
    assert fv.rows() == [(23.0,)]


def test_seed002_figure2_maps(cxx: None) -> None:
    """Figure 2 of seed 002: sum(A*D) over R(A,B) ⋈ S(B,C) ⋈ T(C,D) needs q_D[b], q_A[b],
    q_D[c], q_A[c] and q_1[b,c]; inserting into S is q_A[b] * q_D[c]."""
    cat = Catalog.from_ddl("create table r(id int primary key, a int not null, b int not null);"
                           "create table s(id int primary key, b int not null, c int not null);"
                           "create table t(id int primary key, c int not null, d int not null);")
    q = translate("select sum(r.a * t.d) as q from r, s, t where r.b = s.b and s.c = t.c", cat)
    prog = compile_program(q, cat)
    bodies = {m.monos[0].show(): m for m in prog.maps if m.role == "aux"}
    wanted = {"r(v1, v2, k0) · v2": 1,  # q_A[b] = sum_A(σ_B=b R)
              "t(v1, k0, v2) · v2": 1,  # q_D[c] = sum_D(σ_C=c T)
              "r(v1, v2, v3) · s(v4, v3, k0) · v2": 1,  # q_A[c]
              "s(v1, k0, v2) · t(v3, v2, v4) · v4": 1}  # q_D[b]
    for body in wanted:
        assert body in bodies, (body, sorted(bodies))
    assert any(m.arity == 2 and len(m.monos[0].atoms) == 1 and m.monos[0].atoms[0].rel == "s"
               for m in prog.maps)  # q_1[b, c]
    sum_map = prog.agg_maps[0]
    (ins_s,) = [s for s in prog.triggers["s"]["insert"] if s.target == sum_map]
    assert [len(lp.bound) for lp in ins_s.loops] == [1, 1] and not ins_s.factors
    fv = FreshView.compile(q.sql, cat)
    fv.insert("r", (1, 2, 10))
    fv.insert("s", (1, 10, 5))
    fv.insert("t", (1, 5, 7))
    fv.insert("t", (2, 5, 3))
    fv.insert("r", (2, 1, 10))
    assert fv.rows() == [(30,)]


@pytest.mark.parametrize("view_sql, construct", [
    ("select r.a, (select count(*) from s) from r", "scalar subquery"),
    ("select r.a from r where exists (select 1 from s where s.b < r.a)",
     "EXISTS/IN correlated by a non-equality"),
    ("select r.a from r left join s on r.a = s.b", "outer join"),
    ("select a from r union select b from s", "UNION"),
    ("select e.when_ from e", "column type TIMESTAMP"),
])
def test_refusals_name_the_construct(view_sql: str, construct: str, tmp_path: Path) -> None:
    cat = Catalog.from_ddl("create table r(id int primary key, a int not null);"
                           "create table s(id int primary key, b int not null);"
                           "create table e(id int primary key, when_ timestamp not null);")
    with pytest.raises(UnsupportedSQL) as err:
        FreshView.compile(view_sql, cat)
    assert construct in str(err.value)


def test_key_errors_change_nothing(cxx: None) -> None:
    fv = FreshView.compile("select sum(r.a) as x, count(*) as n from r", RS)
    fv.insert("r", (1, 5))
    with pytest.raises(FreshError, match="duplicate key"):
        fv.insert("r", (1, 6))
    with pytest.raises(FreshError, match="no row"):
        fv.delete("r", (2, 5))
    with pytest.raises(FreshError, match="no row"):
        fv.update("r", (3, 1), (3, 2))
    assert fv.rows() == [(5, 1)]
    fv.upsert("r", (1, 9))  # the row with key 1 now has a = 9 (in place)
    fv.upsert("r", (2, 1))  # absent: inserted
    assert fv.rows() == [(10, 2)]
    fv.delete("r", (1, 0))  # by key: the stored row is deleted
    assert fv.rows() == [(1, 1)]
    with pytest.raises(FreshError, match="does not read"):
        fv.insert("nosuch", (1, 2))


def test_replay_events_file(tmp_path: Path, cxx: None) -> None:
    fv = FreshView.compile("select r.a, count(*) as n from r, s where r.a = s.b group by r.a",
                           RS)
    path = tmp_path / "ev.csv"
    path.write_text("+,r,1,10\n+,r,2,20\n+,s,1,10\n+,s,2,10\n-,s,2,10\nu,r,2,10\n"
                    "+,other,1,2,3\n")
    stats = fv.replay(path)
    assert (stats.events, stats.refused) == (6, 0) and stats.map_bytes > 0
    assert sorted(fv.rows()) == [(10, 2)]
    bad = tmp_path / "bad.csv"
    bad.write_text("+,r,1\n")
    with pytest.raises(FreshError, match="line 1"):
        fv.replay(bad)
    assert sorted(fv.rows()) == [(10, 2)]


def test_apply_changes_cdf_and_pg_log(cxx: None) -> None:
    fv = FreshView.compile("select sum(r.a) as x, count(*) as n from r", RS)
    cdf = [{"id": 1, "a": 5, "_change_type": "insert", "_commit_version": 1},
           {"id": 2, "a": 7, "_change_type": "insert", "_commit_version": 1},
           {"id": 1, "a": 5, "_change_type": "update_preimage", "_commit_version": 2},
           {"id": 1, "a": 6, "_change_type": "update_postimage", "_commit_version": 2},
           {"id": 2, "a": 7, "_change_type": "delete", "_commit_version": 3}]
    assert fv.apply_changes("r", cdf) == 4  # the pre/post pair is one update
    assert fv.rows() == [(6, 1)]
    log = [{"__seq": 2, "__op": "I", "id": 1, "a": 9}, {"__seq": 1, "__op": "D", "id": 1, "a": 6},
           {"__seq": 3, "__op": "I", "id": 3, "a": 1}]
    assert fv.apply_changes("r", log) == 2
    assert fv.rows() == [(10, 2)]
    assert fv.apply_changes("s", [{"id": 1, "b": 2, "_change_type": "insert"}]) == 0
    with pytest.raises(FreshError, match="_change_type"):
        fv.apply_changes("r", [{"id": 4, "a": 1, "_change_type": "upsert"}])
