"""Per-variant virtual environments, built from a recipe in `envs/` and reused while the recipe is unchanged.

A recipe is a pip requirements file (`envs/<name>.txt`): requirement lines plus any pip options it needs
(`--extra-index-url`, `--index-url`, `--find-links`, `--pre`, ...). Lines starting with `# specsweep:` are
directives read by this module:

    # specsweep: uninstall torchvision torchaudio   (remove these after the install; absent ones are ignored)
    # specsweep: pip-args --no-deps                 (extra arguments for `pip install -r`)
    # specsweep: patch patches/x.patch [--target sglang] [--strip 1]
                                                   (apply this patch to the installed packages after pip)

pip runs in the recipe's folder, so relative paths in a recipe (local wheels, `-e` checkouts, `--find-links`
folders, `-r` includes) and patch paths are relative to the recipe. A patch is applied with GNU `patch`
(`--fuzz=0`, every hunk checked by a dry run first) inside `<site-packages>/<target>`; a hunk that does not
apply stops the build with the patch file, the patched file and the hunk named.

The environment lives in `<envs_root>/<recipe-stem>-<hash12>/`, where the hash covers the recipe's bytes, the
bytes of its patches and of the local files and folders it installs from, the base Python's version and
platform, and this module's build format. It is built in a temporary sibling
folder and renamed into place only after every step succeeded and the marker file `specsweep-env.json` is
written, so a folder with that name is always complete; a failed build leaves only the log behind.
Concurrent builders of the same recipe wait on a lock file and then reuse the first one's result.

The environment's interpreter is run as `<env>/bin/python -m ...`; console scripts in `<env>/bin/` are
rewritten to the final path after the rename, but nothing in specsweep relies on them.

The `sim` engine needs no environment: it runs on the project's own Python (see `python_for_variant`).

    specsweep build-env --recipe envs/vllm-cpu.txt --envs-root results/_envs
"""

from __future__ import annotations

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
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, TextIO

from specsweep.io import file_lock

BUILD_FORMAT = 1  # bump when the way environments are built changes (forces rebuilds)
MARKER = "specsweep-env.json"
DIRECTIVE = "# specsweep:"
KNOWN_DIRECTIVES = ("uninstall", "pip-args", "patch")
# Folders of a local checkout that are build outputs or caches, not its content (left out of the hash).
_SKIP_DIRS = {".git", ".hg", "__pycache__", ".tox", ".venv", ".mypy_cache", ".pytest_cache", ".ruff_cache", "build"}
_PATH_SUFFIXES = (".whl", ".tar.gz", ".tgz", ".zip", ".tar.bz2")


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
    patches: list[dict[str, Any]] = []
    local: list[Path] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if line.startswith(DIRECTIVE):
            body = line[len(DIRECTIVE) :].strip()
            word, _, rest = body.partition(" ")
            if word == "uninstall":
                uninstall += rest.split()
            elif word == "pip-args":
                pip_args += shlex.split(rest)
            elif word == "patch":
                patches.append(_parse_patch(recipe_path, n, rest))
            else:
                raise RecipeError(
                    f"{recipe_path}:{n}: unknown directive {word!r} (known: {', '.join(KNOWN_DIRECTIVES)})"
                )
            continue
        if line and not line.startswith("#"):
            lines.append(line)
            local += [p for p in [_local_path(recipe_path, line)] if p is not None and p not in local]
    return {
        "text": text,
        "lines": lines,
        "uninstall": uninstall,
        "pip_args": pip_args,
        "patches": patches,
        "local": local,
    }


def _parse_patch(recipe_path: Path, n: int, rest: str) -> dict[str, Any]:
    """`patch FILE [--target DIR] [--strip N]`: the patch file (relative to the recipe) and where it applies."""
    usage = "(form: `# specsweep: patch <file, relative to the recipe> [--target <site-packages folder>] [--strip N]`)"
    words = shlex.split(rest)
    target, strip, files = "", 1, []
    i = 0
    while i < len(words):
        w = words[i]
        if w in ("--target", "--strip") and i + 1 < len(words):
            if w == "--target":
                target = words[i + 1]
            elif not words[i + 1].isdigit():
                raise RecipeError(f"{recipe_path}:{n}: --strip takes a number, not {words[i + 1]!r} {usage}")
            else:
                strip = int(words[i + 1])
            i += 2
            continue
        if w.startswith("-"):
            raise RecipeError(f"{recipe_path}:{n}: unknown patch option {w!r} {usage}")
        files.append(w)
        i += 1
    if len(files) != 1:
        raise RecipeError(f"{recipe_path}:{n}: a patch directive names exactly one file {usage}")
    if Path(target).is_absolute() or ".." in Path(target).parts:
        raise RecipeError(f"{recipe_path}:{n}: --target {target!r} must be a folder inside site-packages {usage}")
    path = (recipe_path.parent / files[0]).resolve()
    if not path.is_file():
        raise RecipeError(
            f"{recipe_path}:{n}: patch file {path} not found (fix: put the patch there, or correct the path; it "
            f"is relative to the recipe's folder {recipe_path.parent})"
        )
    return {"path": path, "target": target, "strip": strip, "line": n}


