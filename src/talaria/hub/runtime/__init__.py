"""The internal Runtime API (lifecycle.md 6): off by default, trusted-proxy identity, loopback only."""
