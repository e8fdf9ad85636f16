"""Typed, validated node configuration: TOML file + ``P2PTRAIN_<SECTION>__<KEY>`` overrides.

Every field has a default that works on a laptop and a docstring (the docstrings are what
``p2ptrain config init`` turns into the commented template).  Any problem becomes one
:class:`ConfigError` whose message names the file and the dotted field, so the CLI can print
one line and exit with ``EX_CONFIG`` (78) instead of a traceback.
"""

from __future__ import annotations

import os
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from p2ptrain.config import checks
from p2ptrain.config.checks import DirectoryPath, filesystem_problems
from p2ptrain.config.checks import parse_multiaddr as parse_multiaddr
from p2ptrain.config.errors import describe_all, describe_invalid, source_of
from p2ptrain.config.tomlfile import ENV_PREFIX as ENV_PREFIX
from p2ptrain.config.tomlfile import env_overrides as _env_overrides
from p2ptrain.config.tomlfile import env_variables, read_toml, with_overrides
from p2ptrain.config.windows import parse_window

# Re-exported (the "as" form): callers keep importing both from p2ptrain.config.schema.
from p2ptrain.errors import EX_CONFIG as EX_CONFIG
from p2ptrain.errors import ConfigError as ConfigError
from p2ptrain.paths import resolve_state_dir

DEFAULT_SWARM_PORT = 41400
DEFAULT_API_PORT = 41480

# Upper bounds: far above any real run, low enough that a typo (1e8 for 1e3) is caught here and
# not as an out-of-memory kill, an overflow or a node that waits for a week.
DAY = 86_400.0
MAX_COUNT = 10**9  # epochs, steps, samples
#: DiLoCo's inner batch when training.inner_batch_size is 0: this many micro-batches per inner AdamW
#: step (4 x the default batch_size 8 = 32 sequences), so the inner optimizer step is paid once per
#: four micro-batches rather than on every one (docs/benchmarks.md compares the two).
AUTO_INNER_MICRO_BATCHES = 4


def inner_batch_sequences(batch_size: int, inner_batch_size: int) -> int:
    """Sequences per DiLoCo inner step: ``inner_batch_size``, or for 0 AUTO_INNER_MICRO_BATCHES micro-batches."""
    return inner_batch_size or AUTO_INNER_MICRO_BATCHES * batch_size
MAX_SEED = 2**63 - 1  # torch.manual_seed's range

class _Section(BaseModel):
    # strict: no silent coercion (bool -> int, "8" -> 8, 8.0 -> 8); allow_inf_nan=False: every float
    # is finite.  Paths opt out of strictness field by field, since TOML spells them as strings.
    model_config = ConfigDict(extra="forbid", validate_default=True, use_attribute_docstrings=True,
                              strict=True, allow_inf_nan=False)


