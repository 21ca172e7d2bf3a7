"""check_sdf passes well-behaved SDFs and names the fault of broken ones."""

from __future__ import annotations

import pytest

from examples.line_reader_sdf import LineReaderFn
from sparkbeam.sdf.testing import SdfCheckError, check_sdf
from sparkbeam.sdf.testing import cli as sdf_check_cli
from sparkbeam.sdf.testing.run import load_dofn
from tests.conftest import TEST_MASTER, get_test_session
from tests.sdf_testing import sdfs

STATIC = ["static"]
IN_PROCESS = ["static", "baseline", "checkpoint-every-claim"]


@pytest.fixture
def files(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("".join(f"a{i}\n" for i in range(5)))
    b.write_text("b0\nb1\nb2\n")
    return [str(a), str(b)]


@pytest.mark.parametrize(
    "dofn, elements",
    [
        (sdfs.ExpandingStringsDoFn(), ["abc", "defgh"]),
        (sdfs.GoodOffsetFn(), sdfs.ELEMENTS),
        (LineReaderFn(lines_per_split=2), None),
    ],
)
def test_static_checks_pass_well_behaved_sdfs(dofn, elements, files):
    report = check_sdf(dofn, elements or files, scenarios=STATIC)
    assert report.passed and report.scenarios[0].splits > 0


@pytest.mark.parametrize(
    "dofn, fault",
    [
        (sdfs.LosesPositionOnSplitFn(), r"try_split\(0\.0\).*lost position on split"),
        (sdfs.DuplicatesPositionOnSplitFn(), r"try_split\(0\.0\).*duplicated position on split"),
        (sdfs.BadCoderFn(), r"does not round-trip its restriction coder StartOnlyCoder"),
    ],
)
def test_static_checks_name_the_fault(dofn, fault):
    with pytest.raises(SdfCheckError, match=fault):
        check_sdf(dofn, sdfs.ELEMENTS, scenarios=STATIC)


def test_load_dofn_by_reference_and_bad_reference():
    assert isinstance(load_dofn("tests.sdf_testing.sdfs:GoodOffsetFn"), sdfs.GoodOffsetFn)
    with pytest.raises(ValueError, match="not 'module:attr'"):
        load_dofn("tests.sdf_testing.sdfs.GoodOffsetFn")


def test_fixture_from_the_plugin(sdf_checker):
    report = sdf_checker(sdfs.GoodOffsetFn(), sdfs.ELEMENTS, scenarios=STATIC)
    assert [s.status for s in report.scenarios] == ["PASS"]


def test_cli_exit_codes(capsys):
    ok = [
        "sdf-check",
        "tests.sdf_testing.sdfs:GoodOffsetFn",
        "--elements",
        '[["a", 3]]',
        "--scenario",
        "static",
    ]
    assert sdf_check_cli.main(ok) == 0
    out = capsys.readouterr().out
    assert "static" in out and "PASS" in out and "SKIP" not in out
    bad = [
        "sdf-check",
        "tests.sdf_testing.sdfs:LosesPositionOnSplitFn",
        "--elements",
        '[["a", 3]]',
        "--scenario",
        "static",
    ]
    assert sdf_check_cli.main(bad) == 1
    assert "lost position on split" in capsys.readouterr().out


@pytest.mark.spark
@pytest.mark.slow
def test_in_process_scenarios_pass_beam_test_sdf():
    get_test_session()
    report = check_sdf(
        sdfs.ExpandingStringsDoFn(),
        ["abc", "defgh"],
        scenarios=IN_PROCESS,
        spark_master=TEST_MASTER,
    )
    every = report.scenarios[2]
    assert every.passed and every.outputs == 8 and every.residuals == 2


@pytest.mark.spark
@pytest.mark.slow
def test_checkpoint_every_claim_catches_lost_position_on_the_runner():
    get_test_session()
    with pytest.raises(SdfCheckError, match=r"checkpoint-every-claim: .*lost position on split"):
        check_sdf(
            sdfs.LosesPositionOnSplitFn(),
            sdfs.ELEMENTS,
            scenarios=["baseline", "checkpoint-every-claim"],
            spark_master=TEST_MASTER,
        )


@pytest.mark.spark
@pytest.mark.slow
def test_baseline_catches_bad_coder_against_a_direct_call():
    get_test_session()
    with pytest.raises(SdfCheckError, match=r"differs from calling process\(\) directly: .*lost"):
        check_sdf(
            sdfs.BadCoderFn(), sdfs.ELEMENTS, scenarios=["baseline"], spark_master=TEST_MASTER
        )


@pytest.mark.spark
@pytest.mark.slow
def test_every_scenario_passes_the_line_reader_example(files):
    get_test_session()
    report = check_sdf("examples.line_reader_sdf:LineReaderFn", files, spark_master=TEST_MASTER)
    rows = {s.name: s for s in report.scenarios}
    assert all(
        rows[n].outputs == 8 for n in ("baseline", "kill-and-resume", "resume-other-parallelism")
    )
    assert rows["kill-and-resume"].residuals > 0
    splits = rows["runner-initiated-splits"]
    assert splits.status == "PASS" and splits.outputs == 8 and splits.splits > 0


SPLITS = ["baseline", "runner-initiated-splits"]


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize(
    "dofn, elements, outputs",
    [(sdfs.ExpandingStringsDoFn(), ["abc", "defgh"], 8), (sdfs.GoodOffsetFn(), sdfs.ELEMENTS, 7)],
)
def test_runner_initiated_splits_happen_and_keep_the_outputs(dofn, elements, outputs):
    get_test_session()
    report = check_sdf(dofn, elements, scenarios=SPLITS, spark_master=TEST_MASTER)
    splits = report.scenarios[1]
    assert splits.passed and splits.outputs == outputs and splits.splits > 0
    assert "runner-initiated-splits" in report.table()


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize(
    "dofn, fault",
    [
        (sdfs.LosesPositionOnSplitFn(), r"lost position on runner-initiated split: .*missing"),
        (
            sdfs.DuplicatesPositionOnSplitFn(),
            r"duplicated position on runner-initiated split: .*duplicated",
        ),
    ],
)
def test_runner_initiated_splits_name_lost_and_duplicated_positions(dofn, fault):
    get_test_session()
    with pytest.raises(SdfCheckError, match=r"- runner-initiated-splits: " + fault):
        check_sdf(dofn, sdfs.ELEMENTS, scenarios=SPLITS, spark_master=TEST_MASTER)


@pytest.mark.spark
@pytest.mark.slow
def test_runner_initiated_splits_fail_when_no_split_took_effect():
    get_test_session()
    with pytest.raises(SdfCheckError, match=r"no runner-initiated split took effect"):
        check_sdf(sdfs.NeverSplitsFn(), [("a", 6)], scenarios=SPLITS, spark_master=TEST_MASTER)


@pytest.mark.spark
@pytest.mark.slow
def test_virtual_clock_resumes_hour_long_deferrals_on_the_test_streams_clock():
    get_test_session()
    report = check_sdf(
        sdfs.ExpandingStringsDoFn(),
        ["abc", "defgh"],
        scenarios=["baseline", "virtual-clock"],
        spark_master=TEST_MASTER,
    )
    virtual = report.scenarios[1]
    assert virtual.name == "virtual-clock" and virtual.passed
    assert virtual.outputs == 8 and virtual.residuals == 2
    assert virtual.message.startswith("2 h of resume delays in ")


@pytest.mark.spark
@pytest.mark.slow
def test_virtual_clock_catches_lost_position_on_the_runner():
    get_test_session()
    with pytest.raises(SdfCheckError, match=r"virtual-clock: .*lost position on split"):
        check_sdf(
            sdfs.LosesPositionOnSplitFn(),
            sdfs.ELEMENTS,
            scenarios=["baseline", "virtual-clock"],
            spark_master=TEST_MASTER,
        )
