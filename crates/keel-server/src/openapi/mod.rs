//! The API's OpenAPI 3.1 description, generated from the code: the paths
//! from the handlers' `#[utoipa::path]` annotations, collected by the same
//! router that serves them (so a route cannot be served undocumented), and
//! the schemas from the wire types themselves. `routes` composes it from
//! its routers and serves it at `GET /v1/openapi.json`; it is committed as
//! `docs/openapi.json`, and a test fails when the two differ.

pub(crate) mod errors;

use utoipa::openapi::extensions::Extensions;
use utoipa::openapi::link::Link;
use utoipa::openapi::schema::{AdditionalProperties, Schema};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::{OpenApi, RefOr, Server as ApiServer};
use utoipa::{Modify, OpenApi as _, PartialSchema};

use crate::API_VERSION;

/// What the derive cannot know: the version, the security schemes, the
/// schemas only the prose of a route names (the stream's items, the
/// WebSocket's frames).
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "Keel HTTP API",
        description = "Keel is a durable agent runtime: every session is a log of events, written before any \
            client sees them, under a gap-free sequence. Submit ops, stream events, resume from the last \
            sequence seen. Every answer carries the `keel-api-version` header; a client refuses a server of \
            another major version. See docs/http-api.md for the prose.",
        license(name = "MIT OR Apache-2.0", identifier = "MIT OR Apache-2.0"),
    ),
    security(("bearer" = [])),
    modifiers(&Additions),
    components(schemas(
        keel_protocol::RecordedEvent,
        keel_protocol::EventMsg,
        crate::error::ErrorBody,
    )),
    tags(
        (name = "sessions", description = "Create, read, fork, rename and delete sessions, switch their model; the server's models."),
        (name = "submissions", description = "Ops in: messages, interrupts, approvals."),
        (name = "events", description = "Events out: pages of the log, server-sent events, a WebSocket."),
        (name = "frontends", description = "Front-end protocols over the same sessions: AG-UI 1.0, the AI SDK's UI message stream."),
        (name = "usage", description = "Token usage."),
        (name = "auth", description = "Who a credential is; API keys (admin)."),
        (name = "webhooks", description = "Endpoints that receive signed deliveries of session events, their secrets and deliveries (admin)."),
        (name = "operations", description = "Health, readiness, metrics, this description."),
    ),
)]
struct ApiDoc;

/// Sets the version and the security schemes (the routes' paths and
/// schemas are not in yet: see [`finish`]).
struct Additions;

impl Modify for Additions {
    fn modify(&self, openapi: &mut OpenApi) {
        API_VERSION.clone_into(&mut openapi.info.version);
        openapi.servers = Some(vec![ApiServer::new("http://127.0.0.1:7777")]);
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                Http::builder()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "The operator's token (`keel serve --token-file`: every scope on every tenant), an API \
                         key (`keel_<id>_<secret>`) or a JWT of `[auth.jwt]` (one tenant's, with its scopes). An \
                         operation's requirement names the scope it needs (`read`, `submit`, `approve`, `admin`; \
                         also its `x-keel-scope`); credentials without it are answered `403 \
                         missing_scope_<scope>`.",
                    ))
                    .build(),
            ),
        );
        components.add_security_scheme(
            "query_token",
            SecurityScheme::ApiKey(ApiKey::Query(ApiKeyValue::with_description(
                "access_token",
                "The same credential as a query parameter, for the event stream and the WebSocket only.",
            ))),
        );
    }
}

/// The enums whose Rust type refuses unknown fields in every variant
/// (`Op` is parsed through a type that does); the derive closes only
/// structs, and a schema that allowed more would promise that a request the
/// server refuses is valid.
const CLOSED_ENUMS: &[&str] = &["Op"];

/// Refuses unknown fields in each variant of a `oneOf`.
fn close_variants(schema: &mut RefOr<Schema>) {
    if let RefOr::T(Schema::OneOf(one_of)) = schema {
        for variant in &mut one_of.items {
            if let RefOr::T(Schema::Object(object)) = variant {
                object.additional_properties = Some(Box::new(AdditionalProperties::FreeForm(false)));
            }
        }
    }
}

/// The operations that make a session, and where their answer's `id`
/// leads: a stateful client (or tester) chains create → submit → events →
/// fork → delete by these links.
const SESSION_MAKERS: &[&str] = &["/v1/sessions", "/v1/sessions/{id}/fork"];
const SESSION_LINKS: &[(&str, &str)] = &[
    ("get", "get_session"),
    ("submit", "submit"),
    ("events", "list_events"),
    ("rename", "update_session"),
    ("fork", "fork_session"),
    ("delete", "delete_session"),
];

