"""SparkRunnerOptions parsing and one-line errors for bad options."""

from __future__ import annotations

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from sparkbeam.runner import SparkRunnerOptions
from sparkbeam.runner.errors import PipelineOptionsError, SparkSessionError
from sparkbeam.runner.spark.session import check_master_url


def test_parses_every_flag():
    opts = PipelineOptions(
        [
            "--spark_master_url=spark://host:7077",
            "--spark_conf",
            "spark.executor.memory=2g",
            "--spark_conf=spark.sql.shuffle.partitions=7",
            "--spark_app_name=wc",
            "--parallelism=5",
            "--checkpoint_dir=/tmp/ck",
        ]
    ).view_as(SparkRunnerOptions)
    assert opts.master_url() == "spark://host:7077"
    assert opts.spark_conf_pairs() == [
        ("spark.executor.memory", "2g"),
        ("spark.sql.shuffle.partitions", "7"),
    ]
    assert (opts.spark_app_name, opts.shuffle_parallelism(), opts.checkpoint_dir) == (
        "wc",
        5,
        "/tmp/ck",
    )


def test_defaults():
    opts = PipelineOptions([]).view_as(SparkRunnerOptions)
    assert opts.master_url() == "local[*]"
    assert opts.spark_conf_pairs() == []
    assert opts.shuffle_parallelism() is None
    assert opts.max_key_groups is None  # derived from the parallelism once it is known


def test_max_key_groups_parses():
    opts = PipelineOptions(["--max_key_groups=1024"]).view_as(SparkRunnerOptions)
    assert opts.max_key_groups == 1024


def test_explicit_local4_is_kept():
    opts = PipelineOptions(["--spark_master_url=local[4]"]).view_as(SparkRunnerOptions)
    assert opts.master_url() == "local[4]"


def test_malformed_spark_conf_names_the_value():
    opts = PipelineOptions(["--spark_conf=spark.executor.memory"]).view_as(SparkRunnerOptions)
    with pytest.raises(PipelineOptionsError, match=r"'spark.executor.memory' is not KEY=VALUE"):
        opts.spark_conf_pairs()


@pytest.mark.parametrize(
    "master", ["local[*]", "local[2]", "spark://h:7077", "yarn", "local-cluster[2,1,1024]"]
)
def test_valid_master_urls(master):
    check_master_url(master)


@pytest.mark.parametrize("master", ["localhost", "spark:/h", "local[x]", ""])
def test_unknown_master_url_is_one_clear_line(master):
    with pytest.raises(SparkSessionError, match="is not a Spark master URL") as info:
        check_master_url(master)
    assert "\n" not in str(info.value)


def test_sparkbeam_flags_parse_in_any_beam_program():
    """No 'unparseable args' and nothing dropped: the options class is always registered."""
    all_options = PipelineOptions(
        ["--residual_budget_s=0.5", "--spark_app_name=x"]
    ).get_all_options()
    assert all_options["residual_budget_s"] == 0.5
    assert all_options["spark_app_name"] == "x"
