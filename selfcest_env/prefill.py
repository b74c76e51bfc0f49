"""What a prefix cache could save: the ledger's ``uncached_prompt_tokens``.

An inference server with a prefix cache (vLLM's automatic prefix caching, SGLang's radix cache)
prefills a prompt only after the longest prefix whose keys and values it already holds. Within
one episode those are the tokens of every sequence processed before: each earlier turn's prompt
followed by the tokens that turn generated. :class:`PrefixLedger` keeps those sequences and
answers, for a new prompt, how many of its tokens no earlier sequence starts with: the prefill a
cache that keeps everything of the episode cannot save. So a prefix that several contexts share
(the clones' common system prompt, a fork child's inherited context, a root's own earlier turns)
is counted once, by the first turn that prefills it.

The figure is a lower bound on what a real server prefills (its cache may evict, it shares
across episodes too, and it recomputes at least one token), and it is exact in the ledger's own
token counts: the sequences are the counter's token ids (stand-in ids for the offline counter,
:meth:`~selfcest_env.tokens.OfflineTokenCounter.prompt_ids`), so a prompt whose rendering merges
tokens across a boundary that the earlier sequence did not (a byte-pair merge, a chat template's
line break) shares only the part before it, as on a server.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def shared_prefix(first: np.ndarray, second: np.ndarray) -> int:
    """The number of leading tokens ``first`` and ``second`` have in common."""
    size = min(len(first), len(second))
    equal = first[:size] == second[:size]
    return size if bool(equal.all()) else int(np.argmin(equal))


class PrefixLedger:
    """The token sequences one episode processed, for :meth:`uncached` (see the module
    docstring). Sequences that another one extends are dropped, so it holds one sequence per
    branch of the token tree, not one per turn."""

    def __init__(self) -> None:
        self._sequences: list[np.ndarray] = []

    def uncached(self, prompt: Sequence[int]) -> int:
        """Tokens of ``prompt`` after the longest prefix it shares with a sequence added so far."""
        ids = np.asarray(prompt, dtype=np.int64)
        cached = max((shared_prefix(ids, seen) for seen in self._sequences), default=0)
        return len(ids) - cached

    def add(self, sequence: Sequence[int]) -> None:
        """Note that ``sequence`` (a prompt and what was generated after it) was processed."""
        ids = np.asarray(sequence, dtype=np.int64)
        if not len(ids):
            return
        kept = []
        for seen in self._sequences:
            common = shared_prefix(ids, seen)
            if common == len(ids):  # already held
                return
            if common < len(seen):  # not a prefix of the new one
                kept.append(seen)
        self._sequences = [*kept, ids]
