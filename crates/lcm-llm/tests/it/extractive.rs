//! The extractive summariser: deterministic, under the target, keeps the informative lines
//! (errors, paths, decisions) over filler, and keeps the original order.

use crate::common::{counter, transcript};
use lcm_llm::ExtractiveSummarizer;

fn filler(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            format!(
                "It was a pleasant afternoon and the coffee tasted nice, as it had in round {}.",
                [
                    "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"
                ][i % 10]
            )
        })
        .collect()
}

#[test]
fn same_input_same_output() {
    let summarizer = ExtractiveSummarizer::new(counter());
    let text = transcript(30);
    let first = summarizer.summarize_text(&text, 400);
    for _ in 0..3 {
        assert_eq!(summarizer.summarize_text(&text, 400), first);
    }
    // A fresh instance too.
    assert_eq!(
        ExtractiveSummarizer::new(counter()).summarize_text(&text, 400),
        first
    );
}

#[test]
fn output_is_under_the_target_and_shorter_than_the_input() {
    let summarizer = ExtractiveSummarizer::new(counter());
    let counter = counter();
    let text = transcript(25);
    let input = counter.count_text(&text);
    for target in [1, 5, 20, 64, 200, 512, 1200] {
        let out = summarizer.summarize_text(&text, target);
        let tokens = counter.count_text(&out);
        assert!(tokens <= target as usize, "target {target}: {tokens}");
        assert!(tokens < input);
        assert!(!out.is_empty(), "target {target} gave nothing");
    }
    assert_eq!(summarizer.summarize_text(&text, 0), "");
}

#[test]
fn text_that_fits_is_returned_unchanged() {
    let summarizer = ExtractiveSummarizer::new(counter());
    let text = "Short note.\nNothing to cut.";
    assert_eq!(summarizer.summarize_text(text, 100), text);
}

#[test]
fn keeps_error_and_path_lines_over_filler() {
    let summarizer = ExtractiveSummarizer::new(counter());
    let mut lines = filler(8);
    lines.insert(
        3,
        "The build failed with error E0308: mismatched types.".into(),
    );
    lines.insert(
        6,
        "Then the agent edited crates/lcm-llm/src/http.rs to fix it.".into(),
    );
    let text = lines.join("\n");
    let out = summarizer.summarize_text(&text, 40);
    assert!(out.contains("error E0308"), "{out}");
    assert!(out.contains("crates/lcm-llm/src/http.rs"), "{out}");
    assert!(counter().count_text(&out) <= 40);
    let filler_kept = out.lines().filter(|l| l.contains("coffee")).count();
    assert!(filler_kept <= 1, "{out}");
}

#[test]
fn keeps_decisions_commitments_and_questions() {
    let summarizer = ExtractiveSummarizer::new(counter());
    let mut lines = filler(12);
    lines.insert(2, "We decided to use redb instead of sqlite.".into());
    lines.insert(
        7,
        "TODO: next step is to benchmark grep on msg_12000.".into(),
    );
    lines.insert(10, "Can you check why the index watermark lags?".into());
    let text = lines.join("\n");
    let out = summarizer.summarize_text(&text, 60);
    assert!(out.contains("decided to use redb"), "{out}");
    assert!(out.contains("TODO: next step"), "{out}");
    assert!(out.contains("watermark lags?"), "{out}");
}

#[test]
fn keeps_the_original_order() {
    let summarizer = ExtractiveSummarizer::new(counter());
    let text = transcript(15);
    let out = summarizer.summarize_text(&text, 300);
    // Every kept line appears in the input, and in the same order.
    let mut cursor = 0;
    for line in out.lines() {
        let found = text[cursor..]
            .find(line)
            .unwrap_or_else(|| panic!("{line:?} out of order"));
        cursor += found + line.len();
    }
    // The first and the last unit get a position bonus.
    assert!(out.starts_with("Round 0."), "{out}");
}

#[test]
fn sentences_of_one_long_line_are_units() {
    let summarizer = ExtractiveSummarizer::new(counter());
    let paragraph = format!(
        "{} The request to /v1/messages failed with a timeout after 60 s. {}",
        filler(6).join(" "),
        filler(6).join(" ")
    );
    let out = summarizer.summarize_text(&paragraph, 30);
    assert!(out.contains("failed with a timeout after 60 s."), "{out}");
    assert!(counter().count_text(&out) <= 30);
}

