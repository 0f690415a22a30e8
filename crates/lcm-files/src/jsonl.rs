//! JSON Lines: the exact number of records over the whole input, the merged schema of the
//! records (keys, types, in how many records), invalid lines counted with the first line
//! numbers. One record is parsed at a time into the shared [`Schema`], so memory is bounded by
//! the schema, not the input.

use crate::json::{Schema, render_children};
use crate::summary::{KEY, MINOR, Summary};
use crate::util::{bytes as size, count, plural, truncate};

/// The summary of a JSON Lines payload.
pub(crate) fn explore(text: &str, first_line: usize) -> Summary {
    let mut schema = Schema::new();
    let mut records = 0u64;
    let mut blank = 0u64;
    let mut invalid = 0u64;
    let mut invalid_lines: Vec<(usize, String)> = Vec::new();
    let mut kinds = [0u64; 3]; // object, array, scalar
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        if t.is_empty() {
            blank += 1;
            continue;
        }
        let before = (schema.root.objects, schema.root.arrays, schema.root.seen);
        let mut de = serde_json::Deserializer::from_str(t);
        match schema.feed(&mut de).and_then(|()| de.end()) {
            Ok(()) => {
                records += 1;
                if schema.root.objects > before.0 {
                    kinds[0] += 1;
                } else if schema.root.arrays > before.1 {
                    kinds[1] += 1;
                } else {
                    kinds[2] += 1;
                }
            }
            Err(e) => {
                invalid += 1;
                if invalid_lines.len() < 3 {
                    invalid_lines.push((first_line + i, format!("{e}")));
                }
            }
        }
    }
    let mut head = format!(
        "JSON Lines: {} record{}, {}",
        count(records),
        plural(records),
        size(text.len())
    );
    if invalid > 0 {
        head.push_str(&format!(
            ", {} invalid line{}",
            count(invalid),
            plural(invalid)
        ));
    }
    let mut s = Summary::new(head);
    if kinds[1] + kinds[2] > 0 {
        s.push(
            KEY,
            format!(
                "Records: {} objects, {} arrays, {} other values",
                count(kinds[0]),
                count(kinds[1]),
                count(kinds[2])
            ),
        );
    }
    for (line, why) in &invalid_lines {
        s.push(KEY, format!("Invalid line {line}: {}", truncate(why, 120)));
    }
    if blank > 0 {
        s.push(MINOR, format!("Blank lines: {}", count(blank)));
    }
    if schema.root.objects > 0 {
        s.heading(KEY, "Keys (merged over all object records):");
        let mut lines = 0;
        render_children(&schema.root, 1, &mut s, &mut lines);
    }
    if schema.max_depth > crate::json::MAX_DEPTH {
        s.push(
            MINOR,
            format!(
                "Keys deeper than {} levels are counted by type only.",
                crate::json::MAX_DEPTH
            ),
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_records_and_merges_keys() {
        let mut text = String::new();
        for i in 0..1000 {
            if i % 10 == 0 {
                text.push_str(&format!("{{\"type\":\"user\",\"n\":{i},\"extra\":true}}\n"));
            } else {
                text.push_str(&format!("{{\"type\":\"assistant\",\"n\":{i}}}\n"));
            }
        }
        text.push_str("not json\n\n");
        let t = explore(&text, 1).text();
        assert!(t.starts_with("JSON Lines: 1,000 records"), "{t}");
        assert!(t.contains("1 invalid line"), "{t}");
        assert!(t.contains("Invalid line 1001:"), "{t}");
        assert!(t.contains("  n: integer, 0..999"), "{t}");
        assert!(t.contains("  extra: boolean (in 100 of 1,000)"), "{t}");
        assert!(
            t.contains("type: string; values: \"assistant\" (900), \"user\" (100)"),
            "{t}"
        );
    }

    #[test]
    fn mixed_records_and_line_offsets() {
        let t = explore("[1]\n2\n{\"a\":1}\n{bad\n", 40).text();
        assert!(
            t.contains("Records: 1 objects, 1 arrays, 1 other values"),
            "{t}"
        );
        assert!(t.contains("Invalid line 43:"), "{t}");
    }

    #[test]
    fn empty_input() {
        let t = explore("", 1).text();
        assert!(t.starts_with("JSON Lines: 0 records, 0 bytes"), "{t}");
    }
}
