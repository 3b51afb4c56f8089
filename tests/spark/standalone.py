"""A Spark standalone cluster on loopback (a master and two workers, started with the
``spark-class`` that pyspark ships), and a differential run of V and V' through it.

``python -m tests.spark.standalone WAREHOUSE`` starts the cluster, creates V and V' (strategy
``id``) under each engine (``spark``: the Δ-script as Spark jobs on the workers' executors;
``driver``: DuckDB in this process), commits a price-update batch and a mixed batch, refreshes
after each and compares every view with its recomputation, then stops the cluster (also on
failure). Prints ``standalone ok`` when every view was equal after every batch.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

LOOPBACK = "127.0.0.1"
WORKERS = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def _spark_class() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


def _alive_workers(ui_port: int) -> int:
    with urllib.request.urlopen(f"http://{LOOPBACK}:{ui_port}/json/", timeout=5) as r:
        return int(json.load(r).get("aliveworkers", 0))


@contextlib.contextmanager
def standalone_cluster(workdir: Path, timeout: float = 180.0) -> Iterator[str]:
    """A master and ``WORKERS`` workers (1 core, 1 GiB each) on loopback; yields the master
    URL once every worker has registered, and stops them all on exit."""
    import pyspark

    env = dict(os.environ, SPARK_HOME=str(Path(pyspark.__file__).parent),
               SPARK_LOCAL_IP=LOOPBACK, PYSPARK_PYTHON=sys.executable,
               SPARK_NO_DAEMONIZE="1")
    port, ui = _free_port(), _free_port()
    url = f"spark://{LOOPBACK}:{port}"
    procs: list[subprocess.Popen[bytes]] = []
    logs = []

    def start(args: list[str], name: str) -> None:
        log = open(workdir / f"{name}.log", "wb")  # noqa: SIM115 (closed on exit)
        logs.append(log)
        procs.append(subprocess.Popen([str(_spark_class()), *args], env=env, stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True))

    try:
        start(["org.apache.spark.deploy.master.Master", "--host", LOOPBACK, "--port",
               str(port), "--webui-port", str(ui)], "master")
        for i in range(WORKERS):
            start(["org.apache.spark.deploy.worker.Worker", "--host", LOOPBACK, "--cores", "1",
                   "--memory", "1g", "--webui-port", str(_free_port()), "--work-dir",
                   str(workdir / f"worker{i}"), url], f"worker{i}")
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError, ValueError):
                if _alive_workers(ui) == WORKERS:
                    break
            if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
                tails = "\n".join(f"{p.name}: {p.read_text()[-1500:]}"
                                  for p in sorted(workdir.glob("*.log")))
                raise RuntimeError(f"the standalone cluster did not come up:\n{tails}")
            time.sleep(0.5)
        yield url
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, 15)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                p.wait()
        for log in logs:
            log.close()


def _rows(df: Any) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in df.collect())


def differential(spark: Any, warehouse: Path) -> list[str]:
    """V and V' under each engine over two batches; returns what was checked."""
    from idivm.bench.data import PartsDevices, mixed_batch, parts_devices, price_updates
    from idivm.catalog import Catalog
    from idivm.examples import PAPER_DDL, V_PRIME_SQL, V_SQL
    from idivm.spark import SparkMaintainer

    pd = PartsDevices(20_000, 10, 0.2)
    checked: list[str] = []
    for engine in ("spark", "driver"):
        m = SparkMaintainer(Catalog.from_ddl(PAPER_DDL), warehouse / engine, spark=spark,
                            engine=engine)
        frames = parts_devices(spark, pd)
        for name in ("devices", "parts", "devices_parts"):
            m.load_table(name, frames[name])
        m.create_view("v", V_SQL, strategy="id")
        m.create_view("vp", V_PRIME_SQL, strategy="id")
        batches = {
            "price updates": lambda: {"parts": price_updates(spark, spark.table("parts"), 50,
                                                             pd, salt=1)},
            "mixed": lambda: mixed_batch(spark, {t: spark.table(t) for t in
                                                 ("devices", "parts", "devices_parts")},
                                         pd, 0.01, salt=7, slot=pd.fanout),
        }
        for caption, build in batches.items():
            feeds = {t: df.localCheckpoint(eager=True) for t, df in build().items()}
            for t, df in feeds.items():
                m.apply_changes(t, df)
            for view in ("v", "vp"):
                stats = m.maintain(view)
                assert stats.decision.get("engine") == engine, stats.decision
                got, want = _rows(m.read_view(view)), _rows(m.recompute(view))
                assert got == want, f"{view} ({engine}, {caption}): {len(got)} vs {len(want)}"
                checked.append(f"{view} {engine} {caption}: {len(got)} rows equal")
    return checked


def main(warehouse: str) -> int:
    from idivm.spark.session import embedded_session

    with tempfile.TemporaryDirectory(prefix="idivm-standalone-") as tmp, \
            standalone_cluster(Path(tmp)) as url:
        spark = embedded_session(url, conf={"spark.executor.memory": "1g",
                                            "spark.cores.max": str(WORKERS)})
        try:
            deadline = time.monotonic() + 120  # executors register after the session starts
            while (executors := spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size()
                   - 1) < WORKERS and time.monotonic() < deadline:
                time.sleep(0.5)
            assert executors == WORKERS, f"{executors} executors registered, not {WORKERS}"
            print(f"master {url}, executors {executors}")
            for line in differential(spark, Path(warehouse)):
                print(line)
        finally:
            spark.stop()
    print("standalone ok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
