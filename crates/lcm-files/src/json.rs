//! JSON: the top-level type, the key structure with value types, array lengths, numeric ranges,
//! a few short sample values; the elements of an array are merged into one schema (which keys,
//! of which types, in how many elements).
//!
//! The schema is built while serde_json parses (a `DeserializeSeed` per value), so no
//! `serde_json::Value` tree is ever materialised: memory is bounded by the schema (at most
//! [`MAX_NODES`] nodes, [`MAX_KEYS`] keys per object, [`MAX_DEPTH`] levels), not by the input.
//! serde_json's recursion limit (128 levels) keeps deeply nested input off the stack; what was
//! seen before a parse error (or the end of a prefix) is still reported. [`Schema`] is shared
//! with the JSON Lines explorer.

use std::collections::HashMap;
use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::summary::{DETAIL, KEY, MINOR, SAMPLE, Summary};
use crate::util::{bytes as size, count, countu, plural, prefix, truncate};

/// Most schema nodes (distinct key paths) tracked per payload.
pub(crate) const MAX_NODES: usize = 4_000;
/// Most keys tracked per object node.
pub(crate) const MAX_KEYS: usize = 200;
/// Deepest level whose keys are tracked (deeper values count by type only).
pub(crate) const MAX_DEPTH: usize = 12;
/// Inputs above this are explored from a prefix of this size.
pub(crate) const MAX_INPUT: usize = 64 * 1024 * 1024;
/// Schema lines rendered at most.
const MAX_LINES: usize = 600;
/// Distinct short string values counted per node before giving up.
const MAX_DISTINCT: usize = 12;

/// A number as parsed, compared as f64 but shown exactly.
#[derive(Debug, Clone, Copy)]
enum Num {
    I(i64),
    U(u64),
    F(f64),
}

impl Num {
    fn as_f64(self) -> f64 {
        match self {
            Num::I(v) => v as f64,
            Num::U(v) => v as f64,
            Num::F(v) => v,
        }
    }
}

impl fmt::Display for Num {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Num::I(v) => write!(f, "{v}"),
            Num::U(v) => write!(f, "{v}"),
            Num::F(v) => write!(f, "{v}"),
        }
    }
}

/// What was seen at one key path.
#[derive(Debug, Default)]
pub(crate) struct Node {
    pub(crate) seen: u64,
    nulls: u64,
    bools: u64,
    ints: u64,
    floats: u64,
    strings: u64,
    pub(crate) objects: u64,
    pub(crate) arrays: u64,
    keys: Vec<(String, Node)>,
    index: HashMap<String, usize>,
    /// Key occurrences not tracked (caps reached).
    untracked: u64,
    items: Option<Box<Node>>,
    min_len: u64,
    max_len: u64,
    total_items: u64,
    min: Option<Num>,
    max: Option<Num>,
    samples: Vec<String>,
    /// Short string values with their counts, until more than [`MAX_DISTINCT`] are seen.
    distinct: Option<Vec<(String, u64)>>,
    distinct_overflow: bool,
}

impl Node {
    fn number(&mut self, n: Num) {
        self.seen += 1;
        match n {
            Num::F(_) => self.floats += 1,
            _ => self.ints += 1,
        }
        let v = n.as_f64();
        if self.min.is_none_or(|m| v < m.as_f64()) {
            self.min = Some(n);
        }
        if self.max.is_none_or(|m| v > m.as_f64()) {
            self.max = Some(n);
        }
        if self.samples.len() < 3 {
            let s = n.to_string();
            if !self.samples.contains(&s) {
                self.samples.push(s);
            }
        }
    }

    fn string(&mut self, v: &str) {
        self.seen += 1;
        self.strings += 1;
        if self.samples.len() < 3 {
            let s = serde_json::to_string(&truncate(v, 40)).unwrap_or_default();
            if !self.samples.contains(&s) {
                self.samples.push(s);
            }
        }
        if self.distinct_overflow {
            return;
        }
        if v.chars().count() > 40 {
            self.distinct_overflow = true;
            self.distinct = None;
            return;
        }
        let d = self.distinct.get_or_insert_with(Vec::new);
        if let Some(e) = d.iter_mut().find(|e| e.0 == v) {
            e.1 += 1;
        } else if d.len() < MAX_DISTINCT {
            d.push((v.to_string(), 1));
        } else {
            self.distinct_overflow = true;
            self.distinct = None;
        }
    }

