"""Multi-hop QA dataset loaders: 2WikiMultihopQA, MuSiQue and HotpotQA (distractor setting).

Every loader reads rows in the dataset's own schema, either

* from the Hugging Face hub through ``datasets.load_dataset`` (``hub_id=``, ``hub_config=``,
  ``revision=``; each class has a default id used when no ``path`` is given), or
* from local files (``path=``): a ``.jsonl``, ``.json`` (a JSON list of rows, as the original
  releases ship, or JSON lines), ``.parquet`` or ``.csv`` file, a directory of such files, or a
  mapping ``{split: file(s)}`` keyed by *our* split names, read by
  :func:`selfcest_env.tasks.loading.read_local_rows`. A single file or directory holds the split
  ``file_split`` (default ``"test"``). Local JSON is read with the standard library, so the
  original nested ``[title, [sentences]]`` lists load as they are.

Fields accepted per dataset (each also in the HF parquet form where it differs):

* 2WikiMultihopQA: ``_id``, ``question``, ``answer``, ``type``, ``context`` (a list of ``[title,
  [sentences]]`` or ``{"title": [...], "sentences": [[...]]}``, or that as a JSON string),
  ``supporting_facts`` (``[[title, sent_id], ...]`` or ``{"title": [...], "sent_id": [...]}``),
  ``evidences`` (read but not exposed: it contains the answer);
* MuSiQue: ``id``, ``question``, ``answer``, ``answer_aliases``, ``paragraphs`` (``{idx, title,
  paragraph_text, is_supporting}``), ``question_decomposition``, ``answerable`` (rows with
  ``answerable`` false are skipped unless ``include_unanswerable=True``);
* HotpotQA distractor: ``id`` (or ``_id``), ``question``, ``answer``, ``type``, ``level``,
  ``supporting_facts`` and ``context`` in either form above.

Each paragraph becomes ``ContextItem(key=title, text=sentences joined by spaces)``; a repeated
title gets a unique key (``"Title (2)"``, ``"Title (3)"``, ...). Gold answers: ``answer`` plus, for
MuSiQue, ``answer_aliases``; grading is normalised exact match with token F1 in the details.

Splits: the public test sets of these datasets have no answers, so by default ``test`` maps onto
the labelled official dev set (the dataset split named ``validation``, else ``dev``, else
``test``), ``train`` onto ``train``, and ``dev`` is carved out of ``train``: the rows whose stable
hash of their id falls below ``dev_fraction`` move to dev, so train and dev are disjoint.
``split_map`` (our split -> dataset split name) overrides any of this; a mapping ``path`` names our
splits directly (``dev`` is still carved from ``train`` when the mapping has no ``dev``). Rows
without an answer are skipped; ``limit`` keeps the first ``limit`` instances of each split.

Metadata per instance: ``hops`` (distinct supporting paragraphs; for MuSiQue the number of
decomposition steps), ``type``, ``supporting_keys``, ``context_tokens`` (titles plus texts with
the offline token counter unless ``token_counter`` is given), ``source_id``, ``source_split``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..base import (
    SPLITS,
    ContextItem,
    Grade,
    TaskInstance,
    TextCounter,
    check_split,
    default_token_counter,
)
from ..loading import DatasetSource, TaggedRows, load_hub_rows, read_local_rows
from ._util import unique_keys
from .metrics import grade_qa

logger = logging.getLogger(__name__)

__all__ = [
    "HotpotQATask",
    "MuSiQueTask",
    "QADatasetSource",
    "TwoWikiMultihopQATask",
]

#: Dataset split names tried, in order, for our ``test`` split.
_TEST_CANDIDATES = ("validation", "dev", "test")


# ----------------------------------------------------------------------------------------------
# Schema helpers
# ----------------------------------------------------------------------------------------------


def _maybe_json(value: Any) -> Any:
    if isinstance(value, str):
        stripped = value.strip()
        if stripped[:1] in ("[", "{"):
            try:
                return json.loads(stripped)
            except json.JSONDecodeError:
                return value
    return value


def _join(sentences: Any) -> str:
    if isinstance(sentences, str):
        return sentences.strip()
    return " ".join(str(s).strip() for s in sentences if str(s).strip())


def parse_context(context: Any) -> list[tuple[str, str]]:
    """``[(title, text), ...]`` from a HotpotQA / 2Wiki context in list, dict or JSON form."""
    context = _maybe_json(context)
    if context is None:
        return []
    if isinstance(context, Mapping):
        titles = list(context.get("title") or [])
        sentences = list(context.get("sentences") or context.get("content") or [])
        if len(titles) != len(sentences):
            raise ValueError(
                f"context has {len(titles)} titles but {len(sentences)} sentence lists"
            )
        return [(str(t), _join(s)) for t, s in zip(titles, sentences)]
    out = []
    for item in context:
        if isinstance(item, Mapping):
            out.append((str(item.get("title", "")), _join(item.get("sentences") or [])))
        else:
            title, sentences = item[0], item[1]
            out.append((str(title), _join(sentences)))
    return out


def parse_supporting_titles(facts: Any) -> list[str]:
    """Supporting titles, in first-mention order, from list, dict or JSON supporting facts."""
    facts = _maybe_json(facts)
    if not facts:
        return []
    titles = facts.get("title") or [] if isinstance(facts, Mapping) else [f[0] for f in facts]
    return list(dict.fromkeys(str(t) for t in titles))


def _first(row: Mapping[str, Any], names: Iterable[str], what: str) -> Any:
    for name in names:
        if name in row and row[name] is not None:
            return row[name]
    raise KeyError(f"row has no {what} field (looked for {list(names)}); fields: {sorted(row)}")


# ----------------------------------------------------------------------------------------------
# Sources
# ----------------------------------------------------------------------------------------------


class QADatasetSource(DatasetSource):
    """Base class of the finite QA loaders (every argument is described in the module docs).

    Args:
        path: Local file(s), or ``{split: file(s)}``.
        hub_id: Hub dataset id (default :attr:`default_hub_id` when ``path`` is not given).
        hub_config: Hub config name (default :attr:`default_hub_config`).
        revision: Hub revision.
        split_map: Our split -> the dataset's split name.
        dev_fraction: Share of train moved to dev when dev is carved from train.
        file_split: The split a single local file or directory holds.
        limit: Keep at most this many instances per split.
        cache_dir: ``datasets`` cache folder.
        token_counter: Counts ``metadata["context_tokens"]`` (default: the offline counter; the
            environment factory does not pass the model's, whose counts of every paragraph of a
            large dataset would slow the load for a number nothing reads).
    """

    name = "qa_dataset"
    domain = "qa"
    dev_salt = "selfcest-qa-dev"

    def __init__(self, *, token_counter: TextCounter | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.file_split = check_split(self.file_split)
        self.token_counter = default_token_counter() if token_counter is None else token_counter

    # -- loading -------------------------------------------------------------------------------

    def location(self) -> str:
        """Where the rows come from, in words (for messages)."""
        if self.path is not None:
            return f"path {self.path}"
        config = self.hub_config or self.default_hub_config
        return f"hub {self.hub_id or self.default_hub_id} (config {config})"

    def fetch_rows(self) -> tuple[dict[str, list[dict[str, Any]]], bool]:
        """``(rows per split, whether keyed by our split names)``: local files are, the hub not."""
        if self.path is not None:
            return read_local_rows(self.path, self.file_split), True
        hub_id = self.hub_id or self.default_hub_id
        if hub_id is None:
            raise ValueError(f"{type(self).__name__} needs path= or hub_id=")
        rows = load_hub_rows(
            hub_id,
            self.hub_config if self.hub_id else (self.hub_config or self.default_hub_config),
            revision=self.revision,
            cache_dir=self.cache_dir,
        )
        return rows, False

    def assign_rows(self) -> dict[str, TaggedRows]:
        """The fetched rows assigned to our splits (see the module docstring)."""
        rows, ours = self.fetch_rows()
        logger.info(
            "loaded %s from %s: %s",
            self.name,
            self.location(),
            {k: len(v) for k, v in rows.items()},
        )
        return self._assign(rows, ours)

    def _assign(
        self, rows: Mapping[str, list[dict[str, Any]]], ours: bool
    ) -> dict[str, TaggedRows]:
        mapping: dict[str, str] = {}
        for split in SPLITS:
            if split in self.split_map:
                if self.split_map[split] not in rows:
                    raise ValueError(
                        f"split_map sends {split!r} to {self.split_map[split]!r}, which the data "
                        f"from {self.location()} lacks; it has {sorted(rows)}"
                    )
                mapping[split] = self.split_map[split]
            elif ours or split == "train":
                if split in rows:
                    mapping[split] = split
            elif split == "test":
                used = set(mapping.values())
                found = next((n for n in _TEST_CANDIDATES if n in rows and n not in used), None)
                if found is not None:
                    mapping["test"] = found
        return self.carve_dev(
            {s: [(n, i, r) for i, r in enumerate(rows[n])] for s, n in mapping.items()}
        )

    # -- per-dataset hooks ---------------------------------------------------------------------

    def row_key(self, row: Mapping[str, Any]) -> str:
        """The row's id (used to carve dev out of train)."""
        return str(_first(row, ("_id", "id", "question"), "id"))

    def _instance(
        self,
        row: Mapping[str, Any],
        split: str,
        index: int,
        source_split: str,
        source_index: int,
        *,
        paragraphs: Sequence[tuple[str, str]],
        supporting: Sequence[int],
        aliases: Sequence[str] = (),
        hops: int | None = None,
        qtype: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> TaskInstance | None:
        """Shared construction: unique keys, supporting keys, token count, metadata."""
        answer = str(row.get("answer") or "").strip()
        if not answer:
            logger.warning(
                "%s row %s/%d has no answer; skipped", self.name, source_split, source_index
            )
            return None
        keys = unique_keys(t for t, _ in paragraphs)
        context = tuple(ContextItem(k, text) for k, (_, text) in zip(keys, paragraphs))
        supporting_keys = tuple(dict.fromkeys(keys[i] for i in supporting))
        count = self.token_counter.count_text
        golds = tuple(dict.fromkeys(a.strip() for a in aliases if a and a.strip() != answer))
        return TaskInstance(
            task_id=f"{self.name}-{split}-{index}",
            prompt=str(_first(row, ("question",), "question")).strip(),
            answer=answer,
            aliases=golds,
            context=context,
            metadata={
                "hops": hops if hops is not None else len(supporting_keys),
                "type": qtype if qtype is not None else str(row.get("type") or ""),
                "supporting_keys": supporting_keys,
                "context_tokens": sum(count(c.key) + count(c.text) for c in context),
                "source_id": self.row_key(row),
                "source_split": source_split,
                "source_index": source_index,
                **(extra or {}),
            },
        )

    # -- TaskSource ----------------------------------------------------------------------------

    def grade(self, instance: TaskInstance, answer: str) -> Grade:
        """Normalised exact match over the answer and its aliases; token F1 in the details."""
        return grade_qa(answer, instance.answer, instance.aliases)


def _supporting_indices(paragraphs: Sequence[tuple[str, str]], titles: Iterable[str]) -> list[int]:
    wanted = list(titles)
    by_title: dict[str, list[int]] = {}
    for i, (title, _) in enumerate(paragraphs):
        by_title.setdefault(title, []).append(i)
    missing = [t for t in wanted if t not in by_title]
    if missing:
        logger.debug("supporting titles not in the context: %s", missing)
    return [i for t in wanted for i in by_title.get(t, [])]


class _ContextQASource(QADatasetSource):
    """A loader whose rows carry ``context`` paragraphs and ``supporting_facts`` titles."""

    def extra_metadata(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """Dataset-specific metadata added to each instance."""
        return {}

    def row_to_instance(
        self, row: Mapping[str, Any], split: str, index: int, source_split: str, source_index: int
    ) -> TaskInstance | None:
        """Paragraphs from ``context``; supporting keys from ``supporting_facts``."""
        paragraphs = parse_context(_first(row, ("context",), "context"))
        titles = parse_supporting_titles(row.get("supporting_facts"))
        extra = self.extra_metadata(row)
        return self._instance(
            row,
            split,
            index,
            source_split,
            source_index,
            paragraphs=paragraphs,
            supporting=_supporting_indices(paragraphs, titles),
            extra=extra,
        )


class TwoWikiMultihopQATask(_ContextQASource):
    """2WikiMultihopQA (Ho et al., 2020): ``_id``, ``question``, ``answer``, ``type``, ``context``,
    ``supporting_facts``, ``evidences``; default hub id ``framolfese/2WikiMultihopQA``."""

    name = "2wikimultihopqa"
    default_hub_id = "framolfese/2WikiMultihopQA"

    def extra_metadata(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """``num_evidences``: how many evidence triples the row has (they are not exposed)."""
        evidences = _maybe_json(row.get("evidences")) or []
        return {"num_evidences": len(evidences)}


class HotpotQATask(_ContextQASource):
    """HotpotQA, distractor setting (Yang et al., 2018): ``id``/``_id``, ``question``, ``answer``,
    ``type``, ``level``, ``supporting_facts``, ``context``; default hub id ``hotpotqa/hotpot_qa``
    config ``distractor``."""

    name = "hotpotqa"
    default_hub_id = "hotpotqa/hotpot_qa"
    default_hub_config = "distractor"

    def extra_metadata(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """``level``: the row's difficulty level."""
        return {"level": str(row.get("level") or "")}


class MuSiQueTask(QADatasetSource):
    """MuSiQue-Ans (Trivedi et al., 2022): ``id``, ``question``, ``answer``, ``answer_aliases``,
    ``paragraphs``, ``question_decomposition``, ``answerable``; default hub id
    ``dgslibisey/MuSiQue``.

    Args:
        include_unanswerable: Keep rows whose ``answerable`` is false (MuSiQue-Full).
        **kwargs: As :class:`QADatasetSource`.
    """

    name = "musique"
    default_hub_id = "dgslibisey/MuSiQue"

    def __init__(self, *, include_unanswerable: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.include_unanswerable = include_unanswerable

    def row_to_instance(
        self, row: Mapping[str, Any], split: str, index: int, source_split: str, source_index: int
    ) -> TaskInstance | None:
        """Paragraphs in ``idx`` order; supporting keys from ``is_supporting``."""
        if not self.include_unanswerable and row.get("answerable", True) is False:
            return None
        raw = _maybe_json(_first(row, ("paragraphs",), "paragraphs"))
        items = sorted((dict(p) for p in raw), key=lambda p: int(p.get("idx") or 0))
        paragraphs = [
            (str(p.get("title", "")), str(p.get("paragraph_text", "")).strip()) for p in items
        ]
        supporting = [i for i, p in enumerate(items) if p.get("is_supporting")]
        decomposition = _maybe_json(row.get("question_decomposition")) or []
        row_id = str(row.get("id") or "")
        qtype = row_id.split("__", 1)[0] if "__" in row_id else f"{len(decomposition)}hop"
        aliases = _maybe_json(row.get("answer_aliases")) or []
        return self._instance(
            row,
            split,
            index,
            source_split,
            source_index,
            paragraphs=paragraphs,
            supporting=supporting,
            aliases=[str(a) for a in aliases],
            hops=len(decomposition) or len(supporting),
            qtype=qtype,
            extra={
                "answerable": bool(row.get("answerable", True)),
                "sub_questions": tuple(str(d.get("question", "")) for d in decomposition),
            },
        )
