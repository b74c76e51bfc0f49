"""The training config, the ``selfcest train`` command and the trainer end to end (tiny runs)."""

from __future__ import annotations

import csv
import gc
import json
import os
import shutil
from dataclasses import fields, is_dataclass

import pytest

from selfcest_env.agents.training.config import (
    ConfigError,
    TrainConfig,
    config_from_dict,
    describe_config,
    load_config,
    recipe_names,
)
from selfcest_env.agents.training.trainer import EVAL_LOG, TRAIN_LOG, GRPOTrainer
from selfcest_env.budget import METER_NAMES


def test_every_recipe_loads():
    assert {"laptop", "smollm2"} <= set(recipe_names())
    for name in recipe_names():
        assert isinstance(load_config(recipe=name), TrainConfig)
    laptop = load_config(recipe="laptop")
    assert laptop.model.name == "scratch" and laptop.imitation.episodes > 0


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"optim": {"stepz": 3}}, "unknown key 'stepz' in optim"),
        ({"optim": {"steps": "ten"}}, "optim.steps must be int"),
        ({"optim": {"steps": 0}}, "optim.steps must be >= 1"),
        ({"imitation": {"chunk_size": 0}}, "imitation.chunk_size must be >= 1"),
        ({"credit": {"rule": "coma"}}, "unknown credit rule 'coma'; valid names: reference"),
        ({"rollout": {"group_size": 1}}, "group_size must be >= 2"),
        ({"model": {"name": "scratch"}}, "finetune: full"),
        ({"eval": {"splits": ["val"]}}, "unknown split 'val'"),
        ({"loss": []}, "loss must be a mapping"),
        (
            {"model": {"name": "scratch", "finetune": "full", "init_adapter": "x"}},
            "init_adapter needs model.finetune: lora",
        ),
    ],
)
def test_bad_configs_name_the_key(data, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict(data)


def test_overrides_and_files(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("optim:\n  steps: 7\neval:\n  splits: [dev]\n")
    config = load_config(path, overrides=["optim.learning_rate=0.5", "eval.splits=[test]"])
    assert config.optim.steps == 7 and config.optim.learning_rate == 0.5
    assert config.eval.splits == ("test",)
    assert config_from_dict(config.to_dict()) == config
    with pytest.raises(ConfigError, match="not both"):
        load_config(path, recipe="laptop")
    with pytest.raises(ConfigError, match="missing.yaml: no such file"):
        load_config(tmp_path / "missing.yaml")
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(ConfigError, match="bad JSON"):
        load_config(tmp_path / "bad.json")


def config_keys(instance=None, prefix=""):
    instance = TrainConfig() if instance is None else instance
    for item in fields(instance):
        value = getattr(instance, item.name)
        if is_dataclass(value):
            yield from config_keys(value, f"{item.name}.")
        else:
            yield prefix + item.name


def test_describe_config_explains_every_key():
    text = describe_config()
    for key in config_keys():
        assert f"  {key} (default " in text, key


def tiny_config(out, steps=2, **changes):
    """A scratch model small enough to train in seconds on arithmetic with delegation."""
    data = {
        "out": str(out),
        "progress": False,
        "checkpoint_every": 1,
        "model": {
            "name": "scratch",
            "finetune": "full",
            "scratch_layers": 1,
            "scratch_width": 32,
            "scratch_heads": 2,
            "scratch_ffn": 64,
            "scratch_positions": 128,
            "tokenizer_vocab": 300,
            "tokenizer_episodes": 40,
            "num_threads": 1,
        },
        "env": {
            "args": {
                "min_operators": 3,
                "max_operators": 4,
                "min_operand_digits": 1,
                "max_operand_digits": 1,
                "operator_weights": {"+": 1, "-": 1},
                "paren_probability": 0.0,
                "spaced": False,
                "context_window": 120,
            },
            "prompts": {"root_system": "Delegate.", "clone_system": "Solve."},
        },
        "rollout": {"tasks_per_step": 2, "group_size": 2, "max_new_tokens": 40},
        "optim": {"steps": steps, "learning_rate": 0.001, "micro_batch_size": 4},
        "loss": {"kl_coef": 0.05},
        "imitation": {"episodes": 40, "epochs": 1, "micro_batch_size": 16, "parts": 2},
        "eval": {"every": 1, "episodes": 4, "splits": ["test"]},
    }
    for key, value in changes.items():
        section, _, leaf = key.partition(".")
        data[section][leaf] = value
    return config_from_dict(data)


def read_csv(path):
    with path.open() as handle:
        return list(csv.DictReader(handle))


def test_trainer_runs_logs_checkpoints_and_resumes(tmp_path):
    out = tmp_path / "run"
    result = GRPOTrainer(tiny_config(out)).run()
    assert (result.final / "model.safetensors").is_file()
    assert (result.final / "tokenizer.json").is_file() and (out / "tokenizer").is_dir()
    rows = read_csv(out / TRAIN_LOG)
    assert [int(r["step"]) for r in rows] == [1, 2]
    for name in METER_NAMES:
        assert f"{name}_mean" in rows[0]
    assert float(rows[0]["episodes"]) == 4 and float(rows[0]["gen_tokens_mean"]) > 0
    assert float(rows[0]["generate_s"]) > 0
    evals = read_csv(out / EVAL_LOG)
    assert [(r["phase"], r["step"]) for r in evals] == [
        ("init", "0"),
        ("imitation", "0"),
        ("grpo", "1"),
        ("grpo", "2"),
    ]
    checkpoints = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert checkpoints == ["step-000000", "step-000001", "step-000002"]
    saved = json.loads((out / "config.json").read_text())
    assert saved["optim"]["steps"] == 2

    # Rerunning with more steps resumes at step 3: nothing before it is played again.
    GRPOTrainer(tiny_config(out, steps=3)).run()
    again = read_csv(out / TRAIN_LOG)
    assert [int(r["step"]) for r in again] == [1, 2, 3]
    assert again[:2] == rows
    assert [r["phase"] for r in read_csv(out / EVAL_LOG)].count("init") == 1
    assert "step-000001" not in {p.name for p in (out / "checkpoints").iterdir()}  # keep 2

    with pytest.raises(ConfigError, match="another config"):
        GRPOTrainer(tiny_config(out, steps=3, **{"loss.kl_coef": 0.5})).run()


def test_eval_variants_log_accuracy_and_spawn_rate_of_each(tmp_path):
    """Every eval split is played on the training env and on each named variant (whose env
    arguments replace the training ones); an imitation of delegation only shows in the spawn
    rate, and a scripted delegator with leaf steps writes running totals in its clones."""
    from selfcest_env.agents.training.imitation import scripted_traces

    short = {"min_operators": 1, "max_operators": 1, "operator_weights": {"+": 1},
             "min_operand_digits": 1, "max_operand_digits": 1, "paren_probability": 0.0,
             "spaced": False, "context_window": 120}  # fmt: skip
    variants = {"short": short, "same": tiny_config(tmp_path).env.args}
    config = tiny_config(
        tmp_path / "run",
        steps=1,
        **{"eval.variants": variants, "imitation.episodes": 80, "imitation.epochs": 3},
    )
    trainer = GRPOTrainer(config)
    trainer.run()
    rows = read_csv(tmp_path / "run" / EVAL_LOG)
    assert [(r["phase"], r["variant"]) for r in rows[:3]] == [
        ("init", "train"), ("init", "short"), ("init", "same")
    ]  # fmt: skip
    assert len(rows) == 3 * 3
    for row in rows:
        assert 0.0 <= float(row["spawn_rate"]) <= 1.0
        spawned = float(row["clones_mean"]) > 0
        assert (float(row["spawn_rate"]) > 0) == spawned
        # Accuracy split by whether the episode spawned: empty where no episode did (or all
        # did); the two shares weighted by the spawn rate give the accuracy.
        rate = float(row["spawn_rate"])
        assert (row["spawned_accuracy"] == "") == (rate == 0.0)
        assert (row["alone_accuracy"] == "") == (rate == 1.0)
        parts = [
            (rate, row["spawned_accuracy"]),
            (1 - rate, row["alone_accuracy"]),
        ]
        mixed = sum(share * float(value) for share, value in parts if value != "")
        assert mixed == pytest.approx(float(row["accuracy"]), abs=1e-5)
    by_key = {(r["phase"], r["variant"]): r for r in rows}
    assert by_key[("grpo", "train")]["accuracy"] == by_key[("grpo", "same")]["accuracy"]
    assert float(read_csv(tmp_path / "run" / TRAIN_LOG)[0]["spawn_rate"]) >= 0.0
    make_env = trainer.make_env_factory("train", None, context_window=None)
    traces = scripted_traces(make_env, 4, parts=2, leaf_steps=True)
    clones = [c for trace in traces for c in trace.contexts if c.parent is not None]
    assert clones and all("=" in c.turns[0].text for c in clones)


def test_a_run_stopped_in_the_imitation_evaluation_resumes_after_imitation(tmp_path):
    """Checkpoint 0 is saved before the policy imitation gave is evaluated: a run stopped
    in that evaluation does not imitate again, and evaluates only what its log misses."""
    out = tmp_path / "run"
    variants = {"same": tiny_config(tmp_path).env.args}
    config = tiny_config(out, steps=1, **{"eval.variants": variants})
    GRPOTrainer(config).run()
    rows = read_csv(out / EVAL_LOG)
    assert [(r["phase"], r["variant"]) for r in rows[:4]] == [
        ("init", "train"), ("init", "same"), ("imitation", "train"), ("imitation", "same")
    ]  # fmt: skip
    # Cut the run where a kill in the imitation evaluation of variant 'same' leaves it.
    shutil.rmtree(out / "checkpoints" / "step-000001")
    shutil.rmtree(out / "final")
    start = (out / "checkpoints" / "step-000000").glob("*")
    weights = {p.name: p.read_bytes() for p in start if p.is_file()}
    with (out / EVAL_LOG).open("w", newline="") as handle:
        writer = csv.DictWriter(handle, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows[:3])
    (out / TRAIN_LOG).write_text((out / TRAIN_LOG).read_text().splitlines()[0] + "\n")

    GRPOTrainer(config).run()
    again = read_csv(out / EVAL_LOG)
    assert [(r["phase"], r["variant"]) for r in again] == [(r["phase"], r["variant"]) for r in rows]
    assert again[:3] == rows[:3]
    kept = (out / "checkpoints" / "step-000000").glob("*")
    assert {p.name: p.read_bytes() for p in kept if p.is_file()} == weights


def test_a_run_resumed_at_a_step_it_did_not_evaluate_evaluates_that_step(tmp_path):
    """Stopped after a checkpoint that was not an evaluation step and resumed with
    ``optim.steps`` cut to it, a run evaluates that last step before exporting (it is the
    end); resumed again, it plays nothing more."""
    out = tmp_path / "run"
    config = tiny_config(out, steps=3, **{"eval.every": 5, "imitation.episodes": 0})
    GRPOTrainer(config).run()
    rows = read_csv(out / EVAL_LOG)
    assert [(r["phase"], r["step"]) for r in rows] == [("init", "0"), ("grpo", "3")]
    # Where a stop during step 3 leaves the run: checkpoints 0-2, no step-3 rows.
    shutil.rmtree(out / "checkpoints" / "step-000003")
    shutil.rmtree(out / "final")
    for log, kept in ((out / EVAL_LOG, 2), (out / TRAIN_LOG, 3)):
        log.write_text("".join(log.read_text().splitlines(keepends=True)[:kept]))

    cut = tiny_config(out, steps=2, **{"eval.every": 5, "imitation.episodes": 0})
    GRPOTrainer(cut).run()
    evals = read_csv(out / EVAL_LOG)
    assert [(r["phase"], r["step"]) for r in evals] == [("init", "0"), ("grpo", "2")]
    assert [int(r["step"]) for r in read_csv(out / TRAIN_LOG)] == [1, 2]
    assert (out / "final").is_dir()
    GRPOTrainer(cut).run()
    assert read_csv(out / EVAL_LOG) == evals


def test_a_resumed_step_replays_exactly(tmp_path):
    """A run cut after step 1 and resumed logs the same step 2 as an uncut run."""
    whole = tmp_path / "whole"
    GRPOTrainer(tiny_config(whole, steps=2)).run()
    cut = tmp_path / "cut"
    GRPOTrainer(tiny_config(cut, steps=1)).run()
    GRPOTrainer(tiny_config(cut, steps=2)).run()
    keys = ("reward_mean", "accuracy", "gen_tokens_mean", "samples", "trainable_tokens")
    first, second = read_csv(whole / TRAIN_LOG)[1], read_csv(cut / TRAIN_LOG)[1]
    assert {k: first[k] for k in keys} == {k: second[k] for k in keys}


def test_root_and_clone_samples_share_one_update(tmp_path):
    """Samples of a root and its clones (scripted delegation, teacher-forced ids standing in
    for sampled ones) go into one optimiser step of the same weights."""
    import torch

    from selfcest_env.agents.training.credit import assign_advantages
    from selfcest_env.agents.training.grpo import collate, token_logprobs
    from selfcest_env.agents.training.imitation import imitation_samples, scripted_traces
    from selfcest_env.agents.training.update import grpo_update, trained_pairs

    trainer = GRPOTrainer(tiny_config(tmp_path / "run"))
    trainer._check_out_folder()
    trainer.policy = trainer._build()
    trainer.policy.freeze_reference()
    tokenizer = trainer.policy.tokenizer
    traces = scripted_traces(trainer.make_env_factory("train", tokenizer), 2, parts=2)
    samples = imitation_samples(traces, tokenizer)
    for sample in samples:  # the two rollouts are of one task (group 0), rewards 0 and 1
        sample.group, sample.root_reward = 0, float(sample.episode)
        sample.reward = sample.root_reward / 2.5
        with torch.no_grad():
            batch = collate([sample])
            logprobs = token_logprobs(trainer.policy.model, batch)[0]
        start = len(sample.prompt_ids) - 1
        sample.old_logprobs = logprobs[start : start + len(sample.response_ids)].tolist()
    advantages = assign_advantages(samples)
    assert {s.is_root for s, a in zip(samples, advantages) if a} == {True, False}
    before = {k: v.clone() for k, v in trainer.policy.trainable_state().items()}
    pairs = trained_pairs(samples, advantages, trainer.config)
    stats = grpo_update(trainer.policy, trainer.optimizer, pairs, trainer.config, step=1)
    trained = [s for s, a in zip(samples, advantages) if a]
    assert [s for s, _ in pairs] == trained
    assert stats.updates == 1
    assert stats.tokens == sum(s.trainable_tokens for s in trained)
    assert stats.clipped_tokens == 0  # ratio 1: old logprobs are the current policy's
    after = trainer.policy.trainable_state()
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_step_by_step_script_is_right_alone_and_cut_by_a_window():
    """The monolithic half of the laptop recipe's imitation data, played through the env."""
    import gymnasium as gym

    from selfcest_env.agents.training.imitation import scripted_traces

    def make_env(window, max_depth=0):
        return lambda: (
            gym.make(
                "SelfCest-Math-v0",
                split="train",
                min_operators=6,
                max_operators=6,
                min_operand_digits=1,
                max_operand_digits=1,
                operator_weights={"+": 1, "-": 1},
                paren_probability=0.0,
                context_window=window,
                max_new_tokens=None,
                max_depth=max_depth,
            ).unwrapped
        )

    free = scripted_traces(make_env(None), 5, parts=2, step_by_step_share=1.0)
    assert all(t.reward == 1.0 and len(t.contexts) == 1 for t in free)
    text = free[0].root.turns[0].text
    assert len(text.splitlines()) == 7 and text.splitlines()[-1].startswith("Answer: ")
    cut = scripted_traces(make_env(60), 5, parts=2, step_by_step_share=1.0)
    assert all(t.reward == 0.0 and t.meters["truncated_turns"] == 1 for t in cut)
    mixed = scripted_traces(make_env(None, 1), 4, parts=2, step_by_step_share=0.5)
    assert [len(t.contexts) > 1 for t in mixed] == [False, False, True, True]
    # More clones per call than the env starts: the extra ones would fail, so it is refused.
    with pytest.raises(ValueError, match="imitation.parts.*max_clones_per_call"):
        scripted_traces(make_env(None, 1), 4, parts=4)
    summed = scripted_traces(make_env(None, 1), 2, parts=3, leaf_steps=True, sum_steps=True)
    for trace in summed:
        assert trace.reward == 1.0 and len(trace.contexts) == 4
        assert trace.root.turns[-1].text.count("=") == 2  # three answers, two running totals


@pytest.mark.slow
@pytest.mark.parametrize(("reference", "zero_kl_at_start"), [("start", True), ("base", False)])
def test_lora_kl_reference_is_the_start_of_grpo_or_the_base(tmp_path, reference, zero_kl_at_start):
    """With ``kl_reference: start`` a LoRA policy is pulled towards the adapter as GRPO
    started (after imitation): before the first update the KL is 0, and after a resume the
    reference is still that adapter, not the resumed one; with ``base`` it is the model
    without adapters, which imitation has already moved away from. ``final/`` holds the
    trained adapter only."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from selfcest_env.agents.backends.default_model import default_model_dir
    from selfcest_env.agents.training.checkpoints import START, WEIGHTS
    from selfcest_env.agents.training.grpo import collate, token_logprobs
    from selfcest_env.agents.training.imitation import imitation_samples, scripted_traces
    from tests.small_models import small_llama

    # A small Llama saved as a model folder (LoRA needs a model that is not built from scratch).
    tokenizer = AutoTokenizer.from_pretrained(default_model_dir())
    small = small_llama(tokenizer, layers=1)
    folder = tmp_path / "small-llama"
    small.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    out = tmp_path / "run"
    changes = {
        "model.name": str(folder),
        "model.finetune": "lora",
        "model.lora_rank": 4,
        "env.args": {"min_operators": 1, "max_operators": 2, "context_window": None},
        "loss.kl_reference": reference,
        "loss.kl_coef": 0.5,
        "optim.skip_zero_advantage": False,  # the tiny model earns no reward: train on KL
        "imitation.learning_rate": 0.05,
    }
    GRPOTrainer(tiny_config(out, steps=1, **changes)).run()
    kl = float(read_csv(out / TRAIN_LOG)[0]["kl"])
    assert (kl == 0.0) if zero_kl_at_start else (kl > 1e-4), kl
    final = out / "final"
    assert (final / "adapter_model.safetensors").is_file()
    assert not (final / "reference").exists()
    if reference != "start":
        return
    # The tiny model earns no reward, so GRPO does not move it: move the adapter of checkpoint
    # 1 by hand, so that the resumed policy and the start of GRPO differ.
    from safetensors.torch import save_file

    moved = out / "checkpoints" / "step-000001" / WEIGHTS
    save_file({k: v + 0.05 for k, v in load_file(str(moved)).items()}, str(moved))
    trainer = GRPOTrainer(tiny_config(out, steps=2, **changes))
    trainer.run()  # resumes from step 1
    policy = trainer.policy
    traces = scripted_traces(trainer.make_env_factory("train", policy.tokenizer), 2, parts=2)
    batch = collate(imitation_samples(traces, policy.tokenizer)[:3], pad_id=0)
    reference_logps = policy.reference_logprobs(batch, 1.0)
    current = policy.trainable_state()
    policy.load_trainable_state(load_file(str(out / "checkpoints" / START / WEIGHTS)))
    with torch.no_grad():
        start_logps = token_logprobs(policy.model, batch)
    policy.load_trainable_state(current)
    with torch.no_grad():
        now_logps = token_logprobs(policy.model, batch)
    scored = batch.mask > 0
    assert torch.allclose(reference_logps[scored], start_logps[scored], atol=1e-5)
    assert not torch.allclose(now_logps[scored], start_logps[scored], atol=1e-5)


def test_kl_reference_base_needs_lora(tmp_path):
    with pytest.raises(ConfigError, match="kl_reference: base needs model.finetune: lora"):
        tiny_config(tmp_path, **{"loss.kl_reference": "base"})


def test_the_envs_of_one_factory_share_one_token_counter(tmp_path):
    """A Hugging Face counter reads the whole vocabulary once (its longest token bounds every
    cut); the trainer's factory builds it once, not once per episode."""
    from transformers import AutoTokenizer

    from selfcest_env.agents.backends.default_model import default_model_dir
    from selfcest_env.tokens import HFTokenCounter

    tokenizer = AutoTokenizer.from_pretrained(default_model_dir())
    make_env = GRPOTrainer(tiny_config(tmp_path / "run")).make_env_factory("train", tokenizer)
    first, second = make_env(), make_env()
    assert isinstance(first.counter, HFTokenCounter) and first.counter is second.counter
    assert first.counter.tokenizer is tokenizer


def test_every_play_closes_its_backend(tmp_path):
    """Each play (a step's rollouts, an evaluation) builds a backend over the live weights; it
    is closed when the play ends, so that engines and KV caches do not pile up until the garbage
    collector gets to them (a LoRA run on the default model grew past 24 GB in 12 plays)."""
    from selfcest_env.agents.backends.transformers_backend import TransformersBackend

    trainer = GRPOTrainer(tiny_config(tmp_path / "run", steps=1))
    trainer.run()
    model = trainer.policy.model
    live = [o for o in gc.get_objects() if isinstance(o, TransformersBackend) and o.model is model]
    assert live == []


def small_lora_run(tmp_path, name, steps=1, **changes):
    """A tiny LoRA run's config over a 1-layer Llama saved (once) as a model folder."""
    from transformers import AutoTokenizer

    from selfcest_env.agents.backends.default_model import default_model_dir
    from tests.small_models import small_llama

    folder = tmp_path / "small-llama"
    if not folder.exists():
        tokenizer = AutoTokenizer.from_pretrained(default_model_dir())
        small_llama(tokenizer, layers=1).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    settings = {
        "model.name": str(folder),
        "model.finetune": "lora",
        "model.lora_rank": 4,
        "env.args": {"min_operators": 1, "max_operators": 2, "context_window": None},
        "imitation.learning_rate": 0.05,
        **changes,
    }
    return tiny_config(tmp_path / name, steps=steps, **settings)


def adapter_weights(folder):
    """The saved adapter's tensors, named as the live policy names its trained adapter."""
    from safetensors.torch import load_file

    return {
        name.replace(".lora_A.", ".lora_A.default.").replace(".lora_B.", ".lora_B.default."): value
        for name, value in load_file(str(folder / "adapter_model.safetensors")).items()
    }


@pytest.mark.slow
def test_a_run_starts_from_a_saved_adapter_instead_of_imitating(tmp_path):
    """``model.init_adapter`` puts a saved adapter (a run's ``final/``) into the policy before
    the first evaluation: with no imitation, checkpoint 0 (the start of GRPO) is exactly that
    adapter, and the first evaluation scores it, not fresh LoRA weights."""
    import torch
    from safetensors.torch import load_file

    from selfcest_env.agents.training.checkpoints import START, WEIGHTS

    first = small_lora_run(tmp_path, "first")
    GRPOTrainer(first).run()
    final = tmp_path / "first" / "final"
    second = small_lora_run(
        tmp_path, "second", **{"model.init_adapter": str(final), "imitation.episodes": 0}
    )
    GRPOTrainer(second).run()
    start = load_file(str(tmp_path / "second" / "checkpoints" / START / WEIGHTS))
    saved = adapter_weights(final)
    assert set(start) == set(saved)
    assert all(torch.equal(start[name], saved[name]) for name in saved)
    # The B matrices of fresh LoRA weights are zero; these are not (imitation moved them).
    assert any(
        name.endswith("lora_B.default.weight") and saved[name].abs().sum() > 0 for name in saved
    )
    phases = [row["phase"] for row in read_csv(tmp_path / "second" / EVAL_LOG)]
    assert phases[0] == "init" and "imitation" not in phases


@pytest.mark.slow
@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model.lora_rank": 8}, "has r 4, the config 8; set model.lora_rank"),
        ({"model.lora_alpha": 7}, "has lora_alpha 32, the config 7"),
        ({"model.lora_targets": ["q_proj"]}, "set model.lora_targets to match"),
    ],
)
def test_an_adapter_that_does_not_fit_is_a_config_error(tmp_path, changes, message):
    first = small_lora_run(tmp_path, "first", **{"imitation.episodes": 0})
    GRPOTrainer(first).run()
    final = str(tmp_path / "first" / "final")
    config = small_lora_run(tmp_path, "second", **{"model.init_adapter": final, **changes})
    with pytest.raises(ConfigError, match=message):
        GRPOTrainer(config).run()


