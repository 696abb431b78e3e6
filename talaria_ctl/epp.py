"""`talaria-ctl --epp ADDR`: the pool's endpoint picker, read over its HTTP side (the metrics
address: `/status`, `/calls/ID`)."""

from __future__ import annotations

import sys

import httpx
import typer

from talaria_ctl.output import print_json, table
from talariad.admin.client import Refused
from talariad.epp.config import GATEWAY_STATS

BOX_COLUMNS = ("box", "endpoint", "state", "age_s", "sessions", "in_flight", "capacity", "leases")


class EPPClient:
    def __init__(self, address: str, timeout: float) -> None:
        base = address if "://" in address else f"http://{address}"
        self.address, self.base, self.timeout = address, base.rstrip("/"), timeout

    def __getattr__(self, name: str):
        """A daemon command asked of the EPP: refused (exit 3), not a traceback."""
        raise Refused(f"--epp takes status and call explain only, not {name.replace('_', ' ')}")

    def get(self, path: str) -> dict:
        """The JSON at `path`; exit 1 when the EPP does not answer, 3 when it refuses."""
        try:
            r = httpx.get(self.base + path, timeout=self.timeout)
        except httpx.HTTPError as err:
            print(f"talaria-ctl: the EPP at {self.address} does not answer: {err}", file=sys.stderr)
            raise typer.Exit(1) from None
        try:
            data = r.json()
        except ValueError:
            data = {}
        if r.status_code != 200:
            why = (data.get("error") or {}).get("message") if isinstance(data, dict) else None
            print(f"talaria-ctl: {why or f'HTTP {r.status_code}'}", file=sys.stderr)
            raise typer.Exit(3)
        return data


def gateway_stats(admin: str, timeout: float) -> dict[str, int]:
    """What the gateway's Envoy did without the picker (`GATEWAY_STATS`), from its admin
    address; exit 1 when it does not answer."""
    base = admin if "://" in admin else f"http://{admin}"
    url = httpx.URL(base.rstrip("/") + "/stats", params={"filter": GATEWAY_STATS})
    try:
        r = httpx.get(str(url), timeout=timeout)
        r.raise_for_status()
    except httpx.HTTPError as err:
        print(
            f"talaria-ctl: the gateway's admin at {admin} does not answer: {err}", file=sys.stderr
        )
        raise typer.Exit(1) from None
    out = {}
    for line in r.text.splitlines():
        name, _, value = line.partition(": ")
        if value.strip().isdigit():
            out[name] = int(value)
    return out


def show_status(client: EPPClient, as_json: bool, gateway: str | None = None) -> None:
    data = client.get("/status")
    if gateway is not None:
        data["gateway"] = gateway_stats(gateway, client.timeout)
    if as_json:
        return print_json(data)
    table(
        f"talariad epp at {client.address}: {data['decisions_per_s']} decisions/s",
        BOX_COLUMNS,
        [
            (
                b["name"],
                b["endpoint"] or "-",
                b["state"],
                "-" if b["snapshot_age_s"] is None else b["snapshot_age_s"],
                b["sessions"],
                b["in_flight"],
                b.get("capacity", "-"),
                b["leases"],
            )
            for b in data["boxes"]
        ],
    )
    refused = [r for r in data.get("refusals", ()) if r["count"]]
    if refused:
        print("refused: " + ", ".join(f"{r['count']} x {r['status']} {r['code']}" for r in refused))
    if gateway is not None:
        seen = {k: v for k, v in data["gateway"].items() if v}
        what = ", ".join(f"{k} {v}" for k, v in sorted(seen.items()))
        print(f"gateway at {gateway}: {what or 'no call routed unpicked, no limit overflowed'}")


def explain(client: EPPClient, call_id: str) -> dict:
    return client.get(f"/calls/{httpx.URL(call_id).raw_path.decode()}")
