"""Deterministic data for the demo and the benchmarks.

``generate_bsma`` builds a small BSMA-like social data set (users, friendlist, microblog,
retweet, mention, event, rel_event_microblog; schema and generator facts after
``/work/shared/bsma/README.md``, simplified) as lists of tuples; ``bsma_changes`` a change batch
over it in Delta CDF shape. ``parts_devices`` and the batch builders below it generate the
paper's §7.2 parts/devices tables inside Spark (``spark.range``), for sizes Python should not
materialize.

BSMA fixes no distribution for users, cities, mentions or events; the choices here:

- authors of posts, mentioned users, event links and cities are Zipf-distributed
  (exponents 1.1, 1.2, 1.0 and 1.0) over a seeded permutation of the candidates;
- out-degrees follow BSMA's empirical CDF (embedded below at 17 points, log-interpolated),
  rescaled to ``mean_out_degree``; followees are picked by Kleinberg's copying model
  (copy a prototype's followee with probability ``COPY_PROB``, else uniformly);
- post times follow BSMA's hour-of-day and day-of-week factors over a 30-day window; 10% of posts
  are retweets, delayed by BSMA's retweet-interval CDF (embedded at 12 points); a retweet gets
  one ``retweet`` row (BSMA counts two per retweet) and copies its original's event links;
- 20% of posts mention 1-3 users (mean 2), 40% of original posts link to 1-3 events (mean 2);
- ``tweetsnum`` grows with the user's posts in the data set, ``favornum`` is Pareto(1.2).
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

from sqlglot import exp

from idivm.catalog import Catalog, Table

Row = tuple[Any, ...]

BSMA_DDL = """
CREATE TABLE users (
    uid             int PRIMARY KEY,
    name            text NOT NULL,
    city            int,
    gender          text,
    followers_count int NOT NULL,
    friends_count   int NOT NULL,
    tweetsnum       int NOT NULL,
    favornum        int NOT NULL,
    verified        boolean NOT NULL,
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
    content       text,
    client        text,
    repost_count  int NOT NULL,
    comment_count int NOT NULL,
    rtmid         bigint REFERENCES microblog (mid)
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
    location_id int
);
CREATE TABLE rel_event_microblog (
    eventid int NOT NULL REFERENCES event (eventid),
    mid     bigint NOT NULL REFERENCES microblog (mid),
    PRIMARY KEY (eventid, mid)
);
"""

BSMA_TABLES = ("users", "friendlist", "microblog", "retweet", "mention", "event",
               "rel_event_microblog")

WINDOW_START_MS = 1_346_457_600_000  # 2012-09-01 00:00 UTC, a Saturday
WINDOW_DAYS = 30
HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
CITIES = 50
COPY_PROB = 0.5

# BSMA data/hour_of_day_factor.tsv (hour 0-23) and day_of_week_factor.tsv (day 1-7 = Mon-Sun).
HOUR_FACTOR = (0.964, 0.469, 0.239, 0.143, 0.106, 0.112, 0.205, 0.446, 0.914, 1.347, 1.437,
               1.426, 1.360, 1.368, 1.268, 1.258, 1.298, 1.295, 1.186, 1.208, 1.325, 1.497,
               1.644, 1.489)
DAY_FACTOR = (0.919, 1.010, 1.045, 1.033, 1.048, 1.030, 0.915)
# BSMA data/out_degree_cdf.tsv at 17 points: (out-degree, cumulative share of users); mean 143.
OUT_DEGREE_CDF = ((1, 0.00563), (2, 0.01043), (3, 0.01521), (5, 0.02517), (10, 0.0542),
                  (20, 0.11816), (30, 0.1878), (50, 0.32448), (75, 0.47323), (100, 0.59087),
                  (150, 0.74606), (200, 0.83199), (300, 0.91025), (500, 0.95718),
                  (1000, 0.9829), (2000, 0.99995), (5646, 1.0))
# BSMA data/retweet_interval_cdf_hours.tsv at 12 points: (cumulative probability, hours).
RETWEET_DELAY_CDF = ((0.0, 0.0), (0.3624, 1), (0.4646, 2), (0.5617, 4), (0.6506, 8),
                     (0.7117, 12), (0.8213, 24), (0.8843, 48), (0.9078, 72), (0.9444, 168),
                     (0.9642, 336), (0.9788, 720))
CLIENTS = ("web", "android", "iphone", "ipad", "weibo.com")


def spark_types(table: Table) -> dict[str, str]:
    """The table's column types as Spark spells them, by column name."""
    return {c.name: exp.DataType.build(c.type, dialect="postgres").sql("spark")
            for c in table.columns}


