"""Run folders: spec files, append-only episodes, resume after a kill, stats."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from selfcest_env.episodes import (
    COST_METERS,
    INT_METERS,
    METERS,
    EpisodeRecordError,
    compute_stats,
    quantile,
    validate_episode,
)
from selfcest_env.harness.errors import (
    CorruptRunError,
    DuplicateEpisodeError,
    RunFolderBusyError,
    RunSpecMismatchError,
)
from selfcest_env.harness.runspec import RunSpec, git_revision
from selfcest_env.harness.store import RunFolder, load_run, read_episodes


def make_spec(**overrides: Any) -> RunSpec:
    """A small spec; keyword arguments override fields."""
    fields: dict[str, Any] = {
        "env_id": "SelfCest-Math-v0",
        "source": "arithmetic",
        "split": "test",
        "agent": "monolithic",
        "agent_config": {"temperature": 0.7},
        "model": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "backend": "transformers",
        "budget": {"gen_budget": 4096, "max_depth": 1},
        "seed": 3,
        "n_episodes": 10,
    }
    fields.update(overrides)
    return RunSpec(**fields)


def make_episode(index: int, correct: bool = True, **meters: Any) -> dict[str, Any]:
    """A valid episode record with simple meters."""
    m: dict[str, Any] = {name: index for name in INT_METERS}
    m["wall_time_s"] = 0.5 * index
    m.update(meters)
    return {
        "episode": index,
        "task_id": f"task-{index}",
        "seed": 100 + index,
        "correct": correct,
        "score": float(correct),
        "reward": float(correct) - 0.1,
        "end_reason": "answered" if correct else "gen_budget",
        "answer": str(index),
        "meters": m,
    }


# ---------------------------------------------------------------------------- specs


def test_meter_constants() -> None:
    assert METERS[-1] == "wall_time_s"
    assert set(COST_METERS) <= set(METERS)
    assert len(set(METERS)) == len(METERS)


def test_run_id_is_readable_deterministic_and_sanitised() -> None:
    spec = make_spec()
    rid = spec.run_id
    assert rid == make_spec().run_id
    assert rid.startswith(
        "SelfCest-Math-v0__arithmetic__test__monolithic__HuggingFaceTB-SmolLM2-135M-Instruct__"
        "gen_budget=4096,max_depth=1__seed3__"
    )
    assert "/" not in rid and " " not in rid
    assert len(rid.rsplit("__", 1)[1]) == 8
    # any difference, even outside the readable parts, changes the id
    assert make_spec(agent_config={"temperature": 0.8}).run_id != rid
    assert make_spec(extra={"note": "x"}).run_id != rid
    # dict key order does not matter
    assert make_spec(budget={"max_depth": 1, "gen_budget": 4096}).run_id == rid
    assert make_spec(budget={"label": "4k"}).budget_label == "4k"
    assert make_spec(budget={}).budget_label == "default"
    weird = make_spec(agent="my agent/v2:../..", model="")
    assert "/" not in weird.run_id and ".." not in weird.run_id.split("__")[3]
    assert "__nomodel__" in weird.run_id


def test_spec_round_trip_and_validation() -> None:
    spec = make_spec(extra={"tags": ("a", "b")})
    again = RunSpec.from_dict(spec.to_dict())
    assert again.to_dict() == spec.to_dict()
    assert again.run_id == spec.run_id
    with pytest.raises(ValueError, match="unknown RunSpec keys"):
        RunSpec.from_dict({**spec.to_dict(), "bogus": 1})
    with pytest.raises(ValueError, match="seed"):
        make_spec(seed="3")
    with pytest.raises(ValueError, match="JSON"):
        make_spec(extra={"f": object()})
    with pytest.raises(ValueError, match="agent"):
        make_spec(agent="")


def test_run_spec_file_contents(tmp_path: Path) -> None:
    spec = make_spec()
    with RunFolder(tmp_path, spec) as run:
        assert run.path == tmp_path / spec.run_id
    data = json.loads((tmp_path / spec.run_id / "run_spec.json").read_text())
    assert data["spec"] == spec.to_dict()
    assert data["run_id"] == spec.run_id
    versions = data["environment"]["versions"]
    assert set(versions) >= {"python", "selfcest", "gymnasium", "torch", "transformers"}
    assert versions["python"].count(".") == 2
    assert "git_revision" in data["environment"]
    assert not list((tmp_path / spec.run_id).glob("*.tmp"))


def test_git_revision_never_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert git_revision(tmp_path) is None  # not a repository
    monkeypatch.setenv("PATH", str(tmp_path))  # no git executable at all
    assert git_revision() is None
    with RunFolder(tmp_path, make_spec()) as run:
        assert json.loads(run.spec_path.read_text())["environment"]["git_revision"] is None


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_revision_of_a_repository(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True, env=env)
    (tmp_path / "f").write_text("x")
    subprocess.run(["git", "add", "f"], cwd=tmp_path, check=True, env=env)
    subprocess.run(["git", "commit", "-qm", "m"], cwd=tmp_path, check=True, env=env)
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=tmp_path, check=True, capture_output=True, text=True
    ).stdout.strip()
    assert git_revision(tmp_path) == head


def test_reopen_with_different_spec_is_refused(tmp_path: Path) -> None:
    spec = make_spec()
    with RunFolder(tmp_path, spec) as run:
        run.append_episode(make_episode(0))
    other = make_spec(seed=4)
    with pytest.raises(RunSpecMismatchError, match="seed"):
        RunFolder(tmp_path, other, path=tmp_path / spec.run_id)
    # same spec resumes fine
    with RunFolder(tmp_path, make_spec()) as run:
        assert run.done_episodes() == {0}
    with RunFolder.open_existing(tmp_path / spec.run_id) as run:
        assert run.spec == spec
        assert run.done_episodes() == {0}


# ---------------------------------------------------------------------------- records


def test_validate_episode_errors() -> None:
    good = make_episode(1)
    assert validate_episode(good) == good
    bad = make_episode(1)
    del bad["answer"]
    bad["correct"] = "yes"
    bad["meters"] = {k: v for k, v in bad["meters"].items() if k != "clones"}
    with pytest.raises(EpisodeRecordError) as info:
        validate_episode(bad)
    text = str(info.value)
    assert "'answer'" in text and "'correct'" in text and "'clones'" in text
    with pytest.raises(EpisodeRecordError, match="gen_tokens"):
        validate_episode(make_episode(1, gen_tokens=-1))
    with pytest.raises(EpisodeRecordError, match="gen_tokens"):
        validate_episode(make_episode(1, gen_tokens=True))
    with pytest.raises(EpisodeRecordError, match="score"):
        validate_episode({**make_episode(1), "score": float("nan")})
    with pytest.raises(EpisodeRecordError, match="episode"):
        validate_episode({**make_episode(1), "episode": -1})
    with pytest.raises(EpisodeRecordError, match="dict"):
        validate_episode([1, 2])  # type: ignore[arg-type]


def test_validate_episode_accepts_numpy_and_extras() -> None:
    np = pytest.importorskip("numpy")
    rec = make_episode(2)
    rec["episode"] = np.int64(2)
    rec["correct"] = np.bool_(True)
    rec["score"] = np.float32(1.0)
    rec["meters"]["gen_tokens"] = np.int64(7)
    rec["meters"]["truncated_turns"] = 1
    rec["notes"] = {"k": [1, 2]}
    out = validate_episode(rec)
    assert type(out["episode"]) is int and out["correct"] is True
    assert out["meters"]["gen_tokens"] == 7 and out["meters"]["truncated_turns"] == 1
    assert out["notes"] == {"k": [1, 2]}
    json.dumps(out)


# ---------------------------------------------------------------------------- episodes


def test_append_and_reopen_no_duplicates(tmp_path: Path) -> None:
    spec = make_spec()
    with RunFolder(tmp_path, spec) as run:
        for i in (0, 1, 2):
            run.append_episode(make_episode(i))
        with pytest.raises(DuplicateEpisodeError):
            run.append_episode(make_episode(1))
        assert run.missing_episodes() == [3, 4, 5, 6, 7, 8, 9]
    with RunFolder(tmp_path, spec) as run:
        assert run.done_episodes() == {0, 1, 2}
        with pytest.raises(DuplicateEpisodeError):
            run.append_episode(make_episode(2))
        for i in run.missing_episodes():
            run.append_episode(make_episode(i))
        with pytest.raises(ValueError, match="closed"):
            run.close()
            run.append_episode(make_episode(11))
    lines = (tmp_path / spec.run_id / "episodes.jsonl").read_text().splitlines()
    indices = [json.loads(line)["episode"] for line in lines]
    assert sorted(indices) == list(range(10)) and len(indices) == 10


@pytest.mark.skipif(sys.platform == "win32", reason="flock is POSIX")
def test_second_writer_is_refused(tmp_path: Path) -> None:
    spec = make_spec()
    with RunFolder(tmp_path, spec) as run:
        with pytest.raises(RunFolderBusyError):
            RunFolder(tmp_path, spec)
        run.append_episode(make_episode(0))
    with RunFolder(tmp_path, spec) as run:  # released on close
        assert run.done_episodes() == {0}


def test_resume_after_truncated_line(tmp_path: Path) -> None:
    spec = make_spec()
    with RunFolder(tmp_path, spec) as run:
        run.append_episode(make_episode(0))
        run.append_episode(make_episode(1))
    path = tmp_path / spec.run_id / "episodes.jsonl"
    complete = path.read_bytes()
    partial = (json.dumps(make_episode(2)) + "\n").encode()[:37]
    path.write_bytes(complete + partial)
    # readers skip the tail without touching the file
    assert [e["episode"] for e in read_episodes(path)] == [0, 1]
    assert path.read_bytes() == complete + partial
    with RunFolder(tmp_path, spec) as run:
        assert run.done_episodes() == {0, 1}
        assert path.read_bytes() == complete  # repaired
        run.append_episode(make_episode(2))
    assert [e["episode"] for e in read_episodes(path)] == [0, 1, 2]
    # a complete JSON object without its newline was never acknowledged: dropped as well
    body = path.read_bytes()
    path.write_bytes(body + json.dumps(make_episode(3)).encode())
    with RunFolder(tmp_path, spec) as run:
        assert run.done_episodes() == {0, 1, 2}
    assert path.read_bytes() == body


def test_corrupt_middle_line_is_an_error(tmp_path: Path) -> None:
    spec = make_spec()
    with RunFolder(tmp_path, spec) as run:
        run.append_episode(make_episode(0))
    path = tmp_path / spec.run_id / "episodes.jsonl"
    path.write_bytes(path.read_bytes() + b"{not json\n" + b"\n")
    with pytest.raises(CorruptRunError, match=":2:"):
        RunFolder(tmp_path, spec)
    line = json.dumps(make_episode(0)) + "\n"
    path.write_text(line + line)
    with pytest.raises(CorruptRunError, match="twice"):
        read_episodes(path)


_WRITER = textwrap.dedent(
    """
    import json, sys
    from selfcest_env.harness.store import RunFolder
    from selfcest_env.harness.runspec import RunSpec
    from selfcest_env.episodes import INT_METERS
    spec = RunSpec.from_dict(json.loads(sys.argv[2]))
    n = int(sys.argv[3])
    pad = "x" * 20000  # long lines make a kill in the middle of a write likely
    with RunFolder(sys.argv[1], spec) as run:
        print("ready", flush=True)
        for i in run.missing_episodes(n):
            meters = {k: i for k in INT_METERS}
            meters["wall_time_s"] = 0.01
            run.append_episode({
                "episode": i, "task_id": f"t{i}", "seed": i, "correct": i % 2 == 0,
                "score": float(i % 2 == 0), "reward": 0.0, "end_reason": "answered",
                "answer": pad, "meters": meters,
            })
            print(f"written {i}", flush=True)
    """
)


def _run_writer(root: Path, spec: RunSpec, n: int, kill_after_s: float | None) -> set[int]:
    """Run the writer subprocess; SIGKILL it after ``kill_after_s``; return reported indices."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(root), json.dumps(spec.to_dict()), str(n)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    if kill_after_s is not None:
        time.sleep(kill_after_s)
        os.kill(proc.pid, signal.SIGKILL)
    out, _ = proc.communicate(timeout=120)
    if kill_after_s is None:
        assert proc.returncode == 0
    return {int(line.split()[1]) for line in out.splitlines() if line.startswith("written")}


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_sigkill_at_random_moments_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    rng = random.Random(1234)
    spec = make_spec(n_episodes=100000)
    n = 100000
    reported: set[int] = set()
    for attempt in range(4):
        reported |= _run_writer(tmp_path, spec, n, kill_after_s=rng.uniform(0.05, 0.4))
        run_dir = tmp_path / spec.run_id
        if attempt % 2:  # also simulate a torn write (a kill rarely leaves one by itself)
            with open(run_dir / "episodes.jsonl", "ab") as handle:
                handle.write(b'{"episode": 99999, "task_id": "to')
        on_disk = [e["episode"] for e in read_episodes(run_dir)]
        assert len(on_disk) == len(set(on_disk)), "duplicate episode after a kill"
        assert reported <= set(on_disk), "an acknowledged episode was lost"
        with RunFolder(tmp_path, spec) as run:
            done = run.done_episodes()
            assert reported <= done
            assert done == set(range(len(done))), "episodes are done in order, no gaps"
        raw = (run_dir / "episodes.jsonl").read_bytes()
        assert raw == b"" or raw.endswith(b"\n")
    assert reported, "the writer never got to write (machine too slow?)"
    # finish the run without a kill: every index exactly once
    total = max(reported) + 5
    _run_writer(tmp_path, spec, total, kill_after_s=None)
    indices = [e["episode"] for e in read_episodes(tmp_path / spec.run_id)]
    assert sorted(indices) == list(range(total))


