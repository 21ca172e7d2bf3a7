"""Startpoints: OffsetRange application, a real encoded process-stage element, the lifecycle.

No Spark: stages run in-process through the runner's bundle executor, the store is a real
filesystem store on a temp directory.
"""

from __future__ import annotations

import sys

import apache_beam as beam
import pytest
from apache_beam.coders.coder_impl import create_InputStream
from apache_beam.io.restriction_trackers import OffsetRange
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.runners.worker.bundle_processor import DATA_OUTPUT_URN
from apache_beam.transforms.core import RestrictionProvider

from sparkbeam.checkpoint import (
    Startpoint,
    StartpointKind,
    open_staged_writer,
    open_store,
    state_layout,
)
from sparkbeam.runner.rounds.edges import ENCODED_IMPULSE_VALUE
from sparkbeam.runner.task import grouping
from sparkbeam.runner.task.bundle_executor import StageTask, run_stage_partition
from sparkbeam.runner.task.records import OutputRecord
from sparkbeam.runner.task.residual_state import commit_stage
from sparkbeam.runner.task.staged_state import StateRound
from sparkbeam.runner.task.task_range import TaskRange
from sparkbeam.runner.task.worker_context import plan_context, register_plan
from sparkbeam.sdf import OffsetRangeProvider
from sparkbeam.sdf.checkpoint_handler import StateAndTimerBundleCheckpointHandler
from sparkbeam.sdf.residuals import ResidualRecord
from sparkbeam.sdf.startpoints import restrictions
from sparkbeam.sdf.startpoints.session import (
    CONSUMED_METADATA_KEY,
    StartpointApplier,
    StartpointAssignment,
    StartpointError,
    UnknownStartpointTransformError,
    UnsupportedStartpointError,
    check_pipelines,
    fan_out,
    sdf_sources,
)
from sparkbeam.translation import translate

PID = "pipeline-0"
A, B = "('a', 5)", "('b', 3)"  # str(element) of the two elements


def sp(kind, position=None, key=None, source="ReadOffsets"):
    return Startpoint(PID, source, StartpointKind(kind), position, key, 1000.0)


# --- the OffsetRange built-in -------------------------------------------------------------


class _Latest(OffsetRangeProvider):
    def __init__(self, latest):
        self.latest = latest

    def latest_offset(self, element):
        return self.latest


@pytest.mark.parametrize(
    "provider,restriction,startpoint,expected",
    [
        (OffsetRangeProvider(), OffsetRange(7, 10), sp("offset", "3"), OffsetRange(3, 10)),
        (OffsetRangeProvider(), OffsetRange(0, 10), sp("offset", "10"), OffsetRange(10, 10)),
        (OffsetRangeProvider(), OffsetRange(0, 10), sp("offset", "11"), None),  # no data there yet
        (OffsetRangeProvider(), OffsetRange(7, 10), sp("oldest"), OffsetRange(0, 10)),
        (OffsetRangeProvider(), OffsetRange(2, 10), sp("upcoming"), OffsetRange(10, 10)),
        (_Latest(42), OffsetRange(2, sys.maxsize), sp("upcoming"), OffsetRange(42, sys.maxsize)),
        (_Latest(None), OffsetRange(2, sys.maxsize), sp("upcoming"), None),
    ],
)
def test_offset_range_builtin(provider, restriction, startpoint, expected):
    got = restrictions.restriction_for_startpoint(
        provider, "ReadOffsets", ("x", 10), restriction, startpoint
    )
    assert got == expected


def test_offset_range_errors_name_the_transform_and_the_hook():
    unbounded = OffsetRange(0, sys.maxsize)
    with pytest.raises(UnsupportedStartpointError, match=r"'upcoming' for transform 'R'.*latest_"):
        restrictions.restriction_for_startpoint(
            OffsetRangeProvider(), "R", "e", unbounded, sp("upcoming")
        )
    with pytest.raises(UnsupportedStartpointError, match=r"'timestamp' for transform 'R'.*restric"):
        restrictions.check_supported(OffsetRangeProvider(), "R", sp("timestamp", "1700000000000"))
    with pytest.raises(UnsupportedStartpointError, match="restriction is a tuple, not an Offset"):
        restrictions.restriction_for_startpoint(
            OffsetRangeProvider(), "R", "e", (0, 1), sp("oldest")
        )
    with pytest.raises(StartpointError, match="position 'abc', which is not an integer offset"):
        restrictions.check_supported(OffsetRangeProvider(), "R", sp("offset", "abc"))


