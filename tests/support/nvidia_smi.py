"""A stand-in `nvidia-smi` for tests on machines without NVIDIA GPUs: answers `--query-gpu=... --format=csv[,
noheader][,nounits]` the way the real one does for the fields specsweep asks for, from a list of GPUs."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

# The user's box: 8 x RTX PRO 6000 Blackwell (SM120, 96 GB), as the real nvidia-smi names it.
RTX_PRO_6000 = {
    "name": "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
    "compute_cap": "12.0",
    "driver_version": "580.65.06",
    "memory.total": "97887",
}
H100 = {"name": "NVIDIA H100 80GB HBM3", "compute_cap": "9.0", "driver_version": "570.86.15", "memory.total": "81559"}
UNITS = {"memory.total": "MiB"}

_SCRIPT = """#!{python}
import json, sys
gpus = json.loads({gpus!r})
units = {units!r}
query = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--query-gpu=")), None)
fmt = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--format=")), "")
if query is None or not fmt.startswith("csv"):
    print("stand-in nvidia-smi: only --query-gpu=... --format=csv is answered", file=sys.stderr)
    sys.exit(2)
fields = [f.strip() for f in query.split(",")]
for f in fields:
    if f != "index" and f not in gpus[0]:
        print(f'Field "{{f}}" is not a valid field to query.', file=sys.stderr)
        sys.exit(2)
opts = fmt.split(",")[1:]
if "noheader" not in opts:
    print(", ".join(f + (f" [{{units[f]}}]" if f in units and "nounits" not in opts else "") for f in fields))
for i, g in enumerate(gpus):
    row = dict(g, index=str(i))
    print(", ".join(row[f] + (f" {{units[f]}}" if f in units and "nounits" not in opts else "") for f in fields))
"""


def install(bin_dir: Path, gpus: list[dict[str, Any]]) -> Path:
    """Write `bin_dir/nvidia-smi` answering for `gpus` (index = position); put bin_dir first on PATH to use it."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / "nvidia-smi"
    path.write_text(_SCRIPT.format(python=sys.executable, gpus=json.dumps(gpus), units=UNITS))
    path.chmod(0o755)
    return path
