"""One cell (variant x arm x concurrency, all repeats): get the arm's server, warm up, measure, write atomically.

Run by the Snakemake `cell` rule, and standalone: `specsweep cell --spec JSON --env ENV.json --out-dir DIR ...`
(`--spec` is what `specsweep.config.cell_spec` returns). Without a Snakemake owner the server it starts stops
when this process ends.
"""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specsweep.client.arrivals import (
    ArrivalPlan,
    TraceError,
    expected_prefix_share,
    gamma_times,
    load_mooncake_trace,
    trace_plan,
    trace_prompts,
)
from specsweep.client.backends import RequestSpec
from specsweep.client.contents import labelled, mix_level_prompts
from specsweep.client.cpu import CpuPlan, pinned, plan_cpus
from specsweep.client.datasets import Dataset, DatasetError
from specsweep.client.loadgen import LevelResult, filler_count, measure_level, new_session, warmup_count
from specsweep.client.prompts import (
    ChatRender,
    ChatTemplateUnavailable,
    LevelPrompts,
    cell_tag,
    hf_chat_template,
    level_prompts,
    set_seed,
    templated,
    warmup_tag,
)
from specsweep.config import defaults, read_dataset, variant_for_server
from specsweep.engines import get_engine, log_facts
from specsweep.engines.base import ServerSpec
from specsweep.io import read_json
from specsweep.measure import heal
from specsweep.measure.referral import baseline_cell_dirs, refer_recorded
from specsweep.measure.summary import cell_identity, judged, level_summary, write_cell
from specsweep.records import CELL_SPEC_FIX, CellSpec, RecordError, check
from specsweep.redact import api_key_from_env
from specsweep.serving import servers


class CellError(RuntimeError):
    """The cell could not be measured; the message says why and what to do."""


