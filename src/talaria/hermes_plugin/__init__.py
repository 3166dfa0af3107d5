"""Talaria's Hermes plugin for team tools (hermes.md 8) and its installer.

``files/`` is the plugin as it is copied into ``<HERMES_HOME>/plugins/talaria/``; it runs inside Hermes'
own environment and imports only the standard library, FastAPI and Hermes modules, never ``talaria``.
``install.install_plugin(home)`` copies it and enables it in the home's ``config.yaml``
(``talaria hermes install-plugin --hermes-home PATH``).
"""
