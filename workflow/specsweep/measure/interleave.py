"""One level of every fixed arm, measured in interleaved blocks on servers that are all up at once.

Why: the answer is a ratio of two arms. Measured one arm after the other, on one server instance each, a slow
period of the host or a slow instance lands on one arm only and goes straight into the ratio (a vLLM CPU run
read an A/A comparison 26% worse, another 13-17% better). Here each arm's repeats are blocks that alternate
with the other arms' in a counterbalanced order (A B, B A, A B, ...), each block short against the host's drift,
and the idle servers are frozen (SIGSTOP of their process tree) while another is measured, so they take no CPU.
A linear drift then cancels in the mean of the rounds' paired ratios (`analysis/paired.py`), and what is left
shows in their spread and as the reference arm's drift between its first and last block.

With `pairing.instances` N > 1 every arm has N server instances, all up at once (an instance's own speed is an
effect of its own: a vLLM CPU A/A pair read 12-15% apart on one instance each, and a paired t over one pair of
instances cannot see it). Round r measures every arm on instance k(r), going 1 .. N, N .. 1, ... with the arm order
reversed each round, so each instance sees both orders and the instances are counterbalanced in time; the
analysis then resamples instances, then rounds (`analysis/paired.py`).

Run by the Snakemake `paired_level` rule and standalone: `specsweep paired-level --specs JSON --env ENV.json
--out-root DIR ...`. Each arm's cell is written as the `cell` rule writes it, with a `pairing` block in its
summary: the order, each block's arm, repeat and wall-clock times.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from specsweep.client.cpu import pinned
from specsweep.client.loadgen import LevelResult, RepeatResult, filler_count, measure_level, new_session
from specsweep.client.prompts import LevelPrompts
from specsweep.config import defaults, with_instance
from specsweep.measure import heal
from specsweep.measure.cell import (
    CellError,
    LevelInputs,
    PreparedCell,
    finish_summary,
    fixed_output_tokens,
    level_inputs,
    level_summary_of,
    prepare_cell,
    watched_gpus,
)
from specsweep.measure.metrics import jsonable
from specsweep.measure.referral import refer_level
from specsweep.measure.rounds import BUDGET_SPENT, judged_after, least_rounds
from specsweep.measure.summary import judged, write_cell
from specsweep.serving import servers


def centred(arms: list[str]) -> list[str]:
    """The arms with the first (the reference) moved to the middle: with three or more arms every other arm's
    block then sits next to the reference's in each round. Why: the host's speed wanders, and two blocks two
    places apart differ more than neighbours (6-s blocks on this 2-vCPU VM: a 4.0% SD of the host's speed
    between neighbours, 5.6% two places apart), and that difference is in the round's ratio."""
    ref, *others = arms
    mid = (len(arms) - 1) // 2
    return [*others[:mid], ref, *others[mid:]]


def block_order(arms: list[str], rounds: int) -> list[list[str]]:
    """The arms' order in each round: as given in even rounds, reversed in odd ones (A B | B A | A B ...), so
    every arm sits as often before as after the others and a linear drift cancels over two rounds."""
    return [list(arms) if r % 2 == 0 else list(reversed(arms)) for r in range(rounds)]


def round_instances(rounds: int, instances: int) -> list[int]:
    """The server instance (1-based) every arm is measured on in each round: 1 .. N, N .. 1, 1 .. N, ...
    With `block_order`'s alternating arm order and at least 2N rounds, every instance sees both arm orders, and
    the instances are counterbalanced in time (a linear drift gives each instance's mean the same share)."""
    cycle = list(range(1, instances + 1)) + list(range(instances, 0, -1))
    return [cycle[r % len(cycle)] for r in range(rounds)]


def slot_of(arm: str, instance: int, instances: int) -> str:
    """The server slot of an arm's instance in the level's group: the arm itself where it has one instance (the
    slot the servers had before instances existed, so they are reused), `<arm>.i<k>` otherwise."""
    return arm if instances == 1 else f"{arm}.i{instance}"


