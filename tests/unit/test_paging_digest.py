"""A cursor's digest of the ranking settings: worked out once per settings object, and still one per settings."""

from __future__ import annotations

from deployments.config import RouterSettings
from deployments.search.paging import _NOT_RANKING, _digest, settings_digest


def worked_out(settings: RouterSettings | None) -> str:
    return _digest(settings.model_dump(mode="json", exclude=_NOT_RANKING) if settings is not None else None)


def test_each_settings_object_gets_its_own_digest_however_they_alternate():
    a, b = RouterSettings(), RouterSettings(dense_weight=0.7, keyword_weight=0.3)
    same_as_a = RouterSettings()
    for settings in (a, b, a, None, b, same_as_a, None, a):
        assert settings_digest(settings) == worked_out(settings)
    assert settings_digest(a) != settings_digest(b) != settings_digest(None)
    assert settings_digest(same_as_a) == settings_digest(a)
    # A setting that cannot change a ranking leaves the digest as it is.
    assert settings_digest(RouterSettings(shard_timeout_s=3.0)) == settings_digest(a)
