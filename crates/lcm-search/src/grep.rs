//! Grep over the whole history: regex (complete and exact) and full text (ranked).
//!
//! **Regex.** The pattern is planned into a trigram query ([`lcm_regex::trigram`]); the index returns
//! the candidate messages in id order, and each candidate is verified with the real regex on the
//! stored text, so every hit is real. A pattern with no usable literal has no trigram query and
//! is answered by a scan of the store. Messages appended after the index's watermark are always
//! scanned, so a message is findable the moment its append returns. Results come in id order
//! (oldest first) and pages never repeat or skip a hit.
//!
//! **Full text.** Words are stemmed and lowercased; a message matches if it has any of them
//! (`+word` requires a word, `-word` excludes it, `"a phrase"` matches a phrase) and hits are
//! ranked by BM25, best first. Messages not yet indexed follow, unranked, when they contain any
//! of the query's words.
//!
//! Both are scoped by session, roles and time range and paginated with an opaque cursor.

use std::collections::HashSet;
use std::ops::ControlFlow;

use lcm_core::config::SearchConfig;
use lcm_core::ids::{MessageId, SessionId};
use lcm_core::message::{Message, Role};
use lcm_core::time::Timestamp;
use regex::Regex;
use regex_automata::meta::Regex as BytesRegex;
use serde::Serialize;

use crate::index::SearchIndex;
use lcm_regex::required::Required;
use lcm_regex::start_classes::{StartClasses, StartSearch};
use lcm_regex::trigram;
use lcm_store::error::{Result, StoreError};
use lcm_store::record::RecordView;
use lcm_store::records::{InRow, RecordReader, RecordSource, Step};

/// Longest pattern accepted.
const MAX_PATTERN_LEN: usize = 4_096;
/// Matches counted per message at most (the count is informative, not a promise).
const MAX_COUNTED_MATCHES: usize = 1_000;

/// How to interpret the pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GrepMode {
    /// Every match of a regular expression, oldest first (exact and complete).
    Regex,
    /// Stemmed words, best matches first (BM25).
    FullText,
    /// By meaning: the messages whose embeddings are nearest the query's (needs an embedding
    /// model, `[embeddings] model_dir`).
    Semantic,
    /// Full text and semantic, fused (rescaled scores, lifted by neighbouring turns: see
    /// `hybrid.rs`; needs an embedding model).
    Hybrid,
}

impl GrepMode {
    /// The mode's name in requests and reports (`full_text`, ...).
    pub fn name(self) -> &'static str {
        match self {
            GrepMode::Regex => "regex",
            GrepMode::FullText => "full_text",
            GrepMode::Semantic => "semantic",
            GrepMode::Hybrid => "hybrid",
        }
    }

    /// Whether the mode ranks by meaning and so needs the embedding model.
    pub fn needs_embeddings(self) -> bool {
        matches!(self, GrepMode::Semantic | GrepMode::Hybrid)
    }
}

/// The error of a semantic or hybrid search where no embedding model is configured.
pub fn no_embeddings_error(mode: GrepMode) -> StoreError {
    StoreError::InvalidQuery(format!(
        "{} search needs an embedding model: set `model_dir` in the `[embeddings]` section of \
         the configuration to a sentence-transformers model directory (see \
         docs/CONFIGURATION.md); regex and full_text search work without one",
        mode.name()
    ))
}

/// What the embeddings of a search by meaning may not have reached yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unembedded {
    Messages,
    Summaries,
}

/// What a semantic or hybrid search says of the `not_embedded` newest messages or summaries
/// the embeddings have not reached yet ([`GrepPage::not_embedded`]); `None` when there are
/// none, or for another mode.
pub fn not_embedded_note(
    not_embedded: Option<u64>,
    mode: GrepMode,
    what: Unembedded,
) -> Option<String> {
    let n = not_embedded.filter(|&n| n > 0)?;
    let words = match mode {
        GrepMode::Hybrid => "hybrid search finds them by their words only",
        GrepMode::Semantic => "search by words (full text) finds them",
        GrepMode::Regex | GrepMode::FullText => return None,
    };
    let things = match (what, n) {
        (Unembedded::Messages, 1) => "message is",
        (Unembedded::Messages, _) => "messages are",
        (Unembedded::Summaries, 1) => "summary is",
        (Unembedded::Summaries, _) => "summaries are",
    };
    Some(format!(
        "{n} newest {things} not embedded yet (the vector index catches up in the \
         background): the embeddings cannot find them until then; {words}"
    ))
}

/// Which messages a search looks at. Empty fields mean "no restriction".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope {
    pub session: Option<SessionId>,
    pub roles: Vec<Role>,
    /// Messages created at or after this time.
    pub since: Option<Timestamp>,
    /// Messages created before this time.
    pub before: Option<Timestamp>,
}

impl Scope {
    fn admits(&self, m: &Message) -> bool {
        self.admits_fields(m.session, m.role, m.created_at)
    }

    pub(crate) fn admits_record(&self, m: &RecordView<'_>) -> bool {
        self.admits_fields(m.session(), m.role(), m.created_at())
    }

    /// Whether the scope restricts nothing.
    fn is_everything(&self) -> bool {
        self.session.is_none() && self.is_everything_but_session()
    }

    /// Whether the scope restricts nothing but the session.
    fn is_everything_but_session(&self) -> bool {
        self.roles.is_empty() && self.since.is_none() && self.before.is_none()
    }

    fn admits_fields(&self, session: SessionId, role: Role, created_at: Timestamp) -> bool {
        self.session.is_none_or(|s| s == session)
            && (self.roles.is_empty() || self.roles.contains(&role))
            && self.since.is_none_or(|t| created_at >= t)
            && self.before.is_none_or(|t| created_at < t)
    }
}

/// A search request.
#[derive(Debug, Clone)]
pub struct GrepRequest {
    pub pattern: String,
    pub mode: GrepMode,
    pub scope: Scope,
    /// Hits per page (`None`: the configured default; capped at the configured maximum).
    pub limit: Option<usize>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

/// One matching message.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GrepHit {
    pub message: MessageId,
    pub session: SessionId,
    pub seq: u64,
    pub role: Role,
    pub created_at: Timestamp,
    /// Text around the first match, on one line, with `…` where it was cut.
    pub snippet: String,
    /// Matches in the message (regex; at most 1000 are counted), or matched words (full text).
    pub matches: usize,
    /// BM25 score (full text, indexed messages only), cosine similarity (semantic), or the
    /// fused score (hybrid).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub score: Option<f32>,
    /// Which searches found the message (semantic and hybrid hits: `full_text`, `semantic`
    /// or both); empty for regex and full-text hits, found by their own mode.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub found_by: Vec<GrepMode>,
}

/// How a page was answered (for tools and benchmarks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// Trigram candidates from the index, verified on the store.
    TrigramIndex,
    /// No usable literal: every message in scope was scanned.
    Scan,
    /// BM25 over the words index.
    Ranked,
    /// Nearest embeddings in the vector index.
    Semantic,
    /// BM25 and the vector index, fused.
    Hybrid,
    /// BM25 and the vector index, fused, the first hits reordered with the reranker's scores
    /// (`[embeddings] reranker_dir`).
    HybridReranked,
}

/// One page of hits.
#[derive(Debug, Clone, Serialize)]
pub struct GrepPage {
    pub hits: Vec<GrepHit>,
    /// Pass back to get the next page; `None` when there is none.
    pub next_cursor: Option<String>,
    pub strategy: Strategy,
    /// Messages whose text was read to answer this page.
    pub messages_examined: u64,
    /// Semantic and hybrid searches: messages stored but not embedded yet (the vector index
    /// catches up in the background), which the embeddings could not find; hybrid search
    /// still finds them by their words. `None` for the other modes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_embedded: Option<u64>,
}

