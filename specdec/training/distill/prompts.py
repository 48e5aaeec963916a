"""Prompts for self-distillation, built offline, shared by every learned drafter (:mod:`specdec.training`).

The target answers these prompts and a drafter learns its answers, so the prompts should look like the
ones the drafter will serve: short chat instructions in MT-Bench's eight categories (writing, roleplay,
reasoning, math, coding, extraction, STEM, humanities). None of them is MT-Bench's or HumanEval's: the
templates (:mod:`.templates`) were written for this package, and the slots are filled from local corpora
(Wikipedia titles and names, Shakespeare, the Python standard library — each minus its first
``skip_first`` rows, which benchmark runs use) and small word lists; a prompt the target writes itself
(:func:`magpie_prompts`) is dropped where it shares 8 words with a benchmark prompt
(:func:`benchmark_ngrams`). Short prompts also make the data cheap: on a CPU the target's time goes to
the prompt and the answer alike, and only the answer is training data.
"""

from __future__ import annotations

import ast
import functools
import json
import logging
import math
import os
import random
import re
from pathlib import Path
from typing import Callable

from specdec.training.distill.templates import (
    ANIMALS, AUDIENCES, CATEGORIES, CHOICES, CONCEPTS, DATA_STRUCTURES, DOC_TYPES, EVENTS, GENRES, GOALS, KEYWORDS,
    MATERIALS, NAMES, PERSONAS, PLACES, PRODUCTS, QUERIES, REVIEWS, SCHOOLS, SEASONS, SENTENCES, SHELL, SKILLS, TASKS,
    THINGS, TONES, VALUES)

log = logging.getLogger(__name__)


def _cut(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: text.rfind(" ", 0, chars) if " " in text[:chars] else chars]


def _sentences(texts: list[str]) -> list[str]:
    """Whole sentences of 40-200 characters."""
    out = []
    for text in texts:
        for sentence in re.split(r"(?<=[.!?])\s+", " ".join(text.split())):
            if 40 <= len(sentence) <= 200 and sentence[0].isupper() and sentence[-1] in ".!?":
                out.append(sentence)
    return out


@functools.lru_cache(maxsize=4)
def _docstrings(skip_files: frozenset[str], limit: int = 5000) -> tuple[tuple[str, str], ...]:
    """(signature, docstring's first sentence) of public functions in the standard library's top-level
    modules, minus ``skip_files`` (paths relative to the library root). Parsed once a process (~4 s)."""
    root = Path(os.__file__).parent
    found = []
    for path in sorted(root.glob("*.py")):
        if path.name in skip_files or path.name.startswith("_") or path.stat().st_size > 400_000:
            continue
        try:
            tree = ast.parse(path.read_text(errors="replace"))
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                doc = (ast.get_docstring(node) or "").strip().split("\n\n")[0].replace("\n", " ")
                args = [a.arg for a in node.args.args if a.arg not in ("self", "cls")]
                if 25 <= len(doc) <= 200:
                    found.append((f"{node.name}({', '.join(args)})", " ".join(doc.split())))
    return tuple(found[:limit])


def _news(skip_first: int) -> list[str]:
    from specdec.jobs.data import _package_file

    path = _package_file("gensim", "gensim", "test/test_data/lee_background.cor")
    lines = path.read_text(errors="replace").splitlines()[skip_first:]
    return [_cut(line.strip(), 400) for line in lines if line.strip()]


