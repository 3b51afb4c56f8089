"""The eight BSMA views of the paper's Figure 10, written for this reconstruction.

The paper's extension of BSMA's queries (§7.1): add the ``tweetsnum`` and ``favornum`` of the
users concerned, drop ORDER BY / LIMIT and the single-user parameters; a time range stays a
constant predicate (``generate.RANGE``, days 10–19 of the 30 generated). Q7–Q18 count things the
User workload does not change and *join* the counts with ``users`` for the two attributes — so
for them those are non-conditional attributes (no operator's condition reads them), the case
where i-diffs pass joins by IDs. Q*1–Q*3 aggregate the two attributes themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench_bsma.generate import RANGE


@dataclass(frozen=True)
class BsmaView:
    name: str
    follows: str  # the BSMA query it follows, and how it was extended
    sql: str


_T = f"BETWEEN {RANGE[0]} AND {RANGE[1] - 1}"

VIEWS: tuple[BsmaView, ...] = (
    BsmaView(
        "q7",
        "BSMA Q7 'mentioned users within a time range' (top-k by mention count): per mentioned "
        "user, the mentions by posts in the range, with the user's tweetsnum and favornum; "
        "the ORDER BY / LIMIT dropped",
        f"""
        SELECT a.uid, a.mentions, u.tweetsnum, u.favornum
        FROM (SELECT me.uid, count(*) AS mentions
              FROM microblog m JOIN mention me ON me.mid = m.mid
              WHERE m.time {_T}
              GROUP BY me.uid) a
        JOIN users u ON u.uid = a.uid
        """),
    BsmaView(
        "q10",
        "BSMA Q10 'users who are retweeted within a time range': per original author, the "
        "retweets their posts got in the range (retweeting post ⋈ retweet ⋈ original post ⋈ "
        "users: 4 relations), with the author's tweetsnum and favornum",
        f"""
        SELECT a.uid, a.retweets, u.tweetsnum, u.favornum
        FROM (SELECT m2.uid, count(*) AS retweets
              FROM microblog m1
              JOIN retweet rt ON rt.mid = m1.mid
              JOIN microblog m2 ON m2.mid = rt.remid
              WHERE m1.time {_T}
              GROUP BY m2.uid) a
        JOIN users u ON u.uid = a.uid
        """),
    BsmaView(
        "q11",
        "BSMA Q11 'pairs of retweeting users grouped by retweeting times': per (retweeter, "
        "original author), the number of retweets, with both users' tweetsnum and favornum; "
        "the single-user parameter dropped",
        """
        SELECT a.ruid, a.ouid, a.retweets, u1.tweetsnum AS r_tweetsnum,
               u1.favornum AS r_favornum, u2.tweetsnum AS o_tweetsnum, u2.favornum AS o_favornum
        FROM (SELECT m1.uid AS ruid, m2.uid AS ouid, count(*) AS retweets
              FROM microblog m1
              JOIN retweet rt ON rt.mid = m1.mid
              JOIN microblog m2 ON m2.mid = rt.remid
              GROUP BY m1.uid, m2.uid) a
        JOIN users u1 ON u1.uid = a.ruid
        JOIN users u2 ON u2.uid = a.ouid
        """),
    BsmaView(
        "q15",
        "BSMA Q15 'users talking about events within a time range': per (user, event tag), "
        "the user's posts in the range linked to the event, with the user's tweetsnum and "
        "favornum (a very large view)",
        f"""
        SELECT a.uid, a.tag, a.posts, u.tweetsnum, u.favornum
        FROM (SELECT m.uid, e.tag, count(*) AS posts
              FROM microblog m
              JOIN rel_event_microblog r ON r.mid = m.mid
              JOIN event e ON e.eventid = r.eventid
              WHERE m.time {_T}
              GROUP BY m.uid, e.tag) a
        JOIN users u ON u.uid = a.uid
        """),
    BsmaView(
        "q18",
        "BSMA Q18 'pairwise count of mentions': per (follower, mentioned user) where the "
        "follower follows that user, how often the follower's posts mention them, with both "
        "users' tweetsnum and favornum",
        """
        SELECT a.uid, a.mentioned, a.mentions, u1.tweetsnum, u1.favornum,
               u2.tweetsnum AS m_tweetsnum, u2.favornum AS m_favornum
        FROM (SELECT m.uid, me.uid AS mentioned, count(*) AS mentions
              FROM microblog m
              JOIN mention me ON me.mid = m.mid
              JOIN friendlist f ON f.uid = m.uid AND f.followee_id = me.uid
              GROUP BY m.uid, me.uid) a
        JOIN users u1 ON u1.uid = a.uid
        JOIN users u2 ON u2.uid = a.mentioned
        """),
    BsmaView(
        "qs1",
        "Q*1 (the paper's) 'aggregate of friends of friends within the same city': per user, "
        "the count and the sums of tweetsnum and favornum over the friends of their friends "
        "living in their city (one row per path)",
        """
        SELECT f1.uid, count(*) AS fof, sum(u3.tweetsnum) AS fof_tweetsnum,
               sum(u3.favornum) AS fof_favornum
        FROM friendlist f1
        JOIN friendlist f2 ON f2.uid = f1.followee_id
        JOIN users u1 ON u1.uid = f1.uid
        JOIN users u3 ON u3.uid = f2.followee_id
        WHERE u1.city = u3.city
        GROUP BY f1.uid
        """),
    BsmaView(
        "qs2",
        "Q*2 (the paper's) 'aggregate of retweeters for every user': per author, the count "
        "and the sums of tweetsnum and favornum over the users who retweeted their posts",
        """
        SELECT m2.uid, count(*) AS retweeters, sum(u.tweetsnum) AS rt_tweetsnum,
               sum(u.favornum) AS rt_favornum
        FROM microblog m1
        JOIN retweet rt ON rt.mid = m1.mid
        JOIN microblog m2 ON m2.mid = rt.remid
        JOIN users u ON u.uid = m1.uid
        GROUP BY m2.uid
        """),
    BsmaView(
        "qs3",
        "Q*3 (the paper's) 'aggregate of users who tweet about topics': per event tag, the "
        "count and the sums of tweetsnum and favornum over the authors of the linked posts",
        """
        SELECT e.tag, count(*) AS posts, sum(u.tweetsnum) AS author_tweetsnum,
               sum(u.favornum) AS author_favornum
        FROM event e
        JOIN rel_event_microblog r ON r.eventid = e.eventid
        JOIN microblog m ON m.mid = r.mid
        JOIN users u ON u.uid = m.uid
        GROUP BY e.tag
        """),
)

VIEWS_BY_NAME = {v.name: v for v in VIEWS}
