"""Fresh views: higher-order IVM compiled to C++ triggers, one event at a time (DBToaster-style).

``FreshView.compile(sql, catalog)`` translates a select-project-join-aggregate view into a
trigger program of maps (``program.py``), generates C++17 (``codegen.py``), compiles it with
g++ once per source hash (``build.py``) and loads it through a small C ABI (``abi.hpp``).
"""

from idivm.fresh.view import FreshError, FreshView, ReplayStats

__all__ = ["FreshError", "FreshView", "ReplayStats"]
