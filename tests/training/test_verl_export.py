"""verl export: rows and the padded batch in the shape of verl's agent loop, on real env traces.

Traces come from the env with the real SmolLM2 tokenizer: a scripted delegator whose turns carry
token ids (its text, tokenized, plus the end-of-turn token) and made-up logprobs, and, in the slow
test, the real default model. The expected values are computed independently: prompts with the
tokenizer's own chat template, turn ids from the trace, rewards from the trace.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from selfcest_env.agents.backends.default_model import default_model_dir
from selfcest_env.agents.scripted import ScriptedDelegator
from selfcest_env.agents.training.credit import CreditConfig
from selfcest_env.agents.training.verl_export import (
    TENSOR_KEYS,
    AgentLoopRecord,
    agent_loop_records,
    verl_batch,
)
from selfcest_env.prompts import spawn_clone_schema
from selfcest_env.protocol import Return, Turn
from selfcest_env.rollout import ActionFailure, EpisodeSpec, run_episodes
from selfcest_env.trace import EpisodeTrace
from tests.training.test_samples import mask_runs


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir())


class TokenizedDelegator:
    """The scripted delegator, its turns sent as sampled tokens; odd episodes answer wrong."""

    name = "tokenized-delegator"

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.script = ScriptedDelegator(parts=2)

    def act_batch(self, views):
        actions = []
        for view in views:
            action = self.script.act(view.observation, view.info)
            if view.episode % 2 and view.context_id == 0 and isinstance(action, Return):
                action = Return(str(int(action.answer) + 1))
            text = action.to_text()
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            ids.append(self.tokenizer.eos_token_id)
            logprobs = [-0.01 * (view.context_id + 1) * (i + 1) for i in range(len(ids))]
            actions.append(Turn(text, token_ids=ids, logprobs=logprobs))
        return actions


def play(tokenizer, policy, tasks, repeats, **env_args):
    specs = [
        EpisodeSpec(n * repeats + r, 0, {"index": task})
        for n, task in enumerate(tasks)
        for r in range(repeats)
    ]
    results = run_episodes(
        lambda: (
            gym.make("SelfCest-Math-v0", tokenizer=tokenizer, split="train", **env_args).unwrapped
        ),
        policy,
        specs,
        keep_traces=True,
        progress=False,
    )
    return [r.trace for r in sorted(results, key=lambda r: r.episode)]


@pytest.fixture(scope="module")
def traces(tokenizer):
    return play(tokenizer, TokenizedDelegator(tokenizer), [0, 1], 2, preset="medium")


def first_prompt(tokenizer, context):
    """The context's first prompt, rendered by the tokenizer's own chat template."""
    messages = context["messages"][:2]
    tools = [spawn_clone_schema()] if context["may_spawn"] else None
    rendered = tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, return_dict=True
    )
    return list(rendered["input_ids"])


def test_records_hold_every_context_with_its_reward_and_turns(tokenizer, traces):
    records = agent_loop_records(traces, tokenizer)
    contexts = [(e, c) for e, trace in enumerate(traces) for c in trace["contexts"]]
    assert len(records) == len(contexts) == 12  # 4 episodes, a root and 2 clones each
    for record, (episode, context) in zip(records, contexts):
        extra = record.extra_fields
        assert (extra["episode"], extra["context_id"]) == (episode, context["id"])
        assert record.prompt_ids == first_prompt(tokenizer, context)
        runs = mask_runs(record.response_mask)  # the model's tokens: each turn, in order
        assert [record.response_ids[a:b] for a, b in runs] == [
            t["token_ids"] for t in context["turns"]
        ]
        for (_, end), (start, _) in zip(runs, runs[1:]):  # between turns: the tool message
            between = tokenizer.decode(record.response_ids[end:start])
            assert context["messages"][3]["content"] in between and "tool" in between
        connectors = [v for v, m in zip(record.response_logprobs, record.response_mask) if not m]
        assert connectors == [0.0] * len(connectors)
        for (a, b), turn in zip(runs, context["turns"]):
            assert record.response_logprobs[a:b] == pytest.approx(turn["logprobs"])
        assert record.reward_score == context["reward"]
        assert record.num_turns == sum(m["role"] != "system" for m in context["messages"])
        task_id = traces[episode]["task_id"]
        assert extra["uid"] == (task_id if context["depth"] == 0 else f"{task_id}/depth1")


def test_typed_traces_give_the_same_records(tokenizer, traces):
    typed = [EpisodeTrace.from_dict(trace) for trace in traces]
    for form in ("context", "turn"):
        plain = agent_loop_records(traces, tokenizer, form=form)
        assert agent_loop_records(typed, tokenizer, form=form) == plain


def test_rewards_and_reference_advantages_have_known_values(tokenizer, traces):
    records = agent_loop_records(traces, tokenizer)
    roots = [r for r in records if r.extra_fields["depth"] == 0]
    clones = [r for r in records if r.extra_fields["depth"] == 1]
    # Even episodes answer right (reward 1, clones 1 / 2.5), odd ones wrong (0 and 0).
    assert [r.reward_score for r in roots] == [1.0, 0.0, 1.0, 0.0]
    assert [r.reward_score for r in clones] == pytest.approx([0.4, 0.4, 0.0, 0.0] * 2)
    # One task per pair of rollouts: GRPO advantages +1 / -1; a clone gets its root's times
    # clip(0.4 / 1) = 0.4, or -1 times 0 / 0 (the sign-safe denominator) = 0.
    assert [r.extra_fields["advantage"] for r in roots] == pytest.approx([1, -1, 1, -1], abs=1e-5)
    assert [r.extra_fields["advantage"] for r in clones] == pytest.approx(
        [0.4, 0.4, 0.0, 0.0] * 2, abs=1e-5
    )
    shared = agent_loop_records(traces, tokenizer, credit=CreditConfig(rule="shared"))
    assert [r.extra_fields["advantage"] for r in shared] == pytest.approx(
        [1, 1, 1, -1, -1, -1] * 2, abs=1e-5
    )


def test_padded_batch_has_verl_keys_dtypes_padding_and_reward_placement(tokenizer, traces):
    records = agent_loop_records(traces, tokenizer)
    pad = tokenizer.pad_token_id
    batch = verl_batch(records, pad)
    rows = len(records)
    width_p = max(len(r.prompt_ids) for r in records)
    width_r = max(len(r.response_ids) for r in records)
    assert set(TENSOR_KEYS) <= set(batch)
    shapes = {
        "prompts": (rows, width_p),
        "responses": (rows, width_r),
        "response_mask": (rows, width_r),
        "input_ids": (rows, width_p + width_r),
        "attention_mask": (rows, width_p + width_r),
        "position_ids": (rows, width_p + width_r),
        "rollout_log_probs": (rows, width_r),
        "rm_scores": (rows, width_r),
    }
    for key, shape in shapes.items():
        assert isinstance(batch[key], torch.Tensor) and tuple(batch[key].shape) == shape, key
        floating = key in ("rollout_log_probs", "rm_scores")
        assert batch[key].dtype == (torch.float32 if floating else torch.int64), key
    for key in ("__num_turns__", "uid", "selfcest_advantage", "selfcest_episode"):
        assert isinstance(batch[key], np.ndarray) and batch[key].shape == (rows,), key
    assert batch["__num_turns__"].dtype == np.int32 and batch["uid"].dtype == object
    for row, record in enumerate(records):
        n_p, n_r = len(record.prompt_ids), len(record.response_ids)
        prompt, response = batch["prompts"][row], batch["responses"][row]
        # Prompts are left padded, responses right padded, both with the pad id.
        assert prompt[width_p - n_p :].tolist() == record.prompt_ids
        assert (prompt[: width_p - n_p] == pad).all()
        assert response[:n_r].tolist() == record.response_ids and (response[n_r:] == pad).all()
        attention = batch["attention_mask"][row].tolist()
        assert attention == [0] * (width_p - n_p) + [1] * (n_p + n_r) + [0] * (width_r - n_r)
        assert batch["input_ids"][row].tolist() == prompt.tolist() + response.tolist()
        assert batch["response_mask"][row].tolist() == record.response_mask + [0] * (width_r - n_r)
        positions = batch["position_ids"][row].tolist()
        assert positions == [0] * (width_p - n_p) + list(range(n_p + n_r)) + [n_p + n_r - 1] * (
            width_r - n_r
        )
        logprobs = batch["rollout_log_probs"][row]
        assert logprobs[:n_r].tolist() == pytest.approx(record.response_logprobs)
        assert (logprobs[n_r:] == 0).all()
        # The reward sits on the last response token, nothing elsewhere.
        scores = batch["rm_scores"][row]
        assert scores[n_r - 1].item() == pytest.approx(record.reward_score)
        assert (
            torch.count_nonzero(scores[: n_r - 1]) == 0 and torch.count_nonzero(scores[n_r:]) == 0
        )
        assert batch["__num_turns__"][row] == record.num_turns
        assert batch["uid"][row] == record.extra_fields["uid"]
        assert batch["selfcest_advantage"][row] == record.extra_fields["advantage"]


def test_fixed_lengths_cut_long_responses_and_refuse_long_prompts(tokenizer, traces):
    records = agent_loop_records(traces, tokenizer)
    longest = max(len(r.prompt_ids) for r in records)
    batch = verl_batch(records, 0, prompt_length=longest + 5, response_length=6)
    assert batch["prompts"].shape[1] == longest + 5 and batch["responses"].shape[1] == 6
    assert any(len(r.response_ids) > 6 for r in records)
    for row, record in enumerate(records):
        kept = min(6, len(record.response_ids))
        assert batch["responses"][row, :kept].tolist() == record.response_ids[:kept]
        assert batch["rm_scores"][row, kept - 1].item() == pytest.approx(record.reward_score)
    with pytest.raises(ValueError, match="prompt_length"):
        verl_batch(records, 0, prompt_length=longest - 1)
    with pytest.raises(ValueError, match="at least one"):
        verl_batch([], 0)
    with pytest.raises(ValueError, match="one value per response id"):
        AgentLoopRecord([1], [2, 3], [1, 1], [0.0], 1.0, 2)


class FailsOnEpisodeOne(TokenizedDelegator):
    """The tokenized delegator, whose backend fails for every turn of episode 1."""

    def act_batch(self, views):
        actions = super().act_batch(views)
        return [
            ActionFailure("timeout") if view.episode == 1 else action
            for view, action in zip(views, actions)
        ]


def test_aborted_episodes_are_left_out(tokenizer):
    traces = play(tokenizer, FailsOnEpisodeOne(tokenizer), [0], 2, preset="medium")
    assert [t["end_reason"] for t in traces] == ["answered", "backend_error"]
    records = agent_loop_records(traces, tokenizer)
    assert {r.extra_fields["episode"] for r in records} == {0} and len(records) == 3


def test_per_turn_rows_and_rows_without_logprobs(tokenizer, traces):
    records = agent_loop_records(traces, tokenizer, form="turn")
    # A root has two turns (spawn, sum), a clone one: 3 + 1 + 1 rows per episode.
    assert len(records) == 4 * 4
    for record in records:
        assert all(record.response_mask) and record.num_turns == 2 * record.extra_fields["turn"]
    record = AgentLoopRecord([1, 2], [3, 4], [1, 1], None, 0.5, 2)
    batch = verl_batch([record, records[0]], 0)
    assert "rollout_log_probs" not in batch  # verl adds it only when every row has logprobs


@pytest.mark.slow
def test_real_model_rollouts_export_in_verl_shape():
    from selfcest_env.agents.backends.transformers_backend import TransformersBackend
    from selfcest_env.agents.base import SamplingConfig
    from selfcest_env.agents.clone_controller import CloneControllerAgent

    backend = TransformersBackend(num_threads=1)
    tokenizer = backend.tokenizer
    agent = CloneControllerAgent(backend, SamplingConfig(temperature=1.0, max_new_tokens=24))
    traces = play(tokenizer, agent, [0, 1], 2, preset="easy", max_turns=2)
    records = agent_loop_records(traces, tokenizer)
    assert {r.extra_fields["episode"] for r in records} == {0, 1, 2, 3}
    batch = verl_batch(records, tokenizer.pad_token_id, response_length=64)
    for row, record in enumerate(records):
        context = traces[record.extra_fields["episode"]]["contexts"][
            record.extra_fields["context_id"]
        ]
        sampled = [i for turn in context["turns"] for i in turn["token_ids"]]
        n = min(len(record.response_ids), 64)
        kept = batch["responses"][row][batch["response_mask"][row].bool()].tolist()
        assert kept == [i for i, m in zip(record.response_ids[:n], record.response_mask) if m]
        assert kept == sampled[: len(kept)]
        logprobs = [v for turn in context["turns"] for v in turn["logprobs"]]
        model = batch["rollout_log_probs"][row][batch["response_mask"][row].bool()].tolist()
        assert model == pytest.approx(logprobs[: len(model)], abs=1e-5)
        assert batch["rm_scores"][row].sum().item() == pytest.approx(context["reward"], abs=1e-6)


@pytest.mark.parametrize("form", ["context", "turn"])
@pytest.mark.parametrize("rule", ["reference", "shared", "difference"])
def test_verl_rows_hold_what_the_in_house_trainer_trains(tokenizer, traces, tmp_path, form, rule):
    """For the same traces, the project's trainer (its sample building, credit and packed
    batch) and the verl batch hold the same tokens, loss masks, old logprobs and advantages,
    row by row."""
    from selfcest_env.agents.training.config import load_config
    from selfcest_env.agents.training.credit import assign_advantages
    from selfcest_env.agents.training.grpo import collate
    from selfcest_env.agents.training.policy import Policy
    from selfcest_env.agents.training.trainer import GRPOTrainer
    from selfcest_env.episodes import EpisodeResult

    config = load_config(
        overrides=[
            f"out={tmp_path}",
            "rollout.group_size=2",  # the fixture plays each task twice, one after another
            f"rollout.form={form}",
            f"credit.rule={rule}",
        ]
    )
    trainer = GRPOTrainer(config)
    trainer.policy = Policy(model=None, tokenizer=tokenizer, lora=False)
    results = [
        EpisodeResult(
            episode=number,
            task_id=trace["task_id"],
            seed=0,
            correct=False,
            score=0.0,
            reward=trace["reward"],
            end_reason=trace["end_reason"],
            answer="",
            meters=trace["meters"],
            trace=trace,
        )
        for number, trace in enumerate(traces)
    ]
    samples, rewards, groups = trainer._samples(results)
    advantages = assign_advantages(samples, config.credit, rewards, groups)
    pad = tokenizer.pad_token_id
    ours = collate(samples, advantages, pad_id=pad)
    records = agent_loop_records(traces, tokenizer, form=form, credit=config.credit)
    verl = verl_batch(records, pad)
    assert len(records) == len(samples) > len(traces)  # clones are rows too
    width_p = verl["prompts"].shape[1]
    for row, sample in enumerate(samples):
        prompt_len = int(verl["attention_mask"][row, :width_p].sum())
        response_len = int(verl["attention_mask"][row, width_p:].sum())
        length = prompt_len + response_len
        # The same tokens: prompt then response, without padding.
        kept = verl["attention_mask"][row].bool()
        assert ours.input_ids[row, :length].tolist() == verl["input_ids"][row][kept].tolist()
        assert int(ours.attention_mask[row].sum()) == length
        # Position t of ours scores token t + 1: the response starts at prompt_len - 1.
        span = slice(prompt_len - 1, prompt_len - 1 + response_len)
        assert ours.mask[row, span].tolist() == verl["response_mask"][row, :response_len].tolist()
        assert ours.mask[row].sum() == verl["response_mask"][row].sum()
        assert ours.old_logprobs[row, span].tolist() == pytest.approx(
            verl["rollout_log_probs"][row, :response_len].tolist(), abs=1e-6
        )
        assert float(ours.advantages[row]) == pytest.approx(
            float(verl["selfcest_advantage"][row]), abs=1e-6
        )
        assert verl["selfcest_context_id"][row] == sample.context_id
