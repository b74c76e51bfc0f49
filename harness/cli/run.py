"""``selfcest run``: play agents on one env/source/split into resumable run folders."""

from __future__ import annotations

import argparse
from typing import Any

from selfcest_env.harness.cli.args import (
    add_common_run_options,
    agent_names,
    non_negative_int,
    parse_agents,
    parse_budgets,
    parse_key_value,
    positive_int,
)
from selfcest_env.harness.cli.output import Terminal
from selfcest_env.harness.requests import ENV_IDS, requests_from_suite
from selfcest_env.harness.runner import execute
from selfcest_env.harness.suites import RunEntry, SuiteConfig
from selfcest_env.registration import ENVS, MATH_ENV_ID
from selfcest_env.tasks.registry import source_names

_EPILOG = """\
budgets: --max-new-tokens sweeps the per-turn generation cap (the agent's sampling cap and the
env's max_new_tokens limit); --gen-budget sweeps the env's whole-episode generation budget
(gen_budget). Both take comma-separated positive ints or 'none'; every combination is one run.

resume: rerunning the same command plays only the episodes missing from each run folder. A
run reports episodes 0..N-1 of --episodes N, even where its folder holds more from a longer run.

identity: every setting that can change results (env, source, split, agent and its options,
model, budget, seed, env args, backend arguments such as base_url or dtype) is in the run spec
and names the folder, so two servers behind one --model never share a folder; only transport
settings (timeouts, retries, concurrency, threads) are left out and can change on resume.

API key (openai backend): set OPENAI_API_KEY; --backend-arg api_key=... works too but is seen by
other users. The key is never written to a run folder or printed.

example:
  selfcest run --env SelfCest-Math-v0 --source arithmetic --env-arg preset=easy \\
      --agents monolithic,clone-controller --max-new-tokens 64,128 --episodes 20 --out runs
"""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``run`` subcommand to ``subparsers``."""
    from selfcest_env.tasks.base import SPLITS

    run = subparsers.add_parser(
        "run",
        help="play agents on an env into run folders (resumable)",
        description="Play every agent at every budget on one env/source/split; one run folder "
        "per (env, source, split, agent, model, budget, seed) under --out.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("--env", choices=ENV_IDS, default=MATH_ENV_ID, help="env id (default: Math)")
    sources = "; ".join(
        f"{env_id.removeprefix('SelfCest-').removesuffix('-v0')} (default {default}): "
        f"{', '.join(source_names(domain))}"
        for env_id, (domain, default) in ENVS.items()
    )
    run.add_argument("--source", default=None, help=f"task source of the env's domain: {sources}")
    run.add_argument("--split", choices=SPLITS, default="test", help="task split (default: test)")
    run.add_argument(
        "--agents",
        type=parse_agents,
        required=True,
        metavar="NAMES",
        help=f"comma-separated agent names: {', '.join(agent_names())}",
    )
    run.add_argument(
        "--max-new-tokens",
        type=parse_budgets,
        default=[128],
        metavar="CAPS",
        help="per-turn generation caps to sweep, comma-separated, 'none' for the env default "
        "(default: 128)",
    )
    run.add_argument(
        "--gen-budget",
        type=parse_budgets,
        default=[None],
        metavar="BUDGETS",
        help="whole-episode generation budgets to sweep (env gen_budget), comma-separated, "
        "'none' for unlimited (default: none)",
    )
    run.add_argument(
        "--episodes", type=positive_int, default=20, help="episodes per run (default: 20)"
    )
    run.add_argument(
        "--seed",
        type=non_negative_int,
        default=0,
        help="run seed: episode i resets with seed + i; model agents sample with it (default: 0)",
    )
    run.add_argument(
        "--env-arg",
        action="append",
        default=[],
        type=parse_key_value,
        metavar="KEY=VALUE",
        help="env or task-source argument, repeatable (e.g. preset=easy, hops=2, "
        "num_distractors=2, max_depth=2); values are read as JSON when they parse",
    )
    run.add_argument(
        "--agent-option",
        action="append",
        default=[],
        type=parse_key_value,
        metavar="KEY=VALUE",
        help="agent option for every agent of the run, repeatable (e.g. k=8, temperature=0.5; "
        "see selfcest_env.agents.registry)",
    )
    run.add_argument("--out", default="runs", help="root folder of run folders (default: runs)")
    add_common_run_options(run, suite=False)
    run.set_defaults(func=command)
    return run


def command(args: argparse.Namespace, terminal: Terminal) -> int:
    """Play the run's requests; 0 when every run finished, 1 when one failed."""
    entry = RunEntry(
        env=args.env,
        agents=tuple(args.agents),
        source=args.source,
        split=args.split,
        max_new_tokens=tuple(args.max_new_tokens),
        gen_budget=tuple(args.gen_budget),
        episodes=args.episodes,
        seed=args.seed,
        env_args=dict(args.env_arg),
        agent_options={a: dict(args.agent_option) for a in args.agents if args.agent_option},
    )
    suite = SuiteConfig(
        name="run",
        runs=(entry,),
        backend=args.backend,
        model=args.model,
        backend_args=dict(args.backend_arg),
        parallel=args.parallel,
    )
    terminal.add_backend_args(suite.backend_args)
    requests = requests_from_suite(suite, name_entries=False)
    return execute(
        requests,
        args.out,
        progress=not args.no_progress,
        report=terminal.report_run,
        fail=terminal.error,
        redact=terminal.redact,
        schedule=args.schedule,
        max_in_flight=args.max_in_flight,
        traces=args.traces,
    ).code
