"""A preallocated, per-row static KV cache, addressed by slot.

Layout: row b of the batch holds ``pad[b]`` left-padding slots, then its prompt, then its generated
tokens; ``lengths[b]`` counts the *committed* slots (padding included). A forward pass writes its T new
tokens at slots ``lengths[b] .. lengths[b] + T - 1`` without committing them; the decode loop then
commits only what verification kept. Rolling back rejected draft tokens is therefore a pointer move:
nothing is copied and the next forward overwrites the stale slots. For token trees, :meth:`compact`
gathers the accepted path into contiguous slots before committing.

All bookkeeping is on-device tensors of fixed shape, so a step can be captured by CUDA graphs /
``torch.compile`` later (the optional ``kv_len`` bound is the one host-side value, for CPU speed; off the CPU it
is ignored, see :meth:`KVCache.key_length`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class KVCache:
    keys: list[torch.Tensor]  # per layer [B, H_kv, S, D]
    values: list[torch.Tensor]  # per layer [B, H_kv, S, D]
    lengths: torch.Tensor  # [B] long: committed slots, left padding included
    pad: torch.Tensor  # [B] long: left-padding slots at the start of each row
    # [2, L, B, H_kv, S, D] when ``keys``/``values`` are views of one tensor (as allocated): :meth:`compact` then
    # moves every layer's slots in one gather and one scatter instead of four operations per layer
    stacked: torch.Tensor | None = None

    @classmethod
    def allocate(
        cls,
        num_layers: int,
        batch_size: int,
        num_kv_heads: int,
        capacity: int,
        head_dim: int,
        pad: torch.Tensor,  # [B] long
        *,
        dtype: torch.dtype,
        device: torch.device,
    ) -> "KVCache":
        stacked = torch.zeros(2, num_layers, batch_size, num_kv_heads, capacity, head_dim, dtype=dtype, device=device)
        return cls(
            keys=[stacked[0, i] for i in range(num_layers)],  # views one by one (unbind's may not be written to
            values=[stacked[1, i] for i in range(num_layers)],  # in place outside the no_grad mode they came from)
            lengths=torch.zeros(batch_size, dtype=torch.long, device=device),
            pad=pad.to(device=device, dtype=torch.long),
            stacked=stacked,
        )

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    def write(
        self,
        layer: int,
        k_new: torch.Tensor,  # [B, H_kv, T, D]
        v_new: torch.Tensor,  # [B, H_kv, T, D]
        kv_len: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # keys, values [B, H_kv, kv_len, D]
        """Write T uncommitted tokens after each row's committed slots; return the attendable slots."""
        b, h, t, d = k_new.shape
        slots = self.lengths[:, None] + torch.arange(t, device=k_new.device)  # [B, T]
        index = slots[:, None, :, None].expand(b, h, t, d)
        # values only, never autograd history: the layers are views of one tensor, which in-place writes of
        # tensors that require grad would turn into a graph (or an error) across layers and steps
        self.keys[layer].scatter_(2, index, k_new.detach())
        self.values[layer].scatter_(2, index, v_new.detach())
        kv_len = self.key_length(kv_len)
        return self.keys[layer][:, :, :kv_len], self.values[layer][:, :, :kv_len]

    def key_length(self, kv_len: int | None) -> int:
        """The slots a forward attends over: the ``kv_len`` bound on CPU (fewer slots, less work), the whole cache
        elsewhere. On a GPU each new key length makes SDPA choose and plan its kernel anew: cuDNN attention plans
        per shape, and an EAGLE draft step attending over a length that grew each step spent ~80 ms planning in
        bf16 on an H200 (2026-11-26; 2-4 ms with one length), while the masked slots cost little."""
        if kv_len is None or self.keys[0].device.type != "cpu":
            return self.capacity
        return min(kv_len, self.capacity)

    def positions(self, offsets: torch.Tensor) -> torch.Tensor:  # offsets [T] → position ids [B, T]
        """Position ids of new tokens placed ``offsets`` after each row's committed tokens (pads excluded)."""
        return (self.lengths - self.pad)[:, None] + offsets[None, :]

    def attention_mask(
        self,
        num_new: int,
        kv_len: int | None = None,
        tree_mask: torch.Tensor | None = None,  # [T, recent + T] bool: new token i may attend to column j
        recent: int = 0,
    ) -> torch.Tensor:  # [B, 1, T, kv_len] bool
        """Which slots each new token attends to: its row's committed non-pad slots, plus the new
        tokens allowed by ``tree_mask`` (causal when None). A token always sees itself, so a query
        sitting on a padding slot never has an empty row (its output is unused). With ``recent`` = R > 0
        the mask decides the last R committed slots too: column j < R is slot ``lengths - R + j``, column
        R + j new token j (an EAGLE tree's drafted entries, of which each new token sees its ancestors)."""
        if recent and tree_mask is None:
            raise ValueError("recent slots need a tree_mask saying which new tokens see them")
        kv_len = self.key_length(kv_len)
        device = self.lengths.device
        slot = torch.arange(kv_len, device=device)  # [S]
        rel = slot[None, :] - self.lengths[:, None]  # [B, S]: slot position relative to the new block
        real = slot[None, :] >= self.pad[:, None]  # [B, S]: not a padding slot
        committed = real & (rel < -recent)  # [B, S]
        q = torch.arange(num_new, device=device)  # [T]
        in_block = real & (rel >= -recent) & (rel < num_new)  # [B, S]
        if tree_mask is None:
            new = in_block[:, None, :] & (rel[:, None, :] <= q[None, :, None])  # [B, T, S]
        else:
            gathered = tree_mask[:, (rel + recent).clamp(0, recent + num_new - 1)]  # [T, B, S]
            new = in_block[:, None, :] & gathered.permute(1, 0, 2)
        itself = rel[:, None, :] == q[None, :, None]  # [B, T, S]
        return (committed[:, None, :] | new | itself).unsqueeze(1)

    def within_window(self, mask: torch.Tensor, window: int, depths: torch.Tensor | None = None) -> torch.Tensor:
        """``mask`` [B, 1, T, S] (from :meth:`attention_mask`) for a sliding-window layer: a new token at position
        p sees only keys at positions > p - ``window`` (transformers' sliding window). Committed slots hold
        positions slot - pad; the new tokens theirs by ``depths`` [T] (a tree's offsets; None = 0..T-1), so the
        window holds exactly past its length, and for tree nodes as for a chain."""
        t, s = mask.shape[2], mask.shape[3]
        device = mask.device
        offsets = torch.arange(t, device=device) if depths is None else depths
        first = self.lengths - self.pad  # [B]: the position of the first new token
        slot = torch.arange(s, device=device)  # [S]
        rel = slot[None, :] - self.lengths[:, None]  # [B, S]
        key_positions = torch.where((rel >= 0) & (rel < t), first[:, None] + offsets[rel.clamp(0, t - 1)],
                                    slot[None, :] - self.pad[:, None])  # [B, S]
        query_positions = first[:, None] + offsets[None, :]  # [B, T]
        return mask & (key_positions[:, None, :] > query_positions[:, :, None] - window).unsqueeze(1)

    def commit(self, num_tokens: torch.Tensor) -> None:  # num_tokens [B] long
        """Keep the first ``num_tokens[b]`` slots written by the last forward of each row."""
        self.lengths += num_tokens

    def rollback_to(self, lengths: torch.Tensor) -> None:  # lengths [B] long
        """Forget every slot at or beyond ``lengths[b]``: a pointer move, nothing is copied."""
        self.lengths.copy_(lengths)

    def compact(self, path: torch.Tensor, num_tokens: torch.Tensor) -> None:
        """Commit a tree's accepted path: move the uncommitted slots ``lengths + path[b, j]`` to
        ``lengths + j`` for j < P (:meth:`move_path`), then commit ``num_tokens[b]`` of them.

        path: [B, P] long, offsets into the last forward's new tokens, in the accepted order;
        num_tokens: [B] long, how many entries of each row's path are kept.
        """
        self.move_path(path)
        self.commit(num_tokens)

    def move_path(self, path: torch.Tensor) -> None:
        """Move the uncommitted slots ``lengths + path[b, j]`` to ``lengths + j`` for j < P (path [B, P] long), nothing
        committed: device ops of fixed shapes, no host read, which a verification's graph captures after its verdict
        (run again, after the forward rewrote the step's slots, it moves the same)."""
        b, p = path.shape
        src = self.lengths[:, None] + path  # [B, P]
        dst = self.lengths[:, None] + torch.arange(p, device=path.device)  # [B, P]
        if self.stacked is not None:
            two, layers, _, h, _, d = self.stacked.shape
            shape = (two, layers, b, h, p, d)
            moved = self.stacked.gather(4, src[None, None, :, None, :, None].expand(shape))
            self.stacked.scatter_(4, dst[None, None, :, None, :, None].expand(shape), moved)
            return
        for layer in range(len(self.keys)):
            for store in (self.keys[layer], self.values[layer]):
                h, d = store.shape[1], store.shape[3]
                moved = store.gather(2, src[:, None, :, None].expand(b, h, p, d))
                store.scatter_(2, dst[:, None, :, None].expand(b, h, p, d), moved)
