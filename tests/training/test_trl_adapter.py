"""TRL's GRPOTrainer driving SelfCest episodes through TRLRollouts.

A slow test trains the default model (SmolLM2-135M-Instruct, LoRA) for two GRPO steps on CPU
with the real TRL trainer and checks that the steps ran, that the rewards TRL logged are the
env's rewards for exactly the episodes played (replayed through a fresh env), that the root rows
TRL trained on are the root contexts of those episodes, and that the weights moved. Two more
train a small Llama over the real tokenizer on episodes in which the root always spawns: every
clone context is a row with the credit rule's advantage, a clone row's tokens get gradient, and
training makes the credited clone answers more likely.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("trl")

from selfcest_env import RewardConfig  # noqa: E402
from selfcest_env.agents.backends.default_model import default_model_dir  # noqa: E402
from selfcest_env.agents.training.samples import trace_samples  # noqa: E402
from selfcest_env.agents.training.trl_adapter import (  # noqa: E402
    EXTRA_FIELDS,
    TRLRolloutConfig,
    TRLRollouts,
)
from selfcest_env.budget import METER_NAMES  # noqa: E402
from selfcest_env.protocol import Turn  # noqa: E402
from selfcest_env.reward import CostPenalty  # noqa: E402
from selfcest_env.rollout import ActionFailure, EpisodeSpec, run_episodes  # noqa: E402
from tests.small_models import small_llama  # noqa: E402
from tests.training.test_verl_export import TokenizedDelegator  # noqa: E402

#: Every generated root token costs a little, so rollouts of one task differ in reward.
LENGTH_COST = RewardConfig(root_penalty=CostPenalty(threshold=0, ramp=64, maximum=0.3))


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir())


def test_dataset_rows_are_tasks_and_unknown_prompts_are_refused(tokenizer):
    rollouts = TRLRollouts(tokenizer, TRLRolloutConfig(env_args={"preset": "easy"}, tasks=5))
    dataset = rollouts.dataset()
    assert dataset["task_index"] == list(range(5))
    env = rollouts.make_env()
    assert env.counter is rollouts.make_env().counter  # one counter, not one per episode
    assert env.counter.tokenizer is tokenizer
    for index, prompt in enumerate(dataset["prompt"]):
        _, info = env.reset(options={"index": index})
        assert prompt == info["messages"][-1]["content"]
        assert prompt.startswith("Calculate the value of")
    args = SimpleNamespace(temperature=1.0, top_p=1.0, max_completion_length=8, top_k=0)
    trainer = SimpleNamespace(args=args)
    with pytest.raises(ValueError, match="not a task of this adapter's dataset"):
        rollouts(["Calculate the value of 1 + 1 + 1 + 1 + 1 + 1."], trainer)
    for name, value in (("top_k", 5), ("min_p", 0.1), ("repetition_penalty", 1.2)):
        bad = SimpleNamespace(**{**vars(args), name: value})
        with pytest.raises(ValueError, match=f"{name}={value}"):
            rollouts([dataset["prompt"][0]], SimpleNamespace(args=bad))


def test_reward_function_returns_env_rewards_and_logs_meters(tokenizer):
    rollouts = TRLRollouts(tokenizer)
    logged = {}
    meters = [{name: float(i + n) for n, name in enumerate(METER_NAMES)} for i in range(2)]
    rewards = rollouts.selfcest_reward(
        ["p", "p"],
        ["a", "b"],
        env_reward=[0.75, -0.25],
        env_correct=[True, False],
        env_answered=[True, True],
        env_meters=meters,
        log_metric=logged.__setitem__,
        task_index=[0, 0],
    )
    assert rewards == [0.75, -0.25]
    assert logged["selfcest/accuracy"] == 0.5 and logged["selfcest/answered"] == 1.0
    assert logged["selfcest/gen_tokens"] == pytest.approx(sum(m["gen_tokens"] for m in meters) / 2)


def replay(make_env, trace, index):
    """Play a recorded trace again in a fresh env, every context's turns as recorded."""
    env = make_env()
    env.reset(options={"index": index})
    turns = {context["id"]: list(context["turns"]) for context in trace["contexts"]}
    while True:
        actions = {}
        for context_id in env.runnable():
            turn = turns[context_id].pop(0)
            actions[context_id] = Turn(turn["text"], turn["token_ids"], turn["logprobs"])
        _, reward, terminated, truncated, info = env.step_many(actions)
        if terminated or truncated:
            env.close()
            return reward, info