def spark_schema(table: Table, extra: Sequence[tuple[str, str]] = ()) -> str:
    """A Spark DDL schema string for the table's columns (and ``extra`` ones)."""
    return ", ".join(f"`{n}` {t}" for n, t in [*spark_types(table).items(), *extra])


def cdf_schema(table: Table) -> str:
    """Spark schema of a change batch for the table: its columns plus ``_change_type``."""
    return spark_schema(table, [("_change_type", "string")])


# -- sampling helpers ---------------------------------------------------------------------------
class _Zipf:
    """Draws items with probability ∝ 1/rank^s, ranks a seeded permutation of the items."""

    def __init__(self, rng: random.Random, items: Sequence[Any], s: float) -> None:
        self.items = list(items)
        rng.shuffle(self.items)
        self.cum = list(accumulate(1.0 / (r + 1) ** s for r in range(len(self.items))))
        self.rng = rng

    def draw(self, k: int = 1) -> list[Any]:
        return self.rng.choices(self.items, cum_weights=self.cum, k=k)

    def distinct(self, k: int, exclude: Any = None) -> list[Any]:
        """k distinct items (fewer if there are not enough), never ``exclude``."""
        k = min(k, len(self.items) - (exclude is not None))
        out: list[Any] = []
        while len(out) < k:
            x = self.draw()[0]
            if x != exclude and x not in out:
                out.append(x)
        return out


def _inverse(cdf: Sequence[tuple[float, float]], u: float, log: bool) -> float:
    """Inverse-CDF sample from (probability, value) points, interpolating (log-)linearly."""
    probs = [p for p, _ in cdf]
    i = bisect.bisect_left(probs, u)
    if i == 0:
        return cdf[0][1]
    if i >= len(cdf):
        return cdf[-1][1]
    (p0, v0), (p1, v1) = cdf[i - 1], cdf[i]
    f = (u - p0) / (p1 - p0) if p1 > p0 else 0.0
    if log and v0 > 0:
        return math.exp(math.log(v0) + f * (math.log(v1) - math.log(v0)))
    return v0 + f * (v1 - v0)


def _out_degrees(rng: random.Random, n: int, mean: float) -> list[int]:
    cdf = [(p, float(d)) for d, p in OUT_DEGREE_CDF]
    cdf.insert(0, (0.0, 1.0))
    raw = [_inverse(cdf, rng.random(), log=True) for _ in range(n)]
    scale = mean / (sum(raw) / max(1, n))
    return [max(0, min(n - 1, round(d * scale))) for d in raw]


def _post_time(rng: random.Random, slots: list[float]) -> int:
    slot = rng.choices(range(len(slots)), cum_weights=slots)[0]
    return WINDOW_START_MS + slot * HOUR_MS + rng.randrange(HOUR_MS)


def _slot_weights() -> list[float]:
    """Cumulative weights of the window's hours (day 0 = 2012-09-01, a Saturday = day 6)."""
    w = [DAY_FACTOR[(5 + d) % 7] * HOUR_FACTOR[h] for d in range(WINDOW_DAYS) for h in range(24)]
    return list(accumulate(w))


# -- BSMA ---------------------------------------------------------------------------------------
@dataclass
class Bsma:
    """A generated data set: rows per table (column order as in ``BSMA_DDL``)."""

    tables: dict[str, list[Row]] = field(default_factory=dict)
    scale: float = 1.0
    seed: int = 0

    @property
    def window(self) -> tuple[int, int]:
        return WINDOW_START_MS, WINDOW_START_MS + WINDOW_DAYS * DAY_MS

    def sizes(self) -> dict[str, int]:
        return {t: len(rows) for t, rows in self.tables.items()}


