"""Probe (not a test, not the drafter yet): Medusa trees with a prompt-lookup branch, and bf16 drafting.

A prototype for the next step of issue 5, batch 1 only, greedy, MT-Bench or HumanEval prompts, every method
on every prompt in turn in one process (as ``medusa_benchmark.py``). Each extra method is a spec
``MODE:K:CONF:L[:bf16]``:

- K, CONF: the Medusa tree of the first K paths, dynamic when CONF > 0 (``MedusaDrafter(min_confidence=CONF)``);
- L > 0: the n-gram lookup's continuation (up to L tokens, as ``NgramDrafter``) joins the tree. ``merge``
  inserts it like a trie (down the Medusa nodes that already hold its tokens, the rest as a new chain below,
  so no two siblings repeat a token); ``fallback`` drafts the lookup chain alone when it finds one, else the
  Medusa tree. Every node stays a deterministic candidate, so verification is exact either way;
- ``bf16``: the heads, the draft LM-head rows and the embeddings run in bfloat16 (drafts may change, the
  verification does not: the target stays float32).

    python experiments/medusa_ngram_probe.py outputs/train_medusa/token-aware/export-f16/heads.safetensors 8 mtbench \
        merge:15:0.3:0 merge:15:0.3:4:bf16 merge:15:0:8:bf16 fallback:15:0.5:4:bf16
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from functools import partial

import numpy as np
import torch

from specdec import NgramDrafter, autoregressive_generate, load_target, speculative_generate
from specdec.data import encode_prompt, load_prompts
from specdec.drafters.base import Drafter, Proposal
from specdec.drafters.medusa import MedusaDrafter, load_heads
from specdec.drafters.ngram import lookup
from specdec.verify_tree import Tree

from medusa_benchmark import side_by_side  # the same interleaved timing (run as a script from experiments/)


class _Probe(Drafter):
    """The Medusa drafter at its own k, plus the lookup branch (batch 1)."""

    name = "medusa+ngram probe"

    def __init__(self, medusa: MedusaDrafter, k: int, lookup_len: int, mode: str):
        self.medusa, self.k, self.lookup_len, self.mode = medusa, k, lookup_len, mode

    def propose(self, state, k):
        chain = lookup(np.asarray(state.tokens[0], dtype=np.int64), self.lookup_len, 3, 2).tolist() \
            if self.lookup_len else []
        if self.mode == "fallback" and chain:
            return Proposal(tokens=torch.tensor([chain]), num_proposed=[len(chain)])
        proposal = self.medusa.propose(state, self.k)
        if not chain:
            return proposal
        tokens = proposal.tokens[0].tolist()
        parents = proposal.tree.parents.tolist() if proposal.tree is not None else []
        children: dict[int, dict[int, int]] = {}
        for i, p in enumerate(parents):
            children.setdefault(p, {})[tokens[i]] = i
        node = -1
        for t in chain:
            below = children.get(node, {}).get(t)
            if below is None:
                tokens.append(t), parents.append(node)
                below = children.setdefault(node, {})[t] = len(tokens) - 1
            node = below
        return Proposal(tokens=torch.tensor([tokens]), num_proposed=[len(tokens)], tree=Tree.from_parents(parents))

    def start(self, state):
        self.medusa.start(state)


def _bf16(drafter: MedusaDrafter) -> MedusaDrafter:
    drafter.heads = copy.deepcopy(drafter.heads).to(torch.bfloat16)
    drafter.lm_head_weight = drafter.lm_head_weight.bfloat16()
    if drafter.embed_weight is not None:
        drafter.embed_weight = drafter.embed_weight.bfloat16()
    inner = drafter.propose
    drafter.propose = lambda state, k: inner(dataclasses.replace(state, last_hidden=state.last_hidden.bfloat16()), k)
    return drafter


def main() -> None:
    heads_path, n_prompts, source, specs = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
    model, tokenizer = load_target()
    heads, meta = load_heads(heads_path, hidden_size=model.config.hidden_size, vocab_size=model.config.vocab_size)
    prompts = [torch.tensor([encode_prompt(tokenizer, r)]) for r in load_prompts(source, limit=n_prompts)]
    eos = [tokenizer.eos_token_id, model.generation_config.eos_token_id]
    medusa = partial(MedusaDrafter, heads, model.get_output_embeddings().weight,
                     embed_weight=model.get_input_embeddings().weight if heads.token_aware else None)
    methods: dict[str, tuple[Drafter | None, int]] = {"plain": (None, 0), "ngram K=4": (NgramDrafter(), 4)}
    for spec in specs:
        mode, k, conf, lookup_len = spec.split(":")[:4]
        drafter = medusa(meta["tree"], float(conf))
        if spec.endswith(":bf16"):
            drafter = _bf16(drafter)
        methods[spec] = (_Probe(drafter, int(k), int(lookup_len), mode), int(k) + int(lookup_len))

    def run(drafter, k, ids):
        if drafter is None:
            return autoregressive_generate(model, ids, max_new_tokens=128, eos_token_id=eos)
        return speculative_generate(model, drafter, ids, k=k, max_new_tokens=128, eos_token_id=eos)

    seconds, tokens, stats, differ = side_by_side(methods, prompts, run)
    base = tokens["plain"] / seconds["plain"]
    print(f"{source}, {len(prompts)} prompts, 128 tokens, greedy, batch 1, {torch.get_num_threads()} threads")
    print("| method | τ | speedup | verify + draft ms/step | outputs ≠ plain |\n|---|---|---|---|---|")
    for name in methods:
        s = stats[name]
        print(f"| {name} | {s.mean_accepted_length:.2f} | {tokens[name] / seconds[name] / base:.2f}x | "
              f"{1000 * s.target_time_s / s.target_forwards:.1f} + {1000 * s.drafter_time_s / s.target_forwards:.1f} "
              f"| {differ[name]} |")


if __name__ == "__main__":
    main()
