"""Prompt sets: every built-in source loads offline with the fixed columns; limits spread over categories;
user files fail with errors that name the file and line; prompts encode as chat or completion."""

from __future__ import annotations

import json
import time
from pathlib import Path

import datasets
import pytest
from helpers import word_tokenizer
from omegaconf import OmegaConf

from specdec.jobs import data
from specdec.jobs.data import KINDS, SOURCES, encode_prompt, encode_prompts, load_prompt_mix, load_prompts

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
COLUMNS = ["id", "source", "category", "kind", "text"]
MTBENCH_CATEGORIES = {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}


WORDS = ["[UNK]", "<eos>", "<user>", "<bot>", "hello", "world", "def", "f"]


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_builtin_source_loads_offline_with_fixed_columns(source):
    prompts = load_prompts(source)
    assert prompts.column_names == COLUMNS
    assert len(prompts) > (10 if source == "heldout_text" else 50)  # three licences hold 13 long paragraphs
    assert set(prompts["source"]) == {source}
    assert set(prompts["kind"]) <= set(KINDS)
    assert all(len(text) > 30 for text in prompts["text"])
    assert len(set(prompts["id"])) == len(prompts), "ids must be unique"


@pytest.mark.parametrize(
    ("source", "count", "kind", "categories"),
    [
        ("mtbench", 80, "chat", MTBENCH_CATEGORIES),
        ("humaneval", 164, "completion", {"code"}),
        ("stdlib", 200, "completion", {"code"}),
        ("heldout_text", 13, "completion", {"heldout_text"}),
    ],
)
def test_known_counts_kinds_and_categories(source, count, kind, categories):
    prompts = load_prompts(source)
    assert len(prompts) == count
    assert set(prompts["kind"]) == {kind}
    assert set(prompts["category"]) == categories


def test_source_contents():
    first_problem = load_prompts("humaneval", limit=1)[0]
    assert first_problem["id"] == "HumanEval/0" and "def has_close_elements(" in first_problem["text"]
    assert load_prompts("mtbench", limit=1)[0]["id"] == "mtbench/81"  # first turn of the first question
    wiki = load_prompts("wikipedia")
    assert {"wikipedia"} == set(wiki["category"]) and {"completion"} == set(wiki["kind"])
    assert all("[[" not in t and "{{" not in t and len(t) <= 1000 for t in wiki["text"])
    assert wiki[0]["text"].startswith("Anarchism is a political philosophy")
    plays = load_prompts("shakespeare")
    assert all(len(t) <= 800 for t in plays["text"])
    assert len({i.split("/")[1] for i in plays.select(range(20))["id"]}) == 20, "first rows should span works"


def test_heldout_sets_are_completion_prompts_spread_over_their_packages_and_licences():
    code = load_prompts("heldout_code")
    assert len(code) > 100 and set(code["kind"]) == {"completion"} and set(code["category"]) == {"heldout_code"}
    packages = [i.split("/")[1] for i in code["id"]]
    assert len(set(packages[:8])) == 8, "the first 8 rows should span the 8 packages"
    assert all("/tests/" not in i and "/testing/" not in i and "/gen/" not in i for i in code["id"])
    assert all(700 <= len(t) <= 1500 and t.endswith("\n") for t in code["text"])
    assert all(t.lstrip().startswith(("def ", "async def ", "class ", "@")) for t in code["text"])
    text = load_prompts("heldout_text")
    assert set(text["kind"]) == {"completion"}
    assert {i.split("/")[1] for i in text.select(range(3))["id"]} == {"Apache-2.0", "MIT", "BSD-3-Clause"}
    assert all(400 <= len(t) <= 1500 and not t.startswith(" ") for t in text["text"])
    assert "Legal Entity" in text[0]["text"]


def test_heldout_sets_are_deterministic_for_a_seed():
    for source in ("heldout_code", "heldout_text"):
        assert load_prompts(source, limit=8, seed=3)["text"] == load_prompts(source, limit=8, seed=3)["text"]
        assert load_prompts(source, limit=8, seed=3)["id"] != load_prompts(source, limit=8, seed=4)["id"]
    assert len({i.split("/")[1] for i in load_prompts("heldout_code", limit=8, seed=3)["id"]}) == 8, "any seed spans"
    assert sorted(load_prompts("heldout_text", seed=3)["id"]) == sorted(load_prompts("heldout_text")["id"])


