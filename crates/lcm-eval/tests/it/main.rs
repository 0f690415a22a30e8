//! Integration tests of lcm-eval, one binary (see the workspace's test layout).

mod recall;
mod tasks;
