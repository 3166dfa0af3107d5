"""The PostgreSQL backend (scale.md 2): the only package that imports psycopg."""
