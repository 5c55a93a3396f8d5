//! A completion channel's and a context's descriptor become readable
//! whenever a completion or async event is pending, for every link
//! (in-process, UDP, shared memory) and every engine mode: a consumer
//! that registers only that descriptor with `mio` and sleeps there is
//! woken when a peer's SEND lands, without registering the link's
//! sockets or driving the device itself.
//!
//! Each test registers the receiver's descriptor, lets a peer thread post
//! a SEND (and poll its own CQ, as a live peer does), and waits in `mio`
//! with a generous bound; a wake-up that brings no event (the descriptor
//! may also wake for datagrams the device must read) just waits again.

mod udp_common;

use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use softverbs::soft::engine::EngineMode;
use softverbs::soft::link::shm::{ShmLink, ShmMode};
use softverbs::soft::link::udp::{UdpConfig, UdpLink, UdpPort};
use softverbs::soft::link::Link;
use softverbs::soft::{SoftDevice, SoftDeviceConfig};
use softverbs::verbs::*;
use udp_common::{free_private_port, unique, LO4, WAIT};

#[derive(Debug, Clone, Copy)]
enum Kind {
    Inproc,
    Udp,
    Shm,
}

fn device(kind: Kind, mode: EngineMode) -> Arc<SoftDevice> {
    let mut cfg = match kind {
        Kind::Inproc => {
            static N: AtomicU32 = AtomicU32::new(1);
            let n = N.fetch_add(1, Ordering::Relaxed);
            let ip = IpAddr::V4(Ipv4Addr::new(10, 213, (n >> 8) as u8, n as u8));
            SoftDeviceConfig::new(&unique("evi"), ip)
        }
        Kind::Udp => {
            let mut udp = UdpConfig::new(LO4);
            udp.port = UdpPort::Fixed(free_private_port(LO4));
            SoftDeviceConfig::udp(&unique("evu"), udp).expect("bind")
        }
        Kind::Shm => {
            let mut udp = UdpConfig::new(LO4);
            udp.port = UdpPort::Fixed(free_private_port(LO4));
            let udp = UdpLink::bind(&udp).expect("bind");
            let addrs = udp.gids().iter().map(|g| g.to_ip()).collect();
            let link = ShmLink::new(udp, ShmMode::Only).expect("shm link");
            SoftDeviceConfig {
                addrs,
                link: Some(link as Arc<dyn Link>),
                ..SoftDeviceConfig::new(&unique("evs"), LO4)
            }
        }
    };
    cfg.engine = mode;
    SoftDevice::create(cfg).expect("create device")
}

/// The receiving side: its receive CQ reports to a channel, and its QP
/// receives through an SRQ whose limit is armed.
struct Receiver {
    ctx: Context,
    _pd: Pd,
    channel: CompChannel,
    rcq: Cq,
    _scq: Cq,
    srq: Srq,
    qp: Qp,
    mr: Mr,
}

struct Sender {
    ctx: Context,
    _pd: Pd,
    cq: Cq,
    qp: Qp,
    mr: Mr,
}

fn pair(kind: Kind, mode: EngineMode) -> (Arc<SoftDevice>, Arc<SoftDevice>, Receiver, Sender) {
    let (dr, ds) = (device(kind, mode), device(kind, mode));
    let ctx = dr.open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let channel = ctx.create_comp_channel().unwrap();
    let rcq = ctx.cq_builder(16).context(0x5eed).channel(&channel).create().unwrap();
    let scq = ctx.cq_builder(16).create().unwrap();
    let srq = pd
        .create_srq(
            SrqAttr {
                max_wr: 8,
                max_sge: 1,
                srq_limit: 0,
            },
            0x5a,
        )
        .unwrap();
    let qp = pd
        .create_qp(&QpInitAttr::new(QpType::Rc, &scq, &rcq).with_srq(&srq))
        .unwrap();
    let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let r = Receiver {
        ctx,
        _pd: pd,
        channel,
        rcq,
        _scq: scq,
        srq,
        qp,
        mr,
    };
    let ctx = ds.open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.cq_builder(16).create().unwrap();
    let qp = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq)).unwrap();
    let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let s = Sender {
        ctx,
        _pd: pd,
        cq,
        qp,
        mr,
    };
    let er = Endpoint::local(&r.ctx, &r.qp, 1, 0).unwrap();
    let es = Endpoint::local(&s.ctx, &s.qp, 1, 0).unwrap();
    r.qp.connect(&r.ctx, &er, &es).unwrap();
    s.qp.connect(&s.ctx, &es, &er).unwrap();
    (dr, ds, r, s)
}

