//! `POST /cluster/v1/forwarded`: a submission another node of the cluster
//! hands over for a session this node runs (see `host/forward.rs`).
//!
//! Not part of the client API, so not in its description: no client
//! calls it, and it asks for no token. What it takes must carry the
//! cluster key's seal, fresh, and seen once; anything else is answered
//! `not_taken` and acts on nothing.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;

use crate::Server;
use crate::extract::ApiJson;
use crate::host::{Forward, ForwardReply};

/// Queues the handed-over submission if this node runs its session, and
/// answers what became of it.
pub(crate) async fn forwarded(
    State(server): State<Arc<Server>>,
    ApiJson(forward): ApiJson<Forward>,
) -> Json<ForwardReply> {
    Json(server.host.take_forwarded(forward).await)
}
