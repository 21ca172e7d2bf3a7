"""One class-data archive (Java's AppCDS) of a pyspark driver's classes, for every test JVM.

A test's JVM spends most of its start-up loading and verifying some 10,000 classes from
pyspark's jars. A dynamic archive dumped once by a driver JVM at its exit (Java 13+,
``-XX:ArchiveClassesAtExit``) lets every later JVM with the same class path map ~8,000 of them
(2 cores busy with a test run, medians of 3: a fresh local session + two tiny jobs 35.4 -> 21.4 s
wall, 20.2 -> 11.9 CPU-s; a streaming kill-and-resume driver run 28.8 -> 22.0 s, 23.5 -> 18.3
CPU-s, on a quieter machine 21.4 -> 18.5 s, 21.4 -> 18.0 CPU-s). Dumping it: ~60 s, ~150 MB.

Owns: the archive's key (the java binary, its module image, pyspark's jars and the driver's class
path), building it once under a file lock, and the JVM options that use it. A JVM whose class
path or jars differ from the archive's (a standalone daemon's conf dir, another pyspark) runs
without it: ``-Xshare:auto`` plus no ``cds`` logging, so nothing is printed (the JVM otherwise
warns on stdout, where spark-class and the tests parse output). Tests only: a user's job keeps
the JVM's defaults. ``conftest.py`` decides who builds it and where.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

# -Xshare:auto: a missing, stale or mismatched archive means no sharing, never a failure.
USE_OPTIONS = "-Xshare:auto -Xlog:cds=off -Xlog:cds+dynamic=off"
BUILD_TIMEOUT_S = 600
UNUSED_DAYS = 7


def use_options(archive: Path) -> str:
    """The JVM options that map ``archive`` where it matches, silently."""
    return f"-XX:SharedArchiveFile={archive} {USE_OPTIONS}"


def _java() -> Path | None:
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return Path(found).resolve() if found and os.path.exists(found) else None


def archive_key(jvm_options: str) -> str | None:
    """What an archive is valid for: this java, pyspark's jars, the driver's class path head
    (``SPARK_CONF_DIR``) and the tests' JVM options. None without java or pyspark."""
    java = _java()
    try:
        import pyspark
    except ImportError:
        return None
    if java is None:
        return None
    home = Path(pyspark.__file__).parent
    parts = [str(java), _stamp(java.parent.parent / "lib" / "modules"), jvm_options]
    parts.append(os.environ.get("SPARK_CONF_DIR", str(home / "conf")))
    jars = home / "jars"
    parts += sorted(f"{p}:{_stamp(p)}" for p in jars.glob("*.jar")) if jars.is_dir() else []
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _stamp(path: Path) -> str:
    try:
        st = path.stat()
    except OSError:
        return "-"
    return f"{st.st_size}:{st.st_mtime_ns}"


def ensure_archive(cache_dir: Path, jvm_options: str) -> tuple[Path | None, str]:
    """The archive for this key in ``cache_dir``, built now if missing (one builder at a time:
    a concurrent test run waits for it). Returns (path or None, what happened)."""
    key = archive_key(jvm_options)
    if key is None:
        return None, "no java or pyspark"
    archive = cache_dir / f"{key}.jsa"
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        lock = open(cache_dir / "build.lock", "w")
    except OSError as e:  # a read-only interpreter prefix: no archive
        return None, f"no archive ({e})"
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _drop_unused(cache_dir)
        if archive.exists():
            os.utime(archive)  # in use: kept
            return archive, f"reused {archive}"
        return _build(archive, jvm_options)


def _drop_unused(cache_dir: Path) -> None:
    """Archives no test run used for a week (another java or pyspark's, ~150 MB each) go."""
    for path in cache_dir.glob("*.jsa*"):
        try:
            if time.time() - path.stat().st_mtime > UNUSED_DAYS * 86400:
                path.unlink()
        except OSError:
            pass


def _build(archive: Path, jvm_options: str) -> tuple[Path | None, str]:
    """Run a small driver (``python -m tests.jvm_cds``) whose JVM dumps its classes at exit;
    publish the archive by rename only once that JVM exited cleanly."""
    partial = archive.with_suffix(".jsa.partial")
    partial.unlink(missing_ok=True)  # a killed build's: the JVM does not overwrite it
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    env["SPARK_SUBMIT_OPTS"] = f"{jvm_options} -XX:ArchiveClassesAtExit={partial}"
    root = Path(__file__).resolve().parent.parent
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    start = time.monotonic()
    with open(archive.with_suffix(".log"), "w") as log:
        try:
            done = subprocess.run(
                [sys.executable, "-m", "tests.jvm_cds", str(partial)], cwd=root, env=env,
                stdout=log, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT_S,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return None, f"build timed out after {BUILD_TIMEOUT_S} s"
    if done.returncode != 0 or not partial.exists():
        partial.unlink(missing_ok=True)
        return None, f"build failed ({done.returncode}): see {archive.with_suffix('.log')}"
    os.replace(partial, archive)
    return archive, f"built {archive} in {time.monotonic() - start:.0f} s"


def _dump(partial: str) -> None:
    """The classes a test driver loads: a streaming pipeline with a bounded input through the
    checkpoint sink, then a DataFrame job; then the JVM exits (EOF on its stdin), dumping them."""
    import tempfile
    import traceback

    from pyspark import SparkContext
    from pyspark.sql.functions import col

    from tests.conftest import get_test_session
    from tests.streaming import streaming_pipelines

    spark = get_test_session()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            streaming_pipelines.main(
                [f"--output={tmp}/out", "--sources=a:20,b:10", "--per_round=10",
                 "--runner=SparkCheckpointRunner", "--spark_master_url=local[2]", "--streaming",
                 f"--checkpoint_dir={tmp}/ckpt", "--checkpoint_interval_s=0.05",
                 "--parallelism=2"]
            )  # fmt: skip
        except Exception:  # a broken pipeline is its tests' business: dump what got loaded
            traceback.print_exc()
    spark.range(100).groupBy((col("id") % 3).alias("k")).count().collect()
    spark.stop()
    proc = SparkContext._gateway.proc
    proc.stdin.close()  # PythonGatewayServer exits on EOF: a clean exit dumps the archive
    if proc.wait(timeout=BUILD_TIMEOUT_S) != 0 or not os.path.exists(partial):
        sys.exit(f"the driver JVM exited {proc.returncode} without writing {partial}")


if __name__ == "__main__":
    _dump(sys.argv[1])