def check_specs(specs: dict[str, dict[str, Any]]) -> tuple[int, int, int]:
    """The level's concurrency, repeats (blocks per arm) and server instances per arm, which every arm must
    share."""
    if not specs:
        raise CellError("an interleaved level needs at least one arm")
    levels = {
        (
            s["concurrency"],
            s["repeats"],
            s.get("load", {}).get("mode", "closed"),
            int(s.get("pairing", {}).get("instances") or 1),
            json.dumps(s.get("precision"), sort_keys=True),
        )
        for s in specs.values()
    }
    if len(levels) != 1:
        raise CellError(
            "the arms of an interleaved level differ in concurrency, repeats, load, server instances or precision: "
            f"{sorted(levels)}"
        )
    concurrency, repeats, mode, instances, _ = levels.pop()
    if mode != "closed":
        raise CellError(
            f"interleaved arms measure closed-loop levels only (load.mode is {mode}); set pairing.mode: sequential"
        )
    return int(concurrency), int(repeats), instances


def instance_cells(cells: dict[str, PreparedCell], instances: int) -> dict[str, PreparedCell]:
    """Slot -> the cell whose server that slot runs: each arm's cell with the instance's identity in its server's
    environment (`with_instance`) where there is more than one instance; the cell spec stays the arm's."""
    if instances == 1:
        return dict(cells)
    out = {}
    for arm, cell in cells.items():
        for k in range(1, instances + 1):
            out[slot_of(arm, k, instances)] = replace(
                cell, arm=with_instance(cell.arm, arm, k), label=f"{cell.label}.i{k}"
            )
    return out


@dataclass(frozen=True)
class LevelProgress:
    """What the stopping rule sees after each round: every arm's records and level summary so far (their
    `pairing` blocks included), and what each round cost."""

    concurrency: int
    reference_arm: str
    frames: dict[str, pd.DataFrame]
    summaries: dict[str, dict[str, Any]]
    round_s: list[float]  # every arm's blocks of the round, end to end
    round_requests: list[int]  # measured requests per block
    round_overhead_s: list[float]  # the round's seconds besides its measured requests (warm-up, ramp, probes)
    growth: int  # the last round's requests per block over the configured ones
    max_growth: int  # the largest it may take (precision.max_block_growth, within workload.requests.max)


class RoundDecision(Protocol):
    stop: bool
    reason: str
    growth: int


RoundRule = Callable[[LevelProgress], RoundDecision]


@dataclass(frozen=True)
class Rounds:
    """How many rounds a level measures: `min_rounds`, then a round at a time until `rule` stops it or
    `max_rounds` are done (blocks at most `max_growth` x the configured requests). Without a precision target,
    or where min_rounds = max_rounds, there is nothing to decide: no rule."""

    min_rounds: int
    max_rounds: int
    rule: RoundRule | None = None
    max_growth: int = 1
    target: float | None = None


@dataclass
class _Measured:
    results: dict[str, LevelResult]
    inputs: dict[str, LevelInputs]
    infos: dict[str, Any]
    blocks: list[dict[str, Any]]
    level_s: dict[str, float]
    precision: dict[str, Any] | None
    referrals: dict[str, dict[str, Any]]  # arm -> records.OutputReferral, every arm besides the reference
    sizes: list[int]  # each round's measured requests per block
    round_s: list[float]
    overheads: list[float]
    decisions: list[str]


def _used_inputs(inp: LevelInputs, sizes: list[int]) -> LevelInputs:
    """The arm's inputs as measured: each round's prompt set cut to the requests it sent."""
    sets = [inp.prompts.repeats[r].head(n) for r, n in enumerate(sizes)]
    return replace(inp, prompts=LevelPrompts(inp.prompts.warmup, sets, inp.prompts.unique))


async def _inputs_and_infos(
    cells: dict[str, PreparedCell], recs: dict[str, servers.ServerRecord], rounds: Rounds, instances: int
) -> tuple[dict[str, LevelInputs], dict[str, Any]]:
    """Every arm's prompt sets (one per round the level may measure, each as long as its largest block) and its
    server's info. Every server runs here: prompts may be tokenized by the server."""
    inputs: dict[str, LevelInputs] = {}
    infos: dict[str, Any] = {}
    for arm, cell in cells.items():
        first = recs[slot_of(arm, 1, instances)]
        url = first.base_url
        spec = {**cell.spec, "repeats": rounds.max_rounds, "n_requests": cell.spec["n_requests"] * rounds.max_growth}
        inputs[arm] = replace(
            await level_inputs(
                spec, cell.make_spec(first.port), url, cell.api_key, cell.tokenizer_path, cell.dataset, cell.render
            ),
            n_requests=cell.spec["n_requests"],
        )
        async with new_session(1) as session:
            infos[arm] = await cell.engine.server_info(session, url)
    return inputs, infos


