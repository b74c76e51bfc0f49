"""Run folders that are corrupt, edited, read-only, on a full disk or booby-trapped.

Every case runs the real ``selfcest`` command (in process, or as a subprocess where the real
stderr, a file size limit, a mount or a timeout matters) on real files, with the scripted agents
(no model). What must hold: one ``selfcest <command>: error: ...`` line saying what to do (or one
warning line per folder left out), never a traceback; the other runs still reported, ranked and
plotted; nothing written outside ``--out``; nothing recorded lost or duplicated.

Read-only folders are made with a read-only bind mount in a private mount namespace (``unshare``;
``chmod`` does not stop root), else with ``chmod`` when not root; a full disk is a file size limit
(``RLIMIT_FSIZE``: EFBIG) and, where a mount namespace is allowed, a small tmpfs (ENOSPC).
"""

from __future__ import annotations

import functools
import json
import os
import resource
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from selfcest_env.episodes import compute_stats
from selfcest_env.harness.errors import CorruptRunError, UnsafePathError
from selfcest_env.harness.leaderboard import collect_rows, read_leaderboard_csv, run_row
from selfcest_env.harness.store import RunFolder, read_episodes
from tests.harness.cli_args import scripted_run_args
from tests.harness.test_cli import run_cli
from tests.harness.test_store import make_episode, make_spec

REPO = Path(__file__).resolve().parents[2]

SUITE = """\
name: integrity
parallel: 4
runs:
  - env: SelfCest-Math-v0
    agents: [scripted-monolithic, scripted-delegate]
    max_new_tokens: [64, 128]
    episodes: 3
    env_args: {preset: easy}
"""

#: The run of :data:`SUITE` that the corruption cases break.
VICTIM = "scripted-delegate__nomodel__max_new_tokens=128"


# --------------------------------------------------------------------------------------------
# Helpers


