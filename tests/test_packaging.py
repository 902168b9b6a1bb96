"""Packaging, CI script, README commands and the dependency rules (no root needed)."""
import ast
import configparser
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ebpf_cuda"
CLI = PACKAGE / "cli"  # (the only package that imports click)


def _setup_cfg() -> configparser.ConfigParser:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    return config


def _lines(value: str):
    return [line.strip() for line in value.strip().splitlines() if line.strip()]


def test_setup_cfg_declares_the_package():
    config = _setup_cfg()
    assert config["metadata"]["name"] == "ebpf-cuda"
    assert config["options"]["packages"].strip() == "find:"
    assert config["options"]["python_requires"].strip() == ">=3.8"
    assert _lines(config["options.packages.find"]["include"]) == ["ebpf_cuda", "ebpf_cuda.*"]
    assert _lines(config["options.entry_points"]["console_scripts"]) == [
        "ebpf-cuda = ebpf_cuda.__main__:run"]
    assert _lines(config["options.extras_require"]["test"]) == [
        "pytest", "hypothesis", "vermin", "nvidia-cuda-runtime-cu12", "nvidia-nccl-cu12",
        "opentelemetry-proto", "nvidia-ml-py"]
    # (nvidia-ml-py: the oracle of NVML's struct layouts; nvidia-nccl-cu12: NVIDIA's
    # libnccl.so.2 for the NCCL tests; tests only)


def test_runtime_dependencies_are_exactly_pyelftools_and_click():
    assert _lines(_setup_cfg()["options"]["install_requires"]) == ["pyelftools", "click"]


def test_pyproject_only_names_the_build_system():
    text = (ROOT / "pyproject.toml").read_text()
    tables = re.findall(r"^\[([^\]]+)\]", text, re.MULTILINE)
    assert tables == ["build-system"]
    assert 'build-backend = "setuptools.build_meta"' in text


def test_gitignore_covers_build_outputs():
    ignored = set((ROOT / ".gitignore").read_text().split())
    assert {"build/", "*.egg-info", "__pycache__/", ".pytest_cache/", "/.whl/", "/.gl/",
            "*.pyz"} <= ignored


def _readme_commands():
    return re.findall(r"```sh\n(.*?)\n```", (ROOT / "README.md").read_text(), re.DOTALL)


def test_readme_starts_with_the_run_and_test_commands():
    readme = (ROOT / "README.md").read_text()
    commands = _readme_commands()
    assert commands[:2] == [
        "python3 -m pip install -e . nvidia-cuda-runtime-cu12 && "
        "ebpf-cuda -- python3 examples/cuda_calls.py",
        "python3 -m pip install -e '.[test]' && python3 -m pytest -q tests",
    ]
    line = readme[:readme.index(commands[1])].count("\n")
    assert line < 30, "the commands belong near the top"


def test_ci_runs_the_readme_test_command():
    script = (ROOT / ".ci" / "run").read_text()
    test_command = _readme_commands()[1]
    install, run_tests = test_command.split(" && ")
    assert install in script
    assert script.rstrip().splitlines()[-1] == run_tests   # last: its status is the script's
    assert "set -euo pipefail" in script
    assert os.access(ROOT / ".ci" / "run", os.X_OK)
    subprocess.run(["bash", "-n", str(ROOT / ".ci" / "run")], check=True)


def test_example_scripts_parse():
    subprocess.run(["bash", "-n", str(ROOT / "scripts" / "gpu-check.sh")], check=True)
    ast.parse((ROOT / "examples" / "cuda_calls.py").read_text())


def test_package_is_python_3_8_compatible():
    pytest.importorskip("vermin")
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from vermin import main; sys.exit(main())",
         "-t=3.8-", "--no-tips", "--eval-annotations", "--violations", str(PACKAGE)],
        capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def _imported_top_level_names(path: Path):
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.skipif(not hasattr(sys, "stdlib_module_names"), reason="needs Python 3.10+")
def test_package_imports_only_stdlib_pyelftools_and_click_in_cli():
    allowed = set(sys.stdlib_module_names) | {"ebpf_cuda", "elftools"}
    wrong = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        extra = _imported_top_level_names(path) - allowed - (
            {"click"} if CLI in path.parents else set())
        if extra:
            wrong[str(path.relative_to(ROOT))] = sorted(extra)
    assert wrong == {}


def test_importing_the_package_never_imports_click():
    modules = sorted(
        ".".join(path.relative_to(ROOT).with_suffix("").parts).replace(".__init__", "")
        for path in PACKAGE.rglob("*.py") if CLI not in path.parents
        and path.name != "__main__.py")
    code = ("import importlib, sys\n"
            "for name in sys.argv[1:]:\n"
            "    importlib.import_module(name)\n"
            "print('click' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code, *modules], cwd=str(ROOT),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_console_script_target_exists():
    """setup.cfg's console script names a function that exists (a renamed one breaks only an
    installed command, which the rest of the suite does not run)."""
    target = re.search(r"ebpf-cuda = ([\w.]+):(\w+)", (ROOT / "setup.cfg").read_text())
    assert target is not None
    module = importlib.import_module(target.group(1))
    assert callable(getattr(module, target.group(2)))


def _zipapp_main(tmp_path: Path) -> Path:
    """The zipapp's __main__.py and the __unpack__.py it runs on a first start (strings in
    zipapp.py, which vermin would not look into), as one file: they run as one namespace."""
    from ebpf_cuda import zipapp

    path = tmp_path / "zipapp_main.py"
    path.write_text(zipapp.MAIN + "\n" + zipapp.FIRST_START_CODE)
    return path


def test_zipapp_main_is_python_3_8_compatible(tmp_path):
    pytest.importorskip("vermin")
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from vermin import main; sys.exit(main())",
         "-t=3.8-", "--no-tips", "--eval-annotations", "--violations",
         str(_zipapp_main(tmp_path))], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.skipif(not hasattr(sys, "stdlib_module_names"), reason="needs Python 3.10+")
def test_zipapp_main_imports_only_the_standard_library(tmp_path):
    path = _zipapp_main(tmp_path)
    assert _imported_top_level_names(path) - set(sys.stdlib_module_names) == {"ebpf_cuda"}
    # at module level only what Python has imported before running a zipapp's __main__
    top = {alias.name for node in ast.parse(path.read_text()).body
           if isinstance(node, ast.Import) for alias in node.names}
    assert top == {"os", "stat", "sys"}
