"""Run references, owner keys and signed manifests: what verifies, and one line for everything that does not."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import pytest

from p2ptrain.config.schema import TaskSection, TrainingSection
from p2ptrain.errors import ConfigError
from p2ptrain.run.manifest import (
    LOCAL_TRAINING,
    MAX_MANIFEST_BYTES,
    MAX_VERSION,
    RUN_WIDE_TRAINING,
    ManifestError,
    load_manifest,
    load_manifest_bytes,
    new_manifest,
    parse_manifest,
    read_manifest_file,
)
from p2ptrain.run.owner import OwnerKey, OwnerKeyError
from p2ptrain.runref import KEY_HASH_CHARS, RunRef, RunRefError

CLOCK = 1_700_000_000.0


@pytest.fixture(scope="module")
def key() -> OwnerKey:
    return OwnerKey.generate()


@pytest.fixture(scope="module")
def manifest(key):
    task = TaskSection(d_model=32, n_heads=2, options={"vocab file": "a\tb", "sizes": [1, 2.5], "deep": {"x": True}})
    return new_manifest(key, "demo-run", task, TrainingSection(lr=3e-4, mode="diloco"), clock=CLOCK)


def _one_line(error: Exception) -> str:
    text = str(error)
    assert text and "\n" not in text and "Traceback" not in text
    return text


# --- run references -------------------------------------------------------------------------------

def test_reference_binds_name_and_key_and_derives_a_valid_run_id(key):
    ref = key.ref("demo-run")
    assert str(ref) == f"demo-run@{ref.key_hash}" and len(ref.key_hash) == KEY_HASH_CHARS
    assert RunRef.parse(str(ref)) == ref
    assert ref.matches(key.public_key) and not ref.matches(OwnerKey.generate().public_key)
    assert ref.run_id == f"demo-run-{ref.key_hash}" and "." not in ref.run_id and "@" not in ref.run_id
    from p2ptrain.config.schema import SwarmSection

    assert SwarmSection(run_id=ref.run_id).run_id == ref.run_id  # the existing run_id rule accepts it
    assert OwnerKey.generate().ref("demo-run").run_id != ref.run_id  # same name, another owner: other keys


@pytest.mark.parametrize("text", [
    "demo", "demo@", "@" + "a" * 26, "demo@" + "a" * 25, "demo@" + "a" * 27, "demo@" + "A" * 26,
    "demo@" + "1" * 26, "de.mo@" + "a" * 26, "x" * 33 + "@" + "a" * 26, "demo@" + "a" * 25 + "b",
])
def test_bad_references_are_one_line(text):
    with pytest.raises(RunRefError, match="not a run reference") as caught:
        RunRef.parse(text)
    _one_line(caught.value)


# --- owner keys -----------------------------------------------------------------------------------

def test_owner_key_saved_0600_loaded_and_never_overwritten(tmp_path: Path):
    key = OwnerKey.generate()
    path = tmp_path / "owner.key"
    old = os.umask(0)
    try:
        key.save(path)
    finally:
        os.umask(old)
    assert (path.stat().st_mode & 0o777) == 0o600
    assert OwnerKey.load(path).public_key == key.public_key
    with pytest.raises(OwnerKeyError, match="already exists"):
        OwnerKey.generate().save(path)
    assert OwnerKey.load(path).public_key == key.public_key


def test_owner_key_missing_unsafe_or_garbage_is_one_line(tmp_path: Path):
    path = tmp_path / "owner.key"
    with pytest.raises(OwnerKeyError, match=r"owner key .*owner.key: no such file") as caught:
        OwnerKey.load(path)
    _one_line(caught.value)
    OwnerKey.generate().save(path)
    path.chmod(0o644)
    with pytest.raises(OwnerKeyError, match=r"mode 0644 lets other users read it; run: chmod 600") as caught:
        OwnerKey.load(path)
    _one_line(caught.value)
    garbage = tmp_path / "garbage.key"
    garbage.write_text("hello")
    garbage.chmod(0o600)
    with pytest.raises(OwnerKeyError, match="not an unencrypted PEM private key"):
        OwnerKey.load(garbage)
    with pytest.raises(OwnerKeyError, match="not a regular file"):
        OwnerKey.load(tmp_path)


# --- manifests ------------------------------------------------------------------------------------

def test_manifest_round_trips_and_verifies(manifest, key):
    text = manifest.to_toml()
    loaded = load_manifest(text, "m", manifest.ref)
    assert loaded == manifest
    assert loaded.to_toml() == text
    assert set(manifest.training) == set(RUN_WIDE_TRAINING)
    assert not set(LOCAL_TRAINING) & set(manifest.training)
    assert {"threads", "max_epochs", "validate_every", "load_state_timeout"} <= set(LOCAL_TRAINING)
    assert manifest.task["options"]["vocab file"] == "a\tb" and manifest.training["lr"] == 3e-4
    assert f'reference = "{manifest.ref}"' in text and "[signature]" in text


def test_every_single_byte_change_is_refused(manifest):
    raw = manifest.to_toml().encode()
    for position in range(len(raw)):
        for replacement in {raw[position] ^ 0x01, ord(" ")} - {raw[position]}:
            tampered = raw[:position] + bytes([replacement]) + raw[position + 1:]
            with pytest.raises(ConfigError):
                load_manifest_bytes(tampered, "m", manifest.ref)
    for extra in (raw + b"\n", raw[:-1], b"# note\n" + raw, raw.replace(b"\n", b"\r\n")):
        with pytest.raises(ManifestError):
            load_manifest_bytes(extra, "m", manifest.ref)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda raw: raw.replace(b"\n", b"\r\n"), r"^m: has Windows \(CRLF\) line endings where the signed manifest"),
    (lambda raw: raw + b"\n", r"^m: has text after the signed manifest's last line \((\d+)\)"),
    (lambda raw: raw[:-1], r"^m: ends before the signed manifest does"),
    (lambda raw: raw.replace(b"[task]\n", b"[task]\r\n"), r"^m: line (\d+) ends in a Windows \(CRLF\) line ending"),
    (lambda raw: raw.replace(b"[task]\n", b"[task] \n"), r"^m: line (\d+) differs from the signed manifest's"),
])
def test_a_manifest_that_differs_only_in_form_is_told_where(manifest, edit, message):
    raw = manifest.to_toml().encode()
    with pytest.raises(ManifestError, match=message) as caught:
        load_manifest_bytes(edit(raw), "m", manifest.ref)
    lines = raw.decode().splitlines()
    numbers = [int(n) for n in re.findall(r"(?:line|last line \() ?(\d+)", str(caught.value))]
    assert all(1 <= n <= len(lines) for n in numbers)  # a line the file has
    if "line (" in message:
        assert lines[numbers[0] - 1] == "[task]"


def test_changed_value_fails_the_signature(manifest):
    text = manifest.to_toml().replace("lr = 0.0003", "lr = 0.003")
    with pytest.raises(ManifestError, match=r"^m: signature does not verify") as caught:
        load_manifest(text, "m")
    _one_line(caught.value)


def test_another_owners_manifest_for_the_same_name_is_refused(manifest):
    other = new_manifest(OwnerKey.generate(), "demo-run", TaskSection(), TrainingSection())
    with pytest.raises(ManifestError, match=rf"is the manifest of run demo-run@\w+, not {manifest.ref}"):
        load_manifest(other.to_toml(), "m", manifest.ref)
    # a forger who re-signs with its own key but keeps the victim's public key cannot verify
    forged = dataclasses.replace(other, owner_key=manifest.owner_key)
    with pytest.raises(ManifestError, match="signature does not verify"):
        forged.verify(manifest.ref)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda t: t.replace("format = 1", "format = 2"), r"format 2 is not supported by this p2ptrain"),
    (lambda t: t.replace("format = 1", 'format = "1"'), r"format '1' is not supported"),
    (lambda t: t.replace("format = 1\n", ""), r"format: required"),
    (lambda t: _drop_line(t, "version = "), r"run\.version: required"),
    (lambda t: _drop_line(t, "seq_len = "), r"task\.seq_len: required"),
    (lambda t: _drop_line(t, "inner_steps = "), r"training\.inner_steps: required"),
    (lambda t: t.replace("[training]\n", "[training]\nthreads = 4\n"),
     r"training\.threads: a setting of each node's own config, not part of a run manifest"),
    (lambda t: t.replace("[training]\n", "[training]\nnope = 4\n"), r"training\.nope: unknown key"),
    (lambda t: t.replace("[task]\n", '[task]\ncache_dir = "/home/owner/cache"\n'),
     r"task\.cache_dir: a setting of each node's own config"),
    (lambda t: t.replace("[task]\n", '[task]\ndata_path = "/home/owner/corpus"\n'),
     r"task\.data_path: a run manifest names its data only by URL \(http\(s\)://, s3://\.\.\.\)"),
    (lambda t: t.replace("[task]\n", '[task]\nlocal_data = "yes"\n'), r"task\.local_data: must be true or false"),
    (lambda t: t.replace("[task]\n", '[task]\nlocal_data = true\ndata_path = "https://x.org/a.txt"\n'),
     r"task\.local_data: cannot be true when task\.data_path names the run's data"),
    (lambda t: t.replace("[run]\n", "[run]\nextra = 1\n"), r"run\.extra: unknown key"),
    (lambda t: t.replace('policy = "open"', 'policy = "friends"'), r"admission\.policy:"),
    (lambda t: t.replace("banned = []", 'banned = ["nope"]'), r"admission\.banned: .*not a libp2p peer ID"),
    (lambda t: t.replace("version = 1", "version = 0"), r"run\.version: .*greater than or equal to 1"),
    (lambda t: t.replace("version = 1", 'version = "1"'), r"run\.version:"),
    (lambda t: t.replace("d_model = 32", "d_model = -1"), r"task\.d_model:"),
    (lambda t: t.replace("[signature]", "[signed]"), r"run.toml: signed: unknown section"),
    (lambda t: t.split("[signature]")[0], r"\[signature\]: required section is missing"),
    (lambda t: t.split("[signature]")[0] + '[signature]\ned25519 = "!!"\n', r"signature\.ed25519: .*base64"),
    (lambda t: t.replace("[run]", "[run"), r"not valid TOML"),
    (lambda t: t + "#" * MAX_MANIFEST_BYTES, r"larger than"),
])
def test_bad_manifests_are_one_line(manifest, edit, message):
    with pytest.raises(ManifestError, match=message) as caught:
        load_manifest(edit(manifest.to_toml()), "run.toml")
    assert _one_line(caught.value).startswith("run.toml: ")


# --- one canonical form, bounded versions ------------------------------------------------------------

def test_every_table_is_written_with_its_keys_sorted_as_they_are_signed(manifest):
    text = manifest.to_toml()
    for section in ("run", "admission", "task", "training"):
        body = text.split(f"\n[{section}]\n")[1].split("\n\n")[0]
        keys = [line.split(" = ")[0].strip('"') for line in body.splitlines()]
        assert keys == sorted(keys), section
    # the config gave these as "vocab file", "sizes", "deep"
    assert '\noptions = { deep = { x = true }, sizes = [1, 2.5], "vocab file" = "a\\u0009b" }\n' in text


def test_a_copy_with_its_option_keys_reordered_is_not_the_manifest(key):
    """Anyone could otherwise mint 7! = 5040 distinct files, each verifying, from one signed manifest
    with seven option keys, and flood the run's DHT key with them."""
    options = {name: index for index, name in enumerate("abcdefg")}
    signed = new_manifest(key, "demo-run", TaskSection(options=options), TrainingSection(), clock=CLOCK)
    text = signed.to_toml()
    line = next(line for line in text.splitlines() if line.startswith("options = "))
    reordered = text.replace(line, "options = { " + ", ".join(f"{k} = {v}" for k, v in reversed(options.items()))
                             + " }")
    assert reordered != text
    assert parse_manifest(reordered, "m").verify(signed.ref) == signed  # the same signed meaning...
    with pytest.raises(ManifestError, match=r"^m: line \d+ differs from the signed manifest's canonical form"):
        load_manifest(reordered, "m", signed.ref)  # ...is one file only


