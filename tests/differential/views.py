"""Catalogue of views maintained in the differential tests (PostgreSQL dialect).

Each view names its schema (a key of ``schemas.SCHEMAS``) and the constructs it exercises. All
output columns carry distinct names, so ``SELECT * FROM <view>`` is well defined.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ViewDef:
    """A test view: name, schema key, SQL text and the constructs it covers."""

    name: str
    schema: str
    sql: str
    constructs: tuple[str, ...]


VIEWS: tuple[ViewDef, ...] = (
    # ----------------------------------------------------------------- (a) paper
    ViewDef(
        "paper_v",
        "paper",
        "SELECT did, pid, price FROM parts NATURAL JOIN devices_parts NATURAL JOIN devices "
        "WHERE category = 'phone'",
        ("paper V", "NATURAL JOIN", "3-table join", "selection on conditional attribute"),
    ),
    ViewDef(
        "paper_v_cost",
        "paper",
        "SELECT did, sum(price) AS cost FROM parts NATURAL JOIN devices_parts "
        "NATURAL JOIN devices WHERE category = 'phone' GROUP BY did",
        ("paper V'", "NATURAL JOIN", "GROUP BY", "SUM"),
    ),
    ViewDef(
        "paper_join_on_projection",
        "paper",
        """
        SELECT dp.did AS device, p.pid AS part, upper(d.category) AS cat_upper,
               COALESCE(d.category, 'unknown') AS cat,
               p.price * 2 + 1 AS doubled,
               CASE WHEN p.price > 10 THEN 'expensive' ELSE 'cheap' END AS tier
        FROM devices d
        JOIN devices_parts dp ON d.did = dp.did
        JOIN parts p ON p.pid = dp.pid
        WHERE p.price >= 3
        """,
        ("JOIN ON", "3-table join", "arithmetic", "CASE", "COALESCE", "upper", "aliases"),
    ),
    ViewDef(
        "paper_using_group_aggs",
        "paper",
        """
        SELECT d.category, count(*) AS n, count(p.price) AS n_priced, sum(p.price) AS total,
               avg(p.price) AS mean, min(p.price) AS lo, max(p.price) AS hi
        FROM devices_parts dp
        JOIN parts p USING (pid)
        JOIN devices d USING (did)
        GROUP BY d.category
        HAVING count(*) >= 2
        """,
        (
            "USING",
            "GROUP BY nullable column",
            "COUNT(*)",
            "COUNT(col)",
            "SUM",
            "AVG",
            "MIN",
            "MAX",
            "HAVING",
        ),
    ),
    ViewDef(
        "paper_comma_join",
        "paper",
        """
        SELECT d.did, p.pid, abs(p.price - 10) AS distance
        FROM devices d, devices_parts dp, parts p
        WHERE d.did = dp.did AND dp.pid = p.pid AND d.category IN ('phone', 'tablet')
          AND p.price <> 7
        """,
        ("comma join with WHERE", "IN list on conditional attribute", "abs"),
    ),
    ViewDef(
        "paper_global_agg",
        "paper",
        "SELECT count(*) AS n_parts, sum(price) AS total, min(price) AS cheapest, "
        "max(price) AS priciest, avg(price) AS mean FROM parts",
        ("global aggregate", "COUNT(*)", "SUM", "MIN", "MAX", "AVG"),
    ),
    ViewDef(
        "paper_not_exists",
        "paper",
        """
        SELECT d.did, d.category FROM devices d
        WHERE NOT EXISTS (SELECT 1 FROM devices_parts dp WHERE dp.did = d.did)
        """,
        ("NOT EXISTS (correlated)",),
    ),
    ViewDef(
        "paper_not_in",
        "paper",
        """
        SELECT pid, price FROM parts
        WHERE pid NOT IN (
            SELECT dp.pid FROM devices_parts dp JOIN devices d ON d.did = dp.did
            WHERE d.category = 'phone')
        """,
        ("NOT IN over NOT NULL column", "join inside subquery"),
    ),
    ViewDef(
        "paper_exists_in",
        "paper",
        """
        SELECT p.pid, p.price FROM parts p
        WHERE EXISTS (SELECT 1 FROM devices_parts dp WHERE dp.pid = p.pid)
          AND p.pid IN (
              SELECT dp2.pid FROM devices_parts dp2 JOIN devices d ON d.did = dp2.did
              WHERE d.category = 'tablet')
        """,
        ("EXISTS (correlated)", "IN (subquery)"),
    ),
    ViewDef(
        "paper_subquery_agg_from",
        "paper",
        """
        SELECT t.did, d.category, t.s AS cost, t.c AS n_parts
        FROM (SELECT dp.did, sum(p.price) AS s, count(*) AS c
              FROM devices_parts dp JOIN parts p ON p.pid = dp.pid
              GROUP BY dp.did) t
        JOIN devices d ON d.did = t.did
        WHERE t.s > 10
        """,
        ("subquery in FROM with aggregate", "join above aggregate", "selection above aggregate"),
    ),
    ViewDef(
        "paper_self_theta",
        "paper",
        """
        SELECT p1.pid AS cheap_pid, p2.pid AS pricey_pid, p2.price - p1.price AS diff
        FROM parts p1 JOIN parts p2 ON p1.price < p2.price AND p2.price <= p1.price + 2
        """,
        ("self-join", "theta join", "arithmetic"),
    ),
    # TPC-H Q13's shape: a device whose part count changes moves between count groups (the
    # outer γ reads that Δu straight: rules/aggregate.py, moved_idiff)
    ViewDef(
        "paper_devices_per_part_count",
        "paper",
        """
        SELECT n_parts, count(*) AS devices
        FROM (SELECT d.did, count(dp.pid) AS n_parts
              FROM devices d LEFT JOIN devices_parts dp ON dp.did = d.did
              GROUP BY d.did) AS per_device
        GROUP BY n_parts
        """,
        ("a Δu moving rows between groups", "LEFT JOIN below two aggregates"),
    ),
    ViewDef(
        "paper_cross_product",
        "paper",
        """
        SELECT d.did, p.pid, p.price FROM devices d CROSS JOIN parts p
        WHERE d.category = 'laptop' AND p.price > 15
        """,
        ("cross product", "selection on both sides"),
    ),
    ViewDef(
        "paper_distinct",
        "paper",
        """
        SELECT DISTINCT d.category, p.price, p.price > 17 AS top
        FROM devices d NATURAL JOIN devices_parts dp NATURAL JOIN parts p
        WHERE p.price >= 14
        """,
        ("SELECT DISTINCT", "NATURAL JOIN with aliases", "boolean expression"),
    ),
    # ----------------------------------------------------------------- (b) social
    ViewDef(
        "social_city_mentions",
        "social",
        """
        SELECT m.mid, m.uid, u.name, mb.time AS posted
        FROM mention m
        JOIN users u ON u.uid = m.uid
        JOIN microblog mb ON mb.mid = m.mid
        WHERE u.city = 1 AND mb.time > 5
        """,
        ("JOIN ON", "3-table join", "selection on conditional attributes"),
    ),
    ViewDef(
        "social_friends_same_city",
        "social",
        """
        SELECT f.uid, f.followee_id, u1.name AS follower, u2.name AS followee, u1.city
        FROM friendlist f
        JOIN users u1 ON u1.uid = f.uid
        JOIN users u2 ON u2.uid = f.followee_id
        WHERE u1.city = u2.city
        """,
        ("self-join (users twice)", "join on nullable column", "3-table join"),
    ),
    ViewDef(
        "social_fof_sums",
        "social",
        """
        SELECT f1.uid, count(*) AS paths, sum(u3.tweetsnum) AS tweets,
               avg(u3.favornum) AS favors
        FROM friendlist f1, friendlist f2, users u1, users u3
        WHERE f2.uid = f1.followee_id AND u1.uid = f1.uid AND u3.uid = f2.followee_id
          AND u1.city = u3.city
        GROUP BY f1.uid
        """,
        ("many-to-many join under GROUP BY (uncached input)", "comma join with WHERE",
         "self-join", "SUM", "AVG"),
    ),
    ViewDef(
        "social_mutual_follow",
        "social",
        """
        SELECT f1.uid AS a, f1.followee_id AS b
        FROM friendlist f1, friendlist f2
        WHERE f1.uid = f2.followee_id AND f1.followee_id = f2.uid AND f1.uid < f1.followee_id
        """,
        ("self-join", "comma join with WHERE", "theta condition"),
    ),
    ViewDef(
        "social_city_stats",
        "social",
        """
        SELECT u.city, count(*) AS posts, count(mb.content) AS with_content,
               sum(u.tweetsnum) AS tweets, avg(mb.time) AS avg_time,
               min(mb.time) AS first_time, max(mb.time) AS last_time
        FROM users u JOIN microblog mb ON mb.uid = u.uid
        GROUP BY u.city
        HAVING sum(u.favornum) > 5
        """,
        (
            "GROUP BY nullable column",
            "COUNT(*)",
            "COUNT(col)",
            "SUM",
            "AVG",
            "MIN",
            "MAX",
            "HAVING on aggregate not in output",
        ),
    ),
    ViewDef(
        "social_distinct_buckets",
        "social",
        """
        SELECT DISTINCT u.city, mb.time / 4 AS bucket
        FROM users u JOIN microblog mb USING (uid)
        WHERE u.tweetsnum > 20
        """,
        ("SELECT DISTINCT", "USING", "arithmetic"),
    ),
    ViewDef(
        "social_union_uids",
        "social",
        "SELECT uid FROM mention UNION SELECT uid FROM microblog",
        ("UNION",),
    ),
    ViewDef(
        "social_union_all_roles",
        "social",
        """
        SELECT uid, 'follower' AS role FROM friendlist
        UNION ALL
        SELECT followee_id, 'followee' FROM friendlist
        UNION ALL
        SELECT uid, 'author' FROM microblog WHERE time >= 20
        """,
        ("UNION ALL (3 branches)", "constants"),
    ),
    ViewDef(
        "social_silent_followed",
        "social",
        """
        SELECT u.uid, lower(u.name) AS name
        FROM users u
        WHERE NOT EXISTS (SELECT 1 FROM microblog mb WHERE mb.uid = u.uid)
          AND u.uid IN (SELECT followee_id FROM friendlist)
        """,
        ("NOT EXISTS", "IN (subquery)", "lower"),
    ),
    ViewDef(
        "social_later_posts",
        "social",
        """
        SELECT a.mid AS earlier, b.mid AS later, b.time - a.time AS gap
        FROM microblog a JOIN microblog b ON a.uid = b.uid AND a.time < b.time
        """,
        ("self-join", "theta join"),
    ),
    ViewDef(
        "social_active_users",
        "social",
        """
        SELECT u.uid, lower(u.name) AS name, u.tweetsnum + u.favornum AS activity, t.posts
        FROM (SELECT uid, count(*) AS posts FROM microblog GROUP BY uid) AS t
        JOIN users u ON u.uid = t.uid
        WHERE t.posts >= 3 AND u.city IS NOT NULL
        """,
        ("subquery in FROM with aggregate", "selection above aggregate", "arithmetic"),
    ),
    # ----------------------------------------------------------------- (c) orders
    ViewDef(
        "orders_revenue",
        "orders",
        """
        SELECT c.nation, o.status,
               sum(l.extendedprice * (1 - l.discount)) AS revenue,
               count(l.extendedprice) AS priced, count(*) AS n, sum(l.quantity) AS qty
        FROM customers c
        JOIN orders o ON o.custkey = c.custkey
        JOIN lineitem l ON l.orderkey = o.orderkey
        WHERE o.orderdate BETWEEN 3 AND 15
        GROUP BY c.nation, o.status
        """,
        (
            "3-table join",
            "GROUP BY two columns",
            "SUM over nullable numeric expression",
            "COUNT(col)",
            "COUNT(*)",
            "BETWEEN",
        ),
    ),
    ViewDef(
        "orders_exists_grouped",
        "orders",
        """
        SELECT o.status, count(*) AS n FROM orders o
        WHERE o.orderdate BETWEEN 3 AND 15
          AND EXISTS (SELECT 1 FROM lineitem l WHERE l.orderkey = o.orderkey
                      AND l.quantity > 4)
        GROUP BY o.status
        """,
        # TPC-H Q4's shape: a tuple-based Δ- of an order that fails EXISTS decremented its group
        ("EXISTS under GROUP BY", "COUNT(*) of a semijoin"),
    ),
    ViewDef(
        "orders_not_exists_self_grouped",
        "orders",
        """
        SELECT l1.partno, count(*) AS n FROM lineitem l1
        WHERE NOT EXISTS (SELECT 1 FROM lineitem l3 WHERE l3.orderkey = l1.orderkey
                          AND l3.partno <> l1.partno AND l3.quantity > 3)
        GROUP BY l1.partno
        """,
        # TPC-H Q21's shape: NOT EXISTS over the same table, under an aggregate
        ("NOT EXISTS self-antijoin under GROUP BY",),
    ),
    ViewDef(
        "orders_big_orders",
        "orders",
        """
        SELECT o.orderkey, c.name, t.total_qty, t.lines
        FROM (SELECT orderkey, sum(quantity) AS total_qty, count(*) AS lines
              FROM lineitem GROUP BY orderkey) t
        JOIN orders o ON o.orderkey = t.orderkey
        JOIN customers c ON c.custkey = o.custkey
        WHERE t.total_qty > 12
        """,
        ("subquery in FROM with aggregate", "3-way join above aggregate", "selection above"),
    ),
    ViewDef(
        "orders_lineitem_projection",
        "orders",
        """
        SELECT l.orderkey, l.linenumber, COALESCE(l.discount, 0) AS disc,
               abs(l.quantity - 5) AS qdev,
               CASE WHEN l.extendedprice IS NULL THEN 'unknown'
                    WHEN l.extendedprice > 50 THEN 'big' ELSE 'small' END AS size,
               lower(c.segment) AS seg
        FROM lineitem l
        JOIN orders o USING (orderkey)
        JOIN customers c ON c.custkey = o.custkey
        WHERE c.segment IS NOT NULL OR o.priority = 1
        """,
        ("USING + JOIN ON", "COALESCE", "abs", "CASE", "lower", "OR with IS NOT NULL"),
    ),
    ViewDef(
        "orders_global_lineitem",
        "orders",
        """
        SELECT count(*) AS n, count(discount) AS n_discounted, sum(extendedprice) AS total,
               avg(quantity) AS avg_qty, min(extendedprice) AS lo, max(discount) AS max_disc
        FROM lineitem
        """,
        ("global aggregate", "aggregates over nullable numerics"),
    ),
    ViewDef(
        "orders_idle_customers",
        "orders",
        "SELECT custkey FROM customers EXCEPT SELECT custkey FROM orders WHERE status = 'O'",
        ("EXCEPT", "nullable column in EXCEPT"),
    ),
    ViewDef(
        "orders_unshipped",
        "orders",
        """
        SELECT o.orderkey, o.status FROM orders o
        WHERE o.orderkey NOT IN (SELECT l.orderkey FROM lineitem l WHERE l.quantity > 7)
        """,
        ("NOT IN over NOT NULL column",),
    ),
    ViewDef(
        "orders_segments",
        "orders",
        """
        SELECT c.nation, c.segment, count(*) AS n, max(o.orderdate) AS last_date,
               min(c.acctbal) AS min_bal
        FROM customers c, orders o
        WHERE c.custkey = o.custkey
        GROUP BY c.nation, c.segment
        HAVING max(o.priority) >= 2
        """,
        ("comma join", "GROUP BY nullable column", "HAVING on nullable column", "MIN numeric"),
    ),
    # outer joins: padded rows appear and vanish as matches come and go (issue 15)
    ViewDef(
        "orders_left_join_counts",
        "orders",
        """
        SELECT c.custkey, c.name, count(o.orderkey) AS n_orders, sum(o.priority) AS sum_pri
        FROM customers c LEFT JOIN orders o ON o.custkey = c.custkey AND o.status <> 'F'
        GROUP BY c.custkey, c.name
        """,
        ("LEFT JOIN", "ON with a condition on the padded side", "COUNT over padded rows"),
    ),
    ViewDef(
        "orders_left_join_rows",
        "orders",
        """
        SELECT o.orderkey, o.status, l.linenumber, l.quantity, c.nation
        FROM orders o LEFT JOIN lineitem l ON l.orderkey = o.orderkey AND l.quantity > o.priority
        JOIN customers c ON c.custkey = o.custkey
        WHERE o.orderdate > 3
        """,
        ("LEFT JOIN with a θ part", "inner join after an outer join", "WHERE on the "
         "preserved side"),
    ),
    ViewDef(
        "orders_right_full_join",
        "orders",
        """
        SELECT c.custkey AS ckey, o.orderkey, o.priority, c.segment
        FROM orders o RIGHT JOIN customers c ON o.custkey = c.custkey AND o.priority > 1
        UNION ALL
        SELECT c.custkey, o.orderkey, o.priority, c.segment
        FROM customers c FULL JOIN orders o ON o.custkey = c.custkey AND c.acctbal > 0
        """,
        ("RIGHT JOIN", "FULL JOIN", "padded rows on both sides"),
    ),
    # γ by the preserved side's key over a left join: the aggregate pushed below the join
    ViewDef(
        "orders_left_join_pushed_aggregates",
        "orders",
        """
        SELECT n_orders, count(*) AS customers, sum(top) AS tops
        FROM (SELECT c.custkey, count(o.orderkey) AS n_orders, count(*) AS n_rows,
                     min(o.priority) AS low, max(o.orderdate) AS top, avg(o.priority) AS mean
              FROM customers c LEFT JOIN orders o
                ON c.custkey = o.custkey AND o.status <> 'F' AND c.acctbal > 0
              GROUP BY c.custkey
              HAVING count(*) < 4 OR min(o.priority) IS NULL) AS per_customer
        GROUP BY n_orders
        """,
        ("aggregate pushed below LEFT JOIN", "ON with a condition on the preserved side",
         "COUNT(*) of padded rows"),
    ),
    # TPC-H Q13's shape over a foreign key that may be NULL: the left join re-derives the
    # customers a changed count touches, which the outer γ reads before and after (over a NOT
    # NULL one it reads the moved rows straight: paper_devices_per_part_count)
    ViewDef(
        "orders_count_per_count",
        "orders",
        """
        SELECT n_orders, count(*) AS customers, sum(custkey) AS keys
        FROM (SELECT c.custkey, count(o.orderkey) AS n_orders
              FROM customers c LEFT JOIN orders o ON o.custkey = c.custkey AND o.status <> 'F'
              GROUP BY c.custkey) AS per_customer
        GROUP BY n_orders
        """,
        ("a Δu moving rows between groups", "LEFT JOIN below two aggregates"),
    ),
    ViewDef(
        "orders_scalar_magic_set",
        "orders",
        """
        SELECT l.orderkey, l.linenumber, l.quantity, o.status
        FROM lineitem l JOIN orders o ON o.orderkey = l.orderkey
        WHERE o.status <> 'F' AND o.priority > 1
          AND l.quantity >= (SELECT avg(l2.quantity) FROM lineitem l2
                             WHERE l2.orderkey = o.orderkey AND l2.discount < 0.05)
        """,
        ("correlated scalar over a filtered outer source (magic set)",),
    ),
    ViewDef(
        "lineitem_left_join_lookup",
        "orders",
        """
        SELECT l.orderkey, l.linenumber, l.quantity, o.status, o.priority, x.spent
        FROM lineitem l LEFT JOIN orders o ON o.orderkey = l.orderkey
        LEFT JOIN (SELECT custkey, sum(priority) AS spent FROM orders GROUP BY custkey) x
          ON x.custkey = o.custkey
        """,
        ("LEFT JOIN on the other side's key", "LEFT JOIN to a grouped subquery"),
    ),
    # scalar subqueries, ANY/ALL, COUNT(DISTINCT) (issue 15)
    ViewDef(
        "orders_scalar_correlated",
        "orders",
        """
        SELECT l.orderkey, l.linenumber, l.quantity
        FROM lineitem l
        WHERE l.quantity > (SELECT 0.8 * avg(l2.quantity) FROM lineitem l2
                            WHERE l2.partno = l.partno AND l2.linenumber <> 2)
          AND l.quantity < (SELECT 40)
        """,
        ("correlated scalar aggregate subquery", "constant subquery"),
    ),
    ViewDef(
        "orders_scalar_having",
        "orders",
        """
        SELECT o.custkey, sum(o.priority) AS s, count(DISTINCT o.status) AS statuses
        FROM orders o
        WHERE o.orderdate >= (SELECT min(o3.orderdate) + 2 FROM orders o3 WHERE o3.priority = 1)
        GROUP BY o.custkey
        HAVING sum(o.priority) > (SELECT avg(o2.priority) FROM orders o2)
        """,
        ("uncorrelated scalar subquery in WHERE", "scalar subquery in HAVING",
         "COUNT(DISTINCT)"),
    ),
    ViewDef(
        "orders_scalar_flip",
        "orders",
        """
        SELECT l.orderkey, l.linenumber,
               l.quantity - (SELECT avg(l2.quantity) FROM lineitem l2) AS above
        FROM lineitem l
        WHERE l.quantity > (SELECT avg(l3.quantity) FROM lineitem l3 WHERE l3.partno <> 3)
        """,
        ("uncorrelated scalar compared with each row: only the rows whose predicate flips "
         "change", "uncorrelated scalar in an expression of the SELECT list"),
    ),
    ViewDef(
        "orders_scalar_flip_grouped",
        "orders",
        """
        SELECT c.segment, count(*) AS n, sum(c.acctbal) AS total
        FROM customers c
        WHERE c.acctbal > (SELECT avg(c2.acctbal) FROM customers c2 WHERE c2.acctbal > 0)
          AND NOT EXISTS (SELECT 1 FROM orders o WHERE o.custkey = c.custkey)
        GROUP BY c.segment
        """,
        ("uncorrelated scalar over a nullable column under γ and ▷ (TPC-H Q22's shape)",),
    ),
    ViewDef(
        "orders_scalar_theta",
        "orders",
        """
        SELECT l.orderkey, l.linenumber, l.quantity
        FROM lineitem l
        WHERE 0.5 * (SELECT sum(l3.quantity) FROM lineitem l3)
              > (SELECT sum(l2.quantity) FROM lineitem l2 WHERE l2.quantity > l.quantity)
        """,
        ("scalar subquery correlated by a non-equality (magic set)",),
    ),
    ViewDef(
        "orders_scalar_theta_rank",
        "orders",
        """
        SELECT l.orderkey, l.linenumber,
               (SELECT count(*) FROM lineitem l2
                WHERE l2.partno = l.partno AND l2.quantity < l.quantity) AS below
        FROM lineitem l
        """,
        ("COUNT subquery correlated by an equality and a non-equality, padded",),
    ),
    ViewDef(
        "orders_exists_one_row",
        "orders",
        """
        SELECT o.orderkey, o.status
        FROM orders o
        WHERE EXISTS (SELECT 1 FROM (SELECT sum(l.quantity) AS q FROM lineitem l
                                     WHERE l.orderkey = o.orderkey) n
                      WHERE n.q > 12)
        """,
        ("EXISTS over a correlated one-row aggregate (a comparison with it)",),
    ),
    ViewDef(
        "orders_grouped_scalar_item",
        "orders",
        """
        SELECT o.status, (SELECT count(*) FROM lineitem l) * count(*) AS x, sum(o.orderdate) AS d
        FROM orders o
        GROUP BY o.status
        """,
        ("uncorrelated scalar subquery in a grouped SELECT list (joined above γ)",),
    ),
    ViewDef(
        "orders_not_exists_derived",
        "orders",
        """
        SELECT t.orderkey, t.q
        FROM (SELECT l.orderkey, sum(l.quantity) AS q FROM lineitem l GROUP BY l.orderkey) t
        WHERE NOT EXISTS (SELECT 1
                          FROM (SELECT l2.orderkey, sum(l2.quantity) AS q
                                FROM lineitem l2 GROUP BY l2.orderkey) t2
                          WHERE t2.q > t.q)
        """,
        ("NOT EXISTS over an aggregate derived table, correlated in its WHERE (TPC-H Q15 as "
         "DBToaster writes it)",),
    ),
    # ----------------------------------------------------------------- (d) set operations
    ViewDef(
        "setops_union",
        "setops",
        "SELECT b, c FROM r UNION SELECT y, z FROM s",
        ("UNION with NULLs",),
    ),
    ViewDef(
        "setops_union_all",
        "setops",
        "SELECT a AS k, b AS v FROM r WHERE b > 2 UNION ALL SELECT x, y FROM s WHERE z IS NULL",
        ("UNION ALL", "IS NULL selection"),
    ),
    ViewDef(
        "setops_except",
        "setops",
        "SELECT b, c FROM r EXCEPT SELECT y, z FROM s",
        ("EXCEPT with NULLs",),
    ),
    ViewDef(
        "setops_intersect",
        "setops",
        "SELECT b, c FROM r INTERSECT SELECT y, z FROM s",
        ("INTERSECT with NULLs",),
    ),
    ViewDef(
        "setops_cte_avg_having",
        "setops",
        """
        WITH big AS (SELECT x, y, z FROM s WHERE z IS NOT NULL)
        SELECT r.b, avg(big.z) AS az, count(*) AS n
        FROM r JOIN big ON big.y = r.b
        GROUP BY r.b HAVING sum(big.z) > 2
        """,
        ("WITH", "AVG", "HAVING on an aggregate not in the output"),
    ),
    ViewDef(
        "setops_not_in_exists",
        "setops",
        """
        SELECT a, b, c FROM r
        WHERE b NOT IN (SELECT y FROM s WHERE y > 4)
          AND EXISTS (SELECT 1 FROM s WHERE s.y = r.b AND s.x > r.a)
        """,
        ("NOT IN over NOT NULL column", "EXISTS with theta correlation"),
    ),
    ViewDef(
        "setops_theta_join",
        "setops",
        """
        SELECT r.a, s.x, r.b + s.y AS total, COALESCE(r.c, s.z, -1) AS first_c
        FROM r, s
        WHERE r.b < s.y AND r.c IS NOT NULL
        """,
        ("theta join (comma)", "COALESCE with several arguments"),
    ),
    ViewDef(
        "setops_any_all",
        "setops",
        """
        SELECT a, b, c FROM r
        WHERE b >= ALL (SELECT y FROM s WHERE s.x < r.a)
          AND c < ANY (SELECT z FROM s)
          AND NOT (b = ANY (SELECT z + 1 FROM s WHERE s.y > 5))
        """,
        ("ALL (correlated)", "ANY over a nullable column", "NOT … ANY"),
    ),
    ViewDef(
        "setops_scalar_padded",
        "setops",
        """
        SELECT r.a, (SELECT count(*) FROM s WHERE s.y = r.b) AS n_s,
               r.b + (SELECT sum(s.z) FROM s) AS b_plus
        FROM r
        WHERE r.c < (SELECT count(s.z) FROM s WHERE s.y = r.b) OR r.c IS NULL
          AND r.b IN (SELECT 4)
        """,
        ("scalar subqueries in SELECT (COUNT over no rows is 0)", "scalar subquery under OR",
         "IN (constant)"),
    ),
    ViewDef(
        "setops_without_from",
        "setops",
        """
        SELECT 1 AS one, (SELECT max(r.b) FROM r) AS top, (SELECT count(*) FROM s) AS n_s,
               (SELECT sum(r.c) FROM r WHERE r.b = 2) AS sum_c
        WHERE 5 IN (SELECT r.b FROM r) AND 2 > ALL (SELECT min(s.y) FROM s)
        """,
        ("SELECT without FROM", "ALL over an aggregate"),
    ),
    ViewDef(
        "setops_global_filtered",
        "setops",
        "SELECT count(*) AS n, sum(c) AS sum_c, max(b) AS max_b, count(c) AS n_c "
        "FROM r WHERE b = 6 AND a % 2 = 0",
        ("global aggregate over a selection that can become empty", "modulo"),
    ),
)

VIEWS_BY_NAME: dict[str, ViewDef] = {v.name: v for v in VIEWS}


def views_of(schema_key: str) -> list[ViewDef]:
    """All catalogue views over the schema ``schema_key``."""
    return [v for v in VIEWS if v.schema == schema_key]
