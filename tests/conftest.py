"""Shared fixtures: a reachable PostgreSQL (``IDIVM_TEST_DSN``) and throwaway schemas in it."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import psycopg
import pytest
from psycopg import sql

# fresh views' C++ compiled at -O1 (the g++ runs were most of the fresh tests' time; the
# benchmarks, out of the suite, compile at -O3); a value set by hand wins
os.environ.setdefault("IDIVM_FRESH_OPT", "-O1")

# synchronous_commit off in the tests' sessions: a commit is not waited onto the disk (the
# tests' schemas are thrown away; what a committed row means to other sessions is unchanged)
# — the PostgreSQL tests ran ~12% sooner
DEFAULT_DSN = ("postgresql://postgres@127.0.0.1:5432/postgres"
               "?options=-c%20synchronous_commit%3Doff")
T = TypeVar("T")
START_HINT = "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"


# The longest test files, longest first (seconds on 2 cores, CI of 2026-11-30 on a slow
# machine, from its JUnit report): xdist hands a file at a time to the next free worker in
# collection order (``--no-loadscope-reorder``), so the two workers finish together instead
# of one running a long file alone at the end.
LONGEST_FIRST = (
    "tests/test_differential_pg.py",  # 365
    "tests/test_spark.py",  # 289
    "tests/test_spark_mixed.py",  # 259
    "tests/test_spark_pipeline.py",  # 227
    "tests/test_fuzz.py",  # 150
    "tests/test_rules_trust.py",  # 114
    "tests/test_spark_delta.py",  # 97
    "tests/test_pg_trust.py",  # 96
    "tests/test_pg_plan_shape.py",  # 84
    "tests/test_frontend_trust.py",  # 83
    "tests/test_spark_differential.py",  # 74
    "tests/test_spark_sdp.py",  # 57
    "tests/test_bench_tpch.py",  # 56
    "tests/test_pg_isolation.py",  # 53
    "tests/test_cli_spark.py",  # 44
    "tests/fresh/test_nested.py",  # 42
    "tests/test_fuzz_found.py",  # 39
    "tests/fresh/test_tpch.py",  # 34
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tag every test that needs PostgreSQL, so ``-m "not postgres"`` deselects them; the
    ``LONGEST_FIRST`` files first (a stable sort: the rest keep their order)."""
    for item in items:
        if "pg_dsn" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.postgres)
    rank = {f: k for k, f in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


@pytest.fixture(scope="session")
def pg_dsn() -> str:
    """DSN of the test PostgreSQL; skips (fails when ``CI=true``) if it cannot be reached."""
    dsn = os.environ.get("IDIVM_TEST_DSN", DEFAULT_DSN)
    try:
        with psycopg.connect(dsn, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as err:
        message = (
            f"PostgreSQL is not reachable at {dsn} ({str(err).strip()}). "
            f"Start it with: {START_HINT} (or set IDIVM_TEST_DSN)"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return dsn


def drop_schemas(dsn: str, *schemas: str) -> None:
    """Drop ``schemas`` and everything in them, ignoring those that do not exist."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for schema in schemas:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def at_two_sizes(dsn: str, schema: str, run: Callable[[str, str, int], T], small: int,
                 big: int) -> tuple[T, T]:
    """``run(dsn, schema, n)`` at ``small`` in ``schema`` and at ``big`` in a second schema
    (dropped afterwards with its companion): plan-shape tests compare the two."""
    first = run(dsn, schema, small)
    big_schema = f"{schema}_big"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(big_schema)))
    try:
        return first, run(dsn, big_schema, big)
    finally:
        drop_schemas(dsn, big_schema, f"{big_schema}__idivm")


@pytest.fixture
def pg_schema(pg_dsn: str) -> Iterator[str]:
    """A fresh, uniquely named schema; dropped afterwards with its ``<schema>__idivm`` companion."""
    schema = f"idivm_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    try:
        yield schema
    finally:
        drop_schemas(pg_dsn, schema, f"{schema}__idivm")


@pytest.fixture
def pg_db(pg_dsn: str, pg_schema: str) -> Iterator[tuple[Any, psycopg.Connection[Any], str]]:
    """A maintainer of a fresh schema, an autocommit connection whose search_path is that
    schema, and its name; both closed afterwards."""
    from idivm.postgres import PostgresMaintainer

    conn = psycopg.connect(pg_dsn, autocommit=True)
    conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(pg_schema)))
    m = PostgresMaintainer(pg_dsn, pg_schema)
    try:
        yield m, conn, pg_schema
    finally:
        m.close()
        conn.close()


@pytest.fixture(scope="session")
def spark_available() -> None:
    """Skip a Spark test when Java or pyspark is missing; under CI=true, fail instead."""
    why = None
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        why = "Java is not installed (apt-get install openjdk-17-jre-headless)"
    try:
        import pyspark  # noqa: F401
    except ImportError:
        why = "pyspark is not installed (pip install -e '.[dev]')"
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"Spark tests cannot run: {why}")
        pytest.skip(why)


TEST_SPARK_CONF = {
    # one shuffle partition and no adaptive re-planning: a few rows per table
    "spark.sql.shuffle.partitions": "1",
    "spark.sql.adaptive.enabled": "false",
    # expressions interpreted, no whole-stage code generation: compiling the generated Java of
    # each of thousands of one-off queries cost more than running them (the Spark differential
    # suite's paper views: 110 s -> 69 s with these and C1 below). The results cannot differ:
    # Spark falls back to the same interpreted evaluation whenever code generation fails.
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    # the JIT's C1 compiler only: a short-lived driver running many small jobs (as the CLI's)
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=256m",
}


@pytest.fixture(scope="session")
def spark(spark_available: None) -> Iterator[Any]:
    """One embedded SparkSession per test process (pytest-xdist worker), shared by every Spark
    test module. Later ``getOrCreate`` calls (the CLI's, a harness's) reuse it; stopped when the
    process's tests end. The tests run thousands of jobs over a few rows each, so what costs is
    Spark's per-query work, not the rows: ``TEST_SPARK_CONF``."""
    from idivm.spark import embedded_session

    s = embedded_session("local[2]", conf=TEST_SPARK_CONF)
    yield s
    s.stop()


@pytest.fixture(scope="session")
def cxx() -> None:
    """Skip a fresh-view test when no C++ compiler is installed; under CI=true, fail instead."""
    if shutil.which(os.environ.get("CXX", "g++")) is None:
        why = "g++ is not installed (apt-get install g++), or set CXX"
        if os.environ.get("CI") == "true":
            pytest.fail(f"fresh-view tests cannot run: {why}")
        pytest.skip(why)
