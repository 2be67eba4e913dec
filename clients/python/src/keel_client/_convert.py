"""JSON to dataclasses and back, driven by the dataclasses' type hints.

The models are typed by hand (see ``models`` and ``events``); this module
turns a decoded JSON value into them without a schema library. Fields the
server adds later (a newer minor version of the API) are ignored; fields it
leaves out that have a default take it.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Callable

Converter = Callable[[Any], Any]

_PLANS: dict[type, list[tuple[str, Converter, bool]]] = {}
_CUSTOM: dict[Any, Converter] = {}


def register(hint: Any, convert: Converter) -> None:
    """Makes fields typed `hint` (a union of tagged variants) parse with `convert`."""
    _CUSTOM[hint] = convert


def _identity(value: Any) -> Any:
    return value


def _converter(hint: Any) -> Converter:
    """The function that turns JSON into a value of type `hint`."""
    custom = _CUSTOM.get(hint)
    if custom is not None:
        return custom
    origin = typing.get_origin(hint)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return lambda value: from_json(hint, value)
    if origin in (typing.Union, types.UnionType):
        arms = [arm for arm in typing.get_args(hint) if arm is not type(None)]
        if len(arms) == 1:
            inner = _converter(arms[0])
            return lambda value: None if value is None else inner(value)
        return _identity
    if origin is list:
        (item,) = typing.get_args(hint)
        inner = _converter(item)
        if inner is _identity:
            return list
        return lambda value: [inner(entry) for entry in value]
    if origin is dict:
        _, item = typing.get_args(hint)
        inner = _converter(item)
        if inner is _identity:
            return dict
        return lambda value: {key: inner(entry) for key, entry in value.items()}
    return _identity


def _plan(cls: type) -> list[tuple[str, Converter, bool]]:
    plan = _PLANS.get(cls)
    if plan is None:
        hints = typing.get_type_hints(cls)
        plan = []
        for spec in dataclasses.fields(cls):
            if not spec.init:
                continue
            required = spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING
            plan.append((spec.name, _converter(hints[spec.name]), required))
        _PLANS[cls] = plan
    return plan


def from_json(cls: type, value: Any) -> Any:
    """Builds dataclass `cls` from a decoded JSON object."""
    if not isinstance(value, dict):
        raise TypeError(f"{cls.__name__}: expected a JSON object, got {type(value).__name__}")
    arguments = {}
    for name, convert, required in _plan(cls):
        if name in value:
            arguments[name] = convert(value[name])
        elif required:
            raise TypeError(f"{cls.__name__}: the server's answer has no `{name}`")
    return cls(**arguments)


def required_fields(cls: type) -> set[str]:
    """The fields of `cls` the JSON must hold (those without a default)."""
    return {name for name, _, required in _plan(cls) if required}


def all_fields(cls: type) -> set[str]:
    """Every JSON field of `cls`."""
    return {name for name, _, _ in _plan(cls)}


def to_json(value: Any) -> Any:
    """A request model as JSON: fields left at ``None`` are not sent."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        body = {}
        tag = getattr(value, "TYPE", None)
        if tag is not None:
            body["type"] = tag
        for spec in dataclasses.fields(value):
            field_value = getattr(value, spec.name)
            if field_value is not None:
                body[spec.name] = to_json(field_value)
        return body
    if isinstance(value, list):
        return [to_json(entry) for entry in value]
    if isinstance(value, dict):
        return {key: to_json(entry) for key, entry in value.items()}
    return value
