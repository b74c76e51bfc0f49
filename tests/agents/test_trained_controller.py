"""The bundled trained clone controller: package data, registry, offline loading, behaviour."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

from selfcest_env.agents.registry import agent_names, make_agent
from selfcest_env.agents.trained_controller import (
    BUNDLED_DELEGATE_ADAPTER,
    BUNDLED_DEPTH2_ADAPTER,
    BUNDLED_QA_ADAPTER,
    adapter_digest,
    bundled_adapter_dir,
)
from selfcest_env.rollout import episode_specs, run_episodes


class NamedBackend:
    """Stands in for a backend by name only (what the CLI passes before loading a model)."""

    tokenizer = None

    def __init__(self, name="transformers", model_name="SmolLM2-135M-Instruct"):
        self.name = name
        self.model_name = model_name


def test_bundled_adapter_ships_with_its_provenance():
    folder = bundled_adapter_dir()
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 8
    assert config["base_model_name_or_path"] == "SmolLM2-135M-Instruct"
    made_by = json.loads((folder / "train_config.json").read_text())
    assert made_by["model"]["finetune"] == "lora" and made_by["model"]["name"] is None
    for name in ("adapter_model.safetensors", "train_log.csv", "eval_log.csv", "README.md"):
        assert (folder / name).is_file()
    assert "selfcest train --recipe smollm2" in (folder / "README.md").read_text()


@pytest.mark.parametrize(
    ("adapter", "recipe", "settings"),
    [
        (BUNDLED_DELEGATE_ADAPTER, "smollm2-delegate", {("env", "args", "max_clones_per_call"): 4}),
        (
            BUNDLED_DEPTH2_ADAPTER,
            "smollm2-depth2",
            {("env", "max_depth"): 2, ("imitation", "solve_up_to"): 6},
        ),
        (
            BUNDLED_QA_ADAPTER,
            "smollm2-qa-delegate",
            {("env", "id"): "SelfCest-MultiHopQA-v0", ("env", "args", "context_tokens"): 2000},
        ),
    ],
)
def test_bundled_rank16_adapters_ship_with_their_provenance(adapter, recipe, settings):
    folder = bundled_adapter_dir(adapter)
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 16
    assert config["base_model_name_or_path"] == "SmolLM2-135M-Instruct"
    made_by = json.loads((folder / "train_config.json").read_text())
    assert made_by["model"]["finetune"] == "lora" and made_by["model"]["name"] is None
    for path, value in settings.items():
        found = made_by
        for key in path:
            found = found[key]
        assert found == value, path
    for name in ("adapter_model.safetensors", "train_log.csv", "eval_log.csv", "README.md"):
        assert (folder / name).is_file()
    assert f"selfcest train --recipe {recipe} " in (folder / "README.md").read_text()


def test_registry_builds_it_without_loading_a_model(tmp_path):
    assert "clone-controller-trained" in agent_names()
    agent = make_agent("clone-controller-trained", NamedBackend(), max_new_tokens=16)
    assert agent.config_dict()["model"] == "SmolLM2-135M-Instruct+clone-controller-smollm2"
    assert agent.config_dict()["max_new_tokens"] == 16 and agent.env_overrides() == {"max_depth": 1}
    with pytest.raises(ValueError, match="transformers backend and the default model"):
        make_agent("clone-controller-trained", NamedBackend("openai", "gpt"))
    with pytest.raises(ValueError, match="not a LoRA adapter folder"):
        make_agent("clone-controller-trained", NamedBackend(), adapter=str(tmp_path))
    depth2 = make_agent("clone-controller-depth2", NamedBackend())
    assert depth2.adapter == bundled_adapter_dir(BUNDLED_DEPTH2_ADAPTER)
    assert depth2.env_overrides() == {"max_depth": 2}
    assert make_agent("clone-controller-depth2", NamedBackend(), max_depth=1).max_depth == 1
    qa = make_agent("clone-controller-qa", NamedBackend())
    assert qa.adapter == bundled_adapter_dir(BUNDLED_QA_ADAPTER)
    assert qa.env_overrides() == {"max_depth": 1}
    delegate = make_agent("clone-controller-delegate", NamedBackend())
    assert delegate.adapter == bundled_adapter_dir(BUNDLED_DELEGATE_ADAPTER)
    assert delegate.config_dict()["model"] == (
        "SmolLM2-135M-Instruct+clone-controller-smollm2-delegate"
    )


def test_an_adapter_retrained_in_place_gets_run_folders_of_its_own(tmp_path):
    """An adapter's identity is its files, not its path: retrained in place (a ``selfcest
    train`` run exports to the same ``final/``) or replaced in the package, it must not resume
    the run folders of the adapter it replaced; a changed README changes nothing."""
    import shutil

    from selfcest_env.harness.requests import RunRequest
    from selfcest_env.harness.runner import Runner
    from selfcest_env.registration import MATH_ENV_ID

    bundled = bundled_adapter_dir()
    folder = tmp_path / "final"
    shutil.copytree(bundled, folder)

    def run_id():
        request = RunRequest(
            env=MATH_ENV_ID, source="arithmetic", split="test",
            agent="clone-controller-trained", agent_options={"adapter": str(folder)},
            budget={"max_new_tokens": 32}, episodes=1,
        )  # fmt: skip
        return Runner("unused").spec_for(request).run_id

    first = run_id()
    (folder / "README.md").write_text("notes change nothing")
    assert run_id() == first
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, "lora_alpha": 64}))
    retrained = run_id()
    assert retrained != first
    weights = folder / "adapter_model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    assert run_id() not in (first, retrained)
    agent = make_agent("clone-controller-trained", NamedBackend(), adapter=str(bundled))
    assert agent.config_dict()["adapter_sha256"] == adapter_digest(bundled)
    assert agent.config_dict()["adapter"] == "clone-controller-smollm2"


@pytest.mark.slow
def test_trained_controller_answers_shorter_than_the_untrained_one():
    from selfcest_env.agents.backends.transformers_backend import TransformersBackend

    backend = TransformersBackend(num_threads=1)
    weights = {k: v.clone() for k, v in backend.model.state_dict().items()}
    generated = {}
    agents = {}
    for name, cap, episodes in (
        ("clone-controller", 64, 8),
        ("clone-controller-trained", 64, 8),
        ("clone-controller-trained", 32, 2),
    ):
        agent = make_agent(name, backend, max_new_tokens=cap)
        agents[name, cap] = agent
        results = list(
            run_episodes(
                lambda agent=agent: (
                    gym.make(
                        "SelfCest-Math-v0",
                        preset="easy",
                        tokenizer=backend.tokenizer,
                        **agent.env_overrides(),
                    ).unwrapped
                ),
                agent,
                episode_specs(range(episodes)),
                progress=False,
            )
        )
        generated[name, cap] = sum(r.meters["gen_tokens"] for r in results) / len(results)
    # Trained: one short line per answer (about 11 tokens); untrained: about 35.
    assert generated["clone-controller-trained", 64] < generated["clone-controller", 64] / 2
    # The shared backend's own weights were left alone (the adapter went into a copy).
    assert all(v.equal(weights[k]) for k, v in backend.model.state_dict().items())
    # Two agents with the same adapter on one backend share one adapted copy, closed with it.
    adapted = agents["clone-controller-trained", 64].backend
    assert adapted is not backend and adapted.model is not backend.model
    assert agents["clone-controller-trained", 32].backend is adapted
    backend.close()
    assert adapted.model is None and adapted.engine is None


def play_digit_sums(backend, agent, terms, clones_per_call, episodes=8):
    """``episodes`` greedy episodes of ``agent`` on sums of ``terms`` single digits."""
    from selfcest_env.tasks.math.arithmetic import digit_sum

    def make_env():
        return gym.make(
            "SelfCest-Math-v0",
            **digit_sum(terms),
            max_clones_per_call=clones_per_call,
            tokenizer=backend.tokenizer,
            **agent.env_overrides(),
        ).unwrapped

    specs = episode_specs(range(episodes))
    return list(run_episodes(make_env, agent, specs, parallel=episodes, progress=False))


@pytest.mark.slow
def test_delegating_controller_hands_long_sums_to_clones():
    """On sums of 16 digits at the 96-token cap it was trained at, the delegating controller
    spawns clones where the prompted one never does, and its clones' answers add up right."""
    from selfcest_env.agents.backends.transformers_backend import TransformersBackend

    backend = TransformersBackend(num_threads=1, batch_size=8)
    results = {}
    for name in ("clone-controller", "clone-controller-delegate"):
        agent = make_agent(name, backend, max_new_tokens=96)
        results[name] = play_digit_sums(backend, agent, 16, clones_per_call=4)
    backend.close()
    spawned = {name: sum(r.meters["clones"] > 0 for r in rs) for name, rs in results.items()}
    correct = {name: sum(r.score == 1 for r in rs) for name, rs in results.items()}
    assert spawned["clone-controller"] == 0 and correct["clone-controller"] == 0
    # Measured here: 4 of 8 spawned, 4 of 8 right (margin left for other machines' floats).
    assert spawned["clone-controller-delegate"] >= 2 and correct["clone-controller-delegate"] >= 1


