"""The hub's web pages: server-rendered HTML over the JSON API (issue: web UI)."""