def test_init_adapter_names_a_folder_or_a_bundled_adapter(tmp_path):
    from selfcest_env.agents.trained_controller import BUNDLED_DELEGATE_ADAPTER, bundled_adapter_dir
    from selfcest_env.agents.training.policy import init_adapter_dir

    assert init_adapter_dir(str(tmp_path)) == tmp_path
    bundled = init_adapter_dir(BUNDLED_DELEGATE_ADAPTER)
    assert bundled == bundled_adapter_dir(BUNDLED_DELEGATE_ADAPTER)
    with pytest.raises(ValueError, match="neither a folder nor a bundled adapter"):
        init_adapter_dir("no-such-adapter")
    with pytest.raises(ValueError, match="neither a folder nor a bundled adapter"):
        init_adapter_dir(str(tmp_path / "missing"))


def test_the_depth2_recipes_teacher_fits_its_limits_and_nests_by_length():
    """The smollm2-depth2 warm start, played through its env with the default model's
    tokenizer: every delegated episode is right within the 128-token cap (none cut); short sums
    are worked out without a clone, 10-12-term sums with one level of clones and 22-24-term sums
    with two."""
    from transformers import AutoTokenizer

    from selfcest_env.agents.backends.default_model import default_model_dir
    from selfcest_env.agents.training.imitation import scripted_traces

    config = load_config(recipe="smollm2-depth2")
    section = config.imitation
    tokenizer = AutoTokenizer.from_pretrained(default_model_dir())
    make_env = GRPOTrainer(config).make_env_factory("train", tokenizer)
    traces = scripted_traces(
        make_env,
        36,
        section.parts,
        config.seed,
        0.0,
        section.leaf_steps,
        section.sum_steps,
        section.chunk_size,
        section.solve_up_to,
    )
    assert all(t.reward > 0 and t.meters["truncated_turns"] == 0 for t in traces)
    lengths = {0: {2, 3, 4}, 1: {10, 11, 12}, 2: {22, 23, 24}}
    seen = set()
    for trace in traces:
        terms = trace.root.objective.count("+") + 1
        assert terms in lengths[trace.meters["max_depth"]], (terms, trace.meters["max_depth"])
        seen.add(trace.meters["max_depth"])
    assert seen == {0, 1, 2}


