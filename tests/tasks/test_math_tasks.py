"""Math task sources: arithmetic, Countdown, the dataset loaders and CHAMP."""

from __future__ import annotations

import ast
import json
import operator
import os
from collections import Counter
from pathlib import Path

import pytest

from selfcest_env.tasks.base import SPLITS, TaskInstance, TaskSource
from selfcest_env.tasks.math import ArithmeticConfig, ArithmeticTask, CountdownTask, grade_countdown
from selfcest_env.tasks.math.countdown import ExpressionError, evaluate_expression
from selfcest_env.tasks.math.datasets import (
    GSM8K_PATH_ENV,
    AIMETask,
    GSM8KTask,
    MATH500Task,
    MATHHardTask,
    MATHTask,
)
from selfcest_env.tasks.registry import make_source

REPO = Path(__file__).resolve().parents[2]
#: The real GSM8K test split: $SELFCEST_GSM8K_PATH, else the copy shipped beside this checkout.
GSM8K_FILE = Path(os.environ.get(GSM8K_PATH_ENV) or REPO / ".." / "shared/data/gsm8k/test.jsonl")

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _independent_eval(expr: str) -> int:
    """Evaluate with Python's own parser (a check independent of the generator's evaluator)."""

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        raise AssertionError(f"unexpected node {ast.dump(node)}")

    return ev(ast.parse(expr, mode="eval").body)


# --------------------------------------------------------------------------------------------
# Arithmetic
# --------------------------------------------------------------------------------------------


def test_arithmetic_is_a_task_source() -> None:
    task = ArithmeticTask()
    assert isinstance(task, TaskSource)
    assert task.name == "arithmetic" and task.domain == "math"
    assert all(task.size(s) is None for s in SPLITS)
    with pytest.raises(ValueError, match="unknown split"):
        task.get("validation", 0)
    with pytest.raises(IndexError):
        task.get("train", -1)


def test_arithmetic_deterministic_per_seed() -> None:
    a, b, c = ArithmeticTask(seed=3), ArithmeticTask(seed=3), ArithmeticTask(seed=4)
    for split in SPLITS:
        first = [a.get(split, i) for i in range(50)]
        assert first == [b.get(split, i) for i in range(50)]
        assert [x.prompt for x in first] != [c.get(split, i).prompt for i in range(50)]
    # Order of access does not matter.
    assert a.get("dev", 17) == ArithmeticTask(seed=3).get("dev", 17)


def test_arithmetic_prompt_answer_and_metadata() -> None:
    task = ArithmeticTask(seed=1)
    for i in range(300):
        inst = task.get("train", i)
        expr = inst.metadata["expression"]
        assert inst.prompt == f"Calculate the value of {expr}."
        assert inst.answer == str(_independent_eval(expr))
        assert inst.metadata["operators"] == sum(inst.metadata["operator_counts"].values())
        assert len(inst.metadata["operand_digits"]) == inst.metadata["operators"] + 1
        assert task.grade(inst, f"Answer: {inst.answer}").correct
        assert not task.grade(inst, f"Answer: {int(inst.answer) + 1}").correct


def test_arithmetic_splits_disjoint() -> None:
    task = ArithmeticTask(seed=0)
    other_seed = ArithmeticTask(seed=1)
    seen: dict[str, set[str]] = {}
    for split in SPLITS:
        exprs = {task.get(split, i).metadata["expression"] for i in range(2000)}
        exprs |= {other_seed.get(split, i).metadata["expression"] for i in range(500)}
        assert all(task.split_of_text(e) == split for e in exprs)
        seen[split] = exprs
    assert not seen["train"] & seen["dev"]
    assert not seen["train"] & seen["test"]
    assert not seen["dev"] & seen["test"]


def test_tiny_preset_splits_disjoint_on_a_small_space() -> None:
    task = ArithmeticTask(preset="tiny")
    by_split = {s: {task.get(s, i).prompt for i in range(400)} for s in SPLITS}
    assert not by_split["train"] & by_split["test"]
    assert not by_split["train"] & by_split["dev"]
    assert not by_split["dev"] & by_split["test"]
    # 9 * 9 * 2 expressions in all, so 400 draws hit most of each split's share.
    assert sum(len(v) for v in by_split.values()) > 100