def cli(*argv: str, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    """``python -m selfcest_env ARGV`` as a shell user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "selfcest_env", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        **kwargs,
    )


def one_error_line(err: str, command: str, *expected: str) -> str:
    """The single stderr line, checked to be ``selfcest <command>: error: ...`` and to hold
    every string of ``expected``."""
    assert "Traceback" not in err and "Exception ignored" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"selfcest {command}: error: "), lines[0]
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def run_folders(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob("run_spec.json"))


def folder_of(root: Path, part: str) -> Path:
    (path,) = [p for p in run_folders(root) if part in p.name]
    return path


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file below ``root`` and its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def board(csv: Path) -> list[dict]:
    """The leaderboard rows without the wall-time columns (the only ones a rerun changes)."""
    df = read_leaderboard_csv(csv)
    return df[[c for c in df.columns if not c.startswith("wall_time_s")]].to_dict("records")


@functools.cache
def namespace_prefix() -> tuple[str, ...] | None:
    """The ``unshare`` command that gives this process a private mount namespace in which it
    may mount (as root; else in a user namespace), or ``None`` where that is not allowed."""
    prefixes = [("unshare", "-m")] if os.geteuid() == 0 else []
    for prefix in [*prefixes, ("unshare", "-rm")]:
        try:
            ok = subprocess.run([*prefix, "true"], capture_output=True, timeout=20).returncode
        except (OSError, subprocess.SubprocessError):
            continue
        if ok == 0:
            return prefix
    return None


def cli_read_only(folder: Path, *argv: str) -> subprocess.CompletedProcess:
    """Run the CLI while ``folder`` is read-only: a read-only bind mount in a private mount
    namespace, else (not root) ``chmod``; skip where neither works."""
    prefix = namespace_prefix()
    command = [sys.executable, "-m", "selfcest_env", *argv]
    if prefix is not None:
        script = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"'
        return subprocess.run(
            [*prefix, "sh", "-c", script, "sh", str(folder), *command],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    if os.geteuid() == 0:
        pytest.skip("root ignores chmod and no mount namespace is allowed here")
    paths = [folder, *folder.rglob("*")]
    modes = {p: p.stat().st_mode for p in paths}
    try:
        for p in paths:
            p.chmod(stat.S_IMODE(modes[p]) & ~0o222)
        return cli(*argv)
    finally:
        for p in paths:
            p.chmod(stat.S_IMODE(modes[p]))


def limit_file_size(limit: int) -> Callable[[], None]:
    """A ``preexec_fn`` that caps the size of every file the child writes (writes past it fail
    with EFBIG; Python ignores SIGXFSZ)."""

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


@pytest.fixture(scope="module")
def suite_done(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The suite file and a finished output folder of it (copied by each test that breaks it)."""
    root = tmp_path_factory.mktemp("suite")
    config = root / "suite.yaml"
    config.write_text(SUITE)
    assert run_cli("suite", str(config), "--out", str(root / "out"), "--no-progress") == 0
    assert len(run_folders(root / "out")) == 4
    return config, root / "out"


# --------------------------------------------------------------------------------------------
# A corrupt run folder: named in one line, every other run still reported, ranked and plotted


def _rewrite_spec(folder: Path, change: Callable[[dict], object]) -> None:
    path = folder / "run_spec.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _prepend_line(folder: Path, line: bytes) -> None:
    path = folder / "episodes.jsonl"
    path.write_bytes(line + b"\n" + path.read_bytes())


def _replace_with_folder(path: Path) -> None:
    path.unlink()
    path.mkdir()


def _replace_folder_with_file(folder: Path) -> None:
    shutil.rmtree(folder)
    folder.write_text("not a run folder\n")


def _first_line(folder: Path) -> dict:
    return json.loads((folder / "episodes.jsonl").read_text().splitlines()[0])


CORRUPTIONS: dict[str, tuple[Callable[[Path], object], str]] = {
    "spec is not JSON": (
        lambda f: (f / "run_spec.json").write_text("{garbage"),
        "unreadable run spec",
    ),
    "spec is not UTF-8": (
        lambda f: (f / "run_spec.json").write_bytes(b"\xff\xfe{}"),
        "unreadable run spec",
    ),
    "spec is a JSON list": (lambda f: (f / "run_spec.json").write_text("[1, 2]"), "no 'spec'"),
    "spec object is a number": (
        lambda f: _rewrite_spec(f, lambda d: d.update(spec=5)),
        "no 'spec' object",
    ),
    "spec field of the wrong type": (
        lambda f: _rewrite_spec(f, lambda d: d["spec"].update(seed="seven")),
        "RunSpec.seed must be a 64-bit int",
    ),
    "spec seed beyond 64 bits": (
        lambda f: _rewrite_spec(f, lambda d: d["spec"].update(seed=10**30)),
        "RunSpec.seed must be a 64-bit int",
    ),
    "spec with an unknown key": (
        lambda f: _rewrite_spec(f, lambda d: d["spec"].update(colour="red")),
        "unknown RunSpec keys",
    ),
    "spec environment of the wrong type": (
        lambda f: _rewrite_spec(f, lambda d: d.update(environment="linux")),
        "'environment' is not an object",
    ),
    "spec nested 100,000 deep": (
        lambda f: (f / "run_spec.json").write_text("[" * 100_000 + "]" * 100_000),
        "unreadable run spec",
    ),
    "spec is a folder": (lambda f: _replace_with_folder(f / "run_spec.json"), "not a regular"),
    "spec edited to another agent": (
        lambda f: _rewrite_spec(f, lambda d: d["spec"].update(agent="scripted-monolithic")),
        "edited after the run",
    ),
    "episodes: garbage before the last line": (
        lambda f: _prepend_line(f, b"{garbage"),
        "unreadable episode line",
    ),
    "episodes: bad UTF-8": (lambda f: _prepend_line(f, b"\xff\xfe"), "unreadable episode line"),
    "episodes: meters of the wrong type": (
        lambda f: _prepend_line(f, json.dumps({**_first_line(f), "meters": "lots"}).encode()),
        "'meters' must be a dict",
    ),
    "episodes: a score too large for a float": (
        lambda f: _prepend_line(
            f,
            json.dumps({**_first_line(f), "score": 0})
            .replace('"score": 0', '"score": 1' + "0" * 400)
            .encode(),
        ),
        "'score' must be a finite number",
    ),
    "episodes: an index of 5,000 digits": (
        lambda f: _prepend_line(f, b'{"episode": 1' + b"0" * 5000 + b"}"),
        "unreadable episode line",
    ),
    "episodes: a token meter beyond 64 bits": (
        lambda f: _prepend_line(
            f,
            json.dumps(
                {**_first_line(f), "meters": {**_first_line(f)["meters"], "gen_tokens": 2**64}}
            ).encode(),
        ),
        "must be a 64-bit int",
    ),
    "episodes: one episode twice": (
        lambda f: _prepend_line(f, json.dumps(_first_line(f)).encode()),
        "recorded twice",
    ),
    "episodes file is a folder": (
        lambda f: _replace_with_folder(f / "episodes.jsonl"),
        "not a regular file",
    ),
    "errors file is garbage": (
        lambda f: (f / "errors.jsonl").write_text("{nope\n{}\n"),
        "unreadable episode line",
    ),
    "run folder is a file": (_replace_folder_with_file, "a file where a run folder should be"),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_a_suite_with_one_corrupt_run_folder_reports_all_the_others(
    case: str,
    suite_done: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
) -> None:
    config, done = suite_done
    out = tmp_path / "out"
    shutil.copytree(done, out)
    victim = folder_of(out, VICTIM)
    others = {p.name: read_episodes(p) for p in run_folders(out) if p != victim}
    breaks, expected = CORRUPTIONS[case]
    breaks(victim)
    capsys.readouterr()
    code = run_cli("suite", str(config), "--out", str(out), "--no-progress")
    captured = capsys.readouterr()
    assert code == 1
    line = one_error_line(captured.err, "suite", expected, victim.name)
    assert "scripted-delegate" in line and "max_new_tokens=128" in line
    rows = read_leaderboard_csv(out / "leaderboard.csv")
    assert sorted(rows["run_id"]) == sorted(others)  # every other run, ranked
    assert (rows["n"] == 3).all() and rows[[c for c in rows if c.startswith("pareto_")]].any().all()
    assert len(list((out / "plots").glob("*.png"))) == 3
    for name, episodes in others.items():  # untouched
        assert read_episodes(out / "runs" / name) == episodes


REPAIRABLE: dict[str, Callable[[Path], object]] = {
    "a torn last line (killed mid-write)": lambda f: (f / "episodes.jsonl").write_bytes(
        (f / "episodes.jsonl").read_bytes()[:-40]
    ),
    "stats.json is garbage": lambda f: (f / "stats.json").write_text("{garbage"),
    "stats.json is missing": lambda f: (f / "stats.json").unlink(),
    "a temporary file left by a kill": lambda f: (f / ".stats.json.0123456789ab.tmp").write_text(
        "{"
    ),
}


@pytest.mark.parametrize("case", sorted(REPAIRABLE))
def test_what_a_kill_leaves_behind_is_repaired_not_reported(
    case: str, suite_done: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    config, done = suite_done
    out = tmp_path / "out"
    shutil.copytree(done, out)
    REPAIRABLE[case](folder_of(out, VICTIM))
    capsys.readouterr()
    assert run_cli("suite", str(config), "--out", str(out), "--no-progress") == 0
    assert capsys.readouterr().err == ""
    assert board(out / "leaderboard.csv") == board(done / "leaderboard.csv")
    for folder in run_folders(out):
        assert [e["episode"] for e in read_episodes(folder)] != []
        stats = json.loads((folder / "stats.json").read_text())
        assert stats["n"] == 3 and sorted(stats["episodes"]) == [0, 1, 2]


def test_the_leaderboard_command_names_each_broken_folder_in_one_warning_line(
    suite_done: tuple[Path, Path], tmp_path: Path
) -> None:
    """As a shell user sees it: one warning line per folder left out (corrupt, edited, without
    a spec), the leaderboard of the others written, exit code 1."""
    _, done = suite_done
    runs = tmp_path / "runs"
    shutil.copytree(done / "runs", runs)
    folders = run_folders(runs)
    CORRUPTIONS["spec is not JSON"][0](folders[0])
    CORRUPTIONS["spec edited to another agent"][0](folders[1])
    (folders[2] / "run_spec.json").unlink()  # a folder that lost its spec
    stray = runs / "nested" / "old-run"  # run files, no spec, deeper down
    stray.mkdir(parents=True)
    (stray / "episodes.jsonl").write_text("")
    (runs / "plots").mkdir()  # not a run folder, no run files: no warning
    proc = cli("leaderboard", str(runs))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    warnings = proc.stderr.strip().splitlines()
    assert len(warnings) == 4, proc.stderr
    assert all(w.startswith("selfcest leaderboard: warning: skipped run folder ") for w in warnings)
    for folder, why in [
        (folders[0], "unreadable run spec"),
        (folders[1], "edited after the run"),
        (folders[2], "no run_spec.json file"),
        (stray, "no run_spec.json file"),
    ]:
        assert sum(str(folder) in w and why in w for w in warnings) == 1, (folder, warnings)
    assert list(read_leaderboard_csv(runs / "leaderboard.csv")["run_id"]) == [folders[3].name]


def test_a_fifo_in_place_of_a_run_file_does_not_block(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert cli(*scripted_run_args(out, 2)).returncode == 0
    folder = folder_of(out, "scripted-monolithic")
    (folder / "episodes.jsonl").unlink()
    os.mkfifo(folder / "episodes.jsonl")
    proc = cli(*scripted_run_args(out, 2), timeout=60)
    assert proc.returncode == 1
    one_error_line(proc.stderr, "run", "not a regular file", folder.name)
    proc = cli("leaderboard", str(out), timeout=60)
    assert proc.returncode == 1 and "not a regular file" in proc.stderr


# --------------------------------------------------------------------------------------------
# Edited specs, folders without a spec, fewer episodes than recorded


EDITS: dict[str, Callable[[dict], object]] = {
    "agent": lambda d: d["spec"].update(agent="clone-controller"),
    "model": lambda d: d["spec"].update(model="gpt-7"),
    "budget": lambda d: d["spec"].update(budget={"max_new_tokens": 4096}),
    "seed": lambda d: d["spec"].update(seed=1),
    "env args": lambda d: d["spec"]["extra"].update(env_args={"preset": "reference"}),
    "agent config": lambda d: d["spec"]["agent_config"].update(parts=9),
    "spec_hash alone": lambda d: d.update(spec_hash="00000000"),
    "spec and spec_hash together": lambda d: (
        d["spec"].update(agent="monolithic"),
        d.update(spec_hash=make_spec(**{**d["spec"], "agent": "monolithic"}).spec_hash),
    ),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_an_edited_run_spec_never_relabels_a_run(
    edit: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "out"
    assert run_cli(*scripted_run_args(out, 3)) == 0
    folder = folder_of(out, "scripted-delegate")
    before = (folder / "episodes.jsonl").read_bytes()
    _rewrite_spec(folder, EDITS[edit])
    rows, skipped = collect_rows(out)
    assert [s.path for s in skipped] == [folder]
    assert "edited after the run" in skipped[0].reason
    assert [r["agent"] for r in rows] == ["scripted-monolithic"]
    capsys.readouterr()
    assert run_cli(*scripted_run_args(out, 5)) == 1  # resuming it is refused too
    one_error_line(capsys.readouterr().err, "run", "edited after the run", folder.name)
    assert (folder / "episodes.jsonl").read_bytes() == before


def test_a_run_reports_only_the_episodes_it_asked_for(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "out"
    assert run_cli(*scripted_run_args(out, 6)) == 0
    folder = folder_of(out, "scripted-delegate")
    episodes = sorted(read_episodes(folder), key=lambda e: e["episode"])
    first = episodes[:2]
    capsys.readouterr()
    assert run_cli(*scripted_run_args(out, 2)) == 0
    lines = capsys.readouterr().out.splitlines()
    line = next(x for x in lines if folder.name in x)
    accuracy = sum(e["correct"] for e in first) / 2
    assert " n=2 " in line and f"acc={accuracy:.3f}" in line and "nothing to play" in line
    assert len(read_episodes(folder)) == 6  # nothing recorded is thrown away
    csv = tmp_path / "board.csv"
    assert run_cli("leaderboard", str(out), "--out", str(csv), "--episodes", "2") == 0
    df = read_leaderboard_csv(csv)
    assert (df["n"] == 2).all()
    row = df[df["run_id"] == folder.name].iloc[0]
    assert row["accuracy"] == accuracy
    assert row["gen_tokens_mean"] == sum(e["meters"]["gen_tokens"] for e in first) / 2
    assert run_cli("leaderboard", str(out), "--out", str(csv)) == 0
    assert (read_leaderboard_csv(csv)["n"] == 6).all()  # without --episodes: every episode


def test_a_smaller_suite_ranks_only_the_episodes_it_asked_for(
    suite_done: tuple[Path, Path], tmp_path: Path
) -> None:
    config, done = suite_done
    out = tmp_path / "out"
    shutil.copytree(done, out)
    assert run_cli("suite", str(config), "--out", str(out), "--episodes", "1") == 0
    df = read_leaderboard_csv(out / "leaderboard.csv")
    assert len(df) == 4 and (df["n"] == 1).all()
    for _, row in df.iterrows():
        (first,) = [e for e in read_episodes(out / "runs" / row["run_id"]) if e["episode"] == 0]
        assert row["accuracy"] == float(first["correct"])


def test_the_first_episodes_are_counted_by_index_not_by_finishing_order(tmp_path: Path) -> None:
    spec = make_spec(n_episodes=None)
    order = [3, 0, 5, 1, 2, 4]
    with RunFolder(tmp_path, spec) as run:
        for i in order:
            run.append_episode(make_episode(i, correct=i % 2 == 0, gen_tokens=10 * i))
    row = run_row(tmp_path / spec.run_id, episodes=3)
    assert row is not None and row["n"] == 3 and row["n_correct"] == 2  # episodes 0, 1, 2
    assert row["gen_tokens_mean"] == (0 + 10 + 20) / 3
    stats = compute_stats(read_episodes(tmp_path / spec.run_id), limit=3)
    assert stats["episodes"] == [0, 1, 2] and stats["n_correct"] == 2


# --------------------------------------------------------------------------------------------
# Read-only folders


def test_a_finished_run_in_a_read_only_folder_is_reported_without_writing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert cli(*scripted_run_args(out, 3)).returncode == 0
    before = snapshot(out)
    proc = cli_read_only(out, *scripted_run_args(out, 3))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout.count("n=3 acc=") == 2 and proc.stdout.count("nothing to play") == 2
    proc = cli_read_only(out, *scripted_run_args(out, 2))  # fewer: reported, still nothing written
    assert proc.returncode == 0 and proc.stdout.count("n=2 acc=") == 2, proc.stderr
    board_csv = tmp_path / "board.csv"
    proc = cli_read_only(out, "leaderboard", str(out), "--out", str(board_csv))
    assert proc.returncode == 0, proc.stderr
    assert len(read_leaderboard_csv(board_csv)) == 2
    assert snapshot(out) == before


def test_a_lagging_stats_file_in_a_read_only_folder_is_one_warning(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert cli(*scripted_run_args(out, 3)).returncode == 0
    folder = folder_of(out, "scripted-delegate")
    (folder / "stats.json").write_text("{}")
    proc = cli_read_only(out, *scripted_run_args(out, 3))
    assert proc.returncode == 0
    (warning,) = proc.stderr.strip().splitlines()
    assert warning.startswith("selfcest run: warning: ") and "stats.json lags behind" in warning
    assert folder.name in warning and proc.stdout.count("n=3 acc=") == 2


def test_an_unfinished_run_in_a_read_only_folder_is_one_error_line(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert cli(*scripted_run_args(out, 2)).returncode == 0
    before = snapshot(out)
    proc = cli_read_only(out, *scripted_run_args(out, 4))
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2 and "Traceback" not in proc.stderr  # one line per run
    for line in lines:
        assert line.startswith("selfcest run: error: run scripted-")
        assert "not writable" in line and "choose another --out" in line
    proc = cli_read_only(out, "leaderboard", str(out))  # writes into the read-only folder
    assert proc.returncode == 1
    one_error_line(proc.stderr, "leaderboard", "not writable")
    assert snapshot(out) == before
    assert cli(*scripted_run_args(out, 4)).returncode == 0  # writable again: it resumes


# --------------------------------------------------------------------------------------------
# A full disk


def test_a_file_size_limit_stops_the_run_with_one_line_and_loses_nothing(tmp_path: Path) -> None:
    out, clean = tmp_path / "out", tmp_path / "clean"
    proc = cli(*scripted_run_args(out, 20), preexec_fn=limit_file_size(3000))
    assert proc.returncode == 1
    one_error_line(proc.stderr, "run", "File too large", "free some space", "rerun the same")
    folder = folder_of(out, "scripted-monolithic")
    data = (folder / "episodes.jsonl").read_bytes()
    assert data.endswith(b"\n")  # the failed write left no partial line
    kept = [json.loads(line) for line in data.splitlines()]
    assert 0 < len(kept) < 20 and kept == read_episodes(folder)
    assert not list(out.rglob("*.tmp"))
    assert cli(*scripted_run_args(out, 20)).returncode == 0  # room again: the same command resumes
    assert [e["episode"] for e in read_episodes(folder)][: len(kept)] == [
        e["episode"] for e in kept
    ]
    assert cli(*scripted_run_args(clean, 20)).returncode == 0
    for csv, runs in ((tmp_path / "a.csv", out), (tmp_path / "b.csv", clean)):
        assert cli("leaderboard", str(runs), "--out", str(csv)).returncode == 0
    assert board(tmp_path / "a.csv") == board(tmp_path / "b.csv")


def test_a_full_disk_stops_a_suite_with_one_line_and_it_resumes(
    suite_done: tuple[Path, Path], tmp_path: Path
) -> None:
    """A real full file system: a 12 KiB tmpfs in a private mount namespace; then the same
    command on a bigger one finishes the suite with the leaderboard of a clean run."""
    prefix = namespace_prefix()
    if prefix is None:
        pytest.skip("no mount namespace allowed here (unshare) for a small tmpfs")
    config, done = suite_done
    disk, kept, logs = tmp_path / "disk", tmp_path / "kept", tmp_path / "logs"
    for path in (disk, kept, logs):
        path.mkdir()
    command = [sys.executable, "-m", "selfcest_env", "suite", str(config)]
    command += ["--out", str(disk / "out"), "--no-progress"]
    script = """
        mount -t tmpfs -o size=12k tmpfs "$DISK" || exit 99
        "$@" >"$LOGS/out1" 2>"$LOGS/err1"; echo $? >"$LOGS/rc1"
        cp -a "$DISK/." "$KEPT/full"
        mount -o remount,size=16m tmpfs "$DISK" || exit 98
        "$@" >"$LOGS/out2" 2>"$LOGS/err2"; echo $? >"$LOGS/rc2"
        cp -a "$DISK/." "$KEPT/after"
    """
    proc = subprocess.run(
        [*prefix, "sh", "-c", script, "sh", *command],
        cwd=REPO,
        env={**os.environ, "DISK": str(disk), "KEPT": str(kept), "LOGS": str(logs)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode in (98, 99):
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    assert (logs / "rc1").read_text().strip() == "1"
    one_error_line((logs / "err1").read_text(), "suite", "No space left", "rerun the same")
    assert not (kept / "full" / "out" / "leaderboard.csv").exists()  # stopped, no half board
    for folder in run_folders(kept / "full"):
        data = (folder / "episodes.jsonl").read_bytes()
        assert data == b"" or data.endswith(b"\n")
    assert (logs / "rc2").read_text().strip() == "0", (logs / "err2").read_text()
    assert board(kept / "after" / "out" / "leaderboard.csv") == board(done / "leaderboard.csv")


def test_stdout_on_a_full_device_is_one_error_line(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert cli(*scripted_run_args(out, 2)).returncode == 0
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [sys.executable, "-m", "selfcest_env", "leaderboard", str(out)],
            cwd=REPO,
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
    assert proc.returncode == 1
    one_error_line(proc.stderr, "leaderboard", "No space left")


# --------------------------------------------------------------------------------------------
# Paths: nothing escapes --out


BAD_SUITE_NAMES = [
    "../escape",
    "../../etc/escape",
    "a/../../escape",
    "/tmp/selfcest-absolute-escape",
    "sub/dir",
    "back\\slash",
    "..",
    ".",
    "",
    ".hidden",
    "-rf",
    "nul\x00byte",
    "line\nbreak",
    "x" * 49,
]


@pytest.mark.parametrize("name", BAD_SUITE_NAMES)
def test_a_suite_name_never_becomes_a_path_outside(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    work = tmp_path / "a" / "b" / "work"
    work.mkdir(parents=True)
    config = work / "suite.json"
    config.write_text(json.dumps({"name": name, "runs": json.loads(json.dumps(_SUITE_RUNS))}))
    monkeypatch.chdir(work)
    before = sorted(tmp_path.rglob("*"))
    assert run_cli("suite", str(config), "--no-progress") == 2
    one_error_line(capsys.readouterr().err, "suite", "cannot name a folder")
    assert sorted(tmp_path.rglob("*")) == before
    assert not Path("/tmp/selfcest-absolute-escape").exists()


_SUITE_RUNS = [{"env": "SelfCest-Math-v0", "agents": ["scripted-monolithic"], "episodes": 1}]


def test_a_suite_named_by_its_file_gets_a_safe_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "my suite (v2).json"
    config.write_text(json.dumps(_SUITE_RUNS))
    monkeypatch.chdir(tmp_path)
    assert run_cli("suite", str(config), "--no-progress") == 0
    assert (tmp_path / "runs" / "suite-my-suite-v2" / "leaderboard.csv").is_file()


def test_links_already_in_a_suite_folder_do_not_lead_writes_outside(
    suite_done: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    config, _ = suite_done
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in ("runs", "plots"):
        out = tmp_path / f"out-{name}"
        out.mkdir()
        (out / name).symlink_to(outside, target_is_directory=True)
        assert run_cli("suite", str(config), "--out", str(out), "--no-progress") == 2
        one_error_line(capsys.readouterr().err, "suite", "leads outside", "remove the link")
        assert list(outside.iterdir()) == []


def test_links_in_place_of_run_files_are_refused_not_followed(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out, outside = tmp_path / "out", tmp_path / "outside"
    outside.mkdir()
    assert run_cli(*scripted_run_args(out, 2)) == 0
    victim = outside / "victim.txt"
    victim.write_text("precious\n")
    # the run folder itself is a link to a folder outside
    moved = folder_of(out, "scripted-monolithic")
    shutil.move(moved, outside / moved.name)
    moved.symlink_to(outside / moved.name, target_is_directory=True)
    # a run file is a link to a file outside
    linked = folder_of(out, "scripted-delegate")
    (linked / "episodes.jsonl").unlink()
    (linked / "episodes.jsonl").symlink_to(victim)
    outside_before = snapshot(outside)
    capsys.readouterr()
    assert run_cli(*scripted_run_args(out, 4)) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2, lines
    assert "is a symbolic link" in lines[0] and "not a regular file" in lines[1]
    assert snapshot(outside) == outside_before
    with pytest.raises(UnsafePathError):
        RunFolder.open_existing(moved)
    with pytest.raises(CorruptRunError, match="not a regular file"):
        read_episodes(linked)


def test_a_link_in_place_of_a_plot_is_replaced_not_written_through(
    suite_done: tuple[Path, Path], tmp_path: Path
) -> None:
    config, done = suite_done
    out = tmp_path / "out"
    shutil.copytree(done, out)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    plot = next((out / "plots").glob("*.png"))
    plot.unlink()
    plot.symlink_to(victim)
    assert run_cli("suite", str(config), "--out", str(out), "--no-progress") == 0
    assert victim.read_text() == "precious\n"
    assert not plot.is_symlink() and plot.read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize(
    ("env", "agent", "source"),
    [
        ("SelfCest-MultiHopQA-v0", "scripted-delegate", "synthetic"),
        ("SelfCest-MultiHopQA-v0", "scripted-monolithic", "synthetic"),
        ("SelfCest-Math-v0", "scripted-qa-delegate", "arithmetic"),
    ],
)
def test_a_scripted_agent_on_a_source_it_cannot_read_fails_before_anything_plays(
    tmp_path: Path, env: str, agent: str, source: str
) -> None:
    out = tmp_path / "runs"
    result = cli(
        "run",
        "--env",
        env,
        "--agents",
        f"{agent},scripted-qa-delegate",
        "--episodes",
        "2",
        "--out",
        str(out),
        "--no-progress",
    )
    assert result.returncode != 0
    one_error_line(result.stderr, "run", f"agent {agent}", f"not {source}")
    assert not run_folders(out)
