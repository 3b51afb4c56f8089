"""idivm: ID-based incremental view maintenance (Katsis et al., SIGMOD 2015)."""

from idivm.catalog import Catalog, Column, ForeignKey, Table
from idivm.errors import BackendError, CatalogError, IdivmError, MaintenanceError, UnsupportedSQL
from idivm.plan import Plan, plan

__all__ = [
    "BackendError", "Catalog", "CatalogError", "Column", "ForeignKey", "IdivmError",
    "MaintenanceError", "Plan", "Table", "UnsupportedSQL", "plan",
]
__version__ = "0.1.0"