def test_bf16_training_on_cpu_bounds_onednn_primitive_cache(tmp_path, monkeypatch):
    """bf16 passes build a oneDNN primitive per batch shape; the trainer caps the cache (a GRPO
    run grew to 14.7 GB without it) unless the user set the variable."""
    from selfcest_env.agents.training.trainer import ONEDNN_CACHE_CAPACITY

    variable = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
    monkeypatch.delenv(variable, raising=False)
    GRPOTrainer(tiny_config(tmp_path / "fp32"))._configure_cpu()
    assert variable not in os.environ
    GRPOTrainer(tiny_config(tmp_path / "bf16", **{"model.bf16": True}))._configure_cpu()
    assert os.environ[variable] == str(ONEDNN_CACHE_CAPACITY)
    monkeypatch.setenv(variable, "256")
    GRPOTrainer(tiny_config(tmp_path / "mine", **{"model.bf16": True}))._configure_cpu()
    assert os.environ[variable] == "256"


@pytest.mark.slow
def test_a_checkpoint_is_exported_as_an_adapter(tmp_path, capsys):
    """``selfcest train --export-step N --to DEST`` writes checkpoint N as final/ holds a run:
    the adapter (its weights those of the checkpoint) and the tokenizer; a step the run folder
    does not keep is a one-line error naming the steps it keeps."""
    import torch
    from safetensors.torch import load_file

    from selfcest_env.agents.training.checkpoints import START, WEIGHTS
    from tests.harness.test_cli import run_cli

    config = small_lora_run(tmp_path, "run", steps=2)
    GRPOTrainer(config).run()
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(config.to_dict()))
    dest = tmp_path / "start"
    assert (
        run_cli("train", "--config", str(config_file), "--export-step", "0", "--to", str(dest)) == 0
    )
    assert "checkpoint of step 0" in capsys.readouterr().out
    exported = adapter_weights(dest)
    start = load_file(str(tmp_path / "run" / "checkpoints" / START / WEIGHTS))
    assert set(exported) == set(start)
    assert all(torch.equal(exported[name], start[name]) for name in start)
    assert (dest / "tokenizer_config.json").is_file()
    saved = json.loads((dest / "adapter_config.json").read_text())
    assert saved["base_model_name_or_path"] == str(tmp_path / "small-llama")  # not the default
    code = run_cli("train", "--config", str(config_file), "--export-step", "7", "--to", str(dest))
    err = capsys.readouterr().err
    assert code == 2 and "has no checkpoint of step 7; it keeps steps: 0, 1, 2" in err
    assert run_cli("train", "--config", str(config_file), "--export-step", "0") == 2
    assert "--export-step and --to go together" in capsys.readouterr().err
    final = json.loads((tmp_path / "run" / "final" / "adapter_config.json").read_text())
    assert final["base_model_name_or_path"] == saved["base_model_name_or_path"]