/// Runs a search. Bad patterns and foreign cursors are [`StoreError::InvalidQuery`] /
/// [`StoreError::InvalidCursor`].
pub fn grep<S: RecordSource>(
    store: &S,
    index: &SearchIndex,
    config: &SearchConfig,
    request: &GrepRequest,
) -> Result<GrepPage> {
    let limit = request.limit.unwrap_or(config.default_limit);
    if limit == 0 || limit > config.max_limit {
        return Err(StoreError::InvalidQuery(format!(
            "limit must be between 1 and {}, got {limit}",
            config.max_limit
        )));
    }
    if request.pattern.is_empty() {
        return Err(StoreError::InvalidQuery("the pattern is empty".into()));
    }
    if request.pattern.len() > MAX_PATTERN_LEN {
        return Err(StoreError::InvalidQuery(format!(
            "the pattern is {} bytes long; the limit is {MAX_PATTERN_LEN}",
            request.pattern.len()
        )));
    }
    let fingerprint = request_fingerprint(request);
    let cursor = request
        .cursor
        .as_deref()
        .map(|c| Cursor::decode(c, fingerprint))
        .transpose()?;
    match request.mode {
        GrepMode::Regex => regex_grep(store, index, config, request, limit, cursor, fingerprint),
        GrepMode::FullText => {
            full_text_grep(store, index, config, request, limit, cursor, fingerprint)
        }
        GrepMode::Semantic | GrepMode::Hybrid => crate::hybrid::ranked_by_meaning(
            store,
            index,
            config,
            request,
            limit,
            cursor,
            fingerprint,
        ),
    }
}

fn regex_grep<S: RecordSource>(
    store: &S,
    index: &SearchIndex,
    config: &SearchConfig,
    request: &GrepRequest,
    limit: usize,
    cursor: Option<Cursor>,
    fingerprint: u64,
) -> Result<GrepPage> {
    // Parsing first reports a syntax error as `regex` does (with the pattern and a caret).
    let hir = regex_syntax::Parser::new()
        .parse(&request.pattern)
        .map_err(|e| StoreError::InvalidQuery(format!("invalid regex: {e}")))?;
    let plan = trigram::plan(&hir);
    // The `regex` crate's own engine, with its defaults: the same matches as `regex::Regex`,
    // on text or on bytes. Compiled once (about 50 µs, a third of a literal grep).
    let regex = BytesRegex::new(&request.pattern)
        .map_err(|e| StoreError::InvalidQuery(format!("invalid regex: {e}")))?;
    let after = match cursor {
        None => None,
        Some(Cursor::After(id)) => Some(id),
        Some(_) => return Err(StoreError::InvalidCursor("not a regex cursor".into())),
    };
    let scope = &request.scope;
    let reader = store.reader()?;
    let start = StartClasses::of(&hir);
    let required = Required::of(&hir);
    let tester = RecordTester::new(
        &regex,
        config.snippet_chars,
        searchable_by_row(&hir),
        StartSearch::new(start.as_ref(), required.as_ref()),
    );
    let mut collector = HitCollector::new(tester, limit);

    let end = store.next_message_id()?;
    let strategy = if plan.is_all() {
        scan(
            store,
            &reader,
            scope,
            after,
            MessageId(0)..end,
            &mut collector,
        )?;
        Strategy::Scan
    } else {
        let session_ids = match scope.session {
            Some(session) => Some(reader.session_id_ranges(session)?),
            None => None,
        };
        // One watermark for both halves: candidates below it, a scan from it. (Read twice, a
        // catch-up between the reads would leave its messages to neither.)
        let indexed = index.watermark();
        // Where the candidates turned out too dense to verify one by one, if they did: the
        // rest of the indexed messages is scanned from there.
        let first = after.map_or(0, |a| a.0 + 1);
        let (mut examined, mut dense_from) = (0u64, None);
        index.regex_candidates(&plan, after, indexed, |ids| {
            let mut flow = ControlFlow::Continue(());
            let in_scope = ids.iter().copied().filter(|id| {
                session_ids
                    .as_ref()
                    .is_none_or(|ranges| in_ranges(ranges, id.0))
            });
            reader.records_of(in_scope, |id, bytes| {
                flow = collector.offer(id, bytes, scope)?;
                Ok(flow)
            })?;
            examined += ids.len() as u64;
            if let Some(last) = ids.last()
                && flow.is_continue()
                && examined >= DENSE_CHECK_AFTER
                && examined * DENSE_SPACING > last.0 + 1 - first
            {
                dense_from = Some(MessageId(last.0 + 1));
                flow = ControlFlow::Break(());
            }
            Ok(flow)
        })?;
        // Not yet indexed (and, if the candidates turned dense, the rest of the indexed
        // messages: one scan of them costs less than a lookup each): scan.
        let unindexed_from = dense_from.unwrap_or(indexed);
        if !collector.full() {
            scan(
                store,
                &reader,
                scope,
                after,
                unindexed_from..end,
                &mut collector,
            )?;
        }
        Strategy::TrigramIndex
    };
    Ok(collector.into_page(strategy, fingerprint))
}

/// Whether `id` is in one of `ranges` (ascending, disjoint).
fn in_ranges(ranges: &[std::ops::Range<u64>], id: u64) -> bool {
    let at = ranges.partition_point(|r| r.end <= id);
    ranges.get(at).is_some_and(|r| r.contains(&id))
}

/// Offers every message of `ids` in scope and after `after` to the collector, in id order.
fn scan<S: RecordSource>(
    store: &S,
    reader: &S::Reader<'_>,
    scope: &Scope,
    after: Option<MessageId>,
    ids: std::ops::Range<MessageId>,
    collector: &mut HitCollector<'_>,
) -> Result<()> {
    let start = after.map_or(ids.start, |a| MessageId(a.0 + 1).max(ids.start));
    if start >= ids.end || collector.full() {
        return Ok(());
    }
    if let Some(session) = scope.session {
        // One session: walk its own ordered view (ids grow with seq within a session), from
        // just after the cursor's message when there is one.
        let first_seq = match after.map(|a| reader.try_message(a)).transpose()?.flatten() {
            Some(m) if m.session == session => m.seq + 1,
            _ => 0,
        };
        // The walk visits the session's messages only: in scope if nothing else restricts it.
        let all_in_scope = scope.is_everything_but_session();
        return reader.session_records_in_rows(session, first_seq..u64::MAX, start..ids.end, |r| {
            collector.offer_in_row(&r, scope, all_in_scope)
        });
    }
    scan_parallel(store, scope, start..ids.end, collector)
}

/// Candidates verified before their density is judged.
const DENSE_CHECK_AFTER: u64 = 256;
/// Candidates closer together than one in this many ids on average are verified faster by a
/// scan (about 20 ns a message on two cores) than by a lookup each (about a microsecond).
const DENSE_SPACING: u64 = 32;

/// Ids scanned per window after the first (of [`MIN_IDS_PER_THREAD`], on the calling thread).
/// Each is split across the cores and its hits are offered in order, so the result is the same
/// as a sequential scan and stops within one window of the limit.
const SCAN_WINDOW: u64 = 32_768;

/// Fewest ids a scan thread is given: a smaller range (the usual unindexed tail of a live
/// store, a few messages since the last index commit) is scanned on the calling thread alone,
/// without starting a thread.
const MIN_IDS_PER_THREAD: u64 = 4_096;

