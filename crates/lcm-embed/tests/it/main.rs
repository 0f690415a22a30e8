//! Integration tests of lcm-embed, one binary (see the workspace's test layout). Tests that
//! need the real model skip with a message when `../shared/tools/embed-model` cannot put it on
//! disk.

mod model;
mod rerank;