@pytest.mark.slow
def test_an_adapter_of_the_default_model_names_the_model_not_a_local_path(tmp_path):
    """``final/`` and exported checkpoints of a default-model run load on any machine: their
    base model is the default model's name, not the folder it was loaded from here."""
    from selfcest_env.agents.backends.default_model import DEFAULT_MODEL_NAME

    trainer = GRPOTrainer(
        tiny_config(tmp_path / "run", **{"model.name": None, "model.finetune": "lora"})
    )
    assert trainer.config.model.name is None
    folder = trainer._export(trainer._build(), tmp_path / "adapter")
    saved = json.loads((folder / "adapter_config.json").read_text())
    assert saved["base_model_name_or_path"] == DEFAULT_MODEL_NAME
    assert (folder / "adapter_model.safetensors").is_file()


def test_micro_batches_bound_samples_and_padded_tokens():
    from selfcest_env.agents.training.samples import Sample
    from selfcest_env.agents.training.update import micro_batches

    def pair(length):
        sample = Sample(
            episode=0,
            group=0,
            context_id=0,
            parent_id=-1,
            root_id=0,
            depth=0,
            turn=None,
            prompt_ids=[1] * (length - 1),
            response_ids=[2],
            response_mask=[1],
            old_logprobs=[0.0],
            reward=1.0,
            root_reward=1.0,
        )
        return sample, 1.0

    lengths = [50, 10, 400, 30, 20, 60, 5000, 40]
    pairs = [pair(n) for n in lengths]
    unbounded = micro_batches(pairs, 3, None)
    assert [[len(s.prompt_ids) + 1 for s, _ in b] for b in unbounded] == [
        [10, 20, 30],
        [40, 50, 60],
        [400, 5000],
    ]
    bounded = micro_batches(pairs, 3, 120)
    for batch in bounded:
        longest = max(len(s.prompt_ids) + 1 for s, _ in batch)
        assert len(batch) <= 3 and (len(batch) * longest <= 120 or len(batch) == 1)
    assert sorted(len(s.prompt_ids) + 1 for b in bounded for s, _ in b) == sorted(lengths)
    assert [len(s.prompt_ids) + 1 for s, _ in bounded[-1]] == [5000]  # too long: alone
    assert micro_batches([], 4, 100) == []