/// Scans every message in `ids` (all sessions) on all cores, offering hits in id order. The
/// calling thread scans the first part of each window itself; a window too small to split is
/// scanned by it alone, up to the limit.
fn scan_parallel<S: RecordSource>(
    store: &S,
    scope: &Scope,
    ids: std::ops::Range<MessageId>,
    collector: &mut HitCollector<'_>,
) -> Result<()> {
    let cores = lcm_core::cores::cores() as u64;
    let mut from = ids.start.0;
    // Small first: a pattern that matches often fills its page within the first few thousand
    // messages, which the calling thread scans alone, stopping at the limit. Then whole
    // windows (each one more start of threads).
    let mut window = MIN_IDS_PER_THREAD;
    while from < ids.end.0 && !collector.full() {
        let to = (from + window).min(ids.end.0);
        window = SCAN_WINDOW;
        let threads = (to - from).div_ceil(MIN_IDS_PER_THREAD).clamp(1, cores);
        if threads == 1 {
            // This thread alone, stopping at the limit.
            store
                .reader()?
                .range_records_in_rows(MessageId(from)..MessageId(to), |r| {
                    collector.offer_in_row(&r, scope, scope.is_everything())
                })?;
            from = to;
            continue;
        }
        let step = (to - from).div_ceil(threads);
        let part = |t: u64| (from + t * step)..(from + (t + 1) * step).min(to);
        // No part needs more hits than the page has room for.
        let room = collector.limit - collector.hits.len();
        let helper_testers: Vec<RecordTester<'_>> = (1..threads)
            .map(|_| collector.tester.for_another_thread())
            .collect();
        let own_tester = &mut collector.tester;
        let parts: Vec<Result<(Vec<GrepHit>, u64)>> = std::thread::scope(|scope_| {
            let helpers: Vec<_> = helper_testers
                .into_iter()
                .zip(1..)
                .map(|(mut tester, t)| {
                    let ids = part(t);
                    scope_.spawn(move || scan_part(store, scope, ids, room, &mut tester))
                })
                .collect();
            let mut parts = vec![scan_part(store, scope, part(0), room, own_tester)];
            parts.extend(helpers.into_iter().map(|h| match h.join() {
                Ok(result) => result,
                Err(panic) => std::panic::resume_unwind(panic),
            }));
            parts
        });
        for part in parts {
            let (hits, examined) = part?;
            collector.examined += examined;
            for hit in hits {
                if collector.full() {
                    break;
                }
                collector.push(hit);
            }
        }
        from = to;
    }
    Ok(())
}

/// One part of a [`scan_parallel`] window: its first `room` hits in id order and how many
/// messages in scope it examined.
fn scan_part<S: RecordSource>(
    store: &S,
    scope: &Scope,
    ids: std::ops::Range<u64>,
    room: usize,
    tester: &mut RecordTester<'_>,
) -> Result<(Vec<GrepHit>, u64)> {
    let mut hits = Vec::new();
    let mut examined = 0u64;
    if ids.is_empty() {
        return Ok((hits, examined));
    }
    let reader = store.reader()?;
    reader.range_records_in_rows(MessageId(ids.start)..MessageId(ids.end), |r| {
        let tested = tester.test_in_row(&r, scope, scope.is_everything())?;
        let step = tested.step();
        hits.extend(tested.tally(&mut examined));
        Ok(if hits.len() >= room { Step::Stop } else { step })
    })?;
    Ok((hits, examined))
}

/// The hit for message `id` if `regex` matches its searchable `text`. Nothing is allocated
/// unless it matches.
fn regex_hit(
    regex: &BytesRegex,
    id: MessageId,
    m: &RecordView<'_>,
    text: &str,
    snippet_chars: usize,
) -> Option<GrepHit> {
    let first = regex.find(text)?;
    let matches = regex.find_iter(text).take(MAX_COUNTED_MATCHES).count();
    Some(GrepHit {
        message: id,
        session: m.session(),
        seq: m.seq(),
        role: m.role(),
        created_at: m.created_at(),
        snippet: snippet(text, first.start(), first.end(), snippet_chars),
        matches,
        score: None,
        found_by: Vec::new(),
    })
}

/// What testing one stored message gave.
enum Tested {
    /// Outside the scope: not examined.
    OutOfScope,
    Miss,
    /// This message and the rest of its row ([`InRow::rest`] messages in all) miss.
    RowMisses(u64),
    Hit(GrepHit),
}

impl Tested {
    /// How a walk over rows goes on after this.
    fn step(&self) -> Step {
        match self {
            Tested::RowMisses(_) => Step::SkipRow,
            _ => Step::Next,
        }
    }

    /// Counts the message into `examined` if it was in scope; the hit, if any.
    fn tally(self, examined: &mut u64) -> Option<GrepHit> {
        match self {
            Tested::OutOfScope => None,
            Tested::Miss => {
                *examined += 1;
                None
            }
            Tested::RowMisses(n) => {
                *examined += n;
                None
            }
            Tested::Hit(hit) => {
                *examined += 1;
                Some(hit)
            }
        }
    }
}

/// Tests stored messages against a regex, for every path of regex grep (index candidates, the
/// unindexed tail, full scans). Most messages are rejected on their bytes: the scope from the
/// record's fixed header and the regex run on its searchable text as bytes, not checked as
/// UTF-8 ([`RecordView::read_fast`]), with this thread's own regex cache. A message that
/// matches has its text checked and is matched again on it, which decides the hit, its snippet
/// and its match count, so the bytes path can only save work, never change a result; a record
/// the fast read rejects is read by the checked one, which says what is wrong with it.
struct RecordTester<'r> {
    regex: &'r BytesRegex,
    /// The search for a match's earliest end, narrowed for a regex without a literal byte
    /// ([`StartClasses`]).
    start: StartSearch<'r>,
    cache: regex_automata::meta::Cache,
    snippet_chars: usize,
    /// Whether a pack row is searched as a whole ([`searchable_by_row`]).
    by_row: bool,
    row: RowSearch,
}

/// Where the regex can match in the pack row being scanned (see [`RecordTester::test_in_row`]).
#[derive(Debug, Clone, Copy)]
struct RowSearch {
    /// The first id of the row (`u64::MAX`: none yet).
    first: u64,
    /// Searched from this offset of the row.
    from: usize,
    /// The end of the earliest match at or after `from`: `None` if not searched yet,
    /// `Some(None)` if there is none.
    earliest_end: Option<Option<usize>>,
}

impl RowSearch {
    const NONE: RowSearch = RowSearch {
        first: u64::MAX,
        from: 0,
        earliest_end: None,
    };
}

/// Whether a pattern can be searched for in a pack row's bytes as a whole (see
/// [`RecordTester::test_in_row`]): the regex asserts nothing about what surrounds a match (no
/// anchors, no word boundaries), so that a match in a message's text is a match in any bytes
/// that contain it; it cannot match the empty string (which every text holds); and it cannot
/// match a space or a newline, the bytes that join a message's fields (parts, a tool call's
/// name and arguments) into its searchable text, so that every match in a text lies in one
/// field, and every field stands in the record's bytes as it is. (A regex that can match them
/// is faster searched message by message: a row search would scan the record headers, and
/// the texts of joined fields again on their own.)
fn searchable_by_row(hir: &regex_syntax::hir::Hir) -> bool {
    let properties = hir.properties();
    properties.look_set().is_empty()
        && properties.minimum_len().is_some_and(|n| n > 0)
        && !can_match_char(hir, ' ')
        && !can_match_char(hir, '\n')
}

/// Whether some match of `hir` may contain `c` (an ASCII character); `true` when unsure.
fn can_match_char(hir: &regex_syntax::hir::Hir, c: char) -> bool {
    use regex_syntax::hir::{Class, HirKind};
    match hir.kind() {
        HirKind::Empty | HirKind::Look(_) => false,
        HirKind::Literal(literal) => literal.0.contains(&(c as u8)),
        HirKind::Class(Class::Unicode(class)) => {
            class.iter().any(|r| r.start() <= c && c <= r.end())
        }
        HirKind::Class(Class::Bytes(class)) => {
            let b = c as u8;
            class.iter().any(|r| r.start() <= b && b <= r.end())
        }
        HirKind::Repetition(rep) => can_match_char(&rep.sub, c),
        HirKind::Capture(capture) => can_match_char(&capture.sub, c),
        HirKind::Concat(subs) | HirKind::Alternation(subs) => {
            subs.iter().any(|sub| can_match_char(sub, c))
        }
    }
}

impl<'r> RecordTester<'r> {
    fn new(
        regex: &'r BytesRegex,
        snippet_chars: usize,
        by_row: bool,
        start: StartSearch<'r>,
    ) -> Self {
        RecordTester {
            regex,
            start,
            cache: regex.create_cache(),
            snippet_chars,
            by_row,
            row: RowSearch::NONE,
        }
    }

    /// A tester of the same regex for another thread (caches are per thread).
    fn for_another_thread(&self) -> Self {
        Self::new(
            self.regex,
            self.snippet_chars,
            self.by_row,
            self.start.clone(),
        )
    }

