"""Certificates for the TLS tests, made with the `openssl` command (the test environment has no
`cryptography` package): a CA, and leaf certificates it signs for loopback (127.0.0.1, localhost)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


@dataclass(frozen=True)
class Leaf:
    cert: Path
    key: Path


def _openssl(*argv: str) -> None:
    subprocess.run(["openssl", *argv], check=True, capture_output=True, timeout=30)


def ca(directory: Path, name: str = "ca") -> Leaf:
    """A self-signed CA (one day)."""
    out = Leaf(directory / f"{name}.crt", directory / f"{name}.key")
    _openssl(
        "req", "-x509", *EC, "-days", "1", "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        "-keyout", str(out.key), "-out", str(out.cert),
    )  # fmt: skip
    return out


def leaf(directory: Path, name: str, signer: Leaf, usage: str = "serverAuth") -> Leaf:
    """A certificate for 127.0.0.1 and localhost signed by `signer`; `usage` serverAuth or
    clientAuth."""
    out = Leaf(directory / f"{name}.crt", directory / f"{name}.key")
    csr, ext = directory / f"{name}.csr", directory / f"{name}.ext"
    ext.write_text(
        f"subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage={usage}\n"
        "basicConstraints=CA:FALSE\n"
    )
    _openssl("req", "-new", *EC, "-subj", f"/CN={name}", "-keyout", str(out.key), "-out", str(csr))
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(signer.cert), "-CAkey", str(signer.key),
        "-CAcreateserial", "-days", "1", "-extfile", str(ext), "-out", str(out.cert),
    )  # fmt: skip
    return out
