"""Refuse, at submission, a checkpoint store that cluster executors cannot reach.

With a cluster master each executor runs on its own host and in its own work
directory: a relative path resolves there, and an absolute local path is a
different (usually empty) folder on every host, so rounds fail later with a
misleading "checkpoint file is missing". Local masters (``local``,
``local[N]``, ``local-cluster[...]``) run on one host and accept any path.
An absolute local path is accepted on a cluster when the operator declares it
shared (``--shared_filesystem``: NFS or another mount at the same path
everywhere). URLs with a scheme (``s3://``, ``gs://``, ``hdfs://`` ...) pass. A Spark Connect server
(``--spark_remote``) on another host is a cluster here, even when its own master is local.
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
    """The master the run will use (the live session's, spark-submit's, else the option's).

    A Spark Connect server on another host counts as a cluster whatever its own master: its
    executors read that host's disks, not the driver's. (Its URL stands for the master then.)
    """
    from sparkbeam.runner.spark.session import target_master

    remote = options.remote_url()
    if remote and not is_loopback(urllib.parse.urlsplit(remote).hostname):
        return remote
    return target_master(options)


def check_shared_storage(options) -> None:
    """Raise SharedStorageError if --checkpoint_dir is local while the master is a cluster.

    A streaming run without --checkpoint_dir uses ``./sparkbeam-checkpoints/<job>``
    (local), so it is checked as that path.
    """
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