    /// [`Self::test`] for a message met in a walk over whole rows. In a pack, for a regex
    /// [`searchable_by_row`], every match in a message's text lies in one field of its record,
    /// so it is a match in the row ending within the record: the regex is run over the row's
    /// bytes, and a message can only match if the row's earliest match (searched again past
    /// each record it falls in) ends within its record. Where the row has no match (the usual
    /// case of a scan), its messages are rejected without a search of their own; when every
    /// message the walk visits is in scope (`all_in_scope`), the rest of such a row is passed
    /// over without its records being read (a record too damaged to read is then a miss rather
    /// than an error: it has no text to match).
    fn test_in_row(&mut self, r: &InRow<'_>, scope: &Scope, all_in_scope: bool) -> Result<Tested> {
        if !self.by_row || r.row.len() == r.record.len() {
            return self.test(MessageId(r.id), r.record, scope);
        }
        if all_in_scope && self.row_has_no_match_from(r) {
            return Ok(Tested::RowMisses(r.rest));
        }
        let record = RecordView::read_fast(r.record);
        if let Some(record) = &record {
            if !scope.admits_record(record) {
                return Ok(Tested::OutOfScope);
            }
            if !self.row_may_match(r) {
                return Ok(Tested::Miss);
            }
        }
        self.test_in_scope(MessageId(r.id), r.record, record)
    }

    /// Whether no match lies in `r`'s row from `r`'s record on.
    fn row_has_no_match_from(&mut self, r: &InRow<'_>) -> bool {
        self.earliest_end_in_row(r).is_none()
    }

    /// The end of the earliest match in `r`'s row at or after where the row search stands (at
    /// or before `r`'s record), searched once per position.
    fn earliest_end_in_row(&mut self, r: &InRow<'_>) -> Option<usize> {
        if self.row.first != r.row_first {
            self.row = RowSearch {
                first: r.row_first,
                from: r.span.start,
                earliest_end: None,
            };
        }
        if let Some(end) = self.row.earliest_end {
            return end;
        }
        let end = self
            .start
            .earliest_end(self.regex, &mut self.cache, r.row, self.row.from);
        self.row.earliest_end = Some(end);
        end
    }

    /// Whether a match in `r`'s row may lie within `r`'s record (see [`Self::test_in_row`]).
    /// Records come in row order, each starting at or after the previous one's end.
    fn row_may_match(&mut self, r: &InRow<'_>) -> bool {
        match self.earliest_end_in_row(r) {
            // No match ends within this record: its text, a part of it, has none.
            None => false,
            Some(end) if r.span.end < end => false,
            Some(_) => {
                // This record must be tested; later ones are judged by a search past it.
                self.row.from = r.span.end;
                self.row.earliest_end = None;
                true
            }
        }
    }

    fn test(&mut self, id: MessageId, bytes: &[u8], scope: &Scope) -> Result<Tested> {
        let record = RecordView::read_fast(bytes);
        if let Some(record) = &record
            && !scope.admits_record(record)
        {
            return Ok(Tested::OutOfScope);
        }
        self.test_in_scope(id, bytes, record)
    }

    /// [`Self::test`] once the byte reader has read the record (`None`: it could not) and
    /// found it in scope.
    fn test_in_scope(
        &mut self,
        id: MessageId,
        bytes: &[u8],
        record: Option<RecordView<'_>>,
    ) -> Result<Tested> {
        // A record the fast read rejects is damaged: the checked read says how.
        let record = match record {
            Some(record) => record,
            None => RecordView::read(bytes)?,
        };
        if self
            .start
            .earliest_end(self.regex, &mut self.cache, record.text_bytes(), 0)
            .is_none()
        {
            return Ok(Tested::Miss);
        }
        let text = record.text()?;
        Ok(
            match regex_hit(self.regex, id, &record, text, self.snippet_chars) {
                Some(hit) => Tested::Hit(hit),
                None => Tested::Miss,
            },
        )
    }
}

struct HitCollector<'r> {
    tester: RecordTester<'r>,
    limit: usize,
    hits: Vec<GrepHit>,
    examined: u64,
    last_hit: Option<MessageId>,
}

impl<'r> HitCollector<'r> {
    fn new(tester: RecordTester<'r>, limit: usize) -> Self {
        HitCollector {
            tester,
            limit,
            hits: Vec::new(),
            examined: 0,
            last_hit: None,
        }
    }

    fn full(&self) -> bool {
        self.hits.len() >= self.limit
    }

    /// [`Self::offer`] for a message met in a walk over whole rows.
    fn offer_in_row(&mut self, r: &InRow<'_>, scope: &Scope, all_in_scope: bool) -> Result<Step> {
        let tested = self.tester.test_in_row(r, scope, all_in_scope)?;
        let step = tested.step();
        Ok(match self.take(tested) {
            ControlFlow::Break(()) => Step::Stop,
            ControlFlow::Continue(()) => step,
        })
    }

    /// Tests the stored message `id` if it is in scope; says whether to go on (`Break` once
    /// full).
    fn offer(&mut self, id: MessageId, bytes: &[u8], scope: &Scope) -> Result<ControlFlow<()>> {
        let tested = self.tester.test(id, bytes, scope)?;
        Ok(self.take(tested))
    }

