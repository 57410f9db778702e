"""Static checks of the Docker deployment files (no Docker engine needed).

- ``docker/compose.yaml``: Flower images of the installed Flower version, TLS and
  SuperNode authentication on every Flower component, one distinct partition-id and
  one private key per SuperNode, one SuperExec per SuperLink/SuperNode, secrets that
  ``docker/gen-certs.sh`` writes;
- every flag the compose file passes to ``flower-superlink`` / ``flower-supernode`` /
  ``flower-superexec`` also appears in the commands of ``docs/deploy.md`` and is
  accepted by the installed command (its ``--help``), and so is every flag of those
  documented commands;
- ``docker/Dockerfile`` builds on ``flwr/superexec`` of the same Flower version;
- ``docker/gen-certs.sh`` makes a certificate chain that passes strict X.509
  verification and a TLS handshake, and EC keys in OpenSSH format that Flower loads.

The end-to-end counterpart (processes on 127.0.0.1) is ``tests/deploy/test_deploy_tls.py``.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import yaml  # PyYAML: a dependency of flwr itself

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
COMPOSE = DOCKER / "compose.yaml"
DOCKERFILE = DOCKER / "Dockerfile"
DEPLOY_MD = REPO / "docs" / "deploy.md"
GEN_CERTS = DOCKER / "gen-certs.sh"
VENV_BIN = Path(sys.executable).parent

FLWR_VERSION = version("flwr")
COMMANDS = ("flower-superlink", "flower-supernode", "flower-superexec")
IMAGE_ROLE = {"flwr/superlink": "flower-superlink", "flwr/supernode": "flower-supernode"}
APP_WORKDIR = "/app"  # working directory of Flower's images

FLAG_RE = re.compile(r"--[a-z0-9][a-z0-9-]*")
DOC_IMAGE_RE = re.compile(r"(flwr/superlink|flwr/supernode|flwr/superexec|mmfl-flwr-superexec):\S+")
DOC_IMAGE_ROLE = {
    **IMAGE_ROLE,
    "flwr/superexec": "flower-superexec",
    "mmfl-flwr-superexec": "flower-superexec",
}


# --------------------------------------------------------------------- helpers
def _compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict) and isinstance(data.get("services"), dict), COMPOSE
    return data


def _services() -> dict[str, dict[str, Any]]:
    return _compose()["services"]


def _role(svc: dict[str, Any]) -> str:
    """The Flower command a compose service runs (by its image or Dockerfile)."""
    image = str(svc.get("image", ""))
    for prefix, cmd in IMAGE_ROLE.items():
        if image.startswith(prefix + ":"):
            return cmd
    build = svc.get("build")
    assert build, f"service with neither a Flower image nor a build: {svc}"
    dockerfile = (COMPOSE.parent / build["context"] / build["dockerfile"]).resolve()
    assert dockerfile == DOCKERFILE.resolve(), dockerfile
    return "flower-superexec"  # docker/Dockerfile's ENTRYPOINT (checked below)


def _flags(args: list[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in args if a.startswith("--")]


def _arg(args: list[str], flag: str) -> str | None:
    """The value of ``flag`` in an argument list (``--f v`` or ``--f=v``)."""
    for i, a in enumerate(args):
        if a == flag:
            return args[i + 1] if i + 1 < len(args) else None
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def _interpolate(value: str) -> str:
    """Compose's ``${VAR:-default}`` / ``${VAR-default}`` with no variable set."""
    value = re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*:?-([^}]*)\}", r"\1", value)
    assert "$" not in value, f"unsupported interpolation in {value!r}"
    return value


def _compose_commands() -> dict[str, tuple[str, list[str]]]:
    """service name -> (Flower command, its arguments, defaults interpolated)."""
    out = {}
    for name, svc in _services().items():
        cmd = svc.get("command")
        assert isinstance(cmd, list) and all(isinstance(a, str) for a in cmd), (
            f"{name}: command must be a list of strings (exec form), got {cmd!r}"
        )
        out[name] = (_role(svc), [_interpolate(a) for a in cmd])
    return out


