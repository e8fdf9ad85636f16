"""``p2ptrain run init|show|invite|update|peer-id`` through the CLI's front door; bad input is one line,
exit 78, and leaves every file as it was."""

from __future__ import annotations

import hashlib
import json
import re
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest

from p2ptrain.cli.main import build_parser, main
from p2ptrain.errors import ConfigError
from p2ptrain.run.invite import verify_invite
from p2ptrain.run.manifest import read_manifest_file
from p2ptrain.runref import RunRef

PEER = "QmXyX6Ps4qyR2awJLJ5nwzg5n7Vdjk1CHidb8p2GbthpvF"


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> Path:
    monkeypatch.chdir(tmp_path)
    assert main(["run", "init", "demo", "--fingerprint", "none"]) == 0
    capsys.readouterr()
    return tmp_path / "demo"


def _ref(run_dir: Path) -> RunRef:
    return read_manifest_file(run_dir / "manifest.toml").ref


def _fails(argv: list[str], capsys: pytest.CaptureFixture, pattern: str, code: int = 78) -> str:
    assert main(argv) == code
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert re.search(pattern, err), err
    return err


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_init_writes_a_private_key_and_a_signed_manifest(run_dir: Path, capsys):
    key, manifest = run_dir / "owner.key", run_dir / "manifest.toml"
    assert key.stat().st_mode & 0o777 == 0o600
    ref = _ref(run_dir)
    assert read_manifest_file(manifest, ref).version == 1
    assert main(["run", "init", "other", "--dir", "elsewhere/x", "--private", "--fingerprint", "none"]) == 0
    out = capsys.readouterr().out
    other = read_manifest_file(Path("elsewhere/x/manifest.toml"))
    assert other.policy == "invite" and f"created run {other.ref}" in out
    assert f"p2ptrain run --join ADDR --run {other.ref}" in out and "p2ptrain run invite" in out


