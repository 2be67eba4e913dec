//! The routes of the front-end protocols (the AI SDK's UI message stream,
//! AG-UI): HTTP glue around `keel-projections`, which turns the stored log
//! into each protocol's frames and each protocol's requests into ops.

pub(crate) mod ag_ui;
mod ag_ui_schema;
pub(crate) mod ag_ui_threads;
pub(crate) mod ai_sdk;