def test_a_file_in_an_older_key_order_says_how_its_owner_rewrites_it(manifest):
    lines = manifest.to_toml().split("\n")
    first = lines.index("[training]") + 1
    lines[first], lines[first + 1] = lines[first + 1], lines[first]
    older = "\n".join(lines)
    with pytest.raises(ManifestError, match=r"^m: has its keys in another order .* p2ptrain run update FILE\)"):
        load_manifest(older, "m")
    assert load_manifest(older, "m", manifest.ref, any_form=True) == manifest  # what run update reads


def test_versions_are_bounded(manifest, key):
    assert load_manifest(dataclasses.replace(manifest, version=MAX_VERSION).signed(key).to_toml()).version \
        == MAX_VERSION
    with pytest.raises(ManifestError, match=rf"version {MAX_VERSION + 1} is outside 1\.\.{MAX_VERSION}"):
        dataclasses.replace(manifest, version=MAX_VERSION + 1).signed(key)
    for version in (MAX_VERSION + 1, 2**63 - 1):
        with pytest.raises(ManifestError, match=r"^m: run\.version: .*less than or equal to 1000000000"):
            parse_manifest(manifest.to_toml().replace("\nversion = 1\n", f"\nversion = {version}\n"), "m")


def test_reference_field_must_match_the_key(manifest):
    text = manifest.to_toml().replace(str(manifest.ref), "demo-run@" + "a" * 26)
    with pytest.raises(ManifestError, match=r"run\.reference .* is not the reference of its owner_key"):
        parse_manifest(text, "m")


