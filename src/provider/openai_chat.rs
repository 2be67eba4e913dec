//! OpenAI Chat Completions (the adapter is being written; this is its shape).

use super::ProviderSettings;
use super::http::HttpClient;
use crate::model::{BoxFuture, Model, ModelEventSink, ModelOutput, ModelRequest};
use crate::{Error, Result};

/// A model behind the OpenAI Chat Completions API.
#[derive(Debug)]
pub struct OpenAiChat {
    settings: ProviderSettings,
    http: HttpClient,
}

impl OpenAiChat {
    /// A client for the model and endpoint in `settings`.
    pub fn new(settings: ProviderSettings) -> Result<Self> {
        let http = HttpClient::new(settings.name.clone(), settings.http.clone())?;
        Ok(Self { settings, http })
    }
}

impl Model for OpenAiChat {
    fn respond<'a>(
        &'a self,
        _request: ModelRequest<'a>,
        _events: ModelEventSink,
    ) -> BoxFuture<'a, Result<ModelOutput>> {
        let _ = &self.http;
        Box::pin(async { Err(Error::Model("not implemented yet".into())) })
    }

    fn name(&self) -> String {
        format!("{}:{}", self.settings.name, self.settings.model)
    }
}
