"""The browser and JSON API door: web sessions and CSRF, the /api routes, their views and visibility."""