/// Adds [`SESSION_LINKS`] to the `201` of each of [`SESSION_MAKERS`].
fn link_sessions(openapi: &mut OpenApi) {
    for path in SESSION_MAKERS {
        let Some(item) = openapi.paths.paths.get_mut(*path) else {
            continue;
        };
        let Some(RefOr::T(created)) = item
            .post
            .as_mut()
            .and_then(|post| post.responses.responses.get_mut("201"))
        else {
            continue;
        };
        for (name, operation_id) in SESSION_LINKS {
            let link = Link::builder()
                .operation_id(*operation_id)
                .parameter("id", "$response.body#/id")
                .build();
            created.links.insert((*name).to_owned(), RefOr::T(link));
        }
    }
}

/// Describes the WebSocket's frames, which OpenAPI has no field for, in an
/// extension: text frames holding a submission frame in,
/// text frames holding a `RecordedEvent` or a reply out, on its `101`.
fn describe_frames(openapi: &mut OpenApi) {
    let Some(get) = openapi
        .paths
        .paths
        .get_mut("/v1/sessions/{id}/ws")
        .and_then(|item| item.get.as_mut())
    else {
        return;
    };
    let inline = |schema: RefOr<Schema>| serde_json::to_value(schema).unwrap_or_default();
    let frames = serde_json::json!({
        "client": inline(crate::ws::SubmitFrame::schema()),
        "server": {"oneOf": [
            {"$ref": "#/components/schemas/RecordedEvent"},
            inline(crate::ws::Reply::schema()),
        ]},
    });
    // On the `101` answer rather than the operation: the operation's
    // extensions also hold `x-keel-scope`, and extensions are a hash map,
    // so two of them would be written in a different order by each process.
    if let Some(RefOr::T(switching)) = get.responses.responses.get_mut("101") {
        switching
            .extensions
            .get_or_insert_with(Default::default)
            .merge(Extensions::builder().add("x-websocket-frames", frames).build());
    }
}

/// States the scopes each operation needs, from its security requirement
/// (`"bearer": ["read"]`; every scope listed is needed): the first as an
/// `x-keel-scope` extension, for tools, and all at the end of its
/// description, for people.
fn state_scopes(openapi: &mut OpenApi) {
    for item in openapi.paths.paths.values_mut() {
        let operations = [
            item.get.as_mut(),
            item.post.as_mut(),
            item.patch.as_mut(),
            item.delete.as_mut(),
            item.put.as_mut(),
        ];
        for operation in operations.into_iter().flatten() {
            let security = serde_json::to_value(&operation.security).unwrap_or_default();
            let scopes: Vec<String> = security
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|requirement| requirement.as_object())
                .flat_map(|requirement| requirement.values())
                .filter_map(|scopes| scopes.as_array())
                .find(|scopes| !scopes.is_empty())
                .into_iter()
                .flatten()
                .filter_map(|scope| scope.as_str().map(str::to_owned))
                .collect();
            let Some(scope) = scopes.first().cloned() else { continue };
            let needs = match scopes.as_slice() {
                [one] => format!("Needs the `{one}` scope."),
                several => {
                    let named: Vec<String> = several.iter().map(|scope| format!("`{scope}`")).collect();
                    format!("Needs the {} scopes.", named.join(" and "))
                }
            };
            operation.description = Some(match operation.description.take() {
                Some(text) => format!("{text} {needs}"),
                None => needs,
            });
            operation
                .extensions
                .get_or_insert_with(Default::default)
                .merge(Extensions::builder().add("x-keel-scope", scope).build());
        }
    }
}

/// The description of the routes `v1` (under `/v1`) and `root` (at the
/// root), with everything the routes cannot say themselves.
pub(crate) fn describe(v1: OpenApi, root: impl IntoIterator<Item = OpenApi>) -> OpenApi {
    let mut doc = ApiDoc::openapi().nest("/v1", v1);
    for other in root {
        doc.merge(other);
    }
    finish(&mut doc);
    doc
}

