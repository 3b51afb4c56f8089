"""``idivm spark pipeline run|dry-run --spec PATH``: a Spark Declarative Pipelines project
(``spark-pipeline.yml`` and its SQL files) refreshed incrementally by idivm.

The spec is read as ``spark-pipelines`` reads it (``name`` and ``storage`` required;
``libraries`` globs, a folder ending in ``/**`` meaning every file under it; ``configuration``).
``storage`` is the idivm warehouse. Each ``CREATE [OR REFRESH] MATERIALIZED VIEW`` of the SQL
files becomes a maintained view (``idivm.project``); a Python file (datasets defined in Python)
or any other statement is refused, naming it, before anything runs. Source tables are the
user's Delta tables, Change Data Feed on, named in ``configuration``:

- ``idivm.ddl``: a file of ``CREATE TABLE`` statements with primary keys (relative to the spec);
- ``idivm.source.<table>``: the Delta table's location (relative to the spec, or absolute).

A run attaches the sources (metadata only), creates the new datasets, re-creates those whose
query changed (and those reading them), and refreshes every dataset in dependency order at one
set of source versions (``maintain_all``); ``--full-refresh`` recomputes each instead.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from idivm import hoist, project
from idivm.catalog import Catalog
from idivm.errors import IdivmError, UnsupportedSQL
from idivm.refresh_cost import RefreshStrategy

SPEC_NAMES = ("spark-pipeline.yml", "spark-pipeline.yaml")
DDL_KEY = "idivm.ddl"
SOURCE_PREFIX = "idivm.source."


@dataclass(frozen=True)
class Spec:
    """A pipeline spec as idivm uses it."""

    path: Path  # the spec file
    name: str
    storage: Path
    libraries: tuple[str, ...]
    configuration: dict[str, str]

    @property
    def root(self) -> Path:
        return self.path.parent

    def ddl(self) -> str:
        rel = self.configuration.get(DDL_KEY)
        if not rel:
            raise IdivmError(f"{self.path}: configuration needs {DDL_KEY}: a file of CREATE "
                             "TABLE statements (with primary keys) for the source tables")
        f = self.root / rel
        try:
            return f.read_text()
        except OSError as e:
            raise IdivmError(f"{self.path}: {DDL_KEY} {rel!r}: cannot read {f}: {e}") from e

    def sources(self) -> dict[str, str]:
        """Source table → its Delta table's location."""
        out = {}
        for k, v in self.configuration.items():
            if k.startswith(SOURCE_PREFIX):
                loc = v if "://" in v else str((self.root / v).resolve())
                out[k[len(SOURCE_PREFIX):]] = loc
        return out