#[test]
fn a_single_huge_unit_is_cut_to_the_target() {
    let summarizer = ExtractiveSummarizer::new(counter());
    let text = "word ".repeat(5000);
    let out = summarizer.summarize_text(&text, 50);
    let tokens = counter().count_text(&out);
    assert!(tokens <= 50 && tokens > 10, "{tokens}");
    let blob = "A".repeat(100_000);
    let out = summarizer.summarize_text(&blob, 50);
    assert!(counter().count_text(&out) <= 50);
    assert!(!out.is_empty());
}

#[test]
fn repeated_lines_are_not_kept_twice_for_their_signal() {
    let summarizer = ExtractiveSummarizer::new(counter());
    let mut lines = vec!["error: connection refused to 127.0.0.1:5432".to_owned(); 30];
    lines.push("The agent then switched to the unix socket in /var/run/postgresql.".into());
    lines.extend(filler(5));
    let text = lines.join("\n");
    let out = summarizer.summarize_text(&text, 45);
    assert!(out.contains("/var/run/postgresql"), "{out}");
    assert!(out.matches("connection refused").count() <= 2, "{out}");
}

#[test]
fn a_sentence_is_kept_once_and_its_copies_leave_room_for_others() {
    // A conversation where every message repeats a short courtesy beside its one fact (what
    // the offline summary of session 42's probe conversation kept: the courtesy, three times).
    let summarizer = ExtractiveSummarizer::new(counter());
    let text: String = (0..6)
        .map(|i| {
            format!(
                "My name is Ada and I deploy ticket INV-48{i:02} to staging. Please acknowledge \
                 briefly. Some padding text about the build system and the pipeline.\n"
            )
        })
        .collect();
    let out = summarizer.summarize_text(&text, 60);
    assert_eq!(
        out.matches("Please acknowledge briefly.").count(),
        1,
        "{out}"
    );
    assert!(out.matches("INV-48").count() >= 2, "{out}");
    assert!(counter().count_text(&out) <= 60);
}

#[test]
fn a_span_is_summarised_by_what_its_messages_say_each_cited_by_id() {
    // A chat span as the engine renders it for a summariser: a header line a message. The
    // headers carry ids and numbers, which scored them above the messages they head; now they
    // name the source of the kept lines instead.
    let summarizer = ExtractiveSummarizer::new(counter());
    let text: String = (0..8)
        .map(|i| {
            format!(
                "[msg_{} user 2026-11-29T12:52:{i:02}.971Z]\nMy name is Ada and I deploy ticket \
                 INV-48{i:02} to staging. Please acknowledge briefly.\n\n[msg_{} assistant \
                 2026-11-29T12:52:{i:02}.999Z]\nI'm glad to help!\n\n",
                2 * i,
                2 * i + 1
            )
        })
        .collect();
    let out = summarizer.summarize_text(&text, 80);
    assert!(!out.contains("[msg_"), "{out}");
    assert!(!out.contains("2026-11-29"), "{out}");
    assert!(out.matches("INV-48").count() >= 3, "{out}");
    assert!(out.contains("msg_0: My name is Ada"), "{out}");
    // Every kept line of a message is cited once, by the message's id.
    for line in out.lines() {
        assert!(line.starts_with("msg_"), "{line:?} in {out}");
    }
    assert!(counter().count_text(&out) <= 80);
}

#[test]
fn a_condensed_span_keeps_the_ids_its_summaries_cite() {
    // Summaries rendered for a condensed pass: their lines already cite their messages.
    let summarizer = ExtractiveSummarizer::new(counter());
    let text: String = (0..6)
        .map(|i| {
            format!(
                "[sum_{i} depth 0 2026-11-29T12:52:00Z..2026-11-29T12:53:00Z]\n\
                 msg_{}: The user deployed ticket INV-48{i:02} to staging.\n\
                 Commands:\n- `deploy --ticket INV-48{i:02}` -> ok\n\n",
                3 * i
            )
        })
        .collect();
    let out = summarizer.summarize_text(&text, 70);
    assert!(
        out.contains("msg_0: The user deployed ticket INV-4800"),
        "{out}"
    );
    // Lines without an id of their own take their summary's; none gets both.
    for line in out.lines() {
        assert!(
            line.starts_with("msg_") || line.starts_with("sum_"),
            "{line:?}"
        );
        assert!(!line.contains(": msg_"), "{line:?}");
    }
    assert!(out.contains("sum_0: Commands:"), "{out}");
}
