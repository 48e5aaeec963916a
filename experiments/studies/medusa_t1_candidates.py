"""At temperature 1: how often the target accepts one of a Medusa node's first-level candidates, when they
are the head's top r tokens (what specdec drafts now: deterministic, accepted with probability p(x)) vs r
draws without replacement from the head's q (accepted with min(1, p/q), then against the residual).

    python experiments/studies/medusa_t1_candidates.py [--prompts 12] [--tokens 48]

Plain T=1 generations of MT-Bench prompts by the default target; at each position, p = the target's next
distribution after the emitted token, q = the shipped token-aware head 0 given that token. A measurement to
decide whether sampled candidates are worth building (see experiments/README.md, "What exactness costs"), not a drafter.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from omegaconf import OmegaConf

from specdec.decode.engine import autoregressive_generate
from specdec.drafters.medusa import MedusaDrafter
from specdec.jobs.data import encode_prompt, load_prompt_mix
from specdec.models.loading import load_target
from specdec.verify.tree import residual_after_rejection


def head0_and_target(prompts: int, tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """p [N, V] and head 0's q [N, V] at every generated position."""
    target, tokenizer = load_target("smollm2-135m")
    drafter = MedusaDrafter.from_config(OmegaConf.structured(MedusaDrafter.Config()), target=target)
    g = torch.Generator().manual_seed(seed)
    ps, qs = [], []
    for row in load_prompt_mix(["mtbench"], prompts):
        ids = torch.tensor([encode_prompt(tokenizer, row)])
        out = autoregressive_generate(target, ids, max_new_tokens=tokens, temperature=1.0, generator=g,
                                      eos_token_id=[])
        seq = torch.cat([ids, torch.tensor(out.sequences)], 1)
        with torch.no_grad():
            o = target(seq, output_hidden_states=True)
            hidden, p = o.hidden_states[-1][0], o.logits[0].float().softmax(-1)  # p[t]: token t + 1's
            t = torch.arange(ids.shape[1] - 1, seq.shape[1] - 2)  # hidden[t] predicted the emitted token t + 1
            known = drafter.embed_weight[seq[0, t + 1]].to(drafter.dtype)[:, None]  # [N, 1, H]
            logits = drafter.heads(hidden[t].to(drafter.dtype), drafter.lm_head_weight, num_heads=1, known=known)
            q = logits[:, 0].float().softmax(-1)
            if drafter.heads.token_ids is not None:  # back to the full vocabulary
                q = q.new_zeros(len(t), p.shape[-1]).index_copy_(-1, drafter.heads.token_ids, q)
        ps.append(p[t + 1])
        qs.append(q)
    return torch.cat(ps), torch.cat(qs)


def sampled_acceptance(p: torch.Tensor, q: torch.Tensor, r: int, g: torch.Generator) -> float:
    """P(one of r draws without replacement from q is accepted), recursive rejection, one Monte Carlo pass."""
    accepted = torch.zeros(p.shape[0], dtype=torch.bool)
    for _ in range(r):
        x = torch.multinomial(q, 1, generator=g)
        px, qx = p.gather(-1, x)[:, 0], q.gather(-1, x)[:, 0]
        accepted |= torch.rand(p.shape[0], generator=g) * qx < px
        p = torch.where(accepted[:, None], p, residual_after_rejection(p, q))
        q = q.scatter(-1, x, 0.0)  # the next draw is without x
        q = q / q.sum(-1, keepdim=True).clamp(min=1e-30)
    return float(accepted.float().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=32)
    args = parser.parse_args()
    p, q = head0_and_target(args.prompts, args.tokens, seed=0)
    g = torch.Generator().manual_seed(1)
    print(f"{p.shape[0]} positions; 1 - TV(p, q) = {float(1 - 0.5 * (p - q).abs().sum(-1).mean()):.3f}")
    print("r | top-r tokens (now) | r draws without replacement")
    top = q.topk(8, -1).indices
    for r in (1, 2, 3, 4, 8):
        deterministic = float(p.gather(-1, top[:, :r]).sum(-1).mean())
        sampled = np.mean([sampled_acceptance(p, q, r, g) for _ in range(args.repeats)])
        print(f"{r} | {deterministic:.3f} | {sampled:.3f}")


if __name__ == "__main__":
    main()
