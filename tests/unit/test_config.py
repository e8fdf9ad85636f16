"""Config validation: every bad input gets one line naming the file and the dotted field."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from p2ptrain.config.schema import (
    EX_CONFIG,
    ConfigError,
    NodeConfig,
    env_overrides,
    load_config,
    parse_config,
    resolve_state_dir,
)
from p2ptrain.config.template import render_template

REPO = Path(__file__).resolve().parents[2]
PEER = "/ip4/127.0.0.1/tcp/41400/p2p/QmaCkkcLtUE9J17HW41DuU4zN8dpB8zHg2k86zYgFMPxpM"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "node.toml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        ("[swarm]\nbogus = 1\n", "swarm.bogus: unknown key"),
        ("[nonsense]\nx = 1\n", "nonsense: unknown key"),
        ("[training]\nbatch_size = \"eight\"\n", "training.batch_size: Input should be a valid integer"),
        ("[training]\nbatch_size = -4\n", "training.batch_size: Input should be greater than 0 (got -4)"),
        ("[training]\ntarget_batch_size = 0\n", "training.target_batch_size: Input should be greater than 0"),
        ("[swarm]\ninitial_peers = [\"/ip4/1.2.3/tcp/1\"]\n", "swarm.initial_peers: not a valid multiaddr"),
        ("[swarm]\ninitial_peers = [\"/ip4/127.0.0.1/tcp/1\"]\n", "swarm.initial_peers: multiaddr"),
        ("[swarm]\nlisten_addrs = [\"tcp://0.0.0.0:1\"]\n", "swarm.listen_addrs: not a valid multiaddr"),
        ("[swarm]\nrun_id = \"has.dot\"\n", "swarm.run_id: must be 1-64 characters"),
        ("[task]\nd_model = 130\nn_heads = 4\n", "task: n_heads (4) must divide d_model (130)"),
        ("[task]\nentrypoint = \"not a path\"\n", "task.entrypoint: must look like 'package.module:function'"),
        ("[api]\nport = 70000\n", "api.port: Input should be less than or equal to 65535"),
        ("[swarm]\nclient_mode = \"maybe\"\n", "swarm.client_mode: Input should be a valid boolean"),
        # Non-finite floats, silent coercions, absurd sizes.
        ("[training]\nlr = inf\n", "training.lr: Input should be a finite number (got inf)"),
        ("[training]\naveraging_timeout = inf\n", "training.averaging_timeout: Input should be a finite number"),
        ("[training]\nmatchmaking_time = nan\n", "training.matchmaking_time: Input should be a finite number"),
        ("[checkpoint]\ninterval = -inf\n", "checkpoint.interval: Input should be a finite number"),
        ("[training]\nbatch_size = true\n", "training.batch_size: Input should be a valid integer (got True)"),
        ("[training]\nbatch_size = \"8\"\n", "training.batch_size: Input should be a valid integer (got '8')"),
        ("[training]\nbatch_size = 8.0\n", "training.batch_size: Input should be a valid integer (got 8.0)"),
        ("[training]\nlr = \"0.1\"\n", "training.lr: Input should be a valid number (got '0.1')"),
        ("[training]\nlr = true\n", "training.lr: Input should be a valid number (got True)"),
        ("[swarm]\nclient_mode = 1\n", "swarm.client_mode: Input should be a valid boolean (got 1)"),
        ("[swarm]\nrun_id = 7\n", "swarm.run_id: Input should be a valid string (got 7)"),
        ("[task]\nd_model = 1e8\n", "task.d_model: Input should be a valid integer (got 100000000.0)"),
        ("[task]\nd_model = 100_000_000\n", "task.d_model: Input should be less than or equal to 16384"),
        ("[task]\nseq_len = 1_000_000_000\n", "task.seq_len: Input should be less than or equal to 65536"),
        ("[training]\nthreads = 100_000_000\n", "training.threads: Input should be less than or equal to 4096"),
        ("[training]\nlr = 1e6\n", "training.lr: Input should be less than or equal to 10"),
        ("[training]\naveraging_timeout = 1e9\n", "training.averaging_timeout: Input should be less than or equal"),
        ("[training]\nseed = 18446744073709551616\n", "training.seed: Input should be less than or equal to"),
        ("[volunteer]\nmax_memory_mb = 99999999999\n", "volunteer.max_memory_mb: Input should be less than or equal"),
        # Peer checks: ban times are finite, positive and bounded; the switch is a boolean.
        ("[swarm]\nban_seconds = 0\n", "swarm.ban_seconds: Input should be greater than 0"),
        ("[swarm]\nban_seconds = -5.0\n", "swarm.ban_seconds: Input should be greater than 0 (got -5.0)"),
        ("[swarm]\nban_seconds = inf\n", "swarm.ban_seconds: Input should be a finite number (got inf)"),
        ("[swarm]\nban_seconds = 1e9\n", "swarm.ban_seconds: Input should be less than or equal to 2592000"),
        ("[swarm]\nban_seconds = \"600\"\n", "swarm.ban_seconds: Input should be a valid number (got '600')"),
        ("[swarm]\nbad_state_ban_seconds = -1.0\n",
         "swarm.bad_state_ban_seconds: Input should be greater than or equal to 0 (got -1.0)"),
        ("[swarm]\nbad_state_ban_seconds = nan\n", "swarm.bad_state_ban_seconds: Input should be a finite number"),
        ("[swarm]\nbad_state_ban_seconds = 1e12\n",
         "swarm.bad_state_ban_seconds: Input should be less than or equal to 31536000"),
        ("[swarm]\npeer_checks = \"off\"\n", "swarm.peer_checks: Input should be a valid boolean (got 'off')"),
        ("[swarm]\npeer_checks = 0\n", "swarm.peer_checks: Input should be a valid boolean (got 0)"),
        # Host syntax.
        ("[api]\nhost = \"not a host!!\"\n", "api.host: not an IP address or host name"),
        ("[api]\nhost = \"\"\n", "api.host: not an IP address or host name (e.g. 127.0.0.1, 0.0.0.0, ::1, localhost) "
                                  "(got '')"),
        ("[api]\nhost = \"300.1.1.1\"\n", "api.host: not a valid IPv4 address (got '300.1.1.1')"),
        ("[api]\nhost = \"[::1]\"\n", "api.host: write an IPv6 address without brackets (got '[::1]')"),
        ("[api]\nhost = \"-bad-.example\"\n", "api.host: not an IP address or host name"),
        # Paths that cannot work on this machine.
        ("[task]\ndata_path = \"/nonexistent/corpus\"\n", "task.data_path: /nonexistent/corpus does not exist"),
        ("[task]\ndata_path = \"/dev/null\"\n", "task.data_path: /dev/null is neither a file nor a directory"),
        ("[checkpoint]\ndir = \"/etc/passwd\"\n", "checkpoint.dir: /etc/passwd is not a directory"),
        ("[node]\nstate_dir = \"/etc/passwd/state\"\n",
         "node.state_dir: /etc/passwd/state is not a directory (its parent /etc/passwd is not a directory)"),
        ("[node]\nstate_dir = \"/tmp/a\\u0000b\"\n", "node.state_dir: a path cannot contain a NUL character"),
    ],
)
def test_bad_values_name_file_and_field(tmp_path: Path, toml: str, expected: str) -> None:
    path = _write(tmp_path, toml)
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    message = str(caught.value)
    assert message.startswith(f"{path}: ")
    assert expected in message
    assert "\n" not in message


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0", "::", "::1", "fe80::1%eth0", "localhost",
                                  "node-1.example.org", "node.example.org."])
def test_good_hosts_pass(host: str) -> None:
    assert parse_config({"api": {"host": host}}, "f.toml", {}).api.host == host


def test_paths_that_can_work_pass(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("hello")
    for data_path in (corpus, tmp_path, "https://example.org/corpus-*.txt", str(tmp_path / "*.txt")):
        config = parse_config({"task": {"data_path": str(data_path)}}, "f.toml", {})
        assert config.task.data_path is not None
    # Directories that do not exist yet are created by the node; an existing one is fine too.
    config = parse_config({"node": {"state_dir": str(tmp_path / "new" / "state")},
                           "checkpoint": {"dir": str(tmp_path)}}, "f.toml", {})
    assert config.node.state_dir == tmp_path / "new" / "state" and config.checkpoint.dir == tmp_path


def test_whole_numbers_are_fine_where_seconds_are_asked() -> None:
    config = parse_config({"training": {"averaging_timeout": 45, "lr": 1}}, "f.toml", {})
    assert config.training.averaging_timeout == 45.0 and isinstance(config.training.averaging_timeout, float)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.toml: no such file \(create one with: p2ptrain config init"):
        load_config(tmp_path / "nope.toml", environ={})


def test_unreadable_toml(tmp_path: Path) -> None:
    path = _write(tmp_path, "[swarm\nrun_id = 1\n")
    with pytest.raises(ConfigError, match=r"node\.toml: not valid TOML: "):
        load_config(path, environ={})


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_bytes(b"\xff\xfe[swarm]")
    with pytest.raises(ConfigError, match=r"node\.toml: cannot read"):
        load_config(path, environ={})


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path, environ={})


def test_several_problems_are_counted_in_one_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "[training]\nbatch_size = -1\nlr = -2\n")
    with pytest.raises(ConfigError, match=r"\(\+1 more problem\)$"):
        load_config(path, environ={})


def test_every_problem_is_kept_one_line_each(tmp_path: Path) -> None:
    path = _write(tmp_path, "[training]\nbatch_size = -1\nlr = -2\n[nope]\nx = 1\n")
    with pytest.raises(ConfigError) as raised:
        load_config(path, environ={"P2PTRAIN_NODE__LOG_LEVEL": "LOUD"})
    problems = raised.value.problems
    assert len(problems) == 4 and all("\n" not in line for line in problems)
    assert any(line.startswith(f"{path}: training.batch_size: ") for line in problems)
    assert any(line.startswith(f"{path}: training.lr: ") for line in problems)
    assert f"{path}: nope: unknown key" in problems
    assert any(line.startswith("environment variable P2PTRAIN_NODE__LOG_LEVEL: node.log_level: ") for line in problems)


def test_config_check_lists_every_problem_and_exits_78(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from p2ptrain.cli.main import main

    path = _write(tmp_path, "[training]\nbatch_size = -1\nlr = -2\n[nope]\nx = 1\n")
    assert main(["config", "check", str(path)]) == 78
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert captured.out == "" and len(lines) == 3 and all(line.startswith("p2ptrain: config error: ") for line in lines)
    assert "more problem" not in captured.err
    assert main(["config", "check", "--json", str(path)]) == 78
    captured = capsys.readouterr()
    checked = json.loads(captured.out)
    assert checked["ok"] is False and len(checked["problems"]) == 3 and checked["schema_version"] == 1
    assert captured.err == f"p2ptrain: config error: {path}: 3 problems\n"
    good = _write(tmp_path, "[training]\nlr = 0.001\n")
    assert main(["config", "check", "--json", "-c", str(good)]) == 0
    checked = json.loads(capsys.readouterr().out)
    assert checked["ok"] is True and checked["problems"] == [] and checked["run"] is None
    assert checked["run_id"] and checked["state_dir"]


def test_defaults_work_everywhere() -> None:
    config = NodeConfig()
    assert config.swarm.listen_addrs == ["/ip4/0.0.0.0/tcp/41400"]
    assert config.api.host == "127.0.0.1"
    assert config.swarm.nat_port_map and config.swarm.auto_nat  # real deployments need them


def test_env_overrides_parse_toml_literals() -> None:
    environ = {
        "P2PTRAIN_TRAINING__BATCH_SIZE": "4",
        "P2PTRAIN_SWARM__NAT_PORT_MAP": "false",
        "P2PTRAIN_SWARM__INITIAL_PEERS": f'["{PEER}"]',
        "P2PTRAIN_SWARM__RUN_ID": "plain-string",
        "UNRELATED": "x",
    }
    config = parse_config({"training": {"batch_size": 16}}, "f.toml", environ)
    assert config.training.batch_size == 4  # env wins over the file
    assert config.swarm.nat_port_map is False
    assert config.swarm.initial_peers == [PEER]
    assert config.swarm.run_id == "plain-string"


def test_env_overrides_keep_strict_types() -> None:
    config = parse_config({}, "env", {"P2PTRAIN_TRAINING__BATCH_SIZE": "8", "P2PTRAIN_TRAINING__LR": "0.5",
                                      "P2PTRAIN_TRAINING__AVERAGING_TIMEOUT": "20",
                                      "P2PTRAIN_SWARM__RUN_ID": "2024", "P2PTRAIN_API__HOST": "::1",
                                      "P2PTRAIN_NODE__STATE_DIR": "/tmp/p2ptrain-env-state"})
    assert config.training.batch_size == 8 and config.training.lr == 0.5
    assert config.training.averaging_timeout == 20.0
    assert config.swarm.run_id == "2024"  # a text field keeps the text, though it reads as a number
    assert config.api.host == "::1" and config.node.state_dir == Path("/tmp/p2ptrain-env-state")
    numeric_names = parse_config({}, "env", {"P2PTRAIN_NODE__STATE_DIR": "2024"})
    assert numeric_names.node.state_dir == Path("2024")
    assert "task.entrypoint: must look like" in _config_error({"P2PTRAIN_TASK__ENTRYPOINT": "true"})
    # A bad override is named as the environment variable that set it, not as the file.
    for name, raw, expected in (
        ("P2PTRAIN_TRAINING__BATCH_SIZE", "true", "training.batch_size: Input should be a valid integer (got True)"),
        ("P2PTRAIN_TRAINING__BATCH_SIZE", '"8"', "training.batch_size: Input should be a valid integer (got '8')"),
        ("P2PTRAIN_TRAINING__LR", "inf", "training.lr: Input should be a finite number"),
        ("P2PTRAIN_TRAINING__THREADS", "1e8", "training.threads: Input should be a valid integer"),
        ("P2PTRAIN_API__HOST", "not a host!!", "api.host: not an IP address or host name"),
        ("P2PTRAIN_CHECKPOINT__DIR", "/etc/passwd", "checkpoint.dir: /etc/passwd is not a directory"),
        ("P2PTRAIN_TASK__CACHE_DIR", "/etc/passwd", "task.cache_dir: /etc/passwd is not a directory"),
    ):
        with pytest.raises(ConfigError, match=f"^environment variable {name}: {re.escape(expected)}"):
            parse_config({}, "f.toml", {name: raw})


def _config_error(environ: dict[str, str]) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config({}, "env", environ)
    return str(caught.value)


def test_bad_env_override_names_the_variable_and_the_field() -> None:
    with pytest.raises(ConfigError, match=r"^environment variable P2PTRAIN_TRAINING__BATCH_SIZE: "
                                          r"training\.batch_size: Input should be greater than 0"):
        parse_config({"training": {"batch_size": 8}}, "f.toml", {"P2PTRAIN_TRAINING__BATCH_SIZE": "-1"})
    with pytest.raises(ConfigError, match="^environment variable P2PTRAIN_SWARM__COLOUR: swarm.colour: unknown key"):
        parse_config({}, "f.toml", {"P2PTRAIN_SWARM__COLOUR": "blue"})
    with pytest.raises(ConfigError, match="^environment variable P2PTRAIN_BOGUS__X: bogus: unknown key"):
        parse_config({}, "f.toml", {"P2PTRAIN_BOGUS__X": "1"})
    # What the file says is still the file's, whatever the environment overrides beside it.
    with pytest.raises(ConfigError, match=r"^f\.toml: training\.lr: "):
        parse_config({"training": {"lr": -1.0}}, "f.toml", {"P2PTRAIN_TRAINING__BATCH_SIZE": "4"})
    with pytest.raises(ConfigError, match="P2PTRAIN___X"):
        env_overrides({"P2PTRAIN___X": "1"})


def test_state_dir_resolution() -> None:
    assert resolve_state_dir(None, {"STATE_DIRECTORY": "/var/lib/p2ptrain:/x"}) == Path("/var/lib/p2ptrain")
    assert resolve_state_dir(None, {"XDG_STATE_HOME": "/home/u/.st"}) == Path("/home/u/.st/p2ptrain")
    assert resolve_state_dir(Path("/srv/n1"), {"STATE_DIRECTORY": "/y"}) == Path("/srv/n1")


def test_template_is_valid_and_matches_the_shipped_example(tmp_path: Path) -> None:
    text = render_template()
    path = _write(tmp_path, text)
    assert load_config(path, environ={}) == NodeConfig()
    uncommented = "\n".join(line[1:] if line.startswith("#") and " = " in line and "(unset)" not in line
                            else line for line in text.splitlines())
    assert load_config(_write(tmp_path, uncommented), environ={}) == NodeConfig()
    assert (REPO / "configs" / "node.example.toml").read_text() == text, \
        "configs/node.example.toml is stale: regenerate with p2ptrain config init configs/node.example.toml --force"
    for field in NodeConfig.model_fields["training"].annotation.model_fields:
        assert f"#{field} = " in text


def test_shipped_loopback_config_stays_on_loopback() -> None:
    config = load_config(REPO / "configs" / "local-swarm.toml", environ={})
    assert all("/ip4/127.0.0.1/" in addr for addr in config.swarm.listen_addrs)
    assert not (config.swarm.nat_port_map or config.swarm.auto_nat or config.swarm.use_relay)
    assert config.api.host == "127.0.0.1"


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "p2ptrain.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=60)


def test_cli_config_check_exits_78_with_one_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "[training]\nbatch_size = -1\n")
    result = _cli("config", "check", str(path), cwd=tmp_path)
    assert result.returncode == EX_CONFIG
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert f"{path}: training.batch_size" in result.stderr


def test_cli_run_with_bad_config_exits_78_before_starting_anything(tmp_path: Path) -> None:
    path = _write(tmp_path, "[swarm]\ninitial_peers = [\"garbage\"]\n")
    result = _cli("run", "--config", str(path), cwd=tmp_path)
    assert result.returncode == EX_CONFIG
    assert result.stderr.strip().count("\n") == 0 and "swarm.initial_peers" in result.stderr


@pytest.mark.parametrize(("toml", "field"), [
    ("[api]\nhost = \"not a host!!\"\n", "api.host"),
    ("[task]\ndata_path = \"/nonexistent/corpus\"\n", "task.data_path"),
    ("[checkpoint]\ndir = \"/etc/passwd\"\n", "checkpoint.dir"),
    ("[task]\ncache_dir = \"/etc/passwd\"\n", "task.cache_dir"),
    ("[node]\nstate_dir = \"/etc/passwd/state\"\n", "node.state_dir"),
    ("[training]\nlr = inf\n", "training.lr"),
])
def test_cli_check_and_run_refuse_with_78_naming_the_field(tmp_path: Path, toml: str, field: str) -> None:
    path = _write(tmp_path, toml)
    for args in (("config", "check", str(path)), ("config", "check", "-c", str(path)), ("run", "--config", str(path))):
        result = _cli(*args, cwd=tmp_path)
        assert result.returncode == EX_CONFIG, (args, result.stderr)
        assert result.stderr.strip().count("\n") == 0 and f"{path}: {field}: " in result.stderr, result.stderr
        assert "Traceback" not in result.stderr


def test_cli_run_rejects_a_bad_join_address(tmp_path: Path) -> None:
    result = _cli("run", "--join", "/ip4/127.0.0.1/tcp/1", cwd=tmp_path)
    assert result.returncode == EX_CONFIG
    assert "--join" in result.stderr and "/p2p/" in result.stderr


def test_cli_config_init_writes_and_refuses_to_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "new.toml"
    assert _cli("config", "init", str(path), cwd=tmp_path).returncode == 0
    assert path.read_text() == render_template()
    again = _cli("config", "init", str(path), cwd=tmp_path)
    assert again.returncode == 1 and "already exists" in again.stderr


def test_cli_version(tmp_path: Path) -> None:
    result = _cli("--version", cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.startswith("p2ptrain ")


def test_log_level_takes_any_case_like_the_command_line_flag():
    assert NodeConfig.model_validate({"node": {"log_level": "debug"}}).node.log_level == "DEBUG"
    with pytest.raises(ValueError, match="node.log_level"):
        NodeConfig.model_validate({"node": {"log_level": "loud"}})


def test_user_text_in_a_config_error_is_quoted_to_stay_one_line(tmp_path: Path) -> None:
    """A file name, a key, a path or a variable name with a newline (or an escape sequence) in it is
    shown quoted: the message stays the one line the CLI prints."""
    odd = tmp_path / "odd\nname"
    odd.mkdir()
    for make_error, expected in (
        (lambda: env_overrides({"P2PTRAIN__\n": ""}), "environment variable 'P2PTRAIN__\\n': expected"),
        (lambda: load_config(odd / "missing.toml", environ={}), f"{str(odd / 'missing.toml')!r}: no such file"),
        (lambda: parse_config({"task": {"data_path": str(odd / "corpus")}}, "f.toml", {}),
         f"f.toml: task.data_path: {str(odd / 'corpus')!r} does not exist"),
        (lambda: parse_config({"checkpoint": {"dir": "/etc/passwd/\x1b[2J"}}, "f.toml", {}),
         "f.toml: checkpoint.dir: '/etc/passwd/\\x1b[2J' is not a directory (its parent /etc/passwd is not"),
        (lambda: parse_config({"training": {"l\nr": 1}}, "f.toml", {}), "f.toml: training.'l\\nr': unknown key"),
    ):
        with pytest.raises(ConfigError) as caught:
            make_error()
        assert str(caught.value).startswith(expected) and str(caught.value).isprintable(), str(caught.value)


def test_every_path_setting_is_a_checked_directory_or_a_known_file() -> None:
    """A new directory setting gets the filesystem check by being declared a DirectoryPath; this
    keeps one from being added as a plain Path and missing it."""
    from p2ptrain.config.checks import Directory

    files = {"swarm.manifest"}  # read (and its problems named) where the run's manifest is loaded
    directories, plain = set(), set()
    for section, section_field in NodeConfig.model_fields.items():
        for key, field in section_field.annotation.model_fields.items():
            if Path in typing.get_args(field.annotation) or field.annotation is Path:
                marked = any(isinstance(mark, Directory) for mark in field.metadata)
                (directories if marked else plain).add(f"{section}.{key}")
    assert directories == {"node.state_dir", "checkpoint.dir", "task.cache_dir"}
    assert plain == files


def test_cli_config_check_takes_the_file_either_way_and_only_once(tmp_path: Path) -> None:
    path = _write(tmp_path, "[training]\nbatch_size = 4\n")
    other = tmp_path / "other.toml"
    other.write_text("", encoding="utf-8")
    for args in ((str(path),), ("-c", str(path)), ("--config", str(path), str(path))):
        result = _cli("config", "check", *args, cwd=tmp_path)
        assert result.returncode == 0 and result.stdout.startswith(f"{path}: ok"), (args, result.stderr)
    for args in ((), ("-c", str(path), str(other))):
        result = _cli("config", "check", *args, cwd=tmp_path)
        assert result.returncode == 2 and "name one config file: PATH or -c PATH" in result.stderr, args


def test_cli_names_the_environment_variable_behind_a_bad_setting(tmp_path: Path) -> None:
    path = _write(tmp_path, "[training]\nlr = 0.001\n")
    result = subprocess.run([sys.executable, "-m", "p2ptrain.cli", "config", "check", str(path)], capture_output=True,
                            text=True, cwd=tmp_path, timeout=60, env={**os.environ, "P2PTRAIN_TRAINING__LR": "inf"})
    assert result.returncode == EX_CONFIG
    assert result.stderr == ("p2ptrain: config error: environment variable P2PTRAIN_TRAINING__LR: training.lr: "
                             "Input should be a finite number (got inf)\n")
