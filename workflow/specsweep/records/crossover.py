"""crossover.json: a variant's analysis (docs/analysis.md): per speculative arm its speedup per level, the crossover
with its interval and the verdict; the policy lines, derived schedules and policy proofs. Written by
`specsweep.analysis.report`, read by the final table, `compare`, MLflow logging and `track`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from specsweep.records.base import Record

CROSSOVER_SCHEMA_VERSION = 1


class LevelPrecision(Record):
    """How precise a level's paired speedup came out (`analysis/precision.py`); the variances are of one round's
    log ratio."""

    target: float | None = Field(description="the 95% half-width it was measured to (null: fixed rounds)")
    half_width: float | None = Field(description="the 95% interval's relative half-width reached (null: none)")
    met: bool = Field(description="half_width <= target")
    budget_spent: bool = Field(description="stopped by its budget (max_rounds, max_level_s, max_instances), short")
    decided: bool = Field(
        False, description="stopped short of the target with its verdict known (outside 1 +- precision.decide_margin)"
    )
    rounds: int = Field(description="rounds the interval rests on (unit instance: server instances per arm)")
    requests: int | None = Field(description="measured requests per arm, every round (null: fixed rounds)")
    block_growth: int = Field(description="the last round's requests per block over the configured ones")
    within_round_var: float | None = Field(description="the blocks' own noise (prompts drawn, requests' spread)")
    between_round_var: float | None = Field(description="the rounds' spread beyond it (the host over time)")
    between_instance_var: float | None = Field(description="the server instances' own (null: one instance)")
    reference_between_round_var: float | None = Field(
        None, description="the baseline's own log value across rounds beyond its blocks' noise: time (host, engine)"
    )
    rounds_for_target: int | None = Field(description="rounds (or instances per arm) its variance implies")
    unit: Literal["round", "instance"] = Field(
        "round", description="round (interleaved) or instance (sequential segments, precision.max_instances)"
    )


class HostSplit(Record):
    """A level's speedup in its rounds where the host ran fast and in those where it ran slow
    (`analysis/hoststate.py`)."""

    fast: float = Field(description="the speedup over the fast half's rounds")
    fast_lo: float = Field(description="its 95% interval's lower end")
    fast_hi: float = Field(description="its upper end")
    slow: float = Field(description="over the slow half's rounds")
    slow_lo: float = Field(description="its 95% interval's lower end")
    slow_hi: float = Field(description="its upper end")
    rounds: int = Field(description="rounds in each half")
    apart: bool = Field(description="the halves' intervals do not overlap: the speedup depends on the host's state")


class PairedBasis(Record):
    """What a level's paired interval rests on (`analysis/paired.py`): its units, their degrees of freedom and
    the standard error of the mean log ratio; `specsweep plan --noise-from` plans with it."""

    blocks: int = Field(description="the units the interval rests on: rounds, or server instances")
    unit: Literal["round", "instance"] = Field(description="round (interleaved) or instance (instances' means)")
    df: int = Field(description="its degrees of freedom")
    spread_dominates: bool = Field(description="the units varied more than the blocks' own noise explains")
    log_se: float | None = Field(description="standard error of the mean log ratio (null: none)")
    instance_effect: bool | None = Field(None, description="interleaved instances: the pretest found an effect")


class LevelContent(Record):
    """What the level's requests held and where they stopped: the draft acceptance the speedup rests on, and the
    answers' lengths in both arms (docs/metrics.md "Content classes")."""

    accept_length: float | None = Field(
        None, description="the speculative arm's tokens per verify pass, the cell's mean (null: not reported)"
    )
    accept_length_p50: float | None = Field(None, description="its median over requests (null: not per request)")
    accept_length_p90: float | None = Field(None, description="its 90th percentile over requests")
    baseline_output_p50: float | None = Field(None, description="the baseline's median answer, tokens")
    spec_output_p50: float | None = Field(None, description="the speculative arm's median answer, tokens")
    baseline_cap_share: float | None = Field(None, description="the baseline's answers that reached their cap")
    spec_cap_share: float | None = Field(None, description="the speculative arm's answers that reached their cap")


