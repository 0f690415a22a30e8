//! Search by meaning: `semantic` (the nearest embeddings) and `hybrid` (BM25 and the
//! embeddings, fused), with the scope applied before ranking and pages by offset.
//!
//! **Fusion.** Each side ranks a pool of its best [`POOL`] messages (more when a later page
//! needs them); each side's scores are rescaled over its pool to standard deviations above the
//! pool's lowest, and a message scores the mean of its two rescaled scores (0 on a side that
//! did not find it). A message the embeddings cannot have found, not being embedded yet (the
//! vector index catches up in the background), is given for its meaning the embeddings'
//! score at its rank by words: its meaning is unknown, not far. Likewise the words' side
//! scans the messages past the words index's watermark for the query's words, as full-text
//! grep does, and gives each the ranked score at its rank ([`words_tail`]). Measured on the LoCoMo development set, this finds more evidence in the
//! first ten hits than reciprocal rank fusion (k = 60), which ranks a message found by one
//! side alone far down however strongly that side found it, and a little more than rescaling
//! to 0..1 by the pool's range (docs/PERFORMANCE.md, "Hybrid recall").
//!
//! **Neighbours.** A hybrid ranking of messages then lifts each candidate by
//! [`NEIGHBOUR_WEIGHT`] times the fused score of its better neighbour among the candidates:
//! the message just before or just after it in its session. What is remembered is often split
//! over two turns (a question and its answer, a remark and the reply naming it), and the turn
//! that holds the answer is the one the words or the meaning found less well. Only
//! candidates lift each other, so the scope (which chose them) still decides what can be a
//! hit.
//!
//! **Reranking.** With a cross-encoder configured (`[embeddings] reranker_dir`), the first
//! `rerank_depth` messages of that ranking are read with the query by the reranker, and each
//! is placed by reciprocal rank fusion of its two ranks, 1 / ([`RERANK_K`] + rank) summed
//! over the hybrid ranking and the reranker's ([`reranked`]). The cross-encoder tells the turn
//! that answers from one that only shares the question's words or topic, and the hybrid rank
//! keeps what it cannot see (the neighbours' lift; a speaker named in the question but not in
//! the turn). Messages past the depth keep their order after them. A long message is read
//! where it was found ([`passages`]): at the chunk the embeddings matched and at the first
//! query word, its best score counting; from its start only when neither says where.

use std::collections::{HashMap, HashSet};
use std::ops::ControlFlow;

use lcm_core::config::SearchConfig;
use lcm_core::ids::{MessageId, SessionId};
use lcm_store::error::{Result, StoreError};
use lcm_store::records::{RecordReader, RecordSource, RecordView};

use crate::grep::{
    Cursor, GrepHit, GrepMode, GrepPage, GrepRequest, Strategy, no_embeddings_error, snippet,
};
use crate::index::SearchIndex;

/// Messages each side of a hybrid search ranks (at least).
pub const POOL: usize = 100;

/// The share of its better neighbour's fused score a message gains in a hybrid ranking (see
/// the module doc). Measured on the LoCoMo development set, any weight from 0.4 to 0.8 finds
/// about the same; 1 lets a neighbour tie the message that was found.
pub const NEIGHBOUR_WEIGHT: f32 = 0.5;

/// The constant of the reciprocal rank fusion that places reranked messages (see the module
/// doc): small, so the first places of either ranking weigh most (the reranker's best is
/// usually right; its order far down is noise).
pub const RERANK_K: f32 = 10.0;

/// Bytes of a message's text the reranker reads at most: its 512 word pieces hold about this
/// much English (the tokenizer cuts the rest), so a longer message is read by a window.
pub const PASSAGE_BYTES: usize = 2_048;

/// One fused candidate: a message (or, for summaries, a summary) and its fused score.
#[derive(Debug, Clone, PartialEq)]
pub struct Fused<K> {
    pub id: K,
    pub score: f32,
    /// Whether the words found it.
    pub by_words: bool,
    /// The best chunk, when the embeddings found it.
    pub chunk: Option<(u32, u32)>,
}

/// A message found by meaning: its id, cosine similarity and best chunk.
type Meaning = (MessageId, f32, (u32, u32));

