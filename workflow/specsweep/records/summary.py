"""summary.json: one measured level. `MeasuredLevel` is what every summary holds (`specsweep bench` writes it
alone); `CellSummary` is a pipeline cell's, with its identity, server facts and stack. Built only by
`specsweep.measure.summary`; the judgement (validity, goodput) is not stored, it is made when a cell is read."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from specsweep.records.base import Record

SUMMARY_SCHEMA_VERSION = 3  # 3: no validity or goodput stored (judged when read)


class Distribution(Record):
    """A per-request quantity over the measured requests (milliseconds for *_ms)."""

    n: int = Field(description="requests (or gaps) it is computed over; 0 leaves the figures null")
    mean: float | None = Field(None, description="mean")
    p50: float | None = Field(None, description="median")
    p90: float | None = Field(None, description="90th percentile")
    p99: float | None = Field(None, description="99th percentile")


class OutputLengths(Record):
    """Where the measured answers ended (docs/metrics.md "Natural stops"): with a natural stop at the model's end
    of text or at the cap, with a fixed one always at the cap."""

    n: int = Field(description="answers (measured, successful requests); 0 leaves the figures null")
    mean: float | None = Field(None, description="mean tokens")
    p10: float | None = Field(None, description="10th percentile of tokens")
    p50: float | None = Field(None, description="median tokens")
    p90: float | None = Field(None, description="90th percentile of tokens")
    cap_share: float | None = Field(None, description="share that reached its cap (the tokens asked)")


class SteadyWindow(Record):
    """The part of a repeat in which every client slot was busy (docs/metrics.md), seconds from its t0."""

    start_s: float | None = Field(description="start, seconds from the repeat's t0 (null: no window)")
    end_s: float | None = Field(description="end")


class Metrics(Record):
    """A level's figures (pooled over its repeats) or one repeat's; definitions in `specsweep.measure.metrics`."""

    n_requests: int = Field(description="requests sent, ramp requests and fillers included")
    n_measured: int = Field(description="requests that count (ramp requests and fillers left out)")
    n_ok: int = Field(description="requests that ended without error")
    n_answered: int | None = Field(
        None, description="requests that received a token, aborted fillers included (null: measured before fillers)"
    )
    output_tokens_total: int = Field(description="tokens received")
    duration_s: float | None = Field(description="first send to last end")
    steady_window: SteadyWindow | None = Field(description="where throughput is measured; null: none")
    steady_window_s: float | None = Field(description="the steady window's length")
    output_tok_s_steady: float | None = Field(description="tokens delivered per second in the steady window")
    output_tok_s_total: float | None = Field(description="tokens over the whole duration")
    request_throughput_rps: float | None = Field(description="requests completed per second")
    achieved_concurrency: float | None = Field(description="mean requests in flight in the steady window")
    running_requests_mean: float | None = Field(
        description="mean requests running in the server (its own count where reported)"
    )
    load: str = Field(description="closed, open or trace")
    ttft_ms: Distribution = Field(description="time to first token")
    tpot_ms: Distribution = Field(description="time per output token after the first, per request")
    e2e_ms: Distribution = Field(description="send to last token")
    output_lengths: OutputLengths | None = Field(None, description="the answers' lengths (null: an older cell)")
    accept_length_per_request: Distribution | None = Field(
        None,
        description="each request's tokens per verify pass, where the engine reports its passes per request "
        "(SGLang, the simulated engine; n 0 for vLLM, whose counters give the cell's mean `accept_length`)",
    )


class ServerCpu(Record):
    """The server process tree's CPUs during one block (`specsweep.telemetry.process`, from /proc and its cgroup)."""

    granted_share: float | None = Field(
        description="CPU time its threads got over the time they were ready to run (got + waited for a CPU), from "
        "/proc/<pid>/task/<tid>/schedstat; null where the kernel does not expose it"
    )
    wait_cores: float | None = Field(description="CPU seconds per second its threads were ready but waited")
    cpu_cores: float = Field(description="CPU seconds per second the tree used (user + system, clock ticks)")
    allowed_cores: float = Field(description="the CPUs it was allowed: its CPU set, or its cgroup's quota if lower")
    cpu_share: float = Field(description="cpu_cores over allowed_cores")
    cpu_share_resolution: float = Field(description="the smallest cpu_share change the clock ticks tell apart")
    cpus: list[int] = Field(description="the CPUs its processes may run on (affinity, all of them)")
    cgroup_quota_cores: float | None = Field(description="its cgroup's CPU quota in cores (null: unlimited or unread)")
    cgroup_throttled_share: float | None = Field(
        description="share of the block its cgroup was throttled by that quota (null: not exposed)"
    )
    rss_mb: float | None = Field(description="resident memory of the tree at the block's end, MiB")
    procs: int = Field(description="processes in the tree")


