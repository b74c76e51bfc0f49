"""Math dataset loaders: GSM8K, MATH (all or a hard subset), MATH-500 and AIME.

Every loader reads either local files or a hub dataset:

* ``path=`` a local JSONL / JSON / parquet / CSV file, a directory of them, or a mapping
  ``{split: file(s)}`` (our split names ``train`` / ``dev`` / ``test``, or the dataset's own names),
  read by :func:`selfcest_env.tasks.loading.read_local_rows`. A single file (or directory) holds
  one split: the one its name says (``train``, ``dev``, ``val``, ``validation``, ``test``), else
  ``file_split`` (default ``"test"``).
* ``hub_id=`` (and ``hub_config=``, ``revision=``) a hub dataset, through Hugging Face
  ``datasets``; each class has a default id that is used when no ``path`` is given.

GSM8K's default resolution, when neither ``path`` nor ``hub_id`` is given: the file or directory
named by the environment variable ``SELFCEST_GSM8K_PATH``; else the hub id ``openai/gsm8k``
(config ``main``).

Splits: ``train`` and ``test`` map onto the dataset's splits of those names (``split_map``
overrides the mapping). ``dev`` maps onto ``validation`` / ``dev`` / ``val`` when the dataset has
one; otherwise a deterministic ``dev_fraction`` of ``train`` (picked by a stable hash of the problem
text) becomes dev and is removed from train, so the two stay disjoint. Requesting a split that the
loaded data does not have raises ``ValueError`` naming the splits it has.

Instances keep dataset order; ``limit`` keeps the first ``limit`` of each split. Prompts are the
problem text only (the environment adds any instructions); solutions never go into metadata.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..base import SPLITS, Grade, TaskInstance
from ..extraction import gsm8k_answer, last_box
from ..loading import DatasetSource, TaggedRows, load_hub_rows, read_local_rows
from .grading import grade_math

logger = logging.getLogger(__name__)

#: Names the GSM8K file or directory used when neither ``path`` nor ``hub_id`` is given.
GSM8K_PATH_ENV = "SELFCEST_GSM8K_PATH"

_DEV_NAMES = ("validation", "dev", "valid", "val")
_SPLIT_WORDS = (
    ("train", "train"),
    ("validation", "dev"),
    ("valid", "dev"),
    ("dev", "dev"),
    ("val", "dev"),
    ("test", "test"),
)


def _split_from_name(name: str) -> str | None:
    stem = Path(name).name.lower()
    for word, split in _SPLIT_WORDS:
        if re.search(rf"(?:^|[^a-z]){word}(?:[^a-z]|$)", stem):
            return split
    return None


def _field(row: Mapping[str, Any], names: Iterable[str], *, what: str) -> Any:
    lowered = {k.lower(): k for k in row}
    for name in names:
        key = lowered.get(name.lower())
        if key is not None and row[key] is not None:
            return row[key]
    raise KeyError(f"row has no {what} field (looked for {list(names)}); fields: {sorted(row)}")


def _maybe_field(row: Mapping[str, Any], names: Iterable[str]) -> Any:
    try:
        return _field(row, names, what="")
    except KeyError:
        return None


class DatasetMathSource(DatasetSource):
    """Base class of the finite math loaders (see the module docstring for every argument).

    Subclasses set :attr:`name`, :attr:`default_hub_id`, :attr:`default_hub_config` and implement
    :meth:`row_to_instance`.

    Args:
        path: Local file(s); see the module docstring.
        hub_id: Hub dataset id (default :attr:`default_hub_id` when ``path`` is not given).
        hub_config: Hub config name.
        revision: Hub revision.
        split_map: Our split name -> the dataset's split name (overrides the defaults).
        dev_fraction: Share of train carved out as dev when the data has no dev split.
        file_split: Split a single local file holds when its name does not say.
        limit: Keep at most this many instances per split (the first ones).
        cache_dir: ``datasets`` cache folder.
        grade_timeout: Seconds allowed for one ``math_verify`` comparison (default: the shared
            verifier's).
    """

    name = "math_dataset"
    domain = "math"
    answer_type = "math"
    dev_salt = "selfcest-dev"
    missing_split_hint = (
        "Pass path= with a file for that split (or a mapping {split: file}), or split_map= to "
        "use another split."
    )

    def __init__(self, *, grade_timeout: float | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.grade_timeout = grade_timeout

    # -- loading -------------------------------------------------------------------------------

    def resolve_location(self) -> dict[str, Any]:
        """Where the data comes from: ``{"path": p}`` or ``{"hub_id": i, "hub_config": c}``."""
        if self.path is not None:
            return {"path": self.path}
        if self.hub_id is not None:
            return {"hub_id": self.hub_id, "hub_config": self.hub_config}
        if self.default_hub_id is None:
            raise ValueError(f"{type(self).__name__} needs path= or hub_id=")
        return {
            "hub_id": self.default_hub_id,
            "hub_config": self.hub_config or self.default_hub_config,
        }

    def location(self) -> str:
        """:meth:`resolve_location` as text (for messages)."""
        return str(self.resolve_location())

    def _fetch_rows(self) -> dict[str, list[dict[str, Any]]]:
        """Rows per dataset split, from wherever :meth:`resolve_location` says."""
        where = self.resolve_location()
        if "path" in where:
            path = where["path"]
            file_split = None if isinstance(path, Mapping) else _split_from_name(str(path))
            rows = read_local_rows(path, file_split or self.file_split)
        else:
            rows = self._hub_rows(where["hub_id"], where["hub_config"])
        logger.info("loaded %s from %s: %s", self.name, where, {k: len(v) for k, v in rows.items()})
        return rows

    def _hub_rows(self, hub_id: str, hub_config: str | None) -> dict[str, list[dict[str, Any]]]:
        """Rows per dataset split of one hub dataset config."""
        return load_hub_rows(hub_id, hub_config, revision=self.revision, cache_dir=self.cache_dir)

    def assign_rows(self) -> dict[str, TaggedRows]:
        """The fetched rows assigned to our splits (see the module docstring)."""
        return self._assign_splits(self._fetch_rows())

    def _assign_splits(self, rows: Mapping[str, list[dict[str, Any]]]) -> dict[str, TaggedRows]:
        def tagged(name: str) -> TaggedRows:
            return [(name, i, r) for i, r in enumerate(rows[name])]

        mapping: dict[str, str] = {}
        for split, name in self.split_map.items():
            if name not in rows:
                raise ValueError(
                    f"split_map sends {split!r} to {name!r}, which the data lacks; it has "
                    f"{sorted(rows)}"
                )
            mapping[split] = name
        claimed = set(mapping.values())
        if len(claimed) != len(mapping):
            raise ValueError(f"split_map sends two splits to the same data split: {mapping}")
        for split in SPLITS:
            if split in mapping:
                continue
            names = _DEV_NAMES if split == "dev" else (split,)
            found = next((n for n in names if n in rows and n not in claimed), None)
            if found is not None:
                mapping[split] = found
                claimed.add(found)
        return self.carve_dev({s: tagged(n) for s, n in mapping.items()})

    # -- per-dataset hooks ---------------------------------------------------------------------

    def row_key(self, row: Mapping[str, Any]) -> str:
        """Text that identifies a row (used to carve dev out of train)."""
        return str(_field(row, ("problem", "question"), what="problem"))

    def _instance(
        self,
        split: str,
        index: int,
        prompt: str,
        answer: str,
        meta: dict[str, Any],
        uid: Any,
        uid_key: str,
    ) -> TaskInstance:
        """The instance ``{name}-{split}-{index}``; ``meta[uid_key]`` is ``str(uid)`` if given."""
        if uid is not None:
            meta[uid_key] = str(uid)
        return TaskInstance(
            task_id=f"{self.name}-{split}-{index}", prompt=prompt, answer=answer, metadata=meta
        )

    # -- TaskSource ----------------------------------------------------------------------------

    def grade(self, instance: TaskInstance, answer: str) -> Grade:
        """LaTeX-aware equivalence with the gold answer and its aliases (:func:`grade_math`)."""
        return grade_math(
            answer, instance.answer, aliases=tuple(instance.aliases), timeout=self.grade_timeout
        )


class GSM8KTask(DatasetMathSource):
    """GSM8K (fields ``question``, ``answer`` ending in ``#### <number>``).

    Without ``path``/``hub_id`` it uses ``$SELFCEST_GSM8K_PATH``, else the hub id
    ``openai/gsm8k``.
    """

    name = "gsm8k"
    default_hub_id = "openai/gsm8k"
    default_hub_config = "main"

    def resolve_location(self) -> dict[str, Any]:
        """The path in ``$SELFCEST_GSM8K_PATH`` when neither ``path`` nor ``hub_id`` is given,
        else as :meth:`DatasetMathSource.resolve_location`."""
        env = os.environ.get(GSM8K_PATH_ENV)
        if self.path is None and self.hub_id is None and env:
            return {"path": env}
        return super().resolve_location()

    def row_key(self, row: Mapping[str, Any]) -> str:
        """The question text."""
        return str(_field(row, ("question",), what="question"))

    def row_to_instance(
        self, row: Mapping[str, Any], split: str, index: int, source_split: str, source_index: int
    ) -> TaskInstance | None:
        """Prompt: the question; answer: the number after ``####`` without commas."""
        question = str(_field(row, ("question",), what="question"))
        solution = str(_field(row, ("answer",), what="answer"))
        gold = (gsm8k_answer(solution) or "").replace(",", "")
        if not gold:
            logger.warning(
                "GSM8K row %s/%d has no '####' answer; skipped", source_split, source_index
            )
            return None
        return TaskInstance(
            task_id=f"gsm8k-{split}-{index}",
            prompt=question.strip(),
            answer=gold,
            metadata={"source_split": source_split, "source_index": source_index},
        )


_MATH_HUB_ID = "EleutherAI/hendrycks_math"
_MATH_SUBJECTS = (
    "algebra",
    "counting_and_probability",
    "geometry",
    "intermediate_algebra",
    "number_theory",
    "prealgebra",
    "precalculus",
)


def _level_number(level: Any) -> int | None:
    if isinstance(level, int):
        return level
    m = re.search(r"\d+", str(level))
    return int(m.group(0)) if m else None


class MATHTask(DatasetMathSource):
    """MATH (Hendrycks et al.; fields ``problem``, ``solution``, ``level``, ``type``).

    The gold answer is the last ``\\boxed{...}`` of the solution. On the hub
    (``EleutherAI/hendrycks_math``) each subject is a config; all of ``subjects`` (default: all
    seven) are loaded and concatenated. ``levels`` keeps only those difficulty levels (1-5).
    """

    name = "math"
    default_hub_id = _MATH_HUB_ID

    def __init__(
        self,
        *,
        subjects: Sequence[str] | None = None,
        levels: Sequence[int] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if subjects is not None:
            bad = sorted(set(subjects) - set(_MATH_SUBJECTS))
            if bad:
                raise ValueError(f"unknown MATH subjects {bad}; choose from {list(_MATH_SUBJECTS)}")
        self.subjects = tuple(subjects) if subjects is not None else None
        self.levels = tuple(int(v) for v in levels) if levels is not None else None

    def _fetch_rows(self) -> dict[str, list[dict[str, Any]]]:
        where = self.resolve_location()
        if where.get("hub_id") == _MATH_HUB_ID and where.get("hub_config") is None:
            # One config per subject on the hub: load each and concatenate.
            merged: dict[str, list[dict[str, Any]]] = {}
            for subject in self.subjects or _MATH_SUBJECTS:
                for name, rows in self._hub_rows(_MATH_HUB_ID, subject).items():
                    merged.setdefault(name, []).extend(rows)
            return merged
        return super()._fetch_rows()

    def _subject_of(self, row: Mapping[str, Any]) -> str | None:
        subject = _maybe_field(row, ("type", "subject"))
        return None if subject is None else str(subject)

    def _gold(self, row: Mapping[str, Any]) -> str | None:
        return last_box(str(_field(row, ("solution",), what="solution")))

    def row_to_instance(
        self, row: Mapping[str, Any], split: str, index: int, source_split: str, source_index: int
    ) -> TaskInstance | None:
        """Skips rows outside ``levels`` / ``subjects`` and rows whose gold cannot be found."""
        level = _level_number(_maybe_field(row, ("level",)))
        if self.levels is not None and level not in self.levels:
            return None
        subject = self._subject_of(row)
        if self.subjects is not None and subject is not None:
            norm = subject.lower().replace(" & ", "_and_").replace(" ", "_")
            if norm not in self.subjects:
                return None
        gold = self._gold(row)
        if not gold:
            logger.warning(
                "%s row %s/%d has no gold answer; skipped", self.name, source_split, source_index
            )
            return None
        uid = _maybe_field(row, ("unique_id", "id"))
        meta: dict[str, Any] = {
            "level": level,
            "subject": subject,
            "source_split": source_split,
            "source_index": source_index,
        }
        prompt = str(_field(row, ("problem",), what="problem")).strip()
        return self._instance(split, index, prompt, gold, meta, uid, "unique_id")


class MATHHardTask(MATHTask):
    """The hard subset of MATH: level 5 only (as in common "MATH-Hard" evaluations)."""

    name = "math_hard"

    def __init__(self, *, levels: Sequence[int] | None = (5,), **kwargs: Any) -> None:
        super().__init__(levels=levels, **kwargs)


class MATH500Task(MATHTask):
    """MATH-500 (fields ``problem``, ``solution``, ``answer``, ``subject``, ``level``,
    ``unique_id``; one ``test`` split on the hub: ``HuggingFaceH4/MATH-500``)."""

    name = "math500"
    default_hub_id = "HuggingFaceH4/MATH-500"

    def _gold(self, row: Mapping[str, Any]) -> str | None:
        answer = _maybe_field(row, ("answer",))
        if answer is not None and str(answer).strip():
            return str(answer).strip()
        return super()._gold(row)


class AIMETask(DatasetMathSource):
    """AIME problems (fields ``problem``/``question``, ``answer``, optional ``id``, ``year``).

    The default hub id ``AI-MO/aimo-validation-aime`` (AIME 2022-2024, 90 problems) has only a
    ``train`` split, which is mapped to ``test`` here (these are evaluation problems). The year
    comes from a ``year`` field, else from a 4-digit year in ``id`` / ``url``. ``years`` keeps
    only those years.
    """

    name = "aime"
    default_hub_id = "AI-MO/aimo-validation-aime"
    default_split_map = {"test": "train"}

    def __init__(self, *, years: Sequence[int] | None = None, **kwargs: Any) -> None:
        if kwargs.get("path") is not None or kwargs.get("hub_id") is not None:
            # Local files or another hub id: use their own split names unless told otherwise.
            self.default_split_map = {}
        super().__init__(**kwargs)
        self.years = tuple(int(y) for y in years) if years is not None else None

    def row_to_instance(
        self, row: Mapping[str, Any], split: str, index: int, source_split: str, source_index: int
    ) -> TaskInstance | None:
        """Prompt: the problem; answer: the integer answer as text (leading zeros dropped)."""
        problem = str(_field(row, ("problem", "question"), what="problem")).strip()
        answer = str(_field(row, ("answer",), what="answer")).strip()
        if re.fullmatch(r"0*\d+", answer):
            answer = str(int(answer))
        uid = _maybe_field(row, ("id", "unique_id", "problem_id"))
        year = _maybe_field(row, ("year",))
        if year is None:
            for text in (uid, _maybe_field(row, ("url",))):
                m = re.search(r"(?<!\d)(19[89]\d|20\d\d)(?!\d)", str(text or ""))
                if m:
                    year = m.group(1)
                    break
        year_int = int(year) if year is not None and str(year).isdigit() else None
        if self.years is not None and year_int not in self.years:
            return None
        meta: dict[str, Any] = {
            "year": year_int,
            "source_split": source_split,
            "source_index": source_index,
        }
        return self._instance(split, index, problem, answer, meta, uid, "id")