def load_spec(path: str | Path) -> Spec:
    """The spec at ``path`` (its file, or the folder holding ``spark-pipeline.yml``), or a clear
    error."""
    import yaml

    p = Path(path)
    if p.is_dir():
        found = [p / n for n in SPEC_NAMES if (p / n).is_file()]
        if len(found) != 1:
            raise IdivmError(f"{p}: expected one of {', '.join(SPEC_NAMES)}, found "
                             f"{len(found)}")
        p = found[0]
    if not p.is_file():
        raise IdivmError(f"no pipeline spec at {p}")
    try:
        data = yaml.safe_load(p.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise IdivmError(f"cannot read the pipeline spec {p}: {e}") from e
    if not isinstance(data, dict):
        raise IdivmError(f"{p}: a pipeline spec is a mapping (name, storage, libraries, …)")
    allowed = {"name", "storage", "catalog", "database", "schema", "configuration", "libraries"}
    extra = sorted(set(data) - allowed)
    if extra:
        raise IdivmError(f"{p}: unexpected field(s) {', '.join(extra)}")
    for k in ("name", "storage"):
        if k not in data:
            raise IdivmError(f"{p}: missing required field {k!r}")
    storage = str(data["storage"])
    storage = storage.removeprefix("file://")
    if "://" in storage:
        raise IdivmError(f"{p}: storage {data['storage']!r}: idivm keeps its warehouse on a "
                         "file system path (file:// or a plain path)")
    conf = data.get("configuration") or {}
    if not isinstance(conf, dict) or not all(isinstance(v, str) for v in conf.values()):
        raise IdivmError(f"{p}: configuration is a mapping of strings to strings")
    libs = []
    for entry in data.get("libraries") or []:
        try:
            libs.append(str(entry["glob"]["include"]))
        except (TypeError, KeyError) as e:
            raise IdivmError(f"{p}: a library is {{glob: {{include: PATTERN}}}}") from e
    return Spec(p.resolve(), str(data["name"]), (p.parent / storage).resolve(), tuple(libs),
                {str(k): str(v) for k, v in conf.items()})


def library_files(spec: Spec) -> list[Path]:
    """The files the libraries' globs match (``dir/**``: every file under ``dir``)."""
    out: set[Path] = set()
    for pattern in spec.libraries:
        pat = pattern + "/*" if pattern.endswith("/**") else pattern
        out |= {f for f in spec.root.glob(pat) if f.is_file() and "__pycache__" not in f.parts}
    return sorted(out)


def read_project(spec: Spec) -> tuple[list[project.Dataset], list[project.Refusal]]:
    files = library_files(spec)
    if not files:
        raise IdivmError(f"{spec.path}: its libraries match no file")
    sql = [f for f in files if f.suffix == ".sql"]
    refused = [project.Refusal(str(f.relative_to(spec.root)), f.name,
                               "a Python file: datasets defined in Python are not maintained "
                               "by idivm (define them in SQL, or run them with spark-pipelines)"
                               if f.suffix == ".py" else f"a {f.suffix or 'extensionless'} file "
                               "(libraries hold .sql and .py files)")
               for f in files if f.suffix != ".sql"]
    datasets, more = project.read_files(sql, "spark", root=spec.root)
    return datasets, refused + more


def _existing(spec: Spec) -> dict[str, str]:
    reg = spec.storage / "_idivm" / "registry.json"
    if not reg.exists():
        return {}
    return hoist.as_written(json.loads(reg.read_text())["views"])


def dry_run(spec: Spec, full_refresh: bool = False) -> dict[str, Any]:
    """What a run would do, per dataset, and why (nothing started, nothing written)."""
    datasets, refused = read_project(spec)
    out: dict[str, Any] = {"pipeline": spec.name, "storage": str(spec.storage),
                           "refused": [r.__dict__ for r in refused], "datasets": []}
    if refused:
        return out
    have = _existing(spec)
    reads = {d.name: list(d.reads) for d in datasets}
    out["datasets"] = [{"name": s.name, "refresh": s.action, "why": s.why, "reads": reads[s.name]}
                       for s in project.plan_run(datasets, have, full_refresh)]
    out["left_alone"] = sorted(set(have) - set(reads))
    return out


def run(spec: Spec, strategy: RefreshStrategy | None = None, full_refresh: bool = False,
        master: str | None = None) -> dict[str, Any]:
    """Create, re-create and refresh the project's datasets (see the module doc).
    ``strategy``: the refresh strategy of the datasets it creates (default ``auto``) and, when
    given, of this run's refreshes (default: each dataset's own)."""
    from idivm.spark import SparkMaintainer
    from idivm.spark.session import driver_conf, spark_session

    datasets, refused = read_project(spec)
    project.refuse(refused)
    catalog = Catalog.from_ddl(spec.ddl())
    sources = spec.sources()
    missing = sorted({t for d in datasets for t in _reads_all(d)} - set(sources)
                     - {d.name for d in datasets})
    if missing:
        raise IdivmError(f"{spec.path}: no source declared for {', '.join(missing)} (add "
                         f"{SOURCE_PREFIX}<table>: <Delta table path> to its configuration)")
    have = _existing(spec)
    steps = project.plan_run(datasets, have, full_refresh)
    m = SparkMaintainer(catalog, spec.storage, spark=spark_session(master, conf=driver_conf(True)))
    reg = m.registry()
    for t, loc in sorted(sources.items()):  # metadata only; a moved source is re-attached
        if reg["tables"].get(t, {}).get("delta") != loc:
            m.attach_delta(t, loc)
    names = {d.name for d in datasets}
    for s in steps:
        if s.action == "recreate":
            outside = [v for v, e in m.registry()["views"].items()
                       if s.name in (e.get("upstream") or ()) and v not in names]
            if outside:
                raise UnsupportedSQL("pipeline change", f"re-creating {s.name} ({s.why}) would "
                                     f"drop view(s) {', '.join(sorted(outside))}, which read it "
                                     "and are not in the pipeline: drop them first")
    for s in reversed(steps):
        if s.action == "recreate" and s.name in m.registry()["views"]:
            m.drop_view(s.name, cascade=True)
    by_name = {d.name: d for d in datasets}
    created: dict[str, float] = {}
    for s in steps:
        if s.action in ("create", "recreate"):
            t0 = time.perf_counter()
            m.create_view(s.name, by_name[s.name].sql, strategy=strategy or "auto")
            created[s.name] = time.perf_counter() - t0
    stats = m.maintain_all(strategy="recompute" if full_refresh else strategy)
    out: dict[str, Any] = {"pipeline": spec.name, "storage": str(spec.storage),
                           "datasets": [], "left_alone": sorted(set(have) - names)}
    for s in steps:
        st = stats.get(s.name)
        ran = s.action if s.name in created else \
            (st.decision.get("choice") or "none") if st is not None else "none"
        out["datasets"].append({
            "name": s.name, "location": m.view_location(s.name), "refresh": ran,
            "engine": st.decision.get("engine") if st is not None else None,
            "why": s.why if s.name in created else
            (st.decision.get("reason") if st is not None and st.decision else "nothing pending"),
            "seconds": round(created.get(s.name, 0.0) + (st.seconds if st else 0.0), 4),
            "changes": dict(st.changes) if st is not None else {},
            "columns": list(m.plan_of(s.name).columns)})
    return out


def _reads_all(d: project.Dataset) -> set[str]:
    from idivm.frontend import relations_read

    return relations_read(d.sql)
