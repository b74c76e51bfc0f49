"""Episodes as data: the result of one episode, its record schema, and the one statistics function.

:class:`EpisodeResult` is what the rollout driver yields for a finished episode;
:meth:`EpisodeResult.to_record` is its record, one line of a run folder's ``episodes.jsonl``,
whose schema :func:`validate_episode` checks. :func:`compute_stats` summarises records (accuracy
with its Wilson interval, every meter's mean / p50 / p95, end reasons): the run store's
``stats.json``, the leaderboard's rows and the trainer's evaluation logs all come from it.
"""

from __future__ import annotations

import json
import math
import numbers
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from selfcest_env.budget import LATER_METERS, METER_NAMES
from selfcest_env.trace import EpisodeTrace
from selfcest_env.usage_audit import add_audits, audit_problem

#: Integer meters every episode record carries in ``record["meters"]`` (the ledger's meters).
INT_METERS: tuple[str, ...] = METER_NAMES

#: Every meter an episode record must carry: the integer meters plus ``wall_time_s`` (float).
METERS: tuple[str, ...] = (*INT_METERS, "wall_time_s")

#: The cost meters that leaderboards draw Pareto frontiers against (mean over episodes).
COST_METERS: tuple[str, ...] = ("gen_tokens", "critical_path_tokens", "peak_context_tokens")

#: The ``end_reason`` of an episode in which the root answered (every other one is a failure).
ANSWERED = "answered"


class EpisodeRecordError(ValueError):
    """An episode record does not follow the schema of :func:`validate_episode`."""


@dataclass
class EpisodeResult:
    """The outcome of one episode, in the shape of a run folder's ``episodes.jsonl`` line."""

    episode: int
    task_id: str
    seed: int
    correct: bool
    score: float
    reward: float
    end_reason: str
    answer: str
    meters: dict[str, Any]
    trace: dict[str, Any] | None = None
    error: str | None = None
    grade_error: str | None = None
    usage_audit: dict[str, int] | None = None

    def episode_trace(self) -> EpisodeTrace:
        """The trace as typed data (:class:`~selfcest_env.trace.EpisodeTrace`).

        Raises:
            ValueError: the result holds no trace (play with ``keep_traces=True``).
        """
        if self.trace is None:
            raise ValueError("this result holds no trace: play it with keep_traces=True")
        return EpisodeTrace.from_dict(self.trace)

    def to_record(self, with_trace: bool = False) -> dict[str, Any]:
        """A JSON-ready dictionary (the trace only when asked for: it is large).

        ``error`` (what ended an aborted episode), ``grade_error`` (why grading scored 0) and
        ``usage_audit`` (:mod:`~selfcest_env.usage_audit`) appear only when set.
        """
        record: dict[str, Any] = {
            "episode": self.episode,
            "task_id": self.task_id,
            "seed": self.seed,
            "correct": self.correct,
            "score": self.score,
            "reward": self.reward,
            "end_reason": self.end_reason,
            "answer": self.answer,
            "meters": dict(self.meters),
        }
        if self.error is not None:
            record["error"] = self.error
        if self.grade_error is not None:
            record["grade_error"] = self.grade_error
        if self.usage_audit is not None:
            record["usage_audit"] = dict(self.usage_audit)
        if with_trace:
            record["trace"] = self.trace
        return record


def json_ready(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples become lists, keys become strings).

    Raises:
        TypeError, ValueError: ``value`` is not JSON-serialisable (or holds NaN or infinity).
    """
    return json.loads(json.dumps(value, allow_nan=False))


# --------------------------------------------------------------------------------------------
# Records
def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not _is_bool(value)


def is_int64(value: Any) -> bool:
    """Whether ``value`` is an int (not a bool) that fits a signed 64-bit integer (what
    leaderboard columns hold)."""
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
    ``answer`` (str), ``meters`` (dict with every name in :data:`INT_METERS` as an int >= 0,
    those of :data:`~selfcest_env.budget.LATER_METERS` optional, and ``wall_time_s`` as a float
    >= 0). Extra top-level keys are kept if JSON-serialisable;
    extra meters are kept if they are numbers; an optional ``usage_audit`` must be one
    (:func:`~selfcest_env.usage_audit.audit_problem`).

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
            if not is_int64(value):
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
    audit = extras.get("usage_audit")
    if audit is not None and (problem := audit_problem(audit)) is not None:
        problems.append(f"'usage_audit' {problem}")
    if not problems and extras:
        try:
            out.update(json_ready(extras))
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


def _validate_meters(value: Any, problems: list[str]) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        problems.append(f"'meters' must be a dict, got {type(value).__name__}")
        return {}
    meters: dict[str, Any] = {}
    for name in INT_METERS:
        if name not in value:
            if name not in LATER_METERS:  # a record written before the meter existed
                problems.append(f"missing meter {name!r}")
        elif not is_int64(value[name]) or value[name] < 0:
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
    ``acc_ci_high`` (95% Wilson), ``mean_score``, ``mean_reward``, ``usage_audit`` (the sum of
    the episodes' :mod:`~selfcest_env.usage_audit` audits; ``None`` when no backend reported
    usage), ``n_answered`` (episodes whose root answered, with a non-empty answer),
    ``n_truncated`` (episodes in which a limit cut at least one turn), ``meters`` (per meter in
    :data:`METERS` plus any extra meters present in every episode: ``mean``, ``p50``, ``p95``,
    ``sum``; all ``None`` for a meter of :data:`~selfcest_env.budget.LATER_METERS` that records
    written before it lack), ``end_reasons`` (counts of every end reason), ``failures`` (counts
    of the end reasons other than ``"answered"``), ``n_failed``, ``wall_time_s`` (sum of episode
    wall times), ``episodes`` (sorted indices), ``n_grade_errors`` (episodes whose grader failed
    and scored 0: a ``grade_error`` in the record), ``n_errors`` (failed attempts in
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
        if not all(name in e["meters"] for e in eps):  # a meter newer than some records
            meters[name] = {"mean": None, "p50": None, "p95": None, "sum": None}
            continue
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
        "n": n,
        "n_correct": n_correct,
        "accuracy": n_correct / n if n else None,
        "acc_ci_low": low,
        "acc_ci_high": high,
        "mean_score": sum(e["score"] for e in eps) / n if n else None,
        "mean_reward": sum(e["reward"] for e in eps) / n if n else None,
        "usage_audit": add_audits(e.get("usage_audit") for e in eps),
        "n_answered": sum(1 for e in eps if e["end_reason"] == ANSWERED and e["answer"].strip()),
        "n_truncated": sum(1 for e in eps if e["meters"]["truncated_turns"] > 0),
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
