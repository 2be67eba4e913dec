//! Front-end protocols driven by their own client libraries from npm.

mod ag_ui;
