use super::*;

fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
    move |name| {
        pairs
            .iter()
            .find(|(key, _)| *key == name)
            .map(|(_, value)| (*value).to_owned())
    }
}

fn error(result: Result<Arc<dyn Model>>) -> String {
    match result {
        Ok(model) => panic!("expected an error, got {}", model.name()),
        Err(error) => error.to_string(),
    }
}

#[test]
fn specs_pick_provider_endpoint_and_key() {
    let config = KeelConfig::default();
    let keys = env(&[("OPENAI_API_KEY", "sk-test"), ("ANTHROPIC_API_KEY", "sk-ant")]);
    for spec in [
        "openai:gpt-4.1-mini",
        "openai-responses:gpt-4.1-mini",
        "anthropic:claude-sonnet-4-5",
        "ollama:llama3.2",
    ] {
        let model = config
            .model_with_env(spec, &keys)
            .unwrap_or_else(|error| panic!("{spec}: {error}"));
        assert!(
            model
                .name()
                .contains(spec.split_once(':').map_or(spec, |(_, name)| name)),
            "{}",
            model.name()
        );
    }
    assert!(
        config.model_with_env("ollama:llama3.2", &env(&[])).is_ok(),
        "ollama needs no key"
    );
}

#[test]
fn context_limits_come_from_the_entry_the_spec_or_the_known_model() {
    let config: KeelConfig = toml::from_str(
        r#"
        [models.small]
        provider = "openai"
        model = "qwen"
        base_url = "http://127.0.0.1:8000/v1"
        context_window = 8000
        compact_threshold = 0.5
        "#,
    )
    .expect("parse");
    let limits = |spec: &str| {
        let model = config
            .model_with_env(spec, &env(&[("OPENAI_API_KEY", "k"), ("ANTHROPIC_API_KEY", "k")]))
            .unwrap_or_else(|error| panic!("{spec}: {error}"));
        model.context_limits().map(|limits| (limits.window, limits.threshold))
    };
    assert_eq!(limits("small"), Some((8000, 0.5)));
    assert_eq!(limits("small?compact_threshold=0.9"), Some((8000, 0.9)));
    assert_eq!(limits("anthropic:claude-sonnet-4-5"), Some((200_000, 0.8)));
    assert_eq!(limits("openai:some-unknown-model"), None);
    assert!(error(config.model_with_env("small?compact_threshold=1.5", &env(&[]))).contains("compact_threshold"));
}

#[test]
fn missing_keys_and_unknown_names_are_one_line_errors() {
    let config = KeelConfig::default();
    let missing = error(config.model_with_env("openai:gpt-4.1-mini", &env(&[])));
    assert_eq!(
        missing,
        "invalid configuration: model 'openai:gpt-4.1-mini' (openai provider) needs an API key: set OPENAI_API_KEY \
         in the environment (or name another variable with api_key_env in keel.toml)"
    );
    assert!(error(config.model_with_env("anthropic:claude", &env(&[]))).contains("ANTHROPIC_API_KEY"));
    assert!(error(config.model_with_env("gemini:pro", &env(&[]))).contains("unknown model provider 'gemini'"));
    assert!(error(config.model_with_env("fast", &env(&[]))).contains("unknown model 'fast'"));
    assert!(error(config.model_with_env("openai:", &env(&[]))).contains("names no model"));
    assert!(!missing.contains('\n'));
}

#[test]
fn a_custom_endpoint_needs_a_key_only_when_the_entry_names_one() {
    let config: KeelConfig = toml::from_str(
        r#"
        model = "local"
        [models.local]
        provider = "openai"
        model = "qwen"
        base_url = "http://127.0.0.1:8000/v1"

        [models.proxy]
        provider = "openai"
        model = "gpt"
        base_url = "http://127.0.0.1:4000"
        api_key_env = "PROXY_KEY"
        headers = { "X-Team" = "keel" }
        max_output_tokens = 1024
        temperature = 0.5
        "#,
    )
    .expect("config");
    assert_eq!(config.model.as_deref(), Some("local"));
    assert!(config.model_with_env("local", &env(&[])).is_ok());
    assert!(error(config.model_with_env("proxy", &env(&[]))).contains("set PROXY_KEY"));
    assert!(config.model_with_env("proxy", &env(&[("PROXY_KEY", "k")])).is_ok());
    // OPENAI_BASE_URL moves `openai:` specs to another endpoint, keyless.
    assert!(
        config
            .model_with_env("openai:m", &env(&[("OPENAI_BASE_URL", "http://127.0.0.1:1/v1")]))
            .is_ok()
    );
}

