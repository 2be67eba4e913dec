//! The front-end protocols' routes, judged by the protocols' own client
//! libraries from npm.

mod ag_ui;
mod ai_sdk;
mod ai_sdk_bad_input;
