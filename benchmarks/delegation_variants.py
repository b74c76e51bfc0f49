"""Where delegation pays: the shape of the delegation variants, measured through the envs with
the default model's tokenizer.

    python benchmarks/delegation_variants.py [--episodes 16] [--caps 64,96,128,192,256]
        [--contexts 1000,2000,4000,8000,16000,32000] [--model-episodes N]
        [--depth-terms 12,24,32]

Math (``SelfCest-Math-v0``, arithmetic presets ``easy``, ``long-sum``, ``longer-sum``): the
scripted solution in one context (``ScriptedStepByStep``: one running total per line, the
chain of thought a monolithic model has to write) against the scripted delegation
(``ScriptedDelegator``: two clones, depth 1, each working its half out the same way): the
longest turn, the generated tokens and the
critical path (means over ``--episodes`` episodes), and for each turn cap of ``--caps`` which
of the two fits (the env cuts a turn at its cap, so a solution whose longest turn does not fit
cannot finish).

Depth (sums of ``--depth-terms`` single digits, two clones per call): the same in one context,
one level deep (two leaves of half the terms each) and two levels deep (the ``smollm2-depth2``
teacher: a context with more than six terms gives them to two clones, six per leaf).

QA (``SelfCest-MultiHopQA-v0``, synthetic two-hop questions at each ``--contexts`` size): the
tokens of a monolithic reader's prompt (every paragraph) against the default model's window,
and of the largest paragraph (what a clone given one key reads); and the scripted QA
delegator's largest root context and largest context of any kind (peak tokens; the root reads
the list of keys, each clone one paragraph) and its accuracy.

``--model-episodes N`` adds the default model's zero-shot monolithic accuracy on every math
variant and cap and every QA size that fits the window (N episodes each, the transformers
backend: minutes per line on a CPU): the monolithic failure mode.
"""

from __future__ import annotations

import argparse
import logging
from statistics import mean
from typing import Any

import gymnasium as gym

import selfcest_env  # noqa: F401  (registers the envs)
from selfcest_env.agents.scripted import ScriptedAgent, ScriptedDelegator, ScriptedStepByStep
from selfcest_env.agents.scripted_qa import ScriptedQADelegator
from selfcest_env.rollout import episode_specs, run_episodes
from selfcest_env.tasks.math.arithmetic import digit_sum

MATH_VARIANTS = ("easy", "long-sum", "longer-sum")


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def scripted_shape(make_env: Any, policy: ScriptedAgent, episodes: int) -> dict[str, float]:
    """Longest turn (max), generated tokens and critical path (means) of ``policy``."""
    results = list(
        run_episodes(
            make_env,
            policy,
            episode_specs(range(episodes), 0),
            parallel=episodes,
            keep_traces=True,
            progress=False,
        )
    )
    turns = [
        turn["gen_tokens"]
        for result in results
        for context in result.trace["contexts"]
        for turn in context["turns"]
    ]
    return {
        "correct": mean(result.correct for result in results),
        "longest_turn": max(turns),
        "gen": mean(result.meters["gen_tokens"] for result in results),
        "critical": mean(result.meters["critical_path_tokens"] for result in results),
    }


def monolithic_accuracy(backend: Any, make_env: Any, episodes: int, cap: int) -> float:
    """The zero-shot monolithic agent's accuracy over ``episodes`` episodes at turn cap ``cap``."""
    from selfcest_env.agents.registry import make_agent

    agent = make_agent("monolithic", backend, max_new_tokens=cap, seed=0)
    results = list(
        run_episodes(make_env, agent, episode_specs(range(episodes), 0), parallel=episodes)
    )
    return mean(result.correct for result in results)


def math_table(tokenizer: Any, args: argparse.Namespace, backend: Any) -> None:
    """Print the math variants' shapes and which caps each strategy fits."""
    caps = _ints(args.caps)
    print("math: one-context chain of thought (step) against two clones (delegate), tokens")
    header = f"{'variant':11} {'strategy':9} {'longest turn':>12} {'generated':>9} {'critical':>8}"
    print(header + "".join(f"  cap {cap:>4}" for cap in caps))
    for variant in MATH_VARIANTS:

        def make_env(variant: str = variant) -> Any:
            env = gym.make(
                "SelfCest-Math-v0", preset=variant, tokenizer=tokenizer, max_new_tokens=None
            )
            return env.unwrapped

        delegate = ScriptedDelegator(parts=2, leaf_steps=True)
        strategies = (("step", ScriptedStepByStep()), ("delegate", delegate))
        for name, policy in strategies:
            shape = scripted_shape(make_env, policy, args.episodes)
            fits = "".join(
                f"  {'fits' if shape['longest_turn'] <= cap else 'cut':>8}" for cap in caps
            )
            print(
                f"{variant:11} {name:9} {shape['longest_turn']:12d} {shape['gen']:9.1f} "
                f"{shape['critical']:8.1f}{fits}"
            )
        if backend is not None:
            line = "".join(
                f"  {monolithic_accuracy(backend, make_env, args.model_episodes, cap):8.2f}"
                for cap in caps
            )
            print(f"{variant:11} {'model':9} {'(monolithic accuracy)':>31}{line}")


