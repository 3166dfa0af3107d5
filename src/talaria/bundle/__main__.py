"""``python -m talaria.bundle [--out DIR] [--wheels DIR]`` (``make runner-bundle``): build the single-file runner
from this checkout and print where it went. Exit 1 when the build is refused, with the reason on one line."""

from __future__ import annotations

import argparse
import os
import sys
from importlib import resources
from pathlib import Path

from talaria.bundle.build import build
from talaria.bundle.wheels import BundleError


def main(argv: list[str]) -> int:
    package = resources.files("talaria")
    if not isinstance(package, Path) or not (package.parents[1] / "constraints.txt").is_file():
        print("talaria.bundle: run it from a source checkout (src/talaria beside constraints.txt)", file=sys.stderr)
        return 1
    checkout = package.parents[1]
    parser = argparse.ArgumentParser(prog="python -m talaria.bundle", description="Build dist/talaria-runner.pyz.")
    parser.add_argument("--out", type=Path, default=checkout / "dist", help="output directory (default dist)")
    parser.add_argument("--wheels", type=Path, default=checkout / "build" / "wheels", help="wheel cache directory")
    args = parser.parse_args(argv)
    try:
        built = build(checkout, args.out, args.wheels, lambda line: print(line, flush=True), os.environ)
    except BundleError as exc:
        print(f"runner bundle refused: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {built.path} ({built.size} bytes, {built.entries} files, version {built.version})")
    print(f"sha256 {built.sha256}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
