"""The runner's command line, one parser for ``talaria runner …`` and ``python3 talaria-runner.pyz …``
(operations.md 1.2): ``--config PATH`` runs the daemon, ``--version`` prints the build, ``install-service`` writes
a systemd unit (operations.md 2). Usage errors exit 2, like an invalid configuration."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from talaria.release import version_line
from talaria.runner.status_log import FORMATS


def seconds(text: str) -> float:
    """A whole number of seconds, 0 or more (argparse type)."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of seconds")
    return float(text)


def add_runner_options(parser: argparse.ArgumentParser) -> None:
    """The options of a running runner (operations.md 1.2), also taken by install-service for the unit."""
    drain = "a drain (SIGQUIT) stops what still runs after S seconds (default 900; 0: never)"
    parser.add_argument("--drain-timeout", type=seconds, default=None, metavar="S", help=drain)
    listen = "serve /metrics, /healthz and /readyz on [HOST:]PORT (HOST defaults to 127.0.0.1; off by default)"
    parser.add_argument("--metrics-listen", type=listen_address, default=None, metavar="[HOST:]PORT", help=listen)
    parser.add_argument("--log-format", choices=FORMATS, default=None, help="status lines as text (default) or JSON")


def listen_address(text: str) -> tuple[str, int]:
    """``--metrics-listen`` (argparse type)."""
    from talaria.runner.metrics_listener import ListenError, parse_listen

    try:
        return parse_listen(text)
    except ListenError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--metrics-listen: ")) from None


def runner_options(args: argparse.Namespace) -> tuple[str, ...]:
    """The runner options given, as command-line words (for a unit's ExecStart)."""
    words: list[str] = []
    if args.drain_timeout is not None:
        words += ["--drain-timeout", str(int(args.drain_timeout))]
    if args.metrics_listen is not None:
        host, port = args.metrics_listen
        words += ["--metrics-listen", f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    if args.log_format is not None:
        words += ["--log-format", args.log_format]
    return tuple(words)


def build_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Run a Talaria execution node (the runner daemon).")
    parser.add_argument("--version", action="version", version=version_line())
    parser.add_argument("--config", type=Path, default=None, help="runner.json (mode 600)")
    add_runner_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="install-service")
    install = sub.add_parser("install-service", help="write a systemd unit that runs this runner")
    install.add_argument("--config", type=Path, required=True, help="runner.json (mode 600)")
    mode = install.add_mutually_exclusive_group()
    mode.add_argument("--system", dest="system", action="store_const", const=True, default=None,
                      help="a system unit in /etc/systemd/system (root; the default as root)")  # fmt: skip
    mode.add_argument("--user", dest="system", action="store_const", const=False,
                      help="a unit of your own account in ~/.config/systemd/user (the default otherwise)")  # fmt: skip
    install.add_argument("--print", dest="print_only", action="store_true", help="print the unit; touch nothing")
    install.add_argument("--name", default=None, help="unit name (default talaria-runner-<runner id prefix>)")
    install.add_argument("--force", action="store_true", help="replace a different existing unit")
    add_runner_options(install)
    return parser


def default_launcher() -> tuple[str, ...]:
    """How a unit starts this runner when it was run as ``talaria runner``: the ``talaria`` executable, else this
    interpreter with ``-m talaria``; absolute paths, symbolic links kept (a venv's interpreter is one)."""
    first = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if first is not None and first.name == "talaria" and first.exists():
        return (os.path.abspath(first), "runner")
    return (os.path.abspath(sys.executable), "-m", "talaria", "runner")


def main(argv: Sequence[str], prog: str = "talaria runner", launcher: Sequence[str] | None = None) -> int:
    """``launcher``: the words that start this runner again (the single-file runner passes its interpreter and
    archive)."""
    args = build_parser(prog).parse_args(list(argv))
    if args.command == "install-service":
        from talaria.runner.install_service import Request, install_service

        words = tuple(launcher) if launcher is not None else default_launcher()
        options = runner_options(args)
        return install_service(
            Request(args.config, args.system, args.print_only, args.name, args.force, words, options)
        )
    if args.config is None:
        print(f"{prog}: --config PATH is required (runner.json, mode 600)", file=sys.stderr)
        return 2
    from talaria.runner.agent import DRAIN_TIMEOUT_S
    from talaria.runner.main import Options, run_runner

    drain = DRAIN_TIMEOUT_S if args.drain_timeout is None else args.drain_timeout
    return run_runner(args.config, Options(drain, args.log_format or "text", args.metrics_listen))
