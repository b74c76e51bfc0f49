"""What names a run folder, what may be written or shown, and how.

* Run identity: every backend argument that can change results (the server, dtype, device,
  quantisation, sampling extras) is in the run spec and the folder name; transport settings
  and the API key are not. Two real servers behind one ``--model`` get two folders.
* Secrets: the API key comes from ``OPENAI_API_KEY`` (or a backend argument, with a warning) and
  is never written to a run folder nor printed, even when a server echoes it back.
* Permissions: run files, leaderboards and plots get the permissions the umask gives.
* Output: text from servers and run folders is escaped on the terminal (no escape sequences, no
  forged lines) and neutralised in ``leaderboard.csv`` (no formula cells), and the CSV reads
  back to the same text and plots.

The servers are real HTTP servers on loopback; the CLI runs as a subprocess where its real
stdout and stderr matter.
"""

from __future__ import annotations

import csv
import json
import os
import secrets
import stat
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from selfcest_env.harness.leaderboard import (
    LEADERBOARD_DTYPES,
    collect_rows,
    read_leaderboard_csv,
)
from selfcest_env.harness.requests import BackendConfig, RunRequest
from selfcest_env.harness.runner import Runner
from selfcest_env.harness.store import RunFolder, read_episodes, read_errors
from selfcest_env.registration import MATH_ENV_ID
from selfcest_env.text import printable
from tests.harness.cli_args import openai_run_args, scripted_run_args
from tests.harness.test_run_integrity import cli, run_folders
from tests.harness.test_store import make_episode, make_spec

REPO = Path(__file__).resolve().parents[2]

#: What a server may put into an error body to take over a terminal: clear the screen, set the
#: clipboard (OSC 52), move the cursor back over the line, forge a line of its own, reverse the
#: text direction, and an 8-bit CSI.
HOSTILE = "\x1b[2J\x1b]52;c;ZXZpbA==\x07 boom\r\nselfcest run: error: forged\u202ereversed\x9b31m"


# --------------------------------------------------------------------------------------------
# A chat server on loopback