/// Scores of one ranked list rescaled to standard deviations above its lowest: `(s - lo) / sd`
/// over the list (all 1 when every score is equal). The spread of the whole list sets the
/// scale, where a range (min-max) would let one outlying top score squeeze every other.
fn rescaled(scores: impl Iterator<Item = f32> + Clone) -> impl Fn(f32) -> f32 {
    let (n, sum, lo) = scores
        .clone()
        .fold((0usize, 0f64, f32::INFINITY), |(n, sum, lo), s| {
            (n + 1, sum + f64::from(s), lo.min(s))
        });
    let mean = sum / n.max(1) as f64;
    let variance = scores.map(|s| (f64::from(s) - mean).powi(2)).sum::<f64>() / n.max(1) as f64;
    let sd = variance.sqrt() as f32;
    move |s| {
        if sd > 0.0 { (s - lo) / sd } else { 1.0 }
    }
}

/// Fuses the words' ranking and the embeddings' (see the module doc); best first, ties by id.
/// `words` are ids with their words' score (BM25, or matches), `meaning` ids with their cosine
/// similarity and best chunk; `embedded` says whether the embeddings could have found an id.
/// One they could not (not embedded yet) is given, for its meaning, the embeddings' score at
/// its rank by words: its meaning is unknown, not far, and the two sides' scales differ (a
/// pool of two equal words hits rescales to 1 each, the embeddings' best to several).
pub fn fuse<K: Copy + Eq + Ord + std::hash::Hash>(
    words: &[(K, f32)],
    meaning: &[(K, f32, (u32, u32))],
    embedded: impl Fn(K) -> bool,
) -> Vec<Fused<K>> {
    let by_words = rescaled(words.iter().map(|w| w.1));
    let by_meaning = rescaled(meaning.iter().map(|m| m.1));
    let mut meaning_by_rank: Vec<f32> = meaning.iter().map(|m| by_meaning(m.1)).collect();
    meaning_by_rank.sort_by(|a, b| b.total_cmp(a));
    let mut words_ranked: Vec<(K, f32)> = words.to_vec();
    words_ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut fused: HashMap<K, Fused<K>> = HashMap::new();
    for (rank, &(message, score)) in words_ranked.iter().enumerate() {
        let unseen_meaning = if embedded(message) {
            0.0
        } else {
            meaning_by_rank.get(rank).copied().unwrap_or(0.0)
        };
        fused.insert(
            message,
            Fused {
                id: message,
                score: (by_words(score) + unseen_meaning) / 2.0,
                by_words: true,
                chunk: None,
            },
        );
    }
    for &(message, score, chunk) in meaning {
        let entry = fused.entry(message).or_insert(Fused {
            id: message,
            score: 0.0,
            by_words: false,
            chunk: None,
        });
        entry.score += by_meaning(score) / 2.0;
        entry.chunk = Some(chunk);
    }
    let mut out: Vec<Fused<K>> = fused.into_values().collect();
    best_first(&mut out);
    out
}

/// Sorts by score, best first, ties by id.
fn best_first<K: Ord>(fused: &mut [Fused<K>]) {
    fused.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.id.cmp(&b.id)));
}

/// Lifts each fused message by [`NEIGHBOUR_WEIGHT`] times the score of its better neighbour
/// among `fused` (the messages one before and one after it in its session), from the scores
/// as fused, and sorts again. A message the reader does not have is left as it is.
pub fn lifted_by_neighbours<R: RecordReader>(
    reader: &R,
    fused: &mut [Fused<MessageId>],
) -> Result<()> {
    let mut ids: Vec<MessageId> = fused.iter().map(|f| f.id).collect();
    ids.sort_unstable();
    let mut place: HashMap<MessageId, (SessionId, u64)> = HashMap::with_capacity(ids.len());
    reader.records_of(ids, |id, record| {
        let view = RecordView::read(record)?;
        place.insert(id, (view.session(), view.seq()));
        Ok(ControlFlow::Continue(()))
    })?;
    let score_at: HashMap<(SessionId, u64), f32> = fused
        .iter()
        .filter_map(|f| Some((*place.get(&f.id)?, f.score)))
        .collect();
    for f in fused.iter_mut() {
        let Some(&(session, seq)) = place.get(&f.id) else {
            continue;
        };
        let at = |seq: Option<u64>| {
            seq.and_then(|seq| score_at.get(&(session, seq)).copied())
                .unwrap_or(0.0)
        };
        f.score += NEIGHBOUR_WEIGHT * at(seq.checked_sub(1)).max(at(seq.checked_add(1)));
    }
    best_first(fused);
    Ok(())
}

