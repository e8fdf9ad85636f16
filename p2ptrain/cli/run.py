"""``p2ptrain run init|show|invite|update|peer-id``: the run owner's commands (and the volunteer's peer ID).

The owner key stays in the run's directory (``owner.key``, mode 0600) next to ``manifest.toml``;
every command that signs finds it there unless ``--key`` says otherwise. Files are written
atomically, and nothing is written at all when an input is bad.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

from p2ptrain.atomicfile import write_atomic
from p2ptrain.config.schema import ConfigError, NodeConfig, TaskSection, load_config
from p2ptrain.config.tomlfile import read_toml
from p2ptrain.data.sources import names_an_index
from p2ptrain.errors import EX_CANTCREAT, EX_FAILURE, EX_OK
from p2ptrain.model.fingerprint import choose_fingerprint
from p2ptrain.peerid import check_peer_id
from p2ptrain.run.invite import issue_invite, parse_invite, when
from p2ptrain.run.layout import KEY_FILE, MANIFEST_FILE, NODE_FILE, manifest_path
from p2ptrain.run.manifest import Manifest, ManifestError, new_manifest, read_manifest_file, utc_now
from p2ptrain.run.owner import OwnerKey, encode_public_key
from p2ptrain.run.runconfig import apply_settings, owner_node_config
from p2ptrain.run.updates import classify
from p2ptrain.runref import RunRef, check_name
from p2ptrain.swarm.manifest_source import SourceUnavailable, open_source


def _key_beside(manifest_path: Path | None, ref: RunRef, explicit: Path | None) -> Path:
    if explicit is not None:
        return explicit
    if manifest_path is not None:
        return manifest_path.parent / KEY_FILE
    return Path(ref.name) / KEY_FILE


def _owner_key(path: Path, ref: RunRef) -> OwnerKey:
    key = OwnerKey.load(path)
    if not ref.matches(key.public_key):
        raise ConfigError(f"owner key {path}: is not the key of run {ref} (it would own {key.ref(ref.name)})")
    return key


class CannotCreate(Exception):
    """The run's folder cannot be made; the message is the one line to show."""




def _blocking_file(directory: Path) -> Path | None:
    """The first existing part of ``directory``'s path that is not a folder, if any."""
    for part in reversed((directory, *directory.parents)):
        try:
            if part.exists() and not part.is_dir():
                return part
        except OSError:  # cannot look inside: mkdir says why
            return None
    return None


def make_run_dir(directory: Path) -> list[Path]:
    """Create ``directory`` (and its missing parents); the folders created, outermost first.

    Raises :class:`CannotCreate` with one line naming the folder (a file in the way, a read-only
    place), so that a folder that cannot be made is found before the model is built.
    """
    blocking = _blocking_file(directory)
    if blocking is not None:
        raise CannotCreate(f"--dir {directory}: {blocking} exists and is not a folder")
    created = [part for part in reversed((directory, *directory.parents)) if not part.exists()]
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        remove_empty(created)
        raise CannotCreate(f"--dir {directory}: cannot create it ({exc.strerror or exc})") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        remove_empty(created)
        raise CannotCreate(f"--dir {directory}: cannot write there (permission denied)")
    return created


def remove_empty(folders: list[Path]) -> None:
    """Take back folders this command created, innermost first, as long as they are empty."""
    for folder in reversed(folders):
        try:
            folder.rmdir()
        except OSError:
            return