# ---------------------------------------------------------------------------- stats


def test_quantile_matches_linear_interpolation() -> None:
    assert quantile([], 0.5) is None
    assert quantile([5], 0.95) == 5
    assert quantile([1, 2, 3, 4], 0.5) == 2.5
    assert quantile(list(range(101)), 0.95) == pytest.approx(95.0)
    assert quantile([10, 0], 0.95) == pytest.approx(9.5)


def test_stats_file(tmp_path: Path) -> None:
    spec = make_spec()
    with RunFolder(tmp_path, spec) as run:
        assert run.stats()["n"] == 0 and run.stats()["accuracy"] is None
        for i in range(4):
            run.append_episode(make_episode(i, correct=i != 3))
        stats = run.write_stats()
    on_disk = json.loads((tmp_path / spec.run_id / "stats.json").read_text())
    assert on_disk == stats
    assert stats["n"] == 4 and stats["n_correct"] == 3
    assert stats["accuracy"] == pytest.approx(0.75)
    assert stats["acc_ci_low"] < 0.75 < stats["acc_ci_high"]
    assert stats["end_reasons"] == {"answered": 3, "gen_budget": 1}
    assert stats["failures"] == {"gen_budget": 1} and stats["n_failed"] == 1
    gen = stats["meters"]["gen_tokens"]
    assert gen["mean"] == pytest.approx(1.5) and gen["p50"] == pytest.approx(1.5)
    assert gen["p95"] == pytest.approx(2.85)
    assert set(stats["meters"]) == set(METERS)
    assert stats["wall_time_s"] == pytest.approx(0.5 * (0 + 1 + 2 + 3))
    assert stats["episodes"] == [0, 1, 2, 3]
    assert compute_stats(load_run(tmp_path / spec.run_id).episodes)["n"] == 4