def resolve_variant(spec: dict[str, Any], env_fp: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The variant with its model path resolved, and the interpreter its server runs in."""
    variant = variant_for_server(spec, spec["variant_name"])
    python = variant.get("python") or env_fp.get("python_executable") or sys.executable
    return variant, python


def check_model(variant: dict[str, Any]) -> None:
    """A local model path that does not exist fails here, before any server starts."""
    model = variant.get("model")
    if variant["engine"] == "sim" or not model:
        return
    looks_local = str(model).startswith(("/", ".", "~")) or variant.get("model_builder")
    if looks_local and not Path(model).expanduser().exists():
        raise CellError(
            f"model path {model} does not exist; fix variants.<name>.model (a local checkpoint folder), "
            "or use a model_builder"
        )


def watched_gpus(variant: dict[str, Any]) -> tuple[int, ...] | None:
    """The GPUs a variant's server runs on, watched during every block (`telemetry.gpu`): its `gpus` set, () for
    every GPU where an SGLang variant names none, None where it runs on CPUs (the simulated engine, vLLM's CPU
    build)."""
    if variant.get("gpus"):
        return tuple(int(x) for x in str(variant["gpus"]).replace(" ", "").split(",") if x)
    return () if variant.get("engine") == "sglang" else None


def fixed_output_tokens(output: Any) -> int:
    """The level's nominal output length: the fixed value, or the top of a uniform or reference range
    (per-request lengths are then in the prompt sets, so this is only a fallback, and the warm-up's cap)."""
    if isinstance(output, int):
        return output
    return int(max(output["uniform"])) if "uniform" in output else int(output["reference"]["max"])


def read_workload_dataset(workload: dict[str, Any]) -> Dataset | None:
    """The workload's dataset, checked again before any server is asked for (the cell can run standalone); None
    for the traffic mix, whose classes read their own (`build_prompts`)."""
    if "mix" in (workload.get("content") or {}):
        for part in workload["content"]["classes"].values():
            read_workload_dataset({**workload, "dataset": part["dataset"], "content": part})
        return None
    try:
        return read_dataset(workload)
    except DatasetError as e:
        raise CellError(str(e)) from None


def client_variant(variant: dict[str, Any], workload: dict[str, Any]) -> dict[str, Any]:
    """The variant with the client backend its cells use: chat requests to the simulated engine go to its
    OpenAI chat endpoint (which applies its template) unless the variant names a backend; the sim's native
    /generate would need a client-side chat template, and the sim has no model to take one from."""
    if variant["engine"] == "sim" and workload["endpoint"] == "chat" and not variant.get("client_backend"):
        return {**variant, "client_backend": "openai"}
    return variant


def chat_render(workload: dict[str, Any], backend: str, tokenizer_path: str | None) -> ChatRender | None:
    """The model's chat template where chat requests go to SGLang's /generate (which applies none), loaded
    before any server starts: a missing template fails the cell at once (`hf_chat_template`)."""
    if workload["endpoint"] != "chat" or backend == "openai":
        return None
    try:
        return hf_chat_template(tokenizer_path)
    except ChatTemplateUnavailable as e:
        raise CellError(str(e)) from None


async def build_prompts(
    spec: dict[str, Any],
    url: str,
    headers: dict[str, str] | None,
    tokenizer_path: str | None,
    dataset: Dataset | None = None,
    render: ChatRender | None = None,
    n_warmup: int | None = None,
    unmeasured: int | None = None,
) -> LevelPrompts:
    """The level's warm-up set and one measured set per repeat (`unmeasured` prompts besides the measured ones;
    by default a staggered closed loop's C ramp requests and its fillers), by seed and level, with their
    chat-templated text where `render` is given. A content class's prompts are labelled with it; the traffic
    mix's are drawn from its classes' own sets by the mix's shares (`client/contents.py`)."""
    workload = spec["workload"]
    if unmeasured is None:
        stagger = bool(workload["stagger"])
        unmeasured = (spec["concurrency"] if stagger else 0) + filler_count(spec["concurrency"], stagger)
    if n_warmup is None:
        n_warmup = warmup_count(workload["warmup_requests"], spec["concurrency"])
    content = workload.get("content")
    if content and "mix" in content:
        parts = {}
        for name, part in content["classes"].items():
            part_workload = {**workload, "dataset": part["dataset"], "content": part}
            part_spec = {**spec, "workload": part_workload}
            part_dataset = read_workload_dataset(part_workload)
            built = await build_prompts(
                part_spec, url, headers, tokenizer_path, part_dataset, None, n_warmup, unmeasured
            )
            parts[name] = built
        mixed = mix_level_prompts(parts, content["mix"], workload["seed"], f"{float(spec['concurrency']):g}")
        return templated(mixed, render) if render is not None else mixed
    seed = workload["seed"]
    if content and dataset is None:  # synthetic classes each their own words (a mix of them repeats no prompt)
        seed = set_seed(seed, f"class-{content['name']}")
    level = await level_prompts(
        spec["concurrency"],
        spec["n_requests"] + unmeasured,
        spec["repeats"],
        n_warmup,
        workload["input_tokens"],
        seed,
        workload["output_tokens"],
        dataset,
        url=url,
        tokenizer_path=tokenizer_path,
        headers=headers,
    )
    if content:
        level = labelled(level, content["name"])
    return templated(level, render) if render is not None else level


OPEN_WARMUP_S = 2.0  # an open level's warm-up: this many seconds of its arrivals (at least warmup_requests)


def open_warmup_count(spec: dict[str, Any], rate_rps: float) -> int:
    """Warm-up requests of an open or trace level: a short replay at the level's own rate, so the server meets
    the batch sizes that rate makes before it is measured; none when warmup_requests is 0."""
    warm = spec["workload"]["warmup_requests"]
    return max(warm, math.ceil(rate_rps * OPEN_WARMUP_S)) if warm > 0 else 0


def arrival_plans(spec: dict[str, Any]) -> tuple[list[ArrivalPlan], ArrivalPlan]:
    """One arrival plan per repeat and the warm-up's, by seed (open) or from the trace (trace)."""
    load, level, seed, repeats = spec["load"], float(spec["level"]), spec["workload"]["seed"], spec["repeats"]
    if load["mode"] == "trace":
        t = load["trace"]
        try:
            trace = load_mooncake_trace(t["path"])
        except TraceError as e:
            raise CellError(f"{e}; fix load.trace.path") from None
        plan = trace_plan(trace, level, t.get("max_requests"))
        warm = trace_plan(trace, level, open_warmup_count(spec, plan.offered_rate_rps or 1.0))
        return [plan] * repeats, warm
    shape = float(load["burstiness"]) if load["arrival"] == "gamma" else 1.0
    meta = {"arrival": load["arrival"], "shape": shape, "rate_rps": level}

    def plan(n: int, tag: str) -> ArrivalPlan:
        return ArrivalPlan(gamma_times(level, n, set_seed(seed, tag), shape), source=load["arrival"], meta=meta)

    plans = [plan(spec["n_requests"], f"arrivals-{cell_tag(level, r)}") for r in range(repeats)]
    return plans, plan(open_warmup_count(spec, level), f"arrivals-{warmup_tag(level)}")


async def open_prompts(
    spec: dict[str, Any],
    plans: list[ArrivalPlan],
    warm: ArrivalPlan,
    url: str,
    headers: dict[str, str] | None,
    tokenizer_path: str | None,
    dataset: Dataset | None = None,
    render: ChatRender | None = None,
) -> LevelPrompts:
    """The prompts an open or trace level sends: a trace's are built from its lengths and prefix blocks;
    an open level's are the workload's, one per planned request (the same sets in every arm)."""
    level, seed = float(spec["level"]), spec["workload"]["seed"]
    if spec["load"]["mode"] == "trace":
        block = int(spec["load"]["trace"]["block_tokens"])
        sets = [trace_prompts(p, seed, cell_tag(level, r), block) for r, p in enumerate(plans)]
        traced = LevelPrompts(trace_prompts(warm, seed, warmup_tag(level), block), sets, unique=True)
        return templated(traced, render) if render is not None else traced
    return await build_prompts(
        {**spec, "concurrency": level, "n_requests": len(plans[0])},
        url,
        headers,
        tokenizer_path,
        dataset,
        render,
        n_warmup=len(warm),
        unmeasured=0,
    )


@dataclass
class LevelInputs:
    """What one arm sends at a level: its request template, prompt sets and (open loops) arrival plans."""

    req: RequestSpec
    prompts: LevelPrompts
    n_requests: int
    plans: list[ArrivalPlan] | None = None
    warm_plan: ArrivalPlan | None = None


async def level_inputs(
    spec: dict[str, Any],
    server: ServerSpec,
    url: str,
    api_key: str | None,
    tokenizer_path: str | None,
    dataset: Dataset | None = None,
    render: ChatRender | None = None,
) -> LevelInputs:
    """The request template and prompts of the level (the same prompts, by seed, in every arm)."""
    workload = spec["workload"]
    req = RequestSpec(
        url=url,
        backend=server.client_backend,
        endpoint=workload["endpoint"],
        model=spec["variant"].get("model") if server.engine != "sim" else None,
        temperature=workload["temperature"],
        request_timeout_s=workload["request_timeout_s"],
        api_key=api_key,
        stop=workload.get("stop", "fixed"),
    )
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    if spec.get("load", {}).get("mode", "closed") != "closed":
        plans, warm_plan = arrival_plans(spec)
        prompts = await open_prompts(spec, plans, warm_plan, url, headers, tokenizer_path, dataset, render)
        return LevelInputs(req, prompts, len(plans[0]), plans, warm_plan)
    prompts = await build_prompts(spec, url, headers, tokenizer_path, dataset, render)
    return LevelInputs(req, prompts, spec["n_requests"])


def level_summary_of(
    spec: dict[str, Any],
    level: LevelResult,
    inputs: LevelInputs,
    plan: CpuPlan,
    info: Any,
    dataset: Dataset | None,
    level_s: float,
) -> dict[str, Any]:
    """summary.json's measured part for a level (the cell's identity and server facts are added by the caller)."""
    workload, plans = spec["workload"], inputs.plans
    max_running = info.get("max_running_requests") if isinstance(info, dict) else None
    summary = level_summary(
        level,
        inputs.prompts,
        inputs.req,
        workload["output_tokens"],
        int(max_running) if isinstance(max_running, int | float) else None,
        cpus=plan,
    )
    summary["workload"].update(
        {
            "input_tokens": workload["input_tokens"] if dataset is None else None,  # the synthetic prompts' length
            "seed": workload["seed"],
            "warmup_requests": workload["warmup_requests"],
            "duration_s": workload["requests"].get("duration_s"),
            "content": (workload.get("content") or {}).get("name"),
        }
    )
    if plans is not None:
        summary["workload"]["arrivals"] = {
            **spec["load"],
            "level": spec["level"],
            "offered_rate_rps": plans[0].offered_rate_rps,
            "planned_requests": len(plans[0]),
            **plans[0].meta,
        }
        if spec["load"]["mode"] == "trace":  # what the trace's own prefix reuse lets the cache serve
            share = expected_prefix_share(plans[0], int(spec["load"]["trace"]["block_tokens"]))
            summary["workload"]["expected_prefix_share"] = share
    summary["level_s"] = level_s  # warm-up, cache resets, idle probes and the closed loops
    summary["measured_s"] = sum(float(r.client.get("wall_s") or 0.0) for r in level.repeats)  # closed loops
    summary["cpus"] = plan.as_dict()
    if plan.note:
        summary["measurement"]["flags"].append(plan.note)
    summary["server_info"] = info
    return summary


async def measure(
    spec: dict[str, Any],
    server: ServerSpec,
    url: str,
    engine: Any,
    api_key: str | None,
    tokenizer_path: str | None,
    plan: CpuPlan,
    server_pid: int | None = None,
    dataset: Dataset | None = None,
    render: ChatRender | None = None,
    reference_dirs: list[Path] | None = None,
) -> tuple[Any, dict[str, Any]]:
    """Warm up and measure all repeats (specsweep.client.loadgen.measure_level); returns (records, summary).
    With `spec["refer_against"]` (a sequential speculative cell) its outputs' differences from that baseline
    cell's (the first of `reference_dirs` that holds one) are referred on this server (`measure/referral.py`)."""
    workload = spec["workload"]
    inputs = await level_inputs(spec, server, url, api_key, tokenizer_path, dataset, render)
    open_loop = inputs.plans is not None
    concurrency = spec["concurrency"]
    started = time.monotonic()
    async with new_session(concurrency) as session:
        info = await engine.server_info(session, url)
        level = await measure_level(
            inputs.req,
            concurrency,
            inputs.n_requests,
            inputs.prompts,
            fixed_output_tokens(workload["output_tokens"]),
            warmup=workload["warmup_requests"],
            repeats=spec["repeats"],
            stagger=workload["stagger"] and not open_loop,
            duration_s=workload["requests"].get("duration_s"),
            hooks=engine,
            server_pid=server_pid,
            watch_cpus=plan.watched,
            watch_gpus=watched_gpus(spec["variant"]),
            idle_probe_s=spec["client"]["idle_probe_s"],
            session=session,
            plans=inputs.plans,
            max_in_flight=concurrency if open_loop else None,
            warmup_plan=inputs.warm_plan,
        )
    summary = level_summary_of(spec, level, inputs, plan, info, dataset, time.monotonic() - started)
    if spec.get("refer_against"):
        summary["output_referral"] = await refer_recorded(
            spec["refer_against"], reference_dirs or [], level.repeats, inputs.req, inputs.prompts.repeats, url
        )
    return level.records, summary


@dataclass
class PreparedCell:
    """A cell's server recipe and client set-up, checked before any server is asked for."""

    spec: dict[str, Any]
    env_json: Path
    env_fp: dict[str, Any]
    variant: dict[str, Any]
    python: str
    plan: CpuPlan
    dataset: Dataset | None
    engine: Any
    arm_name: str
    arm: dict[str, Any]
    api_key: str | None
    label: str
    host: str
    tokenizer_path: str | None
    render: ChatRender | None

    def make_spec(self, port: int) -> ServerSpec:
        return self.engine.server_spec(self.variant, self.arm_name, self.arm, self.host, port, self.python)


def prepare_cell(spec: dict[str, Any], env_json: Path, startup_timeout_s: float | None = None) -> PreparedCell:
    """Resolve the variant, CPU plan, dataset, engine, arm and key of a cell; every failure is a CellError
    (or MissingAPIKey) naming the fix. `startup_timeout_s` overrides the variant's (a Snakemake resource, not
    part of the cell's spec: waiting longer for a server changes no measurement)."""
    try:
        check(
            CellSpec,
            spec,
            f"the cell spec of {spec.get('arm_name', '?')} at C={spec.get('concurrency', '?')}",
            CELL_SPEC_FIX,
        )
    except RecordError as e:
        raise CellError(str(e)) from None
    env_fp = read_json(env_json)
    variant, python = resolve_variant(spec, env_fp)
    if startup_timeout_s is not None:
        variant["startup_timeout_s"] = float(startup_timeout_s)
    try:
        plan = plan_cpus(spec["client"]["cpus"], variant.get("cpus", "auto"))
    except ValueError as e:
        raise CellError(f"{e}; fix client.cpus or variants.{spec['variant_name']}.cpus") from None
    variant = client_variant({**variant, "cpus": plan.server}, spec["workload"])
    dataset = read_workload_dataset(spec["workload"])
    engine = get_engine(variant["engine"], variant.get("api_key_env"))
    arm_name, arm = spec["arm_name"], spec["arm"]
    if arm.get("schedule_file"):  # an engine config file the schedule job wrote (SGLang adaptive speculation)
        path = Path(arm["schedule_file"]).resolve()
        if not path.is_file():
            raise CellError(f"{arm_name}: schedule file {path} is missing; rerun the variant's schedule job")
        arm = {**arm, "schedule_file": str(path)}
    check_model(variant)
    api_key = api_key_from_env(variant.get("api_key_env"))
    tokenizer_path = variant.get("model") if variant["engine"] != "sim" else None
    prepared = PreparedCell(
        spec=spec,
        env_json=env_json,
        env_fp=env_fp,
        variant=variant,
        python=python,
        plan=plan,
        dataset=dataset,
        engine=engine,
        arm_name=arm_name,
        arm=arm,
        api_key=api_key,
        label=f"{spec['variant_name']}/{arm_name}",
        host=variant.get("host") or "127.0.0.1",
        tokenizer_path=tokenizer_path,
        render=None,
    )
    prepared.render = chat_render(spec["workload"], prepared.make_spec(0).client_backend, tokenizer_path)
    return prepared


def finish_summary(
    cell: PreparedCell, summary: dict[str, Any], server: ServerSpec, rec: servers.ServerRecord, ready_s: float
) -> dict[str, Any]:
    """The cell's identity, source and server facts added to its measured summary."""
    spec = cell.spec
    summary.update(
        {
            "cell": cell_identity(
                spec["experiment"],
                spec["variant_name"],
                cell.arm_name,
                spec["concurrency"],
                cell.arm["speculative"],
                spec["load"]["mode"] if spec.get("load") else "closed",
                spec.get("level"),
            ),
            "source": server.source,
            "engine": server.engine,
            "client_backend": server.client_backend,
            "server": {
                **server.public_dict(),
                "info": {
                    **summary.pop("server_info"),
                    **log_facts(server.engine, lambda: servers.instance_log(rec.log_path)),
                },
                "pid": rec.server_pid,
                "started_at": rec.started_at,
                "ready_after_s": ready_s,
                "node": rec.node,
                "slurm_job": os.environ.get("SLURM_JOB_ID"),  # None outside a cluster job
            },
            "stack": {"fingerprint": str(cell.env_json), "recipe": cell.env_fp.get("recipe")},
        }
    )
    return summary


def run_cell(
    spec: dict[str, Any],
    env_json: Path,
    out_dir: Path,
    state_dir: Path,
    server_log_dir: Path,
    startup_timeout_s: float | None = None,
) -> tuple[Any, dict[str, Any]]:
    """Measure the cell and write it; returns (records, summary)."""
    cell = prepare_cell(spec, env_json, startup_timeout_s)
    log_path = server_log_dir / f"{spec['variant_name']}.{cell.arm_name}.log"
    t_ask = time.monotonic()
    gates, attempts = heal.judge_settings()
    attempts_dir = Path(out_dir) / "attempts"
    shutil.rmtree(attempts_dir, ignore_errors=True)  # a new measurement of the cell replaces the old one's
    # measured before this one (the baseline first: config.cell_priority and segments order the servers so)
    reference_dirs = (
        baseline_cell_dirs(Path(out_dir), cell.arm_name, spec["refer_against"]) if spec.get("refer_against") else []
    )
    with servers.acquire(state_dir, cell.make_spec, cell.host, cell.variant.get("port"), cell.label, log_path) as rec:
        server_ready_s = time.monotonic() - t_ask
        server = cell.make_spec(rec.port)

        def measure_once(n: int) -> tuple[Any, dict[str, Any]]:
            with pinned(cell.plan.client):
                records, summary = asyncio.run(
                    measure(
                        spec,
                        server,
                        rec.base_url,
                        cell.engine,
                        cell.api_key,
                        cell.tokenizer_path,
                        cell.plan,
                        rec.server_pid,
                        cell.dataset,
                        cell.render,
                        reference_dirs,
                    )
                )
            return records, finish_summary(cell, summary, server, rec, server_ready_s)

        def keep(n: int, result: tuple[Any, dict[str, Any]]) -> str:
            write_cell(attempts_dir / str(n), *result)
            return f"attempts/{n}"

        def judge(result: tuple[Any, dict[str, Any]]) -> dict[str, Any]:
            return judged(result[1], result[0], gates or defaults("gates"))["validity"]

        def quiet(n: int) -> dict[str, Any]:
            return heal.wait_for_quiet(cell.plan.watched, (gates or defaults("gates"))["max_foreign_cpu_share"])

        done = heal.measure_until_valid(measure_once, judge, attempts, keep, quiet)
    records, summary = done.result
    if len(done.log) > 1:  # measured more than once: which attempt counts and why the others did not
        summary["attempts"] = done.as_dict()
    write_cell(out_dir, records, summary)
    return records, summary
