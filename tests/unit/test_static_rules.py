"""Rules checked by reading the source tree (lifecycle.md 1, conventions 2 and 7, lifecycle.md 6.7)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import talaria
from talaria.errors import STATUS_BY_CODE, StoreUnavailable, TalariaError, all_codes
from talaria.store.queries import parse

PACKAGE = Path(talaria.__file__).resolve().parent
STORE = PACKAGE / "store"
LIFECYCLE = PACKAGE / "lifecycle"

# The tables of lifecycle.md section 2 that only talaria.lifecycle writes.
LIFECYCLE_TABLES = (
    "task",
    "dispatch",
    "hermes_job",
    "hermes_result",
    "idempotency_key",
    "execution_evidence",
    "reconciliation",
    "audit_event",
)
_TABLES = "|".join(LIFECYCLE_TABLES)
# INSERT [OR x] INTO t, REPLACE INTO t, UPDATE [OR x] t, DELETE FROM t; quoted names too.
WRITE_SQL = re.compile(
    rf"""\b(?:INSERT(?:\s+OR\s+\w+)?\s+INTO|REPLACE\s+INTO|UPDATE(?:\s+OR\s+\w+)?|DELETE\s+FROM)\s+["`\[]?({_TABLES})["`\]]?(?=[\s(;]|$)""",
    re.IGNORECASE,
)


def python_files(root: Path = PACKAGE) -> list[Path]:
    files = sorted(root.rglob("*.py"))
    assert files
    return files


def rel(path: Path) -> str:
    return path.relative_to(PACKAGE.parent).as_posix()


def string_constants(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def writing_queries(pattern: re.Pattern[str] = WRITE_SQL) -> dict[str, str]:
    """Named queries (of every dialect) that INSERT, UPDATE or DELETE a table ``pattern`` names (by default the
    lifecycle tables) -> the table."""
    found: dict[str, str] = {}
    files = sorted((STORE / "sql").rglob("*.sql"))
    assert files
    for path in files:
        for query in parse(path.stem, path.read_text(encoding="utf-8")):
            match = pattern.search(query.sql)
            if match:
                found[query.name] = match.group(1).lower()
    return found


def users_outside(writers: set[str], package: Path) -> list[str]:
    """Modules outside ``package`` naming one of ``writers``, with the names they use."""
    offenders = []
    for path in python_files():
        if path.is_relative_to(package):
            continue
        used = writers.intersection(string_constants(path))
        if used:
            offenders.append(f"{rel(path)}: {sorted(used)}")
    return offenders


# ---------------------------------------------------------------- (a) one state machine


def test_the_write_scan_finds_the_known_writers() -> None:
    """Guards the scan itself: if it found nothing, the rule below would pass vacuously."""
    found = writing_queries()
    for name, table in {
        "task_insert": "task",
        "task_update": "task",
        "dispatch_insert": "dispatch",
        "dispatch_finish": "dispatch",
        "job_insert": "hermes_job",
        "job_update": "hermes_job",
        "result_insert": "hermes_result",
        "idempotency_put": "idempotency_key",
        "idempotency_prune": "idempotency_key",
        "evidence_insert": "execution_evidence",
        "reconciliation_insert": "reconciliation",
        "audit_insert": "audit_event",
    }.items():
        assert found.get(name) == table, name
    # reads and other tables are not writers
    for name in ("job_get", "task_get", "audit_scan", "tenant_ensure", "account_insert", "audit_head_set"):
        assert name not in found


def test_the_write_pattern() -> None:
    assert WRITE_SQL.search("INSERT INTO hermes_job (id) VALUES (1)")
    assert WRITE_SQL.search("insert or replace into task(id) values (1)")
    assert WRITE_SQL.search('UPDATE "dispatch" SET status = 1')
    assert WRITE_SQL.search("DELETE FROM audit_event WHERE seq = 2")
    assert not WRITE_SQL.search("SELECT * FROM task")
    assert not WRITE_SQL.search("UPDATE task_queue SET x = 1")
    assert not WRITE_SQL.search("INSERT INTO account (username) VALUES (1)")


def test_only_the_lifecycle_package_uses_the_writers_of_lifecycle_tables() -> None:
    assert users_outside(set(writing_queries()), LIFECYCLE) == []


def test_only_the_orchestrator_finishes_dispatches_and_records_reconciliations() -> None:
    """DESIGN.md principle 2: only reconcile_hermes moves a Dispatch to a terminal state."""
    users: dict[str, set[str]] = {"dispatch_finish": set(), "reconciliation_insert": set()}
    for path in python_files():
        constants = set(string_constants(path))
        for name, where in users.items():
            if name in constants:
                where.add(rel(path))
    assert users["dispatch_finish"] == {"talaria/lifecycle/orchestrator.py"}
    assert users["reconciliation_insert"] == {"talaria/lifecycle/orchestrator.py"}


# The tables of the team migration set (team-tools.md 3.6) that only talaria.teams writes (3: "a static test").
TEAMS = PACKAGE / "teams"
TEAM_TABLES = ("bot_team", "team", "team_member", "goal", "assignment", "assignment_run", "member_session",
               "team_delivery", "team_request", "team_evidence")  # fmt: skip
TEAM_WRITE_SQL = re.compile(WRITE_SQL.pattern.replace(_TABLES, "|".join(TEAM_TABLES)), re.IGNORECASE)


def test_the_team_write_scan_finds_the_known_writers() -> None:
    found = writing_queries(TEAM_WRITE_SQL)
    assert found.get("bot_team_set_permission") == "bot_team"
    assert "bot_team_get" not in found
    assert TEAM_WRITE_SQL.search("UPDATE goal SET status = 'running'")
    assert not TEAM_WRITE_SQL.search("UPDATE goal_x SET a = 1")
    assert not TEAM_WRITE_SQL.search("INSERT INTO bot (id) VALUES (1)")


def test_only_the_teams_package_uses_the_writers_of_team_tables() -> None:
    assert users_outside(set(writing_queries(TEAM_WRITE_SQL)), TEAMS) == []


def test_no_raw_sql_writes_lifecycle_tables_outside_the_store() -> None:
    offenders = []
    for path in python_files():
        if path.is_relative_to(STORE):
            continue
        for text in string_constants(path):
            match = WRITE_SQL.search(text)
            if match:
                offenders.append(f"{rel(path)}: {match.group(0)!r}")
    assert offenders == []


STATE_NAMES = frozenset(
    {"QUEUED", "LEASED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"}
    | {"DRAFT", "PENDING_APPROVAL", "APPROVED", "REJECTED", "DISPATCHED"}
)


def _state_definitions(path: Path) -> list[str]:
    """Enum classes with state members, and literal collections of two or more state names."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):  # by value: a goal's RUNNING = "running" is not a job state
            members = {
                item.value.value
                for item in node.body
                if isinstance(item, ast.Assign) and isinstance(item.value, ast.Constant)
            }
            if members & STATE_NAMES:
                found.append(f"class {node.name} at line {node.lineno}")
        elif isinstance(node, ast.Set | ast.List | ast.Tuple):
            names = {e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in STATE_NAMES}
            if len(names) >= 2:
                found.append(f"{sorted(names)} at line {node.lineno}")
    return found


def test_the_state_scan_sees_the_lifecycle_definitions() -> None:
    assert _state_definitions(LIFECYCLE / "machine.py")


def test_no_other_package_defines_queue_lease_or_task_states() -> None:
    offenders = []
    for path in python_files():
        if path.is_relative_to(LIFECYCLE):
            continue
        offenders += [f"{rel(path)}: {found}" for found in _state_definitions(path)]
    assert offenders == []


def test_runtime_handlers_do_not_import_task_or_dispatch_writers() -> None:
    """Scenario 24: Runtime API handlers never call Task or Dispatch writers (they go through the engine)."""
    forbidden = {"talaria.lifecycle.tasks", "talaria.lifecycle.orchestrator", "talaria.lifecycle.journal"}
    for path in python_files(PACKAGE / "hub" / "runtime"):
        imported = _imported_modules(path)
        assert not imported & forbidden, rel(path)
        assert "reconcile_hermes" not in path.read_text(encoding="utf-8"), rel(path)


# ---------------------------------------------------------------- (c) drivers in their adapters


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
            in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            out.add(node.args[0].value)
    return out


def test_the_import_scan_sees_sqlite3_in_its_adapter() -> None:
    assert "sqlite3" in _imported_modules(STORE / "sqlite.py")


def test_sqlite3_is_imported_only_by_the_sqlite_store() -> None:
    """The hub's store adapter, and the runner's own receipts file (runner-protocol.md section 9)."""
    importers = sorted(
        rel(path)
        for path in python_files()
        if any(m == "sqlite3" or m.startswith("sqlite3.") for m in _imported_modules(path))
    )
    assert importers == ["talaria/runner/receipts.py", "talaria/store/sqlite.py"]


def test_psycopg_is_imported_only_by_the_postgresql_store() -> None:
    """Scale.md 2.2: psycopg and its pool are the PostgreSQL backend's alone (its driver errors end there)."""
    importers = sorted(
        rel(path)
        for path in python_files()
        if any(m.split(".")[0] in ("psycopg", "psycopg_pool") for m in _imported_modules(path))
    )
    assert importers
    assert all(name.startswith("talaria/store/postgres/") for name in importers), importers


# ---------------------------------------------------------------- (d) time comes from the clock

CLOCK_FREE = ("lifecycle", "store", "hub", "accounts")
FORBIDDEN_TEXT = ("time.time(", "time.time_ns(", "datetime.now(", "datetime.utcnow(", "datetime.today(", "date.today(")


def _wall_clock_calls(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "time":
            found += [f"from time import {a.name}" for a in node.names if a.name in ("time", "time_ns")]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            owner_name = (
                owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
            )
            if (owner_name, node.func.attr) in {
                ("time", "time"),
                ("time", "time_ns"),
                ("time", "localtime"),
                ("time", "gmtime"),
                ("datetime", "now"),
                ("datetime", "utcnow"),
                ("datetime", "today"),
                ("date", "today"),
            }:
                found.append(f"{owner_name}.{node.func.attr}() at line {node.lineno}")
    return found


@pytest.mark.parametrize("folder", CLOCK_FREE)
def test_no_wall_clock_reads_outside_the_clock(folder: str) -> None:
    offenders = []
    for path in python_files(PACKAGE / folder):
        text = path.read_text(encoding="utf-8")
        offenders += [f"{rel(path)}: {t}" for t in FORBIDDEN_TEXT if t in text]
        offenders += [f"{rel(path)}: {c}" for c in _wall_clock_calls(path)]
    assert offenders == []


def test_the_clock_scan_would_see_a_wall_clock_read(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import time\nfrom datetime import datetime\nx = time.time()\ny = datetime.now()\n")
    assert len(_wall_clock_calls(sample)) == 2
    sample.write_text("import time\nx = time.perf_counter()\n")
    assert _wall_clock_calls(sample) == []


# ---------------------------------------------------------------- (e) error codes and statuses

SPEC_STATUS = {
    # lifecycle.md 6.7
    "invalid_request": 400,
    "idempotency_key_required": 400,
    "idempotency_key_invalid": 400,
    "proxy_identity_missing": 401,
    "proxy_identity_invalid": 401,
    "proxy_timestamp_skew": 401,
    "proxy_signature_invalid": 401,
    "peer_not_allowed": 403,
    "role_forbidden": 403,
    "self_approval_forbidden": 403,
    "not_found": 404,
    "job_not_found": 404,
    "method_not_allowed": 405,
    "payload_too_large": 413,
    "dispatch_missing": 409,
    "not_approved": 409,
    "already_leased": 409,
    "invalid_transition": 409,
    "lease_expired": 409,
    "stale_lease": 409,
    "lease_mismatch": 409,
    "terminal_conflict": 409,
    "reconcile_rejected": 409,
    "idempotency_key_reused": 422,
    "internal_error": 500,
    "store_unavailable": 503,
    # web-api.md 2, 3, 5
    "invalid_credentials": 401,
    "login_throttled": 429,
    "unauthenticated": 401,
    "csrf_failed": 403,
    "admin_required": 403,
    "not_author": 403,
    "account_exists": 409,
    "weak_password": 400,
    # chat.md 3.6
    "chat_stream_limit": 429,
    # team-tools.md 9
    **{code: 400 for code in ("invalid_members", "invalid_assignment_bot", "invalid_assignment_dependency",
                              "bot_name_mismatch")},
    **{code: 403 for code in ("team_tools_forbidden", "team_forbidden", "goal_forbidden", "bot_creator_required",
                              "user_instruction_required", "team_permission_forbidden")},
    **{code: 409 for code in (
        "duplicate_team_name", "bot_unavailable", "bot_in_use", "team_busy", "goal_exists", "goal_not_active",
        "goal_criteria_changed", "goal_incomplete", "goal_checks_missing", "goal_not_resumable", "goal_still_running",
        "assignment_not_reviewable", "assignment_not_cancellable", "assignment_retry_limit", "assignment_limit",
        "team_limit", "goal_limit", "idempotency_conflict", "team_tools_unavailable")},
    "runner_grant_expired": 410,
    "runner_payload_limit": 413,
    "runner_call_limit": 429,
    # operations.md 8
    "runner_draining": 503,
    "hub_draining": 503,
    "runner_rotation_not_due": 409,
    "runner_feature_required": 409,
}  # fmt: skip


@pytest.mark.parametrize(("code", "status"), sorted(SPEC_STATUS.items()))
def test_spec_codes_have_the_spec_status(code: str, status: int) -> None:
    assert STATUS_BY_CODE.get(code) == status
    error = TalariaError(code, "message")
    assert error.status == status
    assert error.body() == {"code": code, "error": "message"}


@pytest.mark.parametrize("status", [403, 409])
def test_binding_mismatch_is_403_or_409(status: int) -> None:
    assert "binding_mismatch" in all_codes()
    assert TalariaError("binding_mismatch", "m", status=status).status == status


def test_binding_mismatch_needs_an_explicit_status() -> None:
    with pytest.raises(ValueError):
        TalariaError("binding_mismatch", "m")


def test_unknown_codes_are_refused() -> None:
    with pytest.raises(ValueError):
        TalariaError("no_such_code", "m")


def test_codes_are_lower_snake_case() -> None:
    assert all(re.fullmatch(r"[a-z][a-z0-9]*(_[a-z0-9]+)*", code) for code in all_codes())


def test_store_unavailable_is_503_with_retry_after() -> None:
    error = StoreUnavailable()
    assert (error.code, error.status) == ("store_unavailable", 503)
    assert error.headers == {"Retry-After": "1"}
    assert isinstance(error, TalariaError)


# --- the runner stays light (DESIGN.md 6) --------------------------------------------------------------------------

RUNNER_PACKAGES = ("runner", "hermes")
RUNNER_THIRD_PARTY = frozenset({"httpx", "websockets"})
RUNNER_TALARIA = (
    "talaria.clock", "talaria.canonical", "talaria.runner", "talaria.hermes", "talaria.wire", "talaria.runner_json",
    "talaria.text_rules", "talaria.timeouts", "talaria.release",
)  # fmt: skip


def test_the_runner_imports_only_the_standard_library_httpx_websockets_and_its_own_modules() -> None:
    import ast
    import sys

    src = Path(__file__).resolve().parents[2] / "src" / "talaria"
    for package in RUNNER_PACKAGES:
        for path in sorted((src / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names: list[str] = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom):
                    names = [node.module or ""]
                for name in names:
                    top = name.split(".")[0]
                    ok = top in sys.stdlib_module_names or top in RUNNER_THIRD_PARTY or name == "talaria"
                    ok = ok or any(name == m or name.startswith(m + ".") for m in RUNNER_TALARIA)
                    assert ok, f"{path.relative_to(src)} imports {name}"


def test_the_single_file_runner_s_closure_is_the_runner_s_allowed_modules() -> None:
    from talaria.bundle.closure import runner_closure

    closure = runner_closure(PACKAGE.parent)
    assert {"talaria", "talaria.runner.cli", "talaria.runner.main", "talaria.hermes.ws", "talaria.release"} <= set(
        closure
    )
    outside = [
        m for m in closure if m != "talaria" and not any(m == a or m.startswith(a + ".") for a in RUNNER_TALARIA)
    ]
    assert outside == []


def test_loading_the_whole_runner_pulls_in_no_hub_module_pydantic_or_fastapi() -> None:
    import subprocess
    import sys

    code = (
        "import sys, pkgutil, importlib, talaria.runner, talaria.hermes\n"
        "for pkg in (talaria.runner, talaria.hermes):\n"
        "    for info in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + '.'):\n"
        "        importlib.import_module(info.name)\n"
        "heavy = ('pydantic', 'fastapi', 'starlette', 'uvicorn', 'structlog', 'argon2', 'prometheus_client')\n"
        "hub = ('talaria.hub', 'talaria.store', 'talaria.lifecycle', 'talaria.accounts', 'talaria.settings')\n"
        "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in heavy or m.startswith(hub))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == ""


# --- no package cycles; who may import whom (issue 11) -------------------------------------------------------------

# package -> packages it must never import (prefixes of module names)
IMPORT_RULES: dict[str, tuple[str, ...]] = {
    "talaria.hermes": ("talaria.runner",),
    "talaria.hub": (
        "talaria.runner",
    ),  # the runner daemon; the shared talaria.wire and talaria.runner_json are neutral
    "talaria.runner": ("talaria.hub", "talaria.lifecycle", "talaria.store", "talaria.accounts"),
    "talaria.lifecycle": ("talaria.hub", "talaria.runner"),
    "talaria.store": ("talaria.hub", "talaria.lifecycle", "talaria.runner", "talaria.accounts"),
    "talaria.accounts": ("talaria.hub", "talaria.lifecycle", "talaria.runner"),
    "talaria.chat": ("talaria.hub", "talaria.runner", "talaria.teams"),
    "talaria.teams": ("talaria.hub", "talaria.runner"),
}


def imports_of(path: Path) -> set[str]:
    """Every talaria module ``path`` imports, at module level or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name == "talaria" or name.startswith("talaria.")}


def module_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(module: str) -> str:
    """``talaria.hub.runners.channels`` -> ``talaria.hub``; a top module is its own package."""
    return ".".join(module.split(".")[:2])


def test_the_import_scan_sees_the_hub_import_the_lifecycle() -> None:
    assert "talaria.lifecycle.engine" in imports_of(PACKAGE / "hub" / "resources.py")


def test_no_package_imports_what_its_rules_forbid() -> None:
    broken = []
    for path in python_files():
        module = module_of(path)
        for package, forbidden in IMPORT_RULES.items():
            if module == package or module.startswith(package + "."):
                broken += [f"{module} imports {name}" for name in sorted(imports_of(path))
                           if any(name == f or name.startswith(f + ".") for f in forbidden)]  # fmt: skip
    assert broken == []


def test_talaria_s_packages_import_each_other_without_cycles() -> None:
    graph: dict[str, set[str]] = {}
    for path in python_files():
        if path.parent == PACKAGE and path.name == "cli.py":  # the entry point imports every door on purpose
            continue
        mine = package_of(module_of(path))
        others = {package_of(name) for name in imports_of(path)} - {mine, "talaria"}
        graph.setdefault(mine, set()).update(others)
    assert {"talaria.hub", "talaria.lifecycle", "talaria.store", "talaria.runner"} <= set(graph)
    cycles = []

    def visit(node: str, trail: list[str]) -> None:
        if node in trail:
            cycles.append(" -> ".join([*trail[trail.index(node) :], node]))
            return
        for nxt in sorted(graph.get(node, ())):
            visit(nxt, [*trail, node])

    for start in sorted(graph):
        visit(start, [])
    assert cycles == [], sorted(set(cycles))


def test_no_two_modules_of_one_package_share_a_name() -> None:
    """``hub/state.py`` beside ``hub/runners/state.py`` made a reader guess which one was meant."""
    for package in ("hub", "lifecycle", "runner", "store", "accounts", "hermes"):
        names = [path.name for path in python_files(PACKAGE / package) if path.name != "__init__.py"]
        assert sorted({n for n in names if names.count(n) > 1}) == [], package


# ---------------------------------------------------------------- tests wait on events, not on time

TESTS = PACKAGE.parent.parent / "tests"
MAX_FIXED_SLEEP_S = 0.5
# A fixed sleep longer than MAX_FIXED_SLEEP_S is allowed only where a line says why with this comment: the
# thing waited for is a real timer of a part we do not control, and nothing observable marks its end.
SLEEP_ALLOWED = "# sleep-ok:"


def fixed_sleeps(path: Path) -> list[tuple[int, float]]:
    """(line, seconds) of every ``sleep(<number>)`` call in ``path`` longer than the limit and not allowed."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source, filename=str(path))):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        seconds = node.args[0]
        if name != "sleep" or not isinstance(seconds, ast.Constant) or not isinstance(seconds.value, int | float):
            continue
        if seconds.value > MAX_FIXED_SLEEP_S and SLEEP_ALLOWED not in lines[node.lineno - 1]:
            found.append((node.lineno, float(seconds.value)))
    return found


def test_no_test_module_imports_another_test_module() -> None:
    """Shared helpers live in support modules and fixtures in conftest files, never in a test module."""
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            offenders += [f"{path.name} imports {name}" for name in names
                          if name.startswith("tests.") and name.rsplit(".", 1)[-1].startswith("test_")]  # fmt: skip
    assert offenders == []


def test_the_sleep_scan_finds_a_long_fixed_sleep(tmp_path: Path) -> None:
    """Guards the scan itself: a rule that found nothing would pass vacuously."""
    sample = tmp_path / "sample.py"
    call = "sleep"  # the sample's calls are written out only in the temporary file
    sample.write_text(
        "import asyncio, time\n"
        f"time.{call}(3.5)\n"
        f"async def f():\n    await asyncio.{call}(2)\n"
        f"time.{call}(0.5)\n"
        f"time.{call}(9)  {SLEEP_ALLOWED} a real timer\n"
    )
    assert fixed_sleeps(sample) == [(2, 3.5), (4, 2.0)]


def test_no_test_sleeps_a_fixed_time_longer_than_half_a_second() -> None:
    files = sorted(TESTS.rglob("*.py"))
    assert len(files) > 20
    offenders = [f"{path.relative_to(TESTS.parent)}:{line} sleeps {secs} s" for path in files
                 for line, secs in fixed_sleeps(path)]  # fmt: skip
    assert offenders == [], "wait on the event instead (or explain with '# sleep-ok:'): " + "; ".join(offenders)


# A validation pattern anchored with "$" matches before a trailing line break ("bob\n"), and ``.match`` then accepts
# it: found by the resume-point fuzzer (tests/unit/test_fuzz_parsers.py). Anchor at the very end with \Z, or, for a
# pattern that is also a JSON Schema pattern (ECMA has no \Z), say so and check it only with ``fullmatch``.
DOLLAR_ANCHORED = re.compile(r"""re\.compile\(\s*r?["'][^"']*(?<!\\)\$["']""")
DOLLAR_ALLOWED = "# $: a JSON Schema pattern too; fullmatch only"
PATTERN_NAME = re.compile(r"^(\w+)(?:\s*:\s*[\w\[\]]+)?\s*=\s*re\.compile")


def dollar_anchored(root: Path) -> tuple[list[str], list[str]]:
    """Lines with a "$"-anchored pattern not marked as a schema pattern, and ``.match``/``.search`` calls of the
    marked ones."""
    found: list[str] = []
    marked: list[tuple[Path, str, str]] = []
    sources = {path: path.read_text(encoding="utf-8") for path in python_files(root)}
    for path, text in sources.items():
        for number, line in enumerate(text.splitlines(), 1):
            if DOLLAR_ANCHORED.search(line):
                name = PATTERN_NAME.match(line.strip())
                if DOLLAR_ALLOWED in line and name is not None:
                    module = ".".join(("talaria", *path.relative_to(root).with_suffix("").parts))
                    marked.append((path, module, name.group(1)))
                else:
                    found.append(f"{path.relative_to(root)}:{number}")
    loose = []
    for path, text in sources.items():
        for home, module, name in marked:
            if path != home and not re.search(rf"from {re.escape(module)} import [^\n]*\b{name}\b", text):
                continue  # another pattern of that name
            loose += [f"{path.relative_to(root)}: {name}.{m}(" for m in ("match", "search")
                      if re.search(rf"\b{name}\.{m}\(", text)]  # fmt: skip
    return found, loose


def test_the_anchor_scan_finds_a_dollar_anchored_pattern_and_a_loose_check_of_a_marked_one(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text(
        'import re\nNAME = re.compile(r"^[a-z]+$")\nGOOD = re.compile(r"^[a-z]+\\Z")\n'
        f'KEY = re.compile(r"^[a-z]+$")  {DOLLAR_ALLOWED}\nok = KEY.fullmatch("a")\nbad = KEY.match("a")\n'
    )
    assert dollar_anchored(tmp_path) == (["bad.py:2"], ["bad.py: KEY.match("])


def test_no_validation_pattern_is_anchored_with_a_dollar() -> None:
    assert dollar_anchored(PACKAGE) == ([], [])
