"""``p2ptrain doctor``: each fault a volunteer makes is one FAIL line with the thing to do, all faked."""

from __future__ import annotations

import argparse
import errno
import json
import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from p2ptrain.cli import doctor
from p2ptrain.cli.doctor import ClockReading, Machine
from p2ptrain.cli.main import build_parser, main
from p2ptrain.swarm.dialback import Dialback
from p2ptrain.swarm.probe import MAX_CLOCK_OFFSET, PeerAnswer, SwarmProbe

PEER = "/ip4/127.0.0.1/tcp/41999/p2p/QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"
NOW = 1_790_000_000.0  # 2026-09


class FakeClock:
    """Wall and monotonic clocks that advance ``step`` seconds per reading; ``wall_rate`` 0: a stopped clock."""

    def __init__(self, wall: float = NOW, step: float = 0.5, wall_rate: float = 1.0) -> None:
        self.wall_at, self.mono_at, self.step, self.wall_rate = wall, 100.0, step, wall_rate

    def wall(self) -> float:
        self.wall_at += self.step * self.wall_rate
        return self.wall_at

    def monotonic(self) -> float:
        self.mono_at += self.step
        return self.mono_at


def statvfs_with(free_bytes: int):
    def statvfs(path: str) -> os.statvfs_result:
        # (bsize, frsize, blocks, bfree, bavail, files, ffree, favail, flag, namemax)
        return os.statvfs_result((4096, 4096, 10**9, free_bytes // 4096, free_bytes // 4096, 0, 0, 0, 0, 255))
    return statvfs


def probe_answering(offset: float | None = 0.01, dialled_back: bool | None = True):
    def probe(peers: Sequence[str], listen: Sequence[str], timeout: float) -> SwarmProbe:
        return SwarmProbe(tuple(PeerAnswer(peer, offset, 0.002, dialled_back if offset is not None else None,
                                           "" if offset is not None else "TimeoutError") for peer in peers))
    return probe


def healthy(**changes: object) -> Machine:
    clock = FakeClock()
    machine = Machine(wall=clock.wall, monotonic=clock.monotonic, statvfs=statvfs_with(50 * doctor.GIB),
                      bind=lambda host, port: None, probe=probe_answering(),
                      device=lambda wanted, precision: ("cpu", precision, ""),
                      versions={"torch": "2.13.0+cpu", "hivemind": "1.1.12"}.get,
                      node_running=lambda state_dir: False, gpu=lambda: False, cuda_build=lambda: False)
    for name, value in changes.items():
        setattr(machine, name, value)
    return machine


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "node.toml"
    path.write_text(f'[node]\nstate_dir = "{tmp_path / "state"}"\n')
    return path


def run(config: Path | None, machine: Machine, *flags: str) -> int:
    args = build_parser().parse_args(["doctor", *(["-c", str(config)] if config else []), *flags])
    return doctor.doctor_command(args, machine)


def checks_of(config: Path | None, machine: Machine, peers: Sequence[str] = (PEER,)) -> dict[str, doctor.Check]:
    return {check.name: check for check in doctor.run_checks(config, peers, machine, {}, 5.0)}


def test_a_healthy_machine_is_all_ok(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = run(config, healthy(), "--join", PEER)
    out = capsys.readouterr().out
    assert code == 0, out
    lines = out.splitlines()
    assert [line.split()[1] for line in lines[:-1]] == ["versions", "device", "clock", "port", "disk", "config"]
    assert all(line.startswith("ok") for line in lines[:-1]), out
    assert lines[-1] == "no problems found"


def test_the_four_faults_each_fail_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A stopped clock, a closed port, a full disk and a bad config: four FAIL lines, exit 1."""
    bad = tmp_path / "node.toml"
    bad.write_text(f'[node]\nstate_dir = "{tmp_path / "state"}"\n[training]\nlr = -1\n')
    clock = FakeClock(wall_rate=0.0)
    machine = healthy(wall=clock.wall, monotonic=clock.monotonic, statvfs=statvfs_with(100 * 1024**2),
                      probe=probe_answering(offset=0.0, dialled_back=False))
    code = run(bad, machine, "--join", PEER)
    lines = capsys.readouterr().out.splitlines()
    failed = {line.split()[1]: line for line in lines if line.startswith("FAIL")}
    assert set(failed) == {"clock", "port", "disk", "config"}, lines
    assert "stopped" in failed["clock"] and "timedatectl set-ntp true" in failed["clock"]
    assert "could not dial back" in failed["port"] and "forward TCP 41400" in failed["port"]
    assert "0.1 GiB free" in failed["disk"] and "node.state_dir" in failed["disk"]
    assert "training.lr" in failed["config"]
    assert lines[-1] == "4 problem(s)"
    assert code == 1


def test_the_port_check_goes_by_a_new_connection_from_a_peer(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The ping's dial-back reuses the probe's own connection (a NAT lets it through): when a peer was
    asked to open a new one, its answer decides."""
    def answered_with(dialback: Dialback):
        def probe(peers: Sequence[str], listen: Sequence[str], timeout: float) -> SwarmProbe:
            return SwarmProbe(tuple(PeerAnswer(peer, 0.01, 0.002, True) for peer in peers), dialback=dialback)
        return probe

    assert run(config, healthy(probe=answered_with(Dialback(False, "198.51.100.7", "QmPeer"))), "--join", PEER) == 1
    port = next(line for line in capsys.readouterr().out.splitlines() if line.split()[1:2] == ["port"])
    assert port.startswith("FAIL") and "could not connect to it at 198.51.100.7" in port, port
    assert "forward TCP 41400" in port and "averages as a client" in port
    assert run(config, healthy(probe=answered_with(Dialback(True, "198.51.100.7:41400", "QmPeer"))),
               "--join", PEER) == 0
    port = next(line for line in capsys.readouterr().out.splitlines() if line.split()[1:2] == ["port"])
    assert port.startswith("ok") and "connected to it at 198.51.100.7:41400" in port, port


def test_json_has_every_check_and_the_verdict(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = run(config, healthy(statvfs=statvfs_with(0)), "--json", "--join", PEER)
    payload = json.loads(capsys.readouterr().out)
    assert payload["ok"] is False and code == 1
    disk = next(check for check in payload["checks"] if check["name"] == "disk")
    assert disk["status"] == "problem" and disk["fix"]
    assert {check["name"] for check in payload["checks"]} == {"versions", "device", "clock", "port", "disk", "config"}


def test_clock_offset_against_peers_beyond_the_dht_limit_fails(config: Path) -> None:
    late = checks_of(config, healthy(probe=probe_answering(offset=-(MAX_CLOCK_OFFSET + 2))))["clock"]
    assert late.status == "problem" and "-5.00s" in late.found and "not yet valid" in late.found
    close = checks_of(config, healthy(probe=probe_answering(offset=MAX_CLOCK_OFFSET - 1)))["clock"]
    assert close.status == "ok" and "+2.00s against 1 peer(s)" in close.found


def test_a_clock_that_was_never_set_fails_without_peers(config: Path) -> None:
    clock = FakeClock(wall=86_400.0)  # 1970-01-02, a dead RTC battery
    check = checks_of(config, healthy(wall=clock.wall, monotonic=clock.monotonic), peers=())["clock"]
    assert check.status == "problem" and "1970-01-02" in check.found


def test_without_peers_clock_and_dial_back_are_not_measured(config: Path) -> None:
    checks = checks_of(config, healthy(probe=None), peers=())
    assert checks["clock"].status == "skip" and "--join" in checks["clock"].found
    assert checks["port"].status == "ok" and "not checked from the swarm" in checks["port"].found


def test_a_port_another_program_holds_fails(config: Path) -> None:
    def taken(host: str, port: int) -> None:
        raise OSError(errno.EADDRINUSE, "Address already in use")

    check = checks_of(config, healthy(bind=taken), peers=())["port"]
    assert check.status == "problem" and "taken by another program" in check.found


def test_a_port_in_use_by_the_running_node_is_fine_and_not_dialled(config: Path) -> None:
    seen: list[Sequence[str]] = []

    def probe(peers: Sequence[str], listen: Sequence[str], timeout: float) -> SwarmProbe:
        seen.append(listen)
        return probe_answering()(peers, listen, timeout)

    checks = checks_of(config, healthy(node_running=lambda state_dir: True, probe=probe))
    assert seen == [["/ip4/0.0.0.0/tcp/0"]]  # the node's port is its own: the probe takes another
    assert checks["port"].status == "ok" and "running node" in checks["port"].found
    assert checks["clock"].status == "ok"


def test_no_peer_answering_fails_the_port_with_the_reason(config: Path) -> None:
    check = checks_of(config, healthy(probe=probe_answering(offset=None)))["port"]
    assert check.status == "problem" and "TimeoutError" in check.found


def test_wrong_versions_and_device_say_what_to_install(config: Path) -> None:
    checks = checks_of(config, healthy(versions={"torch": "2.13.0", "hivemind": "1.1.9"}.get,
                                       device=lambda wanted, precision: ("cuda", precision, "no CUDA device")),
                       peers=())
    assert checks["versions"].status == "problem" and checks["versions"].fix == "pip install hivemind==1.1.12"
    assert checks["device"].status == "problem" and "download.pytorch.org/whl/cu" in checks["device"].fix


def test_device_settings_are_read_when_the_config_has_them() -> None:
    class Training:
        device, precision = "cuda:1", "bf16"

    class Config:
        training = Training()

    assert doctor.training_device(Config()) == ("cuda:1", "bf16")
    assert doctor.training_device(object()) == ("auto", "fp32")


def test_torch_device_on_this_cpu_machine() -> None:
    assert doctor.torch_device("cpu", "fp16")[2].startswith("training.precision = 'fp16' needs a CUDA device")
    if not doctor.torch_device("auto", "fp32")[0].startswith("cuda"):
        assert "no CUDA device" in doctor.torch_device("cuda", "fp32")[2]


def test_every_config_problem_is_listed(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text(f'[node]\nstate_dir = "{tmp_path}"\n[training]\nlr = -1\nbogus = 1\n[task]\ndata_path = "/nope"\n')
    check, loaded = doctor.check_config(path, {})
    assert loaded is None and check.status == "problem"
    lines = check.found.splitlines()
    assert len(lines) == 2 and "training.lr" in lines[0] and "training.bogus: unknown key" in lines[1]


def test_clock_check_alone() -> None:
    start, end = ClockReading(NOW, 10.0), ClockReading(NOW + 1.0, 11.0)
    assert doctor.check_clock(start, end, None).status == "skip"
    jumped = doctor.check_clock(start, ClockReading(NOW + 3600, 11.0), None)
    assert jumped.status == "problem" and "jumping" in jumped.found


def test_version_lists_torch_hivemind_and_the_device(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    out = capsys.readouterr().out.splitlines()
    assert exited.value.code == 0
    assert out[0].startswith("p2ptrain ") and out[1].startswith("torch ") and out[2] == "hivemind 1.1.12"
    assert out[3].startswith("device ")


def test_top_without_textual_names_the_extra(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "textual" else real(name, *a))
    assert main(["top"]) == 69
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'p2ptrain[tui]'" in err


def test_doctor_parser_takes_its_flags() -> None:
    args = build_parser().parse_args(["doctor", "--join", PEER, "--json", "--timeout", "3s"])
    assert isinstance(args, argparse.Namespace) and args.join == [PEER] and args.json and args.timeout == 3.0


def test_a_gpu_torch_cannot_use_and_a_cuda_build_without_a_gpu_are_warnings(config: Path) -> None:
    idle_gpu = checks_of(config, healthy(gpu=lambda: True), peers=())["device"]
    assert idle_gpu.status == "warn" and "NVIDIA GPU that torch cannot use" in idle_gpu.found
    heavy = checks_of(config, healthy(cuda_build=lambda: True), peers=())["device"]
    assert heavy.status == "warn" and "whl/cpu" in heavy.fix
    assert checks_of(config, healthy(), peers=())["device"].status == "ok"