class NodeSection(_Section):
    """Where the node keeps its state and how it logs."""

    state_dir: DirectoryPath = None
    """State directory (identity key, API token, checkpoints). Default: $STATE_DIRECTORY under systemd,
    else $XDG_STATE_HOME/p2ptrain (~/.local/state/p2ptrain)."""

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Log level of p2ptrain's own loggers (hivemind's are kept at WARNING unless this is DEBUG)."""

    log_format: Literal["auto", "human", "journal", "json"] = "auto"
    """auto: journal format (syslog <N> prefixes, no timestamps) when stderr is the journal, else human;
    json: one JSON object per line (time, level, logger, message, structured fields) for log shippers."""

    @field_validator("log_level", mode="before")
    @classmethod
    def _any_case(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value  # as --log-level debug takes it


class SwarmSection(_Section):
    """How the node finds and joins its swarm (hivemind DHT over libp2p)."""

    run_id: str = "p2ptrain-default"
    """Name of the training run; only nodes with the same run_id (and the same model) train together."""

    initial_peers: list[str] = []
    """Multiaddrs of nodes already in the swarm, each ending in /p2p/<peer id>. Empty: start a new swarm."""

    listen_addrs: list[str] = [f"/ip4/0.0.0.0/tcp/{DEFAULT_SWARM_PORT}"]
    """Addresses to listen on. The default takes TCP port 41400 on every interface."""

    announce_addrs: list[str] = []
    """Addresses other peers should dial, e.g. /ip4/<public IP>/tcp/41400 for a port forwarded on the home
    router. Set: the node reports itself public at that address (and warns when libp2p does not announce
    it). Empty: libp2p decides, and the node reports what it finds (relayed, or unknown)."""

    client_mode: bool = False
    """Client mode: dial out only, accept no connections (for nodes behind NAT without port forwarding)."""

    check_reachability: bool = True
    """At start, ask the peers this node joins through to open a connection back to its listening port.
    When one answers and none can connect (a home router without a forwarded port), the node averages as a
    client, through peers that can be dialled, instead of failing the rounds that wait for connections to it.
    Off: rely on swarm.client_mode and swarm.announce_addrs alone."""

    nat_port_map: bool = True
    """Ask the LAN router for a port mapping (UPnP / NAT-PMP). Turn off on loopback and in tests."""

    auto_nat: bool = True
    """Run libp2p's AutoNAT service to learn whether this node is reachable. Off on loopback and in tests."""

    use_relay: bool = True
    """Allow reaching and being reached through libp2p circuit relays."""

    use_auto_relay: bool = True
    """Look for a circuit relay among the run's peers when this node is not reachable directly (behind NAT),
    so that peers can dial it through the relay."""

    relays: list[str] = []
    """Trusted circuit relays (multiaddrs ending in /p2p/<peer id>) to reserve a slot on when behind NAT.
    Empty: the initial peers are the trusted relays."""

    relay_service: bool = True
    """Serve as a circuit relay for the run's peers that cannot be dialled (libp2p turns it on only while
    AutoNAT finds this node reachable). What it relays is counted in p2ptrain_relay_bytes_total."""

    relay_max_reservations: Annotated[int, Field(ge=1, le=1024)] = 32
    """Relay slots this node holds for peers behind NAT at once; a peer asking for one more is refused
    (counted in p2ptrain_relay_refused_total)."""

    relay_max_circuits: Annotated[int, Field(ge=1, le=256)] = 16
    """Relayed connections open at once to any one peer holding a slot."""

    bootstrap_timeout: Annotated[float, Field(gt=0, le=DAY)] = 60.0
    """Seconds to keep retrying (with backoff) when no initial peer answers, before giving up."""

    run: str | None = None
    """Reference of an owned run, NAME@<owner key hash> (printed by p2ptrain run init). The node then takes
    [task], the run-wide [training] settings and run_id from the owner's signed manifest; set only local
    matters here. Unset: a plain run named by run_id."""

    manifest: Annotated[Path | None, Field(strict=False)] = None
    """A run manifest file (from the run's owner) to use instead of fetching it from the swarm; for runs
    without a swarm yet. Its signature is checked against swarm.run when that is set."""

    invite: str | None = None
    """Invite token for a private (invite-only) run, from: p2ptrain run invite <run> <this node's peer id>."""

    peer_checks: bool = True
    """Check what peers send (states, averaging parts, progress) and exclude those that lie. Turn off only
    to measure what the checks cost: the node then trusts every peer, as plain hivemind does."""

    ban_seconds: Annotated[float, Field(gt=0, le=30 * DAY)] = 600.0
    """Seconds a peer stays excluded from this node's averaging groups and donor lists after an offence
    (bad averaging parts, or a state judged implausible against what the run's other peers report)."""

    bad_state_ban_seconds: Annotated[float, Field(ge=0, le=365 * DAY)] = 0.0
    """Seconds a donor that served a malformed state (wrong shapes, NaN, epoch out of range) stays
    excluded. 0: for the rest of the run."""

    _run_id = field_validator("run_id")(checks.run_id)
    _run = field_validator("run")(checks.run_reference)
    _invite = field_validator("invite")(checks.invite_token)
    _initial_peers = field_validator("initial_peers")(checks.peer_multiaddrs)
    _addrs = field_validator("listen_addrs")(checks.multiaddrs)
    _announce = field_validator("announce_addrs")(checks.announce_multiaddrs)
    _relays = field_validator("relays")(checks.peer_multiaddrs)