def _slot_filler(rng: random.Random, skip_first: int) -> Callable[[], dict[str, str]]:
    from specdec.jobs.data import load_prompts

    wiki, code, verse = (list(load_prompts(s, seed=0))[skip_first:] for s in ("wikipedia", "stdlib", "shakespeare"))
    wiki_sentences = _sentences([row["text"] for row in wiki])
    docstrings = _docstrings(frozenset(row["id"].split("/", 1)[-1]
                                       for row in list(load_prompts("stdlib", seed=0))[:skip_first]))
    news = _news(skip_first)
    topics = sorted({t for row in wiki for t in re.findall(r"\b[A-Z][a-z]+(?: [A-Z][a-z]+)+", row["text"])}
                    | {row["id"].split("/", 1)[-1].replace("_", " ") for row in wiki})
    pick = rng.choice

    def fill() -> dict[str, str]:
        a, b = rng.randint(2, 99), rng.randint(2, 30)
        singular, plural = pick(ANIMALS)
        persona = pick(PERSONAS)
        names = rng.sample(NAMES, 3)
        place = pick(PLACES)
        signature, doc = pick(docstrings)
        return {
            "sentence_wiki": pick(wiki_sentences), "signature": signature, "doc": doc, "news": pick(news),
            "n": str(rng.randint(2, 5)), "genre": pick(GENRES), "tone": pick(TONES), "doc_type": pick(DOC_TYPES),
            "audience": pick(AUDIENCES), "words": str(rng.choice([100, 150, 200, 300])),
            "goal": pick(GOALS).format(place=place), "choice": pick(CHOICES), "persona2": pick(PERSONAS),
            "topic": pick(topics + CONCEPTS), "persona": persona, "persona_bare": persona, "place": place,
            "place2": pick(PLACES), "product": pick(PRODUCTS), "skill": pick(SKILLS), "season": pick(SEASONS),
            "building": pick(["library", "hospital", "school", "museum", "park"]), "sentence": pick(SENTENCES),
            "concept": pick(CONCEPTS), "concept2": pick(CONCEPTS), "event": pick(EVENTS), "school": pick(SCHOOLS),
            "value": pick(VALUES), "name1": names[0], "name2": names[1], "name3": names[2], "singular": singular,
            "plural": plural, "material": pick(MATERIALS), "review": pick(REVIEWS), "task": pick(TASKS),
            "query": pick(QUERIES), "ds1": pick(DATA_STRUCTURES), "ds2": pick(DATA_STRUCTURES), "thing": pick(THINGS),
            "keyword": pick(KEYWORDS), "shell": pick(SHELL), "a": str(a), "b": str(b), "c": str(rng.randint(31, 500)),
            "a2": str(2 * a), "a3": str(3 * a), "c2": str(b + rng.randint(1, 9)), "small": str(rng.randint(3, 7)),
            "hour": str(rng.randint(1, 12)), "text": _cut(pick(wiki)["text"], 300),
            "verse": _cut(pick(verse)["text"], 300), "code": _cut(pick(code)["text"], 400),
        }

    return fill


def instruction_prompts(num: int, skip_first: int, seed: int,
                        completion_fraction: float = 0.05) -> list[dict[str, str]]:
    """``num`` prompt rows (as :mod:`specdec.jobs.data` rows): chat instructions from the templates above
    (categories weighted as in ``CATEGORIES``), and a ``completion_fraction`` of raw Wikipedia passages
    and Python modules to continue."""
    rng = random.Random(seed)
    fill = _slot_filler(rng, skip_first)
    names = list(CATEGORIES)
    weights = [CATEGORIES[n][1] for n in names]
    rows = []
    for i in range(num):
        slots = fill()
        if rng.random() < completion_fraction:
            rows.append({"id": f"continue/{i}", "source": "continue", "category": "completion", "kind": "completion",
                         "text": rng.choice([slots["text"], slots["code"]])})
            continue
        category = rng.choices(names, weights)[0]
        text = rng.choice(CATEGORIES[category][0]).format(**slots)
        rows.append({"id": f"instruct/{i}", "source": "instruct", "category": category, "kind": "chat", "text": text})
    return rows


def magpie_prompts(target, tokenizer, num: int, seed: int, batch_size: int = 128, max_tokens: int = 64,
                   temperature: float = 1.0, top_p: float = 0.95) -> list[dict[str, str]]:
    """``num`` chat prompts written by the target itself (Magpie, Xu et al. 2024): the chat template up to
    the opening of a user turn, sampled until the turn ends. An instruction-tuned target writes the kind
    of requests it was tuned on — closer to real chat traffic (and MT-Bench) than templates. Queries cut
    off at ``max_tokens``, shorter than 6 tokens, holding a special token, repeated, or sharing 8 words in a
    row with an MT-Bench or HumanEval prompt (the model may have seen them) are dropped and more are sampled.

    Raises ValueError for a tokenizer without a chat template (nothing to open a user turn with)."""
    import torch

    from specdec import autoregressive_generate

    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("magpie prompts need a chat model (a tokenizer with a chat template); use "
                         "data.magpie_fraction=0 for this target")
    sentinel = "\u2063SPECDEC\u2063"
    templated = tokenizer.apply_chat_template([{"role": "user", "content": sentinel}], tokenize=False)
    prefix = tokenizer(templated[: templated.index(sentinel)], add_special_tokens=False)["input_ids"]
    vocab = tokenizer.get_vocab()
    end = vocab.get("<|im_end|>")
    stops = sorted({t for t in (end, tokenizer.eos_token_id) if t is not None})
    special = set(tokenizer.all_special_ids) | {vocab[t] for t in ("<|im_start|>", "<|im_end|>") if t in vocab}
    generator = torch.Generator().manual_seed(seed)
    rows: list[dict[str, str]] = []
    seen: set[str] = set()
    benchmark = benchmark_ngrams()
    for _ in range(max(8, 4 * math.ceil(num / batch_size))):
        if len(rows) >= num:
            break
        ids = torch.tensor([prefix] * batch_size)
        out = autoregressive_generate(target, ids, max_new_tokens=max_tokens, temperature=temperature, top_p=top_p,
                                      generator=generator, attention_mask=torch.ones_like(ids), eos_token_id=stops)
        for seq in out.sequences:
            cut = next((j for j, t in enumerate(seq) if t in stops), None)
            ok = cut is not None and cut >= 6 and not special.intersection(seq[:cut])  # one whole, plain user turn
            text = tokenizer.decode(seq[:cut]).strip() if ok else ""
            if text and benchmark & _ngrams(text):
                log.info("magpie: dropped a query sharing 8 words with a benchmark prompt: %r", text[:200])
                continue
            if text and text not in seen and len(rows) < num:
                seen.add(text)
                rows.append({"id": f"magpie/{len(rows)}", "source": "magpie", "category": "magpie", "kind": "chat",
                             "text": text})
        log.info("magpie: %d/%d queries written", len(rows), num)
    if len(rows) < num:
        raise RuntimeError(f"the target wrote only {len(rows)} usable queries of the {num} asked for; "
                           f"lower data.magpie_fraction or check the chat template")
    return rows


