"""CI runs the README's commands as a newcomer copies them: `.ci/run`'s first stage runs the
two one-line set-up-and-run commands the README shows, and no others."""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CI_RUN = ROOT / ".ci" / "run"


def _readme_bash_lines() -> list[str]:
    """Every line of every ```bash block of the README."""
    blocks = re.findall(r"^```bash\n(.*?)^```", (ROOT / "README.md").read_text(), re.M | re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_ci_runs_the_readme_s_set_up_and_run_commands_as_written() -> None:
    printed = subprocess.run(
        ["bash", str(CI_RUN), "--print-readme-commands"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    # Found here another way than .ci/readme_commands.py finds them: the README's lines that
    # install the package from the clone and then run something.
    set_up_and_run = [
        line
        for line in _readme_bash_lines()
        if "pip install" in line and "-e " in line and "&&" in line
    ]
    assert sorted(printed) == sorted(set_up_and_run)
    assert len(printed) == 2
    main_job, test_command = printed
    assert main_job.endswith("autockpt demo")
    assert test_command.endswith("python3 -m pytest -q")


def test_ci_s_first_stage_runs_what_it_read_in_a_new_environment() -> None:
    script = CI_RUN.read_text()
    assert "main_job=$(python3 .ci/readme_commands.py main)" in script
    assert "test_command=$(python3 .ci/readme_commands.py tests)" in script
    assert 'bash -c "$main_job"' in script
    assert 'bash -c "$test_command"' in script
    # A new virtual environment first, and every install after it goes into it.
    assert script.index("python3 -m venv") < script.index('bash -c "$main_job"')
    assert script.index('bash -c "$test_command"') < script.index("install extras")


def _readme_commands_module():
    spec = importlib.util.spec_from_file_location(
        "readme_commands", ROOT / ".ci" / "readme_commands.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_commands_refuses_a_readme_without_the_block() -> None:
    readme_commands = _readme_commands_module()
    text = "Run the tests:\n\n```bash\npython3 -m pytest -q\n```\n"
    assert readme_commands.readme_command("tests", text) == "python3 -m pytest -q"
    with pytest.raises(ValueError, match="Set up and run the main job"):
        readme_commands.readme_command("main", text)
    with pytest.raises(ValueError, match="one command line"):
        readme_commands.readme_command("tests", "Run the tests:\n\n```bash\na\nb\n```\n")
