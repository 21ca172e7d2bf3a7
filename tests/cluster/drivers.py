"""Pipeline drivers for the cluster tests: each its own process, never the test's Spark session.

Owns: the environment and the process handling of a driver (``python app.py ...`` or the
pyspark package's ``bin/spark-submit``): run from a directory of the test's choosing with no
``PYTHONPATH`` (so only what sparkbeam ships reaches the executors), marked as a test server
process (`tests.servers.server_env`), in its own process group, killed with its group on
timeout. Output goes to files, so a test can watch a running driver. Leaves to others: the
cluster (`tests.cluster.standalone`).
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.cluster.standalone import spark_home
from tests.servers import server_env, stop_process_group

DRIVER_TIMEOUT_S = 420.0
# Flags every driver on the test cluster takes: no UI ports to collide on, small shuffles. (The
# tests' JVM options reach the driver through the environment, its executors through their
# worker's: `tests.cluster.standalone`.)
QUIET_CONF = [
    "--spark_conf=spark.ui.enabled=false",
    "--spark_conf=spark.default.parallelism=2",
]


def driver_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = server_env("driver")
    env.pop("PYTHONPATH", None)
    env.pop("SPARKBEAM_CRASH_AT", None)
    env.update(
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_HOME=str(spark_home()),
        SPARK_LOCAL_IP="127.0.0.1",
    )
    env.update(extra or {})
    return env


@dataclass
class Driver:
    """A running (or finished) driver process and its output files."""

    proc: subprocess.Popen
    log_dir: Path
    name: str

    @property
    def stdout(self) -> str:
        return (self.log_dir / f"{self.name}.out").read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return (self.log_dir / f"{self.name}.err").read_text(errors="replace")

    def tail(self, n: int = 4000) -> str:
        """The end of stderr then stdout, for assertion messages."""
        return f"--- stderr:\n{self.stderr[-n:]}\n--- stdout:\n{self.stdout[-n // 4 :]}"

    def wait(self, timeout: float = DRIVER_TIMEOUT_S) -> int:
        """The exit code; on timeout the driver's process group is killed and this raises."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            stop_process_group(self.proc)
            raise AssertionError(
                f"driver {self.name} ran over {timeout:.0f} s\n{self.tail()}"
            ) from None

    def stop(self) -> None:
        stop_process_group(self.proc)


def start_driver(
    cmd: list[str], cwd: Path, log_dir: Path, name: str, env: dict[str, str] | None = None
) -> Driver:
    """Start ``cmd`` as a driver in its own process group; returns at once."""
    log_dir.mkdir(parents=True, exist_ok=True)
    with (
        open(log_dir / f"{name}.out", "wb") as out,
        open(log_dir / f"{name}.err", "wb") as err,
    ):
        proc = subprocess.Popen(
            cmd, cwd=cwd, env=driver_env(env), stdout=out, stderr=err, start_new_session=True
        )
    return Driver(proc, log_dir, name)


def run_driver(
    cmd: list[str], cwd: Path, log_dir: Path, name: str, env: dict[str, str] | None = None
) -> Driver:
    """Run ``cmd`` as a driver to its end (bounded by `DRIVER_TIMEOUT_S`)."""
    driver = start_driver(cmd, cwd, log_dir, name, env)
    driver.wait()
    return driver


def python_driver(script: str | Path, *args: str) -> list[str]:
    """``python script args...`` with this interpreter."""
    return [sys.executable, str(script), *args]


def spark_submit(master: str, app_name: str, script: str | Path, *args: str) -> list[str]:
    """The pyspark package's ``spark-submit`` of a Python app to ``master``."""
    submit = spark_home() / "bin" / "spark-submit"
    return [
        str(submit), "--master", master, "--name", app_name,
        "--conf", "spark.ui.enabled=false", str(script), *args,
    ]  # fmt: skip


def wait_for(predicate, timeout: float, what: str, driver: Driver | None = None):
    """Poll ``predicate`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if driver is not None and driver.proc.poll() is not None:
            raise AssertionError(
                f"driver {driver.name} exited ({driver.proc.returncode}) before {what}\n"
                + driver.tail()
            )
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout:.0f} s")
        time.sleep(0.2)
