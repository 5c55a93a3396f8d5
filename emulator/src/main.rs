//! The `softverbs` command-line tool.
fn main() {}