class TaskSection(_Section):
    """What is trained: the built-in byte-level LM, or a user task from ``entrypoint``."""

    # model_config is a key of [task] (task.model_config), so fields fill by name and by alias alike.
    model_config = ConfigDict(**_Section.model_config, populate_by_name=True, protected_namespaces=())

    name: Literal["bytelm"] = "bytelm"
    """Built-in task. Ignored when entrypoint is set."""

    entrypoint: str | None = None
    """A user task as "package.module:function" (see configs/examples/user_task.py)."""

    kind: Literal["bytelm", "hf_causal_lm"] = "bytelm"
    """The built-in model: "bytelm" (the byte-level LM, shaped by seq_len, d_model, n_layers, n_heads) or
    "hf_causal_lm" (any Hugging Face transformers causal LM from task.model_config and task.tokenizer; needs
    p2ptrain[hf]). Ignored when entrypoint is set."""

    # Spelled model_config in the config file (pydantic reserves that attribute name for itself).
    model_path: Annotated[str | None, Field(alias="model_config")] = None
    """hf_causal_lm: a local directory holding the model's config.json (and, to start from them instead of
    from scratch, its weights as model.safetensors), or the config.json itself. Never runs code from it."""

    tokenizer: str | None = None
    """hf_causal_lm: a local directory holding a fast tokenizer (tokenizer.json). Default: task.model_config's
    directory."""

    data_path: str | None = None
    """Training data, read as a stream of shards (never whole): a text file, a directory or a glob
    ("/data/**/*.jsonl") of text, .jsonl and .parquet files; an http(s):// URL of one shard file (add
    "#sha256=<hex>" to check it), or an object store's (s3://, gs://, hf://datasets/..., az://: pip install
    'p2ptrain[cloud]'); or a shard index, a file named SHA256SUMS or *.sha256 (local or a URL)
    listing "<sha256>  <file name or URL>" per line, names relative to the index. Shards are shared out
    among the live peers, so each node reads only part of the data per pass. Default: the .py files of
    this Python's standard library."""

    data_index_sha256: str | None = None
    """The sha256 of the shard index data_path names (as sha256sum prints it): a node whose index differs
    refuses to start, naming both digests. p2ptrain run init records it in an owned run's manifest, so
    every volunteer reads the data the owner created the run with. Unset: not checked."""

    code_sha256: str | None = None
    """The sha256 of the user task's code (every .py file of the package that defines task.entrypoint):
    a node whose copy of the code differs refuses to start, naming both digests. p2ptrain run init
    records it in an owned run's manifest. Unset: not checked (the model fingerprint still covers the
    code, so nodes with other code do not average together)."""

    data_format: Literal["auto", "text", "jsonl", "parquet"] = "auto"
    """How data files are read. auto: by name (.jsonl and .parquet; anything else is plain text)."""

    data_compression: Literal["auto", "none", "gzip", "zstd"] = "auto"
    """How data files are compressed. auto: by name (.gz gzip, .zst zstd; zstd needs p2ptrain[zstd]). A
    compressed file is one shard, decompressed once into the data cache, at most task.max_shard_mb of it."""

    text_field: Annotated[str, Field(min_length=1, max_length=128, strict=True)] = "text"
    """The JSONL field or Parquet column that holds each record's text."""

    buffer_mb: Annotated[int, Field(ge=1, le=65536, strict=True)] = 64
    """Memory (MiB) this node gives to training and validation text, whatever the dataset's size. Bigger
    blocks mix the data better. Parquet row groups should be smaller than this."""

    cache_dir: DirectoryPath = None
    """Where shards downloaded from http(s) URLs are kept. Default: <state_dir>/data-cache."""

    cache_max_mb: Annotated[int, Field(ge=0, le=2**30, strict=True)] = 0
    """Keep the download cache under this many MiB, deleting the least recently used shards. 0: no limit."""

    max_shard_mb: Annotated[int, Field(ge=1, le=2**20, strict=True)] = 1024
    """The largest shard this node downloads, in MiB: a bigger one (as announced, or as it streams in) is
    refused and skipped, so a data host cannot fill this machine's disk with one file. It also caps what one
    compressed shard may decompress to (a bomb is refused). Local plain files are not limited;
    task.cache_max_mb bounds the cache as a whole."""

    download_attempts: Annotated[int, Field(ge=1, le=20, strict=True)] = 4
    """Tries per shard download (waiting 1 s, 2 s, 4 s... in between) before the shard is skipped
    for this pass."""

    download_timeout: Annotated[float, Field(gt=0, le=3600, strict=True)] = 60.0
    """Seconds without data after which one download try is abandoned."""

    seq_len: Annotated[int, Field(gt=0, le=65_536)] = 128
    """Tokens (bytes) per training sequence."""

    d_model: Annotated[int, Field(gt=0, le=16_384)] = 128
    """Transformer width."""

    n_layers: Annotated[int, Field(gt=0, le=1_024)] = 2
    """Transformer blocks."""

    n_heads: Annotated[int, Field(gt=0, le=1_024)] = 4
    """Attention heads; must divide d_model."""

    validation_fraction: Annotated[float, Field(gt=0, lt=1)] = 0.05
    """Share of files (chosen by path hash, the same on every node) held out for validation."""

    validation_batches: Annotated[int, Field(gt=0, le=100_000)] = 8
    """Batches evaluated for each validation loss."""

    options: dict[str, Any] = {}
    """Free-form options passed to a user task's entrypoint."""

    _data_path_text = field_validator("data_path", mode="before")(checks.path_as_text)
    _data_path = field_validator("data_path")(checks.data_path_shape)
    _data_index = field_validator("data_index_sha256")(checks.sha256_hex)
    _code = field_validator("code_sha256")(checks.sha256_hex)
    _entrypoint = field_validator("entrypoint")(checks.entrypoint)

    @model_validator(mode="after")
    def _hf_needs_a_model(self) -> TaskSection:
        if self.kind == "hf_causal_lm" and self.entrypoint is None and not self.model_path:
            raise ValueError("task.kind = \"hf_causal_lm\" needs task.model_config (a directory with config.json)")
        # (model_config without the kind is allowed: a volunteer's config names its copy of the model directory
        # while task.kind comes from the run's manifest.)
        return self

    @model_validator(mode="after")
    def _heads_divide_width(self) -> TaskSection:
        if self.d_model % self.n_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must divide d_model ({self.d_model})")
        return self