def init_command(args: argparse.Namespace) -> int:
    name = check_name(args.name)
    config = load_config(args.from_config) if args.from_config is not None else NodeConfig()
    directory: Path = args.dir if args.dir is not None else Path(name)
    key_path, manifest_path, node_path = directory / KEY_FILE, directory / MANIFEST_FILE, directory / NODE_FILE
    for path in (key_path, manifest_path, node_path):
        if path.exists():
            raise ConfigError(f"{path}: already exists; a run is created once (change it with p2ptrain run update)")
    if args.fingerprint not in ("auto", "none"):
        choose_fingerprint(args.fingerprint, config)  # only checks the hex: nothing is built
    task = _with_code_digest(_with_index_digest(config.task, config))
    config = config.model_copy(update={"task": task})
    key = OwnerKey.generate()
    # Refuses what cannot be signed, before the folder is made or the model built.
    manifest = new_manifest(key, name, task, config.training, policy="invite" if args.private else "open")
    try:
        created = make_run_dir(directory)
    except CannotCreate as error:
        print(f"p2ptrain: {error}", file=sys.stderr)
        return EX_CANTCREAT
    try:
        fingerprint = choose_fingerprint(args.fingerprint, config)
        if fingerprint is not None:
            manifest = dataclasses.replace(manifest, fingerprint=fingerprint).signed(key)
        key.save(key_path)
    except BaseException:
        remove_empty(created)
        raise
    write_atomic(manifest_path, manifest.to_toml().encode("utf-8"))
    ref = manifest.ref
    source = read_toml(args.from_config) if args.from_config is not None else {}
    node_config = owner_node_config(source, ref, manifest_path, str(args.from_config or "defaults"))
    write_atomic(node_path, node_config.encode("utf-8"))
    print(f"created run {ref}")
    if manifest.local_data:
        print(f"  data       task.data_path {config.task.data_path} is a path on this machine: it stays out of the "
              "manifest, and every volunteer must set task.data_path to its own copy of the data (an http(s) URL, "
              "or a SHA256SUMS index at one, would go into the manifest for all)")
    if task.data_index_sha256 is not None:
        print(f"  data index sha256 {task.data_index_sha256}: a node whose shard index differs refuses to start")
    elif manifest.local_data:
        print("  data       nothing pins the volunteers' copies: name a shard index instead (a SHA256SUMS file "
              "beside the data, as sha256sum writes it), and a node whose copy differs refuses to start")
    if task.code_sha256 is not None:
        print(f"  task code  sha256 {task.code_sha256} ({task.entrypoint}'s package): a node with other code refuses "
              "to start; after changing it, p2ptrain run update --fingerprint auto records the new one")
    print(f"  owner key  {key_path}  (keep it private and backed up: whoever holds it owns the run)")
    print(f"  manifest   {manifest_path}  (version 1, {manifest.policy} run)")
    kept = f"the local settings of {args.from_config}" if args.from_config is not None else "local settings"
    print(f"  node       {node_path}  ({kept}, the run's reference and manifest: its [task] and [training] "
          "come from the manifest only, so p2ptrain run update never contradicts it)")
    print("start the run's first node with:")
    print(f"  p2ptrain run --config {node_path}")
    print("volunteers join with one line (ADDR: the address that node logs):")
    print(f"  p2ptrain run --join ADDR --run {ref}")
    if args.private:
        print("this run is invite-only: invite each node, your own too, by its peer ID "
              f"(p2ptrain run peer-id --config {node_path} prints it), and put the token in its swarm.invite:")
        print(f"  p2ptrain run invite {manifest_path} PEER_ID --days 30")
    return EX_OK


def _with_index_digest(task: TaskSection, config: NodeConfig | None = None) -> TaskSection:
    """``task`` with the digest of the shard index its data_path names, unless it gives one (or names none).

    A URL index is downloaded into ``config``'s data cache (the environment's default without one)."""
    if task.data_index_sha256 is not None or not names_an_index(task.data_path):
        return task
    from p2ptrain.data.text import index_digest  # torch: only when there is an index to read

    cache_dir = config.state_dir() / "data-cache" if config is not None else None
    return task.model_copy(update={"data_index_sha256": index_digest(task, cache_dir)})


def _code_sha256(entrypoint: str | None) -> str | None:
    """The digest of a user task's code (its module imported here); None for a built-in task."""
    if entrypoint is None:
        return None
    from p2ptrain.tasks.loader import entrypoint_code_sha256  # torch: only for a user task

    return entrypoint_code_sha256(entrypoint)


def _with_code_digest(task: TaskSection) -> TaskSection:
    return task.model_copy(update={"code_sha256": _code_sha256(task.entrypoint)})


def _sets(assignments: list[str], field: str) -> bool:
    """Whether ``--set`` assignments give ``field`` explicitly."""
    return any(a.partition("=")[0].strip() == field for a in assignments)


def _code_changed(new: Manifest, fingerprint_choice: str | None, assignments: list[str]) -> Manifest:
    """``new`` with the digest of its task's code, taken anew whenever the fingerprint is (the owner changed
    the code or the task), and cleared for a built-in task; unless ``--set task.code_sha256=...`` gives it."""
    entrypoint = new.task.get("entrypoint")
    if _sets(assignments, "task.code_sha256") or (entrypoint is None and new.task.get("code_sha256") is None):
        return new
    if entrypoint is not None and fingerprint_choice != "auto":
        return new
    return dataclasses.replace(new, task={**new.task, "code_sha256": _code_sha256(entrypoint)})


