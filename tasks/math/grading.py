"""Math answer extraction and grading.

Extraction (:func:`extract_final_answer`) turns a model's whole reply into its final answer:

1. the text after the last ``Answer:`` marker (case-insensitive; ``Final Answer:``, ``**Answer:**``
   count too), its first non-empty line unless a ``\\boxed{...}`` follows the marker;
2. within that (or the whole reply when there is no marker), the content of the last
   ``\\boxed{...}`` / ``\\fbox{...}`` (nested braces handled);
3. else the text after the last GSM8K ``#### `` marker;
4. else the reply itself.

Grading:

* :func:`grade_integer` (the arithmetic task): the last number in the extracted answer must equal
  the gold integer exactly; ``1,234``, ``1234.0``, ``+1234``, ``\\boxed{1234}`` all count.
* :func:`grade_math` (datasets): exact comparison when both sides are plain numbers (fast path,
  no sympy), else LaTeX-aware equivalence with ``math_verify`` (``parse`` + ``verify``) run in a
  separate worker process under a hard deadline (:class:`MathVerifier`). ``math_verify``'s own
  ``signal.alarm`` timeouts are switched off (they fail off the main thread and cannot interrupt
  C-level big-integer work); a timeout kills the worker, which is restarted on the next call.
  Timeouts and errors give score 0 with ``details["error"]`` set; grading never raises for a bad
  answer and never hangs.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import queue
import re
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

from ..base import Grade

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------
# Extraction
# --------------------------------------------------------------------------------------------

_ANSWER_MARKER = re.compile(r"\banswer\s*(?:\*\*|__)?\s*[:：]", re.IGNORECASE)
_BOX_COMMAND = re.compile(r"\\(?:boxed|fbox)\s*")
_GSM8K_MARKER = "####"
_NUMBER = re.compile(
    r"(?<![\d.])[-+\u2212]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\d])"
)
_PLAIN_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?")
#: Exponents beyond this are not expanded exactly (``1e999999999`` would take forever).
_MAX_EXPONENT = 400
#: Longest number (in characters) parsed exactly; longer ones are left to the slow path.
_MAX_NUMBER_CHARS = 4000


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, nested braces and all.

    ``\\boxed 5`` (no braces) gives ``"5"``. An unclosed box gives everything after its brace.
    Returns ``None`` when there is no box.
    """
    matches = list(_BOX_COMMAND.finditer(text))
    for m in reversed(matches):
        start = m.end()
        if start < len(text) and text[start] == "{":
            depth = 0
            for i in range(start, len(text)):
                c = text[i]
                if c == "{" and (i == 0 or text[i - 1] != "\\"):
                    depth += 1
                elif c == "}" and text[i - 1] != "\\":
                    depth -= 1
                    if depth == 0:
                        return text[start + 1 : i].strip()
            return text[start + 1 :].strip()
        # ``\boxed 5``: the next run of non-space characters (``\boxed`` followed by a space).
        if m.group(0).endswith((" ", "\t")):
            token = re.match(r"[^\s$]+", text[start:])
            if token:
                return token.group(0)
    return None


def extract_after_marker(text: str) -> str | None:
    """Text after the last ``Answer:`` marker, or ``None`` when there is none."""
    last = None
    for last in _ANSWER_MARKER.finditer(text):  # noqa: B007 - we want the last match
        pass
    if last is None:
        return None
    return text[last.end() :]


def extract_gsm8k(text: str) -> str | None:
    """Text after the last GSM8K ``####`` marker (first line, commas removed), or ``None``."""
    pos = text.rfind(_GSM8K_MARKER)
    if pos < 0:
        return None
    rest = text[pos + len(_GSM8K_MARKER) :].strip()
    line = rest.splitlines()[0] if rest else ""
    return line.replace(",", "").strip()


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return text.strip()


def _clean(text: str) -> str:
    """Strip surrounding white space, Markdown emphasis, ``$`` and a final full stop."""
    s = text.strip()
    for _ in range(3):
        before = s
        s = s.strip().strip("*_").strip()
        if s.startswith("$$") and s.endswith("$$") and len(s) >= 4:
            s = s[2:-2]
        elif s.startswith("$") and s.endswith("$") and len(s) >= 2 and not s.startswith("\\$"):
            s = s[1:-1]
        if s.startswith("\\(") and s.endswith("\\)"):
            s = s[2:-2]
        if s.startswith("\\[") and s.endswith("\\]"):
            s = s[2:-2]
        s = s.strip()
        if s.endswith("."):
            s = s[:-1]
        if s == before:
            break
    return s.strip()


