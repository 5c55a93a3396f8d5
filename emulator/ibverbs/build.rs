//! Links the cdylib as `libibverbs.so.1` and gives its symbols the
//! versions of rdma-core's libibverbs.
//!
//! rustc exports the `#[no_mangle]` functions through a version script of
//! its own, which would leave every symbol unversioned. So the exported
//! names are made here instead: for each line of `symbols.txt`
//! (`name version implementation`), a small assembly thunk that jumps to
//! the Rust implementation, renamed by `.symver thunk, name@@@version` to
//! the default version of `name` (or, for a version written `(VERSION)`,
//! by `.symver thunk, name@VERSION` to a version that is not the default:
//! the `IBVERBS_1.0` compatibility verbs). `libibverbs.map` declares the
//! version nodes. Nothing here needs a system library.

use std::fmt::Write as _;
use std::path::PathBuf;

fn main() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let table = std::fs::read_to_string(dir.join("symbols.txt")).expect("symbols.txt");
    println!("cargo:rerun-if-changed=symbols.txt");
    println!("cargo:rerun-if-changed=libibverbs.map");
    let mut s = String::new();
    for (i, line) in table.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            f.len(),
            3,
            "symbols.txt line {}: expected name version implementation",
            i + 1
        );
        let (name, ver, imp) = (f[0], f[1], f[2]);
        // `(VERSION)`: a version that is not the default (a binary linked
        // when it was binds it; the linker never picks it now).
        let (ver, at) = match ver.strip_prefix('(').and_then(|v| v.strip_suffix(')')) {
            Some(v) => (v, "@"),
            None => (ver, "@@@"),
        };
        if imp == "DATA" {
            // A one-byte bool variable, initially true.
            let _ = writeln!(
                s,
                ".pushsection .data\n.globl __svd_{i}\n.type __svd_{i}, @object\n.size __svd_{i}, 1\n__svd_{i}:\n.byte 1\n.popsection\n.symver __svd_{i}, {name}{at}{ver}"
            );
            continue;
        }
        let jump = if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("aarch64") {
            format!("b {imp}")
        } else {
            format!("jmp {imp}@PLT")
        };
        let _ = writeln!(
            s,
            ".pushsection .text.__svt_{i},\"ax\",@progbits\n.globl __svt_{i}\n.type __svt_{i}, @function\n__svt_{i}:\n{jump}\n.size __svt_{i}, .-__svt_{i}\n.popsection\n.symver __svt_{i}, {name}{at}{ver}"
        );
    }
    std::fs::write(out.join("symver.s"), s).expect("write symver.s");
    let map = dir.join("libibverbs.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={}", map.display());
    // rustc's own script lists the Rust names; calls between exported
    // functions bind inside the library.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
}
