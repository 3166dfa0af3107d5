"""The runner's third-party packages, vendored from wheels at ``constraints.txt``'s versions (operations.md 1.1).

Only pure-Python wheels (``py3-none-any``) are accepted: another tag fails the build naming the package. Wheels
are fetched once with ``pip download`` into a cache directory and read from there by later builds, so that a
rebuild needs no network.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# httpx and websockets with their dependencies (DESIGN.md 6: the runner imports nothing else)
VENDORED = ("httpx", "websockets", "httpcore", "h11", "anyio", "sniffio", "idna", "certifi", "typing_extensions")
_CONSTRAINT = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)")


class BundleError(Exception):
    """The build cannot go on; the message says why (one line)."""


@dataclass(frozen=True, slots=True)
class Wheel:
    name: str
    version: str
    path: Path

    def files(self) -> dict[str, bytes]:
        """Every file of the wheel by its path in the archive, licence files and metadata included."""
        with zipfile.ZipFile(self.path) as archive:
            return {info.filename: archive.read(info) for info in archive.infolist() if not info.is_dir()}


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def pinned_versions(constraints: Path) -> dict[str, str]:
    """``name==version`` lines of a constraints file, by normalised name."""
    found: dict[str, str] = {}
    for line in constraints.read_text(encoding="utf-8").splitlines():
        match = _CONSTRAINT.match(line.strip())
        if match:
            found[normalise(match.group(1))] = match.group(2)
    return found


def check_tag(filename: str) -> None:
    """Refuse a wheel whose tag is not pure Python 3 (``py3-none-any``, ``py2.py3-none-any``)."""
    stem = filename.removesuffix(".whl")
    parts = stem.split("-")
    name = parts[0]
    if len(parts) < 5:
        raise BundleError(f"{name}: {filename} is not a wheel file name")
    python, abi, platform = parts[-3:]
    if "py3" not in python.split(".") or abi != "none" or platform != "any":
        raise BundleError(f"{name}: only py3-none-any wheels may be vendored, got {python}-{abi}-{platform}")


def wheels(constraints: Path, cache: Path, say: Callable[[str], None]) -> list[Wheel]:
    """The vendored packages' wheels at their pinned versions, downloaded into ``cache`` when missing there."""
    pins = pinned_versions(constraints)
    missing = [name for name in VENDORED if normalise(name) not in pins]
    if missing:
        raise BundleError(f"{', '.join(missing)}: not pinned in {constraints.name}")
    cache.mkdir(parents=True, exist_ok=True)
    found: list[Wheel] = []
    for name in VENDORED:
        version = pins[normalise(name)]
        path = _cached(cache, name, version) or _download(cache, name, version, say)
        check_tag(path.name)
        found.append(Wheel(name, version, path))
    return found


def _cached(cache: Path, name: str, version: str) -> Path | None:
    prefix = f"{normalise(name)}-{version}-".lower()
    matches = sorted(p for p in cache.glob("*.whl") if p.name.lower().startswith(prefix))
    return matches[0] if matches else None


def _download(cache: Path, name: str, version: str, say: Callable[[str], None]) -> Path:
    """``pip download`` of the pure-Python wheel into a fresh directory, then moved into the cache (a build running
    beside this one never sees half a file)."""
    say(f"downloading {name}=={version} (py3-none-any)")
    with tempfile.TemporaryDirectory(dir=cache) as scratch:
        command = [
            sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
            "--platform", "any", "--implementation", "py", "--abi", "none", "--python-version", "3.11",
            "--dest", scratch, f"{name}=={version}",
        ]  # fmt: skip
        done = subprocess.run(  # noqa: S603 - this interpreter's pip, fixed arguments and pinned versions
            command, capture_output=True, text=True, check=False, timeout=300
        )
        fetched = sorted(Path(scratch).glob("*.whl"))
        if done.returncode != 0 or len(fetched) != 1:
            raise BundleError(f"{name}: no py3-none-any wheel of version {version} could be downloaded")
        check_tag(fetched[0].name)
        target = cache / fetched[0].name
        fetched[0].replace(target)
    return target
