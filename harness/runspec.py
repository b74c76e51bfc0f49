"""What a run is: the :class:`RunSpec`, its hash and folder name, and where it ran.

The spec's hash (over every setting that can change results) ends the run folder's name and is
recorded in its ``run_spec.json``: :func:`spec_of_folder` refuses a spec edited afterwards.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import platform
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from selfcest_env.episodes import is_int64, json_ready
from selfcest_env.harness.errors import CorruptRunError, ResultsError, RunSpecEditedError

logger = logging.getLogger(__name__)

#: The file of a run folder that holds its spec.
SPEC_FILE = "run_spec.json"

#: Packages whose versions are recorded in ``run_spec.json`` (distribution names).
_VERSION_PACKAGES: tuple[str, ...] = ("selfcest", "gymnasium", "torch", "transformers")

_UNSAFE = re.compile(r"[^A-Za-z0-9._=,+-]+")
_COMPONENT_MAX = 48
#: The longest file name common file systems allow (bytes; run folder names are ASCII).
_NAME_MAX = 255


def safe_name(text: str, max_len: int = _COMPONENT_MAX) -> str:
    """Make ``text`` safe as part of a folder name: ``[A-Za-z0-9._=,+-]``, no leading dot."""
    out = _UNSAFE.sub("-", str(text)).strip("-.")
    if len(out) > max_len:
        out = out[:max_len].rstrip("-.")
    return out or "none"


def _canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: the same text for equal values."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def variant_label(env_args: Mapping[str, Any]) -> str:
    """The name of the task variant ``env_args`` pick: ``"default"`` when empty, else the
    preset's name followed by the other settings (``"easy"``, ``"easy,max_depth=2"``,
    ``"min_operators=7"``)."""
    rest = sorted(
        f"{key}={json.dumps(value, sort_keys=True, separators=(',', ':'))}"
        if not isinstance(value, str)
        else f"{key}={value}"
        for key, value in env_args.items()
        if key != "preset"
    )
    head = [str(env_args["preset"])] if "preset" in env_args else []
    return ",".join(head + rest) or "default"


def _format_budget_value(value: Any) -> str:
    if value is None:
        return "inf"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """What one run is: the environment, the task split, the agent, the model, the budget, seed.

    Attributes:
        env_id: Registered Gymnasium id, e.g. ``"SelfCest-Math-v0"``.
        source: Task source name, e.g. ``"arithmetic"`` or ``"gsm8k"``.
        split: Task split, e.g. ``"test"``.
        agent: Stable agent name, e.g. ``"monolithic"`` or ``"self_consistency"``.
        agent_config: The agent's settings (JSON-serialisable).
        model: Model id or path (``""`` for model-free agents).
        backend: Backend name, e.g. ``"transformers"`` or ``"vllm"``.
        budget: Budget limits (JSON-serialisable). An optional ``"label"`` key names it in
            folder names and plots; otherwise the label is built from the sorted items.
        seed: Run seed.
        n_episodes: Episodes the run is meant to have (``None``: not fixed).
        extra: Free-form extra settings; part of the spec (and of the hash). ``env_args``
            (the env's keyword arguments) and ``variant`` (a name for them) set
            :attr:`variant`.
    """

    env_id: str
    source: str
    split: str
    agent: str
    agent_config: dict[str, Any] = field(default_factory=dict)
    model: str = ""
    backend: str = ""
    budget: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    n_episodes: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("env_id", "source", "split", "agent", "model", "backend"):
            if not isinstance(getattr(self, name), str):
                raise ResultsError(f"RunSpec.{name} must be a str, got {getattr(self, name)!r}")
        for name in ("env_id", "source", "split", "agent"):
            if not getattr(self, name):
                raise ResultsError(f"RunSpec.{name} must not be empty")
        if not is_int64(self.seed):
            raise ResultsError(f"RunSpec.seed must be a 64-bit int, got {self.seed!r}")
        if self.n_episodes is not None and not (is_int64(self.n_episodes) and self.n_episodes >= 0):
            raise ResultsError(
                f"RunSpec.n_episodes must be None or a 64-bit int >= 0, got {self.n_episodes!r}"
            )
        for name in ("agent_config", "budget", "extra"):
            value = getattr(self, name)
            if not isinstance(value, Mapping):
                raise ResultsError(f"RunSpec.{name} must be a dict, got {type(value).__name__}")
            try:
                json.dumps(value, allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise ResultsError(f"RunSpec.{name} is not JSON-serialisable: {exc}") from exc

    def to_dict(self) -> dict[str, Any]:
        """The spec as a JSON-ready dict (as it is stored in ``run_spec.json``)."""
        return json_ready(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunSpec:
        """Rebuild a spec from :meth:`to_dict` output; unknown keys are an error."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ResultsError(f"unknown RunSpec keys: {unknown}")
        return cls(**dict(data))

    @property
    def spec_hash(self) -> str:
        """Eight hex digits of the SHA-256 of the whole spec (stable across processes)."""
        return hashlib.sha256(_canonical_json(self.to_dict()).encode("utf-8")).hexdigest()[:8]

    @property
    def variant(self) -> str:
        """The task variant: ``extra["variant"]`` when named, else :func:`variant_label` of
        ``extra["env_args"]``."""
        named = self.extra.get("variant")
        if named:
            return str(named)
        env_args = self.extra.get("env_args")
        return variant_label(env_args if isinstance(env_args, Mapping) else {})

    @property
    def budget_label(self) -> str:
        """A short human label of the budget: ``budget["label"]``, else ``k=v,...``, else
        ``"default"``."""
        if "label" in self.budget:
            return str(self.budget["label"])
        if not self.budget:
            return "default"
        return ",".join(f"{k}={_format_budget_value(v)}" for k, v in sorted(self.budget.items()))

    @property
    def run_id(self) -> str:
        """Folder name: ``env__source__split__agent__model__budget__seedN__hash``, sanitised.

        Readable parts are cut to 48 characters each, and all of them together so that the
        name fits the 255 bytes file systems allow; the hash covers the full spec (so two
        specs that differ anywhere, ``agent_config`` and ``extra`` included, get different
        folders).
        """
        parts = [
            self.env_id,
            self.source,
            self.split,
            self.agent,
            self.model or "nomodel",
            self.budget_label,
            f"seed{self.seed}",
        ]
        readable = "__".join(safe_name(p) for p in parts)
        return readable[: _NAME_MAX - len(self.spec_hash) - 2] + "__" + self.spec_hash


# --------------------------------------------------------------------------------------------
# Environment capture


def _package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def git_revision(cwd: str | Path | None = None) -> str | None:
    """``git rev-parse HEAD`` in ``cwd`` (default: this package's folder), or ``None`` when git
    is missing, the folder is not a repository, or it has no commit yet."""
    where = Path(cwd) if cwd is not None else Path(__file__).resolve().parent
    try:
        proc = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=where,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        logger.debug("git rev-parse failed: %s", exc)
        return None
    revision = proc.stdout.strip()
    if proc.returncode != 0 or not re.fullmatch(r"[0-9a-f]{40,64}", revision):
        return None
    return revision


def environment_info() -> dict[str, Any]:
    """Python and package versions (``None`` when not installed) and the git revision."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in _VERSION_PACKAGES:
        versions[name] = _package_version(name)
    return {
        "versions": versions,
        "git_revision": git_revision(),
        "platform": platform.platform(),
    }


_HASH_SUFFIX = re.compile(r"__([0-9a-f]{8})$")


def spec_of_folder(folder: str | Path, spec_file: Mapping[str, Any]) -> RunSpec:
    """The :class:`RunSpec` in a run folder's spec file (:func:`read_run_spec`), checked
    against the folder's identity.

    The identity is the spec hash taken when the folder was made: ``spec_hash`` in the file
    and the hash that ends the folder name (:attr:`RunSpec.run_id`). A spec edited afterwards
    no longer hashes to them and would put the folder's episodes under another label, so it
    is refused. (This catches edits, not forgery: whoever also rewrites both hashes can
    relabel a folder; run folders are not signed.)

    Raises:
        CorruptRunError: the spec is malformed.
        RunSpecEditedError: the spec does not hash to the folder's identity.
    """
    folder = Path(folder)
    where = folder / SPEC_FILE
    try:
        spec = RunSpec.from_dict(spec_file["spec"])
    except (TypeError, ResultsError) as exc:
        raise CorruptRunError(f"{where}: bad spec: {exc}") from exc
    named = _HASH_SUFFIX.search(folder.name)
    claims = [("its 'spec_hash'", spec_file.get("spec_hash"))]
    claims.append(("the folder name", named.group(1) if named else None))
    for what, claimed in claims:
        if claimed is not None and claimed != spec.spec_hash:
            raise RunSpecEditedError(
                f"{where}: the spec hashes to {spec.spec_hash} but {what} says {claimed!r}: "
                "it was edited after the run was made and would relabel its episodes; restore "
                "the original spec, or rerun into a new folder"
            )
    return spec