    fn boolean(&mut self, v: bool) {
        self.seen += 1;
        self.bools += 1;
        if self.samples.len() < 2 {
            let s = v.to_string();
            if !self.samples.contains(&s) {
                self.samples.push(s);
            }
        }
    }

    /// The types seen, most frequent first: "string", "integer|null".
    fn types(&self) -> Vec<(&'static str, u64)> {
        let mut t: Vec<(&'static str, u64)> = [
            ("object", self.objects),
            ("array", self.arrays),
            ("string", self.strings),
            ("integer", self.ints),
            ("float", self.floats),
            ("boolean", self.bools),
            ("null", self.nulls),
        ]
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .collect();
        t.sort_by_key(|x| std::cmp::Reverse(x.1));
        t
    }
}

/// A schema under construction plus its node budget.
#[derive(Debug)]
pub(crate) struct Schema {
    pub(crate) root: Node,
    nodes: usize,
    pub(crate) max_depth: usize,
}

impl Schema {
    pub(crate) fn new() -> Self {
        Schema {
            root: Node::default(),
            nodes: 1,
            max_depth: 0,
        }
    }

    /// Parses one JSON value from `de` into the schema.
    pub(crate) fn feed<'de, D: de::Deserializer<'de>>(&mut self, de: D) -> Result<(), D::Error> {
        let mut ctx = Ctx {
            nodes: self.nodes,
            max_depth: self.max_depth,
        };
        let r = ValueSeed {
            node: &mut self.root,
            ctx: &mut ctx,
            depth: 0,
        }
        .deserialize(de);
        self.nodes = ctx.nodes;
        self.max_depth = ctx.max_depth;
        r
    }
}

struct Ctx {
    nodes: usize,
    max_depth: usize,
}

struct ValueSeed<'a> {
    node: &'a mut Node,
    ctx: &'a mut Ctx,
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for ValueSeed<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ValueSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<(), E> {
        self.node.boolean(v);
        Ok(())
    }
    fn visit_i64<E>(self, v: i64) -> Result<(), E> {
        self.node.number(Num::I(v));
        Ok(())
    }
    fn visit_u64<E>(self, v: u64) -> Result<(), E> {
        self.node.number(Num::U(v));
        Ok(())
    }
    fn visit_f64<E>(self, v: f64) -> Result<(), E> {
        self.node.number(Num::F(v));
        Ok(())
    }
    fn visit_str<E>(self, v: &str) -> Result<(), E> {
        self.node.string(v);
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        self.node.seen += 1;
        self.node.nulls += 1;
        Ok(())
    }
    fn visit_none<E>(self) -> Result<(), E> {
        self.node.seen += 1;
        self.node.nulls += 1;
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let node = self.node;
        node.seen += 1;
        node.arrays += 1;
        let depth = self.depth + 1;
        self.ctx.max_depth = self.ctx.max_depth.max(depth);
        let track = depth <= MAX_DEPTH && (node.items.is_some() || self.ctx.nodes < MAX_NODES);
        if track && node.items.is_none() {
            node.items = Some(Box::default());
            self.ctx.nodes += 1;
        }
        let mut len = 0u64;
        let mut result = Ok(());
        match node.items.as_deref_mut() {
            Some(items) if track => loop {
                let seed = ValueSeed {
                    node: &mut *items,
                    ctx: &mut *self.ctx,
                    depth,
                };
                match seq.next_element_seed(seed) {
                    Ok(Some(())) => len += 1,
                    Ok(None) => break,
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                }
            },
            _ => loop {
                match seq.next_element::<IgnoredAny>() {
                    Ok(Some(_)) => len += 1,
                    Ok(None) => break,
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                }
            },
        }
        if node.arrays == 1 || len < node.min_len {
            node.min_len = len;
        }
        node.max_len = node.max_len.max(len);
        node.total_items += len;
        result
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let node = self.node;
        node.seen += 1;
        node.objects += 1;
        let depth = self.depth + 1;
        self.ctx.max_depth = self.ctx.max_depth.max(depth);
        let track = depth <= MAX_DEPTH;
        loop {
            let key = map.next_key_seed(KeySeed {
                node: &mut *node,
                ctx: &mut *self.ctx,
                track,
            })?;
            match key {
                None => return Ok(()),
                Some(Some(i)) => map.next_value_seed(ValueSeed {
                    node: &mut node.keys[i].1,
                    ctx: &mut *self.ctx,
                    depth,
                })?,
                Some(None) => {
                    node.untracked += 1;
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
    }
}

/// Looks a key up in (or adds it to) an object node; `None` when it is not tracked.
struct KeySeed<'a> {
    node: &'a mut Node,
    ctx: &'a mut Ctx,
    track: bool,
}

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = Option<usize>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Option<usize>, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed<'_> {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E>(self, k: &str) -> Result<Option<usize>, E> {
        if let Some(&i) = self.node.index.get(k) {
            return Ok(Some(i));
        }
        if !self.track || self.node.keys.len() >= MAX_KEYS || self.ctx.nodes >= MAX_NODES {
            return Ok(None);
        }
        let i = self.node.keys.len();
        let name = truncate(k, 80);
        self.node.keys.push((name, Node::default()));
        self.node.index.insert(k.to_string(), i);
        self.ctx.nodes += 1;
        Ok(Some(i))
    }
}

