"""The files in deploy/ an operator installs: the two-host configs load as they are once
their folders hold what they name (an operator changes addresses, nothing else), and the
systemd units pass ``systemd-analyze verify``. tests/partitions/test_deploy.py runs the
configs on three test hosts."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import trustme

from config import load_config
from tests.support import ROOT

DEPLOY = ROOT / "deploy"


def test_the_two_host_configs_load_with_their_files_in_place(tmp_path: Path) -> None:
    ca = trustme.CA()
    for role in ("primary", "backup"):
        etc = tmp_path / f"etc-{role}"
        (etc / "tls").mkdir(parents=True)
        issued = ca.issue_cert("amqha-a.example.net", "amqha-b.example.net")
        issued.private_key_pem.write_to_path(str(etc / "tls" / "server.key"))
        issued.cert_chain_pems[0].write_to_path(str(etc / "tls" / "server.pem"))
        ca.cert_pem.write_to_path(str(etc / "tls" / "ca.pem"))
        for name in ("app", "admin", "peering", "prometheus"):
            (etc / f"{name}.password").write_text(f"{name}-password-of-this-site\n")
        (etc / "pair.secret").write_text("a secret of at least sixteen characters\n")
        text = (DEPLOY / "two-hosts" / f"{role}.yaml").read_text()
        text = text.replace("/etc/amqha", str(etc)).replace("/var/lib/amqha", str(tmp_path))
        path = tmp_path / f"{role}.yaml"
        path.write_text(text)
        config = load_config(path, role=role)
        assert config.failover.role == role
        assert config.failover.peer_tls is not None and config.tls is not None
        assert config.management is not None and config.management.tls
        assert config.failover.witness and config.metrics_listen is not None


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is missing")
def test_the_systemd_units_verify(tmp_path: Path) -> None:
    """With ExecStart pointing at this checkout's amqha (where the units expect
    /opt/amqha), as an instance for the template."""
    amqha = Path(sys.executable).with_name("amqha")
    names = {"amqha@.service": "amqha@primary.service", "amqha-witness.service": None}
    paths = []
    for source, instance in names.items():
        text = (DEPLOY / "systemd" / source).read_text()
        assert "/opt/amqha/.venv/bin/amqha" in text
        text = text.replace("/opt/amqha/.venv/bin/amqha", str(amqha))
        path = tmp_path / (instance or source)
        path.write_text(text)
        paths.append(str(path))
    done = subprocess.run(
        ["systemd-analyze", "verify", *paths], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # Nothing it warns of either (an unknown key is a warning with exit status 0).
    assert "Unknown" not in done.stderr and "ignoring" not in done.stderr, done.stderr
