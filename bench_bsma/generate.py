"""A deterministic generator for the BSMA reconstruction (../shared/bsma/README.md).

Sizes follow the paper's ratios (Figure 9a) at a scale factor ``sf``: users 1M·sf, friendlist
100M·sf, microblog 20M·sf, retweet 4M·sf, mention 8M·sf, rel_event_microblog 16M·sf; events are
not sized by the paper: 1 per 100 users (at least 20). Everything derives from one seed.

What comes from BSMA's generator (its data files, under ``../shared/bsma/data``):

- **follow graph**: out-degrees drawn from BSMA's empirical out-degree CDF (14.59M real users),
  scaled so the mean is friendlist/users (100) and capped below the user count; followees by
  Kleinberg's copying model — with probability ``COPY`` an edge copies the followee of an
  earlier edge, else it picks a user uniformly — which gives the power-law in-degrees BSMA's
  generator has (in-degree exponent about 1 + 1/COPY);
- **post times**: a Poisson process over ``DAYS`` days modulated by the hour-of-day and
  day-of-week factors (so a post's hour and weekday are drawn in proportion to them);
- **retweet delays**: BSMA's CDF of hours between a post and its retweet (36% within an hour);
  a retweet copies its original's event links.

What BSMA does not generate, chosen here (Zipf-like, as the README asks):

- **cities**: Zipf(s=1.1) over users/200 cities (at least 10);
- **activity**: authors of posts are drawn by Zipf(s=0.8) over a random permutation of users;
  ``tweetsnum`` starts as the user's post count, ``favornum`` is lognormal;
- **retweets**: 20% of posts are retweets (one ``retweet`` row each: 0.2 × posts, the paper's
  "× 10% × 2"); originals are drawn by Zipf(s=1.0) popularity among the non-retweets;
- **mentions**: 20% of posts mention 2 distinct users (0.4 × posts), users by Zipf(s=1.0);
- **events**: 40% of non-retweet posts link 2 distinct events (Zipf(s=1.0)); retweets copy
  their original's links, so the table holds about 0.8 × posts rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

DATA = Path(__file__).resolve().parents[2] / "shared" / "bsma" / "data"
COPY = 0.5  # copying-model probability
DAYS = 30
T0 = 1_325_462_400_000  # 2012-01-02 00:00 UTC (a Monday), epoch ms
HOUR = 3_600_000
DAY = 24 * HOUR
# the views' time range: days 10–19 (a constant predicate, as the paper keeps it)
RANGE = (T0 + 10 * DAY, T0 + 20 * DAY)


def _data_dir() -> Path:
    for d in (DATA, Path("/work/shared/bsma/data")):
        if (d / "out_degree_cdf.tsv").exists():
            return d
    raise FileNotFoundError("BSMA generator data (out_degree_cdf.tsv …) not found under "
                            f"{DATA}: the reconstruction needs ../shared/bsma/data")


def _tsv(name: str) -> np.ndarray:
    return np.loadtxt(_data_dir() / name, delimiter="\t", ndmin=2)


@dataclass
class Sizes:
    users: int
    friendlist: int
    microblog: int
    events: int
    cities: int

    @classmethod
    def at(cls, sf: float) -> Sizes:
        users = max(50, round(1_000_000 * sf))
        return cls(users=users, friendlist=100 * users, microblog=20 * users,
                   events=max(20, users // 100), cities=max(10, users // 200))


@dataclass
class Dataset:
    """Column arrays per table (numpy), in the DDL's column order."""

    sf: float
    seed: int
    sizes: Sizes
    tables: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)

    def rows(self, table: str) -> int:
        cols = self.tables[table]
        return len(next(iter(cols.values())))

    def records(self, table: str) -> list[tuple[Any, ...]]:
        """Rows as Python tuples (for COPY and DataFrames)."""
        cols = list(self.tables[table].values())
        return list(zip(*[c.tolist() for c in cols], strict=True))


def _zipf_weights(n: int, s: float, rng: np.random.Generator) -> np.ndarray:
    """Zipf(s) probabilities over n items, ranks assigned by a random permutation."""
    w = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** s
    w = w[rng.permutation(n)]
    return w / w.sum()