/// Renders the type of `node`: "string", "integer (40) | null (2)", "array[0..5] of string".
fn type_text(node: &Node) -> String {
    let types = node.types();
    let many = types.len() > 1;
    let mut parts = Vec::new();
    for (name, n) in &types {
        let mut part = match *name {
            "array" => array_text(node),
            _ => (*name).to_string(),
        };
        if many {
            part.push_str(&format!(" ({})", count(*n)));
        }
        parts.push(part);
    }
    let mut out = if parts.is_empty() {
        "nothing".to_string()
    } else {
        parts.join(" | ")
    };
    if let (Some(min), Some(max)) = (node.min, node.max)
        && node.ints + node.floats > 1
    {
        if min.as_f64() == max.as_f64() {
            out.push_str(&format!(", always {min}"));
        } else {
            out.push_str(&format!(", {min}..{max}"));
        }
    }
    out
}

/// `array[3]` or `array[0..5]`, then ` of <item type>`.
fn array_text(node: &Node) -> String {
    let len = if node.arrays == 1 || node.min_len == node.max_len {
        format!("array[{}]", countu(node.max_len as usize))
    } else {
        format!("array[{}..{}]", count(node.min_len), count(node.max_len))
    };
    match &node.items {
        Some(items) if items.seen > 0 => format!("{len} of {}", type_text(items)),
        Some(_) if node.total_items == 0 => format!("{len} (empty)"),
        _ => len,
    }
}

/// Sample values (or the distinct values with counts) as a line suffix.
fn samples_text(node: &Node) -> Option<String> {
    if let Some(d) = &node.distinct
        && node.strings >= 2
        && (d.len() as u64) * 2 <= node.strings
    {
        let mut d: Vec<&(String, u64)> = d.iter().collect();
        d.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let values: Vec<String> = d
            .iter()
            .map(|(v, n)| {
                format!(
                    "{} ({})",
                    serde_json::to_string(v).unwrap_or_default(),
                    count(*n)
                )
            })
            .collect();
        return Some(format!("; values: {}", values.join(", ")));
    }
    if node.samples.is_empty() || node.objects + node.arrays == node.seen {
        return None;
    }
    Some(format!("; e.g. {}", node.samples.join(", ")))
}

