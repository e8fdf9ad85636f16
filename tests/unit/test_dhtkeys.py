"""The DHT key schema: what hivemind derives agrees with it, and no module builds a key of its own."""

from __future__ import annotations

import ast
import inspect

import pytest

from p2ptrain import dhtkeys
from tests.support.imports import REPO

#: How every key of the schema ends: an f-string ending like this, outside p2ptrain.dhtkeys, builds a key.
KEY_SUFFIXES = ("_peers", "_model_fingerprint", "_manifest", "_members", "_progress", "_grad_averager",
                "_state_averager", "_diloco", "_diloco_avg", ".all_averagers")


def test_hivemind_derives_the_keys_the_schema_names() -> None:
    from hivemind.averaging.averager import DecentralizedAverager
    from hivemind.optim.optimizer import Optimizer
    from hivemind.optim.progress_tracker import ProgressTracker

    # The pinned hivemind's own spelling of the names derived from a prefix.
    assert 'f"{self.prefix}_progress"' in inspect.getsource(ProgressTracker.__init__)
    assert dhtkeys.progress_key("p") == "p_progress"
    optimizer = inspect.getsource(Optimizer)
    assert 'prefix=f"{self.run_id}_state_averager"' in optimizer
    assert 'prefix=f"{self.run_id}_grad_averager"' in optimizer
    assert (dhtkeys.state_averager_prefix("p"), dhtkeys.grad_averager_prefix("p")) == ("p_state_averager",
                                                                                     "p_grad_averager")
    assert '.all_averagers"' in inspect.getsource(DecentralizedAverager)
    assert dhtkeys.all_averagers_key("p_diloco_avg") == "p_diloco_avg.all_averagers"


def test_the_records_schema_validates_the_peers_key() -> None:
    from hivemind.dht.routing import DHTID
    from hivemind.dht.schema import SchemaValidator

    from p2ptrain.swarm.records import record_validators

    schemas = [v for v in record_validators("run-a") if isinstance(v, SchemaValidator)]
    assert schemas and all(DHTID.generate(source=dhtkeys.peers_key("run-a")).to_bytes() in v._key_id_to_field_name
                           for v in schemas)


def test_a_run_s_keys_and_its_model_s_prefix_are_apart() -> None:
    keys = {dhtkeys.peers_key("r"), dhtkeys.fingerprint_key("r"), dhtkeys.manifest_key("r"), dhtkeys.members_key("r")}
    prefix = dhtkeys.averaging_prefix("r", "0123456789abcdef")
    keys |= {dhtkeys.progress_key(prefix), dhtkeys.state_averager_prefix(prefix), dhtkeys.grad_averager_prefix(prefix),
             dhtkeys.progress_key(dhtkeys.diloco_clock_prefix(prefix)), dhtkeys.diloco_averager_prefix(prefix)}
    assert len(keys) == 9 and all(key.startswith("r_") for key in keys)
    assert dhtkeys.averaging_prefix("r", "0123456789abcdef") != dhtkeys.averaging_prefix("r", "fedcba9876543210")


def _key_builders(tree: ast.AST) -> list[int]:
    """Lines of f-strings that end like a key of the schema."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[-1], ast.Constant):
            tail = node.values[-1].value
            if isinstance(tail, str) and tail.endswith(KEY_SUFFIXES) and len(node.values) > 1:
                found.append(node.lineno)
    return found


@pytest.mark.parametrize("folder", ["p2ptrain", "daemon", "benchmarks"])
def test_no_module_builds_a_dht_key_but_the_schema(folder: str) -> None:
    builders = {}
    for path in sorted((REPO / folder).rglob("*.py")):
        lines = _key_builders(ast.parse(path.read_text(encoding="utf-8")))
        if lines:
            builders[str(path.relative_to(REPO))] = lines
    if folder == "p2ptrain":
        assert "p2ptrain/dhtkeys.py" in builders  # the scan sees the schema's own
        del builders["p2ptrain/dhtkeys.py"]
    assert builders == {}
