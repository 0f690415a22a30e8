//! The `lcm` binary: see `lcm --help` and the README.

fn main() -> std::process::ExitCode {
    lcm_cli::run()
}