def generate_bsma(scale: float = 1.0, seed: int = 2015, mean_out_degree: float = 10.0) -> Bsma:
    """A BSMA-like data set; ``scale`` 1 is 2,000 users and 20,000 posts (BSMA SF 0.002, with
    a follow graph of mean out-degree 10 instead of BSMA's 100)."""
    rng = random.Random(seed)
    n_users = max(20, round(2000 * scale))
    n_posts = max(200, round(20000 * scale))
    n_events = max(10, round(100 * scale))
    uids = list(range(1, n_users + 1))

    # follow graph: copying model over users in a seeded arrival order
    degrees = _out_degrees(rng, n_users, mean_out_degree)
    order = uids[:]
    rng.shuffle(order)
    follows: dict[int, list[int]] = {}
    for i, u in enumerate(order):
        chosen: set[int] = set()
        proto = follows.get(order[rng.randrange(i)]) if i else None
        tries = 0
        while len(chosen) < degrees[u - 1] and tries < 20 * degrees[u - 1] + 20:
            tries += 1
            if proto and rng.random() < COPY_PROB:
                v = proto[rng.randrange(len(proto))]
            else:
                v = uids[rng.randrange(n_users)]
            if v != u:
                chosen.add(v)
        follows[u] = sorted(chosen)
    friendlist = [(u, v) for u in uids for v in follows[u]]
    followers = dict.fromkeys(uids, 0)
    for _, v in friendlist:
        followers[v] += 1

    # posts: originals, then retweets delayed after them; mids follow time order
    authors = _Zipf(rng, uids, 1.1)
    slots = _slot_weights()
    end = WINDOW_START_MS + WINDOW_DAYS * DAY_MS
    n_rt = n_posts // 10
    posts: list[list[Any]] = []  # [time, uid, original index or None]
    for u in authors.draw(n_posts - n_rt):
        posts.append([_post_time(rng, slots), u, None])
    popular = _Zipf(rng, range(len(posts)), 1.0)
    for u, o in zip(authors.draw(n_rt), popular.draw(n_rt), strict=True):
        hours = _inverse(RETWEET_DELAY_CDF, rng.random() * RETWEET_DELAY_CDF[-1][0], log=False)
        t = min(end - 1, posts[o][0] + int(hours * HOUR_MS) + rng.randrange(60_000))
        posts.append([t, u, o])
    by_time = sorted(range(len(posts)), key=lambda i: (posts[i][0], i))
    mid_of = {i: k + 1 for k, i in enumerate(by_time)}
    retweets_of = {i: 0 for i in range(len(posts))}
    for p in posts:
        if p[2] is not None:
            retweets_of[p[2]] += 1
    microblog: list[Row] = []
    retweet: list[Row] = []
    posts_of = dict.fromkeys(uids, 0)
    for i in by_time:
        t, u, o = posts[i]
        mid = mid_of[i]
        rt = mid_of[o] if o is not None else None
        posts_of[u] += 1
        microblog.append((mid, u, t, f"post {mid} by user{u}", rng.choice(CLIENTS),
                          retweets_of[i], rng.randrange(4), rt))
        if rt is not None:
            retweet.append((mid, rt))

    mentioned = _Zipf(rng, uids, 1.2)
    mention: list[Row] = []
    for mid, u, *_ in microblog:
        if rng.random() < 0.2:
            mention += [(mid, v) for v in mentioned.distinct(rng.randint(1, 3), exclude=u)]

    cities = _Zipf(rng, range(1, CITIES + 1), 1.0)
    event = [(e, f"#event{e}", WINDOW_START_MS + rng.randrange(WINDOW_DAYS * DAY_MS),
              cities.draw()[0]) for e in range(1, n_events + 1)]
    events = _Zipf(rng, range(1, n_events + 1), 1.0)
    links: dict[int, list[int]] = {}
    for mid, _, _, _, _, _, _, rt in microblog:  # time order: an original precedes its retweets
        if rt is not None:
            links[mid] = links.get(rt, [])
        elif rng.random() < 0.4:
            links[mid] = sorted(events.distinct(rng.randint(1, 3)))
    rel = [(e, mid) for mid, es in links.items() for e in es]

    users = [(u, f"user{u}", cities.draw()[0], rng.choice("mf"), followers[u], len(follows[u]),
              posts_of[u] * 50 + rng.randrange(100), int(5 * rng.paretovariate(1.2)),
              rng.random() < 0.02, WINDOW_START_MS - rng.randrange(1000) * DAY_MS)
             for u in uids]
    return Bsma({"users": users, "friendlist": friendlist, "microblog": microblog,
                 "retweet": retweet, "mention": mention, "event": event,
                 "rel_event_microblog": rel}, scale, seed)