/// A page of a semantic or hybrid search (see [`crate::grep::grep`]).
pub(crate) fn ranked_by_meaning<S: RecordSource>(
    store: &S,
    index: &SearchIndex,
    config: &SearchConfig,
    request: &GrepRequest,
    limit: usize,
    cursor: Option<Cursor>,
    fingerprint: u64,
) -> Result<GrepPage> {
    let semantic = index
        .semantic()
        .ok_or_else(|| no_embeddings_error(request.mode))?;
    let offset = match cursor {
        None => 0,
        Some(Cursor::Ranked(offset)) => offset,
        Some(Cursor::After(_)) => {
            return Err(StoreError::InvalidCursor(
                "this cursor belongs to a different search".into(),
            ));
        }
    };
    let wanted = offset + limit + 1;
    semantic.refuse_if_stale_for(store)?;
    // Read before the search: a message embedded (or stored) meanwhile is one the search may
    // have missed.
    let embedded_below = semantic.watermark()?;
    let end = store.next_message_id()?;
    let terms = query_terms(index, &request.pattern)?;
    let scope = &request.scope;
    let hybrid = request.mode == GrepMode::Hybrid;
    let by_meaning = || -> Result<Vec<Meaning>> {
        let k = if hybrid { wanted.max(POOL) } else { wanted };
        Ok(semantic
            .search(&request.pattern, k, scope, None)?
            .into_iter()
            .map(|h| (MessageId(h.message), h.score, h.chunk))
            .collect())
    };
    let (mut ranked, strategy) = if hybrid {
        // The words' side runs beside the model embedding the query (the longest step).
        let (meaning, words) = std::thread::scope(|s| {
            let words = s.spawn(|| index.full_text(&request.pattern, scope, 0, wanted.max(POOL)));
            let meaning = by_meaning();
            let words = words
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (meaning, words)
        });
        let words = words?;
        let mut by_words = words.hits;
        let tail = words_tail(store, index, &terms, scope, words.indexed..end, &by_words)?;
        by_words.extend(tail);
        (
            fuse(&by_words, &meaning?, |m: MessageId| m < embedded_below),
            Strategy::Hybrid,
        )
    } else {
        let alone = by_meaning()?
            .into_iter()
            .map(|(message, score, chunk)| Fused {
                id: message,
                score,
                by_words: false,
                chunk: Some(chunk),
            })
            .collect();
        (alone, Strategy::Semantic)
    };
    let reader = store.reader()?;
    let mut strategy = strategy;
    if hybrid {
        lifted_by_neighbours(&reader, &mut ranked)?;
        if let Some(depth) = semantic.rerank_depth() {
            let depth = depth.min(ranked.len());
            // Each hit's passages, and whose they are: a long hit may be read at two places.
            let mut texts = Vec::with_capacity(depth);
            let mut owner = Vec::with_capacity(depth);
            for (i, f) in ranked[..depth].iter().enumerate() {
                let text = reader
                    .try_message(f.id)?
                    .map(|m| m.search_text().into_owned())
                    .unwrap_or_default();
                let at_word = if text.len() > PASSAGE_BYTES {
                    word_match(index, &terms, &text)?.map(|(start, _)| start)
                } else {
                    None
                };
                for part in passages(&text, f.chunk, at_word) {
                    texts.push(part.to_owned());
                    owner.push(i);
                }
            }
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            let mut scores = vec![f32::NEG_INFINITY; depth];
            for (&i, score) in owner.iter().zip(semantic.rerank(&request.pattern, &refs)?) {
                scores[i] = scores[i].max(score);
            }
            reranked(&mut ranked, &scores);
            strategy = Strategy::HybridReranked;
        }
    }
    let more = ranked.len() > offset + limit;
    let mut hits = Vec::with_capacity(limit);
    for f in ranked.iter().skip(offset).take(limit) {
        let Some(m) = reader.try_message(f.id)? else {
            continue;
        };
        let text = m.search_text();
        // The snippet stands around the first query word, else at the start of the chunk the
        // embeddings matched.
        let chunk_start = f
            .chunk
            .map_or((0, 0), |(start, _)| (start as usize, start as usize));
        let (start, end) = if f.by_words {
            word_match(index, &terms, &text)?.unwrap_or(chunk_start)
        } else {
            chunk_start
        };
        let start = text.floor_char_boundary(start);
        let end = text.floor_char_boundary(end.max(start));
        let mut found_by = Vec::with_capacity(2);
        if f.by_words {
            found_by.push(GrepMode::FullText);
        }
        if f.chunk.is_some() {
            found_by.push(GrepMode::Semantic);
        }
        hits.push(GrepHit {
            message: m.id,
            session: m.session,
            seq: m.seq,
            role: m.role,
            created_at: m.created_at,
            snippet: snippet(&text, start, end, config.snippet_chars),
            matches: usize::from(f.by_words),
            score: Some(f.score),
            found_by,
        });
    }
    Ok(GrepPage {
        messages_examined: hits.len() as u64,
        hits,
        next_cursor: more.then(|| Cursor::Ranked(offset + limit).encode(fingerprint)),
        strategy,
        not_embedded: Some(end.0.saturating_sub(embedded_below.0)),
    })
}

