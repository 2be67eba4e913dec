//! `/v1/keys` (API keys, for `admin`) and `/v1/whoami` (who a credential
//! is, for any principal).
//!
//! A tenant's admin sees and manages only its own tenant's keys (another
//! tenant's key is `404`, as an unknown one); the operator manages every
//! tenant's. A key is shown once, in the answer that makes it; listings
//! carry neither secrets nor hashes.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use keel_protocol::ActorKind;
use keel_store::{AccessStore, ApiKeyRecord};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::Server;
use crate::auth::keys::{KeyTable, new_api_key};
use crate::auth::{Principal, Scope, Scopes, now_ms};
use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::openapi::errors::{BODY, NONE, route_errors};

/// The body of `POST /v1/keys`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateKey {
    /// The tenant the key acts for; the caller's own by default (the
    /// operator's is `default`). A tenant's admin may name only its own.
    #[schema(min_length = 1, max_length = 128, pattern = r"^[ -$&-~]+$")]
    tenant: Option<String>,
    /// A name for people ("ci", "alice's laptop"): no control characters.
    #[schema(min_length = 1, max_length = 128, pattern = r"^[^\x00-\x1f\x7f-\x9f]+$")]
    name: String,
    /// What the key may do.
    #[schema(min_items = 1)]
    scopes: Vec<Scope>,
    /// When the key stops working (ms since the Unix epoch); for ever
    /// without it. A time already past makes a key that never works.
    #[serde(default, deserialize_with = "crate::extract::json_int64")]
    expires_at_ms: Option<u64>,
}

/// An API key as listed: never its secret nor its hash.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct KeyView {
    /// The key's public id (the part after `keel_`, before the secret).
    id: String,
    /// The tenant it acts for.
    tenant: String,
    /// Its name.
    name: String,
    /// Its scopes.
    scopes: Vec<String>,
    /// When it was made (ms since the Unix epoch).
    created_at_ms: u64,
    /// When it was last used, as last recorded (uses are written every
    /// few seconds).
    last_used_at_ms: Option<u64>,
    /// When it stops working, if it does.
    expires_at_ms: Option<u64>,
    /// When it was revoked, if it was.
    revoked_at_ms: Option<u64>,
}

impl From<ApiKeyRecord> for KeyView {
    fn from(record: ApiKeyRecord) -> Self {
        Self {
            id: record.id,
            tenant: record.tenant,
            name: record.name,
            scopes: record.scopes,
            created_at_ms: record.created_at_ms,
            last_used_at_ms: record.last_used_at_ms,
            expires_at_ms: record.expires_at_ms,
            revoked_at_ms: record.revoked_at_ms,
        }
    }
}

/// The answer of `POST /v1/keys`: the key, this once, and what was stored.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct CreatedKey {
    /// The whole key (`keel_<id>_<secret>`), to send as
    /// `Authorization: Bearer …`. It is not kept and cannot be shown again.
    key: String,
    /// The key as listed.
    #[serde(flatten)]
    view: KeyView,
}

/// The body of `GET /v1/keys`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct KeyList {
    /// The keys the caller may manage, revoked and expired ones included,
    /// oldest first.
    keys: Vec<KeyView>,
}

/// The body of `GET /v1/whoami`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct WhoAmI {
    /// The principal's tenant; `null` for the operator, who sees every
    /// tenant.
    tenant: Option<String>,
    /// The principal's id: the key's id, the JWT's subject, or `operator`.
    principal_id: String,
    /// How it authenticated.
    kind: ActorKind,
    /// The key's name or the JWT's subject; `null` for the operator.
    name: Option<String>,
    /// Its scopes, in order (`read`, `submit`, `approve`, `admin`).
    scopes: Vec<Scope>,
}

route_errors!(
    /// What `GET /v1/whoami` can answer besides `200`.
    WhoAmIErrors: NONE
);

route_errors!(
    /// What `POST /v1/keys` can answer besides `201`.
    CreateKeyErrors: BODY, ["missing_scope_admin", "not_found", "conflict", "tenant_forbidden"]
);

route_errors!(
    /// What `GET /v1/keys` can answer besides `200`.
    ListKeysErrors: ["missing_scope_admin", "not_found"]
);

route_errors!(
    /// What `DELETE /v1/keys/{id}` can answer besides `204`.
    RevokeKeyErrors: ["missing_scope_admin", "not_found"]
);

/// `GET /v1/whoami`.
#[utoipa::path(
    get,
    path = "/whoami",
    tag = "auth",
    operation_id = "whoami",
    summary = "Who the credential is",
    description = "The principal the request's credential stands for: its tenant, id, kind and scopes (for a \
        client that shows or hides what the scopes allow).",
    responses((status = 200, description = "The principal.", body = WhoAmI), WhoAmIErrors),
)]
pub(crate) async fn whoami(Extension(principal): Extension<Principal>) -> Json<WhoAmI> {
    Json(WhoAmI {
        tenant: principal.tenant_filter().map(str::to_owned),
        principal_id: principal.actor.principal_id.clone(),
        kind: principal.actor.kind,
        name: principal.actor.name.clone(),
        scopes: principal.scopes.iter().collect(),
    })
}

