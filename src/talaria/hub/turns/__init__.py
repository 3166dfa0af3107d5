"""Hermes turns driven by the hub through a runner: the turn driver and the team tools it offers."""
