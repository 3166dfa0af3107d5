"""``make runner-bundle``: the single-file runner ``dist/talaria-runner.pyz`` (operations.md 1.1). A build tool of
the source checkout; nothing here is in the bundle, and neither the hub nor the runner imports it."""
