"""One way to get a SparkSession for flowbus: local by default, a cluster or Spark Connect on request.

How it works:

* ``spark_session()`` starts an embedded ``local[*]`` session: the driver binds
  to 127.0.0.1, the web UI is off, and ``PYSPARK_PYTHON`` /
  ``PYSPARK_DRIVER_PYTHON`` are set to the running interpreter, so the Python
  workers import the same flowbus, numpy and numba as the driver.
* ``master="spark://..."`` (or ``yarn``, ``k8s://...``) builds a classic
  session against that cluster; ``remote="sc://HOST:PORT"`` builds a Spark
  Connect client session (no local JVM is started, so Java is not needed).
  Either way flowbus's own code is shipped to the executors: ``src/flowbus`` is
  zipped into a temporary archive and added with
  ``spark.addArtifacts(zip, pyfile=True)`` (Spark 4 supports it for classic and
  Connect sessions alike), which puts the zip on the executors' ``sys.path``.
  The executors still need numpy, numba and pyarrow installed; an interpreter
  named by ``PYSPARK_PYTHON`` in the environment is kept for clusters (its path
  on the workers may differ from the driver's).
* The JVM's standard output goes to ``/dev/null`` and its standard error (log4j's
  warnings, the workers' chatter) to a log file: ``jvm_log`` if the caller names
  one (``flowbus run`` uses the run's ``_spark.log``), else
  ``$XDG_CACHE_HOME/flowbus/spark/APP.log``. A command's terminal, pipe or
  ``--json`` output is flowbus's own only. A local session also sets
  ``SPARK_LOCAL_IP=127.0.0.1`` (the driver binds there anyway).
* Without pyspark, or without Java for a JVM-backed session, a
  :class:`~flowbus.errors.ExternalError` says what to install.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flowbus.errors import ExternalError, UserError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["STREAMING_CONF", "flowbus_zip", "is_connect", "jvm_log_path", "spark_session"]

_LOCAL_CONF = {
    "spark.ui.enabled": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.showConsoleProgress": "false",
    # Python workers connect back to the JVM within this time: on a loaded two-core machine the
    # workers of several queries starting at once take longer than the default 15 s
    "spark.python.authenticate.socketTimeout": "120s",
}


STREAMING_CONF = {
    # a long run's JVM (flowbus run, the bench): C2 alone compiles less than tiered compilation,
    # whose C1 and C2 threads took 11-14 CPU-s of a 2,000,000-event run against 4 (measured,
    # docs/results/spark.md), and ParallelGC spends less than G1 on its short-lived rows
    "spark.driver.extraJavaOptions": "-XX:-TieredCompilation -XX:+UseParallelGC",
}
"""Settings of a local session that runs a flow for long (a new JVM only: they set its flags)."""


def _require_pyspark() -> None:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise ExternalError(
            "pyspark is not installed: pip install 'flowbus[spark]' to use flowbus on Spark"
        ) from None


def java_available() -> bool:
    """Is there a Java runtime for a JVM-backed session (``JAVA_HOME`` or ``java`` on the PATH)?"""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return True
    return shutil.which("java") is not None


def _is_local(master: str | None) -> bool:
    return master is None or master.startswith("local")


def flowbus_zip(directory: Path | None = None) -> Path:
    """Zip the flowbus package (code and data files) into ``directory``.

    Without ``directory``: a temporary directory removed when this process exits.
    """
    package = Path(__file__).resolve().parents[1]
    if directory is None:
        directory = Path(tempfile.mkdtemp(prefix="flowbus-pyfiles-"))
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
    target = Path(directory) / "flowbus.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(package.rglob("*")):
            if (
                path.is_file()
                and "__pycache__" not in path.parts
                and path.suffix not in (".pyc", ".nbi", ".nbc")
            ):
                zf.write(path, Path("flowbus") / path.relative_to(package))
    return target


def is_connect(spark: Any) -> bool:
    """Is ``spark`` a Spark Connect session (no SparkContext, no JVM in this process)?"""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def spark_session(
    *,
    master: str | None = None,
    remote: str | None = None,
    app_name: str = "flowbus",
    conf: Mapping[str, str] | None = None,
    jvm_log: Path | None = None,
) -> SparkSession:
    """A SparkSession: embedded ``local[*]`` by default, ``master`` for a cluster, ``remote`` for Connect.

    ``conf`` adds Spark settings (``spark.driver.memory`` and the like must come
    here: they only take effect when the session's JVM starts). An existing
    session with the same master is reused by Spark (``getOrCreate``).
    ``jvm_log`` receives what the JVM writes to standard error (a new JVM only;
    default :func:`jvm_log_path` of ``app_name``).
    """
    if master is not None and remote is not None:
        raise UserError("give either a master URL or a Spark Connect remote, not both")
    if remote is not None and not remote.startswith("sc://"):
        raise UserError(f"a Spark Connect remote looks like sc://HOST:PORT, got {remote!r}")
    _require_pyspark()
    if remote is not None:
        _check_reachable(remote)
    if remote is None and not java_available():
        raise ExternalError(
            "Java was not found (set JAVA_HOME or put java on the PATH): Spark needs Java 17+"
        )
    from pyspark.sql import SparkSession

    local = remote is None and _is_local(master)
    _set_python(override=local)
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder: Any = SparkSession.builder.appName(app_name)
    if remote is not None:
        builder = builder.remote(remote)
    else:
        builder = builder.master(master or "local[*]")
        for key, value in (
            _LOCAL_CONF if local else {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"}
        ).items():
            builder = builder.config(key, value)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark: SparkSession = (
        _quiet_stdout(builder.getOrCreate, jvm_log or jvm_log_path(app_name))
        if remote is None
        else builder.getOrCreate()
    )
    if not local:
        spark.addArtifacts(str(flowbus_zip()), pyfile=True)
    return spark


def jvm_log_path(app_name: str) -> Path:
    """Where a session's JVM logs when its caller names no file: the user's cache, one file per app."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "flowbus" / "spark" / f"{app_name}.log"


def _check_reachable(remote: str, timeout: float = 5.0) -> None:
    """Fail fast on a Spark Connect server that does not answer (the client would retry for minutes)."""
    from urllib.parse import urlparse

    url = urlparse(remote)
    host, port = url.hostname, url.port or 15002
    if not host:
        raise UserError(f"a Spark Connect remote looks like sc://HOST:PORT, got {remote!r}")
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        raise ExternalError(
            f"cannot reach the Spark Connect server at {host}:{port}: {exc.strerror or exc}"
        ) from None


def _quiet_stdout(start: Any, log: Path | None = None) -> Any:
    """Call ``start`` with file descriptor 1 pointing at ``/dev/null`` (and 2 at ``log``, if given).

    The JVM a session starts inherits the descriptors of the moment. Its logs go
    to standard error (log4j's console appender); its standard output carries
    only the chatter of the Python workers it spawns, which would garble
    ``--json`` output. With ``log``, standard error goes to that file too, so
    a live display on the terminal stays readable (what Python workers
    print goes there as well).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    targets = [os.open(os.devnull, os.O_WRONLY)]
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        targets.append(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))
    try:
        for fd, target in enumerate(targets, 1):
            os.dup2(target, fd)
        return start()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, old in enumerate(saved, 1):
            os.dup2(old, fd)
            os.close(old)
        for target in targets:
            os.close(target)


def _set_python(*, override: bool) -> None:
    """Point PySpark's workers at this interpreter (always locally; on a cluster only if unset)."""
    for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
        if override or name not in os.environ:
            os.environ[name] = sys.executable
