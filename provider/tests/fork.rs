//! A forked child and the parent's softverbs-allocated buffers.
//!
//! Its own test binary, with one test: `fork` copies only the calling
//! thread, so no other test may hold the slab lock when it runs.

use softverbs::verbs::MrMemory;

/// Small buffers are ranges of shared slabs, which a child inherits. The
/// child sees the parent's data (the mapping is shared), and dropping its
/// copy of a buffer and allocating another one must leave the parent's
/// buffer alone: before slabs were tied to their process, the drop zeroed
/// the range and the next allocation handed it out again.
#[test]
fn a_forked_child_does_not_recycle_the_parents_small_buffers() {
    const LEN: usize = 8192;
    let parent = MrMemory::new(LEN).unwrap();
    let Some(shm) = parent.shared() else {
        println!("skipped: no shareable memory (memfd) here");
        return;
    };
    assert!(shm.len() < softverbs::verbs::SHARE_MIN, "a slab range");
    parent.fill(0, LEN, 0x5a).unwrap();

    // SAFETY: this binary's only test runs on one thread of its own and
    // the harness's main thread only waits for it, so no lock the child
    // takes (the allocator's, the slabs') is held by a thread that `fork`
    // leaves behind. The child ends with `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let mut seen = vec![0u8; LEN];
        let inherited_ok = parent.read(0, &mut seen).is_ok() && seen.iter().all(|&b| b == 0x5a);
        drop(parent);
        let mine = MrMemory::new(LEN).unwrap();
        // The child must really write its own buffer, or the parent's
        // check below proves nothing.
        let scribbled = mine.fill(0, LEN, 0xff).is_ok();
        let code = match (inherited_ok, scribbled) {
            (true, true) => 0,
            (false, _) => 1,
            (true, false) => 2,
        };
        // SAFETY: ends the child without running the harness's exit path.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for the child just forked; `status` is a live int.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "child status {status:#x}");
    assert_eq!(
        libc::WEXITSTATUS(status),
        0,
        "1: the child did not see the parent's data; 2: it could not fill its own buffer"
    );

    let mut now = vec![0u8; LEN];
    parent.read(0, &mut now).unwrap();
    let bad = now.iter().filter(|&&b| b != 0x5a).count();
    assert_eq!(bad, 0, "{bad} bytes of the parent's buffer changed by the child");
}
