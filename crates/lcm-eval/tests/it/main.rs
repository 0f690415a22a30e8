//! Integration tests of lcm-eval, one binary (see the workspace's test layout).

mod models;
mod real_local_model;
mod recall;
mod tasks;