@dataclass(frozen=True)
class Extraction:
    """The result of :func:`extract`: the final answer and how it was found.

    ``how`` is ``"marker"`` (after ``Answer:``), ``"boxed"``, ``"gsm8k"`` or ``"raw"`` (the whole
    reply: no marker of any kind).
    """

    text: str
    how: Literal["marker", "boxed", "gsm8k", "raw"]


def extract(text: str) -> Extraction:
    """Find the final answer in a reply (rules in the module docstring)."""
    after = extract_after_marker(text)
    scope = text if after is None else after
    boxed = extract_boxed(scope)
    if boxed is not None:
        return Extraction(_clean(boxed), "boxed")
    if after is not None:
        return Extraction(_clean(_first_line(after)), "marker")
    gsm = extract_gsm8k(text)
    if gsm is not None:
        return Extraction(_clean(gsm), "gsm8k")
    return Extraction(text.strip(), "raw")


def extract_final_answer(text: str) -> str:
    """The final answer in a reply, as text (see :func:`extract`)."""
    return extract(text).text


_LATEX_DIGIT_GAP = re.compile(r"(?<=\d)(?:\{,\}|\\[,!; ])(?=\d)")


def _normalise_digits(text: str) -> str:
    """Drop LaTeX digit grouping (``1{,}234``, ``1\\,234``) and read a Unicode minus as ``-``."""
    return _LATEX_DIGIT_GAP.sub("", text).replace("\u2212", "-")


def parse_number(text: str) -> Fraction | None:
    """Exact value of a plain number (``-1,234``, ``1234.0``, ``+5``, ``1.5e3``), else ``None``.

    The whole of ``text`` (after stripping spaces) must be the number; LaTeX digit grouping
    (``1{,}234``) is allowed.
    """
    s = _normalise_digits(text.strip())
    if len(s) > _MAX_NUMBER_CHARS or not _PLAIN_NUMBER.fullmatch(s):
        return None
    s = s.replace(",", "")
    exp = re.search(r"[eE]([-+]?\d+)$", s)
    if exp and abs(int(exp.group(1))) > _MAX_EXPONENT:
        return None
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def last_number(text: str) -> tuple[str, Fraction] | None:
    """The last number in ``text`` as ``(spelling, exact value)``, or ``None`` if it has none."""
    for m in reversed(list(_NUMBER.finditer(_normalise_digits(text)))):
        value = parse_number(m.group(0))
        if value is not None:
            return m.group(0), value
    return None


