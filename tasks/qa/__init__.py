"""Multi-hop QA task sources: a synthetic generator and 2WikiMultihopQA / MuSiQue / HotpotQA.

Build one by name with :func:`selfcest_env.tasks.registry.make_source`; the metrics live in
:mod:`.metrics`.
"""

from __future__ import annotations

from .datasets import HotpotQATask, MuSiQueTask, QADatasetSource, TwoWikiMultihopQATask
from .metrics import exact_match, f1, grade_qa, normalize_answer
from .synthetic import QUESTION_TYPES, SyntheticQAConfig, SyntheticQATask

__all__ = [
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
    "normalize_answer",
]