def test_provider_hooks_override_the_builtin():
    class ByTime(RestrictionProvider):
        def restriction_for_startpoint(self, element, restriction, startpoint):
            return OffsetRange(int(startpoint.position) // 1000, restriction.stop)

        def startpoint_key(self, element):
            return element[0]

    p = ByTime()
    restrictions.check_supported(p, "R", sp("timestamp", "5000"))  # the hook makes it supported
    got = restrictions.restriction_for_startpoint(
        p, "R", ("a", 9), OffsetRange(0, 9), sp("timestamp", "5000")
    )
    assert got == OffsetRange(5, 9)
    assert restrictions.element_key(p, ("a", 9)) == "a"
    assert restrictions.element_key(OffsetRangeProvider(), ("a", 9)) == "('a', 9)"


# --- a real translated pipeline -----------------------------------------------------------


class Positions(beam.DoFn):
    """Emits (name, position) for every position of its restriction."""

    def process(self, element, tracker=beam.DoFn.RestrictionParam(OffsetRangeProvider())):
        pos = tracker.current_restriction().start
        while tracker.try_claim(pos):
            yield element[0], pos
            pos += 1


class Real:
    """The plan of Create([("a", 5), ("b", 3)]) | ReadOffsets, run stage by stage in-process."""

    def __init__(self):
        p = beam.Pipeline(options=PipelineOptions([]))
        _ = (
            p
            | beam.Create([("a", 5), ("b", 3)])
            | "ReadOffsets" >> beam.ParDo(Positions())
            | beam.GroupByKey()
        )
        self.plan = translate(p.to_runner_api())
        self.key = f"startpoints-test-{id(self)}"
        register_plan(self.key, self.plan.components)
        self.sdf = next(s for s in self.plan.stages if s.is_sdf_process)
        create, split = [s for s in self.plan.stages if not s.is_sdf_process][:2]
        rows = self._feed(self._run(create, [(create.inputs[0][0], ENCODED_IMPULSE_VALUE)]), split)
        # The SDF process stage's real input: chunks of encoded sized element-restrictions.
        self.rows = self._feed(self._run(split, rows), self.sdf)

    def _run(self, stage, rows):
        task = StageTask(self.key, stage, residual_budget_s=0)
        return list(run_stage_partition(task, self.plan.components, {}, rows))

    def _feed(self, records, stage):
        rows = []
        for r in records:
            if isinstance(r, OutputRecord):
                edge = self.plan.edge(r.buffer)
                read = edge.read_coder or edge.write_coder
                for data in grouping.reencode([r.data], self.key, edge.write_coder, read):
                    rows.append((stage.inputs[0][0], data))
        return rows

    def elements(self):
        """Each encoded element of the SDF stage's input, one by one."""
        coder = plan_context(self.key).coders[self.sdf.input_coders[0][1]].get_impl()
        return [e for _, data in self.rows for _, e in grouping.split_elements(data, coder)]

    def outputs(self, rows):
        """The (name, position) pairs the SDF stage emits for ``rows``."""
        descriptor = beam_fn_api_pb2.ProcessBundleDescriptor.FromString(self.sdf.descriptor)
        (write,) = [t for t in descriptor.transforms.values() if t.spec.urn == DATA_OUTPUT_URN]
        port = beam_fn_api_pb2.RemoteGrpcPort.FromString(write.spec.payload)
        coder = plan_context(self.key).coders[port.coder_id].get_impl()  # not the "safe" bytes
        out = []
        for r in self._run(self.sdf, rows):
            if isinstance(r, OutputRecord):
                stream = create_InputStream(r.data)
                while stream.size() > 0:
                    out.append(coder.decode_from_stream(stream, True).value)
        return sorted(out)


@pytest.fixture(scope="module")
def real():
    return Real()


def test_sources_of_the_plan(real):
    assert list(sdf_sources(real.plan)) == ["ReadOffsets"]
    src = sdf_sources(real.plan, PID)["ReadOffsets"]
    assert (src.stage, src.input_transform) == (real.sdf.id, "ReadOffsets/Reshuffle/Read")


def test_apply_rewrites_real_encoded_process_stage_input(real):
    assert real.outputs(real.rows) == [("a", i) for i in range(5)] + [("b", i) for i in range(3)]
    default, own = sp("offset", "4"), sp("upcoming", key=B.encode())
    assignment = StartpointAssignment(real.sdf.id, "ReadOffsets", ((B, own),), default)
    applier = StartpointApplier(real.sdf, real.plan.components, assignment)
    rows = list(applier.apply_rows(real.rows))
    # a: offset 4 of [0, 5); b: its own startpoint, upcoming = the end of its bounded range.
    assert real.outputs(rows) == [("a", 4)]
    got = sorted((o.element_key, o.applied, o.token) for o in applier.outcomes)
    assert got == [(A, True, default.token), (B, True, own.token)]
    # A chunk of one element: the size is recomputed, the window and timestamp kept.
    encoded = real.elements()[0]
    before = len(applier.outcomes)
    new = applier.apply_chunk(encoded)
    (outcome,) = applier.outcomes[before:]
    coder = applier.coder
    before = coder.decode_from_stream(create_InputStream(encoded), True)
    after = coder.decode_from_stream(create_InputStream(new), True)
    (element, (restriction, _)), size = after.value
    assert restriction.stop - restriction.start == size and outcome.applied
    assert (after.windows, after.timestamp) == (before.windows, before.timestamp)
    assert applier.element_key_of(encoded) == str(element)


def test_no_startpoint_leaves_bytes_untouched(real):
    applier = StartpointApplier(
        real.sdf, real.plan.components, StartpointAssignment(real.sdf.id, "ReadOffsets")
    )
    assert list(applier.apply_rows(real.rows)) == real.rows and applier.outcomes == []


# --- the lifecycle: fan-out, keep for unseen, delete on commit, never re-apply --------------


def run_round(real, session, rows=None):
    """One round of the SDF stage as the run loop does it: assign, apply, outputs, outcomes."""
    assignment = session.assignment(real.sdf.id)
    rows = real.rows if rows is None else rows
    if assignment is None:
        return real.outputs(rows), []
    applier = StartpointApplier(real.sdf, real.plan.components, assignment)
    rows = list(applier.apply_rows(rows))
    return real.outputs(rows), applier.outcomes


def test_transform_level_fans_out_keeps_unseen_and_never_reapplies(real, tmp_path):
    with open_store(str(tmp_path)) as store:
        sps = store.startpoints
        sps.set(PID, "ReadOffsets", "offset", "4")  # b has only [0, 3): no data at 4 yet
        session = fan_out(sps, real.plan, PID)
        outputs, outcomes = run_round(real, session)
        assert outputs == [("a", 4)] + [("b", i) for i in range(3)]
        metadata = session.prepare_commit(outcomes)
        # Step 3a: b's copy is durable before the checkpoint; the transform-level one still there.
        assert {s.element_key for s in sps.list(PID)} == {None, B.encode()}
        assert len(metadata[CONSUMED_METADATA_KEY]) == 1  # the transform-level token
        state = store.pipeline(PID)
        state.checkpoint(metadata=metadata)
        removed = session.committed()
        assert [(s.element_key, s.kind) for s in removed] == [(None, StartpointKind.OFFSET)]
        kept = sps.list(PID)
        assert [(s.element_key, s.position, s.created) for s in kept] == [
            (B.encode(), "4", removed[0].created)
        ]
        # Later rounds and later elements: the fan-out is closed, only b's copy remains.
        assignment = session.assignment(real.sdf.id)
        assert assignment.default is None and [k for k, _ in assignment.by_key] == [B]
        # Restart: a does not get offset 4 again; b still waits for data at 4.
        again = fan_out(sps, real.plan, PID, restored_metadata=metadata)
        outputs, outcomes = run_round(real, again)
        assert outputs == [("a", i) for i in range(5)] + [("b", i) for i in range(3)]
        assert [(o.element_key, o.applied) for o in outcomes] == [(B, False)]
        assert again.prepare_commit(outcomes) == {}
        assert again.committed() == [] and sps.list(PID) == kept


def test_per_element_startpoint_deleted_only_where_applied(real, tmp_path):
    with open_store(str(tmp_path)) as store:
        sps = store.startpoints
        sps.set(PID, "ReadOffsets", "oldest", element_key=A.encode())
        sps.set(PID, "ReadOffsets", "offset", "9", element_key=B.encode())
        sps.set(PID, "ReadOffsets", "offset", "0", element_key=b"('z', 1)")  # never seen
        session = fan_out(sps, real.plan, PID)
        _, outcomes = run_round(real, session)
        session.prepare_commit(outcomes)
        session.committed()
        assert sorted(s.element_key for s in sps.list(PID)) == [B.encode(), b"('z', 1)"]


def test_crash_between_commit_and_delete_is_repaired_at_restart(real, tmp_path):
    with open_store(str(tmp_path)) as store:
        sps = store.startpoints
        sps.set(PID, "ReadOffsets", "offset", "4")
        session = fan_out(sps, real.plan, PID)
        _, outcomes = run_round(real, session)
        metadata = session.prepare_commit(outcomes)
        store.pipeline(PID).checkpoint(metadata=metadata)
        # ... the driver dies here, before committed(): the transform-level entry is still stored.
        assert sps.get(PID, "ReadOffsets") is not None
        restarted = fan_out(sps, real.plan, PID, restored_metadata=metadata)
        assert sps.get(PID, "ReadOffsets") is None and restarted.defaults == {}
        outputs, _ = run_round(real, restarted)
        assert ("a", 0) in outputs  # a is not rewound to 4 a second time


def test_committed_never_deletes_a_newer_startpoint_for_the_same_key(real, tmp_path):
    with open_store(str(tmp_path)) as store:
        sps = store.startpoints
        sps.set(PID, "ReadOffsets", "offset", "1", element_key=A.encode())
        session = fan_out(sps, real.plan, PID)
        _, outcomes = run_round(real, session)
        session.prepare_commit(outcomes)
        sps.set(PID, "ReadOffsets", "offset", "2", element_key=A.encode())  # operator, meanwhile
        assert session.committed() == []
        assert sps.get(PID, "ReadOffsets", A.encode()).position == "2"


def test_empty_round_does_not_close_the_fan_out(real, tmp_path):
    with open_store(str(tmp_path)) as store:
        store.startpoints.set(PID, "ReadOffsets", "oldest")
        session = fan_out(store.startpoints, real.plan, PID)
        _, outcomes = run_round(real, session, rows=[])
        assert session.prepare_commit(outcomes) == {}
        session.committed()
        assert session.assignment(real.sdf.id).default is not None


def test_restore_fans_out_to_pending_residuals_and_deletes_the_transform_level_entry(
    real, tmp_path
):
    with open_store(str(tmp_path)) as store:
        state = store.pipeline(PID)
        read = real.sdf.inputs[0][0]
        # The stage's task keeps its residuals: staged in its key groups, then committed.
        writer = open_staged_writer(store.storage, PID, commit_stage(real.sdf.id), 0, 0, 0)
        spec = StateRound(
            pipeline=PID, url=str(tmp_path), checkpoint_id=None, round_no=0, parallelism=1,
            max_key_groups=writer.max_key_groups,
        )  # fmt: skip
        residuals = TaskRange(spec, 0, state_layout.sdf_residual(real.sdf.id), {})
        handler = StateAndTimerBundleCheckpointHandler(residuals, real.sdf.id)
        handler.add(ResidualRecord(real.sdf.id, read, e, 0.0, 0.0, 0) for e in real.elements())
        writer.write_all(handler.namespace, handler.state.changes)
        state.checkpoint(commit_messages=[writer.finish()])
        sps = store.startpoints
        sps.set(PID, "ReadOffsets", "offset", "1")
        sps.set(PID, "ReadOffsets", "offset", "2", element_key=B.encode())  # explicit one wins
        session = fan_out(sps, real.plan, PID, restored_metadata={}, restored_state=state)
        got = sorted((s.element_key, s.position) for s in sps.list(PID))
        assert got == [(A.encode(), "1"), (B.encode(), "2")]
        assert session.assignment(real.sdf.id).default is None  # new elements get nothing
        rows = [(read, d.element) for d in handler.pop_due(1e18)]
        outputs, outcomes = run_round(real, session, rows)
        assert outputs == [("a", i) for i in range(1, 5)] + [("b", 2)]
        session.prepare_commit(outcomes)
        session.committed()
        assert sps.list(PID) == []


def test_clear_errors_at_start(real, tmp_path):
    with open_store(str(tmp_path)) as store:
        sps = store.startpoints
        sps.set(PID, "ReadOfsets", "oldest")
        with pytest.raises(
            UnknownStartpointTransformError,
            match=r"names transform 'ReadOfsets' in pipeline 'pipeline-0'.*'ReadOffsets'",
        ):
            fan_out(sps, real.plan, PID)
        sps.delete(PID, "ReadOfsets")
        sps.set(PID, "ReadOffsets", "timestamp", "1700000000000")
        with pytest.raises(UnsupportedStartpointError, match="'timestamp' for transform 'Read"):
            fan_out(sps, real.plan, PID)
        sps.delete(PID, "ReadOffsets")
        sps.set("pipeline-9", "ReadOffsets", "oldest")
        with pytest.raises(StartpointError, match="names pipeline 'pipeline-9'.*'pipeline-0'"):
            check_pipelines(sps, real.plan)


def test_old_startpoints_are_reported(real, tmp_path, caplog):
    with open_store(str(tmp_path)) as store:
        created = store.startpoints.set(PID, "ReadOffsets", "offset", "7", A.encode()).created
        session = fan_out(store.startpoints, real.plan, PID, max_age_s=3600, now=created + 7200)
        assert len(session.warnings) == 1
        assert "'offset' for transform 'ReadOffsets' key \"('a', 5)\"" in session.warnings[0]
        assert "set 2.0 h ago" in caplog.text
        assert fan_out(store.startpoints, real.plan, PID, max_age_s=3600).warnings == []
