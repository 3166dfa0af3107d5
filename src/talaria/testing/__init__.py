"""Test and demo helpers that ship with Talaria: a signing Runtime API worker (more fixtures follow)."""
