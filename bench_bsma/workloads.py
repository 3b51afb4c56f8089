"""Change batches over a BSMA data set (../shared/bsma/README.md, "Workloads").

A batch is a list of row-level changes with full pre- and post-images, so the same batch can be
run as DML on PostgreSQL or handed to Spark as a Delta-CDF-shaped feed. ``State`` tracks the
current contents (the generator's arrays plus what batches changed), so batches stay valid
(keys exist, foreign keys hold) however many are applied.

- ``users`` (the paper's): ``d`` updates of tweetsnum and favornum on distinct users — for
  every view a non-conditional attribute;
- ``city``: ``d`` users move to another city (a conditional attribute of Q*1's join);
- ``insert``: ``d`` new posts inside the views' time range with their mentions, retweets and
  event links (the generator's shares);
- ``delete``: ``d`` posts of the range removed with their dependents (mentions, event links,
  retweet rows naming them either way);
- ``mixed``: a quarter of each of the above.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench_bsma.generate import RANGE, Dataset, value

WORKLOADS = ("users", "city", "insert", "delete", "mixed")
KEYS = {"users": ("uid",), "friendlist": ("uid", "followee_id"), "microblog": ("mid",),
        "retweet": ("mid", "remid"), "mention": ("mid", "uid"), "event": ("eventid",),
        "rel_event_microblog": ("eventid", "mid")}


@dataclass(frozen=True)
class Change:
    table: str
    kind: str  # "insert", "delete", "update"
    old: tuple[Any, ...] | None
    new: tuple[Any, ...] | None


class State:
    """Current rows of the tables a workload changes (users, microblog and its dependents)."""

    def __init__(self, ds: Dataset) -> None:
        self.columns = {t: list(cols) for t, cols in ds.tables.items()}
        u = ds.tables["users"]
        self.users: dict[int, list[Any]] = {
            int(r[0]): list(r) for r in zip(*[u[c].tolist() for c in u], strict=True)}
        mb = ds.tables["microblog"]
        self.posts: dict[int, tuple[Any, ...]] = {
            int(r[0]): tuple(value("microblog", c, v) for c, v in zip(mb, r, strict=True))
            for r in zip(*[mb[c].tolist() for c in mb], strict=True)}
        self.mentions: dict[int, list[int]] = {}
        for mid, uid in zip(ds.tables["mention"]["mid"].tolist(),
                            ds.tables["mention"]["uid"].tolist(), strict=True):
            self.mentions.setdefault(mid, []).append(uid)
        self.events: dict[int, list[int]] = {}
        for ev, mid in zip(ds.tables["rel_event_microblog"]["eventid"].tolist(),
                           ds.tables["rel_event_microblog"]["mid"].tolist(), strict=True):
            self.events.setdefault(mid, []).append(ev)
        self.retweets_of: dict[int, list[int]] = {}  # original → retweeting posts
        self.retweeted: dict[int, int] = {}  # retweeting post → original
        for mid, remid in zip(ds.tables["retweet"]["mid"].tolist(),
                              ds.tables["retweet"]["remid"].tolist(), strict=True):
            self.retweets_of.setdefault(remid, []).append(mid)
            self.retweeted[mid] = remid
        self.n_users = ds.sizes.users
        self.n_events = ds.sizes.events
        self.n_cities = ds.sizes.cities
        self.next_mid = max(self.posts) + 1

    # -- batches --------------------------------------------------------------------------
    def batch(self, workload: str, d: int, seed: int) -> list[Change]:
        rng = np.random.default_rng(seed)
        if workload == "users":
            return self._users(d, rng)
        if workload == "city":
            return self._city(d, rng)
        if workload == "insert":
            return self._insert(d, rng)
        if workload == "delete":
            return self._delete(d, rng)
        if workload == "mixed":
            q = max(1, d // 4)
            return (self._users(q, rng) + self._city(q, rng) + self._insert(q, rng)
                    + self._delete(q, rng))
        raise ValueError(f"unknown workload {workload!r}: use {', '.join(WORKLOADS)}")

    def _pick_users(self, d: int, rng: np.random.Generator) -> list[int]:
        return [int(u) for u in rng.choice(self.n_users, size=min(d, self.n_users),
                                           replace=False)]

    def _update_user(self, uid: int, cols: dict[str, Any]) -> Change:
        names = self.columns["users"]
        old = tuple(self.users[uid])
        for c, v in cols.items():
            self.users[uid][names.index(c)] = v
        return Change("users", "update", old, tuple(self.users[uid]))

    def _users(self, d: int, rng: np.random.Generator) -> list[Change]:
        names = self.columns["users"]
        out = []
        for uid in self._pick_users(d, rng):
            row = self.users[uid]
            out.append(self._update_user(uid, {
                "tweetsnum": row[names.index("tweetsnum")] + int(rng.integers(1, 6)),
                "favornum": row[names.index("favornum")] + int(rng.integers(1, 4))}))
        return out

    def _city(self, d: int, rng: np.random.Generator) -> list[Change]:
        names = self.columns["users"]
        out = []
        for uid in self._pick_users(d, rng):
            old = self.users[uid][names.index("city")]
            new = (old + int(rng.integers(1, self.n_cities))) % self.n_cities
            out.append(self._update_user(uid, {"city": new}))
        return out

    def _insert(self, d: int, rng: np.random.Generator) -> list[Change]:
        out: list[Change] = []
        existing = list(self.posts)
        for _ in range(d):
            mid = self.next_mid
            self.next_mid += 1
            uid = int(rng.integers(0, self.n_users))
            t = int(rng.integers(RANGE[0], RANGE[1]))
            original = None
            if rng.random() < 0.2 and existing:
                original = int(existing[int(rng.integers(0, len(existing)))])
                if original not in self.posts:
                    original = None
            row = (mid, uid, t, f"post {mid}", int(rng.integers(0, 8)), 0, 0, original)
            self.posts[mid] = row
            out.append(Change("microblog", "insert", None, row))
            if original is not None:
                self.retweets_of.setdefault(original, []).append(mid)
                self.retweeted[mid] = original
                out.append(Change("retweet", "insert", None, (mid, original)))
                for ev in self.events.get(original, []):
                    self.events.setdefault(mid, []).append(ev)
                    out.append(Change("rel_event_microblog", "insert", None, (ev, mid)))
            elif rng.random() < 0.4:
                evs = sorted({int(e) for e in rng.integers(0, self.n_events, size=2)})
                for ev in evs:
                    self.events.setdefault(mid, []).append(ev)
                    out.append(Change("rel_event_microblog", "insert", None, (ev, mid)))
            if rng.random() < 0.2:
                for u in sorted({int(x) for x in rng.integers(0, self.n_users, size=2)}):
                    self.mentions.setdefault(mid, []).append(u)
                    out.append(Change("mention", "insert", None, (mid, u)))
        return out

    def _delete(self, d: int, rng: np.random.Generator) -> list[Change]:
        in_range = [m for m, r in self.posts.items() if RANGE[0] <= r[2] < RANGE[1]]
        chosen = [in_range[int(i)] for i in rng.choice(len(in_range),
                                                        size=min(d, len(in_range)),
                                                        replace=False)]
        out: list[Change] = []
        gone: set[int] = set()
        for mid in chosen:
            if mid in gone:
                continue
            gone.add(mid)
            for u in self.mentions.pop(mid, []):
                out.append(Change("mention", "delete", (mid, u), None))
            for ev in self.events.pop(mid, []):
                out.append(Change("rel_event_microblog", "delete", (ev, mid), None))
            if mid in self.retweeted:
                orig = self.retweeted.pop(mid)
                self.retweets_of[orig].remove(mid)
                out.append(Change("retweet", "delete", (mid, orig), None))
            for rt in self.retweets_of.pop(mid, []):
                self.retweeted.pop(rt, None)
                out.append(Change("retweet", "delete", (rt, mid), None))
            out.append(Change("microblog", "delete", self.posts.pop(mid), None))
        return out


def tables_of(batch: Sequence[Change]) -> list[str]:
    return sorted({c.table for c in batch})
