"""A saved view of the experiment in MLflow's UI: the arms' curves against concurrency on a log axis.

Why: MLflow draws step-logged metrics against a linear Step axis, which squeezes C = 1..30 (where the crossover
usually is) into the left edge, and its generated chart list holds every metric of every run. A saved view (the
experiment page's **Views** menu, MLflow >= 3.17) opens the chart view on a short list of line charts with a
log-scaled C axis: aggregate throughput of every sweep, each arm's speedup with its interval, latencies, accept
length, the policy arms' regret and the cells' validity. It is stored the way the UI stores views a user saves:
an experiment tag `mlflow.sharedViewState.<key>` holding `{name, createdAt, updatedAt, state}`, where `state` is
the JSON of the experiment page's UI state. The browser test (tests/pipeline/test_mlflow_ui.py) opens it in a
real Chromium, so a change of that format in a later MLflow fails a test rather than a user.
"""

from __future__ import annotations

import json
import time
from typing import Any

VIEW_KEY = "specsweep-vs-concurrency"
VIEW_NAME = "specsweep: arms vs concurrency (log C)"
TAG_PREFIX = "mlflow.sharedViewState."
SECTION = "specsweep-section-curves"


def _line_chart(uuid: str, title: str, keys: list[str]) -> dict[str, Any]:
    """One line chart of `keys` against step (= concurrency) on a log x axis."""
    return {
        "uuid": uuid,
        "type": "LINE",
        "runsCountToCompare": 100,
        "metricSectionId": SECTION,
        "deleted": False,
        "isGenerated": False,
        "displayName": title,
        "metricKey": keys[0],
        "selectedMetricKeys": keys,
        "lineSmoothness": 0,
        "xAxisScaleType": "log",
        "scaleType": "linear",
        "range": {},
        "xAxisKey": "step",
        "selectedXAxisMetricKey": "",
        "yAxisKey": "metric",
        "yAxisExpressions": [],
        "ignoreOutliers": False,
        "useGlobalXaxisKey": False,
        "useGlobalLineSmoothing": False,
        "displayPoints": True,
    }


def charts(speculative_arms: list[str], policy_arms: list[str]) -> list[dict[str, Any]]:
    """The view's charts, in reading order: the question first (throughput, speedup), then why."""
    out = [_line_chart("specsweep-aggregate_tok_s", "aggregate_tok_s (sweeps) vs C", ["aggregate_tok_s"])]
    for arm in speculative_arms:
        keys = [f"{arm}.speedup", f"{arm}.speedup_lo", f"{arm}.speedup_hi"]
        out.append(_line_chart(f"specsweep-{arm}-speedup", f"{arm} speedup over baseline vs C (crossover run)", keys))
    for name in ("tpot_p50_s", "tpot_p99_s", "ttft_p50_s", "e2e_p50_s", "per_request_tok_s_mean", "accept_length"):
        out.append(_line_chart(f"specsweep-{name}", f"{name} (sweeps) vs C", [name]))
    for arm in policy_arms:
        keys = [f"{arm}.policy_over_best", f"{arm}.policy_over_best_lo", f"{arm}.policy_over_best_hi"]
        out.append(_line_chart(f"specsweep-{arm}-regret", f"{arm} over best fixed arm vs C", keys))
    out.append(_line_chart("specsweep-cell_valid", "cell_valid (1 valid, 0 invalid) vs C", ["cell_valid"]))
    return out


def view_state(speculative_arms: list[str], policy_arms: list[str]) -> dict[str, Any]:
    """The experiment page's UI state for the view: the sweeps and crossover runs sorted by name (variant, then
    arm), all of them plotted; the cells filtered out (they stay nested under their sweeps in the default view)."""
    return {
        "searchFilter": "tags.`specsweep.kind` != 'cell'",
        "orderByKey": "tags.`mlflow.runName`",
        "orderByAsc": True,
        "startTime": "ALL",
        "lifecycleFilter": "Active",
        "datasetsFilter": [],
        "modelVersionFilter": "All Runs",
        "selectedColumns": ["attributes.`Dataset`"],
        "columnOrder": [],
        "columnWidths": {},
        "runsHiddenMode": "SHOW_ALL",
        "compareRunCharts": charts(speculative_arms, policy_arms),
        "compareRunSections": [
            {
                "uuid": SECTION,
                "name": "specsweep: arms against concurrency C (step = C, log axis)",
                "display": True,
                "isReordered": True,
                "deleted": False,
                "isGenerated": False,
            }
        ],
        "viewMaximized": False,
        "runListHidden": False,
        "isAccordionReordered": True,
        "useGroupedValuesInCharts": True,
        "hideEmptyCharts": True,
        "groupBy": None,
        "groupsExpanded": {},
        "globalLineChartConfig": {"xAxisKey": "step", "lineSmoothness": 0, "selectedXAxisMetricKey": ""},
    }


def view_tag(speculative_arms: list[str], policy_arms: list[str], now_ms: int | None = None) -> tuple[str, str]:
    """(tag key, tag value) of the saved view."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    state = json.dumps(view_state(speculative_arms, policy_arms), separators=(",", ":"))
    envelope = {"name": VIEW_NAME, "createdAt": now, "updatedAt": now, "state": state}
    return TAG_PREFIX + VIEW_KEY, json.dumps(envelope, separators=(",", ":"))


def view_arms(tag_value: str) -> tuple[list[str], list[str]]:
    """The (speculative, policy) arms a saved view's tag value draws charts for (`charts` read back); none
    from a value that is not such a view (edited by hand, another format)."""
    try:
        state = json.loads(json.loads(tag_value)["state"])
        uuids = [str(c.get("uuid", "")) for c in state.get("compareRunCharts") or []]
    except (ValueError, KeyError, TypeError, AttributeError):
        return [], []
    arms: tuple[list[str], list[str]] = ([], [])
    for uuid in uuids:
        for out, suffix in zip(arms, ("-speedup", "-regret"), strict=True):
            if uuid.startswith("specsweep-") and uuid.endswith(suffix):
                out.append(uuid[len("specsweep-") : -len(suffix)])
    return arms


def view_url(base: str, experiment_id: str) -> str:
    """The URL that opens the experiment's runs page on the saved view (the Views menu shows the same)."""
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?viewStateShareKey={VIEW_KEY}&compareRunsMode=CHART"
