"""Plots of a variant's sweep (PNG and SVG, matplotlib Agg: no display needed).

Every figure says experiment, variant and whether the numbers come from the simulated or a real engine, and
marks invalid cells with hollow red markers so that a left-out level is visible rather than silently missing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from specsweep.analysis.bootstrap import PLOTTED  # noqa: E402
from specsweep.analysis.cells import Cell, metric_value_any  # noqa: E402

__all__ = ["PLOT_KINDS", "plot_variant", "save_figure", "source_label"]

PLOT_KINDS = ("throughput", "speedup", "latency", "accept_length")
_INVALID = {
    "marker": "o",
    "markerfacecolor": "none",
    "markeredgecolor": "red",
    "markersize": 10,
    "markeredgewidth": 1.8,
    "linestyle": "none",
}


def source_label(source: str) -> str:
    return {"simulated": "simulated engine", "real": "real engine"}.get(source, f"source: {source}")


def save_figure(fig: Figure, base: Path) -> list[Path]:
    """Write `<base>.png` atomically (temp file in the same directory, then os.replace). PNG only: nothing read the
    SVG copy (the Snakemake report and MLflow show the PNG), and drawing it again took 0.7 s a crossover job."""
    base.parent.mkdir(parents=True, exist_ok=True)
    path = base.with_suffix(".png")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    os.replace(tmp, path)
    plt.close(fig)
    return [path]


def _title(ax_or_fig: Any, what: str, result: dict[str, Any]) -> None:
    src = source_label(result.get("source", ""))
    name = " / ".join(str(x) for x in (result.get("experiment"), result.get("variant")) if x)
    text = f"{what}\n{name} ({src})"
    if isinstance(ax_or_fig, Figure):
        ax_or_fig.suptitle(text)
    else:
        ax_or_fig.set_title(text)


def _series(cells: dict[float, Cell], path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Levels, values and validity of one arm's cells for a summary metric."""
    cs = sorted(cells)
    return (
        np.array(cs, dtype=float),
        np.array([metric_value_any(cells[c].summary, PLOTTED[path]) for c in cs]),
        np.array([cells[c].valid for c in cs], dtype=bool),
    )


def log_c_axis(ax: Any, levels: Any) -> None:
    """Log concurrency axis with a tick at every measured level, labelled as plain numbers (1, 2, 5, 10...)."""
    from matplotlib import ticker

    ax.set_xscale("log")
    ticks = sorted({float(c) for c in levels if c and np.isfinite(c)})
    if ticks:
        ax.set_xticks(ticks)
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())


def _arm_lines(ax: Any, cells: dict[str, dict[float, Cell]], arms: list[str], path: str) -> bool:
    """One line per arm over all its levels; invalid points overdrawn hollow red. Returns: any invalid."""
    any_invalid = False
    for arm in arms:
        x, y, ok = _series(cells.get(arm, {}), path)
        if x.size == 0 or not np.any(np.isfinite(y)):
            continue
        ax.plot(x, y, marker="o", label=arm, color=_color(cells, arm))
        if np.any(~ok):
            any_invalid = True
            ax.plot(x[~ok], y[~ok], **_INVALID)
    log_c_axis(ax, [c for arm in arms for c in cells.get(arm, {})])
    ax.grid(True, which="both", alpha=0.3)
    return any_invalid


def _color(cells: dict[str, dict[float, Cell]], arm: str) -> str:
    """A fixed colour per arm (its rank among all arms), the same in every figure."""
    names = sorted(cells)
    return f"C{names.index(arm) % 10}" if arm in names else "C0"


def _legend(ax: Any, any_invalid: bool) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if any_invalid:
        handles.append(Line2D([], [], **_INVALID))
        labels.append("invalid cell")
    if handles:
        ax.legend(handles, labels, fontsize="small")


