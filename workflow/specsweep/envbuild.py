"""Per-variant virtual environments, built from a recipe in `envs/` and reused while the recipe is unchanged.

A recipe is a pip requirements file (`envs/<name>.txt`): requirement lines plus any pip options it needs
(`--extra-index-url`, `--index-url`, `--find-links`, `--pre`, ...). Lines starting with `# specsweep:` are
directives read by this module:

    # specsweep: uninstall torchvision torchaudio   (remove these after the install; absent ones are ignored)
    # specsweep: pip-args --no-deps                 (extra arguments for `pip install -r`)

The environment lives in `<envs_root>/<recipe-stem>-<hash12>/`, where the hash covers the recipe's bytes, the
base Python's version and platform, and this module's build format. It is built in a temporary sibling
folder and renamed into place only after every step succeeded and the marker file `specsweep-env.json` is
written, so a folder with that name is always complete; a failed build leaves only the log behind.
Concurrent builders of the same recipe wait on a lock file and then reuse the first one's result.

The environment's interpreter is run as `<env>/bin/python -m ...`; console scripts in `<env>/bin/` are
rewritten to the final path after the rename, but nothing in specsweep relies on them.

The `sim` engine needs no environment: it runs on the project's own Python (see `python_for_variant`).

    python -m specsweep.envbuild --recipe envs/vllm-cpu.txt --envs-root results/_envs
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, TextIO

from specsweep.io import file_lock

BUILD_FORMAT = 1  # bump when the way environments are built changes (forces rebuilds)
MARKER = "specsweep-env.json"
DIRECTIVE = "# specsweep:"
KNOWN_DIRECTIVES = ("uninstall", "pip-args")


class RecipeError(Exception):
    """The recipe is missing or malformed."""


class EnvBuildError(Exception):
    """Building the environment failed (the log says why)."""


def parse_recipe(recipe_path: Path) -> dict[str, Any]:
    """Read a recipe: its text, its requirement/option lines and its specsweep directives."""
    recipe_path = Path(recipe_path)
    if not recipe_path.is_file():
        raise RecipeError(
            f"environment recipe not found: {recipe_path} "
            f"(fix: create it as a pip requirements file, see docs/engines.md, or point the variant's "
            f"`recipe:` key at an existing file under envs/)"
        )
    text = recipe_path.read_text()
    uninstall: list[str] = []
    pip_args: list[str] = []
    lines: list[str] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if line.startswith(DIRECTIVE):
            body = line[len(DIRECTIVE) :].strip()
            word, _, rest = body.partition(" ")
            if word == "uninstall":
                uninstall += rest.split()
            elif word == "pip-args":
                pip_args += shlex.split(rest)
            else:
                raise RecipeError(
                    f"{recipe_path}:{n}: unknown directive {word!r} (known: {', '.join(KNOWN_DIRECTIVES)})"
                )
            continue
        if line and not line.startswith("#"):
            lines.append(line)
    return {"text": text, "lines": lines, "uninstall": uninstall, "pip_args": pip_args}


def python_tag(base_python: str | None = None) -> str:
    """Version and platform of the interpreter that builds environments (part of the env's hash)."""
    if base_python is None or Path(base_python).resolve() == Path(sys.executable).resolve():
        impl, ver = platform.python_implementation(), platform.python_version()
        return f"{impl}-{ver}-{sys.platform}-{platform.machine()}"
    out = subprocess.run(
        [
            base_python,
            "-c",
            "import platform,sys;print(f'{platform.python_implementation()}-{platform.python_version()}"
            "-{sys.platform}-{platform.machine()}')",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


def recipe_hash(recipe_path: Path, base_python: str | None = None) -> str:
    """sha256 (hex) of the recipe content, the base Python's version/platform and the build format."""
    data = Path(recipe_path).read_bytes()
    h = hashlib.sha256()
    h.update(data)
    h.update(b"\0" + python_tag(base_python).encode())
    h.update(b"\0" + f"specsweep-envbuild-{BUILD_FORMAT}".encode())
    return h.hexdigest()


def env_dir(recipe_path: Path, envs_root: Path, base_python: str | None = None) -> Path:
    """Where the environment for this recipe lives (whether built or not)."""
    return Path(envs_root) / f"{Path(recipe_path).stem}-{recipe_hash(recipe_path, base_python)[:12]}"


def env_python(env: Path) -> Path:
    return Path(env) / "bin" / "python"


def is_complete(env: Path) -> bool:
    return (Path(env) / MARKER).is_file() and env_python(env).exists()


def _run(cmd: list[str], log: TextIO, env: dict[str, str] | None = None) -> None:
    """Run a command, copying its output to `log`; raise EnvBuildError on failure."""
    log.write(f"$ {shlex.join(cmd)}\n")
    log.flush()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, stdin=subprocess.DEVNULL
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        log.write(line)
    rc = proc.wait()
    log.flush()
    if rc != 0:
        raise EnvBuildError(f"command failed with exit status {rc}: {shlex.join(cmd)}")


def _relocate_scripts(env: Path, old: Path, new: Path) -> None:
    """Point shebangs and activate scripts in bin/ at the final location after the rename."""
    old_b, new_b = str(old).encode(), str(new).encode()
    for p in (env / "bin").iterdir():
        if p.is_symlink() or not p.is_file():
            continue
        try:
            data = p.read_bytes()
        except OSError:
            continue
        if old_b in data[:4096] or (p.name.startswith("activate") and old_b in data):
            p.write_bytes(data.replace(old_b, new_b))


def ensure_env(recipe_path: Path, envs_root: Path, log: TextIO, base_python: str | None = None) -> Path:
    """Build (or reuse) the environment of `recipe_path` under `envs_root`; return its python."""
    recipe_path = Path(recipe_path)
    recipe = parse_recipe(recipe_path)  # raises RecipeError with the fix when missing
    base_python = base_python or _base_interpreter()
    envs_root = Path(envs_root).absolute()
    digest = recipe_hash(recipe_path, base_python)
    final = envs_root / f"{recipe_path.stem}-{digest[:12]}"
    if is_complete(final):
        log.write(f"reusing environment {final}\n")
        return env_python(final)

    with file_lock(envs_root / f".{final.name}.lock"):
        if is_complete(final):  # another builder finished while we waited
            log.write(f"reusing environment {final} (built concurrently)\n")
            return env_python(final)
        if final.exists():  # incomplete leftover from something else; never trust it
            log.write(f"removing incomplete environment {final}\n")
            shutil.rmtree(final)
        # leftovers of a builder killed outright (we hold the lock, so none is live)
        for stale in envs_root.glob(f".{final.name}.building-*"):
            log.write(f"removing stale build folder {stale}\n")
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.building-", dir=envs_root))
        log.write(f"building environment {final} from {recipe_path} (sha256 {digest[:12]}) in {tmp}\n")
        t0 = _dt.datetime.now(_dt.UTC)
        try:
            needs_pip = bool(recipe["lines"] or recipe["uninstall"])
            # an empty recipe (tests, or a stack that is the base interpreter's) needs no pip: much faster
            venv_opts = ["--prompt", final.name] + ([] if needs_pip else ["--without-pip"])
            _run([base_python, "-m", "venv", *venv_opts, str(tmp)], log)
            py = str(env_python(tmp))
            pip = [py, "-m", "pip", "--disable-pip-version-check"]
            penv = dict(os.environ)
            penv.pop("PYTHONPATH", None)
            penv["PIP_NO_INPUT"] = "1"
            if recipe["lines"]:
                _run(pip + ["install", "-r", str(recipe_path.absolute())] + recipe["pip_args"], log, penv)
            else:
                log.write("recipe lists no requirements: nothing to install\n")
            if recipe["uninstall"]:
                _run(pip + ["uninstall", "-y"] + recipe["uninstall"], log, penv)
            freeze = (
                subprocess.run(
                    pip + ["freeze", "--all"], capture_output=True, text=True, env=penv, check=False
                ).stdout.splitlines()
                if needs_pip
                else []
            )
            t1 = _dt.datetime.now(_dt.UTC)
            manifest = {
                "recipe": str(recipe_path),
                "recipe_sha256": digest,
                "python_tag": python_tag(base_python),
                "base_python": base_python,
                "build_format": BUILD_FORMAT,
                "uninstalled": recipe["uninstall"],
                "built_at": t1.isoformat(),
                "build_seconds": round((t1 - t0).total_seconds(), 1),
                "packages": freeze,
            }
            _relocate_scripts(tmp, tmp, final)
            (tmp / MARKER).write_text(json.dumps(manifest, indent=2) + "\n")
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            log.write(f"environment build failed; removed {tmp}\n")
            raise
        log.write(f"environment ready: {final} ({manifest['build_seconds']} s)\n")
        return env_python(final)


def _base_interpreter() -> str:
    """The interpreter that makes environments: the one running specsweep, resolved out of its venv."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    return str(base)


def env_manifest(python: str | Path) -> dict[str, Any] | None:
    """The marker of the environment owning `python` (None for an interpreter not built here)."""
    marker = Path(python).parent.parent / MARKER
    if marker.is_file():
        return json.loads(marker.read_text())
    return None


def python_for_variant(variant: dict[str, Any], envs_root: Path, log: TextIO, root: Path | None = None) -> str:
    """The interpreter that runs a variant's server: the project's own for `sim`, else the recipe's env."""
    if variant.get("engine", "sim") == "sim" or not variant.get("recipe"):
        if variant.get("engine", "sim") != "sim":
            raise RecipeError(
                f"variant with engine {variant.get('engine')!r} has no `recipe:` (fix: add e.g. "
                f"`recipe: envs/vllm-cpu.txt` to the variant in the config)"
            )
        return sys.executable
    recipe = Path(variant["recipe"])
    if root is not None and not recipe.is_absolute():
        recipe = Path(root) / recipe
    return str(ensure_env(recipe, envs_root, log))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--recipe", required=True, type=Path, help="pip requirements file under envs/")
    p.add_argument("--envs-root", type=Path, default=Path("results/_envs"), help="where environments live")
    p.add_argument("--log", type=Path, default=None, help="append the build log here (default: stderr)")


def run(args: argparse.Namespace) -> int:
    try:
        if args.log:
            args.log.parent.mkdir(parents=True, exist_ok=True)
            with open(args.log, "a") as log:
                py = ensure_env(args.recipe, args.envs_root, log)
        else:
            py = ensure_env(args.recipe, args.envs_root, sys.stderr)
    except (RecipeError, EnvBuildError) as e:
        print(f"specsweep envbuild: {e}", file=sys.stderr)
        return 1
    print(py)
    return 0


if __name__ == "__main__":
    _p = argparse.ArgumentParser(prog="python -m specsweep.envbuild", description=__doc__.splitlines()[0])
    add_arguments(_p)
    sys.exit(run(_p.parse_args()))
