//! Results of `lcm eval run` and their reports: one JSON file of every task run (merged by
//! `lcm eval report`), a Markdown table of mean scores by family, arm and length, and an SVG
//! plot of score against context length, one line per family and arm (the shape of the LCM
//! paper's figure).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::tasks::Family;
use crate::{EvalError, Result};

/// One task run by one arm.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    pub seed: u64,
    pub family: Family,
    /// The task's target context length, in tokens.
    pub length: u64,
    /// `scripted`, or a model arm (`baseline`, `lcm`).
    pub arm: String,
    /// Mean score over the task's questions, in `[0, 1]`.
    pub score: f64,
    pub questions: usize,
    /// Tokens a model spent (model arms), or tokens of tool results read (scripted arm).
    pub tokens_spent: u64,
    /// Model or tool calls.
    pub calls: u64,
    pub wall_ms: u64,
}

/// Reads result files written by [`write_json`] and merges them (in order).
pub fn read_json(paths: &[impl AsRef<Path>]) -> Result<Vec<RunResult>> {
    let mut all = Vec::new();
    for path in paths {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| EvalError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let results: Vec<RunResult> =
            serde_json::from_str(&text).map_err(|e| EvalError::Format {
                origin: path.display().to_string(),
                at: format!("line {}, column {}", e.line(), e.column()),
                detail: format!("not an lcm eval result file: {e}"),
            })?;
        all.extend(results);
    }
    Ok(all)
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|source| EvalError::Write {
        path: path.display().to_string(),
        source,
    })
}

/// Writes `results` as a JSON array.
pub fn write_json(path: &Path, results: &[RunResult]) -> Result<()> {
    let text = serde_json::to_string_pretty(results).unwrap_or_else(|_| "[]".into());
    write(path, &format!("{text}\n"))
}

/// A length as the plot and the table name it: `8K`, `128K`, `1M`.
pub fn length_label(tokens: u64) -> String {
    if tokens >= 1 << 20 && tokens.is_multiple_of(1 << 20) {
        format!("{}M", tokens >> 20)
    } else if tokens >= 1_000_000 && tokens.is_multiple_of(1_000_000) {
        format!("{}M", tokens / 1_000_000)
    } else if tokens >= 1 << 10 && tokens.is_multiple_of(1 << 10) {
        format!("{}K", tokens >> 10)
    } else if tokens >= 1_000 && tokens.is_multiple_of(1_000) {
        format!("{}K", tokens / 1_000)
    } else {
        tokens.to_string()
    }
}

/// The runs of one family, arm and length: their mean score, calls, tokens and wall time.
#[derive(Debug, Clone, Copy, Default)]
struct Group {
    score: f64,
    calls: f64,
    tokens: f64,
    wall_ms: f64,
    runs: usize,
}

/// The runs of each (family, arm, length), averaged.
fn grouped(results: &[RunResult]) -> BTreeMap<(Family, String, u64), Group> {
    let mut groups: BTreeMap<(Family, String, u64), Group> = BTreeMap::new();
    for r in results {
        let g = groups
            .entry((r.family, r.arm.clone(), r.length))
            .or_default();
        g.score += r.score;
        g.calls += r.calls as f64;
        g.tokens += r.tokens_spent as f64;
        g.wall_ms += r.wall_ms as f64;
        g.runs += 1;
    }
    for g in groups.values_mut() {
        let n = g.runs as f64;
        g.score /= n;
        g.calls /= n;
        g.tokens /= n;
        g.wall_ms /= n;
    }
    groups
}

/// The Markdown table: one row per family, arm and length.
pub fn markdown(results: &[RunResult]) -> String {
    let mut out = String::from(
        "| family | arm | length | tasks | mean score | calls per task | tokens per task | \
         seconds per task |\n\
         | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for ((family, arm, length), g) in grouped(results) {
        let _ = writeln!(
            out,
            "| {} | {arm} | {} | {} | {:.3} | {:.1} | {:.0} | {:.1} |",
            family.as_str(),
            length_label(length),
            g.runs,
            g.score,
            g.calls,
            g.tokens,
            g.wall_ms / 1000.0
        );
    }
    out
}

const WIDTH: f64 = 640.0;
const HEIGHT: f64 = 380.0;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 180.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 50.0;
const COLOURS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
];

/// The SVG plot: mean score (0 to 1) against context length (log scale), a line per family
/// and arm, with a legend.
pub fn svg(results: &[RunResult]) -> String {
    let groups = grouped(results);
    let lengths: Vec<u64> = {
        let mut l: Vec<u64> = groups.keys().map(|k| k.2).collect();
        l.sort_unstable();
        l.dedup();
        l
    };
    let (lo, hi) = match (lengths.first(), lengths.last()) {
        (Some(lo), Some(hi)) => ((*lo as f64).log2(), (*hi as f64).log2()),
        _ => (0.0, 1.0),
    };
    let span = if hi > lo { hi - lo } else { 1.0 };
    let x = |length: u64| {
        let at = if hi > lo {
            ((length as f64).log2() - lo) / span
        } else {
            0.5
        };
        LEFT + at * (WIDTH - LEFT - RIGHT)
    };
    let y = |score: f64| TOP + (1.0 - score.clamp(0.0, 1.0)) * (HEIGHT - TOP - BOTTOM);
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" \
         viewBox=\"0 0 {WIDTH} {HEIGHT}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <title>lcm eval: score against context length</title>\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    // Axes, grid and labels.
    let (x0, x1, y0, y1) = (LEFT, WIDTH - RIGHT, y(0.0), y(1.0));
    let _ = writeln!(
        out,
        "<line x1=\"{x0}\" y1=\"{y0}\" x2=\"{x1}\" y2=\"{y0}\" stroke=\"black\"/>\n\
         <line x1=\"{x0}\" y1=\"{y0}\" x2=\"{x0}\" y2=\"{y1}\" stroke=\"black\"/>"
    );
    for tick in 0..=4 {
        let score = f64::from(tick) / 4.0;
        let ty = y(score);
        let _ = writeln!(
            out,
            "<line x1=\"{x0}\" y1=\"{ty:.1}\" x2=\"{x1}\" y2=\"{ty:.1}\" stroke=\"#ddd\"/>\n\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{score:.2}</text>",
            x0 - 6.0,
            ty + 4.0
        );
    }
    for length in &lengths {
        let tx = x(*length);
        let _ = writeln!(
            out,
            "<text x=\"{tx:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            y0 + 18.0,
            length_label(*length)
        );
    }
    let _ = writeln!(
        out,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">context length (tokens)</text>\n\
         <text x=\"14\" y=\"{:.1}\" text-anchor=\"middle\" transform=\"rotate(-90 14 {:.1})\">score</text>",
        (x0 + x1) / 2.0,
        HEIGHT - 8.0,
        (y0 + y1) / 2.0,
        (y0 + y1) / 2.0
    );
    // One line per family and arm.
    let mut series: BTreeMap<(Family, String), Vec<(u64, f64)>> = BTreeMap::new();
    for ((family, arm, length), g) in &groups {
        series
            .entry((*family, arm.clone()))
            .or_default()
            .push((*length, g.score));
    }
    for (i, ((family, arm), points)) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let path: Vec<String> = points
            .iter()
            .map(|(l, s)| format!("{:.1},{:.1}", x(*l), y(*s)))
            .collect();
        let name = format!("{} · {}", family.as_str(), escape(arm));
        let _ = writeln!(
            out,
            "<polyline class=\"series\" data-series=\"{name}\" points=\"{}\" fill=\"none\" \
             stroke=\"{colour}\" stroke-width=\"2\"/>",
            path.join(" ")
        );
        for (l, s) in points {
            let _ = writeln!(
                out,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{colour}\"/>",
                x(*l),
                y(*s)
            );
        }
        let ly = TOP + 10.0 + i as f64 * 18.0;
        let lx = WIDTH - RIGHT + 16.0;
        let _ = writeln!(
            out,
            "<line x1=\"{lx}\" y1=\"{ly}\" x2=\"{:.1}\" y2=\"{ly}\" stroke=\"{colour}\" stroke-width=\"2\"/>\n\
             <text x=\"{:.1}\" y=\"{:.1}\">{name}</text>",
            lx + 18.0,
            lx + 24.0,
            ly + 4.0
        );
    }
    out.push_str("</svg>\n");
    out
}

/// `text` safe inside SVG text and attributes.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Writes `results.json`, `results.md` and `results.svg` into `dir` (created if needed);
/// returns their paths.
pub fn write_all(dir: &Path, results: &[RunResult]) -> Result<[std::path::PathBuf; 3]> {
    std::fs::create_dir_all(dir).map_err(|source| EvalError::Write {
        path: dir.display().to_string(),
        source,
    })?;
    let paths = [
        dir.join("results.json"),
        dir.join("results.md"),
        dir.join("results.svg"),
    ];
    write_json(&paths[0], results)?;
    write(&paths[1], &markdown(results))?;
    write(&paths[2], &svg(results))?;
    Ok(paths)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(family: Family, arm: &str, length: u64, score: f64) -> RunResult {
        RunResult {
            seed: 1,
            family,
            length,
            arm: arm.into(),
            score,
            questions: 6,
            tokens_spent: 100,
            calls: 12,
            wall_ms: 5,
        }
    }

    #[test]
    fn lengths_are_named_as_in_the_paper() {
        assert_eq!(length_label(8 << 10), "8K");
        assert_eq!(length_label(1 << 20), "1M");
        assert_eq!(length_label(32_000), "32K");
        assert_eq!(length_label(1_234), "1234");
    }

    #[test]
    fn the_table_averages_runs_of_one_family_arm_and_length() {
        let results = [
            result(Family::Needles, "scripted", 8 << 10, 1.0),
            result(Family::Needles, "scripted", 8 << 10, 0.5),
            result(Family::Needles, "scripted", 32 << 10, 1.0),
        ];
        let table = markdown(&results);
        assert!(
            table.contains("| needles | scripted | 8K | 2 | 0.750 | 12.0 | 100 |"),
            "{table}"
        );
        assert!(
            table.contains("| needles | scripted | 32K | 1 | 1.000 |"),
            "{table}"
        );
    }

    #[test]
    fn the_plot_has_a_line_per_family_and_arm_through_its_points() {
        let results = [
            result(Family::Needles, "scripted", 8 << 10, 1.0),
            result(Family::Needles, "scripted", 1 << 20, 1.0),
            result(Family::Aggregation, "baseline", 8 << 10, 0.0),
            result(Family::Aggregation, "baseline", 1 << 20, 0.5),
        ];
        let plot = svg(&results);
        assert_eq!(plot.matches("<polyline").count(), 2);
        // Score 1 is drawn at the top of the plot area, 0 at its bottom.
        assert!(
            plot.contains(&format!(
                "points=\"{LEFT:.1},{TOP:.1} {:.1},{TOP:.1}\"",
                WIDTH - RIGHT
            )),
            "{plot}"
        );
        assert!(plot.contains(">8K<") && plot.contains(">1M<"));
        assert!(plot.starts_with("<svg") && plot.trim_end().ends_with("</svg>"));
    }
}