/// What needs the whole description: links between the routes, the
/// WebSocket's frames, closed variants.
fn finish(doc: &mut OpenApi) {
    link_sessions(doc);
    describe_frames(doc);
    state_scopes(doc);
    if let Some(components) = doc.components.as_mut() {
        for name in CLOSED_ENUMS {
            if let Some(schema) = components.schemas.get_mut(*name) {
                close_variants(schema);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    /// Every pattern the description gives a session id, a thread id or a
    /// tenant, with where it is.
    fn name_patterns(doc: &Value) -> Vec<(String, String)> {
        let mut found = Vec::new();
        for (path, item) in doc["paths"].as_object().into_iter().flatten() {
            for (method, operation) in item.as_object().into_iter().flatten() {
                for parameter in operation["parameters"].as_array().into_iter().flatten() {
                    let name = parameter["name"].as_str().unwrap_or_default();
                    if let (true, Some(pattern)) = (
                        ["id", "tenant"].contains(&name),
                        parameter["schema"]["pattern"].as_str(),
                    ) {
                        found.push((format!("{method} {path} {name}"), pattern.to_owned()));
                    }
                }
            }
        }
        let named = [
            ("CreateSession", "id"),
            ("CreateSession", "tenant"),
            ("ChatBody", "id"),
            ("AgUiRunAgentInput", "threadId"),
        ];
        for (schema, property) in named {
            let pattern = doc["components"]["schemas"][schema]["properties"][property]["pattern"].as_str();
            found.push((format!("{schema}.{property}"), pattern.unwrap_or("none").to_owned()));
        }
        for (branch, fork) in doc["components"]["schemas"]["ForkSession"]["anyOf"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let pattern = fork["properties"]["id"]["pattern"].as_str();
            found.push((format!("ForkSession/{branch}.id"), pattern.unwrap_or("none").to_owned()));
        }
        found
    }

    #[test]
    fn every_name_a_path_carries_is_described_by_the_one_pattern_and_it_means_is_path_name() {
        let doc: Value = serde_json::from_str(crate::routes::openapi_json()).expect("the description is JSON");
        let patterns = name_patterns(&doc);
        assert!(patterns.len() >= 13, "{patterns:?}");
        for (place, pattern) in &patterns {
            assert_eq!(pattern, keel_protocol::PATH_NAME_PATTERN, "{place}");
        }
        let described =
            jsonschema::validator_for(&json!({"type": "string", "pattern": keel_protocol::PATH_NAME_PATTERN}))
                .expect("the pattern compiles");
        for code in 0..=0x2000_u32 {
            let Some(c) = char::from_u32(code) else { continue };
            let name = format!("a{c}b");
            assert_eq!(
                described.is_valid(&json!(name)),
                keel_protocol::is_path_name(&name, 128),
                "{name:?}"
            );
        }
    }

    #[test]
    fn a_client_tools_parameters_are_valid_by_the_description_exactly_when_the_server_takes_them() {
        let doc: Value = serde_json::from_str(crate::routes::openapi_json()).expect("the description is JSON");
        let root = json!({"$ref": "#/components/schemas/ClientToolParameters", "components": doc["components"]});
        let described = jsonschema::validator_for(&root).expect("the description's schema compiles");
        let taken = |parameters: &Value| {
            let mut tools = [keel_protocol::ClientToolSpec {
                name: "ask".to_owned(),
                description: String::new(),
                parameters: parameters.clone(),
            }];
            keel_tools::client::complete_client_tools(&mut tools);
            keel_tools::client::check_client_tools(&tools, |_| false).is_ok()
        };
        let cases = [
            (json!({}), true),
            (json!({"type": "object"}), true),
            (
                json!({"type": "object", "description": "a city", "required": ["q"],
                       "properties": {"q": {"type": "string", "minLength": 1, "description": "its name"},
                                      "n": {"type": ["integer", "null"]}, "any": true}}),
                true,
            ),
            (
                json!({"type": "object", "not": {"if": {"type": "object"}, "else": false,
                       "anyOf": [true, {"properties": {"deep": {"items": {"type": "string"}}}}]}}),
                true,
            ),
            // Found by schemathesis: a subschema below a subschema.
            (json!({"type": "object", "not": {"else": [false, [null]]}}), false),
            (
                json!({"type": "object", "properties": {"a": {"properties": {"b": {"items": [1]}}}}}),
                false,
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "strung"}}}),
                false,
            ),
            (json!({"type": "object", "properties": {"a": 5}}), false),
            (json!({"type": "object", "required": [1]}), false),
            (json!({"type": "object", "allOf": []}), false),
            (json!({"type": "string"}), false),
        ];
        for (parameters, expected) in cases {
            assert_eq!(taken(&parameters), expected, "the server on {parameters}");
            assert_eq!(
                described.is_valid(&parameters),
                expected,
                "the description on {parameters}"
            );
        }
    }
}