#[test]
fn positions_count_lines_and_characters_from_one() {
    let text = "a = 1\nbé = \"x\"\n";
    assert_eq!(line_and_column(text, 0), (1, 1));
    assert_eq!(line_and_column(text, 6), (2, 1));
    assert_eq!(line_and_column(text, 10), (2, 4), "é is one character of two bytes");
    assert_eq!(line_and_column(text, text.len() + 5), (3, 1));
}

#[test]
fn spec_options_are_checked() {
    let config = KeelConfig::default();
    let keyless = env(&[("OPENAI_BASE_URL", "http://127.0.0.1:1/v1")]);
    assert!(
        config
            .model_with_env("ollama:llama3.2:3b?max_output_tokens=64&temperature=0", &keyless)
            .is_ok()
    );
    assert!(error(config.model_with_env("openai:m?max_output_tokens=-1", &keyless)).contains("max_output_tokens"));
    assert!(error(config.model_with_env("openai:m?seed=1", &keyless)).contains("unknown model option 'seed'"));
    assert!(error(config.model_with_env("openai:m?max_output_tokens", &keyless)).contains("no value"));
    assert!(error(config.model_with_env("script:x.jsonl?temperature=1", &keyless)).contains("no options"));
}

#[test]
fn the_request_deadlines_are_per_model_settings() {
    let config: KeelConfig = toml::from_str(
        "[models.local]\nprovider = \"openai\"\nmodel = \"m\"\nbase_url = \"http://127.0.0.1:8080/v1\"\n\
         response_timeout_secs = 15\nstep_timeout_secs = 600\n",
    )
    .expect("parse");
    let entry = &config.models["local"];
    assert_eq!(
        (entry.response_timeout_secs, entry.step_timeout_secs),
        (Some(15), Some(600))
    );
    assert!(config.model_with_env("local", &env(&[])).is_ok());
}

#[test]
fn unknown_fields_in_the_file_are_errors() {
    let bad = toml::from_str::<KeelConfig>("[models.x]\nprovider = \"openai\"\nmodel = \"m\"\nkey = \"sk\"\n");
    assert!(bad.is_err());
}

#[test]
fn a_bad_mcp_entry_fails_loading_the_file() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("keel.toml");
    std::fs::write(&path, "[mcp.servers.x]\ncommand = \"a\"\nurl = \"http://h/mcp\"\n").expect("write");
    let message = KeelConfig::load(&path).expect_err("invalid").to_string();
    assert_eq!(
        message,
        format!(
            "invalid configuration: {}:1:2: [mcp.servers.x]: give either `command` or `url`, not both (in `[mcp.servers.x]`)",
            path.display()
        )
    );
}

#[test]
fn bots_set_their_sessions_defaults() {
    let path = Path::new("/etc/keel/keel.toml");
    let config = KeelConfig::parse(
        r#"
        [bots.support]
        coding_agent = false
        instructions = "Answer customers."
        model = "openai:gpt-4.1-mini"

        [bots.reviewer]
        queue_mode = "each"
        "#,
        path,
    )
    .expect("parse");
    let support = config.bot("support");
    assert!(!support.is_coding_agent());
    assert_eq!(support.queue_mode(), keel_agent::QueueMode::Each);
    assert_eq!(support.default_instructions(true).as_deref(), Some("Answer customers."));
    assert_eq!(support.model.as_deref(), Some("openai:gpt-4.1-mini"));

    let reviewer = config.bot("reviewer");
    assert_eq!(reviewer.queue_mode(), keel_agent::QueueMode::Each);
    assert_eq!(
        reviewer.default_instructions(true).as_deref(),
        Some(keel_agent::CODING_AGENT_PROMPT)
    );
    assert_eq!(reviewer.default_instructions(false), None, "no tools, no coding prompt");

    let unlisted = config.bot("anyone");
    assert!(unlisted.is_coding_agent());
    assert_eq!(unlisted.queue_mode(), keel_agent::QueueMode::Merge);
}

#[test]
fn a_bad_bots_table_names_the_file_line_and_column() {
    let path = Path::new("keel.toml");
    let error = |text: &str| match KeelConfig::parse(text, path) {
        Ok(_) => panic!("{text} parsed"),
        Err(error) => error.to_string(),
    };
    let unknown = error("[bots.support]\ncoding_agent = false\nprompt = \"hi\"\n");
    assert!(
        unknown.starts_with("invalid configuration: keel.toml:3:1: unknown field `prompt`"),
        "{unknown}"
    );
    let mode = error("[bots.support]\nqueue_mode = \"all\"\n");
    assert!(mode.contains("keel.toml:2:14: unknown variant `all`"), "{mode}");
    let id = error("[bots.\"tab\\there\"]\ncoding_agent = false\n");
    assert!(id.contains("keel.toml:1:"), "{id}");
    assert!(id.contains("must be 1 to 128 printable ASCII characters"), "{id}");
}
