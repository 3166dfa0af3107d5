"""Which build of Talaria this is (operations.md 1.2): the release, with ``+<commit>`` for an untagged build.

The single-file runner carries its version in the packaged resource ``talaria/build.txt``, written by
``make runner-bundle`` and read through ``importlib.resources`` (a zip archive has no files beside its modules). A
source checkout asks git; an installed package without either is its release. The hub never needs this module.
"""

from __future__ import annotations

import functools
import subprocess
from importlib import resources
from pathlib import Path

from talaria import __version__

PROTOCOL = 1
BUILD_RESOURCE = "build.txt"
_GIT_TIMEOUT_S = 5.0


@functools.cache
def runner_version() -> str:
    """``0.1.0`` for a tagged build, ``0.1.0+<12 hex>`` (``.dirty`` with uncommitted changes) for another."""
    try:
        built = resources.files("talaria").joinpath(BUILD_RESOURCE).read_text(encoding="utf-8").strip()
    except OSError:
        built = ""
    if built:
        return built
    package = resources.files("talaria")
    if isinstance(package, Path) and (package.parents[1] / ".git").exists():  # src/talaria in a checkout
        return describe(package.parents[1])
    return __version__


def version_line() -> str:
    """What ``--version`` prints: ``talaria-runner <version> (protocol 1)``."""
    return f"talaria-runner {runner_version()} (protocol {PROTOCOL})"


@functools.cache
def user_agent() -> str:
    """The runner's ``User-Agent`` (shown by the hub as ``runnerVersion``)."""
    return f"talaria-runner/{runner_version()}"


def describe(checkout: Path) -> str:
    """The version of the commit checked out in ``checkout``: the release when the commit is tagged
    ``v<release>``, else the release and the commit; ``.dirty`` marks uncommitted changes to tracked files."""
    commit = git_output(checkout, "rev-parse", "--short=12", "HEAD")
    if commit is None:
        return __version__
    tagged = git_output(checkout, "tag", "--points-at", "HEAD", "--list", f"v{__version__}")
    dirty = git_output(checkout, "status", "--porcelain", "--untracked-files=no")
    version = __version__ if tagged else f"{__version__}+{commit}"
    if dirty:
        version += "+dirty" if tagged else ".dirty"
    return version


def git_output(checkout: Path, *args: str) -> str | None:
    """The stripped output of one git command, or None when git is missing or fails."""
    try:
        done = subprocess.run(  # noqa: S603 - git on PATH with fixed arguments, in a source checkout only
            ["git", "-C", str(checkout), *args],  # noqa: S607
            capture_output=True,
            text=True,
            timeout=_GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None