    /// Counts a tested message and keeps its hit; `Break` once full.
    fn take(&mut self, tested: Tested) -> ControlFlow<()> {
        if let Some(hit) = tested.tally(&mut self.examined) {
            self.push(hit);
        }
        if self.full() {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    }

    fn push(&mut self, hit: GrepHit) {
        self.last_hit = Some(hit.message);
        self.hits.push(hit);
    }

    fn into_page(self, strategy: Strategy, fingerprint: u64) -> GrepPage {
        let next_cursor = match (self.full(), self.last_hit) {
            (true, Some(last)) => Some(Cursor::After(last).encode(fingerprint)),
            _ => None,
        };
        GrepPage {
            hits: self.hits,
            next_cursor,
            strategy,
            messages_examined: self.examined,
            not_embedded: None,
        }
    }
}

fn full_text_grep<S: RecordSource>(
    store: &S,
    index: &SearchIndex,
    config: &SearchConfig,
    request: &GrepRequest,
    limit: usize,
    cursor: Option<Cursor>,
    fingerprint: u64,
) -> Result<GrepPage> {
    let analyzer_terms = |text: &str| -> Result<Vec<(String, usize, usize)>> {
        let mut analyzer = index.words_analyzer()?;
        let mut stream = analyzer.token_stream(text);
        let mut out = Vec::new();
        while let Some(token) = stream.next() {
            out.push((token.text.clone(), token.offset_from, token.offset_to));
        }
        Ok(out)
    };
    let query_terms: HashSet<String> = analyzer_terms(&request.pattern)?
        .into_iter()
        .map(|(t, _, _)| t)
        .collect();
    if query_terms.is_empty() {
        return Err(StoreError::InvalidQuery(format!(
            "`{}` has no words to search for",
            request.pattern
        )));
    }
    let scope = &request.scope;
    let reader = store.reader()?;
    let mut hits = Vec::new();
    let mut examined = 0u64;

    let make_hit = |m: &Message, score: Option<f32>| -> Result<Option<GrepHit>> {
        let text = m.search_text();
        let tokens = analyzer_terms(&text)?;
        let matched: Vec<&(String, usize, usize)> = tokens
            .iter()
            .filter(|(t, _, _)| query_terms.contains(t))
            .collect();
        // Ranked hits already satisfy the query; unranked tail hits need one of its words.
        if score.is_none() && matched.is_empty() {
            return Ok(None);
        }
        let (start, end) = matched.first().map_or((0, 0), |(_, s, e)| (*s, *e));
        Ok(Some(GrepHit {
            message: m.id,
            session: m.session,
            seq: m.seq,
            role: m.role,
            created_at: m.created_at,
            snippet: snippet(&text, start, end, config.snippet_chars),
            matches: matched.len(),
            score,
            found_by: Vec::new(),
        }))
    };

    let mut next = None;
    // Where the scan of the messages no ranking covers starts: the watermark of the searcher
    // that ranked, or, on a page after the ranked ones, just after the last hit (everything
    // below that was ranked or scanned already, whatever was indexed since).
    let tail_start = match cursor {
        None | Some(Cursor::Ranked(_)) => {
            let offset = match cursor {
                Some(Cursor::Ranked(o)) => o,
                _ => 0,
            };
            let ranked = index.full_text(&request.pattern, scope, offset, limit)?;
            for (id, score) in &ranked.hits {
                if let Some(m) = reader.try_message(*id)? {
                    examined += 1;
                    if let Some(hit) = make_hit(&m, Some(*score))? {
                        hits.push(hit);
                    }
                }
            }
            if ranked.more {
                next = Some(Cursor::Ranked(offset + ranked.hits.len()));
            }
            ranked.indexed
        }
        Some(Cursor::After(id)) => MessageId(id.0 + 1),
    };

    let end = store.next_message_id()?;
    if next.is_none() && hits.len() >= limit && tail_start < end {
        // The ranked hits ended exactly at the limit: the next page scans the rest. (Ranked
        // hits exist, so `tail_start`, the watermark, is at least 1.)
        next = Some(Cursor::After(MessageId(tail_start.0.saturating_sub(1))));
    } else if next.is_none() && hits.len() < limit {
        let mut failure = None;
        let mut last = None;
        reader.for_each_message(tail_start..end, |m| {
            if !scope.admits(&m) {
                return ControlFlow::Continue(());
            }
            examined += 1;
            match make_hit(&m, None) {
                Ok(Some(hit)) => {
                    last = Some(hit.message);
                    hits.push(hit);
                }
                Ok(None) => {}
                Err(e) => {
                    failure = Some(e);
                    return ControlFlow::Break(());
                }
            }
            if hits.len() >= limit {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })?;
        if let Some(e) = failure {
            return Err(e);
        }
        if hits.len() >= limit {
            next = last.map(Cursor::After);
        }
    }
    Ok(GrepPage {
        hits,
        next_cursor: next.map(|c| c.encode(fingerprint)),
        strategy: Strategy::Ranked,
        messages_examined: examined,
        not_embedded: None,
    })
}

/// About `width` characters of `text` around `start..end`, on one line.
pub fn snippet(text: &str, start: usize, end: usize, width: usize) -> String {
    if text.is_ascii() {
        ascii_snippet(text, start, end, width)
    } else {
        char_snippet(text, start, end, width)
    }
}

/// [`snippet`] counting characters.
fn char_snippet(text: &str, start: usize, end: usize, width: usize) -> String {
    let match_chars = text[start..end].chars().count();
    let context = width.saturating_sub(match_chars.min(width)) / 2;
    let before: Vec<(usize, char)> = text[..start].char_indices().rev().take(context).collect();
    let from = before.last().map_or(start, |(i, _)| *i);
    let after_len: usize = text[end..]
        .chars()
        .take(context + width.saturating_sub(match_chars + 2 * context))
        .map(char::len_utf8)
        .sum();
    let mut to = end + after_len;
    // A long match is cut too.
    if text[from..to].chars().count() > width + 1 {
        to = from
            + text[from..]
                .chars()
                .take(width)
                .map(char::len_utf8)
                .sum::<usize>();
    }
    let mut out = String::with_capacity(to - from + 8);
    if from > 0 {
        out.push('…');
    }
    out.extend(
        text[from..to]
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c }),
    );
    if to < text.len() {
        out.push('…');
    }
    out
}

/// [`snippet`] of an ASCII text, where a character is a byte: the same cut as
/// [`char_snippet`], without decoding.
fn ascii_snippet(text: &str, start: usize, end: usize, width: usize) -> String {
    let match_len = end - start;
    let context = width.saturating_sub(match_len.min(width)) / 2;
    let from = start.saturating_sub(context);
    let after = context + width.saturating_sub(match_len + 2 * context);
    let mut to = (end + after).min(text.len());
    if to - from > width + 1 {
        to = from + width;
    }
    let mut out = String::with_capacity(to - from + 6);
    if from > 0 {
        out.push('…');
    }
    let mut rest = &text[from..to];
    while let Some(at) = rest.bytes().position(|b| b.is_ascii_control()) {
        out.push_str(&rest[..at]);
        out.push(' ');
        rest = &rest[at + 1..];
    }
    out.push_str(rest);
    if to < text.len() {
        out.push('…');
    }
    out
}

// ------------------------------------------------------------- other texts

/// Matches any text the way [`grep`] matches a message's searchable text: the regex, or (full
/// text) any of the query's words after the index's analysis (stemmed, lowercased), as grep does
/// for messages not yet indexed. For texts grep does not search (summaries) and for callers
/// that scan a bounded range themselves.
pub struct TextMatcher {
    kind: MatcherKind,
}

enum MatcherKind {
    Regex(Regex),
    Words {
        analyzer: tantivy::tokenizer::TextAnalyzer,
        terms: HashSet<String>,
    },
}

impl std::fmt::Debug for TextMatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            MatcherKind::Regex(r) => f.debug_tuple("TextMatcher::Regex").field(r).finish(),
            MatcherKind::Words { terms, .. } => {
                f.debug_tuple("TextMatcher::Words").field(terms).finish()
            }
        }
    }
}

/// Where a [`TextMatcher`] matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextMatch {
    /// Text around the first match (see [`snippet`]).
    pub snippet: String,
    /// Matches in the text (regex: at most 1000 are counted; full text: matched words).
    pub matches: usize,
}

impl TextMatcher {
    /// A matcher for `pattern` in `mode` (full text needs the index's analyzer). Bad patterns
    /// are [`StoreError::InvalidQuery`], as in [`grep`].
    pub fn new(index: &SearchIndex, mode: GrepMode, pattern: &str) -> Result<TextMatcher> {
        match mode {
            GrepMode::Regex => TextMatcher::regex(pattern),
            GrepMode::FullText => {
                check_pattern(pattern)?;
                let mut analyzer = index.words_analyzer()?;
                let mut terms = HashSet::new();
                let mut stream = analyzer.token_stream(pattern);
                while let Some(token) = stream.next() {
                    terms.insert(token.text.clone());
                }
                drop(stream);
                if terms.is_empty() {
                    return Err(StoreError::InvalidQuery(format!(
                        "`{pattern}` has no words to search for"
                    )));
                }
                Ok(TextMatcher {
                    kind: MatcherKind::Words { analyzer, terms },
                })
            }
            GrepMode::Semantic | GrepMode::Hybrid => Err(StoreError::InvalidQuery(format!(
                "{} search ranks messages by meaning through the vector index; it does not \
                 match text",
                mode.name()
            ))),
        }
    }

    /// A regex matcher (needs no index).
    pub fn regex(pattern: &str) -> Result<TextMatcher> {
        check_pattern(pattern)?;
        let regex = Regex::new(pattern)
            .map_err(|e| StoreError::InvalidQuery(format!("invalid regex: {e}")))?;
        Ok(TextMatcher {
            kind: MatcherKind::Regex(regex),
        })
    }

    /// The first match in `text` with a snippet of about `snippet_chars` characters, if any.
    pub fn find(&mut self, text: &str, snippet_chars: usize) -> Option<TextMatch> {
        match &mut self.kind {
            MatcherKind::Regex(regex) => {
                let first = regex.find(text)?;
                Some(TextMatch {
                    snippet: snippet(text, first.start(), first.end(), snippet_chars),
                    matches: regex.find_iter(text).take(MAX_COUNTED_MATCHES).count(),
                })
            }
            MatcherKind::Words { analyzer, terms } => {
                let mut stream = analyzer.token_stream(text);
                let mut first = None;
                let mut matches = 0;
                while let Some(token) = stream.next() {
                    if terms.contains(&token.text) {
                        matches += 1;
                        first.get_or_insert((token.offset_from, token.offset_to));
                    }
                }
                let (start, end) = first?;
                Some(TextMatch {
                    snippet: snippet(text, start, end, snippet_chars),
                    matches,
                })
            }
        }
    }
}

