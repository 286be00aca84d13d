"""Where a paired level's rounds spend their seconds: every block split into its set-up, its closed loop's head
(the ramp: first send to the C-th end), its steady window and its drain (the window's end to the last end).

The rule that grows blocks (`analysis/precision.py`, `block_growth`) counts as a round's overhead what does not
grow with the block: the set-up and the ramp's share of the loop (`round_overhead_s`). That figure is printed
beside the split, so "overhead" reads the same here as in the level's log, and the window's share says what part
of a block's seconds the speedup is measured on.

    python benchmarks/round_cost.py --results results/vllm-cpu-tiny   # a finished run's experiment folder
    python benchmarks/round_cost.py --results DIR --json             # the same figures as JSON

Figures come from each cell's summary.json: the blocks' start and end (`pairing.blocks`), each round's first send
(`t0_unix`), loop (`duration_s`) and steady window. Measured figures of the run read, real or simulated engine as
that run was.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))

from specsweep.measure.summary import read_summary  # noqa: E402  (run from a checkout, package not installed)

PARTS = ("setup", "head", "window", "drain")


@dataclass(frozen=True)
class BlockSplit:
    """One arm's block of one round, in seconds: before and after its loop, the loop's three parts."""

    arm: str
    round: int
    setup: float  # warm-up, cache reset, idle probe, counters, connection pre-warm; counters and stamps after
    head: float  # first send to the C-th end: the staggered ramp, the batch filling from empty
    window: float  # the steady window: every slot busy, where throughput is measured
    drain: float  # the window's end to the last end: slots empty one by one

    @property
    def total(self) -> float:
        return self.setup + self.head + self.window + self.drain


@dataclass(frozen=True)
class LevelCost:
    """A paired level's blocks and the rule's own overhead figure."""

    variant: str
    concurrency: int
    rounds: int
    block_requests: list[int]
    blocks: list[BlockSplit]
    round_s: float | None  # all rounds' seconds (None: fixed rounds, no round log)
    rule_overhead_s: float | None  # all rounds' round_overhead_s

    def share(self, part: str) -> float:
        total = sum(b.total for b in self.blocks)
        return sum(getattr(b, part) for b in self.blocks) / total if total > 0 else float("nan")

    def spread(self, part: str) -> tuple[float, float]:
        """The lowest and highest share of `part` over the level's blocks."""
        shares = [getattr(b, part) / b.total for b in self.blocks if b.total > 0]
        return (min(shares), max(shares)) if shares else (float("nan"), float("nan"))


def block_splits(summary: dict[str, Any], arm: str) -> list[BlockSplit]:
    """One arm's blocks, from its cell's summary: its rounds matched to the level's blocks by round."""
    when = {b["repeat"]: b for b in summary["pairing"]["blocks"] if b["arm"] == arm}
    out = []
    for rep in summary["repeats"]:
        block, m = when.get(rep["repeat"]), rep["metrics"]
        window, t0, loop = m.get("steady_window") or {}, rep.get("t0_unix"), m.get("duration_s")
        start, end = window.get("start_s"), window.get("end_s")
        if block is None or None in (t0, loop, start, end, block["start_unix"], block["end_unix"]):
            continue  # a block without a loop or window: nothing to split
        setup = (block["end_unix"] - block["start_unix"]) - loop
        out.append(BlockSplit(arm, rep["repeat"], setup, start, end - start, loop - end))
    return out


def level_costs(experiment: Path) -> list[LevelCost]:
    """Every interleaved level under `experiment` (results/<experiment>), with its round log where it has one."""
    seen: dict[str, LevelCost] = {}
    for path in sorted(experiment.glob("*/*/c*/summary.json")):
        summary = read_summary(path)
        pairing = summary.get("pairing") or {}
        if pairing.get("mode") != "interleaved":
            continue
        log = pairing.get("precision") or {}
        key = pairing["id"]
        cost = seen.get(key)
        blocks = block_splits(summary, summary["cell"]["arm"])
        if cost is None:
            seen[key] = LevelCost(
                summary["cell"]["variant"],
                int(summary["concurrency"]),
                int(log.get("rounds", len(summary["repeats"]))),
                list(log.get("block_requests", [])),
                blocks,
                float(sum(log["round_s"])) if log else None,
                float(sum(log["round_overhead_s"])) if log else None,
            )
        else:
            cost.blocks.extend(blocks)
    return sorted(seen.values(), key=lambda c: (c.variant, -c.concurrency))


def report(costs: list[LevelCost]) -> str:
    """One line per level: rounds, seconds, each part's share (over its blocks: lowest-highest), the rule's."""
    head = (
        f"{'variant':<12} {'C':>4} {'rounds':>6} {'block req':>10} {'seconds':>8}  "
        + "  ".join(f"{p:>15}" for p in PARTS)
        + f"  {'rule overhead':>13}"
    )
    lines = [head, "-" * len(head)]
    for c in costs:
        req = f"{min(c.block_requests)}-{max(c.block_requests)}" if c.block_requests else "-"
        parts = "  ".join(f"{c.share(p):>5.0%} ({c.spread(p)[0]:.0%}-{c.spread(p)[1]:.0%})".rjust(15) for p in PARTS)
        seconds = sum(b.total for b in c.blocks) if c.round_s is None else c.round_s
        rule = "-" if not c.round_s or c.rule_overhead_s is None else f"{c.rule_overhead_s / c.round_s:.0%}"
        lines.append(f"{c.variant:<12} {c.concurrency:>4} {c.rounds:>6} {req:>10} {seconds:>8.1f}  {parts}  {rule:>13}")
    blocks = [b for c in costs for b in c.blocks]
    if blocks:
        total = sum(b.total for b in blocks)
        whole = ", ".join(f"{p} {sum(getattr(b, p) for b in blocks) / total:.0%}" for p in PARTS)
        lines.append(f"all levels' blocks ({total:.0f} s): {whole}")
        mean_setup = statistics.mean(b.setup for b in blocks)
        lines.append(f"set-up per block: {mean_setup:.2f} s on average over {len(blocks)} blocks")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, required=True, help="a finished run's results/<experiment> folder")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--smoke", action="store_true", help="the test suite's check that it runs (on its tiny run)")
    args = ap.parse_args(argv)
    costs = level_costs(args.results)
    if not costs:
        raise SystemExit(f"{args.results}: no interleaved level (*/*/c*/summary.json with pairing.mode interleaved)")
    if args.json:
        print(json.dumps([{**asdict(c), "shares": {p: c.share(p) for p in PARTS}} for c in costs], indent=2))
    else:
        print(report(costs))


if __name__ == "__main__":
    main()
