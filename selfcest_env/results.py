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
import dataclasses
import errno
import hashlib
import json
import logging
import math
import numbers
import os
import platform
import re
import secrets
import stat
import subprocess
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # not POSIX: no advisory lock
    fcntl = None  # type: ignore[assignment]

from selfcest_env.budget import METER_NAMES

logger = logging.getLogger(__name__)

#: Integer meters every episode record carries in ``record["meters"]`` (the ledger's meters).
INT_METERS: tuple[str, ...] = METER_NAMES

#: Every meter an episode record must carry: the integer meters plus ``wall_time_s`` (float).
METERS: tuple[str, ...] = (*INT_METERS, "wall_time_s")

#: The cost meters that leaderboards draw Pareto frontiers against (mean over episodes).
COST_METERS: tuple[str, ...] = ("gen_tokens", "critical_path_tokens", "peak_context_tokens")

#: The ``end_reason`` of an episode in which the root answered (every other one is a failure).
ANSWERED = "answered"

SPEC_FILE = "run_spec.json"
EPISODES_FILE = "episodes.jsonl"
ERRORS_FILE = "errors.jsonl"
STATS_FILE = "stats.json"

#: Version of the run_spec.json / stats.json layout.
SCHEMA_VERSION = 1

#: Packages whose versions are recorded in ``run_spec.json`` (distribution names).
_VERSION_PACKAGES: tuple[str, ...] = ("selfcest", "gymnasium", "torch", "transformers")

_UNSAFE = re.compile(r"[^A-Za-z0-9._=,+-]+")
_COMPONENT_MAX = 48
#: The longest file name common file systems allow (bytes; run folder names are ASCII).
_NAME_MAX = 255


class ResultsError(ValueError):
    """Base class of the errors this module raises on bad input or bad files."""


class EpisodeRecordError(ResultsError):
    """An episode record does not follow the schema of :func:`validate_episode`."""


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


# --------------------------------------------------------------------------------------------
# Run spec


def _sanitise(text: str, max_len: int = _COMPONENT_MAX) -> str:
    """Make ``text`` safe as part of a folder name: ``[A-Za-z0-9._=,+-]``, no leading dot."""
    out = _UNSAFE.sub("-", str(text)).strip("-.")
    if len(out) > max_len:
        out = out[:max_len].rstrip("-.")
    return out or "none"


def _canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: the same text for equal values."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _json_normalise(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples become lists, keys become strings)."""
    return json.loads(json.dumps(value, allow_nan=False))


