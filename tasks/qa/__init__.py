"""Multi-hop QA task sources: a synthetic generator and 2WikiMultihopQA / MuSiQue / HotpotQA.

:func:`make_qa_source` builds a source by name; the metrics live in :mod:`.metrics`.
"""

from __future__ import annotations

from typing import Any

from ..base import TaskSource
from .datasets import HotpotQATask, MuSiQueTask, QADatasetSource, TwoWikiMultihopQATask
from .metrics import exact_match, f1, grade_qa, normalize_answer
from .synthetic import QUESTION_TYPES, SyntheticQAConfig, SyntheticQATask, solve

__all__ = [
    "QA_SOURCES",
    "QUESTION_TYPES",
    "HotpotQATask",
    "MuSiQueTask",
    "QADatasetSource",
    "SyntheticQAConfig",
    "SyntheticQATask",
    "TwoWikiMultihopQATask",
    "exact_match",
    "f1",
    "grade_qa",
    "make_qa_source",
    "normalize_answer",
    "qa_source_names",
    "solve",
]

#: Source name -> class. Names are matched case-insensitively, ignoring ``-`` and ``_``.
QA_SOURCES: dict[str, type[TaskSource]] = {
    "synthetic": SyntheticQATask,
    "2wikimultihopqa": TwoWikiMultihopQATask,
    "musique": MuSiQueTask,
    "hotpotqa": HotpotQATask,
}


def qa_source_names() -> tuple[str, ...]:
    """The names :func:`make_qa_source` accepts."""
    return tuple(QA_SOURCES)


def make_qa_source(source: str = "synthetic", **kwargs: Any) -> TaskSource:
    """Build the QA source named ``source`` with ``kwargs`` (its class's keyword arguments).

    Raises:
        ValueError: ``source`` is not one of :func:`qa_source_names`.
    """
    key = str(source).lower().replace("-", "").replace("_", "")
    cls = QA_SOURCES.get(key)
    if cls is None:
        raise ValueError(
            f"unknown QA source {source!r}; valid names: {', '.join(qa_source_names())}"
        )
    return cls(**kwargs)
