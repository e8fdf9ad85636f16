"""The bytelm task and loading user tasks from ``task.entrypoint``."""

from __future__ import annotations

import hashlib
import itertools
import textwrap
from pathlib import Path

import pytest
import torch

from p2ptrain.config.schema import ConfigError, TaskSection, TrainingSection
from p2ptrain.tasks import Task, build_task
from p2ptrain.tasks.bytelm import ByteLM

torch.set_num_threads(1)

EXAMPLES = Path(__file__).resolve().parents[2] / "configs" / "examples"
SMALL = {"seq_len": 32, "d_model": 32, "n_layers": 1, "n_heads": 2, "validation_batches": 3}
_counter = itertools.count()


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    for i in range(30):
        (root / f"doc{i:02d}.txt").write_text(
            "".join(f"the quick brown fox {i} jumps {j}\n" for j in range(30))
        )
    return root


def _small_task(corpus_dir: Path, *, seed: int = 0, peer_seed: int = 1, batch_size: int = 4) -> Task:
    return build_task(
        TaskSection(data_path=corpus_dir, **SMALL),
        TrainingSection(seed=seed, batch_size=batch_size),
        peer_seed,
    )


def _params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


def test_bytelm_init_depends_only_on_the_seed(corpus_dir: Path) -> None:
    torch.manual_seed(123)
    rng_before = torch.get_rng_state()
    one = _params(_small_task(corpus_dir, seed=5, peer_seed=1).model)
    assert torch.equal(torch.get_rng_state(), rng_before)  # the caller's RNG is left alone
    torch.manual_seed(999)  # a different global RNG state must not matter
    two = _params(_small_task(corpus_dir, seed=5, peer_seed=2).model)
    other = _params(_small_task(corpus_dir, seed=6).model)
    assert one.keys() == two.keys()
    assert all(torch.equal(one[k], two[k]) for k in one)
    assert not all(torch.equal(one[k], other[k]) for k in one)


