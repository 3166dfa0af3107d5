"""The hub: one ASGI application with the browser/JSON API, the internal Runtime API and operations."""
