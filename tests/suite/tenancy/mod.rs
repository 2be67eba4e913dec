//! Tenants over real HTTP: which tenant a session belongs to, where its
//! workspace lives, each tenant's ceiling, and (with credentials of one
//! tenant) that nothing of another tenant's sessions is ever seen.

mod ceilings;
mod keys;
mod ownership;
mod sandbox;
mod sweep;
mod webhooks;
