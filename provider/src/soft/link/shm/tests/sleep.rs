//! Sleeping readers: what a progress thread that sleeps on the link's
//! descriptors between receive turns must be woken for.

use super::*;

/// Whether one of `l`'s descriptors becomes readable within `timeout`
/// (what wakes a reader asleep on [`Link::poll_fds`]).
fn wakes(l: &ShmLink, timeout: Duration) -> bool {
    let mut fds: Vec<libc::pollfd> = l
        .poll_fds()
        .into_iter()
        .map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: a live array of pollfds of that length.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) > 0 }
}

/// The acceptor answers and rings the connector's doorbell as soon as it
/// has the hello, which can be before the connector's sending thread is
/// done with the connect; a receive turn of the connector's reader woken
/// by that ring (its progress thread) runs meanwhile, and the reader then
/// sleeps again. That turn must read the answer: otherwise the channel
/// stays pending, the acceptor (whose end is up) publishes into a ring
/// whose reader never armed its sleep flag, rings nobody, and the reader
/// sleeps through every datagram it sends (`ibv_ud_pingpong` in the
/// provider-thread mode hung this way). Here `a` connects to `b`; right
/// after the hello, `b` accepts and answers, and `a` runs the turn its
/// doorbell woke it for; then `a` goes to sleep and `b` sends.
#[test]
fn an_answer_that_rings_during_the_connect_is_read() {
    for mode in [ShmMode::Auto, ShmMode::Only] {
        let (a, b) = (link_in(mode), link_in(mode));
        // `a`'s reader is asleep when the first datagram is sent.
        assert!(a.prepare_sleep());
        let (a2, b2) = (a.clone(), b.clone());
        set_after_hello(&a, move || {
            drive_until_stat(&b2, "shm_channels_accepted", 1);
            assert!(wakes(&a2, Duration::ZERO), "{mode:?}: the answer did not ring");
            // The turn that ring wakes `a` for, which runs the slow path.
            a2.recv(64, &mut |_| {});
        });
        a.send_one(dgram(&a, &b, b"first", None), &mut drop);
        // `Auto` connects on its setup thread.
        assert!(a.setup_settled(), "{mode:?}");
        assert_eq!(stat(&a, "shm_channels_opened"), 1, "{mode:?}");
        // `a` goes back to sleep, and `b` answers through its channel.
        let sleeps = a.prepare_sleep();
        b.send_one(dgram(&b, &a, b"reply", None), &mut drop);
        if sleeps {
            assert!(
                wakes(&a, Duration::from_secs(5)),
                "{mode:?}: a sleeps through b's datagram: {:?} {:?}",
                a.peer_lines(),
                b.peer_lines()
            );
        }
        let got = pump_until(&b, &a, 1);
        assert_eq!(got.first().map(|g| &g.data[..]), Some(&b"reply"[..]), "{mode:?}");
        assert!(a.is_shm_peer(b.gids[0]), "{mode:?}: {:?}", a.peer_lines());
    }
}