def _out_degrees(n: int, mean: float, rng: np.random.Generator) -> np.ndarray:
    cdf = _tsv("out_degree_cdf.tsv")  # cumulative count, out-degree
    counts = np.diff(np.concatenate([[0.0], cdf[:, 0]]))
    degrees = cdf[:, 1]
    p = counts / counts.sum()
    d = rng.choice(degrees, size=n, p=p).astype(np.float64)
    d *= mean / float((p * degrees).sum())
    return np.clip(np.rint(d), 0, n - 1).astype(np.int64)


def _follow_graph(n: int, edges: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    deg = _out_degrees(n, edges / n, rng)
    src = np.repeat(np.arange(n, dtype=np.int64), deg)
    m = len(src)
    own = rng.integers(0, n, size=m)
    copy = rng.random(m) < COPY
    idx = np.arange(m)
    # edge i copies the followee of a uniformly chosen earlier edge; resolve the chains by
    # pointer jumping (every pointer goes backwards, so it ends at an edge that did not copy)
    ptr = np.where(copy & (idx > 0), (rng.random(m) * idx).astype(np.int64), idx)
    while True:
        nxt = ptr[ptr]
        if np.array_equal(nxt, ptr):
            break
        ptr = nxt
    dst = own[ptr]
    keep = src != dst
    pair = np.unique(src[keep] * n + dst[keep])
    return (pair // n).astype(np.int64), (pair % n).astype(np.int64)


def _post_times(m: int, rng: np.random.Generator) -> np.ndarray:
    hours = _tsv("hour_of_day_factor.tsv")
    days = _tsv("day_of_week_factor.tsv")
    # a weekday-and-hour slot for each post, in proportion to the two factors
    slot_w = np.outer(days[:, 1], hours[:, 1]).ravel()  # 7 × 24, Monday first
    slot = rng.choice(len(slot_w), size=m, p=slot_w / slot_w.sum())
    weekday, hour = slot // 24, slot % 24
    week = rng.integers(0, (DAYS + 6) // 7, size=m)
    day = np.minimum(week * 7 + weekday, DAYS - 1)
    return T0 + day * DAY + hour * HOUR + rng.integers(0, HOUR, size=m)


def _retweet_delays(k: int, rng: np.random.Generator) -> np.ndarray:
    cdf = _tsv("retweet_interval_cdf_hours.tsv")  # cumulative probability, hours
    u = rng.random(k) * cdf[-1, 0]
    hours = np.interp(u, np.concatenate([[0.0], cdf[:, 0]]),
                      np.concatenate([[0.0], cdf[:, 1]]))
    return (hours * HOUR).astype(np.int64) + 1


def _pairs(owners: np.ndarray, k: int, n: int, p: np.ndarray,
           rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``k`` distinct picks from ``n`` items (probabilities ``p``) for each owner."""
    picks = rng.choice(n, size=(len(owners), k + 2), p=p)
    own = np.repeat(owners, k + 2)
    pair = np.unique(np.stack([own, picks.ravel()], axis=1), axis=0)
    # keep the first k distinct picks per owner (np.unique sorted them: a fair subset)
    first = np.concatenate([[True], pair[1:, 0] != pair[:-1, 0]])
    rank = np.arange(len(pair)) - np.maximum.accumulate(np.where(first, np.arange(len(pair)),
                                                                 0))
    pair = pair[rank < k]
    return pair[:, 0], pair[:, 1]


def generate(sf: float = 0.002, seed: int = 42) -> Dataset:
    rng = np.random.default_rng(seed)
    sz = Sizes.at(sf)
    n, m = sz.users, sz.microblog
    ds = Dataset(sf, seed, sz)

    fsrc, fdst = _follow_graph(n, sz.friendlist, rng)
    city = rng.choice(sz.cities, size=n, p=_zipf_weights(sz.cities, 1.1, rng))

    # posts: authors by activity, times by the BSMA factors; 20% are retweets
    author = rng.choice(n, size=m, p=_zipf_weights(n, 0.8, rng))
    time = _post_times(m, rng)
    mid = np.arange(1, m + 1, dtype=np.int64)
    is_rt = rng.random(m) < 0.2
    originals = np.flatnonzero(~is_rt)
    rts = np.flatnonzero(is_rt)
    pop = _zipf_weights(len(originals), 1.0, rng)
    orig = originals[rng.choice(len(originals), size=len(rts), p=pop)]
    time[rts] = time[orig] + _retweet_delays(len(rts), rng)
    rtmid = np.full(m, -1, dtype=np.int64)
    rtmid[rts] = mid[orig]

    # mentions: 20% of posts, 2 distinct users each
    mentioning = np.flatnonzero(rng.random(m) < 0.2)
    men_post, men_user = _pairs(mentioning, 2, n, _zipf_weights(n, 1.0, rng), rng)

    # events: 40% of originals link 2 events; retweets copy their original's links
    e = sz.events
    linking = originals[rng.random(len(originals)) < 0.4]
    ev_post, ev_id = _pairs(linking, 2, e, _zipf_weights(e, 1.0, rng), rng)
    by_post: dict[int, list[int]] = {}
    for p_, ev in zip(ev_post.tolist(), ev_id.tolist(), strict=True):
        by_post.setdefault(p_, []).append(ev)
    extra_p, extra_e = [], []
    for r, o in zip(rts.tolist(), orig.tolist(), strict=True):
        for ev in by_post.get(o, ()):
            extra_p.append(r)
            extra_e.append(ev)
    rel_post = np.concatenate([ev_post, np.array(extra_p, dtype=np.int64)])
    rel_ev = np.concatenate([ev_id, np.array(extra_e, dtype=np.int64)])

    tweets = np.bincount(author, minlength=n)
    ds.tables["users"] = {
        "uid": np.arange(n, dtype=np.int64),
        "name": np.array([f"user{u}" for u in range(n)], dtype=object),
        "city": city.astype(np.int64),
        "gender": rng.integers(0, 2, size=n),
        "followers_count": np.bincount(fdst, minlength=n),
        "friends_count": np.bincount(fsrc, minlength=n),
        "tweetsnum": tweets,
        "favornum": np.rint(rng.lognormal(3.0, 1.2, size=n)).astype(np.int64),
        "verified": (rng.random(n) < 0.05).astype(np.int64),
        "created_time": T0 - rng.integers(DAY, 3 * 365 * DAY, size=n),
    }
    ds.tables["friendlist"] = {"uid": fsrc, "followee_id": fdst}
    ds.tables["microblog"] = {
        "mid": mid, "uid": author.astype(np.int64), "time": time,
        "content": np.array([f"post {i}" for i in range(1, m + 1)], dtype=object),
        "client": rng.integers(0, 8, size=m), "repost_count": np.zeros(m, dtype=np.int64),
        "comment_count": rng.poisson(0.5, size=m),
        "rtmid": rtmid,  # -1: NULL (not a retweet)
    }
    ds.tables["microblog"]["repost_count"] = np.bincount(orig, minlength=m)
    ds.tables["retweet"] = {"mid": mid[rts], "remid": mid[orig]}
    ds.tables["mention"] = {"mid": mid[men_post], "uid": men_user.astype(np.int64)}
    ds.tables["event"] = {
        "eventid": np.arange(e, dtype=np.int64),
        "tag": np.array([f"tag{i}" for i in range(e)], dtype=object),
        "start_time": T0 + rng.integers(0, DAYS * DAY, size=e),
        "location_id": rng.integers(0, sz.cities, size=e),
    }
    ds.tables["rel_event_microblog"] = {"eventid": rel_ev, "mid": mid[rel_post]}
    return ds


NULLABLE = {("microblog", "rtmid")}  # -1 in the arrays stands for NULL here


def value(table: str, col: str, v: Any) -> Any:
    """A generator value as SQL sees it (-1 rtmid is NULL)."""
    if (table, col) in NULLABLE and v == -1:
        return None
    return v