def test_manifest_files_missing_directory_binary(tmp_path: Path, manifest):
    with pytest.raises(ManifestError, match=r"manifest .*nope.toml: no such file"):
        read_manifest_file(tmp_path / "nope.toml")
    with pytest.raises(ManifestError, match="is a directory"):
        read_manifest_file(tmp_path)
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe" * 10)
    with pytest.raises(ManifestError, match="not UTF-8 text"):
        read_manifest_file(binary)
    good = tmp_path / "good.toml"
    good.write_text(manifest.to_toml())
    assert read_manifest_file(good, manifest.ref) == manifest


def test_signing_with_a_foreign_key_is_refused(manifest):
    with pytest.raises(ManifestError, match="is not the key of run"):
        manifest.signed(OwnerKey.generate())


def _drop_line(text: str, prefix: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.startswith(prefix)) + "\n"


def test_list_order_is_not_meaning_and_unwritable_values_are_refused(manifest, key):
    a, b = "QmbLahVjuKupK4oJShzCEvicsdGHdfLebY8XPENns15iQ3", "QmXyX6Ps4qyR2awJLJ5nwzg5n7Vdjk1CHidb8p2GbthpvF"
    unsorted = dataclasses.replace(manifest, banned=(a, b, a)).signed(key)
    assert load_manifest(unsorted.to_toml(), "m").banned == (b, a)
    huge = dataclasses.replace(manifest, task={**manifest.task, "options": {"n": 2**70}})
    with pytest.raises(ManifestError, match=r"task\.options\.n: integer 1180591620717411303424 does not fit TOML"):
        huge.signed(key)