class ContentFacts(Record):
    """What a unit's requests held: its content class, the prompts' source and where answers stopped."""

    unit: str = Field(description="the sweep unit: the variant, or <variant>@<class> / <variant>@mix")
    variant: str = Field(description="the stack it ran on")
    content: str | None = Field(description="its class (null: the workload's one content)")
    prompts: str = Field(description="the prompts' source, in words")
    synthetic: bool = Field(description="whether any of its prompts are synthetic words")
    stop: Literal["fixed", "natural"] = Field(description="fixed (ignore_eos, every answer its cap) or natural")
    output_tokens: Any = Field(description="workload.output_tokens: the length (fixed) or the cap (natural)")
    engine: str = Field(description="sim, sglang or vllm")


class LevelRow(Record):
    """One level of an arm against the baseline."""

    concurrency: float = Field(description="the level: C (closed), requests/s (open), time scale (trace)")
    baseline_key: str | None = Field(description="the baseline's cell key (null: no cell)")
    spec_key: str | None = Field(description="the speculative arm's cell key")
    baseline_valid: bool | None = Field(description="the baseline cell's validity")
    spec_valid: bool | None = Field(description="the speculative cell's")
    used: bool = Field(description="whether the level enters the crossover (both cells valid, or included)")
    baseline_value: float | None = Field(None, description="the primary metric, baseline")
    spec_value: float | None = Field(None, description="the primary metric, speculative arm")
    speedup: float | None = Field(None, description="spec over baseline, > 1: speculation better")
    speedup_lo: float | None = Field(None, description="the interval's lower end")
    speedup_hi: float | None = Field(None, description="the interval's upper end")
    output_match: dict[str, Any] | None = Field(
        None, description="share of compared requests whose outputs are the same (null: never compared)"
    )
    paired: PairedBasis | None = Field(None, description="rounds or instances the paired interval rests on")
    precision: LevelPrecision | None = Field(None, description="interleaved levels: the interval's precision")
    host_split: HostSplit | None = Field(
        None, description="its rounds split by the host's speed (6+ rounds on one instance; null: not split)"
    )
    content: LevelContent | None = Field(None, description="acceptance and answer lengths (null: no cells)")


class Verdict(Record):
    """What the arm's levels say, and what would settle it when inconclusive."""

    kind: str = Field(description="crossover, wins_everywhere, loses_everywhere, inconclusive ...")
    reason: str = Field(description="why")
    notes: list[str] = Field(default_factory=list, description="what else the reader must know")


class ArmResult(Record):
    """One speculative arm against the baseline over the measured levels."""

    baseline_arm: str = Field(description="the reference arm")
    spec_arm: str = Field(description="the speculative arm")
    source: Literal["simulated", "real", "mixed", "unknown"] = Field(description="where the cells come from")
    levels: list[float] = Field(description="the levels both arms have a cell at")
    configured_levels: list[float] = Field(description="the levels the config asks for")
    per_level: list[LevelRow] = Field(description="one row per level")
    invalid_cells: list[Any] = Field(description="cells left out as invalid")
    missing_cells: list[Any] = Field(description="cells not measured")
    primary_metric: str = Field(description="the metric the crossover is drawn on")
    crossover_concurrency: float | None = Field(description="where speculation stops paying (null: no crossing)")
    crossover_ci_low: float | None = Field(description="its interval's lower end")
    crossover_ci_high: float | None = Field(description="its upper end (null: open)")
    crossover: dict[str, Any] | None = Field(
        description="the estimate, its interval and their states (null: fewer than two usable levels)"
    )
    verdict: Verdict = Field(description="what the levels say")
    threshold: float | None = Field(description="the policy line's N (null: no line can be drawn)")
    notes: list[str] = Field(description="what a reader must know to read the numbers")
    winner: str | None = Field(None, description="the arm that wins everywhere, where one does")
    interval_note: str | None = Field(None, description="what the intervals rest on")
    output_match_min: float | None = Field(
        None, description="the lowest output match over the levels (null: never compared)"
    )


