"""The one Queue/Lease state machine for Tasks, Dispatches, Jobs and Leases (lifecycle.md).

Every caller (Runtime API, in-process dispatcher, admin actions, reaper, recovery) uses the entry
points of ``talaria.lifecycle.engine.Engine``; nothing else writes the lifecycle tables.
"""