/// Places the first `scores.len()` of `ranked` (a hybrid ranking, best first) by reciprocal
/// rank fusion of their rank there and their rank by `scores` (the reranker's, higher is
/// better), each given the fused value as its score; the rest keep their order after them (see
/// the module doc). Ties keep the hybrid order.
pub fn reranked<K: Clone>(ranked: &mut [Fused<K>], scores: &[f32]) {
    let depth = scores.len().min(ranked.len());
    let mut by_reranker: Vec<usize> = (0..depth).collect();
    by_reranker.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    let mut fused = vec![0f32; depth];
    for (rank, &i) in by_reranker.iter().enumerate() {
        fused[i] = 1.0 / (RERANK_K + 1.0 + rank as f32) + 1.0 / (RERANK_K + 1.0 + i as f32);
    }
    let mut order: Vec<usize> = (0..depth).collect();
    // Stable: a tie keeps the hybrid order.
    order.sort_by(|&a, &b| fused[b].total_cmp(&fused[a]));
    let top: Vec<Fused<K>> = order
        .iter()
        .map(|&i| Fused {
            score: fused[i],
            ..ranked[i].clone()
        })
        .collect();
    for (slot, f) in ranked.iter_mut().zip(top) {
        *slot = f;
    }
}

/// The parts of a hit's `text` the reranker reads (its score is the best of theirs): the text
/// itself when it holds at most [`PASSAGE_BYTES`] (or nothing says where to look: its first
/// 512 pieces are read); else the `chunk` the embeddings matched (byte offsets, as the vector
/// index keeps them; at most the embedder's `max_tokens` pieces) and the window of
/// [`PASSAGE_BYTES`] from an eighth of that before the first query word, at byte `at_word`.
/// Both, as either may be the wrong place: a chunk that only resembles the question, a word
/// that also appears far from the answer. Without them a long message would be judged by its
/// first page, however far in the part that was found lies.
fn passages(text: &str, chunk: Option<(u32, u32)>, at_word: Option<usize>) -> Vec<&str> {
    if text.len() <= PASSAGE_BYTES {
        return vec![text];
    }
    let window = |start: usize, end: usize| {
        let start = text.floor_char_boundary(start);
        &text[start..text.floor_char_boundary(end).max(start)]
    };
    let mut out = Vec::with_capacity(2);
    if let Some((start, end)) = chunk {
        let part = window(start as usize, end as usize);
        if !part.trim().is_empty() {
            out.push(part);
        }
    }
    if let Some(at) = at_word {
        let start = text.floor_char_boundary(at.saturating_sub(PASSAGE_BYTES / 8));
        let part = window(start, start + PASSAGE_BYTES);
        if !out.contains(&part) {
            out.push(part);
        }
    }
    if out.is_empty() {
        out.push(text);
    }
    out
}

