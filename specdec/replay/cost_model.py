"""What a replay predicts time with: a :class:`CostModel` of seconds per target forward by block width, per
drafting step and per step's host work by lookahead, and plain decoding's host work, at one batch size (measured by
:func:`specdec.replay.costs.measure`, kept in a :class:`~specdec.replay.log.ReplayLog`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


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
        another machine or at another model's shape, random weights). The drafter's steps and the loop's host work
        are not in it and count as free, so a speedup predicted from it is an upper bound for a drafter with a
        model of its own (n-gram lookup's step is host work only)."""
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
        return cls(verify_s={row["width"]: row["ms"] / 1e3 for row in rows}, batch_size=batch_size,
                   machine=described)

    def verify(self, width: float) -> float:
        """A verify forward over ``width`` tokens (linear between the widths measured, the widest beyond)."""
        if not self.verify_s:
            raise ValueError("this cost model holds no verify times: measure them (specdec.replay.costs.measure)")
        if width in self.verify_s:
            return self.verify_s[width]
        widths = sorted(self.verify_s)
        if width >= widths[-1]:
            return self.verify_s[widths[-1]] * width / widths[-1]
        below = max(w for w in widths if w < width) if width > widths[0] else widths[0]
        above = min(w for w in widths if w > width)
        share = (width - below) / (above - below) if above != below else 0.0
        return self.verify_s[below] + share * (self.verify_s[above] - self.verify_s[below])

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


def _nearest(times: dict[int, float], k: int) -> float:
    if not times:
        return 0.0
    return times[min(times, key=lambda measured: (abs(measured - k), measured))]
