//! The front-end protocols' routes, judged by the protocols' own client
//! libraries.

mod ai_sdk;
mod ai_sdk_bad_input;
