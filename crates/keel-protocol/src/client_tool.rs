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
    #[cfg_attr(feature = "openapi", schema(value_type = described::ClientToolParameters))]
    pub parameters: serde_json::Value,
}

/// How the API description gives `parameters` and the schemas inside it:
/// objects whose JSON Schema keywords the server checks are described
/// (recursively, through the `JsonSchema` component), so a request that is
/// valid by the description is a schema the server accepts, and one it
/// refuses breaks the description.
#[cfg(feature = "openapi")]
pub(crate) mod described {
    use std::borrow::Cow;

    use utoipa::openapi::schema::{AdditionalProperties, AnyOfBuilder, ArrayBuilder, ObjectBuilder, Schema, Type};
    use utoipa::openapi::{Ref, RefOr};
    use utoipa::{PartialSchema, ToSchema};

    /// The component every subschema points at.
    const SUBSCHEMA: &str = "JsonSchema";

    /// JSON Schema's type names.
    const TYPES: [&str; 7] = ["array", "boolean", "integer", "null", "number", "object", "string"];

    /// A tool's `parameters`: an object schema.
    pub struct ClientToolParameters;

    /// A schema inside `parameters`: any JSON Schema object.
    pub struct JsonSchema;

    impl PartialSchema for ClientToolParameters {
        fn schema() -> RefOr<Schema> {
            let object = ObjectBuilder::new().schema_type(Type::String).pattern(Some("^object$"));
            keywords(object.into())
                .description(Some(
                    "The JSON Schema of the tool's arguments (an object schema; one without `type` is taken \
                     as `\"type\": \"object\"`).",
                ))
                .into()
        }
    }

    impl ToSchema for ClientToolParameters {
        fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
            schemas.push((SUBSCHEMA.to_owned(), JsonSchema::schema()));
        }
    }

    impl PartialSchema for JsonSchema {
        fn schema() -> RefOr<Schema> {
            let name = || ObjectBuilder::new().schema_type(Type::String).enum_values(Some(TYPES));
            let names = ArrayBuilder::new().items(name()).min_items(Some(1)).unique_items(true);
            let kind = AnyOfBuilder::new().item(name()).item(names);
            keywords(kind.into())
                .description(Some("A JSON Schema (2020-12) inside a client tool's `parameters`."))
                .into()
        }
    }

    impl ToSchema for JsonSchema {
        fn name() -> Cow<'static, str> {
            Cow::Borrowed(SUBSCHEMA)
        }
    }

    /// A schema object with `type` described by `kind` and the keywords
    /// holding subschemas described as such.
    fn keywords(kind: RefOr<Schema>) -> ObjectBuilder {
        let subschema = || {
            AnyOfBuilder::new()
                .item(Ref::from_schema_name(SUBSCHEMA))
                .item(ObjectBuilder::new().schema_type(Type::Boolean))
        };
        let subschemas = || ArrayBuilder::new().items(subschema()).min_items(Some(1));
        // Other keywords (`description`, `minLength`, ...) are free: said
        // so, a typed client lets them be written.
        let mut schema = ObjectBuilder::new()
            .schema_type(Type::Object)
            .additional_properties(Some(AdditionalProperties::<Schema>::FreeForm(true)))
            .property("type", kind)
            .property(
                "properties",
                ObjectBuilder::new()
                    .schema_type(Type::Object)
                    .additional_properties(Some(RefOr::T(Schema::AnyOf(subschema().build())))),
            )
            .property(
                "required",
                ArrayBuilder::new()
                    .items(ObjectBuilder::new().schema_type(Type::String))
                    .unique_items(true),
            )
            .property("enum", ArrayBuilder::new());
        for keyword in ["if", "then", "else", "not", "items", "additionalProperties"] {
            schema = schema.property(keyword, subschema());
        }
        for keyword in ["allOf", "anyOf", "oneOf"] {
            schema = schema.property(keyword, subschemas());
        }
        schema
    }
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