def test_bytelm_is_causal() -> None:
    model = ByteLM(16, 32, 2, 4, seed=0).eval()
    tokens = torch.randint(256, (2, 16), generator=torch.Generator().manual_seed(0))
    changed = tokens.clone()
    changed[:, 10] = (changed[:, 10] + 1) % 256
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    assert torch.allclose(a[:, :10], b[:, :10], atol=1e-6)
    assert not torch.allclose(a[:, 10:], b[:, 10:])
    with pytest.raises(ValueError, match="longer than seq_len"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_bytelm_learns_a_batch(corpus_dir: Path) -> None:
    task = _small_task(corpus_dir)
    batch = task.train_batches.next()
    assert batch.shape == (4, SMALL["seq_len"] + 1)
    optimizer = torch.optim.AdamW(task.model.parameters(), lr=3e-3)
    first = task.loss_fn(task.model, batch)
    assert abs(first.item() - torch.log(torch.tensor(256.0)).item()) < 0.5  # near uniform at init
    for _ in range(30):
        loss = task.loss_fn(task.model, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < first.item() - 1.0


def test_validation_is_the_same_on_every_node_and_bounded(corpus_dir: Path) -> None:
    one, two = _small_task(corpus_dir, peer_seed=1), _small_task(corpus_dir, peer_seed=2)
    batches_one, batches_two = list(one.validation_batches()), list(two.validation_batches())
    assert len(batches_one) == SMALL["validation_batches"]
    assert all(torch.equal(x, y) for x, y in zip(batches_one, batches_two, strict=True))
    assert all(torch.equal(x, y) for x, y in zip(batches_one, one.validation_batches(), strict=True))
    assert not torch.equal(one.train_batches.next(), two.train_batches.next())


def test_shape_config_describes_the_model(corpus_dir: Path) -> None:
    shape = _small_task(corpus_dir).shape_config
    assert {k: shape[k] for k in ("seq_len", "d_model", "n_layers", "n_heads")} == {
        k: SMALL[k] for k in ("seq_len", "d_model", "n_layers", "n_heads")
    }


def test_bad_data_path_reaches_build_task(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^task\.data_path: .* does not exist$"):
        build_task(TaskSection(data_path=tmp_path / "nope"), TrainingSection(), 0)


def test_example_user_task_trains(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    cfg = TaskSection(entrypoint="user_task:build", options={"hidden": 16})
    task = build_task(cfg, TrainingSection(batch_size=16), peer_seed=3)
    assert task.shape_config["hidden"] == 16
    optimizer = torch.optim.Adam(task.model.parameters(), lr=1e-2)

    def validation_loss() -> float:
        with torch.no_grad():
            return sum(task.loss_fn(task.model, b).item() for b in task.validation_batches())

    before = validation_loss()
    for _ in range(150):
        loss = task.loss_fn(task.model, task.train_batches.next())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert validation_loss() < before / 2
    position = task.train_batches.state_dict()
    expected = task.train_batches.next()
    task.train_batches.load_state_dict(position)
    assert all(torch.equal(a, b) for a, b in zip(expected, task.train_batches.next(), strict=True))
    with pytest.raises(ConfigError, match=r"^task\.options\.hidden: must be a positive int"):
        build_task(TaskSection(entrypoint="user_task:build", options={"hidden": "big"}), TrainingSection(), 0)


GOOD_BODY = """
import torch
from p2ptrain.tasks import IndexedStream, Task

def build(context):
    model = torch.nn.Linear(2, 1)
    return Task(model, lambda m, b: m(b).sum(), IndexedStream(lambda i: torch.ones(1, 2)),
                lambda: [], {"kind": "tiny"})
"""


def _module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> str:
    name = f"p2ptrain_test_task_{next(_counter)}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def _entrypoint_error(entrypoint: str) -> str:
    with pytest.raises(ConfigError) as info:
        build_task(TaskSection(entrypoint=entrypoint), TrainingSection(), 0)
    message = str(info.value)
    assert message.startswith("task.entrypoint: ") and "\n" not in message
    return message


def test_good_user_module_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = _module(tmp_path, monkeypatch, GOOD_BODY)
    task = build_task(TaskSection(entrypoint=f"{name}:build"), TrainingSection(), 0)
    code = hashlib.sha256(f"{name}.py\0{len(GOOD_BODY)}\0{GOOD_BODY}".encode()).hexdigest()
    assert isinstance(task, Task) and task.shape_config == {"kind": "tiny", "task_code_sha256": code}


@pytest.mark.parametrize(
    ("body", "function", "expected"),
    [
        (
            None,
            "build",
            "no module named 'p2ptrain_no_such_module_xyz' (install it or add its folder to PYTHONPATH)",
        ),
        (
            "import p2ptrain_missing_dependency_xyz\n",
            "build",
            "failed: No module named 'p2ptrain_missing_dependency_xyz'",
        ),
        ("def build(:\n", "build", "failed: SyntaxError"),
        ("raise RuntimeError('boom at import')\n", "build", "failed: RuntimeError: boom at import"),
        (GOOD_BODY, "missing", "has no attribute 'missing'"),
        ("build = 42\n", "build", ":build is a int, not a function"),
        (
            "def build(context):\n    return 42\n",
            "build",
            ":build returned int, expected p2ptrain.tasks.Task",
        ),
        (
            "def build(context):\n    raise ValueError('bad option')\n",
            "build",
            ":build raised ValueError: bad option",
        ),
        (
            GOOD_BODY.replace("torch.nn.Linear(2, 1)", "object()"),
            "build",
            "whose model is not a torch.nn.Module",
        ),
        (
            GOOD_BODY.replace("torch.nn.Linear(2, 1)", "torch.nn.Identity()"),
            "build",
            "whose model has no parameters",
        ),
        (
            GOOD_BODY.replace("IndexedStream(lambda i: torch.ones(1, 2))", "[1, 2]"),
            "build",
            "whose train_batches lacks next()/state_dict()/load_state_dict()",
        ),
        (
            GOOD_BODY.replace('{"kind": "tiny"}', '{"kind": object()}'),
            "build",
            "whose shape_config is not a JSON-serialisable dict",
        ),
    ],
    ids=[
        "no-module",
        "missing-dependency",
        "syntax-error",
        "import-raises",
        "no-function",
        "not-callable",
        "wrong-return",
        "builder-raises",
        "bad-model",
        "no-parameters",
        "bad-stream",
        "bad-shape-config",
    ],
)
def test_bad_entrypoint_is_one_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str | None, function: str, expected: str
) -> None:
    name = "p2ptrain_no_such_module_xyz" if body is None else _module(tmp_path, monkeypatch, body)
    assert expected in _entrypoint_error(f"{name}:{function}")
