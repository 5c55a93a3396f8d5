//! The softverbs emulator: environment drivers and the `softverbs` CLI.
