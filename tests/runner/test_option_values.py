"""Out-of-range option values are refused before any Spark work, in one line naming the flag."""

from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from sparkbeam.runner import SparkCheckpointRunner
from sparkbeam.runner.errors import PipelineOptionsError
from sparkbeam.runner.options import check_option_values


@pytest.mark.parametrize(
    "flag, match",
    [
        ("--parallelism=0", r"--parallelism=0 must be a whole number of at least 1"),
        ("--parallelism=-7", r"--parallelism=-7 must be a whole number of at least 1"),
        ("--parallelism=-1", r"--parallelism=-1 must be"),
        ("--checkpoint_interval_s=-1", r"--checkpoint_interval_s=-1.0 must be more than 0"),
        ("--checkpoint_interval_s=0", r"--checkpoint_interval_s=0.0 must be more than 0"),
        ("--materialization_interval_s=0", r"--materialization_interval_s=0.0 must be more"),
        ("--max_restores=-1", r"--max_restores=-1 must be at least 0"),
        ("--residual_budget_s=-0.5", r"--residual_budget_s=-0.5 must be at least 0"),
        ("--sdf_split_after_s=-2", r"--sdf_split_after_s=-2.0 must be at least 0"),
        ("--startpoint_max_age_s=-5", r"--startpoint_max_age_s=-5.0 must be more than 0"),
        ("--residual_budget_s=nan", r"--residual_budget_s=nan must be at least 0"),
        ("--checkpoint_interval_s=inf", r"--checkpoint_interval_s=inf must be a finite number"),
        ("--checkpoint_interval_s=1e300", r"--checkpoint_interval_s=1e\+300 must be a finite"),
        ("--materialization_interval_s=inf", r"--materialization_interval_s=inf must be a fin"),
        ("--residual_budget_s=inf", r"--residual_budget_s=inf must be a finite number"),
        ("--sdf_split_after_s=1e12", r"--sdf_split_after_s=1000000000000.0 must be a fin"),
        ("--startpoint_max_age_s=inf", r"--startpoint_max_age_s=inf must be a finite number"),
        ("--max_key_groups=0", r"--max_key_groups=0 must be in 1\.\.32768; leave it out"),
        ("--max_key_groups=40000", r"--max_key_groups=40000 must be in 1\.\.32768"),
        ("--parallelism=40000", r"--parallelism=40000 is more than the 32768 key groups"),
    ],
)
def test_bad_value_is_refused_in_one_line(flag, match):
    with pytest.raises(PipelineOptionsError, match=match) as info:
        check_option_values(PipelineOptions([flag]))
    assert "\n" not in str(info.value)


def test_parallelism_above_the_given_key_groups_names_both():
    options = PipelineOptions(["--parallelism=200", "--max_key_groups=128"])
    with pytest.raises(
        PipelineOptionsError,
        match=r"--parallelism=200 is more than "
        r"--max_key_groups=128: .*raise --max_key_groups",
    ) as info:
        check_option_values(options)
    assert "\n" not in str(info.value)


def test_run_refuses_before_spark_starts():
    """The runner checks first: no session, no job — the error names the flag."""
    p = beam.Pipeline(
        runner=SparkCheckpointRunner(),
        options=PipelineOptions(["--parallelism=0", "--spark_master_url=local[2]"]),
    )
    _ = p | beam.Create([1]) | beam.Map(lambda x: x)
    with pytest.raises(PipelineOptionsError, match=r"--parallelism=0"):
        p.run()


@pytest.mark.parametrize(
    "flags",
    [
        [],
        ["--parallelism=3", "--checkpoint_interval_s=0.05", "--max_restores=0"],
        ["--residual_budget_s=0", "--sdf_split_after_s=0", "--materialization_interval_s=1"],
        ["--startpoint_max_age_s=31536000", "--checkpoint_interval_s=86400"],
        ["--parallelism=200"],  # key groups derived: 512
        ["--parallelism=128", "--max_key_groups=128"],
        ["--max_key_groups=8"],  # Spark's default parallelism: keyed stages clamped at run time
    ],
)
def test_good_values_pass(flags):
    check_option_values(PipelineOptions(flags))
