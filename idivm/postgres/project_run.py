"""``idivm pg pipeline run DIR``: the ``CREATE MATERIALIZED VIEW`` statements of a folder of SQL
files, maintained as views of one schema (``idivm.project`` reads them and plans the run)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from idivm import project
from idivm.errors import UnsupportedSQL
from idivm.postgres.maintainer import PostgresMaintainer


def sql_files(folder: Path) -> list[Path]:
    """``folder/**/*.sql``; a missing folder or one without SQL files is an error."""
    if not folder.is_dir():
        raise UnsupportedSQL("pipeline folder", f"{folder} is not a directory")
    files = sorted(folder.rglob("*.sql"))
    if not files:
        raise UnsupportedSQL("pipeline folder", f"{folder} holds no .sql file")
    return files


def run(m: PostgresMaintainer, folder: Path, dry_run: bool = False) -> dict[str, Any]:
    """Create the new datasets, re-create the changed ones (and those reading them), then
    maintain every view of the schema in one transaction; returns what each dataset did."""
    datasets, refused = project.read_files(sql_files(folder), "postgres", root=folder)
    project.refuse(refused)
    have = m.definitions()
    steps = project.plan_run(datasets, have)
    names = {d.name for d in datasets}
    views = m.dependencies()
    for s in steps:  # a re-creation must not drop a view the project does not declare
        if s.action == "recreate" and s.name in have:
            outside = sorted(v for v, ts in views.items() if s.name in ts and v not in names)
            if outside:
                raise UnsupportedSQL("pipeline change", f"re-creating {s.name} ({s.why}) would "
                                     f"drop view(s) {', '.join(outside)}, which read it and "
                                     f"are not in {folder}: drop them first")
    out: dict[str, Any] = {"datasets": [], "left_alone": sorted(set(have) - names)}
    if dry_run:
        out["datasets"] = [{"name": s.name, "location": f"{m.schema}.{s.name}",
                            "refresh": s.action, "why": s.why,
                            "reads": list(next(d.reads for d in datasets if d.name == s.name))}
                           for s in steps]
        return out
    by_name = {d.name: d for d in datasets}
    for s in reversed(steps):  # above before below
        if s.action == "recreate" and s.name in m.dependencies():
            m.drop_view(s.name, cascade=True)
    seconds: dict[str, float] = {}
    for s in steps:
        if s.action in ("create", "recreate"):
            t0 = time.perf_counter()
            m.create_view(s.name, by_name[s.name].sql)
            seconds[s.name] = time.perf_counter() - t0
    stats = m.maintain_all()
    for s in steps:
        st = stats.get(s.name)
        out["datasets"].append({
            "name": s.name, "location": f"{m.schema}.{s.name}",
            "refresh": "id" if s.action == "refresh" else s.action, "why": s.why,
            "seconds": round(seconds.get(s.name, 0.0) + (st.seconds if st else 0.0), 4),
            "changes": dict(st.changes) if st else {}})
    return out
