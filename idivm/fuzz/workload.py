"""Initial rows and random change rounds: inserts (some upserts), deletes, updates of key and
non-key columns, NULLs, a row inserted and deleted in one round, cascades through foreign keys,
multi-statement transactions with savepoints and rollbacks, empty rounds.

Statements are generated from the schema alone (small value domains make them hit rows), so a
case is a pure function of its seed. The executor runs each statement inside a savepoint: one
that violates a constraint is rolled back to it, as an application would.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from idivm.fuzz.schema import (
    KEY_DOMAIN,
    FuzzConfig,
    SchemaDef,
    TableDef,
    kind_value,
    literal,
    random_schema,
    random_value,
)
from idivm.fuzz.views import random_view

CONTROL = ("SAVEPOINT ", "ROLLBACK TO SAVEPOINT ", "RELEASE SAVEPOINT ")


@dataclass(frozen=True)
class Txn:
    """Statements run in one transaction; ``commit`` False ends it with ROLLBACK. Statements
    starting with one of ``CONTROL`` are savepoint commands of the transaction itself."""

    statements: tuple[str, ...]
    commit: bool = True


Round = tuple[Txn, ...]


@dataclass(frozen=True)
class Case:
    """Everything one seed generates: schema, initial rows, views, change rounds."""

    seed: int
    schema: SchemaDef
    setup: tuple[str, ...]
    views: tuple[str, ...]
    rounds: tuple[Round, ...]


def random_case(seed: int, config: FuzzConfig, views: int, rounds: int) -> Case:
    """The case of ``seed``: one schema, ``views`` views over it, ``rounds`` change rounds."""
    rng = random.Random(seed)
    schema = random_schema(rng, config)
    setup = tuple(initial_rows(random.Random(f"{seed}:data"), schema))
    vs = tuple(random_view(random.Random(f"{seed}:view:{i}"), schema) for i in range(views))
    rs = tuple(random_round(random.Random(f"{seed}:round:{i}"), schema)
               for i in range(rounds))
    return Case(seed, schema, setup, vs, rs)


def _row(rng: random.Random, t: TableDef, keys: dict[str, list[int]],
         key: tuple[object, ...] | None = None, null_share: float = 0.15) -> list[str]:
    fk_of = {fk.column: fk for fk in t.foreign_keys}
    vals: list[str] = []
    for i, c in enumerate(t.columns):
        if key is not None and i < len(t.primary_key):
            vals.append(literal(c.kind, key[i]))
            continue
        fk = fk_of.get(c.name)
        if fk is not None and keys.get(fk.ref_table):
            if c.nullable and rng.random() < 0.15:
                vals.append("NULL")
            else:
                vals.append(str(rng.choice(keys[fk.ref_table])))
            continue
        if fk is not None and c.nullable:
            vals.append("NULL")
            continue
        vals.append(literal(c.kind, random_value(rng, c, null_share)))
    return vals


def _insert(t: TableDef, rows: list[list[str]], suffix: str = "") -> str:
    values = ", ".join(f"({', '.join(r)})" for r in rows)
    return f"INSERT INTO {t.name} ({', '.join(c.name for c in t.columns)}) VALUES {values}{suffix}"


def _key(rng: random.Random, t: TableDef) -> tuple[object, ...]:
    return tuple(kind_value(rng, t.column(k).type) if t.column(k).kind != "int"
                 else rng.randint(1, KEY_DOMAIN) for k in t.primary_key)


def initial_rows(rng: random.Random, schema: SchemaDef) -> list[str]:
    """INSERTs of 5–12 rows per table, referenced tables first (a self reference points at
    rows inserted before)."""
    keys: dict[str, list[int]] = {}
    out: list[str] = []
    for t in schema.tables:
        if schema.triggers and t.name == schema.triggers[0].target:
            continue
        seen: set[tuple[object, ...]] = set()
        for _ in range(rng.randint(5, 12)):
            k = _key(rng, t)
            if k in seen:
                continue
            seen.add(k)
            out.append(_insert(t, [_row(rng, t, keys, k, 0.15)]))
            if len(t.primary_key) == 1 and t.column(t.primary_key[0]).kind == "int":
                keys.setdefault(t.name, []).append(int(str(k[0])))
    for child, parent in schema.children:
        t = schema.table(parent)
        row = _row(rng, t, keys, (KEY_DOMAIN + 1,) * len(t.primary_key)
                   if t.column(t.primary_key[0]).kind == "int" else None)
        out.append(f"INSERT INTO {child} ({', '.join(c.name for c in t.columns)}) "
                   f"VALUES ({', '.join(row)})")
    return out


def _keys_pred(rng: random.Random, t: TableDef) -> str:
    """A WHERE over ``t`` hitting about one or a few rows."""
    r = rng.random()
    k0 = t.column(t.primary_key[0])
    if r < 0.6 or not t.non_key:
        k = _key(rng, t)
        return " AND ".join(f"{c} = {literal(t.column(c).kind, v)}"
                            for c, v in zip(t.primary_key, k, strict=True))
    if r < 0.8 and k0.kind == "int":
        return f"{k0.name} {rng.choice(['<', '>', '<=', '>='])} {rng.randint(1, KEY_DOMAIN)}"
    c = rng.choice([c for c in t.non_key if c.kind != "json"] or [k0])
    if c.nullable and rng.random() < 0.3:
        return f"{c.name} IS NULL"
    return f"{c.name} = {literal(c.kind, kind_value(rng, c.type))}"


def random_statement(rng: random.Random, schema: SchemaDef) -> list[str]:
    """One change (a list: an insert-then-delete is two statements)."""
    writable = [t for t in schema.tables
                if not (schema.triggers and t.name == schema.triggers[0].target)]
    t = rng.choice(writable)
    fresh = schema.config.profile == "fresh"
    null_share = 0.0 if fresh else 0.2
    keys = {p.name: list(range(1, KEY_DOMAIN + 1)) for p in schema.tables}
    r = rng.random()
    if schema.children and r < 0.08:  # a row of an inheritance child (read through its parent)
        child, parent = rng.choice(schema.children)
        pt = schema.table(parent)
        ckey = None
        if pt.column(pt.primary_key[0]).kind == "int":
            ckey = (KEY_DOMAIN + 2 + rng.randint(0, 3),) * len(pt.primary_key)
        values = ", ".join(_row(rng, pt, keys, ckey, null_share))
        return [f"INSERT INTO {child} ({', '.join(c.name for c in pt.columns)}) "
                f"VALUES ({values})"]
    if r < 0.30:
        rows = [_row(rng, t, keys, _key(rng, t), null_share) for _ in range(rng.randint(1, 2))]
        suffix = ""
        if rng.random() < 0.3:
            others = [c.name for c in t.non_key]
            if others and rng.random() < 0.6:
                sets = ", ".join(f"{c} = EXCLUDED.{c}" for c in others)
                suffix = f" ON CONFLICT ({', '.join(t.primary_key)}) DO UPDATE SET {sets}"
            else:
                suffix = " ON CONFLICT DO NOTHING"
        if suffix and len(rows) > 1:
            rows = rows[:1]
        return [_insert(t, rows, suffix)]
    if r < 0.45:
        return [f"DELETE FROM {t.name} WHERE {_keys_pred(rng, t)}"]
    if r < 0.75 and t.non_key:
        assign: list[str] = []
        for c in rng.sample(t.non_key, rng.randint(1, min(2, len(t.non_key)))):
            fk = [f for f in t.foreign_keys if f.column == c.name]
            if c.nullable and rng.random() < 0.15:
                assign.append(f"{c.name} = NULL")
            elif fk:
                assign.append(f"{c.name} = {rng.randint(1, KEY_DOMAIN)}")
            elif c.kind in ("int", "num") and rng.random() < 0.3:
                assign.append(f"{c.name} = {c.name} + 1")
            else:
                assign.append(f"{c.name} = {literal(c.kind, kind_value(rng, c.type))}")
        return [f"UPDATE {t.name} SET {', '.join(assign)} WHERE {_keys_pred(rng, t)}"]
    if r < 0.88:
        # a key update: moves a row (cascades to referencing rows when declared so)
        k = t.column(t.primary_key[0])
        if k.kind == "int":
            expr = rng.choice([f"{k.name} + {KEY_DOMAIN}", f"{k.name} + 1",
                               str(rng.randint(1, KEY_DOMAIN + 3))])
        else:
            expr = literal(k.kind, kind_value(rng, k.type))
        return [f"UPDATE {t.name} SET {k.name} = {expr} WHERE {_keys_pred(rng, t)}"]
    # a row inserted and deleted in the same round (or transaction)
    key = tuple(KEY_DOMAIN + 5 + i if t.column(c).kind == "int" else
                kind_value(rng, t.column(c).type) for i, c in enumerate(t.primary_key))
    row = _row(rng, t, keys, key, null_share)
    pred = " AND ".join(f"{c} = {literal(t.column(c).kind, v)}"
                        for c, v in zip(t.primary_key, key, strict=True))
    return [_insert(t, [row], " ON CONFLICT DO NOTHING"), f"DELETE FROM {t.name} WHERE {pred}"]


def random_round(rng: random.Random, schema: SchemaDef) -> Round:
    """0–3 transactions of 1–6 changes; some with a savepoint rolled back, some rolled back."""
    if rng.random() < 0.1:
        return ()
    txns = []
    for i in range(rng.choices([1, 2, 3], [55, 30, 15])[0]):
        stmts: list[str] = []
        for j in range(rng.randint(1, 6)):
            if rng.random() < 0.12:
                sp = f"sp{i}_{j}"
                inner = random_statement(rng, schema)
                stmts += [f"SAVEPOINT {sp}", *inner,
                          f"ROLLBACK TO SAVEPOINT {sp}" if rng.random() < 0.6
                          else f"RELEASE SAVEPOINT {sp}"]
            else:
                stmts += random_statement(rng, schema)
        txns.append(Txn(tuple(stmts), commit=rng.random() > 0.08))
    return tuple(txns)


def round_text(rnd: Round) -> str:
    """A round as a psql script."""
    lines = []
    for txn in rnd:
        lines.append("BEGIN;")
        lines += [f"  {s};" for s in txn.statements]
        lines.append("COMMIT;" if txn.commit else "ROLLBACK;")
    return "\n".join(lines) if lines else "-- (empty round)"
