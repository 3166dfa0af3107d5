"""The ``talaria`` command line (web-api.md 8). Exit codes: 0 done, 1 refused or failed, 2 usage."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from talaria import __version__
from talaria.errors import SettingsError, TalariaError
from talaria.logs import configure_logging
from talaria.settings import Settings, load_offline_settings, load_settings
from talaria.store.interface import Row, Store
from talaria.store.open import SQLITE_NAME, open_sqlite, open_store

if TYPE_CHECKING:
    from talaria.hub.runners.registry import RunnerRegistry


def _offline_settings(args: argparse.Namespace) -> Settings:
    """The data directory and ``database.url`` as the hub reads them (flag, environment, ``--config``); the other
    settings are not read (web-api.md 8, scale.md 5)."""
    config: Path | None = getattr(args, "config", None)
    return load_offline_settings(flags={"data_dir": args.data_dir}, environ=os.environ, config_file=config)


def _store_for(args: argparse.Namespace, *, create: bool = False) -> Store:
    """The database the settings name: PostgreSQL when ``database.url`` says so, else the SQLite file of the data
    directory, which must exist unless ``create`` (its directory and files are tightened as the hub does)."""
    settings = _offline_settings(args)
    if settings.database_url:
        return open_store(dataclasses.replace(settings, database_pool_min=1, database_pool_max=2),
                          application_name="talaria/cli")  # fmt: skip
    data_dir = settings.data_dir
    if not create and not (data_dir / SQLITE_NAME).exists():
        raise TalariaError("not_found", f"no Talaria database in {data_dir} (start the hub once, or run db upgrade)")
    return open_sqlite(data_dir)


def cmd_hub(args: argparse.Namespace) -> int:
    from talaria.hub.server import run_hub

    flags = {"data_dir": args.data_dir, "hub.host": args.host, "hub.port": args.port,
             "hub.drain_timeout_s": args.drain_timeout, "hub.tls_cert": args.tls_cert,
             "hub.tls_key": args.tls_key}  # fmt: skip
    try:
        settings = load_settings(flags=flags, environ=os.environ, config_file=args.config)
    except SettingsError as exc:
        print(f"talaria hub: {exc}", file=sys.stderr)
        return 1
    return run_hub(settings)


def cmd_create_user(args: argparse.Namespace) -> int:
    from talaria.accounts.rules import check_tenant, parse_allow_flags
    from talaria.accounts.service import Accounts
    from talaria.clock import SystemClock
    from talaria.store import migrations

    line = sys.stdin.readline()
    password = line.removesuffix("\n").removesuffix("\r")
    store = _store_for(args, create=True)
    try:
        migrations.upgrade(store)
        account = Accounts(store, SystemClock()).create(
            username=args.username,
            password=password,
            role=args.role,
            tenant=check_tenant(args.tenant),
            allowed_profiles=parse_allow_flags(args.allow or []),
            can_manage_team=args.team,
        )
    finally:
        store.close()
    print(f"created {account.role} {account.username} in tenant {account.tenant}")
    return 0


def cmd_set_user(args: argparse.Namespace) -> int:
    """``talaria admin set-user USERNAME [--enable|--disable] [--role ROLE] [--password-stdin]``: recovery from the
    command line (web-api.md 8). The tenant's last enabled admin is refused like in the web API (``last_admin``)."""
    from talaria.accounts.service import Accounts
    from talaria.clock import SystemClock
    from talaria.store import migrations

    changes: dict[str, object] = {}
    if args.enabled is not None:
        changes["enabled"] = args.enabled
    if args.role is not None:
        changes["role"] = args.role
    if args.password_stdin:
        changes["password"] = sys.stdin.readline().removesuffix("\n").removesuffix("\r")
    if not changes:
        print("talaria: say what to change: --enable, --disable, --role or --password-stdin", file=sys.stderr)
        return 2
    store = _store_for(args)
    try:
        migrations.upgrade(store)
        accounts = Accounts(store, SystemClock())
        current = accounts.get(args.username)
        if current is None:
            raise TalariaError("not_found", f"no account {args.username}")
        account = accounts.update(args.username, current.tenant, changes)
    finally:
        store.close()
    state = "enabled" if account.enabled else "disabled"
    print(f"updated {account.username} in tenant {account.tenant}: {account.role}, {state}")
    return 0


