"""Replay: sweep a drafter's lookahead from one logged pass, without running the target again.

Two phases (issue 47): :mod:`~specdec.replay.log` runs the target once per (target, drafter, prompts, sampling) and
records its continuation (greedy, or sampled once per seed) and the drafter's proposal from every position, at
T > 0 with each draft's acceptance probability (:mod:`~specdec.replay.acceptance`); :mod:`~specdec.replay.simulate`
re-enacts a live run's verify steps from that log for any K up to K_max (chains) or the logged tree, giving the same
α, α per position and τ as :func:`~specdec.speculative_generate` would (greedy: exactly; T > 0: in expectation,
what is exact and what approximate said in those modules). :mod:`~specdec.replay.cache` keeps logs on disk, keyed
by what they were logged from, and refuses one that does not fit; :mod:`~specdec.replay.costs` measures the cost
model a replay predicts times and speedups with. ``python -m specdec.replay`` (:mod:`specdec.replay.__main__`) is the
main job's counterpart. One prompt per generation.
"""

from specdec.replay.log import ReplayLog, ReplayMismatchError, log_proposals
from specdec.replay.simulate import expected_prompt, replay, replay_prompt, replay_total

__all__ = ["ReplayLog", "ReplayMismatchError", "expected_prompt", "log_proposals", "replay", "replay_prompt",
           "replay_total"]
