"""The synthetic QA generator pinned by digests of its output.

Each digest covers 200 instances of one split (task id, prompt, answer, aliases, every context
paragraph, the metadata) and the grades of three replies to each. The values were computed on the
single-module generator before it became a package; any change to what is generated or how it is
graded changes them. When a change is meant, recompute with :func:`digest` and say why in the
commit.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from selfcest_env.tasks.base import TaskSource
from selfcest_env.tasks.qa.synthetic import SyntheticQATask

#: label -> (source settings, digest of instances 0..199 per split).
DIGESTS: dict[str, tuple[dict[str, Any], dict[str, str]]] = {
    "default": (
        {"preset": "default"},
        {
            "train": "e93d9ffac4b3aacbc72f9bdeb8391ae59f60a84b46815c413da733b2f3a06090",
            "dev": "6069534f4e4e8e0e37bd8215b203ec3915ec82016e2685ea4083691eb5e63225",
            "test": "e303adb1fb9a4adcd627f36a89efe2482d3b1571fdcca242923b08dc3c44d4ea",
        },
    ),
    "easy": (
        {"preset": "easy"},
        {
            "train": "dc6007aa88755adf58ac1de1f432072e6f6505ae11bbff6eef0085137f2c627c",
            "dev": "c88c107807f1e5e8a9531ddcaba683a2989fd0dd0b524c6c489b9ffd1a03136d",
            "test": "19c0973c6b07715a6524463cfcf3df426934e2bd7f0eee472b1a108117bedb13",
        },
    ),
    "context_tokens": (
        {"context_tokens": 3000, "seed": 3},
        {
            "train": "e7e8c638fa3421853df955a7bdbb112fa253b7d1ba6554e5cce465a727d4adb2",
            "dev": "8a5fea9d4b69529f49b9db43b645cb938c3ffdaf6efe2645fe81b65d0d698e03",
            "test": "3b9f53229bf67019989a42ecfd3b1d8669248c7d76383a0ef63973ee68578459",
        },
    ),
    "wide": (
        {"seed": 9, "num_distractors": 20, "surname_alias": False},
        {
            "train": "507f0fbc16fbe36465b8dfaf36cb6c6c61d27da789315182feceec0fa0f89f76",
            "dev": "9b90d2aabf580d77069638e07f22861aed7ca9a773ba8e6b0ceea1771651c685",
            "test": "a29172326b07f6636dbd8b1455a52438125bb60b1d8e29afd2728e30719fb3e6",
        },
    ),
}


def digest(task: TaskSource, split: str, count: int = 200) -> str:
    """SHA-256 over instances ``0..count-1`` of ``split`` and the grades of three replies each."""
    h = hashlib.sha256()
    for index in range(count):
        inst = task.get(split, index)
        parts: list[object] = [
            inst.task_id,
            inst.prompt,
            inst.answer,
            list(inst.aliases),
            [[c.key, c.text] for c in inst.context],
            sorted((k, repr(v)) for k, v in inst.metadata.items()),
        ]
        for reply in (inst.answer, f"It is {inst.answer}.", "Nobody"):
            grade = task.grade(inst, reply)
            details = sorted((k, repr(v)) for k, v in grade.details.items())
            parts.append([grade.score, grade.correct, details])
        h.update(json.dumps(parts).encode("utf-8"))
    return h.hexdigest()


@pytest.mark.parametrize("label", sorted(DIGESTS))
def test_generated_instances_match_their_digests(label: str) -> None:
    settings, expected = DIGESTS[label]
    task = SyntheticQATask(**settings)
    assert {split: digest(task, split) for split in expected} == expected
