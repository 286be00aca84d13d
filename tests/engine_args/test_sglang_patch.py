"""The CUDA 13 recipe's SM120 fusion patch, against the pinned SGLang release's own files.

It must apply the way the environment build applies it (envbuild.apply_patches: a dry run first, --fuzz=0), and
the functions it changes must then accept SM120 where stock 0.5.19 refuses it. The functions are compiled from
the patched files and run with a stand-in platform: importing their modules needs CUDA-only packages (triton)."""

from __future__ import annotations

import ast
import io
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from specsweep.stack import envbuild
from tests.conftest import REPO

RECIPE = REPO / "envs" / "sglang-cu130.txt"
LAYERS = Path("sglang") / "srt" / "layers"
FILES = ("flashinfer_comm_fusion.py", "communicator.py")

pytestmark = [pytest.mark.engine_args, pytest.mark.timeout(900)]


@pytest.fixture
def released(sglang_python: str, tmp_path: Path) -> Path:
    """A site-packages holding the pinned release's two fusion files, unpatched."""
    site = tmp_path / "site"
    (site / LAYERS).mkdir(parents=True)
    for name in FILES:
        shutil.copy(envbuild.site_packages(Path(sglang_python)) / LAYERS / name, site / LAYERS / name)
    return site


def _patched(released: Path, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    monkeypatch.setattr(envbuild, "site_packages", lambda python: released)
    patches = envbuild.parse_recipe(RECIPE)["patches"]
    return envbuild.apply_patches(patches, Path("unused"), io.StringIO(), RECIPE)


def _function(path: Path, name: str, scope: dict[str, Any]) -> Any:
    """`name` from the file's source, compiled alone into `scope`."""
    tree = ast.parse(path.read_text())
    [node] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), scope)
    return scope[name]


def _platform(major: int) -> SimpleNamespace:
    return SimpleNamespace(is_sm90=major == 9, is_sm100=major == 10, is_sm120=major == 12)


def _resolve(site: Path, major: int, backend: str = "auto", multi_node: bool = False) -> str:
    scope: dict[str, Any] = {"get_platform": lambda: _platform(major)}
    _function(site / LAYERS / "flashinfer_comm_fusion.py", "_mnnvl_supported", scope)
    return _function(site / LAYERS / "flashinfer_comm_fusion.py", "_resolve_backend", scope)(backend, multi_node)


def _fuses(site: Path, major: int) -> bool:
    """`apply_flashinfer_allreduce_fusion` on a server whose fusion backend resolved, module flags as on `major`."""
    source = (site / LAYERS / "communicator.py").read_text()
    scope: dict[str, Any] = {
        "_is_sm90_supported": major == 9,
        "_is_sm100_supported": major == 10,
        "_is_flashinfer_available": True,
        "is_dp_attention_enabled": lambda: False,
        "get_exec": lambda: SimpleNamespace(comm=SimpleNamespace(flashinfer_allreduce_fusion_backend="trtllm")),
        "is_flashinfer_allreduce_unavailable": lambda: False,
        "FUSE_ALLREDUCE_MAX_BATCH_SIZE": 2048,
    }
    if "_is_sm120_supported = _is_cuda and get_platform().is_sm120" in source:
        scope["_is_sm120_supported"] = major == 12
    return _function(site / LAYERS / "communicator.py", "apply_flashinfer_allreduce_fusion", scope)(8)


def test_stock_release_refuses_fusion_on_sm120(released: Path) -> None:
    with pytest.raises(ValueError, match="requires SM90 or SM10X"):
        _resolve(released, 12)
    assert not _fuses(released, 12) and _fuses(released, 9)
    assert _resolve(released, 9) == "trtllm" and _resolve(released, 10) == "mnnvl"


def test_the_recipes_patch_applies_and_lets_sm120_fuse(released: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    [applied] = _patched(released, monkeypatch)
    assert sorted(applied["files"]) == sorted(str(LAYERS / f) for f in FILES)
    assert _resolve(released, 12) == "trtllm"  # single node: trtllm; mnnvl needs NVLink, which PCIe boxes lack
    with pytest.raises(ValueError, match="mnnvl"):
        _resolve(released, 12, backend="mnnvl")
    assert _fuses(released, 12)
    # what it does not change: SM90/SM100 as before, other GPUs still refused
    assert _resolve(released, 9) == "trtllm" and _resolve(released, 10) == "mnnvl" and _fuses(released, 10)
    with pytest.raises(ValueError, match="SM120"):
        _resolve(released, 8)
    assert not _fuses(released, 8)


def test_a_patch_that_no_longer_applies_stops_the_build_naming_the_hunk(
    released: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release that moved the lines: the build stops before anything is half-patched."""
    fusion = released / LAYERS / "flashinfer_comm_fusion.py"
    before = {f: (released / LAYERS / f).read_bytes() for f in FILES}
    fusion.write_text(fusion.read_text().replace("get_platform().is_sm90 or get_platform().is_sm100)", "False)"))
    with pytest.raises(envbuild.EnvBuildError, match=r"flashinfer_comm_fusion\.py.*@@"):
        _patched(released, monkeypatch)
    assert (released / LAYERS / "communicator.py").read_bytes() == before["communicator.py"]