/// The object keys under `node` (and under the items of array chains), as indented lines.
pub(crate) fn render_children(node: &Node, indent: usize, s: &mut Summary, lines: &mut usize) {
    let noted = &mut false;
    let mut stack: Vec<(&Node, usize, usize)> = vec![(node, indent, 0)];
    // Depth-first, keys in first-seen order, with an explicit stack (no recursion).
    while let Some((parent, ind, next)) = stack.pop() {
        if next >= parent.keys.len() {
            if next == parent.keys.len() && parent.untracked > 0 {
                s.push(
                    rank_of(ind),
                    format!(
                        "{}… {} more key occurrence{} not tracked",
                        "  ".repeat(ind),
                        count(parent.untracked),
                        plural(parent.untracked)
                    ),
                );
            }
            continue;
        }
        stack.push((parent, ind, next + 1));
        // Past the line budget only the outermost keys are still listed (a document's last
        // top-level keys matter more than the nested detail of its first ones).
        if *lines >= MAX_LINES && ind > indent {
            if !*noted {
                s.push(
                    MINOR,
                    format!("{}… more nested keys not shown", "  ".repeat(ind)),
                );
                *noted = true;
            }
            continue;
        }
        let (key, child) = &parent.keys[next];
        if child.seen == 0 {
            continue; // a key whose value did not parse
        }
        let presence = if child.seen < parent.objects {
            format!(" (in {} of {})", count(child.seen), count(parent.objects))
        } else {
            String::new()
        };
        let key_text = serde_json::to_string(key).unwrap_or_default();
        let key_text = if key_text.len() == key.len() + 2
            && key
                .chars()
                .all(|c| c.is_alphanumeric() || c == '_' || c == '-')
        {
            key.clone()
        } else {
            key_text
        };
        let suffix = samples_text(object_or_scalar_leaf(child));
        s.push_with(
            rank_of(ind),
            format!(
                "{}{key_text}: {}{presence}",
                "  ".repeat(ind),
                type_text(child)
            ),
            SAMPLE,
            suffix,
        );
        *lines += 1;
        // Descend into the object this key holds (directly or as array items).
        if let Some(obj) = object_holder(child) {
            stack.push((obj, ind + 1, 0));
        }
    }
}

/// The node whose samples describe `node`: itself, or its array items (through array chains).
fn object_or_scalar_leaf(node: &Node) -> &Node {
    let mut n = node;
    while n.arrays > 0 && n.objects == 0 && n.strings + n.ints + n.floats + n.bools == 0 {
        match &n.items {
            Some(items) => n = items,
            None => break,
        }
    }
    n
}

/// The node holding object keys reached from `node` (itself or array items).
fn object_holder(node: &Node) -> Option<&Node> {
    let mut n = node;
    for _ in 0..MAX_DEPTH + 1 {
        if !n.keys.is_empty() || n.untracked > 0 {
            return Some(n);
        }
        n = n.items.as_deref()?;
    }
    None
}

fn rank_of(indent: usize) -> u8 {
    match indent {
        0 | 1 => KEY,
        2 => DETAIL,
        _ => MINOR,
    }
}

