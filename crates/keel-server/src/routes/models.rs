//! `GET /v1/models`: the models this server is configured with, so that a
//! client can offer a picker before it creates a session or switches one.

use std::sync::Arc;

use axum::extract::State;
use axum::{Extension, Json};
use serde::Serialize;
use utoipa::ToSchema;

use crate::Server;
use crate::auth::{Principal, Scope};
use crate::error::ApiError;
use crate::factory::SessionFactory;
use crate::openapi::errors::route_errors;

/// One model a session can use.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ModelView {
    /// What to send as `model`: the operator's spec (`--model`, keel.toml
    /// `model`) or the name of a keel.toml `[models.NAME]` entry.
    spec: String,
    /// The provider behind it (`openai`, `anthropic`, `script`, …), when
    /// known.
    provider: Option<String>,
    /// The provider's model name (or a script's file), for a keel.toml
    /// entry.
    model: Option<String>,
    /// Whether sessions that name no model get this one.
    default: bool,
}

/// The models of this server.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ModelList {
    /// The default model first, then keel.toml's named models by name.
    models: Vec<ModelView>,
    /// The spec of the default model; `None` when the server has none (a
    /// session must then name its model).
    default: Option<String>,
}

route_errors!(
    /// What `GET /v1/models` can answer besides `200`.
    ListErrors: ["missing_scope_read"]
);

/// `GET /v1/models`.
#[utoipa::path(
    get,
    path = "/models",
    tag = "sessions",
    operation_id = "list_models",
    summary = "List the server's models",
    description = "The models the operator configured: the default model (`keel serve --model` or keel.toml \
        `model`) and keel.toml's `[models.NAME]` entries. Never their keys, headers or URLs. A client may also \
        send any other spec the server can build (`provider:model`).",
    security(("bearer" = ["read"])),
    responses((status = 200, description = "The models.", body = ModelList), ListErrors),
)]
pub(crate) async fn list(
    State(server): State<Arc<Server>>,
    Extension(principal): Extension<Principal>,
) -> Result<Json<ModelList>, ApiError> {
    principal.require(Scope::Read)?;
    Ok(Json(model_list(&server.host.factory)))
}

/// The models `factory` offers.
fn model_list(factory: &SessionFactory) -> ModelList {
    let default = factory.default_model.clone();
    let mut models: Vec<ModelView> = default
        .iter()
        .filter(|spec| !factory.keel.models.contains_key(spec.as_str()))
        .map(|spec| ModelView {
            spec: spec.clone(),
            provider: factory.keel.provider_of(spec),
            model: spec.split_once(':').map(|(_, model)| model.to_owned()),
            default: true,
        })
        .collect();
    models.extend(factory.keel.models.iter().map(|(name, entry)| ModelView {
        spec: name.clone(),
        provider: Some(entry.provider.clone()),
        model: Some(entry.model.clone()),
        default: default.as_deref() == Some(name.as_str()),
    }));
    // The default first, whichever way it was named.
    models.sort_by_key(|model| !model.default);
    ModelList { models, default }
}
