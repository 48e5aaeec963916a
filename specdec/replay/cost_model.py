"""What a replay predicts time with: a :class:`CostModel` of seconds per target forward by block width, per
drafting step and per step's host work by lookahead, and plain decoding's host work, at one batch size (measured by
:func:`specdec.replay.costs.measure`, kept in a :class:`~specdec.replay.log.ReplayLog`), or read from a step-cost
curve (:meth:`CostModel.from_curve`), its drafting steps from the curve's drafter rows where it has the drafter's
(:meth:`CostModel.drafting_from_curve`, :func:`drafting_ms`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping


@dataclass
class CostModel:
    """Seconds per target forward by block width, per drafting step and per step's host work by K, and plain
    decoding's host work per token, for a batch of ``batch_size`` rows (keys as strings in a saved log)."""

    verify_s: dict[int, float] = field(default_factory=dict)
    draft_s: dict[int, float] = field(default_factory=dict)
    host_s: dict[int, float] = field(default_factory=dict)
    plain_host_s: float = 0.0
    batch_size: int = 1
    machine: str = ""
    setup_s: float = 0.0  # the drafter's one-off work a generation (its start, its first proposal's catch-up)
    drafter_rows: list[dict[str, Any]] = field(default_factory=list)  # a curve's drafters' steps at batch_size
    drafting: str = ""  # a curve's: how draft_s was built from drafter_rows ("": drafting counted free)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CostModel":
        def keyed(name: str) -> dict[int, float]:
            return {int(w): t for w, t in data.get(name, {}).items()}

        return cls(keyed("verify_s"), keyed("draft_s"), keyed("host_s"), data.get("plain_host_s", 0.0),
                   data.get("batch_size", 1), data.get("machine", ""), data.get("setup_s", 0.0))

    @classmethod
    def from_curve(cls, path: str | Path, batch_size: int) -> "CostModel":
        """The verify times a step-cost curve gives at ``batch_size`` rows: the JSON
        ``experiments/benchmarks/step_costs.py`` writes (a target's forward by the tokens a row carries, measured on
        another machine or at another model's shape, random weights), and its drafters' steps at that batch size
        (``drafter_rows``, for :meth:`drafting_from_curve`). Until a drafter's steps are read from those, drafting
        counts free; the loop's host work is never in a curve and counts free too."""
        file = Path(path).expanduser()
        try:
            data = json.loads(file.read_text())
            rows = [row for row in data["rows"] if row["batch"] == batch_size]
            batches = sorted({row["batch"] for row in data["rows"]})
            described = f"{data['device']}, {data['shape']} ({data['layers']} layers, {data['dtype']}): {data['mark']}"
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"costs={str(path)!r} is not a step-cost curve ({exc}); give the step_costs_<shape>.json "
                             f"that experiments/benchmarks/step_costs.py wrote, or costs=true to measure here") from exc
        if not rows:
            raise ValueError(f"costs={str(path)!r} holds batch sizes {batches}, not data.batch_size={batch_size}; "
                             f"replay at one of those, or measure the curve at {batch_size} (step_costs.py --batch)")
        drafters = [row for row in data.get("drafter_rows", []) if row.get("batch") == batch_size and "ms" in row]
        return cls(verify_s={row["width"]: row["ms"] / 1e3 for row in rows}, batch_size=batch_size,
                   machine=described, drafter_rows=drafters)

    def drafting_from_curve(self, drafter: Mapping[str, Any], steps: Mapping[int, tuple[float, float | None]],
                            at: int | None = None) -> "CostModel":
        """A copy of this curve's cost model whose drafting step at each lookahead k in ``steps`` is built from the
        curve's rows for ``drafter`` (its config: ``name`` and the settings :func:`drafting_ms` reads), given
        ``steps[k]``: τ at k (the tokens a step commits, on average, which EAGLE's next step catches up on) and the
        drafter's own forwards a proposal takes at k, on average (None: not logged); ``drafting`` says how. Where the
        curve has no rows for the drafter (n-gram lookup, whose step is host work; a curve measured without
        ``--drafters``), drafting stays free and ``drafting`` empty. ``drafting`` describes the step at lookahead
        ``at`` (the replay's; None: the largest in ``steps``)."""
        built = {k: drafting_ms(self.drafter_rows, drafter, k, tau, forwards) for k, (tau, forwards) in steps.items()}
        if not built or any(b is None for b in built.values()):
            return self
        how = built[max(built) if at is None else at][1]
        return replace(self, draft_s={k: ms / 1e3 for k, (ms, _) in built.items()}, drafting=how)

    def verify(self, width: float) -> float:
        """A verify forward over ``width`` tokens (linear between the widths measured, the widest beyond)."""
        if not self.verify_s:
            raise ValueError("this cost model holds no verify times: measure them (specdec.replay.costs.measure)")
        return _by_width(self.verify_s, width)

    def draft(self, k: int) -> float:
        """A drafting step at lookahead ``k`` (the nearest K measured)."""
        return _nearest(self.draft_s, k)

    def host(self, k: int) -> float:
        """A verify step's host work at lookahead ``k`` (the nearest K measured)."""
        return _nearest(self.host_s, k)

    def step(self, width: int, k: int) -> float:
        """A speculative step at lookahead ``k`` whose block is ``width`` tokens wide."""
        return self.verify(width) + self.draft(k) + self.host(k)

    def plain_step(self) -> float:
        """A plain decoding step."""
        return self.verify(1) + self.plain_host_s


