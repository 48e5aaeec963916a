"""Probe (not a test): would Medusa heads gain from knowing the tokens before the one they predict?

A Medusa head predicts token s+1+i from the hidden state at s alone. At drafting time the token the
target just emitted (tokens[s], predicted by that same hidden state) is known, and in a tree so are the
draft tokens on the path — Hydra's sequentially dependent heads and EAGLE use them. This trains one head
both ways on a training data store (``python -m specdec.train``'s ``data.safetensors``), side by side, with the same budget, and reports top-1 / top-5
on the cache's held-out answers:

- ``medusa``: h_s -> residual block -> the target's LM head (the draft-vocabulary rows);
- ``token-aware``: [h_s; E(tokens[s]); E(tokens[s+1..s+i])] -> linear -> SiLU, added to h_s -> LM head,
  E the target's input embeddings, the path tokens teacher-forced (so the accuracy is conditional on a
  correct path — what a tree node needs).

    python experiments/studies/medusa_token_probe.py outputs/train/medusa/smollm2-135m/data.safetensors --head 0

The first row of each answer is left out (its previous token is not in the store). Labels are those of
the default config's 4 heads (the draft vocabulary counts them all).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from specdec.models.loading import load_target
from specdec.training.distill.store import load_splits
from specdec.training.distill.vocab import IGNORE, draft_vocabulary, to_draft_labels
from specdec.training.methods.medusa.objective import head_labels, with_previous_token

HEADS = 4  # the default training config's


class Head(nn.Module):
    def __init__(self, hidden_size: int, known: int, embeddings: torch.Tensor, lm_head: torch.Tensor):
        super().__init__()
        self.known, self.embeddings, self.lm_head = known, embeddings, lm_head
        self.linear = nn.Linear(hidden_size * (1 + known), hidden_size)
        nn.init.zeros_(self.linear.weight)  # starts as the target's own next-token head, as Medusa's blocks
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        x = torch.cat([hidden] + [self.embeddings[tokens[:, j]] for j in range(self.known)], -1)
        return (hidden + F.silu(self.linear(x))) @ self.lm_head.t()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", help="a training data store (data.safetensors)")
    ap.add_argument("--head", type=int, default=0, help="which head, 0-based (0 = head 1: the token after next)")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--splits", nargs="+", default=["answers_mtbench", "answers_humaneval"])
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    target, _ = load_target()
    embeddings = target.get_input_embeddings().weight.detach()
    full = target.get_output_embeddings().weight.detach()
    splits = load_splits(Path(args.data))
    labelled = {}
    for name in ["train", *args.splits]:
        rows, labels = head_labels(splits[name].tokens, splits[name].lengths, HEADS)
        labelled[name] = splits[name].hidden[rows], labels
    token_ids = draft_vocabulary(labelled["train"][1], full.shape[0], args.draft_vocab)
    lm_head = full if token_ids is None else full[token_ids].contiguous()
    i = args.head

    def split(name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        hidden, tokens = with_previous_token(*labelled[name])
        ok = (tokens[:, 1: i + 2] != IGNORE).all(1)  # the label and the path before it
        target_index = to_draft_labels(tokens[:, 1 + i], token_ids, full.shape[0])
        return hidden[ok], tokens[ok], target_index[ok]

    train_h, train_t, train_y = split("train")
    trainable = (train_y != IGNORE).nonzero().squeeze(1)
    print(f"head {i} (predicts token s+{i + 2} of the answer), {len(trainable)} training rows, "
          f"{args.steps} steps of {args.batch}")
    for known in (0, i + 1):
        torch.manual_seed(0)
        head = Head(full.shape[1], known, embeddings, lm_head)
        optimizer = torch.optim.AdamW(head.parameters(), lr=args.lr)
        started = time.perf_counter()
        for step in range(args.steps):
            idx = trainable[torch.randint(len(trainable), (args.batch,))]
            for group in optimizer.param_groups:
                group["lr"] = args.lr * min(1.0, (step + 1) / 20) * (1 - step / args.steps)
            loss = F.cross_entropy(head(train_h[idx], train_t[idx]), train_y[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        name = "medusa" if known == 0 else f"token-aware ({known} known)"
        scores = []
        with torch.no_grad():
            for s in args.splits:
                h, t, y = split(s)
                top = head(h, t).topk(5, -1).indices
                scores.append(f"{s} top-1 {(top[:, 0] == y).float().mean():.3f} "
                              f"top-5 {(top == y[:, None]).any(1).float().mean():.3f} (n={len(y)})")
        print(f"{name:<24} {'; '.join(scores)}; {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
