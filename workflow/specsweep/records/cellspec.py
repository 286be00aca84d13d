"""The cell spec: everything one cell's measurement depends on, as `specsweep.config.cell_spec` builds it and a
Snakemake rule hands it to `specsweep cell` / `specsweep paired-level` (a rule param: a change re-measures).
Its blocks are the validated config's (`workflow/schemas/config.schema.yaml` documents their keys)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from specsweep.records.base import Record


class CellPairing(Record):
    """How the cell is measured: alone, or in interleaved blocks with the level's other fixed arms."""

    mode: Literal["sequential", "interleaved"] = Field(description="sequential or interleaved")
    arms: list[str] | None = Field(None, description="interleaved fixed arms: the level's arms")
    reference: Any = Field(None, description="interleaved policy cell: the fixed arm it pairs with (null: none)")
    instances: int | None = Field(
        None, ge=2, description="interleaved: server instances per arm, all up at once, the rounds going through them"
    )


class CellPrecision(Record):
    """An interleaved level's stopping rule (`precision:` in the config)."""

    target: float | None = Field(description="the paired speedup's 95% half-width to reach (null: `repeats` rounds)")
    min_rounds: int = Field(ge=3, description="rounds before the rule may stop")
    max_rounds: int = Field(ge=3, description="the budget in rounds")
    max_level_s: float | None = Field(description="the budget in seconds of measuring (null: rounds only)")
    max_block_growth: int = Field(ge=1, description="the largest block, in configured blocks")


class CellLoad(Record):
    """An open or trace cell's slice of `load:`."""

    mode: Literal["open", "trace"] = Field(description="open or trace")
    max_in_flight: int = Field(description="the in-flight cap")


class CellSpec(Record):
    """One cell: which server (variant x arm), which level, what load."""

    experiment: str = Field(description="the config's experiment")
    results_dir: str = Field(description="where results go")
    variant_name: str = Field(description="the variant")
    variant: dict[str, Any] = Field(description="the variant as configured, its server flags for this arm merged")
    arm_name: str = Field(description="the cell's arm (its folder)")
    arm: dict[str, Any] = Field(description="the arm's config; a policy arm's holds the schedule it serves")
    pairing: CellPairing = Field(description="alone or interleaved")
    repeats: int = Field(ge=1, description="closed-loop repeats, or interleaved rounds without a precision target")
    precision: CellPrecision | None = Field(None, description="interleaved levels: the stopping rule")
    workload: dict[str, Any] = Field(description="the config's workload block")
    client: dict[str, Any] = Field(description="the config's client block")
    concurrency: int = Field(ge=1, description="C (open and trace: the in-flight cap)")
    n_requests: int = Field(ge=0, description="measured requests per repeat (a trace level: 0, the whole trace)")
    load: CellLoad | None = Field(None, description="open and trace cells")
    level: float | None = Field(None, description="open: requests/s; trace: time scale")
    refer_against: str | None = Field(
        None,
        description="sequential speculative cells: the baseline arm whose recorded outputs its differences are "
        "referred against, replayed on this cell's own server (measure/referral.py)",
    )

    @model_validator(mode="after")
    def _requests_are_counted(self) -> CellSpec:
        """Zero requests means the whole trace, and only a trace level has one."""
        if self.n_requests == 0 and (self.load is None or self.load.mode != "trace"):
            raise ValueError("n_requests is 0, and only a trace level measures its whole trace")
        return self


CELL_SPEC_FIX = "build the spec with specsweep.config.cell_spec (the workflow does), or run the cell through snakemake"
