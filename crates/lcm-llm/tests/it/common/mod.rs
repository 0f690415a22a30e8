//! Helpers shared by the integration tests.

use std::time::Duration;

use lcm_core::tokens::{Encoding, TokenCounter};
use lcm_llm::HttpConfig;
use lcm_llm::testing::ScriptedServer;

/// The model name the tests configure.
pub const MODEL: &str = "test-model";
/// The key the tests configure.
pub const KEY: &str = "sk-test-123";

/// A configuration for `server` with fast backoff, a short timeout and an explicit key.
pub fn fast_config(server: &ScriptedServer) -> HttpConfig {
    HttpConfig::new(server.url(), MODEL)
        .with_api_key(KEY)
        .with_timeout(Duration::from_secs(5))
        .with_backoff(Duration::from_millis(5), Duration::from_millis(40))
}

pub fn counter() -> TokenCounter {
    TokenCounter::new(Encoding::O200kBase)
}

/// A realistic stretch of an agent transcript, about `repeat` x 120 tokens.
pub fn transcript(repeat: usize) -> String {
    let block = "\
The user asked to make the importer idempotent and to report skipped lines by number.
The agent read crates/lcm-store/src/import.rs and found that source keys were not checked before appending.
It ran cargo test -p lcm-store and the test import_twice_is_idempotent failed with error: duplicate message msg_41.
We decided to look up the source key in the session_sources table before each batch.
The weather in the logs was mentioned in passing and is not important at all for anything.
TODO: add a property test for re-import after a crash; next step is to rerun the durability suite.";
    let mut out = String::new();
    for i in 0..repeat {
        out.push_str(&format!("Round {i}.\n{block}\n"));
    }
    out
}
