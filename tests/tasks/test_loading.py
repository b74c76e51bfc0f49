"""The one reader of local task files, shared by the math and QA loaders."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from selfcest_env.tasks.loading import read_local_rows
from selfcest_env.tasks.math.datasets import AIMETask, GSM8KTask
from selfcest_env.tasks.qa.datasets import MuSiQueTask

ROWS = [
    {"id": "a", "question": "Q1?", "answer": "033", "year": 2024, "tags": ["x", "y"]},
    {"id": "b", "question": "Q2?", "answer": "7", "year": None, "tags": []},
]


def _write(path: Path, rows: list[dict] = ROWS) -> Path:
    suffix = path.suffix
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    elif suffix == ".json":
        path.write_text(json.dumps(rows), encoding="utf-8")
    elif suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        with path.open("w", encoding="utf-8", newline="") as handle:
            writer = csv.DictWriter(handle, list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet"])
def test_json_and_parquet_rows_come_back_as_written(tmp_path: Path, suffix: str) -> None:
    path = _write(tmp_path / f"rows{suffix}")
    assert read_local_rows(path, "dev") == {"dev": ROWS}


def test_csv_values_are_text_as_written_and_empty_cells_missing(tmp_path: Path) -> None:
    rows = [
        {"question": "Q1?", "answer": "033", "year": "2024"},
        {"question": "Q2?", "answer": "3.50", "year": ""},
    ]
    path = _write(tmp_path / "rows.csv", rows)
    assert read_local_rows(path, "test") == {
        "test": [rows[0], {"question": "Q2?", "answer": "3.50", "year": None}]
    }


def test_other_json_layouts(tmp_path: Path) -> None:
    wrapped = tmp_path / "wrapped.json"
    wrapped.write_text(json.dumps({"version": 1, "data": ROWS}), encoding="utf-8")
    one = tmp_path / "one.json"
    one.write_text(json.dumps(ROWS[0]), encoding="utf-8")
    lines = tmp_path / "lines.json"
    lines.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n\n", encoding="utf-8")
    assert read_local_rows(wrapped, "test")["test"] == ROWS
    assert read_local_rows(one, "test")["test"] == ROWS[:1]
    assert read_local_rows(lines, "test")["test"] == ROWS


def test_directories_and_mappings(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    _write(folder / "b.jsonl", ROWS[1:])
    _write(folder / "a.json", ROWS[:1])
    (folder / "notes.txt").write_text("not rows")
    assert read_local_rows(folder, "train") == {"train": ROWS}  # by name, other files skipped
    extra = _write(tmp_path / "extra.parquet", ROWS[:1])
    assert read_local_rows({"train": folder, "test": [extra, folder / "b.jsonl"]}, "dev") == {
        "train": ROWS,
        "test": [ROWS[0], ROWS[1]],
    }


def test_errors_name_the_file_and_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="missing.jsonl does not exist"):
        read_local_rows(tmp_path / "missing.jsonl", "test")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="no .jsonl/.json/.parquet/.csv files in directory"):
        read_local_rows(empty, "test")
    text = tmp_path / "rows.txt"
    text.write_text("x")
    with pytest.raises(ValueError, match=r"rows.txt: unknown file format; use a file ending in"):
        read_local_rows(text, "test")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 1}\n{oops}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not a JSON line"):
        read_local_rows(bad, "test")
    scalar = tmp_path / "scalar.json"
    scalar.write_text("3", encoding="utf-8")
    with pytest.raises(ValueError, match="holds a JSON int, not a list of rows"):
        read_local_rows(scalar, "test")


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet", ".csv"])
def test_math_and_qa_loaders_read_every_format(tmp_path: Path, suffix: str) -> None:
    aime = AIMETask(path=_write(tmp_path / f"aime{suffix}"))
    assert [aime.get("test", i).answer for i in range(2)] == ["33", "7"]
    assert aime.get("test", 0).metadata["year"] == 2024
    gsm = [{"question": "1+1?", "answer": "#### 2"}, {"question": "2+2?", "answer": "#### 4"}]
    assert GSM8KTask(path=_write(tmp_path / f"gsm8k_train{suffix}", gsm)).size("train") == 2
    musique = [
        {
            "id": "2hop__1",
            "question": "Q?",
            "answer": "A",
            "paragraphs": json.dumps([{"idx": 0, "title": "T", "paragraph_text": "A."}]),
        }
    ]
    assert MuSiQueTask(path=_write(tmp_path / f"musique{suffix}", musique)).size("test") == 1