class TrainingSection(_Section):
    """The optimizer, its schedule and how averaging with the swarm is paced."""

    batch_size: Annotated[int, Field(gt=0, le=65_536)] = 8
    """Sequences per local step (micro-batch)."""

    target_batch_size: Annotated[int, Field(gt=0, le=MAX_COUNT)] = 256
    """Sequences the whole swarm accumulates per optimizer epoch. Larger means fewer, bigger averaging
    rounds: aim for an epoch every 10-60 s of swarm time (at least ~5x the measured all-reduce time,
    or communication shows up in throughput). Gradient mode only; DiLoCo paces by inner_steps."""

    lr: Annotated[float, Field(gt=0, le=10)] = 1e-3
    """Peak AdamW learning rate."""

    weight_decay: Annotated[float, Field(ge=0, le=10)] = 0.01
    """AdamW weight decay."""

    warmup_epochs: Annotated[int, Field(ge=0, le=MAX_COUNT)] = 10
    """Linear warmup length, in optimizer epochs."""

    total_epochs: Annotated[int, Field(gt=0, le=MAX_COUNT)] = 10_000
    """Length of the cosine decay, in optimizer epochs."""

    max_grad_norm: Annotated[float, Field(gt=0, le=1e6)] = 1.0
    """Clip the local gradient to this L2 norm before it is accumulated."""

    matchmaking_time: Annotated[float, Field(gt=0, le=3_600.0)] = 5.0
    """Seconds to look for peers to average with before each round. The group is only closed when this
    window ends, so a round lasts at least this long; it starts this long before the round is due
    (overlapping compute) and costs nothing while epochs are longer than it. Make it ~3x the DHT round
    trip between peers: 0.5 s on loopback, 1-2 s on a LAN, 5+ s across the internet."""

    averaging_timeout: Annotated[float, Field(gt=0, le=DAY)] = 30.0
    """Seconds after which an averaging round is abandoned (the node goes on with local progress); a
    dead peer never stalls the others longer than this. Make it ~3x a measured round (status:
    last_round_duration) plus matchmaking_time."""

    load_state_timeout: Annotated[float, Field(gt=0, le=DAY)] = 60.0
    """Seconds to wait for one donor when downloading the swarm's state."""

    load_state_attempts: Annotated[int, Field(gt=0, le=1_000)] = 3
    """Donors to try before continuing from the local checkpoint."""

    threads: Annotated[int, Field(ge=0, le=4_096)] = 0
    """Torch CPU threads; 0 means all cores."""

    validate_every: Annotated[float, Field(gt=0, le=30 * DAY)] = 30.0
    """Seconds between validation-loss evaluations."""

    max_epochs: Annotated[int, Field(ge=0, le=MAX_COUNT)] = 0
    """Stop cleanly after this optimizer epoch; 0 trains until stopped."""

    seed: Annotated[int, Field(ge=-MAX_SEED - 1, le=MAX_SEED)] = 0
    """Seed for model initialisation (must match across the swarm)."""

    mode: Literal["gradient", "diloco"] = "gradient"
    """gradient: average gradients with the swarm every optimizer epoch (hivemind.Optimizer); best on
    fast links. diloco: train alone with AdamW for a round (about inner_steps steps), then average the
    parameters with the swarm and apply an outer Nesterov SGD step towards that average; ~inner_steps
    times less traffic, the mode for home-internet volunteers. All peers of a run must use the same mode."""

    grad_compression: Literal["none", "fp16", "8bit"] = "fp16"
    """Wire format of what is averaged each round (gradients, or in DiLoCo mode parameters): none (fp32),
    fp16 (half the bytes, no measurable loss change), 8bit (a quarter; uniform 8-bit quantisation of
    large tensors, fp16 for small ones; slightly noisier updates)."""

    state_compression: Literal["none", "fp16", "8bit"] = "none"
    """Wire format of parameters when peers average them and when a newcomer downloads the state.
    Lossy choices perturb the weights themselves: keep "none" unless the link is the bottleneck;
    never "8bit" for a long run."""

    overlap: bool = True
    """Gradient mode: average gradients and run the optimizer step in the background while the next
    batches are computed (hivemind's delay_grad_averaging + delay_optimizer_step). Updates then use
    gradients one epoch old, which costs little at a target_batch_size of 100+ sequences.
    DiLoCo mode: the outer round's all-reduce runs while the next inner steps compute; its outer step
    lands a few steps late, with the local progress made meanwhile kept on top."""

    average_state_every: Annotated[int, Field(gt=0, le=1_000_000)] = 16
    """Gradient mode: epochs between parameter-averaging rounds, which only repair the drift left by
    failed gradient rounds (hivemind's default of 1 doubles the traffic)."""

    inner_steps: Annotated[int, Field(gt=0, le=MAX_COUNT)] = 25
    """DiLoCo mode: inner AdamW steps (H) per outer round, for the swarm's fastest peer. A round ends
    for every peer at the same time, once the swarm has processed inner_steps x inner_batch_size
    sequences (800 with the defaults, 25 x 32) for every peer of the fastest one's speed (a peer at a
    quarter of it counts a quarter): every peer makes about inner_steps inner steps, a slower one of
    fewer sequences each (see inner_batch_size), and each is weighted by its samples. Pick it so one
    round takes at least ~30x the all-reduce time of the model on the slowest peer's link (e.g. 20 s+
    on home links). A config written when inner steps were one micro-batch (inner_batch_size 0 meant
    batch_size) makes rounds 4x as long now: divide its inner_steps by 4, or set inner_batch_size to
    batch_size."""

    inner_batch_size: Annotated[int, Field(ge=0, le=MAX_COUNT)] = 0
    """DiLoCo mode: sequences per inner AdamW step of the swarm's fastest peer, accumulated over
    micro-batches of batch_size (a multiple of batch_size); larger batches pay the optimizer step
    less often. 0: 4 x batch_size (32 with the default batch_size: 0.96 of ideal throughput
    measured, against 0.86 for one-micro-batch steps). A slower peer takes fewer micro-batches per
    inner step, in proportion to its speed (at least one), so that it makes as many inner steps a
    round as the fastest peer."""

    outer_lr: Annotated[float, Field(gt=0, le=100)] = 0.7
    """DiLoCo mode: learning rate of the outer SGD step (its gradient: the outer parameters less the
    swarm's average)."""

    outer_momentum: Annotated[float, Field(ge=0, lt=1)] = 0.9
    """DiLoCo mode: momentum of the outer SGD step."""

    outer_nesterov: bool = True
    """DiLoCo mode: use Nesterov momentum for the outer step (the DiLoCo paper's choice)."""

    device: Annotated[str, Field(pattern=r"^(auto|cpu|cuda|cuda:\d{1,2})$")] = "auto"
    """Where the model, its optimizer state and the batches live: auto (a CUDA device when torch sees
    one, else the CPU), cpu, cuda (the current CUDA device) or cuda:N. An explicit cuda on a machine
    where torch sees no CUDA device stops the node (exit 78). What the swarm averages is staged
    through CPU buffers either way; checkpoints and exports hold CPU tensors."""

    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    """Arithmetic of the forward pass and loss (torch.autocast); parameters, optimizer state and what is
    averaged stay fp32, so peers of different precisions average together. bf16 runs on CPUs and GPUs;
    fp16 uses a dynamic gradient scaler and needs a CUDA device: with device "cpu" it is refused, with
    "auto" on a machine without one the node says so in one line and trains in fp32."""

    outer_compression: Literal["none", "int8", "topk"] = "none"
    """DiLoCo mode: what a round sends. none: the parameters (grad_compression's wire format), averaged
    and stepped towards. int8 and topk: the round's pseudo-gradient plus what earlier rounds did not
    send (an error-feedback buffer kept by each peer, in its checkpoints), quantised per chunk of 4096
    values: int8 sends every value at 8 bits; topk sends only each chunk's outer_topk_density largest
    values at outer_value_bits bits with their offsets, about 50x fewer bytes than int8 at 2%.
    The swarm averages what the peers sent; the rest waits in each peer's buffer for later rounds.
    Averaged pseudo-gradients never pull drifted peers back together as averaged parameters do, so a
    failed round returns its part to the buffer and takes no outer step, and a peer that missed a round
    downloads the state instead of joining the next one. A round restarts every peer from the shared
    parameters, which topk moves by a few per cent of the values: its loss trails until the buffers
    have run for about 1/outer_topk_density rounds (docs/benchmarks.md); on runs of few rounds prefer
    int8. All peers of a run must use the same setting."""

    outer_topk_density: Annotated[float, Field(gt=0, le=1)] = 0.02
    """DiLoCo mode with outer_compression "topk": the share of each chunk's values sent each round."""

    outer_value_bits: Literal[2, 4, 8] = 2
    """DiLoCo mode with outer_compression "topk": bits per value sent (a sign and a magnitude on the
    chunk's scale)."""

    @property
    def inner_batch(self) -> int:
        """DiLoCo mode: sequences per inner step, ``inner_batch_size`` or its automatic value."""
        return inner_batch_sequences(self.batch_size, self.inner_batch_size)

    @property
    def round_sequences(self) -> int:
        """DiLoCo mode: a round's length, in sequences of a peer at the swarm's pace (the round clock's unit)."""
        return self.inner_steps * self.inner_batch

    @model_validator(mode="after")
    def _inner_batch_is_whole_micro_batches(self) -> TrainingSection:
        if self.inner_batch_size % self.batch_size:
            raise ValueError(f"inner_batch_size ({self.inner_batch_size}) must be a multiple of "
                             f"batch_size ({self.batch_size})")
        return self

    @model_validator(mode="after")
    def _fp16_needs_a_gpu(self) -> TrainingSection:
        if self.precision == "fp16" and self.device == "cpu":
            raise ValueError('precision "fp16" needs a CUDA device (device "cpu"): use "bf16" or "fp32" on a CPU')
        return self