/// The peer: posts one signaled SEND and polls its CQ until it completes
/// (driving its own device, as a live peer does).
fn send_from(s: Sender) -> std::thread::JoinHandle<Sender> {
    std::thread::spawn(move || {
        s.mr.fill(0, 32, 0xab).unwrap();
        let sge = [s.mr.sge(0, 32).unwrap()];
        s.qp.post_send(&[SendWr::new(1, SendOp::Send, &sge).flags(SendFlags::SIGNALED)])
            .unwrap();
        let start = Instant::now();
        let mut wc = [WorkCompletion::default()];
        loop {
            if s.cq.poll(&mut wc).unwrap() == 1 {
                assert!(wc[0].is_success(), "{wc:?}");
                return s;
            }
            assert!(start.elapsed() < WAIT, "the SEND did not complete on the sender");
            std::thread::sleep(Duration::from_micros(200));
        }
    })
}

/// Sleeps in `mio` on `fd` only, calling `take` at each wake-up, until it
/// returns something or [`WAIT`] passes.
fn wait_in_mio<T>(fd: std::os::fd::BorrowedFd<'_>, mut take: impl FnMut() -> Option<T>) -> Option<T> {
    let mut poll = Poll::new().unwrap();
    let raw = fd.as_raw_fd();
    poll.registry()
        .register(&mut SourceFd(&raw), Token(7), Interest::READABLE)
        .unwrap();
    let mut events = Events::with_capacity(4);
    let start = Instant::now();
    loop {
        let left = WAIT.saturating_sub(start.elapsed());
        if left.is_zero() {
            return None;
        }
        poll.poll(&mut events, Some(left)).unwrap();
        if events.iter().any(|e| e.token() == Token(7)) {
            if let Some(t) = take() {
                return Some(t);
            }
        }
    }
}

fn completion_event_wakes_mio(kind: Kind, mode: EngineMode) {
    let (_dr, _ds, r, s) = pair(kind, mode);
    let sge = [r.mr.sge(0, 64).unwrap()];
    r.srq.post_recv(&[RecvWr::new(9, &sge)]).unwrap();
    r.rcq.req_notify(false).unwrap();
    let peer = send_from(s);
    let got = wait_in_mio(r.channel.as_fd(), || {
        r.channel.get_cq_event(Some(Duration::ZERO)).unwrap()
    });
    assert_eq!(got, Some(0x5eed), "{kind:?} {mode:?}: the channel never fired");
    r.rcq.ack_events(1);
    let mut wc = [WorkCompletion::default()];
    assert_eq!(r.rcq.poll(&mut wc).unwrap(), 1);
    assert_eq!((wc[0].wr_id, wc[0].status, wc[0].byte_len), (9, WcStatus::Success, 32));
    drop(peer.join().unwrap());
}

fn async_event_wakes_mio(kind: Kind, mode: EngineMode) {
    let (_dr, _ds, r, s) = pair(kind, mode);
    let sge = [r.mr.sge(0, 64).unwrap(), r.mr.sge(64, 64).unwrap()];
    r.srq
        .post_recv(&[RecvWr::new(1, &sge[..1]), RecvWr::new(2, &sge[1..])])
        .unwrap();
    // Two receives posted, limit 2: taking one fires SRQ_LIMIT_REACHED.
    r.srq
        .modify(
            &SrqAttr {
                srq_limit: 2,
                ..SrqAttr::default()
            },
            SrqAttrMask::LIMIT,
        )
        .unwrap();
    let peer = send_from(s);
    let got = wait_in_mio(r.ctx.as_fd(), || r.ctx.get_async_event(Some(Duration::ZERO)).unwrap());
    let ev = got.unwrap_or_else(|| panic!("{kind:?} {mode:?}: the context's descriptor never fired"));
    assert_eq!(ev.event_type, EventType::SrqLimitReached, "{ev:?}");
    drop(peer.join().unwrap());
}