/// A quote-aware scan of JSON-ish bytes: maximum nesting depth, without recursion.
fn max_nesting(b: &[u8]) -> usize {
    let (mut depth, mut max, mut in_str, mut esc) = (0usize, 0usize, false, false);
    for &c in b {
        if in_str {
            if esc {
                esc = false;
            } else if c == b'\\' {
                esc = true;
            } else if c == b'"' {
                in_str = false;
            }
            continue;
        }
        match c {
            b'"' => in_str = true,
            b'{' | b'[' => {
                depth += 1;
                max = max.max(depth);
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// serde_json's message without its own " at line L column C" (the file's line is given).
fn classify(e: &serde_json::Error) -> String {
    let msg = e.to_string();
    match msg.find(" at line ") {
        Some(at) => msg[..at].to_string(),
        None => msg,
    }
}

/// The summary of a JSON document whose first line is line `first_line` of the file.
pub(crate) fn explore(text: &str, first_line: usize) -> Summary {
    let line_of = |e: &serde_json::Error| e.line() + first_line.saturating_sub(1);
    let total = text.len();
    let body = text.strip_prefix('\u{feff}').unwrap_or(text);
    let explored = prefix(body, MAX_INPUT);
    let truncated_input = explored.len() < body.len();

    let mut schema = Schema::new();
    let mut de = serde_json::Deserializer::from_str(explored);
    let parsed = schema.feed(&mut de);
    let trailing = match &parsed {
        Ok(()) => de.end().err(),
        Err(_) => None,
    };

    // After a parse error the bracket scan says how deep the text really goes.
    let depth = if parsed.is_err() || schema.max_depth > MAX_DEPTH {
        schema.max_depth.max(max_nesting(explored.as_bytes()))
    } else {
        schema.max_depth
    };
    let root = &schema.root;
    let what = if root.objects > 0 {
        let keys = root.keys.len() as u64 + root.untracked;
        format!("object with {} key{}", count(keys), plural(keys))
    } else if root.arrays > 0 {
        let items = root.items.as_deref();
        let of = items
            .filter(|i| i.seen > 0)
            .map(|i| {
                let t: Vec<&str> = i.types().iter().map(|t| t.0).collect();
                format!(" ({})", t.join("|"))
            })
            .unwrap_or_default();
        format!(
            "array of {} item{}{of}",
            count(root.total_items),
            plural(root.total_items)
        )
    } else if root.seen > 0 {
        type_text(root)
    } else {
        "no value".to_string()
    };
    let mut head = format!("JSON: {what}, {}", size(total));
    if depth > 1 {
        head.push_str(&format!(", nesting depth {depth}"));
    }
    let mut s = Summary::new(head);
    if truncated_input {
        s.push(
            KEY,
            format!(
                "Explored the first {} of {} (input above the {} bound).",
                size(explored.len()),
                size(total),
                size(MAX_INPUT)
            ),
        );
    }
    match &parsed {
        Err(e) if truncated_input && e.is_eof() => {}
        Err(e) => {
            let why = if e.is_eof() {
                "truncated: the text ends inside a value"
            } else {
                "invalid JSON"
            };
            s.push(
                KEY,
                format!(
                    "{why} ({}, line {} column {}); the structure below is of the part before it",
                    classify(e),
                    line_of(e),
                    e.column()
                ),
            );
        }
        Ok(()) => {}
    }
    if let Some(e) = trailing {
        s.push(
            KEY,
            format!(
                "More data follows the first value (line {}): not a single JSON document.",
                line_of(&e)
            ),
        );
    }
    if root.seen == 0 {
        s.push(
            MINOR,
            format!("Start: {}", truncate(explored.trim_start(), 200)),
        );
        return s;
    }
    let mut lines = 0usize;
    if root.objects > 0 && !root.keys.is_empty() {
        s.heading(KEY, "Keys:");
        render_children(root, 1, &mut s, &mut lines);
    } else if let Some(items) = root.items.as_deref().filter(|_| root.arrays > 0) {
        let leaf = object_or_scalar_leaf(items);
        s.push_with(
            KEY,
            format!("Items: {}", type_text(items)),
            SAMPLE,
            samples_text(leaf),
        );
        if let Some(obj) = object_holder(items) {
            s.heading(KEY, "Item keys (merged over all items):");
            render_children(obj, 1, &mut s, &mut lines);
        }
    } else if root.objects + root.arrays == 0
        && let Some(sample) = samples_text(root)
    {
        s.push(SAMPLE, format!("Value{sample}"));
    }
    if schema.max_depth > MAX_DEPTH {
        s.push(
            MINOR,
            format!("Keys deeper than {MAX_DEPTH} levels are counted by type only."),
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text_of(json: &str) -> String {
        explore(json, 1).text()
    }

    #[test]
    fn object_keys_types_and_nesting() {
        let t = text_of(
            r#"{"name": "lcm", "version": 3, "tags": ["a", "b"], "owner": {"id": 7, "email": null}}"#,
        );
        assert!(t.starts_with("JSON: object with 4 keys"), "{t}");
        assert!(t.contains("  name: string; e.g. \"lcm\""), "{t}");
        assert!(t.contains("  version: integer"), "{t}");
        assert!(t.contains("  tags: array[2] of string"), "{t}");
        assert!(t.contains("  owner: object"), "{t}");
        assert!(t.contains("    id: integer"), "{t}");
        assert!(t.contains("    email: null"), "{t}");
    }

    #[test]
    fn array_of_objects_merges_schema() {
        let t = text_of(
            r#"[{"id": 1, "price": 2.5}, {"id": 2, "price": 10, "note": "x"}, {"id": 3, "price": 0.5}]"#,
        );
        assert!(t.starts_with("JSON: array of 3 items (object)"), "{t}");
        assert!(t.contains("  id: integer, 1..3"), "{t}");
        assert!(
            t.contains("  price: float (2) | integer (1), 0.5..10"),
            "{t}"
        );
        assert!(t.contains("  note: string (in 1 of 3)"), "{t}");
    }

    #[test]
    fn low_cardinality_strings_list_values() {
        let mut items = Vec::new();
        for i in 0..30 {
            items.push(format!(
                r#"{{"kind": "{}"}}"#,
                if i % 3 == 0 { "user" } else { "assistant" }
            ));
        }
        let t = text_of(&format!("[{}]", items.join(",")));
        assert!(
            t.contains("kind: string; values: \"assistant\" (20), \"user\" (10)"),
            "{t}"
        );
    }

    #[test]
    fn nested_arrays() {
        let t = text_of("[[1, 2], [3, 4, 5]]");
        assert!(t.contains("Items: array[2..3] of integer, 1..5"), "{t}");
    }

    #[test]
    fn scalars_and_empty() {
        assert!(text_of("42").starts_with("JSON: integer"));
        assert!(text_of("\"hi\"").contains("e.g. \"hi\""));
        assert!(text_of("{}").starts_with("JSON: object with 0 keys"));
        assert!(text_of("[]").starts_with("JSON: array of 0 items"));
        assert!(text_of("").contains("no value"));
    }

    #[test]
    fn invalid_and_truncated_json_keep_what_was_seen() {
        let t = text_of(r#"{"a": 1, "b": [1, 2"#);
        assert!(t.contains("truncated"), "{t}");
        assert!(t.contains("  a: integer"), "{t}");
        let t = text_of(r#"{"a": 1, "b": tru}"#);
        assert!(
            t.contains("invalid JSON (expected ident, line 1 column 18)"),
            "{t}"
        );
        assert!(!t.contains("  b:"), "{t}");
        let t = explore("{\n\"a\": x}", 100).text();
        assert!(t.contains("line 101 column"), "{t}");
        let t = text_of("{\"a\": 1}\n{\"a\": 2}");
        assert!(t.contains("More data follows"), "{t}");
    }

    #[test]
    fn deep_nesting_does_not_overflow() {
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let t = text_of(&deep);
        assert!(t.starts_with("JSON:"), "{t}");
        assert!(t.contains("nesting depth 100000"), "{t}");
        assert!(t.contains("counted by type only"), "{t}");
        let deep_obj = format!("{}1{}", "{\"a\":".repeat(50), "}".repeat(50));
        let t = text_of(&deep_obj);
        assert!(t.contains("nesting depth 50"), "{t}");
        assert!(t.contains("counted by type only"), "{t}");
    }

    #[test]
    fn node_budget_bounds_memory() {
        // An object with 10,000 distinct keys tracks at most MAX_KEYS of them.
        let mut obj = String::from("{");
        for i in 0..10_000 {
            if i > 0 {
                obj.push(',');
            }
            obj.push_str(&format!("\"k{i}\": {i}"));
        }
        obj.push('}');
        let mut schema = Schema::new();
        let mut de = serde_json::Deserializer::from_str(&obj);
        schema.feed(&mut de).unwrap();
        assert_eq!(schema.root.keys.len(), MAX_KEYS);
        assert_eq!(schema.root.untracked, 10_000 - MAX_KEYS as u64);
        let t = text_of(&obj);
        assert!(t.contains("more key occurrences not tracked"), "{t}");
    }
}
