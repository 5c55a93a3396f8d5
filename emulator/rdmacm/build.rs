//! Links the cdylib as `librdmacm.so.1` with the symbol versions of
//! rdma-core 44's librdmacm, and generates its forwarding table.
//!
//! For each line of `symbols.txt` (`name version target kind`), a slot in
//! a pointer table (`__svr_ptrs`, hidden) that starts at the fallback for
//! the function's return kind, and an assembly thunk, renamed by
//! `.symver thunk, name@@@version`, that jumps through the slot: every
//! argument reaches the target untouched, whatever its signature. The
//! library's constructor (src/lib.rs) fills the slots from
//! `libibverbs.so.1` with `dlsym(target)`. Nothing here needs a system
//! library.

use std::fmt::Write as _;
use std::path::PathBuf;

fn main() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let table = std::fs::read_to_string(dir.join("symbols.txt")).expect("symbols.txt");
    println!("cargo:rerun-if-changed=symbols.txt");
    println!("cargo:rerun-if-changed=librdmacm.map");
    let aarch64 = std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("aarch64");
    let mut asm = String::new();
    let mut slots = String::new();
    let mut rust = String::from(
        "/// (target to look up, or None) of each slot, in order.\nstatic TARGETS: &[Option<&std::ffi::CStr>] = &[\n",
    );
    let mut n = 0usize;
    for (i, line) in table.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            f.len(),
            4,
            "symbols.txt line {}: expected name version target kind",
            i + 1
        );
        let (name, ver, target, kind) = (f[0], f[1], f[2], f[3]);
        let fallback = match kind {
            "int" => "__softverbs_rdmacm_fail_int",
            "ptr" | "void" => "__softverbs_rdmacm_fail_ptr",
            k => panic!("symbols.txt line {}: unknown kind {k}", i + 1),
        };
        let off = 8 * n;
        let jump = if aarch64 {
            format!("adrp x16, __svr_ptrs+{off}\nldr x16, [x16, :lo12:__svr_ptrs+{off}]\nbr x16")
        } else {
            format!("jmp *__svr_ptrs+{off}(%rip)")
        };
        let _ = writeln!(
            asm,
            ".pushsection .text.__svr_{n},\"ax\",@progbits\n.globl __svr_{n}\n.type __svr_{n}, @function\n__svr_{n}:\n{jump}\n.size __svr_{n}, .-__svr_{n}\n.popsection\n.symver __svr_{n}, {name}@@@{ver}"
        );
        let _ = writeln!(slots, ".quad {fallback}");
        if target == "-" {
            rust.push_str("    None,\n");
        } else {
            let _ = writeln!(rust, "    Some(c\"{target}\"),");
        }
        n += 1;
    }
    let _ = write!(
        asm,
        ".pushsection .data.__svr_ptrs,\"aw\",@progbits\n.balign 8\n.globl __svr_ptrs\n.hidden __svr_ptrs\n.type __svr_ptrs, @object\n.size __svr_ptrs, {}\n__svr_ptrs:\n{slots}.popsection\n",
        8 * n
    );
    rust.push_str("];\n");
    let _ = writeln!(rust, "/// How many slots.\nconst SLOTS: usize = {n};");
    std::fs::write(out.join("thunks.s"), asm).expect("write thunks.s");
    std::fs::write(out.join("table.rs"), rust).expect("write table.rs");
    let map = dir.join("librdmacm.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,librdmacm.so.1");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={}", map.display());
}
