"""The decode loop: speculative generation and its reference, plain autoregressive generation.

Both run on the same static-cache path (:mod:`specdec.models.cache`, :mod:`specdec.models`); plain decoding is
speculative decoding with a drafter that proposes nothing, so the two differ only in the drafts. One
step: the drafter proposes up to K tokens, the target scores [last token, drafts] in one forward, the
acceptance rule's ``chain`` (:class:`specdec.verify.AcceptanceRule`; the exact one unless told otherwise)
keeps a prefix and draws the recovered/bonus token, and the cache commits what was kept (a pointer move).
The loop syncs with the host once per step, to learn what each row emitted (EOS, ``max_new_tokens``,
host-side drafters and stats need it). Plain decoding on a GPU (and a drafter that proposes from the device's state
alone) does not wait for that read: each step's kept counts are worked out and committed on the device, in the
step's graph, and the host reads a step's tokens after it has launched the next one (:func:`_pipelined_steps`), so
the host's work of a step runs while the GPU computes the next.

A proposal may instead be a token tree (``Proposal.tree``, e.g. Medusa's): the target then scores
[last token, N nodes] under the tree's attention mask, the same rule's ``tree`` walks it, and the cache
gathers the accepted path into contiguous slots (:meth:`specdec.models.cache.KVCache.compact`; where the verdict
replays with the forward, the path is moved there too, after it: :func:`_path_moved`).

Where the target replays graphs (a GPU), a step's verdict is captured with its forward (:func:`verify_step`):
greedy from the argmax, sampled under the exact rule from uniforms drawn in one op before the replay (as the eager
rule draws them), so a step launches one graph and its sampled verdict no op of its own.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch

from specdec.decode.metrics import DecodeStats
from specdec.drafters.base import DecodeState, Drafter, NoDrafter, Proposal, graph_runners
from specdec.models import as_decoder
from specdec.models.cache import KVCache
from specdec.models.graphs import forward_then, replays_graphs
from specdec.models.loading import stop_token_ids
from specdec.verify import (EXACT, AcceptanceRule, ExactRule, Tree, accepted_path, emitted_tokens, greedy_chain,
                            greedy_tree)
from specdec.verify.sampling import SamplingParams, logits_to_probs, sample


@dataclass
class GenerationOutput:
    """What :func:`speculative_generate` and :func:`autoregressive_generate` return.

    ``sequences``: one list of token ids per row of ``input_ids``, holding only the tokens generated (the prompt
    and its padding left out), up to ``max_new_tokens`` of them, ending with the EOS token where one was emitted;
    ``tokenizer.decode(out.sequences[0])`` is row 0's answer. Rows may differ in length. ``stats``: the
    generation's counts and times (:class:`~specdec.decode.metrics.DecodeStats`: α ``acceptance_rate``, τ
    ``mean_accepted_length``, ``tokens_per_second``, ...)."""

    sequences: list[list[int]]  # per row: the new tokens, without the prompt (EOS included if emitted)
    stats: DecodeStats


class _PhaseTimer:
    """The time each phase of a generation (prefill, drafting, verification) takes, added to ``stats``' field of its
    name. On CUDA a phase is timed by two events on the stream, read once when the generation ends (:meth:`close`),
    so that timing adds no host synchronisation to a step; elsewhere by the host's clock."""

    _free: dict[torch.device, list] = {}  # per device, events of closed timers, reused (making one is a driver call)

    def __init__(self, stats: DecodeStats, device: torch.device):
        self.stats, self.cuda = stats, device.type == "cuda"
        self.free = self._free.setdefault(device, [])
        self.pending: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []

    def _event(self):
        return self.free.pop() if self.free else torch.cuda.Event(enable_timing=True)

    @contextmanager
    def __call__(self, attr: str) -> Iterator[None]:
        if self.cuda:
            start, end = self._event(), self._event()
            start.record()
            yield
            end.record()
            self.pending.append((attr, start, end))
            return
        start = time.perf_counter()
        yield
        setattr(self.stats, attr, getattr(self.stats, attr) + time.perf_counter() - start)

    def close(self) -> None:
        """Add the events' times to the stats (one synchronisation, at the end)."""
        if self.pending:
            self.pending[-1][2].synchronize()
        for attr, start, end in self.pending:
            setattr(self.stats, attr, getattr(self.stats, attr) + start.elapsed_time(end) / 1000)
            self.free += (start, end)
        self.pending.clear()


def _capture_times(decoder, drafter: Drafter) -> tuple[float, float]:
    """Seconds the target's and the drafter's graphs have spent capturing so far (0 where forwards run eagerly)."""
    return (getattr(decoder, "capture_time_s", 0.0),
            sum(runner.capture_time_s for runner in graph_runners(drafter)))


def _leave_out_captures(stats: DecodeStats, before: tuple[float, float], after: tuple[float, float]) -> None:
    """Graph captures during a generation are one-off costs: their time goes to ``capture_time_s``, out of the
    target's, the drafter's and the wall time (each capture ran inside the verify or the drafting it serves)."""
    target, drafter = after[0] - before[0], after[1] - before[1]
    stats.target_time_s -= target
    stats.drafter_time_s -= drafter
    stats.wall_time_s -= target + drafter
    stats.capture_time_s += target + drafter


def _eos_ids(target: torch.nn.Module, eos_token_id: int | Sequence[int] | None) -> set[int]:
    if eos_token_id is None:
        return set(stop_token_ids(target))  # the model's own (generation config, else config)
    return {int(eos_token_id)} if isinstance(eos_token_id, int) else {int(t) for t in eos_token_id}


