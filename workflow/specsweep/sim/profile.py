"""Simulated-engine profiles: YAML data files holding the step-time model's physical parameters.

A profile is data, not code, so that calibration can write one and a user can read what a number means.
Validation names the offending field (`step.fixed_s`), because a silently ignored typo would quietly change
every prediction.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any

import yaml


class ProfileError(ValueError):
    """A profile file is missing, malformed, or has a bad field (the message names it)."""


@dataclass(frozen=True)
class ModelFacts:
    """Facts about the served model and its parallelism that shape the step time."""

    layers: int = 32
    allreduces_per_layer: int = 2
    tensor_parallel: int = 1
    experts_total: int = 0  # routed experts per MoE layer; 0 = dense model
    experts_active: int = 0  # routed experts each token activates


@dataclass(frozen=True)
class StepCosts:
    """Seconds spent by one engine step, split by what drives them (see docs/sim.md)."""

    fixed_s: float = 0.004  # per step: launch overhead, non-expert weight reads, scheduling
    per_seq_s: float = 0.0001  # per running sequence in the step: KV reads, sampling, bookkeeping
    per_token_s: float = 0.0002  # per decode or verify token in the step
    prefill_token_s: float = 0.00001  # per prompt token in the step's prefill chunk (compute-bound)
    per_context_token_s: float = 0.0  # per token of context (prompt + generated) of each decoding sequence
    allreduce_s: float = 0.0  # latency of one tensor-parallel all-reduce (only when tensor_parallel > 1)
    expert_read_s: float = 0.0  # reading every routed expert's weights once; a step pays the touched fraction


@dataclass(frozen=True)
class Speculative:
    """EAGLE-3-like speculation: k draft tokens per step, each accepted with probability accept_prob."""

    algorithm: str = "EAGLE3"
    draft_tokens: int = 3  # k: draft length verified per step
    accept_prob: float = 0.7  # per-token acceptance probability a (accepted prefix ~ geometric, truncated at k)
    draft_step_s: float = 0.0005  # per draft step (k per engine step): draft forward incl. its all-reduces
    draft_per_seq_s: float = 0.0  # per draft step and running sequence
    max_running_requests: int | None = None  # cap under speculation (SGLang caps EAGLE at 48 by default)
    step: dict[str, float] = field(default_factory=dict)  # StepCosts overrides that apply in speculative mode
    # Switching cost of a per-load schedule (docs/sim.md, "Speculation schedules"): while drafting is off the
    # draft model's KV cache does not follow; when it resumes, the draft model prefills every token generated
    # meanwhile, at this cost per token (None: draft_per_seq_s, one sequence's share of a draft step).
    catchup_token_s: float | None = None


@dataclass(frozen=True)
class Batching:
    """Scheduler limits."""

    max_running_requests: int = 256
    prefill_chunk_tokens: int = 2048  # prompt tokens prefilled per step (chunked prefill budget)
    max_model_len: int = 8192


@dataclass(frozen=True)
class Hardware:
    """Facts about the GPUs and the model's bytes, from spec sheets and the model's shape (not fitted):
    `virtual.bounds` derives from them the fastest each step cost could physically be and how many requests fit in
    KV memory. `gpus: 0` means not stated: no physical bounds."""

    gpus: int = 0
    gpu_memory_gb: float = 0.0  # per GPU
    memory_bandwidth_gbs: float = 0.0  # per GPU, peak read bandwidth of its memory
    interconnect: str = ""  # e.g. "PCIe Gen5 x16, no NVLink"
    interconnect_gbs: float = 0.0  # per GPU and direction
    weight_gb: float = 0.0  # resident weights of the whole model, all GPUs together
    dense_weight_gb: float = 0.0  # weights every step reads in full (attention, shared experts, embeddings)
    expert_weight_gb: float = 0.0  # routed experts' weights (a step reads the fraction its tokens touch)
    kv_bytes_per_token: float = 0.0  # KV cache per token of context, all layers, one copy
    kv_replicated: bool = True  # every TP rank holds the whole KV (MLA under TP); false: sharded over ranks
    reserved_gb: float = 0.0  # per GPU, memory neither weights nor KV (activations, CUDA graphs, workspace)


@dataclass(frozen=True)
class ContentProfile:
    """How one content class behaves on this engine (docs/sim.md "Content classes"): how often its drafts are
    accepted (templated text and code repeat themselves, free prose does not) and where its answers end when
    requests stop naturally. A request names its class in the X-Specsweep-Content header; the class `default`
    stands for every class not listed."""

    accept_prob: float | None = None  # per-token draft acceptance (None: speculative.accept_prob)
    answer_tokens: int | None = None  # mean answer length at a natural stop (None: answers run to their cap)


DEFAULT_CONTENT = "default"  # the `contents` entry for a class the profile does not list (or none named)
ANSWER_SPREAD = 0.6  # the log-normal spread of natural answer lengths around a class's mean


@dataclass(frozen=True)
class Profile:
    """One simulated engine: model facts, step costs, batching and speculation parameters."""

    name: str
    description: str = ""
    illustrative: bool = True
    model: ModelFacts = field(default_factory=ModelFacts)
    step: StepCosts = field(default_factory=StepCosts)
    batching: Batching = field(default_factory=Batching)
    speculative: Speculative = field(default_factory=Speculative)
    hardware: Hardware = field(default_factory=Hardware)
    reference: dict[str, Any] = field(default_factory=dict)  # measurements the profile reproduces (free form)
    contents: dict[str, ContentProfile] = field(default_factory=dict)  # per content class; `default` for the rest

    def content(self, name: str) -> ContentProfile:
        """The class's behaviour: its own entry, else `default`'s, else the speculative section's acceptance and
        no natural end."""
        return self.contents.get(name) or self.contents.get(DEFAULT_CONTENT) or ContentProfile()

    def accept_prob(self, content: str = "") -> float:
        """Per-token draft acceptance for a content class."""
        own = self.content(content).accept_prob
        return self.speculative.accept_prob if own is None else own

    def step_costs(self, speculative: bool) -> StepCosts:
        """Step costs for an arm: speculative mode may override some (e.g. verify falling off CUDA graphs)."""
        if speculative and self.speculative.step:
            return dataclasses.replace(self.step, **self.speculative.step)
        return self.step

    def running_cap(self, speculative: bool, context_tokens: int | None = None) -> int:
        """The scheduler's cap on running requests; with `context_tokens` (prompt + output of a request) also
        what fits in KV memory when the hardware facts say (`kv_capacity`)."""
        cap = self.batching.max_running_requests
        if speculative and self.speculative.max_running_requests:
            cap = self.speculative.max_running_requests
        kv = self.kv_capacity(context_tokens) if context_tokens else None
        return cap if kv is None else max(1, min(cap, kv))

    def kv_capacity(self, context_tokens: int) -> int | None:
        """Requests of `context_tokens` whose KV cache fits in the GPU memory left after weights and reserve;
        None when the hardware facts are not stated."""
        hw = self.hardware
        if hw.gpus <= 0 or hw.gpu_memory_gb <= 0 or hw.kv_bytes_per_token <= 0 or context_tokens <= 0:
            return None
        free = (hw.gpu_memory_gb - hw.weight_gb / hw.gpus - hw.reserved_gb) * 1e9
        per_gpu = hw.kv_bytes_per_token if hw.kv_replicated else hw.kv_bytes_per_token / self.model.tensor_parallel
        return max(0, int(free // (per_gpu * context_tokens)))

    def expected_accept_length(self, content: str = "") -> float:
        """Mean tokens per verify step: accepted draft prefix (truncated geometric) plus the bonus token."""
        a, k = self.accept_prob(content), self.speculative.draft_tokens
        return 1.0 + sum(a**i for i in range(1, k + 1))

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if not d["contents"]:
            del d["contents"]
        if not d["speculative"]["step"]:
            d["speculative"]["step"] = {}
        return d

    def get(self, dotted: str) -> float:
        """A parameter by dotted name: `step.fixed_s`, `speculative.accept_prob`, `speculative.step.x`."""
        parts = dotted.split(".")
        if parts[:2] == ["speculative", "step"]:
            return float(self.speculative.step.get(parts[2], getattr(self.step, parts[2])))
        return float(getattr(getattr(self, parts[0]), parts[1]))

    def with_params(self, params: dict[str, float]) -> Profile:
        """A copy with some dotted-name parameters replaced, validated again."""
        d = self.to_dict()
        for dotted, value in params.items():
            parts = dotted.split(".")
            node = d
            for p in parts[:-1]:
                node = node.setdefault(p, {})
            node[parts[-1]] = value
        return profile_from_dict(d, source=f"{self.name} (modified)")


_SECTIONS: dict[str, type] = {
    "model": ModelFacts,
    "step": StepCosts,
    "batching": Batching,
    "speculative": Speculative,
    "hardware": Hardware,
}


def _check_value(where: str, value: Any, typ: Any) -> Any:
    """Coerce one scalar to its declared type, or raise naming the field."""
    t = str(typ)
    if value is None and "None" in t:
        return None
    if "int" in t and "float" not in t:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProfileError(f"{where}: expected an integer, got {value!r}")
        if value < 0:
            raise ProfileError(f"{where}: must be >= 0, got {value}")
        return value
    if "float" in t:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ProfileError(f"{where}: expected a number, got {value!r}")
        if value < 0:
            raise ProfileError(f"{where}: must be >= 0, got {value}")
        return float(value)
    if "bool" in t:
        if not isinstance(value, bool):
            raise ProfileError(f"{where}: expected true or false, got {value!r}")
        return value
    if "str" in t:
        if not isinstance(value, str):
            raise ProfileError(f"{where}: expected a string, got {value!r}")
        return value
    return value


def _section(name: str, cls: type, raw: Any) -> Any:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ProfileError(f"{name}: expected a mapping, got {type(raw).__name__}")
    known = {f.name: f for f in fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in known:
            raise ProfileError(f"{name}.{key}: unknown field (known: {', '.join(sorted(known))})")
        if name == "speculative" and key == "step":
            kwargs[key] = _step_overrides(value)
            continue
        kwargs[key] = _check_value(f"{name}.{key}", value, known[key].type)
    return cls(**kwargs)


def _step_overrides(raw: Any) -> dict[str, float]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ProfileError("speculative.step: expected a mapping of step costs")
    step_fields = {f.name for f in fields(StepCosts)}
    out: dict[str, float] = {}
    for key, value in raw.items():
        if key not in step_fields:
            raise ProfileError(f"speculative.step.{key}: unknown field (known: {', '.join(sorted(step_fields))})")
        out[key] = _check_value(f"speculative.step.{key}", value, "float")
    return out


def _contents(raw: Any) -> dict[str, ContentProfile]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ProfileError("contents: expected a mapping of content class -> {accept_prob, answer_tokens}")
    out = {str(name): _section(f"contents.{name}", ContentProfile, spec) for name, spec in raw.items()}
    for name, c in out.items():
        if c.accept_prob is not None and not 0.0 <= c.accept_prob < 1.0:
            raise ProfileError(f"contents.{name}.accept_prob: must be in [0, 1), got {c.accept_prob}")
        if c.answer_tokens is not None and c.answer_tokens < 1:
            raise ProfileError(f"contents.{name}.answer_tokens: must be >= 1 or null, got {c.answer_tokens}")
    return out


def profile_from_dict(raw: Any, source: str = "<dict>") -> Profile:
    """Build and validate a profile from parsed YAML."""
    if not isinstance(raw, dict):
        raise ProfileError(f"{source}: a profile must be a YAML mapping")
    raw = copy.deepcopy(raw)
    top = {f.name for f in fields(Profile)}
    for key in raw:
        if key not in top:
            raise ProfileError(f"{key}: unknown field in {source} (known: {', '.join(sorted(top))})")
    if not isinstance(raw.get("name"), str) or not raw["name"]:
        raise ProfileError(f"name: a profile needs a non-empty string name ({source})")
    kwargs: dict[str, Any] = {"name": raw["name"]}
    kwargs["description"] = _check_value("description", raw.get("description", ""), "str")
    kwargs["illustrative"] = _check_value("illustrative", raw.get("illustrative", True), "bool")
    ref = raw.get("reference", {}) or {}
    if not isinstance(ref, dict):
        raise ProfileError("reference: expected a mapping")
    kwargs["reference"] = ref
    kwargs["contents"] = _contents(raw.get("contents"))
    for name, cls in _SECTIONS.items():
        kwargs[name] = _section(name, cls, raw.get(name))
    profile = Profile(**kwargs)
    _check_ranges(profile)
    return profile


def _check_ranges(p: Profile) -> None:
    s = p.speculative
    if not 0.0 <= s.accept_prob < 1.0:
        raise ProfileError(f"speculative.accept_prob: must be in [0, 1), got {s.accept_prob}")
    if s.draft_tokens < 1:
        raise ProfileError(f"speculative.draft_tokens: must be >= 1, got {s.draft_tokens}")
    if s.max_running_requests is not None and s.max_running_requests < 1:
        raise ProfileError("speculative.max_running_requests: must be >= 1 or null")
    if p.batching.max_running_requests < 1:
        raise ProfileError("batching.max_running_requests: must be >= 1")
    if p.batching.prefill_chunk_tokens < 1:
        raise ProfileError("batching.prefill_chunk_tokens: must be >= 1")
    if p.model.tensor_parallel < 1:
        raise ProfileError("model.tensor_parallel: must be >= 1")
    if p.model.experts_active > p.model.experts_total:
        raise ProfileError("model.experts_active: must not exceed model.experts_total")
    for arm in (False, True):
        c = p.step_costs(arm)
        if c.fixed_s + c.per_seq_s + c.per_token_s <= 0:
            raise ProfileError("step.fixed_s: fixed, per-sequence and per-token costs cannot all be zero")


def profiles_dir() -> Path:
    return Path(str(resources.files("specsweep.sim") / "profiles"))


def available_profiles() -> list[str]:
    return sorted(p.stem for p in profiles_dir().glob("*.yaml"))


def load_profile(name_or_path: str | Path) -> Profile:
    """Load a packaged profile by name (`demo`) or a YAML file by path."""
    path = Path(name_or_path)
    if not (path.suffix in (".yaml", ".yml") or path.exists()):
        path = profiles_dir() / f"{name_or_path}.yaml"
        if not path.exists():
            raise ProfileError(f"unknown profile {name_or_path!r} (packaged: {', '.join(available_profiles())})")
    if not path.exists():
        raise ProfileError(f"profile file not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ProfileError(f"{path}: not valid YAML: {e}") from e
    return profile_from_dict(raw, source=str(path))


def dump_profile(profile: Profile, path: str | Path, header: str = "") -> None:
    """Write a profile as YAML (used by calibrate)."""
    text = yaml.safe_dump(profile.to_dict(), sort_keys=False)
    Path(path).write_text((header + "\n" if header else "") + text)
