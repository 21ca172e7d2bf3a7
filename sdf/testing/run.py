"""Run a splittable DoFn under test as a real pipeline on SparkCheckpointRunner.

Owns: the *probe*, a subclass of the user's DoFn whose tracker view records claims and
deferrals, and can force a real ``defer_remainder`` after one claim per process call (each
residual a real ``DelayedBundleApplication`` through the runner) or sleep after each claim
(so the runner's split requests land mid-element); the scenario pipeline; running it here, or
in a child process (``python -m sparkbeam.sdf.testing.run SPEC OUT [flags]``) that the parent
SIGKILLs once a committed checkpoint holds pending residuals, then reruns. The child gets the
DoFn from a cloudpickle ``spec`` file: a ``"module:attr"`` string, imported there, or the
pickled DoFn, whose class must be importable (the child gets the parent's ``sys.path``).
Leaves to others: what counts as a pass (``sparkbeam.sdf.testing.check``).
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
from apache_beam.runners.sdf_utils import RestrictionTrackerView
from apache_beam.utils.timestamp import Duration

from sparkbeam.checkpoint.filesystem import LocalStorage
from sparkbeam.runner.processes import kill_process_group
from sparkbeam.sdf.testing.static import is_offset_like, restriction_provider

OUT_FILE = "events.jsonl"


@dataclass(frozen=True)
class Event:
    """One line of scenario output: an output of the DoFn, or a residual it produced."""

    kind: str  # "out" or "residual"
    value: str  # repr of the output (empty for a residual)
    element: str  # repr of the input element
    restriction: str  # repr of the restriction of the process call
    position: str  # repr of the last position claimed before the output


def load_dofn(ref: Any):
    """A DoFn from an object or a ``"module:attr"`` string (attr: DoFn, class or factory)."""
    if not isinstance(ref, str):
        return ref
    module, sep, attr = ref.partition(":")
    if not sep:
        raise ValueError(f"DoFn reference {ref!r} is not 'module:attr', e.g. 'my.mod:ReadFn'.")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, beam.DoFn) and callable(obj):
        obj = obj()
    if not isinstance(obj, beam.DoFn):
        raise TypeError(f"{ref!r} is {type(obj).__name__}, not a DoFn (or a factory of one).")
    return obj


class SplitCheckError(AssertionError):
    """A checkpoint's primary and residual do not tile the restriction (raised in a task)."""


class _ProbeView(RestrictionTrackerView):
    """The tracker the user's process() sees: a view of the runner's tracker, plus records."""

    def __init__(self, view, force_checkpoint: bool, delay_s: float, pace_s: float = 0.0) -> None:
        super().__init__(view._threadsafe_restriction_tracker)
        self._pace = pace_s
        self._force = force_checkpoint
        self._delay = Duration(seconds=delay_s) if delay_s else None
        self.restriction = self.current_restriction()
        self.claims = 0
        self.last: Any = None
        self.deferred = False

    def try_claim(self, position) -> bool:
        if self._force and self.claims >= 1 and not self.deferred:
            self.defer_remainder(self._delay)  # a real self-checkpoint: try_split(0)
            self._check_residual()
            return False
        ok = super().try_claim(position)
        if ok:
            self.claims += 1
            self.last = position
            if self._pace:
                time.sleep(self._pace)  # holds no lock: a split may come in meanwhile
        return ok

    def _check_residual(self) -> None:
        """Fail fast (instead of looping forever) when an offset residual overlaps or skips."""
        residual = getattr(self._threadsafe_restriction_tracker, "_deferred_residual", None)
        primary = self.current_restriction()
        if residual is None or not (is_offset_like(residual) and is_offset_like(primary)):
            return
        if residual.start != primary.stop:
            kind = "duplicated" if residual.start < primary.stop else "lost"
            raise SplitCheckError(
                f"self-checkpoint after claiming {self.last!r} of {self.restriction!r}: "
                f"primary {primary!r}, residual {residual!r} ({kind} position on split)"
            )

    def defer_remainder(self, deferred_time=None) -> None:
        self.deferred = True
        super().defer_remainder(deferred_time)


def _plain(out: Any) -> Any:
    from apache_beam.pvalue import TaggedOutput
    from apache_beam.transforms.window import TimestampedValue
    from apache_beam.utils.windowed_value import WindowedValue

    if isinstance(out, TaggedOutput):
        return (out.tag, _plain(out.value))
    if isinstance(out, (TimestampedValue, WindowedValue)):
        return out.value
    return out


def restriction_arg_name(dofn) -> str:
    """The name of process()'s ``DoFn.RestrictionParam`` argument."""
    args, defaults = beam.DoFn.get_function_arguments(dofn, "process")
    for name, default in zip(args[len(args) - len(defaults) :], defaults):
        if isinstance(default, beam.DoFn.RestrictionParam):
            return name
    raise TypeError(
        f"{type(dofn).__name__}.process() has no DoFn.RestrictionParam argument: "
        "it is not a splittable DoFn."
    )