fn check_pattern(pattern: &str) -> Result<()> {
    if pattern.is_empty() {
        return Err(StoreError::InvalidQuery("the pattern is empty".into()));
    }
    if pattern.len() > MAX_PATTERN_LEN {
        return Err(StoreError::InvalidQuery(format!(
            "the pattern is {} bytes long; the limit is {MAX_PATTERN_LEN}",
            pattern.len()
        )));
    }
    Ok(())
}

// ------------------------------------------------------------------- cursors

/// Where the next page starts. Encoded with a fingerprint of the request, so a cursor used
/// with another query is refused instead of silently returning wrong pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cursor {
    /// Regex, or the unranked tail of a full-text search: hits after this message.
    After(MessageId),
    /// Full text: ranked hits from this offset.
    Ranked(usize),
}

impl Cursor {
    pub(crate) fn encode(self, fingerprint: u64) -> String {
        match self {
            Cursor::After(id) => format!("a{:x}.{fingerprint:016x}", id.0),
            Cursor::Ranked(offset) => format!("r{offset:x}.{fingerprint:016x}"),
        }
    }

    pub(crate) fn decode(text: &str, fingerprint: u64) -> Result<Cursor> {
        let bad = || StoreError::InvalidCursor(format!("`{text}` is not a cursor lcm issued"));
        let (head, print) = text.split_once('.').ok_or_else(bad)?;
        let print = u64::from_str_radix(print, 16).map_err(|_| bad())?;
        if print != fingerprint {
            return Err(StoreError::InvalidCursor(
                "this cursor belongs to a different search (pattern, mode or scope changed)".into(),
            ));
        }
        let mut chars = head.chars();
        let kind = chars.next().ok_or_else(bad)?;
        let number = u64::from_str_radix(chars.as_str(), 16).map_err(|_| bad())?;
        match kind {
            'a' => Ok(Cursor::After(MessageId(number))),
            'r' => Ok(Cursor::Ranked(usize::try_from(number).map_err(|_| bad())?)),
            _ => Err(bad()),
        }
    }
}

/// FNV-1a over everything that defines a search's result set (stable across runs).
fn request_fingerprint(request: &GrepRequest) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |bytes: &[u8]| {
        for b in bytes {
            hash ^= u64::from(*b);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        hash ^= 0xff;
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    };
    feed(request.pattern.as_bytes());
    feed(&[request.mode as u8]);
    let s = &request.scope;
    feed(&s.session.map_or(u64::MAX, |s| s.0).to_le_bytes());
    for r in &s.roles {
        feed(&[r.code() as u8]);
    }
    feed(&s.since.map_or(i64::MIN, |t| t.0).to_le_bytes());
    feed(&s.before.map_or(i64::MAX, |t| t.0).to_le_bytes());
    hash
}

#[cfg(test)]
mod tests {
    use super::*;
    use lcm_store::store::Store;

    /// The first page (10 hits) of a regex grep.
    fn first_regex_page(
        store: &Store,
        index: &SearchIndex,
        pattern: &str,
        scope: Scope,
    ) -> GrepPage {
        let request = GrepRequest {
            pattern: pattern.into(),
            mode: GrepMode::Regex,
            scope,
            limit: Some(10),
            cursor: None,
        };
        grep(store, index, &SearchConfig::default(), &request).unwrap()
    }

    /// Appends `batch` as one batch (packed rows) and returns the messages' ids.
    fn append_ids(
        store: &Store,
        session: SessionId,
        batch: Vec<lcm_core::message::NewMessage>,
    ) -> Vec<MessageId> {
        store
            .append_batch(session, batch)
            .unwrap()
            .into_iter()
            .map(|a| a.id)
            .collect()
    }

    fn memory_store() -> Store {
        Store::open_in_memory(lcm_store::store::StoreOptions::new(
            lcm_core::tokens::TokenCounter::new(lcm_core::tokens::Encoding::O200kBase),
        ))
        .unwrap()
    }

    /// A match that takes in the newline joining two parts, or the space joining a tool call's
    /// name and arguments, exists in the message's text but not in its record's bytes: a scan
    /// of packed records finds it all the same (the regex is then tested message by message).
    #[test]
    fn a_scan_finds_matches_across_the_joins_of_packed_fields() {
        use lcm_core::message::{NewMessage, Part, Role};
        let store = memory_store();
        let session = store.create_session("s", None).unwrap();
        let mut batch: Vec<NewMessage> = (0..20)
            .map(|i| NewMessage::text(Role::User, format!("filler{i}")))
            .collect();
        batch[5].parts = vec![
            Part::Text { text: "abc".into() },
            Part::Text { text: "def".into() },
        ];
        batch[9] = NewMessage {
            parts: vec![Part::ToolCall {
                id: "t".into(),
                name: "abc".into(),
                arguments: "def".into(),
            }],
            ..NewMessage::text(Role::Assistant, "")
        };
        let ids = append_ids(&store, session, batch);
        let config = SearchConfig::default();
        // Nothing indexed: every message is scanned.
        let index = SearchIndex::open_in_ram(&store, &config).unwrap();
        for (pattern, expected) in [
            ("c\\nd", vec![ids[5]]),
            ("c d", vec![ids[9]]),
            ("c.d", vec![ids[9]]),
            ("c[^ ]d", vec![ids[5]]),
            (r"c\sd", vec![ids[5], ids[9]]),
        ] {
            for scope in [
                Scope::default(),
                Scope {
                    session: Some(session),
                    ..Scope::default()
                },
            ] {
                let page = first_regex_page(&store, &index, pattern, scope);
                let found: Vec<MessageId> = page.hits.iter().map(|h| h.message).collect();
                assert_eq!(found, expected, "{pattern}");
            }
        }
    }

    /// Patterns whose matches require a literal the engine does not look for, or a run of a
    /// rare class (`required.rs`), are found in packed rows whose other fields (tool call ids
    /// full of hexadecimal digits) hold such runs too, and nowhere else.
    #[test]
    fn required_literals_and_runs_find_exactly_the_matches_in_packed_rows() {
        use lcm_core::message::{NewMessage, Part, Role};
        let store = memory_store();
        let session = store.create_session("s", None).unwrap();
        let hash = "3f2a9c1e8b7d6a5f4e3d2c1b0a9f8e7d6c5b4a39";
        let tool_call = |i: usize, arguments: String| NewMessage {
            parts: vec![Part::ToolCall {
                id: format!("toolu_0123456789abcdef0123456789abcdef{i:08x}"),
                name: "bash".into(),
                arguments,
            }],
            ..NewMessage::text(Role::Assistant, "")
        };
        let mut batch: Vec<NewMessage> = (0..60)
            .map(|i| tool_call(i, format!("{{\"cmd\": \"ls {i}\"}}")))
            .collect();
        batch[7] = tool_call(7, format!("{{\"cmd\": \"git show {hash}\"}}"));
        batch[20] = NewMessage::text(Role::Tool, format!("commit {hash}\nraised TypeError"));
        batch[33] = NewMessage::text(Role::User, format!("one short: {}", &hash[1..]));
        batch[41] = NewMessage::text(Role::User, "Error alone, and KeyError: 'x'");
        batch[50].parts = vec![
            Part::Text {
                text: hash[..20].into(),
            },
            Part::Text {
                text: hash[20..].into(),
            },
        ];
        let ids = append_ids(&store, session, batch);
        let config = SearchConfig::default();
        let unindexed = SearchIndex::open_in_ram(&store, &config).unwrap();
        let indexed = SearchIndex::open_in_ram(&store, &config).unwrap();
        indexed.catch_up(&store, |_, _| {}).unwrap();
        for (pattern, expected) in [
            ("[0-9a-f]{40}", vec![ids[7], ids[20]]),
            (r"\b[0-9a-f]{39}\b", vec![ids[33]]),
            ("[A-Z][a-z]+Error", vec![ids[20], ids[41]]),
            (r"[A-Z][a-z]{2}Error: '", vec![ids[41]]),
        ] {
            for index in [&unindexed, &indexed] {
                let page = first_regex_page(&store, index, pattern, Scope::default());
                let found: Vec<MessageId> = page.hits.iter().map(|h| h.message).collect();
                assert_eq!(found, expected, "{pattern}");
            }
        }
    }

