"""Episodes per minute of a suite: the cross-run schedule against the per-run one.

Plays the quick suite (or ``--suite``) with the transformers backend and the default model up to
five times, in one invocation, each into a fresh temporary folder and with a fresh backend (its load
is timed, as in ``selfcest suite``):

1. ``per-run``, batch 8, ``decoder="forward"``: one run after another with the suite's
   ``parallel`` episodes in flight, the backend at batch 8 on the model's own forward pass (no
   prefix cache, no continuous batching): how ``selfcest suite`` played before the decode
   engine and the cross-run schedule, the baseline;
2. ``per-run``, batch 8, on the decode engine: what the engine alone gives;
3. ``cross-run``, batch 8: every run in flight at once (up to ``--max-in-flight`` episodes),
   each round's model calls merged into one backend call, the backend as in 2: what the
   scheduler adds;
4. ``cross-run``, batch ``--batch-size``: the same, the backend computing the larger batches
   that merging makes available (``batch_size`` and ``decoder`` are part of a run's identity,
   so these runs have folders of their own);
5. the same as 4 with ``coalesce_twins=false``: twin requests (the same agent's requests at
   several turn caps, identical until a turn reaches the smaller cap) each computed, not once:
   what running twins once adds.

Each line gives the episodes recorded, wall seconds, episodes per minute, the backend calls of
the shared backend and their mean batch (the trained clone controller generates with its own
model, not counted) and the ratio to the first line; the last lines give the ratios of the later
plays to the first and (for the cross-run plays) to the second, and of 4 to 5. It also checks
that the plays that differ only in schedule or twins (2 and 3, 4 and 5) wrote the same records
(``episodes.jsonl`` but ``wall_time_s``).
``--episodes N`` plays N episodes in every run: with fewer than ``parallel`` the per-run
schedule's batches shrink, which flatters the cross-run one; the suite's own counts are the
fair measure. ``--plays 1,4`` plays only the baseline and the main job's way (the quick suite's
own settings are ``--batch-size 128``), which halves the time of a full-size measurement;
``--plays 4,5`` (with the baseline) adds what running twins once gives.
``--per-run-parallel 8`` keeps at most 8 episodes in flight per run in the per-run plays, as
suites played before the cross-run schedule (by default they keep the suite's ``parallel``).

    python benchmarks/suite_throughput.py [--suite quick] [--episodes N] [--batch-size 64]
        [--plays 1,2,3,4,5] [--per-run-parallel 8]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from selfcest_env.agents.backends.transformers_backend import TransformersBackend
from selfcest_env.harness.requests import requests_from_suite
from selfcest_env.harness.runner import DEFAULT_MAX_IN_FLIGHT, Execution, execute
from selfcest_env.harness.suites import SuiteConfig, load_suite


@dataclass
class Play:
    """One timed play of the suite."""

    label: str
    wall_s: float
    done: Execution
    out: Path

    @property
    def episodes(self) -> int:
        """Episodes recorded."""
        return sum(outcome.played for outcome in self.done.outcomes)

    @property
    def per_minute(self) -> float:
        """Episodes recorded per minute."""
        return 60 * self.episodes / self.wall_s


def play(
    suite: SuiteConfig,
    out: Path,
    way: tuple[str, int, str, bool],
    max_in_flight: int,
    parallel: int | None = None,
) -> Play:
    """Play ``suite`` into ``out`` the ``(schedule, batch size, decoder, coalesce twins)`` way
    and time it (``parallel``: episodes in flight per run, ``None`` for the suite's own)."""
    schedule, batch_size, decoder, twins = way
    arguments = {
        **suite.backend_args, "batch_size": batch_size, "decoder": decoder,
        "coalesce_twins": twins,
    }  # fmt: skip
    configured = replace(suite, backend="transformers", backend_args=arguments)
    requests = requests_from_suite(configured, parallel=parallel)
    started = time.perf_counter()
    done = execute(
        requests,
        out,
        progress=False,
        report=lambda outcome: None,
        fail=print,
        schedule=schedule,
        max_in_flight=max_in_flight,
    )
    label = f"{schedule}, batch {batch_size}" + (", forward" if decoder == "forward" else "")
    label += "" if twins else ", twins apart"
    label += f", {parallel} in flight" if parallel else ""
    return Play(label, time.perf_counter() - started, done, out)


def records(out: Path) -> dict[str, list[dict]]:
    """Every run folder's episode records without ``wall_time_s``, by folder name."""
    found = {}
    for path in sorted(out.glob("*/episodes.jsonl")):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        for line in lines:
            del line["meters"]["wall_time_s"]
        found[path.parent.name] = lines
    return found


def main() -> None:
    """Play the suite up to five ways and print episodes per minute with the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="quick", help="built-in suite name or suite file")
    parser.add_argument("--episodes", type=int, default=None, help="episodes per run")
    parser.add_argument("--batch-size", type=int, default=64, help="batch of the last play")
    parser.add_argument("--max-in-flight", type=int, default=DEFAULT_MAX_IN_FLIGHT)
    parser.add_argument(
        "--per-run-parallel", type=int, default=None, help="episodes in flight per run in the "
        "per-run plays (default: the suite's own; 8 is the schedule before the cross-run one)"
    )  # fmt: skip
    parser.add_argument(
        "--plays", default="1,2,3,4,5", help="which of the five ways to play (the first is the "
        "baseline and always plays)"
    )  # fmt: skip
    args = parser.parse_args()
    try:
        chosen = sorted({int(number) for number in args.plays.split(",")} | {1})
    except ValueError:
        parser.error(f"--plays takes numbers from 1 to 5, got {args.plays!r}")
    if not set(chosen) <= {1, 2, 3, 4, 5}:
        parser.error(f"--plays takes numbers from 1 to 5, got {args.plays!r}")
    suite = load_suite(args.suite)
    if args.episodes is not None:
        suite = suite.with_episodes(args.episodes)
    TransformersBackend().close()  # converts the default model once, warms the file cache
    requests = requests_from_suite(suite)
    print(
        f"suite {suite.name}: {len(requests)} runs, {sum(r.episodes for r in requests)} "
        f"episodes, parallel {requests[0].parallel}, max in flight {args.max_in_flight}"
    )
    ways = [
        ("per-run", 8, "forward", True),
        ("per-run", 8, "auto", True),
        ("cross-run", 8, "auto", True),
        ("cross-run", args.batch_size, "auto", True),
        ("cross-run", args.batch_size, "auto", False),
    ]
    plays: list[Play] = []
    numbers: list[int] = []
    with tempfile.TemporaryDirectory() as root:
        for number in chosen:
            way = ways[number - 1]
            parallel = args.per_run_parallel if way[0] == "per-run" else None
            timed = play(suite, Path(root) / str(number), way, args.max_in_flight, parallel)
            numbers.append(number)
            plays.append(timed)
            calls, requested = timed.done.model_calls, timed.done.model_requests
            print(
                f"  {timed.label:35} {timed.episodes:4d} episodes  {timed.wall_s:7.1f} s  "
                f"{timed.per_minute:6.1f} episodes/min  {calls:5d} backend calls, mean batch "
                f"{requested / max(calls, 1):5.1f}  {timed.per_minute / plays[0].per_minute:.2f}x"
            )
        for first, second in ((2, 3), (4, 5)):
            if {first, second} <= set(numbers):
                same = records(plays[numbers.index(first)].out) == records(
                    plays[numbers.index(second)].out
                )
                print(
                    f"plays {first} and {second} wrote the same records: {'yes' if same else 'NO'}"
                )
    for index, timed in enumerate(plays[1:], start=1):
        bases = [plays[0]] + ([plays[1]] if numbers[1] == 2 and numbers[index] > 2 else [])
        if numbers[index] == 4 and 5 in numbers:
            bases.append(plays[numbers.index(5)])
        for base in bases:
            ratio = timed.per_minute / base.per_minute
            print(f"{timed.label} / {base.label}: {ratio:.2f}x episodes per minute")


if __name__ == "__main__":
    main()