def cmd_runners(args: argparse.Namespace) -> int:
    """``talaria admin runners list|register|disable|drain|rotate-token`` for scripted set-ups (runner-protocol.md
    2, operations.md 3.1, 4.1)."""
    import json

    from talaria.clock import SystemClock
    from talaria.hub.runners.registry import RunnerRegistry, parse_registration

    store = _store_for(args)
    registry = RunnerRegistry(store, SystemClock())
    try:
        if args.runners_command == "list":
            for record in registry.all(args.tenant):
                state = "enabled" if record.enabled else "disabled"
                profiles = ",".join(record.allowed_profiles)
                print(f"{record.id}  {state:8}  source={record.source}  name={record.name!r}  profiles={profiles}")
            return 0
        if args.runners_command == "disable":
            if not registry.disable(args.id, args.tenant):
                print(f"talaria: no runner {args.id} in tenant {args.tenant}", file=sys.stderr)
                return 1
            print(f"disabled runner {args.id}; it stops at its next request")
            return 0
        if args.runners_command == "drain":
            return _drain_runner(store, registry, args.id, args.tenant)
        if args.runners_command == "rotate-token":
            if not registry.request_rotation(args.id, args.tenant):
                print(f"talaria: no enabled runner {args.id} in tenant {args.tenant}", file=sys.stderr)
                return 1
            print(f"rotation requested for runner {args.id}; it takes a new token at its next poll")
            return 0
        body: dict[str, object] = {
            "name": args.name,
            "source": args.source,
            "allowedProfiles": args.profile,
            "serverURL": args.server_url,
            "artifactRoots": args.artifact_root or [],
            "allowInsecureLan": args.allow_insecure_lan,
        }
        if args.hermes_url:
            body["hermesURL"] = args.hermes_url
        fields = parse_registration(body, default_server_url=args.server_url)
        out = Path(args.out)
        partial = out.with_name(f".{out.name}.{os.getpid()}.partial")
        try:  # made before the runner exists: a path that cannot be written registers nothing
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:
            print(f"talaria: cannot write {out}: {exc.strerror}; nothing was registered", file=sys.stderr)
            return 1
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                registration = registry.register(args.tenant, fields)
                handle.write(json.dumps(registration.config, indent=2) + "\n")
            partial.replace(out)  # an earlier file at --out is kept until the new one is complete
        finally:
            partial.unlink(missing_ok=True)
        out.chmod(0o600)
        print(str(out))
        return 0
    finally:
        store.close()


def _drain_runner(store: Store, registry: RunnerRegistry, runner_id: str, tenant: str) -> int:
    """PostgreSQL: drain the runner's connection state and wake the replica holding its poll. SQLite: the hub's
    states live in its memory, so a request is recorded for the hub to apply at the runner's next request."""
    from talaria.clock import SystemClock

    record = registry.get(runner_id)
    if record is None or record.tenant != tenant or not record.enabled:
        print(f"talaria: no enabled runner {runner_id} in tenant {tenant}", file=sys.stderr)
        return 1
    now = SystemClock().now_ms()
    if store.dialect != "postgresql":
        registry.request_drain(runner_id, tenant, now)
        print(f"drain requested for runner {runner_id}; the hub applies it at the runner's next request")
        return 0
    with store.write() as tx:
        row = tx.one("runner_conn_drain_current", runner_id=runner_id, now=now)
        if row is not None:
            tx.one("runner_conn_wake", runner_id=runner_id)
    if row is None:
        print(f"talaria: runner {runner_id} is not connected", file=sys.stderr)
        return 1
    print(f"runner {runner_id} is draining: it takes no new work and stops once what runs has finished")
    return 0


def cmd_audit_verify(args: argparse.Namespace) -> int:
    from talaria.lifecycle.audit import verify

    store = _store_for(args)
    try:
        report = verify(store)
    finally:
        store.close()
    print(report.line(), file=sys.stdout if report.ok else sys.stderr)
    return 0 if report.ok else 1