@pytest.mark.slow
def test_grpo_trainer_runs_steps_on_env_rewards_and_moves_the_weights(tokenizer, tmp_path):
    import torch
    from peft import LoraConfig
    from trl import GRPOConfig

    from selfcest_env.agents.backends.default_model import load_default_model

    torch.set_num_threads(1)
    model, _ = load_default_model(device="cpu", dtype="float32")
    batches = []
    config = TRLRolloutConfig(
        env_args={"preset": "tiny", "max_turns": 2, "reward": LENGTH_COST}, tasks=8, seed=1
    )
    rollouts = TRLRollouts(tokenizer, config, on_episodes=batches.append)
    args = GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=32,
        temperature=0.7,
        max_steps=2,
        learning_rate=1e-3,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=0,
    )
    lora = LoraConfig(
        r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"
    )
    trainer = rollouts.trainer(model, args, peft_config=lora)
    trained = {
        n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad
    }
    rows = []

    def recorded(prompts, trainer):
        rows.append(rollouts(prompts, trainer))
        return rows[-1]

    trainer.rollout_func = recorded  # what TRL calls for generation (trl 1.16)

    trainer.train()

    assert trainer.state.global_step == 2 and rollouts.episodes_played == 8
    steps = [entry for entry in trainer.state.log_history if "reward" in entry]
    assert [len(batch) for batch in batches] == [4, 4] and len(steps) == 2
    for batch, logged, row in zip(batches, steps, rows):
        # One task per step, four rollouts of it: TRL's group.
        assert len({result.task_id for result in batch}) == 1
        index = int(batch[0].task_id.rsplit("-", 1)[1])
        rewards = []
        for result in batch:
            replayed, info = replay(rollouts.make_env, result.trace, index)
            assert replayed == pytest.approx(result.reward)  # the env's ledger, replayed
            assert info["context_rewards"][0] == pytest.approx(result.reward)
            rewards.append(result.reward)
        assert row["env_reward"] == rewards  # what the reward function handed TRL
        assert logged["reward"] == pytest.approx(sum(rewards) / 4, abs=1e-6)
        assert logged["selfcest/accuracy"] == pytest.approx(sum(r.correct for r in batch) / 4)
        for result, prompt_ids, completion, mask in zip(
            batch, row["prompt_ids"], row["completion_ids"], row["env_mask"]
        ):
            root = trace_samples(result.trace, tokenizer, episode=result.episode)[0]
            assert root.is_root and prompt_ids == root.prompt_ids
            assert completion == root.response_ids and mask == root.response_mask
            sampled = [
                i for turn in result.trace["contexts"][0]["turns"] for i in turn["token_ids"]
            ]
            assert [i for i, m in zip(completion, mask) if m] == sampled
    assert any(entry["reward_std"] > 0 for entry in steps)  # a learning signal existed
    moved = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    changed = [
        n for n in moved if not torch.equal(trained[n], dict(trainer.model.named_parameters())[n])
    ]
    assert changed and all("lora" in n for n in moved)


def delegated_episodes(tokenizer, **env_args):
    """Two rollouts of one task by the tokenized scripted delegator (the root spawns)."""
    rollouts = TRLRollouts(tokenizer, TRLRolloutConfig(env_args={"preset": "medium", **env_args}))
    specs = [EpisodeSpec(episode, 0, {"index": 3}) for episode in range(2)]
    results = run_episodes(
        rollouts.make_env, TokenizedDelegator(tokenizer), specs, keep_traces=True, progress=False
    )
    return rollouts, sorted(results, key=lambda result: result.episode)


