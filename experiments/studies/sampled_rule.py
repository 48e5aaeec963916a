"""What the exact rule's sampled verdict costs a step on this machine, drawn as it walks or drawn first (not a test).

The exact rule verifies a tree of fixed candidates at T > 0 either sibling by sibling, building and renormalising a
[B, V] residual per child tried (:func:`specdec.verify.verify_tree`, the reference), or over uniforms drawn first,
a level's siblings at once from p at the children's tokens (:func:`specdec.verify.tree.verify_tree_drawn`, what
:class:`~specdec.verify.ExactRule` runs, and what a GPU's graph replays). Both have the target's law; they draw
different tokens. Side by side in one process (the main job's target over its codes, Medusa's shipped heads, each
prompt through every method in turn): plain decoding, then each tree under each form, sampled at --temperature.

    python experiments/studies/sampled_rule.py --prompts 8 --new 64
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from specdec import autoregressive_generate, load_target, speculative_generate
from specdec.drafters.medusa import MedusaDrafter
from specdec.jobs.data import encode_prompt, load_prompts
from specdec.jobs.runs import machine_description
from specdec.models import Backend, as_decoder
from specdec.verify import ExactRule, rejection_sample, verify_tree

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: experiments.common
from experiments.common import benchmark_parser, side_by_side  # noqa: E402


class WalkedRule(ExactRule):
    """The exact rule drawn as it walks: :func:`verify_tree` and :func:`rejection_sample` with the generator."""

    def chain(self, draft_tokens, draft_probs, target_probs, generator=None):
        return rejection_sample(draft_tokens, draft_probs, target_probs, generator)

    def tree(self, tree, draft_tokens, draft_probs, target_probs, generator=None):
        return verify_tree(tree, draft_tokens, draft_probs, target_probs, generator)


def main() -> None:
    ap = benchmark_parser(__doc__, prompts=8, new=64, temperature=True)
    args = ap.parse_args()
    temperature = args.temperature or 1.0
    backend = Backend(weights="codes")  # the main job's target on a CPU
    model, tokenizer = load_target()
    target = as_decoder(model, backend=backend)
    prompts = [torch.tensor([encode_prompt(tokenizer, row)]) for row in load_prompts(args.source, limit=args.prompts)]
    eos = [tokenizer.eos_token_id, model.generation_config.eos_token_id]
    default = MedusaDrafter.from_config(MedusaDrafter.Config(), target=model, backend=backend)
    fixed = MedusaDrafter.from_config(MedusaDrafter.Config(min_confidence=0.0, lookup=0, k=15), target=model,
                                      backend=backend)
    k_default = MedusaDrafter.Config().k
    methods = {"plain": ((None, None), 0),
               "medusa default, drawn as it walks": ((default, WalkedRule()), k_default),
               "medusa default, drawn first": ((default, None), k_default),
               "medusa fixed tree K=15, drawn as it walks": ((fixed, WalkedRule()), 15),
               "medusa fixed tree K=15, drawn first": ((fixed, None), 15)}

    def run(spec, k, ids):
        drafter, rule = spec
        generator = torch.Generator().manual_seed(int(ids.sum()))
        kwargs = dict(max_new_tokens=args.new, eos_token_id=eos, temperature=temperature, generator=generator)
        if drafter is None:
            return autoregressive_generate(target, ids, **kwargs)
        return speculative_generate(target, drafter, ids, k=k, rule=rule, **kwargs)

    seconds, tokens, stats, _ = side_by_side(methods, prompts, run)
    plain = tokens["plain"] / seconds["plain"]
    print(f"{machine_description(torch.device('cpu'))}, the target over its codes, {len(prompts)} {args.source} "
          f"prompts, {args.new} new tokens, T={temperature:g}\n")
    print("| method | τ | tok/s | x plain | verify step ms | draft step ms |\n|---|---|---|---|---|---|")
    for name in methods:
        s = stats[name]
        rate = tokens[name] / seconds[name]
        print(f"| {name} | {s.mean_accepted_length:.2f} | {rate:.1f} | {rate / plain:.2f}x | "
              f"{1000 * s.target_time_s / s.target_forwards:.1f} | {1000 * s.drafter_time_s / s.target_forwards:.1f} |")


if __name__ == "__main__":
    main()