def bsma_changes(data: Bsma, seed: int = 7, user_updates: int = 100, new_posts: int = 60,
                 deleted_posts: int = 6) -> dict[str, list[Row]]:
    """One change batch per table, Delta CDF rows (the table's columns + ``_change_type``).

    ``user_updates`` users (skewed to active ones) change tweetsnum and favornum (the paper's
    User workload); ``new_posts`` posts arrive in the window's last day, 30% of them retweets
    and 60% mentioning 1-2 users; ``deleted_posts`` posts (half of them retweets, none retweeted)
    are deleted with their mentions, retweet and event links.
    """
    rng = random.Random(seed)
    t = data.tables
    users = {r[0]: r for r in t["users"]}
    uids = sorted(users)
    out: dict[str, list[Row]] = {name: [] for name in BSMA_TABLES}

    active = _Zipf(rng, uids, 1.1)
    for u in active.distinct(user_updates):
        pre = users[u]
        post = (*pre[:6], pre[6] + rng.randint(1, 20), pre[7] + rng.randint(0, 5), *pre[8:])
        out["users"] += [(*pre, "update_preimage"), (*post, "update_postimage")]

    posts = t["microblog"]
    start, end = data.window
    originals = [r[0] for r in posts if r[7] is None]
    retweeted = {r[1] for r in t["retweet"]}
    next_mid = max(r[0] for r in posts) + 1
    for i in range(new_posts):
        mid, u = next_mid + i, active.draw()[0]
        ts = end - DAY_MS + rng.randrange(DAY_MS)
        rt = originals[rng.randrange(len(originals))] if rng.random() < 0.3 else None
        out["microblog"].append((mid, u, ts, f"post {mid} by user{u}", rng.choice(CLIENTS),
                                 0, 0, rt, "insert"))
        if rt is not None:
            out["retweet"].append((mid, rt, "insert"))
        if rng.random() < 0.6:
            for v in active.distinct(rng.randint(1, 2), exclude=u):
                out["mention"].append((mid, v, "insert"))

    mentioning = {r[0] for r in t["mention"]}
    recent = [r for r in posts if r[2] >= end - 7 * DAY_MS and r[0] not in retweeted]
    rts = [r for r in recent if r[7] is not None]
    with_mentions = [r for r in recent if r[7] is None and r[0] in mentioning]
    gone = rng.sample(rts, min(len(rts), deleted_posts // 2))
    gone += rng.sample(with_mentions, min(len(with_mentions), deleted_posts - len(gone)))
    dead = {r[0] for r in gone}
    out["microblog"] += [(*r, "delete") for r in gone]
    for name in ("retweet", "mention", "rel_event_microblog"):
        pos = 1 if name == "rel_event_microblog" else 0
        out[name] += [(*r, "delete") for r in t[name] if r[pos] in dead]
    return {name: rows for name, rows in out.items() if rows}


def bsma_frames(spark: Any, catalog: Catalog, tables: dict[str, list[Row]],
                cdf: bool = False) -> dict[str, Any]:
    """DataFrames of the rows (``cdf``: change batches, with ``_change_type``)."""
    out = {}
    for name, rows in tables.items():
        table = catalog.table(name)
        schema = cdf_schema(table) if cdf else spark_schema(table)
        out[name] = spark.createDataFrame(rows, schema)
    return out


# -- parts/devices (paper §7.2), generated in Spark ---------------------------------------------
@dataclass(frozen=True)
class PartsDevices:
    """Sizes of a generated instance: ``links`` devices_parts rows, ``fanout`` per device."""

    links: int
    fanout: int = 10
    phone_share: float = 0.2
    seed: int = 42

    @property
    def devices(self) -> int:
        return max(1, self.links // self.fanout)

    @property
    def parts(self) -> int:
        return max(self.fanout + 1, self.links // self.fanout)


def _h(*cols: Any, seed: int, mod: int) -> Any:
    """A deterministic pseudo-random integer in [0, mod) from the columns."""
    from pyspark.sql import functions as F

    return F.pmod(F.xxhash64(*cols, F.lit(seed)), F.lit(mod))


def _part_of(d: Any, j: Any, pd: PartsDevices) -> Any:
    """Part ``j`` of device ``d``: base + j·step (mod parts); distinct for j ≤ fanout since
    step·(fanout+1) < parts. Slot j = fanout is never loaded: it is where new links go."""
    from pyspark.sql import functions as F

    base = _h(d, seed=pd.seed + 1, mod=pd.parts)
    step = _h(d, seed=pd.seed + 2, mod=max(1, pd.parts // (pd.fanout + 1) - 1)) + 1
    return F.pmod(base + j * step, F.lit(pd.parts))


def _did(n: Any) -> Any:
    from pyspark.sql import functions as F

    return F.concat(F.lit("D"), n.cast("string"))


def _pid(n: Any) -> Any:
    from pyspark.sql import functions as F

    return F.concat(F.lit("P"), n.cast("string"))


def _category(d: Any, pd: PartsDevices) -> Any:
    from pyspark.sql import functions as F

    return F.when(_h(d, seed=pd.seed, mod=10_000) < int(pd.phone_share * 10_000),
                  F.lit("phone")).otherwise(F.lit("tablet"))


def parts_devices(spark: Any, pd: PartsDevices) -> dict[str, Any]:
    """devices(did, category), parts(pid, price), devices_parts(did, pid) as DataFrames."""
    from pyspark.sql import functions as F

    d = F.col("id")
    devices = spark.range(pd.devices).select(_did(d).alias("did"),
                                             _category(d, pd).alias("category"))
    parts = spark.range(pd.parts).select(
        _pid(d).alias("pid"), (_h(d, seed=pd.seed + 3, mod=1000) + 1).cast("int").alias("price"))
    dev = (F.col("id") / pd.fanout).cast("long")
    j = F.pmod(F.col("id"), F.lit(pd.fanout))
    links = spark.range(pd.devices * pd.fanout).select(
        _did(dev).alias("did"), _pid(_part_of(dev, j, pd)).alias("pid"))
    return {"devices": devices, "parts": parts, "devices_parts": links}


def _updates(current: Any, key: str, col: str, new: Callable[[Any], Any]) -> Any:
    """update_preimage/postimage pairs for the rows of ``current`` (pre-images as stored)."""
    from pyspark.sql import functions as F

    pre = current.select(F.col(key), F.col(col), F.lit("update_preimage").alias("_change_type"))
    post = current.select(F.col(key), new(F.col(col)).alias(col),
                          F.lit("update_postimage").alias("_change_type"))
    return pre.unionByName(post)


def price_updates(spark: Any, parts: Any, n: int, pd: PartsDevices, salt: int = 0) -> Any:
    """CDF batch: ``n`` parts (a deterministic sample of the stored ones) change price."""
    from pyspark.sql import functions as F

    pick = spark.range(n).select(_pid(_h(F.col("id"), seed=pd.seed + 10 + salt,
                                         mod=pd.parts)).alias("pid")).distinct()
    current = parts.join(pick, "pid", "left_semi")
    return _updates(current, "pid", "price",
                    lambda p: (F.pmod(p + 1 + F.lit(salt), F.lit(1000)) + 1).cast("int"))


def mixed_batch(spark: Any, tables: dict[str, Any], pd: PartsDevices, share: float = 0.01,
                salt: int = 1, slot: int | None = None) -> dict[str, Any]:
    """CDF batches worth ``share`` of devices_parts' rows in changes: 40% new links, 40% deleted
    links, 18% price updates, 2% device category flips (each update counts as one change).
    New links use part slot ``slot`` of their devices (default ``fanout``: one past the
    generated ones; pass a further slot for each later batch)."""
    from pyspark.sql import functions as F

    total = max(10, int(pd.links * share))
    n_ins, n_del, n_price = int(total * 0.4), int(total * 0.4), int(total * 0.18)
    n_cat = max(1, total - n_ins - n_del - n_price)
    # new links use slot `fanout` of distinct devices; deleted links slot 0 of others
    ins_dev = spark.range(n_ins).select(
        _h(F.col("id"), seed=pd.seed + 20 + salt, mod=pd.devices).alias("d")).distinct()
    ins = ins_dev.select(_did(F.col("d")).alias("did"),
                         _pid(_part_of(F.col("d"), F.lit(pd.fanout if slot is None else slot),
                                       pd)).alias("pid")) \
        .join(tables["devices_parts"], ["did", "pid"], "left_anti") \
        .withColumn("_change_type", F.lit("insert"))  # never a link that exists
    del_dev = spark.range(n_del).select(
        _h(F.col("id"), seed=pd.seed + 30 + salt, mod=pd.devices).alias("d")).distinct()
    dels = del_dev.select(_did(F.col("d")).alias("did"),
                          _pid(_part_of(F.col("d"), F.lit(0), pd)).alias("pid"))
    dels = tables["devices_parts"].join(dels, ["did", "pid"], "left_semi") \
        .withColumn("_change_type", F.lit("delete"))
    cat_pick = spark.range(n_cat).select(_did(_h(F.col("id"), seed=pd.seed + 40 + salt,
                                                 mod=pd.devices)).alias("did")).distinct()
    flips = _updates(tables["devices"].join(cat_pick, "did", "left_semi"), "did", "category",
                     lambda c: F.when(c == "phone", "tablet").otherwise("phone"))
    return {"devices_parts": ins.unionByName(dels),
            "parts": price_updates(spark, tables["parts"], n_price, pd, salt=salt),
            "devices": flips}