def plot_variant(result: dict[str, Any], cells: dict[str, dict[float, Cell]], out_dir: str | Path) -> list[Path]:
    """All plot kinds of one variant from its crossover.json body and its cells; returns the files written."""
    out_dir = Path(out_dir)
    base_arm = result["baseline_arm"]
    spec_arms = list(result["arms"])
    arms = [base_arm, *spec_arms]
    written: list[Path] = []

    fig, ax = plt.subplots(figsize=(7, 4.5))
    inv = _arm_lines(ax, cells, arms, "aggregate_tok_s")
    ax.set_xlabel("concurrency C (requests in flight)")
    ax.set_ylabel("aggregate throughput (output tok/s)")
    _title(ax, "Aggregate throughput vs concurrency", result)
    _legend(ax, inv)
    written += save_figure(fig, out_dir / "throughput")

    fig, ax = plt.subplots(figsize=(7, 4.5))
    inv = False
    for name, ar in result["arms"].items():
        m = ar["metrics"][ar["primary_metric"]]
        x = np.array(ar["levels"], dtype=float)
        y = np.array([np.nan if v is None else v for v in m["speedup"]], dtype=float)
        lo = np.array([np.nan if v is None else v for v in m["speedup_lo"]], dtype=float)
        hi = np.array([np.nan if v is None else v for v in m["speedup_hi"]], dtype=float)
        if x.size == 0:
            continue
        (line,) = ax.plot(x, y, marker="o", label=f"{name} / {base_arm} ({m['orientation']})")
        ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2, label=f"{name}: 95% interval")
        x_ = ar.get("crossover") or {}
        if x_.get("estimate") is not None and x_["states"]["estimate"] == "within":
            ax.axvline(x_["estimate"], color=line.get_color(), linestyle="--", linewidth=1)
            lo_c = x_["lo"] if x_.get("lo") is not None and x_["lo"] > 0 else float(x.min())
            hi_c = x_["hi"] if x_.get("hi") is not None else float(x.max())
            label = f"{name}: crossover C = {x_['estimate']:.3g} [{lo_c:.3g}, {hi_c:.3g}]"
            ax.axvspan(lo_c, hi_c, color=line.get_color(), alpha=0.08, label=label)
            ax.annotate(
                f"C = {x_['estimate']:.3g}",
                (x_["estimate"], 1.0),
                xytext=(4, 6),
                textcoords="offset points",
                color=line.get_color(),
                fontsize="small",
                fontweight="bold",
            )
        for e in ar["invalid_cells"]:
            inv = True
            ax.axvline(e["concurrency"], color="red", linestyle=":", linewidth=1)
    ax.axhline(1.0, color="black", linewidth=1, label="break-even (1.0)")
    log_c_axis(ax, [c for ar in result["arms"].values() for c in ar["levels"]])
    ax.grid(True, which="both", alpha=0.3)
    ax.set_xlabel("concurrency C (requests in flight)")
    ax.set_ylabel("speedup (> 1: speculation better)")
    _title(ax, "Speedup of speculative decoding", result)
    handles, labels = ax.get_legend_handles_labels()
    if inv:
        handles.append(Line2D([], [], color="red", linestyle=":"))
        labels.append("invalid cell (left out)" if not result.get("include_invalid") else "invalid cell (included)")
    # outside the axes: inside, it covered the crossover band at low speedups
    ax.legend(handles, labels, fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    written += save_figure(fig, out_dir / "speedup")

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    any_inv = False
    for ax, (path, label) in zip(
        axes,
        (
            ("tpot_p50_s", "TPOT p50 (s/token)"),
            ("tpot_p99_s", "TPOT p99 (s/token)"),
            ("ttft_p50_s", "TTFT p50 (s)"),
        ),
        strict=True,
    ):
        any_inv |= _arm_lines(ax, cells, arms, path)
        ax.set_xlabel("concurrency C (requests in flight)")
        ax.set_ylabel(label)
        ax.set_yscale("log")
    _legend(axes[0], any_inv)
    _title(fig, "Latency vs concurrency", result)
    written += save_figure(fig, out_dir / "latency")

    fig, ax = plt.subplots(figsize=(7, 4.5))
    inv = _arm_lines(ax, cells, spec_arms, "accept_length")
    ax.set_xlabel("concurrency C (requests in flight)")
    ax.set_ylabel("accept length (tokens per verify step)")
    if not ax.lines:
        ax.text(0.5, 0.5, "no accept-length data in these cells", ha="center", va="center", transform=ax.transAxes)
    _title(ax, "Accept length vs concurrency", result)
    _legend(ax, inv)
    written += save_figure(fig, out_dir / "accept_length")
    for family, proof in (result.get("policy_proof") or {}).items():
        if proof.get("per_level"):
            written += _envelope_plot(result, cells, family, proof, out_dir)
    return written


def _envelope_plot(
    result: dict[str, Any], cells: dict[str, dict[float, Cell]], family: str, proof: dict[str, Any], out_dir: Path
) -> list[Path]:
    """Baseline, every draft length and the policy arm (top), and the policy over the best fixed arm with its
    interval (bottom): the policy should ride the upper envelope of the fixed arms."""
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(7, 6.5), sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    inv = _arm_lines(ax, cells, proof["fixed_arms"], "aggregate_tok_s")
    x, y, ok = _series(cells.get(proof["policy_arm"], {}), "aggregate_tok_s")
    ax.plot(x, y, color="black", linestyle="--", linewidth=2, marker="s", label=f"{proof['policy_arm']} (schedule)")
    if np.any(~ok):
        inv = True
        ax.plot(x[~ok], y[~ok], **_INVALID)
    ax.set_ylabel("aggregate throughput (output tok/s)")
    _legend(ax, inv)
    rows = [r for r in proof["per_level"] if r["ratio"] is not None]
    c = np.array([r["concurrency"] for r in rows], dtype=float)
    ratio = np.array([r["ratio"] for r in rows], dtype=float)
    lo = np.array([np.nan if r["ratio_lo"] is None else r["ratio_lo"] for r in rows], dtype=float)
    hi = np.array([np.nan if r["ratio_hi"] is None else r["ratio_hi"] for r in rows], dtype=float)
    ax2.plot(c, ratio, color="black", marker="s", label="policy / best fixed arm")
    ax2.fill_between(c, lo, hi, color="black", alpha=0.15, label="95% interval")
    fails = np.array([r["status"] == "fails" for r in rows], dtype=bool)
    if np.any(fails):
        ax2.plot(c[fails], ratio[fails], "x", color="red", markersize=10, label="policy fails here")
    ax2.axhline(1.0, color="gray", linewidth=1)
    log_c_axis(ax2, c)
    ax2.grid(True, which="both", alpha=0.3)
    ax2.set_xlabel("concurrency C (requests in flight)")
    ax2.set_ylabel("policy / best fixed")
    ax2.legend(fontsize="small")
    _title(fig, f"Policy {family}: schedule {proof.get('schedule')}", result)
    return save_figure(fig, out_dir / f"policy_{family}")