@pytest.mark.parametrize(("options", "message"), [
    ({"x": None}, r"task\.options\.x: has no value \(TOML, a manifest's form, has no null\)"),
    ({"x": [1, {"y": None}]}, r"task\.options\.x\[1\]\.y: has no value"),
    ({"x": float("nan")}, r"task\.options\.x: nan is not a finite number"),
    ({"deep": {"x": -float("inf")}}, r"task\.options\.deep\.x: -inf is not a finite number"),
    ({"x": "\ud800"}, r"task\.options\.x: text that is not valid Unicode"),
    ({1: "one"}, r"task\.options\.1: a key that is not text"),
    ({"x": {1, 2}}, r"task\.options\.x: a set, which has no TOML form"),
])
def test_a_value_toml_cannot_write_back_is_refused_before_signing_by_name(manifest, key, options, message):
    """Signing it would give a manifest whose file can never verify (the signed JSON keeps what its
    TOML file loses)."""
    bad = dataclasses.replace(manifest, task={**manifest.task, "options": options})
    with pytest.raises(ManifestError, match=rf"^run demo-run@\w+: {message}") as caught:
        bad.signed(key)
    _one_line(caught.value)


def test_a_value_the_file_s_reader_refuses_or_changes_is_refused_by_name(manifest, key, monkeypatch):
    """Whatever slips past the value checks is caught by reading the file back before it is signed:
    a float where an integer belongs (refused by the reader), or a value the reader would change."""
    coerced = dataclasses.replace(manifest, task={**manifest.task, "seq_len": 32.0})
    with pytest.raises(ManifestError, match=r"task\.seq_len: .*\(in the manifest about to be signed\)"):
        coerced.signed(key)

    import p2ptrain.run.manifest as module

    reader = module.parse_manifest
    monkeypatch.setattr(module, "parse_manifest", lambda text, origin: dataclasses.replace(
        reader(text, origin), training={**manifest.training, "lr": 1.0}))
    with pytest.raises(ManifestError, match=r"^run demo-run@\w+: training\.lr: would not read back from the "
                                            r"manifest file as signed$"):
        manifest.signed(key)


