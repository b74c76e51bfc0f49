"""Where a suite's time goes inside the decode engine: its steps by how many rows they carry.

Plays a suite (the quick suite by default) as ``selfcest suite`` does, cross-run, into a fresh
temporary folder (or ``--out``), with every decode-engine step and every engine call timed. It
prints the engine's time by the number of rows a step carried (a step of few rows costs nearly
what a full one costs: reading the weights dominates), the longest engine calls with their jobs
and steps, the time of the calls of at most ``--straggler-jobs`` jobs: the rounds that only
a few long episodes (a context that talks until its turn limit) still need, which the round
schedule plays one after another with nothing else in the batch, and the slot caches made
(their shapes and the seconds making them took).

    python benchmarks/suite_steps.py [--suite quick] [--episodes N] [--out DIR]
        [--straggler-jobs 4]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from selfcest_env.agents.backends.engine import Engine, Job
from selfcest_env.agents.backends.prefix_cache import SlotCache
from selfcest_env.harness.cli import main as selfcest

ROW_BINS = ((1, 15), (16, 31), (32, 63), (64, 127), (128, None))


@dataclass
class EngineTimes:
    """Every engine step as ``(rows, seconds)``, every engine call as ``(jobs, steps,
    seconds)`` and every slot cache made as ``(slots, positions, seconds)``, in order."""

    steps: list[tuple[int, float]] = field(default_factory=list)
    calls: list[tuple[int, int, float]] = field(default_factory=list)
    caches: list[tuple[int, int, float]] = field(default_factory=list)

    def install(self) -> None:
        """Time :meth:`Engine._step`, :meth:`Engine.run` and :meth:`Engine._cache_for` of every
        engine from now on."""
        step, run, cache_for = Engine._step, Engine.run, Engine._cache_for
        times = self

        def timed_cache_for(engine: Engine, jobs: Sequence[Job]) -> SlotCache:
            started, before = time.perf_counter(), engine.store.cache
            cache = cache_for(engine, jobs)
            if cache is not before:
                times.caches.append((cache.slots, cache.capacity, time.perf_counter() - started))
            return cache

        def timed_step(engine: Engine, running: list[Job], cache: object) -> list[Job]:
            started = time.perf_counter()
            finished = step(engine, running, cache)
            times.steps.append((len(running), time.perf_counter() - started))
            return finished

        def timed_run(engine: Engine, jobs: Sequence[Job]) -> None:
            started, first = time.perf_counter(), len(times.steps)
            run(engine, jobs)
            times.calls.append((len(jobs), len(times.steps) - first, time.perf_counter() - started))

        Engine._step = timed_step  # type: ignore[method-assign]
        Engine.run = timed_run  # type: ignore[method-assign]
        Engine._cache_for = timed_cache_for  # type: ignore[method-assign]


def report(times: EngineTimes, wall_s: float, straggler_jobs: int) -> None:
    """Print the step table, the longest calls and the stragglers' share."""
    total = sum(seconds for _, seconds in times.steps)
    calls, steps = len(times.calls), len(times.steps)
    print(f"wall {wall_s:.1f} s; engine: {calls} calls, {steps} steps, {total:.1f} s")
    print(f"{'rows a step':<12}{'steps':>8}{'seconds':>10}{'share':>8}{'row-steps/s':>13}")
    for low, high in ROW_BINS:
        chosen = [(r, s) for r, s in times.steps if r >= low and (high is None or r <= high)]
        seconds = sum(s for _, s in chosen)
        rate = sum(r for r, _ in chosen) / seconds if seconds else 0.0
        label = f"{low}-{high}" if high is not None else f"{low}+"
        share = 100 * seconds / total if total else 0.0
        print(f"{label:<12}{len(chosen):>8}{seconds:>10.1f}{share:>7.1f}%{rate:>13.1f}")
    longest = sorted(times.calls, key=lambda call: -call[2])[:8]
    print("longest calls (jobs, steps, seconds):", [(j, n, round(s, 1)) for j, n, s in longest])
    stragglers = [call for call in times.calls if call[0] <= straggler_jobs]
    seconds = sum(call[2] for call in stragglers)
    print(
        f"calls of at most {straggler_jobs} jobs: {len(stragglers)}, {seconds:.1f} s "
        f"({100 * seconds / wall_s:.1f}% of the wall time)"
    )
    made = sum(seconds for _, _, seconds in times.caches)
    shapes = [(slots, positions) for slots, positions, _ in times.caches]
    print(f"slot caches made: {len(shapes)}, {made:.1f} s; (slots, positions): {shapes}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="quick", help="built-in suite name or suite file")
    parser.add_argument("--episodes", type=int, help="episodes per run (default: the suite's)")
    parser.add_argument("--out", help="output folder (default: a temporary one)")
    parser.add_argument("--straggler-jobs", type=int, default=4)
    args = parser.parse_args()
    times = EngineTimes()
    times.install()
    with tempfile.TemporaryDirectory() as scratch:
        command = ["suite", args.suite, "--out", args.out or scratch, "--no-progress"]
        if args.episodes:
            command += ["--episodes", str(args.episodes)]
        started = time.perf_counter()
        code = selfcest(command)
        wall_s = time.perf_counter() - started
    if code:
        raise SystemExit(f"suite_steps: `selfcest {' '.join(command)}` exited with {code}")
    report(times, wall_s, args.straggler_jobs)


if __name__ == "__main__":
    main()