async def _measure_blocks(
    cells: dict[str, PreparedCell],
    recs: dict[str, servers.ServerRecord],
    rounds: Rounds,
    instances: int,
    concurrency: int,
    pairing: dict[str, Any],
    again: tuple[_Measured, tuple[int, ...]] | None = None,
) -> _Measured:
    """The level's rounds, each a block of every arm; with `again` (an earlier attempt and some of its rounds),
    only those rounds, measured anew on the same prompt sets and block sizes, in place of the attempt's: the
    attempt's other rounds are kept, so a transient cause costs the rounds it spoiled, not the level."""
    arms = list(cells)
    if again is None:
        inputs, infos = await _inputs_and_infos(cells, recs, rounds, instances)
        repeats: dict[str, list[RepeatResult]] = {arm: [] for arm in arms}
        warmup_errors = dict.fromkeys(arms, 0)
        level_s = dict.fromkeys(arms, 0.0)
        blocks: list[dict[str, Any]] = []
        round_s: list[float] = []
        sizes: list[int] = []
        overheads: list[float] = []
        decisions: list[str] = []
        redo: tuple[int, ...] = ()
    else:
        prior, redo = again
        inputs, infos = prior.inputs, prior.infos
        repeats = {arm: [rep for rep in prior.results[arm].repeats if rep.repeat not in redo] for arm in arms}
        warmup_errors = {arm: prior.results[arm].warmup_errors for arm in arms}
        level_s = dict(prior.level_s)
        blocks = [b for b in prior.blocks if b["repeat"] not in redo]
        round_s, sizes, overheads = list(prior.round_s), list(prior.sizes), list(prior.overheads)
        decisions = list(prior.decisions)
    growth, r = 1, 0
    stagger = bool(cells[arms[0]].spec["workload"]["stagger"])
    ramp = concurrency if stagger else 0
    fill = filler_count(concurrency, stagger)  # the set's prompts after a block's measured ones
    # the host's idle loop lag (the jitter a block's loop lag is judged against) is probed before each arm's first
    # block of the level and stands for its later blocks, seconds apart: a probe before every block cost the
    # default run 50 ms a block, 12 s in all
    idle: dict[str, list[float]] = {}

    def level_results() -> dict[str, LevelResult]:
        return {
            arm: LevelResult(
                concurrency=concurrency,
                n_requests=inputs[arm].n_requests,
                repeats=sorted(repeats[arm], key=lambda rep: rep.repeat),
                warmup_errors=warmup_errors[arm],
                stagger=cells[arm].spec["workload"]["stagger"],
            )
            for arm in arms
        }

    async def measure_round(r: int, n: int) -> tuple[float, float]:
        """Round r: a block of n measured requests of every arm, on the round's instance and prompt set; its
        seconds end to end and those besides its measured requests."""
        k = round_instances(r + 1, instances)[r]
        started_round, overhead = time.monotonic(), 0.0
        for arm in block_order(centred(arms), r + 1)[r]:
            measured = slot_of(arm, k, instances)
            for slot, rec in recs.items():
                if slot != measured:
                    servers.freeze(rec)
            servers.thaw(recs[measured])
            cell, inp = cells[arm], inputs[arm]
            workload = cell.spec["workload"]
            block_set = inp.prompts.repeats[r].head(n + ramp + fill)
            one = LevelPrompts(inp.prompts.warmup, [block_set], inp.prompts.unique)
            start_unix, started = time.time(), time.monotonic()
            async with new_session(concurrency) as session:
                level = await measure_level(
                    replace(inp.req, url=recs[measured].base_url),  # the round's instance
                    concurrency,
                    n,
                    one,
                    fixed_output_tokens(workload["output_tokens"]),
                    # before every block: a server resumed after others' blocks is cold (vLLM CPU ran its first
                    # block after the warm-up 20-30% faster than its later ones when warmed once per level)
                    warmup=workload["warmup_requests"],
                    repeats=1,
                    stagger=workload["stagger"],
                    duration_s=workload["requests"].get("duration_s"),
                    hooks=cell.engine,
                    server_pid=recs[measured].server_pid,
                    watch_cpus=cell.plan.watched,
                    watch_gpus=watched_gpus(cell.spec["variant"]),
                    idle_probe_s=0.0 if arm in idle else cell.spec["client"]["idle_probe_s"],
                    session=session,
                )
            rep = level.repeats[0]
            rep.repeat = r
            rep.idle_lag_samples = idle.setdefault(arm, rep.idle_lag_samples)
            repeats[arm].append(rep)
            warmup_errors[arm] += level.warmup_errors
            block_s = time.monotonic() - started
            level_s[arm] += block_s
            overhead += max(0.0, block_s - float(rep.client.get("wall_s") or 0.0) * n / (n + ramp))
            block = {"arm": arm, "repeat": r, "start_unix": start_unix, "end_unix": time.time()}
            blocks.append({**block, "instance": k} if instances > 1 else block)
        return time.monotonic() - started_round, overhead

    # the rounds a transient cause spoiled, on their own prompt sets and sizes; the rule's decisions stay one per
    # round (the last says why the level stopped), and the attempts log names the rounds measured again
    for r in redo:
        round_s[r], overheads[r] = await measure_round(r, sizes[r])
    while again is None and r < rounds.max_rounds:
        n = inputs[arms[0]].n_requests * growth
        seconds, overhead = await measure_round(r, n)
        round_s.append(seconds)
        sizes.append(n)
        overheads.append(overhead)
        r += 1
        if rounds.target is None:
            continue
        if r < rounds.min_rounds:
            decisions.append(f"{r} of min_rounds {rounds.min_rounds}")
            continue
        if r >= rounds.max_rounds or rounds.rule is None:
            decisions.append(f"{BUDGET_SPENT} max_rounds {rounds.max_rounds}")
            break
        if not judged_after(r, rounds.min_rounds, rounds.max_rounds):
            decisions.append(f"{r} rounds: judged after complete cycles (A B | B A)")
            continue
        for rec in recs.values():  # the rule's bootstrap runs on this host: no server beside it
            servers.freeze(rec)
        results = level_results()
        used = {arm: _used_inputs(inputs[arm], [s + ramp + fill for s in sizes]) for arm in arms}
        summaries = {}
        for arm, cell in cells.items():
            summaries[arm] = level_summary_of(
                cell.spec, results[arm], used[arm], cell.plan, infos[arm], cell.dataset, 0.0
            )
            summaries[arm]["pairing"] = {**pairing, "blocks": blocks}
        decision = rounds.rule(
            LevelProgress(
                concurrency,
                arms[0],
                {arm: results[arm].records for arm in arms},
                summaries,
                list(round_s),
                list(sizes),
                list(overheads),
                growth,
                rounds.max_growth,
            )
        )
        decisions.append(decision.reason)
        if decision.stop:
            break
        growth = min(decision.growth, rounds.max_growth)
    # the outputs' differences, referred to the reference arm's server while it is up (alone: the others frozen)
    reference = recs[slot_of(arms[0], 1, instances)]
    for rec in recs.values():
        if rec is not reference:
            servers.freeze(rec)
    servers.thaw(reference)
    results = level_results()
    ref_inputs = inputs[arms[0]]
    measured_repeats = {arm: res.repeats for arm, res in results.items()}
    referrals = await refer_level(
        arms[0], measured_repeats, ref_inputs.req, ref_inputs.prompts.repeats, reference.base_url
    )
    for rec in recs.values():
        servers.thaw(rec)
    precision = None
    if rounds.target is not None:
        precision = {
            "target": rounds.target,
            "rounds": len(sizes),
            "block_requests": sizes,
            "round_s": round_s,
            "round_overhead_s": overheads,
            "decisions": decisions,
        }
    used = {arm: _used_inputs(inputs[arm], [s + ramp + fill for s in sizes]) for arm in arms}
    return _Measured(results, used, infos, blocks, level_s, precision, referrals, sizes, round_s, overheads, decisions)


