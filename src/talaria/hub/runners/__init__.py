"""Execution nodes on the hub: registration, connection states and the command queue, the machine API."""