/// The words' side of the messages `tail` the words index has not reached (from its
/// watermark to the store's end: normally the few appended in the last milliseconds; more in a
/// process that reads a data directory whose index fell behind). Up to [`POOL`] of them in
/// `scope` that hold one of the query's `terms`, each given the raw score `ranked` (the
/// index's ranking, best first) has at its rank by the number of query words it holds: its
/// BM25 is unknown, not low (as a message not embedded yet is given for its meaning, see
/// [`fuse`]).
fn words_tail<S: RecordSource>(
    store: &S,
    index: &SearchIndex,
    terms: &HashSet<String>,
    scope: &crate::grep::Scope,
    tail: std::ops::Range<MessageId>,
    ranked: &[(MessageId, f32)],
) -> Result<Vec<(MessageId, f32)>> {
    if tail.is_empty() || terms.is_empty() {
        return Ok(Vec::new());
    }
    let mut analyzer = index.words_analyzer()?;
    let mut found: Vec<(MessageId, usize)> = Vec::new();
    store.reader()?.range_records(tail, |id, record| {
        let view = RecordView::read(record)?;
        if !scope.admits_record(&view) {
            return Ok(ControlFlow::Continue(()));
        }
        let mut stream = analyzer.token_stream(view.text()?);
        let mut matches = 0;
        while let Some(token) = stream.next() {
            matches += usize::from(terms.contains(&token.text));
        }
        if matches > 0 {
            found.push((id, matches));
        }
        Ok(if found.len() >= POOL {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        })
    })?;
    found.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let at_rank = |rank: usize| {
        ranked
            .get(rank)
            .or(ranked.last())
            .map_or(1.0, |&(_, score)| score)
    };
    Ok(found
        .into_iter()
        .enumerate()
        .map(|(rank, (id, _))| (id, at_rank(rank)))
        .collect())
}

/// The query's words, as the words index cuts them.
fn query_terms(index: &SearchIndex, query: &str) -> Result<HashSet<String>> {
    let mut analyzer = index.words_analyzer()?;
    let mut stream = analyzer.token_stream(query);
    let mut terms = HashSet::new();
    while let Some(token) = stream.next() {
        terms.insert(token.text.clone());
    }
    Ok(terms)
}

