//! The files of a chaos run: the fixtures every node and session uses,
//! and the evidence a failed run leaves behind.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde_json::json;

use super::clients::SessionHistory;
use super::nodes::{Node, keep, setup};
use super::{ChaosParams, ChaosReport};
use keel_protocol::Result;

/// The script every session answers from, and the operator's keel.toml.
pub(super) fn write_fixtures(dir: &Path) -> Result<()> {
    let mut script = String::new();
    for index in 0..4000 {
        let line = match index % 4 {
            0 => {
                json!({"chunks": ["Once ", "upon ", "a ", "time, ", "far ", "away, ", "there ", "was."], "delay_ms": 40})
            }
            // The side effect names its call, so a call run twice shows.
            1 => json!({"tool_calls": [{
                "id": format!("call-{index}"),
                "name": "shell",
                "arguments": {"command": format!("echo call-{index} >> effects.txt")},
            }]}),
            2 => json!({"text": "The tool ran."}),
            _ => json!({"text": "Short."}),
        };
        script.push_str(&line.to_string());
        script.push('\n');
    }
    let write = |name: &str, text: &str| {
        std::fs::write(dir.join(name), text).map_err(|error| setup(format!("cannot write {name}: {error}")))
    };
    write("chaos.jsonl", &script)?;
    write("keel.toml", "[approvals]\ntools = { shell = \"auto\" }\n")
}

/// Copies the evidence of a failed run into a directory of its own.
pub(super) fn keep_evidence(
    params: &ChaosParams,
    dir: &Path,
    nodes: &[Node],
    history: &BTreeMap<String, SessionHistory>,
    report: &ChaosReport,
) -> Result<PathBuf> {
    let target = params
        .evidence
        .join(format!("chaos-seed-{}-{}", params.seed, keel_protocol::now_ms()));
    std::fs::create_dir_all(&target).map_err(|error| setup(format!("cannot keep the evidence: {error}")))?;
    for node in nodes {
        keep(&node.log_path(), &target);
    }
    for name in ["keel.sqlite3", "keel.sqlite3-wal", "chaos.jsonl", "keel.toml"] {
        keep(&dir.join(name), &target);
    }
    let mut file = std::fs::File::create(target.join("history.jsonl"))
        .map_err(|error| setup(format!("cannot keep the history: {error}")))?;
    for (session_id, session) in history {
        for attempt in &session.attempts {
            let _ = writeln!(file, "{}", serde_json::to_string(attempt).unwrap_or_default());
        }
        for event in session.received.values() {
            let _ = writeln!(file, "{}", json!({"session_id": session_id, "received": event}));
        }
    }
    std::fs::write(target.join("violations.txt"), report.violations.join("\n"))
        .map_err(|error| setup(format!("cannot keep the violations: {error}")))?;
    Ok(target)
}