class CheckpointSection(_Section):
    """Local checkpoints: written atomically, the last ``keep`` retained."""

    dir: DirectoryPath = None
    """Checkpoint directory. Default: <state_dir>/checkpoints."""

    interval: Annotated[float, Field(gt=0, le=30 * DAY)] = 300.0
    """Seconds between periodic checkpoints (one is always written on a clean stop)."""

    keep: Annotated[int, Field(gt=0, le=10_000)] = 3
    """Checkpoints kept; older ones are deleted once a newer one is complete."""


class ApiSection(_Section):
    """The node's local HTTP API (/metrics, /healthz, /api/v1/...)."""

    enabled: bool = True
    """Serve the API at all."""

    host: str = "127.0.0.1"
    """Bind address. Anything but loopback requires the bearer token on every endpoint except
    /metrics and /healthz."""

    port: Annotated[int, Field(ge=0, le=65535)] = DEFAULT_API_PORT
    """TCP port; 0 picks a free one (written to <state_dir>/api.url)."""

    _host = field_validator("host")(checks.check_host)


class VolunteerSection(_Section):
    """Volunteer controls (like BOINC's preferences): when the node may train. Reloadable with SIGHUP.
    A paused node stays in the swarm and still serves its state to newcomers."""

    run_windows: list[str] = []
    """Train only inside these local-time windows, e.g. ["22:00-07:00"] or ["Mon-Fri 19:00-08:00",
    "Sat,Sun 00:00-24:00"]. A window may cross midnight; days name the day it starts. Empty: always."""

    busy_load_threshold: Annotated[float, Field(ge=0, le=1_000)] = 0.0
    """Pause while the 1-minute load average per CPU core, less the node's own share, is above this
    (e.g. 0.5). 0 disables."""

    busy_cpu_percent: Annotated[float, Field(ge=0, le=100)] = 0.0
    """Pause while other processes use more than this percentage of the machine's CPU (e.g. 25).
    0 disables."""

    busy_resume_ratio: Annotated[float, Field(gt=0, le=1)] = 0.75
    """Hysteresis: a busy pause ends only once the load is below threshold * this ratio."""

    busy_hold_seconds: Annotated[float, Field(ge=0, le=DAY)] = 300.0
    """A busy pause lasts at least this long, and the machine must stay quiet this long before
    training resumes."""

    max_cpu_percent: Annotated[float, Field(ge=0, le=100)] = 0.0
    """Use at most this percentage of the machine's CPU time (all its cores: 25 on a 4-core machine is
    one core's worth), like BOINC's "use at most N% of CPU time". The node idles between training
    steps so its own process (the training) stays within it; the swarm's helper processes (DHT,
    averaging, p2p daemon: ~1-25% of a core) come on top. 0 or 100: no limit. For a hard limit on
    everything use systemd's CPUQuota= (per core: CPUQuota=100% is one core)."""

    max_memory_mb: Annotated[int, Field(ge=0, le=2**30)] = 0
    """Resident memory (MiB) above which the node pauses training and logs a warning. 0: unlimited.
    For a hard limit use systemd's MemoryMax= on the unit."""

    upload_kbps: Annotated[int, Field(ge=0, le=10**9)] = 0
    """Upload bandwidth hint in kilobits/s. Not a cap: the slower of upload_kbps/download_kbps is given to
    hivemind's averager as this node's relative bandwidth, so it reduces a smaller share of each
    all-reduce than faster peers (peers without a hint count as the group's average). 0: no hint.
    To enforce a limit use a traffic shaper (tc) or systemd's IPAccounting/cgroup controls."""

    download_kbps: Annotated[int, Field(ge=0, le=10**9)] = 0
    """Download bandwidth hint in kilobits/s; a hint like upload_kbps, not a cap. 0: no hint."""

    @field_validator("run_windows")
    @classmethod
    def _windows_parse(cls, values: list[str]) -> list[str]:

        for value in values:
            parse_window(value)
        return values


