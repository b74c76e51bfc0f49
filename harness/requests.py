"""What to run: run requests, the backend each needs, and the expansion of a suite into them.

A :class:`RunRequest` holds everything that goes into a run's
:class:`~selfcest_env.harness.runspec.RunSpec` plus how to play it;
:func:`requests_from_suite` expands a :class:`~selfcest_env.harness.suites.SuiteConfig` into
requests, checking every name against the registries (envs, task sources, agents, backends) so
that a bad setting is one :class:`~selfcest_env.harness.errors.SettingsError` before anything
runs. Backend arguments split into those that can change results (part of the run's identity)
and transport settings and secrets (never part of it).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from selfcest_env.harness.errors import SettingsError
from selfcest_env.harness.suites import SuiteConfig
from selfcest_env.plugins import RegistryError
from selfcest_env.registration import ENVS
from selfcest_env.tasks.registry import source_names

logger = logging.getLogger(__name__)

#: The registered env ids a run may name.
ENV_IDS: tuple[str, ...] = tuple(ENVS)

#: Environment variable the OpenAI-compatible backend reads its API key from.
API_KEY_ENV = "OPENAI_API_KEY"


#: Backend arguments that change nothing a model writes, only how requests travel (how many
#: at once, how long to wait, how often to retry, CPU threads, whether twin requests run
#: once, whether decode attention runs compiled): left out of the run spec, so
#: changing them resumes the same run folder. Every other backend argument is part of the
#: spec and of the run folder's identity.
TRANSPORT_BACKEND_ARGS: frozenset[str] = frozenset(
    {
        "max_concurrency",
        "timeout_s",
        "max_retries",
        "backoff_s",
        "max_backoff_s",
        "max_retry_wait_s",
        "num_threads",
        "coalesce_twins",
        "compiled_attention",
    }
)

#: Backend arguments that are secrets: never in a run spec, a file or a printed line.
SECRET_BACKEND_ARGS: frozenset[str] = frozenset({"api_key"})


def server_identity(url: str) -> str:
    """The part of a server URL that says which server answers, as a run spec records it:
    credentials (``user:key@``) and the fragment dropped, scheme and host lower-cased, a
    trailing ``/`` or ``/v1`` removed (the backend accepts the URL with or without it).

    Raises:
        SettingsError: ``url`` is not a URL.
    """
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url.strip())
        host = parts.netloc.rpartition("@")[2].lower()
    except ValueError as exc:
        raise SettingsError(f"backend argument base_url={url!r} is not a URL: {exc}") from exc
    path = parts.path.rstrip("/").removesuffix("/v1")
    return urlunsplit((parts.scheme.lower(), host, path, parts.query, ""))


@dataclass(frozen=True)
class BackendConfig:
    """Which model backend to build (shared by every run that asks for the same one)."""

    name: str = "transformers"
    model: str | None = None
    args: dict[str, Any] = field(default_factory=dict)

    def key(self) -> str:
        """A hashable identity."""
        return json.dumps([self.name, self.model, self.args], sort_keys=True, default=str)

    def spec_args(self) -> dict[str, Any]:
        """The backend arguments a run spec records: all but :data:`TRANSPORT_BACKEND_ARGS`
        and :data:`SECRET_BACKEND_ARGS`, ``base_url`` as its :func:`server_identity`."""
        args = {
            k: v
            for k, v in self.args.items()
            if k not in TRANSPORT_BACKEND_ARGS and k not in SECRET_BACKEND_ARGS
        }
        if isinstance(args.get("base_url"), str):
            args["base_url"] = server_identity(args["base_url"])
        return args

    def model_name(self) -> str:
        """The ``model_name`` the backend will report (without building it): ``model``, else
        the backend class's ``default_model``.

        Raises:
            SettingsError: no model is given and the backend has no default one.
        """
        if self.model is not None:
            return str(self.model)
        from selfcest_env.agents.backends import backend_class

        try:
            default = backend_class(self.name).default_model
        except (ImportError, RegistryError) as exc:
            raise SettingsError(f"backend {self.name!r}: {exc}") from exc
        if default is None:
            raise SettingsError(f"the {self.name} backend needs --model (its model's name)")
        return str(default)


def check_backend_args(config: BackendConfig) -> None:
    """Raise :class:`SettingsError` naming the valid arguments when ``config.args`` holds one that
    the backend's constructor does not take (checked without building the backend)."""
    import inspect

    from selfcest_env.agents.backends import backend_class

    try:
        parameters = inspect.signature(backend_class(config.name)).parameters
    except (ImportError, RegistryError) as exc:
        raise SettingsError(f"backend {config.name!r} is not installed: {exc}") from exc
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    unknown = sorted(set(config.args) - set(parameters))
    if unknown:
        raise SettingsError(
            f"unknown backend argument(s) {', '.join(unknown)} for backend {config.name!r}; "
            f"valid: {', '.join(parameters)}"
        )


