"""Shared machinery of the finite dataset loaders (math and QA).

* :func:`read_local_rows`: the one reader of local task files, rows per split from a ``path=``
  argument (a file, a directory of files, or ``{split: file(s)}``). It reads ``.jsonl`` (one JSON
  object a line), ``.json`` (a JSON list of rows, ``{"data": [rows]}``, one row, or JSON lines),
  ``.parquet`` (with ``pyarrow``) and ``.csv`` (a header line, then one row a line; every value
  is text as written, and an empty cell is a missing value, ``None``). Values are kept as the
  file has them: no schema is imposed across rows.
* :func:`load_hub_rows`: rows per split of a hub dataset through ``datasets.load_dataset``, with an
  error that says what to do without network access;
* :class:`DatasetSource`: the base of the loaders: argument checks, the lazy load, building
  instances split by split (``limit``, skipped rows), carving a deterministic dev split out of
  train by a stable hash of each row's key, and the :class:`~.base.TaskSource` methods.

Each domain keeps its split mapping, its reading of the rows and its grading.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .base import SPLITS, TaskInstance, TaskSource, check_split
from .hashing import stable_unit

__all__ = [
    "LOCAL_SUFFIXES",
    "DatasetSource",
    "PathLike",
    "PathSpec",
    "TaggedRows",
    "load_hub_rows",
    "read_local_rows",
]

PathLike = str | os.PathLike[str]
#: A ``path=`` argument: one file or directory, or ``{split: file(s)}``.
PathSpec = PathLike | Mapping[str, PathLike | Sequence[PathLike]]
#: Rows of one of our splits, each tagged ``(dataset split, index in it, row)``.
TaggedRows = list[tuple[str, int, dict[str, Any]]]


#: File endings :func:`read_local_rows` reads.
LOCAL_SUFFIXES: tuple[str, ...] = (".jsonl", ".json", ".parquet", ".csv")


def read_local_rows(path: PathSpec, file_split: str) -> dict[str, list[dict[str, Any]]]:
    """Rows per split from local files (see the module docstring for the formats).

    ``path`` is one file, a directory (its files with a known ending, sorted by name) or a
    mapping ``{split: file(s) or directory}``; a single file or directory holds ``file_split``.

    Raises:
        FileNotFoundError: a file does not exist, or a directory holds no readable file.
        ValueError: a file has an unknown ending or is not valid in its format (the message
            names the file, and the line for JSON lines).
    """
    if not isinstance(path, Mapping):
        return {file_split: [row for f in _files(path) for row in _read_file(f)]}
    out: dict[str, list[dict[str, Any]]] = {}
    for split, spec in path.items():
        items = [spec] if isinstance(spec, (str, os.PathLike)) else list(spec)
        out[str(split)] = [row for item in items for f in _files(item) for row in _read_file(f)]
    return out


def _files(p: PathLike) -> list[Path]:
    """The files ``p`` names: ``p`` itself, or a directory's files with a known ending."""
    path = Path(p).expanduser()
    if path.is_dir():
        files = sorted(f for f in path.iterdir() if f.suffix.lower() in LOCAL_SUFFIXES)
        if not files:
            raise FileNotFoundError(f"no {'/'.join(LOCAL_SUFFIXES)} files in directory {path}")
        return files
    if not path.exists():
        raise FileNotFoundError(f"dataset file {path} does not exist")
    if path.suffix.lower() not in LOCAL_SUFFIXES:
        raise ValueError(
            f"cannot read {path}: unknown file format; use a file ending in "
            f"{', '.join(LOCAL_SUFFIXES)}"
        )
    return [path]


def _read_file(path: Path) -> list[dict[str, Any]]:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return [dict(r) for r in pq.read_table(path).to_pylist()]
    if suffix == ".csv":
        with path.open(encoding="utf-8", newline="") as handle:
            return [
                {k: v if v != "" else None for k, v in r.items()} for r in csv.DictReader(handle)
            ]
    text = path.read_text(encoding="utf-8")
    if suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None  # not one JSON document: read it as JSON lines below
        if data is not None:
            if isinstance(data, dict) and isinstance(data.get("data"), list):
                data = data["data"]
            if isinstance(data, dict):
                data = [data]
            if not isinstance(data, list):
                raise ValueError(f"{path} holds a JSON {type(data).__name__}, not a list of rows")
            return [dict(r) for r in data]
    rows = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                rows.append(dict(json.loads(line)))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not a JSON line ({e})") from e
    return rows