    /// Which patterns a scan may search for in whole pack rows.
    #[test]
    fn patterns_searchable_by_row() {
        let by_row =
            |pattern: &str| searchable_by_row(&regex_syntax::Parser::new().parse(pattern).unwrap());
        assert!(by_row(r"[A-Z]{3}_\d{5}"));
        assert!(by_row(r"(?i)err_\d+|timeout"));
        // A space or a newline may join two fields of a text.
        assert!(!by_row("a.b"));
        assert!(!by_row("a[^ ]b"));
        assert!(!by_row("(?s)a.b"));
        assert!(!by_row(r"a\sb"));
        assert!(!by_row("[^x]+"));
        assert!(!by_row("(?i)timeout module"));
        assert!(!by_row("foo|bar\nbaz"));
        // Look-arounds depend on the bytes around a match; an empty match is in every text.
        assert!(!by_row(r"\bfoo"));
        assert!(!by_row("^foo"));
        assert!(!by_row("(?m)foo$"));
        assert!(!by_row("x*"));
    }

    proptest::proptest! {
        /// An ASCII text's snippet, cut without decoding, is the one the general cut makes.
        #[test]
        fn ascii_snippets_cut_as_the_general_one(
            text in "[a-z \n\t\x01\x7f]{0,300}",
            start in 0usize..300,
            len in 0usize..80,
            width in 0usize..120,
        ) {
            let start = start.min(text.len());
            let end = (start + len).min(text.len());
            proptest::prop_assert_eq!(
                ascii_snippet(&text, start, end, width),
                char_snippet(&text, start, end, width)
            );
        }
    }

    #[test]
    fn snippets_are_bounded_and_centred() {
        let text = format!("{}NEEDLE{}", "a".repeat(500), "b".repeat(500));
        let s = snippet(&text, 500, 506, 60);
        assert!(s.contains("NEEDLE"));
        assert!(s.starts_with('…') && s.ends_with('…'));
        assert!(s.chars().count() <= 64, "{}", s.chars().count());
        assert_eq!(snippet("short needle", 6, 12, 200), "short needle");
        let s = snippet("é\nneedle\tx", 3, 9, 200);
        assert_eq!(s, "é needle x");
    }

    fn store_with_zebras(n: usize) -> (Store, lcm_core::ids::SessionId) {
        let store = memory_store();
        let session = store.create_session("zoo", None).unwrap();
        for i in 0..n {
            store
                .append(
                    session,
                    lcm_core::message::NewMessage::text(
                        lcm_core::message::Role::User,
                        format!("zebra number {i}"),
                    ),
                )
                .unwrap();
        }
        (store, session)
    }

    fn zebras(
        store: &Store,
        index: &SearchIndex,
        config: &SearchConfig,
        cursor: Option<String>,
    ) -> GrepPage {
        let request = GrepRequest {
            pattern: "zebra".into(),
            mode: GrepMode::FullText,
            scope: Scope::default(),
            limit: Some(2),
            cursor,
        };
        grep(store, index, config, &request).unwrap()
    }

    #[test]
    fn semantic_modes_without_a_model_name_the_option_to_set() {
        let (store, _) = store_with_zebras(3);
        let config = SearchConfig::default();
        let index = SearchIndex::open_in_ram(&store, &config).unwrap();
        for mode in [GrepMode::Semantic, GrepMode::Hybrid] {
            let request = GrepRequest {
                pattern: "striped animals".into(),
                mode,
                scope: Scope::default(),
                limit: None,
                cursor: None,
            };
            let err = grep(&store, &index, &config, &request).unwrap_err();
            let text = err.to_string();
            assert!(matches!(err, StoreError::InvalidQuery(_)), "{err:?}");
            assert!(
                text.contains(mode.name())
                    && text.contains("[embeddings]")
                    && text.contains("model_dir"),
                "{text}"
            );
            assert!(TextMatcher::new(&index, mode, "striped").is_err());
        }
        // Nothing was written: the store still holds its three messages and nothing else.
        assert_eq!(store.stats().unwrap().messages, 3);
    }