class ChatServer:
    """An OpenAI-compatible chat server whose every answer ``reply(n)`` decides (``n``: the
    request's number, from 1): ``(200, text)`` answers ``text``, ``(status, bytes)`` fails with
    that body. Keeps the ``Authorization`` header of every request."""

    def __init__(self, reply: Callable[[int], tuple[int, Any]]) -> None:
        self.reply = reply
        self.authorizations: list[str | None] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - the http.server hook name
                self.rfile.read(int(self.headers["Content-Length"]))
                outer.authorizations.append(self.headers.get("Authorization"))
                status, payload = outer.reply(len(outer.authorizations))
                body = json.dumps(_answer(payload)).encode() if status == 200 else payload
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _answer(text: str) -> dict:
    ids = list(range(7, 7 + len(text.split())))
    return {
        "choices": [
            {
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
                "token_ids": ids,
                "logprobs": {"content": [{"token": "x", "logprob": -0.5} for _ in ids]},
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": len(ids)},
    }


@contextmanager
def serving(reply: Callable[[int], tuple[int, Any]]) -> Iterator[ChatServer]:
    server = ChatServer(reply)
    try:
        yield server
    finally:
        server.close()


def openai_run(server: ChatServer, out: Path, *extra: str, episodes: int = 3) -> list[str]:
    """The argv of a monolithic run against ``server`` (model name ``m``), one at a time."""
    return openai_run_args(
        server.url, out, episodes, "--backend-arg", "max_retries=0", "--parallel", "1", *extra
    )


def no_key_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}


def every_byte_below(root: Path) -> bytes:
    return b"\n".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


# --------------------------------------------------------------------------------------------
# Run identity


def spec_of(backend: str, model: str = "m", **args: Any) -> Any:
    request = RunRequest(
        env=MATH_ENV_ID,
        source="arithmetic",
        split="test",
        agent="monolithic",
        budget={"max_new_tokens": 32},
        episodes=1,
        backend=BackendConfig(backend, model, args),
    )
    return Runner("unused").spec_for(request)


BASE = "http://127.0.0.1:8000"

#: (backend, arguments A, arguments B, whether A and B must share a run folder).
IDENTITY_CASES: dict[str, tuple[str, dict, dict, bool]] = {
    "another server": ("openai", {"base_url": BASE}, {"base_url": "http://10.0.0.2:8000"}, False),
    "another port": ("openai", {"base_url": BASE}, {"base_url": "http://127.0.0.1:8001"}, False),
    "another path": ("openai", {"base_url": BASE}, {"base_url": BASE + "/proxy/b"}, False),
    "the same server, /v1 and case": (
        "openai",
        {"base_url": BASE},
        {"base_url": "HTTP://127.0.0.1:8000/v1/"},
        True,
    ),
    "credentials in the URL": (
        "openai",
        {"base_url": BASE},
        {"base_url": "http://user:hunter2-secret@127.0.0.1:8000"},
        True,
    ),
    "another API key": (
        "openai",
        {"base_url": BASE, "api_key": "sk-one-aaaaaaaa"},
        {"base_url": BASE, "api_key": "sk-two-bbbbbbbb"},
        True,
    ),
    "transport settings": (
        "openai",
        {"base_url": BASE},
        {
            "base_url": BASE,
            "timeout_s": 5,
            "max_retries": 9,
            "max_concurrency": 2,
            "backoff_s": 1.5,
            "max_backoff_s": 30,
            "max_retry_wait_s": 1,
        },
        True,
    ),
    "sampling extras": (
        "openai",
        {"base_url": BASE},
        {"base_url": BASE, "extra_body": {"repetition_penalty": 1.2}},
        False,
    ),
    "logprobs asked for": (
        "openai",
        {"base_url": BASE},
        {"base_url": BASE, "top_logprobs": 5},
        False,
    ),
    "a tokenizer": ("openai", {"base_url": BASE}, {"base_url": BASE, "tokenizer": "gpt2"}, False),
    "dtype": ("transformers", {"dtype": "float32"}, {"dtype": "bfloat16"}, False),
    "device": ("transformers", {"device": "cpu"}, {"device": "cuda"}, False),
    "batch size": ("transformers", {}, {"batch_size": 1}, False),
    "logprobs mode": ("transformers", {}, {"logprobs_mode": "raw"}, False),
    "decode loop": ("transformers", {}, {"decoder": "forward"}, False),
    "CPU threads": ("transformers", {}, {"num_threads": 1}, True),
    "twins run once or apart": ("transformers", {}, {"coalesce_twins": False}, True),
    "compiled or Python decode attention": (
        "transformers",
        {},
        {"compiled_attention": False},
        True,
    ),
    "quantisation": ("vllm", {}, {"quantization": "awq"}, False),
    "vllm dtype": ("vllm", {"dtype": "half"}, {"dtype": "float"}, False),
}


@pytest.mark.parametrize("case", sorted(IDENTITY_CASES))
def test_what_can_change_results_names_the_run_folder(case: str) -> None:
    backend, a, b, same = IDENTITY_CASES[case]
    spec_a, spec_b = spec_of(backend, **a), spec_of(backend, **b)
    assert (spec_a.run_id == spec_b.run_id) is same
    for spec in (spec_a, spec_b):
        text = json.dumps(spec.to_dict())
        for secret in ("sk-one", "sk-two", "hunter2", "api_key"):
            assert secret not in text


def test_run_folders_made_before_keep_their_identity() -> None:
    """Without backend arguments the spec has no ``backend_args`` (the hash of every folder
    made before is unchanged), and the committed leaderboard's folders all read back."""
    assert "backend_args" not in spec_of("transformers").extra
    committed = REPO / "leaderboards" / "quick" / "runs"
    rows, skipped = collect_rows(committed)
    folders = [path for path in committed.iterdir() if path.is_dir()]
    assert skipped == [] and len(rows) == len(folders) > 0


def scripted_easy_request() -> RunRequest:
    """One episode of the scripted monolithic agent on the easy math preset."""
    return RunRequest(
        env=MATH_ENV_ID,
        source="arithmetic",
        split="test",
        agent="scripted-monolithic",
        budget={},
        episodes=1,
        env_args={"preset": "easy"},
    )


def test_a_named_variant_is_part_of_the_spec_and_a_derived_one_is_not() -> None:
    from dataclasses import replace

    request = scripted_easy_request()
    derived = Runner("unused").spec_for(request)
    named = Runner("unused").spec_for(replace(request, variant="warm-up"))
    assert "variant" not in derived.extra and derived.variant == "easy"
    assert named.extra["variant"] == named.variant == "warm-up"
    assert named.run_id != derived.run_id


def test_two_servers_behind_one_model_name_get_two_run_folders(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from tests.harness.test_cli import run_cli

    with serving(lambda n: (200, "Answer: 42")) as a, serving(lambda n: (200, "Answer: 7")) as b:
        assert run_cli(*openai_run(a, tmp_path)) == 0
        assert run_cli(*openai_run(b, tmp_path)) == 0
        assert "played 3" in capsys.readouterr().out.splitlines()[-1]  # not resumed into a's
        folders = run_folders(tmp_path)
        assert len(folders) == 2
        answers = {
            json.loads((f / "run_spec.json").read_text())["spec"]["extra"]["backend_args"][
                "base_url"
            ]: {e["answer"] for e in read_episodes(f)}
            for f in folders
        }
        assert answers == {a.url: {"42"}, b.url: {"7"}}
        requests = len(a.authorizations)
        argv = openai_run(
            a, tmp_path, "--backend-arg", "timeout_s=30", "--backend-arg", "max_retries=2"
        )
        assert run_cli(*argv) == 0  # transport settings changed: the same folder, resumed
        assert "nothing to play" in capsys.readouterr().out
        assert len(a.authorizations) == requests and len(run_folders(tmp_path)) == 2


def test_the_usage_a_server_reports_is_audited_per_episode_and_per_run(tmp_path: Path) -> None:
    """The loopback server reports 12 prompt tokens a request (the real prompt is longer) and
    one completion token per token id (what the ledger charges); a real ``selfcest run``
    process warns on stderr."""
    with serving(lambda n: (200, "Answer: 42")) as server:
        proc = cli(*openai_run(server, tmp_path), env=no_key_env())
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr
    (folder,) = run_folders(tmp_path)
    for episode in read_episodes(folder):
        audit = episode["usage_audit"]
        assert audit["turns"] == 1 and audit["prompt_tokens_reported"] == 12
        assert audit["prompt_mismatches"] == 1 and audit["completion_mismatches"] == 0
        assert audit["completion_tokens_reported"] == audit["completion_tokens_ledger"]
        assert audit["completion_tokens_ledger"] == episode["meters"]["gen_tokens"]
    run = json.loads((folder / "stats.json").read_text())["usage_audit"]
    assert run["turns"] == 3 and run["prompt_tokens_reported"] == 36
    assert run["prompt_tokens_ledger"] > 36
    assert "reported usage disagrees with the ledger: prompt tokens differ on 3 of 3" in err
    assert "completion tokens differ on 0 of 3 turns" in err


# --------------------------------------------------------------------------------------------
# The API key


def test_the_api_key_comes_from_the_environment_and_never_reaches_a_file_or_the_terminal(
    tmp_path: Path,
) -> None:
    key = "sk-test-" + secrets.token_hex(16)

    def reply(n: int) -> tuple[int, Any]:  # every other request: an error that echoes the key
        if n % 2:
            return 401, f'{{"error": "invalid key {key} (Authorization: Bearer {key})"}}'.encode()
        return 200, "Answer: 42"

    with serving(reply) as server:
        proc = cli(
            *openai_run(server, tmp_path, episodes=4), env={**no_key_env(), "OPENAI_API_KEY": key}
        )
    assert server.authorizations and set(server.authorizations) == {f"Bearer {key}"}
    assert proc.returncode == 1  # two episodes ended with a backend error
    assert "Traceback" not in proc.stderr
    assert key not in proc.stdout and key not in proc.stderr and "invalid key" in proc.stderr
    assert key.encode() not in every_byte_below(tmp_path)
    (folder,) = run_folders(tmp_path)
    errors = read_errors(folder)
    assert len(errors) == 2 and all("invalid key" in e["error"] for e in errors)
    assert len(read_episodes(folder)) == 2


def test_log_lines_are_one_line_escaped_and_without_the_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The formatter every log line of the CLI goes through (other libraries' too)."""
    import logging

    from selfcest_env.harness.cli.output import Terminal

    key = "sk-env-" + secrets.token_hex(8)
    monkeypatch.setenv("OPENAI_API_KEY", key)
    record = logging.LogRecord("httpx", logging.WARNING, __file__, 1, "%s", (HOSTILE + key,), None)
    line = Terminal("selfcest run").log_handler().format(record)
    assert line.startswith("selfcest run: warning: ") and "\n" not in line
    assert len(line.splitlines()) == 1 and key not in line and "<redacted>" in line
    safe_terminal_text(line, "run")


def test_an_api_key_given_as_an_argument_is_warned_about_and_never_written(
    tmp_path: Path,
) -> None:
    key = "sk-arg-" + secrets.token_hex(16)
    with serving(lambda n: (200, "Answer: 42")) as server:
        argv = openai_run(server, tmp_path, "--backend-arg", f"api_key={key}")
        proc = cli(*argv, env=no_key_env())
    assert proc.returncode == 0, proc.stderr
    assert set(server.authorizations) == {f"Bearer {key}"}
    lines = proc.stderr.strip().splitlines()
    (warning,) = [line for line in lines if "API key" in line]
    assert warning.startswith("selfcest run: warning: an API key given as a backend argument")
    assert "OPENAI_API_KEY" in warning and key not in proc.stderr
    others = [line for line in lines if line != warning]
    assert all("reported usage disagrees with the ledger" in line for line in others), others
    assert key.encode() not in every_byte_below(tmp_path)
    assert key not in proc.stdout


# --------------------------------------------------------------------------------------------
# Permissions


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_files_and_folders_get_the_permissions_of_the_umask(umask: int, tmp_path: Path) -> None:
    out = tmp_path / "out"
    set_umask = lambda: os.umask(umask)  # noqa: E731 - a preexec_fn
    assert cli(*scripted_run_args(out, 2), preexec_fn=set_umask).returncode == 0
    assert cli("leaderboard", str(out), preexec_fn=set_umask).returncode == 0
    plot = cli("plot", str(out / "leaderboard.csv"), "--meters", "gen_tokens", preexec_fn=set_umask)
    assert plot.returncode == 0
    folder = run_folders(out)[0]
    files = [
        folder / "run_spec.json",
        folder / "stats.json",
        folder / "episodes.jsonl",
        out / "leaderboard.csv",
        *sorted((out / "plots").iterdir()),
    ]
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask, path
    for path in (folder, out / "plots"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o777 & ~umask, path


# --------------------------------------------------------------------------------------------
# Terminal output


def test_printable_escapes_every_control_character() -> None:
    for ch in [chr(c) for c in range(32)] + ["\x7f", "\x85", "\x9b", "\u2028", "\u2029"]:
        assert printable(f"a{ch}b") == "a" + ch.encode("unicode_escape").decode() + "b"
    for ch in ["\u202e", "\u2066", "\u200b", "\ufeff", "\ud800", "\U000e0001"]:  # format, surrogate
        assert printable(ch).startswith("\\"), repr(ch)
    kept = "plain text, ünïcödé, 日本語, emoji 😀, math ∑ ≤ ∞, spaces  kept"
    assert printable(kept) == kept
    assert "\x1b" not in printable(HOSTILE) and "\n" not in printable(HOSTILE)


def safe_terminal_text(text: str, command: str) -> None:
    """No control character but line breaks, and every line one of the CLI's own."""
    assert "Traceback" not in text
    for bad in ("\x1b", "\x07", "\r", "\x9b", "\u202e"):
        assert bad not in text, repr(text)
    for line in text.splitlines():
        assert not line.startswith("selfcest run: error: forged"), line


def test_a_server_error_body_cannot_drive_the_terminal(tmp_path: Path) -> None:
    with serving(lambda n: (400, HOSTILE.encode())) as server:
        proc = cli(*openai_run(server, tmp_path, episodes=2), env=no_key_env())
    assert proc.returncode == 1
    safe_terminal_text(proc.stderr, "run")
    safe_terminal_text(proc.stdout, "run")
    assert all(line.startswith("selfcest run: ") for line in proc.stderr.strip().splitlines())
    assert "\\x1b[2J" in proc.stderr  # shown, escaped
    (folder,) = run_folders(tmp_path)
    assert len(read_errors(folder)) == 2  # the record keeps what the backend said


HOSTILE_TEXTS = [
    '=HYPERLINK("http://evil","x")',
    "+cmd|' /C calc'!A0",
    "-2+3",
    "@SUM(A1:A9)",
    "\tTAB",
    "\rCR",
    "\nLF",
    "'=already quoted",
    "''+twice",
    "'plain quote",
    "\x1b[31mred\x1b[0m",
    "$\\frac{1}{$",
    "line\nbreak\nselfcest leaderboard: error: forged",
    "\u202ereversed",
]


def hostile_runs(root: Path) -> dict[str, str]:
    """One run folder per hostile text, in every text field a spec can set; returns run_id ->
    the text."""
    made = {}
    for i, text in enumerate(HOSTILE_TEXTS):
        spec = make_spec(
            env_id=text,
            source=text,
            split=text,
            agent=text,
            model=text,
            backend=text,
            budget={"label": text},
            seed=-5 - i,
            n_episodes=None,
        )
        with RunFolder(root, spec) as run:
            for index in range(3):
                run.append_episode(make_episode(index, correct=False))
            made[spec.run_id] = text
    return made


def test_run_folders_cannot_put_formulas_into_the_leaderboard_csv(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    made = hostile_runs(runs)
    proc = cli("leaderboard", str(runs))
    assert proc.returncode == 0, proc.stderr
    with open(runs / "leaderboard.csv", newline="", encoding="utf-8") as handle:
        table = list(csv.DictReader(handle))
    assert len(table) == len(HOSTILE_TEXTS)
    text_columns = [c for c, t in LEADERBOARD_DTYPES.items() if t == "string"]
    for row in table:
        for col in text_columns:
            assert not row[col].startswith(("=", "+", "-", "@", "\t", "\r", "\n")), row[col]
        assert row["seed"].startswith("-")  # numbers are never quoted
        assert float(row["mean_reward"]) < 0 and row["mean_reward"].startswith("-")
    df = read_leaderboard_csv(runs / "leaderboard.csv")
    for _, row in df.iterrows():
        text = made[row["run_id"]]  # read back exactly, control characters as escapes
        for col in ("env_id", "source", "split", "agent", "model", "backend", "budget"):
            assert row[col] == printable(text), (col, row[col], text)
    assert set(df["agent"]) >= {t for t in HOSTILE_TEXTS if t.isprintable()}
    assert "\x1b" not in (runs / "leaderboard.csv").read_text()  # safe to cat
    safe_terminal_text(proc.stdout, "leaderboard")
    plots = tmp_path / "plots"
    proc = cli("plot", str(runs / "leaderboard.csv"), "--out", str(plots), "--meters", "gen_tokens")
    assert proc.returncode == 0, proc.stderr
    assert len(list(plots.glob("*.png"))) == len(list(plots.glob("*.svg"))) == len(HOSTILE_TEXTS)
    safe_terminal_text(proc.stdout + proc.stderr, "plot")


def test_warnings_and_suite_lines_are_escaped(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    stray = runs / "old\x1b[2Jrun\nselfcest leaderboard: error: forged"
    stray.mkdir(parents=True)
    (stray / "episodes.jsonl").write_text("")
    proc = cli("leaderboard", str(runs))
    assert proc.returncode == 1
    safe_terminal_text(proc.stderr, "leaderboard")
    (warning,) = proc.stderr.strip().splitlines()
    assert warning.startswith("selfcest leaderboard: warning: skipped run folder")
    assert "\\x1b[2J" in warning and "forged: it holds run files" in warning
    config = tmp_path / "suite.json"
    entry = {"env": MATH_ENV_ID, "agents": ["scripted-monolithic"], "env_args": {"preset": HOSTILE}}
    config.write_text(json.dumps({"runs": [entry]}))
    proc = cli("suite", str(config), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    safe_terminal_text(proc.stdout, "suite")
    safe_terminal_text(proc.stderr, "suite")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_the_envs_of_a_run_share_one_token_counter() -> None:
    """The run's env factory wraps the backend's tokenizer once (a Hugging Face counter reads
    the whole vocabulary, about 20 ms), not once per episode."""
    from transformers import AutoTokenizer

    from selfcest_env.agents.backends.default_model import default_model_dir
    from selfcest_env.agents.registry import make_agent
    from selfcest_env.tokens import HFTokenCounter

    tokenizer = AutoTokenizer.from_pretrained(default_model_dir())
    request = scripted_easy_request()
    agent = make_agent("scripted-monolithic", None)
    make_env = Runner("unused").make_env_factory(request, agent, tokenizer)
    first, second = make_env(), make_env()
    assert isinstance(first.counter, HFTokenCounter) and first.counter is second.counter
    assert first.counter.tokenizer is tokenizer
