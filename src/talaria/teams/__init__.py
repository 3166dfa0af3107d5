"""Team tools' domain (team-tools.md 3-7): a bot's team permission, teams, goals, assignments and their runs,
member sessions, report-back deliveries, the request ledger and the evidence of tool calls.

Only this package writes the tables of the ``team`` migration set (a static test). Transitions are the pure tables
of ``machine``; every write is conditional on id, status and revision and audited in its transaction. It imports
chat's domain and the lifecycle, nothing of the hub or the runner.
"""
