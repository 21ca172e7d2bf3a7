"""Names in the Spark UI: jobs, stages and RDDs carry the Beam stage and its transforms.

Spark names a stage after the call site of its last RDD (a sparkbeam source line);
``call_site`` names the Beam stage instead, and ``describe_job`` puts the same text in the job
group and description (the UI, the REST API, ``sc.statusTracker()``).
"""

from __future__ import annotations

import contextlib
import re
import threading

MAX_LABEL = 400
_ARGS = re.compile(r"\([^()]*\)")
_LOCK = threading.Lock()


def stage_label(stage) -> str:
    """``stage-3: Count/CombinePerKey + Format + Write`` (shortened if very long)."""
    full = stage.transforms or tuple(stage.name.strip("()").split(")+("))
    names = " + ".join(dict.fromkeys(_short_name(t) for t in full))
    return _short(f"{stage.id}: {names}")


def _short_name(transform: str) -> str:
    """The first two levels of a transform name, without arguments: ``Count/CombinePerKey``."""
    bare = _ARGS.sub("", transform)
    while bare != transform:
        transform, bare = bare, _ARGS.sub("", bare)
    return "/".join(bare.split("/")[:2])


def shuffle_label(plan, buffer) -> str:
    """The shuffle (map side) of a GroupByKey or Reshuffle, named by the stages writing it."""
    writers = [stage_label(s) for s in plan.stages if buffer in s.output_buffers]
    kind = plan.edge(buffer).kind.name.lower()
    return _short(f"{kind} after {'; '.join(writers) or buffer}")


def job_group(plan, pipeline: str | None = None) -> str:
    """The Spark job group of a run (of one pipeline, when streaming)."""
    base = f"sparkbeam-{plan.fingerprint[:12]}"
    return f"{base}-{pipeline}" if pipeline else base


def describe_job(sc, group: str, description: str) -> None:
    """Set this thread's job group and description for the next Spark jobs."""
    sc.setJobGroup(group, _short(description))


@contextlib.contextmanager
def call_site(sc, label: str):
    """RDDs created and jobs run inside are named ``label`` in the Spark UI."""
    from pyspark.traceback_utils import SCCallSiteSync

    previous = sc.getLocalProperty("callSite.short")
    sc.setLocalProperty("callSite.short", _short(label))
    sc.setLocalProperty("callSite.long", label)
    with _LOCK:  # PySpark's own call-site capture stands down while the depth is > 0
        SCCallSiteSync._spark_stack_depth += 1
    try:
        yield
    finally:
        with _LOCK:
            SCCallSiteSync._spark_stack_depth -= 1
        sc.setLocalProperty("callSite.short", previous)
        sc.setLocalProperty("callSite.long", previous)


def name_rdd(rdd, label: str):
    """``rdd.setName(label)``: shown in the Storage tab and the DAG of every job using it."""
    return rdd.setName(_short(label))


def _short(text: str) -> str:
    return text if len(text) <= MAX_LABEL else text[: MAX_LABEL - 3] + "..."