def _local_path(recipe_path: Path, line: str) -> Path | None:
    """The local file or folder a requirement line installs from (wheel, sdist, checkout, find-links folder,
    `-r`/`-c` include), resolved against the recipe's folder; None for an index requirement or a URL.
    A path that does not exist is returned too: its absence is part of the hash, and pip reports it."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return None
    if not words:
        return None
    first = words[0]
    candidate: str | None = None
    for opt in ("-e", "--editable", "-f", "--find-links", "-r", "--requirement", "-c", "--constraint"):
        if first == opt and len(words) > 1:
            candidate = words[1]
        elif first.startswith(opt + "=") and opt.startswith("--"):
            candidate = first.split("=", 1)[1]
    if candidate is None:
        if first.startswith("-"):
            return None  # another pip option (index URLs, --pre, ...)
        at = line.split(" @ ", 1)
        candidate = at[1].split(";")[0].strip() if len(at) == 2 else first.split(";")[0]
    if candidate.startswith("file:"):
        candidate = urllib.request.url2pathname(urllib.parse.urlparse(candidate).path)
    elif "://" in candidate or candidate.startswith("git+"):
        return None
    candidate = candidate.split("[", 1)[0]
    looks_local = candidate.startswith((".", "/", "~")) or "/" in candidate or candidate.endswith(_PATH_SUFFIXES)
    path = (recipe_path.parent / Path(candidate).expanduser()).resolve()
    if path.exists() or looks_local:
        return path
    return None


def _content_digest(path: Path) -> bytes:
    """sha256 of a local file, or of a folder's files (relative names and bytes; caches and .git left out)."""
    h = hashlib.sha256()
    if path.is_file():
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    elif path.is_dir():
        for root, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.endswith(".egg-info"))
            for name in sorted(files):
                if name.endswith((".pyc", ".pyo")):
                    continue
                full = Path(root) / name
                h.update(str(full.relative_to(path)).encode() + b"\0")
                if full.is_file():
                    h.update(_content_digest(full))
    else:
        h.update(b"missing")
    return h.digest()


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
    """sha256 (hex) of the recipe content, its patches and local artifacts, the base Python's version/platform
    and the build format. A recipe without patches or local paths hashes as before they existed."""
    data = Path(recipe_path).read_bytes()
    h = hashlib.sha256()
    h.update(data)
    recipe = parse_recipe(Path(recipe_path))
    for patch in recipe["patches"]:  # the directive's text (target, strip) is in the recipe's bytes
        h.update(b"\0patch\0" + patch["path"].read_bytes())
    for local in recipe["local"]:
        name = os.path.relpath(local, Path(recipe_path).parent)  # the same wherever the checkout lives
        h.update(b"\0local\0" + name.encode() + b"\0" + _content_digest(local))
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


