"""Replay: sweep a drafter's lookahead from one logged greedy pass, without running the target again.

Two phases (issue 47): :mod:`~specdec.replay.log` runs the target once per (target, drafter, prompts) and records
its greedy continuation and the drafter's proposal from every position; :mod:`~specdec.replay.simulate` re-enacts
a live run's verify steps from that log for any K up to K_max (chains) or the logged tree, giving the same α, α per
position and τ as :func:`~specdec.speculative_generate` would. :mod:`~specdec.replay.cache` keeps logs on disk, keyed
by what they were logged from, and refuses one that does not fit; :mod:`~specdec.replay.costs` measures the cost
model a replay predicts times and speedups with. ``python -m specdec.replay`` (:mod:`specdec.replay.__main__`) is the
main job's counterpart. Greedy decoding only, one prompt per generation.
"""

from specdec.replay.log import ReplayLog, ReplayMismatchError, log_proposals
from specdec.replay.simulate import replay, replay_prompt, replay_total

__all__ = ["ReplayLog", "ReplayMismatchError", "log_proposals", "replay", "replay_prompt", "replay_total"]
