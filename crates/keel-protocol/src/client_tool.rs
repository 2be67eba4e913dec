//! Tools the client executes: declared by a session (or its bot), called
//! by the model, answered by the client with a `client_tool_result` op.

use serde::{Deserialize, Serialize};

#[cfg(doc)]
use crate::EventMsg;

/// The largest result a client may send for a call, in bytes: the same
/// bound as a built-in tool's output, so a client cannot grow the history
/// faster than a tool can.
pub const MAX_CLIENT_TOOL_OUTPUT_BYTES: usize = 256 * 1024;

/// A tool the client executes, as offered to the model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ClientToolSpec {
    /// The tool's name, as the model calls it: 1 to 64 of `A-Z a-z 0-9 _ -`,
    /// and not the name of a tool the server runs.
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = r"^[A-Za-z0-9_-]{1,64}$", min_length = 1, max_length = 64)
    )]
    pub name: String,
    /// What the tool does, for the model.
    #[serde(default)]
    pub description: String,
    /// The JSON Schema of the tool's arguments (an object schema; one
    /// without `type` is taken as `"type": "object"`).
    #[serde(default = "empty_object_schema")]
    #[cfg_attr(feature = "openapi", schema(schema_with = parameters_schema))]
    pub parameters: serde_json::Value,
}

/// `parameters` as the description gives it: any object, with the JSON
/// Schema keywords whose values the server checks described (a subschema
/// is an object or a boolean), so a generated request that is valid by the
/// description is a schema the server accepts.
#[cfg(feature = "openapi")]
fn parameters_schema() -> utoipa::openapi::Object {
    use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, SchemaType, Type};
    let subschema = || ObjectBuilder::new().schema_type(SchemaType::from_iter([Type::Object, Type::Boolean]));
    let subschemas = || ArrayBuilder::new().items(subschema()).min_items(Some(1));
    let mut parameters = ObjectBuilder::new()
        .schema_type(Type::Object)
        .description(Some(
            "The JSON Schema of the tool's arguments (an object schema; one without `type` is taken as \
             `\"type\": \"object\"`).",
        ))
        .property(
            "type",
            ObjectBuilder::new().schema_type(Type::String).pattern(Some("^object$")),
        )
        .property(
            "properties",
            ObjectBuilder::new()
                .schema_type(Type::Object)
                .additional_properties(Some(subschema())),
        )
        .property(
            "required",
            ArrayBuilder::new()
                .items(ObjectBuilder::new().schema_type(Type::String))
                .unique_items(true),
        )
        .property("enum", ArrayBuilder::new());
    for keyword in ["if", "then", "else", "not", "items", "additionalProperties"] {
        parameters = parameters.property(keyword, subschema());
    }
    for keyword in ["allOf", "anyOf", "oneOf"] {
        parameters = parameters.property(keyword, subschemas());
    }
    parameters.build()
}

fn empty_object_schema() -> serde_json::Value {
    serde_json::json!({"type": "object", "properties": {}})
}

/// Payload of [`EventMsg::ClientToolRequested`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClientToolRequestedEvent {
    /// The turn.
    pub turn_id: String,
    /// The call waiting; answer with a `client_tool_result` op naming it.
    pub call_id: String,
    /// The client tool.
    pub name: String,
    /// The arguments as the model wrote them (JSON text, possibly malformed).
    pub arguments: String,
    /// When the wait ends with an error result if no answer came, in
    /// milliseconds since the Unix epoch; absent when it never does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
}