def cmd_db(args: argparse.Namespace) -> int:
    from talaria.lifecycle.audit import seal_all
    from talaria.store import migrations

    settings = _offline_settings(args)
    data_dir = settings.data_dir
    if args.action == "copy":
        return _db_copy(args, settings)
    if args.action == "backup":
        return _db_backup(args, settings)
    if args.action in ("restore", "mark-restored"):
        return _db_restore(args, settings)
    if args.to is not None and not isinstance(args.to, int):
        print("talaria db: --to is a version number here (a database URL only for db copy)", file=sys.stderr)
        return 1
    if args.action == "downgrade" and not args.yes:
        print("talaria db downgrade is destructive: it drops tables and their data; add --yes", file=sys.stderr)
        return 1
    if args.action == "status" and not settings.database_url and not (data_dir / SQLITE_NAME).exists():
        for name in migrations.SETS:  # report without creating a database as a side effect
            count = len(migrations.available("sqlite", name))
            print(f"{name}: version 0 of {count} ({count} pending; no database in {data_dir} yet)")
        return 0
    store = _store_for(args, create=args.action == "upgrade")
    try:
        if args.action == "downgrade" and settings.database_url and _live_replicas(store):
            print("talaria db downgrade: a hub uses this database; stop every replica first", file=sys.stderr)
            return 1
        if args.action == "status":
            have, want = migrations.current(store), migrations.latest(store)
            for name in migrations.SETS:
                state = (
                    "up to date"
                    if have[name] == want[name]
                    else f"{want[name] - have[name]} pending"
                    if have[name] < want[name]
                    else "newer than this release"
                )
                print(f"{name}: version {have[name]} of {want[name]} ({state})")
            if settings.database_url:
                print(_postgres_status(settings.database_url, len(_live_replicas(store))))
                for line in _cluster_status(store):
                    print(line)
        elif args.action == "upgrade":
            applied = migrations.upgrade(store)
            for item in applied:
                print(f"applied {item}")
            print("database is up to date" if not applied else f"{len(applied)} migration(s) applied")
        else:
            try:
                seal_all(store)  # PostgreSQL: events a stopped hub left unsealed are chained before steps go
                assert isinstance(args.to, int)  # main() refuses a downgrade without --to, and a URL was refused above
                undone = migrations.downgrade(store, args.set, args.to)
            except ValueError as exc:
                print(f"talaria db downgrade: {exc}", file=sys.stderr)
                return 1
            for item in undone:
                print(f"reverted {item}")
            print(f"{args.set} is now at version {args.to}")
    finally:
        store.close()
    return 0


def _db_copy(args: argparse.Namespace, settings: Settings) -> int:
    """Scale.md 5: a stopped SQLite hub's data directory into an empty PostgreSQL database."""
    from talaria.clock import SystemClock
    from talaria.db_copy import CopyRefused, copy_to_postgres

    url = args.to
    if not isinstance(url, str) or not url.startswith(("postgresql://", "postgres://")):
        print("talaria db copy: --to names the target: postgresql://...", file=sys.stderr)
        return 1
    if settings.database_url:
        print("talaria db copy: copies a SQLite hub; database.url is already set", file=sys.stderr)
        return 1
    try:
        report = copy_to_postgres(settings.data_dir, url, SystemClock().now_ms(), lambda line: print(line, flush=True))
    except CopyRefused as exc:
        print(f"talaria db copy: {exc}", file=sys.stderr)
        return 1
    except TalariaError as exc:
        print(f"talaria db copy: {exc.message}", file=sys.stderr)
        return 1
    for table, rows in report.counts.items():
        print(f"{table} {rows} rows")
    print(report.chain.line())
    print("next: set database.url (or TALARIA_DATABASE_URL) to the target for the hub, then start it")
    return 0


def _db_backup(args: argparse.Namespace, settings: Settings) -> int:
    """Operations.md 7.1: a consistent copy of a SQLite hub's database and audit key, while it serves."""
    from talaria.db_backup import BackupRefused, backup_sqlite

    if settings.database_url:
        print("talaria db backup: on PostgreSQL use base backups with WAL archiving, or pg_dump --format=custom "
              "(operations.md 7.3)", file=sys.stderr)  # fmt: skip
        return 1
    if args.to is None:
        print("talaria db backup: --to FILE names the backup to write", file=sys.stderr)
        return 1
    try:
        made = backup_sqlite(settings.data_dir, Path(str(args.to)), lambda line: print(line, flush=True))
    except BackupRefused as exc:
        print(f"talaria db backup: {exc}; nothing was written", file=sys.stderr)
        return 1
    except TalariaError as exc:
        print(f"talaria db backup: {exc.message}; nothing was written", file=sys.stderr)
        return 1
    print(made.line())
    return 0