def _ngrams(text: str, n: int = 8) -> set[tuple[str, ...]]:
    words = re.findall(r"[a-z0-9]+", text.lower())
    return {tuple(words[i: i + n]) for i in range(len(words) - n + 1)}


def benchmark_ngrams(n: int = 8) -> set[tuple[str, ...]]:
    """Every run of ``n`` words in MT-Bench's and HumanEval's prompts: a generated prompt sharing one is not
    held out from them."""
    from specdec.jobs.data import load_prompts

    return {g for source in ("mtbench", "humaneval") for row in load_prompts(source) for g in _ngrams(row["text"], n)}


def write_jsonl(path: str | Path, rows) -> Path:
    """Prompt rows (dicts, or a dataset's rows) as JSONL, one row a line, written atomically."""
    from specdec.jobs.io import write_text

    return write_text(path, "".join(json.dumps(dict(row)) + "\n" for row in rows))


def write_prompt_files(out: str | Path, num: int, seed: int = 0, skip_first: int = 16,
                       held_out: str | Path | None = None) -> list[Path]:
    """Write ``num`` of :func:`instruction_prompts` as JSONL (``data.prompts_file``) and, with ``held_out``, the
    held-out sets there: ``mtbench.jsonl`` and ``humaneval.jsonl`` (every prompt; ``eval.answer_sources``) and
    ``wikipedia.jsonl`` (the corpus's first ``skip_first`` rows; ``eval.text_sources``). A training run on a
    machine without the corpora's packages (a GPU machine, say) reads them instead. Returns the paths."""
    from specdec.jobs.data import load_prompts

    written = [write_jsonl(out, instruction_prompts(num, skip_first, seed))]
    if held_out is not None:
        folder = Path(held_out)
        folder.mkdir(parents=True, exist_ok=True)
        for source in ("mtbench", "humaneval"):
            written.append(write_jsonl(folder / f"{source}.jsonl", load_prompts(source)))
        written.append(write_jsonl(folder / "wikipedia.jsonl", list(load_prompts("wikipedia", seed=0))[:skip_first]))
    return written


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m specdec.training.distill.prompts",
        description="Write self-distillation prompts as JSONL for data.prompts_file (and, with --held-out, the "
                    "held-out sets for eval.answer_sources / eval.text_sources): a training run on a machine "
                    "without the corpora reads them instead.")
    ap.add_argument("--num", type=int, required=True, help="prompts to write (data.num_prompts reads the first ones)")
    ap.add_argument("--out", required=True, help="the JSONL file to write")
    ap.add_argument("--seed", type=int, default=0, help="as the training run's seed (default 0)")
    ap.add_argument("--skip-first", type=int, default=16, help="as data.skip_first (default 16)")
    ap.add_argument("--held-out", default=None, metavar="DIR",
                    help="also write mtbench.jsonl, humaneval.jsonl and wikipedia.jsonl there")
    args = ap.parse_args(argv)
    if args.num < 1 or args.skip_first < 0:
        ap.error(f"--num must be >= 1 and --skip-first >= 0, got {args.num} and {args.skip_first}")
    for path in write_prompt_files(args.out, args.num, args.seed, args.skip_first, args.held_out):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
