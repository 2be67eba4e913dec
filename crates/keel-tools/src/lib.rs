//! Tools: what a model can ask the runtime to do during a turn.
//!
//! A [`Tool`] describes itself with a [`ToolSpec`] (name, description, JSON
//! Schema of its arguments) and runs a call with parsed arguments. A
//! [`ToolSet`] is the per-session collection the turn loop offers to the
//! model; it turns every failure (unknown tool, arguments that are not a JSON
//! object, a tool error, a panic) into an error result for the model, so a
//! bad call never ends the turn. [`workspace`] holds the file tools and the
//! sandboxed shell, [`mcp`] the MCP servers' tools, [`ApprovalRules`] which
//! calls wait for the user.
//!
//! It must not know turns, events, the store or `keel.toml` as a file (no
//! dependency on `keel-agent`, `keel-store` or `keel-config`): a tool returns
//! text or an error, and each tool owns the types of its own table in
//! `keel.toml`.

mod approval;
pub mod client;
mod clock;
mod config;
pub mod mcp;
mod progress;
pub mod protected;
mod session;
pub mod workspace;

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::Arc;

use futures::FutureExt;

pub use self::approval::{ApprovalPolicy, ApprovalRules};
pub use self::clock::Clock;
pub use self::config::{DEFAULT_CLIENT_TOOL_TIMEOUT, ToolsConfig};
pub use self::progress::{MAX_PROGRESS_MESSAGE_BYTES, ProgressBoard, ProgressSink, ToolProgress};
pub use self::session::{SessionTools, session_tools};
use keel_model::{BoxFuture, ToolCall, ToolSpec};

/// Why a tool call failed. The message is what the model reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ToolError {
    /// The arguments do not fit the tool's schema.
    #[error("invalid arguments: {0}")]
    InvalidArguments(String),
    /// The tool ran and failed.
    #[error("{0}")]
    Failed(String),
}

/// What a tool knows about where it runs.
#[derive(Debug, Clone)]
pub struct ToolContext {
    /// The session the call belongs to.
    pub session_id: String,
    /// The directory the session works in; workspace tools stay inside it.
    pub workspace: PathBuf,
}

/// The most bytes of one tool result given back to the model; the rest is
/// cut, with a marker saying so.
pub const MAX_TOOL_OUTPUT_BYTES: usize = 256 * 1024;

/// A tool the model can call.
pub trait Tool: Send + Sync {
    /// How the model sees the tool.
    fn spec(&self) -> ToolSpec;

    /// Whether the tool only reads (never changes anything outside itself).
    /// Reading tools run without asking by default, and may be run again
    /// after a crash.
    fn read_only(&self) -> bool {
        false
    }

    /// Whether the tool may run at the same time as other calls of the same
    /// step. When every call of a step is parallel safe they run together.
    fn parallel_safe(&self) -> bool {
        self.read_only()
    }

    /// Runs one call. `arguments` is the JSON object the model produced.
    fn call<'a>(
        &'a self,
        arguments: serde_json::Map<String, serde_json::Value>,
        context: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>>;
}

/// The result of a call, as it goes back to the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutcome {
    /// The result, or the error message.
    pub output: String,
    /// Whether the call failed.
    pub is_error: bool,
}

impl ToolOutcome {
    /// A failed call whose result is `message`.
    pub fn error(message: impl Into<String>) -> Self {
        Self {
            output: message.into(),
            is_error: true,
        }
    }
}

