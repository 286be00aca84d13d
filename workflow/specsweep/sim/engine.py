"""The clock-agnostic engine core: continuous batching, chunked prefill, the step-time model, speculation.

The engine never reads a clock. `step(now)` forms a batch at time `now`, returns how long the step takes and
what it emits at its end; a driver decides what "time" is. The real-time server sleeps until each step's end,
the virtual-time predictor just adds the duration. Sharing this core is what makes a prediction and a
real-time measurement of the same profile agree.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, field

from specsweep.sim.profile import Profile, StepCosts

# An idle engine starts its step as soon as a request arrives, with the requests that arrived in the same instant
# (a client starting C streams, which an HTTP server parses one by one: the real-time server keeps taking arrivals
# while each pass of its event loop brings another, at most ADMISSION_MAX_S), as a real scheduler's polling loop
# takes what its queue holds. No fixed wait: a 2 ms admission window here made every idle moment cost ~4 ms, and
# at C=2, where both slots often end in the same step, how often that happened followed the host's timing
# (docs/sim.md, "Batching"). Both clocks apply the same rule, so it never separates prediction from measurement.
ADMISSION_MAX_S = 0.02


def step_time(
    profile: Profile,
    speculative: bool,
    n_seqs: int,
    decode_tokens: int,
    prefill_tokens: int,
    n_decode: int,
    context_tokens: int = 0,
    draft_tokens: int | None = None,
) -> float:
    """Seconds one engine step takes (formula and units in docs/sim.md).

    n_seqs: sequences in the step; decode_tokens: decode (1 each) or verify (k+1 each) tokens;
    prefill_tokens: prompt tokens of this step's prefill chunk; n_decode: sequences decoding or verifying;
    context_tokens: summed context length (prompt + generated) of the decoding sequences (attention KV reads);
    draft_tokens: this step's draft length k (default: the profile's).
    """
    if n_seqs == 0:
        return 0.0
    c: StepCosts = profile.step_costs(speculative)
    m = profile.model
    t = c.fixed_s + c.per_seq_s * n_seqs + c.per_token_s * decode_tokens + c.prefill_token_s * prefill_tokens
    t += c.per_context_token_s * context_tokens
    if m.tensor_parallel > 1:
        t += m.layers * m.allreduces_per_layer * c.allreduce_s
    if m.experts_total > 0 and c.expert_read_s > 0:
        # Fraction of routed experts touched by the step's tokens (uniform routing): weights are read once.
        untouched = (1.0 - m.experts_active / m.experts_total) ** (decode_tokens + prefill_tokens)
        t += c.expert_read_s * (1.0 - untouched)
    if speculative and n_decode > 0:
        s = profile.speculative
        k = s.draft_tokens if draft_tokens is None else draft_tokens
        t += k * (s.draft_step_s + s.draft_per_seq_s * n_decode)
    return t


Schedule = list[tuple[int, int, int]]


def parse_schedule(value: object) -> Schedule:
    """vLLM's `num_speculative_tokens_per_batch_size`: [[start, end, K], ...], inclusive ranges of running
    requests, K >= 0 draft tokens (0: drafting off). Raises ValueError naming the bad entry."""
    if isinstance(value, str):
        import json

        value = json.loads(value)
    if not isinstance(value, list) or not value:
        raise ValueError("a speculation schedule is a non-empty list of [start, end, K] (inclusive batch sizes)")
    out: Schedule = []
    for entry in value:
        if not (isinstance(entry, list | tuple) and len(entry) == 3 and all(isinstance(x, int) for x in entry)):
            raise ValueError(f"schedule entry {entry!r}: expected [start, end, K] integers")
        start, end, k = entry
        if not (1 <= start <= end and k >= 0):
            raise ValueError(f"schedule entry {entry!r}: need 1 <= start <= end and K >= 0")
        if out and start <= out[-1][1]:
            raise ValueError(f"schedule entry {entry!r} overlaps the one before; list ranges in order")
        out.append((start, end, k))
    return out


def scheduled_k(schedule: Schedule, batch: int, default: int) -> int:
    """K for a step with `batch` running requests; `default` (the arm's K) where no range covers it."""
    for start, end, k in schedule:
        if start <= batch <= end:
            return k
    return default


@dataclass(eq=False)
class SimRequest:
    """One generation request inside the engine."""

    rid: int
    prompt_tokens: int
    max_new_tokens: int
    arrival: float = 0.0
    prefilled: int = 0
    generated: int = 0
    verify_ct: int = 0
    accepted_draft_tokens: int = 0
    first_token_at: float = math.nan
    finished_at: float = math.nan
    aborted: bool = False
    draft_lag: int = 0  # tokens generated while drafting was off: the draft model's KV cache is behind by these
    plain_tokens: int = 0  # tokens a speculative engine decoded without drafting (its schedule's K = 0)
    log_accept: float | None = None  # its content class's log acceptance (None: the profile's)
    rng: random.Random | None = field(default=None, repr=False)
    tag: object = field(default=None, repr=False)  # the driver's handle (a stream, a record)

    @property
    def done(self) -> bool:
        return self.generated >= self.max_new_tokens


@dataclass
class StepResult:
    """What one step did: its duration and the token chunks it emits at its end."""

    duration: float
    emissions: list[tuple[SimRequest, int]]  # (request, tokens in this chunk)
    finished: list[SimRequest]
    n_seqs: int
    tokens: int


class Engine:
    """Continuous batching with a running-request cap, a FIFO waiting queue and chunked prefill."""

    def __init__(
        self,
        profile: Profile,
        speculative: bool,
        seed: int = 0,
        max_running_requests: int | None = None,
        first_rid: int = 0,
        schedule: Schedule | None = None,
    ) -> None:
        """`schedule` (speculative engines only): K per number of running requests, switched each step as
        vLLM's V1 scheduler does (`parse_schedule`)."""
        self.profile = profile
        self.speculative = speculative
        self.schedule = schedule if speculative else None
        self.seed = seed
        self.cap = max_running_requests or profile.running_cap(speculative)
        self.k = profile.speculative.draft_tokens
        a = profile.speculative.accept_prob
        self._log_a = math.log(a) if a > 0 else -math.inf
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        # Request ids seed the acceptance draws, so a prediction can replay a server's n-th request.
        self._next_rid = first_rid
        # Cumulative counters since start (as the real engines expose them).
        self.steps = 0
        self.tokens_emitted = 0
        self.verify_steps = 0  # per-sequence verify passes (vLLM "drafts")
        self.draft_tokens = 0  # draft tokens proposed, each verify pass its step's K (vLLM "draft tokens")
        self.verify_tokens = 0  # tokens emitted by verify passes (SGLang accept length numerator)
        self.accepted_draft_tokens = 0
        self.requests_finished = 0
        self.switches = 0  # steps whose K differs from the step before's (drafting on <-> off, or another K)
        self.catchup_tokens = 0  # draft-model tokens re-prefilled after drafting resumed
        self._last_k: int | None = None
        spec = profile.speculative
        self.catchup_token_s = spec.draft_per_seq_s if spec.catchup_token_s is None else spec.catchup_token_s

    def new_request(
        self,
        prompt_tokens: int,
        max_new_tokens: int,
        arrival: float = 0.0,
        cached_tokens: int = 0,
        accept_prob: float | None = None,
        draw_key: str | None = None,
    ) -> SimRequest:
        """Create and enqueue a request; its acceptance draws come from its own seeded stream, with its content
        class's `accept_prob` where given (`Profile.accept_prob`).

        `draw_key` (the prompt, for a greedy request) seeds that stream instead of the request id: a real engine
        at temperature 0 accepts the same drafts for the same prompt, so two servers sent the same prompts draw
        the same acceptances and a comparison at the same K is paired on content, not only on time.

        `cached_tokens` of the prompt come from a prefix cache and need no prefill (the last prompt token is
        always computed: it yields the first output token)."""
        rid = self._next_rid
        self._next_rid += 1
        req = SimRequest(rid=rid, prompt_tokens=max(1, prompt_tokens), max_new_tokens=max_new_tokens, arrival=arrival)
        req.prefilled = max(0, min(cached_tokens, req.prompt_tokens - 1))
        if accept_prob is not None:
            req.log_accept = math.log(accept_prob) if accept_prob > 0 else -math.inf
        if self.speculative:
            seed = self.seed * 1_000_003 + rid if draw_key is None else f"{self.seed}/{draw_key}"
            req.rng = random.Random(seed)
        self.waiting.append(req)
        return req

    def abort(self, req: SimRequest) -> None:
        """Drop a request (client went away); it frees its slot at the next step."""
        req.aborted = True
        if req in self.waiting:
            self.waiting.remove(req)
        elif req in self.running:
            self.running.remove(req)

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def _accepted(self, req: SimRequest, k: int) -> int:
        """Accepted draft prefix length: P(>= i) = a**i, truncated at k (inverse CDF, one draw)."""
        log_a = self._log_a if req.log_accept is None else req.log_accept
        if log_a == -math.inf:
            return 0
        u = req.rng.random() if req.rng is not None else random.random()
        if u <= 0.0:
            return k
        return min(k, int(math.log(u) / log_a))

    def step(self, now: float) -> StepResult:
        """Form a batch at `now` and run one step; emissions happen at now + duration."""
        while self.waiting and len(self.running) < self.cap:
            self.running.append(self.waiting.popleft())
        budget = self.profile.batching.prefill_chunk_tokens
        prefill_tokens = decode_tokens = n_decode = context = 0
        emissions: list[tuple[SimRequest, int]] = []
        finished: list[SimRequest] = []
        k = self.k
        if self.schedule is not None:
            k = scheduled_k(self.schedule, len(self.running), self.k)
            if self._last_k is not None and k != self._last_k:
                self.switches += 1
            self._last_k = k
        drafting = self.speculative and k > 0
        verify_width = k + 1 if drafting else 1
        catchup = 0
        for req in self.running:
            if req.prefilled < req.prompt_tokens:
                if budget <= 0:
                    continue
                chunk = min(budget, req.prompt_tokens - req.prefilled)
                budget -= chunk
                prefill_tokens += chunk
                req.prefilled += chunk
                if req.prefilled == req.prompt_tokens:  # the prefill's last chunk yields the first token
                    emissions.append((req, 1))
                continue
            n_decode += 1
            decode_tokens += verify_width
            context += req.prompt_tokens + req.generated
            if drafting:
                catchup += req.draft_lag
                req.draft_lag = 0
                acc = self._accepted(req, k)
                n = min(acc + 1, req.max_new_tokens - req.generated)
                req.verify_ct += 1
                req.accepted_draft_tokens += min(acc, n)
                self.verify_steps += 1
                self.draft_tokens += k
                self.verify_tokens += n
                self.accepted_draft_tokens += min(acc, n)
            else:
                n = 1
                if self.speculative:
                    req.draft_lag += n
                    req.plain_tokens += n
            emissions.append((req, n))
        duration = step_time(
            self.profile,
            drafting,
            len(self.running),
            decode_tokens,
            prefill_tokens,
            n_decode,
            context,
            draft_tokens=k,
        )
        if catchup:  # drafting resumed: the draft model first prefills what it missed
            duration += catchup * self.catchup_token_s
            self.catchup_tokens += catchup
        end = now + duration
        tokens = 0
        for req, n in emissions:
            if req.generated == 0:
                req.first_token_at = end
            req.generated += n
            tokens += n
            if req.generated >= req.max_new_tokens:
                req.finished_at = end
                finished.append(req)
        if finished:
            done = set(map(id, finished))
            self.running = [r for r in self.running if id(r) not in done]
            self.requests_finished += len(finished)
        self.steps += 1
        self.tokens_emitted += tokens
        return StepResult(duration, emissions, finished, len(self.running) + len(finished), tokens)

    def avg_accept_length(self) -> float:
        """Cumulative tokens per verify pass since start (SGLang's avg_spec_accept_length)."""
        return self.verify_tokens / self.verify_steps if self.verify_steps else 0.0