def drafting_ms(rows: list[dict[str, Any]], drafter: Mapping[str, Any], k: int, tau: float,
                forwards: float | None = None) -> tuple[float, str] | None:
    """ms of ``drafter``'s drafting step at lookahead ``k`` built from a step-cost curve's ``rows`` (its drafters'
    steps at one batch size: ``drafter``, ``width``, ``ms``), with how it was built; None where the rows lack the
    drafter. ``tau``: the tokens a step commits; ``forwards``: the drafter's own forwards a proposal takes, on
    average, as logged (None: the most its settings allow). Each drafter's step as its ``propose`` runs it:

    - EAGLE: its catch-up (its layer over the ``tau`` committed positions, and the root's candidates), then
      ``forwards - 1`` levels, each a level of ``expand`` nodes for a tree (``fc``, its layer and draft LM head over
      them; a tree that finds no confident node to open stops early), of one node for a chain. Unlogged: a tree's
      ``depth - 1`` levels, a chain's ``k - 1``.
    - Medusa: its heads once (over the target's last hidden state: no catch-up).
    - the block drafter: its block once (its context written, its layers over the block, its draft LM head).
    - a draft model (``draft_model``, the curve's rows at the draft's own shape): a forward over the last two
      tokens, then ``forwards - 1`` one-token steps (unlogged: ``k - 1``; a confidence cut stops it early).
    Costs between the widths measured are linear (the widest's per node beyond), as the verify steps' are."""
    name = drafter.get("name")
    mine = {row.get("width"): row["ms"] for row in rows if row.get("drafter") == name and "ms" in row}
    if not mine:
        return None
    counted = "levels as logged" if forwards is not None else "levels unlogged: the most"
    if name == "eagle":
        tree = drafter.get("tree", True)
        nodes = min(drafter.get("expand", 4), drafter.get("top_k", 4)) if tree else 1
        levels = forwards - 1 if forwards is not None else (drafter.get("depth", 6) if tree else k) - 1
        return (_by_width(mine, tau) + levels * _by_width(mine, nodes),
                f"EAGLE's {'tree' if tree else 'chain'}: its catch-up over τ tokens and {levels:.2f} levels of "
                f"{nodes} node{'s' if nodes > 1 else ''} ({counted})")
    if name == "draft_model":
        steps = forwards - 1 if forwards is not None else k - 1
        return (_by_width(mine, 2) + steps * _by_width(mine, 1),
                f"the draft model: a forward over 2 tokens and {steps:.2f} one-token steps ({counted})")
    if name == "medusa":
        return next(iter(mine.values())), "Medusa: its heads once a step"
    if name == "dflash":
        return next(iter(mine.values())), "the block drafter: its block once a step"
    return None


def _by_width(times: dict[int, float], width: float) -> float:
    """``times`` by width at ``width``: linear between the widths measured, the widest's per token beyond."""
    if width in times:
        return times[width]
    widths = sorted(times)
    if width >= widths[-1]:
        return times[widths[-1]] * width / widths[-1]
    below = max(w for w in widths if w < width) if width > widths[0] else widths[0]
    above = min(w for w in widths if w > width)
    share = (width - below) / (above - below) if above != below else 0.0
    return times[below] + share * (times[above] - times[below])


def _nearest(times: dict[int, float], k: int) -> float:
    if not times:
        return 0.0
    return times[min(times, key=lambda measured: (abs(measured - k), measured))]