@dataclass(frozen=True)
class _Attempt:
    """One attempt at a level: every arm's records and summary (unwritten), and what was measured."""

    records: dict[str, pd.DataFrame]
    summaries: dict[str, dict[str, Any]]
    measured: _Measured
    rounds_again: tuple[int, ...] = ()  # the earlier attempt's rounds this one measured anew (none: all its own)


def _measure_once(
    cells: dict[str, PreparedCell],
    state_dir: Path,
    server_log_dir: Path,
    rounds: Rounds,
    instances: int,
    concurrency: int,
    again: tuple[_Measured, tuple[int, ...]] | None = None,
) -> _Attempt:
    """One attempt at the level (with `again`: an earlier attempt with some of its rounds measured anew)."""
    first = next(iter(cells.values()))
    slots = instance_cells(cells, instances)
    labels = {slot: c.label for slot, c in slots.items()}
    logs = {slot: server_log_dir / f"{c.spec['variant_name']}.{slot}.log" for slot, c in slots.items()}
    makers = {slot: c.make_spec for slot, c in slots.items()}
    pairing: dict[str, Any] = {
        "mode": "interleaved",
        "id": uuid.uuid4().hex[:12],  # the arms' cells of one level job carry the same id: they pair
        "arms": list(cells),
        "reference_arm": next(iter(cells)),
        "idle_servers": "frozen",
    }
    t_ask = time.monotonic()
    with servers.acquire_group(state_dir, makers, first.host, first.variant.get("port"), labels, logs) as recs:
        ready_s = time.monotonic() - t_ask
        with pinned(first.plan.client):
            m = asyncio.run(_measure_blocks(cells, recs, rounds, instances, concurrency, pairing, again))
    n_rounds = len(m.sizes)
    pairing = {**pairing, "order": block_order(centred(list(cells)), n_rounds), "blocks": m.blocks}
    if instances > 1:
        pairing["instances"] = instances
    if m.precision is not None:
        pairing["precision"] = m.precision
    records, summaries = {}, {}
    for arm, cell in cells.items():
        summary = level_summary_of(cell.spec, m.results[arm], m.inputs[arm], cell.plan, m.infos[arm], cell.dataset, 0.0)
        summary["level_s"] = m.level_s[arm]
        summary["pairing"] = pairing
        if arm in m.referrals:
            summary["output_referral"] = m.referrals[arm]
        first_slot = slot_of(arm, 1, instances)
        rec = recs[first_slot]
        summaries[arm] = finish_summary(cell, summary, slots[first_slot].make_spec(rec.port), rec, ready_s)
        if instances > 1:
            summaries[arm]["server"]["instances"] = [
                {
                    "instance": k,
                    "identity": recs[slot_of(arm, k, instances)].identity,
                    "pid": recs[slot_of(arm, k, instances)].server_pid,
                }
                for k in range(1, instances + 1)
            ]
        records[arm] = m.results[arm].records
    return _Attempt(records, summaries, m, again[1] if again is not None else ())


