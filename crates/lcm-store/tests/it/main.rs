//! The integration tests of `lcm-store`, as modules of one test binary: one link instead of one
//! per file. A file's tests run alone with its module's name as the filter, e.g.
//! `cargo test -p lcm-store --test it migration::`.

mod common;

mod dag;
mod files;
mod integrity;
mod locks;
mod map_jobs;
mod migration;
mod power_loss;