def make_probe(dofn, force_checkpoint: bool = False, delay_s: float = 0.0, pace_s: float = 0.0):
    """A copy of ``dofn`` whose process() yields ``Event`` tuples (see module docstring)."""
    tracker_arg = restriction_arg_name(dofn)
    base = type(dofn)
    original = base.process

    @functools.wraps(original)
    def process(self, *args, **kwargs):
        view = _ProbeView(kwargs[tracker_arg], force_checkpoint, delay_s, pace_s)
        kwargs[tracker_arg] = view
        element = repr(args[0]) if args else ""
        restriction = repr(view.restriction)
        for out in original(self, *args, **kwargs) or ():
            yield ("out", repr(_plain(out)), element, restriction, repr(view.last))
        if view.deferred and repr(view.current_restriction()) != restriction:
            yield ("residual", "", element, restriction, repr(view.last))

    probe_cls = type(f"{base.__name__}Probe", (base,), {"process": process})
    probe: Any = object.__new__(probe_cls)
    probe.__dict__.update(dofn.__dict__)
    return probe


class _WriteEvents(beam.DoFn):
    """Write all events (one group) to ``out_dir/events.jsonl``, atomically."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = out_dir

    def process(self, kv):
        lines = "".join(json.dumps(e) + "\n" for e in kv[1])
        LocalStorage(self.out_dir).write(OUT_FILE, lines.encode("utf-8"))


def run_direct(dofn, elements) -> list[Event] | None:
    """The outputs of calling process() here, without runner or coders (None unless process()
    takes just the element and the tracker): each part of the initial split, to its end."""
    from apache_beam.runners.sdf_utils import ThreadsafeRestrictionTracker

    args, defaults = beam.DoFn.get_function_arguments(dofn, "process")
    if len(args) != 2 or len(defaults) != 1:
        return None
    provider = restriction_provider(dofn)
    events = []
    dofn.setup()
    for element in elements:
        for r in provider.split(element, provider.initial_restriction(element)):
            view = RestrictionTrackerView(ThreadsafeRestrictionTracker(provider.create_tracker(r)))
            for out in dofn.process(element, **{args[1]: view}) or ():
                events.append(Event("out", repr(_plain(out)), repr(element), repr(r), ""))
    dofn.teardown()
    return events


def build(
    p,
    dofn,
    elements,
    out_dir: str,
    force_checkpoint: bool,
    delay_s: float,
    pace_s: float = 0.0,
    test_stream: bool = False,
) -> None:
    """The scenario pipeline: Create (or, ``test_stream``, a TestStream) | ParDo(probe) | one
    group | a JSON-lines file. The group keeps the writer out of the SDF's fused stage, so it
    runs once, at the end, on committed outputs only (a killed run writes nothing)."""
    from apache_beam.testing.test_stream import TestStream
    from apache_beam.transforms import trigger, window

    if test_stream:
        events = TestStream().add_elements(list(elements)).advance_watermark_to_infinity()
        outputs = p | "Events" >> events
    else:
        outputs = p | "Elements" >> beam.Create(list(elements), reshuffle=False)
    outputs |= "Probe" >> beam.ParDo(make_probe(dofn, force_checkpoint, delay_s, pace_s))
    if test_stream:  # unbounded: the one group fires when the watermark reaches +inf
        outputs |= "AtTheEnd" >> beam.WindowInto(
            window.GlobalWindows(),
            trigger=trigger.AfterWatermark(),
            accumulation_mode=trigger.AccumulationMode.DISCARDING,
        )
    _ = (
        outputs
        | "OneKey" >> beam.Map(lambda e: (0, list(e)))
        | "Gather" >> beam.GroupByKey()
        | "Write" >> beam.ParDo(_WriteEvents(out_dir))
    )


def read_events(out_dir: str) -> list[Event]:
    path = os.path.join(out_dir, OUT_FILE)
    if not os.path.exists(path):
        return []  # no output at all: the group was empty
    with open(path, encoding="utf-8") as f:
        return [Event(*json.loads(line)) for line in f if line.strip()]


def pipeline_flags(master: str, parallelism: int, *extra: str) -> list[str]:
    """The scenario's flags; a ``sc://`` master is a (warm) Spark Connect server."""
    where = "--spark_remote" if master.startswith("sc://") else "--spark_master_url"
    return [
        "--runner=SparkCheckpointRunner",
        f"{where}={master}",
        f"--parallelism={parallelism}",
        *extra,
    ]


