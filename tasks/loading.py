"""Shared machinery of the finite dataset loaders (math and QA).

* :func:`expand_files` / :func:`spec_items`: turn a ``path=`` argument (a file, a directory of
  files, or the file list of one split in a mapping) into the files to read;
* :func:`load_hub_rows`: rows per split of a hub dataset through ``datasets.load_dataset``, with an
  error that says what to do without network access;
* :class:`DatasetSource`: the base of the loaders: argument checks, the lazy load, building
  instances split by split (``limit``, skipped rows), carving a deterministic dev split out of
  train by a stable hash of each row's key, and the :class:`~.base.TaskSource` methods.

Each domain keeps its own reading of local files, its split mapping and its grading.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .base import SPLITS, TaskInstance, TaskSource, check_split
from .hashing import stable_unit

__all__ = [
    "DatasetSource",
    "PathLike",
    "PathSpec",
    "TaggedRows",
    "expand_files",
    "load_hub_rows",
    "spec_items",
]

PathLike = str | os.PathLike[str]
#: A ``path=`` argument: one file or directory, or ``{split: file(s)}``.
PathSpec = PathLike | Mapping[str, PathLike | Sequence[PathLike]]
#: Rows of one of our splits, each tagged ``(dataset split, index in it, row)``.
TaggedRows = list[tuple[str, int, dict[str, Any]]]


def spec_items(spec: PathLike | Sequence[PathLike]) -> list[PathLike]:
    """The files or directories of one split in a mapping ``path`` (one item or a sequence)."""
    return [spec] if isinstance(spec, (str, os.PathLike)) else list(spec)


def expand_files(p: PathLike, suffixes: Sequence[str], *, check_suffix: bool) -> list[Path]:
    """The files that ``p`` names: ``p`` itself, or a directory's files ending in ``suffixes``.

    Directory entries are sorted by name. With ``check_suffix`` a single file must end in one of
    ``suffixes`` too.

    Raises:
        FileNotFoundError: ``p`` does not exist, or is a directory without such files.
        ValueError: ``check_suffix`` and ``p`` is a file with another ending.
    """
    path = Path(p).expanduser()
    if path.is_dir():
        files = sorted(
            (f for f in path.iterdir() if f.suffix.lower() in suffixes), key=lambda f: str(f)
        )
        if not files:
            raise FileNotFoundError(f"no {'/'.join(suffixes)} files in directory {path}")
        return files
    if not path.exists():
        raise FileNotFoundError(f"dataset file {path} does not exist")
    if check_suffix and path.suffix.lower() not in suffixes:
        raise ValueError(f"cannot read {path}: use a file ending in {', '.join(suffixes)}")
    return [path]


def load_hub_rows(
    hub_id: str,
    hub_config: str | None = None,
    *,
    revision: str | None = None,
    cache_dir: str | None = None,
    local_files: str = "JSONL/JSON/parquet files in the dataset's own schema",
) -> dict[str, list[dict[str, Any]]]:
    """Rows per dataset split of a hub dataset, through ``datasets.load_dataset``.

    Raises:
        RuntimeError: the dataset could not be loaded; the message suggests passing ``path=`` to
            local ``local_files`` instead.
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
            f"{local_files}."
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
