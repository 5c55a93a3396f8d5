//! The Rust definitions of `softverbs_ibverbs::ffi` against the system's
//! `infiniband/verbs.h`: `layout.c` is compiled with `cc` and prints the
//! size, alignment and every field offset the library relies on; each
//! must equal the Rust value. Skips (with a SKIP line) where `cc` or
//! `verbs.h` is missing (Debian: `apt-get install libibverbs-dev`).

mod layout_table;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

#[test]
fn struct_layouts_match_verbs_h() {
    if !Path::new("/usr/include/infiniband/verbs.h").exists() {
        println!("SKIP: /usr/include/infiniband/verbs.h is absent (install libibverbs-dev)");
        return;
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/layout.c");
    let exe = std::env::temp_dir().join(format!("softverbs-layout-{}", std::process::id()));
    let cc = Command::new("cc").arg("-o").arg(&exe).arg(&src).status();
    match cc {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("cc failed on layout.c: {s}"),
        Err(e) => {
            println!("SKIP: no C compiler ({e})");
            return;
        }
    }
    let out = Command::new(&exe).output().expect("run the layout program");
    let _ = std::fs::remove_file(&exe);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let mut c: BTreeMap<String, usize> = BTreeMap::new();
    for line in text.lines() {
        // "struct field N" or "struct size N align M"
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() == 5 && f[1] == "size" {
            c.insert(format!("{} size", f[0]), f[2].parse().unwrap());
            c.insert(format!("{} align", f[0]), f[4].parse().unwrap());
        } else {
            assert_eq!(f.len(), 3, "unexpected line {line:?}");
            c.insert(format!("{} {}", f[0], f[1]), f[2].parse().unwrap());
        }
    }
    let rust = layout_table::rust_layout();
    let mut bad = Vec::new();
    for (k, v) in &rust {
        match c.get(k) {
            Some(cv) if cv == v => {}
            Some(cv) => bad.push(format!("{k}: C {cv}, Rust {v}")),
            None => bad.push(format!("{k}: not printed by layout.c")),
        }
    }
    assert!(bad.is_empty(), "layout mismatches:\n{}", bad.join("\n"));
    assert_eq!(rust.len(), c.len(), "every C entry is checked");
    println!("{} sizes and offsets match verbs.h", rust.len());
}