def _data_changed(old: Manifest, new: Manifest, assignments: list[str]) -> Manifest:
    """``new`` with the digest of its data's index, when an update changed the data but did not set the digest.

    The owner's own copy of a local index is not known here: a run changed to local data then has no
    digest unless ``--set task.data_index_sha256=...`` gives it.
    """
    same_data = (new.task.get("data_path"), new.local_data) == (old.task.get("data_path"), old.local_data)
    if _sets(assignments, "task.data_index_sha256") or same_data:
        return new
    digest = None
    if new.task.get("data_path") is not None:
        task = TaskSection.model_validate({**new.task, "data_index_sha256": None})
        digest = _with_index_digest(task).data_index_sha256
    return dataclasses.replace(new, task={**new.task, "data_index_sha256": digest})


def show_lines(manifest: Manifest, origin: str) -> list[str]:
    ref = manifest.ref
    lines = [
        f"run          {ref}  (from {origin})",
        f"version      {manifest.version}  (created {manifest.created_at}, updated {manifest.updated_at})",
        f"admission    {manifest.policy}; {len(manifest.banned)} banned, {len(manifest.revoked)} revoked",
        f"fingerprint  {manifest.fingerprint or '(not recorded)'}",
        f"run_id       {ref.run_id}",
        f"owner key    {encode_public_key(manifest.owner_key)}",
        f"data         {describe_data(manifest)}",
    ]
    for section, values in (("task", manifest.task), ("training", manifest.training)):
        shown = ", ".join(f"{k}={v!r}" for k, v in values.items() if v is not None)
        lines.append(f"[{section}]{' ' * (11 - len(section))}{shown}")
    return lines


#: ``run show --json`` and ``config check --json``: bump when a field's meaning changes (fields are only added).
JSON_SCHEMA_VERSION = 1


def manifest_json(manifest: Manifest, origin: str) -> dict[str, Any]:
    """The manifest as ``run show --json`` prints it (docs/operations.md, "CLI reference")."""
    ref = manifest.ref
    return {
        "run": str(ref), "name": manifest.name, "origin": origin, "version": manifest.version,
        "created_at": manifest.created_at, "updated_at": manifest.updated_at,
        "policy": manifest.policy, "banned": list(manifest.banned), "revoked": list(manifest.revoked),
        "fingerprint": manifest.fingerprint, "run_id": ref.run_id,
        "owner_key": encode_public_key(manifest.owner_key), "local_data": manifest.local_data,
        "data": describe_data(manifest), "task": dict(manifest.task), "training": dict(manifest.training),
    }


def describe_data(manifest: Manifest) -> str:
    """Where a node of the run reads its training data, in words."""
    if manifest.task.get("data_path") is not None:
        return f"{manifest.task['data_path']} (the same for every node)"
    if manifest.local_data:
        return "each node's own copy: every node must set task.data_path in its config"
    return "each node's task.data_path (default: the .py files of its Python's standard library)"


def show_command(args: argparse.Namespace) -> int:
    source = open_source(args.target, join=args.join, timeout=args.timeout)
    try:
        manifest = source.fetch()
    except SourceUnavailable as error:
        print(f"p2ptrain: {error}", file=sys.stderr)
        return EX_FAILURE
    if args.toml:
        sys.stdout.write(manifest.to_toml())
    elif args.json:
        print(json.dumps({"schema_version": JSON_SCHEMA_VERSION, **manifest_json(manifest, source.describe())},
                         sort_keys=True, default=str))
    else:
        print("\n".join(show_lines(manifest, source.describe())))
    return EX_OK


def _run_and_manifest(target: str) -> tuple[RunRef, Path | None]:
    path = manifest_path(Path(target))
    if path.is_file():
        manifest = read_manifest_file(path)
        return manifest.ref, path
    return RunRef.parse(target), None


def _check_invitable(path: Path, ref: RunRef, peer_id: str) -> None:
    """Refuse an invite the run's manifest (when it is at hand) would make worthless: one in an open
    run (a node that sets one there is refused), or one for a peer the manifest bans or revokes."""
    if not path.is_file():
        return  # only the reference is known here: the run may well be invite-only
    manifest = read_manifest_file(path)
    if manifest.ref != ref:
        return
    where = f"run {ref} (manifest version {manifest.version})"
    if manifest.policy == "open":
        raise ConfigError(f"run {ref} is open to everyone (manifest version {manifest.version}): nobody needs an "
                          "invite, and a node that sets one is refused; make the run invite-only first: "
                          f"p2ptrain run update {path} --private")
    if peer_id in manifest.banned:
        raise ConfigError(f"peer {peer_id} is banned from {where}: an invite would not admit it; lift the ban "
                          f"first: p2ptrain run update {path} --unban {peer_id}")
    if peer_id in manifest.revoked:
        raise ConfigError(f"peer {peer_id}'s invites to {where} are revoked: a new one would not admit it; readmit "
                          f"it first: p2ptrain run update {path} --unrevoke {peer_id}")


