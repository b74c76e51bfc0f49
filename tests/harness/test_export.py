"""``selfcest export``: run folders as episode and context tables (Parquet, JSON lines, a
Hugging Face dataset), played and read as a user would, by real ``selfcest`` processes."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pyarrow.parquet as pq
import pytest

from selfcest_env.harness.export import (
    CONTEXT_SCHEMA,
    EPISODE_SCHEMA,
    as_dataset,
    export_runs,
    export_tables,
)
from selfcest_env.harness.store import EPISODES_FILE
from tests.harness.cli_args import scripted_run_args
from tests.harness.test_run_integrity import cli, run_folders

EPISODES = 4


@pytest.fixture(scope="module")
def played(tmp_path_factory) -> Path:
    """Both scripted agents, 4 episodes each, traces kept."""
    out = tmp_path_factory.mktemp("runs")
    proc = cli(*scripted_run_args(out, EPISODES, "--traces"))
    assert proc.returncode == 0, proc.stderr
    return out


def test_export_writes_one_row_per_episode_and_one_per_context(played: Path, tmp_path: Path):
    proc = cli("export", str(played), "--out", str(tmp_path / "x"))
    assert proc.returncode == 0, proc.stderr
    assert "episodes.parquet: 8 rows" in proc.stdout
    episodes = pq.read_table(tmp_path / "x" / "episodes.parquet")
    contexts = pq.read_table(tmp_path / "x" / "contexts.parquet")
    assert episodes.schema.equals(EPISODE_SCHEMA) and contexts.schema.equals(CONTEXT_SCHEMA)
    rows = episodes.to_pylist()
    assert len(rows) == 2 * EPISODES and all(row["has_trace"] for row in rows)
    assert {row["agent"] for row in rows} == {"scripted-monolithic", "scripted-delegate"}
    assert all(row["variant"] == "easy" and row["correct"] for row in rows)
    by_episode: dict[tuple[str, int], list[dict]] = {}
    for context in contexts.to_pylist():
        by_episode.setdefault((context["run_id"], context["episode"]), []).append(context)
    for row in rows:
        tree = by_episode[(row["run_id"], row["episode"])]
        # One context per node of the tree, and the ledger's tokens are the contexts' sum.
        assert len(tree) == 1 + row["clones"]
        assert sum(c["gen_tokens"] for c in tree) == row["gen_tokens"]
        assert sum(c["prompt_tokens"] for c in tree) == row["prompt_tokens"]
        root = tree[0]
        assert root["context_id"] == 0 and root["parent_id"] is None and root["depth"] == 0
        assert root["turns"][-1]["text"].endswith(root["answer"])
        assert [m["role"] for m in root["messages"]][:2] == ["system", "user"]
        for clone in tree[1:]:
            assert clone["parent_id"] == 0 and clone["depth"] == 1
            assert clone["context_id"] in root["turns"][0]["children"]


def test_jsonl_and_the_dataset_hold_the_same_rows(played: Path, tmp_path: Path):
    written = export_runs(played, tmp_path / "j", "jsonl")
    lines = written["contexts"][0].read_text(encoding="utf-8").splitlines()
    episodes, contexts = export_tables(played)
    assert [json.loads(line) for line in lines] == contexts.to_pylist()
    assert written["episodes"][1] == episodes.num_rows == 2 * EPISODES
    dataset = as_dataset(contexts)
    assert isinstance(dataset, datasets.Dataset) and dataset.num_rows == contexts.num_rows
    assert dataset[0] == contexts.slice(0, 1).to_pylist()[0]


def test_without_traces_only_episodes_are_written(tmp_path: Path):
    runs = tmp_path / "runs"
    assert cli(*scripted_run_args(runs, 2)).returncode == 0
    proc = cli("export", str(runs))
    assert proc.returncode == 0, proc.stderr
    assert "rerun with --traces" in proc.stdout
    assert (runs / "export" / "episodes.parquet").is_file()
    assert not (runs / "export" / "contexts.parquet").exists()
    rows = pq.read_table(runs / "export" / "episodes.parquet").to_pylist()
    assert len(rows) == 4 and not any(row["has_trace"] for row in rows)


def test_a_bad_trace_is_left_out_and_text_stays_data(tmp_path: Path, caplog):
    runs = tmp_path / "runs"
    assert cli(*scripted_run_args(runs, 2, "--traces")).returncode == 0
    folder = run_folders(runs)[0]
    path = folder / EPISODES_FILE
    records = [json.loads(line) for line in path.read_text().splitlines()]
    records[0]["trace"]["contexts"][0]["depth"] = "deep"  # not a trace any more
    records[1]["answer"] = "\x1b[31m=HYPERLINK(1)\ud800"  # escapes, a formula, a lone surrogate
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    episodes, contexts = export_tables(runs)
    assert "left out the trace of episode 0" in caplog.text
    exported = {(r["run_id"], r["episode"]) for r in contexts.to_pylist()}
    assert (folder.name, 0) not in exported and (folder.name, 1) in exported
    answers = {r["answer"] for r in episodes.to_pylist() if r["run_id"] == folder.name}
    assert "\x1b[31m=HYPERLINK(1)\ufffd" in answers


def test_an_empty_folder_exports_empty_tables_of_the_same_schema(tmp_path: Path):
    written = export_runs(tmp_path, tmp_path / "out")
    assert list(written) == ["episodes"] and written["episodes"][1] == 0
    assert pq.read_table(written["episodes"][0]).schema.equals(EPISODE_SCHEMA)


def test_bad_arguments_are_one_line_errors(tmp_path: Path):
    proc = cli("export", str(tmp_path / "missing"))
    assert proc.returncode == 2 and "is not a folder" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    proc = cli("export", str(tmp_path), "--format", "csv")
    assert proc.returncode == 2 and "invalid choice" in proc.stderr
