"""Training curves of a run folder: the points read from the logs, the figure, the CLI."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from selfcest_env.agents.trained_controller import BUNDLED_DELEGATE_ADAPTER, bundled_adapter_dir
from selfcest_env.harness.curves import (
    EVAL_LOG,
    MAX_ROWS,
    TRAIN_LOG,
    eval_curves,
    plot_training_curves,
    rollout_curves,
)
from tests.harness.test_cli import run_cli

PNG = b"\x89PNG\r\n\x1a\n"
EVAL_HEADER = ["phase", "step", "split", "variant", "accuracy", "spawn_rate", "clones_mean"]


def write_csv(path: Path, header: list[str], rows: list[list[object]]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)


def test_points_follow_the_phases_and_steps_of_the_eval_log(tmp_path: Path) -> None:
    write_csv(
        tmp_path / EVAL_LOG,
        EVAL_HEADER,
        [
            ["grpo", 10, "test", "long", 0.5, 0.9, 1.8],
            ["init", 0, "test", "long", 0.0, 0.0, 0.0],
            ["imitation", 0, "test", "long", 0.4, 0.6, 1.2],
            ["init", 0, "test", "short", 0.2, 0.0, 0.0],
            ["grpo", 20, "test", "short", 1.0, "", 0.1],  # an empty cell: no point
            ["grpo", 30, "test", "short", "nan", 0.1, 0.1],  # not finite: no point
            ["warmup", 5, "test", "short", 0.3, 0.3, 0.3],  # unknown phase: skipped
            ["grpo", "ten", "test", "short", 0.3, 0.3, 0.3],  # not a step: skipped
        ],
    )
    curves, start = eval_curves(tmp_path / EVAL_LOG)
    assert start == -max(1.0, 0.06 * 30) and start < 0
    long_accuracy = curves["accuracy"]["long"]
    assert long_accuracy.xs == [start, 0.0, 10.0] and long_accuracy.ys == [0.0, 0.4, 0.5]
    assert curves["spawn_rate"]["short"].xs == [start, 30.0]
    assert curves["accuracy"]["short"].xs == [start, 20.0]
    assert curves["clones_mean"]["short"].ys == [0.0, 0.1, 0.1]


def test_several_splits_name_their_lines_by_split_and_variant(tmp_path: Path) -> None:
    write_csv(
        tmp_path / EVAL_LOG,
        EVAL_HEADER,
        [["init", 0, "dev", "train", 0.1, 0, 0], ["init", 0, "test", "train", 0.2, 0, 0]],
    )
    curves, _ = eval_curves(tmp_path / EVAL_LOG)
    assert sorted(curves["accuracy"]) == ["dev / train", "test / train"]


def test_rollout_curves_read_each_step(tmp_path: Path) -> None:
    write_csv(
        tmp_path / TRAIN_LOG,
        ["step", "reward_mean", "accuracy", "spawn_rate"],
        [[1, 0.5, 0.6, 0.4], [2, "x", 0.7, 0.3], ["", 1, 1, 1]],
    )
    curves = rollout_curves(tmp_path / TRAIN_LOG)
    assert curves["reward_mean"].xs == [1.0] and curves["accuracy"].ys == [0.6, 0.7]


def test_the_bundled_adapters_logs_plot(tmp_path: Path) -> None:
    """The real logs of a real run (the bundled delegating controller's) give a PNG with the
    rollout panel; its eval log holds init, imitation and GRPO points for five variants."""
    folder = bundled_adapter_dir(BUNDLED_DELEGATE_ADAPTER)
    curves, _ = eval_curves(folder / EVAL_LOG)
    assert set(curves["spawn_rate"]) == {"train", "short-sum", "easy", "long-sum", "longer-sum"}
    assert len(curves["spawn_rate"]["long-sum"].xs) == 3  # init, imitation, step 10
    written = plot_training_curves(folder, tmp_path, formats=("png", "svg"))
    assert [p.name for p in written] == ["curves.png", "curves.svg"]
    assert written[0].read_bytes().startswith(PNG)
    assert b"long-sum" in written[1].read_bytes()


def test_hostile_logs_are_bounded_and_escaped(tmp_path: Path) -> None:
    rows = [["grpo", step, "test", "v\x1b[31m$x$", 0.5, 0.5, 1] for step in range(MAX_ROWS + 5)]
    write_csv(tmp_path / EVAL_LOG, EVAL_HEADER, rows)
    curves, _ = eval_curves(tmp_path / EVAL_LOG)
    (line,) = curves["accuracy"].values()
    assert len(line.xs) == MAX_ROWS
    svg = plot_training_curves(tmp_path, tmp_path / "out", formats=("svg",))[0].read_text()
    assert "\x1b" not in svg and "\\x1b[31m" in svg


def test_a_log_without_evaluations_is_a_results_error(tmp_path: Path) -> None:
    from selfcest_env.harness.errors import ResultsError

    write_csv(tmp_path / EVAL_LOG, EVAL_HEADER, [])
    with pytest.raises(ResultsError, match="has no evaluation rows"):
        plot_training_curves(tmp_path)


def test_selfcest_plot_on_a_run_folder_writes_its_curves(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    folder = bundled_adapter_dir(BUNDLED_DELEGATE_ADAPTER)
    assert run_cli("plot", str(folder), "--out", str(tmp_path), "--formats", "png") == 0
    assert (tmp_path / "curves.png").read_bytes().startswith(PNG)
    assert "curves.png" in capsys.readouterr().out
    code = run_cli("plot", str(folder), "--out", str(tmp_path), "--meters", "gen_tokens")
    assert code == 2 and "--meters applies to a leaderboard CSV" in capsys.readouterr().err