class GpuState(Record):
    """One GPU during one block, sampled through NVML (`specsweep.telemetry.gpu`; docs/metrics.md). A figure the
    GPU does not expose is null."""

    index: int = Field(description="the GPU's NVML index (nvidia-smi's order)")
    uuid: str | None = Field(description="its UUID")
    name: str | None = Field(description="its model name")
    source: str = Field(description="nvml")
    samples: int = Field(description="readings taken during the block (every 0.5 s, at least one)")
    sm_clock_mhz: float | None = Field(description="median SM clock over the block's samples")
    sm_clock_min_mhz: float | None = Field(description="lowest SM clock sampled")
    sm_clock_max_mhz: float | None = Field(description="the GPU's maximum SM clock")
    mem_clock_mhz: float | None = Field(description="median memory clock")
    power_w: float | None = Field(description="mean power draw, W")
    power_limit_w: float | None = Field(description="the enforced power limit, W")
    temperature_c: float | None = Field(description="highest GPU temperature sampled, C")
    throttle_reasons: list[str] | None = Field(description="throttle (clock event) reasons active in any sample")
    throttled_thermal_power: bool | None = Field(
        description="a thermal or power-brake throttle reason was active in some sample (not sw_power_cap)"
    )
    other_processes_mib: float | None = Field(description="GPU memory held by processes outside the server, MiB")
    other_processes: list[int] | None = Field(description="those processes' pids")
    ecc_uncorrected: int | None = Field(description="volatile uncorrected ECC errors during the block")
    xid_events: list[int] | None = Field(description="XID codes posted during the block")
    energy_j: float | None = Field(description="energy used during the block, J")


class ServerState(Record):
    """The serving side during one block: its CPUs and, for GPU engines, its GPUs."""

    cpu: ServerCpu | None = Field(description="the server tree's CPUs (null: the server's process was not readable)")
    gpus_watched: bool = Field(description="whether its GPUs were watched (a GPU variant)")
    gpus: list[GpuState] | None = Field(description="each watched GPU (null: not watched, or NVML unavailable)")


class RepeatSummary(Record):
    """One repeat (closed loop) or one interleaved block of the level."""

    repeat: int = Field(description="its index: the round of an interleaved level")
    metrics: Metrics = Field(description="its figures, defined as the pooled ones")
    t0_unix: float | None = Field(None, description="wall-clock time of its first send")
    cache_reset: str | None = Field(None, description="outcome of the prefix-cache reset before it")
    prompt_set_sha256: str | None = Field(None, description="the prompts it sent")
    server_state: ServerState | None = Field(
        None, description="the serving side during it (null: the server's process was not watched)"
    )


class Measurement(Record):
    """What the measuring process knows: reasons invalidate the cell whatever the gates, flags are shown."""

    reasons: list[str] = Field(description="why the cell is invalid whatever the gates (empty: none)")
    flags: list[str] = Field(description="noted, not invalidating")


class Workload(Record):
    """What was sent (the request count, prompts and generation settings)."""

    backend: str = Field(description="sglang (native /generate) or openai")
    endpoint: str = Field(description="generate, completions or chat")
    n_requests: int = Field(description="measured requests per repeat")
    ramp_requests: int = Field(description="a slot's first, shortened requests that stagger the slots")
    stagger: bool = Field(description="whether the slots were staggered by shortened ramp requests")
    output_tokens: Any = Field(description="tokens asked per request (a number, or a distribution)")
    temperature: float = Field(description="sampling temperature (0: greedy)")
    request_timeout_s: float = Field(description="a request slower than this failed")
    repeats: int = Field(description="repeats (rounds) of the level")
    prompt_set_sha256: str | None = Field(None, description="all prompts of the level")
    stop: Literal["fixed", "natural"] = Field(
        "fixed", description="fixed: every answer its full length (ignore_eos); natural: the length was a cap"
    )
    content: str | None = Field(None, description="the unit's content class (workload.classes; mix: the mix)")


class MeasuredLevel(Record):
    """The measured part every summary.json holds (`measure.summary.summary_body` builds it)."""

    schema_version: Literal[3] = Field(description="3: validity and goodput are judged on read, not stored")
    concurrency: int = Field(description="closed-loop C (open and trace loads: the in-flight cap)")
    workload: Workload = Field(description="what was sent")
    metrics: Metrics = Field(description="pooled over the repeats")
    repeats: list[RepeatSummary] = Field(min_length=1, description="one entry per repeat (interleaved: per round)")
    server_max_running: int | None = Field(description="the server's own cap on running requests, where known")
    measurement: Measurement = Field(description="the measuring process's own reasons and flags")
    t0_unix: float | None = Field(None, description="wall-clock time of the level's first send")