def test_heldout_preset_takes_8_completion_prompts_from_each_source():
    preset = OmegaConf.load(CONFIGS / "data" / "heldout.yaml")
    mix = load_prompt_mix(list(preset.sources), preset.limit_per_source)
    assert mix["source"] == ["heldout_code"] * 8 + ["heldout_text"] * 8
    data.check_chat_prompts(mix, chat_template=False)  # a base target (no chat template) runs it too
    assert {data.result_category(row) for row in mix} == {"heldout_code", "heldout_text"}


def test_mtbench_limit_8_covers_every_category():
    prompts = load_prompts("mtbench", limit=8)
    assert len(prompts) == 8
    assert set(prompts["category"]) == MTBENCH_CATEGORIES


def test_seed_changes_the_subset_but_not_the_spread():
    a, b = load_prompts("mtbench", limit=8, seed=1), load_prompts("mtbench", limit=8, seed=1)
    assert a["id"] == b["id"], "same seed, same prompts"
    assert set(a["category"]) == MTBENCH_CATEGORIES
    assert a["id"] != load_prompts("mtbench", limit=8)["id"]
    assert load_prompts("stdlib", limit=5, seed=1)["id"] != load_prompts("stdlib", limit=5, seed=2)["id"]


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_limit(source):
    assert len(load_prompts(source, limit=3)) == 3
    empty = load_prompts(source, limit=0)
    assert len(empty) == 0 and empty.column_names == COLUMNS


def test_a_built_in_source_is_parsed_once_a_process(monkeypatch):
    from specdec.jobs import data

    reads = []
    read = data.SOURCES["wikipedia"]
    monkeypatch.setitem(data.SOURCES, "wikipedia", lambda seed: reads.append(seed) or read(seed))
    first = load_prompts("wikipedia", seed=2).to_list()
    assert load_prompts("wikipedia", seed=2, limit=3).to_list() == first[:3] and reads == [2]


def test_prompt_mix_concatenates_in_order():
    mix = load_prompt_mix(["mtbench", "humaneval"], 4)
    assert mix["source"] == ["mtbench"] * 4 + ["humaneval"] * 4


def test_held_out_rows_follow_the_jobs_own_and_a_source_they_exhaust_gives_its_first(tmp_path):
    """k=auto's calibration prompts: the rows after the job's own in each source; where a source has no more (a
    one-row file under the default limit), the mix's own first rows, said so (False), not an error."""
    held, left_out = data.held_out_mix(["mtbench", "humaneval"], 4, 2)
    assert left_out and held["id"] == load_prompt_mix(["mtbench", "humaneval"], 6)["id"][4:6] + \
        load_prompt_mix(["humaneval"], 6)["id"][4:6]
    path = tmp_path / "mine.jsonl"
    path.write_text('{"text": "def add(a, b):", "kind": "completion"}\n')
    held, left_out = data.held_out_mix(["mtbench", str(path)], 8, 2)
    assert not left_out and held["id"] == load_prompt_mix(["mtbench", str(path)], 2)["id"]


