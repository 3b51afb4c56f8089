"""Errors raised by idivm. Every refusal happens before anything is created."""

from __future__ import annotations


class IdivmError(Exception):
    """Base class of every error idivm raises on purpose."""


class CatalogError(IdivmError):
    """The schema is unusable: unknown table or column, malformed DDL, bad reflection URL."""


class UnsupportedSQL(IdivmError):
    """The view uses a construct idivm cannot maintain.

    ``construct`` names it (e.g. ``"LEFT JOIN"``, ``"window function"``) and the message says why.
    """

    def __init__(self, construct: str, why: str) -> None:
        self.construct = construct
        self.why = why
        super().__init__(f"unsupported SQL construct {construct}: {why}")


class BackendError(IdivmError):
    """A backend could not be reached or refused an operation (bad DSN, missing view, ...)."""


class MaintenanceError(BackendError):
    """A maintenance run failed; it was rolled back and can be re-run."""
