"""Base-table schemas of the differential tests, as PostgreSQL DDL text.

Every table has a primary key; aggregated columns are integers or fixed-point numerics so that
incrementally maintained sums are exact. Table names are unqualified: the harness creates them
inside a per-test schema (``search_path``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SchemaDef:
    """A named set of base tables: DDL text plus the tables in creation order (parents first)."""

    key: str
    ddl: str
    tables: tuple[str, ...]

    def statements(self) -> list[str]:
        """The DDL split into single ``CREATE TABLE`` statements."""
        return [s.strip() for s in self.ddl.split(";") if s.strip()]


# (a) The running example of the ID-based IVM paper. ``category`` is nullable on purpose.
PAPER = SchemaDef(
    key="paper",
    ddl="""
CREATE TABLE devices (
    did      text PRIMARY KEY,
    category text
);
CREATE TABLE parts (
    pid   text PRIMARY KEY,
    price int NOT NULL
);
CREATE TABLE devices_parts (
    did text NOT NULL REFERENCES devices (did),
    pid text NOT NULL,
    PRIMARY KEY (did, pid),
    FOREIGN KEY (pid) REFERENCES parts (pid)
);
""",
    tables=("devices", "parts", "devices_parts"),
)

# (b) A miniature of the BSMA social-media schema. ``mention.mid`` cascades deletes.
SOCIAL = SchemaDef(
    key="social",
    ddl="""
CREATE TABLE users (
    uid       int PRIMARY KEY,
    name      text NOT NULL,
    city      int,
    tweetsnum int NOT NULL,
    favornum  int NOT NULL
);
CREATE TABLE microblog (
    mid     int PRIMARY KEY,
    uid     int NOT NULL REFERENCES users (uid),
    time    int NOT NULL,
    content text
);
CREATE TABLE mention (
    mid int NOT NULL REFERENCES microblog (mid) ON DELETE CASCADE,
    uid int NOT NULL REFERENCES users (uid),
    PRIMARY KEY (mid, uid)
);
CREATE TABLE friendlist (
    uid         int NOT NULL,
    followee_id int NOT NULL,
    CONSTRAINT friendlist_pk PRIMARY KEY (uid, followee_id),
    CONSTRAINT friendlist_uid_fk FOREIGN KEY (uid) REFERENCES users (uid),
    CONSTRAINT friendlist_followee_fk FOREIGN KEY (followee_id) REFERENCES users (uid)
);
""",
    tables=("users", "microblog", "mention", "friendlist"),
)

# (c) TPC-H flavoured orders: composite key on lineitem, nullable numerics and a nullable FK.
# ``lineitem.orderkey`` cascades both updates and deletes of ``orders``.
ORDERS = SchemaDef(
    key="orders",
    ddl="""
CREATE TABLE customers (
    custkey int PRIMARY KEY,
    name    text NOT NULL,
    nation  text NOT NULL,
    segment text,
    acctbal numeric(10, 2)
);
CREATE TABLE orders (
    orderkey  int PRIMARY KEY,
    custkey   int REFERENCES customers (custkey),
    status    text NOT NULL,
    orderdate int NOT NULL,
    priority  int
);
CREATE TABLE lineitem (
    orderkey      int NOT NULL REFERENCES orders (orderkey) ON UPDATE CASCADE ON DELETE CASCADE,
    linenumber    int NOT NULL,
    partno        int NOT NULL,
    quantity      int NOT NULL,
    extendedprice numeric(10, 2),
    discount      numeric(3, 2),
    PRIMARY KEY (orderkey, linenumber)
);
""",
    tables=("customers", "orders", "lineitem"),
)

# (d) Two unrelated tables with union-compatible columns, for set operations.
SETOPS = SchemaDef(
    key="setops",
    ddl="""
CREATE TABLE r (
    a int PRIMARY KEY,
    b int NOT NULL,
    c int
);
CREATE TABLE s (
    x int PRIMARY KEY,
    y int NOT NULL,
    z int
);
""",
    tables=("r", "s"),
)

SCHEMAS: dict[str, SchemaDef] = {s.key: s for s in (PAPER, SOCIAL, ORDERS, SETOPS)}
