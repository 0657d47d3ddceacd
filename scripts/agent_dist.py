"""Build the site agent's distributions from sites/agent/ (standard library only, offline):

- ``outbox-agent.pyz``: a one-file zipapp, run as ``python outbox-agent.pyz COMMAND …``;
- ``outbox_site_agent-VERSION-py3-none-any.whl``: a wheel named ``outbox-site-agent`` that
  installs the ``sites.agent`` package and an ``outbox-agent`` command, with no dependency.

    python scripts/agent_dist.py [--out dist]

Both are reproducible: every archive member gets the same fixed timestamp
(``SOURCE_DATE_EPOCH`` when set), so the same sources give the same bytes. The wheel is written
directly (a wheel is a zip with a ``.dist-info`` directory), so building needs no setuptools,
no network and no build isolation. Prints the paths of what it built.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import os
import re
import sys
import time
import zipapp
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
AGENT = REPO / "sites" / "agent"
DISTRIBUTION = "outbox-site-agent"
SUMMARY = "Outbox site agent: buffer notifications locally and forward them to central (standard library only)"
REQUIRES_PYTHON = ">=3.8"
DEFAULT_EPOCH = 1577836800  # 2020-01-01T00:00:00Z; zip cannot store dates before 1980

MAIN = """\
import sys

from sites.agent.cli import main

sys.exit(main())
"""


def agent_version() -> str:
    """``__version__`` from sites/agent/__init__.py, read without importing the package."""
    text = (AGENT / "__init__.py").read_text(encoding="utf-8")
    match = re.search(r'^__version__ = "([^"]+)"', text, re.MULTILINE)
    if not match:
        raise SystemExit("sites/agent/__init__.py has no __version__")
    return match.group(1)


def sources() -> list[tuple[str, bytes]]:
    """``(archive name, bytes)`` of every module of the agent, sorted."""
    return [(f"sites/agent/{path.name}", path.read_bytes()) for path in sorted(AGENT.glob("*.py"))]


def _timestamp() -> tuple[int, int, int, int, int, int]:
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", DEFAULT_EPOCH))
    moment = time.gmtime(max(epoch, 315532800))
    return (moment.tm_year, moment.tm_mon, moment.tm_mday, moment.tm_hour, moment.tm_min, moment.tm_sec)


def _add(archive: zipfile.ZipFile, name: str, data: bytes, *, executable: bool = False) -> None:
    info = zipfile.ZipInfo(name, date_time=_timestamp())
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = (0o755 if executable else 0o644) << 16
    archive.writestr(info, data)


def build_zipapp(out: Path) -> Path:
    """The zipapp at ``out/outbox-agent.pyz`` (with ``sites/__init__.py`` so it imports on every
    Python's zipimport)."""
    target = out / "outbox-agent.pyz"
    members = io.BytesIO()
    with zipfile.ZipFile(members, "w") as archive:
        _add(archive, "__main__.py", MAIN.encode())
        _add(archive, "sites/__init__.py", b"")
        for name, data in sources():
            _add(archive, name, data)
    # The interpreter line lets ./outbox-agent.pyz run by itself on POSIX hosts.
    members.seek(0)
    with open(target, "wb") as handle:
        handle.write(b"#!/usr/bin/env python3\n")
        handle.write(members.getvalue())
    target.chmod(0o755)
    zipapp.get_interpreter(str(target))  # raises if what we wrote is not a valid zipapp
    return target


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def build_wheel(out: Path) -> Path:
    """The wheel at ``out/outbox_site_agent-VERSION-py3-none-any.whl``.

    ``sites`` is left a namespace package (no ``sites/__init__.py``) so the wheel never claims
    a top-level package another distribution might own.
    """
    version = agent_version()
    dist_info = f"outbox_site_agent-{version}.dist-info"
    metadata = (
        "Metadata-Version: 2.1\n"
        f"Name: {DISTRIBUTION}\n"
        f"Version: {version}\n"
        f"Summary: {SUMMARY}\n"
        f"Requires-Python: {REQUIRES_PYTHON}\n"
        "Classifier: Programming Language :: Python :: 3\n"
        "Classifier: Operating System :: POSIX :: Linux\n"
        "Classifier: Operating System :: Microsoft :: Windows\n"
    )
    wheel = "Wheel-Version: 1.0\nGenerator: scripts/agent_dist.py\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    entry_points = "[console_scripts]\noutbox-agent = sites.agent.cli:main\n"
    files = [
        *sources(),
        (f"{dist_info}/METADATA", metadata.encode()),
        (f"{dist_info}/WHEEL", wheel.encode()),
        (f"{dist_info}/entry_points.txt", entry_points.encode()),
    ]
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in files)
    record += f"{dist_info}/RECORD,,\n"
    target = out / f"outbox_site_agent-{version}-py3-none-any.whl"
    with zipfile.ZipFile(target, "w") as archive:
        for name, data in files:
            _add(archive, name, data)
        _add(archive, f"{dist_info}/RECORD", record.encode())
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / "dist"), help="output directory (dist/)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for built in (build_zipapp(out), build_wheel(out)):
        print(built)
    return 0


if __name__ == "__main__":
    sys.exit(main())
