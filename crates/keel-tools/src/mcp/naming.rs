//! How a remote tool is shown to the model: a name providers accept, an
//! object schema for its arguments.

use serde_json::{Map, Value};

/// The longest tool name the providers accept (OpenAI and Anthropic:
/// `^[a-zA-Z0-9_-]{1,64}$`).
pub(super) const MAX_TOOL_NAME: usize = 64;

/// The name the model sees for the tool `tool` of the server `server`:
/// `{server}__{tool}` when that fits the providers' rules; otherwise the
/// characters they refuse become `_`, the name is cut to fit, and a hash of
/// the full name is appended, so different tools keep different names and
/// a tool keeps its name from one session to the next.
pub(super) fn tool_name(server: &str, tool: &str) -> String {
    let full = format!("{server}__{tool}");
    if full.len() <= MAX_TOOL_NAME && full.chars().all(allowed) {
        return full;
    }
    let suffix = format!("_{:08x}", fnv1a(full.as_bytes()));
    let mut name: String = full
        .chars()
        .map(|c| if allowed(c) { c } else { '_' })
        .take(MAX_TOOL_NAME - suffix.len())
        .collect();
    name.push_str(&suffix);
    name
}

fn allowed(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

/// 32-bit FNV-1a: small, and the same in every build (unlike std's hasher).
fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(*byte)).wrapping_mul(0x0100_0193)
    })
}

/// The tool's input schema as Keel offers it: always an object schema with
/// `properties` (OpenAI refuses object schemas without them). Returns the
/// schema and, when the server's could not be used as it was, why.
pub(super) fn parameters(schema: &Map<String, Value>) -> (Value, Option<String>) {
    let mut schema = schema.clone();
    let problem = match schema.get("type") {
        None => {
            schema.insert("type".into(), "object".into());
            None
        }
        Some(Value::String(kind)) if kind == "object" => None,
        Some(other) => Some(format!(
            "its input schema has type {other}, not \"object\"; any object is accepted"
        )),
    };
    if problem.is_some() {
        return (serde_json::json!({"type": "object", "properties": {}}), problem);
    }
    if !schema.get("properties").is_some_and(Value::is_object) {
        schema.insert("properties".into(), Value::Object(Map::new()));
    }
    (Value::Object(schema), None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_fit_are_kept() {
        assert_eq!(tool_name("everything", "get-sum"), "everything__get-sum");
        let longest = "t".repeat(MAX_TOOL_NAME - "s__".len());
        assert_eq!(tool_name("s", &longest), format!("s__{longest}"));
    }

    #[test]
    fn other_names_are_cleaned_cut_and_hashed_deterministically() {
        let dotted = tool_name("files", "read.file");
        assert_eq!(dotted, format!("files__read_file_{:08x}", fnv1a(b"files__read.file")));
        assert_ne!(
            dotted,
            tool_name("files", "read_file"),
            "cleaning must not merge two tools"
        );
        let long = tool_name("server", &"x".repeat(100));
        assert_eq!(long.len(), MAX_TOOL_NAME);
        assert!(long.starts_with("server__xxx"), "{long}");
        assert_ne!(long, tool_name("server", &"x".repeat(101)));
        let unicode = tool_name("s", "überprüfen ✓");
        assert!(
            unicode.chars().all(allowed) && unicode.len() <= MAX_TOOL_NAME,
            "{unicode}"
        );
        assert_eq!(unicode, tool_name("s", "überprüfen ✓"));
    }

    #[test]
    fn schemas_become_object_schemas_with_properties() {
        let object = |value: Value| match value {
            Value::Object(map) => map,
            other => panic!("not an object: {other}"),
        };
        let (empty, problem) = parameters(&Map::new());
        assert_eq!(empty, serde_json::json!({"type": "object", "properties": {}}));
        assert_eq!(problem, None);
        let typed = serde_json::json!({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]});
        assert_eq!(parameters(&object(typed.clone())), (typed, None));
        let (string, problem) = parameters(&object(serde_json::json!({"type": "string"})));
        assert_eq!(string, serde_json::json!({"type": "object", "properties": {}}));
        assert!(problem.is_some_and(|problem| problem.contains("\"string\"")));
    }
}