def level_rounds(spec: dict[str, Any], repeats: int, rule: RoundRule | None) -> Rounds:
    """The level's rounds: `repeats` without a precision target; with one, min_rounds (at least 2 per server
    instance), then until `rule` stops it, blocks growing at most to precision.max_block_growth x the configured
    requests and never past workload.requests.max (a level already at its cap does not grow)."""
    precision = spec.get("precision") or {}
    if precision.get("target") is None:
        return Rounds(repeats, repeats)
    least, most = rule_rounds(spec)
    if least >= most:
        return Rounds(least, least, target=float(precision["target"]))
    if rule is None:
        raise CellError("a level with a precision target needs the stopping rule (specsweep paired-level passes it)")
    cap = spec["workload"]["requests"].get("max")
    room = int(cap) // int(spec["n_requests"]) if cap else int(precision["max_block_growth"])
    growth = max(1, min(int(precision["max_block_growth"]), room))
    if precision.get("proof_margin") is not None:  # a policy level adds rounds, never grows its blocks
        growth = 1  # (`analysis.precision.next_step`): no prompts are made for blocks it will not measure
    return Rounds(least, most, rule, growth, float(precision["target"]))


def rule_rounds(spec: dict[str, Any]) -> tuple[int, int]:
    """A precision level's least and most rounds (min_rounds raised to 2 per server instance)."""
    precision = spec["precision"]
    least = least_rounds(int(precision["min_rounds"]), int(spec.get("pairing", {}).get("instances") or 1))
    return least, max(least, int(precision["max_rounds"]))


def needs_rule(spec: dict[str, Any]) -> bool:
    """Whether the level has a decision to make after its rounds: a precision target and room above min_rounds
    (the caller then builds `analysis.precision.LevelRule`)."""
    if (spec.get("precision") or {}).get("target") is None:
        return False
    least, most = rule_rounds(spec)
    return most > least


