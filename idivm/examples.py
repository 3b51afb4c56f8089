"""The paper's running example (Figures 1, 2, 5) and a miniature social schema, shared by the
demo, the benchmarks, ``scripts_out/`` and the tests."""

from __future__ import annotations

# Figure 1.
PAPER_DDL = """
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
    pid text NOT NULL REFERENCES parts (pid),
    PRIMARY KEY (did, pid)
);
"""

# Figure 2.
PAPER_INSTANCE = """
INSERT INTO devices VALUES ('D1', 'phone'), ('D2', 'phone'), ('D3', 'tablet');
INSERT INTO parts VALUES ('P1', 10), ('P2', 20);
INSERT INTO devices_parts VALUES ('D1', 'P1'), ('D2', 'P1'), ('D1', 'P2'), ('D3', 'P2');
"""

_JOIN = "parts NATURAL JOIN devices_parts NATURAL JOIN devices WHERE category = 'phone'"
V_SQL = f"SELECT did, pid, price FROM {_JOIN}"
V_PRIME_SQL = f"SELECT did, sum(price) AS cost FROM {_JOIN} GROUP BY did"
PRICE_ONLY: dict[str, list[str]] = {"parts": ["update:price"]}


# A miniature of the BSMA social-media schema the paper evaluates on.
SOCIAL_DDL = """
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
    mid int NOT NULL REFERENCES microblog (mid),
    uid int NOT NULL REFERENCES users (uid),
    PRIMARY KEY (mid, uid)
);
CREATE TABLE friendlist (
    uid         int NOT NULL REFERENCES users (uid),
    followee_id int NOT NULL REFERENCES users (uid),
    PRIMARY KEY (uid, followee_id)
);
"""