def test_user_jsonl_file(tmp_path):
    path = tmp_path / "mine.jsonl"
    lines = [
        {"text": "Write a haiku."},
        {"prompt": "def add(a, b):", "kind": "completion", "category": "code", "id": "add"},
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    prompts = load_prompts(str(path))
    assert prompts.column_names == COLUMNS
    expected = {"id": "mine/1", "source": str(path), "category": "user", "kind": "chat", "text": "Write a haiku."}
    assert prompts[0] == expected
    assert prompts[1]["id"] == "add" and prompts[1]["kind"] == "completion" and prompts[1]["text"] == "def add(a, b):"


def test_user_json_array_file(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps([{"text": "a"}, {"text": "b"}]))
    assert load_prompts(str(path))["text"] == ["a", "b"]


def test_user_file_errors(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_prompts(str(missing))
    no_text = tmp_path / "bad.jsonl"
    no_text.write_text('{"text": "fine"}\n{"category": "x"}\n')
    with pytest.raises(ValueError, match="line 2"):
        load_prompts(str(no_text))
    not_json = tmp_path / "broken.jsonl"
    not_json.write_text('{"text": "fine"}\n{"text": \n')
    with pytest.raises(ValueError, match="line 2 is not valid JSON"):
        load_prompts(str(not_json))
    bad_kind = tmp_path / "kind.jsonl"
    bad_kind.write_text('{"text": "a", "kind": "dialogue"}\n')
    with pytest.raises(ValueError, match="dialogue"):
        load_prompts(str(bad_kind))


def test_results_name_categories_by_their_source_so_sets_never_collide():
    rows = load_prompt_mix(["mtbench", "humaneval", "stdlib", "wikipedia"], 8)
    names = {data.result_category(row) for row in rows}
    assert {f"mtbench/{c}" for c in MTBENCH_CATEGORIES} | {"humaneval/code", "stdlib/code", "wikipedia"} == names
    assert data.result_category({"source": "my/prompts.jsonl", "category": "user"}) == "prompts/user"
    assert data.result_category({"source": "hub:org/set:test", "category": "org/set"}) == "org/set"


def test_unknown_source_lists_valid_ones():
    with pytest.raises(ValueError, match="unknown prompt source 'mt-bench'") as err:
        load_prompts("mt-bench")
    for name in SOURCES:
        assert name in str(err.value)
    assert ".jsonl" in str(err.value) and "hub:" in str(err.value)


def test_hub_source_fails_fast_and_clearly_offline():
    start = time.perf_counter()
    with pytest.raises(OSError, match="no-such-org/no-such-dataset-xyz"):
        load_prompts("hub:no-such-org/no-such-dataset-xyz")
    assert time.perf_counter() - start < 15


def test_hub_source_reads_like_a_user_file(monkeypatch):
    table = datasets.Dataset.from_dict({"task_id": ["t/0", "t/1"], "prompt": ["def a():", "def b():"]})
    monkeypatch.setattr(data, "_probe_hub_dataset", lambda name: None)
    monkeypatch.setattr(datasets, "load_dataset", lambda name, split: table if split == "test" else None)
    prompts = load_prompts("hub:some-org/some-set")
    assert prompts["id"] == ["t/0", "t/1"] and prompts["text"] == ["def a():", "def b():"]
    assert set(prompts["category"]) == {"some-org/some-set"} and set(prompts["kind"]) == {"chat"}


def test_encode_prompt_chat_and_completion():
    tokenizer = word_tokenizer(WORDS, chat_template="{% for m in messages %}<user> {{ m['content'] }} {% endfor %}"
                               "{% if add_generation_prompt %}<bot>{% endif %}")
    assert encode_prompt(tokenizer, {"kind": "chat", "text": "hello world"}) == [2, 4, 5, 3]
    assert encode_prompt(tokenizer, {"kind": "completion", "text": "def f"}) == [6, 7]
    with pytest.raises(ValueError, match="dialogue"):
        encode_prompt(tokenizer, {"kind": "dialogue", "text": "hello"})


def test_encode_prompt_without_chat_template_falls_back_to_plain_text():
    assert encode_prompt(word_tokenizer(WORDS), {"kind": "chat", "text": "hello world"}) == [4, 5]


def test_the_job_refuses_chat_prompts_for_a_base_model_and_names_the_sources():
    rows = [{"id": "mtbench/1", "source": "mtbench", "kind": "chat", "text": "hello world"},
            {"id": "humaneval/1", "source": "humaneval", "kind": "completion", "text": "hello"}]
    with pytest.raises(ValueError, match=r"\['mtbench'\] hold chat prompts.*data=code_text"):
        encode_prompts(word_tokenizer(WORDS), rows, limit=100, context=512)
    assert encode_prompts(word_tokenizer(WORDS), rows[1:], limit=100, context=512) == [[4]]


@pytest.mark.real_model
def test_encode_prompt_with_smollm2_chat_template():
    from transformers import AutoTokenizer

    from specdec.models.loading import ensure_smollm2_cache

    tokenizer = AutoTokenizer.from_pretrained(ensure_smollm2_cache())
    ids = encode_prompt(tokenizer, load_prompts("mtbench", limit=1)[0])
    assert all(isinstance(i, int) for i in ids)
    text = tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system\n")  # SmolLM2's template adds a default system prompt
    assert text.endswith("<|im_start|>assistant\n")
    completion = encode_prompt(tokenizer, {"kind": "completion", "text": "def f(x):"})
    assert tokenizer.decode(completion) == "def f(x):"  # no BOS or other special token added
