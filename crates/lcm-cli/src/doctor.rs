//! `lcm doctor [--repair]`: the store's integrity check and its safe repairs.
//!
//! Prints what the check covered and every violation (kind, subject, proposed repair, detail);
//! with `--repair` it applies the safe repairs, checks again and prints what changed. The exit
//! code is non-zero while violations remain. With an embedding model configured it also checks
//! the vector index against the store, and `--repair` rebuilds it when it is wrong.

use anyhow::{Result, bail};
use clap::Args;
use lcm_search::DataDir;
use lcm_search::semantic::VectorCheck;
use lcm_store::integrity::{IntegrityReport, RepairReport, check, repair};

use crate::App;
use crate::output::outln;
use crate::output::{print_json, spinner, thousands};

/// Arguments of `lcm doctor`.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Apply the safe repairs (derived data only: counters, session totals, summary ranges,
    /// context states, the index), then check again.
    #[arg(long)]
    pub repair: bool,
}

/// Runs the check (and the repairs), prints the reports, fails if violations remain.
pub fn doctor(app: &App, args: &DoctorArgs) -> Result<()> {
    let data = app.open()?;
    let report = checked(app, &data, "checking")?;
    let mut repaired: Option<(RepairReport, IntegrityReport)> = None;
    if args.repair && report.repairable() > 0 {
        let spinner = spinner(app, "repairing");
        let done = repair(&data.store, Some(data.index.as_ref()), &report);
        spinner.finish_and_clear();
        let done = done?;
        let after = checked(app, &data, "checking again")?;
        repaired = Some((done, after));
    }
    let remaining = repaired.as_ref().map_or(&report, |(_, after)| after);
    let vectors = vectors_checked(app, &data, args.repair)?;

    if app.json {
        print_json(
            app,
            &serde_json::json!({
                "check": report,
                "repair": repaired.as_ref().map(|(r, _)| r),
                "after": repaired.as_ref().map(|(_, a)| a),
                "vectors": vectors,
            }),
        )?;
    } else {
        print_report(app, &report)?;
        if let Some((done, after)) = &repaired {
            print_repairs(app, done)?;
            outln!(app)?;
            outln!(app, "after repair:")?;
            print_violations(app, after)?;
        }
        print_summary(app, remaining, args.repair)?;
        if let Some(vectors) = &vectors {
            print_vectors(app, vectors, args.repair)?;
        }
    }
    if let Some(VectorsChecked { after, .. }) = &vectors
        && !after.is_clean()
    {
        bail!(
            "the vector index is wrong{}",
            if args.repair {
                " after its rebuild"
            } else {
                ": run `lcm doctor --repair` to rebuild it"
            }
        );
    }

    if !remaining.is_clean() {
        let n = remaining.violations.len() as u64 + remaining.omitted;
        bail!(
            "{} integrity violation{} remain{}",
            thousands(n),
            if n == 1 { "" } else { "s" },
            if n == 1 { "s" } else { "" }
        );
    }
    Ok(())
}

fn checked(app: &App, data: &DataDir, what: &str) -> Result<IntegrityReport> {
    let spinner = spinner(app, what);
    let report = check(&data.store, Some(data.index.as_ref()));
    spinner.finish_and_clear();
    Ok(report?)
}

fn print_report(app: &App, report: &IntegrityReport) -> Result<()> {
    let c = &report.checked;
    outln!(
        app,
        "checked {} sessions, {} messages ({} originals), {} summaries ({} source edges, {} covered-by edges), {} contexts{} in {} ms",
        thousands(c.sessions),
        thousands(c.messages),
        thousands(c.originals),
        thousands(c.summaries),
        thousands(c.source_edges),
        thousands(c.cover_edges),
        thousands(c.contexts),
        c.index_documents
            .map(|d| format!(", {} index documents", thousands(d)))
            .unwrap_or_default(),
        thousands(report.elapsed_ms),
    )?;
    print_violations(app, report)
}

fn print_violations(app: &App, report: &IntegrityReport) -> Result<()> {
    for skipped in &report.skipped {
        outln!(app, "skipped: {skipped}")?;
    }
    if report.violations.is_empty() {
        outln!(app, "no violations")?;
        return Ok(());
    }
    let kind_width = report
        .violations
        .iter()
        .map(|v| v.kind.as_str().len())
        .max()
        .unwrap_or(0)
        .max(4);
    let subject_width = report
        .violations
        .iter()
        .map(|v| v.subject.len())
        .max()
        .unwrap_or(0)
        .max(7);
    outln!(
        app,
        "{:<kind_width$}  {:<subject_width$}  REPAIR",
        "KIND",
        "SUBJECT"
    )?;
    for v in &report.violations {
        let repair = v
            .repair
            .as_ref()
            .map_or_else(|| "none (see below)".to_owned(), ToString::to_string);
        outln!(
            app,
            "{:<kind_width$}  {:<subject_width$}  {repair}",
            v.kind.as_str(),
            v.subject
        )?;
        outln!(app, "    {}", v.detail)?;
    }
    if report.omitted > 0 {
        outln!(
            app,
            "… and {} more violations not listed (repair these and run again)",
            thousands(report.omitted)
        )?;
    }
    Ok(())
}

fn print_repairs(app: &App, done: &RepairReport) -> Result<()> {
    outln!(app)?;
    if done.applied.is_empty() {
        outln!(app, "no repair applied")?;
    }
    for r in &done.applied {
        outln!(app, "repaired  {}: {}", r.repair, r.detail)?;
    }
    for r in &done.skipped {
        outln!(app, "skipped   {}: {}", r.repair, r.detail)?;
    }
    Ok(())
}

fn print_summary(app: &App, remaining: &IntegrityReport, repaired: bool) -> Result<()> {
    if remaining.is_clean() {
        return Ok(());
    }
    let repairable = remaining.repairable();
    let manual = remaining.violations.len() - repairable;
    outln!(app)?;
    if repairable > 0 && !repaired {
        outln!(
            app,
            "{} with a safe repair: run `lcm doctor --repair`",
            thousands(repairable as u64)
        )?;
    }
    if manual > 0 {
        outln!(
            app,
            "{} without a safe repair: see each detail for what to do",
            thousands(manual as u64)
        )?;
    }
    Ok(())
}

/// The vector index's check, and after a rebuild (`--repair`) the check again.
#[derive(serde::Serialize)]
struct VectorsChecked {
    check: VectorCheck,
    /// Messages and summaries embedded again by the rebuild, if one ran.
    rebuilt: Option<u64>,
    after: VectorCheck,
}

/// Checks the vector index when a model is configured (`None` otherwise); with `repair`, a
/// wrong index is rebuilt from the store and checked again.
fn vectors_checked(app: &App, data: &DataDir, repair: bool) -> Result<Option<VectorsChecked>> {
    let Some(semantic) = data.index.semantic() else {
        return Ok(None);
    };
    let progress = spinner(app, "checking the vector index");
    let check = semantic.check(&data.store);
    progress.finish_and_clear();
    let check = check?;
    if check.is_clean() || !repair {
        return Ok(Some(VectorsChecked {
            after: check.clone(),
            check,
            rebuilt: None,
        }));
    }
    let progress = spinner(app, "rebuilding the vector index");
    let rebuilt = semantic.rebuild_until(&data.store, |_, _| {}, || false);
    progress.finish_and_clear();
    let rebuilt = rebuilt?;
    let after = semantic.check(&data.store)?;
    Ok(Some(VectorsChecked {
        check,
        rebuilt: Some(rebuilt),
        after,
    }))
}

fn print_vectors(app: &App, vectors: &VectorsChecked, repaired: bool) -> Result<()> {
    let c = &vectors.check;
    outln!(app)?;
    outln!(
        app,
        "vector index ({}): {} chunks of messages below {}, {} chunks of summaries below {}",
        c.model_id,
        thousands(c.message_chunks),
        thousands(c.message_watermark),
        thousands(c.summary_chunks),
        thousands(c.summary_watermark),
    )?;
    for problem in &c.problems {
        outln!(app, "    {problem}")?;
    }
    match vectors.rebuilt {
        Some(n) => {
            outln!(
                app,
                "rebuilt: {} messages and summaries embedded",
                thousands(n)
            )?;
            for problem in &vectors.after.problems {
                outln!(app, "    still: {problem}")?;
            }
        }
        None if !c.is_clean() && !repaired => {
            outln!(
                app,
                "the vector index is derived: run `lcm doctor --repair` to rebuild it"
            )?;
        }
        None => {}
    }
    Ok(())
}
