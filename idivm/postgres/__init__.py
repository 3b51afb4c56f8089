"""PostgreSQL backend (psycopg 3)."""

from idivm.postgres.maintainer import MaintenanceStats, PostgresMaintainer

__all__ = ["MaintenanceStats", "PostgresMaintainer"]
