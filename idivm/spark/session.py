"""The embedded SparkSession: local, loopback-only, quiet."""

from __future__ import annotations

import logging
import os
from typing import Any

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
