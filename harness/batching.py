"""The rendezvous: the model calls that the runs of one round make, merged into shared batches.

The engine (:mod:`selfcest_env.harness.runner`) plays a round of every run in flight at once
through one :class:`~selfcest_env.rollout.Driver`. Each run's policy chooses the actions of its
contexts with ``act_batch``, and a model agent calls its backend's ``generate`` inside it:
zero, one or several times. :meth:`Rendezvous.act` is the driver's ``act`` function. It runs
every ``act_batch`` of the round in a thread of its own and lets one thread run at a time: a
thread runs until it calls ``generate`` on a backend routed through the rendezvous
(:meth:`Rendezvous.route`), where it waits, or until its ``act_batch`` returns. Once no thread
can go on, the requests of the waiting threads become one ``generate`` call per backend, made
on the driver's thread with the requests in the order of the runs; each waiting thread gets the
results of its own requests, and the threads run again, one at a time, until every
``act_batch`` has returned. Nothing waits on a clock: the rendezvous is reached when no thread
can go on, whatever number of calls each thread makes.

Taking turns keeps a round as deterministic as a sequential one: no two agents run at once (they
and their tokenizers need not be thread-safe), a merged batch is built in the same order every
time, and every routed model call runs on the driver's thread, as when runs play one by one.

What a thread gets is what its own call would have given: when a merged call raises or returns
the wrong number of results, each thread's requests are sent again on their own, and a thread
whose own call raises gets that exception (so an agent's
:func:`~selfcest_env.agents.base.generate_isolated` splits its batch as it would alone).
"""

from __future__ import annotations

import functools
import itertools
import logging
import queue
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from selfcest_env.agents.backends.base import Backend, GenerationRequest, GenerationResult
from selfcest_env.protocol import Action
from selfcest_env.rollout import ActionFailure, BatchPolicy, ContextView, RoundCalls, act_in_turn

logger = logging.getLogger(__name__)

Generate = Callable[[Sequence[GenerationRequest]], list[GenerationResult]]
#: What a waiting thread is sent back: its results, or the exception its own call raised.
Reply = list[GenerationResult] | Exception


class _Cancelled(BaseException):
    """Ends a round's thread that the driver stopped waiting for (a ``BaseException``, so that
    an agent's ``except Exception`` does not swallow it)."""


@dataclass
class _Waiting:
    """A thread waiting in ``generate``: the backend's own ``generate`` and the requests."""

    backend: Backend
    generate: Generate
    requests: list[GenerationRequest]


@dataclass
class _Returned:
    """A thread whose ``act_batch`` returned its actions, or raised ``error``."""

    actions: list[Action | ActionFailure]
    error: BaseException | None = None


class _Turn:
    """One policy's ``act_batch`` of a round, in a thread that runs only while the driver's
    thread waits for it."""

    def __init__(
        self, local: threading.local, policy: BatchPolicy, views: Sequence[ContextView]
    ) -> None:
        self._to_thread: queue.SimpleQueue[Reply | _Cancelled] = queue.SimpleQueue()
        self._to_driver: queue.SimpleQueue[_Waiting | _Returned] = queue.SimpleQueue()
        self._returned = False
        self._thread = threading.Thread(
            target=self._act,
            args=(local, policy, views),
            name=f"selfcest-act-{policy.name}",
            daemon=True,
        )

    # on the driver's thread ---------------------------------------------------------------

    def start(self) -> _Waiting | _Returned:
        """Run the thread until it waits in ``generate`` or returns."""
        self._thread.start()
        return self._next()

    def resume(self, reply: Reply) -> _Waiting | _Returned:
        """Hand the waiting thread ``reply`` and run it until it waits again or returns."""
        self._to_thread.put(reply)
        return self._next()

    def cancel(self) -> None:
        """Make a thread that has not returned raise :class:`_Cancelled` where it waits next."""
        if not self._returned:
            self._to_thread.put(_Cancelled())

    def _next(self) -> _Waiting | _Returned:
        message = self._to_driver.get()
        self._returned = isinstance(message, _Returned)
        return message

    # on the turn's thread -------------------------------------------------------------------

    def _act(
        self, local: threading.local, policy: BatchPolicy, views: Sequence[ContextView]
    ) -> None:
        local.turn = self
        try:
            message = _Returned(list(policy.act_batch(views)))
        except BaseException as exc:  # handed to the driver's thread, which raises it
            message = _Returned([], exc)
        self._to_driver.put(message)

    def wait(self, waiting: _Waiting) -> list[GenerationResult]:
        """Hand ``waiting`` to the driver's thread and wait for the results."""
        self._to_driver.put(waiting)
        reply = self._to_thread.get()
        if isinstance(reply, BaseException):
            raise reply
        return reply