def _fmt(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else str(value)


# --------------------------------------------------------------------------------------------
# Integer grading (arithmetic)
# --------------------------------------------------------------------------------------------


def grade_integer(answer: str, gold: str | int) -> Grade:
    """Grade ``answer`` against an exact integer: the last number of the extracted answer must
    equal ``gold`` (``1,234``, ``1234.0``, ``\\boxed{1234}``, ``Answer: 1234`` all count)."""
    gold_value = parse_number(str(gold))
    if gold_value is None or gold_value.denominator != 1:
        raise ValueError(f"gold answer {gold!r} is not an integer")
    found = extract(answer)
    hit = last_number(found.text)
    if hit is None:
        return Grade(0.0, False, {"extracted": found.text, "how": found.how, "reason": "no number"})
    spelling, value = hit
    ok = value == gold_value
    return Grade(
        1.0 if ok else 0.0,
        ok,
        {"extracted": found.text, "how": found.how, "number": spelling, "value": _fmt(value)},
    )


def integer_answer_key(answer: str) -> str | None:
    """``answer`` as :func:`grade_integer` reads it: the exact value of the last number of its
    final answer (``"3"`` for ``"2 + 1 = 3."``); ``None`` when it has no number (never correct)."""
    hit = last_number(extract(answer).text)
    return None if hit is None else _fmt(hit[1])


def math_answer_key(answer: str) -> str | None:
    """``answer`` as :func:`grade_math` reads it: the exact value of its final answer when that
    is a plain number (a trailing unit word dropped), else the final answer without white space;
    ``None`` when there is none. Spellings that only ``math_verify`` finds equivalent
    (``\\frac{1}{2}`` and ``0.5``) keep different keys."""
    text = extract(answer).text
    value = parse_number(_strip_text_units(text))
    if value is not None:
        return _fmt(value)
    return "".join(text.split()) or None


# --------------------------------------------------------------------------------------------
# math-verify under a hard deadline
# --------------------------------------------------------------------------------------------

_WORKER_MODULE = "selfcest_env.tasks.math._verify_worker"
#: Default seconds allowed for one ``math_verify`` comparison (parse both sides + verify).
DEFAULT_TIMEOUT = 5.0
#: Longest extracted answer handed to ``math_verify`` (the tail is kept).
MAX_ANSWER_CHARS = 4000


class VerifyTimeout(Exception):
    """A ``math_verify`` comparison ran past its deadline."""


class _Worker:
    """One ``math_verify`` subprocess speaking JSON lines on stdin/stdout."""

    def __init__(self, startup_timeout: float) -> None:
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        # The child must import this package the way the parent does (sys.path edits too).
        env["PYTHONPATH"] = os.pathsep.join(
            [p for p in sys.path if p] + [p for p in [env.get("PYTHONPATH")] if p]
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-m", _WORKER_MODULE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            bufsize=1,
            env=env,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.stderr_tail: deque[str] = deque(maxlen=20)
        self._next_id = 0
        threading.Thread(target=self._pump_stdout, daemon=True).start()
        threading.Thread(target=self._pump_stderr, daemon=True).start()
        try:
            first = self.lines.get(timeout=startup_timeout)
        except queue.Empty:
            self.kill()
            raise RuntimeError(
                f"math_verify worker did not start within {startup_timeout:.0f} s"
            ) from None
        if first is None or not first.startswith('{"ready": true'):
            self.kill()
            raise RuntimeError(
                "math_verify worker failed to start: " + " | ".join(self.stderr_tail)
            )

    def _pump_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _pump_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr_tail.append(line.rstrip())

    def call(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send one request and wait at most ``timeout`` seconds for its reply."""
        self._next_id += 1
        request = {**request, "id": self._next_id}
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise RuntimeError(f"math_verify worker died: {e}") from e
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise VerifyTimeout(f"math_verify took longer than {timeout:g} s")
            try:
                line = self.lines.get(timeout=remaining)
            except queue.Empty:
                raise VerifyTimeout(f"math_verify took longer than {timeout:g} s") from None
            if line is None:
                raise RuntimeError("math_verify worker exited: " + " | ".join(self.stderr_tail))
            reply = json.loads(line)
            if reply.get("id") == self._next_id:
                return reply

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            logger.warning("math_verify worker %d did not exit after kill", self.proc.pid)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


def _verify_inline(gold: str, pred: str, pred_raw: bool) -> bool:
    """Compare with ``math_verify`` in this process, its own timeouts off (used by workers)."""
    from math_verify import parse, verify

    def _parse(s: str, raw: bool) -> list[Any]:
        if not raw:
            parsed = parse(f"${s}$", parsing_timeout=None)
            if parsed:
                return parsed
        return parse(s, parsing_timeout=None)

    gold_parsed = _parse(gold, False)
    if not gold_parsed:
        raise ValueError(f"math_verify could not parse the gold answer {gold!r}")
    pred_parsed = _parse(pred, pred_raw)
    if not pred_parsed:
        return False
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))


class MathVerifier:
    """Runs ``math_verify`` comparisons under a hard deadline.

    Args:
        timeout: Seconds allowed per comparison.
        max_workers: Most worker processes run at once (callers in more threads wait).
        backend: ``"process"`` (default; a timed-out worker is killed, so nothing keeps running)
            or ``"thread"`` (no subprocess; a timed-out comparison is abandoned in a daemon thread
            and keeps using CPU until it ends, and C-level work such as a huge integer power
            holds the GIL so the deadline cannot even be noticed: use only where subprocesses
            are not allowed).
        startup_timeout: Seconds allowed for a worker process to start (import sympy).
    """

    def __init__(
        self,
        timeout: float = DEFAULT_TIMEOUT,
        *,
        max_workers: int = 2,
        backend: Literal["process", "thread"] = "process",
        startup_timeout: float = 120.0,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        if backend not in ("process", "thread"):
            raise ValueError(f"backend must be 'process' or 'thread', got {backend!r}")
        self.timeout = float(timeout)
        self.max_workers = max_workers
        self.backend = backend
        self.startup_timeout = startup_timeout
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._slots = threading.Semaphore(max_workers)
        self._all: list[_Worker] = []
        self._pid = os.getpid()
        _LIVE.add(self)

    def _check_fork(self) -> None:
        # After a fork the workers belong to the parent: forget them (do not kill them).
        if os.getpid() != self._pid:
            self._pid = os.getpid()
            self._lock = threading.Lock()
            self._idle = []
            self._all = []
            self._slots = threading.Semaphore(self.max_workers)

    def verify(
        self, gold: str, pred: str, *, pred_raw: bool = False, timeout: float | None = None
    ) -> bool:
        """Whether ``pred`` is equivalent to ``gold``.

        Raises :class:`VerifyTimeout` past the deadline and ``RuntimeError`` / ``ValueError`` when
        the comparison itself fails (``grade_math`` turns both into a score of 0).
        """
        limit = self.timeout if timeout is None else float(timeout)
        if self.backend == "thread":
            _warm_inline()  # import sympy here, outside the deadline
            return _run_in_thread(lambda: _verify_inline(gold, pred, pred_raw), limit)
        self._check_fork()
        with self._slots:
            with self._lock:
                worker = self._idle.pop() if self._idle else None
            if worker is None or not worker.alive():
                if worker is not None:
                    self._forget(worker)
                worker = _Worker(self.startup_timeout)
                with self._lock:
                    self._all.append(worker)
            try:
                reply = worker.call({"gold": gold, "pred": pred, "pred_raw": pred_raw}, limit)
            except (VerifyTimeout, RuntimeError, ValueError):
                worker.kill()
                self._forget(worker)
                raise
            with self._lock:
                self._idle.append(worker)
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return bool(reply["equal"])

    def _forget(self, worker: _Worker) -> None:
        with self._lock:
            if worker in self._all:
                self._all.remove(worker)

    def close(self) -> None:
        """Stop every worker process (they are restarted on the next :meth:`verify`)."""
        if os.getpid() != self._pid:
            return
        with self._lock:
            workers, self._all, self._idle = self._all, [], []
        for w in workers:
            w.kill()


_inline_warm = False


def _warm_inline() -> None:
    global _inline_warm
    if not _inline_warm:
        _verify_inline("1", "1", False)
        _inline_warm = True


def _run_in_thread(fn: Callable[[], bool], timeout: float) -> bool:
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except Exception as e:  # reported to the caller below
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise VerifyTimeout(f"math_verify took longer than {timeout:g} s")
    if "error" in box:
        raise RuntimeError(f"{type(box['error']).__name__}: {box['error']}")
    return bool(box["value"])


_LIVE: weakref.WeakSet[MathVerifier] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for v in list(_LIVE):
        v.close()


_default: MathVerifier | None = None
_default_lock = threading.Lock()


def default_verifier() -> MathVerifier:
    """The shared :class:`MathVerifier` used when ``grade_math`` is given none.

    Its timeout is read from ``SELFCEST_MATH_VERIFY_TIMEOUT`` (seconds, default 5) and its worker
    count from ``SELFCEST_MATH_VERIFY_WORKERS`` (default 2).
    """
    global _default
    with _default_lock:
        if _default is None:
            _default = MathVerifier(
                float(os.environ.get("SELFCEST_MATH_VERIFY_TIMEOUT", DEFAULT_TIMEOUT)),
                max_workers=int(os.environ.get("SELFCEST_MATH_VERIFY_WORKERS", "2")),
            )
        return _default


def grade_math(
    answer: str,
    gold: str,
    *,
    aliases: tuple[str, ...] = (),
    timeout: float | None = None,
    verifier: MathVerifier | None = None,
) -> Grade:
    """Grade a reply against a gold answer with LaTeX-aware equivalence.

    Plain numbers on both sides (``1,234``, ``-0.5``, ``1234.0``) are compared exactly here;
    everything else goes to ``math_verify`` under ``timeout`` seconds (default: the verifier's).
    ``aliases`` are other accepted gold answers. Never raises for a bad answer: a timeout or
    failure gives score 0 and ``details["error"]``.
    """
    found = extract(answer)
    pred = found.text
    details: dict[str, Any] = {"extracted": pred[:500], "how": found.how}
    golds = (gold, *aliases)
    pred_num = parse_number(_strip_text_units(pred))
    gold_nums = [parse_number(_strip_text_units(g)) for g in golds]
    if pred_num is not None and all(g is not None for g in gold_nums):
        ok = any(pred_num == g for g in gold_nums)
        details["method"] = "exact"
        return Grade(1.0 if ok else 0.0, ok, details)
    details["method"] = "math_verify"
    if not pred.strip():
        details["reason"] = "empty answer"
        return Grade(0.0, False, details)
    v = verifier or default_verifier()
    pred_text = pred[-MAX_ANSWER_CHARS:]
    last_error: str | None = None
    for g in golds:
        try:
            if v.verify(g, pred_text, pred_raw=found.how == "raw", timeout=timeout):
                return Grade(1.0, True, details)
        except VerifyTimeout as e:
            last_error = f"timeout: {e}"
        except (RuntimeError, ValueError) as e:
            last_error = f"{type(e).__name__}: {e}"
    if last_error is not None:
        details["error"] = last_error
    return Grade(0.0, False, details)


_TEXT_UNIT = re.compile(r"^(.*?\d)(?:\s+[a-zA-Z]{2,}\.?|\s*\\(?:text|mbox|mathrm)\{[^{}]*\})$")


def _strip_text_units(s: str) -> str:
    """``"5 cm"`` / ``"5\\text{ cm}"`` -> ``"5"`` (one trailing word of 2+ letters)."""
    s = s.strip()
    if s.startswith("\\$"):
        s = s[2:].strip()
    elif s.startswith("$") and "$" not in s[1:]:
        s = s[1:].strip()
    m = _TEXT_UNIT.match(s)
    return m.group(1) if m else s
