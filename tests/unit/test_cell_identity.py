"""Golden cell identities: the cell spec every shipped config gives each cell, pinned.

Why: a cell's spec (`config.cell_spec`) is its Snakemake param, so any change to it re-measures that cell; on the
user's 8-GPU box that is hours of measurements thrown away by a refactor that meant no harm. This test fails on
any change to the spec of any cell of a shipped config (the default, every example, the pipeline tier's), so such
a change is made on purpose and reviewed. Regenerate after an intended change with
`SPECSWEEP_UPDATE_GOLDEN=1 pytest tests/unit/test_cell_identity.py` and review the diff of tests/golden/.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from specsweep import config as ssconfig

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
CONFIGS = {
    "default": ROOT / "config" / "config.yaml",
    **{p.stem: p for p in sorted((ROOT / "config" / "examples").glob("*.yaml"))},
    "pipeline-tiny": ROOT / "tests" / "pipeline" / "tiny.yaml",
}
# what a policy arm serves in these identities: K=3 up to 16 running requests, then none, the baseline best at C=64
SERVED = {"schedule": [[1, 16, 3], [17, 1024, 0]], "best_fixed": {}}

pytestmark = pytest.mark.unit


def identities(config: dict) -> dict[str, dict]:
    """Per variant/arm: the full spec at the first level (readable diffs) and the sha256 of every level's spec,
    as the rules' params serialise them (`config.dumps`)."""
    out: dict[str, dict] = {}
    for variant in config["variants"]:
        for arm, arm_cfg in config["arms"].items():
            served = SERVED if arm_cfg.get("policy") else None
            specs = {f"{c:g}": ssconfig.cell_spec(config, variant, arm, c, served) for c in ssconfig.levels(config)}
            first = next(iter(specs.values()))
            out[f"{variant}/{arm}"] = {
                "first_level": json.loads(ssconfig.dumps(first)),
                "sha256": {c: hashlib.sha256(ssconfig.dumps(s).encode()).hexdigest()[:16] for c, s in specs.items()},
            }
    return out


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_cell_identities_are_pinned(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # configs name their recipes and datasets relative to the checkout
    got = identities(ssconfig.load(CONFIGS[name]))
    path = GOLDEN / f"{name}.cellspecs.json"
    if os.environ.get("SPECSWEEP_UPDATE_GOLDEN"):
        path.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
    want = json.loads(path.read_text())
    changed = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
    assert not changed, (
        f"the cell identity of {', '.join(changed)} in {CONFIGS[name].relative_to(ROOT)} changed: every stored cell "
        f"of it would be measured again. If intended, regenerate {path.relative_to(ROOT)} (module docstring)"
    )