def run_in_process(
    dofn, elements, out_dir, flags, force_checkpoint=False, delay_s=0.0, pace_s=0.0,
    test_stream=False,
) -> tuple[list[Event], int]:  # fmt: skip
    """Run one scenario pipeline here (reusing an active SparkSession): its events, and the
    run's ``sparkbeam:runner_splits`` counter."""
    from apache_beam.metrics.metric import MetricsFilter
    from apache_beam.options.pipeline_options import PipelineOptions

    p = beam.Pipeline(options=PipelineOptions(flags))
    build(p, dofn, elements, out_dir, force_checkpoint, delay_s, pace_s, test_stream)
    result = p.run()
    result.wait_until_finish()
    counters = result.metrics().query(MetricsFilter().with_namespace("sparkbeam"))["counters"]
    splits = sum(c.committed for c in counters if c.key.metric.name == "runner_splits")
    return read_events(out_dir), splits


# -- kill and resume -------------------------------------------------------------------


def write_spec(path: str, dofn_ref: Any, elements, force_checkpoint: bool, delay_s: float):
    import cloudpickle

    spec = {
        "dofn": dofn_ref,
        "elements": list(elements),
        "force": force_checkpoint,
        "delay_s": delay_s,
    }
    with open(path, "wb") as f:
        f.write(cloudpickle.dumps(spec))


def _child(spec: str, ckpt: str, out_dir: str, flags: list[str]) -> dict[str, Any]:
    """The child's command line (``main``, on the store ``ckpt``) and environment."""
    command = [sys.executable, "-m", "sparkbeam.sdf.testing.run", spec, out_dir, *flags]
    path = os.pathsep.join(p for p in sys.path if p)
    return {
        "args": [*command, f"--checkpoint_dir={ckpt}"],
        "env": {**os.environ, "PYTHONPATH": path, "PYSPARK_PYTHON": sys.executable},
    }


def committed_rounds(ckpt: str) -> list[dict]:
    """Metadata of every readable committed checkpoint in the store (empty while it is new)."""
    from sparkbeam.checkpoint import open_store

    if not os.path.exists(ckpt):
        return []
    try:
        store = open_store(ckpt, read_only=True)
        rows = []
        for pid in store.list_pipelines():
            for info in store.list_checkpoints(pid):
                if info.error is None:
                    rows.append(store.load_manifest(pid, info.checkpoint_id).metadata)
        return rows
    except Exception:  # noqa: BLE001 - the store may be mid-creation; poll again
        return []


class KillError(RuntimeError):
    """The child finished or failed before a checkpoint with pending residuals existed."""


def run_until_killed(spec, ckpt, out_dir, flags, kill_round: int, timeout_s: float) -> int:
    """Start the child; SIGKILL it at the first committed round >= kill_round with residuals
    pending (or the last such round, if the job ends sooner). Returns the round killed at."""
    proc = subprocess.Popen(
        **_child(spec, ckpt, out_dir, flags),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # the kill takes the driver's JVM and Python workers with it
    )
    deadline = time.time() + timeout_s
    try:
        while time.time() < deadline and proc.poll() is None:
            pending = [
                m.get("round", 0)
                for m in committed_rounds(ckpt)
                if m.get("pending_residuals", 0) > 0
            ]
            if pending and max(pending) >= kill_round:
                kill_process_group(proc)
                return max(pending)
            time.sleep(0.05)
    finally:
        kill_process_group(proc)
    err = proc.stderr.read().decode(errors="replace")[-3000:] if proc.stderr else ""
    raise KillError(
        f"the run ended (exit {proc.returncode}) before a checkpoint with pending residuals at "
        f"round >= {kill_round}; last lines of its stderr:\n{err}"
    )


def rerun(spec, ckpt, out_dir, flags, timeout_s: float) -> list[Event]:
    """Rerun the child on an existing store (same command, maybe other flags) to the end."""
    proc = subprocess.run(
        **_child(spec, ckpt, out_dir, flags),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"the resumed run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
        )
    return read_events(out_dir)


def reset_dir(src: str, dst: str) -> None:
    """Make ``dst`` an exact copy of ``src`` (a store as it was at the kill)."""
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)


def main(argv: list[str]) -> None:
    """Child entry point: ``SPEC OUT_DIR [pipeline flags]``."""
    import cloudpickle
    from apache_beam.options.pipeline_options import PipelineOptions

    spec_path, out_dir, flags = argv[0], argv[1], argv[2:]
    with open(spec_path, "rb") as f:
        spec = cloudpickle.loads(f.read())
    dofn = load_dofn(spec["dofn"])
    with beam.Pipeline(options=PipelineOptions(flags)) as p:
        build(p, dofn, spec["elements"], out_dir, spec["force"], spec["delay_s"])


if __name__ == "__main__":
    main(sys.argv[1:])