/// Where the first of `terms` stands in `text`.
fn word_match(
    index: &SearchIndex,
    terms: &HashSet<String>,
    text: &str,
) -> Result<Option<(usize, usize)>> {
    let mut analyzer = index.words_analyzer()?;
    let mut stream = analyzer.token_stream(text);
    while let Some(token) = stream.next() {
        if terms.contains(&token.text) {
            return Ok(Some((token.offset_from, token.offset_to)));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hybrid_hit(id: u64) -> Fused<u64> {
        Fused {
            id,
            score: 1.0 / id as f32,
            by_words: true,
            chunk: None,
        }
    }

    /// A long hit is read where it was found: the matched chunk and a window at the first
    /// query word; a short one, or one with nothing to say where, whole.
    #[test]
    fn the_reranker_reads_a_long_message_where_it_was_found() {
        let long = format!(
            "{} the answer is here {}",
            "é".repeat(3_000),
            "x".repeat(3_000)
        );
        let word = long.find("answer").unwrap();
        // The chunk the embeddings matched (offsets inside a two-byte character are floored),
        // and a window of PASSAGE_BYTES from an eighth of that before the word.
        let chunk = (word as u32 - 6, word as u32 + 14);
        let both = passages(&long, Some(chunk), Some(word));
        assert_eq!(both.len(), 2, "{both:?}");
        assert_eq!(both[0], "é the answer is here");
        let window = both[1];
        assert!(window.len() <= PASSAGE_BYTES && window.len() > PASSAGE_BYTES - 4);
        assert!(window.starts_with('é') && window.ends_with('x'));
        let before = window.find("answer").unwrap();
        assert!(
            (PASSAGE_BYTES / 8..PASSAGE_BYTES / 8 + 4).contains(&before),
            "{before}"
        );
        // Either alone; a blank chunk does not count.
        assert_eq!(passages(&long, Some(chunk), None), ["é the answer is here"]);
        assert_eq!(passages(&long, None, Some(word)), [window]);
        assert_eq!(passages(&long, Some((6001, 6001)), Some(word)), [window]);
        // A word near the start: the window starts with the text.
        assert_eq!(passages(&long, None, Some(3)), [&long[..PASSAGE_BYTES]]);
        // Nothing says where: the text as it is (the tokenizer reads its start).
        assert_eq!(passages(&long, None, None), [long.as_str()]);
        // A short text is read whole, whatever matched in it.
        assert_eq!(
            passages("short text", Some((6, 10)), Some(6)),
            ["short text"]
        );
    }

    /// The reranker's strong first choice rises above hybrid's first, a message both rank
    /// well stays near the top, the reranker cannot sink hybrid's first far, and messages past
    /// the depth keep their places after the reranked ones.
    #[test]
    fn reranking_fuses_the_two_ranks_and_leaves_the_rest_in_place() {
        let mut ranked: Vec<Fused<u64>> = (1..=8).map(hybrid_hit).collect();
        // The reranker reads the first six: it likes 5 best, then 2, and 1 least.
        let scores = [-9.0, 4.0, 0.5, 0.0, 7.0, -1.0];
        reranked(&mut ranked, &scores);
        let ids: Vec<u64> = ranked.iter().map(|f| f.id).collect();
        // 5: 1/11 + 1/15 = 0.158; 2: 1/12 + 1/12 = 0.167; 1: 1/11 + 1/16 = 0.153;
        // 3: 1/13 + 1/13 = 0.154; 4: 1/14 + 1/14 = 0.143; 6: 1/16 + 1/15 = 0.129.
        assert_eq!(ids, vec![2, 5, 3, 1, 4, 6, 7, 8]);
        let expected = 2.0 / (RERANK_K + 2.0);
        assert!((ranked[0].score - expected).abs() < 1e-6);
        assert!(ranked.windows(2).take(5).all(|w| w[0].score >= w[1].score));
        // Untouched past the depth, scores too.
        assert_eq!(ranked[6], hybrid_hit(7));
        // No scores: nothing moves.
        let mut same: Vec<Fused<u64>> = (1..=3).map(hybrid_hit).collect();
        reranked(&mut same, &[]);
        assert_eq!(same, (1..=3).map(hybrid_hit).collect::<Vec<_>>());
    }

    #[test]
    fn fusion_ranks_by_the_mean_of_rescaled_scores() {
        let words = [
            (MessageId(1), 9.0),
            (MessageId(2), 5.0),
            (MessageId(3), 1.0),
        ];
        let meaning = [
            (MessageId(3), 0.8, (0, 5)),
            (MessageId(4), 0.7, (5, 9)),
            (MessageId(1), 0.5, (0, 3)),
        ];
        let fused = fuse(&words, &meaning, |_| true);
        let order: Vec<u64> = fused.iter().map(|f| f.id.0).collect();
        // Words: mean 5, sd sqrt(32/3); meaning: mean 2/3, sd sqrt(0.14/9). 1: (8 / sd_w + 0)
        // / 2 = 1.2247; 3: (0 + 0.3 / sd_m) / 2 = 1.2027; 4: 0.2 / sd_m / 2 = 0.8018;
        // 2: 4 / sd_w / 2 = 0.6124.
        assert_eq!(order, [1, 3, 4, 2]);
        let (sd_w, sd_m) = ((32.0f32 / 3.0).sqrt(), (0.14f32 / 9.0).sqrt());
        let expected = [
            8.0 / sd_w / 2.0,
            0.3 / sd_m / 2.0,
            0.2 / sd_m / 2.0,
            4.0 / sd_w / 2.0,
        ];
        for (f, want) in fused.iter().zip(expected) {
            assert!(
                (f.score - want).abs() < 1e-4,
                "{}: {} != {want}",
                f.id.0,
                f.score
            );
        }
        assert!(fused[0].by_words && fused[0].chunk == Some((0, 3)));
        assert!(!fused[2].by_words && fused[2].chunk == Some((5, 9)));
        assert_eq!(fused[3].chunk, None);
        assert!(fuse::<MessageId>(&[], &[], |_| true).is_empty());

        // Message 2 not embedded yet (the embeddings could not have found it): second by
        // words, it is given the embeddings' second score (0.2 / sd_m, rescaled: 1.604) for
        // its meaning: (1.2247 + 1.604) / 2 = 1.414, first.
        let fused = fuse(&words, &meaning, |m| m != MessageId(2));
        let order: Vec<u64> = fused.iter().map(|f| f.id.0).collect();
        assert_eq!(order, [2, 1, 3, 4]);
        assert!(
            (fused[0].score - (4.0 / sd_w + 0.2 / sd_m) / 2.0).abs() < 1e-4,
            "{}",
            fused[0].score
        );
    }

    #[test]
    fn scores_are_rescaled_to_standard_deviations_above_the_lowest() {
        // Mean 3.25, standard deviation sqrt(15.6875): one outlying top score does not squeeze
        // the others to the bottom as a range would (2 is 0.2 of the range).
        let scores = [10.0f32, 2.0, 1.0, 0.0];
        let sd = 15.6875f32.sqrt();
        let scale = rescaled(scores.iter().copied());
        for s in scores {
            assert!((scale(s) - s / sd).abs() < 1e-6, "{s}: {}", scale(s));
        }
        assert!(scale(2.0) > 0.5);
        // Equal scores (or a single one) are all 1.
        assert_eq!(rescaled([3.0f32, 3.0].into_iter())(3.0), 1.0);
        assert_eq!(rescaled([0.4f32].into_iter())(0.4), 1.0);
    }

    fn candidate(id: MessageId, score: f32) -> Fused<MessageId> {
        Fused {
            id,
            score,
            by_words: true,
            chunk: None,
        }
    }

    /// Two sessions appended turn by turn, so a message's id is next to the other session's:
    /// only the turns before and after it in its own session lift it.
    #[test]
    fn a_message_is_lifted_by_its_neighbours_in_its_session_only() {
        use lcm_core::message::{NewMessage, Role};
        let store = lcm_store::Store::open_in_memory(lcm_store::store::StoreOptions::new(
            lcm_core::tokens::TokenCounter::new(lcm_core::tokens::Encoding::O200kBase),
        ))
        .unwrap();
        let (a, b) = (
            store.create_session("a", None).unwrap(),
            store.create_session("b", None).unwrap(),
        );
        let (mut in_a, mut in_b) = (Vec::new(), Vec::new());
        for turn in 0..5 {
            for (session, ids) in [(a, &mut in_a), (b, &mut in_b)] {
                let text = format!("turn {turn}");
                ids.push(
                    store
                        .append(session, NewMessage::text(Role::User, text))
                        .unwrap()
                        .id,
                );
            }
        }
        // in_a[2] is found well; in_a[3] (its next turn), in_a[0] (two turns away) and in_b[1]
        // (the id just before in_a[2], in the other session) equally weakly.
        assert_eq!(in_b[1].0 + 1, in_a[2].0);
        let gone = MessageId(in_b[4].0 + 100);
        let mut fused = vec![
            candidate(in_a[0], 0.2),
            candidate(in_b[1], 0.2),
            candidate(in_a[2], 1.0),
            candidate(in_a[3], 0.2),
            candidate(gone, 0.3),
        ];
        lifted_by_neighbours(&store.reader().unwrap(), &mut fused).unwrap();
        let order: Vec<MessageId> = fused.iter().map(|f| f.id).collect();
        assert_eq!(order, [in_a[2], in_a[3], gone, in_a[0], in_b[1]]);
        let score = |id| fused.iter().find(|f| f.id == id).unwrap().score;
        // Each from the scores as fused: in_a[2] gains half of in_a[3]'s 0.2, not of its
        // lifted 0.7.
        assert!((score(in_a[2]) - 1.1).abs() < 1e-6);
        assert!((score(in_a[3]) - 0.7).abs() < 1e-6);
        assert!((score(in_a[0]) - 0.2).abs() < 1e-6);
        assert!((score(in_b[1]) - 0.2).abs() < 1e-6);
        assert!(
            (score(gone) - 0.3).abs() < 1e-6,
            "a message not stored is left as it is"
        );
    }
}