class CellIdentity(Record):
    """Which cell: the key that names it in the results, MLflow and the analysis."""

    experiment: str = Field(description="the config's experiment")
    variant: str = Field(description="the stack")
    arm: str = Field(description="the server configuration")
    concurrency: int = Field(description="C (open and trace: the in-flight cap)")
    key: str = Field(description="experiment/variant/arm/<level>")
    speculative: bool = Field(description="whether the arm speculates")
    load: Literal["open", "trace"] | None = Field(None, description="open and trace cells only")
    level: float | None = Field(None, description="open: requests/s; trace: time scale")


class ServerFacts(Record):
    """The server the cell measured: its command (secrets masked) and what it reported about itself."""

    engine: str = Field(description="sim, sglang or vllm")
    identity: str = Field(description="hash of what makes two servers the same (command, environment)")
    argv: list[str] = Field(description="the command line, secrets masked")
    env: dict[str, str] = Field(description="the environment variables it was given (secrets masked)")
    host: str = Field(description="where it listened")
    port: int = Field(description="its port")
    resource: str = Field(description="the GPUs or CPUs it holds")
    info: dict[str, Any] = Field(description="the engine's facts (/server_info, /version, its log): `engines`")
    pid: int | None = Field(description="its process id")
    started_at: float | None = Field(description="when it started (Unix time)")
    ready_after_s: float | None = Field(description="seconds the cell waited for it")
    instances: list[dict[str, Any]] | None = Field(
        None, description="an arm on several server instances (pairing.instances): each one's number, identity, pid"
    )


class StackRef(Record):
    """The variant's environment: its fingerprint file and recipe facts."""

    fingerprint: str = Field(description="path of the variant's fingerprint JSON (the env rule's output)")
    recipe: dict[str, Any] | None = Field(description="the recipe's hash, packages and build time (null: no recipe)")


class Block(Record):
    """One block of a paired level: an arm's repeat, when it ran, and (segments) on which server instance."""

    arm: str = Field(description="whose block")
    repeat: int = Field(description="its round")
    start_unix: float | None = Field(None, description="when it started")
    end_unix: float | None = Field(None, description="when it ended")
    instance: int | None = Field(None, description="pairing.instances > 1: the arm's server instance (1, 2, ...)")


class RoundLog(Record):
    """How an interleaved level with a precision target went, round by round (`analysis/precision.py`)."""

    target: float = Field(description="the paired speedup's 95% half-width the level was measured to (relative)")
    rounds: int = Field(description="rounds measured")
    block_requests: list[int] = Field(description="each round's measured requests per block (blocks grow)")
    round_s: list[float] = Field(description="each round's seconds, every arm's blocks")
    round_overhead_s: list[float] = Field(description="each round's seconds besides its measured requests")
    decisions: list[str] = Field(description="the rule's answer after each round from the first it was asked")


class InstanceLog(Record):
    """How a sequential level with precision.max_instances went, instance pair by instance pair: from
    pairing.instances on, the rule asked after each pair whether the level's answer is known
    (`analysis/precision.py`, `segment_step`), and a pair was added while it was not."""

    target: float = Field(description="the paired speedup's 95% half-width the level was measured to (relative)")
    max_instances: int = Field(description="the budget: server instances per arm (precision.max_instances)")
    instances: int = Field(description="server instances per arm measured")
    decisions: list[str] = Field(description="the rule's answer after each pair from pairing.instances on")


class SegmentDecision(Record):
    """The segment rule's answer for one sequential level after its first `instances` instance pairs (the
    `segment_need` checkpoint's file): whether the DAG adds another pair at this level."""

    instances: int = Field(description="server instances per arm the answer rests on")
    more: bool = Field(description="another instance pair is measured at this level")
    decision: str = Field(description="why: the target met, or the half-width reached against it")
    half_width: float | None = Field(description="the widest arm's 95% relative half-width the rule stops on")


class Pairing(Record):
    """How the arms of a level were measured together (docs/analysis.md, paired intervals)."""

    mode: Literal["interleaved", "segments"] = Field(
        description="interleaved (blocks of all arms on servers up at once) or segments (instances one after another)"
    )
    id: str = Field(description="cells with the same id were measured together: they pair")
    arms: list[str] = Field(description="the arms measured together")
    reference_arm: str | None = Field(None, description="the arm the others are compared with")
    blocks: list[Block] = Field(description="each block: arm, repeat, when it ran")
    instances: int | None = Field(None, description="server instances per arm, where more than one")
    precision: RoundLog | None = Field(None, description="measured until its answer was known: the rounds' log")
    instance_log: InstanceLog | None = Field(
        None, description="segments measured until the answer was known (precision.max_instances): the pairs' log"
    )


