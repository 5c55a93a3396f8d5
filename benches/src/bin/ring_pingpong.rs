//! The shared-memory link's ring alone: a ping-pong of 24-byte datagrams
//! (the size of an 8-byte RC SEND ONLY) through one region's two rings,
//! between two threads busy-polling as the link's reader does (a PAUSE
//! after an empty look). Compare its one-way time with the anchors'
//! `shm_pingpong` (a flag): the difference is what the ring's protocol
//! costs, before any engine work.
//!
//! usage: `ring_pingpong [iterations=1000000] [size=24]` (size: datagram
//! bytes, 1 to the ring's `MAX_PAYLOAD`; 4096 shows the cost of the
//! copies in and out of a slot), on a host with two idle
//! CPUs for its two busy threads (`run_cross.sh` runs it under
//! `taskset -c 0,1`; pinning each thread measured the same here).
//! Output: `ring_pingpong size=S iters=N p50_oneway_ns=.. p99_oneway_ns=..
//! avg_oneway_ns=..`. Each timed round trip includes one clock read, as
//! the anchor's do (`Instant::now`, ~20 ns on this project's VMs); the
//! average (whole run over its round trips) includes two.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Instant;

use softverbs::soft::link::shm::ring::{Consumer, Producer, Region, Slot, SlotMeta, MAX_PAYLOAD};

/// Pushes one datagram, retrying while the ring is full.
fn push(p: &mut Producer, region: &Region, meta: &SlotMeta, data: &[u8]) {
    while p.push(region, meta, data).is_err() {
        std::hint::spin_loop();
    }
}

/// Busy-polls until a datagram arrives.
fn pop(c: &mut Consumer, region: &Region, buf: &mut Vec<u8>) {
    loop {
        match c.pop_slot(region, buf) {
            Ok(Some(Slot::Datagram(_))) => return,
            Ok(Some(_)) => panic!("unexpected slot kind"),
            Ok(None) => std::hint::spin_loop(),
            Err(()) => panic!("ring broken"),
        }
    }
}

fn main() {
    let iters: usize = std::env::args()
        .nth(1)
        .map_or(1_000_000, |a| a.parse().expect("iterations: a number"));
    let size: usize = std::env::args()
        .nth(2)
        .map_or(24, |a| a.parse().expect("size: a number"));
    assert!((1..=MAX_PAYLOAD).contains(&size), "size: 1 to {MAX_PAYLOAD}");
    let region = Arc::new(Region::create().expect("creating the shared region"));
    let meta = SlotMeta {
        src: IpAddr::V4(Ipv4Addr::LOCALHOST),
        dst: IpAddr::V4(Ipv4Addr::LOCALHOST),
        src_port: 4791,
        dst_port: 4791,
    };
    let warmup = iters / 10;
    let echo = {
        let region = Arc::clone(&region);
        std::thread::spawn(move || {
            let (mut rx, mut tx) = (Consumer::new(0), Producer::new(1));
            let mut buf = Vec::with_capacity(size);
            for _ in 0..warmup + iters {
                pop(&mut rx, &region, &mut buf);
                push(&mut tx, &region, &meta, &buf);
            }
        })
    };
    let (mut tx, mut rx) = (Producer::new(0), Consumer::new(1));
    let data = vec![0x5au8; size];
    let mut buf = Vec::with_capacity(size);
    let mut rtts = Vec::with_capacity(iters);
    let start = Instant::now();
    for i in 0..warmup + iters {
        let t = Instant::now();
        push(&mut tx, &region, &meta, &data);
        pop(&mut rx, &region, &mut buf);
        if i >= warmup {
            rtts.push(t.elapsed().as_nanos() as u64);
        }
    }
    let total = start.elapsed().as_nanos() as f64;
    echo.join().expect("echo thread");
    rtts.sort_unstable();
    let p50 = rtts[rtts.len() / 2] as f64 / 2.0;
    let avg = total / (warmup + iters) as f64 / 2.0;
    let p99 = rtts[(rtts.len() - 1) * 99 / 100] as f64 / 2.0;
    println!(
        "ring_pingpong size={size} iters={iters} p50_oneway_ns={p50:.1} p99_oneway_ns={p99:.1} avg_oneway_ns={avg:.1}"
    );
}