def test_rows_are_root_contexts_with_clone_answers_masked(tokenizer):
    rollouts, results = delegated_episodes(tokenizer)
    rows = rollouts.rows(results, [3, 3])
    assert set(rows) == {"prompt_ids", "completion_ids", "logprobs", *EXTRA_FIELDS}
    assert rows["env_reward"] == [1.0, 0.0]  # the second rollout answers wrong
    assert rows["env_correct"] == [True, False]
    for n, result in enumerate(results):
        root = result.trace["contexts"][0]
        assert len(result.trace["contexts"]) == 3  # two clones ran, their turns not in the row
        completion, mask = rows["completion_ids"][n], rows["env_mask"][n]
        assert len(completion) == len(mask) == len(rows["logprobs"][n])
        sampled = [i for turn in root["turns"] for i in turn["token_ids"]]
        assert [i for i, m in zip(completion, mask) if m] == sampled
        between = tokenizer.decode([i for i, m in zip(completion, mask) if not m])
        assert root["messages"][3]["role"] == "tool" and root["messages"][3]["content"] in between
        assert rows["env_meters"][n] == {name: result.meters[name] for name in METER_NAMES}


class FailingBackend:
    """A policy whose backend fails on every turn: the driver aborts each episode."""

    name = "failing"

    def act_batch(self, views):
        return [ActionFailure("connection refused") for _ in views]


def test_an_aborted_episode_is_a_masked_row_that_trl_leaves_out(tokenizer):
    rollouts = TRLRollouts(tokenizer, TRLRolloutConfig(env_args={"preset": "easy"}))
    (result,) = run_episodes(
        rollouts.make_env,
        FailingBackend(),
        [EpisodeSpec(0, 0, {"index": 0})],
        keep_traces=True,
        progress=False,
    )
    rows = rollouts.rows([result], [0])
    assert result.end_reason == "backend_error"
    assert rows["env_mask"] == [[0]] and rows["env_reward"] == [None]
    logged = {}
    meters = rows["env_meters"]
    rewards = rollouts.selfcest_reward(
        ["p"], ["c"], rows["env_reward"], [False], [False], meters, log_metric=logged.__setitem__
    )
    assert rewards == [None]  # unscorable for TRL: no baseline share, advantage 0
    assert logged["selfcest/aborted"] == 1.0


def test_a_root_without_tokens_becomes_a_masked_row(tokenizer):
    rollouts, results = delegated_episodes(tokenizer, context_window=40)  # prompt > window
    rows = rollouts.rows(results, [3, 3])
    assert [r.end_reason for r in results] == ["context_limit"] * 2
    for n in range(2):
        assert rows["completion_ids"][n] == [tokenizer.eos_token_id]
        assert rows["env_mask"][n] == [0] and rows["env_reward"][n] == 0.0
        messages = results[n].trace["contexts"][0]["messages"][:2]
        assert tokenizer.decode(rows["prompt_ids"][n]).endswith(
            messages[1]["content"] + "<|im_end|>\n<|im_start|>assistant\n"
        )


def clone_trainer(tokenizer, tmp_path, steps: int, learning_rate: float = 0.0):
    """TRL's trainer through the adapter with clone rows, the episodes played by the tokenized
    scripted delegator (its root spawns two clones; odd episodes answer wrong): every batch
    holds one task's four rollouts, and what TRL trained on is recorded."""
    from trl import GRPOConfig

    config = TRLRolloutConfig(env_args={"preset": "medium"}, tasks=4, seed=1)
    rollouts = TRLRollouts(
        tokenizer,
        config,
        agent_factory=lambda backend, sampling, depth: TokenizedDelegator(tokenizer),
    )
    args = GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=64,
        max_steps=steps,
        learning_rate=learning_rate,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=0,
    )
    trainer = rollouts.trainer(small_llama(tokenizer), args)
    batches = []
    score = trainer._generate_and_score_completions

    def recorded(inputs):
        batches.append(score(inputs))
        return batches[-1]

    trainer._generate_and_score_completions = recorded
    return rollouts, trainer, batches


