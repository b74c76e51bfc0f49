"""``math_verify`` comparisons under a hard deadline (:class:`MathVerifier`).

``math_verify``'s own ``signal.alarm`` timeouts are switched off (they fail off the main thread
and cannot interrupt C-level big-integer work). Instead each comparison runs in a worker process
(:mod:`._verify_worker`, JSON lines on stdin/stdout) that is killed when it runs past its
deadline and restarted on the next call; a ``"thread"`` backend exists for places where
subprocesses are not allowed. :func:`default_verifier` is the shared instance that
:func:`~.grading.grade_math` uses when given none.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import queue
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, Literal

logger = logging.getLogger(__name__)

_WORKER_MODULE = "selfcest_env.tasks.math._verify_worker"
#: Default seconds allowed for one ``math_verify`` comparison (parse both sides + verify).
DEFAULT_TIMEOUT = 5.0


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


def verify_inline(gold: str, pred: str, pred_raw: bool) -> bool:
    """Whether ``pred`` is equivalent to ``gold`` by ``math_verify`` in this process, its own
    timeouts off (what a worker process runs; ``pred_raw``: hand ``pred`` over without ``$``)."""
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
        the comparison itself fails (:func:`~.grading.grade_math` turns both into a score of 0).
        """
        limit = self.timeout if timeout is None else float(timeout)
        if self.backend == "thread":
            _warm_inline()  # import sympy here, outside the deadline
            return _run_in_thread(lambda: verify_inline(gold, pred, pred_raw), limit)
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
        verify_inline("1", "1", False)
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