#: Env arguments that are set by their own option (the env's source and split, the budget
#: sweeps) or by the runner (the tokenizer), never through ``--env-arg`` / ``env_args``.
RESERVED_ENV_ARGS: dict[str, str] = {
    "source": "--source (suite key: source)",
    "split": "--split (suite key: split)",
    "max_new_tokens": "--max-new-tokens (suite key: max_new_tokens)",
    "gen_budget": "--gen-budget (suite key: gen_budget)",
    "tokenizer": "the backend (its tokenizer is used)",
    "config": "individual env arguments",
    "render_mode": "nothing: runs do not render",
}


@dataclass(frozen=True)
class RunRequest:
    """One run to play: everything that goes into its :class:`RunSpec`, plus how to play it."""

    env: str
    source: str
    split: str
    agent: str
    budget: dict[str, int]
    episodes: int
    seed: int = 0
    env_args: dict[str, Any] = field(default_factory=dict)
    agent_options: dict[str, Any] = field(default_factory=dict)
    backend: BackendConfig = field(default_factory=BackendConfig)
    parallel: int = 8
    variant: str | None = None


def requests_from_suite(
    suite: SuiteConfig, parallel: int | None = None, *, name_entries: bool = True
) -> list[RunRequest]:
    """Every run of ``suite`` as a :class:`RunRequest` (agents and sources checked).

    ``name_entries``: start error messages with the suite name and entry number.

    Raises:
        SettingsError: an unknown env, source, split or agent name.
    """
    from selfcest_env.agents.backends import backend_names, default_backend_name
    from selfcest_env.agents.registry import agent_names
    from selfcest_env.tasks.base import SPLITS

    valid_agents = agent_names()
    if any(k in SECRET_BACKEND_ARGS for k in suite.backend_args):
        logger.warning(
            "an API key given as a backend argument or in a suite file can be seen by other "
            "users (ps) and ends up in shell histories and commits; set %s instead (either "
            "way it is never written to a run folder)",
            API_KEY_ENV,
        )
    requests: list[RunRequest] = []
    for number, entry in enumerate(suite.runs):
        where = f"suite {suite.name}, runs[{number}]: " if name_entries else ""
        if entry.env not in ENV_IDS:
            raise SettingsError(
                f"{where}unknown env {entry.env!r}; valid envs: {', '.join(ENV_IDS)}"
            )
        domain, default_source = ENVS[entry.env]
        source = entry.source or default_source
        sources = source_names(domain)
        if source not in sources:
            raise SettingsError(
                f"{where}unknown source {source!r} for {entry.env}; valid sources: "
                f"{', '.join(sources)}"
            )
        if entry.split not in SPLITS:
            raise SettingsError(
                f"{where}unknown split {entry.split!r}; valid splits: {', '.join(SPLITS)}"
            )
        for key in entry.env_args:
            if key in RESERVED_ENV_ARGS:
                raise SettingsError(
                    f"{where}env arg {key!r} cannot be set here; set it with "
                    f"{RESERVED_ENV_ARGS[key]}"
                )
        bad = [a for a in entry.agents if a not in valid_agents]
        if bad:
            raise SettingsError(
                f"{where}unknown agent(s) {', '.join(bad)}; valid agents: {', '.join(valid_agents)}"
            )
        backend = BackendConfig(
            entry.backend or suite.backend or default_backend_name(),
            entry.model if entry.model is not None else suite.model,
            dict(suite.backend_args),
        )
        if backend.name not in backend_names():
            raise SettingsError(
                f"{where}unknown backend {backend.name!r}; valid backends: "
                f"{', '.join(backend_names())}"
            )
        for agent in entry.agents:
            for budget in entry.budgets():
                requests.append(
                    RunRequest(
                        env=entry.env,
                        source=source,
                        split=entry.split,
                        agent=agent,
                        budget=budget,
                        episodes=entry.episodes,
                        seed=entry.seed,
                        env_args=dict(entry.env_args),
                        agent_options=dict(entry.agent_options.get(agent, {})),
                        backend=backend,
                        parallel=parallel or entry.parallel or suite.parallel,
                        variant=entry.variant,
                    )
                )
    return requests