const THREAD: EngineMode = EngineMode::ProgressThread { spin: Duration::ZERO };

#[test]
fn channel_inproc_inline() {
    completion_event_wakes_mio(Kind::Inproc, EngineMode::Inline);
}

#[test]
fn channel_inproc_thread() {
    completion_event_wakes_mio(Kind::Inproc, THREAD);
}

#[test]
fn channel_udp_inline() {
    completion_event_wakes_mio(Kind::Udp, EngineMode::Inline);
}

#[test]
fn channel_udp_thread() {
    completion_event_wakes_mio(Kind::Udp, THREAD);
}

#[test]
fn channel_shm_inline() {
    completion_event_wakes_mio(Kind::Shm, EngineMode::Inline);
}

#[test]
fn channel_shm_thread() {
    completion_event_wakes_mio(Kind::Shm, THREAD);
}

#[test]
fn async_inproc_inline() {
    async_event_wakes_mio(Kind::Inproc, EngineMode::Inline);
}

#[test]
fn async_inproc_thread() {
    async_event_wakes_mio(Kind::Inproc, THREAD);
}

#[test]
fn async_udp_inline() {
    async_event_wakes_mio(Kind::Udp, EngineMode::Inline);
}

#[test]
fn async_udp_thread() {
    async_event_wakes_mio(Kind::Udp, THREAD);
}

#[test]
fn async_shm_inline() {
    async_event_wakes_mio(Kind::Shm, EngineMode::Inline);
}

#[test]
fn async_shm_thread() {
    async_event_wakes_mio(Kind::Shm, THREAD);
}

/// The sender sleeps in `mio` on its own channel while its SEND waits out
/// an RNR NAK: the retry is the engine's timer, which in inline mode on a
/// network link runs only if the descriptor also wakes for it.
fn timer_wakes_mio(kind: Kind) {
    let (ds, dr) = (device(kind, EngineMode::Inline), device(kind, THREAD));
    let sctx = ds.open().unwrap();
    let spd = sctx.alloc_pd().unwrap();
    let channel = sctx.create_comp_channel().unwrap();
    let scq = sctx.cq_builder(16).context(0x5e4d).channel(&channel).create().unwrap();
    let sqp = spd.create_qp(&QpInitAttr::new(QpType::Rc, &scq, &scq)).unwrap();
    let smr = spd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let rctx = dr.open().unwrap();
    let rpd = rctx.alloc_pd().unwrap();
    let rcq = rctx.cq_builder(16).create().unwrap();
    let rqp = rpd.create_qp(&QpInitAttr::new(QpType::Rc, &rcq, &rcq)).unwrap();
    let rmr = rpd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let es = Endpoint::local(&sctx, &sqp, 1, 0).unwrap();
    let er = Endpoint::local(&rctx, &rqp, 1, 0).unwrap();
    sqp.connect(&sctx, &es, &er).unwrap();
    rqp.connect(&rctx, &er, &es).unwrap();

    // Register first, so the device is watched before anything happens.
    let fd = channel.as_fd();
    scq.req_notify(false).unwrap();
    let sge = [smr.sge(0, 16).unwrap()];
    sqp.post_send(&[SendWr::new(5, SendOp::Send, &sge).flags(SendFlags::SIGNALED)])
        .unwrap();
    // No receive yet: the SEND is NAKed (RNR) until this thread posts one,
    // well after the sender went to sleep.
    let late = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        let sge = [rmr.sge(0, 64).unwrap()];
        rqp.post_recv(&[RecvWr::new(6, &sge)]).unwrap();
        (rqp, rmr)
    });
    let got = wait_in_mio(fd, || channel.get_cq_event(Some(Duration::ZERO)).unwrap());
    assert_eq!(got, Some(0x5e4d), "{kind:?}: the sender was never woken to retry");
    scq.ack_events(1);
    let mut wc = [WorkCompletion::default()];
    assert_eq!(scq.poll(&mut wc).unwrap(), 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (5, WcStatus::Success), "{wc:?}");
    drop(late.join().unwrap());
}

#[test]
fn timer_udp_inline() {
    timer_wakes_mio(Kind::Udp);
}

#[test]
fn timer_shm_inline() {
    timer_wakes_mio(Kind::Shm);
}
