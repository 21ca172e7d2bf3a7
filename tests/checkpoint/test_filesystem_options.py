"""Beam's filesystem options: picked out of a pipeline's options, applied once per process and
value, and accepted by the CLI subcommands that open a store."""

from __future__ import annotations

import argparse

import pytest

pytest.importorskip("apache_beam")
from apache_beam.io.filesystems import FileSystems  # noqa: E402
from apache_beam.options.pipeline_options import PipelineOptions, S3Options  # noqa: E402

from sparkbeam.checkpoint import cli  # noqa: E402
from sparkbeam.checkpoint.filesystem_options import apply, collect, encode  # noqa: E402


def test_collect_keeps_only_the_filesystem_options_that_were_set():
    options = PipelineOptions(
        ["--runner=SparkCheckpointRunner", "--s3_endpoint_url=http://e:9000", "--s3_disable_ssl",
         "--hdfs_host=nn", "--parallelism=3"]
    )  # fmt: skip
    assert collect(options) == {
        "hdfs_host": "nn",
        "s3_disable_ssl": True,
        "s3_endpoint_url": "http://e:9000",
    }


def test_apply_configures_beam_once_per_distinct_value():
    value = encode({"s3_endpoint_url": "http://once:1"})
    apply(value)
    first = FileSystems._pipeline_options
    assert first.view_as(S3Options).s3_endpoint_url == "http://once:1"
    apply(value)
    assert FileSystems._pipeline_options is first  # not rebuilt: clients stay cached
    apply(encode({}))
    assert FileSystems._pipeline_options.view_as(S3Options).s3_endpoint_url is None


@pytest.mark.parametrize(
    "argv",
    [
        ["checkpoints", "list"],
        ["checkpoints", "verify"],
        ["checkpoints", "clean"],
        ["startpoints", "list"],
        ["startpoints", "set", "--pipeline=p", "--transform=t", "--kind=oldest"],
    ],
)
def test_store_subcommands_accept_the_s3_flags(argv):
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    cli.add_subcommands(sub)
    cli.add_startpoint_subcommands(sub)
    flags = ["--checkpoint_dir=s3://b/ckpt", "--s3_endpoint_url=http://e:9000", "--s3_verify=no"]
    args = parser.parse_args([*argv, *flags])
    assert args.s3_endpoint_url == "http://e:9000" and args.s3_verify == "no"
    assert not hasattr(args, "s3_access_key_id")  # unset flags stay unset: boto3 reads the env
