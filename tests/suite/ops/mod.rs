//! What an operator or a new contributor runs outside the API: the test
//! command `scripts/test`, the files of `deploy/`, and a backup restored.

mod backup_restore;
mod deploy;
mod proxy;
mod setup_script;
