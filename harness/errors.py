"""The harness's errors: what can be wrong with a run folder, a suite or a command line."""

from __future__ import annotations

import errno

from selfcest_env.configfile import ConfigError


class ResultsError(ValueError):
    """Base class of the errors this module raises on bad input or bad files."""


class DuplicateEpisodeError(ResultsError):
    """An episode index is already recorded in the run folder."""


class RunSpecMismatchError(ResultsError):
    """A run folder already holds a ``run_spec.json`` with a different spec."""


class RunFolderBusyError(ResultsError):
    """Another writer holds the run folder (POSIX ``flock`` on ``episodes.jsonl``)."""


class CorruptRunError(ResultsError):
    """A run folder file cannot be read (a bad line that is not the last one, bad JSON)."""


class RunSpecEditedError(CorruptRunError):
    """A run folder's ``run_spec.json`` no longer matches the folder (edited after the run)."""


class UnsafePathError(ResultsError):
    """A path the run store would write through leads somewhere else (a symbolic link)."""


class SuiteError(ConfigError):
    """A suite file or name is invalid (the message says what and where)."""


class SettingsError(ValueError):
    """A bad setting (an unknown agent, env, source or backend argument, a bad model): the
    CLI reports it as one error line with exit code 2, before anything runs."""


#: Errors that mean the disk (or the file size limit) is full: a command stops, since every
#: other run would fail the same way.
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
_NOT_WRITABLE = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})


def describe_os_error(exc: OSError) -> str:
    """What failed and what to do about it, for an error line."""
    where = f"{exc.filename}: " if exc.filename else ""
    what = f"{where}{exc.strerror or exc}"
    if exc.errno in DISK_FULL:
        return (
            f"{what}: the disk or the file size limit is full; free some space, then rerun the "
            "same command (finished episodes are kept, nothing is played twice)"
        )
    if exc.errno in _NOT_WRITABLE:
        return f"{what}: the folder is not writable; make it writable, or choose another --out"
    return f"{what}; fix that, then rerun the same command (finished episodes are kept)"


def one_line(text: str, limit: int = 1000) -> str:
    """``text`` on one line (white space runs collapsed), cut to ``limit`` characters."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."