def test_arithmetic_statistics_match_reference_config() -> None:
    cfg = ArithmeticConfig.preset("reference")
    task = ArithmeticTask(cfg, seed=7)
    n = 3000
    items = [task.get("train", i) for i in range(n)]
    bound = 10**cfg.max_result_digits
    op_counts: Counter[int] = Counter()
    digits: Counter[int] = Counter()
    with_parens = 0
    for inst in items:
        m = inst.metadata
        assert cfg.min_operators <= m["operators"] <= cfg.max_operators
        assert all(
            cfg.min_operand_digits <= d <= cfg.max_operand_digits for d in m["operand_digits"]
        )
        assert abs(int(inst.answer)) < bound
        assert 0 <= m["paren_pairs"] <= cfg.max_paren_pairs
        op_counts[m["operators"]] += 1
        digits.update(m["operand_digits"])
        with_parens += m["paren_pairs"] > 0
    assert set(op_counts) == set(range(cfg.min_operators, cfg.max_operators + 1))
    assert set(digits) == set(range(cfg.min_operand_digits, cfg.max_operand_digits + 1))
    # Parentheses are drawn with probability 0.55 (the result bound moves this a little).
    assert 0.45 < with_parens / n < 0.65


def test_arithmetic_operator_frequencies_follow_weights() -> None:
    # Without the result bound nothing is redrawn for size, so frequencies follow the weights
    # (the bound makes long chains of '*' rarer; see the module docstring).
    task = ArithmeticTask(seed=11, max_result_digits=None)
    counts: Counter[str] = Counter()
    pairs = wide = 0
    n = 3000
    for i in range(n):
        m = task.get("train", i).metadata
        counts.update(m["operator_counts"])
        pairs += m["paren_pairs"]
        wide += m["wide_spans"]
    total = sum(counts.values())
    for op, w in {"+": 4, "-": 3, "*": 6}.items():
        assert abs(counts[op] / total - w / 13) < 0.02, (op, counts)
    assert 0.1 < wide / max(pairs, 1) < 0.3  # wide spans: 0.22 of the pairs (some do not fit)


def test_arithmetic_wide_spans_and_parens_are_valid() -> None:
    task = ArithmeticTask(seed=2, paren_probability=1.0, wide_span_probability=1.0)
    for i in range(200):
        inst = task.get("test", i)
        expr = inst.metadata["expression"]
        assert expr.count("(") == expr.count(")") == inst.metadata["paren_pairs"]
        assert inst.answer == str(_independent_eval(expr))


@pytest.mark.parametrize(
    "preset", ["tiny", "easy", "medium", "reference", "long-sum", "longer-sum"]
)
def test_presets(preset: str) -> None:
    cfg = ArithmeticConfig.preset(preset)
    task = ArithmeticTask(preset=preset)
    for i in range(200):
        inst = task.get("train", i)
        m = inst.metadata
        assert m["preset"] == preset
        assert cfg.min_operators <= m["operators"] <= cfg.max_operators
        assert max(m["operand_digits"]) <= cfg.max_operand_digits
        used = {op for op, c in m["operator_counts"].items() if c}
        assert used <= {op for op, w in cfg.operator_weights.items() if w > 0}
        assert inst.answer == str(_independent_eval(m["expression"]))
    if preset == "tiny":
        assert all(task.get("dev", i).metadata["operators"] == 1 for i in range(50))
    if preset in ("tiny", "easy", "long-sum", "longer-sum"):
        assert all("(" not in task.get("dev", i).prompt for i in range(50))
    if preset.endswith("-sum"):  # single digits, + only, a fixed length
        digits = {"long-sum": 16, "longer-sum": 24}[preset]
        for i in range(50):
            expression = task.get("test", i).metadata["expression"]
            terms = expression.replace(" ", "").split("+")
            assert len(terms) == digits and all(len(t) == 1 and t != "0" for t in terms)


