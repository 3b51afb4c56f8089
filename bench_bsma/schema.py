"""The BSMA schema with keys (BSMA declared none; ../shared/bsma/README.md fixes them)."""

from __future__ import annotations

from idivm.catalog import Catalog

DDL = """
CREATE TABLE users (
    uid             int PRIMARY KEY,
    name            text NOT NULL,
    city            int NOT NULL,
    gender          int NOT NULL,
    followers_count int NOT NULL,
    friends_count   int NOT NULL,
    tweetsnum       int NOT NULL,
    favornum        int NOT NULL,
    verified        int NOT NULL,
    created_time    bigint NOT NULL
);
CREATE TABLE friendlist (
    uid         int NOT NULL REFERENCES users (uid),
    followee_id int NOT NULL REFERENCES users (uid),
    PRIMARY KEY (uid, followee_id)
);
CREATE TABLE microblog (
    mid           bigint PRIMARY KEY,
    uid           int NOT NULL REFERENCES users (uid),
    time          bigint NOT NULL,
    content       text NOT NULL,
    client        int NOT NULL,
    repost_count  int NOT NULL,
    comment_count int NOT NULL,
    rtmid         bigint
);
CREATE TABLE retweet (
    mid   bigint NOT NULL REFERENCES microblog (mid),
    remid bigint NOT NULL REFERENCES microblog (mid),
    PRIMARY KEY (mid, remid)
);
CREATE TABLE mention (
    mid bigint NOT NULL REFERENCES microblog (mid),
    uid int NOT NULL REFERENCES users (uid),
    PRIMARY KEY (mid, uid)
);
CREATE TABLE event (
    eventid     int PRIMARY KEY,
    tag         text NOT NULL,
    start_time  bigint NOT NULL,
    location_id int NOT NULL
);
CREATE TABLE rel_event_microblog (
    eventid int NOT NULL REFERENCES event (eventid),
    mid     bigint NOT NULL REFERENCES microblog (mid),
    PRIMARY KEY (eventid, mid)
);
"""

TABLES = ("users", "friendlist", "microblog", "retweet", "mention", "event",
          "rel_event_microblog")


def catalog() -> Catalog:
    return Catalog.from_ddl(DDL)
