//! The `softverbs` command-line tool: see `softverbs --help` and
//! [`softverbs_emulator::cli`].

fn main() -> std::process::ExitCode {
    softverbs_emulator::cli::main()
}
