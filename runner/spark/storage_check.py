"""Refuse, at submission, a checkpoint store that cluster executors cannot reach.

On a cluster master a relative path resolves in each executor's work directory, and an absolute
local path is another (usually empty) folder on every host: rounds would fail later with a
misleading "checkpoint file is missing". Local masters accept any path; a cluster accepts URLs
(``s3://``...) and an absolute path declared ``--shared_filesystem``. A Spark Connect server
on another host counts as a cluster, even when its own master is local.
"""

from __future__ import annotations

import os
import re
import urllib.parse

from sparkbeam.runner.errors import PipelineOptionsError
from sparkbeam.runner.spark.session_conf import executors_on_this_host, is_loopback

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")


class SharedStorageError(PipelineOptionsError):
    """A store path that the executors of a cluster master cannot all reach."""


def effective_master(options) -> str:
    """The master the run will use (`session.target_master`); a Connect server's URL when it
    is on another host (its executors read that host's disks, whatever its master)."""
    from sparkbeam.runner.spark.session import target_master

    remote = options.remote_url()
    if remote and not is_loopback(urllib.parse.urlsplit(remote).hostname):
        return remote
    return target_master(options)


def check_shared_storage(options) -> None:
    """Raise SharedStorageError if --checkpoint_dir (streaming's default too) is local while
    the master is a cluster."""
    from apache_beam.options.pipeline_options import StandardOptions

    from sparkbeam.runner.options import DEFAULT_CHECKPOINT_ROOT
    from sparkbeam.runner.spark.session import check_master_url

    explicit = options.explicit_master_url()
    if explicit and not options.remote_url():  # an unknown master first, not a store rule
        check_master_url(explicit)
    flag, url = "--checkpoint_dir", options.checkpoint_dir
    if not url and options.view_as(StandardOptions).streaming:
        flag = "--checkpoint_dir (unset; the --streaming default)"
        url = os.path.abspath(DEFAULT_CHECKPOINT_ROOT)
    shared = bool(getattr(options, "shared_filesystem", False))
    check_store_path(flag, url, effective_master(options), shared)


def check_store_path(flag: str, url: str | None, master: str, shared: bool) -> None:
    """The rule itself, for any store or sink path given with ``flag``."""
    if not url or executors_on_this_host(master):
        return
    match = _SCHEME.match(url)
    if match and match.group(1).lower() != "file":
        return
    path = url[len("file://") :] if match else url
    where = (
        "put it on storage every executor reaches: a URL (s3://, gs://, hdfs://...) or an "
        "absolute path on a shared filesystem, with --shared_filesystem"
    )
    if not os.path.isabs(path):
        raise SharedStorageError(
            f"{flag} {url!r} is a relative path, but master {master!r} runs executors "
            f"in their own work directories on other hosts; {where}."
        )
    if not shared:
        raise SharedStorageError(
            f"{flag} {url!r} is a local path, but master {master!r} runs executors on "
            f"other hosts; {where} (pass --shared_filesystem only if every host mounts "
            "it at this path)."
        )


def check_input_paths(plan, options) -> None:
    """Refuse a ``ReadFromText`` of a relative path on a cluster master: each executor reads
    its byte ranges and would resolve the path in its own work directory, not the driver's."""
    if not plan.text_reads:
        return
    master = effective_master(options)
    if executors_on_this_host(master):
        return
    for read in plan.text_reads:
        pattern = read.pattern
        if _SCHEME.match(pattern) or os.path.isabs(pattern):
            continue
        raise SharedStorageError(
            f"{read.transform!r} reads {pattern!r}, a relative path, but master {master!r} "
            "runs executors in their own work directories on other hosts, where it names no "
            "file; give an absolute path on a filesystem every executor mounts, or a URL "
            f"(s3://, gs://, hdfs://...): e.g. {os.path.abspath(pattern)!r}."
        )