class PolicyLine(Record):
    """`speculate while running requests <= threshold`, by the configured rule."""

    threshold: float | None = Field(description="N (null: none)")
    rule: str = Field(description="the rule that drew it")
    verdict: str = Field(description="the arm's verdict kind")


class Unmeasured(Record):
    """The part of a schedule above the highest measured level (`analysis/unmeasured.py`): what it serves there is
    a default or an extension of the last level's choice, never a measurement."""

    first: int = Field(description="the first running-request count above the highest measured level")
    last: int = Field(description="the schedule's upper end (the engine's largest batch)")
    k: int = Field(description="the K the schedule serves there")
    highest_measured: float = Field(description="the highest level measured")
    note: str = Field(description="in words: what K there rests on")
    add_levels: list[int] = Field(description="levels above to add to `concurrency`")
    command: str = Field(description="the command that measures them")


class Schedule(Record):
    """A family's derived schedule: the draft length per load range ([[from, to, K], ...]), or why there is none."""

    schedule: list[list[int]] | None = Field(
        description="[from, to, K] ranges of running requests (null: none derived)"
    )
    reason: str = Field(description="K per level in words, or why no schedule was derived")
    rule: str | None = Field(None, description="how K was chosen per level (absent: not derived)")
    per_level: list[dict[str, Any]] | None = Field(None, description="the candidates per level (absent: not derived)")
    served_by: str | None = Field(
        None,
        description=(
            "the fixed arm whose static setting serves a schedule of one K over the whole range (K=0: the baseline), "
            "its cells the schedule's measurement, no policy server started; null: the schedule switches K"
        ),
    )
    unmeasured: Unmeasured | None = Field(
        None, description="the range above the highest measured level (null: none, the sweep reaches the upper end)"
    )


class ServedK(Record):
    """The draft length the engine served in a policy cell, from its own spec-decode counters, beside the one the
    schedule asked for (`analysis/served.py`). A figure not reported is null, never a default."""

    scheduled: int | None = Field(description="the K the schedule serves at the level (null: no range covers it)")
    served: int | None = Field(
        description="the K whose fixed arm at this level drafted the nearest tokens per decode step (0: none; null: "
        "not reported: SGLang, or counters not read; or not resolved: see turnover)"
    )
    per_step: float | None = Field(description="draft tokens per decode step (null: not reported)")
    while_drafting: float | None = Field(description="draft tokens per draft (null: no draft, or not reported)")
    drafting_share: float | None = Field(description="drafts over the cell's decode steps (null: not reported)")
    drafts: float | None = Field(description="the cell's drafts, counter delta (null: not reported)")
    draft_tokens: float | None = Field(description="the cell's draft tokens, counter delta (null: not reported)")
    references: dict[str, Any] | None = Field(
        description="per K: the draft tokens per decode step that serving it looks like, and from where"
    )
    turnover: dict[str, int] | None = Field(
        description="where the K served is another K the schedule serves at the batches the level's turnover runs "
        "(a closed loop's finishing requests leave slots empty): per batch size, its scheduled K (null: elsewhere)"
    )
    applied: bool | None = Field(
        description="served equals scheduled, or both Ks of a turnover spanning a switch were served (null: not "
        "reported, not resolved: the cell drafted as the other K alone does, or nothing scheduled)"
    )
    note: str = Field(description="in words; `served K not reported: <why>` where it is not")


class ProofLevel(Record):
    """One level of a policy proof: the policy cell against the best fixed arm, and the K the engine served."""

    concurrency: float = Field(description="the level")
    status: str = Field(
        description="better, holds, caution (the rule's own caution, within the loss it allows), fails, not "
        "decided, not judged, or not applied (the engine served another K than scheduled: no throughput verdict)"
    )
    scheduled_k: int | None = Field(None, description="the K the schedule serves here (absent: an older file)")
    served_k: ServedK | None = Field(None, description="the K the engine served (absent: an older file)")
    caution: dict[str, Any] | None = Field(
        None, description="where the rule chose a smaller K than the best fixed arm's: why, and the loss it allows"
    )