class Rendezvous:
    """Merges the ``generate`` calls of a round's policies (see the module docstring).

    ``calls`` and ``requests`` count the ``generate`` calls made to routed backends and the
    requests they carried.
    """

    def __init__(self) -> None:
        self._local = threading.local()
        self._routed: weakref.WeakSet[Backend] = weakref.WeakSet()
        self.calls = 0
        self.requests = 0

    def route(self, backend: Backend) -> None:
        """Route ``backend.generate`` through the rendezvous from now on.

        Agents keep the backend object they were built with (the trained clone controller
        checks its type), so no stand-in is handed to them: ``generate`` is replaced on the
        backend instance itself. Called from outside a round's threads it goes straight to the
        backend. A backend that derives copies of itself (``TransformersBackend.derived``: the
        trained controllers' adapted models, made when they first act) has each copy routed as
        it is made. Routing a backend again changes nothing.
        """
        if backend in self._routed:
            return
        self._routed.add(backend)
        backend.generate = functools.partial(self._generate, backend, backend.generate)  # type: ignore[method-assign]
        derive = getattr(backend, "derived", None)
        if callable(derive):
            backend.derived = functools.partial(self._routed_copy, derive)  # type: ignore[attr-defined]

    def _routed_copy(self, derive: Callable[..., Backend], *args: Any, **kwargs: Any) -> Backend:
        """A routed backend's ``derived``: the copy it returns, routed the first time (the
        runs sharing a copy share its batches too)."""
        copy = derive(*args, **kwargs)
        self.route(copy)
        return copy

    def act(self, calls: RoundCalls) -> list[list[Action | ActionFailure]]:
        """The driver's ``act`` function: every policy's actions, their model calls merged."""
        if len(calls) < 2:
            return act_in_turn(calls)
        turns = [_Turn(self._local, policy, views) for policy, views in calls]
        try:
            messages = [turn.start() for turn in turns]
            while waiting := [i for i, m in enumerate(messages) if isinstance(m, _Waiting)]:
                replies = self._serve([messages[i] for i in waiting])  # type: ignore[misc]
                for i, reply in zip(waiting, replies):
                    messages[i] = turns[i].resume(reply)
        finally:
            for turn in turns:
                turn.cancel()
        returned: list[_Returned] = messages  # type: ignore[assignment]
        for message in returned:
            if message.error is not None:
                raise message.error
        return [message.actions for message in returned]

    def _generate(
        self, backend: Backend, generate: Generate, requests: Sequence[GenerationRequest]
    ) -> list[GenerationResult]:
        """A routed backend's ``generate``: the calling thread's turn waits for the merged
        call; a call from any other thread goes straight to the backend."""
        turn: _Turn | None = getattr(self._local, "turn", None)
        if turn is None:
            return self._issue(generate, requests)
        return turn.wait(_Waiting(backend, generate, list(requests)))

    def _serve(self, waiting: list[_Waiting]) -> list[Reply]:
        """The replies of the waiting threads: one merged call per backend."""
        by_backend: dict[int, list[int]] = {}
        for position, item in enumerate(waiting):
            by_backend.setdefault(id(item.backend), []).append(position)
        replies: list[Reply] = [[] for _ in waiting]
        for positions in by_backend.values():
            parts = [waiting[p].requests for p in positions]
            for position, reply in zip(
                positions, self._merged(waiting[positions[0]].generate, parts)
            ):
                replies[position] = reply
        return replies

    def _merged(self, generate: Generate, parts: list[list[GenerationRequest]]) -> list[Reply]:
        """One call for every part, split back; each part alone if that call fails."""
        if len(parts) > 1:
            merged = [request for part in parts for request in part]
            results = self._reply(generate, merged)
            if not isinstance(results, Exception) and len(results) == len(merged):
                ends = list(itertools.accumulate(len(part) for part in parts))
                return [results[end - len(part) : end] for part, end in zip(parts, ends)]
            failure = (
                f"raised {type(results).__name__}: {results}"
                if isinstance(results, Exception)
                else f"returned {len(results)} results"
            )
            logger.warning(
                "a merged batch of %d requests from %d runs %s; sending each run's requests "
                "on their own",
                len(merged),
                len(parts),
                failure,
            )
        return [self._reply(generate, part) for part in parts]

    def _reply(self, generate: Generate, requests: list[GenerationRequest]) -> Reply:
        """The results of one call, or the exception it raised."""
        try:
            return self._issue(generate, requests)
        except Exception as exc:  # the thread that made the call raises it, as if alone
            return exc

    def _issue(
        self, generate: Generate, requests: Sequence[GenerationRequest]
    ) -> list[GenerationResult]:
        """Call the backend, counting the call."""
        self.calls += 1
        self.requests += len(requests)
        return list(generate(requests))
