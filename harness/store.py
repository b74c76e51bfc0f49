"""Run folders: one folder per (env, source, split, agent, model, budget, seed) run.

A run folder holds three files:

``run_spec.json``
    The :class:`RunSpec` (what was run) plus the environment it ran in (Python and package
    versions, git revision). Written atomically (temporary file, then :func:`os.replace`).
    Reopening a folder with a different spec is refused (:class:`RunSpecMismatchError`); a
    different environment (newer package versions) is only logged. The spec hash recorded
    in it and ending the folder name is the folder's identity: a spec edited afterwards is
    refused by readers and writers alike (:func:`spec_of_folder`).
``episodes.jsonl``
    Append-only, one JSON object per finished episode (schema: :func:`validate_episode`),
    flushed and ``fsync``-ed before :meth:`RunFolder.append_episode` returns, so a killed run
    loses at most the episode it was writing. On open, an unterminated last line (a kill in the
    middle of a write) is dropped and the file truncated back to its last complete line.
``errors.jsonl``
    Append-only like ``episodes.jsonl``, one line per episode attempt that ended because
    something outside the policy failed (``end_reason`` ``"backend_error"``, with ``error``
    saying what): :meth:`RunFolder.append_error`. Such an episode is not done, so a rerun plays
    it again; its failed attempts stay listed here and counted in ``stats.json``.
``stats.json``
    Summary statistics computed from the episodes and errors (:func:`compute_stats`), written
    atomically.

Episode indices are unique in a folder: a driver asks :meth:`RunFolder.missing_episodes` (or
:meth:`RunFolder.done_episodes`) which indices are left and runs only those; appending an index
that is already recorded raises :class:`DuplicateEpisodeError`. One process writes a folder at a
time; readers that must not modify a live folder use :func:`read_episodes` / :func:`load_run`.

Files and folders are created with the permissions the process umask gives (0o666 / 0o777
masked). Run files must be regular files: a symbolic link, folder or FIFO in their place (or a
symbolic link in place of the run folder) is refused, never written through or waited on. A
write that fails part-way (a full disk) leaves no partial line behind: every episode appended
before it is kept, and rerunning resumes.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # not POSIX: no advisory lock
    fcntl = None  # type: ignore[assignment]

from selfcest_env.episodes import (
    EpisodeRecordError,
    compute_stats,
    encode_episode_line,
    json_ready,
    validate_episode,
)
from selfcest_env.harness.errors import (
    CorruptRunError,
    DuplicateEpisodeError,
    ResultsError,
    RunFolderBusyError,
    RunSpecMismatchError,
    UnsafePathError,
)
from selfcest_env.harness.files import (
    append_line,
    atomic_write_json,
    open_append,
    read_regular_file,
)
from selfcest_env.harness.runspec import SPEC_FILE, RunSpec, environment_info, spec_of_folder

logger = logging.getLogger(__name__)

EPISODES_FILE = "episodes.jsonl"
ERRORS_FILE = "errors.jsonl"
STATS_FILE = "stats.json"

#: Version of the run_spec.json / stats.json layout.
SCHEMA_VERSION = 1


def _parse_lines(
    data: bytes, source: str, unique: bool = True
) -> tuple[list[dict[str, Any]], int, bool]:
    """Parse the complete lines of an episodes file (``unique``: an episode index may appear
    only once) or an errors file.

    Returns the records, the byte length of the complete-line prefix, and whether an
    unterminated tail was found (and left out).
    """
    end = data.rfind(b"\n") + 1
    body, tail = data[:end], data[end:]
    records: list[dict[str, Any]] = []
    seen: set[int] = set()
    for lineno, raw in enumerate(body.split(b"\n")[:-1], start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw.decode("utf-8"))
            record = validate_episode(obj)
        except (ValueError, RecursionError) as exc:  # bad UTF-8, JSON or record
            raise CorruptRunError(f"{source}:{lineno}: unreadable episode line: {exc}") from exc
        if unique and record["episode"] in seen:
            raise CorruptRunError(
                f"{source}:{lineno}: episode {record['episode']} is recorded twice "
                "(two writers on one folder?)"
            )
        seen.add(record["episode"])
        records.append(record)
    return records, end, bool(tail.strip())


def _in_folder(path: str | Path, name: str) -> Path:
    """``path / name`` when ``path`` is a run folder, else ``path`` (the file itself).

    A path already named ``name`` is taken as the file, so a folder where the file should be
    is reported as such instead of being searched for a file inside it.
    """
    path = Path(path)
    return path / name if path.name != name and path.is_dir() else path


def read_episodes(path: str | Path) -> list[dict[str, Any]]:
    """Read an ``episodes.jsonl`` file (or a run folder) without modifying it.

    An unterminated last line (a run killed mid-write, or still writing) is skipped; any other
    bad line, or a path that is not a regular file, raises :class:`CorruptRunError`. A missing
    file reads as no episodes.
    """
    path = _in_folder(path, EPISODES_FILE)
    data = read_regular_file(path)
    return [] if data is None else _parse_lines(data, str(path))[0]


def read_errors(path: str | Path) -> list[dict[str, Any]]:
    """Read the ``errors.jsonl`` of a run folder (or the file) without modifying it, like
    :func:`read_episodes`; an episode may appear on several lines (one per failed attempt)."""
    path = _in_folder(path, ERRORS_FILE)
    data = read_regular_file(path)
    return [] if data is None else _parse_lines(data, str(path), unique=False)[0]


# --------------------------------------------------------------------------------------------
# Run folders


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _spec_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    keys = sorted(set(old) | set(new))
    return [
        f"{k}: {old.get(k)!r} (folder) != {new.get(k)!r} (new)"
        for k in keys
        if old.get(k) != new.get(k)
    ]


def read_run_spec(path: str | Path) -> dict[str, Any]:
    """Read the ``run_spec.json`` of a run folder (or the file itself) as a dict.

    Raises:
        FileNotFoundError: there is no ``run_spec.json`` (not a run folder).
        CorruptRunError: it is not a regular file, not JSON, or lacks the ``spec`` object.
    """
    path = _in_folder(path, SPEC_FILE)
    raw = read_regular_file(path)
    if raw is None:
        raise FileNotFoundError(errno.ENOENT, "no run spec (not a run folder)", str(path))
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # bad UTF-8 or JSON
        raise CorruptRunError(f"{path}: unreadable run spec: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("spec"), dict):
        raise CorruptRunError(f"{path}: run spec file has no 'spec' object")
    if not isinstance(data.get("environment", {}), dict):
        raise CorruptRunError(f"{path}: run spec file's 'environment' is not an object")
    return data


@dataclass(frozen=True)
class RunData:
    """A run folder read without modifying it: its spec file and its complete episodes."""

    path: Path
    spec: RunSpec
    spec_file: dict[str, Any]
    episodes: list[dict[str, Any]]
    errors: list[dict[str, Any]] = field(default_factory=list)

    def stats(self, limit: int | None = None) -> dict[str, Any]:
        """:func:`compute_stats` of the episodes and errors (``limit``: of the first ones)."""
        return compute_stats(self.episodes, self.errors, limit)


def load_run(path: str | Path) -> RunData:
    """Read a run folder (spec and episodes) without touching its files.

    Raises:
        FileNotFoundError: it has no ``run_spec.json``.
        CorruptRunError: a file cannot be read, or the spec was edited
            (:func:`spec_of_folder`).
    """
    path = Path(path)
    spec_file = read_run_spec(path)
    spec = spec_of_folder(path, spec_file)
    return RunData(
        path, spec, spec_file, read_episodes(path / EPISODES_FILE), read_errors(path / ERRORS_FILE)
    )


def stats_file_current(folder: str | Path, stats: Mapping[str, Any]) -> bool:
    """Whether the folder's ``stats.json`` holds ``stats`` (:func:`compute_stats` of its
    records; it may lag behind after a kill between the last episode and the stats write)."""
    try:
        raw = read_regular_file(Path(folder) / STATS_FILE)
        written = None if raw is None else json.loads(raw.decode("utf-8"))
    except (ResultsError, ValueError, RecursionError):
        return False
    if not isinstance(written, dict):
        return False
    written = {k: v for k, v in written.items() if k not in ("run_id", "updated")}
    return written == json_ready(stats)


def is_run_dir(path: str | Path) -> bool:
    """Whether ``path`` is a folder holding a ``run_spec.json``."""
    return (Path(path) / SPEC_FILE).is_file()


def _lock_exclusive(handle: Any, where: Path) -> None:
    """Take a non-blocking exclusive ``flock`` on ``handle`` (POSIX only; elsewhere a no-op).

    The lock goes away with the process (a killed run does not leave a stale lock).
    """
    if fcntl is None:
        return
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        raise RunFolderBusyError(
            f"run folder {where} is open for writing elsewhere (another process or RunFolder)"
        ) from exc


class RunFolder:
    """A run folder opened for writing: ``root / spec.run_id`` unless ``path`` is given.

    Opening creates the folder and ``run_spec.json`` (or checks that the existing one has the
    same spec), reads the episodes already recorded and repairs a truncated last line. Use it as
    a context manager, or call :meth:`close`. One writer per folder at a time: on POSIX a second
    open while the first is still open raises :class:`RunFolderBusyError`.

    Example::

        with RunFolder("runs", spec) as run:
            for i in run.missing_episodes(spec.n_episodes):
                run.append_episode(play(i))
            run.write_stats()
    """

    def __init__(self, root: str | Path, spec: RunSpec, *, path: str | Path | None = None):
        """Open (create or resume) the run folder of ``spec`` under ``root``.

        Raises:
            RunSpecMismatchError: the folder's ``run_spec.json`` has a different spec.
            CorruptRunError: the folder's files cannot be read, are not regular files, or its
                spec was edited (:func:`spec_of_folder`).
            UnsafePathError: the run folder is a symbolic link.
            RunFolderBusyError: another writer has the folder open.
            OSError: the folder cannot be written (read-only, full disk).
        """
        if not isinstance(spec, RunSpec):
            raise TypeError(f"spec must be a RunSpec, got {type(spec).__name__}")
        self.spec = spec
        self.path = Path(path) if path is not None else Path(root) / spec.run_id
        if self.path.is_symlink():
            raise UnsafePathError(
                f"run folder {self.path} is a symbolic link (to {os.readlink(self.path)}); "
                "remove the link, or use another output folder"
            )
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except FileExistsError as exc:
            raise CorruptRunError(
                f"{self.path} is a file where a run folder should be; remove it, or use "
                "another output folder"
            ) from exc
        self._write_or_check_spec()
        self._handle = open_append(self.episodes_path)
        try:
            _lock_exclusive(self._handle, self.path)
            self._episodes: list[dict[str, Any]] = self._load_and_repair(self.episodes_path)
            self._errors = self._load_and_repair(self.errors_path, unique=False)
        except BaseException:
            self._handle.close()
            raise
        self._remove_stale_temporary_files()
        self._done: set[int] = {e["episode"] for e in self._episodes}
        self._error_handle: Any = None

    @classmethod
    def open_existing(cls, path: str | Path) -> RunFolder:
        """Reopen an existing run folder for writing, taking the spec from its run_spec.json."""
        path = Path(path)
        return cls(path.parent, spec_of_folder(path, read_run_spec(path)), path=path)

    # paths ----------------------------------------------------------------------------------

    @property
    def spec_path(self) -> Path:
        """Path of ``run_spec.json``."""
        return self.path / SPEC_FILE

    @property
    def episodes_path(self) -> Path:
        """Path of ``episodes.jsonl``."""
        return self.path / EPISODES_FILE

    @property
    def errors_path(self) -> Path:
        """Path of ``errors.jsonl``."""
        return self.path / ERRORS_FILE

    @property
    def stats_path(self) -> Path:
        """Path of ``stats.json``."""
        return self.path / STATS_FILE

    # opening --------------------------------------------------------------------------------

    def _write_or_check_spec(self) -> None:
        new = self.spec.to_dict()
        try:
            existing = read_run_spec(self.spec_path)
        except FileNotFoundError:
            existing = None
        if existing is not None:
            spec_of_folder(self.path, existing)
            diff = _spec_diff(existing["spec"], new)
            if diff:
                raise RunSpecMismatchError(
                    f"run folder {self.path} holds a different run spec; use another folder "
                    "or the same spec. Differences: " + "; ".join(diff)
                )
            old_env = existing.get("environment", {})
            new_env = environment_info()
            if (
                old_env.get("versions") != new_env["versions"]
                or old_env.get("git_revision") != new_env["git_revision"]
            ):
                logger.warning(
                    "resuming %s in a different environment: %s (folder) vs %s (now)",
                    self.path,
                    old_env,
                    new_env,
                )
            return
        atomic_write_json(
            self.spec_path,
            {
                "schema_version": SCHEMA_VERSION,
                "run_id": self.spec.run_id,
                "spec_hash": self.spec.spec_hash,
                "budget_label": self.spec.budget_label,
                "created": _now(),
                "spec": new,
                "environment": environment_info(),
            },
        )

    def _remove_stale_temporary_files(self) -> None:
        """Delete what a write killed between its temporary file and the rename left behind
        (the lock guarantees that no other writer is in the middle of one)."""
        for name in (SPEC_FILE, STATS_FILE):
            for stale in self.path.glob(f".{name}.*.tmp"):
                with contextlib.suppress(OSError):
                    stale.unlink()

    @staticmethod
    def _load_and_repair(path: Path, unique: bool = True) -> list[dict[str, Any]]:
        data = read_regular_file(path)
        if data is None:
            return []
        records, end, has_tail = _parse_lines(data, str(path), unique)
        if len(data) > end:
            if has_tail:
                logger.warning(
                    "%s: dropping an unterminated last line of %d bytes (interrupted write)",
                    path,
                    len(data) - end,
                )
            with open_append(path) as handle:
                os.ftruncate(handle.fileno(), end)
                os.fsync(handle.fileno())
        return records

    # episodes -------------------------------------------------------------------------------

    @property
    def episodes(self) -> list[dict[str, Any]]:
        """The recorded episodes in the order they were written (a copy of the list)."""
        return list(self._episodes)

    @property
    def errors(self) -> list[dict[str, Any]]:
        """The recorded failed attempts (``errors.jsonl``), in the order they were written."""
        return list(self._errors)

    def done_episodes(self) -> set[int]:
        """Indices of the episodes already recorded."""
        return set(self._done)

    def missing_episodes(self, n: int | None = None) -> list[int]:
        """Indices in ``range(n)`` (default ``spec.n_episodes``) not yet recorded, ascending."""
        if n is None:
            n = self.spec.n_episodes
        if n is None:
            raise ResultsError("missing_episodes needs n (the spec has no n_episodes)")
        return [i for i in range(n) if i not in self._done]

    def append_episode(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """Validate ``record``, append it as one line, flush and fsync; return the stored copy.

        Raises:
            EpisodeRecordError: the record does not follow the schema.
            DuplicateEpisodeError: its ``episode`` index is already recorded (nothing written).
            ResultsError: the folder is closed.
        """
        if self._handle.closed:
            raise ResultsError(f"run folder {self.path} is closed")
        clean = validate_episode(record)
        index = clean["episode"]
        if index in self._done:
            raise DuplicateEpisodeError(
                f"episode {index} is already recorded in {self.episodes_path}"
            )
        append_line(self._handle, encode_episode_line(clean))
        self._episodes.append(clean)
        self._done.add(index)
        return clean

    def append_error(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """Record a failed attempt at an episode in ``errors.jsonl`` (flushed and fsync-ed).

        ``record`` has the schema of :func:`validate_episode` plus ``error`` (a non-empty
        string: what failed). The episode stays missing, so a rerun plays it again.

        Raises:
            EpisodeRecordError: the record does not follow the schema or has no ``error``.
            DuplicateEpisodeError: the episode already has a result.
            ResultsError: the folder is closed.
        """
        if self._handle.closed:
            raise ResultsError(f"run folder {self.path} is closed")
        clean = validate_episode(record)
        if not isinstance(clean.get("error"), str) or not clean["error"]:
            raise EpisodeRecordError("an error record needs 'error': a non-empty string")
        if clean["episode"] in self._done:
            raise DuplicateEpisodeError(
                f"episode {clean['episode']} already has a result in {self.episodes_path}"
            )
        if self._error_handle is None:
            self._error_handle = open_append(self.errors_path)
        append_line(self._error_handle, encode_episode_line(clean))
        self._errors.append(clean)
        return clean

    # stats ----------------------------------------------------------------------------------

    def stats(self, limit: int | None = None) -> dict[str, Any]:
        """:func:`compute_stats` of the recorded episodes and errors (``limit``: of episodes
        ``0 .. limit - 1`` only)."""
        return compute_stats(self._episodes, self._errors, limit)

    def stats_current(self) -> bool:
        """Whether ``stats.json`` exists and holds :meth:`stats` (it may not after a kill
        between the last episode and the stats write)."""
        return stats_file_current(self.path, self.stats())

    def write_stats(self) -> dict[str, Any]:
        """Compute the stats, write ``stats.json`` atomically and return them."""
        stats = self.stats()
        stats["run_id"] = self.spec.run_id
        stats["updated"] = _now()
        atomic_write_json(self.stats_path, stats)
        return stats

    # lifetime -------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the episodes and errors files (idempotent)."""
        if self._error_handle is not None and not self._error_handle.closed:
            self._error_handle.close()
        if not self._handle.closed:
            self._handle.close()

    def __enter__(self) -> RunFolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r}, episodes={len(self._episodes)})"