@pytest.mark.parametrize("options", [{"x": float("nan")}, {"x": [1.0, float("inf")]}, {"x": {"y": -float("inf")}}])
def test_a_config_with_a_non_finite_number_makes_no_manifest(key, options):
    """JSON conversion would quietly turn nan and inf into nothing: refused first, by name."""
    with pytest.raises(ManifestError, match=r"^task\.options\.x.*: -?(nan|inf) is not a finite number"):
        new_manifest(key, "demo-run", TaskSection(options=options), TrainingSection())


def test_the_outer_compression_is_run_wide_and_written_only_when_a_run_uses_it(key, manifest):
    from p2ptrain.config.schema import parse_config
    from p2ptrain.run.runconfig import merge_manifest

    assert {"outer_compression", "outer_topk_density", "outer_value_bits"} <= set(RUN_WIDE_TRAINING)
    plain = manifest.to_toml()
    assert "outer_compression" not in plain and "outer_value_bits" not in plain  # as an older p2ptrain signed it
    assert load_manifest(plain).training["outer_compression"] == "none"
    sparse = new_manifest(key, "sparse-run", TaskSection(d_model=32, n_heads=2),
                          TrainingSection(mode="diloco", outer_compression="topk", outer_value_bits=4), clock=CLOCK)
    text = sparse.to_toml()
    assert 'outer_compression = "topk"' in text and "outer_value_bits = 4" in text
    assert "outer_topk_density" not in text  # at its default
    volunteer = merge_manifest(parse_config({}, "node.toml"), load_manifest(text))
    assert (volunteer.training.outer_compression, volunteer.training.outer_value_bits) == ("topk", 4)
    with pytest.raises(ConfigError, match=r"^training\.outer_compression: .* says 'int8' but .* says 'topk'"):
        merge_manifest(parse_config({"training": {"outer_compression": "int8"}}, "node.toml"), load_manifest(text))
