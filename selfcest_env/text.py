"""Text from models, servers and run folders, made safe to show.

:func:`printable` is the one escaping rule for everything SelfCest prints, logs, renders or puts
into a CSV cell: a model's answer, a server's error body, a run folder's name.
"""

from __future__ import annotations


def printable(text: str) -> str:
    """``text`` safe to show on a terminal, in a log or on a plot: every character that is not
    printable (control characters such as ESC, line breaks, tabs, bidirectional overrides,
    zero-width characters, lone surrogates; see :meth:`str.isprintable`; the plain space stays)
    is written as its Python escape (``\\x1b``, ``\\n``, ``\\u202e``), so that such text can
    neither drive a terminal nor forge a line."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(
        ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text
    )
