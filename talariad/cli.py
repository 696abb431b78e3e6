"""The `talariad` command: `run` the daemon, or `check-config` a file."""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Annotated

import typer

from talariad.checks import load_checked
from talariad.cliutil import run_app
from talariad.config import ConfigError, TalariaConfig

DEFAULT_CONFIG = "etc/talaria.yaml"

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="Talaria: session-aware multi-model serving."
)

ConfigOpt = Annotated[
    str, typer.Option("--config", "-c", envvar="TALARIA_CONFIG", help="Path to talaria.yaml")
]


def _load(path: str) -> TalariaConfig:
    """The config at `path`, or exit 2 with one line per problem: what the schema refuses, and
    what would keep a valid config from ever serving (the same for `check-config` and `run`)."""
    try:
        return load_checked(path)
    except ConfigError as err:
        for line in err.lines:
            print(f"talariad: {line}", file=sys.stderr)
        raise typer.Exit(2) from None


@app.command("check-config")
def check_config(path: Annotated[str, typer.Argument(help="Config file to validate")]) -> None:
    """Run every check `run` does before starting (schema, cross-field, profiles, executors,
    devices, what could never serve); exit 2 with one line per problem."""
    cfg = _load(path)
    print(f"{path}: ok ({len(cfg.models)} models, {len(cfg.instances)} instances)")


def _logging(log_level: str) -> None:
    """Log at `log_level` (exit 2 on an unknown one); httpx only from warnings up: it would log
    one line per telemetry or snapshot poll."""
    level = getattr(logging, log_level.upper(), None)
    if not isinstance(level, int):
        print(f"talariad: --log-level: unknown level {log_level!r}", file=sys.stderr)
        raise typer.Exit(2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(max(level, logging.WARNING))


@app.command()
def run(
    config: ConfigOpt = DEFAULT_CONFIG,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error")] = "info",
) -> None:
    """Start the supervisor, instances, gateway and admin API; stop on SIGTERM or SIGINT."""
    from talariad.daemon import Daemon

    _logging(log_level)
    cfg = _load(config)
    try:
        asyncio.run(Daemon(cfg, config).run())
    except OSError as err:
        print(f"talariad: cannot start: {err}", file=sys.stderr)
        raise typer.Exit(1) from None
    except (RuntimeError, ValueError) as err:  # something the config checks could not foresee
        print(f"talariad: {err}", file=sys.stderr)
        raise typer.Exit(1) from None


@app.command()
def epp(
    config: Annotated[str, typer.Option("--config", "-c", help="Path to the pool's EPP config")],
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error")] = "info",
) -> None:
    """Run the pool's endpoint picker: Envoy's ext_proc server placing each call on a box."""
    from talariad.epp.config import load_epp_config
    from talariad.epp.run import run_epp

    _logging(log_level)
    try:
        cfg = load_epp_config(config)
    except ConfigError as err:
        for line in err.lines:
            print(f"talariad: {line}", file=sys.stderr)
        raise typer.Exit(2) from None
    try:
        asyncio.run(run_epp(cfg, config))
    except OSError as err:
        print(f"talariad: cannot start: {err}", file=sys.stderr)
        raise typer.Exit(1) from None
    except (RuntimeError, ValueError) as err:
        print(f"talariad: {err}", file=sys.stderr)
        raise typer.Exit(1) from None


def main() -> None:
    run_app(app, "talariad")


if __name__ == "__main__":
    main()
