//! Soak: the chaos load without faults for a long while, with the server's
//! resident memory, open descriptors and live tasks sampled every few
//! seconds, a verdict on their growth after warm-up, and a plot.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use serde::Serialize;

/// How often the server is sampled.
pub(super) const SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// The share of the run, from its start, that counts as warm-up.
const WARM_UP: f64 = 0.2;

/// How much the resident memory may grow between the first and the last
/// quarter after warm-up, as a fraction.
const RSS_GROWTH_LIMIT: f64 = 0.2;

/// How many more descriptors or tasks the last quarter may peak at than
/// the first (the load's own churn: connections, streams resuming).
const COUNT_SLACK: f64 = 16.0;

/// One measure of a sample, for plotting and judging.
type Measure = fn(&Sample) -> f64;

/// One sample of the server.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Sample {
    /// Seconds since the load started.
    pub t_s: f64,
    /// Resident memory, in KiB.
    pub rss_kib: f64,
    /// Open file descriptors.
    pub fds: f64,
    /// Tasks alive in the async runtime.
    pub tasks: f64,
}

/// Samples the process `pid` (and its `/metrics` at `base`).
pub(super) async fn sample(client: &reqwest::Client, pid: u32, base: &str, since: Instant) -> Option<Sample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kib = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as f64;
    let text = client
        .get(format!("{base}/metrics"))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let tasks = text
        .lines()
        .find_map(|line| line.strip_prefix("keel_runtime_alive_tasks "))
        .and_then(|value| value.trim().parse().ok())?;
    Some(Sample {
        t_s: since.elapsed().as_secs_f64(),
        rss_kib,
        fds,
        tasks,
    })
}

/// What grew past its bound after warm-up, if anything.
pub(super) fn growth(samples: &[Sample], violations: &mut Vec<String>) {
    let Some(end) = samples.last().map(|sample| sample.t_s) else {
        violations.push("the soak took no sample".to_owned());
        return;
    };
    let steady: Vec<&Sample> = samples.iter().filter(|sample| sample.t_s >= end * WARM_UP).collect();
    if steady.len() < 8 {
        violations.push(format!(
            "the soak took too few samples after warm-up ({})",
            steady.len()
        ));
        return;
    }
    let quarter = steady.len() / 4;
    let (first, last) = (&steady[..quarter], &steady[steady.len() - quarter..]);
    let peak = |part: &[&Sample], pick: Measure| part.iter().map(|sample| pick(sample)).fold(0.0, f64::max);
    let rss = (
        peak(first, |sample| sample.rss_kib),
        peak(last, |sample| sample.rss_kib),
    );
    if rss.1 > rss.0 * (1.0 + RSS_GROWTH_LIMIT) {
        violations.push(format!(
            "resident memory grew from a peak of {:.0} KiB to {:.0} KiB after warm-up",
            rss.0, rss.1
        ));
    }
    for (name, pick) in [
        ("open descriptors", (|sample: &Sample| sample.fds) as Measure),
        ("live tasks", |sample: &Sample| sample.tasks),
    ] {
        let (before, after) = (peak(first, pick), peak(last, pick));
        if after > before + COUNT_SLACK {
            violations.push(format!(
                "{name} grew from a peak of {before:.0} to {after:.0} after warm-up"
            ));
        }
    }
}

/// The samples as an SVG: one panel per measure, time across.
pub fn svg(samples: &[Sample], title: &str) -> String {
    const WIDTH: f64 = 720.0;
    const PANEL: f64 = 150.0;
    const LEFT: f64 = 70.0;
    let end = samples.last().map_or(1.0, |sample| sample.t_s.max(1.0));
    let panels: [(&str, Measure); 3] = [
        ("resident memory (MiB)", |sample| sample.rss_kib / 1024.0),
        ("open descriptors", |sample| sample.fds),
        ("live tasks", |sample| sample.tasks),
    ];
    let height = 40.0 + PANEL * panels.len() as f64 + 30.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{LEFT}" y="22" font-size="14">{}</text>"#,
        escape(title)
    );
    for (index, (label, pick)) in panels.iter().enumerate() {
        let top = 40.0 + PANEL * index as f64;
        let bottom = top + PANEL - 30.0;
        let max = samples.iter().map(pick).fold(0.0, f64::max).max(1.0) * 1.1;
        let x = |t: f64| LEFT + (WIDTH - LEFT - 20.0) * t / end;
        let y = |value: f64| bottom - (bottom - top) * value / max;
        let points: Vec<String> = samples
            .iter()
            .map(|sample| format!("{:.1},{:.1}", x(sample.t_s), y(pick(sample))))
            .collect();
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" y1="{bottom}" x2="{}" y2="{bottom}" stroke="#999"/><line x1="{LEFT}" y1="{top}" x2="{LEFT}" y2="{bottom}" stroke="#999"/>"##,
            WIDTH - 20.0
        );
        let _ = writeln!(out, r#"<text x="{LEFT}" y="{}">{label}</text>"#, top - 4.0);
        let _ = writeln!(out, r#"<text x="4" y="{}">{:.0}</text>"#, top + 10.0, max);
        let _ = writeln!(out, r#"<text x="4" y="{bottom}">0</text>"#);
        let _ = writeln!(
            out,
            r##"<polyline fill="none" stroke="#2563eb" stroke-width="1.5" points="{}"/>"##,
            points.join(" ")
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{LEFT}" y="{}">seconds: 0 to {end:.0}, a sample every {} s</text>"#,
        height - 10.0,
        SAMPLE_EVERY.as_secs()
    );
    out.push_str("</svg>\n");
    out
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(rss: impl Fn(f64) -> f64) -> Vec<Sample> {
        (0..60)
            .map(|index| {
                let t = f64::from(index) * 5.0;
                Sample {
                    t_s: t,
                    rss_kib: rss(t),
                    fds: 40.0,
                    tasks: 100.0,
                }
            })
            .collect()
    }

    #[test]
    fn flat_samples_pass_and_a_leak_is_caught() {
        let mut violations = Vec::new();
        growth(
            &samples(|t| 50_000.0 + if t < 30.0 { t * 100.0 } else { 3_000.0 }),
            &mut violations,
        );
        assert!(violations.is_empty(), "{violations:?}");
        growth(&samples(|t| 50_000.0 + t * 200.0), &mut violations);
        assert_eq!(violations.len(), 1, "{violations:?}");
        let svg = svg(&samples(|_| 1.0), "a <soak>");
        assert!(svg.starts_with("<svg") && svg.contains("a &lt;soak&gt;") && svg.contains("<polyline"));
    }
}
