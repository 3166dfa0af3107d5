"""Talaria: run Hermes agents on the computers where they belong, driven from one control plane."""

__version__ = "0.1.0"