def _format_budget_value(value: Any) -> str:
    if value is None:
        return "inf"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """What one run is: the environment, the task split, the agent, the model, the budget, seed.

    Attributes:
        env_id: Registered Gymnasium id, e.g. ``"SelfCest-Math-v0"``.
        source: Task source name, e.g. ``"arithmetic"`` or ``"gsm8k"``.
        split: Task split, e.g. ``"test"``.
        agent: Stable agent name, e.g. ``"monolithic"`` or ``"self_consistency"``.
        agent_config: The agent's settings (JSON-serialisable).
        model: Model id or path (``""`` for model-free agents).
        backend: Backend name, e.g. ``"transformers"`` or ``"vllm"``.
        budget: Budget limits (JSON-serialisable). An optional ``"label"`` key names it in
            folder names and plots; otherwise the label is built from the sorted items.
        seed: Run seed.
        n_episodes: Episodes the run is meant to have (``None``: not fixed).
        extra: Free-form extra settings; part of the spec (and of the hash).
    """

    env_id: str
    source: str
    split: str
    agent: str
    agent_config: dict[str, Any] = field(default_factory=dict)
    model: str = ""
    backend: str = ""
    budget: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    n_episodes: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("env_id", "source", "split", "agent", "model", "backend"):
            if not isinstance(getattr(self, name), str):
                raise ResultsError(f"RunSpec.{name} must be a str, got {getattr(self, name)!r}")
        for name in ("env_id", "source", "split", "agent"):
            if not getattr(self, name):
                raise ResultsError(f"RunSpec.{name} must not be empty")
        if not _is_int64(self.seed):
            raise ResultsError(f"RunSpec.seed must be a 64-bit int, got {self.seed!r}")
        if self.n_episodes is not None and not (
            _is_int64(self.n_episodes) and self.n_episodes >= 0
        ):
            raise ResultsError(
                f"RunSpec.n_episodes must be None or a 64-bit int >= 0, got {self.n_episodes!r}"
            )
        for name in ("agent_config", "budget", "extra"):
            value = getattr(self, name)
            if not isinstance(value, Mapping):
                raise ResultsError(f"RunSpec.{name} must be a dict, got {type(value).__name__}")
            try:
                json.dumps(value, allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise ResultsError(f"RunSpec.{name} is not JSON-serialisable: {exc}") from exc

    def to_dict(self) -> dict[str, Any]:
        """The spec as a JSON-ready dict (as it is stored in ``run_spec.json``)."""
        return _json_normalise(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunSpec:
        """Rebuild a spec from :meth:`to_dict` output; unknown keys are an error."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ResultsError(f"unknown RunSpec keys: {unknown}")
        return cls(**dict(data))

    @property
    def spec_hash(self) -> str:
        """Eight hex digits of the SHA-256 of the whole spec (stable across processes)."""
        return hashlib.sha256(_canonical_json(self.to_dict()).encode("utf-8")).hexdigest()[:8]

    @property
    def budget_label(self) -> str:
        """A short human label of the budget: ``budget["label"]``, else ``k=v,...``, else
        ``"default"``."""
        if "label" in self.budget:
            return str(self.budget["label"])
        if not self.budget:
            return "default"
        return ",".join(f"{k}={_format_budget_value(v)}" for k, v in sorted(self.budget.items()))

    @property
    def run_id(self) -> str:
        """Folder name: ``env__source__split__agent__model__budget__seedN__hash``, sanitised.

        Readable parts are cut to 48 characters each, and all of them together so that the
        name fits the 255 bytes file systems allow; the hash covers the full spec (so two
        specs that differ anywhere, ``agent_config`` and ``extra`` included, get different
        folders).
        """
        parts = [
            self.env_id,
            self.source,
            self.split,
            self.agent,
            self.model or "nomodel",
            self.budget_label,
            f"seed{self.seed}",
        ]
        readable = "__".join(_sanitise(p) for p in parts)
        return readable[: _NAME_MAX - len(self.spec_hash) - 2] + "__" + self.spec_hash


# --------------------------------------------------------------------------------------------
# Environment capture


def _package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def git_revision(cwd: str | Path | None = None) -> str | None:
    """``git rev-parse HEAD`` in ``cwd`` (default: this package's folder), or ``None`` when git
    is missing, the folder is not a repository, or it has no commit yet."""
    where = Path(cwd) if cwd is not None else Path(__file__).resolve().parent
    try:
        proc = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=where,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        logger.debug("git rev-parse failed: %s", exc)
        return None
    revision = proc.stdout.strip()
    if proc.returncode != 0 or not re.fullmatch(r"[0-9a-f]{40,64}", revision):
        return None
    return revision


def environment_info() -> dict[str, Any]:
    """Python and package versions (``None`` when not installed) and the git revision."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in _VERSION_PACKAGES:
        versions[name] = _package_version(name)
    return {
        "versions": versions,
        "git_revision": git_revision(),
        "platform": platform.platform(),
    }


# --------------------------------------------------------------------------------------------
# Atomic files


def _fsync_dir(path: Path) -> None:
    """Best-effort fsync of a directory (so a rename survives a crash); a no-op where the OS
    does not allow opening directories."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _create_temporary(path: Path) -> tuple[int, Path]:
    """A new file ``.<name>.<random>.tmp`` beside ``path``, open for writing.

    Created with mode 0o666, so the process umask decides who may read it (``tempfile.mkstemp``
    would make it 0o600); ``O_EXCL`` never opens what is already there, a symbolic link
    included.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: temporary file in the same folder, fsync, rename.

    The file gets the permissions the umask gives a new file. A symbolic link at ``path`` is
    replaced, never written through. On any failure (a full disk) ``path`` keeps its old
    content and the temporary file is removed.
    """
    path = Path(path)
    fd, tmp = _create_temporary(path)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically, like :func:`atomic_write_bytes`."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, data: Any) -> None:
    """Write ``data`` as indented JSON to ``path`` atomically."""
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n")


# --------------------------------------------------------------------------------------------
# Episode records


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not _is_bool(value)


def _is_int64(value: Any) -> bool:
    """An int that fits a signed 64-bit integer (what leaderboard columns hold)."""
    return _is_int(value) and -(2**63) <= value < 2**63


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool) or getattr(getattr(value, "dtype", None), "kind", "") == "b"


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not _is_bool(value)


def _is_finite(value: Any) -> bool:
    """A real number that is finite as a float (an int too large for a float is not)."""
    try:
        return _is_real(value) and math.isfinite(float(value))
    except OverflowError:
        return False


#: Top-level keys of an episode record and their kinds ("int", "str", "bool", "float", "meters").
EPISODE_KEYS: dict[str, str] = {
    "episode": "int",
    "task_id": "str",
    "seed": "int",
    "correct": "bool",
    "score": "float",
    "reward": "float",
    "end_reason": "str",
    "answer": "str",
    "meters": "meters",
}


def validate_episode(record: Mapping[str, Any]) -> dict[str, Any]:
    """Check an episode record and return a JSON-ready copy (numpy scalars become Python ones).

    Required keys: ``episode`` (int >= 0), ``task_id`` (str), ``seed`` (int), ``correct``
    (bool), ``score`` and ``reward`` (finite floats; ints accepted), ``end_reason`` (str),
    ``answer`` (str), ``meters`` (dict with every name in :data:`INT_METERS` as an int >= 0 and
    ``wall_time_s`` as a float >= 0). Extra top-level keys are kept if JSON-serialisable;
    extra meters are kept if they are numbers.

    Raises:
        EpisodeRecordError: listing every problem found.
    """
    if not isinstance(record, Mapping):
        raise EpisodeRecordError(f"episode record must be a dict, got {type(record).__name__}")
    problems: list[str] = []
    out: dict[str, Any] = {}
    for key, kind in EPISODE_KEYS.items():
        if key not in record:
            problems.append(f"missing key {key!r}")
            continue
        value = record[key]
        if kind == "int":
            if not _is_int64(value):
                problems.append(f"{key!r} must be a 64-bit int, got {value!r}")
            elif key == "episode" and int(value) < 0:
                problems.append(f"'episode' must be >= 0, got {value!r}")
            else:
                out[key] = int(value)
        elif kind == "str":
            if not isinstance(value, str):
                problems.append(f"{key!r} must be a str, got {value!r}")
            else:
                out[key] = value
        elif kind == "bool":
            if not _is_bool(value):
                problems.append(f"{key!r} must be a bool, got {value!r}")
            else:
                out[key] = bool(value)
        elif kind == "float":
            if not _is_finite(value):
                problems.append(f"{key!r} must be a finite number, got {value!r}")
            else:
                out[key] = float(value)
        else:
            out[key] = _validate_meters(value, problems)
    extras = {k: v for k, v in record.items() if k not in EPISODE_KEYS}
    for key in extras:
        if not isinstance(key, str):
            problems.append(f"extra key {key!r} must be a str")
    if not problems and extras:
        try:
            out.update(_json_normalise(extras))
        except (TypeError, ValueError) as exc:
            problems.append(f"extra keys are not JSON-serialisable: {exc}")
    if problems:
        where = f" (episode {record.get('episode')!r})" if "episode" in record else ""
        raise EpisodeRecordError(f"bad episode record{where}: " + "; ".join(problems))
    return out


def encode_episode_line(record: Mapping[str, Any]) -> bytes:
    """One ``episodes.jsonl`` line of a validated record: UTF-8 JSON ending in a newline.

    Strings that UTF-8 cannot encode (lone surrogates) are written as JSON ``\\u`` escapes,
    which read back as the same strings.
    """
    try:
        return (json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")
    except UnicodeEncodeError:
        return (json.dumps(record, ensure_ascii=True, allow_nan=False) + "\n").encode("ascii")


def _open_append(path: Path) -> Any:
    """Open a run file for appending, unbuffered (each write reaches the OS at once).

    Never through a symbolic link and only a regular file (a run folder from elsewhere cannot
    redirect the writes, and a FIFO there cannot block the run); created with mode 0o666, so
    the umask decides who may read it.

    Raises:
        CorruptRunError: ``path`` is a symbolic link, a folder or another non-regular file.
    """
    flags = (
        os.O_WRONLY
        | os.O_APPEND
        | os.O_CREAT
        | getattr(os, "O_NOFOLLOW", 0)
        | getattr(os, "O_NONBLOCK", 0)
        | getattr(os, "O_CLOEXEC", 0)
    )
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            raise _not_a_regular_file(path) from exc
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _not_a_regular_file(path)
    return os.fdopen(fd, "ab", buffering=0)


def _not_a_regular_file(path: Path) -> CorruptRunError:
    return CorruptRunError(
        f"{path} is not a regular file (a link, a folder or a device); remove it, or use "
        "another output folder"
    )


def _append_line(handle: Any, line: bytes) -> None:
    """Append one line to a file from :func:`_open_append` and fsync it before returning.

    When a write fails part-way (a full disk), the file is cut back to where it was, so it
    never keeps a partial line; the error is raised again.
    """
    fd = handle.fileno()
    start = os.fstat(fd).st_size
    try:
        view = memoryview(line)
        while view:
            view = view[handle.write(view) :]
        os.fsync(fd)
    except OSError:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, start)
        raise


def _read_run_file(path: Path) -> bytes | None:
    """The bytes of a run file, ``None`` when it does not exist.

    Raises:
        CorruptRunError: it is not a regular file (a folder, a FIFO), or cannot be read.
    """
    flags = (
        os.O_RDONLY
        | getattr(os, "O_NOFOLLOW", 0)
        | getattr(os, "O_NONBLOCK", 0)
        | getattr(os, "O_CLOEXEC", 0)
    )
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _not_a_regular_file(path) from exc
        raise CorruptRunError(f"{path}: cannot read: {exc.strerror}") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _not_a_regular_file(path)
    with os.fdopen(fd, "rb") as handle:
        try:
            return handle.read()
        except OSError as exc:
            raise CorruptRunError(f"{path}: cannot read: {exc.strerror}") from exc


def _validate_meters(value: Any, problems: list[str]) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        problems.append(f"'meters' must be a dict, got {type(value).__name__}")
        return {}
    meters: dict[str, Any] = {}
    for name in INT_METERS:
        if name not in value:
            problems.append(f"missing meter {name!r}")
        elif not _is_int64(value[name]) or value[name] < 0:
            problems.append(f"meter {name!r} must be a 64-bit int >= 0, got {value[name]!r}")
        else:
            meters[name] = int(value[name])
    if "wall_time_s" not in value:
        problems.append("missing meter 'wall_time_s'")
    else:
        wall = value["wall_time_s"]
        if not _is_finite(wall) or wall < 0:
            problems.append(f"meter 'wall_time_s' must be a finite float >= 0, got {wall!r}")
        else:
            meters["wall_time_s"] = float(wall)
    for name, extra in value.items():
        if name in meters or name in METERS:
            continue
        if not isinstance(name, str) or not _is_finite(extra):
            problems.append(f"extra meter {name!r} must be a finite number, got {extra!r}")
        else:
            meters[name] = int(extra) if _is_int(extra) else float(extra)
    return meters


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
    data = _read_run_file(path)
    return [] if data is None else _parse_lines(data, str(path))[0]


def read_errors(path: str | Path) -> list[dict[str, Any]]:
    """Read the ``errors.jsonl`` of a run folder (or the file) without modifying it, like
    :func:`read_episodes`; an episode may appear on several lines (one per failed attempt)."""
    path = _in_folder(path, ERRORS_FILE)
    data = _read_run_file(path)
    return [] if data is None else _parse_lines(data, str(path), unique=False)[0]


# --------------------------------------------------------------------------------------------
# Statistics


def quantile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) with linear interpolation (numpy's default); ``None`` if empty."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile q must be in [0, 1], got {q}")
    if not values:
        return None
    ordered = sorted(float(v) for v in values)
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def wilson_interval(successes: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (default: 95%).

    ``n == 0`` gives the uninformative ``(0.0, 1.0)``. The bounds are exactly 0 when
    ``successes == 0`` and exactly 1 when ``successes == n``.
    """
    if n < 0 or successes < 0 or successes > n:
        raise ValueError(f"need 0 <= successes <= n, got successes={successes}, n={n}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


def first_episodes(
    records: Iterable[Mapping[str, Any]], limit: int | None
) -> list[Mapping[str, Any]]:
    """The records of episodes ``0 .. limit - 1`` (all of them when ``limit`` is ``None``).

    A run asked for ``limit`` episodes reports exactly these, however many more an earlier,
    longer run left in its folder.
    """
    return list(records) if limit is None else [r for r in records if r["episode"] < limit]


def compute_stats(
    episodes: Iterable[Mapping[str, Any]],
    errors: Iterable[Mapping[str, Any]] = (),
    limit: int | None = None,
) -> dict[str, Any]:
    """Summary of validated episode records (and of the error records of ``errors.jsonl``);
    with ``limit``, of episodes ``0 .. limit - 1`` only (:func:`first_episodes`).

    Keys: ``n``, ``n_correct``, ``accuracy`` (``None`` when ``n == 0``), ``acc_ci_low`` /
    ``acc_ci_high`` (95% Wilson), ``mean_score``, ``mean_reward``, ``meters`` (per meter in
    :data:`METERS` plus any extra meters present in every episode: ``mean``, ``p50``, ``p95``,
    ``sum``), ``end_reasons`` (counts of every end reason), ``failures`` (counts of the end
    reasons other than ``"answered"``), ``n_failed``, ``wall_time_s`` (sum of episode wall
    times), ``episodes`` (sorted indices), ``n_grade_errors`` (episodes whose grader failed and
    scored 0: a ``grade_error`` in the record), ``n_errors`` (failed attempts in
    ``errors.jsonl``), ``errors`` (their counts by end reason) and ``errored_episodes`` (sorted
    indices of failed episodes without a result yet: a rerun plays them again).

    Sums run in episode order, so the figures do not depend on the order episodes finished in.
    """
    eps = sorted(first_episodes(episodes, limit), key=lambda e: e["episode"])
    errs = first_episodes(errors, limit)
    n = len(eps)
    n_correct = sum(1 for e in eps if e["correct"])
    low, high = wilson_interval(n_correct, n)
    names = list(METERS)
    if eps:
        common = set.intersection(*(set(e["meters"]) for e in eps))
        names += sorted(common - set(METERS))
    meters: dict[str, dict[str, float | None]] = {}
    for name in names:
        vals = [float(e["meters"][name]) for e in eps]
        meters[name] = {
            "mean": sum(vals) / n if n else None,
            "p50": quantile(vals, 0.5),
            "p95": quantile(vals, 0.95),
            "sum": sum(vals),
        }
    reasons = Counter(e["end_reason"] for e in eps)
    failures = {k: v for k, v in sorted(reasons.items()) if k != ANSWERED}
    return {
        "schema_version": SCHEMA_VERSION,
        "n": n,
        "n_correct": n_correct,
        "accuracy": n_correct / n if n else None,
        "acc_ci_low": low,
        "acc_ci_high": high,
        "mean_score": sum(e["score"] for e in eps) / n if n else None,
        "mean_reward": sum(e["reward"] for e in eps) / n if n else None,
        "meters": meters,
        "end_reasons": dict(sorted(reasons.items())),
        "failures": failures,
        "n_failed": sum(failures.values()),
        "wall_time_s": sum(float(e["meters"]["wall_time_s"]) for e in eps),
        "episodes": [e["episode"] for e in eps],
        "n_grade_errors": sum(1 for e in eps if e.get("grade_error")),
        "n_errors": len(errs),
        "errors": dict(sorted(Counter(e["end_reason"] for e in errs).items())),
        "errored_episodes": sorted({e["episode"] for e in errs} - {e["episode"] for e in eps}),
    }


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
    raw = _read_run_file(path)
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


_HASH_SUFFIX = re.compile(r"__([0-9a-f]{8})$")


def spec_of_folder(folder: str | Path, spec_file: Mapping[str, Any]) -> RunSpec:
    """The :class:`RunSpec` in a run folder's spec file (:func:`read_run_spec`), checked
    against the folder's identity.

    The identity is the spec hash taken when the folder was made: ``spec_hash`` in the file
    and the hash that ends the folder name (:attr:`RunSpec.run_id`). A spec edited afterwards
    no longer hashes to them and would put the folder's episodes under another label, so it
    is refused. (This catches edits, not forgery: whoever also rewrites both hashes can
    relabel a folder; run folders are not signed.)

    Raises:
        CorruptRunError: the spec is malformed.
        RunSpecEditedError: the spec does not hash to the folder's identity.
    """
    folder = Path(folder)
    where = folder / SPEC_FILE
    try:
        spec = RunSpec.from_dict(spec_file["spec"])
    except (TypeError, ResultsError) as exc:
        raise CorruptRunError(f"{where}: bad spec: {exc}") from exc
    named = _HASH_SUFFIX.search(folder.name)
    claims = [("its 'spec_hash'", spec_file.get("spec_hash"))]
    claims.append(("the folder name", named.group(1) if named else None))
    for what, claimed in claims:
        if claimed is not None and claimed != spec.spec_hash:
            raise RunSpecEditedError(
                f"{where}: the spec hashes to {spec.spec_hash} but {what} says {claimed!r}: "
                "it was edited after the run was made and would relabel its episodes; restore "
                "the original spec, or rerun into a new folder"
            )
    return spec


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
        raw = _read_run_file(Path(folder) / STATS_FILE)
        written = None if raw is None else json.loads(raw.decode("utf-8"))
    except (ResultsError, ValueError, RecursionError):
        return False
    if not isinstance(written, dict):
        return False
    written = {k: v for k, v in written.items() if k not in ("run_id", "updated")}
    return written == _json_normalise(stats)


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
        self._handle = _open_append(self.episodes_path)
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
        data = _read_run_file(path)
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
            with _open_append(path) as handle:
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
        _append_line(self._handle, encode_episode_line(clean))
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
            self._error_handle = _open_append(self.errors_path)
        _append_line(self._error_handle, encode_episode_line(clean))
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