/// Compiled argument schemas, shared by every session whose tool has the
/// same schema: each session has its own built-in tools (they know its
/// workspace) but their schemas are the same, and a compiled schema takes
/// kilobytes, so compiling one per session made an idle session's memory
/// mostly copies of the same validators.
mod validators {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, Weak};

    /// How many entries the table holds before the dead ones are dropped.
    const PRUNE_AT: usize = 1024;

    static TABLE: Mutex<Option<HashMap<String, Weak<jsonschema::Validator>>>> = Mutex::new(None);

    /// The compiled `parameters` of tool `name`, shared while any session
    /// holds it; `None` when the schema does not compile (said in the log).
    pub(super) fn shared(name: &str, parameters: &serde_json::Value) -> Option<Arc<jsonschema::Validator>> {
        let key = parameters.to_string();
        // A poisoned table still holds valid entries: a panic elsewhere
        // cannot leave a half-made `Weak`.
        let mut table = TABLE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let table = table.get_or_insert_with(HashMap::new);
        if let Some(validator) = table.get(&key).and_then(Weak::upgrade) {
            return Some(validator);
        }
        let validator = match jsonschema::validator_for(parameters) {
            Ok(validator) => Arc::new(validator),
            Err(error) => {
                tracing::warn!(tool = %name, %error, "the tool's argument schema does not compile");
                return None;
            }
        };
        if table.len() >= PRUNE_AT {
            table.retain(|_, weak| weak.strong_count() > 0);
        }
        table.insert(key, Arc::downgrade(&validator));
        Some(validator)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn one_schema_is_compiled_once_while_it_is_held() {
            let schema = serde_json::json!({"type": "object", "properties": {"shared-test": {"type": "string"}}});
            let first = shared("a", &schema).expect("compiles");
            let second = shared("b", &schema).expect("compiles");
            assert!(Arc::ptr_eq(&first, &second));
            let other = shared("c", &serde_json::json!({"type": "object", "required": ["shared-test"]}));
            assert!(other.is_some_and(|other| !Arc::ptr_eq(&other, &first)));
            assert!(shared("d", &serde_json::json!({"type": 5})).is_none());
        }
    }
}

/// A tool with its argument schema compiled once.
#[derive(Clone)]
struct Registered {
    tool: Arc<dyn Tool>,
    /// `None` when the tool's schema does not compile; calls are then
    /// checked only for being a JSON object.
    validator: Option<Arc<jsonschema::Validator>>,
}

/// Tools that may change while a session runs: an MCP server's, which says
/// so with `tools/list_changed`. A [`ToolSet`] watching a source takes its
/// changes in at [`ToolSet::refresh`].
pub trait ToolSource: Send + Sync {
    /// The source's tools now.
    fn tools(&self) -> Vec<Arc<dyn Tool>>;

    /// Reads the list again if the source said it changed; whether the
    /// tools differ from what [`Self::tools`] gave before.
    fn refresh(&self) -> BoxFuture<'_, bool>;
}

/// A watched source and the names its tools have in the set.
#[derive(Clone)]
struct Watched {
    source: Arc<dyn ToolSource>,
    names: Vec<String>,
}

/// The tools offered to a session's model, by name.
#[derive(Clone, Default)]
pub struct ToolSet {
    tools: BTreeMap<String, Registered>,
    sources: Vec<Watched>,
}

impl std::fmt::Debug for ToolSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.tools.keys()).finish()
    }
}

impl ToolSet {
    /// No tools.
    pub fn new() -> Self {
        Self::default()
    }

    /// The built-in tools that need nothing but the runtime: `clock`.
    pub fn builtin() -> Self {
        let mut tools = Self::new();
        tools.add(Arc::new(Clock));
        tools
    }

    /// Adds (or replaces) a tool under its spec's name.
    pub fn add(&mut self, tool: Arc<dyn Tool>) {
        let spec = tool.spec();
        let validator = validators::shared(&spec.name, &spec.parameters);
        self.tools.insert(spec.name, Registered { tool, validator });
    }

    /// Adds the tools of `source` (a name already taken keeps its tool) and
    /// watches it: [`Self::refresh`] takes its changes in.
    pub fn add_source(&mut self, source: Arc<dyn ToolSource>) {
        let names = self.add_new(source.tools());
        self.sources.push(Watched { source, names });
    }

    /// Takes in the changes of the watched sources (see [`ToolSource`]);
    /// whether the tools offered changed.
    pub async fn refresh(&mut self) -> bool {
        let mut changed = false;
        for index in 0..self.sources.len() {
            let source = Arc::clone(&self.sources[index].source);
            if !source.refresh().await {
                continue;
            }
            for name in std::mem::take(&mut self.sources[index].names) {
                self.tools.remove(&name);
            }
            self.sources[index].names = self.add_new(source.tools());
            changed = true;
        }
        changed
    }

    /// Adds the tools whose names are free; their names.
    fn add_new(&mut self, tools: Vec<Arc<dyn Tool>>) -> Vec<String> {
        let mut names = Vec::with_capacity(tools.len());
        for tool in tools {
            let name = tool.spec().name;
            if self.tools.contains_key(&name) {
                tracing::warn!(tool = %name, "another tool has this name; this one is left out");
                continue;
            }
            self.add(tool);
            names.push(name);
        }
        names
    }