class NodeConfig(_Section):
    """The whole configuration of one node."""

    node: NodeSection = NodeSection()
    swarm: SwarmSection = SwarmSection()
    task: TaskSection = TaskSection()
    training: TrainingSection = TrainingSection()
    checkpoint: CheckpointSection = CheckpointSection()
    api: ApiSection = ApiSection()
    volunteer: VolunteerSection = VolunteerSection()

    def state_dir(self) -> Path:
        """The state directory this config resolves to (not created here)."""
        return resolve_state_dir(self.node.state_dir, os.environ)

    def checkpoint_dir(self) -> Path:
        return self.checkpoint.dir if self.checkpoint.dir is not None else self.state_dir() / "checkpoints"


def _is_text(section: str, key: str) -> bool:
    """Whether ``[section] key`` holds text (a string or a path), so an env override keeps its text."""
    section_field = NodeConfig.model_fields.get(section)
    model = section_field.annotation if section_field is not None else None
    field = model.model_fields.get(key) if isinstance(model, type) and issubclass(model, BaseModel) else None
    if field is None:
        return False
    annotation = field.annotation
    is_union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    options = typing.get_args(annotation) if is_union else (annotation,)
    return any(option in (str, Path) for option in options)


def env_overrides(environ: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """Collect ``P2PTRAIN_<SECTION>__<KEY>=value`` into ``{section: {key: value}}`` (TOML literals)."""
    return _env_overrides(environ, _is_text)


def parse_config(data: Mapping[str, Any], origin: str, environ: Mapping[str, str] | None = None) -> NodeConfig:
    """Validate ``data`` (already-parsed TOML) with env overrides applied on top, then check that its
    paths can work here (training data that exists, directories that are not files).  An error names
    where the bad setting came from: ``origin`` (the file), or the environment variable that set it."""
    environ = environ if environ is not None else {}
    merged = with_overrides(dict(data), env_overrides(environ))
    set_by = env_variables(environ)
    try:
        config = NodeConfig.model_validate(merged)
    except ValidationError as error:
        raise ConfigError(describe_invalid(error, source_of(error.errors()[0]["loc"], origin, data, set_by)),
                          describe_all(error, lambda loc: source_of(loc, origin, data, set_by))) from None
    problems = [f"{source_of((section, key), origin, data, set_by)}: {section}.{key}: {text}"
                for (section, key), text in filesystem_problems(config)]
    if problems:
        raise ConfigError(problems[0], problems)
    return config


def load_config(path: Path | None, environ: Mapping[str, str] | None = None) -> NodeConfig:
    """Read ``path`` (or only defaults + env when ``None``) into a validated :class:`NodeConfig`."""
    environ = os.environ if environ is None else environ
    if path is None:
        return parse_config({}, "defaults", environ)
    return parse_config(read_toml(path), str(path), environ)


def config_problems(path: Path | None, environ: Mapping[str, str] | None = None) -> list[str]:
    """Every problem of the config ``path`` (only defaults + env when ``None``), one line each, as
    :func:`load_config` words them; empty when it loads.  A file that cannot be read or parsed is one
    problem: nothing after it can be judged."""
    try:
        load_config(path, environ)
    except ConfigError as error:
        return list(error.problems)
    return []
