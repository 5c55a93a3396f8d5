//! The receive path of the shared-memory link: one pass over every
//! channel's ring (bounded by the budget), the slow path when due, and
//! handing each slot to the engine (datagrams directly, trains through
//! [`super::trains`]).

use super::*;

impl ShmLink {
    pub(super) fn receive(&self, budget: usize, f: &mut dyn FnMut(Datagram<'_>)) -> usize {
        if self.detached.load(Ordering::Relaxed) {
            return 0;
        }
        let calls = self.calls.fetch_add(1, Ordering::Relaxed);
        let woke = self.armed.swap(false, Ordering::AcqRel);
        if woke {
            sys::drain(self.doorbell.as_raw_fd());
            for c in self.chans_r().iter() {
                let mut rx = lock(&c.rx);
                c.region_wake(&mut rx);
            }
        }
        // The clock is read every few calls only: a busy-polling reader
        // calls this millions of times a second.
        if woke || calls.is_multiple_of(16) {
            let now = process_now();
            if woke || now.saturating_sub(self.last_slow.load(Ordering::Relaxed)) >= SLOW_NS {
                self.slow_path(now);
            }
        }
        if self.backlogged.load(Ordering::Relaxed) {
            self.flush_backlogs();
        }
        let mut n = 0;
        let up = self.up.load(Ordering::Relaxed);
        if up > 0 {
            for c in self.chans_r().iter() {
                let st = c.state();
                if (st != UP && st != CLOSING) || n >= budget {
                    continue;
                }
                let left = budget - n;
                let got = self.read_channel(c, left, f);
                n += got;
                if st == CLOSING && got < left {
                    c.kill();
                }
            }
        }
        let udp_every = match self.mode {
            ShmMode::Auto => 8,
            ShmMode::Only => 64,
        };
        if up == 0 || calls.is_multiple_of(udp_every) {
            n += self.udp.recv(budget.saturating_sub(n).max(1), f);
        }
        if n == 0 {
            // A busy-polling reader that found nothing pauses once (PAUSE
            // on x86) before its next look at the ring, which leaves the
            // writer's cache lines alone a little longer.
            std::hint::spin_loop();
        }
        n
    }

    fn read_channel(&self, c: &Channel, budget: usize, f: &mut dyn FnMut(Datagram<'_>)) -> usize {
        let Some(peer) = c.peer.get() else { return 0 };
        let mut rx = lock(&c.rx);
        let rx = &mut *rx;
        let mut n = 0;
        while n < budget {
            match rx.cons.pop_slot(&c.region, &mut rx.buf) {
                Ok(None) => break,
                Err(()) => {
                    bump(&self.stats.rx_bad_index);
                    c.kill();
                    break;
                }
                // Slots that are not datagrams count against the budget too,
                // so that a peer publishing them endlessly cannot keep this
                // loop going.
                Ok(Some(Slot::Bad)) => {
                    n += 1;
                    bump(&self.stats.rx_bad_len);
                }
                Ok(Some(Slot::Caps)) => {
                    n += 1;
                    // The connector read our probe (`shm/hello.rs`): only
                    // meaningful if we offered process-memory trains.
                    let caps = rx
                        .buf
                        .get(..4)
                        .map_or(0, |b| u32::from_le_bytes(b.try_into().unwrap_or([0; 4])));
                    if caps & CAP_CMA_READ != 0 && !c.connector && peer.trains {
                        c.cma_tx.store(true, Ordering::Relaxed);
                    }
                }
                Ok(Some(Slot::Forget)) => {
                    n += 1;
                    match ring::decode_forget(&rx.buf) {
                        Some(tokens) => {
                            for t in tokens {
                                rx.maps.remove(&t);
                            }
                        }
                        None => bump(&self.stats.rx_bad_train),
                    }
                }
                Ok(Some(Slot::Train(m, len))) => {
                    n += 1;
                    if !self.ips.contains(&m.dst) || !peer.gids.contains(&m.src) {
                        bump(&self.stats.rx_bad_addr);
                        continue;
                    }
                    if !peer.trains || !self.deliver_train(c, rx, &m, len, f) {
                        bump(&self.stats.rx_bad_train);
                    }
                }
                Ok(Some(Slot::Datagram(m))) => {
                    n += 1;
                    if !self.ips.contains(&m.dst) || !peer.gids.contains(&m.src) {
                        bump(&self.stats.rx_bad_addr);
                        continue;
                    }
                    bump(&self.stats.rx_datagrams);
                    f(Datagram {
                        src: m.src,
                        dst: m.dst,
                        src_port: m.src_port,
                        dst_port: m.dst_port,
                        data: &rx.buf,
                        train: None,
                    });
                }
            }
        }
        n
    }
}
