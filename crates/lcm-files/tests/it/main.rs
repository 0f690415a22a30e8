//! The integration tests of lcm-files, as modules of one test binary: one link instead of one
//! per file. A file's tests run alone with its module's name as the filter, e.g.
//! `cargo test -p lcm-files --test it explorers::`.

mod explorers;