class Proof(Record):
    """The policy arm against the best fixed arm per level, paired where measured together."""

    policy_arm: str = Field(description="the arm serving the schedule")
    verdict: str = Field(description="in words (`not measured: ...` when the policy arm has no cells)")
    holds: bool | None = Field(description="whether the policy holds everywhere it was judged (null: not judged)")
    not_applied_levels: list[float] = Field(
        default_factory=list, description="levels where the engine served another K than the schedule's"
    )
    per_level: list[ProofLevel] | None = Field(
        None,
        description=(
            "policy over best fixed arm per level, with its interval and what it `compares`: the mechanism (the "
            "schedule serves that arm's own K: K>0 against the static flag, a K=0 range against the baseline "
            "server) or the schedule (another K) (absent: not measured)"
        ),
    )
    mechanism: dict[str, Any] | None = Field(
        None,
        description=(
            "per kind of mechanism row: the geometric mean ratio over its levels with a t interval (absent: no "
            "such row)"
        ),
    )


class Crossover(Record):
    """A variant's crossover.json."""

    schema_version: Literal[1] = Field(description="1")
    experiment: str = Field(description="the config's experiment")
    variant: str = Field(description="the stack analysed")
    engine: str = Field(description="sim, sglang or vllm")
    load: str = Field(description="closed, open or trace")
    source: str = Field(description="simulated, real or mixed")
    baseline_arm: str = Field(description="the arm every speculative arm is compared with")
    bootstrap: dict[str, Any] = Field(description="the interval method and its settings")
    arms: dict[str, ArmResult] = Field(description="per speculative arm")
    policy: dict[str, PolicyLine] = Field(description="per speculative arm: its policy line")
    policy_rule: str = Field(description="how a threshold is drawn from the interval (analysis.policy_rule)")
    schedules: dict[str, Schedule] = Field(default_factory=dict, description="per family with draft-length sub-arms")
    policy_proof: dict[str, Proof] = Field(default_factory=dict, description="per family with a policy arm")
    noise_floor: dict[str, Any] | None = Field(None, description="A/A comparisons, band per level")
    plots: list[str] = Field(default_factory=list, description="plot files, relative to the variant's folder")
    content: ContentFacts | None = Field(None, description="what the unit's requests held (null: not configured)")
    content_warning: str | None = Field(
        None, description="why the acceptance measured is not production's (null: none, or not a real engine)"
    )


class ClassAnswer(Record):
    """One unit's answer as contents.json lists it: its class, acceptance and crossover."""

    unit: str = Field(description="<variant>@<class> or <variant>@mix")
    content: str = Field(description="the class, or mix")
    prompts: str = Field(description="the prompts' source, in words")
    arm: str = Field(description="the speculative arm")
    accept_length: float | None = Field(description="tokens per verify pass at the lowest level (null: not reported)")
    accept_length_levels: list[float | None] = Field(
        description="the same at every configured level, in order (null: no cell, or not reported)"
    )
    crossover: float | None = Field(description="the crossover estimate (null: none in range)")
    crossover_lo: float | None = Field(description="its interval's lower end (null: open, below the levels)")
    crossover_hi: float | None = Field(description="its upper end (null: open, above the levels)")
    verdict: str = Field(description="the arm's verdict kind")
    threshold: float | None = Field(description="the policy line's N (null: none)")


class Contents(Record):
    """A variant's contents.json: the answer per content class and for the traffic mix, the spread between the
    classes, and their disagreements first."""

    schema_version: Literal[1] = Field(description="1")
    variant: str = Field(description="the stack")
    engine: str = Field(description="sim, sglang or vllm")
    source: str = Field(description="simulated, real or mixed")
    classes: list[ClassAnswer] = Field(description="per class and speculative arm, in the config's order")
    mix: list[ClassAnswer] = Field(description="the traffic mix's, per speculative arm (empty: no mix)")
    mix_shares: dict[str, float] | None = Field(description="the mix's share per class (null: no mix)")
    spread: dict[str, Any] = Field(description="per arm: the lowest and highest class crossover and accept length")
    disagreements: list[str] = Field(description="class pairs whose crossover intervals do not overlap, in words")
    warnings: list[str] = Field(description="the units' content warnings")


CROSSOVER_FIX = "rerun the analysis (snakemake --forcerun <its crossover.json>)"