def test_token_bounded_micro_batches_give_the_same_update(tmp_path):
    """Splitting an update's micro-batches by a token budget changes only the summation order
    of the accumulated gradient, not the step."""
    import torch

    from selfcest_env.agents.training.imitation import imitation_samples, scripted_traces
    from selfcest_env.agents.training.update import grpo_update

    results = []
    for budget in (None, 60):
        trainer = GRPOTrainer(
            tiny_config(tmp_path / f"run-{budget}", **{"optim.micro_batch_tokens": budget})
        )
        trainer._check_out_folder()
        torch.manual_seed(0)
        trainer.policy = trainer._build()
        trainer.policy.freeze_reference()
        tokenizer = trainer.policy.tokenizer
        traces = scripted_traces(trainer.make_env_factory("train", tokenizer), 3, parts=2)
        samples = imitation_samples(traces, tokenizer)
        for sample in samples:
            sample.old_logprobs = [0.0] * len(sample.response_ids)
        pairs = [(s, 1.0 if i % 2 else -1.0) for i, s in enumerate(samples)]
        grpo_update(trainer.policy, trainer.optimizer, pairs, trainer.config, step=1)
        results.append(trainer.policy.trainable_state())
    whole, split = results
    assert whole.keys() == split.keys()
    for key in whole:
        torch.testing.assert_close(whole[key], split[key], rtol=1e-4, atol=1e-6)
