"""Random-view differential fuzzing: random schemas, views and change rounds, each view
maintained by a backend and compared with its recomputation after every round.

``schema`` (tables, keys, foreign keys, a trigger), ``views`` (view SQL over what the README
lists as supported), ``workload`` (initial rows and change rounds), ``oracle`` (run and compare
per backend and strategy), ``shrink`` (a finding reduced to a minimal view and change
sequence), ``report`` (the finding as a pytest regression test), ``run`` (the ``idivm fuzz``
driver). Everything is deterministic from the seed.
"""

from __future__ import annotations

from idivm.fuzz.schema import FuzzConfig, SchemaDef, random_schema
from idivm.fuzz.views import random_view
from idivm.fuzz.workload import Case, Round, Txn, random_case

__all__ = ["Case", "FuzzConfig", "Round", "SchemaDef", "Txn", "random_case", "random_schema",
           "random_view"]
