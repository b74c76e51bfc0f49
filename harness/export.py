"""Run folders as tables for analysis and trainers: one row per episode, one per context.

:func:`export_runs` reads every run folder below a folder (as ``selfcest leaderboard`` does:
unreadable folders are skipped with a warning) and writes ``episodes.parquet`` and, where
episodes kept their trace (``selfcest run --traces``), ``contexts.parquet``; ``jsonl`` instead
of ``parquet`` writes one JSON object per line. :func:`export_tables` gives the two Arrow
tables and :func:`as_dataset` a Hugging Face ``datasets.Dataset`` of either.

The columns are :data:`EPISODE_SCHEMA` and :data:`CONTEXT_SCHEMA` (types fixed, so that every
export of any runs has the same schema):

* an episode row: the run's identity (``run_id``, ``env_id``, ``source``, ``split``,
  ``variant``, ``agent``, ``model``, ``backend``, ``budget``, ``seed``), the episode
  (``episode``, ``task_id``, ``episode_seed``, ``correct``, ``score``, ``reward``,
  ``end_reason``, ``answer``, ``grade_error``), every meter of the ledger and
  ``wall_time_s``, and ``has_trace``;
* a context row: ``run_id``, ``episode``, ``task_id``, the context (``context_id``,
  ``parent_id``, ``depth``, ``label``, ``objective``, ``may_spawn``, ``status``, ``answer``,
  ``marked``, ``failure``, ``reward``), its usage (``gen_tokens``, ``prompt_tokens``,
  ``critical_path_tokens``, ``peak_context_tokens``), its chat (``messages``: ``role`` and
  ``content``) and its ``turns`` (``index``, ``prompt_tokens``, ``gen_tokens``, ``text``,
  ``token_ids``, ``logprobs``, ``truncated``, ``children``).

Text stays as the run folder holds it (data, not terminal output; a lone surrogate, which UTF-8
cannot hold, becomes U+FFFD); a trace that does not read as one
(:class:`~selfcest_env.trace.TraceError`) is left out with a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa

from selfcest_env.budget import METER_NAMES
from selfcest_env.harness.errors import ResultsError
from selfcest_env.harness.files import atomic_write_bytes
from selfcest_env.harness.leaderboard import SkippedRun, identity_columns, scan_run_folders
from selfcest_env.harness.store import RunData, load_run
from selfcest_env.protocol import clean_text
from selfcest_env.trace import EpisodeTrace, TraceError

logger = logging.getLogger(__name__)

__all__ = [
    "CONTEXT_SCHEMA",
    "EPISODE_SCHEMA",
    "ExportFormat",
    "as_dataset",
    "export_runs",
    "export_tables",
]

ExportFormat = Literal["parquet", "jsonl"]

_RUN_FIELDS = [
    pa.field("run_id", pa.string()),
    pa.field("env_id", pa.string()),
    pa.field("source", pa.string()),
    pa.field("split", pa.string()),
    pa.field("variant", pa.string()),
    pa.field("agent", pa.string()),
    pa.field("model", pa.string()),
    pa.field("backend", pa.string()),
    pa.field("budget", pa.string()),
    pa.field("seed", pa.int64()),
]

#: One row per episode (see the module docstring).
EPISODE_SCHEMA = pa.schema(
    [
        *_RUN_FIELDS,
        pa.field("episode", pa.int64()),
        pa.field("task_id", pa.string()),
        pa.field("episode_seed", pa.int64()),
        pa.field("correct", pa.bool_()),
        pa.field("score", pa.float64()),
        pa.field("reward", pa.float64()),
        pa.field("end_reason", pa.string()),
        pa.field("answer", pa.string()),
        pa.field("grade_error", pa.string()),
        *(pa.field(name, pa.int64()) for name in METER_NAMES),
        pa.field("wall_time_s", pa.float64()),
        pa.field("has_trace", pa.bool_()),
    ]
)

_TURN = pa.struct(
    [
        pa.field("index", pa.int64()),
        pa.field("prompt_tokens", pa.int64()),
        pa.field("gen_tokens", pa.int64()),
        pa.field("text", pa.string()),
        pa.field("token_ids", pa.list_(pa.int64())),
        pa.field("logprobs", pa.list_(pa.float64())),
        pa.field("truncated", pa.bool_()),
        pa.field("children", pa.list_(pa.int64())),
    ]
)

#: One row per context of every episode that kept its trace (see the module docstring).
CONTEXT_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string()),
        pa.field("episode", pa.int64()),
        pa.field("task_id", pa.string()),
        pa.field("context_id", pa.int64()),
        pa.field("parent_id", pa.int64()),
        pa.field("depth", pa.int64()),
        pa.field("label", pa.string()),
        pa.field("objective", pa.string()),
        pa.field("may_spawn", pa.bool_()),
        pa.field("status", pa.string()),
        pa.field("answer", pa.string()),
        pa.field("marked", pa.bool_()),
        pa.field("failure", pa.string()),
        pa.field("reward", pa.float64()),
        pa.field("gen_tokens", pa.int64()),
        pa.field("prompt_tokens", pa.int64()),
        pa.field("critical_path_tokens", pa.int64()),
        pa.field("peak_context_tokens", pa.int64()),
        pa.field(
            "messages",
            pa.list_(pa.struct([pa.field("role", pa.string()), pa.field("content", pa.string())])),
        ),
        pa.field("turns", pa.list_(_TURN)),
    ]
)


def _runs(root: str | Path) -> Iterator[RunData]:
    """The readable run folders at or below ``root``; the others logged and left out."""
    folders, skipped = scan_run_folders(root)
    for folder in folders:
        try:
            yield load_run(folder)
        except (ResultsError, OSError) as exc:
            skipped.append(SkippedRun(folder, str(exc)))
    for skip in skipped:
        logger.warning("skipped run folder %s: %s", skip.path, skip.reason)


def _episode_row(identity: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    meters = record["meters"]
    return {
        **identity,
        "episode": record["episode"],
        "task_id": record["task_id"],
        "episode_seed": record["seed"],
        "correct": record["correct"],
        "score": record["score"],
        "reward": record["reward"],
        "end_reason": record["end_reason"],
        "answer": record["answer"],
        "grade_error": record.get("grade_error"),
        **{name: meters.get(name) for name in METER_NAMES},  # None: a meter newer than the run
        "wall_time_s": meters["wall_time_s"],
        "has_trace": "trace" in record,
    }


def _context_rows(run_id: str, record: dict[str, Any]) -> list[dict[str, Any]]:
    trace = EpisodeTrace.from_dict(record["trace"])
    return [
        {
            "run_id": run_id,
            "episode": record["episode"],
            "task_id": trace.task_id,
            "context_id": context.id,
            "parent_id": context.parent,
            "depth": context.depth,
            "label": context.label,
            "objective": context.objective,
            "may_spawn": context.may_spawn,
            "status": context.status,
            "answer": context.answer,
            "marked": context.marked,
            "failure": context.failure,
            "reward": context.reward,
            "gen_tokens": context.usage.gen_tokens,
            "prompt_tokens": context.usage.prompt_tokens,
            "critical_path_tokens": context.usage.critical_path_tokens,
            "peak_context_tokens": context.usage.peak_context_tokens,
            "messages": [dict(message) for message in context.messages],
            "turns": [
                {name: row[name] for name in _TURN.names}
                for row in (turn.to_dict() for turn in context.turns)
            ],
        }
        for context in trace.contexts
    ]


def export_tables(root: str | Path) -> tuple[pa.Table, pa.Table]:
    """The episode table (one row per recorded episode) and the context table (one row per
    context of every episode that kept its trace) of every readable run folder at or below
    ``root``, in one pass over the folders."""
    episodes: list[dict[str, Any]] = []
    contexts: list[dict[str, Any]] = []
    for run in _runs(root):
        identity = identity_columns(run.path, run.spec)
        for record in sorted(run.episodes, key=lambda e: e["episode"]):
            episodes.append(_clean(_episode_row(identity, record)))
            if "trace" not in record:
                continue
            try:
                contexts.extend(_clean(row) for row in _context_rows(run.path.name, record))
            except TraceError as exc:
                logger.warning(
                    "left out the trace of episode %s of %s: %s", record["episode"], run.path, exc
                )
    return (
        pa.Table.from_pylist(episodes, schema=EPISODE_SCHEMA),
        pa.Table.from_pylist(contexts, schema=CONTEXT_SCHEMA),
    )


def _clean(value: Any) -> Any:
    """``value`` with every lone surrogate in its strings replaced (Arrow strings are UTF-8)."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, list):
        return [_clean(item) for item in value]
    if isinstance(value, dict):
        return {key: _clean(item) for key, item in value.items()}
    return value


