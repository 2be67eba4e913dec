//! The model of a local chat's session, which `/model` replaces while the
//! session runs: the runtime keeps one model for its session, this one
//! hands each call to whichever model is current.

use std::sync::{Arc, RwLock};

use keel::Model;
use keel::model::{BoxFuture, ContextLimits, ModelEventSink, ModelOutput, ModelRequest};

/// A model that passes each call on to the one set last.
pub(super) struct SwitchableModel {
    current: RwLock<Arc<dyn Model>>,
}

impl SwitchableModel {
    /// Starts with `model`.
    pub(super) fn new(model: Arc<dyn Model>) -> Self {
        Self {
            current: RwLock::new(model),
        }
    }

    /// The model from the next call on (a call under way goes on with the
    /// one it started with).
    pub(super) fn set(&self, model: Arc<dyn Model>) {
        match self.current.write() {
            Ok(mut current) => *current = model,
            Err(poisoned) => *poisoned.into_inner() = model,
        }
    }

    fn current(&self) -> Arc<dyn Model> {
        match self.current.read() {
            Ok(current) => Arc::clone(&current),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }
}

impl Model for SwitchableModel {
    fn respond<'a>(
        &'a self,
        request: ModelRequest<'a>,
        events: ModelEventSink,
    ) -> BoxFuture<'a, keel::Result<ModelOutput>> {
        let model = self.current();
        Box::pin(async move { model.respond(request, events).await })
    }

    fn name(&self) -> String {
        self.current().name()
    }

    fn context_limits(&self) -> Option<ContextLimits> {
        self.current().context_limits()
    }

    fn provider_name(&self) -> Option<&'static str> {
        self.current().provider_name()
    }

    fn request_parameters(&self) -> keel::model::RequestParameters {
        self.current().request_parameters()
    }
}