@pytest.mark.slow
def test_clone_contexts_become_rows_with_the_credit_rules_advantages(tokenizer, tmp_path):
    rollouts, trainer, batches = clone_trainer(tokenizer, tmp_path, steps=1)
    trainer.train()
    (batch,) = batches
    results, _ = rollouts._last_batch
    samples, advantages = rollouts.context_rows()
    clones = [(s, a) for s, a in zip(samples, advantages) if not s.is_root]
    assert len(results) == 4 and len(clones) == 8  # two clones per episode
    assert batch["prompt_ids"].shape[0] == batch["completion_ids"].shape[0] == 12
    for row, (sample, advantage) in enumerate(clones, start=4):
        prompt = batch["prompt_ids"][row][batch["prompt_mask"][row].bool()].tolist()
        completion = batch["completion_ids"][row][batch["completion_mask"][row].bool()].tolist()
        assert prompt == sample.prompt_ids and completion == sample.response_ids
        mask = batch["tool_mask"][row][: len(sample.response_mask)].tolist()
        assert mask == sample.response_mask
        assert float(batch["advantages"][row]) == pytest.approx(advantage, abs=1e-6)
    roots = {s.episode: a for s, a in zip(samples, advantages) if s.is_root}
    assert batch["advantages"][:4].tolist() == pytest.approx(
        [roots[r.episode] for r in results], abs=1e-6
    )
    # Right episodes' clones are credited (0.4 of their root's +1), wrong ones' are not.
    assert sorted(round(a, 4) for _, a in clones) == [0.0] * 4 + [0.4] * 4
    loss_tokens = (batch["completion_mask"] * batch["tool_mask"]).sum()
    assert int(batch["num_items_in_batch"]) == int(loss_tokens)


@pytest.mark.slow
def test_clone_tokens_receive_gradient_and_clone_behaviour_moves(tokenizer, tmp_path):
    import torch

    rollouts, trainer, batches = clone_trainer(tokenizer, tmp_path, steps=3, learning_rate=0.1)
    trainer.train()
    model = trainer.model
    batch = dict(batches[0])

    def clone_logprob(weights) -> float:
        """Mean logprob of the credited clones' own tokens under ``weights`` (a plain forward
        pass: position t scores token t + 1)."""
        rows = [row for row in range(4, 12) if float(batch["advantages"][row]) > 0]
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)[rows]
        attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)[rows]
        width = batch["completion_ids"].shape[1]
        with torch.no_grad():
            logits = weights(input_ids=ids, attention_mask=attention).logits[:, -width - 1 : -1]
        logps = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, -width:, None])[..., 0]
        mask = (batch["completion_mask"] * batch["tool_mask"])[rows]
        return float((logps * mask).sum() / mask.sum())

    # Gradient: with only the clone rows' advantages left, the loss still moves the weights.
    only_clones = dict(batch, advantages=batch["advantages"].clone())
    only_clones["advantages"][:4] = 0.0
    model.train()
    model.zero_grad()
    trainer.compute_loss(model, only_clones).backward()
    norm = sum(float(p.grad.abs().sum()) for p in model.parameters() if p.grad is not None)
    assert norm > 0
    model.zero_grad()
    none = dict(batch, advantages=torch.zeros_like(batch["advantages"]))
    trainer.compute_loss(model, none).backward()
    assert all(
        p.grad is None or float(p.grad.abs().sum()) == 0 for p in model.parameters()
    )  # the control: no advantage, no gradient
    model.zero_grad()
    # Behaviour: three steps made the credited clone answers more likely than at the start (the
    # same seeded initial weights).
    trained = clone_logprob(model)
    untrained = clone_logprob(small_llama(tokenizer))
    assert trained > untrained + 0.5, (untrained, trained)
