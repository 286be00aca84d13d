"""One cell (variant x arm x concurrency, all repeats): get the arm's server, warm up, measure, write atomically.

Run by the Snakemake `cell` rule, and standalone: `specsweep cell --spec JSON --env ENV.json --out-dir DIR ...`
(`--spec` is what `specsweep.config.cell_spec` returns). Without a Snakemake owner the server it starts stops
when this process ends.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from specsweep import heal, servers
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
from specsweep.client.cpu import CpuPlan, pinned, plan_cpus
from specsweep.client.datasets import Dataset, DatasetError
from specsweep.client.loadgen import measure_level, new_session, warmup_count
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
from specsweep.engines import get_engine
from specsweep.engines.base import ServerSpec
from specsweep.io import read_json
from specsweep.redact import MissingAPIKey, api_key_from_env
from specsweep.summary import cell_identity, judged, level_summary, write_cell


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


def fixed_output_tokens(output: Any) -> int:
    """The level's nominal output length: the fixed value, or the top of a uniform or reference range
    (per-request lengths are then in the prompt sets, so this is only a fallback, and the warm-up's cap)."""
    if isinstance(output, int):
        return output
    return int(max(output["uniform"])) if "uniform" in output else int(output["reference"]["max"])


def read_workload_dataset(workload: dict[str, Any]) -> Dataset | None:
    """The workload's dataset, checked again before any server is asked for (the cell can run standalone)."""
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
    ramp: int | None = None,
) -> LevelPrompts:
    """The level's warm-up set and one measured set per repeat (ramp requests included), by seed and level,
    with their chat-templated text where `render` is given."""
    workload = spec["workload"]
    if ramp is None:
        ramp = spec["concurrency"] if workload["stagger"] else 0
    if n_warmup is None:
        n_warmup = warmup_count(workload["warmup_requests"], spec["concurrency"])
    level = await level_prompts(
        spec["concurrency"],
        spec["n_requests"] + ramp,
        spec["repeats"],
        n_warmup,
        workload["input_tokens"],
        workload["seed"],
        workload["output_tokens"],
        dataset,
        url=url,
        tokenizer_path=tokenizer_path,
        headers=headers,
    )
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
        ramp=0,
    )


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
) -> tuple[Any, dict[str, Any]]:
    """Warm up and measure all repeats (specsweep.client.loadgen.measure_level); returns (records, summary)."""
    workload = spec["workload"]
    concurrency, n_requests = spec["concurrency"], spec["n_requests"]
    req = RequestSpec(
        url=url,
        backend=server.client_backend,
        endpoint=workload["endpoint"],
        model=spec["variant"].get("model") if server.engine != "sim" else None,
        temperature=workload["temperature"],
        request_timeout_s=workload["request_timeout_s"],
        api_key=api_key,
    )
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    open_loop = spec.get("load", {}).get("mode", "closed") != "closed"
    plans: list[ArrivalPlan] | None = None
    warm_plan: ArrivalPlan | None = None
    if open_loop:
        plans, warm_plan = arrival_plans(spec)
        n_requests = len(plans[0])
        prompts = await open_prompts(spec, plans, warm_plan, url, headers, tokenizer_path, dataset, render)
    else:
        prompts = await build_prompts(spec, url, headers, tokenizer_path, dataset, render)
    started = time.monotonic()
    async with new_session(concurrency) as session:
        info = await engine.server_info(session, url)
        level = await measure_level(
            req,
            concurrency,
            n_requests,
            prompts,
            fixed_output_tokens(workload["output_tokens"]),
            warmup=workload["warmup_requests"],
            repeats=spec["repeats"],
            stagger=workload["stagger"] and not open_loop,
            duration_s=workload["requests"].get("duration_s"),
            hooks=engine,
            server_pid=server_pid,
            watch_cpus=plan.watched,
            idle_probe_s=spec["client"]["idle_probe_s"],
            session=session,
            plans=plans,
            max_in_flight=concurrency if open_loop else None,
            warmup_plan=warm_plan,
        )
    level_s = time.monotonic() - started
    max_running = info.get("max_running_requests") if isinstance(info, dict) else None
    summary = level_summary(
        level,
        prompts,
        req,
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
    return level.records, summary


def run_cell(
    spec: dict[str, Any],
    env_json: Path,
    out_dir: Path,
    state_dir: Path,
    server_log_dir: Path,
    startup_timeout_s: float | None = None,
) -> tuple[Any, dict[str, Any]]:
    """Measure the cell and write it; returns (records, summary). `startup_timeout_s` overrides the variant's
    (a Snakemake resource, not part of the cell's spec: waiting longer for a server changes no measurement)."""
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
    label = f"{spec['variant_name']}/{arm_name}"
    host = variant.get("host") or "127.0.0.1"

    def make_spec(port: int) -> ServerSpec:
        return engine.server_spec(variant, arm_name, arm, host, port, python)

    tokenizer_path = variant.get("model") if variant["engine"] != "sim" else None
    render = chat_render(spec["workload"], make_spec(0).client_backend, tokenizer_path)
    log_path = server_log_dir / f"{spec['variant_name']}.{arm_name}.log"
    t_ask = time.monotonic()
    gates, attempts = heal.judge_settings()
    attempts_dir = Path(out_dir) / "attempts"
    shutil.rmtree(attempts_dir, ignore_errors=True)  # a new measurement of the cell replaces the old one's
    with servers.acquire(state_dir, make_spec, host, variant.get("port"), label, log_path) as rec:
        server_ready_s = time.monotonic() - t_ask
        server = make_spec(rec.port)

        def measure_once(n: int) -> tuple[Any, dict[str, Any]]:
            with pinned(plan.client):
                records, summary = asyncio.run(
                    measure(
                        spec,
                        server,
                        rec.base_url,
                        engine,
                        api_key,
                        tokenizer_path,
                        plan,
                        rec.server_pid,
                        dataset,
                        render,
                    )
                )
            summary.update(
                {
                    "cell": cell_identity(
                        spec["experiment"],
                        spec["variant_name"],
                        arm_name,
                        spec["concurrency"],
                        arm["speculative"],
                        spec.get("load", {}).get("mode", "closed"),
                        spec.get("level"),
                    ),
                    "source": server.source,
                    "engine": server.engine,
                    "client_backend": server.client_backend,
                    "server": {
                        **server.public_dict(),
                        "info": summary.pop("server_info"),
                        "pid": rec.server_pid,
                        "started_at": rec.started_at,
                        "ready_after_s": server_ready_s,
                        "node": rec.node,
                        "slurm_job": os.environ.get("SLURM_JOB_ID"),  # None outside a cluster job
                    },
                    "stack": {"fingerprint": str(env_json), "recipe": env_fp.get("recipe")},
                }
            )
            return records, summary

        def keep(n: int, result: tuple[Any, dict[str, Any]]) -> str:
            write_cell(attempts_dir / str(n), *result)
            return f"attempts/{n}"

        def judge(result: tuple[Any, dict[str, Any]]) -> dict[str, Any]:
            return judged(result[1], result[0], gates or defaults("gates"))["validity"]

        def quiet(n: int) -> dict[str, Any]:
            return heal.wait_for_quiet(plan.watched, (gates or defaults("gates"))["max_foreign_cpu_share"])

        done = heal.measure_until_valid(measure_once, judge, attempts, keep, quiet)
    records, summary = done.result
    if len(done.log) > 1:  # measured more than once: which attempt counts and why the others did not
        summary["attempts"] = done.as_dict()
    write_cell(out_dir, records, summary)
    return records, summary


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spec", required=True, help="the cell as JSON text (specsweep.config.cell_spec) or a file")
    parser.add_argument("--env", required=True, type=Path, help="the variant's fingerprint JSON (env rule)")
    parser.add_argument("--out-dir", required=True, type=Path)
    parser.add_argument("--state-dir", required=True, type=Path, help="the experiment's server state folder")
    parser.add_argument("--server-log-dir", required=True, type=Path)
    parser.add_argument(
        "--startup-timeout-s", type=float, help="seconds to wait for the server (default: the variant's)"
    )


def run(args: argparse.Namespace) -> int:
    text = args.spec if args.spec.lstrip().startswith("{") else Path(args.spec).read_text()
    spec = json.loads(text)
    try:
        records, summary = run_cell(
            spec, args.env, args.out_dir, args.state_dir, args.server_log_dir, args.startup_timeout_s
        )
    except (CellError, MissingAPIKey, servers.ServerError) as e:
        print(f"cell failed: {e}", file=sys.stderr)
        return 1
    m, v = summary["metrics"], judged(summary, records, defaults("gates"))["validity"]
    print(
        json.dumps(
            {
                "cell": summary["cell"]["key"],
                "source": summary["source"],
                "output_tok_s_steady": m.get("output_tok_s_steady"),
                "valid_under_default_gates": v["valid"],  # the analysis judges by the experiment's gates
                "reasons": v["reasons"],
                "flags": v["flags"],
            },
            indent=2,
        )
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specsweep.cell", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