def test_init_records_the_model_fingerprint(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus.txt").write_text("hello world, a tiny corpus for a tiny model.\n" * 400)
    (tmp_path / "node.toml").write_text(
        '[task]\nd_model = 16\nn_layers = 1\nn_heads = 2\nseq_len = 16\ndata_path = "corpus.txt"\n'
        "[training]\nlr = 3e-4\nthreads = 1\n")
    assert main(["run", "init", "fp", "--from-config", "node.toml"]) == 0
    manifest = read_manifest_file(tmp_path / "fp" / "manifest.toml")
    assert re.fullmatch(r"[0-9a-f]{16}", manifest.fingerprint or "")
    assert manifest.task["d_model"] == 16 and manifest.training["lr"] == 3e-4 and "threads" not in manifest.training


def test_a_task_update_records_the_new_model_s_fingerprint(tmp_path: Path, monkeypatch, capsys):
    from p2ptrain.config.schema import NodeConfig
    from p2ptrain.model.fingerprint import choose_fingerprint

    monkeypatch.chdir(tmp_path)
    (tmp_path / "node.toml").write_text('[task]\nd_model = 16\nn_layers = 1\nn_heads = 2\nseq_len = 16\n')
    assert main(["run", "init", "fp", "--from-config", "node.toml"]) == 0
    path = tmp_path / "fp" / "manifest.toml"
    before = read_manifest_file(path).fingerprint
    capsys.readouterr()
    assert main(["run", "update", str(path), "--set", "task.d_model=32"]) == 0
    after = read_manifest_file(path)
    expected = choose_fingerprint("auto", NodeConfig.model_validate({"task": after.task, "training": after.training}))
    assert before is not None and after.fingerprint == expected != before
    assert f"run.fingerprint: {before!r} -> {expected!r}  (nodes restart to apply it)" in capsys.readouterr().out
    assert main(["run", "update", str(path), "--set", "training.lr=1e-4"]) == 0  # the model stays: so does it
    assert read_manifest_file(path).fingerprint == expected


def test_init_bad_input_writes_nothing(tmp_path: Path, monkeypatch, capsys, run_dir):
    (tmp_path / "bad.toml").write_text("[training]\nlr = -1\n")
    before = _snapshot(tmp_path)
    _fails(["run", "init", "demo", "--fingerprint", "none"], capsys, r"demo/owner.key: already exists")
    _fails(["run", "init", "bad.name", "--fingerprint", "none"], capsys, r"run name 'bad.name': must be 1-32")
    _fails(["run", "init", "x", "--from-config", "bad.toml", "--fingerprint", "none"], capsys,
           r"bad.toml: training\.lr: Input should be greater than 0")
    _fails(["run", "init", "y", "--fingerprint", "12"], capsys, r"--fingerprint '12': expected 16 lowercase hex")
    assert _snapshot(tmp_path) == before and not Path("x").exists() and not Path("y").exists()


def test_a_non_finite_number_makes_no_manifest_and_overwrites_none(tmp_path: Path, capsys, run_dir):
    """A nan in task.options used to give a manifest that could never verify (JSON keeps null, TOML
    drops it); run init wrote it, run update wrote it over a good one."""
    (tmp_path / "nan.toml").write_text("[task]\noptions = {x = nan}\n")
    before = _snapshot(tmp_path)
    _fails(["run", "init", "r", "--from-config", "nan.toml", "--fingerprint", "none"], capsys,
           r"^p2ptrain: config error: task\.options\.x: nan is not a finite number; a run manifest holds finite")
    for value in ("{x=nan}", "{x=[1, {y=-inf}]}"):
        _fails(["run", "update", "demo", "--set", f"task.options={value}"], capsys,
               r"--set task\.options\.x.*: -?(nan|inf) is not a finite number")
    assert _snapshot(tmp_path) == before and not Path("r").exists()
    assert main(["run", "show", "demo"]) == 0


@pytest.mark.parametrize(("target", "message"), [
    ("afile", r"--dir afile: afile exists and is not a folder$"),
    ("afile/sub", r"--dir afile/sub: afile exists and is not a folder$"),
    ("/proc/nope/run", r"--dir /proc/nope/run: cannot create it \(No such file or directory\)$"),
])
def test_a_run_folder_that_cannot_be_made_is_one_line_before_the_model_is_built(tmp_path: Path, monkeypatch, capsys,
                                                                                target, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("not a folder")

    def build_task(*args, **kwargs):
        raise AssertionError("the model was built before the run's folder was known to work")

    monkeypatch.setattr("p2ptrain.tasks.loader.build_task", build_task)
    before = _snapshot(tmp_path)
    err = _fails(["run", "init", "demo", "--dir", target], capsys, rf"^p2ptrain: {message}", code=73)
    assert "config error" not in err
    assert _snapshot(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_a_failed_model_build_takes_back_the_run_folder_it_made(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)

    def build_task(*args, **kwargs):
        raise ConfigError("task.entrypoint: no such module")

    monkeypatch.setattr("p2ptrain.tasks.loader.build_task", build_task)
    _fails(["run", "init", "demo", "--dir", "runs/demo"], capsys,
           r"task\.entrypoint: no such module \(building the model")
    assert list(tmp_path.iterdir()) == []


def test_the_owner_s_node_config_from_init_keeps_working_across_updates(tmp_path: Path, monkeypatch, capsys):
    """The owner's workflow: a node config with the run's settings, run init from it, the first node
    started with the config init wrote, an update of a setting that config had: the restarted
    node takes the new version (the source config itself would now contradict it)."""
    from p2ptrain.config.schema import load_config
    from p2ptrain.swarm.ownedrun import prepare_run

    monkeypatch.chdir(tmp_path)
    Path("node.toml").write_text(
        '[node]\nstate_dir = "state"\n[swarm]\nrun_id = "old-name"\nbootstrap_timeout = 7.0\n'
        "[task]\nd_model = 32\nn_heads = 2\nbuffer_mb = 64\n[training]\nlr = 0.002\nbatch_size = 8\nthreads = 1\n")
    assert main(["run", "init", "own", "--from-config", "node.toml", "--fingerprint", "none"]) == 0
    out = capsys.readouterr().out
    assert "p2ptrain run --config own/node.toml" in out and "--manifest" not in out
    ref = _ref(tmp_path / "own")
    written = tomllib.loads(Path("own/node.toml").read_text())
    assert written == {"swarm": {"run": str(ref), "manifest": str(tmp_path / "own" / "manifest.toml"),
                                 "bootstrap_timeout": 7.0},
                       "node": {"state_dir": "state"}, "task": {"buffer_mb": 64}, "training": {"threads": 1}}

    def started() -> Any:  # what the node decides at each start, before anything is written
        plan = prepare_run(load_config(Path("own/node.toml")), tmp_path / "state" / "identity.key")
        assert plan is not None and plan.manifest is not None
        return plan

    plan = started()
    assert (plan.manifest.version, plan.config.training.lr, plan.config.task.d_model) == (1, 0.002, 32)
    assert plan.config.task.buffer_mb == 64 and plan.config.training.threads == 1
    for setting in ("training.lr=3e-4", "training.batch_size=4"):  # applied live; applied by a restart
        assert main(["run", "update", "own", "--set", setting]) == 0
    plan = started()
    assert (plan.manifest.version, plan.config.training.lr, plan.config.training.batch_size) == (3, 3e-4, 4)
    assert main(["config", "check", "own/node.toml"]) == 0
    # The old way, the source config itself as the first node's, is refused after such an update.
    Path("old-way.toml").write_text(Path("node.toml").read_text().replace(
        'run_id = "old-name"', f'run = "{ref}"\nmanifest = "own/manifest.toml"'))
    _fails(["config", "check", "old-way.toml"], capsys,
           r"training\.batch_size: this node's config says 8 but run .* \(manifest version 3\) says 4")


def test_show_a_file_a_directory_and_its_toml(run_dir: Path, capsys):
    assert main(["run", "show", str(run_dir / "manifest.toml")]) == 0
    out = capsys.readouterr().out
    assert f"run          {_ref(run_dir)}" in out and "version      1" in out and "admission    open" in out
    assert main(["run", "show", "demo", "--toml"]) == 0
    assert capsys.readouterr().out == (run_dir / "manifest.toml").read_text()


def test_show_json_is_one_object_with_the_manifest_s_fields(run_dir: Path, capsys):
    assert main(["run", "show", "demo", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["schema_version"] == 1 and shown["run"] == str(_ref(run_dir)) and shown["version"] == 1
    assert shown["policy"] == "open" and shown["banned"] == [] and shown["run_id"] == _ref(run_dir).run_id
    assert isinstance(shown["task"], dict) and isinstance(shown["training"], dict)
    # a failure stays one line on stderr, with the same exit code, and nothing on stdout
    _fails(["run", "show", "demo@xyz", "--json"], capsys, r"not a run reference: 'demo@xyz'")
    assert capsys.readouterr().out == ""


def test_config_check_json_of_an_owned_run_s_node(run_dir: Path, capsys):
    assert main(["config", "check", "--json", str(run_dir / "node.toml")]) == 0
    checked = json.loads(capsys.readouterr().out)
    assert checked["ok"] is True and checked["problems"] == [] and checked["run"] == str(_ref(run_dir))
    assert checked["manifest"]["version"] == 1


def test_show_bad_input(run_dir: Path, capsys):
    ref = _ref(run_dir)
    _fails(["run", "show", "demo@xyz"], capsys, r"not a run reference: 'demo@xyz'; expected NAME@<26")
    _fails(["run", "show", str(ref)], capsys, rf"run {ref}: fetching its manifest from a swarm needs --join ADDR")
    _fails(["run", "show", str(ref), "--join", "/ip4/127.0.0.1/tcp/1"], capsys, r"--join: .*no /p2p/")
    _fails(["run", "show", "missing.toml"], capsys, r"manifest missing.toml: no such file")
    tampered = run_dir / "tampered.toml"
    tampered.write_text((run_dir / "manifest.toml").read_text().replace("lr = 0.001", "lr = 0.002"))
    _fails(["run", "show", str(tampered)], capsys, r"tampered.toml: signature does not verify")


def test_invite_prints_a_token_that_verifies(run_dir: Path, capsys):
    ref = _ref(run_dir)
    _fails(["run", "invite", str(ref), PEER], capsys, rf"^p2ptrain: config error: run {ref} is open to everyone "
           r"\(manifest version 1\): nobody needs an invite.*p2ptrain run update demo/manifest\.toml --private$")
    assert main(["run", "update", "demo", "--private"]) == 0
    capsys.readouterr()
    assert main(["run", "invite", str(ref), PEER, "--days", "2"]) == 0  # the key found at ./demo/owner.key
    captured = capsys.readouterr()
    token = captured.out.strip()
    invite = verify_invite(token, ref=ref, peer_id=PEER)
    assert invite.peer_id == PEER and "invite = " in captured.err
    until = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(invite.expires_at))
    assert f"valid until {until} (2 days)" in captured.err, captured.err
    assert main(["run", "invite", str(ref), PEER, "--days", "0.05"]) == 0
    assert "(1.2 hours)" in capsys.readouterr().err
    assert main(["run", "invite", "demo", PEER]) == 0


def test_invite_bad_input(run_dir: Path, tmp_path: Path, capsys):
    ref = _ref(run_dir)
    assert main(["run", "update", "demo", "--private"]) == 0
    capsys.readouterr()
    _fails(["run", "invite", "demo", "not-a-peer"], capsys, r"peer ID 'not-a-peer': not a libp2p peer ID")
    _fails(["run", "invite", "demo", PEER, "--days", "-1"], capsys, r"--days -1: an invite lasts at least one hour")
    _fails(["run", "invite", "demo", PEER, "--days", "0.000001"], capsys, r"--days 1e-06: an invite lasts at least")
    _fails(["run", "invite", str(ref), PEER, "--key", "nope.key"], capsys, r"owner key nope.key: no such file")
    assert main(["run", "init", "demo2", "--fingerprint", "none"]) == 0
    capsys.readouterr()
    _fails(["run", "invite", "demo", PEER, "--key", "demo2/owner.key"], capsys,
           rf"owner key demo2/owner.key: is not the key of run {ref}")
    (run_dir / "owner.key").chmod(0o640)
    _fails(["run", "invite", "demo", PEER], capsys, r"mode 0640 lets other users read it; run: chmod 600")
    (run_dir / "owner.key").unlink()
    _fails(["run", "invite", "demo", PEER], capsys, r"owner key demo/owner.key: no such file")


def test_update_bumps_the_version_and_re_signs(run_dir: Path, capsys):
    path = run_dir / "manifest.toml"
    assert main(["run", "update", str(path), "--set", "training.lr=3e-4", "--ban", PEER, "--private"]) == 0
    out = capsys.readouterr().out
    new = read_manifest_file(path, _ref(run_dir))
    assert new.version == 2 and new.training["lr"] == 3e-4 and new.banned == (PEER,) and new.policy == "invite"
    assert "version 1 -> 2" in out and "training.lr: 0.001 -> 0.0003  (applied live at an epoch boundary)" in out
    assert "admission.policy: 'open' -> 'invite'  (nodes restart to apply it)" in out
    assert f"admission.banned: [] -> ['{PEER}']  (applied as soon as a node has this version)" in out, out
    assert main(["run", "update", "demo", "--unban", PEER, "--revoke", PEER]) == 0
    assert read_manifest_file(path).banned == () and read_manifest_file(path).revoked == (PEER,)


OTHER = "QmbLahVjuKupK4oJShzCEvicsdGHdfLebY8XPENns15iQ3"


def test_no_invite_for_a_banned_or_revoked_peer_until_the_owner_readmits_it(run_dir: Path, capsys):
    path = run_dir / "manifest.toml"
    assert main(["run", "update", "demo", "--private", "--ban", PEER, "--revoke", OTHER]) == 0
    capsys.readouterr()
    before = path.read_bytes()
    _fails(["run", "invite", "demo", PEER], capsys, rf"^p2ptrain: config error: peer {PEER} is banned from run "
           rf"demo@\w+ \(manifest version 2\): an invite would not admit it; lift the ban first: "
           rf"p2ptrain run update demo/manifest\.toml --unban {PEER}$")
    _fails(["run", "invite", str(_ref(run_dir)), OTHER], capsys, rf"^p2ptrain: config error: peer {OTHER}'s invites "
           rf"to run demo@\w+ \(manifest version 2\) are revoked: a new one would not admit it; readmit it first: "
           rf"p2ptrain run update demo/manifest\.toml --unrevoke {OTHER}$")
    assert capsys.readouterr().out == "" and path.read_bytes() == before

    _fails(["run", "update", "demo", "--revoke", PEER, "--unrevoke", PEER], capsys,
           rf"--revoke and --unrevoke of the same peer \({PEER}\): give one of them")
    _fails(["run", "update", "demo", "--unrevoke", "x y"], capsys, r"--unrevoke 'x y': not a libp2p peer ID")
    assert path.read_bytes() == before
    assert main(["run", "update", "demo", "--unrevoke", OTHER, "--unban", PEER]) == 0
    out = capsys.readouterr().out
    manifest = read_manifest_file(path)
    assert (manifest.version, manifest.revoked, manifest.banned) == (3, (), ())
    assert f"admission.revoked: ['{OTHER}'] -> []" in out, out
    for peer in (PEER, OTHER):
        assert main(["run", "invite", "demo", peer]) == 0
        assert verify_invite(capsys.readouterr().out.strip(), ref=manifest.ref, peer_id=peer).peer_id == peer
    _fails(["run", "update", "demo", "--unrevoke", OTHER], capsys, r"nothing changes")


def test_update_rewrites_a_manifest_written_in_an_older_key_order(run_dir: Path, capsys):
    path = run_dir / "manifest.toml"
    lines = path.read_text().split("\n")
    first = lines.index("[training]") + 1
    lines[first], lines[first + 1] = lines[first + 1], lines[first]
    path.write_text("\n".join(lines))
    _fails(["run", "show", str(path)], capsys, r"has its keys in another order .* p2ptrain run update FILE")
    assert main(["run", "update", str(path)]) == 0  # nothing else changes: the owner signs it anew
    assert "(in the canonical form: keys sorted)" in capsys.readouterr().out
    manifest = read_manifest_file(path)
    assert manifest.version == 2 and path.read_text() == manifest.to_toml()


def test_update_bad_input_leaves_the_manifest_alone(run_dir: Path, capsys):
    path = run_dir / "manifest.toml"
    original = path.read_bytes()
    _fails(["run", "update", str(path)], capsys, r"nothing changes")
    _fails(["run", "update", str(path), "--set", "training.threads=2"], capsys, r"training\.threads: a local setting")
    _fails(["run", "update", str(path), "--ban", "x y"], capsys, r"--ban 'x y': not a libp2p peer ID")
    (run_dir / "owner.key").chmod(0o644)
    _fails(["run", "update", str(path), "--set", "training.lr=1e-4"], capsys, r"mode 0644")
    (run_dir / "owner.key").chmod(0o600)
    path.write_bytes(original.replace(b"version = 1", b"version = 7"))
    _fails(["run", "update", str(path), "--set", "training.lr=1e-4"], capsys, r"signature does not verify")
    assert path.read_bytes() == original.replace(b"version = 1", b"version = 7")
    path.write_bytes(original)
    assert path.read_bytes() == original and not list(run_dir.glob(".*.tmp"))


def test_node_command_still_parses_and_takes_the_one_line_join_flags():
    args = build_parser().parse_args(["run", "--config", "node.toml", "--join", "/ip4/1.2.3.4/tcp/1/p2p/QmX"])
    assert args.config == Path("node.toml") and args.join == ["/ip4/1.2.3.4/tcp/1/p2p/QmX"]
    assert args.run_ref is None and args.manifest is None
    args = build_parser().parse_args(["run", "--run", "demo@" + "a" * 26, "--manifest", "run.toml"])
    assert args.run_ref == "demo@" + "a" * 26 and args.manifest == Path("run.toml")
    assert args.command == "run" and callable(args.handler)


def test_peer_id_creates_the_identity_once(tmp_path: Path, capsys):
    config = tmp_path / "node.toml"
    config.write_text(f'[node]\nstate_dir = "{tmp_path / "state"}"\n')
    assert main(["run", "peer-id", "--config", str(config)]) == 0
    first = capsys.readouterr().out.strip()
    assert re.fullmatch(r"Qm[1-9A-HJ-NP-Za-km-z]{44}", first)
    assert main(["run", "peer-id", "--config", str(config)]) == 0
    assert capsys.readouterr().out.strip() == first
    bad = tmp_path / "bad.toml"
    bad.write_text(f'[node]\nstate_dir = "{tmp_path / "state2"}"\n[swarm]\nrun = "nope"\n')
    _fails(["run", "peer-id", "--config", str(bad)], capsys, r"swarm\.run: not a run reference")
    assert not (tmp_path / "state2").exists()


def test_config_check_shows_the_manifest_a_node_would_use(run_dir: Path, tmp_path: Path, capsys):
    ref = _ref(run_dir)
    node = tmp_path / "node.toml"
    node.write_text(f'[node]\nstate_dir = "state"\n[swarm]\nrun = "{ref}"\nmanifest = "demo/manifest.toml"\n')
    assert main(["config", "check", str(node)]) == 0
    out = capsys.readouterr().out
    assert f"node.toml: ok (run {ref}, run_id={ref.run_id}" in out
    assert f"run          {ref}  (from file demo/manifest.toml)" in out and "version      1" in out
    node.write_text(f'[swarm]\nrun = "{ref}"\n')
    assert main(["config", "check", str(node)]) == 0
    assert f"p2ptrain run show {ref} --join ADDR" in capsys.readouterr().out
    node.write_text(f'[swarm]\nrun = "{ref}"\nmanifest = "demo/manifest.toml"\n[training]\nlr = 0.5\n')
    _fails(["config", "check", str(node)], capsys,
           r"^p2ptrain: config error: training\.lr: this node's config says 0\.5 "
           rf"but run {re.escape(str(ref))} \(manifest version 1\) says 0\.001")
    assert not (tmp_path / "state").exists()


def test_an_invite_without_a_run_is_a_config_error_in_config_check(run_dir: Path, tmp_path: Path, capsys):
    """It used to say ok and start a plain run (p2ptrain-default), the invite ignored."""
    from p2ptrain.run.invite import issue_invite
    from p2ptrain.run.owner import OwnerKey

    ref = _ref(run_dir)
    invite = issue_invite(OwnerKey.load(run_dir / "owner.key"), ref, PEER, 1)
    node = tmp_path / "node.toml"
    node.write_text(f'[node]\nstate_dir = "{tmp_path / "state"}"\n[swarm]\ninvite = "{invite}"\n')
    message = r"^p2ptrain: config error: swarm\.invite: .* it needs swarm\.run .* or swarm\.manifest$"
    _fails(["config", "check", str(node)], capsys, message)
    assert not (tmp_path / "state").exists()


def test_config_check_runs_the_node_s_data_checks_on_the_merged_config(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus.txt").write_text("the owner's data\n" * 50)
    (tmp_path / "owner.toml").write_text('[task]\ndata_path = "corpus.txt"\ncache_dir = "/owner/cache"\n')
    assert main(["run", "init", "ld", "--from-config", "owner.toml", "--fingerprint", "none"]) == 0
    out = capsys.readouterr().out
    assert "every volunteer must set task.data_path to its own copy" in out
    manifest = read_manifest_file(tmp_path / "ld" / "manifest.toml")
    assert manifest.local_data and "/owner/cache" not in (tmp_path / "ld" / "manifest.toml").read_text()

    node = tmp_path / "node.toml"
    node.write_text('[node]\nstate_dir = "state"\n[swarm]\nmanifest = "ld/manifest.toml"\n')
    _fails(["config", "check", str(node)], capsys, r"^p2ptrain: config error: task\.data_path: run ld@\w+ \(manifest "
           r"version 1\) trains on data each node keeps itself .*set task\.data_path in this node's config")
    (tmp_path / "mine.txt").write_text("a volunteer's copy\n" * 50)
    node.write_text(node.read_text() + '[task]\ndata_path = "mine.txt"\ncache_dir = "cache"\n')
    assert main(["config", "check", str(node)]) == 0
    assert "data         each node's own copy" in capsys.readouterr().out
    assert not (tmp_path / "state").exists()


def _index_folder(folder: Path, tag: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(3):
        part = folder / f"part-{i}.txt"
        part.write_text(f"{tag} shard {i}\n" * 40)
        lines.append(f"{hashlib.sha256(part.read_bytes()).hexdigest()}  {part.name}")
    index = folder / "SHA256SUMS"
    index.write_text("\n".join(lines) + "\n")
    return index


def test_init_records_the_index_digest_and_a_volunteer_with_another_index_is_refused(tmp_path: Path, monkeypatch,
                                                                                      capsys):
    from p2ptrain.config.schema import parse_config
    from p2ptrain.data.text import find_shards, make_fetcher
    from p2ptrain.run.runconfig import merge_manifest

    monkeypatch.chdir(tmp_path)
    index = _index_folder(tmp_path / "owner", "the owner's")
    digest = hashlib.sha256(index.read_bytes()).hexdigest()
    (tmp_path / "owner.toml").write_text(f'[task]\ndata_path = "{index}"\n')
    assert main(["run", "init", "pinned", "--from-config", "owner.toml", "--fingerprint", "none"]) == 0
    assert f"data index sha256 {digest}" in capsys.readouterr().out
    manifest = read_manifest_file(tmp_path / "pinned" / "manifest.toml")
    assert manifest.local_data and manifest.task["data_index_sha256"] == digest

    def shards_of(copy: Path) -> int:
        merged = merge_manifest(parse_config({"task": {"data_path": str(copy)}}, "node.toml"), manifest)
        return len(find_shards(merged.task, make_fetcher(merged.task, tmp_path / "cache"))[0].shards)

    same = tmp_path / "same"
    same.mkdir()
    for path in (tmp_path / "owner").iterdir():
        (same / path.name).write_bytes(path.read_bytes())
    assert shards_of(same / "SHA256SUMS") == 3
    other = _index_folder(tmp_path / "other", "another")
    theirs = hashlib.sha256(other.read_bytes()).hexdigest()
    with pytest.raises(ConfigError, match=rf"^task\.data_index_sha256: the shard index .*other/SHA256SUMS has "
                                          rf"sha256 {theirs}, but the run was created with sha256 {digest}: this "
                                          r"is not the run's data$"):
        shards_of(other)
    with pytest.raises(ConfigError, match=rf"^task\.data_index_sha256: the run's data is a shard index with sha256 "
                                          rf"{digest}, but task\.data_path \(.*other\) is not a shard index$"):
        shards_of(tmp_path / "other")


def test_an_update_to_other_data_records_its_index_digest(tmp_path: Path, monkeypatch, capsys):
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # the owner's download cache
    index = _index_folder(tmp_path / "served", "served")
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(tmp_path / "served"))
    handler.log_message = lambda *args: None  # type: ignore[attr-defined]
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert main(["run", "init", "moving", "--fingerprint", "none"]) == 0
        manifest = tmp_path / "moving" / "manifest.toml"
        assert read_manifest_file(manifest).task["data_index_sha256"] is None
        url = f"http://127.0.0.1:{server.server_address[1]}/SHA256SUMS"
        assert main(["run", "update", str(manifest), "--set", f"task.data_path={url}"]) == 0
        assert read_manifest_file(manifest).task["data_index_sha256"] == hashlib.sha256(index.read_bytes()).hexdigest()
        assert list((tmp_path / "state" / "p2ptrain" / "data-cache").glob("index-*"))
        assert main(["run", "update", str(manifest), "--set", "task.local_data=true"]) == 0
        assert read_manifest_file(manifest).task["data_index_sha256"] is None  # the owner's copy is not known here
    finally:
        server.shutdown()
        server.server_close()