def as_dataset(table: pa.Table) -> Any:
    """``table`` as a Hugging Face ``datasets.Dataset`` (same columns and types)."""
    import datasets

    return datasets.Dataset(table)


def _encode(table: pa.Table, fmt: ExportFormat) -> bytes:
    sink = pa.BufferOutputStream()
    if fmt == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, sink)
    else:
        import json

        lines = (json.dumps(row, ensure_ascii=False) + "\n" for row in table.to_pylist())
        sink.write("".join(lines).encode("utf-8"))
    return sink.getvalue().to_pybytes()


def export_runs(
    root: str | Path, out: str | Path, fmt: ExportFormat = "parquet"
) -> dict[str, tuple[Path, int]]:
    """Write ``episodes.<fmt>`` and, when any episode kept its trace, ``contexts.<fmt>`` into
    ``out``; returns ``{"episodes": (path, rows), "contexts": (path, rows)}`` for the files
    written (each written atomically).

    Raises:
        ResultsError: ``root`` is not a folder.
    """
    if fmt not in ("parquet", "jsonl"):
        raise ValueError(f"unknown export format {fmt!r}; valid: parquet, jsonl")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, tuple[Path, int]] = {}
    episodes, contexts = export_tables(root)
    for name, table in (("episodes", episodes), ("contexts", contexts)):
        if name == "contexts" and table.num_rows == 0:
            continue
        path = out / f"{name}.{fmt}"
        atomic_write_bytes(path, _encode(table, fmt))
        written[name] = (path, table.num_rows)
    return written