/// The store of keys and this node's table, `404` on a server without.
fn access(server: &Server) -> Result<(&Arc<dyn AccessStore>, &Arc<KeyTable>), ApiError> {
    server
        .access
        .as_ref()
        .zip(server.auth.keys.as_ref())
        .ok_or_else(|| ApiError::NotFound("this server keeps no API keys".to_owned()))
}

/// `POST /v1/keys`.
#[utoipa::path(
    post,
    path = "/keys",
    tag = "auth",
    operation_id = "create_key",
    summary = "Make an API key",
    description = "Makes a key for a tenant with the given scopes (admin only; a tenant's admin only for its own \
        tenant). The answer holds the key itself, which is shown this once; only its SHA-256 is stored. The key \
        works on every node within a second.",
    security(("bearer" = ["admin"])),
    request_body = CreateKey,
    responses((status = 201, description = "The key, shown once.", body = CreatedKey), CreateKeyErrors),
)]
pub(crate) async fn create(
    State(server): State<Arc<Server>>,
    Extension(principal): Extension<Principal>,
    ApiJson(body): ApiJson<CreateKey>,
) -> Result<(StatusCode, Json<CreatedKey>), ApiError> {
    principal.require(Scope::Admin)?;
    let (store, table) = access(&server)?;
    let tenant = body.tenant.unwrap_or_else(|| principal.actor.tenant.clone());
    if !principal.sees(&tenant) {
        return Err(ApiError::MissingScope(Scope::Admin));
    }
    if tenant == keel_protocol::DEFAULT_TENANT && !server.auth.allow_default_tenant {
        // It would be refused at every request: say so now.
        return Err(ApiError::Forbidden {
            code: "tenant_forbidden",
            message: "a key for the tenant `default` (the operator's own sessions) works only with keel.toml's \
                `[auth] allow_default_tenant = true`: name another `tenant`"
                .to_owned(),
        });
    }
    let scopes = Scopes::of(body.scopes).iter().collect::<Vec<_>>();
    let made = new_api_key(&tenant, &body.name, &scopes, body.expires_at_ms, now_ms())
        .map_err(|error| ApiError::InvalidRequest(error.to_string()))?;
    store.create_api_key(&made.record).await?;
    reload(table).await;
    tracing::info!(key_id = %made.record.id, tenant = %tenant, "API key made");
    Ok((
        StatusCode::CREATED,
        Json(CreatedKey {
            key: made.key,
            view: KeyView::from(made.record),
        }),
    ))
}

/// `GET /v1/keys`.
#[utoipa::path(
    get,
    path = "/keys",
    tag = "auth",
    operation_id = "list_keys",
    summary = "List API keys",
    description = "The keys the caller may manage (admin only: a tenant's admin sees its own tenant's), revoked and \
        expired ones included, without secrets or hashes.",
    security(("bearer" = ["admin"])),
    responses((status = 200, description = "The keys.", body = KeyList), ListKeysErrors),
)]
pub(crate) async fn list(
    State(server): State<Arc<Server>>,
    Extension(principal): Extension<Principal>,
) -> Result<Json<KeyList>, ApiError> {
    principal.require(Scope::Admin)?;
    let (store, _) = access(&server)?;
    let keys = store
        .api_keys()
        .await?
        .into_iter()
        .filter(|record| principal.sees(&record.tenant))
        .map(KeyView::from)
        .collect();
    Ok(Json(KeyList { keys }))
}

/// `DELETE /v1/keys/{id}`.
#[utoipa::path(
    delete,
    path = "/keys/{id}",
    tag = "auth",
    operation_id = "revoke_key",
    summary = "Revoke an API key",
    description = "Revokes a key (admin only: a tenant's admin only its own tenant's; another tenant's is `404`). \
        It stops working on every node within a second, its open event streams and WebSockets included. \
        Revoking a revoked key keeps the first revocation's time.",
    security(("bearer" = ["admin"])),
    params(("id" = String, Path, description = "The key's id.")),
    responses((status = 204, description = "The key is revoked."), RevokeKeyErrors),
)]
pub(crate) async fn revoke(
    State(server): State<Arc<Server>>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    principal.require(Scope::Admin)?;
    let (store, table) = access(&server)?;
    let unknown = || ApiError::NotFound(format!("no API key '{id}'"));
    let keys = store.api_keys().await?;
    let key = keys.iter().find(|record| record.id == id).ok_or_else(unknown)?;
    if !principal.sees(&key.tenant) {
        return Err(unknown());
    }
    if !store.revoke_api_key(&id, now_ms()).await? {
        return Err(unknown());
    }
    reload(table).await;
    tracing::info!(key_id = %id, "API key revoked");
    Ok(StatusCode::NO_CONTENT)
}

/// Reloads this node's table at once (the other nodes follow the revision).
async fn reload(table: &KeyTable) {
    if let Err(error) = table.reload().await {
        tracing::warn!(%error, "could not reload the API keys; the next poll will");
    }
}
