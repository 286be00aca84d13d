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


class PairedBasis(Record):
    """What a level's paired interval rests on (`analysis/paired.py`): its units, their degrees of freedom and
    the standard error of the mean log ratio; `specsweep plan --noise-from` plans with it."""

    blocks: int = Field(description="the units the interval rests on: rounds, or server instances")
    unit: Literal["round", "instance"] = Field(description="round (interleaved) or instance (instances' means)")
    df: int = Field(description="its degrees of freedom")
    spread_dominates: bool = Field(description="the units varied more than the blocks' own noise explains")
    log_se: float | None = Field(description="standard error of the mean log ratio (null: none)")
    instance_effect: bool | None = Field(None, description="interleaved instances: the pretest found an effect")


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


class Proof(Record):
    """The policy arm against the best fixed arm per level, paired where measured together."""

    policy_arm: str = Field(description="the arm serving the schedule")
    verdict: str = Field(description="in words (`not measured: ...` when the policy arm has no cells)")
    holds: bool | None = Field(description="whether the policy holds everywhere it was judged (null: not judged)")
    per_level: list[dict[str, Any]] | None = Field(
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


CROSSOVER_FIX = "rerun the analysis (snakemake --forcerun <its crossover.json>)"