def run_level(
    specs: dict[str, dict[str, Any]],
    env_json: Path,
    out_dirs: dict[str, Path],
    state_dir: Path,
    server_log_dir: Path,
    startup_timeout_s: float | None = None,
    rule: RoundRule | None = None,
    may_retry: Callable[[float], bool] | None = None,
) -> dict[str, dict[str, Any]]:
    """Measure the level in every arm of `specs` (arm -> cell spec, the reference arm first) and write each
    arm's cell into `out_dirs[arm]`; returns arm -> summary.

    With a precision target in the specs, `rule` (`analysis.precision.LevelRule`) is asked after every complete
    cycle of rounds (`judged_after`) whether the level's answer is known; without one, the level measures
    `repeats` rounds.

    The level heals as a cell does (`specsweep.measure.heal`): an attempt in which a cell is invalid for transient
    causes only (the host's doing; a drift inside the level is a flag, not such a cause) is kept under each cell's
    `attempts/<n>/` and measured again, up to the workflow's `cell_attempts`: only the rounds those causes name
    (every arm's block of each, on the round's own prompt set and block size, the other rounds kept), the whole
    level where a cause names no round or every round; each summary's `attempts` block says which attempt counts,
    which rounds each measured again and why. `may_retry(seconds)` (the run's budget, `measure/budget.py`):
    whether another attempt, expected to take that long, may start; where it says no, the last attempt counts,
    saying why."""
    concurrency, repeats, instances = check_specs(specs)
    rounds = level_rounds(next(iter(specs.values())), repeats, rule)
    cells = {arm: prepare_cell(spec, env_json, startup_timeout_s) for arm, spec in specs.items()}
    gates, attempts = heal.judge_settings()
    judging = gates or defaults("gates")
    for d in out_dirs.values():  # a new measurement of the level replaces the old one's attempts
        shutil.rmtree(d / "attempts", ignore_errors=True)
    # what the next attempt measures: the last attempt's rounds that a transient cause spoiled (None: the level),
    # and the seconds those took (what measuring them again is expected to cost)
    next_again: list[tuple[_Measured, tuple[int, ...]] | None] = [None]
    next_cost_s = [0.0]

    def measure_once(n: int) -> _Attempt:
        return _measure_once(cells, state_dir, server_log_dir, rounds, instances, concurrency, next_again[0])

    def judge(level: _Attempt) -> dict[str, Any]:
        """The level's verdict: every arm's reasons, named by arm (valid only if every cell is). Where every
        reason is the host's doing in some of its rounds, not all, the next attempt measures those again."""
        verdicts = {
            arm: judged(jsonable(level.summaries[arm]), level.records[arm], judging)["validity"] for arm in cells
        }
        reasons = [f"[{arm}] {r}" for arm, v in verdicts.items() for r in v["reasons"]]
        spoiled = heal.transient_rounds(reasons) or ()
        if len(spoiled) == len(level.measured.sizes):  # every round: the level again, as where none is named
            spoiled = ()
        next_again[0] = (level.measured, spoiled) if spoiled else None
        next_cost_s[0] = sum(level.measured.round_s[r] for r in spoiled or range(len(level.measured.round_s)))
        out: dict[str, Any] = {"valid": all(v["valid"] for v in verdicts.values()), "reasons": reasons}
        if level.rounds_again:
            out["rounds_measured"] = list(level.rounds_again)
        return out

    def keep(n: int, level: _Attempt) -> str:
        for arm in cells:
            write_cell(out_dirs[arm] / "attempts" / str(n), level.records[arm], level.summaries[arm])
        return f"attempts/{n}"

    def quiet(n: int) -> dict[str, Any]:
        return heal.wait_for_quiet(cells[next(iter(cells))].plan.watched, judging["max_foreign_cpu_share"])

    retry = (lambda: may_retry(next_cost_s[0])) if may_retry is not None else None
    done = heal.measure_until_valid(measure_once, judge, attempts, keep, quiet, retry)
    level = done.result
    for arm in cells:
        if len(done.log) > 1 or done.log[-1].get("not_again"):  # measured again, or kept where it was not
            level.summaries[arm]["attempts"] = done.as_dict()
        write_cell(out_dirs[arm], level.records[arm], level.summaries[arm])
    return level.summaries


def out_dirs(specs: dict[str, Any], out_root: Path, level: str, reference_of: str | None) -> dict[str, Path]:
    """Each arm's cell folder: `<out_root>/<arm>/<level>`, and with `reference_of` (a policy arm) the first arm's
    in the policy cell's `reference/` folder (it is a re-measurement of that fixed arm, paired with the policy)."""
    if reference_of is None:
        return {arm: out_root / arm / level for arm in specs}
    ref = next(iter(specs))
    return {ref: out_root / reference_of / level / "reference", reference_of: out_root / reference_of / level}
