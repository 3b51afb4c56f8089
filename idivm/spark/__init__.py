"""Spark backend: deferred maintenance from change feeds (Delta CDF shape), on any Spark."""

from idivm.spark.maintainer import InjectedFailure, SparkMaintainer, SparkMaintenanceStats
from idivm.spark.session import embedded_session

__all__ = ["InjectedFailure", "SparkMaintainer", "SparkMaintenanceStats", "embedded_session"]
