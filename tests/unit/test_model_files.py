"""A model file is data: hostile ``config.json`` files against ``p2ptrain sample`` and ``eval``.

An export's task code runs only when the user trusts it (``--trust-task-code``, or it is the entrypoint
of the node config given with ``-c``), and the parameter count a built-in config implies is bounded
before anything is allocated (``--max-params``): one line, exit 65.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from p2ptrain.cli import main as cli
from p2ptrain.config.schema import TaskSection
from p2ptrain.model.export import CONFIG_FILE, EXPORT_FORMAT
from p2ptrain.model.limits import DEFAULT_MAX_PARAMS, ModelRefused, check_model_config
from p2ptrain.tasks.bytelm import ByteLM, parameter_count

torch.set_num_threads(1)

#: What ``p2ptrain sample`` may take at most here, refusing a 12 TiB model (importing torch: ~300 MB).
RSS_LIMIT = 1024 * 2**20
#: The address space a refused command is given: an attempt to build the model fails inside it at once
#: instead of eating the machine's memory.
ADDRESS_SPACE = 6 * 2**30


def _export(directory: Path, task: dict[str, object]) -> Path:
    """An export directory whose config.json asks for ``task`` (no weights: nothing should get that far)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / CONFIG_FILE).write_text(json.dumps({
        "format": EXPORT_FORMAT, "fingerprint": "0123456789abcdef", "task": task,
        "training": {"batch_size": 4, "seed": 0}, "run": {"run_ref": "hostile"}}))
    return directory


def _main(*argv: object) -> int:
    return cli.main([str(arg) for arg in argv])


@pytest.mark.parametrize("command", ["sample", "eval"])
def test_an_exports_task_code_is_not_run_without_the_users_word(tmp_path: Path, capsys, command: str) -> None:
    model = _export(tmp_path / "m", {"entrypoint": "builtins:print"})
    other = tmp_path / "node.toml"
    other.write_text(f'[node]\nstate_dir = "{tmp_path}"\n[task]\nentrypoint = "user_task:build"\n')
    for extra in ((), ("-c", other)):  # a node config naming other task code trusts nothing here
        assert _main(command, model, *extra) == 65
        captured = capsys.readouterr()
        assert captured.out == ""  # print was never called with the task's context
        assert captured.err.splitlines() == [
            f"p2ptrain {command}: {model / CONFIG_FILE} names task code 'builtins:print' (task.entrypoint); a "
            "model file is data, so its code is not run: pass --trust-task-code if you trust it"]
    # Trusted, it runs (and is then refused for what it returned, as any broken task is).
    own = tmp_path / "own.toml"
    own.write_text(f'[node]\nstate_dir = "{tmp_path}"\n[task]\nentrypoint = "builtins:print"\n')
    for trust in (("--trust-task-code",), ("-c", own)):
        assert _main(command, model, *trust) == 78
        captured = capsys.readouterr()
        assert captured.out.startswith("TaskContext(") and "returned NoneType" in captured.err


def _measured(*command: object) -> tuple[int, str, int]:
    """(exit code, stderr, peak RSS in bytes) of ``p2ptrain COMMAND...`` run within ``ADDRESS_SPACE``."""
    wrapper = ("import resource, subprocess, sys\n"
               "resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]), int(sys.argv[1])))\n"
               "done = subprocess.run(sys.argv[2:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)\n"
               "sys.stdout.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024))\n"
               "sys.stderr.write(done.stderr)\n"
               "sys.exit(done.returncode)\n")
    done = subprocess.run([sys.executable, "-c", wrapper, str(ADDRESS_SPACE), sys.executable, "-m", "p2ptrain.cli",
                           *map(str, command)], capture_output=True, text=True, timeout=120)
    return done.returncode, done.stderr, int(done.stdout or 0)


@pytest.mark.parametrize("command", ["sample", "eval"])
def test_a_huge_config_is_refused_before_anything_is_allocated(tmp_path: Path, command: str) -> None:
    """d_model 16384 x 1024 layers: about 3.3 million million parameters, 12 TiB of float32."""
    model = _export(tmp_path / "huge", {"d_model": 16_384, "n_layers": 1_024, "n_heads": 16})
    code, err, rss = _measured(command, model)
    assert (code, err.splitlines()) == (65, [
        f"p2ptrain {command}: {model / CONFIG_FILE} asks for a model of 3,298,759,311,360 parameters (12.0 TiB of "
        f"float32), over --max-params {DEFAULT_MAX_PARAMS:,}; nothing was built"]), err
    assert rss < RSS_LIMIT, f"peak RSS {rss / 2**20:.0f} MiB"


def test_max_params_is_the_users_bound(tmp_path: Path, capsys) -> None:
    small = {"d_model": 32, "n_layers": 1, "n_heads": 2, "seq_len": 16}
    count = parameter_count(16, 32, 1)
    model = _export(tmp_path / "small", small)
    assert _main("sample", model, "--max-params", count - 1) == 65
    assert f"asks for a model of {count:,} parameters" in capsys.readouterr().err
    # Within the bound the model is built (and this one then refused for its made-up fingerprint).
    assert _main("sample", model, "--max-params", f"{count:_}") == 1
    assert "holds model 0123456789abcdef but its settings build" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        _main("sample", model, "--max-params", "lots")
    assert exit_info.value.code == 2 and "--max-params: not a whole number: 'lots'" in capsys.readouterr().err


@pytest.mark.parametrize("shape", [(16, 8, 1, 2), (32, 32, 2, 4), (128, 128, 2, 4), (7, 24, 3, 3)])
def test_the_parameter_count_is_computed_exactly_without_building(shape: tuple[int, int, int, int]) -> None:
    built = sum(p.numel() for p in ByteLM(*shape).parameters())
    assert parameter_count(shape[0], shape[1], shape[2]) == built


def test_a_nodes_own_config_is_trusted_and_bounded_too() -> None:
    user = TaskSection(entrypoint="user_task:build")
    check_model_config(user, "own", own_entrypoint="user_task:build")  # its own code: the user's
    with pytest.raises(ModelRefused, match="names task code"):
        check_model_config(user, "theirs", own_entrypoint="other:build")
    with pytest.raises(ModelRefused, match="over --max-params 1,000"):
        check_model_config(TaskSection(), "own", max_params=1_000)