def _fenced_blocks(text: str) -> list[tuple[str, str]]:
    """``(language, body)`` of every fenced code block of a Markdown text."""
    blocks, lang, body = [], None, []
    for line in text.splitlines():
        fence = re.match(r"^\s*```\s*([\w-]*)\s*$", line)
        if fence and lang is None:
            lang, body = fence.group(1), []
        elif fence:
            blocks.append((lang, "\n".join(body) + "\n"))
            lang = None
        elif lang is not None:
            body.append(line)
    assert lang is None, "unclosed code block"
    return blocks


def _doc_commands() -> list[tuple[str, list[str]]]:
    """Every ``flower-*`` command in the fenced code blocks of docs/deploy.md."""
    found = []
    for lang, block in _fenced_blocks(DEPLOY_MD.read_text()):
        if lang not in ("bash", "sh", "shell", "console"):
            continue
        joined = re.sub(r"\\\n", " ", block)
        for line in joined.splitlines():
            line = line.split(" #", 1)[0].strip()
            if not line or line.startswith("#"):
                continue
            try:
                words = shlex.split(line)
            except ValueError:
                continue
            while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
                words = words[1:]  # VAR=value prefixes
            if words and words[0] in COMMANDS:
                found.append((words[0], words[1:]))
            elif words[:2] == ["docker", "run"]:
                # docker run [options] IMAGE ARGS...: ARGS go to the image's command.
                for j, w in enumerate(words):
                    image = DOC_IMAGE_RE.fullmatch(w)
                    if image:
                        assert w.rsplit(":", 1)[1] == FLWR_VERSION, f"docs: image {w}"
                        found.append((DOC_IMAGE_ROLE[image.group(1)], words[j + 1 :]))
                        break
    return found


