"""The layers: tasks -> env -> agents -> harness, each importing only layers to its left.

Checked on the static import graph (every ``import`` statement of every module, inside
functions too, relative imports resolved), not only on what one import happens to load; and
``gym.make`` is checked to load no torch, pandas, matplotlib, agents or harness.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Import package -> folder (pyproject.toml's package-dir mapping).
FOLDERS = {
    "selfcest_env.tasks": ROOT / "tasks",
    "selfcest_env.agents": ROOT / "agents",
    "selfcest_env.harness": ROOT / "harness",
    "selfcest_env": ROOT / "selfcest_env",
}

#: Layers in data-flow order; a module may import its own layer and those before it.
LAYERS = ("selfcest_env.tasks", "selfcest_env", "selfcest_env.agents", "selfcest_env.harness")

#: The foundation under every layer: token counting, text escaping and the registries' plug-in
#: tables, which every layer uses
#: and which import nothing of the project themselves.
FOUNDATION = ("selfcest_env.tokens", "selfcest_env.text", "selfcest_env.plugins")

#: The command's entry point ``python -m selfcest_env`` reaches the harness on purpose.
ENTRY_POINTS = {"selfcest_env.__main__"}


def layer_of(module: str) -> int | None:
    """The layer index of a project module (-1: the foundation), ``None`` for a third-party
    one."""
    if any(module == m or module.startswith(m + ".") for m in FOUNDATION):
        return -1
    for index in (0, 2, 3, 1):  # the most specific package first
        package = LAYERS[index]
        if module == package or module.startswith(package + "."):
            return index
    return None


def project_modules() -> dict[str, Path]:
    """Every module of the project, by import name."""
    modules: dict[str, Path] = {}
    for package, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            name = ".".join((package, *parts)).removesuffix(".__init__")
            if layer_of(name) in (layer_of(package), -1):  # skip the other packages' folders
                modules[name] = path
    return modules


def imports_of(module: str, path: Path) -> set[str]:
    """Every module ``path`` imports anywhere in its code, relative imports resolved."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def test_the_module_map_covers_every_layer() -> None:
    modules = project_modules()
    assert {layer_of(m) for m in modules} == {-1, 0, 1, 2, 3}
    assert "selfcest_env.env" in modules and "selfcest_env.harness.cli" in modules
    assert len(modules) > 60


def test_each_layer_imports_only_layers_to_its_left() -> None:
    modules = project_modules()
    wrong = []
    for module, path in sorted(modules.items()):
        if module in ENTRY_POINTS:
            continue
        own = layer_of(module)
        for target in sorted(imports_of(module, path)):
            layer = layer_of(target)
            if layer is not None and own is not None and layer > own:
                wrong.append(f"{module} (layer {own}) imports {target} (layer {layer})")
    assert not wrong, "\n".join(wrong)


def test_the_checker_sees_function_level_and_relative_imports(tmp_path: Path) -> None:
    source = tmp_path / "sample.py"
    source.write_text(
        "def f():\n    from selfcest_env.harness.cli import main\n"
        "from ..agents import registry\nimport selfcest_env.harness.store as store\n"
    )
    found = imports_of("selfcest_env.tasks.qa.sample", source)
    assert "selfcest_env.harness.cli" in found
    assert "selfcest_env.tasks.agents.registry" in found
    assert "selfcest_env.harness.store" in found


@pytest.mark.parametrize("env_id", ["SelfCest-Math-v0", "SelfCest-MultiHopQA-v0"])
def test_gym_make_loads_no_heavy_or_upper_layer(env_id: str) -> None:
    code = (
        "import sys, gymnasium as gym, selfcest_env\n"
        f"env = gym.make({env_id!r}); env.reset(seed=0)\n"
        "heavy = ('torch', 'pandas', 'matplotlib', 'transformers', 'selfcest_env.agents', "
        "'selfcest_env.harness')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy or "
        "m.startswith(heavy[-2:])))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout
