//! What benchmarks take from outside the project: the embedding model `setup.sh` puts on disk,
//! and the real data of `../shared/data` (Claude Code transcripts, TREC questions, LoCoMo).
//! Every function says why when its input is absent, so a bench can skip with that reason.

#![allow(dead_code)] // each bench uses its own part of this module

use std::path::PathBuf;

use lcm::core::formats::{Format, LineContext, LineOutcome, parse_line};
use lcm::core::message::{NewMessage, search_text};

/// `../shared/data/<rel>`, from the project root.
pub fn shared_data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/data")
        .join(rel)
}

/// The model directory (`LCM_EMBED_MODEL_DIR`, else what
/// `../shared/tools/embed-model/setup.sh` prints), or why there is none.
pub fn model_dir() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("LCM_EMBED_MODEL_DIR") {
        return Ok(PathBuf::from(dir));
    }
    set_up(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/tools/embed-model/setup.sh"))
}

/// The reranker's directory (what `tests/models/ms-marco-MiniLM-L-12-v2.sh` prints), or why
/// there is none.
pub fn reranker_dir() -> Result<PathBuf, String> {
    set_up(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/models/ms-marco-MiniLM-L-12-v2.sh"),
    )
}

/// The directory a model's setup script prints (it fetches the model the first time).
fn set_up(setup: &std::path::Path) -> Result<PathBuf, String> {
    if !setup.exists() {
        return Err(format!("{} is absent", setup.display()));
    }
    let out = std::process::Command::new(setup)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", setup.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} failed: {}",
            setup.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// The Claude Code transcripts: the four long sessions (`<uuid>.jsonl`), in name order, and
/// with `subagents` also their sub-agents' transcripts (`<uuid>/subagents/*.jsonl`).
pub fn transcript_files(subagents: bool) -> Result<Vec<PathBuf>, String> {
    let dir = shared_data("transcripts/claude-code");
    let jsonl_in = |dir: &PathBuf| -> Result<Vec<PathBuf>, String> {
        let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
            .collect();
        files.sort();
        Ok(files)
    };
    let mut files: Vec<PathBuf> = jsonl_in(&dir)?
        .into_iter()
        .filter(|p| p.file_stem().is_some_and(|s| s.len() == 36))
        .collect();
    if subagents {
        for session in files.clone() {
            let sub = session.with_extension("").join("subagents");
            if sub.is_dir() {
                files.extend(jsonl_in(&sub)?);
            }
        }
    }
    Ok(files)
}

/// Every message of `files` as lcm's Claude Code parser reads it, in file order.
pub fn transcript_messages(files: &[PathBuf]) -> Result<Vec<NewMessage>, String> {
    let mut messages = Vec::new();
    for file in files {
        let raw = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
        for (n, line) in raw.lines().enumerate() {
            let ctx = LineContext {
                line: n as u64 + 1,
                default_session_key: "bench",
            };
            if let Ok(LineOutcome::Messages(parsed)) =
                parse_line(Format::ClaudeCode, line.as_bytes(), &ctx)
            {
                messages.extend(parsed.into_iter().map(|m| m.message));
            }
        }
    }
    Ok(messages)
}

/// What the vector index embeds of each text: its first chunk (a longer text's other chunks
/// are other entries).
pub fn first_chunks<'a>(model: &lcm_embed::Embedder, texts: &'a [String]) -> Vec<&'a str> {
    texts
        .iter()
        .map(|t| {
            let chunks = model.chunks(t).expect("chunks");
            chunks.first().map_or("", |c| &t[c.clone()])
        })
        .collect()
}

/// The distinct lines of at least `min_len` bytes (trimmed) of every message's searchable
/// text (prose, tool calls and tool output alike), in order of first appearance.
pub fn transcript_lines(messages: &[NewMessage], min_len: usize) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    let mut lines = Vec::new();
    for m in messages {
        for line in search_text(&m.parts).lines() {
            let line = line.trim();
            if line.len() >= min_len && !seen.contains(line) {
                seen.insert(line.to_owned());
                lines.push(line.to_owned());
            }
        }
    }
    lines
}

/// The questions of a TREC file (lcm-eval's reader), without their labels.
pub fn trec_questions(file: &str) -> Result<Vec<String>, String> {
    let path = shared_data(&format!("trec/{file}"));
    let items = lcm_eval::trec::load(&path).map_err(|e| e.to_string())?;
    Ok(items.into_iter().map(|item| item.text).collect())
}

/// The LoCoMo development set (lcm-eval's parser): its turns as lcm imports them (speaker,
/// text, an image's caption) and its questions.
pub fn locomo() -> Result<(Vec<String>, Vec<String>), String> {
    let path = shared_data("locomo-dev/locomo-dev.json");
    let conversations = lcm_eval::locomo::load(&path).map_err(|e| e.to_string())?;
    let turns = conversations
        .iter()
        .flat_map(|c| &c.sessions)
        .flat_map(|s| &s.turns)
        .map(|t| t.message_text())
        .collect();
    let questions = conversations
        .iter()
        .flat_map(|c| &c.questions)
        .map(|q| q.question.clone())
        .collect();
    Ok((turns, questions))
}