RESTORE_ON_POSTGRES = (
    "on PostgreSQL restore with its own tools (pg_restore, or a base backup with WAL archiving) into a database no "
    "replica uses, then run talaria db mark-restored --yes before starting replicas (operations.md 7.3)"
)


def _db_restore(args: argparse.Namespace, settings: Settings) -> int:
    """Operations.md 7.1-7.3: ``restore`` a SQLite hub from a backup, or ``mark-restored`` a PostgreSQL database
    restored with its own tools; both offline, both leave the marker the first start acts on (7.2)."""
    from talaria.clock import SystemClock
    from talaria.db_restore import RestoreRefused, mark_restored, restore_sqlite

    name = f"talaria db {args.action}"
    source = getattr(args, "from_file", None)
    if args.action == "restore" and settings.database_url:
        print(f"{name}: {RESTORE_ON_POSTGRES}", file=sys.stderr)
        return 1
    if args.action == "mark-restored" and not settings.database_url:
        print(f"{name}: marks a PostgreSQL database; on SQLite use talaria db restore --from FILE", file=sys.stderr)
        return 1
    if args.action == "restore" and source is None:
        print(f"{name}: --from FILE names the backup to restore", file=sys.stderr)
        return 1
    if not args.yes:
        what = f"the database in {settings.data_dir} with {source}" if args.action == "restore" else "this database"
        print(f"{name} replaces {what} and ends unfinished work at the next start; add --yes", file=sys.stderr)
        return 1
    say = lambda line: print(line, flush=True)  # noqa: E731
    now = SystemClock().now_ms()
    try:
        if args.action == "restore":
            done = restore_sqlite(settings.data_dir, Path(str(source)), resume_unfinished=args.resume_unfinished,
                                  now_ms=now, say=say)  # fmt: skip
        else:
            store = _store_for(args)
            try:
                done = mark_restored(store, resume_unfinished=args.resume_unfinished, now_ms=now, say=say)
            finally:
                store.close()
    except (RestoreRefused, TalariaError) as exc:
        unchanged = "nothing was changed" if args.action == "restore" else "the database was not marked"
        print(f"{name}: {getattr(exc, 'message', None) or exc}; {unchanged}", file=sys.stderr)
        return 1
    for line in done.lines():
        print(line)
    return 0


def _db_target(text: str) -> int | str:
    """``--to``: a version for downgrade, a database URL for copy."""
    return int(text) if text.isdigit() else text


def _live_replicas(store: Store) -> list[Row]:
    """The hub replicas of a PostgreSQL database that are live (renewed within 20 s, scale.md 1)."""
    from talaria.clock import SystemClock
    from talaria.hub.replica import LIVE_MS

    with store.read() as tx:
        return tx.all("hub_replica_live", since=SystemClock().now_ms() - LIVE_MS)


def _cluster_status(store: Store) -> list[str]:
    """Scale.md 5's other ``db status`` lines on PostgreSQL: live replicas, role holders, the unsealed count."""
    from talaria.clock import SystemClock

    now = SystemClock().now_ms()
    live = _live_replicas(store)
    with store.read() as tx:
        roles = tx.all("hub_role_lease_list")
        waiting = tx.one("audit_pending_count")
    lines = [f"replica {r['id']}: release {r['release']}, settings {r['settings_digest'][:16]}" for r in live]
    lines += [f"role {r['role']}: {r['holder'] if r['holder'] and r['expires_at'] > now else 'free'}" for r in roles]
    lines.append(f"audit: {waiting['n'] if waiting else 0} event(s) not yet sealed")
    return lines


def _postgres_status(url: str, live: int) -> str:
    """Scale.md 5's extra ``db status`` line on PostgreSQL: the server and how many hub replicas run on it."""
    from talaria.store.postgres.admin import check_server

    version = check_server(url)
    hubs = "no hub is running on it" if not live else f"{live} hub replica(s) running on it"
    return f"server: PostgreSQL {version // 10000}.{version % 10000}; {hubs}"


def cmd_demo(args: argparse.Namespace) -> int:
    from talaria.demo import run_demo

    return run_demo(keep_serving=not args.exit, port=args.port, keep=args.keep)


