//! Choosing a model from a spec string such as `script:answers.jsonl`.

use std::sync::Arc;

use super::{Model, ScriptedModel};
use crate::{Error, Result};

/// Builds the model named by `spec` (`provider:rest`). Fails with a one-line
/// [`Error::Config`] for an unknown provider or an unusable argument.
pub fn model_from_spec(spec: &str) -> Result<Arc<dyn Model>> {
    let Some((provider, rest)) = spec.split_once(':') else {
        return Err(Error::Config(format!(
            "model spec '{spec}' has no provider; write it as provider:name, for example script:answers.jsonl"
        )));
    };
    match provider {
        "script" => Ok(Arc::new(ScriptedModel::load(rest)?)),
        other => Err(Error::Config(format!(
            "unknown model provider '{other}' (known: script)"
        ))),
    }
}
