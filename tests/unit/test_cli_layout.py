"""The command line in one place (issue 28): every subcommand's code is in `specsweep.cli`, none in the library.

Cheap: imports modules and builds parsers, starts no process."""

from __future__ import annotations

import argparse
import ast
import importlib
import pkgutil
import sys
from pathlib import Path

import pytest

import specsweep
from specsweep.cli import SUBCOMMANDS

pytestmark = pytest.mark.unit

CLI_CODE = ("add_arguments", "run")


def library_modules() -> list[str]:
    """Every module of the package but the command line (specsweep.cli and its modules, specsweep.__main__)."""

    def fail(name: str) -> None:  # a package that does not import would hide its modules from the walk
        raise ImportError(f"cannot import {name}")

    names = [m.name for m in pkgutil.walk_packages(specsweep.__path__, prefix="specsweep.", onerror=fail)]
    command = ("specsweep.__main__", "specsweep.cli")
    return sorted(n for n in names if n not in command and not n.startswith("specsweep.cli."))


def test_the_walk_finds_the_library() -> None:
    """The walk below sees the subpackages' modules too, so an empty walk cannot pass it."""
    found = library_modules()
    for name in (
        "specsweep.measure.cell",
        "specsweep.sim.server",
        "specsweep.analysis.report",
        "specsweep.measure.bench",
    ):
        assert name in found


@pytest.mark.parametrize("name", library_modules())
def test_no_library_module_holds_command_line_code(name: str) -> None:
    module = importlib.import_module(name)
    defined = [f for f in CLI_CODE if f in vars(module)]
    assert not defined, (
        f"{name} defines {', '.join(defined)}: command-line code goes into a module of specsweep.cli "
        "(one per subcommand, registered in specsweep.cli.SUBCOMMANDS), which calls the library"
    )
    source = Path(str(module.__file__)).read_text()
    assert "argparse.ArgumentParser(" not in source, (
        f"{name} builds an argument parser: parse arguments in its subcommand's module in specsweep.cli"
    )
    assert 'if __name__ == "__main__"' not in source, (
        f"{name} runs standalone: make it a subcommand (`python -m specsweep <subcommand>`) in specsweep.cli"
    )


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_every_subcommand_has_its_module_and_parser(command: str) -> None:
    module_name, help_text = SUBCOMMANDS[command]
    assert module_name.startswith("specsweep.cli."), f"{command}: its module {module_name} is outside specsweep.cli"
    module = importlib.import_module(module_name)
    assert callable(getattr(module, "add_arguments", None)) and callable(getattr(module, "run", None))
    parser = argparse.ArgumentParser(prog=f"specsweep {command}", description=help_text)
    module.add_arguments(parser)
    assert parser.format_help().startswith(f"usage: specsweep {command}")


def test_every_command_module_is_registered() -> None:
    """A module in specsweep.cli that no subcommand names would be command-line code nobody can run."""
    registered = {m for m, _ in SUBCOMMANDS.values()}
    cli_dir = Path(specsweep.__file__).parent / "cli"
    modules = {f"specsweep.cli.{m.name}" for m in pkgutil.iter_modules([str(cli_dir)])}
    assert modules == registered


def test_the_command_package_imports_only_the_standard_library() -> None:
    """`tiny-model` starts from specsweep.cli under a variant's interpreter, which lacks the project's packages:
    the package itself (not a subcommand's module, imported when it runs) imports only the standard library."""
    tree = ast.parse((Path(specsweep.__file__).parent / "cli" / "__init__.py").read_text())
    roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    roots |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert roots and roots <= set(sys.stdlib_module_names), sorted(roots - set(sys.stdlib_module_names))