def _check_prompt(input_ids: torch.Tensor, attention_mask: torch.Tensor | None, device: torch.device,
                  vocab_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``input_ids`` [B, S] on ``device`` and its left padding per row [B], or a ValueError naming what is wrong."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dtype.is_floating_point or input_ids.is_complex():
        raise ValueError(f"input_ids must be a tensor of token ids (integers), got "
                         f"{getattr(input_ids, 'dtype', type(input_ids).__name__)}")
    input_ids = input_ids.to(device)
    attention_mask = None if attention_mask is None else attention_mask.to(device)
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
        attention_mask = None if attention_mask is None else attention_mask.reshape(1, -1)
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must be [batch, seq_len] with seq_len >= 1, got shape {list(input_ids.shape)}")
    if attention_mask is None:
        if input_ids.shape[0] > 1:
            raise ValueError("batch > 1 needs an attention_mask (prompts left-padded to one length)")
        attention_mask = torch.ones_like(input_ids)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask shape {list(attention_mask.shape)} differs from input_ids {list(input_ids.shape)}")
    mask = attention_mask.bool()
    if vocab_size is not None:  # ids the embedding cannot look up (padding slots included: they are embedded too)
        outside = (input_ids < 0) | (input_ids >= vocab_size)
        if bool(outside.any()):  # one sync a generation, before its steps
            bad = input_ids[outside].unique()[:5].tolist()
            raise ValueError(f"input_ids hold token ids outside the target's vocabulary of {vocab_size} (0 .. "
                             f"{vocab_size - 1}): {bad}; encode the prompt with the target's own tokenizer (and "
                             f"pad with its pad_token_id)")
    pad = (~mask).sum(1)
    left_padded = mask == (torch.arange(mask.shape[1], device=mask.device)[None] >= pad[:, None])
    if not bool(left_padded.all()):
        raise ValueError("attention_mask must be left-padded (zeros, then ones); tokenize with padding_side='left'")
    if bool((pad == mask.shape[1]).any()):
        raise ValueError("a row of attention_mask is all zeros: every prompt needs at least one token")
    return input_ids, pad


@dataclass
class StepResult:
    """One verify step's outcome, still on the device (the loop reads it back once)."""

    num_accepted: torch.Tensor  # [B] long: accepted drafts per row
    next_tokens: torch.Tensor  # [B] long: the recovered or bonus token
    emitted: torch.Tensor  # [B, E] long: the accepted drafts, then next_tokens (E = K'+1 chain, D+1 tree)
    path: torch.Tensor | None  # [B, D+1] long: block positions of the accepted path (trees); None: a chain
    hidden: torch.Tensor  # [B, H]: the target's hidden state where next_tokens was predicted
    features: torch.Tensor | None = None  # [B, E, F]: the drafter's feature layers along the kept positions
    moved: bool = False  # a tree's accepted path already moved into place in the target's cache (KVCache.move_path)
    committed: tuple[torch.Tensor, ...] = ()  # what the step's commit on the device returned (_DeviceCommit)


def _check_max_new_tokens(max_new_tokens: int) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")


def _check_capacity(decoder, prompt_len: int, max_new_tokens: int, k: int) -> int:
    capacity = prompt_len + max_new_tokens + k + 1
    if capacity > decoder.max_positions:
        raise ValueError(
            f"prompt ({prompt_len} tokens) + max_new_tokens ({max_new_tokens}) + lookahead ({k + 1}) = {capacity} "
            f"exceeds the model's context of {decoder.max_positions} positions; shorten the prompt or max_new_tokens"
        )
    return capacity


@dataclass
class _Request:
    """One generation's settings, checked once (:func:`_generate`'s first phase): what its other phases read."""

    input_ids: torch.Tensor  # [B, S] long, on the decoder's device, left-padded
    pad: torch.Tensor  # [B] long: left-padding slots per row
    host_pad: list[int]  # the same on the host
    capacity: int  # slots per row: prompt + max_new_tokens + one step's lookahead
    params: SamplingParams
    generator: torch.Generator | None
    eos: set[int]
    max_new_tokens: int
    capture: tuple[int, ...]  # the drafter's feature layers (empty: none)


def _prefill(decoder, request: _Request):  # -> cache, first [B], hidden [B, H], features [B, S, F] or None
    """The whole prompt goes into the cache; its last position gives the first new token (the LM head runs
    on that position only). The drafter's feature layers come back at every prompt position."""
    input_ids, params = request.input_ids, request.params
    batch, prompt_len = input_ids.shape
    cache = decoder.new_cache(batch, request.capacity, request.pad)
    logits, hidden, *features = decoder(input_ids, cache, kv_len=prompt_len, last_only=True, capture=request.capture)
    cache.commit(torch.full((batch,), prompt_len, device=input_ids.device))
    first = sample(logits_to_probs(logits[:, -1], params.temperature, params.top_k, params.top_p), request.generator)
    return cache, first, hidden[:, -1], features[0] if features else None


def _initial_state(decoder, request: _Request, width: int, first: torch.Tensor, first_host: list[int],
                   hidden: torch.Tensor, features: torch.Tensor | None) -> DecodeState:
    """The state after the prefill: the prompt and its first new token, ``first`` ([B]; ``first_host`` on the host),
    predicted from ``hidden`` ([B, H]); ``features``: the drafter's feature layers at the prompt's positions.
    ``width``: ``seq``'s slots, the target cache's (a graphed decoder's kept cache has the same width generation after
    generation, so a drafter's graphs that read ``seq`` are not captured again for each prompt's length)."""
    input_ids = request.input_ids
    batch, prompt_len = input_ids.shape
    seq = torch.zeros(batch, width, dtype=torch.long, device=input_ids.device)
    seq[:, :prompt_len] = input_ids
    seq[:, prompt_len] = first
    return DecodeState(
        seq=seq, seq_lens=torch.full((batch,), prompt_len + 1, device=input_ids.device), pad=request.pad,
        last_tokens=first, last_hidden=hidden, num_accepted=None,
        tokens=[p[n:] + [t] for p, n, t in zip(input_ids.tolist(), request.host_pad, first_host)],
        active=[t not in request.eos and request.max_new_tokens > 1 for t in first_host],
        max_seq_len=prompt_len + 1, capacity=request.capacity, vocab_size=decoder.vocab_size,
        sampling=request.params, generator=request.generator, features=features,
    )


def verify_step(decoder, cache, state: DecodeState, proposal: Proposal, rule: AcceptanceRule,
                capture: tuple[int, ...] = (), commit: "_DeviceCommit | None" = None) -> StepResult:
    """The target scores [last token, drafts] in one forward (under the tree's mask for a tree) and the rule
    keeps what it accepts. Device work only: nothing is read back to the host here. ``capture``: the
    drafter's feature layers, returned along the kept positions. Where the target replays graphs the forward and the
    verdict are one graph replay: greedy (:func:`_greedy_verdict`), and sampled under the exact rule
    (:func:`_sampled_verdict`, over uniforms drawn before it, the tokens the eager rule draws), each one kernel where
    the backend has step kernels (a GPU's, :func:`_step_kernels`); greedy needs no graphs to skip the [B, K'+1, V]
    distributions. ``commit``: the step then kept on the device (:class:`_DeviceCommit`), in
    the same replay where the verdict replays with the forward; what it returns is in ``StepResult.committed``."""
    params, tree = state.sampling, proposal.tree
    kv_len = state.max_seq_len + proposal.tokens.shape[1]
    greedy = params.greedy and isinstance(rule, ExactRule)  # the one-hot case from the argmax alone, no [B, K'+1, V]
    kernels = _step_kernels(decoder, state.seq.device) if isinstance(rule, ExactRule) else None
    if greedy and tree is None and proposal.tokens.shape[1] == 0:  # nothing drafted: the argmax, nothing to walk
        return _replayed(decoder, _plain_verdict, _plain_step, "plain", state.last_tokens[:, None], cache, None,
                         commit, kv_len=kv_len, capture=capture)
    block = torch.cat([state.last_tokens[:, None], proposal.tokens], 1)  # [B, K'+1]
    children = () if tree is None else (tree.children,)
    # sampled, the exact rule replays with the forward; another rule (lossy, a planted bug) runs eagerly after it
    if greedy or (type(rule) is ExactRule and replays_graphs(decoder, cache)):
        if greedy:
            then, extra = functools.partial(_greedy_verdict, kernels, tree), children
        else:  # sampled: the uniforms drawn first, in one op, as the eager rule draws them
            drafted = () if proposal.probs is None else (proposal.probs,)
            then = functools.partial(_sampled_verdict, kernels, tree, params, bool(drafted))
            extra = (rule.draw(proposal.tokens, tree, state.generator),) + children + drafted
        key = _verdict_key(tree, None if greedy else params, kernels)
        if tree is not None:  # the accepted path moved into its slots after the verdict, in the same replay
            then = functools.partial(_path_moved, cache, kernels, then)
        return _replayed(decoder, then, functools.partial(_verdict_step, tree), key, block, cache, tree, commit,
                         kv_len=kv_len, extra=extra, tree_mask=None if tree is None else tree.mask,
                         depths=None if tree is None else tree.depths, capture=capture)
    logits, hidden, *features = decoder(block, cache, kv_len=kv_len, tree_mask=None if tree is None else tree.mask,
                                        depths=None if tree is None else tree.depths, capture=capture)
    target_probs = logits_to_probs(logits, params.temperature, params.top_k, params.top_p)  # [B, K'+1, V]
    if tree is None:
        num_accepted, next_tokens = rule.chain(proposal.tokens, proposal.probs, target_probs, state.generator)
        step = _kept(proposal.tokens, num_accepted, next_tokens, None, hidden, features)
    else:
        nodes, num_accepted, next_tokens = rule.tree(tree, proposal.tokens, proposal.probs, target_probs,
                                                     state.generator)
        step = _kept(proposal.tokens, num_accepted, next_tokens, nodes, hidden, features)
    return step if commit is None else dataclasses.replace(step, committed=commit(step))


def _plain_step(outputs: tuple[torch.Tensor, ...]) -> StepResult:
    """:func:`_plain_verdict`'s outputs as a step: nothing accepted, the argmax emitted."""
    next_tokens, hidden, *features = outputs
    return StepResult(torch.zeros_like(next_tokens), next_tokens, next_tokens[:, None], None, hidden, *features[:1])


def _verdict_step(tree: Tree | None, outputs: tuple[torch.Tensor, ...]) -> StepResult:
    """A verdict's outputs (:func:`_step_outputs`) as a step; a tree's accepted path moved in the same replay
    (:func:`_path_moved`)."""
    num_accepted, next_tokens, emitted, path, hidden, *kept = outputs
    return StepResult(num_accepted, next_tokens, emitted, None if tree is None else path, hidden,
                      kept[0] if kept else None, moved=tree is not None)


def _replayed(decoder, then: Callable[..., tuple[torch.Tensor, ...]], step_of: Callable[..., StepResult], key: Any,
              ids: torch.Tensor, cache, tree: Tree | None, commit: "_DeviceCommit | None", **forward: Any
              ) -> StepResult:
    """The forward over ``ids`` and ``then`` after it (:func:`~specdec.models.graphs.forward_then`: one replay where
    the target replays graphs), as a step (``step_of`` its outputs; ``tree``: the proposal's); with ``commit``, the
    step is committed in the same replay, which then returns the step's tensors themselves (:func:`_step_outputs`;
    no copies: the loop is done with them before the next replay) and what the commit returns."""
    if commit is None:
        return step_of(forward_then(decoder, then, key, ids, cache, **forward))
    outputs = forward_then(decoder, functools.partial(_then_committed, then, step_of, commit), (key, commit.key),
                           ids, cache, advances=commit.advances, fresh=False, **forward)
    return dataclasses.replace(_verdict_step(tree, outputs[:-commit.outputs]), committed=outputs[-commit.outputs:])


def _then_committed(then: Callable[..., tuple[torch.Tensor, ...]], step_of: Callable[..., StepResult],
                    commit: "_DeviceCommit", *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``then``'s step (``step_of`` its outputs), committed on the device: the step's tensors
    (:func:`_step_outputs`), then what ``commit`` returns."""
    step = step_of(then(*args))
    return _step_outputs(step) + commit(step)


def _kept(drafts: torch.Tensor, num_accepted: torch.Tensor, next_tokens: torch.Tensor, nodes: torch.Tensor | None,
          hidden: torch.Tensor, features: list[torch.Tensor]) -> StepResult:
    """A verdict (``nodes`` [B, D]: a tree's accepted nodes; None: a chain) as what each row keeps: the emitted tokens,
    the accepted path in the block (trees), the hidden state and feature layers where the next token was predicted."""
    if nodes is None:
        drafted, path, at = drafts, None, num_accepted  # [B, K']
    else:
        drafted = drafts.gather(1, nodes.clamp(min=0))  # [B, D]: the accepted path's tokens
        path = accepted_path(nodes)  # [B, D+1] in block
        at = path.gather(1, num_accepted[:, None])[:, 0]  # [B] block position of the path's end
    emitted = emitted_tokens(drafted, num_accepted, next_tokens)  # [B, K'+1] (chain) or [B, D+1] (tree)
    rows = torch.arange(drafts.shape[0], device=drafts.device)
    return StepResult(num_accepted, next_tokens, emitted, path, hidden[rows, at], _kept_features(features, path))


def _kept_features(features: list[torch.Tensor], path: torch.Tensor | None) -> torch.Tensor | None:
    """The drafter's feature layers [B, K'+1, F] at the kept positions ([B, E, F]: a tree's along its ``path``)."""
    if not features:
        return None
    return features[0] if path is None else features[0].gather(1, path[..., None].expand(-1, -1, features[0].shape[-1]))


def _verdict_key(tree: Tree | None, params: SamplingParams | None = None, kernels: Any = None) -> tuple:
    """What fixes a verdict in a graph beside its tensors: greedy or the sampling settings (``params``), in one kernel
    or not (``kernels``), and a tree's shape (a graph bakes in the walk's depth)."""
    return "greedy" if params is None else ("sampled", params), kernels is not None, \
        None if tree is None else tree.shape_key


def _step_kernels(decoder, device: torch.device):
    """The Triton kernels that take a step's greedy verdict and its commit on ``device`` (``Backend.step_kernels``:
    a GPU's), or None (torch's ops)."""
    backend = getattr(decoder, "backend", None)
    return None if backend is None else backend.step_kernels(device)


def _step_outputs(step: StepResult) -> tuple[torch.Tensor, ...]:
    """A verdict as a graph's outputs: num_accepted, next_tokens, emitted, the accepted path (a chain: num_accepted
    again, unread), the hidden state where the next token was predicted, the kept feature layers where captured."""
    path = step.num_accepted if step.path is None else step.path
    return (step.num_accepted, step.next_tokens, step.emitted, path, step.hidden) + (
        () if step.features is None else (step.features,))


def _greedy_verdict(kernels, tree: Tree | None, block: torch.Tensor, *rest: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The greedy verdict of a forward over ``block`` [B, K'+1] (``rest``: a tree's children [N+1, W], then the
    forward's logits, hidden states and feature layers), as tensors (one graph's outputs, :func:`_step_outputs`):
    through ``kernels``' ``greedy_verdict`` where given (:func:`_step_kernels`), else torch's ops."""
    if tree is not None:
        tree = dataclasses.replace(tree, children=rest[0])  # the children copied into the graph's input
        rest = rest[1:]
    logits, hidden, *features = rest
    best = logits.argmax(-1)  # [B, K'+1]
    if kernels is not None:
        return _kernel_verdict(kernels.greedy_verdict(best, block, None if tree is None else tree.children,
                                                      None if tree is None else tree.max_depth), hidden, features)
    if tree is None:
        step = _kept(block[:, 1:], *greedy_chain(block[:, 1:], best), None, hidden, features)
    else:
        nodes, num_accepted, next_tokens = greedy_tree(tree, block[:, 1:], best)
        step = _kept(block[:, 1:], num_accepted, next_tokens, nodes, hidden, features)
    return _step_outputs(step)


def _kernel_verdict(verdict: tuple[torch.Tensor, ...], hidden: torch.Tensor, features: list[torch.Tensor]
                    ) -> tuple[torch.Tensor, ...]:
    """A verdict kernel's outputs (``greedy_verdict``'s or ``sampled_verdict``'s: num_accepted, next_tokens, emitted,
    a tree's path, the block position where the next token was predicted) as :func:`_step_outputs`, with the hidden
    state there and the feature layers along the kept positions."""
    num_accepted, next_tokens, emitted, path, at = verdict
    hidden = hidden.gather(1, at[:, None, None].expand(-1, 1, hidden.shape[-1]))[:, 0]
    return _step_outputs(StepResult(num_accepted, next_tokens, emitted, path, hidden, _kept_features(features, path)))


def _path_moved(cache: KVCache, kernels, then: Callable[..., tuple[torch.Tensor, ...]], *args: torch.Tensor
                ) -> tuple[torch.Tensor, ...]:
    """``then``'s verdict of a tree (:func:`_step_outputs`), its accepted path then moved into the slots after the
    committed ones in ``cache`` (:meth:`KVCache.move_path`; ``kernels``' ``move_path``, one kernel, where given): in the
    graph that replays the forward and the verdict, so that committing the step is a pointer move
    (``StepResult.moved``)."""
    outputs = then(*args)
    if kernels is not None and cache.stacked is not None:  # in one kernel (:func:`_step_kernels`)
        kernels.move_path(cache.stacked, cache.lengths, outputs[3])
    else:
        cache.move_path(outputs[3])
    return outputs


def _sampled_verdict(kernels, tree: Tree | None, params: SamplingParams, drafted: bool, block: torch.Tensor,
                     drawn: torch.Tensor, *rest: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The exact rule's sampled verdict of a forward over ``block`` [B, K'+1], in ops a graph captures with the
    forward: the uniforms ``drawn`` before it (:class:`~specdec.verify.ExactRule`'s, so the same tokens as the eager
    rule from the same generator), then in ``rest`` a tree's children [N+1, W], the drafts' q [B, K', V] where
    ``drafted`` (else one-hot), the forward's logits, hidden states and feature layers. Outputs as
    :func:`_greedy_verdict`'s. Through ``kernels``' ``sampled_verdict`` where given (:func:`_step_kernels`: any
    drafts, top-k and top-p), else torch's ops."""
    if tree is not None:
        tree = dataclasses.replace(tree, children=rest[0])
        rest = rest[1:]
    draft_probs = rest[0] if drafted else None
    logits, hidden, *features = rest[int(drafted):]
    if kernels is not None:
        return _kernel_verdict(kernels.sampled_verdict(logits, block, drawn, params.temperature,
                                                       None if tree is None else tree.children,
                                                       None if tree is None else tree.max_depth, top_k=params.top_k,
                                                       top_p=params.top_p, draft_probs=draft_probs), hidden, features)
    target_probs = logits_to_probs(logits, params.temperature, params.top_k, params.top_p)  # [B, K'+1, V]
    nodes, num_accepted, next_tokens = ExactRule.verdict(tree, block[:, 1:], draft_probs, target_probs, drawn)
    return _step_outputs(_kept(block[:, 1:], num_accepted, next_tokens, nodes, hidden, features))


def _plain_verdict(ids: torch.Tensor, logits: torch.Tensor, hidden: torch.Tensor, *features: torch.Tensor
                   ) -> tuple[torch.Tensor, ...]:
    """A greedy step with nothing drafted (plain decoding; a drafter that proposed nothing): the target's argmax
    after the last token, what the greedy chain rule gives over an empty chain, in one op instead of a dozen."""
    return (logits[:, 0].argmax(-1), hidden[:, 0]) + features[:1]


def _emit(state: DecodeState, out: list[list[int]], accepted: list[int], emitted: list[list[int]], eos: set[int],
          max_new_tokens: int) -> list[int]:
    """Host bookkeeping: append each active row's kept tokens (cut at EOS and at ``max_new_tokens``) to its
    output and to ``state.tokens``, retire finished rows; return how many tokens each row kept."""
    counts = []
    for b, row in enumerate(emitted):
        kept = row[: accepted[b] + 1] if state.active[b] else []
        kept = kept[: max_new_tokens - len(out[b])]
        for i, token in enumerate(kept):
            if token in eos:  # stop at EOS even in the middle of accepted drafts
                kept = kept[: i + 1]
                break
        out[b].extend(kept)
        state.tokens[b].extend(kept)
        counts.append(len(kept))
        if kept and (kept[-1] in eos or len(out[b]) >= max_new_tokens):
            state.active[b] = False
    return counts


class _Counts:
    """Each step's kept-token counts [B], sent to the device without a synchronisation: on CUDA through a pinned
    buffer and an asynchronous copy (a list copied from pageable memory waits for the device), which the next
    step's read of its results orders before the buffer is written again."""

    def __init__(self, batch_size: int, device: torch.device):
        self.device = device
        self.pinned = torch.empty(batch_size, dtype=torch.long, pin_memory=True) if device.type == "cuda" else None

    def send(self, counts: list[int]) -> torch.Tensor:  # -> [B] long on the device
        if self.pinned is None:
            return torch.tensor(counts, device=self.device)
        self.pinned.copy_(torch.tensor(counts))
        return self.pinned.to(self.device, non_blocking=True)


def _commit(cache, state: DecodeState, step: StepResult, count: torch.Tensor, max_seq_len: int) -> None:
    """Keep what each row emitted (``count`` [B] long on the device: kept tokens per row): on the device
    (:func:`_advance`), then the state moves to ``max_seq_len`` (the longest row's length, known on the host) and to
    the step's newest token and hidden state (:func:`_moved_on`)."""
    _advance(cache, state.seq, state.seq_lens, state.capacity, step, count)
    _moved_on(state, step, max_seq_len)


def _advance(cache, seq: torch.Tensor, seq_lens: torch.Tensor, capacity: int, step: StepResult, count: torch.Tensor
             ) -> None:
    """A step's device commit (``count`` [B] long: tokens kept per row): its emitted tokens written into ``seq`` [B, W]
    after ``seq_lens`` [B], which moves past the kept ones; the target's cache commits them (a pointer move for a
    chain, the accepted path gathered into contiguous slots for a tree)."""
    slots = (seq_lens[:, None] + torch.arange(step.emitted.shape[1], device=count.device)).clamp_(max=capacity - 1)
    seq.scatter_(1, slots, step.emitted)  # slots past count are rewritten before they are read
    if step.path is None or step.moved:
        cache.commit(count)  # keeps last token + accepted drafts (a tree's moved in place); finished rows stop moving
    else:
        cache.compact(step.path, count)
    seq_lens += count


def _moved_on(state: DecodeState, step: StepResult, max_seq_len: int) -> None:
    """The host's side of a commit: the bound on the rows' lengths, and the step's tensors the next one reads."""
    state.max_seq_len = max_seq_len
    state.last_tokens = step.next_tokens
    state.last_hidden = step.hidden
    state.num_accepted = step.num_accepted
    state.features = step.features


class _DeviceCommit:
    """A step kept on the device, for the loop that reads it back a step late (:func:`_pipelined_steps`): each row's
    kept count worked out there (:func:`_plain_counts`, :func:`_drafted_counts`; ``live``, ``left``, ``eos`` as
    theirs), then the step committed (:func:`_advance`). Called with the step by :func:`verify_step`, inside the
    step's graph where it replays one. Returns the rows the host reads back ([2 + E, B] long: the accepted drafts,
    the counts, the E emitted tokens position by position). ``kernels`` (:func:`_step_kernels`): all of it in their
    ``commit_step``, one kernel. ``advances``: what it moves in place (:class:`~specdec.models.graphs.Graphs` puts
    them back after a capture's warm-ups); ``key``: what a graph of it bakes in beside its tensors."""

    outputs = 1  # tensors returned

    def __init__(self, cache, state: DecodeState, live: torch.Tensor, left: torch.Tensor, eos: torch.Tensor,
                 kernels: Any = None):
        # writes clamped to seq's own width, not the generation's capacity: a graph bakes the number in, and is
        # replayed by generations of every capacity over the same kept seq
        self.cache, self.seq, self.seq_lens, self.capacity = cache, state.seq, state.seq_lens, state.seq.shape[1]
        self.live, self.left, self.eos, self.kernels = live, left, eos, kernels
        self.advances = (cache.lengths, state.seq_lens, live, left)

    @property
    def key(self) -> tuple:  # the counting read at the call (tests plant others)
        return "committed", _plain_counts, _drafted_counts, self.kernels is not None

    def __call__(self, step: StepResult) -> tuple[torch.Tensor]:
        if self.kernels is not None:
            if step.path is not None and not step.moved:
                self.cache.move_path(step.path)
            return (self.kernels.commit_step(step.num_accepted, step.emitted, self.live, self.left, self.eos,
                                             self.seq, self.seq_lens, self.cache.lengths, self.capacity),)
        counted = _plain_counts if step.emitted.shape[1] == 1 else _drafted_counts
        count = counted(step, self.live, self.left, self.eos)
        _advance(self.cache, self.seq, self.seq_lens, self.capacity, step, count)
        return (torch.cat([step.num_accepted[None], count[None], step.emitted.T]),)


PIPELINED_DEVICES = ("cuda",)  # where a step is read back one step late (tests add "cpu")


def _pipelined(decoder, drafter: Drafter) -> bool:
    """Whether :func:`_pipelined_steps` runs the loop: plain decoding (a :class:`NoDrafter` itself, not a subclass that
    observes the steps) or a drafter that proposes from the device's state alone (``traits.device_only``), on a
    device where the host's work can run beside the device's."""
    reads_device_only = type(drafter) is NoDrafter or drafter.traits.device_only
    return reads_device_only and decoder.device.type in PIPELINED_DEVICES


def _steps(decoder, cache, state: DecodeState, drafter: Drafter, request: _Request, stats: DecodeStats,
           timer: _PhaseTimer, out: list[list[int]], k: int, rule: AcceptanceRule) -> None:
    """The steps of a generation, each read back before the next (drafters read the tokens kept so far)."""
    sender = _Counts(len(out), state.seq.device)
    while any(state.active):
        with timer("drafter_time_s"):
            proposal = drafter.propose(state, k)
        _checked_width(proposal, drafter, k)
        with timer("target_time_s"):
            step = verify_step(decoder, cache, state, proposal, rule, request.capture)
            # the one sync per step: the accepted counts, the emitted tokens (and what the device counted, _device_rows)
            read = torch.cat([step.num_accepted[None], step.emitted.T] + _device_rows(proposal, len(out))).tolist()
            accepted, emitted = read[0], [list(row) for row in zip(*read[1:1 + step.emitted.shape[1]])]
        stats.target_forwards += 1
        proposed, depth = _proposed_and_depth(proposal, len(out), read[1 + step.emitted.shape[1]:])
        stats.record_step(proposed, accepted, state.active, depth)
        counts = _emit(state, out, accepted, emitted, request.eos, request.max_new_tokens)
        stats.new_tokens += sum(counts)
        _commit(cache, state, step, sender.send(counts),
                max(n + len(row) for n, row in zip(request.host_pad, state.tokens)))
        with timer("drafter_time_s"):
            drafter.observe(state)


def _device_rows(proposal: Proposal, batch: int) -> list[torch.Tensor]:
    """What a step's read carries of its proposal beyond the verdict, as rows [1, B]: the genuine drafts counted on the
    device (``proposal.counted``), then a device-chosen tree's levels (the acceptance by position counts only levels
    that exist); [] where the host knows both."""
    rows = [] if proposal.counted is None else [proposal.counted[None]]
    tree = proposal.tree
    return rows if tree is None or tree.known is not None else rows + [tree.levels.expand(1, batch)]


def _proposed_and_depth(proposal: Proposal, batch: int, read: list[list[int]]) -> tuple[list[int], int | None]:
    """:meth:`DecodeStats.record_step`'s genuine drafts per row and depth (None for a chain, a tree's levels), from the
    proposal and, where the device counted them, the step's ``read`` of :func:`_device_rows`."""
    rows = iter(read)
    width = proposal.tokens.shape[1]
    proposed = next(rows) if proposal.counted is not None else proposal.num_proposed or [width] * batch
    tree = proposal.tree
    return proposed, None if tree is None else tree.max_depth if tree.known is not None else next(rows)[0]


def _checked_width(proposal: Proposal, drafter: Drafter, k: int) -> int:
    width = proposal.tokens.shape[1]
    if width > k:
        raise RuntimeError(f"{type(drafter).__name__} proposed {width} tokens, more than k={k}")
    return width


class _Readback:
    """A step's results ([R, B] long) copied to the host without waiting for them: into one of two pinned buffers in
    turn (per R), an event recorded after the copy; :meth:`send` returns the function that waits for that event and
    reads them (on CPU the copy has already happened)."""

    def __init__(self, batch_size: int, device: torch.device):
        self.cuda, self.batch_size = device.type == "cuda", batch_size
        self.buffers: dict[int, list[torch.Tensor]] = {}
        self.events = [torch.cuda.Event() for _ in range(2)] if self.cuda else []  # made once: a driver call each
        self.turn = 0

    def send(self, rows: torch.Tensor):  # rows [R, B] long -> () -> list[list[int]]
        if rows.shape[0] not in self.buffers:
            self.buffers[rows.shape[0]] = [torch.empty(rows.shape[0], self.batch_size, dtype=torch.long,
                                                       pin_memory=self.cuda) for _ in range(2)]
        buffer = self.buffers[rows.shape[0]][self.turn]
        buffer.copy_(rows, non_blocking=self.cuda)
        if not self.cuda:
            self.turn ^= 1
            return buffer.tolist
        done = self.events[self.turn]
        done.record()
        self.turn ^= 1

        def read() -> list[list[int]]:
            done.synchronize()
            return buffer.tolist()

        return read


def _plain_counts(step: StepResult, live: torch.Tensor, left: torch.Tensor, eos: torch.Tensor) -> torch.Tensor:
    """A plain step's kept counts [B] worked out on the device, as :func:`_emit` does on the host: one token for
    each ``live`` row ([B] bool), which then stops at EOS (``eos`` [E] long) or when ``left`` ([B] long, tokens
    it may still emit) runs out; ``live`` and ``left`` move in place."""
    count = live.long()
    left -= count
    live &= ~(step.next_tokens[:, None] == eos).any(1) & (left > 0)
    return count


def _drafted_counts(step: StepResult, live: torch.Tensor, left: torch.Tensor, eos: torch.Tensor) -> torch.Tensor:
    """A speculative step's kept counts [B] worked out on the device, as :func:`_emit` does on the host: each ``live``
    row keeps its accepted drafts and the next token, cut after its first EOS and at ``left``; ``live`` and ``left``
    move in place (as :func:`_plain_counts`, which it equals for a step that drafted nothing)."""
    width = step.emitted.shape[1]
    position = torch.arange(width, device=left.device)
    stops = (step.emitted[..., None] == eos).any(-1)  # [B, E]
    first_stop = torch.where(stops, position, width).amin(1)  # [B]: the first EOS's place (width: none)
    count = torch.minimum(torch.minimum(step.num_accepted + 1, first_stop + 1), left) * live
    left -= count
    live &= (first_stop >= count) & (left > 0)
    return count


def _pipelined_steps(decoder, cache, state: DecodeState, drafter: Drafter, request: _Request, stats: DecodeStats,
                     timer: _PhaseTimer, out: list[list[int]], k: int, rule: AcceptanceRule) -> None:
    """The steps of plain decoding, or of a drafter that proposes from the device's state alone, each read back after
    the next is launched: the kept counts are worked out on the device and the step committed there
    (:class:`_DeviceCommit`; in the step's graph where the target replays graphs, so that a plain step is one replay,
    its last token copied in and its rows copied out), so the host's bookkeeping of a step runs while the device
    computes the next one. The
    host launches a step while a row it knows to be decoding may still emit after the step in flight; a step launched
    after every row's EOS (at most one a generation) is discarded unread, its time in the wall time (and, sampling,
    its draw from the generator). The host's bound on the rows' lengths grows by each step's width, clamped to the
    capacity (graphs attend over the whole cache). Outputs and counts are :func:`_steps`' (checked: the counts the
    device committed must be those the host emits)."""
    device = state.seq.device
    live = torch.tensor(state.active, device=device)
    left = torch.tensor([request.max_new_tokens - len(row) for row in out], device=device)
    eos = torch.tensor(sorted(request.eos), dtype=torch.long, device=device)
    if replays_graphs(decoder, cache):  # the commit replays in the step's graph, on memory kept across generations
        keep = decoder.graphs.keep
        state.seq, state.seq_lens = keep("seq", state.seq), keep("seq_lens", state.seq_lens)
        live, left, eos = keep("live", live), keep("left", left), keep("eos", eos)
    commit = _DeviceCommit(cache, state, live, left, eos, _step_kernels(decoder, device))
    readback, pending = _Readback(len(out), device), None
    while True:
        launched = None
        if any(on and request.max_new_tokens - len(row) > (pending is not None) for on, row in zip(state.active, out)):
            with timer("drafter_time_s"):
                proposal = drafter.propose(state, k)
            _checked_width(proposal, drafter, k)
            with timer("target_time_s"):
                step = verify_step(decoder, cache, state, proposal, rule, request.capture, commit)
            _moved_on(state, step, min(state.capacity, state.max_seq_len + step.emitted.shape[1]))
            rows = _device_rows(proposal, len(out))
            read = readback.send(torch.cat([step.committed[0]] + rows) if rows else step.committed[0])
            launched = (read, proposal, step.emitted.shape[1])
        if pending is not None:
            _read_step(*pending, state, out, request, stats)
        if launched is None:
            return
        pending = launched


def _read_step(read, proposal: Proposal, width: int, state: DecodeState, out: list[list[int]], request: _Request,
               stats: DecodeStats) -> None:
    """The host's bookkeeping of a step read back (``read`` gives its accepted drafts, the counts the device kept and
    the ``width`` emitted tokens, position by position, then :func:`_device_rows`'s; ``proposal`` as launched)."""
    rows = read()
    accepted, committed, emitted = rows[0], rows[1], rows[2:2 + width]
    if any(state.active):
        stats.target_forwards += 1
        proposed, depth = _proposed_and_depth(proposal, len(out), rows[2 + width:])
        stats.record_step(proposed, accepted, state.active, depth)
        counts = _emit(state, out, accepted, [list(row) for row in zip(*emitted)], request.eos,
                       request.max_new_tokens)
        stats.new_tokens += sum(counts)
    else:  # launched after every row's EOS: discarded
        counts = [0] * len(out)
    if counts != committed:
        raise RuntimeError(f"the device-side counts {committed} differ from the host's {counts}: the cache "
                           f"committed other tokens than the output keeps")


@torch.no_grad()
def _generate(target, drafter: Drafter, input_ids, attention_mask, *, k: int, max_new_tokens: int,
              params: SamplingParams, generator, eos_token_id, rule: AcceptanceRule) -> GenerationOutput:
    # 1) Validate, and size the caches: prompt + new tokens + one step's lookahead.
    decoder = as_decoder(target)
    device = decoder.device
    input_ids, pad = _check_prompt(input_ids, attention_mask, device, getattr(decoder, "vocab_size", None))
    _check_max_new_tokens(max_new_tokens)
    k = capped_lookahead(k, drafter.config, max_new_tokens)
    request = _Request(input_ids, pad, pad.tolist(), _check_capacity(decoder, input_ids.shape[1], max_new_tokens, k),
                       params, generator, _eos_ids(target, eos_token_id), max_new_tokens,
                       tuple(drafter.traits.feature_layers))
    stats = DecodeStats(k=k)
    timer = _PhaseTimer(stats, device)
    captured = _capture_times(decoder, drafter)
    wall_start = time.perf_counter()
    # 2) Prefill the prompt; the first token comes from its last position.
    with timer("prefill_time_s"):
        cache, first, hidden, features = _prefill(decoder, request)
    first_host = first.tolist()
    state = _initial_state(decoder, request, cache.capacity, first, first_host, hidden, features)
    out = [[t] for t in first_host]
    if drafter.runtime is not None:
        drafter.runtime.forwards = 0
    with timer("drafter_time_s"):
        drafter.start(state)
    # 3) Steps: propose -> verify (device) -> one sync -> emit (host) -> commit -> the drafter observes.
    steps = _pipelined_steps if _pipelined(decoder, drafter) else _steps
    steps(decoder, cache, state, drafter, request, stats, timer, out, k, rule)
    # 4) Totals.
    timer.close()
    stats.drafter_forwards = drafter.runtime.forwards if drafter.runtime is not None else 0
    stats.prefill_tokens = len(out)  # the first token of each row, from the prefill's last position
    stats.new_tokens += stats.prefill_tokens
    stats.wall_time_s = time.perf_counter() - wall_start
    _leave_out_captures(stats, captured, _capture_times(decoder, drafter))
    return GenerationOutput(sequences=out, stats=stats)


def _sampling(sampling: SamplingParams | None, temperature: float, top_k: int, top_p: float) -> SamplingParams:
    """The sampling settings given as one object, or as the loose keywords (not both)."""
    if sampling is None:
        return SamplingParams(temperature, top_k, top_p)
    if not isinstance(sampling, SamplingParams):
        raise TypeError(f"sampling must be a specdec.verify.sampling.SamplingParams, got {sampling!r}")
    if (temperature, top_k, top_p) != (0.0, 0, 1.0):
        raise ValueError(f"sampling={sampling} and temperature={temperature}, top_k={top_k}, top_p={top_p} both "
                         f"given: pass the settings one way")
    return sampling


def _resolve_rule(rule: AcceptanceRule | None, drafter: Drafter) -> AcceptanceRule:
    """``rule``, else the drafter's own (a lossy one it was built with), else the exact rule."""
    if rule is not None and not isinstance(rule, AcceptanceRule):
        raise TypeError(f"rule must be an acceptance rule (chain, tree and lossy, as specdec.verify.ExactRule), "
                        f"got {rule!r}; leave it None for the exact rule")
    own = drafter.traits.acceptance
    if rule is not None and own is not None and rule != own:
        raise ValueError(f"{type(drafter).__name__} was built with the lossy acceptance rule "
                         f"{own!r}, which rule={rule!r} would silently replace; build the drafter "
                         f"with the exact rule (e.g. drafter.acceptance=exact) to verify it with another")
    return rule or own or EXACT


def capped_lookahead(k: int, config: Any, max_new_tokens: int) -> int:
    """The lookahead a drafter built from ``config`` drafts with: a chain's, at most the drafts a generation of
    ``max_new_tokens`` can use (the first token comes from the prefill, each step's last from the target), so
    ``k=1000`` for 8 tokens drafts 7 a step, not 1000. A tree's ``k`` is its size, not its depth, and stays; so does
    the ``k`` of a drafter built by its constructor (``config`` None: nothing says it drafts chains)."""
    if k == 0 or config is None or config.get("tree"):
        return k
    return min(k, max(1, max_new_tokens - 1))


def _check_k(k, drafter: Drafter) -> int:
    if k is None:  # the lookahead of the config the drafter was built from (load_drafter, build_drafter)
        if drafter.config is None:
            raise ValueError(f"k (lookahead: draft tokens per target forward) is needed: this {type(drafter).__name__} "
                             f"was built by its constructor, not from a config (load_drafter) that names one")
        k = drafter.config.k
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k (lookahead: draft tokens per target forward) must be an integer >= 1, got {k!r}")
    return k


def speculative_generate(target, drafter: Drafter, input_ids: torch.Tensor, *, k: int | None = None,
                         max_new_tokens: int, sampling: SamplingParams | None = None,
                         temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                         generator: torch.Generator | None = None, attention_mask: torch.Tensor | None = None,
                         eos_token_id: int | Sequence[int] | None = None,
                         rule: AcceptanceRule | None = None) -> GenerationOutput:
    """Generate with ``drafter`` proposing up to ``k`` tokens per target forward, verified exactly.

    target: a transformers causal LM (as from ``load_target``/``from_pretrained``) or a decoder;
    input_ids: [B, S], left-padded with ``attention_mask`` when B > 1; k: None = the drafter's config's
    (``drafter.config.k``, for a drafter from :func:`~specdec.load_drafter`); eos_token_id: None = the model's
    generation config. Output is token-identical to :func:`autoregressive_generate` under greedy decoding
    and distributed as it under sampling. ``rule`` (an :class:`~specdec.verify.AcceptanceRule`, for chains
    and trees alike) is replaceable for studies (e.g. planted bugs in :mod:`specdec.exactness.planted`); None means
    the drafter's own rule, which is the exact one unless the drafter was built with a lossy one
    (``drafter.traits.lossy``, e.g. Medusa's typical acceptance: then only greedy output keeps the promise). An
    explicit ``rule`` for a drafter built with its own rule is refused (ValueError). ``sampling`` (a
    :class:`~specdec.verify.sampling.SamplingParams`) gives the sampling settings as one object, in place of
    ``temperature``, ``top_k`` and ``top_p``.
    """
    params = _sampling(sampling, temperature, top_k, top_p)
    return _generate(target, drafter, input_ids, attention_mask, k=_check_k(k, drafter),
                     max_new_tokens=max_new_tokens, params=params, generator=generator, eos_token_id=eos_token_id,
                     rule=_resolve_rule(rule, drafter))


def autoregressive_generate(target, input_ids: torch.Tensor, *, max_new_tokens: int,
                            sampling: SamplingParams | None = None, temperature: float = 0.0,
                            top_k: int = 0, top_p: float = 1.0, generator: torch.Generator | None = None,
                            attention_mask: torch.Tensor | None = None,
                            eos_token_id: int | Sequence[int] | None = None) -> GenerationOutput:
    """Plain decoding, one target forward per token, on the same cache path: the reference (``sampling`` as
    :func:`speculative_generate`'s)."""
    params = _sampling(sampling, temperature, top_k, top_p)
    return _generate(target, NoDrafter(), input_ids, attention_mask, k=0, max_new_tokens=max_new_tokens,
                     params=params, generator=generator, eos_token_id=eos_token_id, rule=EXACT)
