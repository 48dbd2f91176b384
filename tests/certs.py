"""Throwaway certificate authorities and certificates for TLS tests, made with ``openssl``.

``openssl ca`` rather than ``openssl x509 -req``: OpenSSL 3.0's ``x509`` cannot set a validity
in the past, which an expired certificate needs.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

_CA_CONFIG = """\
[ca]
default_ca = this
[this]
database = index.txt
new_certs_dir = .
certificate = ca.pem
private_key = ca.key
serial = serial
default_md = sha256
policy = anything
unique_subject = no
copy_extensions = copy
[anything]
commonName = supplied
organizationName = optional
"""


def _openssl(*args: str, cwd: Path) -> None:
    openssl = shutil.which("openssl")
    assert openssl is not None, "the openssl command is missing (make test installs it)"
    done = subprocess.run([openssl, *args], cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, f"openssl {args[0]} failed: {done.stderr}"


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path

    def pair(self) -> tuple[bytes, bytes]:
        """(certificate PEM, private key PEM), as ``tls_client_cert`` takes them."""
        return self.cert.read_bytes(), self.key.read_bytes()


class CertAuthority:
    """A CA in ``folder`` that issues certificates, valid now or in any window."""

    def __init__(self, folder: Path, name: str = "test-ca") -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "index.txt").write_text("")
        (folder / "serial").write_text("01\n")
        (folder / "ca.cnf").write_text(_CA_CONFIG)
        _openssl(
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-days", "2", "-subj", f"/CN={name}", "-keyout", "ca.key", "-out", "ca.pem",
            cwd=folder,
        )  # fmt: skip
        self.cert = folder / "ca.pem"
        self._n = 0

    def issue(
        self,
        subject: str,
        *,
        server: bool = False,
        start: str | None = None,
        end: str | None = None,
    ) -> Issued:
        """A certificate for ``subject`` (``/O=Acme/CN=name``); ``server``: for 127.0.0.1 and
        localhost; ``start``/``end`` (``YYYYMMDDHHMMSSZ``): its validity (default a day from
        now)."""
        self._n += 1
        stem = f"leaf{self._n}"
        extra = ["-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"] if server else []
        _openssl(
            "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-subj", subject, "-keyout", f"{stem}.key", "-out", f"{stem}.csr", *extra,
            cwd=self.folder,
        )  # fmt: skip
        window = ["-startdate", start, "-enddate", end] if start and end else ["-days", "1"]
        _openssl(
            "ca", "-batch", "-notext", "-config", "ca.cnf", "-in", f"{stem}.csr",
            "-out", f"{stem}.pem", *window,
            cwd=self.folder,
        )  # fmt: skip
        return Issued(self.folder / f"{stem}.pem", self.folder / f"{stem}.key")