def invite_command(args: argparse.Namespace) -> int:
    ref, manifest_path = _run_and_manifest(args.target)
    peer_id = check_peer_id(args.peer_id)
    key_path = _key_beside(manifest_path, ref, args.key)
    key = _owner_key(key_path, ref)
    _check_invitable(manifest_path or key_path.parent / MANIFEST_FILE, ref, peer_id)
    token = issue_invite(key, ref, peer_id, args.days)
    invite, _, _ = parse_invite(token)
    print(token)
    print(f"invite for peer {peer_id} to run {ref}, valid until {when(invite.expires_at)} "
          f"({_lasts(invite.expires_at - invite.issued_at)}). In that node's config:\n"
          f'  [swarm]\n  run = "{ref}"\n  invite = "<the token above>"', file=sys.stderr)
    return EX_OK


def _lasts(seconds: int) -> str:
    """How long an invite lasts, in the unit that reads best."""
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.3g} hours"
    return f"{seconds / 86400:.3g} days"


def _peer_list(current: tuple[str, ...], add: list[str], remove: list[str], flags: tuple[str, str]) -> tuple[str, ...]:
    """``current`` with ``add`` and without ``remove`` (each checked); a peer in both is refused."""
    added = {check_peer_id(p, flags[0]) for p in add}
    removed = {check_peer_id(p, flags[1]) for p in remove}
    both = added & removed
    if both:
        raise ConfigError(f"{flags[0]} and {flags[1]} of the same peer ({sorted(both)[0]}): give one of them")
    return tuple(sorted((set(current) | added) - removed))


def update_command(args: argparse.Namespace) -> int:
    path = manifest_path(args.manifest)
    old = read_manifest_file(path, any_form=True)  # signing anew: a file in an older form is rewritten
    reform = path.read_bytes() != old.to_toml().encode("utf-8")
    ref = old.ref
    key = _owner_key(_key_beside(path, ref, args.key), ref)
    updated = _data_changed(old, apply_settings(old, args.set), args.set)
    changes: dict[str, Any] = {
        "banned": _peer_list(updated.banned, args.ban, args.unban, ("--ban", "--unban")),
        "revoked": _peer_list(updated.revoked, args.revoke, args.unrevoke, ("--revoke", "--unrevoke")),
    }
    if args.policy is not None:
        changes["policy"] = args.policy
    choice = args.fingerprint
    if choice is None and old.fingerprint is not None and updated.task != old.task:
        # A [task] change may change the model: the recorded fingerprint must follow it, or every
        # node would restart for the new settings and then refuse the run's (stale) fingerprint.
        choice = "auto"
    updated = _code_changed(updated, choice, args.set)
    if choice is not None:
        changes["fingerprint"] = None if choice == "none" else choose_fingerprint(
            choice, NodeConfig.model_validate({"task": updated.task, "training": updated.training}))
    updated = dataclasses.replace(updated, **changes)
    change = classify(old, updated)
    if not change.changes and not reform:
        raise ManifestError(f"run update {path}: nothing changes (give --set, --ban, --unban, --revoke, "
                            "--unrevoke, --private, --open or --fingerprint)")
    new = dataclasses.replace(updated, version=old.version + 1, updated_at=utc_now()).signed(key)
    write_atomic(path, new.to_toml().encode("utf-8"))
    print(f"run {ref}: manifest version {old.version} -> {new.version} written to {path}"
          + (" (in the canonical form: keys sorted)" if reform else ""))
    for item in classify(old, new).changes:
        if item.field == "run.updated_at":
            continue
        print(f"  {item.field}: {item.old!r} -> {item.new!r}  ({item.when})")
    print("nodes pick it up from the swarm once a node of the run holds it "
          f"(start one with --manifest {path}, or restart one)")
    return EX_OK


def peer_id_command(args: argparse.Namespace) -> int:
    from p2ptrain.swarm.identity import ensure_identity, identity_path, peer_id_of_identity  # hivemind

    config = load_config(args.config)
    state_dir = config.state_dir()
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = identity_path(state_dir)
    ensure_identity(path)
    print(peer_id_of_identity(path))
    return EX_OK