def test_arithmetic_config_errors_and_overrides() -> None:
    assert ArithmeticConfig.presets() == (
        "reference", "medium", "easy", "tiny", "long-sum", "longer-sum"
    )  # fmt: skip
    with pytest.raises(ValueError, match="unknown arithmetic preset"):
        ArithmeticConfig.preset("hard")
    with pytest.raises(ValueError, match="unknown operators"):
        ArithmeticConfig(operator_weights={"/": 1})
    with pytest.raises(ValueError, match="min_operators"):
        ArithmeticConfig(min_operators=5, max_operators=3)
    with pytest.raises(ValueError, match="paren_probability"):
        ArithmeticConfig(paren_probability=1.5)
    with pytest.raises(TypeError, match="unknown ArithmeticConfig field"):
        ArithmeticTask(max_ops=3)
    with pytest.raises(ValueError, match="not both"):
        ArithmeticTask(ArithmeticConfig(), preset="easy")
    task = ArithmeticTask(preset="easy", max_operators=1)
    assert task.config.preset_name == "easy" and task.config.max_operators == 1
    assert ArithmeticConfig() == ArithmeticConfig.preset("reference")
    assert hash(ArithmeticConfig.preset("tiny")) == hash(ArithmeticConfig.preset("tiny"))
    cfg = ArithmeticConfig.preset("medium")
    assert ArithmeticConfig(**json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_arithmetic_impossible_config_fails_clearly() -> None:
    task = ArithmeticTask(
        preset="tiny", max_result_digits=1, max_attempts=50, split_weights=(1, 0, 1)
    )
    with pytest.raises(ValueError, match="weight 0"):
        task.get("dev", 0)
    tiny = ArithmeticTask(
        preset="tiny", operator_weights={"*": 1}, max_result_digits=1, max_attempts=3
    )
    with pytest.raises(RuntimeError, match="max_attempts"):
        for i in range(200):
            tiny.get("test", i)


def test_arithmetic_grading_forms() -> None:
    task = ArithmeticTask()
    inst = TaskInstance(task_id="x", prompt="", answer="-1234567")
    for reply in ["Answer: -1,234,567", "\\boxed{-1234567}", "-1234567.0", "so it is -1234567."]:
        assert task.grade(inst, reply).correct, reply
    for reply in ["Answer: 1234567", "Answer: -1234567.5", "nothing"]:
        assert not task.grade(inst, reply).correct, reply


# --------------------------------------------------------------------------------------------
# Countdown
# --------------------------------------------------------------------------------------------


def test_countdown_solvable_deterministic_disjoint() -> None:
    task = CountdownTask(seed=5)
    assert task.name == "countdown" and task.size("train") is None
    keys: dict[str, set[tuple[tuple[int, ...], int]]] = {}
    for split in SPLITS:
        items = [task.get(split, i) for i in range(150)]
        assert items[:5] == [CountdownTask(seed=5).get(split, i) for i in range(5)]
        for inst in items:
            nums, target = inst.metadata["numbers"], inst.metadata["target"]
            assert len(nums) == 4 and all(1 <= n <= 99 for n in nums)
            assert 10 <= target <= 100
            assert task.grade(inst, f"Answer: {inst.answer}").correct, inst
            assert f"[{', '.join(map(str, nums))}]" in inst.prompt and str(target) in inst.prompt
        keys[split] = {(tuple(sorted(x.metadata["numbers"])), x.metadata["target"]) for x in items}
    assert not keys["train"] & keys["test"] and not keys["train"] & keys["dev"]
    assert not keys["dev"] & keys["test"]


@pytest.mark.parametrize(
    ("reply", "ok"),
    [
        ("Answer: (3 + 5) * 2 - 1", True),
        ("Answer: 2 * (5 + 3) - 1 = 15", True),
        ("Answer: 15 = (3 + 5) * 2 - 1", True),
        ("Answer: \\boxed{(3+5) \\times 2 - 1}", True),
        ("Answer: (3 + 5) x 2 - 1", True),
        ("Answer: (5 - 1) * 3 + 2 + 1", False),  # uses 1 twice, 2 once
        ("Answer: (3 + 5) * 2", False),  # 1 not used
        ("Answer: (3 + 5) * 2 - 1 + 0", False),  # extra number
        ("Answer: (3 + 5) * 2 + 1", False),  # wrong value
        ("Answer: __import__('os')", False),
        ("Answer: 3 / (5 - 5)", False),
        ("Answer: ((3 + 5) * 2 - 1", False),
        ("", False),
    ],
)
def test_grade_countdown(reply: str, ok: bool) -> None:
    assert grade_countdown(reply, [3, 5, 2, 1], 15).correct is ok


def test_countdown_division_and_evaluator() -> None:
    assert grade_countdown("Answer: 6 / (1 - 3/4)", [6, 1, 3, 4], 24).correct
    value, used = evaluate_expression("-(2 + 3) * 4 ÷ 2")
    assert value == -10 and used == [2, 3, 4, 2]
    for bad in ["2 ** 3", "abs(3)", "1" * 600, "", "2 +"]:
        with pytest.raises(ExpressionError):
            evaluate_expression(bad)


def test_countdown_config() -> None:
    task = CountdownTask(n_numbers=3, max_target=50)
    inst = task.get("train", 0)
    assert len(inst.metadata["numbers"]) == 3 and inst.metadata["target"] <= 50
    with pytest.raises(TypeError, match="unknown CountdownConfig field"):
        CountdownTask(numbers=3)
    with pytest.raises(ValueError, match="operators"):
        CountdownTask(operators="+^")
    free = CountdownTask(integer_intermediates=False, seed=1)
    for i in range(20):
        inst = free.get("dev", i)
        assert free.grade(inst, f"Answer: {inst.answer}").correct


# --------------------------------------------------------------------------------------------
# Dataset loaders
# --------------------------------------------------------------------------------------------


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.mark.skipif(
    not GSM8K_FILE.exists(),
    reason=f"the GSM8K test file is not at {GSM8K_FILE}; set {GSM8K_PATH_ENV} to a copy",
)
def test_gsm8k_real_test_split_all_gold_correct() -> None:
    task = GSM8KTask(path=GSM8K_FILE)
    assert task.size("test") == 1319
    raw = [json.loads(line) for line in GSM8K_FILE.read_text(encoding="utf-8").splitlines()]
    for i, row in enumerate(raw):
        inst = task.get("test", i)
        assert inst.prompt == row["question"].strip()
        assert task.grade(inst, f"Answer: {inst.answer}").correct, inst.task_id
        # The reference solution itself ends in '#### n' and must grade as correct too.
        assert task.grade(inst, row["answer"]).correct, inst.task_id
    assert not task.grade(task.get("test", 0), "Answer: 17").correct
    with pytest.raises(ValueError, match="no 'train' split"):
        task.get("train", 0)


def test_gsm8k_local_train_dev_carved(tmp_path: Path) -> None:
    rows = [
        {"question": f"What is {i} * 99?", "answer": f"{i}*99={i * 99}\n#### {i * 99:,}"}
        for i in range(200)
    ]
    _write_jsonl(tmp_path / "train.jsonl", rows)
    _write_jsonl(tmp_path / "test.jsonl", rows[:10])
    task = make_source(
        "gsm8k",
        path={"train": tmp_path / "train.jsonl", "test": tmp_path / "test.jsonl"},
        dev_fraction=0.2,
    )
    n_train, n_dev = task.size("train"), task.size("dev")
    assert n_train + n_dev == 200 and 20 < n_dev < 60
    train_q = {task.get("train", i).prompt for i in range(n_train)}
    dev_q = {task.get("dev", i).prompt for i in range(n_dev)}
    assert not train_q & dev_q
    again = GSM8KTask(path={"train": tmp_path / "train.jsonl"}, dev_fraction=0.2)
    assert {again.get("dev", i).prompt for i in range(again.size("dev"))} == dev_q
    big = next(
        task.get("train", i) for i in range(n_train) if int(task.get("train", i).answer) >= 1000
    )
    assert "," not in big.answer
    assert task.grade(big, f"Answer: {int(big.answer):,}").correct
    assert GSM8KTask(path=tmp_path / "test.jsonl", limit=3).size("test") == 3


def _math_rows() -> list[dict]:
    return [
        {
            "problem": "Compute $\\frac{1}{2}+\\frac{1}{4}$.",
            "solution": "We get $\\frac{2}{4}+\\frac{1}{4}=\\boxed{\\frac{3}{4}}$.",
            "level": "Level 2",
            "type": "Prealgebra",
        },
        {
            "problem": "Solve $x^2=4$ for $x>0$.",
            "solution": "So $x=\\boxed{2}$.",
            "level": "Level 5",
            "type": "Algebra",
        },
        {
            "problem": "Find the interval.",
            "solution": "Not $\\boxed{(1,2)}$ nor $\\boxed{\\text{no}}$: $\\boxed{(1, \\infty)}$",
            "level": "Level 5",
            "type": "Intermediate Algebra",
        },
        {
            "problem": "No box here.",
            "solution": "The answer is 3.",
            "level": "Level 1",
            "type": "Algebra",
        },
    ]


def test_math_loader_local_files(tmp_path: Path) -> None:
    _write_jsonl(tmp_path / "math_test.jsonl", _math_rows())
    task = MATHTask(path=tmp_path / "math_test.jsonl")
    assert task.size("test") == 3  # the row without a box is skipped
    first = task.get("test", 0)
    assert first.answer == "\\frac{3}{4}"
    assert first.metadata["level"] == 2 and first.metadata["subject"] == "Prealgebra"
    assert task.get("test", 2).answer == "(1, \\infty)"  # the last box
    assert task.grade(first, "Answer: 0.75").correct
    assert task.grade(first, "so the answer is $\\boxed{\\dfrac{3}{4}}$").correct
    assert not task.grade(first, "Answer: 3/5").correct
    hard = MATHHardTask(path=tmp_path / "math_test.jsonl")
    assert hard.size("test") == 2 and all(
        hard.get("test", i).metadata["level"] == 5 for i in range(2)
    )
    algebra = MATHTask(path=tmp_path / "math_test.jsonl", subjects=["algebra"])
    assert algebra.size("test") == 1
    with pytest.raises(ValueError, match="unknown MATH subjects"):
        MATHTask(subjects=["calculus"])


def test_math500_loader_parquet(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {
            "problem": "What is $2^{10}$?",
            "solution": "... $\\boxed{1024}$",
            "answer": "1024",
            "subject": "Algebra",
            "level": 1,
            "unique_id": "test/algebra/1.json",
        },
        {
            "problem": "Simplify $\\sqrt{12}$.",
            "solution": "... $\\boxed{2\\sqrt{3}}$",
            "answer": "2\\sqrt{3}",
            "subject": "Prealgebra",
            "level": 3,
            "unique_id": "test/prealgebra/7.json",
        },
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "test-00000.parquet")
    task = make_source("MATH-500", path=tmp_path)
    assert isinstance(task, MATH500Task) and task.size("test") == 2
    inst = task.get("test", 1)
    assert inst.answer == "2\\sqrt{3}" and inst.metadata["unique_id"] == "test/prealgebra/7.json"
    assert inst.metadata["level"] == 3 and inst.metadata["subject"] == "Prealgebra"
    assert task.grade(inst, "Answer: \\sqrt{12}").correct
    assert task.grade(task.get("test", 0), "Answer: 1,024").correct
    assert not task.grade(inst, "Answer: 3\\sqrt{2}").correct


def test_aime_loader(tmp_path: Path) -> None:
    rows = [
        {
            "id": 60,
            "problem": "Find the remainder ...",
            "answer": "033",
            "url": "https://x/2024_AIME_I_Problems/Problem_1",
        },
        {
            "id": 61,
            "problem": "How many ...",
            "answer": "204",
            "url": "https://x/2023_AIME_II_Problems/Problem_2",
        },
    ]
    _write_jsonl(tmp_path / "aime.jsonl", rows)
    task = AIMETask(path=tmp_path / "aime.jsonl")
    assert task.size("test") == 2
    inst = task.get("test", 0)
    assert inst.answer == "33" and inst.metadata["year"] == 2024 and inst.metadata["id"] == "60"
    assert task.grade(inst, "Answer: 033").correct and task.grade(inst, "\\boxed{33}").correct
    assert not task.grade(inst, "Answer: 34").correct
    only_2023 = AIMETask(path=tmp_path / "aime.jsonl", years=[2023])
    assert only_2023.size("test") == 1 and only_2023.get("test", 0).answer == "204"
    with_year = _write_jsonl(
        tmp_path / "aime25.jsonl", [{"question": "Q", "answer": "7", "year": 2025}]
    )
    assert AIMETask(path=with_year).get("test", 0).metadata["year"] == 2025


def test_loader_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        GSM8KTask(path=tmp_path / "missing.jsonl").size("test")
    (tmp_path / "data.txt").write_text("x")
    with pytest.raises(ValueError, match="format"):
        GSM8KTask(path=tmp_path / "data.txt").size("test")
    with pytest.raises(ValueError, match="not both"):
        GSM8KTask(path="a.jsonl", hub_id="openai/gsm8k")
    with pytest.raises(ValueError, match="split_map"):
        GSM8KTask(split_map={"validation": "x"})


def test_gsm8k_env_var_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = _write_jsonl(tmp_path / "mini.jsonl", [{"question": "1+1?", "answer": "#### 2"}])
    monkeypatch.setenv(GSM8K_PATH_ENV, str(f))
    task = GSM8KTask()
    assert task.resolve_location() == {"path": str(f)}
    assert task.size("test") == 1 and task.get("test", 0).answer == "2"
    other = _write_jsonl(tmp_path / "other.jsonl", [{"question": "2+2?", "answer": "#### 4"}])
    assert GSM8KTask(path=other).get("test", 0).answer == "4"  # path= wins over the variable


def test_hub_defaults_are_real_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(GSM8K_PATH_ENV, raising=False)
    # No local default: without path=, hub_id= or the variable, GSM8K comes from the hub.
    assert GSM8KTask().resolve_location() == {"hub_id": "openai/gsm8k", "hub_config": "main"}
    assert MATHTask().resolve_location()["hub_id"] == "EleutherAI/hendrycks_math"
    assert MATH500Task().resolve_location()["hub_id"] == "HuggingFaceH4/MATH-500"
    assert AIMETask().resolve_location()["hub_id"] == "AI-MO/aimo-validation-aime"
    assert GSM8KTask(hub_id="openai/gsm8k").resolve_location() == {
        "hub_id": "openai/gsm8k",
        "hub_config": None,
    }


# --------------------------------------------------------------------------------------------
# CHAMP
# --------------------------------------------------------------------------------------------


def test_champ_offline() -> None:
    task = make_source("champ")
    assert task.size("test") == 270 and task.size("train") == 0
    categories = Counter(task.get("test", i).metadata["category"] for i in range(270))
    assert categories["Number-Theory"] == 80 and len(categories) == 5
    for i in range(270):
        inst = task.get("test", i)
        assert task.grade(inst, f"Answer: {inst.metadata['raw_answer']}").correct, inst.task_id
    inst = next(task.get("test", i) for i in range(270) if task.get("test", i).aliases)
    assert task.grade(inst, f"Answer: {inst.aliases[0]}").correct
    numeric = next(task.get("test", i) for i in range(270) if task.get("test", i).answer == "89")
    assert not task.grade(numeric, "Answer: 90").correct
    split = make_source("champ", dev_fraction=0.25)
    assert split.size("dev") + split.size("test") == 270 and 30 < split.size("dev") < 110


def test_split_map_never_duplicates_a_split(tmp_path: Path) -> None:
    f = _write_jsonl(tmp_path / "rows.jsonl", [{"problem": "Q", "answer": "1"}])
    task = AIMETask(path={"train": f}, split_map={"test": "train"})
    assert task.available_splits() == ("test",)
    with pytest.raises(ValueError, match="has no 'train' split"):
        task.get("train", 0)
    with pytest.raises(ValueError, match="lacks"):
        AIMETask(path={"train": f}, split_map={"test": "validation"}).size("test")


def test_sources_pickle(tmp_path: Path) -> None:
    import pickle

    f = _write_jsonl(tmp_path / "test.jsonl", [{"question": "1+1?", "answer": "#### 2"}])
    gsm = GSM8KTask(path=f)
    gsm.size("test")
    for src in (ArithmeticTask(preset="easy", seed=4), CountdownTask(seed=2), gsm):
        clone = pickle.loads(pickle.dumps(src))
        assert clone.get("test", 0) == src.get("test", 0)


def test_math_hub_loads_every_subject_config(monkeypatch: pytest.MonkeyPatch) -> None:
    from selfcest_env.tasks.math import datasets as loaders

    calls: list[tuple[str, str | None]] = []

    def fake_load_hub_rows(
        hub_id: str, hub_config: str | None = None, **kwargs: object
    ) -> dict[str, list[dict]]:
        calls.append((hub_id, hub_config))
        subject = str(hub_config).replace("_", " ").title()
        row = {
            "problem": f"P {subject}",
            "solution": "\\boxed{1}",
            "level": "Level 5",
            "type": subject,
        }
        return {"train": [row] * 10, "test": [row]}

    monkeypatch.setattr(loaders, "load_hub_rows", fake_load_hub_rows)
    task = MATHTask(subjects=["algebra", "number_theory"], dev_fraction=0.0)
    assert task.size("test") == 2 and task.size("train") == 20
    assert calls == [
        ("EleutherAI/hendrycks_math", "algebra"),
        ("EleutherAI/hendrycks_math", "number_theory"),
    ]


def test_hub_failure_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets as hf_datasets

    def offline(*args: object, **kwargs: object) -> None:
        raise ConnectionError("no network")

    monkeypatch.setattr(hf_datasets, "load_dataset", offline)
    with pytest.raises(RuntimeError, match="pass path="):
        MATH500Task().size("test")


def test_arithmetic_operator_counts_mix_short_and_long() -> None:
    task = ArithmeticTask(preset="easy", operator_counts=(1, 2, 12, 13), max_result_digits=None)
    counts = Counter(task.get("train", i).metadata["operators"] for i in range(800))
    assert set(counts) == {1, 2, 12, 13}
    assert all(150 < c < 250 for c in counts.values()), counts  # uniform over the four
    cfg = task.config
    assert ArithmeticConfig(**json.loads(json.dumps(cfg.to_dict()))) == cfg
    for bad in ((), (0, 3), (-1,)):
        with pytest.raises(ValueError, match="operator_counts"):
            ArithmeticConfig(operator_counts=bad)


def test_countdown_apr_prompt_style_is_aprs_search_state_line() -> None:
    from selfcest_env.tasks.math.countdown import CountdownConfig, CountdownTask

    plain, apr = CountdownTask(seed=3), CountdownTask(seed=3, prompt_style="apr")
    for i in range(20):
        a, b = plain.get("test", i), apr.get("test", i)
        assert a.metadata == b.metadata  # the same problems, put another way
        numbers, target = b.metadata["numbers"], b.metadata["target"]
        listed = ", ".join(map(str, numbers))
        assert b.prompt == f"Moving to Node #0\nCurrent State: {target}:[{listed}], Operations: []"
    with pytest.raises(ValueError, match="prompt_style must be one of"):
        CountdownConfig(prompt_style="chat")