    /// The names of the tools, sorted.
    pub fn names(&self) -> Vec<String> {
        self.tools.keys().cloned().collect()
    }

    /// The tool called `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name).map(|registered| &registered.tool)
    }

    /// Whether there are no tools.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// The specs the model is given, sorted by name.
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.tools.values().map(|registered| registered.tool.spec()).collect()
    }

    /// Runs `call`. Never fails: every problem becomes an error result.
    pub async fn run(&self, call: &ToolCall, context: &ToolContext) -> ToolOutcome {
        let Some(Registered { tool, validator }) = self.tools.get(&call.name) else {
            let known: Vec<&str> = self.tools.keys().map(String::as_str).collect();
            return ToolOutcome::error(format!(
                "unknown tool '{}'; the tools are: {}",
                call.name,
                known.join(", ")
            ));
        };
        let arguments = match parse_arguments(&call.arguments) {
            Ok(arguments) => arguments,
            Err(message) => return ToolOutcome::error(format!("invalid arguments for '{}': {message}", call.name)),
        };
        if let Some(validator) = validator {
            let instance = serde_json::Value::Object(arguments.clone());
            let problems: Vec<String> = validator
                .iter_errors(&instance)
                .take(5)
                .map(|error| match error.instance_path().to_string() {
                    path if path.is_empty() => error.to_string(),
                    path => format!("{path}: {error}"),
                })
                .collect();
            if !problems.is_empty() {
                return ToolOutcome::error(format!(
                    "invalid arguments for '{}': {}",
                    call.name,
                    problems.join("; ")
                ));
            }
        }
        // A panicking tool is a failed call, not a dead session.
        let run = std::panic::catch_unwind(AssertUnwindSafe(|| tool.call(arguments, context)));
        let outcome = match run {
            Ok(future) => AssertUnwindSafe(future).catch_unwind().await,
            Err(panic) => Err(panic),
        };
        match outcome {
            Ok(Ok(output)) => ToolOutcome {
                output: bounded(output),
                is_error: false,
            },
            Ok(Err(error)) => ToolOutcome::error(bounded(error.to_string())),
            Err(_) => ToolOutcome::error(format!("the tool '{}' crashed", call.name)),
        }
    }

    /// Whether every call of `calls` names a tool that may run in parallel.
    pub fn all_parallel_safe(&self, calls: &[ToolCall]) -> bool {
        calls
            .iter()
            .all(|call| self.get(&call.name).is_some_and(|tool| tool.parallel_safe()))
    }
}

/// The JSON schema of a tool's arguments: an object with `properties`, of
/// which `required` must be present, and no other property. Every built-in
/// tool refuses arguments it does not know, so the schema says so once here.
pub fn object_schema(properties: serde_json::Value, required: &[&str]) -> serde_json::Value {
    let mut schema = serde_json::json!({"type": "object", "properties": properties});
    if !required.is_empty() {
        schema["required"] = serde_json::json!(required);
    }
    schema["additionalProperties"] = serde_json::Value::Bool(false);
    schema
}

/// `output` cut to [`MAX_TOOL_OUTPUT_BYTES`] (on a character boundary), with
/// a marker saying how much was left out.
pub fn bounded(mut output: String) -> String {
    if output.len() <= MAX_TOOL_OUTPUT_BYTES {
        return output;
    }
    let mut end = MAX_TOOL_OUTPUT_BYTES;
    while !output.is_char_boundary(end) {
        end -= 1;
    }
    let omitted = output.len() - end;
    output.truncate(end);
    output.push_str(&format!("\n…[truncated: {omitted} more bytes]"));
    output
}

/// The arguments as a JSON object; an empty string counts as `{}`.
fn parse_arguments(text: &str) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    if text.trim().is_empty() {
        return Ok(serde_json::Map::new());
    }
    match serde_json::from_str(text) {
        Ok(serde_json::Value::Object(object)) => Ok(object),
        Ok(other) => Err(format!("expected a JSON object, got {}", json_kind(&other))),
        Err(error) => Err(format!("not valid JSON ({error})")),
    }
}

fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, arguments: &str) -> ToolCall {
        ToolCall {
            call_id: "c1".into(),
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    fn context() -> ToolContext {
        ToolContext {
            session_id: "s".into(),
            workspace: PathBuf::from("."),
        }
    }

    struct Panics;

    impl Tool for Panics {
        fn spec(&self) -> ToolSpec {
            ToolSpec {
                name: "panics".into(),
                description: "panics".into(),
                parameters: serde_json::json!({"type": "object"}),
            }
        }

        fn call<'a>(
            &'a self,
            _arguments: serde_json::Map<String, serde_json::Value>,
            _context: &'a ToolContext,
        ) -> BoxFuture<'a, Result<String, ToolError>> {
            Box::pin(async { panic!("tool bug") })
        }
    }

    #[tokio::test]
    async fn bad_calls_become_error_results() {
        let mut tools = ToolSet::builtin();
        tools.add(Arc::new(Panics));
        let unknown = tools.run(&call("teleport", "{}"), &context()).await;
        assert!(
            unknown.is_error && unknown.output.contains("unknown tool 'teleport'"),
            "{unknown:?}"
        );
        assert!(unknown.output.contains("clock"), "{unknown:?}");
        let malformed = tools.run(&call("clock", r#"{"utc": tru"#), &context()).await;
        assert!(
            malformed.is_error && malformed.output.contains("not valid JSON"),
            "{malformed:?}"
        );
        let not_object = tools.run(&call("clock", "[1, 2]"), &context()).await;
        assert!(
            not_object.is_error && not_object.output.contains("an array"),
            "{not_object:?}"
        );
        let panicked = tools.run(&call("panics", "{}"), &context()).await;
        assert_eq!(panicked, ToolOutcome::error("the tool 'panics' crashed"));
    }

    #[tokio::test]
    async fn arguments_are_checked_against_the_schema() {
        struct Typed;
        impl Tool for Typed {
            fn spec(&self) -> ToolSpec {
                ToolSpec {
                    name: "typed".into(),
                    description: "takes a path".into(),
                    parameters: serde_json::json!({
                        "type": "object",
                        "properties": {"path": {"type": "string"}, "limit": {"type": "integer", "minimum": 1}},
                        "required": ["path"],
                        "additionalProperties": false
                    }),
                }
            }
            fn call<'a>(
                &'a self,
                _arguments: serde_json::Map<String, serde_json::Value>,
                _context: &'a ToolContext,
            ) -> BoxFuture<'a, Result<String, ToolError>> {
                Box::pin(async { Ok("ran".into()) })
            }
        }
        let mut tools = ToolSet::new();
        tools.add(Arc::new(Typed));
        let ok = tools
            .run(&call("typed", r#"{"path": "a.txt", "limit": 2}"#), &context())
            .await;
        assert_eq!(
            ok,
            ToolOutcome {
                output: "ran".into(),
                is_error: false
            }
        );
        for (arguments, expected) in [
            (r#"{"limit": 2}"#, "\"path\" is a required property"),
            (r#"{"path": 7}"#, "/path: 7 is not of type \"string\""),
            (
                r#"{"path": "a", "limit": 0}"#,
                "/limit: 0 is less than the minimum of 1",
            ),
            (r#"{"path": "a", "mode": "x"}"#, "Additional properties are not allowed"),
        ] {
            let refused = tools.run(&call("typed", arguments), &context()).await;
            assert!(refused.is_error, "{arguments}: {refused:?}");
            assert!(
                refused.output.starts_with("invalid arguments for 'typed': "),
                "{refused:?}"
            );
            assert!(
                refused.output.contains(expected),
                "{arguments}: {} lacks {expected}",
                refused.output
            );
        }
    }

    #[test]
    fn long_outputs_are_cut_with_a_marker() {
        let long = "é".repeat(MAX_TOOL_OUTPUT_BYTES);
        let cut = bounded(long.clone());
        assert!(cut.len() < long.len());
        assert!(cut.ends_with(&format!(
            "…[truncated: {} more bytes]",
            long.len() - MAX_TOOL_OUTPUT_BYTES
        )));
        assert_eq!(bounded("short".into()), "short");
    }

    #[tokio::test]
    async fn empty_arguments_mean_an_empty_object() {
        let outcome = ToolSet::builtin().run(&call("clock", ""), &context()).await;
        assert!(!outcome.is_error, "{outcome:?}");
    }
}