def load_hub_rows(
    hub_id: str,
    hub_config: str | None = None,
    *,
    revision: str | None = None,
    cache_dir: str | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Rows per dataset split of a hub dataset, through ``datasets.load_dataset``.

    Raises:
        RuntimeError: the dataset could not be loaded; the message suggests passing ``path=`` to
            local files instead.
    """
    import datasets as hf_datasets

    try:
        loaded = hf_datasets.load_dataset(
            hub_id, hub_config, revision=revision, cache_dir=cache_dir
        )
    except Exception as e:  # network, auth or a missing dataset: say what to do instead
        raise RuntimeError(
            f"could not load hub dataset {hub_id!r} (config {hub_config!r}): "
            f"{type(e).__name__}: {e}. Without network access pass path= to local "
            "JSONL/JSON/parquet/CSV files in the dataset's own schema."
        ) from e
    return {name: [dict(r) for r in ds] for name, ds in loaded.items()}


class DatasetSource(TaskSource):
    """Base class of the finite dataset loaders.

    Subclasses set :attr:`name`, :attr:`domain`, :attr:`default_hub_id` (and
    :attr:`default_hub_config`, :attr:`default_split_map`, :attr:`dev_salt`,
    :attr:`missing_split_hint`) and implement :meth:`location`, :meth:`assign_rows`,
    :meth:`row_key`, :meth:`row_to_instance` and :meth:`grade`.

    Args:
        path: Local file(s), or ``{split: file(s)}``.
        hub_id: Hub dataset id (default :attr:`default_hub_id` when ``path`` is not given).
        hub_config: Hub config name.
        revision: Hub revision.
        split_map: Our split -> the dataset's split name (over :attr:`default_split_map`).
        dev_fraction: Share of train moved to dev when dev is carved from train.
        file_split: The split a single local file or directory holds.
        limit: Keep at most this many instances per split (the first ones).
        cache_dir: ``datasets`` cache folder.
    """

    name = "dataset"
    default_hub_id: str | None = None
    default_hub_config: str | None = None
    #: Our split -> dataset split used by default (before ``split_map``).
    default_split_map: Mapping[str, str] = {}
    #: First part of the stable hash that carves dev out of train.
    dev_salt = "selfcest-dev"
    #: What the error for a missing split suggests.
    missing_split_hint = "Pass path={split: file} or split_map= to provide it."

    def __init__(
        self,
        *,
        path: PathSpec | None = None,
        hub_id: str | None = None,
        hub_config: str | None = None,
        revision: str | None = None,
        split_map: Mapping[str, str] | None = None,
        dev_fraction: float = 0.1,
        file_split: str = "test",
        limit: int | None = None,
        cache_dir: str | None = None,
    ) -> None:
        if not 0.0 <= dev_fraction < 1.0:
            raise ValueError(f"dev_fraction must be in [0, 1), got {dev_fraction}")
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        if path is not None and hub_id is not None:
            raise ValueError("give path= or hub_id=, not both")
        self.path = path
        self.hub_id = hub_id
        self.hub_config = hub_config
        self.revision = revision
        self.split_map = {**self.default_split_map, **(split_map or {})}
        bad = sorted(set(self.split_map) - set(SPLITS))
        if bad:
            raise ValueError(f"split_map keys must be among {SPLITS}, got {bad}")
        self.dev_fraction = dev_fraction
        self.file_split = file_split
        self.limit = limit
        self.cache_dir = cache_dir
        self._splits: dict[str, list[TaskInstance]] | None = None

    # -- loading -------------------------------------------------------------------------------

    def location(self) -> str:
        """Where the rows come from, in words (for messages)."""
        raise NotImplementedError

    def assign_rows(self) -> dict[str, TaggedRows]:
        """Fetch the rows and assign them to our splits (see :meth:`carve_dev`)."""
        raise NotImplementedError

    def carve_dev(self, out: dict[str, TaggedRows]) -> dict[str, TaggedRows]:
        """Move the train rows whose stable hash falls below ``dev_fraction`` to a new dev split.

        Does nothing when ``out`` has a dev split already, has no train split, or
        ``dev_fraction`` is 0. The hash is of :attr:`dev_salt`, :attr:`name` and
        :meth:`row_key`, so train and dev are disjoint and the same in every process.
        """
        if "dev" not in out and "train" in out and self.dev_fraction > 0:
            train, dev = [], []
            for item in out["train"]:
                u = stable_unit(self.dev_salt, self.name, self.row_key(item[2]))
                (dev if u < self.dev_fraction else train).append(item)
            out["train"], out["dev"] = train, dev
        return out

    def _load(self) -> dict[str, list[TaskInstance]]:
        if self._splits is None:
            splits: dict[str, list[TaskInstance]] = {}
            for split, items in self.assign_rows().items():
                out: list[TaskInstance] = []
                for source_split, source_index, row in items:
                    if self.limit is not None and len(out) >= self.limit:
                        break
                    inst = self.row_to_instance(row, split, len(out), source_split, source_index)
                    if inst is not None:
                        out.append(inst)
                splits[split] = out
            self._splits = splits
        return self._splits

    # -- per-dataset hooks ---------------------------------------------------------------------

    def row_key(self, row: Mapping[str, Any]) -> str:
        """Text that identifies a row (used to carve dev out of train)."""
        raise NotImplementedError

    def row_to_instance(
        self, row: Mapping[str, Any], split: str, index: int, source_split: str, source_index: int
    ) -> TaskInstance | None:
        """Build the instance for one row, or ``None`` to skip the row."""
        raise NotImplementedError

    # -- TaskSource ----------------------------------------------------------------------------

    def available_splits(self) -> tuple[str, ...]:
        """Our splits that the loaded data has (loads the data)."""
        return tuple(s for s in SPLITS if s in self._load())

    def _split(self, split: str) -> list[TaskInstance]:
        check_split(split)
        splits = self._load()
        if split not in splits:
            raise ValueError(
                f"{self.name} data from {self.location()} has no {split!r} split; it has "
                f"{sorted(splits)}. {self.missing_split_hint}"
            )
        return splits[split]

    def size(self, split: str) -> int | None:
        """Number of instances in ``split``."""
        return len(self._split(split))

    def get(self, split: str, index: int) -> TaskInstance:
        """Instance ``index`` of ``split`` (dataset order)."""
        items = self._split(split)
        if not 0 <= index < len(items):
            raise IndexError(f"{self.name} {split} has {len(items)} instances; index {index}")
        return items[index]
