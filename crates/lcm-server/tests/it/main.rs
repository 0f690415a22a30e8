//! The integration tests of lcm-server, as modules of one test binary: one link instead of one
//! per file. A file's tests run alone with its module's name as the filter, e.g.
//! `cargo test -p lcm-server --test it proxy_client_model::`.
//!
//! `common` is included by `benches/load.rs` too.

mod common;

mod api;
mod load;
mod maps;
mod openapi;
mod proxy;
mod proxy_client_model;
mod proxy_replay;
mod security;