    /// Every page of a full-text search, following cursors.
    fn all_zebras(store: &Store, index: &SearchIndex, config: &SearchConfig) -> Vec<MessageId> {
        let mut found = Vec::new();
        let mut cursor = None;
        loop {
            let page = zebras(store, index, config, cursor);
            found.extend(page.hits.iter().map(|h| h.message));
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => return found,
            }
        }
    }

    #[test]
    fn full_text_finds_every_message_between_the_commits_of_a_catch_up() {
        let (store, _) = store_with_zebras(6);
        let config = SearchConfig {
            index_batch: 2,
            ..SearchConfig::default()
        };
        let index = SearchIndex::open_in_ram(&store, &config).unwrap();
        let mut seen = Vec::new();
        // Searched after each commit of the catch-up (three of them), before it returns: the
        // watermark has moved, so the ranked part must show what the commit added.
        index
            .catch_up(&store, |done, _| {
                let mut found = all_zebras(&store, &index, &config);
                found.sort();
                seen.push((done, found));
                // And what is committed is ranked at once, not scanned.
                let request = GrepRequest {
                    pattern: "zebra".into(),
                    mode: GrepMode::FullText,
                    scope: Scope::default(),
                    limit: Some(10),
                    cursor: None,
                };
                let page = grep(&store, &index, &config, &request).unwrap();
                let ranked = page.hits.iter().filter(|h| h.score.is_some()).count();
                assert_eq!(ranked as u64, done, "ranked after {done} indexed");
            })
            .unwrap();
        let every: Vec<MessageId> = (0..6).map(MessageId).collect();
        assert_eq!(seen.len(), 3);
        for (done, found) in &seen {
            assert_eq!(found, &every, "after {done} indexed");
        }
    }

    /// A time range scopes both modes exactly, over indexed messages (full text filters on the
    /// `created_at` fast field) and over the unindexed tail (scanned) alike.
    #[test]
    fn a_time_range_scopes_indexed_and_unindexed_messages_alike() {
        let store = memory_store();
        let session = store.create_session("zoo", None).unwrap();
        let base = 1_790_000_000_000i64;
        let at = |i: i64| lcm_core::time::Timestamp(base + i * 60_000);
        let append = |from: i64, to: i64| {
            for i in from..to {
                let mut m = lcm_core::message::NewMessage::text(
                    lcm_core::message::Role::User,
                    format!("zebra number {i}"),
                );
                m.created_at = at(i);
                store.append(session, m).unwrap();
            }
        };
        let config = SearchConfig::default();
        let index = SearchIndex::open_in_ram(&store, &config).unwrap();
        append(0, 6);
        index.catch_up(&store, |_, _| {}).unwrap();
        append(6, 10);
        assert_eq!(index.watermark(), MessageId(6));
        for (mode, pattern) in [(GrepMode::FullText, "zebra"), (GrepMode::Regex, "zebra")] {
            let request = GrepRequest {
                pattern: pattern.into(),
                mode,
                scope: Scope {
                    since: Some(at(2)),
                    before: Some(at(8)),
                    ..Scope::default()
                },
                limit: Some(100),
                cursor: None,
            };
            let page = grep(&store, &index, &config, &request).unwrap();
            let mut ids: Vec<u64> = page.hits.iter().map(|h| h.message.0).collect();
            ids.sort_unstable();
            assert_eq!(ids, (2..8).collect::<Vec<u64>>(), "{mode:?}");
        }
    }

    /// Every message holds "common" (all are candidates), few match: after some candidates
    /// the rest of the indexed messages is scanned instead, and paging finds every hit once,
    /// in order, on both sides of that switch, in all sessions and in one.
    #[test]
    fn dense_candidates_give_way_to_a_scan_and_miss_nothing() {
        let store = memory_store();
        let (a, b) = (
            store.create_session("a", None).unwrap(),
            store.create_session("b", None).unwrap(),
        );
        // The first candidate batches hold 32, 64, 128 and 256 ids: after the fourth, 480
        // candidates were verified (one hit, 100) and the scan starts at message 480, a hit.
        let hits = [100u64, 480, 481, 1500, 2999];
        for i in 0..3000u64 {
            let text = if hits.contains(&i) {
                format!("common{i:04} x")
            } else {
                format!("common filler {i}")
            };
            let session = if i % 3 == 0 { b } else { a };
            store
                .append(
                    session,
                    lcm_core::message::NewMessage::text(Role::User, text),
                )
                .unwrap();
        }
        let config = SearchConfig::default();
        let index = SearchIndex::open_in_ram(&store, &config).unwrap();
        index.catch_up(&store, |_, _| {}).unwrap();
        for (session, expected) in [
            (None, hits.to_vec()),
            (
                Some(a),
                hits.iter().copied().filter(|i| i % 3 != 0).collect(),
            ),
        ] {
            let mut found = Vec::new();
            let mut cursor = None;
            loop {
                let request = GrepRequest {
                    pattern: r"common\d{4}".into(),
                    mode: GrepMode::Regex,
                    scope: Scope {
                        session,
                        ..Scope::default()
                    },
                    limit: Some(2),
                    cursor,
                };
                let page = grep(&store, &index, &config, &request).unwrap();
                assert_eq!(page.strategy, Strategy::TrigramIndex);
                found.extend(page.hits.iter().map(|h| h.message.0));
                cursor = page.next_cursor;
                if cursor.is_none() {
                    break;
                }
            }
            assert_eq!(found, expected, "session {session:?}");
        }
    }

    #[test]
    fn full_text_pages_after_the_ranked_ones_skip_nothing_indexed_meanwhile() {
        let (store, _) = store_with_zebras(5);
        let config = SearchConfig::default();
        let index = SearchIndex::open_in_ram(&store, &config).unwrap();
        // Nothing indexed: the first page comes from the scan, two hits and a cursor.
        let first = zebras(&store, &index, &config, None);
        let ids: Vec<MessageId> = first.hits.iter().map(|h| h.message).collect();
        assert_eq!(ids, vec![MessageId(0), MessageId(1)]);
        // Everything is indexed before the next page: it goes on after the last hit.
        index.catch_up(&store, |_, _| {}).unwrap();
        let mut rest = Vec::new();
        let mut cursor = first.next_cursor;
        while let Some(c) = cursor {
            let page = zebras(&store, &index, &config, Some(c));
            rest.extend(page.hits.iter().map(|h| h.message));
            cursor = page.next_cursor;
        }
        assert_eq!(rest, vec![MessageId(2), MessageId(3), MessageId(4)]);
    }

    /// A scan of more ids than one thread is given is split across threads (the calling one
    /// scanning the first part) and windows; its pages must still hold exactly the matching
    /// messages, in id order, across sessions, whatever the page size.
    #[test]
    fn a_scan_split_across_threads_pages_through_every_hit_in_id_order() {
        let store = memory_store();
        let sessions = [
            store.create_session("a", None).unwrap(),
            store.create_session("b", None).unwrap(),
        ];
        let n = 3 * MIN_IDS_PER_THREAD + 123;
        let batch = (0..n)
            .map(|i| {
                // Sparse enough that a page needs the windows after the first, which are split
                // across threads.
                let text = if i.is_multiple_of(97) || i == n - 1 {
                    format!("row {i} code Q_{i:05} end")
                } else {
                    format!("row {i} nothing here")
                };
                let m = lcm_core::message::NewMessage::text(lcm_core::message::Role::User, text);
                (sessions[(i % 3 == 0) as usize], m)
            })
            .collect();
        let appended = store.append_mixed(batch).unwrap();
        let expected: Vec<MessageId> = appended
            .iter()
            .enumerate()
            .filter(|(i, _)| (*i as u64).is_multiple_of(97) || *i as u64 == n - 1)
            .map(|(_, a)| a.id)
            .collect();
        let config = SearchConfig::default();
        // Nothing indexed: every page comes from the scan.
        let index = SearchIndex::open_in_ram(&store, &config).unwrap();
        for limit in [53, 200] {
            let (mut found, mut cursor) = (Vec::new(), None);
            loop {
                let request = GrepRequest {
                    pattern: r"[A-Z]_\d{5}".into(),
                    mode: GrepMode::Regex,
                    scope: Scope::default(),
                    limit: Some(limit),
                    cursor: cursor.take(),
                };
                let page = grep(&store, &index, &config, &request).unwrap();
                assert_eq!(page.strategy, Strategy::Scan);
                assert!(page.hits.len() <= limit);
                found.extend(page.hits.iter().map(|h| h.message));
                match page.next_cursor {
                    Some(next) => cursor = Some(next),
                    None => break,
                }
            }
            assert_eq!(found, expected, "pages of {limit}");
        }
        // Every message in scope is examined once, whether its pack row was judged as a whole
        // (a pattern that matches no joining byte, over everything) or message by message.
        let assistant = Scope {
            roles: vec![lcm_core::message::Role::Assistant],
            ..Scope::default()
        };
        let since = Scope {
            since: Some(lcm_core::time::Timestamp(0)),
            ..Scope::default()
        };
        let in_a = (0..n).filter(|i| i % 3 != 0).count() as u64;
        let only_a = Scope {
            session: Some(sessions[0]),
            ..Scope::default()
        };
        let a_assistant = Scope {
            session: Some(sessions[0]),
            roles: vec![lcm_core::message::Role::Assistant],
            ..Scope::default()
        };
        for (pattern, scope, examined) in [
            ("no such thing", only_a, in_a),
            ("no such thing", a_assistant, 0),
            ("no such thing", Scope::default(), n),
            (r"nothing\s+there", Scope::default(), n),
            ("Q_0", assistant, 0),
            ("no such thing", since, n),
        ] {
            let page = first_regex_page(&store, &index, pattern, scope);
            assert!(page.hits.is_empty(), "{pattern}");
            assert_eq!(page.messages_examined, examined, "{pattern}");
        }
    }

    #[test]
    fn text_matcher_matches_like_grep() {
        let mut m = TextMatcher::regex(r"INV-\d+").unwrap();
        let found = m.find("see INV-12 and INV-13", 200).unwrap();
        assert_eq!(found.matches, 2);
        assert_eq!(found.snippet, "see INV-12 and INV-13");
        assert!(m.find("nothing here", 200).is_none());
        assert!(TextMatcher::regex("(").is_err());
        assert!(TextMatcher::regex("").is_err());

        let store = memory_store();
        let index = SearchIndex::open_in_ram(&store, &SearchConfig::default()).unwrap();
        let mut words =
            TextMatcher::new(&index, GrepMode::FullText, "timeouts Paging zebra").unwrap();
        let found = words.find("The timeout of the page", 200).unwrap();
        assert_eq!(
            found.matches, 2,
            "stemmed: timeouts -> timeout, paging -> page"
        );
        assert!(words.find("nothing relevant", 200).is_none());
        assert!(TextMatcher::new(&index, GrepMode::FullText, "  ,, ").is_err());
    }

    #[test]
    fn cursors_round_trip_and_reject_foreign_use() {
        let c = Cursor::After(MessageId(77)).encode(5);
        assert_eq!(Cursor::decode(&c, 5).unwrap(), Cursor::After(MessageId(77)));
        assert!(matches!(
            Cursor::decode(&c, 6),
            Err(StoreError::InvalidCursor(_))
        ));
        assert!(matches!(
            Cursor::decode("zzz", 5),
            Err(StoreError::InvalidCursor(_))
        ));
        let r = Cursor::Ranked(40).encode(9);
        assert_eq!(Cursor::decode(&r, 9).unwrap(), Cursor::Ranked(40));
    }

    #[test]
    fn a_cursor_starting_with_a_wide_character_is_refused() {
        // Found by fuzzing (cursors): the kind was sliced off as one byte, which panicked
        // inside a character of two or more bytes.
        for kind in ["é", "漢", "🎉"] {
            let text = format!("{kind}a1.{:016x}", 5);
            match Cursor::decode(&text, 5) {
                Err(StoreError::InvalidCursor(message)) => {
                    assert!(message.contains("is not a cursor lcm issued"), "{message}");
                }
                other => panic!("{text}: {other:?}"),
            }
        }
    }
}
