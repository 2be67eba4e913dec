//! Helpers of the integration tests, one module per job. Test modules
//! import from the module that owns a helper; nothing here is a test.

pub(crate) mod agent;
pub(crate) mod api;
pub(crate) mod events;
pub(crate) mod http_server;
pub(crate) mod model;
pub(crate) mod process;
pub(crate) mod provider;
pub(crate) mod python;
pub(crate) mod sandbox;
pub(crate) mod server;
pub(crate) mod skip;
pub(crate) mod store;
pub(crate) mod wait;
