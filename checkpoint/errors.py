"""Exceptions of the checkpoint store.

Owns: one small class per failure an operator can act on, each subclassing a builtin so callers
may catch the broad kind. Messages name the file, pipeline or store with ``!r`` and end with what
to do; `first_line`, how sparkbeam names any exception in one line (the runner's messages too).
Leaves to others: deciding when to raise (the modules that detect the problem).
"""

from __future__ import annotations


class CheckpointCorruptError(ValueError):
    """A checkpoint file is torn, truncated or fails its checksum."""

    def __init__(self, path: str, reason: str, action: str | None = None):
        self.path = path
        self.reason = reason
        action = action or (  # true wherever it is raised: it claims no fallback happened
            "A restart restores the newest checkpoint whose files are all sound; "
            "`sparkbeam checkpoints verify` names it and lists the damaged files "
            "(`checkpoints clean` deletes them once no checkpoint names them)."
        )
        super().__init__(f"Checkpoint file {path!r} is corrupt: {reason}. {action}")


class TaskStateDamagedError(CheckpointCorruptError):
    """A task found a file of the checkpoint it reads corrupt or missing. One line, so the
    driver finds it in the task's failure text (`runner.errors`) and restores the newest
    checkpoint whose files are all sound (`restore.fall_back`)."""

    def __init__(self, path: str, reason: str, pipeline_id: str, checkpoint_id: int) -> None:
        self.pipeline_id = pipeline_id
        self.checkpoint_id = checkpoint_id
        super().__init__(
            path,
            f"{reason}; checkpoint {checkpoint_id} of pipeline {pipeline_id!r} names it",
            "The driver restores the newest checkpoint whose files are all sound.",
        )

    @classmethod
    def of(
        cls, error: CheckpointCorruptError, url: str, pipeline_id: str, checkpoint_id: int
    ) -> TaskStateDamagedError:
        """``error``, met reading checkpoint ``checkpoint_id`` of the store at ``url``."""
        if isinstance(error, cls):
            return error
        path = error.path if error.path.startswith(url) else f"{url.rstrip('/')}/{error.path}"
        return cls(path, error.reason, pipeline_id, checkpoint_id)


class IncompatibleCheckpointError(ValueError):
    """The checkpoint was written by a pipeline with another fingerprint."""

    def __init__(self, pipeline_id: str, checkpoint_id: int, stored: str, current: str):
        self.pipeline_id = pipeline_id
        self.checkpoint_id = checkpoint_id
        self.stored = stored
        self.current = current
        super().__init__(
            f"Checkpoint {checkpoint_id} of pipeline {pipeline_id!r} was written by a pipeline "
            f"with fingerprint {stored!r}, but the running pipeline has fingerprint {current!r}: "
            "the pipeline graph or its coders changed. To restore anyway pass "
            "allow_fingerprint_change=True (state of changed transforms may not fit); to start "
            "fresh use a new --checkpoint_dir or another pipeline id."
        )


class StoreLockedError(RuntimeError):
    """Another job holds the store's write lock (or its lock file is unreadable)."""

    def __init__(self, url: str, holder: dict, unreadable: str | None = None):
        self.url = url
        self.holder = dict(holder)
        if unreadable is not None:
            super().__init__(
                f"Checkpoint store {url!r} is locked by an unreadable lock file {unreadable!r} "
                "(empty or not a lock: a job crashed while taking it), so its holder is "
                "unknown. If no job uses this store, reopen with break_lock=True (CLI: "
                "--break_lock; pipeline option --break_lock)."
            )
            return
        who = (
            f"job {holder.get('job_name')!r} (host {holder.get('host')!r}, "
            f"pid {holder.get('pid')!r}, since {holder.get('created_iso')!r})"
        )
        super().__init__(
            f"Checkpoint store {url!r} is locked by {who}. Stop that job first; if it is gone "
            "(a crash on another host), reopen with break_lock=True (CLI: --break_lock; "
            "pipeline option --break_lock)."
        )


class CheckpointNotFoundError(LookupError):
    """No (usable) checkpoint with the requested id exists."""

    def __init__(self, pipeline_id: str, checkpoint_id: int | None, url: str):
        self.pipeline_id = pipeline_id
        self.checkpoint_id = checkpoint_id
        what = "checkpoint" if checkpoint_id is None else f"checkpoint {checkpoint_id}"
        super().__init__(
            f"Pipeline {pipeline_id!r} has no {what} in store {url!r}. Run "
            f"`sparkbeam checkpoints list --checkpoint_dir {url}` to see what exists."
        )


class StoreAccessError(OSError):
    """The store cannot be reached or written (wrong endpoint, no credentials, no bucket, a
    read-only filesystem); the message names the store, where it looked and what to set."""


class StoreClosedError(RuntimeError):
    """The store or pipeline handle was closed and can no longer write."""

    def __init__(self, what: str):
        super().__init__(f"{what} is closed. Open the store again with open_store(...).")


class CheckpointConflictError(RuntimeError):
    """Another writer committed the checkpoint this job was about to commit (write-once names)."""

    def __init__(self, url: str, pipeline_id: str, checkpoint_id: int):
        self.url = url
        self.pipeline_id = pipeline_id
        self.checkpoint_id = checkpoint_id
        super().__init__(
            f"Checkpoint {checkpoint_id} of pipeline {pipeline_id!r} already exists in store "
            f"{url!r}: another job writes this store (its lock was broken or bypassed). Nothing "
            "was overwritten. Stop the other job, then restart this one to resume from the "
            "latest checkpoint."
        )


class StateLayoutError(ValueError):
    """A checkpoint's state was written in a layout (or value version) this code cannot read."""


class NoChangelogError(ValueError):
    """A checkpoint of a pipeline whose store keeps no changelog (a run without a store)."""

    def __init__(self, what: str):
        self.what = what
        super().__init__(
            f"{what} keeps no changelog (state in memory only, for a run without "
            "--checkpoint_dir), so a checkpoint would miss its changes; open the store with "
            "open_store(url), or run with --checkpoint_dir, to commit checkpoints."
        )


def first_line(e: BaseException, named: bool = False) -> str:
    """The first line of ``e``'s text (after its type name if ``named``), else its type name:
    a log line or message names the cause, not the pages a JVM error runs on for."""
    text = str(e).strip()
    if not text:
        return type(e).__name__
    line = text.splitlines()[0]
    return f"{type(e).__name__}: {line}" if named else line