class ReferredOutput(Record):
    """One output that differs from the reference arm's, referred to the reference server (client/referral.py)."""

    repeat: int = Field(description="its round")
    prompt_index: int = Field(description="its prompt in the round's set")
    char: int = Field(description="the first character where the two outputs differ")
    token_char: int = Field(description="where the token they part at starts")
    reference_token: str | None = Field(None, description="the reference arm's token there")
    other_token: str | None = Field(
        None, description="this arm's token there (null: its text matches none of the server's whole candidates)"
    )
    reference_logprob: float | None = Field(None, description="the reference token's log-probability")
    other_logprob: float | None = Field(None, description="this arm's token's log-probability")
    margin_nats: float | None = Field(
        None, description="reference minus this arm's log-probability (null: this arm's token not matched)"
    )
    steps: int = Field(description="requests sent (one replay)")
    error: str | None = Field(None, description="why it was not referred (the figures are then null)")
    other_head: str = Field("", description="this arm's text from token_char on")
    reference_id: int | None = Field(None, description="the reference token's id, where the API gives ids (SGLang)")
    other_id: int | None = Field(None, description="this arm's token's id, where the API gives ids")
    margin_at_least_nats: float | None = Field(
        None,
        description=(
            "this arm's token not matched: the reference's log-probability minus the highest this arm's token "
            "could have (the candidate at bound_rank), a lower bound on the margin"
        ),
    )
    bound_rank: int | None = Field(
        None,
        description=(
            "the candidate (from 1) bounding this arm's token: a partial character (its text alone U+FFFD or "
            "empty, matched by no output text) it may be, else the last (a token outside the top k scores less)"
        ),
    )
    bound_token: str | None = Field(None, description="that candidate's text")


class ReferralCheck(Record):
    """One of the reference's own outputs replayed by its server and read back (client/referral.py)."""

    repeat: int = Field(description="the output's round")
    prompt_index: int = Field(description="its prompt")
    char: int = Field(description="characters the replay's tokens joined to")
    agrees: bool = Field(description="the replay's token texts join to its text (else no referral is trusted)")
    expected: str = Field(description="the recorded output's head")
    top: str | None = Field(None, description="the replay's head")
    reproduces: bool | None = Field(None, description="the replay equals the recorded output over its length")
    error: str | None = Field(None, description="why it could not be asked")


class OutputReferral(Record):
    """The cell's outputs against the reference arm's at the level, differences referred while its server was up."""

    against: str = Field(description="the reference arm whose outputs this cell's are compared with")
    replayed_by: str = Field(
        "reference", description="whose server replayed: the reference arm's (interleaved) or this cell's own"
    )
    compared: int = Field(description="requests compared (same prompt, same requested length, both ok)")
    differ: int = Field(description="of which the outputs differ")
    top_k: int = Field(description="candidates asked per token")
    check: ReferralCheck | None = Field(None, description="the referral checked on the reference's own output")
    referred: list[ReferredOutput] = Field(description="the differences referred (at most the first 32)")
    error: str | None = Field(None, description="why nothing was compared (no baseline cell measured before this one)")


class AttemptLog(Record):
    attempt: int = Field(description="its number, from 1")
    valid: bool = Field(description="its validity under the gates")
    reasons: list[str] = Field(description="why it was invalid")
    rounds_measured: list[int] | None = Field(
        None, description="an interleaved level's rounds this attempt measured anew, the earlier attempt's others kept"
    )


class Attempts(Record):
    """The cell's measuring attempts: which counts and why (`measure.heal`)."""

    counted: int = Field(description="the attempt the cell's files hold")
    why: str = Field(description="why that one counts")
    made: int = Field(description="attempts made")
    log: list[AttemptLog] = Field(description="each attempt's verdict")


class CellSummary(MeasuredLevel):
    """A pipeline cell's summary.json: the measured level, its identity, the server and the stack."""

    cell: CellIdentity = Field(description="which cell this is")
    source: Literal["simulated", "real"] = Field(description="the simulated engine, or a real engine")
    engine: str = Field(description="sim, sglang or vllm")
    client_backend: str = Field(description="how requests were sent: sglang (native) or openai")
    server: ServerFacts = Field(description="the server that served the cell")
    stack: StackRef = Field(description="the variant's environment")
    cpus: dict[str, Any] = Field(description="the CPU plan: client, server, shared, note")
    level_s: float = Field(description="seconds the level took: warm-up, cache resets, probes, the loops")
    measured_s: float = Field(description="seconds of the closed loops themselves")
    pairing: Pairing | None = Field(None, description="interleaved or segmented levels")
    output_referral: OutputReferral | None = Field(
        None, description="interleaved levels, arms besides the reference: its outputs' differences, referred"
    )
    attempts: Attempts | None = Field(None, description="where the cell was measured more than once")


SUMMARY_FIX = "re-measure the cell (snakemake --forcerun <its summary.json>)"
