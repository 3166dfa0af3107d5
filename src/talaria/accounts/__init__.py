"""Tenants, accounts, passwords, permissions and ``auth_version``."""
