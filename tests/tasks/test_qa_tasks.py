"""QA task sources: the synthetic multi-hop generator and the dataset loaders."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from selfcest_env.tasks.base import SPLITS, TaskInstance, TaskSource
from selfcest_env.tasks.qa import HotpotQATask, MuSiQueTask, TwoWikiMultihopQATask
from selfcest_env.tasks.qa.synthetic import TYPE_HOPS, SyntheticQAConfig, SyntheticQATask
from selfcest_env.tasks.qa.synthetic.reader import parse_paragraph, solve
from selfcest_env.tasks.registry import make_source
from selfcest_env.tokens import OfflineTokenCounter

COMBOS = [(t, h) for t, hops in TYPE_HOPS.items() for h in hops]


def _supporting(inst: TaskInstance) -> dict[str, str]:
    keys = set(inst.metadata["supporting_keys"])
    return {c.key: c.text for c in inst.context if c.key in keys}


def _total_tokens(inst: TaskInstance) -> int:
    counter = OfflineTokenCounter()
    return sum(counter.count_text(c.key) + counter.count_text(c.text) for c in inst.context)


# -- synthetic: configuration -------------------------------------------------------------------


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="hops"):
        SyntheticQAConfig(hops=(5,))
    with pytest.raises(ValueError, match="unknown question types"):
        SyntheticQAConfig(question_types=("riddle",))
    with pytest.raises(ValueError, match="supports hops"):
        SyntheticQAConfig(question_types=("bridge_comparison",), hops=(2,))
    with pytest.raises(ValueError, match="context_tokens"):
        SyntheticQAConfig(context_tokens=10)
    with pytest.raises(TypeError, match="unknown SyntheticQAConfig fields"):
        SyntheticQATask(colour="red")
    assert SyntheticQAConfig(hops=3, question_types="inference").combos() == [("inference", 3)]
    with pytest.raises(ValueError, match="no question type among .* supports hops"):
        SyntheticQAConfig(question_types=("inference",), hops=(1,))


def test_presets() -> None:
    assert SyntheticQAConfig.presets() == ("default", "easy")
    assert SyntheticQATask(preset="default").config == SyntheticQATask().config
    easy = SyntheticQATask(preset="easy", seed=2)
    assert easy.config.seed == 2 and easy.config.preset_name == "easy"
    for index in range(30):
        inst = easy.get("test", index)
        assert (inst.metadata["type"], inst.metadata["hops"]) == ("compositional", 1)
        assert easy.grade(inst, f"It is {inst.answer}, as the paragraph says.").correct
        (paragraph,) = inst.context  # the one supporting paragraph, no distractor
        answer = solve(inst.prompt, {paragraph.key: paragraph.text})
        assert easy.grade(inst, answer or "").correct
    assert (
        make_source("synthetic", preset="easy", num_distractors=1)
        .get("test", 0)
        .metadata["num_paragraphs"]
        == 2
    )
    with pytest.raises(ValueError, match="choose one of default, easy"):
        SyntheticQATask(preset="hard")
    assert not SyntheticQATask().grade(inst, f"It is {inst.answer}, as the paragraph says.").correct
    with pytest.raises(ValueError, match="match must be one of exact, contains"):
        SyntheticQAConfig(match="fuzzy")
    with pytest.raises(ValueError, match="either config= or preset="):
        SyntheticQATask(SyntheticQAConfig(), preset="easy")


def test_source_protocol() -> None:
    task = SyntheticQATask()
    assert isinstance(task, TaskSource)
    assert (task.name, task.domain) == ("synthetic", "qa")
    assert all(task.size(s) is None for s in SPLITS)
    with pytest.raises(ValueError, match="unknown split"):
        task.get("validation", 0)
    with pytest.raises(IndexError):
        task.get("train", -1)


# -- synthetic: answerability -----------------------------------------------------------------


@pytest.mark.parametrize(("qtype", "hops"), COMBOS)
def test_scripted_solver_answers_from_supporting_paragraphs(qtype: str, hops: int) -> None:
    task = SyntheticQATask(question_types=(qtype,), hops=(hops,), num_distractors=0, seed=7)
    for i in range(300):
        inst = task.get(SPLITS[i % 3], i)
        assert inst.metadata["type"] == qtype and inst.metadata["hops"] == hops
        assert len(inst.metadata["supporting_keys"]) == hops
        answer = solve(inst.prompt, _supporting(inst))
        assert answer is not None, (inst.prompt, _supporting(inst))
        assert task.grade(inst, answer).correct, (inst.prompt, inst.answer, answer)


@pytest.mark.parametrize(("qtype", "hops"), COMBOS)
def test_every_supporting_paragraph_is_needed(qtype: str, hops: int) -> None:
    task = SyntheticQATask(question_types=(qtype,), hops=(hops,), num_distractors=0, seed=3)
    for i in range(30):
        inst = task.get("test", i)
        paras = _supporting(inst)
        for key in paras:
            partial = {k: v for k, v in paras.items() if k != key}
            answer = solve(inst.prompt, partial)
            assert answer is None or not task.grade(inst, answer).correct, (inst.prompt, key)


def test_solver_is_not_confused_by_distractors() -> None:
    task = SyntheticQATask(num_distractors=30, seed=11)
    for i in range(150):
        inst = task.get("train", i)
        answer = solve(inst.prompt, {c.key: c.text for c in inst.context})
        assert answer is not None and task.grade(inst, answer).correct, inst.prompt


def test_paragraphs_state_their_facts() -> None:
    facts = parse_paragraph(
        "Ana Lisk (born 1952) is a film director. She was born in Velmora. "
        "She is the daughter of Oren Lisk and his wife Mira Tall."
    )
    assert facts == {
        "birth_year": "1952",
        "birthplace": "Velmora",
        "father": "Oren Lisk",
        "mother": "Mira Tall",
    }


# -- synthetic: instances -----------------------------------------------------------------------


def test_instance_shape_and_metadata() -> None:
    task = SyntheticQATask(num_distractors=6)
    firsts = set()
    for i in range(40):
        inst = task.get("dev", i)
        keys = [c.key for c in inst.context]
        assert len(keys) == len(set(keys)) == inst.metadata["hops"] + 6
        assert set(inst.metadata["supporting_keys"]) <= set(keys)
        assert inst.metadata["context_tokens"] == _total_tokens(inst)
        assert inst.prompt.endswith("?") and "\n" not in inst.prompt
        assert inst.task_id == f"synthetic-dev-{i}"
        assert all(c.text and c.key in c.text for c in inst.context)
        firsts.add(keys[0] in inst.metadata["supporting_keys"])
    assert firsts == {True, False}  # the context is shuffled


def test_deterministic_per_seed_split_index() -> None:
    a, b = SyntheticQATask(seed=5), SyntheticQATask(seed=5)
    assert a.get("train", 12) == b.get("train", 12)
    assert a.get("train", 12) != a.get("train", 13)
    assert a.get("train", 12) != SyntheticQATask(seed=6).get("train", 12)
    assert a.get("train", 12).prompt != a.get("test", 12).prompt


def test_deterministic_across_processes() -> None:
    code = (
        "from selfcest_env.tasks.qa import SyntheticQATask;"
        "i = SyntheticQATask(seed=2).get('test', 9);"
        "print(repr((i.prompt, i.answer, [c.key for c in i.context])))"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
        ).stdout
        for seed in ("1", "2")
    }
    inst = SyntheticQATask(seed=2).get("test", 9)
    assert outs == {repr((inst.prompt, inst.answer, [c.key for c in inst.context])) + "\n"}


def test_splits_share_no_entity() -> None:
    task = SyntheticQATask(num_distractors=10)
    titles = {s: {c.key for i in range(60) for c in task.get(s, i).context} for s in SPLITS}
    prompts = {s: {task.get(s, i).prompt for i in range(60)} for s in SPLITS}
    for x, y in (("train", "dev"), ("train", "test"), ("dev", "test")):
        assert not titles[x] & titles[y]
        assert not prompts[x] & prompts[y]


@pytest.mark.parametrize("target", [1000, 4000, 16000, 64000, 128000])
def test_context_tokens_within_five_percent(target: int) -> None:
    task = SyntheticQATask(context_tokens=target, seed=1)
    for i in range(2 if target > 20000 else 8):
        inst = task.get("train", i)
        total = _total_tokens(inst)
        assert abs(total - target) <= 0.05 * target
        assert inst.metadata["context_tokens"] == total
        assert inst.metadata["target_context_tokens"] == target
        assert len({c.key for c in inst.context}) == len(inst.context)


def test_context_tokens_smaller_than_support_is_an_error() -> None:
    task = SyntheticQATask(context_tokens=200, question_types=("bridge_comparison",), hops=(4,))
    with pytest.raises(ValueError, match="too small"):
        for i in range(20):
            task.get("train", i)


def test_answers_and_aliases() -> None:
    task = SyntheticQATask(question_types=("compositional",), hops=(2,), num_distractors=0)
    seen_year = seen_person = False
    for i in range(200):
        inst = task.get("train", i)
        g = task.grade(inst, f"Answer: {inst.answer}")
        assert g.correct and g.score == 1.0 and g.details["f1"] == 1.0
        assert not task.grade(inst, "Nobody Atall").correct
        if inst.prompt.startswith("In what year"):
            assert inst.answer.isdigit() and len(inst.answer) == 4
            seen_year = True
        if inst.prompt.startswith(("Who directed", "Who founded", "Who is")):
            surname = inst.answer.split(" ", 1)[1]
            assert surname in inst.aliases and task.grade(inst, surname).correct
            seen_person = True
    assert seen_year and seen_person
    no_alias = SyntheticQATask(question_types=("inference",), hops=(2,), surname_alias=False)
    assert no_alias.get("train", 0).aliases == ()


# -- dataset loaders ----------------------------------------------------------------------------


def _two_wiki_row(i: int) -> dict:
    return {
        "_id": f"2w{i}",
        "type": "compositional",
        "question": f"Where was the director of film F{i} born?",
        "answer": f"City{i}",
        "context": [
            [f"F{i}", [f"F{i} is a film.", f"It was directed by D{i}."]],
            [f"D{i}", [f"D{i} was born in City{i}."]],
            ["Common", ["One."]],
            ["Common", ["Two."]],
        ],
        "supporting_facts": [[f"F{i}", 1], [f"D{i}", 0]],
        "evidences": [[f"F{i}", "director", f"D{i}"], [f"D{i}", "place of birth", f"City{i}"]],
    }


def test_two_wiki_original_json(tmp_path: Path) -> None:
    path = tmp_path / "dev.json"
    path.write_text(json.dumps([_two_wiki_row(i) for i in range(3)]), encoding="utf-8")
    src = TwoWikiMultihopQATask(path=path)
    assert src.size("test") == 3 and src.available_splits() == ("test",)
    inst = src.get("test", 1)
    assert inst.prompt == "Where was the director of film F1 born?"
    assert [c.key for c in inst.context] == ["F1", "D1", "Common", "Common (2)"]
    assert inst.context[0].text == "F1 is a film. It was directed by D1."
    assert inst.context[3].text == "Two."
    assert inst.metadata["supporting_keys"] == ("F1", "D1")
    assert inst.metadata["hops"] == 2 and inst.metadata["type"] == "compositional"
    assert inst.metadata["source_id"] == "2w1"
    assert "evidences" not in inst.metadata  # it holds the answer
    assert src.grade(inst, "city1").correct
    assert not src.grade(inst, "City2").correct
    with pytest.raises(ValueError, match="no 'train' split"):
        src.get("train", 0)
    with pytest.raises(IndexError):
        src.get("test", 3)


def test_two_wiki_parquet_hf_form(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for i in range(4):
        r = _two_wiki_row(i)
        r["context"] = {
            "title": [t for t, _ in r["context"]],
            "sentences": [s for _, s in r["context"]],
        }
        r["supporting_facts"] = {"title": [f"F{i}", f"D{i}"], "sent_id": [1, 0]}
        r["evidences"] = json.dumps(r["evidences"])
        rows.append(r)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    src = TwoWikiMultihopQATask(path={"test": tmp_path / "train.parquet"}, limit=2)
    assert src.size("test") == 2
    inst = src.get("test", 0)
    assert [c.key for c in inst.context] == ["F0", "D0", "Common", "Common (2)"]
    assert inst.metadata["supporting_keys"] == ("F0", "D0")


def _para(idx: int, title: str, text: str, supporting: bool) -> dict:
    return {"idx": idx, "title": title, "paragraph_text": text, "is_supporting": supporting}


def _musique_row(i: int, answerable: bool = True) -> dict:
    return {
        "id": f"2hop__{i}_{i + 1}",
        "question": f"Who founded the company that made Q{i}?",
        "answer": "International Business Machines",
        "answer_aliases": ["IBM", "I.B.M."],
        "answerable": answerable,
        "paragraphs": [
            _para(1, "Maker", "Maker was founded by IBM.", True),
            _para(0, f"Q{i}", f"Q{i} was made by Maker.", True),
            _para(2, "Maker", "Another Maker.", False),
        ],
        "question_decomposition": [
            {
                "id": 1,
                "question": f"Q{i} >> made by",
                "answer": "Maker",
                "paragraph_support_idx": 0,
            },
            {"id": 2, "question": "#1 >> founded by", "answer": "IBM", "paragraph_support_idx": 1},
        ],
    }


def test_musique_jsonl_aliases_and_unanswerable(tmp_path: Path) -> None:
    path = tmp_path / "musique_ans_v1.0_dev.jsonl"
    rows = [_musique_row(0), _musique_row(1, answerable=False), _musique_row(2)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    src = MuSiQueTask(path=path)
    assert src.size("test") == 2
    inst = src.get("test", 1)
    assert inst.metadata["source_id"] == "2hop__2_3"
    assert [c.key for c in inst.context] == ["Q2", "Maker", "Maker (2)"]
    assert inst.metadata["supporting_keys"] == ("Q2", "Maker")
    assert inst.metadata["hops"] == 2 and inst.metadata["type"] == "2hop"
    assert inst.aliases == ("IBM", "I.B.M.")
    assert src.grade(inst, "IBM").correct and src.grade(inst, "ibm.").correct
    assert src.grade(inst, "international business machines").correct
    assert not src.grade(inst, "Maker").correct
    assert MuSiQueTask(path=path, include_unanswerable=True).size("test") == 3


def _hotpot_row(i: int) -> dict:
    return {
        "id": f"hp{i}",
        "question": f"Are X{i} and Y{i} both rivers?",
        "answer": "yes",
        "type": "comparison",
        "level": "hard",
        "supporting_facts": {"title": [f"X{i}", f"Y{i}"], "sent_id": [0, 0]},
        "context": {
            "title": [f"X{i}", f"Y{i}", "Z"],
            "sentences": [[f"X{i} is a river.", " It is long."], [f"Y{i} is a river."], ["Z."]],
        },
    }


def test_hotpot_parquet_and_original_json(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([_hotpot_row(i) for i in range(3)]), tmp_path / "v.parquet")
    original = []
    for i in range(3):
        r = _hotpot_row(i)
        original.append(
            {
                "_id": r["id"],
                "question": r["question"],
                "answer": r["answer"],
                "type": r["type"],
                "level": r["level"],
                "supporting_facts": [[f"X{i}", 0], [f"Y{i}", 0]],
                "context": [
                    [t, s] for t, s in zip(r["context"]["title"], r["context"]["sentences"])
                ],
            }
        )
    (tmp_path / "hotpot_dev_distractor_v1.json").write_text(json.dumps(original), encoding="utf-8")
    a = HotpotQATask(path=tmp_path / "v.parquet").get("test", 2)
    b = HotpotQATask(path=tmp_path / "hotpot_dev_distractor_v1.json").get("test", 2)
    assert a.context == b.context and a.prompt == b.prompt
    assert a.context[0].text == "X2 is a river. It is long."
    assert a.metadata["supporting_keys"] == b.metadata["supporting_keys"] == ("X2", "Y2")
    assert a.metadata["level"] == "hard" and a.metadata["type"] == "comparison"
    assert HotpotQATask(path=tmp_path / "v.parquet").grade(a, "Yes").correct


def test_dev_carved_from_train_disjoint_and_deterministic(tmp_path: Path) -> None:
    train = tmp_path / "train.jsonl"
    train.write_text("\n".join(json.dumps(_two_wiki_row(i)) for i in range(200)), encoding="utf-8")
    test = tmp_path / "dev.json"
    test.write_text(json.dumps([_two_wiki_row(1000 + i) for i in range(5)]), encoding="utf-8")
    src = TwoWikiMultihopQATask(path={"train": train, "test": test}, dev_fraction=0.2)
    ids = {s: [src.get(s, i).metadata["source_id"] for i in range(src.size(s))] for s in SPLITS}
    assert not set(ids["train"]) & set(ids["dev"])
    assert sorted(ids["train"] + ids["dev"]) == sorted(f"2w{i}" for i in range(200))
    assert 20 <= len(ids["dev"]) <= 60
    assert len(ids["test"]) == 5
    again = TwoWikiMultihopQATask(path={"train": train, "test": test}, dev_fraction=0.2)
    assert [again.get("dev", i).metadata["source_id"] for i in range(again.size("dev"))] == ids[
        "dev"
    ]
    assert [src.get("dev", i).task_id for i in range(3)] == [
        f"2wikimultihopqa-dev-{i}" for i in range(3)
    ]


def test_hub_loading_maps_validation_to_test(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    calls = []

    def fake_load_dataset(hub_id, config=None, **kwargs):  # noqa: ANN001, ANN202
        calls.append((hub_id, config))
        return datasets.DatasetDict(
            {
                "train": datasets.Dataset.from_list([_hotpot_row(i) for i in range(30)]),
                "validation": datasets.Dataset.from_list([_hotpot_row(100 + i) for i in range(4)]),
            }
        )

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    src = HotpotQATask()
    assert src.size("test") == 4 and src.get("test", 0).metadata["source_id"] == "hp100"
    assert src.size("train") + src.size("dev") == 30
    assert calls == [("hotpotqa/hotpot_qa", "distractor")]
    custom = HotpotQATask(hub_id="me/hotpot", split_map={"dev": "validation", "test": "validation"})
    assert custom.size("dev") == custom.size("test") == 4 and custom.size("train") == 30


def test_loader_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        MuSiQueTask(path=tmp_path / "missing.jsonl").size("test")
    with pytest.raises(ValueError, match="path= or hub_id="):
        MuSiQueTask(path="a.jsonl", hub_id="b")
    with pytest.raises(ValueError, match="split_map keys"):
        MuSiQueTask(split_map={"validation": "x"})
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json}\n", encoding="utf-8")
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        MuSiQueTask(path=bad).size("test")
