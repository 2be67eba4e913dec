//! The providers a configuration may name, each with its defaults (endpoint,
//! key variable) and the wire format its models speak: parsed once from
//! the name in `keel.toml` or a model spec, then everything dispatches on it.

use std::sync::Arc;

use keel_model::Model;
use strum::IntoEnumIterator;

use crate::ProviderSettings;
use crate::anthropic::Anthropic;
use crate::openai_chat::OpenAiChat;
use crate::openai_responses::OpenAiResponses;

/// A kind of model provider, by the name specs and `keel.toml` give it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::EnumString, strum::Display, strum::EnumIter)]
pub enum ProviderKind {
    /// OpenAI Chat Completions (`openai`).
    #[strum(serialize = "openai")]
    OpenAi,
    /// OpenAI Responses (`openai-responses`).
    #[strum(serialize = "openai-responses")]
    OpenAiResponses,
    /// Anthropic Messages (`anthropic`).
    #[strum(serialize = "anthropic")]
    Anthropic,
    /// Ollama's Chat Completions endpoint on this machine (`ollama`).
    #[strum(serialize = "ollama")]
    Ollama,
}

/// What a kind of provider defaults to, and how its models are built.
#[derive(Debug, Clone, Copy)]
pub struct ProviderProfile {
    /// The base URL when neither the entry nor the environment gives one.
    pub base_url: &'static str,
    /// The environment variable that moves the endpoint, if any.
    pub base_url_env: Option<&'static str>,
    /// The environment variable the key is read from by default.
    pub key_env: &'static str,
    /// Whether the default endpoint needs a key.
    pub needs_key: bool,
    /// Builds a model of this kind from its settings.
    pub build: fn(ProviderSettings) -> keel_protocol::Result<Arc<dyn Model>>,
}

impl ProviderKind {
    /// The kind's defaults and its wire format: the one place a provider is
    /// described.
    pub fn profile(self) -> ProviderProfile {
        const OPENAI_BASE_URL: &str = "https://api.openai.com/v1";
        match self {
            ProviderKind::OpenAi => ProviderProfile {
                base_url: OPENAI_BASE_URL,
                base_url_env: Some("OPENAI_BASE_URL"),
                key_env: "OPENAI_API_KEY",
                needs_key: true,
                build: |settings| Ok(Arc::new(OpenAiChat::new(settings)?)),
            },
            ProviderKind::OpenAiResponses => ProviderProfile {
                base_url: OPENAI_BASE_URL,
                base_url_env: Some("OPENAI_BASE_URL"),
                key_env: "OPENAI_API_KEY",
                needs_key: true,
                build: |settings| Ok(Arc::new(OpenAiResponses::new(settings)?)),
            },
            ProviderKind::Anthropic => ProviderProfile {
                base_url: "https://api.anthropic.com",
                base_url_env: Some("ANTHROPIC_BASE_URL"),
                key_env: "ANTHROPIC_API_KEY",
                needs_key: true,
                build: |settings| Ok(Arc::new(Anthropic::new(settings)?)),
            },
            ProviderKind::Ollama => ProviderProfile {
                base_url: "http://localhost:11434/v1",
                base_url_env: None,
                key_env: "OLLAMA_API_KEY",
                needs_key: false,
                build: |settings| Ok(Arc::new(OpenAiChat::new(settings)?)),
            },
        }
    }

    /// A model of this kind with `settings`.
    pub fn build(self, settings: ProviderSettings) -> keel_protocol::Result<Arc<dyn Model>> {
        (self.profile().build)(settings)
    }

    /// Every kind, in the order messages list them.
    pub fn all() -> impl Iterator<Item = ProviderKind> {
        ProviderKind::iter()
    }

    /// The names of every kind, for messages: `openai, openai-responses, …`.
    pub fn names() -> String {
        Self::all().map(|kind| kind.to_string()).collect::<Vec<_>>().join(", ")
    }

    /// The variables the providers read their keys from by default, each
    /// once.
    pub fn key_variables() -> Vec<&'static str> {
        let mut variables: Vec<&'static str> = Vec::new();
        for kind in Self::all() {
            let variable = kind.profile().key_env;
            if !variables.contains(&variable) {
                variables.push(variable);
            }
        }
        variables
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_to_their_kind_and_unknown_ones_do_not() {
        for kind in ProviderKind::all() {
            assert_eq!(kind.to_string().parse::<ProviderKind>().ok(), Some(kind));
        }
        assert!("gemini".parse::<ProviderKind>().is_err());
        assert!("script".parse::<ProviderKind>().is_err(), "scripts are no provider");
        assert_eq!(ProviderKind::names(), "openai, openai-responses, anthropic, ollama");
        assert_eq!(
            ProviderKind::key_variables(),
            ["OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OLLAMA_API_KEY"]
        );
    }
}
