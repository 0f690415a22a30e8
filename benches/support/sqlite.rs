//! The baseline other LCM implementations use: SQLite in WAL mode with synchronous=NORMAL, one
//! messages table and an FTS5 table (porter unicode61) holding a second copy of the text, as in
//! lossless-claw. Regex search is a scan with a REGEXP function backed by Rust's regex crate
//! (lossless-claw scans rows in its regex mode too).

use std::path::Path;

use lcm::core::message::NewMessage;
use rusqlite::functions::FunctionFlags;
use rusqlite::{Connection, params};

pub struct Baseline {
    pub conn: Connection,
}

/// Characters of a snippet, as lcm's default `search.snippet_chars` and lossless-claw's grep.
const SNIPPET_CHARS: usize = 200;

/// One hit of a baseline search: what a grep tool returns for it.
#[derive(Debug)]
pub struct BaselineHit {
    pub id: i64,
    pub conversation: i64,
    pub seq: i64,
    pub role: String,
    pub created_at: i64,
    pub snippet: String,
}

impl BaselineHit {
    /// A hit from a row whose first five columns are id, conversation, seq, role and time.
    fn from_row(r: &rusqlite::Row<'_>, snippet: String) -> rusqlite::Result<BaselineHit> {
        Ok(BaselineHit {
            id: r.get(0)?,
            conversation: r.get(1)?,
            seq: r.get(2)?,
            role: r.get(3)?,
            created_at: r.get(4)?,
            snippet,
        })
    }
}

impl Baseline {
    pub fn open(path: &Path) -> Baseline {
        let conn = Connection::open(path).expect("open sqlite");
        conn.pragma_update(None, "journal_mode", "WAL")
            .expect("wal");
        conn.pragma_update(None, "synchronous", "NORMAL")
            .expect("synchronous");
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS messages (
                 id INTEGER PRIMARY KEY,
                 conversation_id INTEGER NOT NULL,
                 seq INTEGER NOT NULL,
                 role TEXT NOT NULL,
                 content TEXT NOT NULL,
                 token_count INTEGER NOT NULL,
                 created_at INTEGER NOT NULL);
             CREATE INDEX IF NOT EXISTS messages_conv_seq ON messages(conversation_id, seq);
             CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts USING fts5(
                 content, content_rowid UNINDEXED, tokenize='porter unicode61');",
        )
        .expect("schema");
        conn.create_scalar_function(
            "regexp",
            2,
            FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC,
            |ctx| {
                let re: std::sync::Arc<regex::Regex> = ctx.get_or_create_aux(0, |vr| {
                    regex::Regex::new(vr.as_str()?)
                        .map_err(|e| rusqlite::Error::UserFunctionError(e.into()))
                })?;
                let text = ctx.get_raw(1).as_str().unwrap_or("");
                Ok(re.is_match(text))
            },
        )
        .expect("regexp function");
        Baseline { conn }
    }

    /// Switches this connection's `synchronous` mode: `NORMAL` (the baseline as specified: no
    /// fsync at commit in WAL mode) or `FULL` (durable at commit, as lcm's appends are).
    pub fn set_synchronous(&self, mode: &str) {
        self.conn
            .pragma_update(None, "synchronous", mode)
            .expect("synchronous");
    }

    /// Inserts messages in one transaction (text + FTS row), as lossless-claw does per turn.
    /// Token counts use the 4-characters-a-token heuristic those implementations use.
    pub fn insert(&mut self, conversation: i64, first_seq: i64, messages: &[NewMessage]) {
        let tx = self.conn.transaction().expect("tx");
        {
            let mut insert = tx
                .prepare_cached(
                    "INSERT INTO messages (conversation_id, seq, role, content, token_count, created_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                )
                .expect("prepare");
            let mut fts = tx
                .prepare_cached("INSERT INTO messages_fts (rowid, content) VALUES (?1, ?2)")
                .expect("prepare fts");
            for (i, m) in messages.iter().enumerate() {
                let content = lcm::core::message::search_text(&m.parts);
                insert
                    .execute(params![
                        conversation,
                        first_seq + i as i64,
                        m.role.as_str(),
                        content.as_ref(),
                        (content.len() / 4) as i64,
                        m.created_at.0
                    ])
                    .expect("insert");
                let id = tx.last_insert_rowid();
                fts.execute(params![id, content.as_ref()])
                    .expect("insert fts");
            }
        }
        tx.commit().expect("commit");
    }

    /// First page (oldest first) of messages matching a regex: a scan. Each hit comes back as
    /// lcm's grep gives it (and lossless-claw's `lcm_grep`): id, conversation, seq, role, time
    /// and a snippet of about 200 characters around the first match.
    pub fn regex(&self, pattern: &str, limit: usize) -> Vec<BaselineHit> {
        let re = regex::Regex::new(pattern).expect("regex");
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT id, conversation_id, seq, role, created_at, content FROM messages
                 WHERE content REGEXP ?1 ORDER BY id LIMIT ?2",
            )
            .expect("prepare");
        stmt.query_map(params![pattern, limit as i64], |r| {
            let content: String = r.get(5)?;
            let (start, end) = re.find(&content).map_or((0, 0), |m| (m.start(), m.end()));
            BaselineHit::from_row(
                r,
                lcm::search::grep::snippet(&content, start, end, SNIPPET_CHARS),
            )
        })
        .expect("query")
        .map(|r| r.expect("row"))
        .collect()
    }

    /// Best `limit` messages by BM25, each with its fields and FTS5's snippet of the matched
    /// words.
    pub fn full_text(&self, query: &str, limit: usize) -> Vec<BaselineHit> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT m.id, m.conversation_id, m.seq, m.role, m.created_at,
                        snippet(messages_fts, 0, '', '', '…', 32)
                 FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid
                 WHERE messages_fts MATCH ?1 ORDER BY rank LIMIT ?2",
            )
            .expect("prepare");
        stmt.query_map(params![query, limit as i64], |r| {
            BaselineHit::from_row(r, r.get(5)?)
        })
        .expect("query")
        .map(|r| r.expect("row"))
        .collect()
    }

    pub fn count(&self) -> i64 {
        self.conn
            .query_row("SELECT count(*) FROM messages", [], |r| r.get(0))
            .expect("count")
    }
}
