//! Checking the tools a client declares it executes: names the providers
//! accept and no tool of the server has, object schemas that compile, and
//! bounds on their number and size, so that a declaration cannot break
//! every model request of its session.

use std::collections::HashSet;

use keel_protocol::ClientToolSpec;

use crate::ToolSet;
use crate::workspace::{self, ShellConfig, WorkspaceToolsConfig};

/// The most client tools one session (or bot) may declare.
pub const MAX_CLIENT_TOOLS: usize = 64;

/// The most bytes the declared client tools may take, as JSON: they are
/// sent with every model request of the session.
pub const MAX_CLIENT_TOOLS_BYTES: usize = 64 * 1024;

/// The longest client tool name (the providers' bound).
pub const MAX_CLIENT_TOOL_NAME: usize = 64;

/// Why a declaration of client tools is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientToolError {
    /// The declaration breaks a rule of its own (name, schema, bounds).
    #[error("{0}")]
    Invalid(String),
    /// A declared name is taken: by a tool the server runs, or by another
    /// tool of the declaration.
    #[error("{0}")]
    Conflict(String),
}

/// The names of the tools Keel itself can offer a session (the built-in
/// and workspace tools, whether or not a given session has them on): a
/// client tool may take none of them.
pub fn server_tool_names() -> Vec<String> {
    let mut names = ToolSet::builtin().names();
    let all = WorkspaceToolsConfig {
        write: true,
        shell: Some(ShellConfig::default()),
    };
    names.extend(workspace::tools(all).iter().map(|tool| tool.spec().name));
    names
}

/// Completes `tools` as declared: a `parameters` object without `type` is
/// an object schema (the providers want `"type": "object"` spelled out).
pub fn complete_client_tools(tools: &mut [ClientToolSpec]) {
    for tool in tools {
        if let Some(schema) = tool.parameters.as_object_mut()
            && !schema.contains_key("type")
        {
            schema.insert("type".to_owned(), serde_json::Value::from("object"));
        }
    }
}

/// Checks `tools` as a session's (or a bot's) client tools. `is_server_tool`
/// says whether a name is one the server runs (a built-in or MCP tool).
pub fn check_client_tools(
    tools: &[ClientToolSpec],
    is_server_tool: impl Fn(&str) -> bool,
) -> Result<(), ClientToolError> {
    if tools.len() > MAX_CLIENT_TOOLS {
        return Err(ClientToolError::Invalid(format!(
            "at most {MAX_CLIENT_TOOLS} client tools may be declared ({} were)",
            tools.len()
        )));
    }
    let bytes = serde_json::to_vec(tools).map(|json| json.len()).unwrap_or(usize::MAX);
    if bytes > MAX_CLIENT_TOOLS_BYTES {
        return Err(ClientToolError::Invalid(format!(
            "the client tools take {bytes} bytes as JSON; at most {MAX_CLIENT_TOOLS_BYTES} are allowed"
        )));
    }
    let mut seen = HashSet::new();
    for tool in tools {
        check_name(&tool.name)?;
        if !seen.insert(tool.name.as_str()) {
            return Err(ClientToolError::Conflict(format!(
                "client tool '{}' is declared twice",
                tool.name
            )));
        }
        if is_server_tool(&tool.name) {
            return Err(ClientToolError::Conflict(format!(
                "client tool '{}' has the name of a tool the server runs; choose another name",
                tool.name
            )));
        }
        check_parameters(tool)?;
    }
    Ok(())
}

/// A name the providers accept: 1 to 64 of `A-Z a-z 0-9 _ -`.
fn check_name(name: &str) -> Result<(), ClientToolError> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if name.is_empty() || name.len() > MAX_CLIENT_TOOL_NAME || !name.chars().all(allowed) {
        return Err(ClientToolError::Invalid(format!(
            "client tool name '{}' must be 1 to {MAX_CLIENT_TOOL_NAME} of A-Z a-z 0-9 _ -",
            name.escape_debug()
        )));
    }
    Ok(())
}

/// `parameters`: a JSON Schema that compiles and describes an object.
fn check_parameters(tool: &ClientToolSpec) -> Result<(), ClientToolError> {
    let invalid = |why: String| ClientToolError::Invalid(format!("client tool '{}': `parameters` {why}", tool.name));
    let Some(schema) = tool.parameters.as_object() else {
        return Err(invalid("must be a JSON Schema object".to_owned()));
    };
    if schema.get("type").and_then(|kind| kind.as_str()) != Some("object") {
        return Err(invalid("must be an object schema (`\"type\": \"object\"`)".to_owned()));
    }
    jsonschema::validator_for(&tool.parameters)
        .map(drop)
        .map_err(|error| invalid(format!("is not a valid JSON Schema: {error}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tool(name: &str, parameters: serde_json::Value) -> ClientToolSpec {
        ClientToolSpec {
            name: name.to_owned(),
            description: "asks the user".to_owned(),
            parameters,
        }
    }

    fn object() -> serde_json::Value {
        json!({"type": "object", "properties": {"q": {"type": "string"}}})
    }

    fn check(tools: &[ClientToolSpec]) -> Result<(), ClientToolError> {
        let reserved = server_tool_names();
        check_client_tools(tools, |name| reserved.iter().any(|taken| taken == name))
    }

    #[test]
    fn a_schema_without_a_type_is_completed_as_an_object_schema() {
        let mut tools = [tool("a", json!({})), tool("b", json!({"type": "string"}))];
        complete_client_tools(&mut tools);
        assert_eq!(tools[0].parameters, json!({"type": "object"}));
        assert_eq!(
            tools[1].parameters,
            json!({"type": "string"}),
            "a type given stays, to be refused"
        );
        assert_eq!(check(&tools[..1]), Ok(()));
    }

    #[test]
    fn a_good_declaration_passes() {
        assert_eq!(
            check(&[tool("ask_user", object()), tool("pick-color", object())]),
            Ok(())
        );
        assert_eq!(check(&[]), Ok(()));
    }

    #[test]
    fn bad_names_duplicates_and_schemas_are_invalid() {
        for bad in [
            vec![tool("", object())],
            vec![tool("has space", object())],
            vec![tool(&"x".repeat(65), object())],
            vec![tool("a", json!({"type": "string"}))],
            vec![tool("a", json!([1]))],
            vec![tool("a", json!({"type": "object", "properties": {"q": {"type": 12}}}))],
        ] {
            assert!(matches!(check(&bad), Err(ClientToolError::Invalid(_))), "{bad:?}");
        }
    }

    #[test]
    fn a_name_of_a_server_tool_or_a_name_declared_twice_conflicts() {
        for taken in ["shell", "read_file", "write_file", "clock"] {
            let refused = check(&[tool(taken, object())]);
            assert!(
                matches!(&refused, Err(ClientToolError::Conflict(why)) if why.contains(taken)),
                "{refused:?}"
            );
        }
        let twice = check(&[tool("a", object()), tool("a", object())]);
        assert!(
            matches!(&twice, Err(ClientToolError::Conflict(why)) if why.contains("twice")),
            "{twice:?}"
        );
    }

    #[test]
    fn too_many_or_too_large_is_invalid() {
        let many: Vec<_> = (0..=MAX_CLIENT_TOOLS)
            .map(|i| tool(&format!("t{i}"), object()))
            .collect();
        assert!(matches!(check(&many), Err(ClientToolError::Invalid(_))));
        let mut big = tool("big", object());
        big.description = "d".repeat(MAX_CLIENT_TOOLS_BYTES);
        assert!(matches!(check(&[big]), Err(ClientToolError::Invalid(_))));
    }
}