@pytest.mark.slow
def test_depth2_controller_nests_clones_on_long_sums_and_not_on_short_ones():
    """On sums of 24 digits at the 128-token cap it was trained at, with two clones per call,
    the depth-2 controller's clones start clones of their own; on sums of 2-4 digits it spawns
    nothing."""
    from selfcest_env.agents.backends.transformers_backend import TransformersBackend

    backend = TransformersBackend(num_threads=1, batch_size=8)
    agent = make_agent("clone-controller-depth2", backend, max_new_tokens=128)
    results = {
        terms: play_digit_sums(backend, agent, terms, clones_per_call=2) for terms in (3, 24)
    }
    backend.close()
    # Measured here: 8 of 8 short sums right without a clone; 24 digits: 8 of 8 nested, 6 right.
    assert all(r.meters["clones"] == 0 for r in results[3])
    assert sum(r.score == 1 for r in results[3]) >= 6
    nested = sum(r.meters["max_depth"] == 2 for r in results[24])
    assert nested >= 4 and sum(r.score == 1 for r in results[24]) >= 1


@pytest.mark.slow
def test_qa_controller_reads_paragraphs_through_clones():
    """On 1-2 hop questions over 2,000 tokens of paragraphs, where the root sees only the keys,
    the QA controller asks clones about the paragraphs and answers from what they return; the
    prompted controller answers without reading and gets nothing right."""
    from selfcest_env.agents.backends.transformers_backend import TransformersBackend

    backend = TransformersBackend(num_threads=1, batch_size=8)

    def make_env(agent):
        return lambda: (
            gym.make(
                "SelfCest-MultiHopQA-v0",
                question_types=["compositional", "comparison"],
                hops=[1, 2],
                context_tokens=2000,
                max_clones_per_call=4,
                tokenizer=backend.tokenizer,
                **agent.env_overrides(),
            ).unwrapped
        )

    results = {}
    for name in ("clone-controller", "clone-controller-qa"):
        agent = make_agent(name, backend, max_new_tokens=128)
        specs = episode_specs(range(8))
        results[name] = list(
            run_episodes(make_env(agent), agent, specs, parallel=8, progress=False)
        )
    backend.close()
    spawned = {name: sum(r.meters["clones"] > 0 for r in rs) for name, rs in results.items()}
    correct = {name: sum(r.score == 1 for r in rs) for name, rs in results.items()}
    assert spawned["clone-controller"] == 0 and correct["clone-controller"] == 0
    assert spawned["clone-controller-qa"] >= 6 and correct["clone-controller-qa"] >= 2
