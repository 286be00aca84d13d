"""Early warning: the Kimi example's SGLang command lines parsed by the NEWEST SGLang release's own parser.

Not a test gate (a new release may deprecate a flag the pinned one needs, and the pinned release is what the
recipes install; tests/engine_args checks that one). Run it before moving the pin:

    python benchmarks/sglang_args_newest.py [--version 0.5.23] [--envs-root results/_envs]
    python benchmarks/sglang_args_newest.py --smoke    # the pinned release (tests/pipeline/test_benchmarks.py)

It writes a parser recipe like tests/engine_args/sglang-args.txt with the sglang pin replaced (the other pins kept:
a newer release may need newer ones, and then the import fails, which the output says), builds it with
specsweep.stack.envbuild (cached by content), and runs tests/engine_args/sglang_check.py over the example's commands
(fixed arms, K sub-arms, the policy arm with its adaptive config file). Prints each command's errors and
deprecations in SGLang's words, and exits 1 when there are any.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from specsweep.stack import envbuild  # noqa: E402
from tests.engine_args.conftest import SGLANG_RECIPE, run_check  # noqa: E402
from tests.engine_args.test_sglang_args import sglang_commands  # noqa: E402


def newest_version() -> str:
    """The newest sglang release on the package index, as pip reports it."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "sglang"], capture_output=True, text=True, check=True
    ).stdout
    m = re.search(r"sglang \(([^)]+)\)", out)
    if not m:
        raise SystemExit(f"pip index versions sglang gave no version:\n{out}")
    return m.group(1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--version", default=None, help="the release to check (default: the newest on the index)")
    p.add_argument("--envs-root", type=Path, default=REPO / "results" / "_envs")
    p.add_argument(
        "--smoke", action="store_true", help="the pinned release instead of the newest (its environment is the tier's)"
    )
    args = p.parse_args()
    pinned = re.search(r"^sglang==(\S+)", SGLANG_RECIPE.read_text(), flags=re.MULTILINE)
    version = args.version or (pinned.group(1) if args.smoke and pinned else None) or newest_version()
    recipe_dir = args.envs_root / "recipes"
    recipe_dir.mkdir(parents=True, exist_ok=True)
    if args.smoke:  # the engine_args tier's own recipe, so its environment (by path and content) is reused
        recipe = SGLANG_RECIPE
    else:
        recipe = recipe_dir / f"sglang-args-{version}.txt"
        pinned_to = re.sub(r"^sglang==\S+", f"sglang=={version}", SGLANG_RECIPE.read_text(), flags=re.MULTILINE)
        recipe.write_text(pinned_to)
    with open(recipe_dir / f"sglang-args-{version}.log", "a") as log:
        python = envbuild.ensure_env(recipe, args.envs_root, log)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            out = run_check(str(python), "sglang_check.py", sglang_commands(Path(tmp)))
        except AssertionError as e:
            print(f"sglang {version}: its parser could not be imported with the pinned helpers:\n{e}")
            return 1
    bad = {k: [*r["errors"], *r["deprecated"]] for k, r in out["results"].items() if r["errors"] or r["deprecated"]}
    print(f"sglang {out['version']}: {len(out['results'])} command lines, {len(bad)} with findings")
    for name, found in bad.items():
        print(f"- {name}:")
        for f in found:
            print(f"    {f}")
    print(json.dumps({"version": out["version"], "findings": bad}, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