def depth_table(tokenizer: Any, args: argparse.Namespace) -> None:
    """Print the shapes of sums of 12-32 digits with two clones per call, one level deep and
    two levels deep (the ``smollm2-depth2`` recipe's teacher: six terms per leaf)."""
    print(
        "\nmath, two clones per call: one context (step), depth 1 (two leaves of half the "
        "terms), depth 2 (leaves of at most six terms), tokens"
    )
    print(f"{'terms':>5} {'strategy':9} {'longest turn':>12} {'generated':>9} {'critical':>8}")
    for terms in _ints(args.depth_terms):
        strategies = (
            ("step", ScriptedStepByStep(), 1),
            ("depth 1", ScriptedDelegator(parts=2, leaf_steps=True, sum_steps=True), 1),
            (
                "depth 2",
                ScriptedDelegator(
                    parts=2, leaf_steps=True, sum_steps=True, chunk_size=6, solve_up_to=6
                ),
                2,
            ),
        )
        for name, policy, depth in strategies:

            def make_env(depth: int = depth, terms: int = terms) -> Any:
                env = gym.make(
                    "SelfCest-Math-v0",
                    **digit_sum(terms),
                    max_depth=depth,
                    max_clones_per_call=2,
                    tokenizer=tokenizer,
                    max_new_tokens=None,
                )
                return env.unwrapped

            shape = scripted_shape(make_env, policy, args.episodes)
            print(
                f"{terms:5d} {name:9} {shape['longest_turn']:12d} {shape['gen']:9.1f} "
                f"{shape['critical']:8.1f}"
            )


def qa_table(tokenizer: Any, args: argparse.Namespace, backend: Any) -> None:
    """Print the QA context sizes against the default model's window."""
    from transformers import AutoConfig

    from selfcest_env.agents.backends.default_model import default_model_dir

    window = AutoConfig.from_pretrained(default_model_dir()).max_position_embeddings
    print(f"\nQA: two-hop questions, the default model's window is {window} tokens")
    print(
        f"{'context':>8} {'monolithic prompt':>17} {'fits':>5} {'largest paragraph':>17} "
        f"{'delegated: root peak':>20} {'any context':>11} {'accuracy':>8}"
    )
    for size in _ints(args.contexts):

        def make_env(size: int = size, root_view: str = "full") -> Any:
            env = gym.make(
                "SelfCest-MultiHopQA-v0",
                hops=(2,),
                question_types=("compositional",),
                context_tokens=size,
                root_view=root_view,
                tokenizer=tokenizer,
                context_window=None,
            )
            return env.unwrapped

        env = make_env()
        prompts, paragraphs = [], []
        for index in range(args.episodes):
            observation, _ = env.reset(options={"index": index})
            prompts.append(len(tokenizer(observation["prompt"])["input_ids"]))
            instance = env.task.get(env.config.split, index)
            paragraphs.extend(
                len(tokenizer(f"{item.key}\n{item.text}")["input_ids"]) for item in instance.context
            )
        fits = max(prompts) < window
        line = f"{size:8d} {mean(prompts):17.0f} {'yes' if fits else 'no':>5} {max(paragraphs):17d}"
        delegated = list(
            run_episodes(
                lambda size=size: make_env(size, "keys"),
                ScriptedQADelegator(),
                episode_specs(range(args.episodes), 0),
                parallel=args.episodes,
                progress=False,
            )
        )
        root_peak = max(r.meters["root_peak_context_tokens"] for r in delegated)
        any_peak = max(r.meters["peak_context_tokens"] for r in delegated)
        accuracy = mean(r.correct for r in delegated)
        line += f" {root_peak:20d} {any_peak:11d} {accuracy:8.2f}"
        if backend is not None and fits:
            accuracy = monolithic_accuracy(backend, make_env, args.model_episodes, 64)
            line += f"  monolithic accuracy {accuracy:.2f}"
        print(line)


def main() -> None:
    """Print both tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=16, help="scripted episodes per line")
    parser.add_argument("--caps", default="64,96,128,192,256", help="turn caps (tokens)")
    parser.add_argument("--contexts", default="1000,2000,4000,8000,16000,32000")
    parser.add_argument("--model-episodes", type=int, default=0, help="0: no model runs")
    parser.add_argument("--depth-terms", default="12,24,32", help="sum lengths of the depth table")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from transformers import AutoTokenizer

    from selfcest_env.agents.backends.default_model import default_model_dir

    tokenizer = AutoTokenizer.from_pretrained(default_model_dir())
    backend = None
    if args.model_episodes:
        from selfcest_env.agents.backends import make_backend

        backend = make_backend("transformers", batch_size=64)
    math_table(tokenizer, args, backend)
    depth_table(tokenizer, args)
    qa_table(tokenizer, args, backend)


if __name__ == "__main__":
    main()
