"""The shared ``:name`` query style in psycopg's ``%(name)s`` (``talaria.store.postgres.params``)."""

from __future__ import annotations

import pytest

from talaria.store.postgres.params import to_psycopg


def test_names_become_psycopg_parameters_and_casts_stay() -> None:
    assert to_psycopg("SELECT :a::int, x::text FROM t WHERE b = :b_2") == (
        "SELECT %(a)s::int, x::text FROM t WHERE b = %(b_2)s"
    )


def test_percent_is_doubled_everywhere_and_quoted_text_keeps_its_colons() -> None:
    assert to_psycopg("SELECT 'a:b %' || \"c:d\" WHERE n % 2 = 0 -- 50% :x") == (
        "SELECT 'a:b %%' || \"c:d\" WHERE n %% 2 = 0 -- 50%% :x"
    )
    assert to_psycopg("SELECT 'it''s :not' , :yes") == "SELECT 'it''s :not' , %(yes)s"


@pytest.mark.parametrize("sql", ["SELECT $$x$$", "SELECT a : b", "SELECT :"])
def test_what_it_cannot_translate_is_refused(sql: str) -> None:
    with pytest.raises(ValueError):
        to_psycopg(sql)
