"""One Principal: the services' (runtime.auth) and the identity store's (security.apikeys) are one class."""

from __future__ import annotations

import pytest

from gigacluster.runtime import auth
from gigacluster.security.apikeys import Principal, Role


def test_runtime_auth_reexports_the_security_principal() -> None:
    """runtime.auth.Principal is security.apikeys.Principal (the domain's), not a second class."""
    assert auth.Principal is Principal


def test_principal_kind_is_a_role_and_compares_as_before() -> None:
    """Either spelling of the role gives one principal; kind stays a str; only admin and service are privileged."""
    assert Principal("admin") == Principal(Role.ADMIN) and type(Principal(Role.ADMIN).kind) is str
    alice = Principal("tenant", "tenants/alice")
    assert alice.role is Role.TENANT and alice.name == alice.tenant == "tenants/alice" and not alice.privileged
    assert Principal("service").privileged and Principal(Role.ADMIN, "root").privileged
    assert hash(Principal(Role.TENANT, "a")) == hash(Principal("tenant", "a"))
    with pytest.raises(ValueError, match="root"):
        Principal("root")
