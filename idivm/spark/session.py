"""The embedded SparkSession: local, loopback-only, quiet."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from idivm.errors import IdivmError

log = logging.getLogger("idivm.spark")

LOOPBACK = "127.0.0.1"


def embedded_session(master: str | None = None, app: str = "idivm",
                     conf: dict[str, str] | None = None) -> Any:
    """A SparkSession bound to loopback (this machine's hostname resolves elsewhere), with the
    UI off, few shuffle partitions (maintenance batches are small) and Spark's logs quieted."""
    os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    from pyspark.sql import SparkSession

    master = master or "local[*]"
    builder = (SparkSession.builder.master(master).appName(app)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.host", LOOPBACK)
               .config("spark.driver.bindAddress", LOOPBACK)
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.sql.adaptive.enabled", "true")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.sources.partitionOverwriteMode", "dynamic"))
    for k, v in (conf or {}).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    log.info("idivm: started an embedded SparkSession (%s, UI off, bound to %s)", master,
             LOOPBACK)
    return spark


SPARK_SESSION: Any = None
"""A SparkSession ``idivm spark``, ``idivm demo`` and ``idivm bench spark`` use instead of
starting one (for tests and embedders); never stopped by the CLI."""

QUIET_LOG4J2 = """rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = error
"""


def driver_conf(short_run: bool) -> dict[str, str]:
    """Driver JVM options for an embedded session: Spark's start-up logging quieted, and for a
    short run (a CLI command, the demo) the C1 compiler only — a short-lived driver running many
    small jobs pays more for C2's warm-up than it gets back (the demo ran ~1.6x faster)."""
    props = Path(tempfile.gettempdir()) / "idivm-log4j2.properties"
    if not props.exists() or props.read_text() != QUIET_LOG4J2:
        tmp = props.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(QUIET_LOG4J2)
        os.replace(tmp, props)
    opts = f"-Dlog4j2.configurationFile={props}"
    if short_run:  # C1 alone reserves 48 MB for compiled code; Spark's codegen fills that
        opts = f"-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=256m {opts}"
    return {"spark.driver.extraJavaOptions": opts}


def spark_session(master: str | None = None, conf: dict[str, str] | None = None) -> Any:
    """``SPARK_SESSION`` if set, else the embedded (loopback-only) session, started on first use
    and then reused by every in-process call."""
    if SPARK_SESSION is not None:
        return SPARK_SESSION
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise IdivmError("Spark needs Java 17 on the PATH "
                         "(Debian/Ubuntu: apt-get install openjdk-17-jre-headless)")
    try:
        import pyspark  # noqa: F401
    except ImportError as e:
        raise IdivmError("pyspark is not installed (pip install -e '.[dev]')") from e
    return embedded_session(master, conf=conf)
