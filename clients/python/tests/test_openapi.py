"""The hand-typed models are the OpenAPI document's: for each model, the
schema of the same name (after the Rust type) has the same fields, and
requires the same ones. Checked against the committed document
(docs/openapi.json) and the one the server serves (GET /v1/openapi.json).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import TOKEN, KeelServer

from keel_client import _convert, models
from keel_client._core import API_MAJOR
from keel_client.errors import known_codes
from keel_client.events import EVENT_TYPES, Event, EventPage, SandboxInfo

REPO = Path(__file__).resolve().parents[3]

# Each model and the schema names it may have in the document, first found wins.
MODELS: list[tuple[type, tuple[str, ...]]] = [
    (models.Session, ("SessionView", "Session")),
    (models.SessionList, ("SessionList",)),
    (models.Accepted, ("AcceptedView", "Accepted")),
    (models.ErrorBody, ("ErrorBody",)),
    (models.TokenUsage, ("TokenUsage",)),
    (models.Actor, ("Actor",)),
    (models.UsageReport, ("UsageReport",)),
    (models.BotUsage, ("BotLine", "BotUsage")),
    (models.SessionUsage, ("SessionLine", "SessionUsage")),
    (models.CreateSession, ("CreateSession",)),
    (models.ForkSession, ("ForkSession",)),
    (models.UpdateSession, ("UpdateSession",)),
    (models.SubmitRequest, ("SubmitRequest",)),
    (models.Tools, ("ToolsOverrides", "Tools")),
    (models.Approvals, ("ApprovalRules", "Approvals")),
    (SandboxInfo, ("SandboxInfo",)),
    (Event, ("RecordedEvent", "Event")),
    (EventPage, ("EventsView", "EventPage")),
]


class Document:
    """An OpenAPI document's schemas, with `$ref` and `allOf` resolved."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self.schemas: dict[str, Any] = document.get("components", {}).get("schemas", {})

    def resolve(self, schema: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in schema:
            name = schema["$ref"].rsplit("/", 1)[-1]
            schema = self.schemas[name]
        return schema

    def named(self, names: tuple[str, ...]) -> dict[str, Any]:
        for name in names:
            if name in self.schemas:
                return self.schemas[name]
        raise AssertionError(f"no schema named {' or '.join(names)}; the document has {sorted(self.schemas)}")

    def fields(self, schema: dict[str, Any]) -> tuple[set[str], set[str]]:
        """The properties of an object schema, and the required ones."""
        schema = self.resolve(schema)
        properties = set(schema.get("properties", {}))
        required = set(schema.get("required", []))
        arms = schema.get("oneOf") or schema.get("anyOf")
        if arms and not properties:
            # One of several closed shapes: a field of any of them, required
            # when every one requires it.
            shapes = [self.fields(arm) for arm in arms]
            properties = set().union(*(shape[0] for shape in shapes))
            required = set.intersection(*(shape[1] for shape in shapes))
        for part in schema.get("allOf", []):
            more, more_required = self.fields(part)
            properties |= more
            required |= more_required
        return properties, required

    def variants(self, schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """The arms of a union tagged by `type`, by tag."""
        schema = self.resolve(schema)
        arms = schema.get("oneOf") or schema.get("anyOf") or []
        assert arms, f"a tagged union: {schema}"
        by_tag = {}
        for arm in arms:
            tag = self._tag(arm)
            assert tag is not None, f"every arm has a `type` tag: {arm}"
            by_tag[tag] = arm
        return by_tag

    def _tag(self, schema: dict[str, Any]) -> str | None:
        schema = self.resolve(schema)
        tag = schema.get("properties", {}).get("type")
        if tag is not None:
            tag = self.resolve(tag)
            if "const" in tag:
                return tag["const"]
            if len(tag.get("enum", [])) == 1:
                return tag["enum"][0]
        for part in schema.get("allOf", []):
            found = self._tag(part)
            if found is not None:
                return found
        return None

    def error_codes(self) -> set[str]:
        """Every `code` an error body of the document may carry."""
        codes: set[str] = set()

        def walk(node: Any) -> None:
            if isinstance(node, dict):
                properties = node.get("properties")
                # The error bodies' `code`, narrowed per answer to its codes.
                if isinstance(properties, dict) and "code" in properties:
                    codes.update(self.resolve(properties["code"]).get("enum", []))
                for value in node.values():
                    walk(value)
            elif isinstance(node, list):
                for value in node:
                    walk(value)

        walk(self.document)
        return codes


def drift(document: Document) -> list[str]:
    """How the models differ from the document; empty when they agree."""
    problems = []

    def compare(label: str, cls: type, schema: dict[str, Any], tagged: bool = False) -> None:
        properties, required = document.fields(schema)
        if tagged:
            properties.discard("type")
            required.discard("type")
        ours, ours_required = _convert.all_fields(cls), _convert.required_fields(cls)
        if properties != ours:
            problems.append(f"{label}: fields {sorted(properties)} in the document, {sorted(ours)} here")
        if required != ours_required:
            problems.append(f"{label}: required {sorted(required)} in the document, {sorted(ours_required)} here")

    for cls, names in MODELS:
        compare(f"{cls.__name__} ({'/'.join(names)})", cls, document.named(names))
    for union, classes in (("EventMsg", EVENT_TYPES), ("Op", models.OP_TYPES)):
        arms = document.variants(document.named((union,)))
        if set(arms) != set(classes):
            problems.append(f"{union}: variants {sorted(arms)} in the document, {sorted(classes)} here")
        for tag, cls in classes.items():
            if tag in arms:
                compare(f"{union}::{tag}", cls, arms[tag], tagged=True)
    unknown = document.error_codes() - known_codes()
    if unknown:
        problems.append(f"error codes without a class here: {sorted(unknown)}")
    version = str(document.document.get("info", {}).get("version", ""))
    if version.split(".", 1)[0] != str(API_MAJOR):
        problems.append(f"the document is API {version}; this client is built for major {API_MAJOR}")
    return problems


def documents(server: KeelServer) -> list[tuple[str, dict[str, Any]]]:
    found = []
    committed = REPO / "docs" / "openapi.json"
    if committed.is_file():
        found.append(("docs/openapi.json", json.loads(committed.read_text())))
    served = httpx.get(f"{server.url}/v1/openapi.json", headers={"authorization": f"Bearer {TOKEN}"})
    if served.status_code == 200:
        found.append(("GET /v1/openapi.json", served.json()))
    return found


def test_the_models_match_the_openapi_document(server: KeelServer) -> None:
    found = documents(server)
    if not found:
        required = any(os.environ.get(name, "") not in ("", "0") for name in ("CI", "KEEL_REQUIRE_CLIENT_TESTS"))
        message = "neither docs/openapi.json nor GET /v1/openapi.json exists, so the models are NOT checked"
        if required:
            pytest.fail(message)
        pytest.skip(message)
    for source, document in found:
        problems = drift(Document(document))
        assert not problems, f"{source} and the client's models differ:\n" + "\n".join(problems)


def _object(cls: type) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {name: {} for name in _convert.all_fields(cls)},
        "required": sorted(_convert.required_fields(cls)),
    }


def _tagged(tag: str, cls: type) -> dict[str, Any]:
    return {"allOf": [_object(cls), {"type": "object", "properties": {"type": {"const": tag}}, "required": ["type"]}]}


def expected_document() -> dict[str, Any]:
    """The document as the models expect it (schemas named after the Rust types)."""
    schemas = {names[0]: _object(cls) for cls, names in MODELS}
    schemas["EventMsg"] = {"oneOf": [_tagged(tag, cls) for tag, cls in EVENT_TYPES.items()]}
    schemas["Op"] = {"oneOf": [_tagged(tag, cls) for tag, cls in models.OP_TYPES.items()]}
    schemas["ErrorBody"]["properties"]["code"] = {"type": "string", "enum": sorted(known_codes())}
    return {"openapi": "3.1.0", "info": {"version": f"{API_MAJOR}.0.0"}, "components": {"schemas": schemas}}


def test_the_check_finds_a_drift() -> None:
    assert drift(Document(expected_document())) == []
    renamed = expected_document()
    renamed["components"]["schemas"]["SessionView"]["properties"]["display_title"] = {}
    assert any("SessionView" in problem for problem in drift(Document(renamed)))
    optional = expected_document()
    optional["components"]["schemas"]["AcceptedView"]["required"].remove("sequence")
    assert any("required" in problem for problem in drift(Document(optional)))
    more = expected_document()
    more["components"]["schemas"]["EventMsg"]["oneOf"].append(_tagged("brand_new", models.Shutdown))
    assert any("brand_new" in problem for problem in drift(Document(more)))
    coded = expected_document()
    coded["components"]["schemas"]["ErrorBody"]["properties"]["code"]["enum"].append("new_code")
    assert any("new_code" in problem for problem in drift(Document(coded)))
