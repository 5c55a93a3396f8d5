//! Completion channels and async events as file descriptors, with devices
//! on the UDP link: registered with `mio` (epoll), waited on with a
//! timeout, `get_cq_event`/`ack_cq_events` semantics (a CQ with
//! unacknowledged events cannot be destroyed), and inline devices that
//! read their socket while a consumer waits.

mod udp_common;

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use softverbs::soft::engine::EngineMode;
use softverbs::verbs::*;
use udp_common::*;

/// A side whose receive CQ reports to a completion channel.
struct ChannelSide {
    side: Side,
    channel: CompChannel,
    cq: Cq,
}

fn channel_side(dev: &std::sync::Arc<softverbs::soft::SoftDevice>, psn: u32) -> ChannelSide {
    let mut side = side(dev, 4096, psn);
    let channel = side.ctx.create_comp_channel().unwrap();
    let cq = side.ctx.create_cq(64, 0xc0ffee, Some(&channel), 0).unwrap();
    // Rebuild the QP on the channel's CQ.
    side.qp = side
        .pd
        .create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &side.scq,
            recv_cq: &cq,
            srq: None,
            cap: QpCap {
                max_send_wr: 16,
                max_recv_wr: 16,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        })
        .unwrap();
    ChannelSide { side, channel, cq }
}

fn send_one(from: &Side, byte: u8) {
    from.mr.fill(0, 32, byte).unwrap();
    let sge = [from.mr.sge(0, 32).unwrap()];
    from.qp
        .post_send(&[SendWr::new(1, SendOp::Send, &sge).flags(SendFlags::SIGNALED)])
        .unwrap();
}

#[test]
fn channel_fd_works_with_epoll_and_events_must_be_acked() {
    let da = device(LO4, EngineMode::Inline);
    let db = device(LO4, EngineMode::progress_thread());
    let a = side(&da, 4096, 1);
    let b = channel_side(&db, 2);
    connect(&a, &b.side, Mtu::Mtu1024);
    let sge = [b.side.mr.sge(0, 64).unwrap()];
    b.side.qp.post_recv(&[RecvWr::new(9, &sge)]).unwrap();
    b.cq.req_notify(false).unwrap();

    let mut poll = Poll::new().unwrap();
    let fd = b.channel.as_raw_fd();
    assert!(fd >= 0);
    poll.registry()
        .register(&mut SourceFd(&fd), Token(1), Interest::READABLE)
        .unwrap();
    // Nothing yet: a zero timeout returns no event.
    assert_eq!(b.channel.get_cq_event(Some(Duration::ZERO)).unwrap(), None);

    send_one(&a, 0x5a);
    // B's progress thread receives, completes, and fires the channel; this
    // thread only sleeps in epoll.
    let mut events = Events::with_capacity(4);
    let start = Instant::now();
    while events.is_empty() {
        poll.poll(&mut events, Some(Duration::from_millis(100))).unwrap();
        // A's inline engine needs polling to take the ACK; harmless here.
        let _ = a.scq.poll(&mut []);
        assert!(start.elapsed() < WAIT, "the channel fd never became readable");
    }
    assert_eq!(b.channel.get_cq_event(Some(Duration::ZERO)).unwrap(), Some(0xc0ffee));
    let mut wc = [WorkCompletion::default()];
    assert_eq!(b.cq.poll(&mut wc).unwrap(), 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (9, WcStatus::Success));

    // The event is unacknowledged: the CQ cannot go, even once no QP uses
    // it; after ack_cq_events it can.
    let ChannelSide { side, channel, cq } = b;
    drop(side);
    let err = cq.destroy().expect_err("EBUSY while an event is unacknowledged");
    assert_eq!(err.error.kind(), ErrorKind::Busy, "{}", err.error);
    let cq = err.object;
    cq.ack_events(1);
    cq.destroy().map_err(|e| e.error).unwrap();
    channel.destroy().map_err(|e| e.error).unwrap();
}

#[test]
fn get_cq_event_times_out() {
    let d = device(LO4, EngineMode::Inline);
    let b = channel_side(&d, 3);
    b.cq.req_notify(false).unwrap();
    let start = Instant::now();
    assert_eq!(b.channel.get_cq_event(Some(Duration::from_millis(30))).unwrap(), None);
    assert!(start.elapsed() >= Duration::from_millis(30));
}

/// An inline device has no thread: a consumer blocked in `get_cq_event`
/// is what reads its socket.
#[test]
fn inline_devices_read_their_socket_while_waiting_for_an_event() {
    let da = device(LO4, EngineMode::progress_thread());
    let db = device(LO4, EngineMode::Inline);
    let a = side(&da, 4096, 4);
    let b = channel_side(&db, 5);
    connect(&a, &b.side, Mtu::Mtu1024);
    let sge = [b.side.mr.sge(0, 64).unwrap()];
    b.side.qp.post_recv(&[RecvWr::new(11, &sge)]).unwrap();
    b.cq.req_notify(false).unwrap();
    send_one(&a, 0x33);
    assert_eq!(b.channel.get_cq_event(Some(WAIT)).unwrap(), Some(0xc0ffee));
    b.cq.ack_events(1);
    let mut wc = [WorkCompletion::default()];
    assert_eq!(b.cq.poll(&mut wc).unwrap(), 1);
    assert_eq!(wc[0].wr_id, 11);
    assert_eq!(b.side.mr.to_vec(0, 32).unwrap(), vec![0x33; 32]);
    // A's progress thread took the ACK.
    assert_eq!(wait_one(&a.scq, &[]).status, WcStatus::Success);
}

/// Async events: the context's fd becomes readable (epoll) and the event
/// is read with a timeout.
#[test]
fn async_event_fd_works_with_epoll() {
    let da = device(LO4, EngineMode::Inline);
    let db = device(LO4, EngineMode::progress_thread());
    let (a, b) = (side(&da, 4096, 6), side(&db, 4096, 7));
    connect(&a, &b, Mtu::Mtu1024);
    assert_eq!(b.ctx.get_async_event(Some(Duration::ZERO)).unwrap(), None);
    let mut poll = Poll::new().unwrap();
    let fd = b.ctx.as_raw_fd();
    poll.registry()
        .register(&mut SourceFd(&fd), Token(2), Interest::READABLE)
        .unwrap();
    // An RDMA WRITE with a bad rkey: B's responder raises a QP access
    // error (and A gets REM_ACCESS_ERR).
    let sge = [a.mr.sge(0, 16).unwrap()];
    let remote = RemoteAddr {
        addr: b.mr.addr(),
        rkey: b.mr.rkey() ^ 0x0100,
    };
    a.qp.post_send(&[SendWr::new(3, SendOp::Write { remote }, &sge).flags(SendFlags::SIGNALED)])
        .unwrap();
    let mut events = Events::with_capacity(4);
    let start = Instant::now();
    while events.is_empty() {
        poll.poll(&mut events, Some(Duration::from_millis(50))).unwrap();
        let _ = a.scq.poll(&mut []);
        assert!(start.elapsed() < WAIT, "the async fd never became readable");
    }
    let ev = b.ctx.get_async_event(Some(WAIT)).unwrap().expect("an event");
    assert_eq!(ev.event_type, EventType::QpAccessErr);
    assert_eq!(wait_one(&a.scq, &[]).status, WcStatus::RemAccessErr);
    assert_eq!(b.mr.to_vec(0, 16).unwrap(), vec![0; 16]);
}
