"""Build ``talaria-runner.pyz`` (operations.md 1.1): the runner's modules and its vendored wheels in one zip
archive behind a ``#!/usr/bin/env python3`` line, with a ``__main__`` that checks the interpreter first.

Reproducible: entries sorted, every timestamp ``SOURCE_DATE_EPOCH`` (else the commit's time), fixed modes and
compression, so two builds of one commit are byte-identical. The archive is refused when it holds a native file or
a hub package, or is larger than 5 MiB.
"""

from __future__ import annotations

import hashlib
import io
import os
import time
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from talaria.bundle.closure import module_file, runner_closure
from talaria.bundle.wheels import BundleError, wheels
from talaria.release import BUILD_RESOURCE, describe, git_output

NAME = "talaria-runner.pyz"
MAX_BYTES = 5 * 1024 * 1024
SHEBANG = b"#!/usr/bin/env python3\n"
NATIVE_SUFFIXES = (".so", ".pyd", ".dylib")
HUB_PACKAGES = ("fastapi", "starlette", "uvicorn", "pydantic", "pydantic_core", "argon2", "psycopg",
                "psycopg_binary", "psycopg_pool", "structlog", "prometheus_client")  # fmt: skip
HUB_MODULES = ("talaria/hub", "talaria/store", "talaria/lifecycle", "talaria/accounts", "talaria/chat",
               "talaria/teams", "talaria/settings.py", "talaria/bundle")  # fmt: skip
ZIP_EPOCH = 315532800  # 1980-01-01, the earliest time a zip entry can hold

# Parsable by Python 3.6: an old interpreter gets this message, not a syntax error in a module it cannot read.
MAIN = '''\
"""talaria-runner: a Talaria execution node in one file (operations.md 1)."""
import os
import sys

if sys.version_info < (3, 11):
    sys.stderr.write("talaria-runner needs Python 3.11 or newer (found %d.%d.%d)\\n" % tuple(sys.version_info[:3]))
    sys.exit(2)

_archive = os.path.dirname(os.path.abspath(__file__))
if os.path.abspath(sys.path[0]) != _archive:  # the archive first: nothing installed is used
    sys.path.insert(0, _archive)

from talaria.runner.cli import main  # noqa: E402

sys.exit(main(sys.argv[1:], prog=os.path.basename(_archive), launcher=(os.path.abspath(sys.executable), _archive)))
'''


@dataclass(frozen=True, slots=True)
class Built:
    path: Path
    sha256: str
    size: int
    version: str
    entries: int


def source_date_epoch(checkout: Path, environ: Mapping[str, str]) -> int:
    """``SOURCE_DATE_EPOCH``, else the time of the commit checked out."""
    given = environ.get("SOURCE_DATE_EPOCH", "").strip()
    if given:
        if not given.isdigit():
            raise BundleError(f"SOURCE_DATE_EPOCH must be a number of seconds, not {given!r}")
        return int(given)
    committed = git_output(checkout, "log", "-1", "--format=%ct")
    if not committed or not committed.isdigit():
        raise BundleError("not a git checkout: set SOURCE_DATE_EPOCH to the build's time")
    return int(committed)


def archive_entries(checkout: Path, cache: Path, version: str, say: Callable[[str], None]) -> dict[str, bytes]:
    """Every file of the archive by its path: ``__main__.py``, the runner's modules, ``talaria/build.txt`` and the
    vendored wheels' files."""
    src = checkout / "src"
    entries: dict[str, bytes] = {"__main__.py": MAIN.encode("utf-8")}
    for module in runner_closure(src):
        path = module_file(src, module)
        assert path is not None  # runner_closure found it
        entries[path.relative_to(src).as_posix()] = path.read_bytes()
    entries[f"talaria/{BUILD_RESOURCE}"] = f"{version}\n".encode()
    for wheel in wheels(checkout / "constraints.txt", cache, say):
        for name, data in wheel.files().items():
            if name in entries:
                raise BundleError(f"{wheel.name}: {name} is in the archive already")
            entries[name] = data
        say(f"vendored {wheel.name} {wheel.version} ({wheel.path.name})")
    return entries


def check_entries(names: list[str]) -> None:
    """Refuse a native file or a hub package (operations.md 1.1), naming it."""
    for name in names:
        if any(name.endswith(s) or f"{s}." in name.rsplit("/", 1)[-1] for s in NATIVE_SUFFIXES):
            raise BundleError(f"{name}: a native file cannot be in the single-file runner")
        top = name.split("/", 1)[0]
        if top.split("-", 1)[0].removesuffix(".py") in HUB_PACKAGES or name.startswith(HUB_MODULES):
            raise BundleError(f"{name}: a hub package cannot be in the single-file runner")


def archive_bytes(entries: Mapping[str, bytes], epoch: int) -> bytes:
    """The shebang line and a zip of ``entries``: sorted, one timestamp, regular files of mode 0644, deflated."""
    stamp = time.gmtime(max(epoch, ZIP_EPOCH))[:6]
    buffer = io.BytesIO()
    buffer.write(SHEBANG)
    with zipfile.ZipFile(buffer, "w") as archive:
        for name in sorted(entries):
            info = zipfile.ZipInfo(name, date_time=stamp)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = 3  # Unix: the mode below is read as such
            info.external_attr = 0o100644 << 16
            archive.writestr(info, entries[name], compresslevel=9)
    return buffer.getvalue()


def build(checkout: Path, out_dir: Path, cache: Path, say: Callable[[str], None], environ: Mapping[str, str]) -> Built:
    """Write ``out_dir/talaria-runner.pyz`` (mode 0755) and its ``.sha256`` (``sha256sum`` format), each atomically."""
    version = describe(checkout)
    epoch = source_date_epoch(checkout, environ)
    say(f"building {NAME} {version} (timestamps {epoch})")
    entries = archive_entries(checkout, cache, version, say)
    check_entries(list(entries))
    data = archive_bytes(entries, epoch)
    if len(data) > MAX_BYTES:
        raise BundleError(f"{NAME} would be {len(data)} bytes, more than the limit of {MAX_BYTES}")
    digest = hashlib.sha256(data).hexdigest()
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / NAME
    _write(target, data, 0o755)
    _write(out_dir / f"{NAME}.sha256", f"{digest}  {NAME}\n".encode(), 0o644)
    return Built(target, digest, len(data), version, len(entries))


def _write(path: Path, data: bytes, mode: int) -> None:
    partial = path.with_name(f".{path.name}.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        partial.chmod(mode)
        partial.replace(path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