def cmd_model_server(args: argparse.Namespace) -> int:
    from talaria.testing.model_server import main as model_server

    return model_server(["--host", args.host, "--port", str(args.port), *(["--demo"] if args.demo else [])])


def cmd_install_plugin(args: argparse.Namespace) -> int:
    from talaria.hermes_plugin.install import InstallError, install_plugin

    try:
        changes = install_plugin(Path(args.hermes_home), hermes_bin=Path(args.hermes_bin) if args.hermes_bin else None)
    except InstallError as exc:
        print(f"talaria hermes install-plugin: {exc}", file=sys.stderr)
        return 1
    for line in changes:
        print(line)
    done = "plugin up to date; restart Hermes to load it"
    print(done if changes else "nothing to do: the plugin is installed and enabled")
    return 0


CONFIG_HELP = "TOML settings file (its data_dir and database.url, as the hub reads them)"


def build_parser() -> argparse.ArgumentParser:
    from talaria.store.migrations import SETS  # the sets a downgrade may name

    parser = argparse.ArgumentParser(prog="talaria", description="Run Hermes agents from one control plane.")
    parser.add_argument("--version", action="version", version=f"talaria {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    hub = sub.add_parser("hub", help="run the hub")
    hub.add_argument("--data-dir", default=None, help="data directory (default ./talaria-data)")
    hub.add_argument("--host", default=None, help="listen address (default 127.0.0.1)")
    hub.add_argument("--port", type=int, default=None, help="listen port (default 8700; 0 picks one)")
    hub.add_argument("--config", type=Path, default=None, help="TOML settings file")
    drain_help = "on SIGTERM, wait up to S seconds for running turns (default 120; 0: stop at once)"
    hub.add_argument("--drain-timeout", type=int, default=None, metavar="S", help=drain_help)
    hub.add_argument("--tls-cert", default=None, metavar="FILE", help="serve HTTPS with this PEM certificate chain")
    hub.add_argument("--tls-key", default=None, metavar="FILE", help="the certificate's private key (mode 600)")
    hub.set_defaults(func=cmd_hub)

    admin = sub.add_parser("admin", help="administration").add_subparsers(dest="admin_command", required=True)
    create = admin.add_parser("create-user", help="create an account; the password is read from standard input")
    create.add_argument("--data-dir", default=None)
    create.add_argument("--config", type=Path, default=None, help=CONFIG_HELP)
    create.add_argument("--username", required=True)
    create.add_argument("--role", required=True, choices=["admin", "user"])
    create.add_argument("--tenant", default="default")
    create.add_argument("--allow", action="append", metavar="SOURCE:PROFILE", help="an allowed profile (repeatable)")
    create.add_argument("--team", action="store_true", help="may manage team bots")
    create.set_defaults(func=cmd_create_user)

    set_user = admin.add_parser("set-user", help="enable, disable, change the role or the password of an account")
    set_user.add_argument("username")
    set_user.add_argument("--data-dir", default=None)
    set_user.add_argument("--config", type=Path, default=None, help=CONFIG_HELP)
    state = set_user.add_mutually_exclusive_group()
    state.add_argument("--enable", dest="enabled", action="store_const", const=True, default=None)
    state.add_argument("--disable", dest="enabled", action="store_const", const=False)
    set_user.add_argument("--role", choices=["admin", "user"], default=None)
    set_user.add_argument("--password-stdin", action="store_true", help="read the new password from standard input")
    set_user.set_defaults(func=cmd_set_user)

    runners = admin.add_parser("runners", help="execution nodes").add_subparsers(dest="runners_command", required=True)
    listing = runners.add_parser("list", help="list the registered runners")
    register = runners.add_parser("register", help="register a runner and write its runner.json (mode 600)")
    disable = runners.add_parser("disable", help="disable a runner for good")
    drain = runners.add_parser("drain", help="drain a runner: no new work; it stops once what runs has finished")
    rotate = runners.add_parser("rotate-token", help="ask a runner to rotate its token (it does not lock out a thief)")
    for command in (listing, register, disable, drain, rotate):
        command.add_argument("--data-dir", default=None)
        command.add_argument("--config", type=Path, default=None, help=CONFIG_HELP)
        command.add_argument("--tenant", default="default")
        command.set_defaults(func=cmd_runners)
    register.add_argument("--name", required=True)
    register.add_argument("--source", default="local")
    register.add_argument("--profile", action="append", required=True, help="an allowed profile (repeatable)")
    register.add_argument("--server-url", required=True, help="the hub URL as the node reaches it")
    register.add_argument("--hermes-url", default=None, help="loopback Hermes URL (default http://127.0.0.1:9119)")
    register.add_argument("--artifact-root", action="append", help="a directory export may read (repeatable)")
    register.add_argument("--allow-insecure-lan", action="store_true", help="allow plain http to a LAN hub")
    register.add_argument("--out", required=True, help="where to write runner.json")
    disable.add_argument("id")
    drain.add_argument("id")
    rotate.add_argument("id")

    audit = sub.add_parser("audit", help="audit chain").add_subparsers(dest="audit_command", required=True)
    verify = audit.add_parser("verify", help="recompute the hash chain")
    verify.add_argument("--data-dir", default=None)
    verify.add_argument("--config", type=Path, default=None, help=CONFIG_HELP)
    verify.set_defaults(func=cmd_audit_verify)

    db = sub.add_parser("db", help="database migrations")
    db.add_argument("action", choices=["status", "upgrade", "downgrade", "copy", "backup", "restore", "mark-restored"])
    db.add_argument("--data-dir", default=None)
    db.add_argument("--config", type=Path, default=None, help=CONFIG_HELP)
    db.add_argument("--set", choices=list(SETS), help="migration set (downgrade)")
    to_help = "target version (downgrade); target postgresql:// URL (copy); the file to write (backup)"
    db.add_argument("--to", type=_db_target, help=to_help)
    db.add_argument("--from", dest="from_file", type=Path, default=None, help="the backup to restore (restore)")
    db.add_argument("--yes", action="store_true", help="confirm a downgrade, restore or mark-restored")
    db.add_argument(
        "--resume-unfinished",
        action="store_true",
        help="restore, mark-restored: leave unfinished jobs, turns and goals to go on (they may run twice)",
    )
    db.set_defaults(func=cmd_db)

    # `talaria runner …` is handed whole to the runner's own parser (main() below), the one the single-file runner
    # uses too (operations.md 1.2); this entry only lists it in the help.
    sub.add_parser("runner", help="run an execution node (talaria runner --help for its options)", add_help=False)

    demo = sub.add_parser("demo", help="run the product end to end on a temporary data directory")
    demo.add_argument("--exit", action="store_true", help="stop the hub when the demo is done")
    demo.add_argument("--port", type=int, default=0, help="hub port (default: any free port)")
    demo.add_argument("--keep", action="store_true", help="keep the data directory (it holds the demo's secrets)")
    demo.set_defaults(func=cmd_demo)

    hermes = sub.add_parser("hermes", help="the local Hermes").add_subparsers(dest="hermes_command", required=True)
    plugin = hermes.add_parser("install-plugin", help="install and enable Talaria's plugin in a Hermes home")
    plugin.add_argument("--hermes-home", required=True, help="the Hermes home (HERMES_HOME) hermes serve runs in")
    plugin.add_argument("--hermes-bin", default=None, help="hermes executable, used to enable the plugin if needed")
    plugin.set_defaults(func=cmd_install_plugin)

    testing = sub.add_parser("testing", help="test helpers").add_subparsers(dest="testing_command", required=True)
    model = testing.add_parser("model-server", help="serve the scripted OpenAI-compatible model (tests, demo)")
    model.add_argument("--host", default="127.0.0.1")
    model.add_argument("--port", type=int, default=0, help="0 picks a free port")
    model.add_argument("--demo", action="store_true", help="add the demo's whoami rule")
    model.set_defaults(func=cmd_model_server)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["runner"]:  # the runner keeps to its status lines (and stays light)
        from talaria.runner.cli import main as runner_main

        return runner_main(arguments[1:])
    parser = build_parser()
    args = parser.parse_args(arguments)
    if args.command == "db" and args.action == "downgrade" and (args.set is None or args.to is None):
        parser.error("db downgrade needs --set NAME --to N --yes")
    if args.command == "testing":  # test helpers print their own status lines
        configure_logging("WARNING")
    else:
        configure_logging()
    try:
        code: int = args.func(args)
    except TalariaError as exc:
        print(f"talaria: {exc.message}", file=sys.stderr)
        return 1
    except SettingsError as exc:
        print(f"talaria: {exc}", file=sys.stderr)
        return 1
    return code