@pytest.fixture(scope="module")
def help_flags() -> dict[str, set[str]]:
    """The flags each installed Flower command accepts, from its ``--help``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLWR_")}
    env["FLWR_DISABLE_UPDATE_CHECK"] = "1"
    env["PATH"] = os.pathsep.join([str(VENV_BIN), env.get("PATH", "")])
    out = {}
    procs = {}
    for cmd in COMMANDS:  # all at once: each is a Python start-up
        exe = VENV_BIN / cmd
        if not exe.exists():
            pytest.skip(f"{cmd} is not installed next to {sys.executable}")
        procs[cmd] = subprocess.Popen(
            [str(exe), "--help"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,
        )
    for cmd, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"{cmd} --help: {proc.returncode}\n{stderr[-2000:]}"
        usage = stdout.split("options:", 1)[0]  # the usage lines list every flag
        out[cmd] = set(FLAG_RE.findall(usage)) | set(FLAG_RE.findall(stdout))
        assert "--help" in out[cmd] and len(out[cmd]) > 5, stdout[:2000]
    return out


# ------------------------------------------------------------------ versions
def test_images_use_the_installed_flower_version() -> None:
    assert FLWR_VERSION == "1.42.0", f"installed flwr {FLWR_VERSION}"
    for name, svc in _services().items():
        image = str(svc.get("image", ""))
        if image.startswith("flwr/"):
            repo, _, tag = image.partition(":")
            assert repo in IMAGE_ROLE, f"{name}: unexpected Flower image {image}"
            assert tag == FLWR_VERSION, f"{name}: {image} is not Flower {FLWR_VERSION}"
        else:
            assert "build" in svc, f"{name}: image {image!r} is neither Flower's nor built"
            if image:
                assert image.endswith(":" + FLWR_VERSION), f"{name}: tag {image}"
    froms = re.findall(r"^FROM\s+(\S+)", DOCKERFILE.read_text(), flags=re.M)
    assert froms == [f"flwr/superexec:{FLWR_VERSION}"], froms
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    from packaging.requirements import Requirement

    flwr_reqs = [d for d in pyproject["project"]["dependencies"] if Requirement(d).name == "flwr"]
    assert flwr_reqs, "pyproject.toml does not depend on flwr"

    for req in flwr_reqs:
        assert Requirement(req).specifier.contains(FLWR_VERSION), (req, FLWR_VERSION)


def test_dockerfile_runs_superexec_with_the_package() -> None:
    text = DOCKERFILE.read_text()
    assert re.search(r'^ENTRYPOINT \["flower-superexec"\]', text, flags=re.M), text
    for src in re.findall(r"^COPY\s+(?:--\S+\s+)*(.+?)\s+\S+$", text, flags=re.M):
        for path in src.split():
            assert (REPO / path).exists(), f"Dockerfile copies missing {path}"
    # No runtime dependency installation: everything is installed at build time.
    assert "--allow-runtime-dependency-installation" not in text


# --------------------------------------------------------------------- flags
def test_compose_flags_are_documented_and_accepted(help_flags: dict[str, set[str]]) -> None:
    doc = _doc_commands()
    doc_flags: dict[str, set[str]] = {c: set() for c in COMMANDS}
    for cmd, args in doc:
        doc_flags[cmd] |= set(_flags(args))
    assert doc_flags["flower-superlink"] and doc_flags["flower-supernode"], (
        f"docs/deploy.md has no flower-superlink/flower-supernode commands: {doc}"
    )
    for name, (cmd, args) in _compose_commands().items():
        flags = set(_flags(args))
        assert flags, f"{name}: no flags"
        unknown = flags - help_flags[cmd]
        assert not unknown, f"{name}: {cmd} does not accept {sorted(unknown)}"
        undocumented = flags - doc_flags[cmd]
        assert not undocumented, (
            f"{name}: {sorted(undocumented)} of {cmd} are not in docs/deploy.md's commands"
        )
    for cmd, args in doc:
        unknown = set(_flags(args)) - help_flags[cmd]
        assert not unknown, f"docs/deploy.md: {cmd} does not accept {sorted(unknown)}"


def test_tls_and_authentication_everywhere() -> None:
    services = _services()
    by_role: dict[str, list[str]] = {}
    for name, (cmd, args) in _compose_commands().items():
        by_role.setdefault(cmd, []).append(name)
        mounted = {s["target"]: s["source"] for s in services[name].get("secrets", [])}
        # Every file flag points at a secret mounted into this container.
        for flag in (
            "--ssl-ca-certfile",
            "--ssl-certfile",
            "--ssl-keyfile",
            "--root-certificates",
            "--auth-supernode-private-key",
        ):
            value = _arg(args, flag)
            if value is not None:
                target = value if value.startswith("/") else f"{APP_WORKDIR}/{value}"
                assert target in mounted, f"{name}: {flag} {value} is not mounted"
        if cmd == "flower-superlink":
            for flag in (
                "--ssl-ca-certfile",
                "--ssl-certfile",
                "--ssl-keyfile",
                "--enable-supernode-auth",
            ):
                assert flag in args, f"{name}: missing {flag}"
            assert "--insecure" not in args, name
            assert _arg(args, "--isolation") == "process", name
        elif cmd == "flower-supernode":
            for flag in (
                "--root-certificates",
                "--auth-supernode-private-key",
                "--superlink",
                "--node-config",
            ):
                assert _arg(args, flag), f"{name}: missing {flag}"
            assert "--insecure" not in args, name
            assert _arg(args, "--isolation") == "process", name
    assert len(by_role.get("flower-superlink", [])) == 1, by_role
    assert len(by_role.get("flower-supernode", [])) >= 3, by_role


def test_supernodes_have_distinct_partitions_and_own_keys() -> None:
    from flwr.common.config import parse_config_args

    services = _services()
    commands = _compose_commands()
    secrets = _compose()["secrets"]
    link = [n for n, (c, _) in commands.items() if c == "flower-superlink"][0]
    link_port = _arg(commands[link][1], "--port")
    nodes = {n: a for n, (c, a) in commands.items() if c == "flower-supernode"}
    execs = {n: a for n, (c, a) in commands.items() if c == "flower-superexec"}

    partitions, key_files, key_sources = [], set(), set()
    for name, args in nodes.items():
        cfg = parse_config_args([_arg(args, "--node-config")])
        partitions.append(int(cfg["partition-id"]))
        assert int(cfg["num-partitions"]) == len(nodes), (name, cfg)
        address = _arg(args, "--superlink")
        assert address == f"{link}:{link_port}", (
            f"{name}: --superlink {address} is not the SuperLink {link}:{link_port}"
        )
        key_target = _arg(args, "--auth-supernode-private-key")
        source = {s["target"]: s["source"] for s in services[name]["secrets"]}[
            f"{APP_WORKDIR}/{key_target}"
        ]
        key_sources.add(source)
        key_files.add(secrets[source]["file"])
        # Only its own key: no other SuperNode key is mounted into it.
        other_keys = [
            s["source"]
            for s in services[name]["secrets"]
            if s["source"] != source and s["source"].startswith("supernode-")
        ]
        assert not other_keys, f"{name} also mounts {other_keys}"
        # A SuperExec runs its ClientApps, on its Runtime API port.
        runtime = f"{name}:{_arg(args, '--port')}"
        assert [e for e, a in execs.items() if _arg(a, "--runtime-api-address") == runtime], (
            f"no SuperExec with --runtime-api-address {runtime}"
        )
    assert sorted(partitions) == list(range(len(nodes))), partitions
    assert len(key_sources) == len(key_files) == len(nodes), (key_sources, key_files)
    assert [
        e
        for e, a in execs.items()
        if _arg(a, "--runtime-api-address") == f"{link}:{link_port}"
        and _arg(a, "--root-certificates")
    ], "no TLS SuperExec for the SuperLink"
    # The secrets are the files docker/gen-certs.sh -o docker/certs -n N writes.
    expected = {
        "./certs/ca.crt",
        "./certs/server.pem",
        "./certs/server.key",
        *(f"./certs/supernode-{i}" for i in range(len(nodes))),
    }
    assert {s["file"] for s in secrets.values()} == expected


def test_docs_walk_through_registration_and_tls() -> None:
    text = DEPLOY_MD.read_text()
    for needle in (
        "flwr supernode register",
        "flwr supernode list",
        "root-certificates",
        "flwr run",
        "flwr ls",
        "gen-certs.sh",
        "docker compose",
        "--enable-supernode-auth",
        "--auth-supernode-private-key",
        "finished:completed",
    ):
        assert needle in text, f"docs/deploy.md does not mention {needle}"
    doc = _doc_commands()
    links = [a for c, a in doc if c == "flower-superlink"]
    assert links and all("--insecure" not in a for a in links), links
    assert all("--enable-supernode-auth" in a for a in links), links
    node_cfgs = [_arg(a, "--node-config") for c, a in doc if c == "flower-supernode"]
    assert len({cfg for cfg in node_cfgs if cfg}) >= 3, node_cfgs
    # The config.toml snippet is valid TOML with an absolute root-certificates path.
    snippets = [body for lang, body in _fenced_blocks(text) if lang == "toml"]
    assert snippets, "no config.toml snippet"
    conns = [
        c
        for s in snippets
        for c in tomllib.loads(s).get("superlink", {}).values()
        if isinstance(c, dict)
    ]
    assert conns and all(Path(c["root-certificates"]).is_absolute() for c in conns), conns
    assert all(not c.get("insecure", False) for c in conns), conns
    # docs/deploy.md is what the e2e test exercises.
    assert (REPO / "tests" / "deploy" / "test_deploy_tls.py").is_file()


# ------------------------------------------------------------------ gen-certs
@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None or shutil.which("ssh-keygen") is None:
        pytest.skip("gen-certs.sh needs openssl and ssh-keygen")
    out = tmp_path_factory.mktemp("certs")
    res = subprocess.run(
        [
            "bash",
            str(GEN_CERTS),
            "-o",
            str(out),
            "-n",
            "2",
            "-H",
            "link.example.test",
            "-H",
            "192.0.2.7",
            "-k",
            "extra",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    return out


def test_gen_certs_writes_what_compose_mounts(certs: Path) -> None:
    for name in (
        "ca.crt",
        "ca.key",
        "server.pem",
        "server.key",
        "supernode-0",
        "supernode-0.pub",
        "supernode-1",
        "supernode-1.pub",
        "extra",
        "extra.pub",
    ):
        assert (certs / name).is_file(), name
    for key in ("ca.key", "server.key", "supernode-0", "extra"):
        assert (certs / key).stat().st_mode & 0o077 == 0, f"{key} is readable by others"
    # Running it again keeps everything (keys can be added without a new CA).
    before = {p.name: p.read_bytes() for p in certs.iterdir()}
    res = subprocess.run(
        ["bash", str(GEN_CERTS), "-o", str(certs), "-n", "3"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    after = {p.name: p.read_bytes() for p in certs.iterdir()}
    assert {k: after[k] for k in before} == before
    assert set(after) - set(before) == {"supernode-2", "supernode-2.pub"}


def test_gen_certs_chain_is_strictly_valid(certs: Path) -> None:
    res = subprocess.run(
        [
            "openssl",
            "verify",
            "-x509_strict",
            "-CAfile",
            str(certs / "ca.crt"),
            str(certs / "server.pem"),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    san = subprocess.run(
        ["openssl", "x509", "-in", str(certs / "server.pem"), "-noout", "-ext", "subjectAltName"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    ).stdout
    for name in (
        "DNS:localhost",
        "DNS:superlink",
        "DNS:link.example.test",
        "IP Address:127.0.0.1",
        "IP Address:192.0.2.7",
    ):
        assert name in san, san
    # A TLS handshake on loopback with Python's strict verification (the default
    # from Python 3.13 on, e.g. in the flwr/superexec image).
    for host in ("127.0.0.1", "localhost"):
        assert _handshake(certs, host) == "ok"


def _handshake(certs: Path, server_hostname: str) -> str:
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(certs / "server.pem", certs / "server.key")
    client_ctx = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    client_ctx.verify_flags |= ssl.VERIFY_X509_STRICT
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(10)
        port = listener.getsockname()[1]

        def serve() -> None:
            try:
                conn, _ = listener.accept()
                with server_ctx.wrap_socket(conn, server_side=True) as tls:
                    tls.recv(1)
            except (OSError, ssl.SSLError):
                pass

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        with (
            socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
            client_ctx.wrap_socket(raw, server_hostname=server_hostname) as tls,
        ):
            tls.sendall(b"x")
        thread.join(timeout=10)
    return "ok"


def test_gen_certs_keys_are_what_flower_accepts(certs: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import (
        load_ssh_private_key,
        load_ssh_public_key,
    )
    from flwr.supercore.primitives.asymmetric import uses_nist_ec_curve

    def pairs() -> Iterator[tuple[Path, Path]]:
        for name in ("supernode-0", "supernode-1", "extra"):
            yield certs / name, certs / f"{name}.pub"

    seen = set()
    for private, public in pairs():
        key = load_ssh_private_key(private.read_bytes(), None)
        pub = load_ssh_public_key(public.read_bytes())
        assert isinstance(key, ec.EllipticCurvePrivateKey), private
        assert isinstance(pub, ec.EllipticCurvePublicKey) and uses_nist_ec_curve(pub)
        assert key.public_key().public_numbers() == pub.public_numbers(), private
        seen.add(pub.public_numbers().x)
    assert len(seen) == 3, "gen-certs.sh wrote the same key twice"
