//! [`MeteredModel`]: the model decorator behind the per-provider model
//! metrics and the token counts.

use std::sync::Arc;
use std::time::Instant;

use super::{Metrics, ProviderLabel, TokenLabels};
use keel_model::{BoxFuture, Model, ModelEventSink, ModelOutput, ModelRequest};
use keel_protocol::{Result, TokenUsage};

/// A model that times its requests into `keel_model_request_seconds`,
/// counts failures into `keel_model_errors_total`, labelled by provider,
/// and adds the tokens each answer reports to `keel_model_tokens_total`
/// (also labelled by the session's bot). A request cancelled (an
/// interrupted turn) counts as none of them. The labels are bounded (see
/// [`LabelBudget`]); a bot takes one of the bots' labels when it first
/// uses tokens, not when its session is loaded.
pub(crate) struct MeteredModel {
    inner: Arc<dyn Model>,
    label: ProviderLabel,
    bot: String,
    metrics: Arc<Metrics>,
}

impl MeteredModel {
    pub(crate) fn new(inner: Arc<dyn Model>, provider: String, bot: String, metrics: Arc<Metrics>) -> Self {
        let provider = metrics.providers.label(&provider);
        Self {
            inner,
            label: ProviderLabel { provider },
            bot,
            metrics,
        }
    }

    fn count_tokens(&self, usage: &TokenUsage) {
        let bot = self.metrics.bots.label(&self.bot);
        for (kind, tokens) in [
            ("input", usage.input_tokens),
            ("cached_input", usage.cached_input_tokens),
            ("output", usage.output_tokens),
            ("reasoning", usage.reasoning_tokens),
        ] {
            let labels = TokenLabels {
                provider: self.label.provider.clone(),
                bot: bot.clone(),
                kind,
            };
            self.metrics.model_tokens.get_or_create(&labels).inc_by(tokens);
        }
    }
}

impl Model for MeteredModel {
    fn respond<'a>(&'a self, request: ModelRequest<'a>, events: ModelEventSink) -> BoxFuture<'a, Result<ModelOutput>> {
        Box::pin(async move {
            let start = Instant::now();
            let result = self.inner.respond(request, events).await;
            self.metrics
                .model_request
                .get_or_create(&self.label)
                .observe(start.elapsed().as_secs_f64());
            match &result {
                Ok(output) => {
                    if let Some(usage) = &output.usage {
                        self.count_tokens(usage);
                    }
                }
                Err(_) => {
                    self.metrics.model_errors.get_or_create(&self.label).inc();
                }
            }
            result
        })
    }

    fn name(&self) -> String {
        self.inner.name()
    }

    fn context_limits(&self) -> Option<keel_model::ContextLimits> {
        self.inner.context_limits()
    }

    fn provider_name(&self) -> Option<&'static str> {
        self.inner.provider_name()
    }

    fn request_parameters(&self) -> keel_model::RequestParameters {
        self.inner.request_parameters()
    }
}
