"""Physical bounds on a profile's step costs, derived from its `hardware` facts (docs/sim.md, "Bounds").

Why: a handful of measured cells cannot tell every step cost apart, and an unconstrained fit lets one parameter
absorb what another caused (the Kimi profiles once charged 1.85 us per context token, ~50x what reading MLA's
KV cache at the card's bandwidth costs). A read cannot be faster than the memory's bandwidth allows; that gives
each read-driven cost a floor. Real kernels reach a fraction of peak bandwidth, so the ceiling is the floor
times `slack` (the lowest efficiency believed possible, 1/slack). Costs with no bandwidth floor are bounded by
`free_range` around the base profile's value, and reported as such. (KV memory caps the running requests:
`Profile.kv_capacity`.)
"""

from __future__ import annotations

from dataclasses import dataclass

from specsweep.sim.profile import Profile

DEFAULT_SLACK = 20.0  # kernels reach at least 5% of peak read bandwidth
DEFAULT_FREE_RANGE = 30.0  # parameters without a physical floor: base / 30 .. base x 30


@dataclass(frozen=True)
class Bound:
    """The range a parameter may take and where it comes from."""

    lo: float
    hi: float
    why: str
    physical: bool  # derived from hardware facts (else only a search range around the base value)


def _per_gpu_kv_bytes(profile: Profile) -> float:
    hw = profile.hardware
    tp = max(1, profile.model.tensor_parallel)
    return hw.kv_bytes_per_token if hw.kv_replicated else hw.kv_bytes_per_token / tp


def read_floors(profile: Profile) -> dict[str, tuple[float, str]]:
    """The fastest each read-driven step cost can be: bytes per GPU / bandwidth per GPU (seconds)."""
    hw = profile.hardware
    if hw.gpus <= 0 or hw.memory_bandwidth_gbs <= 0:
        return {}
    bw = hw.memory_bandwidth_gbs * 1e9
    out: dict[str, tuple[float, str]] = {}
    if hw.kv_bytes_per_token > 0:
        b = _per_gpu_kv_bytes(profile)
        why = f"{b:.0f} B of KV per token per GPU / {hw.memory_bandwidth_gbs} GB/s"
        out["step.per_context_token_s"] = (b / bw, why)
    if hw.dense_weight_gb > 0:
        b = hw.dense_weight_gb * 1e9 / hw.gpus
        out["step.fixed_s"] = (b / bw, f"{b / 1e9:.2f} GB of dense weights per GPU / {hw.memory_bandwidth_gbs} GB/s")
    if hw.expert_weight_gb > 0:
        b = hw.expert_weight_gb * 1e9 / hw.gpus
        why = f"{b / 1e9:.1f} GB of routed experts per GPU / {hw.memory_bandwidth_gbs} GB/s"
        out["step.expert_read_s"] = (b / bw, why)
    return out


def parameter_bounds(
    profile: Profile,
    params: list[str],
    slack: float = DEFAULT_SLACK,
    free_range: float = DEFAULT_FREE_RANGE,
) -> dict[str, Bound]:
    """A Bound for each fitted parameter: physical where the hardware facts give a floor, else a search range."""
    floors = read_floors(profile)
    out: dict[str, Bound] = {}
    for name in params:
        if name in floors:
            floor, why = floors[name]
            out[name] = Bound(floor, floor * slack, f">= {why}; <= {slack:g}x that (>= {100 / slack:g}% of peak)", True)
        elif name == "speculative.accept_prob":
            out[name] = Bound(0.01, 0.99, "a probability", True)
        else:
            base = profile.get(name)
            why = f"no physical floor: base {base:.3g} /x {free_range:g}"
            out[name] = Bound(base / free_range, base * free_range, why, False)
    return out


def check_profile(profile: Profile, params: list[str]) -> list[str]:
    """Parameters of `profile` outside their physical bounds, as messages (empty: all within)."""
    out = []
    for name, b in parameter_bounds(profile, params).items():
        if not b.physical:
            continue
        v = profile.get(name)
        if not b.lo * (1 - 1e-3) <= v <= b.hi * (1 + 1e-3):  # to the 4 digits a profile file states
            out.append(f"{name} = {v:.3g} outside [{b.lo:.3g}, {b.hi:.3g}] ({b.why})")
    return out