def _run(cmd: list[str], log: TextIO, env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
    """Run a command, copying its output to `log`; raise EnvBuildError on failure."""
    log.write(f"$ {shlex.join(cmd)}\n")
    log.flush()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        log.write(line)
    rc = proc.wait()
    log.flush()
    if rc != 0:
        raise EnvBuildError(f"command failed with exit status {rc}: {shlex.join(cmd)}")


def site_packages(python: Path) -> Path:
    """The environment's site-packages (purelib), where patches apply."""
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def patch_hunks(patch: Path) -> dict[str, list[str]]:
    """Each patched file's hunk headers (`@@ -a,b +c,d @@ context`), in order, as written in the patch."""
    hunks: dict[str, list[str]] = {}
    current = None
    for line in patch.read_text(errors="replace").splitlines():
        if line.startswith("+++ "):
            current = line[4:].split("\t")[0].strip()
            hunks.setdefault(current, [])
        elif line.startswith("@@") and current is not None:
            hunks[current].append(line)
    return hunks


def _patch_failure(patch: dict[str, Any], target: Path, output: str, recipe_path: Path) -> str:
    """What went wrong in `patch`'s dry run, naming the patch file, the file and the hunk, and the fix."""
    where = f"patch {patch['path']} (recipe {recipe_path}:{patch['line']})"
    hunks = patch_hunks(patch["path"])
    failures = []
    checking = None
    for line in output.splitlines():
        if line.startswith(("checking file ", "patching file ")):
            checking = line.split(" ", 2)[2].strip()
        elif line.startswith("Hunk #") and "FAILED" in line:
            number = int(line.split("#", 1)[1].split()[0])
            headers = next(
                (h for name, h in hunks.items() if checking and _strip(name, patch["strip"]) == checking), []
            )
            header = headers[number - 1] if 0 < number <= len(headers) else "?"
            failures.append(f"{checking}: hunk #{number} {header} ({line.strip()})")
    if failures:
        return (
            f"{where} does not apply in {target}: " + "; ".join(failures) + ". Fix: make the patch against the "
            "installed release (the recipe's pinned version; fuzz is off), or drop it if the release already "
            "has the change"
        )
    if "Reversed (or previously applied) patch detected" in output:
        return (
            f"{where}: the installed package already has this change ({output.strip().splitlines()[0]}). "
            "Fix: drop the patch from the recipe (the pinned release includes it)"
        )
    if "can't find file to patch" in output or "No file to patch" in output:
        return (
            f"{where}: the file it patches is not in {target} ({', '.join(hunks) or 'no file names'}). Fix: set "
            "--target to the folder under site-packages the paths start from, and --strip to the number of leading "
            "path parts to drop (1 for git's a/ b/)"
        )
    return f"{where} failed in {target}: {output.strip()[-2000:]}"


def patched_files(patch: dict[str, Any]) -> list[str]:
    """The files a recipe's patch directive changes, as paths under its target (after `patch -pN`)."""
    return [_strip(f, patch["strip"]) for f in patch_hunks(Path(patch["path"]))]


def _strip(name: str, n: int) -> str:
    """A patch's file name after `patch -pN`."""
    return "/".join(name.split("/")[n:])


def apply_patches(patches: list[dict[str, Any]], python: Path, log: TextIO, recipe_path: Path) -> list[dict[str, Any]]:
    """Apply the recipe's patches to the installed packages, each checked whole by a dry run first, so a
    failing hunk stops the build before anything is half-patched; return what was applied."""
    tool = shutil.which("patch")
    if tool is None:
        raise EnvBuildError(
            f"recipe {recipe_path} has patch directives, and GNU patch is not installed "
            "(fix: apt-get install patch, or your system's equivalent)"
        )
    site = site_packages(python)
    applied = []
    for patch in patches:
        target = site / patch["target"]
        if not target.is_dir():
            raise EnvBuildError(
                f"patch {patch['path']} (recipe {recipe_path}:{patch['line']}): target {target} is not an "
                "installed folder (fix: --target names a folder under site-packages, e.g. the package name)"
            )
        cmd = [tool, f"-p{patch['strip']}", "--batch", "--forward", "--fuzz=0", "--no-backup-if-mismatch"]
        cmd += ["-d", str(target), "-i", str(patch["path"])]
        dry = subprocess.run(cmd + ["--dry-run"], capture_output=True, text=True, stdin=subprocess.DEVNULL)
        log.write(f"$ {shlex.join(cmd + ['--dry-run'])}\n{dry.stdout}{dry.stderr}")
        if dry.returncode != 0:
            raise EnvBuildError(_patch_failure(patch, target, dry.stdout + dry.stderr, recipe_path))
        _run(cmd, log)
        applied.append(
            {
                "path": str(patch["path"]),
                "sha256": hashlib.sha256(patch["path"].read_bytes()).hexdigest(),
                "target": patch["target"],
                "strip": patch["strip"],
                "files": patched_files(patch),
            }
        )
    return applied


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
            needs_pip = bool(recipe["lines"] or recipe["uninstall"] or recipe["patches"])
            # an empty recipe (tests, or a stack that is the base interpreter's) needs no pip: much faster
            venv_opts = ["--prompt", final.name] + ([] if needs_pip else ["--without-pip"])
            _run([base_python, "-m", "venv", *venv_opts, str(tmp)], log)
            py = str(env_python(tmp))
            pip = [py, "-m", "pip", "--disable-pip-version-check"]
            penv = dict(os.environ)
            penv.pop("PYTHONPATH", None)
            penv["PIP_NO_INPUT"] = "1"
            if recipe["lines"]:
                # in the recipe's folder: relative paths in the recipe are relative to the recipe
                install = pip + ["install", "-r", str(recipe_path.absolute())] + recipe["pip_args"]
                _run(install, log, penv, cwd=recipe_path.absolute().parent)
            else:
                log.write("recipe lists no requirements: nothing to install\n")
            if recipe["uninstall"]:
                _run(pip + ["uninstall", "-y"] + recipe["uninstall"], log, penv)
            applied = apply_patches(recipe["patches"], Path(py), log, recipe_path) if recipe["patches"] else []
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
                "patches": applied,
                "local": [
                    {"path": str(p), "sha256": _content_digest(p).hex() if p.exists() else None}
                    for p in recipe["local"]
                ],
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


def ensure_env_logged(recipe: Path, envs_root: Path, log_path: Path | None) -> Path:
    """ensure_env with its build log appended to `log_path` (its folder made), or on stderr when None."""
    if log_path is None:
        return ensure_env(recipe, envs_root, sys.stderr)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a") as log:
        return ensure_env(recipe, envs_root, log)
