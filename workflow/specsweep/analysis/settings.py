"""The analysis's settings: the config's `analysis:` section (and top-level `slo:`, `policy.margin`) as one record.

One home for the analysis's defaults (the schema's), read by every analysis step: the crossover, the schedule,
the proof, the adaptive rounds and `specsweep plan`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specsweep.analysis.bootstrap import METRICS
from specsweep.config import configured_levels, defaults, load_mode
from specsweep.measure.metrics import slo_seconds

__all__ = ["LEVEL_SYMBOL", "AnalysisSettings"]

LEVEL_SYMBOL = {"closed": "C", "open": "rate", "trace": "scale"}  # how texts name a level, by load mode

_DEFAULTS = defaults("analysis")


@dataclass
class AnalysisSettings:
    """The config's `analysis:` section (and top-level `slo:`); defaults are the schema's (one home)."""

    replicates: int = _DEFAULTS["bootstrap_samples"]
    seed: int = _DEFAULTS["seed"]
    confidence: float = _DEFAULTS["confidence"]
    include_invalid: bool = _DEFAULTS["include_invalid"]
    baseline_arm: str = _DEFAULTS["baseline_arm"]
    primary_metric: str = _DEFAULTS["primary_metric"]
    policy_rule: str = _DEFAULTS["policy_rule"]  # "crossover_lower" or "level_lower_bound"
    slo: dict[str, float] | None = None  # seconds: ttft_s, tpot_s, e2e_s
    max_crossover_ratio: float = _DEFAULTS["max_crossover_ratio"]  # a wider crossover interval is inconclusive
    min_output_match: float = _DEFAULTS["min_output_match"]  # unreferred differences: flag a cell below this share
    output_tie_nats: float = _DEFAULTS["output_tie_nats"]  # a referred difference this close is batch numerics
    levels: list[float] | None = None  # the configured levels (concurrency, rates or time scales): what should exist
    load: str = "closed"  # closed, open or trace: the unit of the levels
    gates: dict[str, Any] = field(default_factory=lambda: defaults("gates"))  # validity, judged when cells are read
    slo_ms: dict[str, float] = field(default_factory=dict)  # the config's `slo:` as given (ms), for judging cells
    # the A/A band (lo, hi) of the primary metric's ratio per level: the indifference zone of verdicts, schedules
    # and proofs at that level when the config has an A/A arm (`noise_floor`); empty: no A/A arm measured
    noise_bands: dict[float, tuple[float, float]] = field(default_factory=dict)
    # the proof's equivalence margin (config `policy.margin`): a policy fails only below 1 - margin
    proof_margin: float = defaults("policy")["margin"]

    def noise_band_at(self, level: float) -> tuple[float, float] | None:
        """The A/A band measured at `level`; None where no A/A comparison judged it (no other level's stands in:
        the noise differs between levels, e.g. one instance effect at one level)."""
        return self.noise_bands.get(float(level))

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> AnalysisSettings:
        a = dict(config.get("analysis") or {})
        s = cls()
        s.replicates = int(a.get("bootstrap_samples", a.get("replicates", s.replicates)))
        s.seed = int(a.get("seed", s.seed))
        s.confidence = float(a.get("confidence", s.confidence))
        s.include_invalid = bool(a.get("include_invalid", s.include_invalid))
        s.baseline_arm = str(a.get("baseline_arm", s.baseline_arm))
        s.primary_metric = str(a.get("primary_metric", s.primary_metric))
        s.policy_rule = str(a.get("policy_rule", s.policy_rule))
        s.slo = slo_seconds(a.get("slo") or config.get("slo"))
        s.slo_ms = {k: float(v) for k, v in (config.get("slo") or {}).items() if v is not None}
        s.gates = {**defaults("gates"), **(config.get("gates") or {})}
        s.max_crossover_ratio = float(a.get("max_crossover_ratio", s.max_crossover_ratio))
        s.proof_margin = float((config.get("policy") or {}).get("margin", s.proof_margin))
        s.min_output_match = float(a.get("min_output_match", s.min_output_match))
        s.output_tie_nats = float(a.get("output_tie_nats", s.output_tie_nats))
        configured = configured_levels(config)
        if configured:
            s.levels = sorted(float(c) for c in configured)
        s.load = load_mode(config)
        if s.primary_metric not in {m.name for m in METRICS}:
            raise ValueError(f"analysis.primary_metric must be one of {[m.name for m in METRICS]}")
        if s.policy_rule not in {"crossover_lower", "level_lower_bound"}:
            raise ValueError("analysis.policy_rule must be 'crossover_lower' or 'level_lower_bound'")
        if not 0.5 < s.confidence < 1.0:
            raise ValueError("analysis.confidence must be in (0.5, 1)")
        if s.replicates < 10:
            raise ValueError("analysis.bootstrap_samples must be >= 10")
        if not s.max_crossover_ratio > 1.0:
            raise ValueError("analysis.max_crossover_ratio must be > 1")
        return s
