"""Each body is described once: a resource's module declares its models, and
the fields its hand parser lets through are the model's fields.

The models are the OpenAPI schema's source; the parsers give the problem
bodies (a field not in the model is "not a field of this object"). A field
set written by hand beside a model could drift from it; here each set is the
model's, and each resource's bodies and answers live in its own module
(shared shapes, such as a decision, in `metering.api.models`).
"""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest
from pydantic import BaseModel

from metering.api import allowances, limits, models, parsing, reports, reservations, webhooks

# Each resource module, and the models of its bodies and answers it declares.
OWNED: list[tuple[ModuleType, tuple[str, ...]]] = [
    (limits, ("LimitIn", "LimitOut", "Limits")),
    (
        reservations,
        (
            "ReserveCharge",
            "ReserveSingle",
            "ReserveStacked",
            "ReservedCharge",
            "ReservationOut",
            "Cancelled",
            "Committed",
            "Reservations",
            "Reserved",
        ),
    ),
    (reports, ("DimensionRowOut", "DimensionReportOut")),
    (
        webhooks,
        (
            "EndpointIn",
            "EndpointChange",
            "RotateIn",
            "ReplayIn",
            "EndpointOut",
            "EndpointCreated",
            "SecretRotated",
            "Endpoints",
            "DeliveryOut",
            "Deliveries",
            "Replayed",
        ),
    ),
    (
        allowances,
        (
            "EntitlementIn",
            "EntitlementOut",
            "Entitlements",
            "GrantIn",
            "GrantAdded",
            "Grants",
            "VoidIn",
            "Voided",
            "Corrections",
        ),
    ),
]


@pytest.mark.parametrize(("module", "names"), OWNED, ids=lambda m: getattr(m, "__name__", ""))
def test_each_resource_module_declares_its_models(
    module: ModuleType, names: tuple[str, ...]
) -> None:
    for name in names:
        model = getattr(module, name)
        assert issubclass(model, BaseModel)
        assert model.__module__ == module.__name__, f"{name} is declared in {model.__module__}"


@pytest.mark.parametrize("gone", ["metering.api.admin_models", "metering.api.allowance_models"])
def test_no_shared_module_of_one_resource_s_models(gone: str) -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(gone)


# Each hand parser's field set, and the models that describe that body.
FIELD_SETS: list[tuple[frozenset[str], tuple[type[BaseModel], ...]]] = [
    (parsing.PLAIN_FIELDS, (models.SingleEvent, models.StackedEvent)),
    (parsing.CHECK_FIELDS, (models.SingleCheck, models.StackedCheck)),
    (parsing.CHARGE_FIELDS, (models.ChargeIn,)),
    (limits.LIMIT_FIELDS, (limits.LimitIn,)),
    (reservations.RESERVE_FIELDS, (reservations.ReserveSingle, reservations.ReserveStacked)),
    (reservations.CHARGE_FIELDS, (reservations.ReserveCharge,)),
    (webhooks.ENDPOINT_FIELDS, (webhooks.EndpointIn,)),
    (webhooks.CHANGE_FIELDS, (webhooks.EndpointChange,)),
    (webhooks.ROTATE_FIELDS, (webhooks.RotateIn,)),
    (webhooks.REPLAY_FIELDS, (webhooks.ReplayIn,)),
    (allowances.ENTITLEMENT_FIELDS, (allowances.EntitlementIn,)),
    (allowances.GRANT_FIELDS, (allowances.GrantIn,)),
    (allowances.VOID_FIELDS, (allowances.VoidIn,)),
]


@pytest.mark.parametrize(("fields", "described_by"), FIELD_SETS)
def test_parser_fields_are_the_model_fields(
    fields: frozenset[str], described_by: tuple[type[BaseModel], ...]
) -> None:
    assert fields == models.body_fields(*described_by)


def test_body_fields_uses_the_json_name() -> None:
    from pydantic import Field

    class Aliased(BaseModel):
        event_id: str = Field(alias="id")
        cost: int = 1

    assert models.body_fields(Aliased) == {"id", "cost"}
